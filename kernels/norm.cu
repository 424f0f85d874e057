/* norm.cu -- GroupNorm over channel groups of images and LayerNorm of
 * rows, fp32 (CPU twins: hi3i_cpu_groupnorm, hi3i_cpu_layernorm in
 * lib/backend/cpu-image.c). RMSNorm is in rmsnorm.cu. */
#include "common.cuh"

/* grid (B G nch), block 256: the sum over chunk j of group g of image b,
 * of x (pass 0) or (x - mean)^2 (pass 1) */
static __global__ void gn_part_kernel(float *part, const float *x, const float *mean, int64_t P, int C, int G,
                                      int chunk, int nch, int pass)
{
	const int64_t q = blockIdx.x, bg = q / nch, j = q % nch;
	const int bi = (int)(bg / G), g = (int)(bg % G), cg = C / G;
	const int64_t p0 = j * chunk, p1 = p0 + chunk < P ? p0 + chunk : P;
	const float *xb = x + (int64_t)bi * P * C + (int64_t)g * cg;
	const float m = pass ? mean[bg] : 0.0f;
	const int64_t n = (p1 - p0) * cg;
	float s = 0.0f;

	for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
		float v = xb[(p0 + i / cg) * C + i % cg];
		s += pass ? (v - m) * (v - m) : v;
	}
	s = block_sum(s);
	if (threadIdx.x == 0)
		part[q] = s;
}

/* one thread per (image, group): the chunks in order, then the mean or
 * the reciprocal standard deviation */
static __global__ void gn_stat_kernel(float *stat, const float *part, int nch, int BG, float cnt, float eps, int pass)
{
	const int bg = blockIdx.x * blockDim.x + threadIdx.x;
	float s = 0.0f;

	if (bg >= BG)
		return;
	for (int j = 0; j < nch; j++)
		s += part[(int64_t)bg * nch + j];
	stat[bg] = pass ? 1.0f / sqrtf(s / cnt + eps) : s / cnt;
}

static __global__ void gn_apply_kernel(float *y, const float *x, const float *w, const float *b, const float *mean,
                                       const float *rstd, int64_t P, int C, int G, int act, size_t total)
{
	const int cg = C / G;

	GRID_STRIDE(i, total) {
		const int c = (int)(i % (size_t)C);
		const int64_t bg = (int64_t)(i / ((size_t)P * C)) * G + c / cg;
		y[i] = act_f((x[i] - mean[bg]) * rstd[bg] * w[c] + b[c], act);
	}
}

extern "C" cudaError_t HI3K(groupnorm)(cudaStream_t s, float *y, const float *x, const float *w, const float *b, int B,
                                       int64_t P, int C, int G, float eps, int act, int chunk, float *part)
{
	const int nch = (int)((P + chunk - 1) / chunk), BG = B * G;
	const size_t total = (size_t)B * (size_t)P * (size_t)C;
	float *mean = part + (size_t)BG * nch, *rstd = mean + BG;
	const float cnt = (float)((double)P * (C / G));

	if (!total)
		return cudaGetLastError();
	for (int pass = 0; pass < 2; pass++) {
		HI3K_LAUNCH(gn_part_kernel, dim3((unsigned)(BG * nch)), dim3(256), 0, s)(part, x, mean, P, C, G, chunk, nch,
		                                                                      pass);
		HI3K_LAUNCH(gn_stat_kernel, dim3(div_up((size_t)BG, 64)), dim3(64), 0, s)(pass ? rstd : mean, part, nch, BG,
		                                                                        cnt, eps, pass);
	}
	HI3K_LAUNCH(gn_apply_kernel, dim3(gs_grid(total)), dim3(HI3K_GS_BLOCK), 0, s)(y, x, w, b, mean, rstd, P, C, G, act,
	                                                                           total);
	return cudaGetLastError();
}

/* grid (M), block 256: one row per block; y may equal x (each thread
 * writes only what it read, after both sums) */
static __global__ void layernorm_kernel(float *y, const float *x, const float *w, const float *b, int n, float eps)
{
	const float *xr = x + (size_t)blockIdx.x * (size_t)n;
	float *yr = y + (size_t)blockIdx.x * (size_t)n;
	float s = 0.0f, mean, r;

	for (int i = threadIdx.x; i < n; i += blockDim.x)
		s += xr[i];
	mean = block_sum(s) / (float)n;
	s = 0.0f;
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		s += (xr[i] - mean) * (xr[i] - mean);
	r = 1.0f / sqrtf(block_sum(s) / (float)n + eps);
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		yr[i] = (xr[i] - mean) * r * w[i] + b[i];
}

extern "C" cudaError_t HI3K(layernorm)(cudaStream_t s, float *y, const float *x, const float *w, const float *b, int M,
                                       int n, float eps)
{
	if (M > 0)
		HI3K_LAUNCH(layernorm_kernel, dim3(M), dim3(256), 0, s)(y, x, w, b, n, eps);
	return cudaGetLastError();
}
