/* cli.h -- what the subcommands share: global options, errors, progress. */
#ifndef HI3_CLI_H
#define HI3_CLI_H

#include <getopt.h>
#include <stdint.h>
#include "hi3.h"

/* Global options; accepted before the command name and after it. */
struct cli_globals {
	const char *model_dir;   /* -m/--model */
	const char *backend;     /* --backend */
	int threads;             /* -t/--threads */
	int quiet, verbose;      /* -q, -v */
	int batch_invariant;     /* --batch-invariant=on|off (default on) */
	const char *cmd;         /* the running command's name */
};
extern struct cli_globals cli;

enum {
	CLI_OPT_BACKEND = 0x1000,
	CLI_OPT_BATCH_INVARIANT,
	CLI_OPT_FIRST_LOCAL = 0x1100,  /* commands number their long-only options from here */
};

#define CLI_GLOBAL_SHORT "m:t:qvh"
#define CLI_GLOBAL_LONGOPTS                                      \
	{"model", required_argument, NULL, 'm'},                 \
	{"backend", required_argument, NULL, CLI_OPT_BACKEND},   \
	{"batch-invariant", required_argument, NULL, CLI_OPT_BATCH_INVARIANT}, \
	{"threads", required_argument, NULL, 't'},               \
	{"quiet", no_argument, NULL, 'q'},                       \
	{"verbose", no_argument, NULL, 'v'},                     \
	{"help", no_argument, NULL, 'h'}

/* A subcommand: its usage text is shown by --help and `hi3 help NAME`. */
struct cli_command {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
	const char *help;        /* full usage text; first line "usage: hi3 NAME ..." */
};

/* The command table lookup (hi3.c). */
const struct cli_command *cli_find_command(const char *name);

/* The default branch of a command's getopt loop: handles the global
 * options and -h. Returns -1 to go on parsing, or the exit status the
 * command should return now (0 after --help, 2 after a bad option):
 *     default: if ((rc = cli_other_option(c, optarg)) >= 0) return rc;   */
int cli_other_option(int c, const char *arg);
/* Parse the common getopt loop errors: prints and returns exit status 2. */
int cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print an hi3_error and return its exit status. */
int cli_fail(const hi3_error *err);
void cli_print_help(void);
void cli_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cli_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Strict option values: print a usage error naming the option on failure. */
int cli_int(const char *opt, const char *arg, int64_t lo, int64_t hi, int64_t *out);
int cli_double(const char *opt, const char *arg, double lo, double hi, double *out);
/* A comma-separated list of integers. Returns count or -1. */
int cli_int_list(const char *opt, const char *arg, int64_t lo, int64_t hi, int64_t *out, int max);

/* "f32" or "bf16" for an option (usage error otherwise). */
int cli_dtype(const char *opt, const char *arg, hi3_dtype *out);

/* Open the model named by -m (usage error when missing). */
int cli_open_model(hi3_model **m, hi3_error *err);
/* Open a conditions file, then the model; on failure nothing stays open. */
int cli_open_cond_model(const char *cond_path, hi3_cond **c, hi3_model **m, hi3_error *err);

/* Monotonic seconds. */
double cli_now(void);

/* Progress on stderr when it is a terminal and not quiet. */
void cli_progress(const char *what, int64_t done, int64_t total);
void cli_progress_end(void);

#endif
