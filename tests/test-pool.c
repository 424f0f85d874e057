/* test-pool.c -- the CPU backend's team for short parallel work
 * (lib/backend/pool.h): every id of a job runs once, on as many threads
 * as asked; jobs follow one another without a lost or repeated part,
 * whether the workers are polling or asleep, on idle or busy cores; a job
 * inside a job or an OpenMP region runs on the caller alone; a child of
 * fork gets a team of its own; a shared job's items run once each and no
 * thread calls it after it returned; and the few-row products that run
 * on it keep their bits at any thread count. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <omp.h>
#include "backend/gemm.h"
#include "backend/pool.h"
#include "tap.h"

#define MAX_IDS 16

struct count {
	_Atomic int hits[MAX_IDS];
	_Atomic int bad_nt;       /* calls that saw another nt than the first */
	_Atomic int seen_nt;
};

static void count_ids(void *p, int id, int nt)
{
	struct count *c = p;
	int expect = 0;

	if (id >= 0 && id < MAX_IDS)
		atomic_fetch_add(&c->hits[id], 1);
	if (!atomic_compare_exchange_strong(&c->seen_nt, &expect, nt) && expect != nt)
		atomic_fetch_add(&c->bad_nt, 1);
}

/* One job of want threads: 1 when it ran each of its nt ids exactly once. */
static int job_ok(int want, int *nt_out)
{
	struct count c;
	int nt;

	memset(&c, 0, sizeof(c));
	nt = hi3i_pool_run(count_ids, &c, want);
	if (nt_out)
		*nt_out = nt;
	if (nt < 1 || nt > want || atomic_load(&c.bad_nt) || atomic_load(&c.seen_nt) != nt)
		return 0;
	for (int i = 0; i < MAX_IDS; i++)
		if (atomic_load(&c.hits[i]) != (i < nt))
			return 0;
	return 1;
}

/* A shared job: items taken from a counter by whichever thread comes. */
#define SHARE_ITEMS 64
#define SHARE_RING 4

struct share {
	_Atomic int next;
	_Atomic int hits[SHARE_ITEMS];
	_Atomic int calls;        /* calls of the job's fn */
	_Atomic int returned;     /* hi3i_pool_share has returned */
	_Atomic int late;         /* calls that began after it returned */
	_Atomic int bad_id;       /* calls with id outside [0, nt) */
};

static void share_items(void *p, int id, int nt)
{
	struct share *s = p;

	if (atomic_load(&s->returned))
		atomic_fetch_add(&s->late, 1);
	if (id < 0 || id >= nt)
		atomic_fetch_add(&s->bad_id, 1);
	atomic_fetch_add(&s->calls, 1);
	for (int it; (it = atomic_fetch_add(&s->next, 1)) < SHARE_ITEMS;) {
		atomic_fetch_add(&s->hits[it], 1);
		for (volatile int spin = 0; spin < 200; spin++)
			;
	}
}

/* One shared job of want threads, its struct one of a ring, so that a
 * call after the job returned lands on a struct that is checked again
 * (late) or reused (calls): 1 when every item ran once, fn ran on the nt
 * threads reported, and no call came late to a job of the ring. */
static int share_ok(int want)
{
	static struct share ring[SHARE_RING];
	static int turn;
	struct share *s = &ring[turn++ % SHARE_RING];
	int nt;

	memset(s, 0, sizeof(*s));
	nt = hi3i_pool_share(share_items, s, want);
	atomic_store(&s->returned, 1);
	if (nt < 1 || nt > want || atomic_load(&s->calls) != nt || atomic_load(&s->bad_id))
		return 0;
	for (int i = 0; i < SHARE_ITEMS; i++)
		if (atomic_load(&s->hits[i]) != 1)
			return 0;
	for (int i = 0; i < SHARE_RING; i++)
		if (atomic_load(&ring[i].late))
			return 0;
	return 1;
}

static void inner_job(void *p, int id, int nt)
{
	(void)nt;
	if (id == 0)
		*(int *)p = job_ok(4, NULL) ? 1 : -1;
}

static void nested(void *p, int id, int nt)
{
	int *inner = p;
	struct count c;

	(void)nt;
	if (id != 0)
		return;
	memset(&c, 0, sizeof(c));
	/* a job from inside a job runs on its caller alone */
	*inner = hi3i_pool_run(count_ids, &c, 4) == 1 && atomic_load(&c.hits[0]) == 1 ? 1 : -1;
}

static _Atomic int stop_hogs;

static void *hog_core(void *p)
{
	volatile unsigned x = 0;

	while (!atomic_load_explicit(&stop_hogs, memory_order_relaxed))
		x++;
	return p;
}

static void sleep_ms(int ms)
{
	struct timespec t = {0, (long)ms * 1000000L};

	nanosleep(&t, NULL);
}

/* y (M, N) of the few-row products at threads t equal to the plain loops, bit for bit. */
static int gemm_bits(int M, int N, int K, hi3_dtype dt, int threads)
{
	const size_t es = dt == HI3_F32 ? 4 : 2;
	unsigned char *w = malloc((size_t)N * K * es);
	float *x = malloc(sizeof(float) * (size_t)M * K), *y = malloc(sizeof(float) * (size_t)M * N);
	float *r = malloc(sizeof(float) * (size_t)M * N);
	hi3_wmat wm;
	uint32_t s = 12345;
	int same = 0;

	if (!w || !x || !y || !r)
		goto out;
	for (size_t i = 0; i < (size_t)N * K * es; i++) {
		s = s * 1664525u + 1013904223u;
		w[i] = (unsigned char)(s >> 24);
	}
	if (dt != HI3_F32)      /* keep bf16 values finite: exponent bits below all-ones */
		for (size_t i = 1; i < (size_t)N * K * es; i += 2)
			w[i] &= 0xbf;
	else
		for (size_t i = 3; i < (size_t)N * K * es; i += 4)
			w[i] &= 0xbf;
	for (size_t i = 0; i < (size_t)M * K; i++) {
		s = s * 1664525u + 1013904223u;
		x[i] = (float)(int)(s >> 9) / (float)(1 << 22) - 1.0f;
	}
	if (hi3i_wmat_init(&wm, w, dt, N, K, NULL) != 0)
		goto out;
	hi3i_gemm_ref(r, x, &wm, M);
	omp_set_num_threads(threads);
	memset(y, 0xff, sizeof(float) * (size_t)M * N);
	same = hi3i_gemm(y, x, &wm, M) == 0 && !memcmp(y, r, sizeof(float) * (size_t)M * N);
out:
	free(w);
	free(x);
	free(y);
	free(r);
	return same;
}

/* A group of few-row products at threads t (hi3i_gemm_group: ranges of
 * the union taken from a shared counter, one ahead, across products of
 * either dtype, one with no k and one with no rows) equal to the plain
 * loops of each product, bit for bit. */
static int group_bits(int M, int threads)
{
	enum { NJ = 6 };
	static const int NK[NJ][2] = {{1000, 1024}, {389, 200}, {24, 64}, {77, 0}, {50, 96}, {613, 136}};
	hi3_wmat wm[NJ];
	const hi3_wmat *pw[NJ];
	unsigned char *w[NJ] = {0};
	float *x[NJ] = {0}, *y[NJ] = {0}, *r[NJ] = {0};
	const float *cx[NJ];
	int rows[NJ], same = 1;
	uint32_t s = 777u + (uint32_t)M;

	for (int j = 0; j < NJ; j++) {
		const int N = NK[j][0], K = NK[j][1], M1 = j == 4 ? 0 : M;
		const hi3_dtype dt = j % 2 ? HI3_F32 : HI3_BF16;
		const size_t es = dt == HI3_F32 ? 4 : 2;
		w[j] = malloc((size_t)N * K * es + 1);
		x[j] = malloc(sizeof(float) * ((size_t)M * K + 1));
		y[j] = malloc(sizeof(float) * (size_t)M * N);
		r[j] = malloc(sizeof(float) * (size_t)M * N);
		if (!w[j] || !x[j] || !y[j] || !r[j]) {
			same = 0;
			goto out;
		}
		for (size_t i = 0; i < (size_t)N * K * es; i++) {
			s = s * 1664525u + 1013904223u;
			/* finite values: the top byte's exponent bits below all-ones */
			w[j][i] = (unsigned char)(s >> 24) & ((i + 1) % es ? 0xff : 0xbf);
		}
		for (size_t i = 0; i < (size_t)M * K; i++) {
			s = s * 1664525u + 1013904223u;
			x[j][i] = (float)(int)(s >> 9) / (float)(1 << 22) - 1.0f;
		}
		if (hi3i_wmat_init(&wm[j], w[j], dt, N, K, NULL) != 0) {
			same = 0;
			goto out;
		}
		hi3i_gemm_ref(r[j], x[j], &wm[j], M1);
		memset(y[j], 0xff, sizeof(float) * (size_t)M * N);
		pw[j] = &wm[j];
		cx[j] = x[j];
		rows[j] = M1;
	}
	omp_set_num_threads(threads);
	same = hi3i_gemm_group(NJ, y, cx, pw, rows) == 0;
	for (int j = 0; j < NJ; j++)
		same &= !memcmp(y[j], r[j], sizeof(float) * (size_t)rows[j] * NK[j][0]);
out:
	for (int j = 0; j < NJ; j++) {
		free(w[j]);
		free(x[j]);
		free(y[j]);
		free(r[j]);
	}
	return same;
}

int main(void)
{
	int nt = 0, all = 1, inner = 0;

	alarm(120);    /* a lost wake-up hangs: fail instead */
	ok(job_ok(1, &nt) && nt == 1, "a job of one thread runs on the caller");
	ok(job_ok(4, &nt) && nt == 4, "a job of 4 threads runs ids 0-3 once each (nt %d)", nt);
	ok(job_ok(2, &nt) && nt == 2, "then a job of 2 on the team of 4: ids 0-1 only (nt %d)", nt);
	ok(job_ok(6, &nt) && nt == 6, "and the team grows for a job of 6 (nt %d)", nt);
	for (int i = 0; i < 20000 && all; i++)
		all = job_ok(1 + i % 6, NULL);
	ok(all, "20000 jobs in a row, 1-6 threads each: no part lost or run twice");
	all = 1;
	for (int i = 0; i < 6 && all; i++) {
		sleep_ms(HI3I_POOL_SPIN_US / 1000 + 3);   /* past the spin: the workers sleep */
		all = job_ok(3, NULL);
	}
	ok(all, "jobs after the workers went to sleep still run every part");
	all = 1;
	for (int t = 1; t <= 6; t++)
		all &= share_ok(t);
	ok(all, "shared jobs of 1-6 threads run every item once, on the threads they report");
	all = 1;
	for (int i = 0; i < 20000 && all; i++)
		all = i % 3 ? share_ok(1 + i % 6) : job_ok(1 + i % 6, NULL);
	ok(all, "20000 shared and plain jobs in turn: every item and part once, no call after a job returned");
	all = 1;
	for (int i = 0; i < 6 && all; i++) {
		sleep_ms(HI3I_POOL_SPIN_US / 1000 + 3);
		all = share_ok(3) && share_ok(2);
	}
	ok(all, "shared jobs right after the workers went to sleep run every item once");

	{
		/* three threads of this process that keep the cores busy: the
		 * team polls on, yielding its cores to them */
		pthread_t hog[3];
		int nh = 0;

		atomic_store(&stop_hogs, 0);
		for (int i = 0; i < 3; i++)
			nh += pthread_create(&hog[nh], NULL, hog_core, NULL) == 0;
		all = 1;
		for (int i = 0; i < 3000 && all; i++)
			all = job_ok(2 + i % 3, NULL) && share_ok(2 + i % 3);
		atomic_store(&stop_hogs, 1);
		for (int i = 0; i < nh; i++)
			pthread_join(hog[i], NULL);
		ok(all && nh == 3, "3000 plain and 3000 shared jobs while three other threads keep the cores busy: "
		   "every part and item runs once");
	}

	{
		/* the same with three other processes: only work outside the
		 * process makes the team find the machine busy and sleep */
		pid_t hog[3];
		int nh = 0;

		for (int i = 0; i < 3; i++)
			if ((hog[nh] = fork()) == 0) {
				alarm(60);                  /* never outlives a lost parent for long */
				for (volatile unsigned x = 0;; x++)
					;
			} else if (hog[nh] > 0) {
				nh++;
			}
		all = 1;
		for (int i = 0; i < 3000 && all; i++)
			all = job_ok(2 + i % 3, NULL) && share_ok(2 + i % 3);
		for (int i = 0; i < nh; i++) {
			kill(hog[i], SIGKILL);
			waitpid(hog[i], NULL, 0);
		}
		ok(all && nh == 3, "3000 plain and 3000 shared jobs while three other processes keep the cores busy: "
		   "every part and item runs once");
	}

	{
		/* reads ahead are hints: they never fault, and a job that comes
		 * while the workers read still runs every part once */
		const size_t big = (size_t)32 << 20;
		unsigned char *buf = malloc(big);
		all = buf != NULL;
		for (int i = 0; i < 2000 && all; i++) {
			if (i % 100 == 0 && buf)
				memset(buf + (size_t)i * 4096, i, 4096);
			hi3i_pool_prefetch(buf, big);
			all = i % 2 ? share_ok(2 + i % 4) : job_ok(2 + i % 4, NULL);
		}
		hi3i_pool_prefetch(NULL, 1 << 20);
		all &= job_ok(3, NULL);
		hi3i_pool_prefetch((const void *)(uintptr_t)4096, (size_t)1 << 20);   /* no page there */
		sleep_ms(2);
		all &= share_ok(3);
		sleep_ms(HI3I_POOL_SPIN_US / 1000 + 3);
		hi3i_pool_prefetch(buf, big);                    /* the team sleeps: nothing */
		all &= job_ok(3, NULL);
		free(buf);
		ok(all, "jobs right after reads ahead of 32 MiB, of NULL and of an unmapped range run every part once");
	}

	hi3i_pool_run(nested, &inner, 3);
	ok(inner == 1, "a job started inside a job runs on its caller alone");
	{
		int in_omp = 1;
#pragma omp parallel num_threads(2)
		{
			struct count c;
			memset(&c, 0, sizeof(c));
			if (hi3i_pool_run(count_ids, &c, 4) != 1 || atomic_load(&c.hits[0]) != 1) {
#pragma omp atomic write
				in_omp = 0;
			}
		}
		ok(in_omp, "a job inside an OpenMP region runs on its caller alone");
	}
	{
		pid_t pid = fork();
		int st = 0;

		if (pid == 0) {
			int r = 0;
			alarm(30);
			hi3i_pool_run(inner_job, &r, 1);
			_exit(r == 1 && job_ok(3, NULL) ? 0 : 1);
		}
		ok(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
		   "a child of fork runs jobs on a team of its own (status %d)", st);
	}

	/* the products that run on the team: every element one thread's, in
	 * the order of gemm.h, so any split gives the plain loops' bits */
	for (int M = 1; M <= 16; M = M < 4 ? M + 1 : M * 2)
		for (int t = 1; t <= 5; t += 2) {
			ok(gemm_bits(M, 1000, 1024, HI3_BF16, t), "bf16 M = %d, N = 1000, K = 1024, %d threads: bits of "
			   "the plain loops", M, t);
			ok(gemm_bits(M, 389, 200, HI3_F32, t), "f32 M = %d, N = 389, K = 200, %d threads: bits of the "
			   "plain loops", M, t);
		}
	for (int M = 1; M <= 16; M = M < 4 ? M + 1 : M * 4)
		for (int t = 1; t <= 5; t += 2)
			ok(group_bits(M, t), "a group of 6 products (bf16 and f32, one with K = 0, one with no rows) at "
			   "M = %d, %d threads: bits of the plain loops", M, t);
	return done_testing();
}
