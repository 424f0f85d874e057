/*
 * files.h -- the stage files a stage opens and writes, with the model it
 * runs (internal; files.c).
 */
#ifndef HI3_STAGE_FILES_H
#define HI3_STAGE_FILES_H

#include <jansson.h>
#include "format/kv.h"
#include "stage/hi3-stage.h"

/* hi3i_kv_open on every rank of the model's layout, rank 0 first (it locks
 * the file for all), failing on every rank when one fails; in one process
 * hi3i_kv_open itself. Each rank other than 0 keeps its own copy of the
 * decode record (hi3i_kv_privatize); kv->v0 and kv->nv are the logits
 * columns this rank computes and writes. */
int hi3i_kv_open_ranks(hi3_kvfile *kv, const char *path, const hi3_model *m, const hi3_cond *c, hi3_error *err);
/* The metadata of a stage's trace: stage, conditions_hash, rows, L,
 * pad_positions (from c). */
int hi3i_trace_stage_meta(hi3_trace *t, const char *stage, const hi3_cond *c, hi3_error *err);
/* The "stage" object of a replay report: "part" "text" for the text stage
 * of gen_image requests with image_size auto (c's next_stage, c's and s's
 * hashes; s NULL: none), "image" for the image stage tokenize-concat
 * --continue made from one (the text stage's hashes and rows); NULL for
 * other conditions. */
json_t *hi3i_stage_part_json(const hi3_cond *c, const hi3_segment *s);

#endif
