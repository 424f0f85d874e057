/* test-interop.c -- safetensors interoperability with Python (hi3-files(5)).
 *
 *   test-interop                 TAP: open tests/fixtures/python-written.safetensors
 *                                (written by Python's safetensors package, see
 *                                tests/ref/check_interop.py) with hi3_st_open and
 *                                check every tensor bit for bit and the metadata.
 *   test-interop --write FILE    write the same table with hi3's writer, for
 *                                check_interop.py to read back in Python
 *                                (make check-ref).
 *
 * The table below is the contract shared with TABLE in check_interop.py:
 * change both together.
 */
#include <math.h>
#include <string.h>
#include "hi3.h"
#include "tap.h"

#define MAX_N 8

struct entry {
	const char *name;
	hi3_dtype dt;
	int ndim;
	int64_t shape[2];
};

static const struct entry table[] = {
	{"f32", HI3_F32, 2, {2, 3}},          {"f64", HI3_F64, 1, {4}},
	{"bf16", HI3_BF16, 2, {3, 2}},        {"f16", HI3_F16, 1, {5}},
	{"bf16_special", HI3_BF16, 1, {4}},   {"f16_special", HI3_F16, 1, {6}},
	{"i64", HI3_I64, 1, {5}},             {"i32", HI3_I32, 2, {2, 2}},
	{"i16", HI3_I16, 1, {3}},             {"i8", HI3_I8, 1, {3}},
	{"u8", HI3_U8, 2, {2, 2}},            {"bool", HI3_BOOL, 1, {5}},
	{"scalar", HI3_F32, 0, {0}},          {"empty", HI3_F32, 2, {0, 3}},
};

static const char *const meta[][2] = {
	{"format", "hi3.test.interop"},
	{"format_version", "1"},
	{"text", "h\xc3\xa9llo \xe2\x9c\x93 \"quoted\" \\ end"},
};

static size_t numel(const struct entry *e)
{
	size_t n = 1;

	for (int i = 0; i < e->ndim; i++)
		n *= (size_t)e->shape[i];
	return n;
}

/* (i - 2) / 3 * scale in double, as check_interop.py's thirds(). */
static double third(int i, double scale)
{
	return (i - 2) / 3.0 * scale;
}

/* The expected bytes of entry e into buf (at least MAX_N * 8 bytes). */
static void expected(const struct entry *e, void *buf)
{
	static const double bf16_special[] = {3.3895313892515355e38, -0.0, INFINITY, 0x1p-133};
	static const double f16_special[] = {65504.0, -65504.0, 0x1p-14, 0x1p-24, -0.0, INFINITY};
	static const int64_t i64[] = {-1, 0, 1LL << 40, -(1LL << 62) + 5, INT64_MAX};
	static const int32_t i32[] = {INT32_MIN, -1, 0, INT32_MAX};
	static const int16_t i16[] = {-32768, 7, 32767};
	static const int8_t i8[] = {-128, 0, 127};
	static const uint8_t u8[] = {0, 1, 128, 255}, bools[] = {1, 0, 0, 1, 1};
	const size_t n = numel(e);

	memset(buf, 0, MAX_N * 8);
	for (size_t i = 0; i < n; i++) {
		const char *nm = e->name;
		if (!strcmp(nm, "f32"))
			((float *)buf)[i] = (float)third((int)i, 1.0);
		else if (!strcmp(nm, "f64"))
			((double *)buf)[i] = third((int)i, 1.0);
		else if (!strcmp(nm, "bf16"))
			((uint16_t *)buf)[i] = hi3_f32_to_bf16((float)third((int)i, 7.0));
		else if (!strcmp(nm, "f16"))
			((uint16_t *)buf)[i] = hi3_f32_to_f16((float)third((int)i, 1000.0));
		else if (!strcmp(nm, "bf16_special"))
			((uint16_t *)buf)[i] = hi3_f32_to_bf16((float)bf16_special[i]);
		else if (!strcmp(nm, "f16_special"))
			((uint16_t *)buf)[i] = hi3_f32_to_f16((float)f16_special[i]);
		else if (!strcmp(nm, "i64"))
			((int64_t *)buf)[i] = i64[i];
		else if (!strcmp(nm, "i32"))
			((int32_t *)buf)[i] = i32[i];
		else if (!strcmp(nm, "i16"))
			((int16_t *)buf)[i] = i16[i];
		else if (!strcmp(nm, "i8"))
			((int8_t *)buf)[i] = i8[i];
		else if (!strcmp(nm, "u8"))
			((uint8_t *)buf)[i] = u8[i];
		else if (!strcmp(nm, "bool"))
			((uint8_t *)buf)[i] = bools[i];
		else if (!strcmp(nm, "scalar"))
			((float *)buf)[i] = 2.5f;
	}
}

static int write_table(const char *path)
{
	hi3_st_writer *w = hi3_stw_new();
	static unsigned char bufs[sizeof(table) / sizeof(table[0])][MAX_N * 8];
	hi3_error err = {0};
	int rc = 1;

	if (!w)
		return 1;
	for (size_t i = 0; i < sizeof(meta) / sizeof(meta[0]); i++)
		if (hi3_stw_meta(w, meta[i][0], meta[i][1]) != 0)
			goto out;
	if (hi3_stw_meta(w, "writer", "hi3 (tests/test-interop --write)") != 0)
		goto out;
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
		expected(&table[i], bufs[i]);
		if (hi3_stw_add(w, table[i].name, table[i].dt, table[i].ndim, table[i].shape, bufs[i]) != 0) {
			fprintf(stderr, "test-interop: cannot add tensor '%s'\n", table[i].name);
			goto out;
		}
	}
	if (hi3_stw_write(w, path, &err) != 0) {
		fprintf(stderr, "test-interop: %s\n", err.msg);
		goto out;
	}
	rc = 0;
out:
	hi3_stw_free(w);
	return rc;
}

static void check_python_file(const char *path)
{
	hi3_st *st = NULL;
	hi3_error err = {0};
	unsigned char want[MAX_N * 8];

	if (!ok(hi3_st_open(&st, path, HI3_ST_READ, &err) == 0, "hi3_st_open reads a file written by Python's "
	        "safetensors: %s", err.msg[0] ? err.msg : path))
		return;
	diag("%s: writer '%s'", path, hi3_st_meta(st, "writer") ? hi3_st_meta(st, "writer") : "?");
	ok(hi3_st_count(st) == (int)(sizeof(table) / sizeof(table[0])), "%d tensors (expected %d)", hi3_st_count(st),
	   (int)(sizeof(table) / sizeof(table[0])));
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
		const struct entry *e = &table[i];
		const hi3_tensor *t = NULL;
		size_t nb = numel(e) * hi3_dtype_size(e->dt);

		memset(&err, 0, sizeof(err));
		if (!ok(hi3_st_get(st, e->name, (int)e->dt, e->ndim, e->shape, &t, &err) == 0,
		        "tensor '%s': %s, %d dims%s%s", e->name, hi3_dtype_name(e->dt), e->ndim, err.msg[0] ? ": " : "",
		        err.msg))
			continue;
		expected(e, want);
		ok(t->nbytes == nb && (nb == 0 || memcmp(t->data, want, nb) == 0), "tensor '%s': %zu bytes, bit for bit",
		   e->name, nb);
	}
	for (size_t i = 0; i < sizeof(meta) / sizeof(meta[0]); i++) {
		const char *v = hi3_st_meta(st, meta[i][0]);
		ok(v && !strcmp(v, meta[i][1]), "metadata '%s' = '%s' (found '%s')", meta[i][0], meta[i][1],
		   v ? v : "(absent)");
	}
	hi3_st_close(st);
}

int main(int argc, char **argv)
{
	const char *srcdir = getenv("SRCDIR");
	char path[1024];

	if (argc == 3 && !strcmp(argv[1], "--write"))
		return write_table(argv[2]);
	if (argc != 1) {
		fprintf(stderr, "usage: test-interop [--write FILE]\n");
		return 2;
	}
	snprintf(path, sizeof(path), "%s/tests/fixtures/python-written.safetensors", srcdir ? srcdir : ".");
	check_python_file(path);
	return done_testing();
}
