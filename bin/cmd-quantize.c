/* cmd-quantize.c -- hi3 quantize: a checkpoint written again, weight-only quantized (hi3-quant(7)). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "commands.h"

static const struct cli_help help = {
	.usage = {"hi3 quantize -m MODEL --to fp8|int8 [--skip PATTERN]... -o OUT"},
	.description =
	"Write MODEL's checkpoint to the directory OUT with its transformer matrices\n"
	"quantized weight-only, one shard in memory at a time, each file written\n"
	"atomically: fp8 as compressed-tensors writes it (e4m3, one F32 scale per\n"
	"output channel; read by vLLM and compressed-tensors), int8 as transformers\n"
	"saves a bitsandbytes load_in_8bit model (row scales, SCB). config.json gets\n"
	"the format's quantization_config; the tokenizer and generation files are\n"
	"copied. Kept as stored: embeddings, norms, the MoE router, lm_head and\n"
	"everything outside model.layers (the vision tower, VAE, image heads), and\n"
	"every module or tensor matching a --skip pattern (fnmatch: e.g.\n"
	"'model.layers.0.*'). hi3 -m OUT runs the result (hi3-quant(7)).\n",
	.footer = "Exit status: 0 written, 2 usage, 3 a bad or already quantized checkpoint (nothing written).\n",
};

static const struct cli_choice formats[] = {{"fp8", 0, NULL}, {"int8", 1, NULL}, {NULL, 0, NULL}};

static const char **skips;
static int n_skip;

static int add_skip(const struct cli_option *opt, const char *arg)
{
	const char **p = realloc(skips, sizeof(*p) * (size_t)(n_skip + 1));

	(void)opt;
	if (!p)
		return cli_usage_error("out of memory");
	skips = p;
	skips[n_skip++] = arg;
	return 0;
}

int cmd_quantize(int argc, char **argv)
{
	hi3_quantize_opts o = {.int8 = -1};
	hi3_quantize_result r;
	hi3_error err = {0};
	const char *out = NULL;
	char a[32], b[32];
	int rc;
	struct cli_option options[] = {
		OPT_GLOBALS(),
		OPT_CHOICE(0, "to", &o.int8, formats, "fp8 (compressed-tensors, per channel) or int8 (bitsandbytes)",
		           .flags = CLI_OPT_REQUIRED),
		OPT_CALLBACK(0, "skip", NULL, "PATTERN", add_skip, "keep the modules or tensors matching PATTERN as stored "
		             "(repeatable)"),
		OPT_OUTPUT(&out, "OUT", "the directory to write (created if missing)"),
		OPT_END(),
	};

	if ((argc = cli_parse_options(argc, argv, options, &help, 0)) < 0)
		return CLI_PARSE_STATUS(argc);
	if (!cli.model_dir)
		return cli_usage_error("no model: give -m DIR (a directory with config.json)");
	if (cli_same_file(cli.model_dir, out))
		return cli_usage_error("-o %s is the model directory itself", out);
	o.skip = skips;
	o.n_skip = n_skip;
	rc = hi3_quantize(cli.model_dir, out, &o, &r, &err);
	free(skips);
	if (rc != 0)
		return cli_fail(&err);
	cli_info("%s to %s (%s): %d tensors quantized, %d kept, %d file%s; quantized matrices %s -> "
	        "%s; max |dequantized - source| %.3g", cli.model_dir, out, o.int8 ? "int8" : "fp8", r.quantized, r.kept,
	        r.shards, r.shards == 1 ? "" : "s", hi3_format_bytes(r.bytes_in, a), hi3_format_bytes(r.bytes_out, b),
	        r.max_abs_error);
	return 0;
}
