/*
 * decode.c -- decode over a KV file made by prefill: the batching contract
 * of hi3-batching(7), with one code path for every B.
 *
 * Each step samples every unfinished row from its current logits,
 * then feeds the new tokens of the rows that go on, one per row, at index
 * p = n_i + g (rules 3, 4): K/V are written at slot p and the query attends
 * slots [0, p]. A row that samples a stop token or reaches max_new stops:
 * it is not fed, written or computed again (rule 7).
 *
 * Rows may carry the decoding rules of the Instruct code's text stage
 * (conditions forced_after and greedy_among, hi3-files(5)): a token forced
 * by a stage transition, or the ratio token chosen greedily among its set.
 * The recorded log-prob is always that of the unmodified logits.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "format/conditions.h"
#include "stage/files.h"
#include "format/trace.h"
#include "model/model.h"
#include "stage/vocab.h"

static int is_stop(const hi3_cond *c, const hi3_decode_opts *o, int row, int64_t tok)
{
	if (o->have_stop) {
		for (int j = 0; j < o->n_stop; j++)
			if (o->stop[j] == tok)
				return 1;
		return 0;
	}
	for (int j = 0; j < c->NS; j++)
		if (c->stop_tokens[(size_t)row * c->NS + j] == tok)
			return 1;
	return 0;
}

/* ------------------------------------------------- decoding rules */

/* Where a row stands in its forced_after records (upstream's
 * _StageTransitionLogitsProcessor): the record whose tokens are being
 * forced and how many of them are out, and which records have fired. */
struct rule_state {
	int rec;                  /* offset of the pending record in the row's list; -1: none */
	int pos;                  /* forced tokens of it already produced */
	uint64_t fired;           /* bit r: record r has fired (at most 64 records a row) */
};

/* The offset of the first record in list (n entries) whose trigger is
 * tok, and its number; -1 when none. */
static int find_rule(const int64_t *list, int n, int64_t tok, int *index)
{
	int k = 0, r = 0;

	while (k < n && list[k] != -1) {
		if (list[k] == tok) {
			*index = r;
			return k;
		}
		k += 2 + (int)list[k + 1];
		r++;
	}
	return -1;
}

/* The state after the row produced tok (upstream: the pending head is
 * consumed; with nothing pending, a trigger not fired yet starts its
 * record). */
static void rule_step(struct rule_state *st, const int64_t *list, int n, int64_t tok)
{
	int k, r;

	if (!list)
		return;
	if (st->rec >= 0) {
		/* a forced token out; the last one may itself be a trigger */
		if (++st->pos < list[st->rec + 1])
			return;
		st->rec = -1;
	}
	k = find_rule(list, n, tok, &r);
	if (k >= 0 && r < 64 && !(st->fired & (1ULL << r))) {
		st->fired |= 1ULL << r;
		st->rec = k;
		st->pos = 0;
	}
}

/* The token of row i decided by its rules, or -1 when it is to be sampled:
 * forced by a stage transition, or the greedy choice among a set after a
 * trigger (the set's logits picked from the vocabulary slices, vs). last
 * is the token the row produced last (its last prompt token at first). */
static int ruled_token(const hi3_cond *c, int i, const struct rule_state *st, int64_t last, const float *logits,
                       const hi3i_vocab *vs, int64_t *tok, hi3_error *err)
{
	const int64_t *forced = c->forced_after ? c->forced_after + (size_t)i * c->NF : NULL;
	const int64_t *greedy = c->greedy_among ? c->greedy_among + (size_t)i * c->NG : NULL;
	int k, r;

	*tok = -1;
	if (forced && st->rec >= 0) {
		*tok = forced[st->rec + 2 + st->pos];
		return 0;
	}
	if (greedy && (k = find_rule(greedy, c->NG, last, &r)) >= 0) {
		const int n = (int)greedy[k + 1];
		const int64_t *set = greedy + k + 2;
		int64_t best = -1, ids[64];
		float val[64], best_v = 0.0f;
		for (int j0 = 0; j0 < n; j0 += 64) {
			int m = 0;
			for (int j = j0; j < n && j < j0 + 64; j++)
				if (set[j] < vs->V)
					ids[m++] = set[j];
			if (hi3i_vocab_pick(vs, logits, ids, m, val, err) != 0)
				return -1;
			for (int j = 0; j < m; j++)
				if (best < 0 || val[j] > best_v || (val[j] == best_v && ids[j] < best)) {
					best = ids[j];
					best_v = val[j];
				}
		}
		*tok = best;
	}
	return 0;
}

static int write_segment(const hi3_kvfile *kv, const hi3_cond *c, const hi3_model *m, const hi3_decode_opts *o,
                         const char *path, int64_t *total, hi3_error *err)
{
	const int B = kv->B, G = kv->G;
	const size_t per = (size_t)kv->n_moe * kv->k_route;
	struct hi3i_segbuf sb;
	char buf[128], hash[17];
	int rc = -1;

	if (hi3i_segbuf_init(&sb, B, kv->gen_len, o->record_routing ? kv->n_moe : 0, kv->k_route, err) != 0)
		return -1;
	for (int i = 0; i < B; i++) {
		int64_t g = kv->gen_len[i], off = sb.cu_seqlens[i];
		memcpy(sb.tokens + off, kv->gen_tokens + (size_t)i * G, sizeof(int64_t) * (size_t)g);
		memcpy(sb.logprobs + off, kv->gen_logprobs + (size_t)i * G, sizeof(float) * (size_t)g);
		if (sb.route_ids) {
			memcpy(sb.route_ids + off * per, kv->gen_route_ids + (size_t)i * G * per, sizeof(int16_t) * (size_t)g * per);
			memcpy(sb.route_w + off * per, kv->gen_route_w + (size_t)i * G * per, sizeof(float) * (size_t)g * per);
		}
		sb.stop_reason[i] = !kv->finished[i] ? 0 : (g > 0 && is_stop(c, o, i, sb.tokens[off + g - 1])) ? 1 : 2;
	}
	hi3i_cond_hash(c, hash);
	if (o->sampler.greedy || o->sampler.temperature <= 0)
		snprintf(buf, sizeof(buf), "greedy");
	else
		snprintf(buf, sizeof(buf), "temperature=%.17g top_k=%d top_p=%.17g", o->sampler.temperature,
		         o->sampler.top_k, o->sampler.top_p);
	sb.s.model_fingerprint = hi3_model_fingerprint(m);
	sb.s.conditions_hash = hash;
	sb.s.sampler = buf;
	sb.s.decode_mask = o->decode_mask == HI3_MASK_NONE ? "none" : "causal";
	sb.s.token_placement = o->placement == HI3_PLACE_TAIL ? "tail" : "index";
	/* rank 0 alone writes the segment of a layout (path NULL on the others) */
	if (path && hi3_segment_write(&sb.s, path, err) != 0)
		goto out;
	*total = sb.s.T;
	rc = 0;
out:
	hi3i_segbuf_release(&sb);
	return rc;
}

/* One call of hi3_decode: its inputs, the KV file, and the buffers of a
 * step (one entry per row of the batch, B). */
struct run {
	hi3_model *m;
	const hi3_cond *c;
	const hi3_decode_opts *o;
	hi3_kvfile kv;
	hi3i_vocab vs;
	hi3_comm *comm;               /* NULL: one process */
	int B, G, V, limit, NMK;      /* NMK: MoE layers x experts per token (0: dense) */
	int64_t remaining;            /* steps the longest row has left */
	struct rule_state *rules;     /* (B) each row's decoding rules so far */
	/* the rows that take a token this step: their logits, seeds, steps, tokens and log-probs */
	int *act;
	const float **cur;
	uint64_t *seeds, *steps;
	int64_t *toks;
	float *lps;
	uint8_t *stop_now;            /* (B) the row stops with this step's token */
	void *scratch;                /* hi3_sample_scratch_size(V) */
	/* the forward of the rows fed */
	int64_t *ids, *slot;          /* (B) */
	int32_t *rope, *hi, *crow, *at, *fed_row;   /* (B, 2), (B), (B), (B, 2), (B) */
	float *logits;                /* (B, V) */
	int16_t *route_ids;           /* (B, NMK) or NULL */
	float *route_w;               /* (B, NMK) or NULL */
};

static void run_release(struct run *r)
{
	if (r->m)
		hi3_model_drop_cache(r->m, &r->kv.cache);
	hi3i_kv_close(&r->kv);
	free(r->ids), free(r->slot), free(r->rope), free(r->hi), free(r->crow), free(r->at), free(r->fed_row);
	free(r->logits), free(r->stop_now), free(r->scratch), free(r->rules), free(r->act), free(r->cur);
	free(r->seeds), free(r->steps), free(r->toks), free(r->lps), free(r->route_ids), free(r->route_w);
	memset(r, 0, sizeof(*r));
}

/* The checks, the KV file on every rank, the buffers, and each row's rules
 * after its prompt and what was decoded before. */
static int run_init(struct run *r, hi3_model *m, const hi3_cond *c, const char *kv_path, const hi3_decode_opts *o,
                    hi3_decode_stats *stats, hi3_error *err)
{
	const hi3_kvfile *kv = &r->kv;
	int B;

	memset(r, 0, sizeof(*r));
	if (hi3_cond_check_model(c, m, err) != 0 || hi3i_cond_require_text(c, "decoded", err) != 0)
		return -1;
	if (hi3i_par_check_cond(m, c, err) != 0 || hi3i_kv_open_ranks(&r->kv, kv_path, m, c, err) != 0)
		return -1;
	r->m = m;
	r->c = c;
	r->o = o;
	r->comm = hi3i_model_comm(m);
	r->V = hi3_model_config(m)->vocab_size;
	B = r->B = kv->B;
	r->G = kv->G;
	if (o->max_new > r->G)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: --max-new %d is larger than the cache allows (%d new slots; "
		                     "prefill with a larger --max-new)", kv_path, o->max_new, r->G);
	r->limit = o->max_new > 0 ? o->max_new : r->G;
	r->NMK = kv->n_moe * kv->k_route;
	if (o->trace && (hi3i_trace_stage_meta(o->trace, "decode", c, err) ||
	                 hi3_trace_set_meta(o->trace, "kv_dtype", hi3_dtype_name(kv->cache.dtype), err) ||
	                 hi3_trace_set_meta(o->trace, "decode_mask", o->decode_mask == HI3_MASK_NONE ? "none" : "causal",
	                                    err) ||
	                 hi3_trace_set_meta(o->trace, "token_placement", o->placement == HI3_PLACE_TAIL ? "tail" : "index",
	                                    err)))
		return -1;
	r->ids = hi3i_malloc(sizeof(int64_t) * (size_t)B, err);
	r->slot = hi3i_malloc(sizeof(int64_t) * (size_t)B, err);
	r->rope = hi3i_malloc(sizeof(int32_t) * 2 * (size_t)B, err);
	r->hi = hi3i_malloc(sizeof(int32_t) * (size_t)B, err);
	r->crow = hi3i_malloc(sizeof(int32_t) * (size_t)B, err);
	r->at = hi3i_malloc(sizeof(int32_t) * 2 * (size_t)B, err);
	r->fed_row = hi3i_malloc(sizeof(int32_t) * (size_t)B, err);
	r->logits = hi3i_malloc(sizeof(float) * (size_t)B * r->V, err);
	r->stop_now = hi3i_calloc((size_t)B, 1, err);
	r->scratch = hi3i_malloc(hi3_sample_scratch_size(r->V), err);
	r->rules = hi3i_calloc((size_t)B, sizeof(*r->rules), err);
	r->act = hi3i_malloc(sizeof(*r->act) * (size_t)B, err);
	r->cur = hi3i_malloc(sizeof(*r->cur) * (size_t)B, err);
	r->seeds = hi3i_malloc(sizeof(*r->seeds) * (size_t)B, err);
	r->steps = hi3i_malloc(sizeof(*r->steps) * (size_t)B, err);
	r->toks = hi3i_malloc(sizeof(*r->toks) * (size_t)B, err);
	r->lps = hi3i_malloc(sizeof(*r->lps) * (size_t)B, err);
	hi3i_model_vocab(m, &r->vs);
	if (r->NMK) {
		r->route_ids = hi3i_malloc(sizeof(int16_t) * (size_t)B * r->NMK, err);
		r->route_w = hi3i_malloc(sizeof(float) * (size_t)B * r->NMK, err);
	}
	if (!r->ids || !r->slot || !r->rope || !r->hi || !r->crow || !r->at || !r->fed_row || !r->logits ||
	    !r->stop_now || !r->scratch || !r->rules || !r->act || !r->cur || !r->seeds || !r->steps || !r->toks ||
	    !r->lps || (r->NMK && (!r->route_ids || !r->route_w)))
		return -1;
	for (int i = 0; i < B; i++) {
		const int64_t *list = c->forced_after ? c->forced_after + (size_t)i * c->NF : NULL;
		r->rules[i].rec = -1;
		rule_step(&r->rules[i], list, c->NF, c->input_ids[(size_t)i * kv->L + kv->prompt_len[i] - 1]);
		for (int64_t g = 0; g < kv->gen_len[i]; g++)
			rule_step(&r->rules[i], list, c->NF, kv->gen_tokens[(size_t)i * r->G + g]);
	}
	stats->rows = B;
	for (int i = 0; i < B; i++) {
		stats->resumed_from += kv->gen_len[i];
		/* a row already at a smaller --max-new is done for this call */
		if (!kv->finished[i])
			r->remaining = HI3_MAX(r->remaining, r->limit - kv->gen_len[i]);
	}
	return 0;
}

/* The token of every active row (by its rules, else sampled, all rows at
 * once: with lm_head split, one exchange for the batch), recorded, and the
 * inputs of the forward of the rows that go on: n_active rows took a
 * token, n_feed of them are fed. */
static int run_tokens(struct run *r, int *n_active, int *n_feed, hi3_error *err)
{
	hi3_kvfile *kv = &r->kv;
	const hi3_cond *c = r->c;
	const hi3_decode_opts *o = r->o;
	const int B = r->B, G = r->G, NMK = r->NMK;

	*n_active = *n_feed = 0;
	for (int i = 0; i < B; i++) {
		int64_t g = kv->gen_len[i];
		if (kv->finished[i] || g >= r->limit)
			continue;
		r->act[*n_active] = i;
		r->cur[*n_active] = hi3i_kv_logits(kv, i);
		r->seeds[*n_active] = o->have_seed ? o->seed : (uint64_t)c->seeds[i];
		r->steps[*n_active] = (uint64_t)g;
		if (ruled_token(c, i, &r->rules[i], g ? kv->gen_tokens[(size_t)i * G + g - 1]
		                                      : c->input_ids[(size_t)i * kv->L + kv->prompt_len[i] - 1],
		                r->cur[*n_active], &r->vs, &r->toks[*n_active], err) != 0)
			return -1;
		(*n_active)++;
	}
	if (*n_active && hi3i_vocab_next(&r->vs, r->cur, *n_active, &o->sampler, r->seeds, r->steps, r->toks, r->lps,
	                                 r->scratch, err) != 0)
		return -1;
	for (int a = 0; a < *n_active; a++) {
		const int i = r->act[a];
		int64_t g = kv->gen_len[i], tok = r->toks[a], p;
		const int f = *n_feed;

		rule_step(&r->rules[i], c->forced_after ? c->forced_after + (size_t)i * c->NF : NULL, c->NF, tok);
		kv->gen_tokens[(size_t)i * G + g] = tok;
		kv->gen_logprobs[(size_t)i * G + g] = r->lps[a];
		r->stop_now[i] = is_stop(c, o, i, tok) || g + 1 >= r->limit;
		if (r->stop_now[i]) {
			if (NMK)
				for (int j = 0; j < NMK; j++) {
					kv->gen_route_ids[((size_t)i * G + g) * NMK + j] = -1;
					kv->gen_route_w[((size_t)i * G + g) * NMK + j] = 0.0f;
				}
			continue;
		}
		p = kv->prompt_len[i] + g;
		if (o->placement == HI3_PLACE_TAIL)
			/* upstream appended new tokens at column L + s, so a
			 * short row reads column n_i + g: its own pad */
			r->ids[f] = p < kv->L ? c->input_ids[(size_t)i * kv->L + p] : kv->gen_tokens[(size_t)i * G + (p - kv->L)];
		else
			r->ids[f] = tok;
		r->slot[f] = p;
		r->rope[2 * f] = r->rope[2 * f + 1] = (int32_t)p;
		r->hi[f] = o->decode_mask == HI3_MASK_NONE ? kv->C - 1 : (int32_t)p;
		r->crow[f] = i;
		r->at[2 * f] = f;
		r->at[2 * f + 1] = 0;
		r->fed_row[f] = i;
		(*n_feed)++;
	}
	return 0;
}

/* One step: the tokens, the forward of the rows that go on into the next
 * logits and the cache, then the commit of every row (hi3-files(5), KV).
 * *done when no row was active. */
static int run_step(struct run *r, int64_t step, hi3_decode_stats *stats, int *done, hi3_error *err)
{
	hi3_kvfile *kv = &r->kv;
	const hi3_decode_opts *o = r->o;
	const int G = r->G, NMK = r->NMK;
	int n_active, n_feed, committed = 0;

	if (run_tokens(r, &n_active, &n_feed, err) != 0)
		return -1;
	if (!(*done = !n_active) && n_feed) {
		hi3_batch b = {
			.B = n_feed, .T = 1, .mode = HI3_ATTN_CACHE, .ids = r->ids, .rope = r->rope, .hi = r->hi,
			.slot = r->slot, .cache_row = r->crow, .n_logits = n_feed, .logit_at = r->at, .logits = r->logits,
			.vocab_slice = 1, .route_ids = NMK ? r->route_ids : NULL, .route_w = NMK ? r->route_w : NULL,
			.trace = o->trace, .trace_row = r->crow, .trace_pos = r->slot,
		};
		if (hi3_forward(r->m, &kv->cache, &b, err) != 0)
			return -1;
		for (int f = 0; f < n_feed; f++) {
			int i = r->fed_row[f];
			size_t g = (size_t)kv->gen_len[i];
			memcpy(hi3i_kv_logits_next(kv, i) + kv->v0, r->logits + (size_t)f * r->V + kv->v0,
			       sizeof(float) * (size_t)kv->nv);
			if (NMK) {
				memcpy(kv->gen_route_ids + ((size_t)i * G + g) * NMK, r->route_ids + (size_t)f * NMK,
				       sizeof(int16_t) * (size_t)NMK);
				memcpy(kv->gen_route_w + ((size_t)i * G + g) * NMK, r->route_w + (size_t)f * NMK,
				       sizeof(float) * (size_t)NMK);
			}
		}
		if (hi3_kv_sync_host(r->m, &kv->cache, err) != 0)
			return -1;
	}
	if (*done)
		return 0;
	if (!o->no_fsync && hi3i_kv_flush(kv, err) != 0)
		return -1;
	/* every rank's kv heads of this step are written (and durable) before rank 0 commits it */
	if (r->comm && hi3_comm_barrier(r->comm, err) != 0)
		return -1;
	for (int i = 0; i < r->B; i++) {
		if (kv->finished[i] || kv->gen_len[i] >= r->limit)
			continue;
		/* the crash tests' kill point HI3_TEST_KILL_AT=S:R: during step S of this
		 * call, its payload written, R rows committed (0: before any) */
		hi3i_test_kill_point(step, committed++);
		hi3i_kv_commit(kv, i, kv->gen_len[i] + 1, r->stop_now[i]);
		stats->tokens++;
	}
	if (!o->no_fsync && hi3i_kv_flush(kv, err) != 0)
		return -1;
	stats->steps++;
	if (o->progress)
		o->progress(o->progress_ctx, stats->steps, r->remaining);
	return 0;
}

/* next_logits current for every row, the file flushed, the segment of
 * every row's tokens so far written (by rank 0 of a layout). */
static int run_finish(struct run *r, const char *seg_path, hi3_decode_stats *stats, hi3_error *err)
{
	hi3i_kv_settle(&r->kv);
	if (hi3i_kv_flush(&r->kv, err) != 0)
		return -1;
	for (int i = 0; i < r->B; i++)
		stats->finished += r->kv.finished[i];
	if (write_segment(&r->kv, r->c, r->m, r->o, hi3i_model_writes_files(r->m) ? seg_path : NULL,
	                  &stats->total_tokens, err) != 0)
		return -1;
	/* the segment is in place for every rank when the call returns */
	if (r->comm && hi3_comm_barrier(r->comm, err) != 0)
		return -1;
	return 0;
}

int hi3_decode(hi3_model *m, const hi3_cond *c, const char *kv_path, const hi3_decode_opts *o,
               const char *seg_path, hi3_decode_stats *stats, hi3_error *err)
{
	struct run r;
	double t0 = hi3i_now();
	int done = 0, rc = -1;

	memset(stats, 0, sizeof(*stats));
	if (run_init(&r, m, c, kv_path, o, stats, err) != 0) {
		if (r.m)
			stats->seconds = hi3i_now() - t0;
		run_release(&r);
		return -1;
	}
	for (int64_t step = 0; !done && !(o->steps > 0 && step >= o->steps); step++)
		if (run_step(&r, step, stats, &done, err) != 0)
			goto out;
	rc = run_finish(&r, seg_path, stats, err);
out:
	stats->seconds = hi3i_now() - t0;
	run_release(&r);
	return rc;
}
