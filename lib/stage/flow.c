/*
 * flow.c -- the flow-matching sampler's arithmetic (hi3-batching(7),
 * DIFFUSION): the shifted sigma schedule, classifier-free guidance, the
 * Euler step, and the SDE step with the log-prob of its transition (the
 * per-row Gaussian noise is core/philox.c's).
 *
 * Everything is fp32 element by element, as upstream's scheduler
 * (hunyuan_image_3_pipeline.py, FlowMatchDiscreteScheduler) and the
 * Flow-GRPO SDE of UniRL (unirl/sde/kernels.py, FlowSDEStrategy) compute
 * it; the log-prob's mean is summed in double.
 *
 * Shapes: n elements of one row's latent (C h w).
 */
#include <math.h>
#include <string.h>
#include "stage/diffusion.h"

void hi3i_flow_sigmas(int T, double shift, float *sigmas)
{
	/* torch.linspace(1, 0, T + 1) in fp32: the first half start + step i,
	 * the rest end - step (T - i), each one fused multiply-add (as torch's
	 * vectorised kernel computes them); then the SD3 shift
	 * s t / (1 + (s - 1) t), one rounding per operation */
	const float step = (0.0f - 1.0f) / (float)T, s = (float)shift, s1 = (float)(shift - 1.0);
	const int half = (T + 1) / 2;

	for (int i = 0; i <= T; i++) {
		float t = i < half ? fmaf(step, (float)i, 1.0f) : fmaf(-step, (float)(T - i), 0.0f);
		sigmas[i] = shift != 1.0 ? (s * t) / (1.0f + s1 * t) : t;
	}
}

float hi3i_round_to(float x, hi3_dtype dt)
{
	switch (dt) {
	case HI3_BF16: return hi3_bf16_to_f32(hi3_f32_to_bf16(x));
	case HI3_F16: return hi3_f16_to_f32(hi3_f32_to_f16(x));
	default: return x;
	}
}

void hi3i_cfg_combine(const float *vc, const float *vu, size_t n, double g, hi3_dtype dt, float *out)
{
	/* v = v_u + g (v_c - v_u), each operation rounded to dt (fp32: the
	 * upstream pipeline; fp16: UniRL's trainer, which casts the model's
	 * output to the latent dtype before the combination) */
	const float gf = (float)g;

	for (size_t i = 0; i < n; i++) {
		float c = hi3i_round_to(vc[i], dt), u = hi3i_round_to(vu[i], dt);
		float d = hi3i_round_to(c - u, dt), p = hi3i_round_to(gf * d, dt);
		out[i] = hi3i_round_to(u + p, dt);
	}
}

void hi3i_euler(const float *x, const float *v, size_t n, float sigma, float sigma_next, float *out)
{
	const float dt = sigma_next - sigma;

	for (size_t i = 0; i < n; i++)
		out[i] = x[i] + v[i] * dt;
}

/* ------------------------------------------------------------ SDE kernels
 *
 * Each kernel as its project computes it in fp32 (hi3-diffusion-capture(1),
 * SDE KERNELS): the same terms in the same order, one rounding per
 * operation; a Python scalar (eta and what is computed from it in Python)
 * enters as a double rounded once to fp32 where it meets a tensor.
 *
 * flow-grpo: Flow-GRPO's sde_step_with_logprob, sde_type "sde"
 *   (yifan123/flow_grpo 54809b5, flow_grpo/diffusers_patch/
 *   sd3_sde_with_logprob.py), the same arithmetic as UniRL's FlowSDEStrategy
 *   (unirl/sde/kernels.py), hi3's kernel before the others.
 * cps: the same function with sde_type "cps" (and IamCreateAI/FlowCPS b402c7a,
 *   the same file).
 * dance-grpo: DanceGRPO's flux_step with sde_solver (XueZeyue/DanceGRPO,
 *   fastvideo/train_grpo_flux.py, since 9ac72b4 with its -log std - log
 *   sqrt(2 pi) terms).
 */

static const char *const kernel_names[] = {"flow-grpo", "cps", "dance-grpo", NULL};

const char *hi3_sde_kernel_name(int kernel)
{
	return kernel >= 0 && kernel < (int)HI3_ARRAY_SIZE(kernel_names) - 1 ? kernel_names[kernel] : NULL;
}

int hi3_sde_kernel_of(const char *name)
{
	return hi3i_name_index(kernel_names, name);
}

double hi3_sde_kernel_eta(int kernel)
{
	return kernel == HI3_SDE_CPS ? 0.7 : kernel == HI3_SDE_DANCE_GRPO ? 0.3 : 1.0;
}

const char *hi3_logprob_reduce_name(int reduce)
{
	return reduce == HI3_LOGP_SUM ? "sum" : reduce == HI3_LOGP_MEAN || reduce == HI3_LOGP_KERNEL ? "mean" : NULL;
}

int hi3_logprob_reduce_of(const char *name)
{
	return !name ? -1 : !strcmp(name, "mean") ? HI3_LOGP_MEAN : !strcmp(name, "sum") ? HI3_LOGP_SUM : -1;
}

/* log(sqrt(2 pi)) in fp32, 0.9189385f, whether computed as Flow-GRPO and
 * DanceGRPO do (torch.log(torch.sqrt(2 * torch.as_tensor(math.pi))), fp32
 * throughout) or as UniRL does (0.5 * math.log(2 * math.pi), a double
 * rounded once): both give this float. */
static float half_log_2pi(void)
{
	return (float)(0.5 * log(2.0 * 3.14159265358979323846));
}

void hi3i_sde_coeffs(int kernel, int reduce, float sigma, float sigma_next, float sigma_max, double eta,
                     struct hi3i_sde *s)
{
	memset(s, 0, sizeof(*s));
	s->kernel = kernel;
	s->reduce = reduce == HI3_LOGP_SUM ? HI3_LOGP_SUM : HI3_LOGP_MEAN;
	s->sigma = sigma;
	s->dt = sigma_next - sigma;
	switch (kernel) {
	case HI3_SDE_CPS: {
		/* std_dev_t = sigma_prev * math.sin(noise_level * math.pi / 2);
		 * mean = x0 (1 - sigma_prev) + x1 sqrt(sigma_prev^2 - std^2) */
		const float sn = (float)sin(eta * 3.14159265358979323846 / 2.0);
		s->std = sigma_next * sn;
		s->one_m = 1.0f - sigma;
		s->a = 1.0f - sigma_next;
		s->b = sqrtf(sigma_next * sigma_next - s->std * s->std);
		break;
	}
	case HI3_SDE_DANCE_GRPO: {
		/* std_dev_t = eta * math.sqrt(delta_t): a double from the fp32
		 * sigma - sigma_next; the log-density divides by the double
		 * 2 std^2 and subtracts the double log std, each rounded to fp32 */
		const float delta = sigma - sigma_next;
		const double std = eta * sqrt((double)delta);
		s->std = (float)std;
		s->one_m = 1.0f - sigma;
		s->s2 = sigma * sigma;
		s->c = (float)(-0.5 * (eta * eta));
		s->two_var = (float)(2.0 * (std * std));
		s->log_std = (float)log(std);
		break;
	}
	default: {
		/* std_dev_t = sqrt(sigma / (1 - (sigma == 1 ? sigma_max : sigma))) eta;
		 * mean = x (1 + std^2 / (2 sigma) dt) + v (1 + std^2 (1 - sigma) / (2
		 * sigma)) dt; the transition's std std_dev_t sqrt(-dt) */
		const float den = 1.0f - (sigma == 1.0f ? sigma_max : sigma);
		const float std_t = sqrtf(sigma / den) * (float)eta, var = std_t * std_t, two_s = 2.0f * sigma;
		s->kernel = HI3_SDE_FLOW_GRPO;
		s->std_t = std_t;
		s->a = 1.0f + var / two_s * s->dt;
		s->b = 1.0f + var * (1.0f - sigma) / two_s;
		s->std = std_t * sqrtf(-s->dt);
		s->two_var = 2.0f * (s->std * s->std);
		s->log_std = logf(s->std);
		break;
	}
	}
}

void hi3i_sde_mean(const float *x, const float *v, size_t n, const struct hi3i_sde *s, float *mu)
{
	const float sg = s->sigma, dt = s->dt;

	switch (s->kernel) {
	case HI3_SDE_CPS:
		/* x0 = x - sigma v; x1 = x + v (1 - sigma) */
		for (size_t i = 0; i < n; i++) {
			float x0 = x[i] - sg * v[i], x1 = x[i] + v[i] * s->one_m;
			mu[i] = x0 * s->a + x1 * s->b;
		}
		break;
	case HI3_SDE_DANCE_GRPO:
		/* x + dsigma v, then + (-eta^2 / 2 score) dsigma with score =
		 * -(x - x0 (1 - sigma)) / sigma^2, x0 = x - sigma v */
		for (size_t i = 0; i < n; i++) {
			float m = x[i] + dt * v[i], x0 = x[i] - sg * v[i];
			float score = -(x[i] - x0 * s->one_m) / s->s2;
			mu[i] = m + s->c * score * dt;
		}
		break;
	default:
		for (size_t i = 0; i < n; i++) {
			float t1 = x[i] * s->a, t2 = v[i] * s->b;
			mu[i] = t1 + t2 * dt;
		}
		break;
	}
}

void hi3i_sde_sample(const float *mu, const float *xi, size_t n, const struct hi3i_sde *s, float *out)
{
	for (size_t i = 0; i < n; i++)
		out[i] = mu[i] + s->std * xi[i];
}

float hi3i_sde_logp(const float *xn, const float *mu, size_t n, const struct hi3i_sde *s)
{
	/* flow-grpo, dance-grpo: -(x' - mu)^2 / (2 std^2) - log std - log(2 pi) / 2;
	 * cps: -(x' - mu)^2, "all constants removed"; the terms summed in double */
	double sum = 0.0;

	if (s->kernel == HI3_SDE_CPS) {
		for (size_t i = 0; i < n; i++) {
			float d = xn[i] - mu[i];
			sum += -(d * d);
		}
	} else {
		const float c = half_log_2pi();
		for (size_t i = 0; i < n; i++) {
			float d = xn[i] - mu[i], term = -(d * d) / s->two_var - s->log_std - c;
			sum += term;
		}
	}
	return (float)(s->reduce == HI3_LOGP_SUM ? sum : sum / (double)n);
}

float hi3i_flow_row(const float *x, const float *vc, const float *vu, double g, hi3_dtype cfg_dt,
                    const struct hi3i_sde *sd, const float *xi, float sigma, float sigma_next, hi3_dtype lat_dt,
                    size_t n, float *vg, float *mu, float *xn)
{
	float logp = 0.0f;

	if (vu) {
		hi3i_cfg_combine(vc, vu, n, g, cfg_dt, vg);
		vc = vg;
	}
	if (sd) {
		hi3i_sde_mean(x, vc, n, sd, mu);
		hi3i_sde_sample(mu, xi, n, sd, xn);
	} else {
		hi3i_euler(x, vc, n, sigma, sigma_next, xn);
	}
	/* the sample as stored, then its log-prob (UniRL's order; the same
	 * as every project's with f32 latents) */
	for (size_t e = 0; e < n; e++)
		xn[e] = hi3i_round_to(xn[e], lat_dt);
	if (sd)
		logp = hi3i_sde_logp(xn, mu, n, sd);
	return logp;
}
