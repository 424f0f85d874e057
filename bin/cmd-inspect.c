/* cmd-inspect.c -- hi3 inspect: what a safetensors file holds, or what hi3
 * decodes from a picture. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "commands.h"

static const struct cli_help help = {
	.usage = {"hi3 inspect [--json] [--tensor NAME [--slice SPEC]] [--png OUT [--row I] [--scale N]] FILE",
	          "hi3 inspect [--json] [--png OUT] [--max-image-pixels N] [--max-image-bytes N] PICTURE"},
	.description =
	"Show a safetensors file (any, or a checkpoint directory with\n"
	"model.safetensors or model.safetensors.index.json): its format and\n"
	"metadata, and every tensor with dtype, shape, min/max/mean over the finite\n"
	"elements and its NaN and Inf counts.\n"
	"Or show what hi3 decodes from a picture (JPEG, PNG, WebP, GIF, BMP) as the\n"
	"stages read it: format, Pillow's mode, stored size, EXIF orientation and\n"
	"the size after it; --png writes its RGB pixels after the orientation.\n",
	.footer = "Exit status: 0 ok, 2 usage (a bad --slice), 3 unreadable file or picture.\n",
	.operands = "one FILE", .min_operands = 1, .max_operands = 1,
};

int cmd_inspect(int argc, char **argv)
{
	hi3_inspect_opts o = {.row = -1};
	hi3_error err = {0};
	char *report = NULL;
	size_t len = 0;
	int rc;
	struct cli_option options[] = {
		OPT_GLOBALS(),
		OPT_JSON(&o.json, "one JSON object on standard output"),
		OPT_STRING(0, "tensor", &o.tensor, "NAME", "print the values of tensor NAME"),
		OPT_STRING(0, "slice", &o.slice, "SPEC", "only these elements: per dimension an index or "
		           "START:STOP[:STEP] (numpy style, e.g. 0,:,3:7)"),
		OPT_STRING(0, "png", &o.png, "OUT", "write a PNG: the 2-D selection of --tensor as a heatmap; without "
		           "--tensor, a kv file's valid-slot map or (with --row) a conditions row's attention mask; "
		           "of a PICTURE, its decoded RGB after the EXIF orientation"),
		OPT_INT(0, "row", &o.row, 0, INT32_MAX, "I", "the conditions row whose attention mask --png renders"),
		OPT_INT(0, "scale", &o.scale, 1, 64, "N", "PNG pixels per element (default: 1024 / the larger side, "
		        "between 1 and 16)"),
		OPT_PICTURE_LIMITS(&o.max_image_pixels, &o.max_image_bytes),
		OPT_END(),
	};

	if ((argc = cli_parse_options(argc, argv, options, &help, 0)) < 0)
		return CLI_PARSE_STATUS(argc);
	o.threads = cli.threads;
	if (hi3_inspect(argv[0], &o, &report, &len, &err) != 0)
		return cli_fail(&err);
	rc = fwrite(report, 1, len, stdout) == len ? 0 : HI3_ERR_RUNTIME;
	free(report);
	return rc;
}
