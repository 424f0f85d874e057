/*
 * trace.c -- the activation recorder: hi3_forward calls it at each named
 * point (hi3_trace_kind) with the device buffer that holds the point for
 * all M tokens of the call; it keeps the rows of the chosen tokens, gathered
 * on the device and downloaded, in host memory, and hi3_trace_write writes
 * them as a trace file (format/trace.c). A forward call without a trace, or
 * none of whose tokens is chosen, calls nothing here.
 *
 * Shapes: M tokens of a forward call, n kept tokens of it, H hidden, W the
 * fused qkv width, d head dim, k experts per token, V vocabulary, K logits
 * kept per token.
 *
 * A failure (out of memory, a backend copy) is recorded and returned by
 * hi3i_trace_end, so the points themselves return nothing.
 */
#include <math.h>
#include <string.h>
#include "format/trace.h"
#include "model/model.h"

/* One point's rows so far: count tokens of tok_bytes each. */
struct series {
	char name[48];
	int kind, layer, sub;
	hi3_dtype dtype;
	int ndim;
	int64_t dims[2];              /* the per-token shape (ndim - 1 of them) */
	size_t tok_bytes;
	unsigned char *data;
	size_t cap;                   /* bytes */
	int64_t count;
};

struct hi3_trace {
	hi3_model *m;
	int64_t *sel_rows;            /* (n_rows) */
	int n_rows;
	int64_t *ranges;              /* (n_ranges, 2), or NULL: every position */
	int n_ranges;
	uint32_t kinds;
	int topk;
	/* the tokens recorded */
	int32_t *rows;                /* (n) */
	int64_t *pos, *tok;           /* (n) */
	int64_t n;
	size_t tok_cap;
	/* this forward call */
	int n_keep;                   /* 0: nothing kept */
	int32_t *keep;                /* (n_keep) host: token indices m */
	int32_t *h_rows;              /* (n_keep k) host: rows for hi3i_trace_rows */
	float *h_buf;                 /* downloaded rows */
	size_t keep_hcap, rows_hcap, buf_hcap;          /* host capacities, in elements */
	int32_t *d_keep, *d_rows;     /* device copies of keep and h_rows */
	float *d_buf;                 /* gathered rows */
	void *d_scratch[2];
	size_t keep_dcap, rows_dcap, buf_dcap, scratch_dcap[2];   /* device capacities, in elements */
	struct series *series;        /* room for every possible point: pointers stay valid */
	int n_series;
	int *slot;                    /* ((n_layers + 1) * KIND_COUNT * 3): series index + 1, 0 none */
	char **meta;                  /* (n_meta, 2) */
	int n_meta;
	int64_t calls;
	char shapes[256];             /* the distinct "BxT" of the calls */
	hi3_error err;                /* the first failure; status 0: none */
};

static void fail(hi3_trace *t, const char *what)
{
	if (!t->err.status)
		hi3_error_set(&t->err, HI3_ERR_RUNTIME, "trace: %s", what);
}

static void fail_backend(hi3_trace *t)
{
	hi3_backend *be = t->m->be;

	if (!t->err.status && hi3i_backend_failed(be, &t->err) == 0)
		hi3_error_set(&t->err, HI3_ERR_RUNTIME, "trace: the %s backend could not copy a traced point", be->name);
}

int hi3_trace_new(hi3_trace **out, hi3_model *m, const hi3_trace_opts *o, hi3_error *err)
{
	const hi3_config *c = hi3_model_config(m);
	hi3_trace *t = hi3i_calloc(1, sizeof(*t), err);

	*out = NULL;
	if (!t)
		return -1;
	t->m = m;
	t->kinds = o->kinds ? o->kinds : (1u << HI3_TRACE_KIND_COUNT) - 1;
	t->topk = o->topk > 0 ? HI3_MIN(o->topk, c->vocab_size) : HI3_MIN(16, c->vocab_size);
	t->n_rows = o->rows ? o->n_rows : 1;
	t->sel_rows = hi3i_calloc((size_t)t->n_rows + 1, sizeof(int64_t), err);
	t->slot = hi3i_calloc((size_t)(c->num_hidden_layers + 1) * HI3_TRACE_KIND_COUNT * HI3I_LOGITS_SUBS,
	                      sizeof(int), err);
	t->series = hi3i_calloc((size_t)(c->num_hidden_layers + 1) * HI3_TRACE_KIND_COUNT * HI3I_LOGITS_SUBS,
	                        sizeof(*t->series), err);
	if (!t->sel_rows || !t->slot || !t->series)
		goto fail;
	if (o->rows)
		memcpy(t->sel_rows, o->rows, sizeof(int64_t) * (size_t)o->n_rows);
	if (o->ranges && o->n_ranges > 0) {
		t->n_ranges = o->n_ranges;
		if (!(t->ranges = hi3i_malloc(sizeof(int64_t) * 2 * (size_t)o->n_ranges, err)))
			goto fail;
		memcpy(t->ranges, o->ranges, sizeof(int64_t) * 2 * (size_t)o->n_ranges);
	}
	*out = t;
	return 0;
fail:
	hi3_trace_free(t);
	return -1;
}

void hi3_trace_free(hi3_trace *t)
{
	hi3_backend *be;

	if (!t)
		return;
	be = t->m->be;
	{
		void *dev[] = {t->d_keep, t->d_rows, t->d_buf, t->d_scratch[0], t->d_scratch[1]};
		for (size_t i = 0; i < HI3_ARRAY_SIZE(dev); i++)
			if (dev[i])
				be->ops->free(be, dev[i]);
	}
	for (int i = 0; i < t->n_series; i++)
		free(t->series[i].data);
	for (int i = 0; i < 2 * t->n_meta; i++)
		free(t->meta[i]);
	free(t->meta);
	free(t->series);
	free(t->slot);
	free(t->sel_rows);
	free(t->ranges);
	free(t->rows);
	free(t->pos);
	free(t->tok);
	free(t->keep);
	free(t->h_rows);
	free(t->h_buf);
	free(t);
}

int hi3_trace_set_meta(hi3_trace *t, const char *key, const char *val, hi3_error *err)
{
	char **m, *k = NULL, *v;

	if (!hi3i_codec_meta(&hi3i_format_trace, key))
		return hi3_error_set(err, HI3_ERR_USAGE, "'%s' is not a metadata key of %s (hi3-files(5), TRACE)", key,
		                     HI3_FORMAT_TRACE);
	v = hi3i_strdup(val);

	for (int i = 0; i < t->n_meta; i++)
		if (!strcmp(t->meta[2 * i], key)) {
			if (!v)
				return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
			free(t->meta[2 * i + 1]);
			t->meta[2 * i + 1] = v;
			return 0;
		}
	m = realloc(t->meta, sizeof(char *) * 2 * (size_t)(t->n_meta + 1));
	if (m)
		t->meta = m;
	if (!m || !v || !(k = hi3i_strdup(key))) {
		free(v);
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	}
	t->meta[2 * t->n_meta] = k;
	t->meta[2 * t->n_meta + 1] = v;
	t->n_meta++;
	return 0;
}

int64_t hi3_trace_count(const hi3_trace *t)
{
	return t->n;
}

/* ---------------------------------------------------------------- buffers */

/* Grow a host array to hold n elements of size sz. */
static void *grow(void **p, size_t *cap, size_t n, size_t sz)
{
	if (n > *cap) {
		size_t c = HI3_MAX(n, *cap * 2);
		void *q = realloc(*p, c * sz);
		if (!q)
			return NULL;
		*p = q;
		*cap = c;
	}
	return *p;
}

/* A device buffer of at least n elements of size sz (contents lost). */
static void *dev_grow(hi3_trace *t, void **p, size_t *cap, size_t n, size_t sz)
{
	hi3_backend *be = t->m->be;

	if (n <= *cap && *p)
		return *p;
	if (*p)
		be->ops->free(be, *p);
	*cap = 0;
	n = HI3_MAX(n, 64);
	if (!(*p = be->ops->alloc(be, n * sz))) {
		fail(t, "out of device memory for traced points");
		return NULL;
	}
	*cap = n;
	return *p;
}

static int wanted_row(const hi3_trace *t, int64_t row)
{
	for (int i = 0; i < t->n_rows; i++)
		if (t->sel_rows[i] == row)
			return 1;
	return 0;
}

static int wanted_pos(const hi3_trace *t, int64_t pos)
{
	if (!t->ranges)
		return 1;
	for (int i = 0; i < t->n_ranges; i++)
		if (pos >= t->ranges[2 * i] && pos < t->ranges[2 * i + 1])
			return 1;
	return 0;
}

/* Add "BxT" to the list of call shapes, once; ",..." when it is full. */
static void note_shape(hi3_trace *t, int B, int T)
{
	char item[32];
	size_t len = strlen(t->shapes), n;

	n = (size_t)snprintf(item, sizeof(item), "%dx%d", B, T);
	for (const char *p = t->shapes; *p; p += strcspn(p, ","), p += *p == ',')
		if (!strncmp(p, item, n) && (p[n] == ',' || !p[n]))
			return;
	if (len + n + 6 > sizeof(t->shapes)) {
		if (len < 4 || strcmp(t->shapes + len - 4, ",..."))
			strcat(t->shapes, ",...");
		return;
	}
	snprintf(t->shapes + len, sizeof(t->shapes) - len, "%s%s", len ? "," : "", item);
}

static int add_token(hi3_trace *t, int32_t row, int64_t pos, int64_t tok)
{
	if ((size_t)t->n + 1 > t->tok_cap) {
		size_t c = HI3_MAX((size_t)1024, t->tok_cap * 2);
		int32_t *r = realloc(t->rows, c * sizeof(int32_t));
		int64_t *p, *k;

		if (r)
			t->rows = r;
		p = r ? realloc(t->pos, c * sizeof(int64_t)) : NULL;
		if (p)
			t->pos = p;
		k = p ? realloc(t->tok, c * sizeof(int64_t)) : NULL;
		if (!k)
			return -1;
		t->tok = k;
		t->tok_cap = c;
	}
	t->rows[t->n] = row;
	t->pos[t->n] = pos;
	t->tok[t->n] = tok;
	t->n++;
	return 0;
}

int hi3i_trace_begin(hi3_trace *t, const hi3_batch *b)
{
	hi3_backend *be = t->m->be;

	t->n_keep = 0;
	if (t->err.status)
		return -1;
	t->calls++;
	note_shape(t, b->B, b->T);
	for (int r = 0; r < b->B; r++) {
		int64_t row = b->trace_row ? b->trace_row[r] : r;
		if (!wanted_row(t, row))
			continue;
		for (int c = 0; c < b->T; c++) {
			size_t i = (size_t)r * b->T + c;
			int64_t pos = b->trace_pos ? b->trace_pos[i] : c;
			if (pos < 0 || !wanted_pos(t, pos))
				continue;
			if (!grow((void **)&t->keep, &t->keep_hcap, (size_t)t->n_keep + 1, sizeof(int32_t)) ||
			    add_token(t, (int32_t)row, pos, b->ids[i]) != 0) {
				fail(t, "out of memory");
				return -1;
			}
			t->keep[t->n_keep++] = (int32_t)i;
		}
	}
	if (!t->n_keep)
		return 0;
	if (!dev_grow(t, (void **)&t->d_keep, &t->keep_dcap, (size_t)t->n_keep, sizeof(int32_t)))
		return -1;
	if (be->ops->upload(be, t->d_keep, t->keep, sizeof(int32_t) * (size_t)t->n_keep) != 0) {
		fail_backend(t);
		return -1;
	}
	return 0;
}

int hi3i_trace_end(hi3_trace *t, hi3_error *err)
{
	t->n_keep = 0;
	if (t->err.status) {
		if (err)
			*err = t->err;
		return -1;
	}
	return 0;
}

void hi3i_trace_abort(hi3_trace *t, const hi3_error *err)
{
	t->n_keep = 0;
	if (!t->err.status)
		hi3_error_set(&t->err, HI3_ERR_RUNTIME, "trace: a forward pass failed (%s)",
		              err && err->status ? err->msg : "unknown error");
}

int hi3i_trace_wants(const hi3_trace *t, int kind)
{
	return t && t->n_keep > 0 && !t->err.status && (t->kinds >> kind & 1u);
}

const int32_t *hi3i_trace_kept(const hi3_trace *t, int *n)
{
	*n = t && !t->err.status ? t->n_keep : 0;
	return *n ? t->d_keep : NULL;
}

void *hi3i_trace_scratch(hi3_trace *t, int which, size_t floats)
{
	return dev_grow(t, &t->d_scratch[which], &t->scratch_dcap[which], floats, sizeof(float));
}

/* ----------------------------------------------------------------- series */

/* The series of a point, made on first use with per-token shape dims. */
static struct series *series_of(hi3_trace *t, int kind, int layer, int sub, const int64_t *dims)
{
	size_t key = ((size_t)(layer + 1) * HI3_TRACE_KIND_COUNT + (size_t)kind) * HI3I_LOGITS_SUBS + (size_t)sub;
	struct series *s;

	if (t->slot[key])
		return &t->series[t->slot[key] - 1];
	s = &t->series[t->n_series];
	hi3i_trace_point_name(s->name, sizeof(s->name), kind, layer, sub);
	s->kind = kind;
	s->layer = layer;
	s->sub = sub;
	s->dtype = hi3i_trace_point_dtype(kind, sub);
	s->ndim = hi3i_trace_point_ndim(kind, sub);
	s->tok_bytes = hi3_dtype_size(s->dtype);
	for (int d = 0; d < s->ndim - 1; d++) {
		s->dims[d] = dims[d];
		s->tok_bytes *= (size_t)dims[d];
	}
	t->slot[key] = ++t->n_series;
	return s;
}

/* Room for n more tokens of s; NULL (failure recorded) when out of memory. */
static unsigned char *series_room(hi3_trace *t, struct series *s, int64_t n)
{
	size_t need = (size_t)(s->count + n) * s->tok_bytes;

	if (need > s->cap) {
		/* exactly what the first call needs (one call: no copy), then doubling */
		size_t c = s->cap ? HI3_MAX(need, s->cap * 2) : need;
		unsigned char *q = realloc(s->data, c);
		if (!q) {
			fail(t, "out of memory for traced points");
			return NULL;
		}
		s->data = q;
		s->cap = c;
	}
	return s->data + (size_t)s->count * s->tok_bytes;
}

static void append(hi3_trace *t, int kind, int layer, int sub, const int64_t *dims, const void *src, int64_t n)
{
	struct series *s = series_of(t, kind, layer, sub, dims);
	unsigned char *dst = s ? series_room(t, s, n) : NULL;

	if (!dst)
		return;
	memcpy(dst, src, (size_t)n * s->tok_bytes);
	s->count += n;
}

/* Download n rows of w floats from the device into h_buf. */
static float *download(hi3_trace *t, const float *dev, size_t n, size_t w)
{
	hi3_backend *be = t->m->be;

	if (!grow((void **)&t->h_buf, &t->buf_hcap, n * w, sizeof(float))) {
		fail(t, "out of memory");
		return NULL;
	}
	if (be->ops->download(be, t->h_buf, dev, sizeof(float) * n * w) != 0) {
		fail_backend(t);
		return NULL;
	}
	return t->h_buf;
}

/* Gather the kept rows of dev (M, w) (rows idx, n of them) and download
 * them into dst (host, n w floats), or into h_buf when dst is NULL. */
static float *gather_into(hi3_trace *t, float *dst, const float *dev, const int32_t *idx, int n, int w)
{
	hi3_backend *be = t->m->be;

	if (!dev_grow(t, (void **)&t->d_buf, &t->buf_dcap, (size_t)n * w, sizeof(float)))
		return NULL;
	be->ops->gather(be, t->d_buf, dev, idx, n, w);
	if (hi3i_backend_failed(be, NULL) != 0) {
		fail_backend(t);
		return NULL;
	}
	if (!dst)
		return download(t, t->d_buf, (size_t)n, (size_t)w);
	if (be->ops->download(be, dst, t->d_buf, sizeof(float) * (size_t)n * w) != 0) {
		fail_backend(t);
		return NULL;
	}
	return dst;
}

static float *gather(hi3_trace *t, const float *dev, const int32_t *idx, int n, int w)
{
	return gather_into(t, NULL, dev, idx, n, w);
}

/* Gather n kept rows of dev (M, w) straight into the series of a point. */
static void gather_point(hi3_trace *t, int kind, int layer, const int64_t *dims, const float *dev,
                         const int32_t *idx, int n, int w)
{
	struct series *s = series_of(t, kind, layer, 0, dims);
	float *dst = (float *)(void *)series_room(t, s, t->n_keep);

	if (dst && gather_into(t, dst, dev, idx, n, w))
		s->count += t->n_keep;
}

/* q, k and v of the fused qkv rows (n, W): per kv head h, g query heads,
 * then its key and value head. */
static void split_qkv(hi3_trace *t, int layer, const float *qkv, int n)
{
	const struct hi3_dims *dm = &t->m->dims;
	const int d = dm->d, nkv = dm->n_kv, g = dm->n_h / dm->n_kv, W = (dm->n_h + 2 * dm->n_kv) * d;
	const int want[3] = {t->kinds >> HI3_TRACE_Q & 1, t->kinds >> HI3_TRACE_K & 1, t->kinds >> HI3_TRACE_V & 1};
	const int64_t wq[1] = {(int64_t)dm->n_h * d}, wkv[1] = {(int64_t)nkv * d};
	struct series *s[3] = {NULL, NULL, NULL};
	float *dst[3] = {NULL, NULL, NULL};

	for (int x = 0; x < 3; x++)
		if (want[x]) {
			s[x] = series_of(t, HI3_TRACE_Q + x, layer, 0, x ? wkv : wq);
			if (!s[x] || !(dst[x] = (float *)(void *)series_room(t, s[x], n)))
				return;
		}
	for (int i = 0; i < n; i++) {
		const float *src = qkv + (size_t)i * W;
		for (int h = 0; h < nkv; h++) {
			const float *hs = src + (size_t)h * (g + 2) * d;
			if (dst[0])
				memcpy(dst[0] + ((size_t)i * dm->n_h + (size_t)h * g) * d, hs, sizeof(float) * (size_t)g * d);
			if (dst[1])
				memcpy(dst[1] + ((size_t)i * nkv + h) * d, hs + (size_t)g * d, sizeof(float) * (size_t)d);
			if (dst[2])
				memcpy(dst[2] + ((size_t)i * nkv + h) * d, hs + (size_t)(g + 1) * d, sizeof(float) * (size_t)d);
		}
	}
	for (int x = 0; x < 3; x++)
		if (s[x])
			s[x]->count += n;
}

/* ----------------------------------------------------------------- points */

void hi3i_trace_point(hi3_trace *t, int kind, int layer, const float *dev, int w)
{
	const int64_t dims[1] = {w};
	float *h;

	if (kind == HI3_TRACE_Q) {
		if (!(hi3i_trace_wants(t, HI3_TRACE_Q) || hi3i_trace_wants(t, HI3_TRACE_K) ||
		      hi3i_trace_wants(t, HI3_TRACE_V)))
			return;
		if ((h = gather(t, dev, t->d_keep, t->n_keep, w)))
			split_qkv(t, layer, h, t->n_keep);
		return;
	}
	if (!hi3i_trace_wants(t, kind))
		return;
	gather_point(t, kind, layer, dims, dev, t->d_keep, t->n_keep, w);
}

void hi3i_trace_point_kept(hi3_trace *t, int kind, int layer, const float *dev, int w)
{
	const int64_t dims[1] = {w};
	float *h;

	if (hi3i_trace_wants(t, kind) && (h = download(t, dev, (size_t)t->n_keep, (size_t)w)))
		append(t, kind, layer, 0, dims, h, t->n_keep);
}

void hi3i_trace_rows(hi3_trace *t, int kind, int layer, const float *dev, int w, const int32_t *where, int k)
{
	hi3_backend *be = t->m->be;
	const int64_t dims[2] = {k, w};
	const size_t n = (size_t)t->n_keep * (size_t)k;

	if (!hi3i_trace_wants(t, kind))
		return;
	if (!grow((void **)&t->h_rows, &t->rows_hcap, n, sizeof(int32_t))) {
		fail(t, "out of memory");
		return;
	}
	for (int i = 0; i < t->n_keep; i++)
		memcpy(t->h_rows + (size_t)i * k, where + (size_t)t->keep[i] * k, sizeof(int32_t) * (size_t)k);
	if (!dev_grow(t, (void **)&t->d_rows, &t->rows_dcap, n, sizeof(int32_t)))
		return;
	if (be->ops->upload(be, t->d_rows, t->h_rows, sizeof(int32_t) * n) != 0) {
		fail_backend(t);
		return;
	}
	gather_point(t, kind, layer, dims, dev, t->d_rows, (int)n, w);
}

void hi3i_trace_host(hi3_trace *t, int kind, int layer, const void *host, int w)
{
	const int64_t dims[1] = {w};
	struct series *s;
	unsigned char *dst;

	if (!hi3i_trace_wants(t, kind) || !(s = series_of(t, kind, layer, 0, dims)) ||
	    !(dst = series_room(t, s, t->n_keep)))
		return;
	for (int i = 0; i < t->n_keep; i++)
		memcpy(dst + (size_t)i * s->tok_bytes, (const unsigned char *)host + (size_t)t->keep[i] * s->tok_bytes,
		       s->tok_bytes);
	s->count += t->n_keep;
}

/* Top-K logits (descending, ties to the lower id; NaN never kept) and the
 * log-sum-exp (in double) of one row. */
static void topk_row(const float *x, int V, int K, float *val, int32_t *id, float *lse)
{
	double mx = -INFINITY, sum = 0;
	int n = 0, nan = 0;

	for (int v = 0; v < V; v++) {
		float f = x[v];
		if (isnan(f)) {
			nan = 1;
			continue;
		}
		mx = f > mx ? f : mx;
		if (n < K || f > val[n - 1]) {
			int j = n < K ? n++ : K - 1;
			while (j > 0 && val[j - 1] < f) {
				val[j] = val[j - 1];
				id[j] = id[j - 1];
				j--;
			}
			val[j] = f;
			id[j] = v;
		}
	}
	for (int v = 0; v < V; v++)
		if (!isnan(x[v]))
			sum += exp((double)x[v] - mx);
	for (; n < K; n++) {
		val[n] = NAN;
		id[n] = -1;
	}
	*lse = nan ? NAN : isinf(mx) ? (float)mx : (float)(mx + log(sum));
}

void hi3i_trace_logits(hi3_trace *t, const float *dev, int V, int n)
{
	const int K = t->topk;
	const int64_t dims[1] = {K};
	struct series *sv, *si, *sl;
	float *h, *val, *lse;
	int32_t *id;

	if (!hi3i_trace_wants(t, HI3_TRACE_LOGITS) || !(h = download(t, dev, (size_t)n, (size_t)V)))
		return;
	sv = series_of(t, HI3_TRACE_LOGITS, -1, HI3I_LOGITS_TOPK, dims);
	si = sv ? series_of(t, HI3_TRACE_LOGITS, -1, HI3I_LOGITS_TOPK_IDS, dims) : NULL;
	sl = si ? series_of(t, HI3_TRACE_LOGITS, -1, HI3I_LOGITS_LSE, NULL) : NULL;
	if (!sl || !(val = (float *)(void *)series_room(t, sv, n)) || !(id = (int32_t *)(void *)series_room(t, si, n)) ||
	    !(lse = (float *)(void *)series_room(t, sl, n)))
		return;
#pragma omp parallel for schedule(dynamic, 4) if (n > 4)
	for (int i = 0; i < n; i++)
		topk_row(h + (size_t)i * V, V, K, val + (size_t)i * K, id + (size_t)i * K, lse + i);
	sv->count += n;
	si->count += n;
	sl->count += n;
}

/* ------------------------------------------------------------------ write */

static int token_cmp(const void *x, const void *y, void *ctx)
{
	const hi3_trace *t = ctx;
	int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;

	if (t->rows[a] != t->rows[b])
		return t->rows[a] < t->rows[b] ? -1 : 1;
	if (t->pos[a] != t->pos[b])
		return t->pos[a] < t->pos[b] ? -1 : 1;
	return a < b ? -1 : a > b;
}

/* Apply the permutation perm (new i holds old perm[i]) to n elements of
 * size sz in place, cycle by cycle; done (n bytes) is scratch. */
static int permute(void *base, size_t sz, const int64_t *perm, int64_t n, unsigned char *done)
{
	unsigned char *a = base, *tmp = malloc(sz);

	if (!tmp)
		return -1;
	memset(done, 0, (size_t)n);
	for (int64_t i = 0; i < n; i++) {
		int64_t j = i;
		if (done[i] || perm[i] == i)
			continue;
		memcpy(tmp, a + (size_t)i * sz, sz);
		while (perm[j] != i) {
			memcpy(a + (size_t)j * sz, a + (size_t)perm[j] * sz, sz);
			done[j] = 1;
			j = perm[j];
		}
		memcpy(a + (size_t)j * sz, tmp, sz);
		done[j] = 1;
	}
	free(tmp);
	return 0;
}

static int sort_tokens(hi3_trace *t, hi3_error *err)
{
	int64_t *perm = NULL;
	unsigned char *done = NULL;
	int sorted = 1, rc = -1;

	for (int64_t i = 1; i < t->n && sorted; i++)
		sorted = t->rows[i - 1] < t->rows[i] || (t->rows[i - 1] == t->rows[i] && t->pos[i - 1] < t->pos[i]);
	if (sorted)
		return 0;
	perm = hi3i_malloc(sizeof(int64_t) * (size_t)t->n, err);
	done = hi3i_malloc((size_t)t->n, err);
	if (!perm || !done)
		goto out;
	for (int64_t i = 0; i < t->n; i++)
		perm[i] = i;
	qsort_r(perm, (size_t)t->n, sizeof(*perm), token_cmp, t);
	if (permute(t->rows, sizeof(int32_t), perm, t->n, done) || permute(t->pos, sizeof(int64_t), perm, t->n, done) ||
	    permute(t->tok, sizeof(int64_t), perm, t->n, done))
		goto oom;
	for (int i = 0; i < t->n_series; i++)
		if (permute(t->series[i].data, t->series[i].tok_bytes, perm, t->n, done))
			goto oom;
	rc = 0;
	goto out;
oom:
	hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
out:
	free(perm);
	free(done);
	return rc;
}

int hi3_trace_write(hi3_trace *t, const char *path, hi3_error *err)
{
	const hi3_config *c = hi3_model_config(t->m);
	hi3_trace_point *pts = NULL;
	const char **meta = NULL;
	char kinds[512] = "", calls[32], layers[16], topk[16];
	int nm = 0, rc = -1;

	if (t->err.status) {
		*err = t->err;
		return -1;
	}
	if (sort_tokens(t, err) != 0)
		return -1;
	for (int64_t i = 1; i < t->n; i++)
		if (t->rows[i] == t->rows[i - 1] && t->pos[i] == t->pos[i - 1])
			return hi3_error_set(err, HI3_ERR_USAGE, "%s: row %d, position %lld was traced twice (one recorder "
			                     "for one stage run)", path, t->rows[i], (long long)t->pos[i]);
	pts = hi3i_calloc((size_t)t->n_series + 1, sizeof(*pts), err);
	meta = hi3i_calloc(2 * ((size_t)t->n_meta + 16), sizeof(*meta), err);
	if (!pts || !meta)
		goto out;
	for (int i = 0; i < t->n_series; i++) {
		const struct series *s = &t->series[i];
		HI3_ASSERT(s->count == t->n);
		pts[i] = (hi3_trace_point){.name = s->name, .kind = s->kind, .layer = s->layer, .sub = s->sub,
		                           .dtype = s->dtype, .ndim = s->ndim, .shape = {t->n, s->dims[0], s->dims[1]},
		                           .data = s->data};
	}
	for (int k = 0; k < HI3_TRACE_KIND_COUNT; k++)
		if (t->kinds >> k & 1)
			snprintf(kinds + strlen(kinds), sizeof(kinds) - strlen(kinds), "%s%s", *kinds ? "," : "",
			         hi3_trace_kind_name(k));
	snprintf(calls, sizeof(calls), "%lld", (long long)t->calls);
	snprintf(layers, sizeof(layers), "%d", c->num_hidden_layers);
	snprintf(topk, sizeof(topk), "%d", t->topk);
#define META(k, v) (meta[2 * nm] = (k), meta[2 * nm + 1] = (v), nm++)
	META("model_fingerprint", hi3_model_fingerprint(t->m));
	META("backend", hi3_model_backend(t->m));
	META("batch_invariant", hi3_model_batch_invariant(t->m) ? "on" : "off");
	META("weight_dtype", hi3_dtype_name(hi3_model_weight_dtype(t->m)));
	META("n_layers", layers);
	META("points", kinds);
	META("topk", topk);
	META("forward_calls", calls);
	META("forward_shapes", t->shapes);
#undef META
	for (int i = 0; i < t->n_meta; i++) {
		int j = 0;
		while (j < nm && strcmp(meta[2 * j], t->meta[2 * i]))
			j++;
		meta[2 * j] = t->meta[2 * i];
		meta[2 * j + 1] = t->meta[2 * i + 1];
		nm += j == nm;
	}
	{
		/* the series in forward order: the writer checks the order */
		hi3_trace_file f = {.n = t->n, .rows = t->rows, .positions = t->pos, .tokens = t->tok,
		                    .n_points = t->n_series, .points = pts, .meta = meta, .n_meta = nm};
		qsort(pts, (size_t)t->n_series, sizeof(*pts), hi3i_trace_point_cmp);
		rc = hi3_trace_file_write(&f, path, err);
	}
out:
	free(pts);
	free(meta);
	return rc;
}
