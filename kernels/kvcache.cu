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
                                       const int64_t *slot, const uint8_t *keep, int n_kv, int g, int d)
{
	const int m = blockIdx.x, j = blockIdx.y;
	const size_t W = (size_t)n_kv * (size_t)(g + 2) * (size_t)d;
	const float *blk = qkv + (size_t)m * W + (size_t)j * (size_t)(g + 2) * (size_t)d;
	size_t off;

	if (!keep[m])
		return;
	off = (((size_t)row[m] * (size_t)n_kv + (size_t)j) * (size_t)C + (size_t)slot[m]) * (size_t)d;
	for (int i = threadIdx.x; i < d; i += blockDim.x) {
		store_elem(k, dtype, off + (size_t)i, blk[(size_t)g * d + i]);
		store_elem(v, dtype, off + (size_t)i, blk[(size_t)(g + 1) * d + i]);
	}
}

extern "C" cudaError_t HI3K(kv_store)(cudaStream_t s, void *k, void *v, int dtype, int C, const float *qkv,
                                      const int32_t *row, const int64_t *slot, uint8_t *keep, int n_kv, int g,
                                      int d, int M)
{
	cudaError_t e;

	if (M <= 0)
		return cudaGetLastError();
	HI3K_LAUNCH(kv_keep_kernel, dim3(div_up((size_t)M, KEEP_BLOCK)), dim3(KEEP_BLOCK), 0, s)(keep, row, slot, M);
	if ((e = cudaGetLastError()) != cudaSuccess)
		return e;
	HI3K_LAUNCH(kv_store_kernel, dim3(M, n_kv), dim3(128), 0, s)(k, v, dtype, C, qkv, row, slot, keep, n_kv, g,
	                                                             d);
	return cudaGetLastError();
}
