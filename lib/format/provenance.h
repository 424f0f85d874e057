/*
 * provenance.h -- the model fingerprint and conditions hash of stage files
 * (internal; provenance.c).
 */
#ifndef HI3_PROVENANCE_H
#define HI3_PROVENANCE_H

#include "format/format.h"

/* Hash of the conditions tensors a stage file depends on (16 hex digits). */
void hi3i_cond_hash(const hi3_cond *c, char out[17]);
/* Refuse a stage file (at path, with these metadata values) made by another
 * model, or from conditions other than c; the message names both values. */
int hi3i_check_made_by(const char *path, const char *fingerprint, const struct hi3i_model_facts *m,
                       hi3_error *err);
int hi3i_check_made_from(const char *path, const char *conditions_hash, const hi3_cond *c, hi3_error *err);

#endif
