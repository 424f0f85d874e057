/* cmd-prefill.c -- hi3 prefill: run the prompt batch, write the KV file. */
#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "commands.h"

const char cmd_prefill_help[] =
	"usage: hi3 prefill -m MODEL [--max-new N] [--kv-dtype f32|bf16] [--record-routing] [--json] COND -o KV\n"
	"\n"
	"Run the right-padded prompt batch of the conditions file COND through the\n"
	"model and write the static KV cache file KV (format hi3.kv): per layer K and V\n"
	"of shape (B, n_kv, C, d) with C = L + N slots, kv_len, each row's next-token\n"
	"logits taken at its last real column n_i - 1, and room for N new tokens.\n"
	"K/V of column t go to cache slot position_ids[t]; a query attends columns up\n"
	"to its own and its image block. COND may be '-' (standard input).\n"
	"\n"
	"  -m, --model DIR        model directory\n"
	"  -n, --max-new N        new tokens the cache has room for (default 64)\n"
	"      --kv-dtype T       cache dtype: f32 (default) or bf16\n"
	"      --chunk-tokens N   tokens per forward call; rows are grouped (default 8192)\n"
	"      --record-routing   MoE: store each prompt token's experts and weights\n"
	"                         (prompt_route_ids, prompt_route_w)\n"
	"      --json             print a JSON summary on standard output\n"
	"  -o, --output KV        the KV file to write (atomically)\n";

enum { OPT_KV_DTYPE = CLI_OPT_FIRST_LOCAL, OPT_CHUNK, OPT_JSON, OPT_ROUTING };

static void progress(void *ctx, int64_t done, int64_t total)
{
	(void)ctx;
	cli_progress("prefill rows", done, total);
}

int cmd_prefill(int argc, char **argv)
{
	static const struct option opts[] = {
		CLI_GLOBAL_LONGOPTS,
		{"max-new", required_argument, NULL, 'n'},
		{"kv-dtype", required_argument, NULL, OPT_KV_DTYPE},
		{"chunk-tokens", required_argument, NULL, OPT_CHUNK},
		{"json", no_argument, NULL, OPT_JSON},
		{"record-routing", no_argument, NULL, OPT_ROUTING},
		{"output", required_argument, NULL, 'o'},
		{NULL, 0, NULL, 0},
	};
	hi3_prefill_opts o = {.max_new = 64, .kv_dtype = HI3_F32, .progress = progress};
	const char *out = NULL, *cond_path;
	hi3_model *m = NULL;
	hi3_cond *c = NULL;
	hi3_error err = {0};
	int ch, rc, json = 0;
	int64_t v;
	double t0;

	while ((ch = getopt_long(argc, argv, CLI_GLOBAL_SHORT "n:o:", opts, NULL)) != -1) {
		switch (ch) {
		case 'n':
			if (cli_int("--max-new", optarg, 0, 1 << 24, &v))
				return HI3_ERR_USAGE;
			o.max_new = (int)v;
			break;
		case OPT_KV_DTYPE:
			if (cli_dtype("--kv-dtype", optarg, &o.kv_dtype))
				return HI3_ERR_USAGE;
			break;
		case OPT_CHUNK:
			if (cli_int("--chunk-tokens", optarg, 1, INT32_MAX, &v))
				return HI3_ERR_USAGE;
			o.max_tokens = (int)v;
			break;
		case OPT_JSON:
			json = 1;
			break;
		case OPT_ROUTING:
			o.record_routing = 1;
			break;
		case 'o':
			out = optarg;
			break;
		default:
			if ((rc = cli_other_option(ch, optarg)) >= 0)
				return rc;
		}
	}
	if (optind + 1 != argc)
		return cli_usage_error("expected one conditions file, found %d arguments", argc - optind);
	if (!out)
		return cli_usage_error("-o KV is required");
	if (!strcmp(out, "-"))
		return cli_usage_error("-o: the KV file is updated in place by decode; it cannot be standard output");
	cond_path = argv[optind];
	if (cli_open_cond_model(cond_path, &c, &m, &err) != 0)
		return cli_fail(&err);
	t0 = cli_now();
	rc = hi3_prefill(m, c, cond_path, &o, out, &err);
	cli_progress_end();
	if (rc == 0) {
		double s = cli_now() - t0;
		int64_t tok = 0;
		for (int i = 0; i < c->B; i++)
			tok += c->real_pos[i];
		cli_info("%d rows, L %d, %lld prompt tokens in %.3f s (%.1f tokens/s); cache C = %d", c->B, c->L,
		         (long long)tok, s, (double)tok / (s > 0 ? s : 1e-9), c->L + o.max_new);
		if (json)
			printf("{\"rows\": %d, \"L\": %d, \"C\": %d, \"prompt_tokens\": %lld, \"padded_tokens\": %lld, "
			       "\"seconds\": %.6f, \"tokens_per_s\": %.3f}\n", c->B, c->L, c->L + o.max_new,
			       (long long)tok, (long long)c->B * c->L, s, (double)tok / (s > 0 ? s : 1e-9));
	}
	hi3_model_close(m);
	hi3_cond_close(c);
	return rc ? cli_fail(&err) : 0;
}
