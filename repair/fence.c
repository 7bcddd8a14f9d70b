/*
 * Fencing: the old path of a QP stopped (its gate closed, moved to ERR) and drained
 * up to markers posted behind NCCL's requests, so that the shadow knows what the old
 * path retired. A marker that cannot be posted (a full queue, a device that
 * refuses posts) ends the drain at what the CQ holds.
 */
#include "repair/engine_priv.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

/*
 * Close the gates, move the current path to ERR, post the markers behind NCCL's
 * requests and pump the CQ until both came back (at most DRAIN_NS); then count
 * the receives the path consumed. 0, -ETIMEDOUT, or the shadow's error. For
 * many queue pairs at once, fence_begin() each, then fence_end() each: their
 * drains overlap.
 */
static void fence_begin(struct r2cc_rqp *r)
{
	r2cc_cq_gates_close(&r->q->gate, &r->vcq->gate);
	pthread_mutex_lock(&r->mu);
	set_state(r, RQ_FENCING);
	r->mark_s = r->mark_r = r->fence_broken = false;
	r->probe_at = 0; /* a probe out on this path flushes with it */
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
	int rc = r2cc_from_verbs(r2cc_eng.v.modify_qp(r->cur_qp, &a, IBV_QP_STATE));
	if (rc) {
		/* No markers then: on a path that still runs, a send marker would be a
		 * real write and a receive marker would take a message. What the path
		 * retired cannot be known: the QP's repair fails (NCCL's clean error). */
		R2CC_WARN("repair: qp 0x%x: cannot move to ERR (%s)", r->qpn, strerror(-rc));
		r->mark_s = r->mark_r = r->fence_broken = true;
		pthread_mutex_unlock(&r->mu);
		return;
	}
	struct ibv_recv_wr rw = {.wr_id = MARK_R}, *rbad;
	/* A stand-in for a QP the dead device refused (intercept/verbs.c) was never
	 * given a request: nothing to drain. */
	if (r->q->stand_in_cq && r->cur_qp == r->q->qp)
		r->mark_s = r->mark_r = true;
	/* A queue too full for its marker: the drain ends at what the CQ holds. */
	else if (r2cc_post_zero_write(r->cur_ctx, r->cur_qp, MARK_S))
		r->mark_s = true;
	if (!r->mark_r && r->cur_ctx->post_recv(r->cur_qp, &rw, &rbad))
		r->mark_r = true;
	pthread_mutex_unlock(&r->mu);
}

static int fence_end(struct r2cc_rqp *r, int64_t until)
{
	if (r->fence_broken)
		return -EIO;
	for (;;) {
		pthread_mutex_lock(&r->vcq->v->mu);
		r2cc_vcq_pump(r->vcq);
		bool done = r->mark_s && r->mark_r;
		pthread_mutex_unlock(&r->vcq->v->mu);
		if (done)
			break;
		if (now_ns() > until)
			return -ETIMEDOUT;
		usleep(50);
	}
	r->k_local = r2cc_qp_shadow_recv_consumed(r->cur_sh);
	r->fenced_sent = r2cc_qp_shadow_msgs_retired(r->cur_sh);
	r->fenced_nlost = r2cc_qp_shadow_retired_msgs(r->cur_sh, r->fenced_lost);
	return r2cc_qp_shadow_error(r->cur_sh);
}

int r2cc_fence(struct r2cc_rqp *r)
{
	fence_begin(r);
	return fence_end(r, now_ns() + DRAIN_NS);
}

/*
 * Fences every record of list[0..n) (NULL ones skipped) and sets rc[i], at once
 * as far as each CQ allows: moving a QP to ERR flushes everything outstanding on
 * it, and two markers, into its CQ, and one of NCCL's CQs shared by many QPs holds
 * only so much (half its depth is given to a wave of fences, at least one QP). A
 * migrated QP's own CQ has room for its flush by construction (path_need()).
 */
#define FENCE_WAVE_CQS 64

void r2cc_fence_all(struct r2cc_rqp **list, int n, int *rc)
{
	for (int first = 0; first < n;) {
		struct cq_load {
			const struct r2cc_cq *cq;
			int used;
		} load[FENCE_WAVE_CQS];
		int ncq = 0, last = first;
		for (; last < n; last++) {
			struct r2cc_rqp *r = list[last];
			if (!r || r->cur_cq) {
				if (r)
					fence_begin(r);
				continue;
			}
			int need = 2 + (int)r2cc_qp_shadow_send_outstanding(r->cur_sh) +
				   (int)r2cc_qp_shadow_recv_outstanding(r->cur_sh);
			int k = 0;
			while (k < ncq && load[k].cq != r->vcq)
				k++;
			if (k == ncq) {
				if (ncq == FENCE_WAVE_CQS)
					break;
				load[ncq++] = (struct cq_load){r->vcq, 0};
			}
			if (load[k].used && r->vcq->depth > 0 &&
			    load[k].used + need > r->vcq->depth / 2)
				break;
			load[k].used += need;
			fence_begin(r);
		}
		int64_t until = now_ns() + DRAIN_NS;
		for (int i = first; i < last; i++)
			rc[i] = list[i] ? fence_end(list[i], until) : 0;
		first = last;
	}
}

const char *r2cc_fence_failure(int rc)
{
	return rc == -ETIMEDOUT ? "the old path did not drain"
	       : rc == -EIO	? "the old path could not be stopped (moving it to ERR failed)"
				: "shadow inconsistent";
}
