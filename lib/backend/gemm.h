/*
 * gemm.h -- the CPU matrix multiply y (M, N) = x (M, K) . W^T, with W (N, K)
 * read where it lies: row major as the checkpoint stores it (F32, BF16 or
 * F16, typically a tensor of the memory-mapped checkpoint), never copied.
 *
 * Batch invariance: every output element is the same dot product whatever
 * M is, wherever the row sits in a tile, however many threads run (threads
 * split M and N, never K):
 *
 *     lane l (0..7) = fused multiply-add chain over k = l, l + 8, l + 16, ...
 *                     below K8 = K - K % 8, in order, from 0
 *     lane 0       += x[k] w[k] for k = K8 .. K - 1, in order (fused)
 *     y            = ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))
 *
 * So a row gives the same bits alone or in any batch, and the AVX-512, the
 * AVX2 and the portable kernels agree (the AVX-512 one, chosen at run time
 * for 8 rows or more, holds two elements' eight lanes in a register).
 */
#ifndef HI3_GEMM_H
#define HI3_GEMM_H

#include "core/internal.h"
#include "backend/quant.h"

/* A weight matrix as stored: (N, K) row major, row n at data + n K elements;
 * or (q set) a weight-only quantized one (quant.h), its codes and scales
 * where they lie, dequantized in the kernels' registers (or a tile at a
 * time into a small buffer, quant-x86.h says when) inside the product: the
 * value of each element is fixed by its stored bits, so the lanes and their
 * order are those above and the product is that over the f32 values. */
typedef struct hi3_wmat {
	const void *data;
	hi3_dtype dtype;          /* F32, BF16 or F16 (q: unused) */
	int N, K;
	const hi3_qweight *q;     /* NULL, or the quantized weight (the caller keeps it) */
} hi3_wmat;

/* 0, or -1 with err set when dt cannot be multiplied in place. */
int hi3i_wmat_init(hi3_wmat *w, const void *data, hi3_dtype dt, int N, int K, hi3_error *err);
/* The quantized weight q (kept by the caller while w is used). */
void hi3i_wmat_init_q(hi3_wmat *w, const hi3_qweight *q);
/* 0, or -1 when out of memory for a few KiB of scratch (y unwritten). */
int hi3i_gemm(float *y, const float *x, const hi3_wmat *w, int M);
/* n independent products y[i] (M[i], N_i) = x[i] . W_i^T in one parallel
 * region (their column tiles split across threads): the same bits as n
 * calls of hi3i_gemm, with one fork and join. 0, or -1 as hi3i_gemm. */
int hi3i_gemm_group(int n, float *const *y, const float *const *x, const hi3_wmat *const *w, const int *M);
/* The products the next hi3i_gemm or hi3i_gemm_group will run (the same
 * n, w, M): when they run on the pool's team, its waiting workers read the
 * first bytes those products read into cache meanwhile (hi3i_pool_prefetch);
 * else nothing. Returns at once. */
void hi3i_gemm_prefetch(int n, const hi3_wmat *const *w, const int *M);
/* For tests and benchmarks: use no kernel above max (0 the portable one,
 * 1 AVX2, 2 AVX-512; -1: the best the CPU has); returns the level now in
 * use. Every level gives the same bits. */
int hi3i_gemm_isa(int max);
/* The level now in use (the CPU's best, capped by hi3i_gemm_isa): the
 * CPU backend's other kernels (the conv) choose by it too. */
int hi3i_gemm_level(void);
/* Whether the few-row tiles of a decode step prefetch into L1 on this
 * core (else into L2): `hi3 bench` reads a step's weights again with the
 * same hint. */
int hi3i_gemm_prefetch_l1(void);
/* Plain loops in the order above: for tests. */
void hi3i_gemm_ref(float *y, const float *x, const hi3_wmat *w, int M);

#endif
