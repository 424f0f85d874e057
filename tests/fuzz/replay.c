/* replay.c -- every committed fuzz input through its harness, as a TAP test
 * of the normal build (no libFuzzer): the crash inputs ever found,
 * tests/fuzz/crashes/TARGET/, and the seed corpora, tests/fuzz/corpus/TARGET/
 * (docs/FUZZING.md). Each input runs in a child process, so one that
 * crashes or fails a check is reported and the others still run.
 *
 *   replay                      every target, every committed input
 *   replay TARGET FILE...       these inputs through one target
 */
#include <dirent.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "core/internal.h"
#include "fuzz/fuzz.h"
#include "tap.h"

#define INPUT_TIMEOUT 120   /* seconds per input: a hang is a failure too */

static void quiet(int level, const char *msg, void *ctx)
{
	(void)level, (void)msg, (void)ctx;
}

/* Run one input in a child; 1 when it returned normally. */
static int run_one(struct fuzz_target *t, const char *path, char *why, size_t nwhy)
{
	char *data;
	size_t size;
	hi3_error err = {0};
	pid_t pid;
	int st;

	if (hi3i_read_file(path, &data, &size, &err) != 0) {
		snprintf(why, nwhy, "%.200s", err.msg);
		return 0;
	}
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		alarm(INPUT_TIMEOUT);
		t->one((const uint8_t *)data, size);
		_exit(0);
	}
	free(data);
	if (pid < 0 || waitpid(pid, &st, 0) != pid) {
		snprintf(why, nwhy, "cannot run a child process");
		return 0;
	}
	if (WIFSIGNALED(st))
		snprintf(why, nwhy, "killed by signal %d%s", WTERMSIG(st),
		         WTERMSIG(st) == SIGALRM ? " (timeout)" : "");
	else if (WEXITSTATUS(st))
		snprintf(why, nwhy, "exit status %d", WEXITSTATUS(st));
	return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every file of dir through t; the number of inputs. */
static int run_dir(struct fuzz_target *t, const char *dir, const char *label)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char **names = NULL;
	size_t n = 0, cap = 0;

	if (!d)
		return 0;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		if (n == cap) {
			char **nn = realloc(names, sizeof(*names) * (cap = cap ? 2 * cap : 64));
			if (!nn)
				break;
			names = nn;
		}
		names[n++] = hi3i_strdup(e->d_name);
	}
	closedir(d);
	if (n)
		qsort(names, n, sizeof(*names), by_name);
	for (size_t i = 0; i < n; i++) {
		char *path = hi3i_asprintf("%s/%s", dir, names[i]), why[256] = "";
		int good = run_one(t, path, why, sizeof(why));
		ok(good, "%s: %s/%s%s%s", t->name, label, names[i], *why ? ": " : "", why);
		free(path);
		free(names[i]);
	}
	free(names);
	return (int)n;
}

static int setup(struct fuzz_target *t)
{
	fuzz_path("");           /* the scratch directory belongs to this process, not a child */
	if (t->init && t->init() != 0)
		return ok(0, "%s: setup", t->name);
	diag("%s: %s", t->name, t->init ? "set up" : "nothing to set up");
	return 1;
}

int main(int argc, char **argv)
{
	omp_set_num_threads(1);
	hi3_set_log(quiet, NULL, HI3_LOG_ERROR);
	if (argc > 1) {
		struct fuzz_target *t = fuzz_find(argv[1]);
		if (!t) {
			fprintf(stderr, "usage: replay [TARGET FILE...]: no target '%s'\n", argv[1]);
			return 2;
		}
		if (setup(t))
			for (int i = 2; i < argc; i++) {
				char why[256] = "";
				int good = run_one(t, argv[i], why, sizeof(why));
				ok(good, "%s: %s%s%s", t->name, argv[i], *why ? ": " : "", why);
			}
		return done_testing();
	}
	for (struct fuzz_target *t = fuzz_targets(); t; t = t->next) {
		char *crashes = hi3i_asprintf("%s/tests/fuzz/crashes/%s", fuzz_srcdir(), t->name);
		char *corpus = hi3i_asprintf("%s/tests/fuzz/corpus/%s", fuzz_srcdir(), t->name);
		int n;

		if (setup(t)) {
			run_dir(t, crashes, "crashes");
			n = run_dir(t, corpus, "corpus");
			ok(n > 0, "%s: a seed corpus in tests/fuzz/corpus/%s (%d inputs)", t->name, t->name, n);
		}
		free(crashes);
		free(corpus);
	}
	return done_testing();
}
