/*
 * The control thread and everything it owns: the listener(s), connections,
 * the rendezvous of the jobs this process stamped, request/reply matching and
 * the handler table. Other threads never touch a socket: they queue frames
 * (out queue), register waiters (pending list) and sleep on done_cv; the
 * control thread seals frames with the job key, writes them, and completes
 * waiters. All sockets are non-blocking and polled, each connection has its
 * own bounded buffers and timeouts, so one slow or hostile peer costs only
 * its own connection. A stranger costs less still: incoming connections that
 * have not delivered an authenticated frame are capped per source address (in
 * number and in buffered bytes) and in all, and are closed when they have not
 * authenticated within a few seconds of accept. An authenticated frame is
 * acted on only when it is addressed to a rank this process holds in its job
 * (or to the rendezvous), so a frame captured on its way to one process and
 * replayed to another is dropped. Frames for a job not known here yet wait
 * briefly in a bounded park (see park() in ctl_loop.c). The thread waits in epoll;
 * connections are found by id and by destination through hash maps and
 * waiters by request id, so nothing it does per frame grows with the number
 * of connections (the rendezvous of a large job holds one per rank).
 * Timeouts are swept every CTL_POLL_MS, not per event.
 *
 * The files: this one has the state below, the counters, jobs and waiters,
 * start-up, fork and shutdown; ctl_loop.c the thread's loop and the dispatch
 * of frames; ctl_conn.c the connections and sending; ctl_rdv.c the
 * rendezvous; ctl_req.c the calling side (requests, registration).
 * ctl_thread.h has what they share.
 *
 * Lock order: r2cc_ctl.start_lock, then r2cc_ctl.lock. Nothing else is taken under
 * r2cc_ctl.lock, and the control thread holds neither while it does socket I/O or
 * runs a handler (handlers may call r2cc_ctl_send()).
 *   start_lock: starting and stopping the thread, the listeners.
 *   lock: out queue, pending requests, jobs list, handlers, the conns array
 *         (its membership only: a conn's contents belong to the control
 *         thread), stop flag.
 * fork: the prepare handler takes both locks, so a child sees consistent
 * lists; the child closes the inherited descriptors (never shutdown(): the
 * sockets stay the parent's), forgets everything and starts its own thread on
 * first use. It leaks the parent's per-connection buffers rather than walk
 * what the parent's control thread may have been changing.
 */
#include "ctl/ctl_thread.h"
#include "ctl/ctl_priv.h"
#include "shim/log.h"
#include "shim/params.h"

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

struct r2cc_ctl_state r2cc_ctl = {
    .start_lock = PTHREAD_MUTEX_INITIALIZER,
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .wake_fd = -1,
    .listen_fd = -1,
    .oob_fd = -1,
    .ep_fd = -1,
};

struct r2cc_ctl_stats r2cc_ctl_counts;

static const char *const drop_names[R2CC_CTL_DROP_COUNT] = {
    "none",   "bad_header",   "bad_length", "unknown_job", "bad_tag", "stale",
    "replay", "unknown_type", "malformed",  "truncated",   "timeout", "misaddressed",
};

const char *r2cc_ctl_drop_name(int reason)
{
	return reason >= 0 && reason < R2CC_CTL_DROP_COUNT ? drop_names[reason] : "?";
}

/*
 * A frame outside the clock window says that two hosts' clocks disagree, not
 * that someone attacks: the first one, and then one a minute, says so with
 * the difference measured (control thread only).
 */
void r2cc_ctl_count_stale(const struct conn *c, const struct r2cc_ctl_hdr *h, int64_t now_ns)
{
	uint64_t n =
	    __atomic_fetch_add(&r2cc_ctl_counts.drops[R2CC_CTL_DROP_STALE], 1, __ATOMIC_RELAXED);
	int64_t t = r2cc_ctl_now_ms();
	if (n > 0 && t - r2cc_ctl.stale_warned_ms < CTL_STALE_WARN_MS)
		return;
	r2cc_ctl.stale_warned_ms = t;
	char a[64];
	r2cc_ctl_addr_str(&c->peer, a, sizeof(a));
	R2CC_WARN("control plane: dropped a message of job %016llx from %s whose timestamp is "
		  "%.0f s %s this host's clock (accepted: +-%lld s); %llu so far. Synchronise "
		  "the clocks of the job's hosts (NTP, PTP)",
		  (unsigned long long)h->job_id, a,
		  (double)(now_ns > h->ts_ns ? now_ns - h->ts_ns : h->ts_ns - now_ns) / 1e9,
		  now_ns > h->ts_ns ? "behind" : "ahead of", R2CC_CTL_STALE_NS / 1000000000LL,
		  (unsigned long long)n + 1);
}

void r2cc_ctl_count_drop(int reason, const struct conn *c)
{
	if (reason <= R2CC_CTL_DROP_NONE || reason >= R2CC_CTL_DROP_COUNT)
		return;
	uint64_t n = __atomic_fetch_add(&r2cc_ctl_counts.drops[reason], 1, __ATOMIC_RELAXED);
	/* The first of each reason is worth a warning; a flood is not. */
	if (n == 0 || (n & (n - 1)) == 0) {
		char a[64] = "this process";
		if (c)
			r2cc_ctl_addr_str(&c->peer, a, sizeof(a));
		R2CC_WARN("control plane: dropped a message (%s) from %s; %llu so far",
			  drop_names[reason], a, (unsigned long long)n + 1);
	}
}

void r2cc_ctl_stats(struct r2cc_ctl_stats *out)
{
	uint64_t *dst = (uint64_t *)out;
	const uint64_t *src = (const uint64_t *)&r2cc_ctl_counts;
	for (size_t i = 0; i < sizeof(r2cc_ctl_counts) / sizeof(uint64_t); i++)
		dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}

int64_t r2cc_ctl_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Under r2cc_ctl.lock, which keeps wake_fd open (shutdown closes it under the
 * lock) and so never writes into a descriptor number reused meanwhile. */
void r2cc_ctl_wake_thread_locked(void)
{
	uint64_t one = 1;
	if (r2cc_ctl.wake_fd >= 0 && write(r2cc_ctl.wake_fd, &one, sizeof(one)) < 0 &&
	    errno != EAGAIN)
		R2CC_WARN_ONCE("control plane: cannot wake the control thread: %s",
			       strerror(errno));
}

/* Jobs (under r2cc_ctl.lock). Entries live until shutdown or fork. */

struct job_ent *r2cc_ctl_job_find_locked(uint64_t id)
{
	for (struct job_ent *j = r2cc_ctl.jobs; j; j = j->next)
		if (j->job.id == id)
			return j;
	return NULL;
}

/* Records that this process holds `rank` in j. */
static int job_add_rank_locked(struct job_ent *j, int rank)
{
	for (int i = 0; i < j->nlocal; i++)
		if (j->ranks[i] == rank)
			return 0;
	if (j->nlocal == j->cap_local) {
		int cap = j->cap_local ? 2 * j->cap_local : 4;
		int *r = realloc(j->ranks, (size_t)cap * sizeof(*r));
		if (!r)
			return -ENOMEM;
		j->ranks = r;
		j->cap_local = cap;
	}
	j->ranks[j->nlocal++] = rank;
	return 0;
}

/*
 * Adds a job this process takes part in, holding ranks[0..n) in it (frames
 * addressed to other ranks of the job are not for this process). The id must
 * be the one its secret derives: a job struct that mixes two jobs is refused,
 * not half-believed.
 */
int r2cc_ctl_job_ensure(const struct r2cc_ctl_job *job, bool serve, const int *ranks, int n)
{
	int rc = 0;
	pthread_mutex_lock(&r2cc_ctl.lock);
	struct job_ent *j = r2cc_ctl_job_find_locked(job->id);
	if (j) {
		if (CRYPTO_memcmp(j->job.secret, job->secret, R2CC_CTL_SECRET_SIZE) != 0)
			rc = -EINVAL;
		else if (serve)
			__atomic_store_n(&j->serve, true, __ATOMIC_RELEASE);
	} else if (!r2cc_ctl_job_check(job)) {
		rc = -EINVAL;
	} else if ((j = calloc(1, sizeof(*j)))) {
		j->job = *job;
		j->serve = serve;
		j->next = r2cc_ctl.jobs;
		r2cc_ctl.jobs = j;
		/* Frames for it may be parked already. */
		r2cc_ctl_wake_thread_locked();
	} else {
		rc = -ENOMEM;
	}
	for (int i = 0; rc == 0 && i < n; i++)
		rc = job_add_rank_locked(j, ranks[i]);
	pthread_mutex_unlock(&r2cc_ctl.lock);
	return rc;
}

static void job_free(struct job_ent *j)
{
	r2cc_ctl_round_free(j->round);
	while (j->done) {
		struct rdv_done *d = j->done;
		j->done = d->next;
		r2cc_ctl_rdir_free(d->rd);
		free(d);
	}
	free(j->ranks);
	free(j);
}

void r2cc_ctl_round_free(struct rdv_round *r)
{
	if (!r)
		return;
	for (int i = 0; i < r->nranks; i++)
		free(r->slots[i].member);
	free(r->slots);
	free(r);
}

/* Pendings (under r2cc_ctl.lock). */

struct pending *r2cc_ctl_pending_find_locked(uint32_t req_id, uint64_t job_id)
{
	struct pending *p = r2cc_hmap_get(&r2cc_ctl.pending_by_id, req_id);
	return p && p->job_id == job_id ? p : NULL;
}

/* Request ids are unique among the waiters of a process (32 bits wrap only
 * after four billion requests, long after any waiter gave up). */
int r2cc_ctl_pending_link_locked(struct pending *p)
{
	if (r2cc_hmap_put(&r2cc_ctl.pending_by_id, p->req_id, p))
		return -ENOMEM;
	p->prev = NULL;
	p->next = r2cc_ctl.pending;
	if (r2cc_ctl.pending)
		r2cc_ctl.pending->prev = p;
	r2cc_ctl.pending = p;
	return 0;
}

void r2cc_ctl_pending_unlink_locked(struct pending *p)
{
	if (r2cc_hmap_get(&r2cc_ctl.pending_by_id, p->req_id) != p)
		return;
	r2cc_hmap_del(&r2cc_ctl.pending_by_id, p->req_id);
	if (p->prev)
		p->prev->next = p->next;
	else
		r2cc_ctl.pending = p->next;
	if (p->next)
		p->next->prev = p->prev;
	p->next = p->prev = NULL;
}

void r2cc_ctl_pending_complete_locked(struct pending *p, int status)
{
	if (p->done)
		return;
	p->done = true;
	p->status = status;
	pthread_cond_broadcast(&r2cc_ctl.done_cv);
}

void r2cc_ctl_pending_fail_conn(uint64_t conn_uid, int status)
{
	pthread_mutex_lock(&r2cc_ctl.lock);
	for (struct pending *p = r2cc_ctl.pending; p; p = p->next)
		if (p->conn_uid == conn_uid)
			r2cc_ctl_pending_complete_locked(p, status);
	pthread_mutex_unlock(&r2cc_ctl.lock);
}

static void atfork_prepare(void)
{
	pthread_mutex_lock(&r2cc_ctl.start_lock);
	pthread_mutex_lock(&r2cc_ctl.lock);
}

static void atfork_parent(void)
{
	pthread_mutex_unlock(&r2cc_ctl.lock);
	pthread_mutex_unlock(&r2cc_ctl.start_lock);
}

static void atfork_child(void)
{
	if (r2cc_ctl.started) {
		for (int i = 0; i < r2cc_ctl.nconns; i++)
			close(r2cc_ctl.conns[i]->fd);
		close(r2cc_ctl.listen_fd);
		close(r2cc_ctl.wake_fd);
		close(r2cc_ctl.ep_fd);
		if (r2cc_ctl.oob_fd >= 0)
			close(r2cc_ctl.oob_fd);
		while (r2cc_ctl.jobs) {
			struct job_ent *j = r2cc_ctl.jobs;
			r2cc_ctl.jobs = j->next;
			free(j->ranks);
			free(j);
		}
		/* Waiters, queued frames, connections and their sources were the
		 * parent's threads' (their tables are left behind, as their
		 * buffers are). */
		memset(r2cc_ctl.src, 0, sizeof(r2cc_ctl.src));
		r2cc_ctl.preauth_conns = 0;
		r2cc_ctl.conns = NULL;
		r2cc_ctl.nconns = r2cc_ctl.conncap = 0;
		r2cc_ctl_ndead = 0;
		r2cc_ctl.conn_by_uid = (struct r2cc_hmap){0};
		r2cc_ctl.conn_by_dst = (struct r2cc_hmap){0};
		r2cc_ctl.pending_by_id = (struct r2cc_hmap){0};
		r2cc_ctl.pending = NULL;
		r2cc_ctl.outq = NULL;
		r2cc_ctl.outtail = &r2cc_ctl.outq;
		r2cc_ctl.out_items = r2cc_ctl.out_bytes = 0;
		r2cc_ctl.replay = NULL;
		r2cc_ctl.rx_charged = 0;
		r2cc_ctl.park = NULL;
		r2cc_ctl.nparked = 0;
		r2cc_ctl.parked_bytes = 0;
		r2cc_ctl.listen_fd = r2cc_ctl.wake_fd = r2cc_ctl.oob_fd = r2cc_ctl.ep_fd = -1;
		r2cc_ctl.started = false;
		r2cc_ctl.stop = false;
		memset(&r2cc_ctl_counts, 0, sizeof(r2cc_ctl_counts));
	}
	if (r2cc_ctl.cv_ready) {
		pthread_condattr_t ca;
		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&r2cc_ctl.done_cv, &ca);
		pthread_condattr_destroy(&ca);
	}
	pthread_mutex_unlock(&r2cc_ctl.lock);
	pthread_mutex_unlock(&r2cc_ctl.start_lock);
}

static void once_init(void)
{
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&r2cc_ctl.done_cv, &ca);
	pthread_condattr_destroy(&ca);
	r2cc_ctl.cv_ready = true;
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
	/*
	 * libcrypto frees its tables in an exit handler; the control thread
	 * must be stopped before that. Ask OpenSSL not to register its handler
	 * (works when it is not initialised yet) and register the shutdown
	 * after any handler it did register, so that ours runs first.
	 */
	OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL);
	atexit(r2cc_ctl_shutdown);
}

static int listen_on(const struct sockaddr_storage *addr, struct sockaddr_storage *bound)
{
	int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (const struct sockaddr *)addr, r2cc_ctl_addr_len(addr)) != 0 ||
	    listen(fd, SOMAXCONN) != 0)
		goto err_close;
	socklen_t len = sizeof(*bound);
	memset(bound, 0, sizeof(*bound));
	if (getsockname(fd, (struct sockaddr *)bound, &len) != 0)
		goto err_close;
	return fd;

err_close:;
	int err = -errno;
	close(fd);
	return err;
}

/* Under start_lock. */
static int start_locked(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	char ifname[IF_NAMESIZE] = "";
	struct sockaddr_storage addr;
	if (r2cc_ctl.shut)
		return -ESHUTDOWN;
	if (r2cc_ctl.started)
		return 0;
	pthread_once(&once, once_init);
	r2cc_params_load();
	int rc = r2cc_ctl_iface_find(&addr, ifname);
	if (rc) {
		R2CC_WARN("control plane: no usable interface (NCCL_SOCKET_IFNAME=%s); running "
			  "without repair",
			  getenv("NCCL_SOCKET_IFNAME") ? getenv("NCCL_SOCKET_IFNAME") : "");
		return rc;
	}
	if (addr.ss_family == AF_INET)
		((struct sockaddr_in *)&addr)->sin_port = 0;
	else
		((struct sockaddr_in6 *)&addr)->sin6_port = 0;
	int lfd = listen_on(&addr, &r2cc_ctl.local);
	if (lfd < 0) {
		rc = lfd;
		goto err_log;
	}
	int wfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	int efd = epoll_create1(EPOLL_CLOEXEC);
	struct r2cc_ctl_replay *replay = r2cc_ctl_replay_new(CTL_REPLAY_SENDERS);
	if (wfd < 0 || efd < 0 || !replay) {
		rc = wfd < 0 || efd < 0 ? -errno : -ENOMEM;
		goto err_free;
	}
	pthread_mutex_lock(&r2cc_ctl.lock);
	r2cc_ctl.listen_fd = lfd;
	r2cc_ctl.wake_fd = wfd;
	r2cc_ctl.ep_fd = efd;
	r2cc_ctl.conns = NULL;
	r2cc_ctl.nconns = r2cc_ctl.conncap = 0;
	r2cc_ctl.replay = replay;
	r2cc_ctl.outq = NULL;
	r2cc_ctl.outtail = &r2cc_ctl.outq;
	r2cc_ctl.park = NULL;
	r2cc_ctl.park_tail = &r2cc_ctl.park;
	r2cc_ctl.stop = false;
	pthread_mutex_unlock(&r2cc_ctl.lock);

	/* The thread inherits a mask with every signal blocked. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = -pthread_create(&r2cc_ctl.thread, NULL, r2cc_ctl_main, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc)
		goto err_free;
	pthread_setname_np(r2cc_ctl.thread, "r2cc-ctl");
	pthread_mutex_lock(&r2cc_ctl.lock);
	r2cc_ctl.started = true;
	pthread_mutex_unlock(&r2cc_ctl.lock);
	char a[64];
	R2CC_INFO("control plane: listening on %s (%s)",
		  r2cc_ctl_addr_str(&r2cc_ctl.local, a, sizeof(a)), ifname);
	return 0;

err_free:
	pthread_mutex_lock(&r2cc_ctl.lock);
	r2cc_ctl.listen_fd = r2cc_ctl.wake_fd = r2cc_ctl.ep_fd = -1;
	r2cc_ctl.replay = NULL;
	pthread_mutex_unlock(&r2cc_ctl.lock);
	r2cc_ctl_replay_free(replay);
	if (efd >= 0)
		close(efd);
	if (wfd >= 0)
		close(wfd);
	close(lfd);
err_log:
	R2CC_WARN("control plane: cannot listen on %s: %s; running without repair", ifname,
		  strerror(-rc));
	return rc;
}

bool r2cc_ctl_on_thread(void)
{
	pthread_mutex_lock(&r2cc_ctl.lock);
	bool on = r2cc_ctl.started && pthread_equal(pthread_self(), r2cc_ctl.thread);
	pthread_mutex_unlock(&r2cc_ctl.lock);
	return on;
}

int r2cc_ctl_start(void)
{
	pthread_mutex_lock(&r2cc_ctl.start_lock);
	int rc = start_locked();
	pthread_mutex_unlock(&r2cc_ctl.start_lock);
	return rc;
}

/* The R2CC_OOB_ROOT listener, under start_lock. */
static int oob_listen_locked(const struct sockaddr_storage *root)
{
	if (r2cc_ctl.oob_fd >= 0)
		return 0;
	struct sockaddr_storage bound;
	int fd = listen_on(root, &bound);
	if (fd == -EADDRNOTAVAIL) {
		struct sockaddr_storage any = {0};
		any.ss_family = root->ss_family;
		if (any.ss_family == AF_INET)
			((struct sockaddr_in *)&any)->sin_port =
			    ((const struct sockaddr_in *)root)->sin_port;
		else
			((struct sockaddr_in6 *)&any)->sin6_port =
			    ((const struct sockaddr_in6 *)root)->sin6_port;
		fd = listen_on(&any, &bound);
	}
	if (fd < 0) {
		char a[64];
		R2CC_WARN("control plane: cannot listen on R2CC_OOB_ROOT %s: %s; this job runs "
			  "without repair",
			  r2cc_ctl_addr_str(root, a, sizeof(a)), strerror(-fd));
		return fd;
	}
	pthread_mutex_lock(&r2cc_ctl.lock);
	r2cc_ctl.oob_fd = fd;
	r2cc_ctl_wake_thread_locked();
	pthread_mutex_unlock(&r2cc_ctl.lock);
	return 0;
}

int r2cc_ctl_uid_stamp(unsigned char id[R2CC_CTL_UID_SIZE])
{
	struct r2cc_ctl_job job = {0};
	pthread_mutex_lock(&r2cc_ctl.start_lock);
	int rc = start_locked();
	if (rc)
		goto out_unlock;
	job.rdv = r2cc_ctl.local;
	if (r2cc_param.oob_root[0]) {
		rc = r2cc_ctl_hostport_parse(r2cc_param.oob_root, &job.rdv);
		if (rc == 0)
			rc = oob_listen_locked(&job.rdv);
		else
			R2CC_WARN("control plane: R2CC_OOB_ROOT=%s cannot be resolved; this job "
				  "runs without repair",
				  r2cc_param.oob_root);
		if (rc)
			goto out_unlock;
	}
	rc = r2cc_ctl_random(job.secret, sizeof(job.secret));
	if (rc == 0)
		rc = r2cc_ctl_job_derive_id(&job);
	if (rc == 0)
		rc = r2cc_ctl_job_ensure(&job, true, NULL, 0);
	if (rc == 0)
		rc = r2cc_ctl_uid_encode(id, &job);
	if (rc == 0) {
		char a[64];
		R2CC_INFO("control plane: new job %016llx, rendezvous %s",
			  (unsigned long long)job.id, r2cc_ctl_addr_str(&job.rdv, a, sizeof(a)));
	}
out_unlock:
	pthread_mutex_unlock(&r2cc_ctl.start_lock);
	return rc;
}

int r2cc_ctl_local_addr(struct sockaddr_storage *addr)
{
	pthread_mutex_lock(&r2cc_ctl.lock);
	int rc = r2cc_ctl.started ? 0 : -ENOTCONN;
	if (rc == 0)
		*addr = r2cc_ctl.local;
	pthread_mutex_unlock(&r2cc_ctl.lock);
	return rc;
}

void r2cc_ctl_shutdown(void)
{
	pthread_mutex_lock(&r2cc_ctl.start_lock);
	if (r2cc_ctl.shut) {
		pthread_mutex_unlock(&r2cc_ctl.start_lock);
		return;
	}
	pthread_mutex_lock(&r2cc_ctl.lock);
	r2cc_ctl.shut = true;
	bool started = r2cc_ctl.started;
	r2cc_ctl.stop = true;
	if (started)
		r2cc_ctl_wake_thread_locked();
	pthread_mutex_unlock(&r2cc_ctl.lock);
	if (started) {
		if (pthread_equal(pthread_self(), r2cc_ctl.thread)) {
			/* exit() from a handler: the loop ends when this returns. */
			pthread_detach(r2cc_ctl.thread);
			pthread_mutex_unlock(&r2cc_ctl.start_lock);
			return;
		}
		pthread_join(r2cc_ctl.thread, NULL);
		pthread_mutex_lock(&r2cc_ctl.lock);
		close(r2cc_ctl.listen_fd);
		close(r2cc_ctl.wake_fd);
		close(r2cc_ctl.ep_fd);
		if (r2cc_ctl.oob_fd >= 0)
			close(r2cc_ctl.oob_fd);
		r2cc_ctl.listen_fd = r2cc_ctl.wake_fd = r2cc_ctl.oob_fd = r2cc_ctl.ep_fd = -1;
		while (r2cc_ctl.jobs) {
			struct job_ent *j = r2cc_ctl.jobs;
			r2cc_ctl.jobs = j->next;
			job_free(j);
		}
		free(r2cc_ctl.conns);
		r2cc_ctl.conns = NULL;
		r2cc_ctl.nconns = r2cc_ctl.conncap = 0;
		r2cc_hmap_free(&r2cc_ctl.conn_by_uid);
		r2cc_hmap_free(&r2cc_ctl.conn_by_dst);
		r2cc_hmap_free(&r2cc_ctl.pending_by_id);
		r2cc_ctl_replay_free(r2cc_ctl.replay);
		r2cc_ctl.replay = NULL;
		r2cc_ctl.started = false;
		pthread_mutex_unlock(&r2cc_ctl.lock);
	}
	pthread_mutex_unlock(&r2cc_ctl.start_lock);
}
