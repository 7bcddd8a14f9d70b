/*
 * Process-local objects of the software RDMA device and what device.c (devices,
 * contexts, async events, PDs, MRs), cq.c (CQs, completion channels), qp.c (QPs, their
 * states, their completions), post.c (posting, the ibv_wr_* API), exec.c (the data
 * path), engine.c (the engines, the progress thread), srq.c (shared receive queues)
 * and compat.c (the rest of libibverbs' ABI) share.
 *
 * Lock order: sv_process.lock -> sv_engine.lock -> sv_qp.lock -> shared-memory locks
 * (fabric.h). sv_qp.post_lock (held from ibv_wr_start to ibv_wr_complete by the
 * extended send API), sv_ctx.ev_lock and sv_cq.poll_lock are leaves.
 */
#ifndef SOFTVERBS_INTERNAL_H
#define SOFTVERBS_INTERNAL_H

#include "softverbs/fabric.h"

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>

/*
 * A send queue is process-local and may be larger than a receive queue, which lives in
 * the fabric (SV_RQ_CAP x SV_RQ_SGE): ibv_query_device reports the smaller of the two,
 * as the kernel reports max_sge = min(max_send_sge, max_recv_sge), and sends take more.
 */
#define SV_MAX_SEND_WR			 32768
#define SV_MAX_SEND_SGE			 30
#define SV_MAX_PDS			 65536 /* live PDs per process */
#define SV_MAX_RD_ATOM			 16    /* max_qp_rd_atom, max_qp_init_rd_atom */
#define SV_MAX_INLINE			 512
#define SV_EVQ_CAP			 256
#define SV_EXPORT			 __attribute__((visibility("default")))
#define sv_container_of(p, type, member) ((type *)((char *)(p)-offsetof(type, member)))

struct sv_device {
	struct ibv_device dev;
	int nic;
};

struct sv_ctx {
	struct verbs_context vctx;
	int nic;
	uint32_t epoch; /* the NIC's when opened: a fatal fault since leaves it dead */
	int ev_wfd;
	pthread_mutex_t ev_lock;
	struct ibv_async_event evq[SV_EVQ_CAP];
	unsigned ev_head, ev_tail;
	unsigned ev_unacked;
	bool port_active; /* what the last port event told */
	bool fatal_told;  /* IBV_EVENT_DEVICE_FATAL delivered: no port events after it */
	struct sv_ctx *next;
};

struct sv_pd {
	struct ibv_pd pd;
	uint32_t id;
	_Atomic int users;
};

struct sv_mr {
	struct ibv_mr mr;
	int slot;
	void *map; /* a dmabuf MR's mapping of the buffer, unmapped with it */
	size_t maplen;
};

struct sv_cq {
	struct ibv_cq cq;
	int slot;
	struct sv_cq_slot *s;
	struct ibv_wc *ring; /* s->ring, or this process's mapping of its own ring */
	uint32_t mask;	     /* ring entries - 1; ring and mask change under poll_lock */
	pthread_mutex_t poll_lock;
	_Atomic int users;
	struct sv_cq *next; /* sv_process.cqs, CQs with a channel */
};

struct sv_srq {
	struct ibv_srq srq;
	int slot;
	struct sv_srq_slot *s;
	_Atomic int users; /* QPs that take their receives from it */
	struct sv_srq *next;
};

/* A send work request, copied at post time; executed in slices of up to SV_SLICE bytes. */
struct sv_swr {
	uint64_t wr_id;
	int opcode;
	unsigned flags;
	uint32_t imm;
	uint64_t raddr;
	uint32_t rkey;
	uint32_t nsge;
	uint64_t len;
	struct ibv_sge *sge; /* into sv_qp.sge_pool */
	uint8_t *inl;	     /* into sv_qp.inl_pool when IBV_SEND_INLINE */
	int64_t post_ns;     /* posted (black-hole moments and jitter count from it) */
	int64_t first_ns;    /* first attempt (retry timeout origin) */
	int64_t due_ns;	     /* jitter: not before, 0 = not drawn */
	uint64_t done;	     /* bytes landed at the target */
	uint64_t slice;	     /* bytes of the slice whose wire time is reserved, 0 = none */
	int64_t wire_ns;  /* shaping, local NIC: when the slice's last bit has passed, 0 = none */
	int64_t start_ns; /* shaping, local NIC: when its first bit went out */
	int64_t far_ns;	  /* shaping, remote NIC: when its last bit has passed, 0 = none */
};

struct sv_engine;

/*
 * The send queue is a ring with one producer side and one consumer side: posting
 * threads append under post_lock and publish sq_tail; whoever holds `lock` (the NIC's
 * engine, or a posting thread running small requests, or the progress thread when
 * engines are off) executes from sq_exec and completes from sq_head: the requests in
 * [sq_head, sq_exec) have landed at the target and wait for their acknowledgement.
 * `lock` also guards the state and attributes, so modify_qp never races a request
 * being executed.
 */
struct sv_qp {
	union {
		struct ibv_qp qp;
		struct ibv_qp_ex qpx; /* begins with the ibv_qp (qp_base) */
	};
	/*
	 * rdma-core 45+ appended wr_flush to struct ibv_qp_ex: a program built with
	 * those headers reads it here and finds NULL, as mlx5 leaves it for a QP
	 * created without IBV_QP_EX_WITH_FLUSH (which the device refuses).
	 */
	void (*wr_flush)(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t remote_addr, size_t len,
			 uint8_t type, uint8_t level);
	bool has_qpx;	       /* created with send_ops_flags: ibv_qp_to_qp_ex answers it */
	uint32_t wr_tail;      /* extended send API, under post_lock: the next slot to fill */
	int wr_err;	       /* the first error since ibv_wr_start, ibv_wr_complete's answer */
	struct sv_swr *wr_cur; /* the request the ibv_wr_set_* calls fill */
	int slot;
	struct sv_qp_slot *s;
	pthread_mutex_t lock;
	pthread_mutex_t post_lock;
	struct ibv_qp_cap cap;
	bool sig_all;
	struct ibv_qp_attr attr; /* what modify_qp set */
	struct sv_swr *sq;
	struct ibv_sge *sge_pool;
	uint8_t *inl_pool;
	_Atomic uint32_t sq_head; /* free-running; written under lock */
	_Atomic uint32_t sq_tail; /* free-running; written under post_lock */
	uint32_t sq_exec;	  /* next to land; under lock */
	int nak;		  /* what the responder answered sq_exec, waiting to be heard */
	int64_t progress_ns;	  /* last acknowledged progress (the retry timer restarts) */
	int64_t jitter_ns;	  /* due time of the last jittered request (order) */
	int64_t wire_ready;	  /* shaped: when its next slice may take the wire */
	uint32_t bh_seq[2];	  /* black holes handled: fault_seq of the local, remote NIC */
	uint64_t key;		  /* identity in seeded draws: node, NIC, creation order */
	bool srq_held;		  /* sq_exec took the SRQ receive below and has not all landed */
	struct sv_rwqe srq_wqe;
	struct sv_engine *eng;	/* executes this QP; NULL with SOFTVERBS_ENGINES=0 */
	_Atomic bool ready;	/* handed to the engine since it last looked */
	int64_t eng_wake;	/* engine only: when to run it again */
	struct sv_qp *eng_next; /* the engine's list, under sv_engine.lock */
	struct sv_qp *next;
};

struct sv_process {
	pthread_once_t once;
	int init_err;
	struct sv_config cfg;
	struct sv_fabric *f;
	int node;
	int proc_slot;
	int ndevs;
	struct sv_device *devs;
	pthread_mutex_t lock; /* the lists, thread start */
	pthread_cond_t cond;  /* wakes the progress thread */
	bool kicked;
	bool thread_started;
	pthread_t thread;
	struct sv_qp *qps;
	struct sv_ctx *ctxs;
	struct sv_cq *cqs;
	struct sv_srq *srqs;
	uint32_t pd_base;
	_Atomic uint32_t next_pd;
	_Atomic uint32_t live_pds; /* at most SV_MAX_PDS, what max_pd reports */
	_Atomic uint32_t qps_made; /* QPs created by this process (their draw identity) */
};

extern struct sv_process sv_proc;

int sv_init(void);
struct sv_ctx *sv_ctx_of(struct ibv_context *context);
/* The context's device died (IBV_EVENT_DEVICE_FATAL): its verbs fail with EIO. */
bool sv_ctx_dead(struct ibv_context *context);
void sv_thread_start(void);
void sv_kick(void);
void sv_ctx_push_event(struct sv_ctx *ctx, struct ibv_async_event *ev);
void sv_ctx_check_ports(int64_t now);

/* A send queue's step: when nothing is due, and the bytes of one slice (exec.c, engine.c). */
#define SV_NEVER    INT64_MAX
#define SV_SLICE    65536  /* bytes of one QP per round of its engine, and per turn on a link */
#define SV_RNR_POLL 100000 /* ns between attempts while no receive is posted */

static inline struct sv_cq *to_cq(struct ibv_cq *cq)
{
	return sv_container_of(cq, struct sv_cq, cq);
}

static inline struct sv_qp *to_qp(struct ibv_qp *qp)
{
	return sv_container_of(qp, struct sv_qp, qp);
}

static inline void sv_wc_fill(struct ibv_wc *wc, uint64_t wr_id, int status, int opcode,
			      uint32_t len, uint32_t qpn)
{
	memset(wc, 0, sizeof(*wc));
	wc->wr_id = wr_id;
	wc->status = status;
	wc->opcode = opcode;
	wc->byte_len = len;
	wc->qp_num = qpn;
}

/* cq.c */
int sv_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
int sv_req_notify_cq(struct ibv_cq *cq, int solicited_only);
/* Unmaps the rings of other processes' CQs that were destroyed or replaced since. */
void sv_cq_rings_sweep(void);
bool sv_cq_push(struct sv_fabric *f, int slot, uint32_t id, const struct ibv_wc *wc);
/* The fabric's next generation, `bits` bits and never 0 (CQ and ring ids, QPNs' high bits). */
uint32_t sv_next_gen(struct sv_fabric *f, unsigned bits);

/* qp.c */
struct ibv_qp *sv_create_qp_ex(struct ibv_context *context, struct ibv_qp_init_attr_ex *init);
/* A seeded draw for QP `key` (sv_qp.key): what it is for, the request's index. */
uint64_t sv_draw(uint64_t key, uint64_t what, uint32_t idx);
void sv_sq_retire(struct sv_qp *qp, uint32_t head, int status);
void sv_rq_flush(struct sv_qp *qp);
void sv_qp_flush(struct sv_qp *qp);
void sv_qp_set_state(struct sv_qp *qp, enum ibv_qp_state st);

/* post.c */
int sv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
int sv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
void sv_qpx_init(struct sv_qp *qp);

/* exec.c */
/* Under qp->lock: moves the send queue on as far as it goes now; when to look again. */
int64_t sv_qp_step(struct sv_qp *qp, int64_t now, uint64_t max_len, uint64_t budget);
/* Under qp->lock: the SRQ receive the QP holds will not get the rest: it is flushed. */
void sv_srq_release(struct sv_qp *qp);

/* engine.c */
void sv_sq_kick(struct sv_qp *qp, int64_t now);
struct sv_engine *sv_engine_get(int nic);
void sv_engine_add(struct sv_qp *qp);
void sv_engine_remove(struct sv_qp *qp);
/* Forgets the engines of the parent in a forked child (its threads do not exist there). */
void sv_engines_forget(void);
/* Runs the send queues of QPs without an engine once; returns when to look again. */
int64_t sv_progress_all(int64_t now);

/* device.c */
struct sv_mr_slot *sv_mr_find(struct sv_fabric *f, uint32_t key);
struct ibv_mr *sv_mr_register(struct ibv_pd *ibpd, void *addr, size_t length, uint64_t iova,
			      unsigned int access, uint64_t dmabuf, uint64_t dmabuf_off);
/* devmem.c: device memory's writes and the reads that order them */
void sv_devmem_write(int pid, int nic, const struct sv_mr_slot *m, uint64_t addr, uint64_t len);
void sv_devmem_read(int pid, int nic);

/* srq.c */
int sv_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
/* Takes the next receive of SRQ `slot` (id checked) into *out; false when it has none. */
bool sv_srq_take(struct sv_fabric *f, int slot, uint32_t id, struct sv_rwqe *out);
/* Progress thread: turns SRQ limits reached into IBV_EVENT_SRQ_LIMIT_REACHED. */
void sv_srq_events(void);

#endif
