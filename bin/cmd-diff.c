/* cmd-diff.c -- hi3 diff: compare two safetensors files tensor by tensor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "commands.h"

static const struct cli_help help = {
	.usage = {"hi3 diff [--json] [--atol A] [--rtol R] [--valid-only] [--row I:J] [--tensor NAME]... A B"},
	.description =
	"Compare two hi3 stage files (or any safetensors files) tensor by tensor:\n"
	"max |a - b| and the first element where it occurs, named by what the\n"
	"dimensions mean where the format is known (kv: row, head, slot, col;\n"
	"segment: row, pos), and how many elements are over tolerance: an element\n"
	"differs when |a - b| > atol + rtol * |b|. NaN equals NaN; NaN against a\n"
	"number differs. A tensor in only one file, or with another dtype or\n"
	"shape, differs.\n",
	.footer = "Exit status: 0 all within tolerance, 1 some difference, 2 usage, 3 unreadable file.\n",
	.operands = "two files A and B", .min_operands = 2, .max_operands = 2,
};

/* --row I:J: row I of A against row J of B. */
static int parse_rows(const struct cli_option *opt, const char *arg)
{
	hi3_diff_opts *o = opt->value;
	char *copy = strdup(arg), *colon = copy ? strchr(copy, ':') : NULL;
	int rc = -1;

	if (!copy)
		return cli_usage_error("--row: out of memory"), -1;
	if (!colon || strchr(colon + 1, ':')) {
		cli_usage_error("--row: expected I:J (row I of A, row J of B), found '%s'", arg);
	} else {
		*colon = '\0';
		if (!cli_int("--row", copy, 0, INT32_MAX, &o->row_a) &&
		    !cli_int("--row", colon + 1, 0, INT32_MAX, &o->row_b))
			rc = 0;
	}
	free(copy);
	return rc;
}

/* --tensor NAMEs, repeatable: room for one per argument. */
struct names {
	const char **v;
	int n;
};

static int add_tensor(const struct cli_option *opt, const char *arg)
{
	struct names *names = opt->value;

	names->v[names->n++] = arg;
	return 0;
}

int cmd_diff(int argc, char **argv)
{
	struct names names = {calloc((size_t)argc + 1, sizeof(*names.v)), 0};
	hi3_diff_opts o = {.atol = 1e-5, .rtol = 0, .row_a = -1, .row_b = -1};
	hi3_diff_result *res = NULL;
	hi3_error err = {0};
	char *report = NULL;
	size_t len = 0;
	int rc = HI3_ERR_USAGE, json = 0;
	struct cli_option options[] = {
		OPT_GLOBALS(),
		OPT_JSON(&json, "one JSON object on standard output"),
		OPT_DOUBLE(0, "atol", &o.atol, 0, 1e300, "A", "absolute tolerance (default 1e-5)"),
		OPT_DOUBLE(0, "rtol", &o.rtol, 0, 1e300, "R", "relative tolerance (default 0)"),
		OPT_FLAG(0, "valid-only", &o.valid_only, "kv files: compare k/v only over each row's valid slots, "
		         "[0,kv_len), and gen_tokens/gen_logprobs over [0,gen_len)"),
		OPT_CALLBACK(0, "row", &o, "I:J", parse_rows, "compare row I of A with row J of B (e.g. a batched kv "
		             "against a B = 1 kv; implies --valid-only for kv files; segment rows are their cu_seqlens "
		             "spans)"),
		OPT_CALLBACK(0, "tensor", &names, "NAME", add_tensor, "compare only NAME (repeatable)"),
		OPT_END(),
	};

	if (!names.v)
		return HI3_ERR_RUNTIME;
	if ((argc = cli_parse_options(argc, argv, options, &help, 0)) < 0) {
		rc = CLI_PARSE_STATUS(argc);
		goto out;
	}
	o.tensors = names.v;
	o.n_tensors = names.n;
	o.threads = cli.threads;
	if (hi3_diff(argv[0], argv[1], &o, &res, &err) != 0 ||
	    hi3_diff_report(res, json, &report, &len, &err) != 0) {
		rc = cli_fail(&err);
		goto out;
	}
	rc = fwrite(report, 1, len, stdout) != len ? HI3_ERR_RUNTIME : res->equal ? 0 : 1;
out:
	free(report);
	hi3_diff_free(res);
	free(names.v);
	return rc;
}
