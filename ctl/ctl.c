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
 * briefly in a bounded park (see park()). The thread waits in epoll;
 * connections are found by id and by destination through hash maps and
 * waiters by request id, so nothing it does per frame grows with the number
 * of connections (the rendezvous of a large job holds one per rank).
 * Timeouts are swept every CTL_POLL_MS, not per event.
 *
 * The rendezvous: a round collects one registration per rank (slots), then
 * becomes a struct r2cc_ctl_rdir (ctl_dir.c) that answers every rank with its
 * head and, for as long as any rank of the round remains, the lookups and NIC
 * reports of its ranks. Each completed round of a job has its own number.
 *
 * Lock order: ctl.start_lock, then ctl.lock. Nothing else is taken under
 * ctl.lock, and the control thread holds neither while it does socket I/O or
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
#include "ctl/ctl.h"
#include "ctl/ctl_msg.h"
#include "ctl/ctl_priv.h"
#include "ctl/hmap.h"
#include "shim/fault.h"
#include "shim/log.h"
#include "shim/params.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

/* Internal message types. */
enum {
	CTL_T_REGISTER = 1, /* request: u32 rank, u32 nranks, member; reply: head (ctl_dir.c) */
	CTL_T_CANCEL = 2,   /* u32 rank, u32 request id of a REGISTER given up on */
	CTL_T_LOOKUP = 3,   /* request: members and NIC owners of a round (ctl_dir.c) */
	CTL_T_NICS = 4,	    /* request: the NICs a rank uses (ctl_dir.c) */
	CTL_T_LEAVE = 5,    /* u32 round, u32 rank: that rank's communicator is gone */
};

#define CTL_MAX_CONNS	    65536
#define CTL_EVENTS	    256
#define CTL_OUTQ_MAX_ITEMS  65536
#define CTL_OUTQ_MAX_BYTES  (64u << 20)
#define CTL_CONN_TX_MAX	    (16u << 20)
#define CTL_RX_BUDGET	    (256u << 20) /* all half-received frames together */
#define CTL_CONNECT_MS	    10000
#define CTL_TX_STALL_MS	    30000
#define CTL_POLL_MS	    100
#define CTL_IDLE_POLL_MS    1000
#define CTL_REPLAY_SENDERS  131072
#define CTL_READS_PER_PASS  64
#define CTL_PARK_MAX_FRAMES 256
#define CTL_PARK_MAX_BYTES  (8u << 20)
/* Incoming connections that have not authenticated yet ("strangers"). */
#define CTL_PREAUTH_CONNS	  4096
#define CTL_PREAUTH_CONNS_PER_SRC 64
#define CTL_PREAUTH_BYTES_PER_SRC (16u << 20) /* their half-received frames */
#define CTL_SRC_BUCKETS		  1024
#define CTL_STALE_WARN_MS	  60000

/* What the strangers from one source address hold (control thread only). */
struct src_ent {
	struct src_ent *next;
	struct sockaddr_storage addr; /* port zero */
	int conns;
	size_t bytes;
};

struct out_item {
	struct out_item *next;
	struct sockaddr_storage dst;
	int32_t lane; /* -1: the destination's shared connection */
	unsigned char key[R2CC_CTL_SECRET_SIZE];
	struct r2cc_ctl_hdr hdr; /* sender, seq, ts filled when sealed */
	unsigned char payload[];
};

struct txbuf {
	struct txbuf *next;
	size_t len;
	size_t off;
	unsigned char data[];
};

struct conn {
	int fd;
	int idx;       /* in ctl.conns */
	uint64_t uid;  /* never reused; names the conn in pendings and rounds */
	int32_t lane;  /* outgoing: see out_item */
	uint32_t ev;   /* epoll events asked for */
	int rdv_slots; /* slots of open rounds that wait for this connection */
	bool outgoing;
	bool connecting;
	bool dead;
	bool authed;	     /* a frame from this peer passed every check */
	struct src_ent *src; /* incoming and not authenticated yet: its source */
	size_t src_charged;  /* bytes of rx charged to src */
	int dead_status;
	int parked;		      /* frames of this connection waiting in the park */
	struct sockaddr_storage peer; /* outgoing: where it connects; incoming: who */
	struct r2cc_ctl_rx rx;
	size_t rx_charged;
	int64_t rx_progress_ms;
	struct txbuf *txq;
	struct txbuf **txtail;
	size_t tx_bytes;
	int64_t tx_progress_ms;
	int64_t opened_ms;
	uint64_t tx_sender;
	uint64_t tx_seq;
};

struct pending {
	struct pending *next, *prev;
	uint32_t req_id;
	uint64_t job_id;
	int32_t peer_rank; /* expected from_rank of the reply; -1 for the rendezvous */
	uint64_t conn_uid; /* 0 until sent */
	bool done;
	int status;
	unsigned char *buf; /* caller's buffer, or malloc'd here when grow is set */
	size_t cap;
	size_t len;
	bool grow;
};

struct rdv_slot {
	bool present;
	uint64_t conn_uid;
	uint32_t req_id;
	unsigned char *member;
	size_t mlen;
};

struct rdv_round {
	int nranks;
	int count;
	struct rdv_slot *slots;
};

/* A completed round, while any of its ranks remains. */
struct rdv_done {
	struct rdv_done *next;
	struct r2cc_ctl_rdir *rd;
};

struct job_ent {
	struct job_ent *next;
	struct r2cc_ctl_job job;
	bool serve; /* stamped here: this process runs its rendezvous (atomic: the
		     * control thread reads it without ctl.lock) */
	int *ranks; /* the ranks this process holds in the job */
	int nlocal;
	int cap_local;
	struct rdv_round *round; /* control thread only, as are done and next_gen */
	struct rdv_done *done;
	uint32_t next_gen;
};

/* A frame for a job this process does not know yet. */
struct parked {
	struct parked *next;
	struct r2cc_ctl_hdr hdr;
	unsigned char *frame;
	size_t size;
	uint64_t conn_uid;
	int64_t since_ms;
};

struct handler {
	r2cc_ctl_handler_fn fn;
	void *arg;
};

struct call_priv {
	struct r2cc_ctl_call pub;
	struct conn *conn;
	unsigned char key[R2CC_CTL_SECRET_SIZE];
	uint32_t req_id;
	bool replied;
};

static struct {
	pthread_mutex_t start_lock;
	pthread_mutex_t lock;
	pthread_cond_t done_cv;
	bool cv_ready;
	bool started;
	bool shut;
	bool stop;
	pthread_t thread;
	int wake_fd;
	int listen_fd;
	int oob_fd;
	int ep_fd;
	struct sockaddr_storage local;
	struct out_item *outq;
	struct out_item **outtail;
	size_t out_items;
	size_t out_bytes;
	struct pending *pending;
	struct r2cc_hmap pending_by_id; /* req_id -> struct pending */
	struct job_ent *jobs;
	struct handler handlers[R2CC_CTL_TYPE_MAX];
	uint32_t next_req;
	struct conn **conns;
	int nconns, conncap;
	bool conn_per_rank;
	/* control thread only */
	struct r2cc_hmap conn_by_uid;
	struct r2cc_hmap conn_by_dst; /* hash of (destination, lane) -> outgoing conn */
	bool timers;		      /* something may time out: sweep every CTL_POLL_MS */
	int64_t last_sweep_ms;
	struct r2cc_ctl_replay *replay;
	uint64_t next_conn_uid;
	size_t rx_charged;
	struct parked *park;
	struct parked **park_tail;
	int nparked;
	size_t parked_bytes;
	struct src_ent *src[CTL_SRC_BUCKETS];
	int preauth_conns;
	int64_t stale_warned_ms;
} ctl = {
    .start_lock = PTHREAD_MUTEX_INITIALIZER,
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .wake_fd = -1,
    .listen_fd = -1,
    .oob_fd = -1,
    .ep_fd = -1,
};

static struct r2cc_ctl_stats stats;

/* How long a half-received frame, or an incoming connection that has not
 * authenticated yet, may sit idle; and how long a frame for a job not known
 * here (yet) is kept (see park()). */
static int rx_stall_ms = 10000;
static int park_ms = 2000;
/* How long an incoming connection has to authenticate. */
static int auth_ms = 5000;

void r2cc_ctl_set_timeouts(int stall_ms, int parked_ms)
{
	__atomic_store_n(&rx_stall_ms, stall_ms, __ATOMIC_RELAXED);
	__atomic_store_n(&park_ms, parked_ms, __ATOMIC_RELAXED);
}

void r2cc_ctl_set_auth_ms(int ms)
{
	__atomic_store_n(&auth_ms, ms, __ATOMIC_RELAXED);
}

/* How many not yet authenticated connections one source address may hold. */
static int preauth_per_src = CTL_PREAUTH_CONNS_PER_SRC;

void r2cc_ctl_set_preauth_per_src(int n)
{
	__atomic_store_n(&preauth_per_src, n, __ATOMIC_RELAXED);
}

#define STAT_INC(field) __atomic_fetch_add(&stats.field, 1, __ATOMIC_RELAXED)

static const char *const drop_names[R2CC_CTL_DROP_COUNT] = {
    "none",   "bad_header",   "bad_length", "unknown_job", "bad_tag", "stale",
    "replay", "unknown_type", "malformed",  "truncated",   "timeout", "misaddressed",
};

const char *r2cc_ctl_drop_name(int reason)
{
	return reason >= 0 && reason < R2CC_CTL_DROP_COUNT ? drop_names[reason] : "?";
}

static int64_t now_ms(void);

/*
 * A frame outside the clock window says that two hosts' clocks disagree, not
 * that someone attacks: the first one, and then one a minute, says so with
 * the difference measured (control thread only).
 */
static void count_stale(const struct conn *c, const struct r2cc_ctl_hdr *h, int64_t now_ns)
{
	uint64_t n = __atomic_fetch_add(&stats.drops[R2CC_CTL_DROP_STALE], 1, __ATOMIC_RELAXED);
	int64_t t = now_ms();
	if (n > 0 && t - ctl.stale_warned_ms < CTL_STALE_WARN_MS)
		return;
	ctl.stale_warned_ms = t;
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

static void count_drop(int reason, const struct conn *c)
{
	if (reason <= R2CC_CTL_DROP_NONE || reason >= R2CC_CTL_DROP_COUNT)
		return;
	uint64_t n = __atomic_fetch_add(&stats.drops[reason], 1, __ATOMIC_RELAXED);
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
	const uint64_t *src = (const uint64_t *)&stats;
	for (size_t i = 0; i < sizeof(stats) / sizeof(uint64_t); i++)
		dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Under ctl.lock, which keeps wake_fd open (shutdown closes it under the
 * lock) and so never writes into a descriptor number reused meanwhile. */
static void wake_thread_locked(void)
{
	uint64_t one = 1;
	if (ctl.wake_fd >= 0 && write(ctl.wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		R2CC_WARN_ONCE("control plane: cannot wake the control thread: %s",
			       strerror(errno));
}

/* Jobs (under ctl.lock). Entries live until shutdown or fork. */

static struct job_ent *job_find_locked(uint64_t id)
{
	for (struct job_ent *j = ctl.jobs; j; j = j->next)
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
static int job_ensure(const struct r2cc_ctl_job *job, bool serve, const int *ranks, int n)
{
	int rc = 0;
	pthread_mutex_lock(&ctl.lock);
	struct job_ent *j = job_find_locked(job->id);
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
		j->next = ctl.jobs;
		ctl.jobs = j;
		/* Frames for it may be parked already. */
		wake_thread_locked();
	} else {
		rc = -ENOMEM;
	}
	for (int i = 0; rc == 0 && i < n; i++)
		rc = job_add_rank_locked(j, ranks[i]);
	pthread_mutex_unlock(&ctl.lock);
	return rc;
}

static void round_free(struct rdv_round *r);

static void job_free(struct job_ent *j)
{
	round_free(j->round);
	while (j->done) {
		struct rdv_done *d = j->done;
		j->done = d->next;
		r2cc_ctl_rdir_free(d->rd);
		free(d);
	}
	free(j->ranks);
	free(j);
}

static void round_free(struct rdv_round *r)
{
	if (!r)
		return;
	for (int i = 0; i < r->nranks; i++)
		free(r->slots[i].member);
	free(r->slots);
	free(r);
}

/* Pendings (under ctl.lock). */

static struct pending *pending_find_locked(uint32_t req_id, uint64_t job_id)
{
	struct pending *p = r2cc_hmap_get(&ctl.pending_by_id, req_id);
	return p && p->job_id == job_id ? p : NULL;
}

/* Request ids are unique among the waiters of a process (32 bits wrap only
 * after four billion requests, long after any waiter gave up). */
static int pending_link_locked(struct pending *p)
{
	if (r2cc_hmap_put(&ctl.pending_by_id, p->req_id, p))
		return -ENOMEM;
	p->prev = NULL;
	p->next = ctl.pending;
	if (ctl.pending)
		ctl.pending->prev = p;
	ctl.pending = p;
	return 0;
}

static void pending_unlink_locked(struct pending *p)
{
	if (r2cc_hmap_get(&ctl.pending_by_id, p->req_id) != p)
		return;
	r2cc_hmap_del(&ctl.pending_by_id, p->req_id);
	if (p->prev)
		p->prev->next = p->next;
	else
		ctl.pending = p->next;
	if (p->next)
		p->next->prev = p->prev;
	p->next = p->prev = NULL;
}

static void pending_complete_locked(struct pending *p, int status)
{
	if (p->done)
		return;
	p->done = true;
	p->status = status;
	pthread_cond_broadcast(&ctl.done_cv);
}

static void pending_fail_conn(uint64_t conn_uid, int status)
{
	pthread_mutex_lock(&ctl.lock);
	for (struct pending *p = ctl.pending; p; p = p->next)
		if (p->conn_uid == conn_uid)
			pending_complete_locked(p, status);
	pthread_mutex_unlock(&ctl.lock);
}

/* Strangers per source address (control thread). */

static void src_key(const struct sockaddr_storage *peer, struct sockaddr_storage *key)
{
	memset(key, 0, sizeof(*key));
	key->ss_family = peer->ss_family;
	if (peer->ss_family == AF_INET)
		((struct sockaddr_in *)key)->sin_addr =
		    ((const struct sockaddr_in *)peer)->sin_addr;
	else if (peer->ss_family == AF_INET6)
		((struct sockaddr_in6 *)key)->sin6_addr =
		    ((const struct sockaddr_in6 *)peer)->sin6_addr;
}

static struct src_ent **src_bucket(const struct sockaddr_storage *key)
{
	const unsigned char *b = (const unsigned char *)key;
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < sizeof(struct sockaddr_in6); i++)
		h = (h ^ b[i]) * 1099511628211ull;
	return &ctl.src[h % CTL_SRC_BUCKETS];
}

/* The entry of peer's address, made when missing; NULL when out of memory. */
static struct src_ent *src_get(const struct sockaddr_storage *peer)
{
	struct sockaddr_storage key;
	src_key(peer, &key);
	struct src_ent **b = src_bucket(&key);
	for (struct src_ent *e = *b; e; e = e->next)
		if (r2cc_ctl_addr_equal(&e->addr, &key))
			return e;
	struct src_ent *e = calloc(1, sizeof(*e));
	if (e) {
		e->addr = key;
		e->next = *b;
		*b = e;
	}
	return e;
}

/* Frees e once it holds nothing. */
static void src_put(struct src_ent *e)
{
	if (e->conns || e->bytes)
		return;
	for (struct src_ent **pp = src_bucket(&e->addr); *pp; pp = &(*pp)->next) {
		if (*pp == e) {
			*pp = e->next;
			free(e);
			return;
		}
	}
}

/* c authenticated or goes away: it no longer counts against its source. */
static void conn_src_release(struct conn *c)
{
	struct src_ent *e = c->src;
	if (!e)
		return;
	e->bytes -= c->src_charged;
	e->conns--;
	ctl.preauth_conns--;
	c->src = NULL;
	c->src_charged = 0;
	src_put(e);
}

/* Connections (control thread). */

/* What an outgoing connection is found by: its destination and lane. */
static uint64_t dst_key(const struct sockaddr_storage *dst, int32_t lane)
{
	unsigned char b[2 + 2 + 16 + 4];
	memset(b, 0, sizeof(b));
	b[0] = (unsigned char)dst->ss_family;
	uint16_t port = r2cc_ctl_addr_port(dst);
	b[2] = (unsigned char)(port >> 8);
	b[3] = (unsigned char)port;
	if (dst->ss_family == AF_INET)
		memcpy(b + 4, &((const struct sockaddr_in *)dst)->sin_addr, 4);
	else if (dst->ss_family == AF_INET6)
		memcpy(b + 4, &((const struct sockaddr_in6 *)dst)->sin6_addr, 16);
	memcpy(b + 20, &lane, 4);
	return r2cc_hmap_hash_bytes(b, sizeof(b));
}

static void conn_watch(struct conn *c)
{
	uint32_t want = c->connecting ? EPOLLOUT : EPOLLIN | (c->txq ? EPOLLOUT : 0);
	if (want == c->ev || c->dead)
		return;
	struct epoll_event e = {.events = want, .data.ptr = c};
	if (epoll_ctl(ctl.ep_fd, EPOLL_CTL_MOD, c->fd, &e) == 0)
		c->ev = want;
}

/* 0, or -ENOMEM / -EMFILE: then the caller frees c. */
static int conn_add(struct conn *c)
{
	int rc = 0;
	struct epoll_event e = {.events = c->connecting ? EPOLLOUT : EPOLLIN, .data.ptr = c};
	if (r2cc_hmap_put(&ctl.conn_by_uid, c->uid, c))
		return -ENOMEM;
	if (c->outgoing && r2cc_hmap_put(&ctl.conn_by_dst, dst_key(&c->peer, c->lane), c)) {
		r2cc_hmap_del(&ctl.conn_by_uid, c->uid);
		return -ENOMEM;
	}
	pthread_mutex_lock(&ctl.lock);
	if (ctl.nconns == ctl.conncap) {
		int cap = ctl.conncap ? 2 * ctl.conncap : 64;
		struct conn **g =
		    cap <= CTL_MAX_CONNS ? realloc(ctl.conns, sizeof(*g) * (size_t)cap) : NULL;
		if (g) {
			ctl.conns = g;
			ctl.conncap = cap;
		} else {
			rc = -EMFILE;
		}
	}
	if (rc == 0 && epoll_ctl(ctl.ep_fd, EPOLL_CTL_ADD, c->fd, &e) != 0)
		rc = -errno;
	if (rc == 0) {
		c->ev = e.events;
		c->idx = ctl.nconns;
		ctl.conns[ctl.nconns++] = c;
	}
	pthread_mutex_unlock(&ctl.lock);
	if (rc) {
		r2cc_hmap_del(&ctl.conn_by_uid, c->uid);
		if (c->outgoing && r2cc_hmap_get(&ctl.conn_by_dst, dst_key(&c->peer, c->lane)) == c)
			r2cc_hmap_del(&ctl.conn_by_dst, dst_key(&c->peer, c->lane));
	}
	ctl.timers = true;
	return rc;
}

static struct conn *conn_new(int fd, bool outgoing)
{
	struct conn *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	if (r2cc_ctl_random(&c->tx_sender, sizeof(c->tx_sender))) {
		free(c);
		return NULL;
	}
	c->fd = fd;
	c->uid = ++ctl.next_conn_uid;
	c->lane = -1;
	c->outgoing = outgoing;
	c->txtail = &c->txq;
	c->opened_ms = c->rx_progress_ms = c->tx_progress_ms = now_ms();
	r2cc_ctl_rx_init(&c->rx, R2CC_CTL_MAX_PAYLOAD);
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return c;
}

static int ndead; /* connections killed, not reaped yet */

static void conn_kill(struct conn *c, int status)
{
	if (!c->dead) {
		c->dead = true;
		c->dead_status = status;
		ndead++;
		/* Found by nobody from now on; reaped at the top of the loop. */
		r2cc_hmap_del(&ctl.conn_by_uid, c->uid);
		if (c->outgoing && r2cc_hmap_get(&ctl.conn_by_dst, dst_key(&c->peer, c->lane)) == c)
			r2cc_hmap_del(&ctl.conn_by_dst, dst_key(&c->peer, c->lane));
	}
}

static void rx_uncharge(struct conn *c)
{
	ctl.rx_charged -= c->rx_charged;
	c->rx_charged = 0;
	if (c->src)
		c->src->bytes -= c->src_charged;
	c->src_charged = 0;
}

static void conn_free(struct conn *c)
{
	rx_uncharge(c);
	conn_src_release(c);
	r2cc_ctl_rx_reset(&c->rx);
	while (c->txq) {
		struct txbuf *t = c->txq;
		c->txq = t->next;
		STAT_INC(send_failed);
		free(t);
	}
	close(c->fd);
	free(c);
}

static void rdv_forget_conn(const struct conn *c);

/* Remove dead connections, failing what waited on them. Connections die only
 * by conn_kill(), which the reaper follows within one pass. */
static void conns_reap(void)
{
	for (int i = 0; i < ctl.nconns && ndead > 0;) {
		struct conn *c = ctl.conns[i];
		if (!c->dead) {
			i++;
			continue;
		}
		ndead--;
		pthread_mutex_lock(&ctl.lock);
		ctl.conns[i] = ctl.conns[--ctl.nconns];
		ctl.conns[i]->idx = i;
		pthread_mutex_unlock(&ctl.lock);
		pending_fail_conn(c->uid, c->dead_status);
		rdv_forget_conn(c);
		conn_free(c);
	}
}

static struct conn *conn_by_uid(uint64_t uid)
{
	struct conn *c = r2cc_hmap_get(&ctl.conn_by_uid, uid);
	return c && !c->dead ? c : NULL;
}

static struct conn *conn_outgoing(const struct sockaddr_storage *dst, int32_t lane, int *err)
{
	struct conn *hit = r2cc_hmap_get(&ctl.conn_by_dst, dst_key(dst, lane));
	if (hit && !hit->dead && hit->lane == lane && r2cc_ctl_addr_equal(&hit->peer, dst))
		return hit;
	/* Another destination behind the same hash (never seen in practice): the
	 * connection list is the truth. */
	for (int i = 0; hit && i < ctl.nconns; i++) {
		struct conn *o = ctl.conns[i];
		if (o->outgoing && !o->dead && o->lane == lane &&
		    r2cc_ctl_addr_equal(&o->peer, dst))
			return o;
	}
	if (ctl.nconns >= CTL_MAX_CONNS) {
		*err = -EMFILE;
		return NULL;
	}
	int fd = socket(dst->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		*err = -errno;
		return NULL;
	}
	bool connecting = false;
	if (connect(fd, (const struct sockaddr *)dst, r2cc_ctl_addr_len(dst)) != 0) {
		if (errno != EINPROGRESS) {
			*err = -errno;
			close(fd);
			return NULL;
		}
		connecting = true;
	}
	struct conn *c = conn_new(fd, true);
	if (!c) {
		close(fd);
		*err = -ENOMEM;
		return NULL;
	}
	c->connecting = connecting;
	c->peer = *dst;
	c->lane = lane;
	int rc = conn_add(c);
	if (rc) {
		*err = rc;
		conn_free(c);
		return NULL;
	}
	STAT_INC(conns_opened);
	return c;
}

/* Writes what the socket takes; epoll then watches for room only while
 * something is left. */
static void conn_flush(struct conn *c)
{
	while (c->txq && !c->connecting && !c->dead) {
		struct txbuf *t = c->txq;
		ssize_t n = send(c->fd, t->data + t->off, t->len - t->off, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
				conn_kill(c, -ECONNRESET);
			break;
		}
		c->tx_progress_ms = now_ms();
		t->off += (size_t)n;
		if (t->off < t->len)
			break;
		c->txq = t->next;
		if (!c->txq)
			c->txtail = &c->txq;
		c->tx_bytes -= t->len;
		free(t);
		STAT_INC(sent);
	}
	if (c->txq)
		ctl.timers = true;
	conn_watch(c);
}

/* Seal a frame with this connection's sender id and next sequence number and
 * queue it for writing. */
static int conn_send(struct conn *c, const unsigned char key[R2CC_CTL_SECRET_SIZE],
		     struct r2cc_ctl_hdr *h, const void *payload, size_t len)
{
	size_t size = r2cc_ctl_frame_size(len);
	if (c->dead)
		return -ECONNRESET;
	if (c->tx_bytes + size > CTL_CONN_TX_MAX)
		return -ENOBUFS;
	struct txbuf *t = malloc(sizeof(*t) + size);
	if (!t)
		return -ENOMEM;
	h->magic = R2CC_CTL_MAGIC;
	h->version = R2CC_CTL_VERSION;
	h->len = (uint32_t)len;
	h->sender = c->tx_sender;
	h->seq = ++c->tx_seq;
	h->ts_ns = r2cc_ctl_now_ns();
	if (r2cc_ctl_frame_seal(key, h, payload, len, t->data)) {
		free(t);
		return -EIO;
	}
	t->len = size;
	t->off = 0;
	t->next = NULL;
	if (!c->txq)
		c->tx_progress_ms = now_ms();
	*c->txtail = t;
	c->txtail = &t->next;
	c->tx_bytes += size;
	conn_flush(c);
	return 0;
}

static int send_reply(struct conn *c, const unsigned char *key, uint64_t job_id, uint32_t req_id,
		      int32_t from_rank, int32_t to_rank, int status, const void *payload,
		      size_t len)
{
	struct r2cc_ctl_hdr h = {
	    .flags = R2CC_CTL_F_REPLY,
	    .job_id = job_id,
	    .req_id = req_id,
	    .from_rank = from_rank,
	    .to_rank = to_rank,
	};
	unsigned char err[4];
	if (status < 0) {
		uint32_t e = (uint32_t)-status;
		err[0] = (unsigned char)(e >> 24);
		err[1] = (unsigned char)(e >> 16);
		err[2] = (unsigned char)(e >> 8);
		err[3] = (unsigned char)e;
		h.flags |= R2CC_CTL_F_ERROR;
		payload = err;
		len = sizeof(err);
	}
	return conn_send(c, key, &h, payload, len);
}

/* Move what other threads queued onto connections. */
static void route_out(void)
{
	pthread_mutex_lock(&ctl.lock);
	struct out_item *list = ctl.outq;
	ctl.outq = NULL;
	ctl.outtail = &ctl.outq;
	ctl.out_items = 0;
	ctl.out_bytes = 0;
	pthread_mutex_unlock(&ctl.lock);
	while (list) {
		struct out_item *it = list;
		list = it->next;
		int rc = 0;
		struct conn *c = conn_outgoing(&it->dst, it->lane, &rc);
		if (c)
			rc = conn_send(c, it->key, &it->hdr, it->payload, it->hdr.len);
		if (it->hdr.flags & R2CC_CTL_F_REQUEST) {
			pthread_mutex_lock(&ctl.lock);
			struct pending *p = pending_find_locked(it->hdr.req_id, it->hdr.job_id);
			if (p && rc)
				pending_complete_locked(p, rc);
			else if (p)
				p->conn_uid = c->uid;
			pthread_mutex_unlock(&ctl.lock);
		}
		if (rc) {
			STAT_INC(send_failed);
			char a[64];
			R2CC_INFO("control plane: cannot send to %s: %s",
				  r2cc_ctl_addr_str(&it->dst, a, sizeof(a)), strerror(-rc));
		}
		free(it);
	}
}

static void outq_append_locked(struct out_item *it)
{
	*ctl.outtail = it;
	ctl.outtail = &it->next;
	ctl.out_items++;
	ctl.out_bytes += it->hdr.len;
}

/* Queue a frame for dst (any thread). */
static int queue_out(const struct sockaddr_storage *dst, const unsigned char *key,
		     const struct r2cc_ctl_hdr *h, const void *payload, size_t len)
{
	if (len > R2CC_CTL_MAX_PAYLOAD)
		return -EMSGSIZE;
	struct out_item *it = malloc(sizeof(*it) + len);
	if (!it)
		return -ENOMEM;
	it->next = NULL;
	it->dst = *dst;
	it->lane = __atomic_load_n(&ctl.conn_per_rank, __ATOMIC_RELAXED) ? h->from_rank : -1;
	memcpy(it->key, key, R2CC_CTL_SECRET_SIZE);
	it->hdr = *h;
	it->hdr.len = (uint32_t)len;
	if (len)
		memcpy(it->payload, payload, len);
	int rc = 0;
	pthread_mutex_lock(&ctl.lock);
	if (ctl.stop || !ctl.started)
		rc = -ESHUTDOWN;
	else if (ctl.out_items >= CTL_OUTQ_MAX_ITEMS || ctl.out_bytes + len > CTL_OUTQ_MAX_BYTES ||
		 r2cc_fault_fire(R2CC_FAULT_SEND))
		rc = -ENOBUFS;
	if (rc == 0) {
		outq_append_locked(it);
		wake_thread_locked();
	}
	pthread_mutex_unlock(&ctl.lock);
	if (rc) {
		free(it);
		if (rc == -ENOBUFS)
			STAT_INC(send_failed);
	}
	return rc;
}

/* Rendezvous (control thread). */

/* Only connections that wait in an open round cost a look at its slots. */
static void rdv_forget_conn(const struct conn *c)
{
	if (c->rdv_slots == 0)
		return;
	pthread_mutex_lock(&ctl.lock);
	for (struct job_ent *j = ctl.jobs; j; j = j->next) {
		struct rdv_round *r = j->round;
		for (int i = 0; r && i < r->nranks; i++) {
			if (r->slots[i].present && r->slots[i].conn_uid == c->uid) {
				free(r->slots[i].member);
				r->slots[i] = (struct rdv_slot){0};
				r->count--;
			}
		}
		/* An empty round can start over with another size. */
		if (r && r->count == 0) {
			round_free(r);
			j->round = NULL;
		}
	}
	pthread_mutex_unlock(&ctl.lock);
}

static uint32_t get_u32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void put_u32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)(v >> 24);
	p[1] = (unsigned char)(v >> 16);
	p[2] = (unsigned char)(v >> 8);
	p[3] = (unsigned char)v;
}

/* The slot's connection no longer waits in the round. */
static void slot_release(struct rdv_slot *s)
{
	struct conn *c = conn_by_uid(s->conn_uid);
	if (c && c->rdv_slots > 0)
		c->rdv_slots--;
}

/* Every rank is in: the round becomes a directory of the rendezvous, and each
 * rank gets its head (O(runs + its node's ranks) bytes). */
static void rdv_complete(struct job_ent *j)
{
	struct rdv_round *r = j->round;
	unsigned char **member = malloc(sizeof(*member) * (size_t)r->nranks);
	size_t *mlen = malloc(sizeof(*mlen) * (size_t)r->nranks);
	struct rdv_done *d = malloc(sizeof(*d));
	int status = member && mlen && d ? 0 : -ENOMEM;
	struct r2cc_ctl_rdir *rd = NULL;
	if (status == 0) {
		for (int i = 0; i < r->nranks; i++) {
			member[i] = r->slots[i].member;
			mlen[i] = r->slots[i].mlen;
			r->slots[i].member = NULL;
		}
		rd = r2cc_ctl_rdir_new(r->nranks, ++j->next_gen, member, mlen, &status);
	} else {
		free(member);
		free(mlen);
	}
	if (status)
		R2CC_WARN("control plane: cannot build the directory of job %016llx (%d ranks): "
			  "%s",
			  (unsigned long long)j->job.id, r->nranks, strerror(-status));
	for (int i = 0; i < r->nranks; i++) {
		struct rdv_slot *s = &r->slots[i];
		struct conn *c = conn_by_uid(s->conn_uid);
		slot_release(s);
		if (!c)
			continue;
		unsigned char *head = NULL;
		size_t len = 0;
		int st = rd ? r2cc_ctl_rdir_head(rd, i, &head, &len) : status;
		send_reply(c, j->job.secret, j->job.id, s->req_id, -1, i, st, head, len);
		free(head);
	}
	if (rd) {
		R2CC_INFO("control plane: job %016llx: all %d ranks registered (round %u, %zu "
			  "bytes here)",
			  (unsigned long long)j->job.id, r->nranks, r2cc_ctl_rdir_gen(rd),
			  r2cc_ctl_rdir_bytes(rd));
		d->rd = rd;
		d->next = j->done;
		j->done = d;
	} else {
		free(d);
	}
	pthread_mutex_lock(&ctl.lock);
	round_free(r);
	j->round = NULL;
	pthread_mutex_unlock(&ctl.lock);
}

static void rdv_register(struct conn *c, struct job_ent *j, const struct r2cc_ctl_hdr *h,
			 const unsigned char *p)
{
	struct r2cc_ctl_member m;
	uint32_t rank = h->len >= 8 ? get_u32(p) : 0;
	uint32_t nranks = h->len >= 8 ? get_u32(p + 4) : 0;
	if (h->len < 8 || nranks == 0 || nranks > R2CC_CTL_MAX_RANKS || rank >= nranks ||
	    !(h->flags & R2CC_CTL_F_REQUEST) ||
	    r2cc_ctl_member_decode(p + 8, h->len - 8, &m) != 0) {
		count_drop(R2CC_CTL_DROP_MALFORMED, c);
		send_reply(c, j->job.secret, j->job.id, h->req_id, -1, h->from_rank, -EPROTO, NULL,
			   0);
		return;
	}
	if (!__atomic_load_n(&j->serve, __ATOMIC_ACQUIRE)) {
		send_reply(c, j->job.secret, j->job.id, h->req_id, -1, h->from_rank, -ENOENT, NULL,
			   0);
		return;
	}
	struct rdv_round *r = j->round;
	if (r && r->nranks != (int)nranks) {
		R2CC_WARN("control plane: job %016llx: rank %u registers with %u ranks, others "
			  "with %d",
			  (unsigned long long)j->job.id, rank, nranks, r->nranks);
		send_reply(c, j->job.secret, j->job.id, h->req_id, -1, h->from_rank, -EINVAL, NULL,
			   0);
		return;
	}
	unsigned char *copy = malloc(h->len - 8);
	if (!r) {
		r = calloc(1, sizeof(*r));
		if (r)
			r->slots = calloc(nranks, sizeof(*r->slots));
		if (!r || !r->slots || !copy) {
			free(r);
			free(copy);
			send_reply(c, j->job.secret, j->job.id, h->req_id, -1, h->from_rank,
				   -ENOMEM, NULL, 0);
			return;
		}
		r->nranks = (int)nranks;
		j->round = r;
	} else if (!copy) {
		send_reply(c, j->job.secret, j->job.id, h->req_id, -1, h->from_rank, -ENOMEM, NULL,
			   0);
		return;
	}
	memcpy(copy, p + 8, h->len - 8);
	struct rdv_slot *s = &r->slots[rank];
	if (s->present) {
		/* The same rank again before the round completed: the newest wins. */
		struct conn *old = conn_by_uid(s->conn_uid);
		if (old)
			send_reply(old, j->job.secret, j->job.id, s->req_id, -1, (int32_t)rank,
				   -ECANCELED, NULL, 0);
		slot_release(s);
		free(s->member);
		r->count--;
	}
	pthread_mutex_lock(&ctl.lock);
	*s = (struct rdv_slot){true, c->uid, h->req_id, copy, h->len - 8};
	r->count++;
	pthread_mutex_unlock(&ctl.lock);
	c->rdv_slots++;
	if (r->count == r->nranks)
		rdv_complete(j);
}

static void rdv_cancel(struct conn *c, struct job_ent *j, const struct r2cc_ctl_hdr *h,
		       const unsigned char *p)
{
	if (h->len != 8) {
		count_drop(R2CC_CTL_DROP_MALFORMED, c);
		return;
	}
	uint32_t rank = get_u32(p), req_id = get_u32(p + 4);
	struct rdv_round *r = j->round;
	if (!r || rank >= (uint32_t)r->nranks)
		return;
	struct rdv_slot *s = &r->slots[rank];
	if (s->present && s->conn_uid == c->uid && s->req_id == req_id) {
		slot_release(s);
		pthread_mutex_lock(&ctl.lock);
		free(s->member);
		*s = (struct rdv_slot){0};
		if (--r->count == 0) {
			round_free(r);
			j->round = NULL;
		}
		pthread_mutex_unlock(&ctl.lock);
	}
}

/* The completed round a request names in its first word; NULL when it is
 * gone (every rank left) or never was. */
static struct rdv_done *rdv_find(struct job_ent *j, const struct r2cc_ctl_hdr *h,
				 const unsigned char *p)
{
	if (h->len < 4)
		return NULL;
	uint32_t gen = get_u32(p);
	for (struct rdv_done *d = j->done; d; d = d->next)
		if (r2cc_ctl_rdir_gen(d->rd) == gen)
			return d;
	return NULL;
}

/* LOOKUP and NICS: requests of a round's ranks, answered from its directory. */
static void rdv_serve(struct conn *c, struct job_ent *j, const struct r2cc_ctl_hdr *h,
		      const unsigned char *p)
{
	if (!(h->flags & R2CC_CTL_F_REQUEST)) {
		count_drop(R2CC_CTL_DROP_MALFORMED, c);
		return;
	}
	struct rdv_done *d =
	    __atomic_load_n(&j->serve, __ATOMIC_ACQUIRE) ? rdv_find(j, h, p) : NULL;
	unsigned char *out = NULL;
	size_t olen = 0;
	int rc = -ENOENT;
	if (d && h->type == CTL_T_LOOKUP)
		rc = r2cc_ctl_rdir_lookup(d->rd, p, h->len, &out, &olen);
	else if (d)
		rc = r2cc_ctl_rdir_nics(d->rd, h->from_rank, p, h->len);
	if (rc == -EPROTO)
		count_drop(R2CC_CTL_DROP_MALFORMED, c);
	send_reply(c, j->job.secret, j->job.id, h->req_id, -1, h->from_rank, rc, out, olen);
	free(out);
}

static void rdv_leave(struct conn *c, struct job_ent *j, const struct r2cc_ctl_hdr *h,
		      const unsigned char *p)
{
	if (h->len != 8) {
		count_drop(R2CC_CTL_DROP_MALFORMED, c);
		return;
	}
	struct rdv_done **dp = &j->done;
	while (*dp && r2cc_ctl_rdir_gen((*dp)->rd) != get_u32(p))
		dp = &(*dp)->next;
	struct rdv_done *d = *dp;
	if (!d || (int32_t)get_u32(p + 4) != h->from_rank)
		return;
	if (r2cc_ctl_rdir_leave(d->rd, h->from_rank)) {
		R2CC_INFO("control plane: job %016llx: every rank of round %u left",
			  (unsigned long long)j->job.id, r2cc_ctl_rdir_gen(d->rd));
		*dp = d->next;
		r2cc_ctl_rdir_free(d->rd);
		free(d);
	}
}

/* Dispatch of one authenticated frame. */

static void take_reply(struct conn *c, const struct r2cc_ctl_hdr *h, const unsigned char *p)
{
	pthread_mutex_lock(&ctl.lock);
	struct pending *pd = pending_find_locked(h->req_id, h->job_id);
	if (!pd || pd->done) {
		/* Its waiter gave up already. */
		pthread_mutex_unlock(&ctl.lock);
		return;
	}
	if (pd->peer_rank != h->from_rank || pd->conn_uid != c->uid) {
		pthread_mutex_unlock(&ctl.lock);
		count_drop(R2CC_CTL_DROP_MALFORMED, c);
		return;
	}
	if (h->flags & R2CC_CTL_F_ERROR) {
		uint32_t e = h->len == 4 ? get_u32(p) : 0;
		pending_complete_locked(pd, e > 0 && e < 4096 ? -(int)e : -EPROTO);
	} else if (pd->grow) {
		pd->buf = malloc(h->len ? h->len : 1);
		if (pd->buf) {
			memcpy(pd->buf, p, h->len);
			pd->len = h->len;
		}
		pending_complete_locked(pd, pd->buf ? 0 : -ENOMEM);
	} else {
		pd->len = h->len;
		if (h->len > pd->cap) {
			pending_complete_locked(pd, -EMSGSIZE);
		} else {
			if (h->len)
				memcpy(pd->buf, p, h->len);
			pending_complete_locked(pd, 0);
		}
	}
	pthread_mutex_unlock(&ctl.lock);
}

static void run_handler(struct conn *c, const unsigned char *key, const struct r2cc_ctl_hdr *h,
			const unsigned char *p)
{
	struct handler hd = {0};
	pthread_mutex_lock(&ctl.lock);
	if (h->type >= R2CC_CTL_TYPE_USER && h->type < R2CC_CTL_TYPE_MAX)
		hd = ctl.handlers[h->type];
	pthread_mutex_unlock(&ctl.lock);
	bool is_req = h->flags & R2CC_CTL_F_REQUEST;
	if (!hd.fn) {
		count_drop(R2CC_CTL_DROP_UNKNOWN_TYPE, c);
		if (is_req)
			send_reply(c, key, h->job_id, h->req_id, h->to_rank, h->from_rank,
				   -EOPNOTSUPP, NULL, 0);
		return;
	}
	struct call_priv call = {
	    .pub = {h->job_id, h->from_rank, h->to_rank, is_req},
	    .conn = c,
	    .req_id = h->req_id,
	};
	memcpy(call.key, key, R2CC_CTL_SECRET_SIZE);
	hd.fn(hd.arg, h->from_rank, p, h->len, &call.pub);
	if (is_req && !call.replied)
		send_reply(c, key, h->job_id, h->req_id, h->to_rank, h->from_rank, -ENODATA, NULL,
			   0);
}

enum { FRAME_DONE, FRAME_CLOSE, FRAME_PARKED };

/*
 * A frame for a job this process does not know may come just before the job
 * does: a peer that left ncclCommSplit first talks on the child communicator
 * before this rank has made the child's directory. Such frames wait here,
 * bounded in number, bytes and time, then are processed in arrival order or
 * dropped as unknown_job. Later frames of the same connection queue behind
 * them so that nothing overtakes (sequence numbers would call it a replay).
 */
static bool park(struct conn *c, const struct r2cc_ctl_hdr *h, unsigned char *frame)
{
	size_t size = r2cc_ctl_frame_size(h->len);
	if (ctl.nparked >= CTL_PARK_MAX_FRAMES || ctl.parked_bytes + size > CTL_PARK_MAX_BYTES)
		return false;
	struct parked *k = malloc(sizeof(*k));
	if (!k)
		return false;
	*k = (struct parked){NULL, *h, frame, size, c->uid, now_ms()};
	*ctl.park_tail = k;
	ctl.park_tail = &k->next;
	ctl.nparked++;
	ctl.parked_bytes += size;
	c->parked++;
	ctl.timers = true;
	return true;
}

/* Whether h is for this process: a rank it holds in j, or the rendezvous
 * (rank -1: registration and its cancel, and the requests its directory
 * serves: lookups, NIC reports, leaving). */
static bool addressed_here_locked(const struct job_ent *j, const struct r2cc_ctl_hdr *h)
{
	if (h->to_rank == -1)
		return !(h->flags & R2CC_CTL_F_REPLY) &&
		       (h->type == CTL_T_REGISTER || h->type == CTL_T_CANCEL ||
			h->type == CTL_T_LOOKUP || h->type == CTL_T_NICS || h->type == CTL_T_LEAVE);
	for (int i = 0; i < j->nlocal; i++)
		if (j->ranks[i] == h->to_rank)
			return true;
	return false;
}

static int process_frame(struct conn *c, const struct r2cc_ctl_hdr *h, unsigned char *frame,
			 bool may_park)
{
	const unsigned char *p = frame + R2CC_CTL_HDR_SIZE;
	unsigned char key[R2CC_CTL_SECRET_SIZE];
	pthread_mutex_lock(&ctl.lock);
	struct job_ent *j = job_find_locked(h->job_id);
	if (j)
		memcpy(key, j->job.secret, sizeof(key));
	pthread_mutex_unlock(&ctl.lock);
	if ((!j || c->parked) && may_park && park(c, h, frame))
		return FRAME_PARKED;
	if (!j) {
		/* The framing is intact: the connection may carry other jobs. */
		count_drop(R2CC_CTL_DROP_UNKNOWN_JOB, c);
		return FRAME_DONE;
	}
	int64_t now_ns = r2cc_ctl_now_ns();
	int drop = r2cc_ctl_frame_verify(key, h, frame, now_ns);
	if (drop == R2CC_CTL_DROP_NONE) {
		/* The addressee is under the tag: a frame replayed to another
		 * process of the job names a rank that process does not hold. */
		pthread_mutex_lock(&ctl.lock);
		if (!addressed_here_locked(j, h))
			drop = R2CC_CTL_DROP_MISADDRESSED;
		pthread_mutex_unlock(&ctl.lock);
	}
	if (drop == R2CC_CTL_DROP_NONE)
		drop = r2cc_ctl_replay_check(ctl.replay, h->job_id, h->sender, h->seq);
	if (drop != R2CC_CTL_DROP_NONE) {
		if (drop == R2CC_CTL_DROP_STALE)
			count_stale(c, h, now_ns);
		else
			count_drop(drop, c);
		/* An unauthenticated peer gets no second try on this stream. */
		return drop == R2CC_CTL_DROP_BAD_TAG ? FRAME_CLOSE : FRAME_DONE;
	}
	STAT_INC(received);
	c->authed = true;
	conn_src_release(c);
	if (h->flags & R2CC_CTL_F_REPLY)
		take_reply(c, h, p);
	else if (h->type == CTL_T_REGISTER)
		rdv_register(c, j, h, p);
	else if (h->type == CTL_T_CANCEL)
		rdv_cancel(c, j, h, p);
	else if (h->type == CTL_T_LOOKUP || h->type == CTL_T_NICS)
		rdv_serve(c, j, h, p);
	else if (h->type == CTL_T_LEAVE)
		rdv_leave(c, j, h, p);
	else
		run_handler(c, key, h, p);
	return FRAME_DONE;
}

static bool job_known(uint64_t id)
{
	pthread_mutex_lock(&ctl.lock);
	bool known = job_find_locked(id) != NULL;
	pthread_mutex_unlock(&ctl.lock);
	return known;
}

/* Retry parked frames in arrival order; drop the expired and the orphaned. */
static void park_retry(bool flush)
{
	int64_t now = now_ms();
	int limit = __atomic_load_n(&park_ms, __ATOMIC_RELAXED);
	for (struct parked **pp = &ctl.park; *pp;) {
		struct parked *k = *pp;
		struct conn *c = conn_by_uid(k->conn_uid);
		bool known = job_known(k->hdr.job_id);
		if (!flush && c && !known && now - k->since_ms < limit) {
			pp = &k->next;
			continue;
		}
		*pp = k->next;
		if (!*pp)
			ctl.park_tail = pp;
		ctl.nparked--;
		ctl.parked_bytes -= k->size;
		if (c)
			c->parked--;
		if (c && known && !flush) {
			if (process_frame(c, &k->hdr, k->frame, false) == FRAME_CLOSE)
				conn_kill(c, -ECONNRESET);
		} else if (!known) {
			count_drop(R2CC_CTL_DROP_UNKNOWN_JOB, c);
		}
		free(k->frame);
		free(k);
	}
}

static void conn_read(struct conn *c)
{
	for (int k = 0; k < CTL_READS_PER_PASS && !c->dead; k++) {
		unsigned char *where;
		size_t want;
		r2cc_ctl_rx_space(&c->rx, &where, &want);
		ssize_t n = recv(c->fd, where, want, 0);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			return;
		if (n <= 0) {
			if (r2cc_ctl_rx_partial(&c->rx))
				count_drop(R2CC_CTL_DROP_TRUNCATED, c);
			conn_kill(c, -ECONNRESET);
			return;
		}
		c->rx_progress_ms = now_ms();
		bool had_frame = c->rx.frame != NULL;
		int drop;
		int rc = r2cc_ctl_rx_advance(&c->rx, (size_t)n, &drop);
		if (rc == 0)
			ctl.timers = true; /* half a frame may stall */
		if (rc < 0) {
			count_drop(drop, c);
			conn_kill(c, -ECONNRESET);
			return;
		}
		if (!had_frame && c->rx.frame) {
			c->rx_charged = r2cc_ctl_frame_size(c->rx.hdr.len);
			ctl.rx_charged += c->rx_charged;
			if (ctl.rx_charged > CTL_RX_BUDGET ||
			    (c->src && c->src->bytes + c->rx_charged > CTL_PREAUTH_BYTES_PER_SRC)) {
				count_drop(R2CC_CTL_DROP_BAD_LENGTH, c);
				conn_kill(c, -ENOBUFS);
				return;
			}
			if (c->src) {
				c->src->bytes += c->rx_charged;
				c->src_charged = c->rx_charged;
			}
		}
		if (rc == 1) {
			int what = process_frame(c, &c->rx.hdr, c->rx.frame, true);
			rx_uncharge(c);
			if (what == FRAME_PARKED)
				c->rx.frame = NULL; /* the park owns it now */
			r2cc_ctl_rx_reset(&c->rx);
			if (what == FRAME_CLOSE)
				conn_kill(c, -ECONNRESET);
		}
	}
}

/* Out of descriptors: the pending connection stays in the backlog and the
 * listener stays readable, so stop polling it for a moment instead of
 * spinning. */
static int64_t accept_pause_until;

static void accept_all(int lfd)
{
	for (;;) {
		struct sockaddr_storage peer;
		socklen_t plen = sizeof(peer);
		int fd =
		    accept4(lfd, (struct sockaddr *)&peer, &plen, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
			    errno == ENOMEM) {
				R2CC_WARN_ONCE("control plane: cannot accept connections: %s "
					       "(raise the open-file limit for large jobs)",
					       strerror(errno));
				accept_pause_until = now_ms() + CTL_POLL_MS;
			}
			return;
		}
		struct src_ent *e = ctl.nconns < CTL_MAX_CONNS ? src_get(&peer) : NULL;
		if (!e || e->conns >= __atomic_load_n(&preauth_per_src, __ATOMIC_RELAXED) ||
		    ctl.preauth_conns >= CTL_PREAUTH_CONNS) {
			if (e) {
				char a[64];
				R2CC_WARN_ONCE("control plane: refusing connections from %s: %d "
					       "of its connections have not authenticated yet",
					       r2cc_ctl_addr_str(&peer, a, sizeof(a)), e->conns);
				src_put(e);
			}
			STAT_INC(conns_refused);
			close(fd);
			continue;
		}
		struct conn *c = conn_new(fd, false);
		if (!c) {
			src_put(e);
			close(fd);
			return;
		}
		c->peer = peer;
		c->src = e;
		e->conns++;
		ctl.preauth_conns++;
		if (conn_add(c)) {
			STAT_INC(conns_refused);
			conn_free(c);
			continue;
		}
		STAT_INC(conns_accepted);
		/* A client sends its first frame as soon as it is connected: read
		 * it now, so that the connection stops counting as a stranger
		 * before the next one is accepted, and a burst of registrations
		 * from one host (the ranks of a node) is not refused. */
		conn_read(c);
	}
}

static void conn_events(struct conn *c, uint32_t rev)
{
	if (c->dead)
		return;
	if (c->connecting && (rev & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
		int err = 0;
		socklen_t el = sizeof(err);
		if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0)
			err = errno;
		if (err) {
			conn_kill(c, -err);
			return;
		}
		c->connecting = false;
		c->tx_progress_ms = now_ms();
	}
	if (!c->connecting && (rev & (EPOLLIN | EPOLLERR | EPOLLHUP)))
		conn_read(c);
	if (!c->connecting && !c->dead && (rev & EPOLLOUT))
		conn_flush(c);
}

/* Every CTL_POLL_MS: what has waited too long. Also decides whether anything
 * can time out at all (then the loop wakes every CTL_POLL_MS, else once a
 * second). */
static void conns_sweep(void)
{
	int64_t now = now_ms();
	int stall = __atomic_load_n(&rx_stall_ms, __ATOMIC_RELAXED);
	int auth = __atomic_load_n(&auth_ms, __ATOMIC_RELAXED);
	bool timers = ctl.nparked > 0;
	ctl.last_sweep_ms = now;
	for (int i = 0; i < ctl.nconns; i++) {
		struct conn *c = ctl.conns[i];
		if (c->dead)
			continue;
		if (c->connecting && now - c->opened_ms > CTL_CONNECT_MS) {
			conn_kill(c, -ETIMEDOUT);
		} else if ((!c->outgoing && !c->authed && now - c->opened_ms > auth) ||
			   (r2cc_ctl_rx_partial(&c->rx) && now - c->rx_progress_ms > stall)) {
			/* A stranger that has not proven itself in time, however
			 * busily it trickles bytes, or half a frame: either holds a
			 * connection slot for no use. */
			count_drop(R2CC_CTL_DROP_TIMEOUT, c);
			conn_kill(c, -ETIMEDOUT);
		} else if (c->txq && now - c->tx_progress_ms > CTL_TX_STALL_MS) {
			conn_kill(c, -ETIMEDOUT);
		}
		timers |= !c->dead && (c->connecting || c->txq || r2cc_ctl_rx_partial(&c->rx) ||
				       (!c->outgoing && !c->authed));
	}
	ctl.timers = timers;
}

/* epoll's data for the descriptors that are not connections. */
static char ev_wake, ev_listen, ev_oob;

static void watch_fd(int fd, uint32_t events, void *tag)
{
	struct epoll_event e = {.events = events, .data.ptr = tag};
	if (epoll_ctl(ctl.ep_fd, EPOLL_CTL_MOD, fd, &e) != 0 &&
	    epoll_ctl(ctl.ep_fd, EPOLL_CTL_ADD, fd, &e) != 0)
		R2CC_WARN_ONCE("control plane: epoll: %s", strerror(errno));
}

static void *ctl_main(void *arg)
{
	struct epoll_event *ev = malloc(sizeof(*ev) * CTL_EVENTS);
	if (!ev) {
		R2CC_WARN("control plane: out of memory; the control thread stops");
		return NULL;
	}
	int oob_watched = -1;
	bool paused = false;
	watch_fd(ctl.wake_fd, EPOLLIN, &ev_wake);
	watch_fd(ctl.listen_fd, EPOLLIN, &ev_listen);
	for (;;) {
		pthread_mutex_lock(&ctl.lock);
		bool stop = ctl.stop;
		int oob = ctl.oob_fd;
		pthread_mutex_unlock(&ctl.lock);
		if (stop)
			break;
		route_out();
		park_retry(false);
		conns_reap();
		/* Out of descriptors: the listeners rest for a moment. */
		bool pause = now_ms() < accept_pause_until;
		if (pause != paused || oob != oob_watched) {
			watch_fd(ctl.listen_fd, pause ? 0 : EPOLLIN, &ev_listen);
			if (oob >= 0)
				watch_fd(oob, pause ? 0 : EPOLLIN, &ev_oob);
			paused = pause;
			oob_watched = oob;
		}
		/* Timers only matter while something can time out; an idle
		 * process wakes once a second, not ten times. */
		int wait_ms = ctl.timers || paused ? CTL_POLL_MS : CTL_IDLE_POLL_MS;
		int n = epoll_wait(ctl.ep_fd, ev, CTL_EVENTS, wait_ms);
		if (n < 0 && errno != EINTR)
			R2CC_WARN_ONCE("control plane: epoll_wait: %s", strerror(errno));
		bool accept_main = false, accept_oob = false;
		for (int i = 0; i < n; i++) {
			void *tag = ev[i].data.ptr;
			if (tag == &ev_wake) {
				uint64_t v;
				if (read(ctl.wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
					R2CC_WARN_ONCE("control plane: wake read: %s",
						       strerror(errno));
			} else if (tag == &ev_listen) {
				accept_main = true;
			} else if (tag == &ev_oob) {
				accept_oob = true;
			} else {
				conn_events(tag, ev[i].events);
			}
		}
		park_retry(false);
		if (accept_main)
			accept_all(ctl.listen_fd);
		if (accept_oob && oob >= 0)
			accept_all(oob);
		if (now_ms() - ctl.last_sweep_ms >= CTL_POLL_MS)
			conns_sweep();
	}
	free(ev);
	park_retry(true);
	for (int i = 0; i < ctl.nconns; i++)
		conn_kill(ctl.conns[i], -ESHUTDOWN);
	conns_reap();
	pthread_mutex_lock(&ctl.lock);
	for (struct pending *p = ctl.pending; p; p = p->next)
		pending_complete_locked(p, -ESHUTDOWN);
	while (ctl.outq) {
		struct out_item *it = ctl.outq;
		ctl.outq = it->next;
		free(it);
	}
	ctl.outtail = &ctl.outq;
	pthread_mutex_unlock(&ctl.lock);
	return arg;
}

/* Start-up, fork, shutdown. */

static void atfork_prepare(void)
{
	pthread_mutex_lock(&ctl.start_lock);
	pthread_mutex_lock(&ctl.lock);
}

static void atfork_parent(void)
{
	pthread_mutex_unlock(&ctl.lock);
	pthread_mutex_unlock(&ctl.start_lock);
}

static void atfork_child(void)
{
	if (ctl.started) {
		for (int i = 0; i < ctl.nconns; i++)
			close(ctl.conns[i]->fd);
		close(ctl.listen_fd);
		close(ctl.wake_fd);
		close(ctl.ep_fd);
		if (ctl.oob_fd >= 0)
			close(ctl.oob_fd);
		while (ctl.jobs) {
			struct job_ent *j = ctl.jobs;
			ctl.jobs = j->next;
			free(j->ranks);
			free(j);
		}
		/* Waiters, queued frames, connections and their sources were the
		 * parent's threads' (their tables are left behind, as their
		 * buffers are). */
		memset(ctl.src, 0, sizeof(ctl.src));
		ctl.preauth_conns = 0;
		ctl.conns = NULL;
		ctl.nconns = ctl.conncap = 0;
		ndead = 0;
		ctl.conn_by_uid = (struct r2cc_hmap){0};
		ctl.conn_by_dst = (struct r2cc_hmap){0};
		ctl.pending_by_id = (struct r2cc_hmap){0};
		ctl.pending = NULL;
		ctl.outq = NULL;
		ctl.outtail = &ctl.outq;
		ctl.out_items = ctl.out_bytes = 0;
		ctl.replay = NULL;
		ctl.rx_charged = 0;
		ctl.park = NULL;
		ctl.nparked = 0;
		ctl.parked_bytes = 0;
		ctl.listen_fd = ctl.wake_fd = ctl.oob_fd = ctl.ep_fd = -1;
		ctl.started = false;
		ctl.stop = false;
		memset(&stats, 0, sizeof(stats));
	}
	if (ctl.cv_ready) {
		pthread_condattr_t ca;
		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&ctl.done_cv, &ca);
		pthread_condattr_destroy(&ca);
	}
	pthread_mutex_unlock(&ctl.lock);
	pthread_mutex_unlock(&ctl.start_lock);
}

static void once_init(void)
{
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&ctl.done_cv, &ca);
	pthread_condattr_destroy(&ca);
	ctl.cv_ready = true;
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
	if (ctl.shut)
		return -ESHUTDOWN;
	if (ctl.started)
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
	int lfd = listen_on(&addr, &ctl.local);
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
	pthread_mutex_lock(&ctl.lock);
	ctl.listen_fd = lfd;
	ctl.wake_fd = wfd;
	ctl.ep_fd = efd;
	ctl.conns = NULL;
	ctl.nconns = ctl.conncap = 0;
	ctl.replay = replay;
	ctl.outq = NULL;
	ctl.outtail = &ctl.outq;
	ctl.park = NULL;
	ctl.park_tail = &ctl.park;
	ctl.stop = false;
	pthread_mutex_unlock(&ctl.lock);

	/* The thread inherits a mask with every signal blocked. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = -pthread_create(&ctl.thread, NULL, ctl_main, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc)
		goto err_free;
	pthread_setname_np(ctl.thread, "r2cc-ctl");
	pthread_mutex_lock(&ctl.lock);
	ctl.started = true;
	pthread_mutex_unlock(&ctl.lock);
	char a[64];
	R2CC_INFO("control plane: listening on %s (%s)",
		  r2cc_ctl_addr_str(&ctl.local, a, sizeof(a)), ifname);
	return 0;

err_free:
	pthread_mutex_lock(&ctl.lock);
	ctl.listen_fd = ctl.wake_fd = ctl.ep_fd = -1;
	ctl.replay = NULL;
	pthread_mutex_unlock(&ctl.lock);
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

static bool on_ctl_thread(void)
{
	pthread_mutex_lock(&ctl.lock);
	bool on = ctl.started && pthread_equal(pthread_self(), ctl.thread);
	pthread_mutex_unlock(&ctl.lock);
	return on;
}

static int ctl_start(void)
{
	pthread_mutex_lock(&ctl.start_lock);
	int rc = start_locked();
	pthread_mutex_unlock(&ctl.start_lock);
	return rc;
}

/* The R2CC_OOB_ROOT listener, under start_lock. */
static int oob_listen_locked(const struct sockaddr_storage *root)
{
	if (ctl.oob_fd >= 0)
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
	pthread_mutex_lock(&ctl.lock);
	ctl.oob_fd = fd;
	wake_thread_locked();
	pthread_mutex_unlock(&ctl.lock);
	return 0;
}

int r2cc_ctl_uid_stamp(unsigned char id[R2CC_CTL_UID_SIZE])
{
	struct r2cc_ctl_job job = {0};
	pthread_mutex_lock(&ctl.start_lock);
	int rc = start_locked();
	if (rc)
		goto out_unlock;
	job.rdv = ctl.local;
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
		rc = job_ensure(&job, true, NULL, 0);
	if (rc == 0)
		rc = r2cc_ctl_uid_encode(id, &job);
	if (rc == 0) {
		char a[64];
		R2CC_INFO("control plane: new job %016llx, rendezvous %s",
			  (unsigned long long)job.id, r2cc_ctl_addr_str(&job.rdv, a, sizeof(a)));
	}
out_unlock:
	pthread_mutex_unlock(&ctl.start_lock);
	return rc;
}

int r2cc_ctl_local_addr(struct sockaddr_storage *addr)
{
	pthread_mutex_lock(&ctl.lock);
	int rc = ctl.started ? 0 : -ENOTCONN;
	if (rc == 0)
		*addr = ctl.local;
	pthread_mutex_unlock(&ctl.lock);
	return rc;
}

void r2cc_ctl_shutdown(void)
{
	pthread_mutex_lock(&ctl.start_lock);
	if (ctl.shut) {
		pthread_mutex_unlock(&ctl.start_lock);
		return;
	}
	pthread_mutex_lock(&ctl.lock);
	ctl.shut = true;
	bool started = ctl.started;
	ctl.stop = true;
	if (started)
		wake_thread_locked();
	pthread_mutex_unlock(&ctl.lock);
	if (started) {
		if (pthread_equal(pthread_self(), ctl.thread)) {
			/* exit() from a handler: the loop ends when this returns. */
			pthread_detach(ctl.thread);
			pthread_mutex_unlock(&ctl.start_lock);
			return;
		}
		pthread_join(ctl.thread, NULL);
		pthread_mutex_lock(&ctl.lock);
		close(ctl.listen_fd);
		close(ctl.wake_fd);
		close(ctl.ep_fd);
		if (ctl.oob_fd >= 0)
			close(ctl.oob_fd);
		ctl.listen_fd = ctl.wake_fd = ctl.oob_fd = ctl.ep_fd = -1;
		while (ctl.jobs) {
			struct job_ent *j = ctl.jobs;
			ctl.jobs = j->next;
			job_free(j);
		}
		free(ctl.conns);
		ctl.conns = NULL;
		ctl.nconns = ctl.conncap = 0;
		r2cc_hmap_free(&ctl.conn_by_uid);
		r2cc_hmap_free(&ctl.conn_by_dst);
		r2cc_hmap_free(&ctl.pending_by_id);
		r2cc_ctl_replay_free(ctl.replay);
		ctl.replay = NULL;
		ctl.started = false;
		pthread_mutex_unlock(&ctl.lock);
	}
	pthread_mutex_unlock(&ctl.start_lock);
}

/* Requests (any thread). */

static void request_begin(struct pending *p, const struct sockaddr_storage *dst,
			  const struct r2cc_ctl_job *job, struct r2cc_ctl_hdr *h,
			  const void *payload, size_t len)
{
	pthread_mutex_lock(&ctl.lock);
	if (++ctl.next_req == 0)
		ctl.next_req = 1;
	p->req_id = ctl.next_req;
	p->job_id = job->id;
	int rc = pending_link_locked(p);
	pthread_mutex_unlock(&ctl.lock);
	h->flags = R2CC_CTL_F_REQUEST;
	h->req_id = p->req_id;
	h->job_id = job->id;
	if (rc == 0)
		rc = queue_out(dst, job->secret, h, payload, len);
	if (rc) {
		pthread_mutex_lock(&ctl.lock);
		pending_complete_locked(p, rc);
		pthread_mutex_unlock(&ctl.lock);
	}
}

static void deadline_after(struct timespec *ts, int timeout_ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += timeout_ms / 1000;
	ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

/* Waits for p until the deadline and unlinks it; returns its status. */
static int request_wait(struct pending *p, const struct timespec *deadline)
{
	pthread_mutex_lock(&ctl.lock);
	while (!p->done)
		if (pthread_cond_timedwait(&ctl.done_cv, &ctl.lock, deadline) == ETIMEDOUT)
			break;
	int rc = p->done ? p->status : -ETIMEDOUT;
	pending_unlink_locked(p);
	pthread_mutex_unlock(&ctl.lock);
	return rc;
}

static int ms_left(const struct timespec *deadline)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	int64_t ms = (int64_t)(deadline->tv_sec - now.tv_sec) * 1000 +
		     (deadline->tv_nsec - now.tv_nsec) / 1000000;
	return ms > 0 ? (int)ms : 0;
}

/* A request to the rendezvous that serves dir's lookups; the reply is
 * malloc'd into *reply. */
static int rdv_request(const struct r2cc_ctl_dir *dir, uint16_t type, const void *payload,
		       size_t len, unsigned char **reply, size_t *rlen, int timeout_ms)
{
	const struct r2cc_ctl_job *job;
	int self;
	uint32_t gen;
	if (on_ctl_thread())
		return -EDEADLK;
	r2cc_ctl_dir_lookup_target(dir, &job, &self, &gen);
	int rc = ctl_start();
	if (rc == 0)
		rc = job_ensure(job, false, &self, 1);
	if (rc)
		return rc;
	struct pending p = {.peer_rank = -1, .grow = true};
	struct r2cc_ctl_hdr h = {.type = type, .from_rank = self, .to_rank = -1};
	struct timespec deadline;
	deadline_after(&deadline, timeout_ms);
	request_begin(&p, &job->rdv, job, &h, payload, len);
	rc = request_wait(&p, &deadline);
	if (rc == 0) {
		*reply = p.buf;
		*rlen = p.len;
	} else {
		free(p.buf);
	}
	return rc;
}

#define FETCH_CHUNK 4096

static int cmp_rank(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

int r2cc_ctl_dir_fetch(const struct r2cc_ctl_dir *dir, const int *ranks, int n, int timeout_ms)
{
	if (!dir || n < 0 || (n && !ranks) || timeout_ms < 0)
		return -EINVAL;
	int *want = malloc(sizeof(int) * (size_t)(n ? n : 1));
	if (!want)
		return -ENOMEM;
	int k = 0;
	for (int i = 0; i < n; i++) {
		if (ranks[i] < 0 || ranks[i] >= dir->nranks) {
			free(want);
			return -EINVAL;
		}
		if (!r2cc_ctl_dir_member(dir, ranks[i]))
			want[k++] = ranks[i];
	}
	/* Each rank once: a request never names more ranks than the round has. */
	qsort(want, (size_t)k, sizeof(int), cmp_rank);
	int u = 0;
	for (int i = 0; i < k; i++)
		if (!u || want[i] != want[u - 1])
			want[u++] = want[i];
	k = u;
	struct timespec deadline;
	deadline_after(&deadline, timeout_ms);
	int rc = 0;
	for (int i = 0; i < k && rc == 0; i += FETCH_CHUNK) {
		int nr = k - i < FETCH_CHUNK ? k - i : FETCH_CHUNK;
		unsigned char *req = NULL, *reply = NULL;
		size_t len = 0, rlen = 0;
		rc = r2cc_ctl_lookup_encode(dir, want + i, nr, NULL, 0, &req, &len);
		if (rc == 0)
			rc = rdv_request(dir, CTL_T_LOOKUP, req, len, &reply, &rlen,
					 ms_left(&deadline));
		if (rc == 0)
			rc = r2cc_ctl_dir_take_lookup(dir, reply, rlen, 0, NULL, 0, NULL);
		free(req);
		free(reply);
	}
	for (int i = 0; i < k && rc == 0; i++)
		if (!r2cc_ctl_dir_member(dir, want[i]))
			rc = -ENOENT;
	free(want);
	return rc;
}

int r2cc_ctl_dir_owners(const struct r2cc_ctl_dir *dir, const struct r2cc_ctl_nicaddr *addrs, int n,
			int *owners, int max_per_addr, int *nowners, int timeout_ms)
{
	if (!dir || n < 1 || n > R2CC_CTL_LOOKUP_MAX_ADDRS || !addrs || !owners ||
	    max_per_addr < 1 || !nowners || timeout_ms < 0)
		return -EINVAL;
	unsigned char *req = NULL, *reply = NULL;
	size_t len = 0, rlen = 0;
	int rc = r2cc_ctl_lookup_encode(dir, NULL, 0, addrs, n, &req, &len);
	if (rc == 0)
		rc = rdv_request(dir, CTL_T_LOOKUP, req, len, &reply, &rlen, timeout_ms);
	if (rc == 0)
		rc = r2cc_ctl_dir_take_lookup(dir, reply, rlen, n, owners, max_per_addr, nowners);
	free(req);
	free(reply);
	return rc;
}

int r2cc_ctl_dir_report_nics(const struct r2cc_ctl_dir *dir, const struct r2cc_ctl_nic *nics, int n,
			     int timeout_ms)
{
	if (!dir || !nics || timeout_ms < 0)
		return -EINVAL;
	unsigned char *req = NULL, *reply = NULL;
	size_t len = 0, rlen = 0;
	int rc = r2cc_ctl_nics_encode(dir, nics, n, &req, &len);
	if (rc == 0)
		rc = rdv_request(dir, CTL_T_NICS, req, len, &reply, &rlen, timeout_ms);
	free(req);
	free(reply);
	return rc;
}

void r2cc_ctl_dir_leave(const struct r2cc_ctl_dir *dir)
{
	const struct r2cc_ctl_job *job;
	int self;
	uint32_t gen;
	if (!dir)
		return;
	r2cc_ctl_dir_lookup_target(dir, &job, &self, &gen);
	/* A split's ranks leave through their parent's communicator. */
	if (job->id != dir->job.id || ctl_start() || job_ensure(job, false, &self, 1))
		return;
	unsigned char b[8];
	put_u32(b, gen);
	put_u32(b + 4, (uint32_t)self);
	struct r2cc_ctl_hdr h = {
	    .type = CTL_T_LEAVE, .job_id = job->id, .from_rank = self, .to_rank = -1};
	queue_out(&job->rdv, job->secret, &h, b, sizeof(b));
}

/* Where rank's process listens; its member is fetched first when the
 * directory does not hold it. */
static int member_addr(const struct r2cc_ctl_dir *dir, int rank, int timeout_ms,
		       struct sockaddr_storage *out)
{
	const struct r2cc_ctl_member *m = r2cc_ctl_dir_member(dir, rank);
	if (!m) {
		if (on_ctl_thread())
			return -ENOENT;
		int rc = r2cc_ctl_dir_fetch(dir, &rank, 1, timeout_ms);
		if (rc)
			return rc;
		m = r2cc_ctl_dir_member(dir, rank);
		if (!m)
			return -ENOENT;
	}
	*out = m->ctl_addr;
	return 0;
}

int r2cc_ctl_request(const struct r2cc_ctl_dir *dir, int rank, uint16_t type, const void *payload,
		     size_t len, void *reply, size_t *reply_len, int timeout_ms)
{
	if (!dir || rank < 0 || rank >= dir->nranks || type < R2CC_CTL_TYPE_USER ||
	    type >= R2CC_CTL_TYPE_MAX || !reply_len || (*reply_len && !reply) || timeout_ms < 0)
		return -EINVAL;
	/* A handler waiting for a reply would wait for its own thread. */
	if (on_ctl_thread())
		return -EDEADLK;
	int rc = ctl_start();
	if (rc == 0)
		rc = job_ensure(&dir->job, false, &dir->self_rank, 1);
	if (rc)
		return rc;
	struct pending p = {.peer_rank = rank, .buf = reply, .cap = *reply_len};
	struct r2cc_ctl_hdr h = {.type = type, .from_rank = dir->self_rank, .to_rank = rank};
	struct timespec deadline;
	struct sockaddr_storage dst;
	deadline_after(&deadline, timeout_ms);
	rc = member_addr(dir, rank, timeout_ms, &dst);
	if (rc)
		return rc;
	request_begin(&p, &dst, &dir->job, &h, payload, len);
	rc = request_wait(&p, &deadline);
	if (rc == 0 || rc == -EMSGSIZE)
		*reply_len = p.len;
	return rc;
}

int r2cc_ctl_request_batch(struct r2cc_ctl_batch_req *reqs, int n, uint16_t type, int timeout_ms)
{
	if (n < 0 || (n && !reqs) || type < R2CC_CTL_TYPE_USER || type >= R2CC_CTL_TYPE_MAX ||
	    timeout_ms < 0)
		return -EINVAL;
	for (int i = 0; i < n; i++)
		if (!reqs[i].dir || reqs[i].rank < 0 || reqs[i].rank >= reqs[i].dir->nranks ||
		    (reqs[i].reply_len && !reqs[i].reply))
			return -EINVAL;
	if (on_ctl_thread())
		return -EDEADLK;
	int rc = ctl_start();
	if (rc)
		return rc;
	struct pending *p = calloc((size_t)(n ? n : 1), sizeof(*p));
	if (!p)
		return -ENOMEM;
	struct timespec deadline;
	deadline_after(&deadline, timeout_ms);
	for (int i = 0; i < n; i++) {
		struct r2cc_ctl_batch_req *q = &reqs[i];
		struct sockaddr_storage dst;
		q->status = job_ensure(&q->dir->job, false, &q->dir->self_rank, 1);
		if (q->status == 0)
			q->status = member_addr(q->dir, q->rank, ms_left(&deadline), &dst);
		if (q->status)
			continue;
		p[i] = (struct pending){.peer_rank = q->rank, .buf = q->reply, .cap = q->reply_len};
		struct r2cc_ctl_hdr h = {
		    .type = type, .from_rank = q->dir->self_rank, .to_rank = q->rank};
		request_begin(&p[i], &dst, &q->dir->job, &h, q->payload, q->len);
		q->status = 1; /* in flight */
	}
	for (int i = 0; i < n; i++) {
		struct r2cc_ctl_batch_req *q = &reqs[i];
		if (q->status == 1) {
			q->status = request_wait(&p[i], &deadline);
			if (q->status == 0 || q->status == -EMSGSIZE)
				q->reply_len = p[i].len;
		}
		if (q->status && !rc)
			rc = q->status;
	}
	free(p);
	return rc;
}

int r2cc_ctl_send(const struct r2cc_ctl_dir *dir, int rank, uint16_t type, const void *payload,
		  size_t len)
{
	if (!dir || rank < 0 || rank >= dir->nranks || type < R2CC_CTL_TYPE_USER ||
	    type >= R2CC_CTL_TYPE_MAX || (len && !payload))
		return -EINVAL;
	int rc = ctl_start();
	if (rc == 0)
		rc = job_ensure(&dir->job, false, &dir->self_rank, 1);
	if (rc)
		return rc;
	struct r2cc_ctl_hdr h = {
	    .type = type,
	    .job_id = dir->job.id,
	    .from_rank = dir->self_rank,
	    .to_rank = rank,
	};
	struct sockaddr_storage dst;
	rc = member_addr(dir, rank, 2000, &dst);
	if (rc)
		return rc;
	return queue_out(&dst, dir->job.secret, &h, payload, len);
}

void r2cc_ctl_set_conn_per_rank(bool on)
{
	__atomic_store_n(&ctl.conn_per_rank, on, __ATOMIC_RELAXED);
}

int r2cc_ctl_dir_split(const struct r2cc_ctl_dir *parent, const int *parent_ranks, int nranks,
		       int self_rank, uint64_t tag, struct r2cc_ctl_dir **child_p)
{
	struct r2cc_ctl_dir *child;
	int rc = r2cc_ctl_dir_derive(parent, parent_ranks, nranks, self_rank, tag, &child);
	if (rc)
		return rc;
	/* Known from now on, so that peers' frames for it are accepted. */
	rc = job_ensure(&child->job, false, &child->self_rank, 1);
	if (rc) {
		r2cc_ctl_dir_free(child);
		return rc;
	}
	*child_p = child;
	return 0;
}

int r2cc_ctl_set_handler(uint16_t type, r2cc_ctl_handler_fn fn, void *arg)
{
	if (type < R2CC_CTL_TYPE_USER || type >= R2CC_CTL_TYPE_MAX)
		return -EINVAL;
	pthread_mutex_lock(&ctl.lock);
	ctl.handlers[type] = (struct handler){fn, arg};
	pthread_mutex_unlock(&ctl.lock);
	return 0;
}

int r2cc_ctl_reply(struct r2cc_ctl_call *call, int status, const void *payload, size_t len)
{
	struct call_priv *cp = (struct call_priv *)((char *)call - offsetof(struct call_priv, pub));
	if (!call->is_request || cp->replied || !on_ctl_thread())
		return -EINVAL;
	if (len > R2CC_CTL_MAX_PAYLOAD || (len && !payload))
		return -EMSGSIZE;
	cp->replied = true;
	return send_reply(cp->conn, cp->key, call->job_id, cp->req_id, call->to_rank,
			  call->from_rank, status, payload, len);
}

/* Registration. */

static void send_cancel(const struct r2cc_ctl_job *job, int rank, uint32_t req_id)
{
	unsigned char b[8];
	put_u32(b, (uint32_t)rank);
	put_u32(b + 4, req_id);
	struct r2cc_ctl_hdr h = {
	    .type = CTL_T_CANCEL, .job_id = job->id, .from_rank = rank, .to_rank = -1};
	queue_out(&job->rdv, job->secret, &h, b, sizeof(b));
}

/* Registers ranks[i] as member selves[i * stride] (stride 0: all the same). */
/* A request whose connection broke before its answer came: worth sending
 * again (a rendezvous flooded with connections refuses some of them). */
static bool conn_lost(int status)
{
	return status == -ECONNRESET || status == -ECONNREFUSED || status == -EPIPE ||
	       status == -ECONNABORTED || status == -ENOTCONN;
}

/* (Re)sends local rank i's registration; p is reset first. */
static void register_send(const struct r2cc_ctl_job *job, struct r2cc_ctl_member *selves,
			  size_t stride, const int *ranks, int i, int nranks, unsigned char *msg,
			  struct pending *p)
{
	struct r2cc_ctl_member *self =
	    (struct r2cc_ctl_member *)((char *)selves + (size_t)i * stride);
	free(p->buf);
	*p = (struct pending){.peer_rank = -1, .grow = true};
	r2cc_ctl_local_addr(&self->ctl_addr);
	int mlen = r2cc_ctl_member_encode(self, msg + 8, R2CC_CTL_MEMBER_MAX_ENC);
	if (mlen < 0) {
		p->done = true;
		p->status = mlen;
		return;
	}
	put_u32(msg, (uint32_t)ranks[i]);
	put_u32(msg + 4, (uint32_t)nranks);
	struct r2cc_ctl_hdr h = {.type = CTL_T_REGISTER, .from_rank = ranks[i], .to_rank = -1};
	request_begin(p, &job->rdv, job, &h, msg, 8 + (size_t)mlen);
}

/* Until every registration is answered, one has lost its connection, or the
 * deadline; returns how many lost their connection. */
static int register_wait(struct pending *p, int n, const struct timespec *deadline)
{
	int lost = 0;
	pthread_mutex_lock(&ctl.lock);
	for (;;) {
		int done = 0;
		lost = 0;
		for (int i = 0; i < n; i++) {
			done += p[i].done;
			lost += p[i].done && conn_lost(p[i].status);
		}
		if (done == n || lost ||
		    pthread_cond_timedwait(&ctl.done_cv, &ctl.lock, deadline) == ETIMEDOUT)
			break;
	}
	pthread_mutex_unlock(&ctl.lock);
	return lost;
}

static int register_impl(const struct r2cc_ctl_job *job, struct r2cc_ctl_member *selves,
			 size_t stride, const int *ranks, int nlocal, int nranks, int timeout_ms,
			 struct r2cc_ctl_dir **dirs_p)
{
	if (!job || !selves || !ranks || !dirs_p || nlocal < 1 || nranks < 1 ||
	    nranks > R2CC_CTL_MAX_RANKS || nlocal > nranks || timeout_ms < 0)
		return -EINVAL;
	unsigned char *seen = calloc((size_t)nranks, 1);
	if (!seen)
		return -ENOMEM;
	for (int i = 0; i < nlocal; i++) {
		if (ranks[i] < 0 || ranks[i] >= nranks || seen[ranks[i]]) {
			free(seen);
			return -EINVAL;
		}
		seen[ranks[i]] = 1;
	}
	free(seen);
	if (on_ctl_thread())
		return -EDEADLK;
	int rc = ctl_start();
	if (rc == 0)
		rc = job_ensure(job, false, ranks, nlocal);
	if (rc)
		return rc;
	unsigned char *msg = malloc(8 + R2CC_CTL_MEMBER_MAX_ENC);
	struct pending *p = calloc((size_t)nlocal, sizeof(*p));
	if (!msg || !p) {
		rc = -ENOMEM;
		goto out_free;
	}
	struct timespec deadline;
	deadline_after(&deadline, timeout_ms);
	for (int i = 0; i < nlocal; i++)
		register_send(job, selves, stride, ranks, i, nranks, msg, &p[i]);
	/* Those whose connection broke are sent again, after a pause that grows
	 * (with some jitter, so that many ranks do not come back at once). */
	unsigned seed = (unsigned)getpid() ^ (unsigned)now_ms();
	int pause_ms = 20;
	for (;;) {
		int lost = register_wait(p, nlocal, &deadline);
		if (!lost || ms_left(&deadline) <= 2 * pause_ms)
			break;
		usleep((useconds_t)(pause_ms + (int)(rand_r(&seed) % (unsigned)pause_ms)) * 1000);
		pause_ms = pause_ms < 500 ? 2 * pause_ms : 1000;
		for (int i = 0; i < nlocal; i++) {
			pthread_mutex_lock(&ctl.lock);
			bool again = p[i].done && conn_lost(p[i].status);
			if (again)
				pending_unlink_locked(&p[i]);
			pthread_mutex_unlock(&ctl.lock);
			if (again)
				register_send(job, selves, stride, ranks, i, nranks, msg, &p[i]);
		}
	}
	for (int i = 0; i < nlocal; i++) {
		int r = request_wait(&p[i], &deadline);
		if (r == -ETIMEDOUT)
			send_cancel(job, ranks[i], p[i].req_id);
		if (r && !rc)
			rc = r;
	}
	for (int i = 0; i < nlocal && rc == 0; i++) {
		rc = r2cc_ctl_dir_decode(p[i].buf, p[i].len, job, ranks[i], &dirs_p[i]);
		if (rc == -EPROTO)
			count_drop(R2CC_CTL_DROP_MALFORMED, NULL);
		if (rc)
			while (i-- > 0)
				r2cc_ctl_dir_free(dirs_p[i]);
	}
	if (rc) {
		char a[64];
		R2CC_WARN("control plane: registration of rank %d/%d with %s failed: %s", ranks[0],
			  nranks, r2cc_ctl_addr_str(&job->rdv, a, sizeof(a)), strerror(-rc));
	}
out_free:
	for (int i = 0; p && i < nlocal; i++)
		free(p[i].buf);
	free(p);
	free(msg);
	return rc;
}

int r2cc_ctl_register_ranks(const struct r2cc_ctl_job *job, struct r2cc_ctl_member *self,
			    const int *ranks, int nlocal, int nranks, int timeout_ms,
			    struct r2cc_ctl_dir **dirs_p)
{
	return register_impl(job, self, 0, ranks, nlocal, nranks, timeout_ms, dirs_p);
}

int r2cc_ctl_register_each(const struct r2cc_ctl_job *job, struct r2cc_ctl_member *members,
			   const int *ranks, int nlocal, int nranks, int timeout_ms,
			   struct r2cc_ctl_dir **dirs_p)
{
	return register_impl(job, members, sizeof(*members), ranks, nlocal, nranks, timeout_ms,
			     dirs_p);
}

int r2cc_ctl_register(const struct r2cc_ctl_job *job, struct r2cc_ctl_member *self, int rank,
		      int nranks, int timeout_ms, struct r2cc_ctl_dir **dir_p)
{
	return r2cc_ctl_register_ranks(job, self, &rank, 1, nranks, timeout_ms, dir_p);
}
