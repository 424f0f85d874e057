/* test-backend.c -- the backend contract the model relies on: every op a
 * model calls is checked at open, an op's failure reaches the caller as an
 * error (never an abort), and in-memory caches have an alloc/free pair. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include "model/model.h"
#include "tap.h"
#include "testdir.h"

static char *root;

/* One greedy forward of three tokens of one row; 0 or -1 with err. */
static int forward3(hi3_model *m, hi3_kvcache *kv, float *logits, hi3_error *err)
{
	int64_t ids[3] = {1, 2, 3}, slot[3] = {0, 1, 2};
	int32_t rope[6] = {0, 0, 1, 1, 2, 2}, hi[3] = {0, 1, 2}, at[2] = {0, 2};
	hi3_batch b = {.B = 1, .T = 3, .mode = HI3_ATTN_SELF, .ids = ids, .rope = rope, .hi = hi, .slot = slot,
	               .n_logits = 1, .logit_at = at, .logits = logits};

	return hi3_forward(m, kv, &b, err);
}

int main(void)
{
	hi3_init_opts o = {.preset = "tiny-moe", .seed = 3, .dtype = HI3_F32};
	hi3_error err = {0};
	hi3_model *m = NULL;
	hi3_kvcache *kv = NULL;
	float *a = NULL, *b = NULL;
	char *dir;

	if (!(root = testdir_new("test-backend")))
		return 1;
	dir = hi3i_asprintf("%s/m", root);
	if (hi3_init_model(dir, &o, &err) != 0 || hi3_model_open(&m, dir, NULL, &err) != 0) {
		ok(0, "tiny-moe model: %s", err.msg);
		return done_testing();
	}
	{
		const int V = hi3_model_config(m)->vocab_size;
		a = calloc((size_t)V, sizeof(float));
		b = calloc((size_t)V, sizeof(float));
	}

	/* the capability check: a table without an op the model needs is
	 * refused, naming the backend and the op; matmul_group is optional */
	{
		hi3_backend_ops ops = *m->be->ops;
		hi3_backend fake = *m->be;

		fake.ops = &ops;
		ok(hi3i_backend_check(&fake, &err) == 0, "the cpu ops table is complete");
		ops.matmul_group = NULL;
		ok(hi3i_backend_check(&fake, &err) == 0, "matmul_group is optional");
		ops.rope_qk = NULL;
		ok(hi3i_backend_check(&fake, &err) == -1 && err.status == HI3_ERR_USAGE && strstr(err.msg, "'rope_qk'") &&
		   strstr(err.msg, "cpu"), "a missing op is refused by name: %s", err.msg);
	}

	/* kvcache alloc/free */
	kv = hi3_kvcache_for_model(m, 1, 8, HI3_BF16, &err);
	ok(kv && kv->n_layers == hi3_model_config(m)->num_hidden_layers && kv->B == 1 && kv->C == 8 &&
	   kv->n_kv == hi3_model_config(m)->num_key_value_heads && kv->dtype == HI3_BF16,
	   "hi3_kvcache_for_model: the model's shape, bf16");
	{
		int zero = 1;
		for (int l = 0; kv && l < kv->n_layers; l++)
			for (size_t i = 0; i < (size_t)kv->n_kv * kv->C * kv->d * 2; i++)
				zero &= ((unsigned char *)kv->k[l])[i] == 0 && ((unsigned char *)kv->v[l])[i] == 0;
		ok(zero, "every layer starts zeroed");
	}
	hi3_kvcache_free(kv);
	ok(hi3_kvcache_alloc(2, 1, 2, 8, 16, HI3_I32, &err) == NULL && err.status == HI3_ERR_USAGE,
	   "a cache of another dtype is refused: %s", err.msg);
	ok(hi3_kvcache_alloc(0, 1, 2, 8, 16, HI3_F32, &err) == NULL, "no layers: refused");
	/* an odd shape: every layer's keys and values are their own bytes,
	 * 64-byte aligned (each written whole and read back; ASan sees an
	 * overrun), in one block of 2 MiB pages */
	kv = hi3_kvcache_alloc(3, 2, 3, 5, 7, HI3_BF16, &err);
	{
		const size_t n = 2 * 3 * 5 * 7 * 2;
		int own = kv != NULL;
		for (int l = 0; own && l < 3; l++) {
			memset(kv->k[l], 2 * l + 1, n);
			memset(kv->v[l], 2 * l + 2, n);
			own &= (uintptr_t)kv->k[l] % 64 == 0 && (uintptr_t)kv->v[l] % 64 == 0;
		}
		for (int l = 0; own && l < 3; l++)
			for (size_t i = 0; i < n; i++)
				own &= ((unsigned char *)kv->k[l])[i] == 2 * l + 1 && ((unsigned char *)kv->v[l])[i] == 2 * l + 2;
		ok(own, "an odd shape: each layer's keys and values apart, aligned");
		ok(kv && (uintptr_t)kv->mem % ((size_t)2 << 20) == 0 && kv->k[0] == kv->mem,
		   "in one block on a 2 MiB boundary");
	}
	hi3_kvcache_free(kv);
	hi3_kvcache_free(NULL);

	/* a failed op reaches the caller, and sticks */
	err = (hi3_error){0};
	kv = hi3_kvcache_for_model(m, 1, 4, HI3_F32, &err);
	ok(kv && forward3(m, kv, a, &err) == 0, "a forward runs: %s", err.msg);
	hi3i_backend_fail(m->be, "emulated device fault in op %s", "attention");
	hi3i_backend_fail(m->be, "a second failure, dropped");
	ok(forward3(m, kv, b, &err) == -1 && err.status == HI3_ERR_RUNTIME &&
	   strstr(err.msg, "emulated device fault in op attention") && !strstr(err.msg, "second"),
	   "after an op failed, forward returns the first failure: %s", err.msg);
	ok(forward3(m, kv, b, &err) == -1, "and keeps failing (a fault leaves the backend unusable)");
	hi3_model_drop_cache(m, kv);
	hi3_kvcache_free(kv);
	hi3_model_close(m);

	/* the same model reopened computes again, bit for bit */
	if (hi3_model_open(&m, dir, NULL, &err) == 0) {
		kv = hi3_kvcache_for_model(m, 1, 4, HI3_F32, &err);
		ok(kv && forward3(m, kv, b, &err) == 0 && !memcmp(a, b, sizeof(float) * (size_t)hi3_model_config(m)->vocab_size),
		   "a fresh model: the same logits as before the fault");
		hi3_model_drop_cache(m, kv);
		hi3_kvcache_free(kv);
		hi3_model_close(m);
	}
	free(a);
	free(b);
	testdir_done(root);
	free(dir);
	return done_testing();
}
