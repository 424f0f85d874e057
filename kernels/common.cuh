/*
 * common.cuh -- device helpers shared by the kernels: element loads and
 * stores by dtype (the same bit-exact conversions as lib/core/tensor.c), warp and
 * block reductions, and the launch/shared-memory spellings that let the
 * same source build with nvcc or against the CPU emulation (tests/cuda-emu).
 *
 * Block sizes are multiples of 32; reductions assume it.
 */
#ifndef HI3_COMMON_CUH
#define HI3_COMMON_CUH

#include <math.h>
#include <stdint.h>
#include "kernels.h"

#ifdef HI3_CUDA_EMU
#define HI3K_LAUNCH(kernel, grid, block, smem, stream) emu_launch(kernel, grid, block, smem, stream)
#define HI3K_DYN_SMEM(type, name) type *name = reinterpret_cast<type *>(emu_dyn_smem())
#else
#define HI3K_LAUNCH(kernel, grid, block, smem, stream) kernel<<<(grid), (block), (smem), (stream)>>>
#define HI3K_DYN_SMEM(type, name)                       \
	extern __shared__ float4 hi3k_dyn_smem[];        \
	type *name = reinterpret_cast<type *>(hi3k_dyn_smem)
#endif

#define HI3K_FULL 0xffffffffu

static __device__ __forceinline__ float bf16_to_f32(uint16_t h)
{
	return __uint_as_float((uint32_t)h << 16);
}

/* Round to nearest even; NaN stays a quiet NaN (hi3_f32_to_bf16). */
static __device__ __forceinline__ uint16_t f32_to_bf16(float f)
{
	uint32_t u = __float_as_uint(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

/* IEEE half to float, subnormals included (hi3_f16_to_f32). */
static __device__ __forceinline__ float f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;

	if (exp == 0) {
		float f = ldexpf((float)man, -24);
		return sign ? -f : f;
	}
	if (exp == 31)
		return __uint_as_float(sign | 0x7f800000u | (man << 13));
	return __uint_as_float(sign | ((exp + 112) << 23) | (man << 13));
}

/* Element i of a F32, BF16 or F16 array as a float. */
static __device__ __forceinline__ float load_elem(const void *p, int dtype, size_t i)
{
	if (dtype == HI3K_BF16)
		return bf16_to_f32(static_cast<const uint16_t *>(p)[i]);
	if (dtype == HI3K_F16)
		return f16_to_f32(static_cast<const uint16_t *>(p)[i]);
	return static_cast<const float *>(p)[i];
}

/* Store f as element i of a F32 or BF16 array. */
static __device__ __forceinline__ void store_elem(void *p, int dtype, size_t i, float f)
{
	if (dtype == HI3K_BF16)
		static_cast<uint16_t *>(p)[i] = f32_to_bf16(f);
	else
		static_cast<float *>(p)[i] = f;
}

static __device__ __forceinline__ float warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(HI3K_FULL, v, o);
	return v;
}

static __device__ __forceinline__ float warp_max(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(HI3K_FULL, v, o));
	return v;
}

struct hi3k_add {
	__device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct hi3k_max {
	__device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/* op of v over the block (warps first, then the warps' results in warp
 * 0), returned to every thread; id is op's identity. Every thread of the
 * block must call it. */
template <class Op> static __device__ __forceinline__ float block_reduce(float v, float id, Op op)
{
	__shared__ float part[32];
	__shared__ float total;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
	float r;

	for (int o = 16; o > 0; o >>= 1)
		v = op(v, __shfl_xor_sync(HI3K_FULL, v, o));
	if (lane == 0)
		part[warp] = v;
	__syncthreads();
	if (warp == 0) {
		float t = lane < nwarps ? part[lane] : id;
		for (int o = 16; o > 0; o >>= 1)
			t = op(t, __shfl_xor_sync(HI3K_FULL, t, o));
		if (lane == 0)
			total = t;
	}
	__syncthreads();
	r = total;
	__syncthreads();          /* part and total are free for the next call */
	return r;
}

/* The sum of v over the block, to every thread. */
static __device__ __forceinline__ float block_sum(float v)
{
	return block_reduce(v, 0.0f, hi3k_add());
}

/* The largest v over the block, to every thread. */
static __device__ __forceinline__ float block_max(float v)
{
	return block_reduce(v, -INFINITY, hi3k_max());
}

static inline unsigned div_up(size_t a, unsigned b)
{
	return (unsigned)((a + b - 1) / b);
}

/* Blocks of 256 threads for a grid-stride loop over n elements: at most
 * 1024, which fill a GPU (and keep the emulator's fibers few). */
#define HI3K_GS_BLOCK 256
static inline unsigned gs_grid(size_t n)
{
	unsigned b = div_up(n, HI3K_GS_BLOCK);
	return b < 1 ? 1 : b > 1024 ? 1024 : b;
}

#define GRID_STRIDE(i, n) \
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

/* act(x) of enum hi3_act (backend.h): 0 none, 1 silu, 2 gelu (erf), 3 gelu (tanh) */
static __device__ __forceinline__ float act_f(float x, int act)
{
	if (act == 1)
		return x * (1.0f / (1.0f + expf(-x)));
	if (act == 2)
		return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
	if (act == 3)
		return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
	return x;
}

#endif
