/*
 * test-cuda-sample.c -- the GPU sampling kernels (kernels/sample.cu) give
 * what lib/stage/sample.c gives: the argmax (ties to the lowest id, NaN rules),
 * the log-softmax at temperature 1 (within 1e-12: exp may differ in its
 * last bit), and the same sampled token for every (seed, step) under
 * greedy, temperature, top-k and top-p, on rows with ties, -0/+0, -inf.
 *
 * Built against the GPU (make check-cuda) and the CPU emulation (make check).
 */
#include "hi3.h"
#include "config.h"
#include <math.h>
#include <string.h>
#include "core/internal.h"
#include "kernels.h"
#include "tap.h"
#include "cuda-test.h"

#define CK(call)                                                                                   \
	do {                                                                                       \
		cudaError_t e_ = (call);                                                           \
		if (e_ != cudaSuccess) {                                                           \
			printf("Bail out! %s: %s\n", #call, cudaGetErrorString(e_));               \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

enum { R = 6, V = 3001, VS = 700, STEPS = 24 };

static cudaStream_t st;
static void *dev(const void *h, size_t n)
{
	void *d;

	CK(cudaMalloc(&d, n));
	if (h)
		CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
	return d;
}

static void get(void *h, const void *d, size_t n)
{
	CK(cudaStreamSynchronize(st));
	CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
}

/* Rows: 0 random; 1 on a coarse grid (many exact ties); 2 mostly zeros of
 * both signs with a few equal maxima; 3 with -inf entries; 4 a NaN inside;
 * 5 a NaN at 0. */
static void make_logits(float *x, int v_n)
{
	for (int r = 0; r < R; r++)
		for (int v = 0; v < v_n; v++) {
			float g = (float)(3.0 * (urand() + urand() + urand() - 1.5));
			float *p = &x[(size_t)r * v_n + v];
			switch (r) {
			case 1: *p = floorf(g * 2.0f) / 2.0f; break;
			case 2: *p = v % 97 == 5 ? 2.5f : (v % 2 ? -0.0f : 0.0f); break;
			case 3: *p = v % 5 == 0 ? -INFINITY : g; break;
			default: *p = g;
			}
		}
	x[4 * (size_t)v_n + 17] = NAN;
	x[5 * (size_t)v_n] = NAN;
}

static void test_argmax_logprob(const float *x, const float *dx)
{
	int64_t am[R], tok[R], *dam = dev(NULL, sizeof(am)), *dtok;
	double lp[R], *dlp = dev(NULL, sizeof(lp));
	int am_ok = 1, lp_ok = 1;
	double worst = 0.0;

	CK(HI3K(logsoftmax_argmax)(st, dx, R, V, NULL, dam, dlp));
	get(am, dam, sizeof(am));
	get(lp, dlp, sizeof(lp));
	for (int r = 0; r < R; r++) {
		const float *row = x + (size_t)r * V;
		double ref = hi3_logprob(row, V, hi3_argmax(row, V));
		am_ok &= am[r] == hi3_argmax(row, V);
		if (isnan(ref) || isnan(lp[r]))
			lp_ok &= isnan(ref) && isnan(lp[r]);
		else
			worst = HI3_MAX(worst, fabs(lp[r] - ref));
	}
	ok(am_ok, "argmax of %d rows of %d (ties, -0/+0, -inf, NaN) equals hi3_argmax", R, V);
	ok(lp_ok && worst <= 1e-12, "log-softmax at the argmax within 1e-12 of hi3_logprob (%.1e; NaN rows NaN)",
	   worst);
	for (int r = 0; r < R; r++)
		tok[r] = (int64_t)(urand() * V);
	dtok = dev(tok, sizeof(tok));
	CK(HI3K(logsoftmax_argmax)(st, dx, R, V, dtok, NULL, dlp));
	get(lp, dlp, sizeof(lp));
	worst = 0.0;
	lp_ok = 1;
	for (int r = 0; r < R; r++) {
		double ref = hi3_logprob(x + (size_t)r * V, V, tok[r]);
		if (isnan(ref) || isnan(lp[r]))
			lp_ok &= isnan(ref) && isnan(lp[r]);
		else if (isinf(ref) || isinf(lp[r]))
			lp_ok &= ref == lp[r];
		else
			worst = HI3_MAX(worst, fabs(lp[r] - ref));
	}
	ok(lp_ok && worst <= 1e-12, "log-softmax at given tokens within 1e-12 of hi3_logprob (%.1e)", worst);
	CK(cudaFree(dam));
	CK(cudaFree(dlp));
	CK(cudaFree(dtok));
}

/* rows [0, nr) of x (nr, vn), STEPS steps each, seeds with high bits */
static void test_draws(const char *what, const float *x, const float *dx, int nr, int vn, const hi3_sampler *sp)
{
	uint64_t seed[R * STEPS], step[R * STEPS], *dseed, *dstep, *dkeys;
	int64_t tok[R * STEPS], *dtok;
	float *rows = malloc(sizeof(float) * (size_t)nr * STEPS * vn), *drows;
	void *scratch = malloc(hi3_sample_scratch_size(vn));
	int same = 0, n = nr * STEPS;

	HI3_ASSERT(rows && scratch);
	for (int r = 0; r < nr; r++)            /* one launch: every (row, step) as its own row */
		for (int s = 0; s < STEPS; s++) {
			int i = r * STEPS + s;
			memcpy(rows + (size_t)i * vn, x + (size_t)r * vn, sizeof(float) * (size_t)vn);
			seed[i] = 0x9e3779b97f4a7c15ULL * (uint64_t)(r + 1);
			step[i] = (uint64_t)s * 977;
		}
	(void)dx;
	drows = dev(rows, sizeof(float) * (size_t)n * vn);
	dseed = dev(seed, sizeof(uint64_t) * n);
	dstep = dev(step, sizeof(uint64_t) * n);
	dtok = dev(NULL, sizeof(int64_t) * n);
	dkeys = dev(NULL, sizeof(uint64_t) * (size_t)n * vn);
	CK(HI3K(sample)(st, drows, n, vn, dseed, dstep, sp->greedy, sp->temperature, sp->top_k, sp->top_p, dkeys, dtok));
	get(tok, dtok, sizeof(int64_t) * n);
	for (int i = 0; i < n; i++)
		same += tok[i] == hi3_sample(rows + (size_t)i * vn, vn, sp, seed[i], step[i], scratch);
	ok(same == n, "%s: %d of %d draws are hi3_sample's", what, same, n);
	CK(cudaFree(drows));
	CK(cudaFree(dseed));
	CK(cudaFree(dstep));
	CK(cudaFree(dtok));
	CK(cudaFree(dkeys));
	free(rows);
	free(scratch);
}

int main(void)
{
	float *x = malloc(sizeof(float) * R * V), *xs = malloc(sizeof(float) * R * VS), *dx, *dxs;
	uint64_t one = 1, *d1;
	int64_t *dt;
	int n = 0;
	cudaError_t e;

	if ((e = cudaGetDeviceCount(&n)) != cudaSuccess || n < 1) {
		printf("Bail out! no CUDA device: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
		return 1;
	}
	CK(cudaStreamCreateWithFlags(&st, 0));   /* blocking: ordered with the cudaMemcpy calls */
	diag("%d rows of %d logits; draws at %d steps per row", R, V, STEPS);
	HI3_ASSERT(x && xs);
	make_logits(x, V);
	make_logits(xs, VS);
	dx = dev(x, sizeof(float) * R * V);
	dxs = dev(xs, sizeof(float) * R * VS);
	test_argmax_logprob(x, dx);
	test_draws("greedy", x, dx, R, V, &(hi3_sampler){.greedy = 1});
	test_draws("temperature 0.8, top-k 20, top-p 0.9", x, dx, 4, V, &(hi3_sampler){0, 0.8, 20, 0.9});
	test_draws("temperature 1.3, top-k 1000", x, dx, 4, V, &(hi3_sampler){0, 1.3, 1000, 1.0});
	test_draws("temperature 0.6, top-k 5, top-p 0.5", x, dx, 4, V, &(hi3_sampler){0, 0.6, 5, 0.5});
	test_draws("temperature 1, no top-k, top-p 0.95, 700 tokens", xs, dxs, 4, VS, &(hi3_sampler){0, 1.0, 0, 0.95});
	d1 = dev(&one, sizeof(one));
	dt = dev(NULL, sizeof(int64_t));
	ok(HI3K(sample)(st, dx, 1, V, d1, d1, 0, 1.0, 0, 1.0, NULL, dt) == cudaErrorInvalidValue,
	   "sampling over more than %d candidates is refused", HI3K_SAMPLE_MAX_K);
	CK(cudaFree(dx));
	CK(cudaFree(dxs));
	CK(cudaFree(d1));
	CK(cudaFree(dt));
	CK(cudaStreamDestroy(st));
	free(x);
	free(xs);
	return done_testing();
}
