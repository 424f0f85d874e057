/* test-parse-options.c -- bin/parse-options.c: values, ranges, choices, lists,
 * flags, the errors that end a parse with status 2, and the generated help. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "parse-options.h"
#include "tap.h"

/* ---- capture what a call writes to stdout or stderr */

struct capture {
	int fd, saved;
	FILE *tmp;
};

static void capture_begin(struct capture *c, int fd)
{
	fflush(NULL);
	c->fd = fd;
	c->tmp = tmpfile();
	c->saved = dup(fd);
	if (!c->tmp || c->saved < 0 || dup2(fileno(c->tmp), fd) < 0)
		abort();
}

static char *capture_end(struct capture *c)
{
	long n;
	char *s;

	fflush(NULL);
	dup2(c->saved, c->fd);
	close(c->saved);
	n = ftell(c->tmp);
	s = calloc((size_t)n + 1, 1);
	rewind(c->tmp);
	if (!s || fread(s, 1, (size_t)n, c->tmp) != (size_t)n)
		abort();
	fclose(c->tmp);
	return s;
}

/* ---- parse a command line given as one string */

static char line_buf[1024], *args[64];
static char *err_text, *out_text;

static int parse_flags(const struct cli_option *opts, const struct cli_help *help, unsigned flags, const char *line)
{
	struct capture ce, co;
	int n = 0, rc;

	snprintf(line_buf, sizeof(line_buf), "%s", line);
	args[n++] = "test";
	for (char *save = NULL, *t = strtok_r(line_buf, " ", &save); t; t = strtok_r(NULL, " ", &save))
		args[n++] = t;
	args[n] = NULL;
	free(err_text);
	free(out_text);
	capture_begin(&ce, STDERR_FILENO);
	capture_begin(&co, STDOUT_FILENO);
	rc = cli_parse_options(n, args, opts, help, flags);
	out_text = capture_end(&co);
	err_text = capture_end(&ce);
	return rc;
}

static const struct cli_help help_cmd = {
	.usage = {"hi3 test [options] FILE", "hi3 test --other"},
	.description = "A test command.\n",
	.footer = "Exit status: 0.\n",
};

static int parse(const struct cli_option *opts, const char *line)
{
	return parse_flags(opts, &help_cmd, 0, line);
}

static int has(const char *text, const char *needle)
{
	return text && strstr(text, needle) != NULL;
}

/* ---- the tests */

static void test_int(void)
{
	int n = 7;
	int64_t big = 0;
	uint64_t seed = 0;
	struct cli_option opts[] = {
		OPT_INT('n', "num", &n, 1, 10, "N", "a number"),
		OPT_INT(0, "big", &big, INT64_MIN, INT64_MAX, "N", "a big number"),
		OPT_SEED(0, &seed, "a seed"),
		OPT_END(),
	};

	ok(parse(opts, "-n 3") == 0 && n == 3, "-n 3 stores 3");
	ok(parse(opts, "--num=10") == 0 && n == 10, "--num=10 stores the upper bound");
	ok(parse(opts, "--num 11") == CLI_PARSE_ERROR && n == 10, "11 is out of [1, 10] and leaves the value");
	ok(has(err_text, "hi3 test: --num: 11 is out of range [1, 10]"), "the error names the option and the range");
	ok(has(err_text, "(see 'hi3 test --help')"), "and points at the help");
	ok(parse(opts, "-n 0") == CLI_PARSE_ERROR, "0 is out of range");
	ok(parse(opts, "-n 3x") == CLI_PARSE_ERROR && has(err_text, "--num: expected an integer, found '3x'"),
	   "trailing garbage is refused");
	ok(parse(opts, "-n 0x3") == CLI_PARSE_ERROR, "hex is refused");
	ok(parse(opts, "-n  ") == CLI_PARSE_ERROR, "a missing value is refused");
	ok(parse(opts, "--big -9223372036854775808") == 0 && big == INT64_MIN, "int64_t: the lowest value");
	ok(parse(opts, "--big 9223372036854775808") == CLI_PARSE_ERROR, "int64_t: overflow is refused");
	ok(parse(opts, "--seed 9223372036854775807") == 0 && seed == INT64_MAX,
	   "a seed: [0, INT64_MAX] into a uint64_t");
	ok(parse(opts, "--seed -1") == CLI_PARSE_ERROR && has(err_text, "out of range [0, 9223372036854775807]"),
	   "a negative seed is refused");
	ok(CLI_PARSE_STATUS(CLI_PARSE_ERROR) == 2 && CLI_PARSE_STATUS(CLI_PARSE_HELP) == 0,
	   "exit status 2 after an error, 0 after the help");
}

static void test_double(void)
{
	double x = 0.5;
	hi3_sampler s = {.temperature = 1.0, .top_k = 0, .top_p = 1.0};
	int sampling = 0;
	struct cli_option opts[] = {
		OPT_DOUBLE(0, "x", &x, -1.0, 1.0, "X", "a number"),
		OPT_SAMPLER(&s, &sampling),
		OPT_END(),
	};

	ok(parse(opts, "--x -0.25") == 0 && x == -0.25, "a double");
	ok(parse(opts, "--x 1e-3") == 0 && x == 1e-3, "exponent form");
	ok(parse(opts, "--x 1.5") == CLI_PARSE_ERROR && has(err_text, "--x: 1.5 is out of range [-1, 1]"), "range");
	ok(parse(opts, "--x nan") == CLI_PARSE_ERROR && has(err_text, "expected a number"), "NaN is refused");
	ok(parse(opts, "--x inf") == CLI_PARSE_ERROR, "Inf is refused");
	ok(parse(opts, "--x 0.5z") == CLI_PARSE_ERROR, "trailing garbage is refused");
	ok(sampling == 0, "nothing given yet");
	ok(parse(opts, "--temperature 0") == 0 && s.temperature == 0.0 && sampling == 1, "temperature 0 (greedy)");
	ok(parse(opts, "--temperature -0.1") == CLI_PARSE_ERROR, "a negative temperature is refused");
	ok(parse(opts, "--top-p 0") == CLI_PARSE_ERROR && has(err_text, "--top-p: 0 is out of range (0, 1]"),
	   "top-p: the open lower bound is refused");
	ok(parse(opts, "--top-p 1 --top-k 5") == 0 && s.top_p == 1.0 && s.top_k == 5 && sampling == 3,
	   "top-p 1, top-k 5; the three share one given counter");
	ok(parse(opts, "--top=3") == CLI_PARSE_ERROR && has(err_text, "ambiguous option '--top' (--top-k, --top-p)"),
	   "a prefix of two long options is ambiguous, and the error names them");
}

static void test_choice_string(void)
{
	static const struct cli_choice colours[] = {
		{"red", 1, NULL}, {"green", 2, NULL}, {"blue", 3, "blue was chosen"}, {NULL, 0, NULL},
	};
	int colour = 1;
	const char *name = NULL, *tmpl = NULL;
	hi3_dtype dt = HI3_F32;
	struct cli_option opts[] = {
		OPT_CHOICE(0, "colour", &colour, colours, "a colour"),
		OPT_STRING(0, "name", &name, "NAME", "a name"),
		OPT_STRING(0, "template", &tmpl, "T", "red or green", .choices = colours),
		OPT_DTYPE(0, "dtype", &dt, "a dtype"),
		OPT_END(),
	};

	ok(parse(opts, "--colour green") == 0 && colour == 2 && !has(err_text, "warning"),
	   "a choice maps to its value");
	ok(parse(opts, "--colour pink") == CLI_PARSE_ERROR && colour == 2 &&
	   has(err_text, "--colour: expected red, green or blue, found 'pink'"), "a value not in the list is refused");
	ok(parse(opts, "--colour blue") == 0 && colour == 3 && has(err_text, "hi3 test: warning: blue was chosen"),
	   "a choice's warning is printed when the parse ends with it");
	ok(parse(opts, "--colour blue --colour red") == 0 && colour == 1 && !has(err_text, "warning"),
	   "and not when a later one replaces it");
	ok(parse(opts, "--name x --name y") == 0 && name && !strcmp(name, "y"), "a string: the last one stands");
	ok(parse(opts, "--template green") == 0 && !strcmp(tmpl, "green"), "a string from a list");
	ok(parse(opts, "--template Green") == CLI_PARSE_ERROR, "must match exactly");
	ok(parse(opts, "--dtype bf16") == 0 && dt == HI3_BF16, "dtype bf16");
	ok(parse(opts, "--dtype f16") == CLI_PARSE_ERROR && has(err_text, "expected f32 or bf16, found 'f16'"),
	   "dtype f16 is refused");
}

static void test_list(void)
{
	int64_t v[3] = {0};
	int n = 0, given = 0;
	struct cli_option opts[] = {
		OPT_INT_LIST(0, "steps", v, &n, 1, 100, "N,...", "steps", .given = &given),
		OPT_END(),
	};

	ok(parse(opts, "--steps 3,5,100") == 0 && n == 3 && v[0] == 3 && v[1] == 5 && v[2] == 100 && given == 1,
	   "a list of three");
	ok(parse(opts, "--steps 7") == 0 && n == 1 && v[0] == 7 && given == 2, "a list of one replaces it");
	ok(parse(opts, "--steps 1,2,3,4") == CLI_PARSE_ERROR && has(err_text, "more than 3 values"),
	   "more values than room");
	ok(parse(opts, "--steps 1,0") == CLI_PARSE_ERROR && has(err_text, "--steps: 0 is out of range"),
	   "every value is range checked");
	ok(parse(opts, "--steps 1,x") == CLI_PARSE_ERROR, "and must be an integer");
	ok(parse(opts, "--steps ,") == CLI_PARSE_ERROR && has(err_text, "expected a comma-separated list"),
	   "an empty list is refused");
}

static int seen_arg;
static int callback(const struct cli_option *opt, const char *arg)
{
	if (!strcmp(arg, "bad"))
		return cli_usage_error("--cb: bad"), -1;
	*(int *)opt->value = atoi(arg) + 100;
	seen_arg = 1;
	return 0;
}

static void test_flags_and_operands(void)
{
	int flag = 0, mode = -1, modes = 0, cb = 0;
	struct cli_option opts[] = {
		OPT_FLAG('f', "flag", &flag, "a flag"),
		OPT_SET_INT(0, "one", &mode, 1, "mode one", .given = &modes),
		OPT_SET_INT(0, "two", &mode, 2, "mode two", .given = &modes),
		OPT_CALLBACK(0, "cb", &cb, "V", callback, "a callback"),
		OPT_END(),
	};

	ok(parse(opts, "a -f b") == 2 && flag == 1 && !strcmp(args[0], "a") && !strcmp(args[1], "b") && !args[2],
	   "operands move to argv[0..n), options may stand between them");
	ok(parse(opts, "--one") == 0 && mode == 1 && modes == 1, "a flag storing a value");
	ok(parse(opts, "--two --one") == 0 && mode == 1 && modes == 3, "options share a given counter");
	ok(parse(opts, "--flag=1") == CLI_PARSE_ERROR && has(err_text, "--flag takes no value"),
	   "a flag with a value is refused");
	ok(parse(opts, "--cb 5") == 0 && cb == 105 && seen_arg, "a callback gets its argument");
	ok(parse(opts, "--cb bad") == CLI_PARSE_ERROR, "a callback's error ends the parse");
	ok(parse(opts, "--cb") == CLI_PARSE_ERROR && has(err_text, "--cb needs a value (V)"), "missing argument");
	ok(parse(opts, "--no-such-option") == CLI_PARSE_ERROR &&
	   has(err_text, "hi3 test: unknown option '--no-such-option'"), "an unknown long option");
	ok(parse(opts, "--no-such=3") == CLI_PARSE_ERROR && has(err_text, "unknown option '--no-such'"),
	   "an unknown option with a value");
	ok(parse(opts, "-x") == CLI_PARSE_ERROR && has(err_text, "unknown option '-x'"), "an unknown short option");
	ok(parse(opts, "-- -f") == 1 && !strcmp(args[0], "-f"), "-- ends the options");
	ok(parse(opts, "--fl") == 0, "a unique prefix of a long option is taken (getopt_long)");
	ok(parse_flags(opts, &help_cmd, CLI_PARSE_STOP_AT_NON_OPTION, "-f cmd -x") == 2 && !strcmp(args[0], "cmd") &&
	   !strcmp(args[1], "-x"), "CLI_PARSE_STOP_AT_NON_OPTION: the first operand ends the options");
}

static void test_required_and_operands(void)
{
	static const struct cli_help two = {.usage = {"hi3 test A B -o OUT"}, .operands = "A and B",
	                                    .min_operands = 2, .max_operands = 2};
	static const struct cli_help none = {.usage = {"hi3 test"}, .operands = "no arguments"};
	static const struct cli_help some = {.usage = {"hi3 test FILE..."}, .operands = "one FILE or more",
	                                     .min_operands = 1, .max_operands = -1};
	const char *out = NULL, *preset = NULL;
	struct cli_option opts[] = {
		OPT_OUTPUT(&out, "OUT", "the output"),
		OPT_STRING(0, "preset", &preset, "NAME", "a preset", .flags = CLI_OPT_REQUIRED),
		OPT_HELP('h', "help", "help"),
		OPT_END(),
	};

	ok(parse_flags(opts, &two, 0, "a b -o x --preset p") == 2 && !strcmp(out, "x"), "required options given");
	ok(parse_flags(opts, &two, 0, "a b --preset p") == CLI_PARSE_ERROR && has(err_text, "-o OUT is required"),
	   "-o missing: named by its short name and argument");
	ok(parse_flags(opts, &two, 0, "a b -o x") == CLI_PARSE_ERROR && has(err_text, "--preset NAME is required"),
	   "--preset missing");
	ok(parse_flags(opts, &two, 0, "-h") == CLI_PARSE_HELP, "-h needs neither");
	ok(parse_flags(opts, &two, 0, "a -o x --preset p") == CLI_PARSE_ERROR &&
	   has(err_text, "expected A and B, found 1 argument\n"), "too few operands");
	ok(parse_flags(opts, &two, 0, "a b c -o x --preset p") == CLI_PARSE_ERROR &&
	   has(err_text, "expected A and B, found 3 arguments"), "too many operands");
	ok(parse_flags(opts, &none, 0, "-o x --preset p c") == CLI_PARSE_ERROR &&
	   has(err_text, "unexpected argument 'c'"), "no operands taken");
	ok(parse_flags(opts, &some, 0, "-o x --preset p a b c d") == 4 &&
	   parse_flags(opts, &some, 0, "-o x --preset p") == CLI_PARSE_ERROR, "one or more");
}

static void test_globals(void)
{
	const char *tok = NULL;
	struct cli_option opts[] = {
		OPT_STRING('m', "model", &cli.model_dir, "DIR", "the command's own help for -m"),
		OPT_STRING(0, "tokenizer", &tok, "FILE", "a tokenizer"),
		OPT_GLOBALS(),
		OPT_END(),
	};

	ok(parse(opts, "-t 3 -m dir --backend cuda --batch-invariant off") == 0 && cli.threads == 3 &&
	   !strcmp(cli.model_dir, "dir") && !strcmp(cli.backend, "cuda") && cli.batch_invariant == 0,
	   "the global options are parsed in a command's table");
	ok(parse(opts, "--backend tpu") == CLI_PARSE_ERROR && has(err_text, "--backend: expected cpu or cuda"),
	   "--backend: cpu or cuda");
	ok(parse(opts, "-t -1") == CLI_PARSE_ERROR && has(err_text, "--threads: -1 is out of range [0, 4096]"),
	   "--threads: range");
	ok(parse(opts, "-q") == 0 && cli.quiet && !cli.verbose, "-q");
	ok(parse(opts, "-q -v") == 0 && !cli.quiet && cli.verbose, "-v after -q: the last wins");
	ok(parse(opts, "--tokenizer t -h") == CLI_PARSE_HELP && has(out_text, "usage: hi3 test [options] FILE"),
	   "-h prints the help on stdout");
	ok(has(out_text, "  -m, --model DIR       the command's own help for -m") && !has(out_text, "--threads"),
	   "the command's -m is shown with its help; the other globals are not");
	ok(parse(opts, "--help") == CLI_PARSE_HELP && !*err_text, "--help, nothing on stderr");
	cli.threads = 0;
	cli.backend = "cpu";
	cli.batch_invariant = -1;
	cli.model_dir = NULL;
	cli.verbose = 0;
}

static void test_help(void)
{
	static const struct cli_choice modes[] = {{"fast", 0, NULL}, {"slow", 1, NULL}, {NULL, 0, NULL}};
	int n = 0, mode = 0, flag = 0, hidden = 0;
	struct cli_option opts[] = {
		OPT_INT('n', "num", &n, 0, 9, "N", "a number"),
		OPT_FLAG(0, "a-rather-long-option-name", &flag, "its help starts on the next line"),
		OPT_GROUP("modes:"),
		OPT_CHOICE(0, "mode", &mode, modes, "how fast; this help is long enough that it has to be wrapped onto "
		           "a second line and then a third, indented to the help column every time"),
		OPT_FLAG(0, "hidden", &hidden, "not shown", .flags = CLI_OPT_HIDDEN),
		OPT_END(),
	};
	char *text = NULL, *p, *line;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	int longest = 0;

	cli_usage_with_options(f, &help_cmd, opts);
	fclose(f);
	ok(!strncmp(text, "usage: hi3 test [options] FILE\n   or: hi3 test --other\n\nA test command.\n\n", 69),
	   "usage lines, a blank line, the description, a blank line");
	ok(has(text, "\n  -n, --num N           a number\n"), "short and long name, argument, help at column 24");
	ok(has(text, "\n      --a-rather-long-option-name\n                        its help starts"),
	   "a long option's help starts on the next line");
	ok(has(text, "a number\n      --a-rather") && has(text, "on the next line\n\nmodes:\n      --mode fast|slow "),
	   "a group heading after a blank line; a choice's argument is its values");
	ok(!has(text, "hidden"), "a hidden option is not shown");
	ok(has(text, "every time\n\nExit status: 0.\n"), "the footer after a blank line");
	for (p = text; (line = strsep(&p, "\n"));)
		if ((int)strlen(line) > longest)
			longest = (int)strlen(line);
	ok(longest < 80, "option lines are wrapped below 80 columns (longest %d)", longest);
	if (longest >= 80)
		diag("the longest line has %d characters", longest);
	free(text);
	ok(parse(opts, "--hidden") == 0 && hidden == 1, "a hidden option is parsed");
}

int main(void)
{
	cli_voice.cmd = "test";
	test_int();
	test_double();
	test_choice_string();
	test_list();
	test_flags_and_operands();
	test_required_and_operands();
	test_globals();
	test_help();
	free(err_text);
	free(out_text);
	return done_testing();
}
