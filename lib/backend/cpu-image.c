/*
 * cpu-image.c -- the CPU backend's image ops (backend.h) but the conv
 * (cpu-conv.c): bias, norms over channel groups and rows, activations, the
 * channel shuffles of the VAE's DCAE up/down sampling, and dense
 * multi-head attention through two GEMMs.
 *
 * Batch invariance, as in cpu.c: every sum runs in an order fixed by the
 * image's own shape (never by B or the thread count), and threads split
 * only independent outputs. So an image gives the same bits alone or in
 * a batch.
 *
 * Layout (backend.h): images channels-last (B, T, H, W, C), P = T H W.
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>
#include "backend/cpu.h"
#include "backend/gemm.h"

/* ---------------------------------------------------------------- sums */

/* The sum of n floats, every stride-th from v, in eight lanes (element i
 * into lane i % 8) added in a fixed tree: the same bits for the same n,
 * wherever the floats come from. */
static inline float lane_tree(const float l[8])
{
	return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

static float sum_row(const float *v, int n)
{
	float l[8] = {0};
	int i = 0;

	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			l[j] += v[i + j];
	for (; i < n; i++)
		l[i & 7] += v[i];
	return lane_tree(l);
}

/* sum over i < n of (v[i] - mean)^2, the same lane order */
static float sumsq_row(const float *v, int n, float mean)
{
	float l[8] = {0};
	int i = 0;

	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++) {
			float e = v[i + j] - mean;
			l[j] += e * e;
		}
	for (; i < n; i++) {
		float e = v[i] - mean;
		l[i & 7] += e * e;
	}
	return lane_tree(l);
}

/* ---------------------------------------------------------------- bias */

void hi3i_cpu_bias_add(hi3_backend *be, float *x, const hi3_wt *b, int64_t M, int N)
{
	(void)be;
#pragma omp parallel for schedule(static) if (PAR((size_t)M * (size_t)N))
	for (int64_t m = 0; m < M; m++) {
		float *r = x + m * N;
		for (int j = 0; j < N; j++)
			r[j] += b->f32[j];
	}
}

/* ------------------------------------------------------------ norms */

/* The sums over chunk j (positions [j CH, (j+1) CH) of P) of every group
 * of an image x, (x - mean_g)^2 when sq, else x, in eight lanes each:
 * element i of a group's chunk, in (position, channel) order, into lane
 * i % 8, lane[((g nch) + j) 8 + i % 8]. The chunk is read once, position by
 * position, every group's lanes updated from the position's row: a
 * group's cg channels of the chunk's k-th position are its elements k cg
 * + c, lanes (k cg + c) % 8, each lane still in its elements' order. */
static void gn_chunk(float *lane, int64_t nch, const float *x, int64_t P, int C, int G, int64_t j, int sq,
                     const float *mean)
{
	const int cg = C / G;
	const int64_t p0 = j * HI3_GN_CHUNK, p1 = HI3_MIN(P, p0 + HI3_GN_CHUNK);

	for (int g = 0; g < G; g++)
		memset(lane + ((int64_t)g * nch + j) * 8, 0, sizeof(float) * 8);
	for (int64_t p = p0; p < p1; p++) {
		const float *v = x + p * C;
		const unsigned s = (unsigned)((p - p0) * cg) & 7u;   /* the lane of the position's first element */
		for (int g = 0; g < G; g++) {
			const float *vg = v + (int64_t)g * cg, m = sq ? mean[g] : 0.0f;
			float *a = lane + ((int64_t)g * nch + j) * 8;
			if (cg % 8 == 0) {
				for (int c = 0; c < cg; c += 8)
					for (int l = 0; l < 8; l++)
						a[l] += sq ? (vg[c + l] - m) * (vg[c + l] - m) : vg[c + l];
			} else if (cg == 4) {
				for (int l = 0; l < 4; l++)
					a[s + l] += sq ? (vg[l] - m) * (vg[l] - m) : vg[l];
			} else {
				for (int c = 0; c < cg; c++)
					a[(s + (unsigned)c) & 7u] += sq ? (vg[c] - m) * (vg[c] - m) : vg[c];
			}
		}
	}
}

int hi3i_cpu_groupnorm_stats(hi3_backend *be, float *mean, float *rstd, const float *x, int B, int64_t P, int C,
                             int G, float eps)
{
	const int cg = G > 0 ? C / G : 1;
	const int64_t nch = (P + HI3_GN_CHUNK - 1) / HI3_GN_CHUNK, jobs = (int64_t)B * nch;
	const float cnt = (float)((double)P * cg);
	float *lane = malloc(sizeof(float) * 8 * (size_t)(jobs ? jobs : 1) * (size_t)(G > 0 ? G : 1));

	HI3_ASSERT(G > 0 && C % G == 0);
	if (!lane) {
		hi3i_backend_fail(be, "cpu groupnorm: out of memory for the sums of %lld chunks", (long long)(jobs * G));
		return -1;
	}
	for (int pass = 0; pass < 2; pass++) {
#pragma omp parallel for schedule(static) if (jobs > 1 && PAR((size_t)B * (size_t)P * (size_t)C))
		for (int64_t q = 0; q < jobs; q++) {
			const int bi = (int)(q / nch);
			gn_chunk(lane + (int64_t)bi * G * nch * 8, nch, x + (int64_t)bi * P * C, P, C, G, q % nch, pass,
			         mean + (int64_t)bi * G);
		}
		/* per group, its chunks' lane trees added in order */
		for (int64_t bg = 0; bg < (int64_t)B * G; bg++) {
			float s = 0.0f;
			for (int64_t j = 0; j < nch; j++)
				s += lane_tree(lane + (bg * nch + j) * 8);
			if (!pass)
				mean[bg] = s / cnt;
			else
				rstd[bg] = 1.0f / sqrtf(s / cnt + eps);
		}
	}
	free(lane);
	return 0;
}

void hi3i_cpu_groupnorm(hi3_backend *be, float *y, const float *x, const hi3_wt *w, const hi3_wt *b, int B,
                        int64_t P, int C, int G, float eps, int act)
{
	const int cg = G > 0 ? C / G : 1;
	float *mean = malloc(sizeof(float) * (size_t)B * (size_t)G * 2 + 1), *rstd;

	if (!mean) {
		hi3i_backend_fail(be, "cpu groupnorm: out of memory for the statistics of %d groups", B * G);
		return;
	}
	rstd = mean + (size_t)B * G;
	if (hi3i_cpu_groupnorm_stats(be, mean, rstd, x, B, P, C, G, eps) == 0) {
#pragma omp parallel for schedule(static) if (PAR((size_t)B * (size_t)P * (size_t)C))
		for (int64_t q = 0; q < (int64_t)B * P; q++) {
			const int64_t bi = q / P;
			const float *xr = x + q * C;
			float *yr = y + q * C;
			for (int c = 0; c < C; c++) {
				const int64_t bg = bi * G + c / cg;
				yr[c] = hi3i_cpu_gn1(xr[c], mean[bg], rstd[bg], w->f32[c], b->f32[c], act);
			}
		}
	}
	free(mean);
}

void hi3i_cpu_layernorm(hi3_backend *be, float *y, const float *x, const hi3_wt *w, const hi3_wt *b, int M, int n,
                        float eps)
{
	(void)be;
#pragma omp parallel for schedule(static) if (PAR((size_t)M * (size_t)n))
	for (int m = 0; m < M; m++) {
		const float *xr = x + (size_t)m * n;
		float *yr = y + (size_t)m * n;
		const float mean = sum_row(xr, n) / (float)n;
		const float r = 1.0f / sqrtf(sumsq_row(xr, n, mean) / (float)n + eps);
		for (int i = 0; i < n; i++)
			yr[i] = (xr[i] - mean) * r * w->f32[i] + b->f32[i];
	}
}

/* ------------------------------------------------------- elementwise */

#if defined(__x86_64__)
static void gelu_tanh_avx2(float *y, const float *x, size_t n8);
#endif

void hi3i_cpu_act(hi3_backend *be, float *y, const float *x, size_t n, int act)
{
#if defined(__x86_64__)
	if (act == HI3_ACT_GELU_TANH && hi3i_gemm_level() >= 1) {
		/* 8 at a time, the same bits as hi3i_cpu_act1 (the test compares) */
		const size_t nb = n / 1024;
		(void)be;
#pragma omp parallel for schedule(static) if (PAR(n))
		for (size_t b = 0; b < nb; b++)
			gelu_tanh_avx2(y + b * 1024, x + b * 1024, 1024);
		for (size_t i = nb * 1024; i < n; i++)
			y[i] = hi3i_cpu_act1(x[i], act);
		return;
	}
#endif
	(void)be;
#pragma omp parallel for schedule(static) if (PAR(n))
	for (size_t i = 0; i < n; i++)
		y[i] = hi3i_cpu_act1(x[i], act);
}

void hi3i_cpu_scale_shift(hi3_backend *be, float *h, const float *ss, int B, int64_t P, int C)
{
	(void)be;
#pragma omp parallel for schedule(static) if (PAR((size_t)B * (size_t)P * (size_t)C))
	for (int64_t q = 0; q < (int64_t)B * P; q++) {
		const float *sc = ss + q / P * 2 * C, *sh = sc + C;
		float *r = h + q * C;
		for (int c = 0; c < C; c++)
			r[c] = r[c] * (1.0f + sc[c]) + sh[c];
	}
}

void hi3i_cpu_add_repeat(hi3_backend *be, float *x, const float *z, int64_t P, int C, int r)
{
	const int Cz = C / r;

	(void)be;
#pragma omp parallel for schedule(static) if (PAR((size_t)P * (size_t)C))
	for (int64_t p = 0; p < P; p++)
		for (int c = 0; c < C; c++)
			x[p * C + c] += z[p * Cz + c / r];
}

void hi3i_cpu_add_group_mean(hi3_backend *be, float *x, const float *z, int64_t P, int C, int r)
{
	(void)be;
#pragma omp parallel for schedule(static) if (PAR((size_t)P * (size_t)C * (size_t)r))
	for (int64_t p = 0; p < P; p++)
		for (int c = 0; c < C; c++) {
			const float *g = z + (p * C + c) * r;
			float s = 0.0f;
			for (int i = 0; i < r; i++)
				s += g[i];
			x[p * C + c] += s / (float)r;
		}
}

/* Element (b, t, y, x, c) of the low-resolution side (T, H, W, rt 4 C)
 * and its place in the high-resolution side (T rt, 2H, 2W, C): one map
 * read both ways. */
static void shuffle(float *hi, float *lo, int B, int T, int H, int W, int C, int rt, int to_hi)
{
	const int Cl = rt * 4 * C;
	const int64_t n = (int64_t)B * T * H * W;

#pragma omp parallel for schedule(static) if (PAR((size_t)n * (size_t)Cl))
	for (int64_t q = 0; q < n; q++) {
		const int xo = (int)(q % W), yo = (int)(q / W % H), t = (int)(q / ((int64_t)W * H) % T);
		const int64_t b = q / ((int64_t)W * H * T);
		float *lr = lo + q * Cl;
		for (int i = 0; i < rt; i++)
			for (int j = 0; j < 2; j++)
				for (int k = 0; k < 2; k++) {
					float *hr = hi + (((b * T * rt + (int64_t)t * rt + i) * 2 * H + 2 * yo + j) * 2 * W +
					                  2 * xo + k) * C;
					float *lc = lr + ((i * 2 + j) * 2 + k) * C;
					if (to_hi)
						memcpy(hr, lc, sizeof(float) * (size_t)C);
					else
						memcpy(lc, hr, sizeof(float) * (size_t)C);
				}
	}
}

void hi3i_cpu_depth_to_space(hi3_backend *be, float *y, const float *x, int B, int T, int H, int W, int C, int rt)
{
	(void)be;
	shuffle(y, (float *)x, B, T, H, W, C, rt, 1);
}

void hi3i_cpu_space_to_depth(hi3_backend *be, float *y, const float *x, int B, int T, int H, int W, int C, int rt)
{
	(void)be;
	shuffle((float *)x, y, B, T / rt, H / 2, W / 2, C, rt, 0);
}

/* ----------------------------------------------------------- attention */

/* Scores of a block of queries are (QB, M): QB so that they stay near
 * 16M floats. */
static int query_block(int M)
{
	int qb = (int)(((int64_t)1 << 24) / HI3_MAX(M, 1));

	return HI3_MAX(16, HI3_MIN(qb, M));
}

/*
 * The softmax of a row of scores, the same bits from the AVX2 and the
 * portable code: scale and mask (a left-out key is -inf), the maximum
 * (exact in any order), e = hi3i_exp_det(s - max) (cpu.h), their sum in 16
 * lanes (key j into lane j % 16, then lane i + lane i + h for h = 8, 4, 2,
 * 1), e / sum.
 */
static inline float lanes16_sum(float *l)
{
	for (int h = 8; h >= 1; h /= 2)
		for (int i = 0; i < h; i++)
			l[i] = l[i] + l[i + h];
	return l[0];
}

/* row r (M) in place; the key mask, or NULL: all keys. 0: no key left. */
static int softmax_portable(float *r, int M, float scale, const uint8_t *mask)
{
	float mx = -INFINITY, l[16] = {0};

	for (int j = 0; j < M; j++) {
		r[j] = (!mask || mask[j]) ? r[j] * scale : -INFINITY;
		mx = r[j] > mx ? r[j] : mx;
	}
	if (mx == -INFINITY)
		return 0;
	for (int j = 0; j < M; j++) {
		r[j] = hi3i_exp_det(r[j] - mx);
		l[j % 16] += r[j];
	}
	{
		const float sum = lanes16_sum(l);
		for (int j = 0; j < M; j++)
			r[j] /= sum;
	}
	return 1;
}

#if defined(__x86_64__)
#include <immintrin.h>

/* hi3i_exp_det of 8 floats: the scalar's operations one for one */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256 exp_det8(__m256 x)
{
	const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(HI3_EXP_LOG2E)),
	                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-HI3_EXP_LN2_HI), x), p = _mm256_set1_ps(hi3i_exp_c[0]);
	__m256i e;

	r = _mm256_fmadd_ps(n, _mm256_set1_ps(-HI3_EXP_LN2_LO), r);
	for (int i = 1; i < 6; i++)
		p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(hi3i_exp_c[i]));
	p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
	e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
	p = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
	/* below the minimum: 0 (NaN stays NaN) */
	return _mm256_blendv_ps(p, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(HI3_EXP_MIN), _CMP_LT_OQ));
}

/* hi3i_tanh_det of 8 floats */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256 tanh_det8(__m256 u)
{
	const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
	const __m256 a = _mm256_min_ps(_mm256_andnot_ps(sign, u), _mm256_set1_ps(HI3_TANH_MAX));
	const __m256 e = exp_det8(_mm256_mul_ps(_mm256_set1_ps(2.0f), a));
	const __m256 t = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));

	/* copysign, and NaN stays NaN */
	return _mm256_blendv_ps(_mm256_or_ps(t, _mm256_and_ps(sign, u)), u, _mm256_cmp_ps(u, u, _CMP_UNORD_Q));
}

/* y (n8, a multiple of 8) = GELU_TANH(x), hi3i_cpu_act1's operations one for one */
__attribute__((target("avx2,fma"))) static void gelu_tanh_avx2(float *y, const float *x, size_t n8)
{
	for (size_t i = 0; i < n8; i += 8) {
		const __m256 v = _mm256_loadu_ps(x + i);
		const __m256 c = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), v), v), v);
		const __m256 t = tanh_det8(_mm256_mul_ps(_mm256_set1_ps(HI3_GELU_K), _mm256_add_ps(v, c)));
		_mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), v), _mm256_add_ps(_mm256_set1_ps(1.0f), t)));
	}
}

/* The key mask as 0 / -1 words for 8 keys from j (all kept without one). */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256 keep8(const uint8_t *mask, int j)
{
	if (!mask)
		return _mm256_castsi256_ps(_mm256_set1_epi32(-1));
	return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(mask + j))),
	                                              _mm256_setzero_si256()));
}

__attribute__((target("avx2,fma"))) static int softmax_avx2(float *r, int M, float scale, const uint8_t *mask)
{
	const __m256 ninf = _mm256_set1_ps(-INFINITY), vs = _mm256_set1_ps(scale);
	__m256 vm = ninf, l0 = _mm256_setzero_ps(), l1 = l0;
	float mx, l[16];
	int j = 0;

	for (; j + 8 <= M; j += 8) {
		const __m256 v = _mm256_blendv_ps(ninf, _mm256_mul_ps(_mm256_loadu_ps(r + j), vs), keep8(mask, j));
		_mm256_storeu_ps(r + j, v);
		vm = _mm256_max_ps(vm, v);
	}
	_mm256_storeu_ps(l, vm);
	mx = -INFINITY;
	for (int i = 0; i < 8; i++)
		mx = l[i] > mx ? l[i] : mx;
	for (; j < M; j++) {
		r[j] = (!mask || mask[j]) ? r[j] * scale : -INFINITY;
		mx = r[j] > mx ? r[j] : mx;
	}
	if (mx == -INFINITY)
		return 0;
	for (j = 0; j + 16 <= M; j += 16) {
		const __m256 e0 = exp_det8(_mm256_sub_ps(_mm256_loadu_ps(r + j), _mm256_set1_ps(mx)));
		const __m256 e1 = exp_det8(_mm256_sub_ps(_mm256_loadu_ps(r + j + 8), _mm256_set1_ps(mx)));
		_mm256_storeu_ps(r + j, e0);
		_mm256_storeu_ps(r + j + 8, e1);
		l0 = _mm256_add_ps(l0, e0);
		l1 = _mm256_add_ps(l1, e1);
	}
	_mm256_storeu_ps(l, l0);
	_mm256_storeu_ps(l + 8, l1);
	for (; j < M; j++) {
		r[j] = hi3i_exp_det(r[j] - mx);
		l[j % 16] += r[j];
	}
	{
		const float sum = lanes16_sum(l);
		const __m256 vsum = _mm256_set1_ps(sum);
		for (j = 0; j + 8 <= M; j += 8)
			_mm256_storeu_ps(r + j, _mm256_div_ps(_mm256_loadu_ps(r + j), vsum));
		for (; j < M; j++)
			r[j] /= sum;
	}
	return 1;
}
#endif

/* Softmax of the scores s (n, M) in place, times scale first, keys with
 * mask[j] == 0 left out (weight 0); a row with no key left is all zeros. */
static void softmax_rows(float *s, int n, int M, float scale, const uint8_t *mask)
{
#if defined(__x86_64__)
	const int simd = hi3i_gemm_level() >= 1;
#else
	const int simd = 0;
#endif

#pragma omp parallel for schedule(static) if (PAR((size_t)n * (size_t)M))
	for (int i = 0; i < n; i++) {
		float *r = s + (size_t)i * M;
		int any;
#if defined(__x86_64__)
		if (simd)
			any = softmax_avx2(r, M, scale, mask);
		else
#endif
			any = softmax_portable(r, M, scale, mask);
		if (!any)
			memset(r, 0, sizeof(float) * (size_t)M);
	}
}

void hi3i_cpu_attention_dense(hi3_backend *be, float *out, const float *q, const float *k, const float *v,
                              const uint8_t *key_mask, int B, int M, int n_h, int d)
{
	const int64_t C = (int64_t)n_h * d;
	const int qb = query_block(M), inv = be->batch_invariant;
	const float scale = (float)(1.0 / sqrt((double)d));
	const size_t nk = inv ? (size_t)M * d : 0;
	float *s = hi3i_aligned_alloc(sizeof(float) * (size_t)qb * M, NULL);
	float *pk = inv ? hi3i_aligned_alloc(sizeof(float) * 2 * nk, NULL) : NULL;
	float *qh = inv ? hi3i_aligned_alloc(sizeof(float) * (size_t)qb * d * 2, NULL) : NULL;

	if (M <= 0 || B <= 0)
		goto out;
	if (!s || (inv && (!pk || !qh))) {
		hi3i_backend_fail(be, "cpu attention_dense: out of memory for the scores of %d x %d keys", qb, M);
		goto out;
	}
	for (int b = 0; b < B; b++)
		for (int h = 0; h < n_h; h++) {
			const float *qb0 = q + (int64_t)b * M * C + (int64_t)h * d;
			const float *kb0 = k + (int64_t)b * M * C + (int64_t)h * d;
			const float *vb0 = v + (int64_t)b * M * C + (int64_t)h * d;
			float *ob0 = out + (int64_t)b * M * C + (int64_t)h * d;
			const uint8_t *mask = key_mask ? key_mask + (int64_t)b * M : NULL;
			hi3_wmat kp, vp;

			if (inv) {      /* the head's K (M keys, d) and V^T (d, M keys), contiguous */
				float *kt = pk, *vt = pk + nk;
				for (int j = 0; j < M; j++) {
					memcpy(kt + (size_t)j * d, kb0 + (int64_t)j * C, sizeof(float) * (size_t)d);
					for (int c = 0; c < d; c++)
						vt[(size_t)c * M + j] = vb0[(int64_t)j * C + c];
				}
				hi3i_wmat_init(&kp, kt, HI3_F32, M, d, NULL);
				hi3i_wmat_init(&vp, vt, HI3_F32, d, M, NULL);
			}
			for (int i0 = 0; i0 < M; i0 += qb) {
				const int n = HI3_MIN(qb, M - i0);
				if (inv) {
					float *oh = qh + (size_t)qb * d;
					for (int i = 0; i < n; i++)
						memcpy(qh + (size_t)i * d, qb0 + (int64_t)(i0 + i) * C, sizeof(float) * (size_t)d);
					if (hi3i_gemm(s, qh, &kp, n) != 0) {
						hi3i_backend_fail(be, "cpu attention_dense: out of memory for GEMM scratch");
						goto out;
					}
					softmax_rows(s, n, M, scale, mask);
					if (hi3i_gemm(oh, s, &vp, n) != 0) {
						hi3i_backend_fail(be, "cpu attention_dense: out of memory for GEMM scratch");
						goto out;
					}
					for (int i = 0; i < n; i++)
						memcpy(ob0 + (int64_t)(i0 + i) * C, oh + (size_t)i * d, sizeof(float) * (size_t)d);
				} else {
					cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, M, d, 1.0f, qb0 + i0 * C, (int)C,
					            kb0, (int)C, 0.0f, s, M);
					softmax_rows(s, n, M, scale, mask);
					cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, M, 1.0f, s, M, vb0, (int)C,
					            0.0f, ob0 + i0 * C, (int)C);
				}
			}
		}
out:
	free(s);
	free(pk);
	free(qh);
}
