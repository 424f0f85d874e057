/* cmd-parity.c -- hi3 parity: a batch equals its rows run alone, or shows where not. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "commands.h"

static const struct cli_help help = {
	.usage = {"hi3 parity -m MODEL [options] REQUESTS"},
	.description =
	"Run the whole pipeline (tokenize-concat, prefill, decode) for the JSONL\n"
	"requests as a batch -- encoded at once, encoded per row and concatenated, and\n"
	"each row as a right-padded B = 1 -- and each row alone (B = 1, unpadded), and\n"
	"compare per row: the generated tokens, their log-probs, and the prefill K/V of\n"
	"the row's valid slots (slot 0 on its own). One line per case; exit 0 when every\n"
	"case passes. With --ablate, the batched runs restore one upstream defect and\n"
	"every case must break (exit 0 only then). Stage files stay in --workdir.\n",
	.operands = "one requests file", .min_operands = 1, .max_operands = 1,
};

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
	int64_t steps[16] = {3, 5};
	hi3_parity_opts o = {.steps = steps, .n_steps = 2, .greedy = 1, .sampled = 1,
	                     .sampler = {.temperature = 0.8, .top_k = 20, .top_p = 0.9}, .kv_dtype = HI3_F32,
	                     .tol = -1, .progress = cli_progress_fn, .progress_ctx = "parity cases"};
	hi3_parity_report rep = {0};
	hi3_template_opts to = {.fingerprint = 1};
	hi3_requests *rq = NULL;
	hi3_template *t = NULL;
	hi3_model *m = NULL;
	hi3_error err = {0};
	char tmpdir[] = "/tmp/hi3-parity.XXXXXX";
	const char *workdir = NULL;
	int rc, json = 0, rows = 0;
	struct cli_option options[] = {
		OPT_GLOBALS(),
		OPT_INT_LIST(0, "steps", steps, &o.n_steps, 1, 1 << 20, "N,...",
		             "decode steps of each case (default 3,5)"),
		OPT_SET_INT(0, "greedy-only", &o.sampled, 0, "only greedy decoding (default: greedy and sampled)"),
		OPT_SET_INT(0, "sampled-only", &o.greedy, 0, "only seeded sampling"),
		OPT_INT(0, "pad-to", &o.pad_to, 1, 1 << 24, "L",
		        "pad the batched runs to at least L columns (every row padded)"),
		OPT_KV_DTYPE(&o.kv_dtype),
		OPT_DOUBLE(0, "tol", &o.tol, 0.0, 1e30, "X", "pass when max |d| <= X (default 0 where the backend is "
		           "batch invariant: the CPU with --batch-invariant=on; else 1e-5)"),
		OPT_STRING(0, "workdir", &workdir, "DIR",
		           "keep the stage files in DIR (default: a temporary directory, removed afterwards)"),
		OPT_FLAG(0, "rows", &rows, "print every row of every case"),
		OPT_JSON(&json, "one JSON object on standard output instead of the lines"),
		OPT_GROUP("sampled cases (default --temperature 0.8 --top-k 20 --top-p 0.9):"),
		OPT_SAMPLER(&o.sampler, NULL),
		OPT_SEED_BASE(&o.seed_base),
		OPT_GROUP_DEFECTS(),
		OPT_ABLATE(&o.ablate),
		OPT_END(),
	};

	if ((argc = cli_parse_options(argc, argv, options, &help, 0)) < 0)
		return CLI_PARSE_STATUS(argc);
	if (!o.greedy && !o.sampled)
		return cli_usage_error("--greedy-only and --sampled-only exclude each other");
	if (!cli.model_dir)
		return cli_usage_error("-m MODEL is required");
	if (hi3_requests_read(&rq, argv[0], &err) != 0)
		return cli_fail(&err);
	if (cli_check_seed_base(o.seed_base, hi3_requests_count(rq)) != 0) {
		hi3_requests_free(rq);
		return HI3_ERR_USAGE;
	}
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
