/*
 * segment.c -- the segment file (format hi3.segment): every row's generated
 * tokens and their rollout log-probs, packed in batch order.
 *
 *   tokens          (T) I64     row i's tokens are [cu_seqlens[i], cu_seqlens[i+1])
 *   logprobs        (T) F32     log-softmax at temperature 1 of the unmodified logits
 *   cu_seqlens      (B + 1) I64 0, then non-decreasing, ending at T
 *   stop_reason     (B) U8      0 unfinished, 1 stop token, 2 length
 *   routing_experts (T, n_moe, k) I16, routing_weights (T, n_moe, k) F32   (optional)
 * metadata: format, format_version, model_fingerprint, conditions_hash,
 * sampler, decode_mask, token_placement, routing_weights ("none": routing_weights holds NaN, the
 * engine did not report them).
 */
#include <string.h>
#include "format/format.h"

/* The checks a segment passes before it is used or written. */
static int check(const hi3_segment *s, const char *path, hi3_error *err)
{
	if (s->B < 1)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'cu_seqlens' has no rows", path);
	if (s->cu_seqlens[0] != 0 || s->cu_seqlens[s->B] != s->T)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'cu_seqlens' runs from %lld to %lld, expected 0 to "
		                     "%lld", path, (long long)s->cu_seqlens[0], (long long)s->cu_seqlens[s->B],
		                     (long long)s->T);
	for (int i = 0; i < s->B; i++)
		if (s->cu_seqlens[i + 1] < s->cu_seqlens[i])
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'cu_seqlens' decreases at row %d", path, i);
	return 0;
}

int hi3_segment_open(hi3_segment **out, const char *path, hi3_error *err)
{
	hi3_segment *s = hi3i_calloc(1, sizeof(*s), err);
	const hi3_tensor *tok, *lp, *cu, *sr, *re, *rw;

	*out = NULL;
	if (!s)
		return -1;
	if (hi3_st_open(&s->st, path, HI3_ST_READ, err) != 0 ||
	    hi3_st_expect_format(s->st, HI3_FORMAT_SEGMENT, err))
		goto fail;
	if (hi3_st_get(s->st, "tokens", HI3_I64, 1, (int64_t[]){-1}, &tok, err) ||
	    hi3_st_get(s->st, "logprobs", HI3_F32, 1, (int64_t[]){tok->shape[0]}, &lp, err) ||
	    hi3_st_get(s->st, "cu_seqlens", HI3_I64, 1, (int64_t[]){-1}, &cu, err))
		goto fail;
	s->T = tok->shape[0];
	s->B = (int)cu->shape[0] - 1;
	s->tokens = tok->data;
	s->logprobs = lp->data;
	s->cu_seqlens = cu->data;
	if (check(s, path, err) != 0 || hi3_st_get(s->st, "stop_reason", HI3_U8, 1, (int64_t[]){s->B}, &sr, err))
		goto fail;
	s->stop_reason = sr->data;
	re = hi3_st_find(s->st, "routing_experts");
	if (re) {
		if (hi3_st_get(s->st, "routing_experts", HI3_I16, 3, (int64_t[]){s->T, -1, -1}, &re, err) ||
		    hi3_st_get(s->st, "routing_weights", HI3_F32, 3, (int64_t[]){s->T, re->shape[1], re->shape[2]}, &rw,
		               err))
			goto fail;
		s->route_ids = re->data;
		s->route_w = rw->data;
		s->n_moe = (int)re->shape[1];
		s->k = (int)re->shape[2];
	}
	s->model_fingerprint = hi3_st_meta(s->st, "model_fingerprint");
	s->conditions_hash = hi3_st_meta(s->st, "conditions_hash");
	s->sampler = hi3_st_meta(s->st, "sampler");
	s->decode_mask = hi3_st_meta(s->st, "decode_mask");
	s->token_placement = hi3_st_meta(s->st, "token_placement");
	s->routing_weights = hi3_st_meta(s->st, "routing_weights");
	*out = s;
	return 0;
fail:
	hi3_segment_close(s);
	return -1;
}

void hi3_segment_close(hi3_segment *s)
{
	if (!s)
		return;
	hi3_st_close(s->st);
	free(s);
}

int hi3_segment_write(const hi3_segment *s, const char *path, hi3_error *err)
{
	int64_t sT[1] = {s->T}, sB1[1] = {s->B + 1}, sB[1] = {s->B}, sR[3] = {s->T, s->n_moe, s->k};
	const char *meta[][2] = {
		{"model_fingerprint", s->model_fingerprint}, {"conditions_hash", s->conditions_hash},
		{"sampler", s->sampler}, {"decode_mask", s->decode_mask}, {"token_placement", s->token_placement},
		{"routing_weights", s->routing_weights},
	};
	hi3_st_writer *w;
	int rc = -1;

	if (check(s, path, err) != 0)
		return -1;
	if (!(w = hi3i_stw_format(HI3_FORMAT_SEGMENT, meta, HI3_ARRAY_SIZE(meta))))
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	if (hi3_stw_add(w, "tokens", HI3_I64, 1, sT, s->tokens) || hi3_stw_add(w, "logprobs", HI3_F32, 1, sT, s->logprobs) ||
	    hi3_stw_add(w, "cu_seqlens", HI3_I64, 1, sB1, s->cu_seqlens) ||
	    hi3_stw_add(w, "stop_reason", HI3_U8, 1, sB, s->stop_reason) ||
	    (s->route_ids && (hi3_stw_add(w, "routing_experts", HI3_I16, 3, sR, s->route_ids) ||
	                      hi3_stw_add(w, "routing_weights", HI3_F32, 3, sR, s->route_w))))
		goto oom;
	rc = hi3_stw_write(w, path, err);
	hi3_stw_free(w);
	return rc;
oom:
	hi3_stw_free(w);
	return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
}
