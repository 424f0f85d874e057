/*
 * parse-options.h -- one table per command: its options, their values,
 * ranges and help, in the spirit of git's parse-options.h.
 *
 * A command lists its options once, as an array ended by OPT_END():
 *
 *	struct cli_option options[] = {
 *		OPT_GLOBALS(),
 *		OPT_GROUP("steps:"),
 *		OPT_INT('n', "max-new", &o.max_new, 1, 1 << 24, "N", "stop each row after N tokens"),
 *		OPT_FLAG(0, "resume", &resume, "continue an interrupted decode"),
 *		OPT_END(),
 *	};
 *	if ((argc = cli_parse_options(argc, argv, options, &help, 0)) < 0)
 *		return CLI_PARSE_STATUS(argc);
 *
 * The same table makes the getopt_long table, checks and stores every
 * value, and prints the help (`usage:` lines, the description, then one
 * line per option, under the group headings), so the help cannot drift
 * from what is parsed.
 *
 * Values are strict: a number is the whole argument, in its range, or the
 * parse fails with a message naming the option; so does an unknown option,
 * a missing argument, a value not in a choice list, a missing required
 * option and a wrong number of operands. Failures print a usage error and
 * end the parse with CLI_PARSE_ERROR (exit status 2).
 *
 * Every macro takes optional trailing designated initializers for the
 * fields it does not set, e.g. `.given = &n` (count the times the option
 * was given; options may share one counter) or `.flags = CLI_OPT_HIDDEN`.
 * This leans on a GNU C extension (an empty __VA_ARGS__, standard since
 * C23); hi3 builds as gnu11.
 */
#ifndef HI3_PARSE_OPTIONS_H
#define HI3_PARSE_OPTIONS_H

#include <stdint.h>
#include <stdio.h>

enum cli_opt_type {
	CLI_OPT_END,
	CLI_OPT_GROUP,       /* a heading in the help: help */
	CLI_OPT_INCLUDE,     /* the options of another table (sub), in place */
	CLI_OPT_HELP,        /* print the help; the parse returns CLI_PARSE_HELP */
	CLI_OPT_FLAG,        /* no argument: *(int *)value = defval */
	CLI_OPT_INT,         /* an integer in [lo, hi] into an int, int64_t or uint64_t */
	CLI_OPT_DOUBLE,      /* a finite number in [dlo, dhi] ((dlo, dhi] with CLI_OPT_LO_OPEN) */
	CLI_OPT_STRING,      /* *(const char **)value = the argument; one of choices when given */
	CLI_OPT_CHOICE,      /* one of choices: *(int *)value = its value */
	CLI_OPT_INT_LIST,    /* comma-separated integers in [lo, hi] into int64_t value[max] */
	CLI_OPT_CALLBACK,    /* callback(opt, arg); arg is NULL unless argh is set */
};

enum {
	CLI_OPT_HIDDEN = 1,      /* parsed, not shown in the help */
	CLI_OPT_LO_OPEN = 2,     /* CLI_OPT_DOUBLE: the lower bound itself is refused */
	CLI_OPT_REQUIRED = 4,    /* a parse without this option is a usage error */
};

/* A value of a choice list; lists end with {NULL}. */
struct cli_choice {
	const char *name;
	int value;
	const char *warn;        /* printed as a warning when a parse ends with this choice */
};

struct cli_option {
	enum cli_opt_type type;
	int short_name;              /* 0: none */
	const char *long_name;       /* NULL: none */
	void *value;
	size_t size;                 /* sizeof *value (CLI_OPT_INT) */
	const char *argh;            /* the argument's name in the help; NULL: no argument */
	const char *help;
	unsigned flags;              /* CLI_OPT_HIDDEN, CLI_OPT_LO_OPEN, CLI_OPT_REQUIRED */
	int *given;                  /* when set: incremented each time the option is given */
	int64_t lo, hi;              /* CLI_OPT_INT, CLI_OPT_INT_LIST */
	double dlo, dhi;             /* CLI_OPT_DOUBLE */
	int defval;                  /* CLI_OPT_FLAG */
	const struct cli_choice *choices;  /* CLI_OPT_CHOICE, CLI_OPT_STRING (optional) */
	int max, *count;             /* CLI_OPT_INT_LIST: room in value, values stored */
	int (*callback)(const struct cli_option *opt, const char *arg);  /* 0, or -1 after a usage error */
	const struct cli_option *sub;      /* CLI_OPT_INCLUDE */
};

/* What the help prints around the options, and the operands the parse takes. */
struct cli_help {
	const char *usage[4];        /* "hi3 NAME ..." lines, NULL-terminated: "usage: " the first,
	                              * "   or: " the others */
	const char *description;     /* printed after a blank line, as is */
	void (*more)(FILE *f);       /* optional: prints after the description */
	const char *footer;          /* optional: printed after the options, after a blank line */
	const char *operands;        /* what they are, for the error ("COND and KV"); NULL: the command counts */
	int min_operands, max_operands;  /* with operands: how many (max -1: any number) */
};

#define OPT_END()              {.type = CLI_OPT_END}
#define OPT_GROUP(h)           {.type = CLI_OPT_GROUP, .help = (h)}
#define OPT_INCLUDE(t, ...)    {.type = CLI_OPT_INCLUDE, .sub = (t), __VA_ARGS__}
#define OPT_HELP(s, l, h)      {.type = CLI_OPT_HELP, .short_name = (s), .long_name = (l), .help = (h)}
#define OPT_SET_INT(s, l, v, i, h, ...) \
	{.type = CLI_OPT_FLAG, .short_name = (s), .long_name = (l), .value = _Generic((v), int *: (v)), \
	 .defval = (i), .help = (h), __VA_ARGS__}
#define OPT_FLAG(s, l, v, h, ...) OPT_SET_INT(s, l, v, 1, h, __VA_ARGS__)
#define OPT_INT(s, l, v, lo_, hi_, a, h, ...) \
	{.type = CLI_OPT_INT, .short_name = (s), .long_name = (l), \
	 .value = _Generic((v), int *: (v), int64_t *: (v), uint64_t *: (v)), .size = sizeof(*(v)), \
	 .lo = (lo_), .hi = (hi_), .argh = (a), .help = (h), __VA_ARGS__}
#define OPT_DOUBLE(s, l, v, lo_, hi_, a, h, ...) \
	{.type = CLI_OPT_DOUBLE, .short_name = (s), .long_name = (l), .value = _Generic((v), double *: (v)), \
	 .dlo = (lo_), .dhi = (hi_), .argh = (a), .help = (h), __VA_ARGS__}
#define OPT_STRING(s, l, v, a, h, ...) \
	{.type = CLI_OPT_STRING, .short_name = (s), .long_name = (l), .value = _Generic((v), const char **: (v)), \
	 .argh = (a), .help = (h), __VA_ARGS__}
/* The argument's name in the help is the choices joined by '|'. */
#define OPT_CHOICE(s, l, v, list, h, ...) \
	{.type = CLI_OPT_CHOICE, .short_name = (s), .long_name = (l), .value = _Generic((v), int *: (v)), \
	 .size = sizeof(*(v)), .choices = (list), .help = (h), __VA_ARGS__}
/* arr is an int64_t array (not a pointer): its size is the most values taken. */
#define OPT_INT_LIST(s, l, arr, n, lo_, hi_, a, h, ...) \
	{.type = CLI_OPT_INT_LIST, .short_name = (s), .long_name = (l), \
	 .value = _Generic(&(arr)[0], int64_t *: (arr)), .max = (int)(sizeof(arr) / sizeof((arr)[0])), \
	 .count = _Generic((n), int *: (n)), .lo = (lo_), .hi = (hi_), .argh = (a), .help = (h), __VA_ARGS__}
/* a: the argument's name, or NULL for an option without one. */
#define OPT_CALLBACK(s, l, v, a, fn, h, ...) \
	{.type = CLI_OPT_CALLBACK, .short_name = (s), .long_name = (l), .value = (v), .argh = (a), .callback = (fn), \
	 .help = (h), __VA_ARGS__}

/* What cli_parse_options returns when the command must stop now. */
#define CLI_PARSE_HELP  (-1)     /* -h: the help was printed */
#define CLI_PARSE_ERROR (-2)     /* a usage error was printed */
/* The exit status for such a return: 0 after the help, 2 after an error. */
#define CLI_PARSE_STATUS(n) ((n) == CLI_PARSE_HELP ? 0 : 2)

/* Flags of cli_parse_options. */
enum {
	CLI_PARSE_STOP_AT_NON_OPTION = 1,    /* the first operand ends the options (hi3's own) */
};

/*
 * Parse the options in argv[1..argc) by the table opts; argv[0] is the
 * command's name. Returns the number of operands, moved to argv[0..n)
 * (argv[n] = NULL), or CLI_PARSE_HELP or CLI_PARSE_ERROR.
 */
int cli_parse_options(int argc, char **argv, const struct cli_option *opts, const struct cli_help *help,
                      unsigned flags);

/* Print the help: usage lines, description, options by group, footer. */
void cli_usage_with_options(FILE *f, const struct cli_help *help, const struct cli_option *opts);
/* Only the option lines (as the help shows them). */
void cli_print_options(FILE *f, const struct cli_option *opts);
/* Only the usage lines ("usage: ...", "   or: ..."). */
void cli_print_usage(FILE *f, const struct cli_help *help);

/* Strict values, for callbacks: a usage error naming opt on failure (-1). */
int cli_int(const char *opt, const char *arg, int64_t lo, int64_t hi, int64_t *out);
int cli_double(const char *opt, const char *arg, double lo, double hi, double *out);

#endif
