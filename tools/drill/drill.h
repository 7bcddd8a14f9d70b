/*
 * r2cc-verbs-drill: a traffic generator that talks verbs the way NCCL 2.28's net_ib
 * transport does, over the software RDMA device, with and without libr2cc.so, while
 * NIC faults are injected. The parent (main.c and the files parent.h lists) runs
 * scenarios and spawns one worker process per emulated node by exec'ing itself; a
 * worker (worker.c) loads libibverbs through dlopen/dlvsym (verbs.c), exchanges
 * endpoints through files (bootstrap.c) and moves checked messages (pattern.c).
 * Parent and workers share one small status file.
 */
#ifndef R2CC_DRILL_H
#define R2CC_DRILL_H

#include <infiniband/verbs.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define DRILL_MAX_PROCS	    16
#define DRILL_FULL_PROCS    4 /* above this many workers the defaults scale down (parse.c) */
#define DRILL_MANY_MAX_SIZE (64u << 10) /* --max-size then */
#define DRILL_MAX_NICS	    4		/* NCCL_IB_MAX_DEVS_PER_NIC: rkeys per FIFO element */
#define DRILL_MAX_QPN	    8 /* --qps: QPs per NIC per connection (NCCL_IB_QPS_PER_CONNECTION) */
#define DRILL_MAX_QPS	    (DRILL_MAX_NICS * DRILL_MAX_QPN)
#define DRILL_SLOTS	    256 /* MAX_REQUESTS, the most of any --nccl-version */
#define DRILL_MAX_RECVS	    8	/* NCCL_NET_IB_MAX_RECVS: FIFO elements per slot */
#define DRILL_MAX_WINDOW    64
#define DRILL_ERR_LEN	    320

enum drill_fault {
	DRILL_FAULT_NONE,
	DRILL_FAULT_DOWN,
	DRILL_FAULT_BLACKHOLE,
	DRILL_FAULT_FLAP,
	DRILL_FAULT_SLOW,
	DRILL_FAULT_KILL, /* not a NIC fault: SIGKILL the node's worker (--kill-peer) */
	/* Only by name (not in --fault all): softverbs-ctl's kinds of the same names. */
	DRILL_FAULT_ACKLOSS,
	DRILL_FAULT_BLACKHOLE_TX,
	DRILL_FAULT_BLACKHOLE_RX,
	DRILL_FAULT_FATAL,
	DRILL_FAULT_JITTER,
	DRILL_FAULT_KINDS,
};

/* When the fault comes (--fault-phase). */
enum drill_fault_phase {
	DRILL_AT_TRAFFIC, /* when a seed-drawn fraction of the messages was delivered */
	DRILL_AT_CONNECT, /* once every endpoint file is there, before any traffic */
};

/* Where the workers hold, with --fault-phase connect, until the fault is in. */
enum drill_hold {
	DRILL_HOLD_NONE,
	DRILL_HOLD_INIT, /* endpoints exchanged, QPs in INIT: before RTR */
	DRILL_HOLD_RTS,	 /* QPs brought to RTS meanwhile: before the ready mark */
};

/* What a scenario must end with (--expect). */
enum drill_expect {
	DRILL_EXPECT_PASS,	/* every message exactly once, no error */
	DRILL_EXPECT_CLEAN,	/* an error reaches the application in bounded time, no hang */
	DRILL_EXPECT_NO_REPAIR, /* as PASS, and no incident in any report (declared moves aside) */
};

/* --link roce: the lossless class of the fabric, and NCCL_IB_TC's default there. */
#define DRILL_ROCE_TC "106"

/* Settings shared by the parent and the workers (workers get them on the command line). */
struct drill_opts {
	int procs;
	int nics;
	int qps;	  /* --qps: QPs per NIC per connection */
	int per_node;	  /* --per-node: processes sharing each emulated node's NICs */
	double gbps;	  /* --gbps: every NIC shaped to this rate (0: 100 Gb/s, unshaped) */
	int declare_node; /* --declare NODE:NIC (R2CC_FAILED_NODE/HCA); -1 none */
	int declare_nic;
	int fault; /* enum drill_fault, or -1 = all kinds */
	int seeds;
	int first_seed;
	int messages;
	int window;
	uint64_t max_size;
	double timeout_s;
	double time_scale;
	int qp_timeout; /* IB timeout exponent (NCCL_IB_TIMEOUT) */
	int retry_cnt;	/* NCCL_IB_RETRY_CNT */
	bool preload;
	bool keep;
	bool verbose;
	bool selftest_corrupt;
	bool nccl_stub;	    /* form a communicator through build/tests/ncclstub/libnccl.so.2 */
	bool flush;	    /* --flush: NCCL's GPU flush, a loopback RDMA READ per NIC */
	bool no_fusion;	    /* --no-fusion: each connection on one NIC (NCCL_NET_MERGE_LEVEL=LOC) */
	bool fresh_mr;	    /* --fresh-mr: receivers register their rings anew, 3/4 in */
	bool expect_landed; /* --expect-landed: some repair found a clear-to-send write landed */
	bool churn;	    /* --churn: QPs created and destroyed beside the traffic */
	int mlx5dv;	    /* --mlx5dv: data QPs by mlx5dv_create_qp (1), out of order (2) */
	/* --net-plugin, --nccl-net: NCCL_NET_PLUGIN and NCCL_NET for the workers (what the
	 * NCCL test double loads); --expect-unprotected: a word every worker's report
	 * must say it is not protected for */
	const char *net_plugin, *nccl_net, *expect_unprotected;
	bool roce;		 /* --link roce: RoCE v2 soft NICs, a subnet per rail */
	double detect_within_ms; /* --detect-within: 0 none */
	double
	    restore_ms;	 /* --restore: the faulted NIC back this long after the fault; < 0 never */
	int failback_ms; /* --failback-ms: R2CC_FAILBACK_MS for the workers with --restore */
	int flap_ms;	 /* --flap-ms: the flap's period (0: from the QP timeout) */
	const char *nccl_lib; /* worker: the NCCL library to form a communicator with */
	int fault_phase;      /* enum drill_fault_phase */
	bool fault_all_nics;  /* --fault-nics all: the fault on every NIC of the node */
	double second_ms;     /* --second-fault: ms after the first, on another NIC; < 0 none */
	int expect;	      /* enum drill_expect */
	double bound_s;	      /* --bound: the first application error within this of the fault */
	int hold;	      /* worker: enum drill_hold */
	/* --inject: the fault from R2CC_DRILL (the library's own drill) instead of
	 * softverbs-ctl; --drill-plan: that plan, verbatim, instead of the drawn one;
	 * --expect-drill-problem: a word some report's unapplied step must give as why;
	 * --summary: one compare: line per scenario into this file (- stdout) */
	bool inject;
	const char *drill_plan, *expect_drill_problem, *summary;
	/* --inject-at own: each worker's collective at its own share of its messages */
	bool inject_own;
	/* worker: ncclAllReduce once this many messages arrived, its own or (coll_sum)
	 * all workers' together */
	uint64_t coll_at;
	bool coll_sum;
	const struct drill_pattern *pattern; /* --nccl-version */
	/* worker only */
	bool worker;
	int rank;
	uint64_t seed;
	const char *dir;
};

/*
 * One FIFO element, laid out as NCCL 2.28's struct ncclIbSendFifo: the receiver
 * writes it into the sender's FIFO; idx (offset 40) is what the sender polls. It is
 * also the decoded form of the other releases' layouts (--nccl-version).
 */
struct drill_fifo_elem {
	uint64_t addr;
	uint64_t size;
	uint32_t rkeys[DRILL_MAX_NICS];
	uint32_t nreqs;
	uint32_t tag;
	uint64_t idx;
	char padding[16];
};
_Static_assert(sizeof(struct drill_fifo_elem) == 64, "FIFO element is 64 bytes, as NCCL's");
_Static_assert(__builtin_offsetof(struct drill_fifo_elem, idx) == 40, "idx at offset 40");

/*
 * The verbs pattern of one family of NCCL releases (--nccl-version; nccl_version.c has
 * the table, docs/nccl-versions.md the sources): what changes from release to release
 * in what net_ib creates and posts.
 */
struct drill_pattern {
	const char *name;     /* the family, by the release the drill names it after: "2.18" */
	const char *releases; /* the releases it stands for: "2.18-2.19" */
	int slots;	      /* MAX_REQUESTS: request slots, FIFO slots, wr_id space */
	int elem;	      /* sizeof(struct ncclIbSendFifo) */
	int off_size, size_len, off_rkeys, nrkeys, off_nreqs, off_tag, off_idx;
	bool one_nic;	 /* no NIC fusion: a connection's QPs on one NIC, clear-to-send on qps[0] */
	bool send_no_rq; /* the QPs that receive nothing have no receive queue */
	int code;	 /* the version code a release of the family reports (ncclGetVersion) */
	bool clears;	 /* the sender zeroes an element it consumed (before 2.29) */
};

/* The pattern pncclGetVersion reports (the worker's; NULL: none). */
extern const struct drill_pattern *drill_pattern_reported;
const struct drill_pattern *drill_pattern_default(void);
const struct drill_pattern *drill_pattern_find(const char *version);
/* One FIFO element in the pattern's layout, and back (DRILL_MAX_NICS rkeys at most). */
void drill_fifo_put(const struct drill_pattern *p, void *slot, const struct drill_fifo_elem *e);
void drill_fifo_get(const struct drill_pattern *p, const void *slot, struct drill_fifo_elem *e);
uint64_t drill_fifo_idx(const struct drill_pattern *p, const void *slot);

enum drill_phase {
	DRILL_PHASE_START,
	DRILL_PHASE_CONNECT,
	DRILL_PHASE_RUN,
	DRILL_PHASE_WAIT, /* own traffic over: waiting for the others' done marks */
	DRILL_PHASE_DRAIN,
	DRILL_PHASE_DONE,
	DRILL_PHASE_FAILED,
};

/* Per worker, in a file every process maps: what the parent reads, even after a kill. */
struct drill_status {
	_Atomic int phase;
	_Atomic int err_claimed;
	_Atomic int64_t err_ns;	    /* when the first failure was recorded (CLOCK_MONOTONIC) */
	_Atomic uint64_t delivered; /* messages received and checked */
	_Atomic uint64_t sent;	    /* messages whose send completions all arrived */
	_Atomic uint64_t errors;    /* error completions and other failures */
	_Atomic uint64_t async_events;
	_Atomic int interposed; /* 0 not known yet, 1 the data path is libr2cc's, 2 it is not */
	_Atomic int64_t max_post_ns; /* the longest data ibv_post_send call */
	_Atomic uint64_t churned;    /* --churn: QPs created and destroyed */
	/* --churn's connections: made, messages checked at their receiver, error
	 * completions on them, and the longest ibv_destroy_qp of a connected one */
	_Atomic uint64_t churn_conns, churn_msgs, churn_errors;
	_Atomic int64_t churn_destroy_max_ns;
	char error[DRILL_ERR_LEN]; /* the first failure, written once */
	/*
	 * Failures by kind. Application errors are what NCCL would see: an error
	 * completion, a fatal async event, a failed post or poll. Check failures are what
	 * NCCL trusts and the drill verifies: bytes, sizes, order, count, late writes.
	 */
	_Atomic int app_claimed;
	_Atomic int64_t app_err_ns; /* the first application error (CLOCK_MONOTONIC) */
	_Atomic uint64_t app_errors;
	_Atomic int check_claimed;
	_Atomic int64_t check_ns;
	_Atomic uint64_t check_failures;
	char app_error[DRILL_ERR_LEN];	 /* the first application error */
	char check_error[DRILL_ERR_LEN]; /* the first check failure */
	/*
	 * Worker 0's record only, written by the drill: once hold_at messages were
	 * delivered in all and the fault is not in yet (fault_done), workers post no
	 * new sends (for DRILL_HOLD_MAX_NS at most), so that the fault comes during
	 * the traffic even when the drill itself is not scheduled in time (a loaded
	 * machine once let the workers finish before it looked). 0: never hold.
	 */
	_Atomic uint64_t hold_at;
	_Atomic int fault_done;
	/*
	 * Worker 0's record only, with --restore: once back_at messages were delivered
	 * in all and the drill has not seen the failback yet (back_done), workers
	 * trickle (one message per peer every DRILL_TRICKLE_NS, up to 3/4 of their
	 * messages), so that traffic goes on through the restore and the failback
	 * and most of what is left is measured after it.
	 */
	_Atomic uint64_t back_at;
	_Atomic int back_done;
	/*
	 * --inject, --drill-plan: this worker's one ncclAllReduce (R2CC's "first
	 * collective", where its drill's steps count from): when it was called
	 * (CLOCK_MONOTONIC; 0 not yet), the messages delivered in all then, and what
	 * it returned.
	 */
	_Atomic int64_t coll_ns;
	_Atomic uint64_t coll_all;
	_Atomic int coll_rc;
};

#define DRILL_TRICKLE_NS 5000000LL

#define DRILL_HOLD_MAX_NS 5000000000LL

/* The verbs functions NCCL resolves with dlvsym(handle, "ibv_<name>", "IBVERBS_1.1"). */
#define DRILL_IBV_FUNCS(X)                                                                         \
	X(struct ibv_device **, get_device_list, (int *))                                          \
	X(void, free_device_list, (struct ibv_device **))                                          \
	X(const char *, get_device_name, (struct ibv_device *))                                    \
	X(struct ibv_context *, open_device, (struct ibv_device *))                                \
	X(int, close_device, (struct ibv_context *))                                               \
	X(int, get_async_event, (struct ibv_context *, struct ibv_async_event *))                  \
	X(void, ack_async_event, (struct ibv_async_event *))                                       \
	X(int, query_device, (struct ibv_context *, struct ibv_device_attr *))                     \
	X(int, query_port, (struct ibv_context *, uint8_t, struct ibv_port_attr *))                \
	X(int, query_gid, (struct ibv_context *, uint8_t, int, union ibv_gid *))                   \
	X(int, query_qp, (struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *))  \
	X(struct ibv_pd *, alloc_pd, (struct ibv_context *))                                       \
	X(int, dealloc_pd, (struct ibv_pd *))                                                      \
	X(struct ibv_mr *, reg_mr, (struct ibv_pd *, void *, size_t, int))                         \
	X(int, dereg_mr, (struct ibv_mr *))                                                        \
	X(struct ibv_cq *, create_cq,                                                              \
	  (struct ibv_context *, int, void *, struct ibv_comp_channel *, int))                     \
	X(int, destroy_cq, (struct ibv_cq *))                                                      \
	X(struct ibv_qp *, create_qp, (struct ibv_pd *, struct ibv_qp_init_attr *))                \
	X(int, modify_qp, (struct ibv_qp *, struct ibv_qp_attr *, int))                            \
	X(int, destroy_qp, (struct ibv_qp *))                                                      \
	X(int, fork_init, (void))                                                                  \
	X(const char *, event_type_str, (enum ibv_event_type))

/* --mlx5dv: libmlx5's mlx5dv_create_qp (the software device's stand-in, found in
 * softverbs/mlx5), NULL until drill_mlx5_load(). */
struct mlx5dv_qp_init_attr;
extern struct ibv_qp *(*drill_mlx5dv_create_qp)(struct ibv_context *, struct ibv_qp_init_attr_ex *,
						struct mlx5dv_qp_init_attr *);
/* and its mlx5dv_reg_dmabuf_mr (MLX5_1.25), for --mlx5dv with --flush */
extern struct ibv_mr *(*drill_mlx5dv_reg_dmabuf_mr)(struct ibv_pd *, uint64_t, size_t, uint64_t,
						    int, int, int);
int drill_mlx5_load(char *err, size_t len);

/* Optional: ibv_reg_dmabuf_mr (NULL where libibverbs lacks it). */
extern struct ibv_mr *(*drill_reg_dmabuf_mr)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int);
/* softverbs' softverbs_unflushed() (softverbs.h); NULL on another libibverbs. */
extern int (*drill_sv_unflushed)(const struct ibv_mr *, uint64_t, uint64_t, uint64_t *, uint64_t *);

struct drill_ibv {
#define DRILL_IBV_PTR(ret, name, params) ret(*name) params;
	DRILL_IBV_FUNCS(DRILL_IBV_PTR)
#undef DRILL_IBV_PTR
};

extern struct drill_ibv drill_ibv;

/* verbs.c */
int drill_ibv_load(char *err, size_t len);
const char *drill_wc_status_str(int status);

/* pattern.c */
uint64_t drill_mix(uint64_t x);
uint64_t drill_hash(uint64_t a, uint64_t b, uint64_t c, uint64_t d);
uint64_t drill_msg_size(uint64_t seed, int src, int dst, uint64_t seq, uint64_t max);
void drill_pattern_fill(void *buf, uint64_t len, uint64_t key);
/* Returns the number of bytes that differ; *first and the bytes at it when any do. */
uint64_t drill_pattern_check(const void *buf, uint64_t len, uint64_t key, uint64_t *first,
			     uint8_t *got, uint8_t *want);
uint64_t drill_msg_key(uint64_t seed, int src, int dst, uint64_t seq);
/* Without NIC fusion: the one NIC of the connection from rank `from` to rank `to`. */
int drill_pair_nic(const struct drill_opts *o, int from, int to);

/* bootstrap.c: files in the scenario directory, written whole (write + rename). */
int drill_file_put(const char *dir, const char *name, int rank, const void *data, size_t len);
/* Reads `len` bytes of <dir>/<name>.<rank>; -EAGAIN while it is not there yet. */
int drill_file_get(const char *dir, const char *name, int rank, void *data, size_t len);
bool drill_file_exists(const char *dir, const char *name, int rank);
void drill_file_del(const char *dir, const char *name, int rank);
int64_t drill_now_ns(void);

/* worker.c */
int drill_worker_main(const struct drill_opts *o);

#endif
