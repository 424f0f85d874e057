/*
 * emu.cc -- the CPU stand-in for a GPU behind cuda-emu.h and emu-kernel.h:
 * device memory (with a size limit, so out-of-memory paths can be tested),
 * copies that check which side each pointer is on, a column-major
 * cublasGemmEx, and kernels run block by block with one fiber per thread
 * (a few lines of assembly switch stacks on x86-64; elsewhere ucontext,
 * which is slower: it makes a system call per switch).
 *
 * The scheduler runs every runnable thread of a block until it reaches a
 * barrier, in a random order, then releases a warp whose live lanes all
 * wait at a warp barrier (a shuffle or __syncwarp), or the block once all
 * its threads wait at __syncthreads. Anything else (a barrier some threads
 * never reach, a shuffle with exited lanes, a block size that is not whole
 * warps) is a kernel bug: it is reported and the program aborts.
 *
 * A host-to-device cudaMemcpyAsync from pinned memory (cudaHostAlloc) is
 * deferred, as a GPU's DMA is: it reads its source only when the stream
 * reaches a point that must see it (a stream or event synchronisation, a
 * kernel, another copy or memset, a GEMM, a free). So host code that
 * reuses a pinned buffer before the copy from it is known to be done reads
 * back the wrong data, and fails its tests instead of passing by luck.
 *
 * Stream capture records what the capturing stream is given (kernels with
 * a copy of their arguments, device-to-device and pinned host-to-device
 * copies, memsets) as the nodes of a graph, run in order when the graph is
 * launched. Everything else while a stream captures (a synchronisation, an
 * allocation, a free, a copy to the host, cuBLAS, another stream) is
 * refused and invalidates the capture, so that code which would not
 * capture on a GPU fails here too instead of running eagerly. Kernels are
 * counted, eager and run by graphs (HI3_EMU_STATS).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif
#include <deque>
#include <map>
#include <vector>
#include "emu-kernel.h"

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

/* ------------------------------------------------------------ errors */

static cudaError_t last_error = cudaSuccess;

static cudaError_t fail(cudaError_t e)
{
	last_error = e;
	return e;
}

/* ------------------------------------------------------------ capture */

static cudaStream_t cap_stream;                 /* the stream capturing, or NULL */
static int cap_invalid;                         /* something was refused since the capture began */
static std::vector<std::function<void()>> cap_nodes;
static int in_graph;                            /* running a graph's nodes */
static unsigned long long n_eager, n_in_graphs, n_graph_launches;

static struct emu_stats {
	~emu_stats()
	{
		const char *path = getenv("HI3_EMU_STATS");
		FILE *f;
		if (path && *path && (f = fopen(path, "a"))) {
			fprintf(f, "kernels_eager=%llu kernels_in_graphs=%llu graph_launches=%llu\n", n_eager, n_in_graphs,
			        n_graph_launches);
			fclose(f);
		}
	}
} stats_at_exit;

extern "C" void emu_kernel_counts(unsigned long long *eager, unsigned long long *in_graphs,
                                  unsigned long long *launches)
{
	*eager = n_eager;
	*in_graphs = n_in_graphs;
	*launches = n_graph_launches;
}

int emu_capturing(cudaStream_t s)
{
	if (!cap_stream)
		return 0;
	return s == cap_stream ? 1 : -1;
}

void emu_record_node(std::function<void()> node)
{
	cap_nodes.push_back(std::move(node));
}

/* A call a capture cannot hold: refused, and the capture is invalidated. */
void emu_refuse_in_capture(const char *what)
{
	if (!cap_invalid)
		fprintf(stderr, "cuda-emu: refused while a stream captures: %s\n", what);
	cap_invalid = 1;
	fail(cudaErrorStreamCaptureUnsupported);
}

#define NOT_IN_CAPTURE(what)                                   \
	do {                                                   \
		if (cap_stream) {                              \
			emu_refuse_in_capture(what);           \
			return cudaErrorStreamCaptureUnsupported; \
		}                                              \
	} while (0)

[[noreturn]] static void emu_die(const char *what)
{
	fprintf(stderr, "cuda-emu: %s\n", what);
	abort();
}

extern "C" cudaError_t emu_cudaGetLastError(void)
{
	cudaError_t e = last_error;

	last_error = cudaSuccess;
	return e;
}

extern "C" const char *emu_cudaGetErrorName(cudaError_t e)
{
	switch (e) {
	case cudaSuccess: return "cudaSuccess";
	case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
	case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
	case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
	case cudaErrorNoDevice: return "cudaErrorNoDevice";
	case cudaErrorIllegalState: return "cudaErrorIllegalState";
	case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
	case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
	case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
	}
	return "cudaErrorUnknown";
}

extern "C" const char *emu_cudaGetErrorString(cudaError_t e)
{
	switch (e) {
	case cudaSuccess: return "no error";
	case cudaErrorInvalidValue: return "invalid argument";
	case cudaErrorMemoryAllocation: return "out of memory";
	case cudaErrorInvalidConfiguration: return "invalid configuration argument";
	case cudaErrorNoDevice: return "no CUDA-capable device is detected";
	case cudaErrorIllegalState: return "the resource is in an illegal state";
	case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
	case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
	case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing "
	                                            "blocking stream";
	}
	return "unknown error";
}

/* ------------------------------------------------------------ device */

static size_t mem_total = (size_t)4 << 30, mem_used;
static std::map<uintptr_t, size_t> allocs;    /* device allocations: start -> size */

static void mem_init(void)
{
	static int done;
	const char *s = getenv("HI3_EMU_MEM_MB");

	if (done)
		return;
	done = 1;
	if (s && *s)
		mem_total = (size_t)strtoull(s, NULL, 10) << 20;
}

extern "C" void emu_set_device_memory(size_t total)
{
	mem_init();
	mem_total = total;
}

extern "C" size_t emu_device_used(void)
{
	return mem_used;
}

/* Is [p, p + n) inside one device allocation? */
static int on_device(const void *p, size_t n)
{
	uintptr_t a = (uintptr_t)p;
	auto it = allocs.upper_bound(a);

	if (it == allocs.begin())
		return 0;
	--it;
	return a >= it->first && a + n <= it->first + it->second;
}

extern "C" cudaError_t emu_cudaGetDeviceCount(int *n)
{
	*n = 1;
	return cudaSuccess;
}

extern "C" cudaError_t emu_cudaSetDevice(int dev)
{
	return dev == 0 ? cudaSuccess : fail(cudaErrorInvalidValue);
}

extern "C" cudaError_t emu_cudaGetDevice(int *dev)
{
	*dev = 0;
	return cudaSuccess;
}

extern "C" cudaError_t emu_cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev)
{
	mem_init();
	if (dev != 0)
		return fail(cudaErrorInvalidValue);
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "cuda-emu (CPU)");
	p->totalGlobalMem = mem_total;
	p->multiProcessorCount = 4;
	p->major = 9;
	return cudaSuccess;
}

/* ------------------------------------------------------------ deferred copies */

static std::map<uintptr_t, size_t> pinned;    /* cudaHostAlloc: start -> size */
struct pending_copy {
	void *dst;
	const void *src;
	size_t n;
	uint64_t seq;
};
static std::deque<pending_copy> pending;
static uint64_t copy_seq;                      /* sequence number of the next deferred copy */

static int is_pinned(const void *p, size_t n)
{
	auto it = pinned.upper_bound((uintptr_t)p);
	if (it == pinned.begin())
		return 0;
	--it;
	return (uintptr_t)p + n <= it->first + it->second;
}

/* Do the deferred copies issued before sequence number upto. */
static void flush_before(uint64_t upto)
{
	while (!pending.empty() && pending.front().seq < upto) {
		memmove(pending.front().dst, pending.front().src, pending.front().n);
		pending.pop_front();
	}
}

static void flush(void)
{
	flush_before(UINT64_MAX);
}

struct emu_event {
	uint64_t seq;             /* the copies before it, when recorded */
};

extern "C" cudaError_t emu_cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
	(void)flags;
	*e = new emu_event();
	(*e)->seq = 0;
	return cudaSuccess;
}

extern "C" cudaError_t emu_cudaEventDestroy(cudaEvent_t e)
{
	delete e;
	return cudaSuccess;
}

extern "C" cudaError_t emu_cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
	(void)s;
	NOT_IN_CAPTURE("cudaEventRecord");
	e->seq = copy_seq;
	return cudaSuccess;
}

extern "C" cudaError_t emu_cudaEventSynchronize(cudaEvent_t e)
{
	NOT_IN_CAPTURE("cudaEventSynchronize");
	flush_before(e->seq);
	return cudaSuccess;
}

struct emu_stream {
	int unused;
};

extern "C" cudaError_t emu_cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
	(void)flags;
	*s = new emu_stream();
	return cudaSuccess;
}

extern "C" cudaError_t emu_cudaStreamDestroy(cudaStream_t s)
{
	NOT_IN_CAPTURE("cudaStreamDestroy");
	flush();
	delete s;
	return cudaSuccess;
}

extern "C" cudaError_t emu_cudaStreamSynchronize(cudaStream_t s)
{
	(void)s;
	NOT_IN_CAPTURE("cudaStreamSynchronize");
	flush();
	return cudaSuccess;
}

extern "C" cudaError_t emu_cudaMalloc(void **p, size_t n)
{
	mem_init();
	*p = NULL;
	NOT_IN_CAPTURE("cudaMalloc");
	if (n > mem_total - mem_used)
		return fail(cudaErrorMemoryAllocation);
	if (!(*p = malloc(n ? n : 1)))
		return fail(cudaErrorMemoryAllocation);
	allocs[(uintptr_t)*p] = n;
	mem_used += n;
	return cudaSuccess;
}

extern "C" cudaError_t emu_cudaFree(void *p)
{
	NOT_IN_CAPTURE("cudaFree");
	flush();
	if (!p)
		return cudaSuccess;
	auto it = allocs.find((uintptr_t)p);
	if (it == allocs.end())
		emu_die("cudaFree of a pointer cudaMalloc did not return");
	mem_used -= it->second;
	allocs.erase(it);
	free(p);
	return cudaSuccess;
}

extern "C" cudaError_t emu_cudaHostAlloc(void **p, size_t n, unsigned flags)
{
	(void)flags;
	NOT_IN_CAPTURE("cudaHostAlloc");
	*p = malloc(n ? n : 1);
	if (!*p)
		return fail(cudaErrorMemoryAllocation);
	pinned[(uintptr_t)*p] = n;
	return cudaSuccess;
}

extern "C" cudaError_t emu_cudaFreeHost(void *p)
{
	NOT_IN_CAPTURE("cudaFreeHost");
	flush();
	pinned.erase((uintptr_t)p);
	free(p);
	return cudaSuccess;
}

extern "C" cudaError_t emu_cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
	int dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
	int sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;

	NOT_IN_CAPTURE("cudaMemcpy (synchronous)");
	flush();
	if (!n)
		return cudaSuccess;
	if (dd != on_device(dst, n) || sd != on_device(src, n))
		emu_die("cudaMemcpy: a pointer is not on the side its kind says");
	memmove(dst, src, n);
	return cudaSuccess;
}

extern "C" cudaError_t emu_cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                                           cudaStream_t s)
{
	int cap = emu_capturing(s);

	if (cap < 0 || (cap && (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost ||
	                        (kind == cudaMemcpyHostToDevice && n && !is_pinned(src, n))))) {
		emu_refuse_in_capture(cap < 0 ? "a copy into another stream than the capturing one"
		                              : "a copy to the host, or from pageable host memory");
		return cudaErrorStreamCaptureUnsupported;
	}
	if (cap) {                /* a node: the copy happens when the graph runs */
		if (n && (!on_device(dst, n) || (kind == cudaMemcpyDeviceToDevice && !on_device(src, n))))
			emu_die("cudaMemcpyAsync: a pointer is not on the side its kind says");
		emu_record_node([dst, src, n] { memmove(dst, src, n); });
		return cudaSuccess;
	}
	if (kind == cudaMemcpyHostToDevice && n && is_pinned(src, n)) {
		if (!on_device(dst, n))
			emu_die("cudaMemcpyAsync: a pointer is not on the side its kind says");
		pending.push_back(pending_copy{dst, src, n, copy_seq++});
		return cudaSuccess;
	}
	return emu_cudaMemcpy(dst, src, n, kind);
}

/* Row by row, each row a cudaMemcpyAsync of its own (checked the same way);
 * pitches below the width are refused, as CUDA does. */
extern "C" cudaError_t emu_cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                             size_t height, enum cudaMemcpyKind kind, cudaStream_t s)
{
	cudaError_t e;

	if (dpitch < width || spitch < width)
		return fail(cudaErrorInvalidValue);
	for (size_t i = 0; i < height; i++)
		if ((e = emu_cudaMemcpyAsync((char *)dst + i * dpitch, (const char *)src + i * spitch, width, kind, s)) !=
		    cudaSuccess)
			return e;
	return cudaSuccess;
}

extern "C" cudaError_t emu_cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s)
{
	int cap = emu_capturing(s);

	if (n && !on_device(p, n))
		emu_die("cudaMemsetAsync of host memory");
	if (cap < 0) {
		emu_refuse_in_capture("a memset into another stream than the capturing one");
		return cudaErrorStreamCaptureUnsupported;
	}
	if (cap) {
		emu_record_node([p, v, n] { memset(p, v, n); });
		return cudaSuccess;
	}
	flush();
	memset(p, v, n);
	return cudaSuccess;
}

extern "C" cudaError_t emu_cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
	mem_init();
	*free_bytes = mem_total - mem_used;
	*total_bytes = mem_total;
	return cudaSuccess;
}

/* ------------------------------------------------------------ cuBLAS */

struct emu_cublas {
	int unused;
};

extern "C" cublasStatus_t emu_cublasCreate(cublasHandle_t *h)
{
	*h = new emu_cublas();
	return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t emu_cublasDestroy(cublasHandle_t h)
{
	delete h;
	return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t emu_cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
	(void)h;
	(void)s;
	return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t emu_cublasSetMathMode(cublasHandle_t h, cublasMath_t mode)
{
	(void)h;
	return mode == CUBLAS_DEFAULT_MATH ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

extern "C" const char *emu_cublasGetStatusString(cublasStatus_t s)
{
	switch (s) {
	case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
	case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
	case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
	case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
	case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
	}
	return "unknown error";
}

static float elem(const void *p, cudaDataType t, size_t i)
{
	uint16_t h;
	uint32_t u;
	float f;

	if (t == CUDA_R_32F)
		return ((const float *)p)[i];
	h = ((const uint16_t *)p)[i];
	if (t == CUDA_R_16BF) {
		u = (uint32_t)h << 16;
		memcpy(&f, &u, 4);
		return f;
	}
	{                         /* IEEE half */
		uint32_t sign = (uint32_t)(h & 0x8000) << 16, ex = (h >> 10) & 0x1f, man = h & 0x3ff;
		if (ex == 0) {
			f = ldexpf((float)man, -24);
			return sign ? -f : f;
		}
		u = ex == 31 ? sign | 0x7f800000u | (man << 13) : sign | ((ex + 112) << 23) | (man << 13);
		memcpy(&f, &u, 4);
		return f;
	}
}

static size_t type_size(cudaDataType t)
{
	return t == CUDA_R_32F ? 4 : 2;
}

/* C (m, n) = alpha op(A) (m, k) op(B) (k, n) + beta C, column major, like
 * cuBLAS with the combinations hi3 uses: A and B of one type (32F, 16BF,
 * 16F), C 32F, fp32 compute. beta = 0 never reads C. */
extern "C" cublasStatus_t emu_cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                          int n, int k, const void *alpha, const void *A, cudaDataType at, int lda,
                                          const void *B, cudaDataType bt, int ldb, const void *beta, void *C,
                                          cudaDataType ct, int ldc, cublasComputeType_t compute,
                                          cublasGemmAlgo_t algo)
{
	const float al = *(const float *)alpha, be = *(const float *)beta;
	float *c = (float *)C;

	if (cap_stream) {
		emu_refuse_in_capture("cublasGemmEx (the emulator's cuBLAS does not capture)");
		return CUBLAS_STATUS_NOT_SUPPORTED;
	}
	flush();
	(void)h;
	(void)algo;
	if (at != bt || ct != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F ||
	    (at != CUDA_R_32F && at != CUDA_R_16BF && at != CUDA_R_16F))
		return CUBLAS_STATUS_NOT_SUPPORTED;
	if (m < 0 || n < 0 || k < 0 || lda < (ta == CUBLAS_OP_N ? m : k) || ldb < (tb == CUBLAS_OP_N ? k : n) ||
	    ldc < m || lda < 1 || ldb < 1 || ldc < 1)
		return CUBLAS_STATUS_INVALID_VALUE;
	if (!m || !n)
		return CUBLAS_STATUS_SUCCESS;
	if (!on_device(A, ((size_t)lda * (size_t)((ta == CUBLAS_OP_N ? k : m) - 1) + 1) * type_size(at)) ||
	    !on_device(B, ((size_t)ldb * (size_t)((tb == CUBLAS_OP_N ? n : k) - 1) + 1) * type_size(bt)) ||
	    !on_device(C, ((size_t)ldc * (size_t)(n - 1) + (size_t)m) * 4))
		emu_die("cublasGemmEx: a matrix is not in device memory");
	for (int j = 0; j < n; j++)
		for (int i = 0; i < m; i++) {
			float s = 0.0f;
			for (int l = 0; l < k; l++) {
				float a = elem(A, at, ta == CUBLAS_OP_N ? (size_t)i + (size_t)l * lda : (size_t)l + (size_t)i * lda);
				float b = elem(B, bt, tb == CUBLAS_OP_N ? (size_t)l + (size_t)j * ldb : (size_t)j + (size_t)l * ldb);
				s += a * b;
			}
			float *cij = c + (size_t)i + (size_t)j * ldc;
			*cij = be == 0.0f ? al * s : al * s + be * *cij;
		}
	return CUBLAS_STATUS_SUCCESS;
}

/* ------------------------------------------------------------ kernels */

enum { RUNNING, AT_WARP, AT_BLOCK, DONE };

struct fiber {
#if defined(__x86_64__)
	void *sp;                 /* the saved stack pointer */
#else
	ucontext_t ctx;
#endif
	char *stack;
	emu_thread t;
	int state, lane, warp;
	uint64_t xval, xres;      /* shuffle payload and result */
	int xsrc;                 /* shuffle source lane; -1 for __syncwarp */
	unsigned xmask;
	int bval;                 /* __syncthreads_or */
	void *fake_stack;         /* ASan's bookkeeping for this fiber */
};

#define STACK_SIZE (256 * 1024)
#define MAX_THREADS 1024

emu_thread *emu_cur;
#if defined(__x86_64__)
static void *sched_sp;
/* Save the callee-saved registers on this stack, store the stack pointer
 * in *from, switch to the stack `to` and restore the registers saved
 * there. A new fiber's stack holds zeros for them and its entry as the
 * return address. */
extern "C" void emu_switch(void **from, void *to);
__asm__(".pushsection .text\n"
        ".globl emu_switch\n"
        ".type emu_switch, @function\n"
        "emu_switch:\n"
        "\tpushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\tpushq %r14\n\tpushq %r15\n"
        "\tmovq %rsp, (%rdi)\n"
        "\tmovq %rsi, %rsp\n"
        "\tpopq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\tpopq %rbp\n"
        "\tret\n"
        ".size emu_switch, .-emu_switch\n"
        ".popsection\n");
#else
static ucontext_t sched_ctx;
#endif
static fiber *fibers;          /* [MAX_THREADS] */
static fiber *cur;
static int n_threads;
static const std::function<void()> *cur_body;
static std::vector<float> dyn_smem;
static std::map<const void *, int> smem_optin;   /* kernel -> opted-in dynamic shared bytes */
static uint64_t rng = 0x9e3779b97f4a7c15ULL;
#ifdef EMU_ASAN
static const void *sched_stack_bottom;
static size_t sched_stack_size;
#endif

static unsigned rnd(unsigned n)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (unsigned)(rng % n);
}

/* Switch from the current fiber back to the scheduler. */
static void to_scheduler(int dying)
{
#ifdef EMU_ASAN
	__sanitizer_start_switch_fiber(dying ? NULL : &cur->fake_stack, sched_stack_bottom, sched_stack_size);
#endif
#if defined(__x86_64__)
	(void)dying;
	emu_switch(&cur->sp, sched_sp);       /* never comes back when dying */
#else
	if (dying)
		return;               /* uc_link returns to the scheduler */
	swapcontext(&cur->ctx, &sched_ctx);
#endif
#ifdef EMU_ASAN
	__sanitizer_finish_switch_fiber(cur->fake_stack, NULL, NULL);
#endif
}

static void fiber_main(int idx)
{
	fiber *f = &fibers[idx];

#ifdef EMU_ASAN
	__sanitizer_finish_switch_fiber(NULL, &sched_stack_bottom, &sched_stack_size);
#endif
	(*cur_body)();
	f->state = DONE;
	to_scheduler(1);
}

#if defined(__x86_64__)
static void fiber_entry(void)
{
	fiber_main((int)(cur - fibers));
}
#endif

static void resume(fiber *f)
{
#ifdef EMU_ASAN
	void *fake = NULL;
	__sanitizer_start_switch_fiber(&fake, f->stack, STACK_SIZE);
#endif
	cur = f;
	emu_cur = &f->t;
#if defined(__x86_64__)
	emu_switch(&sched_sp, f->sp);
#else
	swapcontext(&sched_ctx, &f->ctx);
#endif
#ifdef EMU_ASAN
	__sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
}

void __syncthreads(void)
{
	cur->state = AT_BLOCK;
	cur->bval = 0;
	to_scheduler(0);
}

int __syncthreads_or(int v)
{
	cur->state = AT_BLOCK;
	cur->bval = v != 0;
	to_scheduler(0);
	return cur->bval;
}

void __syncwarp(unsigned mask)
{
	cur->state = AT_WARP;
	cur->xsrc = -1;
	cur->xmask = mask;
	to_scheduler(0);
}

uint64_t emu_shfl_bits(unsigned mask, uint64_t v, int src)
{
	cur->state = AT_WARP;
	cur->xval = v;
	cur->xsrc = src;
	cur->xmask = mask;
	to_scheduler(0);
	return cur->xres;
}

int emu_lane(void)
{
	return cur->lane;
}

void *emu_dyn_smem(void)
{
	return dyn_smem.data();
}

cudaError_t emu_func_attr(const void *kernel, int attr, int value)
{
	if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > 227 * 1024)
		return fail(cudaErrorInvalidValue);
	smem_optin[kernel] = value;
	return cudaSuccess;
}

static void kernel_bug(const char *what, const fiber *f)
{
	char msg[256];

	snprintf(msg, sizeof(msg), "kernel bug in block (%u, %u, %u): %s", f->t.bid.x, f->t.bid.y, f->t.bid.z, what);
	emu_die(msg);
}

/* Release the threads of a block waiting at barriers; 0 when none could be. */
static int release(void)
{
	int released = 0, live = 0, at_block = 0, any = 0;

	for (int w = 0; w * 32 < n_threads; w++) {
		fiber *lanes = fibers + w * 32;
		int wl = 0, wait = 0;
		for (int i = 0; i < 32; i++) {
			wl += lanes[i].state != DONE;
			wait += lanes[i].state == AT_WARP;
		}
		if (!wait || wait != wl)
			continue;
		if (wl != 32)
			kernel_bug("a warp shuffle or __syncwarp with lanes that have exited", &lanes[0]);
		for (int i = 0; i < 32; i++) {
			if (lanes[i].xmask != 0xffffffffu)
				kernel_bug("a warp operation with a partial mask", &lanes[i]);
			if ((lanes[i].xsrc < 0) != (lanes[0].xsrc < 0))
				kernel_bug("lanes of one warp at different warp operations", &lanes[i]);
		}
		for (int i = 0; i < 32; i++) {
			if (lanes[i].xsrc >= 0)
				lanes[i].xres = lanes[lanes[i].xsrc].xval;
			lanes[i].state = RUNNING;
		}
		released = 1;
	}
	if (released)
		return 1;
	for (int i = 0; i < n_threads; i++) {
		live += fibers[i].state != DONE;
		at_block += fibers[i].state == AT_BLOCK;
		any |= fibers[i].state == AT_BLOCK && fibers[i].bval;
	}
	if (!at_block)
		return 0;
	if (at_block != live)
		return 0;
	if (live != n_threads)
		kernel_bug("__syncthreads after some threads of the block have exited", &fibers[0]);
	for (int i = 0; i < n_threads; i++) {
		fibers[i].state = RUNNING;
		fibers[i].bval = any;
	}
	return 1;
}

static void run_block(dim3 grid, dim3 block, dim3 bid)
{
	std::vector<int> order((size_t)n_threads);

	for (int i = 0; i < n_threads; i++) {
		fiber *f = &fibers[i];
		f->t.tid = dim3((unsigned)i % block.x, ((unsigned)i / block.x) % block.y, (unsigned)i / (block.x * block.y));
		f->t.bid = bid;
		f->t.bdim = block;
		f->t.gdim = grid;
		f->state = RUNNING;
		f->lane = i % 32;
		f->warp = i / 32;
#if defined(__x86_64__)
		{             /* as if fiber_entry had been called: its entry sees rsp = 8 mod 16 */
			void **top = (void **)((uintptr_t)(f->stack + STACK_SIZE) & ~(uintptr_t)15);
			top[-1] = NULL;
			top[-2] = (void *)fiber_entry;
			for (int r = 3; r <= 8; r++)
				top[-r] = NULL;
			f->sp = top - 8;
		}
#else
		getcontext(&f->ctx);
		f->ctx.uc_stack.ss_sp = f->stack;
		f->ctx.uc_stack.ss_size = STACK_SIZE;
		f->ctx.uc_link = &sched_ctx;
		makecontext(&f->ctx, (void (*)(void))fiber_main, 1, i);
#endif
	}
	for (float &x : dyn_smem)
		x = NAN;              /* shared memory starts as garbage */
	for (;;) {
		int n = 0;
		for (int i = 0; i < n_threads; i++)
			if (fibers[i].state == RUNNING)
				order[(size_t)n++] = i;
		for (int i = n - 1; i > 0; i--)
			std::swap(order[(size_t)i], order[(size_t)rnd((unsigned)i + 1)]);
		for (int i = 0; i < n; i++)
			resume(&fibers[order[(size_t)i]]);
		if (release())
			continue;
		int done = 1;
		for (int i = 0; i < n_threads; i++)
			done &= fibers[i].state == DONE;
		if (done)
			return;
		kernel_bug("deadlock: threads wait at barriers that cannot all be reached", &fibers[0]);
	}
}

void emu_run_grid(const void *kernel, dim3 grid, dim3 block, size_t smem, const std::function<void()> &body)
{
	size_t threads = (size_t)block.x * block.y * block.z;
	auto opt = smem_optin.find(kernel);
	size_t smem_max = opt != smem_optin.end() && (size_t)opt->second > 48 * 1024 ? (size_t)opt->second : 48 * 1024;

	flush();                  /* the kernel sees every copy issued before it */
	if (in_graph)
		n_in_graphs++;
	else
		n_eager++;

	if (!threads || threads > MAX_THREADS || threads % 32 || !grid.x || !grid.y || !grid.z || grid.y > 65535 ||
	    grid.z > 65535 || smem > smem_max) {
		fail(cudaErrorInvalidConfiguration);
		return;
	}
	if (!fibers) {
		fibers = new fiber[MAX_THREADS]();
		for (int i = 0; i < MAX_THREADS; i++)
			if (!(fibers[i].stack = (char *)malloc(STACK_SIZE)))
				emu_die("out of memory for fiber stacks");
	}
	n_threads = (int)threads;
	cur_body = &body;
	dyn_smem.assign((smem + sizeof(float) - 1) / sizeof(float) + 1, 0.0f);
	for (unsigned z = 0; z < grid.z; z++)
		for (unsigned y = 0; y < grid.y; y++)
			for (unsigned x = 0; x < grid.x; x++)
				run_block(grid, block, dim3(x, y, z));
	emu_cur = NULL;
	cur = NULL;
}

/* ------------------------------------------------------------ graphs */

struct emu_graph {
	std::vector<std::function<void()>> nodes;
};

struct emu_graph_exec {
	std::vector<std::function<void()>> nodes;
};

extern "C" cudaError_t emu_cudaDriverGetVersion(int *v)
{
	*v = 12080;
	return cudaSuccess;
}

extern "C" cudaError_t emu_cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
	if (cap_stream || !s)     /* one capture at a time, never the legacy stream */
		return fail(cudaErrorIllegalState);
	if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal)
		return fail(cudaErrorInvalidValue);
	flush();                  /* copies issued before the capture are not part of it */
	cap_stream = s;
	cap_invalid = 0;
	cap_nodes.clear();
	return cudaSuccess;
}

extern "C" cudaError_t emu_cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
	*g = NULL;
	if (s != cap_stream)
		return fail(cudaErrorIllegalState);
	cap_stream = NULL;
	if (cap_invalid) {
		cap_nodes.clear();
		return fail(cudaErrorStreamCaptureInvalidated);
	}
	*g = new emu_graph();
	(*g)->nodes.swap(cap_nodes);
	return cudaSuccess;
}

extern "C" cudaError_t emu_cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags)
{
	NOT_IN_CAPTURE("cudaGraphInstantiate");
	if (!g || flags)
		return fail(cudaErrorInvalidValue);
	*e = new emu_graph_exec();
	(*e)->nodes = g->nodes;
	return cudaSuccess;
}

extern "C" cudaError_t emu_cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s)
{
	(void)s;
	NOT_IN_CAPTURE("cudaGraphLaunch");
	if (!e)
		return fail(cudaErrorInvalidValue);
	flush();
	n_graph_launches++;
	in_graph = 1;
	for (auto &node : e->nodes)
		node();
	in_graph = 0;
	return cudaSuccess;
}

extern "C" cudaError_t emu_cudaGraphExecDestroy(cudaGraphExec_t e)
{
	delete e;
	return cudaSuccess;
}

extern "C" cudaError_t emu_cudaGraphDestroy(cudaGraph_t g)
{
	delete g;
	return cudaSuccess;
}
