/*
 * bench-cuda-peak.c -- what this GPU reaches, measured in the same run as
 * the model benchmarks (scripts/gpu-run.sh), to set their fractions
 * against:
 *  - device-to-device copy bandwidth, (bytes read + bytes written) / time:
 *    the memory roof of decode;
 *  - cublasGemmEx with bf16 inputs, fp32 accumulation and f32 output in the
 *    layout the backend uses (y (M, N) = x (M, K) . W^T), on a large square
 *    and on the shapes given with --shape M,N,K: the GEMM roof of prefill;
 *  - the same in plain fp32 (the exactness path), on the square.
 *
 *   bench-cuda-peak [--shape M,N,K]...
 *
 * Prints one line per measurement, then
 *   PEAK copy_gbs=... gemm_bf16_tflops=... gemm_f32_tflops=...
 * (the bf16 figure is the best over all shapes).
 */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                                  \
	do {                                                                                         \
		cudaError_t e_ = (call);                                                             \
		if (e_ != cudaSuccess) {                                                             \
			fprintf(stderr, "bench-cuda-peak: %s: %s\n", #call, cudaGetErrorString(e_)); \
			exit(1);                                                                     \
		}                                                                                    \
	} while (0)
#define BLAS(call)                                                                                         \
	do {                                                                                               \
		cublasStatus_t s_ = (call);                                                                \
		if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
			fprintf(stderr, "bench-cuda-peak: %s: %s\n", #call, cublasGetStatusString(s_));    \
			exit(1);                                                                           \
		}                                                                                          \
	} while (0)

static cudaStream_t stream;
static cublasHandle_t blas;

static float elapsed_ms(cudaEvent_t a, cudaEvent_t b)
{
	float ms = 0.0f;

	CHECK(cudaEventSynchronize(b));
	CHECK(cudaEventElapsedTime(&ms, a, b));
	return ms;
}

static double copy_gbs(void)
{
	const size_t n = (size_t)1 << 30;
	const int reps = 20;
	void *a, *b;
	cudaEvent_t e0, e1;
	double gbs;

	CHECK(cudaMalloc(&a, n));
	CHECK(cudaMalloc(&b, n));
	CHECK(cudaMemsetAsync(a, 1, n, stream));
	CHECK(cudaEventCreate(&e0));
	CHECK(cudaEventCreate(&e1));
	CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, stream));     /* warm-up */
	CHECK(cudaEventRecord(e0, stream));
	for (int i = 0; i < reps; i++)
		CHECK(cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, n, cudaMemcpyDeviceToDevice, stream));
	CHECK(cudaEventRecord(e1, stream));
	gbs = 2.0 * (double)n * reps / (elapsed_ms(e0, e1) * 1e-3) / 1e9;
	printf("COPY bytes=%zu reps=%d gbs=%.1f\n", n, reps, gbs);
	CHECK(cudaFree(a));
	CHECK(cudaFree(b));
	CHECK(cudaEventDestroy(e0));
	CHECK(cudaEventDestroy(e1));
	return gbs;
}

/* Random bf16 or f32 values on the device. */
static void *dev_random(size_t n, int bf16)
{
	size_t es = bf16 ? 2 : 4;
	unsigned char *h = malloc(n * es);
	uint32_t s = 12345;
	void *d;

	if (!h) {
		fprintf(stderr, "bench-cuda-peak: out of memory\n");
		exit(1);
	}
	for (size_t i = 0; i < n; i++) {
		float f;
		uint32_t u;
		s = s * 1664525u + 1013904223u;
		f = ((float)(s >> 8) / 16777216.0f - 0.5f) * 0.1f;
		memcpy(&u, &f, 4);
		if (bf16)
			((uint16_t *)h)[i] = (uint16_t)(u >> 16);
		else
			((float *)h)[i] = f;
	}
	CHECK(cudaMalloc(&d, n * es));
	CHECK(cudaMemcpy(d, h, n * es, cudaMemcpyHostToDevice));
	free(h);
	return d;
}

/* TFLOP/s of y (M, N) = x (M, K) . W^T, as the backend calls it. */
static double gemm_tflops(int M, int N, int K, int bf16)
{
	const float one = 1.0f, zero = 0.0f;
	const cudaDataType t = bf16 ? CUDA_R_16BF : CUDA_R_32F;
	void *w = dev_random((size_t)N * K, bf16), *x = dev_random((size_t)M * K, bf16), *y;
	double flop = 2.0 * M * N * K, tf;
	int reps = 1;
	cudaEvent_t e0, e1;
	float ms;

	CHECK(cudaMalloc(&y, (size_t)M * N * sizeof(float)));
	CHECK(cudaEventCreate(&e0));
	CHECK(cudaEventCreate(&e1));
	for (int i = 0; i < 3; i++)               /* warm-up: heuristics, clocks */
		BLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, w, t, K, x, t, K, &zero, y, CUDA_R_32F, N,
		                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
	CHECK(cudaEventRecord(e0, stream));
	BLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, w, t, K, x, t, K, &zero, y, CUDA_R_32F, N,
	                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
	CHECK(cudaEventRecord(e1, stream));
	ms = elapsed_ms(e0, e1);
	reps = ms > 0.0f ? (int)(200.0f / ms) : 100;       /* about 0.2 s of work */
	reps = reps < 3 ? 3 : reps > 1000 ? 1000 : reps;
	CHECK(cudaEventRecord(e0, stream));
	for (int i = 0; i < reps; i++)
		BLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, w, t, K, x, t, K, &zero, y, CUDA_R_32F, N,
		                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
	CHECK(cudaEventRecord(e1, stream));
	tf = flop * reps / (elapsed_ms(e0, e1) * 1e-3) / 1e12;
	printf("GEMM %s M=%d N=%d K=%d reps=%d tflops=%.2f\n", bf16 ? "bf16" : "f32", M, N, K, reps, tf);
	CHECK(cudaFree(w));
	CHECK(cudaFree(x));
	CHECK(cudaFree(y));
	CHECK(cudaEventDestroy(e0));
	CHECK(cudaEventDestroy(e1));
	return tf;
}

int main(int argc, char **argv)
{
	double copy, bf = 0.0, f32, t;
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
		fprintf(stderr, "bench-cuda-peak: no CUDA device\n");
		return 1;
	}
	CHECK(cudaStreamCreate(&stream));
	BLAS(cublasCreate(&blas));
	BLAS(cublasSetStream(blas, stream));
	BLAS(cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH));
	copy = copy_gbs();
	bf = gemm_tflops(8192, 8192, 8192, 1);
	for (int i = 1; i < argc; i++) {
		int M, N, K;
		char tail;
		if (strcmp(argv[i], "--shape") || i + 1 >= argc ||
		    sscanf(argv[i + 1], "%d,%d,%d%c", &M, &N, &K, &tail) != 3 || M < 1 || N < 1 || K < 1) {
			fprintf(stderr, "usage: bench-cuda-peak [--shape M,N,K]...\n");
			return 2;
		}
		i++;
		if ((t = gemm_tflops(M, N, K, 1)) > bf)
			bf = t;
	}
	f32 = gemm_tflops(8192, 8192, 8192, 0);
	printf("PEAK copy_gbs=%.1f gemm_bf16_tflops=%.2f gemm_f32_tflops=%.2f\n", copy, bf, f32);
	cublasDestroy(blas);
	cudaStreamDestroy(stream);
	return 0;
}
