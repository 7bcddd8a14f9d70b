/*
 * The records of NCCL's QPs and CQs (struct r2cc_rqp, struct r2cc_vcq): made when
 * NCCL creates them and torn down when NCCL destroys them. A QP's record, and the
 * registry's object of the QP, are freed by the repair thread once nothing refers to
 * them (no list of records is out: r2cc_rqp_collect() counts who holds one); a CQ's
 * virtual side is kept, its stash freed. Lists of records for use outside
 * r2cc_eng.mu come from here.
 */
#include "repair/engine_priv.h"

#include <stdlib.h>

void r2cc_repair_cq_created(struct r2cc_cq *c)
{
	if (!r2cc_repair_enabled())
		return;
	struct r2cc_vcq *v = calloc(1, sizeof(*v));
	if (!v)
		return;
	pthread_mutex_init(&v->mu, NULL);
	c->v = v;
}

void r2cc_repair_cq_destroyed(struct r2cc_cq *c)
{
	struct r2cc_vcq *v = c->v;
	if (!v)
		return;
	/* Kept: a late pump may still look at it; only the stash goes. */
	pthread_mutex_lock(&v->mu);
	free(v->stash);
	v->stash = NULL;
	v->cap = v->count = v->head = 0;
	free(v->flush);
	v->flush = NULL;
	v->capflush = 0;
	free(v->gfl);
	v->gfl = NULL;
	v->ngfl = v->capgfl = 0;
	__atomic_store_n(&v->nflush, 0, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&v->mu);
}

void r2cc_repair_qp_created(struct r2cc_qp *q, const struct ibv_qp_init_attr *attr)
{
	if (!r2cc_repair_enabled() || attr->qp_type != IBV_QPT_RC)
		return;
	if (!q->send_cq || q->send_cq != q->recv_cq || !q->send_cq->v) {
		R2CC_WARN_ONCE("repair: a QP with separate send and receive CQs runs without hot "
			       "repair");
		return;
	}
	struct r2cc_qp_shadow_attr sa = {
	    .max_send_wr = attr->cap.max_send_wr,
	    .max_recv_wr = attr->cap.max_recv_wr,
	    .max_send_sge = attr->cap.max_send_sge,
	    .max_recv_sge = attr->cap.max_recv_sge,
	    .max_inline_data = attr->cap.max_inline_data,
	    .sq_sig_all = attr->sq_sig_all,
	    .tag_fn = r2cc_cts_tag, /* NCCL's keys are those of its NIC */
	    .tag_ctx = q,
	    .tag_max_bytes = R2CC_CTS_MAX_BYTES, /* longer: data */
	};
	struct r2cc_rqp *r = calloc(1, sizeof(*r));
	if (!r || r2cc_qp_shadow_create(&sa, &q->shadow)) {
		free(r);
		R2CC_WARN("repair: out of memory for qp 0x%x's shadow; it runs without hot repair",
			  q->qpn);
		return;
	}
	/* The stash entry for the error completion r2cc_rqp_fail() may owe NCCL, taken now:
	 * when the repair runs out of memory later, that error must still get out. */
	struct r2cc_vcq *v = q->send_cq->v;
	pthread_mutex_lock(&v->mu);
	r->stash_held = r2cc_stash_room(v, 1);
	if (r->stash_held)
		v->reserved++;
	pthread_mutex_unlock(&v->mu);
	if (!r->stash_held) {
		r2cc_qp_shadow_destroy(q->shadow);
		q->shadow = NULL;
		free(r);
		R2CC_WARN("repair: out of memory for qp 0x%x's completions; it runs without hot "
			  "repair",
			  q->qpn);
		return;
	}
	pthread_mutex_init(&r->mu, NULL);
	r->q = q;
	r->vcq = q->send_cq;
	r->qpn = q->qpn;
	r->orig_ctx = q->ctx;
	r->orig_nic = q->ctx->nic;
	r->cap = attr->cap;
	r->sq_sig_all = attr->sq_sig_all;
	r->cur_qp = q->qp;
	r->cur_ctx = q->ctx;
	r->cur_nic = q->ctx->nic;
	r->cur_sh = q->shadow;
	r->hs_tail = &r->hs_head;
	r->hr_tail = &r->hr_head;
	r->incident = -1;
	pthread_mutex_lock(&r2cc_eng.mu);
	r->next_all = r2cc_eng.all;
	r2cc_eng.all = r;
	r2cc_eng.records++;
	r2cc_engine_start_locked();
	pthread_mutex_unlock(&r2cc_eng.mu);
	__atomic_store_n(&q->rep, r, __ATOMIC_RELEASE);
}

void r2cc_repair_qp_destroying(struct r2cc_qp *q)
{
	struct r2cc_rqp *r = q->rep;
	if (!r)
		return;
	/* Wait for the repair thread to leave this QP (bounded: it never waits on NCCL). */
	pthread_mutex_lock(&r2cc_eng.mu);
	while (r->busy)
		pthread_cond_wait(&r2cc_eng.cond, &r2cc_eng.mu);
	int s = load_state(r);
	if (r->queued || s == RQ_DETECTED || s == RQ_FENCING || s == RQ_EXCHANGE)
		r2cc_eng.destroyed_in_repair++;
	if (r->tracked)
		r2cc_eng.gone[r2cc_eng.ngone++ % GONE_RING] =
		    (struct gone_conn){r->ep_local, r->ep_remote};
	r->dead = true;
	pthread_mutex_unlock(&r2cc_eng.mu);
	/* off its CQ's list of re-posts for NCCL's thread */
	struct r2cc_vcq *fv = r->vcq ? r->vcq->v : NULL;
	if (fv) {
		pthread_mutex_lock(&fv->mu);
		for (int i = 0; i < fv->nflush; i++)
			if (fv->flush[i] == r) {
				fv->flush[i--] = fv->flush[fv->nflush - 1];
				__atomic_store_n(&fv->nflush, fv->nflush - 1, __ATOMIC_RELAXED);
			}
		pthread_mutex_unlock(&fv->mu);
	}
	if (r->tracked)
		r2cc_peer_forget(&r->ep_local);
	pthread_mutex_lock(&r->mu);
	r2cc_gflush_destroy(r);
	if (r->cur_cq)
		r2cc_path_put(r, r->cur_qp, r->cur_pcq);
	r->cur_qp = NULL;
	r->cur_cq = NULL;
	r->cur_pcq = NULL;
	r2cc_path_drop_new(r);
	r2cc_place_ledger_move(r, NULL, 0);
	if (r->cur_sh != q->shadow)
		r2cc_qp_shadow_destroy(r->cur_sh);
	r->cur_sh = NULL;
	r2cc_qp_shadow_destroy(q->shadow);
	q->shadow = NULL;
	__atomic_store_n(&r->q, NULL, __ATOMIC_RELEASE);
	while (r->hs_head) {
		struct held_send *h = r->hs_head;
		r->hs_head = h->next;
		free(h);
	}
	while (r->hr_head) {
		struct held_recv *h = r->hr_head;
		r->hr_head = h->next;
		free(h);
	}
	if (r->have_plan)
		r2cc_qp_shadow_plan_free(&r->plan);
	r->have_plan = false;
	if (r->have_replan)
		r2cc_qp_shadow_plan_free(&r->replan);
	r->have_replan = false;
	r2cc_stash_release(r);
	set_state(r, RQ_FAILED);
	pthread_mutex_unlock(&r->mu);
	/* The record stays on r2cc_eng.all (marked dead) until the repair thread frees it
	 * (r2cc_records_sweep_locked): the stall scan and other threads' lists may hold it. */
}

bool r2cc_repair_qp_destroyed(struct r2cc_qp *q)
{
	struct r2cc_rqp *r = q->rep;
	if (!r)
		return false;
	pthread_mutex_lock(&r2cc_eng.mu);
	r->gone = true;
	/* Without the repair thread (a forked child) nothing walks the records. */
	bool keep = __atomic_load_n(&r2cc_eng.running, __ATOMIC_ACQUIRE);
	if (keep)
		r->q_gone = q;
	pthread_mutex_unlock(&r2cc_eng.mu);
	return keep;
}

/*
 * The records of destroyed QPs, freed. Only the repair thread frees them, and only
 * between its pieces of work (its own walks of r2cc_eng.all may let go of r2cc_eng.mu while
 * they hold a busy record), and only while no other thread holds a list of records
 * (collect): a thread that lists records after the unlink cannot see them. Not
 * freed: a record NCCL's destroy has not finished with (busy, or its destroy did
 * not succeed), or one still queued for work. Under r2cc_eng.mu.
 */
void r2cc_records_sweep_locked(void)
{
	if (r2cc_eng.holders)
		return;
	for (struct r2cc_rqp **pp = &r2cc_eng.all; *pp;) {
		struct r2cc_rqp *r = *pp;
		if (!r->dead || !r->gone || r->busy || r->queued) {
			pp = &r->next_all;
			continue;
		}
		*pp = r->next_all;
		pthread_mutex_destroy(&r->mu);
		r2cc_cts_forget(r);
		if (r->q_gone)
			r2cc_qp_free(r->q_gone);
		free(r);
		r2cc_eng.records--;
		r2cc_eng.records_freed++;
	}
}
/* The records of the queue pairs that pred selects, listed for use outside r2cc_eng.mu:
 * until r2cc_rqp_collect_done(), no record is freed (r2cc_records_sweep_locked). */
int r2cc_rqp_collect(struct r2cc_rqp ***list, rqp_pred pred, const void *arg)
{
	int n = 0, cap = 0;
	*list = NULL;
	pthread_mutex_lock(&r2cc_eng.mu);
	r2cc_eng.holders++;
	for (struct r2cc_rqp *r = r2cc_eng.all; r; r = r->next_all) {
		if (r->dead || !pred(r, arg))
			continue;
		if (n == cap) {
			int ncap = cap ? 2 * cap : 64;
			struct r2cc_rqp **g = realloc(*list, (size_t)ncap * sizeof(*g));
			if (!g) {
				R2CC_WARN("repair: out of memory listing queue pairs; %d of them "
					  "are moved only when their own failure shows",
					  n);
				break;
			}
			*list = g;
			cap = ncap;
		}
		(*list)[n++] = r;
	}
	pthread_mutex_unlock(&r2cc_eng.mu);
	return n;
}

void r2cc_rqp_collect_done(struct r2cc_rqp **list)
{
	free(list);
	pthread_mutex_lock(&r2cc_eng.mu);
	r2cc_eng.holders--;
	pthread_mutex_unlock(&r2cc_eng.mu);
}

bool r2cc_rqp_on_nic(const struct r2cc_rqp *r, const void *nic)
{
	return __atomic_load_n(&r->cur_nic, __ATOMIC_ACQUIRE) == nic; /* switch_path writes it */
}
