/*
 * Model test of repair/model/qp_shadow: an in-memory RC connection between an NCCL-
 * like sender and receiver over 1-4 queue-pair pairs, a failure at a random
 * moment, and a repair built only from the two sides' shadows and the counts
 * the control plane would exchange. Thousands of seeds; every one must end with
 * all data delivered exactly once.
 *
 * The traffic follows NCCL 2.28's net/IB protocol, scaled down: S FIFO slots
 * (NCCL: 256) and a window of at most S outstanding requests. Receiver, per
 * request id: one zero-SGE receive per QP (wr_id = slot), then a 64-byte FIFO
 * element {addr, size, rkey, idx = id + 1 at offset 40} RDMA-written into the
 * sender's FIFO slot on QP id % nq, signalled only when slot == id % nq (NCCL's
 * slot == devIndex rule), inline or not. Sender: consumes slot fifoHead % S
 * when its idx is fifoHead + 1 and the slot's previous send has completed,
 * then per QP a 128-byte-aligned chunk: either one signalled WRITE_WITH_IMM
 * carrying it, or an unsignalled WRITE plus a zero-byte signalled
 * WRITE_WITH_IMM (imm = size, wr_id = slot).
 *
 * The wire: each QP executes its send queue in order, at random moments; the
 * NIC reads a small non-inline write's source when it sends it, and it lands a
 * flight later (other QPs' requests may be read and land in between); an IMM waits (RNR) for a
 * posted receive; a signalled request's acknowledgement comes back later, in order. The failure, on
 * a random non-empty set of QP pairs, in both directions: some acknowledgements in flight arrive,
 * the rest are lost (the peer may already have used what they acknowledge); a random number of
 * pending requests still land in full (no acknowledgement), the next may land in part (a byte
 * prefix, never a receive), the rest never land. Both sides then drain their CQs through the
 * shadows, exchange receive-consumed counts (and the sender's FIFO head), build plans, translate
 * keys to the new NIC, re-post on fresh QPs and hand the synthesised completions to "NCCL". Some
 * seeds fail twice.
 *
 * Checked: every request's bytes are right when it completes; every IMM lands
 * exactly once, in order, on the right receive (wr_id, imm); no data write
 * lands after its request's IMM, or into a reused buffer; every signalled send
 * completes exactly once, in order (synthesised or real); no FIFO element is
 * overwritten by an older one; no plan re-sends a message, data write or FIFO
 * element the peer had already consumed; keys on a new QP are the new NIC's;
 * the run finishes. Two deliberately wrong repairs (k - 1 instead of k; no FIFO
 * report from the sender) must be caught, and so must the engine's configuration
 * with 3 QPs (3 fused NICs) and no FIFO report; a landed check (the sender's slot
 * holds the write's element or a newer one) makes every configuration safe.
 */
#include "repair/model/qp_shadow.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S	    8
#define ELEM	    64
#define RBUF	    2048
#define MAXN	    64
#define MAXQ	    4
#define QCAP	    2048
#define CQCAP	    8192
#define MAXQPS	    96
#define FLQ	    MAXQ /* logical index of the receiver's loopback flush QP */
#define FLUSH_WR_ID 0x1000

enum { SND = 0, RCV = 1 };
enum { R_NONE, R_RBUF, R_RELEM, R_SBUF, R_FIFO, R_SCRATCH };
enum { NEG_NONE, NEG_K_MINUS_1, NEG_NO_FIFO_REPORT };
/* run_seed flags */
#define SINGLE_PATH 1 /* every write to a FIFO slot on one QP (nq 1, 2, 4), not inline */
#define WIRE_ONLY   2 /* skip the plan-time "consumed" checks: only what lands is judged */
#define THREE_QPS   4 /* 3 QPs, not inline: one slot's writes alternate QPs (3 fused NICs) */
/* The receiver's plan asks whether each FIFO write landed: the sender's slot holds
 * its element or a newer one (the sender's memory as it is after the fence) */
#define LANDED_CHECK 8
/* NCCL 2.18-2.28: the sender zeroes a slot's first element once it has consumed it
 * and posted the data (2.29 on leaves it) */
#define CLEARS 16

struct mwr {
	enum ibv_wr_opcode op;
	unsigned int flags;
	uint64_t wr_id, raddr, laddr, tag;
	uint32_t imm, rkey, len, lkey;
	int nsge;
	uint8_t data[ELEM]; /* inline payload, copied at post; or read by the NIC (fetched) */
	bool reposted, fetched;
};

struct mqp {
	int side, q, nic;
	bool dead;
	struct r2cc_qp_shadow *sh;
	struct mwr sq[QCAP];
	size_t sq_h, sq_n;
	uint64_t rq[QCAP];
	size_t rq_h, rq_n;
	struct ibv_wc acks[QCAP]; /* requester completions on their way back */
	size_t ack_h, ack_n;
	struct mqp *peer;
};

struct mcqe {
	struct mqp *qp;
	int q;
	struct ibv_wc wc;
};

struct cqring {
	struct mcqe e[CQCAP];
	size_t h, n;
};

struct model {
	uint64_t rng;
	int nq, n, w, neg, flags;
	bool inl, flush;
	uint8_t rbuf[S][RBUF], relem[S][ELEM], sbuf[S][RBUF], fifo[S][ELEM], scratch[S];
	struct mqp *cur[2][MAXQ + 1]; /* cur[RCV][FLQ]: the flush QP, its own peer */
	struct mqp *qps[MAXQPS];
	int nqps;
	struct cqring hw[2], vis[2];
	uint64_t cur_tag;
	/* sender */
	int fifo_head, ssid[S], spend[MAXN];
	uint32_t ssize[MAXN];
	uint64_t sexp[MAXQ][QCAP];
	size_t sexp_h[MAXQ], sexp_n[MAXQ];
	/* receiver */
	int rpost, rlow, rid[S], rcnt[MAXN], rnext[MAXQ];
	bool rdone[MAXN];
	uint64_t cexp[MAXQ + 1][QCAP]; /* [FLQ]: flush READs */
	size_t cexp_h[MAXQ + 1], cexp_n[MAXQ + 1];
	/* truth */
	int landed_imm[MAXQ + 1];
	/* outcome */
	char viol[256];
	int failures, neg_applied;
	uint64_t synth, saved, reposted, superseded, consumed, reads;
};

struct totals {
	int seeds, failed_seeds, twice, bad, neg_applicable;
	uint64_t synth, saved, reposted, superseded, consumed, reads;
	char first[512];
};

static uint64_t rnd(struct model *m)
{
	uint64_t x = m->rng;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	m->rng = x;
	return x * 0x2545F4914F6CDD1Dull;
}

static uint32_t below(struct model *m, uint32_t n)
{
	return n ? (uint32_t)(rnd(m) % n) : 0;
}

static void violate(struct model *m, const char *what, long a, long b)
{
	if (!m->viol[0])
		snprintf(m->viol, sizeof(m->viol), "%s (%ld, %ld)", what, a, b);
}

static uint8_t pattern(int j, uint32_t b)
{
	return (uint8_t)(j * 131 + b * 7 + (b >> 8) + 1);
}

static int region(struct model *m, uint64_t a, size_t *off_p)
{
	struct {
		const void *base;
		size_t len;
		int r;
	} t[] = {{m->rbuf, sizeof(m->rbuf), R_RBUF},
		 {m->relem, sizeof(m->relem), R_RELEM},
		 {m->sbuf, sizeof(m->sbuf), R_SBUF},
		 {m->fifo, sizeof(m->fifo), R_FIFO},
		 {m->scratch, sizeof(m->scratch), R_SCRATCH}};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		uint64_t b = (uintptr_t)t[i].base;
		if (a >= b && a < b + t[i].len) {
			*off_p = (size_t)(a - b);
			return t[i].r;
		}
	}
	return R_NONE;
}

static uint32_t key(int nic, int r)
{
	return (uint32_t)(nic << 8 | r);
}

static uint64_t tag_now(void *ctx, const struct ibv_send_wr *wr)
{
	return ((struct model *)ctx)->cur_tag;
}

static struct mqp *new_qp(struct model *m, int side, int q, int nic)
{
	struct mqp *p = calloc(1, sizeof(*p));
	cr_assert_not_null(p);
	struct r2cc_qp_shadow_attr a = {.max_send_wr = 512,
					.max_recv_wr = 256,
					.max_send_sge = 1,
					.max_recv_sge = 1,
					.max_inline_data = ELEM,
					.tag_fn = tag_now,
					.tag_ctx = m};
	cr_assert_eq(r2cc_qp_shadow_create(&a, &p->sh), 0);
	p->side = side;
	p->q = q;
	p->nic = nic;
	cr_assert_lt(m->nqps, MAXQPS);
	m->qps[m->nqps++] = p;
	return p;
}

static void cq_push(struct cqring *r, struct mqp *qp, int q, const struct ibv_wc *wc)
{
	cr_assert_lt(r->n - r->h, CQCAP);
	struct mcqe *e = &r->e[r->n++ % CQCAP];
	e->qp = qp;
	e->q = q;
	e->wc = *wc;
}

/* Posts a verbs request on a physical QP: shadow first, then the "NIC". */
static void qp_post_send(struct model *m, struct mqp *p, const struct ibv_send_wr *wr, uint64_t tag,
			 bool reposted)
{
	m->cur_tag = tag;
	int rc = r2cc_qp_shadow_post_send(p->sh, wr, NULL);
	if (rc)
		violate(m, "shadow refused a post", rc, p->q);
	cr_assert_lt(p->sq_n - p->sq_h, QCAP);
	struct mwr *e = &p->sq[p->sq_n++ % QCAP];
	memset(e, 0, sizeof(*e));
	e->op = wr->opcode;
	e->flags = wr->send_flags;
	e->wr_id = wr->wr_id;
	e->imm = wr->imm_data;
	e->raddr = wr->wr.rdma.remote_addr;
	e->rkey = wr->wr.rdma.rkey;
	e->nsge = wr->num_sge;
	e->tag = tag;
	e->reposted = reposted;
	if (wr->num_sge) {
		e->laddr = wr->sg_list[0].addr;
		e->len = wr->sg_list[0].length;
		e->lkey = wr->sg_list[0].lkey;
		if (wr->send_flags & IBV_SEND_INLINE)
			memcpy(e->data, (const void *)(uintptr_t)e->laddr, e->len);
	}
}

static void qp_post_recv(struct model *m, struct mqp *p, const struct ibv_recv_wr *wr)
{
	int rc = r2cc_qp_shadow_post_recv(p->sh, wr, NULL);
	if (rc)
		violate(m, "shadow refused a receive", rc, p->q);
	cr_assert_lt(p->rq_n - p->rq_h, QCAP);
	p->rq[p->rq_n++ % QCAP] = wr->wr_id;
}

/* What R2CC does with an NCCL post after migration: translate the keys. */
static void nccl_post_send(struct model *m, int side, int q, struct ibv_send_wr *wr, uint64_t tag)
{
	struct mqp *p = m->cur[side][q];
	wr->wr.rdma.rkey = key(p->nic, wr->wr.rdma.rkey & 0xff);
	for (int i = 0; i < wr->num_sge; i++)
		wr->sg_list[i].lkey = key(p->nic, wr->sg_list[i].lkey & 0xff);
	qp_post_send(m, p, wr, tag, false);
}

/* Lands len bytes of e (from its start) at the target, with the checks. */
static void land(struct model *m, struct mqp *p, const struct mwr *e, uint32_t len)
{
	if (!len)
		return;
	size_t loff, roff;
	int lr = region(m, e->laddr, &loff), rr = region(m, e->raddr, &roff);
	if (!(e->flags & IBV_SEND_INLINE) && e->lkey != key(p->nic, lr))
		violate(m, "lkey not of this NIC", e->lkey, p->nic);
	if (e->rkey != key(p->nic, rr))
		violate(m, "rkey not of this NIC", e->rkey, p->nic);
	const uint8_t *src = (e->flags & IBV_SEND_INLINE) || e->fetched
				 ? e->data
				 : (const uint8_t *)(uintptr_t)e->laddr;
	uint8_t *dst = (uint8_t *)(uintptr_t)e->raddr;
	int j = (int)e->tag - 1;
	if (rr == R_FIFO) {
		for (uint32_t o = 0; o + ELEM <= len; o += ELEM) {
			uint64_t in, now;
			memcpy(&in, src + o + 40, 8);
			memcpy(&now, dst + o + 40, 8);
			if (in < now)
				violate(m, "FIFO element overwritten by an older one", (long)in,
					(long)now);
		}
	} else if (rr == R_RBUF) {
		size_t slot = roff / RBUF;
		if (m->rid[slot] != j)
			violate(m, "data written into a reused receive buffer", j, m->rid[slot]);
		if (m->landed_imm[p->q] > j)
			violate(m, "data written after its request's IMM landed", j, p->q);
	}
	memmove(dst, src, len);
}

/* A READ: len bytes of the response reach the local buffer. */
static void read_back(struct model *m, struct mqp *p, const struct mwr *e, uint32_t len)
{
	size_t off;
	if (e->lkey != key(p->nic, region(m, e->laddr, &off)))
		violate(m, "lkey not of this NIC", e->lkey, p->nic);
	if (e->rkey != key(p->nic, region(m, e->raddr, &off)))
		violate(m, "rkey not of this NIC", e->rkey, p->nic);
	memmove((void *)(uintptr_t)e->laddr, (const void *)(uintptr_t)e->raddr, len);
}

/* Executes the oldest pending request of p (or has the NIC read a small write's
 * source); false when it must wait (RNR). */
static bool exec_one(struct model *m, struct mqp *p, bool ack)
{
	struct mwr *e = &p->sq[p->sq_h % QCAP];
	struct mqp *t = p->peer;
	if (e->op == IBV_WR_RDMA_WRITE_WITH_IMM && t->rq_h == t->rq_n)
		return false;
	/* A small write's source is read by the NIC when it sends, and lands a
	 * flight later: requests of other QPs may be read and land in between. */
	if (!(e->flags & IBV_SEND_INLINE) && !e->fetched && e->nsge && e->len <= ELEM &&
	    e->op == IBV_WR_RDMA_WRITE && (rnd(m) & 1)) {
		memcpy(e->data, (const void *)(uintptr_t)e->laddr, e->len);
		e->fetched = true;
		return true;
	}
	if (e->op == IBV_WR_RDMA_READ)
		read_back(m, p, e, ack ? e->len : below(m, e->len + 1));
	else
		land(m, p, e, e->nsge ? e->len : 0);
	if (e->op == IBV_WR_RDMA_WRITE_WITH_IMM) {
		int j = (int)e->tag - 1;
		if (m->landed_imm[p->q] != j)
			violate(m, "IMM landed out of order or twice", j, m->landed_imm[p->q]);
		m->landed_imm[p->q]++;
		struct ibv_wc wc = {.wr_id = t->rq[t->rq_h++ % QCAP],
				    .status = IBV_WC_SUCCESS,
				    .opcode = IBV_WC_RECV_RDMA_WITH_IMM,
				    .byte_len = e->nsge ? e->len : 0,
				    .imm_data = e->imm,
				    .wc_flags = IBV_WC_WITH_IMM};
		cq_push(&m->hw[t->side], t, t->q, &wc);
	}
	if (ack && (e->flags & IBV_SEND_SIGNALED)) {
		struct ibv_wc wc = {.wr_id = e->wr_id,
				    .status = IBV_WC_SUCCESS,
				    .opcode = e->op == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ
									: IBV_WC_RDMA_WRITE};
		cr_assert_lt(p->ack_n - p->ack_h, QCAP);
		p->acks[p->ack_n++ % QCAP] = wc;
	}
	p->sq_h++;
	return true;
}

/* The oldest acknowledgement of p reaches its CQ. */
static bool ack_one(struct model *m, struct mqp *p)
{
	if (p->ack_h == p->ack_n)
		return false;
	cq_push(&m->hw[p->side], p, p->q, &p->acks[p->ack_h++ % QCAP]);
	return true;
}

/* R2CC's poll wrapper: the shadow sees every completion before NCCL does. */
static bool r2cc_poll(struct model *m, int side)
{
	struct cqring *r = &m->hw[side];
	if (r->h == r->n)
		return false;
	struct mcqe *e = &r->e[r->h++ % CQCAP];
	int rc = r2cc_qp_shadow_wc(e->qp->sh, &e->wc);
	if (rc)
		violate(m, "shadow rejected a completion", rc, e->q);
	cq_push(&m->vis[side], e->qp, e->q, &e->wc);
	return true;
}

/* --- NCCL-like endpoints ------------------------------------------------------ */

static bool receiver_post(struct model *m)
{
	int j = m->rpost;
	if (j >= m->n || j >= m->rlow + m->w)
		return false;
	int slot = j % S;
	m->rid[slot] = j;
	for (int q = 0; q < m->nq; q++) {
		struct ibv_recv_wr r = {.wr_id = (uint64_t)slot, .num_sge = 0};
		qp_post_recv(m, m->cur[RCV][q], &r);
	}
	uint8_t *el = m->relem[slot];
	memset(el, 0, ELEM);
	uint64_t addr = (uintptr_t)m->rbuf[slot], idx = (uint64_t)j + 1;
	uint32_t size = RBUF, rkey = key(0, R_RBUF);
	memcpy(el, &addr, 8);
	memcpy(el + 8, &size, 4);
	memcpy(el + 12, &rkey, 4);
	memcpy(el + 40, &idx, 8);
	int q = j % m->nq;
	bool sig = slot == q;
	struct ibv_sge sge = {(uintptr_t)el, ELEM, key(0, R_RELEM)};
	struct ibv_send_wr wr = {.wr_id = sig ? (uint64_t)slot : 0,
				 .sg_list = &sge,
				 .num_sge = 1,
				 .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = (sig ? IBV_SEND_SIGNALED : 0) |
					       (m->inl ? IBV_SEND_INLINE : 0)};
	wr.wr.rdma.remote_addr = (uintptr_t)m->fifo[slot];
	wr.wr.rdma.rkey = key(0, R_FIFO);
	nccl_post_send(m, RCV, q, &wr, idx);
	if (sig)
		m->cexp[q][m->cexp_n[q]++ % QCAP] = (uint64_t)slot;
	m->rpost++;
	return true;
}

static void request_done(struct model *m, int j)
{
	m->rdone[j] = true;
	while (m->rlow < m->n && m->rdone[m->rlow])
		m->rlow++;
}

/* NCCL's GPU flush: a signalled 1-byte READ of the buffer on a loopback QP. */
static void post_flush(struct model *m, int j)
{
	int slot = j % S;
	struct ibv_sge sge = {(uintptr_t)&m->scratch[slot], 1, key(0, R_SCRATCH)};
	struct ibv_send_wr wr = {.wr_id = FLUSH_WR_ID + (uint64_t)slot,
				 .sg_list = &sge,
				 .num_sge = 1,
				 .opcode = IBV_WR_RDMA_READ,
				 .send_flags = IBV_SEND_SIGNALED};
	wr.wr.rdma.remote_addr = (uintptr_t)m->rbuf[slot];
	wr.wr.rdma.rkey = key(0, R_RBUF);
	nccl_post_send(m, RCV, FLQ, &wr, (uint64_t)j + 1);
	m->cexp[FLQ][m->cexp_n[FLQ]++ % QCAP] = wr.wr_id;
}

static void receiver_complete(struct model *m, const struct mcqe *e)
{
	int q = e->q;
	if (e->wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
		int j = m->rnext[q]++;
		if (j >= m->rpost) {
			violate(m, "receive completion with no receive outstanding", j, q);
			return;
		}
		if (e->wc.wr_id != (uint64_t)(j % S))
			violate(m, "receive completed with the wrong wr_id", (long)e->wc.wr_id, j);
		if (be32toh(e->wc.imm_data) != m->ssize[j])
			violate(m, "receive completed with the wrong imm", j, q);
		if (++m->rcnt[j] == m->nq) {
			const uint8_t *b = m->rbuf[j % S];
			for (uint32_t i = 0; i < m->ssize[j]; i++)
				if (b[i] != pattern(j, i)) {
					violate(m, "request data wrong at completion", j, i);
					break;
				}
			if (m->flush)
				post_flush(m, j);
			else
				request_done(m, j);
		}
		return;
	}
	if (e->wc.opcode == IBV_WC_RDMA_READ) {
		if (q != FLQ || m->cexp_h[q] == m->cexp_n[q] ||
		    m->cexp[q][m->cexp_h[q] % QCAP] != e->wc.wr_id) {
			violate(m, "unexpected or duplicate flush completion", (long)e->wc.wr_id,
				q);
			return;
		}
		m->cexp_h[q]++;
		request_done(m, m->rid[e->wc.wr_id - FLUSH_WR_ID]);
		return;
	}
	if (m->cexp_h[q] == m->cexp_n[q] || m->cexp[q][m->cexp_h[q] % QCAP] != e->wc.wr_id)
		violate(m, "unexpected or duplicate FIFO-write completion", (long)e->wc.wr_id, q);
	else
		m->cexp_h[q]++;
}

static bool sender_consume(struct model *m)
{
	int j = m->fifo_head;
	if (j >= m->n)
		return false;
	int slot = j % S;
	uint64_t idx;
	memcpy(&idx, m->fifo[slot] + 40, 8);
	if (idx != (uint64_t)j + 1 || m->ssid[slot] >= 0)
		return false;
	uint64_t addr;
	uint32_t rkey;
	memcpy(&addr, m->fifo[slot], 8);
	memcpy(&rkey, m->fifo[slot] + 12, 4);
	if (addr != (uintptr_t)m->rbuf[slot])
		violate(m, "sender read a torn FIFO element", j, slot);
	uint32_t size = m->ssize[j];
	for (uint32_t i = 0; i < size; i++)
		m->sbuf[slot][i] = pattern(j, i);
	m->ssid[slot] = j;
	m->spend[j] = m->nq;
	uint32_t chunk = ((size + m->nq - 1) / m->nq + 127) / 128 * 128, off = 0;
	bool split = rnd(m) & 1; /* adaptive routing / multi-recv: data, then a 0-byte IMM */
	for (int q = 0; q < m->nq; q++) {
		uint32_t len = size - off < chunk ? size - off : chunk;
		struct ibv_sge sge = {(uintptr_t)m->sbuf[slot] + off, len, key(0, R_SBUF)};
		struct ibv_send_wr w[2];
		memset(w, 0, sizeof(w));
		w[0].wr_id = (uint64_t)slot;
		w[0].sg_list = &sge;
		w[0].num_sge = len ? 1 : 0;
		w[0].wr.rdma.remote_addr = addr + off;
		w[0].wr.rdma.rkey = rkey;
		if (split) {
			w[0].opcode = IBV_WR_RDMA_WRITE;
			w[1].wr_id = (uint64_t)slot;
			w[1].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
			w[1].send_flags = IBV_SEND_SIGNALED;
			w[1].imm_data = htobe32(size);
			w[1].wr.rdma.remote_addr = addr;
			w[1].wr.rdma.rkey = rkey;
			nccl_post_send(m, SND, q, &w[0], (uint64_t)j + 1);
			nccl_post_send(m, SND, q, &w[1], (uint64_t)j + 1);
		} else {
			w[0].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
			w[0].send_flags = IBV_SEND_SIGNALED;
			w[0].imm_data = htobe32(size);
			nccl_post_send(m, SND, q, &w[0], (uint64_t)j + 1);
		}
		m->sexp[q][m->sexp_n[q]++ % QCAP] = (uint64_t)slot;
		off += len;
	}
	if (m->flags & CLEARS)
		memset(m->fifo[slot], 0, ELEM);
	m->fifo_head++;
	return true;
}

static void sender_complete(struct model *m, const struct mcqe *e)
{
	int q = e->q;
	if (m->sexp_h[q] == m->sexp_n[q] || m->sexp[q][m->sexp_h[q] % QCAP] != e->wc.wr_id) {
		violate(m, "unexpected or duplicate send completion", (long)e->wc.wr_id, q);
		return;
	}
	m->sexp_h[q]++;
	int slot = (int)e->wc.wr_id, j = m->ssid[slot];
	if (j < 0) {
		violate(m, "send completion for a free slot", slot, q);
		return;
	}
	if (--m->spend[j] == 0)
		m->ssid[slot] = -1;
}

static bool nccl_step(struct model *m, int side)
{
	struct cqring *r = &m->vis[side];
	if (r->h != r->n && (rnd(m) & 1)) {
		struct mcqe *e = &r->e[r->h++ % CQCAP];
		if (side == SND)
			sender_complete(m, e);
		else
			receiver_complete(m, e);
		return true;
	}
	return side == SND ? sender_consume(m) : receiver_post(m);
}

/* --- failure and repair ------------------------------------------------------ */

static void fail_direction(struct model *m, struct mqp *p)
{
	uint32_t pending = (uint32_t)(p->sq_n - p->sq_h);
	uint32_t full = below(m, pending + 1);
	for (uint32_t i = 0; i < full; i++)
		if (!exec_one(m, p, false))
			break;
	if (p->sq_h != p->sq_n && (rnd(m) & 1)) {
		struct mwr *e = &p->sq[p->sq_h % QCAP];
		if (e->nsge && e->len) {
			size_t off;
			uint32_t part = below(m, e->len);
			if (region(m, e->raddr, &off) == R_FIFO)
				part = part / ELEM * ELEM; /* an element is one packet */
			land(m, p, e, part);
		}
	}
	p->sq_h = p->sq_n;
	/* Some acknowledgements in flight still arrive, the rest are lost. */
	for (uint32_t n = below(m, (uint32_t)(p->ack_n - p->ack_h) + 1); n; n--)
		ack_one(m, p);
	p->ack_h = p->ack_n;
	p->dead = true;
}

struct fifo_head {
	uint64_t head;
};

static bool fifo_consumed(void *ctx, const struct r2cc_shadow_send *w)
{
	return w->tag <= ((struct fifo_head *)ctx)->head;
}

/* LANDED_CHECK: the sender's FIFO slot this write targets holds its element or a
 * newer one (idx at least the write's). */
static bool fifo_landed(void *ctx, const struct r2cc_shadow_send *w)
{
	struct model *m = ctx;
	size_t off;
	if (!w->tag || region(m, w->remote_addr, &off) != R_FIFO)
		return false;
	uint64_t idx;
	memcpy(&idx, (const uint8_t *)(uintptr_t)w->remote_addr + 40, 8);
	return idx >= w->tag;
}

static int to_nic(void *ctx, uint64_t addr, uint32_t len, uint32_t k, uint32_t *new_key_p)
{
	*new_key_p = key(*(int *)ctx, (int)(k & 0xff));
	return 0;
}

/* The checks a plan must pass before anything is posted. */
static void check_plan(struct model *m, int side, int q, const struct r2cc_qp_shadow_plan *p)
{
	if (m->flags & WIRE_ONLY)
		return;
	for (size_t i = 0; i < p->n_send; i++) {
		const struct r2cc_shadow_send *e = &p->send[i];
		if (e->hollow || e->opcode == IBV_WR_RDMA_READ)
			continue;
		size_t off;
		int r = region(m, e->remote_addr, &off), j = (int)e->tag - 1;
		if (e->opcode == IBV_WR_RDMA_WRITE_WITH_IMM && j < m->landed_imm[q])
			violate(m, "plan re-sends a consumed message", j, q);
		if (r == R_RBUF && e->byte_len && j < m->landed_imm[q])
			violate(m, "plan re-sends data of a consumed message", j, q);
		if (r == R_FIFO && j < m->fifo_head)
			violate(m, "plan re-sends a consumed FIFO element", j, m->fifo_head);
	}
}

static void repair_pair(struct model *m, int q)
{
	struct mqp *os = m->cur[SND][q], *orc = m->cur[RCV][q];
	uint64_t k_s = r2cc_qp_shadow_recv_consumed(orc->sh); /* for the sender's plan */
	uint64_t k_r = r2cc_qp_shadow_recv_consumed(os->sh);
	if (m->neg == NEG_K_MINUS_1 && k_s > 0) {
		k_s--;
		m->neg_applied = 1;
	}
	struct fifo_head fh = {(uint64_t)m->fifo_head};
	struct r2cc_qp_shadow_plan_in in_s = {.peer_recv_consumed = k_s};
	struct r2cc_qp_shadow_plan_in in_r = {
	    .peer_recv_consumed = k_r, .write_consumed = fifo_consumed, .ctx = &fh};
	if (m->neg == NEG_NO_FIFO_REPORT) {
		in_r.write_consumed = NULL;
		m->neg_applied = 1;
	}
	if (m->flags & LANDED_CHECK) {
		in_r.write_consumed = fifo_landed;
		in_r.ctx = m;
	}
	struct r2cc_qp_shadow_plan ps, pr;
	int rc = r2cc_qp_shadow_plan_build(os->sh, &in_s, &ps);
	if (rc) {
		if (m->neg == NEG_K_MINUS_1)
			m->neg_applied = 0; /* the shadow itself refused: not the model's catch */
		violate(m, "sender plan refused", rc, q);
		return;
	}
	cr_assert_eq(r2cc_qp_shadow_plan_build(orc->sh, &in_r, &pr), 0);
	check_plan(m, SND, q, &ps);
	check_plan(m, RCV, q, &pr);

	int nic = os->nic + 1;
	cr_assert_eq(r2cc_qp_shadow_plan_translate(&ps, to_nic, to_nic, &nic), 0);
	cr_assert_eq(r2cc_qp_shadow_plan_translate(&pr, to_nic, to_nic, &nic), 0);
	struct mqp *ns = new_qp(m, SND, q, nic), *nr = new_qp(m, RCV, q, nic);
	ns->peer = nr;
	nr->peer = ns;
	m->cur[SND][q] = ns;
	m->cur[RCV][q] = nr;

	struct ibv_sge sg[1];
	for (size_t i = 0; i < pr.n_recv; i++) {
		struct ibv_recv_wr r;
		r2cc_qp_shadow_plan_recv_wr(&pr, i, &r, sg);
		qp_post_recv(m, nr, &r);
	}
	struct r2cc_qp_shadow_plan *plans[2] = {&ps, &pr};
	struct mqp *to[2] = {ns, nr};
	for (int s = 0; s < 2; s++) {
		struct r2cc_qp_shadow_plan *p = plans[s];
		for (size_t i = 0; i < p->n_synth; i++) {
			struct ibv_wc wc;
			r2cc_qp_shadow_plan_wc(p, i, 0, &wc);
			cq_push(&m->vis[s], to[s], q, &wc);
		}
		for (size_t i = 0; i < p->n_send; i++) {
			struct ibv_send_wr w;
			r2cc_qp_shadow_plan_send_wr(p, i, &w, sg);
			qp_post_send(m, to[s], &w, p->send[i].tag, true);
		}
		m->synth += p->n_synth;
		m->saved += p->bytes_saved;
		m->reposted += p->bytes_reposted;
		m->superseded += p->bytes_superseded;
		m->consumed += p->bytes_consumed;
	}
	r2cc_qp_shadow_plan_free(&ps);
	r2cc_qp_shadow_plan_free(&pr);
}

/* The loopback flush QP: its own peer, no receives; READs not completed return. */
static void repair_flush(struct model *m)
{
	struct mqp *o = m->cur[RCV][FLQ];
	struct r2cc_qp_shadow_plan p;
	struct r2cc_qp_shadow_plan_in in = {.peer_recv_consumed =
						r2cc_qp_shadow_recv_consumed(o->sh)};
	int rc = r2cc_qp_shadow_plan_build(o->sh, &in, &p);
	if (rc) {
		violate(m, "flush plan refused", rc, FLQ);
		return;
	}
	int nic = o->nic + 1;
	cr_assert_eq(r2cc_qp_shadow_plan_translate(&p, to_nic, to_nic, &nic), 0);
	struct mqp *n = new_qp(m, RCV, FLQ, nic);
	n->peer = n;
	m->cur[RCV][FLQ] = n;
	if (p.n_synth)
		violate(m, "flush plan synthesised a READ completion", (long)p.n_synth, FLQ);
	for (size_t i = 0; i < p.n_send; i++) {
		struct ibv_send_wr w;
		struct ibv_sge sg[1];
		if (p.send[i].opcode != IBV_WR_RDMA_READ)
			violate(m, "flush plan holds something else than READs", p.send[i].opcode,
				0);
		r2cc_qp_shadow_plan_send_wr(&p, i, &w, sg);
		qp_post_send(m, n, &w, p.send[i].tag, true);
	}
	m->reposted += p.bytes_reposted;
	m->reads += p.reads_reposted;
	r2cc_qp_shadow_plan_free(&p);
}

static void fail_and_repair(struct model *m)
{
	bool down[MAXQ] = {false};
	int any = 0;
	for (int q = 0; q < m->nq; q++)
		any += down[q] = rnd(m) & 1;
	if (!any)
		down[below(m, (uint32_t)m->nq)] = true;
	for (int q = 0; q < m->nq; q++)
		if (down[q]) {
			fail_direction(m, m->cur[SND][q]);
			fail_direction(m, m->cur[RCV][q]);
		}
	/* The flush QP lives on the NIC of QP 0. */
	if (m->flush && down[0])
		fail_direction(m, m->cur[RCV][FLQ]);
	/* Fence: drain both CQs through the shadows (NCCL sees them later). */
	while (r2cc_poll(m, SND) || r2cc_poll(m, RCV))
		;
	for (int q = 0; q < m->nq; q++)
		if (down[q])
			repair_pair(m, q);
	if (m->flush && down[0])
		repair_flush(m);
	m->failures++;
}

static bool finished(struct model *m)
{
	if (m->fifo_head < m->n || m->rlow < m->n)
		return false;
	for (int s = 0; s < 2; s++)
		if (m->hw[s].h != m->hw[s].n || m->vis[s].h != m->vis[s].n)
			return false;
	if (m->flush &&
	    (m->cexp_h[FLQ] != m->cexp_n[FLQ] || m->cur[RCV][FLQ]->sq_h != m->cur[RCV][FLQ]->sq_n ||
	     m->cur[RCV][FLQ]->ack_h != m->cur[RCV][FLQ]->ack_n))
		return false;
	for (int q = 0; q < m->nq; q++)
		if (m->sexp_h[q] != m->sexp_n[q] || m->cexp_h[q] != m->cexp_n[q] ||
		    m->cur[SND][q]->sq_h != m->cur[SND][q]->sq_n ||
		    m->cur[RCV][q]->sq_h != m->cur[RCV][q]->sq_n ||
		    m->cur[SND][q]->ack_h != m->cur[SND][q]->ack_n ||
		    m->cur[RCV][q]->ack_h != m->cur[RCV][q]->ack_n)
			return false;
	return true;
}

/* One seed; returns true when every check held. */
static bool run_seed(uint64_t seed, int neg, int flags, struct totals *t)
{
	struct model *m = calloc(1, sizeof(*m));
	cr_assert_not_null(m);
	m->rng = seed * 0x9E3779B97F4A7C15ull + 1;
	m->neg = neg;
	m->flags = flags;
	m->nq = 1 + (int)below(m, MAXQ);
	m->n = 16 + (int)below(m, MAXN - 15);
	m->w = 1 + (int)below(m, S);
	m->inl = rnd(m) & 1;
	m->flush = rnd(m) & 1;
	if (flags & SINGLE_PATH) {
		m->nq = m->nq == 3 ? 4 : m->nq;
		m->inl = false;
	}
	if (flags & THREE_QPS) {
		m->nq = 3;
		m->inl = false;
	}
	for (int j = 0; j < m->n; j++) {
		uint32_t c = below(m, 8);
		m->ssize[j] = c == 0   ? 0
			      : c == 1 ? below(m, 130)
			      : c == 2 ? RBUF
				       : below(m, RBUF + 1);
	}
	for (int s = 0; s < S; s++) {
		m->ssid[s] = -1;
		m->rid[s] = -1;
	}
	for (int q = 0; q < m->nq; q++) {
		m->cur[SND][q] = new_qp(m, SND, q, 0);
		m->cur[RCV][q] = new_qp(m, RCV, q, 0);
		m->cur[SND][q]->peer = m->cur[RCV][q];
		m->cur[RCV][q]->peer = m->cur[SND][q];
	}
	if (m->flush) {
		m->cur[RCV][FLQ] = new_qp(m, RCV, FLQ, 0);
		m->cur[RCV][FLQ]->peer = m->cur[RCV][FLQ];
	}
	long fail1 = 1 + below(m, 40 * (uint32_t)m->n), fail2 = -1;
	if (below(m, 3) == 0)
		fail2 = fail1 + 1 + below(m, 20 * (uint32_t)m->n);
	long step;
	for (step = 0; step < 400000 && !m->viol[0]; step++) {
		if (step == fail1 || step == fail2)
			fail_and_repair(m);
		if (finished(m))
			break;
		uint32_t what = below(m, 5);
		bool did = false;
		if (what == 0 || what == 4) {
			int qi = (int)below(m, (uint32_t)(2 * m->nq + m->flush));
			struct mqp *p =
			    qi == 2 * m->nq ? m->cur[RCV][FLQ] : m->cur[qi & 1][qi >> 1];
			if (what == 4)
				did = ack_one(m, p);
			else if (p->sq_h != p->sq_n)
				did = exec_one(m, p, true);
		} else if (what == 1) {
			did = r2cc_poll(m, (int)below(m, 2));
		} else {
			did = nccl_step(m, what == 2 ? SND : RCV);
		}
		(void)did;
	}
	if (!m->viol[0] && !finished(m))
		violate(m, "no progress: the run did not finish", m->fifo_head, m->rlow);

	bool ok = !m->viol[0];
	t->seeds++;
	t->failed_seeds += m->failures > 0;
	t->twice += m->failures > 1;
	t->synth += m->synth;
	t->saved += m->saved;
	t->reposted += m->reposted;
	t->superseded += m->superseded;
	t->consumed += m->consumed;
	t->reads += m->reads;
	t->neg_applicable += m->neg_applied;
	if (!ok) {
		t->bad++;
		if (!t->first[0])
			snprintf(t->first, sizeof(t->first),
				 "seed %llu (nq %d, n %d, w %d, %s, failures %d): %s",
				 (unsigned long long)seed, m->nq, m->n, m->w,
				 m->inl ? "inline" : "not inline", m->failures, m->viol);
	}
	for (int i = 0; i < m->nqps; i++) {
		r2cc_qp_shadow_destroy(m->qps[i]->sh);
		free(m->qps[i]);
	}
	free(m);
	return ok;
}

static void run_range(uint64_t from, uint64_t to)
{
	struct totals t = {0};
	for (uint64_t s = from; s < to; s++)
		run_seed(s, NEG_NONE, 0, &t);
	cr_log_info("seeds %llu..%llu: %d runs, %d with a failure (%d twice); synthesised %llu "
		    "completions, re-posted %llu B (%llu flush READs), saved %llu B, superseded "
		    "%llu B, consumed %llu B",
		    (unsigned long long)from, (unsigned long long)to - 1, t.seeds, t.failed_seeds,
		    t.twice, (unsigned long long)t.synth, (unsigned long long)t.reposted,
		    (unsigned long long)t.reads, (unsigned long long)t.saved,
		    (unsigned long long)t.superseded, (unsigned long long)t.consumed);
	cr_expect_eq(t.bad, 0, "%d of %d seeds failed; first: %s", t.bad, t.seeds, t.first);
	cr_expect_gt(t.failed_seeds, t.seeds * 8 / 10, "too few seeds saw a failure: %d of %d",
		     t.failed_seeds, t.seeds);
	cr_expect_gt(t.synth, 0);
	cr_expect_gt(t.saved, 0);
	cr_expect_gt(t.superseded + t.consumed, 0);
	cr_expect_gt(t.reads, 0);
}

Test(qp_shadow_model, seeds_1_to_2500)
{
	run_range(1, 2501);
}

Test(qp_shadow_model, seeds_2501_to_5000)
{
	run_range(2501, 5001);
}

Test(qp_shadow_model, seeds_5001_to_7500)
{
	run_range(5001, 7501);
}

Test(qp_shadow_model, seeds_7501_to_10000)
{
	run_range(7501, 10001);
}

/* Negative check: the sender re-posts from the (k-1)-th IMM. Must be caught. */
Test(qp_shadow_model, catches_repost_from_k_minus_1)
{
	struct totals t = {0};
	int caught = 0, applicable = 0;
	for (uint64_t s = 1; s <= 400; s++) {
		struct totals one = {0};
		bool ok = run_seed(s, NEG_K_MINUS_1, 0, &one);
		if (one.neg_applicable) {
			applicable++;
			caught += !ok;
		}
		t.seeds++;
	}
	cr_log_info("k-1: %d applicable seeds, %d caught", applicable, caught);
	cr_expect_gt(applicable, 100);
	cr_expect_eq(caught, applicable, "k-1 went unnoticed in %d of %d seeds",
		     applicable - caught, applicable);
}

/* Negative check: the receiver ignores the sender's FIFO head. Must be caught. */
Test(qp_shadow_model, catches_missing_fifo_report)
{
	int caught = 0, runs = 0;
	for (uint64_t s = 1; s <= 400; s++) {
		struct totals one = {0};
		caught += !run_seed(s, NEG_NO_FIFO_REPORT, 0, &one);
		runs++;
	}
	cr_log_info("no FIFO report: %d of %d seeds caught", caught, runs);
	cr_expect_gt(caught, runs / 20);

	/* Inline elements on 3 QPs: an old element really lands over a newer one. */
	caught = 0;
	for (uint64_t s = 1; s <= 1000; s++) {
		struct totals one = {0};
		caught += !run_seed(s, NEG_NO_FIFO_REPORT, WIRE_ONLY, &one);
	}
	cr_log_info("no FIFO report, judged on the wire: %d of 1000 seeds caught", caught);
	cr_expect_gt(caught, 0);
}

/*
 * The header's claim: when every write to a slot goes through one QP and the
 * elements are not inline, supersession alone is safe even without the peer's
 * FIFO head (consumed elements are written again, but never over a newer one,
 * and nothing is lost or duplicated).
 */
Test(qp_shadow_model, single_path_safe_without_fifo_report)
{
	struct totals t = {0};
	for (uint64_t s = 1; s <= 1500; s++)
		run_seed(s, NEG_NO_FIFO_REPORT, SINGLE_PATH | WIRE_ONLY, &t);
	cr_expect_eq(t.bad, 0, "%d of %d seeds failed; first: %s", t.bad, t.seeds, t.first);
}

/*
 * What the engine runs with 3 fused NICs (the drill's default, NCCL_NET_FORCE_MERGE):
 * one slot's clear-to-send writes alternate QPs, the elements are not inline, and the
 * receiver's plan has no FIFO report. A re-post reads its element when the NIC sends
 * it: it may carry an element ahead of NCCL's own write of it still in flight on a
 * sibling QP, and the sender then prepares the slot's next one, which that late write
 * overwrites (caught). Asking the sender's memory whether each write landed, after
 * the fence, closes it (docs/nccl-versions.md, section 3).
 */
Test(qp_shadow_model, three_qps_need_the_landed_check)
{
	int caught = 0;
	for (uint64_t s = 1; s <= 3000; s++) {
		struct totals one = {0};
		caught += !run_seed(s, NEG_NO_FIFO_REPORT, THREE_QPS | WIRE_ONLY, &one);
	}
	cr_log_info("3 QPs, not inline, no FIFO report: %d of 3000 seeds caught", caught);
	cr_expect_gt(caught, 0);
	struct totals t = {0};
	for (uint64_t s = 1; s <= 3000; s++)
		run_seed(s, NEG_NONE, THREE_QPS | LANDED_CHECK, &t);
	cr_log_info("3 QPs, not inline, landed check: %d of %d seeds failed, %llu B consumed",
		    t.bad, t.seeds, (unsigned long long)t.consumed);
	cr_expect_eq(t.bad, 0, "%d of %d seeds failed; first: %s", t.bad, t.seeds, t.first);
	cr_expect_gt(t.consumed, 0);
	/* and on 1-4 QPs, inline or not */
	struct totals a = {0};
	for (uint64_t s = 1; s <= 3000; s++)
		run_seed(s, NEG_NONE, LANDED_CHECK, &a);
	cr_log_info("1-4 QPs, inline or not, landed check: %d of %d seeds failed", a.bad, a.seeds);
	cr_expect_eq(a.bad, 0, "%d of %d seeds failed; first: %s", a.bad, a.seeds, a.first);
}

/*
 * NCCL 2.18-2.28 zero a slot's first element once it is consumed (CLEARS): a slot
 * reads the same, 0, whether its write was consumed or never landed, so the landed
 * check cannot tell the one it must skip from the one it must re-post, and on 3 QPs
 * a consumed element re-posted lands over a newer one. The engine refuses those
 * repairs (repair/model/cts.h). With every write to a slot on one QP (1, 2, 4 fused NICs)
 * the clearing does no harm, with the landed check or without it, and the sender's
 * FIFO head (which R2CC cannot read) would be enough even on 3 QPs.
 */
Test(qp_shadow_model, clearing_nccl_needs_one_qp_per_slot)
{
	struct totals t = {0};
	for (uint64_t s = 1; s <= 3000; s++)
		run_seed(s, NEG_NONE, THREE_QPS | CLEARS | LANDED_CHECK | WIRE_ONLY, &t);
	cr_log_info("3 QPs, clearing, landed check: %d of %d seeds failed", t.bad, t.seeds);
	cr_expect_gt(t.bad, 0);
	int flags[] = {SINGLE_PATH | CLEARS | LANDED_CHECK | WIRE_ONLY,
		       SINGLE_PATH | CLEARS | WIRE_ONLY, THREE_QPS | CLEARS | WIRE_ONLY};
	const char *what[] = {"1, 2 or 4 QPs, clearing, landed check",
			      "1, 2 or 4 QPs, clearing, no check",
			      "3 QPs, clearing, the sender's FIFO head"};
	for (size_t f = 0; f < sizeof(flags) / sizeof(flags[0]); f++) {
		struct totals a = {0};
		int neg = f == 1 ? NEG_NO_FIFO_REPORT : NEG_NONE;
		for (uint64_t s = 1; s <= 3000; s++)
			run_seed(s, neg, flags[f], &a);
		cr_log_info("%s: %d of %d seeds failed", what[f], a.bad, a.seeds);
		cr_expect_eq(a.bad, 0, "%s: %d of %d seeds failed; first: %s", what[f], a.bad,
			     a.seeds, a.first);
	}
}
