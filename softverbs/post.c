/*
 * Posting to the queues of the software RDMA device: ibv_post_recv into the QP's
 * receive queue in the fabric, ibv_post_send into its process-local send queue, and
 * the extended send API (ibv_wr_*), which fills the same send queue. What is posted
 * goes to whoever runs the send queue (engine.c, sv_sq_kick) and is executed by
 * exec.c.
 */
#include "softverbs/internal.h"

#include <errno.h>
#include <string.h>

int sv_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct sv_qp *qp = to_qp(ibqp);
	struct sv_qp_slot *s = qp->s;
	int rc = 0;

	if (sv_nic_dead(sv_proc.f, s->nic, s->epoch)) {
		*bad_wr = wr;
		return EIO;
	}
	/* A QP on an SRQ has no receive queue of its own. */
	if (atomic_load(&s->state) == IBV_QPS_RESET || ibqp->srq) {
		*bad_wr = wr;
		return EINVAL;
	}
	sv_lock(&s->rq_lock);
	for (; wr; wr = wr->next) {
		struct sv_rwqe *e;

		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->cap.max_recv_sge) {
			rc = EINVAL;
			break;
		}
		if (s->rq_tail - s->rq_head >= s->rq_size) {
			rc = ENOMEM;
			break;
		}
		e = &s->rq[s->rq_tail % SV_RQ_CAP];
		e->wr_id = wr->wr_id;
		e->num_sge = (uint32_t)wr->num_sge;
		if (wr->num_sge)
			memcpy(e->sge, wr->sg_list, sizeof(struct ibv_sge) * (size_t)wr->num_sge);
		s->rq_tail++;
	}
	pthread_mutex_unlock(&s->rq_lock);
	if (rc)
		*bad_wr = wr;
	if (atomic_load(&s->state) == IBV_QPS_ERR)
		sv_rq_flush(qp);
	return rc;
}

/*
 * Under post_lock, for a request about to be published at `now`: nothing of it has
 * landed or taken the wire yet (shaping takes its turns slice by slice as it lands).
 */
static void sv_swr_queue(struct sv_swr *w, int64_t now)
{
	w->post_ns = now;
	w->first_ns = 0;
	w->due_ns = 0;
	w->done = 0;
	w->slice = 0;
}

static bool sv_opcode_ok(int opcode)
{
	return opcode == IBV_WR_RDMA_WRITE || opcode == IBV_WR_RDMA_WRITE_WITH_IMM ||
	       opcode == IBV_WR_SEND || opcode == IBV_WR_SEND_WITH_IMM ||
	       opcode == IBV_WR_RDMA_READ;
}

int sv_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	struct sv_qp *qp = to_qp(ibqp);
	int st = atomic_load(&qp->s->state);
	int64_t now = sv_now_ns();
	uint32_t tail;
	int rc = 0;

	if (sv_nic_dead(sv_proc.f, qp->s->nic, qp->s->epoch)) {
		*bad_wr = wr;
		return EIO;
	}
	if (st != IBV_QPS_RTS && st != IBV_QPS_ERR) {
		*bad_wr = wr;
		return EINVAL;
	}
	pthread_mutex_lock(&qp->post_lock);
	tail = atomic_load_explicit(&qp->sq_tail, memory_order_relaxed);
	for (; wr; wr = wr->next) {
		struct sv_swr *w;
		uint64_t len = 0;

		if (!sv_opcode_ok(wr->opcode)) {
			rc = EINVAL;
			break;
		}
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->cap.max_send_sge) {
			rc = EINVAL;
			break;
		}
		for (int i = 0; i < wr->num_sge; i++)
			len += wr->sg_list[i].length;
		if (len > (1ull << 31) ||
		    ((wr->send_flags & IBV_SEND_INLINE) &&
		     (wr->opcode == IBV_WR_RDMA_READ || len > qp->cap.max_inline_data))) {
			rc = EINVAL;
			break;
		}
		if (tail - atomic_load_explicit(&qp->sq_head, memory_order_acquire) >=
		    qp->cap.max_send_wr) {
			rc = ENOMEM;
			break;
		}
		w = &qp->sq[tail % qp->cap.max_send_wr];
		w->wr_id = wr->wr_id;
		w->opcode = wr->opcode;
		w->flags = wr->send_flags;
		w->imm = wr->imm_data;
		w->raddr = wr->wr.rdma.remote_addr;
		w->rkey = wr->wr.rdma.rkey;
		w->nsge = (uint32_t)wr->num_sge;
		w->len = len;
		sv_swr_queue(w, now);
		if (wr->send_flags & IBV_SEND_INLINE) {
			uint8_t *p = w->inl;

			for (int i = 0; i < wr->num_sge; i++) {
				memcpy(p, (void *)(uintptr_t)wr->sg_list[i].addr,
				       wr->sg_list[i].length);
				p += wr->sg_list[i].length;
			}
		} else {
			if (wr->num_sge)
				memcpy(w->sge, wr->sg_list,
				       sizeof(struct ibv_sge) * (size_t)wr->num_sge);
		}
		atomic_store_explicit(&qp->sq_tail, ++tail, memory_order_release);
	}
	pthread_mutex_unlock(&qp->post_lock);
	if (rc)
		*bad_wr = wr;
	sv_sq_kick(qp, now);
	return rc;
}

/*
 * ---- the extended send API (ibv_wr_*) ----
 *
 * As on mlx5, ibv_wr_start takes the send queue, each opcode call fills the next
 * slot (with the ibv_qp_ex's wr_id and wr_flags of that moment) and the ibv_wr_set_*
 * calls complete it; ibv_wr_complete publishes them all, or none when any call
 * failed (its error is the answer), and ibv_wr_abort drops them.
 */
static struct sv_qp *qpx_to_qp(struct ibv_qp_ex *qpx)
{
	return sv_container_of(qpx, struct sv_qp, qpx);
}

static void sv_wr_fail(struct sv_qp *qp, int err)
{
	if (!qp->wr_err)
		qp->wr_err = err;
	qp->wr_cur = NULL;
}

static void sv_wr_start(struct ibv_qp_ex *qpx)
{
	struct sv_qp *qp = qpx_to_qp(qpx);

	pthread_mutex_lock(&qp->post_lock);
	qp->wr_tail = atomic_load_explicit(&qp->sq_tail, memory_order_relaxed);
	qp->wr_err = 0;
	qp->wr_cur = NULL;
}

static void sv_wr_new(struct ibv_qp_ex *qpx, int opcode, uint32_t rkey, uint64_t raddr, __be32 imm)
{
	struct sv_qp *qp = qpx_to_qp(qpx);
	struct sv_swr *w;

	if (qp->wr_err)
		return;
	if (qp->wr_tail - atomic_load_explicit(&qp->sq_head, memory_order_acquire) >=
	    qp->cap.max_send_wr) {
		sv_wr_fail(qp, ENOMEM);
		return;
	}
	w = &qp->sq[qp->wr_tail++ % qp->cap.max_send_wr];
	w->wr_id = qpx->wr_id;
	w->opcode = opcode;
	w->flags = qpx->wr_flags & ~IBV_SEND_INLINE; /* inline is ibv_wr_set_inline_data's */
	w->imm = imm;
	w->raddr = raddr;
	w->rkey = rkey;
	w->nsge = 0;
	w->len = 0;
	qp->wr_cur = w;
}

static void sv_wr_rdma_write(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t raddr)
{
	sv_wr_new(qpx, IBV_WR_RDMA_WRITE, rkey, raddr, 0);
}

static void sv_wr_rdma_write_imm(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t raddr, __be32 imm)
{
	sv_wr_new(qpx, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, raddr, imm);
}

static void sv_wr_rdma_read(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t raddr)
{
	sv_wr_new(qpx, IBV_WR_RDMA_READ, rkey, raddr, 0);
}

static void sv_wr_send(struct ibv_qp_ex *qpx)
{
	sv_wr_new(qpx, IBV_WR_SEND, 0, 0, 0);
}

static void sv_wr_send_imm(struct ibv_qp_ex *qpx, __be32 imm)
{
	sv_wr_new(qpx, IBV_WR_SEND_WITH_IMM, 0, 0, imm);
}

static void sv_wr_set_sge_list(struct ibv_qp_ex *qpx, size_t n, const struct ibv_sge *sg)
{
	struct sv_qp *qp = qpx_to_qp(qpx);
	struct sv_swr *w = qp->wr_cur;
	uint64_t len = 0;

	if (!w || n > qp->cap.max_send_sge) {
		sv_wr_fail(qp, EINVAL);
		return;
	}
	for (size_t i = 0; i < n; i++)
		len += sg[i].length;
	if (len > (1ull << 31)) {
		sv_wr_fail(qp, EINVAL);
		return;
	}
	if (n)
		memcpy(w->sge, sg, n * sizeof(*sg));
	w->nsge = (uint32_t)n;
	w->len = len;
	w->flags &= ~IBV_SEND_INLINE;
}

static void sv_wr_set_sge(struct ibv_qp_ex *qpx, uint32_t lkey, uint64_t addr, uint32_t length)
{
	struct ibv_sge sge = {.addr = addr, .length = length, .lkey = lkey};

	sv_wr_set_sge_list(qpx, 1, &sge);
}

static void sv_wr_set_inline_data_list(struct ibv_qp_ex *qpx, size_t n,
				       const struct ibv_data_buf *buf)
{
	struct sv_qp *qp = qpx_to_qp(qpx);
	struct sv_swr *w = qp->wr_cur;
	uint64_t len = 0;

	if (!w || w->opcode == IBV_WR_RDMA_READ) {
		sv_wr_fail(qp, EINVAL);
		return;
	}
	for (size_t i = 0; i < n; i++)
		len += buf[i].length;
	if (len > qp->cap.max_inline_data) {
		sv_wr_fail(qp, ENOMEM); /* what mlx5 answers for too much inline data */
		return;
	}
	len = 0;
	for (size_t i = 0; i < n; i++) {
		memcpy(w->inl + len, buf[i].addr, buf[i].length);
		len += buf[i].length;
	}
	w->nsge = 0;
	w->len = len;
	w->flags |= IBV_SEND_INLINE;
}

static void sv_wr_set_inline_data(struct ibv_qp_ex *qpx, void *addr, size_t length)
{
	struct ibv_data_buf buf = {.addr = addr, .length = length};

	sv_wr_set_inline_data_list(qpx, 1, &buf);
}

static int sv_wr_complete(struct ibv_qp_ex *qpx)
{
	struct sv_qp *qp = qpx_to_qp(qpx);
	int st = atomic_load(&qp->s->state), rc = qp->wr_err;
	int64_t now = sv_now_ns();

	/* A dead device refuses them, as ibv_post_send does. */
	if (sv_nic_dead(sv_proc.f, qp->s->nic, qp->s->epoch))
		rc = EIO;
	if (!rc && st != IBV_QPS_RTS && st != IBV_QPS_ERR)
		rc = EINVAL;
	if (!rc) {
		for (uint32_t t = atomic_load_explicit(&qp->sq_tail, memory_order_relaxed);
		     t != qp->wr_tail; t++)
			sv_swr_queue(&qp->sq[t % qp->cap.max_send_wr], now);
		atomic_store_explicit(&qp->sq_tail, qp->wr_tail, memory_order_release);
	}
	qp->wr_cur = NULL;
	pthread_mutex_unlock(&qp->post_lock);
	if (!rc)
		sv_sq_kick(qp, now);
	return rc;
}

static void sv_wr_abort(struct ibv_qp_ex *qpx)
{
	struct sv_qp *qp = qpx_to_qp(qpx);

	qp->wr_cur = NULL;
	pthread_mutex_unlock(&qp->post_lock);
}

/*
 * The builders of the opcodes the device executes; the others (atomics, memory
 * windows, invalidation, TSO, UD and XRC addressing) stay NULL, as their
 * send_ops_flags are refused at create time.
 */
void sv_qpx_init(struct sv_qp *qp)
{
	struct ibv_qp_ex *x = &qp->qpx;

	qp->has_qpx = true;
	x->wr_rdma_read = sv_wr_rdma_read;
	x->wr_rdma_write = sv_wr_rdma_write;
	x->wr_rdma_write_imm = sv_wr_rdma_write_imm;
	x->wr_send = sv_wr_send;
	x->wr_send_imm = sv_wr_send_imm;
	x->wr_set_inline_data = sv_wr_set_inline_data;
	x->wr_set_inline_data_list = sv_wr_set_inline_data_list;
	x->wr_set_sge = sv_wr_set_sge;
	x->wr_set_sge_list = sv_wr_set_sge_list;
	x->wr_start = sv_wr_start;
	x->wr_complete = sv_wr_complete;
	x->wr_abort = sv_wr_abort;
}
