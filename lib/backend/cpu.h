/*
 * cpu.h -- what the CPU backend's files share (internal): its weight, and
 * the image ops of cpu-image.c that cpu.c's ops table points to.
 */
#ifndef HI3_CPU_H
#define HI3_CPU_H

#include "backend/backend.h"
#include "backend/gemm.h"

/* Fork threads for an op only when it is worth it (core/internal.h). */
#define PAR(work) HI3_PAR_WORTH(work)

struct hi3_wt {
	int kind;
	int N, K;                 /* matrix (N, K); vector n = N; rows (N = V, K = H) */
	const hi3_tensor *t;      /* the mapped tensor, as stored */
	hi3_wmat mat;             /* matrices: t in place */
	float *f32;               /* vectors: converted */
	int used;                 /* first use reported (be->first_use) */
	uint8_t *seen;            /* rows: a bit per row gathered so far */
	hi3_qweight qw;           /* a quantized matrix: mat.q points here */
};

#include <math.h>

/*
 * exp and tanh whose vector twins (cpu-image.c) give the same bits, for the
 * softmax of attention_dense and the tanh GELU:
 *
 * hi3i_exp_det(x): x = n ln 2 + r with n = x log2(e) rounded to nearest
 * even and r = x - n ln2_hi - n ln2_lo (fused), exp(r) by Cephes' degree-6
 * polynomial (fused Horner steps, then p r^2 + r, + 1), times 2^n; 0 below
 * -87 (where 2^n leaves the normal floats), x <= 88. Within 2 ulp of exp.
 * hi3i_tanh_det(u) = copysign(1 - 2 / (exp_det(2 min(|u|, 9)) + 1), u):
 * within 1 ulp of 1 in absolute terms (what 1 + tanh needs).
 */
#define HI3_EXP_LOG2E 1.44269504088896341f
#define HI3_EXP_LN2_HI 0.693359375f
#define HI3_EXP_LN2_LO -2.12194440e-4f
#define HI3_EXP_MIN -87.0f
#define HI3_TANH_MAX 9.0f
#define HI3_GELU_K 0.79788456080286536f   /* sqrt(2 / pi) */
static const float hi3i_exp_c[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f,
                                    1.6666665459e-1f, 5.0000001201e-1f};

static inline float hi3i_exp_det(float x)
{
	float n, r, p;
	union { float f; uint32_t u; } e;

	if (!(x >= HI3_EXP_MIN))
		return x != x ? x : 0.0f;
	n = nearbyintf(x * HI3_EXP_LOG2E);
	r = fmaf(n, -HI3_EXP_LN2_HI, x);
	r = fmaf(n, -HI3_EXP_LN2_LO, r);
	p = hi3i_exp_c[0];
	for (int i = 1; i < 6; i++)
		p = fmaf(p, r, hi3i_exp_c[i]);
	p = fmaf(p, r * r, r) + 1.0f;
	e.u = (uint32_t)((int)n + 127) << 23;
	return p * e.f;
}

static inline float hi3i_tanh_det(float u)
{
	if (u != u)
		return u;
	return copysignf(1.0f - 2.0f / (hi3i_exp_det(2.0f * fminf(fabsf(u), HI3_TANH_MAX)) + 1.0f), u);
}

/* The activations of the act op and of groupnorm's (enum hi3_act). */
static inline float hi3i_cpu_act1(float x, int act)
{
	switch (act) {
	case HI3_ACT_SILU:
		return x * (1.0f / (1.0f + expf(-x)));
	case HI3_ACT_GELU:
		return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
	case HI3_ACT_GELU_TANH:
		return 0.5f * x * (1.0f + hi3i_tanh_det(HI3_GELU_K * (x + 0.044715f * x * x * x)));
	}
	return x;
}

/* One element of groupnorm's output: the groupnorm op and a conv that
 * normalises its input while packing it share it, so their bits agree. */
static inline float hi3i_cpu_gn1(float x, float mean, float rstd, float w, float b, int act)
{
	return hi3i_cpu_act1((x - mean) * rstd * w + b, act);
}

/* cpu.c: p[i] = expf(p[i]) for n floats, bit for bit (vectorised where the
 * CPU's code gives expf's bits); the first call not from within a
 * parallel region (it probes). */
void hi3i_cpu_expf_n(float *p, int n);

/* cpu.c: report a matrix's first use (be->first_use), once. */
void hi3i_cpu_mark_used(hi3_backend *be, const hi3_wt *w);
/* cpu.c: the backend's scratch of at least n floats (kept and grown, on
 * 2 MiB pages where the kernel gives them; one user at a time: the conv's
 * packed input), or NULL when out of memory. */
float *hi3i_cpu_scratch(hi3_backend *be, size_t n);

/* cpu-conv.c: the conv op */
void hi3i_cpu_conv(hi3_backend *be, float *y, const float *x, const hi3_wt *w, const hi3_wt *b,
                   const struct hi3_conv *cv, const struct hi3_conv_norm *norm, int64_t p0, int64_t n);
/* The conv's packed input, at most about this many bytes (12 MiB): frames
 * are convolved in bands of rows that fit (tests make it small). */
extern size_t hi3i_cpu_conv_pack_bytes;
/* Whether a conv with a 3 x 3 spatial kernel runs as Winograd F(2x2, 3x3)
 * (cpu-conv.c): -1 by its rule (the default), 0 never, 1 whenever the
 * frame is even (tests); and the bytes of packed and transformed input of
 * a band of rows (16 MiB; tests make it small). */
extern int hi3i_cpu_conv_winograd;
int hi3i_cpu_conv_is_winograd(const struct hi3_conv *cv, int Cout);
extern size_t hi3i_cpu_conv_wino_bytes;

/* cpu-image.c (backend.h documents each op) */
/* mean and rstd (B, G) of groupnorm over x (B, P, C): the sums of the
 * groupnorm op; 0, or -1 with the failure recorded on be */
int hi3i_cpu_groupnorm_stats(hi3_backend *be, float *mean, float *rstd, const float *x, int B, int64_t P, int C,
                             int G, float eps);
void hi3i_cpu_bias_add(hi3_backend *be, float *x, const hi3_wt *b, int64_t M, int N);
void hi3i_cpu_groupnorm(hi3_backend *be, float *y, const float *x, const hi3_wt *w, const hi3_wt *b, int B,
                        int64_t P, int C, int G, float eps, int act);
void hi3i_cpu_layernorm(hi3_backend *be, float *y, const float *x, const hi3_wt *w, const hi3_wt *b, int M, int n,
                        float eps);
void hi3i_cpu_act(hi3_backend *be, float *y, const float *x, size_t n, int act);
void hi3i_cpu_scale_shift(hi3_backend *be, float *h, const float *ss, int B, int64_t P, int C);
void hi3i_cpu_add_repeat(hi3_backend *be, float *x, const float *z, int64_t P, int C, int r);
void hi3i_cpu_add_group_mean(hi3_backend *be, float *x, const float *z, int64_t P, int C, int r);
void hi3i_cpu_depth_to_space(hi3_backend *be, float *y, const float *x, int B, int T, int H, int W, int C, int rt);
void hi3i_cpu_space_to_depth(hi3_backend *be, float *y, const float *x, int B, int T, int H, int W, int C, int rt);
void hi3i_cpu_attention_dense(hi3_backend *be, float *out, const float *q, const float *k, const float *v,
                              const uint8_t *key_mask, int B, int M, int n_h, int d);

#endif
