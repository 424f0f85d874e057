/*
 * model-gen.h -- model directories for the tests and the benchmarks of the
 * image modules (vae-model.h, vit-model.h): config.json, and
 * model.safetensors with the tensors of a list filled by a counter-based
 * generator that the Python references (tests/ref/vae_ref.py gen()) compute
 * the same way, so fixtures hold only inputs and outputs, never weights.
 *
 * Element i (from 0) of tensor NAME: u = top 24 bits of splitmix64 of
 * state fnv1a64(NAME) + seed + (i + 1) 0x9e3779b97f4a7c15, over 2^24; then in
 * double: a weight of 2 or more dims (2 u - 1) / sqrt(fan_in) (fan_in: the
 * product of the dims after the first), a norm weight (1 dim, not .bias)
 * 1 + 0.25 (2 u - 1), a bias 0.1 (2 u - 1), rounded to f32 (or bf16).
 */
#ifndef HI3_MODEL_GEN_H
#define HI3_MODEL_GEN_H

#include "hi3.h"

/* A list of tensors (names and shapes) to write. */
typedef struct gen_list gen_list;
gen_list *gen_list_new(void);
void gen_list_free(gen_list *l);
/* Append one tensor (the callback of hi3i_vae_tensors, hi3i_vit_tensors). */
void gen_list_add(void *l, const char *name, int ndim, const int64_t *shape);

/* Write dir/config.json (config_json) and dir/model.safetensors (dtype F32
 * or BF16) with the tensors of l; *checksum (if not NULL) = sum over the
 * tensors in name order of sum_i v_i ((i % 13) + 1), in double. */
int gen_model_write(const char *dir, const gen_list *l, const char *config_json, uint64_t seed, hi3_dtype dt,
                    double *checksum, hi3_error *err);

#endif
