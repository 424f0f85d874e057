/* backend-cuda.c -- host side of the CUDA backend (kernels/ hold the device
 * code). Until the CUDA ops exist, --backend cuda reports why it cannot run. */
#include "config.h"
#include "backend.h"

int hi3i_backend_cuda(hi3_backend **out, int threads, int batch_invariant, hi3_error *err)
{
	(void)threads;
	(void)batch_invariant;
	*out = NULL;
#ifdef HI3_HAVE_CUDA
	return hi3_error_set(err, HI3_ERR_RUNTIME, "--backend cuda: the CUDA backend is not implemented yet");
#else
	return hi3_error_set(err, HI3_ERR_RUNTIME, "--backend cuda: this hi3 was built without CUDA "
	                     "(nvcc/cuBLAS were not found by ./configure)");
#endif
}
