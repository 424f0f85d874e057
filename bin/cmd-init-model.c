/* cmd-init-model.c -- hi3 init-model: write a random-init checkpoint. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "commands.h"

static const struct cli_help help = {
	.usage = {"hi3 init-model --preset NAME [--seed N] [--dtype f32|bf16] [--set FIELD=VALUE]... -o DIR"},
	.description =
	"Write a deterministic random-init checkpoint with the upstream tensor names:\n"
	"config.json, model.safetensors, generation_config.json, tokenizer.json and\n"
	"tokenizer_config.json. The same preset, seed and overrides give the same bytes.\n",
	.operands = "no arguments",
};

/* --set FIELD=VALUE into the JSON object of overrides (VALUE is JSON, else a string). */
static int set_field(const struct cli_option *opt, const char *arg)
{
	const char *eq = strchr(arg, '=');
	json_t *val;
	char *field;
	int rc;

	if (!eq || eq == arg)
		return cli_usage_error("--set: expected FIELD=VALUE, found '%s'", arg), -1;
	val = json_loads(eq + 1, JSON_DECODE_ANY, NULL);
	if (!val)
		val = json_string(eq + 1);
	field = strndup(arg, (size_t)(eq - arg));
	rc = field && val ? json_object_set_new(opt->value, field, val) : -1;
	if (!field)
		json_decref(val);
	free(field);
	if (rc != 0)
		return cli_usage_error("--set: cannot set '%s'", arg), -1;
	return 0;
}

int cmd_init_model(int argc, char **argv)
{
	hi3_init_opts o = {.dtype = HI3_F32};
	const char *out = NULL;
	json_t *ov = json_object();
	hi3_error err = {0};
	char *text;
	int rc;
	struct cli_option options[] = {
		OPT_STRING('p', "preset", &o.preset, "NAME", "tiny (2 layers, hidden 128, dense MLP), tiny-moe "
		           "(4 experts top-2, shared MLP, qk-norm, GQA), small (~300M parameters), or the released "
		           "checkpoints scaled down, every module with upstream's names, bf16, sharded: tiny-release "
		           "(base), tiny-instruct, tiny-distil (Instruct-Distil)",
		           .flags = CLI_OPT_REQUIRED),
		OPT_SEED('s', &o.seed, "random seed (default 0)"),
		OPT_DTYPE(0, "dtype", &o.dtype, "weight dtype: f32 (default; the release presets bf16) or bf16; the MoE "
		          "router stays f32", .given = &o.dtype_given),
		OPT_CALLBACK(0, "set", ov, "F=V", set_field, "override config field F with the JSON value V "
		             "(e.g. --set num_hidden_layers=4 --set num_experts=[4,8])"),
		OPT_OUTPUT(&out, "DIR", "directory to write (created if missing)"),
		OPT_GLOBALS(),
		OPT_END(),
	};

	if (!ov)
		return HI3_ERR_RUNTIME;
	if ((argc = cli_parse_options(argc, argv, options, &help, 0)) < 0) {
		json_decref(ov);
		return CLI_PARSE_STATUS(argc);
	}
	text = json_dumps(ov, JSON_COMPACT);
	o.overrides = text;
	rc = hi3_init_model(out, &o, &err);
	free(text);
	json_decref(ov);
	if (rc != 0)
		return cli_fail(&err);
	cli_info("wrote preset '%s' (seed %llu%s%s) to %s", o.preset, (unsigned long long)o.seed,
	         o.dtype_given ? ", " : "", o.dtype_given ? (o.dtype == HI3_BF16 ? "bf16" : "f32") : "", out);
	return 0;
}
