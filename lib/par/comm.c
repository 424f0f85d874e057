/*
 * comm.c -- the communicator (hi3.h, hi3-parallel(7)): the timed entry
 * points every implementation goes through, the single-process
 * implementation (the default), the canonical all-reduce, the checks that
 * every rank runs the same thing, and the layout parser.
 *
 * The MPI and NCCL implementations are comm-mpi.c and comm-nccl.c, built
 * into the hi3-mpi program only: libhi3 itself never links MPI.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "core/internal.h"
#include "par/hi3-par.h"

/* ------------------------------------------------------ single process */

static int single_allgather(hi3_comm *c, const void *send, size_t n, void *recv, hi3_error *err)
{
	(void)c;
	(void)err;
	if (n && send != recv)
		memmove(recv, send, n);
	return 0;
}

static int single_allgatherv(hi3_comm *c, const void *send, size_t n, void *recv, const size_t *counts,
                             const size_t *displs, hi3_error *err)
{
	(void)c;
	if (counts[0] != n)
		return hi3_error_set(err, HI3_ERR_USAGE, "allgatherv: rank 0 sends %zu bytes, the counts say %zu", n,
		                     counts[0]);
	if (n)
		memmove((char *)recv + displs[0], send, n);
	return 0;
}

static int single_alltoallv(hi3_comm *c, const void *send, const size_t *scounts, const size_t *sdispls,
                            void *recv, const size_t *rcounts, const size_t *rdispls, hi3_error *err)
{
	(void)c;
	if (scounts[0] != rcounts[0])
		return hi3_error_set(err, HI3_ERR_USAGE, "alltoallv: %zu bytes sent to self, %zu expected", scounts[0],
		                     rcounts[0]);
	if (scounts[0])
		memmove((char *)recv + rdispls[0], (const char *)send + sdispls[0], scounts[0]);
	return 0;
}

static int single_bcast(hi3_comm *c, void *buf, size_t n, int root, hi3_error *err)
{
	(void)c;
	(void)buf;
	(void)n;
	if (root != 0)
		return hi3_error_set(err, HI3_ERR_USAGE, "bcast: root %d of 1 rank", root);
	return 0;
}

static int single_barrier(hi3_comm *c, hi3_error *err)
{
	(void)c;
	(void)err;
	return 0;
}

static void single_abort(hi3_comm *c, int status, const char *msg)
{
	(void)c;
	if (msg)
		hi3_log(HI3_LOG_ERROR, "%s", msg);
	exit(status ? status : 1);
}

static void single_destroy(hi3_comm *c)
{
	(void)c;
}

static const struct hi3_comm_ops single_ops = {
	.allgather = single_allgather,
	.allgatherv = single_allgatherv,
	.alltoallv = single_alltoallv,
	.bcast = single_bcast,
	.barrier = single_barrier,
	.abort = single_abort,
	.destroy = single_destroy,
};

hi3_comm *hi3_comm_single(void)
{
	static hi3_comm one = {.ops = &single_ops, .name = "single", .rank = 0, .size = 1};
	return &one;
}

/* ---------------------------------------------------------- timed calls */

#define TIMED(c, nbytes, call)                      \
	do {                                        \
		double t0_ = hi3i_now();            \
		int rc_ = (call);                   \
		(c)->seconds += hi3i_now() - t0_;   \
		(c)->bytes += (nbytes);             \
		return rc_;                         \
	} while (0)

int hi3_comm_allgather(hi3_comm *c, const void *send, size_t n, void *recv, hi3_error *err)
{
	TIMED(c, n * (size_t)c->size, c->ops->allgather(c, send, n, recv, err));
}

int hi3_comm_allgatherv(hi3_comm *c, const void *send, size_t n, void *recv, const size_t *counts,
                        const size_t *displs, hi3_error *err)
{
	size_t tot = 0;

	for (int r = 0; r < c->size; r++)
		tot += counts[r];
	TIMED(c, tot, c->ops->allgatherv(c, send, n, recv, counts, displs, err));
}

int hi3_comm_alltoallv(hi3_comm *c, const void *send, const size_t *scounts, const size_t *sdispls, void *recv,
                       const size_t *rcounts, const size_t *rdispls, hi3_error *err)
{
	size_t tot = 0;

	for (int r = 0; r < c->size; r++)
		tot += rcounts[r];
	TIMED(c, tot, c->ops->alltoallv(c, send, scounts, sdispls, recv, rcounts, rdispls, err));
}

int hi3_comm_bcast(hi3_comm *c, void *buf, size_t n, int root, hi3_error *err)
{
	TIMED(c, n, c->ops->bcast(c, buf, n, root, err));
}

int hi3_comm_barrier(hi3_comm *c, hi3_error *err)
{
	TIMED(c, 0, c->ops->barrier(c, err));
}

/* ------------------------------------------------------------- derived */

int hi3_comm_allreduce_sum_f32(hi3_comm *c, float *x, size_t n, hi3_error *err)
{
	float *all;

	if (c->size == 1)
		return 0;
	if (c->device)
		return hi3_error_set(err, HI3_ERR_USAGE, "allreduce: the canonical sum takes host buffers, not %s ones",
		                     c->name);
	if (!(all = hi3i_malloc(sizeof(float) * n * (size_t)c->size, err)))
		return -1;
	if (hi3_comm_allgather(c, x, sizeof(float) * n, all, err) != 0) {
		free(all);
		return -1;
	}
	/* rank order, the same on every rank: ((x0 + x1) + x2) + ... */
	for (size_t i = 0; i < n; i++) {
		float s = all[i];
		for (int r = 1; r < c->size; r++)
			s += all[(size_t)r * n + i];
		x[i] = s;
	}
	free(all);
	return 0;
}

#define CHECK_LEN 128

int hi3_comm_check_same(hi3_comm *c, const char *what, const char *value, hi3_error *err)
{
	char mine[CHECK_LEN] = {0}, *all;
	int rc = 0;

	if (c->size == 1)
		return 0;
	snprintf(mine, sizeof(mine), "%s", value ? value : "");
	if (!(all = hi3i_malloc((size_t)CHECK_LEN * (size_t)c->size, err)))
		return -1;
	if (hi3_comm_allgather(c, mine, CHECK_LEN, all, err) != 0) {
		free(all);
		return -1;
	}
	for (int r = 1; r < c->size; r++)
		if (memcmp(all, all + (size_t)r * CHECK_LEN, CHECK_LEN) != 0) {
			rc = hi3_error_set(err, HI3_ERR_INPUT, "rank %d runs %s %s, rank 0 runs %s (every rank must be "
			                   "started with the same model and inputs)", r, what, all + (size_t)r * CHECK_LEN,
			                   all);
			break;
		}
	free(all);
	return rc;
}

int hi3_comm_agree(hi3_comm *c, const hi3_error *mine, hi3_error *err)
{
	struct {
		int32_t status;
		char msg[sizeof(mine->msg) - 4];
	} me, *all = NULL;
	hi3_error lost = {0};

	if (c->size == 1) {
		if (!mine->status)
			return 0;
		if (err != mine)
			*err = *mine;
		return -1;
	}
	memset(&me, 0, sizeof(me));
	me.status = mine->status;
	snprintf(me.msg, sizeof(me.msg), "%.2000s", mine->msg);
	if (!(all = hi3i_malloc(sizeof(me) * (size_t)c->size, &lost)) ||
	    hi3_comm_allgather(c, &me, sizeof(me), all, &lost) != 0) {
		/* the collective itself failed: nothing to agree on, end every rank */
		free(all);
		c->ops->abort(c, HI3_ERR_RUNTIME, lost.msg);
		return -1;
	}
	for (int r = 0; r < c->size; r++)
		if (all[r].status) {
			hi3_error_set(err, all[r].status, "rank %d of %d: %s", r, c->size, all[r].msg);
			free(all);
			return -1;
		}
	free(all);
	return 0;
}

/* ------------------------------------------------------------- layouts */

static int parse_part(const char *s, size_t n, const char *key, int *v, hi3_error *err)
{
	char buf[32], *end;
	long x;

	if (n >= sizeof(buf))
		return hi3_error_set(err, HI3_ERR_USAGE, "--parallel: '%.*s' is too long", (int)n, s);
	memcpy(buf, s, n);
	buf[n] = 0;
	errno = 0;
	x = strtol(buf, &end, 10);
	if (end == buf || *end || errno || x < 1 || x > 4096)
		return hi3_error_set(err, HI3_ERR_USAGE, "--parallel: %s=%s is not a count in [1, 4096]", key, buf);
	*v = (int)x;
	return 0;
}

int hi3_par_parse(hi3_par *p, const char *spec, hi3_error *err)
{
	const char *s = spec;

	p->tp = p->ep = 1;
	p->dispatch = HI3_DISPATCH_GATHER;
	if (!spec || !*spec)
		return hi3_error_set(err, HI3_ERR_USAGE, "--parallel: empty layout (expected tp=T,ep=E)");
	while (*s) {
		size_t n = strcspn(s, ",");
		const char *eq = memchr(s, '=', n);
		if (!eq)
			return hi3_error_set(err, HI3_ERR_USAGE, "--parallel: '%.*s' is not KEY=N (expected tp=T,ep=E)",
			                     (int)n, s);
		if ((size_t)(eq - s) == 2 && !strncmp(s, "tp", 2)) {
			if (parse_part(eq + 1, n - 3, "tp", &p->tp, err))
				return -1;
		} else if ((size_t)(eq - s) == 2 && !strncmp(s, "ep", 2)) {
			if (parse_part(eq + 1, n - 3, "ep", &p->ep, err))
				return -1;
		} else if ((size_t)(eq - s) == 8 && !strncmp(s, "dispatch", 8)) {
			const char *v = eq + 1;
			size_t nv = n - 9;
			if (nv == 6 && !strncmp(v, "gather", 6))
				p->dispatch = HI3_DISPATCH_GATHER;
			else if (nv == 8 && !strncmp(v, "alltoall", 8))
				p->dispatch = HI3_DISPATCH_ALLTOALL;
			else
				return hi3_error_set(err, HI3_ERR_USAGE, "--parallel: dispatch=%.*s is not gather or "
				                     "alltoall", (int)nv, v);
		} else {
			return hi3_error_set(err, HI3_ERR_USAGE, "--parallel: unknown key '%.*s' (expected tp, ep or "
			                     "dispatch)", (int)(eq - s), s);
		}
		s += n;
		if (*s == ',' && !*++s)
			return hi3_error_set(err, HI3_ERR_USAGE, "--parallel: trailing comma in '%s'", spec);
	}
	return 0;
}
