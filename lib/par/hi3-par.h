/*
 * hi3-par.h -- the public interface of lib/par/: communicators and
 * parallel layouts (hi3-parallel(7)).
 * Part of hi3.h, the public interface: its conventions hold here.
 */
#ifndef HI3_LAYER_PAR_H
#define HI3_LAYER_PAR_H

#include "../core/hi3-core.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Scale-out (lib/par/comm.c, hi3-parallel(7)): a communicator is a table
 * of collectives over `size` ranks. libhi3 holds the single-process one;
 * the MPI (host buffers) and NCCL (device buffers) ones live in the
 * hi3-mpi program (lib/par/comm-mpi.c, comm-nccl.c), so that libhi3 and
 * hi3 need no MPI library at run time. Every call returns 0, or -1 with
 * err set; byte counts and displacements are per rank, in rank order.
 */
typedef struct hi3_comm hi3_comm;
struct hi3_comm_ops {
	/* recv (size * n bytes) = every rank's send (n bytes), in rank order */
	int (*allgather)(hi3_comm *c, const void *send, size_t n, void *recv, hi3_error *err);
	/* recv + displs[r] = rank r's send (counts[r] bytes) */
	int (*allgatherv)(hi3_comm *c, const void *send, size_t n, void *recv, const size_t *counts,
	                  const size_t *displs, hi3_error *err);
	/* rank r's send + sdispls[q] (scounts[q] bytes) to rank q's recv + rdispls[r] */
	int (*alltoallv)(hi3_comm *c, const void *send, const size_t *scounts, const size_t *sdispls, void *recv,
	                 const size_t *rcounts, const size_t *rdispls, hi3_error *err);
	int (*bcast)(hi3_comm *c, void *buf, size_t n, int root, hi3_error *err);
	int (*barrier)(hi3_comm *c, hi3_error *err);
	/* end every rank now with status, after printing msg (NULL: none) */
	void (*abort)(hi3_comm *c, int status, const char *msg);
	void (*destroy)(hi3_comm *c);
};
struct hi3_comm {
	const struct hi3_comm_ops *ops;
	const char *name;        /* "single", "mpi", "nccl" */
	int rank, size;
	int device;              /* 1: buffers are device memory (NCCL; MPI on the CUDA emulator's) */
	void *ctx;
	double seconds;          /* time spent in collectives (hi3_comm_* calls) */
	uint64_t bytes;          /* bytes received by them */
};

/* The single-process communicator (rank 0 of 1); static, never freed. */
hi3_comm *hi3_comm_single(void);
/* The collectives through c, timed into c->seconds and c->bytes. */
int hi3_comm_allgather(hi3_comm *c, const void *send, size_t n, void *recv, hi3_error *err);
int hi3_comm_allgatherv(hi3_comm *c, const void *send, size_t n, void *recv, const size_t *counts,
                        const size_t *displs, hi3_error *err);
int hi3_comm_alltoallv(hi3_comm *c, const void *send, const size_t *scounts, const size_t *sdispls, void *recv,
                       const size_t *rcounts, const size_t *rdispls, hi3_error *err);
int hi3_comm_bcast(hi3_comm *c, void *buf, size_t n, int root, hi3_error *err);
int hi3_comm_barrier(hi3_comm *c, hi3_error *err);
/* x (n) = the sum over ranks of x, the same bits on every rank and for
 * any layout of the same terms: an all-gather, then a sum in rank order
 * on each rank (host buffers). */
int hi3_comm_allreduce_sum_f32(hi3_comm *c, float *x, size_t n, hi3_error *err);
/* Every rank holds the same `what` (a string: a fingerprint, a hash), or
 * an HI3_ERR_INPUT error naming the first rank that differs from rank 0. */
int hi3_comm_check_same(hi3_comm *c, const char *what, const char *value, hi3_error *err);
/* 0 when every rank's status is 0; else -1 on every rank, with err naming
 * the lowest failing rank and its message (a collective: all ranks call it). */
int hi3_comm_agree(hi3_comm *c, const hi3_error *mine, hi3_error *err);

/* How the routed experts' outputs reach their tokens when ep > 1
 * (hi3-parallel(7), "experts"). */
enum hi3_dispatch {
	/* every rank holds every token; each expert group computes its
	 * experts' rows of all of them, and the rows are all-gathered */
	HI3_DISPATCH_GATHER,
	/* the tokens are split over the expert groups: each group sends its
	 * experts' rows to the group of their tokens (all-to-all), which adds
	 * them up with the shared MLP; the sums are all-gathered (tp = 1) */
	HI3_DISPATCH_ALLTOALL,
};

/* A parallel layout: size = tp * ep ranks; rank r is tensor slot r % tp of
 * expert group r / tp (hi3-parallel(7)). */
typedef struct hi3_par {
	hi3_comm *comm;          /* host buffers: the checks, the vocabulary exchange, the files' barriers */
	/* the activations' collectives on device buffers (NCCL on GPUs; MPI on
	 * the CUDA emulator's device memory, which is host memory), or NULL:
	 * they go through host buffers of comm (download, collective, upload) */
	hi3_comm *dev;
	int tp, ep;
	int dispatch;            /* enum hi3_dispatch */
} hi3_par;
/* "tp=T,ep=E[,dispatch=gather|alltoall]" (a part left out: tp 1, ep 1, gather) into p. */
int hi3_par_parse(hi3_par *p, const char *spec, hi3_error *err);

#ifdef __cplusplus
}
#endif
#endif /* HI3_LAYER_PAR_H */
