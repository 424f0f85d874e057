/*
 * diffusion-replay.c -- replay of a trajectory (hi3-batching(7), IMAGES AND
 * DIFFUSION), what a trainer recomputes: for every SDE step i, the velocity
 * at the recorded x_i by a stateless forward over the whole sequence (no
 * cache, as a trainer's training step runs it), guidance as at capture, the
 * transition mean, and the log-prob of the recorded x_{i+1}; compared with
 * the log-probs the capture recorded.
 *
 * Shapes: B requests, R rows, n = C h w elements of one latent, K SDE steps.
 */
#include <jansson.h>
#include <math.h>
#include <string.h>
#include "format/format.h"
#include "format/provenance.h"
#include "model/model.h"
#include "stage/diffusion.h"
#include "stage/files.h"

static int dtype_of(const char *s, hi3_dtype *dt)
{
	if (!s || !strcmp(s, "f32"))
		*dt = HI3_F32;
	else if (!strcmp(s, "bf16"))
		*dt = HI3_BF16;
	else if (!strcmp(s, "f16"))
		*dt = HI3_F16;
	else
		return -1;
	return 0;
}

void hi3_diffusion_replay_report_release(hi3_diffusion_replay_report *rep)
{
	free(rep->rows);
	memset(rep, 0, sizeof(*rep));
}

/* The trajectory's kernel, reduction and ablation, from its metadata
 * (absent: flow-grpo, mean, none; the format module checked the names). */
static int recorded(const hi3_trajectory *t, const char *path, hi3_diffusion_replay_report *rep, hi3_error *err)
{
	rep->sde_kernel = t->sde_kernel ? hi3_sde_kernel_of(t->sde_kernel) : HI3_SDE_FLOW_GRPO;
	rep->logprob_reduce = t->logprob_reduce ? hi3_logprob_reduce_of(t->logprob_reduce) : HI3_LOGP_MEAN;
	rep->ablate = t->ablate ? hi3_ablation_of(t->ablate) : HI3_ABLATE_NONE;
	if (rep->sde_kernel < 0 || rep->logprob_reduce < 0 || rep->ablate < 0 ||
	    (rep->ablate && !hi3i_diffusion_defects(rep->ablate)))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: __metadata__ sde_kernel '%s', logprob_reduce '%s', ablate "
		                     "'%s': not all known", path, t->sde_kernel ? t->sde_kernel : "",
		                     t->logprob_reduce ? t->logprob_reduce : "", t->ablate ? t->ablate : "");
	if (t->K && !(t->eta > 0.0) && rep->sde_kernel != HI3_SDE_CPS)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: %d SDE steps of the %s kernel with eta %g", path, t->K,
		                     hi3_sde_kernel_name(rep->sde_kernel), t->eta);
	return 0;
}

int hi3_diffusion_replay(hi3_model *m, const hi3_cond *c, const hi3_trajectory *t,
                         const hi3_diffusion_replay_opts *o, float *logp, hi3_diffusion_replay_report *rep,
                         hi3_error *err)
{
	const char *path = t->st ? hi3_st_path(t->st) : "the trajectory";
	struct hi3i_dn_opts dno = {0};
	struct hi3i_denoiser *dn = NULL;
	struct hi3i_dn_geometry g;
	const size_t n = (size_t)t->C * t->h * t->w;
	float *x = NULL, *xn = NULL, *v = NULL, *vg = NULL, *mu = NULL;  /* (B n), (B n), (R n), (B n), (n) */
	hi3_dtype cfg_dt;
	double t0 = hi3i_now();
	int rows, rc = -1, cached = 0;

	memset(rep, 0, sizeof(*rep));
	if (hi3i_check_made_by(path, t->model_fingerprint, hi3i_model_facts(m), err) ||
	    hi3i_check_made_from(path, t->conditions_hash, c, err) || recorded(t, path, rep, err))
		return -1;
	if (dtype_of(t->cfg_dtype, &cfg_dt))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: __metadata__ 'cfg_dtype': expected f32, bf16 or f16, found "
		                     "'%s'", path, t->cfg_dtype);
	/* the capture's path: the cache of its step 0, then KV reuse */
	rep->as_captured = o->as_captured;
	dno.kv_reuse = o->as_captured && t->kv_reuse;
	dno.defects = hi3i_diffusion_defects(rep->ablate);
	if (hi3i_diffusion_denoiser(&dn, m, c, &dno, err))
		return -1;
	hi3i_denoiser_geometry(dn, &g);
	if (g.B != t->B || g.R != t->R || g.Z != t->C || g.h != t->h || g.w != t->w) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: %d requests (%d rows) of %d x %d x %d latents, but the conditions "
		              "give %d requests (%d rows) of %d x %d x %d", path, t->B, t->R, t->C, t->h, t->w, g.B, g.R, g.Z,
		              g.h, g.w);
		goto out;
	}
	rows = g.cfg == 2 && t->guidance > 1.0 ? g.R : g.B;
	if (!(rep->rows = hi3i_calloc((size_t)t->B, sizeof(*rep->rows), err)) ||
	    !(x = hi3i_malloc(sizeof(float) * t->B * n, err)) || !(xn = hi3i_malloc(sizeof(float) * t->B * n, err)) ||
	    !(v = hi3i_malloc(sizeof(float) * (size_t)g.R * n, err)) ||
	    !(vg = hi3i_malloc(sizeof(float) * t->B * n, err)) || !(mu = hi3i_malloc(sizeof(float) * n, err)))
		goto out;
	rep->B = t->B;
	rep->K = t->K;
	rep->worst_row = rep->worst_step = -1;
	{
		const float gv = hi3_bf16_to_f32(hi3_f32_to_bf16((float)(1000.0 * t->guidance)));
		for (int k = 0; k < t->K; k++) {
			const int i = (int)t->sde_steps[k];
			struct hi3i_sde sd;

			for (int s = dno.kv_reuse && !cached && i > 0 ? 0 : i; s <= i; s += i) {
				for (int b = 0; b < t->B; b++)
					for (size_t e = 0; e < n; e++)
						x[(size_t)b * n + e] = hi3_trajectory_latent(t, ((size_t)b * (t->T + 1) + s) * n + e);
				if (hi3i_denoise(dn, x, rows, t->timesteps[s], t->sigmas[s + 1] * 1000.0f, gv,
				                 !dno.kv_reuse || !cached, v, err)) {
					hi3_error_prefix(err, "%s step %d", s == i ? "SDE" : "the cache of", s);
					goto out;
				}
				cached = 1;
				if (i == 0)
					break;
			}
			for (int b = 0; b < t->B; b++)
				for (size_t e = 0; e < n; e++)
					xn[(size_t)b * n + e] = hi3_trajectory_latent(t, ((size_t)b * (t->T + 1) + i + 1) * n + e);
			hi3i_sde_coeffs(rep->sde_kernel, rep->logprob_reduce, t->sigmas[i], t->sigmas[i + 1], t->sigmas[1],
			                t->eta, &sd);
			for (int b = 0; b < t->B; b++) {
				const float *vb = v + (size_t)b * n;
				hi3_diffusion_replay_row *r = &rep->rows[b];
				double d;

				if (rows == g.R && g.cfg == 2) {
					hi3i_cfg_combine(vb, v + (size_t)(g.B + b) * n, n, t->guidance, cfg_dt, vg + (size_t)b * n);
					vb = vg + (size_t)b * n;
				}
				hi3i_sde_mean(x + (size_t)b * n, vb, n, &sd, mu);
				logp[(size_t)b * t->K + k] = hi3i_sde_logp(xn + (size_t)b * n, mu, n, &sd);
				d = fabs((double)logp[(size_t)b * t->K + k] - (double)t->sde_logp[(size_t)b * t->K + k]);
				r->steps++;
				r->mean_abs += d;
				if (!(d <= r->max_abs) || r->steps == 1) {
					r->max_abs = d;
					r->worst = k;
				}
			}
			if (o->progress)
				o->progress(o->progress_ctx, k + 1, t->K);
		}
	}
	for (int b = 0; b < t->B; b++) {
		hi3_diffusion_replay_row *r = &rep->rows[b];
		rep->mean_abs += r->mean_abs;
		if (r->steps)
			r->mean_abs /= r->steps;
		if (r->steps && (rep->worst_row < 0 || !(r->max_abs <= rep->max_abs))) {
			rep->max_abs = r->max_abs;
			rep->worst_row = b;
			rep->worst_step = (int)t->sde_steps[r->worst];
		}
	}
	if (t->K)
		rep->mean_abs /= (double)t->B * t->K;
	rep->seconds = hi3i_now() - t0;
	rc = 0;
out:
	hi3i_denoiser_close(dn);
	free(x), free(xn), free(v), free(vg), free(mu);
	if (rc)
		hi3_diffusion_replay_report_release(rep);
	return rc;
}

int hi3_diffusion_replay_to_file(hi3_model *m, const hi3_cond *c, const hi3_trajectory *t, const char *traj_path,
                                 const hi3_diffusion_replay_opts *o, const char *path,
                                 hi3_diffusion_replay_report *rep, hi3_error *err)
{
	float *logp = hi3i_calloc((size_t)t->B * HI3_MAX(t->K, 1), sizeof(float), err);
	char hash[17];
	int rc = -1;

	if (!logp || hi3_diffusion_replay(m, c, t, o, logp, rep, err))
		goto out;
	hi3i_cond_hash(c, hash);
	rc = hi3i_replay_sde_write(path, t->B, t->K, logp, t->sde_steps, hi3_model_fingerprint(m), hash, traj_path,
	                           err);
out:
	if (rc)
		hi3_diffusion_replay_report_release(rep);
	free(logp);
	return rc;
}

int hi3_diffusion_replay_report_json(const hi3_diffusion_replay_report *rep, const hi3_cond *c, char **text,
                                     size_t *len, hi3_error *err)
{
	json_t *root = json_object(), *rows = json_array(), *ov = json_object(), *part = hi3i_stage_part_json(c, NULL);

	for (int b = 0; b < rep->B; b++) {
		const hi3_diffusion_replay_row *r = &rep->rows[b];
		json_t *o = json_object();
		json_object_set_new(o, "row", json_integer(b));
		json_object_set_new(o, "sde_steps", json_integer(r->steps));
		json_object_set_new(o, "mean_abs_dlogp", json_real(r->mean_abs));
		json_object_set_new(o, "max_abs_dlogp", json_real(r->max_abs));
		json_array_append_new(rows, o);
	}
	json_object_set_new(ov, "sde_steps", json_integer((json_int_t)rep->B * rep->K));
	json_object_set_new(ov, "mean_abs_dlogp", json_real(rep->mean_abs));
	json_object_set_new(ov, "max_abs_dlogp", json_real(rep->max_abs));
	json_object_set_new(ov, "worst_row", json_integer(rep->worst_row));
	json_object_set_new(ov, "worst_step", json_integer(rep->worst_step));
	json_object_set_new(root, "mode", json_string("diffusion"));
	json_object_set_new(root, "forward", json_string(rep->as_captured ? "as-captured" : "stateless"));
	json_object_set_new(root, "sde_kernel", json_string(hi3_sde_kernel_name(rep->sde_kernel)));
	json_object_set_new(root, "logprob_reduce", json_string(hi3_logprob_reduce_name(rep->logprob_reduce)));
	json_object_set_new(root, "ablate", json_string(hi3_ablation_name(rep->ablate)));
	json_object_set_new(root, "rows", rows);
	json_object_set_new(root, "overall", ov);
	json_object_set_new(root, "seconds", json_real(rep->seconds));
	if (part)
		json_object_set_new(root, "stage", part);
	return hi3i_json_text(root, JSON_INDENT(2), text, len, err);
}
