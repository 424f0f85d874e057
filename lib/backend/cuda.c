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
 *  - Weight-only quantized matrices (fp8, int8, nf4, nvfp4: quant.h) are
 *    uploaded as the checkpoint stores them, codes and scales, never as a
 *    dequantized copy, and multiply through kernels/qgemv.cu for any
 *    number of rows: each weight dequantized in registers to the CPU's f32
 *    value (core/qvalue.h), x kept f32, every column summed in one fixed
 *    order, so these products alone are batch invariant.
 *  - The KV cache lives on the device: kv_attach copies a host cache (the
 *    mmap'd KV file) up, kv_sync_host copies it back, so files stay the
 *    interface. A rank of a tensor-parallel layout mirrors its own kv heads
 *    only, and writes back only those (the other ranks write theirs). kv_store notes, per cache row, the first and last slot it
 *    wrote since the last sync, and the sync copies only those (one gather
 *    kernel, one copy): a decode step moves its new slots, not the cache.
 *  - batch_invariant (asked for: --batch-invariant=on with --backend cuda;
 *    off unless asked) replaces what depends on the batch size: every
 *    matmul runs the gemv kernel in passes of 8 rows (gemv_rows), never
 *    cuBLAS, and attention over the cache takes its keys unsplit, so a
 *    row gives the same bits alone or batched, at the price of prefill
 *    speed (no tensor cores, W read once per 8 rows). Without it cuBLAS
 *    may pick another algorithm, and attention another split, for
 *    another batch size; the quantized products are invariant either way.
 *  - Decode steps from CUDA graphs (--cuda-graphs, on by default where the
 *    driver has graphs): between graph_begin and graph_end (one decode
 *    step of at most HI3K_GEMV_MAX_M rows) the ops are recorded, not
 *    issued: each as a function and its arguments, the small uploads as
 *    copies from fixed places of the pinned ring (the data is written
 *    there at once). At the next point the host must wait (a download, a
 *    sync, the end of the step) the recorded stretch is looked up by its
 *    ops and arguments: a stretch seen before with the same ones is one
 *    cudaGraphLaunch of the graph captured from it; one seen once before
 *    is captured (stream capture), instantiated and launched; one never
 *    seen runs eagerly. A step of the model is one stretch per MoE layer
 *    (the host routes on the router logits it downloads) and one for the
 *    logits; what changes per step (token ids, positions, the decode mask
 *    bounds, the routing) reaches them through the fixed device buffers
 *    the uploads fill, so the graphs of a (batch, cache) repeat. A graph
 *    runs the kernels the eager ops run, with the same arguments: the
 *    same bits. A capture that fails turns graphs off, eagerly redone.
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
#include "backend/quant.h"

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
_Static_assert((int)HI3K_Q_FP8 == (int)HI3_Q_FP8 && (int)HI3K_Q_INT8 == (int)HI3_Q_INT8 &&
               (int)HI3K_Q_NF4 == (int)HI3_Q_NF4 && (int)HI3K_Q_NVFP4 == (int)HI3_Q_NVFP4, "quantized format codes");

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
	/* decode steps from graphs (the top of the file) */
	int graphs;               /* 1: on (set_graphs) */
	int in_step;              /* between graph_begin and graph_end: ops are recorded */
	int rec_open;             /* a stretch is being recorded (the ring started over for it) */
	struct rec *recs;         /* the stretch recorded since the last flush */
	size_t n_recs, cap_recs;
	unsigned char *args;      /* their arguments */
	size_t n_args, cap_args;
	uint64_t key;             /* a hash of recs and args */
	struct graph_entry *cache;   /* the graphs captured, HI3_GRAPHS_MAX at most */
	int n_cache;
	uint64_t seen[64];        /* keys of stretches seen once, most recent last */
	int n_seen;
	uint64_t n_from_graphs, n_captured, n_eager;   /* stretches: launched, captured, run eagerly */
};

/* A recorded op: run(c, args) issues it. Argument structs hold only 8-byte
 * members (pointers, int64_t, double), so they have no padding and two
 * records of the same op with the same arguments are the same bytes. */
typedef void (*rec_fn)(struct cuda *c, const void *args);
struct rec {
	rec_fn run;
	uint64_t off, len;        /* the arguments: args + off, len bytes */
};

struct graph_entry {
	uint64_t key;
	struct rec *recs;
	unsigned char *args;
	size_t n_recs, n_args;
	cudaGraphExec_t exec;
};

#define HI3_GRAPHS_MAX 512

struct hi3_wt {
	int kind;
	int N, K;                 /* matrix (N, K); vector n = N; rows (N = V, K = H) */
	int dtype;                /* HI3K_F32, HI3K_BF16, or for rows HI3K_F16; WT_Q: quantized */
	void *d;                  /* the device copy (quantized: the codes as stored) */
	hi3k_qmat *q;             /* quantized: device, the layout and its pointers */
	void *qs, *qn;            /* ... and its scales and nested absmax (NULL: none), as stored */
};

#define WT_Q 0x100           /* not a HI3K_ dtype */

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

/* ---------------------------------------------------------------- graphs */

static void graph_reset(struct cuda *c)
{
	c->n_recs = c->n_args = 0;
	c->rec_open = 0;
	c->key = HI3_HASH_INIT;
}

static void run_recs(struct cuda *c, const struct rec *r, size_t n, const unsigned char *args)
{
	for (size_t i = 0; i < n; i++)
		r[i].run(c, args + r[i].off);
}

/* 1 when key was seen before; else remembered (the last 64) and 0. */
static int seen_before(struct cuda *c, uint64_t key)
{
	for (int i = 0; i < c->n_seen; i++)
		if (c->seen[i] == key)
			return 1;
	if (c->n_seen == (int)HI3_ARRAY_SIZE(c->seen)) {
		memmove(c->seen, c->seen + 1, sizeof(c->seen) - sizeof(c->seen[0]));
		c->n_seen--;
	}
	c->seen[c->n_seen++] = key;
	return 0;
}

/* The graph of a stretch with the recorded ops and arguments, or NULL. */
static struct graph_entry *graph_find(struct cuda *c)
{
	for (int i = 0; i < c->n_cache; i++) {
		struct graph_entry *e = &c->cache[i];
		if (e->key == c->key && e->n_recs == c->n_recs && e->n_args == c->n_args &&
		    !memcmp(e->recs, c->recs, c->n_recs * sizeof(*c->recs)) && !memcmp(e->args, c->args, c->n_args))
			return e;
	}
	return NULL;
}

/* Capture the recorded stretch (its ops issued into the capturing stream)
 * and instantiate it; NULL when the cache is full, or when the capture
 * failed, which turns graphs off (a warning says why). */
static struct graph_entry *graph_capture(struct cuda *c)
{
	const hi3_error saved = c->be->err;
	cudaGraph_t g = NULL;
	cudaGraphExec_t exec = NULL;
	struct graph_entry *e;
	cudaError_t ce;
	const char *why = NULL;

	if (c->n_cache == HI3_GRAPHS_MAX)
		return NULL;
	if (!c->cache && !(c->cache = calloc(HI3_GRAPHS_MAX, sizeof(*c->cache))))
		return NULL;
	if ((ce = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeGlobal)) != cudaSuccess) {
		why = cudaGetErrorString(ce);
		goto fail;
	}
	run_recs(c, c->recs, c->n_recs, c->args);
	ce = cudaStreamEndCapture(c->stream, &g);
	if (c->be->err.status != saved.status) {
		why = c->be->err.msg;
		goto fail;
	}
	if (ce != cudaSuccess || (ce = cudaGraphInstantiate(&exec, g, 0)) != cudaSuccess) {
		why = cudaGetErrorString(ce);
		goto fail;
	}
	cudaGraphDestroy(g);
	e = &c->cache[c->n_cache];
	*e = (struct graph_entry){.key = c->key, .n_recs = c->n_recs, .n_args = c->n_args, .exec = exec};
	if (!(e->recs = malloc(c->n_recs * sizeof(*c->recs) + 1)) || !(e->args = malloc(c->n_args + 1))) {
		free(e->recs);
		cudaGraphExecDestroy(exec);
		return NULL;
	}
	memcpy(e->recs, c->recs, c->n_recs * sizeof(*c->recs));
	memcpy(e->args, c->args, c->n_args);
	c->n_cache++;
	return e;
fail:
	hi3_log(HI3_LOG_WARN, "CUDA graphs: capturing a decode step failed (%s): decode runs eagerly",
	        why ? why : "unknown error");
	if (g)
		cudaGraphDestroy(g);
	(void)cudaGetLastError();
	c->be->err = saved;
	c->graphs = 0;
	return NULL;
}

/* Issue the recorded stretch: its graph, a new graph, or eagerly (the top
 * of the file). */
static void graph_flush(struct cuda *c)
{
	struct graph_entry *e;

	if (!c->n_recs) {
		c->rec_open = 0;
		return;
	}
	if ((e = graph_find(c))) {
		OP_CHECK(c, cudaGraphLaunch(e->exec, c->stream));
		c->n_from_graphs++;
	} else if (c->graphs && seen_before(c, c->key) && (e = graph_capture(c))) {
		OP_CHECK(c, cudaGraphLaunch(e->exec, c->stream));
		c->n_from_graphs++;
		c->n_captured++;
	} else {
		run_recs(c, c->recs, c->n_recs, c->args);
		c->n_eager++;
	}
	graph_reset(c);
}

/* The first op of a stretch: the pinned ring starts over, once the stream
 * is done with it, so that a stretch's uploads read fixed places of it. */
static void rec_begin(struct cuda *c)
{
	if (c->rec_open)
		return;
	c->rec_open = 1;
	if (c->stage_pos) {
		OP_CHECK(c, cudaStreamSynchronize(c->stream));
		c->stage_pos = 0;
	}
}

/* Issue the op run(c, a) now, or record it within a decode step. */
static void defer(struct cuda *c, rec_fn run, const void *a, size_t len)
{
	if (!c->in_step) {
		run(c, a);
		return;
	}
	rec_begin(c);
	if (c->n_recs == c->cap_recs) {
		size_t nr = c->cap_recs ? 2 * c->cap_recs : 256;
		struct rec *r = realloc(c->recs, nr * sizeof(*r));
		if (!r)
			goto eager;
		c->recs = r;
		c->cap_recs = nr;
	}
	if (c->n_args + len > c->cap_args) {
		size_t na = HI3_MAX(2 * c->cap_args, c->n_args + len + 4096);
		unsigned char *b = realloc(c->args, na);
		if (!b)
			goto eager;
		c->args = b;
		c->cap_args = na;
	}
	c->recs[c->n_recs++] = (struct rec){run, c->n_args, len};
	memcpy(c->args + c->n_args, a, len);
	c->n_args += len;
	c->key = hi3i_hash(c->key, &run, sizeof(run));
	c->key = hi3i_hash(c->key, a, len);
	return;
eager:                    /* no room to record: what is recorded, then this, eagerly */
	graph_flush(c);
	run(c, a);
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
	graph_flush(c);           /* recorded ops may use the old buffer */
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

	graph_flush(c);
	OP_CHECK(c, cudaStreamSynchronize(c->stream));    /* no kernel still uses it */
	OP_CHECK(c, cudaFree(p));
}

struct a_copy {
	void *dst;
	const void *src;
	uint64_t n;
};

static void run_copy(struct cuda *c, const void *p)
{
	const struct a_copy *a = p;

	OP_CHECK(c, cudaMemcpyAsync(a->dst, a->src, a->n, cudaMemcpyHostToDevice, c->stream));
}

/* host -> device. Small copies are staged through the pinned ring and do
 * not wait; the ring is reused only after the stream has drained it.
 * Within a decode step such a copy is recorded, from its place in the
 * ring (the data is there at once). */
static int cu_upload(hi3_backend *be, void *dst, const void *src, size_t n)
{
	struct cuda *c = be->ctx;

	if (!n)
		return 0;
	if (c->in_step && c->stage && n <= STAGE_BYTES / 4) {
		struct a_copy a;
		rec_begin(c);
		if (c->stage_pos + n > STAGE_BYTES) {   /* the ring is full: a new stretch */
			graph_flush(c);
			rec_begin(c);
		}
		memcpy(c->stage + c->stage_pos, src, n);
		a = (struct a_copy){dst, c->stage + c->stage_pos, n};
		c->stage_pos += (n + 255) & ~(size_t)255;
		defer(c, run_copy, &a, sizeof(a));
		return 0;
	}
	graph_flush(c);
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
	graph_flush(c);
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
 * Stream n elements of dtype dt at src (as stored, or widened to f32 when
 * !raw) to dst:
 * chunk i is read from the mapping into buffer i % 2 once the copy out of
 * that buffer two chunks ago is done (its event), then copied on the
 * stream. Reading chunk i + 1 (page faults, disk) overlaps the copy of
 * chunk i, and the last copies of one weight the reading of the next: no
 * weight waits for its own copy.
 */
static int upload_stream(struct cuda *c, unsigned char *dst, const void *data, hi3_dtype dt, size_t n, int raw,
                         hi3_error *err)
{
	const size_t es = hi3_dtype_size(dt), eo = raw ? es : sizeof(float), per = c->up_chunk / eo;
	const unsigned char *src = data;

	for (size_t e0 = 0; e0 < n; e0 += per) {
		size_t len = n - e0 < per ? n - e0 : per;
		unsigned char *buf = c->up_buf[c->up_turn];
		if (CUDA_CHECK(err, cudaEventSynchronize(c->up_done[c->up_turn])))
			return -1;
		if (raw)
			memcpy(buf, src + e0 * es, len * es);
		else
			hi3_to_f32((float *)buf, src + e0 * es, dt, len);
		if (CUDA_CHECK(err, cudaMemcpyAsync(dst + e0 * eo, buf, len * eo, cudaMemcpyHostToDevice, c->stream)) ||
		    CUDA_CHECK(err, cudaEventRecord(c->up_done[c->up_turn], c->stream)))
			return -1;
		c->up_turn ^= 1;
	}
	c->up_bytes += n * eo;
	return 0;
}

/* A new weight of t, its bytes reported read (first_use), uploads ready. */
static hi3_wt *weight_new(hi3_backend *be, const hi3_tensor *t, int kind, hi3_error *err)
{
	hi3_wt *w;

	graph_flush(be->ctx);
	if (upload_init(be->ctx, err) != 0 || !(w = hi3i_calloc(1, sizeof(*w), err)))
		return NULL;
	if (be->first_use)
		be->first_use(be, t, t->data, t->nbytes);
	w->kind = kind;
	return w;
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
	if (!(w = weight_new(be, t, kind, err)))
		return NULL;
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
	if (upload_stream(c, w->d, t->data, t->dtype, n, raw, err) != 0)
		goto fail;
	return w;
fail:
	if (w->d)
		cudaFree(w->d);
	free(w);
	return NULL;
}

/* n bytes at src (host) into a new device buffer *dst: 0, or -1 with err set. */
static int upload_new(struct cuda *c, void **dst, const void *src, size_t n, const char *what, hi3_error *err)
{
	if (cudaMalloc(dst, n ? n : 4) != cudaSuccess) {
		*dst = NULL;
		return oom(err, n, what);
	}
	return upload_stream(c, *dst, src, HI3_U8, n, 1, err);
}

/*
 * A weight-only quantized matrix (quant.h): its codes, scales and nested
 * absmax uploaded as the checkpoint stores them (no dequantized copy), and
 * its layout (format, maps, pointers) as a hi3k_qmat in device memory, which
 * kernels/qgemv.cu dequantizes a weight at a time in registers.
 */
static hi3_wt *cu_qweight(hi3_backend *be, const hi3_tensor *t, const hi3_qweight *q, hi3_error *err)
{
	struct cuda *c = be->ctx;
	const size_t nk = (size_t)q->N * (size_t)q->K;
	const size_t blocks = q->format == HI3_Q_NF4 ? (nk + (size_t)q->block - 1) / (size_t)q->block : 0;
	size_t codes = nk, scales = 0, nested = 0;
	hi3k_qmat h = {0};
	hi3_wt *w;

	switch (q->format) {
	case HI3_Q_FP8:
		scales = (q->per_row ? (size_t)q->N : 1) * hi3_dtype_size(q->scale_dtype);
		break;
	case HI3_Q_INT8:
		scales = (size_t)q->N * sizeof(float);
		break;
	case HI3_Q_NF4:
		codes = (nk + 1) / 2;
		scales = blocks * (q->nested ? 1 : sizeof(float));
		nested = q->nested ? (blocks + (size_t)q->nested_block - 1) / (size_t)q->nested_block * sizeof(float) : 0;
		break;
	case HI3_Q_NVFP4:
		codes = nk / 2;
		scales = (size_t)q->N * (size_t)(q->K / q->block);
		break;
	default:
		hi3_error_set(err, HI3_ERR_INPUT, "quantized format %d has no CUDA kernel", q->format);
		return NULL;
	}
	if (!(w = weight_new(be, t, HI3_WT_MATRIX, err)))
		return NULL;
	w->N = q->N;
	w->K = q->K;
	w->dtype = WT_Q;
	if (upload_new(c, &w->d, q->codes, codes, "the quantized weight", err) != 0 ||
	    upload_new(c, &w->qs, q->scale, scales, "its scales", err) != 0 ||
	    (nested && upload_new(c, &w->qn, q->nested_absmax, nested, "its nested absmax", err) != 0))
		goto fail;
	h = (hi3k_qmat){.codes = w->d, .scale = w->qs, .nested_absmax = w->qn, .format = q->format, .N = q->N,
	                .K = q->K, .block = q->block, .scale_dtype = (int)q->scale_dtype, .per_row = q->per_row,
	                .round_to = (int)q->round_to, .nested = q->nested, .nested_block = q->nested_block,
	                .scale2 = q->scale2, .offset = q->offset};
	memcpy(h.map, q->map, sizeof(h.map));
	memcpy(h.nested_map, q->nested_map, sizeof(h.nested_map));
	if (upload_new(c, (void **)&w->q, &h, sizeof(h), "the quantized weight's layout", err) != 0)
		goto fail;
	return w;
fail:
	cudaFree(w->d);
	cudaFree(w->qs);
	cudaFree(w->qn);
	cudaFree(w->q);
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
	if (w->q) {
		OP_CHECK(c, cudaFree(w->q));
		OP_CHECK(c, cudaFree(w->qs));
		OP_CHECK(c, cudaFree(w->qn));
	}
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

	graph_flush(c);
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

	graph_flush(c);
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
	graph_flush(c);
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

/* Each op below builds its arguments (8-byte members only: see struct
 * rec) and hands them with its run_ function to defer(), which issues it
 * now or records it within a decode step. */

struct a_gemv {
	float *y;
	const float *x;
	const hi3_wt *w;
	int64_t M;
};

static void run_gemv(struct cuda *c, const void *p)
{
	const struct a_gemv *a = p;

	if (a->w->q)
		OP_CHECK(c, HI3K(qgemv)(c->stream, a->y, a->x, a->w->q, (int)a->M, a->w->N, a->w->K));
	else
		OP_CHECK(c, HI3K(gemv_rows)(c->stream, a->y, a->x, a->w->d, a->w->dtype, (int)a->M, a->w->N, a->w->K));
	op_done(c, "matmul");
}

/* y (M, N) = x (M, K) . W^T: a few rows through the gemv kernel; more
 * through cuBLAS, in whose column-major terms y^T = W x^T with W (N, K)
 * row-major read as its transpose. A quantized W: any M through the
 * qgemv kernel (batch-invariant, kernels/qgemv.cu); batch_invariant: any
 * M through the gemv kernel, 8 rows a pass. */
static void cu_matmul(hi3_backend *be, float *y, const float *x, const hi3_wt *w, int M)
{
	struct cuda *c = be->ctx;
	const float one = 1.0f, zero = 0.0f;
	const void *b = x;
	cudaDataType t = CUDA_R_32F;

	if (M <= 0)
		return;
	if (M <= HI3K_GEMV_MAX_M || w->q || be->batch_invariant) {   /* decode: one pass over W, no cuBLAS */
		const struct a_gemv a = {y, x, w, M};
		defer(c, run_gemv, &a, sizeof(a));
		return;
	}
	graph_flush(c);
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

struct a_gemv_group {
	const hi3k_gemv_job *jobs;
	int64_t n, max_N, dtype;
};

static void run_gemv_group(struct cuda *c, const void *p)
{
	const struct a_gemv_group *a = p;

	if (a->dtype == WT_Q)
		OP_CHECK(c, HI3K(qgemv_group)(c->stream, a->jobs, (int)a->n, (int)a->max_N));
	else
		OP_CHECK(c, HI3K(gemv_group)(c->stream, a->jobs, (int)a->n, (int)a->max_N, (int)a->dtype));
	op_done(c, "matmul_group");
}

/* n products at once: those of up to 8 rows (decode's experts) in one
 * grouped gemv launch (qgemv for quantized weights), the same bits as a matmul each; any others one by
 * one. Products of 0 rows are jobs too (that do nothing), so that a decode
 * step launches the same grid whichever experts its tokens chose. */
static void cu_matmul_group(hi3_backend *be, int n, float *const *y, const float *const *x, const hi3_wt *const *w,
                            const int *M)
{
	struct cuda *c = be->ctx;
	int n_small = 0, max_N = 0, dtype = -1;
	struct a_gemv_group a;

	for (int i = 0; i < n; i++) {
		if (M[i] < 0)
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
		c->jobs_h[n_small++] = (hi3k_gemv_job){y[i], x[i], w[i]->q ? (const void *)w[i]->q : w[i]->d, M[i], w[i]->N,
		                                       w[i]->K, 0};
		max_N = HI3_MAX(max_N, w[i]->N);
	}
	if (!n_small)
		return;
	if (!grow(c, &c->jobs, &c->jobs_cap, (size_t)n_small * sizeof(hi3k_gemv_job), "the grouped matmul's jobs") ||
	    cu_upload(be, c->jobs, c->jobs_h, (size_t)n_small * sizeof(hi3k_gemv_job)))
		return;
	a = (struct a_gemv_group){c->jobs, n_small, max_N, dtype};
	defer(c, run_gemv_group, &a, sizeof(a));
}

struct a_embed {
	float *x;
	const int64_t *ids;
	const hi3_wt *wte;
	int64_t M;
};

static void run_embed(struct cuda *c, const void *p)
{
	const struct a_embed *a = p;

	OP_CHECK(c, HI3K(embed)(c->stream, a->x, a->ids, a->wte->d, a->wte->dtype, (int)a->M, a->wte->K));
	op_done(c, "embed");
}

static void cu_embed(hi3_backend *be, float *x, const int64_t *ids, const hi3_wt *wte, int M)
{
	const struct a_embed a = {x, ids, wte, M};

	defer(be->ctx, run_embed, &a, sizeof(a));
}

struct a_rmsnorm {
	float *y;
	const float *x;
	const hi3_wt *w;
	int64_t M, n;
	double eps;               /* a float: exact as a double */
};

static void run_rmsnorm(struct cuda *c, const void *p)
{
	const struct a_rmsnorm *a = p;

	OP_CHECK(c, HI3K(rmsnorm)(c->stream, a->y, a->x, a->w->d, (int)a->M, (int)a->n, (float)a->eps));
	op_done(c, "rmsnorm");
}

static void cu_rmsnorm(hi3_backend *be, float *y, const float *x, const hi3_wt *w, int M, int n, float eps)
{
	const struct a_rmsnorm a = {y, x, w, M, n, eps};

	defer(be->ctx, run_rmsnorm, &a, sizeof(a));
}

struct a_zero {
	float *x;
	uint64_t n;
};

static void run_zero(struct cuda *c, const void *p)
{
	const struct a_zero *a = p;

	OP_CHECK(c, cudaMemsetAsync(a->x, 0, a->n * sizeof(float), c->stream));
	op_done(c, "zero");
}

static void cu_zero(hi3_backend *be, float *x, size_t n)
{
	const struct a_zero a = {x, n};

	defer(be->ctx, run_zero, &a, sizeof(a));
}

static int cu_sync(hi3_backend *be)
{
	struct cuda *c = be->ctx;

	graph_flush(c);
	return OP_CHECK(c, cudaStreamSynchronize(c->stream));
}

struct a_copy2d {
	float *dst;
	const float *src;
	uint64_t ldd, lds, rows, cols;
};

static void run_copy2d(struct cuda *c, const void *p)
{
	const struct a_copy2d *a = p;

	OP_CHECK(c, cudaMemcpy2DAsync(a->dst, a->ldd * sizeof(float), a->src, a->lds * sizeof(float),
	                              a->cols * sizeof(float), a->rows, cudaMemcpyDeviceToDevice, c->stream));
	op_done(c, "copy2d");
}

static void cu_copy2d(hi3_backend *be, float *dst, size_t ldd, const float *src, size_t lds, int rows, int cols)
{
	const struct a_copy2d a = {dst, src, ldd, lds, (uint64_t)rows, (uint64_t)cols};

	if (rows > 0 && cols > 0)
		defer(be->ctx, run_copy2d, &a, sizeof(a));
}

struct a_add {
	float *x;
	const float *y;
	uint64_t n;
};

static void run_add(struct cuda *c, const void *p)
{
	const struct a_add *a = p;

	OP_CHECK(c, HI3K(add)(c->stream, a->x, a->y, a->n));
	op_done(c, "add");
}

static void cu_add(hi3_backend *be, float *x, const float *y, size_t n)
{
	const struct a_add a = {x, y, n};

	defer(be->ctx, run_add, &a, sizeof(a));
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

struct a_rope {
	float *qkv;
	const int32_t *pos;
	const float *theta;
	const hi3_wt *qn, *kn;
	int64_t n_kv, g, d, M;
	double eps;
};

static void run_rope(struct cuda *c, const void *p)
{
	const struct a_rope *a = p;

	OP_CHECK(c, HI3K(rope_qk)(c->stream, a->qkv, a->pos, a->theta, a->qn ? a->qn->d : NULL, a->kn ? a->kn->d : NULL,
	                          (int)a->n_kv, (int)a->g, (int)a->d, (float)a->eps, (int)a->M));
	op_done(c, "rope_qk");
}

static void cu_rope_qk(hi3_backend *be, float *qkv, const int32_t *pos, const float *theta, const hi3_wt *qn,
                       const hi3_wt *kn, const struct hi3_dims *dm, int M)
{
	struct cuda *c = be->ctx;
	struct a_rope a;

	if (check_dims(c, dm))
		return;
	a = (struct a_rope){qkv, pos, theta, qn, kn, dm->n_kv, dm->n_h / dm->n_kv, dm->d, M, dm->eps};
	defer(c, run_rope, &a, sizeof(a));
}

struct a_kv_store {
	void *k, *v;
	const float *qkv;
	const int32_t *row;
	const int64_t *slot;
	void *keep;
	int32_t *dirty;
	int64_t dtype, C, n_kv, g, d, M;
};

static void run_kv_store(struct cuda *c, const void *p)
{
	const struct a_kv_store *a = p;

	OP_CHECK(c, HI3K(kv_store)(c->stream, a->k, a->v, (int)a->dtype, (int)a->C, a->qkv, a->row, a->slot, a->keep,
	                           a->dirty, (int)a->n_kv, (int)a->g, (int)a->d, (int)a->M));
	op_done(c, "kv_store");
}

static void cu_kv_store(hi3_backend *be, const hi3_kv_dst *dst, const float *qkv, const int32_t *row,
                        const int64_t *slot, const struct hi3_dims *dm, int M)
{
	struct cuda *c = be->ctx;
	struct kv_mirror *mir = kv_of(c, dst->k);
	struct a_kv_store a;

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
	a = (struct a_kv_store){dst->k, dst->v, qkv, row, slot, c->keep, mir ? mir->dirty : NULL, (int)dst->dtype,
	                        dst->C, dm->n_kv, dm->n_h / dm->n_kv, dm->d, M};
	defer(c, run_kv_store, &a, sizeof(a));
}

struct a_attention {
	float *out;
	const float *qkv;
	const void *kb, *vb;
	int64_t kdt, krs, khs, kss, vdt, vrs, vhs, vss;   /* hi3k_src of keys and values */
	const hi3_attn_q *q;
	float *part;
	int64_t n_kv, g, d, M, self, nsplit;
};

static void run_attention(struct cuda *c, const void *p)
{
	const struct a_attention *a = p;
	const hi3k_src ks = {a->kb, (int)a->kdt, a->krs, a->khs, a->kss};
	const hi3k_src vs = {a->vb, (int)a->vdt, a->vrs, a->vhs, a->vss};

	OP_CHECK(c, HI3K(attention)(c->stream, a->out, a->qkv, &ks, &vs, (const hi3k_attn_q *)a->q, (int)a->n_kv,
	                            (int)a->g, (int)a->d, (int)a->M, (int)a->self, (int)a->nsplit, a->part));
	op_done(c, "attention");
}

static void cu_attention(hi3_backend *be, float *out, const float *qkv, const hi3_kv_src *k, const hi3_kv_src *v,
                         const hi3_attn_q *q, const struct hi3_dims *dm, int M)
{
	struct cuda *c = be->ctx;
	const int64_t W = (int64_t)(dm->n_h + 2 * dm->n_kv) * dm->d;
	/* keys read from this call's own qkv: the tokens of a row are
	 * consecutive queries, which the tiled kernel shares key tiles among */
	const int self = k->dtype == HI3_F32 && k->slot_stride == W && (const float *)k->base >= qkv &&
	                 (const float *)k->base < qkv + W;
	int nsplit = 1;
	void *part = NULL;
	struct a_attention a;

	if (M <= 0 || check_dims(c, dm))
		return;
	if (!self && !be->batch_invariant) {   /* enough blocks for every multiprocessor, twice, counted
		                                * over the model's kv heads: every layout splits the keys
		                                * alike (not the batch sizes: batch_invariant does not split) */
		int blocks = M * (dm->kv_all > 0 ? dm->kv_all : dm->n_kv), want = 2 * c->n_sm;
		nsplit = blocks >= want ? 1 : HI3_MIN((want + blocks - 1) / blocks, 64);
		if (nsplit > 1 &&
		    !(part = grow(c, &c->part, &c->part_cap,
		                  (size_t)M * (size_t)dm->n_h * (size_t)nsplit * (size_t)(dm->d + 2) * sizeof(float),
		                  "the attention partial sums")))
			return;
	}
	a = (struct a_attention){out, qkv, k->base, v->base, (int)k->dtype, k->row_stride, k->head_stride,
	                         k->slot_stride, (int)v->dtype, v->row_stride, v->head_stride, v->slot_stride, q, part,
	                         dm->n_kv, dm->n_h / dm->n_kv, dm->d, M, self, nsplit};
	defer(c, run_attention, &a, sizeof(a));
}

struct a_swiglu {
	float *y;
	const float *ab;
	int64_t M, inter;
};

static void run_swiglu(struct cuda *c, const void *p)
{
	const struct a_swiglu *a = p;

	OP_CHECK(c, HI3K(swiglu)(c->stream, a->y, a->ab, (int)a->M, (int)a->inter));
	op_done(c, "swiglu");
}

static void cu_swiglu(hi3_backend *be, float *y, const float *ab, int M, int inter)
{
	const struct a_swiglu a = {y, ab, M, inter};

	defer(be->ctx, run_swiglu, &a, sizeof(a));
}

/* gather, scatter_add, scatter (which), combine: rows of width w */
struct a_rows {
	float *dst;
	const float *src;
	const int32_t *idx;
	const float *scale;
	int64_t which, n, k, w;
};

static void run_rows(struct cuda *c, const void *p)
{
	static const char *const name[] = {"gather", "scatter_add", "scatter", "combine"};
	const struct a_rows *a = p;
	cudaError_t e;

	switch (a->which) {
	case 0: e = HI3K(gather)(c->stream, a->dst, a->src, a->idx, (int)a->n, (int)a->w); break;
	case 1: e = HI3K(scatter_add)(c->stream, a->dst, a->src, a->idx, a->scale, (int)a->n, (int)a->w); break;
	case 2: e = HI3K(scatter)(c->stream, a->dst, a->src, a->idx, (int)a->n, (int)a->w); break;
	default: e = HI3K(combine)(c->stream, a->dst, a->src, a->idx, a->scale, (int)a->n, (int)a->k, (int)a->w); break;
	}
	OP_CHECK(c, e);
	op_done(c, name[a->which]);
}

static void cu_gather(hi3_backend *be, float *dst, const float *src, const int32_t *idx, int n, int w)
{
	const struct a_rows a = {dst, src, idx, NULL, 0, n, 0, w};

	defer(be->ctx, run_rows, &a, sizeof(a));
}

static void cu_scatter_add(hi3_backend *be, float *dst, const float *src, const int32_t *idx, const float *scale,
                           int n, int w)
{
	const struct a_rows a = {dst, src, idx, scale, 1, n, 0, w};

	defer(be->ctx, run_rows, &a, sizeof(a));
}

static void cu_scatter(hi3_backend *be, float *dst, const float *src, const int32_t *idx, int n, int w)
{
	const struct a_rows a = {dst, src, idx, NULL, 2, n, 0, w};

	defer(be->ctx, run_rows, &a, sizeof(a));
}

static void cu_combine(hi3_backend *be, float *y, const float *src, const int32_t *where, const float *scale, int M,
                       int k, int w)
{
	const struct a_rows a = {y, src, where, scale, 3, M, k, w};

	defer(be->ctx, run_rows, &a, sizeof(a));
}

/* Decode steps from graphs: what --cuda-graphs asked (0 where the driver
 * has them, 1 on, 2 off); on is refused where they cannot run. */
static int cu_set_graphs(hi3_backend *be, int mode, hi3_error *err)
{
	struct cuda *c = be->ctx;
	int v = 0, ok = cudaDriverGetVersion(&v) == cudaSuccess && v >= 11000 && !c->sync_each;

	(void)cudaGetLastError();
	if (mode == 1 && !ok)
		return hi3_error_set(err, HI3_ERR_USAGE, "--cuda-graphs on: %s", c->sync_each ?
		                     "HI3_CUDA_SYNC waits after every op, which a graph cannot" :
		                     "the CUDA driver has no graphs (version 11.0 or later)");
	c->graphs = mode != 2 && ok;
	hi3_log(HI3_LOG_DEBUG, "cuda: decode steps from graphs: %s", c->graphs ? "on" : "off");
	return 0;
}

static int cu_graph_begin(hi3_backend *be, int M)
{
	struct cuda *c = be->ctx;

	graph_flush(c);
	c->in_step = c->graphs && M > 0 && M <= HI3K_GEMV_MAX_M;
	return c->in_step;
}

static void cu_graph_end(hi3_backend *be)
{
	struct cuda *c = be->ctx;

	if (be->err.status)       /* a failed step: nothing of it runs */
		graph_reset(c);
	graph_flush(c);
	c->in_step = 0;
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

	graph_flush(c);
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

	graph_flush(c);
	OP_CHECK(c, HI3K(bias_add)(c->stream, x, b->d, M, N));
	op_done(c, "bias_add");
}

static void cu_groupnorm(hi3_backend *be, float *y, const float *x, const hi3_wt *w, const hi3_wt *b, int B, int64_t P,
                         int C, int G, float eps, int act)
{
	struct cuda *c = be->ctx;
	const size_t nch = (size_t)((P + HI3_GN_CHUNK - 1) / HI3_GN_CHUNK), BG = (size_t)B * (size_t)G;

	graph_flush(c);
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

	graph_flush(c);
	OP_CHECK(c, HI3K(layernorm)(c->stream, y, x, w->d, b->d, M, n, eps));
	op_done(c, "layernorm");
}

static void cu_act(hi3_backend *be, float *y, const float *x, size_t n, int act)
{
	struct cuda *c = be->ctx;

	graph_flush(c);
	OP_CHECK(c, HI3K(act)(c->stream, y, x, n, act));
	op_done(c, "act");
}

static void cu_scale_shift(hi3_backend *be, float *h, const float *ss, int B, int64_t P, int C)
{
	struct cuda *c = be->ctx;

	graph_flush(c);
	OP_CHECK(c, HI3K(scale_shift)(c->stream, h, ss, B, P, C));
	op_done(c, "scale_shift");
}

static void cu_add_repeat(hi3_backend *be, float *x, const float *z, int64_t P, int C, int r)
{
	struct cuda *c = be->ctx;

	graph_flush(c);
	OP_CHECK(c, HI3K(add_repeat)(c->stream, x, z, P, C, r));
	op_done(c, "add_repeat");
}

static void cu_add_group_mean(hi3_backend *be, float *x, const float *z, int64_t P, int C, int r)
{
	struct cuda *c = be->ctx;

	graph_flush(c);
	OP_CHECK(c, HI3K(add_group_mean)(c->stream, x, z, P, C, r));
	op_done(c, "add_group_mean");
}

static void cu_depth_to_space(hi3_backend *be, float *y, const float *x, int B, int T, int H, int W, int C, int rt)
{
	struct cuda *c = be->ctx;

	graph_flush(c);
	OP_CHECK(c, HI3K(shuffle)(c->stream, y, (float *)x, B, T, H, W, C, rt, 1));
	op_done(c, "depth_to_space");
}

static void cu_space_to_depth(hi3_backend *be, float *y, const float *x, int B, int T, int H, int W, int C, int rt)
{
	struct cuda *c = be->ctx;

	graph_flush(c);
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

	graph_flush(c);
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
		graph_flush(c);
		if (c->n_from_graphs || c->n_eager)
			hi3_log(HI3_LOG_DEBUG, "cuda: decode steps: %llu stretches from graphs (%llu captured, %d kept), "
			        "%llu eagerly", (unsigned long long)c->n_from_graphs, (unsigned long long)c->n_captured,
			        c->n_cache, (unsigned long long)c->n_eager);
		for (int i = 0; i < c->n_cache; i++) {
			cudaGraphExecDestroy(c->cache[i].exec);
			free(c->cache[i].recs);
			free(c->cache[i].args);
		}
		free(c->cache);
		free(c->recs);
		free(c->args);
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
	.qweight = cu_qweight,
	.matmul = cu_matmul,
	.matmul_group = cu_matmul_group,
	.embed = cu_embed,
	.rmsnorm = cu_rmsnorm,
	.zero = cu_zero,
	.copy2d = cu_copy2d,
	.sync = cu_sync,
	.combine = cu_combine,
	.set_graphs = cu_set_graphs,
	.graph_begin = cu_graph_begin,
	.graph_end = cu_graph_end,
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
	graph_reset(c);
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
	be->batch_invariant = batch_invariant != 0;
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
