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
 *
 * Image ops (the VAE, the image heads, the vision encoder) hold an image
 * channels-last: (B, T, H, W, C), B images of P = T H W positions (frames
 * T, rows H, columns W) of C channels, so a (P, C) image is a (M, K)
 * activation for matmul; a conv weight [Cout, C, kt, kh, kw] is used as
 * stored, the (N = Cout, K = C kt kh kw) matrix of the conv op.
 */
#ifndef HI3_BACKEND_H
#define HI3_BACKEND_H

#include "core/internal.h"
#include "backend/quant.h"

/* A weight as a backend uses it: the CPU multiplies the mapped tensor in
 * place; CUDA holds a device copy. */
typedef struct hi3_wt hi3_wt;

enum hi3_wt_kind {
	HI3_WT_MATRIX,   /* (N, K): used by matmul as y = x W^T; a tensor of more
	                  * dims is (shape[0], the product of the rest) */
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
	int64_t row_stride;       /* elements from one cache row to the next; 0: n_kv C d. A rank of a
	                           * tensor-parallel layout stores its kv heads (k, v at its first head)
	                           * of a cache that holds more (hi3-parallel(7)) */
} hi3_kv_dst;

struct hi3_dims {
	int H, n_h, n_kv, d;      /* n_h, n_kv: this rank's heads (all of them in one process) */
	float eps;
	int kv_all;               /* the model's kv heads: a backend that splits work by its amount
	                           * counts these, so that every layout splits alike (0: n_kv) */
};

/* A convolution of stride 1 with zero padding k/2 on each side (odd
 * kernel sizes; kt = kh = kw = 1 is a 1x1x1 conv, kt = 1 a 2-D one), over
 * an input (B, T, H, W, C); the output has the same B, T, H, W. */
struct hi3_conv {
	int B, T, H, W, C;
	int kt, kh, kw;
};

/* A conv's input normalised on the way in: act(groupnorm(x)), G groups
 * over each image's positions, affine w, b (C), as the groupnorm op would
 * write it (on the CPU bit for bit). */
struct hi3_conv_norm {
	const hi3_wt *w, *b;
	int G, act;
	float eps;
};

/* Elementwise activations (the act op; groupnorm's fused act). */
enum hi3_act {
	HI3_ACT_NONE,
	HI3_ACT_SILU,        /* x sigmoid(x) (swish) */
	HI3_ACT_GELU,        /* x/2 (1 + erf(x / sqrt 2)), nn.GELU() */
	HI3_ACT_GELU_TANH,   /* x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), gelu_pytorch_tanh */
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
	/* optional (NULL: the backend runs no quantized weight): a weight-only
	 * quantized (N, K) matrix for matmul (quant.h), its codes the tensor t
	 * and its scales mapped beside it, copied into the weight (q need not
	 * outlive the call; the bytes it points to do) */
	hi3_wt *(*qweight)(struct hi3_backend *be, const hi3_tensor *t, const struct hi3_qweight *q, hi3_error *err);
	/* optional: after the model's last weight (CUDA: waits for the uploads,
	 * -v reports their rate); 0, or -1 with err set */
	int (*weights_done)(struct hi3_backend *be, hi3_error *err);

	/* the KV cache: device view of kv heads [h0, h0 + nh) of every row of
	 * a host cache (all of them in one process; a tensor-parallel rank's
	 * own). CPU: the host memory itself; CUDA: a device copy of those
	 * heads, which kv_sync_host writes back (no other head of the host
	 * cache is written: other ranks write theirs into the same file) */
	int (*kv_attach)(struct hi3_backend *be, hi3_kvcache *kv, int h0, int nh, hi3_error *err);
	void (*kv_detach)(struct hi3_backend *be, hi3_kvcache *kv);
	/* where layer's K and V of heads [h0, h0 + nh), as attached, are: dst
	 * k, v at head h0 of row 0, dtype, C and the row stride */
	void (*kv_layer)(struct hi3_backend *be, hi3_kvcache *kv, int layer, int h0, int nh, hi3_kv_dst *dst);
	int (*kv_sync_host)(struct hi3_backend *be, hi3_kvcache *kv, hi3_error *err);
	/* optional: wait for every op enqueued before it (a collective on
	 * device buffers then reads them from outside the backend's stream);
	 * 0, or -1 with be->err set. CUDA: cudaStreamSynchronize */
	int (*sync)(struct hi3_backend *be);

	/* ops */
	/* y (M, N) = x (M, K) . W^T, W (N, K)
	 * CPU: cpu_matmul (gemm.c over W as stored, or OpenBLAS); CUDA: cuBLAS, kernels/gemv.cu for few rows */
	void (*matmul)(struct hi3_backend *be, float *y, const float *x, const hi3_wt *w, int M);
	/* n products y[i] (M[i], N_i) = x[i] . W_i^T, the same bits as n
	 * matmul calls; optional (NULL: the model calls matmul n times)
	 * CPU: cpu_matmul_group (hi3i_gemm_group); CUDA: kernels/gemv.cu gemv_group, cuBLAS */
	void (*matmul_group)(struct hi3_backend *be, int n, float *const *y, const float *const *x,
	                     const hi3_wt *const *w, const int *M);
	/* the products the next matmul or matmul_group runs (n weights, M[i]
	 * rows each), named before the small ops that come first, so that
	 * the backend may start reading their weights meanwhile; optional
	 * (NULL: nothing). CPU: cpu_prefetch (hi3i_gemm_prefetch: an idle
	 * worker of the team reads the first bytes into cache); CUDA: none */
	void (*prefetch)(struct hi3_backend *be, int n, const hi3_wt *const *w, const int *M);
	/* x (M, H) = rows ids (M) of wte.  CPU: cpu_embed; CUDA: kernels/embed.cu */
	void (*embed)(struct hi3_backend *be, float *x, const int64_t *ids, const hi3_wt *wte, int M);
	/* y (M, n) = rmsnorm(x (M, n)) * w (n); y may equal x
	 * CPU: cpu_rmsnorm; CUDA: kernels/rmsnorm.cu */
	void (*rmsnorm)(struct hi3_backend *be, float *y, const float *x, const hi3_wt *w, int M, int n,
	                float eps);
	/* dst (rows, cols) with row stride ldd = src (rows, cols) with row
	 * stride lds, floats (the blocks of a gathered product); optional (the
	 * model calls it only with a communicator on device buffers).
	 * CPU: cpu_copy2d; CUDA: cudaMemcpy2DAsync */
	void (*copy2d)(struct hi3_backend *be, float *dst, size_t ldd, const float *src, size_t lds, int rows,
	               int cols);
	/* y (M, w) = sum over j < k, in order, of scale[m k + j] src[where[m k + j]]
	 * rows: the same bits as zero(y) then scatter_add of src's rows in the
	 * order where lists them (a token's experts in ascending id), in one
	 * call whatever the routing; optional (NULL: the model zeroes and
	 * scatter_adds expert by expert). CUDA: kernels/gather.cu */
	void (*combine)(struct hi3_backend *be, float *y, const float *src, const int32_t *where, const float *scale,
	                int M, int k, int w);
	/* optional, decode steps replayed from graphs (CUDA graphs): set_graphs
	 * at open (mode 0: where the device has them, 1 on, 2 off; 0 or -1 with
	 * err when on cannot be had); graph_begin(M) before one decode step of
	 * M tokens (1: the step's ops may run from a graph captured when the
	 * same ops with the same arguments ran before; the same bits as run
	 * one by one), graph_end after it. CUDA: lib/backend/cuda.c */
	int (*set_graphs)(struct hi3_backend *be, int mode, hi3_error *err);
	int (*graph_begin)(struct hi3_backend *be, int M);
	void (*graph_end)(struct hi3_backend *be);
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
	/* dst[idx[i]] = src[i], rows of width w; no two i share an idx (the
	 * image and timestep rows that replace a diffusion call's embeddings)
	 * CPU: cpu_scatter; CUDA: kernels/gather.cu */
	void (*scatter)(struct hi3_backend *be, float *dst, const float *src, const int32_t *idx, int n, int w);

	/* image ops: needed only by checkpoints with image modules, so checked
	 * when those load (hi3i_backend_check_image), not at model open.
	 * Every one is batch invariant on the CPU: an image (or row) gives the
	 * same bits alone or in a batch. */

	/* y (B, T, H, W, Cout) rows [p0, p0 + n) = conv(x) + b, x (B, T, H,
	 * W, C) of cv (stride 1, zero padding k/2, odd kernel sizes), w the
	 * weight as stored [Cout, C, kt, kh, kw] (a HI3_WT_MATRIX), b (Cout) or
	 * NULL; y's row 0 at y. norm (or NULL): the conv reads act(groupnorm(x))
	 * instead of x (struct hi3_conv_norm; statistics over each whole image,
	 * whatever the rows).
	 * CPU: hi3i_cpu_conv (lib/backend/cpu-conv.c: a direct convolution, every
	 * output one fused multiply-add chain over k = ((c kt + dt) kh + dy) kw
	 * + dx, then + b; a 3 x 3 spatial kernel over even frames of at least
	 * 256 positions and 16 channels in and out as Winograd F(2x2, 3x3),
	 * its own fixed order (cpu-conv.c); batch invariant either way);
	 * CUDA: kernels/conv.cu im2col in the weight's order, then cuBLAS, in
	 * chunks of rows */
	void (*conv)(struct hi3_backend *be, float *y, const float *x, const hi3_wt *w, const hi3_wt *b,
	             const struct hi3_conv *cv, const struct hi3_conv_norm *norm, int64_t p0, int64_t n);
	/* x (M, N) += b (N).  CPU: hi3i_cpu_bias_add; CUDA: kernels/elementwise.cu */
	void (*bias_add)(struct hi3_backend *be, float *x, const hi3_wt *b, int64_t M, int N);
	/* y (B, P, C) = act((x - mean) / sqrt(var + eps) w[c] + b[c]), mean
	 * and (biased) var of each image's group of C/G channels over its P
	 * positions, in fp32; y may equal x. The sums run over fixed chunks of
	 * HI3_GN_CHUNK positions, then over the chunks in order.
	 * CPU: hi3i_cpu_groupnorm (lib/backend/cpu-image.c, as every image op); CUDA: kernels/norm.cu */
	void (*groupnorm)(struct hi3_backend *be, float *y, const float *x, const hi3_wt *w, const hi3_wt *b, int B,
	                  int64_t P, int C, int G, float eps, int act);
	/* y (M, n) = (x - mean) / sqrt(var + eps) w + b per row, fp32; y may
	 * equal x.  CPU: hi3i_cpu_layernorm; CUDA: kernels/norm.cu */
	void (*layernorm)(struct hi3_backend *be, float *y, const float *x, const hi3_wt *w, const hi3_wt *b, int M,
	                  int n, float eps);
	/* y (n) = act(x (n)), enum hi3_act; y may equal x.
	 * CPU: hi3i_cpu_act; CUDA: kernels/elementwise.cu */
	void (*act)(struct hi3_backend *be, float *y, const float *x, size_t n, int act);
	/* h (B, P, C) = h (1 + scale) + shift per channel, ss (B, 2C) = [scale | shift]
	 * of each image (a timestep-conditioned ResBlock).
	 * CPU: hi3i_cpu_scale_shift; CUDA: kernels/elementwise.cu */
	void (*scale_shift)(struct hi3_backend *be, float *h, const float *ss, int B, int64_t P, int C);
	/* x (P, C) += z (P, C / r) with each channel repeated r times: x[p, c]
	 * += z[p, c / r] (torch repeat_interleave on channels).
	 * CPU: hi3i_cpu_add_repeat; CUDA: kernels/conv.cu */
	void (*add_repeat)(struct hi3_backend *be, float *x, const float *z, int64_t P, int C, int r);
	/* x (P, C) += the mean of z (P, C r) over each group of r channels:
	 * x[p, c] += (z[p, c r] + ... + z[p, c r + r - 1]) / r, summed in order.
	 * CPU: hi3i_cpu_add_group_mean; CUDA: kernels/conv.cu */
	void (*add_group_mean)(struct hi3_backend *be, float *x, const float *z, int64_t P, int C, int r);
	/* y (B, T rt, 2H, 2W, C) = x (B, T, H, W, rt 4 C) with channel
	 * ((i 2 + j) 2 + k) C + c moved to position (f rt + i, 2y + j, 2x + k),
	 * rt 1 or 2 (einops "b (r1 r2 r3 c) f h w -> b c (f r1) (h r2) (w r3)").
	 * CPU: hi3i_cpu_depth_to_space; CUDA: kernels/conv.cu */
	void (*depth_to_space)(struct hi3_backend *be, float *y, const float *x, int B, int T, int H, int W, int C,
	                       int rt);
	/* The inverse: y (B, T / rt, H / 2, W / 2, rt 4 C) from x (B, T, H, W, C).
	 * CPU: hi3i_cpu_space_to_depth; CUDA: kernels/conv.cu */
	void (*space_to_depth)(struct hi3_backend *be, float *y, const float *x, int B, int T, int H, int W, int C,
	                       int rt);
	/* out (B, M, n_h d) = softmax(q k^T / sqrt(d)) v per image and head,
	 * q, k, v (B, M, n_h d) with head h in columns h d .. h d + d - 1;
	 * key_mask (B, M) (1: a key to attend, 0: padding) or NULL: all keys.
	 * Any d (the VAE's single head is d = C up to 1024): two GEMMs per
	 * (image, head, block of queries), softmax of the scores in fp32; a
	 * query whose image has no key to attend gets zeros.
	 * CPU: hi3i_cpu_attention_dense (the packed GEMM of gemm.c, or OpenBLAS);
	 * CUDA: cuBLAS and kernels/softmax.cu */
	void (*attention_dense)(struct hi3_backend *be, float *out, const float *q, const float *k, const float *v,
	                        const uint8_t *key_mask, int B, int M, int n_h, int d);
} hi3_backend_ops;

/* Positions per chunk of the groupnorm op's sums. */
#define HI3_GN_CHUNK 1024

/* Record the first failure of an op on be (later ones are dropped). */
void hi3i_backend_fail(hi3_backend *be, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* 0, or -1 with be's recorded failure copied into err. */
int hi3i_backend_failed(const hi3_backend *be, hi3_error *err);
/* Refuse a backend that lacks an op the model needs, at model open
 * (optional ops may be NULL); the message names the backend and the op. */
int hi3i_backend_check(const hi3_backend *be, hi3_error *err);
/* The same for the image ops, when a model's image modules load. */
int hi3i_backend_check_image(const hi3_backend *be, hi3_error *err);

int hi3i_backend_cpu(hi3_backend **out, int threads, int batch_invariant, hi3_error *err);
int hi3i_backend_cuda(hi3_backend **out, int threads, int batch_invariant, hi3_error *err);
/* Load cuBLAS, which libhi3 does not link (cuda.c); 0, or -1 with err set.
 * A no-op in a build without CUDA or on the emulator. */
int hi3i_cublas_load(hi3_error *err);

/* RoPE frequencies theta_m = base^(-2m/d), m < d/2, computed like the
 * upstream fp32 code. */
void hi3i_rope_theta(float *theta, int d, double base);

#endif
