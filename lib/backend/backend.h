/*
 * backend.h -- the backend ops table. The model code (model/forward.c) calls these
 * ops and never a kernel directly, so it does not know where it runs. The
 * CPU backend (cpu.c) and the CUDA backend (cuda.c, with
 * kernels/NAME.cu) fill the same table; tests compare them op by op.
 *
 * Every pointer an op takes is a backend ("device") pointer from ->alloc or
 * ->kv_view, unless its comment says host. Activations are f32.
 *
 * Shape letters: M tokens (rows of an activation), K input width, N output
 * width, H hidden, W = (n_h + 2 n_kv) d the fused qkv width, d head dim,
 * g = n_h / n_kv query heads per kv head, E experts, k experts per token.
 */
#ifndef HI3_BACKEND_H
#define HI3_BACKEND_H

#include "core/internal.h"

/* A weight as a backend uses it: the CPU multiplies the mapped tensor in
 * place; CUDA holds a device copy. */
typedef struct hi3_wt hi3_wt;

enum hi3_wt_kind {
	HI3_WT_MATRIX,   /* (N, K): used by matmul as y = x W^T */
	HI3_WT_VECTOR,   /* (n): norm weights, kept as f32 */
	HI3_WT_ROWS,     /* (V, H): embedding rows, gathered by embed */
};

/* Where attention reads keys or values: element (row, head, slot, 0..d-1)
 * is at base + row*row_stride + head*head_stride + slot*slot_stride. */
typedef struct hi3_kv_src {
	const void *base;
	hi3_dtype dtype;          /* F32 or BF16 */
	int64_t row_stride, head_stride, slot_stride;   /* in elements */
} hi3_kv_src;

/* One query of an attention call: it reads row `row` of the sources and
 * admits key slot j when j <= hi, or blk_lo <= j < blk_hi (a full-attention
 * block holding the query; blk_lo = blk_hi = 0 when none). */
typedef struct hi3_attn_q {
	int32_t row, hi, blk_lo, blk_hi;
} hi3_attn_q;

/* Where kv_store writes: cache row and slot for each of M tokens. */
typedef struct hi3_kv_dst {
	void *k, *v;              /* (B, n_kv, C, d) */
	hi3_dtype dtype;
	int C;
} hi3_kv_dst;

struct hi3_dims {
	int H, n_h, n_kv, d;
	float eps;
};

/* A backend: one instance (its state in ctx) and its ops table, a static
 * const table in the backend's file. Ops return nothing; an op that
 * fails (out of memory for its scratch, a device fault) records the first
 * failure in err, and the model checks hi3i_backend_failed after each
 * layer, so the caller gets an error, never an abort. Each op below names
 * its CPU implementation (lib/backend/cpu.c) and its CUDA kernel file. */
typedef struct hi3_backend {
	const char *name;
	const struct hi3_backend_ops *ops;
	void *ctx;
	int batch_invariant;
	hi3_error err;            /* the first failure of an op (status 0: none) */
	/* Set by the model, or NULL: called on the host the first time the
	 * backend reads a weight's bytes (a matrix or vector whole, an
	 * embedding row when a token first needs it), with the bytes read:
	 * weights.c checks them for NaN/Inf and counts what a stage touched. */
	void (*first_use)(struct hi3_backend *be, const hi3_tensor *t, const void *data, size_t bytes);
	void *first_use_ctx;
} hi3_backend;

typedef struct hi3_backend_ops {
	void (*destroy)(struct hi3_backend *be);

	/* memory */
	void *(*alloc)(struct hi3_backend *be, size_t bytes);   /* NULL when out of memory */
	void (*free)(struct hi3_backend *be, void *p);
	/* 0, or -1 with be->err set */
	int (*upload)(struct hi3_backend *be, void *dst, const void *host_src, size_t n);
	int (*download)(struct hi3_backend *be, void *host_dst, const void *src, size_t n);
	size_t (*mem_free)(struct hi3_backend *be);           /* bytes free, for messages */

	/* weights: t stays mapped while the model is open. CPU: nothing is
	 * copied (vectors become f32); CUDA: uploaded, see weights_done */
	hi3_wt *(*weight)(struct hi3_backend *be, const hi3_tensor *t, int kind, hi3_error *err);
	void (*weight_free)(struct hi3_backend *be, hi3_wt *w);
	/* optional: after the model's last weight (CUDA: waits for the uploads,
	 * -v reports their rate); 0, or -1 with err set */
	int (*weights_done)(struct hi3_backend *be, hi3_error *err);

	/* the KV cache: device view of a host cache (CPU: the host memory) */
	int (*kv_attach)(struct hi3_backend *be, hi3_kvcache *kv, hi3_error *err);
	void (*kv_detach)(struct hi3_backend *be, hi3_kvcache *kv);
	void (*kv_layer)(struct hi3_backend *be, hi3_kvcache *kv, int layer, void **k, void **v);
	int (*kv_sync_host)(struct hi3_backend *be, hi3_kvcache *kv, hi3_error *err);

	/* ops */
	/* y (M, N) = x (M, K) . W^T, W (N, K)
	 * CPU: cpu_matmul (gemm.c over W as stored, or OpenBLAS); CUDA: cuBLAS, kernels/gemv.cu for few rows */
	void (*matmul)(struct hi3_backend *be, float *y, const float *x, const hi3_wt *w, int M);
	/* n products y[i] (M[i], N_i) = x[i] . W_i^T, the same bits as n
	 * matmul calls; optional (NULL: the model calls matmul n times)
	 * CPU: cpu_matmul_group (hi3i_gemm_group); CUDA: kernels/gemv.cu gemv_group, cuBLAS */
	void (*matmul_group)(struct hi3_backend *be, int n, float *const *y, const float *const *x,
	                     const hi3_wt *const *w, const int *M);
	/* x (M, H) = rows ids (M) of wte.  CPU: cpu_embed; CUDA: kernels/embed.cu */
	void (*embed)(struct hi3_backend *be, float *x, const int64_t *ids, const hi3_wt *wte, int M);
	/* y (M, n) = rmsnorm(x (M, n)) * w (n); y may equal x
	 * CPU: cpu_rmsnorm; CUDA: kernels/rmsnorm.cu */
	void (*rmsnorm)(struct hi3_backend *be, float *y, const float *x, const hi3_wt *w, int M, int n,
	                float eps);
	/* x (n) = 0.  CPU: cpu_zero; CUDA: cudaMemsetAsync */
	void (*zero)(struct hi3_backend *be, float *x, size_t n);
	/* x (n) += y (n).  CPU: cpu_add; CUDA: kernels/elementwise.cu */
	void (*add)(struct hi3_backend *be, float *x, const float *y, size_t n);
	/* In place on qkv (M, W): RoPE on every query and key head at pos
	 * (M, 2) (y, x), then (qn, kn not NULL) RMSNorm over d of each. theta
	 * (d/2) f32 per-element frequencies.  CPU: cpu_rope_qk; CUDA: kernels/rope.cu */
	void (*rope_qk)(struct hi3_backend *be, float *qkv, const int32_t *pos, const float *theta,
	                const hi3_wt *qn, const hi3_wt *kn, const struct hi3_dims *dm, int M);
	/* Store K and V of qkv (M, W) at dst[row[m], :, slot[m], :]; slot -1
	 * skips. Tokens of one row are stored in order m (the last write to a
	 * slot wins).  CPU: cpu_kv_store; CUDA: kernels/kvcache.cu */
	void (*kv_store)(struct hi3_backend *be, const hi3_kv_dst *dst, const float *qkv, const int32_t *row,
	                 const int64_t *slot, const struct hi3_dims *dm, int M);
	/* out (M, n_h d) = softmax(q k^T / sqrt(d)) v over admitted keys, q
	 * from qkv (M, W); zeros for a query that admits no key.
	 * CPU: cpu_attention; CUDA: kernels/attention.cu */
	void (*attention)(struct hi3_backend *be, float *out, const float *qkv, const hi3_kv_src *k,
	                  const hi3_kv_src *v, const hi3_attn_q *q, const struct hi3_dims *dm, int M);
	/* y (M, inter) = a * silu(b), ab (M, 2 inter) = [a | b]
	 * CPU: cpu_swiglu; CUDA: kernels/elementwise.cu */
	void (*swiglu)(struct hi3_backend *be, float *y, const float *ab, int M, int inter);
	/* dst (n, w) = src[idx[i]] rows.  CPU: cpu_gather; CUDA: kernels/gather.cu */
	void (*gather)(struct hi3_backend *be, float *dst, const float *src, const int32_t *idx, int n, int w);
	/* dst[idx[i]] += scale[i] * src[i], rows of width w, i in order
	 * CPU: cpu_scatter_add; CUDA: kernels/gather.cu */
	void (*scatter_add)(struct hi3_backend *be, float *dst, const float *src, const int32_t *idx,
	                    const float *scale, int n, int w);
} hi3_backend_ops;

/* Record the first failure of an op on be (later ones are dropped). */
void hi3i_backend_fail(hi3_backend *be, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* 0, or -1 with be's recorded failure copied into err. */
int hi3i_backend_failed(const hi3_backend *be, hi3_error *err);
/* Refuse a backend that lacks an op the model needs, at model open
 * (optional ops may be NULL); the message names the backend and the op. */
int hi3i_backend_check(const hi3_backend *be, hi3_error *err);

int hi3i_backend_cpu(hi3_backend **out, int threads, int batch_invariant, hi3_error *err);
int hi3i_backend_cuda(hi3_backend **out, int threads, int batch_invariant, hi3_error *err);
/* Load cuBLAS, which libhi3 does not link (cuda.c); 0, or -1 with err set.
 * A no-op in a build without CUDA or on the emulator. */
int hi3i_cublas_load(hi3_error *err);

/* RoPE frequencies theta_m = base^(-2m/d), m < d/2, computed like the
 * upstream fp32 code. */
void hi3i_rope_theta(float *theta, int d, double base);

#endif
