/*
 * gemv.cu -- the matmul for a few rows (decode): y (M, N) = x (M, K) . W^T
 * with W (N, K) F32 or BF16, M <= HI3K_GEMV_MAX_M, in one kernel that
 * streams each weight row once for all M rows (CPU twin: cpu_matmul). It
 * replaces the bf16 cast and the cuBLAS call of larger batches, and rounds x
 * to bf16 for BF16 weights as that path does, so both give the same
 * products (exact in f32) and differ only in the order of the sums.
 *
 * One warp per output column n: lane l reads 16 bytes of W's row at a time
 * (8 bf16 or 4 f32 values), multiplies them with the matching elements of
 * each of the M rows of x (small, read through the cache), and the warp
 * sums its lanes at the end. gemv_rows takes any M, 8 rows a pass, each
 * row summed as in a pass of its own: batch invariant, what the CUDA
 * backend runs instead of cuBLAS with --batch-invariant=on.
 */
#include "common.cuh"

#define GEMV_WARPS 8

/* Eight bf16 weights as floats. */
static __device__ __forceinline__ void unpack8(uint4 q, float *w)
{
	const uint32_t u[4] = {q.x, q.y, q.z, q.w};

	for (int i = 0; i < 4; i++) {
		w[2 * i] = __uint_as_float(u[i] << 16);
		w[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
	}
}

/* x[i], rounded to bf16 for bf16 weights (the input the GEMM path uses) */
template <bool BF> static __device__ __forceinline__ float xval(const float *x, size_t i)
{
	return BF ? bf16_to_f32(f32_to_bf16(x[i])) : x[i];
}

/* Column n of y (M, N) by one warp. */
template <int M, bool BF>
static __device__ __forceinline__ void gemv_column(float *y, const float *x, const void *w, int n, int N, int K)
{
	const int lane = threadIdx.x & 31;
	constexpr int per = BF ? 8 : 4;   /* weights per 16 bytes */
	const size_t row = (size_t)n * (size_t)K;
	float acc[M];

#pragma unroll
	for (int m = 0; m < M; m++)
		acc[m] = 0.0f;
	if (K % 8 == 0) {         /* 16-byte loads: rows and x stay aligned */
		for (int k = lane * per; k < K; k += 32 * per) {
			float wv[8];
			if (BF) {
				unpack8(reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(w) + row + k)[0], wv);
			} else {
				float4 f = reinterpret_cast<const float4 *>(static_cast<const float *>(w) + row + k)[0];
				wv[0] = f.x, wv[1] = f.y, wv[2] = f.z, wv[3] = f.w;
			}
#pragma unroll
			for (int m = 0; m < M; m++)
#pragma unroll
				for (int i = 0; i < per; i++)
					acc[m] += wv[i] * xval<BF>(x, (size_t)m * (size_t)K + (size_t)(k + i));
		}
	} else {
		for (int k = lane; k < K; k += 32) {
			float wk = load_elem(w, BF ? HI3K_BF16 : HI3K_F32, row + (size_t)k);
#pragma unroll
			for (int m = 0; m < M; m++)
				acc[m] += wk * xval<BF>(x, (size_t)m * (size_t)K + (size_t)k);
		}
	}
#pragma unroll
	for (int m = 0; m < M; m++) {
		float s = warp_sum(acc[m]);
		if (lane == 0)
			y[(size_t)m * (size_t)N + (size_t)n] = s;
	}
}

/* grid (N / GEMV_WARPS, passes), block 32 GEMV_WARPS: rows [8 p, 8 p + M)
 * of pass p, the M rows of the last pass its remainder (M <= 8 rows: one
 * pass); a row's sum is the same arithmetic in every pass */
template <int M, bool BF>
static __global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_kernel(float *y, const float *x, const void *w, int N, int K)
{
	const int n = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
	const size_t m0 = (size_t)blockIdx.y * HI3K_GEMV_MAX_M;

	if (n < N)                /* a whole warp either way: no barrier inside */
		gemv_column<M, BF>(y + m0 * (size_t)N, x + m0 * (size_t)K, w, n, N, K);
}

/* grid (max N / GEMV_WARPS, n_jobs), block 32 GEMV_WARPS: job blockIdx.y,
 * with the arithmetic of gemv_kernel, so the same bits */
template <bool BF>
static __global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_group_kernel(const hi3k_gemv_job *jobs)
{
	const hi3k_gemv_job j = jobs[blockIdx.y];
	const int n = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);

	if (n >= j.N)
		return;
	switch (j.M) {
	case 1: gemv_column<1, BF>(j.y, j.x, j.w, n, j.N, j.K); break;
	case 2: gemv_column<2, BF>(j.y, j.x, j.w, n, j.N, j.K); break;
	case 3: gemv_column<3, BF>(j.y, j.x, j.w, n, j.N, j.K); break;
	case 4: gemv_column<4, BF>(j.y, j.x, j.w, n, j.N, j.K); break;
	case 5: gemv_column<5, BF>(j.y, j.x, j.w, n, j.N, j.K); break;
	case 6: gemv_column<6, BF>(j.y, j.x, j.w, n, j.N, j.K); break;
	case 7: gemv_column<7, BF>(j.y, j.x, j.w, n, j.N, j.K); break;
	case 8: gemv_column<8, BF>(j.y, j.x, j.w, n, j.N, j.K); break;
	default: break;           /* M = 0: nothing */
	}
}

extern "C" cudaError_t HI3K(gemv_group)(cudaStream_t s, const hi3k_gemv_job *jobs, int n_jobs, int max_N, int dtype)
{
	if (n_jobs < 0 || n_jobs > 65535 || (dtype != HI3K_F32 && dtype != HI3K_BF16))
		return cudaErrorInvalidValue;
	if (n_jobs > 0 && max_N > 0) {
		void (*kernel)(const hi3k_gemv_job *) = dtype == HI3K_BF16 ? gemv_group_kernel<true> : gemv_group_kernel<false>;
		HI3K_LAUNCH(kernel, dim3(div_up((size_t)max_N, GEMV_WARPS), n_jobs), dim3(GEMV_WARPS * 32), 0, s)(jobs);
	}
	return cudaGetLastError();
}

/* passes of M rows each from y, x */
template <int M>
static cudaError_t launch(cudaStream_t s, float *y, const float *x, const void *w, int dtype, int N, int K,
                          unsigned passes = 1)
{
	void (*kernel)(float *, const float *, const void *, int, int) =
		dtype == HI3K_BF16 ? gemv_kernel<M, true> : gemv_kernel<M, false>;

	HI3K_LAUNCH(kernel, dim3(div_up((size_t)N, GEMV_WARPS), passes), dim3(GEMV_WARPS * 32), 0, s)(y, x, w, N, K);
	return cudaGetLastError();
}

/* Any M: passes of 8 rows (at most 65535 a launch), then the rest. */
extern "C" cudaError_t HI3K(gemv_rows)(cudaStream_t s, float *y, const float *x, const void *w, int dtype, int M,
                                       int N, int K)
{
	if (M < 0 || (dtype != HI3K_F32 && dtype != HI3K_BF16))
		return cudaErrorInvalidValue;
	while (M > HI3K_GEMV_MAX_M) {
		const int p = M / HI3K_GEMV_MAX_M < 65535 ? M / HI3K_GEMV_MAX_M : 65535;
		const cudaError_t e = launch<HI3K_GEMV_MAX_M>(s, y, x, w, dtype, N, K, (unsigned)p);
		if (e != cudaSuccess)
			return e;
		y += (size_t)p * HI3K_GEMV_MAX_M * (size_t)N;
		x += (size_t)p * HI3K_GEMV_MAX_M * (size_t)K;
		M -= p * HI3K_GEMV_MAX_M;
	}
	return HI3K(gemv)(s, y, x, w, dtype, M, N, K);
}

extern "C" cudaError_t HI3K(gemv)(cudaStream_t s, float *y, const float *x, const void *w, int dtype, int M, int N,
                                  int K)
{
	if (M < 0 || M > HI3K_GEMV_MAX_M || (dtype != HI3K_F32 && dtype != HI3K_BF16))
		return cudaErrorInvalidValue;
	switch (M) {
	case 0: return cudaGetLastError();
	case 1: return launch<1>(s, y, x, w, dtype, N, K);
	case 2: return launch<2>(s, y, x, w, dtype, N, K);
	case 3: return launch<3>(s, y, x, w, dtype, N, K);
	case 4: return launch<4>(s, y, x, w, dtype, N, K);
	case 5: return launch<5>(s, y, x, w, dtype, N, K);
	case 6: return launch<6>(s, y, x, w, dtype, N, K);
	case 7: return launch<7>(s, y, x, w, dtype, N, K);
	default: return launch<8>(s, y, x, w, dtype, N, K);
	}
}
