/*
 * gemm.c -- batch-invariant matrix multiply for the CPU backend, over the
 * weights where they lie (gemm.h): W (N, K) row major, F32, BF16 or F16,
 * usually a tensor of the mapped checkpoint. Nothing is packed or copied.
 *
 * Both operands run along k, so an output element is a dot product of two
 * contiguous rows: a BR x BN register tile keeps one 8-lane accumulator
 * per element, loads BR rows of x and BN rows of W eight k at a time, and
 * combines the lanes in the fixed tree of gemm.h at the end.
 *
 * Loops, outside in: rows of x in blocks of MC; the thread's column tiles
 * in chunks whose W rows (about WCHUNK bytes of f32) stay in L2 while every
 * row tile of the block uses them; k in slices of KC, so that a row tile
 * of x (BR x KC floats) stays in L1 while every column tile of the chunk
 * uses it; row tiles; column tiles. A tile's lanes are carried from one k
 * slice to the next in a small buffer (storing and reloading them is
 * exact), and combined after the last. BF16 and F16 rows are widened in
 * registers for a few rows (decode), else a chunk's k slice is widened once
 * into an f32 buffer and reused by the block's row tiles.
 * Widening is exact, so the bits are the same every way.
 */
#include <math.h>
#include <string.h>
#include <omp.h>
#include "backend/gemm.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_X86 1
#endif

#define BR 4                      /* rows of x in a register tile */
#define BN 3                      /* rows of W (output columns) in a register tile */
#define MC 96                     /* rows of x per block */
#define KC 1024                   /* k per slice; a multiple of 8 */
#define WCHUNK ((size_t)128 << 10) /* bytes of f32 W (a chunk's k slice) reused across a block's rows */
#define WIDEN_ROWS (4 * BR)       /* narrow W: widened into a buffer for more rows than this, else in registers */

enum { WF32, WBF16, WF16 };       /* how a W row is read */

int hi3i_wmat_init(hi3_wmat *w, const void *data, hi3_dtype dt, int N, int K, hi3_error *err)
{
	memset(w, 0, sizeof(*w));
	if (dt != HI3_F32 && dt != HI3_BF16 && dt != HI3_F16)
		return hi3_error_set(err, HI3_ERR_INPUT, "cannot use dtype %s as a weight matrix (expected F32, BF16 "
		                     "or F16)", hi3_dtype_name(dt));
	w->data = data;
	w->dtype = dt;
	w->N = N;
	w->K = K;
	return 0;
}

static int wkind(hi3_dtype dt)
{
	return dt == HI3_BF16 ? WBF16 : dt == HI3_F16 ? WF16 : WF32;
}

static inline float w_elem(const void *w, int kind, size_t i)
{
	uint16_t h;
	float f;

	if (kind == WF32) {
		memcpy(&f, (const unsigned char *)w + 4 * i, 4);
		return f;
	}
	memcpy(&h, (const unsigned char *)w + 2 * i, 2);
	return kind == WBF16 ? hi3_bf16_to_f32(h) : hi3_f16_to_f32(h);
}

static inline float combine(const float *l)
{
	return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* One dot product in the order of gemm.h: x (K) . w (K), w of kind. */
static float dot_ref(const float *x, const void *w, int kind, int K)
{
	float l[8] = {0};
	int k = 0, K8 = K & ~7;

	for (; k < K8; k++)
		l[k & 7] = fmaf(x[k], w_elem(w, kind, (size_t)k), l[k & 7]);
	for (; k < K; k++)
		l[0] = fmaf(x[k], w_elem(w, kind, (size_t)k), l[0]);
	return combine(l);
}

void hi3i_gemm_ref(float *y, const float *x, const hi3_wmat *w, int M)
{
	const int kind = wkind(w->dtype);
	const size_t row = (size_t)w->K * hi3_dtype_size(w->dtype);

	for (int m = 0; m < M; m++)
		for (int n = 0; n < w->N; n++)
			y[(size_t)m * w->N + n] = dot_ref(x + (size_t)m * w->K,
			                                  (const unsigned char *)w->data + (size_t)n * row, kind, w->K);
}

/*
 * A tile's arguments: rows [0, mr) of x (row stride ldx, from k = 0), rows
 * [0, nr) of W (element (j, k) at w + j ldw + k - wk0: a whole row from
 * wk0 = 0, or a widened slice from wk0 = k0), k in [k0, k1); y (stride ldy)
 * is written when k1 = K, else the lanes go to part (mr nr x 8 floats),
 * which they are read from when k0 > 0.
 */
struct tile_args {
	const float *x;
	size_t ldx;
	const void *w;
	size_t ldw;
	int wk0, k0, k1, K;
	float *y;
	size_t ldy;
	float *part;
};

static void tile_portable(int mr, int nr, int kind, const struct tile_args *a)
{
	const int K8 = a->K & ~7, last = a->k1 == a->K;

	for (int i = 0; i < mr; i++)
		for (int j = 0; j < nr; j++) {
			const float *x = a->x + (size_t)i * a->ldx;
			float lanes[8] = {0}, *l = last ? lanes : a->part + (size_t)(i * nr + j) * 8;
			int k = a->k0;

			if (a->k0 > 0 && last)
				memcpy(l, a->part + (size_t)(i * nr + j) * 8, sizeof(lanes));
			else if (a->k0 == 0)
				memset(l, 0, sizeof(lanes));
			for (; k < HI3_MIN(a->k1, K8); k++)
				l[k & 7] = fmaf(x[k], w_elem(a->w, kind, (size_t)j * a->ldw + (size_t)(k - a->wk0)), l[k & 7]);
			for (; k < a->k1; k++)
				l[0] = fmaf(x[k], w_elem(a->w, kind, (size_t)j * a->ldw + (size_t)(k - a->wk0)), l[0]);
			if (last)
				a->y[(size_t)i * a->ldy + j] = combine(l);
		}
}

#ifdef HAVE_X86
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline __m256 load_w8(const void *w, int kind,
                                                                                    size_t i)
{
	if (kind == WBF16) {
		__m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
		return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
	}
	if (kind == WF16)
		return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
	return _mm256_loadu_ps((const float *)w + i);
}

/* r[e] = combine() of v[e], e < n, eight (then four) at a time: horizontal
 * adds pair neighbouring lanes within each half, so after two rounds each
 * half holds (l0 + l1) + (l2 + l3) or (l4 + l5) + (l6 + l7) of four
 * accumulators, and the last add joins the halves. */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void combine_n(const __m256 *v, const int n,
                                                                                    float *r)
{
	const __m256 z = _mm256_setzero_ps();
	int g = 0;

	for (; g + 8 <= n; g += 8) {
		__m256 s1 = _mm256_hadd_ps(_mm256_hadd_ps(v[g], v[g + 1]), _mm256_hadd_ps(v[g + 2], v[g + 3]));
		__m256 s2 = _mm256_hadd_ps(_mm256_hadd_ps(v[g + 4], v[g + 5]), _mm256_hadd_ps(v[g + 6], v[g + 7]));
		_mm256_storeu_ps(r + g, _mm256_add_ps(_mm256_permute2f128_ps(s1, s2, 0x20),
		                                      _mm256_permute2f128_ps(s1, s2, 0x31)));
	}
	for (; g < n; g += 4) {
		__m256 s1 = _mm256_hadd_ps(_mm256_hadd_ps(v[g], g + 1 < n ? v[g + 1] : z),
		                           _mm256_hadd_ps(g + 2 < n ? v[g + 2] : z, g + 3 < n ? v[g + 3] : z));
		float o[4];

		_mm_storeu_ps(o, _mm_add_ps(_mm256_castps256_ps128(s1), _mm256_extractf128_ps(s1, 1)));
		for (int e = 0; e < 4 && g + e < n; e++)
			r[g + e] = o[e];
	}
}

/* The register tile, specialised for each (mr, nr, kind) by the switch
 * below; the same bits as tile_portable. */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void tile(const int mr, const int nr,
                                                                               const int kind,
                                                                               const struct tile_args *a)
{
	__m256 acc[BR][BN];
	const float *x = a->x;
	const void *w = a->w;
	const size_t ldx = a->ldx, ldw = a->ldw;
	const int K = a->K, K8 = K & ~7, k1 = HI3_MIN(a->k1, K8);

#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
#pragma GCC unroll 3
		for (int j = 0; j < nr; j++)
			acc[i][j] = a->k0 ? _mm256_loadu_ps(a->part + (size_t)(i * nr + j) * 8) : _mm256_setzero_ps();
	for (int k = a->k0; k < k1; k += 8) {
		const size_t kw = (size_t)(k - a->wk0);
		__m256 wv[BN];
#pragma GCC unroll 3
		for (int j = 0; j < nr; j++)
			wv[j] = load_w8(w, kind, (size_t)j * ldw + kw);
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++) {
			__m256 xv = _mm256_loadu_ps(x + (size_t)i * ldx + k);
#pragma GCC unroll 3
			for (int j = 0; j < nr; j++)
				acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
		}
	}
	if (a->k1 < K) {
		for (int i = 0; i < mr; i++)
			for (int j = 0; j < nr; j++)
				_mm256_storeu_ps(a->part + (size_t)(i * nr + j) * 8, acc[i][j]);
		return;
	}
	if (K8 < K) {
		/* the tail into lane 0, then the tree, element by element */
		for (int i = 0; i < mr; i++)
			for (int j = 0; j < nr; j++) {
				float l[8];
				_mm256_storeu_ps(l, acc[i][j]);
				for (int k = K8; k < K; k++)
					l[0] = fmaf(x[(size_t)i * ldx + k], w_elem(w, kind, (size_t)j * ldw + (size_t)(k - a->wk0)),
					            l[0]);
				a->y[(size_t)i * a->ldy + j] = combine(l);
			}
		return;
	}
	{
		__m256 v[BR * BN];
		float r[BR * BN];
		int n = 0;
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++)
#pragma GCC unroll 3
			for (int j = 0; j < nr; j++)
				v[n++] = acc[i][j];
		combine_n(v, mr * nr, r);
		n = 0;
		for (int i = 0; i < mr; i++)
			for (int j = 0; j < nr; j++)
				a->y[(size_t)i * a->ldy + j] = r[n++];
	}
}

#define TILE_KINDS(mr, nr)                                         \
	case (mr) * 4 + (nr):                                      \
		if (kind == WF32)                                  \
			tile(mr, nr, WF32, a);                     \
		else if (kind == WBF16)                            \
			tile(mr, nr, WBF16, a);                    \
		else                                               \
			tile(mr, nr, WF16, a);                     \
		break;

__attribute__((target("avx2,fma,f16c"))) static void tile_avx2(int mr, int nr, int kind, const struct tile_args *a)
{
	switch (mr * 4 + nr) {
		TILE_KINDS(1, 1) TILE_KINDS(1, 2) TILE_KINDS(1, 3)
		TILE_KINDS(2, 1) TILE_KINDS(2, 2) TILE_KINDS(2, 3)
		TILE_KINDS(3, 1) TILE_KINDS(3, 2) TILE_KINDS(3, 3)
		TILE_KINDS(4, 1) TILE_KINDS(4, 2) TILE_KINDS(4, 3)
	}
}

/* dst (rows, n) = src rows [k0, k0 + n) of stride ld, widened to f32. */
__attribute__((target("avx2,fma,f16c"))) static void widen_avx2(float *dst, const void *src, int kind, int rows,
                                                                size_t ld, int k0, int n)
{
	for (int r = 0; r < rows; r++) {
		size_t o = (size_t)r * ld + (size_t)k0;
		float *d = dst + (size_t)r * (size_t)n;
		int i = 0;

		for (; i + 8 <= n; i += 8)
			_mm256_storeu_ps(d + i, load_w8(src, kind, o + (size_t)i));
		for (; i < n; i++)
			d[i] = w_elem(src, kind, o + (size_t)i);
	}
}

static int simd_off;               /* hi3i_gemm_portable */

static int have_avx2(void)
{
	static int v = -1;

	if (v < 0) {
		__builtin_cpu_init();
		unsigned a, b, c, d;
		/* F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports
		 * does not know "f16c" (an error in the fuzzing build) */
		int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
		v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
	}
	return v && !simd_off;
}
#endif

void hi3i_gemm_portable(int on)
{
#ifdef HAVE_X86
	simd_off = on;
#else
	(void)on;
#endif
}

/* k per slice and column tiles per chunk, for width K. */
static int slice_k(int K)
{
	return K > KC ? KC : K;
}

static int chunk_tiles(int K)
{
	return (int)HI3_MAX(1, WCHUNK / (sizeof(float) * BN * (size_t)slice_k(HI3_MAX(K, 1))));
}

/* A thread's buffers for w: carried lanes (when K has several slices) and a
 * widened chunk slice (narrow weights, more than WIDEN_ROWS rows). */
struct scratch {
	float *part;              /* (MC / BR, chunk tiles, BR BN, 8) */
	float *wide;              /* (chunk rows, KC) */
};

static int scratch_get(struct scratch *s, const hi3_wmat *w, int M)
{
	const size_t qc = (size_t)chunk_tiles(w->K), kc = (size_t)slice_k(w->K);

	s->part = s->wide = NULL;
	if (w->K > KC && !(s->part = malloc(sizeof(float) * ((MC + BR - 1) / BR) * qc * BR * BN * 8)))
		return -1;
	if (w->dtype != HI3_F32 && M > WIDEN_ROWS && !(s->wide = malloc(sizeof(float) * qc * BN * kc))) {
		free(s->part);
		return -1;
	}
	return 0;
}

static void scratch_release(struct scratch *s)
{
	free(s->part);
	free(s->wide);
}

/* Column tiles [q0, q1) of y = x W^T for rows [m0, m0 + mc), in the loops
 * of the top of the file. */
static void gemm_tiles(float *y, const float *x, const hi3_wmat *w, int m0, int mc, int q0, int q1,
                       const struct scratch *s)
{
	const int N = w->N, K = w->K, kind0 = wkind(w->dtype), qc = chunk_tiles(K), kc = slice_k(K);
	const size_t es = hi3_dtype_size(w->dtype);
#ifdef HAVE_X86
	const int simd = have_avx2();
#else
	const int simd = 0;
#endif

	for (int c0 = q0; c0 < q1; c0 += qc) {
		const int c1 = HI3_MIN(q1, c0 + qc), n0 = c0 * BN, nc = HI3_MIN(N, c1 * BN) - n0;
		const unsigned char *wc = (const unsigned char *)w->data + (size_t)n0 * (size_t)K * es;

		for (int k0 = 0; k0 < K; k0 += kc) {
			const int k1 = HI3_MIN(K, k0 + kc);
			struct tile_args a = {.ldx = (size_t)K, .w = wc, .ldw = (size_t)K, .wk0 = 0, .k0 = k0, .k1 = k1,
			                      .K = K, .ldy = (size_t)N};
			int kind = kind0;
			size_t wes = es;

#ifdef HAVE_X86
			if (simd && kind != WF32 && s->wide) {
				widen_avx2(s->wide, wc, kind, nc, (size_t)K, k0, k1 - k0);
				a.w = s->wide;
				a.ldw = (size_t)(k1 - k0);
				a.wk0 = k0;
				kind = WF32;
				wes = sizeof(float);
			}
#endif
			for (int mi = 0; mi < mc; mi += BR) {
				const int mr = HI3_MIN(BR, mc - mi);

				a.x = x + (size_t)(m0 + mi) * K;
				for (int j0 = 0; j0 < nc; j0 += BN) {
					const int nr = HI3_MIN(BN, nc - j0);
					struct tile_args t = a;

					t.w = (const unsigned char *)a.w + (size_t)j0 * a.ldw * wes;
					t.y = y + (size_t)(m0 + mi) * N + n0 + j0;
					t.part = s->part ? s->part + ((size_t)(mi / BR) * (size_t)qc + (size_t)(j0 / BN)) * BR * BN * 8
					                 : NULL;
#ifdef HAVE_X86
					if (simd)
						tile_avx2(mr, nr, kind, &t);
					else
#endif
						tile_portable(mr, nr, kind, &t);
				}
			}
		}
	}
}

static int n_tiles(const hi3_wmat *w)
{
	return (w->N + BN - 1) / BN;
}

/* Rows [0, M) against column tiles [q0, q1) of w, on one thread. */
static void gemm_range(float *y, const float *x, const hi3_wmat *w, int M, int q0, int q1, int *failed)
{
	struct scratch s;

	if (q0 >= q1)
		return;
	if (scratch_get(&s, w, M) != 0) {
		*failed = 1;
		return;
	}
	for (int m0 = 0; m0 < M; m0 += MC)
		gemm_tiles(y, x, w, m0, HI3_MIN(MC, M - m0), q0, q1, &s);
	scratch_release(&s);
}

int hi3i_gemm(float *y, const float *x, const hi3_wmat *w, int M)
{
	const int N = w->N, K = w->K, nq = n_tiles(w);
	int failed = 0;

	if (M <= 0 || N <= 0)
		return 0;
	if (K == 0) {
		memset(y, 0, sizeof(float) * (size_t)M * (size_t)N);
		return 0;
	}
#pragma omp parallel if (nq > 1 && (double)M * N * K >= 1 << 18) reduction(| : failed)
	{
		int nt = omp_get_num_threads(), id = omp_get_thread_num();

		gemm_range(y, x, w, M, (int)((int64_t)nq * id / nt), (int)((int64_t)nq * (id + 1) / nt), &failed);
	}
	return failed ? -1 : 0;
}

int hi3i_gemm_group(int n, float *const *y, const float *const *x, const hi3_wmat *const *w, const int *M)
{
	int64_t total = 0;
	int failed = 0;

	for (int i = 0; i < n; i++)
		if (M[i] > 0 && w[i]->N > 0)
			total += n_tiles(w[i]);
	if (!total)
		return 0;
	/* one parallel region over the union of every job's column tiles */
#pragma omp parallel if (total > 1) reduction(| : failed)
	{
		int nt = omp_get_num_threads(), id = omp_get_thread_num();
		int64_t q0 = total * id / nt, q1 = total * (id + 1) / nt, base = 0;

		for (int i = 0; i < n && base < q1; i++) {
			int nq, p0, p1;
			if (M[i] <= 0 || w[i]->N <= 0)
				continue;
			nq = n_tiles(w[i]);
			p0 = (int)HI3_MAX(q0 - base, 0);
			p1 = (int)HI3_MIN(q1 - base, nq);
			if (w[i]->K == 0) {
				if (p0 < p1 && p0 == 0)
					memset(y[i], 0, sizeof(float) * (size_t)M[i] * (size_t)w[i]->N);
			} else {
				gemm_range(y[i], x[i], w[i], M[i], p0, p1, &failed);
			}
			base += nq;
		}
	}
	return failed ? -1 : 0;
}
