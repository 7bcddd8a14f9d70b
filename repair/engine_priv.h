/*
 * Hot repair's shared definitions, for the files of repair/ that engine.c lists
 * (engine.h is what the wrappers call; qp_shadow.h has the exactly-once rules,
 * mr_mirror.h the keys).
 *
 * Objects. Every QP NCCL creates while hot repair is on gets a record (struct
 * r2cc_rqp) and a shadow; every CQ a virtual side (struct r2cc_vcq). While
 * nothing failed they cost the shadow's recording and the gates in the
 * wrappers. A QP's "current path" starts as NCCL's own QP and becomes a QP of
 * R2CC's own (in the mirror PD of a healthy NIC, with a private CQ) once it has
 * migrated; NCCL keeps using its QP and CQ objects, whose data path is then
 * served here.
 *
 * Locks, in this order: rqp->mu (state, held posts, current path), vcq->mu
 * (stash of completions for NCCL, attached private CQs), r2cc_eng.mu
 * (queues, directories, incidents). The repair thread never holds r2cc_eng.mu while it takes
 * another lock. rqp->state is also read without rqp->mu (atomic) by the poll
 * side, which only needs to know whether errors are to be hidden.
 */
#pragma once
#include "repair/model/cts.h"
#include "repair/engine.h"
#include "ctl/hmap.h"
#include "ctl/job.h"
#include "repair/model/ledger.h"
#include "repair/model/mr_mirror.h"
#include "repair/peer.h"
#include "repair/model/qp_shadow.h"
#include "repair/model/stall.h"
#include "shim/common.h"
#include "shim/core.h"
#include "shim/failspec.h"
#include "shim/log.h"
#include "shim/params.h"
#include "shim/report.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* wr_ids of the drain markers posted behind NCCL's requests on a fenced QP. */
#define MARK_S 0x5232434346454e53ull /* "R2CCFENS" */
#define MARK_R 0x5232434346454e52ull /* "R2CCFENR" */

#define SCAN_NS		     5000000ll	 /* stall scan period */
#define SUSPECT_AGAIN_NS     200000000ll /* a stall that outlives its confirmation: first back-off */
#define SUSPECT_MAX_NS	     5000000000ll
#define PROBE_IDLE_NS	     20000000ll /* trailing unsignalled requests probed after this */
#define ONE_SIBLING_FLOOR_X  5		/* the floor of a NIC with one sibling to test through */
#define DRAIN_NS	     1000000000ll
#define RESEND_NS	     100000000ll /* REQ re-sent while unanswered */
#define INCIDENT_JOIN_NS     2000000000ll
#define MAX_INCIDENTS	     64
#define MAX_EVENTS	     48
#define WIRE_MAX_ENTRIES     4096	  /* queue pairs per exchange message */
#define RESEND_PER_QP_NS     200000ll	  /* a batch's REQ is re-sent later the larger it is */
#define DIR_SWEEP_NS	     1000000000ll /* released directories are freed when unused */
#define RECORD_SWEEP_NS	     100000000ll  /* records of destroyed QPs are freed */
#define CHURN_RING	     16		  /* migrations of one QP remembered */
#define CHURN_NS	     5000000000ll /* more of them than NICs within this: unrecoverable */
#define CHURN_WHY	     "the path keeps failing (more migrations within 5 s than NICs)"
#define BARREN_WHY	     "each new path failed before completing anything (as many in a row as NICs)"
#define BARREN_MAX_NS	     600000000000ll /* a failure later than this after a move is a new one */
#define LEFT_RING	     4		    /* NICs a QP's path failed on, remembered */
#define OOM_GIVEUP_NS	     1000000000ll   /* a repair without memory for this long fails */
#define FAILBACK_HOLD_MAX_NS 600000000000ll /* the longest hold-down of a flapping NIC */
#define GONE_RING	     256	    /* destroyed connections remembered */
#define FAILBACK_JOIN_NS     200000000ll    /* QPs of one failback start within this */

enum rq_state {
	RQ_HEALTHY,
	RQ_DETECTED, /* queued for the repair thread; posts still go to the current path */
	RQ_FENCING,  /* gate closed, current path in ERR: posts are held */
	RQ_EXCHANGE, /* new path being connected; recv_live / send_live open it per queue */
	RQ_MIGRATED,
	RQ_FAILED, /* repair impossible: NCCL gets the error */
};

enum { OP_REQ = 1, OP_REP, OP_GO, OP_NACK, OP_SUSPECT, OP_FAR_REQ, OP_FAR_REP };
/* rep_wire.flags: the REQ's sender knows its own NIC failed (declared, port down,
 * self-test failed): the responder's side is healthy and keeps its NIC. */
#define WIRE_F_SENDER_NIC_FAILED 0x1
/* ... because it was declared failed (R2CC_FAILED_NODE/HCA): nothing was detected. */
#define WIRE_F_DECLARED 0x2
/* A failback: the sender's NIC came back and its QP returns to it; nothing failed,
 * and the responder returns to its own original NIC if that is up. */
#define WIRE_F_FAILBACK 0x4
/* The sender's QP was created on its NIC after that NIC failed: its move is no part
 * of the repair of the failure (born_late), on either side. */
#define WIRE_F_CREATED_AFTER 0x8

struct held_send {
	struct held_send *next;
	struct ibv_send_wr wr;
	struct ibv_sge sge[];
};

struct held_recv {
	struct held_recv *next;
	struct ibv_recv_wr wr;
	struct ibv_sge sge[];
};

/*
 * A CQ of R2CC's own, shared by the new paths of the QPs of one NCCL CQ on one
 * NIC (one per path would cost a CQ, and its pinned ring, per migrated QP:
 * hundreds per NIC failure). Each path takes room for its queues when it is
 * built and gives it back when it goes; completions are told apart by QP
 * number (unique on a device), registered when a path becomes current. No
 * completion arrives on a path before that: nothing is posted on it, and its
 * receives only come with the switch.
 */
struct pcq {
	struct pcq *next;
	struct ibv_cq *cq;
	struct r2cc_ctx *ctx;
	int room;		 /* entries not taken by a path yet */
	int users;		 /* paths on it */
	struct r2cc_hmap by_qpn; /* QP number of a current path -> its record */
};

#define PCQ_PATHS 16 /* a shared CQ is made with room for this many paths if it can */

struct r2cc_vcq {
	pthread_mutex_t mu;
	struct ibv_wc *stash;
	size_t cap, head, count;
	/* Entries kept free for the error completion r2cc_rqp_fail() owes each repaired QP
	 * of this CQ: count + reserved <= cap, and only r2cc_rqp_fail() takes from them. */
	size_t reserved;
	struct pcq *pcqs; /* R2CC's CQs behind this one */
	/* QPs whose re-posts wait for NCCL's own thread (r2cc_app_flush_need): run at
	 * its next poll of this CQ. Under mu; nflush also read atomically. */
	struct r2cc_rqp **flush;
	int nflush, capflush;
	/* GPU flush across NICs (gpuflush.c): the NICs (bits of their index) that have
	 * carried data of this CQ's QPs since a repair (atomic), its flush QPs with
	 * helpers (under mu) and NCCL's posts they hold (atomic). */
	uint64_t carried;
	struct r2cc_rqp **gfl;
	int ngfl, capgfl;
	uint64_t gf_held;
};

/* The peer's end of a migrating pair, as its messages describe it. */
struct peer_path {
	uint32_t qpn;
	uint16_t lid;
	uint8_t port, mtu;
	uint8_t gid[16];
	char nic[R2CC_NIC_NAME_MAX];
};

struct r2cc_rqp {
	pthread_mutex_t mu;
	int state; /* enum rq_state, atomic */
	bool dead; /* NCCL destroyed the QP */
	bool queued, busy;
	struct r2cc_qp *q;
	struct r2cc_cq *vcq;
	uint32_t qpn;
	struct r2cc_nic *orig_nic;
	struct r2cc_ctx *orig_ctx;
	struct ibv_qp_cap cap;
	bool sq_sig_all;
	/* current path */
	struct ibv_qp *cur_qp;
	struct ibv_cq *cur_cq; /* NULL while the current path is NCCL's QP */
	struct pcq *cur_pcq;
	struct r2cc_ctx *cur_ctx;
	struct r2cc_nic *cur_nic;
	struct r2cc_qp_shadow *cur_sh;
	bool recv_live, send_live;
	bool declared_pending;	/* on a declared-failed NIC, waiting for NCCL's first post */
	bool loopback;		/* connected to itself (NCCL's GPU flush QP) */
	struct r2cc_gflush *gf; /* a flush QP's helpers on other NICs (gpuflush.c), atomic */
	bool hold_all;		/* every post is held until the new path is live */
	bool stash_held;	/* one of its CQ's reserved stash entries is its own */
	/* A held send waits for the peer's rkey map (a key the cache lacks: the
	 * repair thread fetches it, then posts the held sends); fetch attempts that
	 * failed in a row. Under mu. */
	bool keys_wait;
	int keys_tries;
	/* The plan's re-posts and NCCL's held sends wait for NCCL's own thread (its
	 * next post on the QP or poll of its CQ: r2cc_app_flush_run), and the error a held
	 * send got there (atomic; the repair thread gives the QP its error). */
	bool app_flush;
	int flush_err;
	/* path being built */
	struct ibv_qp *new_qp;
	struct ibv_cq *new_cq;
	struct pcq *new_pcq;
	struct r2cc_ctx *new_ctx;
	struct r2cc_qp_shadow *new_sh;
	/* drain; fence_broken: the path could not be moved to ERR, so nothing drains it */
	bool mark_s, mark_r, fence_broken;
	/* peer: the ends of NCCL's connection (repair/peer.h), tracked from RTS, and
	 * the job and rank of the peer's process once known */
	struct r2cc_peer_ep ep_local, ep_remote;
	bool tracked;
	bool ready; /* r2cc_repair_qp_ready() ran: its peer is tracked, detections count */
	const struct r2cc_ctl_dir *dir;
	int peer_rank;
	int batch; /* queue pairs repaired at once with this one, here or by the peer */
	char peer_orig_nic[R2CC_NIC_NAME_MAX];
	char peer_cur_nic[R2CC_NIC_NAME_MAX];
	uint64_t k_local, k_peer;
	/* the peer's messages retired on the old path, and its record of the last
	 * of them (their receive completions, should this side's device have lost
	 * them: repair/model/qp_shadow.h) */
	uint64_t peer_sent;
	int npeer_lost;
	struct r2cc_shadow_msg peer_lost[R2CC_SHADOW_LOST_MAX];
	int lost_synth; /* receive completions made from it in this migration */
	/* atomic: the exchange's new path is current (switch_path) and the status of
	 * an error completion it gave before the exchange ended (0: none) */
	int switched, new_path_err;
	union ibv_gid new_sgid; /* with a GRH: the new path's source GID, */
	uint8_t new_sgid_index; /* its index */
	uint64_t pair_id;
	bool initiator;
	int64_t t_detect, t_deadline, t_sent;
	int resends; /* REQs sent again in this exchange */
	int status_seen;
	char cause[96];
	int incident;
	struct r2cc_qp_shadow_plan plan;
	bool have_plan;
	/* Clear-to-send writes (repair/model/cts.h), repair thread only: this side's
	 * queries about its unretired ones as of the fence, the peer's answers, and
	 * how many the answers dropped from the plan. */
	struct rep_cts *cts_q, *cts_a;
	int ncts_q, ncts_a;
	size_t cts_dropped;
	/* A restart (exchange.c): the initiator's new path died before it connected.
	 * The responder's new path carried nothing; it waits for the initiator's
	 * next REQ (not stale_pair's), and replan holds the receives to post on the
	 * path that REQ brings (its plan's sends still wait for the GO). restarts:
	 * the initiator's exchanges begun again so. */
	bool restart, have_replan;
	struct r2cc_qp_shadow_plan replan;
	uint64_t stale_pair;
	int restarts;
	struct r2cc_nic *refused_nic; /* the commit's receive was refused there (dead) */
	/* What the fenced old path's sends retired (its messages, the last few of
	 * them), as of the fence: what this side's REQ or REP says, also when a
	 * restart sends it again from a new path that is current by then */
	uint64_t fenced_sent;
	int fenced_nlost;
	struct r2cc_shadow_msg fenced_lost[R2CC_SHADOW_LOST_MAX];
	struct held_send *hs_head, **hs_tail;
	struct held_recv *hr_head, **hr_tail;
	/* stall scan */
	uint64_t scan_retired, scan_posted;
	int64_t scan_progress, scan_idle;
	int64_t far_noticed;   /* the wait (its scan_progress) the peer was asked about */
	bool scan_waiting;     /* the last scan saw a signalled request outstanding */
	uint64_t wait_ahead;   /* the most the node had queued on the NIC during this wait */
	int64_t suspect_after; /* this wait is suspected again only beyond this long */
	const struct r2cc_qp_shadow *acct_sh; /* the load model's baseline: shadow, bytes */
	uint64_t acct_retired;
	int64_t probe_at;	     /* a probe is out since then (0: none) */
	int probe_done;		     /* atomic: its completion came */
	uint64_t probed;	     /* send_posted when the last probe was posted */
	struct r2cc_nic *ledger_nic; /* the node ledger counts this QP on it (placement) */
	int ledger_dir;
	struct r2cc_rqp *next_all, *next_work;
	int migrations;
	int64_t recent[CHURN_RING]; /* when the last migrations finished (ring) */
	unsigned churn;		    /* migrations in recent[]: all but declared moves */
	struct left_nic {
		const struct r2cc_nic *nic;
		int64_t t;
	} left[LEFT_RING]; /* NICs whose path failed under it, and when (r2cc_left_failed) */
	unsigned nleft;
	bool churn_skip; /* the move under way does not count towards churning */
	/* Barren moves (barren_check): the path a move gave the QP failed with sends
	 * owed and none completed. barren counts them in a row; moved_at and
	 * moved_retired are the last move's time and the signalled sends its path had
	 * retired then; barren_seen is the move a failure was last weighed for. */
	unsigned barren;
	int barren_seen;
	int64_t moved_at;
	uint64_t moved_retired;
	int64_t oom_since; /* r2cc_batch_add() has found no memory for it since (0: has) */
	/* Failback: the NIC the move under way returns the QP to (NULL: not a
	 * failback), and whether its current path is one a failback made (the next
	 * failure of that path is the NIC's flap, which the NIC's hold-down bounds:
	 * it does not count towards churning). */
	struct r2cc_nic *failback_to;
	bool back_path;
	bool gone; /* NCCL's destroy of the QP succeeded: nothing of NCCL's refers to it */
	/* The registry's object of NCCL's QP once destroyed: freed with the record, so
	 * that a thread that read r->q before it became NULL reads valid memory. */
	struct r2cc_qp *q_gone;
	/* The QP was created on its NIC after the NIC failed (moved once connected): it
	 * joins the NIC's incident, but not the time its failure took to repair. */
	bool born_late;
};

struct incident {
	char nic[R2CC_NIC_NAME_MAX];
	char evidence[96];
	int64_t t_detect, t_done;
	int qps, migrated, failed;
	uint64_t bytes_reposted, bytes_saved, synth, held;
	/* clear-to-send writes the peer was asked about, and those it found landed
	 * (not re-posted) */
	uint64_t cts_checked, cts_landed;
	/* queue pairs whose peer's rkey map came with its message, and those for
	 * which it did not and was fetched */
	int maps_carried, maps_fetched;
	/* maps fetched after the move, for keys the peer registered since (r2cc_keys_tick) */
	int maps_later;
	bool declared; /* a declared failure moved these QPs, not a detected one */
	bool failback; /* a NIC came back and these QPs returned to it */
	bool drill;    /* R2CC_DRILL cut the path that failed (repair/drill.h) */
	/* every queue pair of it moved or failed (counted in the statistics page once),
	 * and R2CC_ON_INCIDENT told of it (repair/hook.c) */
	bool settled, told;
	int64_t t_settled;
	int created_after; /* of qps: created on the NIC after it failed (born_late) */
	int nevents;
	struct {
		int64_t t;
		char text[112];
	} ev[MAX_EVENTS];
};

/*
 * The exchange travels in messages of one header, one entry per queue pair and
 * the sender's rkey maps: every queue pair an engine repairs with one peer
 * process at a time goes in the same message (up to WIRE_MAX_ENTRIES), and a
 * REQ or REP carries, once per NIC pair, the map of the sender's keys from the
 * NIC of its QP's original path (those NCCL's peer holds) to the NIC of its new
 * path, so that the receiver translates the keys it is about to post without
 * asking (a round trip per peer, to a process that must be scheduled first).
 * Little-endian, ends as in repair/peer.h (the exact identities of NCCL's QPs).
 */
#define WIRE_VERSION  R2CC_REPAIR_WIRE_VERSION
#define WIRE_MAX_MAPS 255

struct rep_hdr {
	uint8_t version;
	uint8_t nmaps; /* rkey maps after the entries */
	uint16_t n;
	uint32_t ncts; /* clear-to-send records after the maps */
} __attribute__((packed));

struct rep_wire {
	uint8_t op;
	uint8_t pad;
	uint16_t flags;
	int32_t status;
	uint64_t pair_id;
	uint8_t src[R2CC_PEER_EP_WIRE]; /* NCCL's QPs: the sender's end, */
	uint8_t dst[R2CC_PEER_EP_WIRE]; /* the addressee's */
	uint64_t count; /* the sender's successful receive completions on the old path */
	uint32_t work;	/* queue pairs the sender repairs at once (its deadlines follow) */
	uint32_t new_qpn;
	uint16_t new_lid;
	uint8_t new_port, new_mtu;
	uint8_t new_gid[16];
	char new_nic[64];
	char orig_nic[64];
	/* messages (receive-consuming requests) the sender's sends retired on the
	 * old path, and the last nlost of them, oldest first (numbers sent - nlost
	 * + 1 .. sent): the addressee makes the receive completions its device lost
	 * from them */
	uint64_t sent;
	uint8_t nlost;
	uint8_t lost_op[R2CC_SHADOW_LOST_MAX]; /* WIRE_MSG_* */
	uint32_t lost_imm[R2CC_SHADOW_LOST_MAX];
	uint32_t lost_len[R2CC_SHADOW_LOST_MAX];
} __attribute__((packed));

enum { WIRE_MSG_WRITE_IMM = 1, WIRE_MSG_SEND, WIRE_MSG_SEND_IMM };

/* An rkey map after the entries: NUL-terminated NIC names, then len bytes as
 * repair/model/mr_mirror.h encodes a full map. */
struct rep_map {
	char from[64];
	char to[64];
	uint32_t len;
} __attribute__((packed));

struct inbox {
	struct inbox *next;
	uint64_t job_id;
	int from_rank;
	int n;
	int nmaps;
	const unsigned char *maps;  /* nmaps of them, checked (after m[n]) */
	bool map_ok[WIRE_MAX_MAPS]; /* stored in the key cache */
	int ncts;
	const struct rep_cts *cts; /* ncts of them, checked (after the maps) */
	struct rep_wire m[];
};

/*
 * A clear-to-send record after the maps (repair/model/cts.h): a query about one of the
 * sender's unretired clear-to-send writes into the addressee's memory (a REQ's or
 * a REP's), or the answer to one (a REP's or a GO's), for the entry it names.
 */
enum { CTS_QUERY = 1, CTS_ANSWER = 2 };
struct rep_cts {
	uint16_t entry;	 /* the entry of this message it belongs to */
	uint8_t kind;	 /* CTS_QUERY, CTS_ANSWER */
	uint8_t nelem;	 /* elements the write carries: 1..R2CC_CTS_MAX_ELEMS */
	uint8_t elem;	 /* bytes of one: 32 or 64 */
	uint8_t idx_off; /* where idx sits in one: a multiple of 8, idx_off + 8 <= elem */
	uint8_t landed;	 /* answer: 1 when every element holds idx >= tag, else 0 */
	uint8_t pad;
	uint64_t addr; /* the write's remote address */
	uint64_t tag;  /* the idx it carries */
} __attribute__((packed));

/* A directory whose communicator is gone, freed once no queue pair uses it. */
struct retired_dir {
	struct retired_dir *next;
	struct r2cc_ctl_dir *dir;
};

/*
 * Entries on their way to peer processes, one box per (job, rank): whatever
 * the repair thread has for one peer in one go leaves in one message.
 */
struct outbox {
	const struct r2cc_ctl_dir *dir;
	int rank;
	int n, cap;
	struct rep_wire *e;
	int nc, ccap;
	struct rep_cts *c; /* their clear-to-send records, entry indexing e */
};

struct outboxes {
	struct r2cc_hmap by_peer; /* hash of (dir, rank) -> index + 1 */
	struct outbox *box;
	int n, cap;
};

/* The other end of an RC connection and the transport attributes. */
struct qp_link {
	uint32_t qpn;
	uint16_t lid;
	enum ibv_mtu mtu;
	const uint8_t *gid;		  /* non-NULL: a GRH to this GID, */
	uint8_t sgid_index;		  /* from this one of ours, */
	uint8_t hop_limit, traffic_class; /* (hop limit 0: 255) */
	uint32_t flow_label;
	uint8_t sl;
	uint8_t timeout, retry_cnt, rnr_retry;
};

/* A batch: the records the repair thread works on together, each marked busy
 * (NCCL's destroy of one waits) until r2cc_batch_release(). */
struct batch {
	struct r2cc_rqp **r;
	int n, cap;
};

/* NCCL's QP of a record, read once (NULL once NCCL destroys it): from threads that
 * do not hold r->mu. The object stays valid as long as the record (rqp.c). */
static inline struct r2cc_qp *r2cc_rqp_qp(const struct r2cc_rqp *r)
{
	return __atomic_load_n(&r->q, __ATOMIC_ACQUIRE);
}

static inline int load_state(const struct r2cc_rqp *r)
{
	return __atomic_load_n(&r->state, __ATOMIC_ACQUIRE);
}

static inline void set_state(struct r2cc_rqp *r, int s)
{
	__atomic_store_n(&r->state, s, __ATOMIC_RELEASE);
}

static inline int64_t now_ns(void)
{
	return (int64_t)r2cc_now_ns();
}

/* A signalled zero-byte RDMA write of R2CC's own on qp, through c's provider op (not
 * the wrappers): a probe behind NCCL's requests, a fence's send marker, a self-test's
 * write. 0 when posted. */
static inline int r2cc_post_zero_write(struct r2cc_ctx *c, struct ibv_qp *qp, uint64_t wr_id)
{
	struct ibv_send_wr w = {.wr_id = wr_id,
				.opcode = IBV_WR_RDMA_WRITE,
				.send_flags = IBV_SEND_SIGNALED},
			   *bad;
	return c->post_send(qp, &w, &bad);
}

/* A failure is suspected on r's current path: queue it (any thread). */
/* Only a connected QP is fenced: NCCL still moves one in INIT or RTR to RTS, and
 * a QP in ERR would refuse that. One on a failed NIC moves when it reaches RTS
 * (r2cc_repair_qp_ready), and only once that has run: between NCCL's modify_qp
 * to RTS and the tracking of its peer, a detection would find no peer to ask.
 * qp_ready publishes `ready` and then reads the NIC's state, a failure stores
 * the state and then reads `ready` (both sequentially consistent), so one of the
 * two sees the other and the QP is detected once. */
static inline bool connected(const struct r2cc_rqp *r)
{
	const struct r2cc_qp *q = __atomic_load_n(&r->q, __ATOMIC_ACQUIRE);
	return q && __atomic_load_n(&q->state, __ATOMIC_RELAXED) == IBV_QPS_RTS &&
	       __atomic_load_n(&r->ready, __ATOMIC_SEQ_CST);
}

/* The engine of this process. */
struct r2cc_engine {
	pthread_mutex_t mu;
	pthread_cond_t cond;
	bool started, stop;
	bool running;  /* the repair thread has not returned */
	int selftests; /* self-test threads running */
	pid_t pid;     /* the process that started them (a forked child has none) */
	pthread_t thread;
	struct r2cc_repair_verbs v;
	bool have_verbs;
	struct r2cc_rqp *all;
	struct r2cc_rqp *work_head;
	struct inbox *in_head, **in_tail;
	struct r2cc_ctl_dir **dirs;
	int ndirs, dircap;
	struct retired_dir *retired;
	int64_t last_dir_sweep, last_record_sweep;
	struct incident inc[MAX_INCIDENTS];
	int ninc;
	void **own; /* R2CC's own QPs and CQs */
	int nown, owncap;
	int64_t last_progress; /* latest retirement seen by the stall scan */
	int64_t next_failback; /* r2cc_failback_tick() due */
	/* lists of records in use outside r2cc_eng.mu (collect), and the records of
	 * destroyed QPs freed so far (r2cc_records_sweep_locked) */
	int holders;
	uint64_t records, records_freed;
	uint64_t destroyed_in_repair; /* NCCL destroyed the QP while a repair had it */
	/* The connections (local and remote end) of the last GONE_RING tracked QPs NCCL
	 * destroyed: an exchange message for one of them is answered with a NACK, so
	 * that the peer's repair ends at once instead of at its deadline. */
	struct gone_conn {
		struct r2cc_peer_ep local, remote;
	} gone[GONE_RING];
	unsigned ngone;
	int keys_due; /* atomic: a QP holds sends for the peer's keys (r2cc_keys_tick) */
	/* stall suspicions (scan), and how the confirmations ended (self-tests) */
	uint64_t stalls_suspected, stalls_node_wide;
	uint64_t far_ends_asked; /* waits whose peer was asked to test its end (scan) */
	/* sends posted on a moved path: by NCCL's threads (r2cc_app_flush_run) and by the
	 * repair thread (only where NCCL's could not be asked) */
	uint64_t reposts_nccl, reposts_repair;
	uint64_t selftests_passed, selftests_failed, selftests_inconclusive;
	int64_t selftest_answer_max_ns; /* the slowest first answer of a test that passed */
	uint64_t selftests_far;		/* tests with a far witness write posted */
	struct r2cc_failspec declared;	/* R2CC_FAILED_NODE / R2CC_FAILED_HCA */
	int node_index;			/* this process's node in the job, -1 unknown */
	/* a directory R2CC_DRILL reads outside r2cc_eng.mu (repair/drill.c): not freed */
	const struct r2cc_ctl_dir *dir_borrowed;
	uint64_t next_pair;
};

extern struct r2cc_engine r2cc_eng;

/* Picks records for r2cc_rqp_collect(). */
typedef bool (*rqp_pred)(const struct r2cc_rqp *r, const void *arg);

/*
 * Functions shared by the files of repair/ (those the wrappers call are in
 * engine.h), by the file that has them.
 */

/* repair/incident.c */
void r2cc_incident_json(FILE *json, const struct incident *in, double mono_to_unix);
/* After a queue pair of incident idx moved or failed; under r2cc_eng.mu. */
void r2cc_incident_progress(int idx);
double r2cc_mono_to_unix(void);

/* repair/hook.c: R2CC_ON_INCIDENT; a settled incident is told within ~0.2 s */
void r2cc_hook_wake(void);

/* repair/engine.c */
void r2cc_own_add(void *obj);
void r2cc_own_remove(void *obj);
bool r2cc_own_has(const void *obj);
const struct r2cc_ctl_dir *r2cc_dir_of_job(uint64_t job_id, int rank);
int r2cc_rqp_peer(struct r2cc_rqp *r);
void r2cc_engine_start_locked(void);
void r2cc_work_push_locked(struct r2cc_rqp *r);
void r2cc_batch_add(struct batch *b, struct r2cc_rqp *r);
void r2cc_work_take_locked(struct batch *b);
void r2cc_batch_release(struct batch *b);

/* repair/rqp.c */
void r2cc_records_sweep_locked(void);
int r2cc_rqp_collect(struct r2cc_rqp ***list, rqp_pred pred, const void *arg);
void r2cc_rqp_collect_done(struct r2cc_rqp **list);
bool r2cc_rqp_on_nic(const struct r2cc_rqp *r, const void *nic);

/* repair/detect.c */
void r2cc_detect_note(struct r2cc_rqp *r, const char *cause, int status);
void r2cc_detect(struct r2cc_rqp *r, const char *cause, int status);
bool r2cc_detect_hides(struct r2cc_rqp *r, const char *why, int status);
void r2cc_detect_on(struct r2cc_rqp *r, const struct r2cc_nic *nic, const char *cause, int status);
bool r2cc_refused_by_dead_device(int rc);
void r2cc_nic_dead(struct r2cc_nic *nic, const char *what, int rc);
void r2cc_declared_apply(void);
void r2cc_nic_failed(struct r2cc_nic *nic, const char *why);
void r2cc_nic_failed_on_node(struct r2cc_nic *nic, int pid, const char *its_why);
void r2cc_place_ledger_use(void);

/* repair/scan.c */
int64_t r2cc_scan_floor(void);
void r2cc_scan(int64_t t);
void r2cc_probe(struct r2cc_rqp *r, int64_t t, uint64_t posted_now);

/* repair/localise.c */
void r2cc_localise(struct r2cc_rqp *r);
void r2cc_nic_failure_seen(const struct r2cc_nic *nic);
int64_t r2cc_nic_failure_at(int i);
bool r2cc_selftest_spawn(struct r2cc_nic *a, const char *why, bool calibrate, bool failback);
void r2cc_selftest_start(struct r2cc_nic *a, const char *why, bool stall);
/* When the writes of a's last self-test that passed went out (0: none): a was alive
 * then. Any thread. */
int64_t r2cc_selftest_alive_from(const struct r2cc_nic *a);
int r2cc_selftest_witnesses(const struct r2cc_nic *a);
void r2cc_selftest_calibrate(struct r2cc_nic *a);

/* repair/fence.c */
int r2cc_fence(struct r2cc_rqp *r);
void r2cc_fence_all(struct r2cc_rqp **list, int n, int *rc);
const char *r2cc_fence_failure(int rc);

/* repair/placement.c */
bool r2cc_rqp_receiving(const struct r2cc_rqp *r);
struct ibv_pd *r2cc_pd_on(struct r2cc_rqp *r, struct r2cc_nic *nic);
bool r2cc_nic_usable(struct r2cc_rqp *r, struct r2cc_nic *nic, bool last_resort);
void r2cc_left_failed(struct r2cc_rqp *r);
void r2cc_place_ledger_move(struct r2cc_rqp *r, struct r2cc_nic *nic, int dir);
struct r2cc_nic *r2cc_place(struct r2cc_rqp *r, const char *rail);
struct r2cc_ctx *r2cc_ctx_of_nic(struct r2cc_nic *nic);

/* repair/path.c */
uint8_t r2cc_path_mtu(const struct r2cc_rqp *r, const struct r2cc_nic *nic);
const uint8_t *r2cc_path_gid(const struct r2cc_rqp *r, const struct r2cc_nic *nic);
void r2cc_path_put(struct r2cc_rqp *r, struct ibv_qp *qp, struct pcq *pc);
void r2cc_destroy_private(struct ibv_qp *qp, struct ibv_cq *cq);
void r2cc_path_drop_new(struct r2cc_rqp *r);
int r2cc_own_qp_init(struct ibv_qp *qp, const struct r2cc_nic *nic, int access,
		     uint16_t pkey_index);
int r2cc_own_qp_connect(struct ibv_qp *qp, const struct r2cc_nic *nic, const struct qp_link *l);
int r2cc_path_on_healthy(struct r2cc_rqp *r, struct r2cc_nic *first, const char *rail,
			 const struct peer_path *p, struct r2cc_nic **nicp);
int r2cc_path_on_healthy_self(struct r2cc_rqp *r, struct r2cc_nic *first, struct peer_path *p,
			      struct r2cc_nic **nicp);
int r2cc_path_new(struct r2cc_rqp *r, struct r2cc_nic *nic);
int r2cc_path_connect(struct r2cc_rqp *r, const struct peer_path *p);

/* repair/farprobe.c: far probes, the witness of a one-sibling NIC's self-test */
#define R2CC_FAR_PEERS 2 /* peer NICs a test probes at most */
struct far_pair {
	const struct r2cc_ctl_dir *dir; /* the peer's job; NULL: the slot is free */
	int rank;
	struct r2cc_peer_ep theirs; /* NCCL's QP at the peer, on the probed NIC */
	struct r2cc_nic *b;	    /* the sibling the witness QP is on */
	struct ibv_qp *qp[2];	    /* [0] on the tested NIC, [1] on b */
	struct ibv_cq *cq[2];
	int64_t built;
};
int r2cc_far_prepare(struct r2cc_nic *a, struct r2cc_nic *b, struct far_pair **out, bool build);
void r2cc_far_drop(struct r2cc_nic *a, struct far_pair *p);
bool r2cc_far_ready(const struct r2cc_nic *a);
void r2cc_far_warm(struct r2cc_nic *a);
struct inbox;
void r2cc_far_serve(const struct inbox *in, struct r2cc_rqp **rq, const struct r2cc_ctl_dir *dir);
void r2cc_far_answered(const struct inbox *in, struct r2cc_rqp **rq);
bool r2cc_selftest_spawn_far(struct r2cc_nic *a);
int r2cc_path_match_sgid(struct r2cc_ctx *c, uint8_t port, const struct r2cc_qp *q,
			 union ibv_gid *gid);

/* repair/wire.c */
void r2cc_wire_fill(struct rep_wire *m, int op, const struct r2cc_rqp *r);
void r2cc_wire_counts(struct rep_wire *m, const struct r2cc_rqp *r);
void r2cc_wire_take_counts(struct r2cc_rqp *r, const struct rep_wire *m);
void r2cc_wire_path(struct rep_wire *m, const struct r2cc_rqp *r);
struct rep_wire *r2cc_out_add(struct outboxes *o, const struct r2cc_ctl_dir *dir, int rank);
/* c: nc clear-to-send records of the entries, by their index in e (may be NULL). */
int r2cc_wire_send(const struct r2cc_ctl_dir *dir, int rank, const struct rep_wire *e, int n,
		   const struct rep_cts *c, int nc);
/* Records for the entry r2cc_out_add() gave last to (dir, rank): 0 or -ENOMEM. */
int r2cc_out_cts(struct outboxes *o, const struct r2cc_ctl_dir *dir, int rank,
		 const struct rep_cts *c, int n);
/* repair/landed.c. After the fence: this side's queries (their number, or -ENOMEM:
 * none); the answers to the queries of entry `entry` of in, into the entry last
 * added for (dir, rank); the answers for r in entry `entry` of in, kept; the plan's
 * landed writes dropped; all of it forgotten. */
int r2cc_cts_queries(struct r2cc_rqp *r);
int r2cc_cts_answer(struct outboxes *o, const struct r2cc_ctl_dir *dir, int rank,
		    const struct inbox *in, int entry);
void r2cc_cts_take(struct r2cc_rqp *r, const struct inbox *in, int entry);
void r2cc_cts_drop(struct r2cc_rqp *r);
void r2cc_cts_forget(struct r2cc_rqp *r);
void r2cc_out_flush(struct outboxes *o);
void r2cc_wire_on_msg(void *arg, int from_rank, const void *payload, size_t len,
		      struct r2cc_ctl_call *call);

/* repair/exchange.c */
struct inbox *r2cc_inbox_pop_locked(void);
void r2cc_exchange_initiate(struct batch *b);
/* The peer's process asked to test its end of r's path: the rank asked, or -EAGAIN
 * while the peer is still being searched, another negative errno when there is
 * nobody to ask or the notice could not be sent. */
int r2cc_exchange_suspect(struct r2cc_rqp *r);
void r2cc_exchange_handle(struct inbox *in);
void r2cc_exchange_tick(int64_t t);
void r2cc_exchange_peer_found(void *cookie);

/* repair/migrate.c */
bool r2cc_app_flush_need(struct r2cc_rqp *r);
void r2cc_app_flush_run(struct r2cc_rqp *r);
void r2cc_app_flush_poll(struct r2cc_vcq *v);
/* gpuflush.c */
struct r2cc_gflush;
int r2cc_gflush_cover(struct r2cc_rqp *r, struct r2cc_nic *nic);
bool r2cc_gflush_take(struct r2cc_rqp *r, const struct ibv_send_wr *w);
bool r2cc_gflush_wc(struct r2cc_rqp *r, const struct ibv_wc *wc);
void r2cc_gflush_release(struct r2cc_vcq *v);
void r2cc_gflush_destroy(struct r2cc_rqp *r);
int r2cc_send_one_locked(struct r2cc_rqp *r, const struct ibv_send_wr *w);
bool r2cc_refused_take(struct r2cc_rqp *r, int rc, struct r2cc_nic *nic);
int r2cc_path_new_self(struct r2cc_rqp *r, struct r2cc_nic *nic);
int r2cc_plan_post_sends(struct r2cc_rqp *r, uint64_t *held);
int r2cc_path_commit(struct r2cc_rqp *r, const struct peer_path *p, bool sends, uint64_t *held);
void r2cc_rqp_fail(struct r2cc_rqp *r, const char *why);
void r2cc_rqp_done(struct r2cc_rqp *r, uint64_t held);
const char *r2cc_rqp_churning(struct r2cc_rqp *r);
void r2cc_migrate_loopback(struct r2cc_rqp *r);

/* repair/vcq.c */
bool r2cc_stash_room(struct r2cc_vcq *v, size_t n);
void r2cc_stash_push(struct r2cc_vcq *v, const struct ibv_wc *wc);
void r2cc_vcq_pump(struct r2cc_cq *c);
void r2cc_stash_release_locked(struct r2cc_rqp *r);
void r2cc_stash_release(struct r2cc_rqp *r);

/* repair/post.c */
void r2cc_keys_need(struct r2cc_rqp *r);
int r2cc_post_one_send(struct r2cc_rqp *r, const struct ibv_send_wr *w);
int r2cc_post_one_recv(struct r2cc_rqp *r, const struct ibv_recv_wr *w);
int r2cc_hold_send(struct r2cc_rqp *r, const struct ibv_send_wr *w);
int r2cc_hold_recv(struct r2cc_rqp *r, const struct ibv_recv_wr *w);
int r2cc_held_flush_recvs(struct r2cc_rqp *r);
int r2cc_held_flush_sends(struct r2cc_rqp *r, uint64_t *n);
void r2cc_keys_tick(void);

/* repair/failback.c */
void r2cc_failback_never(const struct r2cc_nic *nic);
void r2cc_failback_verdict(int i, int verdict);
void r2cc_failback_tick(int64_t t);

/* repair/incident.c */
int r2cc_incident_get(const char *nic, const char *evidence, int64_t t, bool born_late);
void r2cc_incident_event(int idx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void r2cc_rqp_event(const struct r2cc_rqp *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void r2cc_report_stalls(FILE *text, FILE *json);
