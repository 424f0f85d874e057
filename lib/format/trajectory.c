/*
 * trajectory.c -- the trajectory file (format hi3.trajectory, hi3-files(5)):
 * what diffusion-capture records of each request's denoising (the table
 * below). latents holds x_T (rounded to the latent dtype) first, then the
 * state after each step; sigmas the schedule, sigmas[0] = 1, sigmas[T] =
 * 0; timesteps 1000 sigmas[i], the embedders' input; sde_steps the SDE
 * steps, increasing, in [0, T); sde_logp the log-prob of latents[:, i + 1]
 * given latents[:, i]; x_T and sde_noise the noise as drawn (or read);
 * velocity (diffusion-capture --capture-velocity) each conditions row's
 * prediction before guidance. sde_kernel and logprob_reduce are written
 * for the sde sampler (absent: flow-grpo, mean), ablate only when the
 * capture restored an upstream defect.
 *
 * A capture's checkpoint (format hi3.diffusion-checkpoint) is a trajectory
 * file as well, with one more tensor, steps_done (1) I64: the steps whose
 * latents (and log-probs, velocities) are complete. It is mapped writable
 * and updated in place as the KV file is (format/kv.h): a step's payload,
 * a flush, then the commit word in one aligned 8-byte store, and a flush;
 * a kill at any point leaves the steps up to the last commit intact.
 *
 * A --noise file is read here too: any safetensors file with x_T
 * (B, C, h, w) F32 and, for SDE steps, sde_noise (B, K, C, h, w) F32 -- a
 * trajectory is one.
 */
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "format/format.h"
#include "format/trajectory.h"

enum { B_, T_, C_, H_, W_, K_, R_, N_DIMS };
static const char *const letters[] = {"B", "T", "C", "h", "w", "K", "R", NULL};

/* The checkpoint: the trajectory (first, so that its fields' offsets are
 * the trajectory's) and the commit word. */
struct ckpt {
	hi3_trajectory t;
	int64_t *done;
};

#define F(x) (int)offsetof(hi3_trajectory, x)
#define TRAJECTORY_TENSORS \
	{"latents", "F32 BF16 F16", "B,T+1,C,h,w", 0, F(latents), F(latent_dtype)}, \
	{"sigmas", "F32", "T+1", 0, F(sigmas), -1}, \
	{"timesteps", "F32", "T", 0, F(timesteps), -1}, \
	{"sde_steps", "I64", "K", 0, F(sde_steps), -1}, \
	{"sde_logp", "F32", "B,K", 0, F(sde_logp), -1}, \
	{"x_T", "F32", "B,C,h,w", 0, F(x_T), -1}, \
	{"sde_noise", "F32", "B,K,C,h,w", 0, F(sde_noise), -1}, \
	{"velocity", "F32", "T,R,C,h,w", HI3I_FT_LATER, F(velocity), -1}
enum { VELOCITY = 7 };
static const struct hi3i_ftensor tensors[] = {TRAJECTORY_TENSORS, {0}};
static const struct hi3i_ftensor ckpt_tensors[] = {
	TRAJECTORY_TENSORS, {"steps_done", "I64", "1", 0, (int)offsetof(struct ckpt, done), -1}, {0},
};
static const struct hi3i_fmeta meta[] = {
	{"model_fingerprint", "text", 0, F(model_fingerprint)},
	{"conditions_hash", "text", 0, F(conditions_hash)},
	{"sampler", "euler|sde", 0, F(sampler)},
	{"sde_kernel", "flow-grpo|cps|dance-grpo", 0, F(sde_kernel)},
	{"logprob_reduce", "mean|sum", 0, F(logprob_reduce)},
	{"eta", "number", 1, -1},
	{"guidance", "number", 1, -1},
	{"flow_shift", "number", 1, -1},
	{"steps", "int", 0, -1},
	{"latent_dtype", "f32|bf16|f16", 1, -1},
	{"kv_reuse", "on|off", 0, -1},
	{"cfg_dtype", "text", 0, F(cfg_dtype)},
	{"ablate", "pos-pad|rope-pad|rope-1d|eoi", 0, F(ablate)},
	{"variant", "text", 0, F(variant)},
	{"noise", "text", 0, F(noise)},
	{"rows", "int", 1, -1},
	{"requests", "text", 0, F(requests)},
	{"seeds", "text", 0, F(seeds)},
	{0},
};
#undef F
const struct hi3i_format hi3i_format_trajectory = {HI3_FORMAT_TRAJECTORY, "TRAJECTORY", letters, tensors, meta, 0, 0};
const struct hi3i_format hi3i_format_diffusion_checkpoint = {HI3_FORMAT_DIFFUSION_CHECKPOINT, "DIFFUSION CHECKPOINT",
                                                             letters, ckpt_tensors, meta, 0, 1};

/* The --noise file: any safetensors file with these (a trajectory is one). */
static const struct hi3i_ftensor noise_tensors[] = {
	{"x_T", "F32", "B,C,h,w", HI3I_FT_LATER, -1, -1},
	{"sde_noise", "F32", "B,K,C,h,w", HI3I_FT_LATER, -1, -1},
	{0},
};
const struct hi3i_format hi3i_format_noise = {NULL, "TRAJECTORY", letters, noise_tensors, (const struct hi3i_fmeta[]){{0}}, 0, 0};

static const char *latent_dtype_name(hi3_dtype dt)
{
	return dt == HI3_BF16 ? "bf16" : dt == HI3_F16 ? "f16" : "f32";
}

/* What a trajectory must satisfy to be used or written. */
static int check(const hi3_trajectory *t, const char *path, hi3_error *err)
{
	if (t->B < 1 || t->T < 1 || t->K < 0 || t->K > t->T || t->C < 1 || t->h < 1 || t->w < 1 || t->R < t->B ||
	    t->R % t->B)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: dimensions B %d, R %d, T %d, K %d, C %d, h %d, w %d do not "
		                     "make a trajectory", path, t->B, t->R, t->T, t->K, t->C, t->h, t->w);
	for (int k = 0; k < t->K; k++)
		if (t->sde_steps[k] < 0 || t->sde_steps[k] >= t->T || (k && t->sde_steps[k] <= t->sde_steps[k - 1]))
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'sde_steps': entry %d is %lld, expected an "
			                     "increasing step index in [0, %d)", path, k, (long long)t->sde_steps[k], t->T);
	if (t->sampler && strcmp(t->sampler, "euler") && strcmp(t->sampler, "sde"))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: __metadata__ 'sampler': expected euler or sde, found '%s'",
		                     path, t->sampler);
	if (t->sampler && !strcmp(t->sampler, "euler") && t->K)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: sampler euler with %d SDE steps", path, t->K);
	return 0;
}

/* A trajectory of format f (the finished file, or a capture's checkpoint,
 * whose obj has the commit word after the trajectory). */
static int open_as(const struct hi3i_format *f, hi3_trajectory **out, const char *path, int flags, hi3_error *err)
{
	hi3_trajectory *t = hi3i_calloc(1, f == &hi3i_format_trajectory ? sizeof(*t) : sizeof(struct ckpt), err);
	int64_t dims[N_DIMS] = {-1, -1, -1, -1, -1, -1, -1}, x;
	const hi3_tensor *vel;
	const char *v;

	*out = NULL;
	if (!t)
		return -1;
	if (hi3i_codec_open(f, path, flags, t, dims, &t->st, err))
		goto fail;
	v = hi3_st_meta(t->st, "latent_dtype");
	if (strcmp(v, latent_dtype_name(t->latent_dtype))) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'latents': dtype %s, but __metadata__ 'latent_dtype' is '%s'",
		              path, hi3_dtype_name(t->latent_dtype), v);
		goto fail;
	}
	if (dims[B_] > INT32_MAX || dims[T_] < 1 || dims[T_] >= INT32_MAX || dims[C_] > INT32_MAX || dims[H_] > 65536 ||
	    dims[W_] > 65536) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'latents': shape (B, T + 1, C, h, w) with T at least 1", path);
		goto fail;
	}
	t->B = (int)dims[B_];
	t->T = (int)dims[T_];
	t->C = (int)dims[C_];
	t->h = (int)dims[H_];
	t->w = (int)dims[W_];
	t->K = (int)HI3_MIN(dims[K_], (int64_t)INT32_MAX);
	if (hi3i_parse_i64(hi3_st_meta(t->st, "rows"), 1, INT32_MAX, &x) != 0) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: __metadata__ 'rows': expected a positive integer", path);
		goto fail;
	}
	t->R = (int)(dims[R_] = x);
	if (hi3_st_find(t->st, "velocity")) {
		if (hi3i_codec_get(f, t->st, &f->t[VELOCITY], dims, &vel, err))
			goto fail;
		t->velocity = vel->data;
	}
	v = hi3_st_meta(t->st, "kv_reuse");
	t->kv_reuse = v && !strcmp(v, "on");
	hi3i_parse_f64(hi3_st_meta(t->st, "eta"), &t->eta);
	hi3i_parse_f64(hi3_st_meta(t->st, "guidance"), &t->guidance);
	hi3i_parse_f64(hi3_st_meta(t->st, "flow_shift"), &t->flow_shift);
	if (check(t, path, err))
		goto fail;
	*out = t;
	return 0;
fail:
	hi3_trajectory_close(t);
	return -1;
}

int hi3_trajectory_open(hi3_trajectory **out, const char *path, hi3_error *err)
{
	return open_as(&hi3i_format_trajectory, out, path, HI3_ST_READ, err);
}

void hi3_trajectory_close(hi3_trajectory *t)
{
	if (!t)
		return;
	hi3_st_close(t->st);
	free(t);
}

float hi3_trajectory_latent(const hi3_trajectory *t, size_t i)
{
	switch (t->latent_dtype) {
	case HI3_BF16: return hi3_bf16_to_f32(((const uint16_t *)t->latents)[i]);
	case HI3_F16: return hi3_f16_to_f32(((const uint16_t *)t->latents)[i]);
	default: return ((const float *)t->latents)[i];
	}
}

/* Write obj (a trajectory, or a checkpoint) as format f. */
static int write_as(const struct hi3i_format *f, const void *obj, const char *path, hi3_error *err)
{
	const hi3_trajectory *t = obj;
	const int64_t dims[N_DIMS] = {t->B, t->T, t->C, t->h, t->w, t->K, t->R};
	char eta[40], g[40], sh[40], steps[16], rows[16];
	const char *m[][2] = {
		{"model_fingerprint", t->model_fingerprint}, {"conditions_hash", t->conditions_hash},
		{"sampler", t->sampler}, {"sde_kernel", t->sde_kernel}, {"logprob_reduce", t->logprob_reduce},
		{"eta", eta}, {"guidance", g}, {"flow_shift", sh}, {"steps", steps},
		{"latent_dtype", latent_dtype_name(t->latent_dtype)}, {"kv_reuse", t->kv_reuse ? "on" : "off"},
		{"cfg_dtype", t->cfg_dtype}, {"ablate", t->ablate}, {"variant", t->variant}, {"noise", t->noise},
		{"rows", rows}, {"requests", t->requests}, {"seeds", t->seeds},
	};

	if (check(t, path, err))
		return -1;
	snprintf(eta, sizeof(eta), "%.17g", t->eta);
	snprintf(g, sizeof(g), "%.17g", t->guidance);
	snprintf(sh, sizeof(sh), "%.17g", t->flow_shift);
	snprintf(steps, sizeof(steps), "%d", t->T);
	snprintf(rows, sizeof(rows), "%d", t->R);
	return hi3i_codec_write(f, obj, dims, m, HI3_ARRAY_SIZE(m), path, err);
}

int hi3_trajectory_write(const hi3_trajectory *t, const char *path, hi3_error *err)
{
	return write_as(&hi3i_format_trajectory, t, path, err);
}

/* ------------------------------------------------------------ checkpoint */

int hi3i_traj_ckpt_create(const char *path, const hi3_trajectory *t, hi3_error *err)
{
	int64_t zero = 0;
	struct ckpt c = {*t, &zero};

	return write_as(&hi3i_format_diffusion_checkpoint, &c, path, err);
}

int hi3i_traj_ckpt_open(hi3_trajectory **out, int64_t **done, const char *path, hi3_error *err)
{
	if (open_as(&hi3i_format_diffusion_checkpoint, out, path, HI3_ST_RDWR, err))
		return -1;
	*done = ((struct ckpt *)*out)->done;
	if (hi3i_st_lock((*out)->st, err))
		goto fail;
	if (**done < 0 || **done > (*out)->T) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'steps_done': %lld, expected 0 to %d steps", path,
		              (long long)**done, (*out)->T);
		goto fail;
	}
	return 0;
fail:
	hi3_trajectory_close(*out);
	*out = NULL;
	return -1;
}

int hi3i_traj_ckpt_commit(hi3_trajectory *t, int64_t *done, int64_t steps, hi3_error *err)
{
	const hi3_tensor *first = hi3_st_at(t->st, 0);

	/* the step's payload, then its commit word */
	if (first && hi3_st_sync(t->st, first->data, hi3_st_file_size(t->st) - 8 - hi3_st_header_size(t->st), err))
		return -1;
	atomic_thread_fence(memory_order_seq_cst);
	__atomic_store_n(done, steps, __ATOMIC_SEQ_CST);
	return hi3_st_sync(t->st, done, sizeof(*done), err);
}

int hi3i_noise_read(const char *path, int B, int C, int h, int w, int K, float *x_T, float *sde_noise,
                    hi3_error *err)
{
	int64_t dims[N_DIMS] = {B, -1, C, h, w, K, -1};
	hi3_st *st = NULL;
	const hi3_tensor *xt, *sn;
	int rc = -1;

	if (hi3i_codec_open(&hi3i_format_noise, path, HI3_ST_READ, NULL, dims, &st, err) ||
	    hi3i_codec_get(&hi3i_format_noise, st, &noise_tensors[0], dims, &xt, err))
		goto out;
	memcpy(x_T, xt->data, xt->nbytes);
	if (K > 0) {
		if (hi3i_codec_get(&hi3i_format_noise, st, &noise_tensors[1], dims, &sn, err))
			goto out;
		memcpy(sde_noise, sn->data, sn->nbytes);
	}
	rc = 0;
out:
	if (rc && err->status != HI3_ERR_RUNTIME)
		err->status = HI3_ERR_INPUT;
	hi3_st_close(st);
	return rc;
}
