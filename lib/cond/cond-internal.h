/*
 * cond-internal.h -- what request.c, template.c and batch.c share: the
 * parsed requests. Not installed.
 */
#ifndef HI3_COND_INTERNAL_H
#define HI3_COND_INTERNAL_H

#include <jansson.h>
#include "core/internal.h"

enum hi3i_mode { HI3I_GEN_TEXT, HI3I_GEN_IMAGE };

enum hi3i_bot_task { HI3I_BOT_AUTO, HI3I_BOT_IMAGE, HI3I_BOT_THINK, HI3I_BOT_RECAPTION, HI3I_BOT_IMG_RATIO };

/* One request line. Strings point into obj. */
struct hi3i_request {
	int line;                    /* 1-based line in the input */
	json_t *obj;                 /* the object as parsed */
	const char *prompt;          /* NULL for a pre-tokenized request */
	size_t prompt_len;
	const char *system;          /* NULL when absent */
	size_t system_len;
	const char *cot;             /* NULL when absent ("" is present) */
	size_t cot_len;
	int bot_task;                /* enum hi3i_bot_task */
	int mode;                    /* enum hi3i_mode */
	/* image_size: absent or "auto" (size_kind 0), H and W (1), or
	 * "<img_ratio_I>" (2, ratio_index I) */
	int size_kind;
	int64_t size_h, size_w;
	int ratio_index;
	int n_cond;
	int64_t (*cond)[2];          /* (n_cond, 2) cond image (H, W) */
	int has_seed;
	int64_t seed;
	int64_t *tokens;             /* (n_tokens) pre-tokenized row, or NULL */
	size_t n_tokens;
	int64_t *stops;              /* (n_stops) explicit stop tokens, or NULL */
	int n_stops;
};

struct hi3_requests {
	char *name;                  /* the input's name for messages */
	int n;
	struct hi3i_request *r;      /* (n) */
};

/* The vocabulary size rows are checked against (config.json vocab_size,
 * else the tokenizer's); 0 when unknown. */
int64_t hi3i_template_vocab(const hi3_template *t);

/* Image geometry (facts/image-input.md 1): the resolution buckets of a
 * base size, (H, W) sorted by H/W, count returned (-1: more than max); the
 * bucket nearest an image's H/W (first on a tie); SigLIP2's patch grid
 * for at most max patches of side p. */
int hi3i_buckets(int base, int (*out)[2], int max);
int hi3i_bucket_of(const int (*reso)[2], int n, int64_t h, int64_t w);
void hi3i_vit_grid(int64_t h, int64_t w, int p, int max, int *gh, int *gw);

extern const char *const hi3i_bot_task_names[];   /* by enum hi3i_bot_task */
extern const char *const hi3i_mode_names[];       /* by enum hi3i_mode */

#endif
