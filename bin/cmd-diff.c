/* cmd-diff.c -- hi3 diff: compare two safetensors files tensor by tensor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "commands.h"

const char cmd_diff_help[] =
	"usage: hi3 diff [--json] [--atol A] [--rtol R] [--valid-only] [--row I:J] [--tensor NAME]... A B\n"
	"\n"
	"Compare two hi3 stage files (or any safetensors files) tensor by tensor:\n"
	"max |a - b| and the first element where it occurs, named by what the\n"
	"dimensions mean where the format is known (kv: row, head, slot, col;\n"
	"segment: row, pos), and how many elements are over tolerance: an element\n"
	"differs when |a - b| > atol + rtol * |b|. NaN equals NaN; NaN against a\n"
	"number differs. A tensor in only one file, or with another dtype or\n"
	"shape, differs.\n"
	"\n"
	"      --json           one JSON object on standard output\n"
	"      --atol A         absolute tolerance (default 1e-5)\n"
	"      --rtol R         relative tolerance (default 0)\n"
	"      --valid-only     kv files: compare k/v only over each row's valid slots\n"
	"                       [0, kv_len) and gen_tokens/gen_logprobs over [0, gen_len)\n"
	"      --row I:J        compare row I of A with row J of B (e.g. a batched kv\n"
	"                       against a B = 1 kv; implies --valid-only for kv files;\n"
	"                       segment rows are their cu_seqlens spans)\n"
	"      --tensor NAME    compare only NAME (repeatable)\n"
	"\n"
	"Exit status: 0 all within tolerance, 1 some difference, 2 usage, 3 unreadable file.\n";

enum { OPT_JSON = CLI_OPT_FIRST_LOCAL, OPT_ATOL, OPT_RTOL, OPT_VALID, OPT_ROW, OPT_TENSOR };

static int parse_rows(const char *arg, hi3_diff_opts *o)
{
	char *copy = strdup(arg), *colon = copy ? strchr(copy, ':') : NULL;
	int rc = -1;

	if (!copy)
		return -1;
	if (!colon || strchr(colon + 1, ':')) {
		cli_usage_error("--row: expected I:J (row I of A, row J of B), found '%s'", arg);
	} else {
		*colon = '\0';
		if (!cli_int("--row", copy, 0, INT32_MAX, &o->row_a) && !cli_int("--row", colon + 1, 0, INT32_MAX, &o->row_b))
			rc = 0;
	}
	free(copy);
	return rc;
}

int cmd_diff(int argc, char **argv)
{
	static const struct option opts[] = {
		CLI_GLOBAL_LONGOPTS,
		{"json", no_argument, NULL, OPT_JSON},
		{"atol", required_argument, NULL, OPT_ATOL},
		{"rtol", required_argument, NULL, OPT_RTOL},
		{"valid-only", no_argument, NULL, OPT_VALID},
		{"row", required_argument, NULL, OPT_ROW},
		{"tensor", required_argument, NULL, OPT_TENSOR},
		{NULL, 0, NULL, 0},
	};
	hi3_diff_opts o = {.atol = 1e-5, .rtol = 0, .row_a = -1, .row_b = -1};
	hi3_diff_result *res = NULL;
	hi3_error err = {0};
	const char **names = calloc((size_t)argc + 1, sizeof(*names));
	char *report = NULL;
	size_t len = 0;
	int c, rc = HI3_ERR_USAGE, json = 0;

	if (!names)
		return HI3_ERR_RUNTIME;
	while ((c = getopt_long(argc, argv, CLI_GLOBAL_SHORT, opts, NULL)) != -1) {
		switch (c) {
		case OPT_JSON:
			json = 1;
			break;
		case OPT_ATOL:
			if (cli_double("--atol", optarg, 0, 1e300, &o.atol))
				goto out;
			break;
		case OPT_RTOL:
			if (cli_double("--rtol", optarg, 0, 1e300, &o.rtol))
				goto out;
			break;
		case OPT_VALID:
			o.valid_only = 1;
			break;
		case OPT_ROW:
			if (parse_rows(optarg, &o))
				goto out;
			break;
		case OPT_TENSOR:
			names[o.n_tensors++] = optarg;
			break;
		default:
			if ((rc = cli_other_option(c, optarg)) >= 0)
				goto out;
			rc = HI3_ERR_USAGE;
		}
	}
	if (argc - optind != 2) {
		cli_usage_error("expected two files A and B, found %d", argc - optind);
		goto out;
	}
	o.tensors = names;
	o.threads = cli.threads;
	if (hi3_diff(argv[optind], argv[optind + 1], &o, &res, &err) != 0 ||
	    hi3_diff_report(res, json, &report, &len, &err) != 0) {
		rc = cli_fail(&err);
		goto out;
	}
	rc = fwrite(report, 1, len, stdout) != len ? HI3_ERR_RUNTIME : res->equal ? 0 : 1;
out:
	free(report);
	hi3_diff_free(res);
	free(names);
	return rc;
}
