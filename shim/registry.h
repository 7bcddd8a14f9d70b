/*
 * Registries of the verbs objects NCCL creates through R2CC's wrappers: NICs
 * (one per physical device, shared by every context opened on it), contexts
 * (with the original data-path ops R2CC replaced), PDs, MRs, CQs and QPs.
 * Hot repair (repair/) and the reports read them; the post/poll wrappers
 * reach a QP's or CQ's record with one lock-free lookup and count in it without a
 * locked add (struct r2cc_fold: folded into the per-NIC counters every few
 * milliseconds).
 *
 * Lock order: registry lock (creation/destruction of any object) before a
 * map's own writer lock. Nothing in here calls into NCCL or verbs with a lock
 * held.
 */
#ifndef R2CC_SHIM_REGISTRY_H
#define R2CC_SHIM_REGISTRY_H

#include "include/r2cc.h"
#include "shim/common.h"
#include "shim/map.h"

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define R2CC_MAX_NICS 64

typedef int (*r2cc_post_send_fn)(struct ibv_qp *, struct ibv_send_wr *, struct ibv_send_wr **);
typedef int (*r2cc_post_recv_fn)(struct ibv_qp *, struct ibv_recv_wr *, struct ibv_recv_wr **);
typedef int (*r2cc_poll_cq_fn)(struct ibv_cq *, int, struct ibv_wc *);

struct r2cc_nic_counters {
	uint64_t tx_bytes, tx_wrs; /* posted sends */
	uint64_t rx_bytes, rx_wrs; /* polled receive completions */
	uint64_t tx_cqes;	   /* polled send completions */
	uint64_t err_cqes;	   /* polled completions with an error status */
	uint64_t recv_posted;	   /* posted receive WRs */
};

#define R2CC_GID_CACHE 32

struct r2cc_nic {
	int index; /* order of first open, stable for the process */
	char name[R2CC_NIC_NAME_MAX];
	uint8_t port;
	int port_state; /* enum ibv_port_state, last queried */
	int link_layer;
	uint16_t lid;
	int active_mtu;
	int speed_gbps;
	union ibv_gid gid;
	bool gid_known;
	int state;    /* enum r2cc_nic_state */
	int selftest; /* hot repair: a self-test of this NIC is running */
	/* with a GRH (RoCE): the GID index and traffic class of NCCL's QPs on this NIC,
	 * from their RTR, for hot repair's self-test QPs; roce_known (atomic) once seen */
	uint8_t roce_sgid_index, roce_tclass;
	int roce_known;
	/* the GID entries NCCL read (indices below R2CC_GID_CACHE), so that a QP's
	 * identity is known when its device dies before its RTR can be queried */
	union ibv_gid gids[R2CC_GID_CACHE];
	uint32_t gids_known; /* atomic: bit i, gids[i] is valid */
	int failbacks;	     /* atomic: hot repair brought it back this often */
	struct r2cc_nic_counters cnt;
};

struct r2cc_ctx {
	struct ibv_context *ctx;
	struct r2cc_nic *nic;
	r2cc_post_send_fn post_send;
	r2cc_post_recv_fn post_recv;
	r2cc_poll_cq_fn poll_cq;
	/* The provider's three while R2CC_DRILL's filters stand in the three above
	 * (repair/drill.c); NULL until then. */
	r2cc_post_send_fn wire_post_send;
	r2cc_post_recv_fn wire_post_recv;
	r2cc_poll_cq_fn wire_poll_cq;
	/* The extended context's ops that verbs.h's inlines call in place of a symbol
	 * (ibv_query_port, ibv_create_qp_ex), as the provider set them; NULL where it
	 * has none. */
	int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *, size_t);
	struct ibv_qp *(*create_qp_ex)(struct ibv_context *, struct ibv_qp_init_attr_ex *);
};

struct r2cc_pd {
	struct ibv_pd *pd;
	struct r2cc_ctx *ctx;
};

struct r2cc_mr {
	struct ibv_mr *mr;
	struct r2cc_nic *nic;
	uint64_t addr, len;
	uint32_t lkey, rkey;
	int access;
	/* atomic: [addr, addr+len) is host memory this process can read (a small VA
	 * registration, probed when it was made): hot repair reads NCCL's
	 * clear-to-send elements there (repair/landed.c) */
	int host_ok;
};

/* Data-path gate of a QP or CQ (repair/engine.h): users in the low bits, and
 * R2CC_GATE_SLOW once hot repair owns the object's data path. */
#define R2CC_GATE_SLOW 0x80000000u

struct r2cc_vcq; /* repair/vcq.c: the CQ's virtual side after a failure */

/*
 * A CQ's gate, and a QP's, has a second door for the one thread that polls the CQ
 * or posts to the QP (NCCL's proxy thread, as a rule): that thread marks itself
 * inside with a plain store and reads the gate word, no atomic read-modify-write at
 * all (two of those were most of the wrapper's cost on an empty poll). The closer
 * (r2cc_cq_gate_close()) pays instead, once per repair: after setting
 * R2CC_GATE_SLOW it runs membarrier(2), which orders every running thread's
 * accesses, so either the user sees the flag or the closer sees the user inside (the
 * asymmetric fence of user-space RCU). The first thread to come owns the door; any
 * other thread takes the counting door. Without membarrier (an old kernel, a
 * seccomp filter) nobody owns it.
 */
struct r2cc_cq_gate {
	uint32_t n;	   /* counting door: users | R2CC_GATE_SLOW */
	uint32_t solo_in;  /* 1 while the owner is inside */
	const void *owner; /* r2cc_self() of the owning thread, NULL: none yet */
};

/*
 * What the data path counts of one QP or CQ without a locked add: its owner-door
 * thread (the only writer) adds plain stores to three counts in the record's first
 * line, and r2cc_counters_fold() adds what is new in them to the NIC's counters, the
 * ones readers see (r2cc_nic_stats(), the stats page). Posts and polls through the
 * counting door, and every one while no thread folds (r2cc_fold_live false), add to
 * the NIC's counters at once, atomically. So the counters are exact, and the stats
 * page trails by one fold period (the repair thread's 5 ms scan; longer while that
 * thread works out a repair).
 */
struct r2cc_fold {
	uint64_t *own;			 /* the record's three counts */
	uint64_t *to[3];		 /* the NIC's counters they go to */
	uint64_t done[3];		 /* of own[], added to to[] so far */
	struct r2cc_fold **pprev, *next; /* every record's, under the fold lock */
};

extern bool r2cc_fold_live;

/* Adds what is new in every record's counts to its NIC's counters. */
void r2cc_counters_fold(void);
/* A thread folds every few milliseconds from now on (true), or none does (false:
 * what was counted is folded first). */
void r2cc_counters_folding(bool live);

struct r2cc_cq {
	struct ibv_cq *cq;
	struct r2cc_ctx *ctx;
	struct r2cc_cq_gate gate;
	struct r2cc_vcq *v; /* made with the CQ when hot repair is on */
	/* the owner's counts of polled completions (struct r2cc_fold), in this order */
	uint64_t rx_wrs, rx_bytes, tx_cqes;
	int depth;
	struct r2cc_fold fold;
};

struct r2cc_qp_shadow;
struct r2cc_rqp;

struct r2cc_qp_peer {
	uint32_t qpn;
	uint16_t lid;
	bool has_grh;
	union ibv_gid gid;
	uint8_t port;
	union ibv_gid
	    sgid; /* with a GRH: this end's GID (the RTR's sgid_index), as the peer sees it */
};

struct r2cc_cts_layout; /* repair/model/cts.h */

struct r2cc_qp {
	/* The data path's, first (one cache line: a post reads and writes no other of
	 * this record) */
	struct r2cc_ctx *ctx;
	struct r2cc_cq_gate gate;      /* its posts' gate (the CQ's kind of gate) */
	struct r2cc_qp_shadow *shadow; /* hot repair on: what is posted and not retired */
	/* the owner's counts of posted sends and receives (struct r2cc_fold), in this
	 * order; other_tx and other_rx count the rest (r2cc_qp_sent(), r2cc_qp_received()) */
	uint64_t tx_wrs, recv_wrs, tx_bytes;
	struct r2cc_rqp *rep; /* hot repair's record of this QP */
	struct ibv_qp *qp;
	uint64_t other_tx, other_rx; /* atomic */
	struct r2cc_fold fold;
	struct r2cc_cq *send_cq, *recv_cq;
	uint32_t qpn;
	int state; /* enum ibv_qp_state, as last set through ibv_modify_qp */
	int qp_type;
	uint32_t max_send_wr, max_recv_wr;
	struct r2cc_qp_peer peer; /* valid from RTR on */
	/* NCCL's path as it set it (INIT's pkey, the RTR's address vector): hot repair
	 * gives a new path of this QP the same, from its own NIC's matching GID */
	struct r2cc_qp_path {
		uint16_t pkey_index;
		uint8_t sl;
		uint8_t sgid_index, hop_limit, traffic_class; /* with a GRH */
		uint32_t flow_label;
		int sgid_type; /* IBV_GID_TYPE_* of the source GID, -1 unknown */
	} path;
	uint8_t timeout, retry_cnt, rnr_retry;
	uint8_t path_mtu, port_num;
	int access;	       /* qp_access_flags as set at INIT */
	struct ibv_qp_cap cap; /* as the provider returned it */
	bool sq_sig_all;
	/* A stand-in (the dead device refused NCCL the QP): qp is R2CC's, in RESET on
	 * a sibling NIC, with this CQ of its own; ctx is still the dead NIC's */
	struct ibv_cq *stand_in_cq;
	/* The transport that made it (intercept/transport.h): the clear-to-send layout
	 * it writes (repair/model/cts.h; NULL: the loaded NCCL's own, unless cts_unknown),
	 * and its name for logs and reports. */
	const struct r2cc_cts_layout *cts;
	bool cts_unknown;
	const char *transport;
};

/* Whether anything was posted to q, sends or receives: its direction. */
static inline bool r2cc_qp_sent(const struct r2cc_qp *q)
{
	return __atomic_load_n(&q->tx_wrs, __ATOMIC_RELAXED) ||
	       __atomic_load_n(&q->other_tx, __ATOMIC_RELAXED);
}
static inline bool r2cc_qp_received(const struct r2cc_qp *q)
{
	return __atomic_load_n(&q->recv_wrs, __ATOMIC_RELAXED) ||
	       __atomic_load_n(&q->other_rx, __ATOMIC_RELAXED);
}

/* Initialise once (idempotent); -ENOMEM when the tables cannot be made. */
int r2cc_registry_init(void);

/* A GID NCCL read of nic (kept for indices below R2CC_GID_CACHE), and the lookup. */
void r2cc_nic_gid_cache(struct r2cc_nic *nic, int index, const union ibv_gid *gid);
bool r2cc_nic_gid_cached(const struct r2cc_nic *nic, int index, union ibv_gid *gid);

/* NICs: found or created by name. */
struct r2cc_nic *r2cc_nic_get(const char *name);
struct r2cc_nic *r2cc_nic_by_index(int index);
int r2cc_nic_count(void);

/* Contexts. */
struct r2cc_ctx *r2cc_ctx_add(struct ibv_context *ctx, struct r2cc_nic *nic);
struct r2cc_ctx *r2cc_ctx_find(const struct ibv_context *ctx);
void r2cc_ctx_remove(struct ibv_context *ctx);

/* PDs. */
struct r2cc_pd *r2cc_pd_add(struct ibv_pd *pd, struct r2cc_ctx *ctx);
struct r2cc_pd *r2cc_pd_find(const struct ibv_pd *pd);
void r2cc_pd_remove(struct ibv_pd *pd);

/* MRs: by address range (on a NIC, or on any NIC), by lkey, by rkey. */
struct r2cc_mr *r2cc_mr_add(struct ibv_mr *mr, struct r2cc_nic *nic, uint64_t addr, uint64_t len,
			    uint32_t lkey, uint32_t rkey, int access);
struct r2cc_mr *r2cc_mr_find(const struct ibv_mr *mr);
/* The registration on nic (NULL: any) that covers [addr, addr+len). */
struct r2cc_mr *r2cc_mr_by_addr(const struct r2cc_nic *nic, uint64_t addr, uint64_t len);
struct r2cc_mr *r2cc_mr_by_lkey(const struct r2cc_nic *nic, uint32_t lkey);
struct r2cc_mr *r2cc_mr_by_rkey(const struct r2cc_nic *nic, uint32_t rkey);
void r2cc_mr_remove(struct ibv_mr *mr);
size_t r2cc_mr_count(void);

/* CQs. */
struct r2cc_cq *r2cc_cq_add(struct ibv_cq *cq, struct r2cc_ctx *ctx, int depth);
void r2cc_cq_remove(struct ibv_cq *cq);

/* QPs: by object and by (NIC, QP number). */
struct r2cc_qp *r2cc_qp_add(struct ibv_qp *qp, struct r2cc_ctx *ctx, struct r2cc_cq *send_cq,
			    struct r2cc_cq *recv_cq, uint32_t qpn, int qp_type);
struct r2cc_qp *r2cc_qp_by_num(const struct r2cc_nic *nic, uint32_t qpn);
/* The same through the calling thread's cache (the poll wrapper's, per completion). */
struct r2cc_qp *r2cc_qp_by_num_hot(const struct r2cc_nic *nic, uint32_t qpn);
void r2cc_qp_remove(struct ibv_qp *qp);
/* Out of the lookups without being freed (its owner frees it later), and the free. */
struct r2cc_qp *r2cc_qp_unlink(struct ibv_qp *qp);
void r2cc_qp_free(struct r2cc_qp *q);
size_t r2cc_qp_count(void);

/*
 * Declared failures (shim/failspec.h): the NICs of this process's own node
 * (node index node_index, node key key: NCCL_HOSTID or the host name) that spec
 * names get the R2CC_NIC_DECLARED state. Returns how many.
 */
struct r2cc_failspec;
int r2cc_nic_mark_declared(const struct r2cc_failspec *spec, int node_index, const char *key);

/* Hot-path lookups (lock-free). */
extern struct r2cc_map r2cc_qp_map, r2cc_cq_map, r2cc_ctx_map;

static inline struct r2cc_qp *r2cc_qp_find(const struct ibv_qp *qp)
{
	return (struct r2cc_qp *)r2cc_map_get(&r2cc_qp_map, (uint64_t)(uintptr_t)qp);
}

static inline struct r2cc_cq *r2cc_cq_find(const struct ibv_cq *cq)
{
	return (struct r2cc_cq *)r2cc_map_get(&r2cc_cq_map, (uint64_t)(uintptr_t)cq);
}

/* The same for the data path's wrappers, through the calling thread's cache of its
 * last lookups (shim/map.h): a few loads while nothing was removed. */
extern __thread struct r2cc_map_cache r2cc_qp_cache __attribute__((tls_model("initial-exec")));
extern __thread struct r2cc_map_cache r2cc_cq_cache __attribute__((tls_model("initial-exec")));
extern __thread struct r2cc_map_cache r2cc_qpnum_cache __attribute__((tls_model("initial-exec")));

static inline struct r2cc_qp *r2cc_qp_find_hot(const struct ibv_qp *qp)
{
	return (struct r2cc_qp *)r2cc_map_get_cached(&r2cc_qp_map, &r2cc_qp_cache,
						     (uint64_t)(uintptr_t)qp);
}

/* The calling thread's cache alone: NULL on a miss (then r2cc_qp_find_hot). */
static inline struct r2cc_qp *r2cc_qp_peek_hot(const struct ibv_qp *qp)
{
	return (struct r2cc_qp *)r2cc_map_peek_cached(&r2cc_qp_map, &r2cc_qp_cache,
						      (uint64_t)(uintptr_t)qp);
}

static inline struct r2cc_cq *r2cc_cq_find_hot(const struct ibv_cq *cq)
{
	return (struct r2cc_cq *)r2cc_map_get_cached(&r2cc_cq_map, &r2cc_cq_cache,
						     (uint64_t)(uintptr_t)cq);
}

/* The calling thread's cache alone: NULL on a miss (then r2cc_cq_find_hot). */
static inline struct r2cc_cq *r2cc_cq_peek_hot(const struct ibv_cq *cq)
{
	return (struct r2cc_cq *)r2cc_map_peek_cached(&r2cc_cq_map, &r2cc_cq_cache,
						      (uint64_t)(uintptr_t)cq);
}

/* Enter an object's fast data path: false once hot repair owns it (then take
 * the slow path, without exiting). Never blocks. */
static inline bool r2cc_gate_enter(uint32_t *g)
{
	if (!(__atomic_add_fetch(g, 1, __ATOMIC_SEQ_CST) & R2CC_GATE_SLOW))
		return true;
	__atomic_sub_fetch(g, 1, __ATOMIC_RELEASE);
	return false;
}

static inline void r2cc_gate_exit(uint32_t *g)
{
	__atomic_sub_fetch(g, 1, __ATOMIC_RELEASE);
}

/* This thread's identity for the CQ gate's owner door: the address of a
 * thread-local byte, read without a call (initial-exec TLS). */
extern __thread char r2cc_self_tag __attribute__((tls_model("initial-exec")));
static inline const void *r2cc_self(void)
{
	return &r2cc_self_tag;
}

/* Whether membarrier(2) can order the owner door (shim/registry.c). */
extern bool r2cc_cq_gate_solo_ok;

enum { R2CC_DOOR_SLOW = 0, R2CC_DOOR_SHARED = 1, R2CC_DOOR_SOLO = 2 };

/* The owner door alone: true when the calling thread owns the gate and came in (leave
 * with r2cc_cq_gate_solo_exit); false for anything else (nothing stays marked), which
 * then takes r2cc_cq_gate_enter. The wrappers' fast path: fewer registers live than
 * with the whole of r2cc_cq_gate_enter. */
static inline bool r2cc_cq_gate_solo_enter(struct r2cc_cq_gate *g)
{
	if (r2cc_unlikely(__atomic_load_n(&g->owner, __ATOMIC_RELAXED) != r2cc_self()))
		return false;
	__atomic_store_n(&g->solo_in, 1, __ATOMIC_RELAXED);
	/* Only the compiler is kept from moving the store past the load: the closer's
	 * membarrier(2) orders the CPU (r2cc_cq_gate_close). */
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	if (r2cc_likely(!(__atomic_load_n(&g->n, __ATOMIC_ACQUIRE) & R2CC_GATE_SLOW)))
		return true;
	__atomic_store_n(&g->solo_in, 0, __ATOMIC_RELEASE);
	return false;
}

static inline void r2cc_cq_gate_solo_exit(struct r2cc_cq_gate *g)
{
	__atomic_store_n(&g->solo_in, 0, __ATOMIC_RELEASE);
}

/* Enter a CQ's fast path: R2CC_DOOR_SLOW once hot repair owns it (take the slow
 * path, without exiting), else the door to pass to r2cc_cq_gate_exit(). The
 * first poller claims the owner door and comes in through the counting one that
 * time. Never blocks. */
static inline int r2cc_cq_gate_enter(struct r2cc_cq_gate *g)
{
	if (r2cc_likely(r2cc_cq_gate_solo_enter(g)))
		return R2CC_DOOR_SOLO;
	const void *me = r2cc_self();
	const void *owner = __atomic_load_n(&g->owner, __ATOMIC_RELAXED);
	if (owner == me) /* the owner, and hot repair has the gate */
		return R2CC_DOOR_SLOW;
	if (r2cc_unlikely(!owner) && r2cc_cq_gate_solo_ok) {
		const void *none = NULL;
		__atomic_compare_exchange_n(&g->owner, &none, me, false, __ATOMIC_SEQ_CST,
					    __ATOMIC_RELAXED);
	}
	return r2cc_gate_enter(&g->n) ? R2CC_DOOR_SHARED : R2CC_DOOR_SLOW;
}

static inline void r2cc_cq_gate_exit(struct r2cc_cq_gate *g, int door)
{
	if (door == R2CC_DOOR_SOLO)
		r2cc_cq_gate_solo_exit(g);
	else
		r2cc_gate_exit(&g->n);
}

/* Hand a CQ's (or QP's) data path to hot repair: R2CC_GATE_SLOW set, and back once
 * no user is inside through either door (yields while one is; repair thread only).
 * r2cc_cq_gates_close() closes two (a QP's and its CQ's) with one membarrier(2). */
void r2cc_cq_gate_close(struct r2cc_cq_gate *g);
void r2cc_cq_gates_close(struct r2cc_cq_gate *a, struct r2cc_cq_gate *b);

/* Called once at start-up: registers the process for membarrier(2) and sets
 * r2cc_cq_gate_solo_ok where that works. */
void r2cc_cq_gate_init(void);

static inline void r2cc_counter_add(uint64_t *c, uint64_t v)
{
	__atomic_fetch_add(c, v, __ATOMIC_RELAXED);
}

/* Whether the data path may count into the record's own counts: the owner door, and
 * a thread folds them. */
static inline bool r2cc_counts_own(int door)
{
	return door == R2CC_DOOR_SOLO && __atomic_load_n(&r2cc_fold_live, __ATOMIC_RELAXED);
}

#endif
