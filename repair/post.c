/*
 * Posting on a moved QP's current path, from NCCL's threads: keys translated
 * (lock-free, mr_mirror.h), posts held while the QP is fenced or waits for its
 * peer's keys, refused posts of a dead device taken by the repair. The repair thread
 * fetches missing rkey maps here (keys_tick) without any lock NCCL takes.
 */
#include "repair/engine_priv.h"
#include "shim/fault.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int repair_post_send(struct r2cc_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int repair_post_recv(struct r2cc_qp *q, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);

static int xlate_lkey(struct r2cc_rqp *r, uint32_t lkey, uint32_t len, uint32_t *out)
{
	if (r->cur_nic == r->orig_nic) {
		*out = lkey;
		return 0;
	}
	int rc = r2cc_mr_mirror_lkey(r->orig_nic, lkey, r->cur_nic, out);
	if (rc && len == 0) { /* a zero-length SGE's key is never checked */
		*out = lkey;
		rc = 0;
	}
	return rc;
}

static int xlate_rkey(struct r2cc_rqp *r, uint32_t rkey, uint64_t addr, uint64_t len, uint32_t *out)
{
	if (!strcmp(r->peer_cur_nic, r->peer_orig_nic)) {
		*out = rkey;
		return 0;
	}
	if (r->loopback) /* the "peer" is this process: its own mirrors */
		return r2cc_mr_mirror_rkey(r->orig_nic, rkey, r->cur_nic, out);
	/* From the cache only (-EAGAIN on a miss): a fetch is a network round trip,
	 * which the repair thread makes (r2cc_keys_need), never NCCL's post. */
	return r2cc_mr_mirror_remote_rkey(r->dir, r->peer_rank, r->peer_orig_nic, rkey, addr, len,
					  r->peer_cur_nic, out, 0);
}

/* A send needs a key of the peer that the cache lacks: it is held, and with it
 * every later send of the QP; the repair thread fetches the map (r2cc_keys_tick).
 * Under r->mu. */
void r2cc_keys_need(struct r2cc_rqp *r)
{
	__atomic_store_n(&r->keys_wait, true, __ATOMIC_RELAXED);
	__atomic_store_n(&r2cc_eng.keys_due, 1, __ATOMIC_RELEASE);
}

/* Whether w addresses the peer's memory through an rkey (a write with bytes, or a
 * read), and its SGE bytes in *bytes. */
static bool carries_rkey(const struct ibv_send_wr *w, uint64_t *bytes)
{
	*bytes = 0;
	for (int i = 0; i < w->num_sge; i++)
		*bytes += w->sg_list[i].length;
	return w->opcode == IBV_WR_RDMA_READ ||
	       ((w->opcode == IBV_WR_RDMA_WRITE || w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM) &&
		*bytes);
}

/* One NCCL send request (original keys) onto the current path: recorded in its
 * shadow, keys translated, posted; -EAGAIN (nothing posted) when the peer's key
 * is not in the cache. Under r->mu. */
int r2cc_post_one_send(struct r2cc_rqp *r, const struct ibv_send_wr *w)
{
	struct ibv_send_wr one = *w;
	one.next = NULL;
	int rc = r2cc_qp_shadow_post_send(r->cur_sh, &one, NULL);
	if (rc)
		return rc;
	struct ibv_sge sge[16];
	if (one.num_sge > 16) {
		r2cc_qp_shadow_unpost_send(r->cur_sh, &one, &one);
		return -E2BIG;
	}
	struct ibv_send_wr t = one;
	t.sg_list = sge;
	for (int i = 0; i < one.num_sge && !rc; i++) {
		sge[i] = one.sg_list[i];
		if (!(one.send_flags & IBV_SEND_INLINE))
			rc = xlate_lkey(r, sge[i].lkey, sge[i].length, &sge[i].lkey);
	}
	uint64_t bytes;
	if (carries_rkey(&one, &bytes) && !rc)
		rc = xlate_rkey(r, one.wr.rdma.rkey, one.wr.rdma.remote_addr, bytes,
				&t.wr.rdma.rkey);
	if (!rc) {
		struct ibv_send_wr *bad = NULL;
		rc = r2cc_fault_fire(R2CC_FAULT_POST)
			 ? -EIO
			 : r2cc_from_verbs(r->cur_ctx->post_send(r->cur_qp, &t, &bad));
	}
	if (rc) {
		r2cc_qp_shadow_unpost_send(r->cur_sh, &one, &one);
		return rc;
	}
	r2cc_counter_add(&r->cur_nic->cnt.tx_bytes, bytes);
	r2cc_counter_add(&r->cur_nic->cnt.tx_wrs, 1);
	return 0;
}

int r2cc_post_one_recv(struct r2cc_rqp *r, const struct ibv_recv_wr *w)
{
	struct ibv_recv_wr one = *w;
	one.next = NULL;
	int rc = r2cc_qp_shadow_post_recv(r->cur_sh, &one, NULL);
	if (rc)
		return rc;
	struct ibv_sge sge[16];
	if (one.num_sge > 16) {
		r2cc_qp_shadow_unpost_recv(r->cur_sh, &one, &one);
		return -E2BIG;
	}
	struct ibv_recv_wr t = one;
	t.sg_list = sge;
	for (int i = 0; i < one.num_sge && !rc; i++) {
		sge[i] = one.sg_list[i];
		rc = xlate_lkey(r, sge[i].lkey, sge[i].length, &sge[i].lkey);
	}
	if (!rc) {
		struct ibv_recv_wr *bad = NULL;
		rc = r2cc_fault_fire(R2CC_FAULT_POST)
			 ? -EIO
			 : r2cc_from_verbs(r->cur_ctx->post_recv(r->cur_qp, &t, &bad));
	}
	if (rc) {
		r2cc_qp_shadow_unpost_recv(r->cur_sh, &one, &one);
		return rc;
	}
	r2cc_counter_add(&r->cur_nic->cnt.recv_posted, 1);
	return 0;
}

int r2cc_hold_send(struct r2cc_rqp *r, const struct ibv_send_wr *w)
{
	size_t inl = 0;
	if (w->send_flags & IBV_SEND_INLINE)
		for (int i = 0; i < w->num_sge; i++)
			inl += w->sg_list[i].length;
	if (w->num_sge < 0 || w->num_sge > 16)
		return -EINVAL;
	struct held_send *h =
	    malloc(sizeof(*h) + (size_t)w->num_sge * sizeof(struct ibv_sge) + inl);
	if (!h)
		return -ENOMEM;
	h->wr = *w;
	h->wr.next = NULL;
	h->wr.sg_list = h->sge;
	uint8_t *p = (uint8_t *)&h->sge[w->num_sge];
	for (int i = 0; i < w->num_sge; i++) {
		h->sge[i] = w->sg_list[i];
		if (inl) { /* the source may change after the call: keep the bytes */
			memcpy(p, (const void *)(uintptr_t)w->sg_list[i].addr,
			       w->sg_list[i].length);
			h->sge[i].addr = (uintptr_t)p;
			p += w->sg_list[i].length;
		}
	}
	h->next = NULL;
	*r->hs_tail = h;
	r->hs_tail = &h->next;
	return 0;
}

int r2cc_hold_recv(struct r2cc_rqp *r, const struct ibv_recv_wr *w)
{
	if (w->num_sge < 0 || w->num_sge > 16)
		return -EINVAL;
	struct held_recv *h = malloc(sizeof(*h) + (size_t)w->num_sge * sizeof(struct ibv_sge));
	if (!h)
		return -ENOMEM;
	h->wr = *w;
	h->wr.next = NULL;
	h->wr.sg_list = h->sge;
	/* NCCL's receives carry no SGE and may have no list at all. */
	if (w->num_sge)
		memcpy(h->sge, w->sg_list, (size_t)w->num_sge * sizeof(struct ibv_sge));
	h->next = NULL;
	*r->hr_tail = h;
	r->hr_tail = &h->next;
	return 0;
}

/*
 * Whether a post on one queue (send or receive) of r, in state s, is held rather
 * than posted: while fenced; during the exchange until that queue's new path is
 * live; before it (the failure seen, or a declared QP's first post) once anything
 * is held on the queue or everything must be. Under r->mu.
 */
static bool hold_now(const struct r2cc_rqp *r, int s, bool live, bool queued)
{
	if (s == RQ_FENCING || queued) /* (queued: posts keep their order) */
		return true;
	if (s == RQ_EXCHANGE)
		return !live;
	return s != RQ_MIGRATED && r->hold_all;
}

/* NCCL's first post on a QP of a declared-failed NIC: its direction is known now
 * (receivers post a receive first); hold everything and move it. Under r->mu. */
static void declared_first_post(struct r2cc_rqp *r, bool recv)
{
	if (!r->declared_pending)
		return;
	r->declared_pending = false;
	r->hold_all = true;
	if (recv)
		r2cc_counter_add(&r->q->other_rx, 1);
	r2cc_detect(r, "declared failed (R2CC_FAILED_NODE/R2CC_FAILED_HCA)", 0);
}

/*
 * A post that the device of `nic` refused because the device is dead: that NIC has
 * failed (every QP on it is detected), and r, taken by the repair, holds what it is
 * asked to post until its new path is live; or the repair already moved r off that
 * NIC (another QP's detection got there first), and the requests go to the new
 * path. They never reached the dead QP (the refused ones are not in its shadow), so
 * this is their only post. false when no repair took r (the error is NCCL's).
 * Slow path: it follows a failure, and waits on nothing.
 */
bool r2cc_refused_take(struct r2cc_rqp *r, int rc, struct r2cc_nic *nic)
{
	if (!r2cc_refused_by_dead_device(rc) || !nic)
		return false;
	r2cc_nic_dead(nic, "a post on it", rc);
	pthread_mutex_lock(&r->mu);
	int s = load_state(r);
	bool moved = s == RQ_MIGRATED && r->cur_nic != nic;
	bool taken = moved || s == RQ_DETECTED || s == RQ_FENCING || s == RQ_EXCHANGE;
	if (taken && !moved)
		r->hold_all = true;
	pthread_mutex_unlock(&r->mu);
	return taken;
}

static struct r2cc_nic *cur_nic_of(const struct r2cc_qp *q)
{
	return q->rep ? __atomic_load_n(&q->rep->cur_nic, __ATOMIC_ACQUIRE) : NULL;
}

/*
 * A post a dead device refuses fails that NIC, and the post is made again, held
 * or on the QP's next path. The NIC is read before each try: the path may switch
 * during one (the exchange commits), and the device it switched to may be dead
 * too, which the next try finds out. Bounded: every try but the last fails a NIC
 * or finds the QP moved on.
 */
#define REFUSED_TRIES (R2CC_MAX_NICS + 2)

int r2cc_repair_post_send(struct r2cc_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	int rc = 0;
	for (int i = 0; i < REFUSED_TRIES; i++) {
		struct r2cc_nic *at = cur_nic_of(q);
		rc = repair_post_send(q, wr, bad);
		if (!rc || !q->rep || !r2cc_refused_take(q->rep, rc, at))
			break;
		wr = *bad;
	}
	return rc;
}

int r2cc_repair_post_recv(struct r2cc_qp *q, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	int rc = 0;
	for (int i = 0; i < REFUSED_TRIES; i++) {
		struct r2cc_nic *at = cur_nic_of(q);
		rc = repair_post_recv(q, wr, bad);
		if (!rc || !q->rep || !r2cc_refused_take(q->rep, rc, at))
			break;
		wr = *bad;
	}
	return rc;
}

int r2cc_repair_send_refused(struct r2cc_qp *q, int rc, struct ibv_send_wr **bad)
{
	return q->rep && r2cc_refused_take(q->rep, rc, q->ctx->nic)
		   ? r2cc_repair_post_send(q, *bad, bad)
		   : rc;
}

int r2cc_repair_recv_refused(struct r2cc_qp *q, int rc, struct ibv_recv_wr **bad)
{
	return q->rep && r2cc_refused_take(q->rep, rc, q->ctx->nic)
		   ? r2cc_repair_post_recv(q, *bad, bad)
		   : rc;
}

/* One of NCCL's send requests onto r as r's state has it: on its QP once repair has
 * failed it, held, or on its current path. Under r->mu. */
int r2cc_send_one_locked(struct r2cc_rqp *r, const struct ibv_send_wr *w)
{
	int s = load_state(r), rc;
	if (s == RQ_FAILED) {
		struct ibv_send_wr one = *w, *b = NULL;
		one.next = NULL;
		rc = r2cc_from_verbs(r->orig_ctx->post_send(r->q->qp, &one, &b));
	} else if (hold_now(r, s, r->send_live, r->hs_head != NULL)) {
		rc = r2cc_hold_send(r, w);
	} else if ((rc = r2cc_post_one_send(r, w)) == -EAGAIN) {
		rc = r2cc_hold_send(r, w);
		r2cc_keys_need(r);
	}
	return rc;
}

static int repair_post_send(struct r2cc_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct r2cc_rqp *r = q->rep;
	if (!r)
		return r2cc_from_verbs(q->ctx->post_send(q->qp, wr, bad));
	pthread_mutex_lock(&r->mu);
	declared_first_post(r, false);
	r2cc_app_flush_run(r);
	int rc = 0;
	struct ibv_send_wr *w = wr;
	for (; w; w = w->next) {
		if (__atomic_load_n(&r->gf, __ATOMIC_RELAXED) && load_state(r) != RQ_FAILED &&
		    r2cc_gflush_take(r, w))
			continue;
		if ((rc = r2cc_send_one_locked(r, w)))
			break; /* *bad is the request that failed */
	}
	pthread_mutex_unlock(&r->mu);
	if (rc) {
		*bad = w;
		return rc;
	}
	return 0;
}

static int repair_post_recv(struct r2cc_qp *q, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct r2cc_rqp *r = q->rep;
	if (!r)
		return r2cc_from_verbs(q->ctx->post_recv(q->qp, wr, bad));
	pthread_mutex_lock(&r->mu);
	declared_first_post(r, true);
	int s = load_state(r), rc = 0;
	struct ibv_recv_wr *w = wr;
	for (; w && !rc; w = w->next) {
		if (s == RQ_FAILED) {
			struct ibv_recv_wr one = *w, *b = NULL;
			one.next = NULL;
			rc = r2cc_from_verbs(r->orig_ctx->post_recv(q->qp, &one, &b));
		} else if (hold_now(r, s, r->recv_live, r->hr_head != NULL)) {
			rc = r2cc_hold_recv(r, w);
		} else {
			rc = r2cc_post_one_recv(r, w);
		}
		if (rc)
			break;
	}
	pthread_mutex_unlock(&r->mu);
	if (rc) {
		*bad = w;
		return rc;
	}
	return 0;
}

/* Under r->mu. */
int r2cc_held_flush_recvs(struct r2cc_rqp *r)
{
	int rc = 0;
	while (r->hr_head && !rc) {
		struct held_recv *h = r->hr_head;
		rc = r2cc_post_one_recv(r, &h->wr);
		if (rc)
			break;
		r->hr_head = h->next;
		free(h);
	}
	if (!r->hr_head)
		r->hr_tail = &r->hr_head;
	return rc;
}

int r2cc_held_flush_sends(struct r2cc_rqp *r, uint64_t *n)
{
	int rc = 0;
	while (r->hs_head && !rc) {
		struct held_send *h = r->hs_head;
		rc = r2cc_post_one_send(r, &h->wr);
		if (rc == -EAGAIN) { /* it and the rest wait for the peer's keys */
			r2cc_keys_need(r);
			return 0;
		}
		if (rc)
			break;
		r->hs_head = h->next;
		free(h);
		(*n)++;
	}
	if (!r->hs_head)
		r->hs_tail = &r->hs_head;
	return rc;
}

#define KEYS_TRIES 3 /* fetches of a map that fail in a row before the QP's error */

/* Whether a held send's rkey is still not in the cache. Under r->mu. */
static bool held_keys_missing(struct r2cc_rqp *r)
{
	for (const struct held_send *h = r->hs_head; h; h = h->next) {
		const struct ibv_send_wr *w = &h->wr;
		uint64_t bytes;
		uint32_t k;
		if (carries_rkey(w, &bytes) &&
		    xlate_rkey(r, w->wr.rdma.rkey, w->wr.rdma.remote_addr, bytes, &k) == -EAGAIN)
			return true;
	}
	return false;
}

/*
 * The QPs whose sends wait for their peer's rkey map (r2cc_keys_need): the map fetched
 * (the network round trip, here and without any lock NCCL takes), then the held
 * sends posted. A key still missing from a map just fetched is not the peer's, and
 * a map that cannot be fetched KEYS_TRIES times in a row (2 s each) gives up: the
 * QP's clean error either way. Repair thread, without r2cc_eng.mu.
 */
void r2cc_keys_tick(void)
{
	if (!__atomic_exchange_n(&r2cc_eng.keys_due, 0, __ATOMIC_ACQ_REL))
		return;
	struct r2cc_rqp *list[64];
	int n = 0;
	bool more = false;
	pthread_mutex_lock(&r2cc_eng.mu);
	for (struct r2cc_rqp *r = r2cc_eng.all; r; r = r->next_all) {
		if (r->dead || r->busy ||
		    !(__atomic_load_n(&r->keys_wait, __ATOMIC_RELAXED) ||
		      __atomic_load_n(&r->flush_err, __ATOMIC_RELAXED)))
			continue;
		if (n == (int)(sizeof(list) / sizeof(list[0]))) {
			more = true;
			break;
		}
		r->busy = true;
		list[n++] = r;
	}
	pthread_mutex_unlock(&r2cc_eng.mu);
	for (int i = 0; i < n; i++) {
		struct r2cc_rqp *r = list[i];
		char from[R2CC_NIC_NAME_MAX], to[R2CC_NIC_NAME_MAX];
		pthread_mutex_lock(&r->mu);
		snprintf(from, sizeof(from), "%s", r->peer_orig_nic);
		snprintf(to, sizeof(to), "%s", r->peer_cur_nic);
		pthread_mutex_unlock(&r->mu);
		int rc = __atomic_exchange_n(&r->flush_err, 0, __ATOMIC_RELAXED);
		int frc = rc ? 0
			  : r->dir
			      ? r2cc_mr_mirror_remote_refresh(r->dir, r->peer_rank, from, to, 2000)
			      : -ENOENT;
		pthread_mutex_lock(&r->mu);
		int s = load_state(r);
		uint64_t posted = 0;
		/* (in another repair now: its commit posts them, or asks again) */
		bool flush = !rc && r->keys_wait &&
			     (s == RQ_MIGRATED || (s == RQ_EXCHANGE && r->send_live)),
		     still = false;
		if (flush && !held_keys_missing(r)) {
			/* NCCL's thread posts them (r2cc_app_flush_need), or here if it
			 * cannot be asked to */
			__atomic_store_n(&r->keys_wait, false, __ATOMIC_RELAXED);
			if (!r2cc_app_flush_need(r)) {
				rc = r2cc_held_flush_sends(r, &posted);
				__atomic_add_fetch(&r2cc_eng.reposts_repair, posted,
						   __ATOMIC_RELAXED);
			}
			still = r->keys_wait;
		} else if (flush) {
			still = true;
		}
		r->keys_tries = still && frc ? r->keys_tries + 1 : 0;
		/* The new path's device is dead: the QP moves again, and the held sends
		 * (the refused one first) wait for that path. During the exchange, once
		 * it has ended (r2cc_rqp_done). */
		struct r2cc_nic *dead = rc && r2cc_refused_by_dead_device(rc) ? r->cur_nic : NULL;
		if (dead && load_state(r) == RQ_EXCHANGE)
			__atomic_store_n(&r->new_path_err, IBV_WC_RETRY_EXC_ERR, __ATOMIC_RELEASE);
		bool give_up = (rc && !dead) || (still && (!frc || r->keys_tries >= KEYS_TRIES));
		if (still && !give_up)
			__atomic_store_n(&r2cc_eng.keys_due, 1,
					 __ATOMIC_RELEASE); /* again next tick */
		pthread_mutex_unlock(&r->mu);
		if (dead)
			r2cc_nic_dead(dead, "a re-post on it", rc);
		pthread_mutex_lock(&r2cc_eng.mu);
		if (r->incident >= 0 &&
		    r->incident < r2cc_eng.ninc) { /* the repair that moved it */
			r2cc_eng.inc[r->incident].maps_later += frc == 0;
			r2cc_eng.inc[r->incident].held += posted;
		}
		pthread_mutex_unlock(&r2cc_eng.mu);
		if (give_up) {
			char why[160];
			if (rc)
				snprintf(why, sizeof(why), "a held send could not be posted (%s)",
					 strerror(-rc));
			else if (!frc)
				snprintf(why, sizeof(why),
					 "a send's rkey is not registered by rank %d on %s",
					 r->peer_rank, from);
			else
				snprintf(why, sizeof(why), "rank %d's rkey map %s -> %s: %s",
					 r->peer_rank, from, to, strerror(-frc));
			R2CC_WARN("repair: qp 0x%x: %s; NCCL gets its error", r->qpn, why);
			r2cc_rqp_fail(r, why);
		}
	}
	pthread_mutex_lock(&r2cc_eng.mu);
	for (int i = 0; i < n; i++)
		list[i]->busy = false;
	pthread_cond_broadcast(&r2cc_eng.cond);
	pthread_mutex_unlock(&r2cc_eng.mu);
	if (more)
		__atomic_store_n(&r2cc_eng.keys_due, 1, __ATOMIC_RELEASE);
}
