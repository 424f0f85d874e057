/* cmd-tokenize-concat.c -- hi3 tokenize-concat: requests to a conditions
 * file, or conditions files merged into one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "commands.h"

const char cmd_tokenize_concat_help[] =
	"usage: hi3 tokenize-concat [-m DIR] [--tokenizer FILE] [--template NAME] [--batch | --per-row] "
	"[--pad-positions continue|zero] [--max-length N] [--seed N] [--pad-id N] [--drop-think] -o OUT REQUESTS\n"
	"   or: hi3 tokenize-concat --concat [--pad-positions continue|zero] -o OUT COND...\n"
	"\n"
	"Encode JSONL requests (one JSON object per line; '-' reads standard input)\n"
	"with the sequence template into a conditions file (hi3-files(5)), right\n"
	"padded: pads take the pad id, and their position ids continue the row's own\n"
	"indices. With --concat, merge conditions files of any B and L into one.\n"
	"\n"
	"  -m, --model DIR        config.json, tokenizer.json, tokenizer_config.json and\n"
	"                         generation_config.json; the weights give the fingerprint\n"
	"      --tokenizer FILE   the tokenizer.json to use (default: DIR/tokenizer.json)\n"
	"      --template NAME    pretrain or instruct (default: generation_config.json's\n"
	"                         sequence_template, else pretrain)\n"
	"      --batch            encode the whole batch and pad it at once (default)\n"
	"      --per-row          encode each row alone into its own conditions, then merge\n"
	"      --pad-positions P  continue (default) or zero: pads get position 0, the\n"
	"                         upstream defect, to reproduce it on purpose\n"
	"      --max-length N     refuse a row of more than N tokens\n"
	"      --seed N           seed of row i without \"seed\": N + i (default 0)\n"
	"      --pad-id N         the pad token id (default: from the model)\n"
	"      --drop-think       drop the <think>...</think> parts of cot texts\n"
	"      --concat           merge the conditions files COND... instead\n"
	"  -o, --output OUT       the conditions file to write ('-': standard output)\n";

enum {
	OPT_TOKENIZER = CLI_OPT_FIRST_LOCAL, OPT_TEMPLATE, OPT_BATCH, OPT_PER_ROW, OPT_PAD_POS, OPT_MAX_LEN,
	OPT_SEED, OPT_PAD_ID, OPT_DROP_THINK, OPT_CONCAT,
};

static int concat(char **files, int n, const char *out, int pad_zero)
{
	hi3_cond **in = calloc((size_t)n, sizeof(*in)), *merged = NULL;
	hi3_error err = {0};
	int rc = -1;

	if (!in) {
		hi3_error_set(&err, HI3_ERR_RUNTIME, "out of memory");
		return cli_fail(&err);
	}
	for (int i = 0; i < n; i++)
		if (hi3_cond_open(&in[i], files[i], &err) != 0)
			goto out;
	if (hi3_cond_concat(&merged, (const hi3_cond *const *)in, n, pad_zero, &err) != 0 ||
	    hi3_cond_write(merged, out, &err) != 0)
		goto out;
	cli_info("merged %d files: %d rows, L = %d, into %s", n, merged->B, merged->L, out);
	rc = 0;
out:
	hi3_cond_close(merged);
	for (int i = 0; i < n; i++)
		hi3_cond_close(in[i]);
	free(in);
	return rc ? cli_fail(&err) : 0;
}

static int tokenize(const char *input, const char *out, const hi3_template_opts *to, const hi3_cond_build_opts *bo)
{
	hi3_requests *rq = NULL;
	hi3_template *t = NULL;
	hi3_cond *c = NULL;
	hi3_template_opts o = *to;
	hi3_error err = {0};
	int rc = -1;

	if (hi3_requests_read(&rq, input, &err) != 0)
		goto out;
	o.load_tokenizer = o.tokenizer || hi3_requests_need_tokenizer(rq);
	if (hi3_template_open(&t, &o, &err) != 0 || hi3_cond_build(&c, t, rq, bo, &err) != 0 ||
	    hi3_cond_write(c, out, &err) != 0)
		goto out;
	cli_info("%d requests: %d rows, L = %d (%s, template %s) into %s", hi3_requests_count(rq), c->B, c->L,
	         bo->per_row ? "per row" : "batch", c->template_name, out);
	rc = 0;
out:
	hi3_cond_close(c);
	hi3_template_free(t);
	hi3_requests_free(rq);
	return rc ? cli_fail(&err) : 0;
}

int cmd_tokenize_concat(int argc, char **argv)
{
	static const struct option opts[] = {
		CLI_GLOBAL_LONGOPTS,
		{"tokenizer", required_argument, NULL, OPT_TOKENIZER},
		{"template", required_argument, NULL, OPT_TEMPLATE},
		{"batch", no_argument, NULL, OPT_BATCH},
		{"per-row", no_argument, NULL, OPT_PER_ROW},
		{"pad-positions", required_argument, NULL, OPT_PAD_POS},
		{"max-length", required_argument, NULL, OPT_MAX_LEN},
		{"seed", required_argument, NULL, OPT_SEED},
		{"pad-id", required_argument, NULL, OPT_PAD_ID},
		{"drop-think", no_argument, NULL, OPT_DROP_THINK},
		{"concat", no_argument, NULL, OPT_CONCAT},
		{"output", required_argument, NULL, 'o'},
		{NULL, 0, NULL, 0},
	};
	hi3_template_opts to = {.pad_id = -1};
	hi3_cond_build_opts bo = {0};
	const char *out = NULL;
	int c, rc, do_concat = 0, n_mode = 0, build_only = 0;

	while ((c = getopt_long(argc, argv, CLI_GLOBAL_SHORT "o:", opts, NULL)) != -1) {
		switch (c) {
		case OPT_TOKENIZER:
			build_only = 1;
			to.tokenizer = optarg;
			break;
		case OPT_TEMPLATE:
			build_only = 1;
			if (strcmp(optarg, "pretrain") && strcmp(optarg, "instruct"))
				return cli_usage_error("--template: expected pretrain or instruct, found '%s'", optarg);
			to.name = optarg;
			break;
		case OPT_BATCH:
		case OPT_PER_ROW:
			build_only = 1;
			bo.per_row = c == OPT_PER_ROW;
			n_mode++;
			break;
		case OPT_PAD_POS:
			if (strcmp(optarg, "continue") && strcmp(optarg, "zero"))
				return cli_usage_error("--pad-positions: expected continue or zero, found '%s'", optarg);
			bo.pad_zero = !strcmp(optarg, "zero");
			break;
		case OPT_MAX_LEN:
			build_only = 1;
			if (cli_int("--max-length", optarg, 1, INT32_MAX, &bo.max_length))
				return HI3_ERR_USAGE;
			break;
		case OPT_SEED:
			build_only = 1;
			if (cli_int("--seed", optarg, INT64_MIN, INT64_MAX, &bo.seed_base))
				return HI3_ERR_USAGE;
			break;
		case OPT_PAD_ID:
			build_only = 1;
			if (cli_int("--pad-id", optarg, 0, INT64_MAX, &to.pad_id))
				return HI3_ERR_USAGE;
			break;
		case OPT_DROP_THINK:
			build_only = 1;
			to.drop_think = 1;
			break;
		case OPT_CONCAT:
			do_concat = 1;
			break;
		case 'o':
			out = optarg;
			break;
		default:
			if ((rc = cli_other_option(c, optarg)) >= 0)
				return rc;
		}
	}
	if (!out)
		return cli_usage_error("-o OUT is required");
	if (n_mode > 1)
		return cli_usage_error("give one of --batch and --per-row");
	if (bo.pad_zero)
		cli_warn("--pad-positions=zero: pad columns get position id 0, the upstream defect, on purpose: "
		         "every pad writes cache slot 0 and overwrites the row's first token");
	if (do_concat) {
		if (build_only)
			return cli_usage_error("--concat takes only --pad-positions and -o (the other options build "
			                       "conditions from requests)");
		if (optind >= argc)
			return cli_usage_error("--concat needs at least one conditions file");
		return concat(argv + optind, argc - optind, out, bo.pad_zero);
	}
	if (argc - optind != 1)
		return cli_usage_error("expected one REQUESTS file ('-' for standard input)");
	to.model_dir = cli.model_dir;
	to.fingerprint = cli.model_dir != NULL;
	return tokenize(argv[optind], out, &to, &bo);
}
