/*
 * hi3-format.h -- the public interface of lib/format/: the stage files
 * (hi3-files(5)), safetensors and checkpoints, PNG output. A format module
 * reads, checks and writes its file; it is given the plain values it
 * checks, never the model.
 * Part of hi3.h, the public interface: its conventions hold here.
 */
#ifndef HI3_LAYER_FORMAT_H
#define HI3_LAYER_FORMAT_H

#include "../core/hi3-core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The stage file formats (metadata "format"; hi3-files(5)), all at
 * format_version HI3_FORMAT_VERSION. */
#define HI3_FORMAT_VERSION "1"
#define HI3_FORMAT_CONDITIONS "hi3.conditions"
#define HI3_FORMAT_KV "hi3.kv"
#define HI3_FORMAT_SEGMENT "hi3.segment"
#define HI3_FORMAT_REPLAY "hi3.replay"
#define HI3_FORMAT_TRACE "hi3.trace"
#define HI3_FORMAT_TRAJECTORY "hi3.trajectory"
#define HI3_FORMAT_DIFFUSION_CHECKPOINT "hi3.diffusion-checkpoint"

/* The largest model the stage files hold: layers (trace points are named
 * layer.L.*), and experts per layer (expert ids are I16 in routing
 * records). */
#define HI3_MAX_LAYERS 256
#define HI3_MAX_EXPERTS 32767

/* --------------------------------------------------------- safetensors */

typedef struct hi3_st hi3_st;

enum hi3_st_flags {
	HI3_ST_READ = 0,
	HI3_ST_RDWR = 1,      /* map shared and writable: in-place updates (the map is kept in
	                       * pages, and the file's data read ahead at open) */
};

/* Open and validate a safetensors file ("-" reads standard input). */
int hi3_st_open(hi3_st **out, const char *path, int flags, hi3_error *err);
void hi3_st_close(hi3_st *st);
const char *hi3_st_path(const hi3_st *st);
size_t hi3_st_file_size(const hi3_st *st);
size_t hi3_st_header_size(const hi3_st *st);
int hi3_st_count(const hi3_st *st);
const hi3_tensor *hi3_st_at(const hi3_st *st, int i);   /* header order */
const hi3_tensor *hi3_st_find(const hi3_st *st, const char *name);
/* Find a tensor and check it; dtype < 0 or a shape entry < 0 means any. */
int hi3_st_get(const hi3_st *st, const char *name, int dtype, int ndim,
               const int64_t *shape, const hi3_tensor **out, hi3_error *err);
const char *hi3_st_meta(const hi3_st *st, const char *key); /* NULL if absent */
int hi3_st_meta_count(const hi3_st *st);
void hi3_st_meta_at(const hi3_st *st, int i, const char **key, const char **val);
/* Check __metadata__ format and format_version; error names the file. */
int hi3_st_expect_format(const hi3_st *st, const char *format, hi3_error *err);
/* Flush [addr, addr+len) of a writable mapping to the file (msync). */
int hi3_st_sync(hi3_st *st, const void *addr, size_t len, hi3_error *err);

typedef struct hi3_st_writer hi3_st_writer;

hi3_st_writer *hi3_stw_new(void);
void hi3_stw_free(hi3_st_writer *w);
int hi3_stw_meta(hi3_st_writer *w, const char *key, const char *val);
/* Add a tensor. data is borrowed until hi3_stw_write returns; NULL writes
 * zeros. Returns 0, or -1 on a bad name, duplicate or out of memory. */
int hi3_stw_add(hi3_st_writer *w, const char *name, hi3_dtype dt, int ndim,
                const int64_t *shape, const void *data);
/* Write to path atomically (temporary name, fsync, rename); "-" writes
 * standard output. */
int hi3_stw_write(hi3_st_writer *w, const char *path, hi3_error *err);

/* A checkpoint: one model.safetensors, or shards named by
 * model.safetensors.index.json, looked up by tensor name. */
typedef struct hi3_ckpt hi3_ckpt;
int hi3_ckpt_open(hi3_ckpt **out, const char *dir, hi3_error *err);
void hi3_ckpt_close(hi3_ckpt *ck);
const hi3_tensor *hi3_ckpt_find(const hi3_ckpt *ck, const char *name);
int hi3_ckpt_count(const hi3_ckpt *ck);
const hi3_tensor *hi3_ckpt_at(const hi3_ckpt *ck, int i);  /* sorted by name */
const char *hi3_ckpt_file_of(const hi3_ckpt *ck, const char *name);
/* The bytes of the checkpoint's files, all mapped; *n_files (may be NULL): how many. */
size_t hi3_ckpt_file_bytes(const hi3_ckpt *ck, int *n_files);

/* ----------------------------------------------------------------- traces */

/* The named activation points of a forward pass, in forward order
 * (hi3-files(5), TRACE). n traced tokens; per layer unless noted. */
enum hi3_trace_kind {
	HI3_TRACE_EMBED,          /* embed (n, H): the embedding output (not per layer) */
	HI3_TRACE_IN,             /* layer.L.in (n, H): the layer's input */
	HI3_TRACE_IN_NORM,        /* layer.L.in_norm (n, H): after the input RMSNorm */
	HI3_TRACE_Q,              /* layer.L.q (n, n_h d): after RoPE and qk-norm */
	HI3_TRACE_K,              /* layer.L.k (n, n_kv d): after RoPE and qk-norm */
	HI3_TRACE_V,              /* layer.L.v (n, n_kv d) */
	HI3_TRACE_ATTN,           /* layer.L.attn (n, n_h d): attention output, before o_proj */
	HI3_TRACE_ATTN_OUT,       /* layer.L.attn_out (n, H): after o_proj */
	HI3_TRACE_MLP_IN,         /* layer.L.mlp_in (n, H): the MLP or MoE input (post-attention RMSNorm) */
	HI3_TRACE_ROUTER_LOGITS,  /* layer.L.router_logits (n, E): MoE layers */
	HI3_TRACE_EXPERTS,        /* layer.L.experts (n, k) I16: the chosen experts, in routing order */
	HI3_TRACE_EXPERT_WEIGHTS, /* layer.L.expert_weights (n, k): their weights */
	HI3_TRACE_EXPERT_OUT,     /* layer.L.expert_out (n, k, H): each chosen expert's output, unweighted */
	HI3_TRACE_SHARED_OUT,     /* layer.L.shared_out (n, H): the shared MLP (use_mixed_mlp_moe) */
	HI3_TRACE_MLP_OUT,        /* layer.L.mlp_out (n, H): the MLP or MoE output */
	HI3_TRACE_FINAL,          /* final (n, H): the last layer's output */
	HI3_TRACE_FINAL_NORM,     /* final_norm (n, H): after the final RMSNorm */
	HI3_TRACE_LOGITS,         /* logits.topk (n, K), logits.topk_ids (n, K) I32, logits.lse (n) */
	HI3_TRACE_KIND_COUNT
};

/* "attn_out" for HI3_TRACE_ATTN_OUT; -1 from parse for an unknown name. */
const char *hi3_trace_kind_name(int kind);
int hi3_trace_kind_parse(const char *name);

/* One point of a trace file: a tensor whose first axis is the token. */
typedef struct hi3_trace_point {
	const char *name;         /* "layer.3.attn_out", "logits.lse", ... */
	int kind;                 /* enum hi3_trace_kind */
	int layer;                /* -1: embed, final, final_norm, logits */
	int sub;                  /* logits: 0 topk, 1 topk_ids, 2 lse; else 0 */
	hi3_dtype dtype;          /* F32; experts I16; logits.topk_ids I32 */
	int ndim;                 /* 1 (logits.lse), 2, or 3 (expert_out) */
	int64_t shape[3];         /* shape[0] = n */
	const void *data;
} hi3_trace_point;

/* A trace file (format hi3.trace, hi3-files(5)), opened and validated (every
 * pointer into its mapping), or filled in and written. */
typedef struct hi3_trace_file {
	int64_t n;                     /* traced tokens, ordered by (row, position), each once */
	const int32_t *rows;           /* (n) the stage's row */
	const int64_t *positions;      /* (n) the position in the row */
	const int64_t *tokens;         /* (n) the token id fed there */
	int n_points;
	hi3_trace_point *points;       /* forward order */
	const char *const *meta;       /* write: n_meta (key, value) pairs; open: NULL (hi3_trace_file_meta) */
	int n_meta;
	hi3_st *st;                    /* the backing file; NULL for one built in memory */
} hi3_trace_file;

int hi3_trace_file_open(hi3_trace_file **out, const char *path, hi3_error *err);
void hi3_trace_file_close(hi3_trace_file *f);
const char *hi3_trace_file_meta(const hi3_trace_file *f, const char *key);   /* NULL: absent */
/* Write f atomically after the checks hi3_trace_file_open makes. */
int hi3_trace_file_write(const hi3_trace_file *f, const char *path, hi3_error *err);

/* -------------------------------------------------- segment and replay */

/* A segment file (format hi3.segment, hi3-files(5)): packed responses in
 * batch order. Opened from a file (every pointer into its mapping), or
 * filled in by the caller and written with hi3_segment_write. */
typedef struct hi3_segment {
	int B;
	int64_t T;
	const int64_t *tokens;        /* (T) */
	const float *logprobs;        /* (T) recorded at rollout */
	const int64_t *cu_seqlens;    /* (B + 1) */
	const uint8_t *stop_reason;   /* (B) 0 unfinished, 1 stop token, 2 length */
	const int16_t *route_ids;     /* (T, n_moe, k) or NULL */
	const float *route_w;         /* (T, n_moe, k) or NULL */
	int n_moe, k;
	/* metadata (NULL: absent) */
	const char *model_fingerprint, *conditions_hash;
	const char *sampler;          /* "greedy" or "temperature=T top_k=K top_p=P" */
	const char *decode_mask;      /* "causal" or "none" */
	const char *token_placement;  /* "index" or "tail" */
	const char *routing_weights;  /* "none": route_w not recorded (NaN; an imported rollout) */
	hi3_st *st;                   /* the backing file; NULL for one built in memory */
} hi3_segment;

int hi3_segment_open(hi3_segment **out, const char *path, hi3_error *err);
void hi3_segment_close(hi3_segment *s);
/* Write s atomically ("-": standard output), after the same checks
 * hi3_segment_open makes. */
int hi3_segment_write(const hi3_segment *s, const char *path, hi3_error *err);
/* Hash of a segment's responses, its rows and their tokens (16 hex digits):
 * what an image stage's text_segment_hash names. */
void hi3_segment_hash(const hi3_segment *s, char out[17]);

/* A replay file (format hi3.replay, hi3-files(5)): the teacher-forced
 * log-probs of a segment's tokens, and optionally the routing of the pass
 * that gave them. Opened (pointers into the mapping) or filled in and
 * written. */
typedef struct hi3_replay_file {
	int64_t T;
	const float *logprobs;        /* (T) aligned with the segment */
	/* per token, to join with routing, traces and the conditions (NULL: absent) */
	const float *dlogp;           /* (T) replay - rollout log-prob */
	const int32_t *rows;          /* (T) the token's row */
	const int64_t *positions;     /* (T) its position in the row: n_i + j for response token j */
	int n_moe, k;                 /* routing, when route_ids is not NULL */
	const int16_t *route_ids;     /* (T, n_moe, k) response tokens, or NULL */
	const float *route_w;         /* (T, n_moe, k) */
	int B;                        /* rows of the prompt routing */
	const int16_t *prompt_route_ids; /* (P, n_moe, k), P = prompt_cu_seqlens[B] */
	const float *prompt_route_w;  /* (P, n_moe, k) */
	const int64_t *prompt_cu_seqlens; /* (B + 1) each row's prompt tokens */
	/* metadata (NULL: absent) */
	const char *model_fingerprint, *conditions_hash;
	const char *segment_file;     /* the segment it scores */
	const char *mode;             /* "per-row" or "batched" */
	const char *routing;          /* "free", "recorded" or "recorded+weights" */
	hi3_st *st;
} hi3_replay_file;

int hi3_replay_file_open(hi3_replay_file **out, const char *path, hi3_error *err);
void hi3_replay_file_close(hi3_replay_file *r);
int hi3_replay_file_write(const hi3_replay_file *r, const char *path, hi3_error *err);

/* ---------------------------------------------------------- trajectory */

/* A trajectory file (format hi3.trajectory, hi3-files(5)): what
 * diffusion-capture records of each request's denoising, for a trainer
 * and for diffusion replay. Opened (pointers into the mapping) or filled in
 * and written. */
typedef struct hi3_trajectory {
	int B, R;                     /* requests, rows of the conditions (R = B cfg_factor) */
	int T, K;                     /* steps, SDE steps */
	int C, h, w;                  /* latent channels and grid */
	hi3_dtype latent_dtype;       /* F32, BF16 or F16: how latents are stored */
	const void *latents;          /* (B, T + 1, C, h, w) x_T first, then each step's result */
	const float *sigmas;          /* (T + 1) the schedule, 1 .. 0 */
	const float *timesteps;       /* (T) 1000 sigma, what the embedders saw */
	const int64_t *sde_steps;     /* (K) increasing step indices */
	const float *sde_logp;        /* (B, K) the log-prob of each SDE transition */
	const float *x_T;             /* (B, C, h, w) the initial noise */
	const float *sde_noise;       /* (B, K, C, h, w) the noise of each SDE step */
	const float *velocity;        /* (T, R, C, h, w) each row's prediction before guidance, or NULL */
	/* metadata (NULL: absent) */
	const char *sampler;          /* "euler" or "sde" */
	const char *sde_kernel;       /* "flow-grpo", "cps" or "dance-grpo" (sde; absent: flow-grpo) */
	const char *logprob_reduce;   /* "mean" or "sum" (sde; absent: mean) */
	const char *ablate;           /* the upstream defect the capture restored: "pos-pad", "rope-pad", "rope-1d",
	                               * "eoi"; NULL: none */
	double eta, guidance, flow_shift;
	int kv_reuse;
	const char *cfg_dtype;        /* the guidance combination's dtype: "f32", "bf16", "f16" */
	const char *variant;          /* base, instruct, instruct-distil */
	const char *noise;            /* "philox" (the rows' seeds) or the --noise file */
	const char *model_fingerprint, *conditions_hash;
	const char *requests;         /* JSON array of the conditions' requests (prompts) */
	const char *seeds;            /* JSON array of the B seeds the rows' noise came from */
	hi3_st *st;                   /* the backing file; NULL for one built in memory */
} hi3_trajectory;

int hi3_trajectory_open(hi3_trajectory **out, const char *path, hi3_error *err);
void hi3_trajectory_close(hi3_trajectory *t);
/* Write t atomically ("-": standard output), after the checks open makes. */
int hi3_trajectory_write(const hi3_trajectory *t, const char *path, hi3_error *err);
/* Element i of the latents as f32. */
float hi3_trajectory_latent(const hi3_trajectory *t, size_t i);

/* ------------------------------------------------------------- conditions */

/* A conditions file (format hi3.conditions, see hi3-files(5)), opened and
 * validated; every pointer is into the file's mapping. */
typedef struct hi3_cond {
	int B, L;
	int S;                          /* full-attention blocks per row */
	int NS;                         /* stop tokens per row */
	int K;                          /* timestep indices per row (0 when none) */
	const int64_t *input_ids;       /* (B, L) right padded with the pad token */
	const int64_t *position_ids;    /* (B, L) cache write index of each column */
	const int64_t *real_pos;        /* (B) n_i, the first pad column */
	const int32_t *rope_pos;        /* (B, L, 2) RoPE (y, x) */
	const int32_t *image_blocks;    /* (B, S, 2) [start, stop); stop == start unused */
	const int64_t *seeds;           /* (B) per-row sampling seed */
	const int64_t *stop_tokens;     /* (B, NS) stop token ids, -1 padded */
	const uint8_t *gen_image_mask;  /* (B, L) or NULL */
	const uint8_t *cond_vit_mask;   /* (B, L) or NULL */
	const uint8_t *cond_vae_mask;   /* (B, L) or NULL */
	const int64_t *timestep_index;  /* (B, K) or NULL */
	const int32_t *gen_image_hw;    /* (B, 2) token grid (h, w) of the row's generated image, (0, 0)
	                                 * without one; NULL when absent */
	/* decoding rules of the Instruct code's text stage (-1 padded lists of
	 * records; NULL when no row has any):
	 *   forced_after (B, NF): T, k, id_1 .. id_k: once the row produces T,
	 *     its next k tokens are id_1 .. id_k (stage transitions);
	 *   greedy_among (B, NG): T, k, id_1 .. id_k: the token after T is the
	 *     most likely of id_1 .. id_k (the ratio token after <img_size_B>).
	 * A row's last prompt token counts as produced. */
	const int64_t *forced_after;
	const int64_t *greedy_among;
	int NF, NG;
	/* the cond images' pixels (requests with "images"; NI 0 and NULL when
	 * none): NI images in row order, each row's in the order of its blocks,
	 * the k-th of a row feeding its k-th run of cond_vit_mask columns */
	int NI;                         /* images */
	int VP, VD;                     /* ViT slots P and features D = 3 patch^2 per image */
	const int64_t *image_row;       /* (NI) the row of each image, non-decreasing */
	const int32_t *vit_grid;        /* (NI, 2) spatial_shapes (nph, npw), nph npw <= VP */
	const uint8_t *vit_pixels;      /* (NI, VP, VD) the ViT view's resized uint8 values as patches
	                                 * (feature (py patch + px) 3 + c), rows from nph npw on 0; the
	                                 * encoder's input is (u - 127.5) / 127.5 */
	const int32_t *vae_shape;       /* (NI, 2) the VAE view's bucket (H, W) */
	const uint8_t *vae_pixels;      /* (sum H W 3) each image's VAE view, (H, W, 3) after the other:
	                                 * the cropped LANCZOS resize; the encoder's input is u / 255 2 - 1 */
	int64_t NV;                     /* bytes of vae_pixels */
	/* the images' encoder outputs when tokenize-concat --encode stored them
	 * (NULL and 0 otherwise: the stages run the encoders) */
	int VE;                         /* the aligner's width E */
	const float *vit_embeds;        /* (NI, VP, VE) aligner(ViT(image)), pad slots included */
	const int32_t *latent_shape;    /* (NI, 3) each image's latent (Z, h, w) */
	const float *vae_latents;       /* (NZ) each image's latent (Z, h, w) as the stages feed patch_embed:
	                                 * the posterior's mean or sample, shifted and scaled; one after the other */
	int64_t NZ;
	const char *mode;               /* "gen_text" or "gen_image" */
	const char *bot_task;           /* auto, image, think, recaption, img_ratio, think_recaption, or mixed */
	const char *template_name;      /* pretrain, instruct, or none (pre-tokenized) */
	const char *tokenizer_hash;     /* "" when no tokenizer was used */
	const char *model_fingerprint;  /* "" when no model was named */
	const char *requests;           /* JSON array of the request lines */
	int64_t pad_id;
	hi3_st *st;                     /* the backing file */
} hi3_cond;

int hi3_cond_open(hi3_cond **out, const char *path, hi3_error *err);
void hi3_cond_close(hi3_cond *c);
/* A metadata value of the conditions (format, mode, cfg_factor, pad_id,
 * pad_positions, requests, ...); NULL when absent. */
const char *hi3_cond_meta(const hi3_cond *c, const char *key);
/* Rows per request: 1 for gen_text, 2 for gen_image (rows are ordered
 * cond_0 .. cond_{R-1}, uncond_0 .. uncond_{R-1}). */
int hi3_cond_cfg_factor(const hi3_cond *c);
/* Write conditions (built, merged or opened) atomically; "-" is stdout.
 * Built and merged conditions live in memory (st is NULL); every
 * hi3_cond is released with hi3_cond_close. */
int hi3_cond_write(const hi3_cond *c, const char *path, hi3_error *err);
/* Cond image k's ViT view as the encoder saw it, re-assembled from its
 * patches: *rgb (h, w, 3) malloc'd, h = patch nph, w = patch npw. */
int hi3_cond_vit_image(const hi3_cond *c, int k, uint8_t **rgb, int *w, int *h, hi3_error *err);

/* ----------------------------------------------------------------- PNG */

/* Write an 8-bit RGB image (height rows of width * 3 bytes) as a PNG,
 * atomically; "-" writes standard output. */
int hi3_png_write_rgb(const char *path, int width, int height, const uint8_t *rgb, hi3_error *err);
/* The same with key/value text chunks (the prompt, seed and sampler
 * settings of a generated image, as stable-diffusion.cpp writes them):
 * tEXt, or iTXt (UTF-8) for a value beyond printable ASCII. A key must be
 * a PNG keyword (1 to 79 printable ASCII characters, no leading, trailing
 * or doubled spaces): anything else is a usage error, nothing written. */
typedef struct hi3_png_text {
	const char *key, *value;
} hi3_png_text;
int hi3_png_write_rgb_text(const char *path, int width, int height, const uint8_t *rgb, const hi3_png_text *text,
                           int n_text, hi3_error *err);

#ifdef __cplusplus
}
#endif
#endif /* HI3_LAYER_FORMAT_H */
