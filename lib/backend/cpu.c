/*
 * cpu.c -- the CPU backend: f32 activations, OpenMP threads, the
 * batch-invariant GEMM of gemm.c or, with batch invariance off, OpenBLAS.
 *
 * Weights are used where they lie: a matrix is multiplied from its tensor
 * in the memory-mapped checkpoint, as stored (F32, BF16 or F16), and an
 * embedding row is read from it when a token needs it, so a stage touches
 * only the weights it uses (a routed expert when a token is routed to it).
 * Only norm vectors are converted, to f32, at open (a few KiB a layer).
 * OpenBLAS takes F32 rows in place; BF16 and F16 rows are widened for it a
 * block of rows at a time into a scratch buffer (cpu_sgemm).
 *
 * Batch invariance holds op by op: every reduction (dot products, norms,
 * softmax sums) runs in a fixed order within one token, one row or one
 * (token, head); threads only split independent outputs.
 */
#include <cblas.h>
#include <math.h>
#include <stdatomic.h>
#include <omp.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include "backend/cpu.h"
#include "backend/pool.h"
#include "backend/quant-x86.h"

/* OpenBLAS with BF16/F16 weights: rows widened per block, about this many bytes of f32. */
#define SGEMM_BLOCK_BYTES ((size_t)1 << 20)

struct cpu {
	float *wide;              /* cpu_sgemm's widened rows */
	size_t wide_cap;          /* floats */
	float *scratch;           /* hi3i_cpu_scratch */
	size_t scratch_cap;       /* floats */
	struct rope_memo {        /* cpu_rope_qk's angles of the last one-row call */
		int32_t pos[2];
		int half;             /* 0: none yet */
		float theta[256], cs[256], sn[256];
	} rope;
};

float *hi3i_cpu_scratch(hi3_backend *be, size_t n)
{
	struct cpu *c = be->ctx;
	const size_t huge = (size_t)2 << 20;
	void *p = NULL;

	if (n <= c->scratch_cap)
		return c->scratch;
	free(c->scratch);
	c->scratch = NULL;
	c->scratch_cap = 0;
	/* 2 MiB pages where the kernel offers them: a conv's tile reads
	 * dozens of channel planes at once, one small page each otherwise */
	if (posix_memalign(&p, huge, (n * sizeof(float) + huge - 1) / huge * huge) != 0)
		return NULL;
#ifdef MADV_HUGEPAGE
	madvise(p, (n * sizeof(float) + huge - 1) / huge * huge, MADV_HUGEPAGE);
#endif
	c->scratch = p;
	c->scratch_cap = n;
	return c->scratch;
}

static void *cpu_alloc(hi3_backend *be, size_t n)
{
	void *p = NULL;

	(void)be;
	if (posix_memalign(&p, 64, n ? n : 64) != 0)
		return NULL;
	return p;
}

static void cpu_free(hi3_backend *be, void *p)
{
	(void)be;
	free(p);
}

static int cpu_copy(hi3_backend *be, void *dst, const void *src, size_t n)
{
	(void)be;
	if (n)
		memcpy(dst, src, n);
	return 0;
}

static size_t cpu_mem_free(hi3_backend *be)
{
	(void)be;
	return (size_t)sysconf(_SC_AVPHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
}

/* The first read of weight bytes: tell the model (checks, accounting). */
static void first_use(hi3_backend *be, const hi3_wt *w, const void *data, size_t bytes)
{
	if (be->first_use)
		be->first_use(be, w->t, data, bytes);
}

void hi3i_cpu_mark_used(hi3_backend *be, const hi3_wt *w)
{
	if (w->used)
		return;
	((hi3_wt *)w)->used = 1;             /* the op's weight is const to it, not to its owner */
	first_use(be, w, w->t->data, w->t->nbytes);
}

static hi3_wt *cpu_weight(hi3_backend *be, const hi3_tensor *t, int kind, hi3_error *err)
{
	hi3_wt *w = hi3i_calloc(1, sizeof(*w), err);
	size_t n = (size_t)hi3_tensor_numel(t);

	if (!w)
		return NULL;
	w->kind = kind;
	w->t = t;
	w->N = (int)t->shape[0];
	w->K = t->ndim > 1 ? (int)t->shape[1] : 1;
	if (kind == HI3_WT_MATRIX && w->N > 0)    /* a conv weight [Cout, C, k...]: (Cout, C k...) */
		w->K = (int)(hi3_tensor_numel(t) / w->N);
	if (kind == HI3_WT_ROWS) {
		if (!(w->seen = hi3i_calloc((size_t)w->N / 8 + 1, 1, err)))
			goto fail;
		return w;
	}
	if (kind == HI3_WT_VECTOR) {
		if (!(w->f32 = hi3i_aligned_alloc(n * sizeof(float), err)))
			goto fail;
		hi3i_cpu_mark_used(be, w);
		hi3_to_f32(w->f32, t->data, t->dtype, n);
		return w;
	}
	if (hi3i_wmat_init(&w->mat, t->data, t->dtype, w->N, w->K, err) != 0)
		goto fail;
	return w;
fail:
	free(w->seen);
	free(w);
	return NULL;
}

static hi3_wt *cpu_qweight(hi3_backend *be, const hi3_tensor *t, const hi3_qweight *q, hi3_error *err)
{
	hi3_wt *w = hi3i_calloc(1, sizeof(*w), err);

	(void)be;
	if (!w)
		return NULL;
	w->kind = HI3_WT_MATRIX;
	w->t = t;
	w->qw = *q;
	w->N = q->N;
	w->K = q->K;
	hi3i_wmat_init_q(&w->mat, &w->qw);
	return w;
}

static void cpu_weight_free(hi3_backend *be, hi3_wt *w)
{
	(void)be;
	if (!w)
		return;
	free(w->f32);
	free(w->seen);
	free(w);
}

static int cpu_kv_attach(hi3_backend *be, hi3_kvcache *kv, int h0, int nh, hi3_error *err)
{
	(void)be;
	(void)kv;
	(void)h0;
	(void)nh;
	(void)err;
	return 0;
}

static void cpu_kv_detach(hi3_backend *be, hi3_kvcache *kv)
{
	(void)be;
	(void)kv;
}

static void cpu_kv_layer(hi3_backend *be, hi3_kvcache *kv, int layer, int h0, int nh, hi3_kv_dst *dst)
{
	/* the host cache itself: the heads' first one, rows of all n_kv heads */
	const size_t off = (size_t)h0 * (size_t)kv->C * (size_t)kv->d * hi3_dtype_size(kv->dtype);

	(void)be;
	HI3_ASSERT(h0 >= 0 && nh >= 1 && h0 + nh <= kv->n_kv);
	dst->k = (char *)kv->k[layer] + off;
	dst->v = (char *)kv->v[layer] + off;
	dst->dtype = kv->dtype;
	dst->C = kv->C;
	dst->row_stride = (int64_t)kv->n_kv * kv->C * kv->d;
}

static int cpu_kv_sync_host(hi3_backend *be, hi3_kvcache *kv, hi3_error *err)
{
	(void)be;
	(void)kv;
	(void)err;
	return 0;
}

/* OpenBLAS: y (M, N) = x W^T. F32 rows aligned for it are used in place;
 * others are widened a block of rows at a time (the blocks' products are
 * columns of y, so no sum is split). */
static void cpu_sgemm(hi3_backend *be, float *y, const float *x, const hi3_wt *w, int M)
{
	struct cpu *c = be->ctx;
	const int N = w->N, K = w->K;
	const hi3_wmat *wm = &w->mat;
	const size_t es = hi3_dtype_size(wm->dtype);
	int nb;

	if (!wm->q && wm->dtype == HI3_F32 && (uintptr_t)wm->data % sizeof(float) == 0) {
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, wm->data, K, 0.0f, y, N);
		return;
	}
	nb = (int)HI3_MAX(1, HI3_MIN((size_t)N, SGEMM_BLOCK_BYTES / (sizeof(float) * (size_t)HI3_MAX(K, 1))));
	if (c->wide_cap < (size_t)nb * (size_t)K) {
		free(c->wide);
		c->wide_cap = 0;
		if (!(c->wide = hi3i_aligned_alloc(sizeof(float) * (size_t)nb * (size_t)K, NULL))) {
			hi3i_backend_fail(be, "cpu matmul: out of memory for %d widened weight rows of %d", nb, K);
			return;
		}
		c->wide_cap = (size_t)nb * (size_t)K;
	}
	for (int n0 = 0; n0 < N; n0 += nb) {
		const int nr = HI3_MIN(nb, N - n0);
		const unsigned char *src = wm->q ? NULL : (const unsigned char *)wm->data + (size_t)n0 * (size_t)K * es;
#pragma omp parallel for schedule(static) if (PAR((size_t)nr * K))
		for (int r = 0; r < nr; r++)
			if (wm->q)
				hi3i_qweight_rows(wm->q, c->wide + (size_t)r * K, (size_t)K, n0 + r, 1, 0, K);
			else
				hi3_to_f32(c->wide + (size_t)r * K, src + (size_t)r * K * es, wm->dtype, (size_t)K);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, nr, K, 1.0f, x, K, c->wide, K, 0.0f, y + n0, N);
	}
}

static void cpu_matmul(hi3_backend *be, float *y, const float *x, const hi3_wt *w, int M)
{
	if (M <= 0)
		return;
	hi3i_cpu_mark_used(be, w);
	if (!be->batch_invariant)
		cpu_sgemm(be, y, x, w, M);
	else if (hi3i_gemm(y, x, &w->mat, M) != 0)
		hi3i_backend_fail(be, "cpu matmul: out of memory for the GEMM's scratch");
}

static void cpu_matmul_group(hi3_backend *be, int n, float *const *y, const float *const *x,
                             const hi3_wt *const *w, const int *M)
{
	const hi3_wmat *wm[64];

	if (n > 64 || !be->batch_invariant) {
		for (int i = 0; i < n; i++)
			cpu_matmul(be, y[i], x[i], w[i], M[i]);
		return;
	}
	for (int i = 0; i < n; i++) {
		if (M[i] > 0)
			hi3i_cpu_mark_used(be, w[i]);
		wm[i] = &w[i]->mat;
	}
	if (hi3i_gemm_group(n, y, x, wm, M) != 0)
		hi3i_backend_fail(be, "cpu matmul: out of memory for the GEMM's scratch");
}

static void cpu_prefetch(hi3_backend *be, int n, const hi3_wt *const *w, const int *M)
{
	const hi3_wmat *wm[64];

	if (n > 64 || !be->batch_invariant)
		return;
	for (int i = 0; i < n; i++)
		wm[i] = &w[i]->mat;
	hi3i_gemm_prefetch(n, wm, M);
}

static void cpu_embed(hi3_backend *be, float *x, const int64_t *ids, const hi3_wt *wte, int M)
{
	size_t es = hi3_dtype_size(wte->t->dtype), H = (size_t)wte->K;
	const unsigned char *rows = wte->t->data;

	for (int m = 0; m < M; m++) {
		uint8_t *bit = wte->seen + ids[m] / 8, mask = (uint8_t)(1u << (ids[m] % 8));
		if (!(*bit & mask)) {
			*bit |= mask;
			first_use(be, wte, rows + (size_t)ids[m] * H * es, H * es);
		}
	}
	HI3_PAR_FOR((size_t)M * H, m, M, hi3_to_f32(x + (size_t)m * H, rows + (size_t)ids[m] * H * es, wte->t->dtype, H););
}

/* y = x * rsqrt(mean(x^2) + eps) * w over n, like HunyuanRMSNorm in fp32. */
static inline void rms_row(float *y, const float *x, const float *w, int n, float eps)
{
	float ss = 0.0f, r;

	for (int i = 0; i < n; i++)
		ss += x[i] * x[i];
	r = 1.0f / sqrtf(ss / (float)n + eps);
#pragma omp simd
	for (int i = 0; i < n; i++)
		y[i] = w[i] * (x[i] * r);
}

static void cpu_rmsnorm(hi3_backend *be, float *y, const float *x, const hi3_wt *w, int M, int n, float eps)
{
	(void)be;
	HI3_PAR_FOR((size_t)M * n, m, M, rms_row(y + (size_t)m * n, x + (size_t)m * n, w->f32, n, eps););
}

static void cpu_zero(hi3_backend *be, float *x, size_t n)
{
	(void)be;
	memset(x, 0, n * sizeof(float));
}

static void cpu_copy2d(hi3_backend *be, float *dst, size_t ldd, const float *src, size_t lds, int rows, int cols)
{
	(void)be;
	for (int i = 0; i < rows; i++)
		memmove(dst + (size_t)i * ldd, src + (size_t)i * lds, sizeof(float) * (size_t)cols);
}

static void cpu_add(hi3_backend *be, float *x, const float *y, size_t n)
{
	(void)be;
	if (PAR(n)) {
#pragma omp parallel for simd schedule(static)
		for (size_t i = 0; i < n; i++)
			x[i] += y[i];
	} else {        /* no parallel region at all: see HI3_PAR_FOR */
#pragma omp simd
		for (size_t i = 0; i < n; i++)
			x[i] += y[i];
	}
}

static void rope_head(float *h, const float *cs, const float *sn, int d)
{
	int half = d / 2;

#pragma omp simd
	for (int i = 0; i < half; i++) {
		float a = h[i], b = h[i + half];
		h[i] = a * cs[i] - b * sn[i];
		h[i + half] = b * cs[i] + a * sn[i];
	}
}

/* The cosines and sines of a row's angles: at position pos (t, and y or x
 * in alternate entries) times theta, i < half. */
static void rope_angles(float *cs, float *sn, const int32_t *pos, const float *theta, int half)
{
	for (int i = 0; i < half; i++) {
		float ang = (float)pos[i & 1] * theta[i];
		cs[i] = cosf(ang);
		sn[i] = sinf(ang);
	}
}

/* Row m of cpu_rope_qk: RoPE on its q and k heads, then their norms. */
static void rope_qk_row(float *qkv, int m, const int32_t *pos, const float *theta, const struct rope_memo *memo,
                        const hi3_wt *qn, const hi3_wt *kn, const struct hi3_dims *dm)
{
	const int d = dm->d, g = dm->n_h / dm->n_kv, W = (dm->n_h + 2 * dm->n_kv) * d;
	float buf_cs[512], buf_sn[512];
	const float *cs = buf_cs, *sn = buf_sn;
	float *row = qkv + (size_t)m * W;

	if (memo) {
		cs = memo->cs;
		sn = memo->sn;
	} else {
		rope_angles(buf_cs, buf_sn, pos + 2 * m, theta, d / 2);
	}
	for (int j = 0; j < dm->n_kv; j++) {
		float *blk = row + (size_t)j * (g + 2) * d;
		for (int h = 0; h < g + 1; h++) {        /* g query heads, then the key head */
			float *hp = blk + (size_t)h * d;
			rope_head(hp, cs, sn, d);
			if (qn)
				rms_row(hp, hp, h < g ? qn->f32 : kn->f32, d, dm->eps);
		}
	}
}

static void cpu_rope_qk(hi3_backend *be, float *qkv, const int32_t *pos, const float *theta, const hi3_wt *qn,
                        const hi3_wt *kn, const struct hi3_dims *dm, int M)
{
	const int d = dm->d, W = (dm->n_h + 2 * dm->n_kv) * d;
	struct rope_memo *memo = &((struct cpu *)be->ctx)->rope;
	/* a decode step of one row calls this once per layer at one position:
	 * its 2 x d/2 cosf and sinf calls are most of the op, so the last
	 * row's angles are kept (the same values: the same calls) */
	const int memo_row = M == 1 && d / 2 <= 256;

	if (memo_row &&
	    !(memo->half == d / 2 && memo->pos[0] == pos[0] && memo->pos[1] == pos[1] &&
	      memcmp(memo->theta, theta, sizeof(float) * (size_t)(d / 2)) == 0)) {
		rope_angles(memo->cs, memo->sn, pos, theta, d / 2);
		memcpy(memo->theta, theta, sizeof(float) * (size_t)(d / 2));
		memo->pos[0] = pos[0];
		memo->pos[1] = pos[1];
		memo->half = d / 2;
	}
	HI3_PAR_FOR((size_t)M * W, m, M, rope_qk_row(qkv, m, pos, theta, memo_row ? memo : NULL, qn, kn, dm););
}

static inline void store_vec(void *dst, hi3_dtype dt, size_t off, const float *src, int d)
{
	if (dt == HI3_BF16) {
		uint16_t *p = (uint16_t *)dst + off;
		for (int i = 0; i < d; i++)
			p[i] = hi3_f32_to_bf16(src[i]);
	} else {
		memcpy((float *)dst + off, src, sizeof(float) * (size_t)d);
	}
}

/* kv head j of cpu_kv_store, for every token in order: of duplicate slots
 * the last token's stays. */
static void kv_store_head(const hi3_kv_dst *dst, const float *qkv, const int32_t *row, const int64_t *slot,
                          const struct hi3_dims *dm, int M, int j, size_t rs)
{
	const int d = dm->d, g = dm->n_h / dm->n_kv, W = (dm->n_h + 2 * dm->n_kv) * d;

	for (int m = 0; m < M; m++) {
		if (slot[m] < 0)
			continue;
		const float *blk = qkv + (size_t)m * W + (size_t)j * (g + 2) * d;
		size_t off = (size_t)row[m] * rs + ((size_t)j * (size_t)dst->C + (size_t)slot[m]) * d;
		store_vec(dst->k, dst->dtype, off, blk + (size_t)g * d, d);
		store_vec(dst->v, dst->dtype, off, blk + (size_t)(g + 1) * d, d);
	}
}

static void cpu_kv_store(hi3_backend *be, const hi3_kv_dst *dst, const float *qkv, const int32_t *row,
                         const int64_t *slot, const struct hi3_dims *dm, int M)
{
	const int d = dm->d, W = (dm->n_h + 2 * dm->n_kv) * d;
	const size_t rs = dst->row_stride ? (size_t)dst->row_stride : (size_t)dm->n_kv * (size_t)dst->C * (size_t)d;

	(void)be;
	/* parallel over kv heads, each head's tokens in order on one thread */
	HI3_PAR_FOR((size_t)M * W, j, dm->n_kv, kv_store_head(dst, qkv, row, slot, dm, M, j, rs););
}

/* The key or value vector at off: in place for f32, widened into buf for bf16. */
static inline const float *key_at(const hi3_kv_src *s, int64_t off, float *buf, int d)
{
	if (s->dtype == HI3_BF16) {
		const uint16_t *p = (const uint16_t *)s->base + off;
		for (int i = 0; i < d; i++)
			buf[i] = hi3_bf16_to_f32(p[i]);
		return buf;
	}
	return (const float *)s->base + off;
}

/* q . k over d, as eight lane sums combined in a fixed tree: the same
 * bits from the AVX2 and the portable version, for any batch. */
static float dot_portable(const float *a, const float *b, int d)
{
	float l[8] = {0};
	int i = 0;

	for (; i + 8 <= d; i += 8)
		for (int j = 0; j < 8; j++)
			l[j] = fmaf(a[i + j], b[i + j], l[j]);
	for (; i < d; i++)
		l[0] = fmaf(a[i], b[i], l[0]);
	return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2,fma"))) static float dot_avx2(const float *a, const float *b, int d)
{
	__m256 acc = _mm256_setzero_ps();
	float l[8];
	int i = 0;

	for (; i + 8 <= d; i += 8)
		acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
	_mm256_storeu_ps(l, acc);
	for (; i < d; i++)
		l[0] = fmaf(a[i], b[i], l[0]);
	return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

static int cpu_has_avx2(void)
{
	static int v = -1;

	if (v < 0) {
		__builtin_cpu_init();
		v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
	}
	return v;
}
#define dot(a, b, d) (cpu_has_avx2() ? dot_avx2(a, b, d) : dot_portable(a, b, d))
#else
#define dot(a, b, d) dot_portable(a, b, d)
#endif

/* Scores of keys [j0, j1) for one query: sc[j] = dot(q, k_j) * scale, each
 * dot in the canonical lane order above, so a key scores the same bits in
 * any range, batch or tile. pf: whether the query is the first of its item
 * to read these keys (the vector version then prefetches them ahead; the
 * item's other queries find them in cache). */
static void scores_portable(const float *q, const hi3_kv_src *ks, int64_t base, int j0, int j1, int d, float scale,
                            float *sc, float *kbuf, int pf)
{
	(void)pf;
	for (int j = j0; j < j1; j++)
		sc[j] = dot_portable(q, key_at(ks, base + j * ks->slot_stride, kbuf, d), d) * scale;
}

#if defined(__x86_64__)
/* Eight elements of a cache at element off, as f32 (bf16 widened, exactly). */
__attribute__((target("avx2"))) static inline __m256 kv_load8(const void *base, int bf, int64_t off)
{
	if (bf)
		return _mm256_castsi256_ps(
			_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + off))),
			                  16));
	return _mm256_loadu_ps((const float *)base + off);
}

/* The first two rounds of the 8 x 8 transpose below, within each 128-bit
 * lane of vectors of W bits (256 or 512): u0 takes element 0 of the lane
 * of a[0] .. a[3], u1 element 1, u2 element 2, u3 element 3; u4 .. u7 the
 * same of a[4] .. a[7]. */
#define LANES_4X4(W, a, u0, u1, u2, u3, u4, u5, u6, u7)                                     \
	do {                                                                               \
		const __m##W t0 = _mm##W##_unpacklo_ps(a[0], a[1]), t1 = _mm##W##_unpackhi_ps(a[0], a[1]); \
		const __m##W t2 = _mm##W##_unpacklo_ps(a[2], a[3]), t3 = _mm##W##_unpackhi_ps(a[2], a[3]); \
		const __m##W t4 = _mm##W##_unpacklo_ps(a[4], a[5]), t5 = _mm##W##_unpackhi_ps(a[4], a[5]); \
		const __m##W t6 = _mm##W##_unpacklo_ps(a[6], a[7]), t7 = _mm##W##_unpackhi_ps(a[6], a[7]); \
		u0 = _mm##W##_shuffle_ps(t0, t2, 0x44);                                     \
		u1 = _mm##W##_shuffle_ps(t0, t2, 0xEE);                                     \
		u2 = _mm##W##_shuffle_ps(t1, t3, 0x44);                                     \
		u3 = _mm##W##_shuffle_ps(t1, t3, 0xEE);                                     \
		u4 = _mm##W##_shuffle_ps(t4, t6, 0x44);                                     \
		u5 = _mm##W##_shuffle_ps(t4, t6, 0xEE);                                     \
		u6 = _mm##W##_shuffle_ps(t5, t7, 0x44);                                     \
		u7 = _mm##W##_shuffle_ps(t5, t7, 0xEE);                                     \
	} while (0)

/* Eight keys' lane accumulators a[0..8) reduced each in the canonical
 * tree of dot_avx2, the eight sums in the lanes of one vector (key r in
 * lane r): an 8 x 8 transpose, then the tree's adds across vectors. */
__attribute__((target("avx2"))) static inline __m256 lane_sums8(const __m256 *a)
{
	__m256 u0, u1, u2, u3, u4, u5, u6, u7;
	LANES_4X4(256, a, u0, u1, u2, u3, u4, u5, u6, u7);
	/* L[i] holds lane i of the eight keys */
	__m256 L0 = _mm256_permute2f128_ps(u0, u4, 0x20), L4 = _mm256_permute2f128_ps(u0, u4, 0x31);
	__m256 L1 = _mm256_permute2f128_ps(u1, u5, 0x20), L5 = _mm256_permute2f128_ps(u1, u5, 0x31);
	__m256 L2 = _mm256_permute2f128_ps(u2, u6, 0x20), L6 = _mm256_permute2f128_ps(u2, u6, 0x31);
	__m256 L3 = _mm256_permute2f128_ps(u3, u7, 0x20), L7 = _mm256_permute2f128_ps(u3, u7, 0x31);
	return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(L0, L4), _mm256_add_ps(L2, L6)),
	                     _mm256_add_ps(_mm256_add_ps(L1, L5), _mm256_add_ps(L3, L7)));
}

/* Eight keys at a time: eight lane accumulators, then lane_sums8 so that
 * the canonical reduction runs across keys in vector lanes. F32 or BF16
 * keys (widened as they load: the same bits as key_at's). */
__attribute__((target("avx2,fma"))) static void scores_avx2(const float *q, const hi3_kv_src *ks, int64_t base,
                                                            int j0, int j1, int d, float scale, float *sc,
                                                            float *kbuf, int pf)
{
	const int bf = ks->dtype == HI3_BF16;
	const size_t es = bf ? 2 : 4;
	const int64_t st = ks->slot_stride;
	int j = j0;

	if (d % 8 == 0) {
		const __m256 vs = _mm256_set1_ps(scale);
		for (; j + 8 <= j1; j += 8) {
			__m256 a[8];
			const int64_t k0 = base + j * st;
			const char *kp = (const char *)ks->base + (size_t)k0 * es;
			/* the keys two blocks on, a line at a time: rows a slot
			 * stride apart are short strided streams, and a decode
			 * step's cache comes cold (its layer was read a step ago);
			 * only for the first query to read them: on an AMD EPYC
			 * (Zen 3) the others' prefetches, of lines already in L1,
			 * cost a sixth of a decode step's attention */
			for (int r = 16; pf && r < 24 && j + r < j1; r++)
				for (size_t i = 0; i < (size_t)d * es; i += 64)
					_mm_prefetch(kp + (size_t)(r * st) * es + i, _MM_HINT_T0);
			for (int r = 0; r < 8; r++)
				a[r] = _mm256_setzero_ps();
			for (int i = 0; i < d; i += 8) {
				__m256 qv = _mm256_loadu_ps(q + i);
#pragma GCC unroll 8
				for (int r = 0; r < 8; r++)
					a[r] = _mm256_fmadd_ps(qv, kv_load8(ks->base, bf, k0 + r * st + i), a[r]);
			}
			_mm256_storeu_ps(sc + j, _mm256_mul_ps(lane_sums8(a), vs));
		}
	}
	for (; j < j1; j++)
		sc[j] = dot_avx2(q, key_at(ks, base + j * st, kbuf, d), d) * scale;
}
#define scores(...) (cpu_has_avx2() ? scores_avx2(__VA_ARGS__) : scores_portable(__VA_ARGS__))
#else
#define scores(...) scores_portable(__VA_ARGS__)
#endif

static float max_portable(const float *sc, int n)
{
	float mx = -INFINITY;

	for (int j = 0; j < n; j++)
		if (sc[j] > mx)
			mx = sc[j];
	return mx;
}

/* acc (d) += sum over keys j in [j0, j1) with p[j] != 0 of p[j] * v_j, in
 * key order, one fused multiply-add per element and key: consecutive ranges
 * continue one sum, with the same bits as one call over their union. pf as
 * for scores. */
static void pv_portable(float *acc, const float *p, const hi3_kv_src *vs, int64_t base, int j0, int j1, int d,
                        float *vbuf, int pf)
{
	(void)pf;
	for (int j = j0; j < j1; j++) {
		const float *v;
		if (p[j] == 0.0f)
			continue;
		v = key_at(vs, base + j * vs->slot_stride, vbuf, d);
		for (int i = 0; i < d; i++)
			acc[i] = fmaf(p[j], v[i], acc[i]);
	}
}

#if defined(__x86_64__)
/* The same, 64 elements at a time with their eight accumulators in
 * registers (each element's sum over the keys is independent of the
 * others, so the split changes no bit); F32 or BF16 values, as scores. */
__attribute__((target("avx2,fma"))) static void pv_avx2(float *acc, const float *p, const hi3_kv_src *vs,
                                                        int64_t base, int j0, int j1, int d, float *vbuf,
                                                        int pf)
{
	const int bf = vs->dtype == HI3_BF16;
	const size_t es = bf ? 2 : 4;
	const int64_t st = vs->slot_stride;
	int c = 0;

	if (d % 8) {
		pv_portable(acc, p, vs, base, j0, j1, d, vbuf, pf);
		return;
	}
	for (; c + 64 <= d; c += 64) {
		__m256 a0 = _mm256_loadu_ps(acc + c), a1 = _mm256_loadu_ps(acc + c + 8);
		__m256 a2 = _mm256_loadu_ps(acc + c + 16), a3 = _mm256_loadu_ps(acc + c + 24);
		__m256 a4 = _mm256_loadu_ps(acc + c + 32), a5 = _mm256_loadu_ps(acc + c + 40);
		__m256 a6 = _mm256_loadu_ps(acc + c + 48), a7 = _mm256_loadu_ps(acc + c + 56);
		for (int j = j0; j < j1; j++) {
			const int64_t v = base + j * st + c;
			__m256 pj;
			if (pf && j + 8 < j1)   /* as scores_avx2: the row 8 on */
				for (size_t i = 0; i < 64 * es; i += 64)
					_mm_prefetch((const char *)vs->base + (size_t)(v + 8 * st) * es + i, _MM_HINT_T0);
			if (p[j] == 0.0f)
				continue;
			pj = _mm256_set1_ps(p[j]);
			a0 = _mm256_fmadd_ps(pj, kv_load8(vs->base, bf, v), a0);
			a1 = _mm256_fmadd_ps(pj, kv_load8(vs->base, bf, v + 8), a1);
			a2 = _mm256_fmadd_ps(pj, kv_load8(vs->base, bf, v + 16), a2);
			a3 = _mm256_fmadd_ps(pj, kv_load8(vs->base, bf, v + 24), a3);
			a4 = _mm256_fmadd_ps(pj, kv_load8(vs->base, bf, v + 32), a4);
			a5 = _mm256_fmadd_ps(pj, kv_load8(vs->base, bf, v + 40), a5);
			a6 = _mm256_fmadd_ps(pj, kv_load8(vs->base, bf, v + 48), a6);
			a7 = _mm256_fmadd_ps(pj, kv_load8(vs->base, bf, v + 56), a7);
		}
		_mm256_storeu_ps(acc + c, a0);
		_mm256_storeu_ps(acc + c + 8, a1);
		_mm256_storeu_ps(acc + c + 16, a2);
		_mm256_storeu_ps(acc + c + 24, a3);
		_mm256_storeu_ps(acc + c + 32, a4);
		_mm256_storeu_ps(acc + c + 40, a5);
		_mm256_storeu_ps(acc + c + 48, a6);
		_mm256_storeu_ps(acc + c + 56, a7);
	}
	for (; c < d; c += 8) {
		__m256 a = _mm256_loadu_ps(acc + c);
		for (int j = j0; j < j1; j++)
			if (p[j] != 0.0f)
				a = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), kv_load8(vs->base, bf, base + j * st + c), a);
		_mm256_storeu_ps(acc + c, a);
	}
}

/*
 * Four queries that read the same keys (query heads of one kv head, one
 * token) in one pass, with AVX2: each key's elements are loaded once for
 * the four, not once a query, and held in registers while the four
 * multiply-add them. Every multiply-add is one of scores_avx2's or
 * pv_avx2's, in their order, so each score and each value sum has the
 * same bits; only which registers hold what changes.
 */

/* The lane accumulators of four queries (q[t]) and keys r0 .. r0 + n of
 * the eight from k0 (n = 2 or 3: 4 n accumulators) into lanes[t][r]. */
__attribute__((target("avx2,fma"), always_inline)) static inline void
scores_quad_keys(const float *const *q, const void *kb, int64_t k0, int64_t st, int d, const int n, const int bf,
                 __m256 (*lanes)[8], int r0)
{
	__m256 a[4][3];

#pragma GCC unroll 4
	for (int t = 0; t < 4; t++)
		_Pragma("GCC unroll 3") for (int u = 0; u < n; u++)
			a[t][u] = _mm256_setzero_ps();
	for (int i = 0; i < d; i += 8) {
		__m256 x[3];
		_Pragma("GCC unroll 3") for (int u = 0; u < n; u++)
			x[u] = kv_load8(kb, bf, k0 + (r0 + u) * st + i);
#pragma GCC unroll 4
		for (int t = 0; t < 4; t++) {
			const __m256 qv = _mm256_loadu_ps(q[t] + i);
			_Pragma("GCC unroll 3") for (int u = 0; u < n; u++)
				a[t][u] = _mm256_fmadd_ps(qv, x[u], a[t][u]);
		}
	}
#pragma GCC unroll 4
	for (int t = 0; t < 4; t++)
		_Pragma("GCC unroll 3") for (int u = 0; u < n; u++)
			lanes[t][r0 + u] = a[t][u];
}

/* scores() of queries q[0..4) over the same keys [j0, j1), into sc[0..4):
 * three keys a pass over d (twelve accumulators: four queries by three
 * keys), their lane accumulators set aside until eight keys have them,
 * then reduced as scores_avx2 reduces them. d % 8 == 0; bf: BF16 keys. */
__attribute__((target("avx2,fma"), always_inline)) static inline void
scores_quad_dt(const float *const *q, const hi3_kv_src *ks, int64_t base, int j0, int j1, int d, float scale,
               float *const *sc, float *kbuf, int pf, const int bf)
{
	const size_t es = bf ? 2 : 4;
	const int64_t st = ks->slot_stride;
	const __m256 vs = _mm256_set1_ps(scale);
	__m256 lanes[4][8];       /* [query][key of the eight]: its lane accumulator */
	int j = j0;

	for (; j + 8 <= j1; j += 8) {
		const int64_t k0 = base + j * st;
		const char *kp = (const char *)ks->base + (size_t)k0 * es;

		for (int r = 16; pf && r < 24 && j + r < j1; r++)   /* as scores_avx2 */
			for (size_t i = 0; i < (size_t)d * es; i += 64)
				_mm_prefetch(kp + (size_t)(r * st) * es + i, _MM_HINT_T0);
		scores_quad_keys(q, ks->base, k0, st, d, 3, bf, lanes, 0);
		scores_quad_keys(q, ks->base, k0, st, d, 3, bf, lanes, 3);
		scores_quad_keys(q, ks->base, k0, st, d, 2, bf, lanes, 6);
		for (int t = 0; t < 4; t++)
			_mm256_storeu_ps(sc[t] + j, _mm256_mul_ps(lane_sums8(lanes[t]), vs));
	}
	for (int t = 0; t < 4 && j < j1; t++)
		scores_avx2(q[t], ks, base, j, j1, d, scale, sc[t], kbuf, 0);
}

/* The same, its loop compiled once for each kind of cache. */
__attribute__((target("avx2,fma"))) static void scores_quad(const float *const *q, const hi3_kv_src *ks,
                                                            int64_t base, int j0, int j1, int d, float scale,
                                                            float *const *sc, float *kbuf, int pf)
{
	if (ks->dtype == HI3_BF16)
		scores_quad_dt(q, ks, base, j0, j1, d, scale, sc, kbuf, pf, 1);
	else
		scores_quad_dt(q, ks, base, j0, j1, d, scale, sc, kbuf, pf, 0);
}

/* Values [j0, j1) into the sums of four queries (weights p[t], sums acc[t]),
 * elements [c, c + 8 n) of each, n = 2 or 3 vectors: 4 n accumulators. */
__attribute__((target("avx2,fma"), always_inline)) static inline void
pv_quad_cols(float *const *acc, const float *const *p, const void *vb, int64_t base, int64_t st, int j0, int j1,
             int c, const int n, const int bf, size_t pfb)
{
	__m256 a[4][3];

#pragma GCC unroll 4
	for (int t = 0; t < 4; t++)
		_Pragma("GCC unroll 3") for (int u = 0; u < n; u++)
			a[t][u] = _mm256_loadu_ps(acc[t] + c + 8 * u);
	for (int j = j0; j < j1; j++) {
		const int64_t v = base + j * st + c;
		__m256 x[3];
		if (pfb && j + 8 < j1)   /* as pv_avx2: the row 8 on, pfb bytes of it */
			for (size_t i = 0; i < pfb; i += 64)
				_mm_prefetch((const char *)vb + (size_t)(v + 8 * st) * (bf ? 2 : 4) + i, _MM_HINT_T0);
		_Pragma("GCC unroll 3") for (int u = 0; u < n; u++)
			x[u] = kv_load8(vb, bf, v + 8 * u);
#pragma GCC unroll 4
		for (int t = 0; t < 4; t++) {
			const __m256 pj = _mm256_broadcast_ss(p[t] + j);
			_Pragma("GCC unroll 3") for (int u = 0; u < n; u++)
				a[t][u] = _mm256_fmadd_ps(pj, x[u], a[t][u]);
		}
	}
#pragma GCC unroll 4
	for (int t = 0; t < 4; t++)
		_Pragma("GCC unroll 3") for (int u = 0; u < n; u++)
			_mm256_storeu_ps(acc[t] + c + 8 * u, a[t][u]);
}

/* pv() of queries 0..4 (weights p[t], sums acc[t]) over the same values
 * [j0, j1), 24 elements a pass (twelve accumulators: four queries by three
 * vectors), 16 or 8 at the end; d % 8 == 0; bf: BF16 values. pv skips a
 * key whose weight is zero, so a range where any of the four has one goes
 * to pv_avx2 query by query. */
__attribute__((target("avx2,fma"), always_inline)) static inline void
pv_quad_dt(float *const *acc, const float *const *p, const hi3_kv_src *vs, int64_t base, int j0, int j1, int d,
           float *vbuf, int pf, const int bf)
{
	const size_t es = bf ? 2 : 4;
	const int64_t st = vs->slot_stride;
	const __m256 zero = _mm256_setzero_ps();
	int j = j0, c = 0;

	for (; j + 8 <= j1; j += 8) {
		const __m256 z = _mm256_or_ps(
			_mm256_or_ps(_mm256_cmp_ps(_mm256_loadu_ps(p[0] + j), zero, _CMP_EQ_OQ),
			             _mm256_cmp_ps(_mm256_loadu_ps(p[1] + j), zero, _CMP_EQ_OQ)),
			_mm256_or_ps(_mm256_cmp_ps(_mm256_loadu_ps(p[2] + j), zero, _CMP_EQ_OQ),
			             _mm256_cmp_ps(_mm256_loadu_ps(p[3] + j), zero, _CMP_EQ_OQ)));
		if (_mm256_movemask_ps(z))
			break;
	}
	for (; j < j1; j++)
		if (p[0][j] == 0.0f || p[1][j] == 0.0f || p[2][j] == 0.0f || p[3][j] == 0.0f) {
			for (int t = 0; t < 4; t++)
				pv_avx2(acc[t], p[t], vs, base, j0, j1, d, vbuf, pf && t == 0);
			return;
		}
	/* the first pass prefetches each row's d elements (its 24 the first) */
	for (; c + 24 <= d; c += 24)
		pv_quad_cols(acc, p, vs->base, base, st, j0, j1, c, 3, bf, pf && !c ? (size_t)d * es : 0);
	for (; c + 16 <= d; c += 16)
		pv_quad_cols(acc, p, vs->base, base, st, j0, j1, c, 2, bf, pf && !c ? (size_t)d * es : 0);
	for (; c < d; c += 8)
		pv_quad_cols(acc, p, vs->base, base, st, j0, j1, c, 1, bf, pf && !c ? (size_t)d * es : 0);
}

__attribute__((target("avx2,fma"))) static void pv_quad(float *const *acc, const float *const *p,
                                                        const hi3_kv_src *vs, int64_t base, int j0, int j1,
                                                        int d, float *vbuf, int pf)
{
	if (vs->dtype == HI3_BF16)
		pv_quad_dt(acc, p, vs, base, j0, j1, d, vbuf, pf, 1);
	else
		pv_quad_dt(acc, p, vs, base, j0, j1, d, vbuf, pf, 0);
}

/*
 * Two queries that read the same keys (query heads of one kv head, one
 * token) in one pass, with AVX-512: a zmm holds the eight lanes of both,
 * [query a | query b], and each key's eight elements are loaded once into
 * both halves. Every lane runs the multiply-adds of the AVX2 loops above
 * in their order, so each score and each value sum has the same bits; a
 * multiply-add does twice the work, and a key's elements are loaded once
 * for the two queries.
 */
#define T512 HI3I_T512
#define PAIR_DMAX 256             /* head dims the pair loops take (packed queries on the stack) */

/* kv_load8 into both halves of a zmm (quant-x86.h). */
#define kv_load8x2(base, bf, off, ctl) hi3i_load8x2((const char *)(base) + (size_t)(off) * ((bf) ? 2 : 4), bf, ctl)

static int cpu_has_avx512(void)
{
	return hi3i_gemm_level() >= 2;
}

/* scores() of queries qa and qb over the same keys [j0, j1), into sca and
 * scb; d % 8 == 0, d <= PAIR_DMAX. */
T512 static void scores_pair(const float *qa, const float *qb, const hi3_kv_src *ks, int64_t base, int j0, int j1,
                             int d, float scale, float *sca, float *scb, float *kbuf, int pf)
{
	const int bf = ks->dtype == HI3_BF16;
	const size_t es = bf ? 2 : 4;
	const int64_t st = ks->slot_stride;
	const __m512i ctl = _mm512_load_si512((const void *)hi3i_bf16_ctl);
	const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
	const __m512i hi = _mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
	const __m512 vs = _mm512_set1_ps(scale);
	__m512 qp[PAIR_DMAX / 8];
	int j = j0;

	for (int i = 0; i < d; i += 8)
		qp[i / 8] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(qa + i)), _mm256_loadu_ps(qb + i), 1);
	for (; j + 8 <= j1; j += 8) {
		__m512 a[8];
		const int64_t k0 = base + j * st;
		const char *kp = (const char *)ks->base + (size_t)k0 * es;

		for (int r = 16; pf && r < 24 && j + r < j1; r++)   /* as scores_avx2 */
			for (size_t i = 0; i < (size_t)d * es; i += 64)
				_mm_prefetch(kp + (size_t)(r * st) * es + i, _MM_HINT_T0);
		for (int r = 0; r < 8; r++)
			a[r] = _mm512_setzero_ps();
		for (int i = 0; i < d; i += 8)
#pragma GCC unroll 8
			for (int r = 0; r < 8; r++)
				a[r] = _mm512_fmadd_ps(qp[i / 8], kv_load8x2(ks->base, bf, k0 + r * st + i, ctl), a[r]);
		/* scores_avx2's transpose in each half: L[i] holds lane i of the
		 * eight keys, query a's in the low half, b's in the high */
		__m512 u0, u1, u2, u3, u4, u5, u6, u7;
		LANES_4X4(512, a, u0, u1, u2, u3, u4, u5, u6, u7);
		__m512 L0 = _mm512_permutex2var_ps(u0, lo, u4), L4 = _mm512_permutex2var_ps(u0, hi, u4);
		__m512 L1 = _mm512_permutex2var_ps(u1, lo, u5), L5 = _mm512_permutex2var_ps(u1, hi, u5);
		__m512 L2 = _mm512_permutex2var_ps(u2, lo, u6), L6 = _mm512_permutex2var_ps(u2, hi, u6);
		__m512 L3 = _mm512_permutex2var_ps(u3, lo, u7), L7 = _mm512_permutex2var_ps(u3, hi, u7);
		__m512 r = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(L0, L4), _mm512_add_ps(L2, L6)),
		                                       _mm512_add_ps(_mm512_add_ps(L1, L5), _mm512_add_ps(L3, L7))),
		                         vs);
		_mm256_storeu_ps(sca + j, _mm512_castps512_ps256(r));
		_mm256_storeu_ps(scb + j, _mm512_extractf32x8_ps(r, 1));
	}
	if (j < j1) {
		scores_avx2(qa, ks, base, j, j1, d, scale, sca, kbuf, 0);
		scores_avx2(qb, ks, base, j, j1, d, scale, scb, kbuf, 0);
	}
}

/* pv() of queries a and b (weights pa, pb) over the same values: acca
 * and accb; d % 8 == 0. A key with a zero weight leaves that query's
 * sum alone (masked), as pv skips it. */
T512 static void pv_pair(float *acca, float *accb, const float *pa, const float *pb, const hi3_kv_src *vs,
                         int64_t base, int j0, int j1, int d, int pf)
{
	const int bf = vs->dtype == HI3_BF16;
	const size_t es = bf ? 2 : 4;
	const int64_t st = vs->slot_stride;
	const __m512i ctl = _mm512_load_si512((const void *)hi3i_bf16_ctl);
	const __m512 zero = _mm512_setzero_ps();
	int c = 0;

#define PAIR_LOAD(t) _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(acca + c + 8 * (t))), \
                                        _mm256_loadu_ps(accb + c + 8 * (t)), 1)
#define PAIR_STORE(t, v)                                                              \
	do {                                                                          \
		_mm256_storeu_ps(acca + c + 8 * (t), _mm512_castps512_ps256(v));     \
		_mm256_storeu_ps(accb + c + 8 * (t), _mm512_extractf32x8_ps(v, 1));  \
	} while (0)
	for (; c + 64 <= d; c += 64) {
		__m512 a[8];
#pragma GCC unroll 8
		for (int t = 0; t < 8; t++)
			a[t] = PAIR_LOAD(t);
		for (int j = j0; j < j1; j++) {
			const int64_t v = base + j * st + c;
			if (pf && j + 8 < j1)   /* as pv_avx2 */
				for (size_t i = 0; i < 64 * es; i += 64)
					_mm_prefetch((const char *)vs->base + (size_t)(v + 8 * st) * es + i, _MM_HINT_T0);
			const __m512 pj = _mm512_insertf32x8(_mm512_set1_ps(pa[j]), _mm256_set1_ps(pb[j]), 1);
			const __mmask16 m = _mm512_cmp_ps_mask(pj, zero, _CMP_NEQ_UQ);   /* p != 0, as pv's test */
			if (!m)
				continue;
#pragma GCC unroll 8
			for (int t = 0; t < 8; t++)
				a[t] = _mm512_mask3_fmadd_ps(pj, kv_load8x2(vs->base, bf, v + 8 * t, ctl), a[t], m);
		}
#pragma GCC unroll 8
		for (int t = 0; t < 8; t++)
			PAIR_STORE(t, a[t]);
	}
	for (; c < d; c += 8) {
		__m512 a = PAIR_LOAD(0);
		for (int j = j0; j < j1; j++) {
			const __m512 pj = _mm512_insertf32x8(_mm512_set1_ps(pa[j]), _mm256_set1_ps(pb[j]), 1);
			const __mmask16 m = _mm512_cmp_ps_mask(pj, zero, _CMP_NEQ_UQ);
			if (m)
				a = _mm512_mask3_fmadd_ps(pj, kv_load8x2(vs->base, bf, base + j * st + c, ctl), a, m);
		}
		PAIR_STORE(0, a);
	}
#undef PAIR_LOAD
#undef PAIR_STORE
}

/* The largest of sc[0..n) above -inf, as the scalar loop "if (sc[j] > mx)
 * mx = sc[j]" finds it (a NaN never wins). */
__attribute__((target("avx2"))) static float max_avx2(const float *sc, int n)
{
	__m256 m = _mm256_set1_ps(-INFINITY);
	float l[8], mx = -INFINITY;
	int j = 0;

	for (; j + 8 <= n; j += 8)
		m = _mm256_max_ps(_mm256_loadu_ps(sc + j), m);   /* x > m ? x : m, per lane */
	_mm256_storeu_ps(l, m);
	for (int i = 0; i < 8; i++)
		if (l[i] > mx)
			mx = l[i];
	for (; j < n; j++)
		if (sc[j] > mx)
			mx = sc[j];
	return mx;
}
/* The softmax weights in place of the scores: p[j] = expf(p[j] - mx), 0 for
 * a key not admitted (-inf). exp_avx2 reproduces the C library's expf bit
 * for bit on |x| < 88, eight at a time: this is the algorithm of glibc's
 * expf (2.28 on, from Arm's optimized-routines) as its FMA build runs it, in
 * double: k = round(x 32/ln2), r = x 32/ln2 - k, 2^(k/32) from a table of
 * 2^(i/32) and the exponent bits, times a cubic in r, rounded to float.
 * Other inputs (NaN, |x| >= 88 but -inf) go to expf itself. It is used
 * only when it gives expf's bits on a probe of 2^16 inputs
 * (exp_vector_ok); otherwise every weight is expf's. */
static const uint64_t exp_tab[32] = {
	0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
	0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
	0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
	0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
	0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
	0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
	0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
	0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};

/* The algorithm's constants: 32/ln2, the shift that rounds to an integer
 * in the low bits, and the cubic's coefficients (exp_avx2, exp8_512). */
#define EXP_INV 0x1.71547652b82fep+5
#define EXP_SHIFT 0x1.8p+52
#define EXP_C0 0x1.c6af84b912394p-20
#define EXP_C1 0x1.ebfce50fac4f3p-13
#define EXP_C2 0x1.62e42ff0c52d6p-6

static void exp_portable(float *p, int n, float mx)
{
	for (int j = 0; j < n; j++)
		p[j] = p[j] == -INFINITY ? 0.0f : expf(p[j] - mx);
}

__attribute__((target("avx2,fma"))) static __m128 exp4_avx2(__m128 x)
{
	const __m256d inv = _mm256_set1_pd(EXP_INV), shift = _mm256_set1_pd(EXP_SHIFT);
	const __m256d c0 = _mm256_set1_pd(EXP_C0), c1 = _mm256_set1_pd(EXP_C1);
	const __m256d c2 = _mm256_set1_pd(EXP_C2), one = _mm256_set1_pd(1.0);
	__m256d xd = _mm256_cvtps_pd(x), kd = _mm256_fmadd_pd(inv, xd, shift), r, z, y;
	__m256i ki = _mm256_castpd_si256(kd), t;

	kd = _mm256_sub_pd(kd, shift);
	r = _mm256_fmsub_pd(inv, xd, kd);
	t = _mm256_i64gather_epi64((const long long *)exp_tab, _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
	t = _mm256_add_epi64(t, _mm256_slli_epi64(ki, 47));
	z = _mm256_fmadd_pd(r, c0, c1);
	y = _mm256_fmadd_pd(r, c2, one);
	y = _mm256_fmadd_pd(z, _mm256_mul_pd(r, r), y);
	return _mm256_cvtpd_ps(_mm256_mul_pd(y, _mm256_castsi256_pd(t)));
}

__attribute__((target("avx2,fma"))) static void exp_avx2(float *p, int n, float mx)
{
	const __m256 ninf = _mm256_set1_ps(-INFINITY), vmx = _mm256_set1_ps(mx);
	int j = 0;

	for (; j + 8 <= n; j += 8) {
		__m256 s = _mm256_loadu_ps(p + j), x = _mm256_sub_ps(s, vmx), e;
		__m256 masked = _mm256_cmp_ps(s, ninf, _CMP_EQ_OQ);
		__m256i top = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 20), _mm256_set1_epi32(0x7ff));
		__m256 special = _mm256_castsi256_ps(_mm256_cmpgt_epi32(top, _mm256_set1_epi32(0x42a)));
		if (_mm256_movemask_ps(_mm256_andnot_ps(masked, special))) {
			exp_portable(p + j, 8, mx);
			continue;
		}
		e = _mm256_set_m128(exp4_avx2(_mm256_extractf128_ps(x, 1)), exp4_avx2(_mm256_castps256_ps128(x)));
		_mm256_storeu_ps(p + j, _mm256_andnot_ps(masked, e));
	}
	exp_portable(p + j, n - j, mx);
}

/* exp_avx2 sixteen at a time, with AVX-512: the same operations on the
 * same doubles, eight a vector, and the table read by two permutes of its
 * halves and a blend instead of a gather (the same entries). */
T512 static __m256 exp8_512(__m256 x)
{
	const __m512d inv = _mm512_set1_pd(EXP_INV), shift = _mm512_set1_pd(EXP_SHIFT);
	const __m512d c0 = _mm512_set1_pd(EXP_C0), c1 = _mm512_set1_pd(EXP_C1);
	const __m512d c2 = _mm512_set1_pd(EXP_C2), one = _mm512_set1_pd(1.0);
	const __m512i t0 = _mm512_loadu_si512(exp_tab), t1 = _mm512_loadu_si512(exp_tab + 8);
	const __m512i t2 = _mm512_loadu_si512(exp_tab + 16), t3 = _mm512_loadu_si512(exp_tab + 24);
	__m512d xd = _mm512_cvtps_pd(x), kd = _mm512_fmadd_pd(inv, xd, shift), r, z, y;
	const __m512i ki = _mm512_castpd_si512(kd), i = _mm512_and_si512(ki, _mm512_set1_epi64(31));
	__m512i t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(i, _mm512_set1_epi64(16)),
	                                    _mm512_permutex2var_epi64(t0, i, t1), _mm512_permutex2var_epi64(t2, i, t3));

	kd = _mm512_sub_pd(kd, shift);
	r = _mm512_fmsub_pd(inv, xd, kd);
	t = _mm512_add_epi64(t, _mm512_slli_epi64(ki, 47));
	z = _mm512_fmadd_pd(r, c0, c1);
	y = _mm512_fmadd_pd(r, c2, one);
	y = _mm512_fmadd_pd(z, _mm512_mul_pd(r, r), y);
	return _mm512_cvtpd_ps(_mm512_mul_pd(y, _mm512_castsi512_pd(t)));
}

T512 static void exp_512(float *p, int n, float mx)
{
	const __m512 ninf = _mm512_set1_ps(-INFINITY), vmx = _mm512_set1_ps(mx);
	int j = 0;

	for (; j + 16 <= n; j += 16) {
		const __m512 s = _mm512_loadu_ps(p + j), x = _mm512_sub_ps(s, vmx);
		const __mmask16 masked = _mm512_cmp_ps_mask(s, ninf, _CMP_EQ_OQ);
		const __m512i top = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(x), 20), _mm512_set1_epi32(0x7ff));
		if (_mm512_cmpgt_epi32_mask(top, _mm512_set1_epi32(0x42a)) & ~masked) {
			exp_portable(p + j, 16, mx);
			continue;
		}
		const __m512 e = _mm512_insertf32x8(_mm512_castps256_ps512(exp8_512(_mm512_castps512_ps256(x))),
		                                    exp8_512(_mm512_extractf32x8_ps(x, 1)), 1);
		_mm512_storeu_ps(p + j, _mm512_maskz_mov_ps(~masked, e));
	}
	exp_avx2(p + j, n - j, mx);
}

/* The widest of the two where the core has it. */
static void exp_vec(float *p, int n, float mx)
{
	if (cpu_has_avx512())
		exp_512(p, n, mx);
	else
		exp_avx2(p, n, mx);
}

/* 1 when exp_vec gives expf's bits on 2^16 inputs over [-88, 88] (the
 * scores minus their max lie in [-88, 0]) and on the edges; the first call
 * probes (not from within a parallel region: cpu_attention asks before). */
static int exp_vector_ok(void)
{
	static int ok = -1;
	int v = __atomic_load_n(&ok, __ATOMIC_RELAXED);

	if (v < 0) {
		enum { N = 1 << 16 };
		float *a = malloc(sizeof(float) * 2 * N), *b = a + N;
		uint32_t u = 12345;
		if (!(v = a && cpu_has_avx2())) {
			free(a);
			return 0;                       /* asked again next time */
		}
		for (int i = 0; i < N; i++) {
			u = u * 1664525u + 1013904223u;
			a[i] = i < N / 2 ? -88.0f * (float)i / (N / 2) : ((float)(u >> 8) / 16777216.0f - 0.5f) * 176.0f;
		}
		a[1] = -INFINITY;
		a[2] = -87.99999f;
		a[3] = 87.99999f;
		a[4] = -0.0f;
		a[5] = -1e-30f;
		memcpy(b, a, sizeof(float) * N);
		exp_vec(a, N, 0.0f);
		exp_portable(b, N, 0.0f);
		v = memcmp(a, b, sizeof(float) * N) == 0;
		free(a);
		__atomic_store_n(&ok, v, __ATOMIC_RELAXED);
	}
	return v;
}
/* p[i] = expf(p[i]) for n floats, bit for bit: exp_vec where it gives
 * expf's bits (exp_vector_ok; the first call not from within a parallel
 * region), else expf. */
void hi3i_cpu_expf_n(float *p, int n)
{
	if (exp_vector_ok())
		exp_vec(p, n, 0.0f);
	else
		exp_portable(p, n, 0.0f);
}

#define softmax_exp(vec, p, n, mx) ((vec) ? exp_vec(p, n, mx) : exp_portable(p, n, mx))
#define pv(...) (cpu_has_avx2() ? pv_avx2(__VA_ARGS__) : pv_portable(__VA_ARGS__))
#define max_above_inf(sc, n) (cpu_has_avx2() ? max_avx2(sc, n) : max_portable(sc, n))
#else
#define pv(...) pv_portable(__VA_ARGS__)
#define max_above_inf(sc, n) max_portable(sc, n)
#define exp_vector_ok() 0
#define softmax_exp(vec, p, n, mx) ((void)(vec), exp_portable(p, n, mx))
#endif


/* Attention, one work item at a time: up to ATT_TB consecutive queries of
 * one kv head, each with the query heads that share it (or half of them,
 * or fewer, when there are too few items for the threads). The item walks the keys
 * in tiles of ATT_KT, every query of the item on one tile before the next,
 * so that a tile of K (then of V) is read from memory once per item, not
 * once per query head. Each query's arithmetic is unchanged by the tiling:
 * a key's score is one canonical dot product in any range, the softmax runs
 * over its keys in order, and pv continues one sum across tiles. */
#define ATT_TB 4
#define ATT_KT 64
#define ATT_QMAX (ATT_TB * 16)

struct att_query {
	const float *q;
	float *o, *sc, *acc;
	int64_t base_k, base_v;
	int end, a1, b0;          /* keys [0, end): scored in [0, a1) and [b0, end) */
	int pf;                   /* the item's first query of its cache row: it reads the row
	                           * from memory and prefetches; the others find it in cache */
	float sum;
};

/* One call of cpu_attention: what every work item reads. */
struct att_call {
	hi3_backend *be;
	float *out;
	const float *qkv;
	const hi3_kv_src *ks, *vs;
	const hi3_attn_q *q;
	int M, d, g, W, hb, tb, n_hg, vexp;
	float scale;
	_Atomic int next;         /* on the pool: the first item no thread has taken */
};

/* A thread's scratch for the items it runs. */
struct att_scratch {
	float *sc, *acc;
	size_t sc_cap;
	float kbuf[1024];
	struct att_query aq[ATT_QMAX];
};

static int att_scratch_init(const struct att_call *c, struct att_scratch *s)
{
	s->sc = NULL;
	s->sc_cap = 0;
	if ((s->acc = malloc(sizeof(float) * (size_t)ATT_QMAX * (size_t)c->d)))
		return 0;
#pragma omp critical(hi3_cpu_fail)
	hi3i_backend_fail(c->be, "cpu attention: out of memory for %d accumulators", ATT_QMAX);
	return -1;
}

static void att_scratch_release(struct att_scratch *s)
{
	free(s->sc);
	free(s->acc);
}

/* Whether queries x and y read the same keys (values, with v) over the
 * same range. */
static int same_keys(const struct att_query *x, const struct att_query *y, int v)
{
	return x->end == y->end &&
	       (v ? x->base_v == y->base_v : x->base_k == y->base_k && x->a1 == y->a1 && x->b0 == y->b0);
}

/* How many of the left queries from x on take one pass over the same keys
 * (values, with v): two with AVX-512 (the pair loops), four with AVX2 (the
 * quad loops), else one. */
static int group(const struct att_query *x, int left, int d, int v)
{
#if defined(__x86_64__)
	if (cpu_has_avx512())
		return left >= 2 && d % 8 == 0 && d <= PAIR_DMAX && same_keys(x, x + 1, v) ? 2 : 1;
	if (cpu_has_avx2() && left >= 4 && d % 8 == 0 && same_keys(x, x + 1, v) &&
	    same_keys(x, x + 2, v) && same_keys(x, x + 3, v))
		return 4;
#else
	(void)x, (void)left, (void)d, (void)v;
#endif
	return 1;
}

/* Keys [j0, j1) of query x, and of the n - 1 after it with it (group). */
static void scores_n(int n, struct att_query *x, const hi3_kv_src *ks, int j0, int j1, int d, float scale,
                     float *kbuf)
{
#if defined(__x86_64__)
	if (n == 4) {
		const float *q[4] = {x[0].q, x[1].q, x[2].q, x[3].q};
		float *sc[4] = {x[0].sc, x[1].sc, x[2].sc, x[3].sc};
		scores_quad(q, ks, x->base_k, j0, j1, d, scale, sc, kbuf, x->pf);
		return;
	}
	if (n == 2) {
		scores_pair(x->q, x[1].q, ks, x->base_k, j0, j1, d, scale, x->sc, x[1].sc, kbuf, x->pf);
		return;
	}
#endif
	(void)n;
	scores(x->q, ks, x->base_k, j0, j1, d, scale, x->sc, kbuf, x->pf);
}

/* Values [j0, j1) into query x's sum, and the n - 1 after it with it. */
static void pv_n(int n, struct att_query *x, const hi3_kv_src *vs, int j0, int j1, int d, float *kbuf)
{
#if defined(__x86_64__)
	if (n == 4) {
		float *acc[4] = {x[0].acc, x[1].acc, x[2].acc, x[3].acc};
		const float *p[4] = {x[0].sc, x[1].sc, x[2].sc, x[3].sc};
		pv_quad(acc, p, vs, x->base_v, j0, j1, d, kbuf, x->pf);
		return;
	}
	if (n == 2) {
		pv_pair(x->acc, x[1].acc, x->sc, x[1].sc, vs, x->base_v, j0, j1, d, x->pf);
		return;
	}
#endif
	(void)n;
	pv(x->acc, x->sc, vs, x->base_v, j0, j1, d, kbuf, x->pf);
}

/* Each query's sum of its weights sc[0, end), in key order: one add at a
 * time from +0 (the zeros of the keys not admitted leave it as it is, +0
 * or above). An add waits for the one before it, so four queries' sums
 * run side by side, each still in its own order: the same bits (measured:
 * a decode step's attention after 4096 tokens about 5% the faster,
 * docs/PERFORMANCE.md, "Decode at B = 1, sixteenth round"). */
static void weight_sums(struct att_query *aq, int nq)
{
	int i = 0;

	for (; i + 4 <= nq; i += 4) {
		struct att_query *x = aq + i;
		const float *p0 = x[0].sc, *p1 = x[1].sc, *p2 = x[2].sc, *p3 = x[3].sc;
		const int n = HI3_MIN(HI3_MIN(x[0].end, x[1].end), HI3_MIN(x[2].end, x[3].end));
		float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
		int j;

		for (j = 0; j < n; j++) {
			s0 += p0[j];
			s1 += p1[j];
			s2 += p2[j];
			s3 += p3[j];
		}
		for (j = n; j < x[0].end; j++)
			s0 += p0[j];
		for (j = n; j < x[1].end; j++)
			s1 += p1[j];
		for (j = n; j < x[2].end; j++)
			s2 += p2[j];
		for (j = n; j < x[3].end; j++)
			s3 += p3[j];
		x[0].sum = s0;
		x[1].sum = s1;
		x[2].sum = s2;
		x[3].sum = s3;
	}
	for (; i < nq; i++) {
		float sum = 0.0f;
		for (int j = 0; j < aq[i].end; j++)
			sum += aq[i].sc[j];
		aq[i].sum = sum;
	}
}

/* Work item (ti, hg): queries [ti tb, ti tb + tb) of heads [hg hb, hg hb + hb). */
static void att_item(const struct att_call *c, int ti, int hg, struct att_scratch *s)
{
	const hi3_kv_src *ks = c->ks, *vs = c->vs;
	const int d = c->d, g = c->g, hb = c->hb, tb = c->tb, vexp = c->vexp;
	const float scale = c->scale;
	struct att_query *aq = s->aq;
	float *kbuf = s->kbuf;
	int nq = 0, end_max = 0;

	for (int m = ti * tb; m < HI3_MIN(c->M, (ti + 1) * tb); m++) {
		const hi3_attn_q *a = &c->q[m];
		int end = HI3_MAX(HI3_MAX(a->hi + 1, a->blk_hi), 0);
		for (int h = hg * hb; h < (hg + 1) * hb; h++) {
			struct att_query *x = &aq[nq++];
			x->q = c->qkv + (size_t)m * c->W + ((size_t)(h / g) * (g + 2) + (size_t)(h % g)) * d;
			x->o = c->out + (size_t)m * (size_t)(c->n_hg * hb) * d + (size_t)h * d;
			x->base_k = a->row * ks->row_stride + (int64_t)(h / g) * ks->head_stride;
			x->base_v = a->row * vs->row_stride + (int64_t)(h / g) * vs->head_stride;
			x->end = end;
			x->a1 = HI3_MIN(a->hi + 1, end);
			x->b0 = HI3_MAX(a->blk_lo, x->a1);
			x->pf = x == aq || x->base_k != x[-1].base_k || x->base_v != x[-1].base_v;
		}
		end_max = HI3_MAX(end_max, end);
	}
	if ((size_t)end_max * (size_t)nq > s->sc_cap) {
		free(s->sc);
		s->sc_cap = ((size_t)end_max + 256) * (size_t)nq;
		if (!(s->sc = malloc(s->sc_cap * sizeof(float)))) {
			s->sc_cap = 0;
#pragma omp critical(hi3_cpu_fail)
			hi3i_backend_fail(c->be, "cpu attention: out of memory for the scores of %d keys", end_max);
			for (int i = 0; i < nq; i++)
				memset(aq[i].o, 0, sizeof(float) * (size_t)d);
			return;
		}
	}
	for (int i = 0; i < nq; i++) {
		aq[i].sc = s->sc + (size_t)i * (size_t)end_max;
		aq[i].acc = s->acc + (size_t)i * (size_t)d;
	}
	/* scores; keys not admitted: [max(a1, 0), b0) */
	for (int j0 = 0; j0 < end_max; j0 += ATT_KT) {
		for (int i = 0, n; i < nq; i += n) {
			struct att_query *x = &aq[i];
			int j1 = HI3_MIN(j0 + ATT_KT, x->end), lo, hi;
			n = group(x, nq - i, d, 0);
			if (j0 >= j1)
				continue;
			if ((hi = HI3_MIN(x->a1, j1)) > j0)
				scores_n(n, x, ks, j0, hi, d, scale, kbuf);
			for (int j = HI3_MAX(HI3_MAX(x->a1, 0), j0); j < HI3_MIN(x->b0, j1); j++)
				for (int t = 0; t < n; t++)
					x[t].sc[j] = -INFINITY;
			if ((lo = HI3_MAX(x->b0, j0)) < j1)
				scores_n(n, x, ks, lo, j1, d, scale, kbuf);
		}
	}
	/* weights in place of the scores (0 for keys not admitted), and
	 * their sums */
	for (int i = 0; i < nq; i++) {
		struct att_query *x = &aq[i];
		const float mx = max_above_inf(x->sc, x->end);
		if (mx == -INFINITY)            /* admits no key */
			x->end = 0;
		else
			softmax_exp(vexp, x->sc, x->end, mx);
	}
	weight_sums(aq, nq);
	for (int i = 0; i < nq; i++)
		memset(aq[i].acc, 0, sizeof(float) * (size_t)d);
	for (int j0 = 0; j0 < end_max; j0 += ATT_KT)
		for (int i = 0, n; i < nq; i += n) {
			struct att_query *x = &aq[i];
			n = group(x, nq - i, d, 1);
			if (j0 < x->end)
				pv_n(n, x, vs, j0, HI3_MIN(j0 + ATT_KT, x->end), d, kbuf);
		}
	for (int i = 0; i < nq; i++) {
		struct att_query *x = &aq[i];
		if (x->end == 0) {
			memset(x->o, 0, sizeof(float) * (size_t)d);
			continue;
		}
#pragma omp simd
		for (int k = 0; k < d; k++)
			x->o[k] = x->acc[k] / x->sum;
	}
}

/* The items of a short call, round robin over the pool's team. */
static void att_part(void *p, int id, int nt)
{
	struct att_call *c = p;
	const int n = (c->M + c->tb - 1) / c->tb * c->n_hg;
	struct att_scratch s;

	if (atomic_load_explicit(&c->next, memory_order_relaxed) >= n)
		return;
	if (att_scratch_init(c, &s) == 0)
		for (int it; (it = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed)) < n;)
			att_item(c, it / c->n_hg, it % c->n_hg, &s);
	att_scratch_release(&s);
}

static void cpu_attention(hi3_backend *be, float *out, const float *qkv, const hi3_kv_src *ks,
                          const hi3_kv_src *vs, const hi3_attn_q *q, const struct hi3_dims *dm, int M)
{
	const int d = dm->d, g = dm->n_h / dm->n_kv, nt = omp_get_max_threads();
	const size_t par = (size_t)nt * 4;
	size_t keys = 0;
	int serial, hb, tb, n_tb;
	struct att_call c = {be, out, qkv, ks, vs, q, M, d, g, (dm->n_h + 2 * dm->n_kv) * d, 0, 0, 0,
	                     exp_vector_ok(), 1.0f / sqrtf((float)d), 0}; /* the exp probe before the threads */

	/* a decode step's queries (a few rows) run on the pool's team, whose
	 * workers are awake from the step's products (pool.h): waking
	 * OpenMP's would cost more than a short context's attention */
	for (int m = 0; m < M; m++)
		keys += (size_t)HI3_MAX(HI3_MAX(q[m].hi + 1, q[m].blk_hi), 0);
	serial = !HI3_PAR_WORTH(keys * (size_t)dm->n_h * (size_t)d / 8);
	/* heads per item: all g of a kv head, so that its keys and values are
	 * read from memory once, not g times, unless that leaves a thread
	 * without an item (a B = 1 step on more threads than kv heads): then
	 * halved until each has one. Queries per item: ATT_TB for many. */
	hb = g <= 16 ? g : 1;
	while (!serial && hb > 1 && (size_t)M * (size_t)(dm->n_h / hb) < (size_t)nt)
		hb = hb % 2 ? 1 : hb / 2;
	tb = (hb > 1 && (size_t)M * (size_t)(dm->n_h / hb) >= par * ATT_TB) ? ATT_TB : 1;
	c.hb = hb;
	c.tb = tb;
	c.n_hg = dm->n_h / hb;
	n_tb = (M + tb - 1) / tb;
	if (serial || M <= HI3I_POOL_ROWS) {
		hi3i_pool_share(att_part, &c, HI3_MIN(nt, n_tb * c.n_hg));
		return;
	}
#pragma omp parallel
	{
		struct att_scratch s;
		const int have = att_scratch_init(&c, &s) == 0;

#pragma omp for schedule(dynamic, 1) collapse(2)
		for (int ti = 0; ti < n_tb; ti++)
			for (int hg = 0; hg < c.n_hg; hg++)
				if (have)
					att_item(&c, ti, hg, &s);
		att_scratch_release(&s);
	}
}

/* y = a * silu(b) with silu(b) = b / (1 + expf(-b)); the exponentials 256
 * at a time by softmax_exp, which gives expf's bits (scalar expf where its
 * vector form does not). */
static void swiglu_row(float *o, const float *a, const float *b, int inter, int vexp)
{
	float e[256];

	for (int i0 = 0; i0 < inter; i0 += 256) {
		const int n = HI3_MIN(256, inter - i0);
#pragma omp simd
		for (int i = 0; i < n; i++)
			e[i] = -b[i0 + i];
		softmax_exp(vexp, e, n, 0.0f);
#pragma omp simd
		for (int i = 0; i < n; i++)
			o[i0 + i] = a[i0 + i] * (b[i0 + i] / (1.0f + e[i]));
	}
}

static void cpu_swiglu(hi3_backend *be, float *y, const float *ab, int M, int inter)
{
	const int vexp = exp_vector_ok();       /* before the threads: the probe runs once */

	(void)be;
	HI3_PAR_FOR((size_t)M * inter, m, M,
	            swiglu_row(y + (size_t)m * inter, ab + (size_t)m * 2 * inter, ab + (size_t)m * 2 * inter + inter,
	                       inter, vexp););
}

static void cpu_gather(hi3_backend *be, float *dst, const float *src, const int32_t *idx, int n, int w)
{
	(void)be;
	HI3_PAR_FOR((size_t)n * w, i, n, memcpy(dst + (size_t)i * w, src + (size_t)idx[i] * w, sizeof(float) * (size_t)w););
}

/* y += a x over n */
static void axpy(float *y, float a, const float *x, int n)
{
#pragma omp simd
	for (int j = 0; j < n; j++)
		y[j] += a * x[j];
}

static void cpu_scatter_add(hi3_backend *be, float *dst, const float *src, const int32_t *idx,
                            const float *scale, int n, int w)
{
	(void)be;
	/* idx may repeat across calls but not within one (one expert per token). */
	HI3_PAR_FOR((size_t)n * w, i, n, axpy(dst + (size_t)idx[i] * w, scale[i], src + (size_t)i * w, w););
}

static void cpu_scatter(hi3_backend *be, float *dst, const float *src, const int32_t *idx, int n, int w)
{
	(void)be;
	HI3_PAR_FOR((size_t)n * w, i, n, memcpy(dst + (size_t)idx[i] * w, src + (size_t)i * w, sizeof(float) * (size_t)w););
}

static void cpu_destroy(hi3_backend *be)
{
	struct cpu *c = be->ctx;

	if (c) {
		free(c->wide);
		free(c->scratch);
	}
	free(c);
	free(be);
}

static const hi3_backend_ops cpu_ops = {
	.destroy = cpu_destroy,
	.alloc = cpu_alloc,
	.free = cpu_free,
	.upload = cpu_copy,
	.download = cpu_copy,
	.mem_free = cpu_mem_free,
	.weight = cpu_weight,
	.weight_free = cpu_weight_free,
	.qweight = cpu_qweight,
	.kv_attach = cpu_kv_attach,
	.kv_detach = cpu_kv_detach,
	.kv_layer = cpu_kv_layer,
	.kv_sync_host = cpu_kv_sync_host,
	.matmul = cpu_matmul,
	.matmul_group = cpu_matmul_group,
	.prefetch = cpu_prefetch,
	.embed = cpu_embed,
	.rmsnorm = cpu_rmsnorm,
	.zero = cpu_zero,
	.copy2d = cpu_copy2d,
	.add = cpu_add,
	.rope_qk = cpu_rope_qk,
	.kv_store = cpu_kv_store,
	.attention = cpu_attention,
	.swiglu = cpu_swiglu,
	.gather = cpu_gather,
	.scatter_add = cpu_scatter_add,
	.scatter = cpu_scatter,
	.conv = hi3i_cpu_conv,
	.bias_add = hi3i_cpu_bias_add,
	.groupnorm = hi3i_cpu_groupnorm,
	.layernorm = hi3i_cpu_layernorm,
	.act = hi3i_cpu_act,
	.scale_shift = hi3i_cpu_scale_shift,
	.add_repeat = hi3i_cpu_add_repeat,
	.add_group_mean = hi3i_cpu_add_group_mean,
	.depth_to_space = hi3i_cpu_depth_to_space,
	.space_to_depth = hi3i_cpu_space_to_depth,
	.attention_dense = hi3i_cpu_attention_dense,
};

int hi3i_backend_cpu(hi3_backend **out, int threads, int batch_invariant, hi3_error *err)
{
	hi3_backend *be = hi3i_calloc(1, sizeof(*be), err);

	*out = NULL;
	if (!be)
		return -1;
	if (!(be->ctx = hi3i_calloc(1, sizeof(struct cpu), err))) {
		free(be);
		return -1;
	}
	if (threads > 0)
		omp_set_num_threads(threads);
	openblas_set_num_threads(threads > 0 ? threads : omp_get_max_threads());
	be->name = "cpu";
	be->ops = &cpu_ops;
	be->batch_invariant = batch_invariant;
	*out = be;
	return 0;
}

void hi3i_rope_theta(float *theta, int d, double base)
{
	/* torch: 1.0 / (base ** (arange(0, d, 2).float() / d)), all in fp32 */
	for (int m = 0; m < d / 2; m++) {
		float e = (float)(2 * m) / (float)d;
		theta[m] = 1.0f / powf((float)base, e);
	}
}
