/*
 * internal.h -- helpers shared inside libhi3, the internal side of
 * core/hi3-core.h; not installed, not exported (internal names start with
 * hi3i_; the library exports only hi3_).
 */
#ifndef HI3_INTERNAL_H
#define HI3_INTERNAL_H

#include <stdio.h>
#include <stdlib.h>
#include "core/hi3-core.h"

/* Always-on invariant check: prints file and line and aborts. Use for
 * programming errors only; bad input is reported through hi3_error. */
#define HI3_ASSERT(cond)                                                      \
	do {                                                                  \
		if (!(cond))                                                  \
			hi3i_assert_fail(#cond, __FILE__, __LINE__);          \
	} while (0)
_Noreturn void hi3i_assert_fail(const char *what, const char *file, int line);

#define HI3_MIN(a, b) ((a) < (b) ? (a) : (b))
#define HI3_MAX(a, b) ((a) > (b) ? (a) : (b))
#define HI3_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
/* Fork OpenMP threads for a loop only when it has this much work (its
 * elements times their cost): below it the fork/join costs more than it
 * saves (decode at small B). */
#define HI3_PAR_WORTH(work) ((size_t)(work) >= ((size_t)1 << 16))
/* for (int i = 0; i < n; i++) { body }: on OpenMP's threads when work is
 * worth them, else on the calling thread without entering a parallel
 * region. A region that its if clause keeps serial still costs libgomp a
 * team: 1.8-2.1 us against 0.35 us for a loop over 1024 elements
 * (measured, OMP_WAIT_POLICY=passive as hi3 runs), and a decode step of
 * the `small` preset runs some 80 such loops. */
#define HI3_PAR_FOR(work, i, n, ...)                                          \
	do {                                                                  \
		const int hi3_par_n_ = (n);                                   \
		if (HI3_PAR_WORTH(work)) {                                    \
			_Pragma("omp parallel for schedule(static)")          \
			for (int i = 0; i < hi3_par_n_; i++) { __VA_ARGS__ }  \
		} else {                                                      \
			for (int i = 0; i < hi3_par_n_; i++) { __VA_ARGS__ }  \
		}                                                             \
	} while (0)

/* The rows [lo, lo + n) of a length-N axis split into parts: part i. */
static inline void hi3i_split(int N, int parts, int i, int *lo, int *n)
{
	*lo = (int)((int64_t)N * i / parts);
	*n = (int)((int64_t)N * (i + 1) / parts) - *lo;
}

/* The index of name in a NULL-terminated list of names, or -1 (unknown,
 * or name NULL): the option and metadata words of one table. */
int hi3i_name_index(const char *const *names, const char *name);

/* Allocation that reports failure through err (returns NULL). */
void *hi3i_malloc(size_t n, hi3_error *err);
void *hi3i_calloc(size_t count, size_t size, hi3_error *err);
/* 64-byte aligned allocation, freed with free(). */
void *hi3i_aligned_alloc(size_t n, hi3_error *err);
/* n bytes on 2 MiB boundaries that ask the kernel for huge pages
 * (MADV_HUGEPAGE, from 2 MiB on; advice only), freed with free(): a
 * buffer read as a checkpoint's map is (format/safetensors.c). */
#define HI3_HUGE_PAGE ((size_t)2 << 20)
void *hi3i_huge_alloc(size_t n, hi3_error *err);
char *hi3i_strdup(const char *s);
/* printf into a fresh heap string. */
char *hi3i_asprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Fault injection for the crash tests (decode, diffusion-capture):
 * HI3_TEST_KILL_AT=S:C in the environment makes the process kill itself
 * with SIGKILL when it reaches the point (step S, sub-point C) of its stage;
 * each stage says what its points are. */
void hi3i_test_kill_point(long long step, long long sub);

/* 64-bit FNV-1a, continued from h (start with HI3_HASH_INIT). */
#define HI3_HASH_INIT 0xcbf29ce484222325ULL
uint64_t hi3i_hash(uint64_t h, const void *data, size_t n);

/* Read a whole file ("-" = stdin) into a NUL-terminated heap buffer. */
int hi3i_read_file(const char *path, char **out, size_t *len, hi3_error *err);
/* Write buf to path atomically (temporary name + rename); "-" = stdout. */
int hi3i_write_file(const char *path, const void *buf, size_t len, hi3_error *err);
/* Create a temporary file beside path; returns fd, fills tmp (heap). */
int hi3i_tmpfile_for(const char *path, char **tmp, hi3_error *err);
/* fsync, chmod to 0666 & ~umask, rename tmp to path. Closes fd. */
int hi3i_commit_tmpfile(int fd, const char *tmp, const char *path, hi3_error *err);

/* root (consumed) as JSON text with json_dumps flags and JSON_PRESERVE_ORDER,
 * ending in a newline, into *text (malloc'd). */
struct json_t;
int hi3i_json_text(struct json_t *root, size_t flags, char **text, size_t *len, hi3_error *err);

/* A fresh directory $TMPDIR/name.XXXXXX (heap string), and the removal of
 * a directory tree (0, or -1 with errno). */
char *hi3i_mkdtemp(const char *name, hi3_error *err);
int hi3i_rmtree(const char *path);

/* out (n) = hi3_normal(seed, stream, 0 .. n - 1) (philox.c). */
void hi3i_normals(uint64_t seed, uint64_t stream, size_t n, float *out);

/* Monotonic seconds. */
double hi3i_now(void);

/* Strict number parsing: whole string, range checked. */
int hi3i_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);
int hi3i_parse_f64(const char *s, double *out);

/* Sizes that come from a file (shapes, counts, lengths, B * L, L + max_new,
 * vocab x hidden): a * b or a + b in int64, 0 with *out set, or -1 (*out
 * untouched) when an operand is negative or the result exceeds limit
 * (INT64_MAX for no bound beyond the type). size.c. */
int hi3i_mul_size(int64_t a, int64_t b, int64_t limit, int64_t *out);
int hi3i_add_size(int64_t a, int64_t b, int64_t limit, int64_t *out);
/* Bytes of a tensor of elem-byte elements: 0 for a shape with a zero
 * dimension; -1 when a dimension is negative or the non-zero ones times
 * elem exceed INT64_MAX. */
int hi3i_shape_bytes(int ndim, const int64_t *shape, int64_t elem, int64_t *nbytes);

/* How many elements of a float array are NaN or infinite (0 for integer dtypes). */
int64_t hi3i_count_nonfinite(const void *data, hi3_dtype dt, size_t n);

#endif
