/*
 * kvcache.c -- a KV cache in host memory of its own (benchmarks, tests, a
 * caller that keeps the cache in memory; hi3_kvcache_for_model shapes one
 * for a model); the file-backed cache of the stages is format/kv.c's.
 */
#include <string.h>
#include "core/internal.h"

hi3_kvcache *hi3_kvcache_alloc(int n_layers, int B, int n_kv, int C, int d, hi3_dtype dtype, hi3_error *err)
{
	hi3_kvcache *kv;
	size_t n;

	if (n_layers < 1 || B < 1 || n_kv < 1 || C < 1 || d < 1 || (dtype != HI3_F32 && dtype != HI3_BF16)) {
		hi3_error_set(err, HI3_ERR_USAGE, "KV cache: shape (%d layers, %d, %d, %d, %d) %s is not one hi3 can "
		              "hold", n_layers, B, n_kv, C, d, hi3_dtype_name(dtype));
		return NULL;
	}
	n = (size_t)B * (size_t)n_kv * (size_t)C * (size_t)d * hi3_dtype_size(dtype);
	if (!(kv = hi3i_calloc(1, sizeof(*kv), err)))
		return NULL;
	*kv = (hi3_kvcache){.n_layers = n_layers, .B = B, .n_kv = n_kv, .C = C, .d = d, .dtype = dtype};
	kv->k = hi3i_calloc((size_t)n_layers, sizeof(void *), err);
	kv->v = hi3i_calloc((size_t)n_layers, sizeof(void *), err);
	if (!kv->k || !kv->v)
		goto fail;
	for (int l = 0; l < n_layers; l++) {
		if (!(kv->k[l] = hi3i_aligned_alloc(n, err)) || !(kv->v[l] = hi3i_aligned_alloc(n, err)))
			goto fail;
		memset(kv->k[l], 0, n);
		memset(kv->v[l], 0, n);
	}
	return kv;
fail:
	hi3_kvcache_free(kv);
	return NULL;
}

void hi3_kvcache_free(hi3_kvcache *kv)
{
	if (!kv)
		return;
	for (int l = 0; l < kv->n_layers; l++) {
		if (kv->k)
			free(kv->k[l]);
		if (kv->v)
			free(kv->v[l]);
	}
	free(kv->k);
	free(kv->v);
	free(kv);
}
