/*
 * codec.c -- one reader and one writer for every stage file format, driven
 * by the format's table (format.h): its tensors with their dtypes and
 * shapes in letters, and its metadata keys with their types. The format
 * modules add only what a table cannot say (a sequence that must increase,
 * a value that must lie in a range); hi3-files(5) documents each table,
 * and test-formats checks that it documents every name.
 */
#include <stdint.h>
#include <string.h>
#include "format/format.h"

#define MAX_TERMS HI3_MAX_DIMS

/* The letters of a shape: "B,T+1,C" gives letter indices and offsets. */
struct shape {
	int n;
	int dim[MAX_TERMS];           /* index into the format's letters; -1 a number */
	int64_t add[MAX_TERMS];       /* the term is letter + add, or the number add */
};

static int letter_index(const struct hi3i_format *f, const char *s, size_t len)
{
	for (int i = 0; f->dims[i]; i++)
		if (strlen(f->dims[i]) == len && !strncmp(f->dims[i], s, len))
			return i;
	return -1;
}

/* Parse a table's shape; a table that does not parse is a programming error. */
static void parse_shape(const struct hi3i_format *f, const char *spec, struct shape *sh)
{
	const char *p = spec;

	sh->n = 0;
	while (*p) {
		const char *e = p + strcspn(p, ",");
		const char *plus = memchr(p, '+', (size_t)(e - p));
		HI3_ASSERT(sh->n < MAX_TERMS);
		if (*p >= '0' && *p <= '9') {
			sh->dim[sh->n] = -1;
			sh->add[sh->n] = strtoll(p, NULL, 10);
		} else {
			sh->dim[sh->n] = letter_index(f, p, (size_t)((plus ? plus : e) - p));
			sh->add[sh->n] = plus ? strtoll(plus + 1, NULL, 10) : 0;
			HI3_ASSERT(sh->dim[sh->n] >= 0);
		}
		sh->n++;
		p = *e ? e + 1 : e;
	}
}

/* The shape with the letters known so far (-1 for the others). */
static void resolve(const struct shape *sh, const int64_t *dims, int64_t *out)
{
	for (int d = 0; d < sh->n; d++)
		out[d] = sh->dim[d] < 0 ? sh->add[d] : dims[sh->dim[d]] < 0 ? -1 : dims[sh->dim[d]] + sh->add[d];
}

static int dtype_ok(const char *list, hi3_dtype dt)
{
	const char *name = hi3_dtype_name(dt);
	size_t n = strlen(name);

	for (const char *p = list; *p; p += strcspn(p, " "), p += *p == ' ') {
		if (strcspn(p, " ") == n && !strncmp(p, name, n))
			return 1;
	}
	return 0;
}

/* The first dtype of a list: what a writer writes unless told. */
static hi3_dtype first_dtype(const char *list)
{
	char name[16];
	size_t n = strcspn(list, " ");
	hi3_dtype dt;

	HI3_ASSERT(n < sizeof(name));
	memcpy(name, list, n);
	name[n] = 0;
	HI3_ASSERT(hi3_dtype_parse(name, &dt) == 0);
	return dt;
}

/* "F32 or BF16" of a list "F32 BF16". */
static const char *dtype_words(const char *list, char *buf, size_t len)
{
	size_t o = 0;

	for (const char *p = list; *p && o < len;) {
		size_t n = strcspn(p, " ");
		const char *next = p + n + (p[n] == ' ');
		o += (size_t)snprintf(buf + o, len - o, "%s%.*s", o ? (*next ? ", " : " or ") : "", (int)n, p);
		p = next;
	}
	return buf;
}

/* The field at byte offset off of obj, copied as bytes (the fields are
 * pointers of their own types, hi3_dtype, const char *). */
static void put(void *obj, int off, const void *v, size_t n)
{
	memcpy((char *)obj + off, v, n);
}

static void get(const void *obj, int off, void *v, size_t n)
{
	memcpy(v, (const char *)obj + off, n);
}

const struct hi3i_format *const hi3i_formats[] = {
	&hi3i_format_conditions, &hi3i_format_kv, &hi3i_format_segment, &hi3i_format_replay, &hi3i_format_replay_sde,
	&hi3i_format_trace, &hi3i_format_trajectory, &hi3i_format_diffusion_checkpoint, &hi3i_format_noise, NULL,
};

const char hi3i_codec_zeros[1];

/* A per-layer name ("k.l", "layer.l.in"): the l between dots, or last. */
static const char *layer_part(const char *name)
{
	const char *p = strstr(name, ".l");

	for (; p; p = strstr(p + 1, ".l"))
		if (p[2] == 0 || p[2] == '.')
			return p + 1;
	return NULL;
}

/* The tensor's name for layer l into buf (the name itself when not per layer). */
static const char *layer_name(const char *name, int l, char *buf, size_t n)
{
	const char *p = layer_part(name);

	if (!p)
		return name;
	snprintf(buf, n, "%.*s%d%s", (int)(p - name), name, l, p + 1);
	return buf;
}

/* The tensor called name, checked against t: one of its dtypes (dt >= 0:
 * that one), its shape with the letters known so far; then the letters it
 * binds. */
static int get_named(const struct hi3i_format *f, const hi3_st *st, const struct hi3i_ftensor *t, const char *name,
                     int dt, int64_t *dims, const hi3_tensor **out, hi3_error *err)
{
	const hi3_tensor *x = hi3_st_find(st, name);
	struct shape sh;
	int64_t want[MAX_TERMS];
	char words[64];

	*out = NULL;
	parse_shape(f, t->shape, &sh);
	resolve(&sh, dims, want);
	if (x && dt < 0 && strchr(t->dtype, ' ') && !dtype_ok(t->dtype, x->dtype))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s': dtype %s, expected %s", hi3_st_path(st), name,
		                     hi3_dtype_name(x->dtype), dtype_words(t->dtype, words, sizeof(words)));
	if (dt < 0)
		dt = x ? (int)x->dtype : (int)first_dtype(t->dtype);
	if (hi3_st_get(st, name, dt, sh.n, want, out, err))
		return -1;
	if ((uintptr_t)(*out)->data % hi3_dtype_size((*out)->dtype))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s': data is not aligned to %zu bytes",
		                     hi3_st_path(st), name, hi3_dtype_size((*out)->dtype));
	for (int d = 0; d < sh.n; d++)
		if (sh.dim[d] >= 0 && dims[sh.dim[d]] < 0)
			dims[sh.dim[d]] = (*out)->shape[d] - sh.add[d];
	return 0;
}

int hi3i_codec_get(const struct hi3i_format *f, const hi3_st *st, const struct hi3i_ftensor *t, int64_t *dims,
                   const hi3_tensor **out, hi3_error *err)
{
	return get_named(f, st, t, t->name, -1, dims, out, err);
}

/* A metadata value of its type; the error names the file and the key. */
static int check_meta(const struct hi3i_fmeta *m, const char *path, const char *v, hi3_error *err)
{
	int64_t i;
	double x;

	if (!v)
		return m->required ? hi3_error_set(err, HI3_ERR_INPUT, "%s: __metadata__ '%s' is missing", path, m->key)
		                   : 0;
	if (!strcmp(m->type, "int") && hi3i_parse_i64(v, INT64_MIN, INT64_MAX, &i) != 0)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: __metadata__ '%s': expected an integer, found '%s'", path,
		                     m->key, v);
	if (!strcmp(m->type, "number") && hi3i_parse_f64(v, &x) != 0)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: __metadata__ '%s': expected a number, found '%s'", path,
		                     m->key, v);
	if (strchr(m->type, '|')) {
		size_t n = strlen(v);
		for (const char *p = m->type; *p; p += strcspn(p, "|"), p += *p == '|')
			if (strcspn(p, "|") == n && !strncmp(p, v, n))
				return 0;
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: __metadata__ '%s': expected one of %s, found '%s'", path,
		                     m->key, m->type, v);
	}
	return 0;
}

int hi3i_codec_read(const struct hi3i_format *f, const hi3_st *st, void *obj, int64_t *dims, hi3_error *err)
{
	const char *path = hi3_st_path(st);
	signed char present[16];          /* by group: -1 undecided, 0 absent, 1 present */
	const int layers = letter_index(f, "layers", 6);
	char name[64];

	memset(present, -1, sizeof(present));
	for (const struct hi3i_ftensor *t = f->t; t->name; t++) {
		const int per_layer = layer_part(t->name) != NULL;
		void **arr = NULL;
		int nl = 1, dt = -1;

		if (t->group < 0)
			continue;
		HI3_ASSERT(t->group < (int)sizeof(present) && (!per_layer || (layers >= 0 && dims[layers] >= 0)));
		if (per_layer)
			nl = (int)dims[layers];
		if (t->group && present[t->group] < 0)
			present[t->group] = hi3_st_find(st, layer_name(t->name, 0, name, sizeof(name))) != NULL;
		if (t->group && !present[t->group])
			continue;
		if (per_layer && t->field >= 0)
			get(obj, t->field, &arr, sizeof(arr));
		for (int l = 0; l < nl; l++) {
			const hi3_tensor *x;
			/* the tensors of one dtype field share the dtype of the first */
			if (t->dtype_field >= 0 && (l > 0 || (t > f->t && t[-1].dtype_field == t->dtype_field))) {
				hi3_dtype fdt;
				get(obj, t->dtype_field, &fdt, sizeof(fdt));
				dt = (int)fdt;
			}
			if (get_named(f, st, t, layer_name(t->name, l, name, sizeof(name)), dt, dims, &x, err) != 0)
				return -1;
			if (per_layer && arr)
				arr[l] = x->data;
			else if (!per_layer && t->field >= 0)
				put(obj, t->field, &x->data, sizeof(x->data));
			if (t->dtype_field >= 0)
				put(obj, t->dtype_field, &x->dtype, sizeof(x->dtype));
		}
	}
	for (const struct hi3i_fmeta *m = f->m; m->key; m++) {
		const char *v = hi3_st_meta(st, m->key);
		if (check_meta(m, path, v, err) != 0)
			return -1;
		if (m->field >= 0)
			put(obj, m->field, &v, sizeof(v));
	}
	return 0;
}

int hi3i_codec_open(const struct hi3i_format *f, const char *path, int flags, void *obj, int64_t *dims, hi3_st **st,
                    hi3_error *err)
{
	if (hi3_st_open(st, path, flags, err) != 0 || (f->name && hi3_st_expect_format(*st, f->name, err) != 0))
		return -1;
	return hi3i_codec_read(f, *st, obj, dims, err);
}

const struct hi3i_fmeta *hi3i_codec_meta(const struct hi3i_format *f, const char *key)
{
	for (const struct hi3i_fmeta *m = f->m; m->key; m++)
		if (!strcmp(m->key, key))
			return m;
	return NULL;
}

hi3_st_writer *hi3i_codec_writer(const struct hi3i_format *f, const void *obj, const int64_t *dims,
                                 const char *const (*meta)[2], size_t n_meta, const char *path, hi3_error *err)
{
	hi3_st_writer *w;

	for (size_t i = 0; i < n_meta && !f->open_meta; i++)
		if (meta[i][1] && !hi3i_codec_meta(f, meta[i][0])) {
			hi3_error_set(err, HI3_ERR_USAGE, "%s: '%s' is not a metadata key of %s (hi3-files(5))", path,
			              meta[i][0], f->name);
			return NULL;
		}
	if (!(w = hi3i_stw_format(f->name, meta, n_meta)))
		goto oom;
	if (f->in_place)
		hi3i_stw_in_place(w);
	for (const struct hi3i_ftensor *t = f->t; t->name; t++) {
		const struct hi3i_ftensor *run = t;
		const int layers = letter_index(f, "layers", 6);
		int nl = 1;

		if (t->group == HI3I_FT_MODULE)
			continue;
		/* a run of per-layer tensors goes layer by layer: k.0, v.0, k.1, ... */
		while (layer_part(run->name) && run[1].name && layer_part(run[1].name))
			run++;
		if (layer_part(t->name)) {
			HI3_ASSERT(layers >= 0);
			nl = (int)dims[layers];
		}
		for (int l = 0; l < nl; l++)
			for (const struct hi3i_ftensor *u = t; u <= run; u++) {
				const void *data = NULL;
				void **arr = NULL;
				hi3_dtype dt;
				struct shape sh;
				int64_t shape[MAX_TERMS];
				char name[64];

				if (layer_part(u->name) && u->field >= 0) {
					get(obj, u->field, &arr, sizeof(arr));
					data = arr ? arr[l] : NULL;
				} else if (u->field >= 0) {
					get(obj, u->field, &data, sizeof(data));
				}
				if (!data && u->group)
					continue;
				if (data == hi3i_codec_zeros)
					data = NULL;
				if (u->dtype_field >= 0)
					get(obj, u->dtype_field, &dt, sizeof(dt));
				else
					dt = first_dtype(u->dtype);
				parse_shape(f, u->shape, &sh);
				resolve(&sh, dims, shape);
				HI3_ASSERT(dtype_ok(u->dtype, dt));
				if (hi3_stw_add(w, layer_name(u->name, l, name, sizeof(name)), dt, sh.n, shape, data))
					goto oom;
			}
		t = run;
	}
	return w;
oom:
	hi3_stw_free(w);
	hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	return NULL;
}

int hi3i_codec_write(const struct hi3i_format *f, const void *obj, const int64_t *dims, const char *const (*meta)[2],
                     size_t n_meta, const char *path, hi3_error *err)
{
	hi3_st_writer *w = hi3i_codec_writer(f, obj, dims, meta, n_meta, path, err);
	int rc;

	if (!w)
		return -1;
	rc = hi3_stw_write(w, path, err);
	hi3_stw_free(w);
	return rc;
}
