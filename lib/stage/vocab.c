/*
 * vocab.c -- argmax, sampling and log-softmax over logits split on the
 * vocabulary (vocab.h, hi3-parallel(7), "lm_head").
 *
 * Each tensor slot holds the columns [v0, v0 + nv) of every row. Per call
 * (all rows at once), two all-gathers of a few values per row:
 *
 *   1. each slot's maximum of its slice, the logit of a given token it
 *      owns, and its candidates: the argmax (greedy) or its top-k by
 *      (z desc, id asc) (sampling with 0 < k < V). The global argmax is the
 *      best of the slots' (ties to the lower id, NaN as hi3_argmax has
 *      it), the global top-k the best k of the slots' top-k: both exact,
 *      so hi3i_sample_walk sees the candidates hi3_sample sees.
 *   2. each slot's exact sum of exp(x - max) (hi3i_fsum) over its slice
 *      and the chosen token's logit: hi3_logprob's terms, added exactly.
 *
 * Sampling over the whole vocabulary (top-k off) needs the candidates in
 * order up to where top-p or the draw stops: the total mass is one more
 * exact sum, then the slots send their best 256 candidates, 1024, ... until
 * the walk ends inside what is known, so what crosses ranks grows with
 * the prefix the draw walks (up to V when it lands deep in the tail).
 *
 * Shapes: n rows, K candidates per slot and row, tp slots (ranks 0 .. tp-1;
 * the ranks beyond hold copies and their records are ignored).
 */
#include <math.h>
#include <string.h>
#include "model/model.h"
#include "stage/vocab.h"

struct head {
	float xmax;               /* the slice's maximum, NaN skipped */
	int32_t nan0;             /* the slice holds token 0 and it is NaN (hi3_argmax then answers 0) */
	float xtok;               /* row[tok] when the slice holds the given token */
	int32_t has;
};

struct tail {
	hi3i_fsum fs;             /* sum of exp(x - max) over the slice */
	float xtok;               /* row[tok] when the slice holds the chosen token */
	int32_t has;
};

/* all (size, bytes) = every rank's mine (bytes), in rank order. */
static void *exchange(const hi3i_vocab *vs, const void *mine, size_t bytes, hi3_error *err)
{
	void *all = hi3i_malloc(bytes * (size_t)vs->comm->size + 1, err);

	if (all && hi3_comm_allgather(vs->comm, mine, bytes, all, err) != 0) {
		free(all);
		return NULL;
	}
	return all;
}

/* The slice's argmax as hi3_argmax scans: NaN skipped, ties to the lower id; id -1 when all NaN. */
static struct hi3i_cand slice_argmax(const float *x, int v0, int nv)
{
	struct hi3i_cand best = {0.0f, -1};

	for (int v = 0; v < nv; v++)
		if (!isnan(x[v]) && (best.id < 0 || x[v] > best.z))
			best = (struct hi3i_cand){x[v], v0 + v};
	return best;
}

/* c (nv) = the slice's candidates z = x / T, their best k in order at the front; returns how many. */
static int slice_candidates(const float *x, int v0, int nv, double temperature, int k, struct hi3i_cand *c)
{
	for (int v = 0; v < nv; v++) {
		c[v].z = (float)((double)x[v] / temperature);
		c[v].id = v0 + v;
	}
	return nv ? hi3i_top_k_select(c, nv, k > nv ? nv : k) : 0;
}

/* merged (tp K) = the slots' candidates (K each, id -1 padding) in order; returns how many. */
static int merge_candidates(const char *all, size_t stride, size_t off, int tp, int K, struct hi3i_cand *merged)
{
	int n = 0;

	for (int r = 0; r < tp; r++) {
		const struct hi3i_cand *c = (const struct hi3i_cand *)(const void *)(all + (size_t)r * stride + off);
		for (int j = 0; j < K && c[j].id >= 0; j++)
			merged[n++] = c[j];
	}
	qsort(merged, (size_t)n, sizeof(*merged), hi3i_cand_cmp);
	return n;
}

/* Sampling over the whole vocabulary: the exact total mass, then the
 * candidates in order until hi3i_sample_walk ends inside them. z0: the
 * best candidate's z; local (nv) scratch. */
static int sample_full(const hi3i_vocab *vs, const float *row, const hi3_sampler *s, uint64_t seed, uint64_t step,
                       float z0, struct hi3i_cand *local, int64_t *tok, hi3_error *err)
{
	const int tp = vs->tp;
	hi3i_fsum fs = {0}, *fall;
	struct hi3i_cand *send = NULL, *recv = NULL, *merged = NULL;
	double total, u = hi3_uniform(seed, step);
	int max_nv = 0, rc = -1;

	for (int r = 0; r < tp; r++) {
		int lo, n;
		hi3i_split(vs->V, tp, r, &lo, &n);
		max_nv = HI3_MAX(max_nv, n);
	}
	slice_candidates(row + vs->v0, vs->v0, vs->nv, s->temperature, vs->nv, local);   /* all of them, in order */
	for (int v = 0; v < vs->nv; v++)
		hi3i_fsum_add(&fs, exp((double)local[v].z - (double)z0));
	if (!(fall = exchange(vs, &fs, sizeof(fs), err)))
		return -1;
	fs = fall[0];
	for (int r = 1; r < tp; r++)
		hi3i_fsum_merge(&fs, &fall[r]);
	free(fall);
	total = hi3i_fsum_value(&fs);
	for (int K = 256;; K *= 4) {
		int complete = K >= max_nv, n;
		K = HI3_MIN(K, max_nv);
		free(send);
		free(recv);
		free(merged);
		send = hi3i_malloc(sizeof(*send) * (size_t)K + 1, err);
		merged = hi3i_malloc(sizeof(*merged) * (size_t)K * tp + 1, err);
		if (!send || !merged)
			goto out;
		for (int j = 0; j < K; j++)
			send[j] = j < vs->nv ? local[j] : (struct hi3i_cand){0.0f, -1};
		if (!(recv = exchange(vs, send, sizeof(*send) * (size_t)K, err)))
			goto out;
		n = merge_candidates((const char *)recv, sizeof(*send) * (size_t)K, 0, tp, K, merged);
		/* the first K in order are the whole vocabulary's first K; all of it once every slice is in */
		*tok = hi3i_sample_walk(merged, complete ? n : HI3_MIN(K, n), vs->V, total, s, u);
		if (*tok >= 0 || complete)
			break;
	}
	rc = *tok >= 0 ? 0 : hi3_error_set(err, HI3_ERR_RUNTIME, "sampling: no token drawn from %d candidates", vs->V);
out:
	free(send);
	free(recv);
	free(merged);
	return rc;
}

int hi3i_vocab_next(const hi3i_vocab *vs, const float *const *rows, int n, const hi3_sampler *s,
                    const uint64_t *seed, const uint64_t *step, int64_t *tok, float *lp, void *scratch,
                    hi3_error *err)
{
	const int V = vs->V, v0 = vs->v0, nv = vs->nv;
	const int greedy = !s || s->greedy || s->temperature <= 0.0;
	const int top_k = !greedy && s->top_k > 0 && s->top_k < V;
	int choose = 0, K;
	size_t rec;
	char *mine = NULL, *all = NULL;
	struct tail *mine2 = NULL, *all2 = NULL;
	struct hi3i_cand *local = NULL, *merged = NULL;
	float *mx = NULL;
	void *own = NULL;
	int rc = -1;

	for (int i = 0; i < n; i++)
		choose |= tok[i] < 0;
	if (!vs->comm) {
		/* every column here: the reference functions themselves */
		if (choose && !greedy && !scratch && !(scratch = own = hi3i_malloc(hi3_sample_scratch_size(V), err)))
			return -1;
		for (int i = 0; i < n; i++) {
			if (tok[i] < 0)
				tok[i] = hi3_sample(rows[i], V, s, seed[i], step[i], scratch);
			lp[i] = (float)hi3_logprob(rows[i], V, tok[i]);
		}
		free(own);
		return 0;
	}
	/* 1: maxima, given tokens' logits, candidates */
	K = !choose ? 0 : top_k ? s->top_k : 1;
	rec = sizeof(struct head) + sizeof(struct hi3i_cand) * (size_t)K;
	mine = hi3i_calloc((size_t)n + 1, rec, err);
	mx = hi3i_malloc(sizeof(float) * (size_t)n + 1, err);
	mine2 = hi3i_calloc((size_t)n + 1, sizeof(*mine2), err);
	local = hi3i_malloc(sizeof(*local) * (size_t)nv + 1, err);
	merged = hi3i_malloc(sizeof(*merged) * (size_t)K * vs->tp + 1, err);
	if (!mine || !mx || !mine2 || !local || !merged)
		goto out;
	for (int i = 0; i < n; i++) {
		const float *x = rows[i] + v0;
		struct head *h = (struct head *)(void *)(mine + (size_t)i * rec);
		struct hi3i_cand *c = (struct hi3i_cand *)(h + 1);
		h->xmax = hi3i_vmax(x, nv);
		h->nan0 = v0 == 0 && nv > 0 && isnan(x[0]);
		h->has = tok[i] >= v0 && tok[i] < v0 + nv;
		h->xtok = h->has ? rows[i][tok[i]] : 0.0f;
		for (int j = 0; j < K; j++)
			c[j].id = -1;
		if (tok[i] >= 0 || !K)
			continue;
		if (greedy) {
			c[0] = slice_argmax(x, v0, nv);
		} else {
			int m = slice_candidates(x, v0, nv, s->temperature, K, local);
			memcpy(c, local, sizeof(*c) * (size_t)HI3_MIN(m, K));
		}
	}
	if (!(all = exchange(vs, mine, rec * (size_t)n, err)))
		goto out;
	for (int i = 0; i < n; i++) {
		const size_t row = rec * (size_t)n, off = rec * (size_t)i;
		const struct head *h0 = (const struct head *)(const void *)(all + off);
		float m = -INFINITY;
		for (int r = 0; r < vs->tp; r++) {
			const struct head *h = (const struct head *)(const void *)(all + (size_t)r * row + off);
			m = h->xmax > m ? h->xmax : m;
		}
		mx[i] = m;
		if (tok[i] >= 0)
			continue;
		if (greedy) {
			struct hi3i_cand best = {0.0f, -1};
			for (int r = 0; r < vs->tp; r++) {
				const struct hi3i_cand *c = (const struct hi3i_cand *)(const void *)
				                            (all + (size_t)r * row + off + sizeof(struct head));
				if (c->id >= 0 && (best.id < 0 || c->z > best.z))
					best = *c;
			}
			tok[i] = h0->nan0 || best.id < 0 ? 0 : best.id;
		} else {
			int cnt = merge_candidates(all + off + sizeof(struct head), row, 0, vs->tp, K, merged);
			if (top_k) {
				double total = 0.0;
				cnt = HI3_MIN(cnt, K);
				for (int j = 0; j < cnt; j++)
					total += exp((double)merged[j].z - (double)merged[0].z);
				tok[i] = hi3i_sample_walk(merged, cnt, cnt, total, s, hi3_uniform(seed[i], step[i]));
			} else if (sample_full(vs, rows[i], s, seed[i], step[i], cnt ? merged[0].z : -INFINITY, local,
			                       &tok[i], err) != 0) {
				goto out;
			}
		}
	}
	/* 2: exact sums of exp, the chosen tokens' logits */
	for (int i = 0; i < n; i++) {
		hi3i_expsum(&mine2[i].fs, rows[i] + v0, nv, mx[i]);
		mine2[i].has = tok[i] >= v0 && tok[i] < v0 + nv;
		mine2[i].xtok = mine2[i].has ? rows[i][tok[i]] : 0.0f;
	}
	if (!(all2 = exchange(vs, mine2, sizeof(*mine2) * (size_t)n, err)))
		goto out;
	for (int i = 0; i < n; i++) {
		hi3i_fsum fs = {0};
		float xtok = NAN;
		for (int r = 0; r < vs->tp; r++) {
			const struct tail *t = &all2[(size_t)r * n + i];
			hi3i_fsum_merge(&fs, &t->fs);
			if (t->has)
				xtok = t->xtok;
		}
		lp[i] = (float)hi3i_logprob_of((double)xtok, mx[i], &fs);
	}
	rc = 0;
out:
	free(mine);
	free(all);
	free(mine2);
	free(all2);
	free(local);
	free(merged);
	free(mx);
	return rc;
}

int hi3i_vocab_pick(const hi3i_vocab *vs, const float *row, const int64_t *id, int n, float *val, hi3_error *err)
{
	float *mine, *all;

	if (!vs->comm) {
		for (int j = 0; j < n; j++)
			val[j] = row[id[j]];
		return 0;
	}
	if (!(mine = hi3i_malloc(sizeof(float) * (size_t)n + 1, err)))
		return -1;
	for (int j = 0; j < n; j++)
		mine[j] = id[j] >= vs->v0 && id[j] < vs->v0 + vs->nv ? row[id[j]] : 0.0f;
	all = exchange(vs, mine, sizeof(float) * (size_t)n, err);
	free(mine);
	if (!all)
		return -1;
	for (int j = 0; j < n; j++)
		for (int r = 0; r < vs->tp; r++) {
			int lo, cnt;
			hi3i_split(vs->V, vs->tp, r, &lo, &cnt);
			if (id[j] >= lo && id[j] < lo + cnt)
				val[j] = all[(size_t)r * n + j];
		}
	free(all);
	return 0;
}

void hi3i_model_vocab(const hi3_model *m, hi3i_vocab *vs)
{
	const struct hi3_shard *s = &m->sh;

	memset(vs, 0, sizeof(*vs));
	vs->V = m->cfg.vocab_size;
	vs->tp = s->tp;
	hi3i_split(vs->V, s->tp, s->t, &vs->v0, &vs->nv);
	if (s->tp > 1)
		vs->comm = s->par->comm;
}
