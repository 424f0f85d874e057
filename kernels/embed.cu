/* embed.cu -- the embedding gather: x (M, H) = rows ids (M) of wte (V, H),
 * converted from F32, BF16 or F16 (CPU twin: cpu_embed). */
#include "common.cuh"

/* grid (M), block 256: one token per block */
static __global__ void embed_kernel(float *x, const int64_t *ids, const void *wte, int dtype, int H)
{
	const size_t m = blockIdx.x, base = (size_t)ids[m] * (size_t)H;
	float *xr = x + m * (size_t)H;

	for (int i = threadIdx.x; i < H; i += blockDim.x)
		xr[i] = load_elem(wte, dtype, base + (size_t)i);
}

extern "C" cudaError_t HI3K(embed)(cudaStream_t s, float *x, const int64_t *ids, const void *wte, int dtype, int M,
                                   int H)
{
	if (M > 0)
		HI3K_LAUNCH(embed_kernel, dim3(M), dim3(256), 0, s)(x, ids, wte, dtype, H);
	return cudaGetLastError();
}
