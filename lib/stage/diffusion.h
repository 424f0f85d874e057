/*
 * diffusion.h -- what the diffusion stage's parts share (internal): the
 * sampler arithmetic (flow.c), and the denoiser that turns a conditions
 * file's gen_image rows into velocity predictions (diffusion.c), which the
 * capture, the diffusion replay (diffusion-replay.c) and parity use.
 *
 * Shape letters: B requests, R = B cfg rows of the conditions (cond rows,
 * then uncond rows), Z latent channels, h, w the latent grid, N = h w, L
 * the conditions' columns, T steps, K SDE steps.
 */
#ifndef HI3_DIFFUSION_H
#define HI3_DIFFUSION_H

#include "core/internal.h"

/* the noise streams of a row (hi3_normal, core/philox.c): x_T, then one per step */
#define HI3I_STREAM_XT 0
#define HI3I_STREAM_STEP(i) ((uint64_t)(i) + 1)
/* and the posterior sample of the row's k-th cond image (stage/images.c) */
#define HI3I_STREAM_VAE(k) ((UINT64_C(1) << 40) + (uint64_t)(k))

/* ------------------------------------------------------------- flow.c */

/* sigmas (T + 1): linspace(1, 0, T + 1) shifted, fp32 as upstream. */
void hi3i_flow_sigmas(int T, double shift, float *sigmas);
/* x stored as dt and read back (f32: x). */
float hi3i_round_to(float x, hi3_dtype dt);
/* out (n) = v_u + g (v_c - v_u), each operation rounded to dt. */
void hi3i_cfg_combine(const float *vc, const float *vu, size_t n, double g, hi3_dtype dt, float *out);
/* out (n) = x + (sigma_next - sigma) v */
void hi3i_euler(const float *x, const float *v, size_t n, float sigma, float sigma_next, float *out);

/* One SDE step's coefficients (Flow-GRPO). */
struct hi3i_sde {
	float dt;                 /* sigma_next - sigma (< 0) */
	float std_t;              /* eta sqrt(sigma / (1 - sigma')), sigma' = sigma_max at sigma 1 */
	float a, b;               /* mean = x a + (v b) dt */
	float std;                /* of the transition: std_t sqrt(-dt) */
};
void hi3i_sde_coeffs(float sigma, float sigma_next, float sigma_max, float eta, struct hi3i_sde *s);
void hi3i_sde_mean(const float *x, const float *v, size_t n, const struct hi3i_sde *s, float *mu);
/* out (n) = mu + std xi */
void hi3i_sde_sample(const float *mu, const float *xi, size_t n, const struct hi3i_sde *s, float *out);
/* The mean over n of the Gaussian log-density of xn around mu. */
float hi3i_sde_logp(const float *xn, const float *mu, size_t n, const struct hi3i_sde *s);

/* A --noise file (trajectory.c): x_T (B, C, h, w) and, with K > 0,
 * sde_noise (B, K, C, h, w), F32, copied out; the error names the file and
 * the tensor (status 3). */
int hi3i_noise_read(const char *path, int B, int C, int h, int w, int K, float *x_T, float *sde_noise,
                    hi3_error *err);

/* The replay file of a diffusion replay (replay.c, format hi3.replay):
 * sde_logp (B, K) F32 and sde_steps (K) I64, written atomically. */
int hi3i_replay_sde_write(const char *path, int B, int K, const float *sde_logp, const int64_t *sde_steps,
                          const char *fingerprint, const char *conditions_hash, const char *traj_file, hi3_error *err);

/* -------------------------------------------------------- diffusion.c */

/* The upstream defects the denoiser can restore (parity --ablate). */
enum {
	HI3I_DN_ROPE_1D = 1,      /* image tokens take 1-D RoPE (t, t) */
	HI3I_DN_EOI = 2,          /* the flash-attention branch: queries after row 0's <timestep> attend every key */
	HI3I_DN_ROPE_ZERO = 4,    /* pad columns: a zero RoPE table (q = k = 0) */
};

struct hi3i_dn_opts {
	int kv_reuse;             /* steps after the first feed only <timestep>.. and the image tokens */
	unsigned defects;         /* HI3I_DN_* */
};

struct hi3i_denoiser;

/* The gen_image rows of c, checked against m (the variant's special
 * tokens before each image, one image size for all rows), with the image
 * heads loaded: the error names the conditions file. */
int hi3i_denoiser_open(struct hi3i_denoiser **out, hi3_model *m, const hi3_cond *c, const struct hi3i_dn_opts *o,
                       hi3_error *err);
void hi3i_denoiser_close(struct hi3i_denoiser *dn);

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
