/*
 * vit.c -- the vision encoder (upstream hunyuan_image_3/siglip2.py at
 * 1201fe8: Siglip2VisionTransformer, SigLIP2 so400m naflex) and the aligner
 * (LightProjector) on the backend ops table, fp32:
 *
 *   x = patch_embedding(pixel_values) + pos        pixel_values (n, P, D)
 *         pos: position_embedding.weight as a (g, g, H) grid, g^2 =
 *         num_patches, resized per image to its (nph, npw) with bilinear,
 *         align_corners=False, antialias=True in fp32 (host side, cached
 *         per grid), flattened row-major, slots nph npw .. P-1 = its row 0
 *   per layer (pre-LN):
 *     x += out_proj(MHA(layer_norm1(x)))           q, k, v with biases;
 *         scores q k^T d^-1/2, keys whose mask is not 1 left out (upstream
 *         adds the dtype's minimum), softmax in fp32; queries never masked,
 *         so pad slots carry real outputs
 *     x += fc2(act(fc1(layer_norm2(x))))           act: hidden_act, tanh GELU
 *   hidden = post_layernorm(x)                     last_hidden_state (n, P, H)
 *   embeds = aligner(hidden)                       (n, P, n_embed): Linear,
 *         then (GELU (erf), Linear) depth - 1 times; "linear": one Linear
 *
 * The pooling head (vision_model.head.*) is built and run upstream but its
 * output is discarded: it is not read here. LayerNorms are affine with
 * layer_norm_eps; Linear weights are [out, in].
 *
 * Batch invariance: every op reduces within one row, one (image, head) or
 * one output element in an order fixed by the image's own shape (the CPU
 * backend's ops), so on the CPU an image gives the same bits alone or in
 * any batch and at any place in it.
 *
 * Shape letters: n images, P patch slots per image, D = num_channels
 * patch_size^2 features per patch, H hidden, I intermediate, E = n_embed,
 * M = (images of a chunk) P rows.
 */
#include <string.h>
#include "core/resize.h"
#include "model/conv.h"
#include "model/model.h"
#include "model/vit.h"

#define CHUNK 4                   /* images per pass: bounds the scratch */
#define POS_CACHE 8               /* position grids kept on the device */

struct vit_lin {
	hi3_wt *w;                /* (N, K) */
	hi3_wt *b;                /* (N) */
	int N, K;
};

struct vit_norm {
	hi3_wt *w, *b;            /* (H) */
};

struct vit_layer {
	struct vit_norm ln1, ln2;
	struct vit_lin q, k, v, o;   /* (H, H) */
	struct vit_lin fc1;          /* (I, H) */
	struct vit_lin fc2;          /* (H, I) */
};

struct pos_slot {
	int h, w, P;
	float *dev;               /* (P, H) */
};

struct hi3_vit {
	hi3_vit_config cfg;
	hi3_vit_aligner_config acfg;
	hi3_backend *be;
	const hi3_ckpt *ck;
	hi3_backend *own_be;      /* open_dir: the backend and checkpoint it owns */
	hi3_ckpt *own_ck;
	int H, I, D, E, n_h, d, g, act;
	float eps;
	hi3_dtype patch_dtype;    /* patch_embedding.weight's: the input is cast to it */
	struct vit_lin patch;     /* (H, D) */
	float *pos_table;         /* (g, g, H) host f32 */
	struct vit_layer *layers;
	struct vit_norm post;
	struct vit_lin *align;    /* n_align: (E, H), then (E, E) */
	int n_align;
	struct pos_slot pos[POS_CACHE];
	int pos_next;
	/* device scratch for M rows, grown on demand */
	size_t M;
	float *in;                /* (M, D) */
	float *x, *a, *q, *k, *v; /* (M, H) */
	float *f;                 /* (M, I) */
	float *y0, *y1;           /* (M, E) */
	uint8_t *km;              /* (M) key mask */
	float *host;              /* (M, D) host: the input cast to the weight dtype */
	uint8_t *host_km;         /* (M) host */
	float *host_pos;          /* (P, H) host, for a new position grid */
	size_t host_pos_cap;
};

/* ------------------------------------------------------------ config */

static int act_of(const char *name)
{
	if (!strcmp(name, "gelu_pytorch_tanh") || !strcmp(name, "gelu_new"))
		return HI3_ACT_GELU_TANH;
	if (!strcmp(name, "gelu"))
		return HI3_ACT_GELU;
	return -1;
}

static int isqrt_exact(int n)
{
	int g = 0;

	while ((int64_t)(g + 1) * (g + 1) <= n)
		g++;
	return g * g == n ? g : -1;
}

/* What the code needs of the parsed vit and vit_aligner blocks beyond their types. */
static int vit_config_check(const hi3_vit_config *c, const hi3_vit_aligner_config *a, const char *name,
                            hi3_error *err)
{
	if (!c->present)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: no 'vit' block (this model has no vision encoder)", name);
	if (!a->present)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: no 'vit_aligner' block (this model has no vision aligner)",
		                     name);
	if (act_of(c->hidden_act) < 0)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: vit.hidden_act '%s' is not supported by hi3 (expected "
		                     "gelu_pytorch_tanh, gelu_new or gelu)", name, c->hidden_act);
	if (isqrt_exact(c->num_patches) < 0)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: vit.num_patches %d: expected a square (the position grid is "
		                     "sqrt(num_patches) a side)", name, c->num_patches);
	if (c->hidden_size % c->num_attention_heads)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: vit.num_attention_heads %d does not divide hidden_size %d",
		                     name, c->num_attention_heads, c->hidden_size);
	if ((int64_t)c->num_channels * c->patch_size * c->patch_size > (1 << 20))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: vit: %d channels of %d x %d patches: too many features",
		                     name, c->num_channels, c->patch_size, c->patch_size);
	if (strcmp(a->projector_type, "mlp_gelu") && strcmp(a->projector_type, "linear"))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: vit_aligner.projector_type '%s' is not known to upstream "
		                     "(expected mlp_gelu or linear)", name, a->projector_type);
	if (a->n_embed < 1 || a->depth < 1)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: vit_aligner: n_embed %d, depth %d: expected positive values "
		                     "(n_embed defaults to the text model's hidden_size)", name, a->n_embed, a->depth);
	if (a->input_dim != c->hidden_size)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: vit_aligner.input_dim %d differs from vit.hidden_size %d",
		                     name, a->input_dim, c->hidden_size);
	return 0;
}

/* ------------------------------------------------------------ the walk */

/* One walk builds the modules (LOAD: weights through the backend) or lists
 * their tensors (LIST): the names and shapes live once. */
struct walk {
	int list;
	hi3_backend *be;
	const hi3_ckpt *ck;
	const char *where;
	void (*fn)(void *ctx, const char *name, int ndim, const int64_t *shape);
	void *ctx;
	hi3_error *err;
};

/* PREFIX.weight (ndim, shape) as a weight of kind */
static int w_one(struct walk *wk, hi3_wt **w, const char *prefix, const char *leaf, int kind, int ndim,
                 const int64_t *shape)
{
	char nm[256];

	snprintf(nm, sizeof(nm), "%s.%s", prefix, leaf);
	if (wk->list) {
		wk->fn(wk->ctx, nm, ndim, shape);
		return 0;
	}
	return (*w = hi3i_weight_checked(wk->be, wk->ck, wk->where, nm, kind, ndim, shape, wk->err)) ? 0 : -1;
}

static int w_lin(struct walk *wk, struct vit_lin *l, const char *prefix, int N, int K)
{
	const int64_t ws[2] = {N, K}, bs[1] = {N};

	l->N = N;
	l->K = K;
	return w_one(wk, &l->w, prefix, "weight", HI3_WT_MATRIX, 2, ws) ||
	       w_one(wk, &l->b, prefix, "bias", HI3_WT_VECTOR, 1, bs) ? -1 : 0;
}

static int w_norm(struct walk *wk, struct vit_norm *n, const char *prefix, int C)
{
	const int64_t s[1] = {C};

	return w_one(wk, &n->w, prefix, "weight", HI3_WT_VECTOR, 1, s) ||
	       w_one(wk, &n->b, prefix, "bias", HI3_WT_VECTOR, 1, s) ? -1 : 0;
}

#define SUB(buf, ...) (snprintf(buf, sizeof(buf), __VA_ARGS__), buf)

/* The ViT's weights but the position table, the layers and the aligner
 * into v (LIST: v is scratch whose weights stay NULL). */
static int w_all(struct walk *wk, hi3_vit *v)
{
	const hi3_vit_config *c = &v->cfg;
	const hi3_vit_aligner_config *a = &v->acfg;
	const int H = c->hidden_size, I = c->intermediate_size, E = a->n_embed;
	const int D = c->num_channels * c->patch_size * c->patch_size;
	const int64_t ps[2] = {c->num_patches, H};
	char nm[256];

	if (w_lin(wk, &v->patch, "vision_model.embeddings.patch_embedding", H, D))
		return -1;
	if (wk->list)
		wk->fn(wk->ctx, "vision_model.embeddings.position_embedding.weight", 2, ps);
	for (int l = 0; l < c->num_hidden_layers; l++) {
		struct vit_layer *L = &v->layers[l];
		char pre[96];
		snprintf(pre, sizeof(pre), "vision_model.encoder.layers.%d", l);
		if (w_norm(wk, &L->ln1, SUB(nm, "%s.layer_norm1", pre), H) ||
		    w_lin(wk, &L->q, SUB(nm, "%s.self_attn.q_proj", pre), H, H) ||
		    w_lin(wk, &L->k, SUB(nm, "%s.self_attn.k_proj", pre), H, H) ||
		    w_lin(wk, &L->v, SUB(nm, "%s.self_attn.v_proj", pre), H, H) ||
		    w_lin(wk, &L->o, SUB(nm, "%s.self_attn.out_proj", pre), H, H) ||
		    w_norm(wk, &L->ln2, SUB(nm, "%s.layer_norm2", pre), H) ||
		    w_lin(wk, &L->fc1, SUB(nm, "%s.mlp.fc1", pre), I, H) ||
		    w_lin(wk, &L->fc2, SUB(nm, "%s.mlp.fc2", pre), H, I))
			return -1;
	}
	if (w_norm(wk, &v->post, "vision_model.post_layernorm", H))
		return -1;
	/* LightProjector: layers is the Linear itself ("linear"), or a
	 * Sequential of Linear, GELU, Linear, ... (the Linears at 0, 2, 4, ...) */
	if (!strcmp(a->projector_type, "linear"))
		return w_lin(wk, &v->align[0], "vision_aligner.layers", E, H);
	for (int k = 0; k < v->n_align; k++)
		if (w_lin(wk, &v->align[k], SUB(nm, "vision_aligner.layers.%d", 2 * k), E, k ? E : H))
			return -1;
	return 0;
}

static int n_align_of(const hi3_vit_aligner_config *a)
{
	return strcmp(a->projector_type, "linear") ? a->depth : 1;
}

static int alloc_parts(hi3_vit *v, hi3_error *err)
{
	v->layers = hi3i_calloc((size_t)HI3_MAX(v->cfg.num_hidden_layers, 1), sizeof(*v->layers), err);
	v->align = v->layers ? hi3i_calloc((size_t)v->n_align, sizeof(*v->align), err) : NULL;
	return v->align ? 0 : -1;
}

int hi3i_vit_tensors(const hi3_vit_config *c, const hi3_vit_aligner_config *a,
                     void (*fn)(void *ctx, const char *name, int ndim, const int64_t *shape), void *ctx,
                     hi3_error *err)
{
	struct walk wk = {.list = 1, .where = "config", .fn = fn, .ctx = ctx, .err = err};
	hi3_vit v = {.cfg = *c, .acfg = *a, .n_align = n_align_of(a)};
	int rc;

	if (vit_config_check(c, a, "config", err) || alloc_parts(&v, err))
		rc = -1;
	else
		rc = w_all(&wk, &v);
	free(v.layers);
	free(v.align);
	return rc;
}

/* ------------------------------------------------------------ open */

static void lin_free(hi3_backend *be, struct vit_lin *l)
{
	if (l->w)
		be->ops->weight_free(be, l->w);
	if (l->b)
		be->ops->weight_free(be, l->b);
}

static void norm_free(hi3_backend *be, struct vit_norm *n)
{
	if (n->w)
		be->ops->weight_free(be, n->w);
	if (n->b)
		be->ops->weight_free(be, n->b);
}

/* The position table (num_patches, H) of F32, BF16 or F16 as host f32. */
static int load_pos_table(hi3_vit *v, const char *where, hi3_error *err)
{
	const int64_t shape[2] = {v->cfg.num_patches, v->H};
	const char *nm = "vision_model.embeddings.position_embedding.weight";
	const hi3_tensor *t = hi3i_tensor_checked(v->ck, where, nm, 2, shape, err);
	const size_t n = (size_t)v->cfg.num_patches * (size_t)v->H;

	if (!t || !(v->pos_table = hi3i_malloc(n * sizeof(float), err)))
		return -1;
	for (size_t i = 0; i < n; i++)
		v->pos_table[i] = t->dtype == HI3_F32    ? ((const float *)t->data)[i]
		                  : t->dtype == HI3_BF16 ? hi3_bf16_to_f32(((const uint16_t *)t->data)[i])
		                                         : hi3_f16_to_f32(((const uint16_t *)t->data)[i]);
	return 0;
}

int hi3i_vit_open(hi3_vit **out, hi3_backend *be, const hi3_ckpt *ck, const hi3_vit_config *c,
                  const hi3_vit_aligner_config *a, const char *where, hi3_error *err)
{
	static const char probe[] = "vision_model.embeddings.patch_embedding.weight";
	struct walk wk = {.be = be, .ck = ck, .where = where, .err = err};
	hi3_vit *v;

	*out = NULL;
	if (vit_config_check(c, a, where, err))
		return -1;
	if (!hi3_ckpt_find(ck, probe))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: no vision encoder: tensor '%s' is missing", where, probe);
	if (hi3i_backend_check_image(be, err) || !(v = hi3i_calloc(1, sizeof(*v), err)))
		return -1;
	v->cfg = *c;
	v->acfg = *a;
	v->be = be;
	v->ck = ck;
	v->H = c->hidden_size;
	v->I = c->intermediate_size;
	v->D = c->num_channels * c->patch_size * c->patch_size;
	v->E = a->n_embed;
	v->n_h = c->num_attention_heads;
	v->d = v->H / v->n_h;
	v->g = isqrt_exact(c->num_patches);
	v->act = act_of(c->hidden_act);
	v->eps = (float)c->layer_norm_eps;
	v->n_align = n_align_of(a);
	v->patch_dtype = hi3_ckpt_find(ck, probe)->dtype;
	if (alloc_parts(v, err) || w_all(&wk, v) || load_pos_table(v, where, err)) {
		hi3_vit_close(v);
		return -1;
	}
	*out = v;
	return 0;
}

int hi3_vit_open(hi3_vit **out, hi3_model *m, hi3_error *err)
{
	char *name = hi3i_asprintf("%s/config.json", m->dir);
	int rc;

	*out = NULL;
	if (!name)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	rc = vit_config_check(&m->cfg.vit, &m->cfg.vit_aligner, name, err);
	free(name);
	return rc ? -1 : hi3i_vit_open(out, m->be, m->ck, &m->cfg.vit, &m->cfg.vit_aligner, m->dir, err);
}

int hi3_vit_open_dir(hi3_vit **out, const char *dir, const hi3_model_opts *opts, hi3_error *err)
{
	char *path = hi3i_asprintf("%s/config.json", dir);
	hi3_config cfg = {0};
	hi3_backend *be = NULL;
	hi3_ckpt *ck = NULL;
	int rc = -1;

	*out = NULL;
	if (!path) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	if (hi3i_config_load_partial(&cfg, path, err) || vit_config_check(&cfg.vit, &cfg.vit_aligner, path, err) ||
	    hi3_ckpt_open(&ck, dir, err) || hi3i_backend_open(&be, opts, err) ||
	    hi3i_vit_open(out, be, ck, &cfg.vit, &cfg.vit_aligner, dir, err))
		goto out;
	(*out)->own_be = be;
	(*out)->own_ck = ck;
	be = NULL;
	ck = NULL;
	rc = 0;
out:
	if (be)
		be->ops->destroy(be);
	hi3_ckpt_close(ck);
	hi3_config_release(&cfg);
	free(path);
	return rc;
}

static void scratch_free(hi3_vit *v)
{
	float **bufs[] = {&v->in, &v->x, &v->a, &v->q, &v->k, &v->v, &v->f, &v->y0, &v->y1};

	for (size_t i = 0; i < HI3_ARRAY_SIZE(bufs); i++) {
		if (*bufs[i])
			v->be->ops->free(v->be, *bufs[i]);
		*bufs[i] = NULL;
	}
	if (v->km)
		v->be->ops->free(v->be, v->km);
	v->km = NULL;
	free(v->host);
	free(v->host_km);
	v->host = NULL;
	v->host_km = NULL;
	v->M = 0;
}

void hi3_vit_close(hi3_vit *v)
{
	if (!v)
		return;
	scratch_free(v);
	for (int i = 0; i < POS_CACHE; i++)
		if (v->pos[i].dev)
			v->be->ops->free(v->be, v->pos[i].dev);
	lin_free(v->be, &v->patch);
	for (int l = 0; v->layers && l < v->cfg.num_hidden_layers; l++) {
		struct vit_layer *L = &v->layers[l];
		norm_free(v->be, &L->ln1);
		norm_free(v->be, &L->ln2);
		lin_free(v->be, &L->q);
		lin_free(v->be, &L->k);
		lin_free(v->be, &L->v);
		lin_free(v->be, &L->o);
		lin_free(v->be, &L->fc1);
		lin_free(v->be, &L->fc2);
	}
	norm_free(v->be, &v->post);
	for (int k = 0; v->align && k < v->n_align; k++)
		lin_free(v->be, &v->align[k]);
	free(v->layers);
	free(v->align);
	free(v->pos_table);
	free(v->host_pos);
	if (v->own_be)
		v->own_be->ops->destroy(v->own_be);
	hi3_ckpt_close(v->own_ck);
	free(v);
}

const hi3_vit_config *hi3_vit_get_config(const hi3_vit *v)
{
	return &v->cfg;
}

const hi3_vit_aligner_config *hi3_vit_get_aligner_config(const hi3_vit *v)
{
	return &v->acfg;
}

/* ------------------------------------------------------------ position grid */

int hi3i_vit_position_grid(const hi3_vit *v, int nph, int npw, int P, float *pos, hi3_error *err)
{
	const size_t H = (size_t)v->H, hw = (size_t)nph * (size_t)npw;

	if (nph < 1 || npw < 1 || hw > (size_t)P)
		return hi3_error_set(err, HI3_ERR_USAGE, "ViT: a %d x %d patch grid in %d slots", nph, npw, P);
	if (hi3i_resize_aa_f32(v->pos_table, v->g, v->g, v->H, pos, npw, nph, err))
		return -1;
	for (size_t s = hw; s < (size_t)P; s++)
		memcpy(pos + s * H, pos, H * sizeof(float));
	return 0;
}

/* The device position grid of (nph, npw) in P slots, from the cache or made now. */
static const float *position_grid(hi3_vit *v, int nph, int npw, int P, hi3_error *err)
{
	const size_t n = (size_t)P * (size_t)v->H;
	struct pos_slot *s;

	for (int i = 0; i < POS_CACHE; i++)
		if (v->pos[i].dev && v->pos[i].h == nph && v->pos[i].w == npw && v->pos[i].P == P)
			return v->pos[i].dev;
	if (n > v->host_pos_cap) {
		free(v->host_pos);
		v->host_pos_cap = 0;
		if (!(v->host_pos = hi3i_malloc(n * sizeof(float), err)))
			return NULL;
		v->host_pos_cap = n;
	}
	if (hi3i_vit_position_grid(v, nph, npw, P, v->host_pos, err))
		return NULL;
	s = &v->pos[v->pos_next];
	v->pos_next = (v->pos_next + 1) % POS_CACHE;
	if (s->dev)
		v->be->ops->free(v->be, s->dev);
	*s = (struct pos_slot){nph, npw, P, v->be->ops->alloc(v->be, n * sizeof(float))};
	if (!s->dev) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "ViT: out of %s memory for a position grid", v->be->name);
		return NULL;
	}
	if (v->be->ops->upload(v->be, s->dev, v->host_pos, n * sizeof(float))) {
		hi3i_backend_failed(v->be, err);
		return NULL;
	}
	return s->dev;
}

/* ------------------------------------------------------------ forward */

/* Make the scratch hold M rows (its contents are not kept). */
static int reserve(hi3_vit *v, size_t M, hi3_error *err)
{
	hi3_backend *be = v->be;
	const size_t H = (size_t)v->H, cols[] = {(size_t)v->D, H, H, H, H, H, (size_t)v->I, (size_t)v->E,
	                                         (size_t)v->E};
	float **bufs[] = {&v->in, &v->x, &v->a, &v->q, &v->k, &v->v, &v->f, &v->y0, &v->y1};

	if (M <= v->M)
		return 0;
	scratch_free(v);
	for (size_t i = 0; i < HI3_ARRAY_SIZE(bufs); i++)
		if (!(*bufs[i] = be->ops->alloc(be, M * cols[i] * sizeof(float))))
			goto oom;
	if (!(v->km = be->ops->alloc(be, M)) || !(v->host = hi3i_malloc(M * (size_t)v->D * sizeof(float), err)) ||
	    !(v->host_km = hi3i_malloc(M, err)))
		goto oom;
	v->M = M;
	return 0;
oom:
	scratch_free(v);
	return hi3_error_set(err, HI3_ERR_RUNTIME, "ViT: out of %s memory for the activations of %zu patches "
	                     "(%zu MiB free)", be->name, M, be->ops->mem_free(be) >> 20);
}

/* y (M, N) = x (M, K) W^T + b */
static void lin(hi3_vit *v, float *y, const float *x, const struct vit_lin *l, int M)
{
	v->be->ops->matmul(v->be, y, x, l->w, M);
	v->be->ops->bias_add(v->be, y, l->b, M, l->N);
}

static void norm(hi3_vit *v, float *y, const float *x, const struct vit_norm *n, int M)
{
	v->be->ops->layernorm(v->be, y, x, n->w, n->b, M, v->H, v->eps);
}

/* The input rows of c images, cast to the patch weight's dtype (as
 * upstream's pixel_values.to(weight dtype)), uploaded with the key mask. */
static int upload_input(hi3_vit *v, const float *pv, const int32_t *mask, size_t M, hi3_error *err)
{
	hi3_backend *be = v->be;
	const size_t n = M * (size_t)v->D;
	const float *src = pv;

	if (v->patch_dtype == HI3_BF16 || v->patch_dtype == HI3_F16) {
		for (size_t i = 0; i < n; i++)
			v->host[i] = v->patch_dtype == HI3_BF16 ? hi3_bf16_to_f32(hi3_f32_to_bf16(pv[i]))
			                                        : hi3_f16_to_f32(hi3_f32_to_f16(pv[i]));
		src = v->host;
	}
	for (size_t i = 0; i < M; i++)
		v->host_km[i] = mask[i] == 1;
	if (be->ops->upload(be, v->in, src, n * sizeof(float)) || be->ops->upload(be, v->km, v->host_km, M))
		return hi3i_backend_failed(be, err);
	return 0;
}

static int layer(hi3_vit *v, const struct vit_layer *L, int c, int P)
{
	hi3_backend *be = v->be;
	const int M = c * P;
	const size_t MH = (size_t)M * (size_t)v->H;

	norm(v, v->a, v->x, &L->ln1, M);
	lin(v, v->q, v->a, &L->q, M);
	lin(v, v->k, v->a, &L->k, M);
	lin(v, v->v, v->a, &L->v, M);
	be->ops->attention_dense(be, v->a, v->q, v->k, v->v, v->km, c, P, v->n_h, v->d);
	lin(v, v->q, v->a, &L->o, M);
	be->ops->add(be, v->x, v->q, MH);
	norm(v, v->a, v->x, &L->ln2, M);
	lin(v, v->f, v->a, &L->fc1, M);
	be->ops->act(be, v->f, v->f, (size_t)M * (size_t)v->I, v->act);
	lin(v, v->q, v->f, &L->fc2, M);
	be->ops->add(be, v->x, v->q, MH);
	return be->err.status ? -1 : 0;
}

/* host (bytes) = dev: 0, or -1 with err set */
static int fetch(hi3_vit *v, void *host, const float *dev, size_t bytes, hi3_error *err)
{
	if (!v->be->ops->download(v->be, host, dev, bytes))
		return 0;
	if (!hi3i_backend_failed(v->be, err))
		hi3_error_set(err, HI3_ERR_RUNTIME, "ViT: copying %zu bytes from the %s backend failed", bytes, v->be->name);
	return -1;
}

/* c images of P slots: hidden (c, P, H) and embeds (c, P, E) host, either NULL. */
static int run_chunk(hi3_vit *v, const float *pv, const int32_t *mask, const int32_t *shapes, int c, int P,
                     float *hidden, float *embeds, hi3_error *err)
{
	hi3_backend *be = v->be;
	const int M = c * P;
	const size_t H = (size_t)v->H;
	float *y, *t;

	if (reserve(v, (size_t)M, err) || upload_input(v, pv, mask, (size_t)M, err))
		return -1;
	lin(v, v->x, v->in, &v->patch, M);
	for (int i = 0; i < c; i++) {
		const float *pos = position_grid(v, shapes[2 * i], shapes[2 * i + 1], P, err);
		if (!pos)
			return -1;
		be->ops->add(be, v->x + (size_t)i * P * H, pos, (size_t)P * H);
	}
	for (int l = 0; l < v->cfg.num_hidden_layers; l++)
		if (layer(v, &v->layers[l], c, P))
			return hi3i_backend_failed(be, err);
	norm(v, v->a, v->x, &v->post, M);
	if (hi3i_backend_failed(be, err) || (hidden && fetch(v, hidden, v->a, (size_t)M * H * sizeof(float), err)))
		return -1;
	if (!embeds)
		return 0;
	y = v->y0;
	t = v->y1;
	lin(v, y, v->a, &v->align[0], M);
	for (int k = 1; k < v->n_align; k++) {
		float *s = y;
		be->ops->act(be, y, y, (size_t)M * (size_t)v->E, HI3_ACT_GELU);
		lin(v, t, y, &v->align[k], M);
		y = t;
		t = s;
	}
	if (hi3i_backend_failed(be, err) || fetch(v, embeds, y, (size_t)M * (size_t)v->E * sizeof(float), err))
		return -1;
	return 0;
}

int hi3_vit_encode(hi3_vit *v, const float *pixel_values, const int32_t *mask, const int32_t *spatial_shapes, int n,
                   int P, float *hidden, float *embeds, hi3_error *err)
{
	if (n < 0 || P < 1 || P > (1 << 20) || (n && (!pixel_values || !mask || !spatial_shapes)))
		return hi3_error_set(err, HI3_ERR_USAGE, "ViT: %d images of %d patch slots", n, P);
	for (int i = 0; i < n; i++) {
		const int h = spatial_shapes[2 * i], w = spatial_shapes[2 * i + 1];
		int valid = 0;
		if (h < 1 || w < 1 || h > (1 << 16) || w > (1 << 16) || (int64_t)h * w > P)
			return hi3_error_set(err, HI3_ERR_USAGE, "ViT: image %d: a %d x %d patch grid does not fit %d slots", i,
			                     h, w, P);
		for (int j = 0; j < P && !valid; j++)
			valid = mask[(size_t)i * P + j] == 1;
		if (!valid)
			return hi3_error_set(err, HI3_ERR_USAGE, "ViT: image %d: no patch to attend (its mask has no 1)", i);
	}
	for (int i0 = 0; i0 < n; i0 += CHUNK) {
		const int c = HI3_MIN(CHUNK, n - i0);
		const size_t r0 = (size_t)i0 * P;
		if (run_chunk(v, pixel_values + r0 * v->D, mask + r0, spatial_shapes + 2 * i0, c, P,
		              hidden ? hidden + r0 * v->H : NULL, embeds ? embeds + r0 * v->E : NULL, err))
			return -1;
	}
	return 0;
}
