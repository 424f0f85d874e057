/*
 * emu-kernel.h -- CUDA device code on the CPU, forced in front of a .cu
 * file compiled as C++ (g++ -x c++ -include emu-kernel.h). Each block runs
 * its threads as fibers (emu.cc); __syncthreads and the warp shuffles are
 * barriers between them, and threads between two barriers run in a random
 * order, so a missing barrier shows up as a wrong result rather than
 * passing by luck. Shared variables are statics (blocks run one by one).
 */
#ifndef HI3_EMU_KERNEL_H
#define HI3_EMU_KERNEL_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <functional>
#include <memory>
#include <tuple>
#include <utility>
#include "cuda-emu.h"

struct dim3 {
	unsigned x, y, z;
	dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

struct alignas(16) float4 {
	float x, y, z, w;
};

struct alignas(16) uint4 {
	uint32_t x, y, z, w;
};

struct emu_thread {
	dim3 tid, bid, bdim, gdim;
};
extern emu_thread *emu_cur;

#define threadIdx (emu_cur->tid)
#define blockIdx (emu_cur->bid)
#define blockDim (emu_cur->bdim)
#define gridDim (emu_cur->gdim)
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

void __syncthreads(void);
int __syncthreads_or(int v);
void __syncwarp(unsigned mask = 0xffffffffu);
uint64_t emu_shfl_bits(unsigned mask, uint64_t v, int src_lane);
int emu_lane(void);
void *emu_dyn_smem(void);
void emu_run_grid(const void *kernel, dim3 grid, dim3 block, size_t smem, const std::function<void()> &body);
/* 1 when s is capturing (cudaStreamBeginCapture): a launch into it is
 * recorded as a node; -1 when another stream is (the launch is refused). */
int emu_capturing(cudaStream_t s);
void emu_record_node(std::function<void()> node);
void emu_refuse_in_capture(const char *what);
cudaError_t emu_func_attr(const void *kernel, int attr, int value);

template <class T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
	uint64_t b = 0;
	T r;

	static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
	(void)width;
	memcpy(&b, &v, sizeof(T));
	b = emu_shfl_bits(mask, b, src & 31);
	memcpy(&r, &b, sizeof(T));
	return r;
}

template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
	return __shfl_sync(mask, v, emu_lane() ^ lane_mask, width);
}

/* Threads of a block run one at a time: atomics are plain updates. */
template <class T> static inline T atomicAdd(T *p, T v)
{
	T old = *p;
	*p = old + v;
	return old;
}

template <class T> static inline T atomicMin(T *p, T v)
{
	T old = *p;
	*p = v < old ? v : old;
	return old;
}

template <class T> static inline T atomicMax(T *p, T v)
{
	T old = *p;
	*p = v > old ? v : old;
	return old;
}

static inline float __uint_as_float(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static inline uint32_t __float_as_uint(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

template <class T> static inline cudaError_t cudaFuncSetAttribute(T *kernel, enum cudaFuncAttribute attr, int value)
{
	return emu_func_attr((const void *)kernel, (int)attr, value);
}

/* A launch runs the grid now, or, into a capturing stream, is recorded with
 * a copy of its arguments and runs when the graph is launched. */
template <class... P> struct emu_launcher {
	void (*kernel)(P...);
	dim3 grid, block;
	size_t smem;
	cudaStream_t stream;
	template <class... A> void operator()(A &&...a)
	{
		int cap = emu_capturing(stream);
		if (cap < 0) {
			emu_refuse_in_capture("a kernel launch into another stream than the capturing one");
			return;
		}
		if (cap) {
			auto args = std::make_shared<std::tuple<P...>>(std::forward<A>(a)...);
			void (*k)(P...) = kernel;
			dim3 g = grid, b = block;
			size_t sm = smem;
			emu_record_node([k, g, b, sm, args] {
				emu_run_grid((const void *)k, g, b, sm, [&] { std::apply(k, *args); });
			});
			return;
		}
		std::tuple<P...> args(std::forward<A>(a)...);
		emu_run_grid((const void *)kernel, grid, block, smem, [&] { std::apply(kernel, args); });
	}
};

template <class... P>
static inline emu_launcher<P...> emu_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s)
{
	return emu_launcher<P...>{kernel, grid, block, smem, s};
}

#endif
