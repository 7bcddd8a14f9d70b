/*
 * The shared fabric of the software RDMA device: one POSIX shared-memory region
 * (SOFTVERBS_FABRIC) that every process of a test maps. It holds the emulated nodes
 * and their NICs (faults, shaping clock, counters), the processes attached, and the
 * tables of memory regions, queue pairs (with their receive queues), shared receive
 * queues and completion queues, so that the process that executes a work request can check the
 * target's keys, consume its posted receive and place its completion without the target process
 * running, as an RDMA NIC does.
 *
 * Locks: fabric->lock (tables, registration, reaping) -> rq_lock of a QP or lock of an
 * SRQ -> lock of a CQ. All are robust and process-shared; a holder that died is recovered with
 * pthread_mutex_consistent(). Hot fields are read through atomics without locks.
 */
#ifndef SOFTVERBS_FABRIC_H
#define SOFTVERBS_FABRIC_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define SV_MAGIC	 0x534f465456524253ull /* "SOFTVRBS" */
#define SV_VERSION	 9
#define SV_NAME_LEN	 64
#define SV_MAX_NODES	 32
#define SV_MAX_NICS	 128
#define SV_NICS_PER_NODE 16
#define SV_MAX_PROCS	 256
#define SV_MAX_MRS	 16384
#define SV_MAX_POSTED	 16384
#define SV_MR_SHIFT	 14 /* key = gen << SV_MR_SHIFT | slot */
#define SV_MAX_QPS	 4096
#define SV_QP_SHIFT	 12 /* qpn = gen << SV_QP_SHIFT | slot */
/* A QP slot claimed by its maker and not filled in yet: never a QPN (24 bits). */
#define SV_QPN_CLAIMED 0xffffffffu
#define SV_RQ_CAP      2048 /* NCCL's port failover asks 256 per device of a fused NIC (up to 8) */
#define SV_RQ_SGE      4
#define SV_MAX_CQS     2048
#define SV_CQ_CAP      2048    /* the ring inside a CQ slot; a larger CQ has a ring of its own */
#define SV_MAX_CQE     4194303 /* what ConnectX reports as max_cqe */
#define SV_MAX_SRQS    256
#define SV_SRQ_CAP     4096
#define SV_MAX_SCHED   32
/* Sizes are fabric-wide; the region is sparse, only what is used takes memory. */
_Static_assert(SV_MAX_MRS == 1 << SV_MR_SHIFT, "MR keys encode their slot");
_Static_assert(SV_MAX_QPS == 1 << SV_QP_SHIFT, "QPNs encode their slot");
_Static_assert((SV_CQ_CAP & (SV_CQ_CAP - 1)) == 0, "CQ rings are indexed by a mask");

/* Values are part of softverbs.h (enum softverbs_nic_state). */
enum sv_fault {
	SV_FAULT_UP = 0,
	SV_FAULT_DOWN = 1,
	SV_FAULT_BLACKHOLE = 2,
	SV_FAULT_FLAP = 3,
	SV_FAULT_SLOW = 4,
	SV_FAULT_ACKLOSS = 5,	   /* acknowledgements (and READ responses) crossing it are lost */
	SV_FAULT_BLACKHOLE_TX = 6, /* what it sends is lost */
	SV_FAULT_BLACKHOLE_RX = 7, /* what it receives is lost */
	SV_FAULT_FATAL = 8,	   /* the device died: IBV_EVENT_DEVICE_FATAL, EIO */
	SV_FAULT_JITTER = 9,	   /* each request is delayed by up to `arg` ms */
	SV_FAULT_KINDS
};

/* The fabric's link layer (SOFTVERBS_LINK): InfiniBand (LIDs) or RoCE (GIDs, roce.c). */
enum sv_link_layer {
	SV_LL_IB = 0,
	SV_LL_ROCE = 1,
};

/* What the wire does right now (a flapping NIC is DOWN or UP depending on the time). */
enum sv_link {
	SV_LINK_UP,
	SV_LINK_DOWN,
	SV_LINK_BLACKHOLE,
	SV_LINK_BLACKHOLE_TX,
	SV_LINK_BLACKHOLE_RX,
	SV_LINK_ACKLOSS,
	SV_LINK_DEAD,
};

/*
 * What a link loses, by direction and kind of packet: requests (and the data of
 * writes and sends) and acknowledgements (ACKs, NAKs and the data of READ responses).
 * A request from NIC a to NIC b gets there unless a loses REQ_TX or b REQ_RX; its
 * acknowledgement comes back unless b loses ACK_TX or a ACK_RX.
 */
#define SV_LOSE_REQ_TX 1u
#define SV_LOSE_REQ_RX 2u
#define SV_LOSE_ACK_TX 4u
#define SV_LOSE_ACK_RX 8u
#define SV_LOSE_ALL    15u

static inline unsigned sv_link_loss(enum sv_link l)
{
	switch (l) {
	case SV_LINK_UP:
		return 0;
	case SV_LINK_BLACKHOLE_TX:
		return SV_LOSE_REQ_TX | SV_LOSE_ACK_TX;
	case SV_LINK_BLACKHOLE_RX:
		return SV_LOSE_REQ_RX | SV_LOSE_ACK_RX;
	case SV_LINK_ACKLOSS:
		return SV_LOSE_ACK_TX | SV_LOSE_ACK_RX;
	default: /* down, black hole, dead */
		return SV_LOSE_ALL;
	}
}

/* Black holes lose packets without the port noticing: what was on the wire may land. */
static inline bool sv_link_is_blackhole(enum sv_link l)
{
	return l == SV_LINK_BLACKHOLE || l == SV_LINK_BLACKHOLE_TX || l == SV_LINK_BLACKHOLE_RX;
}

struct sv_node {
	_Atomic int used;
	char name[SV_NAME_LEN];
	int nnics;
	int nics[SV_NICS_PER_NODE];
};

struct sv_nic {
	_Atomic int used;
	int node;
	char name[SV_NAME_LEN];
	int gbps;
	uint16_t lid;
	uint8_t rail; /* index of the NIC in its node: its RoCE subnet (roce.c) */
	uint64_t guid;
	_Atomic int fault;	  /* enum sv_fault */
	_Atomic int fault_arg;	  /* flap period in ms, slow rate in Gb/s, or jitter in ms */
	_Atomic int64_t fault_ns; /* when the fault was set (flap phase origin) */
	_Atomic uint32_t
	    fault_seq;		/* faults set so far: tells one black-hole moment from the next */
	_Atomic uint32_t epoch; /* fatal faults so far: contexts opened before the last are dead */
	_Atomic int64_t shape_ns[2]; /* when the wire is free again: [SV_TX], [SV_RX] */
	_Atomic uint64_t tx_bytes, rx_bytes, tx_packets, rx_packets;
	_Atomic uint64_t lossy_bytes; /* sent outside SOFTVERBS_LOSSLESS_TC (RoCE) */
};

struct sv_proc {
	_Atomic int pid; /* 0 = free */
	int node;
};

struct sv_mr_slot {
	_Atomic uint32_t key; /* 0 = free */
	int pid;
	uint32_t pd;
	uint32_t access;
	uint64_t addr, iova, len;
	/* Device memory (ibv_reg_dmabuf_mr): the buffer's identity (never 0) and where the
	 * MR starts in it; 0 for host memory. */
	uint64_t dmabuf, dmabuf_off;
};

/*
 * Device memory: bytes a NIC wrote into a dmabuf MR that no RDMA READ through that
 * NIC has ordered yet (GPUDirect's flush). On hardware the GPU may still read the old
 * bytes there; here they are in memory, and softverbs_unflushed() says which NICs
 * owe a flush. A range in the buffer's own offsets, so every MR of the buffer (one
 * per PD) sees it.
 */
struct sv_posted {
	int pid; /* the memory's process */
	int nic;
	uint32_t fault_seq; /* the NIC's when the bytes landed: a fault since settles them */
	uint64_t dmabuf, lo, hi;
};

struct sv_rwqe {
	uint64_t wr_id;
	uint32_t num_sge;
	uint32_t pad;
	struct ibv_sge sge[SV_RQ_SGE];
};

struct sv_qp_slot {
	_Atomic uint32_t qpn; /* 0 = free, SV_QPN_CLAIMED = being made */
	int pid;
	int nic;
	uint32_t pd;
	_Atomic int state; /* enum ibv_qp_state */
	_Atomic uint32_t access;
	_Atomic uint32_t dest_qpn;
	_Atomic uint32_t dlid;
	/*
	 * RoCE: the GRH of the last modify_qp with IBV_QP_AV, and the NIC it reaches
	 * (roce.c), -1 if none; grh is written before grh_peer is stored.
	 */
	struct ibv_global_route grh;
	_Atomic int grh_peer;
	uint32_t epoch;	  /* its NIC's epoch when its context was opened */
	int rcq;	  /* CQ slot of the receive CQ */
	uint32_t rcq_id;  /* its id, checked before use */
	int srq;	  /* SRQ slot its receives come from, -1: its own rq */
	uint32_t srq_id;  /* its id, checked before use */
	uint32_t rq_size; /* max_recv_wr */
	pthread_mutex_t rq_lock;
	_Atomic bool rq_lock_ready; /* rq_lock is initialised once: a reused slot never redoes it */
	uint32_t rq_head, rq_tail;  /* under rq_lock */
	struct sv_rwqe rq[SV_RQ_CAP];
};

/*
 * A shared receive queue: its receives are taken (removed under `lock`) by whichever
 * process executes a SEND or WRITE_WITH_IMM to one of its QPs; the owner's progress
 * thread turns limit_hit into IBV_EVENT_SRQ_LIMIT_REACHED.
 */
struct sv_srq_slot {
	_Atomic uint32_t id; /* 0 = free */
	int pid;
	uint32_t pd;
	uint32_t size; /* max_wr */
	uint32_t max_sge;
	pthread_mutex_t lock;
	uint32_t head, tail; /* under lock */
	uint32_t limit;	     /* armed limit, 0 = not armed; under lock */
	_Atomic bool limit_hit;
	struct sv_rwqe rq[SV_SRQ_CAP];
};

/*
 * A completion queue. Completion events: the owner arms it (req_notify_cq); whoever
 * places the next completion disarms it, counts an event and adds 1 to the owner's
 * channel, an eventfd (ch_fd in process pid), which it reaches through pidfd_getfd.
 *
 * Its ring: `ring` below while ring_cap is SV_CQ_CAP; a CQ made or resized beyond
 * that has a ring of ring_cap entries (a power of two) of its own, a memfd (ring_fd in
 * the owner) that every process placing a completion in it maps on first use, reaching
 * it through pidfd_getfd as it reaches the channel (cq.c); ring_id tells one such
 * ring from the next (ibv_resize_cq replaces it). The kernel frees it when the owner
 * and the last mapping are gone, dead owner or not. The ring fields are set before id
 * is published and changed under lock.
 */
struct sv_cq_slot {
	_Atomic uint32_t id; /* 0 = free */
	int pid;
	int ch_fd; /* the channel's eventfd in the owner, -1 = none */
	_Atomic bool armed;
	_Atomic uint32_t events; /* counted, not yet taken by ibv_get_cq_event */
	int nic;		 /* of its context: a dead device's CQs take no completions */
	uint32_t epoch;
	pthread_mutex_t lock;	 /* producers */
	_Atomic bool lock_ready; /* lock is initialised once: a slot reused never redoes it */
	_Atomic uint64_t head, tail;
	_Atomic uint64_t overruns;
	uint32_t ring_cap; /* entries: SV_CQ_CAP (the inline ring) or more (its own) */
	uint32_t ring_id;
	int ring_fd; /* its own ring's memfd in the owner */
	struct ibv_wc ring[SV_CQ_CAP];
};

struct sv_sched {
	_Atomic int state; /* 0 free, 1 claimed, 2 pending, 3 applied */
	char node[SV_NAME_LEN];
	char nic[SV_NAME_LEN];
	int kind;
	int arg;
	int64_t at_ns;
};

/* What kind of network the fabric is: set by the first process of a fabric. */
struct sv_net {
	int link;	 /* enum sv_link_layer, SOFTVERBS_LINK */
	int routed;	 /* SOFTVERBS_ROUTED: RoCE v2 over IPv4 crosses rails */
	int lossless_tc; /* SOFTVERBS_LOSSLESS_TC, -1 = none */
	int active_mtu;	 /* enum ibv_mtu of every port, SOFTVERBS_MTU */
};

struct sv_fabric {
	_Atomic uint64_t magic;
	uint32_t version;
	uint64_t size;
	pthread_mutex_t lock;
	int64_t start_ns;
	struct sv_net net;
	uint32_t next_lid;
	_Atomic uint32_t gen;
	_Atomic int sched_pending;
	struct sv_sched sched[SV_MAX_SCHED];
	struct sv_node nodes[SV_MAX_NODES];
	struct sv_nic nics[SV_MAX_NICS];
	struct sv_proc procs[SV_MAX_PROCS];
	struct sv_mr_slot mrs[SV_MAX_MRS];
	struct sv_qp_slot qps[SV_MAX_QPS];
	struct sv_srq_slot srqs[SV_MAX_SRQS];
	struct sv_cq_slot cqs[SV_MAX_CQS];
	pthread_mutex_t posted_lock;
	_Atomic int nposted;
	_Atomic uint64_t posted_overflow; /* device-memory writes the table had no room for */
	struct sv_posted posted[SV_MAX_POSTED];
};

/* Settings read once per process. */
struct sv_config {
	char fabric[SV_NAME_LEN + 16];
	char node[SV_NAME_LEN];
	char nics[1024];
	double time_scale;
	bool shaping;
	bool engines; /* SOFTVERBS_ENGINES: a thread per NIC executes the send queues */
	const char *faults;
	struct sv_net net; /* what this process asks for; the fabric's first process decides */
	bool net_set;	   /* one of SOFTVERBS_LINK/ROUTED/LOSSLESS_TC/MTU was set */
	uint64_t seed;	   /* SOFTVERBS_SEED: what lands at a black hole, jitter delays */
	uint64_t
	    inflight; /* SOFTVERBS_INFLIGHT: bytes per QP on the wire when a black hole opens */
	bool dmabuf;  /* SOFTVERBS_DMABUF: ibv_reg_dmabuf_mr of a buffer this process can map */
};

void sv_config_read(struct sv_config *cfg);
int64_t sv_now_ns(void);
bool sv_pid_alive(int pid);
void sv_lock(pthread_mutex_t *m);
void sv_mutex_init_shared(pthread_mutex_t *m);

/* Maps (creating when absent) the fabric; NULL with errno on failure. */
struct sv_fabric *sv_fabric_attach(const char *name, bool create);
void sv_fabric_detach(struct sv_fabric *f);
int sv_fabric_remove(const char *name);

/*
 * Attaches this process as a member of node cfg->node, registering the node with the
 * NICs of cfg->nics ("name:gbps,...") when it is new; reaps dead processes first and
 * restarts a fabric that has no live member (taking cfg->net as its network). Returns
 * the node index (proc slot in *proc_p) or -errno.
 */
int sv_fabric_join(struct sv_fabric *f, const struct sv_config *cfg, int *proc_p);
int sv_fabric_find_node(struct sv_fabric *f, const char *name);
int sv_fabric_find_nic(struct sv_fabric *f, const char *node, const char *nic);
/* Frees the slots of processes that died; returns how many processes were reaped. */
int sv_fabric_reap(struct sv_fabric *f);

/* Faults. */
int sv_fault_parse(const char *word, int *kind);
bool sv_fault_takes_arg(int kind);
void sv_fabric_set_fault(struct sv_fabric *f, int nic, int kind, int arg);
int sv_fabric_schedule(struct sv_fabric *f, const char *spec);
void sv_fabric_sched_apply(struct sv_fabric *f, int64_t now);
enum sv_link sv_nic_link(struct sv_fabric *f, int nic, int64_t now);
/* A context (or QP, CQ) opened at `epoch` on a NIC that has died since, or is dead now. */
bool sv_nic_dead(struct sv_fabric *f, int nic, uint32_t epoch);
/* Jitter of a NIC in ms, 0 = none. */
int sv_nic_jitter(struct sv_fabric *f, int nic);
/* Rate cap of a NIC in Gb/s for its sender, 0 = unshaped. */
int sv_nic_rate(struct sv_fabric *f, int nic, bool shaping);
enum sv_dir {
	SV_TX = 0,
	SV_RX = 1,
};
/* How long `bytes` take on a link of `gbps` Gb/s (bits per ns), in ns. */
static inline int64_t sv_wire_time(uint64_t bytes, int gbps)
{
	return (int64_t)(bytes * 8 / (uint64_t)gbps);
}

/*
 * Reserves one direction of a NIC's link for `bytes`, from `from` or when the turns
 * taken before end; returns when their last bit passed.
 */
int64_t sv_nic_reserve(struct sv_fabric *f, int nic, enum sv_dir dir, int gbps, uint64_t bytes,
		       int64_t from);
void sv_nic_account(struct sv_fabric *f, int from, int to, uint64_t bytes);
const char *sv_fault_name(int kind);

/* roce.c: addresses, GID tables, reachability and traffic classes of RoCE mode. */
#define SV_ROCE_GID_TBL_LEN 255 /* what a ConnectX port reports on Ethernet */
int sv_port_gid_tbl_len(const struct sv_fabric *f);
uint32_t sv_nic_ipv4(const struct sv_fabric *f, int nic);
/* GID `index` of a NIC's port: 0, -ENODATA (an empty entry) or -EINVAL (past the table). */
int sv_nic_gid(const struct sv_fabric *f, int nic, unsigned index, union ibv_gid *gid,
	       enum ibv_gid_type *type);
/* The NIC owning a GID, -1 if none. */
int sv_gid_owner(const struct sv_fabric *f, const union ibv_gid *gid);
/* 0, or the errno modify_qp fails with for an address vector of a QP on NIC `nic`. */
int sv_roce_check_av(const struct sv_fabric *f, int nic, const struct ibv_ah_attr *ah);
/* The NIC a GRH sent from NIC `nic` reaches, -1 if it goes nowhere. */
int sv_roce_route(const struct sv_fabric *f, int nic, const struct ibv_global_route *grh);
/* Counts bytes a NIC sent with traffic class `tc` when that is not the lossless one. */
void sv_nic_account_class(struct sv_fabric *f, int nic, int tc, uint64_t bytes);
const char *sv_link_layer_name(int link);

#endif
