/* fuzz-safetensors.c -- hi3_st_open on any bytes (lib/format/safetensors.c).
 * An opened file's tensors tile its data area exactly, each as many bytes
 * as its shape and dtype say; names and metadata are found again; and what
 * hi3_stw writes from it reopens with the same tensors. */
#include <string.h>
#include "core/internal.h"
#include "fuzz/fuzz.h"

static void same_tensors(const hi3_st *a, const hi3_st *b)
{
	FUZZ_CHECK(hi3_st_count(a) == hi3_st_count(b), "%d tensors written, %d read back", hi3_st_count(a),
	           hi3_st_count(b));
	for (int i = 0; i < hi3_st_count(a); i++) {
		const hi3_tensor *x = hi3_st_at(a, i), *y = hi3_st_find(b, x->name);

		FUZZ_CHECK(y, "tensor '%s' lost in the rewrite", x->name);
		FUZZ_CHECK(x->dtype == y->dtype && x->ndim == y->ndim && x->nbytes == y->nbytes &&
		           !memcmp(x->shape, y->shape, sizeof(x->shape[0]) * (size_t)x->ndim) &&
		           !memcmp(x->data, y->data, x->nbytes), "tensor '%s' changed in the rewrite", x->name);
	}
	FUZZ_CHECK(hi3_st_meta_count(a) == hi3_st_meta_count(b), "metadata count changed in the rewrite");
	for (int i = 0; i < hi3_st_meta_count(a); i++) {
		const char *k, *v, *w;

		hi3_st_meta_at(a, i, &k, &v);
		w = hi3_st_meta(b, k);
		FUZZ_CHECK(w && !strcmp(v, w), "metadata '%s' changed in the rewrite", k);
	}
}

static void one(const uint8_t *data, size_t size)
{
	const char *path = fuzz_write("in.safetensors", data, size);
	hi3_error err = {0};
	hi3_st *st = NULL, *back = NULL;
	hi3_st_writer *w;
	const unsigned char *base, *pos;
	int rc = hi3_st_open(&st, path, HI3_ST_READ, &err);

	fuzz_check_status(rc, &err, "hi3_st_open");
	if (rc != 0) {
		FUZZ_CHECK(st == NULL, "a failed open left a handle");
		return;
	}
	FUZZ_CHECK(hi3_st_file_size(st) == size && 8 + hi3_st_header_size(st) <= size, "sizes: file %zu, header %zu",
	           hi3_st_file_size(st), hi3_st_header_size(st));
	/* the tiling: in offset order, each tensor starts where the last ended */
	base = pos = NULL;
	for (int i = 0; i < hi3_st_count(st); i++) {
		const hi3_tensor *t = hi3_st_at(st, i);
		int64_t numel = hi3_tensor_numel(t);

		FUZZ_CHECK(t->ndim >= 0 && t->ndim <= HI3_MAX_DIMS && (unsigned)t->dtype < HI3_DTYPE_COUNT,
		           "tensor '%s': ndim %d, dtype %d", t->name, t->ndim, (int)t->dtype);
		FUZZ_CHECK(numel >= 0 && (uint64_t)numel * hi3_dtype_size(t->dtype) == t->nbytes,
		           "tensor '%s': %lld elements of %s in %zu bytes", t->name, (long long)numel,
		           hi3_dtype_name(t->dtype), t->nbytes);
		if (i == 0)
			base = pos = (const unsigned char *)t->data;
		FUZZ_CHECK((const unsigned char *)t->data == pos, "tensor '%s' does not start where the last ended",
		           t->name);
		pos += t->nbytes;
		FUZZ_CHECK(hi3_st_find(st, t->name) == t, "tensor '%s' not found by name", t->name);
	}
	if (hi3_st_count(st) > 0)
		FUZZ_CHECK(base == (const unsigned char *)hi3_st_at(st, 0)->data &&
		           (size_t)(pos - base) == size - 8 - hi3_st_header_size(st),
		           "the tensors cover %zu of %zu data bytes", (size_t)(pos - base),
		           size - 8 - hi3_st_header_size(st));
	else
		FUZZ_CHECK(size == 8 + hi3_st_header_size(st), "no tensors, but %zu data bytes",
		           size - 8 - hi3_st_header_size(st));
	for (int i = 0; i < hi3_st_meta_count(st); i++) {
		const char *k, *v;

		hi3_st_meta_at(st, i, &k, &v);
		FUZZ_CHECK(k && v && hi3_st_meta(st, k), "metadata %d", i);
	}
	for (int i = 0; i < hi3_st_count(st); i++) {
		const hi3_tensor *t = hi3_st_at(st, i), *got;

		rc = hi3_st_get(st, t->name, (int)t->dtype, t->ndim, t->shape, &got, &err);
		fuzz_check_status(rc, &err, "hi3_st_get");
		FUZZ_CHECK(rc != 0 || got == t, "hi3_st_get found another tensor");
	}
	/* rewrite and reopen */
	w = hi3_stw_new();
	FUZZ_CHECK(w, "out of memory");
	for (int i = 0; i < hi3_st_meta_count(st); i++) {
		const char *k, *v;

		hi3_st_meta_at(st, i, &k, &v);
		FUZZ_CHECK(hi3_stw_meta(w, k, v) == 0, "hi3_stw_meta '%s'", k);
	}
	for (int i = 0; i < hi3_st_count(st); i++) {
		const hi3_tensor *t = hi3_st_at(st, i);

		FUZZ_CHECK(hi3_stw_add(w, t->name, t->dtype, t->ndim, t->shape, t->data) == 0,
		           "hi3_stw_add refused tensor '%s' that it read", t->name);
	}
	rc = hi3_stw_write(w, fuzz_path("out.safetensors"), &err);
	FUZZ_CHECK(rc == 0, "hi3_stw_write: %s", err.msg);
	hi3_stw_free(w);
	rc = hi3_st_open(&back, fuzz_path("out.safetensors"), HI3_ST_READ, &err);
	FUZZ_CHECK(rc == 0, "a file hi3 wrote does not reopen: %s", err.msg);
	same_tensors(st, back);
	hi3_st_close(back);
	hi3_st_close(st);
}

HI3_FUZZ_TARGET(safetensors, NULL, one)
