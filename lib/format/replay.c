/*
 * replay.c -- the replay file (format hi3.replay): the teacher-forced
 * log-probs of a segment's tokens, aligned with the segment (the table
 * below, hi3-files(5)). dlogp, rows and positions (replay - rollout, the
 * token's row and position) come together, to join a token with routing,
 * traces and the conditions; replay --record-routing adds the routing of
 * every response token and every prompt token, row i's prompt tokens
 * being [prompt_cu_seqlens[i], prompt_cu_seqlens[i+1]) of the prompt
 * tensors. The replay of a trajectory writes its own kind (mode
 * "diffusion"): the SDE steps' log-probs.
 */
#include <stddef.h>
#include <string.h>
#include "format/format.h"

enum { T_, N_MOE, K_, P_, B_, N_DIMS };

#define F(x) (int)offsetof(hi3_replay_file, x)
static const struct hi3i_ftensor tensors[] = {
	{"logprobs", "F32", "T", 0, F(logprobs), -1},
	{"dlogp", "F32", "T", 1, F(dlogp), -1},
	{"rows", "I32", "T", 1, F(rows), -1},
	{"positions", "I64", "T", 1, F(positions), -1},
	{"routing_experts", "I16", "T,n_moe,k", 2, F(route_ids), -1},
	{"routing_weights", "F32", "T,n_moe,k", 2, F(route_w), -1},
	{"prompt_routing_experts", "I16", "P,n_moe,k", HI3I_FT_LATER, F(prompt_route_ids), -1},
	{"prompt_routing_weights", "F32", "P,n_moe,k", HI3I_FT_LATER, F(prompt_route_w), -1},
	{"prompt_cu_seqlens", "I64", "B+1", 2, F(prompt_cu_seqlens), -1},
	{0},
};
static const struct hi3i_fmeta meta[] = {
	{"model_fingerprint", "text", 0, F(model_fingerprint)},
	{"conditions_hash", "text", 0, F(conditions_hash)},
	{"segment_file", "text", 0, F(segment_file)},
	{"mode", "text", 0, F(mode)},
	{"routing", "text", 0, F(routing)},
	{0},
};
#undef F
const struct hi3i_format hi3i_format_replay = {
	HI3_FORMAT_REPLAY, "REPLAY", (const char *const[]){"T", "n_moe", "k", "P", "B", NULL}, tensors, meta, 0, 0,
};

/* A replay of a trajectory: the log-prob of each SDE step of each request. */
struct sde {
	const float *logp;            /* (B, K) */
	const int64_t *steps;         /* (K) */
};
static const struct hi3i_ftensor sde_tensors[] = {
	{"sde_logp", "F32", "B,K", 0, (int)offsetof(struct sde, logp), -1},
	{"sde_steps", "I64", "K", 0, (int)offsetof(struct sde, steps), -1},
	{0},
};
static const struct hi3i_fmeta sde_meta[] = {
	{"model_fingerprint", "text", 0, -1},
	{"conditions_hash", "text", 0, -1},
	{"trajectory_file", "text", 0, -1},
	{"mode", "diffusion", 0, -1},
	{0},
};
const struct hi3i_format hi3i_format_replay_sde = {
	HI3_FORMAT_REPLAY, "REPLAY", (const char *const[]){"B", "K", NULL}, sde_tensors, sde_meta, 0, 0,
};

int hi3_replay_file_open(hi3_replay_file **out, const char *path, hi3_error *err)
{
	hi3_replay_file *r = hi3i_calloc(1, sizeof(*r), err);
	int64_t dims[N_DIMS] = {-1, -1, -1, -1, -1};
	const hi3_tensor *pre, *prw;

	*out = NULL;
	if (!r)
		return -1;
	if (hi3i_codec_open(&hi3i_format_replay, path, HI3_ST_READ, r, dims, &r->st, err) != 0)
		goto fail;
	r->T = dims[T_];
	if (r->route_ids) {
		r->B = (int)dims[B_];
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
		dims[P_] = r->prompt_cu_seqlens[r->B];
		if (hi3i_codec_get(&hi3i_format_replay, r->st, &tensors[6], dims, &pre, err) ||
		    hi3i_codec_get(&hi3i_format_replay, r->st, &tensors[7], dims, &prw, err))
			goto fail;
		r->prompt_route_ids = pre->data;
		r->prompt_route_w = prw->data;
		r->n_moe = (int)dims[N_MOE];
		r->k = (int)dims[K_];
	}
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
	const int64_t dims[N_DIMS] = {r->T, r->n_moe, r->k, r->route_ids ? r->prompt_cu_seqlens[r->B] : 0, r->B};
	const char *m[][2] = {
		{"model_fingerprint", r->model_fingerprint}, {"conditions_hash", r->conditions_hash},
		{"segment_file", r->segment_file}, {"mode", r->mode}, {"routing", r->routing},
	};

	return hi3i_codec_write(&hi3i_format_replay, r, dims, m, HI3_ARRAY_SIZE(m), path, err);
}

int hi3i_replay_sde_write(const char *path, int B, int K, const float *sde_logp, const int64_t *sde_steps,
                          const char *fingerprint, const char *conditions_hash, const char *traj_file, hi3_error *err)
{
	const struct sde obj = {sde_logp, sde_steps};
	const int64_t dims[2] = {B, K};
	const char *m[][2] = {
		{"model_fingerprint", fingerprint}, {"conditions_hash", conditions_hash}, {"trajectory_file", traj_file},
		{"mode", "diffusion"},
	};

	return hi3i_codec_write(&hi3i_format_replay_sde, &obj, dims, m, HI3_ARRAY_SIZE(m), path, err);
}
