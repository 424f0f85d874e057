/*
 * segment.c -- the segment file (format hi3.segment): every row's generated
 * tokens and their rollout log-probs, packed in batch order (the table
 * below, hi3-files(5)). Row i's tokens are [cu_seqlens[i], cu_seqlens[i+1]),
 * 0 first, non-decreasing, T last; the rollout log-prob is log-softmax at
 * temperature 1 of the unmodified logits; stop_reason is 0 unfinished, 1
 * stop token, 2 length. routing_weights "none": routing_weights holds
 * NaN, the engine did not report them.
 */
#include <stddef.h>
#include <string.h>
#include "format/format.h"

enum { T_, B_, N_MOE, K_, N_DIMS };

#define F(x) (int)offsetof(hi3_segment, x)
static const struct hi3i_ftensor tensors[] = {
	{"tokens", "I64", "T", 0, F(tokens), -1},
	{"logprobs", "F32", "T", 0, F(logprobs), -1},
	{"cu_seqlens", "I64", "B+1", 0, F(cu_seqlens), -1},
	{"stop_reason", "U8", "B", 0, F(stop_reason), -1},
	{"routing_experts", "I16", "T,n_moe,k", 1, F(route_ids), -1},
	{"routing_weights", "F32", "T,n_moe,k", 1, F(route_w), -1},
	{0},
};
static const struct hi3i_fmeta meta[] = {
	{"model_fingerprint", "text", 0, F(model_fingerprint)},
	{"conditions_hash", "text", 0, F(conditions_hash)},
	{"sampler", "text", 0, F(sampler)},
	{"decode_mask", "text", 0, F(decode_mask)},
	{"token_placement", "text", 0, F(token_placement)},
	{"routing_weights", "text", 0, F(routing_weights)},
	{0},
};
#undef F
const struct hi3i_format hi3i_format_segment = {
	HI3_FORMAT_SEGMENT, "SEGMENT", (const char *const[]){"T", "B", "n_moe", "k", NULL}, tensors, meta, 0, 0,
};

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
	int64_t dims[N_DIMS] = {-1, -1, -1, -1};

	*out = NULL;
	if (!s)
		return -1;
	if (hi3i_codec_open(&hi3i_format_segment, path, HI3_ST_READ, s, dims, &s->st, err) != 0)
		goto fail;
	s->T = dims[T_];
	s->B = (int)dims[B_];
	s->n_moe = s->route_ids ? (int)dims[N_MOE] : 0;
	s->k = s->route_ids ? (int)dims[K_] : 0;
	if (check(s, path, err) != 0)
		goto fail;
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

int hi3i_segbuf_init(struct hi3i_segbuf *b, int B, const int64_t *lens, int n_moe, int k, hi3_error *err)
{
	int64_t T = 0;
	size_t per = (size_t)n_moe * (size_t)k;

	memset(b, 0, sizeof(*b));
	for (int i = 0; i < B; i++)
		T += lens[i];
	b->tokens = hi3i_malloc(sizeof(int64_t) * (size_t)(T + 1), err);
	b->logprobs = hi3i_malloc(sizeof(float) * (size_t)(T + 1), err);
	b->cu_seqlens = hi3i_malloc(sizeof(int64_t) * (size_t)(B + 1), err);
	b->stop_reason = hi3i_calloc((size_t)B + 1, 1, err);
	if (n_moe > 0) {
		b->route_ids = hi3i_malloc(sizeof(int16_t) * (size_t)(T + 1) * per, err);
		b->route_w = hi3i_malloc(sizeof(float) * (size_t)(T + 1) * per, err);
	}
	if (!b->tokens || !b->logprobs || !b->cu_seqlens || !b->stop_reason || (n_moe > 0 && (!b->route_ids || !b->route_w))) {
		hi3i_segbuf_release(b);
		return -1;
	}
	b->cu_seqlens[0] = 0;
	for (int i = 0; i < B; i++)
		b->cu_seqlens[i + 1] = b->cu_seqlens[i] + lens[i];
	b->s = (hi3_segment){
		.B = B, .T = T, .tokens = b->tokens, .logprobs = b->logprobs, .cu_seqlens = b->cu_seqlens,
		.stop_reason = b->stop_reason, .route_ids = b->route_ids, .route_w = b->route_w,
		.n_moe = n_moe > 0 ? n_moe : 0, .k = n_moe > 0 ? k : 0,
	};
	return 0;
}

void hi3i_segbuf_release(struct hi3i_segbuf *b)
{
	free(b->tokens), free(b->logprobs), free(b->cu_seqlens), free(b->stop_reason);
	free(b->route_ids), free(b->route_w);
	memset(b, 0, sizeof(*b));
}

int hi3_segment_write(const hi3_segment *s, const char *path, hi3_error *err)
{
	const int64_t dims[N_DIMS] = {s->T, s->B, s->n_moe, s->k};
	const char *m[][2] = {
		{"model_fingerprint", s->model_fingerprint}, {"conditions_hash", s->conditions_hash},
		{"sampler", s->sampler}, {"decode_mask", s->decode_mask}, {"token_placement", s->token_placement},
		{"routing_weights", s->routing_weights},
	};

	if (check(s, path, err) != 0)
		return -1;
	return hi3i_codec_write(&hi3i_format_segment, s, dims, m, HI3_ARRAY_SIZE(m), path, err);
}

void hi3_segment_hash(const hi3_segment *s, char out[17])
{
	uint64_t h = HI3_HASH_INIT;
	int64_t dims[2] = {s->B, s->T};

	h = hi3i_hash(h, dims, sizeof(dims));
	h = hi3i_hash(h, s->cu_seqlens, sizeof(int64_t) * (size_t)(s->B + 1));
	h = hi3i_hash(h, s->tokens, sizeof(int64_t) * (size_t)s->T);
	snprintf(out, 17, "%016llx", (unsigned long long)h);
}
