/* cmd-inspect.c -- hi3 inspect: what a safetensors file holds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "commands.h"

const char cmd_inspect_help[] =
	"usage: hi3 inspect [--json] [--tensor NAME [--slice SPEC]] [--png OUT [--row I] [--scale N]] FILE\n"
	"\n"
	"Show a safetensors file (any, or a checkpoint directory with\n"
	"model.safetensors or model.safetensors.index.json): its format and\n"
	"metadata, and every tensor with dtype, shape, min/max/mean over the finite\n"
	"elements and its NaN and Inf counts.\n"
	"\n"
	"      --json           one JSON object on standard output\n"
	"      --tensor NAME    print the values of tensor NAME\n"
	"      --slice SPEC     only these elements: per dimension an index or\n"
	"                       START:STOP[:STEP] (numpy style, e.g. 0,:,3:7)\n"
	"      --png OUT        write a PNG: the 2-D selection of --tensor as a heatmap;\n"
	"                       without --tensor, a kv file's valid-slot map or (with\n"
	"                       --row) a conditions row's attention mask\n"
	"      --row I          the conditions row whose attention mask --png renders\n"
	"      --scale N        PNG pixels per element (default: 1024 / the larger side,\n"
	"                       between 1 and 16)\n"
	"\n"
	"Exit status: 0 ok, 2 usage (a bad --slice), 3 unreadable file.\n";

enum { OPT_JSON = CLI_OPT_FIRST_LOCAL, OPT_TENSOR, OPT_SLICE, OPT_PNG, OPT_ROW, OPT_SCALE };

int cmd_inspect(int argc, char **argv)
{
	static const struct option opts[] = {
		CLI_GLOBAL_LONGOPTS,
		{"json", no_argument, NULL, OPT_JSON},
		{"tensor", required_argument, NULL, OPT_TENSOR},
		{"slice", required_argument, NULL, OPT_SLICE},
		{"png", required_argument, NULL, OPT_PNG},
		{"row", required_argument, NULL, OPT_ROW},
		{"scale", required_argument, NULL, OPT_SCALE},
		{NULL, 0, NULL, 0},
	};
	hi3_inspect_opts o = {.row = -1};
	hi3_error err = {0};
	char *report = NULL;
	size_t len = 0;
	int64_t v;
	int c, rc;

	while ((c = getopt_long(argc, argv, CLI_GLOBAL_SHORT, opts, NULL)) != -1) {
		switch (c) {
		case OPT_JSON:
			o.json = 1;
			break;
		case OPT_TENSOR:
			o.tensor = optarg;
			break;
		case OPT_SLICE:
			o.slice = optarg;
			break;
		case OPT_PNG:
			o.png = optarg;
			break;
		case OPT_ROW:
			if (cli_int("--row", optarg, 0, INT32_MAX, &o.row))
				return HI3_ERR_USAGE;
			break;
		case OPT_SCALE:
			if (cli_int("--scale", optarg, 1, 64, &v))
				return HI3_ERR_USAGE;
			o.scale = (int)v;
			break;
		default:
			if ((rc = cli_other_option(c, optarg)) >= 0)
				return rc;
		}
	}
	if (optind + 1 != argc)
		return cli_usage_error("%s", optind == argc ? "no FILE given" : "more than one FILE given");
	o.threads = cli.threads;
	if (hi3_inspect(argv[optind], &o, &report, &len, &err) != 0)
		return cli_fail(&err);
	rc = fwrite(report, 1, len, stdout) == len ? 0 : HI3_ERR_RUNTIME;
	free(report);
	return rc;
}
