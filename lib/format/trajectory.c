/*
 * trajectory.c -- the trajectory file (format hi3.trajectory, hi3-files(5)):
 * what diffusion-capture records of each request's denoising.
 *
 *   latents    (B, T + 1, C, h, w) latent dtype: x_T (rounded to it) first,
 *              then the state after each step
 *   sigmas     (T + 1) F32      the schedule, sigmas[0] = 1, sigmas[T] = 0
 *   timesteps  (T) F32          1000 sigmas[i], the embedders' input
 *   sde_steps  (K) I64          the SDE steps, increasing, in [0, T)
 *   sde_logp   (B, K) F32       log-prob of latents[:, i + 1] given latents[:, i]
 *   x_T        (B, C, h, w) F32 the initial noise as drawn (or read)
 *   sde_noise  (B, K, C, h, w) F32  the noise of each SDE step
 *   velocity   (T, R, C, h, w) F32  each conditions row's prediction before
 *              guidance (optional: diffusion-capture --capture-velocity)
 * metadata: format, format_version, model_fingerprint, conditions_hash,
 * sampler (euler | sde), eta, guidance, flow_shift, steps, latent_dtype,
 * kv_reuse (on | off), cfg_dtype, variant, noise, rows (R), requests, seeds.
 *
 * A --noise file is read here too: any safetensors file with x_T
 * (B, C, h, w) F32 and, for SDE steps, sde_noise (B, K, C, h, w) F32 -- a
 * trajectory is one.
 */
#include <stdlib.h>
#include <string.h>
#include "format/format.h"

static const char *const dtype_names[][2] = {{"f32", "F32"}, {"bf16", "BF16"}, {"f16", "F16"}};

static int latent_dtype_of(const char *s, hi3_dtype *dt)
{
	static const hi3_dtype dts[] = {HI3_F32, HI3_BF16, HI3_F16};

	for (size_t i = 0; i < HI3_ARRAY_SIZE(dtype_names); i++)
		if (s && !strcmp(s, dtype_names[i][0])) {
			*dt = dts[i];
			return 0;
		}
	return -1;
}

static const char *latent_dtype_name(hi3_dtype dt)
{
	return dt == HI3_BF16 ? "bf16" : dt == HI3_F16 ? "f16" : "f32";
}

static int meta_double(const hi3_st *st, const char *path, const char *key, double *out, hi3_error *err)
{
	const char *v = hi3_st_meta(st, key);

	if (!v || hi3i_parse_f64(v, out) != 0)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: __metadata__ '%s': expected a number, found %s%s%s", path, key,
		                     v ? "'" : "", v ? v : "nothing", v ? "'" : "");
	return 0;
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

int hi3_trajectory_open(hi3_trajectory **out, const char *path, hi3_error *err)
{
	hi3_trajectory *t = hi3i_calloc(1, sizeof(*t), err);
	const hi3_tensor *lat, *sg, *ts, *ss, *lp, *xt, *sn, *vel;
	const char *v;
	int64_t x;

	*out = NULL;
	if (!t)
		return -1;
	if (hi3_st_open(&t->st, path, HI3_ST_READ, err) || hi3_st_expect_format(t->st, HI3_FORMAT_TRAJECTORY, err))
		goto fail;
	if (latent_dtype_of(hi3_st_meta(t->st, "latent_dtype"), &t->latent_dtype) != 0) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: __metadata__ 'latent_dtype': expected f32, bf16 or f16", path);
		goto fail;
	}
	if (hi3_st_get(t->st, "latents", t->latent_dtype, 5, (int64_t[]){-1, -1, -1, -1, -1}, &lat, err))
		goto fail;
	if (lat->shape[0] > INT32_MAX || lat->shape[1] < 2 || lat->shape[1] > INT32_MAX || lat->shape[2] > INT32_MAX ||
	    lat->shape[3] > 65536 || lat->shape[4] > 65536) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'latents': shape (B, T + 1, C, h, w) with T at least 1", path);
		goto fail;
	}
	t->B = (int)lat->shape[0];
	t->T = (int)lat->shape[1] - 1;
	t->C = (int)lat->shape[2];
	t->h = (int)lat->shape[3];
	t->w = (int)lat->shape[4];
	t->latents = lat->data;
	if (hi3_st_get(t->st, "sigmas", HI3_F32, 1, (int64_t[]){t->T + 1}, &sg, err) ||
	    hi3_st_get(t->st, "timesteps", HI3_F32, 1, (int64_t[]){t->T}, &ts, err) ||
	    hi3_st_get(t->st, "sde_steps", HI3_I64, 1, (int64_t[]){-1}, &ss, err))
		goto fail;
	t->K = (int)HI3_MIN(ss->shape[0], (int64_t)INT32_MAX);
	if (hi3_st_get(t->st, "sde_logp", HI3_F32, 2, (int64_t[]){t->B, t->K}, &lp, err) ||
	    hi3_st_get(t->st, "x_T", HI3_F32, 4, (int64_t[]){t->B, t->C, t->h, t->w}, &xt, err) ||
	    hi3_st_get(t->st, "sde_noise", HI3_F32, 5, (int64_t[]){t->B, t->K, t->C, t->h, t->w}, &sn, err))
		goto fail;
	v = hi3_st_meta(t->st, "rows");
	if (!v || hi3i_parse_i64(v, 1, INT32_MAX, &x) != 0) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: __metadata__ 'rows': expected a positive integer", path);
		goto fail;
	}
	t->R = (int)x;
	if (hi3_st_find(t->st, "velocity") &&
	    hi3_st_get(t->st, "velocity", HI3_F32, 5, (int64_t[]){t->T, t->R, t->C, t->h, t->w}, &vel, err))
		goto fail;
	t->velocity = hi3_st_find(t->st, "velocity") ? vel->data : NULL;
	t->sigmas = sg->data;
	t->timesteps = ts->data;
	t->sde_steps = ss->data;
	t->sde_logp = lp->data;
	t->x_T = xt->data;
	t->sde_noise = sn->data;
	t->sampler = hi3_st_meta(t->st, "sampler");
	t->cfg_dtype = hi3_st_meta(t->st, "cfg_dtype");
	t->variant = hi3_st_meta(t->st, "variant");
	t->noise = hi3_st_meta(t->st, "noise");
	t->model_fingerprint = hi3_st_meta(t->st, "model_fingerprint");
	t->conditions_hash = hi3_st_meta(t->st, "conditions_hash");
	t->requests = hi3_st_meta(t->st, "requests");
	t->seeds = hi3_st_meta(t->st, "seeds");
	v = hi3_st_meta(t->st, "kv_reuse");
	t->kv_reuse = v && !strcmp(v, "on");
	if (meta_double(t->st, path, "eta", &t->eta, err) || meta_double(t->st, path, "guidance", &t->guidance, err) ||
	    meta_double(t->st, path, "flow_shift", &t->flow_shift, err) || check(t, path, err))
		goto fail;
	*out = t;
	return 0;
fail:
	hi3_trajectory_close(t);
	return -1;
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

int hi3_trajectory_write(const hi3_trajectory *t, const char *path, hi3_error *err)
{
	const int64_t s_lat[5] = {t->B, t->T + 1, t->C, t->h, t->w}, s_sg[1] = {t->T + 1}, s_ts[1] = {t->T};
	const int64_t s_ss[1] = {t->K}, s_lp[2] = {t->B, t->K}, s_xt[4] = {t->B, t->C, t->h, t->w};
	const int64_t s_sn[5] = {t->B, t->K, t->C, t->h, t->w}, s_v[5] = {t->T, t->R, t->C, t->h, t->w};
	char eta[40], g[40], sh[40], steps[16], rows[16];
	const char *meta[][2] = {
		{"model_fingerprint", t->model_fingerprint}, {"conditions_hash", t->conditions_hash},
		{"sampler", t->sampler}, {"eta", eta}, {"guidance", g}, {"flow_shift", sh}, {"steps", steps},
		{"latent_dtype", latent_dtype_name(t->latent_dtype)}, {"kv_reuse", t->kv_reuse ? "on" : "off"},
		{"cfg_dtype", t->cfg_dtype}, {"variant", t->variant}, {"noise", t->noise}, {"rows", rows},
		{"requests", t->requests}, {"seeds", t->seeds},
	};
	hi3_st_writer *w;
	int rc;

	if (check(t, path, err))
		return -1;
	snprintf(eta, sizeof(eta), "%.17g", t->eta);
	snprintf(g, sizeof(g), "%.17g", t->guidance);
	snprintf(sh, sizeof(sh), "%.17g", t->flow_shift);
	snprintf(steps, sizeof(steps), "%d", t->T);
	snprintf(rows, sizeof(rows), "%d", t->R);
	if (!(w = hi3i_stw_format(HI3_FORMAT_TRAJECTORY, meta, HI3_ARRAY_SIZE(meta))))
		goto oom;
	if (hi3_stw_add(w, "latents", t->latent_dtype, 5, s_lat, t->latents) ||
	    hi3_stw_add(w, "sigmas", HI3_F32, 1, s_sg, t->sigmas) ||
	    hi3_stw_add(w, "timesteps", HI3_F32, 1, s_ts, t->timesteps) ||
	    hi3_stw_add(w, "sde_steps", HI3_I64, 1, s_ss, t->sde_steps) ||
	    hi3_stw_add(w, "sde_logp", HI3_F32, 2, s_lp, t->sde_logp) ||
	    hi3_stw_add(w, "x_T", HI3_F32, 4, s_xt, t->x_T) ||
	    hi3_stw_add(w, "sde_noise", HI3_F32, 5, s_sn, t->sde_noise) ||
	    (t->velocity && hi3_stw_add(w, "velocity", HI3_F32, 5, s_v, t->velocity)))
		goto oom;
	rc = hi3_stw_write(w, path, err);
	hi3_stw_free(w);
	return rc;
oom:
	hi3_stw_free(w);
	return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
}

int hi3i_noise_read(const char *path, int B, int C, int h, int w, int K, float *x_T, float *sde_noise,
                    hi3_error *err)
{
	hi3_st *st = NULL;
	const hi3_tensor *xt, *sn;
	int rc = -1;

	if (hi3_st_open(&st, path, HI3_ST_READ, err) ||
	    hi3_st_get(st, "x_T", HI3_F32, 4, (int64_t[]){B, C, h, w}, &xt, err))
		goto out;
	memcpy(x_T, xt->data, xt->nbytes);
	if (K > 0) {
		if (hi3_st_get(st, "sde_noise", HI3_F32, 5, (int64_t[]){B, K, C, h, w}, &sn, err))
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
