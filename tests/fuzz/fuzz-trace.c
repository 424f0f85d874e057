/* fuzz-trace.c -- hi3_trace_file_open on any bytes (lib/format/trace.c): an
 * opened trace's tokens are in (row, position) order with every point
 * shaped (n, ...) in forward order; the trace hi3 writes from it reopens
 * the same; and hi3 diff --first of it against itself finds it equal. */
#include <string.h>
#include "core/internal.h"
#include "fuzz/fuzz.h"

static void one(const uint8_t *data, size_t size)
{
	const char *path = fuzz_write("in.trace", data, size), *out = fuzz_path("out.trace");
	hi3_trace_file *f = NULL, *back = NULL;
	hi3_trace_diff *d = NULL;
	hi3_error err = {0};
	int rc = hi3_trace_file_open(&f, path, &err);

	fuzz_check_status(rc, &err, "hi3_trace_file_open");
	if (rc != 0) {
		FUZZ_CHECK(f == NULL, "a failed open left a trace");
		return;
	}
	FUZZ_CHECK(f->n >= 0 && f->n_points >= 0, "n %lld, %d points", (long long)f->n, f->n_points);
	for (int64_t i = 1; i < f->n; i++)
		FUZZ_CHECK(f->rows[i - 1] < f->rows[i] || (f->rows[i - 1] == f->rows[i] && f->positions[i - 1] < f->positions[i]),
		           "tokens %lld and %lld out of order", (long long)i - 1, (long long)i);
	for (int j = 0; j < f->n_points; j++)
		FUZZ_CHECK(f->points[j].shape[0] == f->n && f->points[j].ndim >= 1 && f->points[j].ndim <= 3,
		           "point %s: shape[0] %lld of %lld", f->points[j].name, (long long)f->points[j].shape[0],
		           (long long)f->n);
	{
		/* the file's metadata, as pairs, for the writer */
		int nm = hi3_st_meta_count(f->st);
		const char **meta = calloc(2 * (size_t)nm + 1, sizeof(*meta));
		FUZZ_CHECK(meta != NULL, "out of memory");
		for (int i = 0; i < nm; i++)
			hi3_st_meta_at(f->st, i, &meta[2 * i], &meta[2 * i + 1]);
		f->meta = meta;
		f->n_meta = nm;
		rc = hi3_trace_file_write(f, out, &err);
		f->meta = NULL;
		f->n_meta = 0;
		free(meta);
	}
	FUZZ_CHECK(rc == 0, "hi3_trace_file_write of an opened trace: %s", err.msg);
	rc = hi3_trace_file_open(&back, out, &err);
	FUZZ_CHECK(rc == 0, "a trace hi3 wrote does not reopen: %s", err.msg);
	FUZZ_CHECK(back->n == f->n && back->n_points == f->n_points &&
	           !memcmp(back->rows, f->rows, 4 * (size_t)f->n) && !memcmp(back->positions, f->positions, 8 * (size_t)f->n),
	           "reopened: n %lld/%lld, %d/%d points", (long long)f->n, (long long)back->n, f->n_points, back->n_points);
	rc = hi3_trace_diff_run(path, out, &(hi3_trace_diff_opts){.row_a = -1, .row_b = -1, .threads = 1}, &d, &err);
	if (f->n == 0)
		FUZZ_CHECK(rc == -1 && err.status == HI3_ERR_USAGE, "an empty trace has nothing to align: %d", rc);
	else
		FUZZ_CHECK(rc == 0 && d->equal && d->aligned == f->n, "a trace against its copy: %s",
		           rc ? err.msg : "differs");
	hi3_trace_diff_free(d);
	hi3_trace_file_close(back);
	hi3_trace_file_close(f);
}

HI3_FUZZ_TARGET(trace, NULL, one)
