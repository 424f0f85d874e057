/* testdir.c -- scratch directories for the C tests (see testdir.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "testdir.h"

char *testdir_new(const char *name)
{
	const char *tmp = getenv("TMPDIR");
	size_t n;
	char *dir;

	if (!tmp || !*tmp)
		tmp = "/tmp";
	n = strlen(tmp) + strlen(name) + sizeof("/hi3-.XXXXXX");
	dir = malloc(n);
	if (!dir) {
		printf("Bail out! testdir: out of memory\n");
		return NULL;
	}
	snprintf(dir, n, "%s/hi3-%s.XXXXXX", tmp, name);
	if (!mkdtemp(dir)) {
		printf("Bail out! testdir: mkdtemp %s: %s\n", dir, strerror(errno));
		free(dir);
		return NULL;
	}
	return dir;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	if (remove(path) != 0) {
		fprintf(stderr, "testdir: cannot remove %s: %s\n", path, strerror(errno));
		return -1;
	}
	return 0;
}

int testdir_rm(const char *path)
{
	struct stat st;

	if (lstat(path, &st) != 0)
		return errno == ENOENT ? 0 : -1;
	return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) == 0 ? 0 : -1;
}

void testdir_done(char *dir)
{
	const char *keep = getenv("HI3_KEEP");

	if (!dir)
		return;
	if (keep && !strcmp(keep, "1"))
		printf("# kept %s\n", dir);
	else
		testdir_rm(dir);
	free(dir);
}

static int copy_file(const char *from, const char *to)
{
	char buf[1 << 16];
	int in = open(from, O_RDONLY), out = -1, rc = -1;
	ssize_t n;

	if (in < 0 || (out = open(to, O_WRONLY | O_CREAT | O_EXCL, 0644)) < 0)
		goto out;
	while ((n = read(in, buf, sizeof(buf))) > 0) {
		for (ssize_t done = 0; done < n;) {
			ssize_t w = write(out, buf + done, (size_t)(n - done));
			if (w < 0)
				goto out;
			done += w;
		}
	}
	rc = n == 0 ? 0 : -1;
out:
	if (rc)
		fprintf(stderr, "testdir: cannot copy %s to %s: %s\n", from, to, strerror(errno));
	if (in >= 0)
		close(in);
	if (out >= 0 && close(out) != 0 && rc == 0) {
		fprintf(stderr, "testdir: cannot write %s: %s\n", to, strerror(errno));
		rc = -1;
	}
	return rc;
}

int testdir_copy(const char *from, const char *to)
{
	DIR *d;
	struct dirent *e;
	int rc = 0;

	if (testdir_rm(to) != 0 || mkdir(to, 0755) != 0 || !(d = opendir(from))) {
		fprintf(stderr, "testdir: cannot copy directory %s to %s: %s\n", from, to, strerror(errno));
		return -1;
	}
	while (rc == 0 && (e = readdir(d))) {
		size_t nf = strlen(from) + strlen(e->d_name) + 2, nt = strlen(to) + strlen(e->d_name) + 2;
		char *src = malloc(nf), *dst = malloc(nt);
		struct stat st;

		if (!src || !dst) {
			rc = -1;
		} else {
			snprintf(src, nf, "%s/%s", from, e->d_name);
			snprintf(dst, nt, "%s/%s", to, e->d_name);
			if (lstat(src, &st) != 0)
				rc = -1;
			else if (S_ISREG(st.st_mode))
				rc = copy_file(src, dst);
		}
		free(src);
		free(dst);
	}
	closedir(d);
	return rc;
}
