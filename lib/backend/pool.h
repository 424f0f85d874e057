/*
 * pool.h -- the CPU backend's team for short parallel work: the products
 * of a decode step, a few rows of x against each weight matrix, dozens of
 * them per step, each 20-500 us (gemm.c), and the step's attention
 * (cpu.c).
 *
 * OpenMP's workers in hi3 sleep between regions (bin/hi3.c chooses
 * OMP_WAIT_POLICY=passive, as spinning workers starve other work on
 * shared cores), and on a virtual machine whose cores are idle, waking a
 * sleeping worker costs about 100 us (its core has halted): measured, a
 * B = 1 decode step of the `small` preset spent 40% of its time so. The
 * pool's workers poll for the next job for HI3I_POOL_SPIN_US after the
 * last one, and only then sleep: the gaps between a step's products are
 * shorter, so a step pays for one wake-up, not one per product. A worker
 * that finds it lost its core while polling, with another process's
 * threads wanting to run (other work wants the cores; this process's own
 * OpenMP threads do not count), makes the team sleep at once for a while
 * instead: there, polling would take a core from that work, and waking a
 * worker on a busy core is cheap.
 *
 * A job is fn(arg, id, nt) on nt threads, id 0 the caller. What each id
 * computes is the caller's choice; the pool only decides how many run.
 */
#ifndef HI3_POOL_H
#define HI3_POOL_H

#include <stddef.h>

/* Rows of activations (a decode step's: a few) at most, for which the
 * backend's products (gemm.c) and attention (cpu.c) run on the pool
 * rather than on OpenMP's threads. */
#define HI3I_POOL_ROWS 16

/* How long an idle worker keeps polling for the next job before it
 * sleeps, in microseconds. */
#define HI3I_POOL_SPIN_US 2000

typedef void (*hi3i_pool_fn)(void *arg, int id, int nt);

/* One turn of a loop that waits for another thread's store: a pause
 * where the processor has one (x86's PAUSE), else nothing. */
static inline void hi3i_pool_relax(void)
{
#if defined(__x86_64__)
	__builtin_ia32_pause();
#endif
}

/* Run fn(arg, id, nt) for id in [0, nt) and return when every call has
 * returned; the caller runs id 0. nt is at most want: fewer when workers
 * cannot be started, 1 (the caller alone) inside an OpenMP parallel
 * region or while another thread runs a job of the pool. Returns nt. */
int hi3i_pool_run(hi3i_pool_fn fn, void *arg, int want);

/* Run a job whose parts any of its threads may take: fn(arg, id, nt)
 * takes work from the job's own counter until none is left, id and nt
 * only hints. The caller runs fn; workers that come while it runs join
 * in (ids 1, 2, ... in the order they come, those from nt on do
 * nothing), and when the caller's fn returns the job closes: the caller
 * waits for the workers that joined, not for the others, which never
 * call fn. So a worker that is late (woken from sleep, or its core taken)
 * costs the job its help, not a wait. Returns the threads that ran fn. */
int hi3i_pool_share(hi3i_pool_fn fn, void *arg, int want);

/* Bytes [p, p + n) that the next job will read first: workers waiting
 * for it read them into cache meanwhile (prefetch instructions, 4 KiB
 * blocks in turn), each stopping when that job comes. Returns at once;
 * nothing happens while the team sleeps or a job runs. */
void hi3i_pool_prefetch(const void *p, size_t n);

#endif
