/*
 * safetensors.c -- safetensors files: a validating, memory-mapping reader
 * (hi3_st_*) and an atomic writer (hi3_stw_*). Checkpoints, one file or
 * shards, are checkpoint.c's.
 *
 * The format, byte by byte:
 *   [0, 8)          u64 little endian N: the header size in bytes
 *   [8, 8 + N)      JSON object, UTF-8: { "__metadata__": {str: str},
 *                   name: {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ... }
 *                   hi3 pads it with spaces so that 8 + N is a multiple of 64
 *   [8 + N, end)    the data area; tensor bytes [b, e) are relative to its
 *                   start, little endian, row major. The spans tile the data
 *                   area exactly: sorted by b they start at 0, each begins
 *                   where the previous ends, and the last ends at the file end.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "format/format.h"

#define MAX_HEADER (256u << 20)   /* refuse headers above 256 MiB */

struct hi3_st {
	char *path;
	int fd;                   /* -1 when read from stdin */
	unsigned char *map;       /* the whole file */
	size_t size;
	int mapped;               /* map came from mmap (else malloc) */
	size_t header_size;       /* N */
	int n;
	hi3_tensor *t;            /* file (offset) order */
	int *by_name;             /* indices sorted by name */
	int n_meta;
	char **meta_key, **meta_val;
};

static int name_cmp_ctx_st_sort(const void *a, const void *b, void *ctx)
{
	const hi3_tensor *t = ctx;

	return strcmp(t[*(const int *)a].name, t[*(const int *)b].name);
}

static int offset_cmp(const void *a, const void *b)
{
	const hi3_tensor *x = a, *y = b;
	uintptr_t px = (uintptr_t)x->data, py = (uintptr_t)y->data;

	if (px != py)
		return px < py ? -1 : 1;
	return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static int read_stdin(hi3_st *st, hi3_error *err)
{
	char *buf;
	size_t len;

	if (hi3i_read_file("-", &buf, &len, err) != 0)
		return -1;
	st->map = (unsigned char *)buf;
	st->size = len;
	st->mapped = 0;
	return 0;
}

/* A map of a file hi3 updates in place (opened read-write: the KV file,
 * the diffusion checkpoint), kept in pages as its writer made it
 * (hi3_stw_write): no read-around on a fault, which would cache the pages
 * about it, the holes a decode has yet to fill among them, in folios up to
 * 2 MiB, each then written back whole when a step commits a few bytes of
 * it (measured: 3.7 GB for 100 steps of 3 rows on `small`, where 123 MB
 * do). What the file holds already (its data, not its holes) is read
 * ahead at once instead, in pages: faulted in a page at a time, a cold
 * KV file made the same 100 steps 0.4 s slower. Advice only. */
static void advise_in_place(hi3_st *st)
{
	const off_t size = (off_t)st->size, chunk = (off_t)HI3_HUGE_PAGE;
	off_t d, h = 0;

	(void)madvise(st->map, st->size, MADV_RANDOM);
	while (h < size && (d = lseek(st->fd, h, SEEK_DATA)) >= 0 && d < size) {
		if ((h = lseek(st->fd, d, SEEK_HOLE)) < 0 || h > size)
			h = size;
		/* a read ahead is cut to the device's window: ask a chunk at a time */
		for (off_t o = d; o < h; o += chunk)
			(void)posix_fadvise(st->fd, o, HI3_MIN(chunk, h - o), POSIX_FADV_WILLNEED);
	}
}

static int map_file(hi3_st *st, int flags, hi3_error *err)
{
	struct stat sb;
	int wr = flags & HI3_ST_RDWR;

	st->fd = open(st->path, wr ? O_RDWR : O_RDONLY);
	if (st->fd < 0)
		return hi3_error_set(err, errno == ENOENT ? HI3_ERR_INPUT : HI3_ERR_RUNTIME,
		                     "%s: cannot open: %s", st->path, strerror(errno));
	if (fstat(st->fd, &sb) != 0)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot stat: %s", st->path, strerror(errno));
	if (!S_ISREG(sb.st_mode))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: not a regular file", st->path);
	st->size = (size_t)sb.st_size;
	if (st->size < 8)
		return hi3_error_set(err, HI3_ERR_INPUT,
		                     "%s: truncated: the file has %zu bytes, fewer than the 8-byte header size",
		                     st->path, st->size);
	st->map = mmap(NULL, st->size, PROT_READ | (wr ? PROT_WRITE : 0),
	               wr ? MAP_SHARED : MAP_PRIVATE, st->fd, 0);
	if (st->map == MAP_FAILED) {
		st->map = NULL;
		return hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot map: %s", st->path, strerror(errno));
	}
	st->mapped = 1;
#ifdef MADV_HUGEPAGE
	/* Huge pages for a checkpoint read in place: where the kernel reads
	 * the file in through this map (not yet in its page cache), it then
	 * reads 2 MiB folios and maps each with one entry, so a decode
	 * step's walk over the weights needs 512 times fewer TLB entries
	 * (docs/PERFORMANCE.md, "Decode at B = 1, sixth round"). Advice
	 * only: a kernel without file huge pages ignores it or says EINVAL,
	 * and pages already cached in small folios stay as they are. */
	if (!wr && st->size >= HI3_HUGE_PAGE)
		(void)madvise(st->map, st->size, MADV_HUGEPAGE);
#endif
	if (wr)
		advise_in_place(st);
	return 0;
}

static int parse_shape(hi3_st *st, const char *name, json_t *js, hi3_tensor *t, hi3_error *err)
{
	size_t i;
	json_t *v;

	if (!json_is_array(js))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s': \"shape\" is not an array", st->path, name);
	if (json_array_size(js) > HI3_MAX_DIMS)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s': %zu dimensions, at most %d supported",
		                     st->path, name, json_array_size(js), HI3_MAX_DIMS);
	t->ndim = (int)json_array_size(js);
	json_array_foreach(js, i, v) {
		if (!json_is_integer(v) || json_integer_value(v) < 0)
			return hi3_error_set(err, HI3_ERR_INPUT,
			                     "%s: tensor '%s': shape entry %zu is not a non-negative integer",
			                     st->path, name, i);
		t->shape[i] = json_integer_value(v);
	}
	return 0;
}

static int parse_tensor(hi3_st *st, const char *name, json_t *js, hi3_tensor *t,
                        size_t data_size, hi3_error *err)
{
	json_t *dt = json_object_get(js, "dtype"), *off = json_object_get(js, "data_offsets");
	json_int_t b, e;
	int64_t want;
	char sh[128];

	if (!json_is_object(js))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s': entry is not an object", st->path, name);
	t->name = name;
	if (!json_is_string(dt))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s': missing \"dtype\"", st->path, name);
	if (hi3_dtype_parse(json_string_value(dt), &t->dtype) != 0)
		return hi3_error_set(err, HI3_ERR_INPUT,
		                     "%s: tensor '%s': unknown dtype '%s' (expected one of F32, F16, BF16, F64, "
		                     "I64, I32, I16, I8, U64, U32, U16, U8, BOOL, F8_E4M3, F8_E5M2)",
		                     st->path, name, json_string_value(dt));
	if (parse_shape(st, name, json_object_get(js, "shape"), t, err) != 0)
		return -1;
	/* even a shape with a zero dimension (no bytes) must have an element
	 * count and byte size that int64 holds: hi3 multiplies them */
	if (hi3i_shape_bytes(t->ndim, t->shape, (int64_t)hi3_dtype_size(t->dtype), &want) != 0)
		return hi3_error_set(err, HI3_ERR_INPUT,
		                     "%s: tensor '%s': shape %s x %s: the non-zero dimensions multiply past INT64_MAX",
		                     st->path, name, hi3_shape_str(sh, sizeof(sh), t->ndim, t->shape),
		                     hi3_dtype_name(t->dtype));
	if (!json_is_array(off) || json_array_size(off) != 2 ||
	    !json_is_integer(json_array_get(off, 0)) || !json_is_integer(json_array_get(off, 1)))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s': \"data_offsets\" is not [begin, end]",
		                     st->path, name);
	b = json_integer_value(json_array_get(off, 0));
	e = json_integer_value(json_array_get(off, 1));
	if (b < 0 || e < b)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s': bad data_offsets [%lld, %lld]",
		                     st->path, name, (long long)b, (long long)e);
	if ((uint64_t)e > data_size)
		return hi3_error_set(err, HI3_ERR_INPUT,
		                     "%s: tensor '%s': data_offsets [%lld, %lld] run past the data area of %zu bytes "
		                     "(truncated file?)", st->path, name, (long long)b, (long long)e, data_size);
	if (want != e - b)
		return hi3_error_set(err, HI3_ERR_INPUT,
		                     "%s: tensor '%s': shape %s x %s (%lld bytes) does not match its byte span %lld",
		                     st->path, name, hi3_shape_str(sh, sizeof(sh), t->ndim, t->shape),
		                     hi3_dtype_name(t->dtype), (long long)want, (long long)(e - b));
	t->nbytes = (size_t)want;
	t->data = st->map + 8 + st->header_size + b;
	return 0;
}

static int parse_metadata(hi3_st *st, json_t *md, hi3_error *err)
{
	const char *k;
	json_t *v;
	size_t n;

	if (!json_is_object(md))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: \"__metadata__\" is not an object", st->path);
	n = json_object_size(md);
	st->meta_key = calloc(n + 1, sizeof(char *));
	st->meta_val = calloc(n + 1, sizeof(char *));
	if (!st->meta_key || !st->meta_val)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	json_object_foreach(md, k, v) {
		if (!json_is_string(v))
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: __metadata__ '%s' is not a string", st->path, k);
		st->meta_key[st->n_meta] = strdup(k);
		st->meta_val[st->n_meta] = strdup(json_string_value(v));
		if (!st->meta_key[st->n_meta] || !st->meta_val[st->n_meta])
			return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		st->n_meta++;
	}
	return 0;
}

static int parse_header(hi3_st *st, hi3_error *err)
{
	uint64_t n;
	json_t *root;
	json_error_t jerr;
	const char *key;
	json_t *val;
	size_t data_size, pos;
	int rc = -1, i;

	memcpy(&n, st->map, 8);                     /* little-endian hosts only */
	if (n > st->size - 8)
		return hi3_error_set(err, HI3_ERR_INPUT,
		                     "%s: header length %llu is larger than the %zu bytes after it (truncated file?)",
		                     st->path, (unsigned long long)n, st->size - 8);
	if (n > MAX_HEADER)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: header length %llu exceeds the %u-byte limit",
		                     st->path, (unsigned long long)n, MAX_HEADER);
	st->header_size = (size_t)n;
	data_size = st->size - 8 - st->header_size;
	root = json_loadb((const char *)st->map + 8, st->header_size, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: header is not valid JSON: %s (header byte %d)",
		                     st->path, jerr.text, jerr.position);
	if (!json_is_object(root)) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: header is not a JSON object", st->path);
		goto out;
	}
	st->t = calloc(json_object_size(root) + 1, sizeof(hi3_tensor));
	if (!st->t) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	json_object_foreach(root, key, val) {
		if (!strcmp(key, "__metadata__")) {
			if (parse_metadata(st, val, err) != 0)
				goto out;
			continue;
		}
		if (!*key) {
			/* no stage can ask for it, and hi3_stw_add refuses to write one */
			hi3_error_set(err, HI3_ERR_INPUT, "%s: a tensor has an empty name", st->path);
			goto out;
		}
		char *name = strdup(key);
		if (!name) {
			hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
			goto out;
		}
		st->t[st->n].name = name;
		st->n++;
		if (parse_tensor(st, name, val, &st->t[st->n - 1], data_size, err) != 0)
			goto out;
	}
	if (st->n > 1)
		qsort(st->t, (size_t)st->n, sizeof(hi3_tensor), offset_cmp);
	pos = 0;
	for (i = 0; i < st->n; i++) {
		size_t b = (size_t)((unsigned char *)st->t[i].data - (st->map + 8 + st->header_size));

		if (b < pos) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s' overlaps tensor '%s' (data offset %zu < %zu)",
			              st->path, st->t[i].name, st->t[i - 1].name, b, pos);
			goto out;
		}
		if (b > pos) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: hole in the data area: bytes [%zu, %zu) before tensor '%s' "
			              "belong to no tensor", st->path, pos, b, st->t[i].name);
			goto out;
		}
		pos = b + st->t[i].nbytes;
	}
	if (pos != data_size) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: the data area has %zu bytes but the tensors cover %zu "
		              "(trailing bytes or truncated tensors)", st->path, data_size, pos);
		goto out;
	}
	st->by_name = malloc(sizeof(int) * (size_t)(st->n + 1));
	if (!st->by_name) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	for (i = 0; i < st->n; i++)
		st->by_name[i] = i;
	if (st->n > 1)
		qsort_r(st->by_name, (size_t)st->n, sizeof(int), name_cmp_ctx_st_sort, st->t);
	rc = 0;
out:
	json_decref(root);
	return rc;
}

int hi3_st_open(hi3_st **out, const char *path, int flags, hi3_error *err)
{
	hi3_st *st = calloc(1, sizeof(*st));

	*out = NULL;
	if (!st)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	st->fd = -1;
	st->path = strdup(path);
	if (!st->path) {
		free(st);
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	}
	if (!strcmp(path, "-")) {
		free(st->path);
		st->path = strdup("<stdin>");
		if ((flags & HI3_ST_RDWR) || !st->path) {
			hi3_error_set(err, HI3_ERR_USAGE, "standard input cannot be updated in place");
			goto fail;
		}
		if (read_stdin(st, err) != 0)
			goto fail;
		if (st->size < 8) {
			hi3_error_set(err, HI3_ERR_INPUT, "<stdin>: truncated: %zu bytes, fewer than the 8-byte header size",
			              st->size);
			goto fail;
		}
	} else if (map_file(st, flags, err) != 0) {
		goto fail;
	}
	if (parse_header(st, err) != 0)
		goto fail;
	*out = st;
	return 0;
fail:
	hi3_st_close(st);
	return -1;
}

void hi3_st_close(hi3_st *st)
{
	if (!st)
		return;
	if (st->map) {
		if (st->mapped)
			munmap(st->map, st->size);
		else
			free(st->map);
	}
	if (st->fd >= 0)
		close(st->fd);
	for (int i = 0; i < st->n; i++)
		free((char *)st->t[i].name);
	for (int i = 0; i < st->n_meta; i++) {
		free(st->meta_key[i]);
		free(st->meta_val[i]);
	}
	free(st->meta_key);
	free(st->meta_val);
	free(st->t);
	free(st->by_name);
	free(st->path);
	free(st);
}

const char *hi3_st_path(const hi3_st *st) { return st->path; }
size_t hi3_st_file_size(const hi3_st *st) { return st->size; }
size_t hi3_st_header_size(const hi3_st *st) { return st->header_size; }
int hi3_st_count(const hi3_st *st) { return st->n; }

const hi3_tensor *hi3_st_at(const hi3_st *st, int i)
{
	return i >= 0 && i < st->n ? &st->t[i] : NULL;
}

const hi3_tensor *hi3_st_find(const hi3_st *st, const char *name)
{
	int lo = 0, hi = st->n - 1;

	while (lo <= hi) {
		int mid = (lo + hi) / 2, c = strcmp(name, st->t[st->by_name[mid]].name);

		if (!c)
			return &st->t[st->by_name[mid]];
		if (c < 0)
			hi = mid - 1;
		else
			lo = mid + 1;
	}
	return NULL;
}

static int check_tensor(const char *path, const char *name, const hi3_tensor *t, int dtype,
                        int ndim, const int64_t *shape, hi3_error *err)
{
	char want[160], got[160];
	int ok = t->ndim == ndim;

	if (dtype >= 0 && t->dtype != (hi3_dtype)dtype)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s': expected dtype %s, found %s", path, name,
		                     hi3_dtype_name((hi3_dtype)dtype), hi3_dtype_name(t->dtype));
	for (int i = 0; ok && i < ndim; i++)
		ok = shape[i] < 0 || shape[i] == t->shape[i];
	if (!ok) {
		int64_t w[HI3_MAX_DIMS] = {0};
		size_t off = 0;

		for (int i = 0; i < ndim && i < HI3_MAX_DIMS; i++)
			w[i] = shape[i];
		hi3_shape_str(want, sizeof(want), ndim, w);
		for (int i = 0; i < ndim; i++)
			if (shape[i] < 0)
				off++;
		hi3_shape_str(got, sizeof(got), t->ndim, t->shape);
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s': expected shape %s%s, found %s", path, name,
		                     want, off ? " (-1: any)" : "", got);
	}
	if (hi3_dtype_size(t->dtype) > 1 && ((uintptr_t)t->data % hi3_dtype_size(t->dtype)))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s': data is not aligned to its %zu-byte dtype",
		                     path, name, hi3_dtype_size(t->dtype));
	return 0;
}

int hi3_st_get(const hi3_st *st, const char *name, int dtype, int ndim, const int64_t *shape,
               const hi3_tensor **out, hi3_error *err)
{
	const hi3_tensor *t = hi3_st_find(st, name);

	*out = NULL;
	if (!t)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s' is missing", st->path, name);
	if (check_tensor(st->path, name, t, dtype, ndim, shape, err) != 0)
		return -1;
	*out = t;
	return 0;
}

const char *hi3_st_meta(const hi3_st *st, const char *key)
{
	for (int i = 0; i < st->n_meta; i++)
		if (!strcmp(st->meta_key[i], key))
			return st->meta_val[i];
	return NULL;
}

int hi3_st_meta_count(const hi3_st *st) { return st->n_meta; }

void hi3_st_meta_at(const hi3_st *st, int i, const char **key, const char **val)
{
	*key = st->meta_key[i];
	*val = st->meta_val[i];
}

int hi3_st_expect_format(const hi3_st *st, const char *format, hi3_error *err)
{
	const char *f = hi3_st_meta(st, "format"), *v = hi3_st_meta(st, "format_version");

	if (!f || strcmp(f, format))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: expected format '%s', found '%s'", st->path, format,
		                     f ? f : "(none: no __metadata__ format)");
	if (!v || strcmp(v, HI3_FORMAT_VERSION))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: expected format_version '%s', found '%s'", st->path,
		                     HI3_FORMAT_VERSION, v ? v : "(none)");
	return 0;
}

int hi3i_st_lock(hi3_st *st, hi3_error *err)
{
	if (st->fd < 0)
		return hi3_error_set(err, HI3_ERR_USAGE, "%s: cannot lock standard input", st->path);
	if (flock(st->fd, LOCK_EX | LOCK_NB) != 0)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "%s: %s", st->path,
		                     errno == EWOULDBLOCK ? "another process is updating this file (it is locked)"
		                                          : strerror(errno));
	return 0;
}

int hi3_st_sync(hi3_st *st, const void *addr, size_t len, hi3_error *err)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t a = (uintptr_t)addr & ~(page - 1);

	if (!st->mapped)
		return 0;
	if (msync((void *)a, len + ((uintptr_t)addr - a), MS_SYNC) != 0)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "%s: msync failed: %s", st->path, strerror(errno));
	return 0;
}

/* ------------------------------------------------------------- writer */

struct wtensor {
	char *name;
	hi3_dtype dtype;
	int ndim;
	int64_t shape[HI3_MAX_DIMS];
	size_t nbytes;
	const void *data;
	int seq;
};

struct hi3_st_writer {
	json_t *meta;
	struct wtensor *t;
	int n, cap;
	int in_place;             /* hi3i_stw_in_place */
};

hi3_st_writer *hi3_stw_new(void)
{
	hi3_st_writer *w = calloc(1, sizeof(*w));

	if (w && !(w->meta = json_object())) {
		free(w);
		return NULL;
	}
	return w;
}

hi3_st_writer *hi3i_stw_format(const char *format, const char *const (*meta)[2], size_t n)
{
	hi3_st_writer *w = hi3_stw_new();

	if (!w || hi3_stw_meta(w, "format", format) || hi3_stw_meta(w, "format_version", HI3_FORMAT_VERSION))
		goto fail;
	for (size_t i = 0; i < n; i++)
		if (meta[i][1] && hi3_stw_meta(w, meta[i][0], meta[i][1]))
			goto fail;
	return w;
fail:
	hi3_stw_free(w);
	return NULL;
}

void hi3i_stw_in_place(hi3_st_writer *w)
{
	w->in_place = 1;
}

void hi3_stw_free(hi3_st_writer *w)
{
	if (!w)
		return;
	for (int i = 0; i < w->n; i++)
		free(w->t[i].name);
	free(w->t);
	json_decref(w->meta);
	free(w);
}

int hi3_stw_meta(hi3_st_writer *w, const char *key, const char *val)
{
	return json_object_set_new(w->meta, key, json_string(val)) == 0 ? 0 : -1;
}

int hi3_stw_add(hi3_st_writer *w, const char *name, hi3_dtype dt, int ndim, const int64_t *shape,
                const void *data)
{
	struct wtensor *t;
	int64_t nbytes;

	if (!name || !*name || !strcmp(name, "__metadata__") || ndim < 0 || ndim > HI3_MAX_DIMS ||
	    (unsigned)dt >= HI3_DTYPE_COUNT)
		return -1;
	for (int i = 0; i < w->n; i++)
		if (!strcmp(w->t[i].name, name))
			return -1;
	if (w->n == w->cap) {
		int cap = w->cap ? 2 * w->cap : 16;
		struct wtensor *nt = realloc(w->t, sizeof(*nt) * (size_t)cap);
		if (!nt)
			return -1;
		w->t = nt;
		w->cap = cap;
	}
	t = &w->t[w->n];
	memset(t, 0, sizeof(*t));
	t->name = strdup(name);
	if (!t->name)
		return -1;
	t->dtype = dt;
	t->ndim = ndim;
	if (hi3i_shape_bytes(ndim, shape, (int64_t)hi3_dtype_size(dt), &nbytes) != 0) {
		free(t->name);
		return -1;
	}
	t->nbytes = (size_t)nbytes;
	for (int i = 0; i < ndim; i++)
		t->shape[i] = shape[i];
	t->data = data;
	t->seq = w->n;
	w->n++;
	return 0;
}

/* Wider dtypes first so every tensor stays aligned to its element size;
 * insertion order otherwise. */
static int layout_cmp(const void *a, const void *b)
{
	const struct wtensor *x = a, *y = b;
	size_t sx = hi3_dtype_size(x->dtype), sy = hi3_dtype_size(y->dtype);

	if (sx != sy)
		return sx > sy ? -1 : 1;
	return x->seq - y->seq;
}

static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t r = write(fd, p, len > (1u << 30) ? (1u << 30) : len);

		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p += r;
		len -= (size_t)r;
	}
	return 0;
}

static int write_zeros(int fd, size_t len)
{
	static const char zeros[65536];

	while (len) {
		size_t n = len < sizeof(zeros) ? len : sizeof(zeros);
		if (write_all(fd, zeros, n) != 0)
			return -1;
		len -= n;
	}
	return 0;
}

/*
 * The writer's bytes go out in whole blocks at offsets that are multiples
 * of the block (the last block may be short), and whole blocks of zeros
 * are left as holes in a regular file. The kernel sizes a cached folio by
 * the write that makes it, so:
 *
 * - A block is HI3_HUGE_PAGE, sent in writes of whole blocks: the file is
 *   cached in huge folios, and a read-only map of it (a checkpoint's) maps
 *   each with one entry. Written a tensor at a time, at any offset, the
 *   folios came mixed: a `small` checkpoint just written by init-model
 *   was mapped 24% in huge pages, and a B = 1 decode step over it ran 2%
 *   slower than over the same bytes written in aligned blocks
 *   (docs/PERFORMANCE.md, "Decode at B = 1, tenth round").
 * - A file hi3 updates in place (hi3i_stw_in_place) takes a page a block
 *   and a page a write: it is cached in pages. Each step of a decode
 *   commits a few bytes of every layer's cache (msync), and the kernel
 *   writes a dirty folio back whole: with the KV file in huge folios, 100
 *   steps of 3 rows on `small` wrote 3.65-3.76 GB and took 3.30-3.43 s;
 *   in pages, 123-125 MB and 2.33 s (docs/PERFORMANCE.md, "Decode at
 *   B = 1, fourteenth round"). Its maps are advised to match (map_file).
 */
struct out {
	int fd;
	int sparse;               /* zeros may be left as holes (a regular file) */
	size_t block;             /* HI3_HUGE_PAGE, or a page for a file updated in place */
	int by_page;              /* data a block a write (a file updated in place) */
	unsigned char *buf;       /* the block being filled, */
	size_t fill;              /* its first fill bytes */
};

static int out_flush(struct out *o)
{
	int rc = o->fill ? write_all(o->fd, o->buf, o->fill) : 0;

	o->fill = 0;
	return rc;
}

/* The n bytes at p, or n zeros where p is NULL. */
static int out_put(struct out *o, const void *p, size_t n)
{
	const unsigned char *s = p;

	while (n) {
		size_t k;
		if (o->fill == 0 && n >= o->block) {
			/* whole blocks straight from the caller's bytes (one
			 * at a time for a file updated in place), or holes */
			k = s && o->by_page ? o->block : n / o->block * o->block;
			if (s ? write_all(o->fd, s, k)
			      : o->sparse ? (lseek(o->fd, (off_t)k, SEEK_CUR) < 0 ? -1 : 0) : write_zeros(o->fd, k))
				return -1;
		} else {
			k = HI3_MIN(n, o->block - o->fill);
			if (s)
				memcpy(o->buf + o->fill, s, k);
			else
				memset(o->buf + o->fill, 0, k);
			o->fill += k;
			if (o->fill == o->block && out_flush(o) != 0)
				return -1;
		}
		n -= k;
		if (s)
			s += k;
	}
	return 0;
}

static char *build_header(hi3_st_writer *w, size_t *hlen)
{
	json_t *root = json_object();
	size_t off = 0, n;
	char *s, *padded;

	if (!root)
		return NULL;
	if (json_object_size(w->meta))
		json_object_set(root, "__metadata__", w->meta);
	for (int i = 0; i < w->n; i++) {
		struct wtensor *t = &w->t[i];
		json_t *shape = json_array(), *e = json_object();

		for (int d = 0; d < t->ndim; d++)
			json_array_append_new(shape, json_integer(t->shape[d]));
		json_object_set_new(e, "dtype", json_string(hi3_dtype_name(t->dtype)));
		json_object_set_new(e, "shape", shape);
		json_object_set_new(e, "data_offsets",
		                    json_pack("[II]", (json_int_t)off, (json_int_t)(off + t->nbytes)));
		json_object_set_new(root, t->name, e);
		off += t->nbytes;
	}
	s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(root);
	if (!s)
		return NULL;
	n = strlen(s);
	*hlen = (n + 8 + 63) / 64 * 64 - 8;
	padded = malloc(*hlen + 8);
	if (padded) {
		uint64_t h = *hlen;
		memcpy(padded, &h, 8);
		memcpy(padded + 8, s, n);
		memset(padded + 8 + n, ' ', *hlen - n);
	}
	free(s);
	return padded;
}

int hi3_stw_write(hi3_st_writer *w, const char *path, hi3_error *err)
{
	int to_stdout = !strcmp(path, "-"), fd;
	char *hdr = NULL, *tmp = NULL;
	size_t hlen = 0, total;
	const size_t page = (size_t)sysconf(_SC_PAGESIZE);
	struct out o = {.sparse = !to_stdout, .block = w->in_place ? page : HI3_HUGE_PAGE, .by_page = w->in_place};

	if (w->n > 1)
		qsort(w->t, (size_t)w->n, sizeof(*w->t), layout_cmp);
	hdr = build_header(w, &hlen);
	o.buf = malloc(o.block);
	if (!hdr || !o.buf) {
		free(hdr);
		free(o.buf);
		return hi3_error_set(err, HI3_ERR_RUNTIME, "%s: out of memory for the header and a %zu KiB write buffer",
		                     path, o.block >> 10);
	}
	total = 8 + hlen;
	for (int i = 0; i < w->n; i++)
		total += w->t[i].nbytes;
	if (to_stdout) {
		fd = STDOUT_FILENO;
	} else {
		fd = hi3i_tmpfile_for(path, &tmp, err);
		if (fd < 0) {
			free(hdr);
			free(o.buf);
			return -1;
		}
	}
	o.fd = fd;
	if (out_put(&o, hdr, hlen + 8) != 0)
		goto io_fail;
	for (int i = 0; i < w->n; i++)
		if (out_put(&o, w->t[i].data, w->t[i].nbytes) != 0)   /* no data: zeros, sparse in a file */
			goto io_fail;
	if (out_flush(&o) != 0)
		goto io_fail;
	free(hdr);
	free(o.buf);
	if (to_stdout)
		return 0;
	if (ftruncate(fd, (off_t)total) != 0)
		goto io_fail_nohdr;
	{
		int rc = hi3i_commit_tmpfile(fd, tmp, path, err);
		free(tmp);
		return rc;
	}
io_fail:
	free(hdr);
	free(o.buf);
io_fail_nohdr:
	hi3_error_set(err, HI3_ERR_RUNTIME, "%s: write error: %s", to_stdout ? "standard output" : path,
	              strerror(errno));
	if (!to_stdout) {
		close(fd);
		unlink(tmp);
		free(tmp);
	}
	return -1;
}
