/*
 * vit-model.h -- vision encoder model directories for the tests and the
 * benchmark: config.json with vit and vit_aligner blocks, and
 * model.safetensors with every vision_model.* and vision_aligner.* tensor
 * hi3 loads plus the pooling head's (vision_model.head.*, which upstream
 * builds and hi3 does not read), filled by the counter-based generator of
 * model-gen.h (tests/ref/vit_ref.py computes the same), so the fixtures hold
 * only inputs and outputs, never the weights.
 */
#ifndef HI3_VIT_MODEL_H
#define HI3_VIT_MODEL_H

#include "hi3.h"

/* The vit and vit_aligner blocks of c and a as a config.json text (malloc'd). */
char *vit_model_config_json(const hi3_vit_config *c, const hi3_vit_aligner_config *a);
/* Write dir/config.json and dir/model.safetensors (dtype F32 or BF16);
 * head: with the pooling head's tensors; *checksum (if not NULL) as
 * gen_model_write's. */
int vit_model_write(const char *dir, const hi3_vit_config *c, const hi3_vit_aligner_config *a, int head,
                    uint64_t seed, hi3_dtype dt, double *checksum, hi3_error *err);

#endif
