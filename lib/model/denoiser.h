/*
 * denoiser.h -- the model as a denoiser of the image latents of a
 * conditions file's gen_image rows (internal; denoiser.c): the velocity at
 * latents x and timestep t, which the diffusion stage's capture and replay
 * step with (stage/diffusion.h).
 *
 * Shape letters: B requests, R = B cfg rows of the conditions (cond rows,
 * then uncond rows), Z latent channels, h, w the latent grid, L the
 * conditions' columns.
 */
#ifndef HI3_MODEL_DENOISER_H
#define HI3_MODEL_DENOISER_H

#include "core/internal.h"
#include "model/hi3-model.h"

/* The upstream defects the denoiser can restore (diffusion-capture and parity --ablate). */
enum {
	HI3I_DN_ROPE_1D = 1,      /* image tokens take 1-D RoPE (t, t) */
	HI3I_DN_EOI = 2,          /* the flash-attention branch: queries after row 0's <timestep> attend every key */
	HI3I_DN_ROPE_ZERO = 4,    /* pad columns: a zero RoPE table (q = k = 0) */
	HI3I_DN_POS_ZERO = 8,     /* pad columns: position id 0, so their K/V go to cache slot 0 */
};

struct hi3i_dn_opts {
	int kv_reuse;             /* steps after the first feed only <timestep>.. and the image tokens */
	unsigned defects;         /* HI3I_DN_* */
};

struct hi3i_denoiser;

/* The gen_image rows of c, checked against m (the variant's special
 * tokens before each image, one image size for all rows), with the image
 * heads loaded: the error names the conditions file. The conditions must
 * have been made for m (stage/diffusion.c checks it). */
int hi3i_denoiser_open(struct hi3i_denoiser **out, hi3_model *m, const hi3_cond *c, const struct hi3i_dn_opts *o,
                       hi3_error *err);
void hi3i_denoiser_close(struct hi3i_denoiser *dn);
/* The rows of the cond images that the whole-sequence passes put in place
 * of their token embeddings: n rows at at (n, 2) (row, column), grouped by
 * row in order, rows (n, H) host; the denoiser owns at and rows from now
 * on (also when this fails, out of memory). */
int hi3i_denoiser_cond_rows(struct hi3i_denoiser *dn, int n, int32_t *at, float *rows, hi3_error *err);

struct hi3i_dn_geometry {
	int B, R, cfg;            /* requests, rows, rows per request */
	int Z, h, w;              /* the latent */
	int n_special;            /* <timestep> [<guidance>] [<timestep_r>] */
	int guidance, timestep_r; /* the Distil's tokens */
};
/* Record the activations of the later hi3i_denoise calls into t (NULL:
 * stop recording): rows are the conditions' rows, positions their columns. */
int hi3i_denoiser_trace(struct hi3i_denoiser *dn, hi3_trace *t, hi3_error *err);
void hi3i_denoiser_geometry(const struct hi3i_denoiser *dn, struct hi3i_dn_geometry *g);

/* The velocity of every row r < rows (rows = R, or B for the cond rows
 * alone) at the latents x (B, Z, h, w) host (row r reads request r % B):
 * v (rows, Z, h, w) host. t = 1000 sigma for the timestep embedders;
 * t_r (the <timestep_r> value) and gv (the <guidance> value) where the
 * model has those tokens. full: the whole sequence (the first step, or
 * every step without KV reuse); else only the image and special tokens
 * against the cache of the last full call. */
int hi3i_denoise(struct hi3i_denoiser *dn, const float *x, int rows, float t, float t_r, float gv, int full, float *v,
                 hi3_error *err);

#endif
