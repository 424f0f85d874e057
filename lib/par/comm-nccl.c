/*
 * comm-nccl.c -- the NCCL communicator (device buffers), one GPU per rank,
 * bootstrapped over MPI: every rank picks its device (local rank modulo
 * the visible ones), the ranks tell each other their host and GPU (NCCL
 * refuses two ranks of one communicator on one GPU, so then none is made
 * and the caller exchanges through host buffers), rank 0 makes the unique
 * id, the MPI communicator broadcasts it, every rank joins with
 * ncclCommInitRank.
 *
 * Built into hi3-mpi when configure finds CUDA and NCCL (HI3_HAVE_NCCL);
 * otherwise hi3_comm_nccl_open says so. Every call runs on the
 * communicator's own stream and waits for it, so a caller may reuse its
 * buffers as soon as a call returns.
 *
 * Not run on hardware in this tree's CI (no GPU); the GPU run
 * (scripts/gpu-run.sh) runs its suite where GPUs are present.
 */
#include "config.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "par/comm-mpi.h"

#ifdef HI3_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

struct nccl_ctx {
	ncclComm_t comm;
	cudaStream_t stream;
	hi3_comm *mpi;
};

static int nccl_fail(ncclResult_t r, const char *what, hi3_error *err)
{
	return hi3_error_set(err, HI3_ERR_RUNTIME, "NCCL %s failed: %s", what, ncclGetErrorString(r));
}

#define NCCL_OK(call, what)                              \
	do {                                             \
		ncclResult_t r_ = (call);                \
		if (r_ != ncclSuccess)                   \
			return nccl_fail(r_, what, err); \
	} while (0)

static int wait_stream(struct nccl_ctx *x, const char *what, hi3_error *err)
{
	cudaError_t e = cudaStreamSynchronize(x->stream);

	if (e != cudaSuccess)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "NCCL %s: %s", what, cudaGetErrorString(e));
	return 0;
}

static int nccl_allgather(hi3_comm *c, const void *send, size_t n, void *recv, hi3_error *err)
{
	struct nccl_ctx *x = c->ctx;

	NCCL_OK(ncclAllGather(send, recv, n, ncclChar, x->comm, x->stream), "allgather");
	return wait_stream(x, "allgather", err);
}

/* One broadcast per root in a group: NCCL has no all-gather-v. */
static int nccl_allgatherv(hi3_comm *c, const void *send, size_t n, void *recv, const size_t *counts,
                           const size_t *displs, hi3_error *err)
{
	struct nccl_ctx *x = c->ctx;

	if (n != counts[c->rank])
		return hi3_error_set(err, HI3_ERR_USAGE, "allgatherv: rank %d sends %zu bytes, the counts say %zu", c->rank,
		                     n, counts[c->rank]);
	NCCL_OK(ncclGroupStart(), "group start");
	for (int r = 0; r < c->size; r++)
		if (counts[r])
			NCCL_OK(ncclBroadcast(r == c->rank ? send : (char *)recv + displs[r], (char *)recv + displs[r],
			                      counts[r], ncclChar, r, x->comm, x->stream), "allgatherv");
	NCCL_OK(ncclGroupEnd(), "group end");
	return wait_stream(x, "allgatherv", err);
}

static int nccl_alltoallv(hi3_comm *c, const void *send, const size_t *scounts, const size_t *sdispls, void *recv,
                          const size_t *rcounts, const size_t *rdispls, hi3_error *err)
{
	struct nccl_ctx *x = c->ctx;

	NCCL_OK(ncclGroupStart(), "group start");
	for (int r = 0; r < c->size; r++) {
		if (scounts[r])
			NCCL_OK(ncclSend((const char *)send + sdispls[r], scounts[r], ncclChar, r, x->comm, x->stream),
			        "send");
		if (rcounts[r])
			NCCL_OK(ncclRecv((char *)recv + rdispls[r], rcounts[r], ncclChar, r, x->comm, x->stream), "recv");
	}
	NCCL_OK(ncclGroupEnd(), "group end");
	return wait_stream(x, "alltoallv", err);
}

static int nccl_bcast(hi3_comm *c, void *buf, size_t n, int root, hi3_error *err)
{
	struct nccl_ctx *x = c->ctx;

	NCCL_OK(ncclBroadcast(buf, buf, n, ncclChar, root, x->comm, x->stream), "bcast");
	return wait_stream(x, "bcast", err);
}

static int nccl_barrier(hi3_comm *c, hi3_error *err)
{
	struct nccl_ctx *x = c->ctx;

	/* the host side: NCCL's own ordering lives on the stream */
	if (wait_stream(x, "barrier", err) != 0)
		return -1;
	return x->mpi->ops->barrier(x->mpi, err);
}

static void nccl_abort(hi3_comm *c, int status, const char *msg)
{
	struct nccl_ctx *x = c->ctx;

	ncclCommAbort(x->comm);
	x->mpi->ops->abort(x->mpi, status, msg);
}

static void nccl_destroy(hi3_comm *c)
{
	struct nccl_ctx *x = c->ctx;

	ncclCommDestroy(x->comm);
	cudaStreamDestroy(x->stream);
	free(x);
	free(c);
}

static const struct hi3_comm_ops nccl_ops = {
	.allgather = nccl_allgather,
	.allgatherv = nccl_allgatherv,
	.alltoallv = nccl_alltoallv,
	.bcast = nccl_bcast,
	.barrier = nccl_barrier,
	.abort = nccl_abort,
	.destroy = nccl_destroy,
};

/* The launcher's rank of this process on its host (Open MPI, MPICH/Hydra,
 * Slurm), or the world rank. */
static int local_rank(const hi3_comm *mpi)
{
	static const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"};

	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		const char *v = getenv(vars[i]);
		if (v && *v)
			return atoi(v);
	}
	return mpi->rank;
}

#define WHERE_LEN 192

/* Choose this rank's GPU and learn whether any two ranks share one: 0
 * (distinct GPUs), 1 (shared), or -1 with err naming the first rank that
 * could not choose one (every rank returns the same). */
static int choose_device(hi3_comm *mpi, hi3_error *err)
{
	char mine[WHERE_LEN] = {0}, bus[32] = "", host[64] = "", *all;
	int ndev = 0, dev, rc = 0;
	cudaError_t e;

	if ((e = cudaGetDeviceCount(&ndev)) != cudaSuccess || ndev < 1) {
		snprintf(mine, sizeof(mine), "!no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
	} else if ((e = cudaSetDevice(dev = local_rank(mpi) % ndev)) != cudaSuccess ||
	           (e = cudaDeviceGetPCIBusId(bus, sizeof(bus), dev)) != cudaSuccess) {
		snprintf(mine, sizeof(mine), "!device %d: %s", dev, cudaGetErrorString(e));
	} else {
		gethostname(host, sizeof(host) - 1);
		snprintf(mine, sizeof(mine), "%s %s", host, bus);
	}
	if (!(all = calloc((size_t)mpi->size, WHERE_LEN)))
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	if (hi3_comm_allgather(mpi, mine, WHERE_LEN, all, err) != 0) {
		free(all);
		return hi3_error_prefix(err, "NCCL bootstrap");
	}
	for (int r = 0; r < mpi->size && rc == 0; r++) {
		const char *w = all + (size_t)r * WHERE_LEN;
		if (w[0] == '!') {
			rc = hi3_error_set(err, HI3_ERR_RUNTIME, "NCCL: rank %d: %s", r, w + 1);
			break;
		}
		for (int q = 0; q < r; q++)
			if (!strcmp(w, all + (size_t)q * WHERE_LEN)) {
				hi3_log(HI3_LOG_INFO, "NCCL: ranks %d and %d share the GPU %s, which NCCL refuses: the "
				        "activations go through host buffers (MPI)", q, r, w);
				rc = 1;
				break;
			}
	}
	free(all);
	return rc;
}

int hi3_comm_nccl_open(hi3_comm **out, hi3_comm *mpi, hi3_error *err)
{
	ncclUniqueId id;
	hi3_comm *c = NULL;
	struct nccl_ctx *x = NULL;
	ncclResult_t r;
	cudaError_t e;
	int rc;

	*out = NULL;
	if ((rc = choose_device(mpi, err)) != 0)
		return rc;
	memset(&id, 0, sizeof(id));
	if (mpi->rank == 0 && (r = ncclGetUniqueId(&id)) != ncclSuccess)
		return nccl_fail(r, "unique id", err);
	if (hi3_comm_bcast(mpi, &id, sizeof(id), 0, err) != 0)
		return hi3_error_prefix(err, "NCCL bootstrap");
	c = calloc(1, sizeof(*c));
	x = calloc(1, sizeof(*x));
	if (!c || !x) {
		free(c);
		free(x);
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	}
	x->mpi = mpi;
	if ((e = cudaStreamCreate(&x->stream)) != cudaSuccess) {
		free(c);
		free(x);
		return hi3_error_set(err, HI3_ERR_RUNTIME, "NCCL: stream: %s", cudaGetErrorString(e));
	}
	if ((r = ncclCommInitRank(&x->comm, mpi->size, id, mpi->rank)) != ncclSuccess) {
		cudaStreamDestroy(x->stream);
		free(c);
		free(x);
		return nccl_fail(r, "init", err);
	}
	*c = (hi3_comm){.ops = &nccl_ops, .name = "nccl", .rank = mpi->rank, .size = mpi->size, .device = 1, .ctx = x};
	*out = c;
	return 0;
}

#else

int hi3_comm_nccl_open(hi3_comm **out, hi3_comm *mpi, hi3_error *err)
{
	(void)mpi;
	(void)err;
	*out = NULL;
	hi3_log(HI3_LOG_DEBUG, "this hi3-mpi was built without NCCL (configure found no CUDA with nccl.h and "
	        "libnccl): the activations go through host buffers (MPI)");
	return 1;
}

#endif
