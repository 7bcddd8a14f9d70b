/*
 * The data path of the software RDMA device: a QP's send queue executed one step at a
 * time (sv_qp_step), by whichever thread engine.c gives it to. Executing a write checks
 * the target's rkey in the shared MR table, moves the bytes with process_vm_writev
 * (memcpy within one process), then consumes the target's posted receive and places
 * its completion in the target's CQ ring in shared memory: the target process need
 * not run. No lock shared between processes or NICs is held while bytes move.
 *
 * Landing and completing are two steps, as on a wire: a request lands when its
 * request packets get to the responder, and completes when the acknowledgement comes
 * back (fabric.h says which faults lose which). A path that does not answer (local or
 * remote port down or black-holed, remote QP gone or not ready, remote process or
 * device dead, acknowledgements lost) is retried until the QP's own transport timeout,
 * 4.096 us * 2^timeout * (retry_cnt + 1) * SOFTVERBS_TIME_SCALE, has passed; then the
 * oldest request completes with IBV_WC_RETRY_EXC_ERR, the QP moves to ERR and
 * everything still queued (send and receive, landed or not) is flushed. A request
 * that landed is never executed again: the retransmission of a WRITE_WITH_IMM whose
 * acknowledgement was lost only gets the acknowledgement, it consumes no receive.
 */
#include "softverbs/internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define SV_SMALL_WRITE 1024	  /* lands in address order, 8-byte word by word */
#define SV_RETRY_POLL  1000000	  /* ns between attempts on a silent path */
#define SV_RNR_DELAY   1000000	  /* ns per RNR retry when rnr_retry < 7 */
#define SV_AHEAD       100000	  /* ns: a shaped slice due this soon lands now (a wake-up saved) */
#define SV_LATE	       1000000000 /* ns of its turns on the wire a late engine may catch up */
#define SV_DRAW_JITTER 0x6a6974746572ull /* "jitter": what a jitter draw is for */

/* What executing a request gives besides 0 (done) and an ibv_wc_status for the requester. */
#define SV_WAIT	  (-1) /* not yet: look again at *wake */
#define SV_RNR	  (-2) /* the responder has no receive posted */
#define SV_SILENT (-3) /* the responder does not answer */
#define SV_MORE	  (-4) /* a slice landed, the rest of the request has not */

/* Copies in address order; small copies 8 bytes at a time so no aligned word tears. */
static void sv_ordered_copy(void *dst, const void *src, size_t n, bool small)
{
	volatile uint64_t *d8 = dst;
	const uint64_t *s8 = src;
	volatile uint8_t *d = dst;
	const uint8_t *s = src;

	if (!small) {
		memcpy(dst, src, n);
		return;
	}
	if (((uintptr_t)dst | (uintptr_t)src) % 8 == 0) {
		for (; n >= 8; n -= 8)
			*d8++ = *s8++;
		d = (volatile uint8_t *)d8;
		s = (const uint8_t *)s8;
	}
	while (n--)
		*d++ = *s++;
}

/* The bytes [off, off + len) of an iovec list, as iovecs (none of length 0) into `out`. */
static int sv_iov_range(const struct iovec *iov, int n, uint64_t off, uint64_t len,
			struct iovec *out)
{
	int k = 0;

	for (int i = 0; i < n && len; i++) {
		uint64_t l = iov[i].iov_len;

		if (off >= l) {
			off -= l;
			continue;
		}
		out[k].iov_base = (char *)iov[i].iov_base + off;
		out[k].iov_len = l - off < len ? l - off : len;
		len -= out[k].iov_len;
		off = 0;
		k++;
	}
	return k;
}

/*
 * Cuts the local side of a small write so that no piece crosses an aligned 8-byte
 * word of the target. process_vm_writev pins the target's pages once per target
 * iovec and copies the local pieces into them one after the other, each a copy of
 * its own, so the target's words land whole and in address order (NCCL's FIFO
 * entries: `idx` at offset 40 after bytes 0-39) for about 1.6 times the cost of one
 * copy; cutting the target side instead costs a page pin per word (40 times).
 */
static int sv_split_local(const struct iovec *liov, const struct iovec *riov, int nr,
			  struct iovec *out)
{
	size_t lo = 0;
	int k = 0, li = 0;

	/* One source and one target range (a write from one SGE, as NCCL's FIFO
	 * entries and small steps are): the pieces in one pass, a fifth of the
	 * general loop's time, which was about half of a 1 KiB write's extra cost. */
	if (nr == 1 && liov[0].iov_len >= riov[0].iov_len) {
		char *l = liov[0].iov_base;
		size_t n = riov[0].iov_len, off = (8 - (uintptr_t)riov[0].iov_base % 8) % 8;

		if (off > n)
			off = n;
		if (off) {
			out[k].iov_base = l;
			out[k++].iov_len = off;
		}
		for (; off < n; off += 8) {
			out[k].iov_base = l + off;
			out[k++].iov_len = n - off < 8 ? n - off : 8;
		}
		return k;
	}
	for (int ri = 0; ri < nr; ri++) {
		uintptr_t ra = (uintptr_t)riov[ri].iov_base;
		size_t rl = riov[ri].iov_len;

		while (rl) {
			size_t piece = 8 - ra % 8;

			if (piece > rl)
				piece = rl;
			if (piece > liov[li].iov_len - lo)
				piece = liov[li].iov_len - lo;
			out[k].iov_base = (char *)liov[li].iov_base + lo;
			out[k].iov_len = piece;
			k++;
			ra += piece;
			rl -= piece;
			lo += piece;
			if (lo == liov[li].iov_len) {
				li++;
				lo = 0;
			}
		}
	}
	return k;
}

/*
 * Moves `len` bytes between local iovecs and iovecs of process `pid`: to it when
 * `write`, from it otherwise; `small` writes land in order, word by word. Returns 0,
 * -ESRCH (the process is gone) or -EFAULT.
 */
static int sv_xfer(int pid, bool write, struct iovec *liov, int nl, struct iovec *riov, int nr,
		   uint64_t len, bool small)
{
	struct iovec split[SV_SMALL_WRITE / 8 + SV_MAX_SEND_SGE + SV_RQ_SGE + 2];
	ssize_t n;

	if (len == 0)
		return 0;
	if (pid == getpid()) {
		int li = 0, ri = 0;
		size_t lo = 0, ro = 0;

		while (len) {
			size_t k = liov[li].iov_len - lo;

			if (riov[ri].iov_len - ro < k)
				k = riov[ri].iov_len - ro;
			if (len < k)
				k = len;
			if (write)
				sv_ordered_copy((char *)riov[ri].iov_base + ro,
						(char *)liov[li].iov_base + lo, k, small);
			else
				sv_ordered_copy((char *)liov[li].iov_base + lo,
						(char *)riov[ri].iov_base + ro, k, small);
			len -= k;
			lo += k;
			ro += k;
			if (lo == liov[li].iov_len) {
				li++;
				lo = 0;
			}
			if (ro == riov[ri].iov_len) {
				ri++;
				ro = 0;
			}
		}
		return 0;
	}
	if (write && small) {
		nl = sv_split_local(liov, riov, nr, split);
		liov = split;
	}
	n = write ? process_vm_writev(pid, liov, (unsigned long)nl, riov, (unsigned long)nr, 0)
		  : process_vm_readv(pid, liov, (unsigned long)nl, riov, (unsigned long)nr, 0);
	if (n == (ssize_t)len)
		return 0;
	if (n < 0 && (errno == ESRCH || errno == EPERM)) {
		if (errno == EPERM)
			fprintf(stderr, "softverbs: process_vm_%s to pid %d: %s (run as root)\n",
				write ? "writev" : "readv", pid, strerror(errno));
		return -ESRCH;
	}
	return -EFAULT;
}

/* Local SGEs -> iovecs, checked against this process's MRs; false = protection error. */
static bool sv_local_iov(struct sv_qp *qp, struct sv_swr *w, struct iovec *iov, bool writable)
{
	struct sv_fabric *f = sv_proc.f;
	uint32_t pd = sv_container_of(qp->qp.pd, struct sv_pd, pd)->id;
	int pid = getpid();

	for (uint32_t i = 0; i < w->nsge; i++) {
		struct ibv_sge *g = &w->sge[i];
		struct sv_mr_slot *m = sv_mr_find(f, g->lkey);

		if (!m || m->pid != pid || m->pd != pd || g->addr < m->iova ||
		    g->addr - m->iova + g->length > m->len)
			return false;
		if (writable && !(m->access & IBV_ACCESS_LOCAL_WRITE))
			return false;
		iov[i].iov_base = (void *)(uintptr_t)(m->addr + (g->addr - m->iova));
		iov[i].iov_len = g->length;
	}
	return true;
}

/* The target's rkey range -> its address; false = remote access error. */
static bool sv_remote_addr(struct sv_qp_slot *t, uint32_t rkey, uint64_t raddr, uint64_t len,
			   unsigned need, uint64_t *addr, struct sv_mr_slot **mp)
{
	struct sv_mr_slot *m = sv_mr_find(sv_proc.f, rkey);

	if (!m || m->pid != t->pid || m->pd != t->pd || !(m->access & need) ||
	    !(atomic_load(&t->access) & need) || raddr < m->iova || raddr - m->iova > m->len ||
	    len > m->len - (raddr - m->iova))
		return false;
	*addr = m->addr + (raddr - m->iova);
	*mp = m;
	return true;
}

/* What the path of a QP does right now, seen from the requester. */
struct sv_pathv {
	struct sv_qp_slot *t; /* the responder QP; NULL when there is none that could answer */
	bool req;	      /* requests get there */
	bool ack;	      /* acknowledgements and READ responses come back */
	int jitter;	      /* ms, 0 = none */
	int bh_side;	      /* a black hole just opened: on the local (0) or remote (1) NIC */
	uint32_t bh_seq;      /* its fault_seq */
	int64_t bh_ns;	      /* and when */
};

static void sv_path_view(struct sv_qp *qp, int64_t now, struct sv_pathv *pv)
{
	struct sv_fabric *f = sv_proc.f;
	uint32_t dqpn = qp->attr.dest_qp_num;
	struct sv_qp_slot *t = &f->qps[dqpn & (SV_MAX_QPS - 1)];
	/* t's fields are read once each, atomically: the slot may be reused meanwhile
	 * (its QP destroyed, another created, as a self-test's on another thread) */
	int nic[2] = {qp->s->nic, __atomic_load_n(&t->nic, __ATOMIC_RELAXED)}, st, jit;
	enum sv_link l[2];
	unsigned loss[2], lost_req[2] = {SV_LOSE_REQ_TX, SV_LOSE_REQ_RX};

	memset(pv, 0, sizeof(*pv));
	pv->bh_side = -1;
	if (!dqpn || atomic_load(&t->qpn) != dqpn)
		return;
	st = atomic_load(&t->state);
	if ((st != IBV_QPS_RTR && st != IBV_QPS_RTS) ||
	    sv_nic_dead(f, nic[1], __atomic_load_n(&t->epoch, __ATOMIC_RELAXED)))
		return;
	/*
	 * IB: the dlid names the target's NIC. RoCE: our GRH reaches it and its GRH
	 * reaches us (the acknowledgements and read responses travel by it); a GRH that
	 * leads elsewhere is silence both ways.
	 */
	if (f->net.link == SV_LL_ROCE
		? atomic_load(&qp->s->grh_peer) != nic[1] || atomic_load(&t->grh_peer) != qp->s->nic
		: f->nics[nic[1]].lid != qp->attr.ah_attr.dlid)
		return;
	pv->t = t;
	for (int i = 0; i < 2; i++) {
		l[i] = sv_nic_link(f, nic[i], now);
		loss[i] = sv_link_loss(l[i]);
	}
	pv->req = !(loss[0] & SV_LOSE_REQ_TX) && !(loss[1] & SV_LOSE_REQ_RX);
	pv->ack = !(loss[1] & SV_LOSE_ACK_TX) && !(loss[0] & SV_LOSE_ACK_RX);
	pv->jitter = sv_nic_jitter(f, nic[0]);
	jit = sv_nic_jitter(f, nic[1]);
	if (jit > pv->jitter)
		pv->jitter = jit;
	for (int i = 0; i < 2; i++) {
		uint32_t seq;

		if (!sv_link_is_blackhole(l[i]) || !(loss[i] & lost_req[i]))
			continue;
		seq = atomic_load(&f->nics[nic[i]].fault_seq);
		if (seq == qp->bh_seq[i])
			continue;
		qp->bh_seq[i] = seq;
		pv->bh_side = i;
		pv->bh_seq = seq;
		pv->bh_ns = atomic_load(&f->nics[nic[i]].fault_ns);
	}
}

static int64_t sv_retry_deadline(struct sv_qp *qp, struct sv_swr *w)
{
	double ns = 4096.0 * (double)(1ull << qp->attr.timeout) * (qp->attr.retry_cnt + 1) *
		    sv_proc.cfg.time_scale;
	int64_t from = w->first_ns > qp->progress_ns ? w->first_ns : qp->progress_ns;

	return from + (int64_t)ns;
}

/* Receiver not ready: rnr_retry 7 waits forever, otherwise gives up after the retries. */
static int sv_rnr(struct sv_qp *qp, struct sv_swr *w, int64_t now, int64_t *wake)
{
	if (qp->attr.rnr_retry < 7 &&
	    now - w->first_ns >=
		(int64_t)((qp->attr.rnr_retry + 1) * SV_RNR_DELAY * sv_proc.cfg.time_scale))
		return IBV_WC_RNR_RETRY_EXC_ERR;
	*wake = now + SV_RNR_POLL;
	return SV_WAIT;
}

/*
 * Consumes the receive peeked at index `idx` and completes it, unless the owner
 * flushed or reset the queue meanwhile (then the receive already completed, and
 * false: the responder left RTS while the message was landing, and drops it unacked,
 * as a NIC's responder in ERR does).
 */
static bool sv_rq_consume(struct sv_qp_slot *t, uint32_t qpn, uint32_t idx, const struct ibv_wc *wc)
{
	bool ok;

	sv_lock(&t->rq_lock);
	/* the QP the receive was peeked at, not one made in its slot since */
	ok = atomic_load(&t->qpn) == qpn && t->rq_head == idx && t->rq_tail != idx;
	if (ok) {
		t->rq_head++;
		sv_cq_push(sv_proc.f, t->rcq, t->rcq_id, wc);
	}
	pthread_mutex_unlock(&t->rq_lock);
	return ok;
}

/*
 * The receive a SEND or WRITE_WITH_IMM consumes: peeked at in the target QP's own
 * queue at each slice (and consumed when the last one lands), or taken from its SRQ,
 * which other requesters take from too: then at the first slice, under the SRQ's lock,
 * and held by the requester QP until the last one completes it; a request that fails
 * after taking it completes it in error.
 */
struct sv_recv {
	struct sv_rwqe wqe;
	uint32_t idx; /* own queue: where it was */
	uint32_t qpn; /* ... in the QP of this number */
	bool srq;
	uint32_t pd; /* the PD of its lkeys: the QP's, or the SRQ's */
};

static bool sv_recv_get(struct sv_qp *qp, struct sv_qp_slot *t, struct sv_recv *r)
{
	bool got;

	if (t->srq >= 0) {
		r->srq = true;
		r->pd = sv_proc.f->srqs[t->srq].pd;
		if (!qp->srq_held && !sv_srq_take(sv_proc.f, t->srq, t->srq_id, &qp->srq_wqe))
			return false;
		qp->srq_held = true;
		r->wqe = qp->srq_wqe;
		return true;
	}
	r->srq = false;
	r->pd = t->pd;
	sv_lock(&t->rq_lock);
	r->qpn = atomic_load(&t->qpn);
	r->idx = t->rq_head;
	got = r->idx != t->rq_tail;
	if (got)
		r->wqe = t->rq[r->idx % SV_RQ_CAP];
	pthread_mutex_unlock(&t->rq_lock);
	return got;
}

/* False when the responder's own queue was flushed or reset meanwhile (sv_rq_consume). */
static bool sv_recv_done(struct sv_qp *qp, struct sv_qp_slot *t, struct sv_recv *r,
			 const struct ibv_wc *wc)
{
	if (r->srq) {
		qp->srq_held = false;
		sv_cq_push(sv_proc.f, t->rcq, t->rcq_id, wc);
		return true;
	}
	return sv_rq_consume(t, r->qpn, r->idx, wc);
}

/* A request that failed after taking an SRQ receive: the receive completes in error. */
static int sv_recv_fail(struct sv_qp *qp, struct sv_qp_slot *t, struct sv_recv *r, int recv_status,
			int status)
{
	struct ibv_wc wc;

	if (r->srq) {
		sv_wc_fill(&wc, r->wqe.wr_id, recv_status, IBV_WC_RECV, 0, atomic_load(&t->qpn));
		sv_recv_done(qp, t, r, &wc);
	}
	return status;
}

/*
 * Under qp->lock: the request holding an SRQ receive will not land the rest (flushed,
 * reset, destroyed). The receive, which may hold part of its data, completes with a
 * flush error at the responder, unless that QP is gone (its receives went with it).
 */
void sv_srq_release(struct sv_qp *qp)
{
	struct sv_fabric *f = sv_proc.f;
	uint32_t dqpn = qp->attr.dest_qp_num;
	struct sv_qp_slot *t = &f->qps[dqpn & (SV_MAX_QPS - 1)];
	struct ibv_wc wc;

	if (!qp->srq_held)
		return;
	qp->srq_held = false;
	if (!dqpn || atomic_load(&t->qpn) != dqpn)
		return;
	sv_wc_fill(&wc, qp->srq_wqe.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, dqpn);
	sv_cq_push(f, t->rcq, t->rcq_id, &wc);
}

/*
 * Lands the bytes [w->done, w->done + n) of `w` at the responder `t`; with `last`,
 * the request's receive is then consumed and completed. Checks are those of the whole
 * request. Returns 0, SV_RNR, SV_SILENT or the requester's error status.
 */
static int sv_deliver(struct sv_qp *qp, struct sv_swr *w, struct sv_qp_slot *t, uint64_t n,
		      bool last)
{
	struct sv_fabric *f = sv_proc.f;
	struct iovec liov[SV_MAX_SEND_SGE], riov[SV_RQ_SGE];
	struct iovec lpart[SV_MAX_SEND_SGE], rpart[SV_RQ_SGE];
	bool read = w->opcode == IBV_WR_RDMA_READ;
	bool needs_recv = w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM || w->opcode == IBV_WR_SEND ||
			  w->opcode == IBV_WR_SEND_WITH_IMM;
	struct sv_recv rcv = {0};
	struct sv_mr_slot *target = NULL;
	uint64_t addr = 0, cap = 0;
	int nl = (int)w->nsge, nr = 1, rc;
	struct ibv_wc wc;

	if (w->flags & IBV_SEND_INLINE) {
		liov[0].iov_base = w->inl;
		liov[0].iov_len = w->len;
		nl = 1;
	} else if (!sv_local_iov(qp, w, liov, read)) {
		return IBV_WC_LOC_PROT_ERR;
	}
	if (needs_recv && !sv_recv_get(qp, t, &rcv))
		return SV_RNR;
	switch (w->opcode) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		/* A zero-length write carries no address: the rkey is not checked. */
		if (w->len && !sv_remote_addr(t, w->rkey, w->raddr, w->len, IBV_ACCESS_REMOTE_WRITE,
					      &addr, &target))
			return sv_recv_fail(qp, t, &rcv, IBV_WC_LOC_ACCESS_ERR,
					    IBV_WC_REM_ACCESS_ERR);
		riov[0].iov_base = (void *)(uintptr_t)addr;
		riov[0].iov_len = w->len;
		break;
	case IBV_WR_RDMA_READ:
		if (!sv_remote_addr(t, w->rkey, w->raddr, w->len, IBV_ACCESS_REMOTE_READ, &addr,
				    &target))
			return IBV_WC_REM_ACCESS_ERR;
		riov[0].iov_base = (void *)(uintptr_t)addr;
		riov[0].iov_len = w->len;
		break;
	default: /* SEND: scatter into the receive's SGEs, checked against the target's MRs */
		nr = 0;
		for (uint32_t i = 0; i < rcv.wqe.num_sge && cap < w->len; i++) {
			struct sv_mr_slot *m = sv_mr_find(f, rcv.wqe.sge[i].lkey);
			struct ibv_sge *g = &rcv.wqe.sge[i];

			if (!m || m->pid != t->pid || m->pd != rcv.pd ||
			    !(m->access & IBV_ACCESS_LOCAL_WRITE) || g->addr < m->iova ||
			    g->addr - m->iova + g->length > m->len)
				return sv_recv_fail(qp, t, &rcv, IBV_WC_LOC_PROT_ERR,
						    IBV_WC_REM_OP_ERR);
			riov[nr].iov_base = (void *)(uintptr_t)(m->addr + (g->addr - m->iova));
			riov[nr].iov_len = g->length;
			cap += g->length;
			nr++;
		}
		if (cap < w->len) {
			sv_wc_fill(&wc, rcv.wqe.wr_id, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0,
				   atomic_load(&t->qpn));
			sv_recv_done(qp, t, &rcv, &wc);
			return IBV_WC_REM_INV_REQ_ERR;
		}
		break;
	}
	/* Nothing to copy finds out whether the responder is alive: ask. */
	if (n == 0 && t->pid != getpid() && !sv_pid_alive(t->pid))
		return SV_SILENT;
	nl = sv_iov_range(liov, nl, w->done, n, lpart);
	nr = sv_iov_range(riov, nr, w->done, n, rpart);
	rc = sv_xfer(t->pid, !read, lpart, nl, rpart, nr, n, w->len <= SV_SMALL_WRITE);
	if (rc == -ESRCH)
		return SV_SILENT;
	if (rc)
		return sv_recv_fail(qp, t, &rcv, IBV_WC_LOC_ACCESS_ERR, IBV_WC_REM_ACCESS_ERR);
	/* Device memory: a write through the responder's NIC owes a flush there; a read
	 * through it orders every write it made to that process's memory (devmem.c). */
	if (read)
		sv_devmem_read(t->pid, t->nic);
	else if (target && target->dmabuf)
		sv_devmem_write(t->pid, t->nic, target, addr + w->done, n);
	/* A read response travels in the responder's traffic class. */
	if (read) {
		sv_nic_account(f, t->nic, qp->s->nic, n);
		sv_nic_account_class(f, t->nic, t->grh.traffic_class, n);
	} else {
		sv_nic_account(f, qp->s->nic, t->nic, n);
		sv_nic_account_class(f, qp->s->nic, qp->attr.ah_attr.grh.traffic_class, n);
	}
	if (last && needs_recv) {
		sv_wc_fill(&wc, rcv.wqe.wr_id, IBV_WC_SUCCESS,
			   w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RECV_RDMA_WITH_IMM
								   : IBV_WC_RECV,
			   (uint32_t)w->len, atomic_load(&t->qpn));
		if (w->opcode != IBV_WR_SEND) {
			wc.wc_flags = IBV_WC_WITH_IMM;
			wc.imm_data = w->imm;
		}
		wc.src_qp = qp->qp.qp_num;
		wc.slid = f->nics[qp->s->nic].lid;
		/* Its responder left RTS while it landed: no acknowledgement comes back (the
		 * requester retries), so the requester never retires a message whose receive
		 * the responder flushed. */
		if (!sv_recv_done(qp, t, &rcv, &wc))
			return SV_SILENT;
	}
	return 0;
}

/*
 * Lands what is due of `w`, in one copy of up to `max` bytes (at least one slice):
 * unshaped, that is everything; shaped, each slice (SV_SLICE bytes) first takes its
 * turn on both links and is due once its last bit has passed both. Each QP holds at
 * most one turn that is not due yet, so the QPs sharing a link alternate on it slice
 * by slice, while the copies stay large. The local turn starts where the QP's
 * previous one ended, or when the request was posted (or its jitter let it go),
 * whichever is later: an engine that gets the CPU late (by up to SV_LATE) does not lose
 * link time, as a NIC would not. The remote turn starts when the first bit left the
 * local link, or now if that is later (never from the future: a link's clock takes
 * turns in order). Returns 0 when the request is all there, SV_MORE, SV_WAIT (*wake
 * set), SV_RNR, SV_SILENT or an error status.
 */
static int sv_land(struct sv_qp *qp, struct sv_swr *w, struct sv_qp_slot *t, int64_t now,
		   uint64_t max, int64_t *wake)
{
	struct sv_fabric *f = sv_proc.f;
	bool read = w->opcode == IBV_WR_RDMA_READ;
	int rate_l = sv_nic_rate(f, qp->s->nic, sv_proc.cfg.shaping);
	int rate_r = sv_nic_rate(f, t->nic, sv_proc.cfg.shaping);
	uint64_t n = 0, left = w->len - w->done;
	int rc;

	while (n < left && (n == 0 || n + SV_SLICE <= max)) {
		uint64_t turn = left - n < SV_SLICE ? left - n : SV_SLICE;
		int64_t due;

		if ((rate_l || rate_r) && !w->slice) {
			int64_t from = qp->wire_ready;

			if (from < w->post_ns)
				from = w->post_ns;
			if (from < w->due_ns)
				from = w->due_ns;
			if (from < now - SV_LATE)
				from = now - SV_LATE;
			w->wire_ns = rate_l ? sv_nic_reserve(f, qp->s->nic, read ? SV_RX : SV_TX,
							     rate_l, turn, from)
					    : 0;
			w->start_ns = rate_l ? w->wire_ns - sv_wire_time(turn, rate_l) : from;
			w->far_ns =
			    rate_r ? sv_nic_reserve(f, t->nic, read ? SV_TX : SV_RX, rate_r, turn,
						    w->start_ns < now ? w->start_ns : now)
				   : 0;
			w->slice = turn;
		}
		if (w->slice) {
			due = w->wire_ns > w->far_ns ? w->wire_ns : w->far_ns;
			if (due > now + SV_AHEAD) {
				*wake = due;
				break;
			}
			qp->wire_ready = due;
			w->slice = 0;
		}
		n += turn;
	}
	if (n == 0 && left)
		return SV_WAIT;
	rc = sv_deliver(qp, w, t, n, n == left);
	if (rc)
		return rc;
	w->done += n;
	return w->done == w->len ? 0 : SV_MORE;
}

/*
 * A black hole just opened on the path. What was on the wire then (requests posted
 * before it, up to SOFTVERBS_INFLIGHT bytes counted from the head of the send queue)
 * may still land, in order: each request is drawn from the seed to land whole
 * (1 in 2), land in part (1 in 4: its first packets of path_mtu bytes, when it has more
 * than one), or be lost (1 in 4). Nothing behind a request that did not land whole
 * gets there, nor behind a READ (its response would have to come back through the
 * hole). What landed waits for acknowledgements that do not come.
 */
static void sv_inflight(struct sv_qp *qp, const struct sv_pathv *pv, int64_t now)
{
	uint64_t mtu = 128ull << qp->attr.path_mtu, from_head = 0;
	uint64_t what = (uint64_t)pv->bh_side << 32 | pv->bh_seq;
	uint32_t tail = atomic_load_explicit(&qp->sq_tail, memory_order_acquire);

	for (uint32_t i = atomic_load_explicit(&qp->sq_head, memory_order_relaxed);
	     i != qp->sq_exec; i++)
		from_head += qp->sq[i % qp->cap.max_send_wr].len;
	while (!qp->nak && qp->sq_exec != tail) {
		struct sv_swr *w = &qp->sq[qp->sq_exec % qp->cap.max_send_wr];
		uint64_t left = w->len - w->done, u, room, pk, fit;

		from_head += w->done;
		if (w->post_ns > pv->bh_ns || from_head >= sv_proc.cfg.inflight ||
		    w->opcode == IBV_WR_RDMA_READ)
			break;
		room = sv_proc.cfg.inflight - from_head;
		u = sv_draw(qp->key, what, qp->sq_exec);
		if (!w->first_ns)
			w->first_ns = now;
		if (u % 4 < 2 && left <= room) {
			if (sv_deliver(qp, w, pv->t, left, true))
				break;
			w->done = w->len;
			w->slice = 0;
			from_head += left;
			qp->sq_exec++;
			continue;
		}
		/* In part: whole packets, never the last one (that would be all of it). */
		fit = (left < room ? left : room) / mtu;
		if (fit >= (left + mtu - 1) / mtu)
			fit = left ? (left + mtu - 1) / mtu - 1 : 0;
		if (u % 4 == 3 || fit == 0)
			break;
		pk = u % 4 == 2 ? 1 + (u >> 8) % fit : fit;
		if (sv_deliver(qp, w, pv->t, pk * mtu, false) == 0) {
			w->done += pk * mtu;
			w->slice = 0;
		}
		break;
	}
}

/* Draws when a request may land, in order behind the request before it. */
static void sv_jitter(struct sv_qp *qp, struct sv_swr *w, int ms)
{
	int64_t due = w->post_ns + (int64_t)(sv_draw(qp->key, SV_DRAW_JITTER, qp->sq_exec) %
					     ((uint64_t)ms * 1000000));

	if (due < qp->jitter_ns)
		due = qp->jitter_ns;
	w->due_ns = qp->jitter_ns = due;
}

/*
 * Under qp->lock: completes what landed, as its acknowledgements come, oldest first;
 * each slot is free before its completion can be polled (sv_sq_retire).
 */
static void sv_ack(struct sv_qp *qp, int64_t now)
{
	uint32_t head = atomic_load_explicit(&qp->sq_head, memory_order_relaxed);

	for (; head != qp->sq_exec; head++) {
		sv_sq_retire(qp, head, IBV_WC_SUCCESS);
		qp->progress_ns = now;
	}
}

/* Under qp->lock: the oldest request fails with `status`; the QP goes to ERR. */
static void sv_qp_fail(struct sv_qp *qp, int status)
{
	sv_sq_retire(qp, atomic_load_explicit(&qp->sq_head, memory_order_relaxed), status);
	sv_qp_set_state(qp, IBV_QPS_ERR);
	sv_qp_flush(qp);
}

/*
 * Under qp->lock: the oldest request waits for an answer that does not come (a
 * silent path, an acknowledgement lost): the requester retries until its transport
 * timeout, counted from its first attempt or the last acknowledged progress, then
 * fails it with RETRY_EXC_ERR (timeout 0 = forever, as in the spec). No async event
 * for that (as mlx5).
 */
static int64_t sv_stalled(struct sv_qp *qp, int64_t now, int64_t wake)
{
	struct sv_swr *w =
	    &qp->sq[atomic_load_explicit(&qp->sq_head, memory_order_relaxed) % qp->cap.max_send_wr];
	int64_t deadline = qp->attr.timeout ? sv_retry_deadline(qp, w) : SV_NEVER;

	if (now >= deadline) {
		sv_qp_fail(qp, IBV_WC_RETRY_EXC_ERR);
		return SV_NEVER;
	}
	if (deadline < wake)
		wake = deadline;
	return wake < now + SV_RETRY_POLL ? wake : now + SV_RETRY_POLL;
}

/*
 * Under qp->lock: moves the send queue on as far as it goes now: acknowledges what
 * landed when the path answers, lands the following requests in order (a slice of a
 * large one at a time), stopping before a request longer than `max_len` or once
 * `budget` bytes went. Returns SV_NEVER when nothing is left to do (an empty queue, or
 * a dead device, which does nothing at all), otherwise when to look again (`now`: at
 * once).
 */
int64_t sv_qp_step(struct sv_qp *qp, int64_t now, uint64_t max_len, uint64_t budget)
{
	uint32_t tail = atomic_load_explicit(&qp->sq_tail, memory_order_acquire);
	int64_t wake = SV_NEVER;
	bool stalled = false;
	uint64_t spent = 0;
	struct sv_pathv pv;

	if (atomic_load_explicit(&qp->sq_head, memory_order_relaxed) == tail ||
	    sv_nic_dead(sv_proc.f, qp->s->nic, qp->s->epoch))
		return SV_NEVER;
	if (qp->attr.qp_state == IBV_QPS_ERR) {
		sv_qp_flush(qp);
		return SV_NEVER;
	}
	sv_path_view(qp, now, &pv);
	if (pv.bh_side >= 0)
		sv_inflight(qp, &pv, now);
	/* A retransmission of what landed gets through and is acknowledged. */
	if (pv.req && pv.ack)
		sv_ack(qp, now);
	while (!qp->nak && qp->sq_exec != tail) {
		struct sv_swr *w = &qp->sq[qp->sq_exec % qp->cap.max_send_wr];
		uint64_t before = w->done;
		int rc;

		if (w->len > max_len || spent >= budget) {
			wake = now;
			break;
		}
		if (!w->first_ns)
			w->first_ns = now;
		/* A READ's data is its response: it travels the acknowledgements' way. */
		if (!pv.req || (!pv.ack && w->opcode == IBV_WR_RDMA_READ)) {
			stalled = true;
			break;
		}
		if (pv.jitter && !w->due_ns)
			sv_jitter(qp, w, pv.jitter);
		if (w->due_ns > now + SV_AHEAD) {
			wake = w->due_ns;
			break;
		}
		rc = sv_land(qp, w, pv.t, now, budget - spent, &wake);
		if (rc == SV_WAIT)
			break;
		if (rc == SV_SILENT || (rc == SV_RNR && !pv.ack)) {
			stalled = true; /* the RNR NAK is lost: a transport retry */
			break;
		}
		if (rc == SV_RNR) {
			qp->wire_ready = now; /* its stream on the wire starts again later */
			rc = sv_rnr(qp, w, now, &wake);
			if (rc == SV_WAIT)
				break;
		}
		spent += w->done - before;
		if (pv.ack)
			qp->progress_ns = now;
		if (rc == SV_MORE) {
			now = sv_now_ns();
			continue;
		}
		if (rc) {
			qp->nak = rc; /* the responder refused it; heard when the path answers */
			break;
		}
		spent += 64; /* a request costs something even when empty */
		qp->sq_exec++;
		if (pv.ack)
			sv_ack(qp, now);
		now = sv_now_ns();
	}
	if (qp->nak && pv.req && pv.ack) {
		sv_qp_fail(qp, qp->nak);
		return SV_NEVER;
	}
	if (stalled)
		qp->wire_ready = now;
	if (stalled || qp->nak ||
	    atomic_load_explicit(&qp->sq_head, memory_order_relaxed) != qp->sq_exec)
		return sv_stalled(qp, now, wake);
	return wake;
}
