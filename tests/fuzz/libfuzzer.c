/* libfuzzer.c -- the libFuzzer entry points of tests/fuzz/hi3-fuzz: the
 * harness is named by HI3_FUZZ_TARGET (fuzz.h, docs/FUZZING.md). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include "fuzz/fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct fuzz_target *target;

static void quiet(int level, const char *msg, void *ctx)
{
	(void)level, (void)msg, (void)ctx;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *name = getenv("HI3_FUZZ_TARGET");

	(void)argc, (void)argv;
	target = fuzz_find(name);
	if (!target) {
		fprintf(stderr, "hi3-fuzz: set HI3_FUZZ_TARGET to one of:");
		for (struct fuzz_target *t = fuzz_targets(); t; t = t->next)
			fprintf(stderr, " %s", t->name);
		fprintf(stderr, "%s%s%s\n", name ? " (not '" : "", name ? name : "", name ? "')" : "");
		exit(2);
	}
	omp_set_num_threads(1);
	hi3_set_log(quiet, NULL, HI3_LOG_ERROR);
	if (target->init && target->init() != 0) {
		fprintf(stderr, "hi3-fuzz: %s: setup failed\n", target->name);
		exit(1);
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	target->one(data, size);
	return 0;
}
