/* cmd-plan.c -- hi3 plan: what each rank of a layout holds, from config.json alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "commands.h"

static const struct cli_help help = {
	.usage = {"hi3 plan -m MODEL --ranks N --batch B --max-len C [--parallel tp=T,ep=E] [--dtype f32|bf16|fp8|int8|nf4|nvfp4-mixed] "
	          "[--kv-dtype f32|bf16] [--mem SIZE] [--json]"},
	.description =
	"Plan a layout of N ranks from MODEL/config.json alone (no weights needed):\n"
	"per rank, the bytes of weights, KV cache (B rows of C slots) and\n"
	"activations, and whether they fit in SIZE bytes (suffixes K, M, G, T are\n"
	"binary: 141G is 141 GiB). The layout is --parallel's, or for N ranks the\n"
	"largest tp dividing both N and the kv heads, with ep = N / tp. prefill,\n"
	"decode and replay refuse, before reading a weight, a layout whose weights\n"
	"do not fit in a rank's memory (hi3-parallel(7)). The quantized dtypes count\n"
	"the layers' matrices as hi3-quant(7)'s formats store them, with their scales\n"
	"(embeddings and lm_head bf16, norms and routers f32). With --backend cuda,\n"
	"what one GPU holds: the cache without the KV file's decode record (host), the\n"
	"gathers' buffers in device memory (NCCL).\n",
	.footer = "Exit status: 0 it fits (or no --mem), 1 it does not fit, 2 usage (a layout that does not divide).\n",
};

/* --dtype: plain weights, or a quantized layout (hi3-quant(7)) */
static const struct cli_choice dtypes[] = {
	{"f32", 16 * HI3_F32 + HI3_PLAN_Q_NONE, NULL},  {"bf16", 16 * HI3_BF16 + HI3_PLAN_Q_NONE, NULL},
	{"fp8", 16 * HI3_BF16 + HI3_PLAN_Q_FP8, NULL},  {"int8", 16 * HI3_BF16 + HI3_PLAN_Q_INT8, NULL},
	{"nf4", 16 * HI3_BF16 + HI3_PLAN_Q_NF4, NULL},  {"nvfp4-mixed", 16 * HI3_BF16 + HI3_PLAN_Q_NVFP4_MIXED, NULL},
	{NULL, 0, NULL}};

static const char *dtype_name(const hi3_plan_opts *o)
{
	return o->quant ? hi3_plan_quant_name(o->quant) : o->dtype == HI3_F32 ? "f32" : "bf16";
}

static char bufs[8][32];
#define B(i, v) hi3_format_bytes((v), bufs[i])

/* The default layout for n ranks: the largest tp dividing n and the kv heads whose ep divides the experts. */
static int choose(const hi3_config *c, int n, hi3_par *par)
{
	for (int tp = n; tp >= 1; tp--) {
		int ok = n % tp == 0 && c->num_key_value_heads % tp == 0;
		for (int l = 0; ok && l < c->num_hidden_layers; l++)
			if (hi3_config_is_moe_layer(c, l) && c->num_experts[l] % (n / tp))
				ok = 0;
		if (ok) {
			par->tp = tp;
			par->ep = n / tp;
			return 0;
		}
	}
	return -1;
}

int cmd_plan(int argc, char **argv)
{
	hi3_plan_opts o = {.dtype = HI3_BF16, .kv_dtype = HI3_F32};
	hi3_config cfg;
	hi3_plan p;
	hi3_par par = {0};
	hi3_error err = {0};
	const char *mem = NULL;
	char *path = NULL;
	int ranks = 0, json = 0, rc, loaded = 0, dt = 16 * HI3_BF16;
	int64_t batch = 0;
	struct cli_option options[] = {
		OPT_GLOBALS(),
		OPT_INT(0, "ranks", &ranks, 1, 4096, "N", "ranks of the layout", .flags = CLI_OPT_REQUIRED),
		OPT_INT(0, "batch", &batch, 1, INT32_MAX, "B", "rows of the batch", .flags = CLI_OPT_REQUIRED),
		OPT_INT(0, "max-len", &o.max_len, 1, INT32_MAX, "C", "cache slots per row: prompt plus new tokens",
		        .flags = CLI_OPT_REQUIRED),
		OPT_CHOICE(0, "dtype", &dt, dtypes, "weights: bf16 (default, as released), f32, or quantized: fp8, int8, "
		           "nf4, nvfp4-mixed (hi3-quant(7))"),
		OPT_KV_DTYPE(&o.kv_dtype),
		OPT_STRING(0, "mem", &mem, "SIZE", "memory of one rank (e.g. 141G for an H200, 512G for a host)"),
		OPT_JSON(&json, "one JSON object on standard output"),
		OPT_END(),
	};

	if ((argc = cli_parse_options(argc, argv, options, &help, 0)) < 0)
		return CLI_PARSE_STATUS(argc);
	o.batch = (int)batch;
	o.dtype = (hi3_dtype)(dt / 16);
	o.quant = dt % 16;
	if (mem && hi3_parse_bytes(mem, &o.mem) != 0)
		return cli_usage_error("--mem: '%s' is not a size (e.g. 141G, 512GiB, 80000000000)", mem);
	if (!cli.model_dir)
		return cli_usage_error("no model: give -m DIR (a directory with config.json)");
	if (!(path = malloc(strlen(cli.model_dir) + 16)))
		return HI3_ERR_RUNTIME;
	sprintf(path, "%s/config.json", cli.model_dir);
	if (hi3_config_load(&cfg, path, &err) != 0) {
		rc = cli_fail(&err);
		goto out;
	}
	loaded = 1;
	if (cli.parallel) {
		if (hi3_par_parse(&par, cli.parallel, &err) != 0) {
			rc = cli_fail(&err);
			goto out;
		}
		if (par.tp * par.ep != ranks) {
			rc = cli_usage_error("--parallel tp=%d,ep=%d is %d ranks, not --ranks %d", par.tp, par.ep,
			                     par.tp * par.ep, ranks);
			goto out;
		}
	} else if (choose(&cfg, ranks, &par) != 0) {
		rc = cli_usage_error("no layout of %d ranks divides the kv heads (%d) and the experts", ranks,
		                     cfg.num_key_value_heads);
		goto out;
	}
	o.tp = par.tp;
	o.ep = par.ep;
	o.cuda = !strcmp(cli.backend, "cuda");
	if (hi3_plan_compute(&cfg, &o, &p, &err) != 0) {
		rc = cli_fail(&err);
		goto out;
	}
	if (json) {
		printf("{\"config\": \"%s\", \"ranks\": %d, \"tp\": %d, \"ep\": %d, \"batch\": %d, \"max_len\": %lld, "
		       "\"dtype\": \"%s\", \"kv_dtype\": \"%s\", \"per_rank\": {\"weights\": %llu, \"weights_split\": %llu, "
		       "\"weights_replicated\": %llu, \"kv\": %llu, \"activations\": %llu, \"total\": %llu}, "
		       "\"weights_all\": %llu, \"mem\": %llu, \"fits\": %s, \"backend\": \"%s\"}\n",
		       path, ranks, o.tp, o.ep, o.batch, (long long)o.max_len, dtype_name(&o),
		       o.kv_dtype == HI3_F32 ? "f32" : "bf16", (unsigned long long)p.weights, (unsigned long long)p.weights_split,
		       (unsigned long long)p.weights_replicated, (unsigned long long)p.kv,
		       (unsigned long long)p.activations, (unsigned long long)p.total, (unsigned long long)p.weights_all,
		       (unsigned long long)o.mem, !o.mem ? "null" : p.fits ? "true" : "false", o.cuda ? "cuda" : "cpu");
	} else {
		printf("plan: %s, %d rank%s (tp=%d, ep=%d), batch %d, max_len %lld, weights %s, kv %s%s\n", path, ranks,
		       ranks == 1 ? "" : "s", o.tp, o.ep, o.batch, (long long)o.max_len, dtype_name(&o),
		       o.kv_dtype == HI3_F32 ? "f32" : "bf16", o.cuda ? ", cuda (one GPU a rank)" : "");
		printf("per rank:\n");
		printf("  weights      %12s  (split %s, on every rank %s; all weights %s)\n", B(0, p.weights),
		       B(1, p.weights_split), B(2, p.weights_replicated), B(3, p.weights_all));
		printf("  kv cache     %12s\n", B(4, p.kv));
		printf("  activations  %12s\n", B(5, p.activations));
		printf("  total        %12s\n", B(6, p.total));
		if (o.mem)
			printf("  memory       %12s: %s\n", B(7, o.mem), p.fits ? "fits" : "does not fit");
	}
	rc = o.mem && !p.fits ? 1 : 0;
out:
	if (loaded)
		hi3_config_release(&cfg);
	free(path);
	return rc;
}
