/* cli.c -- global options, error reporting and progress for subcommands. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "cli.h"

struct cli_globals cli = {.backend = "cpu", .batch_invariant = 1};

void cli_print_help(void)
{
	const struct cli_command *c = cli_find_command(cli.cmd);

	if (c)
		fputs(c->help, stdout);
}

int cli_other_option(int c, const char *arg)
{
	int64_t v;

	switch (c) {
	case 'm':
		cli.model_dir = arg;
		return -1;
	case CLI_OPT_BACKEND:
		if (strcmp(arg, "cpu") && strcmp(arg, "cuda"))
			return cli_usage_error("--backend: expected 'cpu' or 'cuda', found '%s'", arg);
		cli.backend = arg;
		return -1;
	case CLI_OPT_BATCH_INVARIANT:
		if (strcmp(arg, "on") && strcmp(arg, "off"))
			return cli_usage_error("--batch-invariant: expected on or off, found '%s'", arg);
		cli.batch_invariant = !strcmp(arg, "on");
		return -1;
	case 't':
		if (cli_int("--threads", arg, 0, 4096, &v))
			return HI3_ERR_USAGE;
		cli.threads = (int)v;
		return -1;
	case 'q':
		cli.quiet = 1;
		cli.verbose = 0;
		hi3_set_log(NULL, NULL, HI3_LOG_WARN);
		return -1;
	case 'v':
		cli.verbose = 1;
		cli.quiet = 0;
		hi3_set_log(NULL, NULL, HI3_LOG_DEBUG);
		return -1;
	case 'h':
		cli_print_help();
		return 0;
	case '?':
		fprintf(stderr, "(see 'hi3 %s --help')\n", cli.cmd ? cli.cmd : "help");
		return HI3_ERR_USAGE;
	default:
		return cli_usage_error("unhandled option %d", c);
	}
}

int cli_usage_error(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "hi3 %s: ", cli.cmd ? cli.cmd : "");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n(see 'hi3 %s --help')\n", cli.cmd ? cli.cmd : "help");
	return HI3_ERR_USAGE;
}

int cli_fail(const hi3_error *err)
{
	fprintf(stderr, "hi3 %s: error: %s\n", cli.cmd ? cli.cmd : "", err->msg[0] ? err->msg : "failed");
	return err->status ? err->status : HI3_ERR_RUNTIME;
}

void cli_warn(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "hi3 %s: warning: ", cli.cmd ? cli.cmd : "");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

void cli_info(const char *fmt, ...)
{
	va_list ap;

	if (cli.quiet)
		return;
	fprintf(stderr, "hi3 %s: ", cli.cmd ? cli.cmd : "");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

int cli_int(const char *opt, const char *arg, int64_t lo, int64_t hi, int64_t *out)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(arg, &end, 10);
	if (!*arg || *end || errno) {
		cli_usage_error("%s: expected an integer, found '%s'", opt, arg);
		return -1;
	}
	if (v < lo || v > hi) {
		cli_usage_error("%s: %lld is out of range [%lld, %lld]", opt, v, (long long)lo, (long long)hi);
		return -1;
	}
	*out = v;
	return 0;
}

int cli_double(const char *opt, const char *arg, double lo, double hi, double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(arg, &end);
	if (!*arg || *end || errno || !isfinite(v)) {
		cli_usage_error("%s: expected a number, found '%s'", opt, arg);
		return -1;
	}
	if (v < lo || v > hi) {
		cli_usage_error("%s: %g is out of range [%g, %g]", opt, v, lo, hi);
		return -1;
	}
	*out = v;
	return 0;
}

int cli_int_list(const char *opt, const char *arg, int64_t lo, int64_t hi, int64_t *out, int max)
{
	char *copy = strdup(arg), *save = NULL, *tok;
	int n = 0;

	if (!copy)
		return -1;
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (n == max) {
			cli_usage_error("%s: more than %d values", opt, max);
			free(copy);
			return -1;
		}
		if (cli_int(opt, tok, lo, hi, &out[n]) != 0) {
			free(copy);
			return -1;
		}
		n++;
	}
	free(copy);
	if (n == 0) {
		cli_usage_error("%s: expected a comma-separated list, found '%s'", opt, arg);
		return -1;
	}
	return n;
}

int cli_dtype(const char *opt, const char *arg, hi3_dtype *out)
{
	if (!strcmp(arg, "f32"))
		*out = HI3_F32;
	else if (!strcmp(arg, "bf16"))
		*out = HI3_BF16;
	else
		return cli_usage_error("%s: expected f32 or bf16, found '%s'", opt, arg), -1;
	return 0;
}

int cli_open_cond_model(const char *cond_path, hi3_cond **c, hi3_model **m, hi3_error *err)
{
	*c = NULL;
	*m = NULL;
	if (hi3_cond_open(c, cond_path, err) != 0)
		return -1;
	if (cli_open_model(m, err) != 0) {
		hi3_cond_close(*c);
		*c = NULL;
		return -1;
	}
	return 0;
}

int cli_open_model(hi3_model **m, hi3_error *err)
{
	hi3_model_opts o = {.backend = cli.backend, .threads = cli.threads, .batch_invariant = cli.batch_invariant};

	if (!cli.model_dir) {
		hi3_error_set(err, HI3_ERR_USAGE, "no model: give -m DIR (a directory made by 'hi3 init-model' "
		              "or a Hugging Face checkpoint)");
		return -1;
	}
	return hi3_model_open(m, cli.model_dir, &o, err);
}

double cli_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int progress_shown;
static struct timespec progress_t0, progress_last;

void cli_progress(const char *what, int64_t done, int64_t total)
{
	struct timespec now;
	double el, since;
	int width = 30, fill;

	if (cli.quiet || !isatty(STDERR_FILENO))
		return;
	clock_gettime(CLOCK_MONOTONIC, &now);
	if (!progress_shown) {
		progress_t0 = now;
		progress_last.tv_sec = 0;
	}
	since = (double)(now.tv_sec - progress_last.tv_sec) + 1e-9 * (double)(now.tv_nsec - progress_last.tv_nsec);
	if (progress_shown && since < 0.1 && done < total)
		return;
	progress_last = now;
	progress_shown = 1;
	el = (double)(now.tv_sec - progress_t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - progress_t0.tv_nsec);
	fill = total > 0 ? (int)(width * done / total) : 0;
	fprintf(stderr, "\r%s [%.*s%*s] %lld/%lld %.1fs", what, fill, "==============================",
	        width - fill, "", (long long)done, (long long)total, el);
	fflush(stderr);
}

void cli_progress_end(void)
{
	if (progress_shown) {
		fputc('\n', stderr);
		progress_shown = 0;
	}
}
