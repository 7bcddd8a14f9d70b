/*
 * NCCL's clear-to-send writes under hot repair: recognised when posted, asked about
 * after the fence, answered from this process's own memory, and the landed ones
 * dropped from the plan (repair/model/cts.h).
 */
#include "repair/model/cts.h"

#include "intercept/netplugin.h"
#include "repair/engine_priv.h"

#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

/* docs/nccl-versions.md section 3: struct ncclIbSendFifo by release. */
static const struct cts_release {
	int from, to;
	struct r2cc_cts_layout l;
} releases[] = {
    /* addr, int size, rkey, nreqs, tag, idx */
    {21800, 22000, {32, 24, 16, 64, true, "NCCL 2.18-2.19"}},
    /* addr, int size, rkeys[2], nreqs, tag, idx */
    {22000, 22400, {64, 32, 20, 256, true, "NCCL 2.20-2.23"}},
    /* addr, uint64_t size, rkeys[4], ... */
    {22400, 22900, {64, 40, 32, 256, true, "NCCL 2.24-2.28"}},
    {22900, 23000, {64, 40, 32, 256, false, "NCCL 2.29"}},
    /* addr, uint64_t size, rkeys[8], ... */
    {23000, 23300, {64, 56, 48, 256, false, "NCCL 2.30-2.32"}},
};

/*
 * nccl-rdma-sharp-plugins' struct ncclIbSendFifo (docs/net-plugins.md): its
 * releases that export net API v9-v11 (synced with NCCL 2.24-2.28) write NCCL
 * 2.24's element into a FIFO of 64 slots (MAX_REQUESTS 8 x 8 receives) and zero a
 * consumed slot's first element. Older releases (net API v8 and below) wrote
 * 32-byte or rkeys[2] elements that the exported API alone does not tell apart:
 * R2CC does not guess.
 */
static const struct r2cc_cts_layout ibext_224 = {64, 40, 32, 64, true, "IBext (net API v9-v11)"};

const struct r2cc_cts_layout *r2cc_cts_nccl_layout(int code)
{
	for (size_t i = 0; i < sizeof(releases) / sizeof(releases[0]); i++)
		if (code >= releases[i].from && code < releases[i].to)
			return &releases[i].l;
	return NULL;
}

const struct r2cc_cts_layout *r2cc_cts_ibext_layout(int net_api)
{
	return net_api >= R2CC_IBEXT_API_MIN && net_api <= R2CC_IBEXT_API_MAX ? &ibext_224 : NULL;
}

const struct r2cc_cts_layout *r2cc_cts_of(const struct r2cc_qp *q)
{
	if (q->cts)
		return q->cts;
	return q->cts_unknown
		   ? NULL
		   : r2cc_cts_nccl_layout(__atomic_load_n(&r2cc_nccl_version, __ATOMIC_RELAXED));
}

const char *r2cc_cts_unsafe(const struct r2cc_qp_shadow *sh, const struct r2cc_cts_layout *l)
{
	uint64_t step = sh ? r2cc_qp_shadow_tag_step(sh) : 0;
	/* a transport that leaves a consumed element as it is can always be judged;
	 * one that clears it, only when one slot's writes stay on one QP */
	if (!l || !l->clears || !step || l->slots % step == 0)
		return NULL;
	static __thread char why[320];
	snprintf(why, sizeof(why),
		 "%s clears a consumed clear-to-send element, and over %llu fused NICs one "
		 "FIFO slot's writes travel on several QPs: fuse 1, 2 or 4 NICs "
		 "(NCCL_NET_MERGE_LEVEL=LOC fuses none, NCCL_NET_FORCE_MERGE names them), or "
		 "use NCCL 2.29+ with its own IB transport",
		 l->who, (unsigned long long)step);
	return why;
}

/* A registration of NCCL's clear-to-send elements (both ends' FIFOs) is 16 KiB
 * (2.18) or 128 KiB; anything far larger is data and is never read here. */
#define CTS_PROBE_MAX (1u << 20)

static bool readable(uint64_t addr, void *buf, size_t len)
{
	struct iovec local = {buf, len};
	struct iovec remote = {(void *)(uintptr_t)addr, len};
	ssize_t n = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
	if (n < 0 && (errno == EPERM || errno == ENOSYS)) {
		/* a seccomp profile that denies it: every write counts as not landed */
		static int told;
		if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
			R2CC_WARN("repair: the landed check cannot read this process's memory "
				  "(process_vm_readv: %s): clear-to-send writes are re-posted "
				  "unless superseded, which over 3 or 5-7 fused NICs is not "
				  "exactly once",
				  strerror(errno));
	}
	return n == (ssize_t)len;
}

bool r2cc_cts_host_readable(uint64_t addr, uint64_t len)
{
	uint8_t b;
	return len && len <= CTS_PROBE_MAX && addr + len > addr && readable(addr, &b, 1) &&
	       readable(addr + len - 1, &b, 1);
}

uint64_t r2cc_cts_tag(void *ctx, const struct ibv_send_wr *w)
{
	const struct r2cc_qp *q = ctx;
	const struct r2cc_cts_layout *l = r2cc_cts_of(q);
	if (w->opcode != IBV_WR_RDMA_WRITE || w->num_sge != 1 || !l)
		return 0;
	uint8_t elem = l->elem, off = l->idx, noff = l->nreqs;
	uint64_t a = w->sg_list[0].addr;
	uint32_t len = w->sg_list[0].length;
	if (!len || len % elem || len > R2CC_CTS_MAX_ELEMS * elem ||
	    w->wr.rdma.remote_addr % elem || (a + off) % 8)
		return 0;
	struct r2cc_mr *m = r2cc_mr_by_lkey(q->ctx->nic, w->sg_list[0].lkey);
	if (!m || !__atomic_load_n(&m->host_ok, __ATOMIC_ACQUIRE) || a < m->addr ||
	    a + len > m->addr + m->len)
		return 0;
	/* NCCL fills the elements, then posts them on this thread: they hold still.
	 * Every one carries the same idx and the number of elements as nreqs. */
	uint32_t n = len / elem;
	uint64_t idx = *(const volatile uint64_t *)(uintptr_t)(a + off);
	for (uint32_t j = 0; j < n; j++) {
		uint64_t e = a + (uint64_t)j * elem;
		if (*(const volatile uint64_t *)(uintptr_t)(e + off) != idx ||
		    *(const volatile uint32_t *)(uintptr_t)(e + noff) != n)
			return 0;
	}
	return idx;
}

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
	    len > sizeof(buf) || !readable(addr, buf, len))
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
