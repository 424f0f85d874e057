/*
 * cpu.h -- what the CPU backend's files share (internal): its weight, and
 * the image ops of cpu-image.c that cpu.c's ops table points to.
 */
#ifndef HI3_CPU_H
#define HI3_CPU_H

#include "backend/backend.h"
#include "backend/gemm.h"

/* Fork threads for an elementwise op only when it has this much work:
 * below it the fork/join costs more than it saves (decode at small B). */
#define PAR(work) ((work) >= ((size_t)1 << 16))

struct hi3_wt {
	int kind;
	int N, K;                 /* matrix (N, K); vector n = N; rows (N = V, K = H) */
	const hi3_tensor *t;      /* the mapped tensor, as stored */
	hi3_wmat mat;             /* matrices: t in place */
	float *f32;               /* vectors: converted */
	int used;                 /* first use reported (be->first_use) */
	uint8_t *seen;            /* rows: a bit per row gathered so far */
	hi3_tensor copy;          /* HI3_WT_TRANSIENT: t is &copy, its data owned */
};

/* cpu-image.c (backend.h documents each op) */
void hi3i_cpu_im2col(hi3_backend *be, float *col, const float *x, const struct hi3_conv *cv, int64_t p0, int n);
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
