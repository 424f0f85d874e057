/*
 * sample.c -- batch-invariant sampling (hi3-batching(7), SAMPLING).
 *
 * The random draw for a row at step s depends only on (seed, s): it is the
 * first output word pair of Philox-4x32-10 with key = seed and counter =
 * (s, 0), so a row samples the same token alone or in any batch, on any
 * backend. The recorded log-prob of a token is log-softmax of the
 * unmodified logits at temperature 1 (hi3_logprob), the quantity a
 * teacher-forced replay recomputes.
 *
 * The sampler, in order: temperature, top-k, top-p, draw:
 *   z = logits / T; sort candidates by z descending, ties to the lower id;
 *   keep the first k (k > 0); p = softmax(z) over the kept candidates;
 *   keep the smallest prefix whose mass reaches top_p (at least one);
 *   draw u in [0, 1) and take the first candidate whose cumulative mass
 *   (over the kept prefix, renormalised) exceeds u.
 * Sums run in double, in candidate order.
 */
#include <math.h>
#include <string.h>
#include "core/internal.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void hi3_philox4x32(uint32_t ctr[4], const uint32_t key_in[2])
{
	uint32_t k0 = key_in[0], k1 = key_in[1];

	for (int r = 0; r < 10; r++) {
		uint64_t p0 = (uint64_t)PHILOX_M0 * ctr[0], p1 = (uint64_t)PHILOX_M1 * ctr[2];
		uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
		uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
		uint32_t n0 = hi1 ^ ctr[1] ^ k0, n2 = hi0 ^ ctr[3] ^ k1;

		ctr[0] = n0;
		ctr[1] = lo1;
		ctr[2] = n2;
		ctr[3] = lo0;
		k0 += PHILOX_W0;
		k1 += PHILOX_W1;
	}
}

double hi3_uniform(uint64_t seed, uint64_t step)
{
	uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
	uint32_t c[4] = {(uint32_t)step, (uint32_t)(step >> 32), 0, 0};

	hi3_philox4x32(c, key);
	/* 53 random bits: u in [0, 1) */
	return (double)(((uint64_t)c[0] << 21) ^ (c[1] >> 11)) * (1.0 / 9007199254740992.0);
}

int64_t hi3_argmax(const float *logits, int V)
{
	int64_t best = 0;

	for (int v = 1; v < V; v++)
		if (logits[v] > logits[best])     /* ties keep the lower id */
			best = v;
	return best;
}

double hi3_logprob(const float *logits, int V, int64_t tok)
{
	float mx = logits[0];
	double sum = 0.0;

	for (int v = 1; v < V; v++)
		if (logits[v] > mx)
			mx = logits[v];
	for (int v = 0; v < V; v++)
		sum += exp((double)logits[v] - (double)mx);
	return (double)logits[tok] - (double)mx - log(sum);
}

struct cand {
	float z;
	int32_t id;
};

static int cand_cmp(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;

	if (x->z != y->z)
		return x->z > y->z ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

/* Keep the k best candidates at the front of c (sorted); returns k. */
static int top_k_select(struct cand *c, int V, int k)
{
	if (k <= 0 || k >= V) {
		qsort(c, (size_t)V, sizeof(*c), cand_cmp);
		return V;
	}
	/* A min-heap of the best k by (z desc, id asc), then sort it. */
	for (int i = 0; i < k; i++) {
		int j = i;
		while (j > 0 && cand_cmp(&c[(j - 1) / 2], &c[j]) < 0) {   /* parent better than child: swap */
			struct cand t = c[j];
			c[j] = c[(j - 1) / 2];
			c[(j - 1) / 2] = t;
			j = (j - 1) / 2;
		}
	}
	for (int i = k; i < V; i++) {
		if (cand_cmp(&c[i], &c[0]) >= 0)
			continue;                       /* not better than the worst kept */
		c[0] = c[i];
		for (int j = 0;;) {
			int l = 2 * j + 1, r = l + 1, w = j;
			if (l < k && cand_cmp(&c[l], &c[w]) > 0)
				w = l;
			if (r < k && cand_cmp(&c[r], &c[w]) > 0)
				w = r;
			if (w == j)
				break;
			struct cand t = c[j];
			c[j] = c[w];
			c[w] = t;
			j = w;
		}
	}
	qsort(c, (size_t)k, sizeof(*c), cand_cmp);
	return k;
}

int64_t hi3_sample(const float *logits, int V, const hi3_sampler *s, uint64_t seed, uint64_t step,
                   void *scratch)
{
	struct cand *c = scratch;
	double *p, total = 0.0, acc, u;
	int n;

	if (s->greedy || s->temperature <= 0.0)
		return hi3_argmax(logits, V);
	for (int v = 0; v < V; v++) {
		c[v].z = (float)((double)logits[v] / s->temperature);
		c[v].id = v;
	}
	n = top_k_select(c, V, s->top_k);
	p = (double *)(c + V);
	for (int i = 0; i < n; i++) {
		p[i] = exp((double)c[i].z - (double)c[0].z);
		total += p[i];
	}
	if (s->top_p > 0.0 && s->top_p < 1.0) {
		double mass = 0.0;
		int keep = n;
		for (int i = 0; i < n; i++) {
			mass += p[i] / total;
			if (mass >= s->top_p) {
				keep = i + 1;
				break;
			}
		}
		n = keep;
		total = 0.0;
		for (int i = 0; i < n; i++)
			total += p[i];
	}
	u = hi3_uniform(seed, step) * total;
	acc = 0.0;
	for (int i = 0; i < n; i++) {
		acc += p[i];
		if (acc > u)
			return c[i].id;
	}
	return c[n - 1].id;
}

size_t hi3_sample_scratch_size(int V)
{
	return (size_t)V * (sizeof(struct cand) + sizeof(double));
}
