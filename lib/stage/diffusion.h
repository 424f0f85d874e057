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

/* One SDE step's coefficients, by kernel (enum hi3_sde_kernel). */
struct hi3i_sde {
	int kernel, reduce;       /* enum hi3_sde_kernel, HI3_LOGP_MEAN or HI3_LOGP_SUM */
	float sigma, dt;          /* dt = sigma_next - sigma (< 0) */
	float std_t;              /* flow-grpo: eta sqrt(sigma / (1 - sigma')), sigma' = sigma_max at sigma 1 */
	float a, b;               /* flow-grpo: mean = x a + (v b) dt; cps: mean = x0 a + x1 b */
	float one_m, s2, c;       /* 1 - sigma; dance-grpo: sigma^2, -eta^2 / 2 */
	float std;                /* what multiplies the noise: the transition's std */
	float two_var, log_std;   /* 2 std^2 and log std of the log-density (not cps) */
};
void hi3i_sde_coeffs(int kernel, int reduce, float sigma, float sigma_next, float sigma_max, double eta,
                     struct hi3i_sde *s);
void hi3i_sde_mean(const float *x, const float *v, size_t n, const struct hi3i_sde *s, float *mu);
/* out (n) = mu + std xi */
void hi3i_sde_sample(const float *mu, const float *xi, size_t n, const struct hi3i_sde *s, float *out);
/* The kernel's log-density of xn around mu, reduced over the n elements. */
float hi3i_sde_logp(const float *xn, const float *mu, size_t n, const struct hi3i_sde *s);

/* One row's step: the guided velocity of vc and vu into vg (vu NULL: vc
 * alone), then the Euler step (sd NULL) or the SDE step with noise xi
 * (mean into mu), the result rounded to lat_dt into xn; returns the SDE
 * step's log-prob of xn as stored (0 for Euler). All (n). */
float hi3i_flow_row(const float *x, const float *vc, const float *vu, double g, hi3_dtype cfg_dt,
                    const struct hi3i_sde *sd, const float *xi, float sigma, float sigma_next, hi3_dtype lat_dt,
                    size_t n, float *vg, float *mu, float *xn);

/* -------------------------------------------------------- diffusion.c */

/* The denoiser's defects (HI3I_DN_*) of a diffusion ablation (enum hi3_ablation). */
unsigned hi3i_diffusion_defects(int ablate);

/* hi3i_denoiser_open (model/denoiser.h) for the gen_image rows of c, after
 * the checks that need the model (the conditions made for it, pixels for
 * every cond image), with the rows of the cond images (it2i) made by the
 * model's encoders (images.c); the error names the conditions file. */
int hi3i_diffusion_denoiser(struct hi3i_denoiser **out, hi3_model *m, const hi3_cond *c, const struct hi3i_dn_opts *o,
                            hi3_error *err);

#endif
