/* kvcache.cu -- storing K and V of new tokens into the cache (CPU twin:
 * cpu_kv_store). The CPU stores the tokens of a row in order, so when two
 * tokens name the same (row, slot) the later one wins; here every token is
 * stored in parallel, and a first pass keeps only the last writer of each
 * (row, slot). */
#include "common.cuh"

#define KEEP_BLOCK 256

/* grid (M / 256), block 256: keep[m] = slot[m] >= 0 and no m' > m has the
 * same (row, slot). The later tokens pass through shared memory a block
 * at a time. */
static __global__ void kv_keep_kernel(uint8_t *keep, const int32_t *row, const int64_t *slot, int M)
{
	__shared__ int32_t rs[KEEP_BLOCK];
	__shared__ int64_t ss[KEEP_BLOCK];
	const int m = blockIdx.x * KEEP_BLOCK + threadIdx.x;
	const int32_t rm = m < M ? row[m] : 0;
	const int64_t sm = m < M ? slot[m] : -1;
	int later = 0;

	for (int t0 = blockIdx.x * KEEP_BLOCK; t0 < M; t0 += KEEP_BLOCK) {
		int n = M - t0 < KEEP_BLOCK ? M - t0 : KEEP_BLOCK;
		__syncthreads();
		if ((int)threadIdx.x < n) {
			rs[threadIdx.x] = row[t0 + threadIdx.x];
			ss[threadIdx.x] = slot[t0 + threadIdx.x];
		}
		__syncthreads();
		for (int t = 0; t < n; t++)
			if (t0 + t > m && ss[t] == sm && rs[t] == rm)
				later = 1;
	}
	if (m < M)
		keep[m] = sm >= 0 && !later;
}

/* grid (M, n_kv), block 128: token m's key and value head j */
static __global__ void kv_store_kernel(void *k, void *v, int dtype, int C, const float *qkv, const int32_t *row,
                                       const int64_t *slot, const uint8_t *keep, int32_t *dirty, int n_kv, int g,
                                       int d)
{
	const int m = blockIdx.x, j = blockIdx.y;
	const size_t W = (size_t)n_kv * (size_t)(g + 2) * (size_t)d;
	const float *blk = qkv + (size_t)m * W + (size_t)j * (size_t)(g + 2) * (size_t)d;
	size_t off;

	if (!keep[m])
		return;
	if (dirty && j == 0 && threadIdx.x == 0) {
		atomicMin(&dirty[2 * row[m]], (int32_t)slot[m]);
		atomicMax(&dirty[2 * row[m] + 1], (int32_t)slot[m]);
	}
	off = (((size_t)row[m] * (size_t)n_kv + (size_t)j) * (size_t)C + (size_t)slot[m]) * (size_t)d;
	for (int i = threadIdx.x; i < d; i += blockDim.x) {
		store_elem(k, dtype, off + (size_t)i, blk[(size_t)g * d + i]);
		store_elem(v, dtype, off + (size_t)i, blk[(size_t)(g + 1) * d + i]);
	}
}

extern "C" cudaError_t HI3K(kv_store)(cudaStream_t s, void *k, void *v, int dtype, int C, const float *qkv,
                                      const int32_t *row, const int64_t *slot, uint8_t *keep, int32_t *dirty,
                                      int n_kv, int g, int d, int M)
{
	cudaError_t e;

	if (M <= 0)
		return cudaGetLastError();
	HI3K_LAUNCH(kv_keep_kernel, dim3(div_up((size_t)M, KEEP_BLOCK)), dim3(KEEP_BLOCK), 0, s)(keep, row, slot, M);
	if ((e = cudaGetLastError()) != cudaSuccess)
		return e;
	HI3K_LAUNCH(kv_store_kernel, dim3(M, n_kv), dim3(128), 0, s)(k, v, dtype, C, qkv, row, slot, keep, dirty, n_kv,
	                                                             g, d);
	return cudaGetLastError();
}

/* grid (n, 2 n_layers n_kv), block 256: range i of one (layer, K or V,
 * kv head), as 32-bit words */
static __global__ void kv_pack_kernel(uint32_t *dst, const uint32_t *mem, size_t layer_words, int n_kv, int C,
                                      int dw, const int32_t *ranges, const int64_t *offs, size_t block_words)
{
	const int i = blockIdx.x, b = blockIdx.y / n_kv, j = blockIdx.y % n_kv;
	const int row = ranges[3 * i], lo = ranges[3 * i + 1], cnt = ranges[3 * i + 2];
	const uint32_t *src = mem + (size_t)b * layer_words +
	                      (((size_t)row * (size_t)n_kv + (size_t)j) * (size_t)C + (size_t)lo) * (size_t)dw;
	uint32_t *out = dst + (size_t)b * block_words + (size_t)offs[i] + (size_t)j * (size_t)cnt * (size_t)dw;
	const size_t n = (size_t)cnt * (size_t)dw;

	for (size_t e = threadIdx.x; e < n; e += blockDim.x)
		out[e] = src[e];
}

extern "C" cudaError_t HI3K(kv_pack)(cudaStream_t s, uint32_t *dst, const void *mem, size_t layer_bytes,
                                     int n_layers, int n_kv, int C, int d, int es, const int32_t *ranges,
                                     const int64_t *offs, int n, size_t block_words)
{
	if ((d * es) % 4 || layer_bytes % 4)
		return cudaErrorInvalidValue;
	if (n > 0)
		HI3K_LAUNCH(kv_pack_kernel, dim3(n, 2 * n_layers * n_kv), dim3(256), 0, s)(
			dst, static_cast<const uint32_t *>(mem), layer_bytes / 4, n_kv, C, d * es / 4, ranges, offs,
			block_words);
	return cudaGetLastError();
}
