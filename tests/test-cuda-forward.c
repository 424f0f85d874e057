/*
 * test-cuda-forward.c -- whole forward passes on the CUDA backend against
 * the CPU backend: a right-padded prefill of three rows (one with a 2-D
 * image block) into a KV cache, then three greedy decode steps from the
 * cache, on tiny (dense, MHA), tiny-moe (MoE + shared MLP, GQA, qk-norm)
 * and a head dim 128 variant, in fp32 and with bf16 weights.
 *
 * fp32: logits within 1e-4 relative of the CPU (each call), the same greedy
 * tokens, and the KV cache brought back by hi3_kv_sync_host (after the
 * prefill: most of the cache; after decoding: only the new slots) within
 * 1e-5.
 * bf16 weights: logits within 2e-2 relative of the CPU on the same weights
 * (the GPU also rounds activations to bf16 for its GEMMs), same tokens.
 *
 * Built against the GPU (make check-cuda) and the CPU emulation (make check).
 */
#include "hi3.h"
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/internal.h"
#include "tap.h"
#include "cuda-test.h"
#include "testdir.h"

enum { B = 3, L = 29, STEPS = 3, C = L + STEPS, S = 1 };
static const int n_real[B] = {13, 29, 7};

static uint32_t rnd(uint32_t n)
{
	return (uint32_t)(urand() * n);
}

static int argmax(const float *x, int n)
{
	int best = 0;

	for (int i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
}

/* The caches as f32, for comparing. */
static float *cache_f32(const hi3_kvcache *kv, size_t *n)
{
	size_t per = (size_t)kv->B * kv->n_kv * kv->C * kv->d;
	float *out = malloc(sizeof(float) * per * 2 * (size_t)kv->n_layers);

	HI3_ASSERT(out);
	for (int l = 0; l < kv->n_layers; l++) {
		hi3_to_f32(out + (2 * (size_t)l) * per, kv->k[l], kv->dtype, per);
		hi3_to_f32(out + (2 * (size_t)l + 1) * per, kv->v[l], kv->dtype, per);
	}
	*n = per * 2 * (size_t)kv->n_layers;
	return out;
}

static int forward(hi3_model *m, hi3_kvcache *kv, const hi3_batch *b)
{
	hi3_error err = {0};

	if (hi3_forward(m, kv, b, &err) == 0)
		return 0;
	diag("%s: forward: %s", hi3_model_backend(m), err.msg);
	return -1;
}

static void run(const char *dir, const char *label, hi3_dtype kv_dt, double tol)
{
	hi3_model_opts oc = {.backend = "cpu", .threads = 1, .batch_invariant = 1}, og = {.backend = "cuda"};
	hi3_model *mc = NULL, *mg = NULL;
	hi3_error err = {0};
	hi3_kvcache *kc = NULL, *kg = NULL;
	const hi3_config *cfg;
	int64_t ids[B * L], slot[B * L], sid[B], sslot[B];
	int32_t rope[B * L * 2], hi[B * L], blocks[B * S * 2] = {0}, at[B * 2], srope[B * 2], shi[B], sat[B * 2];
	float *lc, *lg, *kvc_f, *kvg_f;
	size_t nkv;
	int V, same = 1;
	double worst = 0.0;

	if (hi3_model_open(&mc, dir, &oc, &err) || hi3_model_open(&mg, dir, &og, &err)) {
		ok(0, "%s: open the model on both backends: %s", label, err.msg);
		hi3_model_close(mc);
		return;
	}
	cfg = hi3_model_config(mc);
	V = cfg->vocab_size;
	lc = malloc(sizeof(float) * B * (size_t)V);
	lg = malloc(sizeof(float) * B * (size_t)V);
	HI3_ASSERT(lc && lg);
	kc = hi3_kvcache_for_model(mc, B, C, kv_dt, &err);
	kg = hi3_kvcache_for_model(mg, B, C, kv_dt, &err);
	HI3_ASSERT(kc && kg);

	/* prefill: right padded; row 1 holds a 2 x 4 image block at [10, 18) */
	for (int r = 0; r < B; r++) {
		for (int t = 0; t < L; t++) {
			int i = r * L + t;
			ids[i] = t < n_real[r] ? (int64_t)rnd((uint32_t)V) : 0;
			rope[2 * i] = rope[2 * i + 1] = t;
			if (r == 1 && t >= 10 && t < 18) {
				rope[2 * i] = 10 + (t - 10) / 4;
				rope[2 * i + 1] = 10 + (t - 10) % 4;
			}
			hi[i] = t;
			slot[i] = t;
		}
		at[2 * r] = r;
		at[2 * r + 1] = n_real[r] - 1;
	}
	blocks[2] = 10;
	blocks[3] = 18;
	hi3_batch pb = {.B = B, .T = L, .mode = HI3_ATTN_SELF, .ids = ids, .rope = rope, .hi = hi, .blocks = blocks,
	                .S = S, .slot = slot, .n_logits = B, .logit_at = at};
	pb.logits = lc;
	if (forward(mc, kc, &pb))
		goto out;
	pb.logits = lg;
	if (forward(mg, kg, &pb))
		goto out;
	ok(hi3_kv_sync_host(mg, kg, &err) == 0, "%s: hi3_kv_sync_host after the prefill %s", label, err.msg);
	worst = rel_err(lg, lc, (size_t)B * V);
	for (int r = 0; r < B; r++)
		same &= argmax(lg + (size_t)r * V, V) == argmax(lc + (size_t)r * V, V);

	/* greedy decode from the cache, the CPU's tokens fed to both */
	for (int s = 0; s < STEPS; s++) {
		for (int r = 0; r < B; r++) {
			int p = n_real[r] + s;
			sid[r] = argmax(lc + (size_t)r * V, V);
			srope[2 * r] = srope[2 * r + 1] = p;
			shi[r] = p;
			sslot[r] = p;
			sat[2 * r] = r;
			sat[2 * r + 1] = 0;
		}
		hi3_batch db = {.B = B, .T = 1, .mode = HI3_ATTN_CACHE, .ids = sid, .rope = srope, .hi = shi,
		                .slot = sslot, .n_logits = B, .logit_at = sat};
		db.logits = lc;
		if (forward(mc, kc, &db))
			goto out;
		db.logits = lg;
		if (forward(mg, kg, &db))
			goto out;
		worst = HI3_MAX(worst, rel_err(lg, lc, (size_t)B * V));
		for (int r = 0; r < B; r++)
			same &= argmax(lg + (size_t)r * V, V) == argmax(lc + (size_t)r * V, V);
	}
	ok(worst <= tol, "%s: logits of the prefill and %d decode steps within %.0e of the CPU (worst %.2e)", label,
	   STEPS, tol, worst);
	ok(same, "%s: the same greedy tokens as the CPU", label);
	ok(hi3_kv_sync_host(mg, kg, &err) == 0, "%s: hi3_kv_sync_host after decoding %s", label, err.msg);
	kvc_f = cache_f32(kc, &nkv);
	kvg_f = cache_f32(kg, &nkv);
	{
		double e = rel_err(kvg_f, kvc_f, nkv), kt = kv_dt == HI3_BF16 || tol > 1e-3 ? 1e-2 : 1e-5;
		ok(e <= kt, "%s: the KV cache synced to the host within %.0e of the CPU's (%.2e)", label, kt, e);
	}
	free(kvc_f);
	free(kvg_f);

	/* The same cache struct and memory, new contents (a KV file closed and
	 * another mapped at the same address): once the model is told, the GPU
	 * reads the new contents, not its copy of the old. */
	{
		size_t per = (size_t)B * kc->n_kv * C * kc->d * hi3_dtype_size(kv_dt);
		for (int l = 0; l < kc->n_layers; l++)
			for (size_t i = 0; i < per; i++) {
				unsigned char b = (unsigned char)rnd(64);   /* small values in f32 and bf16 */
				((unsigned char *)kc->k[l])[i] = ((unsigned char *)kg->k[l])[i] = b;
				((unsigned char *)kc->v[l])[i] = ((unsigned char *)kg->v[l])[i] = (unsigned char)(b ^ 0x15);
			}
		hi3_model_drop_cache(mc, kc);
		hi3_model_drop_cache(mg, kg);
		for (int r = 0; r < B; r++)
			shi[r] = sslot[r] = n_real[r] + STEPS - 1;
		hi3_batch db = {.B = B, .T = 1, .mode = HI3_ATTN_CACHE, .ids = sid, .rope = srope, .hi = shi,
		                .slot = sslot, .n_logits = B, .logit_at = sat};
		db.logits = lc;
		int fc = forward(mc, kc, &db);
		db.logits = lg;
		int fg = fc ? -1 : forward(mg, kg, &db);
		ok(!fc && !fg && rel_err(lg, lc, (size_t)B * V) <= tol,
		   "%s: a new cache at the old address is read afresh (%.2e)", label, rel_err(lg, lc, (size_t)B * V));
	}
out:
	hi3_model_close(mc);      /* before the caches they may still mirror */
	hi3_model_close(mg);
	hi3_kvcache_free(kc);
	hi3_kvcache_free(kg);
	free(lc);
	free(lg);
}

int main(void)
{
	static const struct {
		const char *label, *preset, *overrides;
		hi3_dtype dtype, kv;
		double tol;
	} cases[] = {
		{"tiny f32", "tiny", NULL, HI3_F32, HI3_F32, 1e-4},
		{"tiny-moe f32", "tiny-moe", NULL, HI3_F32, HI3_F32, 1e-4},
		{"tiny-moe f32, bf16 cache", "tiny-moe", NULL, HI3_F32, HI3_BF16, 1e-4},
		{"tiny-moe d=128 f32", "tiny-moe",
		 "{\"attention_head_dim\": 128, \"num_attention_heads\": 8, \"num_key_value_heads\": 2}", HI3_F32,
		 HI3_F32, 1e-4},
		{"tiny-moe bf16 weights", "tiny-moe", NULL, HI3_BF16, HI3_F32, 2e-2},
	};
	char *root = testdir_new("cuda-forward");

	if (!root)
		return 1;
	for (size_t i = 0; i < HI3_ARRAY_SIZE(cases); i++) {
		hi3_init_opts io = {.preset = cases[i].preset, .seed = 7 + i, .dtype = cases[i].dtype,
		                    .overrides = cases[i].overrides};
		hi3_error err = {0};
		char dir[600];

		snprintf(dir, sizeof(dir), "%s/m%zu", root, i);
		if (!ok(hi3_init_model(dir, &io, &err) == 0, "%s: init-model %s", cases[i].label, err.msg))
			continue;
		run(dir, cases[i].label, cases[i].kv, cases[i].tol);
	}
	testdir_done(root);
	return done_testing();
}
