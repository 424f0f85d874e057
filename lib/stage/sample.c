/*
 * sample.c -- batch-invariant sampling (hi3-batching(7), SAMPLING).
 *
 * The random draw for a row at step s depends only on (seed, s): it is
 * hi3_uniform(seed, s) (core/philox.c), so a row samples the same token
 * alone or in any batch, on any backend. The recorded log-prob of a token
 * is log-softmax of the unmodified logits at temperature 1 (hi3_logprob),
 * the quantity a teacher-forced replay recomputes.
 *
 * The sampler, in order: temperature, top-k, top-p, draw:
 *   z = logits / T; sort candidates by z descending, ties to the lower id;
 *   keep the first k (k > 0); p = softmax(z) over the kept candidates;
 *   keep the smallest prefix whose mass reaches top_p (at least one);
 *   draw u in [0, 1) and take the first candidate whose cumulative mass
 *   (over the kept prefix, renormalised) exceeds u.
 * Sums run in double, in candidate order, except the two that run over
 * the whole vocabulary: the log-softmax's sum of exp and, with top-k off,
 * the sampler's total mass. Those are fixed-point integer sums
 * (hi3i_fsum): each term rounded to a multiple of 2^-63, then added
 * exactly, so any split of the vocabulary summed in any order gives the
 * same bits, and ranks that each hold a slice of the logits
 * (stage/vocab.c) agree with one process to the bit.
 */
#include <math.h>
#include <string.h>
#include "core/internal.h"
#include "stage/vocab.h"

void hi3_gen_defaults_sampler(const hi3_gen_defaults *g, hi3_sampler *s)
{
	s->greedy = !g->do_sample || g->temperature <= 0;
	s->temperature = g->temperature > 0 ? g->temperature : 1.0;
	s->top_k = g->top_k;
	s->top_p = g->top_p;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* hi3_argmax for logits[0] not NaN, eight lanes at a time: each lane's
 * largest value by the scan's comparison (NaN never greater), their
 * largest, then the first id holding it (== takes -0 for +0 as the scan's
 * > does, so the scan's lower id of a tie). */
__attribute__((target("avx2"))) static int64_t argmax_avx2(const float *x, int V)
{
	__m256 m = _mm256_set1_ps(x[0]), vm;
	float lane[8], mx;
	int v = 0;

	for (; v + 8 <= V; v += 8) {
		const __m256 a = _mm256_loadu_ps(x + v);
		m = _mm256_blendv_ps(m, a, _mm256_cmp_ps(a, m, _CMP_GT_OQ));
	}
	_mm256_storeu_ps(lane, m);
	mx = lane[0];
	for (int i = 1; i < 8; i++)
		if (lane[i] > mx)
			mx = lane[i];
	for (; v < V; v++)
		if (x[v] > mx)
			mx = x[v];
	vm = _mm256_set1_ps(mx);
	for (v = 0; v + 8 <= V; v += 8) {
		const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + v), vm, _CMP_EQ_OQ));
		if (hit)
			return v + __builtin_ctz((unsigned)hit);
	}
	for (; v < V; v++)
		if (x[v] == mx)
			break;
	return v;
}
#endif

int64_t hi3_argmax(const float *logits, int V)
{
	int64_t best = 0;

	/* nothing is greater than a NaN at id 0: the scan below answers 0 */
#if defined(__x86_64__) && defined(__GNUC__)
	if (V > 1 && !isnan(logits[0]) && __builtin_cpu_supports("avx2"))
		return argmax_avx2(logits, V);
#endif
	for (int v = 1; v < V; v++)
		if (logits[v] > logits[best])     /* ties keep the lower id */
			best = v;
	return best;
}

/* ------------------------------------------------- exact sums of exp */

void hi3i_fsum_add(hi3i_fsum *s, double p)
{
	uint64_t q;

	if (!(p >= 0.0 && p <= 1.0)) {
		s->nan = 1;               /* NaN (a NaN logit, or an infinite maximum) */
		return;
	}
	q = (uint64_t)(p * 9223372036854775808.0 + 0.5);      /* p 2^63, rounded: at most 2^63 */
	s->lo += q;
	s->hi += s->lo < q;
}

void hi3i_fsum_merge(hi3i_fsum *s, const hi3i_fsum *o)
{
	s->lo += o->lo;
	s->hi += o->hi + (s->lo < o->lo);
	s->nan |= o->nan;
}

double hi3i_fsum_value(const hi3i_fsum *s)
{
	if (s->nan)
		return NAN;
	return ((double)s->hi * 18446744073709551616.0 + (double)s->lo) * (1.0 / 9223372036854775808.0);
}

float hi3i_vmax(const float *x, int n)
{
	float mx = -INFINITY;

	for (int v = 0; v < n; v++)
		if (x[v] > mx)            /* NaN never */
			mx = x[v];
	return mx;
}

void hi3i_expsum(hi3i_fsum *s, const float *x, int n, float mx)
{
	for (int v = 0; v < n; v++)
		hi3i_fsum_add(s, exp((double)x[v] - (double)mx));
}

double hi3i_logprob_of(double x_tok, float mx, const hi3i_fsum *s)
{
	double sum = hi3i_fsum_value(s);

	if (isnan(sum))
		return NAN;
	return x_tok - (double)mx - log(sum);
}

double hi3_logprob(const float *logits, int V, int64_t tok)
{
	hi3i_fsum s = {0};
	float mx = hi3i_vmax(logits, V);

	hi3i_expsum(&s, logits, V, mx);
	return hi3i_logprob_of(logits[tok], mx, &s);
}


int hi3i_cand_cmp(const void *a, const void *b)
{
	const struct hi3i_cand *x = a, *y = b;

	if (x->z != y->z)
		return x->z > y->z ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

/* Keep the k best candidates at the front of c (sorted); returns k. */
int hi3i_top_k_select(struct hi3i_cand *c, int V, int k)
{
	if (k <= 0 || k >= V) {
		qsort(c, (size_t)V, sizeof(*c), hi3i_cand_cmp);
		return V;
	}
	/* A min-heap of the best k by (z desc, id asc), then sort it. */
	for (int i = 0; i < k; i++) {
		int j = i;
		while (j > 0 && hi3i_cand_cmp(&c[(j - 1) / 2], &c[j]) < 0) {   /* parent better than child: swap */
			struct hi3i_cand t = c[j];
			c[j] = c[(j - 1) / 2];
			c[(j - 1) / 2] = t;
			j = (j - 1) / 2;
		}
	}
	for (int i = k; i < V; i++) {
		if (hi3i_cand_cmp(&c[i], &c[0]) >= 0)
			continue;                       /* not better than the worst kept */
		c[0] = c[i];
		for (int j = 0;;) {
			int l = 2 * j + 1, r = l + 1, w = j;
			if (l < k && hi3i_cand_cmp(&c[l], &c[w]) > 0)
				w = l;
			if (r < k && hi3i_cand_cmp(&c[r], &c[w]) > 0)
				w = r;
			if (w == j)
				break;
			struct hi3i_cand t = c[j];
			c[j] = c[w];
			c[w] = t;
			j = w;
		}
	}
	qsort(c, (size_t)k, sizeof(*c), hi3i_cand_cmp);
	return k;
}

int64_t hi3i_sample_walk(const struct hi3i_cand *c, int avail, int n_all, double total, const hi3_sampler *s, double u)
{
	const double z0 = (double)c[0].z;
	double acc, target;
	int n = n_all;

	if (s->top_p > 0.0 && s->top_p < 1.0) {
		double mass = 0.0;
		int keep = -1;
		for (int i = 0; i < avail; i++) {
			mass += exp((double)c[i].z - z0) / total;
			if (mass >= s->top_p) {
				keep = i + 1;
				break;
			}
		}
		if (keep < 0 && avail < n_all)
			return -1;
		n = keep < 0 ? n_all : keep;
		total = 0.0;
		for (int i = 0; i < n; i++)
			total += exp((double)c[i].z - z0);
	}
	target = u * total;
	acc = 0.0;
	for (int i = 0; i < n && i < avail; i++) {
		acc += exp((double)c[i].z - z0);
		if (acc > target)
			return c[i].id;
	}
	return n > avail ? -1 : c[n - 1].id;
}

int64_t hi3_sample(const float *logits, int V, const hi3_sampler *s, uint64_t seed, uint64_t step,
                   void *scratch)
{
	struct hi3i_cand *c = scratch;
	double total = 0.0;
	int n;

	if (s->greedy || s->temperature <= 0.0)
		return hi3_argmax(logits, V);
	for (int v = 0; v < V; v++) {
		c[v].z = (float)((double)logits[v] / s->temperature);
		c[v].id = v;
	}
	n = hi3i_top_k_select(c, V, s->top_k);
	if (n < V) {
		for (int i = 0; i < n; i++)
			total += exp((double)c[i].z - (double)c[0].z);
	} else {
		/* the whole vocabulary: the exact sum, which ranks holding
		 * slices of it reproduce (stage/vocab.c) */
		hi3i_fsum fs = {0};
		for (int i = 0; i < n; i++)
			hi3i_fsum_add(&fs, exp((double)c[i].z - (double)c[0].z));
		total = hi3i_fsum_value(&fs);
	}
	return hi3i_sample_walk(c, n, n, total, s, hi3_uniform(seed, step));
}

size_t hi3_sample_scratch_size(int V)
{
	return (size_t)V * (sizeof(struct hi3i_cand) + sizeof(double));
}
