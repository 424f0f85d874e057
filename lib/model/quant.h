/*
 * quant.h -- a checkpoint's quantization as its tools published it
 * (hi3-quant(7)): the method and its fields, read from config.json's
 * quantization_config or ModelOpt's hf_quant_config.json, and each weight
 * matrix's quantized form (backend/quant.h) found from the tensors beside
 * it. Internal to lib/model.
 *
 *   bitsandbytes       "X.weight" I8 (N, K) + "X.SCB" F32 (N)          int8
 *                      "X.weight" U8 packed + "X.weight.absmax",
 *                      ".quant_map", [".nested_absmax", ".nested_quant_map"],
 *                      ".quant_state.bitsandbytes__nf4" (JSON bytes)    nf4
 *   compressed-tensors "X.weight" F8_E4M3 (N, K) + "X.weight_scale" (N, 1)
 *                      or (1) [+ "X.input_scale"]                       fp8
 *   modelopt           "X.weight" F8_E4M3 + "X.weight_scale" F32 ()      fp8
 *                      "X.weight" U8 (N, K/2) + "X.weight_scale" F8_E4M3
 *                      (N, K/16) + "X.weight_scale_2" F32 () [+
 *                      "X.input_scale"]                                 nvfp4
 *
 * A matrix stored as F32/BF16/F16 (a module the tool skipped) is read as
 * it is.
 */
#ifndef HI3_MODEL_QUANT_H
#define HI3_MODEL_QUANT_H

#include "backend/quant.h"
#include <jansson.h>
#include "format/format.h"

enum hi3_qmethod { HI3_QM_NONE, HI3_QM_BNB, HI3_QM_CT, HI3_QM_MODELOPT };

typedef struct hi3_quant hi3_quant;

/* The quantization of the checkpoint in dir whose config.json text is
 * config_json: *out NULL when it has none; -1 (err naming the file and
 * field) for a method or field hi3 does not read. */
int hi3i_quant_open(hi3_quant **out, const char *dir, const char *config_json, hi3_error *err);
void hi3i_quant_close(hi3_quant *q);
int hi3i_quant_method(const hi3_quant *q);
/* "bitsandbytes nf4 (double quantization)", ...; and, or "", the
 * activation scheme the checkpoint asks for, which hi3 does not apply. */
const char *hi3i_quant_describe(const hi3_quant *q);
const char *hi3i_quant_activations(const hi3_quant *q);
/* The matrix tensor `name` (…".weight") of ck: 0 stored as a float dtype
 * (read as it is), 1 quantized (*out filled: N, K, codes and scales, all
 * checked against each other and the method), -1 (err names the tensor
 * or field) when its tensors disagree. q NULL: every matrix is plain. */
int hi3i_quant_weight(const hi3_quant *q, const hi3_ckpt *ck, const char *name, hi3_qweight *out, hi3_error *err);
/* The (N, K) a stored tensor of ck stands for: 1 with shape set when
 * name is a quantized matrix in any published layout (the scale tensors
 * beside it tell which), 0 when it is not one, -1 (err set) when its
 * quant state disagrees with its packed size. For config checks that know
 * no method. */
int hi3i_quant_logical_shape(const hi3_ckpt *ck, const char *name, int64_t shape[2], hi3_error *err);

/* For hi3 inspect: {"method", "file", "activations_asked", "kinds": {kind:
 * {how: count}}, "bytes_saved_vs_bf16"} (or "error") of the checkpoint in
 * dir; kinds: attention, dense mlp, routed experts, shared experts,
 * router, embedding, lm_head, other; how: fp8, int8, nf4, nvfp4 or the
 * stored dtype. NULL when out of memory. */
json_t *hi3i_quant_summary(const char *dir, const char *config_json);

#endif
