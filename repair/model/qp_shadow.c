/*
 * The shadow of a queue pair's posted work and the exactly-once re-post plan
 * (the contract, the plan's rules and the FIFO argument are in qp_shadow.h).
 *
 * Each queue is a ring of fixed-size records indexed by sequence number
 * (power-of-two capacity); SGEs and inline payloads live in side arrays of the
 * same shape, so recording is a few stores and never allocates. The poster
 * owns the heads, the poller the tails; each publishes with a release store
 * and reads the other's with an acquire load.
 */
#include "repair/model/qp_shadow.h"
#include "shim/common.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

struct shadow_ring {
	uint64_t head; /* last sequence number recorded (poster) */
	uint64_t tail; /* last sequence number retired (poller) */
	uint32_t mask;
	uint32_t max_sge;
	/* (mask + 1) * max_sge; the send ring's only where max_sge > 1 (a send's
	 * first SGE lives in its record) */
	struct r2cc_shadow_sge *sge;
};

/*
 * A send request in the ring: one cache line, which is all a post writes of it (and a
 * completion reads) when it has at most one SGE. More SGEs go to the ring's side array,
 * all of them; an inline payload to the inline buffer. Its sequence number is its
 * place; its inline length its byte_len (r2cc_shadow_send is the full form).
 */
struct shadow_rec {
	uint64_t wr_id;
	uint64_t remote_addr;
	uint64_t tag;
	uint64_t msgs;
	struct r2cc_shadow_sge sge0; /* the SGE when num_sge is 1 */
	uint32_t rkey;
	uint32_t imm_data;
	uint32_t byte_len;
	uint16_t send_flags;
	uint8_t opcode;
	uint8_t num_sge;
};

_Static_assert(sizeof(struct shadow_rec) == 64, "a send record: one cache line");

/* Laid out by who touches what: a post reads and writes the first two cache lines
 * (with its record), a completion the first and the poller's. */
struct r2cc_qp_shadow {
	/* line 0: the send ring and what every post reads */
	struct shadow_ring sq;
	struct shadow_rec *sends;
	r2cc_qp_shadow_tag_fn tag_fn;
	int error;		/* sticky, written by either side */
	uint32_t max_request;	/* atomic: the largest request recorded */
	uint32_t tag_max_bytes; /* tag_fn for requests of 1 to this many bytes (0: all) */
	bool sq_sig_all;
	/* line 1: the poster's */
	void *tag_ctx;
	uint64_t msgs_posted;
	uint64_t
	    sig_posted; /* signalled send requests recorded (atomic: the stall scan reads it) */
	uint64_t send_posted, send_bytes_posted;
	uint64_t tag_last, tag_step; /* the last tag recorded, and its rise over the one before */
	uint32_t max_inline;
	/* the poller's */
	uint64_t msgs_retired __attribute__((aligned(64)));
	uint64_t send_retired, recv_imm;
	uint64_t sig_retired;	     /* signalled send requests retired */
	uint64_t send_bytes_retired; /* atomic: bytes of the requests retired */
	struct r2cc_shadow_msg done[R2CC_SHADOW_LOST_MAX]; /* the last messages retired */
	/* the receive side, and the rest */
	struct shadow_ring rq __attribute__((aligned(64)));
	struct r2cc_shadow_recv *recvs;
	uint64_t recv_posted;
	uint8_t *inline_buf; /* (sq.mask + 1) * max_inline */
};

_Static_assert(offsetof(struct r2cc_qp_shadow, tag_ctx) == 64, "a post's fields: two lines");
_Static_assert(offsetof(struct r2cc_qp_shadow, max_inline) < 128, "a post's fields: two lines");

static uint64_t load_acq(const uint64_t *p)
{
	return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static void store_rel(uint64_t *p, uint64_t v)
{
	__atomic_store_n(p, v, __ATOMIC_RELEASE);
}

/* The statistics: one side writes each (r2cc_count_own), the stall scan reads them
 * from the repair thread. */
static uint64_t stat_get(const uint64_t *p)
{
	return __atomic_load_n(p, __ATOMIC_RELAXED);
}

static int set_broken(struct r2cc_qp_shadow *sh, int err)
{
	int zero = 0;
	__atomic_compare_exchange_n(&sh->error, &zero, err, false, __ATOMIC_RELAXED,
				    __ATOMIC_RELAXED);
	return err;
}

/* The full form of the send record of seq: its SGEs and inline payload where the
 * ring keeps them (valid while the record stands). */
static void rec_expand(const struct r2cc_qp_shadow *sh, uint64_t seq, struct r2cc_shadow_send *d)
{
	size_t slot = seq & sh->sq.mask;
	const struct shadow_rec *e = &sh->sends[slot];
	memset(d, 0, sizeof(*d));
	d->seq = seq;
	d->msgs = e->msgs;
	d->wr_id = e->wr_id;
	d->remote_addr = e->remote_addr;
	d->tag = e->tag;
	d->rkey = e->rkey;
	d->imm_data = e->imm_data;
	d->byte_len = e->byte_len;
	d->opcode = (enum ibv_wr_opcode)e->opcode;
	d->send_flags = e->send_flags;
	d->num_sge = e->num_sge;
	d->sge = e->num_sge > 1 ? &sh->sq.sge[slot * sh->sq.max_sge]
				: (struct r2cc_shadow_sge *)&e->sge0;
	if (e->send_flags & IBV_SEND_INLINE) {
		d->inline_len = e->byte_len;
		d->inline_data = &sh->inline_buf[slot * sh->max_inline];
	}
}

static uint32_t pow2_at_least(uint32_t n)
{
	uint32_t p = 1;
	while (p < n && p < (1u << 30))
		p <<= 1;
	return p;
}

/* max_sge: at least 1; side: whether a request keeps its SGEs outside its record */
static int ring_init(struct shadow_ring *r, uint32_t cap, uint32_t max_sge, bool side)
{
	uint32_t n = pow2_at_least(cap ? cap : 1);
	r->mask = n - 1;
	r->max_sge = max_sge;
	if (!side)
		return 0;
	r->sge = calloc((size_t)n * max_sge, sizeof(*r->sge));
	return r->sge ? 0 : -ENOMEM;
}

int r2cc_qp_shadow_create(const struct r2cc_qp_shadow_attr *attr, struct r2cc_qp_shadow **shadow_p)
{
	/* a send record counts its SGEs in a byte */
	if (!attr || !shadow_p || attr->max_send_sge > UINT8_MAX)
		return -EINVAL;
	struct r2cc_qp_shadow *sh = r2cc_zalloc_lines(sizeof(*sh));
	if (!sh)
		return -ENOMEM;
	uint32_t send_sge = attr->max_send_sge ? attr->max_send_sge : 1;
	uint32_t recv_sge = attr->max_recv_sge ? attr->max_recv_sge : 1;
	if (ring_init(&sh->sq, attr->max_send_wr, send_sge, send_sge > 1) ||
	    ring_init(&sh->rq, attr->max_recv_wr, recv_sge, true))
		goto err_free;
	sh->sends = r2cc_zalloc_lines(((size_t)sh->sq.mask + 1) * sizeof(*sh->sends));
	sh->recvs = calloc((size_t)sh->rq.mask + 1, sizeof(*sh->recvs));
	if (!sh->sends || !sh->recvs)
		goto err_free;
	sh->max_inline = attr->max_inline_data;
	if (sh->max_inline) {
		sh->inline_buf = malloc(((size_t)sh->sq.mask + 1) * sh->max_inline);
		if (!sh->inline_buf)
			goto err_free;
	}
	sh->sq_sig_all = attr->sq_sig_all;
	sh->tag_fn = attr->tag_fn;
	sh->tag_ctx = attr->tag_ctx;
	sh->tag_max_bytes = attr->tag_max_bytes;
	*shadow_p = sh;
	return 0;

err_free:
	r2cc_qp_shadow_destroy(sh);
	return -ENOMEM;
}

void r2cc_qp_shadow_destroy(struct r2cc_qp_shadow *sh)
{
	if (!sh)
		return;
	free(sh->inline_buf);
	free(sh->recvs);
	free(sh->sends);
	free(sh->rq.sge);
	free(sh->sq.sge);
	free(sh);
}

static bool is_consumer(enum ibv_wr_opcode op)
{
	return op == IBV_WR_RDMA_WRITE_WITH_IMM || op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM;
}

static bool is_supported(enum ibv_wr_opcode op)
{
	return op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_READ || is_consumer(op);
}

/* One pass over the list, each request checked as it is recorded: the records become
 * visible only with the head's store at the end, so one refused leaves the shadow broken
 * with nothing of the list recorded (all or nothing, as before a separate check pass). */
static int record_sends(struct r2cc_qp_shadow *sh, const struct ibv_send_wr *list,
			const struct ibv_send_wr *bad, uint64_t *wrs, uint64_t *bytes_p)
{
	if (!sh)
		return -EINVAL;
	if (__atomic_load_n(&sh->error, __ATOMIC_RELAXED))
		return -EINVAL;
	uint64_t head = sh->sq.head, room = load_acq(&sh->sq.tail) + sh->sq.mask + 1;
	uint64_t bytes_all = 0, sig = 0;
	uint32_t big = 0;
	/* what a refusal puts back (the loop keeps these in the shadow: fewer registers
	 * live across the tag function's call) */
	uint64_t msgs0 = sh->msgs_posted, tag_last0 = sh->tag_last, tag_step0 = sh->tag_step;
	const struct ibv_send_wr *w;
	int err;
	for (w = list; w && w != bad; w = w->next) {
		enum ibv_wr_opcode op = w->opcode;
		if (!is_supported(op)) { /* an atomic, or an opcode NCCL never posts */
			err = -EOPNOTSUPP;
			goto refused;
		}
		if (w->num_sge < 0 || (uint32_t)w->num_sge > sh->sq.max_sge) {
			err = w->num_sge < 0 ? -EINVAL : -E2BIG;
			goto refused;
		}
		uint64_t seq = ++head;
		if (seq > room) {
			err = -ENOSPC;
			goto refused;
		}
		size_t slot = seq & sh->sq.mask;
		struct shadow_rec *e = &sh->sends[slot];
		unsigned int flags = w->send_flags | (sh->sq_sig_all ? IBV_SEND_SIGNALED : 0);
		if (flags > UINT16_MAX) { /* no flag verbs.h knows */
			err = -EOPNOTSUPP;
			goto refused;
		}
		uint64_t bytes = 0;
		if (w->num_sge == 1) {
			e->sge0.addr = w->sg_list[0].addr;
			e->sge0.length = w->sg_list[0].length;
			e->sge0.lkey = w->sg_list[0].lkey;
			bytes = w->sg_list[0].length;
		} else if (w->num_sge > 1) {
			struct r2cc_shadow_sge *sge = &sh->sq.sge[slot * sh->sq.max_sge];
			for (int i = 0; i < w->num_sge; i++) {
				sge[i].addr = w->sg_list[i].addr;
				sge[i].length = w->sg_list[i].length;
				sge[i].lkey = w->sg_list[i].lkey;
				bytes += w->sg_list[i].length;
			}
		}
		if (w->send_flags & IBV_SEND_INLINE) {
			if (bytes > sh->max_inline) {
				err = -E2BIG;
				goto refused;
			}
			uint8_t *dst = &sh->inline_buf[slot * sh->max_inline];
			for (int i = 0; i < w->num_sge; i++) {
				memcpy(dst, (const void *)(uintptr_t)w->sg_list[i].addr,
				       w->sg_list[i].length);
				dst += w->sg_list[i].length;
			}
		}
		bool consumer = is_consumer(op),
		     send = op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM;
		e->wr_id = w->wr_id;
		e->opcode = (uint8_t)op;
		e->send_flags = (uint16_t)flags;
		e->imm_data = consumer && op != IBV_WR_SEND ? w->imm_data : 0;
		e->remote_addr = send ? 0 : w->wr.rdma.remote_addr;
		e->rkey = send ? 0 : w->wr.rdma.rkey;
		sh->msgs_posted += consumer;
		e->msgs = sh->msgs_posted;
		e->num_sge = (uint8_t)w->num_sge;
		e->byte_len = (uint32_t)bytes;
		bytes_all += bytes;
		if (e->byte_len > big)
			big = e->byte_len;
		e->tag = sh->tag_fn && (!sh->tag_max_bytes || bytes - 1 < sh->tag_max_bytes)
			     ? sh->tag_fn(sh->tag_ctx, w)
			     : 0;
		if (e->tag) {
			if (e->tag > sh->tag_last && sh->tag_last)
				sh->tag_step = e->tag - sh->tag_last;
			sh->tag_last = e->tag;
		}
		sig += (e->send_flags & IBV_SEND_SIGNALED) != 0;
	}
	if (bad && !w) {
		err = -EINVAL;
		goto refused;
	}
	uint64_t n = head - sh->sq.head;
	if (big > sh->max_request)
		__atomic_store_n(&sh->max_request, big, __ATOMIC_RELAXED);
	if (sig)
		store_rel(&sh->sig_posted, sh->sig_posted + sig);
	r2cc_count_own(&sh->send_posted, n);
	r2cc_count_own(&sh->send_bytes_posted, bytes_all);
	store_rel(&sh->sq.head, head);
	if (wrs)
		*wrs = n;
	if (bytes_p)
		*bytes_p = bytes_all;
	return 0;

refused:
	sh->msgs_posted = msgs0;
	sh->tag_last = tag_last0;
	sh->tag_step = tag_step0;
	return set_broken(sh, err);
}

int r2cc_qp_shadow_post_send(struct r2cc_qp_shadow *sh, const struct ibv_send_wr *list,
			     const struct ibv_send_wr *bad)
{
	return record_sends(sh, list, bad, NULL, NULL);
}

int r2cc_qp_shadow_post_send_all(struct r2cc_qp_shadow *sh, const struct ibv_send_wr *list,
				 uint64_t *wrs, uint64_t *bytes)
{
	return record_sends(sh, list, NULL, wrs, bytes);
}

int r2cc_qp_shadow_post_recv(struct r2cc_qp_shadow *sh, const struct ibv_recv_wr *list,
			     const struct ibv_recv_wr *bad)
{
	if (!sh)
		return -EINVAL;
	if (__atomic_load_n(&sh->error, __ATOMIC_RELAXED))
		return -EINVAL;
	uint32_t n = 0;
	const struct ibv_recv_wr *w;
	for (w = list; w && w != bad; w = w->next, n++) {
		if (w->num_sge < 0)
			return set_broken(sh, -EINVAL);
		if ((uint32_t)w->num_sge > sh->rq.max_sge)
			return set_broken(sh, -E2BIG);
	}
	if (bad && !w)
		return set_broken(sh, -EINVAL);
	uint64_t head = sh->rq.head;
	if (head + n - load_acq(&sh->rq.tail) > (uint64_t)sh->rq.mask + 1)
		return set_broken(sh, -ENOSPC);
	for (w = list; w != bad; w = w->next) {
		uint64_t seq = ++head;
		size_t slot = seq & sh->rq.mask;
		struct r2cc_shadow_recv *e = &sh->recvs[slot];
		e->seq = seq;
		e->wr_id = w->wr_id;
		e->num_sge = w->num_sge;
		e->sge = &sh->rq.sge[slot * sh->rq.max_sge];
		for (int i = 0; i < w->num_sge; i++) {
			e->sge[i].addr = w->sg_list[i].addr;
			e->sge[i].length = w->sg_list[i].length;
			e->sge[i].lkey = w->sg_list[i].lkey;
		}
	}
	r2cc_count_own(&sh->recv_posted, n);
	store_rel(&sh->rq.head, head);
	return 0;
}

/* How many requests from bad to the end of the list; -EINVAL when bad is not in it. */
static int64_t count_send_tail(const struct ibv_send_wr *list, const struct ibv_send_wr *bad)
{
	int64_t m = 0;
	bool seen = false;
	for (const struct ibv_send_wr *w = list; w; w = w->next) {
		seen = seen || w == bad;
		m += seen;
	}
	return seen ? m : -EINVAL;
}

static int64_t count_recv_tail(const struct ibv_recv_wr *list, const struct ibv_recv_wr *bad)
{
	int64_t m = 0;
	bool seen = false;
	for (const struct ibv_recv_wr *w = list; w; w = w->next) {
		seen = seen || w == bad;
		m += seen;
	}
	return seen ? m : -EINVAL;
}

int r2cc_qp_shadow_unpost_send(struct r2cc_qp_shadow *sh, const struct ibv_send_wr *list,
			       const struct ibv_send_wr *bad)
{
	if (!sh || !bad)
		return sh ? 0 : -EINVAL;
	int64_t m = count_send_tail(list, bad);
	uint64_t head = sh->sq.head;
	if (m < 0 || head - load_acq(&sh->sq.tail) < (uint64_t)m)
		return set_broken(sh, -EINVAL);
	for (uint64_t seq = head - (uint64_t)m + 1; seq <= head; seq++) {
		const struct shadow_rec *e = &sh->sends[seq & sh->sq.mask];
		r2cc_count_own(&sh->send_bytes_posted, -(uint64_t)e->byte_len);
		sh->msgs_posted -= is_consumer(e->opcode);
		if (e->send_flags & IBV_SEND_SIGNALED)
			store_rel(&sh->sig_posted, sh->sig_posted - 1);
	}
	head -= (uint64_t)m;
	r2cc_count_own(&sh->send_posted, -(uint64_t)m);
	store_rel(&sh->sq.head, head);
	return 0;
}

int r2cc_qp_shadow_unpost_recv(struct r2cc_qp_shadow *sh, const struct ibv_recv_wr *list,
			       const struct ibv_recv_wr *bad)
{
	if (!sh || !bad)
		return sh ? 0 : -EINVAL;
	int64_t m = count_recv_tail(list, bad);
	uint64_t head = sh->rq.head;
	if (m < 0 || head - load_acq(&sh->rq.tail) < (uint64_t)m)
		return set_broken(sh, -EINVAL);
	r2cc_count_own(&sh->recv_posted, -(uint64_t)m);
	store_rel(&sh->rq.head, head - (uint64_t)m);
	return 0;
}

int r2cc_qp_shadow_send_completed(struct r2cc_qp_shadow *sh, const struct ibv_wc *wc)
{
	if (!sh || !wc)
		return -EINVAL;
	if (wc->status != IBV_WC_SUCCESS)
		return 0;
	uint64_t head = load_acq(&sh->sq.head), bytes = 0;
	for (uint64_t seq = sh->sq.tail + 1; seq <= head; seq++) {
		const struct shadow_rec *e = &sh->sends[seq & sh->sq.mask];
		bytes += e->byte_len;
		/* the record of retired messages, on the way (one written for a message
		 * that then does not retire, the shadow breaking, is not read back:
		 * r2cc_qp_shadow_retired_msgs() checks each record's number) */
		if (is_consumer(e->opcode))
			sh->done[e->msgs % R2CC_SHADOW_LOST_MAX] = (struct r2cc_shadow_msg){
			    e->msgs, e->imm_data, e->byte_len, (enum ibv_wr_opcode)e->opcode};
		if (!(e->send_flags & IBV_SEND_SIGNALED))
			continue;
		if (e->wr_id != wc->wr_id)
			return set_broken(sh, -EPROTO);
		sh->msgs_retired = e->msgs;
		r2cc_count_own(&sh->send_retired, seq - sh->sq.tail);
		store_rel(&sh->send_bytes_retired, sh->send_bytes_retired + bytes);
		store_rel(&sh->sig_retired, sh->sig_retired + 1);
		store_rel(&sh->sq.tail, seq);
		return 0;
	}
	return set_broken(sh, -EPROTO);
}

int r2cc_qp_shadow_recv_completed(struct r2cc_qp_shadow *sh, const struct ibv_wc *wc)
{
	if (!sh || !wc)
		return -EINVAL;
	if (wc->status != IBV_WC_SUCCESS)
		return 0;
	uint64_t tail = sh->rq.tail;
	if (tail == load_acq(&sh->rq.head))
		return set_broken(sh, -EPROTO);
	const struct r2cc_shadow_recv *e = &sh->recvs[(tail + 1) & sh->rq.mask];
	if (e->wr_id != wc->wr_id)
		return set_broken(sh, -EPROTO);
	if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM)
		r2cc_count_own(&sh->recv_imm, 1);
	store_rel(&sh->rq.tail, tail + 1);
	return 0;
}

int r2cc_qp_shadow_wc(struct r2cc_qp_shadow *sh, const struct ibv_wc *wc)
{
	if (!sh || !wc)
		return -EINVAL;
	if (wc->status != IBV_WC_SUCCESS)
		return 0;
	return (wc->opcode & IBV_WC_RECV) ? r2cc_qp_shadow_recv_completed(sh, wc)
					  : r2cc_qp_shadow_send_completed(sh, wc);
}

uint64_t r2cc_qp_shadow_recv_consumed(const struct r2cc_qp_shadow *sh)
{
	return load_acq(&sh->rq.tail);
}

uint64_t r2cc_qp_shadow_msgs_retired(const struct r2cc_qp_shadow *sh)
{
	return sh->msgs_retired;
}

int r2cc_qp_shadow_retired_msgs(const struct r2cc_qp_shadow *sh, struct r2cc_shadow_msg *out)
{
	uint64_t last = sh->msgs_retired;
	int n = 0; /* the newest records that really are the last messages retired */
	while (n < R2CC_SHADOW_LOST_MAX && (uint64_t)n < last &&
	       sh->done[(last - (uint64_t)n) % R2CC_SHADOW_LOST_MAX].n == last - (uint64_t)n)
		n++;
	for (int i = 0; i < n; i++)
		out[i] = sh->done[(last - (uint64_t)(n - 1 - i)) % R2CC_SHADOW_LOST_MAX];
	return n;
}

int r2cc_qp_shadow_recv_lost(struct r2cc_qp_shadow *sh, const struct r2cc_shadow_msg *m,
			     uint32_t qp_num, struct ibv_wc *wc)
{
	if (!sh || !m || !wc)
		return -EINVAL;
	if (m->n != r2cc_qp_shadow_recv_consumed(sh) + 1 || !is_consumer(m->opcode))
		return -EPROTO;
	uint64_t tail = sh->rq.tail;
	if (tail == load_acq(&sh->rq.head))
		return -EPROTO;
	memset(wc, 0, sizeof(*wc));
	wc->wr_id = sh->recvs[(tail + 1) & sh->rq.mask].wr_id;
	wc->status = IBV_WC_SUCCESS;
	wc->opcode =
	    m->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
	wc->byte_len = m->byte_len;
	wc->qp_num = qp_num;
	if (m->opcode != IBV_WR_SEND) {
		wc->wc_flags = IBV_WC_WITH_IMM;
		wc->imm_data = m->imm_data;
	}
	return r2cc_qp_shadow_recv_completed(sh, wc);
}

int r2cc_qp_shadow_error(const struct r2cc_qp_shadow *sh)
{
	return __atomic_load_n(&sh->error, __ATOMIC_RELAXED);
}

uint32_t r2cc_qp_shadow_send_outstanding(const struct r2cc_qp_shadow *sh)
{
	return (uint32_t)(load_acq(&sh->sq.head) - load_acq(&sh->sq.tail));
}

void r2cc_qp_shadow_signalled(const struct r2cc_qp_shadow *sh, uint64_t *posted, uint64_t *retired)
{
	*retired = load_acq(&sh->sig_retired);
	*posted = load_acq(&sh->sig_posted);
}

uint32_t r2cc_qp_shadow_recv_outstanding(const struct r2cc_qp_shadow *sh)
{
	return (uint32_t)(load_acq(&sh->rq.head) - load_acq(&sh->rq.tail));
}

void r2cc_qp_shadow_get_stats(const struct r2cc_qp_shadow *sh, struct r2cc_qp_shadow_stats *st)
{
	st->send_posted = stat_get(&sh->send_posted);
	st->recv_posted = stat_get(&sh->recv_posted);
	st->send_bytes_posted = stat_get(&sh->send_bytes_posted);
	st->send_retired = stat_get(&sh->send_retired);
	st->recv_retired = load_acq(&sh->rq.tail);
	st->recv_imm = stat_get(&sh->recv_imm);
}

void r2cc_qp_shadow_bytes(const struct r2cc_qp_shadow *sh, uint64_t *posted, uint64_t *retired,
			  uint32_t *max_request)
{
	*retired = load_acq(&sh->send_bytes_retired);
	*posted = load_acq(&sh->send_bytes_posted);
	*max_request = __atomic_load_n(&sh->max_request, __ATOMIC_RELAXED);
}

/* --- the plan --------------------------------------------------------------- */

static enum ibv_wc_opcode wc_opcode(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_READ:
		return IBV_WC_RDMA_READ;
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_IMM:
		return IBV_WC_SEND;
	default:
		return IBV_WC_RDMA_WRITE;
	}
}

static bool is_barrier(const struct r2cc_shadow_send *e)
{
	return e->opcode != IBV_WR_RDMA_WRITE;
}

/* A later plain WRITE covers e's whole target (same rkey), no barrier between. */
static bool superseded(const struct r2cc_shadow_send *cand, size_t i, size_t n)
{
	const struct r2cc_shadow_send *e = &cand[i];
	if (e->opcode != IBV_WR_RDMA_WRITE || e->byte_len == 0)
		return false;
	uint64_t lo = e->remote_addr, hi = lo + e->byte_len;
	for (size_t j = i + 1; j < n; j++) {
		const struct r2cc_shadow_send *l = &cand[j];
		if (is_barrier(l))
			return false;
		if (l->rkey == e->rkey && l->remote_addr <= lo &&
		    l->remote_addr + l->byte_len >= hi)
			return true;
	}
	return false;
}

static void copy_send(struct r2cc_qp_shadow_plan *plan, const struct r2cc_shadow_send *e,
		      size_t *sge_used, size_t *inline_used)
{
	struct r2cc_shadow_send *d = &plan->send[plan->n_send++];
	*d = *e;
	d->sge = &plan->sge_store[*sge_used];
	memcpy(d->sge, e->sge, (size_t)e->num_sge * sizeof(*d->sge));
	*sge_used += (size_t)e->num_sge;
	if (e->inline_data) {
		d->inline_data = &plan->inline_store[*inline_used];
		memcpy(d->inline_data, e->inline_data, e->inline_len);
		*inline_used += e->inline_len;
	}
	plan->bytes_reposted += e->byte_len;
}

static void add_synth(struct r2cc_qp_shadow_plan *plan, const struct r2cc_shadow_send *e)
{
	struct r2cc_shadow_wc *c = &plan->synth[plan->n_synth++];
	c->wr_id = e->wr_id;
	c->opcode = wc_opcode(e->opcode);
	c->byte_len = e->byte_len;
	c->seq = e->seq;
}

/* d re-posted as a zero-byte signalled WRITE with its wr_id. */
static void make_hollow(struct r2cc_shadow_send *d)
{
	d->opcode = IBV_WR_RDMA_WRITE;
	d->send_flags = IBV_SEND_SIGNALED;
	d->num_sge = 0;
	d->sge = NULL;
	d->byte_len = 0;
	d->inline_len = 0;
	d->inline_data = NULL;
	d->hollow = true;
}

static void add_hollow(struct r2cc_qp_shadow_plan *plan, const struct r2cc_shadow_send *e)
{
	struct r2cc_shadow_send *d = &plan->send[plan->n_send++];
	*d = *e;
	make_hollow(d);
}

int r2cc_qp_shadow_plan_build(const struct r2cc_qp_shadow *sh,
			      const struct r2cc_qp_shadow_plan_in *in,
			      struct r2cc_qp_shadow_plan *plan)
{
	if (!sh || !in || !plan)
		return -EINVAL;
	memset(plan, 0, sizeof(*plan));
	int err = r2cc_qp_shadow_error(sh);
	if (err)
		return err;

	uint64_t k = in->peer_recv_consumed;
	if (in->lost_sent && k < sh->msgs_retired && sh->msgs_retired - k <= R2CC_SHADOW_LOST_MAX)
		k = sh->msgs_retired; /* the peer completes them from our record */
	uint64_t s_tail = sh->sq.tail, s_head = sh->sq.head;
	uint64_t r_tail = sh->rq.tail, r_head = sh->rq.head;
	if (k < sh->msgs_retired || k > sh->msgs_posted)
		return -EPROTO;

	size_t ns = (size_t)(s_head - s_tail), nr = (size_t)(r_head - r_tail);
	size_t sges = 0, inl = 0;
	for (uint64_t seq = s_tail + 1; seq <= s_head; seq++) {
		const struct shadow_rec *e = &sh->sends[seq & sh->sq.mask];
		sges += (size_t)e->num_sge;
		inl += e->send_flags & IBV_SEND_INLINE ? e->byte_len : 0;
	}
	for (uint64_t seq = r_tail + 1; seq <= r_head; seq++)
		sges += (size_t)sh->recvs[seq & sh->rq.mask].num_sge;

	struct r2cc_shadow_send *cand = calloc(ns + 1, sizeof(*cand));
	plan->synth = calloc(ns + 1, sizeof(*plan->synth));
	plan->send = calloc(ns + 1, sizeof(*plan->send));
	plan->recv = calloc(nr + 1, sizeof(*plan->recv));
	plan->sge_store = calloc(sges + 1, sizeof(*plan->sge_store));
	plan->inline_store = malloc(inl + 1);
	if (!cand || !plan->synth || !plan->send || !plan->recv || !plan->sge_store ||
	    !plan->inline_store) {
		free(cand);
		r2cc_qp_shadow_plan_free(plan);
		return -ENOMEM;
	}

	/* (a) and (c) before the boundary; collect the rest as candidates. */
	size_t sge_used = 0, inline_used = 0, nc = 0;
	bool read_before = false;
	for (uint64_t seq = s_tail + 1; seq <= s_head; seq++) {
		/* expanded into the next candidate's place: a landed one is used at once
		 * and its place taken by the next */
		struct r2cc_shadow_send *e = &cand[nc];
		rec_expand(sh, seq, e);
		/* At or before the k-th consuming request: landed. */
		bool landed = e->msgs < k || (e->msgs == k && is_consumer(e->opcode));
		if (!landed) {
			nc++;
			continue;
		}
		if (e->opcode == IBV_WR_RDMA_READ) {
			copy_send(plan, e, &sge_used, &inline_used);
			plan->reads_reposted++;
			read_before = true;
			continue;
		}
		plan->bytes_saved += e->byte_len;
		if (e->send_flags & IBV_SEND_SIGNALED) {
			add_synth(plan, e);
			if (read_before)
				plan->reordered = true;
		}
	}

	/* (b): after the boundary, in order. */
	for (size_t i = 0; i < nc; i++) {
		const struct r2cc_shadow_send *e = &cand[i];
		bool skip = false;
		if (e->opcode == IBV_WR_RDMA_WRITE) {
			if (superseded(cand, i, nc)) {
				plan->bytes_superseded += e->byte_len;
				skip = true;
			} else if (in->write_consumed && in->write_consumed(in->ctx, e)) {
				plan->bytes_consumed += e->byte_len;
				skip = true;
			}
		}
		if (skip) {
			if (e->send_flags & IBV_SEND_SIGNALED)
				add_hollow(plan, e);
			continue;
		}
		if (e->opcode == IBV_WR_RDMA_READ)
			plan->reads_reposted++;
		copy_send(plan, e, &sge_used, &inline_used);
	}
	free(cand);

	for (uint64_t seq = r_tail + 1; seq <= r_head; seq++) {
		const struct r2cc_shadow_recv *e = &sh->recvs[seq & sh->rq.mask];
		struct r2cc_shadow_recv *d = &plan->recv[plan->n_recv++];
		*d = *e;
		d->sge = &plan->sge_store[sge_used];
		memcpy(d->sge, e->sge, (size_t)e->num_sge * sizeof(*d->sge));
		sge_used += (size_t)e->num_sge;
	}
	plan->completions_synth = plan->n_synth;
	return 0;
}

uint64_t r2cc_qp_shadow_tag_step(const struct r2cc_qp_shadow *sh)
{
	return sh->tag_step;
}

void r2cc_qp_shadow_tagged_writes(const struct r2cc_qp_shadow *sh,
				  void (*fn)(void *ctx, const struct r2cc_shadow_send *w),
				  void *ctx)
{
	for (uint64_t seq = sh->sq.tail + 1; seq <= sh->sq.head; seq++) {
		const struct shadow_rec *e = &sh->sends[seq & sh->sq.mask];
		if (e->opcode == IBV_WR_RDMA_WRITE && e->tag) {
			struct r2cc_shadow_send w;
			rec_expand(sh, seq, &w);
			fn(ctx, &w);
		}
	}
}

size_t r2cc_qp_shadow_plan_drop(struct r2cc_qp_shadow_plan *plan,
				bool (*consumed)(void *ctx, const struct r2cc_shadow_send *w),
				void *ctx)
{
	size_t out = 0, hit = 0;
	for (size_t i = 0; i < plan->n_send; i++) {
		struct r2cc_shadow_send e = plan->send[i];
		if (!e.hollow && e.opcode == IBV_WR_RDMA_WRITE && consumed(ctx, &e)) {
			hit++;
			plan->bytes_consumed += e.byte_len;
			plan->bytes_reposted -= e.byte_len;
			if (!(e.send_flags & IBV_SEND_SIGNALED))
				continue;
			make_hollow(&e);
		}
		plan->send[out++] = e;
	}
	plan->n_send = out;
	return hit;
}

void r2cc_qp_shadow_plan_free(struct r2cc_qp_shadow_plan *plan)
{
	if (!plan)
		return;
	free(plan->synth);
	free(plan->send);
	free(plan->recv);
	free(plan->sge_store);
	free(plan->inline_store);
	memset(plan, 0, sizeof(*plan));
}

int r2cc_qp_shadow_plan_translate(struct r2cc_qp_shadow_plan *plan, r2cc_shadow_key_fn lkey_fn,
				  r2cc_shadow_key_fn rkey_fn, void *ctx)
{
	int rc;
	for (size_t i = 0; i < plan->n_send; i++) {
		struct r2cc_shadow_send *e = &plan->send[i];
		if (lkey_fn && !e->inline_data)
			for (int j = 0; j < e->num_sge; j++)
				if ((rc = lkey_fn(ctx, e->sge[j].addr, e->sge[j].length,
						  e->sge[j].lkey, &e->sge[j].lkey)))
					return rc;
		if (rkey_fn && !e->hollow && e->opcode != IBV_WR_SEND &&
		    e->opcode != IBV_WR_SEND_WITH_IMM)
			if ((rc = rkey_fn(ctx, e->remote_addr, e->byte_len, e->rkey, &e->rkey)))
				return rc;
	}
	if (lkey_fn)
		for (size_t i = 0; i < plan->n_recv; i++) {
			struct r2cc_shadow_recv *e = &plan->recv[i];
			for (int j = 0; j < e->num_sge; j++)
				if ((rc = lkey_fn(ctx, e->sge[j].addr, e->sge[j].length,
						  e->sge[j].lkey, &e->sge[j].lkey)))
					return rc;
		}
	return 0;
}

void r2cc_qp_shadow_plan_send_wr(const struct r2cc_qp_shadow_plan *plan, size_t i,
				 struct ibv_send_wr *wr, struct ibv_sge *sges)
{
	const struct r2cc_shadow_send *e = &plan->send[i];
	memset(wr, 0, sizeof(*wr));
	wr->wr_id = e->wr_id;
	wr->opcode = e->opcode;
	wr->send_flags = e->send_flags;
	wr->imm_data = e->imm_data;
	if (e->opcode != IBV_WR_SEND && e->opcode != IBV_WR_SEND_WITH_IMM) {
		wr->wr.rdma.remote_addr = e->remote_addr;
		wr->wr.rdma.rkey = e->rkey;
	}
	wr->sg_list = sges;
	if (e->inline_data) {
		wr->num_sge = e->inline_len ? 1 : 0;
		sges[0].addr = (uintptr_t)e->inline_data;
		sges[0].length = e->inline_len;
		sges[0].lkey = 0;
		return;
	}
	wr->num_sge = e->num_sge;
	for (int j = 0; j < e->num_sge; j++) {
		sges[j].addr = e->sge[j].addr;
		sges[j].length = e->sge[j].length;
		sges[j].lkey = e->sge[j].lkey;
	}
}

void r2cc_qp_shadow_plan_recv_wr(const struct r2cc_qp_shadow_plan *plan, size_t i,
				 struct ibv_recv_wr *wr, struct ibv_sge *sges)
{
	const struct r2cc_shadow_recv *e = &plan->recv[i];
	memset(wr, 0, sizeof(*wr));
	wr->wr_id = e->wr_id;
	wr->sg_list = sges;
	wr->num_sge = e->num_sge;
	for (int j = 0; j < e->num_sge; j++) {
		sges[j].addr = e->sge[j].addr;
		sges[j].length = e->sge[j].length;
		sges[j].lkey = e->sge[j].lkey;
	}
}

void r2cc_qp_shadow_plan_wc(const struct r2cc_qp_shadow_plan *plan, size_t i, uint32_t qp_num,
			    struct ibv_wc *wc)
{
	const struct r2cc_shadow_wc *c = &plan->synth[i];
	memset(wc, 0, sizeof(*wc));
	wc->wr_id = c->wr_id;
	wc->status = IBV_WC_SUCCESS;
	wc->opcode = c->opcode;
	wc->byte_len = c->byte_len;
	wc->qp_num = qp_num;
}
