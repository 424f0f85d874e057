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

/* The sum over chunk j (positions [j CH, (j+1) CH) of P) of group g of
 * image b: (x - mean)^2 when sq, else x; elements in (position, channel)
 * order into eight lanes. */
static float gn_chunk(const float *x, int64_t P, int C, int cg, int g, int64_t j, int sq, float mean)
{
	const int64_t p0 = j * HI3_GN_CHUNK, p1 = HI3_MIN(P, p0 + HI3_GN_CHUNK);
	float l[8] = {0};
	unsigned i = 0;

	for (int64_t p = p0; p < p1; p++) {
		const float *v = x + p * C + (int64_t)g * cg;
		for (int c = 0; c < cg; c++, i++) {
			float e = sq ? (v[c] - mean) * (v[c] - mean) : v[c];
			l[i & 7] += e;
		}
	}
	return lane_tree(l);
}

int hi3i_cpu_groupnorm_stats(hi3_backend *be, float *mean, float *rstd, const float *x, int B, int64_t P, int C,
                             int G, float eps)
{
	const int cg = G > 0 ? C / G : 1;
	const int64_t nch = (P + HI3_GN_CHUNK - 1) / HI3_GN_CHUNK, jobs = (int64_t)B * G * nch;
	const float cnt = (float)((double)P * cg);
	float *part = malloc(sizeof(float) * (size_t)(jobs ? jobs : 1));

	HI3_ASSERT(G > 0 && C % G == 0);
	if (!part) {
		hi3i_backend_fail(be, "cpu groupnorm: out of memory for the sums of %lld chunks", (long long)jobs);
		return -1;
	}
	for (int pass = 0; pass < 2; pass++) {
#pragma omp parallel for schedule(static) if (jobs > 1 && PAR((size_t)B * (size_t)P * (size_t)C))
		for (int64_t q = 0; q < jobs; q++) {
			const int64_t bg = q / nch, j = q % nch;
			const int bi = (int)(bg / G), g = (int)(bg % G);
			part[q] = gn_chunk(x + (int64_t)bi * P * C, P, C, cg, g, j, pass, pass ? mean[bg] : 0.0f);
		}
		for (int64_t bg = 0; bg < (int64_t)B * G; bg++) {
			float s = 0.0f;
			for (int64_t j = 0; j < nch; j++)
				s += part[bg * nch + j];
			if (!pass)
				mean[bg] = s / cnt;
			else
				rstd[bg] = 1.0f / sqrtf(s / cnt + eps);
		}
	}
	free(part);
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

void hi3i_cpu_act(hi3_backend *be, float *y, const float *x, size_t n, int act)
{
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

/* Softmax of the scores s (n, M) in place, times scale first, keys with
 * mask[j] == 0 left out (weight 0); a row with no key left is all zeros. */
static void softmax_rows(float *s, int n, int M, float scale, const uint8_t *mask)
{
#pragma omp parallel for schedule(static) if (PAR((size_t)n * (size_t)M))
	for (int i = 0; i < n; i++) {
		float *r = s + (size_t)i * M, mx = -INFINITY, sum = 0.0f;
		for (int j = 0; j < M; j++) {
			r[j] = (!mask || mask[j]) ? r[j] * scale : -INFINITY;
			mx = r[j] > mx ? r[j] : mx;
		}
		if (mx == -INFINITY) {
			memset(r, 0, sizeof(float) * (size_t)M);
			continue;
		}
		for (int j = 0; j < M; j++) {
			r[j] = r[j] == -INFINITY ? 0.0f : expf(r[j] - mx);
			sum += r[j];
		}
		for (int j = 0; j < M; j++)
			r[j] /= sum;
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
