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

/* ------------------------------------------------------------ image ops
 * (CPU twins: hi3i_cpu_act, hi3i_cpu_bias_add, hi3i_cpu_scale_shift in
 * lib/backend/cpu-image.c) */

static __global__ void act_kernel(float *y, const float *x, size_t n, int act)
{
	GRID_STRIDE(i, n)
		y[i] = act_f(x[i], act);
}

extern "C" cudaError_t HI3K(act)(cudaStream_t s, float *y, const float *x, size_t n, int act)
{
	if (n)
		HI3K_LAUNCH(act_kernel, dim3(gs_grid(n)), dim3(HI3K_GS_BLOCK), 0, s)(y, x, n, act);
	return cudaGetLastError();
}

static __global__ void bias_add_kernel(float *x, const float *b, int N, size_t n)
{
	GRID_STRIDE(i, n)
		x[i] += b[i % (size_t)N];
}

extern "C" cudaError_t HI3K(bias_add)(cudaStream_t s, float *x, const float *b, int64_t M, int N)
{
	const size_t n = (size_t)M * (size_t)N;

	if (n)
		HI3K_LAUNCH(bias_add_kernel, dim3(gs_grid(n)), dim3(HI3K_GS_BLOCK), 0, s)(x, b, N, n);
	return cudaGetLastError();
}

static __global__ void scale_shift_kernel(float *h, const float *ss, int64_t P, int C, size_t n)
{
	GRID_STRIDE(i, n) {
		const size_t b = i / ((size_t)P * (size_t)C), c = i % (size_t)C;
		const float *sc = ss + b * 2 * (size_t)C;
		h[i] = h[i] * (1.0f + sc[c]) + sc[C + c];
	}
}

extern "C" cudaError_t HI3K(scale_shift)(cudaStream_t s, float *h, const float *ss, int B, int64_t P, int C)
{
	const size_t n = (size_t)B * (size_t)P * (size_t)C;

	if (n)
		HI3K_LAUNCH(scale_shift_kernel, dim3(gs_grid(n)), dim3(HI3K_GS_BLOCK), 0, s)(h, ss, P, C, n);
	return cudaGetLastError();
}
