/* cmd-decode.c -- hi3 decode: sample new tokens into the KV file, write a segment. */
#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "commands.h"

static const struct cli_help help = {
	.usage = {"hi3 decode -m MODEL [options] COND KV -o SEG"},
	.description =
	"Decode new tokens for every row of the batch from the KV file KV (made by\n"
	"'hi3 prefill' from COND), updating KV in place, and write the segment file SEG\n"
	"(format hi3.segment: packed tokens, their log-probs at temperature 1 under the\n"
	"unmodified logits, cu_seqlens, stop_reason). Row i's k-th new token sits at\n"
	"index n_i + k, its K/V at that slot, and its query attends slots [0, n_i + k].\n"
	"Each step is committed to KV before the next, so a killed decode continues\n"
	"from its last step when run again and gives the same result.\n",
	.operands = "COND and KV", .min_operands = 2, .max_operands = 2,
};

int cmd_decode(int argc, char **argv)
{
	hi3_decode_opts o = {.sampler = {.greedy = 1, .temperature = 1.0, .top_k = 0, .top_p = 1.0},
	                     .progress = cli_progress_fn, .progress_ctx = "decode steps"};
	int64_t stop[256];
	int greedy = 0, sampling = 0, json = 0, resume = 0, rc;
	const char *out = NULL;
	hi3_model *m = NULL;
	hi3_cond *c = NULL;
	hi3_decode_stats st;
	hi3_error err = {0};
	struct cli_trace trace = {0};
	struct cli_option options[] = {
		OPT_GLOBALS(),
		OPT_GROUP("sampling (default: as the model's generation_config.json asks, greedy unless do_sample):"),
		OPT_FLAG(0, "greedy", &greedy, "argmax decoding, ties to the lowest id"),
		OPT_SAMPLER(&o.sampler, &sampling),
		OPT_SEED(0, &o.seed, "seed N for every row instead of its seed in COND", .given = &o.have_seed),
		OPT_INT_LIST(0, "stop", stop, &o.n_stop, 0, INT32_MAX, "ID,...",
		             "stop tokens for every row (default: the conditions', from each row's bot_task)",
		             .given = &o.have_stop),
		OPT_GROUP("steps:"),
		OPT_INT('n', "max-new", &o.max_new, 1, 1 << 24, "N",
		        "stop each row after N tokens (at most the cache's room)"),
		OPT_INT(0, "steps", &o.steps, 1, INT32_MAX, "K",
		        "run at most K steps in this call; a later call continues"),
		OPT_FLAG(0, "resume", &resume, "continue an interrupted or partial decode (any call continues from the "
		         "last committed step; this says so)"),
		OPT_FLAG(0, "no-fsync", &o.no_fsync, "keep each step's commit ordered but skip msync"),
		OPT_GROUP_DEFECTS(),
		OPT_DECODE_MASK(&o.decode_mask),
		OPT_TOKEN_PLACEMENT(&o.placement),
		OPT_GROUP("other:"),
		OPT_RECORD_ROUTING(&o.record_routing, "store each generated token's MoE experts and weights"),
		OPT_JSON(&json, "print a JSON summary on standard output"),
		OPT_OUTPUT(&out, "SEG", "the segment file to write (atomically; '-' for stdout)"),
		OPT_TRACE(&trace),
		OPT_END(),
	};

	o.stop = stop;
	if ((argc = cli_parse_options(argc, argv, options, &help, 0)) < 0)
		return CLI_PARSE_STATUS(argc);
	if (greedy && sampling)
		return cli_usage_error("--greedy conflicts with --temperature/--top-k/--top-p");
	if (sampling && o.sampler.temperature > 0.0)
		o.sampler.greedy = 0;
	if (!strcmp(argv[1], "-"))
		return cli_usage_error("KV is updated in place: it must be a file, not standard input");
	if (cli_open_cond_model(argv[0], &c, &m, &err) != 0)
		return cli_fail(&err);
	if (!greedy && !sampling) {
		hi3_gen_defaults_sampler(hi3_model_gen_defaults(m), &o.sampler);
		if (!o.sampler.greedy)
			cli_info("sampling as generation_config.json asks: temperature %g, top_k %d, top_p %g",
			         o.sampler.temperature, o.sampler.top_k, o.sampler.top_p);
	}
	rc = cli_trace_open(&trace, m, (const char *[]){argv[0], argv[1], out, NULL}, &o.trace, &err);
	if (rc == 0)
		rc = hi3_decode(m, c, argv[1], &o, out, &st, &err);
	cli_progress_end();
	if (rc == 0)
		rc = cli_trace_write(&trace, o.trace, &err);
	if (rc == 0) {
		if (st.steps == 0 && st.finished == st.rows)
			cli_info("nothing to decode: all %d rows are finished (segment written again)", st.rows);
		else
			cli_info("%s%lld steps, %lld tokens in %.3f s (%.1f tokens/s); %d of %d rows finished",
			         resume || st.resumed_from ? "resumed; " : "", (long long)st.steps, (long long)st.tokens,
			         st.seconds, (double)st.tokens / (st.seconds > 0 ? st.seconds : 1e-9), st.finished,
			         st.rows);
		if (json && strcmp(out, "-"))
			printf("{\"rows\": %d, \"finished\": %d, \"steps\": %lld, \"tokens\": %lld, \"segment_tokens\": "
			       "%lld, \"resumed_from\": %lld, \"seconds\": %.6f, \"tokens_per_s\": %.3f}\n", st.rows,
			       st.finished, (long long)st.steps, (long long)st.tokens, (long long)st.total_tokens,
			       (long long)st.resumed_from, st.seconds,
			       (double)st.tokens / (st.seconds > 0 ? st.seconds : 1e-9));
	}
	if (rc == 0 && st.steps > 0) {
		double resident, huge;
		hi3_model_pages(m, &resident, &huge);   /* both 0 where /proc cannot say */
		cli_warn_pages(m, resident, huge, 0);
	}
	hi3_trace_free(o.trace);
	cli_close_model(m);
	hi3_cond_close(c);
	return rc ? cli_fail(&err) : 0;
}
