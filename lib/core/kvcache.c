/*
 * kvcache.c -- a KV cache in host memory of its own (benchmarks, tests, a
 * caller that keeps the cache in memory; hi3_kvcache_for_model shapes one
 * for a model); the file-backed cache of the stages is format/kv.c's.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "core/internal.h"

hi3_kvcache *hi3_kvcache_alloc(int n_layers, int B, int n_kv, int C, int d, hi3_dtype dtype, hi3_error *err)
{
	hi3_kvcache *kv;
	size_t n, ld;
	unsigned char *mem;

	if (n_layers < 1 || B < 1 || n_kv < 1 || C < 1 || d < 1 || (dtype != HI3_F32 && dtype != HI3_BF16)) {
		hi3_error_set(err, HI3_ERR_USAGE, "KV cache: shape (%d layers, %d, %d, %d, %d) %s is not one hi3 can "
		              "hold", n_layers, B, n_kv, C, d, hi3_dtype_name(dtype));
		return NULL;
	}
	n = (size_t)B * (size_t)n_kv * (size_t)C * (size_t)d * hi3_dtype_size(dtype);
	ld = (n + 63) & ~(size_t)63;
	if (ld < n || ld > SIZE_MAX / 2 / (size_t)n_layers) {
		hi3_error_set(err, HI3_ERR_USAGE, "KV cache: %d layers of %zu bytes do not fit in memory", n_layers, n);
		return NULL;
	}
	if (!(kv = hi3i_calloc(1, sizeof(*kv), err)))
		return NULL;
	*kv = (hi3_kvcache){.n_layers = n_layers, .B = B, .n_kv = n_kv, .C = C, .d = d, .dtype = dtype};
	kv->k = hi3i_calloc((size_t)n_layers, sizeof(void *), err);
	kv->v = hi3i_calloc((size_t)n_layers, sizeof(void *), err);
	/* every layer's keys and values in one block of 2 MiB pages: a
	 * step's attention reads each head's keys and values as streams,
	 * which on 4 KiB pages cost a page walk and a new start of the
	 * hardware prefetcher every 4 KiB (measured: docs/PERFORMANCE.md,
	 * "Decode at B = 1, sixteenth round") */
	if (!kv->k || !kv->v || !(kv->mem = mem = hi3i_huge_alloc(2 * (size_t)n_layers * ld, err)))
		goto fail;
	memset(mem, 0, 2 * (size_t)n_layers * ld);
	for (int l = 0; l < n_layers; l++) {
		kv->k[l] = mem + (size_t)(2 * l) * ld;
		kv->v[l] = mem + (size_t)(2 * l + 1) * ld;
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
	free(kv->mem);
	free(kv->k);
	free(kv->v);
	free(kv);
}
