/* gather.cu -- row gather and weighted scatter-add, the token grouping of
 * the MoE layer: each expert gathers its tokens, runs one GEMM over them,
 * and adds its output back scaled by the routing weight; and the row
 * scatter that puts a diffusion call's image and timestep embeddings in
 * place (CPU twins: cpu_gather, cpu_scatter_add, cpu_scatter). */
#include "common.cuh"

/* grid (n), block 256: one row per block */
static __global__ void gather_kernel(float *dst, const float *src, const int32_t *idx, int w)
{
	const float *sr = src + (size_t)idx[blockIdx.x] * (size_t)w;
	float *dr = dst + (size_t)blockIdx.x * (size_t)w;

	for (int c = threadIdx.x; c < w; c += blockDim.x)
		dr[c] = sr[c];
}

extern "C" cudaError_t HI3K(gather)(cudaStream_t s, float *dst, const float *src, const int32_t *idx, int n, int w)
{
	if (n > 0)
		HI3K_LAUNCH(gather_kernel, dim3(n), dim3(256), 0, s)(dst, src, idx, w);
	return cudaGetLastError();
}

/* grid (n), block 256. No two rows of one call share a destination, so
 * plain read-modify-writes do not race. */
static __global__ void scatter_add_kernel(float *dst, const float *src, const int32_t *idx, const float *scale,
                                          int w)
{
	const float sc = scale[blockIdx.x];
	const float *sr = src + (size_t)blockIdx.x * (size_t)w;
	float *dr = dst + (size_t)idx[blockIdx.x] * (size_t)w;

	for (int c = threadIdx.x; c < w; c += blockDim.x)
		dr[c] += sc * sr[c];
}

extern "C" cudaError_t HI3K(scatter_add)(cudaStream_t s, float *dst, const float *src, const int32_t *idx,
                                         const float *scale, int n, int w)
{
	if (n > 0)
		HI3K_LAUNCH(scatter_add_kernel, dim3(n), dim3(256), 0, s)(dst, src, idx, scale, w);
	return cudaGetLastError();
}

/* grid (M), block 256: row m adds its k sources in order, each as
 * scatter_add_kernel adds one (the same expression, so the same rounding) */
static __global__ void combine_kernel(float *y, const float *src, const int32_t *where, const float *scale, int k,
                                      int w)
{
	const int32_t *wh = where + (size_t)blockIdx.x * (size_t)k;
	const float *sc = scale + (size_t)blockIdx.x * (size_t)k;
	float *dr = y + (size_t)blockIdx.x * (size_t)w;

	for (int c = threadIdx.x; c < w; c += blockDim.x) {
		float acc = 0.0f;
		for (int j = 0; j < k; j++)
			acc += sc[j] * src[(size_t)wh[j] * (size_t)w + (size_t)c];
		dr[c] = acc;
	}
}

extern "C" cudaError_t HI3K(combine)(cudaStream_t s, float *y, const float *src, const int32_t *where,
                                     const float *scale, int M, int k, int w)
{
	if (M > 0)
		HI3K_LAUNCH(combine_kernel, dim3(M), dim3(256), 0, s)(y, src, where, scale, k, w);
	return cudaGetLastError();
}

/* grid (n), block 256; the rows' destinations are distinct */
static __global__ void scatter_kernel(float *dst, const float *src, const int32_t *idx, int w)
{
	const float *sr = src + (size_t)blockIdx.x * (size_t)w;
	float *dr = dst + (size_t)idx[blockIdx.x] * (size_t)w;

	for (int c = threadIdx.x; c < w; c += blockDim.x)
		dr[c] = sr[c];
}

extern "C" cudaError_t HI3K(scatter)(cudaStream_t s, float *dst, const float *src, const int32_t *idx, int n, int w)
{
	if (n > 0)
		HI3K_LAUNCH(scatter_kernel, dim3(n), dim3(256), 0, s)(dst, src, idx, w);
	return cudaGetLastError();
}
