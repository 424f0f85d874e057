/* cmd-init-model.c -- hi3 init-model: write a random-init checkpoint. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "commands.h"

const char cmd_init_model_help[] =
	"usage: hi3 init-model --preset NAME [--seed N] [--dtype f32|bf16] [--set FIELD=VALUE]... -o DIR\n"
	"\n"
	"Write a deterministic random-init checkpoint with the upstream tensor names:\n"
	"config.json, model.safetensors, generation_config.json, tokenizer.json and\n"
	"tokenizer_config.json. The same preset, seed and overrides give the same bytes.\n"
	"\n"
	"  -p, --preset NAME    tiny (2 layers, hidden 128, dense MLP), tiny-moe (4 experts\n"
	"                       top-2, shared MLP, qk-norm, GQA) or small (~300M parameters)\n"
	"  -s, --seed N         random seed (default 0)\n"
	"      --dtype T        weight dtype: f32 (default) or bf16; the MoE router stays f32\n"
	"      --set F=V        override config field F with the JSON value V\n"
	"                       (e.g. --set num_hidden_layers=4 --set num_experts=[4,8])\n"
	"  -o, --output DIR     directory to write (created if missing)\n";

enum { OPT_DTYPE = CLI_OPT_FIRST_LOCAL, OPT_SET };

int cmd_init_model(int argc, char **argv)
{
	static const struct option opts[] = {
		CLI_GLOBAL_LONGOPTS,
		{"preset", required_argument, NULL, 'p'},
		{"seed", required_argument, NULL, 's'},
		{"dtype", required_argument, NULL, OPT_DTYPE},
		{"set", required_argument, NULL, OPT_SET},
		{"output", required_argument, NULL, 'o'},
		{NULL, 0, NULL, 0},
	};
	hi3_init_opts o = {.dtype = HI3_F32};
	const char *out = NULL;
	json_t *ov = json_object();
	hi3_error err = {0};
	int c, rc;
	int64_t v;

	while ((c = getopt_long(argc, argv, CLI_GLOBAL_SHORT "p:s:o:", opts, NULL)) != -1) {
		switch (c) {
		case 'p':
			o.preset = optarg;
			break;
		case 's':
			if (cli_int("--seed", optarg, 0, INT64_MAX, &v))
				goto usage;
			o.seed = (uint64_t)v;
			break;
		case OPT_DTYPE:
			if (cli_dtype("--dtype", optarg, &o.dtype))
				goto usage;
			break;
		case OPT_SET: {
			char *eq = strchr(optarg, '=');
			json_t *val;
			if (!eq || eq == optarg) {
				cli_usage_error("--set: expected FIELD=VALUE, found '%s'", optarg);
				goto usage;
			}
			*eq = '\0';
			val = json_loads(eq + 1, JSON_DECODE_ANY, NULL);
			if (!val)
				val = json_string(eq + 1);
			json_object_set_new(ov, optarg, val);
			break;
		}
		case 'o':
			out = optarg;
			break;
		default:
			if ((rc = cli_other_option(c, optarg)) >= 0) {
				json_decref(ov);
				return rc;
			}
		}
	}
	if (optind < argc) {
		cli_usage_error("unexpected argument '%s'", argv[optind]);
		goto usage;
	}
	if (!o.preset || !out) {
		cli_usage_error("--preset and -o are required");
		goto usage;
	}
	{
		char *text = json_dumps(ov, JSON_COMPACT);
		o.overrides = text;
		rc = hi3_init_model(out, &o, &err);
		free(text);
	}
	json_decref(ov);
	if (rc != 0)
		return cli_fail(&err);
	cli_info("wrote preset '%s' (seed %llu, %s) to %s", o.preset, (unsigned long long)o.seed,
	         o.dtype == HI3_BF16 ? "bf16" : "f32", out);
	return 0;
usage:
	json_decref(ov);
	return HI3_ERR_USAGE;
}
