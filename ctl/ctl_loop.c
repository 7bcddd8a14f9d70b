/*
 * The control thread's loop (ctl.c has the overview): it routes what other
 * threads queued, reads connections, checks each frame and dispatches the
 * authenticated ones (replies to their waiters, the rendezvous' messages,
 * the handlers), parks frames of jobs not known yet, accepts connections and
 * sweeps what has waited too long.
 */
#include "ctl/ctl_thread.h"
#include "ctl/ctl_priv.h"
#include "shim/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

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

/* Dispatch of one authenticated frame. */

static void take_reply(struct conn *c, const struct r2cc_ctl_hdr *h, const unsigned char *p)
{
	pthread_mutex_lock(&r2cc_ctl.lock);
	struct pending *pd = r2cc_ctl_pending_find_locked(h->req_id, h->job_id);
	if (!pd || pd->done) {
		/* Its waiter gave up already. */
		pthread_mutex_unlock(&r2cc_ctl.lock);
		return;
	}
	if (pd->peer_rank != h->from_rank || pd->conn_uid != c->uid) {
		pthread_mutex_unlock(&r2cc_ctl.lock);
		r2cc_ctl_count_drop(R2CC_CTL_DROP_MALFORMED, c);
		return;
	}
	if (h->flags & R2CC_CTL_F_ERROR) {
		uint32_t e = h->len == 4 ? r2cc_ctl_get_u32(p) : 0;
		r2cc_ctl_pending_complete_locked(pd, e > 0 && e < 4096 ? -(int)e : -EPROTO);
	} else if (pd->grow) {
		pd->buf = malloc(h->len ? h->len : 1);
		if (pd->buf) {
			memcpy(pd->buf, p, h->len);
			pd->len = h->len;
		}
		r2cc_ctl_pending_complete_locked(pd, pd->buf ? 0 : -ENOMEM);
	} else {
		pd->len = h->len;
		if (h->len > pd->cap) {
			r2cc_ctl_pending_complete_locked(pd, -EMSGSIZE);
		} else {
			if (h->len)
				memcpy(pd->buf, p, h->len);
			r2cc_ctl_pending_complete_locked(pd, 0);
		}
	}
	pthread_mutex_unlock(&r2cc_ctl.lock);
}

static void run_handler(struct conn *c, const unsigned char *key, const struct r2cc_ctl_hdr *h,
			const unsigned char *p)
{
	struct handler hd = {0};
	pthread_mutex_lock(&r2cc_ctl.lock);
	if (h->type >= R2CC_CTL_TYPE_USER && h->type < R2CC_CTL_TYPE_MAX)
		hd = r2cc_ctl.handlers[h->type];
	pthread_mutex_unlock(&r2cc_ctl.lock);
	bool is_req = h->flags & R2CC_CTL_F_REQUEST;
	if (!hd.fn) {
		r2cc_ctl_count_drop(R2CC_CTL_DROP_UNKNOWN_TYPE, c);
		if (is_req)
			r2cc_ctl_send_reply(c, key, h->job_id, h->req_id, h->to_rank, h->from_rank,
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
		r2cc_ctl_send_reply(c, key, h->job_id, h->req_id, h->to_rank, h->from_rank,
				    -ENODATA, NULL, 0);
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
	if (r2cc_ctl.nparked >= CTL_PARK_MAX_FRAMES ||
	    r2cc_ctl.parked_bytes + size > CTL_PARK_MAX_BYTES)
		return false;
	struct parked *k = malloc(sizeof(*k));
	if (!k)
		return false;
	*k = (struct parked){NULL, *h, frame, size, c->uid, r2cc_ctl_now_ms()};
	*r2cc_ctl.park_tail = k;
	r2cc_ctl.park_tail = &k->next;
	r2cc_ctl.nparked++;
	r2cc_ctl.parked_bytes += size;
	c->parked++;
	r2cc_ctl.timers = true;
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
	pthread_mutex_lock(&r2cc_ctl.lock);
	struct job_ent *j = r2cc_ctl_job_find_locked(h->job_id);
	if (j)
		memcpy(key, j->job.secret, sizeof(key));
	pthread_mutex_unlock(&r2cc_ctl.lock);
	if ((!j || c->parked) && may_park && park(c, h, frame))
		return FRAME_PARKED;
	if (!j) {
		/* The framing is intact: the connection may carry other jobs. */
		r2cc_ctl_count_drop(R2CC_CTL_DROP_UNKNOWN_JOB, c);
		return FRAME_DONE;
	}
	int64_t now_ns = r2cc_ctl_now_ns();
	int drop = r2cc_ctl_frame_verify(key, h, frame, now_ns);
	if (drop == R2CC_CTL_DROP_NONE) {
		/* The addressee is under the tag: a frame replayed to another
		 * process of the job names a rank that process does not hold. */
		pthread_mutex_lock(&r2cc_ctl.lock);
		if (!addressed_here_locked(j, h))
			drop = R2CC_CTL_DROP_MISADDRESSED;
		pthread_mutex_unlock(&r2cc_ctl.lock);
	}
	if (drop == R2CC_CTL_DROP_NONE)
		drop = r2cc_ctl_replay_check(r2cc_ctl.replay, h->job_id, h->sender, h->seq);
	if (drop != R2CC_CTL_DROP_NONE) {
		if (drop == R2CC_CTL_DROP_STALE)
			r2cc_ctl_count_stale(c, h, now_ns);
		else
			r2cc_ctl_count_drop(drop, c);
		/* An unauthenticated peer gets no second try on this stream. */
		return drop == R2CC_CTL_DROP_BAD_TAG ? FRAME_CLOSE : FRAME_DONE;
	}
	STAT_INC(received);
	c->authed = true;
	r2cc_ctl_conn_src_release(c);
	if (h->flags & R2CC_CTL_F_REPLY)
		take_reply(c, h, p);
	else if (h->type == CTL_T_REGISTER)
		r2cc_ctl_rdv_register(c, j, h, p);
	else if (h->type == CTL_T_CANCEL)
		r2cc_ctl_rdv_cancel(c, j, h, p);
	else if (h->type == CTL_T_LOOKUP || h->type == CTL_T_NICS)
		r2cc_ctl_rdv_serve(c, j, h, p);
	else if (h->type == CTL_T_LEAVE)
		r2cc_ctl_rdv_leave(c, j, h, p);
	else
		run_handler(c, key, h, p);
	return FRAME_DONE;
}

static bool job_known(uint64_t id)
{
	pthread_mutex_lock(&r2cc_ctl.lock);
	bool known = r2cc_ctl_job_find_locked(id) != NULL;
	pthread_mutex_unlock(&r2cc_ctl.lock);
	return known;
}

/* Retry parked frames in arrival order; drop the expired and the orphaned. A
 * connection's frames leave in the order they came: once one of them stays, so do
 * the later ones for this pass (a job registered while the pass runs would
 * otherwise let a later frame overtake, and the earlier ones be called replays). */
static void park_retry(bool flush)
{
	static uint64_t pass;
	int64_t now = r2cc_ctl_now_ms();
	int limit = __atomic_load_n(&park_ms, __ATOMIC_RELAXED);
	pass++;
	for (struct parked **pp = &r2cc_ctl.park; *pp;) {
		struct parked *k = *pp;
		struct conn *c = r2cc_ctl_conn_by_uid(k->conn_uid);
		bool known = job_known(k->hdr.job_id);
		if (!flush && c && c->park_held == pass) {
			pp = &k->next;
			continue;
		}
		if (!flush && c && !known && now - k->since_ms < limit) {
			c->park_held = pass;
			pp = &k->next;
			continue;
		}
		*pp = k->next;
		if (!*pp)
			r2cc_ctl.park_tail = pp;
		r2cc_ctl.nparked--;
		r2cc_ctl.parked_bytes -= k->size;
		if (c)
			c->parked--;
		if (c && known && !flush) {
			if (process_frame(c, &k->hdr, k->frame, false) == FRAME_CLOSE)
				r2cc_ctl_conn_kill(c, -ECONNRESET);
		} else if (!known) {
			r2cc_ctl_count_drop(R2CC_CTL_DROP_UNKNOWN_JOB, c);
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
				r2cc_ctl_count_drop(R2CC_CTL_DROP_TRUNCATED, c);
			r2cc_ctl_conn_kill(c, -ECONNRESET);
			return;
		}
		c->rx_progress_ms = r2cc_ctl_now_ms();
		bool had_frame = c->rx.frame != NULL;
		int drop;
		int rc = r2cc_ctl_rx_advance(&c->rx, (size_t)n, &drop);
		if (rc == 0)
			r2cc_ctl.timers = true; /* half a frame may stall */
		if (rc < 0) {
			r2cc_ctl_count_drop(drop, c);
			r2cc_ctl_conn_kill(c, -ECONNRESET);
			return;
		}
		if (!had_frame && c->rx.frame) {
			c->rx_charged = r2cc_ctl_frame_size(c->rx.hdr.len);
			r2cc_ctl.rx_charged += c->rx_charged;
			if (r2cc_ctl.rx_charged > CTL_RX_BUDGET ||
			    (c->src && c->src->bytes + c->rx_charged > CTL_PREAUTH_BYTES_PER_SRC)) {
				r2cc_ctl_count_drop(R2CC_CTL_DROP_BAD_LENGTH, c);
				r2cc_ctl_conn_kill(c, -ENOBUFS);
				return;
			}
			if (c->src) {
				c->src->bytes += c->rx_charged;
				c->src_charged = c->rx_charged;
			}
		}
		if (rc == 1) {
			int what = process_frame(c, &c->rx.hdr, c->rx.frame, true);
			r2cc_ctl_conn_rx_uncharge(c);
			if (what == FRAME_PARKED)
				c->rx.frame = NULL; /* the park owns it now */
			r2cc_ctl_rx_reset(&c->rx);
			if (what == FRAME_CLOSE)
				r2cc_ctl_conn_kill(c, -ECONNRESET);
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
				accept_pause_until = r2cc_ctl_now_ms() + CTL_POLL_MS;
			}
			return;
		}
		struct src_ent *e =
		    r2cc_ctl.nconns < CTL_MAX_CONNS ? r2cc_ctl_src_get(&peer) : NULL;
		if (!e || e->conns >= __atomic_load_n(&preauth_per_src, __ATOMIC_RELAXED) ||
		    r2cc_ctl.preauth_conns >= CTL_PREAUTH_CONNS) {
			if (e) {
				char a[64];
				R2CC_WARN_ONCE("control plane: refusing connections from %s: %d "
					       "of its connections have not authenticated yet",
					       r2cc_ctl_addr_str(&peer, a, sizeof(a)), e->conns);
				r2cc_ctl_src_put(e);
			}
			STAT_INC(conns_refused);
			close(fd);
			continue;
		}
		struct conn *c = r2cc_ctl_conn_new(fd, false);
		if (!c) {
			r2cc_ctl_src_put(e);
			close(fd);
			return;
		}
		c->peer = peer;
		c->src = e;
		e->conns++;
		r2cc_ctl.preauth_conns++;
		if (r2cc_ctl_conn_add(c)) {
			STAT_INC(conns_refused);
			r2cc_ctl_conn_free(c);
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
			r2cc_ctl_conn_kill(c, -err);
			return;
		}
		c->connecting = false;
		c->tx_progress_ms = r2cc_ctl_now_ms();
	}
	if (!c->connecting && (rev & (EPOLLIN | EPOLLERR | EPOLLHUP)))
		conn_read(c);
	if (!c->connecting && !c->dead && (rev & EPOLLOUT))
		r2cc_ctl_conn_flush(c);
}

/* Every CTL_POLL_MS: what has waited too long. Also decides whether anything
 * can time out at all (then the loop wakes every CTL_POLL_MS, else once a
 * second). */
static void conns_sweep(void)
{
	int64_t now = r2cc_ctl_now_ms();
	int stall = __atomic_load_n(&rx_stall_ms, __ATOMIC_RELAXED);
	int auth = __atomic_load_n(&auth_ms, __ATOMIC_RELAXED);
	bool timers = r2cc_ctl.nparked > 0;
	r2cc_ctl.last_sweep_ms = now;
	for (int i = 0; i < r2cc_ctl.nconns; i++) {
		struct conn *c = r2cc_ctl.conns[i];
		if (c->dead)
			continue;
		if (c->connecting && now - c->opened_ms > CTL_CONNECT_MS) {
			r2cc_ctl_conn_kill(c, -ETIMEDOUT);
		} else if ((!c->outgoing && !c->authed && now - c->opened_ms > auth) ||
			   (r2cc_ctl_rx_partial(&c->rx) && now - c->rx_progress_ms > stall)) {
			/* A stranger that has not proven itself in time, however
			 * busily it trickles bytes, or half a frame: either holds a
			 * connection slot for no use. */
			r2cc_ctl_count_drop(R2CC_CTL_DROP_TIMEOUT, c);
			r2cc_ctl_conn_kill(c, -ETIMEDOUT);
		} else if (c->txq && now - c->tx_progress_ms > CTL_TX_STALL_MS) {
			r2cc_ctl_conn_kill(c, -ETIMEDOUT);
		}
		timers |= !c->dead && (c->connecting || c->txq || r2cc_ctl_rx_partial(&c->rx) ||
				       (!c->outgoing && !c->authed));
	}
	r2cc_ctl.timers = timers;
}

/* epoll's data for the descriptors that are not connections. */
static char ev_wake, ev_listen, ev_oob;

static void watch_fd(int fd, uint32_t events, void *tag)
{
	struct epoll_event e = {.events = events, .data.ptr = tag};
	if (epoll_ctl(r2cc_ctl.ep_fd, EPOLL_CTL_MOD, fd, &e) != 0 &&
	    epoll_ctl(r2cc_ctl.ep_fd, EPOLL_CTL_ADD, fd, &e) != 0)
		R2CC_WARN_ONCE("control plane: epoll: %s", strerror(errno));
}

void *r2cc_ctl_main(void *arg)
{
	struct epoll_event *ev = malloc(sizeof(*ev) * CTL_EVENTS);
	if (!ev) {
		R2CC_WARN("control plane: out of memory; the control thread stops");
		return NULL;
	}
	int oob_watched = -1;
	bool paused = false;
	watch_fd(r2cc_ctl.wake_fd, EPOLLIN, &ev_wake);
	watch_fd(r2cc_ctl.listen_fd, EPOLLIN, &ev_listen);
	for (;;) {
		pthread_mutex_lock(&r2cc_ctl.lock);
		bool stop = r2cc_ctl.stop;
		int oob = r2cc_ctl.oob_fd;
		pthread_mutex_unlock(&r2cc_ctl.lock);
		if (stop)
			break;
		r2cc_ctl_route_out();
		park_retry(false);
		r2cc_ctl_conns_reap();
		/* Out of descriptors: the listeners rest for a moment. */
		bool pause = r2cc_ctl_now_ms() < accept_pause_until;
		if (pause != paused || oob != oob_watched) {
			watch_fd(r2cc_ctl.listen_fd, pause ? 0 : EPOLLIN, &ev_listen);
			if (oob >= 0)
				watch_fd(oob, pause ? 0 : EPOLLIN, &ev_oob);
			paused = pause;
			oob_watched = oob;
		}
		/* Timers only matter while something can time out; an idle
		 * process wakes once a second, not ten times. */
		int wait_ms = r2cc_ctl.timers || paused ? CTL_POLL_MS : CTL_IDLE_POLL_MS;
		int n = epoll_wait(r2cc_ctl.ep_fd, ev, CTL_EVENTS, wait_ms);
		if (n < 0 && errno != EINTR)
			R2CC_WARN_ONCE("control plane: epoll_wait: %s", strerror(errno));
		bool accept_main = false, accept_oob = false;
		for (int i = 0; i < n; i++) {
			void *tag = ev[i].data.ptr;
			if (tag == &ev_wake) {
				uint64_t v;
				if (read(r2cc_ctl.wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
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
			accept_all(r2cc_ctl.listen_fd);
		if (accept_oob && oob >= 0)
			accept_all(oob);
		if (r2cc_ctl_now_ms() - r2cc_ctl.last_sweep_ms >= CTL_POLL_MS)
			conns_sweep();
	}
	free(ev);
	park_retry(true);
	for (int i = 0; i < r2cc_ctl.nconns; i++)
		r2cc_ctl_conn_kill(r2cc_ctl.conns[i], -ESHUTDOWN);
	r2cc_ctl_conns_reap();
	pthread_mutex_lock(&r2cc_ctl.lock);
	for (struct pending *p = r2cc_ctl.pending; p; p = p->next)
		r2cc_ctl_pending_complete_locked(p, -ESHUTDOWN);
	while (r2cc_ctl.outq) {
		struct out_item *it = r2cc_ctl.outq;
		r2cc_ctl.outq = it->next;
		free(it);
	}
	r2cc_ctl.outtail = &r2cc_ctl.outq;
	pthread_mutex_unlock(&r2cc_ctl.lock);
	return arg;
}

/* Start-up, fork, shutdown. */
