/*
 * A drill worker: one emulated node. It opens the node's NICs, builds a connection
 * to and from every other worker, and moves checked messages over them in the
 * pattern of NCCL 2.28's net_ib transport (src/transport/net_ib.cc):
 *
 *  - a connection is one RC QP per NIC (QP q on NIC q, connected to the peer's QP q),
 *    max_send_wr 512, max_recv_wr 256, one SGE; one CQ per NIC per process, shared
 *    by send and receive, busy-polled; an async-event thread per NIC;
 *  - the receiver (ncclIbIrecv) posts one zero-SGE receive per data QP with wr_id =
 *    request slot, then (ncclIbPostFifo) RDMA-writes a 64-byte FIFO element (idx at
 *    offset 40 last) into the sender's registered FIFO, on QP devIndex round-robin,
 *    signalled only when slot == devIndex;
 *  - the sender (ncclIbIsend/ncclIbMultiSend) polls its FIFO for idx, then posts on
 *    every data QP a 128-byte-aligned chunk: one signalled RDMA_WRITE_WITH_IMM
 *    (imm_data = size) or, with adaptive routing (IB) above 8 KiB, an unsignalled
 *    RDMA_WRITE followed by a signalled zero-byte RDMA_WRITE_WITH_IMM; it reuses its
 *    WR and SGE arrays right after post_send returns;
 *  - the receiver's request is done when every data QP's IMM completion (and its
 *    own signalled FIFO write, if any) arrived; any error completion ends the job;
 *  - with --flush, GPU Direct's flush (ncclIbIflush): the receive connection also has
 *    one loopback RC QP per NIC (connected to itself), and a received message is done
 *    only when a signalled RDMA READ of its first bytes, posted on every NIC's flush
 *    QP, came back.
 *
 * --nccl-version changes what differs between NCCL releases (nccl_version.c): the
 * request slots (64 before 2.20), the FIFO element's layout, connections on one NIC
 * with every clear-to-send on qps[0] (before 2.20), no receive queue on the QPs that
 * receive nothing (2.29 on).
 *
 * On top of that it checks what NCCL trusts: every byte of every message, sizes,
 * slots, order and count, and reports into its entry of the shared status file.
 */
#include "tools/drill/drill.h"

#include <infiniband/mlx5dv.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <spawn.h>
#include <sys/wait.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#define DRILL_EP_MAGIC	   0x4452494c4c455031ull /* "DRILLEP1" */
#define DRILL_QP_MAP	   4096
#define DRILL_POLL_BATCH   16
#define DRILL_ALIGN	   128 /* NCCL: IB writes are multiples of 128 B across QPs */
#define DRILL_DRAIN_NS	   300000000
#define DRILL_LOG_FAILURES 20
#define DRILL_FLUSH_ELEM   64 /* --flush scratch per request in flight: 16 B per NIC */
#define DRILL_FLUSH_NIC	   (DRILL_FLUSH_ELEM / DRILL_MAX_NICS)
#define DRILL_FLUSH_MAX	   8 /* bytes a flush READ reads, at most */

struct drill_dev {
	int index;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	uint16_t lid;
	enum ibv_mtu mtu;
	bool ar;
	bool eth; /* RoCE: GRHs from this GID, as NCCL_IB_GID_INDEX names it */
	union ibv_gid gid;
	char name[IBV_SYSFS_NAME_MAX];
	struct drill_worker *w;
};

struct drill_qp {
	struct ibv_qp *qp;
	int dev;       /* local NIC */
	int rem_dev;   /* the peer's NIC */
	uint64_t next; /* sequence of the next message this QP owes a completion for */
	struct drill_conn *conn;
	int index;
	bool flush; /* a GPU flush QP (--flush): connected to itself */
};

struct drill_msg {
	uint64_t seq;
	uint64_t size;
	uint64_t off;		/* in the connection's ring buffer */
	uint64_t end;		/* ring position freed when the message retires */
	int events;		/* completions still owed */
	unsigned flush_pending; /* --flush: NICs whose flush READ is still owed */
	uint32_t flush_len;	/* bytes each flush READ reads */
	bool cts_pending;
	bool inflight;
	bool done;
};

struct drill_ring {
	uint64_t size, head, tail; /* head and tail run free */
};

/* One direction of traffic with one peer: NCCL's send comm or recv comm. */
struct drill_conn {
	bool send;
	int peer;
	int nic0, nnic; /* the NICs the connection uses: nic0 .. nic0 + nnic - 1 (mod K) */
	int nqps;
	struct drill_qp qps[DRILL_MAX_QPS];
	int qp_index;  /* NCCL base.qpIndex */
	int dev_index; /* NCCL base.devIndex: the QP of the next clear-to-send */
	uint8_t *buf;
	uint64_t buf_len;
	int buf_fd; /* --flush: the receive ring's memfd while it may be registered again */
	struct ibv_mr *buf_mr[DRILL_MAX_NICS];
	struct ibv_mr *buf_mr_old[DRILL_MAX_NICS]; /* --fresh-mr: the first registrations */
	struct drill_ring ring;
	/* send: the FIFO the peer writes; recv: the elements written to the peer's FIFO,
	 * DRILL_MAX_RECVS elements of the pattern's size per slot */
	uint8_t *fifo;
	struct ibv_mr *fifo_mr[DRILL_MAX_NICS];
	uint64_t rem_fifo_addr;
	uint32_t rem_fifo_rkey[DRILL_MAX_NICS];
	uint64_t head;	  /* messages posted: NCCL fifoHead (send) / fifoTail (recv) */
	uint64_t retired; /* messages finished, in order */
	struct drill_msg msgs[DRILL_SLOTS];
	/* NCCL's comm->wrs / comm->sges: reused for every post */
	struct ibv_send_wr wrs[2];
	struct ibv_sge sges[1];
	/*
	 * --flush (receive connections): NCCL's gpuFlush, one loopback QP per NIC, and the
	 * scratch the READs land in: DRILL_FLUSH_ELEM bytes per request in flight (request
	 * seq uses element seq % window), DRILL_FLUSH_NIC of them per NIC. Per flush QP the
	 * messages whose READ is outstanding, in the order they were posted.
	 */
	struct drill_qp flush[DRILL_MAX_NICS];
	uint8_t *scratch;
	size_t scratch_len;
	struct ibv_mr *scratch_mr[DRILL_MAX_NICS];
	uint64_t flush_seq[DRILL_MAX_NICS][DRILL_MAX_WINDOW];
	uint64_t flush_head[DRILL_MAX_NICS], flush_tail[DRILL_MAX_NICS];
};

struct drill_ep_conn {
	uint32_t qpn[DRILL_MAX_QPS];
	uint64_t fifo_addr;
	uint32_t fifo_rkey[DRILL_MAX_NICS];
};

/* What a worker publishes for the others (NCCL's ncclIbConnectionMetadata). */
struct drill_ep {
	uint64_t magic;
	int32_t rank, nics;
	uint32_t lid[DRILL_MAX_NICS];
	uint32_t mtu[DRILL_MAX_NICS];
	uint8_t gid[DRILL_MAX_NICS][16];
	struct drill_ep_conn send[DRILL_MAX_PROCS]; /* my connection to peer p */
	struct drill_ep_conn recv[DRILL_MAX_PROCS]; /* my connection from peer p */
};

/* NCCL's ncclUniqueId: 128 opaque bytes, passed by value. */
struct drill_nccl_uid {
	char internal[128];
};

/*
 * With --nccl-stub the workers form an NCCL communicator (through the NCCL test double)
 * before they create any QP, as NCCL jobs do, so that libr2cc.so's NCCL wrappers see a
 * job: rank 0's ncclGetUniqueId, the id handed to every rank, ncclCommInitRank on all.
 */
struct drill_nccl {
	int (*get_unique_id)(struct drill_nccl_uid *);
	int (*comm_init_rank)(void **, int, struct drill_nccl_uid, int);
	int (*comm_destroy)(void *);
	/* --inject, --drill-plan: one ncclAllReduce, R2CC's first collective */
	int (*all_reduce)(const void *, void *, size_t, int, int, void *, void *);
	void *comm;
	bool coll_done;
	float coll_buf[2]; /* its send and receive buffers (the test double reads neither) */
};

/* nccl.h's ncclFloat32 and ncclSum */
#define DRILL_NCCL_FLOAT32 7
#define DRILL_NCCL_SUM	   0

struct drill_worker {
	const struct drill_opts *o;
	struct drill_status *st;
	struct drill_dev devs[DRILL_MAX_NICS];
	struct drill_conn *send[DRILL_MAX_PROCS];
	struct drill_conn *recv[DRILL_MAX_PROCS];
	struct drill_qp *qp_map[DRILL_QP_MAP];
	uint32_t qpn_map[DRILL_QP_MAP];
	bool ar;
	uint64_t ar_threshold;
	int corrupt_peer;
	uint64_t corrupt_seq;
	_Atomic bool failed;
	_Atomic int logged;
	bool rechecked;
	bool stopped_once;	 /* --fresh-mr */
	_Atomic bool churn_stop; /* --churn: the traffic is over */
	struct drill_ep ep;
	struct drill_ep peers[DRILL_MAX_PROCS];
	struct drill_nccl nccl;
};

/* --nccl-version's request slots: 64 or 256. */
static uint32_t drill_slots(const struct drill_worker *w)
{
	return (uint32_t)w->o->pattern->slots;
}

/* The i-th NIC of a connection. */
static int drill_conn_nic(const struct drill_worker *w, const struct drill_conn *c, int i)
{
	return (c->nic0 + i) % w->o->nics;
}

/* Slot `slot` of a connection's FIFO (DRILL_MAX_RECVS elements of the pattern's size). */
static uint8_t *drill_fifo_slot(const struct drill_worker *w, const struct drill_conn *c,
				uint32_t slot)
{
	return c->fifo + (size_t)slot * DRILL_MAX_RECVS * (size_t)w->o->pattern->elem;
}

/* Set by the handler, read by every thread of the worker: an atomic (lock-free,
 * so async-signal-safe). */
static _Atomic int drill_terminated;

static void drill_on_term(int sig)
{
	atomic_store(&drill_terminated, sig);
}

/* What a failure is: see struct drill_status. */
enum drill_fail_kind {
	DRILL_FAIL_OTHER, /* set-up, bootstrap */
	DRILL_FAIL_APP,	  /* an error NCCL would see */
	DRILL_FAIL_CHECK, /* corrupt, duplicate, out of order, late */
};

static void drill_fail(struct drill_worker *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int drill_gid_index(void);
static void drill_fail_app(struct drill_worker *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void drill_fail_check(struct drill_worker *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Records a failure: the first one (of each kind) goes to the status file, all count.
 * Thread-safe. */
static void drill_failv(struct drill_worker *w, enum drill_fail_kind kind, const char *fmt,
			va_list ap)
{
	struct drill_status *st = w->st;
	char msg[DRILL_ERR_LEN];
	int k = snprintf(msg, sizeof(msg), "node%d: ", w->o->rank);
	int64_t now = drill_now_ns();

	vsnprintf(msg + k, sizeof(msg) - (size_t)k, fmt, ap);
	atomic_fetch_add(&st->errors, 1);
	if (kind == DRILL_FAIL_APP) {
		atomic_fetch_add(&st->app_errors, 1);
		if (atomic_exchange(&st->app_claimed, 1) == 0) {
			memcpy(st->app_error, msg, sizeof(msg));
			atomic_store(&st->app_err_ns, now);
		}
	} else if (kind == DRILL_FAIL_CHECK) {
		atomic_fetch_add(&st->check_failures, 1);
		if (atomic_exchange(&st->check_claimed, 1) == 0) {
			memcpy(st->check_error, msg, sizeof(msg));
			atomic_store(&st->check_ns, now);
		}
	}
	if (atomic_exchange(&st->err_claimed, 1) == 0) {
		memcpy(st->error, msg, sizeof(msg));
		atomic_store(&st->err_ns, now);
	}
	if (atomic_fetch_add(&w->logged, 1) < DRILL_LOG_FAILURES)
		fprintf(stderr, "r2cc-verbs-drill: FAIL %s\n", msg);
	atomic_store(&w->failed, true);
}

static void drill_fail(struct drill_worker *w, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	drill_failv(w, DRILL_FAIL_OTHER, fmt, ap);
	va_end(ap);
}

static void drill_fail_app(struct drill_worker *w, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	drill_failv(w, DRILL_FAIL_APP, fmt, ap);
	va_end(ap);
}

static void drill_fail_check(struct drill_worker *w, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	drill_failv(w, DRILL_FAIL_CHECK, fmt, ap);
	va_end(ap);
}

/* The parent stops a worker with SIGTERM (deadline, or another node failed). */
static bool drill_stopped(struct drill_worker *w)
{
	/* Not a failure of its own: the parent knows why it stopped us. */
	if (drill_terminated && !atomic_exchange(&w->failed, true))
		fprintf(stderr,
			"r2cc-verbs-drill node%d: stopped by the drill (deadline or "
			"another node's failure)\n",
			w->o->rank);
	return atomic_load(&w->failed);
}

static const char *drill_nic(struct drill_worker *w, int dev)
{
	return w->devs[dev].name;
}

/* ---- completions arrive by QP number: a small open-addressing map ---- */

static int drill_qp_map_add(struct drill_worker *w, struct drill_qp *q)
{
	uint32_t qpn = q->qp->qp_num;

	for (uint32_t i = 0; i < DRILL_QP_MAP; i++) {
		uint32_t k = (qpn * 2654435761u + i) % DRILL_QP_MAP;

		if (!w->qp_map[k]) {
			w->qp_map[k] = q;
			w->qpn_map[k] = qpn;
			return 0;
		}
	}
	return -ENOSPC;
}

static struct drill_qp *drill_qp_find(struct drill_worker *w, uint32_t qpn)
{
	for (uint32_t i = 0; i < DRILL_QP_MAP; i++) {
		uint32_t k = (qpn * 2654435761u + i) % DRILL_QP_MAP;

		if (!w->qp_map[k])
			return NULL;
		if (w->qpn_map[k] == qpn)
			return w->qp_map[k];
	}
	return NULL;
}

/* ---- ring buffers: messages take contiguous, 128-byte-aligned room, freed in order ---- */

static bool drill_ring_alloc(struct drill_ring *r, uint64_t len, uint64_t *off, uint64_t *end)
{
	uint64_t need = (len + DRILL_ALIGN - 1) / DRILL_ALIGN * DRILL_ALIGN;
	uint64_t start = r->head, pos = r->head % r->size;

	if (pos + need > r->size)
		start += r->size - pos;
	if (start + need - r->tail > r->size)
		return false;
	*off = start % r->size;
	r->head = start + need;
	*end = r->head;
	return true;
}

/* ---- set-up, in the order NCCL's ncclIbInitDevices / connect / accept do it ---- */

static void *drill_async_main(void *arg)
{
	struct drill_dev *d = arg;
	struct drill_worker *w = d->w;
	struct ibv_async_event ev;

	while (drill_ibv.get_async_event(d->ctx, &ev) == 0) {
		const char *what = drill_ibv.event_type_str(ev.event_type);

		switch (ev.event_type) {
		case IBV_EVENT_DEVICE_FATAL:
		case IBV_EVENT_CQ_ERR:
		case IBV_EVENT_QP_FATAL:
		case IBV_EVENT_QP_REQ_ERR:
		case IBV_EVENT_QP_ACCESS_ERR:
			/* NCCL 2.23+ counts these and fails the communicator. */
			drill_fail_app(w, "async fatal event on %s: %s (%d)", d->name, what,
				       ev.event_type);
			break;
		case IBV_EVENT_COMM_EST:
			break;
		default:
			atomic_fetch_add(&w->st->async_events, 1);
			fprintf(stderr,
				"r2cc-verbs-drill node%d: %s: non-fatal async event: %s (%d)\n",
				w->o->rank, d->name, what, ev.event_type);
			break;
		}
		drill_ibv.ack_async_event(&ev);
	}
	return NULL;
}

static int drill_devs_open(struct drill_worker *w)
{
	const struct drill_opts *o = w->o;
	struct ibv_device **list;
	int n = 0, cqe = 2 * o->pattern->slots * 2 * (o->procs - 1) * o->qps;
	const char *env;

	drill_ibv.fork_init();
	list = drill_ibv.get_device_list(&n);
	if (!list) {
		drill_fail_app(w, "ibv_get_device_list: %s", strerror(errno));
		return -1;
	}
	if (n < o->nics) {
		drill_fail(w, "%d NICs found, %d wanted", n, o->nics);
		return -1;
	}
	w->ar = true;
	for (int i = 0; i < o->nics; i++) {
		struct drill_dev *d = &w->devs[i];
		struct ibv_device_attr da;
		struct ibv_port_attr pa;
		union ibv_gid gid;
		pthread_t t;

		d->index = i;
		d->w = w;
		snprintf(d->name, sizeof(d->name), "%s", drill_ibv.get_device_name(list[i]));
		d->ctx = drill_ibv.open_device(list[i]);
		if (!d->ctx) {
			drill_fail_app(w, "ibv_open_device %s: %s", d->name, strerror(errno));
			return -1;
		}
		memset(&da, 0, sizeof(da));
		memset(&pa, 0, sizeof(pa));
		if (drill_ibv.query_device(d->ctx, &da) || drill_ibv.query_port(d->ctx, 1, &pa) ||
		    drill_ibv.query_gid(d->ctx, 1, 0, &gid)) {
			drill_fail_app(w, "query of %s failed", d->name);
			return -1;
		}
		if (pa.state != IBV_PORT_ACTIVE) {
			drill_fail_app(w, "%s port 1 is not active (state %d)", d->name, pa.state);
			return -1;
		}
		d->lid = pa.lid;
		d->mtu = pa.active_mtu;
		/* On Ethernet, NCCL addresses its peers by the GID NCCL_IB_GID_INDEX names
		 * (the drill's default: 3, RoCE v2 over IPv4) with NCCL_IB_TC's class. */
		d->eth = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
		if (d->eth && drill_ibv.query_gid(d->ctx, 1, drill_gid_index(), &d->gid)) {
			drill_fail_app(w, "query of %s's GID %d failed", d->name,
				       drill_gid_index());
			return -1;
		}
		/* NCCL turns adaptive routing on for InfiniBand unless told otherwise. */
		d->ar = pa.link_layer == IBV_LINK_LAYER_INFINIBAND;
		w->ar = w->ar && d->ar;
		if (da.max_cqe > 0 && cqe > da.max_cqe)
			cqe = da.max_cqe;
		if (pthread_create(&t, NULL, drill_async_main, d) == 0) {
			pthread_setname_np(t, "drill-async");
			pthread_detach(t);
		}
		d->pd = drill_ibv.alloc_pd(d->ctx);
		if (!d->pd) {
			drill_fail_app(w, "ibv_alloc_pd %s: %s", d->name, strerror(errno));
			return -1;
		}
		d->cq = drill_ibv.create_cq(d->ctx, cqe, d, NULL, 0);
		if (!d->cq) {
			drill_fail_app(w, "ibv_create_cq %s (%d entries): %s", d->name, cqe,
				       strerror(errno));
			return -1;
		}
	}
	drill_ibv.free_device_list(list);
	env = getenv("NCCL_IB_ADAPTIVE_ROUTING");
	if (env && *env)
		w->ar = atoi(env) != 0;
	env = getenv("NCCL_IB_AR_THRESHOLD");
	w->ar_threshold = env && *env ? strtoull(env, NULL, 0) : 8192;
	return 0;
}

/* ncclIbCreateQp: the same attributes for data and flush QPs, only the access differs. */
static int drill_qp_create(struct drill_worker *w, struct drill_conn *c, struct drill_qp *qp,
			   int dev, int index, int access)
{
	const struct drill_opts *o = w->o;
	struct drill_dev *d = &w->devs[dev];
	struct ibv_qp_init_attr ia;
	struct ibv_qp_attr a;
	int rc;

	memset(&ia, 0, sizeof(ia));
	ia.qp_context = c;
	ia.send_cq = d->cq;
	ia.recv_cq = d->cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 2 * o->pattern->slots;
	ia.cap.max_recv_wr = o->pattern->slots;
	/* 2.29 on: the QPs that receive nothing have no receive queue (a flush QP: 256 sends) */
	if (o->pattern->send_no_rq && (c->send || qp->flush)) {
		ia.cap.max_recv_wr = 0;
		if (qp->flush)
			ia.cap.max_send_wr = o->pattern->slots;
	}
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	ia.cap.max_inline_data = 0;
	if (o->mlx5dv && !qp->flush) {
		/* NCCL 2.30's NCCL_IB_OOO_RQ=1 QPs (--mlx5dv ooo), or plain ones by the same
		 * call (--mlx5dv plain) */
		struct ibv_qp_init_attr_ex ix;
		memset(&ix, 0, sizeof(ix));
		memcpy(&ix, &ia, sizeof(ia));
		ix.comp_mask = IBV_QP_INIT_ATTR_PD;
		ix.pd = d->pd;
		struct mlx5dv_qp_init_attr mx = {
		    .comp_mask = o->mlx5dv == 2 ? MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS : 0,
		    .create_flags = o->mlx5dv == 2 ? 1u << 7 /* MLX5DV_QP_CREATE_OOO_DP */ : 0,
		};
		qp->qp = drill_mlx5dv_create_qp(d->ctx, &ix, &mx);
	} else {
		qp->qp = drill_ibv.create_qp(d->pd, &ia);
	}
	if (!qp->qp) {
		drill_fail_app(w, "%s on %s: %s",
			       o->mlx5dv && !qp->flush ? "mlx5dv_create_qp" : "ibv_create_qp",
			       d->name, strerror(errno));
		return -1;
	}
	qp->dev = d->index;
	qp->conn = c;
	qp->index = index;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = 1;
	a.qp_access_flags = access;
	rc = drill_ibv.modify_qp(
	    qp->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (rc) {
		drill_fail_app(w, "modify_qp INIT on %s: %s", d->name, strerror(rc));
		return -1;
	}
	if (drill_qp_map_add(w, qp)) {
		drill_fail(w, "too many QPs");
		return -1;
	}
	return 0;
}

static struct ibv_mr *drill_reg(struct drill_worker *w, int dev, void *p, size_t len, int access)
{
	struct ibv_mr *mr = drill_ibv.reg_mr(w->devs[dev].pd, p, len, access);

	if (!mr)
		drill_fail_app(w, "ibv_reg_mr of %zu bytes on %s: %s", len, w->devs[dev].name,
			       strerror(errno));
	return mr;
}

/* A connection's data ring on NIC dev: device memory (a dmabuf MR) with --flush. */
static struct ibv_mr *drill_reg_ring(struct drill_worker *w, struct drill_conn *c, int dev,
				     int access)
{
	struct ibv_mr *mr;

	if (c->buf_fd < 0)
		return drill_reg(w, dev, c->buf, c->buf_len, access);
	/* --mlx5dv: as NCCL's data direct registers device memory (no mlx5 access flag:
	 * the device has no data direct) */
	bool dv = w->o->mlx5dv && drill_mlx5dv_reg_dmabuf_mr;
	mr = dv ? drill_mlx5dv_reg_dmabuf_mr(w->devs[dev].pd, 0, c->buf_len, (uintptr_t)c->buf,
					     c->buf_fd, access, 0)
		: drill_reg_dmabuf_mr(w->devs[dev].pd, 0, c->buf_len, (uintptr_t)c->buf, c->buf_fd,
				      access);
	if (!mr)
		drill_fail_app(w, "%s of %llu bytes on %s: %s",
			       dv ? "mlx5dv_reg_dmabuf_mr" : "ibv_reg_dmabuf_mr",
			       (unsigned long long)c->buf_len, w->devs[dev].name, strerror(errno));
	return mr;
}

/* Builds one connection; it is in w->send/w->recv from the start so teardown finds it. */
static int drill_conn_create(struct drill_worker *w, int peer, bool send)
{
	const struct drill_opts *o = w->o;
	uint64_t max = (o->max_size + DRILL_ALIGN - 1) / DRILL_ALIGN * DRILL_ALIGN;
	size_t fifo_len = (size_t)o->pattern->elem * o->pattern->slots * DRILL_MAX_RECVS;
	struct drill_conn *c = calloc(1, sizeof(*c));
	struct drill_ep_conn *e;

	if (!c) {
		drill_fail(w, "out of memory");
		return -1;
	}
	if (send)
		w->send[peer] = c;
	else
		w->recv[peer] = c;
	c->send = send;
	c->peer = peer;
	/*
	 * A fused virtual NIC of every NIC (2.20 on, the drill's model), or, before NIC
	 * fusion, one NIC per connection (drill_pair_nic).
	 */
	c->nic0 = 0;
	c->nnic = o->nics;
	if (o->pattern->one_nic || o->no_fusion) {
		c->nic0 =
		    send ? drill_pair_nic(o, o->rank, peer) : drill_pair_nic(o, peer, o->rank);
		c->nnic = 1;
	}
	c->nqps = c->nnic * o->qps;
	c->buf_len = 2 * max > (1u << 20) ? 2 * max : (1u << 20);
	c->ring.size = c->buf_len;
	/* --flush: a receive ring is device memory, a buffer registered through
	 * ibv_reg_dmabuf_mr as NCCL registers GPU memory (here a memfd) */
	c->buf_fd = o->flush && !send ? memfd_create("drill-ring", MFD_CLOEXEC) : -1;
	if (c->buf_fd >= 0 && ftruncate(c->buf_fd, (off_t)c->buf_len) != 0) {
		drill_fail(w, "cannot size a %llu-byte memfd: %s", (unsigned long long)c->buf_len,
			   strerror(errno));
		return -1;
	}
	if (o->flush && !send && (c->buf_fd < 0 || !drill_reg_dmabuf_mr)) {
		drill_fail(w, "--flush needs memfd_create and ibv_reg_dmabuf_mr");
		return -1;
	}
	c->buf = c->buf_fd >= 0
		     ? mmap(NULL, c->buf_len, PROT_READ | PROT_WRITE, MAP_SHARED, c->buf_fd, 0)
		     : mmap(NULL, c->buf_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			    -1, 0);
	c->fifo = mmap(NULL, fifo_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (c->buf == MAP_FAILED || c->fifo == MAP_FAILED) {
		drill_fail(w, "cannot map %llu bytes of buffers", (unsigned long long)c->buf_len);
		return -1;
	}
	e = send ? &w->ep.send[peer] : &w->ep.recv[peer];
	for (int q = 0; q < c->nqps; q++) {
		if (drill_qp_create(w, c, &c->qps[q], drill_conn_nic(w, c, q % c->nnic), q,
				    send ? IBV_ACCESS_REMOTE_WRITE
					 : IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC))
			return -1;
		e->qpn[q] = c->qps[q].qp->qp_num;
	}
	for (int i = 0; i < c->nnic; i++) {
		int access =
		    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
		int d = drill_conn_nic(w, c, i);

		c->buf_mr[d] = drill_reg_ring(w, c, d, access);
		c->fifo_mr[d] = drill_reg(w, d, c->fifo, fifo_len, access);
		if (!c->buf_mr[d] || !c->fifo_mr[d])
			return -1;
		e->fifo_rkey[d] = c->fifo_mr[d]->rkey;
	}
	/* NCCL closes a dmabuf's fd once it is registered (R2CC mirrors it before);
	 * --fresh-mr registers the ring again later and keeps it */
	if (c->buf_fd >= 0 && !o->fresh_mr) {
		close(c->buf_fd);
		c->buf_fd = -1;
	}
	e->fifo_addr = (uintptr_t)c->fifo;
	return 0;
}

/* NCCL_IB_GID_INDEX (default 3 here) and NCCL_IB_TC (default 0), as NCCL reads them. */
static int drill_env_int(const char *name, int dflt, int max)
{
	const char *v = getenv(name);
	char *end;
	long n = v && *v ? strtol(v, &end, 10) : dflt;

	return v && *v && (*end || n < 0 || n > max) ? dflt : (int)n;
}

static int drill_gid_index(void)
{
	return drill_env_int("NCCL_IB_GID_INDEX", 3, 255);
}

/* INIT -> RTR -> RTS with NCCL's attributes (ncclIbRtrQp / ncclIbRtsQp). */
/*
 * RTR and RTS towards dqpn, the peer's QP on its NIC of the same number (rails), as
 * NCCL's ncclIbRtrQp and ncclIbRtsQp do. 0, or the failed call's error (*what says
 * which).
 */
static int drill_rtr_rts(struct drill_worker *w, struct ibv_qp *qp, int dev, uint32_t dqpn,
			 const struct drill_ep *pe, const char **what)
{
	struct ibv_qp_attr a;
	int rc;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = w->devs[dev].mtu < (enum ibv_mtu)pe->mtu[dev] ? w->devs[dev].mtu
								   : (enum ibv_mtu)pe->mtu[dev];
	a.dest_qp_num = dqpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 0;
	a.ah_attr.dlid = (uint16_t)pe->lid[dev];
	if (w->devs[dev].eth) {
		a.ah_attr.is_global = 1;
		memcpy(a.ah_attr.grh.dgid.raw, pe->gid[dev], 16);
		a.ah_attr.grh.sgid_index = (uint8_t)drill_gid_index();
		a.ah_attr.grh.hop_limit = 255;
		a.ah_attr.grh.traffic_class = (uint8_t)drill_env_int("NCCL_IB_TC", 0, 255);
	}
	a.ah_attr.sl = 0;
	a.ah_attr.src_path_bits = 0;
	a.ah_attr.port_num = 1;
	*what = "RTR";
	rc = drill_ibv.modify_qp(qp, &a,
				 IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				     IBV_QP_MIN_RNR_TIMER);
	if (rc)
		return rc;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = (uint8_t)w->o->qp_timeout;
	a.retry_cnt = (uint8_t)w->o->retry_cnt;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	*what = "RTS";
	return drill_ibv.modify_qp(qp, &a,
				   IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				       IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static int drill_qp_connect(struct drill_worker *w, struct drill_qp *q, uint32_t dqpn,
			    const struct drill_ep *pe)
{
	const char *what = "";
	int rc;

	q->rem_dev = q->dev; /* rails: the peer's QP is on its NIC of the same number */
	rc = drill_rtr_rts(w, q->qp, q->dev, dqpn, pe, &what);
	if (rc) {
		drill_fail_app(w, "modify_qp %s (qpn 0x%06x): %s", what, q->qp->qp_num,
			       strerror(rc));
		return -1;
	}
	return 0;
}

/*
 * --flush: NCCL's GPU flush set-up (ncclIbAccept, per NIC of a receive connection, once
 * its data QPs are in RTS): the scratch registered with LOCAL_WRITE, an RC QP on the
 * NIC's CQ with LOCAL_WRITE|REMOTE_READ, brought to RTR towards itself (its own QP
 * number, its own NIC's LID and MTU) and to RTS with the data QPs' attributes.
 */
static int drill_flush_create(struct drill_worker *w, struct drill_conn *c)
{
	const struct drill_opts *o = w->o;

	c->scratch_len = (size_t)o->window * DRILL_FLUSH_ELEM;
	c->scratch =
	    mmap(NULL, c->scratch_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (c->scratch == MAP_FAILED) {
		c->scratch = NULL;
		drill_fail(w, "cannot map %zu bytes of flush scratch", c->scratch_len);
		return -1;
	}
	for (int i = 0; i < c->nnic; i++) {
		int d = drill_conn_nic(w, c, i);
		struct drill_qp *q = &c->flush[d];

		c->scratch_mr[d] =
		    drill_reg(w, d, c->scratch, c->scratch_len, IBV_ACCESS_LOCAL_WRITE);
		if (!c->scratch_mr[d])
			return -1;
		q->flush = true;
		if (drill_qp_create(w, c, q, d, d,
				    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ) ||
		    drill_qp_connect(w, q, q->qp->qp_num, &w->ep))
			return -1;
	}
	return 0;
}

/* ---- the idle loop: poll, then give the (shared, small) machine back ---- */

/* How long the idle loop spins and yields before it sleeps. More workers than
 * DRILL_FULL_PROCS share the CPUs with each other's device engines and R2CC's
 * threads: they give the CPU back sooner, or the progress they wait for is
 * what they starve. */
static unsigned backoff_spin = 64, backoff_yield = 4096;

static void drill_backoff(unsigned *idle)
{
	struct timespec ts = {0, 20000};

	if (++*idle < backoff_spin)
		return;
	if (*idle < backoff_yield)
		sched_yield();
	else
		nanosleep(&ts, NULL);
}

static int drill_poll(struct drill_worker *w, bool *progress);

/* Waits for <name>.<p> of every worker (or of `only` when >= 0), polling the CQs
 * meanwhile when `poll`. */
static int drill_wait_marks(struct drill_worker *w, const char *name, bool poll, int only)
{
	int64_t deadline = drill_now_ns() + (int64_t)(w->o->timeout_s * 1e9);
	unsigned idle = 0;
	int p, end = only >= 0 ? only + 1 : w->o->procs;

	for (p = only >= 0 ? only : 0; p < end;) {
		bool progress = false;

		if (drill_file_exists(w->o->dir, name, p)) {
			p++;
			continue;
		}
		if (poll && drill_poll(w, &progress))
			return -1;
		if (drill_stopped(w))
			return -1;
		if (drill_now_ns() > deadline) {
			drill_fail(w, "bootstrap: timed out waiting for node%d's '%s'", p, name);
			return -1;
		}
		if (!poll) {
			struct timespec ts = {0, 1000000};

			nanosleep(&ts, NULL);
		} else {
			drill_backoff(&idle);
		}
	}
	return 0;
}

static int drill_barrier(struct drill_worker *w, const char *name, bool poll)
{
	return drill_wait_marks(w, name, poll, -1);
}

static int drill_barrier_one(struct drill_worker *w, const char *name, int rank)
{
	return drill_wait_marks(w, name, false, rank);
}

/*
 * --fault-phase connect: the parent injects the fault once every endpoint file is there
 * and then writes fault.0; the workers hold (QPs in INIT, or in RTS) until it is there,
 * so the fault is in before any traffic, whatever the timing.
 */
static int drill_hold(struct drill_worker *w, enum drill_hold where)
{
	if (w->o->hold != (int)where)
		return 0;
	fprintf(stderr, "r2cc-verbs-drill node%d: holding (QPs in %s) until the fault is in\n",
		w->o->rank, where == DRILL_HOLD_INIT ? "INIT" : "RTS");
	return drill_barrier_one(w, "fault", 0);
}

/* Looked up in the global scope, so that a preloaded wrapper comes first, as for an
 * application linked with -lnccl. */
static int drill_nccl_init(struct drill_worker *w)
{
	const struct drill_opts *o = w->o;
	int64_t deadline = drill_now_ns() + (int64_t)(o->timeout_s * 1e9);
	struct timespec ts = {0, 1000000};
	struct drill_nccl *n = &w->nccl;
	struct drill_nccl_uid uid;
	int rc;

	if (!dlopen(o->nccl_lib, RTLD_NOW | RTLD_GLOBAL)) {
		drill_fail(w, "cannot dlopen %s: %s", o->nccl_lib, dlerror());
		return -1;
	}
	*(void **)&n->get_unique_id = dlsym(RTLD_DEFAULT, "ncclGetUniqueId");
	*(void **)&n->comm_init_rank = dlsym(RTLD_DEFAULT, "ncclCommInitRank");
	*(void **)&n->comm_destroy = dlsym(RTLD_DEFAULT, "ncclCommDestroy");
	*(void **)&n->all_reduce = dlsym(RTLD_DEFAULT, "ncclAllReduce");
	if (!n->get_unique_id || !n->comm_init_rank || !n->comm_destroy ||
	    (o->coll_at && !n->all_reduce)) {
		drill_fail(w,
			   "%s lacks ncclGetUniqueId/ncclCommInitRank/ncclCommDestroy/"
			   "ncclAllReduce",
			   o->nccl_lib);
		return -1;
	}
	if (o->rank == 0) {
		rc = n->get_unique_id(&uid);
		if (rc) {
			drill_fail(w, "ncclGetUniqueId: NCCL error %d", rc);
			return -1;
		}
		rc = drill_file_put(o->dir, "uid", 0, &uid, sizeof(uid));
		if (rc) {
			drill_fail(w, "bootstrap: cannot write the unique id: %s", strerror(-rc));
			return -1;
		}
	}
	while ((rc = drill_file_get(o->dir, "uid", 0, &uid, sizeof(uid))) == -EAGAIN) {
		if (drill_stopped(w))
			return -1;
		if (drill_now_ns() > deadline) {
			drill_fail(w, "bootstrap: timed out waiting for node0's unique id");
			return -1;
		}
		nanosleep(&ts, NULL);
	}
	if (rc) {
		drill_fail(w, "bootstrap: bad unique id file: %s", strerror(-rc));
		return -1;
	}
	rc = n->comm_init_rank(&n->comm, o->procs, uid, o->rank);
	if (rc) {
		drill_fail(w, "ncclCommInitRank: NCCL error %d", rc);
		return -1;
	}
	return 0;
}

static int drill_setup(struct drill_worker *w)
{
	const struct drill_opts *o = w->o;
	int64_t deadline;
	int rc;

	if (o->nccl_lib && drill_nccl_init(w))
		return -1;
	if (drill_devs_open(w))
		return -1;
	w->ep.magic = DRILL_EP_MAGIC;
	w->ep.rank = o->rank;
	w->ep.nics = o->nics;
	for (int d = 0; d < o->nics; d++) {
		w->ep.lid[d] = w->devs[d].lid;
		w->ep.mtu[d] = w->devs[d].mtu;
		memcpy(w->ep.gid[d], w->devs[d].gid.raw, 16);
	}
	for (int p = 0; p < o->procs; p++) {
		if (p == o->rank)
			continue;
		if (drill_conn_create(w, p, true) || drill_conn_create(w, p, false))
			return -1;
	}
	rc = drill_file_put(o->dir, "ep", o->rank, &w->ep, sizeof(w->ep));
	if (rc) {
		drill_fail(w, "bootstrap: cannot write my endpoints: %s", strerror(-rc));
		return -1;
	}
	atomic_store(&w->st->phase, DRILL_PHASE_CONNECT);
	deadline = drill_now_ns() + (int64_t)(o->timeout_s * 1e9);
	for (int p = 0; p < o->procs; p++) {
		struct drill_ep *pe = &w->peers[p];
		struct timespec ts = {0, 1000000};

		if (p == o->rank)
			continue;
		while ((rc = drill_file_get(o->dir, "ep", p, pe, sizeof(*pe))) == -EAGAIN) {
			if (drill_stopped(w))
				return -1;
			if (drill_now_ns() > deadline) {
				drill_fail(w, "bootstrap: timed out waiting for node%d's endpoints",
					   p);
				return -1;
			}
			nanosleep(&ts, NULL);
		}
		if (rc || pe->magic != DRILL_EP_MAGIC || pe->rank != p || pe->nics != o->nics) {
			drill_fail(w, "bootstrap: bad endpoint file from node%d", p);
			return -1;
		}
	}
	if (drill_hold(w, DRILL_HOLD_INIT))
		return -1;
	for (int p = 0; p < o->procs; p++) {
		struct drill_conn *s = w->send[p], *r = w->recv[p];

		if (p == o->rank)
			continue;
		/* My send connection to p meets p's receive connection from me, QP q to QP q. */
		for (int q = 0; q < s->nqps; q++) {
			if (drill_qp_connect(w, &s->qps[q], w->peers[p].recv[o->rank].qpn[q],
					     &w->peers[p]) ||
			    drill_qp_connect(w, &r->qps[q], w->peers[p].send[o->rank].qpn[q],
					     &w->peers[p]))
				return -1;
		}
		r->rem_fifo_addr = w->peers[p].send[o->rank].fifo_addr;
		memcpy(r->rem_fifo_rkey, w->peers[p].send[o->rank].fifo_rkey,
		       sizeof(r->rem_fifo_rkey));
		if (o->flush && drill_flush_create(w, r))
			return -1;
	}
	if (drill_hold(w, DRILL_HOLD_RTS))
		return -1;
	rc = drill_file_put(o->dir, "ready", o->rank, &o->rank, sizeof(o->rank));
	if (rc) {
		drill_fail(w, "bootstrap: cannot write my ready mark: %s", strerror(-rc));
		return -1;
	}
	return drill_barrier(w, "ready", false);
}

/* ---- receiver: ncclIbIrecv + ncclIbPostFifo ---- */

/* A message slot taken for message seq, owing one completion per QP. */
static struct drill_msg *drill_msg_start(struct drill_conn *c, uint32_t slot, uint64_t seq,
					 uint64_t size, uint64_t off, uint64_t end)
{
	struct drill_msg *m = &c->msgs[slot];
	memset(m, 0, sizeof(*m));
	m->seq = seq;
	m->size = size;
	m->off = off;
	m->end = end;
	m->events = c->nqps;
	m->inflight = true;
	return m;
}

/* A shell that continues this process ms from now (spawned: no fork handlers
 * run); -1 if none could be started. */
static pid_t drill_continue_in(int ms)
{
	char cmd[64];
	char *argv[] = {(char *)"/bin/sh", (char *)"-c", cmd, NULL};
	extern char **environ;
	pid_t k;

	snprintf(cmd, sizeof(cmd), "sleep %d.%03d; kill -CONT %d", ms / 1000, ms % 1000,
		 (int)getpid());
	return posix_spawn(&k, "/bin/sh", NULL, NULL, argv, environ) == 0 ? k : -1;
}

static bool drill_recv_post(struct drill_worker *w, struct drill_conn *c)
{
	const struct drill_opts *o = w->o;
	struct ibv_recv_wr rwr, *bad_rwr;
	struct ibv_send_wr swr, *bad_swr;
	struct drill_fifo_elem elem;
	struct drill_qp *cts;
	struct ibv_sge sge;
	struct drill_msg *m;
	uint64_t seq = c->head, size, off, end;
	uint32_t slot = (uint32_t)(seq % drill_slots(w));
	uint8_t *local = drill_fifo_slot(w, c, slot);
	int rc, di;

	if (seq >= (uint64_t)o->messages || seq - c->retired >= (uint64_t)o->window)
		return false;
	size = drill_msg_size(o->seed, c->peer, o->rank, seq, o->max_size);
	if (!drill_ring_alloc(&c->ring, size, &off, &end))
		return false;
	m = drill_msg_start(c, slot, seq, size, off, end);

	memset(&rwr, 0, sizeof(rwr));
	rwr.wr_id = slot;
	rwr.sg_list = NULL;
	rwr.num_sge = 0;
	for (int i = 0; i < c->nqps; i++) {
		struct drill_qp *q = &c->qps[c->qp_index];

		rc = q->qp->context->ops.post_recv(q->qp, &rwr, &bad_rwr);
		if (rc) {
			drill_fail_app(w, "post_recv on %s (qpn 0x%06x): %s", drill_nic(w, q->dev),
				       q->qp->qp_num, strerror(rc));
			return false;
		}
		c->qp_index = (c->qp_index + 1) % c->nqps;
	}

	/* --fresh-mr: the ring registered again 3/4 in (not before the fault is in), as
	 * NCCL registers a user buffer mid-job; the old registrations stay for the writes
	 * still aimed at them. */
	const struct drill_status *all = w->st - o->rank;
	bool fresh = o->fresh_mr && !c->buf_mr_old[drill_conn_nic(w, c, 0)] &&
		     seq >= (uint64_t)o->messages * 3 / 4 &&
		     (!atomic_load(&all[0].hold_at) || atomic_load(&all[0].fault_done));
	for (int i = 0; fresh && i < c->nnic; i++) {
		int d = drill_conn_nic(w, c, i);
		struct ibv_mr *mr = drill_reg_ring(
		    w, c, d,
		    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);

		if (!mr)
			return false;
		c->buf_mr_old[d] = c->buf_mr[d];
		c->buf_mr[d] = mr;
	}

	memset(&elem, 0, sizeof(elem));
	elem.addr = (uintptr_t)(c->buf + off);
	elem.size = size;
	for (int i = 0; i < c->nnic; i++)
		elem.rkeys[i] = c->buf_mr[drill_conn_nic(w, c, i)]->rkey;
	elem.nreqs = 1;
	elem.tag = (uint32_t)c->peer;
	elem.idx = seq + 1;
	drill_fifo_put(o->pattern, local, &elem);

	/* devIndex: the connection's NICs in turn (one NIC: always qps[0]) */
	di = c->dev_index;
	cts = &c->qps[di];
	c->dev_index = (di + 1) % c->nnic;
	sge.addr = (uintptr_t)local;
	sge.length = (uint32_t)o->pattern->elem;
	sge.lkey = c->fifo_mr[cts->dev]->lkey;
	memset(&swr, 0, sizeof(swr));
	swr.wr.rdma.remote_addr =
	    c->rem_fifo_addr + (uint64_t)slot * DRILL_MAX_RECVS * (uint64_t)o->pattern->elem;
	swr.wr.rdma.rkey = c->rem_fifo_rkey[cts->rem_dev];
	swr.sg_list = &sge;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_RDMA_WRITE;
	swr.send_flags = 0;
	/* NCCL signals only when slot == devIndex, which drains each FIFO QP now and then. */
	if (slot == (uint32_t)di) {
		swr.send_flags |= IBV_SEND_SIGNALED;
		swr.wr_id = slot;
		m->events++;
		m->cts_pending = true;
	}
	/* --fresh-mr, the faulted node once: the whole process (R2CC's threads too) stops for 1 s
	 * right after this clear-to-send with the new keys, a peer whose control plane
	 * cannot answer while the sender posts to them */
	pid_t cont = -1;
	if (fresh && !w->stopped_once && getenv("DRILL_FRESH_STOP") &&
	    atoi(getenv("DRILL_FRESH_STOP")) == o->rank) {
		w->stopped_once = true;
		cont = drill_continue_in(1000);
	}
	rc = cts->qp->context->ops.post_send(cts->qp, &swr, &bad_swr);
	if (cont > 0) {
		raise(SIGSTOP);
		waitpid(cont, NULL, 0);
	}
	if (rc) {
		drill_fail_app(w, "post_send (clear-to-send) on %s (qpn 0x%06x): %s",
			       drill_nic(w, cts->dev), cts->qp->qp_num, strerror(rc));
		return false;
	}
	c->head++;
	return true;
}

static void drill_recv_deliver(struct drill_worker *w, struct drill_msg *m)
{
	atomic_fetch_add(&w->st->delivered, 1);
	m->done = true;
}

/* Where NIC dev's flush READ for message m lands: the request's scratch element. */
static uint8_t *drill_flush_dst(struct drill_worker *w, struct drill_conn *c,
				const struct drill_msg *m, int dev)
{
	return c->scratch + (m->seq % (uint64_t)w->o->window) * DRILL_FLUSH_ELEM +
	       (size_t)dev * DRILL_FLUSH_NIC;
}

/* The first DRILL_FLUSH_NIC bytes of message seq's pattern (past its end too). */
static void drill_flush_want(struct drill_worker *w, struct drill_conn *c, uint64_t seq,
			     uint8_t *want)
{
	drill_pattern_fill(want, DRILL_FLUSH_NIC,
			   drill_msg_key(w->o->seed, c->peer, w->o->rank, seq));
}

/*
 * --flush: ncclIbIflush. Once a non-empty receive is complete (NCCL flushes only the
 * last non-empty receive of a request), on every NIC of the connection ("we don't know
 * which devIndex the recv was on") one signalled RDMA READ on that NIC's flush QP,
 * wr_id = the request slot, from the start of the received data (the ring's rkey on
 * that NIC) into the request's scratch (its lkey on that NIC). NCCL reads 1 byte and
 * never looks at it; the drill reads 1..8 (drawn from the seed) and checks them. The
 * NIC's 16 bytes are primed with the complement of the pattern, so a READ that did not
 * land, or landed long, shows.
 */
static void drill_flush_post(struct drill_worker *w, struct drill_conn *c, struct drill_msg *m)
{
	const struct drill_opts *o = w->o;
	uint64_t h =
	    drill_hash(o->seed ^ 0x464c555348ull, (uint64_t)c->peer, (uint64_t)o->rank, m->seq);
	uint8_t want[DRILL_FLUSH_NIC];

	m->flush_len = (uint32_t)(1 + h % DRILL_FLUSH_MAX);
	if (m->flush_len > m->size)
		m->flush_len = (uint32_t)m->size;
	drill_flush_want(w, c, m->seq, want);
	for (int k = 0; k < c->nnic; k++) {
		int d = drill_conn_nic(w, c, k);
		struct drill_qp *q = &c->flush[d];
		uint8_t *dst = drill_flush_dst(w, c, m, d);
		struct ibv_send_wr wr, *bad;
		struct ibv_sge sge;
		int rc;

		for (int i = 0; i < DRILL_FLUSH_NIC; i++)
			dst[i] = (uint8_t)~want[i];
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = m->seq % drill_slots(w);
		wr.wr.rdma.remote_addr = (uintptr_t)(c->buf + m->off);
		wr.wr.rdma.rkey = c->buf_mr[d]->rkey;
		sge.addr = (uintptr_t)dst;
		sge.length = m->flush_len;
		sge.lkey = c->scratch_mr[d]->lkey;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_RDMA_READ;
		wr.send_flags = IBV_SEND_SIGNALED;
		rc = q->qp->context->ops.post_send(q->qp, &wr, &bad);
		if (rc) {
			drill_fail_app(w, "post_send (flush) on %s (qpn 0x%06x): %s",
				       drill_nic(w, d), q->qp->qp_num, strerror(rc));
			return;
		}
		c->flush_seq[d][c->flush_head[d]++ % DRILL_MAX_WINDOW] = m->seq;
		m->flush_pending |= 1u << d;
	}
}

static void drill_recv_check(struct drill_worker *w, struct drill_conn *c, struct drill_msg *m)
{
	const struct drill_opts *o = w->o;
	uint8_t *p = c->buf + m->off, got = 0, want = 0;
	uint64_t first = 0, bad;

	if (o->selftest_corrupt && c->peer == w->corrupt_peer && m->seq == w->corrupt_seq) {
		p[m->size / 2] ^= 0x5a;
		fprintf(stderr,
			"r2cc-verbs-drill node%d: self-test: flipped byte %llu of message %llu "
			"from node%d after delivery\n",
			o->rank, (unsigned long long)(m->size / 2), (unsigned long long)m->seq,
			c->peer);
	}
	bad = drill_pattern_check(p, m->size, drill_msg_key(o->seed, c->peer, o->rank, m->seq),
				  &first, &got, &want);
	if (bad) {
		drill_fail_check(
		    w,
		    "message %llu from node%d (%llu bytes) corrupt: %llu byte(s) differ, "
		    "first at offset %llu (got 0x%02x, want 0x%02x)",
		    (unsigned long long)m->seq, c->peer, (unsigned long long)m->size,
		    (unsigned long long)bad, (unsigned long long)first, got, want);
		return;
	}
	if (o->flush && m->size)
		drill_flush_post(w, c, m);
	else
		drill_recv_deliver(w, m);
}

/* ---- sender: ncclIbIsend + ncclIbMultiSend (one request per FIFO slot) ---- */

static int drill_multi_send(struct drill_worker *w, struct drill_conn *c, uint32_t slot,
			    const struct drill_fifo_elem *e, const uint8_t *src, uint64_t size)
{
	struct ibv_send_wr *wr = &c->wrs[0], *last, *bad;
	struct ibv_sge *sge = &c->sges[0];
	uint64_t wr_id = (uint64_t)slot; /* up to 8 request indices, 8 bits each; here one */
	int chunk, offset = 0;

	memset(wr, 0, sizeof(*wr));
	sge->addr = (uintptr_t)src;
	wr->opcode = IBV_WR_RDMA_WRITE;
	wr->send_flags = 0;
	wr->wr.rdma.remote_addr = e->addr;
	wr->next = wr + 1;

	last = wr;
	if (w->ar && size > w->ar_threshold) {
		/* Adaptive routing: the data as plain writes, then a zero-byte write with IMM. */
		last++;
		memset(last, 0, sizeof(*last));
	}
	last->wr_id = wr_id;
	last->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	last->imm_data = (uint32_t)size;
	last->next = NULL;
	last->send_flags = IBV_SEND_SIGNALED;

	chunk =
	    (int)(((size + c->nqps - 1) / c->nqps + DRILL_ALIGN - 1) / DRILL_ALIGN * DRILL_ALIGN);
	for (int i = 0; i < c->nqps; i++) {
		struct drill_qp *q = &c->qps[c->qp_index];
		int length = (int)size - offset < chunk ? (int)size - offset : chunk, rc;

		wr->wr.rdma.rkey = e->rkeys[q->index % c->nnic];
		if (length <= 0) {
			wr->sg_list = NULL;
			wr->num_sge = 0;
		} else {
			sge->lkey = c->buf_mr[q->dev]->lkey;
			sge->length = (uint32_t)length;
			wr->sg_list = sge;
			wr->num_sge = 1;
		}
		int64_t t0 = drill_now_ns();
		rc = q->qp->context->ops.post_send(q->qp, c->wrs, &bad);
		int64_t took = drill_now_ns() - t0;
		if (took > atomic_load(&w->st->max_post_ns))
			atomic_store(&w->st->max_post_ns, took);
		if (rc) {
			drill_fail_app(w, "post_send (data) on %s (qpn 0x%06x): %s",
				       drill_nic(w, q->dev), q->qp->qp_num, strerror(rc));
			return -1;
		}
		offset += chunk;
		sge->addr += (uint64_t)chunk;
		wr->wr.rdma.remote_addr += (uint64_t)chunk;
		c->qp_index = (c->qp_index + 1) % c->nqps;
	}
	return 0;
}

static bool drill_send_try(struct drill_worker *w, struct drill_conn *c)
{
	const struct drill_opts *o = w->o;
	uint64_t seq = c->head, size, off, end;
	uint32_t slot = (uint32_t)(seq % drill_slots(w));
	uint8_t *v = drill_fifo_slot(w, c, slot);
	struct drill_fifo_elem e;

	if (seq >= (uint64_t)o->messages || seq - c->retired >= (uint64_t)o->window)
		return false;
	if (drill_fifo_idx(o->pattern, v) != seq + 1)
		return false;
	drill_fifo_get(o->pattern, v, &e);
	size = drill_msg_size(o->seed, o->rank, c->peer, seq, o->max_size);
	if (e.nreqs != 1 || e.tag != (uint32_t)o->rank || e.addr == 0 || e.rkeys[0] == 0 ||
	    e.size != size) {
		drill_fail_check(
		    w,
		    "clear-to-send for message %llu to node%d is wrong: nreqs %u tag %u "
		    "addr 0x%llx rkey 0x%x size %llu (want %llu)",
		    (unsigned long long)seq, c->peer, e.nreqs, e.tag, (unsigned long long)e.addr,
		    e.rkeys[0], (unsigned long long)e.size, (unsigned long long)size);
		return false;
	}
	if (!drill_ring_alloc(&c->ring, size, &off, &end))
		return false;
	drill_pattern_fill(c->buf + off, size, drill_msg_key(o->seed, o->rank, c->peer, seq));
	drill_msg_start(c, slot, seq, size, off, end);
	if (drill_multi_send(w, c, slot, &e, c->buf + off, size))
		return false;
	/* NCCL before 2.29 clears the consumed element (and so must the receiver's next lap
	 * set idx); 2.29 on leave it */
	if (o->pattern->clears)
		memset(v, 0, (size_t)o->pattern->elem);
	c->head++;
	return true;
}

/* ---- completions ---- */

static void drill_retire(struct drill_worker *w, struct drill_conn *c)
{
	while (c->retired < c->head) {
		struct drill_msg *m = &c->msgs[c->retired % drill_slots(w)];

		if (!m->done)
			break;
		c->ring.tail = m->end;
		m->inflight = false;
		c->retired++;
		if (c->send)
			atomic_fetch_add(&w->st->sent, 1);
	}
}

/*
 * Every flush READ of message m is back: NCCL now hands the bytes to the GPU. On
 * device memory they are there only if every NIC that wrote them was flushed since
 * (softverbs tracks it); false (the scenario failed) otherwise.
 */
static bool drill_flush_ordered(struct drill_worker *w, struct drill_conn *c,
				const struct drill_msg *m)
{
	uint64_t nics = 0, overflow = 0;
	int d = drill_conn_nic(w, c, 0), n;
	char names[256] = "";

	if (!drill_sv_unflushed)
		return true;
	n = drill_sv_unflushed(c->buf_mr[d], (uintptr_t)(c->buf + m->off), m->size, &nics,
			       &overflow);
	if (n < 0) {
		drill_fail_app(w, "softverbs_unflushed on message %llu's ring: %s",
			       (unsigned long long)m->seq, strerror(-n));
		return false;
	}
	if (overflow) {
		drill_fail_app(w, "softverbs could not track %llu device-memory writes",
			       (unsigned long long)overflow);
		return false;
	}
	if (!n)
		return true;
	for (int k = 0; k < w->o->nics; k++)
		if (nics & 1ull << k)
			snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s",
				 names[0] ? ", " : "", drill_nic(w, k));
	drill_fail_check(w,
			 "message %llu from node%d (%llu bytes): its flush READs are back, but "
			 "bytes of it came through %s, which no READ there ordered since (on "
			 "GPU memory the GPU could read stale data)",
			 (unsigned long long)m->seq, c->peer, (unsigned long long)m->size, names);
	return false;
}

/* A flush READ came back: in order on its QP, for a message that owes it, with the
 * first bytes of the message and nothing past them. */
static void drill_flush_wc(struct drill_worker *w, struct drill_qp *q, const struct ibv_wc *wc)
{
	struct drill_conn *c = q->conn;
	int d = q->dev;
	uint8_t want[DRILL_FLUSH_NIC], *got;
	struct drill_msg *m;
	uint64_t seq;

	if (c->flush_tail[d] == c->flush_head[d]) {
		drill_fail_check(w,
				 "unexpected flush completion on %s, connection from node%d "
				 "(opcode %d, wr_id 0x%llx): no flush outstanding (duplicate)",
				 drill_nic(w, d), c->peer, wc->opcode,
				 (unsigned long long)wc->wr_id);
		return;
	}
	seq = c->flush_seq[d][c->flush_tail[d] % DRILL_MAX_WINDOW];
	m = &c->msgs[seq % drill_slots(w)];
	if (wc->opcode != IBV_WC_RDMA_READ || (wc->wr_id & 0xff) != seq % drill_slots(w) ||
	    !m->inflight || m->seq != seq || !(m->flush_pending & (1u << d))) {
		drill_fail_check(w,
				 "unexpected flush completion on %s, connection from node%d "
				 "(opcode %d, wr_id 0x%llx; expected message %llu): duplicate "
				 "or out of order",
				 drill_nic(w, d), c->peer, wc->opcode,
				 (unsigned long long)wc->wr_id, (unsigned long long)seq);
		return;
	}
	c->flush_tail[d]++;
	m->flush_pending &= ~(1u << d);
	got = drill_flush_dst(w, c, m, d);
	drill_flush_want(w, c, seq, want);
	for (uint32_t i = 0; i < DRILL_FLUSH_NIC; i++) {
		uint8_t expect = i < m->flush_len ? want[i] : (uint8_t)~want[i];

		if (got[i] == expect)
			continue;
		drill_fail_check(w,
				 "flush READ of message %llu from node%d on %s (%u bytes): "
				 "scratch byte %u is 0x%02x, want 0x%02x (%s)",
				 (unsigned long long)seq, c->peer, drill_nic(w, d), m->flush_len, i,
				 got[i], expect,
				 i < m->flush_len ? "not the message's" : "written past the READ");
		return;
	}
	if (!m->flush_pending && !drill_flush_ordered(w, c, m))
		return;
	if (!m->flush_pending)
		drill_recv_deliver(w, m);
}

static void drill_wc(struct drill_worker *w, const struct ibv_wc *wc)
{
	struct drill_qp *q = drill_qp_find(w, wc->qp_num);
	struct drill_conn *c;
	struct drill_msg *m;
	uint32_t slot = (uint32_t)(wc->wr_id & 0xff);

	if (!q) {
		drill_fail_check(w, "completion for unknown QP 0x%06x (status %d, wr_id 0x%llx)",
				 wc->qp_num, wc->status, (unsigned long long)wc->wr_id);
		return;
	}
	c = q->conn;
	if (wc->status != IBV_WC_SUCCESS) {
		drill_fail_app(w,
			       "error completion on %s connection %s node%d, %s %d on %s "
			       "(qpn 0x%06x): status %d (%s), wr_id 0x%llx",
			       c->send ? "send" : "receive", c->send ? "to" : "from", c->peer,
			       q->flush ? "flush QP" : "QP", q->index, drill_nic(w, q->dev),
			       wc->qp_num, wc->status, drill_wc_status_str(wc->status),
			       (unsigned long long)wc->wr_id);
		return;
	}
	if (q->flush) {
		drill_flush_wc(w, q, wc);
	} else if (c->send) {
		m = &c->msgs[slot];
		if (wc->opcode != IBV_WC_RDMA_WRITE || q->next >= c->head || !m->inflight ||
		    m->seq != q->next || m->events <= 0) {
			drill_fail_check(
			    w,
			    "unexpected send completion on QP %d to node%d (opcode %d, wr_id "
			    "0x%llx; expected message %llu): duplicate or out of order",
			    q->index, c->peer, wc->opcode, (unsigned long long)wc->wr_id,
			    (unsigned long long)q->next);
			return;
		}
		q->next++;
		if (--m->events == 0)
			m->done = true;
	} else if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
		m = &c->msgs[q->next % drill_slots(w)];
		if (q->next >= c->head || !m->inflight || m->seq != q->next ||
		    slot != q->next % drill_slots(w)) {
			drill_fail_check(
			    w,
			    "unexpected receive completion on QP %d from node%d (wr_id "
			    "0x%llx, %llu posted, next %llu): duplicate or out of order",
			    q->index, c->peer, (unsigned long long)wc->wr_id,
			    (unsigned long long)c->head, (unsigned long long)q->next);
			return;
		}
		if (wc->imm_data != (uint32_t)m->size) {
			drill_fail_check(w, "message %llu from node%d: imm_data %u, size is %llu",
					 (unsigned long long)m->seq, c->peer, wc->imm_data,
					 (unsigned long long)m->size);
			return;
		}
		q->next++;
		if (--m->events == 0)
			drill_recv_check(w, c, m);
	} else if (wc->opcode == IBV_WC_RDMA_WRITE) {
		m = &c->msgs[slot];
		if (!m->inflight || !m->cts_pending) {
			drill_fail_check(w,
					 "unexpected clear-to-send completion on QP %d to node%d "
					 "(wr_id 0x%llx)",
					 q->index, c->peer, (unsigned long long)wc->wr_id);
			return;
		}
		m->cts_pending = false;
		if (--m->events == 0)
			drill_recv_check(w, c, m);
	} else {
		drill_fail_check(w, "unexpected completion opcode %d on QP %d from node%d",
				 wc->opcode, q->index, c->peer);
		return;
	}
	drill_retire(w, c);
}

/*
 * --inject, --drill-plan: once the messages delivered reach the mark (by all workers
 * together: where softverbs-ctl's fault would come; --inject-at own: by this worker,
 * the seed's fraction of its own), one ncclAllReduce of one float through the NCCL
 * test double. For R2CC that is the process's first collective, from which its
 * drill's steps count.
 */
static void drill_collective_due(struct drill_worker *w)
{
	struct drill_status *all = w->st - w->o->rank;
	struct drill_nccl *n = &w->nccl;
	uint64_t sum = 0;
	int rc;

	if (!w->o->coll_at || n->coll_done)
		return;
	for (int r = 0; r < w->o->procs; r++)
		sum += atomic_load(&all[r].delivered);
	if ((w->o->coll_sum ? sum : atomic_load(&w->st->delivered)) < w->o->coll_at)
		return;
	n->coll_done = true;
	atomic_store(&w->st->coll_all, sum);
	atomic_store(&w->st->coll_ns, drill_now_ns());
	rc = n->all_reduce(&n->coll_buf[0], &n->coll_buf[1], 1, DRILL_NCCL_FLOAT32, DRILL_NCCL_SUM,
			   n->comm, NULL);
	atomic_store(&w->st->coll_rc, rc);
	if (rc)
		drill_fail(w, "ncclAllReduce: NCCL error %d", rc);
}

static int drill_poll(struct drill_worker *w, bool *progress)
{
	struct ibv_wc wcs[DRILL_POLL_BATCH];

	for (int d = 0; d < w->o->nics; d++) {
		struct ibv_cq *cq = w->devs[d].cq;
		int n = cq->context->ops.poll_cq(cq, DRILL_POLL_BATCH, wcs);

		if (n < 0) {
			drill_fail_app(w, "poll_cq on %s returned %d", w->devs[d].name, n);
			return -1;
		}
		for (int i = 0; i < n; i++)
			drill_wc(w, &wcs[i]);
		if (n)
			*progress = true;
		drill_collective_due(w);
	}
	return 0;
}

static bool drill_all_done(struct drill_worker *w)
{
	for (int p = 0; p < w->o->procs; p++) {
		if (p == w->o->rank)
			continue;
		if (w->send[p]->retired < (uint64_t)w->o->messages ||
		    w->recv[p]->retired < (uint64_t)w->o->messages)
			return false;
	}
	return true;
}

/* Whether the messages delivered in all reached a mark of worker 0's record (0: none)
 * whose event (done) has not come yet. */
static bool drill_past_mark(struct drill_worker *w, _Atomic uint64_t *mark, _Atomic int *done)
{
	struct drill_status *all = w->st - w->o->rank;
	uint64_t at = atomic_load(mark), sum = 0;

	if (!at || atomic_load(done))
		return false;
	for (int r = 0; r < w->o->procs; r++)
		sum += atomic_load(&all[r].delivered);
	return sum >= at;
}

/* Whether new sends wait for the drill's fault (drill.h, hold_at). */
static bool drill_wait_fault(struct drill_worker *w, int64_t *until)
{
	struct drill_status *all = w->st - w->o->rank;

	if (!drill_past_mark(w, &all[0].hold_at, &all[0].fault_done))
		return false;
	if (!*until)
		*until = drill_now_ns() + DRILL_HOLD_MAX_NS;
	return drill_now_ns() < *until;
}

/* --restore: whether sends trickle until the drill has seen the failback (drill.h,
 * back_at), and if so whether one may go to each peer now. */
static bool drill_trickle(struct drill_worker *w, int64_t *next, bool *now)
{
	struct drill_status *all = w->st - w->o->rank;

	*now = true;
	if (!drill_past_mark(w, &all[0].back_at, &all[0].back_done))
		return false;
	int64_t t = drill_now_ns();
	*now = t >= *next;
	if (*now)
		*next = t + DRILL_TRICKLE_NS;
	return true;
}

static int drill_traffic(struct drill_worker *w)
{
	unsigned idle = 0;
	int64_t hold_until = 0, trickle_next = 0;

	while (!drill_all_done(w) && !drill_stopped(w)) {
		bool progress = false, one = true;
		bool hold = drill_wait_fault(w, &hold_until);
		bool trickle = drill_trickle(w, &trickle_next, &one);

		for (int p = 0; p < w->o->procs; p++) {
			if (p == w->o->rank)
				continue;
			while (drill_recv_post(w, w->recv[p]))
				progress = true;
			if (trickle) {
				if (one && !hold &&
				    w->send[p]->head < (uint64_t)w->o->messages * 3 / 4 &&
				    drill_send_try(w, w->send[p]))
					progress = true;
				continue;
			}
			while (!hold && drill_send_try(w, w->send[p]))
				progress = true;
		}
		if (drill_poll(w, &progress))
			break;
		if (progress)
			idle = 0;
		else
			drill_backoff(&idle);
	}
	return atomic_load(&w->failed) ? -1 : 0;
}

/* After a failure: keep polling a little to count the errors that follow (flushes). */
static void drill_drain(struct drill_worker *w)
{
	int64_t end = drill_now_ns() + DRILL_DRAIN_NS;
	unsigned idle = 0;

	atomic_store(&w->st->phase, DRILL_PHASE_DRAIN);
	while (drill_now_ns() < end && !drill_terminated) {
		bool progress = false;

		for (int d = 0; d < w->o->nics; d++) {
			struct ibv_wc wcs[DRILL_POLL_BATCH];
			struct ibv_cq *cq = w->devs[d].cq;
			int n = cq ? cq->context->ops.poll_cq(cq, DRILL_POLL_BATCH, wcs) : 0;

			for (int i = 0; i < n; i++) {
				if (wcs[i].status != IBV_WC_SUCCESS)
					atomic_fetch_add(&w->st->errors, 1);
				progress = true;
			}
		}
		if (progress)
			idle = 0;
		else
			drill_backoff(&idle);
	}
}

/*
 * Once every worker is done (or, after a failure, once the drain is over), the messages
 * delivered and still intact in the receive rings are checked again: a write that
 * landed after its message was delivered (a stale or duplicated WR, say from a careless
 * re-post) shows here.
 */
static void drill_recheck(struct drill_worker *w)
{
	const struct drill_opts *o = w->o;

	if (w->rechecked)
		return;
	w->rechecked = true;
	for (int p = 0; p < o->procs; p++) {
		struct drill_conn *c = w->recv[p];
		uint64_t first =
		    (uint64_t)o->messages > drill_slots(w) ? o->messages - drill_slots(w) : 0;

		if (p == o->rank || !c)
			continue;
		for (uint64_t seq = first; seq < (uint64_t)o->messages; seq++) {
			struct drill_msg *m = &c->msgs[seq % drill_slots(w)];
			uint64_t need = (m->size + DRILL_ALIGN - 1) / DRILL_ALIGN * DRILL_ALIGN;
			uint64_t bad, off = 0;
			uint8_t got = 0, want = 0;

			/* Not delivered (a failed run), or overwritten by a later message
			 * since? Then there is nothing to see. */
			if (!m->done || m->seq != seq || !m->size ||
			    m->end - need + c->ring.size < c->ring.head)
				continue;
			bad = drill_pattern_check(c->buf + m->off, m->size,
						  drill_msg_key(o->seed, p, o->rank, seq), &off,
						  &got, &want);
			if (bad)
				drill_fail_check(
				    w,
				    "message %llu from node%d changed after delivery (late or "
				    "duplicate write): %llu byte(s), first at offset %llu "
				    "(got 0x%02x, want 0x%02x)",
				    (unsigned long long)seq, p, (unsigned long long)bad,
				    (unsigned long long)off, got, want);
		}
	}
}

/*
 * --churn's connections. Each worker keeps one connection to the worker per_node ranks
 * on (it offers, then sends) and one from the worker per_node ranks back (it accepts,
 * then receives), on the NICs in turn, and makes a new one as soon as the last is
 * destroyed: as NCCL's communicators come and go beside a job's traffic. The offer
 * side creates its CQ and QP and leaves its QP number in a file; the accepting side
 * creates its own, posts DRILL_CHURN_MSGS receives, connects and answers; the offer
 * side connects and sends that many messages, then destroys its QP and CQ once they
 * completed or DRILL_CHURN_HOLD_NS(g) passed, whichever is first; the accepting side
 * once it has them all or DRILL_CHURN_LIVE_NS passed. Both destroy without asking the
 * other, so the fault finds connections in every stage, repairs some of them, and
 * sees some destroyed in the middle of their repair on either side.
 *
 * Checked: every message that arrives is its connection's next one, exactly as sent
 * (so none twice, none lost before a later one, none from an older connection); no
 * destroy of a connected QP or its CQ fails or takes DRILL_CHURN_DESTROY_NS or more.
 * Error completions on these connections are counted, not failures: the peer may have
 * destroyed its end.
 */
#define DRILL_CHURN_MSGS       8
#define DRILL_CHURN_MAGIC      0x5232434343485552ull /* "R2CCCHUR" */
#define DRILL_CHURN_WAIT_NS    2000000000ll	     /* the answer to an offer */
#define DRILL_CHURN_LIVE_NS    40000000ll	     /* the accepting side's longest wait */
#define DRILL_CHURN_DESTROY_NS 2000000000ll

struct drill_churn_msg {
	uint64_t magic;
	uint32_t from, gen, seq, pad;
	uint64_t key;
};

struct drill_churn_note { /* an offer's or an answer's file */
	uint64_t magic;
	uint32_t gen, qpn;
	int32_t dev;
};

enum { DRILL_CH_IDLE, DRILL_CH_OFFERED, DRILL_CH_LIVE };

struct drill_churn_link {
	bool offer;   /* this side offers and sends */
	int peer;     /* the partner worker */
	uint32_t gen; /* the connection under way */
	int state;
	int dev;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr[DRILL_MAX_NICS];
	int64_t until;
	uint32_t done; /* send completions, or messages checked */
	struct drill_churn_msg buf[DRILL_CHURN_MSGS];
};

static uint64_t drill_churn_key(const struct drill_worker *w, int from, uint32_t gen, uint32_t seq)
{
	return drill_hash(w->o->seed, (uint64_t)from, gen, seq);
}

/* The offer side's hold: 1 to 24 ms, the connection's own. */
static int64_t drill_churn_hold_ns(const struct drill_worker *w, const struct drill_churn_link *l)
{
	return 1000000ll *
	       (1 + (int64_t)(drill_hash(w->o->seed, (uint64_t)w->o->rank, l->gen, 7) % 24));
}

static void drill_churn_destroy(struct drill_worker *w, struct drill_churn_link *l)
{
	char name[32];
	int64_t t0 = drill_now_ns();
	int rc = 0;

	if (l->qp) {
		rc = drill_ibv.destroy_qp(l->qp);
		if (rc)
			drill_fail_check(w,
					 "--churn: ibv_destroy_qp of a connected QP (qpn 0x%06x on "
					 "%s) failed: %s",
					 l->qp->qp_num, drill_nic(w, l->dev), strerror(rc));
	}
	if (!rc && l->cq && (rc = drill_ibv.destroy_cq(l->cq)))
		drill_fail_check(w, "--churn: ibv_destroy_cq of a connection's CQ on %s failed: %s",
				 drill_nic(w, l->dev), strerror(rc));
	int64_t took = drill_now_ns() - t0;
	int64_t max = atomic_load(&w->st->churn_destroy_max_ns);
	while (took > max &&
	       !atomic_compare_exchange_weak(&w->st->churn_destroy_max_ns, &max, took))
		;
	if (took >= DRILL_CHURN_DESTROY_NS)
		drill_fail_check(w, "--churn: destroying a connection on %s took %.0f ms",
				 drill_nic(w, l->dev), took / 1e6);
	if (l->qp)
		atomic_fetch_add(&w->st->churned, 1);
	l->qp = NULL;
	l->cq = NULL;
	if (l->offer && l->state == DRILL_CH_OFFERED) { /* an answer may still come: not read */
		snprintf(name, sizeof(name), "cha%u", l->gen);
		drill_file_del(w->o->dir, name, l->peer);
	}
	l->state = DRILL_CH_IDLE;
	l->gen++;
}

/* A CQ and an RC QP in INIT on dev, as NCCL makes a connection's. */
static int drill_churn_create(struct drill_worker *w, struct drill_churn_link *l, int dev)
{
	struct drill_dev *d = &w->devs[dev];
	struct ibv_qp_init_attr ia = {
	    .cap = {.max_send_wr = DRILL_CHURN_MSGS,
		    .max_recv_wr = DRILL_CHURN_MSGS,
		    .max_send_sge = 1,
		    .max_recv_sge = 1},
	    .qp_type = IBV_QPT_RC,
	};
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
				.port_num = 1,
				.qp_access_flags =
				    IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE};

	l->dev = dev;
	l->cq = drill_ibv.create_cq(d->ctx, 2 * DRILL_CHURN_MSGS + 4, NULL, NULL, 0);
	if (!l->cq)
		return -1;
	ia.send_cq = ia.recv_cq = l->cq;
	l->qp = drill_ibv.create_qp(d->pd, &ia);
	if (!l->qp ||
	    drill_ibv.modify_qp(
		l->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return -1;
	return 0;
}

/* Completions of a live connection; true when it is to be destroyed. */
static bool drill_churn_poll(struct drill_worker *w, struct drill_churn_link *l)
{
	struct ibv_wc wcs[DRILL_CHURN_MSGS];
	int n = l->cq->context->ops.poll_cq(l->cq, DRILL_CHURN_MSGS, wcs);

	for (int i = 0; i < n; i++) {
		const struct ibv_wc *wc = &wcs[i];

		if (wc->status != IBV_WC_SUCCESS) {
			atomic_fetch_add(&w->st->churn_errors, 1);
			continue;
		}
		if (l->offer) {
			l->done++;
			continue;
		}
		const struct drill_churn_msg *m = &l->buf[wc->wr_id % DRILL_CHURN_MSGS];
		uint32_t want = l->done;
		if (wc->opcode != IBV_WC_RECV || wc->wr_id != want || wc->byte_len != sizeof(*m) ||
		    m->magic != DRILL_CHURN_MAGIC || m->from != (uint32_t)l->peer ||
		    m->gen != l->gen || m->seq != want ||
		    m->key != drill_churn_key(w, l->peer, l->gen, want)) {
			drill_fail_check(
			    w,
			    "--churn: connection %u from node%d on %s: receive %llu "
			    "(%u bytes) holds message %u of connection %u, want message "
			    "%u",
			    l->gen, l->peer, drill_nic(w, l->dev), (unsigned long long)wc->wr_id,
			    wc->byte_len, m->seq, m->gen, want);
			continue;
		}
		l->done++;
		atomic_fetch_add(&w->st->churn_msgs, 1);
	}
	return n < 0 || l->done == DRILL_CHURN_MSGS || drill_now_ns() > l->until;
}

static void drill_churn_offer_step(struct drill_worker *w, struct drill_churn_link *l)
{
	const struct drill_opts *o = w->o;
	struct drill_churn_note note;
	char name[32];
	const char *what = "";

	if (l->state == DRILL_CH_IDLE) {
		int dev = (int)(l->gen % (uint32_t)o->nics);
		if (drill_churn_create(w, l, dev)) {
			drill_churn_destroy(w, l);
			return;
		}
		note = (struct drill_churn_note){DRILL_CHURN_MAGIC, l->gen, l->qp->qp_num, dev};
		snprintf(name, sizeof(name), "cho%u", l->gen);
		if (drill_file_put(o->dir, name, o->rank, &note, sizeof(note))) {
			drill_churn_destroy(w, l);
			return;
		}
		l->state = DRILL_CH_OFFERED;
		l->until = drill_now_ns() + DRILL_CHURN_WAIT_NS;
		return;
	}
	if (l->state == DRILL_CH_OFFERED) {
		snprintf(name, sizeof(name), "cha%u", l->gen);
		if (drill_file_get(o->dir, name, l->peer, &note, sizeof(note)) != 0) {
			if (drill_now_ns() > l->until)
				drill_churn_destroy(w, l);
			return;
		}
		drill_file_del(o->dir, name, l->peer);
		l->state = DRILL_CH_LIVE;
		if (note.magic != DRILL_CHURN_MAGIC || note.gen != l->gen || !note.qpn ||
		    drill_rtr_rts(w, l->qp, l->dev, note.qpn, &w->peers[l->peer], &what)) {
			drill_churn_destroy(w, l);
			return;
		}
		atomic_fetch_add(&w->st->churn_conns, 1);
		for (uint32_t i = 0; i < DRILL_CHURN_MSGS; i++) {
			struct drill_churn_msg *m = &l->buf[i];
			*m = (struct drill_churn_msg){DRILL_CHURN_MAGIC,
						      (uint32_t)o->rank,
						      l->gen,
						      i,
						      0,
						      drill_churn_key(w, o->rank, l->gen, i)};
			struct ibv_sge sge = {(uintptr_t)m, sizeof(*m), l->mr[l->dev]->lkey};
			struct ibv_send_wr wr = {.wr_id = i,
						 .sg_list = &sge,
						 .num_sge = 1,
						 .opcode = IBV_WR_SEND,
						 .send_flags = IBV_SEND_SIGNALED},
					   *bad;
			if (l->qp->context->ops.post_send(l->qp, &wr, &bad))
				break;
		}
		l->done = 0;
		l->until = drill_now_ns() + drill_churn_hold_ns(w, l);
		return;
	}
	if (drill_churn_poll(w, l))
		drill_churn_destroy(w, l);
}

static void drill_churn_accept_step(struct drill_worker *w, struct drill_churn_link *l)
{
	const struct drill_opts *o = w->o;
	struct drill_churn_note note;
	char name[32];
	const char *what = "";

	if (l->state == DRILL_CH_LIVE) {
		if (drill_churn_poll(w, l))
			drill_churn_destroy(w, l);
		return;
	}
	snprintf(name, sizeof(name), "cho%u", l->gen);
	if (drill_file_get(o->dir, name, l->peer, &note, sizeof(note)) != 0)
		return;
	drill_file_del(o->dir, name, l->peer);
	l->state = DRILL_CH_LIVE;
	if (note.magic != DRILL_CHURN_MAGIC || note.gen != l->gen || note.dev < 0 ||
	    note.dev >= o->nics || drill_churn_create(w, l, note.dev)) {
		/* refused (a dead device, say): the offer side learns it at once */
		note = (struct drill_churn_note){DRILL_CHURN_MAGIC, l->gen, 0, -1};
		snprintf(name, sizeof(name), "cha%u", l->gen);
		drill_file_put(o->dir, name, o->rank, &note, sizeof(note));
		drill_churn_destroy(w, l);
		return;
	}
	memset(l->buf, 0, sizeof(l->buf));
	for (uint32_t i = 0; i < DRILL_CHURN_MSGS; i++) {
		struct ibv_sge sge = {(uintptr_t)&l->buf[i], sizeof(l->buf[i]),
				      l->mr[l->dev]->lkey};
		struct ibv_recv_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1}, *bad;
		if (l->qp->context->ops.post_recv(l->qp, &wr, &bad)) {
			drill_churn_destroy(w, l);
			return;
		}
	}
	if (drill_rtr_rts(w, l->qp, l->dev, note.qpn, &w->peers[l->peer], &what)) {
		drill_churn_destroy(w, l);
		return;
	}
	note = (struct drill_churn_note){DRILL_CHURN_MAGIC, l->gen, l->qp->qp_num, l->dev};
	snprintf(name, sizeof(name), "cha%u", l->gen);
	if (drill_file_put(o->dir, name, o->rank, &note, sizeof(note))) {
		drill_churn_destroy(w, l);
		return;
	}
	l->done = 0;
	l->until = drill_now_ns() + DRILL_CHURN_LIVE_NS;
}

/*
 * --churn: beside the traffic, and through the fault, the connections above, and QPs
 * created on each NIC (on its PD and CQ, as NCCL's next connection would be) and
 * destroyed again once in INIT, one every 200 us, so that R2CC creates, repairs, kills
 * and frees their records while its repair thread, the stall scan and the fault's
 * detection walk the others.
 */
static void *drill_churn_main(void *arg)
{
	struct drill_worker *w = arg;
	const struct drill_opts *o = w->o;
	struct drill_churn_link links[2] = {
	    {.offer = true, .peer = (o->rank + o->per_node) % o->procs},
	    {.offer = false, .peer = (o->rank - o->per_node + o->procs) % o->procs},
	};
	bool linked = o->procs > o->per_node;

	for (int k = 0; k < 2 && linked; k++)
		for (int d = 0; d < o->nics; d++) {
			links[k].mr[d] =
			    drill_ibv.reg_mr(w->devs[d].pd, links[k].buf, sizeof(links[k].buf),
					     IBV_ACCESS_LOCAL_WRITE);
			if (!links[k].mr[d])
				linked = false;
		}
	for (unsigned i = 0; !atomic_load(&w->churn_stop) && !drill_stopped(w); i++) {
		if (linked) {
			drill_churn_offer_step(w, &links[0]);
			drill_churn_accept_step(w, &links[1]);
		}
		struct drill_dev *d = &w->devs[i % (unsigned)w->o->nics];
		struct ibv_qp_init_attr ia = {
		    .send_cq = d->cq,
		    .recv_cq = d->cq,
		    .cap = {.max_send_wr = 4,
			    .max_recv_wr = 4,
			    .max_send_sge = 1,
			    .max_recv_sge = 1},
		    .qp_type = IBV_QPT_RC,
		};
		struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
					.port_num = 1,
					.qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
		struct ibv_qp *qp = drill_ibv.create_qp(d->pd, &ia);
		struct timespec ts = {0, 200000};

		if (qp) {
			drill_ibv.modify_qp(qp, &a,
					    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
						IBV_QP_ACCESS_FLAGS);
			if (drill_ibv.destroy_qp(qp) == 0)
				atomic_fetch_add(&w->st->churned, 1);
		}
		nanosleep(&ts, NULL);
	}
	for (int k = 0; k < 2; k++) {
		if (links[k].qp || links[k].cq)
			drill_churn_destroy(w, &links[k]);
		for (int d = 0; d < o->nics; d++)
			if (links[k].mr[d])
				drill_ibv.dereg_mr(links[k].mr[d]);
	}
	return NULL;
}

/* NCCL's connection teardown: QPs, MRs, CQs, PDs (devices stay open). */
static void drill_teardown(struct drill_worker *w)
{
	for (int p = 0; p < w->o->procs; p++) {
		struct drill_conn *cs[2] = {w->send[p], w->recv[p]};

		for (int k = 0; k < 2; k++) {
			struct drill_conn *c = cs[k];

			if (!c)
				continue;
			for (int q = 0; q < c->nqps; q++)
				if (c->qps[q].qp)
					drill_ibv.destroy_qp(c->qps[q].qp);
			for (int d = 0; d < w->o->nics; d++)
				if (c->flush[d].qp)
					drill_ibv.destroy_qp(c->flush[d].qp);
			if (c->buf_fd > 0)
				close(c->buf_fd);
			for (int d = 0; d < w->o->nics; d++) {
				if (c->buf_mr[d])
					drill_ibv.dereg_mr(c->buf_mr[d]);
				if (c->buf_mr_old[d])
					drill_ibv.dereg_mr(c->buf_mr_old[d]);
				if (c->fifo_mr[d])
					drill_ibv.dereg_mr(c->fifo_mr[d]);
				if (c->scratch_mr[d])
					drill_ibv.dereg_mr(c->scratch_mr[d]);
			}
		}
	}
	for (int d = 0; d < w->o->nics; d++) {
		if (w->devs[d].cq)
			drill_ibv.destroy_cq(w->devs[d].cq);
		if (w->devs[d].pd)
			drill_ibv.dealloc_pd(w->devs[d].pd);
	}
	if (w->nccl.comm)
		w->nccl.comm_destroy(w->nccl.comm);
}

static struct drill_status *drill_status_map(const struct drill_opts *o)
{
	char path[512];
	size_t len = sizeof(struct drill_status) * (size_t)o->procs;
	void *p;
	int fd;

	snprintf(path, sizeof(path), "%s/status", o->dir);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	return p == MAP_FAILED ? NULL : (struct drill_status *)p + o->rank;
}

/* The self-test corrupts one message node0 gets from node1: the first non-empty one
 * from the middle of the run on. */
static void drill_pick_corrupt(struct drill_worker *w)
{
	const struct drill_opts *o = w->o;

	w->corrupt_peer = 1;
	w->corrupt_seq = UINT64_MAX;
	if (!o->selftest_corrupt || o->rank != 0)
		return;
	for (int k = 0; k < o->messages; k++) {
		uint64_t seq = ((uint64_t)o->messages / 2 + (uint64_t)k) % (uint64_t)o->messages;

		if (drill_msg_size(o->seed, 1, 0, seq, o->max_size) > 0) {
			w->corrupt_seq = seq;
			return;
		}
	}
}

/* Whose post_send the context carries: libr2cc.so patches the ops of every context. */
static bool drill_ops_owner_is_r2cc(struct ibv_context *ctx)
{
	Dl_info info;

	return dladdr((void *)ctx->ops.post_send, &info) && info.dli_fname &&
	       strstr(info.dli_fname, "libr2cc") != NULL;
}

int drill_worker_main(const struct drill_opts *o)
{
	struct drill_worker *w;
	char err[256];
	int rc = 1;

	/* Never outlive the parent that watches the deadline. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	signal(SIGTERM, drill_on_term);
	if (getppid() == 1)
		return 1;
	w = calloc(1, sizeof(*w));
	if (!w)
		return 1;
	w->o = o;
	drill_pattern_reported = o->pattern;
	if (o->procs > DRILL_FULL_PROCS) {
		backoff_spin = 8;
		backoff_yield = 64;
	}
	w->st = drill_status_map(o);
	if (!w->st) {
		fprintf(stderr, "r2cc-verbs-drill node%d: cannot map %s/status\n", o->rank, o->dir);
		free(w);
		return 1;
	}
	drill_pick_corrupt(w);
	if (drill_ibv_load(err, sizeof(err)) || (o->mlx5dv && drill_mlx5_load(err, sizeof(err)))) {
		drill_fail(w, "%s", err);
		goto out;
	}
	if (drill_setup(w))
		goto out;
	atomic_store(&w->st->interposed, drill_ops_owner_is_r2cc(w->devs[0].ctx) ? 1 : 2);
	atomic_store(&w->st->phase, DRILL_PHASE_RUN);
	pthread_t churn;
	bool churning = o->churn && pthread_create(&churn, NULL, drill_churn_main, w) == 0;
	int traffic_rc = drill_traffic(w);
	if (churning) {
		atomic_store(&w->churn_stop, true);
		pthread_join(churn, NULL);
	}
	if (traffic_rc)
		goto out;
	atomic_store(&w->st->phase, DRILL_PHASE_WAIT);
	if (drill_file_put(o->dir, "done", o->rank, &o->rank, sizeof(o->rank))) {
		drill_fail(w, "bootstrap: cannot write my done mark");
		goto out;
	}
	/* Anything that completes while the others finish is a duplicate. */
	if (drill_barrier(w, "done", true))
		goto out;
	drill_recheck(w);
	if (atomic_load(&w->failed))
		goto out;
	drill_teardown(w);
	atomic_store(&w->st->phase, DRILL_PHASE_DONE);
	rc = 0;
out:
	if (rc) {
		drill_drain(w);
		drill_recheck(w);
		atomic_store(&w->st->phase, DRILL_PHASE_FAILED);
	}
	return rc;
}
