/*
 * resize.c -- the two resamplers upstream's image preprocessing runs,
 * ported bit for bit:
 *
 *  - Pillow's Image.resize (libImaging/Resample.c, Pillow 12): separable,
 *    support scaled by max(scale, 1), taps normalised in double, then fixed
 *    point with PRECISION_BITS = 32 - 8 - 2 = 22; horizontal pass, then
 *    vertical, each rounding and clipping to uint8. No box reduce: upstream
 *    calls Image.resize without reducing_gap.
 *  - torchvision's v2 resize(BILINEAR, antialias=True) of a uint8 tensor
 *    (torch 2.8, ATen UpSampleKernel.cpp): on a CPU where torch reports the
 *    AVX2 capability the native uint8 kernel (UpSampleKernelAVXAntialias.h:
 *    the same triangle taps in double, as int16 with a precision that
 *    follows the largest tap, uint8 between the passes); elsewhere
 *    torchvision converts to float32, runs _upsample_bilinear2d_aa in float
 *    (taps computed in float) and rounds half to even, as torch's plain
 *    x86-64 build computes it (HI3_TV_FLOAT; its AVX2/AVX-512 builds sum in
 *    a slightly different way that is not reproduced here). The same float
 *    path on float input, any number of channels, is F.interpolate(...,
 *    mode="bilinear", align_corners=False, antialias=True) on the CPU:
 *    hi3i_resize_aa_f32, the SigLIP2 position grid's resize (model/vit.c).
 *
 * Images are (h, w, c) interleaved uint8, c = 1..4. Both passes split rows
 * over OpenMP threads; every output value is computed by one fixed
 * sequence of operations, so the result does not depend on the thread
 * count. This file is compiled with -ffp-contract=off (Makefile.am): the
 * float arithmetic must happen exactly as written.
 */
#include <math.h>
#include <string.h>
#include "core/resize.h"

/* ------------------------------------------------------------ filters */

typedef double (*filter_fn)(double);

static double f_bilinear(double x)
{
	if (x < 0.0)
		x = -x;
	if (x < 1.0)
		return 1.0 - x;
	return 0.0;
}

static double f_bicubic(double x)
{
	const double a = -0.5;  /* Keys; Resample.c's #define a -0.5 */

	if (x < 0.0)
		x = -x;
	if (x < 1.0)
		return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
	if (x < 2.0)
		return (((x - 5) * x + 8) * x - 4) * a;
	return 0.0;
}

static double sinc(double x)
{
	if (x == 0.0)
		return 1.0;
	x = x * M_PI;
	return sin(x) / x;
}

static double f_lanczos(double x)
{
	if (-3.0 <= x && x < 3.0)
		return sinc(x) * sinc(x / 3);
	return 0.0;
}

/* ------------------------------------------------------- one axis */

/* The taps of a resize along one axis: output i reads inputs
 * lo[i] .. lo[i] + n[i] - 1 with weights w[i * ksize + j] (integer, at
 * precision prec) or wf[...] (float). */
struct axis {
	int out, ksize, prec;
	int *lo, *n;            /* (out) */
	int32_t *w;             /* (out, ksize) or NULL */
	float *wf;              /* (out, ksize) or NULL */
};

static void axis_release(struct axis *a)
{
	free(a->lo);
	free(a->n);
	free(a->w);
	free(a->wf);
	memset(a, 0, sizeof(*a));
}

static int axis_alloc(struct axis *a, int out, int ksize, int want_float, hi3_error *err)
{
	memset(a, 0, sizeof(*a));
	a->out = out;
	a->ksize = ksize;
	a->lo = hi3i_calloc((size_t)out, sizeof(int), err);
	a->n = a->lo ? hi3i_calloc((size_t)out, sizeof(int), err) : NULL;
	if (a->n) {
		if (want_float)
			a->wf = hi3i_calloc((size_t)out * (size_t)ksize, sizeof(float), err);
		else
			a->w = hi3i_calloc((size_t)out * (size_t)ksize, sizeof(int32_t), err);
	}
	if (!a->w && !a->wf) {
		axis_release(a);
		return -1;
	}
	return 0;
}

/* Pillow's precompute_coeffs and normalize_coeffs_8bpc (box = the whole
 * image: in0 = 0, in1 = (float)in). */
static int axis_pil(struct axis *a, int in, int out, filter_fn f, double fsupport, hi3_error *err)
{
	double scale = (double)((float)in - 0.0f) / out, filterscale = scale < 1.0 ? 1.0 : scale;
	double support = fsupport * filterscale, *k;
	int ksize = (int)ceil(support) * 2 + 1;

	if (axis_alloc(a, out, ksize, 0, err))
		return -1;
	k = hi3i_malloc((size_t)ksize * sizeof(double), err);
	if (!k) {
		axis_release(a);
		return -1;
	}
	a->prec = 22;
	for (int xx = 0; xx < out; xx++) {
		double center = 0.0f + (xx + 0.5) * scale, ww = 0.0, ss = 1.0 / filterscale;
		int xmin = (int)(center - support + 0.5), xmax;

		if (xmin < 0)
			xmin = 0;
		xmax = (int)(center + support + 0.5);
		if (xmax > in)
			xmax = in;
		xmax -= xmin;
		for (int x = 0; x < xmax; x++) {
			double w = f((x + xmin - center + 0.5) * ss);
			k[x] = w;
			ww += w;
		}
		for (int x = 0; x < xmax; x++)
			if (ww != 0.0)
				k[x] /= ww;
		for (int x = xmax; x < ksize; x++)
			k[x] = 0;
		for (int x = 0; x < ksize; x++)
			a->w[(size_t)xx * ksize + x] = k[x] < 0 ? (int)(-0.5 + k[x] * (1 << 22)) : (int)(0.5 + k[x] * (1 << 22));
		a->lo[xx] = xmin;
		a->n[xx] = xmax;
	}
	free(k);
	return 0;
}

/* ATen's input range of one output: [trunc(lo), trunc(hi)) within
 * [0, in), at most ksize long; lo and hi are center -+ support + 0.5 as
 * each precision computes them. */
static void tv_span(double lo, double hi, int in, int ksize, int64_t *xmin, int64_t *xsize)
{
	int64_t a = (int64_t)lo, b = (int64_t)hi;

	if (a < 0)
		a = 0;
	if (b > in)
		b = in;
	b -= a;
	*xmin = a;
	*xsize = b < 0 ? 0 : b > ksize ? ksize : b;
}

/* ATen's _compute_index_ranges_weights (antialias, the triangle filter)
 * in double, then _compute_index_ranges_int16_weights. */
static int axis_tv_u8(struct axis *a, int in, int out, hi3_error *err)
{
	double scale = (double)in / out, support = scale >= 1.0 ? (2 * 0.5) * scale : 2 * 0.5, wt_max = 0.0, *k;
	int ksize = (int)ceil(support) * 2 + 1;
	unsigned p;

	if (axis_alloc(a, out, ksize, 0, err))
		return -1;
	k = hi3i_calloc((size_t)out * (size_t)ksize, sizeof(double), err);
	if (!k) {
		axis_release(a);
		return -1;
	}
	for (int i = 0; i < out; i++) {
		double center = scale * (i + 0.5), total = 0.0, invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
		double *wt = k + (size_t)i * ksize;
		int64_t xmin, xsize;

		tv_span(center - support + 0.5, center + support + 0.5, in, ksize, &xmin, &xsize);
		for (int64_t j = 0; j < xsize; j++) {
			double w = f_bilinear((j + xmin - center + 0.5) * invscale);
			wt[j] = w;
			total += w;
		}
		if (total != 0.0)
			for (int64_t j = 0; j < xsize; j++) {
				wt[j] /= total;
				wt_max = HI3_MAX(wt_max, wt[j]);
			}
		a->lo[i] = (int)xmin;
		a->n[i] = (int)xsize;
	}
	for (p = 0; p < 22; ++p) {
		int next = (int)(0.5 + wt_max * (1 << (p + 1)));
		if (next >= (1 << 15))
			break;
	}
	a->prec = (int)p;
	for (size_t j = 0; j < (size_t)out * (size_t)ksize; j++) {
		double v = k[j] * (1 << p);
		a->w[j] = (int16_t)(v < 0 ? (int)(-0.5 + v) : (int)(0.5 + v));
	}
	free(k);
	return 0;
}

/* The same in float, as the float32 kernel computes its taps. */
static float tv_filter_f(float x)
{
	x = fabsf(x);
	if (x < 1.0)
		return (float)(1.0 - x);
	return 0.0f;
}

static int axis_tv_f32(struct axis *a, int in, int out, hi3_error *err)
{
	float scale = (float)in / (float)out;
	float support = scale >= 1.0 ? (float)((2 * 0.5) * scale) : (float)(2 * 0.5);
	int ksize = (int)ceilf(support) * 2 + 1;

	if (axis_alloc(a, out, ksize, 1, err))
		return -1;
	for (int i = 0; i < out; i++) {
		float center = (float)(scale * (i + 0.5)), total = 0.0f;
		float invscale = scale >= 1.0 ? (float)(1.0 / scale) : 1.0f, *wt = a->wf + (size_t)i * ksize;
		int64_t xmin, xsize;

		/* center - support in float, + 0.5 in double */
		tv_span((double)(center - support) + 0.5, (double)(center + support) + 0.5, in, ksize, &xmin, &xsize);
		for (int64_t j = 0; j < xsize; j++) {
			float w = tv_filter_f((float)(((float)(j + xmin) - center + 0.5) * invscale));
			wt[j] = w;
			total += w;
		}
		if (total != 0.0f)
			for (int64_t j = 0; j < xsize; j++)
				wt[j] /= total;
		a->lo[i] = (int)xmin;
		a->n[i] = (int)xsize;
	}
	return 0;
}

/* ------------------------------------------------------------- passes */

static inline uint8_t clip8(int32_t acc, int prec)
{
	if (acc < 0)
		return 0;
	acc >>= prec;
	return acc > 255 ? 255 : (uint8_t)acc;
}

/* Integer passes over outputs [o0, o0 + on) of axis a. Both are written
 * so that the compiler vectorises them (and built for AVX2 as well as the
 * baseline, picked at load time): integer sums do not depend on the order,
 * so any vector width gives the same bytes.
 *
 * Along y: output row y is sum_j k[j] * input row (a->lo[y] + j - r0),
 * nv values wide. Along x: a strip of STRIP / C rows is transposed so
 * that each input column is STRIP contiguous bytes, the taps then run
 * down columns exactly as the vertical pass runs down rows, and the
 * result is transposed back. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define MULTIVERSION
#endif
#define STRIP 96                /* values per transposed column: 96 / C rows */

/* d[i] = clip(half + sum_j k[j] * s[j * stride + i]) for i < m, 32 values
 * at a time so that the sums stay in registers. */
static inline __attribute__((always_inline)) void taps32(uint8_t *d, const uint8_t *s, size_t stride,
                                                         const int32_t *k, int n, int prec, const size_t m)
{
	const int32_t half = (int32_t)1 << (prec - 1);
	int32_t acc[32];

	for (size_t i = 0; i < m; i++)
		acc[i] = half;
	for (int j = 0; j < n; j++) {
		const uint8_t *sj = s + (size_t)j * stride;
		const int32_t kj = k[j];
		for (size_t i = 0; i < m; i++)
			acc[i] += sj[i] * kj;
	}
	for (size_t i = 0; i < m; i++)
		d[i] = clip8(acc[i], prec);
}

static inline __attribute__((always_inline)) void taps_block(uint8_t *d, const uint8_t *s, size_t stride,
                                                             const int32_t *k, int n, int prec, const size_t m)
{
	size_t i = 0;

	for (; i + 32 <= m; i += 32)
		taps32(d + i, s + i, stride, k, n, prec, 32);
	if (i < m)
		taps32(d + i, s + i, stride, k, n, prec, m - i);
}

MULTIVERSION static void vrow(uint8_t *d, const uint8_t *s, size_t ss, size_t nv, const int32_t *k, int n, int prec)
{
	size_t x0 = 0;

	for (; x0 + 256 <= nv; x0 += 256)
		taps_block(d + x0, s + x0, ss, k, n, prec, 256);
	if (x0 < nv)
		taps_block(d + x0, s + x0, ss, k, n, prec, nv - x0);
}

static void vpass_int(uint8_t *dst, size_t ds, const uint8_t *src, size_t ss, size_t nv, const struct axis *a,
                      int o0, int on, int r0)
{
#pragma omp parallel for schedule(static) if (HI3_PAR_WORTH(nv * on * a->ksize))
	for (int y = 0; y < on; y++)
		vrow(dst + (size_t)y * ds, src + (size_t)(a->lo[o0 + y] - r0) * ss, ss, nv,
		     a->w + (size_t)(o0 + y) * a->ksize, a->n[o0 + y], a->prec);
}

/* One strip of rows (R = STRIP / C of them, fewer at the end) along x:
 * columns xa .. xb of src into t (column x at (x - xa) * STRIP), the taps
 * into u (output x at x * STRIP), back into rows of dst. */
static inline __attribute__((always_inline)) void hstrip_c(uint8_t *dst, size_t ds, const uint8_t *src, size_t ss,
                                                           int rows, const struct axis *a, int o0, int on, int xa,
                                                           int xb, uint8_t *t, uint8_t *u, const int C)
{
	const int R = STRIP / C;

	/* in: column by column, C bytes from each row (the rows' cache lines
	 * stay resident while x advances) */
	for (int x = xa; x < xb; x++) {
		uint8_t *o = t + (size_t)(x - xa) * STRIP;
		const uint8_t *p = src + (size_t)x * C;
		int r = 0;
		for (; r < rows; r++, p += ss, o += C)
			memcpy(o, p, C);
		for (; r < R; r++, o += C)
			memset(o, 0, C);
	}
	for (int x = 0; x < on; x++)
		taps_block(u + (size_t)x * STRIP, t + (size_t)(a->lo[o0 + x] - xa) * STRIP, STRIP,
		           a->w + (size_t)(o0 + x) * a->ksize, a->n[o0 + x], a->prec, STRIP);
	/* out: row by row */
	for (int r = 0; r < rows; r++) {
		uint8_t *o = dst + (size_t)r * ds;
		const uint8_t *p = u + (size_t)r * C;
		for (int x = 0; x < on; x++, p += STRIP, o += C)
			memcpy(o, p, C);
	}
}

MULTIVERSION static void hstrip(uint8_t *dst, size_t ds, const uint8_t *src, size_t ss, int rows,
                                const struct axis *a, int o0, int on, int xa, int xb, uint8_t *t, uint8_t *u, int C)
{
	switch (C) {
	case 1: hstrip_c(dst, ds, src, ss, rows, a, o0, on, xa, xb, t, u, 1); break;
	case 2: hstrip_c(dst, ds, src, ss, rows, a, o0, on, xa, xb, t, u, 2); break;
	case 3: hstrip_c(dst, ds, src, ss, rows, a, o0, on, xa, xb, t, u, 3); break;
	default: hstrip_c(dst, ds, src, ss, rows, a, o0, on, xa, xb, t, u, 4); break;
	}
}

static int hpass_int(uint8_t *dst, size_t ds, const uint8_t *src, size_t ss, int rows, const struct axis *a, int o0,
                     int on, int C, hi3_error *err)
{
	const int R = STRIP / C, strips = (rows + R - 1) / R;
	const int xa = a->lo[o0], xb = a->lo[o0 + on - 1] + a->n[o0 + on - 1];
	int failed = 0;

#pragma omp parallel if (HI3_PAR_WORTH((size_t)rows * on * a->ksize)) reduction(| : failed)
	{
		uint8_t *t = malloc((size_t)(xb - xa) * STRIP + 1), *u = malloc((size_t)on * STRIP);
		if (!t || !u) {
			failed = 1;
		} else {
#pragma omp for schedule(static)
			for (int st = 0; st < strips; st++) {
				int r0 = st * R;
				hstrip(dst + (size_t)r0 * ds, ds, src + (size_t)r0 * ss, ss, HI3_MIN(R, rows - r0), a, o0, on, xa,
				       xb, t, u, C);
			}
		}
		free(t);
		free(u);
	}
	if (failed)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "resize: out of memory");
	return 0;
}

/* Float passes (torchvision's float32 path): out = x_0 w_0, then
 * out += x_j w_j for j = 1.. in order, each product and sum rounded. The
 * horizontal pass reads uint8 (an image) or float (s8 NULL) input; the
 * two thin wrappers below let the compiler specialise it for each. */
static inline __attribute__((always_inline)) void hpass_f32_any(float *dst, const uint8_t *s8, const float *sf,
                                                                int rows, int in_w, int C, const struct axis *a)
{
#pragma omp parallel for schedule(static) if (HI3_PAR_WORTH((size_t)rows * a->out * a->ksize))
	for (int y = 0; y < rows; y++) {
		const size_t s0 = (size_t)y * in_w * C;
		float *d = dst + (size_t)y * a->out * C;
		for (int x = 0; x < a->out; x++) {
			const float *k = a->wf + (size_t)x * a->ksize;
			const size_t p = s0 + (size_t)a->lo[x] * C;
			for (int c = 0; c < C; c++) {
				float acc = (s8 ? (float)s8[p + c] : sf[p + c]) * k[0];
				for (int j = 1; j < a->n[x]; j++)
					acc = acc + (s8 ? (float)s8[p + (size_t)j * C + c] : sf[p + (size_t)j * C + c]) * k[j];
				d[x * C + c] = acc;
			}
		}
	}
}

static void hpass_f32(float *dst, const uint8_t *src, int rows, int in_w, int C, const struct axis *a)
{
	hpass_f32_any(dst, src, NULL, rows, in_w, C, a);
}

static void hpass_f32f(float *dst, const float *src, int rows, int in_w, int C, const struct axis *a)
{
	hpass_f32_any(dst, NULL, src, rows, in_w, C, a);
}

static void vpass_f32(float *dst, const float *src, int w, int C, const struct axis *a)
{
	const size_t row = (size_t)w * C;

#pragma omp parallel for schedule(static) if (HI3_PAR_WORTH(row * a->out * a->ksize))
	for (int y = 0; y < a->out; y++) {
		const float *k = a->wf + (size_t)y * a->ksize;
		const float *s = src + (size_t)a->lo[y] * row;
		float *d = dst + (size_t)y * row;
		for (size_t i = 0; i < row; i++)
			d[i] = s[i] * k[0];
		for (int j = 1; j < a->n[y]; j++) {
			const float *sj = s + (size_t)j * row;
			for (size_t i = 0; i < row; i++)
				d[i] = d[i] + sj[i] * k[j];
		}
	}
}

/* ------------------------------------------------------------ drivers */

static int check_args(const char *what, const uint8_t *src, int sw, int sh, int c, const uint8_t *dst, int dw,
                      int dh, hi3_error *err)
{
	if (!src || !dst || sw < 1 || sh < 1 || dw < 1 || dh < 1 || c < 1 || c > 4)
		return hi3_error_set(err, HI3_ERR_USAGE, "%s: cannot resize %dx%d (%d channels) to %dx%d", what, sw, sh, c,
		                     dw, dh);
	if ((int64_t)sw * c > INT32_MAX / 2 || (int64_t)dw * c > INT32_MAX / 2)
		return hi3_error_set(err, HI3_ERR_USAGE, "%s: %dx%d to %dx%d: too wide", what, sw, sh, dw, dh);
	return 0;
}

/* The two-pass integer resize both uint8 kernels share, of the window
 * (x0, y0, cw, ch) of the full resize: horizontal when the width changes
 * (ax), vertical when the height does (ay), a copy when neither; the
 * intermediate is uint8 and holds only the rows the vertical pass reads,
 * as Pillow's does. */
static int resize_int(uint8_t *dst, const uint8_t *src, int sw, int sh, int c, const struct axis *ax,
                      const struct axis *ay, int x0, int y0, int cw, int ch, hi3_error *err)
{
	const size_t ss = (size_t)sw * c, ds = (size_t)cw * c;

	if (ax && ay) {
		int r0 = ay->lo[y0], r1 = ay->lo[y0 + ch - 1] + ay->n[y0 + ch - 1];
		uint8_t *tmp = hi3i_malloc((size_t)(r1 - r0) * ds, err);
		if (!tmp)
			return -1;
		if (hpass_int(tmp, ds, src + (size_t)r0 * ss, ss, r1 - r0, ax, x0, cw, c, err)) {
			free(tmp);
			return -1;
		}
		vpass_int(dst, ds, tmp, ds, ds, ay, y0, ch, r0);
		free(tmp);
	} else if (ax) {
		return hpass_int(dst, ds, src + (size_t)y0 * ss, ss, ch, ax, x0, cw, c, err);
	} else if (ay) {
		vpass_int(dst, ds, src + (size_t)x0 * c, ss, ds, ay, y0, ch, 0);
	} else {
		for (int y = 0; y < ch; y++)
			memcpy(dst + (size_t)y * ds, src + (size_t)(y0 + y) * ss + (size_t)x0 * c, ds);
	}
	return 0;
}

int hi3i_resize_pil_crop(const uint8_t *src, int sw, int sh, int c, uint8_t *dst, int rw, int rh, int x0, int y0,
                         int cw, int ch, int filter, hi3_error *err)
{
	struct axis ax = {0}, ay = {0};
	filter_fn f;
	double support;
	int rc = -1;

	if (check_args("resize", src, sw, sh, c, dst, rw, rh, err))
		return -1;
	if (x0 < 0 || y0 < 0 || cw < 1 || ch < 1 || x0 > rw - cw || y0 > rh - ch)
		return hi3_error_set(err, HI3_ERR_USAGE, "resize: crop (%d, %d) %dx%d is outside the %dx%d resize", x0, y0,
		                     cw, ch, rw, rh);
	switch (filter) {
	case HI3_RESAMPLE_BILINEAR: f = f_bilinear; support = 1.0; break;
	case HI3_RESAMPLE_BICUBIC: f = f_bicubic; support = 2.0; break;
	case HI3_RESAMPLE_LANCZOS: f = f_lanczos; support = 3.0; break;
	default: return hi3_error_set(err, HI3_ERR_USAGE, "resize: unknown resampling filter %d", filter);
	}
	if ((rw != sw && axis_pil(&ax, sw, rw, f, support, err)) || (rh != sh && axis_pil(&ay, sh, rh, f, support, err)))
		goto out;
	rc = resize_int(dst, src, sw, sh, c, rw != sw ? &ax : NULL, rh != sh ? &ay : NULL, x0, y0, cw, ch, err);
out:
	axis_release(&ax);
	axis_release(&ay);
	return rc;
}

int hi3_resize_pil(const uint8_t *src, int sw, int sh, int c, uint8_t *dst, int dw, int dh, int filter,
                   hi3_error *err)
{
	return hi3i_resize_pil_crop(src, sw, sh, c, dst, dw, dh, 0, 0, dw, dh, filter, err);
}

/* The float32 path's passes over src (sh, sw, c), uint8 (s8) or float
 * (sf): horizontal, then vertical, each only where the size changes (as
 * ATen skips an axis of the same size); *res (dh, dw, c) is *h or *v, both
 * the caller's to free. */
static int tv_f32_passes(const uint8_t *s8, const float *sf, int sw, int sh, int c, int dw, int dh, float **h,
                         float **v, const float **res, hi3_error *err)
{
	struct axis ax = {0}, ay = {0};
	const size_t nh = (size_t)sh * dw * c;
	int rc = -1;

	*h = *v = NULL;
	if ((dw != sw && axis_tv_f32(&ax, sw, dw, err)) || (dh != sh && axis_tv_f32(&ay, sh, dh, err)))
		goto out;
	if (!(*h = hi3i_malloc(nh * sizeof(float), err)))
		goto out;
	if (dw != sw && s8)
		hpass_f32(*h, s8, sh, sw, c, &ax);
	else if (dw != sw)
		hpass_f32f(*h, sf, sh, sw, c, &ax);
	else if (s8)
		for (size_t i = 0; i < nh; i++)
			(*h)[i] = s8[i];
	else
		memcpy(*h, sf, nh * sizeof(float));
	*res = *h;
	if (dh != sh) {
		if (!(*v = hi3i_malloc((size_t)dh * dw * c * sizeof(float), err)))
			goto out;
		vpass_f32(*v, *h, dw, c, &ay);
		*res = *v;
	}
	rc = 0;
out:
	axis_release(&ax);
	axis_release(&ay);
	return rc;
}

/* torchvision's float32 path: convert, resize in float, round half to
 * even, back to uint8. */
static int resize_tv_f32(const uint8_t *src, int sw, int sh, int c, uint8_t *dst, int dw, int dh, hi3_error *err)
{
	float *h, *v;
	const float *res;
	size_t n = (size_t)dw * dh * c;

	if (tv_f32_passes(src, NULL, sw, sh, c, dw, dh, &h, &v, &res, err)) {
		free(h);
		free(v);
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		float r = rintf(res[i]);
		dst[i] = r <= 0.0f ? 0 : r >= 255.0f ? 255 : (uint8_t)r;
	}
	free(h);
	free(v);
	return 0;
}

int hi3i_resize_aa_f32(const float *src, int sw, int sh, int C, float *dst, int dw, int dh, hi3_error *err)
{
	float *h, *v;
	const float *res;
	int rc;

	if (!src || !dst || sw < 1 || sh < 1 || dw < 1 || dh < 1 || C < 1 || sw > (1 << 16) || sh > (1 << 16) ||
	    dw > (1 << 16) || dh > (1 << 16) || (int64_t)HI3_MAX(sw, dw) * HI3_MAX(sh, dh) * C > ((int64_t)1 << 31))
		return hi3_error_set(err, HI3_ERR_USAGE, "antialiased resize: cannot resize %dx%d (%d channels) to %dx%d",
		                     sw, sh, C, dw, dh);
	rc = tv_f32_passes(NULL, src, sw, sh, C, dw, dh, &h, &v, &res, err);
	if (!rc)
		memcpy(dst, res, (size_t)dw * dh * C * sizeof(float));
	free(h);
	free(v);
	return rc;
}

int hi3_resize_tv(const uint8_t *src, int sw, int sh, int c, uint8_t *dst, int dw, int dh, int kernel,
                  hi3_error *err)
{
	struct axis ax = {0}, ay = {0};
	int rc = -1;

	if (check_args("resize", src, sw, sh, c, dst, dw, dh, err))
		return -1;
	if (sw == dw && sh == dh) {
		memcpy(dst, src, (size_t)sw * sh * c);
		return 0;
	}
	if (kernel == HI3_TV_FLOAT)
		return resize_tv_f32(src, sw, sh, c, dst, dw, dh, err);
	if (kernel != HI3_TV_UINT8)
		return hi3_error_set(err, HI3_ERR_USAGE, "resize: unknown torchvision kernel %d", kernel);
	if ((dw != sw && axis_tv_u8(&ax, sw, dw, err)) || (dh != sh && axis_tv_u8(&ay, sh, dh, err)))
		goto out;
	rc = resize_int(dst, src, sw, sh, c, dw != sw ? &ax : NULL, dh != sh ? &ay : NULL, 0, 0, dw, dh, err);
out:
	axis_release(&ax);
	axis_release(&ay);
	return rc;
}
