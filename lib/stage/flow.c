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

void hi3i_sde_coeffs(float sigma, float sigma_next, float sigma_max, float eta, struct hi3i_sde *s)
{
	/* FlowSDEStrategy: std_dev_t = sqrt(sigma / (1 - (sigma == 1 ? sigma_max
	 * : sigma))) eta; mean = x (1 + std^2 / (2 sigma) dt) + v (1 + std^2
	 * (1 - sigma) / (2 sigma)) dt; the transition's std std_dev_t sqrt(-dt) */
	const float dt = sigma_next - sigma, den = 1.0f - (sigma == 1.0f ? sigma_max : sigma);
	const float std_t = sqrtf(sigma / den) * eta, var = std_t * std_t, two_s = 2.0f * sigma;

	s->dt = dt;
	s->std_t = std_t;
	s->a = 1.0f + var / two_s * dt;
	s->b = 1.0f + var * (1.0f - sigma) / two_s;
	s->std = std_t * sqrtf(-dt);
}

void hi3i_sde_mean(const float *x, const float *v, size_t n, const struct hi3i_sde *s, float *mu)
{
	for (size_t i = 0; i < n; i++) {
		float t1 = x[i] * s->a, t2 = v[i] * s->b;
		mu[i] = t1 + t2 * s->dt;
	}
}

void hi3i_sde_sample(const float *mu, const float *xi, size_t n, const struct hi3i_sde *s, float *out)
{
	for (size_t i = 0; i < n; i++)
		out[i] = mu[i] + s->std * xi[i];
}

float hi3i_sde_logp(const float *xn, const float *mu, size_t n, const struct hi3i_sde *s)
{
	/* mean over the elements of -(x' - mu)^2 / (2 std^2) - log std - log(2 pi) / 2 */
	const float two_var = 2.0f * (s->std * s->std), log_std = logf(s->std);
	const float half_log_2pi = (float)(0.5 * log(2.0 * 3.14159265358979323846));
	double sum = 0.0;

	for (size_t i = 0; i < n; i++) {
		float d = xn[i] - mu[i], term = -(d * d) / two_var - log_std - half_log_2pi;
		sum += term;
	}
	return (float)(sum / (double)n);
}
