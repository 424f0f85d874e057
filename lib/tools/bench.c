/*
 * bench.c -- measurements `hi3 bench` reports side by side in one run:
 * memory read bandwidth, OpenBLAS sgemm against hi3's in-place GEMM on the
 * model's own prefill shapes, in-memory prefill and decode, and the decode
 * floor set by the bytes one step must read, a decode step split by op
 * on the CPU, and the step's own weights read again.
 */
#include <cblas.h>
#undef I   /* cblas.h brings complex.h's I, a member's name in model.h */
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu.h"
#include "backend/gemm.h"
#include "backend/pool.h"
#include "model/config-internal.h"
#include "model/model.h"
#include "tools/tools.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
/* XOR of parts equal parts of h bytes each from a (h a multiple of 64),
 * 64 bytes of each in turn, each part prefetched ahead bytes on (into L1
 * with l1, else into L2) when ahead is not 0: the loop of the floor's read
 * (no prefetch) and of the step's weights read again (replay_part). */
__attribute__((target("avx2"), always_inline)) static inline uint64_t
xor_parts(const unsigned char *a, size_t h, const int parts, const size_t ahead, const int l1)
{
	__m256i x[2 * HI3I_READ_PARTS];

	for (int p = 0; p < 2 * parts; p++)
		x[p] = _mm256_setzero_si256();
	for (size_t i = 0; i < h; i += 64)
#pragma GCC unroll 8
		for (int p = 0; p < parts; p++) {
			const unsigned char *q = a + (size_t)p * h + i;
			if (ahead && l1)
				_mm_prefetch((const char *)q + ahead, _MM_HINT_T0);
			else if (ahead)
				_mm_prefetch((const char *)q + ahead, _MM_HINT_T1);
			x[2 * p] = _mm256_xor_si256(x[2 * p], _mm256_loadu_si256((const __m256i *)q));
			x[2 * p + 1] = _mm256_xor_si256(x[2 * p + 1], _mm256_loadu_si256((const __m256i *)(q + 32)));
		}
	for (int p = 1; p < 2 * parts; p++)
		x[0] = _mm256_xor_si256(x[0], x[p]);
	return (uint64_t)_mm256_extract_epi64(x[0], 0) ^ (uint64_t)_mm256_extract_epi64(x[0], 1) ^
	       (uint64_t)_mm256_extract_epi64(x[0], 2) ^ (uint64_t)_mm256_extract_epi64(x[0], 3);
}

/* XOR of every word of parts equal parts of [a, a + n) read side by side,
 * 32 bytes of each in turn, then of the words left. */
__attribute__((target("avx2"), always_inline)) static inline uint64_t read_parts(const uint64_t *a, size_t n,
                                                                                const int parts)
{
	const size_t h = n / (size_t)parts & ~(size_t)15;
	uint64_t r = xor_parts((const unsigned char *)a, 8 * h, parts, 0, 0);

	for (size_t i = (size_t)parts * h; i < n; i++)
		r ^= a[i];
	return r;
}

__attribute__((target("avx2"))) uint64_t hi3i_read_xor_parts(const uint64_t *a, size_t n, int parts)
{
	switch (parts) {
	case 1: return read_parts(a, n, 1);
	case 2: return read_parts(a, n, 2);
	default: return read_parts(a, n, HI3I_READ_PARTS);
	}
}
#else
uint64_t hi3i_read_xor_parts(const uint64_t *a, size_t n, int parts)
{
	uint64_t x = 0;

	(void)parts;
	for (size_t i = 0; i < n; i++)
		x ^= a[i];
	return x;
}
#endif

uint64_t hi3i_read_xor(const uint64_t *a, size_t n)
{
	return hi3i_read_xor_parts(a, n, HI3I_READ_PARTS);
}

/* How far ahead read_ahead prefetches each part, in bytes: on the Intel
 * Xeon of docs/PERFORMANCE.md ("Decode at B = 1, eighteenth round") a
 * B = 1 step's weights read so took 1.04x the time with 1 KiB, 1.13x with
 * none, and about 1.1x with 4 KiB. */
#define READ_AHEAD 2048

/* XOR of the bytes [a, a + n), at any alignment, read as HI3I_READ_PARTS
 * equal parts side by side, each prefetched READ_AHEAD bytes on: the read
 * of a step's weights again (replay_part), whose many ranges, some under
 * a megabyte, the hardware prefetchers alone read slower than one long
 * buffer. Into L1 where the products' few-row tiles prefetch into L1
 * (hi3i_gemm_prefetch_l1), else into L2: on an AMD EPYC of Zen 5, on its
 * fastest memory, the read into L2 took 1.10-1.15x the floor where into
 * L1 it took 1.02-1.04x (docs/PERFORMANCE.md, "Decode at B = 1,
 * twenty-second round"). */
#if defined(__x86_64__)
__attribute__((target("avx2"))) static uint64_t read_ahead(const unsigned char *a, size_t n)
{
	const size_t h = n / HI3I_READ_PARTS & ~(size_t)63;
	uint64_t r = hi3i_gemm_prefetch_l1() ? xor_parts(a, h, HI3I_READ_PARTS, READ_AHEAD, 1)
	                                     : xor_parts(a, h, HI3I_READ_PARTS, READ_AHEAD, 0);

	for (size_t i = (size_t)HI3I_READ_PARTS * h; i < n; i++)
		r ^= a[i];
	return r;
}
#else
static uint64_t read_ahead(const unsigned char *a, size_t n)
{
	uint64_t r = 0;

	for (size_t i = 0; i < n; i++)
		r ^= a[i];
	return r;
}
#endif

/* A buffer of n words to read, filled (so that it is mapped in); NULL
 * when out of memory. It asks for huge pages, as a checkpoint's map does
 * (format/safetensors.c): the floor is the fastest read of the bytes,
 * and on 4 KiB pages the same read took 4-6% longer (an AMD EPYC VM, the
 * two buffers read in turn, 31 rounds, 1 and 2 threads). */
static uint64_t *read_buffer(size_t n)
{
	uint64_t *a = hi3i_huge_alloc(n * sizeof(uint64_t), NULL);

	if (!a)
		return NULL;
#pragma omp parallel for schedule(static)
	for (size_t i = 0; i < n; i++)
		a[i] = i * 0x9e3779b97f4a7c15ULL;
	return a;
}

struct read_job {
	const uint64_t *a;
	size_t n;
	_Atomic uint64_t x;
};

static void read_part(void *p, int id, int nt)
{
	struct read_job *j = p;
	const size_t chunk = (j->n / (size_t)nt) & ~(size_t)15, lo = chunk * (size_t)id;

	atomic_fetch_xor(&j->x, hi3i_read_xor(j->a + lo, id == nt - 1 ? j->n - lo : chunk));
}

/* Seconds to read the n words of a once, every thread a slice, on the
 * team that runs a decode step's products (backend/pool.h): read between
 * steps, the read finds the team as the next step will. */
static double read_pass(const uint64_t *a, size_t n)
{
	static volatile uint64_t sink;
	struct read_job j = {a, n, 0};
	double t0 = hi3i_now();

	hi3i_pool_run(read_part, &j, omp_get_max_threads());
	sink = sink ^ atomic_load(&j.x);
	return hi3i_now() - t0;
}

/* The value of a "key : value" line of /proc/cpuinfo, or NULL. */
static char *cpuinfo_value(char *line, const char *key)
{
	const size_t k = strlen(key);
	char *c = strchr(line, ':');

	if (!c || strncmp(line, key, k) != 0 || strspn(line + k, " \t") != (size_t)(c - line) - k)
		return NULL;
	c += 1 + strspn(c + 1, " \t");
	c[strcspn(c, "\n")] = '\0';
	return c;
}

void hi3_bench_cpu(char *buf, size_t n)
{
	char line[256], name[128] = "", family[16] = "", model[16] = "", *v;
	FILE *f = fopen("/proc/cpuinfo", "r");

	if (n == 0)
		return;
	/* the first processor's lines: they end at its first blank line */
	while (f && fgets(line, sizeof line, f) && line[0] != '\n') {
		if ((v = cpuinfo_value(line, "model name")))
			snprintf(name, sizeof name, "%s", v);
		else if ((v = cpuinfo_value(line, "cpu family")))
			snprintf(family, sizeof family, "%s", v);
		else if ((v = cpuinfo_value(line, "model")))
			snprintf(model, sizeof model, "%s", v);
	}
	if (f)
		fclose(f);
#if defined(__x86_64__)
	if (!name[0] && (unsigned)__get_cpuid_max(0x80000000, NULL) >= 0x80000004u) {
		unsigned r[12];
		char brand[49];
		for (unsigned i = 0; i < 3; i++)
			__get_cpuid(0x80000002 + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
		memcpy(brand, r, 48);
		brand[48] = '\0';
		snprintf(name, sizeof name, "%s", brand + strspn(brand, " "));
	}
#endif
	if (family[0] && model[0])
		snprintf(buf, n, "%s (family %s, model %s)", name[0] ? name : "unknown", family, model);
	else
		snprintf(buf, n, "%s", name[0] ? name : "unknown");
}

double hi3_bench_membw(size_t bytes, int reps)
{
	const size_t n = bytes / sizeof(uint64_t);
	uint64_t *a = read_buffer(n);
	double best = 0.0;

	if (!a)
		return 0.0;
	for (int r = 0; r < reps; r++) {
		double t = read_pass(a, n);
		if (t > 0 && (double)bytes / t > best)
			best = (double)bytes / t;
	}
	free(a);
	return best;
}

static int cmp_double(const void *a, const void *b)
{
	const double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* The median of the n values of v (sorted in place). */
static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Time y = x W^T for one (M, N, K) with both implementations; seconds. */
static int time_gemm(int M, int N, int K, hi3_dtype wdt, int reps, double *t_blas, double *t_hi3)
{
	float *x = NULL, *w = NULL, *y = NULL;
	uint16_t *wb = NULL;
	hi3_wmat wm;
	int rc = -1;

	x = malloc(sizeof(float) * (size_t)M * K);
	w = malloc(sizeof(float) * (size_t)N * K);
	y = malloc(sizeof(float) * (size_t)M * N);
	wb = malloc(2 * (size_t)N * K);
	if (!x || !w || !y || !wb)
		goto out;
	for (size_t i = 0; i < (size_t)M * K; i++)
		x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
	for (size_t i = 0; i < (size_t)N * K; i++) {
		w[i] = (float)((i * 40503u) % 997) / 997.0f - 0.5f;
		wb[i] = hi3_f32_to_bf16(w[i]);
	}
	if (hi3i_wmat_init(&wm, wdt == HI3_BF16 ? (void *)wb : (void *)w, wdt, N, K, NULL) != 0)
		goto out;
	*t_blas = *t_hi3 = INFINITY;
	for (int r = 0; r < reps; r++) {
		double t0 = hi3i_now();
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, w, K, 0.0f, y, N);
		double t1 = hi3i_now();
		hi3i_gemm(y, x, &wm, M);
		double t2 = hi3i_now();
		*t_blas = fmin(*t_blas, t1 - t0);
		*t_hi3 = fmin(*t_hi3, t2 - t1);
	}
	rc = 0;
out:
	free(x);
	free(w);
	free(y);
	free(wb);
	return rc;
}

int hi3_bench_gemm(const hi3_config *c, int M, hi3_dtype wdt, int reps, double *flops, double *t_blas,
                   double *t_hi3)
{
	int H = c->hidden_size, d = c->attention_head_dim, nh = c->num_attention_heads;
	int W = (nh + 2 * c->num_key_value_heads) * d, moe = hi3_config_is_moe_layer(c, 0);
	int inter = moe ? c->moe_intermediate_size[0] : c->intermediate_size;
	int Msh = M, Me = moe ? HI3_MAX(1, (int)((int64_t)M * c->moe_topk[0] / c->num_experts[0])) : M;
	/* the shapes of one layer: qkv, o, then the MLP (one expert's share
	 * of the tokens for MoE, plus the shared MLP) */
	struct { int M, N, K, times; } sh[6];
	int n = 0;

	sh[n++] = (typeof(sh[0])){M, W, H, 1};
	sh[n++] = (typeof(sh[0])){M, H, nh * d, 1};
	if (moe) {
		sh[n++] = (typeof(sh[0])){Me, 2 * inter, H, c->num_experts[0]};
		sh[n++] = (typeof(sh[0])){Me, H, inter, c->num_experts[0]};
		if (c->use_mixed_mlp_moe && c->num_shared_expert[0] > 0) {
			int Is = HI3_MAX(0, hi3i_config_shared_width(c, 0));
			sh[n++] = (typeof(sh[0])){Msh, 2 * Is, H, 1};
			sh[n++] = (typeof(sh[0])){Msh, H, Is, 1};
		}
	} else {
		sh[n++] = (typeof(sh[0])){M, 2 * inter, H, 1};
		sh[n++] = (typeof(sh[0])){M, H, inter, 1};
	}
	*flops = *t_blas = *t_hi3 = 0.0;
	for (int i = 0; i < n; i++) {
		double tb, th;
		if (time_gemm(sh[i].M, sh[i].N, sh[i].K, wdt, reps, &tb, &th) != 0)
			return -1;
		*flops += 2.0 * sh[i].M * sh[i].N * sh[i].K * sh[i].times;
		*t_blas += tb * sh[i].times;
		*t_hi3 += th * sh[i].times;
	}
	return 0;
}

/* Bytes one B = 1 decode step must read: the active weights and the KV
 * of ctx slots. */
double hi3_bench_step_bytes(const hi3_config *c, hi3_dtype wdt, hi3_dtype kvdt, int ctx)
{
	double es = (double)hi3_dtype_size(wdt), H = c->hidden_size, d = c->attention_head_dim;
	double nh = c->num_attention_heads, nkv = c->num_key_value_heads, b = 0.0;

	for (int l = 0; l < c->num_hidden_layers; l++) {
		b += ((nh + 2 * nkv) * d * H + H * nh * d) * es + 2 * H * 4.0;
		if (hi3_config_is_moe_layer(c, l)) {
			double inter = c->moe_intermediate_size[l];
			b += c->num_experts[l] * H * 4.0;                 /* router, f32 */
			b += c->moe_topk[l] * 3.0 * H * inter * es;
			if (c->use_mixed_mlp_moe)
				b += c->num_shared_expert[l] * 3.0 * H * inter * es;
		} else {
			b += 3.0 * H * c->intermediate_size * es;
		}
		b += 2.0 * nkv * d * ctx * hi3_dtype_size(kvdt);
	}
	b += (double)c->vocab_size * H * es + H * es + H * 4.0;   /* lm_head, one wte row, ln_f */
	return b;
}

/*
 * A decode step split by op: hi3_bench_model hands the CPU backend a copy of
 * its ops whose matrix products and attention add their wall time to
 * op_clock, then puts the backend's own ops back. The CPU backend's ops
 * return when their work is done (a CUDA op only enqueues it), so the wall
 * time of the call is the op's. Two clock reads an op, about 120 a step
 * of `small`: microseconds in a step of milliseconds.
 */
enum { OP_PRODUCTS, OP_ATTENTION, OP_N };

static struct {
	const struct hi3_backend_ops *own;  /* the backend's ops, while the timed copy runs */
	struct hi3_backend_ops timed;
	double t[OP_N];                     /* seconds spent so far */
} op_clock;

/*
 * The step's own weights read again. While the steps of hi3_bench_model
 * run, each product call of the CPU backend notes the weights it reads, as
 * stored (a quantized matrix, whose bytes its format knows, is not
 * noted, nor is anything else a step reads: the KV cache, the norms).
 * After the steps each step's weights are read again in its order (one
 * job on the team a call, as the step ran them), with the floor's read
 * between two steps as between the steps themselves, so each step's bytes
 * are read on the cache state the step found them in, and no arithmetic
 * is done: what a product kernel that only read its weights would take.
 * Its ratio to the floor is what the step's ranges and their place in
 * the caches cost against one buffer read again; the products' ratio to
 * it, what the kernels' way of reading costs.
 */
struct span {
	const unsigned char *p;
	size_t n;
	int call;                 /* the product call that read it */
};

static struct {
	int on, calls;            /* on: noting; off after the steps, or when out of memory */
	struct span *s;
	size_t n, cap;
} replay;

static void replay_note(const hi3_wt *w, int M)
{
	if (!replay.on || M <= 0 || w->mat.q || !w->mat.data || w->mat.N <= 0 || w->mat.K <= 0)
		return;
	if (replay.n == replay.cap) {
		size_t cap = replay.cap ? 2 * replay.cap : 1024;
		struct span *s = realloc(replay.s, cap * sizeof(*s));
		if (!s) {
			replay.on = 0;    /* no replay: its result stays 0 */
			return;
		}
		replay.s = s;
		replay.cap = cap;
	}
	replay.s[replay.n++] = (struct span){w->mat.data,
	                                     (size_t)w->mat.N * (size_t)w->mat.K * hi3_dtype_size(w->mat.dtype),
	                                     replay.calls};
}

struct replay_job {
	const struct span *s;
	size_t n;
	_Atomic uint64_t x;
};

/* Thread id's share of every span of the job: its equal part of each. */
static void replay_part(void *p, int id, int nt)
{
	struct replay_job *j = p;
	uint64_t x = 0;

	for (size_t i = 0; i < j->n; i++) {
		const size_t chunk = (j->s[i].n / (size_t)nt) & ~(size_t)63, lo = chunk * (size_t)id;
		x ^= read_ahead(j->s[i].p + lo, id == nt - 1 ? j->s[i].n - lo : chunk);
	}
	atomic_fetch_xor(&j->x, x);
}

/* Seconds to read spans [s, s + n) again, a job a call. */
static double replay_pass(const struct span *s, size_t n)
{
	static volatile uint64_t sink;
	const double t0 = hi3i_now();

	for (size_t i = 0, e; i < n; i = e) {
		struct replay_job j = {s + i, 0, 0};
		for (e = i; e < n && s[e].call == s[i].call; e++)
			;
		j.n = e - i;
		hi3i_pool_run(replay_part, &j, omp_get_max_threads());
		sink = sink ^ atomic_load(&j.x);
	}
	return hi3i_now() - t0;
}

static void timed_matmul(hi3_backend *be, float *y, const float *x, const hi3_wt *w, int M)
{
	const double t0 = hi3i_now();

	replay_note(w, M);
	replay.calls++;
	op_clock.own->matmul(be, y, x, w, M);
	op_clock.t[OP_PRODUCTS] += hi3i_now() - t0;
}

static void timed_matmul_group(hi3_backend *be, int n, float *const *y, const float *const *x,
                               const hi3_wt *const *w, const int *M)
{
	const double t0 = hi3i_now();

	for (int i = 0; i < n; i++)
		replay_note(w[i], M[i]);
	replay.calls++;
	op_clock.own->matmul_group(be, n, y, x, w, M);
	op_clock.t[OP_PRODUCTS] += hi3i_now() - t0;
}

static void timed_attention(hi3_backend *be, float *out, const float *qkv, const hi3_kv_src *k,
                            const hi3_kv_src *v, const hi3_attn_q *q, const struct hi3_dims *dm, int M)
{
	const double t0 = hi3i_now();

	op_clock.own->attention(be, out, qkv, k, v, q, dm, M);
	op_clock.t[OP_ATTENTION] += hi3i_now() - t0;
}

/* Time be's products and attention from now on: 1, or 0 where they cannot
 * be timed by the clock (not the CPU backend) or are already timed. */
static int op_clock_start(hi3_backend *be)
{
	if (strcmp(be->name, "cpu") != 0 || op_clock.own || !be->ops->matmul || !be->ops->attention)
		return 0;
	op_clock.own = be->ops;
	op_clock.timed = *be->ops;
	op_clock.timed.matmul = timed_matmul;
	op_clock.timed.matmul_group = be->ops->matmul_group ? timed_matmul_group : NULL;
	op_clock.timed.attention = timed_attention;
	be->ops = &op_clock.timed;
	return 1;
}

static void op_clock_stop(hi3_backend *be)
{
	if (op_clock.own && be->ops == &op_clock.timed)
		be->ops = op_clock.own;
	op_clock.own = NULL;
}

/*
 * A cache line's round trip between the team's caller and its first
 * worker, as a decode step's products hand work and results between them.
 * On a VM the two vCPUs may share a CCD (45-58 ns here) or sit on two
 * (340-430 ns), and which one moves by the minute: on two the memory
 * reads faster, with two links to it, and every hand-over costs 6-9x
 * (docs/PERFORMANCE.md, "Decode at B = 1, twenty-sixth round").
 */
#define RTT_TRIPS 256
#define RTT_MAX_S 5e-3            /* after the first trip: a worker kept off its core, give up */

struct rtt_job {
	_Alignas(64) _Atomic long flag; /* 2i + 1: trip i out; 2i + 2: back; -1: stop */
	double ns;
};

static void rtt_part(void *p, int id, int nt)
{
	struct rtt_job *j = p;
	double t0 = 0.0;
	long v;

	if (nt < 2 || id > 1)
		return;
	if (id == 1) {
		for (long i = 0; i <= RTT_TRIPS; i++) {
			while ((v = atomic_load_explicit(&j->flag, memory_order_acquire)) != 2 * i + 1)
				if (v < 0)
					return;
				else
					hi3i_pool_relax();
			if (!atomic_compare_exchange_strong(&j->flag, &v, 2 * i + 2))
				return;
		}
		return;
	}
	for (long i = 0; i <= RTT_TRIPS; i++) {
		if (i == 1)
			t0 = hi3i_now();      /* trip 0 waits for the worker to come */
		atomic_store_explicit(&j->flag, 2 * i + 1, memory_order_release);
		for (int spins = 1; atomic_load_explicit(&j->flag, memory_order_acquire) != 2 * i + 2; spins++) {
			hi3i_pool_relax();
			if (i > 0 && spins % 1024 == 0 && hi3i_now() - t0 > RTT_MAX_S) {
				/* the trips so far (the one under way if none) */
				atomic_store(&j->flag, -1);
				j->ns = (hi3i_now() - t0) * 1e9 / (double)HI3_MAX(i - 1, 1);
				return;
			}
		}
	}
	j->ns = (hi3i_now() - t0) * 1e9 / RTT_TRIPS;
}

/* The round trip in ns: the mean of RTT_TRIPS trips after one that waits
 * for the worker to come (or of those done in RTT_MAX_S); 0 with one
 * thread. */
static double core_rtt_ns(void)
{
	struct rtt_job j = {0, 0.0};

	if (omp_get_max_threads() < 2)
		return 0.0;
	hi3i_pool_run(rtt_part, &j, 2);
	return j.ns;
}

/* Seconds to read floor_bytes from the n words of a: a over as often as it takes. */
static double floor_pass(const uint64_t *a, size_t n, double floor_bytes)
{
	double t = 0.0, left = floor_bytes;

	for (; left >= 8.0 * (double)n; left -= 8.0 * (double)n)
		t += read_pass(a, n);
	if (left >= 128.0)
		t += read_pass(a, (size_t)(left / 8.0));
	return t;
}

int hi3_bench_model(hi3_model *m, int B, int P, int N, hi3_dtype kv_dtype, double floor_bytes,
                    hi3_bench_model_result *r, hi3_error *err)
{
	const hi3_config *c = hi3_model_config(m);
	const int V = c->vocab_size, C = P + N, nl = c->num_hidden_layers;
	hi3_kvcache *kv = NULL;
	int64_t *ids = NULL, *slot = NULL;
	int32_t *rope = NULL, *hi = NULL, *at = NULL;
	float *logits = NULL;
	uint64_t *buf = NULL;
	size_t fn = 0;
	size_t *first = NULL;     /* the replay: step s's spans are [first[s], first[s + 1]) */
	double *replay_t = NULL;
	double *step_t = NULL, *read_t = NULL, *rtt_t = NULL, *op_t[OP_N] = {NULL}, *other_t = NULL;
	int rc = -1, timing = 0;
	double t0;

	memset(r, 0, sizeof(*r));
	r->threads = omp_get_max_threads();
	kv = hi3_kvcache_for_model(m, B, C, kv_dtype, err);
	ids = hi3i_malloc(sizeof(int64_t) * (size_t)B * P, err);
	slot = hi3i_malloc(sizeof(int64_t) * (size_t)B * P, err);
	rope = hi3i_malloc(sizeof(int32_t) * 2 * (size_t)B * P, err);
	hi = hi3i_malloc(sizeof(int32_t) * (size_t)B * P, err);
	at = hi3i_malloc(sizeof(int32_t) * 2 * (size_t)B, err);
	logits = hi3i_malloc(sizeof(float) * (size_t)B * V, err);
	if (!kv || !ids || !slot || !rope || !hi || !at || !logits)
		goto out;
	for (int b = 0; b < B; b++) {
		for (int t = 0; t < P; t++) {
			size_t i = (size_t)b * P + t;
			ids[i] = (int64_t)((i * 2654435761u + 12345u) % (uint64_t)V);
			slot[i] = t;
			rope[2 * i] = rope[2 * i + 1] = t;
			hi[i] = t;
		}
		at[2 * b] = b;
		at[2 * b + 1] = P - 1;
	}
	{
		hi3_batch pb = {.B = B, .T = P, .mode = HI3_ATTN_SELF, .ids = ids, .rope = rope, .hi = hi,
		                .slot = slot, .n_logits = B, .logit_at = at, .logits = logits};
		/* the first call also maps in (and checks) the weights it reads,
		 * which the model left where they lie at open: timed apart */
		t0 = hi3i_now();
		if (hi3_forward(m, kv, &pb, err) != 0)
			goto out;
		r->first_prefill_s = hi3i_now() - t0;
		t0 = hi3i_now();
		if (hi3_forward(m, kv, &pb, err) != 0)
			goto out;
		r->prefill_s = hi3i_now() - t0;
	}
	if (N > 0) {
		/* each step's time, then its time in each op and in the rest: one block */
		if (!(step_t = hi3i_malloc(sizeof(double) * (2 + OP_N) * (size_t)N, err)))
			goto out;
		for (int o = 0; o < OP_N; o++)
			op_t[o] = step_t + (size_t)(1 + o) * N;
		other_t = step_t + (size_t)(1 + OP_N) * N;
	}
	if (floor_bytes > 0 && N > 0) {
		/* a read of floor_bytes after every step (the buffer read over
		 * as often as it takes): the floor measured beside the steps */
		fn = (size_t)HI3_MIN(floor_bytes, (double)((size_t)1 << 30)) / sizeof(uint64_t);
		buf = read_buffer(fn);
		read_t = hi3i_malloc(sizeof(double) * (size_t)N, err);
		rtt_t = read_t && r->threads > 1 ? hi3i_malloc(sizeof(double) * (size_t)N, err) : NULL;
		if (!buf || !read_t || (r->threads > 1 && !rtt_t)) {
			if (!buf)
				hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory for a %.0f MB read buffer", fn * 8 / 1e6);
			goto out;
		}
	}
	timing = N > 0 && op_clock_start(m->be);
	if (timing && buf) {
		if (!(first = hi3i_malloc(sizeof(size_t) * ((size_t)N + 1), err)) ||
		    !(replay_t = hi3i_malloc(sizeof(double) * (size_t)N, err)))
			goto out;
		replay.on = 1;
	}
	for (int s = 0; s < N; s++) {
		double ts;
		memset(op_clock.t, 0, sizeof(op_clock.t));
		if (first)
			first[s] = replay.n;
		ts = hi3i_now();
		for (int b = 0; b < B; b++) {
			ids[b] = hi3_argmax(logits + (size_t)b * V, V);
			slot[b] = P + s;
			rope[2 * b] = rope[2 * b + 1] = P + s;
			hi[b] = P + s;
			at[2 * b] = b;
			at[2 * b + 1] = 0;
		}
		hi3_batch db = {.B = B, .T = 1, .mode = HI3_ATTN_CACHE, .ids = ids, .rope = rope, .hi = hi,
		                .slot = slot, .n_logits = B, .logit_at = at, .logits = logits};
		if (hi3_forward(m, kv, &db, err) != 0)
			goto out;
		ts = hi3i_now() - ts;
		r->decode_s += ts;
		step_t[s] = ts;
		if (timing) {
			op_t[OP_PRODUCTS][s] = op_clock.t[OP_PRODUCTS];
			op_t[OP_ATTENTION][s] = op_clock.t[OP_ATTENTION];
			other_t[s] = ts - op_clock.t[OP_PRODUCTS] - op_clock.t[OP_ATTENTION];
		}
		if (buf)
			read_t[s] = floor_pass(buf, fn, floor_bytes);
		if (rtt_t)
			rtt_t[s] = core_rtt_ns();
	}
	if (first && replay.on) {
		/* the steps' weights again, in turn, with the floor's read
		 * between (its times not kept: the floor is the one beside the
		 * steps) */
		double total = 0.0;
		replay.on = 0;
		first[N] = replay.n;
		for (int s = 0; s < N; s++) {
			replay_t[s] = replay_pass(replay.s + first[s], first[s + 1] - first[s]);
			floor_pass(buf, fn, floor_bytes);
		}
		for (size_t i = 0; i < replay.n; i++)
			total += (double)replay.s[i].n;
		r->replay_median_s = median(replay_t, N);
		r->replay_bytes = total / N;
	}
	if (N > 0)
		r->step_median_s = median(step_t, N);
	if (buf)
		r->floor_median_s = median(read_t, N);
	if (rtt_t) {
		for (int s = 0; s < N; s++)
			r->rtt_max_ns = HI3_MAX(r->rtt_max_ns, rtt_t[s]);
		r->rtt_median_ns = median(rtt_t, N);
	}
	if (timing) {
		r->op_times = 1;
		r->products_median_s = median(op_t[OP_PRODUCTS], N);
		r->attention_median_s = median(op_t[OP_ATTENTION], N);
		r->other_median_s = median(other_t, N);
	}
	r->prefill_tok_s = (double)B * P / r->prefill_s;
	r->decode_tok_s = N ? (double)B * N / r->decode_s : 0.0;
	{
		/* model FLOPs of the prefill: 2 per weight per token for the
		 * active weights, plus causal attention */
		double H = c->hidden_size, d = c->attention_head_dim, nh = c->num_attention_heads;
		double per_tok = 0.0;
		for (int l = 0; l < nl; l++) {
			per_tok += 2.0 * ((nh + 2.0 * c->num_key_value_heads) * d * H + H * nh * d);
			if (hi3_config_is_moe_layer(c, l)) {
				double inter = c->moe_intermediate_size[l];
				per_tok += 2.0 * c->num_experts[l] * H + 2.0 * c->moe_topk[l] * 3.0 * H * inter;
				if (c->use_mixed_mlp_moe)
					per_tok += 2.0 * c->num_shared_expert[l] * 3.0 * H * inter;
			} else {
				per_tok += 2.0 * 3.0 * H * c->intermediate_size;
			}
		}
		r->prefill_flops = (double)B * P * per_tok + nl * 2.0 * nh * d * (double)P * P * B +
		                   2.0 * B * V * H;
	}
	r->weights_known = hi3_model_pages(m, &r->weights_resident, &r->weights_huge);
	rc = 0;
out:
	if (timing)
		op_clock_stop(m->be);
	hi3_model_drop_cache(m, kv);
	hi3_kvcache_free(kv);
	free(ids);
	free(slot);
	free(rope);
	free(hi);
	free(at);
	free(logits);
	free(buf);
	free(step_t);
	free(read_t);
	free(rtt_t);
	free(first);
	free(replay_t);
	free(replay.s);
	memset(&replay, 0, sizeof(replay));
	return rc;
}
