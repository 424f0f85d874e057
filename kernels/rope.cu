/* rope.cu -- RoPE with precomputed frequencies and the 2-D (y, x) rule,
 * then the per-head RMSNorm of use_qk_norm (CPU twin: cpu_rope_qk).
 *
 * Element i < d/2 of a head turns by pos.y * theta[i] when i is even and
 * pos.x * theta[i] when i is odd; element i + d/2 pairs with it:
 *   h[i] = a cos - b sin,  h[i + d/2] = b cos + a sin   (a = h[i], b = h[i + d/2]).
 */
#include "common.cuh"

/* grid (M, n_kv (g + 1)): one head per block, the g query heads of kv
 * head j then its key head; block: one thread per pair (i, i + d/2). */
static __global__ void rope_qk_kernel(float *qkv, const int32_t *pos, const float *theta, const float *qn,
                                      const float *kn, int n_kv, int g, int d, float eps)
{
	const int m = blockIdx.x, j = blockIdx.y / (g + 1), h = blockIdx.y % (g + 1), half = d / 2;
	const int i = threadIdx.x;
	const size_t W = (size_t)n_kv * (size_t)(g + 2) * (size_t)d;
	float *hp = qkv + (size_t)m * W + ((size_t)j * (size_t)(g + 2) + (size_t)h) * (size_t)d;
	float a = 0.0f, b = 0.0f;

	if (i < half) {
		float ang = (float)pos[2 * m + (i & 1)] * theta[i];
		float cs = cosf(ang), sn = sinf(ang), x0 = hp[i], x1 = hp[i + half];
		a = x0 * cs - x1 * sn;
		b = x1 * cs + x0 * sn;
	}
	if (qn) {                 /* the same for the whole block */
		const float *w = h < g ? qn : kn;
		float r = 1.0f / sqrtf(block_sum(a * a + b * b) / (float)d + eps);
		if (i < half) {
			a = w[i] * (a * r);
			b = w[i + half] * (b * r);
		}
	}
	if (i < half) {
		hp[i] = a;
		hp[i + half] = b;
	}
}

extern "C" cudaError_t HI3K(rope_qk)(cudaStream_t s, float *qkv, const int32_t *pos, const float *theta,
                                     const float *qn, const float *kn, int n_kv, int g, int d, float eps, int M)
{
	unsigned threads = div_up((size_t)(d / 2), 32) * 32;

	if (d % 2 || d > HI3K_MAX_D)
		return cudaErrorInvalidValue;
	if (M > 0)
		HI3K_LAUNCH(rope_qk_kernel, dim3(M, n_kv * (g + 1)), dim3(threads), 0, s)(qkv, pos, theta, qn, kn,
		                                                                          n_kv, g, d, eps);
	return cudaGetLastError();
}
