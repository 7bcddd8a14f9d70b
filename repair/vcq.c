/*
 * The virtual side of NCCL's CQs once a QP of theirs has moved: completions of the
 * new paths' private CQs routed back under the old QP's number, a stash of them (and
 * of the completions a migration synthesised) for NCCL's polls, and error
 * completions hidden only where a repair takes the QP.
 */
#include "repair/engine_priv.h"

#include <stdio.h>
#include <stdlib.h>

/*
 * Room in the stash for n more completions besides the reserved ones, grown if
 * need be; false when there is no memory for it. A completion must never be
 * dropped (NCCL would see the next one out of order): whoever finds no room
 * leaves its completions where they are, or fails before it changes anything.
 * Under vcq->mu.
 */
bool r2cc_stash_room(struct r2cc_vcq *v, size_t n)
{
	size_t need = v->count + v->reserved + n;
	if (need <= v->cap)
		return true;
	size_t cap = v->cap ? v->cap : 256;
	while (cap < need)
		cap *= 2;
	struct ibv_wc *s = malloc(cap * sizeof(*s));
	if (!s)
		return false;
	for (size_t i = 0; i < v->count; i++)
		s[i] = v->stash[(v->head + i) % v->cap];
	free(v->stash);
	v->stash = s;
	v->cap = cap;
	v->head = 0;
	return true;
}

/* Into room that r2cc_stash_room() made (or a reserved entry). Under vcq->mu. */
void r2cc_stash_push(struct r2cc_vcq *v, const struct ibv_wc *wc)
{
	v->stash[(v->head + v->count) % v->cap] = *wc;
	v->count++;
}

/* How many completions the pump may take from a CQ now, at most want: what the
 * stash holds besides its reserved entries (none when memory is short: they
 * stay in the CQ until the stash drains). Under vcq->mu. */
static int stash_take(struct r2cc_vcq *v, int want)
{
	if (r2cc_stash_room(v, (size_t)want))
		return want;
	size_t used = v->count + v->reserved;
	return used < v->cap ? (int)(v->cap - used) : 0;
}

static void count_wc(struct r2cc_nic *nic, const struct ibv_wc *wc)
{
	if (wc->status != IBV_WC_SUCCESS)
		r2cc_counter_add(&nic->cnt.err_cqes, 1);
	else if (wc->opcode & IBV_WC_RECV) {
		r2cc_counter_add(&nic->cnt.rx_wrs, 1);
		r2cc_counter_add(&nic->cnt.rx_bytes, wc->byte_len);
	} else
		r2cc_counter_add(&nic->cnt.tx_cqes, 1);
}

/* An error completion that the virtual CQ hands NCCL while no repair took it (the
 * QP is not connected as far as R2CC knows, or R2CC is off): the first few, then one
 * in a thousand, so that a job that fails on it says why. Not for a QP whose repair
 * failed: r2cc_rqp_fail() said so already. */
static void vcq_error_to_nccl(const struct ibv_wc *wc, const struct r2cc_rqp *r, const char *why)
{
	static unsigned long reports;
	unsigned long n = __atomic_fetch_add(&reports, 1, __ATOMIC_RELAXED);
	if (n < 8 || n % 1000 == 0)
		R2CC_WARN(
		    "repair: an error completion (status %d, qp 0x%x%s%s) reaches NCCL with no "
		    "repair: %s",
		    wc->status, r ? r->qpn : wc->qp_num, r ? " on " : "", r ? r->cur_nic->name : "",
		    why);
}

/* A completion of r's current path (NCCL's QP or R2CC's), under vcq->mu. */
static void route(struct r2cc_vcq *v, struct r2cc_rqp *r, struct ibv_wc *wc)
{
	if (r2cc_unlikely(__atomic_load_n(&r->gf, __ATOMIC_RELAXED) != NULL) &&
	    r2cc_gflush_wc(r, wc))
		return;
	if (wc->wr_id == MARK_S || wc->wr_id == MARK_R) {
		/* A flush ends the drain. A marker is posted only on a path in ERR, so
		 * it completes in no other way; were one ever to succeed, it is still
		 * R2CC's and never reaches NCCL. */
		if (wc->wr_id == MARK_S)
			r->mark_s = true;
		else
			r->mark_r = true;
		if (wc->status == IBV_WC_SUCCESS)
			R2CC_WARN("repair: qp 0x%x: a drain marker completed without a flush",
				  r->qpn);
		return;
	}
	if (wc->wr_id == R2CC_PROBE_WRID) {
		if (wc->status == IBV_WC_SUCCESS) {
			__atomic_store_n(&r->probe_done, 1, __ATOMIC_RELEASE);
			return;
		}
		if (load_state(r) == RQ_FAILED)
			return;
	}
	count_wc(r->cur_nic, wc);
	if (wc->wr_id != R2CC_PROBE_WRID)
		r2cc_qp_shadow_wc(r->cur_sh, wc);
	int s = load_state(r);
	wc->qp_num = r->qpn;
	if (wc->status == IBV_WC_SUCCESS || s == RQ_FAILED) {
		r2cc_stash_push(v, wc);
		return;
	}
	if (s == RQ_HEALTHY || s == RQ_MIGRATED) {
		char why[128];
		snprintf(why, sizeof(why), "error completion (status %d) on %.64s", wc->status,
			 r->cur_nic->name);
		if (!r2cc_detect_hides(r, why, wc->status)) {
			vcq_error_to_nccl(wc, r,
					  !r2cc_active() ? "hot repair is off"
					  : !connected(r)
					      ? "the QP is not connected (not in RTS, or not ready)"
					      : "the detection did not take it");
			r2cc_stash_push(v, wc);
			return;
		}
	}
	/* hidden: the repair re-posts what it failed; an error of the new path while
	 * the exchange goes on starts a repair of its own once it ends (r2cc_rqp_done()) */
	if (s == RQ_EXCHANGE && __atomic_load_n(&r->switched, __ATOMIC_ACQUIRE))
		__atomic_store_n(&r->new_path_err, (int)wc->status, __ATOMIC_RELEASE);
}

void r2cc_vcq_pump(struct r2cc_cq *c)
{
	struct r2cc_vcq *v = c->v;
	struct ibv_wc buf[32];
	for (;;) {
		int k = stash_take(v, 32);
		int n = k ? c->ctx->poll_cq(c->cq, k, buf) : 0;
		for (int i = 0; i < n; i++) {
			struct r2cc_qp *q = r2cc_qp_by_num(c->ctx->nic, buf[i].qp_num);
			struct r2cc_rqp *r = q ? q->rep : NULL;
			if (!r) {
				count_wc(c->ctx->nic, &buf[i]);
				if (buf[i].status != IBV_WC_SUCCESS)
					vcq_error_to_nccl(
					    &buf[i], NULL,
					    q ? "a QP without a repair record"
					      : "a QP R2CC does not know on this NIC");
				r2cc_stash_push(v, &buf[i]);
			} else if (r->cur_cq) {
				/* NCCL's QP left behind: only flushes arrive there */
			} else {
				route(v, r, &buf[i]);
			}
		}
		if (n < k || !k)
			break;
	}
	for (struct pcq *pc = v->pcqs; pc; pc = pc->next) {
		for (;;) {
			int k = stash_take(v, 32);
			int n = k ? pc->ctx->poll_cq(pc->cq, k, buf) : 0;
			for (int i = 0; i < n; i++) {
				struct r2cc_rqp *r = r2cc_hmap_get(&pc->by_qpn, buf[i].qp_num);
				if (r)
					route(v, r, &buf[i]);
				else /* a path already gone: it was drained before */
					count_wc(pc->ctx->nic, &buf[i]);
			}
			if (n < k || !k)
				break;
		}
	}
}

int r2cc_repair_poll(struct r2cc_cq *c, int num, struct ibv_wc *wc)
{
	struct r2cc_vcq *v = c->v;
	if (!v)
		return c->ctx->poll_cq(c->cq, num, wc);
	r2cc_app_flush_poll(v);
	pthread_mutex_lock(&v->mu);
	if (v->count < (size_t)num)
		r2cc_vcq_pump(c);
	int n = 0;
	while (n < num && v->count) {
		wc[n++] = v->stash[v->head];
		v->head = (v->head + 1) % v->cap;
		v->count--;
	}
	pthread_mutex_unlock(&v->mu);
	r2cc_gflush_release(v);
	return n;
}

void r2cc_repair_probe_done(struct r2cc_cq *c, const struct ibv_wc *wc)
{
	struct r2cc_qp *q = r2cc_qp_by_num(c->ctx->nic, wc->qp_num);
	if (q && q->rep)
		__atomic_store_n(&q->rep->probe_done, 1, __ATOMIC_RELEASE);
}

int r2cc_repair_poll_errors(struct r2cc_cq *c, struct ibv_wc *wc, int got)
{
	int out = 0;
	for (int i = 0; i < got; i++) {
		struct r2cc_rqp *r = NULL;
		if (wc[i].status != IBV_WC_SUCCESS) {
			struct r2cc_qp *q = r2cc_qp_by_num(c->ctx->nic, wc[i].qp_num);
			r = q ? q->rep : NULL;
		}
		if (r && load_state(r) != RQ_FAILED) {
			char why[128];
			snprintf(why, sizeof(why), "error completion (status %d) on %.64s",
				 wc[i].status, c->ctx->nic->name);
			r2cc_nic_failure_seen(c->ctx->nic);
			if (r2cc_detect_hides(r, why, wc[i].status))
				continue; /* hidden */
		}
		wc[out++] = wc[i];
	}
	return out;
}

/* r gives back its reserved stash entry. Under r->mu and its vcq->mu. */
void r2cc_stash_release_locked(struct r2cc_rqp *r)
{
	if (!r->stash_held)
		return;
	r->stash_held = false;
	r->vcq->v->reserved--;
}

/* The same, under r->mu only. */
void r2cc_stash_release(struct r2cc_rqp *r)
{
	pthread_mutex_lock(&r->vcq->v->mu);
	r2cc_stash_release_locked(r);
	pthread_mutex_unlock(&r->vcq->v->mu);
}
