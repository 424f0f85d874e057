/* rmsnorm.cu -- RMSNorm of rows: y = w * (x * 1/sqrt(mean(x^2) + eps)) in
 * fp32 (CPU twin: cpu_rmsnorm). The per-head norm after RoPE is in rope.cu. */
#include "common.cuh"

/* grid (M), block 256: one row per block. y may equal x: each thread
 * writes only the elements it read, after the block sum. */
static __global__ void rmsnorm_kernel(float *y, const float *x, const float *w, int n, float eps)
{
	const float *xr = x + (size_t)blockIdx.x * (size_t)n;
	float *yr = y + (size_t)blockIdx.x * (size_t)n;
	float ss = 0.0f, r;

	for (int i = threadIdx.x; i < n; i += blockDim.x)
		ss += xr[i] * xr[i];
	ss = block_sum(ss);
	r = 1.0f / sqrtf(ss / (float)n + eps);
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		yr[i] = w[i] * (xr[i] * r);
}

extern "C" cudaError_t HI3K(rmsnorm)(cudaStream_t s, float *y, const float *x, const float *w, int M, int n,
                                     float eps)
{
	if (M > 0)
		HI3K_LAUNCH(rmsnorm_kernel, dim3(M), dim3(256), 0, s)(y, x, w, n, eps);
	return cudaGetLastError();
}
