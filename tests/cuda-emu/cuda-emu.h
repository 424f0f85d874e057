/*
 * cuda-emu.h -- the part of the CUDA runtime and cuBLAS that hi3 uses, run
 * on the CPU (emu.cc), so `make check` can test the CUDA backend's host code
 * and kernels without a GPU. Not a general emulator: the names are macros
 * onto emu_* functions so a program can hold both this and libcudart.
 *
 * Included by kernels/kernels.h when HI3_CUDA_EMU is defined; kernels are
 * compiled as C++ with emu-kernel.h forced in front (-include).
 */
#ifndef HI3_CUDA_EMU_H
#define HI3_CUDA_EMU_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
	cudaErrorInvalidConfiguration = 9,
	cudaErrorNoDevice = 100,
	cudaErrorIllegalState = 401,
	cudaErrorStreamCaptureUnsupported = 900,
	cudaErrorStreamCaptureInvalidated = 901,
	cudaErrorStreamCaptureImplicit = 906,
} cudaError_t;

typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;
typedef struct emu_graph *cudaGraph_t;
typedef struct emu_graph_exec *cudaGraphExec_t;

enum cudaStreamCaptureMode {
	cudaStreamCaptureModeGlobal = 0,
	cudaStreamCaptureModeThreadLocal = 1,
	cudaStreamCaptureModeRelaxed = 2,
};

enum cudaMemcpyKind {
	cudaMemcpyHostToHost = 0,
	cudaMemcpyHostToDevice = 1,
	cudaMemcpyDeviceToHost = 2,
	cudaMemcpyDeviceToDevice = 3,
};

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

#define cudaStreamNonBlocking 0x01
#define cudaHostAllocDefault 0x00
#define cudaEventDisableTiming 0x02

struct cudaDeviceProp {
	char name[256];
	size_t totalGlobalMem;
	int multiProcessorCount;
	int major, minor;
};

#define cudaGetDeviceCount emu_cudaGetDeviceCount
#define cudaSetDevice emu_cudaSetDevice
#define cudaGetDevice emu_cudaGetDevice
#define cudaGetDeviceProperties emu_cudaGetDeviceProperties
#define cudaStreamCreateWithFlags emu_cudaStreamCreateWithFlags
#define cudaStreamDestroy emu_cudaStreamDestroy
#define cudaStreamSynchronize emu_cudaStreamSynchronize
#define cudaMalloc emu_cudaMalloc
#define cudaFree emu_cudaFree
#define cudaHostAlloc emu_cudaHostAlloc
#define cudaFreeHost emu_cudaFreeHost
#define cudaMemcpy emu_cudaMemcpy
#define cudaMemcpyAsync emu_cudaMemcpyAsync
#define cudaMemcpy2DAsync emu_cudaMemcpy2DAsync
#define cudaMemsetAsync emu_cudaMemsetAsync
#define cudaMemGetInfo emu_cudaMemGetInfo
#define cudaEventCreateWithFlags emu_cudaEventCreateWithFlags
#define cudaEventDestroy emu_cudaEventDestroy
#define cudaEventRecord emu_cudaEventRecord
#define cudaEventSynchronize emu_cudaEventSynchronize
#define cudaGetLastError emu_cudaGetLastError
#define cudaDriverGetVersion emu_cudaDriverGetVersion
#define cudaStreamBeginCapture emu_cudaStreamBeginCapture
#define cudaStreamEndCapture emu_cudaStreamEndCapture
#define cudaGraphInstantiate emu_cudaGraphInstantiate
#define cudaGraphLaunch emu_cudaGraphLaunch
#define cudaGraphExecDestroy emu_cudaGraphExecDestroy
#define cudaGraphDestroy emu_cudaGraphDestroy
#define cudaGetErrorString emu_cudaGetErrorString
#define cudaGetErrorName emu_cudaGetErrorName

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaGetLastError(void);
/* Stream capture and graphs (CUDA 12 signatures). Capture records kernel
 * launches, device-to-device and pinned host-to-device copies and memsets
 * of the capturing stream; any other stream call, synchronisation,
 * allocation, free or cuBLAS call while a stream captures is refused
 * (cudaErrorStreamCaptureUnsupported) and invalidates the capture, whose
 * end then fails (cudaErrorStreamCaptureInvalidated): nothing runs eagerly
 * in its place. A launched graph runs its nodes in order. */
cudaError_t cudaDriverGetVersion(int *v);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);

/* cuBLAS: column-major GEMM, the types hi3 uses. */
typedef struct emu_cublas *cublasHandle_t;
typedef enum {
	CUBLAS_STATUS_SUCCESS = 0,
	CUBLAS_STATUS_NOT_INITIALIZED = 1,
	CUBLAS_STATUS_ALLOC_FAILED = 3,
	CUBLAS_STATUS_INVALID_VALUE = 7,
	CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0 } cublasMath_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

#define cublasCreate emu_cublasCreate
#define cublasDestroy emu_cublasDestroy
#define cublasSetStream emu_cublasSetStream
#define cublasSetMathMode emu_cublasSetMathMode
#define cublasGemmEx emu_cublasGemmEx
#define cublasGetStatusString emu_cublasGetStatusString

cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode);
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                            cudaDataType bt, int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo);
const char *cublasGetStatusString(cublasStatus_t s);

/* Test hooks: how much device memory the emulated GPU has (default 4 GiB,
 * or HI3_EMU_MEM_MB), and how many bytes are allocated now. */
void emu_set_device_memory(size_t total);
size_t emu_device_used(void);
/* Kernels run so far: launched eagerly, and run by graph launches; graph
 * launches. HI3_EMU_STATS=FILE appends them to FILE at exit, one line:
 * "kernels_eager=N kernels_in_graphs=N graph_launches=N". */
void emu_kernel_counts(unsigned long long *eager, unsigned long long *in_graphs, unsigned long long *launches);

#ifdef __cplusplus
}
#endif
#endif
