/*
 * test-sde.c -- hi3's SDE kernels (flow-grpo, cps, dance-grpo; stage/flow.c)
 * against their PyTorch re-implementation (tests/ref/sde_kernels_ref.py, from
 * Flow-GRPO's sde_step_with_logprob, FlowCPS and DanceGRPO's flux_step),
 * committed as tests/fixtures/diffusion/sde/CASE.{traj,ref} by
 * tests/ref/sde_fixtures.sh.
 *
 * Each CASE.traj is a trajectory hi3 captured on the tiny model: a ragged
 * batch of two requests with CFG (g 4.5), KV reuse, an SDE window over the
 * first and the last step, the velocities stored. For every SDE step and
 * request, hi3's step (the guidance combination, the kernel's mean, the
 * sample from the stored noise, the rounding to the latent dtype, the
 * log-prob) runs on the stored x_i and velocities and is compared with the
 * reference's sample and log-prob: within 1e-6 of the sample's largest
 * magnitude, and 1e-6 relative for the log-prob. What is left between them
 * is the reference's fp32 arithmetic on the CPU (torch's fp32 reduction
 * where hi3 sums in double; torch's CPU sqrt and log, which round some
 * results one ulp off where hi3's and CUDA's round correctly); the test
 * prints the largest differences. Then the same step must give what the
 * capture stored (the capture runs this code), and the replay's path (the
 * mean of the stored x_i, the log-prob of the stored x_{i+1}) the captured
 * log-prob bitwise.
 */
#include <math.h>
#include <string.h>
#include "hi3.h"
#include "tap.h"
#include "core/internal.h"
#include "stage/diffusion.h"

static const char *const cases[] = {"flow-grpo-f32", "cps-f32", "dance-grpo-f32", "flow-grpo-bf16-sum",
                                    "cps-f16-sum", "dance-grpo-bf16-cfg16"};

static hi3_dtype dtype_of(const char *s)
{
	return !s || !strcmp(s, "f32") ? HI3_F32 : !strcmp(s, "bf16") ? HI3_BF16 : HI3_F16;
}

static const float *ref_tensor(hi3_st *st, const char *name, int ndim, const int64_t *shape)
{
	const hi3_tensor *t;
	hi3_error err = {0};

	if (hi3_st_get(st, name, HI3_F32, ndim, shape, &t, &err)) {
		diag("%s", err.msg);
		return NULL;
	}
	return t->data;
}

static void run_case(const char *dir, const char *name)
{
	char tp[1024], rp[1024];
	hi3_trajectory *t = NULL;
	hi3_st *ref = NULL;
	hi3_error err = {0};
	float *x = NULL, *xn = NULL, *vg = NULL, *mu = NULL, *stored = NULL;
	double worst_x = 0.0, worst_lp = 0.0;
	int bad_ref = 0, bad_capture = 0, bad_replay = 0, steps = 0;

	if (snprintf(tp, sizeof(tp), "%s/%s.traj", dir, name) >= (int)sizeof(tp) ||
	    snprintf(rp, sizeof(rp), "%s/%s.ref", dir, name) >= (int)sizeof(rp)) {
		ok(0, "%s: a path of fewer than %zu bytes", name, sizeof(tp));
		return;
	}
	if (!ok(hi3_trajectory_open(&t, tp, &err) == 0 && hi3_st_open(&ref, rp, HI3_ST_READ, &err) == 0,
	        "%s: the trajectory and the reference open", name)) {
		diag("%s", err.msg);
		goto out;
	}
	{
		const size_t n = (size_t)t->C * t->h * t->w;
		const int64_t s_next[5] = {t->B, t->K, t->C, t->h, t->w}, s_lp[2] = {t->B, t->K};
		const float *r_next = ref_tensor(ref, "next", 5, s_next), *r_lp = ref_tensor(ref, "logp", 2, s_lp);
		const int kernel = t->sde_kernel ? hi3_sde_kernel_of(t->sde_kernel) : HI3_SDE_FLOW_GRPO;
		const int reduce = t->logprob_reduce ? hi3_logprob_reduce_of(t->logprob_reduce) : HI3_LOGP_MEAN;
		const int cfg = t->R == 2 * t->B && t->guidance > 1.0;
		const hi3_dtype cfg_dt = dtype_of(t->cfg_dtype);

		if (!ok(r_next && r_lp && t->velocity && kernel >= 0 && reduce >= 0 && t->K >= 3 && t->B == 2 && cfg,
		        "%s: kernel %s, reduction %s, eta %g, latents %s, %d SDE steps of %d, CFG %g in %s, %d requests",
		        name, hi3_sde_kernel_name(kernel), hi3_logprob_reduce_name(reduce), t->eta,
		        t->latent_dtype == HI3_F32 ? "f32" : t->latent_dtype == HI3_BF16 ? "bf16" : "f16", t->K, t->T,
		        t->guidance, t->cfg_dtype ? t->cfg_dtype : "f32", t->B))
			goto out;
		x = malloc(sizeof(float) * n), xn = malloc(sizeof(float) * n), vg = malloc(sizeof(float) * n);
		mu = malloc(sizeof(float) * n), stored = malloc(sizeof(float) * n);
		for (int k = 0; k < t->K; k++) {
			const int i = (int)t->sde_steps[k];
			struct hi3i_sde sd;

			hi3i_sde_coeffs(kernel, reduce, t->sigmas[i], t->sigmas[i + 1], t->sigmas[1], t->eta, &sd);
			for (int b = 0; b < t->B; b++) {
				const float *vc = t->velocity + ((size_t)i * t->R + b) * n;
				const float *vu = t->velocity + ((size_t)i * t->R + t->B + b) * n;
				const float *rn = r_next + ((size_t)b * t->K + k) * n, rl = r_lp[(size_t)b * t->K + k];
				const float *xi = t->sde_noise + ((size_t)b * t->K + k) * n;
				double mx = 0.0, scale = 0.0, dl;
				float l, lr;

				for (size_t e = 0; e < n; e++) {
					x[e] = hi3_trajectory_latent(t, ((size_t)b * (t->T + 1) + i) * n + e);
					stored[e] = hi3_trajectory_latent(t, ((size_t)b * (t->T + 1) + i + 1) * n + e);
				}
				l = hi3i_flow_row(x, vc, vu, t->guidance, cfg_dt, &sd, xi, t->sigmas[i], t->sigmas[i + 1],
				                  t->latent_dtype, n, vg, mu, xn);
				for (size_t e = 0; e < n; e++) {
					mx = fmax(mx, fabs((double)xn[e] - rn[e]));
					scale = fmax(scale, fabs((double)rn[e]));
				}
				dl = fabs((double)l - rl);
				worst_x = fmax(worst_x, scale > 0 ? mx / scale : mx);
				worst_lp = fmax(worst_lp, rl != 0.0f ? dl / fabs((double)rl) : dl);
				if (!(mx <= 1e-6 * scale) || !(dl <= 1e-6 * fabs((double)rl))) {
					diag("%s: step %d, request %d: max |x' - ref| %.3g (largest |ref| %.3g), log-prob %.9g, ref "
					     "%.9g", name, i, b, mx, scale, l, rl);
					bad_ref++;
				}
				if (memcmp(xn, stored, sizeof(float) * n) || l != t->sde_logp[(size_t)b * t->K + k])
					bad_capture++;
				/* the replay's path: the mean at x_i, the log-prob of the stored x_{i+1} */
				hi3i_cfg_combine(vc, vu, n, t->guidance, cfg_dt, vg);
				hi3i_sde_mean(x, vg, n, &sd, mu);
				lr = hi3i_sde_logp(stored, mu, n, &sd);
				if (lr != t->sde_logp[(size_t)b * t->K + k])
					bad_replay++;
				steps++;
			}
		}
		diag("%s: %d steps: largest |x' - ref| / largest |ref| %.3g, largest relative log-prob difference %.3g",
		     name, steps, worst_x, worst_lp);
		ok(bad_ref == 0, "%s: every sample within 1e-6 of its scale, every log-prob within 1e-6 relative of the "
		   "reference", name);
		ok(bad_capture == 0, "%s: the capture stored exactly this step's sample and log-prob", name);
		ok(bad_replay == 0, "%s: the replay's path gives the captured log-prob bitwise", name);
	}
out:
	free(x), free(xn), free(vg), free(mu), free(stored);
	hi3_st_close(ref);
	hi3_trajectory_close(t);
}

int main(void)
{
	const char *srcdir = getenv("SRCDIR");
	char dir[1024];

	snprintf(dir, sizeof(dir), "%s/tests/fixtures/diffusion/sde", srcdir ? srcdir : ".");
	for (size_t i = 0; i < HI3_ARRAY_SIZE(cases); i++)
		run_case(dir, cases[i]);
	{
		/* the kernels' names and defaults */
		ok(hi3_sde_kernel_of("flow-grpo") == HI3_SDE_FLOW_GRPO && hi3_sde_kernel_of("cps") == HI3_SDE_CPS &&
		   hi3_sde_kernel_of("dance-grpo") == HI3_SDE_DANCE_GRPO && hi3_sde_kernel_of("dance") == -1,
		   "kernel names");
		ok(hi3_sde_kernel_eta(HI3_SDE_FLOW_GRPO) == 1.0 && hi3_sde_kernel_eta(HI3_SDE_CPS) == 0.7 &&
		   hi3_sde_kernel_eta(HI3_SDE_DANCE_GRPO) == 0.3, "each kernel's own eta: 1, 0.7, 0.3");
	}
	{
		/* sigma = 1: flow-grpo takes sigma_max in the denominator (finite),
		 * dance-grpo and cps need nothing; the last step of cps has std 0 */
		struct hi3i_sde a, c;
		hi3i_sde_coeffs(HI3_SDE_FLOW_GRPO, 0, 1.0f, 0.9f, 0.9f, 1.0, &a);
		hi3i_sde_coeffs(HI3_SDE_CPS, 0, 0.2f, 0.0f, 0.9f, 0.7, &c);
		ok(isfinite(a.std_t) && a.std_t == sqrtf(1.0f / (1.0f - 0.9f)) && c.std == 0.0f && c.b == 0.0f,
		   "sigma 1 uses sigma_max (std_t %g); the last cps step has std 0", a.std_t);
	}
	return done_testing();
}
