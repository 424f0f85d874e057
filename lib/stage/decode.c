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
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "format/conditions.h"
#include "stage/files.h"
#include "format/trace.h"
#include "model/model.h"
#include "stage/vocab.h"

/*
 * Fault injection for the crash tests: HI3_TEST_KILL_AT=S:R makes the
 * process kill itself with SIGKILL during step S of this call, after the
 * step's payload is written and R rows are committed (R = 0: before any).
 */
static void test_kill_point(int64_t step, int committed)
{
	static int parsed;
	static long long at_step = -1, at_rows = 0;
	const char *v;

	if (!parsed) {
		parsed = 1;
		v = getenv("HI3_TEST_KILL_AT");
		if (v && sscanf(v, "%lld:%lld", &at_step, &at_rows) < 1)
			at_step = -1;
	}
	if (at_step == step && at_rows == committed)
		raise(SIGKILL);
}

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

int hi3_decode(hi3_model *m, const hi3_cond *c, const char *kv_path, const hi3_decode_opts *o,
               const char *seg_path, hi3_decode_stats *stats, hi3_error *err)
{
	hi3_kvfile kv = {0};
	const int V = hi3_model_config(m)->vocab_size;
	int B, G, limit, rc = -1;
	int64_t *ids = NULL, *slot = NULL, remaining = 0;
	int32_t *rope = NULL, *hi = NULL, *crow = NULL, *at = NULL, *fed_row = NULL;
	float *logits = NULL, *route_w = NULL;
	int16_t *route_ids = NULL;
	uint8_t *stop_now = NULL;
	void *scratch = NULL;
	struct rule_state *rules = NULL;
	double t0 = hi3i_now();
	int NMK, *act = NULL;
	hi3_comm *comm = hi3i_model_comm(m);
	hi3i_vocab vs;
	const float **cur = NULL;
	uint64_t *seeds = NULL, *steps = NULL;
	int64_t *toks = NULL;
	float *lps = NULL;

	memset(stats, 0, sizeof(*stats));
	if (hi3_cond_check_model(c, m, err) != 0 || hi3i_cond_require_text(c, "decoded", err) != 0)
		return -1;
	if (hi3i_par_check_cond(m, c, err) != 0 || hi3i_kv_open_ranks(&kv, kv_path, m, c, err) != 0)
		return -1;
	B = kv.B;
	G = kv.G;
	if (o->max_new > G) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: --max-new %d is larger than the cache allows (%d new slots; "
		              "prefill with a larger --max-new)", kv_path, o->max_new, G);
		goto out;
	}
	limit = o->max_new > 0 ? o->max_new : G;
	NMK = kv.n_moe * kv.k_route;
	if (o->trace && (hi3i_trace_stage_meta(o->trace, "decode", c, err) ||
	                 hi3_trace_set_meta(o->trace, "kv_dtype", hi3_dtype_name(kv.cache.dtype), err) ||
	                 hi3_trace_set_meta(o->trace, "decode_mask", o->decode_mask == HI3_MASK_NONE ? "none" : "causal",
	                                    err) ||
	                 hi3_trace_set_meta(o->trace, "token_placement", o->placement == HI3_PLACE_TAIL ? "tail" : "index",
	                                    err)))
		goto out;
	ids = hi3i_malloc(sizeof(int64_t) * (size_t)B, err);
	slot = hi3i_malloc(sizeof(int64_t) * (size_t)B, err);
	rope = hi3i_malloc(sizeof(int32_t) * 2 * (size_t)B, err);
	hi = hi3i_malloc(sizeof(int32_t) * (size_t)B, err);
	crow = hi3i_malloc(sizeof(int32_t) * (size_t)B, err);
	at = hi3i_malloc(sizeof(int32_t) * 2 * (size_t)B, err);
	fed_row = hi3i_malloc(sizeof(int32_t) * (size_t)B, err);
	logits = hi3i_malloc(sizeof(float) * (size_t)B * V, err);
	stop_now = hi3i_calloc((size_t)B, 1, err);
	scratch = hi3i_malloc(hi3_sample_scratch_size(V), err);
	rules = hi3i_calloc((size_t)B, sizeof(*rules), err);
	act = hi3i_malloc(sizeof(*act) * (size_t)B, err);
	cur = hi3i_malloc(sizeof(*cur) * (size_t)B, err);
	seeds = hi3i_malloc(sizeof(*seeds) * (size_t)B, err);
	steps = hi3i_malloc(sizeof(*steps) * (size_t)B, err);
	toks = hi3i_malloc(sizeof(*toks) * (size_t)B, err);
	lps = hi3i_malloc(sizeof(*lps) * (size_t)B, err);
	hi3i_model_vocab(m, &vs);
	if (NMK) {
		route_ids = hi3i_malloc(sizeof(int16_t) * (size_t)B * NMK, err);
		route_w = hi3i_malloc(sizeof(float) * (size_t)B * NMK, err);
	}
	if (!ids || !slot || !rope || !hi || !crow || !at || !fed_row || !logits || !stop_now || !scratch || !rules ||
	    !act || !cur || !seeds || !steps || !toks || !lps || (NMK && (!route_ids || !route_w)))
		goto out;
	/* the rules' state after the prompt and what was decoded before */
	for (int i = 0; i < B; i++) {
		const int64_t *list = c->forced_after ? c->forced_after + (size_t)i * c->NF : NULL;
		rules[i].rec = -1;
		rule_step(&rules[i], list, c->NF, c->input_ids[(size_t)i * kv.L + kv.prompt_len[i] - 1]);
		for (int64_t g = 0; g < kv.gen_len[i]; g++)
			rule_step(&rules[i], list, c->NF, kv.gen_tokens[(size_t)i * G + g]);
	}
	stats->rows = B;
	for (int i = 0; i < B; i++) {
		stats->resumed_from += kv.gen_len[i];
		/* a row already at a smaller --max-new is done for this call */
		if (!kv.finished[i])
			remaining = HI3_MAX(remaining, limit - kv.gen_len[i]);
	}
	for (int64_t step = 0;; step++) {
		int n_active = 0, n_feed = 0;

		if (o->steps > 0 && step >= o->steps)
			break;
		/* the active rows' tokens: by their rules, else sampled, all rows
		 * at once (with lm_head split, one exchange for the batch) */
		for (int i = 0; i < B; i++) {
			int64_t g = kv.gen_len[i];
			if (kv.finished[i] || g >= limit)
				continue;
			act[n_active] = i;
			cur[n_active] = hi3i_kv_logits(&kv, i);
			seeds[n_active] = o->have_seed ? o->seed : (uint64_t)c->seeds[i];
			steps[n_active] = (uint64_t)g;
			if (ruled_token(c, i, &rules[i], g ? kv.gen_tokens[(size_t)i * G + g - 1]
			                                   : c->input_ids[(size_t)i * kv.L + kv.prompt_len[i] - 1],
			                cur[n_active], &vs, &toks[n_active], err) != 0)
				goto out;
			n_active++;
		}
		if (n_active &&
		    hi3i_vocab_next(&vs, cur, n_active, &o->sampler, seeds, steps, toks, lps, scratch, err) != 0)
			goto out;
		for (int a = 0; a < n_active; a++) {
			const int i = act[a];
			int64_t g = kv.gen_len[i], tok = toks[a], p;

			rule_step(&rules[i], c->forced_after ? c->forced_after + (size_t)i * c->NF : NULL, c->NF, tok);
			kv.gen_tokens[(size_t)i * G + g] = tok;
			kv.gen_logprobs[(size_t)i * G + g] = lps[a];
			stop_now[i] = is_stop(c, o, i, tok) || g + 1 >= limit;
			if (stop_now[i]) {
				if (NMK)
					for (int j = 0; j < NMK; j++) {
						kv.gen_route_ids[((size_t)i * G + g) * NMK + j] = -1;
						kv.gen_route_w[((size_t)i * G + g) * NMK + j] = 0.0f;
					}
				continue;
			}
			p = kv.prompt_len[i] + g;
			if (o->placement == HI3_PLACE_TAIL)
				/* upstream appended new tokens at column L + s, so a
				 * short row reads column n_i + g: its own pad */
				ids[n_feed] = p < kv.L ? c->input_ids[(size_t)i * kv.L + p]
				                       : kv.gen_tokens[(size_t)i * G + (p - kv.L)];
			else
				ids[n_feed] = tok;
			slot[n_feed] = p;
			rope[2 * n_feed] = rope[2 * n_feed + 1] = (int32_t)p;
			hi[n_feed] = o->decode_mask == HI3_MASK_NONE ? kv.C - 1 : (int32_t)p;
			crow[n_feed] = i;
			at[2 * n_feed] = n_feed;
			at[2 * n_feed + 1] = 0;
			fed_row[n_feed] = i;
			n_feed++;
		}
		if (!n_active)
			break;
		if (n_feed) {
			hi3_batch b = {
				.B = n_feed, .T = 1, .mode = HI3_ATTN_CACHE, .ids = ids, .rope = rope, .hi = hi,
				.slot = slot, .cache_row = crow, .n_logits = n_feed, .logit_at = at, .logits = logits,
				.vocab_slice = 1, .route_ids = NMK ? route_ids : NULL, .route_w = NMK ? route_w : NULL,
				.trace = o->trace, .trace_row = crow, .trace_pos = slot,
			};
			if (hi3_forward(m, &kv.cache, &b, err) != 0)
				goto out;
			for (int r = 0; r < n_feed; r++) {
				int i = fed_row[r];
				size_t g = (size_t)kv.gen_len[i];
				memcpy(hi3i_kv_logits_next(&kv, i) + kv.v0, logits + (size_t)r * V + kv.v0,
				       sizeof(float) * (size_t)kv.nv);
				if (NMK) {
					memcpy(kv.gen_route_ids + ((size_t)i * G + g) * NMK, route_ids + (size_t)r * NMK,
					       sizeof(int16_t) * (size_t)NMK);
					memcpy(kv.gen_route_w + ((size_t)i * G + g) * NMK, route_w + (size_t)r * NMK,
					       sizeof(float) * (size_t)NMK);
				}
			}
			if (hi3_kv_sync_host(m, &kv.cache, err) != 0)
				goto out;
		}
		if (!o->no_fsync && hi3i_kv_flush(&kv, err) != 0)
			goto out;
		/* every rank's kv heads of this step are written (and durable) before rank 0 commits it */
		if (comm && hi3_comm_barrier(comm, err) != 0)
			goto out;
		{
			int committed = 0;
			for (int i = 0; i < B; i++) {
				if (kv.finished[i] || kv.gen_len[i] >= limit)
					continue;
				test_kill_point(step, committed++);
				hi3i_kv_commit(&kv, i, kv.gen_len[i] + 1, stop_now[i]);
				stats->tokens++;
			}
		}
		if (!o->no_fsync && hi3i_kv_flush(&kv, err) != 0)
			goto out;
		stats->steps++;
		if (o->progress)
			o->progress(o->progress_ctx, stats->steps, remaining);
	}
	hi3i_kv_settle(&kv);
	if (hi3i_kv_flush(&kv, err) != 0)
		goto out;
	for (int i = 0; i < B; i++)
		stats->finished += kv.finished[i];
	if (write_segment(&kv, c, m, o, !comm || comm->rank == 0 ? seg_path : NULL, &stats->total_tokens, err) != 0)
		goto out;
	/* the segment is in place for every rank when the call returns */
	if (comm && hi3_comm_barrier(comm, err) != 0)
		goto out;
	rc = 0;
out:
	stats->seconds = hi3i_now() - t0;
	hi3_model_drop_cache(m, &kv.cache);
	hi3i_kv_close(&kv);
	free(ids);
	free(slot);
	free(rope);
	free(hi);
	free(crow);
	free(at);
	free(fed_row);
	free(logits);
	free(stop_now);
	free(scratch);
	free(rules);
	free(act);
	free(cur);
	free(seeds);
	free(steps);
	free(toks);
	free(lps);
	free(route_ids);
	free(route_w);
	return rc;
}
