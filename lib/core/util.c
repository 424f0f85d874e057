/* util.c -- whole-file I/O, atomic replacement, strict number parsing. */
#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <time.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/internal.h"

int hi3i_name_index(const char *const *names, const char *name)
{
	for (int i = 0; name && names[i]; i++)
		if (!strcmp(name, names[i]))
			return i;
	return -1;
}

int hi3i_read_file(const char *path, char **out, size_t *len, hi3_error *err)
{
	FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
	size_t cap = 1 << 16, n = 0;
	char *buf = NULL;

	*out = NULL;
	if (!f)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
	buf = malloc(cap);
	while (buf) {
		size_t got = fread(buf + n, 1, cap - n - 1, f);

		n += got;
		if (n + 1 < cap)
			break;
		char *nb = realloc(buf, cap * 2);
		if (!nb) {
			free(buf);
			buf = NULL;
			break;
		}
		buf = nb;
		cap *= 2;
	}
	if (!buf) {
		if (f != stdin)
			fclose(f);
		return hi3_error_set(err, HI3_ERR_RUNTIME, "%s: out of memory reading the file", path);
	}
	if (ferror(f)) {
		int e = errno;
		free(buf);
		if (f != stdin)
			fclose(f);
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: read error: %s", path, strerror(e));
	}
	if (f != stdin)
		fclose(f);
	buf[n] = '\0';
	*out = buf;
	if (len)
		*len = n;
	return 0;
}

int hi3i_tmpfile_for(const char *path, char **tmp, hi3_error *err)
{
	char *t = hi3i_asprintf("%s.tmp.XXXXXX", path);
	int fd;

	*tmp = NULL;
	if (!t)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	fd = mkstemp(t);
	if (fd < 0) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot create a temporary file beside it: %s",
		              path, strerror(errno));
		free(t);
		return -1;
	}
	*tmp = t;
	return fd;
}

int hi3i_commit_tmpfile(int fd, const char *tmp, const char *path, hi3_error *err)
{
	mode_t mask = umask(0);

	umask(mask);
	if (fchmod(fd, 0666 & ~mask) != 0 || fsync(fd) != 0) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot finish writing: %s", path, strerror(errno));
		close(fd);
		unlink(tmp);
		return -1;
	}
	if (close(fd) != 0) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot finish writing: %s", path, strerror(errno));
		unlink(tmp);
		return -1;
	}
	if (rename(tmp, path) != 0) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot rename the temporary file into place: %s",
		              path, strerror(errno));
		unlink(tmp);
		return -1;
	}
	return 0;
}

static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t w = write(fd, p, len);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p += w;
		len -= (size_t)w;
	}
	return 0;
}

int hi3i_write_file(const char *path, const void *buf, size_t len, hi3_error *err)
{
	char *tmp;
	int fd, rc;

	if (!strcmp(path, "-")) {
		if (write_all(STDOUT_FILENO, buf, len) != 0)
			return hi3_error_set(err, HI3_ERR_RUNTIME, "standard output: write error: %s",
			                     strerror(errno));
		return 0;
	}
	fd = hi3i_tmpfile_for(path, &tmp, err);
	if (fd < 0)
		return -1;
	if (write_all(fd, buf, len) != 0) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "%s: write error: %s", path, strerror(errno));
		close(fd);
		unlink(tmp);
		free(tmp);
		return -1;
	}
	rc = hi3i_commit_tmpfile(fd, tmp, path, err);
	free(tmp);
	return rc;
}

int hi3i_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
	char *end;
	long long v;

	if (!s || !*s)
		return -1;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno || *end || end == s || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

int hi3i_parse_f64(const char *s, double *out)
{
	char *end;
	double v;

	if (!s || !*s)
		return -1;
	errno = 0;
	v = strtod(s, &end);
	if (errno || *end || end == s || !isfinite(v))
		return -1;
	*out = v;
	return 0;
}

void hi3i_test_kill_point(long long step, long long sub)
{
	static int parsed;
	static long long at_step = -1, at_sub = 0;
	const char *v;

	if (!parsed) {
		parsed = 1;
		v = getenv("HI3_TEST_KILL_AT");
		if (v && sscanf(v, "%lld:%lld", &at_step, &at_sub) < 1)
			at_step = -1;
	}
	if (at_step == step && at_sub == sub)
		raise(SIGKILL);
}

double hi3i_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int hi3i_json_text(json_t *root, size_t flags, char **text, size_t *len, hi3_error *err)
{
	char *t = root ? json_dumps(root, flags | JSON_PRESERVE_ORDER) : NULL;
	size_t n = t ? strlen(t) : 0;

	json_decref(root);
	*text = NULL;
	if (!t || !(*text = realloc(t, n + 2))) {
		free(t);
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	}
	(*text)[n] = '\n';
	(*text)[n + 1] = '\0';
	if (len)
		*len = n + 1;
	return 0;
}

static int rm_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
	(void)sb;
	(void)ftw;
	return (type == FTW_DP ? rmdir(path) : unlink(path)) != 0 && errno != ENOENT ? -1 : 0;
}

int hi3i_rmtree(const char *path)
{
	return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT ? -1 : 0;
}

char *hi3i_mkdtemp(const char *name, hi3_error *err)
{
	const char *tmp = getenv("TMPDIR");
	char *dir = hi3i_asprintf("%s/%s.XXXXXX", tmp && *tmp ? tmp : "/tmp", name);

	if (!dir) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		return NULL;
	}
	if (!mkdtemp(dir)) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot create a temporary directory: %s", dir, strerror(errno));
		free(dir);
		return NULL;
	}
	return dir;
}
