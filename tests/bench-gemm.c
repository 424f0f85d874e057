/*
 * bench-gemm.c -- the batch-invariant GEMM (lib/backend/gemm.c) beside
 * OpenBLAS sgemm on the same shapes, in the same run (scripts/bench-gemm).
 *
 *   bench-gemm --peak [THREADS]
 *   bench-gemm [THREADS [REPS [SET]]]
 *
 * --peak: the FMA rate of THREADS threads at once (each 24 independent
 * fused multiply-add chains, no memory; the best of 15 short runs, so that
 * other work on the machine weighs little), for 256- and, where the CPU has
 * it, 512-bit vectors: the machine's peak, and the clock it implies (two
 * FMA units). Without it the peak is measured first and every shape's
 * line gives both GEMMs' fraction of it (the widest vectors'). SET: all
 * (default), prefill (the `small` preset and the real layer shape), vit
 * (the released SigLIP2 and aligner widths at 1024 patches), quant (the
 * prefill shapes and B = 1 decode products of the real layer shape, M = 1
 * and 8, with weights F32, BF16 and each quantized format of quant.h:
 * int8 row scales, fp8 with BF16 row scales and rounding, nf4 in blocks of
 * 64 rounded to BF16, nvfp4). One JSON line per shape and weight dtype: the best of REPS
 * runs of each, taken in turn, in GFLOP/s of wall time; OpenBLAS always
 * multiplies f32 weights (it has no bf16 path), so a bf16 line compares
 * hi3 reading bf16 with sgemm reading f32. Where hi3 runs its AVX-512
 * kernel, hi3_avx2_gflop_s is its AVX2 kernel on the same shape (the one
 * kernel it had before; inf where not run).
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>
#include "core/internal.h"
#include "backend/gemm.h"

#if defined(__x86_64__)
#include <immintrin.h>
static volatile float one = 1.0f, zero = 0.0f;

/* n rounds of 24 fused multiply-adds on independent registers */
__attribute__((target("avx2,fma"), noinline)) static float fma256(long n)
{
	__m256 a[12];
	const __m256 o = _mm256_set1_ps(one), z = _mm256_set1_ps(zero);
	float r[8];

#pragma GCC unroll 12
	for (int i = 0; i < 12; i++)
		a[i] = _mm256_set1_ps((float)i);
	for (long k = 0; k < 2 * n; k++)
#pragma GCC unroll 12
		for (int i = 0; i < 12; i++)
			a[i] = _mm256_fmadd_ps(a[i], o, z);
#pragma GCC unroll 12
	for (int i = 1; i < 12; i++)
		a[0] = _mm256_add_ps(a[0], a[i]);
	_mm256_storeu_ps(r, a[0]);
	return r[0];
}

__attribute__((target("avx512f"), noinline)) static float fma512(long n)
{
	__m512 a[24];
	const __m512 o = _mm512_set1_ps(one), z = _mm512_set1_ps(zero);

#pragma GCC unroll 24
	for (int i = 0; i < 24; i++)
		a[i] = _mm512_set1_ps((float)i);
	for (long k = 0; k < n; k++)
#pragma GCC unroll 24
		for (int i = 0; i < 24; i++)
			a[i] = _mm512_fmadd_ps(a[i], o, z);
#pragma GCC unroll 24
	for (int i = 1; i < 24; i++)
		a[0] = _mm512_add_ps(a[0], a[i]);
	return _mm512_reduce_add_ps(a[0]);
}

static double peak(void)
{
	const long n = 10000000;
	double top = 0;
	volatile float sink = 0;

	__builtin_cpu_init();
	for (int wide = 0; wide < 2; wide++) {
		const int lanes = wide ? 16 : 8;
		double best = 0;
		if (wide && !__builtin_cpu_supports("avx512f"))
			break;
		for (int r = 0; r < 15; r++) {
			double t0 = hi3i_now(), t;
			int nt = 1;
#pragma omp parallel
			{
#pragma omp single
				nt = omp_get_num_threads();
				sink += wide ? fma512(n) : fma256(n);
			}
			t = hi3i_now() - t0;
			best = fmax(best, 24.0 * lanes * 2 * n * nt / t);
			if (r == 14)
				printf("{\"peak\": \"fma%d\", \"threads\": %d, \"gflop_s\": %.1f, \"per_thread\": %.1f, "
				       "\"ghz_at_2_fma_per_cycle\": %.2f}\n", lanes * 32, nt, best * 1e-9, best * 1e-9 / nt,
				       best / nt / (2.0 * lanes * 2) * 1e-9);
		}
		top = best;
	}
	(void)sink;
	return top;
}
#else
static double peak(void)
{
	printf("{\"peak\": \"none\"}\n");
	return 0;
}
#endif

struct shape {
	const char *set, *name;
	int M, N, K;
};

static const struct shape shapes[] = {
	/* `small` (hidden 1024, 16 q / 4 kv heads of 64, experts of 512),
	 * 512-token prompts: B = 1 and B = 8 */
	{"prefill", "small qkv", 512, 1536, 1024},
	{"prefill", "small o", 512, 1024, 1024},
	{"prefill", "small expert up, 128 rows", 128, 1024, 1024},
	{"prefill", "small expert down, 128 rows", 128, 1024, 512},
	{"prefill", "small qkv B=8", 4096, 1536, 1024},
	{"prefill", "small expert up B=8", 1024, 1024, 1024},
	/* the real layer (hidden 4096, 32 q / 8 kv heads of 128, experts of
	 * 3072), 512 tokens, 64 experts top 8: 64 rows an expert */
	{"prefill", "real qkv", 512, 6144, 4096},
	{"prefill", "real o", 512, 4096, 4096},
	{"prefill", "real expert up, 64 rows", 64, 6144, 4096},
	{"prefill", "real expert down, 64 rows", 64, 4096, 3072},
	/* SigLIP2 so400m at 1024 patches, and the aligner */
	{"vit", "vit qkv/o", 1024, 1152, 1152},
	{"vit", "vit fc1", 1024, 4304, 1152},
	{"vit", "vit fc2", 1024, 1152, 4304},
	{"vit", "aligner 1", 1024, 4096, 1152},
	{"vit", "aligner 2", 1024, 4096, 4096},
	/* B = 1 decode: the real layer's products, one row (bandwidth-bound:
	 * the weights stream from memory), and 8 rows */
	{"decode", "real qkv, 1 row", 1, 6144, 4096},
	{"decode", "real o, 1 row", 1, 4096, 4096},
	{"decode", "real expert down, 1 row", 1, 4096, 3072},
	{"decode", "real qkv, 8 rows", 8, 6144, 4096},
};

/* The weight forms of a line: F32, BF16, then (set quant) the quantized
 * ones, each of its own codes and scales (their values do not change the
 * speed). */
enum { D_F32, D_BF16, D_INT8, D_FP8, D_NF4, D_NVFP4, D_N };
static const char *const dname[D_N] = {"F32", "BF16", "int8", "fp8", "nf4", "nvfp4"};

/* q over buf (N K + N K / 8 + 8 N bytes) for form d, codes from w. */
static void make_q(hi3_qweight *q, unsigned char *buf, int d, const float *w, int N, int K)
{
	const size_t nk = (size_t)N * K;

	memset(q, 0, sizeof(*q));
	q->N = N;
	q->K = K;
	q->codes = buf;
	q->scale = buf + nk;
	q->round_to = HI3_F32;
	for (size_t i = 0; i < nk; i++)
		buf[i] = (unsigned char)(i * 2654435761u >> 13);
	switch (d) {
	case D_INT8:
		q->format = HI3_Q_INT8;
		q->scale_dtype = HI3_F32;
		for (int n = 0; n < N; n++)
			((float *)q->scale)[n] = 0.5f + fabsf(w[(size_t)n * K]);
		break;
	case D_FP8:
		q->format = HI3_Q_FP8;
		q->scale_dtype = q->round_to = HI3_BF16;
		q->per_row = 1;
		for (size_t i = 0; i < nk; i++)
			buf[i] = hi3i_f32_to_e4m3(w[i] * 400.0f);
		for (int n = 0; n < N; n++)
			((uint16_t *)q->scale)[n] = hi3_f32_to_bf16(1.0f / 400.0f);
		break;
	case D_NF4:
		q->format = HI3_Q_NF4;
		q->block = 64;
		q->round_to = HI3_BF16;
		q->scale_dtype = HI3_F32;
		for (int i = 0; i < 16; i++)
			q->map[i] = -1.0f + (float)i / 7.5f;
		for (size_t b = 0; b < nk / 64; b++)
			((float *)q->scale)[b] = 0.5f + (float)(b % 7) / 7.0f;
		break;
	default:
		q->format = HI3_Q_NVFP4;
		q->block = 16;
		q->scale2 = 0.01f;
		q->scale_dtype = HI3_F8_E4M3;
		for (size_t b = 0; b < nk / 16; b++)
			((unsigned char *)q->scale)[b] = (unsigned char)(48 + b % 16);
		break;
	}
}

int main(int argc, char **argv)
{
	const int pk = argc > 1 && !strcmp(argv[1], "--peak"), a0 = pk ? 2 : 1;
	int64_t threads = 0, reps = 3;
	double top;
	int best;
	const char *set = argc > a0 + 2 ? argv[a0 + 2] : "all";

	if ((argc > a0 && hi3i_parse_i64(argv[a0], 0, 1024, &threads)) ||
	    (argc > a0 + 1 && hi3i_parse_i64(argv[a0 + 1], 1, 1000, &reps))) {
		fprintf(stderr, "usage: bench-gemm --peak [THREADS]\n       bench-gemm [THREADS [REPS [all|prefill|vit|quant]]]\n");
		return 2;
	}
	if (threads > 0)
		omp_set_num_threads((int)threads);
	openblas_set_num_threads(threads > 0 ? (int)threads : omp_get_max_threads());
	if (pk) {
		peak();
		return 0;
	}
	top = peak();
	best = hi3i_gemm_isa(-1);
	printf("{\"hi3_kernel\": \"%s\", \"threads\": %d}\n",
	       hi3i_gemm_isa(-1) == 2 ? "avx512" : hi3i_gemm_isa(-1) == 1 ? "avx2" : "portable", omp_get_max_threads());
	for (size_t s = 0; s < HI3_ARRAY_SIZE(shapes); s++) {
		const struct shape *sh = &shapes[s];
		const int M = sh->M, N = sh->N, K = sh->K;
		const int quant = !strcmp(set, "quant");
		float *x, *w, *y;
		uint16_t *wb;
		unsigned char *qb;

		if (quant ? !strcmp(sh->set, "vit") : strcmp(set, "all") ? strcmp(set, sh->set) : !strcmp(sh->set, "decode"))
			continue;
		x = malloc(sizeof(float) * (size_t)M * K);
		w = malloc(sizeof(float) * (size_t)N * K);
		y = malloc(sizeof(float) * (size_t)M * N);
		wb = malloc(2 * (size_t)N * K);
		qb = malloc((size_t)N * K + (size_t)N * K / 8 + 8 * (size_t)N);
		if (!x || !w || !y || !wb || !qb) {
			fprintf(stderr, "bench-gemm: out of memory\n");
			return 1;
		}
		for (size_t i = 0; i < (size_t)M * K; i++)
			x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
		for (size_t i = 0; i < (size_t)N * K; i++) {
			w[i] = (float)((i * 40503u) % 997) / 997.0f - 0.5f;
			wb[i] = hi3_f32_to_bf16(w[i]);
		}
		for (int d = 0; d < (quant ? D_N : 2); d++) {
			double tb = INFINITY, th = INFINITY, t2avx = INFINITY, fl = 2.0 * M * N * K;
			hi3_qweight q;
			hi3_wmat wm;

			if (d >= D_INT8) {
				make_q(&q, qb, d, w, N, K);
				hi3i_wmat_init_q(&wm, &q);
			} else {
				hi3i_wmat_init(&wm, d ? (void *)wb : (void *)w, d ? HI3_BF16 : HI3_F32, N, K, NULL);
			}
			for (int r = 0; r < reps; r++) {
				double t0 = hi3i_now(), t1, t2;
				cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, w, K, 0.0f, y, N);
				t1 = hi3i_now();
				if (hi3i_gemm(y, x, &wm, M) != 0) {
					fprintf(stderr, "bench-gemm: out of memory\n");
					return 1;
				}
				t2 = hi3i_now();
				tb = fmin(tb, t1 - t0);
				th = fmin(th, t2 - t1);
				if (best == 2) {         /* the AVX2 kernel, hi3's only one before AVX-512 */
					hi3i_gemm_isa(1);
					t0 = hi3i_now();
					hi3i_gemm(y, x, &wm, M);
					t2avx = fmin(t2avx, hi3i_now() - t0);
					hi3i_gemm_isa(-1);
				}
			}
			printf("{\"shape\": \"%s\", \"M\": %d, \"N\": %d, \"K\": %d, \"dtype\": \"%s\", "
			       "\"sgemm_gflop_s\": %.2f, \"hi3_gflop_s\": %.2f, \"hi3_over_sgemm\": %.3f, "
			       "\"hi3_of_peak\": %.3f, \"sgemm_of_peak\": %.3f, \"hi3_avx2_gflop_s\": %.2f}\n",
			       sh->name, M, N, K, dname[d], fl / tb * 1e-9, fl / th * 1e-9, tb / th,
			       top > 0 ? fl / th / top : 0.0, top > 0 ? fl / tb / top : 0.0, fl / t2avx * 1e-9);
			fflush(stdout);
		}
		free(x);
		free(w);
		free(y);
		free(wb);
		free(qb);
	}
	return 0;
}
