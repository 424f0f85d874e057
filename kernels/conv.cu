/* conv.cu -- the data movement of the image ops: im2col for the conv op
 * as a GEMM (lib/backend/cuda.c cu_conv; CPU twin: the direct convolution
 * of lib/backend/cpu-conv.c), the channel repeat and group mean of the
 * VAE's DCAE shortcuts, and the depth/space shuffles (CPU twins:
 * hi3i_cpu_add_repeat, hi3i_cpu_add_group_mean, hi3i_cpu_depth_to_space /
 * space_to_depth in lib/backend/cpu-image.c). Grid-stride loops over the
 * output elements; every one is written. */
#include "common.cuh"

/* element i of col (n, K): row i / K, column (c, tap) as the weight
 * [Cout, C, kt, kh, kw] is stored, tap (dt, dy, dx) */
static __global__ void im2col_kernel(float *col, const float *x, int T, int H, int W, int C, int kt, int kh, int kw,
                                     int64_t p0, size_t total)
{
	const int taps = kt * kh * kw;
	const size_t K = (size_t)C * (size_t)taps;

	GRID_STRIDE(i, total) {
		const int64_t q = p0 + (int64_t)(i / K);
		const int k = (int)(i % K), c = k / taps, tap = k % taps;
		const int dx = tap % kw, dy = tap / kw % kh, dt = tap / (kw * kh);
		const int xo = (int)(q % W), yo = (int)(q / W % H), to = (int)(q / ((int64_t)W * H) % T);
		const int64_t b = q / ((int64_t)W * H * T);
		const int t = to + dt - kt / 2, y = yo + dy - kh / 2, xx = xo + dx - kw / 2;

		col[i] = t < 0 || t >= T || y < 0 || y >= H || xx < 0 || xx >= W
		                 ? 0.0f
		                 : x[(((b * T + t) * H + y) * W + xx) * (int64_t)C + c];
	}
}

extern "C" cudaError_t HI3K(im2col)(cudaStream_t s, float *col, const float *x, int B, int T, int H, int W, int C,
                                    int kt, int kh, int kw, int64_t p0, int n)
{
	const size_t total = (size_t)n * (size_t)C * (size_t)(kt * kh * kw);

	(void)B;
	if (total)
		HI3K_LAUNCH(im2col_kernel, dim3(gs_grid(total)), dim3(HI3K_GS_BLOCK), 0, s)(col, x, T, H, W, C, kt, kh, kw,
		                                                                             p0, total);
	return cudaGetLastError();
}

static __global__ void add_repeat_kernel(float *x, const float *z, int C, int r, size_t total)
{
	const int Cz = C / r;

	GRID_STRIDE(i, total) {
		const size_t p = i / (size_t)C;
		const int c = (int)(i % (size_t)C);
		x[i] += z[p * (size_t)Cz + (size_t)(c / r)];
	}
}

extern "C" cudaError_t HI3K(add_repeat)(cudaStream_t s, float *x, const float *z, int64_t P, int C, int r)
{
	const size_t total = (size_t)P * (size_t)C;

	if (total)
		HI3K_LAUNCH(add_repeat_kernel, dim3(gs_grid(total)), dim3(HI3K_GS_BLOCK), 0, s)(x, z, C, r, total);
	return cudaGetLastError();
}

/* the r channels of a group summed in order, then divided by r */
static __global__ void add_group_mean_kernel(float *x, const float *z, int r, size_t total)
{
	GRID_STRIDE(i, total) {
		const float *g = z + i * (size_t)r;
		float sum = 0.0f;
		for (int j = 0; j < r; j++)
			sum += g[j];
		x[i] += sum / (float)r;
	}
}

extern "C" cudaError_t HI3K(add_group_mean)(cudaStream_t s, float *x, const float *z, int64_t P, int C, int r)
{
	const size_t total = (size_t)P * (size_t)C;

	if (total)
		HI3K_LAUNCH(add_group_mean_kernel, dim3(gs_grid(total)), dim3(HI3K_GS_BLOCK), 0, s)(x, z, r, total);
	return cudaGetLastError();
}

/* element i of the low side (B, T, H, W, rt 4 C): channel ((r1 2 + r2) 2 +
 * r3) C + c of position (b, t, y, x) is (b, t rt + r1, 2y + r2, 2x + r3, c)
 * of the high side */
static __global__ void shuffle_kernel(float *hi, float *lo, int T, int H, int W, int C, int rt, int to_hi, size_t total)
{
	const int Cl = rt * 4 * C;

	GRID_STRIDE(i, total) {
		const int64_t q = (int64_t)(i / (size_t)Cl);
		const int ch = (int)(i % (size_t)Cl), c = ch % C, sub = ch / C;
		const int r3 = sub & 1, r2 = (sub >> 1) & 1, r1 = sub >> 2;
		const int xo = (int)(q % W), yo = (int)(q / W % H), t = (int)(q / ((int64_t)W * H) % T);
		const int64_t b = q / ((int64_t)W * H * T);
		const int64_t j = (((b * T * rt + (int64_t)t * rt + r1) * 2 * H + 2 * yo + r2) * 2 * W + 2 * xo + r3) * C + c;

		if (to_hi)
			hi[j] = lo[i];
		else
			lo[i] = hi[j];
	}
}

extern "C" cudaError_t HI3K(shuffle)(cudaStream_t s, float *hi, float *lo, int B, int T, int H, int W, int C, int rt,
                                     int to_hi)
{
	const size_t total = (size_t)B * T * H * W * (size_t)(rt * 4 * C);

	if (total)
		HI3K_LAUNCH(shuffle_kernel, dim3(gs_grid(total)), dim3(HI3K_GS_BLOCK), 0, s)(hi, lo, T, H, W, C, rt, to_hi,
		                                                                             total);
	return cudaGetLastError();
}
