/*
 * conditions.h -- what conditions.c (the file) and cond/batch.c (building
 * and merging rows) share: the storage behind a hi3_cond (internal).
 */
#ifndef HI3_CONDITIONS_H
#define HI3_CONDITIONS_H

#include <jansson.h>
#include "format/format.h"

/* The values of the metadata mode and bot_task, which the requests' fields
 * of the same names take (cond/request.c). The bot_task values upstream
 * knows; think_recaption is the Instruct code's (think, then a forced
 * <recaption>); a conditions file's bot_task may also be "mixed" (rows of
 * more than one). */
enum hi3i_mode { HI3I_GEN_TEXT, HI3I_GEN_IMAGE };
enum hi3i_bot_task {
	HI3I_BOT_AUTO, HI3I_BOT_IMAGE, HI3I_BOT_THINK, HI3I_BOT_RECAPTION, HI3I_BOT_IMG_RATIO,
	HI3I_BOT_THINK_RECAPTION,
};
extern const char *const hi3i_mode_names[];       /* by enum hi3i_mode, NULL-terminated */
extern const char *const hi3i_bot_task_names[];   /* by enum hi3i_bot_task, NULL-terminated */

/* Owned tensors of a conditions, by slot. */
enum { T_IDS, T_POS, T_REAL, T_ROPE, T_BLOCKS, T_SEEDS, T_STOPS, T_GMASK, T_VIT, T_VAE, T_TS, T_FORCED, T_GREEDY,
       T_GEN_HW, T_IMG_ROW, T_VIT_GRID, T_VIT_PIX, T_VAE_SHAPE, T_VAE_PIX,
       T_VIT_EMB, T_LAT_SHAPE, T_VAE_LAT, T_COUNT };

struct hi3i_cond {
	hi3_cond c;                  /* first: hi3_cond_close casts back */
	char *name;                  /* the file, or what built it, for messages */
	json_t *meta;                /* string -> string metadata */
	int cfg_factor;
	void *buf[T_COUNT];          /* owned storage (built or merged conditions) */
};

/* The hi3i_cond behind a hi3_cond (its first member). */
#define HI3I_COND(c) ((struct hi3i_cond *)(c))

/* An empty conditions; name is used in messages. NULL when out of memory. */
struct hi3i_cond *hi3i_cond_new(const char *name, hi3_error *err);
/* Point the string fields of the hi3_cond at the metadata. */
void hi3i_cond_bind_meta(struct hi3i_cond *ci);
int hi3i_cond_set_meta(struct hi3i_cond *ci, const char *key, const char *val, hi3_error *err);
int hi3i_cond_set_meta_int(struct hi3i_cond *ci, const char *key, int64_t v, hi3_error *err);
/* Refuse conditions made for another model (both fingerprints named; a
 * file without a fingerprint is not checked), and token ids or stop tokens
 * outside the model's vocabulary (hi3_cond_check_model, stage/files.c). */
int hi3i_cond_check_facts(const hi3_cond *c, const struct hi3i_model_facts *m, hi3_error *err);
/* Refuse conditions a text stage cannot run (what: "prefilled",
 * "decoded", "replayed"): gen_image rows, or rows with cond image tokens
 * but no pixels (requests with "cond_images" sizes alone). */
int hi3i_cond_require_text(const hi3_cond *c, const char *what, hi3_error *err);
/* Refuse rows with cond image tokens but no pixels. */
int hi3i_cond_require_pixels(const hi3_cond *c, hi3_error *err);

#endif
