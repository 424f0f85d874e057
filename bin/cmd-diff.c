/* cmd-diff.c -- hi3 diff: compare two safetensors files tensor by tensor, or
 * (--first) two traces point by point, for the first point that differs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "commands.h"

static const struct cli_help help = {
	.usage = {"hi3 diff [--json] [--atol A] [--rtol R] [--valid-only] [--row I:J] [--tensor NAME]... A B",
	          "hi3 diff --first [--json] [--tol T] [--row I:J] [--png FILE] A.trace B.trace"},
	.description =
	"Compare two hi3 stage files (or any safetensors files) tensor by tensor:\n"
	"max |a - b| and the first element where it occurs, named by what the\n"
	"dimensions mean where the format is known (kv: row, head, slot, col;\n"
	"segment: row, pos), and how many elements are over tolerance: an element\n"
	"differs when |a - b| > atol + rtol * |b|. NaN equals NaN; NaN against a\n"
	"number differs. A tensor in only one file, or with another dtype or\n"
	"shape, differs.\n"
	"\n"
	"With --first, A and B are traces (prefill, decode, replay or\n"
	"diffusion-capture --trace): their tokens are aligned by (row, position) and\n"
	"compared point by point in forward order -- token ids, embedding, per layer\n"
	"the input, norms, q/k/v, attention, o_proj, router, experts, MLP, then the\n"
	"final norm and logits -- and the report names the first point where they\n"
	"differ (bitwise unless --tol), what its agreeing inputs say about the cause,\n"
	"and a table of max |A - B| by layer and point.\n",
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

/* --first: two traces, the report, and the plot. */
static int run_first(const char *a, const char *b, const hi3_diff_opts *po, double tol, const char *png, int json)
{
	hi3_trace_diff_opts o = {.tol = tol, .row_a = po->row_a, .row_b = po->row_b, .threads = cli.threads};
	hi3_trace_diff *d = NULL;
	hi3_error err = {0};
	char *report = NULL;
	size_t len = 0;
	int rc;

	if (hi3_trace_diff_run(a, b, &o, &d, &err) != 0 || hi3_trace_diff_report(d, json, &report, &len, &err) != 0 ||
	    (png && hi3_trace_diff_png(d, png, &err) != 0))
		rc = cli_fail(&err);
	else
		rc = fwrite(report, 1, len, stdout) != len ? HI3_ERR_RUNTIME : d->equal ? 0 : 1;
	free(report);
	hi3_trace_diff_free(d);
	return rc;
}

int cmd_diff(int argc, char **argv)
{
	struct names names = {calloc((size_t)argc + 1, sizeof(*names.v)), 0};
	hi3_diff_opts o = {.atol = 1e-5, .rtol = 0, .row_a = -1, .row_b = -1};
	hi3_diff_result *res = NULL;
	hi3_error err = {0};
	char *report = NULL;
	size_t len = 0;
	int rc = HI3_ERR_USAGE, json = 0, first = 0, n_plain = 0, n_first = 0;
	double tol = 0;
	const char *png = NULL;
	struct cli_option options[] = {
		OPT_GLOBALS(),
		OPT_JSON(&json, "one JSON object on standard output"),
		OPT_DOUBLE(0, "atol", &o.atol, 0, 1e300, "A", "absolute tolerance (default 1e-5)", .given = &n_plain),
		OPT_DOUBLE(0, "rtol", &o.rtol, 0, 1e300, "R", "relative tolerance (default 0)", .given = &n_plain),
		OPT_FLAG(0, "valid-only", &o.valid_only, "kv files: compare k/v only over each row's valid slots, "
		         "[0,kv_len), and gen_tokens/gen_logprobs over [0,gen_len)", .given = &n_plain),
		OPT_CALLBACK(0, "row", &o, "I:J", parse_rows, "compare row I of A with row J of B (e.g. a batched kv "
		             "against a B = 1 kv; implies --valid-only for kv files; segment rows are their cu_seqlens "
		             "spans)"),
		OPT_CALLBACK(0, "tensor", &names, "NAME", add_tensor, "compare only NAME (repeatable)", .given = &n_plain),
		OPT_GROUP("traces:"),
		OPT_FLAG(0, "first", &first, "A and B are traces: align their tokens by (row, position; --row maps "
		         "rows) and report the first point where they differ, in forward order"),
		OPT_DOUBLE(0, "tol", &tol, 0, 1e300, "T", "with --first: an element differs when |a - b| > T (default 0: "
		           "bitwise; ids always exactly)", .given = &n_first),
		OPT_STRING(0, "png", &png, "FILE", "with --first: plot log10 max |a - b| by layer, a line per kind of "
		           "point, as a PNG", .given = &n_first),
		OPT_END(),
	};

	if (!names.v)
		return HI3_ERR_RUNTIME;
	if ((argc = cli_parse_options(argc, argv, options, &help, 0)) < 0) {
		rc = CLI_PARSE_STATUS(argc);
		goto out;
	}
	if (first && n_plain) {
		rc = cli_usage_error("--first compares traces by --tol; --atol, --rtol, --valid-only and --tensor are "
		                     "for tensor by tensor comparison");
		goto out;
	}
	if (!first && n_first) {
		rc = cli_usage_error("--tol and --png need --first");
		goto out;
	}
	if (png && (!strcmp(png, "-") || cli_same_file(png, argv[0]) || cli_same_file(png, argv[1]))) {
		rc = cli_usage_error("--png: '%s' names %s", png, !strcmp(png, "-") ? "standard output; the PNG is a "
		                     "file" : "a trace it compares");
		goto out;
	}
	if (first) {
		rc = run_first(argv[0], argv[1], &o, tol, png, json);
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
