/*
 * test-comm.c -- the communicator (hi3.h, lib/par/comm.c): the layout
 * parser, the single-process collectives, and, built as test-comm-mpi
 * (with -DHI3_MPI and comm-mpi.c) and run under mpirun by
 * t6000-parallel.sh, every MPI collective on 3 or more ranks: each rank
 * checks what it received against what every rank must have sent, and
 * rank 0 prints one TAP line per check, "ok" only when every rank passed.
 * Built as test-comm-nccl (-DHI3_NCCL, with CUDA and NCCL, no MPI), the
 * same checks run through the NCCL communicator in one process on one GPU,
 * bootstrapped over the single-process communicator (scripts/gpu-run.sh,
 * step nccl); as test-comm-nccl-mpi (-DHI3_MPI too) on one rank per GPU
 * under mpirun. The communicator's buffers are plain cudaMalloc memory,
 * never managed memory (over-asking managed memory can hang a GPU): the
 * checks fill and read host copies, moved with cudaMemcpy around each
 * call. The checks that take host buffers (the rank-order all-reduce,
 * check_same, agree) run on the host communicator.
 */
#include <math.h>
#include <string.h>
#include "hi3.h"
#include "stage/vocab.h"
#include "tap.h"
#if defined(HI3_MPI) || defined(HI3_NCCL)
#include "par/comm-mpi.h" /* hi3_comm_mpi_open, hi3_comm_nccl_open */
#endif
#ifdef HI3_NCCL
#include <cuda_runtime.h>
#endif

/* buffers the communicator under test reads and writes, zeroed: host
 * memory, or device memory (cudaMalloc) for NCCL */
static void *tb(hi3_comm *c, size_t n)
{
	void *p = NULL;
#ifdef HI3_NCCL
	if (c->device) {
		if (cudaMalloc(&p, n) != cudaSuccess)
			return NULL;
		if (cudaMemset(p, 0, n) != cudaSuccess) {
			cudaFree(p);
			return NULL;
		}
		return p;
	}
#endif
	(void)c;
	p = calloc(1, n);
	return p;
}

static void tfree(hi3_comm *c, void *p)
{
#ifdef HI3_NCCL
	if (c->device) {
		cudaFree(p);
		return;
	}
#endif
	(void)c;
	free(p);
}

/* n bytes between the checks' host copy and a tb() buffer: 0, or -1 */
static int put(hi3_comm *c, void *buf, const void *host, size_t n)
{
#ifdef HI3_NCCL
	if (c->device)
		return cudaMemcpy(buf, host, n, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1;
#endif
	(void)c;
	memcpy(buf, host, n);
	return 0;
}

static int get(hi3_comm *c, void *host, const void *buf, size_t n)
{
#ifdef HI3_NCCL
	if (c->device)
		return cudaMemcpy(host, buf, n, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
#endif
	(void)c;
	memcpy(host, buf, n);
	return 0;
}

#define MAX_CHECKS 64
static int n_checks, passed[MAX_CHECKS];
static const char *names[MAX_CHECKS];

static void check(int cond, const char *what)
{
	if (n_checks < MAX_CHECKS) {
		names[n_checks] = what;
		passed[n_checks++] = !!cond;
	}
}

/* the value rank r sends at index i: distinct per (rank, index) */
static float val(int r, size_t i)
{
	return (float)(r * 1000 + (int)i) * 0.25f + 0.125f;
}

static void collectives(hi3_comm *c, hi3_comm *host)
{
	const int R = c->size, me = c->rank;
	hi3_error err = {0};
	/* the checks' host copies; the communicator's buffers (tb) may be device memory */
	static float hsend[8], hall[8 * 64], hs2[64 * 64], hr2[64 * 64], hrecv[64 * 65 / 2 + 1];
	char hbuf[32];
	float *send = tb(c, sizeof(hsend)), *all = tb(c, sizeof(hall)), *recv = NULL;
	float *s2 = tb(c, sizeof(hs2)), *r2 = tb(c, sizeof(hr2));
	char *buf = tb(c, sizeof(hbuf));
	size_t counts[64], displs[64], sc[64], sd[64], rc[64], rd[64], tot = 0;
	int good;

	if (!send || !all || !s2 || !r2 || !buf || R > 64) {
		check(0, "test buffers");
		goto out;
	}
	for (int i = 0; i < 8; i++)
		hsend[i] = val(me, (size_t)i);
	good = put(c, send, hsend, sizeof(hsend)) == 0 && hi3_comm_allgather(c, send, 8 * sizeof(float), all, &err) == 0 &&
	       get(c, hall, all, sizeof(float) * 8 * (size_t)R) == 0;
	for (int r = 0; r < R && good; r++)
		for (int i = 0; i < 8; i++)
			good &= hall[r * 8 + i] == val(r, (size_t)i);
	check(good, "allgather: every rank's block in rank order");

	/* rank r sends r + 1 floats */
	for (int r = 0; r < R; r++) {
		counts[r] = sizeof(float) * (size_t)(r + 1);
		displs[r] = tot;
		tot += counts[r];
	}
	recv = tb(c, tot + sizeof(float));
	good = recv && hi3_comm_allgatherv(c, send, counts[me], recv, counts, displs, &err) == 0 &&
	       get(c, hrecv, recv, tot) == 0;
	for (int r = 0; r < R && good; r++)
		for (int i = 0; i <= r; i++)
			good &= hrecv[displs[r] / sizeof(float) + (size_t)i] == val(r, (size_t)i);
	check(good, "allgatherv: blocks of other sizes at their displacements");

	/* rank me sends (q + 1) floats to rank q, values val(me, 10 q + i) */
	{
		size_t so = 0, ro = 0;
		for (int q = 0; q < R; q++) {
			sc[q] = sizeof(float) * (size_t)(q + 1);
			sd[q] = so;
			for (int i = 0; i <= q; i++)
				hs2[so / sizeof(float) + (size_t)i] = val(me, (size_t)(10 * q + i));
			so += sc[q];
			rc[q] = sizeof(float) * (size_t)(me + 1);
			rd[q] = ro;
			ro += rc[q];
		}
		good = put(c, s2, hs2, so) == 0 && hi3_comm_alltoallv(c, s2, sc, sd, r2, rc, rd, &err) == 0 &&
		       get(c, hr2, r2, ro) == 0;
		for (int q = 0; q < R && good; q++)
			for (int i = 0; i <= me; i++)
				good &= hr2[rd[q] / sizeof(float) + (size_t)i] == val(q, (size_t)(10 * me + i));
		check(good, "alltoallv: rank q's part for me at displacement q");
	}

	{
		char want[32];
		snprintf(hbuf, sizeof(hbuf), "from rank %d", me);
		snprintf(want, sizeof(want), "from rank %d", R - 1);
		good = put(c, buf, hbuf, sizeof(hbuf)) == 0 && hi3_comm_bcast(c, buf, sizeof(hbuf), R - 1, &err) == 0 &&
		       get(c, hbuf, buf, sizeof(hbuf)) == 0 && !strcmp(hbuf, want);
		check(good, "bcast from the last rank");
	}
	check(hi3_comm_barrier(c, &err) == 0, "barrier");
	if (err.status)
		diag("rank %d: %s", me, err.msg);

	/* the canonical sum: terms of very different sizes, so the order shows
	 * in the bits; every rank must get ((x0 + x1) + x2) + ... exactly */
	{
		float x[4], want[4];
		for (int i = 0; i < 4; i++)
			x[i] = (me % 2 ? 1e8f : 1.0f) * (0.1f + (float)i) + (float)me * 0.3f;
		for (int r = 0; r < R; r++)
			for (int i = 0; i < 4; i++) {
				float t = (r % 2 ? 1e8f : 1.0f) * (0.1f + (float)i) + (float)r * 0.3f;
				want[i] = r == 0 ? t : want[i] + t;
			}
		good = hi3_comm_allreduce_sum_f32(host, x, 4, &err) == 0;
		for (int i = 0; i < 4 && good; i++)
			good &= memcmp(&x[i], &want[i], sizeof(float)) == 0;
		check(good, "allreduce_sum_f32: the sum in rank order, bit for bit");
	}

	{
		hi3_error e1 = {0}, e2 = {0};
		check(hi3_comm_check_same(host, "model", "abc", &e1) == 0, "check_same: equal strings pass");
		if (R > 1) {
			int rc2 = hi3_comm_check_same(host, "model", me == R - 1 ? "xyz" : "abc", &e2);
			char want[64];
			snprintf(want, sizeof(want), "rank %d runs model xyz", R - 1);
			check(rc2 != 0 && e2.status == HI3_ERR_INPUT && strstr(e2.msg, want), "check_same: names the rank "
			      "that differs");
		}
	}
	{
		hi3_error mine = {0}, out = {0};
		int a;
		if (R > 1 && me == 1)
			hi3_error_set(&mine, HI3_ERR_INPUT, "bad input here");
		a = hi3_comm_agree(host, &mine, &out);
		if (R > 1)
			check(a != 0 && out.status == HI3_ERR_INPUT && strstr(out.msg, "rank 1 of") &&
			      strstr(out.msg, "bad input here"), "agree: every rank gets rank 1's error");
		else
			check(a == 0, "agree: no error, no failure");
	}
	check(c->seconds >= 0 && c->bytes > 0, "the calls are timed and counted");
out:
	tfree(c, send);
	tfree(c, all);
	tfree(c, recv);
	tfree(c, s2);
	tfree(c, r2);
	tfree(c, buf);
}

/*
 * lm_head split on the vocabulary (stage/vocab.c): every rank makes the
 * same rows of logits and holds slice split(V, size, rank) of them, as
 * tensor slot `rank` of tp = size; the tokens and log-probs that
 * hi3i_vocab_next computes from the slices must be the bits of
 * hi3_sample / hi3_argmax / hi3_logprob on the whole rows. The logits are
 * multiples of 1/4 (ties across slice boundaries, -0 and +0), a flat row
 * (a full-vocabulary draw walks deep past the first candidates asked
 * for), and rows with NaN (argmax and log-softmax only).
 */
#define VV 1037
#define VR 12

static float vlogit(int row, int v)
{
	uint32_t h = (uint32_t)(row * 7919 + v) * 2654435761u;

	if (row == 2 || row == 4 || row == 5)
		return v % 2 ? 0.0f : -0.0f;                        /* flat */
	if (row == 3)
		return (float)(h % 64) * 0.01f;                     /* near flat, no ties */
	if ((row == VR - 1 && v == 0) || (row == VR - 2 && v == VV / 2))
		return NAN;
	return (float)((int)(h >> 8) % 33 - 16) * 0.25f;
}

static void vocab_split(hi3_comm *host)
{
	static const hi3_sampler samplers[] = {
		{.greedy = 1, .temperature = 1.0, .top_p = 1.0},
		{.temperature = 0.8, .top_k = 40, .top_p = 0.9},
		{.temperature = 0.8, .top_k = 5, .top_p = 1.0},
		{.temperature = 1.3, .top_k = 0, .top_p = 1.0},
		{.temperature = 0.7, .top_k = 0, .top_p = 0.95},
		{.temperature = 1.0, .top_k = VV + 5, .top_p = 0.5},
	};
	static const char *what[] = {
		"vocab split: greedy tokens and log-probs bitwise one process's",
		"vocab split: temperature 0.8, top-k 40, top-p 0.9: bitwise one process's",
		"vocab split: temperature 0.8, top-k 5: bitwise one process's",
		"vocab split: temperature 1.3, whole vocabulary: bitwise one process's",
		"vocab split: temperature 0.7, whole vocabulary, top-p 0.95: bitwise one process's",
		"vocab split: top-k beyond V, top-p 0.5: bitwise one process's",
	};
	hi3i_vocab vs = {.comm = host, .V = VV, .tp = host->size};
	float *x = malloc(sizeof(float) * VR * VV);
	void *scratch = malloc(hi3_sample_scratch_size(VV));
	const float *rows[VR];
	uint64_t seed[VR], step[VR];
	int64_t tok[VR], want[VR];
	float lp[VR], want_lp[VR];
	hi3_error err = {0};

	if (!x || !scratch) {
		check(0, "vocab split: test buffers");
		goto out;
	}
	hi3i_split(VV, host->size, host->rank, &vs.v0, &vs.nv);
	for (int i = 0; i < VR; i++) {
		for (int v = 0; v < VV; v++)
			/* another rank's columns are not this rank's to read: poison them */
			x[(size_t)i * VV + v] = v >= vs.v0 && v < vs.v0 + vs.nv ? vlogit(i, v) : 1e30f;
		rows[i] = x + (size_t)i * VV;
		seed[i] = 6000 + (uint64_t)i;
		step[i] = (uint64_t)i * 3;
	}
	for (size_t k = 0; k < HI3_ARRAY_SIZE(samplers); k++) {
		const hi3_sampler *sp = &samplers[k];
		/* NaN rows only where the reference defines the answer */
		int n = sp->greedy ? VR : VR - 2, good = 1;
		float *full = malloc(sizeof(float) * VV);
		for (int i = 0; i < n && full; i++) {
			for (int v = 0; v < VV; v++)
				full[v] = vlogit(i, v);
			want[i] = hi3_sample(full, VV, sp, seed[i], step[i], scratch);
			want_lp[i] = (float)hi3_logprob(full, VV, want[i]);
			tok[i] = -1;
		}
		/* given tokens too: the greedy pass also checks rows forced to token 7 */
		if (sp->greedy)
			for (int i = 0; i < 3; i++) {
				tok[i] = want[i] = 7;
				for (int v = 0; v < VV; v++)
					full[v] = vlogit(i, v);
				want_lp[i] = (float)hi3_logprob(full, VV, 7);
			}
		good = full && hi3i_vocab_next(&vs, rows, n, sp, seed, step, tok, lp, scratch, &err) == 0;
		for (int i = 0; i < n && good; i++)
			good &= tok[i] == want[i] && memcmp(&lp[i], &want_lp[i], sizeof(float)) == 0;
		if (!good)
			diag("rank %d: %s: %s", host->rank, what[k], err.msg);
		check(good, what[k]);
		free(full);
	}
	{
		int64_t id[4] = {0, VV - 1, VV / 2, 17};
		float val[4];
		int good = hi3i_vocab_pick(&vs, rows[0], id, 4, val, &err) == 0;
		for (int j = 0; j < 4 && good; j++)
			good &= memcmp(&val[j], &(float){vlogit(0, (int)id[j])}, sizeof(float)) == 0;
		check(good, "vocab split: logits picked by id from their slices");
	}
out:
	free(x);
	free(scratch);
}

static void report(hi3_comm *c)
{
	/* the results are host memory: gathered over the host communicator */
	int all[MAX_CHECKS * 64] = {0}, n = n_checks;
	hi3_error err = {0};

	if (c->size > 64 || hi3_comm_allgather(c, passed, sizeof(passed), all, &err) != 0) {
		ok(0, "gather the results: %s", err.msg);
		return;
	}
	if (c->rank != 0)
		return;
	for (int i = 0; i < n; i++) {
		int good = 1;
		for (int r = 0; r < c->size; r++)
			good &= all[r * MAX_CHECKS + i];
		ok(good, "%d ranks: %s", c->size, names[i]);
	}
}

int main(int argc, char **argv)
{
	hi3_par p;
	hi3_error err = {0};
	hi3_comm *c = hi3_comm_single(), *host;
	int lead;

#ifdef HI3_MPI
	if (hi3_comm_mpi_open(&c, &argc, &argv, &err) != 0) {
		ok(0, "MPI: %s", err.msg);
		return done_testing();
	}
#else
	(void)argc;
	(void)argv;
#endif
	host = c;
#ifdef HI3_NCCL
	if (hi3_comm_nccl_open(&c, host, &err) != 0) {
		ok(0, "rank %d: NCCL: %s", host->rank, err.msg);
		host->ops->destroy(host);
		return done_testing();
	}
#endif
	if (c->rank == 0) {
		ok(hi3_par_parse(&p, "tp=2,ep=4", &err) == 0 && p.tp == 2 && p.ep == 4, "parse tp=2,ep=4");
		ok(hi3_par_parse(&p, "ep=3", &err) == 0 && p.tp == 1 && p.ep == 3, "parse ep=3 (tp defaults to 1)");
		ok(hi3_par_parse(&p, "tp=0", &err) != 0 && strstr(err.msg, "tp=0 is not a count"), "refuse tp=0");
		ok(hi3_par_parse(&p, "tp=2,", &err) != 0 && strstr(err.msg, "trailing comma"), "refuse a trailing comma");
		ok(hi3_par_parse(&p, "dp=2", &err) != 0 && strstr(err.msg, "unknown key 'dp'"), "refuse an unknown key");
		ok(hi3_par_parse(&p, "tp=2x", &err) != 0 && err.status == HI3_ERR_USAGE, "refuse trailing garbage");
		ok(hi3_par_parse(&p, "", &err) != 0, "refuse an empty layout");
		ok(hi3_par_parse(&p, "ep=2", &err) == 0 && p.dispatch == HI3_DISPATCH_GATHER, "dispatch: gather by default");
		ok(hi3_par_parse(&p, "ep=2,dispatch=alltoall", &err) == 0 && p.ep == 2 &&
		   p.dispatch == HI3_DISPATCH_ALLTOALL, "parse ep=2,dispatch=alltoall");
		ok(hi3_par_parse(&p, "dispatch=all", &err) != 0 && strstr(err.msg, "dispatch=all is not gather or alltoall"),
		   "refuse an unknown dispatch");
	}
	lead = c->rank == 0;
	collectives(c, host);
	vocab_split(host);
	report(host);
	if (c != host)
		c->ops->destroy(c);
	host->ops->destroy(host);
	/* rank 0 reports for all ranks */
	return lead ? done_testing() : 0;
}
