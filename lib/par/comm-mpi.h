/*
 * comm-mpi.h -- the communicators of the hi3-mpi program: MPI (comm-mpi.c)
 * and, when built with CUDA and NCCL, NCCL (comm-nccl.c). Not part of
 * libhi3; see hi3.h for the communicator table they fill.
 */
#ifndef HI3_COMM_MPI_H
#define HI3_COMM_MPI_H

#include "par/hi3-par.h"

/* 1 when an MPI launcher started this process (its environment says so). */
int hi3_comm_mpi_launched(void);
/* MPI_Init and the world communicator; a usage error when no launcher
 * started the process. destroy() finalizes MPI. */
int hi3_comm_mpi_open(hi3_comm **out, int *argc, char ***argv, hi3_error *err);

/* The MPI communicator mpi on buffers in device memory that MPI can read
 * and write as host memory (the CUDA emulator's): the collectives of mpi,
 * marked device (c->device = 1), so that the model exchanges its
 * activations where a GPU build calls NCCL. destroy() leaves mpi open. */
int hi3_comm_mpi_device(hi3_comm **out, hi3_comm *mpi, hi3_error *err);

/* An NCCL communicator over the ranks of mpi, one GPU per rank: device
 * local rank % visible devices (the launcher's local rank; the world rank
 * without one), made current for the CUDA backend; its unique id broadcast
 * from rank 0 over mpi. Buffers are device memory (c->device = 1).
 * destroy() leaves mpi open. 1 (out NULL, err untouched) when ranks of one
 * host share a GPU, which NCCL refuses, or when hi3-mpi was built without
 * NCCL: the caller exchanges through host buffers instead; -1 with err set
 * when NCCL failed. A collective: every rank calls it. */
int hi3_comm_nccl_open(hi3_comm **out, hi3_comm *mpi, hi3_error *err);

#endif
