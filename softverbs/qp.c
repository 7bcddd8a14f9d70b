/*
 * RC queue pairs of the software RDMA device: creating one (its slot in the fabric's QP
 * table, claimed without the fabric lock; its engine; its identity in seeded draws),
 * modify_qp's state machine (the transitions the IB spec allows; ERR flushes, RESET
 * cleans the CQs), query and destroy, and the completions of a QP's queues
 * (sv_sq_retire, the flushes), which the data path gives too.
 */
#include "softverbs/internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int sv_ctx_nic(struct ibv_context *context)
{
	return sv_container_of(context, struct sv_ctx, vctx.context)->nic;
}

/*
 * Seeded draws (what lands at a black hole, jitter delays): a pure function of
 * SOFTVERBS_SEED, the QP's identity, what the draw is for and the request's index in
 * its send queue, so that a program that does the same things draws the same.
 */
static uint64_t sv_mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

uint64_t sv_draw(uint64_t key, uint64_t what, uint32_t idx)
{
	return sv_mix(sv_proc.cfg.seed ^ sv_mix(key ^ sv_mix(what ^ sv_mix(idx))));
}

static uint64_t sv_str_hash(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
	return h;
}

/* A QP is known by its node, its NIC and how many QPs this process created before it. */
static uint64_t sv_qp_key(int nic, uint32_t ordinal)
{
	struct sv_fabric *f = sv_proc.f;

	return sv_mix(sv_str_hash(f->nodes[f->nics[nic].node].name) ^
		      sv_mix(sv_str_hash(f->nics[nic].name) ^ sv_mix(ordinal)));
}

static _Atomic int qp_hint;

/*
 * A free QP slot, claimed without the fabric lock: its qpn goes from 0 to
 * SV_QPN_CLAIMED by compare-and-swap, and the maker fills the slot in and stores
 * the real QPN last. Every lookup compares QPNs, which the claim value never
 * matches. With the lock, a job of 65 processes on 2 cores made its QPs one after
 * another behind whichever holder the scheduler had preempted: 106 ms of one
 * repair of 512 QPs went there (docs/scale.md). SV_MAX_QPS when every slot is
 * taken.
 */
static int sv_qp_claim(struct sv_fabric *f)
{
	int h = atomic_load_explicit(&qp_hint, memory_order_relaxed);

	for (int k = 0; k < SV_MAX_QPS; k++) {
		int i = (h + k) % SV_MAX_QPS;
		uint32_t free_qpn = 0;

		if (atomic_load_explicit(&f->qps[i].qpn, memory_order_relaxed) == 0 &&
		    atomic_compare_exchange_strong(&f->qps[i].qpn, &free_qpn, SV_QPN_CLAIMED)) {
			atomic_store_explicit(&qp_hint, (i + 1) % SV_MAX_QPS, memory_order_relaxed);
			return i;
		}
	}
	return SV_MAX_QPS;
}

/* Creates an RC QP; `init` is updated with the capacities it got, as rdma-core does. */
static struct ibv_qp *sv_qp_create(struct ibv_pd *pd, struct ibv_qp_init_attr *init, bool qpx)
{
	struct sv_pd *spd = sv_container_of(pd, struct sv_pd, pd);
	struct sv_srq *srq = init->srq ? sv_container_of(init->srq, struct sv_srq, srq) : NULL;
	struct sv_fabric *f = sv_proc.f;
	struct ibv_qp_cap *cap = &init->cap;
	struct sv_qp *qp;
	struct sv_qp_slot *s;
	uint32_t nsq, nsge;
	int i, err = EINVAL;

	if (sv_ctx_dead(pd->context)) {
		errno = EIO;
		return NULL;
	}
	if (init->qp_type != IBV_QPT_RC) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (!init->send_cq || !init->recv_cq || cap->max_send_wr > SV_MAX_SEND_WR ||
	    (!srq && (cap->max_recv_wr > SV_RQ_CAP || cap->max_recv_sge > SV_RQ_SGE)) ||
	    cap->max_send_sge > SV_MAX_SEND_SGE || cap->max_inline_data > SV_MAX_INLINE) {
		errno = EINVAL;
		return NULL;
	}
	qp = calloc(1, sizeof(*qp));
	if (!qp) {
		errno = ENOMEM;
		return NULL;
	}
	nsq = cap->max_send_wr ? cap->max_send_wr : 1;
	nsge = cap->max_send_sge ? cap->max_send_sge : 1;
	qp->sq = calloc(nsq, sizeof(*qp->sq));
	qp->sge_pool = calloc((size_t)nsq * nsge, sizeof(*qp->sge_pool));
	qp->inl_pool = cap->max_inline_data ? malloc((size_t)nsq * cap->max_inline_data) : NULL;
	if (!qp->sq || !qp->sge_pool || (cap->max_inline_data && !qp->inl_pool)) {
		err = ENOMEM;
		goto err_free;
	}
	for (uint32_t k = 0; k < nsq; k++) {
		qp->sq[k].sge = &qp->sge_pool[(size_t)k * nsge];
		qp->sq[k].inl =
		    qp->inl_pool ? &qp->inl_pool[(size_t)k * cap->max_inline_data] : NULL;
	}
	cap->max_send_wr = nsq;
	cap->max_send_sge = nsge;
	if (srq) {
		cap->max_recv_wr = 0;
		cap->max_recv_sge = 0;
	} else {
		cap->max_recv_wr = cap->max_recv_wr ? cap->max_recv_wr : 1;
	}
	qp->cap = *cap;
	qp->sig_all = init->sq_sig_all;
	pthread_mutex_init(&qp->lock, NULL);
	pthread_mutex_init(&qp->post_lock, NULL);
	qp->eng_wake = SV_NEVER;

	i = sv_qp_claim(f);
	if (i == SV_MAX_QPS) {
		err = ENOMEM;
		goto err_free;
	}
	s = &f->qps[i];
	s->pid = getpid();
	/* read by requesters that hold this slot's old QPN (sv_path_view) */
	__atomic_store_n(&s->nic, sv_ctx_nic(pd->context), __ATOMIC_RELAXED);
	s->pd = spd->id;
	__atomic_store_n(&s->epoch, sv_ctx_of(pd->context)->epoch, __ATOMIC_RELAXED); /* as nic */
	atomic_store(&s->state, IBV_QPS_RESET);
	atomic_store(&s->access, 0);
	atomic_store(&s->dest_qpn, 0);
	atomic_store(&s->dlid, 0);
	memset(&s->grh, 0, sizeof(s->grh));
	atomic_store(&s->grh_peer, -1);
	s->rcq = to_cq(init->recv_cq)->slot;
	s->rcq_id = atomic_load(&to_cq(init->recv_cq)->s->id);
	s->srq = srq ? srq->slot : -1;
	s->srq_id = srq ? atomic_load(&srq->s->id) : 0;
	s->rq_size = cap->max_recv_wr;
	/* Initialised once, as a requester that found this slot by its old QPN may still
	 * hold it (sv_rq_consume); the queue is emptied under it, and that requester then
	 * sees another QPN and leaves the new QP's receives alone. */
	if (!atomic_load(&s->rq_lock_ready)) {
		sv_mutex_init_shared(&s->rq_lock);
		atomic_store(&s->rq_lock_ready, true);
	}
	sv_lock(&s->rq_lock);
	s->rq_head = s->rq_tail = 0;
	pthread_mutex_unlock(&s->rq_lock);
	/* last: the slot is found by this QPN from now on */
	atomic_store(&s->qpn, (sv_next_gen(f, 24 - SV_QP_SHIFT) << SV_QP_SHIFT) | (uint32_t)i);

	qp->slot = i;
	qp->s = s;
	qp->key = sv_qp_key(s->nic, atomic_fetch_add(&sv_proc.qps_made, 1));
	qp->attr.qp_state = IBV_QPS_RESET;
	qp->qp.context = pd->context;
	qp->qp.qp_context = init->qp_context;
	qp->qp.pd = pd;
	qp->qp.send_cq = init->send_cq;
	qp->qp.recv_cq = init->recv_cq;
	qp->qp.srq = init->srq;
	qp->qp.qp_num = atomic_load(&s->qpn);
	qp->qp.handle = qp->qp.qp_num;
	qp->qp.state = IBV_QPS_RESET;
	qp->qp.qp_type = IBV_QPT_RC;
	pthread_mutex_init(&qp->qp.mutex, NULL);
	pthread_cond_init(&qp->qp.cond, NULL);
	if (qpx)
		sv_qpx_init(qp);
	atomic_fetch_add(&to_cq(init->send_cq)->users, 1);
	atomic_fetch_add(&to_cq(init->recv_cq)->users, 1);
	atomic_fetch_add(&spd->users, 1);
	if (srq)
		atomic_fetch_add(&srq->users, 1);

	/* qp->eng before the QP is on the list: the progress thread reads it there. */
	if (sv_proc.cfg.engines)
		qp->eng = sv_engine_get(s->nic);
	pthread_mutex_lock(&sv_proc.lock);
	qp->next = sv_proc.qps;
	sv_proc.qps = qp;
	pthread_mutex_unlock(&sv_proc.lock);
	if (qp->eng)
		sv_engine_add(qp);
	return &qp->qp;

err_free:
	free(qp->inl_pool);
	free(qp->sge_pool);
	free(qp->sq);
	free(qp);
	errno = err;
	return NULL;
}

SV_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *init)
{
	return sv_qp_create(pd, init, false);
}

/* The opcodes of the extended send API the device executes (as ibv_post_send's). */
#define SV_QPX_OPS                                                                                 \
	(IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |    \
	 IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ)

/* context->create_qp_ex: an RC QP, with the ibv_wr_* API when send_ops_flags are given. */
struct ibv_qp *sv_create_qp_ex(struct ibv_context *context, struct ibv_qp_init_attr_ex *init)
{
	uint32_t mask = init->comp_mask;
	struct ibv_qp *qp;

	if (!(mask & IBV_QP_INIT_ATTR_PD) || !init->pd) {
		errno = EINVAL;
		return NULL;
	}
	if ((mask & ~(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS |
		      IBV_QP_INIT_ATTR_CREATE_FLAGS)) ||
	    ((mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && init->create_flags) ||
	    ((mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) && (init->send_ops_flags & ~SV_QPX_OPS))) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	/* The basic attributes are the first members of the extended ones, as rdma-core uses. */
	qp = sv_qp_create(init->pd, (struct ibv_qp_init_attr *)init,
			  mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS);
	return qp;
}

SV_EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *ibqp)
{
	struct sv_qp *qp = to_qp(ibqp);

	if (!qp->has_qpx) {
		errno = EOPNOTSUPP; /* created without send_ops_flags */
		return NULL;
	}
	return &qp->qpx;
}

/* Attributes each transition requires and allows (IB spec, as the kernel checks them). */
static const struct {
	enum ibv_qp_state cur, next;
	int req, opt;
} sv_trans[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_INIT, IBV_QPS_RTR,
     IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
	 IBV_QP_MIN_RNR_TIMER,
     IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
    {IBV_QPS_RTR, IBV_QPS_RTS,
     IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
     IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
	 IBV_QP_PATH_MIG_STATE},
    {IBV_QPS_RTS, IBV_QPS_RTS, 0,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
	 IBV_QP_MIN_RNR_TIMER},
};

static bool sv_modify_ok(enum ibv_qp_state cur, enum ibv_qp_state next, int mask)
{
	int req = 0, opt = 0;
	bool found = false;

	if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) {
		found = true;
	} else {
		for (size_t i = 0; i < sizeof(sv_trans) / sizeof(sv_trans[0]); i++)
			if (sv_trans[i].cur == cur && sv_trans[i].next == next) {
				req = sv_trans[i].req;
				opt = sv_trans[i].opt;
				found = true;
			}
	}
	return found && (mask & req) == req && (mask & ~(req | opt | IBV_QP_STATE)) == 0;
}

static int sv_wc_opcode(int wr_opcode)
{
	switch (wr_opcode) {
	case IBV_WR_RDMA_READ:
		return IBV_WC_RDMA_READ;
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_IMM:
		return IBV_WC_SEND;
	default:
		return IBV_WC_RDMA_WRITE;
	}
}

/*
 * Under qp->lock: frees the send queue slot at `head`, then completes its request
 * when it is signalled or failed. The slot is free before the completion can be
 * polled, as on a NIC: a program that posts as soon as it polled one never finds the
 * queue full, and the unsignalled requests before it are free too.
 */
void sv_sq_retire(struct sv_qp *qp, uint32_t head, int status)
{
	struct sv_swr *w = &qp->sq[head % qp->cap.max_send_wr];
	struct sv_cq *cq = to_cq(qp->qp.send_cq);
	bool signal = status != IBV_WC_SUCCESS || (w->flags & IBV_SEND_SIGNALED) || qp->sig_all;
	struct ibv_wc wc;

	sv_wc_fill(&wc, w->wr_id, status, sv_wc_opcode(w->opcode), (uint32_t)w->len, qp->qp.qp_num);
	atomic_store_explicit(&qp->sq_head, head + 1, memory_order_release);
	if (signal)
		sv_cq_push(sv_proc.f, cq->slot, atomic_load(&cq->s->id), &wc);
}

/* Flushes the receive queue of a QP in ERR (may run in any thread). */
void sv_rq_flush(struct sv_qp *qp)
{
	struct sv_qp_slot *s = qp->s;
	struct ibv_wc wc;

	sv_lock(&s->rq_lock);
	for (; s->rq_head != s->rq_tail; s->rq_head++) {
		sv_wc_fill(&wc, s->rq[s->rq_head % SV_RQ_CAP].wr_id, IBV_WC_WR_FLUSH_ERR,
			   IBV_WC_RECV, 0, qp->qp.qp_num);
		sv_cq_push(sv_proc.f, s->rcq, s->rcq_id, &wc);
	}
	pthread_mutex_unlock(&s->rq_lock);
}

/*
 * Under qp->lock: completes everything queued with a flush error, what landed without
 * its acknowledgement too (the requester cannot know it landed).
 */
void sv_qp_flush(struct sv_qp *qp)
{
	uint32_t head = atomic_load_explicit(&qp->sq_head, memory_order_relaxed);

	for (; head != atomic_load_explicit(&qp->sq_tail, memory_order_acquire); head++)
		sv_sq_retire(qp, head, IBV_WC_WR_FLUSH_ERR);
	qp->sq_exec = head;
	qp->nak = 0;
	sv_srq_release(qp);
	sv_rq_flush(qp);
}

void sv_qp_set_state(struct sv_qp *qp, enum ibv_qp_state st)
{
	qp->attr.qp_state = st;
	qp->qp.state = st;
	atomic_store(&qp->s->state, st);
}

/*
 * Removes a QP's completions from a CQ, as mlx5 does when the QP goes to RESET
 * (mlx5_modify_qp -> mlx5_cq_clean): a QP reused after ERR -> RESET must not poll the
 * flushes of its last life. The others' completions stay, in order: the ones kept are
 * moved toward the tail and the head advances past the gap. Neither producers (the
 * slot's lock) nor pollers (poll_lock) run meanwhile; that is resize's order.
 */
static void sv_cq_clean(struct ibv_cq *ibcq, uint32_t qpn)
{
	struct sv_cq *cq = to_cq(ibcq);
	struct sv_cq_slot *s = cq->s;
	uint64_t head, tail, keep;

	sv_lock(&s->lock);
	pthread_mutex_lock(&cq->poll_lock);
	head = atomic_load(&s->head);
	tail = atomic_load(&s->tail);
	keep = tail;
	for (uint64_t k = tail; k != head; k--) {
		struct ibv_wc *wc = &cq->ring[(k - 1) & cq->mask];

		if (wc->qp_num == qpn)
			continue;
		keep--;
		if (keep != k - 1)
			cq->ring[keep & cq->mask] = *wc;
	}
	atomic_store_explicit(&s->head, keep, memory_order_release);
	pthread_mutex_unlock(&cq->poll_lock);
	pthread_mutex_unlock(&s->lock);
}

/* A QP entering RESET: its completions leave both of its CQs (an SRQ's receives too). */
static void sv_qp_clean_cqs(struct sv_qp *qp)
{
	sv_cq_clean(qp->qp.recv_cq, qp->qp.qp_num);
	if (qp->qp.send_cq != qp->qp.recv_cq)
		sv_cq_clean(qp->qp.send_cq, qp->qp.qp_num);
}

SV_EXPORT int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask)
{
	struct sv_qp *qp = to_qp(ibqp);
	enum ibv_qp_state cur, next;
	int rc = EINVAL;

	pthread_mutex_lock(&qp->lock);
	cur = qp->attr.qp_state;
	next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
	if (sv_ctx_dead(ibqp->context)) {
		/* As mlx5 after an internal error: ERR and RESET "succeed", nothing is flushed. */
		rc = EIO;
		if ((mask & IBV_QP_STATE) && (next == IBV_QPS_ERR || next == IBV_QPS_RESET)) {
			sv_qp_set_state(qp, next);
			if (next == IBV_QPS_RESET)
				sv_qp_clean_cqs(qp); /* mlx5 cleans in user space, dead or not */
			rc = 0;
		}
		goto out;
	}
	if ((mask & IBV_QP_CUR_STATE) && attr->cur_qp_state != cur)
		goto out;
	if (!sv_modify_ok(cur, next, mask))
		goto out;
	if (((mask & IBV_QP_PORT) && attr->port_num != 1) ||
	    ((mask & IBV_QP_PATH_MTU) &&
	     (attr->path_mtu < IBV_MTU_256 || attr->path_mtu > IBV_MTU_4096)) ||
	    ((mask & IBV_QP_TIMEOUT) && attr->timeout > 31) ||
	    ((mask & IBV_QP_RETRY_CNT) && attr->retry_cnt > 7) ||
	    ((mask & IBV_QP_RNR_RETRY) && attr->rnr_retry > 7) ||
	    ((mask & IBV_QP_MIN_RNR_TIMER) && attr->min_rnr_timer > 31) ||
	    ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr->max_rd_atomic > SV_MAX_RD_ATOM) ||
	    ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr->max_dest_rd_atomic > SV_MAX_RD_ATOM) ||
	    ((mask & IBV_QP_PKEY_INDEX) && attr->pkey_index != 0) || /* pkey_tbl_len 1 */
	    ((mask & IBV_QP_AV) && attr->ah_attr.port_num > 1))
		goto out;
	/* A RoCE port needs a GRH from a GID of its own (EINVAL, ENODATA for an empty one). */
	if ((mask & IBV_QP_AV) && sv_proc.f->net.link == SV_LL_ROCE) {
		rc = sv_roce_check_av(sv_proc.f, qp->s->nic, &attr->ah_attr);
		if (rc)
			goto out;
	}
	if (mask & IBV_QP_ACCESS_FLAGS) {
		qp->attr.qp_access_flags = attr->qp_access_flags;
		atomic_store(&qp->s->access, attr->qp_access_flags);
	}
	if (mask & IBV_QP_PKEY_INDEX)
		qp->attr.pkey_index = attr->pkey_index;
	if (mask & IBV_QP_PORT)
		qp->attr.port_num = attr->port_num;
	if (mask & IBV_QP_AV) {
		qp->attr.ah_attr = attr->ah_attr;
		atomic_store(&qp->s->dlid, attr->ah_attr.dlid);
		/* Where the GRH leads is resolved now, as the kernel resolves the MAC here. */
		qp->s->grh = attr->ah_attr.grh;
		atomic_store(&qp->s->grh_peer, sv_roce_route(sv_proc.f, qp->s->nic, &qp->s->grh));
	}
	if (mask & IBV_QP_PATH_MTU)
		qp->attr.path_mtu = attr->path_mtu;
	if (mask & IBV_QP_DEST_QPN) {
		qp->attr.dest_qp_num = attr->dest_qp_num;
		atomic_store(&qp->s->dest_qpn, attr->dest_qp_num);
	}
	if (mask & IBV_QP_RQ_PSN)
		qp->attr.rq_psn = attr->rq_psn;
	if (mask & IBV_QP_SQ_PSN)
		qp->attr.sq_psn = attr->sq_psn;
	if (mask & IBV_QP_MAX_DEST_RD_ATOMIC)
		qp->attr.max_dest_rd_atomic = attr->max_dest_rd_atomic;
	if (mask & IBV_QP_MAX_QP_RD_ATOMIC)
		qp->attr.max_rd_atomic = attr->max_rd_atomic;
	if (mask & IBV_QP_MIN_RNR_TIMER)
		qp->attr.min_rnr_timer = attr->min_rnr_timer;
	if (mask & IBV_QP_TIMEOUT)
		qp->attr.timeout = attr->timeout;
	if (mask & IBV_QP_RETRY_CNT)
		qp->attr.retry_cnt = attr->retry_cnt;
	if (mask & IBV_QP_RNR_RETRY)
		qp->attr.rnr_retry = attr->rnr_retry;
	if (mask & IBV_QP_STATE) {
		if (next == IBV_QPS_RESET) {
			sv_srq_release(qp);
			qp->sq_exec = atomic_load(&qp->sq_tail);
			qp->nak = 0;
			atomic_store(&qp->sq_head, qp->sq_exec);
			sv_lock(&qp->s->rq_lock);
			qp->s->rq_head = qp->s->rq_tail;
			pthread_mutex_unlock(&qp->s->rq_lock);
		}
		sv_qp_set_state(qp, next);
		if (next == IBV_QPS_ERR)
			sv_qp_flush(qp);
		else if (next == IBV_QPS_RESET)
			sv_qp_clean_cqs(qp);
	}
	rc = 0;
out:
	pthread_mutex_unlock(&qp->lock);
	return rc;
}

SV_EXPORT int ibv_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask,
			   struct ibv_qp_init_attr *init)
{
	struct sv_qp *qp = to_qp(ibqp);

	if (sv_ctx_dead(ibqp->context))
		return EIO;
	pthread_mutex_lock(&qp->lock);
	*attr = qp->attr;
	attr->cur_qp_state = qp->attr.qp_state;
	attr->cap = qp->cap;
	attr->sq_draining = 0;
	pthread_mutex_unlock(&qp->lock);
	memset(init, 0, sizeof(*init));
	init->qp_context = ibqp->qp_context;
	init->send_cq = ibqp->send_cq;
	init->recv_cq = ibqp->recv_cq;
	init->srq = ibqp->srq;
	init->cap = qp->cap;
	init->qp_type = IBV_QPT_RC;
	init->sq_sig_all = qp->sig_all;
	return 0;
}

SV_EXPORT int ibv_destroy_qp(struct ibv_qp *ibqp)
{
	struct sv_qp *qp = to_qp(ibqp);
	struct sv_qp **pp;

	pthread_mutex_lock(&sv_proc.lock);
	for (pp = &sv_proc.qps; *pp && *pp != qp; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = qp->next;
	pthread_mutex_unlock(&sv_proc.lock);
	if (qp->eng)
		sv_engine_remove(qp);
	pthread_mutex_lock(&qp->lock);
	sv_srq_release(qp);
	atomic_store(&qp->s->state, IBV_QPS_ERR);
	atomic_store(&qp->s->qpn, 0);
	pthread_mutex_unlock(&qp->lock);
	atomic_fetch_sub(&to_cq(ibqp->send_cq)->users, 1);
	atomic_fetch_sub(&to_cq(ibqp->recv_cq)->users, 1);
	atomic_fetch_sub(&sv_container_of(ibqp->pd, struct sv_pd, pd)->users, 1);
	if (ibqp->srq)
		atomic_fetch_sub(&sv_container_of(ibqp->srq, struct sv_srq, srq)->users, 1);
	pthread_mutex_destroy(&qp->lock);
	pthread_mutex_destroy(&qp->post_lock);
	free(qp->inl_pool);
	free(qp->sge_pool);
	free(qp->sq);
	free(qp);
	return 0;
}
