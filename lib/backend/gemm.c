/*
 * gemm.c -- packed, batch-invariant matrix multiply for the CPU backend.
 *
 * Layout: panel p holds W rows 16p .. 16p+15 transposed: P[p][k][j] =
 * W[16p + j][k]. An MR x 16 tile of y is MR*2 AVX2 accumulators; each step k
 * broadcasts x[m][k] and multiplies it into the two 8-wide halves of P[p][k].
 * Loops: rows in blocks of MC, K in blocks of KC (a block's C tile is
 * stored and reloaded, which is exact), panels split across threads.
 * For BF16 weights a KC x 16 block is widened to f32 in a small buffer when
 * enough rows reuse it, else widened in the kernel.
 */
#include <math.h>
#include <string.h>
#include <omp.h>
#include "backend/gemm.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define HAVE_X86 1
#endif

#define MR 6
#define MC 96
#define KC 256

int hi3i_pack(hi3_packed *pw, const void *data, hi3_dtype dt, int N, int K, hi3_error *err)
{
	int np = (N + HI3_PANEL - 1) / HI3_PANEL;
	hi3_dtype store = dt == HI3_BF16 ? HI3_BF16 : HI3_F32;
	size_t es = hi3_dtype_size(store), total = (size_t)np * (size_t)K * HI3_PANEL * es;
	const unsigned char *src = data;

	memset(pw, 0, sizeof(*pw));
	if (dt != HI3_F32 && dt != HI3_BF16 && dt != HI3_F16)
		return hi3_error_set(err, HI3_ERR_INPUT, "cannot use dtype %s as a weight matrix", hi3_dtype_name(dt));
	pw->p = hi3i_aligned_alloc(total, err);
	if (!pw->p)
		return -1;
	pw->N = N;
	pw->K = K;
	pw->dtype = store;
	memset(pw->p, 0, total);
#pragma omp parallel for schedule(static)
	for (int p = 0; p < np; p++) {
		for (int j = 0; j < HI3_PANEL && p * HI3_PANEL + j < N; j++) {
			size_t row = (size_t)(p * HI3_PANEL + j) * (size_t)K;
			for (int k = 0; k < K; k++) {
				size_t dst = ((size_t)p * (size_t)K + (size_t)k) * HI3_PANEL + (size_t)j;
				if (store == HI3_BF16) {
					memcpy((uint16_t *)pw->p + dst, src + 2 * (row + (size_t)k), 2);
				} else if (dt == HI3_F32) {
					memcpy((float *)pw->p + dst, src + 4 * (row + (size_t)k), 4);
				} else {
					uint16_t h;
					memcpy(&h, src + 2 * (row + (size_t)k), 2);
					((float *)pw->p)[dst] = hi3_f16_to_f32(h);
				}
			}
		}
	}
	return 0;
}

void hi3i_pack_release(hi3_packed *pw)
{
	free(pw->p);
	memset(pw, 0, sizeof(*pw));
}

size_t hi3i_pack_floats(int N, int K)
{
	return (size_t)((N + HI3_PANEL - 1) / HI3_PANEL) * (size_t)K * HI3_PANEL;
}

void hi3i_pack_view(hi3_packed *pw, float *buf, const float *src, int N, int K, int64_t sn, int64_t sk)
{
	const int np = (N + HI3_PANEL - 1) / HI3_PANEL;

	pw->N = N;
	pw->K = K;
	pw->dtype = HI3_F32;
	pw->p = buf;
#pragma omp parallel for schedule(static) if ((int64_t)N * K >= 1 << 16)
	for (int p = 0; p < np; p++) {
		float *dst = buf + (size_t)p * (size_t)K * HI3_PANEL;
		/* read along the source's contiguous axis */
		if (sk == 1) {
			for (int j = 0; j < HI3_PANEL; j++) {
				int n = p * HI3_PANEL + j;
				for (int k = 0; k < K; k++)
					dst[(size_t)k * HI3_PANEL + j] = n < N ? src[(int64_t)n * sn + k] : 0.0f;
			}
		} else {
			for (int k = 0; k < K; k++)
				for (int j = 0; j < HI3_PANEL; j++) {
					int n = p * HI3_PANEL + j;
					dst[(size_t)k * HI3_PANEL + j] = n < N ? src[(int64_t)n * sn + (int64_t)k * sk] : 0.0f;
				}
		}
	}
}

static inline float panel_at(const hi3_packed *w, int p, int k, int j)
{
	size_t i = ((size_t)p * (size_t)w->K + (size_t)k) * HI3_PANEL + (size_t)j;

	return w->dtype == HI3_BF16 ? hi3_bf16_to_f32(((const uint16_t *)w->p)[i]) : ((const float *)w->p)[i];
}

void hi3i_gemm_ref(float *y, const float *x, const hi3_packed *w, int M)
{
	for (int m = 0; m < M; m++)
		for (int n = 0; n < w->N; n++) {
			float acc = 0.0f;
			for (int k = 0; k < w->K; k++)
				acc = fmaf(x[(size_t)m * w->K + k], panel_at(w, n / HI3_PANEL, k, n % HI3_PANEL), acc);
			y[(size_t)m * w->N + n] = acc;
		}
}

#ifdef HAVE_X86
/*
 * The micro-kernel: rows m0 .. m0+mr-1 of x (stride K), k in [k0, k1), one
 * panel block b (f32, or bf16 when wide), into c (mr x 16, stride ldc),
 * accumulating when k0 > 0. Specialised for each mr by the switch below.
 */
__attribute__((target("avx2,fma"), always_inline)) static inline void
kern(int mr, const float *x, size_t K, const void *b, int bf16, int k0, int k1, float *c, size_t ldc,
     int accumulate)
{
	__m256 acc[MR][2];

#pragma GCC unroll 6
	for (int i = 0; i < mr; i++) {
		if (accumulate) {
			acc[i][0] = _mm256_loadu_ps(c + i * ldc);
			acc[i][1] = _mm256_loadu_ps(c + i * ldc + 8);
		} else {
			acc[i][0] = _mm256_setzero_ps();
			acc[i][1] = _mm256_setzero_ps();
		}
	}
	for (int k = k0; k < k1; k++) {
		__m256 b0, b1;
		if (bf16) {
			const uint16_t *bp = (const uint16_t *)b + (size_t)(k - k0) * 16;
			__m256i w0 = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)bp));
			__m256i w1 = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(bp + 8)));
			b0 = _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16));
			b1 = _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16));
		} else {
			const float *bp = (const float *)b + (size_t)(k - k0) * 16;
			b0 = _mm256_load_ps(bp);
			b1 = _mm256_load_ps(bp + 8);
		}
#pragma GCC unroll 6
		for (int i = 0; i < mr; i++) {
			__m256 a = _mm256_broadcast_ss(x + i * K + k);
			acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
			acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
		}
	}
#pragma GCC unroll 6
	for (int i = 0; i < mr; i++) {
		_mm256_storeu_ps(c + i * ldc, acc[i][0]);
		_mm256_storeu_ps(c + i * ldc + 8, acc[i][1]);
	}
}

#define KERN_CASE(n)                                                                  \
	case n:                                                                       \
		if (bf16)                                                             \
			kern(n, x, K, b, 1, k0, k1, c, ldc, accumulate);              \
		else                                                                  \
			kern(n, x, K, b, 0, k0, k1, c, ldc, accumulate);              \
		break;

__attribute__((target("avx2,fma"))) static void kern_any(int mr, const float *x, size_t K, const void *b,
                                                         int bf16, int k0, int k1, float *c, size_t ldc,
                                                         int accumulate)
{
	switch (mr) {
		KERN_CASE(1) KERN_CASE(2) KERN_CASE(3) KERN_CASE(4) KERN_CASE(5) KERN_CASE(6)
	}
}

__attribute__((target("avx2"))) static void widen_bf16(float *dst, const uint16_t *src, size_t n)
{
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		__m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
		_mm256_store_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
	}
	for (; i < n; i++)
		dst[i] = hi3_bf16_to_f32(src[i]);
}

static int have_avx2(void)
{
	static int v = -1;

	if (v < 0) {
		__builtin_cpu_init();
		v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
	}
	return v;
}
#endif

/* Portable kernel with the same per-element order (fmaf chain over k). */
static void kern_scalar(int mr, const float *x, size_t K, const void *b, int bf16, int k0, int k1, float *c,
                        size_t ldc, int accumulate)
{
	for (int i = 0; i < mr; i++)
		for (int j = 0; j < 16; j++) {
			float acc = accumulate ? c[i * ldc + j] : 0.0f;
			for (int k = k0; k < k1; k++) {
				size_t o = (size_t)(k - k0) * 16 + (size_t)j;
				float wv = bf16 ? hi3_bf16_to_f32(((const uint16_t *)b)[o]) : ((const float *)b)[o];
				acc = fmaf(x[i * K + k], wv, acc);
			}
			c[i * ldc + j] = acc;
		}
}

/*
 * Panels [p0, p1) of y = x W^T for rows [m0, m0 + mc): for each k block in
 * order, each panel, each MR-row tile. wide is a KC x 16 scratch for
 * widened bf16 blocks.
 */
static void gemm_panels(float *y, const float *x, const hi3_packed *w, int m0, int mc, int p0, int p1, float *wide)
{
	const int N = w->N, K = w->K, bf16 = w->dtype == HI3_BF16;
	const size_t es = bf16 ? 2 : 4;
	float edge[MR * 16];
#ifdef HAVE_X86
	const int simd = have_avx2();
#else
	const int simd = 0;
	(void)wide;
#endif

	/* One row tile reuses nothing across panels: stream each panel whole
	 * (K unblocked) rather than in KC slices strided over all panels. The
	 * bits are the same either way: a C tile stored and reloaded is exact. */
	const int kc = mc <= MR ? K : KC;

	for (int k0 = 0; k0 < K; k0 += kc) {
		int k1 = HI3_MIN(K, k0 + kc);
		for (int p = p0; p < p1; p++) {
			const unsigned char *blk = (const unsigned char *)w->p +
			                           ((size_t)p * (size_t)K + (size_t)k0) * HI3_PANEL * es;
			const void *b = blk;
			int b_bf16 = bf16, ncol = HI3_MIN(16, N - p * 16);
#ifdef HAVE_X86
			if (bf16 && simd && mc > MR) {
				widen_bf16(wide, (const uint16_t *)blk, (size_t)(k1 - k0) * 16);
				b = wide;
				b_bf16 = 0;
			}
#endif
			for (int mi = 0; mi < mc; mi += MR) {
				int mr = HI3_MIN(MR, mc - mi);
				const float *xa = x + (size_t)(m0 + mi) * K;
				float *c = y + (size_t)(m0 + mi) * N + (size_t)p * 16;
				size_t ldc = (size_t)N;

				if (ncol < 16) {
					for (int i = 0; i < mr; i++)
						for (int j = 0; j < 16; j++)
							edge[i * 16 + j] = k0 && j < ncol ? c[i * ldc + j] : 0.0f;
					c = edge;
					ldc = 16;
				}
#ifdef HAVE_X86
				if (simd)
					kern_any(mr, xa, (size_t)K, b, b_bf16, k0, k1, c, ldc, k0 > 0);
				else
#endif
					kern_scalar(mr, xa, (size_t)K, b, b_bf16, k0, k1, c, ldc, k0 > 0);
				if (c == edge) {
					float *cy = y + (size_t)(m0 + mi) * N + (size_t)p * 16;
					for (int i = 0; i < mr; i++)
						memcpy(cy + i * (size_t)N, edge + i * 16, sizeof(float) * (size_t)ncol);
				}
			}
		}
	}
}

void hi3i_gemm(float *y, const float *x, const hi3_packed *w, int M)
{
	const int N = w->N, K = w->K, np = (N + HI3_PANEL - 1) / HI3_PANEL;

	if (M <= 0 || N <= 0)
		return;
	if (K == 0) {
		memset(y, 0, sizeof(float) * (size_t)M * (size_t)N);
		return;
	}
#pragma omp parallel if (np > 1 && (double)M * N * K >= 1 << 18)
	{
		int nt = omp_get_num_threads(), id = omp_get_thread_num();
		int p0 = (int)((int64_t)np * id / nt), p1 = (int)((int64_t)np * (id + 1) / nt);
		float wide[KC * 16] __attribute__((aligned(64)));

		for (int m0 = 0; m0 < M; m0 += MC)
			gemm_panels(y, x, w, m0, HI3_MIN(MC, M - m0), p0, p1, wide);
	}
}

void hi3i_gemm_group(int n, float *const *y, const float *const *x, const hi3_packed *const *w, const int *M)
{
	int64_t total = 0;

	for (int i = 0; i < n; i++)
		if (M[i] > 0 && w[i]->N > 0)
			total += (w[i]->N + HI3_PANEL - 1) / HI3_PANEL;
	if (!total)
		return;
	/* one parallel region over the union of every job's panels */
#pragma omp parallel if (total > 1)
	{
		int nt = omp_get_num_threads(), id = omp_get_thread_num();
		int64_t q0 = total * id / nt, q1 = total * (id + 1) / nt, base = 0;
		float wide[KC * 16] __attribute__((aligned(64)));

		for (int i = 0; i < n && base < q1; i++) {
			int np, p0, p1;
			if (M[i] <= 0 || w[i]->N <= 0)
				continue;
			np = (w[i]->N + HI3_PANEL - 1) / HI3_PANEL;
			p0 = (int)HI3_MAX(q0 - base, 0);
			p1 = (int)HI3_MIN(q1 - base, np);
			if (w[i]->K == 0) {
				if (p0 < p1 && p0 == 0)
					memset(y[i], 0, sizeof(float) * (size_t)M[i] * (size_t)w[i]->N);
			} else if (p0 < p1) {
				for (int m0 = 0; m0 < M[i]; m0 += MC)
					gemm_panels(y[i], x[i], w[i], m0, HI3_MIN(MC, M[i] - m0), p0, p1, wide);
			}
			base += np;
		}
	}
}
