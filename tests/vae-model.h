/*
 * vae-model.h -- VAE model directories for the tests and the benchmark:
 * config.json with a vae block, and model.safetensors with every vae.*
 * tensor hi3 loads, filled by the counter-based generator of model-gen.h
 * (tests/ref/vae_ref.py gen() computes the same), so the fixtures hold only
 * inputs and outputs, never the weights.
 */
#ifndef HI3_VAE_MODEL_H
#define HI3_VAE_MODEL_H

#include "hi3.h"

/* The "vae" block of c as JSON text (malloc'd). */
char *vae_model_config_json(const hi3_vae_config *c);
/* Write dir/config.json and dir/model.safetensors (dtype F32 or BF16) for
 * the parts of c; *checksum (if not NULL) = sum over the tensors in name
 * order of sum_i v_i ((i % 13) + 1), in double. */
int vae_model_write(const char *dir, const hi3_vae_config *c, int parts, uint64_t seed, hi3_dtype dt,
                    double *checksum, hi3_error *err);

#endif
