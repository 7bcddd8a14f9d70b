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
 * briefly in a bounded park (see park()).
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
#include "repair/ctl.h"
#include "repair/ctl_msg.h"
#include "repair/ctl_priv.h"
#include "shim/fault.h"
#include "shim/log.h"
#include "shim/params.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

/* Internal message types. */
enum {
	CTL_T_REGISTER = 1, /* request: u32 rank, u32 nranks, member; reply: directory */
	CTL_T_CANCEL = 2,   /* u32 rank, u32 request id of a REGISTER given up on */
};

#define CTL_MAX_CONNS	    8192
#define CTL_OUTQ_MAX_ITEMS  4096
#define CTL_OUTQ_MAX_BYTES  (64u << 20)
#define CTL_CONN_TX_MAX	    (16u << 20)
#define CTL_RX_BUDGET	    (256u << 20) /* all half-received frames together */
#define CTL_CONNECT_MS	    10000
#define CTL_TX_STALL_MS	    30000
#define CTL_POLL_MS	    100
#define CTL_IDLE_POLL_MS    1000
#define CTL_REPLAY_SENDERS  8192
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
	uint64_t uid; /* never reused; names the conn in pendings and rounds */
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
	struct pending *next;
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

struct job_ent {
	struct job_ent *next;
	struct r2cc_ctl_job job;
	bool serve; /* stamped here: this process runs its rendezvous */
	int *ranks; /* the ranks this process holds in the job */
	int nlocal;
	int cap_local;
	struct rdv_round *round; /* control thread only */
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
	struct sockaddr_storage local;
	struct out_item *outq;
	struct out_item **outtail;
	size_t out_items;
	size_t out_bytes;
	struct pending *pending;
	struct job_ent *jobs;
	struct handler handlers[R2CC_CTL_TYPE_MAX];
	uint32_t next_req;
	struct conn **conns;
	int nconns;
	/* control thread only */
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
		else
			j->serve |= serve;
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
	for (struct pending *p = ctl.pending; p; p = p->next)
		if (p->req_id == req_id && p->job_id == job_id)
			return p;
	return NULL;
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

static void conn_add(struct conn *c)
{
	pthread_mutex_lock(&ctl.lock);
	ctl.conns[ctl.nconns++] = c;
	pthread_mutex_unlock(&ctl.lock);
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
	c->outgoing = outgoing;
	c->txtail = &c->txq;
	c->opened_ms = c->rx_progress_ms = c->tx_progress_ms = now_ms();
	r2cc_ctl_rx_init(&c->rx, R2CC_CTL_MAX_PAYLOAD);
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return c;
}

static void conn_kill(struct conn *c, int status)
{
	if (!c->dead) {
		c->dead = true;
		c->dead_status = status;
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

static void rdv_forget_conn(uint64_t conn_uid);

/* Remove dead connections, failing what waited on them. */
static void conns_reap(void)
{
	for (int i = 0; i < ctl.nconns;) {
		struct conn *c = ctl.conns[i];
		if (!c->dead) {
			i++;
			continue;
		}
		pthread_mutex_lock(&ctl.lock);
		ctl.conns[i] = ctl.conns[--ctl.nconns];
		pthread_mutex_unlock(&ctl.lock);
		pending_fail_conn(c->uid, c->dead_status);
		rdv_forget_conn(c->uid);
		conn_free(c);
	}
}

static struct conn *conn_by_uid(uint64_t uid)
{
	for (int i = 0; i < ctl.nconns; i++)
		if (ctl.conns[i]->uid == uid && !ctl.conns[i]->dead)
			return ctl.conns[i];
	return NULL;
}

static struct conn *conn_outgoing(const struct sockaddr_storage *dst, int *err)
{
	for (int i = 0; i < ctl.nconns; i++) {
		struct conn *c = ctl.conns[i];
		if (c->outgoing && !c->dead && r2cc_ctl_addr_equal(&c->peer, dst))
			return c;
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
	conn_add(c);
	STAT_INC(conns_opened);
	return c;
}

static void conn_flush(struct conn *c)
{
	while (c->txq && !c->connecting && !c->dead) {
		struct txbuf *t = c->txq;
		ssize_t n = send(c->fd, t->data + t->off, t->len - t->off, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
				conn_kill(c, -ECONNRESET);
			return;
		}
		c->tx_progress_ms = now_ms();
		t->off += (size_t)n;
		if (t->off < t->len)
			return;
		c->txq = t->next;
		if (!c->txq)
			c->txtail = &c->txq;
		c->tx_bytes -= t->len;
		free(t);
		STAT_INC(sent);
	}
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
		struct conn *c = conn_outgoing(&it->dst, &rc);
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

static void rdv_forget_conn(uint64_t conn_uid)
{
	pthread_mutex_lock(&ctl.lock);
	for (struct job_ent *j = ctl.jobs; j; j = j->next) {
		struct rdv_round *r = j->round;
		for (int i = 0; r && i < r->nranks; i++) {
			if (r->slots[i].present && r->slots[i].conn_uid == conn_uid) {
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

static void rdv_complete(struct job_ent *j)
{
	struct rdv_round *r = j->round;
	size_t len = 4;
	for (int i = 0; i < r->nranks; i++)
		len += 4 + r->slots[i].mlen;
	unsigned char *blob = len <= R2CC_CTL_MAX_PAYLOAD ? malloc(len) : NULL;
	int status = 0;
	if (!blob) {
		status = len <= R2CC_CTL_MAX_PAYLOAD ? -ENOMEM : -EMSGSIZE;
		R2CC_WARN("control plane: cannot build the directory of job %016llx (%d ranks, "
			  "%zu bytes): %s",
			  (unsigned long long)j->job.id, r->nranks, len, strerror(-status));
	} else {
		size_t o = 4;
		put_u32(blob, (uint32_t)r->nranks);
		for (int i = 0; i < r->nranks; i++) {
			put_u32(blob + o, (uint32_t)r->slots[i].mlen);
			memcpy(blob + o + 4, r->slots[i].member, r->slots[i].mlen);
			o += 4 + r->slots[i].mlen;
		}
	}
	for (int i = 0; i < r->nranks; i++) {
		struct conn *c = conn_by_uid(r->slots[i].conn_uid);
		if (c)
			send_reply(c, j->job.secret, j->job.id, r->slots[i].req_id, -1, i, status,
				   blob, len);
	}
	R2CC_INFO("control plane: job %016llx: all %d ranks registered",
		  (unsigned long long)j->job.id, r->nranks);
	free(blob);
	round_free(r);
	j->round = NULL;
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
	if (!j->serve) {
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
		free(s->member);
		r->count--;
	}
	pthread_mutex_lock(&ctl.lock);
	*s = (struct rdv_slot){true, c->uid, h->req_id, copy, h->len - 8};
	r->count++;
	pthread_mutex_unlock(&ctl.lock);
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
	return true;
}

/* Whether h is for this process: a rank it holds in j, or the rendezvous
 * (rank -1: registration and its cancel only). */
static bool addressed_here_locked(const struct job_ent *j, const struct r2cc_ctl_hdr *h)
{
	if (h->to_rank == -1)
		return !(h->flags & R2CC_CTL_F_REPLY) &&
		       (h->type == CTL_T_REGISTER || h->type == CTL_T_CANCEL);
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
		if (!e || e->conns >= CTL_PREAUTH_CONNS_PER_SRC ||
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
		conn_add(c);
		STAT_INC(conns_accepted);
	}
}

static void conn_events(struct conn *c, short rev)
{
	if (c->connecting && (rev & (POLLOUT | POLLERR | POLLHUP))) {
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
	if (!c->connecting && (rev & (POLLIN | POLLERR | POLLHUP)))
		conn_read(c);
	if (!c->connecting && (rev & POLLOUT))
		conn_flush(c);
}

static void conns_sweep(void)
{
	int64_t now = now_ms();
	int stall = __atomic_load_n(&rx_stall_ms, __ATOMIC_RELAXED);
	int auth = __atomic_load_n(&auth_ms, __ATOMIC_RELAXED);
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
	}
}

static void *ctl_main(void *arg)
{
	struct pollfd *pfd = malloc(sizeof(*pfd) * (CTL_MAX_CONNS + 3));
	if (!pfd) {
		R2CC_WARN("control plane: out of memory; the control thread stops");
		return NULL;
	}
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
		int n = 0;
		/* A negative fd makes poll() skip the listeners while paused. */
		bool paused = now_ms() < accept_pause_until;
		pfd[n++] = (struct pollfd){ctl.wake_fd, POLLIN, 0};
		pfd[n++] = (struct pollfd){paused ? -1 : ctl.listen_fd, POLLIN, 0};
		if (oob >= 0)
			pfd[n++] = (struct pollfd){paused ? -1 : oob, POLLIN, 0};
		int base = n, polled = ctl.nconns;
		/* Timers only matter while something can time out; an idle
		 * process wakes once a second, not ten times. */
		bool timers = paused || ctl.nparked > 0;
		for (int i = 0; i < polled; i++) {
			struct conn *c = ctl.conns[i];
			short ev = POLLIN;
			timers |= c->connecting || c->txq || r2cc_ctl_rx_partial(&c->rx) ||
				  (!c->outgoing && !c->authed);
			if (c->connecting || c->txq)
				ev |= POLLOUT;
			if (c->connecting)
				ev = POLLOUT;
			pfd[n++] = (struct pollfd){c->fd, ev, 0};
		}
		if (poll(pfd, (nfds_t)n, timers ? CTL_POLL_MS : CTL_IDLE_POLL_MS) < 0 &&
		    errno != EINTR)
			R2CC_WARN_ONCE("control plane: poll: %s", strerror(errno));
		if (pfd[0].revents & POLLIN) {
			uint64_t v;
			if (read(ctl.wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
				R2CC_WARN_ONCE("control plane: wake read: %s", strerror(errno));
		}
		for (int i = 0; i < polled; i++)
			if (pfd[base + i].revents)
				conn_events(ctl.conns[i], pfd[base + i].revents);
		park_retry(false);
		if (pfd[1].revents & POLLIN)
			accept_all(ctl.listen_fd);
		if (oob >= 0 && (pfd[2].revents & POLLIN))
			accept_all(oob);
		conns_sweep();
	}
	free(pfd);
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
		if (ctl.oob_fd >= 0)
			close(ctl.oob_fd);
		while (ctl.jobs) {
			struct job_ent *j = ctl.jobs;
			ctl.jobs = j->next;
			free(j->ranks);
			free(j);
		}
		/* Waiters, queued frames, connections and their sources were the
		 * parent's threads'. */
		memset(ctl.src, 0, sizeof(ctl.src));
		ctl.preauth_conns = 0;
		ctl.conns = NULL;
		ctl.nconns = 0;
		ctl.pending = NULL;
		ctl.outq = NULL;
		ctl.outtail = &ctl.outq;
		ctl.out_items = ctl.out_bytes = 0;
		ctl.replay = NULL;
		ctl.rx_charged = 0;
		ctl.park = NULL;
		ctl.nparked = 0;
		ctl.parked_bytes = 0;
		ctl.listen_fd = ctl.wake_fd = ctl.oob_fd = -1;
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
	    listen(fd, 512) != 0)
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
	struct conn **conns = calloc(CTL_MAX_CONNS, sizeof(*conns));
	struct r2cc_ctl_replay *replay = r2cc_ctl_replay_new(CTL_REPLAY_SENDERS);
	if (wfd < 0 || !conns || !replay) {
		rc = wfd < 0 ? -errno : -ENOMEM;
		goto err_free;
	}
	pthread_mutex_lock(&ctl.lock);
	ctl.listen_fd = lfd;
	ctl.wake_fd = wfd;
	ctl.conns = conns;
	ctl.nconns = 0;
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
	ctl.listen_fd = ctl.wake_fd = -1;
	ctl.conns = NULL;
	ctl.replay = NULL;
	pthread_mutex_unlock(&ctl.lock);
	r2cc_ctl_replay_free(replay);
	free(conns);
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
		if (ctl.oob_fd >= 0)
			close(ctl.oob_fd);
		ctl.listen_fd = ctl.wake_fd = ctl.oob_fd = -1;
		while (ctl.jobs) {
			struct job_ent *j = ctl.jobs;
			ctl.jobs = j->next;
			job_free(j);
		}
		free(ctl.conns);
		ctl.conns = NULL;
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
	p->next = ctl.pending;
	ctl.pending = p;
	pthread_mutex_unlock(&ctl.lock);
	h->flags = R2CC_CTL_F_REQUEST;
	h->req_id = p->req_id;
	h->job_id = job->id;
	int rc = queue_out(dst, job->secret, h, payload, len);
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
	for (struct pending **pp = &ctl.pending; *pp; pp = &(*pp)->next) {
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	}
	pthread_mutex_unlock(&ctl.lock);
	return rc;
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
	deadline_after(&deadline, timeout_ms);
	request_begin(&p, &dir->members[rank].ctl_addr, &dir->job, &h, payload, len);
	rc = request_wait(&p, &deadline);
	if (rc == 0 || rc == -EMSGSIZE)
		*reply_len = p.len;
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
	return queue_out(&dir->members[rank].ctl_addr, dir->job.secret, &h, payload, len);
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

int r2cc_ctl_register_ranks(const struct r2cc_ctl_job *job, struct r2cc_ctl_member *self,
			    const int *ranks, int nlocal, int nranks, int timeout_ms,
			    struct r2cc_ctl_dir **dirs_p)
{
	if (!job || !self || !ranks || !dirs_p || nlocal < 1 || nranks < 1 ||
	    nranks > R2CC_CTL_MAX_RANKS || nlocal > nranks || timeout_ms < 0)
		return -EINVAL;
	for (int i = 0; i < nlocal; i++) {
		if (ranks[i] < 0 || ranks[i] >= nranks)
			return -EINVAL;
		for (int k = 0; k < i; k++)
			if (ranks[k] == ranks[i])
				return -EINVAL;
	}
	if (on_ctl_thread())
		return -EDEADLK;
	int rc = ctl_start();
	if (rc == 0)
		rc = job_ensure(job, false, ranks, nlocal);
	if (rc)
		return rc;
	r2cc_ctl_local_addr(&self->ctl_addr);
	unsigned char *msg = malloc(8 + R2CC_CTL_MEMBER_MAX_ENC);
	struct pending *p = calloc((size_t)nlocal, sizeof(*p));
	if (!msg || !p) {
		rc = -ENOMEM;
		goto out_free;
	}
	int mlen = r2cc_ctl_member_encode(self, msg + 8, R2CC_CTL_MEMBER_MAX_ENC);
	if (mlen < 0) {
		rc = mlen;
		goto out_free;
	}
	put_u32(msg + 4, (uint32_t)nranks);
	struct timespec deadline;
	deadline_after(&deadline, timeout_ms);
	for (int i = 0; i < nlocal; i++) {
		put_u32(msg, (uint32_t)ranks[i]);
		p[i].peer_rank = -1;
		p[i].grow = true;
		struct r2cc_ctl_hdr h = {
		    .type = CTL_T_REGISTER, .from_rank = ranks[i], .to_rank = -1};
		request_begin(&p[i], &job->rdv, job, &h, msg, 8 + (size_t)mlen);
	}
	rc = 0;
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

int r2cc_ctl_register(const struct r2cc_ctl_job *job, struct r2cc_ctl_member *self, int rank,
		      int nranks, int timeout_ms, struct r2cc_ctl_dir **dir_p)
{
	return r2cc_ctl_register_ranks(job, self, &rank, 1, nranks, timeout_ms, dir_p);
}
