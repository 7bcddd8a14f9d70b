/*
 * Finding the peer process of every tracked queue pair (see peer.h): the
 * table of tracked connections, the search thread and the PAIR handler.
 *
 * PAIR (control-plane type R2CC_PEER_MSG), a request:
 *   u8 version (1), u8 op (1), u16 n, then n x (src end, dst end), each end
 *   R2CC_PEER_EP_WIRE bytes: src is the asker's end, dst the end it connects to.
 * The answer is n bytes: 1 where dst is a tracked end of this process whose
 * peer is src ("mine"), else 0.
 *
 * Table entries are found by a hash of their local end; an entry carries an
 * id that is never reused, so that a search result applies only to the entry
 * it was made for, not to one tracked again under the same identity.
 */
#include "repair/peer.h"
#include "ctl/hmap.h"
#include "shim/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PAIR_VERSION	 1
#define PAIR_OP		 1
#define PAIR_HDR	 4
#define PAIR_MAX_ITEMS	 8192 /* per request; more go in the next pass */
#define SEARCH_BATCH	 8192 /* connections looked at per pass */
#define OWNERS_KEPT	 16   /* owners of one NIC address asked */
#define ADDRS_PER_LOOKUP 4096
#define FIRST_RETRY_NS	 5000000ll
#define MAX_RETRY_NS	 1000000000ll
#define GIVE_UP_TRIES	 70 /* about a minute of retries; then only when hurried */
#define REQ_TIMEOUT_MS	 3000

struct entry {
	struct entry *next; /* same hash */
	uint64_t id;
	struct r2cc_peer_ep local, remote;
	void *cookie;
	const struct r2cc_ctl_dir *dir; /* found: the peer's job and rank */
	int rank;
	int tries;
	int64_t next_ns;
};

struct dir_ent {
	const struct r2cc_ctl_dir *dir;
	int reported; /* peer.nics[0 .. reported) are known to its rendezvous */
	int users;    /* the search thread uses it without the lock */
	bool gone;
};

static struct {
	pthread_mutex_t mu;
	pthread_cond_t cond;
	bool started;
	pthread_t thread;
	struct r2cc_hmap by_local; /* key_of(local) -> struct entry chain */
	uint64_t next_id;
	int unresolved;
	struct r2cc_ctl_nic *nics; /* the NICs this process's ends use, append-only */
	int nnics, niccap;
	struct dir_ent *dirs;
	int ndirs, dircap;
	void (*notify)(void *cookie);
	bool fetch_due; /* peers found by their PAIR: their members are not here yet */
	struct r2cc_peer_stats st;
	size_t bytes;
} peer = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .cond = PTHREAD_COND_INITIALIZER,
};

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* --- identities ----------------------------------------------------------------- */

void r2cc_peer_ep_local(const struct r2cc_qp *q, struct r2cc_peer_ep *ep)
{
	memset(ep, 0, sizeof(*ep));
	ep->global = q->peer.has_grh;
	if (ep->global)
		memcpy(ep->gid, q->peer.sgid.raw, 16);
	else
		ep->lid = q->ctx->nic->lid;
	ep->qpn = q->qpn;
}

void r2cc_peer_ep_remote(const struct r2cc_qp *q, struct r2cc_peer_ep *ep)
{
	memset(ep, 0, sizeof(*ep));
	ep->global = q->peer.has_grh;
	if (ep->global)
		memcpy(ep->gid, q->peer.gid.raw, 16);
	else
		ep->lid = q->peer.lid;
	ep->qpn = q->peer.qpn;
}

bool r2cc_peer_ep_equal(const struct r2cc_peer_ep *a, const struct r2cc_peer_ep *b)
{
	return r2cc_peer_ep_cmp(a, b) == 0;
}

int r2cc_peer_ep_cmp(const struct r2cc_peer_ep *a, const struct r2cc_peer_ep *b)
{
	uint8_t x[R2CC_PEER_EP_WIRE], y[R2CC_PEER_EP_WIRE];
	r2cc_peer_ep_put(a, x);
	r2cc_peer_ep_put(b, y);
	return memcmp(x, y, sizeof(x));
}

/* Big-endian, GID first: memcmp of the wire form orders identities. */
void r2cc_peer_ep_put(const struct r2cc_peer_ep *ep, uint8_t out[R2CC_PEER_EP_WIRE])
{
	if (ep->global)
		memcpy(out, ep->gid, 16);
	else
		memset(out, 0, 16);
	uint16_t lid = ep->global ? 0 : ep->lid;
	out[16] = (uint8_t)(lid >> 8);
	out[17] = (uint8_t)lid;
	out[18] = ep->global ? 1 : 0;
	out[19] = (uint8_t)(ep->qpn >> 24);
	out[20] = (uint8_t)(ep->qpn >> 16);
	out[21] = (uint8_t)(ep->qpn >> 8);
	out[22] = (uint8_t)ep->qpn;
}

void r2cc_peer_ep_get(const uint8_t in[R2CC_PEER_EP_WIRE], struct r2cc_peer_ep *ep)
{
	memset(ep, 0, sizeof(*ep));
	ep->global = in[18] ? 1 : 0;
	if (ep->global)
		memcpy(ep->gid, in, 16);
	else
		ep->lid = (uint16_t)(in[16] << 8 | in[17]);
	ep->qpn = (uint32_t)in[19] << 24 | (uint32_t)in[20] << 16 | (uint32_t)in[21] << 8 | in[22];
}

const char *r2cc_peer_ep_str(const struct r2cc_peer_ep *ep, char *buf, size_t len)
{
	if (ep->global) {
		char g[INET6_ADDRSTRLEN];
		inet_ntop(AF_INET6, ep->gid, g, sizeof(g));
		snprintf(buf, len, "gid %s qpn 0x%x", g, ep->qpn);
	} else {
		snprintf(buf, len, "lid %u qpn 0x%x", ep->lid, ep->qpn);
	}
	return buf;
}

static uint64_t key_of(const struct r2cc_peer_ep *ep)
{
	uint8_t w[R2CC_PEER_EP_WIRE];
	r2cc_peer_ep_put(ep, w);
	return r2cc_hmap_hash_bytes(w, sizeof(w));
}

static void addr_of(const struct r2cc_peer_ep *ep, struct r2cc_ctl_nicaddr *a)
{
	memset(a, 0, sizeof(*a));
	if (ep->global) {
		a->kind = R2CC_CTL_NICADDR_GID;
		memcpy(a->bytes, ep->gid, 16);
	} else {
		a->kind = R2CC_CTL_NICADDR_LID;
		a->bytes[0] = (uint8_t)(ep->lid >> 8);
		a->bytes[1] = (uint8_t)ep->lid;
	}
}

/* --- the table (under peer.mu) -------------------------------------------------- */

static struct entry *find_locked(const struct r2cc_peer_ep *local)
{
	struct entry *e = r2cc_hmap_get(&peer.by_local, key_of(local));
	while (e && !r2cc_peer_ep_equal(&e->local, local))
		e = e->next;
	return e;
}

static struct entry *find_id_locked(const struct r2cc_peer_ep *local, uint64_t id)
{
	struct entry *e = find_locked(local);
	return e && e->id == id ? e : NULL;
}

/* The latest directory of job_id that has rank. */
static const struct r2cc_ctl_dir *dir_of_job_locked(uint64_t job_id, int rank)
{
	for (int i = peer.ndirs - 1; i >= 0; i--) {
		const struct r2cc_ctl_dir *d = peer.dirs[i].dir;
		if (!peer.dirs[i].gone && d->job.id == job_id && rank >= 0 && rank < d->nranks)
			return d;
	}
	return NULL;
}

static void found_locked(struct entry *e, const struct r2cc_ctl_dir *dir, int rank)
{
	e->dir = dir;
	e->rank = rank;
	peer.unresolved--;
	peer.st.found++;
}

static void *search_main(void *arg);

static void start_locked(void)
{
	if (peer.started)
		return;
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	if (pthread_create(&peer.thread, NULL, search_main, NULL) == 0) {
		peer.started = true;
		pthread_setname_np(peer.thread, "r2cc-peer");
		pthread_detach(peer.thread);
	} else {
		R2CC_WARN("repair: cannot start the peer search thread; repairs find no peer");
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static void pair_handler(void *arg, int from_rank, const void *payload, size_t len,
			 struct r2cc_ctl_call *call);

static bool handler_set;

void r2cc_peer_add_dir(const struct r2cc_ctl_dir *dir)
{
	pthread_mutex_lock(&peer.mu);
	if (!handler_set && r2cc_ctl_set_handler(R2CC_PEER_MSG, pair_handler, NULL) == 0)
		handler_set = true;
	if (peer.ndirs == peer.dircap) {
		int cap = peer.dircap ? 2 * peer.dircap : 8;
		struct dir_ent *g = realloc(peer.dirs, sizeof(*g) * (size_t)cap);
		if (!g) {
			pthread_mutex_unlock(&peer.mu);
			R2CC_WARN("repair: out of memory; a communicator's peers are not searched");
			return;
		}
		peer.dirs = g;
		peer.dircap = cap;
	}
	peer.dirs[peer.ndirs++] = (struct dir_ent){.dir = dir};
	/* Unresolved connections may be in this job. */
	for (size_t i = 0; i < peer.by_local.cap; i++)
		for (struct entry *e = peer.by_local.vals[i]; e; e = e->next)
			if (!e->dir) {
				e->tries = 0;
				e->next_ns = 0;
			}
	start_locked();
	pthread_cond_broadcast(&peer.cond);
	pthread_mutex_unlock(&peer.mu);
}

void r2cc_peer_remove_dir(const struct r2cc_ctl_dir *dir)
{
	pthread_mutex_lock(&peer.mu);
	int i = 0;
	while (i < peer.ndirs && peer.dirs[i].dir != dir)
		i++;
	if (i == peer.ndirs) {
		pthread_mutex_unlock(&peer.mu);
		return;
	}
	peer.dirs[i].gone = true;
	for (size_t s = 0; s < peer.by_local.cap; s++)
		for (struct entry *e = peer.by_local.vals[s]; e; e = e->next)
			if (e->dir == dir) {
				e->dir = NULL;
				e->tries = 0;
				e->next_ns = 0;
				peer.unresolved++;
			}
	while (peer.dirs[i].users > 0)
		pthread_cond_wait(&peer.cond, &peer.mu);
	/* The array may have been grown meanwhile: find it again. */
	for (i = 0; i < peer.ndirs && peer.dirs[i].dir != dir; i++)
		;
	peer.dirs[i] = peer.dirs[--peer.ndirs];
	pthread_cond_broadcast(&peer.cond);
	pthread_mutex_unlock(&peer.mu);
}

static bool nic_same(const struct r2cc_ctl_nic *a, const struct r2cc_ctl_nic *b)
{
	return !strcmp(a->name, b->name) && a->lid == b->lid && !memcmp(a->gid, b->gid, 16);
}

int r2cc_peer_track(const struct r2cc_peer_ep *local, const struct r2cc_peer_ep *remote,
		    const struct r2cc_ctl_nic *nic, void *cookie)
{
	struct entry *e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->local = *local;
	e->remote = *remote;
	e->cookie = cookie;
	e->rank = -1;
	pthread_mutex_lock(&peer.mu);
	if (find_locked(local)) {
		pthread_mutex_unlock(&peer.mu);
		free(e);
		return -EEXIST;
	}
	bool known = false;
	for (int i = 0; i < peer.nnics && !known; i++)
		known = nic_same(&peer.nics[i], nic);
	if (!known && peer.nnics == peer.niccap) {
		int cap = peer.niccap ? 2 * peer.niccap : 8;
		struct r2cc_ctl_nic *g = realloc(peer.nics, sizeof(*g) * (size_t)cap);
		if (g) {
			peer.nics = g;
			peer.niccap = cap;
		}
	}
	if (!known && peer.nnics < peer.niccap && peer.nnics < R2CC_CTL_MAX_NICS)
		peer.nics[peer.nnics++] = *nic;
	uint64_t k = key_of(local);
	e->next = r2cc_hmap_get(&peer.by_local, k);
	if (r2cc_hmap_put(&peer.by_local, k, e)) {
		pthread_mutex_unlock(&peer.mu);
		free(e);
		return -ENOMEM;
	}
	e->id = ++peer.next_id;
	peer.unresolved++;
	peer.st.tracked++;
	peer.bytes += sizeof(*e);
	start_locked();
	pthread_cond_broadcast(&peer.cond);
	pthread_mutex_unlock(&peer.mu);
	return 0;
}

int r2cc_peer_track_qp(const struct r2cc_qp *q, void *cookie)
{
	struct r2cc_peer_ep local, remote;
	struct r2cc_ctl_nic nic;
	const struct r2cc_nic *n = q->ctx->nic;
	r2cc_peer_ep_local(q, &local);
	r2cc_peer_ep_remote(q, &remote);
	memset(&nic, 0, sizeof(nic));
	snprintf(nic.name, sizeof(nic.name), "%s", n->name);
	nic.lid = n->lid;
	nic.port = n->port;
	nic.state = (uint8_t)n->port_state;
	nic.speed_gbps = n->speed_gbps > 0 ? (uint32_t)n->speed_gbps : 0;
	if (local.global)
		memcpy(nic.gid, local.gid, 16);
	else if (n->gid_known)
		memcpy(nic.gid, n->gid.raw, 16);
	return r2cc_peer_track(&local, &remote, &nic, cookie);
}

void r2cc_peer_forget(const struct r2cc_peer_ep *local)
{
	pthread_mutex_lock(&peer.mu);
	uint64_t k = key_of(local);
	struct entry *head = r2cc_hmap_get(&peer.by_local, k), **pp = &head;
	while (*pp && !r2cc_peer_ep_equal(&(*pp)->local, local))
		pp = &(*pp)->next;
	struct entry *e = *pp;
	if (e) {
		*pp = e->next;
		if (head)
			r2cc_hmap_put(&peer.by_local, k, head);
		else
			r2cc_hmap_del(&peer.by_local, k);
		if (!e->dir)
			peer.unresolved--;
		peer.bytes -= sizeof(*e);
	}
	pthread_mutex_unlock(&peer.mu);
	free(e);
}

void *r2cc_peer_find(const struct r2cc_peer_ep *local, const struct r2cc_peer_ep *remote)
{
	pthread_mutex_lock(&peer.mu);
	const struct entry *e = find_locked(local);
	void *cookie = e && r2cc_peer_ep_equal(&e->remote, remote) ? e->cookie : NULL;
	pthread_mutex_unlock(&peer.mu);
	return cookie;
}

int r2cc_peer_of(const struct r2cc_peer_ep *local, const struct r2cc_ctl_dir **dir, int *rank)
{
	pthread_mutex_lock(&peer.mu);
	const struct entry *e = find_locked(local);
	int rc = !e ? -ENOENT : e->dir ? 0 : -EAGAIN;
	if (rc == 0) {
		*dir = e->dir;
		*rank = e->rank;
	}
	pthread_mutex_unlock(&peer.mu);
	return rc;
}

void r2cc_peer_hurry(const struct r2cc_peer_ep *local)
{
	pthread_mutex_lock(&peer.mu);
	struct entry *e = find_locked(local);
	if (e && !e->dir) {
		e->next_ns = 0;
		pthread_cond_broadcast(&peer.cond);
	}
	pthread_mutex_unlock(&peer.mu);
}

void r2cc_peer_set_notify(void (*fn)(void *cookie))
{
	pthread_mutex_lock(&peer.mu);
	peer.notify = fn;
	pthread_mutex_unlock(&peer.mu);
}

void r2cc_peer_stats(struct r2cc_peer_stats *out)
{
	pthread_mutex_lock(&peer.mu);
	*out = peer.st;
	pthread_mutex_unlock(&peer.mu);
}

size_t r2cc_peer_bytes(void)
{
	pthread_mutex_lock(&peer.mu);
	size_t n = peer.bytes + r2cc_hmap_bytes(&peer.by_local) +
		   (size_t)peer.niccap * sizeof(*peer.nics) +
		   (size_t)peer.dircap * sizeof(*peer.dirs);
	pthread_mutex_unlock(&peer.mu);
	return n;
}

/* --- PAIR, the owner's side (control thread) ------------------------------------ */

static void pair_handler(void *arg, int from_rank, const void *payload, size_t len,
			 struct r2cc_ctl_call *call)
{
	const uint8_t *p = payload;
	if (!call->is_request || len < PAIR_HDR || p[0] != PAIR_VERSION || p[1] != PAIR_OP)
		return;
	size_t n = (size_t)(p[2] << 8 | p[3]);
	if (len != PAIR_HDR + n * 2 * R2CC_PEER_EP_WIRE || n == 0) {
		r2cc_ctl_reply(call, -EPROTO, NULL, 0);
		return;
	}
	uint8_t *mine = calloc(n, 1);
	void **notify = calloc(n, sizeof(*notify));
	if (!mine || !notify) {
		free(mine);
		free(notify);
		r2cc_ctl_reply(call, -ENOMEM, NULL, 0);
		return;
	}
	size_t nn = 0;
	pthread_mutex_lock(&peer.mu);
	void (*fn)(void *) = peer.notify;
	const struct r2cc_ctl_dir *dir = dir_of_job_locked(call->job_id, from_rank);
	for (size_t i = 0; i < n; i++) {
		struct r2cc_peer_ep src, dst;
		const uint8_t *w = p + PAIR_HDR + i * 2 * R2CC_PEER_EP_WIRE;
		r2cc_peer_ep_get(w, &src);
		r2cc_peer_ep_get(w + R2CC_PEER_EP_WIRE, &dst);
		struct entry *e = find_locked(&dst);
		if (!e || !r2cc_peer_ep_equal(&e->remote, &src))
			continue;
		mine[i] = 1;
		/* The asker is this end's peer, authenticated as that rank. */
		if (!e->dir && dir) {
			found_locked(e, dir, from_rank);
			peer.st.by_pair_request++;
			notify[nn++] = e->cookie;
			peer.fetch_due = true;
			pthread_cond_broadcast(&peer.cond);
		}
	}
	pthread_mutex_unlock(&peer.mu);
	r2cc_ctl_reply(call, 0, mine, n);
	for (size_t i = 0; fn && i < nn; i++)
		fn(notify[i]);
	free(mine);
	free(notify);
}

/* --- the search (its own thread) ---------------------------------------------------- */

struct item {
	uint64_t id;
	struct r2cc_peer_ep local, remote;
	const struct r2cc_ctl_dir *found_dir;
	int found_rank;
	int owners[OWNERS_KEPT];
	int nowners;
};

struct ask {
	int rank;
	int n, cap;
	int *items; /* indices into the items array */
	uint8_t *payload;
	uint8_t reply[PAIR_MAX_ITEMS];
};

static int64_t backoff_ns(int tries)
{
	if (tries >= GIVE_UP_TRIES)
		return INT64_MAX / 2;
	int64_t t = FIRST_RETRY_NS;
	for (int i = 1; i < tries && t < MAX_RETRY_NS; i++)
		t *= 2;
	return t < MAX_RETRY_NS ? t : MAX_RETRY_NS;
}

/* This process's NICs the rendezvous of d does not know yet. */
static void report_nics(struct dir_ent *snap, const struct r2cc_ctl_nic *nics, int nnics)
{
	if (snap->reported >= nnics)
		return;
	int rc = r2cc_ctl_dir_report_nics(snap->dir, nics + snap->reported, nnics - snap->reported,
					  REQ_TIMEOUT_MS);
	if (rc) {
		R2CC_INFO("repair: cannot report this process's NICs to job %016llx's rendezvous "
			  "(%s); its peers find it through other jobs or later",
			  (unsigned long long)snap->dir->job.id, strerror(-rc));
		return;
	}
	pthread_mutex_lock(&peer.mu);
	for (int i = 0; i < peer.ndirs; i++)
		if (peer.dirs[i].dir == snap->dir && peer.dirs[i].reported < nnics)
			peer.dirs[i].reported = nnics;
	pthread_mutex_unlock(&peer.mu);
}

/* Who owns the NIC addresses of the items not found yet, in job d. */
static void find_owners(const struct r2cc_ctl_dir *d, struct item *it, int n)
{
	struct r2cc_hmap seen = {0}; /* address key -> index into addrs + 1 */
	struct r2cc_ctl_nicaddr *addrs = malloc(sizeof(*addrs) * (size_t)n);
	int *slot = malloc(sizeof(int) * (size_t)n);
	int na = 0;
	for (int i = 0; addrs && slot && i < n; i++) {
		it[i].nowners = 0;
		if (it[i].found_dir)
			continue;
		struct r2cc_ctl_nicaddr a;
		addr_of(&it[i].remote, &a);
		uint8_t b[17];
		b[0] = a.kind;
		memcpy(b + 1, a.bytes, 16);
		uint64_t k = r2cc_hmap_hash_bytes(b, sizeof(b));
		uintptr_t v = (uintptr_t)r2cc_hmap_get(&seen, k);
		if (v && !memcmp(&addrs[v - 1], &a, sizeof(a))) {
			slot[i] = (int)v - 1;
			continue;
		}
		if (!v && r2cc_hmap_put(&seen, k, (void *)(uintptr_t)(na + 1)) == 0) {
			addrs[na] = a;
			slot[i] = na++;
		} else {
			addrs[na] = a; /* a colliding key: asked twice, harmless */
			slot[i] = na++;
		}
	}
	int *owners = na ? malloc(sizeof(int) * (size_t)na * OWNERS_KEPT) : NULL;
	int *nown = na ? calloc((size_t)na, sizeof(int)) : NULL;
	for (int a0 = 0; owners && nown && a0 < na; a0 += ADDRS_PER_LOOKUP) {
		int k = na - a0 < ADDRS_PER_LOOKUP ? na - a0 : ADDRS_PER_LOOKUP;
		pthread_mutex_lock(&peer.mu);
		peer.st.lookups++;
		pthread_mutex_unlock(&peer.mu);
		int rc = r2cc_ctl_dir_owners(d, addrs + a0, k, owners + (size_t)a0 * OWNERS_KEPT,
					     OWNERS_KEPT, nown + a0, REQ_TIMEOUT_MS);
		if (rc) {
			memset(nown + a0, 0, sizeof(int) * (size_t)k);
			R2CC_INFO("repair: peer search in job %016llx: lookup failed (%s)",
				  (unsigned long long)d->job.id, strerror(-rc));
		}
	}
	for (int i = 0; owners && nown && i < n; i++) {
		if (it[i].found_dir)
			continue;
		int s = slot[i], m = nown[s] < OWNERS_KEPT ? nown[s] : OWNERS_KEPT;
		memcpy(it[i].owners, owners + (size_t)s * OWNERS_KEPT, sizeof(int) * (size_t)m);
		it[i].nowners = m;
	}
	free(owners);
	free(nown);
	free(slot);
	free(addrs);
	r2cc_hmap_free(&seen);
}

/* Ask every owner, at once, which of the items are its. */
static void ask_owners(const struct r2cc_ctl_dir *d, struct item *it, int n)
{
	struct r2cc_hmap by_rank = {0}; /* rank + 1 -> struct ask */
	struct ask **asks = NULL;
	int nasks = 0, askcap = 0;
	for (int i = 0; i < n; i++) {
		for (int k = 0; k < it[i].nowners && !it[i].found_dir; k++) {
			int r = it[i].owners[k];
			struct ask *a = r2cc_hmap_get(&by_rank, (uint64_t)r + 1);
			if (!a) {
				a = calloc(1, sizeof(*a));
				if (nasks == askcap) {
					int cap = askcap ? 2 * askcap : 16;
					struct ask **g = realloc(asks, sizeof(*g) * (size_t)cap);
					if (g) {
						asks = g;
						askcap = cap;
					}
				}
				if (!a || nasks == askcap ||
				    r2cc_hmap_put(&by_rank, (uint64_t)r + 1, a)) {
					free(a);
					continue;
				}
				a->rank = r;
				asks[nasks++] = a;
			}
			if (a->n == PAIR_MAX_ITEMS)
				continue; /* the rest next time */
			if (a->n == a->cap) {
				int cap = a->cap ? 2 * a->cap : 16;
				int *g = realloc(a->items, sizeof(int) * (size_t)cap);
				if (!g)
					continue;
				a->items = g;
				a->cap = cap;
			}
			a->items[a->n++] = i;
		}
	}
	struct r2cc_ctl_batch_req *req = nasks ? calloc((size_t)nasks, sizeof(*req)) : NULL;
	int nreq = 0;
	for (int j = 0; req && j < nasks; j++) {
		struct ask *a = asks[j];
		size_t len = PAIR_HDR + (size_t)a->n * 2 * R2CC_PEER_EP_WIRE;
		a->payload = malloc(len);
		if (!a->payload)
			continue;
		a->payload[0] = PAIR_VERSION;
		a->payload[1] = PAIR_OP;
		a->payload[2] = (uint8_t)(a->n >> 8);
		a->payload[3] = (uint8_t)a->n;
		for (int k = 0; k < a->n; k++) {
			uint8_t *w = a->payload + PAIR_HDR + (size_t)k * 2 * R2CC_PEER_EP_WIRE;
			r2cc_peer_ep_put(&it[a->items[k]].local, w);
			r2cc_peer_ep_put(&it[a->items[k]].remote, w + R2CC_PEER_EP_WIRE);
		}
		req[nreq++] = (struct r2cc_ctl_batch_req){.dir = d,
							  .rank = a->rank,
							  .payload = a->payload,
							  .len = len,
							  .reply = a->reply,
							  .reply_len = (size_t)a->n};
	}
	if (nreq) {
		pthread_mutex_lock(&peer.mu);
		peer.st.pair_requests += (uint64_t)nreq;
		pthread_mutex_unlock(&peer.mu);
		r2cc_ctl_request_batch(req, nreq, R2CC_PEER_MSG, REQ_TIMEOUT_MS);
	}
	for (int j = 0; j < nreq; j++) {
		const struct ask *a = asks[j];
		for (size_t k = 0; req[j].status == 0 && k < req[j].reply_len && k < (size_t)a->n;
		     k++) {
			struct item *x = &it[a->items[k]];
			if (a->reply[k] && !x->found_dir) {
				x->found_dir = d;
				x->found_rank = a->rank;
			}
		}
	}
	for (int j = 0; j < nasks; j++) {
		free(asks[j]->items);
		free(asks[j]->payload);
		free(asks[j]);
	}
	free(asks);
	free(req);
	r2cc_hmap_free(&by_rank);
}

static int cmp_size(const void *a, const void *b)
{
	const struct dir_ent *x = a, *y = b;
	return (y->dir->nranks > x->dir->nranks) - (y->dir->nranks < x->dir->nranks);
}

/*
 * The members of peers found by their own PAIR request, fetched now rather than
 * at the first repair message: then a repair needs nothing from the rendezvous,
 * even if its process is gone by then. snap holds the directories in use.
 */
static void fetch_members(const struct dir_ent *snap, int nd)
{
	pthread_mutex_lock(&peer.mu);
	bool due = peer.fetch_due;
	peer.fetch_due = false;
	int total = due ? (int)peer.st.found : 0, *ranks = NULL, *which = NULL, n = 0;
	if (total) {
		ranks = malloc(sizeof(int) * (size_t)total);
		which = malloc(sizeof(int) * (size_t)total);
	}
	for (size_t s = 0; ranks && which && s < peer.by_local.cap; s++)
		for (const struct entry *e = peer.by_local.vals[s]; e && n < total; e = e->next) {
			int d = 0;
			while (d < nd && snap[d].dir != e->dir)
				d++;
			if (d < nd && !r2cc_ctl_dir_member(e->dir, e->rank)) {
				ranks[n] = e->rank;
				which[n++] = d;
			}
		}
	pthread_mutex_unlock(&peer.mu);
	int *mine = n ? malloc(sizeof(int) * (size_t)n) : NULL;
	for (int d = 0; d < nd && mine; d++) {
		int k = 0;
		for (int i = 0; i < n; i++)
			if (which[i] == d)
				mine[k++] = ranks[i];
		if (k && r2cc_ctl_dir_fetch(snap[d].dir, mine, k, REQ_TIMEOUT_MS))
			R2CC_INFO("repair: cannot fetch %d peer member(s) of job %016llx now; a "
				  "repair will ask again",
				  k, (unsigned long long)snap[d].dir->job.id);
	}
	free(mine);
	free(ranks);
	free(which);
}

/* One pass: report NICs, then search what is due, through every job (the
 * largest first: the world communicator's job has every peer), and fetch the
 * members of peers that found this process. Returns when the next entry falls
 * due. */
static int64_t search_pass(void)
{
	int64_t now = now_ns(), next = now + MAX_RETRY_NS;
	pthread_mutex_lock(&peer.mu);
	int nd = peer.ndirs, nnics = peer.nnics;
	struct dir_ent *snap = malloc(sizeof(*snap) * (size_t)(nd ? nd : 1));
	struct r2cc_ctl_nic *nics = malloc(sizeof(*nics) * (size_t)(nnics ? nnics : 1));
	struct item *it = malloc(sizeof(*it) * SEARCH_BATCH);
	int n = 0;
	if (!snap || !nics || !it) {
		pthread_mutex_unlock(&peer.mu);
		free(snap);
		free(nics);
		free(it);
		return now + MAX_RETRY_NS;
	}
	memcpy(nics, peer.nics, sizeof(*nics) * (size_t)nnics);
	int k = 0;
	for (int i = 0; i < nd; i++) {
		if (peer.dirs[i].gone)
			continue;
		peer.dirs[i].users++;
		snap[k++] = peer.dirs[i];
	}
	nd = k;
	for (size_t s = 0; nd && s < peer.by_local.cap; s++) {
		for (struct entry *e = peer.by_local.vals[s]; e; e = e->next) {
			if (e->dir)
				continue;
			if (e->next_ns > now || n == SEARCH_BATCH) {
				if (e->next_ns < next)
					next = e->next_ns;
				continue;
			}
			it[n++] =
			    (struct item){.id = e->id, .local = e->local, .remote = e->remote};
		}
	}
	pthread_mutex_unlock(&peer.mu);

	for (int i = 0; i < nd; i++)
		report_nics(&snap[i], nics, nnics);
	qsort(snap, (size_t)nd, sizeof(*snap), cmp_size);
	for (int i = 0; i < nd && n; i++) {
		find_owners(snap[i].dir, it, n);
		ask_owners(snap[i].dir, it, n);
	}
	fetch_members(snap, nd);

	void **notify = n ? malloc(sizeof(*notify) * (size_t)n) : NULL;
	int nn = 0;
	pthread_mutex_lock(&peer.mu);
	void (*fn)(void *) = peer.notify;
	int64_t later = now_ns();
	for (int i = 0; i < n; i++) {
		struct entry *e = find_id_locked(&it[i].local, it[i].id);
		if (!e || e->dir)
			continue;
		bool live = false;
		for (int j = 0; j < peer.ndirs && it[i].found_dir && !live; j++)
			live = peer.dirs[j].dir == it[i].found_dir && !peer.dirs[j].gone;
		if (live) {
			found_locked(e, it[i].found_dir, it[i].found_rank);
			if (notify)
				notify[nn++] = e->cookie;
			continue;
		}
		e->tries++;
		e->next_ns = later + backoff_ns(e->tries);
		if (e->next_ns < next)
			next = e->next_ns;
		peer.st.misses++;
	}
	for (int i = 0; i < nd; i++)
		for (int j = 0; j < peer.ndirs; j++)
			if (peer.dirs[j].dir == snap[i].dir)
				peer.dirs[j].users--;
	pthread_cond_broadcast(&peer.cond);
	pthread_mutex_unlock(&peer.mu);
	for (int i = 0; fn && i < nn; i++)
		fn(notify[i]);
	free(notify);
	free(it);
	free(nics);
	free(snap);
	return next;
}

static bool work_due_locked(int64_t now)
{
	if (peer.fetch_due && peer.ndirs)
		return true;
	for (int i = 0; i < peer.ndirs; i++)
		if (!peer.dirs[i].gone && peer.dirs[i].reported < peer.nnics)
			return true;
	if (!peer.unresolved || !peer.ndirs)
		return false;
	for (size_t s = 0; s < peer.by_local.cap; s++)
		for (const struct entry *e = peer.by_local.vals[s]; e; e = e->next)
			if (!e->dir && e->next_ns <= now)
				return true;
	return false;
}

static void *search_main(void *arg)
{
	int64_t next = 0;
	pthread_mutex_lock(&peer.mu);
	for (;;) {
		int64_t now = now_ns();
		if (!work_due_locked(now)) {
			int64_t until = next > now ? next : now + MAX_RETRY_NS;
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			int64_t wait = until - now;
			if (wait > MAX_RETRY_NS)
				wait = MAX_RETRY_NS;
			ts.tv_sec += wait / 1000000000ll;
			ts.tv_nsec += wait % 1000000000ll;
			if (ts.tv_nsec >= 1000000000l) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000l;
			}
			pthread_cond_timedwait(&peer.cond, &peer.mu, &ts);
			continue;
		}
		pthread_mutex_unlock(&peer.mu);
		next = search_pass();
		pthread_mutex_lock(&peer.mu);
	}
	pthread_mutex_unlock(&peer.mu);
	return arg;
}
