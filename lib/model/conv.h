/*
 * conv.h -- convolution layers on the backend ops table (internal): the
 * weights of one conv, loaded and shape-checked from a checkpoint and used
 * as stored, and a forward that is the backend's conv op (a 1x1x1 conv:
 * matmul, the GEMM's order). Shared by the image modules (the VAE,
 * patch_embed / final_layer).
 *
 * Layout: channels-last images (B, T, H, W, C), P = T H W (backend.h).
 */
#ifndef HI3_CONV_H
#define HI3_CONV_H

#include "backend/backend.h"
#include "model/hi3-model.h"

struct hi3_conv_w {
	hi3_wt *w;                /* [Cout, C, kt, kh, kw] as stored: the matrix (Cout, C kt kh kw) */
	hi3_wt *b;                /* (Cout), or NULL */
	int Cout, C, kt, kh, kw;
};

/* Tensor `name` of ck, which must be F32, BF16 or F16 of the given shape
 * (ndim entries), or NULL with an input error naming `where` (the model
 * directory), the tensor, and both shapes. */
const hi3_tensor *hi3i_tensor_checked(const hi3_ckpt *ck, const char *where, const char *name, int ndim,
                                      const int64_t *shape, hi3_error *err);
/* A weight the backend prepared from tensor `name` of ck, which must be
 * F32, BF16 or F16 of the given shape (ndim entries); the error names
 * `where` (the model directory), the tensor, and both shapes. */
hi3_wt *hi3i_weight_checked(hi3_backend *be, const hi3_ckpt *ck, const char *where, const char *name, int kind,
                            int ndim, const int64_t *shape, hi3_error *err);
/* PREFIX.weight [Cout, C, k, k, k] (dims 3) or [Cout, C, k, k] (dims 2),
 * and PREFIX.bias [Cout]. */
int hi3i_conv_load(struct hi3_conv_w *cw, hi3_backend *be, const hi3_ckpt *ck, const char *where, const char *prefix,
                   int Cout, int C, int dims, int k, hi3_error *err);
void hi3i_conv_free(struct hi3_conv_w *cw, hi3_backend *be);

/* y rows [p0, p0 + n) of conv(x) + bias, y (B, T, H, W, Cout) with row 0
 * at y (so y + p0 Cout is written), x (B, T, H, W, C) of dims cv (cv->C
 * = cw->C; the kernel sizes are cw's); norm, or NULL: the conv reads
 * act(groupnorm(x)) (backend.h). */
void hi3i_conv_rows(hi3_backend *be, float *y, const float *x, const struct hi3_conv_w *cw, const struct hi3_conv *cv,
                    const struct hi3_conv_norm *norm, int64_t p0, int64_t n);
/* All rows: y (B, T, H, W, Cout) = conv(x). */
void hi3i_conv(hi3_backend *be, float *y, const float *x, const struct hi3_conv_w *cw, const struct hi3_conv *cv,
               const struct hi3_conv_norm *norm);

/* Make the backend buffer *p hold n floats (its contents are not kept);
 * what names the user in the out-of-memory message. */
int hi3i_dev_reserve(hi3_backend *be, float **p, size_t *cap, size_t n, const char *what, hi3_error *err);

#endif
