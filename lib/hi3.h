/*
 * hi3.h -- the public interface of libhi3.
 *
 * libhi3 runs the HunyuanImage-3.0 transformer stage by stage over plain,
 * memory-mapped safetensors files (see hi3-files(5)).
 *
 * Conventions, once for the whole library:
 *  - Functions that can fail return 0 on success and -1 on failure, and fill
 *    the caller's hi3_error (message names the file, tensor or line; status is
 *    the exit status a program should use: 1 runtime, 2 usage, 3 bad input).
 *  - Ownership: an object returned through `T **out` belongs to the caller and
 *    is released with the matching hi3_T_close()/hi3_T_free(); a `const`
 *    pointer returned by a getter is borrowed and lives as long as its owner.
 *  - The library never calls exit() and never prints, except through the
 *    log hook (hi3_set_log) for warnings and progress.
 *
 * Dimension letters used in shape comments throughout:
 *   B batch rows, L prompt length (padded), C cache slots per row (L + max_new),
 *   T tokens in one forward call, M = B*T flattened tokens, H hidden size,
 *   n_h query heads, n_kv key/value heads, d head dim, V vocabulary,
 *   E experts, k experts per token, I intermediate width, S image blocks per row.
 *
 * The interface is one header per layer of lib/ (docs/DESIGN.md), each
 * beside the sources that define it, included here lowest layer first; a
 * layer's header includes only headers of the layers below it.
 *   core/hi3-core.h      errors, dtypes, tensors, KV caches in memory, random draws, resampling
 *   tok/hi3-tok.h        the tokenizer
 *   par/hi3-par.h        communicators and parallel layouts
 *   format/hi3-format.h  the stage files, safetensors, checkpoints, PNG output
 *   model/hi3-model.h    config, the model and its forward pass, the activation recorder,
 *                        the layout plan, the VAE and the vision encoder, random checkpoints
 *   cond/hi3-cond.h      requests, the sequence template, conditions, image inputs
 *   stage/hi3-stage.h    sampling, prefill, decode, replay, diffusion
 *   tools/hi3-tools.h    import-rollout, parity, bench, inspect, diff
 * lib/backend/ has no public functions: its ops table (backend/backend.h)
 * is internal.
 */
#ifndef HI3_H
#define HI3_H

#include "core/hi3-core.h"
#include "tok/hi3-tok.h"
#include "par/hi3-par.h"
#include "format/hi3-format.h"
#include "model/hi3-model.h"
#include "cond/hi3-cond.h"
#include "stage/hi3-stage.h"
#include "tools/hi3-tools.h"

#endif /* HI3_H */
