/* cmd-parity.c -- hi3 parity: a batch equals its rows run alone, or shows where not. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "commands.h"

const char cmd_parity_help[] =
	"usage: hi3 parity -m MODEL [options] REQUESTS\n"
	"\n"
	"Run the whole pipeline (tokenize-concat, prefill, decode) for the JSONL\n"
	"requests as a batch -- encoded at once, encoded per row and concatenated, and\n"
	"each row as a right-padded B = 1 -- and each row alone (B = 1, unpadded), and\n"
	"compare per row: the generated tokens, their log-probs, and the prefill K/V of\n"
	"the row's valid slots (slot 0 on its own). One line per case; exit 0 when every\n"
	"case passes. With --ablate, the batched runs restore one upstream defect and\n"
	"every case must break (exit 0 only then). Stage files stay in --workdir.\n"
	"\n"
	"      --steps N,...        decode steps of each case (default 3,5)\n"
	"      --ablate NAME        decode-mask, token-placement or pos-pad\n"
	"      --greedy-only        only greedy decoding (default: greedy and sampled)\n"
	"      --sampled-only       only seeded sampling\n"
	"      --temperature T      sampling temperature (default 0.8)\n"
	"      --top-k K            (default 20)\n"
	"      --top-p P            (default 0.9)\n"
	"      --seed N             seed of a request without \"seed\": N + its index (default 0)\n"
	"      --pad-to L           pad the batched runs to at least L columns (every row padded)\n"
	"      --kv-dtype T         f32 (default) or bf16\n"
	"      --tol X              pass when max |d| <= X (default 0 where the backend is batch\n"
	"                           invariant: the CPU with --batch-invariant=on; else 1e-5)\n"
	"      --workdir DIR        keep the stage files in DIR (default: a temporary directory,\n"
	"                           removed afterwards)\n"
	"      --rows               print every row of every case\n"
	"      --json               one JSON object on standard output instead of the lines\n";

enum {
	OPT_STEPS = CLI_OPT_FIRST_LOCAL, OPT_ABLATE, OPT_GREEDY, OPT_SAMPLED, OPT_TEMP, OPT_TOPK, OPT_TOPP, OPT_SEED,
	OPT_PADTO, OPT_KVDT, OPT_TOL, OPT_WORKDIR, OPT_ROWS, OPT_JSON,
};

static void progress(void *ctx, int64_t done, int64_t total)
{
	(void)ctx;
	cli_progress("parity cases", done, total);
}

static const char *num(char *buf, size_t n, double v)
{
	if (v == 0.0)
		snprintf(buf, n, "0");
	else
		snprintf(buf, n, "%.3g", v);
	return buf;
}

static void print_case(const hi3_parity_report *rep, const hi3_parity_case *pc, const hi3_parity_opts *o,
                       int rows)
{
	char a[32], b[32], c[32], d[32], lens[256];
	int equal = 1, off = 0;

	for (int i = 0; i < rep->B; i++) {
		equal &= rep->real_pos[i] == rep->real_pos[0];
		off += snprintf(lens + off, sizeof(lens) - (size_t)off, "%s%lld", i ? "," : "",
		                (long long)rep->real_pos[i]);
		if (off >= (int)sizeof(lens) - 16) {
			snprintf(lens + off, sizeof(lens) - (size_t)off, ",...");
			break;
		}
	}
	printf("[%s] %s, B=%d %s real_pos [%s], L=%d, %d decode steps, %s%s%s: tokens equal=%s logp max|d|=%s "
	       "prefill-KV max|d|=%s (cache slot 0 max|d|=%s, other slots %s)%s\n",
	       pc->pass ? "PASS" : "FAIL", pc->construction, rep->B, equal ? "equal" : "unequal", lens, pc->L,
	       pc->steps, pc->sampled ? "sampled" : "greedy", o->ablate ? ", --ablate " : "",
	       o->ablate ? hi3_parity_ablation_name(o->ablate) : "", pc->tokens_equal ? "True" : "False",
	       num(a, sizeof(a), pc->logp_max), num(b, sizeof(b), pc->kv_max), num(c, sizeof(c), pc->kv_slot0_max),
	       num(d, sizeof(d), pc->kv_rest_max), o->ablate ? (pc->pass ? " -> expect FAIL: NOT BROKEN" :
	                                                                   " -> expect FAIL") : "");
	for (int i = 0; i < pc->n_rows; i++) {
		const hi3_parity_row *r = &pc->rows[i];
		int bad = !r->tokens_equal || r->logp_max > o->tol || r->kv_max > o->tol;
		if (!rows && !bad)
			continue;
		printf("    row %d (n=%lld): tokens %s", r->row, (long long)r->n, r->tokens_equal ? "equal" : "differ");
		if (!r->tokens_equal)
			printf(" from token %lld (lengths %lld batched, %lld alone)", (long long)r->first_diff,
			       (long long)r->len_batched, (long long)r->len_alone);
		printf("; logp max|d|=%s; prefill KV slot 0 max|d|=%s, slots 1..%lld max|d|=%s\n",
		       num(a, sizeof(a), r->logp_max), num(b, sizeof(b), r->kv_slot0_max), (long long)r->n - 1,
		       num(c, sizeof(c), r->kv_rest_max));
	}
}

static json_t *report_json(const hi3_parity_report *rep, const hi3_parity_opts *o)
{
	json_t *root = json_object(), *cases = json_array(), *rp = json_array();

	for (int i = 0; i < rep->B; i++)
		json_array_append_new(rp, json_integer(rep->real_pos[i]));
	for (int k = 0; k < rep->n; k++) {
		const hi3_parity_case *pc = &rep->cases[k];
		json_t *rows = json_array();
		for (int i = 0; i < pc->n_rows; i++) {
			const hi3_parity_row *r = &pc->rows[i];
			json_array_append_new(rows, json_pack("{s:i, s:I, s:b, s:I, s:I, s:I, s:f, s:f, s:f, s:f}", "row", r->row,
			                                      "n", (json_int_t)r->n, "tokens_equal", r->tokens_equal,
			                                      "first_diff", (json_int_t)r->first_diff, "len_batched",
			                                      (json_int_t)r->len_batched, "len_alone",
			                                      (json_int_t)r->len_alone, "logp_max_abs", r->logp_max,
			                                      "kv_max_abs", r->kv_max, "kv_slot0_max_abs", r->kv_slot0_max,
			                                      "kv_other_slots_max_abs", r->kv_rest_max));
		}
		json_array_append_new(cases, json_pack("{s:s, s:s, s:i, s:i, s:b, s:b, s:f, s:f, s:f, s:f, s:o}",
		                                       "construction", pc->construction, "decoding",
		                                       pc->sampled ? "sampled" : "greedy", "steps", pc->steps, "L", pc->L,
		                                       "pass", pc->pass, "tokens_equal", pc->tokens_equal, "logp_max_abs",
		                                       pc->logp_max, "kv_max_abs", pc->kv_max, "kv_slot0_max_abs",
		                                       pc->kv_slot0_max, "kv_other_slots_max_abs", pc->kv_rest_max,
		                                       "rows", rows));
	}
	json_object_set_new(root, "ablate", json_string(hi3_parity_ablation_name(o->ablate)));
	json_object_set_new(root, "tolerance", json_real(o->tol));
	json_object_set_new(root, "B", json_integer(rep->B));
	json_object_set_new(root, "real_pos", rp);
	json_object_set_new(root, "cases", cases);
	json_object_set_new(root, "ok", json_boolean(rep->pass));
	return root;
}

int cmd_parity(int argc, char **argv)
{
	static const struct option opts[] = {
		CLI_GLOBAL_LONGOPTS,
		{"steps", required_argument, NULL, OPT_STEPS},
		{"ablate", required_argument, NULL, OPT_ABLATE},
		{"greedy-only", no_argument, NULL, OPT_GREEDY},
		{"sampled-only", no_argument, NULL, OPT_SAMPLED},
		{"temperature", required_argument, NULL, OPT_TEMP},
		{"top-k", required_argument, NULL, OPT_TOPK},
		{"top-p", required_argument, NULL, OPT_TOPP},
		{"seed", required_argument, NULL, OPT_SEED},
		{"pad-to", required_argument, NULL, OPT_PADTO},
		{"kv-dtype", required_argument, NULL, OPT_KVDT},
		{"tol", required_argument, NULL, OPT_TOL},
		{"workdir", required_argument, NULL, OPT_WORKDIR},
		{"rows", no_argument, NULL, OPT_ROWS},
		{"json", no_argument, NULL, OPT_JSON},
		{NULL, 0, NULL, 0},
	};
	int64_t steps[16] = {3, 5}, v;
	hi3_parity_opts o = {.steps = steps, .n_steps = 2, .greedy = 1, .sampled = 1,
	                     .sampler = {.temperature = 0.8, .top_k = 20, .top_p = 0.9}, .kv_dtype = HI3_F32,
	                     .tol = -1, .progress = progress};
	hi3_parity_report rep = {0};
	hi3_template_opts to = {.fingerprint = 1};
	hi3_requests *rq = NULL;
	hi3_template *t = NULL;
	hi3_model *m = NULL;
	hi3_error err = {0};
	char tmpdir[] = "/tmp/hi3-parity.XXXXXX";
	const char *workdir = NULL;
	int ch, rc, json = 0, rows = 0, n;
	double d;

	while ((ch = getopt_long(argc, argv, CLI_GLOBAL_SHORT, opts, NULL)) != -1) {
		switch (ch) {
		case OPT_STEPS:
			if ((n = cli_int_list("--steps", optarg, 1, 1 << 20, steps, 16)) < 0)
				return HI3_ERR_USAGE;
			o.n_steps = n;
			break;
		case OPT_ABLATE:
			o.ablate = hi3_parity_ablation_parse(optarg);
			if (o.ablate <= 0)
				return cli_usage_error("--ablate: expected decode-mask, token-placement or pos-pad, found '%s'",
				                       optarg);
			break;
		case OPT_GREEDY:
			o.sampled = 0;
			break;
		case OPT_SAMPLED:
			o.greedy = 0;
			break;
		case OPT_TEMP:
			if (cli_double("--temperature", optarg, 1e-6, 1e6, &o.sampler.temperature))
				return HI3_ERR_USAGE;
			break;
		case OPT_TOPK:
			if (cli_int("--top-k", optarg, 0, INT32_MAX, &v))
				return HI3_ERR_USAGE;
			o.sampler.top_k = (int)v;
			break;
		case OPT_TOPP:
			if (cli_double("--top-p", optarg, 1e-9, 1.0, &o.sampler.top_p))
				return HI3_ERR_USAGE;
			break;
		case OPT_SEED:
			if (cli_int("--seed", optarg, 0, INT64_MAX / 2, &o.seed_base))
				return HI3_ERR_USAGE;
			break;
		case OPT_PADTO:
			if (cli_int("--pad-to", optarg, 1, 1 << 24, &v))
				return HI3_ERR_USAGE;
			o.pad_to = (int)v;
			break;
		case OPT_KVDT:
			if (cli_dtype("--kv-dtype", optarg, &o.kv_dtype))
				return HI3_ERR_USAGE;
			break;
		case OPT_TOL:
			if (cli_double("--tol", optarg, 0.0, 1e30, &d))
				return HI3_ERR_USAGE;
			o.tol = d;
			break;
		case OPT_WORKDIR:
			workdir = optarg;
			break;
		case OPT_ROWS:
			rows = 1;
			break;
		case OPT_JSON:
			json = 1;
			break;
		default:
			if ((rc = cli_other_option(ch, optarg)) >= 0)
				return rc;
		}
	}
	if (optind + 1 != argc)
		return cli_usage_error("expected one requests file, found %d arguments", argc - optind);
	if (!o.greedy && !o.sampled)
		return cli_usage_error("--greedy-only and --sampled-only exclude each other");
	if (!cli.model_dir)
		return cli_usage_error("-m MODEL is required");
	if (o.ablate == HI3_ABLATE_DECODE_MASK)
		cli_warn("--ablate decode-mask: the batched runs attend every cache slot, as upstream did");
	else if (o.ablate == HI3_ABLATE_TOKEN_PLACEMENT)
		cli_warn("--ablate token-placement: the batched runs append new tokens at the padded tail, as upstream did");
	else if (o.ablate == HI3_ABLATE_POS_PAD)
		cli_warn("--ablate pos-pad: the batched conditions pad position ids with 0, as upstream did");
	if (hi3_requests_read(&rq, argv[optind], &err) != 0)
		return cli_fail(&err);
	to.model_dir = cli.model_dir;
	to.load_tokenizer = hi3_requests_need_tokenizer(rq);
	if (hi3_template_open(&t, &to, &err) != 0 || cli_open_model(&m, &err) != 0) {
		rc = cli_fail(&err);
		goto out;
	}
	if (o.tol < 0)                           /* bitwise where the backend promises it */
		o.tol = hi3_model_batch_invariant(m) ? 0.0 : 1e-5;
	if (!workdir) {
		if (!mkdtemp(tmpdir)) {
			hi3_error_set(&err, HI3_ERR_RUNTIME, "cannot create a temporary work directory");
			rc = cli_fail(&err);
			goto out;
		}
		o.workdir = tmpdir;
	} else {
		o.workdir = workdir;
	}
	rc = hi3_parity(m, t, rq, &o, &rep, &err);
	cli_progress_end();
	if (rc != 0) {
		rc = cli_fail(&err);
		goto out;
	}
	if (json) {
		json_t *root = report_json(&rep, &o);
		json_dumpf(root, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
		fputc('\n', stdout);
		json_decref(root);
	} else {
		for (int k = 0; k < rep.n; k++)
			print_case(&rep, &rep.cases[k], &o, rows);
	}
	{
		int passed = 0;
		for (int k = 0; k < rep.n; k++)
			passed += rep.cases[k].pass;
		if (o.ablate)
			cli_info("%s: %d of %d cases broke parity%s", hi3_parity_ablation_name(o.ablate), rep.n - passed, rep.n,
			         rep.pass ? ", as expected" : "; the defect is NOT load-bearing in every case");
		else
			cli_info("%d of %d cases pass (tolerance %g)%s", passed, rep.n, o.tol,
			         workdir ? "" : "; rerun with --workdir DIR to keep the stage files");
	}
	rc = rep.pass ? 0 : HI3_ERR_RUNTIME;
out:
	if (!workdir && o.workdir) {
		char *cmd = NULL;
		if (asprintf(&cmd, "rm -rf '%s'", tmpdir) > 0 && system(cmd) != 0)
			cli_warn("could not remove %s", tmpdir);
		free(cmd);
	}
	hi3_parity_report_release(&rep);
	hi3_model_close(m);
	hi3_template_free(t);
	hi3_requests_free(rq);
	return rc;
}
