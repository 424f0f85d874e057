/*
 * attention.cu -- masked attention in fp32 with an online softmax (CPU
 * twin: cpu_attention). Query m reads row plan[m].row of the key/value
 * sources and admits key j when j <= hi or blk_lo <= j < blk_hi; a query
 * that admits no key outputs zeros.
 *
 * Two kernels, one rule:
 *  - tiled (prefill, replay: keys are the call's own tokens; d a multiple
 *    of 4): a block takes 32 consecutive queries of one query head, and
 *    walks the keys 32 at a time through shared memory, so each key tile
 *    serves 32 queries. Queries of several rows in one block are taken one
 *    row per pass.
 *  - split (decode and any cache read): a block takes one query and the g
 *    query heads of one kv head (one warp each), so each key tile serves g
 *    heads; a long key range is cut into nsplit slices run by separate
 *    blocks (split-K), whose partial (max, sum, weighted values) a last
 *    kernel combines.
 * In both, lane kk of a warp scores key t0 + kk of the tile, and lane i
 * accumulates output elements i, i + 32, ... (DR of them, d <= 32 DR).
 */
#include "common.cuh"

#define TILE 32                   /* keys per tile: one per lane */
#define BQ 32                     /* queries per block of the tiled kernel */
#define TILED_WARPS 4
#define QPW (BQ / TILED_WARPS)    /* queries per warp */

static __device__ __forceinline__ int admits(const hi3k_attn_q &q, int t)
{
	return t <= q.hi || (t >= q.blk_lo && t < q.blk_hi);
}

/* Admitted keys lie in [0, q_end). */
static __device__ __forceinline__ int q_end(const hi3k_attn_q &q)
{
	int e = q.hi + 1 > q.blk_hi ? q.hi + 1 : q.blk_hi;
	return e < 0 ? 0 : e;
}

/* Does q admit a key of [t0, t0 + TILE)? */
static __device__ __forceinline__ int admits_tile(const hi3k_attn_q &q, int t0)
{
	return t0 <= q.hi || (q.blk_lo < q.blk_hi && q.blk_lo < t0 + TILE && q.blk_hi > t0);
}

/* Keys t0 .. t0 + TILE - 1 of (row, kv head j) as f32 into dst (TILE, ld);
 * keys at or past kend read as 0 (they are never admitted). */
static __device__ __forceinline__ void load_tile(float *dst, int ld, const hi3k_src &s, int row, int j, int t0,
                                                 int kend, int d)
{
	const int64_t base = (int64_t)row * s.row_stride + (int64_t)j * s.head_stride;

	for (int e = threadIdx.x; e < TILE * d; e += blockDim.x) {
		int kk = e / d, i = e % d, t = t0 + kk;
		dst[kk * ld + i] = t < kend ? load_elem(s.base, s.dtype, (size_t)(base + (int64_t)t * s.slot_stride + i))
		                            : 0.0f;
	}
}

static __device__ __forceinline__ float dot(const float *a, const float *b, int d)
{
	float s = 0.0f;

#pragma unroll 4
	for (int i = 0; i < d; i++)
		s += a[i] * b[i];
	return s;
}

/* One key tile for one query, by one warp: lane kk holds the score sc of
 * key kk (-inf when not admitted). Updates the running max mx, the sum l
 * of e^(score - mx), and acc[r] (output element lane + 32 r) with the
 * values vt (TILE, d). */
template <int DR>
static __device__ __forceinline__ void softmax_tile(float sc, float &mx, float &l, float (&acc)[DR], const float *vt,
                                                    int d)
{
	const int lane = threadIdx.x & 31;
	float nm = fmaxf(mx, warp_max(sc)), corr, p;

	if (nm == -INFINITY)      /* nothing admitted yet; the same in every lane */
		return;
	corr = expf(mx - nm);     /* 0 on the first admitted tile */
	p = sc == -INFINITY ? 0.0f : expf(sc - nm);
	l = l * corr + warp_sum(p);
	mx = nm;
#pragma unroll
	for (int r = 0; r < DR; r++)
		acc[r] *= corr;
#pragma unroll 4
	for (int kk = 0; kk < TILE; kk++) {
		float pk = __shfl_sync(HI3K_FULL, p, kk);
#pragma unroll
		for (int r = 0; r < DR; r++) {
			int i = lane + 32 * r;
			if (i < d)
				acc[r] += pk * vt[kk * d + i];
		}
	}
}

/* grid (M / BQ, n_h), block 128, d a multiple of 4, dynamic shared memory
 * (BQ d + TILE (d + 4) + TILE d + BQ TILE) floats.
 *
 * Each warp owns 8 queries. Scores: lane kk holds key kk of the tile and
 * walks d four elements at a time, one 16-byte load of its key serving the
 * 8 queries (broadcast loads); key rows are padded to d + 4 floats so the
 * lanes' 16-byte loads fall in distinct banks. Values: the 8 queries'
 * probabilities go through shared memory (ps), and each value element a
 * lane loads serves the 8 queries. */
template <int DR>
static __global__ void __launch_bounds__(TILED_WARPS * 32)
attn_tiled_kernel(float *out, const float *qkv, hi3k_src ks, hi3k_src vs, const hi3k_attn_q *plan, int n_kv, int g,
                  int d, int M)
{
	HI3K_DYN_SMEM(float, sm);
	float *qs = sm;                          /* (BQ, d) the block's queries */
	float *kt = qs + BQ * d;                 /* (TILE, d + 4) */
	float *vt = kt + TILE * (d + 4);         /* (TILE, d) */
	float *ps = vt + TILE * d;               /* (BQ, TILE) probabilities of the tile */
	__shared__ hi3k_attn_q pl[BQ];
	__shared__ int active[BQ], done[BQ];
	__shared__ int pass_any, pass_row, pass_kend;
	const int q0 = blockIdx.x * BQ, h = blockIdx.y, j = h / g, n_h = n_kv * g;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, d4 = d / 4;
	const int nq = M - q0 < BQ ? M - q0 : BQ;
	const size_t W = (size_t)n_kv * (size_t)(g + 2) * (size_t)d;
	const size_t qoff = ((size_t)j * (size_t)(g + 2) + (size_t)(h % g)) * (size_t)d;
	const float scale = 1.0f / sqrtf((float)d);
	const float4 *q4 = reinterpret_cast<const float4 *>(qs + warp * QPW * d);
	const float4 *k4 = reinterpret_cast<const float4 *>(kt + lane * (d + 4));

	if (threadIdx.x < BQ) {
		if ((int)threadIdx.x < nq)
			pl[threadIdx.x] = plan[q0 + threadIdx.x];
		done[threadIdx.x] = (int)threadIdx.x >= nq;
	}
	for (int e = threadIdx.x; e < BQ * d; e += blockDim.x) {
		int q = e / d, i = e % d;
		qs[e] = q < nq ? qkv[(size_t)(q0 + q) * W + qoff + (size_t)i] : 0.0f;
	}
	for (;;) {
		__syncthreads();
		if (threadIdx.x == 0) {      /* this pass: the queries of the first row not done */
			int row = -1, kend = 0, any = 0;
			for (int q = 0; q < BQ; q++)
				if (!done[q]) {
					row = pl[q].row;
					any = 1;
					break;
				}
			for (int q = 0; q < BQ; q++) {
				active[q] = any && !done[q] && pl[q].row == row;
				if (active[q] && q_end(pl[q]) > kend)
					kend = q_end(pl[q]);
			}
			pass_any = any;
			pass_row = row;
			pass_kend = kend;
		}
		__syncthreads();
		if (!pass_any)
			break;
		const int row = pass_row, kend = pass_kend;
		float mx[QPW], l[QPW], acc[QPW][DR];

#pragma unroll
		for (int qq = 0; qq < QPW; qq++) {
			mx[qq] = -INFINITY;
			l[qq] = 0.0f;
#pragma unroll
			for (int r = 0; r < DR; r++)
				acc[qq][r] = 0.0f;
		}
		for (int t0 = 0; t0 < kend; t0 += TILE) {
			int use = threadIdx.x < BQ && active[threadIdx.x] && admits_tile(pl[threadIdx.x], t0);
			float s[QPW];
			/* a barrier too: the last tile is read before this one is loaded */
			if (!__syncthreads_or(use))
				continue;
			load_tile(kt, d + 4, ks, row, j, t0, kend, d);
			load_tile(vt, d, vs, row, j, t0, kend, d);
			__syncthreads();
			/* scores of the warp's 8 queries against key t0 + lane */
#pragma unroll
			for (int qq = 0; qq < QPW; qq++)
				s[qq] = 0.0f;
			for (int i4 = 0; i4 < d4; i4++) {
				const float4 kv = k4[i4];
#pragma unroll
				for (int qq = 0; qq < QPW; qq++) {
					const float4 qv = q4[qq * d4 + i4];
					s[qq] += qv.x * kv.x;
					s[qq] += qv.y * kv.y;
					s[qq] += qv.z * kv.z;
					s[qq] += qv.w * kv.w;
				}
			}
			/* online softmax per query; probabilities to ps */
#pragma unroll
			for (int qq = 0; qq < QPW; qq++) {
				const int q = warp * QPW + qq, t = t0 + lane;
				float p = 0.0f;
				if (active[q]) {  /* the same in the whole warp */
					float sc = t < kend && admits(pl[q], t) ? s[qq] * scale : -INFINITY;
					float nm = fmaxf(mx[qq], warp_max(sc));
					if (nm != -INFINITY) {
						float corr = expf(mx[qq] - nm);
						p = sc == -INFINITY ? 0.0f : expf(sc - nm);
						l[qq] = l[qq] * corr + warp_sum(p);
						mx[qq] = nm;
#pragma unroll
						for (int r = 0; r < DR; r++)
							acc[qq][r] *= corr;
					}
				}
				ps[q * TILE + lane] = p;
			}
			__syncwarp();
			/* acc[q][r] += sum over the tile's keys of p[q][kk] v[kk][lane + 32 r] */
			for (int kk4 = 0; kk4 < TILE / 4; kk4++) {
				float4 p4[QPW];
#pragma unroll
				for (int qq = 0; qq < QPW; qq++)
					p4[qq] = reinterpret_cast<const float4 *>(ps + (warp * QPW + qq) * TILE)[kk4];
#pragma unroll
				for (int c = 0; c < 4; c++) {
					const float *vrow = vt + (kk4 * 4 + c) * d;
#pragma unroll
					for (int r = 0; r < DR; r++) {
						const int i = lane + 32 * r;
						const float v = i < d ? vrow[i] : 0.0f;
#pragma unroll
						for (int qq = 0; qq < QPW; qq++) {
							const float pk = c == 0 ? p4[qq].x : c == 1 ? p4[qq].y : c == 2 ? p4[qq].z : p4[qq].w;
							acc[qq][r] += pk * v;
						}
					}
				}
			}
		}
#pragma unroll
		for (int qq = 0; qq < QPW; qq++) {
			const int q = warp * QPW + qq;
			if (!active[q])
				continue;
			float *o = out + (size_t)(q0 + q) * (size_t)n_h * (size_t)d + (size_t)h * (size_t)d;
#pragma unroll
			for (int r = 0; r < DR; r++) {
				int i = lane + 32 * r;
				if (i < d)
					o[i] = l[qq] > 0.0f ? acc[qq][r] / l[qq] : 0.0f;
			}
		}
		__syncthreads();
		if (threadIdx.x < BQ && active[threadIdx.x])
			done[threadIdx.x] = 1;
	}
}

/* grid (M, n_kv, nsplit), block 32 g, dynamic shared memory
 * (g d + TILE (d + 1) + TILE d) floats. Slice sp of query m's keys
 * [0, end) is [sp c, (sp + 1) c), c = end / nsplit rounded up to a tile.
 * With nsplit > 1 it writes part (M, n_h, nsplit, d + 2): the weighted
 * values, then the max and the sum. */
template <int DR>
static __global__ void attn_split_kernel(float *out, float *part, const float *qkv, hi3k_src ks, hi3k_src vs,
                                         const hi3k_attn_q *plan, int n_kv, int g, int d, int nsplit)
{
	HI3K_DYN_SMEM(float, sm);
	float *qs = sm;                          /* (g, d) */
	float *kt = qs + g * d;                  /* (TILE, d + 1) */
	float *vt = kt + TILE * (d + 1);         /* (TILE, d) */
	const int m = blockIdx.x, j = blockIdx.y, sp = blockIdx.z, n_h = n_kv * g;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, h = j * g + warp;
	const hi3k_attn_q pq = plan[m];
	const int end = q_end(pq);
	const int chunk = ((end + nsplit - 1) / nsplit + TILE - 1) / TILE * TILE;
	const int k_lo = sp * chunk, k_hi = end < k_lo + chunk ? end : k_lo + chunk;
	const size_t W = (size_t)n_kv * (size_t)(g + 2) * (size_t)d;
	const float scale = 1.0f / sqrtf((float)d);
	float mx = -INFINITY, l = 0.0f, acc[DR];

#pragma unroll
	for (int r = 0; r < DR; r++)
		acc[r] = 0.0f;
	for (int e = threadIdx.x; e < g * d; e += blockDim.x)
		qs[e] = qkv[(size_t)m * W + ((size_t)j * (size_t)(g + 2) + (size_t)(e / d)) * (size_t)d + (size_t)(e % d)];
	for (int t0 = k_lo; t0 < k_hi; t0 += TILE) {
		if (!admits_tile(pq, t0))    /* the same for the whole block */
			continue;
		__syncthreads();             /* queries stored; the last tile is read */
		load_tile(kt, d + 1, ks, pq.row, j, t0, k_hi, d);
		load_tile(vt, d, vs, pq.row, j, t0, k_hi, d);
		__syncthreads();
		const int t = t0 + lane;
		float sc = t < k_hi && admits(pq, t) ? dot(qs + warp * d, kt + lane * (d + 1), d) * scale : -INFINITY;
		softmax_tile<DR>(sc, mx, l, acc, vt, d);
	}
	if (nsplit == 1) {
		float *o = out + (size_t)m * (size_t)n_h * (size_t)d + (size_t)h * (size_t)d;
#pragma unroll
		for (int r = 0; r < DR; r++) {
			int i = lane + 32 * r;
			if (i < d)
				o[i] = l > 0.0f ? acc[r] / l : 0.0f;
		}
		return;
	}
	float *pp = part + (((size_t)m * (size_t)n_h + (size_t)h) * (size_t)nsplit + (size_t)sp) * (size_t)(d + 2);
#pragma unroll
	for (int r = 0; r < DR; r++) {
		int i = lane + 32 * r;
		if (i < d)
			pp[i] = acc[r];
	}
	if (lane == 0) {
		pp[d] = mx;
		pp[d + 1] = l;
	}
}

/* grid (M, n_h), block 128: out = sum_s e^(mx_s - max) acc_s / sum_s e^(mx_s - max) l_s
 * over the slices that admitted a key; zeros when none did. */
static __global__ void attn_combine_kernel(float *out, const float *part, int n_h, int d, int nsplit)
{
	const size_t mh = (size_t)blockIdx.x * (size_t)n_h + blockIdx.y;
	const float *pp = part + mh * (size_t)nsplit * (size_t)(d + 2);
	float gm = -INFINITY, den = 0.0f;

	for (int s = 0; s < nsplit; s++)
		if (pp[(size_t)s * (d + 2) + d + 1] > 0.0f)
			gm = fmaxf(gm, pp[(size_t)s * (d + 2) + d]);
	for (int s = 0; s < nsplit; s++) {
		const float *ps = pp + (size_t)s * (d + 2);
		if (ps[d + 1] > 0.0f)
			den += ps[d + 1] * expf(ps[d] - gm);
	}
	for (int i = threadIdx.x; i < d; i += blockDim.x) {
		float num = 0.0f;
		for (int s = 0; s < nsplit; s++) {
			const float *ps = pp + (size_t)s * (d + 2);
			if (ps[d + 1] > 0.0f)
				num += ps[i] * expf(ps[d] - gm);
		}
		out[mh * (size_t)d + (size_t)i] = den > 0.0f ? num / den : 0.0f;
	}
}

template <int DR>
static cudaError_t launch(cudaStream_t s, float *out, const float *qkv, const hi3k_src *k, const hi3k_src *v,
                          const hi3k_attn_q *q, int n_kv, int g, int d, int M, int self, int nsplit, float *part)
{
	cudaError_t e;
	size_t smem;

	if (self && d % 4 == 0) {
		smem = (size_t)(BQ * d + TILE * (d + 4) + TILE * d + BQ * TILE) * sizeof(float);
		if (smem > 48 * 1024 &&
		    (e = cudaFuncSetAttribute(attn_tiled_kernel<DR>, cudaFuncAttributeMaxDynamicSharedMemorySize,
		                              (int)smem)) != cudaSuccess)
			return e;
		HI3K_LAUNCH(attn_tiled_kernel<DR>, dim3(div_up((size_t)M, BQ), n_kv * g), dim3(TILED_WARPS * 32), smem,
		            s)(out, qkv, *k, *v, q, n_kv, g, d, M);
		return cudaGetLastError();
	}
	smem = (size_t)(g * d + TILE * (d + 1) + TILE * d) * sizeof(float);
	if (smem > 48 * 1024 &&
	    (e = cudaFuncSetAttribute(attn_split_kernel<DR>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)) !=
	        cudaSuccess)
		return e;
	HI3K_LAUNCH(attn_split_kernel<DR>, dim3(M, n_kv, nsplit), dim3(32 * g), smem, s)(out, part, qkv, *k, *v, q,
	                                                                               n_kv, g, d, nsplit);
	e = cudaGetLastError();
	if (nsplit == 1 || e != cudaSuccess)
		return e;
	HI3K_LAUNCH(attn_combine_kernel, dim3(M, n_kv * g), dim3(128), 0, s)(out, part, n_kv * g, d, nsplit);
	return cudaGetLastError();
}

extern "C" cudaError_t HI3K(attention)(cudaStream_t s, float *out, const float *qkv, const hi3k_src *k,
                                       const hi3k_src *v, const hi3k_attn_q *q, int n_kv, int g, int d, int M,
                                       int self, int nsplit, float *part)
{
	if (M <= 0)
		return cudaGetLastError();
	if (d < 1 || d > HI3K_MAX_D || g < 1 || g > 32 || nsplit < 1 || nsplit > 65535)
		return cudaErrorInvalidValue;
	if (d <= 32)
		return launch<1>(s, out, qkv, k, v, q, n_kv, g, d, M, self, nsplit, part);
	if (d <= 64)
		return launch<2>(s, out, qkv, k, v, q, n_kv, g, d, M, self, nsplit, part);
	if (d <= 128)
		return launch<4>(s, out, qkv, k, v, q, n_kv, g, d, M, self, nsplit, part);
	return launch<8>(s, out, qkv, k, v, q, n_kv, g, d, M, self, nsplit, part);
}
