/*
 * diffusion.c -- the diffusion stage (hi3-batching(7), DIFFUSION): the gen_image
 * rows of a conditions file denoised by flow matching, into a trajectory.
 *
 * The denoiser (model/denoiser.c) gives each row's velocity at latents x
 * and timestep t; this stage opens it on the conditions, after the checks
 * that need the model, with the rows of their cond images (it2i).
 *
 * The capture: x_T (per request, from its seed through the counter-based
 * generator, or a --noise file), then per step the velocity, classifier-free
 * guidance (v = v_u + g (v_c - v_u) when g > 1 and the rows have CFG; the
 * cond rows alone otherwise), and an Euler or SDE step in fp32 (flow.c),
 * the result stored in the latent dtype and read back as the next input.
 *
 * Shapes: B requests, R rows (cond rows then uncond rows), Z latent
 * channels, h x w latent grid, T steps, K SDE steps.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "format/conditions.h"
#include "format/format.h"
#include "format/provenance.h"
#include "format/trace.h"
#include "format/trajectory.h"
#include "stage/files.h"
#include "model/model.h"
#include "stage/diffusion.h"
#include "stage/images.h"

/* The denoiser of the gen_image rows of c, after the checks that need the
 * model (conditions made for it, with pixels for any cond image), with the
 * rows of the cond images (it2i) made by the model's encoders. */
int hi3i_diffusion_denoiser(struct hi3i_denoiser **out, hi3_model *m, const hi3_cond *c, const struct hi3i_dn_opts *o,
                            hi3_error *err)
{
	const char *name = c->st ? hi3_st_path(c->st) : "the conditions";
	struct hi3i_image_enc *enc = NULL;
	struct hi3i_image_embeds e = {0};
	int *rows = NULL, rc = -1;

	*out = NULL;
	if (strcmp(c->mode, "gen_image"))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: conditions in mode '%s': diffusion runs gen_image rows "
		                     "(tokenize-concat requests with \"mode\": \"gen_image\")", name, c->mode);
	if (hi3_cond_check_model(c, m, err) || hi3i_cond_require_pixels(c, err) || hi3i_denoiser_open(out, m, c, o, err))
		return -1;
	if (!c->NI)
		return 0;
	/* the rows of the cond images, once: the same at every whole-sequence
	 * pass (the uncond rows keep the images, with the same seeds, so their
	 * rows equal the cond rows') */
	if (!(rows = hi3i_malloc(sizeof(int) * (size_t)c->B, err)))
		goto out;
	for (int r = 0; r < c->B; r++)
		rows[r] = r;
	if (hi3i_image_enc_open(&enc, m, c, name, err) || hi3i_image_embeds(enc, c, rows, c->B, &e, err))
		goto out;
	rc = hi3i_denoiser_cond_rows(*out, e.n, e.at, e.rows, err);
	e.at = NULL, e.rows = NULL;
out:
	hi3i_image_embeds_release(&e);
	hi3i_image_enc_close(enc);
	free(rows);
	if (rc) {
		hi3i_denoiser_close(*out);
		*out = NULL;
	}
	return rc;
}

/* ---------------------------------------------------------------- capture */

/* The settings of a run: o's, else generation_config's. */
struct settings {
	int T;
	double g, shift;
	int *is_sde;                  /* (T) the SDE step's index into the K, or -1 */
	int64_t *sde;                 /* (K) */
	int K;
};

static int resolve(const hi3_model *m, const hi3_diffusion_opts *o, struct settings *s, hi3_error *err)
{
	const hi3_gen_defaults *gd = hi3_model_gen_defaults(m);

	memset(s, 0, sizeof(*s));
	s->T = o->steps > 0 ? o->steps : gd->diff_infer_steps;
	s->g = o->have_guidance ? o->guidance : gd->diff_guidance_scale;
	s->shift = o->have_flow_shift ? o->flow_shift : gd->flow_shift;
	if (s->T < 1 || s->T > 100000)
		return hi3_error_set(err, HI3_ERR_USAGE, "steps: %d (expected 1 to 100000)", s->T);
	if (!(s->shift > 0.0) || !isfinite(s->shift) || !isfinite(s->g))
		return hi3_error_set(err, HI3_ERR_USAGE, "flow shift %g and guidance %g must be finite, the shift "
		                     "positive", s->shift, s->g);
	if (o->sampler == HI3_SAMPLER_EULER && o->sde_steps)
		return hi3_error_set(err, HI3_ERR_USAGE, "SDE steps given with the euler sampler (use --sampler sde)");
	if (!(s->is_sde = hi3i_malloc(sizeof(int) * (size_t)s->T, err)) ||
	    !(s->sde = hi3i_malloc(sizeof(int64_t) * (size_t)s->T, err)))
		return -1;
	for (int i = 0; i < s->T; i++)
		s->is_sde[i] = -1;
	if (o->sampler != HI3_SAMPLER_SDE)
		return 0;
	for (int k = 0; k < (o->sde_steps ? o->n_sde_steps : s->T); k++) {
		int64_t i = o->sde_steps ? o->sde_steps[k] : k;
		if (i < 0 || i >= s->T || (s->K && i <= s->sde[s->K - 1]))
			return hi3_error_set(err, HI3_ERR_USAGE, "SDE step %lld: expected increasing steps in [0, %d)",
			                     (long long)i, s->T);
		s->is_sde[i] = s->K;
		s->sde[s->K++] = i;
	}
	return 0;
}

static const char *const ablation_names[] = {"none", "decode-mask", "token-placement", "pos-pad", "rope-pad",
                                             "rope-1d", "eoi", NULL};

const char *hi3_ablation_name(int a)
{
	return a >= 0 && a < (int)HI3_ARRAY_SIZE(ablation_names) - 1 ? ablation_names[a] : "?";
}

int hi3_ablation_of(const char *s)
{
	return hi3i_name_index(ablation_names, s);
}

/* The denoiser's defects of a diffusion ablation (pos-pad: pads write
 * cache slot 0, as conditions made with --pad-positions=zero already do;
 * rope-pad: that and a zero RoPE table for pads). */
unsigned hi3i_diffusion_defects(int ablate)
{
	switch (ablate) {
	case HI3_ABLATE_ROPE_1D: return HI3I_DN_ROPE_1D;
	case HI3_ABLATE_EOI: return HI3I_DN_EOI;
	case HI3_ABLATE_POS_PAD: return HI3I_DN_POS_ZERO;
	case HI3_ABLATE_ROPE_PAD: return HI3I_DN_ROPE_ZERO | HI3I_DN_POS_ZERO;
	default: return 0;
	}
}

static const char *dtype_label(hi3_dtype dt)
{
	return dt == HI3_BF16 ? "bf16" : dt == HI3_F16 ? "f16" : "f32";
}

/* latents[:, step] of every request = x (B n), in the latent dtype. */
static void put_step(void *lat, hi3_dtype dt, int B, int T, size_t n, int step, const float *x)
{
	for (int b = 0; b < B; b++)
		for (size_t k = 0; k < n; k++) {
			size_t at = ((size_t)b * (T + 1) + step) * n + k;
			float f = x[(size_t)b * n + k];
			if (dt == HI3_F32)
				((float *)lat)[at] = f;
			else
				((uint16_t *)lat)[at] = dt == HI3_BF16 ? hi3_f32_to_bf16(f) : hi3_f32_to_f16(f);
		}
}

static int same_text(const char *a, const char *b)
{
	return a == b || (a && b && !strcmp(a, b));
}

/* The checkpoint ck was made by this run's settings (tr, before any step):
 * the same dimensions, metadata, schedule, noise and x_T. */
static int ckpt_matches(const hi3_trajectory *ck, const hi3_trajectory *tr, const char *path, hi3_error *err)
{
	const size_t n = (size_t)tr->C * tr->h * tr->w, es = hi3_dtype_size(tr->latent_dtype);
	const char *what = NULL;

	if (ck->B != tr->B || ck->R != tr->R || ck->T != tr->T || ck->K != tr->K || ck->C != tr->C ||
	    ck->h != tr->h || ck->w != tr->w || ck->latent_dtype != tr->latent_dtype)
		what = "shape (requests, rows, steps, SDE steps, latents or their dtype)";
	else if (!same_text(ck->model_fingerprint, tr->model_fingerprint) ||
	         !same_text(ck->conditions_hash, tr->conditions_hash) || !same_text(ck->requests, tr->requests) ||
	         !same_text(ck->seeds, tr->seeds) || !same_text(ck->variant, tr->variant))
		what = "model or conditions";
	else if (!same_text(ck->sampler, tr->sampler) || !same_text(ck->sde_kernel, tr->sde_kernel) ||
	         !same_text(ck->logprob_reduce, tr->logprob_reduce) || ck->eta != tr->eta ||
	         ck->guidance != tr->guidance || ck->flow_shift != tr->flow_shift || ck->kv_reuse != tr->kv_reuse ||
	         !same_text(ck->cfg_dtype, tr->cfg_dtype) || !same_text(ck->ablate, tr->ablate) ||
	         !ck->velocity != !tr->velocity)
		what = "sampler settings (sampler, SDE kernel, eta, reduction, guidance, shift, KV reuse, guidance dtype, "
		       "ablation or --capture-velocity)";
	else if (!same_text(ck->noise, tr->noise) ||
	         memcmp(ck->sigmas, tr->sigmas, sizeof(float) * (size_t)(tr->T + 1)) ||
	         memcmp(ck->sde_steps, tr->sde_steps, sizeof(int64_t) * (size_t)tr->K) ||
	         memcmp(ck->x_T, tr->x_T, sizeof(float) * tr->B * n) ||
	         memcmp(ck->sde_noise, tr->sde_noise, sizeof(float) * tr->B * (size_t)tr->K * n))
		what = "schedule or noise";
	for (int b = 0; !what && b < tr->B; b++)
		if (memcmp((const char *)ck->latents + (size_t)b * (tr->T + 1) * n * es,
		           (const char *)tr->latents + (size_t)b * (tr->T + 1) * n * es, n * es))
			what = "x_T as stored";
	if (what)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: the checkpoint of another run: its %s differs from this "
		                     "run's (resume with the options of that run, or run without --resume to start "
		                     "again)", path, what);
	return 0;
}

/* The step this run starts at: with o->resume, the checkpoint's completed
 * steps (their latents, log-probs and velocities copied into tr's arrays);
 * else 0, the checkpoint made afresh. *ck is the checkpoint, open. */
static int ckpt_begin(const hi3_diffusion_opts *o, hi3_trajectory *tr, hi3_trajectory **ck, int64_t **done,
                      int *s0, int *found, hi3_error *err)
{
	const size_t n = (size_t)tr->C * tr->h * tr->w, es = hi3_dtype_size(tr->latent_dtype);

	*s0 = 0;
	*found = o->resume && access(o->checkpoint, F_OK) == 0;
	if (*found) {
		if (hi3i_traj_ckpt_open(ck, done, o->checkpoint, err) || ckpt_matches(*ck, tr, o->checkpoint, err))
			return -1;
		*s0 = (int)**done;
		memcpy((void *)tr->latents, (*ck)->latents, es * tr->B * (size_t)(tr->T + 1) * n);
		memcpy((void *)tr->sde_logp, (*ck)->sde_logp, sizeof(float) * tr->B * (size_t)tr->K);
		if (tr->velocity)
			memcpy((void *)tr->velocity, (*ck)->velocity, sizeof(float) * (size_t)tr->T * tr->R * n);
		return 0;
	}
	return hi3i_traj_ckpt_create(o->checkpoint, tr, err) || hi3i_traj_ckpt_open(ck, done, o->checkpoint, err);
}

/* Step i done: its latents, log-probs and velocities into the checkpoint,
 * then the commit word. The crash tests' kill points
 * (hi3i_test_kill_point, HI3_TEST_KILL_AT=S:C): at step S (0 <= S < T)
 * after its payload is written, before (C = 0) or after (C = 1) its commit;
 * S = T: before (0) or after (1) the trajectory is written. */
static int ckpt_step(hi3_trajectory *ck, int64_t *done, const hi3_trajectory *tr, int i, int k, hi3_error *err)
{
	const size_t n = (size_t)tr->C * tr->h * tr->w, es = hi3_dtype_size(tr->latent_dtype);

	for (int b = 0; b < tr->B; b++) {
		size_t at = ((size_t)b * (tr->T + 1) + i + 1) * n * es;
		memcpy((char *)ck->latents + at, (const char *)tr->latents + at, n * es);
		if (k >= 0)
			((float *)ck->sde_logp)[(size_t)b * tr->K + k] = tr->sde_logp[(size_t)b * tr->K + k];
	}
	if (tr->velocity)
		memcpy((float *)ck->velocity + (size_t)i * tr->R * n, tr->velocity + (size_t)i * tr->R * n,
		       sizeof(float) * tr->R * n);
	hi3i_test_kill_point(i, 0);
	if (hi3i_traj_ckpt_commit(ck, done, i + 1, err))
		return -1;
	hi3i_test_kill_point(i, 1);
	return 0;
}

int hi3_diffusion_capture(hi3_model *m, const hi3_cond *c, const hi3_diffusion_opts *o, const char *traj_path,
                          hi3_diffusion_stats *st, hi3_error *err)
{
	/* conditions whose pads have position 0 carry the pos-pad defect: say so */
	const char *pp = hi3_cond_meta(c, "pad_positions");
	const int ablate = o->ablate == HI3_ABLATE_NONE && pp && !strcmp(pp, "zero") ? HI3_ABLATE_POS_PAD : o->ablate;
	struct hi3i_dn_opts dno = {.kv_reuse = !o->no_kv_reuse, .defects = hi3i_diffusion_defects(ablate)};
	struct hi3i_denoiser *dn = NULL;
	struct hi3i_dn_geometry g;
	struct settings s;
	hi3_trajectory tr = {0}, *ck = NULL;
	float *sig = NULL, *tst = NULL, *x_T = NULL, *noise = NULL, *lp = NULL, *vel = NULL, *v = NULL, *vg = NULL;
	float *x = NULL, *xn = NULL, *mu = NULL;
	int64_t *done = NULL;
	void *lat = NULL;
	char hash[17], *seeds = NULL;
	double t0 = hi3i_now(), t_step0 = 0.0, t_rest = 0.0, t_ck = 0.0;
	hi3_comm *comm = hi3i_model_comm(m);
	const int lead = hi3i_model_writes_files(m);  /* rank 0 alone keeps the checkpoint and writes the trajectory */
	size_t n, es;
	int rows, rc = -1, s0 = 0;

	memset(st, 0, sizeof(*st));
	if (o->latent_dtype != HI3_F32 && o->latent_dtype != HI3_BF16 && o->latent_dtype != HI3_F16)
		return hi3_error_set(err, HI3_ERR_USAGE, "latent dtype: expected f32, bf16 or f16");
	if (o->cfg_dtype != HI3_F32 && o->cfg_dtype != HI3_BF16 && o->cfg_dtype != HI3_F16)
		return hi3_error_set(err, HI3_ERR_USAGE, "guidance dtype: expected f32, bf16 or f16");
	if (!hi3_sde_kernel_name(o->sde_kernel) || !hi3_logprob_reduce_name(o->logprob_reduce))
		return hi3_error_set(err, HI3_ERR_USAGE, "SDE kernel %d, log-prob reduction %d: unknown", o->sde_kernel,
		                     o->logprob_reduce);
	if (!(o->eta >= 0.0) || !isfinite(o->eta))
		return hi3_error_set(err, HI3_ERR_USAGE, "eta %g: expected a finite number >= 0", o->eta);
	if (ablate != HI3_ABLATE_NONE && !hi3i_diffusion_defects(ablate))
		return hi3_error_set(err, HI3_ERR_USAGE, "--ablate %s is not a diffusion defect (pos-pad, rope-pad, rope-1d "
		                     "or eoi)", hi3_ablation_name(ablate));
	if (o->resume && (!o->checkpoint || o->trace))
		return hi3_error_set(err, HI3_ERR_USAGE, "resume: %s", o->trace ? "a resumed capture takes no trace (the "
		                     "traced step may be done already)" : "no checkpoint file to resume from");
	if (resolve(m, o, &s, err))
		goto out;
	if (s.K && !(o->eta > 0.0) && o->sde_kernel != HI3_SDE_CPS) {
		hi3_error_set(err, HI3_ERR_USAGE, "eta 0 with SDE steps: the %s kernel's std is 0, its log-prob undefined "
		              "(the euler sampler takes no noise)", hi3_sde_kernel_name(o->sde_kernel));
		goto out;
	}
	{
		double te = hi3i_now();
		if (hi3i_diffusion_denoiser(&dn, m, c, &dno, err))
			goto out;
		/* the requests' images: the uncond rows' copies are not counted again */
		for (int k = 0; k < c->NI; k++)
			st->cond_images += c->image_row[k] < c->B / hi3_cond_cfg_factor(c);
		st->encode_seconds = c->NI ? hi3i_now() - te : 0.0;
	}
	hi3i_denoiser_geometry(dn, &g);
	n = (size_t)g.Z * g.h * g.w;
	es = hi3_dtype_size(o->latent_dtype);
	rows = g.cfg == 2 && s.g > 1.0 ? g.R : g.B;
	if (o->trace) {
		char v0[32], v1[32], v2[32];
		if (o->trace_step < 0 || o->trace_step >= s.T) {
			hi3_error_set(err, HI3_ERR_USAGE, "--trace-step %d: expected a step in [0, %d)", o->trace_step, s.T);
			goto out;
		}
		snprintf(v0, sizeof(v0), "%d", o->trace_step);
		snprintf(v1, sizeof(v1), "%d", s.T);
		snprintf(v2, sizeof(v2), "%d", rows);
		if (hi3i_trace_stage_meta(o->trace, "diffusion-capture", c, err) ||
		    hi3_trace_set_meta(o->trace, "trace_step", v0, err) || hi3_trace_set_meta(o->trace, "steps", v1, err) ||
		    hi3_trace_set_meta(o->trace, "denoised_rows", v2, err) ||
		    hi3_trace_set_meta(o->trace, "kv_reuse", o->no_kv_reuse ? "off" : "on", err) ||
		    (ablate && hi3_trace_set_meta(o->trace, "ablate", hi3_ablation_name(ablate), err)))
			goto out;
	}
	if (!(sig = hi3i_malloc(sizeof(float) * (size_t)(s.T + 1), err)) ||
	    !(tst = hi3i_malloc(sizeof(float) * (size_t)s.T, err)) || !(x_T = hi3i_malloc(sizeof(float) * g.B * n, err)) ||
	    !(noise = hi3i_calloc((size_t)g.B * HI3_MAX(s.K, 1) * n, sizeof(float), err)) ||
	    !(lp = hi3i_calloc((size_t)g.B * HI3_MAX(s.K, 1), sizeof(float), err)) ||
	    !(lat = hi3i_calloc((size_t)g.B * (s.T + 1) * n, es, err)) ||
	    !(v = hi3i_malloc(sizeof(float) * (size_t)g.R * n, err)) || !(vg = hi3i_malloc(sizeof(float) * g.B * n, err)) ||
	    !(x = hi3i_malloc(sizeof(float) * g.B * n, err)) || !(xn = hi3i_malloc(sizeof(float) * n, err)) ||
	    !(mu = hi3i_malloc(sizeof(float) * n, err)) ||
	    (o->capture_velocity && !(vel = hi3i_calloc((size_t)s.T * g.R * n, sizeof(float), err))))
		goto out;
	hi3i_flow_sigmas(s.T, s.shift, sig);
	for (int i = 0; i < s.T; i++)
		tst[i] = sig[i] * 1000.0f;
	/* the noise: per request from its seed, or from the file */
	if (o->noise) {
		if (hi3i_noise_read(o->noise, g.B, g.Z, g.h, g.w, s.K, x_T, noise, err))
			goto out;
	} else {
		for (int b = 0; b < g.B; b++) {
			uint64_t seed = (uint64_t)c->seeds[b];
			hi3i_normals(seed, HI3I_STREAM_XT, n, x_T + (size_t)b * n);
			for (int k = 0; k < s.K; k++)
				hi3i_normals(seed, HI3I_STREAM_STEP(s.sde[k]), n, noise + ((size_t)b * s.K + k) * n);
		}
	}
	/* latents[:, 0] = x_T as stored */
	for (size_t i = 0; i < (size_t)g.B * n; i++)
		x[i] = hi3i_round_to(x_T[i], o->latent_dtype);
	put_step(lat, o->latent_dtype, g.B, s.T, n, 0, x);
	hi3i_cond_hash(c, hash);
	{
		size_t off = 0, cap = (size_t)g.B * 24 + 4;
		if (!(seeds = hi3i_malloc(cap, err)))
			goto out;
		for (int b = 0; b < g.B; b++)
			off += (size_t)snprintf(seeds + off, cap - off, "%s%lld", b ? ", " : "[", (long long)c->seeds[b]);
		snprintf(seeds + off, cap - off, "]");
	}
	tr = (hi3_trajectory){
		.B = g.B, .R = g.R, .T = s.T, .K = s.K, .C = g.Z, .h = g.h, .w = g.w, .latent_dtype = o->latent_dtype,
		.latents = lat, .sigmas = sig, .timesteps = tst, .sde_steps = s.sde, .sde_logp = lp, .x_T = x_T,
		.sde_noise = noise, .velocity = vel, .sampler = o->sampler == HI3_SAMPLER_SDE ? "sde" : "euler",
		.sde_kernel = o->sampler == HI3_SAMPLER_SDE ? hi3_sde_kernel_name(o->sde_kernel) : NULL,
		.logprob_reduce = o->sampler == HI3_SAMPLER_SDE ? hi3_logprob_reduce_name(o->logprob_reduce) : NULL,
		.ablate = ablate ? hi3_ablation_name(ablate) : NULL,
		.eta = o->sampler == HI3_SAMPLER_SDE ? o->eta : 0.0, .guidance = s.g, .flow_shift = s.shift,
		.kv_reuse = !o->no_kv_reuse, .cfg_dtype = dtype_label(o->cfg_dtype),
		.variant = hi3_variant_name(hi3_variant_of(hi3_model_config(m), hi3_model_gen_defaults(m), NULL, 0)),
		.noise = o->noise ? o->noise : "philox", .model_fingerprint = hi3_model_fingerprint(m),
		.conditions_hash = hash, .requests = c->requests, .seeds = seeds,
	};
	if (o->checkpoint) {
		double tc = hi3i_now();
		int at[2] = {0, 0};   /* the step resumed from, whether a checkpoint was found */
		if (lead && ckpt_begin(o, &tr, &ck, &done, &at[0], &at[1], err))
			goto out;
		/* the other ranks step from rank 0's checkpoint: its latents */
		if (comm && (hi3_comm_bcast(comm, at, sizeof(at), 0, err) ||
		             (at[0] > 0 && hi3_comm_bcast(comm, lat, es * g.B * (size_t)(s.T + 1) * n, 0, err))))
			goto out;
		s0 = at[0];
		st->checkpoint_found = at[1];
		t_ck += hi3i_now() - tc;
		for (int b = 0; b < g.B; b++)
			for (size_t e = 0; e < n; e++)
				x[(size_t)b * n + e] = hi3_trajectory_latent(&tr, ((size_t)b * (s.T + 1) + s0) * n + e);
	}
	{
		const float gv = hi3_bf16_to_f32(hi3_f32_to_bf16((float)(1000.0 * s.g)));   /* upstream: a bf16 tensor */
		if (s0 > 0 && s0 < s.T && !o->no_kv_reuse) {
			/* the cache of step 0, made again: its whole-sequence pass at
			 * x_T (the later steps rewrite only their own slots) */
			for (size_t e = 0; e < (size_t)g.B * n; e++)
				vg[e] = hi3_trajectory_latent(&tr, (e / n) * (s.T + 1) * n + e % n);
			if (hi3i_denoise(dn, vg, rows, tst[0], sig[1] * 1000.0f, gv, 1, v, err)) {
				hi3_error_prefix(err, "the cache of step 0");
				goto out;
			}
		}
		for (int i = s0; i < s.T; i++) {
			double ts = hi3i_now();
			int full = i == 0 || o->no_kv_reuse;

			if (o->trace && i == o->trace_step && hi3i_denoiser_trace(dn, o->trace, err))
				goto out;
			if (hi3i_denoise(dn, x, rows, tst[i], sig[i + 1] * 1000.0f, gv, full, v, err)) {
				hi3_error_prefix(err, "step %d", i);
				goto out;
			}
			if (o->trace && i == o->trace_step)
				hi3i_denoiser_trace(dn, NULL, err);
			if (vel)
				memcpy(vel + (size_t)i * g.R * n, v, sizeof(float) * (size_t)rows * n);
			for (int b = 0; b < g.B; b++) {
				const int k = s.is_sde[i], cfg = rows == g.R && g.cfg == 2;
				struct hi3i_sde sd;
				float *xb = x + (size_t)b * n, l;

				if (k >= 0)
					hi3i_sde_coeffs(o->sde_kernel, o->logprob_reduce, sig[i], sig[i + 1], sig[1], o->eta, &sd);
				l = hi3i_flow_row(xb, v + (size_t)b * n, cfg ? v + (size_t)(g.B + b) * n : NULL, s.g, o->cfg_dtype,
				                  k >= 0 ? &sd : NULL, k >= 0 ? noise + ((size_t)b * s.K + k) * n : NULL, sig[i],
				                  sig[i + 1], o->latent_dtype, n, vg + (size_t)b * n, mu, xn);
				if (k >= 0)
					lp[(size_t)b * s.K + k] = l;
				memcpy(xb, xn, sizeof(float) * n);
			}
			put_step(lat, o->latent_dtype, g.B, s.T, n, i + 1, x);
			if (ck) {
				double tc = hi3i_now();
				if (ckpt_step(ck, done, &tr, i, s.is_sde[i], err))
					goto out;
				t_ck += hi3i_now() - tc;
			}
			if (i == 0)
				t_step0 = hi3i_now() - ts;
			else
				t_rest += hi3i_now() - ts;
			if (o->progress)
				o->progress(o->progress_ctx, i + 1, s.T);
		}
	}
	hi3i_test_kill_point(s.T, 0);
	if (lead && hi3_trajectory_write(&tr, traj_path, err))
		goto out;
	hi3i_test_kill_point(s.T, 1);
	/* every rank returns once the trajectory is there */
	if (comm && hi3_comm_barrier(comm, err))
		goto out;
	st->B = g.B;
	st->R = g.R;
	st->T = s.T;
	st->K = s.K;
	st->h = g.h;
	st->w = g.w;
	st->L = c->L;
	st->image_tokens = (int64_t)g.h * g.w;
	st->resumed_from = s0;
	st->checkpoint_seconds = t_ck;
	st->seconds = hi3i_now() - t0;
	st->step0_seconds = t_step0;
	st->step_seconds = s.T - HI3_MAX(s0, 1) > 0 ? t_rest / (s.T - HI3_MAX(s0, 1)) : t_step0;
	rc = 0;
out:
	hi3_trajectory_close(ck);
	hi3i_denoiser_close(dn);
	free(s.is_sde), free(s.sde), free(sig), free(tst), free(x_T), free(noise), free(lp), free(lat), free(v);
	free(vg), free(x), free(xn), free(mu), free(vel), free(seeds);
	return rc;
}
