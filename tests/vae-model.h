/*
 * vae-model.h -- VAE model directories for the tests and the benchmark:
 * config.json with a vae block, and model.safetensors with every vae.*
 * tensor hi3 loads, filled by a counter-based generator that
 * tests/ref/vae_ref.py computes the same way, so the fixtures hold only
 * inputs and outputs, never the weights.
 *
 * Element i (from 0) of tensor NAME: u = top 24 bits of splitmix64 of
 * state fnv1a64(NAME) + seed + (i + 1) 0x9e3779b97f4a7c15, over 2^24; then in
 * double: a conv weight (2 u - 1) / sqrt(fan_in), a norm weight
 * 1 + 0.25 (2 u - 1), a bias 0.1 (2 u - 1), rounded to f32.
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
