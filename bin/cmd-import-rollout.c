/* cmd-import-rollout.c -- hi3 import-rollout: another engine's rollout into
 * conditions and a segment, for hi3 replay. */
#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "commands.h"

static const struct cli_help help = {
	.usage = {"hi3 import-rollout -m MODEL [--seed N] [--json] ROLLOUT -o COND --segment SEG"},
	.description =
	"Turn another engine's rollout -- JSONL, one request per line, with its prompt\n"
	"token ids and each completion's token ids, per-token log-probs, finish reason\n"
	"and optionally routed experts, as vLLM and SGLang return them (the manual page\n"
	"lists the fields) -- into a conditions file COND (each completion a\n"
	"row, its prompt pre-tokenized) and a segment file SEG (the completions and the\n"
	"engine's log-probs), so that 'hi3 replay COND SEG' measures that engine's\n"
	"rollout/replay gap and 'hi3 replay --trace' localises it. The engines' default\n"
	"log-probs may be taken after temperature (SGLang) or before it (vLLM V1): the\n"
	"gap is meaningful against hi3's temperature-1 log-probs only for the latter.\n",
	.operands = "one ROLLOUT file", .min_operands = 1, .max_operands = 1,
};

int cmd_import_rollout(int argc, char **argv)
{
	hi3_import_opts o = {0};
	hi3_import_report rep;
	const char *cond = NULL, *seg = NULL;
	hi3_model *m = NULL;
	hi3_error err = {0};
	int json = 0, rc;
	struct cli_option options[] = {
		OPT_GLOBALS(),
		OPT_SEED_BASE(&o.seed_base),
		OPT_JSON(&json, "print a JSON summary on standard output"),
		OPT_OUTPUT(&cond, "COND", "the conditions file to write (atomically)"),
		OPT_STRING(0, "segment", &seg, "SEG", "the segment file to write (atomically)", .flags = CLI_OPT_REQUIRED),
		OPT_END(),
	};

	if ((argc = cli_parse_options(argc, argv, options, &help, 0)) < 0)
		return CLI_PARSE_STATUS(argc);
	if (!strcmp(cond, "-") || !strcmp(seg, "-"))
		return cli_usage_error("-o and --segment name files (replay reads both)");
	if (cli_same_file(cond, seg) || cli_same_file(argv[0], cond) || cli_same_file(argv[0], seg))
		return cli_usage_error("ROLLOUT, -o and --segment must name three different files");
	if (cli_open_model(&m, &err) != 0 || hi3_import_rollout(m, argv[0], &o, cond, seg, &rep, &err) != 0) {
		rc = cli_fail(&err);
		goto out;
	}
	cli_info("%d requests, %d rows: %lld prompt and %lld response tokens, log-probs from %s%s; into %s and %s",
	         rep.lines, rep.rows, (long long)rep.prompt_tokens, (long long)rep.response_tokens, rep.source,
	         rep.routed ? ", routed experts" : "", cond, seg);
	if (json)
		printf("{\"lines\": %d, \"rows\": %d, \"prompt_tokens\": %lld, \"response_tokens\": %lld, \"source\": "
		       "\"%s\", \"routed_experts\": %s}\n", rep.lines, rep.rows, (long long)rep.prompt_tokens,
		       (long long)rep.response_tokens, rep.source, rep.routed ? "true" : "false");
	rc = 0;
out:
	hi3_model_close(m);
	return rc;
}
