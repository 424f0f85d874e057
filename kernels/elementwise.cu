/* elementwise.cu -- the residual add, SwiGLU, and the f32 -> bf16 cast of a
 * GEMM input (CPU twins: cpu_add, cpu_swiglu; the cast has none: the CPU
 * multiplies bf16 weights with f32 activations). */
#include "common.cuh"

#define EW_BLOCK 256

/* enough blocks to fill the GPU; the loops stride over the rest */
static unsigned ew_grid(size_t n)
{
	unsigned b = div_up(n, EW_BLOCK);
	return b > 65535u * 8 ? 65535u * 8 : b;
}

static __global__ void add_kernel(float *x, const float *y, size_t n)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		x[i] += y[i];
}

extern "C" cudaError_t HI3K(probe)(void)
{
#ifdef HI3_CUDA_EMU
	return cudaSuccess;
#else
	cudaFuncAttributes a;
	return cudaFuncGetAttributes(&a, add_kernel);
#endif
}

extern "C" cudaError_t HI3K(add)(cudaStream_t s, float *x, const float *y, size_t n)
{
	if (n)
		HI3K_LAUNCH(add_kernel, dim3(ew_grid(n)), dim3(EW_BLOCK), 0, s)(x, y, n);
	return cudaGetLastError();
}

/* silu on the second half: y = a * (b / (1 + e^-b)) */
static __global__ void swiglu_kernel(float *y, const float *ab, int inter, size_t n)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		size_t m = i / (size_t)inter, c = i % (size_t)inter;
		float a = ab[m * 2 * (size_t)inter + c], b = ab[m * 2 * (size_t)inter + (size_t)inter + c];
		y[i] = a * (b / (1.0f + expf(-b)));
	}
}

extern "C" cudaError_t HI3K(swiglu)(cudaStream_t s, float *y, const float *ab, int M, int inter)
{
	size_t n = (size_t)M * (size_t)inter;

	if (n)
		HI3K_LAUNCH(swiglu_kernel, dim3(ew_grid(n)), dim3(EW_BLOCK), 0, s)(y, ab, inter, n);
	return cudaGetLastError();
}

static __global__ void to_bf16_kernel(uint16_t *y, const float *x, size_t n)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		y[i] = f32_to_bf16(x[i]);
}

extern "C" cudaError_t HI3K(to_bf16)(cudaStream_t s, uint16_t *y, const float *x, size_t n)
{
	if (n)
		HI3K_LAUNCH(to_bf16_kernel, dim3(ew_grid(n)), dim3(EW_BLOCK), 0, s)(y, x, n);
	return cudaGetLastError();
}
