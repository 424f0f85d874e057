/*
 * comm-mpi.c -- the MPI communicator (host buffers) over MPI_COMM_WORLD.
 *
 * Built into the hi3-mpi program only (Makefile.am), never into libhi3, so
 * that libhi3 and the plain hi3 carry no MPI run-time dependency.
 *
 * Errors: MPI_ERRORS_RETURN on the world communicator, so a failed call
 * comes back as an hi3_error with MPI's own message; a rank that dies is
 * noticed by the launcher (Open MPI's mpirun names it and ends the rest);
 * a rank that fails on its own calls abort, which prints the message and
 * MPI_Abort()s every rank.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <mpi.h>
#include "par/comm-mpi.h"

static int mpi_fail(int rc, const char *what, hi3_error *err)
{
	char msg[MPI_MAX_ERROR_STRING];
	int n = 0;

	if (MPI_Error_string(rc, msg, &n) != MPI_SUCCESS)
		snprintf(msg, sizeof(msg), "error %d", rc);
	return hi3_error_set(err, HI3_ERR_RUNTIME, "MPI %s failed: %s", what, msg);
}

#define MPI_OK(call, what)                              \
	do {                                            \
		int rc_ = (call);                       \
		if (rc_ != MPI_SUCCESS)                 \
			return mpi_fail(rc_, what, err); \
	} while (0)

/* MPI counts are int: convert per-rank byte counts, refusing larger ones. */
static int to_int(int size, const size_t *in, int *out, const char *what, hi3_error *err)
{
	for (int r = 0; r < size; r++) {
		if (in[r] > INT_MAX)
			return hi3_error_set(err, HI3_ERR_RUNTIME, "MPI %s: %zu bytes for rank %d, more than MPI's int "
			                     "counts hold", what, in[r], r);
		out[r] = (int)in[r];
	}
	return 0;
}

static int mpi_allgather(hi3_comm *c, const void *send, size_t n, void *recv, hi3_error *err)
{
	(void)c;
	if (n > INT_MAX)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "MPI allgather: %zu bytes per rank is too many", n);
	MPI_OK(MPI_Allgather(send, (int)n, MPI_BYTE, recv, (int)n, MPI_BYTE, MPI_COMM_WORLD), "allgather");
	return 0;
}

static int mpi_allgatherv(hi3_comm *c, const void *send, size_t n, void *recv, const size_t *counts,
                          const size_t *displs, hi3_error *err)
{
	int *ic = calloc((size_t)c->size * 2, sizeof(int)), rc = -1;

	if (!ic)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	if (n != counts[c->rank]) {
		hi3_error_set(err, HI3_ERR_USAGE, "allgatherv: rank %d sends %zu bytes, the counts say %zu", c->rank, n,
		              counts[c->rank]);
	} else if (!to_int(c->size, counts, ic, "allgatherv", err) &&
	           !to_int(c->size, displs, ic + c->size, "allgatherv", err)) {
		int r = MPI_Allgatherv(send, (int)n, MPI_BYTE, recv, ic, ic + c->size, MPI_BYTE, MPI_COMM_WORLD);
		rc = r == MPI_SUCCESS ? 0 : mpi_fail(r, "allgatherv", err);
	}
	free(ic);
	return rc;
}

static int mpi_alltoallv(hi3_comm *c, const void *send, const size_t *scounts, const size_t *sdispls, void *recv,
                         const size_t *rcounts, const size_t *rdispls, hi3_error *err)
{
	int *ic = calloc((size_t)c->size * 4, sizeof(int)), rc = -1, n = c->size;

	if (!ic)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	if (!to_int(n, scounts, ic, "alltoallv", err) && !to_int(n, sdispls, ic + n, "alltoallv", err) &&
	    !to_int(n, rcounts, ic + 2 * n, "alltoallv", err) && !to_int(n, rdispls, ic + 3 * n, "alltoallv", err)) {
		int r = MPI_Alltoallv(send, ic, ic + n, MPI_BYTE, recv, ic + 2 * n, ic + 3 * n, MPI_BYTE, MPI_COMM_WORLD);
		rc = r == MPI_SUCCESS ? 0 : mpi_fail(r, "alltoallv", err);
	}
	free(ic);
	return rc;
}

static int mpi_bcast(hi3_comm *c, void *buf, size_t n, int root, hi3_error *err)
{
	(void)c;
	if (n > INT_MAX)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "MPI bcast: %zu bytes is too many", n);
	MPI_OK(MPI_Bcast(buf, (int)n, MPI_BYTE, root, MPI_COMM_WORLD), "bcast");
	return 0;
}

static int mpi_barrier(hi3_comm *c, hi3_error *err)
{
	(void)c;
	MPI_OK(MPI_Barrier(MPI_COMM_WORLD), "barrier");
	return 0;
}

static void mpi_abort(hi3_comm *c, int status, const char *msg)
{
	if (msg)
		fprintf(stderr, "hi3-mpi: rank %d of %d: %s\n", c->rank, c->size, msg);
	fflush(stderr);
	MPI_Abort(MPI_COMM_WORLD, status ? status : 1);
	exit(status ? status : 1);
}

static void mpi_destroy(hi3_comm *c)
{
	int fin = 0;

	if (c->device) {          /* the device view (hi3_comm_mpi_device): MPI stays the host one's */
		free(c);
		return;
	}
	if (MPI_Finalized(&fin) == MPI_SUCCESS && !fin)
		MPI_Finalize();
	free(c);
}

static const struct hi3_comm_ops mpi_ops = {
	.allgather = mpi_allgather,
	.allgatherv = mpi_allgatherv,
	.alltoallv = mpi_alltoallv,
	.bcast = mpi_bcast,
	.barrier = mpi_barrier,
	.abort = mpi_abort,
	.destroy = mpi_destroy,
};

int hi3_comm_mpi_launched(void)
{
	/* Open MPI, MPICH/Hydra, Slurm's PMI: each sets one of these in every rank */
	static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"};

	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
		if (getenv(vars[i]))
			return 1;
	return 0;
}

int hi3_comm_mpi_open(hi3_comm **out, int *argc, char ***argv, hi3_error *err)
{
	hi3_comm *c;
	int rc;

	*out = NULL;
	if (!hi3_comm_mpi_launched())
		return hi3_error_set(err, HI3_ERR_USAGE, "--parallel: not started by an MPI launcher (run it as "
		                     "'mpirun -np N hi3-mpi ... --parallel tp=T,ep=E'; see hi3-parallel(7))");
	if ((rc = MPI_Init(argc, argv)) != MPI_SUCCESS)
		return mpi_fail(rc, "init", err);
	MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
	if (!(c = calloc(1, sizeof(*c)))) {
		MPI_Finalize();
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	}
	c->ops = &mpi_ops;
	c->name = "mpi";
	MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
	MPI_Comm_size(MPI_COMM_WORLD, &c->size);
	*out = c;
	return 0;
}

int hi3_comm_mpi_device(hi3_comm **out, hi3_comm *mpi, hi3_error *err)
{
	hi3_comm *c;

	*out = NULL;
	if (!(c = calloc(1, sizeof(*c))))
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	*c = (hi3_comm){.ops = &mpi_ops, .name = "mpi (device buffers)", .rank = mpi->rank, .size = mpi->size,
	                .device = 1};
	*out = c;
	return 0;
}
