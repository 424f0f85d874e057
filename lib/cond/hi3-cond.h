/*
 * hi3-cond.h -- the public interface of lib/cond/: requests, the
 * sequence template, building conditions, image inputs.
 * Part of hi3.h, the public interface: its conventions hold here.
 */
#ifndef HI3_LAYER_COND_H
#define HI3_LAYER_COND_H

#include "../model/hi3-model.h"
#include "../tok/hi3-tok.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------- conditions */

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

/* The image stage after a text stage (hi3-tokenize-concat(1), --continue):
 * for the given rows of text (the conditions of gen_image requests with
 * image_size "auto", metadata next_stage) and the segment decode wrote from
 * them, the gen_image conditions upstream's generate_image builds next:
 * each row's cot taken from its tokens (up to the first end token, or all
 * of them), drop_think's cut and system prompt switch (the template's
 * drop_think), the size of the bucket of its last token, a ratio token,
 * the same prompt, images (the text stage's views), system prompt and
 * seed, in one ragged batch. The conditions' requests are those explicit
 * requests; metadata text_conditions_hash, text_segment_hash and text_rows
 * name the text stage. A row whose tokens do not end at a ratio token is
 * an input error naming it. t needs the tokenizer. */
typedef struct hi3_continue_opts {
	const int *rows;                /* the text stage's rows to continue, in this order; NULL: all */
	int n_rows;
	hi3_cond_build_opts build;      /* per_row, pad_zero, max_length (seed_base, the images' options and
	                                 * vae_sample are the text stage's) */
} hi3_continue_opts;
int hi3_cond_continue(hi3_cond **out, const hi3_template *t, const hi3_cond *text, const hi3_segment *seg,
                      const hi3_continue_opts *o, hi3_error *err);

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

#ifdef __cplusplus
}
#endif
#endif /* HI3_LAYER_COND_H */
