/*
 * sample.cu -- the sampling of lib/stage/sample.c on the GPU: argmax and
 * log-softmax at temperature 1 (hi3_argmax, hi3_logprob), and one draw per
 * row with temperature, top-k, top-p and Philox-4x32-10 keyed by the row's
 * seed at counter = step (hi3_sample, hi3_uniform). Standalone: the backend
 * ops table has no sampling op yet, so decode still samples on the host;
 * these let it keep the logits on the device once it has one.
 *
 * Same answers as the CPU: the same draw (Philox is integer arithmetic),
 * the same candidate order (z = logits / T in double, rounded to float;
 * z descending, ties to the lower id; -0 and +0 tie), and the same
 * sequential double sums over the sorted candidates. Only exp() may differ
 * in the last bit from the C library's, so a token can differ only when the
 * draw falls within rounding of a boundary between two candidates.
 *
 * One block per row. The k best candidates are found by a radix select on
 * a 64-bit key (the float's order bits, then the inverted id), gathered,
 * sorted in shared memory, and walked by one thread as the CPU does; so k
 * is at most HI3K_SAMPLE_MAX_K (1024): top_k = 0 (all V) works only for
 * V <= 1024.
 */
#include "common.cuh"

#define SB 512                    /* threads per row */

/* ---------------------------------------------------------------- Philox */

static __device__ __forceinline__ void philox4x32(uint32_t c[4], uint32_t k0, uint32_t k1)
{
	for (int r = 0; r < 10; r++) {
		uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
		uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k1;
		c[1] = (uint32_t)p1;
		c[3] = (uint32_t)p0;
		c[0] = n0;
		c[2] = n2;
		k0 += 0x9E3779B9u;
		k1 += 0xBB67AE85u;
	}
}

/* hi3_uniform: 53 bits of the first two output words, in [0, 1) */
static __device__ __forceinline__ double uniform(uint64_t seed, uint64_t step)
{
	uint32_t c[4] = {(uint32_t)step, (uint32_t)(step >> 32), 0, 0};

	philox4x32(c, (uint32_t)seed, (uint32_t)(seed >> 32));
	return (double)(((uint64_t)c[0] << 21) ^ (c[1] >> 11)) * (1.0 / 9007199254740992.0);
}

/* ---------------------------------------------------------------- argmax, log-softmax */

/* (v, id) better than (bv, bid) in hi3_argmax's order: larger, ties to the
 * lower id; NaN is never better. */
static __device__ __forceinline__ int better(float v, int64_t id, float bv, int64_t bid)
{
	return v > bv || (v == bv && id < bid);
}

/* The argmax of x (V) over the block, to every thread (hi3_argmax: the
 * first maximum; a NaN at 0 keeps 0, other NaNs never win). */
static __device__ int64_t block_argmax(const float *x, int V, float *best_v)
{
	__shared__ float wv[32];
	__shared__ int64_t wi[32];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	float bv = -INFINITY;
	int64_t bi = INT64_MAX;

	for (int v = threadIdx.x; v < V; v += blockDim.x)
		if (better(x[v], v, bv, bi)) {
			bv = x[v];
			bi = v;
		}
	for (int o = 16; o > 0; o >>= 1) {
		float ov = __shfl_xor_sync(HI3K_FULL, bv, o);
		int64_t oi = __shfl_xor_sync(HI3K_FULL, bi, o);
		if (better(ov, oi, bv, bi)) {
			bv = ov;
			bi = oi;
		}
	}
	if (lane == 0) {
		wv[warp] = bv;
		wi[warp] = bi;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		for (int w = 1; w < nw; w++)
			if (better(wv[w], wi[w], wv[0], wi[0])) {
				wv[0] = wv[w];
				wi[0] = wi[w];
			}
		if (isnan(x[0]) || wi[0] == INT64_MAX) {   /* nothing beats element 0 */
			wv[0] = x[0];
			wi[0] = 0;
		}
	}
	__syncthreads();
	bv = wv[0];
	bi = wi[0];
	__syncthreads();          /* wv, wi free for the next call */
	*best_v = bv;
	return bi;
}

static __device__ double block_sum_f64(double v)
{
	__shared__ double part[32];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	double r;

	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(HI3K_FULL, v, o);
	if (lane == 0)
		part[warp] = v;
	__syncthreads();
	if (threadIdx.x == 0) {
		for (int w = 1; w < nw; w++)
			part[0] += part[w];
	}
	__syncthreads();
	r = part[0];
	__syncthreads();
	return r;
}

/* grid (R), block SB */
static __global__ void __launch_bounds__(SB)
logsoftmax_argmax_kernel(const float *logits, int V, const int64_t *tok, int64_t *argmax, double *logprob)
{
	const float *x = logits + (size_t)blockIdx.x * (size_t)V;
	float mx;
	int64_t am = block_argmax(x, V, &mx), t;
	double sum = 0.0;

	for (int v = threadIdx.x; v < V; v += blockDim.x)
		sum += exp((double)x[v] - (double)mx);
	sum = block_sum_f64(sum);
	if (threadIdx.x == 0) {
		t = tok ? tok[blockIdx.x] : am;
		if (argmax)
			argmax[blockIdx.x] = am;
		if (logprob)
			logprob[blockIdx.x] = (double)x[t] - (double)mx - log(sum);
	}
}

extern "C" cudaError_t HI3K(logsoftmax_argmax)(cudaStream_t s, const float *logits, int R, int V, const int64_t *tok,
                                               int64_t *argmax, double *logprob)
{
	if (V < 1)
		return cudaErrorInvalidValue;
	if (R > 0)
		HI3K_LAUNCH(logsoftmax_argmax_kernel, dim3(R), dim3(SB), 0, s)(logits, V, tok, argmax, logprob);
	return cudaGetLastError();
}

/* ---------------------------------------------------------------- sampling */

/* Candidate order as one unsigned key, larger first: the float's bits
 * mapped to an increasing order (with -0 as +0), then the inverted id. */
static __device__ __forceinline__ uint64_t cand_key(float z, int v)
{
	uint32_t u = __float_as_uint(z == 0.0f ? 0.0f : z);
	uint32_t ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);

	return ((uint64_t)ord << 32) | (uint64_t)(~(uint32_t)v);
}

static __device__ __forceinline__ float key_z(uint64_t key)
{
	uint32_t ord = (uint32_t)(key >> 32);

	return __uint_as_float((ord & 0x80000000u) ? (ord & 0x7fffffffu) : ~ord);
}

/* grid (R), block SB; keys (R, V) scratch */
static __global__ void __launch_bounds__(SB)
sample_kernel(const float *logits, int V, const uint64_t *seed, const uint64_t *step, int greedy, double temperature,
              int k, double top_p, uint64_t *keys, int64_t *tok)
{
	__shared__ uint64_t ck[HI3K_SAMPLE_MAX_K];     /* the candidates, sorted */
	__shared__ double p[HI3K_SAMPLE_MAX_K];
	__shared__ int hist[256];
	__shared__ uint64_t prefix;
	__shared__ int need, n;
	const float *x = logits + (size_t)blockIdx.x * (size_t)V;
	uint64_t *key = keys + (size_t)blockIdx.x * (size_t)V, mask = 0;
	int np2;

	if (greedy || temperature <= 0.0) {
		float bv;
		int64_t am = block_argmax(x, V, &bv);
		if (threadIdx.x == 0)
			tok[blockIdx.x] = am;
		return;
	}
	for (int v = threadIdx.x; v < V; v += blockDim.x)
		key[v] = cand_key((float)((double)x[v] / temperature), v);
	if (threadIdx.x == 0) {
		prefix = 0;
		need = k;
		n = 0;
	}
	/* the k-th largest key, 8 bits at a time from the top (keys are distinct) */
	for (int shift = 56; shift >= 0; shift -= 8) {
		for (int b = threadIdx.x; b < 256; b += blockDim.x)
			hist[b] = 0;
		__syncthreads();
		for (int v = threadIdx.x; v < V; v += blockDim.x)
			if ((key[v] & mask) == prefix)
				atomicAdd(&hist[(key[v] >> shift) & 255], 1);
		__syncthreads();
		if (threadIdx.x == 0) {
			int cum = 0;
			for (int b = 255; b >= 0; b--) {
				if (cum + hist[b] >= need) {
					prefix |= (uint64_t)b << shift;
					need -= cum;
					break;
				}
				cum += hist[b];
			}
		}
		mask |= (uint64_t)255 << shift;
		__syncthreads();
	}
	/* gather the k keys >= it, then sort them, largest first */
	for (int v = threadIdx.x; v < V; v += blockDim.x)
		if (key[v] >= prefix) {
			int pos = atomicAdd(&n, 1);
			if (pos < HI3K_SAMPLE_MAX_K)
				ck[pos] = key[v];
		}
	__syncthreads();
	int nk = n < HI3K_SAMPLE_MAX_K ? n : HI3K_SAMPLE_MAX_K;   /* k: the keys are distinct */
	for (np2 = 1; np2 < nk; np2 <<= 1)
		;
	for (int i = nk + threadIdx.x; i < np2; i += blockDim.x)
		ck[i] = 0;
	__syncthreads();
	for (int size = 2; size <= np2; size <<= 1)
		for (int stride = size >> 1; stride > 0; stride >>= 1) {
			for (int i = threadIdx.x; i < np2; i += blockDim.x) {
				int j = i ^ stride;
				if (j > i) {
					uint64_t a = ck[i], b = ck[j];
					if ((i & size) == 0 ? a < b : a > b) {
						ck[i] = b;
						ck[j] = a;
					}
				}
			}
			__syncthreads();
		}
	/* the CPU's walk over the sorted candidates, by one thread */
	if (threadIdx.x == 0) {
		int m = nk;
		double total = 0.0, acc = 0.0, u, z0 = (double)key_z(ck[0]);
		int64_t pick = (int64_t)(uint32_t)~(uint32_t)ck[m - 1];

		for (int i = 0; i < m; i++) {
			p[i] = exp((double)key_z(ck[i]) - z0);
			total += p[i];
		}
		if (top_p > 0.0 && top_p < 1.0) {
			double mass = 0.0;
			int keep = m;
			for (int i = 0; i < m; i++) {
				mass += p[i] / total;
				if (mass >= top_p) {
					keep = i + 1;
					break;
				}
			}
			m = keep;
			total = 0.0;
			for (int i = 0; i < m; i++)
				total += p[i];
			pick = (int64_t)(uint32_t)~(uint32_t)ck[m - 1];
		}
		u = uniform(seed[blockIdx.x], step[blockIdx.x]) * total;
		for (int i = 0; i < m; i++) {
			acc += p[i];
			if (acc > u) {
				pick = (int64_t)(uint32_t)~(uint32_t)ck[i];
				break;
			}
		}
		tok[blockIdx.x] = pick;
	}
}

extern "C" cudaError_t HI3K(sample)(cudaStream_t s, const float *logits, int R, int V, const uint64_t *seed,
                                    const uint64_t *step, int greedy, double temperature, int top_k, double top_p,
                                    uint64_t *scratch, int64_t *tok)
{
	int k = top_k <= 0 || top_k >= V ? V : top_k;

	if (V < 1 || (!greedy && temperature > 0.0 && k > HI3K_SAMPLE_MAX_K))
		return cudaErrorInvalidValue;
	if (R > 0)
		HI3K_LAUNCH(sample_kernel, dim3(R), dim3(SB), 0, s)(logits, V, seed, step, greedy, temperature, k, top_p,
		                                                    scratch, tok);
	return cudaGetLastError();
}
