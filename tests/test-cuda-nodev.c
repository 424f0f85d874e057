/*
 * test-cuda-nodev.c -- on a machine without a GPU or driver, --backend cuda
 * fails with status 1 and a message that names the cause (the error of
 * cudaGetDeviceCount), both when the backend is made directly and when a
 * model is opened with it, as `hi3 --backend cuda ...` does. Skipped where
 * a GPU is present. cuBLAS is not linked but loaded when a backend is
 * made: it is not in the process before, and hi3i_cublas_load finds every
 * entry the backend calls in the toolkit's libcublas.
 */
#include "hi3.h"
#include "config.h"
#include <stdio.h>
#include <string.h>
#include "backend/backend.h"
#include "tap.h"
#include "cuda-test.h"
#include "testdir.h"

/* 1 when a library whose path contains NAME is mapped into this process */
static int mapped(const char *name)
{
	char line[4096];
	int found = 0;
	FILE *f = fopen("/proc/self/maps", "r");

	if (!f)
		return -1;
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, name) != NULL;
	fclose(f);
	return found;
}

int main(void)
{
	hi3_backend *be = NULL;
	hi3_model *m = NULL;
	hi3_error err = {0}, merr = {0};
	hi3_init_opts io = {.preset = "tiny", .seed = 1, .dtype = HI3_F32};
	hi3_model_opts mo = {.backend = "cuda"};
	char *dir;
	int blas_at_start = mapped("libcublas");

	if (hi3i_backend_cuda(&be, 0, 1, &err) == 0) {
		printf("1..0 # SKIP a CUDA device is present\n");
		be->ops->destroy(be);
		return 0;
	}
	diag("--backend cuda here: %s", err.msg);
	ok(be == NULL && err.status == HI3_ERR_RUNTIME, "backend creation fails with status 1 (got %d)", err.status);
	ok(strstr(err.msg, "--backend cuda: no CUDA device available") != NULL, "the message says so: %s", err.msg);
	ok(strstr(err.msg, "cudaGetDeviceCount") != NULL && strstr(err.msg, "(cuda") != NULL,
	   "and names the cause, the error of cudaGetDeviceCount");

	if (!(dir = testdir_new("cuda-nodev")))
		return 1;
	ok(hi3_init_model(dir, &io, &merr) == 0, "a tiny model to open %s", merr.msg);
	ok(hi3_model_open(&m, dir, &mo, &merr) == -1 && m == NULL, "hi3_model_open with backend cuda fails");
	ok(merr.status == HI3_ERR_RUNTIME && !strcmp(merr.msg, err.msg), "with status %d and the same message: %s",
	   merr.status, merr.msg);
	testdir_done(dir);

	ok(blas_at_start == 0 && mapped("libcublas") == 0, "cuBLAS is not loaded with libhi3, nor by a failed backend");
	err = (hi3_error){0};
	ok(hi3i_cublas_load(&err) == 0, "hi3i_cublas_load finds libcublas and every entry %s", err.msg);
	ok(mapped("libcublas") == 1 && hi3i_cublas_load(&err) == 0, "it is loaded now, and a second call is a no-op");
	return done_testing();
}
