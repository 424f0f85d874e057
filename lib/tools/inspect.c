/*
 * inspect.c -- hi3 inspect: what a safetensors file (or a checkpoint
 * directory) holds, a tensor's values, and pictures: a heatmap of a 2-D
 * selection, a conditions row's attention mask, a kv file's valid slots,
 * a trajectory request's latents step by step.
 *
 * Shapes: B rows, L prompt columns, C cache slots, S image blocks.
 */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include "tools/tools.h"

/* A file or a checkpoint directory, its tensors in natural name order. */
struct src {
	const char *path;
	hi3_st *st;
	hi3_ckpt *ck;
	int n;
	const hi3_tensor **t;
};

static int tensor_natcmp(const void *a, const void *b)
{
	return hi3i_natcmp((*(const hi3_tensor *const *)a)->name, (*(const hi3_tensor *const *)b)->name);
}

static void src_close(struct src *s)
{
	hi3_st_close(s->st);
	hi3_ckpt_close(s->ck);
	free(s->t);
	memset(s, 0, sizeof(*s));
}

static int src_open(struct src *s, const char *path, hi3_error *err)
{
	struct stat sb;

	memset(s, 0, sizeof(*s));
	s->path = path;
	if (strcmp(path, "-") && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
		if (hi3_ckpt_open(&s->ck, path, err) != 0)
			return -1;
		s->n = hi3_ckpt_count(s->ck);
	} else {
		if (hi3_st_open(&s->st, path, HI3_ST_READ, err) != 0)
			return -1;
		s->n = hi3_st_count(s->st);
	}
	s->t = hi3i_calloc((size_t)s->n + 1, sizeof(*s->t), err);
	if (!s->t) {
		src_close(s);
		return -1;
	}
	for (int i = 0; i < s->n; i++)
		s->t[i] = s->ck ? hi3_ckpt_at(s->ck, i) : hi3_st_at(s->st, i);
	qsort(s->t, (size_t)s->n, sizeof(*s->t), tensor_natcmp);
	return 0;
}

static const hi3_tensor *src_find(const struct src *s, const char *name)
{
	return s->ck ? hi3_ckpt_find(s->ck, name) : hi3_st_find(s->st, name);
}

static const char *src_meta(const struct src *s, const char *key)
{
	return s->st ? hi3_st_meta(s->st, key) : NULL;
}

/* The shard file name (without the directory) holding a tensor. */
static const char *src_file_of(const struct src *s, const hi3_tensor *t)
{
	const char *f, *slash;

	if (!s->ck)
		return NULL;
	f = hi3_ckpt_file_of(s->ck, t->name);
	slash = f ? strrchr(f, '/') : NULL;
	return slash ? slash + 1 : f;
}

static int is_int_dtype(hi3_dtype dt)
{
	return !hi3_dtype_is_float(dt);
}

/* ------------------------------------------------------------- summary */

static json_t *shape_json(int ndim, const int64_t *shape)
{
	json_t *a = json_array();

	for (int i = 0; i < ndim; i++)
		json_array_append_new(a, json_integer(shape[i]));
	return a;
}

static void fmt_stat(char *buf, size_t n, double v, int as_int)
{
	if (isnan(v))
		snprintf(buf, n, "-");
	else if (as_int && fabs(v) < 9007199254740992.0)
		snprintf(buf, n, "%.0f", v);
	else
		snprintf(buf, n, "%.6g", v);
}

static int summary(const struct src *s, const hi3_inspect_opts *o, FILE *f, hi3_error *err)
{
	hi3_stats *st = hi3i_calloc((size_t)s->n + 1, sizeof(*st), err);
	const char *format = src_meta(s, "format"), *version = src_meta(s, "format_version");
	int64_t total = 0;
	size_t bytes = 0;
	int wname = 4, wshape = 5, rc = -1;
	char sh[256];
	json_t *model = NULL;

	if (!st)
		return -1;
	for (int i = 0; i < s->n; i++) {
		if (hi3_tensor_stats(s->t[i], o->threads, &st[i], err) != 0)
			goto out;
		total += st[i].n;
		bytes += s->t[i]->nbytes;
		wname = HI3_MAX(wname, (int)strlen(s->t[i]->name));
		wshape = HI3_MAX(wshape, (int)strlen(hi3_shape_str(sh, sizeof(sh), s->t[i]->ndim, s->t[i]->shape)));
	}
	model = s->ck ? hi3i_inspect_model(s->path) : NULL;
	if (o->json) {
		json_t *root = json_object(), *md = json_object(), *ts = json_array();

		json_object_set_new(root, "file", json_string(s->path));
		json_object_set_new(root, "kind", json_string(s->ck ? "checkpoint" : "file"));
		if (s->ck)
			json_object_set(root, "model", model ? model : json_null());
		json_object_set_new(root, "format", format ? json_string(format) : json_null());
		json_object_set_new(root, "format_version", version ? json_string(version) : json_null());
		for (int i = 0; s->st && i < hi3_st_meta_count(s->st); i++) {
			const char *k, *v;
			hi3_st_meta_at(s->st, i, &k, &v);
			json_object_set_new(md, k, json_string(v));
		}
		json_object_set_new(root, "metadata", md);
		for (int i = 0; i < s->n; i++) {
			const hi3_tensor *t = s->t[i];
			int as_int = is_int_dtype(t->dtype);
			json_t *e = json_object();

			json_object_set_new(e, "name", json_string(t->name));
			json_object_set_new(e, "dtype", json_string(hi3_dtype_name(t->dtype)));
			json_object_set_new(e, "shape", shape_json(t->ndim, t->shape));
			json_object_set_new(e, "numel", json_integer(st[i].n));
			json_object_set_new(e, "bytes", json_integer((json_int_t)t->nbytes));
			json_object_set_new(e, "min", isnan(st[i].min) ? json_null() : hi3i_json_num(st[i].min, as_int));
			json_object_set_new(e, "max", isnan(st[i].max) ? json_null() : hi3i_json_num(st[i].max, as_int));
			json_object_set_new(e, "mean", isnan(st[i].mean) ? json_null() : hi3i_json_num(st[i].mean, 0));
			json_object_set_new(e, "nan", json_integer(st[i].n_nan));
			json_object_set_new(e, "inf", json_integer(st[i].n_inf));
			if (s->ck)
				json_object_set_new(e, "file", json_string(src_file_of(s, t)));
			json_array_append_new(ts, e);
		}
		json_object_set_new(root, "tensors", ts);
		json_object_set_new(root, "numel", json_integer(total));
		json_object_set_new(root, "bytes", json_integer((json_int_t)bytes));
		rc = hi3i_json_emit(f, root, JSON_INDENT(1), err);
		goto out;
	}
	fprintf(f, "file: %s\n", s->path);
	if (s->ck)
		fprintf(f, "format: checkpoint directory (%s)\n",
		        s->n ? "tensors from its safetensors shards" : "no tensors");
	if (model)
		hi3i_inspect_model_text(f, model);
	else if (format)
		fprintf(f, "format: %s (format_version %s)\n", format, version ? version : "none");
	else
		fprintf(f, "format: none (no \"format\" in __metadata__)\n");
	if (s->st && hi3_st_meta_count(s->st)) {
		fprintf(f, "metadata:\n");
		for (int i = 0; i < hi3_st_meta_count(s->st); i++) {
			const char *k, *v;
			size_t len;

			hi3_st_meta_at(s->st, i, &k, &v);
			len = strlen(v);
			if (len > 120 || strchr(v, '\n'))
				fprintf(f, "  %s: %.100s... (%zu bytes; --json shows it all)\n", k,
				        strchr(v, '\n') ? "(multi-line)" : v, len);
			else
				fprintf(f, "  %s: %s\n", k, v);
		}
	}
	fprintf(f, "tensors: %d, %lld elements, %zu bytes\n", s->n, (long long)total, bytes);
	if (s->n)
		fprintf(f, "%-*s  %-7s %-*s  %12s %12s %12s %8s %8s%s\n", wname, "name", "dtype", wshape, "shape", "min",
		        "max", "mean", "nan", "inf", s->ck ? "  file" : "");
	for (int i = 0; i < s->n; i++) {
		const hi3_tensor *t = s->t[i];
		char mn[32], mx[32], me[32];

		fmt_stat(mn, sizeof(mn), st[i].min, is_int_dtype(t->dtype));
		fmt_stat(mx, sizeof(mx), st[i].max, is_int_dtype(t->dtype));
		fmt_stat(me, sizeof(me), st[i].mean, 0);
		fprintf(f, "%-*s  %-7s %-*s  %12s %12s %12s %8lld %8lld%s%s\n", wname, t->name, hi3_dtype_name(t->dtype),
		        wshape, hi3_shape_str(sh, sizeof(sh), t->ndim, t->shape), mn, mx, me, (long long)st[i].n_nan,
		        (long long)st[i].n_inf, s->ck ? "  " : "", s->ck ? src_file_of(s, t) : "");
	}
	rc = 0;
out:
	json_decref(model);
	free(st);
	return rc;
}

/* -------------------------------------------------------------- values */

/* Element i (flat) of t, exactly, as text. */
static void fmt_elem(char *buf, size_t n, const hi3_tensor *t, int64_t i)
{
	const unsigned char *p = (const unsigned char *)t->data + (size_t)i * hi3_dtype_size(t->dtype);
	int64_t v;
	uint64_t u;

	switch (t->dtype) {
	case HI3_I64:
		memcpy(&v, p, 8);
		snprintf(buf, n, "%lld", (long long)v);
		return;
	case HI3_U64:
		memcpy(&u, p, 8);
		snprintf(buf, n, "%llu", (unsigned long long)u);
		return;
	case HI3_F64:
		snprintf(buf, n, "%.17g", hi3_elem_f64(t->data, t->dtype, (size_t)i));
		return;
	default:
		if (is_int_dtype(t->dtype))
			snprintf(buf, n, "%.0f", hi3_elem_f64(t->data, t->dtype, (size_t)i));
		else
			snprintf(buf, n, "%.9g", hi3_elem_f64(t->data, t->dtype, (size_t)i));
	}
}

static json_t *elem_json(const hi3_tensor *t, int64_t i)
{
	const unsigned char *p = (const unsigned char *)t->data + (size_t)i * hi3_dtype_size(t->dtype);
	int64_t v;

	if (t->dtype == HI3_I64) {
		memcpy(&v, p, 8);
		return json_integer(v);
	}
	return hi3i_json_num(hi3_elem_f64(t->data, t->dtype, (size_t)i), is_int_dtype(t->dtype));
}

/* The selection as text, e.g. "[1, 0, 3:7, :]": dimension d is shown as
 * its range when it is kept and bit d of ranges is set, else as src[d]. */
static void fmt_sel(char *buf, size_t n, const hi3i_slice *s, const int64_t *shape, const int64_t *src,
                    unsigned ranges)
{
	size_t off = 0;

	off += (size_t)snprintf(buf + off, n - off, "[");
	for (int d = 0; d < s->ndim && off < n; d++) {
		const char *sep = d ? ", " : "";
		int64_t stop = s->start[d] + s->count[d] * s->step[d];

		if (!s->keep[d] || !(ranges >> d & 1))
			off += (size_t)snprintf(buf + off, n - off, "%s%lld", sep, (long long)src[d]);
		else if (s->start[d] == 0 && s->count[d] == shape[d] && s->step[d] == 1)
			off += (size_t)snprintf(buf + off, n - off, "%s:", sep);
		else if (s->step[d] == 1)
			off += (size_t)snprintf(buf + off, n - off, "%s%lld:%lld", sep, (long long)s->start[d],
			                        (long long)stop);
		else
			off += (size_t)snprintf(buf + off, n - off, "%s%lld:%lld:%lld", sep, (long long)s->start[d],
			                        (long long)HI3_MIN(stop, shape[d]), (long long)s->step[d]);
	}
	if (off < n)
		snprintf(buf + off, n - off, "]");
}

/* Nested JSON arrays over the kept dimensions from kept dimension k on. */
static json_t *values_json(const hi3_tensor *t, const hi3i_slice *s, const int64_t *oshape, int ondim, int k,
                           int64_t *pos)
{
	json_t *a;
	int64_t src[HI3_MAX_DIMS];

	if (k == ondim) {
		hi3i_slice_src(s, *pos, src);
		(*pos)++;
		return elem_json(t, hi3i_flat(t->ndim, t->shape, src));
	}
	a = json_array();
	for (int64_t i = 0; i < oshape[k]; i++)
		json_array_append_new(a, values_json(t, s, oshape, ondim, k + 1, pos));
	return a;
}

static int values(const struct src *src, const hi3_tensor *t, const hi3i_slice *s, const hi3_inspect_opts *o,
                  FILE *f, hi3_error *err)
{
	int64_t oshape[HI3_MAX_DIMS], n = hi3i_slice_numel(s), idx[HI3_MAX_DIMS];
	int ondim = hi3i_slice_shape(s, oshape), last = -1;
	char sh[256], osh[256], sel[512], v[64];

	for (int d = 0; d < s->ndim; d++)
		if (s->keep[d])
			last = d;
	hi3_shape_str(sh, sizeof(sh), t->ndim, t->shape);
	hi3_shape_str(osh, sizeof(osh), ondim, oshape);
	if (o->json) {
		json_t *root = json_object();
		int64_t pos = 0;

		json_object_set_new(root, "file", json_string(src->path));
		json_object_set_new(root, "tensor", json_string(t->name));
		json_object_set_new(root, "dtype", json_string(hi3_dtype_name(t->dtype)));
		json_object_set_new(root, "shape", shape_json(t->ndim, t->shape));
		json_object_set_new(root, "slice", json_string(o->slice ? o->slice : ""));
		json_object_set_new(root, "values_shape", shape_json(ondim, oshape));
		json_object_set_new(root, "values", values_json(t, s, oshape, ondim, 0, &pos));
		/* 9 significant digits give back every f32/f16/bf16 value */
		return hi3i_json_emit(f, root, JSON_COMPACT | JSON_REAL_PRECISION(t->dtype == HI3_F64 ? 17 : 9), err);
	}
	hi3i_slice_src(s, 0, idx);
	fmt_sel(sel, sizeof(sel), s, t->shape, idx, ~0u);
	fprintf(f, "%s %s %s %s -> %s\n", t->name, hi3_dtype_name(t->dtype), sh, sel, osh);
	if (n == 0)
		return 0;
	if (ondim == 0) {
		fmt_elem(v, sizeof(v), t, hi3i_flat(t->ndim, t->shape, idx));
		fprintf(f, "%s\n", v);
		return 0;
	}
	/* one line per run along the last kept dimension */
	int64_t run = oshape[ondim - 1];
	for (int64_t i = 0; i < n; i += run) {
		hi3i_slice_src(s, i, idx);
		if (ondim > 1) {
			fmt_sel(sel, sizeof(sel), s, t->shape, idx, 1u << last);
			fprintf(f, "%s ", sel);
		}
		for (int64_t j = 0; j < run; j++) {
			hi3i_slice_src(s, i + j, idx);
			fmt_elem(v, sizeof(v), t, hi3i_flat(t->ndim, t->shape, idx));
			fprintf(f, "%s%s", j ? " " : "", v);
		}
		fputc('\n', f);
	}
	return 0;
}

/* ---------------------------------------------------------------- PNG */

struct picture {
	const char *kind;         /* "heatmap", "attention-mask", "kv-slots" */
	int64_t rows, cols;
	uint8_t *rgb;             /* (rows, cols, 3) */
	double lo, hi;            /* heatmap scale */
	int diverging;
};

static int picture_alloc(struct picture *p, int64_t rows, int64_t cols, hi3_error *err)
{
	if (rows < 1 || cols < 1 || rows > (1 << 20) || cols > (1 << 20))
		return hi3_error_set(err, HI3_ERR_USAGE, "cannot render a %lld x %lld picture (each side must be 1 to %d)",
		                     (long long)rows, (long long)cols, 1 << 20);
	p->rows = rows;
	p->cols = cols;
	p->rgb = hi3i_malloc((size_t)rows * (size_t)cols * 3, err);
	return p->rgb ? 0 : -1;
}

static void put(struct picture *p, int64_t r, int64_t c, uint8_t R, uint8_t G, uint8_t B)
{
	uint8_t *o = p->rgb + ((size_t)r * (size_t)p->cols + (size_t)c) * 3;

	o[0] = R, o[1] = G, o[2] = B;
}

/* A 2-D selection of a tensor as a heatmap. */
static int heatmap(const hi3_tensor *t, const hi3i_slice *s, struct picture *p, hi3_error *err)
{
	int64_t oshape[HI3_MAX_DIMS], n = hi3i_slice_numel(s), idx[HI3_MAX_DIMS];
	int ondim = hi3i_slice_shape(s, oshape);
	double *v, lo = INFINITY, hi = -INFINITY;
	char sh[256];

	if (ondim != 2)
		return hi3_error_set(err, HI3_ERR_USAGE,
		                     "--png: tensor '%s': the selection has shape %s; it must be 2-D (use --slice)",
		                     t->name, hi3_shape_str(sh, sizeof(sh), ondim, oshape));
	if (picture_alloc(p, oshape[0], oshape[1], err) != 0)
		return -1;
	v = hi3i_malloc((size_t)n * sizeof(double), err);
	if (!v)
		return -1;
	for (int64_t i = 0; i < n; i++) {
		hi3i_slice_src(s, i, idx);
		v[i] = hi3_elem_f64(t->data, t->dtype, (size_t)hi3i_flat(t->ndim, t->shape, idx));
		if (isfinite(v[i])) {
			lo = fmin(lo, v[i]);
			hi = fmax(hi, v[i]);
		}
	}
	if (lo > hi)
		lo = hi = 0;
	p->kind = "heatmap";
	p->lo = lo;
	p->hi = hi;
	p->diverging = lo < 0;
	hi3i_colormap(v, n, lo, hi, p->diverging, p->rgb);
	free(v);
	return 0;
}

/* Row `row` of a conditions file: query x key over the L columns. Key j is
 * admitted for query q when j <= q or both lie in one image block. */
static int cond_mask(const struct src *src, int64_t row, struct picture *p, hi3_error *err)
{
	const hi3_tensor *ids, *rp, *blk;
	int64_t B, L, S, n;
	const int32_t *bl;                             // (B, S, 2)

	if (hi3_st_get(src->st, "input_ids", HI3_I64, 2, (const int64_t[]){-1, -1}, &ids, err) != 0)
		return -1;
	B = ids->shape[0];
	L = ids->shape[1];
	if (hi3_st_get(src->st, "real_pos", HI3_I64, 1, (const int64_t[]){B}, &rp, err) != 0 ||
	    hi3_st_get(src->st, "image_blocks", HI3_I32, 3, (const int64_t[]){B, -1, 2}, &blk, err) != 0)
		return -1;
	if (row < 0 || row >= B)
		return hi3_error_set(err, HI3_ERR_USAGE, "--row %lld: %s has rows 0 to %lld", (long long)row, src->path,
		                     (long long)B - 1);
	S = blk->shape[1];
	bl = (const int32_t *)blk->data + row * S * 2;
	n = (int64_t)hi3_elem_f64(rp->data, HI3_I64, (size_t)row);
	if (n < 0 || n > L)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'real_pos': row %lld: %lld is outside [0, %lld]",
		                     src->path, (long long)row, (long long)n, (long long)L);
	for (int64_t b = 0; b < S; b++)
		if (bl[2 * b] < 0 || bl[2 * b + 1] < bl[2 * b] || bl[2 * b + 1] > L)
			return hi3_error_set(err, HI3_ERR_INPUT,
			                     "%s: tensor 'image_blocks': row %lld block %lld: [%d, %d) is not inside [0, %lld]",
			                     src->path, (long long)row, (long long)b, bl[2 * b], bl[2 * b + 1], (long long)L);
	if (picture_alloc(p, L, L, err) != 0)
		return -1;
	p->kind = "attention-mask";
	for (int64_t q = 0; q < L; q++) {
		for (int64_t j = 0; j < L; j++) {
			int causal = j <= q, block = 0, pad = q >= n || j >= n;

			for (int64_t b = 0; b < S && !block; b++)
				block = bl[2 * b] <= q && q < bl[2 * b + 1] && bl[2 * b] <= j && j < bl[2 * b + 1];
			if (pad)
				(causal || block) ? put(p, q, j, 190, 140, 80) : put(p, q, j, 70, 45, 25);
			else if (causal)
				put(p, q, j, 240, 240, 240);
			else if (block)
				put(p, q, j, 80, 150, 240);
			else
				put(p, q, j, 25, 25, 25);
		}
	}
	return 0;
}

/* A kv file's rows x C slots: slot < kv_len[row] is valid; the last
 * gen_len[row] valid slots were written by decode. */
static int kv_slots(const struct src *src, struct picture *p, hi3_error *err)
{
	const hi3_tensor *kl, *gl = hi3_st_find(src->st, "gen_len"), *k0 = hi3_st_find(src->st, "k.0");
	const char *cs = hi3_st_meta(src->st, "C"), *ls = hi3_st_meta(src->st, "L");
	int64_t B, C = -1, L = -1;

	if (hi3_st_get(src->st, "kv_len", HI3_I64, 1, (const int64_t[]){-1}, &kl, err) != 0)
		return -1;
	B = kl->shape[0];
	if (k0 && k0->ndim == 4)
		C = k0->shape[2];
	else if (!cs || hi3i_parse_i64(cs, 1, INT32_MAX, &C) != 0)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: no tensor 'k.0' and no metadata C: the slot count is unknown",
		                     src->path);
	if (ls && hi3i_parse_i64(ls, 0, C, &L) != 0)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: metadata L '%s' is not an integer in [0, %lld]", src->path,
		                     ls, (long long)C);
	if (gl && (gl->dtype != HI3_I64 || gl->ndim != 1 || gl->shape[0] != B))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'gen_len': expected I64 (%lld,)", src->path,
		                     (long long)B);
	if (picture_alloc(p, B, C, err) != 0)
		return -1;
	p->kind = "kv-slots";
	for (int64_t r = 0; r < B; r++) {
		int64_t len = (int64_t)hi3_elem_f64(kl->data, HI3_I64, (size_t)r);
		int64_t gen = gl ? (int64_t)hi3_elem_f64(gl->data, HI3_I64, (size_t)r) : 0;

		if (len < 0 || len > C)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'kv_len': row %lld: %lld is outside [0, %lld]",
			                     src->path, (long long)r, (long long)len, (long long)C);
		if (gen < 0 || gen > len)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'gen_len': row %lld: %lld is outside [0, %lld]",
			                     src->path, (long long)r, (long long)gen, (long long)len);
		for (int64_t c = 0; c < C; c++) {
			if (c < len - gen)
				put(p, r, c, 240, 240, 240);
			else if (c < len)
				put(p, r, c, 90, 200, 90);
			else if (c < L)
				put(p, r, c, 150, 100, 60);
			else
				put(p, r, c, 25, 25, 25);
		}
	}
	return 0;
}

/* A trajectory's request `row`: its latents at every step side by side, x_T
 * first, each h x w cell the mean over the channels, one scale for all,
 * one dark column between steps. */
static int traj_steps(const struct src *src, int64_t row, struct picture *p, hi3_error *err)
{
	const hi3_tensor *lat = hi3_st_find(src->st, "latents");
	int64_t B, S, C, h, w, n;
	double *v, m = 0.0;

	if (!lat || lat->ndim != 5)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: no tensor 'latents' (B, T + 1, C, h, w)", src->path);
	B = lat->shape[0], S = lat->shape[1], C = lat->shape[2], h = lat->shape[3], w = lat->shape[4];
	if (row >= B)
		return hi3_error_set(err, HI3_ERR_USAGE, "--row %lld: %s has requests 0 to %lld", (long long)row, src->path,
		                     (long long)B - 1);
	if (C < 1 || picture_alloc(p, h, S * (w + 1) - 1, err) != 0)
		return C < 1 ? hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'latents' has no channels", src->path) : -1;
	n = p->rows * p->cols;
	if (!(v = hi3i_malloc(sizeof(double) * (size_t)n, err)))
		return -1;
	for (int64_t i = 0; i < n; i++)
		v[i] = NAN;
	for (int64_t st = 0; st < S; st++)
		for (int64_t y = 0; y < h; y++)
			for (int64_t x = 0; x < w; x++) {
				double sum = 0.0;
				for (int64_t c = 0; c < C; c++)
					sum += hi3_elem_f64(lat->data, lat->dtype, (size_t)((((row * S + st) * C + c) * h + y) * w + x));
				sum /= (double)C;
				v[y * p->cols + st * (w + 1) + x] = sum;
				if (isfinite(sum))
					m = fmax(m, fabs(sum));
			}
	p->kind = "trajectory-steps";
	p->lo = -m;
	p->hi = m;
	p->diverging = 1;
	hi3i_colormap(v, n, -m, m, 1, p->rgb);
	for (int64_t y = 0; y < h; y++)
		for (int64_t st = 1; st < S; st++)
			put(p, y, st * (w + 1) - 1, 25, 25, 25);
	free(v);
	return 0;
}

static int render(const struct src *src, const hi3_tensor *t, const hi3i_slice *s, const hi3_inspect_opts *o,
                  FILE *f, hi3_error *err)
{
	struct picture p = {0};
	const char *format = src_meta(src, "format");
	uint8_t *big = NULL;
	int scale, rc = -1;

	if (t)
		rc = heatmap(t, s, &p, err);
	else if (format && !strcmp(format, HI3_FORMAT_CONDITIONS) && o->row >= 0)
		rc = cond_mask(src, o->row, &p, err);
	else if (format && !strcmp(format, HI3_FORMAT_CONDITIONS))
		rc = hi3_error_set(err, HI3_ERR_USAGE, "--png on a conditions file needs --row I (or --tensor NAME)");
	else if (format && !strcmp(format, HI3_FORMAT_KV))
		rc = kv_slots(src, &p, err);
	else if (format && !strcmp(format, HI3_FORMAT_TRAJECTORY))
		rc = traj_steps(src, o->row >= 0 ? o->row : 0, &p, err);
	else
		rc = hi3_error_set(err, HI3_ERR_USAGE,
		                   "--png needs --tensor NAME: %s is not a conditions, kv or trajectory file (format '%s')",
		                   src->path, format ? format : "none");
	if (rc != 0)
		goto out;
	rc = -1;
	scale = o->scale > 0 ? o->scale : hi3i_auto_scale(p.rows, p.cols);
	if (p.rows * scale > (1 << 20) || p.cols * scale > (1 << 20)) {
		hi3_error_set(err, HI3_ERR_USAGE, "--png: %lld x %lld cells at scale %d is too large", (long long)p.rows,
		              (long long)p.cols, scale);
		goto out;
	}
	big = hi3i_upscale(p.rgb, (int)p.rows, (int)p.cols, scale, err);
	if (!big || hi3_png_write_rgb(o->png, (int)(p.cols * scale), (int)(p.rows * scale), big, err) != 0)
		goto out;
	if (!strcmp(o->png, "-")) {
		rc = 0;                            /* standard output holds the picture */
		goto out;
	}
	if (o->json) {
		json_t *root = json_object();

		json_object_set_new(root, "png", json_string(o->png));
		json_object_set_new(root, "kind", json_string(p.kind));
		json_object_set_new(root, "width", json_integer(p.cols * scale));
		json_object_set_new(root, "height", json_integer(p.rows * scale));
		json_object_set_new(root, "rows", json_integer(p.rows));
		json_object_set_new(root, "cols", json_integer(p.cols));
		json_object_set_new(root, "scale", json_integer(scale));
		if (t) {
			json_object_set_new(root, "min", hi3i_json_num(p.lo, 0));
			json_object_set_new(root, "max", hi3i_json_num(p.hi, 0));
			json_object_set_new(root, "colormap", json_string(p.diverging ? "diverging" : "sequential"));
		}
		if (hi3i_json_emit(f, root, JSON_COMPACT, err) != 0)
			goto out;
	} else {
		fprintf(f, "%s: %s, %lld x %lld pixels (%lld x %lld cells of %d x %d)", o->png, p.kind,
		        (long long)(p.cols * scale), (long long)(p.rows * scale), (long long)p.rows, (long long)p.cols,
		        scale, scale);
		if (t)
			fprintf(f, ", %s colours over [%.6g, %.6g]", p.diverging ? "diverging" : "sequential",
			        p.diverging ? -fmax(fabs(p.lo), fabs(p.hi)) : p.lo,
			        p.diverging ? fmax(fabs(p.lo), fabs(p.hi)) : p.hi);
		fputc('\n', f);
	}
	rc = 0;
out:
	free(p.rgb);
	free(big);
	return rc;
}

/* ----------------------------------------------------------------- main */

/* A file (not a directory, a FIFO or a device: those go to the picture
 * reader only when they are not safetensors either, which it refuses by
 * name) whose first bytes are a picture's. */
static int is_picture(const char *path)
{
	uint8_t head[16];
	struct stat st;
	size_t n;
	FILE *f;

	if (stat(path, &st) || S_ISDIR(st.st_mode))
		return 0;
	if (!S_ISREG(st.st_mode))
		return 1;                       /* never opened for reading here: the picture reader refuses it */
	if (!(f = fopen(path, "rb")))
		return 0;
	n = fread(head, 1, sizeof(head), f);
	fclose(f);
	return hi3_image_sniff(head, n) != NULL;
}

int hi3_inspect(const char *path, const hi3_inspect_opts *o, char **report, size_t *len, hi3_error *err)
{
	struct src src;
	const hi3_tensor *t = NULL;
	hi3i_slice s;
	char *buf = NULL;
	size_t blen = 0;
	FILE *f = NULL;
	int rc = -1;

	*report = NULL;
	if (len)
		*len = 0;
	if (is_picture(path)) {
		if (!(f = open_memstream(&buf, &blen)))
			return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		rc = hi3i_inspect_picture(path, o, f, err);
		if (fclose(f) != 0 && rc == 0)
			rc = hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		if (rc == 0) {
			*report = buf;
			if (len)
				*len = blen;
		} else {
			free(buf);
		}
		return rc;
	}
	if (o->slice && !o->tensor)
		return hi3_error_set(err, HI3_ERR_USAGE, "--slice needs --tensor NAME");
	if (o->row >= 0 && (!o->png || o->tensor))
		return hi3_error_set(err, HI3_ERR_USAGE, "--row I renders a conditions row's mask: use it with --png "
		                     "and without --tensor");
	if (src_open(&src, path, err) != 0)
		return -1;
	if (o->tensor) {
		t = src_find(&src, o->tensor);
		if (!t) {
			hi3_error_set(err, HI3_ERR_USAGE, "%s: no tensor '%s' (see 'hi3 inspect %s')", path, o->tensor, path);
			goto out;
		}
		if (hi3i_slice_parse(&s, o->slice, t->ndim, t->shape, err) != 0) {
			hi3_error_prefix(err, "tensor '%s' %s", t->name,
			                 hi3_shape_str((char[256]){0}, 256, t->ndim, t->shape));
			goto out;
		}
	}
	f = open_memstream(&buf, &blen);
	if (!f) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	if (o->png)
		rc = render(&src, t, &s, o, f, err);
	else if (t)
		rc = values(&src, t, &s, o, f, err);
	else
		rc = summary(&src, o, f, err);
	if (fclose(f) != 0 && rc == 0)
		rc = hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	f = NULL;
	if (rc == 0) {
		*report = buf;
		if (len)
			*len = blen;
		buf = NULL;
	}
out:
	free(buf);
	src_close(&src);
	return rc;
}
