/*
 * trace.c -- the trace file (format hi3.trace): named activation points of
 * the forward passes of one stage, for chosen tokens (hi3-files(5), TRACE).
 *
 *   rows       (n) I32   the stage's row of each traced token
 *   positions  (n) I64   its position in the row
 *   tokens     (n) I64   the token id fed there
 *   then one tensor per point, first axis the token, in the order above:
 *   embed (n, H); per layer L: layer.L.in, in_norm (n, H), q (n, n_h d),
 *   k, v (n, n_kv d), attn (n, n_h d), attn_out, mlp_in (n, H),
 *   router_logits (n, E), experts (n, k) I16, expert_weights (n, k),
 *   expert_out (n, k, H), shared_out, mlp_out (n, H); final, final_norm
 *   (n, H); logits.topk (n, K), logits.topk_ids (n, K) I32, logits.lse (n).
 *   Every point is F32 unless noted; any may be absent.
 * Tokens are ordered by (row, position), each once.
 * metadata: format, format_version, model_fingerprint, stage, backend,
 * batch_invariant, weight_dtype, ... (hi3-files(5)).
 */
#include <stddef.h>
#include <string.h>
#include "format/provenance.h"
#include "format/trace.h"

#define F(x) (int)offsetof(hi3_trace_file, x)
static const struct hi3i_ftensor tensors[] = {
	{"rows", "I32", "n", 0, F(rows), -1},
	{"positions", "I64", "n", 0, F(positions), -1},
	{"tokens", "I64", "n", 0, F(tokens), -1},
	/* the points, each optional, in forward order (l a layer; parse_point) */
	{"embed", "F32", "n,H", HI3I_FT_MODULE, -1, -1},
	{"layer.l.in", "F32", "n,H", HI3I_FT_MODULE, -1, -1},
	{"layer.l.in_norm", "F32", "n,H", HI3I_FT_MODULE, -1, -1},
	{"layer.l.q", "F32", "n,Q", HI3I_FT_MODULE, -1, -1},
	{"layer.l.k", "F32", "n,D", HI3I_FT_MODULE, -1, -1},
	{"layer.l.v", "F32", "n,D", HI3I_FT_MODULE, -1, -1},
	{"layer.l.attn", "F32", "n,Q", HI3I_FT_MODULE, -1, -1},
	{"layer.l.attn_out", "F32", "n,H", HI3I_FT_MODULE, -1, -1},
	{"layer.l.mlp_in", "F32", "n,H", HI3I_FT_MODULE, -1, -1},
	{"layer.l.router_logits", "F32", "n,E", HI3I_FT_MODULE, -1, -1},
	{"layer.l.experts", "I16", "n,k", HI3I_FT_MODULE, -1, -1},
	{"layer.l.expert_weights", "F32", "n,k", HI3I_FT_MODULE, -1, -1},
	{"layer.l.expert_out", "F32", "n,k,H", HI3I_FT_MODULE, -1, -1},
	{"layer.l.shared_out", "F32", "n,H", HI3I_FT_MODULE, -1, -1},
	{"layer.l.mlp_out", "F32", "n,H", HI3I_FT_MODULE, -1, -1},
	{"final", "F32", "n,H", HI3I_FT_MODULE, -1, -1},
	{"final_norm", "F32", "n,H", HI3I_FT_MODULE, -1, -1},
	{"logits.topk", "F32", "n,K", HI3I_FT_MODULE, -1, -1},
	{"logits.topk_ids", "I32", "n,K", HI3I_FT_MODULE, -1, -1},
	{"logits.lse", "F32", "n", HI3I_FT_MODULE, -1, -1},
	{0},
};
#undef F
/* hi3's own keys: the recorder's (model/trace.c), then the stage's
 * (stage/files.c and each stage); a trace of another tool may have others */
static const struct hi3i_fmeta meta[] = {
	{"model_fingerprint", "text", 0, -1}, {"backend", "text", 0, -1}, {"batch_invariant", "text", 0, -1},
	{"weight_dtype", "text", 0, -1}, {"n_layers", "text", 0, -1}, {"points", "text", 0, -1},
	{"topk", "text", 0, -1}, {"forward_calls", "text", 0, -1}, {"forward_shapes", "text", 0, -1},
	{"stage", "text", 0, -1}, {"conditions_hash", "text", 0, -1}, {"rows", "text", 0, -1}, {"L", "text", 0, -1},
	{"pad_positions", "text", 0, -1}, {"kv_dtype", "text", 0, -1}, {"decode_mask", "text", 0, -1},
	{"token_placement", "text", 0, -1}, {"mode", "text", 0, -1}, {"routing", "text", 0, -1},
	{"trace_step", "text", 0, -1}, {"steps", "text", 0, -1}, {"denoised_rows", "text", 0, -1},
	{"kv_reuse", "text", 0, -1}, {"ablate", "pos-pad|rope-pad|rope-1d|eoi", 0, -1},
	{0},
};
const struct hi3i_format hi3i_format_trace = {
	HI3_FORMAT_TRACE, "TRACE", (const char *const[]){"n", "H", "Q", "D", "E", "k", "K", NULL}, tensors, meta, 1, 0,
};

static const struct {
	const char *name;
	int per_layer;
} kinds[HI3_TRACE_KIND_COUNT] = {
	[HI3_TRACE_EMBED] = {"embed", 0},
	[HI3_TRACE_IN] = {"in", 1},
	[HI3_TRACE_IN_NORM] = {"in_norm", 1},
	[HI3_TRACE_Q] = {"q", 1},
	[HI3_TRACE_K] = {"k", 1},
	[HI3_TRACE_V] = {"v", 1},
	[HI3_TRACE_ATTN] = {"attn", 1},
	[HI3_TRACE_ATTN_OUT] = {"attn_out", 1},
	[HI3_TRACE_MLP_IN] = {"mlp_in", 1},
	[HI3_TRACE_ROUTER_LOGITS] = {"router_logits", 1},
	[HI3_TRACE_EXPERTS] = {"experts", 1},
	[HI3_TRACE_EXPERT_WEIGHTS] = {"expert_weights", 1},
	[HI3_TRACE_EXPERT_OUT] = {"expert_out", 1},
	[HI3_TRACE_SHARED_OUT] = {"shared_out", 1},
	[HI3_TRACE_MLP_OUT] = {"mlp_out", 1},
	[HI3_TRACE_FINAL] = {"final", 0},
	[HI3_TRACE_FINAL_NORM] = {"final_norm", 0},
	[HI3_TRACE_LOGITS] = {"logits", 0},
};
static const char *const logits_sub[HI3I_LOGITS_SUBS] = {"topk", "topk_ids", "lse"};

const char *hi3_trace_kind_name(int kind)
{
	return kind >= 0 && kind < HI3_TRACE_KIND_COUNT ? kinds[kind].name : NULL;
}

int hi3_trace_kind_parse(const char *name)
{
	for (int k = 0; k < HI3_TRACE_KIND_COUNT; k++)
		if (!strcmp(kinds[k].name, name))
			return k;
	return -1;
}

int hi3i_trace_per_layer(int kind)
{
	return kinds[kind].per_layer;
}

const char *hi3i_trace_point_name(char *buf, size_t n, int kind, int layer, int sub)
{
	if (kind == HI3_TRACE_LOGITS)
		snprintf(buf, n, "logits.%s", logits_sub[sub]);
	else if (kinds[kind].per_layer)
		snprintf(buf, n, "layer.%d.%s", layer, kinds[kind].name);
	else
		snprintf(buf, n, "%s", kinds[kind].name);
	return buf;
}

hi3_dtype hi3i_trace_point_dtype(int kind, int sub)
{
	if (kind == HI3_TRACE_EXPERTS)
		return HI3_I16;
	if (kind == HI3_TRACE_LOGITS && sub == HI3I_LOGITS_TOPK_IDS)
		return HI3_I32;
	return HI3_F32;
}

int hi3i_trace_point_ndim(int kind, int sub)
{
	if (kind == HI3_TRACE_LOGITS && sub == HI3I_LOGITS_LSE)
		return 1;
	return kind == HI3_TRACE_EXPERT_OUT ? 3 : 2;
}

/* A tensor name to its point; -1 for a name that is not one. */
static int parse_point(const char *name, hi3_trace_point *p)
{
	const char *dot;
	char *end;
	long l;

	p->layer = -1;
	p->sub = 0;
	if (!strncmp(name, "logits.", 7)) {
		for (int s = 0; s < HI3I_LOGITS_SUBS; s++)
			if (!strcmp(name + 7, logits_sub[s])) {
				p->kind = HI3_TRACE_LOGITS;
				p->sub = s;
				return 0;
			}
		return -1;
	}
	if (strncmp(name, "layer.", 6)) {
		int k = hi3_trace_kind_parse(name);
		if (k < 0 || kinds[k].per_layer || k == HI3_TRACE_LOGITS)
			return -1;
		p->kind = k;
		return 0;
	}
	if (name[6] < '0' || name[6] > '9')
		return -1;
	l = strtol(name + 6, &end, 10);
	dot = end;
	if (*dot != '.' || l < 0 || l >= HI3_MAX_LAYERS || (name[6] == '0' && end != name + 7))
		return -1;
	p->kind = hi3_trace_kind_parse(dot + 1);
	if (p->kind < 0 || !kinds[p->kind].per_layer)
		return -1;
	p->layer = (int)l;
	return 0;
}

/* Forward order: embed, the layers in order (their points in kind order),
 * then final, final_norm, logits. */
int hi3i_trace_point_cmp(const void *x, const void *y)
{
	const hi3_trace_point *a = x, *b = y;
	int ga = a->kind == HI3_TRACE_EMBED ? 0 : a->layer >= 0 ? 1 : 2;
	int gb = b->kind == HI3_TRACE_EMBED ? 0 : b->layer >= 0 ? 1 : 2;

	if (ga != gb)
		return ga - gb;
	if (a->layer != b->layer)
		return a->layer - b->layer;
	if (a->kind != b->kind)
		return a->kind - b->kind;
	return a->sub - b->sub;
}

/* The checks a trace passes before it is used or written. */
static int check(const hi3_trace_file *f, const char *path, hi3_error *err)
{
	char name[64];

	for (int64_t i = 0; i < f->n; i++) {
		if (f->rows[i] < 0 || f->positions[i] < 0)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: token %lld has row %d, position %lld", path,
			                     (long long)i, f->rows[i], (long long)f->positions[i]);
		if (i && (f->rows[i] < f->rows[i - 1] ||
		          (f->rows[i] == f->rows[i - 1] && f->positions[i] <= f->positions[i - 1])))
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: tokens %lld and %lld (row %d, position %lld; row "
			                     "%d, position %lld) are not in (row, position) order, each once", path,
			                     (long long)i - 1, (long long)i, f->rows[i - 1], (long long)f->positions[i - 1],
			                     f->rows[i], (long long)f->positions[i]);
	}
	for (int j = 0; j < f->n_points; j++) {
		const hi3_trace_point *p = &f->points[j];
		int ndim = hi3i_trace_point_ndim(p->kind, p->sub);

		hi3i_trace_point_name(name, sizeof(name), p->kind, p->layer, p->sub);
		if (strcmp(name, p->name))
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: point '%s' is named as '%s'", path, p->name, name);
		if (p->dtype != hi3i_trace_point_dtype(p->kind, p->sub) || p->ndim != ndim || p->shape[0] != f->n)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s': expected %s of rank %d with %lld tokens, "
			                     "found %s of rank %d with %lld", path, p->name,
			                     hi3_dtype_name(hi3i_trace_point_dtype(p->kind, p->sub)), ndim, (long long)f->n,
			                     hi3_dtype_name(p->dtype), p->ndim, (long long)p->shape[0]);
		for (int d = 1; d < ndim; d++)
			if (p->shape[d] < 1)
				return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s': dimension %d is empty", path,
				                     p->name, d);
		if (j && hi3i_trace_point_cmp(&f->points[j - 1], p) >= 0)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: points '%s' and '%s' are out of forward order or "
			                     "repeated", path, f->points[j - 1].name, p->name);
	}
	return 0;
}

int hi3_trace_file_open(hi3_trace_file **out, const char *path, hi3_error *err)
{
	hi3_trace_file *f = hi3i_calloc(1, sizeof(*f), err);
	int64_t dims[7] = {-1, -1, -1, -1, -1, -1, -1};
	int np = 0;

	*out = NULL;
	if (!f)
		return -1;
	if (hi3i_codec_open(&hi3i_format_trace, path, HI3_ST_READ, f, dims, &f->st, err))
		goto fail;
	f->n = dims[0];
	f->points = hi3i_calloc((size_t)hi3_st_count(f->st) + 1, sizeof(*f->points), err);
	if (!f->points)
		goto fail;
	for (int i = 0; i < hi3_st_count(f->st); i++) {
		const hi3_tensor *t = hi3_st_at(f->st, i);
		hi3_trace_point *p = &f->points[np];

		if (t->data == f->rows || t->data == f->positions || t->data == f->tokens)
			continue;
		if (parse_point(t->name, p) != 0) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s' is not a trace point (hi3-files(5), TRACE)", path,
			              t->name);
			goto fail;
		}
		if (t->ndim > 3) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s' has rank %d", path, t->name, t->ndim);
			goto fail;
		}
		p->name = t->name;
		p->dtype = t->dtype;
		p->ndim = t->ndim;
		memcpy(p->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
		p->data = t->data;
		np++;
	}
	qsort(f->points, (size_t)np, sizeof(*f->points), hi3i_trace_point_cmp);
	f->n_points = np;
	if (check(f, path, err) != 0)
		goto fail;
	*out = f;
	return 0;
fail:
	hi3_trace_file_close(f);
	return -1;
}

void hi3_trace_file_close(hi3_trace_file *f)
{
	if (!f)
		return;
	hi3_st_close(f->st);
	free(f->points);
	free(f);
}

const char *hi3_trace_file_meta(const hi3_trace_file *f, const char *key)
{
	if (f->st)
		return hi3_st_meta(f->st, key);
	for (int i = 0; i < f->n_meta; i++)
		if (!strcmp(f->meta[2 * i], key))
			return f->meta[2 * i + 1];
	return NULL;
}

int hi3_trace_file_write(const hi3_trace_file *f, const char *path, hi3_error *err)
{
	const int64_t dims[7] = {f->n, 0, 0, 0, 0, 0, 0};
	const char *(*m)[2] = NULL;
	hi3_st_writer *w;
	int n = 0, rc;

	if (check(f, path, err) != 0)
		return -1;
	if (f->n_meta && !(m = hi3i_calloc((size_t)f->n_meta, sizeof(*m), err)))
		return -1;
	for (int i = 0; i < f->n_meta; i++)
		if (strcmp(f->meta[2 * i], "format") && strcmp(f->meta[2 * i], "format_version")) {
			m[n][0] = f->meta[2 * i];
			m[n++][1] = f->meta[2 * i + 1];
		}
	w = hi3i_codec_writer(&hi3i_format_trace, f, dims, (const char *const (*)[2])m, (size_t)n, path, err);
	free(m);
	if (!w)
		return -1;
	for (int j = 0; j < f->n_points; j++) {
		const hi3_trace_point *p = &f->points[j];
		if (hi3_stw_add(w, p->name, p->dtype, p->ndim, p->shape, p->data)) {
			hi3_stw_free(w);
			return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		}
	}
	rc = hi3_stw_write(w, path, err);
	hi3_stw_free(w);
	return rc;
}
