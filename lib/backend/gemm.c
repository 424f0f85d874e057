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
 * Widening is exact, so the bits are the same every way. A quantized
 * weight (quant.h) is dequantized in registers inside the tile the same
 * way for up to WIDEN_ROWS rows (quant-x86.h: int8, fp8, nf4 and nvfp4
 * rows eight values at a time, the codes read where they lie), or, for
 * more rows, forms those decoders do not read and the portable kernel, a
 * chunk's k slice into the f32 buffer:
 * each value is a function of its stored bits alone, so the bits are again
 * those of the f32 weights it stands for.
 *
 * A product of at most BR rows of x (a decode step) with AVX2 and W as
 * stored takes the few-row tiles instead (gemm_few): one pass over K, 4 W
 * rows per tile (2 for 3-4 rows of x), one from each of as many parts of
 * the thread's range, so that each part is read front to back as one
 * stream, each stream prefetched ahead as it goes (a row ahead, or some
 * bytes on Intel's and AMD's cores: few_pf_of_core). There W is read
 * once and used for one to four rows, so the product runs at the rate W
 * arrives from memory:
 * without the prefetches a three-column tile read a B = 1 step's weights
 * at about a third of the machine's read bandwidth (docs/PERFORMANCE.md,
 * "Decode at B = 1 against its floor").
 *
 * With AVX-512 (checked at run time) a product of 8 rows or more takes the
 * kernel of the AVX-512 section below instead: x packed by pairs of rows,
 * the same lanes, twice the width, about twice the rate. It decodes
 * quantized weights in its registers for up to WIDEN_ROWS rows; for more,
 * a chunk's k slice is dequantized once into a panel its row tiles read.
 */
#include <math.h>
#include <string.h>
#include <stdatomic.h>
#include <omp.h>
#include "backend/gemm.h"
#include "backend/pool.h"
#include "backend/quant-x86.h"

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
#define NRS 8                     /* W rows a tile's registers hold, at most */
#define STREAMS 4                 /* W rows a few-row tile reads at most: one from each part of a range (NS) */

/* How a W row is read: as stored, or (WQ + hi3i_qrow_kind) a quantized
 * row dequantized in registers by quant-x86.h's decoders. */
enum { WF32, WBF16, WF16, WQ };

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

void hi3i_wmat_init_q(hi3_wmat *w, const hi3_qweight *q)
{
	memset(w, 0, sizeof(*w));
	w->data = q->codes;
	w->dtype = HI3_F32;
	w->N = q->N;
	w->K = q->K;
	w->q = q;
}

static int wkind(hi3_dtype dt)
{
	return dt == HI3_BF16 ? WBF16 : dt == HI3_F16 ? WF16 : WF32;
}

/* Bytes of one stored element of a plain kind (F32, BF16, F16). */
#define ES(kind) ((size_t)((kind) == WF32 ? 4 : 2))

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

	if (w->q) {
		float *wr = malloc(sizeof(float) * (size_t)HI3_MAX(w->K, 1));
		HI3_ASSERT(wr);
		for (int n = 0; n < w->N; n++) {
			for (int k = 0; k < w->K; k++)
				wr[k] = hi3i_qweight_at(w->q, n, k);
			for (int m = 0; m < M; m++)
				y[(size_t)m * w->N + n] = dot_ref(x + (size_t)m * w->K, wr, WF32, w->K);
		}
		free(wr);
		return;
	}
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
	const hi3_qweight *q;     /* a kind above WQ: the matrix, */
	int n0;                   /* the W row of the tile's row 0, */
	int bf;                   /* and whether its values are rounded to BF16 */
};

/* The first bytes another range reads next, to prefetch (gemm_few): n
 * bytes at each p[s] that is not NULL, a stream each; or, with learn set,
 * bytes not known yet: learn(b) finds them (the range group_part takes
 * next), sets p and n and clears learn; called at the start of the last
 * tile that prefetches them. */
struct pf_block {
	const void *p[STREAMS];
	size_t n;
	void (*learn)(struct pf_block *b);
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

/* One step of 8 k of a register tile: acc[i][j] += x row i . W row j over
 * k .. k + 7 (W's at kw, its index in the row as stored or widened). AVX2
 * has 16 vector registers: the accumulators and whichever of the k slices
 * of x or W is smaller are held, the other read a row at a time, so no
 * accumulator is spilled (the M = 1 tile of 8 W rows held both and spilled
 * one: its chain of multiply-adds then ran through memory). */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
step8(const int mr, const int nr, const int kind, __m256 acc[BR][NRS], hi3i_qrow *qr, const float *x, size_t ldx,
      int k, const void *w, size_t ldw, size_t kw, int bf)
{
	if (mr <= nr) {
		/* x's rows held: mr + mr nr + 1 registers */
		__m256 xv[BR];
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++)
			xv[i] = _mm256_loadu_ps(x + (size_t)i * ldx + k);
#pragma GCC unroll 8
		for (int j = 0; j < nr; j++) {
			const __m256 wj = kind > WQ ? hi3i_qrow_load8(&qr[j], kind - WQ, k, bf)
			                            : load_w8(w, kind, (size_t)j * ldw + kw);
#pragma GCC unroll 4
			for (int i = 0; i < mr; i++)
				acc[i][j] = _mm256_fmadd_ps(xv[i], wj, acc[i][j]);
		}
	} else {
		/* W's rows held: nr + mr nr + 1 */
		__m256 wv[NRS];
#pragma GCC unroll 8
		for (int j = 0; j < nr; j++)
			wv[j] = kind > WQ ? hi3i_qrow_load8(&qr[j], kind - WQ, k, bf) : load_w8(w, kind, (size_t)j * ldw + kw);
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++) {
			const __m256 xi = _mm256_loadu_ps(x + (size_t)i * ldx + k);
#pragma GCC unroll 8
			for (int j = 0; j < nr; j++)
				acc[i][j] = _mm256_fmadd_ps(xi, wv[j], acc[i][j]);
		}
	}
}

/* A register tile's outputs, after its last step: y[i ldy + j ldc] = the
 * lanes of acc[i][j] joined in gemm.h's tree, the k in [K & ~7, K) first
 * added into lane 0 (W row j as in step8, from wk0; a quantized kind's
 * values read from q, its rows from q_n0). */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
tile_out(const int mr, const int nr, const int kind, __m256 acc[BR][NRS], const float *x, size_t ldx, int K,
         const void *w, size_t ldw, int wk0, const hi3_qweight *q, int q_n0, float *y, size_t ldy, size_t ldc)
{
	const int K8 = K & ~7;

	if (K8 < K) {
		/* the tail into lane 0, then the tree, element by element */
		for (int i = 0; i < mr; i++)
			for (int j = 0; j < nr; j++) {
				float l[8];
				_mm256_storeu_ps(l, acc[i][j]);
				for (int k = K8; k < K; k++)
					l[0] = fmaf(x[(size_t)i * ldx + k],
					            kind > WQ ? hi3i_qweight_at(q, q_n0 + j, k)
					                      : w_elem(w, kind, (size_t)j * ldw + (size_t)(k - wk0)),
					            l[0]);
				y[(size_t)i * ldy + (size_t)j * ldc] = combine(l);
			}
		return;
	}
	__m256 v[BR * NRS];
	float r[BR * NRS];
	int n = 0;
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
		for (int j = 0; j < nr; j++)
			v[n++] = acc[i][j];
	combine_n(v, mr * nr, r);
	n = 0;
	for (int i = 0; i < mr; i++)
		for (int j = 0; j < nr; j++)
			y[(size_t)i * ldy + (size_t)j * ldc] = r[n++];
}

/* The register tile, specialised for each (mr, nr, kind) by the switches
 * below; the same bits as tile_portable. */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void tile(const int mr, const int nr,
                                                                               const int kind,
                                                                               const struct tile_args *a)
{
	__m256 acc[BR][NRS];
	hi3i_qrow qr[NRS];
	const int K8 = a->K & ~7, k1 = HI3_MIN(a->k1, K8);

	if (kind > WQ)
		for (int j = 0; j < nr; j++)
			hi3i_qrow_init(&qr[j], a->q, a->n0 + j);
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
		for (int j = 0; j < nr; j++)
			acc[i][j] = a->k0 ? _mm256_loadu_ps(a->part + (size_t)(i * nr + j) * 8) : _mm256_setzero_ps();
	for (int k = a->k0; k < k1; k += 8)
		step8(mr, nr, kind, acc, qr, a->x, a->ldx, k, a->w, a->ldw, (size_t)(k - a->wk0), a->bf);
	if (a->k1 < a->K) {
		for (int i = 0; i < mr; i++)
			for (int j = 0; j < nr; j++)
				_mm256_storeu_ps(a->part + (size_t)(i * nr + j) * 8, acc[i][j]);
		return;
	}
	tile_out(mr, nr, kind, acc, a->x, a->ldx, a->K, a->w, a->ldw, a->wk0, a->q, a->n0, a->y, a->ldy, 1);
}

#define TILE_KINDS(mr, nr)                                         \
	case (mr) * 4 + (nr):                                      \
		switch (kind) {                                    \
		case WF32: tile(mr, nr, WF32, a); break;           \
		case WBF16: tile(mr, nr, WBF16, a); break;         \
		case WF16: tile(mr, nr, WF16, a); break;           \
		case WQ + HI3I_QR_INT8: tile(mr, nr, WQ + HI3I_QR_INT8, a); break; \
		case WQ + HI3I_QR_FP8: tile(mr, nr, WQ + HI3I_QR_FP8, a); break; \
		case WQ + HI3I_QR_NF4: tile(mr, nr, WQ + HI3I_QR_NF4, a); break; \
		default: tile(mr, nr, WQ + HI3I_QR_NVFP4, a); break; \
		}                                                  \
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

/* The W rows of a few-row tile of mr rows of x, from as many streams: 4
 * for one or two rows (4 or 8 accumulators), 2 for three or four (6 or
 * 8), whose 12 and 16 accumulators with 4 streams would leave too few of
 * AVX2's 16 registers for x and W. */
#define NS(mr) ((mr) <= 2 ? 4 : 2)
_Static_assert(STREAMS - 1 <= BN, "a range's last rows, fewer than a few-row tile's, fit one plain tile");

/* How far ahead of its loads a few-row stream prefetches its own bytes
 * (few_rows), on cores that take it: Intel's and AMD's family 26 and
 * later. There, for rows longer than this, the same line of the next row
 * read slower (docs/PERFORMANCE.md, "Decode at B = 1, twelfth round", a
 * Xeon: a B = 1 step of the real layer shape 1.37x its floor with a row's
 * distance, 1.25x with 2 KiB; `small` f32 1.19x and 1.16x; "twenty-fourth
 * round", an AMD EPYC of Zen 5 with the runs of FEW_RUN lines, medians:
 * `small` f32 on a fast memory 1.184x and 1.139x; the real layer shape,
 * bf16, 1.097x and 1.055x, f32 on a fast memory 1.12x and 1.03x). */
#define NEAR_AHEAD ((size_t)2048)

/* The same on AMD's family 25 (Zen 3; Zen 4, of the same family, was not
 * measured): there a plain read of a buffer prefetched 2 KiB on ran slower
 * than one not prefetched at all, 512 bytes on as fast, and a B = 1 step
 * of `small` ran nearer its floor with 256, 512 or 1024 bytes than with a
 * row's distance (docs/PERFORMANCE.md, "Decode at B = 1, twenty-seventh
 * round", medians of 11-58 runs: with the two threads on one CCD, bf16
 * 1.113x against 1.157x, f32 1.061x against 1.152x; on two, f32 1.165x
 * against 1.373x, bf16 1.353x against 1.341x). */
#define NEAR_AHEAD_ZEN3 ((size_t)512)

/* How few_rows prefetches on this core: near, the distance above (0:
 * the next row's line), t0, whether into L1 (T0) rather than L2 (T1),
 * and one_row, whether only a single row of x takes near (few_rows). T0
 * read slower on a Xeon (few_rows' comment) and on an AMD EPYC of Zen 3
 * (family 25: docs/PERFORMANCE.md, "Decode at B = 1, eighth round",
 * 1.153x against 1.129x), faster on an AMD EPYC of Zen 5 (family 26:
 * "nineteenth round"); so T0 on AMD's family 26 and later only. Other
 * cores, not measured, keep the row's distance. */
struct few_pf {
	size_t near;
	int t0, one_row;
};

static struct few_pf few_pf_of_core(void)
{
	/* 0 other, 1 Intel, 2 AMD of family 26 or later, 3 AMD of family 25 */
	static const struct few_pf of[] = {{0, 0, 0}, {NEAR_AHEAD, 0, 0}, {NEAR_AHEAD, 1, 1}, {NEAR_AHEAD_ZEN3, 0, 1}};
	static int core = -1;

	if (core < 0) {
		unsigned a, b, c, d, family = 0;
		__builtin_cpu_init();
		if (__get_cpuid(1, &a, &b, &c, &d)) {   /* the base family, plus the extended one past 15 */
			family = a >> 8 & 0xf;
			if (family == 0xf)
				family += a >> 20 & 0xff;
		}
		core = __builtin_cpu_is("intel")                ? 1
		       : !__builtin_cpu_is("amd") || family < 25 ? 0
		       : family >= 26                            ? 2
		                                                 : 3;
	}
	return of[core];
}

#define FEW_PREFETCH(p, t0) ((t0) ? _mm_prefetch((p), _MM_HINT_T0) : _mm_prefetch((p), _MM_HINT_T1))

/* The prefetches of few_rows as its steps reach byte kb of row r (part s
 * lds bytes on): with near, near bytes on in each part's stream (into the
 * next row of the part but for the last row); without, or in the last row,
 * the line at kb of each pf[s] (the next row of each part, or the rows
 * read after these) that is not NULL, for kb below pf_len. */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
few_prefetch(const int S, const unsigned char *r, size_t lds, size_t kb, struct few_pf fp, size_t rb, int last,
             const unsigned char *const *pf, size_t pf_len)
{
	if (fp.near) {
		if (!last || kb + fp.near < rb)
#pragma GCC unroll 4
			for (int s = 0; s < S; s++)
				FEW_PREFETCH((const char *)r + (size_t)s * lds + kb + fp.near, fp.t0);
		if (!last)
			return;
	}
	if (kb < pf_len)
#pragma GCC unroll 4
		for (int s = 0; s < S; s++)
			if (pf[s])
				FEW_PREFETCH((const char *)pf[s] + kb, fp.t0);
}

/* Lines of a part that few_steps_on reads before it turns to the next
 * part, on cores that prefetch into L1 (AMD's family 26 and later,
 * few_pf_of_core). There a line of each part in turn read slower than a
 * run of lines of one part: on a fast memory, `small` f32 decode steps
 * came 4-5% nearer their floor with runs of 4, bf16 0-3%; on a slow one
 * within 1% (docs/PERFORMANCE.md, "Decode at B = 1, twenty-third round").
 * Each part's chain of multiply-adds is the same either way. */
#define FEW_RUN 4

/* few_rows' steps over row r of each part (parts ldw elements apart) from
 * k = 0 while a whole line is left, each line's twin ahead bytes on in its
 * part prefetched with the hint t0, a constant here: for a row that is not
 * its part's last. ahead is a row's bytes (the same line of the next row)
 * or, with t0 on a core that takes it, NEAR_AHEAD (few_pf_of_core).
 * With t0, FEW_RUN lines of a part at a time, their prefetches first.
 * Returns the k it stopped at. few_rows' own loop asks at every line
 * which rows to prefetch and with which hint; this one asks nothing, and
 * f32 decode steps ran 2-7% faster with it (docs/PERFORMANCE.md, "Decode
 * at B = 1, twentieth round"). */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline int
few_steps_on(const int mr, const int kind, const int t0, __m256 acc[BR][NRS], const float *x, int K,
             const unsigned char *r, size_t ldw, size_t ahead)
{
	const int K8 = K & ~7, S = NS(mr), L = (int)(64 / (8 * ES(kind)));
	const size_t lds = ldw * ES(kind);
	int k = 0;

	if (t0)
		for (; k <= K8 - 8 * L * FEW_RUN; k += 8 * L * FEW_RUN)
#pragma GCC unroll 4
			for (int s = 0; s < S; s++) {
				const unsigned char *p = r + (size_t)s * lds;
#pragma GCC unroll 4
				for (int c = 0; c < FEW_RUN; c++)
					FEW_PREFETCH((const char *)p + ahead + (size_t)(k + 8 * L * c) * ES(kind), 1);
#pragma GCC unroll 16
				for (int u = 0; u < L * FEW_RUN; u++) {
					const __m256 wv = load_w8(p, kind, (size_t)(k + 8 * u));
#pragma GCC unroll 4
					for (int i = 0; i < mr; i++)
						acc[i][s] = _mm256_fmadd_ps(_mm256_loadu_ps(x + (size_t)i * K + k + 8 * u), wv,
						                            acc[i][s]);
				}
			}
	for (; k <= K8 - 8 * L; k += 8 * L) {
#pragma GCC unroll 4
		for (int s = 0; s < S; s++)
			FEW_PREFETCH((const char *)r + (size_t)s * lds + ahead + (size_t)k * ES(kind), t0);
#pragma GCC unroll 4
		for (int u = 0; u < L; u++)
			step8(mr, S, kind, acc, NULL, x, (size_t)K, k + 8 * u, r, ldw, (size_t)(k + 8 * u), 0);
	}
	return k;
}

/*
 * Rows [0, h) of each of NS(mr) parts of columns [n0, n0 + NS(mr) h) of y
 * = x W^T, W as stored, mr rows of x: row i of every part at once, in one
 * loop over the rows (gemm_few). As a row's steps pass each 64-byte line
 * of it they prefetch the same line of the next row of each part, or, in
 * the last row, of the rows read after these: tail (one row), else what
 * after names (learnt then). A few rows of x do too little work per W
 * line for the hardware prefetcher alone to keep up (without these
 * prefetches a B = 1 step's products ran at 1.8x their floor).
 * The lines go to L2 (T1), not L1: a prefetch into L1 holds one of the
 * core's few L1 fill buffers until its line comes, which capped a core's
 * stream on a Xeon (measured: one decode step's products at 1.13x the read
 * of their bytes with T0, 1.10x with T1; f32 1.10x and 1.02x), and the
 * loads find L2 near enough (but on an AMD EPYC of Zen 5, T0 read faster:
 * few_pf_of_core). On Intel's and AMD's cores (few_pf_of_core) a stream
 * prefetches its own bytes NEAR_AHEAD on instead (on AMD's, only for a
 * single row of x, and on family 25 NEAR_AHEAD_ZEN3), where its rows are
 * longer (on AMD's family 26 and later, in few_steps_on's runs). On Zen 3
 * the hardware's prefetch alone did as well as 512 bytes on
 * (docs/PERFORMANCE.md, "Decode at B = 1, twenty-eighth round").
 * The rows run in one loop, not a call of the register tile each:
 * measured, a B = 1 step of `small` f32 2.2-2.3% the faster, bf16
 * 0.4-0.7% (within the noise; docs/PERFORMANCE.md, "Decode at B = 1,
 * twelfth round").
 */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
few_rows(const int mr, const int kind, float *y, const float *x, const hi3_wmat *w, int n0, int h,
         const unsigned char *tail, struct pf_block *after, struct few_pf fp)
{
	const int K = w->K, K8 = K & ~7, S = NS(mr), L = (int)(64 / (8 * ES(kind))); /* steps of 8 k a line */
	const size_t rb = (size_t)K * ES(kind), ldw = (size_t)h * (size_t)K, N = (size_t)w->N;

	/* on AMD's cores, only a single row of x streams its own bytes: at B
	 * = 8 of the real layer shape, whose routed experts take these tiles
	 * with one to four rows, the near distance for every row count made
	 * a decode step of Zen 5 5-8% slower (docs/PERFORMANCE.md, "Decode at
	 * B = 1, twenty-fourth round"); on Zen 3, `small` at B = 4 and 8 came
	 * out no faster with it ("twenty-seventh round") */
	if (fp.near >= rb || (fp.one_row && mr > 1))
		fp.near = 0;
	const size_t ahead = fp.near ? fp.near : rb; /* few_steps_on's distance where it takes a row */

	for (int i = 0; i < h; i++) {
		const unsigned char *r = (const unsigned char *)w->data + (size_t)(n0 + i) * rb, *pf[STREAMS] = {NULL};
		size_t pf_len = rb;
		__m256 acc[BR][NRS];
		int k = 0;

		if (i + 1 < h) {
			for (int s = 0; s < S; s++)
				pf[s] = r + (size_t)(s * h + 1) * rb;
		} else if (tail) {
			pf[0] = tail;
		} else {
			if (after && after->learn)
				after->learn(after);
			for (int s = 0; s < S; s++)
				pf[s] = after ? after->p[s] : NULL;
			pf_len = after ? after->n : 0;
		}
#pragma GCC unroll 4
		for (int m = 0; m < mr; m++)
#pragma GCC unroll 4
			for (int j = 0; j < S; j++)
				acc[m][j] = _mm256_setzero_ps();
		if (i + 1 < h && (fp.t0 || !fp.near))
			k = fp.t0 ? few_steps_on(mr, kind, 1, acc, x, K, r, ldw, ahead)
			          : few_steps_on(mr, kind, 0, acc, x, K, r, ldw, ahead);
		for (; k <= K8 - 8 * L; k += 8 * L) {
			few_prefetch(S, r, ldw * ES(kind), (size_t)k * ES(kind), fp, rb, i + 1 == h, pf, pf_len);
#pragma GCC unroll 4
			for (int u = 0; u < L; u++)
				step8(mr, S, kind, acc, NULL, x, (size_t)K, k + 8 * u, r, ldw, (size_t)(k + 8 * u), 0);
		}
		for (; k < K8; k += 8) { /* a last part of a line */
			if ((size_t)k * ES(kind) % 64 == 0)
				few_prefetch(S, r, ldw * ES(kind), (size_t)k * ES(kind), fp, rb, i + 1 == h, pf, pf_len);
			step8(mr, S, kind, acc, NULL, x, (size_t)K, k, r, ldw, (size_t)k, 0);
		}
		tile_out(mr, S, kind, acc, x, (size_t)K, K, r, ldw, 0, NULL, 0, y + n0 + i, N, (size_t)h);
	}
}

#define FEW_ROWS(mr)                                                                     \
	case mr:                                                                         \
		switch (kind) {                                                          \
		case WF32: few_rows(mr, WF32, y, x, w, n0, h, tail, after, fp); break; \
		case WBF16: few_rows(mr, WBF16, y, x, w, n0, h, tail, after, fp); break; \
		default: few_rows(mr, WF16, y, x, w, n0, h, tail, after, fp); break;   \
		}                                                                        \
		break;

__attribute__((target("avx2,fma,f16c"))) static void few_rows_avx2(int mr, int kind, float *y, const float *x,
                                                                   const hi3_wmat *w, int n0, int h,
                                                                   const unsigned char *tail,
                                                                   struct pf_block *after)
{
	const struct few_pf fp = few_pf_of_core();

	switch (mr) {
		FEW_ROWS(1) FEW_ROWS(2) FEW_ROWS(3) FEW_ROWS(4)
	}
}

/* The rows a range's first few-row tile of M rows of x reads (gemm_few):
 * the first of each part of columns [n0, n1), or the first of a range too
 * short to part. */
static struct pf_block first_rows(const hi3_wmat *w, int M, int n0, int n1)
{
	const size_t rb = (size_t)w->K * hi3_dtype_size(w->dtype);
	const unsigned char *w0 = w->data;
	const int S = NS(M), h = (n1 - n0) / S;
	struct pf_block b = {{NULL}, rb, NULL};

	for (int s = 0; s < (h ? S : 1); s++)
		b.p[s] = w0 + (size_t)(n0 + s * h) * rb;
	return b;
}

/*
 * Columns [n0, n1) of y = x W^T for M <= BR rows, W as stored (F32, BF16
 * or F16): one pass over K (a few rows of x stay in L1) for NS(M) W rows
 * at a time, row i of each of NS(M) equal parts of the range (the last
 * rows, fewer than NS(M), by a plain tile at the end). Each part is so
 * read front to back, row after row, one stream in address order, and a
 * core reads several at once, as the fastest plain read does (bench.c's
 * HI3I_READ_PARTS). Tiles of adjacent rows, as before, left a B = 1 step's
 * products at 1.17x the fastest read of their bytes, and the step 1.22x;
 * read as four streams, 1.11x and 1.17x (docs/PERFORMANCE.md, "Decode at
 * B = 1, tenth round"). A tile prefetches the next row of each part, the
 * last tile the rows read after it: the last rows, or else the range read
 * next (learnt then). An element's order over k is the tile's, so the
 * bits are those of every other kernel.
 */
__attribute__((target("avx2,fma,f16c"))) static void gemm_few(float *y, const float *x, const hi3_wmat *w, int M,
                                                              int n0, int n1, struct pf_block *after)
{
	const int K = w->K, kind = wkind(w->dtype), S = NS(M), h = (n1 - n0) / S, t0 = n0 + S * h;
	const unsigned char *tr = (const unsigned char *)w->data + (size_t)t0 * (size_t)K * hi3_dtype_size(w->dtype);

	if (h > 0)
		few_rows_avx2(M, kind, y, x, w, n0, h, t0 < n1 ? tr : NULL, after);
	if (t0 < n1) {
		struct tile_args a = {.x = x, .ldx = (size_t)K, .w = tr, .ldw = (size_t)K, .k0 = 0, .k1 = K, .K = K,
		                      .y = y + t0, .ldy = (size_t)w->N};
		tile_avx2(M, n1 - t0, kind, &a);
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

/*
 * The AVX-512 kernel. A zmm register holds the eight lanes of two
 * elements, rows 2i and 2i + 1 of x against one W row:
 * [lanes of (2i, j) | lanes of (2i + 1, j)]. x is packed once per block
 * of rows so that a pair's eight k of a step are one 64-byte load; a W
 * row's eight k are loaded once and put in both halves (widened in
 * registers for BF16 and F16: wload512, the one place a weight format is
 * read). A register tile is P5 pairs by NR5 W rows, 24 accumulators; the
 * lanes are those of gemm.h, so the bits are those of the other kernels.
 */
#define P5 4                      /* pairs of x rows in a register tile */
#define NR5 6                     /* W rows (output columns) in a register tile */
#define MR5 (2 * P5)              /* rows of x in a register tile */
#define MC5 192                   /* rows of x packed at a time (a multiple of MR5) */
#define KS5 576                   /* steps of 8 k per slice: K up to 4608 in one */
#define KP5 288                   /* the same, when a slice is dequantized into a panel */
#define NC5 (NR5 * 8)             /* columns per chunk */
#define ACC5 (P5 * NR5 * 16)      /* floats of a tile's carried lanes */
#define T512 HI3I_T512

/* Packed x of a block of mc rows, K wide: per row tile of MR5 rows, K8 / 8
 * steps of P5 pairs of 16 floats (the pair's eight k, row 2i then 2i + 1),
 * then K - K8 tail steps of P5 pairs with the one k in lanes 0 and 8 (0
 * elsewhere); rows past mc are 0. */
static size_t pack_tile_floats(int K)
{
	return (size_t)((K & ~7) / 8 + (K & 7)) * P5 * 16;
}

static void pack512(float *xp, const float *x, size_t ldx, int mc, int K)
{
	const int K8 = K & ~7, nkb = K8 / 8, nt = K - K8;
	const size_t ts = pack_tile_floats(K);

	for (int t = 0; t < (mc + MR5 - 1) / MR5; t++) {
		float *d = xp + (size_t)t * ts;
		for (int r = 0; r < MR5; r++) {
			const int m = t * MR5 + r;
			const float *xr = m < mc ? x + (size_t)m * ldx : NULL;
			float *o = d + (size_t)(r / 2) * 16 + (size_t)(r % 2) * 8;
			for (int b = 0; b < nkb; b++, o += P5 * 16) {
				if (xr)
					memcpy(o, xr + 8 * b, 8 * sizeof(float));
				else
					memset(o, 0, 8 * sizeof(float));
			}
			for (int k = 0; k < nt; k++, o += P5 * 16) {
				memset(o, 0, 8 * sizeof(float));
				o[0] = xr ? xr[K8 + k] : 0.0f;
			}
		}
	}
}

const uint8_t hi3i_bf16_ctl[64] __attribute__((aligned(64))) = {
#define BF(i) 0x80, 0x80, 2 * (i), 2 * (i) + 1
	BF(0), BF(1), BF(2), BF(3), BF(4), BF(5), BF(6), BF(7),
	BF(0), BF(1), BF(2), BF(3), BF(4), BF(5), BF(6), BF(7),
#undef BF
};

/* Weights i .. i + 7 of w (of kind) as f32, in both halves of a zmm. */
T512 __attribute__((always_inline)) static inline __m512 wload512(const void *w, int kind, size_t i, __m512i ctl)
{
	if (kind == WF16)
		return _mm512_cvtph_ps(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i))));
	return hi3i_load8x2((const unsigned char *)w + ES(kind) * i, kind == WBF16, ctl);
}

/* One register tile over the steps [kb0, kb0 + nkb) of a k slice. */
struct tile512_args {
	const float *xp;          /* the row tile's packed x at step kb0 */
	const float *xt;          /* its packed tail (read when last) */
	const unsigned char *w;   /* W row 0 of the column tile, from k = wk0 */
	size_t ldw;               /* bytes from one W row to the next */
	int wk0;
	int nr;                   /* W rows (columns) that exist, 1 .. NR5; the rest repeat the last */
	int kb0, nkb, K;
	int first, last;          /* the tile's first slice (lanes from 0) and last (y written) */
	float *part;              /* the lanes carried between slices (ACC5 floats) */
	float *y;                 /* row 0, column 0 of the tile in y */
	size_t ldy;
	int rows;                 /* rows of y to write, <= 2 P */
	const hi3_qweight *q;     /* a kind above WQ: the matrix, the W row of w, */
	int n0, bf;               /* whether its values are rounded to BF16 */
};

T512 __attribute__((always_inline)) static inline void tile512(const int P, const int kind,
                                                                 const struct tile512_args *a)
{
	const __m512i ctl = _mm512_load_si512((const void *)hi3i_bf16_ctl);
	const unsigned char *wr[NR5];
	const float *xp = a->xp;
	__m512 acc[P5][NR5];
	hi3i_qrow qr[NR5];

#pragma GCC unroll 6
	for (int j = 0; j < NR5; j++)
		wr[j] = a->w ? a->w + (size_t)HI3_MIN(j, a->nr - 1) * a->ldw : NULL;
	if (kind > WQ)
		for (int j = 0; j < NR5; j++)
			hi3i_qrow_init(&qr[j], a->q, a->n0 + HI3_MIN(j, a->nr - 1));
#pragma GCC unroll 4
	for (int i = 0; i < P; i++)
#pragma GCC unroll 6
		for (int j = 0; j < NR5; j++)
			acc[i][j] = a->first ? _mm512_setzero_ps() : _mm512_load_ps(a->part + (size_t)(i * NR5 + j) * 16);
	for (int s = 0; s < a->nkb; s++, xp += P5 * 16) {
		const size_t k = (size_t)(a->kb0 + s) * 8;
		__m512 xv[P5];
#pragma GCC unroll 4
		for (int i = 0; i < P; i++)
			xv[i] = _mm512_load_ps(xp + 16 * i);
#pragma GCC unroll 6
		for (int j = 0; j < NR5; j++) {
			const __m512 wv = kind > WQ ? hi3i_qrow_load16(&qr[j], kind - WQ, (int)k, a->bf)
			                            : wload512(wr[j], kind, k - (size_t)a->wk0, ctl);
#pragma GCC unroll 4
			for (int i = 0; i < P; i++)
				acc[i][j] = _mm512_fmadd_ps(xv[i], wv, acc[i][j]);
		}
	}
	if (!a->last) {
#pragma GCC unroll 4
		for (int i = 0; i < P; i++)
#pragma GCC unroll 6
			for (int j = 0; j < NR5; j++)
				_mm512_store_ps(a->part + (size_t)(i * NR5 + j) * 16, acc[i][j]);
		return;
	}
	/* the tail k into lane 0 of each element, in order */
	for (int t = 0, K8 = a->K & ~7; t < (a->K & 7); t++)
		for (int i = 0; i < P; i++) {
			const __m512 xv = _mm512_load_ps(a->xt + (size_t)t * P5 * 16 + 16 * i);
			for (int j = 0; j < NR5; j++)
				acc[i][j] = _mm512_mask3_fmadd_ps(
					xv, _mm512_set1_ps(kind > WQ ? hi3i_qweight_at(a->q, a->n0 + HI3_MIN(j, a->nr - 1), K8 + t)
					                             : w_elem(wr[j], kind, (size_t)(K8 + t - a->wk0))),
					acc[i][j], 0x0101);
		}
	{
		__m256 v[MR5 * NR5];
		float r[MR5 * NR5];
#pragma GCC unroll 4
		for (int i = 0; i < P; i++)
#pragma GCC unroll 6
			for (int j = 0; j < NR5; j++) {
				v[2 * i * NR5 + j] = _mm512_castps512_ps256(acc[i][j]);
				v[(2 * i + 1) * NR5 + j] = _mm512_extractf32x8_ps(acc[i][j], 1);
			}
		combine_n(v, 2 * P * NR5, r);
		for (int i = 0; i < a->rows; i++)
			memcpy(a->y + (size_t)i * a->ldy, r + i * NR5, sizeof(float) * (size_t)a->nr);
	}
}

#define TILE512_KINDS(p)                                  \
	case p:                                           \
		switch (kind) {                           \
		case WF32: tile512(p, WF32, a); break;    \
		case WBF16: tile512(p, WBF16, a); break;  \
		case WF16: tile512(p, WF16, a); break;    \
		case WQ + HI3I_QR_INT8: tile512(p, WQ + HI3I_QR_INT8, a); break; \
		case WQ + HI3I_QR_FP8: tile512(p, WQ + HI3I_QR_FP8, a); break; \
		case WQ + HI3I_QR_NF4: tile512(p, WQ + HI3I_QR_NF4, a); break; \
		default: tile512(p, WQ + HI3I_QR_NVFP4, a); break; \
		}                                         \
		break;

T512 static void tile512_any(int P, int kind, const struct tile512_args *a)
{
	switch (P) {
		TILE512_KINDS(1) TILE512_KINDS(2) TILE512_KINDS(3) TILE512_KINDS(4)
	}
}

/* Columns [n0, n1) of y = x W^T for rows [0, M), on one thread; xp holds
 * a packed block (MC5 rows), part the lanes of a chunk's tiles; panel
 * (quantized weights not decoded in the tile) a chunk's k slice
 * dequantized, NC5 x (KP5 8 + 7) floats. */
static void gemm512(float *y, const float *x, const hi3_wmat *w, int M, int n0, int n1, float *xp, float *part,
                    float *panel)
{
	const int K = w->K, N = w->N, nkb = (K & ~7) / 8, ks = panel ? KP5 : KS5;
	const int kind = panel ? WF32 : w->q ? WQ + hi3i_qrow_kind(w->q) : wkind(w->dtype);
	const size_t es = hi3_dtype_size(w->dtype), ts = pack_tile_floats(K), ldw = w->q ? 0 : (size_t)K * es;
	const int bf = w->q && w->q->round_to == HI3_BF16;

	for (int m0 = 0; m0 < M; m0 += MC5) {
		const int mc = HI3_MIN(MC5, M - m0), nt = (mc + MR5 - 1) / MR5;

		pack512(xp, x + (size_t)m0 * K, (size_t)K, mc, K);
		for (int c0 = n0; c0 < n1; c0 += NC5) {
			const int c1 = HI3_MIN(n1, c0 + NC5);
			int kb0 = 0;
			do {
				const int kb1 = HI3_MIN(nkb, kb0 + ks), pk0 = 8 * kb0, pl = (kb1 == nkb ? K : 8 * kb1) - pk0;

				if (panel)
					hi3i_qweight_rows(w->q, panel, (size_t)pl, c0, c1 - c0, pk0, pl);
				for (int t = 0; t < nt; t++) {
					const int rows = HI3_MIN(MR5, mc - t * MR5);
					for (int j0 = c0; j0 < c1; j0 += NR5) {
						struct tile512_args a = {
							.xp = xp + (size_t)t * ts + (size_t)kb0 * P5 * 16,
							.xt = xp + (size_t)t * ts + (size_t)nkb * P5 * 16,
							.w = panel ? (const unsigned char *)(panel + (size_t)(j0 - c0) * (size_t)pl)
							           : w->q ? w->q->codes   /* read through a.q (hi3i_qrow) */
							           : !w->data ? NULL      /* an empty matrix */
							                  : (const unsigned char *)w->data + (size_t)j0 * ldw,
							.ldw = panel ? sizeof(float) * (size_t)pl : ldw, .wk0 = panel ? pk0 : 0, .nr = HI3_MIN(NR5, c1 - j0), .kb0 = kb0, .nkb = kb1 - kb0, .K = K,
							.first = kb0 == 0, .last = kb1 == nkb,
							.part = part ? part + ((size_t)t * (NC5 / NR5) + (size_t)(j0 - c0) / NR5) * ACC5 : NULL,
							.y = y + (size_t)(m0 + t * MR5) * N + j0, .ldy = (size_t)N, .rows = rows,
							.q = w->q, .n0 = j0, .bf = bf};
						tile512_any((rows + 1) / 2, kind, &a);
					}
				}
				kb0 = kb1;
			} while (kb0 < nkb);
		}
	}
}

static int isa_max = 2;            /* hi3i_gemm_isa */

/* 2: AVX-512 (F, VL, BW, DQ) with AVX2, FMA and F16C; 1: AVX2, FMA and
 * F16C; 0: none (the portable kernel), capped by hi3i_gemm_isa. */
static int isa(void)
{
	static int v = -1;

	if (v < 0) {
		__builtin_cpu_init();
		unsigned a, b, c, d;
		/* F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports
		 * does not know "f16c" (an error in the fuzzing build) */
		int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
		v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
		if (v && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
		    __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
			v = 2;
	}
	return HI3_MIN(v, isa_max);
}
#endif

int hi3i_gemm_level(void)
{
#ifdef HAVE_X86
	return isa();
#else
	return 0;
#endif
}

int hi3i_gemm_prefetch_l1(void)
{
#ifdef HAVE_X86
	return few_pf_of_core().t0;
#else
	return 0;
#endif
}

int hi3i_gemm_isa(int max)
{
#ifdef HAVE_X86
	isa_max = max < 0 ? 2 : max;
	return isa();
#else
	(void)max;
	return 0;
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
 * widened chunk slice (narrow weights, more than WIDEN_ROWS rows; quantized
 * ones the AVX2 kernel cannot read in registers, or more rows than that). */
struct scratch {
	float *part;              /* (MC / BR, chunk tiles, BR BN, 8) */
	float *wide;              /* (chunk rows, KC) */
	int qk;                   /* a quantized w read in registers: its hi3i_qrow_kind */
};

static int scratch_get(struct scratch *s, const hi3_wmat *w, int M)
{
	const size_t qc = (size_t)chunk_tiles(w->K), kc = (size_t)slice_k(w->K);

	s->part = s->wide = NULL;
	s->qk = HI3I_QR_NONE;
#ifdef HAVE_X86
	if (w->q && isa() >= 1 && M <= WIDEN_ROWS)
		s->qk = hi3i_qrow_kind(w->q);
#endif
	if (w->K > KC && !(s->part = malloc(sizeof(float) * ((MC + BR - 1) / BR) * qc * BR * BN * 8)))
		return -1;
	if (((w->q && !s->qk) || (!w->q && w->dtype != HI3_F32 && M > WIDEN_ROWS)) &&
	    !(s->wide = malloc(sizeof(float) * qc * BN * kc))) {
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
	const int simd = isa() >= 1;
#else
	const int simd = 0;
#endif

	for (int c0 = q0; c0 < q1; c0 += qc) {
		const int c1 = HI3_MIN(q1, c0 + qc), n0 = c0 * BN, nc = HI3_MIN(N, c1 * BN) - n0;
		const unsigned char *wc = w->q ? NULL : (const unsigned char *)w->data + (size_t)n0 * (size_t)K * es;

		for (int k0 = 0; k0 < K; k0 += kc) {
			const int k1 = HI3_MIN(K, k0 + kc);
			struct tile_args a = {.ldx = (size_t)K, .w = wc, .ldw = (size_t)K, .wk0 = 0, .k0 = k0, .k1 = k1,
			                      .K = K, .ldy = (size_t)N};
			int kind = kind0;
			size_t wes = es;

			if (s->qk) {
				/* a quantized chunk read in registers */
				a.w = w->q->codes;
				a.ldw = 0;
				a.q = w->q;
				a.bf = w->q->round_to == HI3_BF16;
				kind = WQ + s->qk;
			} else if (w->q) {
				/* a quantized chunk: its k slice dequantized here */
				hi3i_qweight_rows(w->q, s->wide, (size_t)(k1 - k0), n0, nc, k0, k1 - k0);
				a.w = s->wide;
				a.ldw = (size_t)(k1 - k0);
				a.wk0 = k0;
				kind = WF32;
				wes = sizeof(float);
			}
#ifdef HAVE_X86
			else if (simd && kind != WF32 && s->wide) {
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
					t.n0 = n0 + j0;
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

/* Threads split y's columns in units of SPLIT (a multiple of BN and NR5). */
#define SPLIT 6

static int n_tiles(const hi3_wmat *w)
{
	return (w->N + SPLIT - 1) / SPLIT;
}

/* Whether rows [0, M) against w take the few-row tiles (gemm_few). */
static int takes_few(const hi3_wmat *w, int M)
{
#ifdef HAVE_X86
	return isa() >= 1 && M <= BR && !w->q && w->data;
#else
	(void)w;
	(void)M;
	return 0;
#endif
}

/* The first tile's bytes of split units [q0, q1) of w against M rows,
 * when the few-row tiles read them; else none. */
static struct pf_block first_tile(const hi3_wmat *w, int M, int64_t q0, int64_t q1)
{
	struct pf_block b = {{NULL}, 0, NULL};
#ifdef HAVE_X86
	const int64_t n0 = q0 * SPLIT, n1 = HI3_MIN((int64_t)w->N, q1 * SPLIT);

	if (n0 < n1 && takes_few(w, M))
		b = first_rows(w, M, (int)n0, (int)n1);
#endif
	return b;
}

/* Rows [0, M) against split units [q0, q1) of w, on one thread; after:
 * what the thread reads next, for the few-row tiles to prefetch. */
static void gemm_range(float *y, const float *x, const hi3_wmat *w, int M, int q0, int q1,
                       struct pf_block *after, int *failed)
{
	const int n0 = q0 * SPLIT, n1 = HI3_MIN(w->N, q1 * SPLIT);
	struct scratch s;

	if (n0 >= n1)
		return;
#ifdef HAVE_X86
	if (takes_few(w, M)) {
		gemm_few(y, x, w, M, n0, n1, after);
		return;
	}
	/* quantized weights are decoded in the tile's registers for a few rows
	 * (decode); for more, decoding them again for every 8 rows costs more
	 * than dequantizing a chunk's k slice once into a panel that the block's
	 * row tiles read (measured, scripts/bench-gemm quant: the two cross
	 * near 24 rows), and forms the decoders do not read always take it */
	const int q512 = w->q && hi3i_qrow_kind(w->q) != HI3I_QR_NONE && M <= WIDEN_ROWS;

	if (isa() >= 2 && M >= MR5) {
		const int mc = HI3_MIN(M, MC5), nt = (mc + MR5 - 1) / MR5, ks = w->q && !q512 ? KP5 : KS5;
		float *xp = hi3i_aligned_alloc(sizeof(float) * (size_t)nt * pack_tile_floats(w->K), NULL);
		float *part = w->K > ks * 8 ? hi3i_aligned_alloc(sizeof(float) * (size_t)nt * (NC5 / NR5) * ACC5, NULL)
		                            : NULL;
		float *panel = w->q && !q512 ? malloc(sizeof(float) * NC5 * (KP5 * 8 + 7)) : NULL;
		if (xp && (part || w->K <= ks * 8) && (panel || !w->q || q512))
			gemm512(y, x, w, M, n0, n1, xp, part, panel);
		else
			*failed = 1;
		free(xp);
		free(part);
		free(panel);
		return;
	}
#endif
	if (scratch_get(&s, w, M) != 0) {
		*failed = 1;
		return;
	}
	for (int m0 = 0; m0 < M; m0 += MC)
		gemm_tiles(y, x, w, m0, HI3_MIN(MC, M - m0), n0 / BN, (n1 + BN - 1) / BN, &s);
	scratch_release(&s);
}

/*
 * A product of few rows (on the pool: a decode step's) is not split in
 * equal parts: threads take ranges of split units from a shared counter,
 * each about a 2nt-th of what is left (at least CLAIM_MIN units), so a
 * thread that starts late or runs slow takes less and the others do not
 * wait for it at the end. Ranges start on multiples of CLAIM_ALIGN units
 * (24 columns: every range but a matrix's last splits into gemm_few's 4
 * or 2 equal parts). Who computes an
 * element changes; its order over k does not.
 */
#define CLAIM_ALIGN 4
#define CLAIM_MIN 4

/* The next range [*q0, *q1) of [0, total) units; 0 when none is left. */
static int claim(_Atomic int64_t *next, int64_t total, int nt, int64_t *q0, int64_t *q1)
{
	int64_t cur = atomic_load_explicit(next, memory_order_relaxed), size;

	do {
		if (cur >= total)
			return 0;
		size = (total - cur) / (2 * nt);
		size = HI3_MAX((size + CLAIM_ALIGN - 1) / CLAIM_ALIGN * CLAIM_ALIGN, CLAIM_MIN);
		size = HI3_MIN(size, total - cur);
	} while (!atomic_compare_exchange_weak_explicit(next, &cur, cur + size, memory_order_relaxed,
	                                                memory_order_relaxed));
	*q0 = cur;
	*q1 = cur + size;
	return 1;
}

/* One product, split between nt threads (hi3i_gemm). */
struct gemm_job {
	float *y;
	const float *x;
	const hi3_wmat *w;
	int M, nq, by_rows;
	_Atomic int failed;
};

/* Threads split the columns; a product of few columns and many rows
 * (attention's P V) splits the rows instead, in tiles of 8, so that no
 * thread packs rows it does not use. Either way an element is one
 * thread's, in the order of gemm.h. */
static void gemm_part(void *p, int id, int nt)
{
	struct gemm_job *j = p;
	int failed = 0;

	if (j->by_rows) {
		const int nb = (j->M + 7) / 8, m0 = 8 * (int)((int64_t)nb * id / nt);
		const int m1 = HI3_MIN(j->M, 8 * (int)((int64_t)nb * (id + 1) / nt));
		if (m0 < m1)
			gemm_range(j->y + (size_t)m0 * j->w->N, j->x + (size_t)m0 * j->w->K, j->w, m1 - m0, 0, j->nq,
			           NULL, &failed);
	} else {
		gemm_range(j->y, j->x, j->w, j->M, (int)((int64_t)j->nq * id / nt), (int)((int64_t)j->nq * (id + 1) / nt),
		           NULL, &failed);
	}
	if (failed)
		atomic_store(&j->failed, 1);
}

/* Run part on the threads: a product of a few rows of x (a decode step's:
 * short, dozens a step) on the pool's team, whose workers are still awake
 * from the product before, as a shared job (its ranges are claims, so a
 * worker that comes late is not waited for); others in an OpenMP region. */
static void run_parts(hi3i_pool_fn part, void *job, int few, int parallel)
{
	if (!parallel) {
		part(job, 0, 1);
	} else if (few) {
		hi3i_pool_share(part, job, omp_get_max_threads());
	} else {
#pragma omp parallel
		part(job, omp_get_thread_num(), omp_get_num_threads());
	}
}

/* n independent products, split between nt threads (hi3i_gemm_group). */
struct group_job {
	int n;
	float *const *y;
	const float *const *x;
	const hi3_wmat *const *w;
	const int *M;
	int64_t total;
	int claims;               /* few rows: ranges taken from next (claim) */
	_Atomic int64_t next;
	_Atomic int failed;
};

/* Units a product has in the group's union: with claims rounded up so
 * that every product starts on a multiple of CLAIM_ALIGN. */
static int64_t group_units(const hi3_wmat *w, int claims)
{
	const int64_t nq = n_tiles(w);

	return claims ? (nq + CLAIM_ALIGN - 1) / CLAIM_ALIGN * CLAIM_ALIGN : nq;
}

/* Units [q0, q1) of the union of every job's column tiles; after: what
 * the thread reads next (or NULL). Each product's piece runs once the next
 * piece is known, whose first tile it prefetches; the last piece, after. */
static void group_range(struct group_job *j, int64_t q0, int64_t q1, struct pf_block *after, int *failed)
{
	int64_t base = 0;
	int at = -1, a0 = 0, a1 = 0; /* the piece waiting to run: product at, units [a0, a1) */

	for (int i = 0; i <= j->n; i++) {
		const hi3_wmat *w = i < j->n ? j->w[i] : NULL;
		int p0 = 0, p1 = 0;
		if (w && (j->M[i] <= 0 || w->N <= 0))
			continue;
		if (w && base < q1) {
			const int nq = n_tiles(w);
			p0 = (int)HI3_MAX(q0 - base, 0);
			p1 = (int)HI3_MIN(q1 - base, nq);
			base += group_units(w, j->claims);
			if (p0 >= p1)
				continue;
		}
		if (at >= 0) {
			const hi3_wmat *wa = j->w[at];
			struct pf_block nx = {{NULL}, 0, NULL};
			if (p0 < p1 && w->K)
				nx = first_tile(w, j->M[i], p0, p1);
			if (wa->K == 0) {
				if (a0 == 0)
					memset(j->y[at], 0, sizeof(float) * (size_t)j->M[at] * (size_t)wa->N);
			} else {
				gemm_range(j->y[at], j->x[at], wa, j->M[at], a0, a1, p0 < p1 ? &nx : after, failed);
			}
		}
		if (p0 >= p1)
			break;
		at = i;
		a0 = p0;
		a1 = p1;
	}
}

/* The first tile of units [q0, q1) of the union (first_tile). */
static struct pf_block group_first(const struct group_job *j, int64_t q0, int64_t q1)
{
	int64_t base = 0;

	for (int i = 0; i < j->n && base < q1; i++) {
		const hi3_wmat *w = j->w[i];
		if (j->M[i] <= 0 || w->N <= 0)
			continue;
		const int64_t nq = n_tiles(w), p0 = HI3_MAX(q0 - base, 0), p1 = HI3_MIN(q1 - base, nq);
		if (p0 < p1)
			return w->K ? first_tile(w, j->M[i], p0, p1) : (struct pf_block){{NULL}, 0, NULL};
		base += group_units(w, j->claims);
	}
	return (struct pf_block){{NULL}, 0, NULL};
}

/* group_part's next range: taken from the counter when the last tile of
 * the range before needs its first bytes (learn_next), or after it. */
struct next_range {
	struct pf_block b;        /* first: what the last tile learns */
	struct group_job *j;
	int nt, more;
	int64_t q0, q1;
};

static void learn_next(struct pf_block *b)
{
	struct next_range *r = (struct next_range *)b;

	r->b.learn = NULL;
	if ((r->more = claim(&r->j->next, r->j->total, r->nt, &r->q0, &r->q1))) {
		const struct pf_block f = group_first(r->j, r->q0, r->q1);
		memcpy(r->b.p, f.p, sizeof(f.p));
		r->b.n = f.n;
	}
}

/* The union split evenly, or taken by claims. */
static void group_part(void *p, int id, int nt)
{
	struct group_job *j = p;
	int64_t q0, q1, r0 = 0, r1 = 0;
	int failed = 0;

	if (!j->claims)
		group_range(j, j->total * id / nt, j->total * (id + 1) / nt, NULL, &failed);
	else /* the next range is taken when the last tile of this one starts,
	      * which prefetches its first (learn_next): a range taken earlier
	      * waits idle while this one runs, and at the end of the job the
	      * other threads wait for it (measured: 1.5-3% of a decode step's
	      * products) */
		for (int more = claim(&j->next, j->total, nt, &q0, &q1); more && !failed; q0 = r0, q1 = r1) {
			struct next_range nx = {{{NULL}, 0, learn_next}, j, nt, 0, 0, 0};
			group_range(j, q0, q1, &nx.b, &failed);
			if (nx.b.learn)       /* no full tile asked for it */
				learn_next(&nx.b);
			more = nx.more;
			r0 = nx.q0;
			r1 = nx.q1;
		}
	if (failed)
		atomic_store(&j->failed, 1);
}

/* Bytes of the first products' W a hint reads ahead: about what one
 * idle worker reads in the 5-15 us of small ops between a decode step's
 * products (measured: 0.4 ms of them a step on `small`, 4-5 gaps a layer). */
#define PREFETCH_BYTES ((size_t)192 << 10)

void hi3i_gemm_prefetch(int n, const hi3_wmat *const *w, const int *M)
{
	/* the union's first product with rows and columns: its ranges are
	 * claimed from its first column on (claim); a group's are taken in
	 * the order given */
	for (int i = 0; i < n; i++) {
		if (M[i] <= 0 || w[i]->N <= 0)
			continue;
		if (M[i] <= HI3I_POOL_ROWS && w[i]->K > 0 && !w[i]->q && w[i]->data)
			hi3i_pool_prefetch(w[i]->data, HI3_MIN(PREFETCH_BYTES, (size_t)w[i]->N * (size_t)w[i]->K *
			                                                          hi3_dtype_size(w[i]->dtype)));
		return;
	}
}

int hi3i_gemm_group(int n, float *const *y, const float *const *x, const hi3_wmat *const *w, const int *M)
{
	struct group_job j = {n, y, x, w, M, 0, 1, 0, 0};

	for (int i = 0; i < n; i++)
		if (M[i] > 0 && w[i]->N > 0)
			j.claims &= M[i] <= HI3I_POOL_ROWS;
	for (int i = 0; i < n; i++)
		if (M[i] > 0 && w[i]->N > 0)
			j.total += group_units(w[i], j.claims);
	if (!j.total)
		return 0;
	/* one parallel region over the union of every job's column tiles */
	run_parts(group_part, &j, j.claims, j.total > 1);
	return atomic_load(&j.failed) ? -1 : 0;
}

int hi3i_gemm(float *y, const float *x, const hi3_wmat *w, int M)
{
	const int N = w->N, K = w->K, nq = n_tiles(w), by_rows = nq < 32 && M >= 256;
	const int parallel = (nq > 1 || by_rows) && (double)M * N * K >= 1 << 18;

	if (M <= 0 || N <= 0)
		return 0;
	if (K == 0) {
		memset(y, 0, sizeof(float) * (size_t)M * (size_t)N);
		return 0;
	}
	if (M <= HI3I_POOL_ROWS) {
		/* a group of one, its ranges claimed on the pool's team */
		struct group_job g = {1, &y, &x, &w, &M, group_units(w, 1), 1, 0, 0};
		run_parts(group_part, &g, 1, parallel);
		return atomic_load(&g.failed) ? -1 : 0;
	}
	struct gemm_job j = {y, x, w, M, nq, by_rows, 0};
	run_parts(gemm_part, &j, 0, parallel);
	return atomic_load(&j.failed) ? -1 : 0;
}
