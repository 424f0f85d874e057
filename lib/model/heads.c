/*
 * heads.c -- the image heads of the diffusion path (heads.h), as upstream's
 * modeling_hunyuan_image_3.py (1201fe8) builds them with patch_size 1:
 *
 *   TimestepEmbedder(t) = mlp.2(GELU(mlp.0(sinusoid(t))))     (timestep_emb,
 *       time_embed, time_embed_2; the Distil's guidance_emb, timestep_r_emb)
 *   ResBlock(x, e):  h = conv3x3(SiLU(GN(x)));  [scale | shift] =
 *       emb_layers.1(SiLU(e));  h = conv3x3(SiLU(GN(h) (1 + scale) + shift));
 *       out = skip(x) + h, skip a 1x1 conv when the channels change
 *   patch_embed (UNetDown):  conv3x3(Z -> P), ResBlock(P -> H)
 *   final_layer (UNetUp, out_norm):  ResBlock(H -> P), GN, SiLU, conv3x3(P -> Z)
 *
 * GN is GroupNorm(32 groups, eps 1e-5, affine); every conv and linear has
 * a bias; dropout is the identity. Everything runs in fp32 through the ops
 * table (convs through model/conv.c), one call for all R
 * images, which the CPU ops compute image by image in a fixed order (a
 * row's bits do not depend on the batch).
 *
 * Shapes: R images, N = h w positions, H hidden, P patch hidden, Z latent
 * channels; activations channels-last (R, N, C).
 */
#include <math.h>
#include <string.h>
#include "model/conv.h"
#include "model/heads.h"

#define GN_GROUPS 32
#define GN_EPS 1e-5f

const char *const hi3i_temb_names[HI3I_TEMB_COUNT] = {"timestep_emb", "time_embed", "time_embed_2", "guidance_emb",
                                                      "timestep_r_emb"};

struct lin {
	hi3_wt *w, *b;            /* (N, K), (N) */
	int N, K;
};

struct norm {
	hi3_wt *w, *b;            /* (C) */
	int C;
};

struct temb {
	int present;
	struct lin l0, l2;        /* mlp.0 (H, 256), mlp.2 (H, H) */
};

struct resblock {
	struct norm in_norm, out_norm;
	struct hi3_conv_w in_conv, out_conv, skip;   /* skip: Cin != Cout */
	struct lin emb;           /* (2 Cout, H) */
	int Cin, Cout;
};

struct hi3i_heads {
	hi3_backend *be;
	const hi3_ckpt *ck;
	const char *where;
	int H, P, Z;
	struct temb t[HI3I_TEMB_COUNT];
	struct hi3_conv_w pe_conv;        /* patch_embed.model.0: (P, Z, 3, 3) */
	struct resblock pe_res;           /* patch_embed.model.1 */
	struct resblock fl_res;           /* final_layer.model.0 */
	struct norm fl_norm;              /* final_layer.model.1.0 */
	struct hi3_conv_w fl_conv;        /* final_layer.model.1.2: (Z, P, 3, 3) */
	/* device scratch, grown on demand */
	float *a, *b, *c, *small, *ss;
	size_t cap_a, cap_b, cap_c, cap_small, cap_ss;
};

/* ------------------------------------------------------------- loading */

static int load_lin(struct hi3i_heads *hd, struct lin *l, const char *prefix, int N, int K, hi3_error *err)
{
	char nm[192];
	int64_t ws[2] = {N, K}, bs[1] = {N};

	l->N = N;
	l->K = K;
	snprintf(nm, sizeof(nm), "%s.weight", prefix);
	if (!(l->w = hi3i_weight_checked(hd->be, hd->ck, hd->where, nm, HI3_WT_MATRIX, 2, ws, err)))
		return -1;
	snprintf(nm, sizeof(nm), "%s.bias", prefix);
	if (!(l->b = hi3i_weight_checked(hd->be, hd->ck, hd->where, nm, HI3_WT_VECTOR, 1, bs, err)))
		return -1;
	return 0;
}

static int load_norm(struct hi3i_heads *hd, struct norm *n, const char *prefix, int C, hi3_error *err)
{
	char nm[192];
	int64_t s[1] = {C};

	n->C = C;
	snprintf(nm, sizeof(nm), "%s.weight", prefix);
	if (!(n->w = hi3i_weight_checked(hd->be, hd->ck, hd->where, nm, HI3_WT_VECTOR, 1, s, err)))
		return -1;
	snprintf(nm, sizeof(nm), "%s.bias", prefix);
	if (!(n->b = hi3i_weight_checked(hd->be, hd->ck, hd->where, nm, HI3_WT_VECTOR, 1, s, err)))
		return -1;
	return 0;
}

static int load_res(struct hi3i_heads *hd, struct resblock *r, const char *pre, int Cin, int Cout, hi3_error *err)
{
	char nm[192];

	r->Cin = Cin;
	r->Cout = Cout;
#define P(s) (snprintf(nm, sizeof(nm), "%s.%s", pre, s), nm)
	if (load_norm(hd, &r->in_norm, P("in_layers.0"), Cin, err) ||
	    hi3i_conv_load(&r->in_conv, hd->be, hd->ck, hd->where, P("in_layers.2"), Cout, Cin, 2, 3, err) ||
	    load_lin(hd, &r->emb, P("emb_layers.1"), 2 * Cout, hd->H, err) ||
	    load_norm(hd, &r->out_norm, P("out_layers.0"), Cout, err) ||
	    hi3i_conv_load(&r->out_conv, hd->be, hd->ck, hd->where, P("out_layers.3"), Cout, Cout, 2, 3, err))
		return -1;
	if (Cin != Cout &&
	    hi3i_conv_load(&r->skip, hd->be, hd->ck, hd->where, P("skip_connection"), Cout, Cin, 2, 1, err))
		return -1;
#undef P
	return 0;
}

static int load_temb(struct hi3i_heads *hd, int which, hi3_error *err)
{
	struct temb *t = &hd->t[which];
	char p[96];

	snprintf(p, sizeof(p), "%s.mlp.0", hi3i_temb_names[which]);
	if (load_lin(hd, &t->l0, p, hd->H, HI3I_TEMB_FREQ, err))
		return -1;
	snprintf(p, sizeof(p), "%s.mlp.2", hi3i_temb_names[which]);
	if (load_lin(hd, &t->l2, p, hd->H, hd->H, err))
		return -1;
	t->present = 1;
	return 0;
}

static void free_lin(hi3_backend *be, struct lin *l)
{
	if (l->w)
		be->ops->weight_free(be, l->w);
	if (l->b)
		be->ops->weight_free(be, l->b);
}

static void free_norm(hi3_backend *be, struct norm *n)
{
	if (n->w)
		be->ops->weight_free(be, n->w);
	if (n->b)
		be->ops->weight_free(be, n->b);
}

static void free_res(hi3_backend *be, struct resblock *r)
{
	free_norm(be, &r->in_norm);
	free_norm(be, &r->out_norm);
	hi3i_conv_free(&r->in_conv, be);
	hi3i_conv_free(&r->out_conv, be);
	hi3i_conv_free(&r->skip, be);
	free_lin(be, &r->emb);
}

void hi3i_heads_close(struct hi3i_heads *hd)
{
	hi3_backend *be;
	float *bufs[5];

	if (!hd)
		return;
	be = hd->be;
	bufs[0] = hd->a, bufs[1] = hd->b, bufs[2] = hd->c, bufs[3] = hd->small, bufs[4] = hd->ss;
	for (int i = 0; i < 5; i++)
		if (bufs[i])
			be->ops->free(be, bufs[i]);
	for (int i = 0; i < HI3I_TEMB_COUNT; i++) {
		free_lin(be, &hd->t[i].l0);
		free_lin(be, &hd->t[i].l2);
	}
	hi3i_conv_free(&hd->pe_conv, be);
	free_res(be, &hd->pe_res);
	free_res(be, &hd->fl_res);
	free_norm(be, &hd->fl_norm);
	hi3i_conv_free(&hd->fl_conv, be);
	free(hd);
}

int hi3i_heads_present(const hi3_ckpt *ck)
{
	return hi3_ckpt_find(ck, "timestep_emb.mlp.0.weight") != NULL;
}

int hi3i_heads_open(struct hi3i_heads **out, hi3_backend *be, const hi3_ckpt *ck, const hi3_config *c,
                    const char *where, hi3_error *err)
{
	struct hi3i_heads *hd;

	*out = NULL;
	if (strcmp(c->img_proj_type, "unet"))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s/config.json: field \"img_proj_type\": '%s' (hi3 builds the "
		                     "unet image heads)", where, c->img_proj_type);
	if (c->patch_size != 1)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s/config.json: field \"patch_size\": %d (hi3 builds the image "
		                     "heads of patch_size 1, the released checkpoints')", where, c->patch_size);
	if (!c->vae.present || c->vae.latent_channels < 1)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s/config.json: no \"vae\" block: the image heads take their "
		                     "latent channels from vae.latent_channels", where);
	if (c->hidden_size % GN_GROUPS || c->patch_embed_hidden_dim < 1 || c->patch_embed_hidden_dim % GN_GROUPS)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s/config.json: hidden_size %d and patch_embed_hidden_dim %d must "
		                     "be positive multiples of %d (GroupNorm's groups)", where, c->hidden_size,
		                     c->patch_embed_hidden_dim, GN_GROUPS);
	if (!hi3i_heads_present(ck))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: no image heads: tensor 'timestep_emb.mlp.0.weight' is "
		                     "missing (a text-only checkpoint cannot generate images)", where);
	if (hi3i_backend_check_image(be, err))
		return -1;
	if (!(hd = hi3i_calloc(1, sizeof(*hd), err)))
		return -1;
	hd->be = be;
	hd->ck = ck;
	hd->where = where;
	hd->H = c->hidden_size;
	hd->P = c->patch_embed_hidden_dim;
	hd->Z = c->vae.latent_channels;
	if (load_temb(hd, HI3I_TEMB_TIMESTEP, err) || load_temb(hd, HI3I_TEMB_PATCH, err) ||
	    load_temb(hd, HI3I_TEMB_FINAL, err) || (c->cfg_distilled && load_temb(hd, HI3I_TEMB_GUIDANCE, err)) ||
	    (c->use_meanflow && load_temb(hd, HI3I_TEMB_TIMESTEP_R, err)) ||
	    hi3i_conv_load(&hd->pe_conv, be, ck, where, "patch_embed.model.0", hd->P, hd->Z, 2, 3, err) ||
	    load_res(hd, &hd->pe_res, "patch_embed.model.1", hd->P, hd->H, err) ||
	    load_res(hd, &hd->fl_res, "final_layer.model.0", hd->H, hd->P, err) ||
	    load_norm(hd, &hd->fl_norm, "final_layer.model.1.0", hd->P, err) ||
	    hi3i_conv_load(&hd->fl_conv, be, ck, where, "final_layer.model.1.2", hd->Z, hd->P, 2, 3, err)) {
		hi3i_heads_close(hd);
		return -1;
	}
	hd->where = NULL;         /* only for the messages of loading */
	*out = hd;
	return 0;
}

/* ------------------------------------------------------------- forward */

static int reserve(struct hi3i_heads *hd, float **p, size_t *cap, size_t n, hi3_error *err)
{
	return hi3i_dev_reserve(hd->be, p, cap, n, "the image heads", err);
}

void hi3i_timestep_sinusoid(float t, float *out)
{
	const int half = HI3I_TEMB_FREQ / 2;
	/* torch: exp(-math.log(10000) * arange(half, float32) / half), in fp32 */
	const float neg_log = (float)-log(10000.0);

	for (int k = 0; k < half; k++) {
		float f = expf(neg_log * (float)k / (float)half), a = t * f;
		out[k] = cosf(a);
		out[half + k] = sinf(a);
	}
}

/* y (M, N) = x (M, K) W^T + b */
static void linear(hi3_backend *be, float *y, const float *x, const struct lin *l, int M)
{
	be->ops->matmul(be, y, x, l->w, M);
	be->ops->bias_add(be, y, l->b, M, l->N);
}

int hi3i_heads_temb(struct hi3i_heads *hd, int which, const float *t, int n, float *out, hi3_error *err)
{
	hi3_backend *be = hd->be;
	const struct temb *e = &hd->t[which];
	float *freq = NULL;
	int rc = -1;

	HI3_ASSERT(which >= 0 && which < HI3I_TEMB_COUNT && n > 0);
	if (!e->present)
		return hi3_error_set(err, HI3_ERR_INPUT, "the model has no %s", hi3i_temb_names[which]);
	if (reserve(hd, &hd->small, &hd->cap_small, (size_t)n * (HI3I_TEMB_FREQ + (size_t)hd->H), err) ||
	    !(freq = hi3i_malloc(sizeof(float) * (size_t)n * HI3I_TEMB_FREQ, err)))
		goto out;
	for (int i = 0; i < n; i++)
		hi3i_timestep_sinusoid(t[i], freq + (size_t)i * HI3I_TEMB_FREQ);
	if (be->ops->upload(be, hd->small, freq, sizeof(float) * (size_t)n * HI3I_TEMB_FREQ))
		goto failed;
	{
		float *mid = hd->small + (size_t)n * HI3I_TEMB_FREQ;
		linear(be, mid, hd->small, &e->l0, n);
		be->ops->act(be, mid, mid, (size_t)n * hd->H, HI3_ACT_GELU);
		linear(be, out, mid, &e->l2, n);
	}
	if (hi3i_backend_failed(be, err))
		goto out;
	rc = 0;
	goto out;
failed:
	if (!hi3i_backend_failed(be, err))
		hi3_error_set(err, HI3_ERR_RUNTIME, "the %s backend could not copy the timestep frequencies", be->name);
out:
	free(freq);
	return rc;
}

/* y = conv(x) of R images h x w; n (or NULL): of SiLU(GN_n(x)) instead,
 * the groupnorm done as the conv reads its input */
static void conv(struct hi3i_heads *hd, float *y, const float *x, const struct hi3_conv_w *cw, int R, int h, int w,
                 const struct norm *n)
{
	struct hi3_conv cv = {R, 1, h, w, cw->C, cw->kt, cw->kh, cw->kw};
	const struct hi3_conv_norm gn = {n ? n->w : NULL, n ? n->b : NULL, GN_GROUPS, HI3_ACT_SILU, GN_EPS};

	hi3i_conv(hd->be, y, x, cw, &cv, n ? &gn : NULL);
}

/* out (R, N, Cout) = ResBlock(x (R, N, Cin), temb (R, H)); out != x; uses a and b */
static int resblock(struct hi3i_heads *hd, float *out, const float *x, const struct resblock *r, int R, int h, int w,
                    const float *temb, hi3_error *err)
{
	hi3_backend *be = hd->be;
	const int64_t N = (int64_t)h * w;
	const size_t n_in = (size_t)R * N * r->Cin, n_out = (size_t)R * N * r->Cout;

	if (reserve(hd, &hd->a, &hd->cap_a, HI3_MAX(n_in, n_out), err) || reserve(hd, &hd->b, &hd->cap_b, n_out, err) ||
	    reserve(hd, &hd->ss, &hd->cap_ss, (size_t)R * ((size_t)hd->H + 2 * (size_t)r->Cout), err))
		return -1;
	/* in_layers: GN, SiLU, conv */
	conv(hd, hd->b, x, &r->in_conv, R, h, w, &r->in_norm);
	/* emb_layers: SiLU, linear -> [scale | shift] per image */
	{
		float *e = hd->ss, *ss = hd->ss + (size_t)R * hd->H;
		be->ops->act(be, e, temb, (size_t)R * hd->H, HI3_ACT_SILU);
		linear(be, ss, e, &r->emb, R);
		/* out_layers: GN (1 + scale) + shift, SiLU, conv */
		be->ops->groupnorm(be, hd->b, hd->b, r->out_norm.w, r->out_norm.b, R, N, r->Cout, GN_GROUPS, GN_EPS,
		                   HI3_ACT_NONE);
		be->ops->scale_shift(be, hd->b, ss, R, N, r->Cout);
	}
	be->ops->act(be, hd->b, hd->b, n_out, HI3_ACT_SILU);
	conv(hd, hd->a, hd->b, &r->out_conv, R, h, w, NULL);
	/* skip(x) + h */
	if (r->Cin != r->Cout) {
		conv(hd, out, x, &r->skip, R, h, w, NULL);
	} else {
		be->ops->zero(be, out, n_out);
		be->ops->add(be, out, x, n_out);
	}
	be->ops->add(be, out, hd->a, n_out);
	return hi3i_backend_failed(be, err);
}

int hi3i_heads_patch_embed(struct hi3i_heads *hd, const float *x, int R, int h, int w, const float *temb, float *out,
                           hi3_error *err)
{
	/* the first conv's output (R, N, P) in scratch c (the ResBlock uses a and b) */
	if (reserve(hd, &hd->c, &hd->cap_c, (size_t)R * h * w * hd->P, err))
		return -1;
	conv(hd, hd->c, x, &hd->pe_conv, R, h, w, NULL);
	if (hi3i_backend_failed(hd->be, err))
		return -1;
	return resblock(hd, out, hd->c, &hd->pe_res, R, h, w, temb, err);
}

int hi3i_heads_final(struct hi3i_heads *hd, const float *hid, int R, int h, int w, const float *temb, float *v,
                     hi3_error *err)
{
	hi3_backend *be = hd->be;
	const int64_t N = (int64_t)h * w;

	if (reserve(hd, &hd->c, &hd->cap_c, (size_t)R * N * hd->P, err) ||
	    resblock(hd, hd->c, hid, &hd->fl_res, R, h, w, temb, err))
		return -1;
	conv(hd, v, hd->c, &hd->fl_conv, R, h, w, &hd->fl_norm);
	return hi3i_backend_failed(be, err);
}
