/*
 * conv.c -- convolution layers on the backend (conv.h): the conv op, or
 * matmul for a 1x1x1 conv.
 */
#include <string.h>
#include "model/conv.h"

const hi3_tensor *hi3i_tensor_checked(const hi3_ckpt *ck, const char *where, const char *name, int ndim,
                                      const int64_t *shape, hi3_error *err)
{
	const hi3_tensor *t = hi3_ckpt_find(ck, name);
	char want[128], got[128];
	int same;

	if (!t) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s' is missing", where, name);
		return NULL;
	}
	same = t->ndim == ndim;
	for (int i = 0; same && i < ndim; i++)
		same = t->shape[i] == shape[i];
	if (!same) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s': expected %s, found %s", where, name,
		              hi3_shape_str(want, sizeof(want), ndim, shape), hi3_shape_str(got, sizeof(got), t->ndim, t->shape));
		return NULL;
	}
	if (t->dtype != HI3_F32 && t->dtype != HI3_BF16 && t->dtype != HI3_F16) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s': dtype %s (expected F32, BF16 or F16)", where, name,
		              hi3_dtype_name(t->dtype));
		return NULL;
	}
	return t;
}

hi3_wt *hi3i_weight_checked(hi3_backend *be, const hi3_ckpt *ck, const char *where, const char *name, int kind,
                            int ndim, const int64_t *shape, hi3_error *err)
{
	const hi3_tensor *t = hi3i_tensor_checked(ck, where, name, ndim, shape, err);
	hi3_wt *w;

	if (!t)
		return NULL;
	if (!(w = be->ops->weight(be, t, kind, err)))
		hi3_error_prefix(err, "%s: tensor '%s'", where, name);
	return w;
}

int hi3i_conv_load(struct hi3_conv_w *cw, hi3_backend *be, const hi3_ckpt *ck, const char *where, const char *prefix,
                   int Cout, int C, int dims, int k, hi3_error *err)
{
	int64_t ws[5] = {Cout, C, k, k, k}, bs[1] = {Cout};
	char nm[256];

	memset(cw, 0, sizeof(*cw));
	cw->Cout = Cout;
	cw->C = C;
	cw->kt = dims == 3 ? k : 1;
	cw->kh = cw->kw = k;
	snprintf(nm, sizeof(nm), "%s.weight", prefix);
	if (!(cw->w = hi3i_weight_checked(be, ck, where, nm, HI3_WT_MATRIX, 2 + dims, ws, err)))
		return -1;
	snprintf(nm, sizeof(nm), "%s.bias", prefix);
	if (!(cw->b = hi3i_weight_checked(be, ck, where, nm, HI3_WT_VECTOR, 1, bs, err)))
		return -1;
	return 0;
}

void hi3i_conv_free(struct hi3_conv_w *cw, hi3_backend *be)
{
	if (cw->w)
		be->ops->weight_free(be, cw->w);
	if (cw->b)
		be->ops->weight_free(be, cw->b);
	memset(cw, 0, sizeof(*cw));
}

static int is_1x1(const struct hi3_conv_w *cw)
{
	return cw->kt == 1 && cw->kh == 1 && cw->kw == 1;
}

void hi3i_conv_rows(hi3_backend *be, float *y, const float *x, const struct hi3_conv_w *cw, const struct hi3_conv *cv,
                    const struct hi3_conv_norm *norm, int64_t p0, int64_t n)
{
	const struct hi3_conv k = {cv->B, cv->T, cv->H, cv->W, cw->C, cw->kt, cw->kh, cw->kw};

	HI3_ASSERT(cv->C == cw->C);
	if (n <= 0)
		return;
	if (!is_1x1(cw) || norm) {
		be->ops->conv(be, y, x, cw->w, cw->b, &k, norm, p0, n);
		return;
	}
	/* a 1x1x1 conv is a linear layer: the GEMM's order (gemm.h) */
	for (int64_t r0 = p0; r0 < p0 + n; r0 += (int64_t)1 << 30) {
		const int m = (int)HI3_MIN((int64_t)1 << 30, p0 + n - r0);
		float *yr = y + r0 * cw->Cout;
		be->ops->matmul(be, yr, x + r0 * cw->C, cw->w, m);
		if (cw->b)
			be->ops->bias_add(be, yr, cw->b, m, cw->Cout);
	}
}

void hi3i_conv(hi3_backend *be, float *y, const float *x, const struct hi3_conv_w *cw, const struct hi3_conv *cv,
               const struct hi3_conv_norm *norm)
{
	hi3i_conv_rows(be, y, x, cw, cv, norm, 0, (int64_t)cv->B * cv->T * cv->H * cv->W);
}

int hi3i_dev_reserve(hi3_backend *be, float **p, size_t *cap, size_t n, const char *what, hi3_error *err)
{
	if (n <= *cap)
		return 0;
	if (*p)
		be->ops->free(be, *p);
	*cap = 0;
	if (!(*p = be->ops->alloc(be, n * sizeof(float))))
		return hi3_error_set(err, HI3_ERR_RUNTIME, "%s: out of %s memory for %.1f MiB of activations (%zu MiB free)",
		                     what, be->name, (double)n * 4 / 1048576.0, be->ops->mem_free(be) >> 20);
	*cap = n;
	return 0;
}
