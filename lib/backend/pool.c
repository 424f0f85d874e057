/*
 * pool.c -- the CPU backend's team for short parallel work (pool.h).
 *
 * One team per process, started on first use and grown to the threads a
 * job asks for. A job is published by bumping gen; a worker that sees a
 * new gen runs its part and counts itself into done. Between jobs a worker
 * polls gen, yielding its core on every turn (sched_yield: other work on
 * it goes first), for HI3I_POOL_SPIN_US after its last job, then sleeps on
 * wake; the caller signals wake only when a worker has said it sleeps
 * (sleepers, read after gen is published: one of the two sees the other).
 * Every worker counts itself into done, the ones a job does not use too,
 * so that none still reads the job when the caller writes the next.
 *
 * A shared job (hi3i_pool_share) does not wait for every worker: a worker
 * joins it by counting itself into ticket, which also names the job's gen,
 * and the caller, once its own call returns, closes the ticket and waits
 * for the ones that joined. A worker that finds the ticket closed, or
 * naming a later job, leaves the job alone: it reads nothing of it.
 *
 * When yields hand the core to another process's work for a while, twice
 * in a short time (yield_core), the machine is busy: for BUSY_US workers
 * sleep as soon as a job ends and the caller sleeps on fin until the last
 * worker is done. Polling there would take cores other work wants
 * (measured: with two `nice yes` beside it, a decode step of the `small`
 * preset 21 ms polling, 8 ms so), and waking a thread whose core is busy
 * is cheap; it is the idle, halted core of a virtual machine that is slow
 * to wake.
 */
#include <dirent.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <omp.h>
#include "backend/pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T1) /* to L2: see gemm.c's tile */
#else
#define PREFETCH(p) __builtin_prefetch(p, 0, 2)
#endif

#define MAX_WORKERS 255
#define TAKEN_US 200.0            /* a turn of other work on the core that says the machine is busy */
#define AGAIN_US 20000.0          /* ... seen twice within this */
#define BUSY_US 250000.0          /* then how long workers sleep at once, not polling */
#define T_SHARED ((uint64_t)1 << 31) /* ticket: the job is shared, */
#define T_CLOSED ((uint64_t)1 << 30) /* closed to workers not in yet, */
#define T_COUNT (T_CLOSED - 1)       /* and the workers in it */

static struct {
	pthread_mutex_t run;      /* held by the caller of a job */
	pthread_mutex_t lock;     /* with wake: a sleeping worker's wait */
	pthread_cond_t wake;
	pthread_cond_t fin;       /* with lock: the caller's wait for the last worker */
	_Atomic int caller_sleeps;
	int n;                    /* workers started */
	_Atomic unsigned gen;     /* bumped once per job */
	_Atomic int sleepers;     /* workers waiting on wake */
	_Atomic int done;         /* workers through with the job of gen */
	_Atomic int target;       /* done that ends the job: every worker, or those that joined a shared job */
	_Atomic uint64_t ticket;  /* the job's gen (high 32 bits), T_SHARED, T_CLOSED and T_COUNT */
	_Atomic unsigned pf_gen;  /* bumped once per hi3i_pool_prefetch, after */
	_Atomic uintptr_t pf_p;   /* the bytes to read ahead */
	_Atomic size_t pf_n;
	_Atomic int pf_workers;   /* the workers then: each reads every pf_workers-th block */
	_Atomic double busy_until; /* until then (now_us), workers sleep at once */
	_Atomic double taken_at;  /* when other work last took a core from a polling thread */
	hi3i_pool_fn fn;          /* the job: written before gen, read after */
	void *arg;
	int nt;
	unsigned first[MAX_WORKERS + 1]; /* a worker's gen when it was started */
} pool = {.run = PTHREAD_MUTEX_INITIALIZER, .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER,
        .fin = PTHREAD_COND_INITIALIZER};

static double now_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

/* Times this thread was switched for another, so far. */
static long switches(void)
{
	struct rusage r;

	return getrusage(RUSAGE_THREAD, &r) == 0 ? r.ru_nivcsw : 0;
}

/* This process's runnable threads (state R in /proc/self/task); -1 where
 * /proc cannot say. */
static int own_runnable(void)
{
	char line[128], path[64];
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d))) {
		FILE *f;
		const char *c;
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof path, "/proc/self/task/%.20s/stat", e->d_name);
		if (!(f = fopen(path, "r")))
			continue;
		/* "tid (comm) S ...": the state follows the last ')' */
		if (fgets(line, sizeof line, f) && (c = strrchr(line, ')')) && c[1] == ' ' && c[2] == 'R')
			n++;
		fclose(f);
	}
	closedir(d);
	return n;
}

/* Whether a thread outside this process can run now: the machine's
 * runnable threads (/proc/loadavg) outnumber this process's, counted
 * before and after (a thread of ours may stop between the reads). 1
 * where /proc cannot say. */
static int others_runnable(void)
{
	char line[128];
	int all = -1, own0 = own_runnable(), own1;
	FILE *f = fopen("/proc/loadavg", "r");

	if (f) {
		if (!fgets(line, sizeof line, f) || sscanf(line, "%*s %*s %*s %d/", &all) != 1)
			all = -1;
		fclose(f);
	}
	own1 = own_runnable();
	return all < 0 || own0 < 0 || all > (own0 > own1 ? own0 : own1);
}

/* Give the core to other work that wants it, if any: 1 when other work
 * took it (the thread was switched out since *seen, which is updated,
 * for TAKEN_US or more, and a thread of another process wants to run) for
 * the second time within AGAIN_US: the machine is busy, marked so for
 * BUSY_US; else 0. Neither time the hypervisor takes from the virtual
 * machine (no switch), nor a kernel thread's occasional turn, nor this
 * process's own threads count: OpenMP's team works or spins on these
 * cores after a region, and a turn of it is no reason for the pool to
 * sleep (measured on a 2-vCPU machine: after a prefill or `hi3 bench`'s
 * fill of its read buffer, both OpenMP, the team slept through 1-14 of
 * the 48 decode steps in 5 of 6 bench runs, its workers starting 30-60 us
 * late on each job). */
static int yield_core(long *seen)
{
	const double t0 = now_us();
	double t, last;
	long n;

	sched_yield();
	if ((t = now_us()) - t0 < TAKEN_US || (n = switches()) == *seen)
		return 0;
	*seen = n;
	if (!others_runnable())
		return 0;
	last = atomic_exchange_explicit(&pool.taken_at, t, memory_order_relaxed);
	if (t - last > AGAIN_US)
		return 0;
	atomic_store_explicit(&pool.busy_until, t + BUSY_US, memory_order_relaxed);
	return 1;
}

static int machine_busy(void)
{
	return now_us() < atomic_load_explicit(&pool.busy_until, memory_order_relaxed);
}

/* Read the bytes of the last hi3i_pool_prefetch into cache, the worker
 * of this index taking every pf_workers-th 4 KiB block, until the job after
 * seen comes. */
static void read_ahead(int index, unsigned seen)
{
	const char *p = (const char *)atomic_load(&pool.pf_p);
	const size_t n = atomic_load(&pool.pf_n), step = (size_t)atomic_load(&pool.pf_workers) * 4096;

	for (size_t b = (size_t)(index - 1) * 4096; p && b < n; b += step) {
		if (atomic_load_explicit(&pool.gen, memory_order_relaxed) != seen)
			return;
		for (size_t o = b; o < b + 4096 && o < n; o += 64)
			PREFETCH(p + o);
	}
}

/* Wait for gen to move past seen: poll, yielding the core on every turn,
 * then sleep. On a machine found busy (yield_core) every worker sleeps at
 * once instead: a polling worker would take a core that other work wants,
 * and waking a worker on a busy core is cheap. */
static unsigned wait_job(int index, unsigned seen, unsigned *pf_seen)
{
	const double until = now_us() + HI3I_POOL_SPIN_US;
	long sw = switches();
	unsigned g, pg;

	if (!machine_busy()) {
		for (int turn = 1;; turn++) {
			for (int i = 0; i < 16; i++) {
				if ((g = atomic_load_explicit(&pool.gen, memory_order_acquire)) != seen)
					return g;
				if ((pg = atomic_load_explicit(&pool.pf_gen, memory_order_acquire)) != *pf_seen) {
					*pf_seen = pg;
					read_ahead(index, seen);
				}
				hi3i_pool_relax();
			}
			if (yield_core(&sw) || (turn % 16 == 0 && now_us() > until))
				break;
		}
	}
	pthread_mutex_lock(&pool.lock);
	atomic_fetch_add(&pool.sleepers, 1);
	while ((g = atomic_load(&pool.gen)) == seen)
		pthread_cond_wait(&pool.wake, &pool.lock);
	atomic_fetch_sub(&pool.sleepers, 1);
	pthread_mutex_unlock(&pool.lock);
	return g;
}

/* Whether a worker takes part in the job of gen g, and its id there: a
 * worker's own (index) in a job for every worker, the order it joined in
 * a shared job that is still open. */
static int join(unsigned g, int index, int *id)
{
	uint64_t t = atomic_load(&pool.ticket);

	for (;;) {
		if ((unsigned)(t >> 32) != g)
			return 0;         /* a later job: the worker's next wait returns it */
		if (!(t & T_SHARED)) {
			*id = index;
			return 1;
		}
		if (t & T_CLOSED)
			return 0;
		if (atomic_compare_exchange_weak(&pool.ticket, &t, t + 1)) {
			*id = (int)(t & T_COUNT) + 1;
			return 1;
		}
	}
}

static void *worker(void *p)
{
	const int index = (int)(intptr_t)p;
	unsigned seen = pool.first[index], pf_seen = atomic_load(&pool.pf_gen);
	int id;

	for (;;) {
		seen = wait_job(index, seen, &pf_seen);
		if (!join(seen, index, &id))
			continue;
		if (id < pool.nt)
			pool.fn(pool.arg, id, pool.nt);
		if (atomic_fetch_add(&pool.done, 1) + 1 >= atomic_load(&pool.target) &&
		    atomic_load(&pool.caller_sleeps)) {
			pthread_mutex_lock(&pool.lock);
			pthread_cond_signal(&pool.fin);
			pthread_mutex_unlock(&pool.lock);
		}
	}
	return NULL;
}

/* A child of fork has the caller's thread only: it starts a team of its own. */
static void forget_workers(void)
{
	pthread_mutex_init(&pool.run, NULL);
	pthread_mutex_init(&pool.lock, NULL);
	pthread_cond_init(&pool.wake, NULL);
	pthread_cond_init(&pool.fin, NULL);
	atomic_store(&pool.caller_sleeps, 0);
	pool.n = 0;
	atomic_store(&pool.sleepers, 0);
	atomic_store(&pool.ticket, (uint64_t)atomic_load(&pool.gen) << 32);
}

static void register_fork(void)
{
	pthread_atfork(NULL, NULL, forget_workers);
}

/* Start workers up to want - 1 of them; the threads a job can have. */
static int grow(int want)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, register_fork);
	if (want - 1 > MAX_WORKERS)
		want = MAX_WORKERS + 1;
	while (pool.n < want - 1) {
		pthread_attr_t at;
		pthread_t t;
		int rc;

		if (pthread_attr_init(&at) != 0)
			break;
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		pool.first[pool.n + 1] = atomic_load(&pool.gen);
		rc = pthread_create(&t, &at, worker, (void *)(intptr_t)(pool.n + 1));
		pthread_attr_destroy(&at);
		if (rc != 0)
			break;
		pool.n++;
	}
	return pool.n + 1;
}

/* Run a job (hi3i_pool_run, hi3i_pool_share). */
static int run(hi3i_pool_fn fn, void *arg, int want, int shared)
{
	int nt, target;

	if (want <= 1 || omp_in_parallel() || pthread_mutex_trylock(&pool.run) != 0) {
		fn(arg, 0, 1);
		return 1;
	}
	nt = grow(want);
	if (nt > want)
		nt = want;
	if (nt == 1) {
		pthread_mutex_unlock(&pool.run);
		fn(arg, 0, 1);
		return 1;
	}
	pool.fn = fn;
	pool.arg = arg;
	pool.nt = nt;
	atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
	atomic_store(&pool.target, shared ? INT_MAX : pool.n);
	atomic_store(&pool.ticket, (uint64_t)(atomic_load(&pool.gen) + 1u) << 32 | (shared ? T_SHARED : 0));
	atomic_fetch_add(&pool.gen, 1);
	if (atomic_load(&pool.sleepers) > 0) {
		pthread_mutex_lock(&pool.lock);
		pthread_cond_broadcast(&pool.wake);
		pthread_mutex_unlock(&pool.lock);
	}
	fn(arg, 0, nt);
	target = shared ? (int)(atomic_fetch_or(&pool.ticket, T_CLOSED) & T_COUNT) : pool.n;
	if (shared) {
		atomic_store(&pool.target, target);
		if (nt > target + 1)
			nt = target + 1;
	}
	/* the workers end about when the caller does: poll, yielding, and
	 * on a busy machine sleep until the last of them signals */
	if (atomic_load_explicit(&pool.done, memory_order_acquire) < target) {
		int poll = !machine_busy();
		long sw = switches();

		for (int turn = 1; poll && atomic_load_explicit(&pool.done, memory_order_acquire) < target; turn++)
			if (turn % 16 == 0)
				poll = !yield_core(&sw);
			else
				hi3i_pool_relax();
		if (!poll) {
			pthread_mutex_lock(&pool.lock);
			atomic_store(&pool.caller_sleeps, 1);
			while (atomic_load(&pool.done) < target)
				pthread_cond_wait(&pool.fin, &pool.lock);
			atomic_store(&pool.caller_sleeps, 0);
			pthread_mutex_unlock(&pool.lock);
		}
	}
	pthread_mutex_unlock(&pool.run);
	return nt;
}

int hi3i_pool_run(hi3i_pool_fn fn, void *arg, int want)
{
	return run(fn, arg, want, 0);
}

int hi3i_pool_share(hi3i_pool_fn fn, void *arg, int want)
{
	return run(fn, arg, want, 1);
}

void hi3i_pool_prefetch(const void *p, size_t n)
{
	/* no workers, the team asleep or another thread's job running: nobody to read */
	if (atomic_load(&pool.sleepers) > 0 || machine_busy() || pthread_mutex_trylock(&pool.run) != 0)
		return;
	if (pool.n) {
		atomic_store(&pool.pf_workers, pool.n);
		atomic_store(&pool.pf_n, n);
		atomic_store(&pool.pf_p, (uintptr_t)p);
		atomic_fetch_add_explicit(&pool.pf_gen, 1, memory_order_release);
	}
	pthread_mutex_unlock(&pool.run);
}
