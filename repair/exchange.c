/*
 * The exchange with the peer's engine (engine.h): REQ from the side that found the
 * failure, REP from the peer once it has fenced and built its new path, GO once the
 * initiator has re-posted, NACK from a side that cannot repair; crossing requests
 * settled by the pair's identities, resends while unanswered, deadlines that scale
 * with the work, and a clean error for NCCL when one passes.
 */
#include "repair/drill.h"
#include "repair/engine_priv.h"

#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void path_from_wire(struct peer_path *p, const struct rep_wire *m)
{
	p->qpn = le32toh(m->new_qpn);
	p->lid = le16toh(m->new_lid);
	p->port = m->new_port;
	p->mtu = m->new_mtu >= IBV_MTU_256 && m->new_mtu <= IBV_MTU_4096 ? m->new_mtu : 0;
	memcpy(p->gid, m->new_gid, 16);
	snprintf(p->nic, sizeof(p->nic), "%s", m->new_nic);
}

/* Our NCCL QP addressed by an entry: exactly the connection whose this end is
 * the entry's dst and whose other end is its src (repair/peer.h). Under r2cc_eng.mu
 * (the record is then kept from NCCL's destroy by its busy flag). */
static struct r2cc_rqp *rqp_of_msg(const struct rep_wire *m)
{
	struct r2cc_peer_ep local, remote;
	r2cc_peer_ep_get(m->dst, &local);
	r2cc_peer_ep_get(m->src, &remote);
	struct r2cc_rqp *r = r2cc_peer_find(&local, &remote);
	return r && !r->dead ? r : NULL;
}

/* Whether m is addressed to a connection whose QP NCCL destroyed here lately (its
 * record is dead or gone). Under r2cc_eng.mu. */
static bool destroyed_here(const struct rep_wire *m)
{
	struct r2cc_peer_ep local, remote;
	r2cc_peer_ep_get(m->dst, &local);
	r2cc_peer_ep_get(m->src, &remote);
	unsigned n = r2cc_eng.ngone < GONE_RING ? r2cc_eng.ngone : GONE_RING;
	for (unsigned i = 0; i < n; i++)
		if (r2cc_peer_ep_equal(&r2cc_eng.gone[i].local, &local) &&
		    r2cc_peer_ep_equal(&r2cc_eng.gone[i].remote, &remote))
			return true;
	return false;
}

/* Of the two ends, whose exchange goes on when both started one. */
static bool lower_id(const struct r2cc_rqp *r)
{
	return r2cc_peer_ep_cmp(&r->ep_local, &r->ep_remote) < 0;
}

/* A NACK answering entry m. */
static void nack_entry(struct rep_wire *out, const struct rep_wire *m, int status)
{
	memset(out, 0, sizeof(*out));
	out->op = OP_NACK;
	out->status = (int32_t)htole32((uint32_t)status);
	out->pair_id = m->pair_id;
	memcpy(out->src, m->dst, sizeof(out->src));
	memcpy(out->dst, m->src, sizeof(out->dst));
}

static void nack(struct outboxes *o, const struct r2cc_ctl_dir *dir, int rank,
		 const struct rep_wire *m, int status)
{
	struct rep_wire *e = r2cc_out_add(o, dir, rank);
	if (e)
		nack_entry(e, m, status);
}

/* How long an exchange of n queue pairs in one message may take: the base,
 * and per queue pair what fencing, a new QP and the re-posts cost both ends,
 * with a wide margin. */
static int64_t exchange_ns(int n)
{
	return (int64_t)R2CC_REPAIR_BASE_MS * 1000000 + (int64_t)n * R2CC_REPAIR_PER_QP_US * 1000;
}

/* The rkeys of the peer on its new NIC, once per (peer, NIC pair) of a batch,
 * when its message did not carry them. */
struct refresh_set {
	struct r2cc_hmap seen;
};

static void refresh_once(struct refresh_set *rs, const struct r2cc_ctl_dir *dir, int rank,
			 const char *from, const char *to)
{
	if (!strcmp(from, to))
		return;
	char key[2 * R2CC_NIC_NAME_MAX + 32];
	int n = snprintf(key, sizeof(key), "%p/%d/%s/%s", (const void *)dir, rank, from, to);
	uint64_t k = r2cc_hmap_hash_bytes(key, (size_t)n);
	if (r2cc_hmap_get(&rs->seen, k))
		return;
	r2cc_hmap_put(&rs->seen, k, (void *)1);
	r2cc_mr_mirror_remote_refresh(dir, rank, from, to, 2000);
}

/* Did the message carry (and the key cache take) the sender's map from to? */
static bool map_carried(const struct inbox *in, const char *from, const char *to)
{
	const unsigned char *p = in->maps;
	for (int j = 0; j < in->nmaps; j++) {
		struct rep_map h;
		memcpy(&h, p, sizeof(h));
		if (in->map_ok[j] && !strcmp(h.from, from) && !strcmp(h.to, to))
			return true;
		p += sizeof(h) + le32toh(h.len);
	}
	return false;
}

/* The maps a message carries, into the key cache before its entries are
 * handled. */
static void maps_store(struct inbox *in, const struct r2cc_ctl_dir *dir)
{
	const unsigned char *p = in->maps;
	for (int j = 0; j < in->nmaps; j++) {
		struct rep_map h;
		memcpy(&h, p, sizeof(h));
		size_t len = le32toh(h.len);
		int rc = r2cc_mr_mirror_remote_store(dir, in->from_rank, h.from, h.to,
						     p + sizeof(h), len);
		in->map_ok[j] = rc == 0;
		if (rc)
			R2CC_WARN_ONCE("repair: the rkey map %s -> %s from rank %d cannot be used "
				       "(%s); it is fetched",
				       h.from, h.to, in->from_rank, strerror(-rc));
		p += sizeof(h) + len;
	}
}

/* The keys of r's peer on the NIC to which its side moved: r's posts carry its
 * keys on the original NIC. With the peer's message as a rule; fetched (the
 * old round trip) when that did not carry them. */
static void peer_keys(struct refresh_set *rs, const struct inbox *in,
		      const struct r2cc_ctl_dir *dir, const struct r2cc_rqp *r, const char *to)
{
	const char *from = r->peer_orig_nic;
	if (!strcmp(from, to))
		return;
	bool carried = map_carried(in, from, to);
	pthread_mutex_lock(&r2cc_eng.mu);
	if (r->incident >= 0) {
		if (carried)
			r2cc_eng.inc[r->incident].maps_carried++;
		else
			r2cc_eng.inc[r->incident].maps_fetched++;
	}
	pthread_mutex_unlock(&r2cc_eng.mu);
	if (carried)
		return;
	R2CC_WARN_ONCE("repair: rank %d's exchange message came without its rkey map %s -> %s; "
		       "fetching it",
		       in->from_rank, from, to);
	refresh_once(rs, dir, in->from_rank, from, to);
}

/* One queue pair's checks before the fence: false when it is done with
 * (migrated alone, failed, or left to its transport). */
static bool initiate_check(struct r2cc_rqp *r)
{
	if (!r2cc_eng.have_verbs) {
		r2cc_rqp_fail(r, "verbs functions unavailable");
		return false;
	}
	if (r2cc_peer_ep_equal(&r->ep_local, &r->ep_remote)) {
		const char *why = r2cc_rqp_churning(r);
		if (why)
			r2cc_rqp_fail(r, why);
		else
			r2cc_migrate_loopback(r);
		return false;
	}
	if (r2cc_rqp_peer(r) == -ENOENT) {
		r2cc_rqp_fail(
		    r, "no control-plane peer for this QP (communicator without a directory)");
		return false;
	}
	if (r->failback_to)
		r2cc_rqp_event(r, "qp 0x%x: returns to %s", r->qpn, r->failback_to->name);
	else
		r2cc_rqp_event(r, "qp 0x%x: failure seen (%s)", r->qpn, r->cause);
	/* A declared NIC, or one that had failed before the QP was made: not a failure
	 * of the path the QP is on. */
	bool of_path = strncmp(r->cause, "declared", 8) && strncmp(r->cause, "created on", 10) &&
		       !r->failback_to;
	if (!of_path)
		r->barren_seen = r->migrations;
	const char *why = r2cc_rqp_churning(r);
	if (why) {
		r2cc_rqp_fail(r, why);
		return false;
	}
	/* A path-level symptom (the transport gave up, a stall, a port event) widens to
	 * the NIC or the path; any other error status (access, protection, a QP error
	 * event) is this QP's own: only it moves. */
	bool path_level = r->status_seen == 0 || r->status_seen == IBV_WC_RETRY_EXC_ERR ||
			  r->status_seen == IBV_WC_RNR_RETRY_EXC_ERR;
	bool path_failed = path_level && of_path;
	if (path_failed)
		r2cc_left_failed(r);
	if (path_failed && strncmp(r->cause, "same ", 5))
		r2cc_localise(r);
	else if (!path_level)
		r2cc_rqp_event(r, "qp 0x%x: localised to this QP (status %d)", r->qpn,
			       r->status_seen);
	return true;
}

/* Fenced, then a new path: the REQ entry in *m. 0, or the QP failed. */
static int initiate_path(struct r2cc_rqp *r, struct rep_wire *m)
{
	const char *unsafe = r2cc_cts_unsafe(r->cur_sh, r2cc_cts_of(r->q));
	if (unsafe) {
		r2cc_rqp_fail(r, unsafe);
		return -EOPNOTSUPP;
	}
	r->churn_skip = false;
	struct r2cc_nic *nic = NULL, *home = r->failback_to;
	int rc = r2cc_path_on_healthy(r, home && r2cc_nic_usable(r, home, true) ? home : NULL, NULL,
				      NULL, &nic);
	if (rc == -ENODEV) {
		r2cc_rqp_fail(r, r2cc_param.mr_mirror
				     ? "no healthy NIC left"
				     : "R2CC_MR_MIRROR=0: queue pairs cannot migrate");
		return rc;
	}
	if (rc) {
		r2cc_rqp_fail(r, "cannot create a QP on the new NIC");
		return rc;
	}
	pthread_mutex_lock(&r->mu);
	set_state(r, RQ_EXCHANGE);
	r->recv_live = r->send_live = false;
	r->initiator = true;
	pthread_mutex_lock(&r2cc_eng.mu);
	r->pair_id = ((uint64_t)getpid() << 32) | ++r2cc_eng.next_pair;
	pthread_mutex_unlock(&r2cc_eng.mu);
	r2cc_wire_fill(m, OP_REQ, r);
	r2cc_wire_counts(m, r);
	r2cc_wire_path(m, r);
	r2cc_cts_queries(r);
	r->resends = 0;
	pthread_mutex_unlock(&r->mu);
	return 0;
}

/* The REQs m[0..k) of rs[0..k) to rank, with their clear-to-send queries (entry i
 * for rs[i]); without memory for those, without them: the writes are then re-posted
 * as without the check. */
static void send_reqs(const struct r2cc_ctl_dir *dir, int rank, const struct rep_wire *m, int k,
		      struct r2cc_rqp *const *rs)
{
	int n = 0, nc = 0;
	for (int i = 0; i < k; i++)
		n += rs[i]->ncts_q;
	struct rep_cts *c = n ? malloc(sizeof(*c) * (size_t)n) : NULL;
	for (int i = 0; c && i < k; i++)
		for (int j = 0; j < rs[i]->ncts_q; j++) {
			c[nc] = rs[i]->cts_q[j];
			c[nc++].entry = htole16((uint16_t)i);
		}
	r2cc_wire_send(dir, rank, m, k, c, nc);
	free(c);
}

static int cmp_by_peer(const void *a, const void *b)
{
	const struct r2cc_rqp *x = *(struct r2cc_rqp *const *)a, *y = *(struct r2cc_rqp *const *)b;
	if (x->dir != y->dir)
		return (uintptr_t)x->dir < (uintptr_t)y->dir ? -1 : 1;
	return (x->peer_rank > y->peer_rank) - (x->peer_rank < y->peer_rank);
}

/* The oldest message in from the control thread, taken off the queue. Under r2cc_eng.mu. */
struct inbox *r2cc_inbox_pop_locked(void)
{
	struct inbox *in = r2cc_eng.in_head;
	if (in) {
		r2cc_eng.in_head = in->next;
		if (!r2cc_eng.in_head)
			r2cc_eng.in_tail = &r2cc_eng.in_head;
	}
	return in;
}

/*
 * While a batch is being initiated, the messages already in that carry no
 * REQ (REPs, GOs, NACKs, notices), in their order of arrival: the queue pairs
 * whose REP is in migrate while the next peers' paths are built. The first
 * message with a REQ, and all behind it, waits for the end of the batch (it
 * may concern a queue pair of the batch that has not asked its peer yet).
 */
static void replies_now(void)
{
	for (;;) {
		pthread_mutex_lock(&r2cc_eng.mu);
		struct inbox *in = r2cc_eng.in_head;
		bool req = false;
		for (int i = 0; in && i < in->n && !req; i++)
			req = in->m[i].op == OP_REQ;
		if (!in || req) {
			pthread_mutex_unlock(&r2cc_eng.mu);
			return;
		}
		r2cc_inbox_pop_locked();
		pthread_mutex_unlock(&r2cc_eng.mu);
		r2cc_exchange_handle(in);
		free(in);
	}
}

/*
 * Initiator, for every queue pair the repair thread took up at once (one
 * failure puts all of a NIC's on the queue, and localising adds the rest of
 * the path's): the checks of each, then every fence at once (the drains
 * overlap), then peer process by peer process the new paths and one REQ with
 * all of that peer's queue pairs, sent before the next peer's are built, so
 * that the peers work while this side goes on; between two peers, the REPs
 * already in are handled (replies_now()), so no peer's migration waits for the
 * last peer's REQ. A queue pair whose peer is not known yet (the search was
 * hurried) sends its REQ when it is (resend_due()).
 */
void r2cc_exchange_initiate(struct batch *b)
{
	/* The records still in the game; b keeps them all for the release. */
	struct batch w = {0};
	for (int checked = 0;;) {
		for (int i = checked; i < b->n; i++)
			if (initiate_check(b->r[i]))
				r2cc_batch_add(&w, b->r[i]);
		checked = b->n;
		/* Localising queued the rest of the path: they join this batch. */
		pthread_mutex_lock(&r2cc_eng.mu);
		r2cc_work_take_locked(b);
		pthread_mutex_unlock(&r2cc_eng.mu);
		if (b->n == checked)
			break;
	}
	int *frc = calloc((size_t)(w.n ? w.n : 1), sizeof(*frc));
	int n = 0;
	if (frc)
		r2cc_fence_all(w.r, w.n, frc);
	for (int i = 0; i < w.n; i++) {
		int rc = frc ? frc[i] : -ENOMEM;
		if (rc)
			r2cc_rqp_fail(w.r[i], rc == -ENOMEM ? "out of memory for the exchange"
							    : r2cc_fence_failure(rc));
		else
			w.r[n++] = w.r[i];
	}
	free(frc);
	if (n > 1) /* (w.r is NULL when the batch is empty) */
		qsort(w.r, (size_t)n, sizeof(*w.r), cmp_by_peer);
	struct rep_wire *m = n ? malloc(sizeof(*m) * (size_t)n) : NULL;
	if (n && !m) {
		for (int i = 0; i < n; i++)
			r2cc_rqp_fail(w.r[i], "out of memory for the exchange");
		n = 0;
	}
	for (int first = 0; first < n;) {
		const struct r2cc_ctl_dir *dir = w.r[first]->dir;
		int rank = w.r[first]->peer_rank, k = 0, last = first;
		while (last < n && w.r[last]->dir == dir && w.r[last]->peer_rank == rank)
			last++;
		for (int i = first; i < last; i++)
			if (initiate_path(w.r[i], &m[k]) == 0)
				w.r[first + k++] = w.r[i];
		int64_t t = now_ns();
		for (int i = first; i < first + k; i++) {
			struct r2cc_rqp *r = w.r[i];
			pthread_mutex_lock(&r->mu);
			r->batch = n;
			r->t_sent = dir ? t : 0; /* 0: waits for its peer to be found */
			r->t_deadline = t + exchange_ns(n);
			pthread_mutex_unlock(&r->mu);
			m[i - first].work = htole32((uint32_t)n);
			r2cc_rqp_event(r, "qp 0x%x: fenced (k=%llu), new path on %s, %s", r->qpn,
				       (unsigned long long)r->k_local, r->new_ctx->nic->name,
				       dir ? "asking its peer" : "its peer is being searched");
		}
		if (dir && k)
			send_reqs(dir, rank, m, k, &w.r[first]);
		/* Their exchange goes on by messages now: released to them (and to
		 * NCCL's destroy) before the next peer's. */
		pthread_mutex_lock(&r2cc_eng.mu);
		for (int i = first; i < first + k; i++)
			w.r[i]->busy = false;
		pthread_cond_broadcast(&r2cc_eng.cond);
		pthread_mutex_unlock(&r2cc_eng.mu);
		replies_now();
		first = last;
	}
	free(m);
	free(w.r);
}

/*
 * Is the peer process still there? A request its control thread does not
 * answer comes back as -ENODATA (alive); a refused or reset connection means
 * the process is gone. Asked after a few unanswered REQs, so that a dead peer
 * ends the repair at once instead of at the exchange's deadline.
 */
static bool peer_gone(const struct r2cc_ctl_dir *dir, int rank)
{
	uint8_t ping = 0;
	unsigned char reply[8];
	size_t len = sizeof(reply);
	int rc = r2cc_ctl_request(dir, rank, R2CC_REPAIR_MSG, &ping, 1, reply, &len, 300);
	return rc == -ECONNREFUSED || rc == -ECONNRESET;
}

/* A stall this side suspects: the peer's NIC may be the dead one, and only the
 * peer can test it. A notice, not a request: nothing is fenced. Sent only when
 * the peer is known already (the search is hurried otherwise). */
int r2cc_exchange_suspect(struct r2cc_rqp *r)
{
	/* r->q goes NULL (atomically, under r->mu) when NCCL destroys the QP meanwhile */
	if (!__atomic_load_n(&r->q, __ATOMIC_ACQUIRE))
		return -ENOENT;
	int rc = r2cc_rqp_peer(r);
	if (rc)
		return rc;
	struct rep_wire m;
	pthread_mutex_lock(&r->mu);
	bool send = !r->loopback && __atomic_load_n(&r->q, __ATOMIC_ACQUIRE) &&
		    !r2cc_peer_ep_equal(&r->ep_local, &r->ep_remote);
	if (send)
		r2cc_wire_fill(&m, OP_SUSPECT, r);
	const struct r2cc_ctl_dir *dir = r->dir;
	int rank = r->peer_rank;
	pthread_mutex_unlock(&r->mu);
	if (!send)
		return -ENOENT;
	rc = r2cc_wire_send(dir, rank, &m, 1, NULL, 0);
	return rc ? rc : rank;
}

/* Responder, one REQ entry, before the fence: true when it is to be fenced
 * here; *serve when it is served at all. */
static bool serve_check(struct r2cc_rqp *r, const struct inbox *in, const struct rep_wire *m,
			struct outboxes *out, const struct r2cc_ctl_dir *dir, bool *serve)
{
	bool peer_nic_failed = le16toh(m->flags) & WIRE_F_SENDER_NIC_FAILED;
	bool back = le16toh(m->flags) & WIRE_F_FAILBACK;
	int s = load_state(r);
	*serve = false;
	if (s == RQ_FAILED || r->dead) {
		nack(out, dir, in->from_rank, m, -EHOSTDOWN);
		return false;
	}
	if (!connected(r))
		return false; /* still connecting: the initiator asks again */
	const char *gave_up = s != RQ_EXCHANGE && !back ? r2cc_rqp_churning(r) : NULL;
	if (gave_up) {
		nack(out, dir, in->from_rank, m, -ENETUNREACH);
		r2cc_rqp_fail(r, gave_up);
		return false;
	}
	if (s == RQ_EXCHANGE) {
		if (r->initiator && r->pair_id == le64toh(m->pair_id))
			return false;
		if (r->initiator && lower_id(r))
			return false; /* ours wins; the peer serves our REQ */
		if (!r->initiator && (r->pair_id == le64toh(m->pair_id) ||
				      (r->restart && r->stale_pair == le64toh(m->pair_id))))
			return false; /* a re-sent REQ we already answered */
		/* The initiator begins again (its new path's device died): this
		 * side is fenced, and its new path carried nothing. */
		if (!r->initiator && r->restart) {
			*serve = true;
			return false;
		}
		/* Serving another exchange that has not seen its GO: the current path
		 * is live, not fenced, so this REQ waits (the initiator asks again)
		 * until that one ends. */
		if (!r->initiator)
			return false;
		/* theirs wins: drop our new path, serve theirs (already fenced) */
		pthread_mutex_lock(&r->mu);
		r2cc_path_drop_new(r);
		pthread_mutex_unlock(&r->mu);
		*serve = true;
		return false;
	}
	if (s == RQ_HEALTHY || s == RQ_MIGRATED) {
		char why[64];
		if (back)
			snprintf(why, sizeof(why), "failback: peer rank %d's NIC is back",
				 in->from_rank);
		else
			snprintf(why, sizeof(why), "peer notice from rank %d%s", in->from_rank,
				 le16toh(m->flags) & WIRE_F_DECLARED
				     ? " (its NIC is declared failed)"
				     : "");
		/* The state changes under r2cc_eng.mu, as in r2cc_detect: NCCL's thread
		 * may detect r at this moment; then its detection stands, and the REQ
		 * serves it as in RQ_DETECTED. */
		pthread_mutex_lock(&r2cc_eng.mu);
		bool ours = __atomic_compare_exchange_n(&r->state, &s, RQ_DETECTED, false,
							__ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
		if (ours || s == RQ_DETECTED)
			/* The failback's is the peer's: this side returns home too, if it can. */
			r->failback_to = back ? r->orig_nic : NULL;
		if (ours) {
			r->born_late = le16toh(m->flags) & WIRE_F_CREATED_AFTER;
			r2cc_detect_note(r, why, r->status_seen);
			/* the peer's NIC is one R2CC_DRILL cuts (it may tell before this
			 * process's own step) */
			if (r2cc_drill_on && r->incident >= 0 &&
			    r2cc_drill_names(dir, in->from_rank, m->orig_nic))
				r2cc_eng.inc[r->incident].drill = true;
		}
		pthread_mutex_unlock(&r2cc_eng.mu);
		if (!ours && s != RQ_DETECTED)
			return false; /* failed meanwhile: the initiator's next REQ gets a NACK */
	}
	r2cc_rqp_event(r, "qp 0x%x: peer rank %d asks to migrate%s", r->qpn, in->from_rank,
		       back		 ? " (failback: its NIC is back)"
		       : peer_nic_failed ? " (its own NIC failed)"
					 : "");
	/* The peer saw the failure; whether it is this side's NIC only a self-test
	 * can say (a port that is down says so itself), unless the peer knows its
	 * own NIC is the failed one. A failback is no failure. */
	if (!peer_nic_failed && !back)
		r2cc_selftest_start(r->cur_nic, "the peer asks to migrate", false);
	*serve = true;
	return true;
}

/* Responder, one fenced entry: a path on its rail, connected, receives
 * re-posted; its REP (or NACK) into out. */
static void serve_path(struct r2cc_rqp *r, const struct inbox *in, const struct rep_wire *m,
		       struct outboxes *out, const struct r2cc_ctl_dir *dir)
{
	bool peer_nic_failed = le16toh(m->flags) & WIRE_F_SENDER_NIC_FAILED;
	const char *unsafe = r2cc_cts_unsafe(r->cur_sh, r2cc_cts_of(r->q));
	if (unsafe) {
		nack(out, dir, in->from_rank, m, -EOPNOTSUPP);
		r2cc_rqp_fail(r, unsafe);
		return;
	}
	struct peer_path p;
	path_from_wire(&p, m);
	/* The peer's own NIC failed: this side stays where NCCL put it (a fresh QP on
	 * the same NIC), so this node's NICs stay as evenly loaded as they were;
	 * following the peer's new rail instead would pile every moved QP of this
	 * node onto the NICs the peer picked. Otherwise this side's NIC is suspect
	 * too: another one, the least loaded, on the peer's rail among equals. */
	bool back = le16toh(m->flags) & WIRE_F_FAILBACK;
	if (!peer_nic_failed && !back)
		r2cc_left_failed(r);
	/* A move for the peer's own NIC is not this side leaving a failing path: it
	 * does not count towards this QP's churning (the peer's QP counts it). */
	r->churn_skip = peer_nic_failed || back;
	/* A failback: this side's original NIC if it is up, else where it is. */
	struct r2cc_nic *first = NULL, *nic = NULL;
	if (back && r->failback_to && r2cc_nic_usable(r, r->failback_to, true))
		first = r->failback_to;
	else if ((peer_nic_failed || r->failback_to) && r2cc_nic_usable(r, r->cur_nic, true))
		first = r->cur_nic;
	int rc = r2cc_path_on_healthy(r, first, p.nic, &p, &nic);
	if (rc == -ENODEV || (rc && !r->new_qp)) {
		nack(out, dir, in->from_rank, m, rc);
		r2cc_rqp_fail(r, rc != -ENODEV ? "cannot create a QP on the new NIC"
					       : "no healthy NIC left");
		return;
	}
	struct rep_wire rep;
	pthread_mutex_lock(&r->mu);
	set_state(r, RQ_EXCHANGE);
	r->initiator = false;
	r->dir = dir;
	r->peer_rank = in->from_rank;
	r->pair_id = le64toh(m->pair_id);
	r2cc_wire_take_counts(r, m);
	/* The initiator answers with its GO once it has been through everything
	 * it repairs, not just this message. */
	int work = (int)le32toh(m->work);
	r->batch = work > in->n ? work : in->n;
	if (!r->peer_orig_nic[0] || !r->migrations)
		snprintf(r->peer_orig_nic, sizeof(r->peer_orig_nic), "%s", m->orig_nic);
	r2cc_wire_fill(&rep, OP_REP, r);
	rep.pair_id = m->pair_id;
	r2cc_wire_counts(&rep, r);
	r2cc_wire_path(&rep, r);
	r2cc_cts_queries(r); /* of the fenced old path, before the commit replaces it */
	r->t_deadline = now_ns() + exchange_ns(r->batch);
	pthread_mutex_unlock(&r->mu);
	const char *step = "connect";
	if (!rc) { /* sends wait for the initiator's GO */
		step = "re-post on";
		rc = r2cc_path_commit(r, &p, false, NULL);
	}
	if (rc) {
		char why[96];
		snprintf(why, sizeof(why), "cannot %s the new path (%s)", step, strerror(-rc));
		nack(out, dir, in->from_rank, m, rc);
		r2cc_rqp_fail(r, why);
		return;
	}
	struct rep_wire *e = r2cc_out_add(out, dir, in->from_rank);
	if (e) {
		*e = rep;
		/* The initiator's clear-to-send writes, read here after this side's
		 * fence (nothing more lands from the old path), and this side's own. */
		r2cc_cts_answer(out, dir, in->from_rank, in, (int)(m - in->m));
		if (r->ncts_q)
			r2cc_out_cts(out, dir, in->from_rank, r->cts_q, r->ncts_q);
	}
}

/* Responder, every REQ entry of one message: checks, all fences at once, the
 * paths, one message back with every REP and NACK. */
static void serve_batch(const struct inbox *in, struct r2cc_rqp **rq,
			const struct r2cc_ctl_dir *dir)
{
	struct outboxes out = {0};
	bool *serve = calloc((size_t)in->n, sizeof(*serve));
	struct r2cc_rqp **fence_list = calloc((size_t)in->n, sizeof(*fence_list));
	int *frc = calloc((size_t)in->n, sizeof(*frc));
	if (!serve || !fence_list || !frc) {
		free(serve);
		free(fence_list);
		free(frc);
		return; /* the initiator asks again */
	}
	for (int i = 0; i < in->n; i++)
		if (rq[i] && in->m[i].op == OP_REQ &&
		    serve_check(rq[i], in, &in->m[i], &out, dir, &serve[i]))
			fence_list[i] = rq[i];
	r2cc_fence_all(fence_list, in->n, frc);
	for (int i = 0; i < in->n; i++) {
		int rc = frc[i];
		if (rc) {
			nack(&out, dir, in->from_rank, &in->m[i], rc);
			r2cc_rqp_fail(rq[i], r2cc_fence_failure(rc));
			serve[i] = false;
		}
	}
	for (int i = 0; i < in->n; i++)
		if (serve[i])
			serve_path(rq[i], in, &in->m[i], &out, dir);
	r2cc_out_flush(&out);
	/* The initiator's rkeys on its new NIC, before its GO needs them: its REQ
	 * carried them. */
	struct refresh_set rs = {{0}};
	for (int i = 0; i < in->n; i++) {
		struct r2cc_rqp *r = rq[i];
		if (!serve[i] || load_state(r) != RQ_EXCHANGE || r->initiator)
			continue;
		peer_keys(&rs, in, dir, r, r->peer_cur_nic);
		r2cc_rqp_event(r, "qp 0x%x: path %s <-> %s connected, %zu receives re-posted",
			       r->qpn, r->cur_nic->name, r->peer_cur_nic, r->plan.n_recv);
	}
	r2cc_hmap_free(&rs.seen);
	free(serve);
	free(fence_list);
	free(frc);
}

/*
 * Initiator: the REP came, and the new path's device refused its connection, or
 * the GPU flush's helper on it before the commit (it died during the exchange, as
 * a second NIC failing in the repair does). Nothing was posted on either new path
 * yet: the peer is told to wait for another REQ (NACK -EAGAIN: it keeps its fence
 * and its plan), the NIC has failed, and this side begins again from its fenced
 * old path, on another NIC. false: the QP's repair fails (not a dead device, or
 * begun again too often).
 */
#define RESTARTS_MAX 3

static bool restart_initiator(struct r2cc_rqp *r, int rc, const char *what, struct outboxes *out,
			      const struct r2cc_ctl_dir *dir, int rank, const struct rep_wire *m)
{
	if (!r2cc_refused_by_dead_device(rc) || r->restarts >= RESTARTS_MAX || !r->new_ctx)
		return false;
	struct r2cc_nic *nic = r->new_ctx->nic;
	nack(out, dir, rank, m, -EAGAIN);
	r2cc_nic_dead(nic, what, rc);
	pthread_mutex_lock(&r->mu);
	r2cc_path_drop_new(r);
	r->restarts++;
	set_state(r, RQ_DETECTED);
	pthread_mutex_unlock(&r->mu);
	r2cc_rqp_event(r,
		       "qp 0x%x: the new path's device (%s) is dead (%s); asking the peer "
		       "again from another NIC",
		       r->qpn, nic->name, what);
	pthread_mutex_lock(&r2cc_eng.mu);
	r2cc_work_push_locked(r);
	pthread_mutex_unlock(&r2cc_eng.mu);
	return true;
}

/*
 * Responder: the initiator begins again (restart_initiator). This side's new
 * path, current since its REP, carried nothing: what it holds are the plan's
 * receives and NCCL's since, all still posted. They are kept (replan) for the path
 * the next REQ brings; the plan's sends still wait for the GO, and NCCL's posts
 * are held meanwhile. 0, or the repair fails (the path has carried something).
 */
static int restart_responder(struct r2cc_rqp *r)
{
	pthread_mutex_lock(&r->mu);
	int rc = -EPROTO;
	if (r->recv_live && !r->send_live && r->cur_sh &&
	    r2cc_qp_shadow_recv_consumed(r->cur_sh) == 0) {
		if (r->have_replan)
			r2cc_qp_shadow_plan_free(&r->replan);
		r->have_replan = false;
		struct r2cc_qp_shadow_plan_in pin = {.peer_recv_consumed = 0};
		rc = r2cc_qp_shadow_plan_build(r->cur_sh, &pin, &r->replan);
		if (!rc && (r->replan.n_send || r->replan.n_synth)) {
			r2cc_qp_shadow_plan_free(&r->replan);
			rc = -EPROTO;
		}
		if (!rc) {
			r->have_replan = true;
			r->restart = true;
			r->recv_live = false;
			r->stale_pair = r->pair_id;
			r->t_deadline = now_ns() + exchange_ns(r->batch);
		}
	}
	pthread_mutex_unlock(&r->mu);
	if (!rc)
		r2cc_rqp_event(r,
			       "qp 0x%x: the peer's new path died; %zu receives wait for the "
			       "path it asks for next",
			       r->qpn, r->replan.n_recv);
	return rc;
}

/* Initiator, every REP entry of one message: connect each, the peer's keys
 * (which the message carried), re-post everything, one GO with all of them. */
static void on_rep_batch(const struct inbox *in, struct r2cc_rqp **rq,
			 const struct r2cc_ctl_dir *dir)
{
	struct outboxes out = {0};
	struct refresh_set rs = {{0}};
	struct peer_path *p = malloc(sizeof(*p) * (size_t)in->n);
	bool *ok = calloc((size_t)in->n, sizeof(*ok));
	if (!p || !ok) {
		free(p);
		free(ok);
		return; /* the deadline ends these exchanges */
	}
	for (int i = 0; i < in->n; i++) {
		struct r2cc_rqp *r = rq[i];
		const struct rep_wire *m = &in->m[i];
		if (!r || m->op != OP_REP || load_state(r) != RQ_EXCHANGE || !r->initiator ||
		    r->pair_id != le64toh(m->pair_id) || !r->new_qp)
			continue;
		path_from_wire(&p[i], m);
		int rc = r2cc_path_connect(r, &p[i]);
		pthread_mutex_lock(&r->mu);
		r->dir = dir;
		r->peer_rank = in->from_rank;
		r2cc_wire_take_counts(r, m);
		r2cc_cts_take(r, in, i);
		if (!r->migrations)
			snprintf(r->peer_orig_nic, sizeof(r->peer_orig_nic), "%s", m->orig_nic);
		pthread_mutex_unlock(&r->mu);
		if (rc && restart_initiator(r, rc, "connecting a new path on it", &out, dir,
					    in->from_rank, m))
			continue;
		if (rc) {
			char why[96];
			snprintf(why, sizeof(why), "cannot connect the new path (%s)",
				 strerror(-rc));
			r2cc_rqp_fail(r, why);
			continue;
		}
		peer_keys(&rs, in, dir, r, p[i].nic);
		ok[i] = true;
	}
	for (int i = 0; i < in->n; i++) {
		if (!ok[i])
			continue;
		struct r2cc_rqp *r = rq[i];
		uint64_t held = 0;
		int rc = r2cc_path_commit(r, &p[i], true, &held);
		/* The new NIC died after the connect, before anything was posted on the
		 * path (the GPU flush's helpers found it): as a refused connect. */
		if (rc && restart_initiator(r, rc, "a GPU flush helper on it", &out, dir,
					    in->from_rank, &in->m[i]))
			continue;
		if (rc) {
			char why[96];
			snprintf(why, sizeof(why), "cannot re-post on the new path (%s)",
				 strerror(-rc));
			r2cc_rqp_fail(r, why);
			continue;
		}
		struct rep_wire *e = r2cc_out_add(&out, dir, in->from_rank);
		if (e) {
			r2cc_wire_fill(e, OP_GO, r);
			/* the responder's sends wait for this GO: its clear-to-send
			 * writes into this process's memory are settled */
			r2cc_cts_answer(&out, dir, in->from_rank, in, i);
		}
		r2cc_rqp_done(r, held);
	}
	r2cc_out_flush(&out);
	r2cc_hmap_free(&rs.seen);
	free(p);
	free(ok);
}

/* Responder, every GO entry of one message: re-post the sends. */
static void on_go_batch(const struct inbox *in, struct r2cc_rqp **rq)
{
	for (int i = 0; i < in->n; i++) {
		struct r2cc_rqp *r = rq[i];
		const struct rep_wire *m = &in->m[i];
		if (!r || m->op != OP_GO || load_state(r) != RQ_EXCHANGE || r->initiator ||
		    r->pair_id != le64toh(m->pair_id))
			continue;
		uint64_t held = 0;
		pthread_mutex_lock(&r->mu);
		r2cc_cts_take(r, in, i);
		int rc = r2cc_plan_post_sends(r, &held);
		if (!rc)
			set_state(r, RQ_MIGRATED);
		pthread_mutex_unlock(&r->mu);
		if (rc) {
			r2cc_rqp_fail(r, "cannot re-post on the new path");
			continue;
		}
		r2cc_rqp_done(r, held);
	}
}

/* Stalls the peer suspects on these QPs: this side's NIC is tested. */
static void on_suspects(const struct inbox *in, struct r2cc_rqp **rq)
{
	for (int i = 0; i < in->n; i++) {
		struct r2cc_rqp *r = rq[i];
		if (!r || in->m[i].op != OP_SUSPECT)
			continue;
		int st = load_state(r);
		if (st == RQ_HEALTHY || st == RQ_MIGRATED) {
			char why[64];
			snprintf(why, sizeof(why), "rank %d suspects the path", in->from_rank);
			r2cc_selftest_start(r->cur_nic, why, true);
		}
	}
}

static void on_nacks(const struct inbox *in, struct r2cc_rqp **rq)
{
	for (int i = 0; i < in->n; i++) {
		struct r2cc_rqp *r = rq[i];
		const struct rep_wire *m = &in->m[i];
		if (r && m->op == OP_NACK && load_state(r) == RQ_EXCHANGE &&
		    r->pair_id == le64toh(m->pair_id)) {
			if ((int32_t)le32toh((uint32_t)m->status) == -EAGAIN && !r->initiator &&
			    restart_responder(r) == 0)
				continue;
			char why[128];
			snprintf(why, sizeof(why), "the peer cannot repair its side (%s)",
				 strerror(-(int32_t)le32toh((uint32_t)m->status)));
			r2cc_rqp_fail(r, why);
		}
	}
}

/* One message from one peer: every entry's queue pair found (exactly: both
 * ends), then each kind of entry handled together. */
void r2cc_exchange_handle(struct inbox *in)
{
	const struct r2cc_ctl_dir *dir = r2cc_dir_of_job(in->job_id, in->from_rank);
	if (!dir)
		return;
	maps_store(in, dir);
	struct r2cc_rqp **rq = calloc((size_t)in->n, sizeof(*rq));
	if (!rq)
		return;
	bool ops[OP_FAR_REP + 1] = {false};
	struct outboxes gone = {0};
	pthread_mutex_lock(&r2cc_eng.mu);
	for (int i = 0; i < in->n; i++) {
		struct r2cc_rqp *r = rqp_of_msg(&in->m[i]);
		/* The application destroyed this end of the connection: the peer's
		 * repair of its end fails now, with the reason. */
		if (!r && (in->m[i].op == OP_REQ || in->m[i].op == OP_REP) &&
		    destroyed_here(&in->m[i]))
			nack(&gone, dir, in->from_rank, &in->m[i], -ECONNRESET);
		/* Not ours, not connected yet (the initiator asks again), or twice in
		 * one message (the first counts). */
		if (!r || r->busy)
			continue;
		r->busy = true;
		rq[i] = r;
		ops[in->m[i].op] = true;
	}
	pthread_mutex_unlock(&r2cc_eng.mu);
	r2cc_out_flush(&gone);
	if (ops[OP_REQ])
		serve_batch(in, rq, dir);
	if (ops[OP_REP])
		on_rep_batch(in, rq, dir);
	if (ops[OP_GO])
		on_go_batch(in, rq);
	if (ops[OP_NACK])
		on_nacks(in, rq);
	if (ops[OP_SUSPECT])
		on_suspects(in, rq);
	if (ops[OP_FAR_REQ])
		r2cc_far_serve(in, rq, dir);
	if (ops[OP_FAR_REP])
		r2cc_far_answered(in, rq);
	pthread_mutex_lock(&r2cc_eng.mu);
	for (int i = 0; i < in->n; i++)
		if (rq[i])
			rq[i]->busy = false;
	pthread_cond_broadcast(&r2cc_eng.cond);
	pthread_mutex_unlock(&r2cc_eng.mu);
	free(rq);
}

static bool resend_due(const struct r2cc_rqp *r, int64_t t)
{
	if (!r->initiator || r->recv_live)
		return false;
	if (!r->t_sent)
		return true; /* its peer may be known now */
	return t - r->t_sent > RESEND_NS + (int64_t)r->batch * RESEND_PER_QP_NS;
}

/*
 * Exchanges in flight, from the repair thread's idle loop: those past their
 * deadline fail; initiators still unanswered (or whose peer has just been
 * found) send their REQ again, one message per peer; a peer that stays silent
 * for three REQs is asked whether it is alive at all.
 */
void r2cc_exchange_tick(int64_t t)
{
	struct batch late = {0}, again = {0};
	pthread_mutex_lock(&r2cc_eng.mu);
	for (struct r2cc_rqp *r = r2cc_eng.all; r; r = r->next_all) {
		if (r->dead || r->busy || load_state(r) != RQ_EXCHANGE)
			continue;
		if (t > r->t_deadline || resend_due(r, t)) {
			r->busy = true;
			pthread_mutex_unlock(&r2cc_eng.mu);
			r2cc_batch_add(t > r->t_deadline ? &late : &again, r);
			pthread_mutex_lock(&r2cc_eng.mu);
		}
	}
	pthread_mutex_unlock(&r2cc_eng.mu);
	for (int i = 0; i < late.n; i++) {
		struct r2cc_rqp *r = late.r[i];
		r2cc_rqp_fail(r, r->initiator && !r->t_sent
				     ? "the peer process was not found in time"
				     : "the peer did not finish the exchange in time");
	}
	/* Those whose peer is known; the others wait for the search. */
	struct r2cc_rqp **w = again.n ? malloc(sizeof(*w) * (size_t)again.n) : NULL;
	int n = 0;
	for (int i = 0; w && i < again.n; i++) {
		struct r2cc_rqp *r = again.r[i];
		if (r->t_sent || r2cc_rqp_peer(r) == 0)
			w[n++] = r;
	}
	if (w)
		qsort(w, (size_t)n, sizeof(*w), cmp_by_peer);
	struct rep_wire *m = n ? malloc(sizeof(*m) * (size_t)n) : NULL;
	for (int first = 0; m && first < n;) {
		const struct r2cc_ctl_dir *dir = w[first]->dir;
		int rank = w[first]->peer_rank, last = first, k = 0;
		bool asked = false, gone = false;
		while (last < n && w[last]->dir == dir && w[last]->peer_rank == rank)
			last++;
		for (int i = first; i < last; i++) {
			struct r2cc_rqp *r = w[i];
			if (r->t_sent && ++r->resends >= 3 && !asked) {
				asked = true;
				gone = peer_gone(dir, rank);
			}
			if (gone) {
				r2cc_rqp_fail(r,
					      "the peer process is gone (its control plane refuses "
					      "connections)");
				continue;
			}
			pthread_mutex_lock(&r->mu);
			r2cc_wire_fill(&m[k], OP_REQ, r);
			r2cc_wire_counts(&m[k], r);
			m[k].work = htole32((uint32_t)r->batch);
			r2cc_wire_path(&m[k], r);
			r->t_sent = now_ns();
			pthread_mutex_unlock(&r->mu);
			w[first + k++] = r;
		}
		if (k)
			send_reqs(dir, rank, m, k, &w[first]);
		first = last;
	}
	free(m);
	free(w);
	r2cc_batch_release(&late);
	r2cc_batch_release(&again);
}

/* repair/peer.c found a queue pair's peer: a REQ may wait for it. */
void r2cc_exchange_peer_found(void *cookie)
{
	(void)cookie;
	pthread_mutex_lock(&r2cc_eng.mu);
	pthread_cond_signal(&r2cc_eng.cond);
	pthread_mutex_unlock(&r2cc_eng.mu);
}
