/* err.c -- error values, the log hook, and small allocation helpers. */
#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include "core/internal.h"

int hi3_error_set(hi3_error *err, int status, const char *fmt, ...)
{
	va_list ap;

	if (!err)
		return -1;
	err->status = status;
	va_start(ap, fmt);
	vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
	va_end(ap);
	return -1;
}

int hi3_error_prefix(hi3_error *err, const char *fmt, ...)
{
	char prefix[512], old[sizeof(err->msg)];
	va_list ap;

	if (!err)
		return -1;
	va_start(ap, fmt);
	vsnprintf(prefix, sizeof(prefix), fmt, ap);
	va_end(ap);
	memcpy(old, err->msg, sizeof(old));
	/* keep the tail of a long message rather than warn about truncation */
	{
		size_t np = strlen(prefix);
		if (np + 2 < sizeof(err->msg)) {
			memcpy(err->msg, prefix, np);
			memcpy(err->msg + np, ": ", 2);
			snprintf(err->msg + np + 2, sizeof(err->msg) - np - 2, "%.*s",
			         (int)(sizeof(err->msg) - np - 3), old);
		}
	}
	if (!err->status)
		err->status = HI3_ERR_RUNTIME;
	return -1;
}

static void default_log(int level, const char *msg, void *ctx)
{
	static const char *const tag[] = {"error: ", "warning: ", "", ""};

	(void)ctx;
	fprintf(stderr, "hi3: %s%s\n", tag[level], msg);
}

static hi3_log_fn log_fn = default_log;
static void *log_ctx;
static int log_max = HI3_LOG_INFO;

void hi3_set_log(hi3_log_fn fn, void *ctx, int max_level)
{
	log_fn = fn ? fn : default_log;
	log_ctx = ctx;
	log_max = max_level;
}

void hi3_log(int level, const char *fmt, ...)
{
	char buf[2048];
	va_list ap;

	if (level > log_max)
		return;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	log_fn(level, buf, log_ctx);
}

_Noreturn void hi3i_assert_fail(const char *what, const char *file, int line)
{
	fprintf(stderr, "hi3: internal error: %s:%d: assertion '%s' failed\n", file, line, what);
	abort();
}

void *hi3i_malloc(size_t n, hi3_error *err)
{
	void *p = malloc(n ? n : 1);

	if (!p)
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory allocating %zu bytes", n);
	return p;
}

void *hi3i_calloc(size_t count, size_t size, hi3_error *err)
{
	void *p = calloc(count ? count : 1, size ? size : 1);

	if (!p)
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory allocating %zu x %zu bytes", count, size);
	return p;
}

void *hi3i_aligned_alloc(size_t n, hi3_error *err)
{
	void *p = NULL;

	if (posix_memalign(&p, 64, n ? n : 64) != 0) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory allocating %zu bytes", n);
		return NULL;
	}
	return p;
}

void *hi3i_huge_alloc(size_t n, hi3_error *err)
{
	void *p = NULL;

	if (posix_memalign(&p, HI3_HUGE_PAGE, n ? n : 64) != 0) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory allocating %zu bytes", n);
		return NULL;
	}
#ifdef MADV_HUGEPAGE
	if (n >= HI3_HUGE_PAGE)
		(void)madvise(p, n, MADV_HUGEPAGE);
#endif
	return p;
}

char *hi3i_strdup(const char *s)
{
	return s ? strdup(s) : NULL;
}

char *hi3i_asprintf(const char *fmt, ...)
{
	va_list ap;
	char *s = NULL;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&s, fmt, ap);
	va_end(ap);
	return n < 0 ? NULL : s;
}

uint64_t hi3i_hash(uint64_t h, const void *data, size_t n)
{
	const unsigned char *p = data;

	for (size_t i = 0; i < n; i++) {
		h ^= p[i];
		h *= 0x100000001b3ULL;
	}
	return h;
}
