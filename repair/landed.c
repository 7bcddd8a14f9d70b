/*
 * The landed check of NCCL's clear-to-send writes (repair/model/cts.h), the
 * engine's part: after the fence, this side's queries about its unretired
 * tagged writes, the answers to the peer's from this process's own memory, and
 * the landed writes dropped from the plan before its sends go out.
 */
#include "repair/engine_priv.h"
#include "repair/model/cts.h"

#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

void r2cc_cts_forget(struct r2cc_rqp *r)
{
	free(r->cts_q);
	free(r->cts_a);
	r->cts_q = r->cts_a = NULL;
	r->ncts_q = r->ncts_a = 0;
	r->cts_dropped = 0;
}

struct collect {
	struct rep_cts *q;
	int n;
	uint8_t elem, off;
};

static void collect_one(void *ctx, const struct r2cc_shadow_send *w)
{
	struct collect *c = ctx;
	if (c->n == R2CC_CTS_MAX_QUERY || !w->byte_len || w->byte_len % c->elem ||
	    w->byte_len > R2CC_CTS_MAX_ELEMS * c->elem)
		return;
	c->q[c->n++] = (struct rep_cts){
	    .kind = CTS_QUERY,
	    .nelem = (uint8_t)(w->byte_len / c->elem),
	    .elem = c->elem,
	    .idx_off = c->off,
	    .addr = htole64(w->remote_addr),
	    .tag = htole64(w->tag),
	};
}

int r2cc_cts_queries(struct r2cc_rqp *r)
{
	r2cc_cts_forget(r);
	struct collect c = {0};
	const struct r2cc_cts_layout *l = r->cur_sh ? r2cc_cts_of(r->q) : NULL;
	if (!l)
		return 0;
	c.elem = l->elem;
	c.off = l->idx;
	c.q = malloc(sizeof(*c.q) * R2CC_CTS_MAX_QUERY);
	if (!c.q)
		return -ENOMEM; /* no queries: the writes are re-posted as without the check */
	r2cc_qp_shadow_tagged_writes(r->cur_sh, collect_one, &c);
	if (!c.n) {
		free(c.q);
		return 0;
	}
	r->cts_q = c.q;
	r->ncts_q = c.n;
	return c.n;
}

/* Every element of the write at q->addr holds its idx or a newer one. Only
 * memory NCCL registered here for remote writes and reads (the peer could RDMA-read
 * it: the answer tells it nothing more), small and in host memory (the FIFO's
 * kind), is read, and through the kernel, so that an address a peer names can never
 * fault this process. */
static bool landed(const struct rep_cts *q)
{
	uint64_t addr = le64toh(q->addr), tag = le64toh(q->tag);
	size_t len = (size_t)q->nelem * q->elem;
	struct r2cc_mr *m = r2cc_mr_by_addr(NULL, addr, len);
	uint8_t buf[R2CC_CTS_MAX_ELEMS * 64];
	const int rw = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	if (!m || (m->access & rw) != rw || !__atomic_load_n(&m->host_ok, __ATOMIC_ACQUIRE) ||
	    len > sizeof(buf) || !r2cc_cts_read(addr, buf, len))
		return false;
	for (int j = 0; j < q->nelem; j++) {
		uint64_t idx;
		memcpy(&idx, buf + (size_t)j * q->elem + q->idx_off, sizeof(idx));
		if (idx < tag)
			return false;
	}
	return true;
}

int r2cc_cts_answer(struct outboxes *o, const struct r2cc_ctl_dir *dir, int rank,
		    const struct inbox *in, int entry)
{
	int n = 0;
	for (int i = 0; i < in->ncts; i++) {
		struct rep_cts q;
		memcpy(&q, &in->cts[i], sizeof(q));
		if (le16toh(q.entry) != entry || q.kind != CTS_QUERY)
			continue;
		q.kind = CTS_ANSWER;
		q.landed = landed(&q);
		if (r2cc_out_cts(o, dir, rank, &q, 1))
			break;
		n++;
	}
	return n;
}

void r2cc_cts_take(struct r2cc_rqp *r, const struct inbox *in, int entry)
{
	int n = 0;
	for (int i = 0; i < in->ncts; i++)
		n += le16toh(in->cts[i].entry) == entry && in->cts[i].kind == CTS_ANSWER;
	free(r->cts_a);
	r->cts_a = n ? malloc(sizeof(*r->cts_a) * (size_t)n) : NULL;
	r->ncts_a = 0;
	for (int i = 0; r->cts_a && i < in->ncts; i++)
		if (le16toh(in->cts[i].entry) == entry && in->cts[i].kind == CTS_ANSWER)
			memcpy(&r->cts_a[r->ncts_a++], &in->cts[i], sizeof(*r->cts_a));
}

static bool write_landed(void *ctx, const struct r2cc_shadow_send *w)
{
	const struct r2cc_rqp *r = ctx;
	if (!w->tag)
		return false;
	for (int i = 0; i < r->ncts_a; i++)
		if (le64toh(r->cts_a[i].addr) == w->remote_addr &&
		    le64toh(r->cts_a[i].tag) == w->tag)
			return r->cts_a[i].landed == 1;
	return false;
}

void r2cc_cts_drop(struct r2cc_rqp *r)
{
	if (r->have_plan && r->ncts_a)
		r->cts_dropped += r2cc_qp_shadow_plan_drop(&r->plan, write_landed, r);
}
