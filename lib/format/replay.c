/*
 * replay.c -- the replay file (format hi3.replay): the teacher-forced
 * log-probs of a segment's tokens, aligned with the segment.
 *
 *   logprobs                (T) F32
 *   dlogp                   (T) F32  replay - rollout, rows (T) I32, positions (T) I64    (optional
 *                           together: per-token joins with routing, traces, conditions)
 *   routing_experts         (T, n_moe, k) I16, routing_weights (T, n_moe, k) F32    (optional, with
 *   prompt_routing_experts  (P, n_moe, k) I16, prompt_routing_weights F32          replay --record-routing)
 *   prompt_cu_seqlens       (B + 1) I64: row i's prompt tokens are [cu[i], cu[i+1]) of the prompt tensors
 * metadata: format, format_version, model_fingerprint, conditions_hash,
 * segment_file, mode (per-row | batched), routing (free | recorded | recorded+weights).
 */
#include <string.h>
#include "format/format.h"

int hi3_replay_file_open(hi3_replay_file **out, const char *path, hi3_error *err)
{
	hi3_replay_file *r = hi3i_calloc(1, sizeof(*r), err);
	const hi3_tensor *lp, *re, *rw, *pre, *prw, *pcu;

	*out = NULL;
	if (!r)
		return -1;
	if (hi3_st_open(&r->st, path, HI3_ST_READ, err) != 0 || hi3_st_expect_format(r->st, HI3_FORMAT_REPLAY, err) ||
	    hi3_st_get(r->st, "logprobs", HI3_F32, 1, (int64_t[]){-1}, &lp, err))
		goto fail;
	r->T = lp->shape[0];
	r->logprobs = lp->data;
	if (hi3_st_find(r->st, "dlogp")) {
		const hi3_tensor *d, *rr, *ps;
		if (hi3_st_get(r->st, "dlogp", HI3_F32, 1, lp->shape, &d, err) ||
		    hi3_st_get(r->st, "rows", HI3_I32, 1, lp->shape, &rr, err) ||
		    hi3_st_get(r->st, "positions", HI3_I64, 1, lp->shape, &ps, err))
			goto fail;
		r->dlogp = d->data;
		r->rows = rr->data;
		r->positions = ps->data;
	}
	if (hi3_st_find(r->st, "routing_experts")) {
		if (hi3_st_get(r->st, "routing_experts", HI3_I16, 3, (int64_t[]){r->T, -1, -1}, &re, err) ||
		    hi3_st_get(r->st, "routing_weights", HI3_F32, 3, re->shape, &rw, err) ||
		    hi3_st_get(r->st, "prompt_cu_seqlens", HI3_I64, 1, (int64_t[]){-1}, &pcu, err))
			goto fail;
		r->B = (int)pcu->shape[0] - 1;
		r->prompt_cu_seqlens = pcu->data;
		if (r->B < 1 || r->prompt_cu_seqlens[0] != 0) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'prompt_cu_seqlens' must start at 0 and have a row",
			              path);
			goto fail;
		}
		for (int i = 0; i < r->B; i++)
			if (r->prompt_cu_seqlens[i + 1] < r->prompt_cu_seqlens[i]) {
				hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'prompt_cu_seqlens' decreases at row %d", path,
				              i);
				goto fail;
			}
		if (hi3_st_get(r->st, "prompt_routing_experts", HI3_I16, 3,
		               (int64_t[]){r->prompt_cu_seqlens[r->B], re->shape[1], re->shape[2]}, &pre, err) ||
		    hi3_st_get(r->st, "prompt_routing_weights", HI3_F32, 3, pre->shape, &prw, err))
			goto fail;
		r->n_moe = (int)re->shape[1];
		r->k = (int)re->shape[2];
		r->route_ids = re->data;
		r->route_w = rw->data;
		r->prompt_route_ids = pre->data;
		r->prompt_route_w = prw->data;
	}
	r->model_fingerprint = hi3_st_meta(r->st, "model_fingerprint");
	r->conditions_hash = hi3_st_meta(r->st, "conditions_hash");
	r->segment_file = hi3_st_meta(r->st, "segment_file");
	r->mode = hi3_st_meta(r->st, "mode");
	r->routing = hi3_st_meta(r->st, "routing");
	*out = r;
	return 0;
fail:
	hi3_replay_file_close(r);
	return -1;
}

void hi3_replay_file_close(hi3_replay_file *r)
{
	if (!r)
		return;
	hi3_st_close(r->st);
	free(r);
}

int hi3_replay_file_write(const hi3_replay_file *r, const char *path, hi3_error *err)
{
	const int64_t P = r->route_ids ? r->prompt_cu_seqlens[r->B] : 0;
	int64_t sT[1] = {r->T}, sr[3] = {r->T, r->n_moe, r->k}, sp[3] = {P, r->n_moe, r->k}, sc[1] = {r->B + 1};
	const char *meta[][2] = {
		{"model_fingerprint", r->model_fingerprint}, {"conditions_hash", r->conditions_hash},
		{"segment_file", r->segment_file}, {"mode", r->mode}, {"routing", r->routing},
	};
	hi3_st_writer *w = hi3i_stw_format(HI3_FORMAT_REPLAY, meta, HI3_ARRAY_SIZE(meta));
	int rc;

	if (!w)
		goto oom;
	if (hi3_stw_add(w, "logprobs", HI3_F32, 1, sT, r->logprobs) ||
	    (r->dlogp && (hi3_stw_add(w, "dlogp", HI3_F32, 1, sT, r->dlogp) ||
	                  hi3_stw_add(w, "rows", HI3_I32, 1, sT, r->rows) ||
	                  hi3_stw_add(w, "positions", HI3_I64, 1, sT, r->positions))) ||
	    (r->route_ids && (hi3_stw_add(w, "routing_experts", HI3_I16, 3, sr, r->route_ids) ||
	                      hi3_stw_add(w, "routing_weights", HI3_F32, 3, sr, r->route_w) ||
	                      hi3_stw_add(w, "prompt_routing_experts", HI3_I16, 3, sp, r->prompt_route_ids) ||
	                      hi3_stw_add(w, "prompt_routing_weights", HI3_F32, 3, sp, r->prompt_route_w) ||
	                      hi3_stw_add(w, "prompt_cu_seqlens", HI3_I64, 1, sc, r->prompt_cu_seqlens))))
		goto oom;
	rc = hi3_stw_write(w, path, err);
	hi3_stw_free(w);
	return rc;
oom:
	hi3_stw_free(w);
	return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
}

int hi3i_replay_sde_write(const char *path, int B, int K, const float *sde_logp, const int64_t *sde_steps,
                          const char *fingerprint, const char *conditions_hash, const char *traj_file, hi3_error *err)
{
	const char *meta[][2] = {
		{"model_fingerprint", fingerprint}, {"conditions_hash", conditions_hash}, {"trajectory_file", traj_file},
		{"mode", "diffusion"},
	};
	hi3_st_writer *w = hi3i_stw_format(HI3_FORMAT_REPLAY, meta, HI3_ARRAY_SIZE(meta));
	int rc;

	if (!w || hi3_stw_add(w, "sde_logp", HI3_F32, 2, (const int64_t[]){B, K}, sde_logp) ||
	    hi3_stw_add(w, "sde_steps", HI3_I64, 1, (const int64_t[]){K}, sde_steps)) {
		hi3_stw_free(w);
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	}
	rc = hi3_stw_write(w, path, err);
	hi3_stw_free(w);
	return rc;
}
