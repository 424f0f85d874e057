/*
 * hi3.h -- the public interface of libhi3.
 *
 * libhi3 runs the HunyuanImage-3.0 transformer stage by stage over plain,
 * memory-mapped safetensors files (see hi3-files(5)).
 *
 * Conventions, once for the whole library:
 *  - Functions that can fail return 0 on success and -1 on failure, and fill
 *    the caller's hi3_error (message names the file, tensor or line; status is
 *    the exit status a program should use: 1 runtime, 2 usage, 3 bad input).
 *  - Ownership: an object returned through `T **out` belongs to the caller and
 *    is released with the matching hi3_T_close()/hi3_T_free(); a `const`
 *    pointer returned by a getter is borrowed and lives as long as its owner.
 *  - The library never calls exit() and never prints, except through the
 *    log hook (hi3_set_log) for warnings and progress.
 *
 * Dimension letters used in shape comments throughout:
 *   B batch rows, L prompt length (padded), C cache slots per row (L + max_new),
 *   T tokens in one forward call, M = B*T flattened tokens, H hidden size,
 *   n_h query heads, n_kv key/value heads, d head dim, V vocabulary,
 *   E experts, k experts per token, I intermediate width, S image blocks per row.
 */
#ifndef HI3_H
#define HI3_H

#include <stddef.h>
#include <stdint.h>

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

/* ---------------------------------------------------------------- errors */

enum hi3_status {
	HI3_OK = 0,
	HI3_ERR_RUNTIME = 1, /* could not complete: I/O, memory, device */
	HI3_ERR_USAGE = 2,   /* the caller asked for something invalid */
	HI3_ERR_INPUT = 3,   /* input data is malformed or inconsistent */
};

typedef struct hi3_error {
	int status;       /* enum hi3_status; 0 when no error */
	char msg[2048];
} hi3_error;

/* Set *err (if not NULL) and return -1. */
int hi3_error_set(hi3_error *err, int status, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Prepend "prefix: " to an error already set; returns -1. */
int hi3_error_prefix(hi3_error *err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Log sink for warnings, notes and progress (default: stderr). */
enum hi3_log_level { HI3_LOG_ERROR, HI3_LOG_WARN, HI3_LOG_INFO, HI3_LOG_DEBUG };
typedef void (*hi3_log_fn)(int level, const char *msg, void *ctx);
void hi3_set_log(hi3_log_fn fn, void *ctx, int max_level);
void hi3_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---------------------------------------------------------------- dtypes */

typedef enum hi3_dtype {
	HI3_F32, HI3_F16, HI3_BF16, HI3_F64,
	HI3_I64, HI3_I32, HI3_I16, HI3_I8,
	HI3_U64, HI3_U32, HI3_U16, HI3_U8,
	HI3_BOOL, HI3_F8_E4M3, HI3_F8_E5M2,
	HI3_DTYPE_COUNT
} hi3_dtype;

const char *hi3_dtype_name(hi3_dtype dt);          /* "F32", "BF16", ... */
int hi3_dtype_parse(const char *name, hi3_dtype *out); /* 0 or -1 */
size_t hi3_dtype_size(hi3_dtype dt);
int hi3_dtype_is_float(hi3_dtype dt);

float hi3_bf16_to_f32(uint16_t h);
uint16_t hi3_f32_to_bf16(float f);                 /* round to nearest even */
float hi3_f16_to_f32(uint16_t h);
uint16_t hi3_f32_to_f16(float f);                  /* round to nearest even */
/* Element i of an array of dtype dt, as a double (any dtype). */
double hi3_elem_f64(const void *data, hi3_dtype dt, size_t i);
/* Convert n elements of a float dtype (F32/F16/BF16/F64) to f32. */
void hi3_to_f32(float *dst, const void *src, hi3_dtype dt, size_t n);

/* --------------------------------------------------------- safetensors */

#define HI3_MAX_DIMS 8

typedef struct hi3_tensor {
	const char *name;
	hi3_dtype dtype;
	int ndim;
	int64_t shape[HI3_MAX_DIMS];
	size_t nbytes;
	void *data;          /* inside the file mapping */
} hi3_tensor;

/* The element count; -1 for a shape whose dimensions are negative or
 * multiply past INT64_MAX (hi3_st_open refuses files with such shapes). */
int64_t hi3_tensor_numel(const hi3_tensor *t);
/* "(4, 8, 96, 128)" into buf. */
const char *hi3_shape_str(char *buf, size_t n, int ndim, const int64_t *shape);

typedef struct hi3_st hi3_st;

enum hi3_st_flags {
	HI3_ST_READ = 0,
	HI3_ST_RDWR = 1,      /* map shared and writable: in-place updates */
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

/* ---------------------------------------------------------------- config */

#define HI3_MAX_LAYERS 256
#define HI3_MAX_EXPERTS 32767   /* per layer: expert ids are I16 in routing records */
#define HI3_MAX_CONFIG_WARNINGS 4

/* The config.json blocks of the image modules (kept for image generation and
 * image input; present is 0 when the block is absent or null). */
#define HI3_VAE_MAX_LEVELS 8

typedef struct hi3_vae_config {  /* AutoencoderKLConv3D ("vae") */
	int present;
	int n_levels;                 /* entries of block_out_channels */
	int block_out_channels[HI3_VAE_MAX_LEVELS];   /* encoder order: [128, 256, 512, 1024, 1024] */
	int in_channels, out_channels, latent_channels, layers_per_block;
	int ffactor_spatial, ffactor_temporal, sample_size, sample_tsize;
	int downsample_match_channel, upsample_match_channel;
	double scaling_factor;
	int has_shift_factor;
	double shift_factor;          /* latent = (z - shift) scaling; 0 unless has_shift_factor */
} hi3_vae_config;

typedef struct hi3_vit_config {  /* SigLIP2 ("vit") */
	int present;
	int hidden_size, intermediate_size, num_attention_heads, num_hidden_layers;
	int num_channels, num_patches, patch_size;
	double layer_norm_eps;
	char hidden_act[32];
} hi3_vit_config;

typedef struct hi3_vit_processor_config {
	int present;
	int patch_size, max_num_patches, resample;
	int do_normalize, do_rescale, do_resize;
	double rescale_factor, image_mean[3], image_std[3];
} hi3_vit_processor_config;

typedef struct hi3_vit_aligner_config {
	int present;
	char projector_type[32];
	int input_dim, n_embed, depth;
} hi3_vit_aligner_config;

typedef struct hi3_config {
	int vocab_size;
	int hidden_size;              /* H */
	int intermediate_size;        /* dense MLP width */
	int num_hidden_layers;
	int num_attention_heads;      /* n_h */
	int num_key_value_heads;      /* n_kv */
	int attention_head_dim;       /* d */
	double rms_norm_eps;
	double rope_theta;
	int use_qk_norm;
	int use_mixed_mlp_moe;
	int moe_layer_num_skipped;
	int norm_topk_prob;
	double routed_scaling_factor; /* JSON false reads as 0, true as 1 (as Python) */
	int tie_word_embeddings;
	int max_position_embeddings;  /* positions 0 .. this - 1 (upstream default 2048) */
	/* per layer (the config may give an int or a list) */
	int num_experts[HI3_MAX_LAYERS];
	int moe_topk[HI3_MAX_LAYERS];
	int moe_intermediate_size[HI3_MAX_LAYERS];
	int num_shared_expert[HI3_MAX_LAYERS];
	int64_t pad_token_id, bos_token_id, eos_token_id;  /* -1 when absent */
	char hidden_act[16];
	char moe_impl[16];            /* "eager" (default); hi3 computes eager routing */
	/* the variant (hi3_variant_of) */
	char model_version[64];       /* "" when absent */
	int cfg_distilled, use_meanflow;
	/* image generation and image input, as upstream reads them (defaults of
	 * upstream's configuration class where config.json has no value) */
	char rope_type[16];           /* "2d" or "default" (1-D for images too) */
	int image_base_size;          /* 1024 */
	int vae_downsample_factor[2]; /* (h, w), (16, 16) */
	int vit_downsample_factor[2];
	int patch_size;               /* 1 */
	int patch_embed_hidden_dim;   /* 1024 */
	char img_proj_type[16];       /* "unet" */
	char cond_token_attn_type[16];/* full (default), full_causal, causal, joint_full */
	char cond_image_type[16];     /* vae, vit, vae_vit (default) */
	char vae_type[64], vae_dtype[16], vae_autocast_dtype[16], vit_type[64];
	hi3_vae_config vae;
	hi3_vit_config vit;
	hi3_vit_processor_config vit_processor;
	hi3_vit_aligner_config vit_aligner;
	/* values that parse but change the result in a way worth saying */
	int n_warnings;
	char warnings[HI3_MAX_CONFIG_WARNINGS][320];
	char *json;                   /* the config.json text as read */
} hi3_config;

/* Read config.json as upstream's configuration class does: every field of
 * the released config with the JSON types it has there (a boolean in a
 * numeric field is 0 or 1, as in Python); fields that would change the math
 * in a way hi3 does not implement (attention_bias, use_cla, moe_drop_tokens,
 * ...) are refused naming the field; a wrong type or a per-layer list of the
 * wrong length is an input error naming the file and the field. */
int hi3_config_load(hi3_config *cfg, const char *path, hi3_error *err);
int hi3_config_parse(hi3_config *cfg, const char *json_text, const char *name,
                     hi3_error *err);
void hi3_config_release(hi3_config *cfg);
int hi3_config_is_moe_layer(const hi3_config *cfg, int layer);
/* What hi3 does with a config.json field: "model" (the text forward),
 * "image" (kept for image generation and input), "variant", "checked"
 * (refused when set to a value that changes the math), "ignored"; NULL for a
 * field upstream does not know (ignored too). */
const char *hi3_config_field_role(const char *name);
/* Check that every tensor the config implies is present with the right
 * shape, and that the config is one hi3 can run. */
int hi3_config_validate(const hi3_config *cfg, const hi3_ckpt *ck, hi3_error *err);
/* Model fingerprint: 16 hex digits of a hash of the config and the tensor
 * names, shapes and dtypes. */
int hi3_fingerprint(const hi3_config *cfg, const hi3_ckpt *ck, char out[17]);

/* ------------------------------------------------- generation defaults */

/* generation_config.json, with the defaults of transformers' GenerationConfig
 * where it has no value. Decode samples with them when no sampling option is
 * given; tokenize-concat takes the template, bot_task, system prompt and
 * max_length from them; diffusion takes steps, guidance and shift. */
#define HI3_MAX_EOS 8
typedef struct hi3_gen_defaults {
	int present;                  /* generation_config.json was read */
	char sequence_template[16];   /* "" when absent */
	char bot_task[24];            /* "auto" when absent */
	char use_system_prompt[32];   /* "None" when absent */
	int drop_think;
	int do_sample;                /* 0 */
	double temperature;           /* 1.0 */
	int top_k;                    /* 50 */
	double top_p;                 /* 1.0 */
	int64_t max_length;           /* -1 when absent (not GenerationConfig's 20: a bound only when given) */
	int64_t max_new_tokens;       /* -1 when absent */
	int n_eos;
	int64_t eos_token_id[HI3_MAX_EOS];
	int64_t pad_token_id;         /* -1 when absent */
	int diff_infer_steps;         /* 50 */
	double diff_guidance_scale;   /* 5.0 */
	double flow_shift;            /* 3.0 */
	char moe_impl[16];            /* "" when absent */
} hi3_gen_defaults;

/* Read DIR/generation_config.json (absent, or dir NULL: the defaults,
 * present = 0). A field of the wrong type is an input error naming the file
 * and field. */
int hi3_gen_defaults_load(hi3_gen_defaults *g, const char *dir, hi3_error *err);
/* The sampler generation_config asks for: greedy unless do_sample, then
 * temperature, top_k (0: off) and top_p. */
struct hi3_sampler;
void hi3_gen_defaults_sampler(const hi3_gen_defaults *g, struct hi3_sampler *s);

/* The released checkpoints: base (HunyuanImage-3.0), Instruct, and
 * Instruct-Distil (cfg_distilled / use_meanflow). */
enum hi3_variant { HI3_VARIANT_BASE, HI3_VARIANT_INSTRUCT, HI3_VARIANT_DISTIL };
/* The variant of a checkpoint: Distil when cfg_distilled or use_meanflow;
 * else Instruct when model_version names one ("HunyuanImage-3.0-Instruct*"),
 * or when config.json has no model_version and generation_config's
 * sequence_template is "instruct"; else base. why (may be NULL) gets a
 * sentence saying which fields decided. g may be NULL. */
int hi3_variant_of(const hi3_config *c, const hi3_gen_defaults *g, char *why, size_t why_len);
const char *hi3_variant_name(int variant);   /* "base", "instruct", "instruct-distil" */

/* -------------------------------------------------------------- init-model */

typedef struct hi3_init_opts {
	const char *preset;      /* "tiny", "tiny-moe", "small", "tiny-release", "tiny-instruct", "tiny-distil" */
	uint64_t seed;
	hi3_dtype dtype;         /* HI3_F32 or HI3_BF16 */
	int dtype_given;         /* 0: the preset's (f32; the release presets bf16) */
	const char *overrides;   /* JSON object merged into the preset config, or NULL */
} hi3_init_opts;

/* Names of the presets, NULL-terminated. */
const char *const *hi3_init_presets(void);
/* Write config.json, the weights (model.safetensors; the release presets:
 * model-0000N-of-0000M.safetensors shards and model.safetensors.index.json),
 * generation_config.json, tokenizer.json and tokenizer_config.json into dir
 * (created if missing). */
int hi3_init_model(const char *dir, const hi3_init_opts *opts, hi3_error *err);

/* ------------------------------------------------------------------ model */

typedef struct hi3_model hi3_model;
typedef struct hi3_cond hi3_cond;      /* conditions, below */
typedef struct hi3_template hi3_template;
typedef struct hi3_requests hi3_requests;
typedef struct hi3_trace hi3_trace;    /* an activation recorder, below */

/*
 * Scale-out (lib/par/comm.c, hi3-parallel(7)): a communicator is a table
 * of collectives over `size` ranks. libhi3 holds the single-process one;
 * the MPI (host buffers) and NCCL (device buffers) ones live in the
 * hi3-mpi program (lib/par/comm-mpi.c, comm-nccl.c), so that libhi3 and
 * hi3 need no MPI library at run time. Every call returns 0, or -1 with
 * err set; byte counts and displacements are per rank, in rank order.
 */
typedef struct hi3_comm hi3_comm;
struct hi3_comm_ops {
	/* recv (size * n bytes) = every rank's send (n bytes), in rank order */
	int (*allgather)(hi3_comm *c, const void *send, size_t n, void *recv, hi3_error *err);
	/* recv + displs[r] = rank r's send (counts[r] bytes) */
	int (*allgatherv)(hi3_comm *c, const void *send, size_t n, void *recv, const size_t *counts,
	                  const size_t *displs, hi3_error *err);
	/* rank r's send + sdispls[q] (scounts[q] bytes) to rank q's recv + rdispls[r] */
	int (*alltoallv)(hi3_comm *c, const void *send, const size_t *scounts, const size_t *sdispls, void *recv,
	                 const size_t *rcounts, const size_t *rdispls, hi3_error *err);
	int (*bcast)(hi3_comm *c, void *buf, size_t n, int root, hi3_error *err);
	int (*barrier)(hi3_comm *c, hi3_error *err);
	/* end every rank now with status, after printing msg (NULL: none) */
	void (*abort)(hi3_comm *c, int status, const char *msg);
	void (*destroy)(hi3_comm *c);
};
struct hi3_comm {
	const struct hi3_comm_ops *ops;
	const char *name;        /* "single", "mpi", "nccl" */
	int rank, size;
	int device;              /* 1: buffers are device memory (NCCL) */
	void *ctx;
	double seconds;          /* time spent in collectives (hi3_comm_* calls) */
	uint64_t bytes;          /* bytes received by them */
};

/* The single-process communicator (rank 0 of 1); static, never freed. */
hi3_comm *hi3_comm_single(void);
/* The collectives through c, timed into c->seconds and c->bytes. */
int hi3_comm_allgather(hi3_comm *c, const void *send, size_t n, void *recv, hi3_error *err);
int hi3_comm_allgatherv(hi3_comm *c, const void *send, size_t n, void *recv, const size_t *counts,
                        const size_t *displs, hi3_error *err);
int hi3_comm_alltoallv(hi3_comm *c, const void *send, const size_t *scounts, const size_t *sdispls, void *recv,
                       const size_t *rcounts, const size_t *rdispls, hi3_error *err);
int hi3_comm_bcast(hi3_comm *c, void *buf, size_t n, int root, hi3_error *err);
int hi3_comm_barrier(hi3_comm *c, hi3_error *err);
/* x (n) = the sum over ranks of x, the same bits on every rank and for
 * any layout of the same terms: an all-gather, then a sum in rank order
 * on each rank (host buffers). */
int hi3_comm_allreduce_sum_f32(hi3_comm *c, float *x, size_t n, hi3_error *err);
/* Every rank holds the same `what` (a string: a fingerprint, a hash), or
 * an HI3_ERR_INPUT error naming the first rank that differs from rank 0. */
int hi3_comm_check_same(hi3_comm *c, const char *what, const char *value, hi3_error *err);
/* 0 when every rank's status is 0; else -1 on every rank, with err naming
 * the lowest failing rank and its message (a collective: all ranks call it). */
int hi3_comm_agree(hi3_comm *c, const hi3_error *mine, hi3_error *err);

/* How the routed experts' outputs reach their tokens when ep > 1
 * (hi3-parallel(7), "experts"). */
enum hi3_dispatch {
	/* every rank holds every token; each expert group computes its
	 * experts' rows of all of them, and the rows are all-gathered */
	HI3_DISPATCH_GATHER,
	/* the tokens are split over the expert groups: each group sends its
	 * experts' rows to the group of their tokens (all-to-all), which adds
	 * them up with the shared MLP; the sums are all-gathered (tp = 1) */
	HI3_DISPATCH_ALLTOALL,
};

/* A parallel layout: size = tp * ep ranks; rank r is tensor slot r % tp of
 * expert group r / tp (hi3-parallel(7)). */
typedef struct hi3_par {
	hi3_comm *comm;
	int tp, ep;
	int dispatch;            /* enum hi3_dispatch */
} hi3_par;
/* "tp=T,ep=E[,dispatch=gather|alltoall]" (a part left out: tp 1, ep 1, gather) into p. */
int hi3_par_parse(hi3_par *p, const char *spec, hi3_error *err);

/*
 * Planning a layout from config.json alone (lib/model/plan.c, hi3-plan(1)):
 * the bytes one rank holds, the largest over the ranks of the layout.
 * Weights are the transformer's (what hi3_model_open maps and uses);
 * activations are the forward's scratch for a prefill chunk of tokens
 * (min(batch * max_len, chunk_tokens)) plus a layout's gather buffers.
 */
typedef struct hi3_plan_opts {
	int tp, ep;               /* the layout: tp * ep ranks */
	int batch;                /* B rows */
	int64_t max_len;          /* C cache slots per row (prompt + new tokens) */
	hi3_dtype dtype;          /* weights (the MoE router stays f32) */
	hi3_dtype kv_dtype;       /* the cache */
	int64_t chunk_tokens;     /* tokens per prefill forward (0: 8192, prefill's default) */
	uint64_t mem;             /* bytes a rank may use; 0: unknown */
} hi3_plan_opts;

typedef struct hi3_plan {
	uint64_t weights, weights_split, weights_replicated;  /* per rank */
	uint64_t kv, activations, total;
	uint64_t weights_all;     /* the whole checkpoint's transformer weights, one copy */
	int fits;                 /* total <= mem (1 when mem is 0) */
} hi3_plan;

/* 0, or -1 with err: a layout whose kv heads or experts do not divide
 * (HI3_ERR_USAGE, naming which). */
int hi3_plan_compute(const hi3_config *c, const hi3_plan_opts *o, hi3_plan *p, hi3_error *err);
/* "141G", "512GiB", "1.5T", "80000000000" (suffixes K M G T binary) into bytes. */
int hi3_parse_bytes(const char *s, uint64_t *out);
/* b as "150.81 GiB", "3.52 MiB", "512 B" (binary units) into buf (32 bytes); returns buf. */
const char *hi3_format_bytes(uint64_t b, char *buf);

typedef struct hi3_model_opts {
	const char *backend;     /* "cpu" (default) or "cuda" */
	int threads;             /* 0: OpenMP default */
	int batch_invariant;     /* 1: reduction orders independent of batch (default) */
	const hi3_par *par;      /* NULL: one process holds everything */
} hi3_model_opts;

int hi3_model_open(hi3_model **out, const char *dir, const hi3_model_opts *opts,
                   hi3_error *err);
void hi3_model_close(hi3_model *m);
const hi3_config *hi3_model_config(const hi3_model *m);
const hi3_gen_defaults *hi3_model_gen_defaults(const hi3_model *m);
const char *hi3_model_fingerprint(const hi3_model *m);
const char *hi3_model_dir(const hi3_model *m);
const char *hi3_model_backend(const hi3_model *m);
int hi3_model_n_moe_layers(const hi3_model *m);
int hi3_model_max_topk(const hi3_model *m);

/* A static KV cache: per layer K and V of shape (B, n_kv, C, d), F32 or
 * BF16, in memory the caller owns (typically a kv file's mapping). */
typedef struct hi3_kvcache {
	int n_layers, B, n_kv, C, d;
	hi3_dtype dtype;
	void **k;                 /* [n_layers] -> (B, n_kv, C, d) */
	void **v;                 /* [n_layers] -> (B, n_kv, C, d) */
} hi3_kvcache;

/* A cache in host memory it owns, every layer zeroed; NULL and err set
 * when out of memory. (A KV file's cache points into the file's mapping
 * instead, and is the file's to release.) */
hi3_kvcache *hi3_kvcache_alloc(int n_layers, int B, int n_kv, int C, int d, hi3_dtype dtype, hi3_error *err);
/* The same, shaped for model m: (B, n_kv, C, d) per layer. */
hi3_kvcache *hi3_kvcache_for_model(const hi3_model *m, int B, int C, hi3_dtype dtype, hi3_error *err);
void hi3_kvcache_free(hi3_kvcache *kv);
/* The cache kv is about to be freed, closed or changed behind the model's
 * back: the model drops the backend's copy of it (unsynced), so that a
 * later cache at the same address is copied afresh. Call it before
 * hi3_kvcache_free on a cache a model has used. */
void hi3_model_drop_cache(hi3_model *m, const hi3_kvcache *kv);

/* Attention modes of one forward call. */
enum hi3_attn_mode {
	/* Keys are this call's own T tokens, by column: query t attends key
	 * column j when j <= hi[b,t], or both lie in one full-attention block
	 * [lo, hi) of the row. K/V are then scattered into the cache (if any)
	 * at slot[b,t] (prefill, replay). */
	HI3_ATTN_SELF,
	/* K/V of the T tokens are first written to the cache at slot[b,t];
	 * query t then attends cache slot j when j <= hi[b,t] or both lie in
	 * one block (decode, later diffusion steps). */
	HI3_ATTN_CACHE,
};

typedef struct hi3_batch {
	int B, T;                    /* rows and tokens per row in this call */
	int mode;                    /* enum hi3_attn_mode */
	const int64_t *ids;          /* (B, T) token ids */
	const int32_t *rope;         /* (B, T, 2) RoPE (y, x) */
	const int32_t *hi;           /* (B, T) last admitted key (column or slot); -1: none */
	const int32_t *blocks;       /* (B, S, 2) full-attention [start, stop), or NULL */
	int S;
	const int64_t *slot;         /* (B, T) cache write slot; -1: not written; NULL: no cache */
	const int32_t *cache_row;    /* (B) cache row of each batch row; NULL: identity */
	/* outputs */
	int n_logits;                /* how many (row, column) logits to return */
	const int32_t *logit_at;     /* (n_logits, 2) (b, t) */
	float *logits;               /* (n_logits, V) */
	int vocab_slice;             /* 1: under tensor parallelism only this rank's vocabulary
	                              * columns of each logits row are written (lm_head not
	                              * gathered: the caller reduces them, lib/stage/vocab.h);
	                              * 0: every column, gathered */
	/* optional */
	float *hidden_out;           /* (n_layers + 1, B, T, H): input of each layer and ln_f input */
	int16_t *route_ids;          /* (B, T, n_moe, k) chosen experts, -1 padded */
	float *route_w;              /* (B, T, n_moe, k) their weights */
	const int16_t *force_route;  /* (B, T, n_moe, k) experts to use instead of top-k, or NULL;
	                              * a token whose first entry is -1 routes freely */
	const float *force_route_w;  /* (B, T, n_moe, k) weights to use with force_route, or NULL */
	/* input rows from the host that replace their token embedding (the ViT
	 * and aligner's rows of cond images, lib/stage/images.c); the diffusion
	 * stage's rows in backend memory are n_embed below */
	int n_host_embed;
	const int32_t *host_embed_at;   /* (n_host_embed, 2) (b, t), each at most once */
	const float *host_embed_rows;   /* (n_host_embed, H) host: the rows */
	/* tracing (optional): record the activations of some tokens of this call */
	hi3_trace *trace;            /* NULL: nothing is recorded, at no cost */
	const int32_t *trace_row;    /* (B) the stage's row of each batch row; NULL: r */
	const int64_t *trace_pos;    /* (B, T) each token's position in its row, -1 for a pad (never
	                              * traced); NULL: its column t */
	/* image generation (the diffusion stage, lib/stage/diffusion.c): input
	 * rows computed by the image modules instead of looked up in wte, and
	 * the last layer's output (no ln_f) at chosen tokens. The rows live
	 * in the model's backend memory (host memory on the CPU backend). */
	int n_embed;
	const int32_t *embed_at;     /* (n_embed) host: token b T + t of each row, distinct */
	const float *embed_rows;     /* (n_embed, H) backend: its input, replacing wte[ids] */
	int n_hidden;
	const int32_t *hidden_at;    /* (n_hidden) host: token b T + t of each output row */
	float *hidden;               /* (n_hidden, H) backend: the last layer's output there */
	const uint8_t *rope_zero;    /* (B, T) or NULL: 1 zeroes the token's query and key after RoPE,
	                              * as a zero cos/sin table does (an upstream defect, restored on
	                              * purpose by parity --ablate rope-pad) */
} hi3_batch;

/* Run the model over a batch. */
int hi3_forward(hi3_model *m, hi3_kvcache *kv, const hi3_batch *b, hi3_error *err);

/* Bring the backend's copy of rows of the cache into kv's host memory
 * (a no-op on the CPU backend). */
int hi3_kv_sync_host(hi3_model *m, hi3_kvcache *kv, hi3_error *err);

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

/* What to record: tokens are chosen by the stage's row and their position
 * in it (a prompt column, or n_i + j for response token j). */
typedef struct hi3_trace_opts {
	const int64_t *rows;      /* (n_rows) the rows to trace; NULL: row 0 */
	int n_rows;
	const int64_t *ranges;    /* (n_ranges, 2) positions [lo, hi) to trace; NULL: every real token */
	int n_ranges;
	uint32_t kinds;           /* OR of 1u << enum hi3_trace_kind; 0: every kind */
	int topk;                 /* logits kept per token (0: 16) */
} hi3_trace_opts;

/* A recorder for model m: given to stages (their opts' trace) and through
 * them to hi3_forward (hi3_batch.trace), it keeps the chosen tokens'
 * activations in host memory; hi3_trace_write writes them as one trace
 * file (format hi3.trace). The model must outlive it. */
int hi3_trace_new(hi3_trace **out, hi3_model *m, const hi3_trace_opts *o, hi3_error *err);
void hi3_trace_free(hi3_trace *t);
/* A metadata entry for the file (stage, conditions_hash, ...); copied. */
int hi3_trace_set_meta(hi3_trace *t, const char *key, const char *val, hi3_error *err);
int64_t hi3_trace_count(const hi3_trace *t);    /* tokens recorded so far */
/* Write what was recorded, tokens ordered by (row, position), atomically. */
int hi3_trace_write(hi3_trace *t, const char *path, hi3_error *err);

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

/* --------------------------------------------------------------- sampling */

/* hi3-batching(7), SAMPLING. Temperature, then top-k, then top-p, then one draw from
 * Philox-4x32-10 keyed by the row's seed at counter = step (the index of
 * the token being generated in that row), so a row samples the same tokens
 * in any batch. greedy (or temperature 0) takes the argmax, ties to the
 * lowest id. */
typedef struct hi3_sampler {
	int greedy;
	double temperature;       /* > 0 unless greedy */
	int top_k;                /* 0: off */
	double top_p;             /* 1: off */
} hi3_sampler;

/* Philox-4x32-10 on a counter, in place. */
void hi3_philox4x32(uint32_t ctr[4], const uint32_t key[2]);
/* The uniform draw in [0, 1) for (seed, step). */
double hi3_uniform(uint64_t seed, uint64_t step);
int64_t hi3_argmax(const float *logits, int V);
/* log-softmax of logits (V) at token tok, temperature 1. */
double hi3_logprob(const float *logits, int V, int64_t tok);
/* Sample one token; scratch holds hi3_sample_scratch_size(V) bytes. */
int64_t hi3_sample(const float *logits, int V, const hi3_sampler *s, uint64_t seed, uint64_t step,
                   void *scratch);
size_t hi3_sample_scratch_size(int V);

/* ---------------------------------------------------- prefill and decode */

typedef void (*hi3_progress_fn)(void *ctx, int64_t done, int64_t total);

typedef struct hi3_prefill_opts {
	int max_new;              /* cache slots beyond L: C = L + max_new */
	hi3_dtype kv_dtype;       /* HI3_F32 or HI3_BF16 */
	int max_tokens;           /* tokens per forward chunk (0: 8192) */
	int record_routing;       /* MoE: store each prompt token's experts and weights */
	hi3_trace *trace;         /* record activations of the prompts' tokens (position: column), or NULL */
	hi3_progress_fn progress;
	void *progress_ctx;
} hi3_prefill_opts;

/* Run the prompts of c through the model and write the KV file at kv_path
 * (format hi3.kv: the cache, kv_len, next_logits from column n_i - 1 of
 * each row, finished), atomically. cond_path is recorded in metadata. */
int hi3_prefill(hi3_model *m, const hi3_cond *c, const char *cond_path, const hi3_prefill_opts *o,
                const char *kv_path, hi3_error *err);

enum hi3_decode_mask {
	HI3_MASK_CAUSAL = 0,      /* row i's query at index p attends slots [0, p] */
	HI3_MASK_NONE = 1,        /* upstream defect: attends every slot of the cache */
};
enum hi3_placement {
	HI3_PLACE_INDEX = 0,      /* token p of row i is fed at index p, slot p */
	HI3_PLACE_TAIL = 1,       /* upstream defect: new tokens appended at column L + s */
};

typedef struct hi3_decode_opts {
	hi3_sampler sampler;
	int have_seed;            /* seed overrides the conditions' per-row seeds */
	uint64_t seed;
	int have_stop;            /* stop replaces the conditions' stop tokens */
	const int64_t *stop;
	int n_stop;
	int steps;                /* at most this many steps in this call; <= 0: until done */
	int max_new;              /* tokens per row, at most the cache's max_new; 0: the cache's */
	int decode_mask;          /* enum hi3_decode_mask */
	int placement;            /* enum hi3_placement */
	int record_routing;       /* store MoE routing of generated tokens in the segment */
	int no_fsync;             /* keep step commits ordered but skip msync */
	hi3_trace *trace;         /* record activations of the fed tokens (position: n_i + g), or NULL */
	hi3_progress_fn progress;
	void *progress_ctx;
} hi3_decode_opts;

typedef struct hi3_decode_stats {
	int64_t steps;            /* decode steps run in this call */
	int64_t tokens;           /* tokens generated in this call */
	int64_t total_tokens;     /* tokens in the segment */
	int rows, finished;       /* rows, rows finished */
	int64_t resumed_from;     /* tokens already generated before this call */
	double seconds;
} hi3_decode_stats;

/* Decode from the KV file (updated in place) and write the segment file
 * (format hi3.segment) with every row's tokens so far, atomically. */
int hi3_decode(hi3_model *m, const hi3_cond *c, const char *kv_path, const hi3_decode_opts *o,
               const char *seg_path, hi3_decode_stats *stats, hi3_error *err);

/* ----------------------------------------------------------------- replay */

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

typedef struct hi3_replay_opts {
	int batched;              /* rows right padded into batches, else one row per forward */
	int max_tokens;           /* token budget of a batched forward (0: 8192) */
	int routing_recorded;     /* force the segment's recorded experts */
	int weights_recorded;     /* ... and their recorded weights */
	double is_cap;            /* C of the importance-ratio metrics (0: 2, as TIS uses) */
	/* optional outputs (caller allocated; n_moe * k entries per token):
	 * the routing of the pass that gave the log-probs */
	int16_t *rec_ids;         /* (T, n_moe, k) response tokens, or NULL */
	float *rec_w;             /* (T, n_moe, k) */
	int16_t *rec_prompt_ids;  /* (P, n_moe, k) prompt tokens, P = sum of n_i, or NULL */
	float *rec_prompt_w;      /* (P, n_moe, k) */
	hi3_trace *trace;         /* record the activations of the pass that gives the log-probs (position:
	                           * the prompt column, n_i + j for response token j), or NULL */
	hi3_progress_fn progress;
	void *progress_ctx;
} hi3_replay_opts;

/* The mismatch metrics RL trainers log for a rollout scored again
 * (hi3-replay(1), MISMATCH METRICS), named as verl's rollout correction
 * names them (rollout_corr/...). Per token t the log ratio is
 * r_t = replay_t - rollout_t (log-probs, natural log); a row's sequence
 * log ratio is S = sum of its r_t. Rows without tokens are left out. */
typedef struct hi3_mismatch_is {
	/* the importance weights w at one level: token (w_t = exp(r_t)) or
	 * sequence (every token of a row weighted exp(S)); exp of a log ratio
	 * clamped to [-20, 20]; C the cap */
	double mean, std, min, max;           /* std: of w clamped to [1/C, C] */
	double fraction_high, fraction_low;   /* share of w > C, of w < 1/C */
	double eff_sample_size;               /* 1 / mean((w'/mean w')^2), w' clamped to [1/C, C] */
	double seq_mean, seq_std, seq_min, seq_max, seq_max_deviation;  /* of each row's mean weight */
	double seq_fraction_high, seq_fraction_low;
} hi3_mismatch_is;

typedef struct hi3_mismatch {
	int64_t tokens;
	int rows;                     /* rows with tokens */
	double kl;                    /* mean of -r_t: the direct estimator of KL(rollout || replay) */
	double k3_kl;                 /* mean of exp(r_t) - r_t - 1 */
	double chi2_token, chi2_seq;  /* mean of exp(2 r_t) - 1; mean over rows of exp(2 S) - 1 */
	double training_ppl, training_log_ppl;   /* over rows: exp(-mean replay_t), -mean replay_t */
	double rollout_ppl, rollout_log_ppl;
	double log_ppl_diff, log_ppl_abs_diff, log_ppl_diff_max, log_ppl_diff_min;  /* over rows of
	                               * mean rollout_t - mean replay_t */
	double ppl_ratio;             /* mean over rows of exp(log_ppl_diff) */
	double log_ratio_sum;         /* sum of r_t over every token (a row: its S) */
	double cap;                   /* C */
	hi3_mismatch_is token, sequence;
} hi3_mismatch;

/* The metrics of rows (B of them; row i is [cu[i], cu[i+1]) of the two
 * log-prob arrays) with cap C > 1: over all rows into *all, and each row
 * alone into rows (B entries) when not NULL. */
int hi3_mismatch_compute(const float *replay, const float *rollout, const int64_t *cu, int B, double cap,
                         hi3_mismatch *all, hi3_mismatch *rows, hi3_error *err);

typedef struct hi3_replay_row {
	int64_t tokens;           /* 0: empty response, nothing to compare */
	double mean_abs, max_abs; /* |replay - rollout| log-prob */
	double ratio_mean, ratio_min, ratio_max;   /* exp(replay - rollout) */
	int64_t worst;            /* index within the row of the largest gap */
	double mean_abs_free, max_abs_free;        /* without routing replay */
	int64_t routing_flips, routing_tokens;
	hi3_mismatch mismatch;    /* the trainers' metrics of this row */
} hi3_replay_row;

typedef struct hi3_replay_report {
	int B;
	hi3_replay_row *rows;     /* (B) */
	int64_t tokens, empty_rows, worst;         /* worst: index in the segment */
	double mean_abs, max_abs, ratio_mean, ratio_min, ratio_max;
	double mean_abs_free, max_abs_free;
	int64_t routing_flips, routing_tokens;
	double seconds;
	/* how it was run, for the report */
	int batched, routing_recorded;
	int have_routes;          /* the segment recorded routing and the model is MoE */
	int64_t worst_row, worst_token; /* the worst token as (row, index within it); -1 when no tokens */
	hi3_mismatch mismatch;    /* the trainers' metrics over every row */
} hi3_replay_report;

/* Teacher-forced log-probs of the segment's tokens into logprobs (T). */
int hi3_replay(hi3_model *m, const hi3_cond *c, const hi3_segment *s, const hi3_replay_opts *o, float *logprobs,
               hi3_replay_report *rep, hi3_error *err);
void hi3_replay_report_release(hi3_replay_report *rep);
/* hi3_replay, then the replay file at path (hi3.replay; with record_routing
 * on an MoE model, the routing of every response and prompt token),
 * written atomically. seg_path is recorded in its metadata. */
int hi3_replay_to_file(hi3_model *m, const hi3_cond *c, const hi3_segment *s, const char *seg_path,
                       const hi3_replay_opts *o, int record_routing, const char *path, hi3_replay_report *rep,
                       hi3_error *err);
/* The report as one JSON object (hi3-replay(1)); *text is malloc'd. */
int hi3_replay_report_json(const hi3_replay_report *rep, char **text, size_t *len, hi3_error *err);

/* ---------------------------------------------------------- import-rollout */

/* hi3 import-rollout (hi3-import-rollout(1)): another engine's rollout, JSONL
 * of vLLM's or SGLang's outputs (the fields the page lists), into a
 * conditions file and a segment file for model m. */
typedef struct hi3_import_opts {
	int64_t seed_base;        /* a row without "seed": seed_base + its index */
} hi3_import_opts;

typedef struct hi3_import_report {
	int lines, rows;          /* requests read, completions (rows) written */
	int64_t prompt_tokens, response_tokens;
	int routed;               /* the rows carry routed experts */
	char source[16];          /* where the log-probs came from: vllm, sglang, openai, hi3, mixed */
} hi3_import_report;

int hi3_import_rollout(hi3_model *m, const char *jsonl_path, const hi3_import_opts *o, const char *cond_path,
                       const char *seg_path, hi3_import_report *rep, hi3_error *err);
/* -------------------------------------------------------------- diffusion */

/* A standard normal draw for (seed, stream, i), from Philox-4x32-10 keyed
 * by seed at counter (i, stream, "norm"), Box-Muller on two 53-bit
 * uniforms (hi3-batching(7), DIFFUSION): x_T of a request is stream 0 of its
 * seed, the noise of SDE step i stream i + 1, element i of (C, h, w). */
float hi3_normal(uint64_t seed, uint64_t stream, uint64_t i);

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

enum hi3_diffusion_sampler { HI3_SAMPLER_EULER, HI3_SAMPLER_SDE };

typedef struct hi3_diffusion_opts {
	int steps;                    /* T; 0: generation_config's diff_infer_steps */
	int have_guidance;            /* else generation_config's diff_guidance_scale */
	double guidance;              /* v = v_u + g (v_c - v_u) when g > 1; else the cond rows alone */
	int have_flow_shift;          /* else generation_config's flow_shift */
	double flow_shift;
	int sampler;                  /* enum hi3_diffusion_sampler */
	double eta;                   /* the SDE's noise scale (1) */
	const int64_t *sde_steps;     /* the SDE steps, increasing; NULL: every step */
	int n_sde_steps;
	hi3_dtype latent_dtype;       /* F32 (default), BF16, F16: rounded to before each log-prob */
	hi3_dtype cfg_dtype;          /* F32 (default, upstream's pipeline) or F16/BF16 (UniRL's trainer) */
	int no_kv_reuse;              /* every step over the whole sequence */
	const char *noise;            /* a safetensors file with x_T and sde_noise, or NULL: the rows' seeds */
	int capture_velocity;         /* record velocity (T, R, C, h, w) */
	int ablate;                   /* enum hi3_ablation: a diffusion defect restored (parity) */
	hi3_trace *trace;             /* record the forward pass of step trace_step (rows: the conditions'
	                               * rows, cond then uncond; positions: columns), or NULL */
	int trace_step;               /* in [0, T) */
	hi3_progress_fn progress;     /* per step */
	void *progress_ctx;
} hi3_diffusion_opts;

typedef struct hi3_diffusion_stats {
	int B, R, T, K, h, w;
	int64_t L, image_tokens;      /* columns of the conditions, image tokens per row */
	double seconds, step0_seconds, step_seconds;  /* total, the first step, the mean of the others */
	int cond_images;              /* the conditions' cond images (image editing) */
	double encode_seconds;        /* making their rows (the encoders), before the first step */
} hi3_diffusion_stats;

/* Denoise the gen_image rows of c from noise (the rows' seeds, or
 * o->noise) by flow matching, and write the trajectory at traj_path
 * (hi3.trajectory), atomically. The conditions must be gen_image rows
 * made for m, of one image size. */
int hi3_diffusion_capture(hi3_model *m, const hi3_cond *c, const hi3_diffusion_opts *o, const char *traj_path,
                          hi3_diffusion_stats *st, hi3_error *err);

/* Diffusion replay: for each SDE step i of the trajectory, the velocity at
 * its recorded x_i by a stateless forward over the whole sequence (as a
 * trainer recomputes it), the transition mean, and the log-prob of the
 * recorded x_{i+1}: logp (B, K). The report compares them with the
 * trajectory's sde_logp. */
typedef struct hi3_diffusion_replay_row {
	int steps;                    /* K */
	double mean_abs, max_abs;     /* |replay - rollout| log-prob */
	int worst;                    /* index into sde_steps of the largest gap */
} hi3_diffusion_replay_row;

typedef struct hi3_diffusion_replay_report {
	int B, K;
	hi3_diffusion_replay_row *rows;  /* (B) */
	double mean_abs, max_abs, seconds;
	int worst_row, worst_step;    /* the step index (not its place in sde_steps); -1 when K = 0 */
} hi3_diffusion_replay_report;

int hi3_diffusion_replay(hi3_model *m, const hi3_cond *c, const hi3_trajectory *t, float *logp,
                         hi3_diffusion_replay_report *rep, hi3_progress_fn progress, void *progress_ctx,
                         hi3_error *err);
/* hi3_diffusion_replay, then the replay file at path (hi3.replay with
 * sde_logp (B, K) and sde_steps (K)), atomically; traj_path is recorded. */
int hi3_diffusion_replay_to_file(hi3_model *m, const hi3_cond *c, const hi3_trajectory *t, const char *traj_path,
                                 const char *path, hi3_diffusion_replay_report *rep, hi3_progress_fn progress,
                                 void *progress_ctx, hi3_error *err);
void hi3_diffusion_replay_report_release(hi3_diffusion_replay_report *rep);
int hi3_diffusion_replay_report_json(const hi3_diffusion_replay_report *rep, char **text, size_t *len,
                                     hi3_error *err);

/* Decode the final latents of a trajectory with the model's VAE decoder
 * and write one PNG per request, DIR/row-<i>.png (the directory is made
 * when missing), with the prompt, seed and sampler settings in text
 * chunks. A model without VAE weights is an input error naming the
 * tensor, before anything is written. */
int hi3_trajectory_png(hi3_model *m, const hi3_trajectory *t, const char *dir, hi3_error *err);

/* ----------------------------------------------------------------- parity */

enum hi3_ablation {
	HI3_ABLATE_NONE = 0,
	HI3_ABLATE_DECODE_MASK,       /* decode attends every cache slot */
	HI3_ABLATE_TOKEN_PLACEMENT,   /* new tokens appended at the padded tail */
	HI3_ABLATE_POS_PAD,           /* pads get position id 0 */
	/* diffusion (gen_image rows) */
	HI3_ABLATE_ROPE_PAD,          /* pads: position id 0 and a zero RoPE table (UniRL's ragged concat) */
	HI3_ABLATE_ROPE_1D,           /* image tokens take 1-D RoPE (the replay before UniRL's ROPE-FIX) */
	HI3_ABLATE_EOI,               /* tokens after <timestep> attend every key, <eoi> too (flash attention) */
};

typedef struct hi3_parity_opts {
	const char *workdir;          /* every stage file goes here, and stays; NULL: a temporary
	                               * directory, removed afterwards */
	const int64_t *steps;         /* decode steps of each case */
	int n_steps;
	int greedy, sampled;          /* run greedy, and seeded sampling with `sampler` */
	hi3_sampler sampler;
	int64_t seed_base;            /* seed of a request without "seed": seed_base + index */
	int ablate;                   /* enum hi3_ablation, applied to the batched runs only */
	int pad_to;                   /* pad the batched constructions to at least this many columns */
	int vit_kernel;               /* cond images' ViT resize (hi3_cond_build_opts) */
	int vae_sample;               /* cond images' latents sampled (hi3_cond_build_opts) */
	hi3_dtype kv_dtype;
	double tol;                   /* a case passes with equal tokens and max |d| <= tol */
	hi3_progress_fn progress;
	void *progress_ctx;
} hi3_parity_opts;

typedef struct hi3_parity_row {
	int row;
	int64_t n;                    /* its true prompt length */
	int tokens_equal;
	int64_t first_diff;           /* first differing token, -1 when none */
	int64_t len_batched, len_alone;
	double logp_max;              /* over the tokens both runs produced */
	double kv_max, kv_slot0_max, kv_rest_max;  /* prefill K/V over slots [0, n) */
	/* gen_image requests: the trajectories */
	double latent_max;            /* over every step's latents */
	int64_t first_step;           /* the first latents[:, s] over the tolerance, -1 when none */
	double sde_logp_max;
} hi3_parity_row;

typedef struct hi3_parity_case {
	const char *construction;     /* "batch", "per-row+concat", "padded B=1" */
	int sampled, steps, L, pass, tokens_equal;
	double logp_max, kv_max, kv_slot0_max, kv_rest_max;
	int diffusion;                /* gen_image: steps are denoising steps, sampled the SDE */
	double latent_max, sde_logp_max;
	int n_rows;
	hi3_parity_row *rows;
} hi3_parity_case;

typedef struct hi3_parity_report {
	int B, n, pass;               /* pass: every case as expected (broken under an ablation) */
	int64_t *real_pos;            /* (B) */
	hi3_parity_case *cases;
} hi3_parity_report;

int hi3_parity(hi3_model *m, const hi3_template *t, const hi3_requests *rq, const hi3_parity_opts *o,
               hi3_parity_report *rep, hi3_error *err);
void hi3_parity_report_release(hi3_parity_report *rep);
const char *hi3_parity_ablation_name(int ablation);
/* The report: one line per case (rows: every row, else the rows that
 * fail), or one JSON object; *text is malloc'd. */
int hi3_parity_report_render(const hi3_parity_report *rep, const hi3_parity_opts *o, int json, int rows,
                             char **text, size_t *len, hi3_error *err);
int hi3_parity_ablation_parse(const char *name);   /* -1 when unknown */

/* ------------------------------------------------------------------ bench */

typedef struct hi3_bench_model_result {
	double first_prefill_s;   /* the first prefill: it also reads the weights in from the mapping */
	double prefill_s, prefill_tok_s, prefill_flops;   /* the same prefill again */
	double decode_s, decode_tok_s;
} hi3_bench_model_result;

/* Best-of-reps read bandwidth over a buffer of bytes, in bytes/s. */
double hi3_bench_membw(size_t bytes, int reps);
/* One layer's prefill GEMMs at M tokens: total flops, and the best times
 * of OpenBLAS sgemm (f32 weights) and hi3's batch-invariant GEMM (weights wdt, in place). */
int hi3_bench_gemm(const hi3_config *c, int M, hi3_dtype wdt, int reps, double *flops, double *t_blas,
                   double *t_hi3);
/* Bytes one B = 1 decode step reads at ctx cached slots. */
double hi3_bench_step_bytes(const hi3_config *c, hi3_dtype wdt, hi3_dtype kvdt, int ctx);
/* In-memory prefill of B x P tokens, then N greedy decode steps. */
int hi3_bench_model(hi3_model *m, int B, int P, int N, hi3_bench_model_result *r, hi3_error *err);
hi3_dtype hi3_model_weight_dtype(const hi3_model *m);
/* 1 when the model's backend gives a row the same bits in any batch. */
int hi3_model_batch_invariant(const hi3_model *m);

/* -------------------------------------------------------------- tokenizer */

/* A Hugging Face tokenizer.json (byte-level BPE with regex pre-tokenizers,
 * added/special tokens), encoding exactly as the `tokenizers` library. */
typedef struct hi3_tok hi3_tok;

enum hi3_tok_flags {
	HI3_TOK_SPECIAL = 1,      /* encode: match added tokens in the text; decode: emit special tokens */
};

int hi3_tok_load(hi3_tok **out, const char *path, hi3_error *err);
void hi3_tok_free(hi3_tok *t);
/* Encode len bytes of UTF-8 text; *ids is malloc'd (free it). No
 * begin/end tokens are added. */
int hi3_tok_encode(const hi3_tok *t, const char *text, size_t len, int flags, int64_t **ids, size_t *n,
                   hi3_error *err);
/* Decode ids to UTF-8; *text is malloc'd and NUL-terminated. */
int hi3_tok_decode(const hi3_tok *t, const int64_t *ids, size_t n, int flags, char **text, size_t *len,
                   hi3_error *err);
int64_t hi3_tok_id(const hi3_tok *t, const char *token);   /* -1 when absent */
const char *hi3_tok_token(const hi3_tok *t, int64_t id);   /* NULL when absent */
int64_t hi3_tok_vocab_size(const hi3_tok *t);              /* largest id + 1 */
const char *hi3_tok_hash(const hi3_tok *t);                /* 16 hex digits of the file's bytes */
/* The id of the token a tokenizer_config.json names under key (e.g.
 * "bos_token", "eos_token"; a string or an object with "content"). The
 * error names the file and the key when it is missing or unknown. */
int hi3_tok_config_id(const hi3_tok *t, const char *config_path, const char *key, int64_t *id,
                      hi3_error *err);

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
/* Refuse conditions made for another model (both fingerprints named; a
 * file without a fingerprint is not checked), and token ids or stop tokens
 * outside the model's vocabulary. */
int hi3_cond_check_model(const hi3_cond *c, const hi3_model *m, hi3_error *err);
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
/* *out = a copy of c (in memory) that also holds its images' encoder
 * outputs, made by m's encoders as the stages would make them
 * (vit_embeds, latent_shape, vae_latents), so that the stages need not run
 * the encoders again; c without images is copied as it is. */
int hi3_cond_encode(hi3_cond **out, const hi3_cond *c, hi3_model *m, hi3_error *err);
/* Merge conditions of any B and L into one (row groups kept in order: all
 * cond rows, then all uncond rows). Inputs must agree on mode, template,
 * cfg_factor, pad id, tokenizer and model ("" agrees with anything); the
 * error names both files and the field. Pads are rebuilt: input_ids get
 * the pad id, position_ids continue each row's indices (pad_zero: 0, the
 * upstream defect), rope_pos (t, t), masks 0. */
int hi3_cond_concat(hi3_cond **out, const hi3_cond *const *in, int n, int pad_zero, hi3_error *err);

/* The given rows of c, in that order, right padded to the longest of them
 * or min_L columns: one row with min_L 0 is that row alone, unpadded;
 * with min_L = c->L it is a right-padded B = 1. Pads follow c's
 * pad_positions. */
int hi3_cond_select(hi3_cond **out, const hi3_cond *c, const int *rows, int n, int min_L, hi3_error *err);
/* Requests: one JSON object per line (hi3-tokenize-concat(1)). */
typedef struct hi3_requests hi3_requests;

/* Parse JSONL text; name is used in messages ("FILE:LINE: ..."). */
int hi3_requests_parse(hi3_requests **out, const char *text, size_t len, const char *name, hi3_error *err);
/* Read and parse a JSONL file ("-" reads standard input). */
int hi3_requests_read(hi3_requests **out, const char *path, hi3_error *err);
void hi3_requests_free(hi3_requests *r);
int hi3_requests_count(const hi3_requests *r);
/* 1 when some request has a prompt (needs the tokenizer and template). */
int hi3_requests_need_tokenizer(const hi3_requests *r);
/* Read the "images" of every request (hi3_image_load: EXIF orientation,
 * convert("RGB")), paths relative to the JSONL file's directory (standard
 * input, or parsed text: the working directory); each image's size then
 * lays out its block. A missing, bad or too large image, or with
 * safe_paths one whose real path is outside that directory, is an input
 * error naming FILE:LINE and the image. hi3_cond_build needs them read. */
typedef struct hi3_request_image_opts {
	int64_t max_pixels;             /* as hi3_image_opts: 0 HI3_IMAGE_MAX_PIXELS, < 0 no limit */
	int64_t max_bytes;              /* as hi3_image_opts: 0 HI3_IMAGE_MAX_BYTES, < 0 no limit */
	int safe_paths;                 /* refuse images outside the requests' directory */
} hi3_request_image_opts;
int hi3_requests_load_images(hi3_requests *r, const hi3_request_image_opts *o, hi3_error *err);
/* 1 when some request has "images". */
int hi3_requests_have_images(const hi3_requests *r);

/* The sequence template (hi3-batching(7)) with what it needs: the tokenizer (only
 * for requests with a prompt), special token ids looked up by name, the
 * image settings of config.json and the pad id. */
typedef struct hi3_template hi3_template;

/* How a generated image's "HxW" becomes its token grid: the nearest
 * bucket by ratio (upstream), kept when a multiple of the latent factor
 * (with the ratio token of its nearest bucket), or refused unless it is a
 * bucket. */
enum hi3_image_size { HI3_SIZE_BUCKET = 0, HI3_SIZE_EXACT, HI3_SIZE_STRICT };

typedef struct hi3_template_opts {
	const char *model_dir;     /* config.json, tokenizer_config.json, generation_config.json,
	                            * tokenizer.json; NULL: none */
	const char *tokenizer;     /* tokenizer.json to use instead of MODEL/tokenizer.json, or NULL */
	int load_tokenizer;        /* 1: load the tokenizer (needed for prompts) */
	int fingerprint;           /* 1: fingerprint the checkpoint in model_dir */
	const char *name;          /* "pretrain" or "instruct"; NULL: generation_config.json's
	                            * sequence_template, else "pretrain" */
	int drop_think;            /* drop <think>...</think> sections of cot text */
	int image_size;            /* a gen_image "HxW" (enum hi3_image_size): snapped to its bucket (0) */
	int64_t pad_id;            /* >= 0: the pad id; -1: from tokenizer_config.json or config.json */
} hi3_template_opts;

int hi3_template_open(hi3_template **out, const hi3_template_opts *o, hi3_error *err);
void hi3_template_free(hi3_template *t);
int64_t hi3_template_pad_id(const hi3_template *t);     /* -1 when unknown */
const char *hi3_template_name(const hi3_template *t);  /* "pretrain" or "instruct" */
const hi3_tok *hi3_template_tok(const hi3_template *t); /* NULL when not loaded */
const char *hi3_template_fingerprint(const hi3_template *t); /* the model's, or "" */
/* The model's variant (enum hi3_variant; base without a model) and why. */
int hi3_template_variant(const hi3_template *t);
const char *hi3_template_variant_why(const hi3_template *t);
/* generation_config.json (the defaults without a model). */
const hi3_gen_defaults *hi3_template_gen_defaults(const hi3_template *t);
/* The resolution buckets (H, W) by ratio index; returns their count (up to
 * max are copied). */
int hi3_template_buckets(const hi3_template *t, int (*out)[2], int max);

/* One encoded row, before padding: what the template gives for a request. */
typedef struct hi3_cond_row {
	int64_t n;                      /* tokens */
	int64_t *ids;                   /* (n) */
	int32_t *rope;                  /* (n, 2) RoPE (y, x) */
	int n_blocks;
	int32_t *blocks;                /* (n_blocks, 2) full-attention [start, stop) */
	uint8_t *gen_image_mask;        /* (n) or NULL */
	uint8_t *cond_vit_mask;         /* (n) or NULL */
	uint8_t *cond_vae_mask;         /* (n) or NULL */
	int n_ts;
	int64_t *timestep_index;        /* (n_ts) positions of <timestep> tokens */
	int gen_h, gen_w;               /* the generated image's token grid; 0 without one */
	int n_stop;
	int64_t *stop_tokens;           /* (n_stop) */
	int n_forced, n_greedy;
	int64_t *forced_after;          /* (n_forced) records, see hi3_cond */
	int64_t *greedy_among;          /* (n_greedy) records */
	int64_t seed;
} hi3_cond_row;

/* Encode request i (uncond: the classifier-free-guidance row, whose user
 * and assistant text become <cfg> tokens); a pre-tokenized request is
 * taken verbatim. row->seed is left 0 (hi3_cond_build sets it). Errors
 * name FILE:LINE. */
int hi3_template_encode(const hi3_template *t, const hi3_requests *rq, int i, int uncond, hi3_cond_row *row,
                        hi3_error *err);
void hi3_cond_row_release(hi3_cond_row *row);

typedef struct hi3_cond_build_opts {
	int per_row;                    /* 1: each request alone into its own conditions, then merged */
	int pad_zero;                   /* pad position_ids with 0 (the upstream defect) */
	int64_t max_length;             /* > 0: refuse rows longer than this */
	int64_t seed_base;              /* seed of a request without "seed": seed_base + its index */
	int vit_kernel;                 /* the ViT view's resize, enum hi3_tv_kernel (0: HI3_TV_UINT8) */
	int64_t max_image_pixels;       /* refuse a VAE view resize larger than this (0: HI3_IMAGE_MAX_PIXELS) */
	int vae_sample;                 /* 1: the cond images' latents are posterior samples from the row
	                                 * seeds (metadata vae_posterior "sample"); 0: the posterior mean */
} hi3_cond_build_opts;

/* Build the conditions of a batch of requests (hi3-batching(7), rule 1; hi3-files(5)). */
int hi3_cond_build(hi3_cond **out, const hi3_template *t, const hi3_requests *rq, const hi3_cond_build_opts *o,
                   hi3_error *err);

/* ----------------------------------------------------------------- images */

/* Image inputs, read and preprocessed bit for bit as upstream's
 * HunyuanImage3ImageProcessor (image_processor.py at 1201fe8) does it with
 * Pillow 12, torch 2.8 and torchvision 0.23 (docs/IMAGES.md): the VAE view
 * (bucket, LANCZOS resize, centre crop, 2x - 1) and the ViT view (SigLIP2
 * naflex: size search, antialiased bilinear resize, patches). Images are
 * interleaved 8-bit (H, W, C). Every function is thread-safe; every result
 * is released by its own free function. */

#define HI3_IMAGE_MAX_PIXELS 89478485  /* PIL's Image.MAX_IMAGE_PIXELS, 1024 * 1024 * 1024 // 4 // 3 */
#define HI3_IMAGE_MAX_BYTES (256LL << 20) /* the largest picture file read (256 MiB) */

/* A decoded image as upstream's load_image gives it: EXIF orientation
 * applied (ImageOps.exif_transpose), then convert("RGB"). */
typedef struct hi3_image {
	int width, height;            /* W, H, after the orientation */
	uint8_t *rgb;                 /* (H, W, 3) */
	char *name;                   /* the path or name given, for messages */
	const char *format;           /* Pillow's Image.format: "JPEG", "PNG", "WEBP", "GIF", "BMP" */
	const char *mode;             /* Pillow 12's Image.mode on opening: "1", "L", "P", "LA", "RGB", "RGBA",
	                               * "CMYK", "I;16" */
	int file_width, file_height;  /* as stored, before the orientation */
	int channels;                 /* samples a pixel in the file: 1 gray or palette, 2 gray+alpha, 3, 4 */
	int bits;                     /* bits a sample in the file: 1, 2, 4, 8, 16 (BMP: bits a pixel) */
	int orientation;              /* the EXIF orientation applied, 2..8; 1 when none */
} hi3_image;

typedef struct hi3_image_opts {
	int64_t max_pixels;           /* refuse larger images (the header's size, before any pixel buffer);
	                               * 0: HI3_IMAGE_MAX_PIXELS, < 0: no limit */
	int64_t max_bytes;            /* hi3_image_load: refuse a larger file before reading it;
	                               * 0: HI3_IMAGE_MAX_BYTES, < 0: no limit */
} hi3_image_opts;

/* Read a picture file ("-" reads standard input), or decode one in memory
 * (name is used in messages): JPEG, PNG, WebP, GIF or BMP, bit for bit as
 * Pillow decodes it. A missing, empty, truncated, non-image, unaccepted or
 * too large file, or one that is not a regular file (a FIFO, a device, a
 * directory: refused before anything is read), is an input error (status
 * 3) naming the file. */
int hi3_image_load(hi3_image **out, const char *path, const hi3_image_opts *o, hi3_error *err);
/* The picture format of data by its first bytes: Pillow's name of one hi3
 * reads ("JPEG", "PNG", "WEBP", "GIF", "BMP"), the name of one it
 * recognises only to refuse ("TIFF", "PSD", "HEIC", ...), or NULL. */
const char *hi3_image_sniff(const void *data, size_t len);
int hi3_image_decode(hi3_image **out, const void *data, size_t len, const char *name, const hi3_image_opts *o,
                     hi3_error *err);
void hi3_image_free(hi3_image *im);

/* Pillow's resampling filters, by Pillow's numbers (Image.Resampling). */
enum hi3_resample { HI3_RESAMPLE_LANCZOS = 1, HI3_RESAMPLE_BILINEAR = 2, HI3_RESAMPLE_BICUBIC = 3 };

/* Pillow's Image.resize((dw, dh), filter) of an image of c = 1..4 8-bit
 * channels, bit for bit (libImaging/Resample.c; no reducing_gap):
 * src (sh, sw, c) -> dst (dh, dw, c). */
int hi3_resize_pil(const uint8_t *src, int sw, int sh, int c, uint8_t *dst, int dw, int dh, int filter,
                   hi3_error *err);

/* torchvision's v2 resize(img, [dh, dw], BILINEAR, antialias=True) of a
 * uint8 image, with the kernel torch 2.8 picks from its CPU capability:
 * HI3_TV_UINT8 where it reports AVX2 (the native uint8 kernel: int16 taps,
 * uint8 between the passes; the default), HI3_TV_FLOAT where it reports
 * no AVX (float32, rounded half to even). Bit for bit, in portable C.
 * Where torch reports AVX-512 torchvision also takes the float path, but
 * that build's float sums differ in the last bit now and then: HI3_TV_FLOAT
 * then matches all but about 1 value in 10^4-10^5, those by one level
 * (docs/IMAGES.md). */
enum hi3_tv_kernel { HI3_TV_UINT8 = 0, HI3_TV_FLOAT = 1 };
int hi3_resize_tv(const uint8_t *src, int sw, int sh, int c, uint8_t *dst, int dw, int dh, int kernel,
                  hi3_error *err);

/* The VAE resolution buckets of base size `base` (config.json
 * image_base_size): the (H, W) of HunyuanImage3ImageProcessor's
 * ResolutionGroup (step base/16, sizes floored to multiples of 16, sorted
 * by H/W), then 1024x768, 1280x720, 768x1024, 720x1280 where their ratio is
 * new (indices 33-36 at base 1024). Returns the count (37 at 1024), or -1
 * when base gives none or more than max. */
int hi3_image_buckets(int base, int (*hw)[2], int max);
/* The bucket nearest h/w in ratio (np.argmin: the first on a tie). */
int hi3_image_bucket_of(const int (*hw)[2], int n, int64_t h, int64_t w);
/* SigLIP2's get_image_size_for_max_num_patches: the patch grid (gh, gw)
 * of an h x w image for at most max patches of side p. */
void hi3_image_vit_grid(int64_t h, int64_t w, int p, int max, int *gh, int *gw);

typedef struct hi3_image_vae_opts {
	int base_size;                /* image_base_size; 0: 1024 */
	int resize;                   /* 1: crop_type "resize" (infer_align_image_size): a plain
	                               * LANCZOS resize to the bucket; 0: cover and centre crop */
	int64_t max_pixels;           /* refuse a resize (before the crop) larger than this;
	                               * 0: HI3_IMAGE_MAX_PIXELS, < 0: no limit */
	int target_h, target_w;       /* > 0: this bucket (H, W) instead of the nearest of the
	                               * table (a template's own bucket table chose it) */
} hi3_image_vae_opts;

/* The VAE view of an image (vae_process_image, resize_and_crop). */
typedef struct hi3_image_vae {
	int bucket;                   /* ratio index k of <img_ratio_k>, of the final H x W */
	int height, width;            /* H, W: the bucket, multiples of 16 */
	int resized_h, resized_w;     /* the LANCZOS resize before the crop */
	int crop_top, crop_left;      /* Python's round((resized - target) / 2), ties to even */
	uint8_t *rgb;                 /* (H, W, 3) the cropped image */
	float *pixels;                /* (3, H, W) ToTensor then Normalize(0.5, 0.5): (u / 255 - 0.5) / 0.5 */
} hi3_image_vae;

int hi3_image_vae_view(hi3_image_vae **out, const hi3_image *im, const hi3_image_vae_opts *o, hi3_error *err);
void hi3_image_vae_free(hi3_image_vae *v);

typedef struct hi3_image_vit_opts {
	int patch;                    /* vit_processor patch_size; 0: 16 */
	int max_patches;              /* vit_processor max_num_patches; 0: 1024 */
	int kernel;                   /* enum hi3_tv_kernel (0: HI3_TV_UINT8) */
} hi3_image_vit_opts;

/* The ViT view of an image (Siglip2ImageProcessorFast): P = max_patches
 * rows of D = 3 * patch * patch features. */
typedef struct hi3_image_vit {
	int grid_h, grid_w;           /* spatial_shapes (nph, npw) */
	int height, width;            /* the resized image: patch * grid */
	int n_patches, dim;           /* P, D */
	uint8_t *rgb;                 /* (height, width, 3) the resized image */
	float *pixel_values;          /* (P, D) row-major patches, feature (py * patch + px) * 3 + c,
	                               * (u - 127.5) / 127.5; rows from grid_h * grid_w on are 0 */
	int32_t *mask;                /* (P) pixel_attention_mask: 1 real patch, 0 pad */
} hi3_image_vit;

int hi3_image_vit_view(hi3_image_vit **out, const hi3_image *im, const hi3_image_vit_opts *o, hi3_error *err);
void hi3_image_vit_free(hi3_image_vit *v);

/* -------------------------------------------------------------------- VAE */

/* The image autoencoder (upstream AutoencoderKLConv3D, tensors vae.*): a
 * 3-D decoder from latents to pixels and a 3-D encoder from pixels to the
 * posterior of the latents. Its config is the "vae" block of config.json.
 * Latents (B, latent_channels, h, w); images (B, channels, H, W) with H =
 * h ffactor_spatial; pixel values about [-1, 1]. Every call runs fp32 on
 * the model's backend, one image at a time (on the CPU backend an image
 * gives the same bits alone or in a batch). */

enum hi3_vae_parts { HI3_VAE_DECODER = 1, HI3_VAE_ENCODER = 2 };

typedef struct hi3_vae hi3_vae;

/* The "vae" block of a config.json text (name for messages). */
int hi3_vae_config_parse(hi3_vae_config *c, const char *config_json, const char *name, hi3_error *err);
/* The VAE of an open model: its config's vae block, its vae.* tensors
 * through its backend (m must outlive the VAE). A model without them is an
 * input error naming the missing tensor or block. parts: enum
 * hi3_vae_parts, or'd. */
int hi3_vae_open(hi3_vae **out, hi3_model *m, int parts, hi3_error *err);
/* The same from a model directory alone (config.json with a vae block,
 * the checkpoint), on a backend of its own; opts as hi3_model_open's. */
int hi3_vae_open_dir(hi3_vae **out, const char *dir, const hi3_model_opts *opts, int parts, hi3_error *err);
void hi3_vae_close(hi3_vae *v);
const hi3_vae_config *hi3_vae_get_config(const hi3_vae *v);

/* images (B, out_channels, h f, w f) = the decoder's last frame of each
 * latent (B, latent_channels, h, w) as the diffusion makes it: z =
 * latent / scaling_factor (+ shift_factor) gets a time axis of 1 frame,
 * which the decoder grows to ffactor_temporal. */
int hi3_vae_decode(hi3_vae *v, const float *latents, int B, int h, int w, float *images, hi3_error *err);
/* The posterior of images (B, in_channels, H, W) in [-1, 1], H and W
 * multiples of ffactor_spatial, each repeated over ffactor_temporal
 * frames: mean and logvar (B, latent_channels, H / f, W / f), logvar
 * clamped to [-30, 20]. */
int hi3_vae_encode(hi3_vae *v, const float *images, int B, int H, int W, float *mean, float *logvar,
                   hi3_error *err);
/* The model's latents of a posterior, n elements: (s - shift_factor)
 * scaling_factor with s = mean (noise NULL: the posterior mean, the
 * default), or the sample s = mean + exp(logvar / 2) noise with noise
 * drawn by the caller (N(0, 1), e.g. from the row's counter-based
 * generator). */
void hi3_vae_latent(const hi3_vae *v, const float *mean, const float *logvar, const float *noise, size_t n,
                    float *latents);
/* rgb (H, W, 3) = round(clamp(x / 2 + 0.5, 0, 1) 255) of image (3, H, W),
 * in fp32 with ties to even (as diffusers' VaeImageProcessor in numpy). */
void hi3_vae_to_rgb8(const float *image, int H, int W, uint8_t *rgb);

/* --------------------------------------------------------- vision encoder */

/* The SigLIP2 vision encoder (upstream siglip2.py Siglip2VisionTransformer,
 * tensors vision_model.*; its pooling head vision_model.head.* is not read,
 * its output being unused upstream) and the aligner (LightProjector,
 * vision_aligner.*) that maps the encoder's output to the LLM's width. The
 * configs are the "vit" and "vit_aligner" blocks of config.json. Every call
 * runs fp32 on the model's backend; on the CPU backend an image gives the
 * same bits alone or in any batch, at any place in it. */

typedef struct hi3_vit hi3_vit;

/* The ViT and aligner of an open model, through its backend (m must
 * outlive them). A model without them is an input error naming the missing
 * block or tensor. */
int hi3_vit_open(hi3_vit **out, hi3_model *m, hi3_error *err);
/* The same from a model directory alone (config.json with vit and
 * vit_aligner blocks, the checkpoint), on a backend of its own; opts as
 * hi3_model_open's. */
int hi3_vit_open_dir(hi3_vit **out, const char *dir, const hi3_model_opts *opts, hi3_error *err);
void hi3_vit_close(hi3_vit *v);
const hi3_vit_config *hi3_vit_get_config(const hi3_vit *v);
const hi3_vit_aligner_config *hi3_vit_get_aligner_config(const hi3_vit *v);

/* n images as hi3_image_vit_view makes them: pixel_values (n, P, D) with D
 * = num_channels patch_size^2, mask (n, P) (1: a real patch, anything else
 * padding, a key no query attends to; every image needs a 1),
 * spatial_shapes (n, 2) the patch grids (nph, npw), nph npw <= P. Writes
 * hidden (n, P, vit hidden_size), the encoder's last_hidden_state, and
 * embeds (n, P, vit_aligner n_embed), the aligner's output; either may be
 * NULL. Pad slots carry real outputs (they attend to the real patches), as
 * upstream's do. */
int hi3_vit_encode(hi3_vit *v, const float *pixel_values, const int32_t *mask, const int32_t *spatial_shapes, int n,
                   int P, float *hidden, float *embeds, hi3_error *err);

/* ------------------------------------------------------------------ tools */

/* Statistics of a tensor of any dtype: min, max and mean over the finite
 * elements (NaN when there are none), and how many are NaN and +-Inf.
 * Deterministic for any thread count (threads 0: the OpenMP default). */
typedef struct hi3_stats {
	int64_t n, n_nan, n_inf;
	double min, max, mean;
} hi3_stats;
int hi3_tensor_stats(const hi3_tensor *t, int threads, hi3_stats *s, hi3_error *err);

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

/* hi3 inspect (see hi3-inspect(1)). path is a safetensors file or a
 * checkpoint directory (model.safetensors or model.safetensors.index.json). */
typedef struct hi3_inspect_opts {
	int json;                /* one JSON object instead of text */
	const char *tensor;      /* print this tensor's values (or render it with png) */
	const char *slice;       /* numpy-style selection of tensor, e.g. "0,:,3:7" */
	const char *png;         /* render a heatmap / attention mask / slot map here */
	int64_t row;             /* conditions file: the row whose mask png renders; -1: none */
	int scale;               /* png pixels per element; 0: automatic */
	int threads;             /* 0: the OpenMP default */
	int64_t max_image_pixels, max_image_bytes;  /* a picture FILE: as hi3_image_opts */
} hi3_inspect_opts;
/* Run inspect; the report (text or JSON, possibly empty) is returned in
 * *report (malloc'd, NUL-terminated; free it). A bad selection is a usage
 * error (status 2), an unreadable file an input error (status 3). A FILE
 * that starts as a picture (hi3_image_sniff) is decoded as the stages
 * would (hi3_image_load): its format, Pillow's mode, stored size, EXIF
 * orientation and size after it; png writes its RGB after the orientation. */
int hi3_inspect(const char *path, const hi3_inspect_opts *o, char **report, size_t *len,
                hi3_error *err);

/* hi3 diff (see hi3-diff(1)): two safetensors files compared tensor by tensor. */
typedef struct hi3_diff_opts {
	double atol, rtol;       /* an element differs when |a - b| > atol + rtol * |b| */
	int valid_only;          /* kv files: only each row's valid slots / generated steps */
	int64_t row_a, row_b;    /* compare row row_a of A with row row_b of B; -1: all rows */
	const char *const *tensors;  /* restrict to these names (n_tensors of them) */
	int n_tensors;
	int threads;             /* 0: the OpenMP default */
} hi3_diff_opts;

enum hi3_diff_status {
	HI3_DIFF_OK,             /* compared: every element within tolerance */
	HI3_DIFF_OVER,           /* compared: some element over tolerance */
	HI3_DIFF_ONLY_A,         /* the tensor is only in A */
	HI3_DIFF_ONLY_B,         /* the tensor is only in B */
	HI3_DIFF_DTYPE,          /* dtypes differ (not compared) */
	HI3_DIFF_SHAPE,          /* shapes differ (not compared) */
	HI3_DIFF_LENGTH,         /* --row on segments: the rows' lengths differ (the overlap compared) */
	HI3_DIFF_SKIPPED,        /* --row: the tensor has no row axis */
};

/* An element: its index in A's tensor, and the same place named by the
 * meaning of each dimension where the file format is known. */
typedef struct hi3_diff_loc {
	int ndim;
	int64_t idx[HI3_MAX_DIMS];        /* index into A's tensor */
	int n_named;                      /* 0: no names, use idx */
	const char *label[HI3_MAX_DIMS];  /* "row", "head", "slot", "col", "pos", ... */
	int64_t val[HI3_MAX_DIMS];
	double a, b;                      /* the two values there */
} hi3_diff_loc;

typedef struct hi3_diff_tensor {
	char *name;
	int status;                       /* enum hi3_diff_status */
	hi3_dtype dtype_a, dtype_b;
	int ndim_a, ndim_b;
	int64_t shape_a[HI3_MAX_DIMS], shape_b[HI3_MAX_DIMS];
	int64_t n_compared, n_over;
	int64_t len_a, len_b;             /* HI3_DIFF_LENGTH: the two rows' lengths */
	double max_abs;                   /* max |a - b|; +Inf for NaN against a number */
	hi3_diff_loc worst;               /* the first element where |a - b| = max_abs (max_abs > 0) */
	hi3_diff_loc first;               /* the first element over tolerance (n_over > 0) */
} hi3_diff_tensor;

typedef struct hi3_diff_result {
	char *path_a, *path_b;
	char *format_a, *format_b;        /* "" when the file names none */
	hi3_diff_opts opts;               /* as run (tensors not kept) */
	int valid_only;                   /* in effect (--row on kv files implies it) */
	int n;
	hi3_diff_tensor *t;               /* natural name order (k.2 before k.10); kv files: k.0, v.0, k.1, ... first */
	int n_differ;                     /* tensors with a status other than OK and SKIPPED */
	int first, worst;                 /* indices into t (first differing, largest max_abs); -1: none */
	int format_differs;               /* the files name different formats */
	int equal;                        /* no tensor differs and the formats agree */
} hi3_diff_result;

/* Compare A and B. Returns 0 with *out filled whether or not they differ
 * (see n_differ); -1 when a file cannot be read (status 3) or the options
 * do not fit the files (status 2). */
int hi3_diff(const char *path_a, const char *path_b, const hi3_diff_opts *o, hi3_diff_result **out,
             hi3_error *err);
void hi3_diff_free(hi3_diff_result *r);
/* The report: one line per tensor and a summary line, or one JSON object.
 * *text is malloc'd (free it); returns 0 or -1 when out of memory. */
int hi3_diff_report(const hi3_diff_result *r, int json, char **text, size_t *len, hi3_error *err);

/* hi3 diff --first (see hi3-diff(1)): two trace files aligned by (row,
 * position), compared point by point in forward order, and the first point
 * where they differ. */
typedef struct hi3_trace_diff_opts {
	double tol;              /* an element differs when |a - b| > tol (0: bitwise); ids always exactly */
	int64_t row_a, row_b;    /* align row row_a of A with row row_b of B; -1: each row with itself */
	int threads;             /* 0: the OpenMP default */
} hi3_trace_diff_opts;

/* A place in two traces: the aligned token and the element of the point. */
typedef struct hi3_trace_diff_loc {
	int64_t row_a, row_b, pos;
	int n_index;                      /* 0 (tokens, logits.lse), 1, or 2 (expert_out: slot, element) */
	int64_t index[2];
	double a, b;
} hi3_trace_diff_loc;

typedef struct hi3_trace_diff_point {
	char *name;                       /* "tokens" (the ids fed) first, then the points */
	int kind;                         /* enum hi3_trace_kind; -1 for tokens */
	int layer, sub;
	int status;                       /* HI3_DIFF_OK, _OVER, _ONLY_A, _ONLY_B, _DTYPE or _SHAPE */
	int integer;                      /* ids (tokens, experts, logits.topk_ids): compared exactly */
	int64_t compared, over;           /* elements */
	int64_t tokens_over;              /* aligned tokens with some element over tolerance */
	double max_abs;
	hi3_trace_diff_loc first;         /* over tolerance: the lowest position (then row), lowest index */
	hi3_trace_diff_loc worst;         /* where |a - b| = max_abs first occurs in that order */
} hi3_trace_diff_point;

typedef struct hi3_trace_diff {
	char *path_a, *path_b;
	hi3_trace_diff_opts opts;
	int64_t aligned, only_a, only_b;  /* tokens (of the rows compared) */
	int64_t pos_lo, pos_hi;           /* the aligned positions' range */
	int n_layers;                     /* layers named by either trace */
	int n;
	hi3_trace_diff_point *p;          /* forward order: tokens, embed, layer.0.in, ... */
	int first;                        /* index into p of the first difference; -1: none */
	int n_differ;                     /* points that differ (over, dtype, shape) */
	int equal;
	int n_meta_a, n_meta_b;
	char **meta_a, **meta_b;          /* (n_meta, 2) each file's metadata */
} hi3_trace_diff;

/* Compare the traces at path_a and path_b. 0 with *out filled whether or
 * not they differ; -1 when a file cannot be read (status 3), or when the
 * options do not fit them or no token is in both (status 2). */
int hi3_trace_diff_run(const char *path_a, const char *path_b, const hi3_trace_diff_opts *o, hi3_trace_diff **out,
                       hi3_error *err);
void hi3_trace_diff_free(hi3_trace_diff *d);
/* The report (text: the first difference, what it means, the table of max
 * |A - B| by layer and point; or one JSON object); *text is malloc'd. */
int hi3_trace_diff_report(const hi3_trace_diff *d, int json, char **text, size_t *len, hi3_error *err);
/* log10 max |A - B| by layer, a line per kind of point, as a PNG at path. */
int hi3_trace_diff_png(const hi3_trace_diff *d, const char *path, hi3_error *err);

#ifdef __cplusplus
}
#endif
#endif /* HI3_H */
