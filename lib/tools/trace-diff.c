/*
 * trace-diff.c -- hi3 diff --first: two trace files (format/trace.c)
 * aligned by (row, position), compared point by point in forward order:
 * the first point where they differ, what lies upstream of it, and how the
 * difference grows layer by layer.
 *
 * An element differs when |a - b| > tol (NaN equals NaN; NaN against a
 * number differs, |a - b| = +Inf); ids (tokens, experts, logits.topk_ids)
 * differ whenever they are not equal.
 *
 * The first difference is causal: the lowest position (then row) at which
 * anything differs, and at that position the first point in forward order
 * (the token id fed there first). A point at position p depends on the
 * points before it at p and on every point at positions before p (through
 * attention, and in decode through the token sampled from p - 1's logits),
 * so everything it depends on agrees.
 */
#include <math.h>
#include <omp.h>
#include <string.h>
#include "format/trace.h"
#include "tools/tools.h"

/* An aligned token: its index in A and in B. */
struct pair {
	int64_t a, b;
};

struct side {
	const char *path;
	hi3_trace_file *f;
};

static int pair_pos_cmp(const void *x, const void *y, void *ctx)
{
	const struct pair *p = x, *q = y;
	const hi3_trace_file *a = ctx;

	if (a->positions[p->a] != a->positions[q->a])
		return a->positions[p->a] < a->positions[q->a] ? -1 : 1;
	if (a->rows[p->a] != a->rows[q->a])
		return a->rows[p->a] < a->rows[q->a] ? -1 : 1;
	return 0;
}

static int has_row(const hi3_trace_file *f, int64_t row)
{
	for (int64_t i = 0; i < f->n; i++)
		if (f->rows[i] == row)
			return 1;
	return 0;
}

/* The tokens of A and B with the same (row, position), rows mapped by
 * --row; the two files are in (row, position) order. */
static struct pair *align(const hi3_trace_file *a, const hi3_trace_file *b, const hi3_trace_diff_opts *o,
                          hi3_trace_diff *d, int64_t *n, hi3_error *err)
{
	struct pair *p = hi3i_calloc((size_t)HI3_MIN(a->n, b->n) + 1, sizeof(*p), err);
	int64_t i = 0, j = 0, k = 0;
	int rows = o->row_a >= 0;

	if (!p)
		return NULL;
	while (i < a->n || j < b->n) {
		int64_t ra, rb, c;

		if (rows && i < a->n && a->rows[i] != o->row_a) {
			i++;
			continue;
		}
		if (rows && j < b->n && b->rows[j] != o->row_b) {
			j++;
			continue;
		}
		if (i >= a->n) {
			d->only_b++, j++;
			continue;
		}
		if (j >= b->n) {
			d->only_a++, i++;
			continue;
		}
		ra = rows ? 0 : a->rows[i];
		rb = rows ? 0 : b->rows[j];
		c = ra != rb ? (ra < rb ? -1 : 1) : a->positions[i] != b->positions[j] ? (a->positions[i] < b->positions[j] ? -1 : 1) : 0;
		if (c < 0) {
			d->only_a++, i++;
		} else if (c > 0) {
			d->only_b++, j++;
		} else {
			p[k].a = i++;
			p[k].b = j++;
			k++;
		}
	}
	*n = k;
	return p;
}

/* --------------------------------------------------------------- compare */

static inline double delta(double a, double b)
{
	if (a == b || (isnan(a) && isnan(b)))
		return 0;
	if (isnan(a) || isnan(b))
		return INFINITY;
	return fabs(a - b);
}

static double elem(const void *data, hi3_dtype dt, size_t i)
{
	switch (dt) {
	case HI3_F32: return ((const float *)data)[i];
	case HI3_I16: return ((const int16_t *)data)[i];
	case HI3_I32: return ((const int32_t *)data)[i];
	case HI3_I64: return (double)((const int64_t *)data)[i];
	default: return hi3_elem_f64(data, dt, i);
	}
}

static void set_loc(hi3_trace_diff_loc *l, const hi3_trace_file *a, const hi3_trace_file *b, const struct pair *p,
                    const hi3_trace_point *pt, int64_t e, double va, double vb)
{
	memset(l, 0, sizeof(*l));
	l->row_a = a->rows[p->a];
	l->row_b = b->rows[p->b];
	l->pos = a->positions[p->a];
	l->a = va;
	l->b = vb;
	if (!pt || pt->ndim == 1)
		return;
	if (pt->ndim == 3) {
		l->n_index = 2;
		l->index[0] = e / pt->shape[2];
		l->index[1] = e % pt->shape[2];
	} else {
		l->n_index = 1;
		l->index[0] = e;
	}
}

/* One point over the aligned pairs (in position order). data_a/data_b: the
 * two tensors, w elements per token; pt names the element axes. */
static void compare(hi3_trace_diff_point *r, const hi3_trace_file *a, const hi3_trace_file *b, const struct pair *p,
                    int64_t n, const void *data_a, const void *data_b, hi3_dtype dt, int64_t w,
                    const hi3_trace_point *pt, double tol)
{
	int have_worst = 0;

	for (int64_t k = 0; k < n; k++) {
		int over_here = 0;
		for (int64_t e = 0; e < w; e++) {
			double va = elem(data_a, dt, (size_t)(p[k].a * w + e)), vb = elem(data_b, dt, (size_t)(p[k].b * w + e));
			double d = delta(va, vb);
			int over = r->integer ? d != 0 : (d == INFINITY || d > tol);

			if (d > r->max_abs || (!have_worst && d > 0)) {
				r->max_abs = d;
				set_loc(&r->worst, a, b, &p[k], pt, e, va, vb);
				have_worst = 1;
			}
			if (over) {
				if (!r->over)
					set_loc(&r->first, a, b, &p[k], pt, e, va, vb);
				r->over++;
				over_here = 1;
			}
		}
		r->compared += w;
		r->tokens_over += over_here;
	}
	r->status = r->over ? HI3_DIFF_OVER : HI3_DIFF_OK;
}

static int64_t per_token(const hi3_trace_point *p)
{
	int64_t w = 1;

	for (int d = 1; d < p->ndim; d++)
		w *= p->shape[d];
	return w;
}

static int same_shape(const hi3_trace_point *x, const hi3_trace_point *y)
{
	if (x->ndim != y->ndim)
		return 0;
	for (int d = 1; d < x->ndim; d++)
		if (x->shape[d] != y->shape[d])
			return 0;
	return 1;
}

static char **copy_meta(const hi3_trace_file *f, int *n)
{
	int m = hi3_st_meta_count(f->st);
	char **v = calloc(2 * (size_t)m + 1, sizeof(char *));

	*n = 0;
	if (!v)
		return NULL;
	for (int i = 0; i < m; i++) {
		const char *k, *val;
		hi3_st_meta_at(f->st, i, &k, &val);
		v[2 * i] = hi3i_strdup(k);
		v[2 * i + 1] = hi3i_strdup(val);
		if (!v[2 * i] || !v[2 * i + 1]) {
			*n = i + 1;
			return v;          /* the caller sees the NULL */
		}
	}
	*n = m;
	return v;
}

int hi3_trace_diff_run(const char *path_a, const char *path_b, const hi3_trace_diff_opts *o, hi3_trace_diff **out,
                       hi3_error *err)
{
	hi3_trace_file *a = NULL, *b = NULL;
	hi3_trace_diff *d = NULL;
	struct pair *pairs = NULL;
	int64_t np = 0;
	int rc = -1, nt = o->threads > 0 ? o->threads : omp_get_max_threads();

	*out = NULL;
	if ((o->row_a >= 0) != (o->row_b >= 0) || !(o->tol >= 0))
		return hi3_error_set(err, HI3_ERR_USAGE, "hi3_trace_diff_run: bad options (rows %lld:%lld, tol %g)",
		                     (long long)o->row_a, (long long)o->row_b, o->tol);
	if (hi3_trace_file_open(&a, path_a, err) != 0 || hi3_trace_file_open(&b, path_b, err) != 0)
		goto out;
	if (o->row_a >= 0 && (!has_row(a, o->row_a) || !has_row(b, o->row_b))) {
		hi3_error_set(err, HI3_ERR_USAGE, "--row %lld:%lld: %s traces no row %lld", (long long)o->row_a,
		              (long long)o->row_b, has_row(a, o->row_a) ? path_b : path_a,
		              (long long)(has_row(a, o->row_a) ? o->row_b : o->row_a));
		goto out;
	}
	if (!(d = hi3i_calloc(1, sizeof(*d), err)))
		goto out;
	d->opts = *o;
	d->first = -1;
	d->path_a = hi3i_strdup(path_a);
	d->path_b = hi3i_strdup(path_b);
	d->meta_a = copy_meta(a, &d->n_meta_a);
	d->meta_b = copy_meta(b, &d->n_meta_b);
	d->p = hi3i_calloc((size_t)(a->n_points + b->n_points) + 1, sizeof(*d->p), err);
	if (!d->path_a || !d->path_b || !d->meta_a || !d->meta_b || !d->p ||
	    (d->n_meta_a && !d->meta_a[2 * d->n_meta_a - 1]) || (d->n_meta_b && !d->meta_b[2 * d->n_meta_b - 1]))
		goto oom;
	if (!(pairs = align(a, b, o, d, &np, err)))
		goto out;
	if (!np) {
		hi3_error_set(err, HI3_ERR_USAGE, "%s and %s trace no (row, position) in common (%s rows and positions "
		              "differ: trace the same row and positions, or align other rows with --row I:J)", path_a,
		              path_b, o->row_a >= 0 ? "the aligned" : "their");
		goto out;
	}
	d->aligned = np;
	qsort_r(pairs, (size_t)np, sizeof(*pairs), pair_pos_cmp, a);
	d->pos_lo = a->positions[pairs[0].a];
	d->pos_hi = a->positions[pairs[np - 1].a];
	/* the ids fed, then the union of the points in forward order */
	d->p[0] = (hi3_trace_diff_point){.name = hi3i_strdup("tokens"), .kind = -1, .layer = -1, .integer = 1};
	d->n = 1;
	if (!d->p[0].name)
		goto oom;
	compare(&d->p[0], a, b, pairs, np, a->tokens, b->tokens, HI3_I64, 1, NULL, o->tol);
	for (int i = 0, j = 0; i < a->n_points || j < b->n_points;) {
		const hi3_trace_point *pa = i < a->n_points ? &a->points[i] : NULL, *pb = j < b->n_points ? &b->points[j] : NULL;
		int c = !pa ? 1 : !pb ? -1 : hi3i_trace_point_cmp(pa, pb);
		hi3_trace_diff_point *r = &d->p[d->n++];
		const hi3_trace_point *p = c <= 0 ? pa : pb;

		r->name = hi3i_strdup(p->name);
		if (!r->name)
			goto oom;
		r->kind = p->kind;
		r->layer = p->layer;
		r->sub = p->sub;
		r->integer = p->dtype != HI3_F32;
		d->n_layers = HI3_MAX(d->n_layers, p->layer + 1);
		r->status = c < 0 ? HI3_DIFF_ONLY_A : c > 0 ? HI3_DIFF_ONLY_B
		          : pa->dtype != pb->dtype ? HI3_DIFF_DTYPE : !same_shape(pa, pb) ? HI3_DIFF_SHAPE : HI3_DIFF_OK;
		i += c <= 0;
		j += c >= 0;
	}
	/* the points are independent: one thread each */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
	for (int k = 1; k < d->n; k++) {
		hi3_trace_diff_point *r = &d->p[k];
		const hi3_trace_point *pa = NULL, *pb = NULL;

		if (r->status != HI3_DIFF_OK)
			continue;
		for (int i = 0; i < a->n_points && !pa; i++)
			pa = !strcmp(a->points[i].name, r->name) ? &a->points[i] : NULL;
		for (int i = 0; i < b->n_points && !pb; i++)
			pb = !strcmp(b->points[i].name, r->name) ? &b->points[i] : NULL;
		compare(r, a, b, pairs, np, pa->data, pb->data, pa->dtype, per_token(pa), pa, o->tol);
	}
	for (int k = 0; k < d->n; k++) {
		const hi3_trace_diff_point *p = &d->p[k], *f = d->first >= 0 ? &d->p[d->first] : NULL;
		int s = p->status;
		if (s != HI3_DIFF_OVER && s != HI3_DIFF_DTYPE && s != HI3_DIFF_SHAPE)
			continue;
		d->n_differ++;
		/* a point stored differently has no position: it comes first */
		if (!f || (f->status == HI3_DIFF_OVER &&
		           (s != HI3_DIFF_OVER || p->first.pos < f->first.pos ||
		            (p->first.pos == f->first.pos && p->first.row_a < f->first.row_a))))
			d->first = k;
	}
	d->equal = d->n_differ == 0;
	*out = d;
	d = NULL;
	rc = 0;
	goto out;
oom:
	hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
out:
	hi3_trace_diff_free(d);
	free(pairs);
	hi3_trace_file_close(a);
	hi3_trace_file_close(b);
	return rc;
}

void hi3_trace_diff_free(hi3_trace_diff *d)
{
	if (!d)
		return;
	for (int i = 0; i < d->n; i++)
		free(d->p[i].name);
	for (int i = 0; d->meta_a && i < 2 * d->n_meta_a; i++)
		free(d->meta_a[i]);
	for (int i = 0; d->meta_b && i < 2 * d->n_meta_b; i++)
		free(d->meta_b[i]);
	free(d->meta_a);
	free(d->meta_b);
	free(d->p);
	free(d->path_a);
	free(d->path_b);
	free(d);
}

/* ---------------------------------------------------------------- report */

static const char *meta_of(char **meta, int n, const char *key);

/* What a first difference at this point says, its upstream agreeing. */
static const char *hint(const hi3_trace_diff *d, const hi3_trace_diff_point *f)
{
	const char *sa = meta_of(d->meta_a, d->n_meta_a, "stage"), *sb = meta_of(d->meta_b, d->n_meta_b, "stage");

	if (f->kind == HI3_TRACE_ATTN && f->status == HI3_DIFF_OVER && sa && sb && !strcmp(sa, "diffusion-capture") &&
	    !strcmp(sb, "diffusion-capture"))
		return "q, k and v agree but the attention output does not: the keys and values it read (at a step after "
		       "the first with KV reuse, the cache as step 0's whole-sequence pass left it: pads writing slot 0 "
		       "(ablate pos-pad, rope-pad), zero-RoPE keys of pads (rope-pad), stale <eoi>), the mask (ablate "
		       "eoi), or the attention's reduction";
	if (f->status == HI3_DIFF_DTYPE || f->status == HI3_DIFF_SHAPE)
		return "the traces store this point with another dtype or shape: other models, or other trace settings";
	switch (f->kind) {
	case -1:
		return "the token ids fed differ: the runs had other inputs (another rollout, or a decode that fed "
		       "another token at that position, as --token-placement=tail does)";
	case HI3_TRACE_EMBED:
		return "the embedding rows differ: other embedding weights, or another weight dtype";
	case HI3_TRACE_IN:
		return "the layer's input differs where the previous layer's output agrees: traces of different runs?";
	case HI3_TRACE_IN_NORM:
	case HI3_TRACE_MLP_IN:
		return "an RMSNorm of an agreeing input differs: its weight, or its reduction";
	case HI3_TRACE_Q:
	case HI3_TRACE_K:
	case HI3_TRACE_V:
		return "qkv_proj, RoPE or qk-norm of an agreeing input differ: the weights, the positions, or the GEMM's "
		       "reduction order (which depends on the batch with --batch-invariant=off and on CUDA)";
	case HI3_TRACE_ATTN:
		return "q, k and v agree but the attention output does not: the keys and values it read (the cached K/V "
		       "of earlier slots: compare the kv files, hi3 diff --row I:J), the mask (--decode-mask), or the "
		       "attention's reduction";
	case HI3_TRACE_ATTN_OUT:
		return "the attention output agrees but o_proj's does not: its weight, or the GEMM's reduction order";
	case HI3_TRACE_ROUTER_LOGITS:
		return "the router product of an agreeing input differs: its weight, or the GEMM's reduction order";
	case HI3_TRACE_EXPERTS:
		return "the router logits agree but other experts were chosen: routing forced from a recording "
		       "(--routing=recorded), or a tie broken another way";
	case HI3_TRACE_EXPERT_WEIGHTS:
		return "the same experts with other weights: recorded weights (--routing-weights=recorded), or the "
		       "softmax";
	case HI3_TRACE_EXPERT_OUT:
	case HI3_TRACE_SHARED_OUT:
		return "an expert's output differs for an agreeing input: its weights, or the GEMM's reduction order";
	case HI3_TRACE_MLP_OUT:
		return "the MLP's products agree but its output does not: a dense MLP's GEMMs, or how the experts' "
		       "outputs are weighted and added";
	case HI3_TRACE_FINAL:
		return "the last layer's output differs where its parts agree: traces of different runs?";
	case HI3_TRACE_FINAL_NORM:
		return "the final RMSNorm of an agreeing input differs: its weight, or its reduction";
	case HI3_TRACE_LOGITS:
		return "lm_head of an agreeing input differs: its weight, or the GEMM's reduction order";
	}
	return "";
}

static const char *meta_of(char **meta, int n, const char *key)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(meta[2 * i], key))
			return meta[2 * i + 1];
	return NULL;
}

/* "prefill, cpu, batch-invariant on, F32 weights, kv F32, 3 rows, forward 3x37" */
static void about(FILE *f, char **meta, int n)
{
	static const struct {
		const char *key, *fmt;
	} items[] = {
		{"stage", "%s"}, {"backend", ", %s"}, {"batch_invariant", ", batch-invariant %s"},
		{"weight_dtype", ", %s weights"}, {"kv_dtype", ", kv %s"}, {"mode", ", %s"}, {"routing", ", routing %s"},
		{"decode_mask", ", decode-mask %s"}, {"token_placement", ", token-placement %s"},
		{"pad_positions", ", pad-positions %s"}, {"ablate", ", ablate %s"}, {"trace_step", ", step %s"},
		{"rows", ", %s rows"}, {"forward_shapes", ", forward %s"},
		{"model_fingerprint", ", model %s"},
	};

	for (size_t i = 0; i < HI3_ARRAY_SIZE(items); i++) {
		const char *v = meta_of(meta, n, items[i].key);
		if (v)
			fprintf(f, items[i].fmt, v);
	}
}

static void fmt_loc(FILE *f, const hi3_trace_diff *d, const hi3_trace_diff_loc *l)
{
	if (d->opts.row_a >= 0 || l->row_a != l->row_b)
		fprintf(f, "row %lld of A (row %lld of B), pos %lld", (long long)l->row_a, (long long)l->row_b,
		        (long long)l->pos);
	else
		fprintf(f, "row %lld, pos %lld", (long long)l->row_a, (long long)l->pos);
	if (l->n_index == 1)
		fprintf(f, ", index %lld", (long long)l->index[0]);
	else if (l->n_index == 2)
		fprintf(f, ", expert slot %lld, index %lld", (long long)l->index[0], (long long)l->index[1]);
}

/* The columns of the per-layer table. */
static const struct {
	int kind;
	const char *head;
} columns[] = {
	{HI3_TRACE_IN, "in"}, {HI3_TRACE_IN_NORM, "in_norm"}, {HI3_TRACE_Q, "q"}, {HI3_TRACE_K, "k"},
	{HI3_TRACE_V, "v"}, {HI3_TRACE_ATTN, "attn"}, {HI3_TRACE_ATTN_OUT, "attn_out"}, {HI3_TRACE_MLP_IN, "mlp_in"},
	{HI3_TRACE_ROUTER_LOGITS, "router"}, {HI3_TRACE_EXPERTS, "experts"}, {HI3_TRACE_EXPERT_WEIGHTS, "exp_w"},
	{HI3_TRACE_EXPERT_OUT, "exp_out"}, {HI3_TRACE_SHARED_OUT, "shared"}, {HI3_TRACE_MLP_OUT, "mlp_out"},
};

static const hi3_trace_diff_point *find(const hi3_trace_diff *d, int kind, int layer, int sub)
{
	for (int i = 0; i < d->n; i++)
		if (d->p[i].kind == kind && d->p[i].layer == layer && d->p[i].sub == sub)
			return &d->p[i];
	return NULL;
}

/* One cell: max |d| (0 when equal), ids: tokens that differ ("3t"). */
static void cell(char *buf, size_t n, const hi3_trace_diff *d, const hi3_trace_diff_point *p)
{
	if (!p) {
		*buf = '\0';
		return;
	}
	switch (p->status) {
	case HI3_DIFF_ONLY_A: snprintf(buf, n, "A only"); break;
	case HI3_DIFF_ONLY_B: snprintf(buf, n, "B only"); break;
	case HI3_DIFF_DTYPE: snprintf(buf, n, "dtype"); break;
	case HI3_DIFF_SHAPE: snprintf(buf, n, "shape"); break;
	default:
		if (p->integer)
			snprintf(buf, n, p->tokens_over ? "%lldt" : "0", (long long)p->tokens_over);
		else if (p->max_abs == 0)
			snprintf(buf, n, "0");
		else
			snprintf(buf, n, "%.1e", p->max_abs);
	}
	if (d->first >= 0 && p == &d->p[d->first])
		strncat(buf, "*", n - strlen(buf) - 1);
}

static const char *status_name(int s)
{
	static const char *names[] = {"ok", "over", "only_a", "only_b", "dtype", "shape", "length", "skipped"};

	return s >= 0 && s < (int)HI3_ARRAY_SIZE(names) ? names[s] : "?";
}

static void text_report(FILE *f, const hi3_trace_diff *d)
{
	char c[32];
	int used[HI3_ARRAY_SIZE(columns)] = {0}, any = 0;

	fprintf(f, "A: %s (", d->path_a);
	about(f, d->meta_a, d->n_meta_a);
	fprintf(f, ")\nB: %s (", d->path_b);
	about(f, d->meta_b, d->n_meta_b);
	fprintf(f, ")\n");
	fprintf(f, "aligned %lld tokens (", (long long)d->aligned);
	if (d->opts.row_a >= 0)
		fprintf(f, "row %lld of A with row %lld of B, ", (long long)d->opts.row_a, (long long)d->opts.row_b);
	if (d->opts.tol > 0)
		snprintf(c, sizeof(c), "%g", d->opts.tol);
	else
		snprintf(c, sizeof(c), "0 (bitwise)");
	fprintf(f, "positions %lld-%lld); only in A: %lld, only in B: %lld; tolerance %s\n", (long long)d->pos_lo,
	        (long long)d->pos_hi, (long long)d->only_a, (long long)d->only_b, c);
	{
		const char *fa = meta_of(d->meta_a, d->n_meta_a, "model_fingerprint");
		const char *fb = meta_of(d->meta_b, d->n_meta_b, "model_fingerprint");
		if (fa && fb && strcmp(fa, fb))
			fprintf(f, "note: the traces come from different models (fingerprints %s and %s)\n", fa, fb);
	}
	if (d->first < 0) {
		fprintf(f, "no difference: every point of the %lld aligned tokens agrees%s\n", (long long)d->aligned,
		        d->opts.tol > 0 ? " within tolerance" : " bitwise");
	} else {
		const hi3_trace_diff_point *p = &d->p[d->first];

		fprintf(f, "first difference: %s", p->name);
		if (p->status == HI3_DIFF_OVER) {
			fprintf(f, " at ");
			fmt_loc(f, d, &p->first);
			fprintf(f, ": a=%.9g b=%.9g |d|=%.3g\n", p->first.a, p->first.b, fabs(p->first.a - p->first.b));
			fprintf(f, "  %lld of %lld tokens differ there; the largest |d|=%.3g at ", (long long)p->tokens_over,
			        (long long)d->aligned, p->max_abs);
			fmt_loc(f, d, &p->worst);
			fprintf(f, "\n");
		} else {
			fprintf(f, ": %s\n", status_name(p->status));
		}
		if (p->status == HI3_DIFF_OVER)
			fprintf(f, "  what it depends on agrees%s: the points before it at position %lld, and every point "
			        "at earlier positions\n", d->opts.tol > 0 ? " within tolerance" : " bitwise",
			        (long long)p->first.pos);
		fprintf(f, "  %s\n", hint(d, p));
	}
	/* the table: tokens and embed, the layers, the head */
	fprintf(f, "\nmax |A - B| by layer and point (ids: tokens that differ, \"3t\"; * the first difference):\n");
	for (size_t j = 0; j < HI3_ARRAY_SIZE(columns); j++)
		for (int l = 0; l < d->n_layers && !used[j]; l++)
			used[j] = find(d, columns[j].kind, l, 0) != NULL;
	cell(c, sizeof(c), d, &d->p[0]);
	fprintf(f, "%-10s %s\n", "tokens", c);
	if (find(d, HI3_TRACE_EMBED, -1, 0)) {
		cell(c, sizeof(c), d, find(d, HI3_TRACE_EMBED, -1, 0));
		fprintf(f, "%-10s %s\n", "embed", c);
	}
	for (size_t j = 0; j < HI3_ARRAY_SIZE(columns); j++)
		any |= used[j];
	if (any) {
		char line[16 * 12];
		size_t n = (size_t)snprintf(line, sizeof(line), "%-6s", "layer");
		for (size_t j = 0; j < HI3_ARRAY_SIZE(columns); j++)
			if (used[j])
				n += (size_t)snprintf(line + n, sizeof(line) - n, " %-9s", columns[j].head);
		while (n && line[n - 1] == ' ')
			line[--n] = '\0';
		fprintf(f, "%s\n", line);
		for (int l = 0; l < d->n_layers; l++) {
			n = (size_t)snprintf(line, sizeof(line), "%-6d", l);
			for (size_t j = 0; j < HI3_ARRAY_SIZE(columns); j++)
				if (used[j]) {
					cell(c, sizeof(c), d, find(d, columns[j].kind, l, 0));
					n += (size_t)snprintf(line + n, sizeof(line) - n, " %-9s", *c ? c : "-");
				}
			while (n && line[n - 1] == ' ')
				line[--n] = '\0';
			fprintf(f, "%s\n", line);
		}
	}
	for (int i = 0; i < d->n; i++)
		if (d->p[i].layer < 0 && d->p[i].kind > HI3_TRACE_EMBED) {
			cell(c, sizeof(c), d, &d->p[i]);
			fprintf(f, "%-16s %s\n", d->p[i].name, c);
		}
	fprintf(f, "summary: ");
	if (d->first < 0)
		fprintf(f, "equal (%d points)\n", d->n);
	else
		fprintf(f, "%d of %d points differ; first: %s\n", d->n_differ, d->n, d->p[d->first].name);
}

static json_t *loc_json(const hi3_trace_diff_loc *l, int integer)
{
	json_t *o = json_object(), *idx = json_array();

	for (int i = 0; i < l->n_index; i++)
		json_array_append_new(idx, json_integer(l->index[i]));
	json_object_set_new(o, "row_a", json_integer(l->row_a));
	json_object_set_new(o, "row_b", json_integer(l->row_b));
	json_object_set_new(o, "pos", json_integer(l->pos));
	json_object_set_new(o, "index", idx);
	json_object_set_new(o, "a", hi3i_json_num(l->a, integer));
	json_object_set_new(o, "b", hi3i_json_num(l->b, integer));
	return o;
}

static json_t *meta_json(char **meta, int n)
{
	json_t *o = json_object();

	for (int i = 0; i < n; i++)
		json_object_set_new(o, meta[2 * i], json_string(meta[2 * i + 1]));
	return o;
}

static json_t *report_json(const hi3_trace_diff *d)
{
	json_t *root = json_object(), *pts = json_array();

	json_object_set_new(root, "a", json_string(d->path_a));
	json_object_set_new(root, "b", json_string(d->path_b));
	json_object_set_new(root, "meta_a", meta_json(d->meta_a, d->n_meta_a));
	json_object_set_new(root, "meta_b", meta_json(d->meta_b, d->n_meta_b));
	json_object_set_new(root, "tol", json_real(d->opts.tol));
	json_object_set_new(root, "rows", d->opts.row_a >= 0 ? json_pack("[II]", (json_int_t)d->opts.row_a,
	                                                                (json_int_t)d->opts.row_b) : json_null());
	json_object_set_new(root, "aligned", json_integer(d->aligned));
	json_object_set_new(root, "only_a", json_integer(d->only_a));
	json_object_set_new(root, "only_b", json_integer(d->only_b));
	json_object_set_new(root, "positions", json_pack("[II]", (json_int_t)d->pos_lo, (json_int_t)d->pos_hi));
	json_object_set_new(root, "n_layers", json_integer(d->n_layers));
	json_object_set_new(root, "equal", json_boolean(d->equal));
	json_object_set_new(root, "differ", json_integer(d->n_differ));
	if (d->first >= 0) {
		const hi3_trace_diff_point *p = &d->p[d->first];
		json_t *fo = p->status == HI3_DIFF_OVER ? loc_json(&p->first, p->integer) : json_object();

		json_object_set_new(fo, "point", json_string(p->name));
		json_object_set_new(fo, "kind", p->kind >= 0 ? json_string(hi3_trace_kind_name(p->kind)) : json_string("tokens"));
		json_object_set_new(fo, "layer", p->layer >= 0 ? json_integer(p->layer) : json_null());
		json_object_set_new(fo, "status", json_string(status_name(p->status)));
		json_object_set_new(fo, "hint", json_string(hint(d, p)));
		json_object_set_new(root, "first", fo);
	} else {
		json_object_set_new(root, "first", json_null());
	}
	for (int i = 0; i < d->n; i++) {
		const hi3_trace_diff_point *p = &d->p[i];
		json_t *e = json_object();

		json_object_set_new(e, "name", json_string(p->name));
		json_object_set_new(e, "kind", p->kind >= 0 ? json_string(hi3_trace_kind_name(p->kind)) : json_string("tokens"));
		json_object_set_new(e, "layer", p->layer >= 0 ? json_integer(p->layer) : json_null());
		json_object_set_new(e, "status", json_string(status_name(p->status)));
		if (p->status == HI3_DIFF_OK || p->status == HI3_DIFF_OVER) {
			json_object_set_new(e, "compared", json_integer(p->compared));
			json_object_set_new(e, "over", json_integer(p->over));
			json_object_set_new(e, "tokens_over", json_integer(p->tokens_over));
			json_object_set_new(e, "max_abs", hi3i_json_num(p->max_abs, 0));
			json_object_set_new(e, "first", p->over ? loc_json(&p->first, p->integer) : json_null());
			json_object_set_new(e, "worst", p->max_abs > 0 ? loc_json(&p->worst, p->integer) : json_null());
		}
		json_array_append_new(pts, e);
	}
	json_object_set_new(root, "points", pts);
	return root;
}

int hi3_trace_diff_report(const hi3_trace_diff *d, int json, char **text, size_t *len, hi3_error *err)
{
	char *buf = NULL;
	size_t blen = 0;
	FILE *f;

	*text = NULL;
	if (json)
		return hi3i_json_text(report_json(d), JSON_INDENT(1), text, len, err);
	if (!(f = open_memstream(&buf, &blen)))
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	text_report(f, d);
	if (fclose(f) != 0) {
		free(buf);
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	}
	*text = buf;
	if (len)
		*len = blen;
	return 0;
}

/* ------------------------------------------------------------------- png */

/* One colour per kind of point (logits: topk, then lse). */
static const uint8_t palette[HI3_TRACE_KIND_COUNT + 1][3] = {
	[HI3_TRACE_EMBED] = {127, 127, 127}, [HI3_TRACE_IN] = {31, 119, 180}, [HI3_TRACE_IN_NORM] = {120, 170, 230},
	[HI3_TRACE_Q] = {255, 127, 14}, [HI3_TRACE_K] = {230, 180, 60}, [HI3_TRACE_V] = {44, 160, 44},
	[HI3_TRACE_ATTN] = {130, 210, 110}, [HI3_TRACE_ATTN_OUT] = {214, 39, 40}, [HI3_TRACE_MLP_IN] = {255, 140, 140},
	[HI3_TRACE_ROUTER_LOGITS] = {148, 103, 189}, [HI3_TRACE_EXPERTS] = {0, 0, 0},
	[HI3_TRACE_EXPERT_WEIGHTS] = {190, 160, 220}, [HI3_TRACE_EXPERT_OUT] = {140, 86, 75},
	[HI3_TRACE_SHARED_OUT] = {200, 150, 140}, [HI3_TRACE_MLP_OUT] = {227, 119, 194},
	[HI3_TRACE_FINAL] = {23, 190, 207}, [HI3_TRACE_FINAL_NORM] = {100, 200, 220}, [HI3_TRACE_LOGITS] = {188, 189, 34},
	[HI3_TRACE_KIND_COUNT] = {150, 150, 60},
};

struct frame {
	int ml, mt, pw, ph, spacing, cols;
	int lo, hi;                 /* decades of the y axis */
	int y_zero, y_inf, y_ids;   /* the bands for |d| = 0, +Inf, and ids that differ */
};

static int x_of(const struct frame *fr, int col)
{
	return fr->ml + fr->spacing * col + fr->spacing / 2;
}

/* Column of a point: 0 embed (and tokens), 1 + layer, n_layers + 1 the head. */
static int col_of(const hi3_trace_diff *d, const hi3_trace_diff_point *p)
{
	return p->layer >= 0 ? 1 + p->layer : p->kind <= HI3_TRACE_EMBED ? 0 : d->n_layers + 1;
}

static int y_of(const struct frame *fr, double v)
{
	double top = fr->mt + 44, bot = fr->y_zero - 24;

	if (v == 0)
		return fr->y_zero;
	if (!isfinite(v))
		return fr->y_inf;
	return (int)(top + (fr->hi - log10(v)) / (fr->hi - fr->lo) * (bot - top) + 0.5);
}

static const uint8_t *colour_of(const hi3_trace_diff_point *p)
{
	return p->kind == HI3_TRACE_LOGITS && p->sub == HI3I_LOGITS_LSE ? palette[HI3_TRACE_KIND_COUNT] : palette[p->kind];
}

static void marker(hi3i_canvas *c, int x, int y, const uint8_t rgb[3])
{
	hi3i_canvas_rect(c, x - 3, y - 3, 7, 7, rgb);
}

int hi3_trace_diff_png(const hi3_trace_diff *d, const char *path, hi3_error *err)
{
	static const uint8_t white[3] = {255, 255, 255}, black[3] = {0, 0, 0}, grid[3] = {225, 225, 225},
	                     axis[3] = {90, 90, 90}, red[3] = {220, 0, 0};
	struct frame fr = {.ml = 84, .mt = 44, .ph = 420};
	double mn = INFINITY, mx = 0;
	hi3i_canvas c = {0};
	char buf[160];
	int rc, ly, legend_x;

	fr.cols = d->n_layers + 2;
	fr.spacing = HI3_MAX(20, HI3_MIN(96, 1200 / fr.cols));
	fr.pw = fr.spacing * fr.cols;
	for (int i = 0; i < d->n; i++)
		if (!d->p[i].integer && (d->p[i].status == HI3_DIFF_OK || d->p[i].status == HI3_DIFF_OVER) &&
		    d->p[i].max_abs > 0 && isfinite(d->p[i].max_abs)) {
			mn = fmin(mn, d->p[i].max_abs);
			mx = fmax(mx, d->p[i].max_abs);
		}
	fr.lo = isfinite(mn) ? (int)floor(log10(mn)) : -8;
	fr.hi = mx > 0 ? (int)ceil(log10(mx)) : 0;
	if (fr.hi <= fr.lo)
		fr.hi = fr.lo + 1;
	fr.y_ids = fr.mt + 4;
	fr.y_inf = fr.mt + 22;
	fr.y_zero = fr.mt + fr.ph - 10;
	legend_x = fr.ml + fr.pw + 24;
	if (hi3i_canvas_init(&c, legend_x + 21 * 12, fr.mt + fr.ph + 56, white, err) != 0)
		return -1;
	/* the title */
	if (d->first < 0)
		snprintf(buf, sizeof(buf), "no difference (%lld tokens)", (long long)d->aligned);
	else if (d->p[d->first].status == HI3_DIFF_OVER)
		snprintf(buf, sizeof(buf), "first difference: %s, row %lld, pos %lld", d->p[d->first].name,
		         (long long)d->p[d->first].first.row_a, (long long)d->p[d->first].first.pos);
	else
		snprintf(buf, sizeof(buf), "first difference: %s (%s)", d->p[d->first].name,
		         status_name(d->p[d->first].status));
	hi3i_canvas_text(&c, 8, 8, buf, 2, black);
	/* the y axis: a line per decade, the zero and +Inf bands */
	for (int e = fr.lo; e <= fr.hi; e++) {
		int y = y_of(&fr, pow(10, e));
		hi3i_canvas_rect(&c, fr.ml, y, fr.pw, 1, grid);
		snprintf(buf, sizeof(buf), "1e%d", e);
		hi3i_canvas_text(&c, fr.ml - 8 - 12 * (int)strlen(buf), y - 7, buf, 2, axis);
	}
	hi3i_canvas_rect(&c, fr.ml, fr.y_zero, fr.pw, 1, grid);
	hi3i_canvas_text(&c, fr.ml - 20, fr.y_zero - 7, "0", 2, axis);
	hi3i_canvas_text(&c, fr.ml - 44, fr.y_inf - 7, "inf", 2, axis);
	hi3i_canvas_text(&c, fr.ml - 44, fr.y_ids - 7, "ids", 1, axis);
	hi3i_canvas_rect(&c, fr.ml, fr.mt, 1, fr.ph, axis);
	hi3i_canvas_rect(&c, fr.ml, fr.mt + fr.ph, fr.pw, 1, axis);
	/* the x axis: embed, the layers, the head */
	for (int col = 0; col < fr.cols; col++) {
		int x = x_of(&fr, col), every = HI3_MAX(1, 24 / fr.spacing + (fr.cols > 40));
		if (col == 0)
			snprintf(buf, sizeof(buf), "e");
		else if (col == fr.cols - 1)
			snprintf(buf, sizeof(buf), "f");
		else if ((col - 1) % every == 0)
			snprintf(buf, sizeof(buf), "%d", col - 1);
		else
			continue;
		hi3i_canvas_rect(&c, x, fr.mt + fr.ph, 1, 5, axis);
		hi3i_canvas_text(&c, x - 6 * (int)strlen(buf) + 1, fr.mt + fr.ph + 10, buf, 2, axis);
	}
	hi3i_canvas_text(&c, fr.ml, fr.mt + fr.ph + 34, "layer (e: embedding, f: final norm and logits); "
	                 "y: log10 max |a - b|", 1, axis);
	/* one line per kind across the layers, then the single points */
	for (int k = HI3_TRACE_IN; k <= HI3_TRACE_MLP_OUT; k++) {
		int px = -1, py = -1;
		if (k == HI3_TRACE_EXPERTS)
			continue;
		for (int l = 0; l < d->n_layers; l++) {
			const hi3_trace_diff_point *p = find(d, k, l, 0);
			int x, y;
			if (!p || (p->status != HI3_DIFF_OK && p->status != HI3_DIFF_OVER)) {
				px = -1;
				continue;
			}
			x = x_of(&fr, 1 + l);
			y = y_of(&fr, p->max_abs);
			if (px >= 0)
				hi3i_canvas_line(&c, px, py, x, y, 2, palette[k]);
			marker(&c, x, y, palette[k]);
			px = x;
			py = y;
		}
	}
	for (int i = 0; i < d->n; i++) {
		const hi3_trace_diff_point *p = &d->p[i];
		int x = x_of(&fr, col_of(d, p));
		if (p->status != HI3_DIFF_OK && p->status != HI3_DIFF_OVER)
			continue;
		if (p->integer) {
			if (p->tokens_over)
				hi3i_canvas_text(&c, x - 5, fr.y_ids - 7, "x", 2, red);
		} else if (p->layer < 0) {
			marker(&c, x, y_of(&fr, p->max_abs), colour_of(p));
		}
	}
	if (d->first >= 0 && d->p[d->first].status == HI3_DIFF_OVER) {
		const hi3_trace_diff_point *p = &d->p[d->first];
		int x = x_of(&fr, col_of(d, p)), y = p->integer ? fr.y_ids : y_of(&fr, p->max_abs);
		hi3i_canvas_line(&c, x - 8, y - 8, x + 8, y - 8, 1, black);
		hi3i_canvas_line(&c, x - 8, y + 8, x + 8, y + 8, 1, black);
		hi3i_canvas_line(&c, x - 8, y - 8, x - 8, y + 8, 1, black);
		hi3i_canvas_line(&c, x + 8, y - 8, x + 8, y + 8, 1, black);
	}
	/* the legend: the kinds present, in forward order */
	ly = fr.mt;
	for (int k = 0; k <= HI3_TRACE_KIND_COUNT; k++) {
		int kind = k == HI3_TRACE_KIND_COUNT ? HI3_TRACE_LOGITS : k, sub = k == HI3_TRACE_KIND_COUNT ? HI3I_LOGITS_LSE : 0;
		const char *name = k == HI3_TRACE_KIND_COUNT ? "logits.lse" : k == HI3_TRACE_LOGITS ? "logits.topk"
		                 : hi3_trace_kind_name(k);
		int present = 0;
		if (kind == HI3_TRACE_EXPERTS)
			continue;
		for (int i = 0; i < d->n && !present; i++)
			present = d->p[i].kind == kind && d->p[i].sub == sub;
		if (!present)
			continue;
		hi3i_canvas_rect(&c, legend_x, ly + 5, 18, 4, palette[k]);
		hi3i_canvas_text(&c, legend_x + 26, ly, name, 2, black);
		ly += 20;
	}
	hi3i_canvas_text(&c, legend_x, ly, "x", 2, red);
	hi3i_canvas_text(&c, legend_x + 26, ly, "ids differ", 2, black);
	rc = hi3i_canvas_write(&c, path, err);
	hi3i_canvas_release(&c);
	return rc;
}
