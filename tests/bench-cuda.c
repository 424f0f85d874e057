/*
 * bench-cuda.c -- prefill and decode speed of one model on one backend,
 * through hi3_forward (the `hi3 prefill/decode` commands are not needed):
 * a prefill of B rows of L tokens into a host KV cache, then greedy decode
 * steps of one token per row from the cache.
 *
 *   bench-cuda -m DIR [--backend cpu|cuda] [-B ROWS] [-L LEN] [-D ROWS]
 *              [-n STEPS] [--reps N] [--kv-dtype f32|bf16] [--label NAME]
 *              [--cuda-graphs on|off] [--batch-invariant on|off]
 *
 * -D decodes only the first ROWS rows of the prefill (default all B), so
 * one run can time a wide prefill and a B = 1 decode. --cuda-graphs as
 * hi3's (default: on where the driver has graphs): the decode steps from
 * CUDA graphs or launched op by op.
 * What a step must move and compute comes from the checkpoint itself:
 * decode bytes = every weight read once per step (the experts actually
 * routed to in that step, counted from the routing the forward reports;
 * one embedding row per token) + the K and V slots each row reads;
 * prefill FLOPs = 2 N K per token for every matrix (k experts of E per
 * token in MoE layers) + the lm_head rows asked for; attention FLOPs
 * (4 d n_h per admitted key) are reported apart.
 *
 * Prints a readable summary and, last, one line
 *   RESULT label=... backend=... B=... L=... D=... prefill_s=... prefill_tok_s=...
 *          prefill_tflops=... attn_tflop=... decode_ms=... decode_tok_s=...
 *          decode_gb=... decode_gbs=... graphs=on|off|default
 * which scripts/gpu-run.sh turns into its figures. Times are the best of
 * --reps prefills, and the mean over the timed decode steps (after two
 * untimed ones); every call ends with the logits copied to the host.
 * --batch-invariant as hi3's (default: off on cuda, on elsewhere): on
 * cuda every product runs the fixed-order gemv kernel in passes of 8
 * rows, never cuBLAS, which is what a bitwise parity costs.
 */
#include "hi3.h"
#include "config.h"
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "core/internal.h"

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int int_arg(const char *opt, const char *s, int64_t lo, int64_t hi, int *out)
{
	int64_t v;

	if (hi3i_parse_i64(s, lo, hi, &v) != 0) {
		fprintf(stderr, "bench-cuda: %s: expected an integer in [%lld, %lld], found '%s'\n", opt, (long long)lo,
		        (long long)hi, s);
		return -1;
	}
	*out = (int)v;
	return 0;
}

/* What one token costs, from the checkpoint's tensors. */
struct cost {
	double dense_bytes;       /* read once per step whatever the batch */
	double dense_flops;       /* per token, every matrix but experts and lm_head */
	double *expert_bytes;     /* per layer: all experts of the layer */
	double *expert_flops;     /* per layer, per token: k of E experts */
	double row_bytes;         /* one embedding row */
	double head_bytes, head_flops;   /* lm_head (or the tied wte), per logit row */
};

static int layer_of(const char *name)
{
	int l;

	return sscanf(name, "model.layers.%d.", &l) == 1 ? l : -1;
}

static int cost_init(struct cost *c, const char *dir, const hi3_config *cfg, hi3_error *err)
{
	hi3_ckpt *ck;
	int tied;

	memset(c, 0, sizeof(*c));
	c->expert_bytes = calloc((size_t)cfg->num_hidden_layers, sizeof(double));
	c->expert_flops = calloc((size_t)cfg->num_hidden_layers, sizeof(double));
	if (!c->expert_bytes || !c->expert_flops || hi3_ckpt_open(&ck, dir, err) != 0)
		return -1;
	tied = hi3_ckpt_find(ck, "lm_head.weight") == NULL;
	for (int i = 0; i < hi3_ckpt_count(ck); i++) {
		const hi3_tensor *t = hi3_ckpt_at(ck, i);
		double b = (double)t->nbytes, nk = t->ndim == 2 ? (double)t->shape[0] * (double)t->shape[1] : 0.0;
		int l = layer_of(t->name);

		if (!strcmp(t->name, "model.wte.weight")) {
			c->row_bytes = b / (double)t->shape[0];
			if (tied) {
				c->head_bytes = b;
				c->head_flops = 2.0 * nk;
			}
		} else if (!strcmp(t->name, "lm_head.weight")) {
			c->head_bytes = b;
			c->head_flops = 2.0 * nk;
		} else if (l >= 0 && l < cfg->num_hidden_layers && strstr(t->name, ".mlp.experts.")) {
			c->expert_bytes[l] += b;
			c->expert_flops[l] += 2.0 * nk * cfg->moe_topk[l] / cfg->num_experts[l];
		} else {
			c->dense_bytes += b;
			c->dense_flops += 2.0 * nk;
		}
	}
	hi3_ckpt_close(ck);
	return 0;
}

/* 1 for "on", 0 for "off"; else -1, said on stderr. */
static int on_off(const char *opt, const char *arg)
{
	if (!strcmp(arg, "on") || !strcmp(arg, "off"))
		return !strcmp(arg, "on");
	fprintf(stderr, "bench-cuda: %s: expected on or off, found '%s'\n", opt, arg);
	return -1;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"backend", required_argument, NULL, 'b'}, {"reps", required_argument, NULL, 'r'},
		{"kv-dtype", required_argument, NULL, 'k'}, {"label", required_argument, NULL, 'l'},
		{"cuda-graphs", required_argument, NULL, 'g'}, {"batch-invariant", required_argument, NULL, 'i'},
		{NULL, 0, NULL, 0}};
	const char *dir = NULL, *backend = "cuda", *label = "model";
	int B = 1, Lp = 128, D = 0, steps = 32, reps = 3, c, rc = 1, graphs = 0, invariant = -1;
	hi3_dtype kv_dt = HI3_BF16;
	hi3_error err = {0};
	hi3_model *m = NULL;
	const hi3_config *cfg;
	hi3_kvcache *kv = NULL;
	struct cost cost = {0};
	int64_t *ids = NULL, *slot = NULL;
	int32_t *rope = NULL, *hi = NULL, *at = NULL, *crow = NULL;
	int16_t *rid = NULL;
	float *rw = NULL, *logits = NULL;
	int n_moe, K, V, Cs, *moe_layer = NULL;
	double prefill_s = 1e30, attn_flop = 0.0, gemm_flop, dec_s = 0.0, dec_bytes = 0.0;

	while ((c = getopt_long(argc, argv, "m:B:L:D:n:", opts, NULL)) != -1) {
		switch (c) {
		case 'm': dir = optarg; break;
		case 'b': backend = optarg; break;
		case 'l': label = optarg; break;
		case 'B': if (int_arg("-B", optarg, 1, 4096, &B)) return 2; break;
		case 'L': if (int_arg("-L", optarg, 1, 1 << 20, &Lp)) return 2; break;
		case 'D': if (int_arg("-D", optarg, 1, 4096, &D)) return 2; break;
		case 'n': if (int_arg("-n", optarg, 1, 1 << 20, &steps)) return 2; break;
		case 'r': if (int_arg("--reps", optarg, 1, 1000, &reps)) return 2; break;
		case 'g':
			if ((graphs = on_off("--cuda-graphs", optarg)) < 0)
				return 2;
			graphs = graphs ? 1 : 2;
			break;
		case 'i':
			if ((invariant = on_off("--batch-invariant", optarg)) < 0)
				return 2;
			break;
		case 'k':
			if (!strcmp(optarg, "f32") || !strcmp(optarg, "bf16")) {
				kv_dt = optarg[0] == 'f' ? HI3_F32 : HI3_BF16;
			} else {
				fprintf(stderr, "bench-cuda: --kv-dtype: expected f32 or bf16, found '%s'\n", optarg);
				return 2;
			}
			break;
		default:
			fprintf(stderr, "usage: bench-cuda -m DIR [--backend cpu|cuda] [-B ROWS] [-L LEN] [-D ROWS] "
			        "[-n STEPS] [--reps N] [--kv-dtype f32|bf16] [--label NAME] [--cuda-graphs on|off] "
			        "[--batch-invariant on|off]\n");
			return 2;
		}
	}
	if (!dir || optind != argc) {
		fprintf(stderr, "bench-cuda: give the model with -m DIR (and nothing else)\n");
		return 2;
	}
	if (D == 0)
		D = B;
	if (D > B) {
		fprintf(stderr, "bench-cuda: -D %d: cannot decode more rows than the %d of the prefill\n", D, B);
		return 2;
	}
	{
		hi3_model_opts mo = {.backend = backend,
		                     .batch_invariant = invariant >= 0 ? invariant : strcmp(backend, "cuda") != 0,
		                     .cuda_graphs = graphs};
		if (hi3_model_open(&m, dir, &mo, &err) != 0)
			goto fail;
	}
	cfg = hi3_model_config(m);
	if (cost_init(&cost, dir, cfg, &err) != 0)
		goto fail;
	n_moe = hi3_model_n_moe_layers(m);
	K = hi3_model_max_topk(m);
	V = cfg->vocab_size;
	Cs = Lp + steps + 2;
	ids = calloc((size_t)B * Lp, sizeof(*ids));
	slot = calloc((size_t)B * Lp, sizeof(*slot));
	rope = calloc((size_t)B * Lp * 2, sizeof(*rope));
	hi = calloc((size_t)B * Lp, sizeof(*hi));
	at = calloc((size_t)B * 2, sizeof(*at));
	rid = calloc((size_t)B * Lp * (n_moe ? n_moe : 1) * (K ? K : 1), sizeof(*rid));
	rw = calloc((size_t)B * Lp * (n_moe ? n_moe : 1) * (K ? K : 1), sizeof(*rw));
	logits = calloc((size_t)B * V, sizeof(*logits));
	moe_layer = calloc((size_t)(n_moe ? n_moe : 1), sizeof(*moe_layer));
	crow = calloc((size_t)D, sizeof(*crow));
	kv = hi3_kvcache_for_model(m, B, Cs, kv_dt, &err);
	if (!ids || !slot || !rope || !hi || !at || !rid || !rw || !logits || !moe_layer || !crow || !kv)
		goto oom;
	for (int l = 0, j = 0; l < cfg->num_hidden_layers; l++)
		if (hi3_config_is_moe_layer(cfg, l))
			moe_layer[j++] = l;

	/* prefill: B full rows of random tokens, causal */
	srand(1);
	for (int r = 0; r < B; r++) {
		for (int t = 0; t < Lp; t++) {
			size_t i = (size_t)r * Lp + t;
			ids[i] = rand() % V;
			rope[2 * i] = rope[2 * i + 1] = t;
			hi[i] = t;
			slot[i] = t;
		}
		at[2 * r] = r;
		at[2 * r + 1] = Lp - 1;
	}
	hi3_batch pb = {.B = B, .T = Lp, .mode = HI3_ATTN_SELF, .ids = ids, .rope = rope, .hi = hi, .slot = slot,
	                .n_logits = B, .logit_at = at, .logits = logits};
	for (int i = 0; i <= reps; i++) {     /* the first is a warm-up */
		double t0 = now();
		if (hi3_forward(m, kv, &pb, &err) != 0)
			goto fail;
		if (i && now() - t0 < prefill_s)
			prefill_s = now() - t0;
	}
	gemm_flop = (double)B * Lp * cost.dense_flops + (double)B * cost.head_flops;
	for (int l = 0; l < cfg->num_hidden_layers; l++)
		gemm_flop += (double)B * Lp * cost.expert_flops[l];
	attn_flop = 4.0 * cfg->num_attention_heads * cfg->attention_head_dim * cfg->num_hidden_layers * (double)B *
	            ((double)Lp * (Lp + 1) / 2.0);

	/* decode: one token per row at index p = L + s, attending slots [0, p] */
	for (int s = 0; s < steps + 2; s++) {
		hi3_batch db = {.B = D, .T = 1, .mode = HI3_ATTN_CACHE, .ids = ids, .rope = rope, .hi = hi, .slot = slot,
		                .cache_row = crow, .n_logits = D, .logit_at = at, .logits = logits,
		                .route_ids = n_moe ? rid : NULL, .route_w = n_moe ? rw : NULL};
		double t0, bytes = cost.dense_bytes + cost.head_bytes + (double)D * cost.row_bytes;
		for (int r = 0; r < D; r++) {
			int p = Lp + s, best = 0;
			for (int v = 1; v < V; v++)
				if (logits[(size_t)r * V + v] > logits[(size_t)r * V + best])
					best = v;
			ids[r] = best;
			crow[r] = r;
			rope[2 * r] = rope[2 * r + 1] = p;
			hi[r] = p;
			slot[r] = p;
			at[2 * r] = r;
			at[2 * r + 1] = 0;
			bytes += 2.0 * kv->n_layers * kv->n_kv * (double)(p + 1) * kv->d * (double)hi3_dtype_size(kv_dt);
		}
		t0 = now();
		if (hi3_forward(m, kv, &db, &err) != 0)
			goto fail;
		if (s < 2)
			continue;
		dec_s += now() - t0;
		for (int j = 0; j < n_moe; j++) {  /* the experts this step read */
			int l = moe_layer[j], E = cfg->num_experts[l], used = 0;
			unsigned char seen[1024] = {0};
			for (int r = 0; r < D; r++)
				for (int q = 0; q < K; q++) {
					int e = rid[((size_t)r * n_moe + j) * K + q];
					if (e >= 0 && e < E && e < 1024 && !seen[e]) {
						seen[e] = 1;
						used++;
					}
				}
			bytes += cost.expert_bytes[l] * used / E;
		}
		dec_bytes += bytes;
	}
	dec_s /= steps;
	dec_bytes /= steps;
	printf("%s on %s: prefill %d x %d tokens in %.4f s (%.0f tokens/s, GEMMs %.3f TFLOP/s, attention %.3f TFLOP)\n",
	       label, hi3_model_backend(m), B, Lp, prefill_s, B * Lp / prefill_s, gemm_flop / prefill_s / 1e12,
	       attn_flop / 1e12);
	printf("%s on %s: decode %d rows: %.3f ms/step (%.1f tokens/s), %.3f GB read per step, %.1f GB/s\n", label,
	       hi3_model_backend(m), D, dec_s * 1e3, D / dec_s, dec_bytes / 1e9, dec_bytes / dec_s / 1e9);
	printf("RESULT label=%s backend=%s B=%d L=%d D=%d prefill_s=%.6f prefill_tok_s=%.1f prefill_tflops=%.4f "
	       "attn_tflop=%.6f decode_ms=%.4f decode_tok_s=%.2f decode_gb=%.6f decode_gbs=%.2f graphs=%s "
	       "invariant=%s\n",
	       label, hi3_model_backend(m), B, Lp, D, prefill_s, B * Lp / prefill_s, gemm_flop / prefill_s / 1e12,
	       attn_flop / 1e12, dec_s * 1e3, D / dec_s, dec_bytes / 1e9, dec_bytes / dec_s / 1e9,
	       graphs == 1 ? "on" : graphs == 2 ? "off" : "default", hi3_model_batch_invariant(m) ? "on" : "off");
	rc = 0;
	goto out;
oom:
	hi3_error_set(&err, HI3_ERR_RUNTIME, "out of memory");
fail:
	fprintf(stderr, "bench-cuda: %s\n", err.msg);
	rc = err.status ? err.status : 1;
out:
	hi3_model_close(m);       /* before the cache it may still mirror */
	hi3_kvcache_free(kv);
	free(cost.expert_bytes);
	free(cost.expert_flops);
	free(ids);
	free(slot);
	free(rope);
	free(hi);
	free(at);
	free(rid);
	free(rw);
	free(logits);
	free(moe_layer);
	free(crow);
	return rc;
}
