/* cmd-prefill.c -- hi3 prefill: run the prompt batch, write the KV file. */
#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "commands.h"

static const struct cli_help help = {
	.usage = {"hi3 prefill -m MODEL [--max-new N] [--kv-dtype f32|bf16] [--record-routing] [--json] [--trace FILE] COND -o KV"},
	.description =
	"Run the right-padded prompt batch of the conditions file COND through the\n"
	"model and write the static KV cache file KV (format hi3.kv): per layer K and V\n"
	"of shape (B, n_kv, C, d) with C = L + N slots, kv_len, each row's next-token\n"
	"logits taken at its last real column n_i - 1, and room for N new tokens.\n"
	"K/V of column t go to cache slot position_ids[t]; a query attends columns up\n"
	"to its own and its image block. COND may be '-' (standard input).\n",
	.operands = "one conditions file", .min_operands = 1, .max_operands = 1,
};

int cmd_prefill(int argc, char **argv)
{
	hi3_prefill_opts o = {.max_new = 64, .kv_dtype = HI3_F32, .progress = cli_progress_fn,
	                      .progress_ctx = "prefill rows"};
	const char *out = NULL, *cond_path;
	hi3_model *m = NULL;
	hi3_cond *c = NULL;
	hi3_error err = {0};
	struct cli_trace trace = {0};
	int rc, json = 0;
	double t0;
	struct cli_option options[] = {
		OPT_STRING('m', "model", &cli.model_dir, "DIR", "model directory"),
		OPT_INT('n', "max-new", &o.max_new, 0, 1 << 24, "N", "new tokens the cache has room for (default 64)"),
		OPT_KV_DTYPE(&o.kv_dtype),
		OPT_CHUNK_TOKENS(&o.max_tokens, "tokens per forward call, rows grouped (default 8192)"),
		OPT_RECORD_ROUTING(&o.record_routing, "MoE: store each prompt token's experts and weights "
		                   "(prompt_route_ids, prompt_route_w)"),
		OPT_JSON(&json, "print a JSON summary on standard output"),
		OPT_OUTPUT(&out, "KV", "the KV file to write (atomically)"),
		OPT_TRACE(&trace),
		OPT_GLOBALS(),
		OPT_END(),
	};

	if ((argc = cli_parse_options(argc, argv, options, &help, 0)) < 0)
		return CLI_PARSE_STATUS(argc);
	if (!strcmp(out, "-"))
		return cli_usage_error("-o: the KV file is updated in place by decode; it cannot be standard output");
	cond_path = argv[0];
	if (cli_open_cond_model(cond_path, &c, &m, &err) != 0)
		return cli_fail(&err);
	t0 = cli_now();
	rc = cli_trace_open(&trace, m, (const char *[]){cond_path, out, NULL}, &o.trace, &err);
	if (rc == 0)
		rc = hi3_prefill(m, c, cond_path, &o, out, &err);
	cli_progress_end();
	if (rc == 0)
		rc = cli_trace_write(&trace, o.trace, &err);
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
	hi3_trace_free(o.trace);
	cli_close_model(m);
	hi3_cond_close(c);
	return rc ? cli_fail(&err) : 0;
}
