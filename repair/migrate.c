/*
 * The commit of a move: the exactly-once plan (qp_shadow.h) from both sides'
 * counts, the switch to the new path, its receives re-posted, its sends re-posted
 * on NCCL's own thread (app_flush), then NCCL's held posts; and the end of a
 * repair, done or failed (NCCL's clean error). Also churn limits, and the
 * migration of NCCL's loopback (GPU flush) QPs.
 */
#include "repair/engine_priv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/*
 * The receive completions of messages the peer retired and this side never
 * counted: its device lost them (repair/model/qp_shadow.h), made from the peer's
 * record of those messages into wc. How many, or -EPROTO when the record does
 * not reach back to this side's count. Under r->mu, fenced.
 */
static int recv_lost(struct r2cc_rqp *r, struct ibv_wc *wc)
{
	uint64_t k = r2cc_qp_shadow_recv_consumed(r->cur_sh);
	if (r->peer_sent <= k)
		return 0;
	uint64_t first = r->peer_sent - (uint64_t)r->npeer_lost + 1;
	if (k + 1 < first)
		return -EPROTO;
	int n = 0;
	for (uint64_t m = k + 1; m <= r->peer_sent; m++, n++) {
		int rc =
		    r2cc_qp_shadow_recv_lost(r->cur_sh, &r->peer_lost[m - first], r->qpn, &wc[n]);
		if (rc)
			return rc;
	}
	R2CC_WARN("repair: qp 0x%x: %d receive completion(s) lost by %s (the peer's sends were "
		  "acknowledged); made from the peer's record",
		  r->qpn, n, r->cur_nic->name);
	r->k_local = k + (uint64_t)n;
	return n;
}

/* The plan from the drained current path and the peer's count; the receive
 * completions this side's device lost and the plan's synthesised completions go to
 * NCCL first. Under r->mu. */
static int make_plan(struct r2cc_rqp *r)
{
	struct ibv_wc lost[R2CC_SHADOW_LOST_MAX];
	int nlost = recv_lost(r, lost);
	if (nlost < 0)
		return nlost;
	struct r2cc_qp_shadow_plan_in in = {.peer_recv_consumed = r->k_peer, .lost_sent = true};
	int rc = r2cc_qp_shadow_plan_build(r->cur_sh, &in, &r->plan);
	if (rc)
		return rc;
	struct r2cc_vcq *v = r->vcq->v;
	pthread_mutex_lock(&v->mu);
	if (!r2cc_stash_room(v, r->plan.n_synth + (size_t)nlost)) {
		pthread_mutex_unlock(&v->mu);
		r2cc_qp_shadow_plan_free(&r->plan);
		return -ENOMEM;
	}
	r->have_plan = true;
	r->lost_synth = nlost;
	for (int i = 0; i < nlost; i++)
		r2cc_stash_push(v, &lost[i]);
	for (size_t i = 0; i < r->plan.n_synth; i++) {
		struct ibv_wc wc;
		r2cc_qp_shadow_plan_wc(&r->plan, i, r->qpn, &wc);
		r2cc_stash_push(v, &wc);
	}
	pthread_mutex_unlock(&v->mu);
	return 0;
}

/* The new path becomes the current one (its completions registered by
 * register_path()). Under r->mu. */
static void switch_path(struct r2cc_rqp *r, const struct peer_path *p, struct ibv_qp **old_qp,
			struct pcq **old_pcq, struct r2cc_qp_shadow **old_sh)
{
	struct r2cc_vcq *v = r->vcq->v;
	/* Off the declared NIC now (the peer may have moved it first): NCCL's
	 * first post has nothing left to move. */
	r->declared_pending = false;
	*old_qp = r->cur_cq ? r->cur_qp : NULL;
	*old_pcq = r->cur_pcq;
	*old_sh = r->cur_sh != (r->q ? r->q->shadow : NULL) ? r->cur_sh : NULL;
	pthread_mutex_lock(&v->mu);
	if (*old_qp && r2cc_hmap_get(&r->cur_pcq->by_qpn, (*old_qp)->qp_num) == r)
		r2cc_hmap_del(&r->cur_pcq->by_qpn, (*old_qp)->qp_num);
	r->cur_qp = r->new_qp;
	r->cur_cq = r->new_cq;
	r->cur_pcq = r->new_pcq;
	r->cur_ctx = r->new_ctx;
	__atomic_store_n(&r->cur_nic, r->new_ctx->nic, __ATOMIC_RELEASE);
	r->cur_sh = r->new_sh;
	__atomic_store_n(&r->new_path_err, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&r->switched, 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&v->mu);
	r->new_qp = NULL;
	r->new_cq = NULL;
	r->new_pcq = NULL;
	r->new_sh = NULL;
	snprintf(r->peer_cur_nic, sizeof(r->peer_cur_nic), "%s", p->nic);
	r->recv_live = r->send_live = false;
	r->hold_all = false;
}

/* The plan's receives from i on held ahead of NCCL's held ones, in their order. */
static int hold_plan_recvs(struct r2cc_rqp *r, const struct r2cc_qp_shadow_plan *pl, size_t i)
{
	struct held_recv *rest = r->hr_head, **rest_tail = r->hr_tail;
	r->hr_head = NULL;
	r->hr_tail = &r->hr_head;
	int rc = 0;
	for (; i < pl->n_recv && !rc; i++) {
		struct ibv_sge sge[16];
		struct ibv_recv_wr w;
		r2cc_qp_shadow_plan_recv_wr(pl, i, &w, sge);
		rc = r2cc_hold_recv(r, &w);
	}
	*r->hr_tail = rest;
	if (rest)
		r->hr_tail = rest_tail;
	return rc;
}

/* The plan's receives, or after a restart those the previous new path held, then
 * NCCL's held ones. A receive the new path's device refuses (it died after the
 * connection) is held with the rest, and the path is left to fail (r->refused_nic):
 * the QP moves again with them once this repair is done. */
static int post_plan_recvs(struct r2cc_rqp *r)
{
	const struct r2cc_qp_shadow_plan *pl = r->have_replan ? &r->replan : &r->plan;
	for (size_t i = 0; i < pl->n_recv; i++) {
		struct ibv_sge sge[16];
		struct ibv_recv_wr w;
		if (pl->recv[i].num_sge > 16)
			return -E2BIG;
		r2cc_qp_shadow_plan_recv_wr(pl, i, &w, sge);
		int rc = r2cc_post_one_recv(r, &w);
		if (rc && r2cc_refused_by_dead_device(rc)) {
			r->refused_nic = r->cur_nic;
			return hold_plan_recvs(r, pl, i);
		}
		if (rc)
			return rc;
	}
	int rc = r2cc_held_flush_recvs(r);
	if (rc && r2cc_refused_by_dead_device(rc)) { /* the refused one and the rest stay held */
		r->refused_nic = r->cur_nic;
		return 0;
	}
	if (!rc)
		r->recv_live = true;
	return rc;
}

/* The plan's sends from i on are held ahead of NCCL's held posts, in their order,
 * and the path is live (what follows is held behind them). Under r->mu. */
static int hold_plan_sends(struct r2cc_rqp *r, size_t i)
{
	struct held_send *rest = r->hs_head, **rest_tail = r->hs_tail;
	r->hs_head = NULL;
	r->hs_tail = &r->hs_head;
	int rc = 0;
	for (; i < r->plan.n_send && !rc; i++) {
		struct ibv_sge sge[17];
		struct ibv_send_wr w;
		r2cc_qp_shadow_plan_send_wr(&r->plan, i, &w, sge);
		rc = r2cc_hold_send(r, &w);
	}
	*r->hs_tail = rest;
	if (rest)
		r->hs_tail = rest_tail;
	if (rc)
		return rc;
	r->send_live = true;
	return 0;
}

/*
 * The re-posts of a migration go out on NCCL's own thread, never on the repair
 * thread: a re-posted clear-to-send write reads its FIFO element when it is
 * posted, and NCCL's thread rewrites those elements only between its own calls
 * (it fills one, then posts it), so a re-post there never carries a torn element
 * (repair/model/qp_shadow.h, "Clear-to-send"). The plan's sends are held in front of
 * NCCL's held posts, and NCCL's next post on the QP or poll of its CQ (which it
 * makes while it waits for them) posts them all, in order. false (post them
 * here) only when the CQ's list cannot grow. Under r->mu.
 */
bool r2cc_app_flush_need(struct r2cc_rqp *r)
{
	if (r->app_flush)
		return true;
	struct r2cc_vcq *v = r->vcq ? r->vcq->v : NULL;
	if (!v)
		return false;
	pthread_mutex_lock(&v->mu);
	if (v->nflush == v->capflush) {
		int cap = v->capflush ? 2 * v->capflush : 16;
		struct r2cc_rqp **f = realloc(v->flush, (size_t)cap * sizeof(*f));
		if (!f) {
			pthread_mutex_unlock(&v->mu);
			return false;
		}
		v->flush = f;
		v->capflush = cap;
	}
	v->flush[v->nflush] = r;
	__atomic_store_n(&v->nflush, v->nflush + 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&v->mu);
	r->app_flush = true;
	return true;
}

/* NCCL's thread, under r->mu: the held sends posted (r2cc_app_flush_need). A key the
 * cache lacks holds the rest (r2cc_keys_need); any other error is the QP's, which the
 * repair thread gives it (r2cc_keys_tick). */
void r2cc_app_flush_run(struct r2cc_rqp *r)
{
	if (!r->app_flush || r->dead)
		return;
	r->app_flush = false;
	/* Another repair took the QP meanwhile (its path fenced or being replaced):
	 * they stay held, and that repair's commit asks again (r2cc_app_flush_need). */
	int s = load_state(r);
	if (s != RQ_MIGRATED && !(s == RQ_EXCHANGE && r->send_live))
		return;
	uint64_t n = 0;
	int rc = r2cc_held_flush_sends(r, &n);
	__atomic_add_fetch(&r2cc_eng.reposts_nccl, n, __ATOMIC_RELAXED);
	if (rc) {
		__atomic_store_n(&r->flush_err, rc, __ATOMIC_RELAXED);
		__atomic_store_n(&r2cc_eng.keys_due, 1, __ATOMIC_RELEASE);
	}
}

/* The poll side of r2cc_app_flush_run: every QP of this CQ waiting for it. NCCL's
 * thread, without locks held. */
void r2cc_app_flush_poll(struct r2cc_vcq *v)
{
	if (r2cc_likely(!__atomic_load_n(&v->nflush, __ATOMIC_ACQUIRE)))
		return;
	for (;;) {
		struct r2cc_rqp *batch[16];
		int n = 0;
		pthread_mutex_lock(&v->mu);
		while (n < 16 && v->nflush) {
			batch[n++] = v->flush[v->nflush - 1];
			__atomic_store_n(&v->nflush, v->nflush - 1, __ATOMIC_RELAXED);
		}
		pthread_mutex_unlock(&v->mu);
		if (!n)
			return;
		/* (records outlive their QPs: r->dead says it is gone) */
		for (int i = 0; i < n; i++) {
			pthread_mutex_lock(&batch[i]->mu);
			r2cc_app_flush_run(batch[i]);
			pthread_mutex_unlock(&batch[i]->mu);
		}
	}
}

int r2cc_plan_post_sends(struct r2cc_rqp *r, uint64_t *held)
{
	r2cc_cts_drop(r); /* the clear-to-send writes the peer found landed */
	if (r2cc_app_flush_need(r))
		return hold_plan_sends(r, 0);
	for (size_t i = 0; i < r->plan.n_send; i++) {
		struct ibv_sge sge[17];
		struct ibv_send_wr w;
		if (r->plan.send[i].num_sge > 16)
			return -E2BIG;
		r2cc_qp_shadow_plan_send_wr(&r->plan, i, &w, sge);
		int rc = r2cc_post_one_send(r, &w);
		if (rc == -EAGAIN) {
			r2cc_keys_need(r);
			return hold_plan_sends(r, i);
		}
		if (rc)
			return rc;
		__atomic_add_fetch(&r2cc_eng.reposts_repair, 1, __ATOMIC_RELAXED);
	}
	uint64_t before = *held;
	int rc = r2cc_held_flush_sends(r, held);
	__atomic_add_fetch(&r2cc_eng.reposts_repair, *held - before, __ATOMIC_RELAXED);
	if (!rc)
		r->send_live = true;
	return rc;
}

/* The new path's QP number in its shared CQ, so that its completions reach r;
 * before anything else of the switch, because this may run out of memory: a
 * path whose completions could not be routed must not become current (they
 * would be lost). Nothing completes on the path yet. Under r->mu. */
static int register_path(struct r2cc_rqp *r)
{
	pthread_mutex_lock(&r->vcq->v->mu);
	int rc = r2cc_hmap_put(&r->new_pcq->by_qpn, r->new_qp->qp_num, r);
	pthread_mutex_unlock(&r->vcq->v->mu);
	return rc;
}

/*
 * The plan against the peer's count (its synthesised completions queued for NCCL),
 * the new path made current, the receives re-posted and, with sends, the sends and
 * NCCL's held posts too: then the QP has migrated. The previous private path, if
 * any, is destroyed after. 0 or a negative errno. A dead device's refusal (EIO,
 * ENETDOWN) comes back only from before anything is posted on the new path (the GPU
 * flush's helper on its NIC), which the initiator begins again from; refusals after
 * the switch are held, and the NIC fails once the repair is done (r->refused_nic).
 */
int r2cc_path_commit(struct r2cc_rqp *r, const struct peer_path *p, bool sends, uint64_t *held)
{
	struct ibv_qp *oq = NULL;
	struct pcq *oc = NULL;
	struct r2cc_qp_shadow *osh = NULL;
	/* GPU flush QPs of r's CQ read through its new NIC too, before data arrives there;
	 * nothing is posted on the new path before they do */
	int frc = r2cc_gflush_cover(r, r->new_ctx ? r->new_ctx->nic : NULL);
	if (frc)
		return frc;
	pthread_mutex_lock(&r->mu);
	int rc = register_path(r);
	if (!rc && !r->restart) /* a restart keeps its plan (exchange.c) */
		rc = make_plan(r);
	if (!rc) {
		switch_path(r, p, &oq, &oc, &osh);
		rc = post_plan_recvs(r);
		r->restart = false;
	}
	if (!rc && sends) {
		rc = r2cc_plan_post_sends(r, held);
		if (!rc)
			set_state(r, RQ_MIGRATED);
	}
	struct r2cc_nic *refused = r->refused_nic;
	r->refused_nic = NULL;
	if (refused) /* its repair once this one is done (r2cc_rqp_done) */
		__atomic_store_n(&r->new_path_err, IBV_WC_RETRY_EXC_ERR, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&r->mu);
	if (oq || oc)
		r2cc_path_put(r, oq, oc);
	if (osh)
		r2cc_qp_shadow_destroy(osh);
	if (refused)
		r2cc_nic_dead(refused, "re-posting on a new path on it", -EIO);
	return rc;
}

/* Repair is impossible: NCCL gets one error completion for the QP and the held
 * posts flush on its (ERR) QP. */
void r2cc_rqp_fail(struct r2cc_rqp *r, const char *why)
{
	if (r->dead || !r->q)
		return;
	/* NCCL's posts and polls on this QP and its CQ go through R2CC from now on:
	 * the error below waits in the CQ's stash. */
	r2cc_cq_gates_close(&r->q->gate, &r->vcq->gate);
	pthread_mutex_lock(&r->mu);
	if (load_state(r) == RQ_FAILED || r->dead) {
		pthread_mutex_unlock(&r->mu);
		return;
	}
	R2CC_WARN("repair: qp 0x%x on %s cannot be repaired (%s); NCCL gets the error", r->qpn,
		  r->orig_nic->name, why);
	r2cc_path_drop_new(r);
	r2cc_place_ledger_move(r, NULL, 0);
	r->failback_to = NULL;
	set_state(r, RQ_FAILED);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
	r2cc_eng.v.modify_qp(r->q->qp, &a, IBV_QP_STATE);
	struct ibv_wc wc;
	memset(&wc, 0, sizeof(wc));
	wc.status = r->status_seen ? (enum ibv_wc_status)r->status_seen : IBV_WC_RETRY_EXC_ERR;
	wc.qp_num = r->qpn;
	wc.opcode = IBV_WC_RDMA_WRITE;
	pthread_mutex_lock(&r->vcq->v->mu);
	/* Into the entry reserved for it when the QP was created. */
	bool room = r->stash_held;
	r2cc_stash_release_locked(r);
	if (room || r2cc_stash_room(r->vcq->v, 1))
		r2cc_stash_push(r->vcq->v, &wc);
	pthread_mutex_unlock(&r->vcq->v->mu);
	while (r->hr_head) {
		struct held_recv *h = r->hr_head;
		struct ibv_recv_wr *b;
		r->hr_head = h->next;
		r->orig_ctx->post_recv(r->q->qp, &h->wr, &b);
		free(h);
	}
	r->hr_tail = &r->hr_head;
	while (r->hs_head) {
		struct held_send *h = r->hs_head;
		struct ibv_send_wr *b;
		r->hs_head = h->next;
		r->orig_ctx->post_send(r->q->qp, &h->wr, &b);
		free(h);
	}
	r->hs_tail = &r->hs_head;
	pthread_mutex_unlock(&r->mu);
	pthread_mutex_lock(&r2cc_eng.mu);
	if (r->incident >= 0)
		r2cc_eng.inc[r->incident].failed++;
	if (r->incident >= 0)
		r2cc_incident_progress(r->incident);
	r->born_late = false;
	pthread_mutex_unlock(&r2cc_eng.mu);
	r2cc_rqp_event(r, "qp 0x%x: repair impossible: %s", r->qpn, why);
}

void r2cc_rqp_done(struct r2cc_rqp *r, uint64_t held)
{
	int64_t t = now_ns();
	bool back = r->failback_to != NULL;
	/* Home again: no longer one of the QPs the node moved onto a NIC. */
	if (r->cur_nic == r->orig_nic)
		r2cc_place_ledger_move(r, NULL, 0);
	pthread_mutex_lock(&r2cc_eng.mu);
	/* A declared move is no failure of a path, a failback none either, and the
	 * failure of a path a failback made is the NIC's flap, which its hold-down
	 * bounds: none of them counts towards churning. */
	if ((r->incident < 0 || !r2cc_eng.inc[r->incident].declared) && !r->churn_skip && !back &&
	    !r->back_path)
		r->recent[r->churn++ % CHURN_RING] = t;
	r->churn_skip = false;
	r->back_path = back && r->cur_nic == r->orig_nic;
	r->failback_to = NULL;
	r->migrations++;
	r->moved_at = t;
	if (r->cur_sh) {
		uint64_t posted;
		r2cc_qp_shadow_signalled(r->cur_sh, &posted, &r->moved_retired);
	}
	if (r->incident >= 0) {
		struct incident *in = &r2cc_eng.inc[r->incident];
		in->migrated++;
		in->bytes_reposted += r->plan.bytes_reposted;
		in->bytes_saved += r->plan.bytes_saved;
		in->synth += r->plan.completions_synth + (uint64_t)r->lost_synth;
		in->held += held;
		in->cts_checked += (uint64_t)r->ncts_a;
		in->cts_landed += r->cts_dropped;
		if (t > in->t_done && !r->born_late)
			in->t_done = t;
		r2cc_incident_progress(r->incident);
	}
	r->born_late = false;
	pthread_mutex_unlock(&r2cc_eng.mu);
	r2cc_rqp_event(r,
		       "qp 0x%x: %s -> %s (peer %s -> %s), re-posted %zu sends %zu receives "
		       "%llu held, %zu completions synthesised",
		       r->qpn, r->orig_nic->name, r->cur_nic->name, r->peer_orig_nic,
		       r->peer_cur_nic, r->plan.n_send, r->plan.n_recv, (unsigned long long)held,
		       r->plan.n_synth + (size_t)r->lost_synth);
	R2CC_INFO("repair: qp 0x%x %s %s in %.1f ms (%s)", r->qpn, back ? "back on" : "migrated to",
		  r->cur_nic->name, (t - r->t_detect) / 1e6, r->cause);
	r2cc_qp_shadow_plan_free(&r->plan);
	r->have_plan = false;
	if (r->have_replan)
		r2cc_qp_shadow_plan_free(&r->replan);
	r->have_replan = false;
	r2cc_cts_forget(r);
	__atomic_store_n(&r->switched, 0, __ATOMIC_RELEASE);
	/* A new path the plan gave no signalled send (its clear-to-send writes had
	 * all landed, or nothing was owed) proves nothing until NCCL posts again, and
	 * NCCL may be waiting on the peer instead: with the peer's end of that path
	 * dead this side would wait forever. A signalled zero-byte write shows it now;
	 * its failure repairs the QP again, or ends it (barren_check). */
	if (r->cur_sh && load_state(r) == RQ_MIGRATED) {
		uint64_t posted, retired;
		r2cc_qp_shadow_signalled(r->cur_sh, &posted, &retired);
		/* only where NCCL waits for this peer (a receive outstanding): it
		 * polls this CQ, so the probe's completion is seen */
		if (posted == retired && r2cc_qp_shadow_recv_outstanding(r->cur_sh)) {
			struct r2cc_qp_shadow_stats st;
			r2cc_qp_shadow_get_stats(r->cur_sh, &st);
			r2cc_probe(r, t, st.send_posted);
		}
	}
	/* The new path failed while the exchange went on (its error was kept from NCCL,
	 * as a repair's are): repaired now, not when the stall scan finds the wait. */
	int e = __atomic_exchange_n(&r->new_path_err, 0, __ATOMIC_ACQ_REL);
	if (e) {
		char why[128];
		snprintf(why, sizeof(why),
			 "error completion (status %d) on its new path %.40s "
			 "during the exchange",
			 e, r->cur_nic->name);
		r2cc_detect(r, why, e);
	} else if (__atomic_load_n(&r->cur_nic->state, __ATOMIC_ACQUIRE) == R2CC_NIC_DOWN) {
		/* Its new path is on a NIC found failed while the exchange went on (a peer's
		 * request served before this process's own detection kept this end on its
		 * NIC, which then failed): that detection skipped it, mid-exchange. */
		char why[128];
		snprintf(why, sizeof(why),
			 "its new path is on %.40s, which failed during the exchange",
			 r->cur_nic->name);
		r2cc_detect(r, why, IBV_WC_RETRY_EXC_ERR);
	}
}

/* As many migrations of this QP within CHURN_NS as the process has NICs (at
 * least 3): every NIC it could use keeps failing (e.g. every NIC of a node
 * black-holed); give NCCL the error instead of migrating forever. Every
 * migration had evidence of a failure (a stall alone moves nothing), and NICs
 * failing one after the other may each take a QP along once. */
static int churn_limit(void)
{
	int k = r2cc_nic_count();
	return k < 3 ? 3 : k > CHURN_RING ? CHURN_RING : k;
}

/* How long one attempt of r's transport may take before it reports an error:
 * the local ACK timeout (4.096 us << timeout) times the tries, twice over, capped. */
static int64_t attempt_ns(const struct r2cc_rqp *r)
{
	unsigned t = r->q && r->q->timeout ? r->q->timeout : 20;
	unsigned tries = (r->q && r->q->retry_cnt ? r->q->retry_cnt : 7) + 1u;
	if (t > 31)
		t = 31;
	double ns = 2.0 * 4096.0 * (double)(1u << t) * tries;
	return ns < (double)BARREN_MAX_NS ? (int64_t)ns : BARREN_MAX_NS;
}

/* A failure of r's path, once per move: was that move barren? Its path owed
 * signalled sends and completed none of them since the move, and the failure
 * came while that attempt could still be running (a QP that sat idle for an
 * hour and is moved again has not failed twice in a row). The churn window
 * alone does not bound a repair whose every path black-holes: each attempt
 * then ends at the transport timeout, which on hardware is far above
 * CHURN_NS / NICs (4.3 s x 8 tries at NCCL's default NCCL_IB_TIMEOUT of 20). */
static void barren_check(struct r2cc_rqp *r)
{
	if (!r->migrations || r->barren_seen == r->migrations || !r->cur_sh)
		return;
	r->barren_seen = r->migrations;
	uint64_t posted, retired;
	r2cc_qp_shadow_signalled(r->cur_sh, &posted, &retired);
	/* R2CC's probe of a path that was given nothing to send (r2cc_rqp_done)
	 * counts as owed too: a path that failed it completed nothing. */
	bool owed = posted != retired ||
		    (r->probe_at && !__atomic_load_n(&r->probe_done, __ATOMIC_ACQUIRE));
	bool barren = owed && retired == r->moved_retired && now_ns() - r->moved_at < attempt_ns(r);
	r->barren = barren ? r->barren + 1 : 0;
}

/* At a failure of r's path: the reason r's repair gives up, or NULL. */
const char *r2cc_rqp_churning(struct r2cc_rqp *r)
{
	if (r->failback_to)
		return NULL; /* a failback is no failure */
	if (r->back_path) {
		/* the returned NIC failed again: its hold-down bounds this, not the
		 * QP's churn (nor does it make the move before a barren one) */
		r->barren_seen = r->migrations;
		return NULL;
	}
	barren_check(r);
	unsigned k = (unsigned)churn_limit();
	if (r->barren >= k)
		return BARREN_WHY;
	if (r->churn < k)
		return NULL;
	int64_t oldest = r->recent[(r->churn - k) % CHURN_RING];
	return now_ns() - oldest < CHURN_NS ? CHURN_WHY : NULL;
}

/*
 * A QP connected to itself (NCCL's GPU flush QP: RDMA READs from its own NIC)
 * has no peer to ask: both ends are here. Fence, a new QP on a healthy NIC
 * connected to itself, the plan with our own count on both sides, re-post.
 */
void r2cc_migrate_loopback(struct r2cc_rqp *r)
{
	r2cc_rqp_event(r, "qp 0x%x: failure seen (%s), loopback QP", r->qpn, r->cause);
	int rc = r2cc_fence(r);
	if (rc) {
		r2cc_rqp_fail(r, r2cc_fence_failure(rc));
		return;
	}
	struct r2cc_nic *nic = NULL,
			*home = r->failback_to && r2cc_nic_usable(r, r->failback_to, true)
				    ? r->failback_to
				    : NULL;
	struct peer_path p;
	/* A NIC whose device refuses (dead) has failed: the next one. */
	rc = r2cc_path_on_healthy_self(r, home, &p, &nic);
	if (rc) {
		r2cc_rqp_fail(r, rc == -ENODEV
				     ? "no healthy NIC left"
				     : "cannot create or connect the loopback QP on the new NIC");
		return;
	}
	set_state(r, RQ_EXCHANGE);
	uint64_t held = 0;
	pthread_mutex_lock(&r->mu);
	r->loopback = true;
	r->initiator = true;
	r->k_peer = r->k_local;
	r->peer_sent = 0; /* its receives are its own sends: nothing lost between */
	r->npeer_lost = 0;
	if (!r->migrations)
		snprintf(r->peer_orig_nic, sizeof(r->peer_orig_nic), "%s", r->orig_nic->name);
	pthread_mutex_unlock(&r->mu);
	rc = r2cc_path_commit(r, &p, true, &held);
	if (rc) {
		r2cc_rqp_fail(r, "cannot re-post on the loopback QP's new NIC");
		return;
	}
	r2cc_rqp_done(r, held);
}
