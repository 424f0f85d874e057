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
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>
#include "core/internal.h"
#include "backend/gemm.h"
#include "backend/pool.h"
#include "tools/tools.h"

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

/* ------------------------------------------------------------ set stream */

/* One B = 1 decode step's products of the `small` preset (hidden 1024, 8
 * layers; per layer qkv, o, the router, then the shared expert and 4
 * routed ones as two groups, gate_up then down, as the model runs them;
 * then lm_head), the weights back to back in one buffer of huge pages as
 * a checkpoint's map holds them, beside reads of the same bytes on the
 * same team of threads (backend/pool.h), each pass in turn:
 *   xor read          hi3i_read_xor, the read `hi3 bench` divides a decode
 *                     step by (its floor): a thread's share as 4 parts
 *                     read side by side;
 *   xor read 1, 2     the same as one part (one stream a thread), two;
 *   widen read        the loads of the products' few-row tile, 8 weights at
 *                     a time widened to floats (BF16: 16 bytes zero-extended
 *                     and shifted; F32: 32 bytes), XORed;
 *   widen+fma read    the same floats into 4 chains of fused multiply-adds;
 *   widen32+fma read  (BF16) 32-byte loads widened by a permute and two
 *                     unpacks: the same floats in the same lanes, half the
 *                     loads;
 *   widen+fma+pf read widen+fma with a prefetch PF_AHEAD bytes ahead of
 *                     each 64-byte line it starts;
 *   xor read cold     the XOR read of as many bytes of another buffer, one
 *                     the last-level cache cannot hold (the bytes and twice
 *                     that cache), a window further on each round: bytes
 *                     last read long ago. Every other pass reads bytes the
 *                     pass before it read: where the last-level cache holds
 *                     a good part of them (a host's 480 MiB L3 against
 *                     `small`'s 234 MB, say), those reads partly hit it.
 * A read differs from the products only by their few rows at once, their
 * prefetches and their jobs, so the lines say how far a loop's own work
 * keeps a core from the read's rate on this machine, and the last one
 * what reading the bytes in address order with a near prefetch gives the
 * same work (the products read 2 to 4 rows at once and prefetch a whole
 * tile ahead). */
enum { S_GEMM, S_XOR, S_XOR1, S_XOR2, S_WIDEN, S_FMA, S_FMA32, S_FMAPF, S_COLD, S_N };
static const char *const sname[S_N] = {"products",       "xor read",          "xor read 1",
                                       "xor read 2",     "widen read",        "widen+fma read",
                                       "widen32+fma read", "widen+fma+pf read", "xor read cold"};
/* widen+fma+pf's prefetch distance: about what one core needs in flight
 * to stream from memory (latency times rate: 100-150 ns at 10-20 GB/s) */
#define PF_AHEAD 1536

struct stream_read {
	const unsigned char *p;
	size_t n;
	int kind, bf16;
	_Atomic uint64_t x;
};

#if defined(__x86_64__)
/* 8 elements at p as floats, loaded as the products load W */
__attribute__((target("avx2"), always_inline)) static inline __m256i widen8(const unsigned char *p, int bf16)
{
	return bf16 ? _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16)
	            : _mm256_loadu_si256((const __m256i *)p);
}

__attribute__((target("avx2"))) static uint64_t read_widen(const unsigned char *p, size_t n, int bf16)
{
	const size_t e = bf16 ? 16 : 32;
	__m256i x0 = _mm256_setzero_si256(), x1 = x0, x2 = x0, x3 = x0;

	for (size_t i = 0; i + 4 * e <= n; i += 4 * e) {
		x0 = _mm256_xor_si256(x0, widen8(p + i, bf16));
		x1 = _mm256_xor_si256(x1, widen8(p + i + e, bf16));
		x2 = _mm256_xor_si256(x2, widen8(p + i + 2 * e, bf16));
		x3 = _mm256_xor_si256(x3, widen8(p + i + 3 * e, bf16));
	}
	x0 = _mm256_xor_si256(_mm256_xor_si256(x0, x1), _mm256_xor_si256(x2, x3));
	return (uint64_t)_mm256_extract_epi64(x0, 0);
}

/* ahead: prefetch that many bytes ahead of each 64-byte line (0: none) */
__attribute__((target("avx2,fma"))) static uint64_t read_fma(const unsigned char *p, size_t n, int bf16,
                                                             size_t ahead)
{
	const size_t e = bf16 ? 16 : 32;
	const __m256 c = _mm256_set1_ps(one);
	__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
	float r[8];

	for (size_t i = 0; i + 4 * e <= n; i += 4 * e) {
		for (size_t l = i; ahead && l < i + 4 * e; l += 64)
			if (l + ahead < n)
				_mm_prefetch((const char *)p + l + ahead, _MM_HINT_T0);
		a0 = _mm256_fmadd_ps(c, _mm256_castsi256_ps(widen8(p + i, bf16)), a0);
		a1 = _mm256_fmadd_ps(c, _mm256_castsi256_ps(widen8(p + i + e, bf16)), a1);
		a2 = _mm256_fmadd_ps(c, _mm256_castsi256_ps(widen8(p + i + 2 * e, bf16)), a2);
		a3 = _mm256_fmadd_ps(c, _mm256_castsi256_ps(widen8(p + i + 3 * e, bf16)), a3);
	}
	_mm256_storeu_ps(r, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
	return (uint64_t)r[0];
}
__attribute__((target("avx2,fma"))) static uint64_t read_fma32(const unsigned char *p, size_t n, int bf16)
{
	const __m256 c = _mm256_set1_ps(one);
	const __m256i z = _mm256_setzero_si256();
	__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
	float r[8];

	(void)bf16;
	for (size_t i = 0; i + 64 <= n; i += 64) {
		__m256i u = _mm256_permute4x64_epi64(_mm256_load_si256((const __m256i *)(p + i)), 0xD8);
		__m256i v = _mm256_permute4x64_epi64(_mm256_load_si256((const __m256i *)(p + i + 32)), 0xD8);
		a0 = _mm256_fmadd_ps(c, _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, u)), a0);
		a1 = _mm256_fmadd_ps(c, _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, u)), a1);
		a2 = _mm256_fmadd_ps(c, _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v)), a2);
		a3 = _mm256_fmadd_ps(c, _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v)), a3);
	}
	_mm256_storeu_ps(r, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
	return (uint64_t)r[0];
}
#else
static uint64_t read_widen(const unsigned char *p, size_t n, int bf16)
{
	uint32_t x = 0;

	for (size_t i = 0; i + 4 <= n; i += bf16 ? 2 : 4) {
		uint32_t v = 0;
		memcpy(bf16 ? (unsigned char *)&v + 2 : (unsigned char *)&v, p + i, bf16 ? 2 : 4);
		x ^= v;
	}
	return x;
}

static uint64_t read_fma(const unsigned char *p, size_t n, int bf16, size_t ahead)
{
	float a = 0.0f;

	(void)ahead;
	for (size_t i = 0; i + 4 <= n; i += bf16 ? 2 : 4)
		a = fmaf(one, bf16 ? hi3_bf16_to_f32((uint16_t)(p[i] | p[i + 1] << 8)) : *(const float *)(p + i), a);
	return (uint64_t)a;
}

static uint64_t read_fma32(const unsigned char *p, size_t n, int bf16)
{
	return read_fma(p, n, bf16, 0);
}
#endif

/* Thread id's equal share of the read, in whole 128-byte blocks. */
static void stream_part(void *arg, int id, int nt)
{
	struct stream_read *r = arg;
	const size_t blocks = r->n / 128, lo = blocks * (size_t)id / (size_t)nt * 128,
	             hi = blocks * (size_t)(id + 1) / (size_t)nt * 128;
	uint64_t x = r->kind == S_XOR || r->kind == S_COLD ? hi3i_read_xor((const uint64_t *)(r->p + lo), (hi - lo) / 8)
	             : r->kind == S_XOR1 || r->kind == S_XOR2
	                     ? hi3i_read_xor_parts((const uint64_t *)(r->p + lo), (hi - lo) / 8, r->kind == S_XOR1 ? 1 : 2)
	             : r->kind == S_WIDEN ? read_widen(r->p + lo, hi - lo, r->bf16)
	             : r->kind == S_FMA32 ? read_fma32(r->p + lo, hi - lo, r->bf16)
	                                  : read_fma(r->p + lo, hi - lo, r->bf16, r->kind == S_FMAPF ? PF_AHEAD : 0);

	atomic_fetch_xor(&r->x, x);
}

static int cmp_double(const void *a, const void *b)
{
	const double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Bytes of the last-level cache (sysconf; 64 MiB where it does not say). */
static size_t last_level_cache(void)
{
	long n = -1;

#ifdef _SC_LEVEL3_CACHE_SIZE
	n = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
	return n > 0 ? (size_t)n : (size_t)64 << 20;
}

static int stream_set(int reps)
{
	enum { L = 8, E = 4, PER = 3 + 2 * (E + 1) };
	static const int shape[PER][2] = {{1536, 1024}, {1024, 1024}, {16, 1024}, /* qkv, o, router */
	                                  {1024, 1024}, {1024, 1024}, {1024, 1024}, {1024, 1024}, {1024, 1024},
	                                  {1024, 512}, {1024, 512}, {1024, 512}, {1024, 512}, {1024, 512}};
	const int nm = L * PER + 1;
	float *x = calloc(2048, sizeof(float)), *y = calloc(32000, sizeof(float));
	float *ys[E + 1], *xs[E + 1];
	double *tm = malloc(sizeof(double) * (size_t)reps * S_N * 2);

	if (!x || !y || !tm) {
		fprintf(stderr, "bench-gemm: out of memory\n");
		return 1;
	}
	for (int i = 0; i < 2048; i++)
		x[i] = (float)(i % 17) / 17.0f - 0.5f;
	for (int d = 0; d < 2; d++) {
		const size_t es = d ? 2 : 4;
		hi3_wmat w[L * PER + 1];
		size_t bytes = 0, at = 0;
		unsigned char *buf;
		hi3_error err = {0};

		for (int l = 0; l < L; l++)
			for (int i = 0; i < PER; i++)
				bytes += (size_t)shape[i][0] * (size_t)shape[i][1] * es;
		bytes += (size_t)32000 * 1024 * es;
		if (!(buf = hi3i_huge_alloc(bytes + 128, NULL))) {   /* as a checkpoint's map and hi3 bench's read */
			fprintf(stderr, "bench-gemm: out of memory for %zu MB of weights\n", bytes >> 20);
			return 1;
		}
		/* values in [1, 2) in either form: for BF16, 0x3f80 plus 6 bits of a
		 * 32-bit hash (the hash once taken in 64 bits made every bit pattern,
		 * NaN, infinities and subnormals among them, and a multiply-add of a
		 * subnormal takes a microcode assist on Intel's cores: the products
		 * then read at 1.17x the XOR read, not 1.07x) */
		for (size_t i = 0; i < bytes / 2; i++)
			((uint16_t *)buf)[i] = d ? (uint16_t)(0x3f80 + ((uint32_t)(i * 2654435761u) >> 26)) : (i & 1 ? 0x3f80 : 0);
		for (int m = 0; m < nm; m++) {
			const int N = m < L * PER ? shape[m % PER][0] : 32000, K = m < L * PER ? shape[m % PER][1] : 1024;
			hi3i_wmat_init(&w[m], buf + at, d ? HI3_BF16 : HI3_F32, N, K, &err);
			at += (size_t)N * (size_t)K * es;
		}
		/* the cold read's buffer: the bytes and twice the last-level cache */
		const size_t cs = bytes + 2 * last_level_cache();
		unsigned char *cold = hi3i_huge_alloc(cs, NULL);
		if (!cold) {
			fprintf(stderr, "bench-gemm: out of memory for %zu MB to read cold\n", cs >> 20);
			return 1;
		}
		memset(cold, 0x5a, cs);
		for (int r = 0; r < reps; r++) {
			double tx = 0.0, ts[S_N];
			for (int s = 0; s < S_N; s++) {
				const double t0 = hi3i_now();
				if (s == S_FMA32 && !d) {
					ts[s] = 0.0;
					continue;
				}
				if (s == S_GEMM) {
					int fail = 0;
					for (int l = 0; l < L; l++) {
						const hi3_wmat *g[E + 1];
						int M1[E + 1];
						for (int i = 0; i < 3; i++)
							fail |= hi3i_gemm(y, x, &w[l * PER + i], 1);
						for (int half = 0; half < 2; half++) {
							for (int e = 0; e <= E; e++) {
								g[e] = &w[l * PER + 3 + half * (E + 1) + e];
								ys[e] = y + (size_t)e * 1024;
								xs[e] = x;
								M1[e] = 1;
							}
							fail |= hi3i_gemm_group(E + 1, ys, (const float *const *)xs,
							                        (const hi3_wmat *const *)g, M1);
						}
					}
					if (fail | hi3i_gemm(y, x, &w[nm - 1], 1)) {
						fprintf(stderr, "bench-gemm: out of memory\n");
						return 1;
					}
				} else {
					struct stream_read rd = {buf, bytes, s, d, 0};
					if (s == S_COLD)   /* a window on from the last round's */
						rd.p = cold + ((size_t)r * bytes % (cs - bytes) & ~(size_t)4095);
					hi3i_pool_run(stream_part, &rd, omp_get_max_threads());
					y[0] += (float)(atomic_load(&rd.x) & 1);
				}
				ts[s] = hi3i_now() - t0;
				if (s == S_XOR)
					tx = ts[s];
			}
			for (int s = 0; s < S_N; s++) {
				tm[(size_t)s * reps + r] = ts[s];
				tm[(size_t)(S_N + s) * reps + r] = ts[s] / tx;
			}
		}
		for (int s = 0; s < S_N; s++) {
			double *ms = tm + (size_t)s * reps, *ra = tm + (size_t)(S_N + s) * reps;
			if (s == S_FMA32 && !d)
				continue;
			qsort(ms, (size_t)reps, sizeof(double), cmp_double);
			qsort(ra, (size_t)reps, sizeof(double), cmp_double);
			printf("{\"stream\": \"%s\", \"dtype\": \"%s\", \"mb\": %.1f, \"ms\": %.2f, \"gb_s\": %.1f, "
			       "\"over_xor\": %.3f, \"over_xor_q1\": %.3f, \"over_xor_q3\": %.3f}\n",
			       sname[s], d ? "BF16" : "F32", bytes / 1e6, ms[reps / 2] * 1e3, bytes / ms[reps / 2] * 1e-9,
			       ra[reps / 2], ra[reps / 4], ra[3 * reps / 4]);
			fflush(stdout);
		}
		free(buf);
		free(cold);
	}
	free(x);
	free(y);
	free(tm);
	return 0;
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
		fprintf(stderr, "usage: bench-gemm --peak [THREADS]\n       bench-gemm [THREADS [REPS [all|prefill|vit|quant|stream]]]\n");
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
	if (!strcmp(set, "stream"))
		return stream_set((int)reps);
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
