/* cmd-bench.c -- hi3 bench: side-by-side CPU measurements in one run. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "commands.h"

/* Passes of the bandwidth read (1 GiB each), at least, before and after the model. */
#define MEMBW_PASSES 10

static const struct cli_help help = {
	.usage = {"hi3 bench -m MODEL [--batch B] [--prompt-len P] [--new N] [--reps R] [--kv-dtype f32|bf16] [--json]"},
	.description =
	"Name the processor and the threads, then measure, in one run: the memory read\n"
	"bandwidth (the best pass of at least 10, before and again after the model);\n"
	"OpenBLAS sgemm against hi3's in-place GEMM on one layer's prefill shapes at B*P\n"
	"tokens; an in-memory prefill of B x P tokens and N greedy decode steps through\n"
	"the model; and the decode floor of a B = 1 step: the bytes it must read (active\n"
	"weights and KV) over the measured bandwidth, and the same bytes read after every\n"
	"step (the median read beside the median step, as the machine's bandwidth moves).\n"
	"On the CPU, each decode step is also split by op: the median time in the matrix\n"
	"products, in attention, and in everything else; and at B = 1 each step's weights\n"
	"are read again after the steps, in its order, with the floor's read between and\n"
	"no arithmetic: the products beside a read of their own bytes. At B = 1 on two\n"
	"threads or more, after each step, a cache line's round trip between the step's\n"
	"threads (on a VM: whether they share a CCD). Last, how much of the checkpoint in\n"
	"memory is mapped in 2 MiB pages (a warning when under 90%: its page cache holds\n"
	"small pages, and the steps read it slower). No files are written.\n"
	"Use --batch-invariant=off to time the OpenBLAS path of the model instead of the\n"
	"batch-invariant one.\n",
	.operands = "no arguments",
};

int cmd_bench(int argc, char **argv)
{
	int64_t B = 1, P = 512, N = 64, reps = 3;
	int json = 0;
	hi3_model *m = NULL;
	hi3_error err = {0};
	hi3_bench_model_result r;
	double bw, gflops, tb, th, bytes, floor_s, step_s;
	char cpu[128];
	const hi3_config *c;
	hi3_dtype wdt, kvdt = HI3_F32;
	struct cli_option options[] = {
		OPT_GLOBALS(),
		OPT_INT('b', "batch", &B, 1, 4096, "B", "rows (default 1)"),
		OPT_INT('p', "prompt-len", &P, 1, 1 << 20, "P", "prompt tokens per row (default 512)"),
		OPT_INT('n', "new", &N, 0, 1 << 20, "N", "decode steps (default 64)"),
		OPT_INT(0, "reps", &reps, 1, 1000, "R", "micro benchmark repetitions, the best kept (default 3)"),
		OPT_KV_DTYPE(&kvdt),
		OPT_JSON(&json, "one JSON object on standard output instead of the table"),
		OPT_END(),
	};

	if ((argc = cli_parse_options(argc, argv, options, &help, 0)) < 0)
		return CLI_PARSE_STATUS(argc);
	if (cli_open_model(&m, &err) != 0)
		return cli_fail(&err);
	c = hi3_model_config(m);
	wdt = hi3_model_weight_dtype(m);
	if (wdt != HI3_F32 && wdt != HI3_BF16 && wdt != HI3_F16)
		wdt = HI3_BF16;          /* a quantized checkpoint: the GEMM micro benchmark and the floor count bf16 */
	cli_info("measuring memory bandwidth");
	bw = hi3_bench_membw((size_t)1 << 30, (int)(reps > MEMBW_PASSES ? reps : MEMBW_PASSES));
	cli_info("timing GEMMs at M = %lld", (long long)(B * P));
	if (hi3_bench_gemm(c, (int)(B * P), wdt, (int)reps, &gflops, &tb, &th) != 0) {
		hi3_error_set(&err, HI3_ERR_RUNTIME, "out of memory for the GEMM benchmark");
		cli_close_model(m);
		return cli_fail(&err);
	}
	cli_info("prefill %lld x %lld, decode %lld steps", (long long)B, (long long)P, (long long)N);
	bytes = hi3_bench_step_bytes(c, wdt, kvdt, (int)(P + N / 2));
	if (hi3_bench_model(m, (int)B, (int)P, (int)N, kvdt, B == 1 ? bytes : 0.0, &r, &err) != 0) {
		cli_close_model(m);
		return cli_fail(&err);
	}
	/* again after the model: the floor takes the best of both, so that
	 * other work on the machine during one of them weighs less */
	cli_info("measuring memory bandwidth again");
	bw = fmax(bw, hi3_bench_membw((size_t)1 << 30, (int)(reps > MEMBW_PASSES ? reps : MEMBW_PASSES)));
	floor_s = bytes / bw;
	step_s = N ? r.decode_s / (double)N : 0.0;
	hi3_bench_cpu(cpu, sizeof cpu);
	if (json) {
		json_t *o = json_object();
		struct { const char *k; double v; } f[] = {
			{"mem_read_gb_s", bw / 1e9}, {"sgemm_gflop_s", gflops / tb / 1e9},
			{"hi3_gemm_gflop_s", gflops / th / 1e9}, {"first_prefill_s", r.first_prefill_s},
			{"prefill_s", r.prefill_s},
			{"prefill_tok_s", r.prefill_tok_s}, {"prefill_gflop_s", r.prefill_flops / r.prefill_s / 1e9},
			{"decode_s", r.decode_s}, {"decode_tok_s", r.decode_tok_s}, {"decode_step_ms", step_s * 1e3},
			{"decode_floor_step_ms", floor_s * 1e3}, {"step_bytes_mb", bytes / 1e6},
			{"decode_step_median_ms", r.step_median_s * 1e3},
			{"decode_floor_between_ms", r.floor_median_s * 1e3},
		};
		json_object_set_new(o, "impl", json_string("hi3"));
		json_object_set_new(o, "model", json_string(cli.model_dir));
		json_object_set_new(o, "cpu", json_string(cpu));
		json_object_set_new(o, "threads", json_integer(r.threads));
		json_object_set_new(o, "weights", json_string(hi3_dtype_name(wdt)));
		json_object_set_new(o, "kv_dtype", json_string(hi3_dtype_name(kvdt)));
		json_object_set_new(o, "batch", json_integer(B));
		json_object_set_new(o, "prompt_len", json_integer(P));
		json_object_set_new(o, "new", json_integer(N));
		json_object_set_new(o, "batch_invariant", json_boolean(cli_batch_invariant()));
		for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
			json_object_set_new(o, f[i].k, json_real(f[i].v));
		if (r.op_times) {
			json_object_set_new(o, "decode_products_median_ms", json_real(r.products_median_s * 1e3));
			json_object_set_new(o, "decode_attention_median_ms", json_real(r.attention_median_s * 1e3));
			json_object_set_new(o, "decode_other_median_ms", json_real(r.other_median_s * 1e3));
			if (r.replay_median_s > 0) {
				json_object_set_new(o, "decode_weights_mb", json_real(r.replay_bytes / 1e6));
				json_object_set_new(o, "decode_weights_again_median_ms", json_real(r.replay_median_s * 1e3));
			}
		}
		if (r.rtt_median_ns > 0) {
			json_object_set_new(o, "core_round_trip_ns", json_real(r.rtt_median_ns));
			json_object_set_new(o, "core_round_trip_max_ns", json_real(r.rtt_max_ns));
		}
		if (r.weights_known) {
			json_object_set_new(o, "weights_resident_mb", json_real(r.weights_resident / 1e6));
			json_object_set_new(o, "weights_huge_mapped", json_real(r.weights_huge / r.weights_resident));
		}
		json_dumpf(o, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER);
		fputc('\n', stdout);
		json_decref(o);
	} else {
		printf("model %s (%s weights, %s cache), B = %lld, prompt %lld, %lld new, batch-invariant %s\n",
		       cli.model_dir, hi3_dtype_name(wdt), hi3_dtype_name(kvdt), (long long)B, (long long)P, (long long)N,
		       cli_batch_invariant() ? "on" : "off");
		printf("  processor                     %s, %d thread%s\n", cpu, r.threads, r.threads == 1 ? "" : "s");
		printf("  memory read bandwidth         %8.2f GB/s\n", bw / 1e9);
		printf("  one layer's prefill GEMMs     OpenBLAS sgemm %8.2f GFLOP/s   hi3 in place %8.2f GFLOP/s\n",
		       gflops / tb / 1e9, gflops / th / 1e9);
		printf("  prefill                       %8.1f tokens/s  %8.2f GFLOP/s (%.0f%% of sgemm)\n",
		       r.prefill_tok_s, r.prefill_flops / r.prefill_s / 1e9,
		       100.0 * (r.prefill_flops / r.prefill_s) / (gflops / tb));
		printf("  first prefill                 %8.3f s (the weights read in from the mapping)\n",
		       r.first_prefill_s);
		printf("  decode                        %8.1f tokens/s  %8.2f ms/step\n", r.decode_tok_s, step_s * 1e3);
		if (B == 1 && N > 0) {
			printf("  decode floor (B = 1)          %8.2f ms/step (%.1f MB/step at %.2f GB/s); measured %.2fx\n",
			       floor_s * 1e3, bytes / 1e6, bw / 1e9, step_s / floor_s);
			printf("  floor read between steps      %8.2f ms/step (median); median step %.2f ms, %.2fx\n",
			       r.floor_median_s * 1e3, r.step_median_s * 1e3, r.step_median_s / r.floor_median_s);
		}
		if (r.rtt_median_ns > 0)
			printf("  threads' round trip           %8.0f ns (median after the steps; largest %.0f ns)\n",
			       r.rtt_median_ns, r.rtt_max_ns);
		if (r.op_times)
			printf("  a decode step by op (medians) products %.2f ms, attention %.2f ms, other %.2f ms"
			       " (step %.2f ms)\n", r.products_median_s * 1e3, r.attention_median_s * 1e3,
			       r.other_median_s * 1e3, r.step_median_s * 1e3);
		if (r.replay_median_s > 0)
			printf("  the step's weights read again %8.2f ms/step (median; %.1f MB), %.2fx the floor between;"
			       " products %.2fx it\n", r.replay_median_s * 1e3, r.replay_bytes / 1e6,
			       r.replay_median_s / r.floor_median_s, r.products_median_s / r.replay_median_s);
		if (r.weights_known)
			printf("  checkpoint in memory          %8.1f MB, %.0f%% of it mapped in 2 MiB pages\n",
			       r.weights_resident / 1e6, 100.0 * r.weights_huge / r.weights_resident);
	}
	cli_warn_pages(m, r.weights_resident, r.weights_huge, 1);   /* as measured after the steps */
	cli_close_model(m);
	return 0;
}
