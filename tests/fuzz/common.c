/* common.c -- what the fuzz harnesses share (fuzz.h): the target list, the
 * checks, a scratch directory and a tiny model made once per process. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/internal.h"
#include "fuzz/fuzz.h"

#ifndef HI3_FUZZ_SRCDIR
#define HI3_FUZZ_SRCDIR "."
#endif

static struct fuzz_target *targets;

void fuzz_register(struct fuzz_target *t)
{
	struct fuzz_target **p = &targets;

	while (*p && strcmp((*p)->name, t->name) < 0)
		p = &(*p)->next;
	t->next = *p;
	*p = t;
}

struct fuzz_target *fuzz_targets(void)
{
	return targets;
}

struct fuzz_target *fuzz_find(const char *name)
{
	for (struct fuzz_target *t = targets; t; t = t->next)
		if (name && !strcmp(t->name, name))
			return t;
	return NULL;
}

_Noreturn void fuzz_fail(const char *file, int line, const char *what, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "fuzz: %s:%d: check '%s' failed: ", file, line, what);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	abort();
}

void fuzz_check_status(int rc, const hi3_error *err, const char *call)
{
	FUZZ_CHECK(rc == 0 || rc == -1, "%s returned %d", call, rc);
	if (rc == 0)
		return;
	FUZZ_CHECK(err->status >= HI3_ERR_RUNTIME && err->status <= HI3_ERR_INPUT, "%s failed with status %d: %s",
	           call, err->status, err->msg);
	FUZZ_CHECK(err->msg[0] != '\0', "%s failed with an empty message", call);
	FUZZ_CHECK(memchr(err->msg, '\0', sizeof(err->msg)) != NULL, "%s: message not terminated", call);
}

const char *fuzz_srcdir(void)
{
	const char *s = getenv("SRCDIR");

	return s && *s ? s : HI3_FUZZ_SRCDIR;
}

/* ------------------------------------------------------------ scratch */

static char scratch[256];

static void remove_scratch(void)
{
	char cmd[300];

	if (!scratch[0])
		return;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", scratch);
	if (system(cmd) != 0)
		fprintf(stderr, "fuzz: could not remove %s\n", scratch);
	scratch[0] = '\0';
}

const char *fuzz_path(const char *name)
{
	static char buf[4][512];
	static int next;
	char *p = buf[next++ % 4];

	if (!scratch[0]) {
		/* memory-backed when there is /dev/shm: a harness writes a file per input */
		const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
		snprintf(scratch, sizeof(scratch), "%s/hi3-fuzz.XXXXXX", base);
		if (!mkdtemp(scratch)) {
			fprintf(stderr, "fuzz: cannot make a scratch directory in %s: %s\n", base, strerror(errno));
			abort();
		}
		atexit(remove_scratch);
	}
	snprintf(p, sizeof(buf[0]), "%s/%s", scratch, name);
	return p;
}

const char *fuzz_write(const char *name, const void *data, size_t size)
{
	const char *path = fuzz_path(name);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	const char *p = data;

	if (fd < 0) {
		fprintf(stderr, "fuzz: cannot write %s: %s\n", path, strerror(errno));
		abort();
	}
	while (size) {
		ssize_t w = write(fd, p, size);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			fprintf(stderr, "fuzz: cannot write %s: %s\n", path, strerror(errno));
			abort();
		}
		p += w;
		size -= (size_t)w;
	}
	close(fd);
	return path;
}

/* -------------------------------------------------------------- model */

const char *fuzz_model_dir(void)
{
	static char dir[512];

	if (!dir[0]) {
		hi3_init_opts io = {.preset = "tiny-moe", .seed = 1, .dtype = HI3_F32};
		hi3_error err = {0};

		snprintf(dir, sizeof(dir), "%s", fuzz_path("model"));
		if (hi3_init_model(dir, &io, &err) != 0) {
			fprintf(stderr, "fuzz: init-model: %s\n", err.msg);
			abort();
		}
	}
	return dir;
}

hi3_model *fuzz_model(void)
{
	static hi3_model *m;

	if (!m) {
		hi3_error err = {0};

		if (hi3_model_open(&m, fuzz_model_dir(), NULL, &err) != 0) {
			fprintf(stderr, "fuzz: model open: %s\n", err.msg);
			abort();
		}
	}
	return m;
}

/* --------------------------------------------------------- conditions */

/* The tensors two conditions must share to be the same file's. */
static void same_cond(const hi3_cond *a, const hi3_cond *b)
{
	size_t bl = (size_t)a->B * a->L;

	FUZZ_CHECK(a->B == b->B && a->L == b->L && a->S == b->S && a->NS == b->NS && a->K == b->K &&
	           a->pad_id == b->pad_id, "reopened: B %d/%d, L %d/%d, S %d/%d, NS %d/%d, K %d/%d", a->B, b->B, a->L,
	           b->L, a->S, b->S, a->NS, b->NS, a->K, b->K);
	FUZZ_CHECK(!memcmp(a->input_ids, b->input_ids, bl * 8) && !memcmp(a->position_ids, b->position_ids, bl * 8) &&
	           !memcmp(a->rope_pos, b->rope_pos, bl * 8) && !memcmp(a->real_pos, b->real_pos, (size_t)a->B * 8) &&
	           !memcmp(a->seeds, b->seeds, (size_t)a->B * 8) &&
	           !memcmp(a->image_blocks, b->image_blocks, (size_t)a->B * a->S * 8) &&
	           !memcmp(a->stop_tokens, b->stop_tokens, (size_t)a->B * a->NS * 8), "reopened tensors differ");
	FUZZ_CHECK(!strcmp(a->mode, b->mode) && !strcmp(a->template_name, b->template_name) &&
	           !strcmp(a->requests, b->requests), "reopened metadata differ");
}

void fuzz_cond_round_trip(const hi3_cond *c)
{
	const char *path = fuzz_path("cond.safetensors");
	hi3_error err = {0};
	hi3_cond *back = NULL, *sel = NULL, *cat = NULL;
	const hi3_cond *two[2] = {c, c};
	int row = 0, rc;

	rc = hi3_cond_write(c, path, &err);
	FUZZ_CHECK(rc == 0, "hi3_cond_write: %s", err.msg);
	rc = hi3_cond_open(&back, path, &err);
	FUZZ_CHECK(rc == 0, "conditions hi3 wrote do not reopen: %s", err.msg);
	same_cond(c, back);
	rc = hi3_cond_select(&sel, back, &row, 1, 0, &err);
	fuzz_check_status(rc, &err, "hi3_cond_select");
	FUZZ_CHECK(rc != 0 || (sel->B == 1 && sel->L == c->real_pos[0]), "select of row 0");
	rc = hi3_cond_concat(&cat, two, 2, 0, &err);
	fuzz_check_status(rc, &err, "hi3_cond_concat");
	FUZZ_CHECK(rc != 0 || (cat->B == 2 * c->B && cat->L == c->L), "concat of two copies");
	if (rc == 0) {
		rc = hi3_cond_write(cat, path, &err);
		FUZZ_CHECK(rc == 0, "hi3_cond_write of merged conditions: %s", err.msg);
		hi3_cond_close(back);
		back = NULL;
		rc = hi3_cond_open(&back, path, &err);
		FUZZ_CHECK(rc == 0, "merged conditions hi3 wrote do not reopen: %s", err.msg);
		same_cond(cat, back);
	}
	hi3_cond_close(cat);
	hi3_cond_close(sel);
	hi3_cond_close(back);
}
