/*
 * gemm.h -- the CPU matrix multiply y (M, N) = x (M, K) . W^T with W (N, K)
 * packed once into panels of 16 output columns.
 *
 * Batch invariance: every output element is one fused multiply-add chain
 * over k = 0 .. K-1 in order, whatever M is, wherever the row sits in a
 * tile, however many threads run (threads split M and N, never K). So a
 * row gives the same bits alone or in any batch.
 */
#ifndef HI3_GEMM_H
#define HI3_GEMM_H

#include "core/internal.h"

#define HI3_PANEL 16

typedef struct hi3_packed {
	int N, K;
	hi3_dtype dtype;          /* F32 or BF16 */
	void *p;                  /* (ceil(N/16), K, 16), zero padded */
} hi3_packed;

/* Pack a (N, K) F32, BF16 or F16 tensor; F16 is stored as F32. */
int hi3i_pack(hi3_packed *pw, const void *data, hi3_dtype dt, int N, int K, hi3_error *err);
void hi3i_pack_release(hi3_packed *pw);
/* Floats a packed (N, K) f32 matrix takes. */
size_t hi3i_pack_floats(int N, int K);
/* Pack a strided f32 view, element (n, k) = src[n sn + k sk], into buf
 * (hi3i_pack_floats(N, K), 64-byte aligned), which pw then borrows: for
 * products of two activations (attention scores and values) through the
 * same batch-invariant kernel. No allocation; pw needs no release. */
void hi3i_pack_view(hi3_packed *pw, float *buf, const float *src, int N, int K, int64_t sn, int64_t sk);
void hi3i_gemm(float *y, const float *x, const hi3_packed *w, int M);
/* n independent products y[i] (M[i], N_i) = x[i] . W_i^T in one parallel
 * region (their panels split across threads): the same bits as n calls of
 * hi3i_gemm, with one fork and join. */
void hi3i_gemm_group(int n, float *const *y, const float *const *x, const hi3_packed *const *w, const int *M);
/* Plain loops, same order as hi3i_gemm: for tests. */
void hi3i_gemm_ref(float *y, const float *x, const hi3_packed *w, int M);

#endif
