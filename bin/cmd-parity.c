/* cmd-parity.c -- hi3 parity: a batch equals its rows run alone, or shows where not. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int cmd_parity(int argc, char **argv)
{
	int64_t steps[16] = {3, 5};
	struct cli_images images = {0};
	hi3_parity_opts o = {.steps = steps, .n_steps = 2, .greedy = 1, .sampled = 1,
	                     .sampler = {.temperature = 0.8, .top_k = 20, .top_p = 0.9}, .kv_dtype = HI3_F32,
	                     .tol = -1, .progress = cli_progress_fn, .progress_ctx = "parity cases"};
	hi3_parity_report rep = {0};
	hi3_template_opts to = {.fingerprint = 1};
	hi3_requests *rq = NULL;
	hi3_template *t = NULL;
	hi3_model *m = NULL;
	hi3_error err = {0};
	const char *workdir = NULL;
	char *report = NULL;
	size_t len = 0;
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
		OPT_IMAGES(&images),
		OPT_GROUP("gen_image requests (steps: denoising steps; greedy: euler, sampled: sde):"),
		OPT_SET_INT(0, "exact-size", &to.image_size, HI3_SIZE_EXACT, "keep an \"HxW\" that is a multiple of "
		            "the latent factor (tokenize-concat --exact-size)"),
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
	o.vit_kernel = images.vit_kernel;
	o.vae_sample = images.vae_sample;
	if (cli_load_images(rq, &images, &err) != 0) {
		hi3_requests_free(rq);
		return cli_fail(&err);
	}
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
	o.workdir = workdir;
	rc = hi3_parity(m, t, rq, &o, &rep, &err);
	cli_progress_end();
	if (rc != 0 || hi3_parity_report_render(&rep, &o, json, rows, &report, &len, &err) != 0) {
		rc = cli_fail(&err);
		goto out;
	}
	if (fwrite(report, 1, len, stdout) != len) {
		rc = HI3_ERR_RUNTIME;
		goto out;
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
	free(report);
	hi3_parity_report_release(&rep);
	cli_close_model(m);
	hi3_template_free(t);
	hi3_requests_free(rq);
	return rc;
}
