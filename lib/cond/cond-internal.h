/*
 * cond-internal.h -- what request.c, template.c and batch.c share: the
 * parsed requests. Not installed.
 */
#ifndef HI3_COND_INTERNAL_H
#define HI3_COND_INTERNAL_H

#include <jansson.h>
#include "cond/hi3-cond.h"
#include "format/conditions.h"

/* One request line. Strings point into obj. */
struct hi3i_request {
	int line;                    /* 1-based line in the input */
	json_t *obj;                 /* the object as parsed */
	const char *prompt;          /* NULL for a pre-tokenized request */
	size_t prompt_len;
	const char *system;          /* NULL when absent: a system prompt name or the text */
	size_t system_len;
	int strip_system;            /* "strip_system": 1 strip (the Instruct code's default), 0 keep, -1 absent */
	const char *cot;             /* NULL when absent ("" is present) */
	size_t cot_len;
	int bot_task;                /* enum hi3i_bot_task; -1 when absent (the model's default) */
	int mode;                    /* enum hi3i_mode */
	/* image_size: absent or "auto" (size_kind 0; size_auto: given as
	 * "auto"), H and W (1; size_colon: given as "A:B", which the Instruct
	 * code reads as W:H), or "<img_ratio_I>" or I (2, ratio_index I) */
	int size_kind;
	int size_auto;
	int size_colon;
	int64_t size_h, size_w;
	int ratio_index;
	int n_cond;
	int64_t (*cond)[2];          /* (n_cond, 2) cond image (H, W) */
	int (*cond_grid)[4];         /* (n_cond, 4) or NULL: each image's VAE bucket (H, W) and ViT grid
	                              * (h, w) as given (images continued from conditions), instead of
	                              * the ones of its size */
	const char **image_paths;    /* (n_cond) "images": the paths as given, or NULL ("cond_images") */
	hi3_image **images;          /* (n_cond) the images read (hi3_requests_load_images), or NULL */
	int has_seed;
	int64_t seed;
	int64_t *tokens;             /* (n_tokens) pre-tokenized row, or NULL (see hi3i_request_body) */
	size_t n_tokens;
	int has_stops;               /* "stop_tokens" given (possibly empty: no stop token) */
	int64_t *stops;              /* (n_stops) explicit stop tokens */
	int n_stops;
};

/* 1 when the request's "tokens" are the prompt's body, around which the
 * template adds the rest (mode gen_image, or with "images"), 0 when they
 * are the whole row (or absent). */
int hi3i_request_body(const struct hi3i_request *r);
/* 1 for a gen_image request with image_size "auto": its row is the text
 * stage that chooses the size (mode gen_text), the image stage's row
 * comes after it (hi3_cond_continue). */
int hi3i_request_text_stage(const struct hi3i_request *r);
/* The mode of the request's row: gen_text for the text stage of a
 * gen_image request with image_size "auto", else its own. */
int hi3i_request_row_mode(const struct hi3i_request *r);

struct hi3_requests {
	char *name;                  /* the input's name for messages */
	char *dir;                   /* where relative image paths start: the JSONL file's directory */
	int n;
	struct hi3i_request *r;      /* (n) */
};

/* hi3_cond_build; with views, request i's cond images are row
 * views_row[i]'s of views (their views and encoder outputs, as a text
 * stage had them; the requests' cond_grid set from them) instead of files. */
int hi3i_cond_build(hi3_cond **out, const hi3_template *t, const hi3_requests *rq, const hi3_cond_build_opts *o,
                    const hi3_cond *views, const int *views_row, hi3_error *err);

/* The vocabulary size rows are checked against (config.json vocab_size,
 * else the tokenizer's); 0 when unknown. */
int64_t hi3i_template_vocab(const hi3_template *t);

/* The effective bot_task of request i (its own, else the model's default)
 * and the rows per request (2 for gen_image with classifier-free guidance,
 * 1 otherwise and for a cfg-distilled model). */
int hi3i_template_bot_task(const hi3_template *t, const struct hi3i_request *r);
int hi3i_template_cfg_factor(const hi3_template *t, int mode);
/* vit_processor's patch_size and max_num_patches, as the template lays out ViT runs. */
void hi3i_template_vit(const hi3_template *t, int *patch, int *max_patches);
/* The VAE bucket (H, W) and the ViT grid (h, w) the template gives cond
 * image k of request r: those of its size, or its cond_grid. */
void hi3i_template_cond_geometry(const hi3_template *t, const struct hi3i_request *r, int k, int *bh, int *bw,
                                 int *gh, int *gw);

/* Image geometry (facts/image-input.md 1): the resolution buckets of a
 * base size, (H, W) sorted by H/W, count returned (-1: more than max); the
 * bucket nearest an image's H/W (first on a tie); SigLIP2's patch grid
 * for at most max patches of side p. hi3i_buckets is the base code's
 * table (33 buckets); hi3i_buckets_variant the variant's: the Instruct code
 * floors the sizes to multiples of 16 and appends 1024x768, 1280x720,
 * 768x1024 and 720x1280 (indices 33-36) where their ratio is new (-1 also
 * when base is not a multiple of 16 there). */
int hi3i_buckets(int base, int (*out)[2], int max);
int hi3i_buckets_variant(int variant, int base, int (*out)[2], int max);
int hi3i_bucket_of(const int (*reso)[2], int n, int64_t h, int64_t w);
void hi3i_vit_grid(int64_t h, int64_t w, int p, int max, int *gh, int *gw);

/* The system prompts of upstream's system_prompt.py (system-prompt.c):
 * names, and the text get_system_prompt(name, bot_task, custom) gives
 * (NULL: none); -1 for an unknown name. */
extern const char *const hi3i_system_prompt_names[];
int hi3i_system_prompt(const char *name, int bot_task, const char *custom, const char **text, int *strip_nl);

#endif
