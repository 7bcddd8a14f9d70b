/*
 * Hot repair's engine (see engine.h for the flow of a repair, engine_priv.h for its
 * objects and locks): whether hot repair runs in this process, the verbs it calls,
 * R2CC's own QPs and CQs, the directories that say where the peer processes are,
 * the work queue, and the repair thread, which runs every piece of work that may
 * wait. Each turn it runs the stall scan when due, the fetch of the rkey maps that
 * held sends wait for, and failback's tick; then one inbox message, or else every
 * QP queued so far (fenced and moved as one batch); with neither, the sweeps of
 * freed records and directories and the exchanges' deadlines and re-sends.
 *
 * The files of a repair, in the order it runs:
 *   detect.c     something failed: port events, error completions, refused posts,
 *                declared failures (R2CC_FAILED_*), the peer's notice
 *   scan.c       or nothing completes: the stall scan and its probes
 *   localise.c   which part failed (the NIC, or the path to a peer NIC): the self-test
 *   fence.c      the old path stopped and drained
 *   placement.c  the NIC the QP moves to
 *   path.c       the new QP there, connected with the old one's path attributes
 *   wire.c,      the exchange with the peer's engine (its messages, and the
 *   exchange.c   protocol: REQ, REP, GO, NACK)
 *   landed.c     the clear-to-send writes that landed at the peer, asked about
 *                and not re-posted
 *   migrate.c    the exactly-once commit, then done or failed
 *   vcq.c, post.c  the data path of a moved QP, under NCCL's own objects
 *   failback.c   the NIC comes back, and the QPs with it
 *   incident.c   the timeline and the report
 * and rqp.c, the records of NCCL's QPs and CQs from creation to their end.
 */
#include "repair/engine_priv.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void repair_shutdown(void);
static void *repair_main(void *arg);

struct r2cc_engine r2cc_eng = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .cond = PTHREAD_COND_INITIALIZER,
    .node_index = -1,
};

/*
 * NCCL's own port failover (2.29.7+, NCCL_IB_RESILIENCY_PORT_FAILOVER, and the
 * failback of 2.30.3+, ..._PORT_RECOVERY) acts on the same error completions as
 * hot repair: both at once would each move QPs the other is moving. When either is
 * set to non-zero for an NCCL that reads it (or one whose version is not known
 * yet), R2CC steps aside: hot repair is off for the process, with one warning
 * naming the variable; counters, reports and the NCCL wrappers stay. An older
 * NCCL ignores the variables, and R2CC repairs as usual.
 */
static bool nccl_failover_on(void)
{
	static const char *const vars[] = {"NCCL_IB_RESILIENCY_PORT_FAILOVER",
					   "NCCL_IB_RESILIENCY_PORT_RECOVERY"};
	static int warned;
	int code = __atomic_load_n(&r2cc_nccl_version, __ATOMIC_RELAXED);
	if (code && code < 22907)
		return false;
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		const char *v = getenv(vars[i]);
		if (!v || !*v || !strcmp(v, "0"))
			continue;
		if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
			R2CC_WARN("%s=%s: NCCL's own port failover is on and acts on the same "
				  "errors; R2CC's hot repair steps aside (unset it to let R2CC "
				  "repair, or set R2CC_MODE=0)",
				  vars[i], v);
		return true;
	}
	return false;
}

/* An NCCL integer setting as NCCL reads it (strtoll): non-zero, or dflt unset. */
static bool env_on(const char *name, bool dflt)
{
	const char *v = getenv(name);
	return v && *v ? strtoll(v, NULL, 0) != 0 : dflt;
}

/*
 * NCCL settings under which the re-posted clear-to-send writes are not safe by
 * the model (repair/model/qp_shadow.h, tests/unit/test_qp_shadow_model.c): inline ones
 * carry the element as it was when posted, and a connection's data split over
 * several QPs per NIC puts one FIFO slot's writes on more than one QP. Hot repair
 * is off for the process then, with one warning naming the setting.
 */
static bool nccl_settings_unsafe(void)
{
	static int warned;
	const char *var = NULL, *val = NULL, *why = NULL;
	const char *qps = getenv("NCCL_IB_QPS_PER_CONNECTION");
	int code = __atomic_load_n(&r2cc_nccl_version, __ATOMIC_RELAXED);
	if (env_on("NCCL_IB_USE_INLINE", false)) {
		var = "NCCL_IB_USE_INLINE";
		val = getenv(var);
		why = "inline writes carry the element as it was when posted";
	} else if (qps && atoi(qps) > 1 &&
		   env_on("NCCL_IB_SPLIT_DATA_ON_QPS", code && code < 22000)) {
		var = "NCCL_IB_QPS_PER_CONNECTION";
		val = qps;
		why = "with NCCL_IB_SPLIT_DATA_ON_QPS one FIFO slot's writes travel on several QPs";
	}
	if (var && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
		R2CC_WARN("%s=%s: hot repair cannot re-post NCCL's clear-to-send writes safely "
			  "with it (%s); hot repair is off for this process (unset it to let "
			  "R2CC repair)",
			  var, val, why);
	return var != NULL;
}

bool r2cc_repair_enabled(void)
{
	return r2cc_active() && r2cc_param.mode != 0 && !nccl_failover_on() &&
	       !nccl_settings_unsafe();
}

void r2cc_repair_set_verbs(const struct r2cc_repair_verbs *v)
{
	pthread_mutex_lock(&r2cc_eng.mu);
	r2cc_eng.v = *v;
	r2cc_eng.have_verbs = v->create_cq && v->destroy_cq && v->create_qp && v->modify_qp &&
			      v->destroy_qp && v->query_port;
	pthread_mutex_unlock(&r2cc_eng.mu);
}

void r2cc_own_add(void *obj)
{
	pthread_mutex_lock(&r2cc_eng.mu);
	if (r2cc_eng.nown == r2cc_eng.owncap) {
		int cap = r2cc_eng.owncap ? 2 * r2cc_eng.owncap : 32;
		void **n = realloc(r2cc_eng.own, (size_t)cap * sizeof(*n));
		if (n) {
			r2cc_eng.own = n;
			r2cc_eng.owncap = cap;
		}
	}
	if (r2cc_eng.nown < r2cc_eng.owncap)
		r2cc_eng.own[r2cc_eng.nown++] = obj;
	pthread_mutex_unlock(&r2cc_eng.mu);
}

void r2cc_own_remove(void *obj)
{
	pthread_mutex_lock(&r2cc_eng.mu);
	for (int i = 0; i < r2cc_eng.nown; i++)
		if (r2cc_eng.own[i] == obj) {
			r2cc_eng.own[i] = r2cc_eng.own[--r2cc_eng.nown];
			break;
		}
	pthread_mutex_unlock(&r2cc_eng.mu);
}

bool r2cc_own_has(const void *obj)
{
	bool found = false;
	pthread_mutex_lock(&r2cc_eng.mu);
	for (int i = 0; i < r2cc_eng.nown && !found; i++)
		found = r2cc_eng.own[i] == obj;
	pthread_mutex_unlock(&r2cc_eng.mu);
	return found;
}

bool r2cc_repair_owns_qp(const struct ibv_qp *qp)
{
	return r2cc_own_has(qp);
}

bool r2cc_repair_owns_cq(const struct ibv_cq *cq)
{
	return r2cc_own_has(cq);
}

void r2cc_repair_add_dir(struct r2cc_ctl_dir *dir)
{
	if (!dir)
		return;
	pthread_mutex_lock(&r2cc_eng.mu);
	if (r2cc_eng.ndirs == r2cc_eng.dircap) {
		int cap = r2cc_eng.dircap ? 2 * r2cc_eng.dircap : 8;
		struct r2cc_ctl_dir **n = realloc(r2cc_eng.dirs, (size_t)cap * sizeof(*n));
		if (!n) {
			pthread_mutex_unlock(&r2cc_eng.mu);
			r2cc_ctl_dir_free(dir);
			return;
		}
		r2cc_eng.dirs = n;
		r2cc_eng.dircap = cap;
	}
	r2cc_eng.dirs[r2cc_eng.ndirs++] = dir;
	/* Peers may ask before this process has a QP of its own. */
	r2cc_engine_start_locked();
	bool first = r2cc_eng.node_index < 0;
	if (first) {
		r2cc_eng.node_index = r2cc_ctl_dir_node(dir, dir->self_rank);
		char err[320];
		if (r2cc_failspec_parse(r2cc_param.failed_node, r2cc_param.failed_hca,
					&r2cc_eng.declared, err, sizeof(err)))
			r2cc_eng.declared.nentries = 0; /* validated at start-up already */
	}
	pthread_mutex_unlock(&r2cc_eng.mu);
	r2cc_peer_add_dir(dir);
	if (first)
		r2cc_declared_apply();
}

/*
 * The communicator of dir is gone: its peers are found through the other jobs
 * from now on, the rendezvous hears that this rank left, and the directory is
 * freed once no queue pair's repair uses it (a migrated QP keeps translating
 * its peer's keys through it until NCCL destroys the QP).
 */
void r2cc_repair_release_dir(struct r2cc_ctl_dir *dir)
{
	if (!dir)
		return;
	struct retired_dir *rd = malloc(sizeof(*rd));
	r2cc_peer_remove_dir(dir);
	r2cc_ctl_dir_leave(dir);
	pthread_mutex_lock(&r2cc_eng.mu);
	bool found = false;
	for (int i = 0; i < r2cc_eng.ndirs && !found; i++)
		if (r2cc_eng.dirs[i] == dir) {
			memmove(&r2cc_eng.dirs[i], &r2cc_eng.dirs[i + 1],
				sizeof(*r2cc_eng.dirs) * (size_t)(r2cc_eng.ndirs - i - 1));
			r2cc_eng.ndirs--;
			found = true;
		}
	if (found && rd) {
		rd->dir = dir;
		rd->next = r2cc_eng.retired;
		r2cc_eng.retired = rd;
		rd = NULL;
	}
	pthread_mutex_unlock(&r2cc_eng.mu);
	/* Out of memory for the list: kept for good rather than freed while used. */
	free(rd);
}

const struct r2cc_job_dir_ops r2cc_repair_dir_ops = {
    .take = r2cc_repair_enabled,
    .add = r2cc_repair_add_dir,
    .release = r2cc_repair_release_dir,
};

/* Frees the released directories no live queue pair refers to. Under r2cc_eng.mu. */
static void dirs_sweep_locked(void)
{
	for (struct retired_dir **pp = &r2cc_eng.retired; *pp;) {
		struct retired_dir *rd = *pp;
		bool used = false;
		used = r2cc_eng.dir_borrowed == rd->dir;
		for (struct r2cc_rqp *r = r2cc_eng.all; r && !used; r = r->next_all)
			used = !r->dead && r->dir == rd->dir;
		if (used) {
			pp = &rd->next;
			continue;
		}
		*pp = rd->next;
		bool same_job = false;
		for (int i = 0; i < r2cc_eng.ndirs && !same_job; i++)
			same_job = r2cc_eng.dirs[i]->job.id == rd->dir->job.id;
		if (!same_job)
			r2cc_mr_mirror_remote_forget(rd->dir->job.id, -1);
		r2cc_ctl_dir_free(rd->dir);
		free(rd);
	}
}

const struct r2cc_ctl_dir *r2cc_dir_of_job(uint64_t job_id, int rank)
{
	const struct r2cc_ctl_dir *d = NULL;
	pthread_mutex_lock(&r2cc_eng.mu);
	for (int i = r2cc_eng.ndirs - 1; i >= 0 && !d; i--)
		if (r2cc_eng.dirs[i]->job.id == job_id && rank >= 0 &&
		    rank < r2cc_eng.dirs[i]->nranks)
			d = r2cc_eng.dirs[i];
	pthread_mutex_unlock(&r2cc_eng.mu);
	return d;
}

/*
 * The process that owns r's peer QP, as repair/peer.c found it when the QP
 * reached RTS: 0 and r->dir / r->peer_rank set; -EAGAIN while it is still
 * being searched (the search is hurried), also when no directory is here yet
 * but a registration is on its way; -ENOENT when there is nobody to ask (no
 * communicator with a directory, or the QP is not tracked).
 */
int r2cc_rqp_peer(struct r2cc_rqp *r)
{
	const struct r2cc_ctl_dir *dir;
	int rank;
	pthread_mutex_lock(&r2cc_eng.mu);
	bool dirs = r2cc_eng.ndirs > 0;
	pthread_mutex_unlock(&r2cc_eng.mu);
	if (!r->tracked || (!dirs && !r2cc_job_registering()))
		return -ENOENT;
	int rc = r2cc_peer_of(&r->ep_local, &dir, &rank);
	if (rc == -EAGAIN)
		r2cc_peer_hurry(&r->ep_local);
	if (rc)
		return rc;
	pthread_mutex_lock(&r->mu);
	r->dir = dir;
	r->peer_rank = rank;
	pthread_mutex_unlock(&r->mu);
	return 0;
}

/* Under r2cc_eng.mu. */
void r2cc_engine_start_locked(void)
{
	if (r2cc_eng.started)
		return;
	r2cc_eng.started = true;
	__atomic_store_n(&r2cc_report_incidents_hook, r2cc_repair_report, __ATOMIC_RELEASE);
	__atomic_store_n(&r2cc_report_stalls_hook, r2cc_report_stalls, __ATOMIC_RELEASE);
	r2cc_eng.in_tail = &r2cc_eng.in_head;
	r2cc_peer_set_notify(r2cc_exchange_peer_found);
	if (r2cc_ctl_set_handler(R2CC_REPAIR_MSG, r2cc_wire_on_msg, NULL) || r2cc_mr_mirror_serve())
		R2CC_WARN("repair: cannot register the control-plane handlers; repairs that need "
			  "the peer will fail");
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	if (pthread_create(&r2cc_eng.thread, NULL, repair_main, NULL)) {
		R2CC_WARN("repair: cannot start the repair thread; hot repair is off");
		r2cc_eng.started = false;
	} else {
		pthread_setname_np(r2cc_eng.thread, "r2cc-repair");
		pthread_detach(r2cc_eng.thread);
		__atomic_store_n(&r2cc_eng.running, true, __ATOMIC_RELEASE);
		r2cc_eng.pid = getpid();
		atexit(repair_shutdown);
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/*
 * At exit, before the control plane goes (atexit runs this first): the repair
 * thread and the self-tests stop and return, so that none of them runs on while
 * the process's destructors free what they use. Bounded: a thread still inside a
 * verbs or network call after 200 ms is left to the process's end. A forked child
 * has no such threads (and its copy of the lock may be held): nothing to do.
 */
static void repair_shutdown(void)
{
	if (getpid() != r2cc_eng.pid)
		return;
	/* Never waits for the lock: exit() may come while a thread holds it. The repair
	 * thread sees the flag at its next turn (it waits at most a scan's period). */
	__atomic_store_n(&r2cc_eng.stop, true, __ATOMIC_RELEASE);
	if (pthread_mutex_trylock(&r2cc_eng.mu) == 0) {
		pthread_cond_broadcast(&r2cc_eng.cond);
		pthread_mutex_unlock(&r2cc_eng.mu);
	}
	int64_t until = now_ns() + 200000000ll;
	bool busy;
	while ((busy = __atomic_load_n(&r2cc_eng.running, __ATOMIC_ACQUIRE) ||
		       __atomic_load_n(&r2cc_eng.selftests, __ATOMIC_ACQUIRE)) &&
	       now_ns() < until)
		usleep(1000);
	if (busy)
		R2CC_INFO("repair: at exit, %s still in a call; left to the process's end",
			  __atomic_load_n(&r2cc_eng.running, __ATOMIC_ACQUIRE)
			      ? "the repair thread is"
			      : "a self-test is");
}

/* r onto the repair thread's queue (once), and the thread woken. Under r2cc_eng.mu. */
void r2cc_work_push_locked(struct r2cc_rqp *r)
{
	if (!r->queued) {
		r->queued = true;
		r->next_work = r2cc_eng.work_head;
		r2cc_eng.work_head = r;
	}
	pthread_cond_broadcast(&r2cc_eng.cond);
}

void r2cc_batch_add(struct batch *b, struct r2cc_rqp *r)
{
	if (b->n == b->cap) {
		int cap = b->cap ? 2 * b->cap : 64;
		struct r2cc_rqp **g = realloc(b->r, sizeof(*g) * (size_t)cap);
		if (!g) {
			/* Leave it queued: the next round takes it. While memory stays
			 * short that is never, and NCCL would wait forever on a QP
			 * whose errors are hidden: past a bound it gets them. */
			int64_t t = now_ns();
			if (!r->oom_since)
				r->oom_since = t;
			bool give_up = t - r->oom_since > OOM_GIVEUP_NS;
			if (give_up)
				r2cc_rqp_fail(r, "out of memory for its repair");
			pthread_mutex_lock(&r2cc_eng.mu);
			r->busy = false;
			if (!give_up)
				r2cc_work_push_locked(r);
			else
				pthread_cond_broadcast(&r2cc_eng.cond);
			pthread_mutex_unlock(&r2cc_eng.mu);
			return;
		}
		b->r = g;
		b->cap = cap;
	}
	r->oom_since = 0;
	b->r[b->n++] = r;
}

/* Every queued record waiting for its repair, marked busy. Under r2cc_eng.mu. */
void r2cc_work_take_locked(struct batch *b)
{
	while (r2cc_eng.work_head) {
		struct r2cc_rqp *r = r2cc_eng.work_head;
		r2cc_eng.work_head = r->next_work;
		r->queued = false;
		if (r->dead || load_state(r) != RQ_DETECTED)
			continue;
		r->busy = true;
		pthread_mutex_unlock(&r2cc_eng.mu);
		r2cc_batch_add(b, r);
		pthread_mutex_lock(&r2cc_eng.mu);
	}
}

void r2cc_batch_release(struct batch *b)
{
	pthread_mutex_lock(&r2cc_eng.mu);
	for (int i = 0; i < b->n; i++)
		if (b->r[i])
			b->r[i]->busy = false;
	pthread_cond_broadcast(&r2cc_eng.cond);
	pthread_mutex_unlock(&r2cc_eng.mu);
	free(b->r);
	*b = (struct batch){0};
}

static void *repair_main(void *arg)
{
	(void)arg;
	int64_t next_scan = now_ns() + SCAN_NS;
	/* the data path's counts reach the NICs' counters through this thread */
	r2cc_counters_folding(true);
	pthread_mutex_lock(&r2cc_eng.mu);
	while (!__atomic_load_n(&r2cc_eng.stop, __ATOMIC_ACQUIRE)) {
		/* The scan runs between pieces of work too: the load model the
		 * self-tests judge by must stay current during a repair. */
		int64_t t0 = now_ns();
		if (t0 >= next_scan) {
			r2cc_scan(t0);
			next_scan = t0 + SCAN_NS;
		}
		if (__atomic_load_n(&r2cc_eng.keys_due, __ATOMIC_ACQUIRE)) {
			pthread_mutex_unlock(&r2cc_eng.mu);
			r2cc_keys_tick();
			pthread_mutex_lock(&r2cc_eng.mu);
		}
		if (t0 >= r2cc_eng.next_failback) {
			r2cc_eng.next_failback = t0 + SCAN_NS;
			pthread_mutex_unlock(&r2cc_eng.mu);
			r2cc_failback_tick(t0);
			r2cc_counters_fold();
			pthread_mutex_lock(&r2cc_eng.mu);
		}
		if (!r2cc_eng.work_head && !r2cc_eng.in_head) {
			int64_t t = now_ns();
			if (t - r2cc_eng.last_dir_sweep > DIR_SWEEP_NS) {
				dirs_sweep_locked();
				r2cc_eng.last_dir_sweep = t;
			}
			if (t - r2cc_eng.last_record_sweep > RECORD_SWEEP_NS) {
				r2cc_records_sweep_locked();
				r2cc_eng.last_record_sweep = t;
			}
			/* deadlines and re-sends of exchanges in flight */
			pthread_mutex_unlock(&r2cc_eng.mu);
			r2cc_exchange_tick(t);
			pthread_mutex_lock(&r2cc_eng.mu);
			if (r2cc_eng.work_head || r2cc_eng.in_head)
				continue;
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += SCAN_NS;
			if (ts.tv_nsec >= 1000000000L) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000L;
			}
			pthread_cond_timedwait(&r2cc_eng.cond, &r2cc_eng.mu, &ts);
			continue;
		}
		if (r2cc_eng.in_head) {
			struct inbox *in = r2cc_inbox_pop_locked();
			pthread_mutex_unlock(&r2cc_eng.mu);
			r2cc_exchange_handle(in);
			free(in);
			pthread_mutex_lock(&r2cc_eng.mu);
			continue;
		}
		/* Everything detected so far, repaired together. */
		struct batch b = {0};
		r2cc_work_take_locked(&b);
		pthread_mutex_unlock(&r2cc_eng.mu);
		r2cc_exchange_initiate(&b);
		r2cc_batch_release(&b);
		pthread_mutex_lock(&r2cc_eng.mu);
	}
	pthread_mutex_unlock(&r2cc_eng.mu);
	r2cc_counters_folding(false);
	__atomic_store_n(&r2cc_eng.running, false, __ATOMIC_RELEASE);
	return NULL;
}
