/*
 * Who runs the send queues of the software RDMA device. A send work request is copied
 * into the QP's process-local send queue at post time and executed in order by the
 * engine of the QP's NIC: one thread per NIC of this process, so that the NICs of a
 * process move data in parallel, as hardware does, and the posting thread (NCCL's
 * single proxy thread) does not copy. The engine serves its QPs round-robin, a slice
 * (up to SV_SLICE bytes: one slice of a large request, or several small requests) per
 * QP with work per round, so a QP never waits behind another's bulk; when the NIC is
 * shaped, each slice takes its turn on the NIC's clock in shared memory, which
 * interleaves the processes of a node that share the NIC the same way. Requests of up
 * to SV_POST_RUN bytes run at once in the posting thread when the engine is not busy
 * with that QP, which keeps small-message latency free of a thread hand-over. With
 * SOFTVERBS_ENGINES=0 everything runs in the posting thread, and what has to wait
 * (shaping, a missing receive, a path that does not answer) in this process's progress
 * thread. exec.c executes the requests.
 */
#include "softverbs/internal.h"

#include <signal.h>
#include <stdio.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SV_IDLE_TICK   2000000 /* ns: port events, scheduled faults, faults seen by engines */
#define SV_REAP_PERIOD 200000000
#define SV_POST_RUN    65536	  /* bytes a posting thread executes itself, per call */
#define SV_SOLO	       (1u << 20) /* per round when no other QP of the engine has work */
#define SV_ENG_SPIN    50000	  /* ns an engine that just worked polls before sleeping */

/*
 * ---- engines ----
 *
 * One thread per NIC of this process runs the send queues of that NIC's QPs in
 * rounds: each QP that is due gets one step (SV_SLICE bytes) per round, so they are
 * served round-robin. A posting thread hands a QP over by setting its `ready` flag and
 * bumping the engine's futex word; the engine sleeps on that word when it has nothing
 * to do, with a timeout at the earliest time one of its QPs waits for (shaping, RNR,
 * jitter, a silent path) but no longer than SV_IDLE_TICK while any QP has work: faults
 * are set by other processes and wake nobody. After a hand-over it polls the word
 * briefly, so a stream of requests needs no wake-up system call.
 */
struct sv_engine {
	pthread_mutex_t lock; /* qps; held while running them */
	struct sv_qp *qps;
	_Atomic uint32_t seq; /* futex word, bumped by every hand-over */
	_Atomic bool sleeping;
	bool started;
	pthread_t thread;
};

static struct sv_engine sv_engines[SV_MAX_NICS];

static inline void sv_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

static void sv_engine_hand(struct sv_qp *qp)
{
	struct sv_engine *e = qp->eng;

	if (atomic_exchange(&qp->ready, true))
		return; /* whoever set it wakes the engine */
	atomic_fetch_add(&e->seq, 1);
	if (atomic_load(&e->sleeping))
		syscall(SYS_futex, &e->seq, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* After publishing: small requests go at once unless the engine is running this QP. */
void sv_sq_kick(struct sv_qp *qp, int64_t now)
{
	int64_t wake = 0;

	if (qp->eng) {
		if (pthread_mutex_trylock(&qp->lock) == 0) {
			wake = sv_qp_step(qp, now, SV_POST_RUN, SV_POST_RUN);
			pthread_mutex_unlock(&qp->lock);
		}
		if (wake != SV_NEVER)
			sv_engine_hand(qp);
		return;
	}
	pthread_mutex_lock(&qp->lock);
	wake = sv_qp_step(qp, now, UINT64_MAX, UINT64_MAX);
	pthread_mutex_unlock(&qp->lock);
	if (wake != SV_NEVER)
		sv_kick();
}

static void *sv_engine_main(void *arg)
{
	struct sv_engine *e = arg;
	int busy = 0; /* QPs with work after the last round */

	/* Shaped slices land at their wire time: wake then, not 50 us later. */
	prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
	for (;;) {
		uint32_t seq = atomic_load(&e->seq);
		int64_t now = sv_now_ns(), next = SV_NEVER, spin_end;
		/*
		 * Copies are cheaper large: a QP alone with work gets SV_SOLO per round. With
		 * others waiting (for their turn on the wire too), one slice each, or the QPs
		 * first in the list would take more turns whenever the engine catches up.
		 */
		uint64_t budget = busy > 1 ? SV_SLICE : SV_SOLO;
		bool handed = false;
		struct timespec ts;

		busy = 0;
		pthread_mutex_lock(&e->lock);
		for (struct sv_qp *qp = e->qps; qp; qp = qp->eng_next) {
			bool ready = atomic_exchange(&qp->ready, false);

			if (ready || qp->eng_wake <= now) {
				pthread_mutex_lock(&qp->lock);
				qp->eng_wake = sv_qp_step(qp, now, UINT64_MAX, budget);
				pthread_mutex_unlock(&qp->lock);
				now = sv_now_ns();
				handed |= ready;
			}
			busy += qp->eng_wake != SV_NEVER;
			if (qp->eng_wake < next)
				next = qp->eng_wake;
		}
		pthread_mutex_unlock(&e->lock);
		if (next <= now)
			continue;
		if (next != SV_NEVER && next > now + SV_IDLE_TICK)
			next = now + SV_IDLE_TICK;
		spin_end = handed ? now + SV_ENG_SPIN : now;
		while (atomic_load(&e->seq) == seq && now < spin_end && now < next) {
			sv_cpu_relax();
			now = sv_now_ns();
		}
		if (atomic_load(&e->seq) != seq || next <= now)
			continue;
		ts.tv_sec = next / 1000000000;
		ts.tv_nsec = next % 1000000000;
		atomic_store(&e->sleeping, true);
		/* FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC time, as sv_now_ns. */
		if (atomic_load(&e->seq) == seq)
			syscall(SYS_futex, &e->seq, FUTEX_WAIT_BITSET_PRIVATE, seq,
				next == SV_NEVER ? NULL : &ts, NULL, FUTEX_BITSET_MATCH_ANY);
		atomic_store(&e->sleeping, false);
	}
	return NULL;
}

/* The engine of a NIC of this process, started on first use; NULL if it cannot start. */
struct sv_engine *sv_engine_get(int nic)
{
	struct sv_engine *e = &sv_engines[nic];
	sigset_t all, old;
	char name[16];

	pthread_mutex_lock(&sv_proc.lock);
	if (!e->started) {
		pthread_mutex_init(&e->lock, NULL);
		sigfillset(&all);
		pthread_sigmask(SIG_BLOCK, &all, &old);
		if (pthread_create(&e->thread, NULL, sv_engine_main, e) == 0) {
			snprintf(name, sizeof(name), "sv-%s", sv_proc.f->nics[nic].name);
			pthread_setname_np(e->thread, name);
			e->started = true;
		} else {
			fprintf(stderr,
				"softverbs: cannot start the engine of %s, its QPs run inline\n",
				sv_proc.f->nics[nic].name);
		}
		pthread_sigmask(SIG_SETMASK, &old, NULL);
	}
	pthread_mutex_unlock(&sv_proc.lock);
	return e->started ? e : NULL;
}

void sv_engine_add(struct sv_qp *qp)
{
	pthread_mutex_lock(&qp->eng->lock);
	qp->eng_next = qp->eng->qps;
	qp->eng->qps = qp;
	pthread_mutex_unlock(&qp->eng->lock);
}

/* Waits for the engine to leave the QP alone (it holds its lock while running it). */
void sv_engine_remove(struct sv_qp *qp)
{
	struct sv_qp **pp;

	pthread_mutex_lock(&qp->eng->lock);
	for (pp = &qp->eng->qps; *pp && *pp != qp; pp = &(*pp)->eng_next)
		;
	if (*pp)
		*pp = qp->eng_next;
	pthread_mutex_unlock(&qp->eng->lock);
}

void sv_engines_forget(void)
{
	memset(sv_engines, 0, sizeof(sv_engines));
}

/* ---- the progress thread ---- */

int64_t sv_progress_all(int64_t now)
{
	int64_t wake = SV_NEVER, w;

	pthread_mutex_lock(&sv_proc.lock);
	for (struct sv_qp *qp = sv_proc.qps; qp; qp = qp->next) {
		if (qp->eng)
			continue; /* its engine runs it */
		/* A thread posting on it runs it itself. */
		if (pthread_mutex_trylock(&qp->lock) != 0) {
			w = now + SV_RNR_POLL;
		} else {
			w = sv_qp_step(qp, now, UINT64_MAX, UINT64_MAX);
			pthread_mutex_unlock(&qp->lock);
		}
		if (w < wake)
			wake = w;
	}
	pthread_mutex_unlock(&sv_proc.lock);
	return wake;
}

static pthread_cond_t sv_cond;

void sv_kick(void)
{
	pthread_mutex_lock(&sv_proc.lock);
	sv_proc.kicked = true;
	if (sv_proc.thread_started)
		pthread_cond_signal(&sv_cond);
	pthread_mutex_unlock(&sv_proc.lock);
}

static void *sv_thread_main(void *arg)
{
	int64_t last_reap = 0;

	for (;;) {
		int64_t now = sv_now_ns(), wake = sv_progress_all(now);
		struct timespec ts;

		sv_ctx_check_ports(now);
		sv_srq_events();
		if (now - last_reap > SV_REAP_PERIOD) {
			sv_fabric_reap(sv_proc.f);
			sv_cq_rings_sweep();
			last_reap = now;
		}
		if (wake > now + SV_IDLE_TICK)
			wake = now + SV_IDLE_TICK;
		ts.tv_sec = wake / 1000000000;
		ts.tv_nsec = wake % 1000000000;
		pthread_mutex_lock(&sv_proc.lock);
		if (!sv_proc.kicked)
			pthread_cond_timedwait(&sv_cond, &sv_proc.lock, &ts);
		sv_proc.kicked = false;
		pthread_mutex_unlock(&sv_proc.lock);
	}
	return NULL;
}

void sv_thread_start(void)
{
	pthread_condattr_t ca;
	sigset_t all, old;

	pthread_mutex_lock(&sv_proc.lock);
	if (sv_proc.thread_started) {
		pthread_mutex_unlock(&sv_proc.lock);
		return;
	}
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&sv_cond, &ca);
	pthread_condattr_destroy(&ca);
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	if (pthread_create(&sv_proc.thread, NULL, sv_thread_main, NULL) == 0) {
		pthread_setname_np(sv_proc.thread, "softverbs");
		sv_proc.thread_started = true;
	} else {
		fprintf(stderr, "softverbs: cannot start the progress thread\n");
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_mutex_unlock(&sv_proc.lock);
}
