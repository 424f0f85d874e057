/*
 * hi3-model.h -- the public interface of lib/model/: config.json and
 * generation_config.json, the model and its forward pass, the activation
 * recorder, the layout plan, the VAE and the vision encoder, random
 * checkpoints.
 * Part of hi3.h, the public interface: its conventions hold here.
 */
#ifndef HI3_LAYER_MODEL_H
#define HI3_LAYER_MODEL_H

#include "../format/hi3-format.h"
#include "../par/hi3-par.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- config */

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

/* --------------------------------------------------------------- model */

typedef struct hi3_model hi3_model;
typedef struct hi3_trace hi3_trace;    /* an activation recorder, below */

/*
 * Planning a layout from config.json alone (lib/model/plan.c, hi3-plan(1)):
 * the bytes one rank holds, the largest over the ranks of the layout.
 * Weights are the transformer's (what hi3_model_open maps and uses);
 * activations are the forward's scratch for a prefill chunk of tokens
 * (min(batch * max_len, chunk_tokens)) plus a layout's gather buffers.
 */
/* Quantized layouts of hi3-quant(7) for hi3_plan_compute: the layers'
 * matrices (attention, dense MLPs, experts, shared experts) as the
 * format stores them with their scales; embeddings, lm_head (dtype),
 * norms and routers (f32) as stored. */
enum hi3_plan_quant {
	HI3_PLAN_Q_NONE,
	HI3_PLAN_Q_FP8,           /* e4m3 + an f32 scale per row (compressed-tensors) */
	HI3_PLAN_Q_INT8,          /* int8 + SCB per row (bitsandbytes) */
	HI3_PLAN_Q_NF4,           /* 4 bits + a u8 absmax per 64 + nested f32 per 256 blocks (bitsandbytes) */
	HI3_PLAN_Q_NVFP4_MIXED,   /* experts NVFP4 (4 bits + e4m3 per 16), the rest fp8 per tensor (ModelOpt) */
};
const char *hi3_plan_quant_name(int q);

typedef struct hi3_plan_opts {
	int tp, ep;               /* the layout: tp * ep ranks */
	int batch;                /* B rows */
	int64_t max_len;          /* C cache slots per row (prompt + new tokens) */
	hi3_dtype dtype;          /* weights (the MoE router stays f32) */
	int quant;                /* enum hi3_plan_quant: the layer matrices quantized (dtype: the rest) */
	hi3_dtype kv_dtype;       /* the cache */
	int64_t chunk_tokens;     /* tokens per prefill forward (0: 8192, prefill's default) */
	uint64_t mem;             /* bytes a rank may use; 0: unknown */
	int cuda;                 /* 1: what one GPU holds (the cuda backend): the KV file's decode
	                           * record stays on the host, the gathers' buffers are device memory
	                           * (NCCL) and a GEMM's input has a bf16 copy; 0: one CPU process */
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
	int cuda_graphs;         /* cuda: decode steps from CUDA graphs: 0 where the driver has them
	                          * (default), 1 on (an error where it cannot), 2 off */
} hi3_model_opts;

int hi3_model_open(hi3_model **out, const char *dir, const hi3_model_opts *opts,
                   hi3_error *err);
void hi3_model_close(hi3_model *m);
const hi3_config *hi3_model_config(const hi3_model *m);
const hi3_gen_defaults *hi3_model_gen_defaults(const hi3_model *m);
const char *hi3_model_fingerprint(const hi3_model *m);
const char *hi3_model_dir(const hi3_model *m);
const char *hi3_model_backend(const hi3_model *m);
/* The checkpoint as this process maps it now (/proc/self/smaps: the maps
 * of files in the model's folder): *resident its bytes in memory, *huge
 * those mapped by 2 MiB entries. 1, or 0 where /proc cannot say (both 0).
 * A file whose page cache holds small pages is mapped by 4 KiB entries
 * whatever the map's advice, and a decode step reads it slower (hi3(1),
 * FILES IN USE). */
int hi3_model_pages(const hi3_model *m, double *resident, double *huge);
int hi3_model_n_moe_layers(const hi3_model *m);
int hi3_model_max_topk(const hi3_model *m);
/* The dtype of the layers' weights (of layer 0's qkv_proj). */
hi3_dtype hi3_model_weight_dtype(const hi3_model *m);
/* 1 when the model's backend gives a row the same bits in any batch. */
int hi3_model_batch_invariant(const hi3_model *m);

/* A cache in host memory (hi3_kvcache_alloc) shaped for model m: (B, n_kv,
 * C, d) per layer. */
hi3_kvcache *hi3_kvcache_for_model(const hi3_model *m, int B, int C, hi3_dtype dtype, hi3_error *err);
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

/* -------------------------------------------------------------- traces */

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

#ifdef __cplusplus
}
#endif
#endif /* HI3_LAYER_MODEL_H */
