/*
 * qgemv.cu -- the matmul over a weight-only quantized W (N, K): y (M, N) =
 * x (M, K) . W^T for any M (CPU twin: hi3i_gemm over a quantized hi3_wmat,
 * backend/gemm.c). W stays on the device as the checkpoint stores it (fp8
 * or int8 codes with their row or tensor scales; nf4 nibbles with absmax
 * blocks, nested or not; nvfp4 nibbles with e4m3 block scales and a global
 * scale); each weight is dequantized in registers by the formulas of
 * core/qvalue.h, the ones the CPU uses, so it is the CPU's f32 value
 * bit for bit; x stays f32 (weight-only: activations are not quantized).
 *
 * One warp per output column n, as in gemv.cu: lane l takes k = l, l + 32,
 * ... in order, multiplies the weight with the matching element of each
 * of up to 8 rows of x, and the warp sums its lanes at the end (the same
 * butterfly for every row). More rows are taken 8 at a time, each pass
 * the same arithmetic: the sum of a row is the same sequence of
 * operations whatever M and wherever the row sits in the batch, so a row
 * alone and batched give the same bits (the batching contract; cuBLAS,
 * which the F32/BF16 path uses above 8 rows, promises no such thing).
 */
#include "common.cuh"
#include "core/qvalue.h"

#define QGEMV_WARPS 8
#define QGEMV_ROWS 8              /* rows of x per pass over a column */

/* A scale of dtype dt (HI3Q_*), element i. */
static __device__ __forceinline__ float qscale(const void *p, int dt, size_t i)
{
	switch (dt) {
	case HI3Q_BF16: return bf16_to_f32(static_cast<const uint16_t *>(p)[i]);
	case HI3Q_F16: return hi3q_f16_to_f32(static_cast<const uint16_t *>(p)[i]);
	case HI3Q_E4M3: return hi3q_e4m3(static_cast<const uint8_t *>(p)[i]);
	default: return static_cast<const float *>(p)[i];
	}
}

/* W[n, k] in f32: hi3i_qweight_at's value (backend/quant.h). */
static __device__ __forceinline__ float qval(const hi3k_qmat *q, int n, int k)
{
	const size_t K = (size_t)q->K;

	switch (q->format) {
	case HI3K_Q_FP8: {
		const float s = qscale(q->scale, q->scale_dtype, q->per_row ? (size_t)n : 0);
		return hi3q_round(hi3q_e4m3(q->codes[(size_t)n * K + (size_t)k]) * s, q->round_to);
	}
	case HI3K_Q_INT8:
		return hi3q_int8(static_cast<int8_t>(q->codes[(size_t)n * K + (size_t)k]),
		                 static_cast<const float *>(q->scale)[n]);
	case HI3K_Q_NF4: {
		const uint64_t i = (uint64_t)n * K + (uint64_t)k, b = i / (uint64_t)q->block;
		const float a = q->nested ? hi3q_nested_absmax(q->nested_map[static_cast<const uint8_t *>(q->scale)[b]],
		                                               q->nested_absmax[b / (uint64_t)q->nested_block], q->offset)
		                          : static_cast<const float *>(q->scale)[b];
		return hi3q_round(q->map[hi3q_nf4_code(q->codes, i)] * a, q->round_to);
	}
	default: {                /* HI3K_Q_NVFP4 */
		const size_t nb = K / (size_t)q->block;
		const uint8_t e = static_cast<const uint8_t *>(q->scale)[(size_t)n * nb + (size_t)(k / q->block)];
		const float s = hi3q_e4m3(e) * q->scale2;
		return hi3q_e2m1(hi3q_nvfp4_code(q->codes + (size_t)n * (K / 2), k)) * s;
	}
	}
}

/* Column n of rows [0, R) of y (row stride N) by one warp. */
template <int R>
static __device__ __forceinline__ void qcolumn(float *y, const float *x, const hi3k_qmat *q, int n, int N, int K)
{
	const int lane = threadIdx.x & 31;
	float acc[R];

#pragma unroll
	for (int m = 0; m < R; m++)
		acc[m] = 0.0f;
	for (int k = lane; k < K; k += 32) {
		const float w = qval(q, n, k);
#pragma unroll
		for (int m = 0; m < R; m++)
			acc[m] += w * x[(size_t)m * (size_t)K + (size_t)k];
	}
#pragma unroll
	for (int m = 0; m < R; m++) {
		const float s = warp_sum(acc[m]);
		if (lane == 0)
			y[(size_t)m * (size_t)N + (size_t)n] = s;
	}
}

/* Column n of all M rows, QGEMV_ROWS at a time from row m0, step rows apart. */
static __device__ __forceinline__ void qrows(float *y, const float *x, const hi3k_qmat *q, int M, int n, int N, int K,
                                             int m0, int step)
{
	for (; m0 < M; m0 += step) {
		float *yr = y + (size_t)m0 * (size_t)N;
		const float *xr = x + (size_t)m0 * (size_t)K;
		switch (M - m0 < QGEMV_ROWS ? M - m0 : QGEMV_ROWS) {
		case 1: qcolumn<1>(yr, xr, q, n, N, K); break;
		case 2: qcolumn<2>(yr, xr, q, n, N, K); break;
		case 3: qcolumn<3>(yr, xr, q, n, N, K); break;
		case 4: qcolumn<4>(yr, xr, q, n, N, K); break;
		case 5: qcolumn<5>(yr, xr, q, n, N, K); break;
		case 6: qcolumn<6>(yr, xr, q, n, N, K); break;
		case 7: qcolumn<7>(yr, xr, q, n, N, K); break;
		default: qcolumn<8>(yr, xr, q, n, N, K); break;
		}
	}
}

/* grid (N / QGEMV_WARPS, row passes), block 32 QGEMV_WARPS */
static __global__ void __launch_bounds__(QGEMV_WARPS * 32)
qgemv_kernel(float *y, const float *x, const hi3k_qmat *q, int M, int N, int K)
{
	const int n = blockIdx.x * QGEMV_WARPS + (threadIdx.x >> 5);

	if (n < N)                /* a whole warp either way: no barrier inside */
		qrows(y, x, q, M, n, N, K, blockIdx.y * QGEMV_ROWS, gridDim.y * QGEMV_ROWS);
}

/* grid (max N / QGEMV_WARPS, n_jobs): job blockIdx.y, qgemv_kernel's arithmetic */
static __global__ void __launch_bounds__(QGEMV_WARPS * 32) qgemv_group_kernel(const hi3k_gemv_job *jobs)
{
	const hi3k_gemv_job j = jobs[blockIdx.y];
	const int n = blockIdx.x * QGEMV_WARPS + (threadIdx.x >> 5);

	if (n < j.N)
		qrows(j.y, j.x, static_cast<const hi3k_qmat *>(j.w), j.M, n, j.N, j.K, 0, QGEMV_ROWS);
}

extern "C" cudaError_t HI3K(qgemv)(cudaStream_t s, float *y, const float *x, const hi3k_qmat *q, int M, int N, int K)
{
	const size_t passes = div_up((size_t)(M > 0 ? M : 0), QGEMV_ROWS);

	if (M < 0 || N < 0 || K < 0)
		return cudaErrorInvalidValue;
	if (M > 0 && N > 0)
		HI3K_LAUNCH(qgemv_kernel, dim3(div_up((size_t)N, QGEMV_WARPS), passes < 65535 ? (unsigned)passes : 65535u),
		            dim3(QGEMV_WARPS * 32), 0, s)(y, x, q, M, N, K);
	return cudaGetLastError();
}

extern "C" cudaError_t HI3K(qgemv_group)(cudaStream_t s, const hi3k_gemv_job *jobs, int n_jobs, int max_N)
{
	if (n_jobs < 0 || n_jobs > 65535)
		return cudaErrorInvalidValue;
	if (n_jobs > 0 && max_N > 0)
		HI3K_LAUNCH(qgemv_group_kernel, dim3(div_up((size_t)max_N, QGEMV_WARPS), n_jobs), dim3(QGEMV_WARPS * 32), 0,
		            s)(jobs);
	return cudaGetLastError();
}
