/*
 * test-cuda-ops.c -- every op of the CUDA backend against the CPU backend
 * (the reference) on random inputs. GPU outputs are poisoned with NaN
 * before each op, so an element the op forgets to write fails the test.
 * Error measure: ||out - ref|| / ||ref|| over the whole output, at most
 * 1e-5 for fp32 and 1e-2 where a bf16 rounding of the activations is part
 * of the op (bf16 GEMMs); data movement (embedding rows, cache stores)
 * must be bit-exact.
 *
 * Built twice: against the GPU (tests/test-cuda-ops, run by make
 * check-cuda) and against the CPU emulation in tests/cuda-emu
 * (tests/test-cuda-ops-emu, run by make check).
 */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/quant.h"
#include "model/conv.h"
#include "tap.h"
#include "cuda-test.h"
#ifdef HI3_CUDA_EMU
#include "cuda-emu.h"
#endif

static hi3_backend *cpu, *gpu;

/* ---------------------------------------------------------------- helpers */

static float nrand(void)
{
	double u = urand() + 1e-12, v = urand();
	return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static float *randn(size_t n, float scale)
{
	float *p = malloc(n * sizeof(float));

	HI3_ASSERT(p);
	for (size_t i = 0; i < n; i++)
		p[i] = scale * nrand();
	return p;
}

static void *dev_copy(const void *host, size_t bytes)
{
	void *d = gpu->ops->alloc(gpu, bytes);

	HI3_ASSERT(d);
	HI3_ASSERT(gpu->ops->upload(gpu, d, host, bytes) == 0);
	return d;
}

/* n floats of device memory, all NaN */
static float *dev_nan(size_t n)
{
	float *h = malloc(n * sizeof(float) + 1), *d;

	HI3_ASSERT(h);
	for (size_t i = 0; i < n; i++)
		h[i] = NAN;
	d = dev_copy(h, n * sizeof(float));
	free(h);
	return d;
}

static void *fetch(const void *d, size_t bytes)
{
	void *h = malloc(bytes + 1);

	HI3_ASSERT(h);
	HI3_ASSERT(gpu->ops->download(gpu, h, d, bytes) == 0);
	return h;
}

/* Compare a device output with the CPU's, then free it. */
static int check(const char *what, float *dout, const float *ref, size_t n, double tol)
{
	float *out = fetch(dout, n * sizeof(float));
	double e = rel_err(out, ref, n);
	int r = ok(e <= tol, "%s: |out - ref| / |ref| = %.2e (at most %.0e)", what, e, tol);

	free(out);
	gpu->ops->free(gpu, dout);
	return r;
}

/* A host tensor of dtype dt from f32 values (for the weight loaders). */
static hi3_tensor tensor(hi3_dtype dt, int ndim, int64_t n0, int64_t n1, const float *v)
{
	hi3_tensor t = {.name = "test", .dtype = dt, .ndim = ndim, .shape = {n0, n1}};
	size_t n = (size_t)n0 * (size_t)(ndim > 1 ? n1 : 1);

	t.nbytes = n * hi3_dtype_size(dt);
	t.data = malloc(t.nbytes + 1);
	HI3_ASSERT(t.data);
	for (size_t i = 0; i < n; i++) {
		if (dt == HI3_F32)
			((float *)t.data)[i] = v[i];
		else if (dt == HI3_BF16)
			((uint16_t *)t.data)[i] = hi3_f32_to_bf16(v[i]);
		else
			((uint16_t *)t.data)[i] = hi3_f32_to_f16(v[i]);
	}
	return t;
}

static hi3_wt *load(hi3_backend *be, const hi3_tensor *t, int kind)
{
	hi3_error err = {0};
	hi3_wt *w = be->ops->weight(be, t, kind, &err);

	if (!w)
		diag("%s weight: %s", be->name, err.msg);
	HI3_ASSERT(w);
	return w;
}

/* ---------------------------------------------------------------- ops */

static void test_matmul(void)
{
	static const hi3_dtype dts[] = {HI3_F32, HI3_BF16, HI3_F16};
	static const int Ms[] = {1, 5, 8, 9, 67};
	static const int Ks[] = {80, 81};

	for (size_t di = 0; di < HI3_ARRAY_SIZE(dts) * HI3_ARRAY_SIZE(Ks); di++) {
		const int N = 37, K = Ks[di / HI3_ARRAY_SIZE(dts)];
		float *wv = randn((size_t)N * K, 0.1f);
		hi3_tensor t = tensor(dts[di % HI3_ARRAY_SIZE(dts)], 2, N, K, wv);
		hi3_wt *wc = load(cpu, &t, HI3_WT_MATRIX), *wg = load(gpu, &t, HI3_WT_MATRIX);

		for (size_t mi = 0; mi < HI3_ARRAY_SIZE(Ms); mi++) {
			const int M = Ms[mi];
			float *x = randn((size_t)M * K, 1.0f), *ref = malloc(sizeof(float) * (size_t)M * N);
			float *dx = dev_copy(x, sizeof(float) * (size_t)M * K), *dy = dev_nan((size_t)M * N);
			char what[64];

			cpu->ops->matmul(cpu, ref, x, wc, M);
			gpu->ops->matmul(gpu, dy, dx, wg, M);
			snprintf(what, sizeof(what), "matmul %s M=%d N=%d K=%d", hi3_dtype_name(t.dtype), M, N, K);
			check(what, dy, ref, (size_t)M * N, t.dtype == HI3_BF16 ? 1e-2 : 1e-5);
			gpu->ops->free(gpu, dx);
			free(x);
			free(ref);
		}
		cpu->ops->weight_free(cpu, wc);
		gpu->ops->weight_free(gpu, wg);
		free(t.data);
		free(wv);
	}
}

/* With bf16 weights, a few rows (one pass over W) and many (cuBLAS) round
 * x to bf16 alike: a row gives the same products either way, summed in
 * another order. */
static void test_matmul_paths(void)
{
	const int N = 64, K = 512, M = 12, few = 8;
	float *wv = randn((size_t)N * K, 0.05f), *x = randn((size_t)M * K, 1.0f), *a, *b;
	hi3_tensor t = tensor(HI3_BF16, 2, N, K, wv);
	hi3_wt *wg = load(gpu, &t, HI3_WT_MATRIX);
	float *dx = dev_copy(x, sizeof(float) * M * K), *dmany = dev_nan((size_t)M * N), *dfew = dev_nan((size_t)few * N);

	gpu->ops->matmul(gpu, dmany, dx, wg, M);
	gpu->ops->matmul(gpu, dfew, dx, wg, few);
	a = fetch(dmany, sizeof(float) * few * N);
	b = fetch(dfew, sizeof(float) * few * N);
	ok(rel_err(b, a, (size_t)few * N) <= 1e-5, "bf16 matmul of 8 rows equals those rows of a 12-row matmul "
	   "within 1e-5 (%.2e): both round x to bf16", rel_err(b, a, (size_t)few * N));
	free(a);
	free(b);
	gpu->ops->free(gpu, dx);
	gpu->ops->free(gpu, dmany);
	gpu->ops->free(gpu, dfew);
	gpu->ops->weight_free(gpu, wg);
	free(t.data);
	free(wv);
	free(x);
}

/* matmul_group gives the bits of one matmul per product: experts of
 * different sizes, few rows (one grouped launch) and many (cuBLAS). */
static void test_matmul_group(hi3_dtype dt)
{
	enum { NJ = 5 };
	const int Ns[NJ] = {48, 40, 48, 33, 48}, Ks[NJ] = {64, 64, 72, 64, 64}, Ms[NJ] = {1, 3, 8, 12, 0};
	hi3_tensor t[NJ];
	hi3_wt *w[NJ];
	float *x[NJ], *ya[NJ], *yb[NJ];
	int same = 1;

	for (int i = 0; i < NJ; i++) {
		float *wv = randn((size_t)Ns[i] * Ks[i], 0.1f), *xv = randn((size_t)(Ms[i] + 1) * Ks[i], 1.0f);
		t[i] = tensor(dt, 2, Ns[i], Ks[i], wv);
		w[i] = load(gpu, &t[i], HI3_WT_MATRIX);
		x[i] = dev_copy(xv, sizeof(float) * (size_t)(Ms[i] + 1) * Ks[i]);
		ya[i] = dev_nan((size_t)(Ms[i] + 1) * Ns[i]);
		yb[i] = dev_nan((size_t)(Ms[i] + 1) * Ns[i]);
		free(wv);
		free(xv);
	}
	gpu->ops->matmul_group(gpu, NJ, ya, (const float *const *)x, (const hi3_wt *const *)w, Ms);
	for (int i = 0; i < NJ; i++)
		gpu->ops->matmul(gpu, yb[i], x[i], w[i], Ms[i]);
	for (int i = 0; i < NJ; i++) {
		size_t n = (size_t)(Ms[i] + 1) * Ns[i];   /* the row past M stays NaN in both */
		float *a = fetch(ya[i], n * sizeof(float)), *b = fetch(yb[i], n * sizeof(float));
		same &= !memcmp(a, b, n * sizeof(float));
		free(a);
		free(b);
		gpu->ops->free(gpu, x[i]);
		gpu->ops->free(gpu, ya[i]);
		gpu->ops->free(gpu, yb[i]);
		gpu->ops->weight_free(gpu, w[i]);
		free(t[i].data);
	}
	ok(same, "matmul_group %s of 5 products (1, 3, 8, 12 and 0 rows) equals one matmul each, bit for bit",
	   hi3_dtype_name(dt));
}

static void test_embed(void)
{
	static const hi3_dtype dts[] = {HI3_F32, HI3_BF16, HI3_F16};
	const int V = 50, H = 300, M = 9;
	int64_t ids[9] = {0, 49, 7, 7, 12, 3, 48, 0, 25};

	for (size_t di = 0; di < HI3_ARRAY_SIZE(dts); di++) {
		float *wv = randn((size_t)V * H, 1.0f), *ref = malloc(sizeof(float) * (size_t)M * H), *out;
		hi3_tensor t = tensor(dts[di], 2, V, H, wv);
		hi3_wt *wc = load(cpu, &t, HI3_WT_ROWS), *wg = load(gpu, &t, HI3_WT_ROWS);
		int64_t *dids = dev_copy(ids, sizeof(ids));
		float *dx = dev_nan((size_t)M * H);

		cpu->ops->embed(cpu, ref, ids, wc, M);
		gpu->ops->embed(gpu, dx, dids, wg, M);
		out = fetch(dx, sizeof(float) * (size_t)M * H);
		ok(!memcmp(out, ref, sizeof(float) * (size_t)M * H), "embed %s: rows equal the CPU's bit for bit",
		   hi3_dtype_name(dts[di]));
		free(out);
		gpu->ops->free(gpu, dx);
		gpu->ops->free(gpu, dids);
		cpu->ops->weight_free(cpu, wc);
		gpu->ops->weight_free(gpu, wg);
		free(t.data);
		free(wv);
		free(ref);
	}
}

static void test_rmsnorm(void)
{
	const int M = 7, n = 300;
	float *x = randn((size_t)M * n, 2.0f), *wv = randn((size_t)n, 0.1f), *ref = malloc(sizeof(float) * M * n);
	hi3_tensor t;
	hi3_wt *wc, *wg;
	float *dx, *dy;

	for (int i = 0; i < n; i++)
		wv[i] += 1.0f;
	t = tensor(HI3_F32, 1, n, 0, wv);
	wc = load(cpu, &t, HI3_WT_VECTOR);
	wg = load(gpu, &t, HI3_WT_VECTOR);
	dx = dev_copy(x, sizeof(float) * M * n);
	dy = dev_nan((size_t)M * n);
	cpu->ops->rmsnorm(cpu, ref, x, wc, M, n, 1e-5f);
	gpu->ops->rmsnorm(gpu, dy, dx, wg, M, n, 1e-5f);
	check("rmsnorm M=7 n=300", dy, ref, (size_t)M * n, 1e-5);
	gpu->ops->rmsnorm(gpu, dx, dx, wg, M, n, 1e-5f);      /* in place */
	check("rmsnorm in place", dx, ref, (size_t)M * n, 1e-5);
	cpu->ops->weight_free(cpu, wc);
	gpu->ops->weight_free(gpu, wg);
	free(t.data);
	free(x);
	free(wv);
	free(ref);
}

static void test_elementwise(void)
{
	const int M = 5, I = 70;
	const size_t n = 1000;
	float *x = randn(n, 1.0f), *y = randn(n, 1.0f), *ab = randn((size_t)M * 2 * I, 3.0f);
	float *ref = malloc(sizeof(float) * n), *dx = dev_copy(x, sizeof(float) * n), *dy = dev_copy(y, sizeof(float) * n);
	float *dab = dev_copy(ab, sizeof(float) * M * 2 * I), *dsw = dev_nan((size_t)M * I), *out;

	memcpy(ref, x, sizeof(float) * n);
	cpu->ops->add(cpu, ref, y, n);
	gpu->ops->add(gpu, dx, dy, n);
	out = fetch(dx, sizeof(float) * n);
	ok(!memcmp(out, ref, sizeof(float) * n), "add: equals the CPU's bit for bit");
	free(out);
	gpu->ops->zero(gpu, dx, n);
	out = fetch(dx, sizeof(float) * n);
	cpu->ops->zero(cpu, ref, n);
	ok(!memcmp(out, ref, sizeof(float) * n), "zero: all zeros");
	free(out);
	cpu->ops->swiglu(cpu, ref, ab, M, I);
	gpu->ops->swiglu(gpu, dsw, dab, M, I);
	check("swiglu M=5 inter=70", dsw, ref, (size_t)M * I, 1e-5);
	gpu->ops->free(gpu, dx);
	gpu->ops->free(gpu, dy);
	gpu->ops->free(gpu, dab);
	free(x);
	free(y);
	free(ab);
	free(ref);
}

static void test_gather_scatter(void)
{
	const int rows = 10, w = 33, n = 4;
	int32_t idx1[4] = {7, 2, 9, 0}, idx2[4] = {2, 3, 7, 8};   /* 2 and 7 again in the second call */
	float sc1[4] = {0.5f, 1.0f, -0.25f, 2.0f}, sc2[4] = {0.125f, 1.5f, 0.75f, -1.0f};
	float *src = randn((size_t)rows * w, 1.0f), *part = randn((size_t)n * w, 1.0f);
	float *acc = randn((size_t)rows * w, 1.0f), *ref = malloc(sizeof(float) * rows * w);
	float *dsrc = dev_copy(src, sizeof(float) * rows * w), *dpart = dev_copy(part, sizeof(float) * n * w);
	float *dacc = dev_copy(acc, sizeof(float) * rows * w), *dg = dev_nan((size_t)n * w);
	int32_t *di1 = dev_copy(idx1, sizeof(idx1)), *di2 = dev_copy(idx2, sizeof(idx2));
	float *ds1 = dev_copy(sc1, sizeof(sc1)), *ds2 = dev_copy(sc2, sizeof(sc2));

	cpu->ops->gather(cpu, ref, src, idx1, n, w);
	gpu->ops->gather(gpu, dg, dsrc, di1, n, w);
	check("gather 4 of 10 rows", dg, ref, (size_t)n * w, 0.0);
	memcpy(ref, acc, sizeof(float) * rows * w);
	cpu->ops->scatter_add(cpu, ref, part, idx1, sc1, n, w);
	cpu->ops->scatter_add(cpu, ref, part, idx2, sc2, n, w);
	gpu->ops->scatter_add(gpu, dacc, dpart, di1, ds1, n, w);
	gpu->ops->scatter_add(gpu, dacc, dpart, di2, ds2, n, w);
	check("scatter_add twice, rows shared across calls", dacc, ref, (size_t)rows * w, 1e-6);
	/* scatter: 4 rows replace rows 7, 2, 9, 0 of a copy of acc; the others stay */
	memcpy(ref, acc, sizeof(float) * rows * w);
	cpu->ops->scatter(cpu, ref, part, idx1, n, w);
	dacc = dev_copy(acc, sizeof(float) * rows * w);
	gpu->ops->scatter(gpu, dacc, dpart, di1, n, w);
	check("scatter 4 rows into 10 (the rest untouched)", dacc, ref, (size_t)rows * w, 0.0);
	/* copy2d: a (3, 5) block of src (row stride w) into a copy of acc at
	 * (row 4, column 11) (the gathers' placing of a rank's block) */
	memcpy(ref, acc, sizeof(float) * rows * w);
	cpu->ops->copy2d(cpu, ref + 4 * w + 11, (size_t)w, src + 2 * w + 1, (size_t)w, 3, 5);
	dacc = dev_copy(acc, sizeof(float) * rows * w);   /* (check freed the last one) */
	gpu->ops->copy2d(gpu, dacc + 4 * w + 11, (size_t)w, dsrc + 2 * w + 1, (size_t)w, 3, 5);
	check("copy2d of a (3, 5) block between row strides (the rest untouched)", dacc, ref, (size_t)rows * w, 0.0);
	gpu->ops->free(gpu, dsrc);
	gpu->ops->free(gpu, dpart);
	gpu->ops->free(gpu, di1);
	gpu->ops->free(gpu, di2);
	gpu->ops->free(gpu, ds1);
	gpu->ops->free(gpu, ds2);
	free(src);
	free(part);
	free(acc);
	free(ref);
}

/* combine: each token's k rows of src, weighted, summed in the order of
 * where, in one call: the bits of zero + scatter_add expert by expert (the
 * model's way without it), and the CPU's within 1e-6. */
static void test_combine(void)
{
	enum { M = 5, k = 3, E = 4, w = 37, R = M * k };
	int32_t ids[R], idx[R], where[R], got[M] = {0}, first[E + 1];
	float sc[R], wsc[R], *src = randn((size_t)R * w, 1.0f), *acc = malloc(sizeof(float) * M * w);
	float *dsrc = dev_copy(src, sizeof(src[0]) * R * w), *dy = dev_nan((size_t)M * w), *dz = dev_nan((size_t)M * w);
	float *a, *b, *dsc, *dwsc;
	int32_t *didx, *dwhere;
	int r = 0;

	for (int t = 0; t < M; t++)           /* token t takes experts t, t + 1, t + 2 (mod E) */
		for (int j = 0; j < k; j++)
			ids[t * k + j] = (t + j) % E;
	for (int e = 0; e < E; e++) {         /* the packed rows: expert by expert, tokens ascending */
		first[e] = r;
		for (int t = 0; t < M; t++)
			for (int j = 0; j < k; j++)
				if (ids[t * k + j] == e) {
					idx[r] = t;
					sc[r++] = (float)(urand() + 0.1);
				}
	}
	first[E] = r;
	for (int i = 0; i < R; i++) {
		where[idx[i] * k + got[idx[i]]] = i;
		wsc[idx[i] * k + got[idx[i]]++] = sc[i];
	}
	didx = dev_copy(idx, sizeof(idx));
	dsc = dev_copy(sc, sizeof(sc));
	dwhere = dev_copy(where, sizeof(where));
	dwsc = dev_copy(wsc, sizeof(wsc));
	gpu->ops->zero(gpu, dz, (size_t)M * w);
	cpu->ops->zero(cpu, acc, (size_t)M * w);
	for (int e = 0; e < E; e++) {
		gpu->ops->scatter_add(gpu, dz, dsrc + (size_t)first[e] * w, didx + first[e], dsc + first[e],
		                      first[e + 1] - first[e], w);
		cpu->ops->scatter_add(cpu, acc, src + (size_t)first[e] * w, idx + first[e], sc + first[e],
		                      first[e + 1] - first[e], w);
	}
	gpu->ops->combine(gpu, dy, dsrc, dwhere, dwsc, M, k, w);
	a = fetch(dy, sizeof(float) * M * w);
	b = fetch(dz, sizeof(float) * M * w);
	ok(!memcmp(a, b, sizeof(float) * M * w), "combine of 5 tokens' 3 rows: the bits of zero + scatter_add by expert");
	free(a);
	free(b);
	check("combine against the CPU's scatter_add by expert", dy, acc, (size_t)M * w, 1e-6);
	gpu->ops->free(gpu, dz);
	gpu->ops->free(gpu, dsrc);
	gpu->ops->free(gpu, didx);
	gpu->ops->free(gpu, dsc);
	gpu->ops->free(gpu, dwhere);
	gpu->ops->free(gpu, dwsc);
	free(src);
	free(acc);
}

/* Decode steps from graphs: the same small step (uploads, a product, a
 * norm, an add, a download) run 4 times with new inputs gives what it
 * gives eagerly each time; on the emulator the later ones run from a
 * graph launch, and a step with other arguments is not taken for it. */
static void test_graphs_on(void)
{
	enum { K = 40, N = 24 };
	float *wm = randn((size_t)N * K, 0.2f), *nw = randn(N, 1.0f), *x = NULL, *ref = malloc(sizeof(float) * N * 3);
	float *out = malloc(sizeof(float) * N * 2);
	hi3_tensor tw = {.name = "w", .dtype = HI3_F32, .ndim = 2, .shape = {N, K}, .data = wm, .nbytes = sizeof(float) * N * K};
	hi3_tensor tn = {.name = "n", .dtype = HI3_F32, .ndim = 1, .shape = {N}, .data = nw, .nbytes = sizeof(float) * N};
	hi3_error err = {0};
	hi3_wt *gw = gpu->ops->weight(gpu, &tw, HI3_WT_MATRIX, &err), *gn = gpu->ops->weight(gpu, &tn, HI3_WT_VECTOR, &err);
	hi3_wt *cw = cpu->ops->weight(cpu, &tw, HI3_WT_MATRIX, &err), *cn = cpu->ops->weight(cpu, &tn, HI3_WT_VECTOR, &err);
	float *dx = gpu->ops->alloc(gpu, sizeof(float) * K * 2), *dy = gpu->ops->alloc(gpu, sizeof(float) * N * 2);
	float *dz = gpu->ops->alloc(gpu, sizeof(float) * N * 2), *dw = gpu->ops->alloc(gpu, sizeof(float) * N);
	int same = 1, step_ok = 1, on;
#ifdef HI3_CUDA_EMU
	unsigned long long e0, g0, l0, e1, g1, l1;
	cudaStream_t st;
	cudaGraph_t graph = NULL;
	float *dm = NULL;
#endif

	HI3_ASSERT(gw && gn && cw && cn && dx && dy && dz && dw);
	on = gpu->ops->weights_done(gpu, &err) == 0 && gpu->ops->set_graphs(gpu, 1, &err) == 0;
	ok(on, "graphs on: %s", on ? "yes" : err.msg);
#ifdef HI3_CUDA_EMU
	emu_kernel_counts(&e0, &g0, &l0);
#endif
	for (int s = 0; s < 5; s++) {
		float *into = s < 4 ? dz : dw;    /* the fifth step writes elsewhere: another graph */
		free(x);
		x = randn((size_t)K * 2, 1.0f);
		cpu->ops->matmul(cpu, ref, x, cw, 2);
		cpu->ops->rmsnorm(cpu, ref + N * 2, ref, cn, 1, N, 1e-6f);
		step_ok &= gpu->ops->graph_begin(gpu, 2) == 1;
		gpu->ops->upload(gpu, dx, x, sizeof(float) * K * 2);
		gpu->ops->matmul(gpu, dy, dx, gw, 2);
		gpu->ops->rmsnorm(gpu, into, dy, gn, 1, N, 1e-6f);
		gpu->ops->download(gpu, out, dy, sizeof(float) * N * 2);
		same &= rel_err(out, ref, (size_t)N * 2) <= 1e-5;
		gpu->ops->download(gpu, out, into, sizeof(float) * N);
		gpu->ops->graph_end(gpu);
		same &= rel_err(out, ref + N * 2, N) <= 1e-5;
	}
	ok(step_ok && same && !gpu->err.status, "5 steps with new inputs from graphs: each what the CPU gives (within 1e-5) %s",
	   gpu->err.msg);
	ok(gpu->ops->graph_begin(gpu, 9) == 0, "a step of 9 rows (beyond the gemv kernel) runs eagerly");
	gpu->ops->graph_end(gpu);
#ifdef HI3_CUDA_EMU
	emu_kernel_counts(&e1, &g1, &l1);
	/* one stretch a step (to the first download) of 2 kernels: step 1 eager (seen once), 2
	 * captured and launched, 3 and 4 launched, 5 eager (other arguments, seen once) */
	ok(l1 - l0 == 3 && g1 - g0 == 6 && e1 - e0 == 4,
	   "the emulator ran steps 2 to 4 from graph launches (%llu launches, %llu kernels in graphs, %llu eager)",
	   l1 - l0, g1 - g0, e1 - e0);
	/* what a capture cannot hold is refused, and nothing of it runs */
	gpu->ops->download(gpu, ref, dz, sizeof(float) * N);
	HI3_ASSERT(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
	ok(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal) == cudaSuccess &&
	   cudaMemsetAsync(dz, 0, sizeof(float) * N, st) == cudaSuccess &&
	   cudaStreamSynchronize(st) == cudaErrorStreamCaptureUnsupported &&
	   cudaMalloc((void **)&dm, 64) == cudaErrorStreamCaptureUnsupported &&
	   cudaStreamEndCapture(st, &graph) == cudaErrorStreamCaptureInvalidated && !graph && !dm,
	   "a capture with a synchronisation and an allocation is refused and ends invalidated");
	(void)cudaGetLastError();
	gpu->ops->download(gpu, out, dz, sizeof(float) * N);
	ok(!memcmp(out, ref, sizeof(float) * N), "the refused capture's memset never ran");
	cudaStreamDestroy(st);
#endif
	ok(gpu->ops->set_graphs(gpu, 2, &err) == 0 && gpu->ops->graph_begin(gpu, 2) == 0, "graphs off: steps run eagerly");
	gpu->ops->graph_end(gpu);
	gpu->ops->free(gpu, dx);
	gpu->ops->free(gpu, dy);
	gpu->ops->free(gpu, dz);
	gpu->ops->free(gpu, dw);
	gpu->ops->weight_free(gpu, gw);
	gpu->ops->weight_free(gpu, gn);
	cpu->ops->weight_free(cpu, cw);
	cpu->ops->weight_free(cpu, cn);
	free(wm);
	free(nw);
	free(x);
	free(ref);
	free(out);
}

/* The graph checks on a backend of their own, opened without
 * HI3_CUDA_SYNC: the GPU run sets it for its checks (each op waited for,
 * so that a fault names its op), and a graph cannot wait inside itself. */
static void test_graphs(void)
{
	hi3_backend *shared = gpu;
	const char *v = getenv("HI3_CUDA_SYNC");
	char *sync = v ? strdup(v) : NULL;
	hi3_error err = {0};

	unsetenv("HI3_CUDA_SYNC");
	if (hi3i_backend_cuda(&gpu, 0, 0, &err) == 0) {
		test_graphs_on();
		gpu->ops->destroy(gpu);
	} else {
		ok(0, "a second CUDA backend, for the graphs: %s", err.msg);
	}
	gpu = shared;
	if (sync)
		setenv("HI3_CUDA_SYNC", sync, 1);
	free(sync);
}

/* Attention shapes (n_h, n_kv, d) and whether qk-norm is on. */
static const struct shape {
	int n_h, n_kv, d, qk_norm;
} shapes[] = {{4, 4, 32, 0}, {4, 2, 32, 1}, {16, 4, 64, 1}, {8, 2, 128, 1}, {4, 1, 256, 1}};

static struct hi3_dims dims_of(const struct shape *s)
{
	return (struct hi3_dims){.H = s->n_h * s->d, .n_h = s->n_h, .n_kv = s->n_kv, .d = s->d, .eps = 1e-6f};
}

static void test_rope(const struct shape *s)
{
	const struct hi3_dims dm = dims_of(s);
	const int M = 6, W = (s->n_h + 2 * s->n_kv) * s->d;
	int32_t pos[12] = {0, 0, 1, 1, 4999, 4999, 130, 172, 131, 172, 17, 3};   /* text, then a 2-D image */
	float theta[128], *qkv = randn((size_t)M * W, 1.0f), *ref = malloc(sizeof(float) * M * W);
	float *qv = randn((size_t)s->d, 0.2f), *kv = randn((size_t)s->d, 0.2f), *dqkv;
	float *dth, *dpos;
	hi3_tensor tq, tk;
	hi3_wt *qc = NULL, *kc = NULL, *qg = NULL, *kg = NULL;
	char what[96];

	for (int i = 0; i < s->d; i++) {
		qv[i] += 1.0f;
		kv[i] += 1.0f;
	}
	tq = tensor(HI3_F32, 1, s->d, 0, qv);
	tk = tensor(HI3_F32, 1, s->d, 0, kv);
	if (s->qk_norm) {
		qc = load(cpu, &tq, HI3_WT_VECTOR);
		kc = load(cpu, &tk, HI3_WT_VECTOR);
		qg = load(gpu, &tq, HI3_WT_VECTOR);
		kg = load(gpu, &tk, HI3_WT_VECTOR);
	}
	hi3i_rope_theta(theta, s->d, 10000.0);
	memcpy(ref, qkv, sizeof(float) * M * W);
	dqkv = dev_copy(qkv, sizeof(float) * M * W);
	dth = dev_copy(theta, sizeof(float) * (size_t)(s->d / 2));
	dpos = dev_copy(pos, sizeof(pos));
	cpu->ops->rope_qk(cpu, ref, pos, theta, qc, kc, &dm, M);
	gpu->ops->rope_qk(gpu, dqkv, (int32_t *)dpos, dth, qg, kg, &dm, M);
	snprintf(what, sizeof(what), "rope_qk n_h=%d n_kv=%d d=%d%s", s->n_h, s->n_kv, s->d,
	         s->qk_norm ? " with qk-norm" : "");
	check(what, dqkv, ref, (size_t)M * W, 1e-5);
	gpu->ops->free(gpu, dth);
	gpu->ops->free(gpu, dpos);
	if (s->qk_norm) {
		cpu->ops->weight_free(cpu, qc);
		cpu->ops->weight_free(cpu, kc);
		gpu->ops->weight_free(gpu, qg);
		gpu->ops->weight_free(gpu, kg);
	}
	free(tq.data);
	free(tk.data);
	free(qkv);
	free(ref);
	free(qv);
	free(kv);
}

static void test_kv_store(const struct shape *s, hi3_dtype dt)
{
	const struct hi3_dims dm = dims_of(s);
	const int B = 3, C = 20, M = 10, W = (s->n_h + 2 * s->n_kv) * s->d;
	/* token 1 and 6 share (row 2, slot 4): 6 wins; 3 and 8 share (0, 5): 8
	 * wins; token 9 is not stored; rows out of order */
	int32_t row[10] = {0, 2, 1, 0, 1, 2, 2, 0, 0, 1};
	int64_t slot[10] = {0, 4, 0, 5, 19, 7, 4, 1, 5, -1};
	size_t cn = (size_t)B * s->n_kv * C * s->d, cb = cn * hi3_dtype_size(dt);
	float *qkv = randn((size_t)M * W, 1.0f);
	unsigned char *kc = malloc(cb), *vc = malloc(cb), *ko, *vo;
	void *dk, *dv, *dqkv = dev_copy(qkv, sizeof(float) * M * W), *drow = dev_copy(row, sizeof(row));
	void *dslot = dev_copy(slot, sizeof(slot));
	char what[96];

	for (size_t i = 0; i < cb; i++) {    /* the same garbage on both sides: untouched slots must stay */
		kc[i] = (unsigned char)(urand() * 256);
		vc[i] = (unsigned char)(urand() * 256);
	}
	dk = dev_copy(kc, cb);
	dv = dev_copy(vc, cb);
	cpu->ops->kv_store(cpu, &(hi3_kv_dst){kc, vc, dt, C}, qkv, row, slot, &dm, M);
	gpu->ops->kv_store(gpu, &(hi3_kv_dst){dk, dv, dt, C}, dqkv, drow, dslot, &dm, M);
	ko = fetch(dk, cb);
	vo = fetch(dv, cb);
	snprintf(what, sizeof(what), "kv_store %s n_kv=%d d=%d: K and V caches equal the CPU's bit for bit (last write "
	         "wins)", hi3_dtype_name(dt), s->n_kv, s->d);
	ok(!memcmp(ko, kc, cb) && !memcmp(vo, vc, cb), "%s", what);
	free(ko);
	free(vo);
	free(kc);
	free(vc);
	free(qkv);
	gpu->ops->free(gpu, dk);
	gpu->ops->free(gpu, dv);
	gpu->ops->free(gpu, dqkv);
	gpu->ops->free(gpu, drow);
	gpu->ops->free(gpu, dslot);
}

/* Attention over the call's own tokens (prefill): B rows of T columns,
 * causal, with a full-attention block in row 1 and, in row 2, queries
 * that admit nothing (they must give zeros). T = 37 puts rows across the
 * 32-query tiles. */
static void test_attention_self(const struct shape *s)
{
	const struct hi3_dims dm = dims_of(s);
	const int B = 3, T = 37, M = B * T, g = s->n_h / s->n_kv, d = s->d, W = (s->n_h + 2 * s->n_kv) * d;
	float *qkv = randn((size_t)M * W, 1.0f), *ref = malloc(sizeof(float) * M * s->n_h * d), *dqkv, *dout;
	hi3_attn_q *plan = malloc(sizeof(*plan) * M);
	void *dplan;
	hi3_kv_src ks, vs, dks, dvs;
	char what[96];

	for (int r = 0; r < B; r++)
		for (int t = 0; t < T; t++) {
			hi3_attn_q *q = &plan[r * T + t];
			*q = (hi3_attn_q){r, t, 0, 0};
			if (r == 1 && t >= 5 && t < 17)
				*q = (hi3_attn_q){r, t, 5, 17};
			if (r == 2 && t >= 30)
				q->hi = -1;
		}
	ks = (hi3_kv_src){qkv + (size_t)g * d, HI3_F32, (int64_t)T * W, (int64_t)(g + 2) * d, W};
	vs = ks;
	vs.base = qkv + (size_t)(g + 1) * d;
	cpu->ops->attention(cpu, ref, qkv, &ks, &vs, plan, &dm, M);
	dqkv = dev_copy(qkv, sizeof(float) * M * W);
	dplan = dev_copy(plan, sizeof(*plan) * M);
	dout = dev_nan((size_t)M * s->n_h * d);
	dks = ks;
	dks.base = dqkv + (size_t)g * d;
	dvs = vs;
	dvs.base = dqkv + (size_t)(g + 1) * d;
	gpu->ops->attention(gpu, dout, dqkv, &dks, &dvs, dplan, &dm, M);
	snprintf(what, sizeof(what), "attention over own tokens n_h=%d n_kv=%d d=%d, 3 rows of 37", s->n_h, s->n_kv, d);
	check(what, dout, ref, (size_t)M * s->n_h * d, 1e-5);
	gpu->ops->free(gpu, dqkv);
	gpu->ops->free(gpu, dplan);
	free(qkv);
	free(ref);
	free(plan);
}

/* Attention over a cache (decode): M queries, each reading its own cache
 * row up to hi, some with a block, one admitting nothing. */
static void test_attention_cache(const struct shape *s, hi3_dtype dt, int M)
{
	const struct hi3_dims dm = dims_of(s);
	const int B = 4, C = 300, d = s->d, W = (s->n_h + 2 * s->n_kv) * d;
	size_t cn = (size_t)B * s->n_kv * C * d, cb = cn * hi3_dtype_size(dt);
	float *kf = randn(cn, 1.0f), *vf = randn(cn, 1.0f), *qkv = randn((size_t)M * W, 1.0f);
	float *ref = malloc(sizeof(float) * M * s->n_h * d), *dout;
	void *kc = malloc(cb), *vc = malloc(cb), *dk, *dv, *dqkv, *dplan;
	hi3_attn_q *plan = malloc(sizeof(*plan) * M);
	hi3_kv_src ks, vs;
	char what[128];

	for (size_t i = 0; i < cn; i++) {
		if (dt == HI3_BF16) {
			((uint16_t *)kc)[i] = hi3_f32_to_bf16(kf[i]);
			((uint16_t *)vc)[i] = hi3_f32_to_bf16(vf[i]);
		} else {
			((float *)kc)[i] = kf[i];
			((float *)vc)[i] = vf[i];
		}
	}
	for (int m = 0; m < M; m++) {
		plan[m] = (hi3_attn_q){(m * 3 + 1) % B, (int)(urand() * C), 0, 0};
		if (m % 5 == 2)
			plan[m] = (hi3_attn_q){m % B, 40, 100, 164};       /* a block past the causal part */
		if (m % 7 == 3)
			plan[m].hi = C - 1;
	}
	if (M == 1)
		plan[0] = (hi3_attn_q){2, C - 1, 0, 0};                /* the whole cache: every split */
	else
		plan[M - 1] = (hi3_attn_q){0, -1, 0, 0};           /* admits nothing */
	ks = (hi3_kv_src){kc, dt, (int64_t)s->n_kv * C * d, (int64_t)C * d, d};
	vs = ks;
	vs.base = vc;
	cpu->ops->attention(cpu, ref, qkv, &ks, &vs, plan, &dm, M);
	dk = dev_copy(kc, cb);
	dv = dev_copy(vc, cb);
	dqkv = dev_copy(qkv, sizeof(float) * M * W);
	dplan = dev_copy(plan, sizeof(*plan) * M);
	dout = dev_nan((size_t)M * s->n_h * d);
	ks.base = dk;
	vs.base = dv;
	gpu->ops->attention(gpu, dout, dqkv, &ks, &vs, dplan, &dm, M);
	snprintf(what, sizeof(what), "attention over a %s cache n_h=%d n_kv=%d d=%d, %d queries, 300 slots",
	         hi3_dtype_name(dt), s->n_h, s->n_kv, d, M);
	check(what, dout, ref, (size_t)M * s->n_h * d, 1e-5);
	gpu->ops->free(gpu, dk);
	gpu->ops->free(gpu, dv);
	gpu->ops->free(gpu, dqkv);
	gpu->ops->free(gpu, dplan);
	free(kf);
	free(vf);
	free(kc);
	free(vc);
	free(qkv);
	free(ref);
	free(plan);
}

/* kv_attach copies a host cache up, kv_layer points into the copy, ops
 * write it there, kv_sync_host brings back what they wrote: a few slots
 * (gathered on the device), most of the cache (copied whole), or nothing.
 * With kv heads [h0, h0 + nh) of the cache (a tensor-parallel rank's), the
 * copy holds those, and the sync writes back those and no other. */
struct mirror_test {
	struct shape s;
	struct hi3_dims dm;       /* the attached heads' */
	int h0, nh;
	int L, B, C, W;
	size_t ln;                /* floats of one K or V of one layer */
	float *host[4], *ref[4];  /* K0 V0 K1 V1: the attached cache, and the CPU's copy */
	hi3_kvcache kv;
	void *k[2], *v[2];
};

/* Store M random tokens at (row, slot) into layer l on both sides. */
static void mirror_store(struct mirror_test *t, int l, const int32_t *row, const int64_t *slot, int M)
{
	float *qkv = randn((size_t)M * t->W, 1.0f);
	void *dqkv = dev_copy(qkv, sizeof(float) * M * t->W), *drow = dev_copy(row, sizeof(*row) * M);
	void *dslot = dev_copy(slot, sizeof(*slot) * M);
	hi3_kvcache ref = t->kv;
	void *rk[2] = {t->ref[0], t->ref[2]}, *rv[2] = {t->ref[1], t->ref[3]};
	hi3_kv_dst dd, cd;

	ref.k = rk;
	ref.v = rv;
	gpu->ops->kv_layer(gpu, &t->kv, l, t->h0, t->nh, &dd);
	cpu->ops->kv_layer(cpu, &ref, l, t->h0, t->nh, &cd);
	gpu->ops->kv_store(gpu, &dd, dqkv, drow, dslot, &t->dm, M);
	cpu->ops->kv_store(cpu, &cd, qkv, row, slot, &t->dm, M);
	free(qkv);
	gpu->ops->free(gpu, dqkv);
	gpu->ops->free(gpu, drow);
	gpu->ops->free(gpu, dslot);
}

static int mirror_same(const struct mirror_test *t)
{
	int same = 1;

	for (int i = 0; i < 4; i++)
		same &= !memcmp(t->host[i], t->ref[i], t->ln * sizeof(float));
	return same;
}

static void test_kv_mirror(int h0, int nh)
{
	struct mirror_test t = {.s = {4, 2, 32, 1}, .h0 = h0, .nh = nh, .L = 2, .B = 3, .C = 8};
	int32_t row1[3] = {1, 0, 1}, row2[2] = {2, 2}, rowf[24];
	int64_t slot1[3] = {2, 7, 3}, slot2[2] = {5, 0}, slotf[24];
	hi3_error err = {0};
	int untouched = 1;

	t.dm = dims_of(&t.s);
	t.dm.n_kv = nh;
	t.dm.n_h = nh * (t.s.n_h / t.s.n_kv);
	t.W = (t.dm.n_h + 2 * t.dm.n_kv) * t.s.d;
	diag("the KV mirror of kv heads [%d, %d) of %d", h0, h0 + nh, t.s.n_kv);
	t.ln = (size_t)t.B * t.s.n_kv * t.C * t.s.d;
	for (int i = 0; i < 4; i++) {
		t.host[i] = randn(t.ln, 1.0f);
		t.ref[i] = malloc(t.ln * sizeof(float));
		memcpy(t.ref[i], t.host[i], t.ln * sizeof(float));
	}
	t.k[0] = t.host[0], t.v[0] = t.host[1], t.k[1] = t.host[2], t.v[1] = t.host[3];
	t.kv = (hi3_kvcache){.n_layers = t.L, .B = t.B, .n_kv = t.s.n_kv, .C = t.C, .d = t.s.d, .dtype = HI3_F32,
	                     .k = t.k, .v = t.v};
	ok(gpu->ops->kv_attach(gpu, &t.kv, h0, nh, &err) == 0, "kv_attach: %s",
	   err.msg[0] ? err.msg : "copied to the device");
	mirror_store(&t, 1, row1, slot1, 3);
	for (int i = 0; i < 4; i++)               /* the host copy is untouched until a sync */
		untouched &= i < 2 ? !memcmp(t.host[i], t.ref[i], t.ln * sizeof(float))
		                   : !!memcmp(t.host[i], t.ref[i], t.ln * sizeof(float));
	ok(untouched, "kv_store into the device copy leaves the host cache as it was");
	ok(gpu->ops->kv_sync_host(gpu, &t.kv, &err) == 0 && mirror_same(&t),
	   "kv_sync_host after 3 stores in layer 1 (a few slots): host equals the CPU's cache %s", err.msg);
	mirror_store(&t, 0, row2, slot2, 2);
	ok(gpu->ops->kv_sync_host(gpu, &t.kv, &err) == 0 && mirror_same(&t),
	   "again after 2 more in layer 0 (only those are new) %s", err.msg);
	ok(gpu->ops->kv_sync_host(gpu, &t.kv, &err) == 0 && mirror_same(&t), "a sync with nothing new %s", err.msg);
	for (int i = 0; i < 24; i++) {            /* every slot of every row: the whole cache comes back */
		rowf[i] = i % t.B;
		slotf[i] = i / t.B;
	}
	mirror_store(&t, 1, rowf, slotf, 24);
	mirror_store(&t, 0, row1, slot1, 3);
	ok(gpu->ops->kv_sync_host(gpu, &t.kv, &err) == 0 && mirror_same(&t),
	   "after stores to every slot: host equals the CPU's cache %s", err.msg);
	gpu->ops->kv_detach(gpu, &t.kv);
	for (int i = 0; i < 4; i++) {
		free(t.host[i]);
		free(t.ref[i]);
	}
}

/* Out of device memory and unsupported weights are errors, not crashes. */
static void test_errors(void)
{
	hi3_tensor big = {.name = "big", .dtype = HI3_F32, .ndim = 2, .shape = {(int64_t)1 << 21, (int64_t)1 << 20}};
	hi3_tensor ints = {.name = "ints", .dtype = HI3_I64, .ndim = 1, .shape = {4}};
	int64_t iv[4] = {0};
	hi3_error err = {0};
	float one = 1.0f, two = 2.0f, *d1, *d2, *out;

	big.nbytes = (size_t)1 << 43;
	ok(gpu->ops->alloc(gpu, (size_t)1 << 50) == NULL, "alloc of 1 PiB returns NULL");
	ok(gpu->ops->weight(gpu, &big, HI3_WT_MATRIX, &err) == NULL && err.status == HI3_ERR_RUNTIME &&
	   strstr(err.msg, "out of GPU memory") && strstr(err.msg, "needs 8388608.0 MiB") && strstr(err.msg, "free of"),
	   "an 8 TiB weight: %s", err.msg);
	ints.data = iv;
	ints.nbytes = sizeof(iv);
	memset(&err, 0, sizeof(err));
	ok(gpu->ops->weight(gpu, &ints, HI3_WT_VECTOR, &err) == NULL && err.status == HI3_ERR_INPUT &&
	   strstr(err.msg, "I64"), "an I64 weight: %s", err.msg);
	d1 = dev_copy(&one, sizeof(float));      /* and the device still works */
	d2 = dev_copy(&two, sizeof(float));
	gpu->ops->add(gpu, d1, d2, 1);
	out = fetch(d1, sizeof(float));
	ok(*out == 3.0f, "ops run after the failed allocations");
	free(out);
	gpu->ops->free(gpu, d1);
	gpu->ops->free(gpu, d2);
}

/* ---------------------------------------------------------------- image ops */

static hi3_tensor tensor_nd(int ndim, const int64_t *shape, const float *v)
{
	hi3_tensor t = tensor(HI3_F32, 1, 1, 1, v);
	size_t n = 1;

	free(t.data);
	t.ndim = ndim;
	for (int i = 0; i < ndim; i++)
		n *= (size_t)(t.shape[i] = shape[i]);
	t.nbytes = n * 4;
	t.data = malloc(t.nbytes + 1);
	HI3_ASSERT(t.data);
	memcpy(t.data, v, t.nbytes);
	return t;
}

static hi3_wt *vec_w(hi3_backend *be, const float *v, int n, hi3_tensor *keep)
{
	*keep = tensor(HI3_F32, 1, n, 1, v);
	return load(be, keep, HI3_WT_VECTOR);
}

/* Compare exactly (data movement), then free the device output. */
static int check_exact(const char *what, float *dout, const float *ref, size_t n)
{
	float *out = fetch(dout, n * sizeof(float));
	int r = ok(!memcmp(out, ref, n * sizeof(float)), "%s: bit-exact", what);

	free(out);
	gpu->ops->free(gpu, dout);
	return r;
}

/* the conv op (CUDA: im2col in the weight's order, cuBLAS, bias) against
 * the CPU's direct convolution within 1e-5: all rows, rows 5 .. P-4 (the
 * rest of the output stays as it was), and with its input normalised */
static void test_conv(int kt, int k)
{
	const int B = 2, T = 3, H = 5, W = 6, C = 8, Co = 9;
	const struct hi3_conv cv = {B, T, H, W, C, kt, k, k};
	const size_t P = (size_t)B * T * H * W, K = (size_t)C * kt * k * k;
	float *x = randn(P * C, 1.0f), *wv = randn((size_t)Co * K, 0.2f), *bv = randn(Co, 0.5f);
	float *gw = randn(C, 0.3f), *gb = randn(C, 0.3f), *ref = malloc(sizeof(float) * P * Co);
	float *dx = dev_copy(x, P * C * 4), *dy = dev_nan(P * Co);
	int64_t ws[5] = {Co, C, kt, k, k};
	hi3_tensor wt = tensor_nd(5, ws, wv), bt, tgw, tgb;
	struct hi3_conv_w cc = {load(cpu, &wt, HI3_WT_MATRIX), vec_w(cpu, bv, Co, &bt), Co, C, kt, k, k};
	struct hi3_conv_w cg = {load(gpu, &wt, HI3_WT_MATRIX), load(gpu, &bt, HI3_WT_VECTOR), Co, C, kt, k, k};
	hi3_wt *cnw = vec_w(cpu, gw, C, &tgw), *cnb = vec_w(cpu, gb, C, &tgb);
	hi3_wt *gnw = load(gpu, &tgw, HI3_WT_VECTOR), *gnb = load(gpu, &tgb, HI3_WT_VECTOR);
	const struct hi3_conv_norm cn = {cnw, cnb, 4, HI3_ACT_SILU, 1e-6f}, gn = {gnw, gnb, 4, HI3_ACT_SILU, 1e-6f};
	char what[96];

	for (size_t i = 0; i < P * Co; i++)
		ref[i] = NAN;
	hi3i_conv(cpu, ref, x, &cc, &cv, NULL);
	hi3i_conv(gpu, dy, dx, &cg, &cv, NULL);
	snprintf(what, sizeof(what), "conv %dx%dx%d", kt, k, k);
	check(what, dy, ref, P * Co, 1e-5);
	dy = dev_nan(P * Co);
	for (size_t i = 0; i < P * Co; i++)
		ref[i] = NAN;
	hi3i_conv_rows(cpu, ref, x, &cc, &cv, &cn, 5, (int64_t)P - 9);
	hi3i_conv_rows(gpu, dy, dx, &cg, &cv, &gn, 5, (int64_t)P - 9);
	snprintf(what, sizeof(what), "conv %dx%dx%d of swish(groupnorm(x)), rows 5 .. P-4", kt, k, k);
	{
		float *out = fetch(dy, P * Co * sizeof(float));
		int rest = 1;
		for (size_t i = 0; i < P * Co; i++)
			if (i < 5 * (size_t)Co || i >= (P - 4) * (size_t)Co)
				rest &= isnan(out[i]) != 0;
		ok(rel_err(out + 5 * Co, ref + 5 * Co, (P - 9) * Co) <= 1e-5 && rest,
		   "%s: |out - ref| / |ref| = %.2e (at most 1e-5), nothing else written", what,
		   rel_err(out + 5 * Co, ref + 5 * Co, (P - 9) * Co));
		free(out);
		gpu->ops->free(gpu, dy);
	}
	hi3i_conv_free(&cc, cpu);
	hi3i_conv_free(&cg, gpu);
	cpu->ops->weight_free(cpu, cnw), cpu->ops->weight_free(cpu, cnb);
	gpu->ops->weight_free(gpu, gnw), gpu->ops->weight_free(gpu, gnb);
	gpu->ops->free(gpu, dx);
	free(wt.data), free(bt.data), free(tgw.data), free(tgb.data), free(x), free(wv), free(bv), free(gw), free(gb),
		free(ref);
}

/* An affine (w, b) pair of n on both backends. */
struct affine {
	hi3_tensor tw, tb;
	hi3_wt *cw, *cb, *gw, *gb;
};

static void affine_load(struct affine *a, const float *w, const float *b, int n)
{
	a->cw = vec_w(cpu, w, n, &a->tw);
	a->cb = vec_w(cpu, b, n, &a->tb);
	a->gw = load(gpu, &a->tw, HI3_WT_VECTOR);
	a->gb = load(gpu, &a->tb, HI3_WT_VECTOR);
}

static void affine_free(struct affine *a)
{
	cpu->ops->weight_free(cpu, a->cw);
	cpu->ops->weight_free(cpu, a->cb);
	gpu->ops->weight_free(gpu, a->gw);
	gpu->ops->weight_free(gpu, a->gb);
	free(a->tw.data);
	free(a->tb.data);
}

static void test_norms(void)
{
	const int B = 2, C = 64, G = 32, M = 5, n = 1152;
	const int64_t P = 1500;                 /* two chunks of HI3_GN_CHUNK */
	const size_t N = (size_t)B * P * C;
	float *x = randn(N, 2.0f), *wv = randn(n, 1.0f), *bv = randn(n, 1.0f), *ref = malloc(sizeof(float) * N);
	float *dx = dev_copy(x, N * 4), *dy;
	struct affine a;
	char what[64];

	affine_load(&a, wv, bv, C);
	for (int act = HI3_ACT_NONE; act <= HI3_ACT_GELU; act++) {
		cpu->ops->groupnorm(cpu, ref, x, a.cw, a.cb, B, P, C, G, 1e-6f, act);
		dy = dev_nan(N);
		gpu->ops->groupnorm(gpu, dy, dx, a.gw, a.gb, B, P, C, G, 1e-6f, act);
		snprintf(what, sizeof(what), "groupnorm B=%d P=%lld C=%d G=%d act=%d", B, (long long)P, C, G, act);
		check(what, dy, ref, N, 1e-5);
	}
	affine_free(&a);
	affine_load(&a, wv, bv, n);
	cpu->ops->layernorm(cpu, ref, x, a.cw, a.cb, M, n, 1e-6f);
	dy = dev_nan((size_t)M * n);
	gpu->ops->layernorm(gpu, dy, dx, a.gw, a.gb, M, n, 1e-6f);
	check("layernorm M=5 n=1152", dy, ref, (size_t)M * n, 1e-5);
	affine_free(&a);
	gpu->ops->free(gpu, dx);
	free(x), free(wv), free(bv), free(ref);
}

static void test_image_elementwise(void)
{
	const int B = 2, P = 45, C = 24, r = 4, T = 2, H = 3, W = 5, Cs = 3;
	const size_t n = (size_t)B * P * C;
	float *x = randn(n, 3.0f), *ss = randn((size_t)B * 2 * C, 0.5f), *z = randn(n * r, 1.0f), *bv = randn(C, 1.0f);
	float *ref = malloc(sizeof(float) * n * r), *dx = dev_copy(x, n * 4), *dz = dev_copy(z, n * r * 4), *dy;
	float *dss = dev_copy(ss, (size_t)B * 2 * C * 4);
	static const char *names[] = {"silu", "gelu", "gelu_tanh"};
	hi3_tensor tb;
	hi3_wt *cb = vec_w(cpu, bv, C, &tb), *gb = load(gpu, &tb, HI3_WT_VECTOR);
	char what[64];

	for (int a = HI3_ACT_SILU; a <= HI3_ACT_GELU_TANH; a++) {
		cpu->ops->act(cpu, ref, x, n, a);
		dy = dev_nan(n);
		gpu->ops->act(gpu, dy, dx, n, a);
		snprintf(what, sizeof(what), "act %s", names[a - 1]);
		check(what, dy, ref, n, 1e-5);
	}
	/* the in-place ops start from x */
	memcpy(ref, x, n * 4);
	cpu->ops->bias_add(cpu, ref, cb, (int64_t)B * P, C);
	dy = dev_copy(x, n * 4);
	gpu->ops->bias_add(gpu, dy, gb, (int64_t)B * P, C);
	check("bias_add", dy, ref, n, 1e-6);
	memcpy(ref, x, n * 4);
	cpu->ops->scale_shift(cpu, ref, ss, B, P, C);
	dy = dev_copy(x, n * 4);
	gpu->ops->scale_shift(gpu, dy, dss, B, P, C);
	check("scale_shift", dy, ref, n, 1e-6);
	memcpy(ref, x, n * 4);
	cpu->ops->add_repeat(cpu, ref, z, (int64_t)B * P, C, r);
	dy = dev_copy(x, n * 4);
	gpu->ops->add_repeat(gpu, dy, dz, (int64_t)B * P, C, r);
	check("add_repeat", dy, ref, n, 1e-6);
	memcpy(ref, x, n * 4);
	cpu->ops->add_group_mean(cpu, ref, z, (int64_t)B * P, C, r);
	dy = dev_copy(x, n * 4);
	gpu->ops->add_group_mean(gpu, dy, dz, (int64_t)B * P, C, r);
	check("add_group_mean", dy, ref, n, 1e-6);
	/* shuffles of z, both ways, time doubled or not */
	for (int rt = 1; rt <= 2; rt++) {
		const size_t ns = (size_t)B * T * H * W * rt * 4 * Cs;
		cpu->ops->depth_to_space(cpu, ref, z, B, T, H, W, Cs, rt);
		dy = dev_nan(ns);
		gpu->ops->depth_to_space(gpu, dy, dz, B, T, H, W, Cs, rt);
		snprintf(what, sizeof(what), "depth_to_space rt=%d", rt);
		check_exact(what, dy, ref, ns);
		cpu->ops->space_to_depth(cpu, ref, z, B, T * rt, 2 * H, 2 * W, Cs, rt);
		dy = dev_nan(ns);
		gpu->ops->space_to_depth(gpu, dy, dz, B, T * rt, 2 * H, 2 * W, Cs, rt);
		snprintf(what, sizeof(what), "space_to_depth rt=%d", rt);
		check_exact(what, dy, ref, ns);
	}
	cpu->ops->weight_free(cpu, cb);
	gpu->ops->weight_free(gpu, gb);
	gpu->ops->free(gpu, dx);
	gpu->ops->free(gpu, dz);
	gpu->ops->free(gpu, dss);
	free(tb.data), free(x), free(ss), free(z), free(bv), free(ref);
}

static void test_attention_dense(int B, int M, int n_h, int d, int masked)
{
	const size_t n = (size_t)B * M * n_h * d;
	float *q = randn(n, 1.0f), *k = randn(n, 1.0f), *v = randn(n, 1.0f), *ref = malloc(sizeof(float) * n);
	float *dq = dev_copy(q, n * 4), *dk = dev_copy(k, n * 4), *dv = dev_copy(v, n * 4), *dy = dev_nan(n);
	uint8_t *mask = masked ? malloc((size_t)B * M) : NULL, *dmask = NULL;
	char what[96];

	for (int i = 0; masked && i < B * M; i++)
		mask[i] = i % M < M - 1 - 5 * (i / M);
	if (mask)
		dmask = dev_copy(mask, (size_t)B * M);
	cpu->ops->attention_dense(cpu, ref, q, k, v, mask, B, M, n_h, d);
	gpu->ops->attention_dense(gpu, dy, dq, dk, dv, dmask, B, M, n_h, d);
	snprintf(what, sizeof(what), "attention_dense B=%d M=%d n_h=%d d=%d%s", B, M, n_h, d, masked ? " key-masked" : "");
	check(what, dy, ref, n, 1e-5);
	gpu->ops->free(gpu, dq);
	gpu->ops->free(gpu, dk);
	gpu->ops->free(gpu, dv);
	if (dmask)
		gpu->ops->free(gpu, dmask);
	free(q), free(k), free(v), free(ref), free(mask);
}

static void test_image_ops(void)
{
	hi3_error err = {0};

	ok(hi3i_backend_check_image(gpu, &err) == 0, "the CUDA backend has every image op %s", err.msg);
	test_conv(3, 3);
	test_conv(1, 3);
	test_conv(1, 1);
	test_norms();
	test_image_elementwise();
	test_attention_dense(2, 33, 3, 24, 0);
	test_attention_dense(3, 40, 2, 16, 1);
	test_attention_dense(1, 50, 1, 1100, 0);
}

/* With batch_invariant asked for, F32 and BF16 products of any M run the
 * gemv kernel 8 rows a pass (no cuBLAS): each row of a batch of 13 is
 * the bits of that row alone, and the CPU's product within the usual
 * tolerance. */
static void test_matmul_invariant(void)
{
	static const hi3_dtype dts[] = {HI3_F32, HI3_BF16};
	const int N = 37, M = 13;
	hi3_backend *inv;
	hi3_error err = {0};

	HI3_ASSERT(hi3i_backend_cuda(&inv, 0, 1, &err) == 0 && inv->batch_invariant);
	for (size_t i = 0; i < 2 * HI3_ARRAY_SIZE(dts); i++) {
		const int K = i < HI3_ARRAY_SIZE(dts) ? 80 : 81;   /* 16-byte loads, and not */
		float *wv = randn((size_t)N * K, 0.1f), *x = randn((size_t)M * K, 1.0f), *ya, *y1;
		hi3_tensor t = tensor(dts[i % HI3_ARRAY_SIZE(dts)], 2, N, K, wv);
		hi3_wt *w = load(inv, &t, HI3_WT_MATRIX), *wc = load(cpu, &t, HI3_WT_MATRIX);
		float *dx = inv->ops->alloc(inv, sizeof(float) * (size_t)M * K), *dy = inv->ops->alloc(inv, sizeof(float) * M * N);
		float *dy1 = inv->ops->alloc(inv, sizeof(float) * N), *ref = malloc(sizeof(float) * (size_t)M * N);
		int alone = 1;

		HI3_ASSERT(dx && dy && dy1 && ref && inv->ops->upload(inv, dx, x, sizeof(float) * (size_t)M * K) == 0);
		inv->ops->matmul(inv, dy, dx, w, M);
		ya = malloc(sizeof(float) * (size_t)M * N);
		y1 = malloc(sizeof(float) * (size_t)N);
		HI3_ASSERT(ya && y1 && inv->ops->download(inv, ya, dy, sizeof(float) * (size_t)M * N) == 0);
		for (int m = 0; m < M; m++) {
			inv->ops->matmul(inv, dy1, dx + (size_t)m * K, w, 1);
			HI3_ASSERT(inv->ops->download(inv, y1, dy1, sizeof(float) * (size_t)N) == 0);
			alone &= !memcmp(y1, ya + (size_t)m * N, sizeof(float) * (size_t)N);
		}
		cpu->ops->matmul(cpu, ref, x, wc, M);
		ok(alone && rel_err(ya, ref, (size_t)M * N) <= (t.dtype == HI3_BF16 ? 1e-2 : 1e-5),
		   "batch-invariant matmul %s K=%d: 13 rows, each the bits of the row alone; the CPU's within %.0e (%.2e)",
		   hi3_dtype_name(t.dtype), K, t.dtype == HI3_BF16 ? 1e-2 : 1e-5, rel_err(ya, ref, (size_t)M * N));
		inv->ops->free(inv, dx);
		inv->ops->free(inv, dy);
		inv->ops->free(inv, dy1);
		inv->ops->weight_free(inv, w);
		cpu->ops->weight_free(cpu, wc);
		free(t.data), free(wv), free(x), free(ya), free(y1), free(ref);
	}
	inv->ops->destroy(inv);
}

/* ---------------------------------------------------------------- quantized */

/* A random weight-only quantized (N, K) matrix of one layout (quant.h),
 * its bytes in buf (freed by the caller). NaN e4m3 codes are left out: a
 * NaN weight would make its whole column NaN in the products below. */
struct qcase {
	const char *what;
	int format, N, K, block, per_row, nested, nested_block;
	hi3_dtype scale_dtype, round_to;
};

static void *qrand_bytes(size_t n, int fp8)
{
	uint8_t *p = malloc(n + 1);

	HI3_ASSERT(p);
	for (size_t i = 0; i < n; i++) {
		p[i] = (uint8_t)(urand() * 256.0);
		if (fp8 && (p[i] & 0x7f) == 0x7f)
			p[i] ^= 1;
	}
	return p;
}

static hi3_qweight qmake(const struct qcase *c, void **buf)
{
	const size_t nk = (size_t)c->N * (size_t)c->K;
	hi3_qweight q = {.format = c->format, .N = c->N, .K = c->K, .block = c->block, .per_row = c->per_row,
	                 .scale_dtype = c->scale_dtype, .round_to = c->round_to, .nested = c->nested,
	                 .nested_block = c->nested_block, .scale2 = 0.37f, .offset = 0.0123f};
	size_t nsc = 0;
	float *f;

	switch (c->format) {
	case HI3_Q_FP8:
		buf[0] = qrand_bytes(nk, 1);
		nsc = c->per_row ? (size_t)c->N : 1;
		buf[1] = malloc(nsc * 4);
		for (size_t i = 0; i < nsc; i++) {
			const float v = 0.01f + 0.02f * (float)urand();
			if (c->scale_dtype == HI3_F32)
				((float *)buf[1])[i] = v;
			else
				((uint16_t *)buf[1])[i] = c->scale_dtype == HI3_BF16 ? hi3_f32_to_bf16(v) : hi3_f32_to_f16(v);
		}
		break;
	case HI3_Q_INT8:
		buf[0] = qrand_bytes(nk, 0);
		buf[1] = f = malloc((size_t)c->N * 4);
		for (int i = 0; i < c->N; i++)
			f[i] = 0.5f + (float)urand();
		break;
	case HI3_Q_NF4:
		buf[0] = qrand_bytes((nk + 1) / 2, 0);
		nsc = (nk + (size_t)c->block - 1) / (size_t)c->block;
		if (c->nested) {
			const size_t nn = (nsc + (size_t)c->nested_block - 1) / (size_t)c->nested_block;
			buf[1] = qrand_bytes(nsc, 0);
			buf[2] = f = malloc(nn * 4);
			for (size_t i = 0; i < nn; i++)
				f[i] = 0.01f + 0.01f * (float)urand();
			for (int i = 0; i < 256; i++)
				q.nested_map[i] = 2.0f * (float)urand() - 1.0f;
			q.nested_absmax = buf[2];
		} else {
			buf[1] = f = malloc(nsc * 4);
			for (size_t i = 0; i < nsc; i++)
				f[i] = 0.1f + (float)urand();
		}
		for (int i = 0; i < 16; i++)
			q.map[i] = (float)i / 7.5f - 1.0f + 0.001f * (float)urand();
		break;
	default:                  /* NVFP4 */
		buf[0] = qrand_bytes(nk / 2, 0);
		buf[1] = qrand_bytes((size_t)c->N * (size_t)(c->K / c->block), 1);
		break;
	}
	q.codes = buf[0];
	q.scale = buf[1];
	return q;
}

static hi3_wt *qload(hi3_backend *be, const hi3_qweight *q, hi3_tensor *t)
{
	hi3_error err = {0};
	hi3_wt *w;

	*t = (hi3_tensor){.name = "test", .dtype = HI3_U8, .ndim = 1, .shape = {1}, .data = (void *)q->codes,
	                  .nbytes = 1};
	if (!(w = be->ops->qweight(be, t, q, &err)))
		diag("%s qweight: %s", be->name, err.msg);
	HI3_ASSERT(w);
	return w;
}

/* The kernel's weights are hi3i_qweight_at's values (x the identity, so
 * y[k][n] = W[n, k] alone: M = K rows, several passes of 8); a row alone
 * gives the bits it gives in a batch of 13; the CPU's product within 1e-5;
 * a grouped matmul the bits of one matmul each. Odd shapes: nf4 rows that
 * are not a multiple of the block, and an odd element count. */
static void test_qmatmul(void)
{
	static const struct qcase cases[] = {
		{"fp8 per-tensor f32", HI3_Q_FP8, 7, 37, 0, 0, 0, 0, HI3_F32, HI3_F32},
		{"fp8 per-channel bf16", HI3_Q_FP8, 9, 40, 0, 1, 0, 0, HI3_BF16, HI3_BF16},
		{"fp8 per-channel f16", HI3_Q_FP8, 5, 33, 0, 1, 0, 0, HI3_F16, HI3_F16},
		{"int8 rows", HI3_Q_INT8, 11, 29, 0, 0, 0, 0, HI3_F32, HI3_F32},
		{"nf4 block 64, rows of 37", HI3_Q_NF4, 5, 37, 64, 0, 0, 0, HI3_F32, HI3_F32},
		{"nf4 block 16, bf16", HI3_Q_NF4, 9, 41, 16, 0, 0, 0, HI3_F32, HI3_BF16},
		{"nf4 double quant, nested block 3", HI3_Q_NF4, 7, 45, 32, 0, 1, 3, HI3_U8, HI3_F32},
		{"nvfp4", HI3_Q_NVFP4, 7, 48, 16, 0, 0, 0, HI3_F8_E4M3, HI3_F32},
	};

	for (size_t ci = 0; ci < HI3_ARRAY_SIZE(cases); ci++) {
		const struct qcase *c = &cases[ci];
		const int N = c->N, K = c->K, M = 13;
		void *buf[3] = {NULL, NULL, NULL};
		const hi3_qweight q = qmake(c, buf);
		hi3_tensor tg, tc;
		hi3_wt *wg = qload(gpu, &q, &tg), *wc = qload(cpu, &q, &tc);
		float *eye = calloc((size_t)K * K, sizeof(float)), *x = randn((size_t)M * K, 1.0f);
		float *ref = malloc(sizeof(float) * (size_t)M * N), *yv, *ya, *y1;
		float *dx = dev_copy(x, sizeof(float) * (size_t)M * K), *deye, *dy = dev_nan((size_t)K * N);
		float *dya = dev_nan((size_t)M * N), *dy1 = dev_nan((size_t)N);
		int same = 1, alone = 1, bad_n = -1, bad_k = -1;
		char what[96];

		for (int k = 0; k < K; k++)
			eye[(size_t)k * K + k] = 1.0f;
		deye = dev_copy(eye, sizeof(float) * (size_t)K * K);
		gpu->ops->matmul(gpu, dy, deye, wg, K);
		yv = fetch(dy, sizeof(float) * (size_t)K * N);
		for (int n = 0; n < N && same; n++)
			for (int k = 0; k < K && same; k++)
				if (!(yv[(size_t)k * N + n] == hi3i_qweight_at(&q, n, k)))
					same = 0, bad_n = n, bad_k = k;
		ok(same, "qmatmul %s (%d, %d): every dequantized weight is hi3i_qweight_at's value%s", c->what, N, K,
		   same ? "" : " (not so at the first mismatch below)");
		if (!same)
			diag("W[%d, %d]: kernel %.9g, hi3i_qweight_at %.9g", bad_n, bad_k, yv[(size_t)bad_k * N + bad_n],
			     hi3i_qweight_at(&q, bad_n, bad_k));

		gpu->ops->matmul(gpu, dya, dx, wg, M);
		ya = fetch(dya, sizeof(float) * (size_t)M * N);
		for (int m = 0; m < M; m++) {
			gpu->ops->matmul(gpu, dy1, dx + (size_t)m * K, wg, 1);
			y1 = fetch(dy1, sizeof(float) * (size_t)N);
			alone &= !memcmp(y1, ya + (size_t)m * N, sizeof(float) * (size_t)N);
			free(y1);
		}
		ok(alone, "qmatmul %s: each of 13 rows alone gives its bits in the batch of 13", c->what);
		cpu->ops->matmul(cpu, ref, x, wc, M);
		snprintf(what, sizeof(what), "qmatmul %s M=%d: the CPU's product", c->what, M);
		check(what, dya, ref, (size_t)M * N, 1e-5);

		if (ci + 1 == HI3_ARRAY_SIZE(cases)) {   /* grouped: with another format, 3, 0 and 8 rows */
			void *b2[3] = {NULL, NULL, NULL};
			const hi3_qweight q2 = qmake(&cases[4], b2);
			hi3_tensor t2;
			hi3_wt *w2 = qload(gpu, &q2, &t2);
			const hi3_wt *ws[3] = {wg, w2, wg};
			const int Ms[3] = {3, 0, 8};
			float *dg[3] = {dev_nan((size_t)8 * N), dev_nan((size_t)N), dev_nan((size_t)8 * N)};
			float *xg[3] = {dx, dx, dx + K};
			float *a, *b;
			int grp;

			gpu->ops->matmul_group(gpu, 3, dg, (const float *const *)xg, ws, Ms);
			a = fetch(dg[0], sizeof(float) * 3 * (size_t)N);
			b = fetch(dg[2], sizeof(float) * 8 * (size_t)N);
			grp = !memcmp(a, ya, sizeof(float) * 3 * (size_t)N) &&
			      !memcmp(b, ya + N, sizeof(float) * 8 * (size_t)N);
			ok(grp, "qmatmul_group: products of 3 and 8 rows (and one of 0) equal matmul's bits");
			free(a);
			free(b);
			for (int i = 0; i < 3; i++)
				gpu->ops->free(gpu, dg[i]);
			gpu->ops->weight_free(gpu, w2);
			for (int i = 0; i < 3; i++)
				free(b2[i]);
		}
		free(yv);
		free(ya);
		free(eye);
		free(x);
		free(ref);
		gpu->ops->free(gpu, dx);
		gpu->ops->free(gpu, deye);
		gpu->ops->free(gpu, dy);
		gpu->ops->free(gpu, dy1);
		gpu->ops->weight_free(gpu, wg);
		cpu->ops->weight_free(cpu, wc);
		for (int i = 0; i < 3; i++)
			free(buf[i]);
	}
}

int main(void)
{
	hi3_error err = {0};

	/* weights stream to the device in 4 KiB chunks, so most take several
	 * and both upload buffers are reused (on the emulator a buffer refilled
	 * before its copy is done corrupts the weight) */
	setenv("HI3_CUDA_UPLOAD_CHUNK", "4096", 1);
	if (hi3i_backend_cpu(&cpu, 1, 1, &err) != 0) {
		printf("Bail out! cpu backend: %s\n", err.msg);
		return 1;
	}
	if (hi3i_backend_cuda(&gpu, 0, 0, &err) != 0) {
		printf("Bail out! %s\n", err.msg);
		return 1;
	}
	test_matmul();
	test_matmul_paths();
	test_matmul_group(HI3_F32);
	test_matmul_group(HI3_BF16);
	test_qmatmul();
	test_matmul_invariant();
	test_embed();
	test_rmsnorm();
	test_elementwise();
	test_gather_scatter();
	test_combine();
	test_graphs();
	for (size_t i = 0; i < HI3_ARRAY_SIZE(shapes); i++) {
		test_rope(&shapes[i]);
		test_kv_store(&shapes[i], HI3_F32);
		test_kv_store(&shapes[i], HI3_BF16);
		test_attention_self(&shapes[i]);
		test_attention_cache(&shapes[i], HI3_F32, 1);
		test_attention_cache(&shapes[i], HI3_BF16, 3);
		test_attention_cache(&shapes[i], HI3_F32, 40);
	}
	test_kv_mirror(0, 2);
	test_kv_mirror(1, 1);
	test_image_ops();
	test_errors();
	gpu->ops->destroy(gpu);
	cpu->ops->destroy(cpu);
	return done_testing();
}
