/*
 * cpu-conv.c -- the CPU backend's convolution (the conv op, backend.h): a
 * direct convolution over the weight as stored, [Cout, C, kt, kh, kw] in
 * the checkpoint's mapping (F32, BF16 or F16), with no im2col matrix and
 * no copy of the weight.
 *
 * Order: every output element is one fused multiply-add chain over
 * k = ((c kt + dt) kh + dy) kw + dx, the weight's own order, from 0 (a tap
 * outside the image multiplies a zero), then the bias is added. Nothing in
 * it depends on the image's place in the batch, a position's place in a
 * tile, the thread count or the kernel (AVX-512, AVX2, portable): an image
 * gives the same bits alone or batched, and every kernel the same bits.
 * A 3 x 3 spatial kernel over even frames of 256 positions or more, with
 * 16 channels or more in and out, runs as Winograd F(2x2, 3x3) instead
 * (the section "Winograd" below): another fixed order, with the same
 * guarantees; which of the two a conv takes is a function of its shape
 * alone (hi3i_cpu_conv_is_winograd).
 *
 * How: the frames an image's output rows need are packed channels-first
 * with a zero border (pack), optionally through a GroupNorm and an
 * activation (the conv's input is then act(groupnorm(x)), as the groupnorm
 * op would give it, bit for bit), so that a tap is a fixed offset and the
 * output positions of a frame, row after row at the packed row stride Wp,
 * are consecutive (the Wp - W columns between rows are computed and
 * dropped); the zero frames before and after the image are not packed,
 * and a frame's tiles leave out the taps that would read them (exact:
 * see conv_packed). The packed input lives in the backend's scratch, or
 * when large in a buffer of the conv's own, on 2 MiB pages (a tile reads
 * dozens of channel planes at once). A register tile
 * is TP = 32 positions by up to TC = 12 output channels: per (c, tap) two
 * 16-float loads of the packed input and one broadcast weight per channel
 * (AVX-512: 24 accumulators). A thread takes a share of the position
 * tiles (or, when they are few, of the channel tiles); it walks them in
 * blocks, and over each block the input channels in blocks whose weights
 * (for its channel tiles) stay in L2, every tile's partial sums stored and
 * reloaded between channel blocks (exact for a single chain).
 *
 * Layout: images channels-last (B, T, H, W, C), P = T H W (backend.h).
 */
#include <math.h>
#include <omp.h>
#include <string.h>
#include "backend/cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define HAVE_X86 1
#endif

#define TP 32                     /* output positions in a tile */
#define TC 12                     /* output channels in a tile */

enum { WF32, WBF16, WF16 };

/* Weight i of w (of kind) as f32: the one place a weight format is read. */
static inline float wget(const void *w, int kind, size_t i)
{
	if (kind == WBF16) {      /* hi3_bf16_to_f32, inline: the kernels call it per weight */
		const uint32_t u = (uint32_t)((const uint16_t *)w)[i] << 16;
		float f;
		memcpy(&f, &u, sizeof(f));
		return f;
	}
	if (kind == WF16)
		return hi3_f16_to_f32(((const uint16_t *)w)[i]);
	return ((const float *)w)[i];
}

/* A conv of one image, in the packed frame. */
struct cgeom {
	int C, Cout, taps, kind, kw;
	const unsigned char *w;   /* row co at w + co * C * taps * es */
	size_t wrow;              /* bytes of a weight row */
	const float *xp;          /* packed input: channel c at xp + c * cs */
	size_t cs;                /* floats of a packed channel */
	const int *off;           /* (taps): the packed offset of each tap */
};

/* One register tile: positions v0 .. v0 + TP - 1 of the packed frames
 * (v0 + off[t] >= 0 for a tap t in [t0, t1)), output channels co0 .. co0 +
 * nc - 1, input channels [c0, c1), taps [t0, t1) of each. acc (TC, TP)
 * holds the partial sums in (read when c0 > 0) and out. */
static void tile_portable(const struct cgeom *g, ptrdiff_t v0, int t0, int t1, int co0, int nc, int c0, int c1,
                          float *acc)
{
	if (c0 == 0)
		memset(acc, 0, sizeof(float) * TC * TP);
	for (int j = 0; j < nc; j++) {
		const unsigned char *wr = g->w + (size_t)(co0 + j) * g->wrow;
		float *a = acc + j * TP;
		for (int c = c0; c < c1; c++) {
			const float *x = g->xp + (size_t)c * g->cs;
			for (int t = t0; t < t1; t++) {
				const float wv = wget(wr, g->kind, (size_t)c * g->taps + t);
				const float *xt = x + (v0 + g->off[t]);
				for (int i = 0; i < TP; i++)
					a[i] = fmaf(xt[i], wv, a[i]);
			}
		}
	}
}

#ifdef HAVE_X86
/* AVX2: two 8-float vectors of positions by 6 channels (12 accumulators),
 * over the tile's two halves of positions and of channels in turn. */
__attribute__((target("avx2,fma"))) static void tile_avx2(const struct cgeom *g, ptrdiff_t v0, int t0, int t1, int co0,
                                                          int nc, int c0, int c1, float *acc)
{
	for (int h = 0; h < TP / 16; h++)
		for (int j0 = 0; j0 < nc; j0 += 6) {
			const int taps = g->taps, kind = g->kind;
			const unsigned char *wr[6];
			__m256 a[6][2];

			for (int j = 0; j < 6; j++)
				wr[j] = g->w + (size_t)(co0 + HI3_MIN(j0 + j, nc - 1)) * g->wrow;
#pragma GCC unroll 6
			for (int j = 0; j < 6; j++)
#pragma GCC unroll 2
				for (int i = 0; i < 2; i++)
					a[j][i] = c0 ? _mm256_loadu_ps(acc + (j0 + j) * TP + 16 * h + 8 * i) : _mm256_setzero_ps();
			for (int c = c0; c < c1; c++) {
				const float *x = g->xp + (size_t)c * g->cs + 16 * h;
				const size_t k0 = (size_t)c * taps;
				for (int t = t0; t < t1; t++) {
					const float *xt = x + (v0 + g->off[t]);
					const __m256 x0 = _mm256_loadu_ps(xt), x1 = _mm256_loadu_ps(xt + 8);
#pragma GCC unroll 6
					for (int j = 0; j < 6; j++) {
						const __m256 wv = _mm256_set1_ps(wget(wr[j], kind, k0 + t));
						a[j][0] = _mm256_fmadd_ps(x0, wv, a[j][0]);
						a[j][1] = _mm256_fmadd_ps(x1, wv, a[j][1]);
					}
				}
			}
			for (int j = 0; j < 6 && j0 + j < nc; j++)
				for (int i = 0; i < 2; i++)
					_mm256_storeu_ps(acc + (j0 + j) * TP + 16 * h + 8 * i, a[j][i]);
		}
}

/* AVX-512: two 16-float vectors of positions by 12 channels (24
 * accumulators); a channel past nc repeats the last one and is dropped. */
#define T512 __attribute__((target("avx512f,avx2,fma")))
/* A tile's n channels of accumulators from acc (zero when c0 = 0), and back. */
T512 __attribute__((always_inline)) static inline void acc512_in(__m512 a[][2], const float *acc, const int n, int c0)
{
#pragma GCC unroll 12
	for (int j = 0; j < n; j++)
#pragma GCC unroll 2
		for (int i = 0; i < 2; i++)
			a[j][i] = c0 ? _mm512_loadu_ps(acc + j * TP + 16 * i) : _mm512_setzero_ps();
}

T512 __attribute__((always_inline)) static inline void acc512_out(__m512 a[][2], float *acc, const int n)
{
#pragma GCC unroll 12
	for (int j = 0; j < n; j++)
#pragma GCC unroll 2
		for (int i = 0; i < 2; i++)
			_mm512_storeu_ps(acc + j * TP + 16 * i, a[j][i]);
}

T512 __attribute__((always_inline)) static inline void tile512_k(const struct cgeom *g, ptrdiff_t v0, int t0, int t1,
                                                                 int co0, int nc, int c0, int c1, float *acc,
                                                                 const int kind)
{
	const int taps = g->taps;
	const unsigned char *wr[TC];
	__m512 a[TC][2];

#pragma GCC unroll 12
	for (int j = 0; j < TC; j++)
		wr[j] = g->w + (size_t)(co0 + HI3_MIN(j, nc - 1)) * g->wrow;
	acc512_in(a, acc, TC, c0);
	for (int c = c0; c < c1; c++) {
		const float *x = g->xp + (size_t)c * g->cs;
		const size_t k0 = (size_t)c * taps;
		for (int t = t0; t < t1; t++) {
			const float *xt = x + (v0 + g->off[t]);
			const __m512 x0 = _mm512_loadu_ps(xt), x1 = _mm512_loadu_ps(xt + 16);
#pragma GCC unroll 12
			for (int j = 0; j < TC; j++) {
				const __m512 wv = _mm512_set1_ps(wget(wr[j], kind, k0 + t));
				a[j][0] = _mm512_fmadd_ps(x0, wv, a[j][0]);
				a[j][1] = _mm512_fmadd_ps(x1, wv, a[j][1]);
			}
		}
	}
	acc512_out(a, acc, TC);
}

/* The same tile for kw = 3 and nch = 4, 8 or 12 channels (every Cout the
 * VAE has leaves a last tile of 4 or 8), in the same order: a row of taps
 * (dt, dy) at a time, its three dx unrolled, and the weights addressed as
 * nch / 4 pointers (row co0 + 4 i) plus 0, 1, 2, 3 row strides, so that the
 * inner loop needs a few registers where tile512_k's twelve row pointers
 * spill. */
T512 __attribute__((always_inline)) static inline void tile512_k3(const struct cgeom *g, ptrdiff_t v0, int t0, int t1,
                                                                  int co0, int c0, int c1, float *acc, const int kind,
                                                                  const int nch, const int kwn)
{
	const size_t es = kind == WF32 ? 4 : 2, rs = g->wrow / es;   /* elements from a weight row to the next */
	const int taps = g->taps;
	__m512 a[TC][2];

	acc512_in(a, acc, nch, c0);
	for (int c = c0; c < c1; c++) {
		const float *x = g->xp + (size_t)c * g->cs;
		const unsigned char *wc = g->w + (size_t)co0 * g->wrow + (size_t)c * taps * es;
		for (int t = t0; t < t1; t += kwn) {
			const float *xt = x + (v0 + g->off[t]);
#pragma GCC unroll 3
			for (int dx = 0; dx < kwn; dx++) {
				const __m512 x0 = _mm512_loadu_ps(xt + dx), x1 = _mm512_loadu_ps(xt + dx + 16);
#pragma GCC unroll 3
				for (int q = 0; q < nch / 4; q++) {
					const unsigned char *wq = wc + ((size_t)(4 * q) * rs + (size_t)(t + dx)) * es;
#pragma GCC unroll 4
					for (int r = 0; r < 4; r++) {
						const __m512 wv = _mm512_set1_ps(wget(wq, kind, (size_t)r * rs));
						a[4 * q + r][0] = _mm512_fmadd_ps(x0, wv, a[4 * q + r][0]);
						a[4 * q + r][1] = _mm512_fmadd_ps(x1, wv, a[4 * q + r][1]);
					}
				}
			}
		}
	}
	acc512_out(a, acc, nch);
}

#define TILE512_K3(kind, kwn)                                                     \
	do {                                                                          \
		if (nc == 12)                                                         \
			tile512_k3(g, v0, t0, t1, co0, c0, c1, acc, kind, 12, kwn);    \
		else if (nc == 8)                                                     \
			tile512_k3(g, v0, t0, t1, co0, c0, c1, acc, kind, 8, kwn);     \
		else                                                                  \
			tile512_k3(g, v0, t0, t1, co0, c0, c1, acc, kind, 4, kwn);     \
	} while (0)

/* The same tile for kw = 1, F32 weights, nt = t1 - t0 <= 3 taps and nch =
 * 4, 8 or 12 channels (the Winograd products, 1x1 convs), in the same
 * order: a pointer per tap into the input and one into the weights, each
 * advanced by a channel, so that a channel's few taps carry no set-up. */
T512 __attribute__((always_inline)) static inline void tile512_t(const struct cgeom *g, ptrdiff_t v0, int t0, int co0,
                                                                 int c0, int c1, float *acc, const int nch,
                                                                 const int nt)
{
	const size_t rs = g->wrow / sizeof(float), cs = g->cs;
	const int taps = g->taps;
	const float *xt[3];
	const float *wc = (const float *)g->w + (size_t)co0 * rs + (size_t)c0 * taps + t0;
	__m512 a[TC][2];

#pragma GCC unroll 3
	for (int t = 0; t < nt; t++)
		xt[t] = g->xp + (size_t)c0 * cs + (v0 + g->off[t0 + t]);
	acc512_in(a, acc, nch, c0);
	for (int c = c0; c < c1; c++) {
#pragma GCC unroll 3
		for (int t = 0; t < nt; t++) {
			const __m512 x0 = _mm512_loadu_ps(xt[t]), x1 = _mm512_loadu_ps(xt[t] + 16);
#pragma GCC unroll 3
			for (int q = 0; q < nch / 4; q++) {
				const float *wq = wc + (size_t)(4 * q) * rs + t;
#pragma GCC unroll 4
				for (int r = 0; r < 4; r++) {
					const __m512 wv = _mm512_set1_ps(wq[(size_t)r * rs]);
					a[4 * q + r][0] = _mm512_fmadd_ps(x0, wv, a[4 * q + r][0]);
					a[4 * q + r][1] = _mm512_fmadd_ps(x1, wv, a[4 * q + r][1]);
				}
			}
			xt[t] += cs;
		}
		wc += taps;
	}
	acc512_out(a, acc, nch);
}

#define TILE512_T(nt)                                                             \
	do {                                                                          \
		if (nc == 12)                                                         \
			tile512_t(g, v0, t0, co0, c0, c1, acc, 12, nt);                \
		else if (nc == 8)                                                     \
			tile512_t(g, v0, t0, co0, c0, c1, acc, 8, nt);                 \
		else                                                                  \
			tile512_t(g, v0, t0, co0, c0, c1, acc, 4, nt);                 \
	} while (0)

T512 static void tile512(const struct cgeom *g, ptrdiff_t v0, int t0, int t1, int co0, int nc, int c0, int c1,
                        float *acc)
{
	if (g->kw == 3 && nc % 4 == 0) {
		if (g->kind == WF32)
			TILE512_K3(WF32, 3);
		else if (g->kind == WBF16)
			TILE512_K3(WBF16, 3);
		else
			TILE512_K3(WF16, 3);
		return;
	}
	if (g->kw == 1 && g->kind == WF32 && nc % 4 == 0 && t1 - t0 >= 1 && t1 - t0 <= 3) {
		if (t1 - t0 == 3)
			TILE512_T(3);
		else if (t1 - t0 == 2)
			TILE512_T(2);
		else
			TILE512_T(1);
		return;
	}
	if (g->kw == 1 && nc % 4 == 0) {   /* 1x1 and kt-only convs, and the Winograd products */
		if (g->kind == WF32)
			TILE512_K3(WF32, 1);
		else if (g->kind == WBF16)
			TILE512_K3(WBF16, 1);
		else
			TILE512_K3(WF16, 1);
		return;
	}
	if (g->kind == WF32)
		tile512_k(g, v0, t0, t1, co0, nc, c0, c1, acc, WF32);
	else if (g->kind == WBF16)
		tile512_k(g, v0, t0, t1, co0, nc, c0, c1, acc, WBF16);
	else
		tile512_k(g, v0, t0, t1, co0, nc, c0, c1, acc, WF16);
}
#endif

typedef void tile_fn(const struct cgeom *g, ptrdiff_t v0, int t0, int t1, int co0, int nc, int c0, int c1, float *acc);

static tile_fn *pick_tile(void)
{
#ifdef HAVE_X86
	const int isa = hi3i_gemm_level();   /* the GEMM's choice (and the tests' cap) */
	if (isa >= 2)
		return tile512;
	if (isa >= 1)
		return tile_avx2;
#endif
	return tile_portable;
}

/* The input of a conv as act(groupnorm(x)): per image and group, mean and
 * 1 / sqrt(var + eps) (hi3i_cpu_groupnorm_stats), w and b per channel. */
struct pre {
	const float *mean, *rstd; /* (B, G) */
	const float *w, *b;       /* (C) */
	int G, act;
};

/* A row of W positions of C channels through groupnorm and swish, in
 * hi3i_cpu_gn1's operations and order: pass 0, z = (x - mean) rstd w + b
 * into y and -z into e; pass 1 (after e = expf(e)), y = z (1 / (1 + e)).
 * The AVX-512 code does the same operations 16 channels at a time. */
static void gn_row_portable(float *y, float *e, const float *x, const float *gm, const float *gr, const float *w,
                            const float *b, int W, int C, int pass, int c0)
{
	for (int xw = 0; xw < W; xw++)
		for (int c = c0; c < C; c++) {
			const size_t i = (size_t)xw * C + c;
			if (pass == 0) {
				y[i] = (x[i] - gm[c]) * gr[c] * w[c] + b[c];
				e[i] = -y[i];
			} else {
				y[i] = y[i] * (1.0f / (1.0f + e[i]));
			}
		}
}

#ifdef HAVE_X86
T512 static void gn_row512(float *y, float *e, const float *x, const float *gm, const float *gr, const float *w,
                           const float *b, int W, int C, int pass)
{
	const int C16 = C / 16 * 16;
	const __m512 one = _mm512_set1_ps(1.0f);
	const __m512i sign = _mm512_set1_epi32(INT32_MIN);

	for (int xw = 0; xw < W; xw++)
		for (int c = 0; c < C16; c += 16) {
			const size_t i = (size_t)xw * C + c;
			if (pass == 0) {
				__m512 z = _mm512_sub_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(gm + c));
				z = _mm512_mul_ps(z, _mm512_loadu_ps(gr + c));
				z = _mm512_mul_ps(z, _mm512_loadu_ps(w + c));
				z = _mm512_add_ps(z, _mm512_loadu_ps(b + c));
				_mm512_storeu_ps(y + i, z);
				_mm512_storeu_ps(e + i, _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(z), sign)));   /* -z */
			} else {
				const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, _mm512_loadu_ps(e + i)));
				_mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(y + i), s));
			}
		}
	if (C16 < C)
		gn_row_portable(y, e, x, gm, gr, w, b, W, C, pass, C16);
}
#endif

static void gn_row(float *y, float *e, const float *x, const float *gm, const float *gr, const float *w,
                   const float *b, int W, int C, int pass)
{
#ifdef HAVE_X86
	if (hi3i_gemm_level() >= 2) {
		gn_row512(y, e, x, gm, gr, w, b, W, C, pass);
		return;
	}
#endif
	gn_row_portable(y, e, x, gm, gr, w, b, W, C, pass, 0);
}

/* Pack rows [h0 - ph, h0 + nh + ph) of frames [fa, fb) (within [0, T))
 * of image xb (T, H, W, C) channels-last into xp: channel c at xp + c cs,
 * frame-major, (nh + 2 ph) x Wp per frame, zero outside the image's rows
 * and columns, then TP2 zeros (a tile's slack past the last frame). The
 * zero frames before and after the image are not packed: no tap reads
 * them (conv_packed). */
#define TP2 (2 * TP)
static void pack(float *xp, size_t cs, const float *xb, const struct hi3_conv *cv, int fa, int fb, int h0, int nh,
                 const struct pre *pr, int bi)
{
	const int C = cv->C, H = cv->H, W = cv->W, ph = cv->kh / 2, pw = cv->kw / 2;
	const int Hb = nh + 2 * ph, Wp = W + 2 * pw, rows = (fb - fa) * Hb;
	const int cg = pr ? C / pr->G : 1;

	/* swish: a thread's row of act(groupnorm(x)) and its expf, and each
	 * channel's mean and 1 / sqrt(var + eps) */
	float *rowb = pr && pr->act == HI3_ACT_SILU ? malloc(sizeof(float) * (2 * (size_t)W * C + 2 * (size_t)C)) : NULL;
	float *gm = rowb ? rowb + 2 * (size_t)W * C : NULL, *gr = gm ? gm + C : NULL;

	for (int c = 0; rowb && c < C; c++) {
		gm[c] = pr->mean[bi * pr->G + c / cg];
		gr[c] = pr->rstd[bi * pr->G + c / cg];
	}
#pragma omp for schedule(static) nowait
	for (int c = 0; c < C; c++)
		memset(xp + c * cs + (size_t)rows * Wp, 0, sizeof(float) * TP2);
#pragma omp for schedule(static)
	for (int r = 0; r < rows; r++) {
		const int t = fa + r / Hb, h = h0 + r % Hb - ph;
		const size_t o = (size_t)r * Wp;

		if (h < 0 || h >= H) {
			for (int c = 0; c < C; c++)
				memset(xp + c * cs + o, 0, sizeof(float) * (size_t)Wp);
			continue;
		}
		for (int c = 0; c < C; c++) {
			float *d = xp + c * cs + o;
			memset(d, 0, sizeof(float) * (size_t)pw);
			memset(d + pw + W, 0, sizeof(float) * (size_t)pw);
		}
		{
			const float *src = xb + ((size_t)t * H + (size_t)h) * (size_t)W * (size_t)C;
			if (rowb) {
				/* the row's act(groupnorm(x)) as hi3i_cpu_gn1 computes it,
				 * a run of W C floats at a time (the same operations in
				 * the same order, expf's bits), then transposed */
				const size_t n = (size_t)W * C;
				float *e = rowb + n;
				gn_row(rowb, e, src, gm, gr, pr->w, pr->b, W, C, 0);
				hi3i_cpu_expf_n(e, (int)n);
				gn_row(rowb, e, src, gm, gr, pr->w, pr->b, W, C, 1);
				for (int c = 0; c < C; c++) {
					float *d = xp + c * cs + o + pw;
					for (int xw = 0; xw < W; xw++)
						d[xw] = rowb[(size_t)xw * C + c];
				}
				continue;
			}
			for (int xw = 0; xw < W; xw++) {
				const float *s = src + (size_t)xw * C;
				float *d = xp + o + pw + xw;
				if (pr) {
					for (int c = 0; c < C; c++) {
						const int g = bi * pr->G + c / cg;
						d[c * cs] = hi3i_cpu_gn1(s[c], pr->mean[g], pr->rstd[g], pr->w[c], pr->b[c], pr->act);
					}
				} else {
					for (int c = 0; c < C; c++)
						d[c * cs] = s[c];
				}
			}
		}
	}
	free(rowb);
}

/* y = acc + b for the positions of tile u0 of frame f of the band of rows
 * [h0, h0 + nh) that are outputs in [q, q1) of the image at pb. */
static void store_tile(float *y, const float *acc, const hi3_wt *b, const struct hi3_conv *cv, int Cout, int co0,
                       int nc, int64_t pb, int f, int h0, int nh, size_t u0, int64_t q, int64_t q1)
{
	const int H = cv->H, W = cv->W, Wp = W + 2 * (cv->kw / 2);

	for (int i = 0; i < TP; i++) {
		const size_t u = u0 + (size_t)i;
		const int hh = (int)(u / (size_t)Wp), ww = (int)(u % (size_t)Wp);
		const int64_t p = pb + ((int64_t)f * H + h0 + hh) * W + ww;
		float *yr;
		if (hh >= nh || ww >= W || p < q || p >= q1)
			continue;
		yr = y + p * Cout + co0;
		for (int j = 0; j < nc; j++)
			yr[j] = b ? acc[j * TP + i] + b->f32[co0 + j] : acc[j * TP + i];
	}
}

/* Bytes of cache the loops below aim at: a block of input channels' weights
 * for a thread's output channels, and a block of position tiles' partial
 * sums (L2 is 1 MiB on the machines this was tuned on). */
#define WBLOCK_BYTES ((size_t)256 << 10)
#define PART_BYTES ((size_t)512 << 10)

/* At most about hi3i_cpu_conv_pack_bytes of packed input: an image's frames are
 * packed and convolved in bands of output rows (with the rows above and
 * below them that the taps read), so the packed input stays this small
 * whatever the picture, instead of a copy of the whole activation. */
size_t hi3i_cpu_conv_pack_bytes = (size_t)12 << 20;

/* Of the output rows [q, end) of a conv (P = T H W rows an image), those
 * of q's image bi (first row pb): [q, q1), in its frames [f0, f1), which
 * read its frames [fa, fb) (the time taps' reach). */
struct span {
	int bi, f0, f1, fa, fb;
	int64_t pb, q1;
};

static struct span image_span(const struct hi3_conv *cv, int64_t q, int64_t end)
{
	const int64_t HW = (int64_t)cv->H * cv->W, P = (int64_t)cv->T * HW;
	const int pt = cv->kt / 2;
	struct span s;

	s.bi = (int)(q / P);
	s.pb = (int64_t)s.bi * P;
	s.q1 = HI3_MIN(end, s.pb + P);
	s.f0 = (int)((q - s.pb) / HW);
	s.f1 = (int)((s.q1 - 1 - s.pb) / HW) + 1;
	s.fa = HI3_MAX(0, s.f0 - pt);
	s.fb = HI3_MIN(cv->T, s.f1 + pt);
	return s;
}

static void conv_packed(hi3_backend *be, float *y, const float *x, const hi3_wt *w, const hi3_wt *b,
                        const struct hi3_conv *cv, int64_t p0, int64_t n, const struct pre *pr)
{
	const int C = cv->C, Cout = w->N, H = cv->H, W = cv->W, T = cv->T;
	const int pt = cv->kt / 2, ph = cv->kh / 2, pw = cv->kw / 2, taps = cv->kt * cv->kh * cv->kw, kk = cv->kh * cv->kw;
	const int Wp = W + 2 * pw;
	const int nco = (Cout + TC - 1) / TC;
	const size_t es = hi3_dtype_size(w->mat.dtype);
	tile_fn *tile = pick_tile();

	HI3_ASSERT(w->K == C * taps && taps <= 27 * 27 && cv->kt % 2 && cv->kh % 2 && cv->kw % 2);
	if (n <= 0)
		return;
	hi3i_cpu_mark_used(be, w);
	/* image by image */
	for (int64_t q = p0; q < p0 + n;) {
		const struct span sp = image_span(cv, q, p0 + n);
		const int bi = sp.bi, f0 = sp.f0, f1 = sp.f1, fa = sp.fa, fb = sp.fb;
		const int64_t pb = sp.pb, q1 = sp.q1;
		/* output rows per band: (bh + 2 ph) packed rows of every frame
		 * within PACK_BYTES, at least 1 */
		const size_t rows = hi3i_cpu_conv_pack_bytes / ((size_t)(fb - fa) * (size_t)Wp * (size_t)C * sizeof(float));
		const int bh = (int)HI3_MIN((size_t)H, rows > (size_t)(2 * ph) + 1 ? rows - (size_t)(2 * ph) : 1);
		const size_t cs = (size_t)(fb - fa) * (size_t)(bh + 2 * ph) * (size_t)Wp + TP2;   /* + slack for a tile past a frame */
		float *xp = hi3i_cpu_scratch(be, cs * (size_t)C + TP);
		int failed = 0;

		if (!xp) {
			hi3i_backend_fail(be, "cpu conv: out of memory for the packed input of %d channels", C);
			return;
		}
#pragma omp parallel reduction(| : failed)
		{
			const int nt = omp_get_num_threads(), id = omp_get_thread_num();
			/* the partial sums of a block of pbk position tiles by ncot
			 * channel tiles (below): pbk ncot <= max(ncot, PART_BYTES / a
			 * tile's) */
			const size_t ptiles = PART_BYTES / (TC * TP * sizeof(float)) + (size_t)nco;
			float *part = hi3i_aligned_alloc(sizeof(float) * ptiles * TC * TP, NULL);

			if (!part)
				failed = 1;
			for (int h0 = 0; h0 < H; h0 += bh) {
				const int nh = HI3_MIN(bh, H - h0);
				const size_t plane = (size_t)(nh + 2 * ph) * Wp, fr_tiles = ((size_t)nh * Wp + TP - 1) / TP;
				const size_t npos = (size_t)(f1 - f0) * fr_tiles;
				/* a thread's share: position tiles [pa, pe) by channel tiles
				 * [ca, ce), positions split when there are enough of them */
				const int by_pos = npos >= (size_t)nt * 4;
				const size_t pa = by_pos ? npos * (size_t)id / (size_t)nt : 0;
				const size_t pe = by_pos ? npos * (size_t)(id + 1) / (size_t)nt : npos;
				const int ca = by_pos ? 0 : nco * id / nt, ce = by_pos ? nco : nco * (id + 1) / nt, ncot = ce - ca;
				/* input channels per block: their weights for [ca, ce) in
				 * WBLOCK_BYTES; position tiles per block: their partial sums
				 * in PART_BYTES */
				const int cb = (int)HI3_MAX(16, HI3_MIN((size_t)C, WBLOCK_BYTES / ((size_t)HI3_MAX(ncot, 1) * TC * taps * es)));
				const size_t pbk = cb >= C ? 1 : HI3_MAX(1, PART_BYTES / ((size_t)HI3_MAX(ncot, 1) * TC * TP * sizeof(float)));
				int off[27 * 27];   /* the packed offset of each tap */
				const struct cgeom g = {C,  Cout, taps, w->mat.dtype == HI3_BF16 ? WBF16 : w->mat.dtype == HI3_F16 ? WF16 : WF32,
				                        cv->kw, w->mat.data, (size_t)C * taps * es, xp, cs, off};

				for (int dt = 0, t = 0; dt < cv->kt; dt++)
					for (int dy = 0; dy < cv->kh; dy++)
						for (int dx = 0; dx < cv->kw; dx++)
							off[t++] = (int)((size_t)dt * plane + (size_t)dy * Wp + (size_t)dx);
				if (h0 > 0) {
#pragma omp barrier
				}
				pack(xp, cs, x + pb * C, cv, fa, fb, h0, nh, pr, bi);   /* ends with a barrier */
				for (size_t b0 = pa; part && b0 < pe; b0 += pbk) {
					const size_t b1 = HI3_MIN(pe, b0 + pbk);
					for (int c0 = 0; c0 < C; c0 += cb) {
						const int c1 = HI3_MIN(C, c0 + cb);
						for (size_t pos = b0; pos < b1; pos++) {
							/* output frame f reads frames f + dt - pt; the taps of
							 * the frames outside [0, T), zeros, are left out of
							 * the chain: fmaf(0, w, a) is a for the finite w and
							 * the a != -0 of a chain from +0, so the bits stay
							 * those of the whole chain */
							const int f = f0 + (int)(pos / fr_tiles);
							const int t0 = HI3_MAX(0, pt - f) * kk, t1 = HI3_MIN(cv->kt, T + pt - f) * kk;
							const size_t u0 = (pos % fr_tiles) * TP;
							const ptrdiff_t v0 = (ptrdiff_t)(f - pt - fa) * (ptrdiff_t)plane + (ptrdiff_t)u0;
							for (int ct = ca; ct < ce; ct++) {
								const int co0 = ct * TC, nc = HI3_MIN(TC, Cout - co0);
								float *acc = part + ((pos - b0) * (size_t)ncot + (size_t)(ct - ca)) * TC * TP;
								tile(&g, v0, t0, t1, co0, nc, c0, c1, acc);
								if (c1 == C)
									store_tile(y, acc, b, cv, Cout, co0, nc, pb, f, h0, nh, u0, q, q1);
							}
						}
					}
				}
			}
			free(part);
		}
		if (failed) {
			hi3i_backend_fail(be, "cpu conv: out of memory for the partial sums of %d channels", Cout);
			return;
		}
		q = q1;
	}
}

/* ---------------------------------------------------------------- Winograd
 *
 * A conv with a 3 x 3 spatial kernel over frames of even height and width
 * (any odd kt) as Winograd F(2x2, 3x3) (Lavin and Gray): each 2 x 2 block
 * of outputs of a frame, a tile, is A^T M A of the 4 x 4 products
 *   M[xi] = sum over (c, dt) of U[xi][co][c][dt] V[xi][c][frame + dt - pt][tile]
 * (xi = 4 i + j, i the row), where V = B^T d B is the tile's 4 x 4 input
 * window d (one frame, one channel) transformed, and U = G g G^T the
 * 3 x 3 kernel g of (co, c, dt) transformed. 16 products per tile and
 * (c, dt) where the direct conv does 36: 2.25 times fewer multiplies.
 *
 * Order, fixed per output element whatever the batch, band, thread split
 * or kernel: U[xi] is computed from the 9 weights as written in
 * wino_weight (adds, then one multiply by 1/4); V[xi] from the 16 inputs
 * (the conv's input as pack gives it: act(groupnorm(x)) when fused) as
 * in wino_in, adds only; M[xi] is one fused multiply-add chain over
 * (c, dt), c outer, from +0, the taps that read the zero frames before
 * and after the image left out (exact, as in conv_packed); the output is
 * A^T M A as in wino_store, adds only, then + b. The chain runs on the
 * direct conv's register tiles (any kernel, the same bits), over V as a
 * "packed input" (groups of TP consecutive tiles, channel after channel:
 * a channel's stride TP) and U as an f32 weight [co][c][dt] (kw = 1, taps
 * the nd taps in time the frames read, a tap's offset one frame of
 * groups).
 *
 * Memory: the weights stay where they lie; U of a block of output channels
 * (hi3i_cpu_conv_wino_bytes) is computed per band of rows and dropped, V of
 * a band of rows (as much) likewise: no transformed weight outlives the call.
 */

/* Whether conv cv of Cout output channels runs as Winograd
 * (hi3i_cpu_conv_winograd: -1 by the rule below, 0 never, 1 whenever the
 * kernel is 3 x 3 and the frame even). The rule, the same for any batch:
 * a 3 x 3 spatial kernel over frames of even height and width of at
 * least 256 positions (16 x 16), with at least 16 input and output
 * channels; 1 x 1 convs, kt-only ones, the encoder's first conv (3
 * channels) and odd or smaller frames stay direct. Below 16 x 16 the
 * transform of the weights (all of them, for a few tiles) costs what the
 * products save: at 8 x 8 and 1024 channels, one frame, the direct conv
 * is as fast (docs/PERFORMANCE.md). */
int hi3i_cpu_conv_winograd = -1;

int hi3i_cpu_conv_is_winograd(const struct hi3_conv *cv, int Cout)
{
	if (cv->kh != 3 || cv->kw != 3 || cv->H % 2 || cv->W % 2 || hi3i_cpu_conv_winograd == 0)
		return 0;
	return hi3i_cpu_conv_winograd > 0 || ((int64_t)cv->H * cv->W >= 256 && cv->C >= 16 && Cout >= 16);
}

#define WPART_BYTES ((size_t)2 << 20)     /* a thread's 16 products of a block of tiles */
/* At most about this many bytes of packed and transformed input per band
 * of rows, and of transformed weights per block of output channels (tests
 * make it small) */
size_t hi3i_cpu_conv_wino_bytes = (size_t)16 << 20;

/* U (16, nb, C, nd) for output channels [co0, co0 + nb) and the taps in
 * time [d0, d0 + nd) (those the output frames read) of w [Cout, C, kt, 3,
 * 3] (of kind): U[xi][co][c][dt - d0] = (G' g G'^T)[xi] / 4 with G' = 2 G
 * = [2 0 0; 1 1 1; 1 -1 1; 0 0 2], adds in the order written, then one
 * multiply: nothing to contract, so the AVX-512 code (16 (c, dt) at a
 * time) gives the portable code's bits. g: the row of co as f32
 * (C, kt, 9). */
static inline void wino_weight1(float *u, size_t xs, const float *g)
{
	float a[4][3];

	for (int j = 0; j < 3; j++) {
		a[0][j] = g[j] + g[j];
		a[1][j] = g[j] + g[3 + j] + g[6 + j];
		a[2][j] = g[j] - g[3 + j] + g[6 + j];
		a[3][j] = g[6 + j] + g[6 + j];
	}
	for (int i = 0; i < 4; i++) {
		u[(size_t)(4 * i + 0) * xs] = (a[i][0] + a[i][0]) * 0.25f;
		u[(size_t)(4 * i + 1) * xs] = (a[i][0] + a[i][1] + a[i][2]) * 0.25f;
		u[(size_t)(4 * i + 2) * xs] = (a[i][0] - a[i][1] + a[i][2]) * 0.25f;
		u[(size_t)(4 * i + 3) * xs] = (a[i][2] + a[i][2]) * 0.25f;
	}
}

/* k = c nd + dt - d0 from 0: the row's U from k on */
static void wino_row(float *u, size_t xs, const float *g, int C, int kt, int d0, int nd, int k)
{
	for (; k < C * nd; k++)
		wino_weight1(u + k, xs, g + ((size_t)(k / nd) * kt + d0 + k % nd) * 9);
}

#ifdef HAVE_X86
T512 static void wino_row512(float *u, size_t xs, const float *g, int C, int kt, int d0, int nd)
{
	const __m512 q = _mm512_set1_ps(0.25f);
	int k = 0;

	const __m512i vi = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
	                                      _mm512_set1_epi32(9));

	for (; k + 16 <= C * nd; k += 16) {
		float buf[16 * 9];   /* the 16 kernels, read in order (not gathered from the mapping) */
		__m512 gg[9], a[4][3];

		{   /* the kernels of 2 steps on, from memory (a strided stream the prefetcher misses) */
			const char *pf = (const char *)(g + ((size_t)((k + 32) / nd) * kt) * 9);
			const char *pe = (const char *)(g + (size_t)C * kt * 9);
			for (int l = 0; l < 16 * 9 * kt / nd * 4; l += 64)
				if (pf + l < pe)
					_mm_prefetch(pf + l, _MM_HINT_T0);
		}
		if (nd == kt)
			memcpy(buf, g + (size_t)k * 9, sizeof(buf));   /* d0 = 0 */
		else
			for (int l = 0; l < 16; l++)
				memcpy(buf + 9 * l, g + ((size_t)((k + l) / nd) * kt + d0 + (k + l) % nd) * 9, 9 * sizeof(float));
#pragma GCC unroll 9
		for (int i = 0; i < 9; i++)
			gg[i] = _mm512_i32gather_ps(_mm512_add_epi32(vi, _mm512_set1_epi32(i)), buf, 4);
#pragma GCC unroll 3
		for (int j = 0; j < 3; j++) {
			a[0][j] = _mm512_add_ps(gg[j], gg[j]);
			a[1][j] = _mm512_add_ps(_mm512_add_ps(gg[j], gg[3 + j]), gg[6 + j]);
			a[2][j] = _mm512_add_ps(_mm512_sub_ps(gg[j], gg[3 + j]), gg[6 + j]);
			a[3][j] = _mm512_add_ps(gg[6 + j], gg[6 + j]);
		}
#pragma GCC unroll 4
		for (int i = 0; i < 4; i++) {
			_mm512_storeu_ps(u + (size_t)(4 * i + 0) * xs + k, _mm512_mul_ps(_mm512_add_ps(a[i][0], a[i][0]), q));
			_mm512_storeu_ps(u + (size_t)(4 * i + 1) * xs + k,
			                 _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(a[i][0], a[i][1]), a[i][2]), q));
			_mm512_storeu_ps(u + (size_t)(4 * i + 2) * xs + k,
			                 _mm512_mul_ps(_mm512_add_ps(_mm512_sub_ps(a[i][0], a[i][1]), a[i][2]), q));
			_mm512_storeu_ps(u + (size_t)(4 * i + 3) * xs + k, _mm512_mul_ps(_mm512_add_ps(a[i][2], a[i][2]), q));
		}
	}
	wino_row(u, xs, g, C, kt, d0, nd, k);
}
#endif

/* wf: a thread's (C kt 9) floats for a row widened from BF16 or F16 */
static void wino_weight(float *u, const unsigned char *w, int kind, int C, int kt, int d0, int nd, int co0, int nb,
                        float *wf)
{
	const size_t xs = (size_t)nb * C * nd, K9 = (size_t)C * kt * 9;
#ifdef HAVE_X86
	const int v512 = hi3i_gemm_level() >= 2;
#endif

#pragma omp for schedule(static)
	for (int co = co0; co < co0 + nb; co++) {
		const float *g = (const float *)w + (size_t)co * K9;
		float *uc = u + (size_t)(co - co0) * C * nd;
		if (kind != WF32) {
			for (size_t i = 0; i < K9; i++)
				wf[i] = wget(w, kind, (size_t)co * K9 + i);
			g = wf;
		}
#ifdef HAVE_X86
		if (v512) {
			wino_row512(uc, xs, g, C, kt, d0, nd);
			continue;
		}
#endif
		wino_row(uc, xs, g, C, kt, d0, nd, 0);
	}
}

/* V (16, nfr, ft, C, TP): the tiles (nty rows of ntx) of frame fl in ft
 * groups of TP (the last one's lanes past the frame zero), each group
 * channel after channel, so that a register tile reads its channels one
 * after another; V[xi] at v + xi xs. From the packed input xp (channel c
 * at xp + c cs, nfr frames of Hb rows of Wp), tile (ty, tx) reading its
 * rows 2 ty .. 2 ty + 3 and columns 2 tx .. 2 tx + 3.
 * V[4 i + j] = (B^T d B)[i][j], B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],
 * adds only: the AVX-512 code (16 tiles at a time) gives the bits of the
 * portable code. */
struct vgeom {
	float *v;                 /* V[0] of channel c, frame fl: tile u at v + (u / TP) C TP + u % TP */
	size_t xs, gs;            /* floats from one xi to the next; from one group of TP tiles to the next */
};

static inline size_t vat(const struct vgeom *vg, size_t u)
{
	return (u / TP) * vg->gs + u % TP;
}

/* tiles [tx, ntx) of row ty of tiles: d at its first packed row and column 0 */
static void wino_in_row(const struct vgeom *vg, const float *d, int Wp, int ty, int tx, int ntx)
{
	for (; tx < ntx; tx++) {
		const float *e = d + 2 * tx;
		float *v = vg->v + vat(vg, (size_t)ty * ntx + tx);
		const size_t xs = vg->xs;
		float t[4][4];
		for (int j = 0; j < 4; j++) {
			t[0][j] = e[j] - e[2 * Wp + j];
			t[1][j] = e[Wp + j] + e[2 * Wp + j];
			t[2][j] = e[2 * Wp + j] - e[Wp + j];
			t[3][j] = e[Wp + j] - e[3 * Wp + j];
		}
		for (int i = 0; i < 4; i++) {
			v[(size_t)(4 * i + 0) * xs] = t[i][0] - t[i][2];
			v[(size_t)(4 * i + 1) * xs] = t[i][1] + t[i][2];
			v[(size_t)(4 * i + 2) * xs] = t[i][2] - t[i][1];
			v[(size_t)(4 * i + 3) * xs] = t[i][1] - t[i][3];
		}
	}
}

#ifdef HAVE_X86
/* the low n (16 or 8) lanes of x: tiles u .. u + n - 1 of xi */
T512 static inline void wino_put(const struct vgeom *vg, int xi, size_t u, __m512 x, int n)
{
	float *v = vg->v + (size_t)xi * vg->xs;

	if (u % TP <= (size_t)(TP - n)) {
		_mm512_mask_storeu_ps(v + vat(vg, u), (__mmask16)((1u << n) - 1), x);
	} else {
		float t[16];
		_mm512_storeu_ps(t, x);
		for (int l = 0; l < n; l++)
			v[vat(vg, u + (size_t)l)] = t[l];
	}
}

/* V = B^T d B of n tiles from e (a 4 x 4 tile's rows and columns, a tile a lane), in the order of wino_in_row */
T512 static inline void wino_bdb512(const struct vgeom *vg, size_t u, __m512 e[4][4], int n)
{
	__m512 t[4][4];
#pragma GCC unroll 4
	for (int j = 0; j < 4; j++) {
		t[0][j] = _mm512_sub_ps(e[0][j], e[2][j]);
		t[1][j] = _mm512_add_ps(e[1][j], e[2][j]);
		t[2][j] = _mm512_sub_ps(e[2][j], e[1][j]);
		t[3][j] = _mm512_sub_ps(e[1][j], e[3][j]);
	}
#pragma GCC unroll 4
	for (int i = 0; i < 4; i++) {
		wino_put(vg, 4 * i + 0, u, _mm512_sub_ps(t[i][0], t[i][2]), n);
		wino_put(vg, 4 * i + 1, u, _mm512_add_ps(t[i][1], t[i][2]), n);
		wino_put(vg, 4 * i + 2, u, _mm512_sub_ps(t[i][2], t[i][1]), n);
		wino_put(vg, 4 * i + 3, u, _mm512_sub_ps(t[i][1], t[i][3]), n);
	}
}

T512 static void wino_in_row512(const struct vgeom *vg, const float *d, int Wp, int ty, int ntx)
{
	const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
	const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
	int tx = 0;

	for (; tx + 16 <= ntx; tx += 16) {
		const size_t u = (size_t)ty * ntx + tx;
		__m512 e[4][4];
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++) {
			const float *row = d + (size_t)r * Wp + 2 * tx;
			const __m512 a0 = _mm512_loadu_ps(row), a1 = _mm512_loadu_ps(row + 16);
			const __m512 b0 = _mm512_loadu_ps(row + 2), b1 = _mm512_loadu_ps(row + 18);
			e[r][0] = _mm512_permutex2var_ps(a0, ev, a1);   /* column 2 tx of each tile */
			e[r][1] = _mm512_permutex2var_ps(a0, od, a1);
			e[r][2] = _mm512_permutex2var_ps(b0, ev, b1);
			e[r][3] = _mm512_permutex2var_ps(b0, od, b1);
		}
		wino_bdb512(vg, u, e, 16);
	}
	if (ntx - tx >= 8) {   /* 8 tiles (16 x 16 frames): the low half of each vector; reads columns to 2 tx + 17 < Wp */
		const size_t u = (size_t)ty * ntx + tx;
		const __mmask16 lo = 0xff;
		__m512 e[4][4];
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++) {
			const float *row = d + (size_t)r * Wp + 2 * tx;
			const __m512 a = _mm512_loadu_ps(row), b = _mm512_loadu_ps(row + 2);
			e[r][0] = _mm512_maskz_permutexvar_ps(lo, ev, a);
			e[r][1] = _mm512_maskz_permutexvar_ps(lo, od, a);
			e[r][2] = _mm512_maskz_permutexvar_ps(lo, ev, b);
			e[r][3] = _mm512_maskz_permutexvar_ps(lo, od, b);
		}
		wino_bdb512(vg, u, e, 8);
		tx += 8;
	}
	wino_in_row(vg, d, Wp, ty, tx, ntx);
}
#endif

/* V of frames [0, nfr) of the band, ft = ceil(nty ntx / TP) groups each */
static void wino_in(float *v, size_t xs, const float *xp, size_t cs, int C, int nfr, int Hb, int Wp, int nty, int ntx,
                    size_t ft)
{
	const size_t plane = (size_t)nty * ntx;
#ifdef HAVE_X86
	const int v512 = hi3i_gemm_level() >= 2;
#endif

#pragma omp for schedule(static)
	for (int c = 0; c < C; c++)
		for (int fl = 0; fl < nfr; fl++) {
			const struct vgeom vg = {v + ((size_t)fl * ft * C + (size_t)c) * TP, xs, (size_t)C * TP};
			for (int ty = 0; ty < nty; ty++) {
				const float *d = xp + (size_t)c * cs + ((size_t)fl * Hb + 2 * ty) * Wp;
#ifdef HAVE_X86
				if (v512) {
					wino_in_row512(&vg, d, Wp, ty, ntx);
					continue;
				}
#endif
				wino_in_row(&vg, d, Wp, ty, 0, ntx);
			}
			for (int xi = 0; xi < 16; xi++)
				for (size_t u = plane; u < ft * TP; u++)
					vg.v[(size_t)xi * xs + vat(&vg, u)] = 0.0f;
		}
}

/* o (4, TC, TP) = A^T M A (+ b), A^T = [1 1 1 0; 0 1 -1 -1], of m (16, TC,
 * TP), for nc channels from co0 (o's first index: the output r cc of a
 * tile at 2 r + cc); adds only: the AVX-512 code gives the portable
 * code's bits */
static void wino_out(float *o, const float *m, const hi3_wt *b, int co0, int nc)
{
	for (int j = 0; j < nc; j++)
		for (int i = 0; i < TP; i++) {
			float s[2][4], r[2][2];
			for (int k = 0; k < 4; k++) {
				const float m0 = m[(size_t)(0 + k) * TC * TP + j * TP + i], m1 = m[(size_t)(4 + k) * TC * TP + j * TP + i];
				const float m2 = m[(size_t)(8 + k) * TC * TP + j * TP + i], m3 = m[(size_t)(12 + k) * TC * TP + j * TP + i];
				s[0][k] = m0 + m1 + m2;
				s[1][k] = m1 - m2 - m3;
			}
			for (int q = 0; q < 2; q++) {
				r[q][0] = s[q][0] + s[q][1] + s[q][2];
				r[q][1] = s[q][1] - s[q][2] - s[q][3];
			}
			for (int q = 0; q < 4; q++)
				o[(size_t)q * TC * TP + j * TP + i] = b ? r[q / 2][q % 2] + b->f32[co0 + j] : r[q / 2][q % 2];
		}
}

#ifdef HAVE_X86
T512 static void wino_out512(float *o, const float *m, const hi3_wt *b, int co0, int nc)
{
	for (int j = 0; j < nc; j++)
#pragma GCC unroll 2
		for (int i = 0; i < TP; i += 16) {
			__m512 s[2][4], r[4];
#pragma GCC unroll 4
			for (int k = 0; k < 4; k++) {
				const __m512 m0 = _mm512_loadu_ps(m + (size_t)(0 + k) * TC * TP + j * TP + i);
				const __m512 m1 = _mm512_loadu_ps(m + (size_t)(4 + k) * TC * TP + j * TP + i);
				const __m512 m2 = _mm512_loadu_ps(m + (size_t)(8 + k) * TC * TP + j * TP + i);
				const __m512 m3 = _mm512_loadu_ps(m + (size_t)(12 + k) * TC * TP + j * TP + i);
				s[0][k] = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);
				s[1][k] = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3);
			}
#pragma GCC unroll 2
			for (int q = 0; q < 2; q++) {
				r[2 * q] = _mm512_add_ps(_mm512_add_ps(s[q][0], s[q][1]), s[q][2]);
				r[2 * q + 1] = _mm512_sub_ps(_mm512_sub_ps(s[q][1], s[q][2]), s[q][3]);
			}
#pragma GCC unroll 4
			for (int q = 0; q < 4; q++) {
				if (b)
					r[q] = _mm512_add_ps(r[q], _mm512_set1_ps(b->f32[co0 + j]));
				_mm512_storeu_ps(o + (size_t)q * TC * TP + j * TP + i, r[q]);
			}
		}
}
#endif

/* y = A^T M A + b for the tiles u0 .. u0 + TP - 1 of frame f of the band
 * from row h0 (tiles nty x ntx) that are outputs in [q, q1) of the image
 * at pb; m (16, TC, TP) the tiles' products of output channels co0 .. co0
 * + nc - 1; o (4, TC, TP) a buffer. */
static void wino_store(float *y, const float *m, float *o, const hi3_wt *b, const struct hi3_conv *cv, int Cout,
                       int co0, int nc, int64_t pb, int f, int h0, int nty, int ntx, size_t u0, int64_t q, int64_t q1)
{
	const int H = cv->H, W = cv->W;

#ifdef HAVE_X86
	if (hi3i_gemm_level() >= 2)
		wino_out512(o, m, b, co0, nc);
	else
#endif
		wino_out(o, m, b, co0, nc);
	for (int i = 0; i < TP; i++) {
		const size_t u = u0 + (size_t)i;
		const int ty = (int)(u / (size_t)ntx), tx = (int)(u % (size_t)ntx);
		const int64_t p = pb + ((int64_t)f * H + h0 + 2 * ty) * W + 2 * tx;   /* the tile's top left */
		if (ty >= nty || p + W + 1 < q || p >= q1)
			continue;
		for (int rc = 0; rc < 4; rc++) {
			const int64_t pp = p + (int64_t)(rc / 2) * W + rc % 2;
			if (pp >= q && pp < q1) {
				float *yr = y + pp * Cout + co0;
				for (int j = 0; j < nc; j++)
					yr[j] = o[(size_t)rc * TC * TP + j * TP + i];
			}
		}
	}
}

static void conv_wino(hi3_backend *be, float *y, const float *x, const hi3_wt *w, const hi3_wt *b,
                      const struct hi3_conv *cv, int64_t p0, int64_t n, const struct pre *pr)
{
	const int C = cv->C, Cout = w->N, H = cv->H, W = cv->W, T = cv->T, kt = cv->kt, pt = kt / 2;
	const int Wp = W + 2, ntx = W / 2;
	const int kind = w->mat.dtype == HI3_BF16 ? WBF16 : w->mat.dtype == HI3_F16 ? WF16 : WF32;
	/* output channels whose U is held at once: a multiple of TC within hi3i_cpu_conv_wino_bytes */
	const int nbo = HI3_MIN(Cout, HI3_MAX(TC, (int)(hi3i_cpu_conv_wino_bytes / ((size_t)16 * C * kt * sizeof(float))) / TC * TC));
	const int ncob = (nbo + TC - 1) / TC;
	tile_fn *tile = pick_tile();

	HI3_ASSERT(w->K == C * kt * 9 && kt % 2 && H % 2 == 0 && W % 2 == 0);
	if (n <= 0)
		return;
	hi3i_cpu_mark_used(be, w);
	for (int64_t q = p0; q < p0 + n;) {
		const struct span sp = image_span(cv, q, p0 + n);
		const int bi = sp.bi, f0 = sp.f0, f1 = sp.f1, fa = sp.fa, fb = sp.fb, nfr = fb - fa;
		const int64_t pb = sp.pb, q1 = sp.q1;
		/* the taps in time that frames [f0, f1) read: [d0, d0 + nd) */
		const int d0 = HI3_MAX(0, pt - (f1 - 1)), nd = HI3_MIN(kt, T + pt - f0) - d0;
		/* output rows per band (even, at least 2): a row costs Wp packed
		 * and 4 W transformed floats per channel and frame */
		const size_t rows = hi3i_cpu_conv_wino_bytes / ((size_t)nfr * C * sizeof(float) * (size_t)(Wp + 4 * W));
		const int bh = (int)HI3_MIN((size_t)H, rows > 4 ? (rows - 2) / 2 * 2 : 2);
		const size_t cs = (size_t)nfr * (size_t)(bh + 2) * Wp + TP2;
		const size_t vxs = (size_t)nfr * (((size_t)(bh / 2) * ntx + TP - 1) / TP) * C * TP;   /* V[xi]'s floats */
		const size_t ufl = (size_t)16 * nbo * C * kt;
		float *xp = hi3i_cpu_scratch(be, cs * C + 16 * vxs + ufl + TP);
		float *v = xp ? xp + cs * C : NULL, *u = xp ? v + 16 * vxs : NULL;
		int failed = 0;

		if (!xp) {
			hi3i_backend_fail(be, "cpu conv: out of memory for the transformed input of %d channels", C);
			return;
		}
#pragma omp parallel reduction(| : failed)
		{
			const int nt = omp_get_num_threads(), id = omp_get_thread_num();
			const size_t ptiles = WPART_BYTES / (16 * TC * TP * sizeof(float)) + (size_t)ncob;
			float *part = hi3i_aligned_alloc(sizeof(float) * 16 * ptiles * TC * TP, NULL);
			float *wf = kind == WF32 ? NULL : malloc(sizeof(float) * (size_t)C * kt * 9);
			float *ob = malloc(sizeof(float) * 4 * TC * TP);

			if (!part || !ob || (kind != WF32 && !wf))
				failed = 1;
			for (int h0 = 0; h0 < H; h0 += bh) {
				const int nh = HI3_MIN(bh, H - h0), nty = nh / 2;
				const size_t plane = (size_t)nty * ntx, fr_tiles = (plane + TP - 1) / TP;
				const size_t npos = (size_t)(f1 - f0) * fr_tiles;
				const int by_pos = npos >= (size_t)nt * 4;
				const size_t pa = by_pos ? npos * (size_t)id / (size_t)nt : 0;
				const size_t pe = by_pos ? npos * (size_t)(id + 1) / (size_t)nt : npos;
				int off[27];

				for (int t = 0; t < nd; t++)   /* tap t of U reads frame f + d0 + t - pt */
					off[t] = (int)((size_t)(t + d0) * fr_tiles * C * TP);
				if (h0 > 0) {
#pragma omp barrier
				}
				pack(xp, cs, x + pb * C, cv, fa, fb, h0, nh, pr, bi);   /* ends with a barrier */
				wino_in(v, vxs, xp, cs, C, nfr, nh + 2, Wp, nty, ntx, fr_tiles);   /* likewise */
				for (int cob = 0; cob < Cout; cob += nbo) {
					const int nb = HI3_MIN(nbo, Cout - cob), nco = (nb + TC - 1) / TC;
					const int ca = by_pos ? 0 : nco * id / nt, ce = by_pos ? nco : nco * (id + 1) / nt;
					const int ncot = ce - ca;
					/* input channels per block: their U[xi] for [ca, ce) in
					 * WBLOCK_BYTES; tiles per block: their 16 products in
					 * WPART_BYTES */
					const int cb = (int)HI3_MAX(16, HI3_MIN((size_t)C, WBLOCK_BYTES / ((size_t)HI3_MAX(ncot, 1) * TC * kt * sizeof(float))));
					const size_t pbk = HI3_MAX(1, WPART_BYTES / ((size_t)HI3_MAX(ncot, 1) * 16 * TC * TP * sizeof(float)));
					const size_t mxs = (size_t)TC * TP;   /* from one xi's products to the next */

					if (cob > 0) {
#pragma omp barrier
					}
					wino_weight(u, w->mat.data, kind, C, kt, d0, nd, cob, nb, wf);   /* ends with a barrier */
					for (size_t b0 = pa; part && ncot > 0 && b0 < pe; b0 += pbk) {
						const size_t b1 = HI3_MIN(pe, b0 + pbk);
						for (int xi = 0; xi < 16; xi++) {
							const struct cgeom g = {C, nb, nd, WF32, 1, (const unsigned char *)(u + (size_t)xi * nb * C * nd),
							                        (size_t)C * nd * sizeof(float), v + (size_t)xi * vxs, TP, off};
							for (int c0 = 0; c0 < C; c0 += cb) {
								const int c1 = HI3_MIN(C, c0 + cb);
								for (size_t pos = b0; pos < b1; pos++) {
									/* the taps of the zero frames left out, as in conv_packed */
									const int f = f0 + (int)(pos / fr_tiles);
									const int t0 = HI3_MAX(0, pt - f) - d0, t1 = HI3_MIN(kt, T + pt - f) - d0;
									const ptrdiff_t v0 = (ptrdiff_t)((f - pt - fa) * (ptrdiff_t)fr_tiles + (ptrdiff_t)(pos % fr_tiles)) * C * TP;
									for (int ct = ca; ct < ce; ct++) {
										float *acc = part + (((pos - b0) * (size_t)ncot + (size_t)(ct - ca)) * 16 + xi) * mxs;
										tile(&g, v0, t0, t1, ct * TC, HI3_MIN(TC, nb - ct * TC), c0, c1, acc);
									}
								}
							}
						}
						for (size_t pos = b0; pos < b1; pos++) {
							const int f = f0 + (int)(pos / fr_tiles);
							for (int ct = ca; ct < ce; ct++)
								wino_store(y, part + ((pos - b0) * (size_t)ncot + (size_t)(ct - ca)) * 16 * mxs, ob, b, cv,
								           Cout, cob + ct * TC, HI3_MIN(TC, nb - ct * TC), pb, f, h0, nty, ntx,
								           (pos % fr_tiles) * TP, q, q1);
						}
					}
				}
			}
			free(part);
			free(wf);
			free(ob);
		}
		if (failed) {
			hi3i_backend_fail(be, "cpu conv: out of memory for the products of %d channels", Cout);
			return;
		}
		q = q1;
	}
}

void hi3i_cpu_conv(hi3_backend *be, float *y, const float *x, const hi3_wt *w, const hi3_wt *b,
                   const struct hi3_conv *cv, const struct hi3_conv_norm *norm, int64_t p0, int64_t n)
{
	struct pre pr;
	float *st;

	void (*run)(hi3_backend *, float *, const float *, const hi3_wt *, const hi3_wt *, const struct hi3_conv *,
	            int64_t, int64_t, const struct pre *) = hi3i_cpu_conv_is_winograd(cv, w->N) ? conv_wino : conv_packed;

	if (!norm) {
		run(be, y, x, w, b, cv, p0, n, NULL);
		return;
	}
	if (norm->act == HI3_ACT_SILU) {
		float probe = 0.0f;
		hi3i_cpu_expf_n(&probe, 1);   /* its first call probes: before pack's threads */
	}
	if (!(st = malloc(sizeof(float) * 2 * (size_t)cv->B * (size_t)norm->G + 1))) {
		hi3i_backend_fail(be, "cpu conv: out of memory for the statistics of %d groups", cv->B * norm->G);
		return;
	}
	pr = (struct pre){st, st + (size_t)cv->B * norm->G, norm->w->f32, norm->b->f32, norm->G, norm->act};
	if (hi3i_cpu_groupnorm_stats(be, st, st + (size_t)cv->B * norm->G, x, cv->B, (int64_t)cv->T * cv->H * cv->W,
	                             cv->C, norm->G, norm->eps) == 0)
		run(be, y, x, w, b, cv, p0, n, &pr);
	free(st);
}
