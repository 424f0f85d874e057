/*
 * cmd-run.c -- hi3 run: several stage commands in one process, the model
 * opened once.
 *
 * Each line of SCRIPT is one command in hi3's own syntax without the
 * program name ("prefill c.st -o kv.st --max-new 64"). Words are split as a
 * shell would split them, without its expansions: blanks separate words;
 * '...' quotes literally; "..." quotes with \" and \\ as escapes; a
 * backslash outside quotes takes the next character as it is; a word that
 * begins with # starts a comment to the end of the line. Blank lines and
 * comments are skipped.
 *
 * The global options given to run (before or after its name) hold for
 * every line; a line may add its own, for that line only. A command runs
 * exactly as `hi3 COMMAND ...` would, so its files are the same bytes;
 * the model it opens stays open (cli.keep_model) and the next command with
 * the same -m, --backend, -t and --batch-invariant uses it again. The first
 * command that fails ends the run with its exit status; its messages, like
 * every message of line N, start with "hi3 run: line N: " and its name.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "commands.h"

static const struct cli_help help = {
	.usage = {"hi3 run [-m MODEL] [SCRIPT]"},
	.description =
	"Run the commands of SCRIPT (default or '-': standard input), one per line in\n"
	"hi3's own syntax without the program name, in one process: the model is\n"
	"opened once, and every file a command writes is the one 'hi3 COMMAND ...'\n"
	"would write. Words are split like a shell's (blanks; '...'; \"...\" with \\\"\n"
	"and \\\\; a backslash escapes one character) with no expansions; '#' starts a\n"
	"comment. The global options of run apply to every line. The first failing\n"
	"command stops the run with its exit status; its messages name the line.\n",
	.footer = "Exit status: 0 when every command succeeded, else that of the first that failed;\n"
	          "2 for a line that is not a command (an unknown name, an unclosed quote).\n",
	.operands = "at most one SCRIPT", .min_operands = 0, .max_operands = 1,
};

/* A line: global options, then the command (operands counted by run). */
static const struct cli_help line_help = {
	.usage = {"[-m DIR] [--backend cpu|cuda] [-t N] [-q|-v] <command> [options] [args]"},
	.description = "A line of a script of 'hi3 run': a command as after 'hi3'.\n",
};

struct words {
	char **v;            /* v[0] is "run" (for the parse of a line's leading options), then the words */
	int n, cap;
};

static int push_word(struct words *w, char *word)
{
	if (w->n + 2 > w->cap) {
		int cap = w->cap ? 2 * w->cap : 16;
		char **v = realloc(w->v, (size_t)cap * sizeof(*v));
		if (!v)
			return -1;
		w->v = v;
		w->cap = cap;
	}
	w->v[w->n++] = word;
	w->v[w->n] = NULL;
	return 0;
}

/*
 * Split line into words, in place (the words point into line). Returns 0,
 * or -1 with *bad set to what is wrong with the line.
 */
static int split_words(char *line, struct words *w, const char **bad)
{
	static char run_name[] = "run";
	char *r = line, *o = line;

	w->n = 0;
	if (push_word(w, run_name) != 0) {
		*bad = "out of memory";
		return -1;
	}
	for (;;) {
		char *start, quote = 0;

		while (*r == ' ' || *r == '\t' || *r == '\n' || *r == '\r')
			r++;
		if (!*r || *r == '#')
			return 0;
		start = o;
		for (; *r; r++) {
			if (quote == '\'') {
				if (*r == '\'')
					quote = 0;
				else
					*o++ = *r;
			} else if (quote == '"') {
				if (*r == '"')
					quote = 0;
				else if (*r == '\\' && (r[1] == '"' || r[1] == '\\'))
					*o++ = *++r;
				else
					*o++ = *r;
			} else if (*r == '\'' || *r == '"') {
				quote = *r;
			} else if (*r == '\\') {
				if (!r[1] || r[1] == '\n') {
					*bad = "a backslash at the end of the line";
					return -1;
				}
				*o++ = *++r;
			} else if (*r == ' ' || *r == '\t' || *r == '\n' || *r == '\r') {
				break;
			} else {
				*o++ = *r;
			}
		}
		if (quote) {
			*bad = quote == '\'' ? "an unclosed ' quote" : "an unclosed \" quote";
			return -1;
		}
		if (*r)
			r++;
		/* o <= r - 1 here: the terminator does not overwrite unread text */
		*o++ = '\0';
		if (push_word(w, start) != 0) {
			*bad = "out of memory";
			return -1;
		}
	}
}

/* Library messages of line N carry its prefix, as the command's own do. */
static void run_log(int level, const char *msg, void *ctx)
{
	static const char *const tag[] = {"error: ", "warning: ", "", ""};

	(void)ctx;
	cli_message_prefix(stderr);
	fprintf(stderr, "%s%s\n", tag[level], msg);
}

int cmd_run(int argc, char **argv)
{
	struct cli_option options[] = {OPT_INCLUDE(cli_global_options), OPT_END()};
	const char *path;
	struct cli_globals saved;
	struct words w = {0};
	char *line = NULL, where[64];
	size_t cap = 0;
	long lineno = 0;
	FILE *f;
	int n, rc = 0;

	if ((argc = cli_parse_options(argc, argv, options, &help, 0)) < 0)
		return CLI_PARSE_STATUS(argc);
	path = argc > 0 ? argv[0] : "-";
	if (!strcmp(path, "-"))
		f = stdin;
	else if (!(f = fopen(path, "r"))) {
		fprintf(stderr, "hi3 run: error: cannot open '%s': %s\n", path, strerror(errno));
		return HI3_ERR_INPUT;
	}
	saved = cli;
	cli.keep_model = 1;
	saved.keep_model = 1;
	cli_log_to(run_log);
	while (getline(&line, &cap, f) != -1) {
		const struct cli_command *c;
		const char *bad = NULL;

		lineno++;
		snprintf(where, sizeof(where), "run: line %ld", lineno);
		if (split_words(line, &w, &bad) != 0) {
			fprintf(stderr, "hi3 %s: %s\n", where, bad);
			rc = HI3_ERR_USAGE;
			break;
		}
		if (w.n == 1)
			continue;
		cli_voice.where = where;
		cli_voice.cmd = NULL;
		/* global options before the command name, as after "hi3" */
		if ((n = cli_parse_options(w.n, w.v, options, &line_help, CLI_PARSE_STOP_AT_NON_OPTION)) < 0) {
			rc = CLI_PARSE_STATUS(n);
			if (rc)
				break;
			cli = saved;
			cli_log_to(run_log);
			continue;
		}
		if (n == 0) {
			fprintf(stderr, "hi3 %s: no command after the options\n", where);
			rc = HI3_ERR_USAGE;
			break;
		}
		if (!(c = cli_find_command(w.v[0])) || !strcmp(c->name, "run")) {
			if (c)
				fprintf(stderr, "hi3 %s: 'run' does not run inside run\n", where);
			else
				fprintf(stderr, "hi3 %s: '%s' is not a command (see 'hi3 --help')\n", where, w.v[0]);
			rc = HI3_ERR_USAGE;
			break;
		}
		cli_voice.cmd = c->name;
		rc = c->run(n, w.v);
		fflush(stdout);
		cli = saved;
		cli_log_to(run_log);
		if (rc != 0)
			break;
	}
	if (rc == 0 && ferror(f)) {
		fprintf(stderr, "hi3 run: error: reading '%s': %s\n", path, strerror(errno));
		rc = HI3_ERR_INPUT;
	}
	if (f != stdin)
		fclose(f);
	cli_release_model();
	cli.keep_model = 0;
	cli_log_to(NULL);
	free(line);
	free(w.v);
	return rc;
}
