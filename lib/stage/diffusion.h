/*
 * diffusion.h -- what the diffusion stage's parts share (internal): the
 * sampler arithmetic (flow.c), and the model's denoiser (model/denoiser.h)
 * opened on a conditions file's gen_image rows (diffusion.c), which the
 * capture, the diffusion replay (diffusion-replay.c) and parity use.
 *
 * Shape letters: B requests, R = B cfg rows of the conditions (cond rows,
 * then uncond rows), Z latent channels, h, w the latent grid, N = h w, L
 * the conditions' columns, T steps, K SDE steps.
 */
#ifndef HI3_DIFFUSION_H
#define HI3_DIFFUSION_H

#include "model/denoiser.h"
#include "stage/hi3-stage.h"

/* the noise streams of a row (hi3_normal, core/philox.c): x_T, then one per step */
#define HI3I_STREAM_XT 0
#define HI3I_STREAM_STEP(i) ((uint64_t)(i) + 1)
/* and the posterior sample of the row's k-th cond image (stage/images.c) */
#define HI3I_STREAM_VAE(k) ((UINT64_C(1) << 40) + (uint64_t)(k))

/* ------------------------------------------------------------- flow.c */

/* sigmas (T + 1): linspace(1, 0, T + 1) shifted, fp32 as upstream. */
void hi3i_flow_sigmas(int T, double shift, float *sigmas);
/* x stored as dt and read back (f32: x). */
float hi3i_round_to(float x, hi3_dtype dt);
/* out (n) = v_u + g (v_c - v_u), each operation rounded to dt. */
void hi3i_cfg_combine(const float *vc, const float *vu, size_t n, double g, hi3_dtype dt, float *out);
/* out (n) = x + (sigma_next - sigma) v */
void hi3i_euler(const float *x, const float *v, size_t n, float sigma, float sigma_next, float *out);

/* One SDE step's coefficients (Flow-GRPO). */
struct hi3i_sde {
	float dt;                 /* sigma_next - sigma (< 0) */
	float std_t;              /* eta sqrt(sigma / (1 - sigma')), sigma' = sigma_max at sigma 1 */
	float a, b;               /* mean = x a + (v b) dt */
	float std;                /* of the transition: std_t sqrt(-dt) */
};
void hi3i_sde_coeffs(float sigma, float sigma_next, float sigma_max, float eta, struct hi3i_sde *s);
void hi3i_sde_mean(const float *x, const float *v, size_t n, const struct hi3i_sde *s, float *mu);
/* out (n) = mu + std xi */
void hi3i_sde_sample(const float *mu, const float *xi, size_t n, const struct hi3i_sde *s, float *out);
/* The mean over n of the Gaussian log-density of xn around mu. */
float hi3i_sde_logp(const float *xn, const float *mu, size_t n, const struct hi3i_sde *s);

/* -------------------------------------------------------- diffusion.c */

/* hi3i_denoiser_open (model/denoiser.h) for the gen_image rows of c, after
 * the checks that need the model (the conditions made for it, pixels for
 * every cond image), with the rows of the cond images (it2i) made by the
 * model's encoders (images.c); the error names the conditions file. */
int hi3i_diffusion_denoiser(struct hi3i_denoiser **out, hi3_model *m, const hi3_cond *c, const struct hi3i_dn_opts *o,
                            hi3_error *err);

#endif
