/*
 * The control thread's connections (ctl.c has the overview): what the
 * strangers of one source address hold, opening, watching, killing and reaping
 * connections, and sending: frames sealed per connection and written as the
 * socket takes them, the out queue that other threads fill and the thread
 * routes onto connections.
 */
#include "ctl/ctl_thread.h"
#include "ctl/ctl_priv.h"
#include "shim/fault.h"
#include "shim/log.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

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
	return &r2cc_ctl.src[h % CTL_SRC_BUCKETS];
}

/* The entry of peer's address, made when missing; NULL when out of memory. */
struct src_ent *r2cc_ctl_src_get(const struct sockaddr_storage *peer)
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
void r2cc_ctl_src_put(struct src_ent *e)
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
void r2cc_ctl_conn_src_release(struct conn *c)
{
	struct src_ent *e = c->src;
	if (!e)
		return;
	e->bytes -= c->src_charged;
	e->conns--;
	r2cc_ctl.preauth_conns--;
	c->src = NULL;
	c->src_charged = 0;
	r2cc_ctl_src_put(e);
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
	if (epoll_ctl(r2cc_ctl.ep_fd, EPOLL_CTL_MOD, c->fd, &e) == 0)
		c->ev = want;
}

/* 0, or -ENOMEM / -EMFILE: then the caller frees c. */
int r2cc_ctl_conn_add(struct conn *c)
{
	int rc = 0;
	struct epoll_event e = {.events = c->connecting ? EPOLLOUT : EPOLLIN, .data.ptr = c};
	if (r2cc_hmap_put(&r2cc_ctl.conn_by_uid, c->uid, c))
		return -ENOMEM;
	if (c->outgoing && r2cc_hmap_put(&r2cc_ctl.conn_by_dst, dst_key(&c->peer, c->lane), c)) {
		r2cc_hmap_del(&r2cc_ctl.conn_by_uid, c->uid);
		return -ENOMEM;
	}
	pthread_mutex_lock(&r2cc_ctl.lock);
	if (r2cc_ctl.nconns == r2cc_ctl.conncap) {
		int cap = r2cc_ctl.conncap ? 2 * r2cc_ctl.conncap : 64;
		struct conn **g =
		    cap <= CTL_MAX_CONNS ? realloc(r2cc_ctl.conns, sizeof(*g) * (size_t)cap) : NULL;
		if (g) {
			r2cc_ctl.conns = g;
			r2cc_ctl.conncap = cap;
		} else {
			rc = -EMFILE;
		}
	}
	if (rc == 0 && epoll_ctl(r2cc_ctl.ep_fd, EPOLL_CTL_ADD, c->fd, &e) != 0)
		rc = -errno;
	if (rc == 0) {
		c->ev = e.events;
		c->idx = r2cc_ctl.nconns;
		r2cc_ctl.conns[r2cc_ctl.nconns++] = c;
	}
	pthread_mutex_unlock(&r2cc_ctl.lock);
	if (rc) {
		r2cc_hmap_del(&r2cc_ctl.conn_by_uid, c->uid);
		if (c->outgoing &&
		    r2cc_hmap_get(&r2cc_ctl.conn_by_dst, dst_key(&c->peer, c->lane)) == c)
			r2cc_hmap_del(&r2cc_ctl.conn_by_dst, dst_key(&c->peer, c->lane));
	}
	r2cc_ctl.timers = true;
	return rc;
}

struct conn *r2cc_ctl_conn_new(int fd, bool outgoing)
{
	struct conn *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	if (r2cc_ctl_random(&c->tx_sender, sizeof(c->tx_sender))) {
		free(c);
		return NULL;
	}
	c->fd = fd;
	c->uid = ++r2cc_ctl.next_conn_uid;
	c->lane = -1;
	c->outgoing = outgoing;
	c->txtail = &c->txq;
	c->opened_ms = c->rx_progress_ms = c->tx_progress_ms = r2cc_ctl_now_ms();
	r2cc_ctl_rx_init(&c->rx, R2CC_CTL_MAX_PAYLOAD);
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return c;
}

int r2cc_ctl_ndead; /* connections killed, not reaped yet */

void r2cc_ctl_conn_kill(struct conn *c, int status)
{
	if (!c->dead) {
		c->dead = true;
		c->dead_status = status;
		r2cc_ctl_ndead++;
		/* Found by nobody from now on; reaped at the top of the loop. */
		r2cc_hmap_del(&r2cc_ctl.conn_by_uid, c->uid);
		if (c->outgoing &&
		    r2cc_hmap_get(&r2cc_ctl.conn_by_dst, dst_key(&c->peer, c->lane)) == c)
			r2cc_hmap_del(&r2cc_ctl.conn_by_dst, dst_key(&c->peer, c->lane));
	}
}

void r2cc_ctl_conn_rx_uncharge(struct conn *c)
{
	r2cc_ctl.rx_charged -= c->rx_charged;
	c->rx_charged = 0;
	if (c->src)
		c->src->bytes -= c->src_charged;
	c->src_charged = 0;
}

void r2cc_ctl_conn_free(struct conn *c)
{
	r2cc_ctl_conn_rx_uncharge(c);
	r2cc_ctl_conn_src_release(c);
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

/* Remove dead connections, failing what waited on them. Connections die only
 * by r2cc_ctl_conn_kill(), which the reaper follows within one pass. */
void r2cc_ctl_conns_reap(void)
{
	for (int i = 0; i < r2cc_ctl.nconns && r2cc_ctl_ndead > 0;) {
		struct conn *c = r2cc_ctl.conns[i];
		if (!c->dead) {
			i++;
			continue;
		}
		r2cc_ctl_ndead--;
		pthread_mutex_lock(&r2cc_ctl.lock);
		r2cc_ctl.conns[i] = r2cc_ctl.conns[--r2cc_ctl.nconns];
		r2cc_ctl.conns[i]->idx = i;
		pthread_mutex_unlock(&r2cc_ctl.lock);
		r2cc_ctl_pending_fail_conn(c->uid, c->dead_status);
		r2cc_ctl_rdv_forget_conn(c);
		r2cc_ctl_conn_free(c);
	}
}

struct conn *r2cc_ctl_conn_by_uid(uint64_t uid)
{
	struct conn *c = r2cc_hmap_get(&r2cc_ctl.conn_by_uid, uid);
	return c && !c->dead ? c : NULL;
}

static struct conn *conn_outgoing(const struct sockaddr_storage *dst, int32_t lane, int *err)
{
	struct conn *hit = r2cc_hmap_get(&r2cc_ctl.conn_by_dst, dst_key(dst, lane));
	if (hit && !hit->dead && hit->lane == lane && r2cc_ctl_addr_equal(&hit->peer, dst))
		return hit;
	/* Another destination behind the same hash (never seen in practice): the
	 * connection list is the truth. */
	for (int i = 0; hit && i < r2cc_ctl.nconns; i++) {
		struct conn *o = r2cc_ctl.conns[i];
		if (o->outgoing && !o->dead && o->lane == lane &&
		    r2cc_ctl_addr_equal(&o->peer, dst))
			return o;
	}
	if (r2cc_ctl.nconns >= CTL_MAX_CONNS) {
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
	struct conn *c = r2cc_ctl_conn_new(fd, true);
	if (!c) {
		close(fd);
		*err = -ENOMEM;
		return NULL;
	}
	c->connecting = connecting;
	c->peer = *dst;
	c->lane = lane;
	int rc = r2cc_ctl_conn_add(c);
	if (rc) {
		*err = rc;
		r2cc_ctl_conn_free(c);
		return NULL;
	}
	STAT_INC(conns_opened);
	return c;
}

/* Writes what the socket takes; epoll then watches for room only while
 * something is left. */
void r2cc_ctl_conn_flush(struct conn *c)
{
	while (c->txq && !c->connecting && !c->dead) {
		struct txbuf *t = c->txq;
		ssize_t n = send(c->fd, t->data + t->off, t->len - t->off, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
				r2cc_ctl_conn_kill(c, -ECONNRESET);
			break;
		}
		c->tx_progress_ms = r2cc_ctl_now_ms();
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
		r2cc_ctl.timers = true;
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
		c->tx_progress_ms = r2cc_ctl_now_ms();
	*c->txtail = t;
	c->txtail = &t->next;
	c->tx_bytes += size;
	r2cc_ctl_conn_flush(c);
	return 0;
}

int r2cc_ctl_send_reply(struct conn *c, const unsigned char *key, uint64_t job_id, uint32_t req_id,
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
void r2cc_ctl_route_out(void)
{
	pthread_mutex_lock(&r2cc_ctl.lock);
	struct out_item *list = r2cc_ctl.outq;
	r2cc_ctl.outq = NULL;
	r2cc_ctl.outtail = &r2cc_ctl.outq;
	r2cc_ctl.out_items = 0;
	r2cc_ctl.out_bytes = 0;
	pthread_mutex_unlock(&r2cc_ctl.lock);
	while (list) {
		struct out_item *it = list;
		list = it->next;
		int rc = 0;
		struct conn *c = conn_outgoing(&it->dst, it->lane, &rc);
		if (c)
			rc = conn_send(c, it->key, &it->hdr, it->payload, it->hdr.len);
		if (it->hdr.flags & R2CC_CTL_F_REQUEST) {
			pthread_mutex_lock(&r2cc_ctl.lock);
			struct pending *p =
			    r2cc_ctl_pending_find_locked(it->hdr.req_id, it->hdr.job_id);
			if (p && rc)
				r2cc_ctl_pending_complete_locked(p, rc);
			else if (p)
				p->conn_uid = c->uid;
			pthread_mutex_unlock(&r2cc_ctl.lock);
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
	*r2cc_ctl.outtail = it;
	r2cc_ctl.outtail = &it->next;
	r2cc_ctl.out_items++;
	r2cc_ctl.out_bytes += it->hdr.len;
}

/* Queue a frame for dst (any thread). */
int r2cc_ctl_queue_out(const struct sockaddr_storage *dst, const unsigned char *key,
		       const struct r2cc_ctl_hdr *h, const void *payload, size_t len)
{
	if (len > R2CC_CTL_MAX_PAYLOAD)
		return -EMSGSIZE;
	struct out_item *it = malloc(sizeof(*it) + len);
	if (!it)
		return -ENOMEM;
	it->next = NULL;
	it->dst = *dst;
	it->lane = __atomic_load_n(&r2cc_ctl.conn_per_rank, __ATOMIC_RELAXED) ? h->from_rank : -1;
	memcpy(it->key, key, R2CC_CTL_SECRET_SIZE);
	it->hdr = *h;
	it->hdr.len = (uint32_t)len;
	if (len)
		memcpy(it->payload, payload, len);
	int rc = 0;
	pthread_mutex_lock(&r2cc_ctl.lock);
	if (r2cc_ctl.stop || !r2cc_ctl.started)
		rc = -ESHUTDOWN;
	else if (r2cc_ctl.out_items >= CTL_OUTQ_MAX_ITEMS ||
		 r2cc_ctl.out_bytes + len > CTL_OUTQ_MAX_BYTES || r2cc_fault_fire(R2CC_FAULT_SEND))
		rc = -ENOBUFS;
	if (rc == 0) {
		outq_append_locked(it);
		r2cc_ctl_wake_thread_locked();
	}
	pthread_mutex_unlock(&r2cc_ctl.lock);
	if (rc) {
		free(it);
		if (rc == -ENOBUFS)
			STAT_INC(send_failed);
	}
	return rc;
}
