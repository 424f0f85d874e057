/* parse-options.c -- option tables to getopt_long, values and help (parse-options.h). */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "message.h"
#include "parse-options.h"

#define MAX_OPTIONS 128         /* options of one table, includes expanded */
#define HELP_COL 24             /* the column the help text starts in */
#define HELP_WIDTH 80           /* help lines are shorter than this */
#define LONG_ONLY 0x100         /* getopt values of long-only options: LONG_ONLY + index */

/* A table that does not make sense is a bug in hi3, not a usage error. */
#define BUG_ON(cond, ...)                                                                          \
	do {                                                                                         \
		if (cond) {                                                                          \
			fprintf(stderr, "%s:%d: BUG: ", __FILE__, __LINE__);                         \
			fprintf(stderr, __VA_ARGS__);                                                \
			fputc('\n', stderr);                                                         \
			abort();                                                                     \
		}                                                                                    \
	} while (0)

/* The options of a table with its includes expanded, in order; an option
 * named again later (a command's own -m with its own help, then the
 * global one) is kept once, where it first stands. */
struct flat {
	const struct cli_option *o[MAX_OPTIONS];
	int n;
};

static int same_name(const struct cli_option *a, const struct cli_option *b)
{
	return (a->short_name && a->short_name == b->short_name) ||
	       (a->long_name && b->long_name && !strcmp(a->long_name, b->long_name));
}

static void check_option(const struct cli_option *o)
{
	const char *name = o->long_name ? o->long_name : "?";

	BUG_ON(!o->short_name && !o->long_name, "an option without a name");
	BUG_ON(o->short_name && (o->short_name < 0 || o->short_name >= LONG_ONLY || o->short_name == '?' ||
	                         o->short_name == ':'), "--%s: bad short name", name);
	switch (o->type) {
	case CLI_OPT_INT:
		BUG_ON(o->size != sizeof(int) && o->size != sizeof(int64_t), "--%s: an int or int64_t", name);
		BUG_ON(o->lo > o->hi, "--%s: empty range", name);
		BUG_ON(o->size == sizeof(int) && (o->lo < INT_MIN || o->hi > INT_MAX), "--%s: range wider than int",
		       name);
		BUG_ON(!o->argh, "--%s: no argument name", name);
		break;
	case CLI_OPT_DOUBLE:
		BUG_ON(!(o->dlo <= o->dhi), "--%s: empty range", name);
		BUG_ON(!o->argh, "--%s: no argument name", name);
		break;
	case CLI_OPT_STRING:
		BUG_ON(!o->argh, "--%s: no argument name", name);
		break;
	case CLI_OPT_CHOICE:
		BUG_ON(!o->choices || !o->choices[0].name, "--%s: no choices", name);
		BUG_ON(o->size != sizeof(int), "--%s: choices are stored in an int", name);
		break;
	case CLI_OPT_INT_LIST:
		BUG_ON(o->max < 1 || !o->count || !o->argh, "--%s: a list needs room, a count and a name", name);
		break;
	case CLI_OPT_CALLBACK:
		BUG_ON(!o->callback, "--%s: no callback", name);
		break;
	default:
		break;
	}
}

static void flatten(const struct cli_option *opts, struct flat *f)
{
	for (const struct cli_option *o = opts; o->type != CLI_OPT_END; o++) {
		int dup = 0;

		if (o->type == CLI_OPT_INCLUDE) {
			flatten(o->sub, f);
			continue;
		}
		if (o->type == CLI_OPT_GROUP)
			continue;
		check_option(o);
		for (int i = 0; i < f->n && !dup; i++) {
			if (!same_name(f->o[i], o))
				continue;
			BUG_ON(f->o[i]->short_name != o->short_name || f->o[i]->value != o->value ||
			       f->o[i]->type != o->type || (o->long_name == NULL) != (f->o[i]->long_name == NULL) ||
			       (o->long_name && strcmp(o->long_name, f->o[i]->long_name)),
			       "option '%s' defined twice, differently", o->long_name ? o->long_name : "?");
			dup = 1;
		}
		if (dup)
			continue;
		BUG_ON(f->n == MAX_OPTIONS, "more than %d options", MAX_OPTIONS);
		f->o[f->n++] = o;
	}
}

static int has_arg(const struct cli_option *o)
{
	switch (o->type) {
	case CLI_OPT_INT:
	case CLI_OPT_DOUBLE:
	case CLI_OPT_STRING:
	case CLI_OPT_CHOICE:
	case CLI_OPT_INT_LIST:
		return 1;
	case CLI_OPT_CALLBACK:
		return o->argh != NULL;
	default:
		return 0;
	}
}

/* The option as messages name it: --long, else -s. */
static const char *opt_name(const struct cli_option *o, char *buf, size_t n)
{
	if (o->long_name)
		snprintf(buf, n, "--%s", o->long_name);
	else
		snprintf(buf, n, "-%c", o->short_name);
	return buf;
}

/* ------------------------------------------------------------------ values */

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

static int parse_double(const char *opt, const char *arg, double lo, double hi, int lo_open, double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(arg, &end);
	if (!*arg || *end || errno || !isfinite(v)) {
		cli_usage_error("%s: expected a number, found '%s'", opt, arg);
		return -1;
	}
	if (v < lo || v > hi || (lo_open && v == lo)) {
		cli_usage_error("%s: %g is out of range %c%g, %g]", opt, v, lo_open ? '(' : '[', lo, hi);
		return -1;
	}
	*out = v;
	return 0;
}

int cli_double(const char *opt, const char *arg, double lo, double hi, double *out)
{
	return parse_double(opt, arg, lo, hi, 0, out);
}

static int int_list(const char *opt, const char *arg, int64_t lo, int64_t hi, int64_t *out, int max)
{
	char *copy = strdup(arg), *save = NULL, *tok;
	int n = 0;

	if (!copy) {
		cli_usage_error("%s: out of memory", opt);
		return -1;
	}
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

/* "a, b or c" into buf. */
static const char *choice_list(const struct cli_choice *c, const char *sep, const char *last, char *buf, size_t n)
{
	size_t off = 0;

	buf[0] = '\0';
	for (int i = 0; c[i].name && off < n; i++)
		off += (size_t)snprintf(buf + off, n - off, "%s%s", i == 0 ? "" : c[i + 1].name ? sep : last,
		                        c[i].name);
	return buf;
}

static const struct cli_choice *find_choice(const struct cli_option *o, const char *opt, const char *arg)
{
	char list[256];

	for (const struct cli_choice *c = o->choices; c->name; c++)
		if (!strcmp(c->name, arg))
			return c;
	cli_usage_error("%s: expected %s, found '%s'", opt, choice_list(o->choices, ", ", " or ", list, sizeof(list)),
	                arg);
	return NULL;
}

static int set_value(const struct cli_option *o, const char *arg)
{
	const struct cli_choice *c;
	char name[64];
	int64_t v;
	double d;
	int n;

	opt_name(o, name, sizeof(name));
	switch (o->type) {
	case CLI_OPT_FLAG:
		*(int *)o->value = o->defval;
		return 0;
	case CLI_OPT_INT:
		if (cli_int(name, arg, o->lo, o->hi, &v) != 0)
			return -1;
		if (o->size == sizeof(int))
			*(int *)o->value = (int)v;
		else
			*(int64_t *)o->value = v;
		return 0;
	case CLI_OPT_DOUBLE:
		if (parse_double(name, arg, o->dlo, o->dhi, (o->flags & CLI_OPT_LO_OPEN) != 0, &d) != 0)
			return -1;
		*(double *)o->value = d;
		return 0;
	case CLI_OPT_STRING:
		if (o->choices && !find_choice(o, name, arg))
			return -1;
		*(const char **)o->value = arg;
		return 0;
	case CLI_OPT_CHOICE:
		if (!(c = find_choice(o, name, arg)))
			return -1;
		*(int *)o->value = c->value;
		return 0;
	case CLI_OPT_INT_LIST:
		if ((n = int_list(name, arg, o->lo, o->hi, o->value, o->max)) < 0)
			return -1;
		*o->count = n;
		return 0;
	case CLI_OPT_CALLBACK:
		return o->callback(o, arg);
	default:
		BUG_ON(1, "%s: option type %d has no value", name, (int)o->type);
		return -1;
	}
}

/* After the parse: the warning of every choice that stands. */
static void warn_choices(const struct flat *f, const unsigned char *seen)
{
	for (int i = 0; i < f->n; i++) {
		const struct cli_option *o = f->o[i];
		if (!seen[i] || o->type != CLI_OPT_CHOICE)
			continue;
		for (const struct cli_choice *c = o->choices; c->name; c++)
			if (c->value == *(int *)o->value && c->warn) {
				cli_warn("%s", c->warn);
				break;
			}
	}
}

/* ------------------------------------------------------------------- parse */

static int find_short(const struct flat *f, int c)
{
	for (int i = 0; i < f->n; i++)
		if (f->o[i]->short_name == c)
			return i;
	return -1;
}

/* getopt's '?' and ':' into a message. */
static void getopt_error(const struct flat *f, int c, char **argv)
{
	int i = optopt >= LONG_ONLY ? optopt - LONG_ONLY : optopt ? find_short(f, optopt) : -1;
	const char *arg = argv[optind - 1];
	char name[64];

	if (i >= 0 && i < f->n) {
		opt_name(f->o[i], name, sizeof(name));
		if (c == ':')
			cli_usage_error("%s needs a value (%s)", name, f->o[i]->argh ? f->o[i]->argh : "?");
		else
			cli_usage_error("%s takes no value", name);
	} else if (optopt) {
		cli_usage_error("unknown option '-%c'", optopt);
	} else {
		size_t len = strcspn(arg, "="), off = 0;
		char which[256] = "";
		int matches = 0;
		/* getopt_long takes a unique prefix of a long option; say which ones a shared prefix names */
		for (int k = 0; len > 2 && !strncmp(arg, "--", 2) && k < f->n; k++)
			if (f->o[k]->long_name && !strncmp(f->o[k]->long_name, arg + 2, len - 2) && off < sizeof(which)) {
				off += (size_t)snprintf(which + off, sizeof(which) - off, "%s--%s", matches ? ", " : "",
				                        f->o[k]->long_name);
				matches++;
			}
		if (matches > 1)
			cli_usage_error("ambiguous option '%.*s' (%s)", (int)len, arg, which);
		else
			cli_usage_error("unknown option '%.*s'", (int)len, arg);
	}
}

int cli_parse_options(int argc, char **argv, const struct cli_option *opts, const struct cli_help *help,
                      unsigned flags)
{
	struct flat f = {.n = 0};
	struct option longopts[MAX_OPTIONS + 1];
	char shortopts[3 * MAX_OPTIONS + 3];
	unsigned char seen[MAX_OPTIONS] = {0};
	int nl = 0, ns = 0, c, n;

	flatten(opts, &f);
	if (flags & CLI_PARSE_STOP_AT_NON_OPTION)
		shortopts[ns++] = '+';
	shortopts[ns++] = ':';        /* a missing argument returns ':' */
	for (int i = 0; i < f.n; i++) {
		const struct cli_option *o = f.o[i];
		if (o->long_name)
			longopts[nl++] = (struct option){o->long_name, has_arg(o) ? required_argument : no_argument,
			                                 NULL, o->short_name ? o->short_name : LONG_ONLY + i};
		if (o->short_name) {
			shortopts[ns++] = (char)o->short_name;
			if (has_arg(o))
				shortopts[ns++] = ':';
		}
	}
	longopts[nl] = (struct option){NULL, 0, NULL, 0};
	shortopts[ns] = '\0';

	optind = 0;                   /* a fresh getopt for every parse */
	opterr = 0;
	while ((c = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
		int i = c >= LONG_ONLY ? c - LONG_ONLY : find_short(&f, c);
		const struct cli_option *o;

		if (c == '?' || c == ':' || i < 0 || i >= f.n) {
			getopt_error(&f, c, argv);
			return CLI_PARSE_ERROR;
		}
		o = f.o[i];
		if (o->type == CLI_OPT_HELP) {
			cli_usage_with_options(stdout, help, opts);
			return CLI_PARSE_HELP;
		}
		if (set_value(o, has_arg(o) ? optarg : NULL) != 0)
			return CLI_PARSE_ERROR;
		seen[i] = 1;
		if (o->given)
			(*o->given)++;
	}
	for (int i = 0; i < f.n; i++)
		if ((f.o[i]->flags & CLI_OPT_REQUIRED) && !seen[i]) {
			const struct cli_option *o = f.o[i];
			char name[64];
			if (o->short_name)
				snprintf(name, sizeof(name), "-%c", o->short_name);
			else
				opt_name(o, name, sizeof(name));
			cli_usage_error("%s%s%s is required", name, o->argh ? " " : "", o->argh ? o->argh : "");
			return CLI_PARSE_ERROR;
		}
	n = argc - optind;
	if (help->operands && n > 0 && help->max_operands == 0) {
		cli_usage_error("unexpected argument '%s'", argv[optind]);
		return CLI_PARSE_ERROR;
	}
	if (help->operands && (n < help->min_operands || (help->max_operands >= 0 && n > help->max_operands))) {
		cli_usage_error("expected %s, found %d argument%s", help->operands, n, n == 1 ? "" : "s");
		return CLI_PARSE_ERROR;
	}
	warn_choices(&f, seen);
	memmove(argv, argv + optind, (size_t)n * sizeof(*argv));
	argv[n] = NULL;
	return n;
}

/* -------------------------------------------------------------------- help */

/* Print text from column col (the cursor is there), wrapped to HELP_WIDTH,
 * continuation lines indented to indent. */
static void print_wrapped(FILE *f, const char *text, int col, int indent)
{
	const char *p = text;

	while (*p) {
		size_t word = strcspn(p, " "), len = word;
		if (col > indent && col + 1 + (int)len >= HELP_WIDTH) {
			fprintf(f, "\n%*s", indent, "");
			col = indent;
		} else if (col > indent) {
			fputc(' ', f);
			col++;
		}
		fwrite(p, 1, len, f);
		col += (int)len;
		p += word;
		while (*p == ' ')
			p++;
	}
	fputc('\n', f);
}

static void print_option(FILE *f, const struct cli_option *o)
{
	char list[256];
	const char *argh = o->argh;
	int col;

	if (o->type == CLI_OPT_CHOICE && !argh)
		argh = choice_list(o->choices, "|", "|", list, sizeof(list));
	if (o->short_name && o->long_name)
		col = fprintf(f, "  -%c, --%s", o->short_name, o->long_name);
	else if (o->short_name)
		col = fprintf(f, "  -%c", o->short_name);
	else
		col = fprintf(f, "      --%s", o->long_name);
	if (argh && has_arg(o))
		col += fprintf(f, " %s", argh);
	if (col + 2 > HELP_COL) {
		fputc('\n', f);
		col = 0;
	}
	fprintf(f, "%*s", HELP_COL - col, "");
	print_wrapped(f, o->help ? o->help : "", HELP_COL, HELP_COL);
}

static void print_table(FILE *f, const struct cli_option *opts, int *lines)
{
	for (const struct cli_option *o = opts; o->type != CLI_OPT_END; o++) {
		if (o->flags & CLI_OPT_HIDDEN)
			continue;
		if (o->type == CLI_OPT_INCLUDE) {
			print_table(f, o->sub, lines);
		} else if (o->type == CLI_OPT_GROUP) {
			if (*lines)
				fputc('\n', f);
			fprintf(f, "%s\n", o->help);
			*lines = 0;
		} else {
			print_option(f, o);
			(*lines)++;
		}
	}
}

void cli_print_options(FILE *f, const struct cli_option *opts)
{
	int lines = 0;

	print_table(f, opts, &lines);
}

void cli_print_usage(FILE *f, const struct cli_help *help)
{
	for (int i = 0; i < 4 && help->usage[i]; i++)
		fprintf(f, "%s%s\n", i ? "   or: " : "usage: ", help->usage[i]);
}

void cli_usage_with_options(FILE *f, const struct cli_help *help, const struct cli_option *opts)
{
	cli_print_usage(f, help);
	if (help->description)
		fprintf(f, "\n%s", help->description);
	if (help->more)
		help->more(f);
	fputc('\n', f);
	cli_print_options(f, opts);
	if (help->footer)
		fprintf(f, "\n%s", help->footer);
}
