/*
 * test-image-ops.c -- the CPU backend's image ops (backend.h) against plain
 * C references in double on random inputs, and their batch invariance: an
 * image gives the same bits alone, inside a batch, and with another
 * thread count.
 *
 * Error measure: ||out - ref|| / ||ref|| over the output, at most 1e-5
 * (fp32 against double); data movement (the shuffles) exact.
 */
#include "config.h"
#include <math.h>
#include <omp.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/cpu.h"
#include "backend/gemm.h"
#include "model/conv.h"
#include "tap.h"
#include "cuda-test.h"

static hi3_backend *cpu, *blas;

static float *randu(size_t n, float lo, float hi)
{
	float *p = malloc(n * sizeof(float) + 4);

	HI3_ASSERT(p);
	for (size_t i = 0; i < n; i++)
		p[i] = lo + (hi - lo) * (float)urand();
	return p;
}

static float *alloc_f(size_t n)
{
	float *p = malloc(n * sizeof(float) + 4);

	HI3_ASSERT(p);
	for (size_t i = 0; i < n; i++)
		p[i] = NAN;
	return p;
}

static double rel_d(const float *out, const double *ref, size_t n)
{
	double num = 0, den = 0;

	for (size_t i = 0; i < n; i++) {
		num += (out[i] - ref[i]) * (out[i] - ref[i]);
		den += ref[i] * ref[i];
	}
	return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The tensors the weights were made from: a weight may read its tensor
 * at first use (backend.h), so they live until the end. */
static hi3_tensor tensors[256];
static int n_tensors;

static hi3_wt *weight_dt(hi3_backend *be, const void *v, hi3_dtype dt, int ndim, const int64_t *shape, int kind)
{
	hi3_tensor *t = &tensors[n_tensors++];
	hi3_error err = {0};
	hi3_wt *w;

	HI3_ASSERT(n_tensors <= (int)HI3_ARRAY_SIZE(tensors));
	*t = (hi3_tensor){.name = "test", .dtype = dt, .ndim = ndim};
	memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
	t->nbytes = (size_t)hi3_tensor_numel(t) * hi3_dtype_size(dt);
	t->data = (void *)v;
	w = be->ops->weight(be, t, kind, &err);
	HI3_ASSERT(w);
	return w;
}

static hi3_wt *weight(hi3_backend *be, const float *v, int ndim, const int64_t *shape, int kind)
{
	return weight_dt(be, v, HI3_F32, ndim, shape, kind);
}

static hi3_wt *vec(hi3_backend *be, const float *v, int n)
{
	int64_t s[1] = {n};
	return weight(be, v, 1, s, HI3_WT_VECTOR);
}

/* ---------------------------------------------------------------- conv */

/* y (B, T, H, W, Co) = conv of x with w [Co, C, kt, kh, kw] + b, in double */
static void conv_ref(double *y, const float *x, const float *w, const float *b, const struct hi3_conv *cv, int Co)
{
	const int T = cv->T, H = cv->H, W = cv->W, C = cv->C;

	for (int bi = 0; bi < cv->B; bi++)
		for (int t = 0; t < T; t++)
			for (int yy = 0; yy < H; yy++)
				for (int xx = 0; xx < W; xx++)
					for (int o = 0; o < Co; o++) {
						double s = b[o];
						for (int c = 0; c < C; c++)
							for (int dt = 0; dt < cv->kt; dt++)
								for (int dy = 0; dy < cv->kh; dy++)
									for (int dx = 0; dx < cv->kw; dx++) {
										int ti = t + dt - cv->kt / 2, yi = yy + dy - cv->kh / 2,
										    xi = xx + dx - cv->kw / 2;
										if (ti < 0 || ti >= T || yi < 0 || yi >= H || xi < 0 || xi >= W)
											continue;
										s += (double)w[(((o * C + c) * cv->kt + dt) * cv->kh + dy) * cv->kw + dx] *
										     x[((((size_t)bi * T + ti) * H + yi) * W + xi) * C + c];
									}
						y[((((size_t)bi * T + t) * H + yy) * W + xx) * Co + o] = s;
					}
}

/* y (B, P, C) = act(groupnorm(x)) in float, as the groupnorm op: for
 * the conv's fused normalisation */
static void conv_input_ref(float *y, const float *x, const hi3_wt *w, const hi3_wt *b, int B, int64_t P, int C, int G,
                           float eps, int act)
{
	cpu->ops->groupnorm(cpu, y, x, w, b, B, P, C, G, eps, act);
}

/* The conv op (lib/backend/cpu-conv.c) through hi3i_conv: against the
 * direct sum in double; the exact order (one chain over the weight's k,
 * then + b, every kernel the CPU has); a range of rows, an image alone, a
 * bf16 weight (widening is exact), and a normalised input (the bits of
 * groupnorm then conv). C = 70 > 64 carries partial sums over blocks of
 * input channels; Co = 13 leaves a tile of 1 channel, 16 and 20 tiles of
 * 4 and 8 (the AVX-512 kernel's own cases); W = 4 puts 2 columns of
 * padding between rows of a tile. */
/* What every conv case checks beside its own order, cw and cv its
 * weights and shapes, y its output of x (P rows of Co), y2 and yr
 * scratch of as many: image 1 alone on one thread gives its bits in the
 * batch; the conv of a bf16 weight gives the bits of its f32 widening. */
static void check_conv_alone_bf16(const char *name, const struct hi3_conv_w *cw, const struct hi3_conv *cv,
                                  const float *x, const float *w, const float *y, float *y2, float *yr)
{
	const int Co = cw->Cout, kt = cw->kt, k = cw->kh;
	const size_t P = (size_t)cv->B * cv->T * cv->H * cv->W, P1 = P / (size_t)cv->B, K = (size_t)cw->C * kt * k * k;
	int64_t ws[5] = {Co, cw->C, kt, k, k}, s4[4] = {Co, cw->C, k, k};
	uint16_t *wb = malloc(2 * (size_t)Co * K);
	float *wbf = malloc(sizeof(float) * (size_t)Co * K);
	struct hi3_conv_w cb = *cw;

	HI3_ASSERT(wb && wbf);
	if (cv->B > 1) {
		struct hi3_conv one = *cv;
		one.B = 1;
		omp_set_num_threads(1);
		hi3i_conv(cpu, y2, x + P1 * cw->C, cw, &one, NULL);
		omp_set_num_threads(2);
		ok(!memcmp(y2, y + P1 * Co, sizeof(float) * P1 * Co), "%s: image 1 alone on one thread gives its bits in "
		   "the batch of %d", name, cv->B);
	}
	for (size_t i = 0; i < (size_t)Co * K; i++) {
		wb[i] = hi3_f32_to_bf16(w[i]);
		wbf[i] = hi3_bf16_to_f32(wb[i]);
	}
	cb.w = weight_dt(cpu, wb, HI3_BF16, kt > 1 ? 5 : 4, kt > 1 ? ws : s4, HI3_WT_MATRIX);
	hi3i_conv(cpu, y2, x, &cb, cv, NULL);
	cpu->ops->weight_free(cpu, cb.w);
	cb.w = weight(cpu, wbf, kt > 1 ? 5 : 4, kt > 1 ? ws : s4, HI3_WT_MATRIX);
	hi3i_conv(cpu, yr, x, &cb, cv, NULL);
	ok(!memcmp(y2, yr, sizeof(float) * P * Co), "%s: a bf16 weight gives the bits of its f32 widening", name);
	cpu->ops->weight_free(cpu, cb.w);
	free(wb);
	free(wbf);
}

static void test_conv(int kt, int k, int B, int C, int Co)
{
	const int T = 3, H = 5, W = 4, taps = kt * k * k;
	const struct hi3_conv cv = {B, T, H, W, C, kt, k, k};
	const size_t P = (size_t)B * T * H * W, K = (size_t)C * taps;
	float *x = randu(P * C, -1, 1), *w = randu((size_t)Co * K, -0.5f, 0.5f), *b = randu(Co, -1, 1);
	float *y = alloc_f(P * Co), *y2 = alloc_f(P * Co), *yr = alloc_f(P * Co), *xn = alloc_f(P * C);
	double *ref = malloc(sizeof(double) * P * Co);
	int64_t ws[5] = {Co, C, kt, k, k}, s4[4] = {Co, C, k, k};
	struct hi3_conv_w cw = {.Cout = Co, .C = C, .kt = kt, .kh = k, .kw = k};
	int exact = 1;
	char name[64];

	HI3_ASSERT(ref);
	cw.w = weight(cpu, w, kt > 1 ? 5 : 4, kt > 1 ? ws : s4, HI3_WT_MATRIX);
	cw.b = vec(cpu, b, Co);
	conv_ref(ref, x, w, b, &cv, Co);
	hi3i_conv(cpu, y, x, &cw, &cv, NULL);
	ok(rel_d(y, ref, P * Co) <= 1e-6, "conv %dx%dx%d B=%d C=%d: against the direct sum in double (%.1e)", kt, k, k, B,
	   C, rel_d(y, ref, P * Co));
	if (taps > 1) {
		/* the order of backend.h: fmaf over k = (c, dt, dy, dx), then + b */
		for (int bi = 0; bi < B; bi++)
			for (int t = 0; t < T; t++)
				for (int yy = 0; yy < H; yy++)
					for (int xx = 0; xx < W; xx++)
						for (int o = 0; o < Co; o++) {
							float a = 0.0f;
							for (int c = 0; c < C; c++)
								for (int dt = 0; dt < kt; dt++)
									for (int dy = 0; dy < k; dy++)
										for (int dx = 0; dx < k; dx++) {
											int ti = t + dt - kt / 2, yi = yy + dy - k / 2, xi = xx + dx - k / 2;
											int in = ti >= 0 && ti < T && yi >= 0 && yi < H && xi >= 0 && xi < W;
											float xv = in ? x[((((size_t)bi * T + ti) * H + yi) * W + xi) * C + c]
											              : 0.0f;
											a = fmaf(xv, w[(((size_t)(o * C + c) * kt + dt) * k + dy) * k + dx], a);
										}
							exact &= a + b[o] == y[((((size_t)bi * T + t) * H + yy) * W + xx) * Co + o];
						}
		ok(exact, "conv %dx%dx%d C=%d: one fused multiply-add chain over the weight's k, then + b, bit for bit", kt, k,
		   k, C);
		for (int level = 0; level < hi3i_gemm_level(); level++) {
			hi3i_gemm_isa(level);
			hi3i_conv(cpu, y2, x, &cw, &cv, NULL);
			hi3i_gemm_isa(-1);
			ok(!memcmp(y2, y, sizeof(float) * P * Co), "conv %dx%dx%d C=%d: the %s kernel gives the same bits", kt, k,
			   k, C, level ? "AVX2" : "portable");
		}
	}
	/* rows [7, 7 + 29) alone: the same bits as in the whole */
	for (size_t i = 0; i < P * Co; i++)
		y2[i] = NAN;
	hi3i_conv_rows(cpu, y2, x, &cw, &cv, NULL, 7, 29);
	ok(!memcmp(y2 + 7 * Co, y + 7 * Co, sizeof(float) * 29 * Co) && isnan(y2[7 * Co - 1]) && isnan(y2[36 * Co]),
	   "conv %dx%dx%d: a range of rows gives the bits of the whole, and writes nothing else", kt, k, k);
	/* frames convolved in bands of 1 and of 2 rows (the packed input's
	 * budget cut to fit them), the whole and a range of rows */
	for (int bh = 1; bh <= 2; bh++) {
		const size_t keep = hi3i_cpu_conv_pack_bytes;
		hi3i_cpu_conv_pack_bytes = bh == 1 ? 1 : (size_t)(bh + k / 2 * 2) * T * (W + k / 2 * 2) * C * sizeof(float);
		hi3i_conv(cpu, y2, x, &cw, &cv, NULL);
		ok(!memcmp(y2, y, sizeof(float) * P * Co), "conv %dx%dx%d C=%d: in bands of %d row%s, the same bits", kt, k, k, C,
		   bh, bh > 1 ? "s" : "");
		for (size_t i = 0; i < P * Co; i++)
			y2[i] = NAN;
		hi3i_conv_rows(cpu, y2, x, &cw, &cv, NULL, 7, 29);
		ok(!memcmp(y2 + 7 * Co, y + 7 * Co, sizeof(float) * 29 * Co) && isnan(y2[7 * Co - 1]) && isnan(y2[36 * Co]),
		   "conv %dx%dx%d C=%d: in bands of %d row%s, a range of rows too", kt, k, k, C, bh, bh > 1 ? "s" : "");
		hi3i_cpu_conv_pack_bytes = keep;
	}
	snprintf(name, sizeof(name), "conv %dx%dx%d C=%d", kt, k, k, C);
	check_conv_alone_bf16(name, &cw, &cv, x, w, y, y2, yr);
	if (C % 2 == 0 && taps > 1) {
		/* the normalised input: groupnorm (2 groups, swish) then conv, bit for bit */
		const int G = 2;
		float *gw = randu((size_t)C, 0.5f, 1.5f), *gb = randu((size_t)C, -0.5f, 0.5f);
		hi3_wt *nw = vec(cpu, gw, C), *nb = vec(cpu, gb, C);
		const struct hi3_conv_norm gn = {nw, nb, G, HI3_ACT_SILU, 1e-6f};
		conv_input_ref(xn, x, nw, nb, B, (int64_t)(P / B), C, G, 1e-6f, HI3_ACT_SILU);
		hi3i_conv(cpu, y, xn, &cw, &cv, NULL);
		hi3i_conv_rows(cpu, y2, x, &cw, &cv, &gn, 0, (int64_t)P);
		ok(!memcmp(y2, y, sizeof(float) * P * Co), "conv %dx%dx%d: with its input normalised (groupnorm, swish) "
		   "gives the bits of groupnorm then conv", kt, k, k);
		for (size_t i = 0; i < P * Co; i++)
			y2[i] = NAN;
		hi3i_conv_rows(cpu, y2, x, &cw, &cv, &gn, 7, 29);
		ok(!memcmp(y2 + 7 * Co, y + 7 * Co, sizeof(float) * 29 * Co), "conv %dx%dx%d: ... on a range of rows too "
		   "(statistics of whole images)", kt, k, k);
		cpu->ops->weight_free(cpu, nw);
		cpu->ops->weight_free(cpu, nb);
		free(gw), free(gb);
	}
	hi3i_conv_free(&cw, cpu);
	free(x), free(w), free(b), free(y), free(y2), free(yr), free(xn), free(ref);
}

/* The order of a Winograd F(2x2, 3x3) conv (lib/backend/cpu-conv.c), in
 * float: per 2 x 2 output tile and output channel o, the 16 products M =
 * one fmaf chain over (c, dt) from +0 (the frames outside the image left
 * out) of U = G' g G'^T / 4 by V = B^T d B, then A^T M A + b; every
 * transform in the order cpu-conv.c writes it. */
static void conv_wino_ref(float *y, const float *x, const float *w, const float *b, const struct hi3_conv *cv, int Co)
{
	const int T = cv->T, H = cv->H, W = cv->W, C = cv->C, kt = cv->kt, pt = kt / 2;

	for (int bi = 0; bi < cv->B; bi++)
		for (int t = 0; t < T; t++)
			for (int ty = 0; ty < H / 2; ty++)
				for (int tx = 0; tx < W / 2; tx++)
					for (int o = 0; o < Co; o++) {
						float m[16] = {0}, s[2][4], r[2][2];
						for (int c = 0; c < C; c++)
							for (int dt = 0; dt < kt; dt++) {
								const int ti = t + dt - pt;
								const float *g = w + (((size_t)o * C + c) * kt + dt) * 9;
								float d[4][4], e[4][4], a[4][3], v[16], u[16];
								if (ti < 0 || ti >= T)
									continue;
								for (int i = 0; i < 4; i++)
									for (int j = 0; j < 4; j++) {
										const int yy = 2 * ty - 1 + i, xx = 2 * tx - 1 + j;
										d[i][j] = yy < 0 || yy >= H || xx < 0 || xx >= W ? 0.0f :
										          x[((((size_t)bi * T + ti) * H + yy) * W + xx) * C + c];
									}
								for (int j = 0; j < 4; j++) {
									e[0][j] = d[0][j] - d[2][j];
									e[1][j] = d[1][j] + d[2][j];
									e[2][j] = d[2][j] - d[1][j];
									e[3][j] = d[1][j] - d[3][j];
								}
								for (int i = 0; i < 4; i++) {
									v[4 * i + 0] = e[i][0] - e[i][2];
									v[4 * i + 1] = e[i][1] + e[i][2];
									v[4 * i + 2] = e[i][2] - e[i][1];
									v[4 * i + 3] = e[i][1] - e[i][3];
								}
								for (int j = 0; j < 3; j++) {
									a[0][j] = g[j] + g[j];
									a[1][j] = g[j] + g[3 + j] + g[6 + j];
									a[2][j] = g[j] - g[3 + j] + g[6 + j];
									a[3][j] = g[6 + j] + g[6 + j];
								}
								for (int i = 0; i < 4; i++) {
									u[4 * i + 0] = (a[i][0] + a[i][0]) * 0.25f;
									u[4 * i + 1] = (a[i][0] + a[i][1] + a[i][2]) * 0.25f;
									u[4 * i + 2] = (a[i][0] - a[i][1] + a[i][2]) * 0.25f;
									u[4 * i + 3] = (a[i][2] + a[i][2]) * 0.25f;
								}
								for (int k = 0; k < 16; k++)
									m[k] = fmaf(v[k], u[k], m[k]);
							}
						for (int k = 0; k < 4; k++) {
							s[0][k] = m[k] + m[4 + k] + m[8 + k];
							s[1][k] = m[4 + k] - m[8 + k] - m[12 + k];
						}
						for (int i = 0; i < 2; i++) {
							r[i][0] = s[i][0] + s[i][1] + s[i][2];
							r[i][1] = s[i][1] - s[i][2] - s[i][3];
						}
						for (int i = 0; i < 2; i++)
							for (int j = 0; j < 2; j++)
								y[((((size_t)bi * T + t) * H + 2 * ty + i) * W + 2 * tx + j) * Co + o] = r[i][j] + b[o];
					}
}

/* The conv op's Winograd path (a 3 x 3 spatial kernel over even frames):
 * against the direct sum in double; the order of conv_wino_ref bit for
 * bit, with every kernel the CPU has; in bands of 2 rows and blocks of
 * output channels; a range of rows; an image alone on one thread; a bf16
 * weight; a normalised input. force: whether hi3i_cpu_conv_winograd makes
 * the shape take it (else the rule must choose it). */
static void test_conv_wino(int kt, int B, int T, int H, int W, int C, int Co, int force)
{
	const struct hi3_conv cv = {B, T, H, W, C, kt, 3, 3};
	const size_t P = (size_t)B * T * H * W, K = (size_t)C * kt * 9, P1 = P / (size_t)B;
	float *x = randu(P * C, -1, 1), *w = randu((size_t)Co * K, -0.5f, 0.5f), *b = randu(Co, -1, 1);
	float *y = alloc_f(P * Co), *y2 = alloc_f(P * Co), *yr = alloc_f(P * Co), *xn = alloc_f(P * C);
	double *ref = malloc(sizeof(double) * P * Co);
	int64_t ws[5] = {Co, C, kt, 3, 3}, s4[4] = {Co, C, 3, 3};
	struct hi3_conv_w cw = {.Cout = Co, .C = C, .kt = kt, .kh = 3, .kw = 3};
	const size_t keep = hi3i_cpu_conv_wino_bytes;
	char name[96];

	HI3_ASSERT(ref);
	snprintf(name, sizeof(name), "winograd conv %dx3x3 B=%d T=%d %dx%d C=%d Co=%d", kt, B, T, H, W, C, Co);
	hi3i_cpu_conv_winograd = force ? 1 : -1;
	cw.w = weight(cpu, w, kt > 1 ? 5 : 4, kt > 1 ? ws : s4, HI3_WT_MATRIX);
	cw.b = vec(cpu, b, Co);
	conv_ref(ref, x, w, b, &cv, Co);
	conv_wino_ref(yr, x, w, b, &cv, Co);
	hi3i_conv(cpu, y, x, &cw, &cv, NULL);
	ok(rel_d(y, ref, P * Co) <= 1e-5, "%s: against the direct sum in double (%.1e)", name, rel_d(y, ref, P * Co));
	ok(!memcmp(y, yr, sizeof(float) * P * Co), "%s: the order of the Winograd transforms and one fmaf chain over "
	   "(c, dt), bit for bit", name);
	for (int level = 0; level < hi3i_gemm_level(); level++) {
		hi3i_gemm_isa(level);
		hi3i_conv(cpu, y2, x, &cw, &cv, NULL);
		hi3i_gemm_isa(-1);
		ok(!memcmp(y2, y, sizeof(float) * P * Co), "%s: the %s kernel gives the same bits", name,
		   level ? "AVX2" : "portable");
	}
	omp_set_num_threads(1);
	hi3i_conv(cpu, y2, x, &cw, &cv, NULL);
	omp_set_num_threads(2);
	ok(!memcmp(y2, y, sizeof(float) * P * Co), "%s: one thread gives the bits of two", name);
	for (size_t i = 0; i < P * Co; i++)
		y2[i] = NAN;
	hi3i_conv_rows(cpu, y2, x, &cw, &cv, NULL, 7, 29);
	ok(!memcmp(y2 + 7 * Co, y + 7 * Co, sizeof(float) * 29 * Co) && isnan(y2[7 * Co - 1]) && isnan(y2[36 * Co]),
	   "%s: a range of rows gives the bits of the whole, and writes nothing else", name);
	/* bands of 2 rows and blocks of TC output channels (the budget cut to
	 * fit them), the whole and a range of rows */
	hi3i_cpu_conv_wino_bytes = 1;
	hi3i_conv(cpu, y2, x, &cw, &cv, NULL);
	ok(!memcmp(y2, y, sizeof(float) * P * Co), "%s: in bands of 2 rows and blocks of output channels, the same bits",
	   name);
	for (size_t i = 0; i < P * Co; i++)
		y2[i] = NAN;
	hi3i_conv_rows(cpu, y2, x, &cw, &cv, NULL, 7, 29);
	ok(!memcmp(y2 + 7 * Co, y + 7 * Co, sizeof(float) * 29 * Co) && isnan(y2[7 * Co - 1]) && isnan(y2[36 * Co]),
	   "%s: ... a range of rows too", name);
	hi3i_cpu_conv_wino_bytes = keep;
	check_conv_alone_bf16(name, &cw, &cv, x, w, y, y2, yr);
	{
		const int G = 2;
		float *gw = randu((size_t)C, 0.5f, 1.5f), *gb = randu((size_t)C, -0.5f, 0.5f);
		hi3_wt *nw = vec(cpu, gw, C), *nb = vec(cpu, gb, C);
		const struct hi3_conv_norm gn = {nw, nb, G, HI3_ACT_SILU, 1e-6f};
		conv_input_ref(xn, x, nw, nb, B, (int64_t)P1, C, G, 1e-6f, HI3_ACT_SILU);
		hi3i_conv(cpu, yr, xn, &cw, &cv, NULL);
		hi3i_conv_rows(cpu, y2, x, &cw, &cv, &gn, 0, (int64_t)P);
		ok(!memcmp(y2, yr, sizeof(float) * P * Co), "%s: with its input normalised (groupnorm, swish) gives the bits "
		   "of groupnorm then conv", name);
		cpu->ops->weight_free(cpu, nw);
		cpu->ops->weight_free(cpu, nb);
		free(gw), free(gb);
	}
	hi3i_cpu_conv_winograd = -1;
	hi3i_conv_free(&cw, cpu);
	free(x), free(w), free(b), free(y), free(y2), free(yr), free(xn), free(ref);
}

/* The rule (cpu-conv.c): an odd frame or a 1 x 1 kernel stays direct even
 * when Winograd is asked for; a small 3 x 3 conv (fewer than 16
 * channels, or a frame under 256 positions) is direct by the rule. */
static void test_conv_rule(void)
{
	const struct hi3_conv odd = {1, 1, 5, 4, 16, 1, 3, 3}, few = {1, 1, 16, 16, 8, 1, 3, 3};
	const struct hi3_conv big = {1, 1, 8, 32, 16, 3, 3, 3}, one = {1, 1, 16, 16, 16, 1, 1, 1};
	const struct hi3_conv tiny = {1, 4, 8, 8, 16, 3, 3, 3};

	hi3i_cpu_conv_winograd = 1;
	ok(!hi3i_cpu_conv_is_winograd(&odd, 16) && !hi3i_cpu_conv_is_winograd(&one, 16) &&
	   hi3i_cpu_conv_is_winograd(&few, 16), "winograd asked for: an odd frame and a 1x1 kernel stay direct");
	hi3i_cpu_conv_winograd = -1;
	ok(hi3i_cpu_conv_is_winograd(&big, 16) && !hi3i_cpu_conv_is_winograd(&few, 16) &&
	   !hi3i_cpu_conv_is_winograd(&big, 8) && !hi3i_cpu_conv_is_winograd(&tiny, 16),
	   "the rule: 3x3 over an even frame of at least 256 positions with at least 16 channels in and out is "
	   "Winograd");
	hi3i_cpu_conv_winograd = 0;
	ok(!hi3i_cpu_conv_is_winograd(&big, 16), "winograd off: every conv direct");
	hi3i_cpu_conv_winograd = -1;
}

/* ---------------------------------------------------------------- norms */

static double act_ref(double x, int act)
{
	switch (act) {
	case HI3_ACT_SILU: return x / (1 + exp(-x));
	case HI3_ACT_GELU: return 0.5 * x * (1 + erf(x / sqrt(2.0)));
	case HI3_ACT_GELU_TANH: return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
	}
	return x;
}

static void groupnorm_ref(double *y, const float *x, const float *w, const float *b, int B, int64_t P, int C, int G,
                          double eps, int act)
{
	const int cg = C / G;

	for (int bi = 0; bi < B; bi++)
		for (int g = 0; g < G; g++) {
			double s = 0, ss = 0, n = (double)P * cg, mean, var;
			for (int64_t p = 0; p < P; p++)
				for (int c = g * cg; c < (g + 1) * cg; c++)
					s += x[((size_t)bi * P + p) * C + c];
			mean = s / n;
			for (int64_t p = 0; p < P; p++)
				for (int c = g * cg; c < (g + 1) * cg; c++) {
					double e = x[((size_t)bi * P + p) * C + c] - mean;
					ss += e * e;
				}
			var = ss / n;
			for (int64_t p = 0; p < P; p++)
				for (int c = g * cg; c < (g + 1) * cg; c++) {
					size_t i = ((size_t)bi * P + p) * C + c;
					y[i] = act_ref((x[i] - mean) / sqrt(var + eps) * w[c] + b[c], act);
				}
		}
}

static void test_groupnorm(int64_t P, int act)
{
	const int B = 3, C = 32, G = 8;
	const size_t n = (size_t)B * P * C, n1 = (size_t)P * C;
	float *x = randu(n, -2, 3), *w = randu(C, 0.5f, 1.5f), *b = randu(C, -0.5f, 0.5f), *y = alloc_f(n), *y1 = alloc_f(n1);
	double *ref = malloc(sizeof(double) * n);
	hi3_wt *ww = vec(cpu, w, C), *bw = vec(cpu, b, C);

	groupnorm_ref(ref, x, w, b, B, P, C, G, 1e-6, act);
	cpu->ops->groupnorm(cpu, y, x, ww, bw, B, P, C, G, 1e-6f, act);
	ok(rel_d(y, ref, n) <= 1e-6, "groupnorm P=%lld act=%d against double (%.1e)", (long long)P, act, rel_d(y, ref, n));
	omp_set_num_threads(1);
	cpu->ops->groupnorm(cpu, y1, x + 2 * n1, ww, bw, 1, P, C, G, 1e-6f, act);
	omp_set_num_threads(2);
	ok(!memcmp(y1, y + 2 * n1, n1 * sizeof(float)), "groupnorm: image 2 alone on one thread gives its bits in the "
	   "batch of 3");
	memcpy(y1, x, n1 * sizeof(float));
	cpu->ops->groupnorm(cpu, y1, y1, ww, bw, 1, P, C, G, 1e-6f, act);
	ok(!memcmp(y1, y, n1 * sizeof(float)), "groupnorm in place");
	cpu->ops->weight_free(cpu, ww);
	cpu->ops->weight_free(cpu, bw);
	free(x), free(w), free(b), free(y), free(y1), free(ref);
}

static void test_layernorm(void)
{
	const int M = 7, n = 1152;
	float *x = randu((size_t)M * n, -3, 2), *w = randu(n, 0.5f, 1.5f), *b = randu(n, -1, 1), *y = alloc_f((size_t)M * n),
	      *y1 = alloc_f(n);
	double *ref = malloc(sizeof(double) * M * n);
	hi3_wt *ww = vec(cpu, w, n), *bw = vec(cpu, b, n);

	for (int m = 0; m < M; m++) {
		double s = 0, ss = 0, mean;
		for (int i = 0; i < n; i++)
			s += x[m * n + i];
		mean = s / n;
		for (int i = 0; i < n; i++)
			ss += (x[m * n + i] - mean) * (x[m * n + i] - mean);
		for (int i = 0; i < n; i++)
			ref[m * n + i] = (x[m * n + i] - mean) / sqrt(ss / n + 1e-6) * w[i] + b[i];
	}
	cpu->ops->layernorm(cpu, y, x, ww, bw, M, n, 1e-6f);
	ok(rel_d(y, ref, (size_t)M * n) <= 1e-6, "layernorm against double (%.1e)", rel_d(y, ref, (size_t)M * n));
	cpu->ops->layernorm(cpu, y1, x + 4 * n, ww, bw, 1, n, 1e-6f);
	ok(!memcmp(y1, y + 4 * n, sizeof(float) * n), "layernorm: row 4 alone gives its bits in the batch");
	cpu->ops->weight_free(cpu, ww);
	cpu->ops->weight_free(cpu, bw);
	free(x), free(w), free(b), free(y), free(y1), free(ref);
}

/* ------------------------------------------------------------ elementwise */

static void test_elementwise(void)
{
	const int B = 2, P = 30, C = 12, r = 3;
	const size_t n = (size_t)B * P * C;
	float *x = randu(n, -6, 6), *y = alloc_f(n), *ss = randu((size_t)B * 2 * C, -1, 1), *z = randu(n / r, -1, 1);
	float *zz = randu(n * r, -1, 1), *bias = randu(C, -1, 1);
	double *ref = malloc(sizeof(double) * n);
	static const char *names[] = {"none", "silu", "gelu", "gelu_tanh"};
	hi3_wt *bw = vec(cpu, bias, C);

	for (int a = HI3_ACT_SILU; a <= HI3_ACT_GELU_TANH; a++) {
		for (size_t i = 0; i < n; i++)
			ref[i] = act_ref(x[i], a);
		cpu->ops->act(cpu, y, x, n, a);
		ok(rel_d(y, ref, n) <= 1e-6, "act %s against double (%.1e)", names[a], rel_d(y, ref, n));
	}
	{
		/* 5000 values, -12 .. 12 and past tanh's saturation: the vector
		 * GELU (tanh) gives the scalar's bits, both near the exact one */
		const size_t m = 5000;
		float *u = randu(m, -12, 12), *v1 = alloc_f(m), *v2 = alloc_f(m);
		double *r2 = malloc(sizeof(double) * m);
		u[0] = 0.0f, u[1] = -0.0f, u[2] = 40.0f, u[3] = -40.0f, u[4] = 1e-20f;
		for (size_t i = 0; i < m; i++)
			r2[i] = act_ref(u[i], HI3_ACT_GELU_TANH);
		cpu->ops->act(cpu, v1, u, m, HI3_ACT_GELU_TANH);
		for (int level = 0; level < hi3i_gemm_level(); level++) {
			hi3i_gemm_isa(level);
			cpu->ops->act(cpu, v2, u, m, HI3_ACT_GELU_TANH);
			hi3i_gemm_isa(-1);
			ok(!memcmp(v1, v2, m * sizeof(float)), "act gelu_tanh over %zu values: the %s code gives the same bits", m,
			   level ? "AVX2" : "portable");
		}
		ok(rel_d(v1, r2, m) <= 1e-6, "act gelu_tanh over %zu values against double (%.1e)", m, rel_d(v1, r2, m));
		free(u), free(v1), free(v2), free(r2);
	}
	memcpy(y, x, n * sizeof(float));
	cpu->ops->bias_add(cpu, y, bw, (int64_t)B * P, C);
	for (size_t i = 0; i < n; i++)
		ref[i] = (double)x[i] + bias[i % C];
	ok(rel_d(y, ref, n) <= 1e-7, "bias_add");
	memcpy(y, x, n * sizeof(float));
	cpu->ops->scale_shift(cpu, y, ss, B, P, C);
	for (size_t i = 0; i < n; i++) {
		size_t b = i / ((size_t)P * C), c = i % C;
		ref[i] = x[i] * (1.0 + ss[b * 2 * C + c]) + ss[b * 2 * C + C + c];
	}
	ok(rel_d(y, ref, n) <= 1e-6, "scale_shift: h (1 + scale) + shift per image and channel (%.1e)", rel_d(y, ref, n));
	memcpy(y, x, n * sizeof(float));
	cpu->ops->add_repeat(cpu, y, z, (int64_t)B * P, C, r);
	for (size_t i = 0; i < n; i++)
		ref[i] = (double)x[i] + z[i / C * (C / r) + i % C / r];
	ok(rel_d(y, ref, n) <= 1e-7, "add_repeat: x[p, c] += z[p, c / r]");
	memcpy(y, x, n * sizeof(float));
	cpu->ops->add_group_mean(cpu, y, zz, (int64_t)B * P, C, r);
	for (size_t i = 0; i < n; i++) {
		double s = 0;
		for (int g = 0; g < r; g++)
			s += zz[i * r + g];
		ref[i] = x[i] + s / r;
	}
	ok(rel_d(y, ref, n) <= 1e-6, "add_group_mean: x[p, c] += mean of z[p, c r .. c r + r - 1]");
	cpu->ops->weight_free(cpu, bw);
	free(x), free(y), free(ss), free(z), free(zz), free(bias), free(ref);
}

/* einops "b (r1 r2 r3 c) f h w -> b c (f r1) (h r2) (w r3)" on channels-last
 * arrays, written from the output side. */
static void test_shuffle(int rt)
{
	const int B = 2, T = 2, H = 3, W = 5, C = 4, Cl = rt * 4 * C;
	const size_t n = (size_t)B * T * H * W * Cl;
	float *x = randu(n, -1, 1), *y = alloc_f(n), *ref = alloc_f(n), *back = alloc_f(n);

	for (int b = 0; b < B; b++)
		for (int f = 0; f < T * rt; f++)
			for (int yy = 0; yy < 2 * H; yy++)
				for (int xx = 0; xx < 2 * W; xx++)
					for (int c = 0; c < C; c++) {
						int r1 = f % rt, r2 = yy % 2, r3 = xx % 2;
						int ch = ((r1 * 2 + r2) * 2 + r3) * C + c;
						ref[((((size_t)b * T * rt + f) * 2 * H + yy) * 2 * W + xx) * C + c] =
							x[((((size_t)b * T + f / rt) * H + yy / 2) * W + xx / 2) * Cl + ch];
					}
	cpu->ops->depth_to_space(cpu, y, x, B, T, H, W, C, rt);
	ok(!memcmp(y, ref, n * sizeof(float)), "depth_to_space rt=%d: the einops rearrangement", rt);
	cpu->ops->space_to_depth(cpu, back, y, B, T * rt, 2 * H, 2 * W, C, rt);
	ok(!memcmp(back, x, n * sizeof(float)), "space_to_depth rt=%d undoes it", rt);
	free(x), free(y), free(ref), free(back);
}

/* ------------------------------------------------------------ attention */

static void attention_ref(double *out, const float *q, const float *k, const float *v, const uint8_t *mask, int B, int M,
                          int n_h, int d)
{
	const int C = n_h * d;
	double *s = malloc(sizeof(double) * M);

	for (int b = 0; b < B; b++)
		for (int h = 0; h < n_h; h++)
			for (int i = 0; i < M; i++) {
				double mx = -INFINITY, sum = 0;
				const float *qi = q + ((size_t)b * M + i) * C + h * d;
				for (int j = 0; j < M; j++) {
					double dot = 0;
					for (int e = 0; e < d; e++)
						dot += (double)qi[e] * k[((size_t)b * M + j) * C + h * d + e];
					s[j] = mask && !mask[b * M + j] ? -INFINITY : dot / sqrt((double)d);
					mx = fmax(mx, s[j]);
				}
				for (int j = 0; j < M; j++)
					sum += s[j] = s[j] == -INFINITY ? 0 : exp(s[j] - mx);
				for (int e = 0; e < d; e++) {
					double o = 0;
					for (int j = 0; j < M; j++)
						o += s[j] / sum * v[((size_t)b * M + j) * C + h * d + e];
					out[((size_t)b * M + i) * C + h * d + e] = o;
				}
			}
	free(s);
}

static void test_attention(int B, int M, int n_h, int d, int masked)
{
	const size_t n = (size_t)B * M * n_h * d, n1 = (size_t)M * n_h * d;
	float *q = randu(n, -1, 1), *k = randu(n, -1, 1), *v = randu(n, -1, 1), *o = alloc_f(n), *o1 = alloc_f(n1);
	uint8_t *mask = masked ? malloc((size_t)B * M) : NULL;
	double *ref = malloc(sizeof(double) * n);

	for (int i = 0; masked && i < B * M; i++)
		mask[i] = i % M < M - 1 - 3 * (i / M);         /* image b: its last 1 + 3b keys are padding */
	attention_ref(ref, q, k, v, mask, B, M, n_h, d);
	cpu->ops->attention_dense(cpu, o, q, k, v, mask, B, M, n_h, d);
	ok(rel_d(o, ref, n) <= 1e-5, "attention_dense B=%d M=%d n_h=%d d=%d%s against double (%.1e)", B, M, n_h, d,
	   masked ? " masked" : "", rel_d(o, ref, n));
	cpu->ops->attention_dense(cpu, o1, q + (B - 1) * n1, k + (B - 1) * n1, v + (B - 1) * n1,
	                          mask ? mask + (B - 1) * M : NULL, 1, M, n_h, d);
	ok(!memcmp(o1, o + (B - 1) * n1, n1 * sizeof(float)), "attention_dense: the last image alone gives its bits in "
	   "the batch");
	/* the softmax and the GEMMs of every kernel the CPU has: the same bits */
	for (int level = 0; level < hi3i_gemm_level(); level++) {
		hi3i_gemm_isa(level);
		cpu->ops->attention_dense(cpu, o1, q + (B - 1) * n1, k + (B - 1) * n1, v + (B - 1) * n1,
		                          mask ? mask + (B - 1) * M : NULL, 1, M, n_h, d);
		hi3i_gemm_isa(-1);
		ok(!memcmp(o1, o + (B - 1) * n1, n1 * sizeof(float)), "attention_dense M=%d: the %s kernels give the same "
		   "bits", M, level ? "AVX2" : "portable");
	}
	blas->ops->attention_dense(blas, o, q, k, v, mask, B, M, n_h, d);
	ok(rel_d(o, ref, n) <= 1e-5, "attention_dense through OpenBLAS (batch invariance off) (%.1e)", rel_d(o, ref, n));
	free(q), free(k), free(v), free(o), free(o1), free(mask), free(ref);
}

static void test_check(void)
{
	hi3_backend_ops ops = *cpu->ops;
	hi3_backend be = *cpu;
	hi3_error err = {0};

	ok(hi3i_backend_check_image(cpu, &err) == 0, "the CPU backend has every image op");
	diag("image ops: %s backend", cpu->name);
	ops.groupnorm = NULL;
	be.ops = &ops;
	ok(hi3i_backend_check_image(&be, &err) != 0 && strstr(err.msg, "'groupnorm'") &&
	   strstr(err.msg, "the image modules"), "a backend without groupnorm is refused by the image check: %s", err.msg);
	ok(hi3i_backend_check(&be, &err) == 0, "... but not by the model's check");
}

int main(void)
{
	hi3_error err = {0};

	if (hi3i_backend_cpu(&cpu, 2, 1, &err) != 0 || hi3i_backend_cpu(&blas, 2, 0, &err) != 0) {
		printf("Bail out! cpu backend: %s\n", err.msg);
		return 1;
	}
	test_conv(3, 3, 2, 6, 13);
	test_conv(3, 3, 2, 70, 13);
	test_conv(3, 3, 1, 6, 16);
	test_conv(3, 3, 1, 70, 20);
	test_conv(1, 3, 1, 6, 13);
	test_conv(1, 1, 2, 6, 13);
	test_conv_wino(3, 2, 3, 6, 4, 6, 13, 1);     /* a tile of 1 channel; 4 frames' zero taps */
	test_conv_wino(3, 1, 2, 8, 10, 70, 20, 1);   /* partial sums over blocks of input channels */
	test_conv_wino(1, 2, 1, 16, 16, 16, 16, 0);  /* 2-D, chosen by the rule */
	test_conv_wino(3, 1, 1, 16, 18, 16, 24, 0);  /* a last group of tiles part-filled */
	test_conv_rule();
	test_groupnorm(37, HI3_ACT_NONE);
	test_groupnorm(2500, HI3_ACT_SILU);
	test_layernorm();
	test_elementwise();
	test_shuffle(1);
	test_shuffle(2);
	test_attention(2, 37, 3, 20, 0);
	test_attention(3, 41, 2, 16, 1);
	test_attention(1, 70, 1, 1100, 0);
	test_attention(2, 300, 2, 24, 1);     /* P V of 24 columns and 300 rows: threads split the rows */
	test_check();
	cpu->ops->destroy(cpu);
	blas->ops->destroy(blas);
	return done_testing();
}
