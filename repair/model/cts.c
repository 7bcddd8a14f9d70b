/*
 * NCCL's clear-to-send writes under hot repair (repair/model/cts.h): their layouts
 * by release, whether a QP's re-posts can be judged, recognised when posted, and
 * this process's memory read through the kernel. The engine asks and answers
 * about them after the fence (repair/landed.c).
 */
#include "repair/model/cts.h"

#include "repair/model/qp_shadow.h"
#include "shim/core.h"
#include "shim/log.h"
#include "shim/registry.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

/* An element size, refused by the compiler above R2CC_CTS_ELEM_MAX (the shadow does
 * not call r2cc_cts_tag() for a write longer than R2CC_CTS_MAX_BYTES). */
#define ELEM(n) ((n) + 0 * sizeof(char[(n) <= R2CC_CTS_ELEM_MAX ? 1 : -1]))

/* docs/nccl-versions.md section 3: struct ncclIbSendFifo by release. */
static const struct cts_release {
	int from, to;
	struct r2cc_cts_layout l;
} releases[] = {
    /* addr, int size, rkey, nreqs, tag, idx */
    {21800, 22000, {ELEM(32), 24, 16, 64, true, "NCCL 2.18-2.19"}},
    /* addr, int size, rkeys[2], nreqs, tag, idx */
    {22000, 22400, {ELEM(64), 32, 20, 256, true, "NCCL 2.20-2.23"}},
    /* addr, uint64_t size, rkeys[4], ... */
    {22400, 22900, {ELEM(64), 40, 32, 256, true, "NCCL 2.24-2.28"}},
    {22900, 23000, {ELEM(64), 40, 32, 256, false, "NCCL 2.29"}},
    /* addr, uint64_t size, rkeys[8], ... */
    {23000, 23300, {ELEM(64), 56, 48, 256, false, "NCCL 2.30-2.32"}},
};

/*
 * nccl-rdma-sharp-plugins' struct ncclIbSendFifo (docs/net-plugins.md): its
 * releases that export net API v9-v11 (synced with NCCL 2.24-2.28) write NCCL
 * 2.24's element into a FIFO of 64 slots (MAX_REQUESTS 8 x 8 receives) and zero a
 * consumed slot's first element. Older releases (net API v8 and below) wrote
 * 32-byte or rkeys[2] elements that the exported API alone does not tell apart:
 * R2CC does not guess.
 */
static const struct r2cc_cts_layout ibext_224 = {ELEM(64), 40,	 32,
						 64,	   true, "IBext (net API v9-v11)"};

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

bool r2cc_cts_read(uint64_t addr, void *buf, size_t len)
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
	return len && len <= CTS_PROBE_MAX && addr + len > addr && r2cc_cts_read(addr, &b, 1) &&
	       r2cc_cts_read(addr + len - 1, &b, 1);
}

uint64_t r2cc_cts_tag(void *ctx, const struct ibv_send_wr *w)
{
	/* the opcode's test before the layout's lookup: the shadow's requests of up to
	 * R2CC_CTS_MAX_BYTES come here, plain writes or not */
	if (w->opcode != IBV_WR_RDMA_WRITE || w->num_sge != 1)
		return 0;
	const struct r2cc_qp *q = ctx;
	const struct r2cc_cts_layout *l = r2cc_cts_of(q);
	if (!l)
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
