/*
 * Hot repair (docs/architecture.md, Hot repair): the health monitor and the migration engine.
 *
 * The verbs wrappers (intercept/verbs.c) call in here at four places:
 *  - QP/CQ creation and destruction (control path): the QP's shadow and the
 *    engine's record of it, the CQ's virtual side;
 *  - the data path, only when an object's gate says hot repair owns it
 *    (R2CC_GATE_SLOW) or a completion carries an error status: while nothing has
 *    failed the wrappers never get here;
 *  - async events, which are hidden from NCCL when they concern a NIC or QP that
 *    hot repair handles.
 *
 * One thread per process ("r2cc-repair") runs everything that may wait: fencing
 * a QP (its gate closed, moved to ERR, drained up to a marker posted behind NCCL's
 * requests), the exchange with the peer's engine over the control plane (message
 * type R2CC_REPAIR_MSG), the new QP on a healthy NIC, the exactly-once re-post
 * (repair/model/qp_shadow.h) with translated keys (repair/model/mr_mirror.h), and the stall
 * scan. NCCL's threads only see their posts held while a QP migrates and the
 * completions of the new QP under the old QP's number.
 *
 * Exchange, per QP pair, initiated by whichever side found the failure (both may;
 * the pair with the lower identity wins, the other serves it):
 *   A: fence + drain old QP, count k_A, new QP on NIC B (INIT)
 *   A -> P  REQ  {ids, k_A, A's new QP, A's NIC names, A's rkey map A -> B}
 *   P: fence + drain, k_P, new QP on B' (B's rail if healthy), RTR/RTS to A's,
 *      re-post its receives
 *   P -> A  REP  {k_P, P's new QP, P's rkey map P's NIC -> B'}
 *   A: RTR/RTS, re-post receives, then sends (plan with k_P), then held posts
 *   A -> P  GO
 *   P: re-post sends (plan with k_A), then held posts
 * P is exactly the process that owns the peer QP, known since RTS
 * (repair/peer.h); ids are both ends' exact identities (GID or LID, and QP
 * number). Every queue pair the repair thread takes up at once is fenced at
 * once, and all those with one peer process travel in one message per step
 * (one REQ, one REP, one GO per peer, not per QP), so a NIC with hundreds of
 * QPs over many peers is repaired in parallel. A side that cannot repair
 * answers NACK; an exchange that does not finish within R2CC_REPAIR_BASE_MS
 * plus R2CC_REPAIR_PER_QP_US for every queue pair of its message ends with an
 * error completion handed to NCCL for that QP (the log says why): never a hang.
 */
#ifndef R2CC_REPAIR_ENGINE_H
#define R2CC_REPAIR_ENGINE_H

#include "ctl/ctl.h"
#include "ctl/job.h"
#include "shim/registry.h"

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define R2CC_REPAIR_MSG	      40
#define R2CC_REPAIR_BASE_MS   5000 /* an exchange's deadline: this, */
#define R2CC_REPAIR_PER_QP_US 2000 /* plus this per queue pair of its message */

/* An exchange message: a header (version R2CC_REPAIR_WIRE_VERSION, the number of rkey maps as a
 * byte, the entry count as a little-endian u16), then that many entries of R2CC_REPAIR_WIRE_SIZE
 * bytes, one per queue pair (the op is an entry's first byte and its NIC names are 64 bytes at the
 * offsets given), then the maps: each two NUL-terminated NIC names of 64 bytes (from, to), a
 * little-endian u32 length and that many bytes of the sender's full rkey map between the two NICs
 * as repair/model/mr_mirror.h encodes it. A REQ or REP carries the map for the NICs
 * its queue pair moves between. An entry ends with the sender's retired message
 * count (u64 at R2CC_REPAIR_WIRE_SENT), a count of records (a byte, at most
 * R2CC_REPAIR_WIRE_LOST and at most the retired count) and that many message
 * opcodes (1..3), immediates and lengths. The header ends with a little-endian u32
 * count of clear-to-send records (repair/model/cts.h), R2CC_REPAIR_WIRE_CTS bytes each, that
 * follow the maps: the entry they belong to (u16), a kind (1 query, 2 answer), the
 * elements (1..8), an element's size (32 or 64), idx's offset in it (a multiple of 8,
 * 8 bytes inside it), an answer's landed flag (0 or 1), a pad byte, then the write's
 * remote address and its idx (u64 each). The whole message is at most
 * R2CC_CTL_MAX_PAYLOAD (larger ones are split, each part with its maps and records). */
#define R2CC_REPAIR_WIRE_VERSION  5
#define R2CC_REPAIR_WIRE_HDR	  8
#define R2CC_REPAIR_WIRE_CTS	  24
#define R2CC_REPAIR_WIRE_SIZE	  307
#define R2CC_REPAIR_WIRE_MAX	  4096 /* entries in one message */
#define R2CC_REPAIR_WIRE_NEW_NIC  98
#define R2CC_REPAIR_WIRE_ORIG_NIC 162
#define R2CC_REPAIR_WIRE_MAP_HDR  132
#define R2CC_REPAIR_WIRE_SENT	  226
#define R2CC_REPAIR_WIRE_LOST	  8 /* records of retired messages in an entry */

/* The control thread's check of an exchange message from a peer (version,
 * entry count and length, ops, strings terminated, the maps' framing: their
 * bodies are checked when they are stored) before the repair thread
 * sees it: the number of entries, copied to out (room for max entries), or
 * -EPROTO (also when there are more than max). Exposed for tests/fuzz. */
int r2cc_repair_wire_parse(const void *payload, size_t len, void *out, int max);

/* The real verbs functions the engine calls (intercept/verbs.c fills them). */
struct r2cc_repair_verbs {
	struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *,
				    int);
	int (*destroy_cq)(struct ibv_cq *);
	struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
	int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
	int (*destroy_qp)(struct ibv_qp *);
	int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
	int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
	int (*gid_type)(struct ibv_context *, uint8_t, int); /* IBV_GID_TYPE_*, -1 unknown */
	void (*ack_async_event)(struct ibv_async_event *);
};

/* Hot repair is on: R2CC active and R2CC_MODE is not 0. */
bool r2cc_repair_enabled(void);
void r2cc_repair_set_verbs(const struct r2cc_repair_verbs *v);

/* A communicator's directory, kept for finding and reaching peers (the engine
 * takes ownership). */
void r2cc_repair_add_dir(struct r2cc_ctl_dir *dir);
/* Its communicator is gone: the directory is left and freed once unused. */
void r2cc_repair_release_dir(struct r2cc_ctl_dir *dir);
/* The three above, for the job table's hand-over (ctl/job.h): the NCCL door sets
 * them before its first registration. */
extern const struct r2cc_job_dir_ops r2cc_repair_dir_ops;

/* Control path. */
void r2cc_repair_cq_created(struct r2cc_cq *c);
void r2cc_repair_cq_destroyed(struct r2cc_cq *c);
void r2cc_repair_qp_created(struct r2cc_qp *q, const struct ibv_qp_init_attr *attr);
/* NCCL moved the QP to RTS: a QP on a declared-failed or failed NIC moves now. */
void r2cc_repair_qp_ready(struct r2cc_qp *q);
/* Before the real destroy; the private QP and CQ of a migrated QP go too. */
void r2cc_repair_qp_destroying(struct r2cc_qp *q);
/* The real destroy succeeded: the QP's record may be freed (by the repair thread).
 * true: the record took q, the registry's object, and frees it with itself (the
 * engine's other threads may still be reading it); false: the caller frees it. */
bool r2cc_repair_qp_destroyed(struct r2cc_qp *q);

/* Data path, slow side (gate closed). Errors here, in and out, are negative errnos
 * (shim/common.h); the verbs wrappers convert. */
int r2cc_repair_post_send(struct r2cc_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int r2cc_repair_post_recv(struct r2cc_qp *q, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
/* The fast path's post was refused with rc (*bad: the first request not posted):
 * if the device is dead, its NIC has failed and those requests are held for the
 * QP's new path (0); otherwise rc, for NCCL. Called outside the QP's gate. */
int r2cc_repair_send_refused(struct r2cc_qp *q, int rc, struct ibv_send_wr **bad);
int r2cc_repair_recv_refused(struct r2cc_qp *q, int rc, struct ibv_recv_wr **bad);
/* NCCL's ibv_modify_qp of q to INIT, RTR or RTS was refused with rc: if the device is
 * dead (-EIO, -ENETDOWN) and hot repair has q, its NIC has failed and the QP is virtual
 * from birth (docs/architecture.md, Hot repair): true, and the caller reports success and keeps
 * the attributes; the QP migrates when NCCL moves it to RTS. false: rc is NCCL's. */
bool r2cc_repair_modify_refused(struct r2cc_qp *q, int rc, int to_state);
/* NCCL's ibv_create_cq or ibv_create_qp on dead's device was refused with rc: if
 * the device is dead and hot repair is on, its NIC has failed and the object is
 * made as a stand-in on the context returned, a healthy sibling of the same
 * provider (NULL: rc is NCCL's). */
struct r2cc_ctx *r2cc_repair_stand_in(struct r2cc_ctx *dead, int rc);
/* NCCL's memory registration on nic's device was refused with rc: if the device is
 * dead (-EIO, -ENETDOWN) and hot repair is on, the NIC has failed (its QPs are
 * virtual, and move) and true: the caller makes the registration virtual
 * (r2cc_mr_mirror_reg_virtual). false: rc is NCCL's. */
bool r2cc_repair_reg_refused(struct r2cc_nic *nic, int rc);
int r2cc_repair_poll(struct r2cc_cq *c, int num, struct ibv_wc *wc);
/* The fast poll found error completions among wc[0..got): those of QPs hot repair
 * takes over are removed (and repair starts); returns how many are left. Called
 * inside the CQ's gate. */
int r2cc_repair_poll_errors(struct r2cc_cq *c, struct ibv_wc *wc, int got);

/* wr_id of the probe: a signalled zero-byte RDMA WRITE the stall scan posts
 * behind a QP's trailing unsignalled requests, whose completion NCCL never sees. */
#define R2CC_PROBE_WRID 0x5232434350524f42ull /* "R2CCPROB" */
/* The fast poll met the probe's completion (success): note it; never NCCL's. */
void r2cc_repair_probe_done(struct r2cc_cq *c, const struct ibv_wc *wc);

/* An async event NCCL is about to receive: true when hot repair handled (and
 * acked) it and NCCL must not see it. */
bool r2cc_repair_async_event(struct ibv_context *ctx, struct ibv_async_event *ev);

/* Is this QP / CQ one of hot repair's own (never NCCL's)? */
bool r2cc_repair_owns_qp(const struct ibv_qp *qp);
bool r2cc_repair_owns_cq(const struct ibv_cq *cq);

/* Report: writes the incidents array (JSON) and the text lines. */
void r2cc_repair_report(FILE *text, FILE *json);

#endif
