/*
 * NCCL's clear-to-send writes under hot repair: the landed check (repair/model/qp_shadow.h,
 * "Clear-to-send"; docs/nccl-versions.md section 3).
 *
 * NCCL's receiver RDMA-writes 1 to 8 FIFO elements (NCCL_NET_IB_MAX_RECVS) into
 * one slot of the sender's FIFO, every element with the same idx (the receive's id
 * + 1) at the release's offset; the sender consumes a slot when every element's
 * idx equals its own head + 1. A re-post of such a write after a migration may
 * carry an element ahead of NCCL's own write of it still in flight on a sibling QP
 * (3 or 5-7 fused NICs), and that late write then lands over it: the sender waits
 * for ever. The landed check closes this (tests/unit/test_qp_shadow_model.c): the
 * plan re-posts a clear-to-send write only if the sender's slot does not already
 * hold its element or a newer one (every element's idx at least the write's).
 *
 * - When NCCL posts a send, r2cc_cts_tag() (the shadow's tag function; NCCL's
 *   thread, no lock, no allocation, no system call) recognises a clear-to-send
 *   write by its shape and its source, a host registration of the release's
 *   element layout, and keeps its idx as the request's tag.
 * - After the fence, each side's REQ or REP asks the peer about its unretired
 *   tagged writes (r2cc_cts_queries()); the peer reads its own registered memory
 *   (r2cc_cts_answer(); its old path is fenced by then, so nothing more lands
 *   there) and answers in its REP or GO; the answers drop the landed writes from
 *   the plan before its sends go out (r2cc_cts_drop()).
 * A write without an answer (an older peer, a version R2CC does not know, memory
 * that cannot be read) is re-posted as before the check.
 *
 * Here: what a clear-to-send write looks like and whether one can be judged
 * (repair/model/cts.c); the queries, answers and drops are the engine's
 * (repair/landed.c, declared in repair/engine_priv.h).
 */
#ifndef R2CC_REPAIR_CTS_H
#define R2CC_REPAIR_CTS_H

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define R2CC_CTS_MAX_ELEMS 8  /* NCCL_NET_IB_MAX_RECVS */
#define R2CC_CTS_ELEM_MAX  64 /* the largest element of the layouts below */
/* The longest clear-to-send write of any layout: the shadow calls r2cc_cts_tag() for no
 * longer request (its tag_max_bytes), so NCCL's data writes never reach it. */
#define R2CC_CTS_MAX_BYTES (R2CC_CTS_MAX_ELEMS * R2CC_CTS_ELEM_MAX)
#define R2CC_CTS_MAX_QUERY 512 /* queries per queue pair and message */

/* nccl-rdma-sharp-plugins' releases whose clear-to-send layout R2CC knows: those that
 * export net API v9 to v11 (synced with NCCL 2.24-2.28; r2cc_cts_ibext_layout()). */
#define R2CC_IBEXT_API_MIN 9
#define R2CC_IBEXT_API_MAX 11

/* The clear-to-send elements a transport writes: element size, the offsets of
 * idx and nreqs, the FIFO's slots, and whether the sender zeroes a consumed
 * element (NCCL 2.18-2.28 and nccl-rdma-sharp-plugins do; 2.29 on do not). */
struct r2cc_cts_layout {
	uint8_t elem, idx, nreqs;
	uint16_t slots;
	bool clears;
	const char *who; /* "NCCL 2.24-2.29", "IBext (net API v9-v11)": for logs */
};

/* The layout of an NCCL version code (22803 for 2.28.3), or NULL when the version
 * is not known (0) or not one whose layout R2CC knows (2.18-2.32). */
const struct r2cc_cts_layout *r2cc_cts_nccl_layout(int code);
/* The layout of nccl-rdma-sharp-plugins ("IBext") by the newest net API it exports
 * (ncclNetPlugin_vN), or NULL where R2CC does not know that release's
 * (docs/net-plugins.md). */
const struct r2cc_cts_layout *r2cc_cts_ibext_layout(int net_api);

struct r2cc_qp;
/* The layout q's transport writes: its own (a net plugin's), else the loaded
 * NCCL's; NULL when not known. */
const struct r2cc_cts_layout *r2cc_cts_of(const struct r2cc_qp *q);

struct r2cc_qp_shadow;
/*
 * Why the clear-to-send re-posts of a fenced QP cannot be made safe, or NULL. A
 * transport that zeroes a slot's first element once the sender has consumed it
 * (NCCL 2.18-2.28, IBext) makes the slot of a consumed write read as that of one
 * that never landed; when one slot's writes also travel on several QPs (3 or 5-7
 * fused NICs: the QP's idx rises by that many, which does not divide the FIFO's
 * slots), re-posting a consumed one can land over a newer element
 * (tests/unit/test_qp_shadow_model.c, clearing_nccl_needs_one_qp_per_slot). Such a
 * QP is not repaired: NCCL gets its error.
 */
const char *r2cc_cts_unsafe(const struct r2cc_qp_shadow *sh, const struct r2cc_cts_layout *l);

/* Whether [addr, addr+len) can be read by this process (registration time: a
 * system call). Large regions are not probed (false): clear-to-send FIFOs are
 * small. */
bool r2cc_cts_host_readable(uint64_t addr, uint64_t len);
/* Reads len bytes at addr of this process through the kernel, so that an address
 * a peer names can never fault it; false when it cannot (warned once when a
 * seccomp profile denies it). */
bool r2cc_cts_read(uint64_t addr, void *buf, size_t len);

/* The shadow's tag function: ctx is NCCL's QP (struct r2cc_qp *), whose NIC its
 * keys belong to. The write's idx, or 0 when it is not a clear-to-send write. */
uint64_t r2cc_cts_tag(void *ctx, const struct ibv_send_wr *wr);

#endif
