/*
 * vae.c -- the image autoencoder (upstream hunyuan_image_3/autoencoder_kl_3d.py,
 * AutoencoderKLConv3D) on the backend ops table: the 3-D decoder (latents
 * to pixels) and the 3-D encoder (pixels to the posterior), fp32, one
 * image at a time, the real 3-D math (frames interact through the 3x3x3
 * convs and the GroupNorm statistics).
 *
 *   decoder: h = conv_in(z) + z repeated on channels; mid: ResnetBlock,
 *     AttnBlock (single head over all T H W positions), ResnetBlock;
 *     per level: layers_per_block + 1 ResnetBlocks, then UpsampleDCAE
 *     (conv to F Cout channels, + x repeated on channels, depth to space;
 *     F = 8 doubling T for the first log2(ffactor_temporal) levels, else 4)
 *     for the first log2(ffactor_spatial); GroupNorm + swish, conv_out,
 *     keep the last frame.
 *   encoder: the input repeated over ffactor_temporal frames; conv_in; per
 *     level: layers_per_block ResnetBlocks, then DownsampleDCAE (conv to
 *     Cout / F channels, space to depth, + the mean of x space-to-depth over
 *     channel groups) for the first log2(ffactor_spatial), halving T on the
 *     last log2(ffactor_temporal) of them; mid as the decoder's; conv_out
 *     of swish(GroupNorm(h)) + h averaged over channel groups: 2 z channels
 *     = mean | logvar.
 *   ResnetBlock: x' = nin(x) + conv2(swish(GN2(conv1(swish(GN1(x)))))),
 *     GroupNorm(32, eps 1e-6), nin a 1x1x1 conv when Cin != Cout.
 *
 * Layout: channels-last (T, H, W, C) per image (backend.h); the public
 * calls take and give planar (C, H, W) arrays as upstream's tensors.
 */
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "model/conv.h"
#include "model/model.h"
#include "model/vae.h"

#define GN_GROUPS 32
#define GN_EPS 1e-6f

struct vae_norm {
	hi3_wt *w, *b;            /* (C) */
	int C;
};

struct vae_res {
	struct vae_norm norm1, norm2;
	struct hi3_conv_w conv1, conv2;
	struct hi3_conv_w nin;    /* when Cin != Cout */
	int Cin, Cout;
};

struct vae_attn {
	struct vae_norm norm;
	struct hi3_conv_w q, k, v, proj;
	int C;
};

struct vae_level {
	struct vae_res *blocks;
	int n_blocks;
	int resample;             /* a DCAE up/downsample after the blocks */
	int temporal;             /* ... that also scales T by 2 */
	struct hi3_conv_w conv;   /* its conv */
	int Cin, Cout;            /* of the resample */
};

struct vae_coder {
	struct hi3_conv_w conv_in, conv_out;
	struct vae_level lv[HI3_VAE_MAX_LEVELS];
	struct vae_res mid1, mid2;
	struct vae_attn attn;
	struct vae_norm norm_out;
	int C_mid;                /* channels of the mid blocks */
};

struct hi3_vae {
	hi3_vae_config cfg;
	hi3_backend *be;
	const hi3_ckpt *ck;
	hi3_backend *own_be;      /* open_dir: the backend and checkpoint it owns */
	hi3_ckpt *own_ck;
	int parts;
	struct vae_coder enc, dec;
	/* device scratch, grown on demand */
	float *buf[3];            /* activations: current, and two temporaries */
	size_t cap[3];
	float *q, *k, *v;         /* mid attention (P, C) */
	size_t qkv_cap;
};

/* ------------------------------------------------------------ config */

static int is_pow2(int x)
{
	return x > 0 && !(x & (x - 1));
}

static int ilog2(int x)
{
	int n = 0;

	while (x > 1) {
		x >>= 1;
		n++;
	}
	return n;
}

/* What the VAE code needs of a parsed vae block beyond its types. */
static int vae_config_check(const hi3_vae_config *c, const char *name, hi3_error *err)
{
	if (!c->present)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: no 'vae' block (this model has no image autoencoder)", name);
	if (c->n_levels < 1)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: vae.block_out_channels: expected a list of 1 to %d integers",
		                     name, HI3_VAE_MAX_LEVELS);
	for (int i = 0; i < c->n_levels; i++)
		if (c->block_out_channels[i] % GN_GROUPS)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: vae.block_out_channels[%d]: expected a positive "
			                     "multiple of %d (GroupNorm's groups)", name, i, GN_GROUPS);
	if (c->scaling_factor == 0.0)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: vae.scaling_factor: expected a non-zero number", name);
	if (!is_pow2(c->ffactor_spatial) || !is_pow2(c->ffactor_temporal) || c->ffactor_temporal > c->ffactor_spatial ||
	    ilog2(c->ffactor_spatial) > c->n_levels - 1)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: vae: ffactor_spatial %d and ffactor_temporal %d must be powers "
		                     "of two, temporal <= spatial, with log2(spatial) below the %d levels", name,
		                     c->ffactor_spatial, c->ffactor_temporal, c->n_levels);
	return 0;
}

int hi3_vae_config_parse(hi3_vae_config *c, const char *config_json, const char *name, hi3_error *err)
{
	json_error_t je;
	json_t *root = json_loads(config_json ? config_json : "", 0, &je);
	int rc;

	memset(c, 0, sizeof(*c));
	if (!root)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: %s", name, je.line, je.text);
	rc = hi3i_config_vae_block(c, root, name, err) || vae_config_check(c, name, err) ? -1 : 0;
	json_decref(root);
	return rc;
}

/* ------------------------------------------------------------ the walk */

/* One walk of the architecture builds the VAE (LOAD: weights through the
 * backend) or lists its tensors (LIST): the names and shapes live once. */
struct walk {
	int list;
	hi3_backend *be;
	const hi3_ckpt *ck;
	const char *where;
	void (*fn)(void *ctx, const char *name, int ndim, const int64_t *shape);
	void *ctx;
	hi3_error *err;
};

static int w_conv(struct walk *wk, struct hi3_conv_w *cw, const char *prefix, int Cout, int C, int k)
{
	if (wk->list) {
		int64_t ws[5] = {Cout, C, k, k, k}, bs[1] = {Cout};
		char nm[256];
		snprintf(nm, sizeof(nm), "%s.weight", prefix);
		wk->fn(wk->ctx, nm, 5, ws);
		snprintf(nm, sizeof(nm), "%s.bias", prefix);
		wk->fn(wk->ctx, nm, 1, bs);
		*cw = (struct hi3_conv_w){.Cout = Cout, .C = C, .kt = k, .kh = k, .kw = k};
		return 0;
	}
	return hi3i_conv_load(cw, wk->be, wk->ck, wk->where, prefix, Cout, C, 3, k, wk->err);
}

static int w_norm(struct walk *wk, struct vae_norm *n, const char *prefix, int C)
{
	const int64_t s[1] = {C};
	char nm[256];

	n->C = C;
	snprintf(nm, sizeof(nm), "%s.weight", prefix);
	if (wk->list)
		wk->fn(wk->ctx, nm, 1, s);
	else if (!(n->w = hi3i_weight_checked(wk->be, wk->ck, wk->where, nm, HI3_WT_VECTOR, 1, s, wk->err)))
		return -1;
	snprintf(nm, sizeof(nm), "%s.bias", prefix);
	if (wk->list)
		wk->fn(wk->ctx, nm, 1, s);
	else if (!(n->b = hi3i_weight_checked(wk->be, wk->ck, wk->where, nm, HI3_WT_VECTOR, 1, s, wk->err)))
		return -1;
	return 0;
}

#define SUB(buf, ...) (snprintf(buf, sizeof(buf), __VA_ARGS__), buf)

static int w_res(struct walk *wk, struct vae_res *r, const char *prefix, int Cin, int Cout)
{
	char nm[256];

	r->Cin = Cin;
	r->Cout = Cout;
	if (w_norm(wk, &r->norm1, SUB(nm, "%s.norm1", prefix), Cin) ||
	    w_conv(wk, &r->conv1, SUB(nm, "%s.conv1", prefix), Cout, Cin, 3) ||
	    w_norm(wk, &r->norm2, SUB(nm, "%s.norm2", prefix), Cout) ||
	    w_conv(wk, &r->conv2, SUB(nm, "%s.conv2", prefix), Cout, Cout, 3))
		return -1;
	if (Cin != Cout && w_conv(wk, &r->nin, SUB(nm, "%s.nin_shortcut", prefix), Cout, Cin, 1))
		return -1;
	return 0;
}

static int w_mid(struct walk *wk, struct vae_coder *cd, const char *pre, int C)
{
	char nm[256];

	cd->C_mid = C;
	cd->attn.C = C;
	if (w_res(wk, &cd->mid1, SUB(nm, "%s.mid.block_1", pre), C, C) ||
	    w_norm(wk, &cd->attn.norm, SUB(nm, "%s.mid.attn_1.norm", pre), C) ||
	    w_conv(wk, &cd->attn.q, SUB(nm, "%s.mid.attn_1.q", pre), C, C, 1) ||
	    w_conv(wk, &cd->attn.k, SUB(nm, "%s.mid.attn_1.k", pre), C, C, 1) ||
	    w_conv(wk, &cd->attn.v, SUB(nm, "%s.mid.attn_1.v", pre), C, C, 1) ||
	    w_conv(wk, &cd->attn.proj, SUB(nm, "%s.mid.attn_1.proj_out", pre), C, C, 1) ||
	    w_res(wk, &cd->mid2, SUB(nm, "%s.mid.block_2", pre), C, C))
		return -1;
	return 0;
}

static int bad_arch(struct walk *wk, const char *what, int a, int b)
{
	return hi3_error_set(wk->err, HI3_ERR_INPUT, "%s: vae: %s (%d, %d): not a VAE upstream's code can build",
	                     wk->where, what, a, b);
}

/* The n ResnetBlocks of level i of a coder (PART "decoder.up" or
 * "encoder.down"): *in channels to C, then C to C. */
static int w_blocks(struct walk *wk, struct vae_level *lv, const char *part, int i, int n, int *in, int C)
{
	char nm[256];

	lv->n_blocks = n;
	if (!(lv->blocks = hi3i_calloc((size_t)n, sizeof(*lv->blocks), wk->err)))
		return -1;
	for (int j = 0; j < n; j++) {
		if (w_res(wk, &lv->blocks[j], SUB(nm, "vae.%s.%d.block.%d", part, i, j), *in, C))
			return -1;
		*in = C;
	}
	return 0;
}

static int w_decoder(struct walk *wk, struct vae_coder *cd, const hi3_vae_config *c)
{
	const int n = c->n_levels, z = c->latent_channels;
	int ch[HI3_VAE_MAX_LEVELS], in;
	char nm[256];

	for (int i = 0; i < n; i++)
		ch[i] = c->block_out_channels[n - 1 - i];
	in = ch[0];
	if (in % z)
		return bad_arch(wk, "the decoder's first channels are not a multiple of latent_channels", in, z);
	if (w_conv(wk, &cd->conv_in, "vae.decoder.conv_in", in, z, 3) || w_mid(wk, cd, "vae.decoder", in))
		return -1;
	for (int i = 0; i < n; i++) {
		struct vae_level *lv = &cd->lv[i];
		if (w_blocks(wk, lv, "decoder.up", i, c->layers_per_block + 1, &in, ch[i]))
			return -1;
		lv->resample = i < ilog2(c->ffactor_spatial);
		lv->temporal = i < ilog2(c->ffactor_temporal);
		if (lv->resample) {
			const int out = c->upsample_match_channel ? ch[i + 1] : in, F = lv->temporal ? 8 : 4;
			if ((F * out) % in)
				return bad_arch(wk, "an upsample's channels do not repeat evenly", in, out);
			lv->Cin = in;
			lv->Cout = out;
			if (w_conv(wk, &lv->conv, SUB(nm, "vae.decoder.up.%d.upsample.conv", i), F * out, in, 3))
				return -1;
			in = out;
		}
	}
	if (w_norm(wk, &cd->norm_out, "vae.decoder.norm_out", in) ||
	    w_conv(wk, &cd->conv_out, "vae.decoder.conv_out", c->out_channels, in, 3))
		return -1;
	return 0;
}

static int w_encoder(struct walk *wk, struct vae_coder *cd, const hi3_vae_config *c)
{
	const int n = c->n_levels, z = c->latent_channels;
	const int *ch = c->block_out_channels;
	int in = ch[0];
	char nm[256];

	if (w_conv(wk, &cd->conv_in, "vae.encoder.conv_in", in, c->in_channels, 3))
		return -1;
	for (int i = 0; i < n; i++) {
		struct vae_level *lv = &cd->lv[i];
		if (w_blocks(wk, lv, "encoder.down", i, c->layers_per_block, &in, ch[i]))
			return -1;
		lv->resample = i < ilog2(c->ffactor_spatial);
		lv->temporal = lv->resample && i >= ilog2(c->ffactor_spatial / c->ffactor_temporal);
		if (lv->resample) {
			const int out = c->downsample_match_channel ? ch[i + 1] : in, F = lv->temporal ? 8 : 4;
			if (out % F || (F * in) % out)
				return bad_arch(wk, "a downsample's channels do not split evenly", in, out);
			lv->Cin = in;
			lv->Cout = out;
			if (w_conv(wk, &lv->conv, SUB(nm, "vae.encoder.down.%d.downsample.conv", i), out / F, in, 3))
				return -1;
			in = out;
		}
	}
	if (in % (2 * z) || ch[n - 1] % (2 * z) || in / (ch[n - 1] / (2 * z)) != 2 * z)
		return bad_arch(wk, "the encoder's last channels do not average to 2 latent_channels", in, 2 * z);
	if (w_mid(wk, cd, "vae.encoder", in) || w_norm(wk, &cd->norm_out, "vae.encoder.norm_out", in) ||
	    w_conv(wk, &cd->conv_out, "vae.encoder.conv_out", 2 * z, in, 3))
		return -1;
	return 0;
}

static void norm_free(struct vae_norm *n, hi3_backend *be)
{
	if (!be)
		return;
	if (n->w)
		be->ops->weight_free(be, n->w);
	if (n->b)
		be->ops->weight_free(be, n->b);
}

static void conv_free(struct hi3_conv_w *cw, hi3_backend *be)
{
	if (be)
		hi3i_conv_free(cw, be);
}

static void res_free(struct vae_res *r, hi3_backend *be)
{
	norm_free(&r->norm1, be);
	norm_free(&r->norm2, be);
	conv_free(&r->conv1, be);
	conv_free(&r->conv2, be);
	conv_free(&r->nin, be);
}

/* be NULL: a listed coder (no weights) */
static void coder_free(struct vae_coder *cd, hi3_backend *be)
{
	conv_free(&cd->conv_in, be);
	conv_free(&cd->conv_out, be);
	for (int i = 0; i < HI3_VAE_MAX_LEVELS; i++) {
		for (int j = 0; cd->lv[i].blocks && j < cd->lv[i].n_blocks; j++)
			res_free(&cd->lv[i].blocks[j], be);
		free(cd->lv[i].blocks);
		conv_free(&cd->lv[i].conv, be);
	}
	res_free(&cd->mid1, be);
	res_free(&cd->mid2, be);
	norm_free(&cd->attn.norm, be);
	conv_free(&cd->attn.q, be);
	conv_free(&cd->attn.k, be);
	conv_free(&cd->attn.v, be);
	conv_free(&cd->attn.proj, be);
	norm_free(&cd->norm_out, be);
	memset(cd, 0, sizeof(*cd));
}

int hi3i_vae_tensors(const hi3_vae_config *c, int parts,
                     void (*fn)(void *ctx, const char *name, int ndim, const int64_t *shape), void *ctx,
                     hi3_error *err)
{
	struct walk wk = {.list = 1, .where = "config", .fn = fn, .ctx = ctx, .err = err};
	struct vae_coder cd = {0};
	int rc = 0;

	if (parts & HI3_VAE_DECODER)
		rc = w_decoder(&wk, &cd, c);
	coder_free(&cd, NULL);
	if (!rc && (parts & HI3_VAE_ENCODER))
		rc = w_encoder(&wk, &cd, c);
	coder_free(&cd, NULL);
	return rc;
}

/* ------------------------------------------------------------ open */

int hi3i_vae_open(hi3_vae **out, hi3_backend *be, const hi3_ckpt *ck, const hi3_vae_config *c, const char *where,
                  int parts, hi3_error *err)
{
	hi3_vae *v;
	struct walk wk = {.be = be, .ck = ck, .where = where, .err = err};
	static const char *probe[] = {"vae.decoder.conv_in.weight", "vae.encoder.conv_in.weight"};

	*out = NULL;
	if (!(parts & (HI3_VAE_DECODER | HI3_VAE_ENCODER)))
		return hi3_error_set(err, HI3_ERR_USAGE, "hi3_vae_open: no part asked for");
	for (int i = 0; i < 2; i++)
		if ((parts & (1 << i)) && !hi3_ckpt_find(ck, probe[i]))
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: no VAE %s: tensor '%s' is missing", where,
			                     i ? "encoder" : "decoder", probe[i]);
	if (hi3i_backend_check_image(be, err))
		return -1;
	if (!(v = hi3i_calloc(1, sizeof(*v), err)))
		return -1;
	v->cfg = *c;
	v->be = be;
	v->ck = ck;
	v->parts = parts;
	if (((parts & HI3_VAE_DECODER) && w_decoder(&wk, &v->dec, c)) ||
	    ((parts & HI3_VAE_ENCODER) && w_encoder(&wk, &v->enc, c))) {
		hi3_vae_close(v);
		return -1;
	}
	*out = v;
	return 0;
}

int hi3_vae_open(hi3_vae **out, hi3_model *m, int parts, hi3_error *err)
{
	hi3_vae_config c;
	char *name = hi3i_asprintf("%s/config.json", m->dir);
	int rc;

	*out = NULL;
	if (!name)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	c = m->cfg.vae;
	rc = vae_config_check(&c, name, err);
	free(name);
	if (rc)
		return -1;
	return hi3i_vae_open(out, m->be, m->ck, &c, m->dir, parts, err);
}

int hi3_vae_open_dir(hi3_vae **out, const char *dir, const hi3_model_opts *opts, int parts, hi3_error *err)
{
	hi3_model_opts def = {.backend = "cpu", .batch_invariant = 1};
	char *path = hi3i_asprintf("%s/config.json", dir), *text = NULL;
	hi3_backend *be = NULL;
	hi3_ckpt *ck = NULL;
	hi3_vae_config c;
	int rc = -1;

	*out = NULL;
	if (!opts)
		opts = &def;
	if (!path) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	if (hi3i_read_file(path, &text, NULL, err) || hi3_vae_config_parse(&c, text, path, err) ||
	    hi3_ckpt_open(&ck, dir, err))
		goto out;
	if ((rc = hi3i_backend_open(&be, opts, err)) || (rc = hi3i_vae_open(out, be, ck, &c, dir, parts, err)))
		goto out;
	(*out)->own_be = be;
	(*out)->own_ck = ck;
	be = NULL;
	ck = NULL;
out:
	if (be)
		be->ops->destroy(be);
	hi3_ckpt_close(ck);
	free(path);
	free(text);
	return rc;
}

static void scratch_free(hi3_vae *v)
{
	float **bufs[] = {&v->buf[0], &v->buf[1], &v->buf[2], &v->q, &v->k, &v->v};

	for (size_t i = 0; i < HI3_ARRAY_SIZE(bufs); i++) {
		if (*bufs[i])
			v->be->ops->free(v->be, *bufs[i]);
		*bufs[i] = NULL;
	}
	memset(v->cap, 0, sizeof(v->cap));
	v->qkv_cap = 0;
}

void hi3_vae_close(hi3_vae *v)
{
	if (!v)
		return;
	scratch_free(v);
	coder_free(&v->dec, v->be);
	coder_free(&v->enc, v->be);
	if (v->own_be)
		v->own_be->ops->destroy(v->own_be);
	hi3_ckpt_close(v->own_ck);
	free(v);
}

const hi3_vae_config *hi3_vae_get_config(const hi3_vae *v)
{
	return &v->cfg;
}

/* ------------------------------------------------------------ forward */

static int reserve(hi3_vae *v, float **p, size_t *cap, size_t n, hi3_error *err)
{
	return hi3i_dev_reserve(v->be, p, cap, n, "VAE", err);
}

/* A pass over one image: its dims change as levels resample. */
struct run {
	hi3_vae *v;
	hi3_backend *be;
	struct hi3_conv d;        /* the current activation x = buf[X] (B = 1, T, H, W, C) */
	hi3_error *err;
};

enum { X, A, Bt };            /* the three activation buffers */

static int64_t positions(const struct hi3_conv *d)
{
	return (int64_t)d->T * d->H * d->W;
}

static int need(struct run *r, int i, int64_t floats)
{
	return reserve(r->v, &r->v->buf[i], &r->v->cap[i], (size_t)floats, r->err);
}

/* Frees buffer i: the next need() allocates it at the size then wanted. */
static void release(struct run *r, int i)
{
	if (r->v->buf[i])
		r->be->ops->free(r->be, r->v->buf[i]);
	r->v->buf[i] = NULL;
	r->v->cap[i] = 0;
}

static void swap(struct run *r, int i, int j)
{
	float *p = r->v->buf[i];
	size_t c = r->v->cap[i];

	r->v->buf[i] = r->v->buf[j];
	r->v->cap[i] = r->v->cap[j];
	r->v->buf[j] = p;
	r->v->cap[j] = c;
}

/* dst (P, Cout) = conv(src (P, C)) at the current dims; n (or NULL): of
 * swish(GroupNorm_n(src)) instead (the groupnorm folded into the conv's
 * read of its input: one pass less) */
static void conv_norm(struct run *r, float *dst, const float *src, const struct hi3_conv_w *cw,
                      const struct vae_norm *n)
{
	struct hi3_conv d = r->d;
	const struct hi3_conv_norm gn = {n ? n->w : NULL, n ? n->b : NULL, GN_GROUPS, HI3_ACT_SILU, GN_EPS};

	d.C = cw->C;
	hi3i_conv(r->be, dst, src, cw, &d, n ? &gn : NULL);
}

static void conv(struct run *r, float *dst, const float *src, const struct hi3_conv_w *cw)
{
	conv_norm(r, dst, src, cw, NULL);
}

static void norm(struct run *r, float *dst, const float *src, const struct vae_norm *n, int act)
{
	r->be->ops->groupnorm(r->be, dst, src, n->w, n->b, 1, positions(&r->d), n->C, GN_GROUPS, GN_EPS, act);
}

static int failed(struct run *r)
{
	return hi3i_backend_failed(r->be, r->err);
}

/* x (P, Cin) -> x (P, Cout) */
static int resnet(struct run *r, const struct vae_res *rb)
{
	const int64_t P = positions(&r->d);
	float **b = r->v->buf;

	if (need(r, A, P * rb->Cout) || need(r, Bt, P * rb->Cout))
		return -1;
	conv_norm(r, b[Bt], b[X], &rb->conv1, &rb->norm1);
	conv_norm(r, b[A], b[Bt], &rb->conv2, &rb->norm2);
	if (rb->Cin != rb->Cout) {
		conv(r, b[Bt], b[X], &rb->nin);
		r->be->ops->add(r->be, b[Bt], b[A], (size_t)(P * rb->Cout));
		swap(r, X, Bt);
	} else {
		r->be->ops->add(r->be, b[X], b[A], (size_t)(P * rb->Cout));
	}
	r->d.C = rb->Cout;
	return failed(r);
}

/* x += proj_out(attention(q, k, v of GroupNorm(x))), one head of C */
static int attn(struct run *r, const struct vae_attn *at)
{
	hi3_vae *v = r->v;
	const int64_t P = positions(&r->d);
	const size_t n = (size_t)(P * at->C);
	float **b = v->buf;

	if (need(r, A, (int64_t)n) || need(r, Bt, (int64_t)n))
		return -1;
	if (n > v->qkv_cap) {
		for (int i = 0; i < 3; i++) {
			float **p = i == 0 ? &v->q : i == 1 ? &v->k : &v->v;
			size_t cap = v->qkv_cap;
			if (reserve(v, p, &cap, n, r->err))
				return -1;
		}
		v->qkv_cap = n;
	}
	norm(r, b[A], b[X], &at->norm, HI3_ACT_NONE);
	conv(r, v->q, b[A], &at->q);
	conv(r, v->k, b[A], &at->k);
	conv(r, v->v, b[A], &at->v);
	r->be->ops->attention_dense(r->be, b[A], v->q, v->k, v->v, NULL, 1, (int)P, 1, at->C);
	conv(r, b[Bt], b[A], &at->proj);
	r->be->ops->add(r->be, b[X], b[Bt], n);
	return failed(r);
}

static int mid(struct run *r, const struct vae_coder *cd)
{
	return resnet(r, &cd->mid1) || attn(r, &cd->attn) || resnet(r, &cd->mid2) ? -1 : 0;
}

/* UpsampleDCAE: x (T, H, W, Cin) -> (T rt, 2H, 2W, Cout) */
static int upsample(struct run *r, const struct vae_level *lv)
{
	const int rt = lv->temporal ? 2 : 1, F = rt * 4;
	const int64_t P = positions(&r->d);
	float **b = r->v->buf;

	if (need(r, A, P * F * lv->Cout) || need(r, Bt, P * F * lv->Cout))
		return -1;
	conv(r, b[A], b[X], &lv->conv);
	r->be->ops->add_repeat(r->be, b[A], b[X], P, F * lv->Cout, F * lv->Cout / lv->Cin);
	r->be->ops->depth_to_space(r->be, b[Bt], b[A], 1, r->d.T, r->d.H, r->d.W, lv->Cout, rt);
	swap(r, X, Bt);
	r->d.T *= rt;
	r->d.H *= 2;
	r->d.W *= 2;
	r->d.C = lv->Cout;
	return failed(r);
}

/* DownsampleDCAE: x (T, H, W, Cin) -> (T / rt, H / 2, W / 2, Cout) */
static int downsample(struct run *r, const struct vae_level *lv)
{
	const int rt = lv->temporal ? 2 : 1, F = rt * 4, T = r->d.T, H = r->d.H, W = r->d.W;
	const int64_t P = positions(&r->d), Pl = P / F;
	float **b = r->v->buf;

	if (T % rt || H % 2 || W % 2)
		return hi3_error_set(r->err, HI3_ERR_USAGE, "VAE encoder: cannot halve a %d x %d x %d (T x H x W) activation",
		                     T, H, W);
	if (need(r, A, P * HI3_MAX(lv->Cin, lv->Cout / F)) || need(r, Bt, Pl * lv->Cout))
		return -1;
	conv(r, b[A], b[X], &lv->conv);
	r->be->ops->space_to_depth(r->be, b[Bt], b[A], 1, T, H, W, lv->Cout / F, rt);
	r->be->ops->space_to_depth(r->be, b[A], b[X], 1, T, H, W, lv->Cin, rt);
	r->be->ops->add_group_mean(r->be, b[Bt], b[A], Pl, lv->Cout, F * lv->Cin / lv->Cout);
	swap(r, X, Bt);
	/* the activation is now 4-8x smaller: the level's two temporaries are
	 * freed rather than kept at their size for the rest of the pass, so
	 * that the deeper levels' weights, read next, add to less */
	release(r, A);
	release(r, Bt);
	r->d.T /= rt;
	r->d.H /= 2;
	r->d.W /= 2;
	r->d.C = lv->Cout;
	return failed(r);
}

static int levels(struct run *r, const struct vae_coder *cd, int n, int up)
{
	for (int i = 0; i < n; i++) {
		const struct vae_level *lv = &cd->lv[i];
		for (int j = 0; j < lv->n_blocks; j++)
			if (resnet(r, &lv->blocks[j]))
				return -1;
		if (lv->resample && (up ? upsample(r, lv) : downsample(r, lv)))
			return -1;
	}
	return 0;
}

/* image (out_channels, H, W) host = the last frame of the decoder of z (h, w, Cz) host channels-last */
static int decode_one(hi3_vae *v, const float *z, int h, int w, float *image, float *host, hi3_error *err)
{
	const struct vae_coder *cd = &v->dec;
	const int Cz = v->cfg.latent_channels, C0 = cd->conv_in.Cout, Co = v->cfg.out_channels;
	struct run r = {v, v->be, {1, 1, h, w, Cz, 3, 3, 3}, err};
	float **b = v->buf;
	int64_t P, last;

	if (need(&r, A, (int64_t)h * w * Cz) || need(&r, X, (int64_t)h * w * C0) ||
	    v->be->ops->upload(v->be, b[A], z, sizeof(float) * (size_t)h * w * Cz))
		return -1;
	conv(&r, b[X], b[A], &cd->conv_in);
	v->be->ops->add_repeat(v->be, b[X], b[A], (int64_t)h * w, C0, C0 / Cz);
	r.d.C = C0;
	if (failed(&r) || mid(&r, cd) || levels(&r, cd, v->cfg.n_levels, 1))
		return -1;
	P = positions(&r.d);
	last = P - (int64_t)r.d.H * r.d.W;          /* the last frame's first position */
	if (need(&r, Bt, P * Co))
		return -1;
	{
		const struct hi3_conv_norm gn = {cd->norm_out.w, cd->norm_out.b, GN_GROUPS, HI3_ACT_SILU, GN_EPS};
		hi3i_conv_rows(v->be, b[Bt], b[X], &cd->conv_out, &r.d, &gn, last, P - last);
	}
	if (failed(&r) || v->be->ops->download(v->be, host, b[Bt] + last * Co, sizeof(float) * (size_t)(P - last) * Co))
		return hi3i_backend_failed(v->be, err) ? -1 : hi3_error_set(err, HI3_ERR_RUNTIME, "VAE: %s", v->be->err.msg);
	for (int64_t p = 0; p < P - last; p++)
		for (int c = 0; c < Co; c++)
			image[(int64_t)c * (P - last) + p] = host[p * Co + c];
	return 0;
}

int hi3_vae_decode(hi3_vae *v, const float *latents, int B, int h, int w, float *images, hi3_error *err)
{
	const hi3_vae_config *c = &v->cfg;
	const int Cz = c->latent_channels, f = c->ffactor_spatial;
	const size_t hw = (size_t)h * w, HW = hw * (size_t)f * f;
	float *z = NULL, *host = NULL;
	int rc = -1;

	if (!(v->parts & HI3_VAE_DECODER))
		return hi3_error_set(err, HI3_ERR_USAGE, "hi3_vae_decode: the VAE was opened without its decoder");
	if (B < 0 || h <= 0 || w <= 0 || (int64_t)h * f > (1 << 16) || (int64_t)w * f > (1 << 16))
		return hi3_error_set(err, HI3_ERR_USAGE, "VAE decode: a %d x %d latent (expected 1 to %d a side)", h, w,
		                     (1 << 16) / f);
	if (!(z = hi3i_malloc(sizeof(float) * hw * Cz, err)) ||
	    !(host = hi3i_malloc(sizeof(float) * HW * (size_t)c->out_channels, err)))
		goto out;
	for (int bi = 0; bi < B; bi++) {
		const float *x = latents + (size_t)bi * Cz * hw;
		/* z = x / scaling (+ shift), channels-last */
		for (size_t p = 0; p < hw; p++)
			for (int ch = 0; ch < Cz; ch++) {
				float s = x[(size_t)ch * hw + p] / (float)c->scaling_factor;
				z[p * Cz + ch] = c->has_shift_factor ? s + (float)c->shift_factor : s;
			}
		if (decode_one(v, z, h, w, images + (size_t)bi * c->out_channels * HW, host, err))
			goto out;
	}
	rc = 0;
out:
	free(z);
	free(host);
	return rc;
}

/* The encoder's weights, read in place from the checkpoint's read-only
 * file mapping, are given back to the page cache before each picture: the
 * process's pages of them are dropped (madvise MADV_DONTNEED, whole pages
 * inside each tensor) and fault back in, from the page cache, when their
 * level runs. So the first levels, whose activations are the largest (3 x
 * 134 MB at 256 x 256, 9% of the released encoder's weights each), do not
 * run beside the deep levels' weights (1024 channels: 92% of them), and a
 * pass holds at most about its weights plus the activations of the level
 * at hand. A checkpoint is always a file mapping (hi3_ckpt_open), never
 * anonymous memory, which this would zero. */
static void encoder_weights_out(hi3_vae *v)
{
	const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	static const char pre[] = "vae.encoder.";

	for (int i = 0; i < hi3_ckpt_count(v->ck); i++) {
		const hi3_tensor *t = hi3_ckpt_at(v->ck, i);
		const uintptr_t a = ((uintptr_t)t->data + page - 1) & ~(page - 1);
		const uintptr_t e = ((uintptr_t)t->data + t->nbytes) & ~(page - 1);
		if (!strncmp(t->name, pre, sizeof(pre) - 1) && e > a)
			madvise((void *)a, e - a, MADV_DONTNEED);
	}
}

/* mean, logvar (Cz, h, w) host of the encoder of x (T, H, W, Cin) host channels-last */
static int encode_one(hi3_vae *v, const float *x, int H, int W, float *mean, float *logvar, float *host,
                      hi3_error *err)
{
	const struct vae_coder *cd = &v->enc;
	const int Cin = v->cfg.in_channels, T = v->cfg.ffactor_temporal, Cz = v->cfg.latent_channels;
	const int C0 = cd->conv_in.Cout;
	struct run r = {v, v->be, {1, T, H, W, Cin, 3, 3, 3}, err};
	const int64_t P0 = (int64_t)T * H * W;
	float **b = v->buf;
	int64_t P, hw;

	if (need(&r, A, P0 * Cin) || need(&r, X, P0 * C0) ||
	    v->be->ops->upload(v->be, b[A], x, sizeof(float) * (size_t)(P0 * Cin)))
		return -1;
	conv(&r, b[X], b[A], &cd->conv_in);
	r.d.C = C0;
	if (failed(&r) || levels(&r, cd, v->cfg.n_levels, 0) || mid(&r, cd))
		return -1;
	P = positions(&r.d);
	if (r.d.T != 1)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "VAE encoder: %d frames left, expected 1", r.d.T);
	if (need(&r, Bt, P * 2 * Cz))
		return -1;
	conv_norm(&r, b[Bt], b[X], &cd->conv_out, &cd->norm_out);
	v->be->ops->add_group_mean(v->be, b[Bt], b[X], P, 2 * Cz, r.d.C / (2 * Cz));
	if (failed(&r) || v->be->ops->download(v->be, host, b[Bt], sizeof(float) * (size_t)P * 2 * Cz))
		return hi3i_backend_failed(v->be, err) ? -1 : hi3_error_set(err, HI3_ERR_RUNTIME, "VAE: %s", v->be->err.msg);
	hw = P;
	for (int64_t p = 0; p < hw; p++)
		for (int c = 0; c < Cz; c++) {
			float lv = host[p * 2 * Cz + Cz + c];
			mean[(int64_t)c * hw + p] = host[p * 2 * Cz + c];
			logvar[(int64_t)c * hw + p] = lv < -30.0f ? -30.0f : lv > 20.0f ? 20.0f : lv;
		}
	return 0;
}

int hi3_vae_encode(hi3_vae *v, const float *images, int B, int H, int W, float *mean, float *logvar,
                   hi3_error *err)
{
	const hi3_vae_config *c = &v->cfg;
	const int f = c->ffactor_spatial, T = c->ffactor_temporal, Cin = c->in_channels, Cz = c->latent_channels;
	const size_t HW = (size_t)H * W, hw = HW / ((size_t)f * f);
	float *x = NULL, *host = NULL;
	int rc = -1;

	if (!(v->parts & HI3_VAE_ENCODER))
		return hi3_error_set(err, HI3_ERR_USAGE, "hi3_vae_encode: the VAE was opened without its encoder");
	if (B < 0 || H <= 0 || W <= 0 || H % f || W % f || H > (1 << 16) || W > (1 << 16))
		return hi3_error_set(err, HI3_ERR_USAGE, "VAE encode: a %d x %d image (each side a multiple of %d, at most "
		                     "%d)", H, W, f, 1 << 16);
	if (!(x = hi3i_malloc(sizeof(float) * HW * T * Cin, err)) ||
	    !(host = hi3i_malloc(sizeof(float) * hw * 2 * Cz, err)))
		goto out;
	for (int bi = 0; bi < B; bi++) {
		const float *im = images + (size_t)bi * Cin * HW;
		/* channels-last, the same picture in each of the T frames */
		for (size_t p = 0; p < HW; p++)
			for (int ch = 0; ch < Cin; ch++)
				x[p * Cin + ch] = im[(size_t)ch * HW + p];
		for (int t = 1; t < T; t++)
			memcpy(x + (size_t)t * HW * Cin, x, sizeof(float) * HW * Cin);
		encoder_weights_out(v);
		if (encode_one(v, x, H, W, mean + (size_t)bi * Cz * hw, logvar + (size_t)bi * Cz * hw, host, err))
			goto out;
	}
	rc = 0;
out:
	free(x);
	free(host);
	return rc;
}

void hi3_vae_latent(const hi3_vae *v, const float *mean, const float *logvar, const float *noise, size_t n,
                    float *latents)
{
	const float sf = (float)v->cfg.scaling_factor, sh = (float)v->cfg.shift_factor;

	for (size_t i = 0; i < n; i++) {
		float s = noise ? mean[i] + expf(0.5f * logvar[i]) * noise[i] : mean[i];
		latents[i] = v->cfg.has_shift_factor ? (s - sh) * sf : s * sf;
	}
}

void hi3_vae_to_rgb8(const float *image, int H, int W, uint8_t *rgb)
{
	const size_t HW = (size_t)H * W;

	for (size_t p = 0; p < HW; p++)
		for (int c = 0; c < 3; c++) {
			float x = image[(size_t)c * HW + p] / 2.0f + 0.5f;
			x = x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x;
			rgb[p * 3 + c] = (uint8_t)nearbyintf(x * 255.0f);
		}
}
