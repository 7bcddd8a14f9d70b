/*
 * The shadow of one queue pair: every work request NCCL posted on it that has
 * not yet been retired by a completion, copied at post time, and the plan that
 * turns that shadow into an exactly-once re-post on a new queue pair when the
 * old one has failed (docs/architecture.md, Hot repair, "Migration, exactly once").
 *
 * The shadow is pure bookkeeping: it posts nothing, reads no NCCL state and
 * calls no verbs function. intercept/verbs.c records into it from the
 * post/poll wrappers; repair/ builds the plan once the QP is fenced, walks it,
 * and posts what it says on the new QP.
 *
 * --- What is recorded ----------------------------------------------------------
 * Send queue: opcode, send_flags (IBV_SEND_SIGNALED added when the QP has
 * sq_sig_all), wr_id, imm_data (as posted, network order), remote addr/rkey,
 * the SGE list (addr, length, lkey: copied, NCCL reuses its arrays), the bytes
 * of an IBV_SEND_INLINE request (the NIC copies those at post time, so they are
 * the request's payload; the source may change right after), a per-QP sequence
 * number (1, 2, ...) and the running count of receive-consuming requests
 * (WRITE_WITH_IMM, SEND, SEND_WITH_IMM) up to and including this one.
 * Atomics are refused. Receive queue: wr_id, SGEs, sequence number.
 *
 * Retiring. RC completes a send queue in order: a successful signalled
 * completion retires its request and every earlier (unsignalled) one. A
 * successful receive completion retires the oldest posted receive. Completions
 * with an error status retire nothing (a flushed request has not landed as far
 * as anyone knows).
 *
 * --- Concurrency contract --------------------------------------------------------
 * Recording and retiring never allocate, lock or make a system call. One
 * thread records (post_send/post_recv/unpost_send) and one thread retires
 * (send_completed/recv_completed/wc); they may be the same thread (NCCL posts
 * and polls a QP from its proxy thread) or two different ones: the queues are
 * single-producer/single-consumer rings with release/acquire on their head and
 * tail. With two threads, record BEFORE the real post (post_send with bad =
 * NULL), then unpost_send the requests the provider refused: the completion of
 * a request can then never be polled before its record exists. With one
 * thread, recording after the real post with the provider's bad_wr is as good.
 * Several posting threads on one QP need the caller's own serialisation.
 * Building a plan needs the QP quiesced: no record or retire running on this
 * shadow (the QP is in ERR, its CQ drained, new posts held by the caller).
 *
 * After any refused record (atomic, too many SGEs, inline too long, ring full)
 * the shadow is BROKEN for good: it no longer mirrors the QP, so the QP cannot
 * be repaired; r2cc_qp_shadow_plan_build() returns the error and the caller
 * fails that QP cleanly (docs/architecture.md: never guess).
 *
 * --- The plan --------------------------------------------------------------------
 * Inputs: this shadow, quiesced after the CQ drain (every successful completion
 * the NIC produced has been passed to the shadow, and will be passed to NCCL),
 * and k = the number of successful receive completions the PEER's shadow of
 * the peer QP counted (r2cc_qp_shadow_recv_consumed(), sent over the control
 * plane). Same rule on both sides, so the two ends agree by construction: a
 * message the receiver counted is never re-sent, one it did not count is re-sent
 * and its receive re-posted.
 *
 * Send side, over the unretired requests in order, with B = the k-th
 * receive-consuming request (or "before the first unretired" when the k-th was
 * already retired):
 *  (a) requests at or before B landed (RC delivers in order and B was
 *      consumed): each signalled one gets a synthesised IBV_WC_SUCCESS
 *      completion (wr_id, opcode, byte_len = its SGE bytes), unsignalled ones
 *      are simply dropped. Their bytes count as saved.
 *  (b) requests after B are re-posted in order: IMMs and SENDs after B did not
 *      land; plain WRITEs may have landed in part, and writing them again is
 *      idempotent. Two refinements skip a plain WRITE (a signalled one is then
 *      re-posted HOLLOW: a zero-byte signalled WRITE with the same wr_id, so its
 *      completion still comes, in order, and nothing lands):
 *        - superseded: a later plain WRITE in the plan, with no IMM, SEND or
 *          READ between them, covers the same rkey and a superset of its
 *          target range (the final bytes are the later one's anyway);
 *        - consumed: the caller's write_consumed() says the peer has already
 *          consumed what this write carried (FIFO entries, below).
 *  (c) RDMA READs not completed are re-posted wherever they sit, even before
 *      B: a READ's response may be lost while later writes landed. A READ
 *      re-executed reads the target as it is now; that is right for NCCL's GPU
 *      flush (a 1-byte read whose data nobody looks at) and for any read of
 *      memory that does not change under it. When such a READ sits before a
 *      signalled request whose completion is synthesised, completions come out
 *      of send-queue order: plan->reordered says so.
 *  Atomics never get this far (refused when posted).
 *  Consistency checks: k below the number of consuming requests already
 *  retired here (a completion we saw acknowledges a message the peer says it
 *  never consumed) or above the number ever posted gives -EPROTO, unless the
 *  peer's device lost those receive completions and the peer makes them from
 *  this side's record (below).
 *
 * Receive side: every posted receive not consumed, in order, same wr_id and
 * SGEs, is re-posted.
 *
 * --- Clear-to-send (FIFO) writes: why no older entry overwrites a newer one ---
 * NCCL's receiver tells the sender where to put data by RDMA-writing a
 * 64-byte element per receive into the sender's FIFO, slot = id % 256, with
 * idx = id + 1 at offset 40, mostly unsignalled; the sender consumes slot
 * id % 256 when its idx equals its own head + 1, strictly in id order. The
 * receiver cannot know which unsignalled writes landed. Facts used:
 *  F1 the receiver writes slot s for request id + 256 only after request id
 *     completed (fewer than 256 requests are ever outstanding: NCCL's request
 *     table has 256 entries), i.e. after the sender consumed entry id (it sent
 *     the data of id, which it does only after consuming id). So among the
 *     entries for one slot, all but possibly the newest have been consumed.
 *  F2 RC: writes of one QP land in posting order, so a later write to the same
 *     slot on the same QP always lands after an earlier one.
 *  F3 the sender only ever compares idx for equality with its head + 1, so an
 *     entry it already consumed, written again with the same bytes, is inert.
 * The plan re-posts a FIFO write only if (i) no later write to the same slot
 * follows it in the plan (superseded otherwise: the later one is newer by F2,
 * and the earlier one was consumed by F1), and (ii) the peer does not report it
 * landed: after the fence the peer reads the write's destination in its own
 * memory and says whether every element there holds the write's idx (captured
 * at post time by the tag function) or a newer one (repair/model/cts.h); the answer
 * drops the write from the plan (plan_drop; a signalled one is re-posted hollow).
 * (ii) matters when writes for one slot travel on different QPs (NCCL puts
 * entry id on device id % ndevs: with 3 devices, id and id + 256 do) and for
 * inline writes, whose recorded bytes are the old element: a non-inline re-post
 * reads its element when the new NIC sends it, so it may deliver an element
 * ahead of NCCL's own write of it still in flight on a sibling QP, which then
 * lands over the next element with an older one (tests/unit/
 * test_qp_shadow_model.c: a hang in 87 of 3000 seeds with 3 QPs and (i) alone,
 * none with (i) and (ii)). With one QP per slot (ndevs of 1, 2 or 4) (i) alone is
 * safe. Releases that zero a consumed element (NCCL 2.18-2.28) make a consumed
 * write look like one that never landed: with several QPs per slot such a QP
 * cannot be repaired exactly once (r2cc_cts_unsafe()).
 *
 * Every function returns 0 or a negative errno unless it says otherwise.
 */
#ifndef R2CC_REPAIR_QP_SHADOW_H
#define R2CC_REPAIR_QP_SHADOW_H

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct r2cc_shadow_sge {
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
};

/* One recorded send request, as the plan and its callers see it (the ring keeps a
 * compact form of it, one cache line). sge points into the shadow (or the plan). */
struct r2cc_shadow_send {
	uint64_t seq;  /* 1, 2, ... per QP */
	uint64_t msgs; /* receive-consuming requests up to and including this one */
	uint64_t wr_id;
	uint64_t remote_addr;
	uint64_t tag; /* from the shadow's tag function, else 0 */
	uint32_t rkey;
	uint32_t imm_data;   /* as posted (network order) */
	uint32_t byte_len;   /* sum of the SGE lengths */
	uint32_t inline_len; /* bytes held in inline_data when IBV_SEND_INLINE */
	enum ibv_wr_opcode opcode;
	unsigned int send_flags;
	int num_sge;
	struct r2cc_shadow_sge *sge;
	uint8_t *inline_data;
	bool hollow; /* plan only: re-post as a zero-byte signalled WRITE */
};

struct r2cc_shadow_recv {
	uint64_t seq;
	uint64_t wr_id;
	int num_sge;
	struct r2cc_shadow_sge *sge;
};

/*
 * Called while recording a send request on the data path (must be cheap, must
 * not allocate, lock or block); its result is stored as the request's tag. The
 * NCCL integration uses it to capture a clear-to-send write's idx.
 */
typedef uint64_t (*r2cc_qp_shadow_tag_fn)(void *ctx, const struct ibv_send_wr *wr);

struct r2cc_qp_shadow_attr {
	uint32_t max_send_wr, max_recv_wr;   /* the QP's caps as created */
	uint32_t max_send_sge, max_recv_sge; /* 0 is taken as 1 */
	uint32_t max_inline_data;
	bool sq_sig_all;
	r2cc_qp_shadow_tag_fn tag_fn; /* optional */
	void *tag_ctx;
	/* tag_fn is called only for requests of 1 to tag_max_bytes bytes (0: for every
	 * request); the others' tag is 0 (NCCL's data writes: no call on their way) */
	uint32_t tag_max_bytes;
};

/* Counters; the poster writes the first group, the poller the second. */
struct r2cc_qp_shadow_stats {
	uint64_t send_posted, recv_posted, send_bytes_posted;
	uint64_t send_retired, recv_retired, recv_imm;
};

struct r2cc_qp_shadow;

/* QP creation path: allocates everything the data path will ever need. */
int r2cc_qp_shadow_create(const struct r2cc_qp_shadow_attr *attr, struct r2cc_qp_shadow **shadow_p);
void r2cc_qp_shadow_destroy(struct r2cc_qp_shadow *sh);

/*
 * Records the requests of list before bad (bad NULL: all of them). All or
 * nothing: -EOPNOTSUPP (an atomic, or an opcode NCCL never posts: only WRITE,
 * WRITE_WITH_IMM, SEND, SEND_WITH_IMM and READ are understood), -E2BIG (more SGEs than max_*_sge,
 * inline payload over max_inline_data), -ENOSPC (more outstanding requests than the capacity),
 * -EINVAL (a broken shadow or bad arguments: bad not in list). Any error leaves the shadow broken.
 */
int r2cc_qp_shadow_post_send(struct r2cc_qp_shadow *sh, const struct ibv_send_wr *list,
			     const struct ibv_send_wr *bad);
/* The same for a whole list (the post wrapper's), with how many requests and bytes it
 * recorded (wrs, bytes: the wrapper's counters, summed once). */
int r2cc_qp_shadow_post_send_all(struct r2cc_qp_shadow *sh, const struct ibv_send_wr *list,
				 uint64_t *wrs, uint64_t *bytes);
int r2cc_qp_shadow_post_recv(struct r2cc_qp_shadow *sh, const struct ibv_recv_wr *list,
			     const struct ibv_recv_wr *bad);
/*
 * Forgets the requests from bad to the end of list, which must be the last
 * ones recorded (the two-thread protocol above: record all, post, unpost what
 * the provider refused). bad NULL does nothing.
 */
int r2cc_qp_shadow_unpost_send(struct r2cc_qp_shadow *sh, const struct ibv_send_wr *list,
			       const struct ibv_send_wr *bad);
int r2cc_qp_shadow_unpost_recv(struct r2cc_qp_shadow *sh, const struct ibv_recv_wr *list,
			       const struct ibv_recv_wr *bad);

/*
 * A completion of this QP. Error statuses are ignored (0). A success that does
 * not match the oldest outstanding signalled send (wr_id), or arrives with no
 * receive posted, breaks the shadow: -EPROTO. r2cc_qp_shadow_wc() dispatches on
 * wc->opcode (IBV_WC_RECV bit).
 */
int r2cc_qp_shadow_send_completed(struct r2cc_qp_shadow *sh, const struct ibv_wc *wc);
int r2cc_qp_shadow_recv_completed(struct r2cc_qp_shadow *sh, const struct ibv_wc *wc);
int r2cc_qp_shadow_wc(struct r2cc_qp_shadow *sh, const struct ibv_wc *wc);

/* What the peer needs for its plan: successful receive completions so far. */
uint64_t r2cc_qp_shadow_recv_consumed(const struct r2cc_qp_shadow *sh);

/*
 * --- Receive completions the peer's device lost ------------------------------------
 * A send completion says the peer's NIC placed the message and consumed its
 * receive; a device that dies between that acknowledgement and writing the
 * receive completion leaves the peer's count k below this side's retired
 * messages (their data landed, its NCCL never hears of them). The last
 * R2CC_SHADOW_LOST_MAX retired messages are kept (a few stores at retirement)
 * so the peer can make those completions from them: the migration sends them,
 * the peer applies them with r2cc_qp_shadow_recv_lost(), and this side's plan
 * takes k as its retired count when it fell short by no more than that.
 */
#define R2CC_SHADOW_LOST_MAX 8

struct r2cc_shadow_msg {
	uint64_t n;	   /* its number on this QP: 1, 2, ... */
	uint32_t imm_data; /* as posted (network order); 0 for a SEND */
	uint32_t byte_len;
	enum ibv_wr_opcode opcode; /* WRITE_WITH_IMM, SEND or SEND_WITH_IMM */
};

/* Receive-consuming requests retired (quiesced shadow). */
uint64_t r2cc_qp_shadow_msgs_retired(const struct r2cc_qp_shadow *sh);
/* The last retired messages, oldest first, ending at the newest: out has room
 * for R2CC_SHADOW_LOST_MAX; returns how many (fewer when fewer were retired). */
int r2cc_qp_shadow_retired_msgs(const struct r2cc_qp_shadow *sh, struct r2cc_shadow_msg *out);
/*
 * Receiver, quiesced: message m (the next one this QP has not counted, m->n ==
 * recv_consumed + 1) landed without its completion; retires the oldest posted
 * receive for it and fills wc with the completion the NIC would have made.
 * -EPROTO when m is not the next message or no receive is posted for it.
 */
int r2cc_qp_shadow_recv_lost(struct r2cc_qp_shadow *sh, const struct r2cc_shadow_msg *m,
			     uint32_t qp_num, struct ibv_wc *wc);
/* 0, or the negative errno that broke the shadow. */
int r2cc_qp_shadow_error(const struct r2cc_qp_shadow *sh);
/* Outstanding (recorded, not retired) requests. */
uint32_t r2cc_qp_shadow_send_outstanding(const struct r2cc_qp_shadow *sh);
uint32_t r2cc_qp_shadow_recv_outstanding(const struct r2cc_qp_shadow *sh);
/* Signalled send requests recorded and retired so far; readable from any thread
 * (the stall scan: only a signalled request is owed a completion). */
void r2cc_qp_shadow_signalled(const struct r2cc_qp_shadow *sh, uint64_t *posted, uint64_t *retired);
void r2cc_qp_shadow_get_stats(const struct r2cc_qp_shadow *sh, struct r2cc_qp_shadow_stats *st);
/*
 * Bytes of send requests recorded and retired so far, and the largest single
 * request recorded; readable from any thread. posted - retired is what this QP
 * has queued on its NIC: the stall scan weighs a wait against it.
 */
void r2cc_qp_shadow_bytes(const struct r2cc_qp_shadow *sh, uint64_t *posted, uint64_t *retired,
			  uint32_t *max_request);

/* --- repair path (allocates) --------------------------------------------------- */

struct r2cc_qp_shadow_plan_in {
	/* k; when it is below this side's retired messages by no more than
	 * R2CC_SHADOW_LOST_MAX, the peer made the rest from this side's record (above)
	 * only if lost_sent: then k is taken as the retired count, else -EPROTO */
	uint64_t peer_recv_consumed;
	bool lost_sent;
	/*
	 * Optional: true when the peer has consumed what this plain WRITE (after
	 * the boundary) carried, so it must not be written again.
	 */
	bool (*write_consumed)(void *ctx, const struct r2cc_shadow_send *w);
	void *ctx;
};

/* Quiesced shadow: by how much the last tag recorded rose over the one before it
 * (0: fewer than two tags); NCCL's clear-to-send idx rises by the number of fused
 * devices between two writes of one QP. */
uint64_t r2cc_qp_shadow_tag_step(const struct r2cc_qp_shadow *sh);
/* Quiesced shadow: fn for every unretired plain WRITE with a tag, oldest first. */
void r2cc_qp_shadow_tagged_writes(const struct r2cc_qp_shadow *sh,
				  void (*fn)(void *ctx, const struct r2cc_shadow_send *w),
				  void *ctx);

/* A completion to hand to NCCL as if the NIC had produced it. */
struct r2cc_shadow_wc {
	uint64_t wr_id;
	enum ibv_wc_opcode opcode;
	uint32_t byte_len;
	uint64_t seq;
};

struct r2cc_qp_shadow_plan {
	struct r2cc_shadow_wc *synth; /* deliver first, in this order */
	size_t n_synth;
	struct r2cc_shadow_send *send; /* re-post in this order */
	size_t n_send;
	struct r2cc_shadow_recv *recv; /* re-post in this order */
	size_t n_recv;
	bool reordered; /* a re-posted READ precedes a synthesised completion */
	/* report counters */
	uint64_t bytes_reposted;    /* bytes the re-posted sends carry */
	uint64_t bytes_saved;	    /* landed before the failure, not sent again */
	uint64_t bytes_superseded;  /* plain WRITEs overtaken by a later one */
	uint64_t bytes_consumed;    /* plain WRITEs the peer reported consumed */
	uint64_t completions_synth; /* == n_synth */
	uint64_t reads_reposted;
	/* storage */
	struct r2cc_shadow_sge *sge_store;
	uint8_t *inline_store;
};

/* -EPROTO on inconsistent counts, the shadow's error when broken, -ENOMEM. */
int r2cc_qp_shadow_plan_build(const struct r2cc_qp_shadow *sh,
			      const struct r2cc_qp_shadow_plan_in *in,
			      struct r2cc_qp_shadow_plan *plan);
void r2cc_qp_shadow_plan_free(struct r2cc_qp_shadow_plan *plan);

/*
 * The consumed refinement of (b) after the plan was built (the peer's answer came
 * later): every plain WRITE of the plan, not hollow, that consumed() selects is
 * dropped, or re-posted hollow when signalled; bytes_consumed and bytes_reposted
 * follow. Before any of the plan's sends is posted. How many were selected.
 */
size_t r2cc_qp_shadow_plan_drop(struct r2cc_qp_shadow_plan *plan,
				bool (*consumed)(void *ctx, const struct r2cc_shadow_send *w),
				void *ctx);

/*
 * Rewrites every lkey (send and receive SGEs; not inline payloads, which carry
 * none) and every rkey of the plan through the callbacks, which return 0 and
 * the new key, or a negative errno that stops the walk and is returned. Either
 * callback may be NULL (keys left as they are).
 */
typedef int (*r2cc_shadow_key_fn)(void *ctx, uint64_t addr, uint32_t len, uint32_t key,
				  uint32_t *new_key_p);
int r2cc_qp_shadow_plan_translate(struct r2cc_qp_shadow_plan *plan, r2cc_shadow_key_fn lkey_fn,
				  r2cc_shadow_key_fn rkey_fn, void *ctx);

/*
 * Fills a verbs request for plan->send[i] (sges must hold plan->send[i].num_sge
 * entries, at least 1); wr->next is NULL. Inline requests point at the plan's
 * copy of their payload; hollow ones have no SGE.
 */
void r2cc_qp_shadow_plan_send_wr(const struct r2cc_qp_shadow_plan *plan, size_t i,
				 struct ibv_send_wr *wr, struct ibv_sge *sges);
void r2cc_qp_shadow_plan_recv_wr(const struct r2cc_qp_shadow_plan *plan, size_t i,
				 struct ibv_recv_wr *wr, struct ibv_sge *sges);
/* Fills a work completion for plan->synth[i]: IBV_WC_SUCCESS, qp_num given. */
void r2cc_qp_shadow_plan_wc(const struct r2cc_qp_shadow_plan *plan, size_t i, uint32_t qp_num,
			    struct ibv_wc *wc);

#endif
