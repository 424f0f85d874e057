/* softmax.cu -- the row softmax of attention_dense's scores, between its
 * two cuBLAS products (CPU twin: softmax_rows in lib/backend/cpu-image.c). */
#include "common.cuh"

/* grid (n), block 256: one row of M scores per block, in place */
static __global__ void softmax_rows_kernel(float *sc, int M, float scale, const uint8_t *mask)
{
	float *r = sc + (size_t)blockIdx.x * (size_t)M;
	float mx = -INFINITY, sum = 0.0f;

	for (int j = threadIdx.x; j < M; j += blockDim.x) {
		r[j] = (!mask || mask[j]) ? r[j] * scale : -INFINITY;
		mx = fmaxf(mx, r[j]);
	}
	mx = block_max(mx);
	for (int j = threadIdx.x; j < M; j += blockDim.x) {
		r[j] = mx == -INFINITY || r[j] == -INFINITY ? 0.0f : expf(r[j] - mx);
		sum += r[j];
	}
	sum = block_sum(sum);
	for (int j = threadIdx.x; j < M; j += blockDim.x)
		r[j] = sum > 0.0f ? r[j] / sum : 0.0f;
}

extern "C" cudaError_t HI3K(softmax_rows)(cudaStream_t s, float *sc, int n, int M, float scale, const uint8_t *mask)
{
	if (n > 0 && M > 0)
		HI3K_LAUNCH(softmax_rows_kernel, dim3(n), dim3(256), 0, s)(sc, M, scale, mask);
	return cudaGetLastError();
}
