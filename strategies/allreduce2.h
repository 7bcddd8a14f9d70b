/*
 * R2CC-AllReduce (docs/architecture.md, R2CC-AllReduce): an AllReduce on a communicator with
 * degraded nodes, rewritten into stock NCCL calls so that the degraded nodes
 * move less data.
 *
 * One degraded node:
 *   Stage 1: AllReduce of the main part (first 1-X of the buffer) on the full
 *            communicator, and of the tail (last X) on `healthy` (the ranks not
 *            on the degraded node).
 *   Stage 2: the tail in K chunks; per chunk a Reduce on `aPlusH` (degraded
 *            node's ranks + one helper rank) onto the helper, whose input is
 *            its stage-1 result, then a Broadcast of the chunk from the helper
 *            on the full communicator.
 * Several degraded nodes (up to R2CC_AR2_MAX_DEGRADED), each with a helper of its
 * own on a healthy node (shared only when there are fewer healthy nodes than
 * degraded ones); X is the largest failed share among them:
 *   the main part as above, on the full communicator; the tail in K chunks:
 *   per degraded node j a Reduce on `aPlusH_j` (node j's ranks + helper j) onto
 *   helper j, whose input is its own; then an AllReduce of the chunk on
 *   `healthy` (the helpers now hold every degraded node's part); then a
 *   Broadcast of the chunk from helper j on aPlusH_j. Each degraded node sends
 *   and receives the tail once, as with one degraded node.
 *
 * Three layers, each usable on its own:
 *   - the layout (r2cc_ar2_layout_*, r2cc_ar2_split): pure arithmetic, no I/O;
 *   - the executor (r2cc_ar2_allreduce) written against struct r2cc_ar2_ops,
 *     a table of NCCL / CUDA driver calls that the NCCL intercept fills with
 *     the real functions and the unit tests with a test double;
 *   - per-communicator state (struct r2cc_ar2_comm): sub-communicators made
 *     lazily on the first eligible call, agreed on by every rank, destroyed
 *     with the parent.
 *
 * Threading: NCCL forbids concurrent calls on one communicator, and so does
 * this module: calls on one r2cc_ar2_comm must be serialised by the caller
 * (they are, when they come from the application's calls on that communicator).
 */
#ifndef R2CC_STRATEGIES_ALLREDUCE2_H
#define R2CC_STRATEGIES_ALLREDUCE2_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* NCCL's enums, as integers (nccl.h 2.18-2.28). */
enum {
	R2CC_NCCL_INT8 = 0,
	R2CC_NCCL_UINT8 = 1,
	R2CC_NCCL_INT32 = 2,
	R2CC_NCCL_UINT32 = 3,
	R2CC_NCCL_INT64 = 4,
	R2CC_NCCL_UINT64 = 5,
	R2CC_NCCL_FLOAT16 = 6,
	R2CC_NCCL_FLOAT32 = 7,
	R2CC_NCCL_FLOAT64 = 8,
	R2CC_NCCL_BFLOAT16 = 9,
	R2CC_NCCL_FLOAT8E4M3 = 10,
	R2CC_NCCL_FLOAT8E5M2 = 11,
	R2CC_NCCL_NUM_TYPES = 12,
};
enum {
	R2CC_NCCL_SUM = 0,
	R2CC_NCCL_PROD = 1,
	R2CC_NCCL_MAX = 2,
	R2CC_NCCL_MIN = 3,
	R2CC_NCCL_AVG = 4, /* and PreMulSum ops from 5 on */
};
#define R2CC_NCCL_SPLIT_NOCOLOR (-1) /* NCCL_SPLIT_NOCOLOR */

/* Bytes per element of an NCCL datatype, 0 for an unknown one. */
size_t r2cc_nccl_type_size(int dtype);

#define R2CC_AR2_ALIGN_BYTES  128 /* the tail and every chunk start on this */
#define R2CC_AR2_MAX_CHUNKS   64  /* K is clamped to 1..this */
#define R2CC_AR2_MAX_RANKS    65536
#define R2CC_AR2_MAX_DEGRADED 8 /* more degraded nodes: Balance */

/* ---- Layout: who is where, who helps, how the sub-communicators split. ---- */

/* The failure view of one communicator, identical on every rank. */
struct r2cc_ar2_view {
	int nranks;
	const int *rank_node; /* nranks node ids (any ints; equal = same node) */
	/* Per node, in node-index order (order of first appearance in rank order,
	 * the numbering of R2CC_FAILED_NODE): NICs and failed NICs. */
	const int *node_nics;
	const int *node_failed;
};

struct r2cc_ar2_layout {
	int nranks;
	int nnodes;
	int degraded;	   /* node index with one degraded node, -1 otherwise */
	int ndegraded;	   /* nodes with at least one failed NIC */
	int nics, failed;  /* of the degraded node with the largest failed share */
	int share_node;	   /* that node's index (the first such), -1 without one */
	int helper;	   /* parent rank of the helper with one degraded node, else -1 */
	int healthy_size;  /* ranks not on a degraded node */
	int healthy_nodes; /* nodes without a failed NIC */
	int aplush_size;   /* one degraded node: its ranks + the helper */
	int aplush_root;   /* the helper's rank in aPlusH */
	/* Every degraded node, in node order, when 1 <= ndegraded <=
	 * R2CC_AR2_MAX_DEGRADED and a healthy node exists (ndeg = ndegraded), else
	 * ndeg = 0: node index, NICs, failed NICs, helper (parent rank), size of
	 * aPlusH_j and the helper's rank in it. With one degraded node, entry 0 is
	 * the node above. */
	int ndeg;
	int deg_node[R2CC_AR2_MAX_DEGRADED], deg_nics[R2CC_AR2_MAX_DEGRADED];
	int deg_failed[R2CC_AR2_MAX_DEGRADED], deg_helper[R2CC_AR2_MAX_DEGRADED];
	int deg_size[R2CC_AR2_MAX_DEGRADED], deg_root[R2CC_AR2_MAX_DEGRADED];
	int *rank_node_idx; /* nranks node indices */
	int *node_slot;	    /* nnodes: index into deg_* of a degraded node, else -1 */
};

/* Build the layout; 0, -EINVAL for a malformed view, -ENOMEM. */
int r2cc_ar2_layout_init(struct r2cc_ar2_layout *lay, const struct r2cc_ar2_view *view);
void r2cc_ar2_layout_fini(struct r2cc_ar2_layout *lay);

/* Split colors and keys of rank r (color R2CC_NCCL_SPLIT_NOCOLOR: not a
 * member). Keys are parent ranks, so the sub-communicators keep rank order. */
void r2cc_ar2_healthy_color(const struct r2cc_ar2_layout *lay, int r, int *color, int *key);
void r2cc_ar2_aplush_color(const struct r2cc_ar2_layout *lay, int r, int *color, int *key);
/* aPlusH_j of degraded node j (0 <= j < lay->ndeg); j = 0 is aPlusH. */
void r2cc_ar2_deg_color(const struct r2cc_ar2_layout *lay, int j, int r, int *color, int *key);

/* ---- Split of one buffer. ---- */

struct r2cc_ar2_chunk {
	size_t offset; /* elements from the start of the buffer */
	size_t count;  /* elements, > 0 */
};

struct r2cc_ar2_split {
	size_t main_count;  /* elements [0, main_count) go through stage 1 on the full comm */
	size_t tail_offset; /* == main_count */
	size_t tail_count;  /* elements [tail_offset, count): healthy AllReduce + stage 2 */
	int nchunks;	    /* 0 when tail_count == 0, else 1..K */
	struct r2cc_ar2_chunk chunk[R2CC_AR2_MAX_CHUNKS];
};

/*
 * Split count elements of esize bytes for `failed` of `nics` NICs down and K
 * chunks. The main part is count * (nics - failed) / nics rounded to the
 * nearest multiple of R2CC_AR2_ALIGN_BYTES / esize elements (an element
 * boundary when esize does not divide it), clamped to [0, count]; the tail is
 * the rest. The tail is cut into min(K, aligned units of the tail) chunks of
 * whole units (the last may be short), so no chunk is empty and each starts
 * aligned. failed == 0 gives no tail; failed >= nics gives no main part.
 * Returns 0 or -EINVAL (esize 0, nics < 1, failed < 0).
 */
int r2cc_ar2_split(size_t count, size_t esize, int nics, int failed, int k,
		   struct r2cc_ar2_split *sp);

/* ---- Operations table. ---- */

/*
 * What the executor calls. Handles are opaque (ncclComm_t, CUstream,
 * CUevent). Every function returns 0 on success or a nonzero NCCL result code
 * (the filler maps CUDA driver failures to ncclUnhandledCudaError), which the
 * executor hands back unchanged. ctx is passed through. Everything must call
 * the real NCCL / CUDA functions, never re-enter R2CC's own wrappers.
 *
 * allreduce, reduce, broadcast: the real ncclAllReduce / ncclReduce /
 *   ncclBroadcast, enqueued on `stream` and returning at once. The executor
 *   issues each as a stand-alone call (never inside a group); dtype and op are
 *   NCCL's enum values; root is a rank of `comm`. `stream` is one of the
 *   internal streams, or the user's stream for the single fallback call.
 * comm_split: ncclCommSplit with a blocking config (collective over `comm`;
 *   *newcomm = NULL for NOCOLOR). comm_destroy / comm_abort: ncclCommDestroy /
 *   ncclCommAbort (comm_abort may be NULL). comm_count / comm_user_rank:
 *   ncclCommCount / ncclCommUserRank.
 * stream_create: a non-blocking stream (CU_STREAM_NON_BLOCKING), so that
 *   legacy default-stream work does not join it, on the communicator's device.
 *   event_create: cuEventCreate, CU_EVENT_DISABLE_TIMING is fine.
 *   event_record / stream_wait_event: cuEventRecord / cuStreamWaitEvent.
 * agree: collective over `comm`, host-blocking, called once per setup by
 *   every rank at the same point: *all_ok = 1 iff every rank passed ok = 1.
 *   It must not use the user's stream (e.g. a one-int ncclMin AllReduce on the
 *   parent on a private stream, then a synchronise; or the control plane). It
 *   must fail (nonzero) on all ranks or on none: a rank that reads its failure
 *   as "not ok" while the others proceed would leave them waiting.
 */
struct r2cc_ar2_ops {
	void *ctx;
	int (*allreduce)(void *ctx, const void *sendbuf, void *recvbuf, size_t count, int dtype,
			 int op, void *comm, void *stream);
	int (*reduce)(void *ctx, const void *sendbuf, void *recvbuf, size_t count, int dtype,
		      int op, int root, void *comm, void *stream);
	int (*broadcast)(void *ctx, const void *sendbuf, void *recvbuf, size_t count, int dtype,
			 int root, void *comm, void *stream);
	int (*comm_split)(void *ctx, void *comm, int color, int key, void **newcomm);
	int (*comm_destroy)(void *ctx, void *comm);
	int (*comm_abort)(void *ctx, void *comm); /* may be NULL: comm_destroy is used */
	/* may be NULL: sub-communicator errors are then not reported */
	int (*comm_async_error)(void *ctx, void *comm, int *err);
	int (*comm_count)(void *ctx, void *comm, int *count);
	int (*comm_user_rank)(void *ctx, void *comm, int *rank);
	int (*stream_create)(void *ctx, void **stream);
	int (*stream_destroy)(void *ctx, void *stream);
	int (*event_create)(void *ctx, void **event);
	int (*event_record)(void *ctx, void *event, void *stream);
	int (*event_destroy)(void *ctx, void *event);
	int (*stream_wait_event)(void *ctx, void *stream, void *event);
	int (*agree)(void *ctx, void *comm, int ok, int *all_ok);
};

/* ---- Per-communicator state and the executor. ---- */

struct r2cc_ar2_cfg {
	int chunks;	    /* K, R2CC_AR_STAGE2_CHUNKS; clamped to 1..R2CC_AR2_MAX_CHUNKS */
	int schedule;	    /* R2CC_AR_SCHEDULE 0..3 (others: 0) */
	uint64_t min_bytes; /* R2CC_AR_MIN_BYTES */
};

/* Flags of one call, from the caller's knowledge of the calling context. */
#define R2CC_AR2_IN_GROUP    0x1u /* between the user's ncclGroupStart and End */
#define R2CC_AR2_CAPTURING   0x2u /* the user's stream is being captured */
#define R2CC_AR2_NONBLOCKING 0x4u /* the communicator is non-blocking */

/* Why a call ran as the plain AllReduce (Balance); R2CC_AR2_RAN when it did not. */
enum r2cc_ar2_reason {
	R2CC_AR2_RAN = 0,
	R2CC_AR2_FB_SMALL,	 /* below R2CC_AR_MIN_BYTES */
	R2CC_AR2_FB_OP,		 /* Avg or PreMulSum */
	R2CC_AR2_FB_DTYPE,	 /* unknown datatype */
	R2CC_AR2_FB_GROUP,	 /* inside a user group */
	R2CC_AR2_FB_CAPTURE,	 /* CUDA graph capture before setup */
	R2CC_AR2_FB_NONBLOCKING, /* non-blocking communicator */
	R2CC_AR2_FB_ONE_NODE,	 /* fewer than two nodes */
	R2CC_AR2_FB_NO_DEGRADED, /* no node has a failed NIC */
	R2CC_AR2_FB_MULTI,	 /* more than R2CC_AR2_MAX_DEGRADED degraded nodes */
	R2CC_AR2_FB_NO_NIC,	 /* a degraded node has no NIC left */
	R2CC_AR2_FB_NO_HEALTHY,	 /* every node is degraded: no helper */
	R2CC_AR2_FB_SETUP,	 /* sub-communicator setup failed on some rank */
	R2CC_AR2_NREASONS
};
const char *r2cc_ar2_reason_str(enum r2cc_ar2_reason r);

struct r2cc_ar2_comm;

/*
 * Create the state of parent communicator `parent` (no NCCL call besides
 * comm_count / comm_user_rank, which must match view->nranks). ops must stay
 * valid until r2cc_ar2_comm_destroy. Returns 0, -EINVAL (bad view or
 * mismatch), -ENOMEM, or the nonzero code of a failing query negated.
 */
int r2cc_ar2_comm_create(const struct r2cc_ar2_ops *ops, void *parent,
			 const struct r2cc_ar2_cfg *cfg, const struct r2cc_ar2_view *view,
			 struct r2cc_ar2_comm **out);

/*
 * A new failure view (after a hot repair). Must be called on every rank of
 * the parent between the same two collectives (the repair layer's agreed
 * switch point). Sub-communicators are kept when the degraded nodes and their
 * helpers stay, and re-made lazily otherwise: the old ones are destroyed, or,
 * when a CUDA graph captured a call that used them, kept until
 * r2cc_ar2_comm_destroy (a replay of that graph still runs on them; its
 * schedule is right for any view, only its speed was chosen for the old one).
 * 0 or negative errno; on error the old view stays.
 */
int r2cc_ar2_comm_set_view(struct r2cc_ar2_comm *c, const struct r2cc_ar2_view *view);

/*
 * Destroy the state: the sub-communicators (comm_destroy, or comm_abort when
 * abort is true: the parent is being aborted), internal events and streams.
 * Call before the parent's ncclCommDestroy / ncclCommAbort. NULL is fine.
 */
void r2cc_ar2_comm_destroy(struct r2cc_ar2_comm *c, bool abort);
/* The first asynchronous error (an ncclResult_t) of the sub-communicators, or 0. */
int r2cc_ar2_comm_async_error(const struct r2cc_ar2_comm *c);

/* Pure eligibility check of one call (no setup state involved). A call during
 * CUDA graph capture is eligible here; r2cc_ar2_allreduce runs it only when the
 * sub-communicators already exist (setup is collective and blocking, which
 * capture forbids), else R2CC_AR2_FB_CAPTURE. */
enum r2cc_ar2_reason r2cc_ar2_check(const struct r2cc_ar2_layout *lay,
				    const struct r2cc_ar2_cfg *cfg, size_t count, int dtype, int op,
				    unsigned flags);

/*
 * The AllReduce of `count` elements on the parent, enqueued on `stream` (the
 * user's stream) exactly like ncclAllReduce: work enqueued on `stream` before
 * the call is seen by it, work enqueued after it sees the result. sendbuf ==
 * recvbuf (in place) is allowed. When the call is not eligible, or setup
 * fails on any rank, it issues ops->allreduce(sendbuf, recvbuf, count, dtype,
 * op, parent, stream) once instead, warns once per reason, and reports why in
 * *reason_p (may be NULL). Returns 0 or the first nonzero op code (an error
 * after the first collective was issued: streams are still joined to
 * `stream` as far as possible).
 */
int r2cc_ar2_allreduce(struct r2cc_ar2_comm *c, const void *sendbuf, void *recvbuf, size_t count,
		       int dtype, int op, void *stream, unsigned flags,
		       enum r2cc_ar2_reason *reason_p);

/* Calls that ran R2CC-AllReduce during CUDA graph capture, ever. */
unsigned long r2cc_ar2_comm_captured(const struct r2cc_ar2_comm *c);

/* For tests and reports: the current layout; NULL until created. */
const struct r2cc_ar2_layout *r2cc_ar2_comm_layout(const struct r2cc_ar2_comm *c);
/* Whether the sub-communicators are up (true) or setup has failed for good. */
bool r2cc_ar2_comm_ready(const struct r2cc_ar2_comm *c);

#endif
