/*
 * kernels.h -- the launchers of the CUDA kernels (kernels/NAME.cu), called by
 * the host side of the CUDA backend (lib/backend/cuda.c). A launcher
 * enqueues its kernel(s) on stream s and returns cudaGetLastError(); it
 * never synchronises. Every pointer is device memory; every layout is the
 * one of the CPU op of the same name in lib/backend/cpu.c (see lib/backend/backend.h).
 *
 * Built by nvcc for the GPU, and (HI3_CUDA_EMU) by the host C++ compiler
 * against tests/cuda-emu, which runs the same kernels on the CPU for
 * `make check`; the launchers are then named hi3i_emu_* instead of
 * hi3i_cu_* so both can live in one program.
 *
 * Shapes: M tokens, H hidden, W = (n_h + 2 n_kv) d the fused qkv width,
 * g = n_h / n_kv, d head dim, C cache slots.
 */
#ifndef HI3_KERNELS_H
#define HI3_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef HI3_CUDA_EMU
#include "cuda-emu.h"
#define HI3K(name) hi3i_emu_##name
#else
#include <cuda_runtime_api.h>
#define HI3K(name) hi3i_cu_##name
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Element types, with the values of enum hi3_dtype (hi3.h). */
enum { HI3K_F32 = 0, HI3K_F16 = 1, HI3K_BF16 = 2 };

/* The attention plan of one query; same layout as hi3_attn_q (backend.h). */
typedef struct hi3k_attn_q {
	int32_t row, hi, blk_lo, blk_hi;
} hi3k_attn_q;

/* Where attention reads keys or values (hi3_kv_src), in elements. */
typedef struct hi3k_src {
	const void *base;
	int dtype;                /* HI3K_F32 or HI3K_BF16 */
	int64_t row_stride, head_stride, slot_stride;
} hi3k_src;

/* The largest head dim the attention and RoPE kernels take. */
#define HI3K_MAX_D 256

/* cudaSuccess when the current device can run these kernels (the build
 * holds code for its architecture). */
cudaError_t HI3K(probe)(void);
/* x (M, H) = rows ids (M) of wte (V, H) of dtype F32, BF16 or F16 */
cudaError_t HI3K(embed)(cudaStream_t s, float *x, const int64_t *ids, const void *wte, int dtype, int M,
                        int H);
/* y (M, n) = x / rms(x) * w (n), per row; y may equal x */
cudaError_t HI3K(rmsnorm)(cudaStream_t s, float *y, const float *x, const float *w, int M, int n, float eps);
/* x (n) += y (n) */
cudaError_t HI3K(add)(cudaStream_t s, float *x, const float *y, size_t n);
/* y (M, inter) = a * silu(b), ab (M, 2 inter) = [a | b] */
cudaError_t HI3K(swiglu)(cudaStream_t s, float *y, const float *ab, int M, int inter);
/* y (n) = bf16(x (n)), round to nearest even (the GEMM input of bf16 weights) */
cudaError_t HI3K(to_bf16)(cudaStream_t s, uint16_t *y, const float *x, size_t n);
/* dst (n, w) = src rows idx (n) */
cudaError_t HI3K(gather)(cudaStream_t s, float *dst, const float *src, const int32_t *idx, int n, int w);
/* dst[idx[i]] += scale[i] * src[i], rows of width w; idx has no repeats */
cudaError_t HI3K(scatter_add)(cudaStream_t s, float *dst, const float *src, const int32_t *idx,
                              const float *scale, int n, int w);
/* dst[idx[i]] = src[i] (CPU twin: cpu_scatter) */
cudaError_t HI3K(scatter)(cudaStream_t s, float *dst, const float *src, const int32_t *idx, int n, int w);
/* y (M, w) = sum over j < k, in order, of scale[m k + j] src[where[m k + j]],
 * from 0: the bits of zeroing y and scatter_add of src's rows in the order
 * where lists them (the MoE's combine in one launch). */
cudaError_t HI3K(combine)(cudaStream_t s, float *y, const float *src, const int32_t *where, const float *scale, int M,
                          int k, int w);
/* In place on qkv (M, W): RoPE on each query and key head at pos (M, 2)
 * (y, x) with theta (d/2), then, when qn and kn are not NULL, RMSNorm over
 * d with qn (d) for query heads and kn (d) for key heads. */
cudaError_t HI3K(rope_qk)(cudaStream_t s, float *qkv, const int32_t *pos, const float *theta, const float *qn,
                          const float *kn, int n_kv, int g, int d, float eps, int M);
/* keep (M) = 1 where token m is stored: slot[m] >= 0 and no later token
 * has the same (row, slot); then K and V of qkv (M, W) go to
 * k, v (B, n_kv, C, d) of dtype F32 or BF16 at [row[m], :, slot[m], :].
 * dirty (B, 2), when not NULL, widens each row's [first, last] slot
 * written since the last sync to the host. */
cudaError_t HI3K(kv_store)(cudaStream_t s, void *k, void *v, int dtype, int C, const float *qkv, const int32_t *row,
                           const int64_t *slot, uint8_t *keep, int32_t *dirty, int n_kv, int g, int d, int M);
/* Gather slot ranges of a KV mirror into dst, for one copy to the host.
 * mem holds n_layers x (K, V) blocks of layer_bytes, each (B, n_kv, C, d)
 * of es-byte elements (d es a multiple of 4). Range i is row ranges[3i],
 * slots ranges[3i+1] .. + ranges[3i+2] - 1; it lands, for block b = 2 l +
 * (0 for K, 1 for V) and kv head j, at word b block_words + offs[i] +
 * j ranges[3i+2] d es / 4. */
cudaError_t HI3K(kv_pack)(cudaStream_t s, uint32_t *dst, const void *mem, size_t layer_bytes, int n_layers, int n_kv,
                          int C, int d, int es, const int32_t *ranges, const int64_t *offs, int n, size_t block_words);
/* out (M, n_h d) = softmax(q k^T / sqrt(d)) v over the keys each query
 * admits (hi3_attn_q), q from qkv (M, W). Keys are the call's own tokens
 * (self: k, v index qkv, consecutive queries share a row) and d is a
 * multiple of 4: a tiled kernel over 32 queries per block. Otherwise (a cache): one block per (query, kv
 * head, split) over nsplit slices of its keys, combined through part
 * (M, n_h, nsplit, d + 2) when nsplit > 1. */
cudaError_t HI3K(attention)(cudaStream_t s, float *out, const float *qkv, const hi3k_src *k, const hi3k_src *v,
                            const hi3k_attn_q *q, int n_kv, int g, int d, int M, int self, int nsplit,
                            float *part);

/* Image ops (backend.h; CPU twins in lib/backend/cpu-image.c). Images are
 * channels-last (B, T, H, W, C), P = T H W. */

/* kernels/conv.cu: col (n, C kt kh kw) = the patches of output positions
 * p0 .. p0+n-1 of x (B, T, H, W, C), zero padding k/2, stride 1, column
 * ((c kt + dt) kh + dy) kw + dx: the order of a conv weight as stored */
cudaError_t HI3K(im2col)(cudaStream_t s, float *col, const float *x, int B, int T, int H, int W, int C, int kt, int kh,
                         int kw, int64_t p0, int n);
/* x (P, C) += z[p, c / r], z (P, C / r) */
cudaError_t HI3K(add_repeat)(cudaStream_t s, float *x, const float *z, int64_t P, int C, int r);
/* x (P, C) += the mean of z (P, C r) over each run of r channels */
cudaError_t HI3K(add_group_mean)(cudaStream_t s, float *x, const float *z, int64_t P, int C, int r);
/* hi (B, T rt, 2H, 2W, C) <-> lo (B, T, H, W, rt 4 C): to_hi 1 is
 * depth_to_space (lo to hi), 0 space_to_depth (hi to lo) */
cudaError_t HI3K(shuffle)(cudaStream_t s, float *hi, float *lo, int B, int T, int H, int W, int C, int rt, int to_hi);
/* kernels/norm.cu: y (B, P, C) = act(GroupNorm of G groups), part scratch
 * of B G ceil(P / chunk) + 2 B G floats; sums over chunks of `chunk`
 * positions, then the chunks in order */
cudaError_t HI3K(groupnorm)(cudaStream_t s, float *y, const float *x, const float *w, const float *b, int B, int64_t P,
                            int C, int G, float eps, int act, int chunk, float *part);
/* y (M, n) = LayerNorm of each row with w, b (n) */
cudaError_t HI3K(layernorm)(cudaStream_t s, float *y, const float *x, const float *w, const float *b, int M, int n,
                            float eps);
/* kernels/elementwise.cu: y (n) = act(x) (enum hi3_act) */
cudaError_t HI3K(act)(cudaStream_t s, float *y, const float *x, size_t n, int act);
/* x (M, N) += b (N) */
cudaError_t HI3K(bias_add)(cudaStream_t s, float *x, const float *b, int64_t M, int N);
/* h (B, P, C) = h (1 + ss[b, c]) + ss[b, C + c] */
cudaError_t HI3K(scale_shift)(cudaStream_t s, float *h, const float *ss, int B, int64_t P, int C);
/* kernels/softmax.cu: each row of s (n, M) = softmax(scale s) over the
 * keys with mask[j] != 0 (mask NULL: all); a row with none is zeros */
cudaError_t HI3K(softmax_rows)(cudaStream_t s, float *sc, int n, int M, float scale, const uint8_t *mask);

/* The most rows the gemv kernel takes; larger batches go to cuBLAS. */
#define HI3K_GEMV_MAX_M 8

/* y (M, N) = x (M, K) . W^T, W (N, K) F32 or BF16 (x rounded to bf16 for
 * it, like the cuBLAS path), M <= HI3K_GEMV_MAX_M: one pass over W. */
cudaError_t HI3K(gemv)(cudaStream_t s, float *y, const float *x, const void *w, int dtype, int M, int N, int K);
/* The same for any M, 8 rows a pass: each row the bits it gets from gemv
 * alone (the batch-invariant matmul, no cuBLAS). */
cudaError_t HI3K(gemv_rows)(cudaStream_t s, float *y, const float *x, const void *w, int dtype, int M, int N, int K);
/* One product of a grouped gemv (device memory, like its pointers). */
typedef struct hi3k_gemv_job {
	float *y;
	const float *x;
	const void *w;
	int M, N, K, pad;
} hi3k_gemv_job;
/* Every job (n_jobs) in one launch, the same bits as one gemv each; all
 * weights of one dtype, every M <= HI3K_GEMV_MAX_M, every N <= max_N. */
cudaError_t HI3K(gemv_group)(cudaStream_t s, const hi3k_gemv_job *jobs, int n_jobs, int max_N, int dtype);

/* A weight-only quantized matrix W (N, K) on the device (kernels/qgemv.cu;
 * the formats and values of lib/backend/quant.h, which cuda.c copies here):
 * codes and scales as the checkpoint stores them. */
enum { HI3K_Q_FP8 = 1, HI3K_Q_INT8 = 2, HI3K_Q_NF4 = 3, HI3K_Q_NVFP4 = 4 };
typedef struct hi3k_qmat {
	const uint8_t *codes;     /* FP8, INT8 (N, K); NF4 ceil(N K / 2); NVFP4 (N, K / 2) */
	const void *scale;        /* FP8 (N) or (1); INT8 (N) F32; NF4 absmax F32, or U8 when nested;
	                           * NVFP4 (N, K / block) e4m3 */
	const float *nested_absmax;
	int format, N, K, block;
	int scale_dtype, per_row, round_to, nested;   /* dtypes: HI3Q_* of core/qvalue.h */
	int nested_block;
	float scale2, offset;
	float map[16], nested_map[256];
} hi3k_qmat;
/* y (M, N) = x (M, K) . W^T for any M, W quantized (q in device memory):
 * each weight dequantized in registers to the CPU's f32 value, x kept f32;
 * a column's sum runs in one fixed order whatever M (rows are taken 8 at
 * a time), so a row alone and batched give the same bits. */
cudaError_t HI3K(qgemv)(cudaStream_t s, float *y, const float *x, const hi3k_qmat *q, int M, int N, int K);
/* The jobs of gemv_group, their w a hi3k_qmat: the same bits as one qgemv each. */
cudaError_t HI3K(qgemv_group)(cudaStream_t s, const hi3k_gemv_job *jobs, int n_jobs, int max_N);

/* The most candidates (top-k) a row's draw can keep. */
#define HI3K_SAMPLE_MAX_K 1024

/* Per row of logits (R, V): argmax (R) as hi3_argmax, and logprob (R) the
 * log-softmax at tok[r] (at the argmax when tok is NULL) as hi3_logprob.
 * argmax or logprob may be NULL. */
cudaError_t HI3K(logsoftmax_argmax)(cudaStream_t s, const float *logits, int R, int V, const int64_t *tok,
                                    int64_t *argmax, double *logprob);
/* tok (R) = hi3_sample of each row of logits (R, V) with the row's seed
 * and step; scratch holds R V keys. Sampling (not greedy, temperature > 0)
 * keeps at most HI3K_SAMPLE_MAX_K candidates: top_k (or V when top_k is 0
 * or >= V) above that is cudaErrorInvalidValue. */
cudaError_t HI3K(sample)(cudaStream_t s, const float *logits, int R, int V, const uint64_t *seed,
                         const uint64_t *step, int greedy, double temperature, int top_k, double top_p,
                         uint64_t *scratch, int64_t *tok);

#ifdef __cplusplus
}
#endif
#endif
