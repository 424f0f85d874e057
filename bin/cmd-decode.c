/* cmd-decode.c -- hi3 decode: sample new tokens into the KV file, write a segment. */
#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "commands.h"

const char cmd_decode_help[] =
	"usage: hi3 decode -m MODEL [options] COND KV -o SEG\n"
	"\n"
	"Decode new tokens for every row of the batch from the KV file KV (made by\n"
	"'hi3 prefill' from COND), updating KV in place, and write the segment file SEG\n"
	"(format hi3.segment: packed tokens, their log-probs at temperature 1 under the\n"
	"unmodified logits, cu_seqlens, stop_reason). Row i's k-th new token sits at\n"
	"index n_i + k, its K/V at that slot, and its query attends slots [0, n_i + k].\n"
	"Each step is committed to KV before the next, so a killed decode continues\n"
	"from its last step when run again and gives the same result.\n"
	"\n"
	"sampling (default greedy; ties to the lowest id):\n"
	"      --greedy             argmax decoding\n"
	"      --temperature T      sample at temperature T (> 0)\n"
	"      --top-k K            keep the K most likely tokens (implies sampling)\n"
	"      --top-p P            keep the smallest set with mass >= P (implies sampling)\n"
	"      --seed S             use seed S for every row instead of the conditions' seeds\n"
	"      --stop ID,...        stop tokens for every row (default: the conditions',\n"
	"                           from each row's bot_task)\n"
	"steps:\n"
	"  -n, --max-new N          stop each row after N tokens (at most the cache's room)\n"
	"      --steps K            run at most K steps in this call; a later call continues\n"
	"      --resume             continue an interrupted or partial decode (any call\n"
	"                           continues from the last committed step; this says so)\n"
	"      --no-fsync           keep each step's commit ordered but skip msync\n"
	"reproducing upstream defects (each breaks batch parity on purpose):\n"
	"      --decode-mask=none        attend every cache slot, pads and unwritten ones too\n"
	"      --token-placement=tail    feed the token at the padded tail column L + k\n"
	"other:\n"
	"      --record-routing     store each generated token's MoE experts and weights\n"
	"      --json               print a JSON summary on standard output\n"
	"  -o, --output SEG         the segment file to write (atomically; '-' for stdout)\n";

enum {
	OPT_GREEDY = CLI_OPT_FIRST_LOCAL, OPT_TEMP, OPT_TOPK, OPT_TOPP, OPT_SEED, OPT_STOP, OPT_STEPS, OPT_RESUME,
	OPT_MASK, OPT_PLACE, OPT_ROUTING, OPT_JSON, OPT_NOFSYNC,
};

static void progress(void *ctx, int64_t done, int64_t total)
{
	(void)ctx;
	cli_progress("decode steps", done, total);
}

int cmd_decode(int argc, char **argv)
{
	static const struct option opts[] = {
		CLI_GLOBAL_LONGOPTS,
		{"greedy", no_argument, NULL, OPT_GREEDY},
		{"temperature", required_argument, NULL, OPT_TEMP},
		{"top-k", required_argument, NULL, OPT_TOPK},
		{"top-p", required_argument, NULL, OPT_TOPP},
		{"seed", required_argument, NULL, OPT_SEED},
		{"stop", required_argument, NULL, OPT_STOP},
		{"max-new", required_argument, NULL, 'n'},
		{"steps", required_argument, NULL, OPT_STEPS},
		{"resume", no_argument, NULL, OPT_RESUME},
		{"no-fsync", no_argument, NULL, OPT_NOFSYNC},
		{"decode-mask", required_argument, NULL, OPT_MASK},
		{"token-placement", required_argument, NULL, OPT_PLACE},
		{"record-routing", no_argument, NULL, OPT_ROUTING},
		{"json", no_argument, NULL, OPT_JSON},
		{"output", required_argument, NULL, 'o'},
		{NULL, 0, NULL, 0},
	};
	hi3_decode_opts o = {.sampler = {.greedy = 1, .temperature = 1.0, .top_k = 0, .top_p = 1.0},
	                     .progress = progress};
	int64_t stop[256], v;
	int greedy_flag = 0, sampling_flag = 0, json = 0, resume = 0, ch, rc;
	const char *out = NULL;
	hi3_model *m = NULL;
	hi3_cond *c = NULL;
	hi3_decode_stats st;
	hi3_error err = {0};
	double d;

	while ((ch = getopt_long(argc, argv, CLI_GLOBAL_SHORT "n:o:", opts, NULL)) != -1) {
		switch (ch) {
		case OPT_GREEDY:
			greedy_flag = 1;
			break;
		case OPT_TEMP:
			if (cli_double("--temperature", optarg, 0.0, 1e6, &d))
				return HI3_ERR_USAGE;
			o.sampler.temperature = d;
			sampling_flag = 1;
			break;
		case OPT_TOPK:
			if (cli_int("--top-k", optarg, 0, INT32_MAX, &v))
				return HI3_ERR_USAGE;
			o.sampler.top_k = (int)v;
			sampling_flag = 1;
			break;
		case OPT_TOPP:
			if (cli_double("--top-p", optarg, 0.0, 1.0, &d))
				return HI3_ERR_USAGE;
			if (d <= 0.0)
				return cli_usage_error("--top-p: must be > 0");
			o.sampler.top_p = d;
			sampling_flag = 1;
			break;
		case OPT_SEED:
			if (cli_int("--seed", optarg, 0, INT64_MAX, &v))
				return HI3_ERR_USAGE;
			o.have_seed = 1;
			o.seed = (uint64_t)v;
			break;
		case OPT_STOP: {
			int n = cli_int_list("--stop", optarg, 0, INT32_MAX, stop, 256);
			if (n < 0)
				return HI3_ERR_USAGE;
			o.have_stop = 1;
			o.stop = stop;
			o.n_stop = n;
			break;
		}
		case 'n':
			if (cli_int("--max-new", optarg, 1, 1 << 24, &v))
				return HI3_ERR_USAGE;
			o.max_new = (int)v;
			break;
		case OPT_STEPS:
			if (cli_int("--steps", optarg, 1, INT32_MAX, &v))
				return HI3_ERR_USAGE;
			o.steps = (int)v;
			break;
		case OPT_RESUME:
			resume = 1;
			break;
		case OPT_NOFSYNC:
			o.no_fsync = 1;
			break;
		case OPT_MASK:
			if (!strcmp(optarg, "causal"))
				o.decode_mask = HI3_MASK_CAUSAL;
			else if (!strcmp(optarg, "none"))
				o.decode_mask = HI3_MASK_NONE;
			else
				return cli_usage_error("--decode-mask: expected causal or none, found '%s'", optarg);
			break;
		case OPT_PLACE:
			if (!strcmp(optarg, "index"))
				o.placement = HI3_PLACE_INDEX;
			else if (!strcmp(optarg, "tail"))
				o.placement = HI3_PLACE_TAIL;
			else
				return cli_usage_error("--token-placement: expected index or tail, found '%s'", optarg);
			break;
		case OPT_ROUTING:
			o.record_routing = 1;
			break;
		case OPT_JSON:
			json = 1;
			break;
		case 'o':
			out = optarg;
			break;
		default:
			if ((rc = cli_other_option(ch, optarg)) >= 0)
				return rc;
		}
	}
	if (optind + 2 != argc)
		return cli_usage_error("expected COND and KV, found %d arguments", argc - optind);
	if (!out)
		return cli_usage_error("-o SEG is required");
	if (greedy_flag && sampling_flag)
		return cli_usage_error("--greedy conflicts with --temperature/--top-k/--top-p");
	if (sampling_flag && o.sampler.temperature > 0.0)
		o.sampler.greedy = 0;
	if (!strcmp(argv[optind + 1], "-"))
		return cli_usage_error("KV is updated in place: it must be a file, not standard input");
	if (o.decode_mask == HI3_MASK_NONE)
		cli_warn("--decode-mask=none reproduces a known upstream defect: decode attends pad slots and "
		         "never-written cache slots; batched results will differ from rows run alone");
	if (o.placement == HI3_PLACE_TAIL)
		cli_warn("--token-placement=tail reproduces a known upstream defect: new tokens go to the padded "
		         "tail, so short rows re-read their own pad as input");
	if (cli_open_cond_model(argv[optind], &c, &m, &err) != 0)
		return cli_fail(&err);
	rc = hi3_decode(m, c, argv[optind + 1], &o, out, &st, &err);
	cli_progress_end();
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
	hi3_model_close(m);
	hi3_cond_close(c);
	return rc ? cli_fail(&err) : 0;
}
