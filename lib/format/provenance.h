/*
 * provenance.h -- the model fingerprint and conditions hash of stage files
 * (internal; provenance.c).
 */
#ifndef HI3_PROVENANCE_H
#define HI3_PROVENANCE_H

#include "core/internal.h"

/* Scale-out (model/shard.c, hi3-parallel(7)): the communicator of a model
 * opened as one rank of several, else NULL. */
hi3_comm *hi3i_model_comm(const hi3_model *m);
/* This rank's kv heads [*kv0, *kv0 + *n) of the model's. */
void hi3i_model_kv_heads(const hi3_model *m, int *kv0, int *n);
/* Every rank was given the same conditions (their hash), or an
 * HI3_ERR_INPUT error naming the rank that differs; 0 in one process. */
int hi3i_par_check_cond(const hi3_model *m, const hi3_cond *c, hi3_error *err);

/* Hash of the conditions tensors a stage file depends on (16 hex digits). */
void hi3i_cond_hash(const hi3_cond *c, char out[17]);
/* Refuse a stage file (at path, with these metadata values) made by another
 * model, or from conditions other than c; the message names both values. */
int hi3i_check_made_by(const char *path, const char *fingerprint, const hi3_model *m, hi3_error *err);
int hi3i_check_made_from(const char *path, const char *conditions_hash, const hi3_cond *c, hi3_error *err);

#endif
