/*
 * replay.c -- teacher-forced log-probs of a rollout (hi3-batching(7), SAMPLING).
 *
 * For row i, one causal forward over its true prompt (its first n_i
 * columns, no padding) followed by its response tokens; the log-prob of
 * response token j comes from the logits at index n_i - 1 + j, at
 * temperature 1, exactly as decode recorded it. Per row (B = 1 each) or
 * batched (rows right padded into one batch; pads never reach a real
 * query because attention is causal by column).
 *
 * Routing replay: the segment may carry the experts each generated token
 * was routed to; --routing=recorded forces them, so the rollout/replay gap
 * can be measured with routing flips removed.
 */
#include <jansson.h>
#include <math.h>
#include <string.h>
#include "format/conditions.h"
#include "stage/files.h"
#include "stage/images.h"
#include "format/trace.h"
#include "model/model.h"
#include "stage/vocab.h"

static int check_inputs(const hi3_model *m, const hi3_cond *c, const hi3_segment *s, const hi3_replay_opts *o,
                        hi3_error *err)
{
	/* a segment built in memory has no file */
	const char *path = s->st ? hi3_st_path(s->st) : "segment (in memory)";
	int V = hi3_model_config(m)->vocab_size;

	if (hi3_cond_check_model(c, m, err) != 0)
		return -1;
	if (hi3i_check_made_by(path, s->model_fingerprint, hi3i_model_facts(m), err) != 0)
		return -1;
	if (s->B != c->B)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: has %d rows, the conditions file %s has %d", path, s->B,
		                     c->st ? hi3_st_path(c->st) : "(in memory)", c->B);
	if (hi3i_check_made_from(path, s->conditions_hash, c, err) != 0)
		return -1;
	for (int64_t j = 0; j < s->T; j++)
		if (s->tokens[j] < 0 || s->tokens[j] >= V)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'tokens'[%lld] = %lld is outside the "
			                     "vocabulary [0, %d)", path, (long long)j, (long long)s->tokens[j], V);
	if (hi3i_cond_require_text(c, "replayed", err) != 0)
		return -1;
	if (o->routing_recorded) {
		if (!s->route_ids)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: --routing=recorded needs recorded routing "
			                     "(decode with --record-routing)", path);
		if (o->weights_recorded && s->routing_weights && !strcmp(s->routing_weights, "none"))
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: --routing-weights=recorded: the segment has no routing "
			                     "weights (routing_weights \"none\": an imported rollout); recompute them from the "
			                     "router", path);
		if (s->n_moe != hi3_model_n_moe_layers(m) || s->k != hi3_model_max_topk(m))
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: recorded routing is (%d MoE layers, top-%d), the "
			                     "model has (%d, top-%d)", path, s->n_moe, s->k, hi3_model_n_moe_layers(m),
			                     hi3_model_max_topk(m));
	}
	for (int i = 0; i < c->B; i++) {
		int64_t len = s->cu_seqlens[i + 1] - s->cu_seqlens[i];
		if (c->real_pos[i] + len > INT32_MAX / 4)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: row %d is too long to replay", path, i);
	}
	return 0;
}

/* One forward over a group of rows [r0, r1): prompt + response, right
 * padded to the longest; fills lp (T) at the rows' segment offsets, and
 * the free-routing choices of response tokens into route (T, NM, K). */
static int replay_rows(hi3_model *m, struct hi3i_image_enc *enc, const hi3_cond *c, const hi3_segment *s,
                       const hi3_replay_opts *o, int r0, int r1, int forced, int record, hi3_trace *trace, float *lp,
                       int16_t *route, hi3_error *err)
{
	struct hi3i_image_embeds emb = {0};
	int *crows = NULL;
	const int V = hi3_model_config(m)->vocab_size, NM = hi3_model_n_moe_layers(m), K = hi3_model_max_topk(m);
	const int NMK = NM * K, nb = r1 - r0;
	int64_t Tmax = 0, n_log = 0;
	int64_t *ids = NULL, *tpos = NULL;    /* tpos (nb, Tmax): traced positions, -1 on pads */
	int32_t *rope = NULL, *hi = NULL, *at = NULL, *blocks = NULL, *trow = NULL;
	int16_t *rids = NULL, *force = NULL;
	float *rw = NULL, *logits = NULL, *force_w = NULL;
	int rc = -1;

	for (int i = r0; i < r1; i++) {
		int64_t len = s->cu_seqlens[i + 1] - s->cu_seqlens[i];
		Tmax = HI3_MAX(Tmax, c->real_pos[i] + len);
		n_log += len;
	}
	if (n_log == 0 && !(record && o->rec_prompt_ids) && !trace)
		return 0;
	ids = hi3i_malloc(sizeof(int64_t) * (size_t)(nb * Tmax), err);
	rope = hi3i_malloc(sizeof(int32_t) * 2 * (size_t)(nb * Tmax), err);
	hi = hi3i_malloc(sizeof(int32_t) * (size_t)(nb * Tmax), err);
	at = hi3i_malloc(sizeof(int32_t) * 2 * (size_t)n_log, err);
	blocks = hi3i_malloc(sizeof(int32_t) * 2 * (size_t)(nb * c->S), err);
	logits = hi3i_malloc(sizeof(float) * (size_t)(n_log + 1) * V, err);
	if (NMK) {
		rids = hi3i_malloc(sizeof(int16_t) * (size_t)(nb * Tmax) * NMK, err);
		rw = hi3i_malloc(sizeof(float) * (size_t)(nb * Tmax) * NMK, err);
		if (forced) {
			force = hi3i_malloc(sizeof(int16_t) * (size_t)(nb * Tmax) * NMK, err);
			force_w = hi3i_malloc(sizeof(float) * (size_t)(nb * Tmax) * NMK, err);
		}
	}
	crows = hi3i_malloc(sizeof(int) * (size_t)nb, err);
	if (trace) {
		tpos = hi3i_malloc(sizeof(int64_t) * (size_t)(nb * Tmax), err);
		trow = hi3i_malloc(sizeof(int32_t) * (size_t)nb, err);
	}
	if (!ids || !rope || !hi || !at || !blocks || !logits || (NMK && (!rids || !rw)) ||
	    (forced && NMK && (!force || !force_w)) || (trace && (!tpos || !trow)) || !crows)
		goto out;
	/* the rows' cond images, at the prompt columns they have in c */
	for (int r = 0; r < nb; r++)
		crows[r] = r0 + r;
	if (hi3i_image_embeds(enc, c, crows, nb, &emb, err))
		goto out;
	n_log = 0;
	for (int r = 0; r < nb; r++) {
		int i = r0 + r;
		int64_t n = c->real_pos[i], off = s->cu_seqlens[i], len = s->cu_seqlens[i + 1] - off;
		for (int64_t t = 0; t < Tmax; t++) {
			size_t x = (size_t)r * Tmax + t;
			if (t < n) {
				ids[x] = c->input_ids[(size_t)i * c->L + t];
				rope[2 * x] = c->rope_pos[((size_t)i * c->L + t) * 2];
				rope[2 * x + 1] = c->rope_pos[((size_t)i * c->L + t) * 2 + 1];
			} else {
				ids[x] = t - n < len ? s->tokens[off + (t - n)] : (c->pad_id >= 0 ? c->pad_id : 0);
				rope[2 * x] = rope[2 * x + 1] = (int32_t)t;
			}
			hi[x] = (int32_t)t;
			if (tpos)
				tpos[x] = t < n + len ? t : -1;
			if (force) {
				/* the recorded experts of response token j (fed at
				 * index n + j); the prompt routes freely */
				int rec = t >= n && t - n < len && s->route_ids[(size_t)(off + t - n) * NMK] >= 0;
				for (int j = 0; j < NMK; j++) {
					force[x * NMK + j] = rec ? s->route_ids[(size_t)(off + t - n) * NMK + j] : -1;
					force_w[x * NMK + j] = rec ? s->route_w[(size_t)(off + t - n) * NMK + j] : 0.0f;
				}
			}
		}
		if (trow)
			trow[r] = i;
		memcpy(blocks + (size_t)r * c->S * 2, c->image_blocks + (size_t)i * c->S * 2,
		       sizeof(int32_t) * 2 * (size_t)c->S);
		for (int64_t j = 0; j < len; j++) {
			at[2 * n_log] = r;
			at[2 * n_log + 1] = (int32_t)(n - 1 + j);
			n_log++;
		}
	}
	{
		hi3_batch b = {
			.B = nb, .T = (int)Tmax, .mode = HI3_ATTN_SELF, .ids = ids, .rope = rope, .hi = hi,
			.blocks = blocks, .S = c->S, .n_logits = (int)n_log, .logit_at = at, .logits = logits,
			.vocab_slice = 1,
			.route_ids = rids, .route_w = rw, .force_route = force,
			.force_route_w = o->weights_recorded ? force_w : NULL,
			.n_host_embed = emb.n, .host_embed_at = emb.at, .host_embed_rows = emb.rows,
			.trace = trace, .trace_row = trow, .trace_pos = tpos,
		};
		if (hi3_forward(m, NULL, &b, err) != 0)
			goto out;
	}
	if (record && NMK) {
		/* the routing that gave these log-probs, prompt and response */
		int64_t poff = 0;
		for (int i = 0; i < r0; i++)
			poff += c->real_pos[i];
		for (int r = 0; r < nb; r++) {
			int i = r0 + r;
			int64_t n = c->real_pos[i], off = s->cu_seqlens[i], len = s->cu_seqlens[i + 1] - off;
			size_t src = (size_t)r * Tmax * NMK, per = sizeof(int16_t) * (size_t)NMK;
			if (o->rec_prompt_ids) {
				memcpy(o->rec_prompt_ids + (size_t)poff * NMK, rids + src, per * (size_t)n);
				memcpy(o->rec_prompt_w + (size_t)poff * NMK, rw + src, sizeof(float) * NMK * (size_t)n);
			}
			if (o->rec_ids) {
				memcpy(o->rec_ids + (size_t)off * NMK, rids + src + (size_t)n * NMK, per * (size_t)len);
				memcpy(o->rec_w + (size_t)off * NMK, rw + src + (size_t)n * NMK, sizeof(float) * NMK * (size_t)len);
			}
			poff += n;
		}
	}
	/* the log-probs of the given tokens; with lm_head split, from the
	 * vocabulary slices (one exchange for the group) */
	if (n_log > 0) {
		hi3i_vocab vs;
		const float **rows = hi3i_malloc(sizeof(*rows) * (size_t)n_log, err);
		int64_t *tok = hi3i_malloc(sizeof(*tok) * (size_t)n_log, err);
		float *lps = hi3i_malloc(sizeof(*lps) * (size_t)n_log, err);
		int lrc = -1;
		if (rows && tok && lps) {
			n_log = 0;
			for (int r = 0; r < nb; r++) {
				int64_t off = s->cu_seqlens[r0 + r], len = s->cu_seqlens[r0 + r + 1] - off;
				for (int64_t j = 0; j < len; j++, n_log++) {
					rows[n_log] = logits + (size_t)n_log * V;
					tok[n_log] = s->tokens[off + j];
				}
			}
			hi3i_model_vocab(m, &vs);
			lrc = hi3i_vocab_next(&vs, rows, (int)n_log, NULL, NULL, NULL, tok, lps, NULL, err);
			n_log = 0;
			for (int r = 0; !lrc && r < nb; r++) {
				int64_t off = s->cu_seqlens[r0 + r], len = s->cu_seqlens[r0 + r + 1] - off;
				for (int64_t j = 0; j < len; j++)
					lp[off + j] = lps[n_log++];
			}
		}
		free(rows);
		free(tok);
		free(lps);
		if (lrc)
			goto out;
	}
	n_log = 0;
	for (int r = 0; r < nb; r++) {
		int i = r0 + r;
		int64_t n = c->real_pos[i], off = s->cu_seqlens[i], len = s->cu_seqlens[i + 1] - off;
		for (int64_t j = 0; j < len; j++, n_log++) {
			if (route && NMK)
				memcpy(route + (size_t)(off + j) * NMK, rids + ((size_t)r * Tmax + n + j) * NMK,
				       sizeof(int16_t) * (size_t)NMK);
		}
	}
	rc = 0;
out:
	free(ids);
	free(rope);
	free(hi);
	free(at);
	free(blocks);
	free(logits);
	free(rids);
	free(rw);
	free(force);
	free(force_w);
	free(crows);
	hi3i_image_embeds_release(&emb);
	free(tpos);
	free(trow);
	return rc;
}

static int run_pass(hi3_model *m, struct hi3i_image_enc *enc, const hi3_cond *c, const hi3_segment *s,
                    const hi3_replay_opts *o, int forced, int record, hi3_trace *trace, float *lp, int16_t *route, hi3_error *err)
{
	int group = 1;

	if (o->batched) {
		/* as many rows per forward as fit the token budget */
		int64_t budget = o->max_tokens > 0 ? o->max_tokens : 8192, Tmax = 1;
		for (int i = 0; i < c->B; i++)
			Tmax = HI3_MAX(Tmax, c->real_pos[i] + s->cu_seqlens[i + 1] - s->cu_seqlens[i]);
		group = (int)HI3_MAX(1, budget / Tmax);
	}
	for (int r0 = 0; r0 < c->B; r0 += group) {
		int r1 = HI3_MIN(c->B, r0 + group);
		if (replay_rows(m, enc, c, s, o, r0, r1, forced, record, trace, lp, route, err) != 0)
			return -1;
		if (o->progress)
			o->progress(o->progress_ctx, r1, c->B);
	}
	return 0;
}

static void row_stats(const hi3_segment *s, const float *lp, int i, hi3_replay_row *r)
{
	int64_t off = s->cu_seqlens[i], len = s->cu_seqlens[i + 1] - off;
	double sum = 0, sum_ratio = 0;

	memset(r, 0, sizeof(*r));
	r->tokens = len;
	r->worst = -1;
	r->ratio_min = INFINITY;
	r->ratio_max = -INFINITY;
	for (int64_t j = 0; j < len; j++) {
		double d = (double)lp[off + j] - (double)s->logprobs[off + j], ad = fabs(d), ratio = exp(d);
		sum += ad;
		sum_ratio += ratio;
		if (r->worst < 0 || ad > r->max_abs || isnan(ad)) {
			r->max_abs = ad;
			r->worst = j;
		}
		r->ratio_min = fmin(r->ratio_min, ratio);
		r->ratio_max = fmax(r->ratio_max, ratio);
	}
	if (len) {
		r->mean_abs = sum / (double)len;
		r->ratio_mean = sum_ratio / (double)len;
	} else {
		r->ratio_min = r->ratio_max = NAN;
	}
}

int hi3_replay(hi3_model *m, const hi3_cond *c, const hi3_segment *s, const hi3_replay_opts *o, float *logprobs,
               hi3_replay_report *rep, hi3_error *err)
{
	const int NM = hi3_model_n_moe_layers(m), K = hi3_model_max_topk(m), NMK = NM * K;
	int16_t *route = NULL;
	float *lp_free = NULL;
	hi3_mismatch *mm = NULL;
	double t0 = hi3i_now(), cap = o->is_cap > 0 ? o->is_cap : 2.0;
	struct hi3i_image_enc *enc = NULL;
	int rc = -1;

	memset(rep, 0, sizeof(*rep));
	if (!(cap > 1.0) || !isfinite(cap))
		return hi3_error_set(err, HI3_ERR_USAGE, "replay: the importance-ratio cap must be above 1, not %g", cap);
	if (check_inputs(m, c, s, o, err) != 0 || hi3i_par_check_cond(m, c, err) != 0 ||
	    hi3i_image_enc_open(&enc, m, c, c->st ? hi3_st_path(c->st) : NULL, err))
		return -1;
	if (o->trace && (hi3i_trace_stage_meta(o->trace, "replay", c, err) ||
	                 hi3_trace_set_meta(o->trace, "mode", o->batched ? "batched" : "per-row", err) ||
	                 hi3_trace_set_meta(o->trace, "routing", o->routing_recorded ? (o->weights_recorded ?
	                                    "recorded+weights" : "recorded") : "free", err))) {
		hi3i_image_enc_close(enc);
		return -1;
	}
	rep->B = s->B;
	rep->rows = hi3i_calloc((size_t)s->B, sizeof(*rep->rows), err);
	if (!rep->rows)
		goto out;
	if (s->route_ids && NMK) {
		route = hi3i_malloc(sizeof(int16_t) * (size_t)(s->T + 1) * NMK, err);
		if (!route)
			goto out;
	}
	if (o->routing_recorded) {
		/* the free pass first, for the gap without routing replay */
		lp_free = hi3i_malloc(sizeof(float) * (size_t)(s->T + 1), err);
		if (!lp_free || run_pass(m, enc, c, s, o, 0, 0, NULL, lp_free, route, err) != 0 ||
		    run_pass(m, enc, c, s, o, 1, 1, o->trace, logprobs, NULL, err) != 0)
			goto out;
	} else if (run_pass(m, enc, c, s, o, 0, 1, o->trace, logprobs, route, err) != 0) {
		goto out;
	}
	if (!(mm = hi3i_calloc((size_t)s->B, sizeof(*mm), err)) ||
	    hi3_mismatch_compute(logprobs, s->logprobs, s->cu_seqlens, s->B, cap, &rep->mismatch, mm, err) != 0)
		goto out;
	for (int i = 0; i < s->B; i++) {
		hi3_replay_row *r = &rep->rows[i];
		row_stats(s, logprobs, i, r);
		r->mismatch = mm[i];
		if (lp_free) {
			hi3_replay_row f;
			row_stats(s, lp_free, i, &f);
			r->max_abs_free = f.max_abs;
			r->mean_abs_free = f.mean_abs;
		}
		if (route) {
			/* a flip: the replay's top-k set differs from the recorded one */
			for (int64_t j = s->cu_seqlens[i]; j < s->cu_seqlens[i + 1]; j++) {
				int flip = 0;
				if (s->route_ids[(size_t)j * NMK] < 0)
					continue;                /* never fed at rollout: no record */
				for (int l = 0; l < NM && !flip; l++)
					for (int a = 0; a < K && !flip; a++) {
						int16_t e = s->route_ids[((size_t)j * NM + l) * K + a], found = 0;
						for (int b2 = 0; b2 < K; b2++)
							found |= route[((size_t)j * NM + l) * K + b2] == e;
						flip = !found;
					}
				r->routing_flips += flip;
				r->routing_tokens++;
			}
		}
		rep->tokens += r->tokens;
		rep->empty_rows += r->tokens == 0;
		rep->routing_flips += r->routing_flips;
		rep->routing_tokens += r->routing_tokens;
	}
	{
		hi3_replay_row all;
		hi3_segment whole = *s;
		int64_t cu[2] = {0, s->T};
		whole.B = 1;
		whole.cu_seqlens = cu;
		row_stats(&whole, logprobs, 0, &all);
		rep->mean_abs = all.mean_abs;
		rep->max_abs = all.max_abs;
		rep->ratio_mean = all.ratio_mean;
		rep->ratio_min = all.ratio_min;
		rep->ratio_max = all.ratio_max;
		rep->worst = all.worst;
		if (lp_free) {
			row_stats(&whole, lp_free, 0, &all);
			rep->max_abs_free = all.max_abs;
			rep->mean_abs_free = all.mean_abs;
		}
	}
	rep->batched = o->batched;
	rep->routing_recorded = o->routing_recorded;
	rep->have_routes = s->route_ids != NULL && NM > 0;
	rep->worst_row = rep->worst_token = -1;
	if (rep->tokens) {
		int64_t r = 0;
		while (r + 1 < s->B && s->cu_seqlens[r + 1] <= rep->worst)
			r++;
		rep->worst_row = r;
		rep->worst_token = rep->worst - s->cu_seqlens[r];
	}
	rc = 0;
out:
	rep->seconds = hi3i_now() - t0;
	hi3i_image_enc_close(enc);
	free(route);
	free(lp_free);
	free(mm);
	return rc;
}

void hi3_replay_report_release(hi3_replay_report *rep)
{
	free(rep->rows);
	rep->rows = NULL;
}

int hi3_replay_to_file(hi3_model *m, const hi3_cond *c, const hi3_segment *s, const char *seg_path,
                       const hi3_replay_opts *o, int record_routing, const char *path, hi3_replay_report *rep,
                       hi3_error *err)
{
	const size_t NMK = (size_t)hi3_model_n_moe_layers(m) * (size_t)hi3_model_max_topk(m);
	hi3_replay_opts ro = *o;
	hi3_replay_file f = {0};
	int64_t *pcu = NULL, P = 0, *pos = NULL;
	int32_t *rows = NULL;
	float *lp = hi3i_calloc((size_t)s->T + 1, sizeof(float), err), *dlp = NULL;
	int rc = -1, record = record_routing && NMK > 0;

	memset(rep, 0, sizeof(*rep));
	if (!lp)
		return -1;
	if (record) {
		if (!(pcu = hi3i_calloc((size_t)c->B + 1, sizeof(int64_t), err)))
			goto out;
		for (int i = 0; i < c->B; i++)
			pcu[i + 1] = P += c->real_pos[i];
		ro.rec_ids = hi3i_calloc(((size_t)s->T + 1) * NMK, sizeof(int16_t), err);
		ro.rec_w = hi3i_calloc(((size_t)s->T + 1) * NMK, sizeof(float), err);
		ro.rec_prompt_ids = hi3i_calloc(((size_t)P + 1) * NMK, sizeof(int16_t), err);
		ro.rec_prompt_w = hi3i_calloc(((size_t)P + 1) * NMK, sizeof(float), err);
		if (!ro.rec_ids || !ro.rec_w || !ro.rec_prompt_ids || !ro.rec_prompt_w)
			goto out;
	} else if (record_routing) {
		hi3_log(HI3_LOG_WARN, "record routing: the model has no MoE layers; nothing to record");
	}
	if (hi3_replay(m, c, s, &ro, lp, rep, err) != 0)
		goto out;
	/* per token: the gap, and where the token sits */
	dlp = hi3i_malloc(sizeof(float) * ((size_t)s->T + 1), err);
	rows = hi3i_malloc(sizeof(int32_t) * ((size_t)s->T + 1), err);
	pos = hi3i_malloc(sizeof(int64_t) * ((size_t)s->T + 1), err);
	if (!dlp || !rows || !pos)
		goto out;
	for (int i = 0; i < s->B; i++)
		for (int64_t j = s->cu_seqlens[i]; j < s->cu_seqlens[i + 1]; j++) {
			dlp[j] = (float)((double)lp[j] - (double)s->logprobs[j]);
			rows[j] = i;
			pos[j] = c->real_pos[i] + (j - s->cu_seqlens[i]);
		}
	f = (hi3_replay_file){
		.T = s->T, .logprobs = lp, .dlogp = dlp, .rows = rows, .positions = pos,
		.n_moe = hi3_model_n_moe_layers(m), .k = hi3_model_max_topk(m),
		.route_ids = ro.rec_ids, .route_w = ro.rec_w, .B = c->B, .prompt_route_ids = ro.rec_prompt_ids,
		.prompt_route_w = ro.rec_prompt_w, .prompt_cu_seqlens = pcu,
		.model_fingerprint = hi3_model_fingerprint(m),
		.conditions_hash = s->conditions_hash ? s->conditions_hash : "", .segment_file = seg_path,
		.mode = o->batched ? "batched" : "per-row",
		.routing = o->routing_recorded ? (o->weights_recorded ? "recorded+weights" : "recorded") : "free",
	};
	{
		/* rank 0 alone writes the replay file of a layout */
		hi3_comm *comm = hi3i_model_comm(m);
		rc = hi3i_model_writes_files(m) ? hi3_replay_file_write(&f, path, err) : 0;
		if (rc == 0 && comm)
			rc = hi3_comm_barrier(comm, err);
	}
out:
	free(lp);
	free(dlp);
	free(rows);
	free(pos);
	free(pcu);
	if (record) {
		free(ro.rec_ids);
		free(ro.rec_w);
		free(ro.rec_prompt_ids);
		free(ro.rec_prompt_w);
	}
	return rc;
}

static json_t *jnum(double v)
{
	return isfinite(v) ? json_real(v) : json_null();
}

/* verl's names for the importance ratio at one level (rollout_is = token or sequence). */
static json_t *is_json(const hi3_mismatch_is *w)
{
	return json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}",
	                 "rollout_is_mean", jnum(w->mean), "rollout_is_std", jnum(w->std), "rollout_is_min",
	                 jnum(w->min), "rollout_is_max", jnum(w->max), "rollout_is_ratio_fraction_high",
	                 jnum(w->fraction_high), "rollout_is_ratio_fraction_low", jnum(w->fraction_low),
	                 "rollout_is_eff_sample_size", jnum(w->eff_sample_size), "rollout_is_seq_mean",
	                 jnum(w->seq_mean), "rollout_is_seq_std", jnum(w->seq_std), "rollout_is_seq_min",
	                 jnum(w->seq_min), "rollout_is_seq_max", jnum(w->seq_max), "rollout_is_seq_max_deviation",
	                 jnum(w->seq_max_deviation), "rollout_is_seq_fraction_high", jnum(w->seq_fraction_high),
	                 "rollout_is_seq_fraction_low", jnum(w->seq_fraction_low));
}

/* The trainers' metrics, verl's rollout_corr/ names (hi3-replay(1)). */
static json_t *mismatch_json(const hi3_mismatch *m)
{
	json_t *o = json_object();

	json_object_set_new(o, "is_cap", jnum(m->cap));
	json_object_set_new(o, "kl", jnum(m->kl));
	json_object_set_new(o, "k3_kl", jnum(m->k3_kl));
	json_object_set_new(o, "chi2_token", jnum(m->chi2_token));
	json_object_set_new(o, "chi2_seq", jnum(m->chi2_seq));
	json_object_set_new(o, "training_ppl", jnum(m->training_ppl));
	json_object_set_new(o, "training_log_ppl", jnum(m->training_log_ppl));
	json_object_set_new(o, "rollout_ppl", jnum(m->rollout_ppl));
	json_object_set_new(o, "rollout_log_ppl", jnum(m->rollout_log_ppl));
	json_object_set_new(o, "log_ppl_diff", jnum(m->log_ppl_diff));
	json_object_set_new(o, "log_ppl_abs_diff", jnum(m->log_ppl_abs_diff));
	json_object_set_new(o, "log_ppl_diff_max", jnum(m->log_ppl_diff_max));
	json_object_set_new(o, "log_ppl_diff_min", jnum(m->log_ppl_diff_min));
	json_object_set_new(o, "ppl_ratio", jnum(m->ppl_ratio));
	json_object_set_new(o, "log_ratio_sum", jnum(m->log_ratio_sum));
	json_object_set_new(o, "token", is_json(&m->token));
	json_object_set_new(o, "sequence", is_json(&m->sequence));
	return o;
}

static json_t *row_json(const hi3_replay_row *r, int i, int routed, int have_routes)
{
	json_t *o = json_object();

	if (i >= 0)
		json_object_set_new(o, "row", json_integer(i));
	json_object_set_new(o, "tokens", json_integer(r->tokens));
	if (r->tokens == 0) {
		json_object_set_new(o, "empty", json_true());
		return o;
	}
	json_object_set_new(o, "mean_abs_dlogp", jnum(r->mean_abs));
	json_object_set_new(o, "max_abs_dlogp", jnum(r->max_abs));
	json_object_set_new(o, "ratio", json_pack("{s:o, s:o, s:o}", "mean", jnum(r->ratio_mean), "min",
	                                          jnum(r->ratio_min), "max", jnum(r->ratio_max)));
	json_object_set_new(o, "worst_token", json_integer(r->worst));
	if (routed) {
		json_object_set_new(o, "max_abs_dlogp_free_routing", jnum(r->max_abs_free));
		json_object_set_new(o, "mean_abs_dlogp_free_routing", jnum(r->mean_abs_free));
	}
	if (have_routes) {
		json_object_set_new(o, "routing_flips", json_integer(r->routing_flips));
		json_object_set_new(o, "routing_tokens", json_integer(r->routing_tokens));
	}
	json_object_set_new(o, "mismatch", mismatch_json(&r->mismatch));
	return o;
}

int hi3_replay_report_json(const hi3_replay_report *rep, const hi3_cond *c, const hi3_segment *s, char **text,
                           size_t *len, hi3_error *err)
{
	json_t *root = json_object(), *rows = json_array(), *ov, *part = hi3i_stage_part_json(c, s);
	hi3_replay_row all = {
		.tokens = rep->tokens, .mean_abs = rep->mean_abs, .max_abs = rep->max_abs,
		.ratio_mean = rep->ratio_mean, .ratio_min = rep->ratio_min, .ratio_max = rep->ratio_max,
		.worst = rep->worst_token, .mean_abs_free = rep->mean_abs_free, .max_abs_free = rep->max_abs_free,
		.routing_flips = rep->routing_flips, .routing_tokens = rep->routing_tokens, .mismatch = rep->mismatch,
	};

	for (int i = 0; i < rep->B; i++)
		json_array_append_new(rows, row_json(&rep->rows[i], i, rep->routing_recorded, rep->have_routes));
	ov = row_json(&all, -1, rep->routing_recorded, rep->have_routes);
	if (rep->tokens) {
		json_object_set_new(ov, "worst_row", json_integer(rep->worst_row));
		json_object_set_new(ov, "worst_token", json_integer(rep->worst_token));
	}
	json_object_set_new(ov, "empty_rows", json_integer(rep->empty_rows));
	json_object_set_new(root, "mode", json_string(rep->batched ? "batched" : "per-row"));
	json_object_set_new(root, "routing", json_string(rep->routing_recorded ? "recorded" : "free"));
	json_object_set_new(root, "rows", rows);
	json_object_set_new(root, "overall", ov);
	json_object_set_new(root, "seconds", json_real(rep->seconds));
	json_object_set_new(root, "tokens_per_s",
	                    json_real(rep->seconds > 0 ? (double)rep->tokens / rep->seconds : 0.0));
	if (part)
		json_object_set_new(root, "stage", part);
	return hi3i_json_text(root, JSON_INDENT(2), text, len, err);
}
