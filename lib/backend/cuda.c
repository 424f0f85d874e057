/*
 * cuda.c -- the CUDA backend: the ops table of backend.h on one GPU (the
 * current device: 0, or the one hi3-mpi's NCCL communicator chose for its
 * rank; choose another with CUDA_VISIBLE_DEVICES). The kernels live in
 * kernels/, one .cu file per op family; this file holds the host side:
 * device memory, weights, the KV cache mirror, and one wrapper per op.
 *
 *  - Everything runs in order on one stream. Uploads of small host arrays
 *    go through a pinned ring, so they do not stall the stream; downloads
 *    wait for it.
 *  - Weights are uploaded once, at open, streamed from the mapped checkpoint
 *    in 64 MiB chunks through two pinned buffers: one fills from the mapping
 *    while the other is copied (upload_stream); weights_done waits and -v
 *    reports the rate. BF16 matrices stay BF16 and multiply
 *    through cublasGemmEx with bf16 inputs and fp32 accumulation (the
 *    activations are rounded to bf16 for it); F32 matrices multiply in
 *    plain fp32 (CUBLAS_COMPUTE_32F with the default math mode: no TF32),
 *    the exactness path. F16 and F64 matrices are converted to F32; norm
 *    weights are F32; embedding rows keep F32, BF16 or F16.
 *  - The KV cache lives on the device: kv_attach copies a host cache (the
 *    mmap'd KV file) up, kv_sync_host copies it back, so files stay the
 *    interface. A rank of a tensor-parallel layout mirrors its own kv heads
 *    only, and writes back only those (the other ranks write theirs). kv_store notes, per cache row, the first and last slot it
 *    wrote since the last sync, and the sync copies only those (one gather
 *    kernel, one copy): a decode step moves its new slots, not the cache.
 *  - batch_invariant is not offered: cuBLAS may pick another algorithm, and
 *    attention another split, for another batch size.
 *
 * Errors: the ops return nothing, so a failed CUDA call inside one (a
 * fault, which leaves every later result unusable, or a scratch buffer the
 * device has no room for) is recorded on the backend (hi3i_backend_fail)
 * and the op does nothing more; the model checks after each layer and
 * returns the error. Calls that can report (backend creation, weights, the
 * KV cache) fill hi3_error. HI3_CUDA_SYNC=1 in the environment waits after
 * every op, so a failing kernel is named by its op.
 */
#include "config.h"
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"

#if defined(HI3_HAVE_CUDA) || defined(HI3_CUDA_EMU)

#include "kernels/kernels.h"
#ifndef HI3_CUDA_EMU
#include <dlfcn.h>
#include <cublas_v2.h>

/*
 * cuBLAS is loaded when a CUDA backend is made, not with libhi3: linked, it
 * and the cuBLASLt it needs (some 600 MB of library) cost every hi3
 * process, CPU runs included, about 0.2 s and 220 MB of memory at start
 * (docs/PERFORMANCE.md). These are the entries the backend calls, found
 * by name in libcublas.so.MAJOR of the toolkit it was built with.
 */
static struct cublas_api {
	__typeof__(cublasCreate_v2) *create;
	__typeof__(cublasDestroy_v2) *destroy;
	__typeof__(cublasSetStream_v2) *set_stream;
	__typeof__(cublasSetMathMode) *set_math_mode;
	__typeof__(cublasGemmEx) *gemm_ex;
	__typeof__(cublasGetStatusString) *status_string;
} blas_api;

#define STR_(x) #x
#define STR(x) STR_(x)
#define CUBLAS_SONAME "libcublas.so." STR(CUBLAS_VER_MAJOR)

int hi3i_cublas_load(hi3_error *err)
{
	static void *lib;
	const char *const where[] = {HI3_CUDA_LIBDIR "/" CUBLAS_SONAME, CUBLAS_SONAME};
	struct { void **fn; const char *name; } sym[] = {
		{(void **)&blas_api.create, "cublasCreate_v2"},
		{(void **)&blas_api.destroy, "cublasDestroy_v2"},
		{(void **)&blas_api.set_stream, "cublasSetStream_v2"},
		{(void **)&blas_api.set_math_mode, "cublasSetMathMode"},
		{(void **)&blas_api.gemm_ex, "cublasGemmEx"},
		{(void **)&blas_api.status_string, "cublasGetStatusString"},
	};

	if (lib)
		return 0;
	for (size_t i = 0; i < HI3_ARRAY_SIZE(where) && !lib; i++)
		lib = dlopen(where[i], RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "--backend cuda: cannot load cuBLAS (%s, from %s or the "
		                     "library path): %s", CUBLAS_SONAME, HI3_CUDA_LIBDIR, dlerror());
	for (size_t i = 0; i < HI3_ARRAY_SIZE(sym); i++)
		if (!(*sym[i].fn = dlsym(lib, sym[i].name))) {
			hi3_error_set(err, HI3_ERR_RUNTIME, "--backend cuda: %s has no %s", CUBLAS_SONAME, sym[i].name);
			dlclose(lib);
			lib = NULL;
			return -1;
		}
	return 0;
}

#undef cublasCreate
#undef cublasDestroy
#undef cublasSetStream
#define cublasCreate(...) blas_api.create(__VA_ARGS__)
#define cublasDestroy(...) blas_api.destroy(__VA_ARGS__)
#define cublasSetStream(...) blas_api.set_stream(__VA_ARGS__)
#define cublasSetMathMode(...) blas_api.set_math_mode(__VA_ARGS__)
#define cublasGemmEx(...) blas_api.gemm_ex(__VA_ARGS__)
#define cublasGetStatusString(s) (blas_api.status_string ? blas_api.status_string(s) : "cuBLAS error")
#else
int hi3i_cublas_load(hi3_error *err)
{
	(void)err;
	return 0;         /* the emulator's cuBLAS is linked in */
}
#endif

_Static_assert(sizeof(hi3k_attn_q) == sizeof(hi3_attn_q) && offsetof(hi3k_attn_q, hi) == offsetof(hi3_attn_q, hi) &&
               offsetof(hi3k_attn_q, blk_lo) == offsetof(hi3_attn_q, blk_lo) &&
               offsetof(hi3k_attn_q, blk_hi) == offsetof(hi3_attn_q, blk_hi),
               "hi3k_attn_q must match hi3_attn_q");
_Static_assert((int)HI3K_F32 == (int)HI3_F32 && (int)HI3K_F16 == (int)HI3_F16 && (int)HI3K_BF16 == (int)HI3_BF16,
               "dtype codes");

#define STAGE_BYTES ((size_t)8 << 20)   /* the pinned upload ring */
#define UPLOAD_CHUNK ((size_t)64 << 20) /* weight uploads: each of the two pinned buffers */
#define MIB(x) ((double)(x) / 1048576.0)

/* A host KV cache and the device copy of its heads [h0, h0 + nh). */
struct kv_mirror {
	hi3_kvcache *kv;
	hi3_kvcache shape;        /* kv as attached: its dims must not change */
	int h0, nh;               /* the heads mirrored: all of them, or a tensor-parallel rank's */
	unsigned char *mem;       /* (n_layers, 2, B, nh, C, d): K then V of each layer */
	size_t layer_bytes;       /* one K or V of one layer */
	size_t head_bytes;        /* one head of one row: C d elements */
	size_t total;             /* bytes of mem */
	int32_t *dirty;           /* (B, 2) device: first and last slot written since the last sync */
	int32_t *dirty_h;         /* (B, 2) host */
	void *ranges;             /* device: (B) int64 offsets, then (B, 3) int32 ranges */
	void *pack;               /* device: the gathered slots */
	void *pack_h;             /* host: the same, copied */
	size_t pack_cap, pack_h_cap;
	int pack_h_pinned;
	struct kv_mirror *next;
};

struct cuda {
	hi3_backend *be;          /* the backend this is the state of */
	int n_sm;
	cudaStream_t stream;
	cublasHandle_t blas;
	int sync_each;            /* HI3_CUDA_SYNC: wait after every op */
	unsigned char *stage;     /* pinned, STAGE_BYTES, or NULL */
	size_t stage_pos;
	void *xb;                 /* bf16 GEMM input (M, K) */
	void *keep;               /* kv_store: the last writer of each slot (M) */
	void *part;               /* attention split-K partials (M, n_h, nsplit, d + 2) */
	void *jobs;               /* matmul_group: the grouped gemv's jobs */
	hi3k_gemv_job *jobs_h;    /* ... built here */
	void *gn;                 /* groupnorm: chunk sums and statistics */
	void *sc;                 /* attention_dense: the scores of a block of queries */
	void *col, *cx;           /* conv: patches (rows, K), and a normalised input (B P, C) */
	size_t xb_cap, keep_cap, part_cap, jobs_cap, jobs_h_cap, gn_cap, sc_cap, col_cap, cx_cap;   /* bytes */
	struct kv_mirror *kvs;
	/* weight uploads (cu_weight): the mapping is read a chunk at a time into
	 * two buffers in turn, each copied to the device while the other fills */
	unsigned char *up_buf[2]; /* up_chunk bytes each; NULL until the first weight */
	cudaEvent_t up_done[2];   /* recorded after the copy out of up_buf[i] */
	size_t up_chunk;          /* UPLOAD_CHUNK, or HI3_CUDA_UPLOAD_CHUNK */
	int up_turn;              /* the buffer the next chunk fills */
	int up_pinned;            /* the buffers are page-locked (else the copies wait) */
	size_t up_bytes;          /* bytes uploaded since the first weight */
	double up_t0;             /* when the first weight began */
};

struct hi3_wt {
	int kind;
	int N, K;                 /* matrix (N, K); vector n = N; rows (N = V, K = H) */
	int dtype;                /* HI3K_F32, HI3K_BF16, or for rows HI3K_F16 */
	void *d;                  /* the device copy */
};

/* ---------------------------------------------------------------- errors */

static int cuda_fail(hi3_error *err, const char *call, const char *why, const char *file, int line)
{
	return hi3_error_set(err, HI3_ERR_RUNTIME, "CUDA: %s: %s (%s:%d)", call, why, file, line);
}

static int cuda_ok(cudaError_t e, hi3_error *err, const char *call, const char *file, int line)
{
	char why[256];

	if (e == cudaSuccess)
		return 0;
	snprintf(why, sizeof(why), "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
	return cuda_fail(err, call, why, file, line);
}

static int cublas_ok(cublasStatus_t s, hi3_error *err, const char *call, const char *file, int line)
{
	if (s == CUBLAS_STATUS_SUCCESS)
		return 0;
	return cuda_fail(err, call, cublasGetStatusString(s), file, line);
}

/* A call inside an op (or a cleanup): a failure is recorded on the
 * backend, the first one kept (see the top of the file). */
static int op_ok(struct cuda *c, cudaError_t e, const char *call, const char *file, int line)
{
	hi3_error err = {0};

	if (e == cudaSuccess)
		return 0;
	cuda_ok(e, &err, call, file, line);
	hi3i_backend_fail(c->be, "%s", err.msg);
	return -1;
}

static int op_cublas_ok(struct cuda *c, cublasStatus_t s, const char *call, const char *file, int line)
{
	hi3_error err = {0};

	if (s == CUBLAS_STATUS_SUCCESS)
		return 0;
	cublas_ok(s, &err, call, file, line);
	hi3i_backend_fail(c->be, "%s", err.msg);
	return -1;
}

/* 0 when the call succeeded; else -1 with err filled. */
#define CUDA_CHECK(err, call) cuda_ok((call), (err), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(err, call) cublas_ok((call), (err), #call, __FILE__, __LINE__)
/* 0 when the call succeeded; else -1, recorded on c's backend. */
#define OP_CHECK(c, call) op_ok((c), (call), #call, __FILE__, __LINE__)
#define OP_CUBLAS(c, call) op_cublas_ok((c), (call), #call, __FILE__, __LINE__)

/* An allocation of `need` bytes for `what` failed: say how much was free. */
static int oom(hi3_error *err, size_t need, const char *what)
{
	size_t fr = 0, total = 0;

	(void)cudaGetLastError();                /* not sticky: clear it */
	if (cudaMemGetInfo(&fr, &total) != cudaSuccess)
		(void)cudaGetLastError();
	if (!err) {
		hi3_log(HI3_LOG_WARN, "out of GPU memory: %s needs %.1f MiB, %.1f MiB free of %.1f MiB", what, MIB(need),
		        MIB(fr), MIB(total));
		return -1;
	}
	return hi3_error_set(err, HI3_ERR_RUNTIME, "out of GPU memory: %s needs %.1f MiB, %.1f MiB free of %.1f MiB",
	                     what, MIB(need), MIB(fr), MIB(total));
}

/* With HI3_CUDA_SYNC, wait for the op just enqueued and name it if it failed. */
static void op_done(struct cuda *c, const char *op)
{
	cudaError_t e;

	if (!c->sync_each)
		return;
	if ((e = cudaStreamSynchronize(c->stream)) != cudaSuccess) {
		hi3_log(HI3_LOG_ERROR, "CUDA: the %s op failed", op);
		OP_CHECK(c, e);
	}
}

/* ---------------------------------------------------------------- memory */

/* Grow a scratch buffer to n bytes (with headroom: it grows rarely, and is
 * never allocated per token). */
static void *grow(struct cuda *c, void **p, size_t *cap, size_t n, const char *what)
{
	hi3_error err = {0};

	if (n <= *cap)
		return *p;
	n += n / 2;
	OP_CHECK(c, cudaStreamSynchronize(c->stream));    /* the old buffer may be in use */
	OP_CHECK(c, cudaFree(*p));
	*p = NULL;
	*cap = 0;
	if (cudaMalloc(p, n) != cudaSuccess) {
		*p = NULL;
		oom(&err, n, what);
		hi3i_backend_fail(c->be, "%s", err.msg);
		return NULL;
	}
	*cap = n;
	return *p;
}

static void *cu_alloc(hi3_backend *be, size_t n)
{
	void *p = NULL;

	(void)be;
	if (cudaMalloc(&p, n ? n : 256) != cudaSuccess) {
		oom(NULL, n, "a buffer");
		return NULL;
	}
	return p;
}

static void cu_free(hi3_backend *be, void *p)
{
	struct cuda *c = be->ctx;

	OP_CHECK(c, cudaStreamSynchronize(c->stream));    /* no kernel still uses it */
	OP_CHECK(c, cudaFree(p));
}

/* host -> device. Small copies are staged through the pinned ring and do
 * not wait; the ring is reused only after the stream has drained it. */
static int cu_upload(hi3_backend *be, void *dst, const void *src, size_t n)
{
	struct cuda *c = be->ctx;

	if (!n)
		return 0;
	if (c->stage && n <= STAGE_BYTES / 4) {
		if (c->stage_pos + n > STAGE_BYTES) {
			OP_CHECK(c, cudaStreamSynchronize(c->stream));
			c->stage_pos = 0;
		}
		memcpy(c->stage + c->stage_pos, src, n);
		if (OP_CHECK(c, cudaMemcpyAsync(dst, c->stage + c->stage_pos, n, cudaMemcpyHostToDevice, c->stream)))
			return -1;
		c->stage_pos += (n + 255) & ~(size_t)255;
		return 0;
	}
	if (OP_CHECK(c, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, c->stream)) ||
	    OP_CHECK(c, cudaStreamSynchronize(c->stream)))
		return -1;
	return 0;
}

/* device -> host, after everything enqueued before it */
static int cu_download(hi3_backend *be, void *dst, const void *src, size_t n)
{
	struct cuda *c = be->ctx;

	if (!n)
		return 0;
	if (OP_CHECK(c, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, c->stream)) ||
	    OP_CHECK(c, cudaStreamSynchronize(c->stream)))
		return -1;
	return 0;
}

static size_t cu_mem_free(hi3_backend *be)
{
	size_t fr = 0, total = 0;

	(void)be;
	if (cudaMemGetInfo(&fr, &total) != cudaSuccess) {
		(void)cudaGetLastError();
		return 0;
	}
	return fr;
}

/* ---------------------------------------------------------------- weights */

/* The two upload buffers and their events, at the first weight. */
static int upload_init(struct cuda *c, hi3_error *err)
{
	if (c->up_buf[0])
		return 0;
	c->up_pinned = 1;
	for (int i = 0; i < 2; i++)
		if (cudaHostAlloc((void **)&c->up_buf[i], c->up_chunk, cudaHostAllocDefault) != cudaSuccess) {
			(void)cudaGetLastError();
			c->up_buf[i] = NULL;
			c->up_pinned = 0;
		}
	if (!c->up_pinned) {
		/* no page-locked memory: pageable buffers, which cudaMemcpyAsync
		 * copies before it returns; slower, still correct */
		for (int i = 0; i < 2; i++) {
			if (c->up_buf[i])
				cudaFreeHost(c->up_buf[i]);
			if (!(c->up_buf[i] = hi3i_malloc(c->up_chunk, err)))
				return -1;
		}
	}
	for (int i = 0; i < 2; i++)
		if (CUDA_CHECK(err, cudaEventCreateWithFlags(&c->up_done[i], cudaEventDisableTiming)))
			return -1;
	c->up_t0 = hi3i_now();
	c->up_bytes = 0;
	return 0;
}

static void upload_release(struct cuda *c)
{
	if (c->stream)
		cudaStreamSynchronize(c->stream);
	for (int i = 0; i < 2; i++) {
		if (c->up_buf[i] && c->up_pinned)
			cudaFreeHost(c->up_buf[i]);
		else
			free(c->up_buf[i]);
		if (c->up_done[i])
			cudaEventDestroy(c->up_done[i]);
		c->up_buf[i] = NULL;
		c->up_done[i] = NULL;
	}
}

/*
 * Stream n elements of t (as stored, or widened to f32 when !raw) to dst:
 * chunk i is read from the mapping into buffer i % 2 once the copy out of
 * that buffer two chunks ago is done (its event), then copied on the
 * stream. Reading chunk i + 1 (page faults, disk) overlaps the copy of
 * chunk i, and the last copies of one weight the reading of the next: no
 * weight waits for its own copy.
 */
static int upload_stream(struct cuda *c, unsigned char *dst, const hi3_tensor *t, int raw, hi3_error *err)
{
	size_t n = (size_t)hi3_tensor_numel(t), es = hi3_dtype_size(t->dtype), eo = raw ? es : sizeof(float);
	size_t per = c->up_chunk / eo;
	const unsigned char *src = t->data;

	for (size_t e0 = 0; e0 < n; e0 += per) {
		size_t len = n - e0 < per ? n - e0 : per;
		unsigned char *buf = c->up_buf[c->up_turn];
		if (CUDA_CHECK(err, cudaEventSynchronize(c->up_done[c->up_turn])))
			return -1;
		if (raw)
			memcpy(buf, src + e0 * es, len * es);
		else
			hi3_to_f32((float *)buf, src + e0 * es, t->dtype, len);
		if (CUDA_CHECK(err, cudaMemcpyAsync(dst + e0 * eo, buf, len * eo, cudaMemcpyHostToDevice, c->stream)) ||
		    CUDA_CHECK(err, cudaEventRecord(c->up_done[c->up_turn], c->stream)))
			return -1;
		c->up_turn ^= 1;
	}
	c->up_bytes += n * eo;
	return 0;
}

static hi3_wt *cu_weight(hi3_backend *be, const hi3_tensor *t, int kind, hi3_error *err)
{
	struct cuda *c = be->ctx;
	size_t n = (size_t)hi3_tensor_numel(t), bytes;
	hi3_wt *w;
	int raw;

	if (t->dtype != HI3_F32 && t->dtype != HI3_BF16 && t->dtype != HI3_F16 && t->dtype != HI3_F64) {
		hi3_error_set(err, HI3_ERR_INPUT, "dtype %s is not supported (expected F32, BF16, F16 or F64)",
		              hi3_dtype_name(t->dtype));
		return NULL;
	}
	if (upload_init(c, err) != 0 || !(w = hi3i_calloc(1, sizeof(*w), err)))
		return NULL;
	if (be->first_use)
		be->first_use(be, t, t->data, t->nbytes);
	w->kind = kind;
	w->N = (int)t->shape[0];
	w->K = t->ndim > 1 ? (int)t->shape[1] : 1;
	if (kind == HI3_WT_MATRIX && w->N > 0)    /* a conv weight [Cout, C, k...]: (Cout, C k...) */
		w->K = (int)(n / (size_t)w->N);
	/* what stays as stored: bf16 matrices, and embedding rows of any 16/32-bit float */
	raw = t->dtype == HI3_F32 || (kind == HI3_WT_MATRIX && t->dtype == HI3_BF16) ||
	      (kind == HI3_WT_ROWS && (t->dtype == HI3_BF16 || t->dtype == HI3_F16));
	w->dtype = raw ? (int)t->dtype : HI3K_F32;
	bytes = n * (w->dtype == HI3K_F32 ? 4 : 2);
	if (cudaMalloc(&w->d, bytes ? bytes : 4) != cudaSuccess) {
		w->d = NULL;
		oom(err, bytes, "the weight");
		goto fail;
	}
	/* on the backend's stream (a plain cudaMemcpy goes to the legacy stream,
	 * which a non-blocking stream does not wait for); weights_done waits */
	if (upload_stream(c, w->d, t, raw, err) != 0)
		goto fail;
	return w;
fail:
	if (w->d)
		cudaFree(w->d);
	free(w);
	return NULL;
}

/* After the last weight: wait for the copies, report the rate, free the buffers. */
static int cu_weights_done(hi3_backend *be, hi3_error *err)
{
	struct cuda *c = be->ctx;
	double s;

	if (!c->up_buf[0])
		return 0;
	if (CUDA_CHECK(err, cudaStreamSynchronize(c->stream)))
		return -1;
	s = hi3i_now() - c->up_t0;
	hi3_log(HI3_LOG_DEBUG, "cuda: weights uploaded: %.1f MB in %.3f s, %.2f GB/s (read from the mapping in %zu %s "
	        "chunks through 2 %s buffers, overlapping the copies)", c->up_bytes / 1e6, s,
	        s > 0 ? c->up_bytes / 1e9 / s : 0.0, c->up_chunk >> (c->up_chunk >= ((size_t)1 << 20) ? 20 : 10),
	        c->up_chunk >= ((size_t)1 << 20) ? "MiB" : "KiB", c->up_pinned ? "pinned" : "pageable (no pinned memory)");
	upload_release(c);
	return 0;
}

static void cu_weight_free(hi3_backend *be, hi3_wt *w)
{
	struct cuda *c = be->ctx;

	if (!w)
		return;
	OP_CHECK(c, cudaStreamSynchronize(c->stream));    /* no kernel still reads it */
	OP_CHECK(c, cudaFree(w->d));
	free(w);
}

/* ---------------------------------------------------------------- KV cache */

static struct kv_mirror *find_kv(struct cuda *c, const hi3_kvcache *kv)
{
	for (struct kv_mirror *m = c->kvs; m; m = m->next)
		if (m->kv == kv)
			return m;
	return NULL;
}

/* The mirror holding device address p, or NULL. */
static struct kv_mirror *kv_of(struct cuda *c, const void *p)
{
	for (struct kv_mirror *m = c->kvs; m; m = m->next)
		if ((const unsigned char *)p >= m->mem && (const unsigned char *)p < m->mem + m->total)
			return m;
	return NULL;
}

/* Mark every row clean: first slot C, last -1. */
static int kv_clean(struct cuda *c, struct kv_mirror *m, hi3_error *err)
{
	for (int r = 0; r < m->kv->B; r++) {
		m->dirty_h[2 * r] = m->kv->C;
		m->dirty_h[2 * r + 1] = -1;
	}
	return CUDA_CHECK(err, cudaMemcpyAsync(m->dirty, m->dirty_h, sizeof(int32_t) * 2 * (size_t)m->kv->B,
	                                       cudaMemcpyHostToDevice, c->stream));
}

static void kv_mirror_free(struct kv_mirror *m)
{
	if (!m)
		return;
	cudaFree(m->mem);
	cudaFree(m->dirty);
	cudaFree(m->ranges);
	cudaFree(m->pack);
	if (m->pack_h_pinned)
		cudaFreeHost(m->pack_h);
	else
		free(m->pack_h);
	free(m->dirty_h);
	free(m);
}

/* Copy the mirrored heads of layer l's K (part 0) or V (part 1) between
 * the host cache and the mirror: one block of nh heads per row. */
static int kv_copy_heads(struct cuda *c, struct kv_mirror *m, int l, int part, int up, hi3_error *err)
{
	hi3_kvcache *kv = m->kv;
	unsigned char *host = part ? kv->v[l] : kv->k[l], *dev = m->mem + (2 * (size_t)l + (size_t)part) * m->layer_bytes;
	const size_t hrow = (size_t)kv->n_kv * m->head_bytes, drow = (size_t)m->nh * m->head_bytes;

	if (!m->layer_bytes)
		return 0;
	host += (size_t)m->h0 * m->head_bytes;
	if (up)
		return CUDA_CHECK(err, cudaMemcpy2DAsync(dev, drow, host, hrow, drow, (size_t)kv->B, cudaMemcpyHostToDevice,
		                                         c->stream));
	return CUDA_CHECK(err, cudaMemcpy2DAsync(host, hrow, dev, drow, drow, (size_t)kv->B, cudaMemcpyDeviceToHost,
	                                         c->stream));
}

static int cu_kv_attach(hi3_backend *be, hi3_kvcache *kv, int h0, int nh, hi3_error *err)
{
	struct cuda *c = be->ctx;
	struct kv_mirror *m;
	size_t lb, total;
	char what[256];

	if ((m = find_kv(c, kv))) {
		if (m->h0 != h0 || m->nh != nh)
			return hi3_error_set(err, HI3_ERR_USAGE, "KV cache attached with kv heads [%d, %d), now asked for "
			                     "[%d, %d)", m->h0, m->h0 + m->nh, h0, h0 + nh);
		return 0;
	}
	if (kv->dtype != HI3_F32 && kv->dtype != HI3_BF16)
		return hi3_error_set(err, HI3_ERR_INPUT, "KV cache dtype %s (expected F32 or BF16)", hi3_dtype_name(kv->dtype));
	if (h0 < 0 || nh < 1 || h0 + nh > kv->n_kv)
		return hi3_error_set(err, HI3_ERR_USAGE, "KV cache: kv heads [%d, %d) of %d", h0, h0 + nh, kv->n_kv);
	lb = (size_t)kv->B * (size_t)nh * (size_t)kv->C * (size_t)kv->d * hi3_dtype_size(kv->dtype);
	total = 2 * (size_t)kv->n_layers * lb;
	if (!(m = hi3i_calloc(1, sizeof(*m), err)))
		return -1;
	if (cudaMalloc((void **)&m->mem, total ? total : 256) != cudaSuccess) {
		m->mem = NULL;
		snprintf(what, sizeof(what), "the KV cache (%d layers, %d rows, %d of %d kv heads, %d slots, head dim %d, "
		         "%s)", kv->n_layers, kv->B, nh, kv->n_kv, kv->C, kv->d, hi3_dtype_name(kv->dtype));
		oom(err, total, what);
		goto fail;
	}
	m->kv = kv;
	m->shape = *kv;
	m->h0 = h0;
	m->nh = nh;
	m->head_bytes = (size_t)kv->C * (size_t)kv->d * hi3_dtype_size(kv->dtype);
	m->layer_bytes = lb;
	m->total = total;
	if (!(m->dirty_h = hi3i_malloc(sizeof(int32_t) * 2 * (size_t)kv->B, err)))
		goto fail;
	if (cudaMalloc((void **)&m->dirty, sizeof(int32_t) * 2 * (size_t)kv->B) != cudaSuccess ||
	    cudaMalloc(&m->ranges, (3 * sizeof(int32_t) + sizeof(int64_t)) * (size_t)kv->B) != cudaSuccess) {
		oom(err, (3 * sizeof(int32_t) + sizeof(int64_t) + 2 * sizeof(int32_t)) * (size_t)kv->B,
		    "the KV cache bookkeeping");
		goto fail;
	}
	for (int l = 0; l < kv->n_layers; l++)
		if (kv_copy_heads(c, m, l, 0, 1, err) || kv_copy_heads(c, m, l, 1, 1, err)) {
			hi3_error_prefix(err, "copying the KV cache to the GPU");
			goto fail;
		}
	if (kv_clean(c, m, err) != 0)
		goto fail;
	m->next = c->kvs;
	c->kvs = m;
	return 0;
fail:
	(void)cudaGetLastError();
	kv_mirror_free(m);
	return -1;
}

static void cu_kv_detach(hi3_backend *be, hi3_kvcache *kv)
{
	struct cuda *c = be->ctx;

	for (struct kv_mirror **pm = &c->kvs; *pm; pm = &(*pm)->next)
		if ((*pm)->kv == kv) {
			struct kv_mirror *m = *pm;
			*pm = m->next;
			OP_CHECK(c, cudaStreamSynchronize(c->stream));
			kv_mirror_free(m);
			return;
		}
}

static void cu_kv_layer(hi3_backend *be, hi3_kvcache *kv, int layer, int h0, int nh, hi3_kv_dst *dst)
{
	struct kv_mirror *m = find_kv(be->ctx, kv);

	HI3_ASSERT(m && layer >= 0 && layer < kv->n_layers && h0 == m->h0 && nh == m->nh);
	/* a cache of another shape at the same address: its owner did not
	 * call hi3_model_drop_cache on the old one */
	HI3_ASSERT(kv->n_layers == m->shape.n_layers && kv->B == m->shape.B && kv->n_kv == m->shape.n_kv &&
	           kv->C == m->shape.C && kv->d == m->shape.d && kv->dtype == m->shape.dtype);
	dst->k = m->mem + 2 * (size_t)layer * m->layer_bytes;
	dst->v = m->mem + (2 * (size_t)layer + 1) * m->layer_bytes;
	dst->dtype = kv->dtype;
	dst->C = kv->C;
	dst->row_stride = (int64_t)m->nh * kv->C * kv->d;
}

/* Copy the slots written since the last sync, gathered on the device:
 * ranges (n, 3) row, first slot, count; slots in all. */
static int kv_sync_ranges(struct cuda *c, struct kv_mirror *m, const int32_t *ranges, const int64_t *offs, int n,
                          size_t slots, hi3_error *err)
{
	hi3_kvcache *kv = m->kv;
	const size_t es = hi3_dtype_size(kv->dtype), dw = (size_t)kv->d * es / 4;
	const size_t block_words = (size_t)m->nh * slots * dw, bytes = 2 * (size_t)kv->n_layers * block_words * 4;
	void *doff = m->ranges, *dr = (int64_t *)m->ranges + kv->B;

	if (bytes > m->pack_cap) {
		cudaFree(m->pack);
		m->pack_cap = 0;
		if (cudaMalloc(&m->pack, bytes) != cudaSuccess) {
			m->pack = NULL;
			return oom(err, bytes, "the KV cache sync");
		}
		m->pack_cap = bytes;
	}
	if (bytes > m->pack_h_cap) {
		if (m->pack_h_pinned)
			cudaFreeHost(m->pack_h);
		else
			free(m->pack_h);
		m->pack_h_cap = 0;
		m->pack_h_pinned = cudaHostAlloc(&m->pack_h, bytes, cudaHostAllocDefault) == cudaSuccess;
		if (!m->pack_h_pinned) {
			(void)cudaGetLastError();
			if (!(m->pack_h = hi3i_malloc(bytes, err)))
				return -1;
		}
		m->pack_h_cap = bytes;
	}
	if (CUDA_CHECK(err, cudaMemcpyAsync(dr, ranges, sizeof(int32_t) * 3 * (size_t)n, cudaMemcpyHostToDevice,
	                                    c->stream)) ||
	    CUDA_CHECK(err, cudaMemcpyAsync(doff, offs, sizeof(int64_t) * (size_t)n, cudaMemcpyHostToDevice, c->stream)) ||
	    CUDA_CHECK(err, HI3K(kv_pack)(c->stream, m->pack, m->mem, m->layer_bytes, kv->n_layers, m->nh, kv->C, kv->d,
	                                  (int)es, dr, doff, n, block_words)) ||
	    CUDA_CHECK(err, cudaMemcpyAsync(m->pack_h, m->pack, bytes, cudaMemcpyDeviceToHost, c->stream)) ||
	    CUDA_CHECK(err, cudaStreamSynchronize(c->stream)))
		return -1;
	for (int l = 0; l < kv->n_layers; l++)
		for (int part = 0; part < 2; part++) {
			const uint32_t *blk = (const uint32_t *)m->pack_h + (2 * (size_t)l + part) * block_words;
			unsigned char *host = part ? kv->v[l] : kv->k[l];
			for (int i = 0; i < n; i++)
				for (int j = 0; j < m->nh; j++) {
					const int row = ranges[3 * i], lo = ranges[3 * i + 1], cnt = ranges[3 * i + 2];
					size_t off = (((size_t)row * kv->n_kv + (size_t)(m->h0 + j)) * (size_t)kv->C + (size_t)lo) * dw * 4;
					memcpy(host + off, blk + (size_t)offs[i] + (size_t)j * (size_t)cnt * dw, (size_t)cnt * dw * 4);
				}
		}
	return 0;
}

static int cu_kv_sync_host(hi3_backend *be, hi3_kvcache *kv, hi3_error *err)
{
	struct cuda *c = be->ctx;
	struct kv_mirror *m = find_kv(c, kv);
	int32_t *ranges = NULL;
	int64_t *offs = NULL;
	size_t slots = 0, dw;
	int n = 0, rc = -1;

	if (!m)
		return 0;
	dw = (size_t)kv->d * hi3_dtype_size(kv->dtype) / 4;
	if (CUDA_CHECK(err, cudaMemcpyAsync(m->dirty_h, m->dirty, sizeof(int32_t) * 2 * (size_t)kv->B,
	                                    cudaMemcpyDeviceToHost, c->stream)) ||
	    CUDA_CHECK(err, cudaStreamSynchronize(c->stream)))
		goto out;
	if (!(ranges = hi3i_malloc(sizeof(int32_t) * 3 * (size_t)kv->B, err)) ||
	    !(offs = hi3i_malloc(sizeof(int64_t) * (size_t)kv->B, err)))
		goto out;
	for (int r = 0; r < kv->B; r++) {
		int lo = m->dirty_h[2 * r], hi = m->dirty_h[2 * r + 1];
		if (hi < lo)
			continue;
		ranges[3 * n] = r;
		ranges[3 * n + 1] = lo;
		ranges[3 * n + 2] = hi - lo + 1;
		offs[n] = (int64_t)((size_t)m->nh * slots * dw);
		slots += (size_t)(hi - lo + 1);
		n++;
	}
	if (slots && 2 * slots <= (size_t)kv->B * (size_t)kv->C) {
		if (kv_sync_ranges(c, m, ranges, offs, n, slots, err) != 0)
			goto out;
	} else if (slots) {      /* most of the cache: copy it whole */
		for (int l = 0; l < kv->n_layers; l++)
			if (kv_copy_heads(c, m, l, 0, 0, err) || kv_copy_heads(c, m, l, 1, 0, err))
				goto out;
		if (CUDA_CHECK(err, cudaStreamSynchronize(c->stream)))
			goto out;
	}
	if (slots && kv_clean(c, m, err) != 0)
		goto out;
	rc = 0;
out:
	free(ranges);
	free(offs);
	if (rc)
		hi3_error_prefix(err, "copying the KV cache from the GPU");
	return rc;
}

/* ---------------------------------------------------------------- ops */

/* y (M, N) = x (M, K) . W^T: a few rows through the gemv kernel; more
 * through cuBLAS, in whose column-major terms y^T = W x^T with W (N, K)
 * row-major read as its transpose. */
static void cu_matmul(hi3_backend *be, float *y, const float *x, const hi3_wt *w, int M)
{
	struct cuda *c = be->ctx;
	const float one = 1.0f, zero = 0.0f;
	const void *b = x;
	cudaDataType t = CUDA_R_32F;

	if (M <= 0)
		return;
	if (M <= HI3K_GEMV_MAX_M) {   /* decode: one pass over W, no cast, no cuBLAS */
		OP_CHECK(c, HI3K(gemv)(c->stream, y, x, w->d, w->dtype, M, w->N, w->K));
		op_done(c, "matmul");
		return;
	}
	if (w->dtype == HI3K_BF16) {
		size_t n = (size_t)M * (size_t)w->K;
		if (!(b = grow(c, &c->xb, &c->xb_cap, n * 2, "the bf16 GEMM input")) ||
		    OP_CHECK(c, HI3K(to_bf16)(c->stream, c->xb, x, n)))
			return;
		t = CUDA_R_16BF;
	}
	OP_CUBLAS(c, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, w->N, M, w->K, &one, w->d, t, w->K, b, t,
	                                w->K, &zero, y, CUDA_R_32F, w->N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
	op_done(c, "matmul");
}

/* n products at once: those of up to 8 rows (decode's experts) in one
 * grouped gemv launch, the same bits as a matmul each; any others one by
 * one. */
static void cu_matmul_group(hi3_backend *be, int n, float *const *y, const float *const *x, const hi3_wt *const *w,
                            const int *M)
{
	struct cuda *c = be->ctx;
	int n_small = 0, max_N = 0, dtype = -1;

	for (int i = 0; i < n; i++) {
		if (M[i] <= 0)
			continue;
		if (M[i] > HI3K_GEMV_MAX_M || (dtype >= 0 && w[i]->dtype != dtype)) {
			cu_matmul(be, y[i], x[i], w[i], M[i]);
			continue;
		}
		if ((size_t)(n_small + 1) * sizeof(hi3k_gemv_job) > c->jobs_h_cap) {
			size_t cap = (size_t)(n + 16) * sizeof(hi3k_gemv_job);
			hi3k_gemv_job *p = realloc(c->jobs_h, cap);
			if (!p) {
				hi3i_backend_fail(be, "out of memory for the grouped matmul's jobs");
				return;
			}
			c->jobs_h = p;
			c->jobs_h_cap = cap;
		}
		dtype = w[i]->dtype;
		c->jobs_h[n_small++] = (hi3k_gemv_job){y[i], x[i], w[i]->d, M[i], w[i]->N, w[i]->K, 0};
		max_N = HI3_MAX(max_N, w[i]->N);
	}
	if (!n_small)
		return;
	if (!grow(c, &c->jobs, &c->jobs_cap, (size_t)n_small * sizeof(hi3k_gemv_job), "the grouped matmul's jobs") ||
	    cu_upload(be, c->jobs, c->jobs_h, (size_t)n_small * sizeof(hi3k_gemv_job)))
		return;
	OP_CHECK(c, HI3K(gemv_group)(c->stream, c->jobs, n_small, max_N, dtype));
	op_done(c, "matmul_group");
}

static void cu_embed(hi3_backend *be, float *x, const int64_t *ids, const hi3_wt *wte, int M)
{
	struct cuda *c = be->ctx;

	OP_CHECK(c, HI3K(embed)(c->stream, x, ids, wte->d, wte->dtype, M, wte->K));
	op_done(c, "embed");
}

static void cu_rmsnorm(hi3_backend *be, float *y, const float *x, const hi3_wt *w, int M, int n, float eps)
{
	struct cuda *c = be->ctx;

	OP_CHECK(c, HI3K(rmsnorm)(c->stream, y, x, w->d, M, n, eps));
	op_done(c, "rmsnorm");
}

static void cu_zero(hi3_backend *be, float *x, size_t n)
{
	struct cuda *c = be->ctx;

	OP_CHECK(c, cudaMemsetAsync(x, 0, n * sizeof(float), c->stream));
	op_done(c, "zero");
}

static int cu_sync(hi3_backend *be)
{
	struct cuda *c = be->ctx;

	return OP_CHECK(c, cudaStreamSynchronize(c->stream));
}

static void cu_copy2d(hi3_backend *be, float *dst, size_t ldd, const float *src, size_t lds, int rows, int cols)
{
	struct cuda *c = be->ctx;

	if (rows <= 0 || cols <= 0)
		return;
	OP_CHECK(c, cudaMemcpy2DAsync(dst, ldd * sizeof(float), src, lds * sizeof(float), (size_t)cols * sizeof(float),
	                              (size_t)rows, cudaMemcpyDeviceToDevice, c->stream));
	op_done(c, "copy2d");
}

static void cu_add(hi3_backend *be, float *x, const float *y, size_t n)
{
	struct cuda *c = be->ctx;

	OP_CHECK(c, HI3K(add)(c->stream, x, y, n));
	op_done(c, "add");
}

/* The kernels' limits; a model beyond them cannot run here. */
static int check_dims(struct cuda *c, const struct hi3_dims *dm)
{
	if (dm->d % 2 || dm->d > HI3K_MAX_D || dm->n_h % dm->n_kv || dm->n_h / dm->n_kv > 32) {
		hi3i_backend_fail(c->be, "CUDA: attention: the kernels take an even head dim up to %d and up to 32 "
		                  "query heads per kv head (the model has head dim %d, %d query heads per kv head)",
		                  HI3K_MAX_D, dm->d, dm->n_kv ? dm->n_h / dm->n_kv : 0);
		return -1;
	}
	return 0;
}

static void cu_rope_qk(hi3_backend *be, float *qkv, const int32_t *pos, const float *theta, const hi3_wt *qn,
                       const hi3_wt *kn, const struct hi3_dims *dm, int M)
{
	struct cuda *c = be->ctx;

	if (check_dims(c, dm))
		return;
	OP_CHECK(c, HI3K(rope_qk)(c->stream, qkv, pos, theta, qn ? qn->d : NULL, kn ? kn->d : NULL, dm->n_kv,
	                               dm->n_h / dm->n_kv, dm->d, dm->eps, M));
	op_done(c, "rope_qk");
}

static void cu_kv_store(hi3_backend *be, const hi3_kv_dst *dst, const float *qkv, const int32_t *row,
                        const int64_t *slot, const struct hi3_dims *dm, int M)
{
	struct cuda *c = be->ctx;
	struct kv_mirror *mir = kv_of(c, dst->k);

	if (M <= 0)
		return;
	if (dst->row_stride && dst->row_stride != (int64_t)dm->n_kv * dst->C * dm->d) {
		/* the mirror holds exactly the heads it was attached with */
		hi3i_backend_fail(be, "kv_store: a cache of %lld elements a row for %d kv heads of %d slots: the "
		                  "mirror of other heads than the call's", (long long)dst->row_stride, dm->n_kv, dst->C);
		return;
	}
	if (!grow(c, &c->keep, &c->keep_cap, (size_t)M, "the KV store plan"))
		return;
	OP_CHECK(c, HI3K(kv_store)(c->stream, dst->k, dst->v, (int)dst->dtype, dst->C, qkv, row, slot, c->keep,
	                                mir ? mir->dirty : NULL, dm->n_kv, dm->n_h / dm->n_kv, dm->d, M));
	op_done(c, "kv_store");
}

static void cu_attention(hi3_backend *be, float *out, const float *qkv, const hi3_kv_src *k, const hi3_kv_src *v,
                         const hi3_attn_q *q, const struct hi3_dims *dm, int M)
{
	struct cuda *c = be->ctx;
	const int64_t W = (int64_t)(dm->n_h + 2 * dm->n_kv) * dm->d;
	const hi3k_src ks = {k->base, (int)k->dtype, k->row_stride, k->head_stride, k->slot_stride};
	const hi3k_src vs = {v->base, (int)v->dtype, v->row_stride, v->head_stride, v->slot_stride};
	/* keys read from this call's own qkv: the tokens of a row are
	 * consecutive queries, which the tiled kernel shares key tiles among */
	const int self = k->dtype == HI3_F32 && k->slot_stride == W && (const float *)k->base >= qkv &&
	                 (const float *)k->base < qkv + W;
	int nsplit = 1;
	void *part = NULL;

	if (M <= 0 || check_dims(c, dm))
		return;
	if (!self) {              /* enough blocks for every multiprocessor, twice, counted over the
		                           * model's kv heads: every layout splits the keys alike */
		int blocks = M * (dm->kv_all > 0 ? dm->kv_all : dm->n_kv), want = 2 * c->n_sm;
		nsplit = blocks >= want ? 1 : HI3_MIN((want + blocks - 1) / blocks, 64);
		if (nsplit > 1 &&
		    !(part = grow(c, &c->part, &c->part_cap,
		                  (size_t)M * (size_t)dm->n_h * (size_t)nsplit * (size_t)(dm->d + 2) * sizeof(float),
		                  "the attention partial sums")))
			return;
	}
	OP_CHECK(c, HI3K(attention)(c->stream, out, qkv, &ks, &vs, (const hi3k_attn_q *)q, dm->n_kv,
	                                 dm->n_h / dm->n_kv, dm->d, M, self, nsplit, part));
	op_done(c, "attention");
}

static void cu_swiglu(hi3_backend *be, float *y, const float *ab, int M, int inter)
{
	struct cuda *c = be->ctx;

	OP_CHECK(c, HI3K(swiglu)(c->stream, y, ab, M, inter));
	op_done(c, "swiglu");
}

static void cu_gather(hi3_backend *be, float *dst, const float *src, const int32_t *idx, int n, int w)
{
	struct cuda *c = be->ctx;

	OP_CHECK(c, HI3K(gather)(c->stream, dst, src, idx, n, w));
	op_done(c, "gather");
}

static void cu_scatter_add(hi3_backend *be, float *dst, const float *src, const int32_t *idx, const float *scale,
                           int n, int w)
{
	struct cuda *c = be->ctx;

	OP_CHECK(c, HI3K(scatter_add)(c->stream, dst, src, idx, scale, n, w));
	op_done(c, "scatter_add");
}

static void cu_scatter(hi3_backend *be, float *dst, const float *src, const int32_t *idx, int n, int w)
{
	struct cuda *c = be->ctx;

	OP_CHECK(c, HI3K(scatter)(c->stream, dst, src, idx, n, w));
	op_done(c, "scatter");
}

/* ---------------------------------------------------------------- image ops */

static void cu_groupnorm(hi3_backend *be, float *y, const float *x, const hi3_wt *w, const hi3_wt *b, int B, int64_t P,
                         int C, int G, float eps, int act);
static void cu_bias_add(hi3_backend *be, float *x, const hi3_wt *b, int64_t M, int N);

/* im2col in the weight's column order (c, dt, dy, dx), then the GEMM with
 * the weight as stored, COL_FLOATS of patches at a time; the input first
 * through groupnorm into scratch when the conv normalises it. */
#define COL_FLOATS ((size_t)1 << 24)

static void cu_conv(hi3_backend *be, float *y, const float *x, const hi3_wt *w, const hi3_wt *b,
                    const struct hi3_conv *cv, const struct hi3_conv_norm *norm, int64_t p0, int64_t n)
{
	struct cuda *c = be->ctx;
	const size_t K = (size_t)cv->C * (size_t)(cv->kt * cv->kh * cv->kw);
	const int64_t rows = (int64_t)HI3_MAX(1, COL_FLOATS / K), P = (int64_t)cv->T * cv->H * cv->W;
	float *col;

	HI3_ASSERT((size_t)w->K == K);
	if (n <= 0)
		return;
	if (norm) {
		float *xn = grow(c, &c->cx, &c->cx_cap, (size_t)(cv->B * P) * (size_t)cv->C * sizeof(float),
		                 "the normalised conv input");
		if (!xn)
			return;
		cu_groupnorm(be, xn, x, norm->w, norm->b, cv->B, P, cv->C, norm->G, norm->eps, norm->act);
		x = xn;
	}
	if (!(col = grow(c, &c->col, &c->col_cap, (size_t)HI3_MIN(rows, n) * K * sizeof(float), "the conv patches")))
		return;
	for (int64_t r0 = p0; r0 < p0 + n; r0 += rows) {
		const int m = (int)HI3_MIN(rows, p0 + n - r0);
		if (OP_CHECK(c, HI3K(im2col)(c->stream, col, x, cv->B, cv->T, cv->H, cv->W, cv->C, cv->kt, cv->kh, cv->kw, r0,
		                             m)))
			return;
		cu_matmul(be, y + r0 * w->N, col, w, m);
		if (b)
			cu_bias_add(be, y + r0 * w->N, b, m, w->N);
	}
	op_done(c, "conv");
}

static void cu_bias_add(hi3_backend *be, float *x, const hi3_wt *b, int64_t M, int N)
{
	struct cuda *c = be->ctx;

	OP_CHECK(c, HI3K(bias_add)(c->stream, x, b->d, M, N));
	op_done(c, "bias_add");
}

static void cu_groupnorm(hi3_backend *be, float *y, const float *x, const hi3_wt *w, const hi3_wt *b, int B, int64_t P,
                         int C, int G, float eps, int act)
{
	struct cuda *c = be->ctx;
	const size_t nch = (size_t)((P + HI3_GN_CHUNK - 1) / HI3_GN_CHUNK), BG = (size_t)B * (size_t)G;

	HI3_ASSERT(G > 0 && C % G == 0);
	if (B <= 0 || P <= 0)
		return;
	if (!grow(c, &c->gn, &c->gn_cap, (BG * nch + 2 * BG) * sizeof(float), "the groupnorm sums"))
		return;
	OP_CHECK(c, HI3K(groupnorm)(c->stream, y, x, w->d, b->d, B, P, C, G, eps, act, HI3_GN_CHUNK, c->gn));
	op_done(c, "groupnorm");
}

static void cu_layernorm(hi3_backend *be, float *y, const float *x, const hi3_wt *w, const hi3_wt *b, int M, int n,
                         float eps)
{
	struct cuda *c = be->ctx;

	OP_CHECK(c, HI3K(layernorm)(c->stream, y, x, w->d, b->d, M, n, eps));
	op_done(c, "layernorm");
}

static void cu_act(hi3_backend *be, float *y, const float *x, size_t n, int act)
{
	struct cuda *c = be->ctx;

	OP_CHECK(c, HI3K(act)(c->stream, y, x, n, act));
	op_done(c, "act");
}

static void cu_scale_shift(hi3_backend *be, float *h, const float *ss, int B, int64_t P, int C)
{
	struct cuda *c = be->ctx;

	OP_CHECK(c, HI3K(scale_shift)(c->stream, h, ss, B, P, C));
	op_done(c, "scale_shift");
}

static void cu_add_repeat(hi3_backend *be, float *x, const float *z, int64_t P, int C, int r)
{
	struct cuda *c = be->ctx;

	OP_CHECK(c, HI3K(add_repeat)(c->stream, x, z, P, C, r));
	op_done(c, "add_repeat");
}

static void cu_add_group_mean(hi3_backend *be, float *x, const float *z, int64_t P, int C, int r)
{
	struct cuda *c = be->ctx;

	OP_CHECK(c, HI3K(add_group_mean)(c->stream, x, z, P, C, r));
	op_done(c, "add_group_mean");
}

static void cu_depth_to_space(hi3_backend *be, float *y, const float *x, int B, int T, int H, int W, int C, int rt)
{
	struct cuda *c = be->ctx;

	OP_CHECK(c, HI3K(shuffle)(c->stream, y, (float *)x, B, T, H, W, C, rt, 1));
	op_done(c, "depth_to_space");
}

static void cu_space_to_depth(hi3_backend *be, float *y, const float *x, int B, int T, int H, int W, int C, int rt)
{
	struct cuda *c = be->ctx;

	OP_CHECK(c, HI3K(shuffle)(c->stream, (float *)x, y, B, T / rt, H / 2, W / 2, C, rt, 0));
	op_done(c, "space_to_depth");
}

/* Per (image, head, block of queries): S = Q K^T (cuBLAS, fp32), the
 * masked softmax of S / sqrt(d) (softmax.cu), O = S V (cuBLAS) straight
 * into the head's columns. Row-major (rows, cols, ld) is column-major
 * (cols, rows, ld): S^T (M, n) = K (M, d) . Q^T, O^T (d, n) = V^T . S^T. */
static void cu_attention_dense(hi3_backend *be, float *out, const float *q, const float *k, const float *v,
                               const uint8_t *key_mask, int B, int M, int n_h, int d)
{
	struct cuda *c = be->ctx;
	const int64_t C = (int64_t)n_h * d;
	const float one = 1.0f, zero = 0.0f, scale = (float)(1.0 / sqrt((double)d));
	const int qb = (int)HI3_MAX(16, HI3_MIN(((int64_t)1 << 26) / HI3_MAX(M, 1), M));

	if (M <= 0 || B <= 0)
		return;
	if (C > INT32_MAX || !grow(c, &c->sc, &c->sc_cap, (size_t)qb * (size_t)M * sizeof(float), "the attention scores"))
		return;
	for (int b = 0; b < B; b++)
		for (int h = 0; h < n_h; h++) {
			const int64_t off = (int64_t)b * M * C + (int64_t)h * d;
			for (int i0 = 0; i0 < M; i0 += qb) {
				const int n = HI3_MIN(qb, M - i0);
				if (OP_CUBLAS(c, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, M, n, d, &one, k + off, CUDA_R_32F,
				                              (int)C, q + off + (int64_t)i0 * C, CUDA_R_32F, (int)C, &zero, c->sc,
				                              CUDA_R_32F, M, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)) ||
				    OP_CHECK(c, HI3K(softmax_rows)(c->stream, c->sc, n, M, scale,
				                                   key_mask ? key_mask + (int64_t)b * M : NULL)) ||
				    OP_CUBLAS(c, cublasGemmEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, d, n, M, &one, v + off, CUDA_R_32F,
				                              (int)C, c->sc, CUDA_R_32F, M, &zero, out + off + (int64_t)i0 * C,
				                              CUDA_R_32F, (int)C, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)))
					return;
			}
		}
	op_done(c, "attention_dense");
}

/* ---------------------------------------------------------------- setup */

static void cu_destroy(hi3_backend *be)
{
	struct cuda *c;

	if (!be)
		return;
	if ((c = be->ctx)) {
		while (c->kvs)
			cu_kv_detach(be, c->kvs->kv);
		if (c->stream)
			cudaStreamSynchronize(c->stream);
		cudaFree(c->xb);
		cudaFree(c->keep);
		cudaFree(c->part);
		cudaFree(c->jobs);
		cudaFree(c->gn);
		cudaFree(c->sc);
		cudaFree(c->col);
		cudaFree(c->cx);
		free(c->jobs_h);
		if (c->stage)
			cudaFreeHost(c->stage);
		upload_release(c);
		if (c->blas)
			cublasDestroy(c->blas);
		if (c->stream)
			cudaStreamDestroy(c->stream);
		free(c);
	}
	free(be);
}

static const hi3_backend_ops cuda_ops = {
	.destroy = cu_destroy,
	.alloc = cu_alloc,
	.free = cu_free,
	.upload = cu_upload,
	.download = cu_download,
	.mem_free = cu_mem_free,
	.weight = cu_weight,
	.weight_free = cu_weight_free,
	.weights_done = cu_weights_done,
	.kv_attach = cu_kv_attach,
	.kv_detach = cu_kv_detach,
	.kv_layer = cu_kv_layer,
	.kv_sync_host = cu_kv_sync_host,
	.matmul = cu_matmul,
	.matmul_group = cu_matmul_group,
	.embed = cu_embed,
	.rmsnorm = cu_rmsnorm,
	.zero = cu_zero,
	.copy2d = cu_copy2d,
	.sync = cu_sync,
	.add = cu_add,
	.rope_qk = cu_rope_qk,
	.kv_store = cu_kv_store,
	.attention = cu_attention,
	.swiglu = cu_swiglu,
	.gather = cu_gather,
	.scatter_add = cu_scatter_add,
	.scatter = cu_scatter,
	.conv = cu_conv,
	.bias_add = cu_bias_add,
	.groupnorm = cu_groupnorm,
	.layernorm = cu_layernorm,
	.act = cu_act,
	.scale_shift = cu_scale_shift,
	.add_repeat = cu_add_repeat,
	.add_group_mean = cu_add_group_mean,
	.depth_to_space = cu_depth_to_space,
	.space_to_depth = cu_space_to_depth,
	.attention_dense = cu_attention_dense,
};

int hi3i_backend_cuda(hi3_backend **out, int threads, int batch_invariant, hi3_error *err)
{
	struct cudaDeviceProp prop;
	hi3_backend *be = NULL;
	struct cuda *c = NULL;
	const char *sync = getenv("HI3_CUDA_SYNC"), *chunk = getenv("HI3_CUDA_UPLOAD_CHUNK");
	size_t up_chunk = UPLOAD_CHUNK;
	cudaError_t e;
	int n = 0, dev = 0;

	(void)threads;
	(void)batch_invariant;
	*out = NULL;
	if ((e = cudaGetDeviceCount(&n)) != cudaSuccess) {
		(void)cudaGetLastError();
		return hi3_error_set(err, HI3_ERR_RUNTIME, "--backend cuda: no CUDA device available: "
		                     "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
	}
	if (n < 1)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "--backend cuda: no CUDA device available: "
		                     "cudaGetDeviceCount found none");
	if (chunk && *chunk) {
		char *end;
		unsigned long long v;
		errno = 0;
		v = strtoull(chunk, &end, 10);
		if (errno || *end || chunk[0] == '-' || v < 4096 || v > ((size_t)1 << 30))
			return hi3_error_set(err, HI3_ERR_USAGE, "HI3_CUDA_UPLOAD_CHUNK: '%s' is not a byte count in "
			                     "[4096, 1073741824]", chunk);
		up_chunk = (size_t)v;
	}
	if (hi3i_cublas_load(err) != 0)
		return -1;
	if (!(be = hi3i_calloc(1, sizeof(*be), err)) || !(c = be->ctx = hi3i_calloc(1, sizeof(*c), err)))
		goto fail;
	c->be = be;
	c->up_chunk = up_chunk;
	if (CUDA_CHECK(err, cudaGetDevice(&dev)) || CUDA_CHECK(err, cudaSetDevice(dev)) ||
	    CUDA_CHECK(err, cudaGetDeviceProperties(&prop, dev)) ||
	    CUDA_CHECK(err, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) ||
	    CUBLAS_CHECK(err, cublasCreate(&c->blas)) || CUBLAS_CHECK(err, cublasSetStream(c->blas, c->stream)) ||
	    CUBLAS_CHECK(err, cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH)))
		goto fail;
	if ((e = HI3K(probe)()) != cudaSuccess) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "--backend cuda: GPU %d (%s, compute capability %d.%d) cannot run "
		              "this build's kernels: %s (configure with CUDA_ARCH='-gencode arch=compute_%d%d,code=sm_%d%d')",
		              dev, prop.name, prop.major, prop.minor, cudaGetErrorString(e), prop.major, prop.minor,
		              prop.major, prop.minor);
		goto fail;
	}
	if (cudaHostAlloc((void **)&c->stage, STAGE_BYTES, cudaHostAllocDefault) != cudaSuccess) {
		(void)cudaGetLastError();  /* no pinned ring: uploads wait instead */
		c->stage = NULL;
	}
	c->n_sm = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
	c->sync_each = sync && *sync && strcmp(sync, "0") != 0;
	hi3_log(HI3_LOG_DEBUG, "cuda: GPU %d: %s, compute capability %d.%d, %d multiprocessors, %.1f GiB", dev, prop.name,
	        prop.major, prop.minor, prop.multiProcessorCount, (double)prop.totalGlobalMem / (1 << 30));
	be->name = "cuda";
	be->ops = &cuda_ops;
	be->batch_invariant = 0;
	*out = be;
	return 0;
fail:
	cu_destroy(be);
	return -1;
}

#else /* no CUDA */

int hi3i_backend_cuda(hi3_backend **out, int threads, int batch_invariant, hi3_error *err)
{
	(void)threads;
	(void)batch_invariant;
	*out = NULL;
	return hi3_error_set(err, HI3_ERR_RUNTIME, "--backend cuda: this hi3 was built without CUDA "
	                     "(nvcc/cuBLAS were not found by ./configure)");
}

int hi3i_cublas_load(hi3_error *err)
{
	(void)err;
	return 0;
}

#endif
