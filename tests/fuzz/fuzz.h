/*
 * fuzz.h -- the fuzz harnesses of hi3 (docs/FUZZING.md).
 *
 * A harness is one file, tests/fuzz/fuzz-NAME.c, that ends with
 *
 *     HI3_FUZZ_TARGET(NAME, init, one);
 *
 * where init() runs once per process before any input (0 or -1; NULL for
 * none) and one(data, size) runs one input through a parser's public entry
 * points and checks more than "no crash" with FUZZ_CHECK. Adding a harness
 * is that file plus its name in FUZZ_HARNESSES in Makefile.am. The same
 * code is linked twice: into tests/fuzz/hi3-fuzz with libFuzzer
 * (configure --enable-fuzzing; libfuzzer.c), and into tests/fuzz/replay,
 * which `make check` runs over every committed input (replay.c).
 */
#ifndef HI3_FUZZ_H
#define HI3_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include "hi3.h"

struct fuzz_target {
	const char *name;
	int (*init)(void);
	void (*one)(const uint8_t *data, size_t size);
	struct fuzz_target *next;
};

void fuzz_register(struct fuzz_target *t);
/* The registered targets, in name order; NULL-terminated through next. */
struct fuzz_target *fuzz_targets(void);
struct fuzz_target *fuzz_find(const char *name);

#define HI3_FUZZ_TARGET(name_, init_, one_)                                          \
	static struct fuzz_target fuzz_target_##name_ = {#name_, init_, one_, NULL};   \
	__attribute__((constructor)) static void fuzz_register_##name_(void)            \
	{                                                                              \
		fuzz_register(&fuzz_target_##name_);                                  \
	}

/* A property of the code under test that failed: print it and abort, which
 * libFuzzer reports as a crash (and saves the input) and replay as a
 * failure of that input. */
#define FUZZ_CHECK(cond, ...)                                                       \
	do {                                                                        \
		if (!(cond))                                                        \
			fuzz_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);          \
	} while (0)
_Noreturn void fuzz_fail(const char *file, int line, const char *what, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* The error contract of libhi3 (hi3.h): a call that fails returns -1 with
 * a status in 1..3 and a non-empty message; one that succeeds returns 0. */
void fuzz_check_status(int rc, const hi3_error *err, const char *call);

/* The source tree ($SRCDIR, else the one this was built from). */
const char *fuzz_srcdir(void);
/* A path under a scratch directory of this process, removed at exit. */
const char *fuzz_path(const char *name);
/* Write data to fuzz_path(name) and return that path. */
const char *fuzz_write(const char *name, const void *data, size_t size);
/* A tiny-moe model made once per process with hi3_init_model (its
 * directory), and opened (NULL on failure). */
const char *fuzz_model_dir(void);
hi3_model *fuzz_model(void);
/* Conditions c written, reopened and compared; row 0 selected; c merged
 * with itself, written and reopened. */
void fuzz_cond_round_trip(const hi3_cond *c);

#endif
