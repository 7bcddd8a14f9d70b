/*
 * NCCL's clear-to-send writes under hot repair: the landed check (repair/qp_shadow.h,
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
 */
#ifndef R2CC_REPAIR_CTS_H
#define R2CC_REPAIR_CTS_H

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define R2CC_CTS_MAX_ELEMS 8   /* NCCL_NET_IB_MAX_RECVS */
#define R2CC_CTS_MAX_QUERY 512 /* queries per queue pair and message */

/* The element layout of an NCCL version code (22803 for 2.28.3): its size and the
 * offsets of idx and nreqs; false when the version is not known (0) or not one
 * whose layout R2CC knows (2.18-2.32). */
bool r2cc_cts_layout(int code, uint8_t *elem, uint8_t *idx_off, uint8_t *nreqs_off);

struct r2cc_qp_shadow;
/*
 * Why the clear-to-send re-posts of a fenced QP cannot be made safe, or NULL. NCCL
 * 2.18-2.28 zero a slot's first element once the sender has consumed it, so the slot
 * of a consumed write reads as that of one that never landed; when one slot's
 * writes also travel on several QPs (3 or 5-7 fused NICs: the QP's idx rises by
 * that many, which does not divide the FIFO's slots), re-posting a consumed one can
 * land over a newer element (tests/unit/test_qp_shadow_model.c,
 * clearing_nccl_needs_one_qp_per_slot). Such a QP is not repaired: NCCL gets its error.
 */
const char *r2cc_cts_unsafe(const struct r2cc_qp_shadow *sh);

/* Whether [addr, addr+len) can be read by this process (registration time: a
 * system call). Large regions are not probed (false): clear-to-send FIFOs are
 * small. */
bool r2cc_cts_host_readable(uint64_t addr, uint64_t len);

/* The shadow's tag function: ctx is the NIC NCCL's keys belong to (struct
 * r2cc_nic *). The write's idx, or 0 when it is not a clear-to-send write. */
uint64_t r2cc_cts_tag(void *ctx, const struct ibv_send_wr *wr);

#endif
