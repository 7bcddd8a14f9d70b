/*
 * Hot repair: health monitor and migration engine (see engine.h for the
 * exchange, qp_shadow.h for the exactly-once rules, mr_mirror.h for keys).
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
 * (stash of completions for NCCL, attached private CQs), eng.mu (queues,
 * directories, incidents). The repair thread never holds eng.mu while it takes
 * another lock. rqp->state is also read without rqp->mu (atomic) by the poll
 * side, which only needs to know whether errors are to be hidden.
 */
#include "repair/engine.h"
#include "repair/hmap.h"
#include "repair/job.h"
#include "repair/ledger.h"
#include "repair/mr_mirror.h"
#include "repair/peer.h"
#include "repair/qp_shadow.h"
#include "repair/stall.h"
#include "shim/common.h"
#include "shim/core.h"
#include "shim/failspec.h"
#include "shim/log.h"
#include "shim/params.h"
#include "shim/report.h"

#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* wr_ids of the drain markers posted behind NCCL's requests on a fenced QP. */
#define MARK_S 0x5232434346454e53ull /* "R2CCFENS" */
#define MARK_R 0x5232434346454e52ull /* "R2CCFENR" */

#define SCAN_NS		     5000000ll	 /* stall scan period */
#define SUSPECT_AGAIN_NS     200000000ll /* a stall that outlives its confirmation: first back-off */
#define SUSPECT_MAX_NS	     5000000000ll
#define PROBE_IDLE_NS	     20000000ll /* trailing unsignalled requests probed after this */
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
#define FAILBACK_JOIN_NS     200000000ll    /* QPs of one failback start within this */

enum rq_state {
	RQ_HEALTHY,
	RQ_DETECTED, /* queued for the repair thread; posts still go to the current path */
	RQ_FENCING,  /* gate closed, current path in ERR: posts are held */
	RQ_EXCHANGE, /* new path being connected; recv_live / send_live open it per queue */
	RQ_MIGRATED,
	RQ_FAILED, /* repair impossible: NCCL gets the error */
};

enum { OP_REQ = 1, OP_REP, OP_GO, OP_NACK, OP_SUSPECT };
/* rep_wire.flags: the REQ's sender knows its own NIC failed (declared, port down,
 * self-test failed): the responder's side is healthy and keeps its NIC. */
#define WIRE_F_SENDER_NIC_FAILED 0x1
/* ... because it was declared failed (R2CC_FAILED_NODE/HCA): nothing was detected. */
#define WIRE_F_DECLARED 0x2
/* A failback: the sender's NIC came back and its QP returns to it; nothing failed,
 * and the responder returns to its own original NIC if that is up. */
#define WIRE_F_FAILBACK 0x4

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
	/* Entries kept free for the error completion fail() owes each repaired QP
	 * of this CQ: count + reserved <= cap, and only fail() takes from them. */
	size_t reserved;
	struct pcq *pcqs; /* R2CC's CQs behind this one */
	/* QPs whose re-posts wait for NCCL's own thread (app_flush_need): run at
	 * its next poll of this CQ. Under mu; nflush also read atomically. */
	struct r2cc_rqp **flush;
	int nflush, capflush;
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
	bool declared_pending; /* on a declared-failed NIC, waiting for NCCL's first post */
	bool loopback;	       /* connected to itself (NCCL's GPU flush QP) */
	bool hold_all;	       /* every post is held until the new path is live */
	bool stash_held;       /* one of its CQ's reserved stash entries is its own */
	/* A held send waits for the peer's rkey map (a key the cache lacks: the
	 * repair thread fetches it, then posts the held sends); fetch attempts that
	 * failed in a row. Under mu. */
	bool keys_wait;
	int keys_tries;
	/* The plan's re-posts and NCCL's held sends wait for NCCL's own thread (its
	 * next post on the QP or poll of its CQ: app_flush_run), and the error a held
	 * send got there (atomic; the repair thread gives the QP its error). */
	bool app_flush;
	int flush_err;
	/* path being built */
	struct ibv_qp *new_qp;
	struct ibv_cq *new_cq;
	struct pcq *new_pcq;
	struct r2cc_ctx *new_ctx;
	struct r2cc_qp_shadow *new_sh;
	/* drain */
	bool mark_s, mark_r;
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
	 * them: repair/qp_shadow.h) */
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
	struct held_send *hs_head, **hs_tail;
	struct held_recv *hr_head, **hr_tail;
	/* stall scan */
	uint64_t scan_retired, scan_posted;
	int64_t scan_progress, scan_idle;
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
	} left[LEFT_RING]; /* NICs whose path failed under it, and when (left_failed) */
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
	int64_t oom_since; /* batch_add() has found no memory for it since (0: has) */
	/* Failback: the NIC the move under way returns the QP to (NULL: not a
	 * failback), and whether its current path is one a failback made (the next
	 * failure of that path is the NIC's flap, which the NIC's hold-down bounds:
	 * it does not count towards churning). */
	struct r2cc_nic *failback_to;
	bool back_path;
	bool gone; /* NCCL's destroy of the QP succeeded: nothing of NCCL's refers to it */
};

struct incident {
	char nic[R2CC_NIC_NAME_MAX];
	char evidence[96];
	int64_t t_detect, t_done;
	int qps, migrated, failed;
	uint64_t bytes_reposted, bytes_saved, synth, held;
	/* queue pairs whose peer's rkey map came with its message, and those for
	 * which it did not and was fetched */
	int maps_carried, maps_fetched;
	/* maps fetched after the move, for keys the peer registered since (keys_tick) */
	int maps_later;
	bool declared; /* a declared failure moved these QPs, not a detected one */
	bool failback; /* a NIC came back and these QPs returned to it */
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
 * repair/mr_mirror.h encodes a full map. */
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
	struct rep_wire m[];
};

/* A directory whose communicator is gone, freed once no queue pair uses it. */
struct retired_dir {
	struct retired_dir *next;
	struct r2cc_ctl_dir *dir;
};

static struct {
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
	int64_t next_failback; /* failback_tick() due */
	/* lists of records in use outside eng.mu (collect), and the records of
	 * destroyed QPs freed so far (records_sweep_locked) */
	int holders;
	uint64_t records, records_freed;
	int keys_due; /* atomic: a QP holds sends for the peer's keys (keys_tick) */
	/* stall suspicions (scan), and how the confirmations ended (self-tests) */
	uint64_t stalls_suspected, stalls_node_wide;
	/* sends posted on a moved path: by NCCL's threads (app_flush_run) and by the
	 * repair thread (only where NCCL's could not be asked) */
	uint64_t reposts_nccl, reposts_repair;
	uint64_t selftests_passed, selftests_failed, selftests_inconclusive;
	struct r2cc_failspec declared; /* R2CC_FAILED_NODE / R2CC_FAILED_HCA */
	int node_index;		       /* this process's node in the job, -1 unknown */
	uint64_t next_pair;
} eng = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .cond = PTHREAD_COND_INITIALIZER,
    .node_index = -1,
};

static int load_state(const struct r2cc_rqp *r)
{
	return __atomic_load_n(&r->state, __ATOMIC_ACQUIRE);
}

static void set_state(struct r2cc_rqp *r, int s)
{
	__atomic_store_n(&r->state, s, __ATOMIC_RELEASE);
}

static int64_t now_ns(void)
{
	return (int64_t)r2cc_now_ns();
}

/*
 * NCCL's own port failover (2.29.7+, NCCL_IB_RESILIENCY_PORT_FAILOVER, and the
 * failback of 2.30.3+, ..._PORT_RECOVERY) acts on the same error completions as
 * hot repair: both at once would each move QPs the other is moving. When either is
 * set to non-zero for an NCCL that reads it (or one whose version is not known
 * yet), R2CC steps aside: hot repair is off for the process, with one warning
 * naming the variable; counters, reports and the NCCL wrappers stay. An older
 * NCCL ignores the variables, and R2CC repairs as usual.
 */
static bool nccl_failover_on(void)
{
	static const char *const vars[] = {"NCCL_IB_RESILIENCY_PORT_FAILOVER",
					   "NCCL_IB_RESILIENCY_PORT_RECOVERY"};
	static int warned;
	int code = __atomic_load_n(&r2cc_nccl_version, __ATOMIC_RELAXED);
	if (code && code < 22907)
		return false;
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		const char *v = getenv(vars[i]);
		if (!v || !*v || !strcmp(v, "0"))
			continue;
		if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
			R2CC_WARN("%s=%s: NCCL's own port failover is on and acts on the same "
				  "errors; R2CC's hot repair steps aside (unset it to let R2CC "
				  "repair, or set R2CC_MODE=0)",
				  vars[i], v);
		return true;
	}
	return false;
}

/* An NCCL integer setting as NCCL reads it (strtoll): non-zero, or dflt unset. */
static bool env_on(const char *name, bool dflt)
{
	const char *v = getenv(name);
	return v && *v ? strtoll(v, NULL, 0) != 0 : dflt;
}

/*
 * NCCL settings under which the re-posted clear-to-send writes are not safe by
 * the model (repair/qp_shadow.h, tests/unit/test_qp_shadow_model.c): inline ones
 * carry the element as it was when posted, and a connection's data split over
 * several QPs per NIC puts one FIFO slot's writes on more than one QP. Hot repair
 * is off for the process then, with one warning naming the setting.
 */
static bool nccl_settings_unsafe(void)
{
	static int warned;
	const char *var = NULL, *val = NULL, *why = NULL;
	const char *qps = getenv("NCCL_IB_QPS_PER_CONNECTION");
	int code = __atomic_load_n(&r2cc_nccl_version, __ATOMIC_RELAXED);
	if (env_on("NCCL_IB_USE_INLINE", false)) {
		var = "NCCL_IB_USE_INLINE";
		val = getenv(var);
		why = "inline writes carry the element as it was when posted";
	} else if (qps && atoi(qps) > 1 &&
		   env_on("NCCL_IB_SPLIT_DATA_ON_QPS", code && code < 22000)) {
		var = "NCCL_IB_QPS_PER_CONNECTION";
		val = qps;
		why = "with NCCL_IB_SPLIT_DATA_ON_QPS one FIFO slot's writes travel on several QPs";
	}
	if (var && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
		R2CC_WARN("%s=%s: hot repair cannot re-post NCCL's clear-to-send writes safely "
			  "with it (%s); hot repair is off for this process (unset it to let "
			  "R2CC repair)",
			  var, val, why);
	return var != NULL;
}

bool r2cc_repair_enabled(void)
{
	return r2cc_active() && r2cc_param.mode != 0 && !nccl_failover_on() &&
	       !nccl_settings_unsafe();
}

void r2cc_repair_set_verbs(const struct r2cc_repair_verbs *v)
{
	pthread_mutex_lock(&eng.mu);
	eng.v = *v;
	eng.have_verbs = v->create_cq && v->destroy_cq && v->create_qp && v->modify_qp &&
			 v->destroy_qp && v->query_port;
	pthread_mutex_unlock(&eng.mu);
}

/* --- incidents --------------------------------------------------------------- */

/* Under eng.mu. */
static int incident_get(const char *nic, const char *evidence, int64_t t)
{
	/* A failback's QPs all start at once (the peer's within its batch): a later
	 * failback of the same NIC is an incident of its own. */
	bool back = !strncmp(evidence, "failback", 8);
	for (int i = eng.ninc - 1; i >= 0; i--)
		if (!strcmp(eng.inc[i].nic, nic) && eng.inc[i].failback == back &&
		    t - eng.inc[i].t_detect < (back ? FAILBACK_JOIN_NS : INCIDENT_JOIN_NS))
			return i;
	if (eng.ninc == MAX_INCIDENTS)
		return MAX_INCIDENTS - 1;
	struct incident *in = &eng.inc[eng.ninc];
	memset(in, 0, sizeof(*in));
	snprintf(in->nic, sizeof(in->nic), "%s", nic);
	snprintf(in->evidence, sizeof(in->evidence), "%s", evidence);
	in->declared = strstr(evidence, "declared") != NULL;
	in->failback = back;
	in->t_detect = t;
	return eng.ninc++;
}

static void incident_event(int idx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void incident_event(int idx, const char *fmt, ...)
{
	if (idx < 0)
		return;
	pthread_mutex_lock(&eng.mu);
	struct incident *in = &eng.inc[idx];
	if (in->nevents < MAX_EVENTS) {
		va_list ap;
		va_start(ap, fmt);
		in->ev[in->nevents].t = now_ns();
		vsnprintf(in->ev[in->nevents].text, sizeof(in->ev[0].text), fmt, ap);
		va_end(ap);
		in->nevents++;
	}
	pthread_mutex_unlock(&eng.mu);
}

/* --- own objects --------------------------------------------------------------- */

static void own_add(void *obj)
{
	pthread_mutex_lock(&eng.mu);
	if (eng.nown == eng.owncap) {
		int cap = eng.owncap ? 2 * eng.owncap : 32;
		void **n = realloc(eng.own, (size_t)cap * sizeof(*n));
		if (n) {
			eng.own = n;
			eng.owncap = cap;
		}
	}
	if (eng.nown < eng.owncap)
		eng.own[eng.nown++] = obj;
	pthread_mutex_unlock(&eng.mu);
}

static void own_remove(void *obj)
{
	pthread_mutex_lock(&eng.mu);
	for (int i = 0; i < eng.nown; i++)
		if (eng.own[i] == obj) {
			eng.own[i] = eng.own[--eng.nown];
			break;
		}
	pthread_mutex_unlock(&eng.mu);
}

static bool own_has(const void *obj)
{
	bool found = false;
	pthread_mutex_lock(&eng.mu);
	for (int i = 0; i < eng.nown && !found; i++)
		found = eng.own[i] == obj;
	pthread_mutex_unlock(&eng.mu);
	return found;
}

bool r2cc_repair_owns_qp(const struct ibv_qp *qp)
{
	return own_has(qp);
}

bool r2cc_repair_owns_cq(const struct ibv_cq *cq)
{
	return own_has(cq);
}

static void start_locked(void);
static void declared_apply(void);

/* --- directories and peers ------------------------------------------------------ */

static void peer_found(void *cookie);

void r2cc_repair_add_dir(struct r2cc_ctl_dir *dir)
{
	if (!dir)
		return;
	pthread_mutex_lock(&eng.mu);
	if (eng.ndirs == eng.dircap) {
		int cap = eng.dircap ? 2 * eng.dircap : 8;
		struct r2cc_ctl_dir **n = realloc(eng.dirs, (size_t)cap * sizeof(*n));
		if (!n) {
			pthread_mutex_unlock(&eng.mu);
			r2cc_ctl_dir_free(dir);
			return;
		}
		eng.dirs = n;
		eng.dircap = cap;
	}
	eng.dirs[eng.ndirs++] = dir;
	/* Peers may ask before this process has a QP of its own. */
	start_locked();
	bool first = eng.node_index < 0;
	if (first) {
		eng.node_index = r2cc_ctl_dir_node(dir, dir->self_rank);
		char err[320];
		if (r2cc_failspec_parse(r2cc_param.failed_node, r2cc_param.failed_hca,
					&eng.declared, err, sizeof(err)))
			eng.declared.nentries = 0; /* validated at start-up already */
	}
	pthread_mutex_unlock(&eng.mu);
	r2cc_peer_add_dir(dir);
	if (first)
		declared_apply();
}

/*
 * The communicator of dir is gone: its peers are found through the other jobs
 * from now on, the rendezvous hears that this rank left, and the directory is
 * freed once no queue pair's repair uses it (a migrated QP keeps translating
 * its peer's keys through it until NCCL destroys the QP).
 */
void r2cc_repair_release_dir(struct r2cc_ctl_dir *dir)
{
	if (!dir)
		return;
	struct retired_dir *rd = malloc(sizeof(*rd));
	r2cc_peer_remove_dir(dir);
	r2cc_ctl_dir_leave(dir);
	pthread_mutex_lock(&eng.mu);
	bool found = false;
	for (int i = 0; i < eng.ndirs && !found; i++)
		if (eng.dirs[i] == dir) {
			memmove(&eng.dirs[i], &eng.dirs[i + 1],
				sizeof(*eng.dirs) * (size_t)(eng.ndirs - i - 1));
			eng.ndirs--;
			found = true;
		}
	if (found && rd) {
		rd->dir = dir;
		rd->next = eng.retired;
		eng.retired = rd;
		rd = NULL;
	}
	pthread_mutex_unlock(&eng.mu);
	/* Out of memory for the list: kept for good rather than freed while used. */
	free(rd);
}

/* Frees the released directories no live queue pair refers to. Under eng.mu. */
static void dirs_sweep_locked(void)
{
	for (struct retired_dir **pp = &eng.retired; *pp;) {
		struct retired_dir *rd = *pp;
		bool used = false;
		for (struct r2cc_rqp *r = eng.all; r && !used; r = r->next_all)
			used = !r->dead && r->dir == rd->dir;
		if (used) {
			pp = &rd->next;
			continue;
		}
		*pp = rd->next;
		bool same_job = false;
		for (int i = 0; i < eng.ndirs && !same_job; i++)
			same_job = eng.dirs[i]->job.id == rd->dir->job.id;
		if (!same_job)
			r2cc_mr_mirror_remote_forget(rd->dir->job.id, -1);
		r2cc_ctl_dir_free(rd->dir);
		free(rd);
	}
}

static const struct r2cc_ctl_dir *dir_of_job(uint64_t job_id, int rank)
{
	const struct r2cc_ctl_dir *d = NULL;
	pthread_mutex_lock(&eng.mu);
	for (int i = eng.ndirs - 1; i >= 0 && !d; i--)
		if (eng.dirs[i]->job.id == job_id && rank >= 0 && rank < eng.dirs[i]->nranks)
			d = eng.dirs[i];
	pthread_mutex_unlock(&eng.mu);
	return d;
}

/*
 * The process that owns r's peer QP, as repair/peer.c found it when the QP
 * reached RTS: 0 and r->dir / r->peer_rank set; -EAGAIN while it is still
 * being searched (the search is hurried), also when no directory is here yet
 * but a registration is on its way; -ENOENT when there is nobody to ask (no
 * communicator with a directory, or the QP is not tracked).
 */
static int peer_of(struct r2cc_rqp *r)
{
	const struct r2cc_ctl_dir *dir;
	int rank;
	pthread_mutex_lock(&eng.mu);
	bool dirs = eng.ndirs > 0;
	pthread_mutex_unlock(&eng.mu);
	if (!r->tracked || (!dirs && !r2cc_job_registering()))
		return -ENOENT;
	int rc = r2cc_peer_of(&r->ep_local, &dir, &rank);
	if (rc == -EAGAIN)
		r2cc_peer_hurry(&r->ep_local);
	if (rc)
		return rc;
	pthread_mutex_lock(&r->mu);
	r->dir = dir;
	r->peer_rank = rank;
	pthread_mutex_unlock(&r->mu);
	return 0;
}

/* --- messages --------------------------------------------------------------------- */

static void wire_fill(struct rep_wire *m, int op, const struct r2cc_rqp *r)
{
	memset(m, 0, sizeof(*m));
	m->op = (uint8_t)op;
	m->pair_id = htole64(r->pair_id);
	r2cc_peer_ep_put(&r->ep_local, m->src);
	r2cc_peer_ep_put(&r->ep_remote, m->dst);
	snprintf(m->orig_nic, sizeof(m->orig_nic), "%s", r->orig_nic->name);
	int st = __atomic_load_n(&r->cur_nic->state, __ATOMIC_RELAXED);
	if (op == OP_REQ && r->failback_to)
		m->flags = htole16(WIRE_F_FAILBACK);
	else if (op == OP_REQ && st != R2CC_NIC_UP)
		m->flags = htole16(WIRE_F_SENDER_NIC_FAILED |
				   (st == R2CC_NIC_DECLARED ? WIRE_F_DECLARED : 0));
}

/* This side's counts after its fence: the receives its old path consumed, the
 * messages its sends retired and its record of the last of them. */
static void wire_counts(struct rep_wire *m, const struct r2cc_rqp *r)
{
	m->count = htole64(r->k_local);
	struct r2cc_shadow_msg last[R2CC_SHADOW_LOST_MAX];
	int n = r2cc_qp_shadow_retired_msgs(r->cur_sh, last);
	m->sent = htole64(r2cc_qp_shadow_msgs_retired(r->cur_sh));
	m->nlost = (uint8_t)n;
	for (int i = 0; i < n; i++) {
		m->lost_op[i] = last[i].opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? WIRE_MSG_WRITE_IMM
				: last[i].opcode == IBV_WR_SEND		     ? WIRE_MSG_SEND
									     : WIRE_MSG_SEND_IMM;
		m->lost_imm[i] = last[i].imm_data; /* network order, as posted */
		m->lost_len[i] = htole32(last[i].byte_len);
	}
}

/* The peer's counts from its REQ or REP. Under r->mu. */
static void wire_take_counts(struct r2cc_rqp *r, const struct rep_wire *m)
{
	static const enum ibv_wr_opcode op[] = {
	    [WIRE_MSG_WRITE_IMM] = IBV_WR_RDMA_WRITE_WITH_IMM,
	    [WIRE_MSG_SEND] = IBV_WR_SEND,
	    [WIRE_MSG_SEND_IMM] = IBV_WR_SEND_WITH_IMM,
	};
	r->k_peer = le64toh(m->count);
	r->peer_sent = le64toh(m->sent);
	r->npeer_lost = m->nlost; /* checked by r2cc_repair_wire_parse() */
	for (int i = 0; i < r->npeer_lost; i++)
		r->peer_lost[i] = (struct r2cc_shadow_msg){
		    .n = r->peer_sent - (uint64_t)(r->npeer_lost - 1 - i),
		    .imm_data = m->lost_imm[i],
		    .byte_len = le32toh(m->lost_len[i]),
		    .opcode = op[m->lost_op[i]],
		};
}

/* The MTU of a new path on nic: its port's, not above NCCL's (NCCL_IB_MTU). */
static uint8_t path_mtu(const struct r2cc_rqp *r, const struct r2cc_nic *nic)
{
	int mtu = nic->active_mtu ? nic->active_mtu : IBV_MTU_1024;
	return (uint8_t)(r->q->path_mtu && r->q->path_mtu < mtu ? r->q->path_mtu : mtu);
}

/* The new path's own GID, as its peer addresses it: the matching source GID with a
 * GRH, the NIC's otherwise. */
static const uint8_t *new_path_gid(const struct r2cc_rqp *r, const struct r2cc_nic *nic)
{
	return r->q->peer.has_grh ? r->new_sgid.raw : nic->gid.raw;
}

static void wire_path(struct rep_wire *m, const struct r2cc_rqp *r)
{
	struct r2cc_nic *nic = r->new_ctx->nic;
	m->new_qpn = htole32(r->new_qp->qp_num);
	m->new_lid = htole16(nic->lid);
	m->new_port = nic->port ? nic->port : 1;
	m->new_mtu = path_mtu(r, nic);
	memcpy(m->new_gid, new_path_gid(r, nic), 16);
	snprintf(m->new_nic, sizeof(m->new_nic), "%s", nic->name);
}

/*
 * Entries on their way to peer processes, one box per (job, rank): whatever
 * the repair thread has for one peer in one go leaves in one message.
 */
struct outbox {
	const struct r2cc_ctl_dir *dir;
	int rank;
	int n, cap;
	struct rep_wire *e;
};

struct outboxes {
	struct r2cc_hmap by_peer; /* hash of (dir, rank) -> index + 1 */
	struct outbox *box;
	int n, cap;
};

static uint64_t peer_key(const struct r2cc_ctl_dir *dir, int rank)
{
	uint64_t k[2] = {(uint64_t)(uintptr_t)dir, (uint64_t)rank};
	return r2cc_hmap_hash_bytes(k, sizeof(k));
}

static struct outbox *box_of(struct outboxes *o, const struct r2cc_ctl_dir *dir, int rank)
{
	uint64_t key = peer_key(dir, rank);
	uintptr_t v = (uintptr_t)r2cc_hmap_get(&o->by_peer, key);
	if (v && o->box[v - 1].dir == dir && o->box[v - 1].rank == rank)
		return &o->box[v - 1];
	for (int i = 0; v && i < o->n; i++) /* another peer behind the same hash */
		if (o->box[i].dir == dir && o->box[i].rank == rank)
			return &o->box[i];
	if (o->n == o->cap) {
		int cap = o->cap ? 2 * o->cap : 16;
		struct outbox *g = realloc(o->box, sizeof(*g) * (size_t)cap);
		if (!g)
			return NULL;
		o->box = g;
		o->cap = cap;
	}
	struct outbox *b = &o->box[o->n];
	*b = (struct outbox){.dir = dir, .rank = rank};
	if (!v)
		r2cc_hmap_put(&o->by_peer, key, (void *)(uintptr_t)(o->n + 1));
	o->n++;
	return b;
}

/* Room for one more entry to (dir, rank), or NULL (out of memory: logged by
 * the caller's outcome, the deadline). */
static struct rep_wire *out_add(struct outboxes *o, const struct r2cc_ctl_dir *dir, int rank)
{
	struct outbox *b = box_of(o, dir, rank);
	if (!b)
		return NULL;
	if (b->n == b->cap) {
		int cap = b->cap ? 2 * b->cap : 8;
		struct rep_wire *g = realloc(b->e, sizeof(*g) * (size_t)cap);
		if (!g)
			return NULL;
		b->e = g;
		b->cap = cap;
	}
	return &b->e[b->n++];
}

/*
 * This process's rkey maps that the entries of one send call for, each made
 * once: for a REQ or REP whose QP's new path is on another NIC than its
 * original path, the map between the two (the receiver posts with keys of
 * the original NIC, which NCCL's peer holds).
 */
struct wire_map {
	char from[64], to[64];
	unsigned char *b; /* NULL: could not be made; the receiver fetches it */
	size_t len;
};

struct map_set {
	struct wire_map *m;
	int n, cap;
};

/* The map entry e calls for (made now if it is the first), or -1: none. */
static int map_of(struct map_set *ms, const struct rep_wire *e)
{
	if ((e->op != OP_REQ && e->op != OP_REP) || !strcmp(e->orig_nic, e->new_nic))
		return -1;
	for (int i = 0; i < ms->n; i++)
		if (!strcmp(ms->m[i].from, e->orig_nic) && !strcmp(ms->m[i].to, e->new_nic))
			return i;
	if (ms->n == ms->cap) {
		int cap = ms->cap ? 2 * ms->cap : 4;
		struct wire_map *g = realloc(ms->m, sizeof(*g) * (size_t)cap);
		if (!g)
			return -1;
		ms->m = g;
		ms->cap = cap;
	}
	struct wire_map *w = &ms->m[ms->n];
	memset(w, 0, sizeof(*w));
	snprintf(w->from, sizeof(w->from), "%s", e->orig_nic);
	snprintf(w->to, sizeof(w->to), "%s", e->new_nic);
	int rc = r2cc_mr_mirror_map_encode(w->from, w->to, &w->b, &w->len);
	if (rc)
		R2CC_WARN_ONCE("repair: cannot send the rkey map %s -> %s with the exchange (%s); "
			       "the peer will fetch it",
			       w->from, w->to, strerror(-rc));
	return ms->n++;
}

static void map_set_free(struct map_set *ms)
{
	for (int i = 0; i < ms->n; i++)
		free(ms->m[i].b);
	free(ms->m);
	*ms = (struct map_set){0};
}

/* One message of entries e[0..k), with the maps they call for unless !maps:
 * 0 and *buf (malloc'd, *len bytes), -E2BIG (more than a frame holds) or
 * -ENOMEM. */
static int wire_build(struct map_set *ms, const struct rep_wire *e, int k, bool maps,
		      unsigned char **buf, size_t *len)
{
	int used[WIRE_MAX_MAPS], nu = 0;
	size_t n = sizeof(struct rep_hdr) + (size_t)k * sizeof(*e);
	for (int i = 0; maps && i < k; i++) {
		int j = map_of(ms, &e[i]), u = 0;
		if (j < 0 || !ms->m[j].b)
			continue;
		while (u < nu && used[u] != j)
			u++;
		if (u < nu)
			continue;
		if (nu == WIRE_MAX_MAPS)
			return -E2BIG;
		used[nu++] = j;
		n += sizeof(struct rep_map) + ms->m[j].len;
	}
	if (n > R2CC_CTL_MAX_PAYLOAD)
		return -E2BIG;
	unsigned char *b = malloc(n), *p = b;
	if (!b)
		return -ENOMEM;
	struct rep_hdr h = {
	    .version = WIRE_VERSION, .nmaps = (uint8_t)nu, .n = htole16((uint16_t)k)};
	memcpy(p, &h, sizeof(h));
	p += sizeof(h);
	memcpy(p, e, (size_t)k * sizeof(*e));
	p += (size_t)k * sizeof(*e);
	for (int u = 0; u < nu; u++) {
		const struct wire_map *w = &ms->m[used[u]];
		struct rep_map mh = {.len = htole32((uint32_t)w->len)};
		memcpy(mh.from, w->from, sizeof(mh.from));
		memcpy(mh.to, w->to, sizeof(mh.to));
		memcpy(p, &mh, sizeof(mh));
		memcpy(p + sizeof(mh), w->b, w->len);
		p += sizeof(mh) + w->len;
	}
	*buf = b;
	*len = n;
	return 0;
}

/* Entries to one peer, in as few messages as their number and maps allow: a
 * message that would not fit in a frame is split, each part with the maps of
 * its own entries; a map too large for a frame on its own stays behind (the
 * peer's fetch of it fails the same way). */
static int send_entries(const struct r2cc_ctl_dir *dir, int rank, const struct rep_wire *e, int n)
{
	struct map_set ms = {0};
	int rc = 0;
	for (int first = 0; first < n && rc == 0;) {
		int k = n - first < WIRE_MAX_ENTRIES ? n - first : WIRE_MAX_ENTRIES;
		bool maps = true;
		unsigned char *buf = NULL;
		size_t len = 0;
		while ((rc = wire_build(&ms, e + first, k, maps, &buf, &len)) == -E2BIG && maps) {
			if (k > 1)
				k /= 2;
			else
				maps = false;
		}
		if (rc)
			break;
		rc = r2cc_ctl_send(dir, rank, R2CC_REPAIR_MSG, buf, len);
		free(buf);
		first += k;
	}
	map_set_free(&ms);
	if (rc)
		R2CC_WARN("repair: cannot queue a message of %d queue pair(s) to rank %d (%s)", n,
			  rank, strerror(-rc));
	return rc;
}

/* Sends every box and empties the set. */
static void out_flush(struct outboxes *o)
{
	for (int i = 0; i < o->n; i++) {
		if (o->box[i].n)
			send_entries(o->box[i].dir, o->box[i].rank, o->box[i].e, o->box[i].n);
		free(o->box[i].e);
	}
	free(o->box);
	r2cc_hmap_free(&o->by_peer);
	*o = (struct outboxes){0};
}

_Static_assert(sizeof(struct rep_hdr) == R2CC_REPAIR_WIRE_HDR, "exchange header size");
_Static_assert(sizeof(struct rep_wire) == R2CC_REPAIR_WIRE_SIZE, "exchange entry size");
_Static_assert(sizeof(struct rep_map) == R2CC_REPAIR_WIRE_MAP_HDR, "rkey map header size");
_Static_assert(offsetof(struct rep_wire, new_nic) == R2CC_REPAIR_WIRE_NEW_NIC, "new_nic");
_Static_assert(offsetof(struct rep_wire, orig_nic) == R2CC_REPAIR_WIRE_ORIG_NIC, "orig_nic");
_Static_assert(offsetof(struct rep_wire, sent) == R2CC_REPAIR_WIRE_SENT, "sent");
_Static_assert(R2CC_SHADOW_LOST_MAX == R2CC_REPAIR_WIRE_LOST, "records per entry");
_Static_assert(WIRE_MAX_ENTRIES <= R2CC_REPAIR_WIRE_MAX, "entries per message");

/* The maps after a message's entries: exactly nmaps of them in len bytes, each
 * with both NIC names terminated and not empty, and a body (checked in full
 * when it is stored). */
static bool wire_maps_ok(const unsigned char *p, size_t len, int nmaps)
{
	for (int j = 0; j < nmaps; j++) {
		struct rep_map h;
		if (len < sizeof(h))
			return false;
		memcpy(&h, p, sizeof(h));
		size_t n = le32toh(h.len);
		if (!h.from[0] || !h.to[0] || !memchr(h.from, 0, sizeof(h.from)) ||
		    !memchr(h.to, 0, sizeof(h.to)) || n == 0 || n > len - sizeof(h))
			return false;
		p += sizeof(h) + n;
		len -= sizeof(h) + n;
	}
	return len == 0;
}

int r2cc_repair_wire_parse(const void *payload, size_t len, void *out, int max)
{
	struct rep_hdr h;
	if (len < sizeof(h))
		return -EPROTO;
	memcpy(&h, payload, sizeof(h));
	int n = le16toh(h.n);
	size_t body = sizeof(h) + (size_t)n * sizeof(struct rep_wire);
	if (h.version != WIRE_VERSION || n == 0 || n > max || len < body ||
	    !wire_maps_ok((const unsigned char *)payload + body, len - body, h.nmaps))
		return -EPROTO;
	struct rep_wire *m = out;
	memcpy(m, (const unsigned char *)payload + sizeof(h), (size_t)n * sizeof(*m));
	for (int i = 0; i < n; i++) {
		if (m[i].op < OP_REQ || m[i].op > OP_SUSPECT || m[i].nlost > R2CC_SHADOW_LOST_MAX ||
		    m[i].nlost > le64toh(m[i].sent))
			return -EPROTO;
		for (int j = 0; j < m[i].nlost; j++)
			if (m[i].lost_op[j] < WIRE_MSG_WRITE_IMM ||
			    m[i].lost_op[j] > WIRE_MSG_SEND_IMM)
				return -EPROTO;
		m[i].new_nic[sizeof(m[i].new_nic) - 1] = 0;
		m[i].orig_nic[sizeof(m[i].orig_nic) - 1] = 0;
	}
	return n;
}

/* Control thread: validate, copy, hand to the repair thread. Never blocks. (A
 * payload too short for a header is a liveness probe: no answer, see
 * peer_gone().) */
static void on_msg(void *arg, int from_rank, const void *payload, size_t len,
		   struct r2cc_ctl_call *call)
{
	(void)arg;
	struct rep_hdr h;
	if (len < sizeof(h))
		return;
	memcpy(&h, payload, sizeof(h));
	int n = le16toh(h.n);
	size_t body = sizeof(h) + (size_t)n * sizeof(struct rep_wire);
	if (n == 0 || n > WIRE_MAX_ENTRIES || len < body)
		return;
	struct inbox *in = malloc(sizeof(*in) + (len - sizeof(h)));
	if (!in)
		return;
	if (r2cc_repair_wire_parse(payload, len, in->m, n) != n) {
		free(in);
		return;
	}
	in->n = n;
	in->nmaps = h.nmaps;
	in->maps = (const unsigned char *)(in->m + n);
	memcpy(in->m + n, (const unsigned char *)payload + body, len - body);
	memset(in->map_ok, 0, sizeof(in->map_ok));
	in->job_id = call->job_id;
	in->from_rank = from_rank;
	in->next = NULL;
	pthread_mutex_lock(&eng.mu);
	*eng.in_tail = in;
	eng.in_tail = &in->next;
	pthread_cond_signal(&eng.cond);
	pthread_mutex_unlock(&eng.mu);
}

/* --- the repair thread ------------------------------------------------------------ */

static void *repair_main(void *arg);
static void repair_shutdown(void);
static void nic_failure_seen(const struct r2cc_nic *nic);
static void report_stalls(FILE *text, FILE *json);

/* Under eng.mu. */
static void start_locked(void)
{
	if (eng.started)
		return;
	eng.started = true;
	__atomic_store_n(&r2cc_report_incidents_hook, r2cc_repair_report, __ATOMIC_RELEASE);
	__atomic_store_n(&r2cc_report_stalls_hook, report_stalls, __ATOMIC_RELEASE);
	eng.in_tail = &eng.in_head;
	r2cc_peer_set_notify(peer_found);
	if (r2cc_ctl_set_handler(R2CC_REPAIR_MSG, on_msg, NULL) || r2cc_mr_mirror_serve())
		R2CC_WARN("repair: cannot register the control-plane handlers; repairs that need "
			  "the peer will fail");
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	if (pthread_create(&eng.thread, NULL, repair_main, NULL)) {
		R2CC_WARN("repair: cannot start the repair thread; hot repair is off");
		eng.started = false;
	} else {
		pthread_setname_np(eng.thread, "r2cc-repair");
		pthread_detach(eng.thread);
		__atomic_store_n(&eng.running, true, __ATOMIC_RELEASE);
		eng.pid = getpid();
		atexit(repair_shutdown);
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/*
 * At exit, before the control plane goes (atexit runs this first): the repair
 * thread and the self-tests stop and return, so that none of them runs on while
 * the process's destructors free what they use. Bounded: a thread still inside a
 * verbs or network call after 200 ms is left to the process's end. A forked child
 * has no such threads (and its copy of the lock may be held): nothing to do.
 */
static void repair_shutdown(void)
{
	if (getpid() != eng.pid)
		return;
	/* Never waits for the lock: exit() may come while a thread holds it. The repair
	 * thread sees the flag at its next turn (it waits at most a scan's period). */
	__atomic_store_n(&eng.stop, true, __ATOMIC_RELEASE);
	if (pthread_mutex_trylock(&eng.mu) == 0) {
		pthread_cond_broadcast(&eng.cond);
		pthread_mutex_unlock(&eng.mu);
	}
	int64_t until = now_ns() + 200000000ll;
	bool busy;
	while ((busy = __atomic_load_n(&eng.running, __ATOMIC_ACQUIRE) ||
		       __atomic_load_n(&eng.selftests, __ATOMIC_ACQUIRE)) &&
	       now_ns() < until)
		usleep(1000);
	if (busy)
		R2CC_INFO("repair: at exit, %s still in a call; left to the process's end",
			  __atomic_load_n(&eng.running, __ATOMIC_ACQUIRE) ? "the repair thread is"
									  : "a self-test is");
}

/* Record a detection on r: when, why, and the incident of its NIC. Under eng.mu. */
static void note_detection(struct r2cc_rqp *r, const char *cause, int status)
{
	int64_t t = now_ns();
	r->t_detect = t;
	r->status_seen = status;
	snprintf(r->cause, sizeof(r->cause), "%s", cause);
	r->incident =
	    incident_get(r->failback_to ? r->failback_to->name : r->cur_nic->name, r->cause, t);
	eng.inc[r->incident].qps++;
}

/* A failure is suspected on r's current path: queue it (any thread). */
/* Only a connected QP is fenced: NCCL still moves one in INIT or RTR to RTS, and
 * a QP in ERR would refuse that. One on a failed NIC moves when it reaches RTS
 * (r2cc_repair_qp_ready), and only once that has run: between NCCL's modify_qp
 * to RTS and the tracking of its peer, a detection would find no peer to ask.
 * qp_ready publishes `ready` and then reads the NIC's state, a failure stores
 * the state and then reads `ready` (both sequentially consistent), so one of the
 * two sees the other and the QP is detected once. */
static bool connected(const struct r2cc_rqp *r)
{
	return r->q && __atomic_load_n(&r->q->state, __ATOMIC_RELAXED) == IBV_QPS_RTS &&
	       __atomic_load_n(&r->ready, __ATOMIC_SEQ_CST);
}

static void detect(struct r2cc_rqp *r, const char *cause, int status)
{
	if (!r2cc_active())
		return; /* pass-through now (a forked child has no repair thread) */
	int s = load_state(r);
	if ((s != RQ_HEALTHY && s != RQ_MIGRATED) || !connected(r))
		return;
	if (!__atomic_compare_exchange_n(&r->state, &s, RQ_DETECTED, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_RELAXED))
		return;
	pthread_mutex_lock(&eng.mu);
	note_detection(r, cause, status);
	if (!r->queued) {
		r->queued = true;
		r->next_work = eng.work_head;
		eng.work_head = r;
	}
	start_locked();
	pthread_cond_signal(&eng.cond);
	pthread_mutex_unlock(&eng.mu);
}

/* An error completion on r: a repair takes it (and re-posts what failed), so it is
 * kept from NCCL; or none does, because NCCL moved the QP out of RTS itself (as at
 * teardown), and the completion is NCCL's. */
static bool detect_hides(struct r2cc_rqp *r, const char *why, int status)
{
	detect(r, why, status);
	int s = load_state(r);
	return s != RQ_HEALTHY && s != RQ_MIGRATED;
}

/* A failure seen on nic, for a QP found on it: it counts only while the QP is still
 * there. A list of QPs is collected, then each is detected; one may have moved off
 * the NIC meanwhile (another detection got there first), and its new path has not
 * failed. */
static void detect_on(struct r2cc_rqp *r, const struct r2cc_nic *nic, const char *cause, int status)
{
	if (__atomic_load_n(&r->cur_nic, __ATOMIC_ACQUIRE) == nic)
		detect(r, cause, status);
}

/* --- gates ------------------------------------------------------------------------ */

static void gate_close(uint32_t *g)
{
	__atomic_or_fetch(g, R2CC_GATE_SLOW, __ATOMIC_SEQ_CST);
	while (__atomic_load_n(g, __ATOMIC_ACQUIRE) & ~R2CC_GATE_SLOW)
		sched_yield();
}

/* --- the virtual CQ ------------------------------------------------------------------ */

/*
 * Room in the stash for n more completions besides the reserved ones, grown if
 * need be; false when there is no memory for it. A completion must never be
 * dropped (NCCL would see the next one out of order): whoever finds no room
 * leaves its completions where they are, or fails before it changes anything.
 * Under vcq->mu.
 */
static bool stash_room(struct r2cc_vcq *v, size_t n)
{
	size_t need = v->count + v->reserved + n;
	if (need <= v->cap)
		return true;
	size_t cap = v->cap ? v->cap : 256;
	while (cap < need)
		cap *= 2;
	struct ibv_wc *s = malloc(cap * sizeof(*s));
	if (!s)
		return false;
	for (size_t i = 0; i < v->count; i++)
		s[i] = v->stash[(v->head + i) % v->cap];
	free(v->stash);
	v->stash = s;
	v->cap = cap;
	v->head = 0;
	return true;
}

/* Into room that stash_room() made (or a reserved entry). Under vcq->mu. */
static void stash_push(struct r2cc_vcq *v, const struct ibv_wc *wc)
{
	v->stash[(v->head + v->count) % v->cap] = *wc;
	v->count++;
}

/* How many completions the pump may take from a CQ now, at most want: what the
 * stash holds besides its reserved entries (none when memory is short: they
 * stay in the CQ until the stash drains). Under vcq->mu. */
static int stash_take(struct r2cc_vcq *v, int want)
{
	if (stash_room(v, (size_t)want))
		return want;
	size_t used = v->count + v->reserved;
	return used < v->cap ? (int)(v->cap - used) : 0;
}

static void count_wc(struct r2cc_nic *nic, const struct ibv_wc *wc)
{
	if (wc->status != IBV_WC_SUCCESS)
		r2cc_counter_add(&nic->cnt.err_cqes, 1);
	else if (wc->opcode & IBV_WC_RECV) {
		r2cc_counter_add(&nic->cnt.rx_wrs, 1);
		r2cc_counter_add(&nic->cnt.rx_bytes, wc->byte_len);
	} else
		r2cc_counter_add(&nic->cnt.tx_cqes, 1);
}

/* An error completion that the virtual CQ hands NCCL while no repair took it (the
 * QP is not connected as far as R2CC knows, or R2CC is off): the first few, then one
 * in a thousand, so that a job that fails on it says why. Not for a QP whose repair
 * failed: fail() said so already. */
static void vcq_error_to_nccl(const struct ibv_wc *wc, const struct r2cc_rqp *r, const char *why)
{
	static unsigned long reports;
	unsigned long n = __atomic_fetch_add(&reports, 1, __ATOMIC_RELAXED);
	if (n < 8 || n % 1000 == 0)
		R2CC_WARN(
		    "repair: an error completion (status %d, qp 0x%x%s%s) reaches NCCL with no "
		    "repair: %s",
		    wc->status, r ? r->qpn : wc->qp_num, r ? " on " : "", r ? r->cur_nic->name : "",
		    why);
}

/* A completion of r's current path (NCCL's QP or R2CC's), under vcq->mu. */
static void route(struct r2cc_vcq *v, struct r2cc_rqp *r, struct ibv_wc *wc)
{
	if (wc->wr_id == MARK_S || wc->wr_id == MARK_R) {
		if (wc->status != IBV_WC_SUCCESS) { /* only a flush can complete a marker */
			if (wc->wr_id == MARK_S)
				r->mark_s = true;
			else
				r->mark_r = true;
			return;
		}
	}
	if (wc->wr_id == R2CC_PROBE_WRID) {
		if (wc->status == IBV_WC_SUCCESS) {
			__atomic_store_n(&r->probe_done, 1, __ATOMIC_RELEASE);
			return;
		}
		if (load_state(r) == RQ_FAILED)
			return;
	}
	count_wc(r->cur_nic, wc);
	if (wc->wr_id != R2CC_PROBE_WRID)
		r2cc_qp_shadow_wc(r->cur_sh, wc);
	int s = load_state(r);
	wc->qp_num = r->qpn;
	if (wc->status == IBV_WC_SUCCESS || s == RQ_FAILED) {
		stash_push(v, wc);
		return;
	}
	if (s == RQ_HEALTHY || s == RQ_MIGRATED) {
		char why[128];
		snprintf(why, sizeof(why), "error completion (status %d) on %.64s", wc->status,
			 r->cur_nic->name);
		if (!detect_hides(r, why, wc->status)) {
			vcq_error_to_nccl(wc, r,
					  !r2cc_active() ? "hot repair is off"
					  : !connected(r)
					      ? "the QP is not connected (not in RTS, or not ready)"
					      : "the detection did not take it");
			stash_push(v, wc);
			return;
		}
	}
	/* hidden: the repair re-posts what it failed; an error of the new path while
	 * the exchange goes on starts a repair of its own once it ends (done()) */
	if (s == RQ_EXCHANGE && __atomic_load_n(&r->switched, __ATOMIC_ACQUIRE))
		__atomic_store_n(&r->new_path_err, (int)wc->status, __ATOMIC_RELEASE);
}

/* Pull everything from NCCL's CQ and the private CQs of migrated QPs into the
 * stash. Under vcq->mu. */
static void app_flush_poll(struct r2cc_vcq *v);
static void app_flush_run(struct r2cc_rqp *r);

static void vcq_pump(struct r2cc_cq *c)
{
	struct r2cc_vcq *v = c->v;
	struct ibv_wc buf[32];
	for (;;) {
		int k = stash_take(v, 32);
		int n = k ? c->ctx->poll_cq(c->cq, k, buf) : 0;
		for (int i = 0; i < n; i++) {
			struct r2cc_qp *q = r2cc_qp_by_num(c->ctx->nic, buf[i].qp_num);
			struct r2cc_rqp *r = q ? q->rep : NULL;
			if (!r) {
				count_wc(c->ctx->nic, &buf[i]);
				if (buf[i].status != IBV_WC_SUCCESS)
					vcq_error_to_nccl(
					    &buf[i], NULL,
					    q ? "a QP without a repair record"
					      : "a QP R2CC does not know on this NIC");
				stash_push(v, &buf[i]);
			} else if (r->cur_cq) {
				/* NCCL's QP left behind: only flushes arrive there */
			} else {
				route(v, r, &buf[i]);
			}
		}
		if (n < k || !k)
			break;
	}
	for (struct pcq *pc = v->pcqs; pc; pc = pc->next) {
		for (;;) {
			int k = stash_take(v, 32);
			int n = k ? pc->ctx->poll_cq(pc->cq, k, buf) : 0;
			for (int i = 0; i < n; i++) {
				struct r2cc_rqp *r = r2cc_hmap_get(&pc->by_qpn, buf[i].qp_num);
				if (r)
					route(v, r, &buf[i]);
				else /* a path already gone: it was drained before */
					count_wc(pc->ctx->nic, &buf[i]);
			}
			if (n < k || !k)
				break;
		}
	}
}

int r2cc_repair_poll(struct r2cc_cq *c, int num, struct ibv_wc *wc)
{
	struct r2cc_vcq *v = c->v;
	if (!v)
		return c->ctx->poll_cq(c->cq, num, wc);
	app_flush_poll(v);
	pthread_mutex_lock(&v->mu);
	if (v->count < (size_t)num)
		vcq_pump(c);
	int n = 0;
	while (n < num && v->count) {
		wc[n++] = v->stash[v->head];
		v->head = (v->head + 1) % v->cap;
		v->count--;
	}
	pthread_mutex_unlock(&v->mu);
	return n;
}

void r2cc_repair_probe_done(struct r2cc_cq *c, const struct ibv_wc *wc)
{
	struct r2cc_qp *q = r2cc_qp_by_num(c->ctx->nic, wc->qp_num);
	if (q && q->rep)
		__atomic_store_n(&q->rep->probe_done, 1, __ATOMIC_RELEASE);
}

int r2cc_repair_poll_errors(struct r2cc_cq *c, struct ibv_wc *wc, int got)
{
	int out = 0;
	for (int i = 0; i < got; i++) {
		struct r2cc_rqp *r = NULL;
		if (wc[i].status != IBV_WC_SUCCESS) {
			struct r2cc_qp *q = r2cc_qp_by_num(c->ctx->nic, wc[i].qp_num);
			r = q ? q->rep : NULL;
		}
		if (r && load_state(r) != RQ_FAILED) {
			char why[128];
			snprintf(why, sizeof(why), "error completion (status %d) on %.64s",
				 wc[i].status, c->ctx->nic->name);
			nic_failure_seen(c->ctx->nic);
			if (detect_hides(r, why, wc[i].status))
				continue; /* hidden */
		}
		wc[out++] = wc[i];
	}
	return out;
}

/* --- posting on the current path -------------------------------------------------- */

static int xlate_lkey(struct r2cc_rqp *r, uint32_t lkey, uint32_t len, uint32_t *out)
{
	if (r->cur_nic == r->orig_nic) {
		*out = lkey;
		return 0;
	}
	int rc = r2cc_mr_mirror_lkey(r->orig_nic, lkey, r->cur_nic, out);
	if (rc && len == 0) { /* a zero-length SGE's key is never checked */
		*out = lkey;
		rc = 0;
	}
	return rc;
}

static int xlate_rkey(struct r2cc_rqp *r, uint32_t rkey, uint64_t addr, uint64_t len, uint32_t *out)
{
	if (!strcmp(r->peer_cur_nic, r->peer_orig_nic)) {
		*out = rkey;
		return 0;
	}
	if (r->loopback) /* the "peer" is this process: its own mirrors */
		return r2cc_mr_mirror_rkey(r->orig_nic, rkey, r->cur_nic, out);
	/* From the cache only (-EAGAIN on a miss): a fetch is a network round trip,
	 * which the repair thread makes (keys_need), never NCCL's post. */
	return r2cc_mr_mirror_remote_rkey(r->dir, r->peer_rank, r->peer_orig_nic, rkey, addr, len,
					  r->peer_cur_nic, out, 0);
}

/* A send needs a key of the peer that the cache lacks: it is held, and with it
 * every later send of the QP; the repair thread fetches the map (keys_tick).
 * Under r->mu. */
static void keys_need(struct r2cc_rqp *r)
{
	__atomic_store_n(&r->keys_wait, true, __ATOMIC_RELAXED);
	__atomic_store_n(&eng.keys_due, 1, __ATOMIC_RELEASE);
}

/* Whether w addresses the peer's memory through an rkey (a write with bytes, or a
 * read), and its SGE bytes in *bytes. */
static bool carries_rkey(const struct ibv_send_wr *w, uint64_t *bytes)
{
	*bytes = 0;
	for (int i = 0; i < w->num_sge; i++)
		*bytes += w->sg_list[i].length;
	return w->opcode == IBV_WR_RDMA_READ ||
	       ((w->opcode == IBV_WR_RDMA_WRITE || w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM) &&
		*bytes);
}

/* One NCCL send request (original keys) onto the current path: recorded in its
 * shadow, keys translated, posted; -EAGAIN (nothing posted) when the peer's key
 * is not in the cache. Under r->mu. */
static int post_one_send(struct r2cc_rqp *r, const struct ibv_send_wr *w)
{
	struct ibv_send_wr one = *w;
	one.next = NULL;
	int rc = r2cc_qp_shadow_post_send(r->cur_sh, &one, NULL);
	if (rc)
		return rc;
	struct ibv_sge sge[16];
	if (one.num_sge > 16) {
		r2cc_qp_shadow_unpost_send(r->cur_sh, &one, &one);
		return -E2BIG;
	}
	struct ibv_send_wr t = one;
	t.sg_list = sge;
	for (int i = 0; i < one.num_sge && !rc; i++) {
		sge[i] = one.sg_list[i];
		if (!(one.send_flags & IBV_SEND_INLINE))
			rc = xlate_lkey(r, sge[i].lkey, sge[i].length, &sge[i].lkey);
	}
	uint64_t bytes;
	if (carries_rkey(&one, &bytes) && !rc)
		rc = xlate_rkey(r, one.wr.rdma.rkey, one.wr.rdma.remote_addr, bytes,
				&t.wr.rdma.rkey);
	if (!rc) {
		struct ibv_send_wr *bad = NULL;
		rc = -r->cur_ctx->post_send(r->cur_qp, &t, &bad);
	}
	if (rc) {
		r2cc_qp_shadow_unpost_send(r->cur_sh, &one, &one);
		return rc;
	}
	r2cc_counter_add(&r->cur_nic->cnt.tx_bytes, bytes);
	r2cc_counter_add(&r->cur_nic->cnt.tx_wrs, 1);
	return 0;
}

static int post_one_recv(struct r2cc_rqp *r, const struct ibv_recv_wr *w)
{
	struct ibv_recv_wr one = *w;
	one.next = NULL;
	int rc = r2cc_qp_shadow_post_recv(r->cur_sh, &one, NULL);
	if (rc)
		return rc;
	struct ibv_sge sge[16];
	if (one.num_sge > 16) {
		r2cc_qp_shadow_unpost_recv(r->cur_sh, &one, &one);
		return -E2BIG;
	}
	struct ibv_recv_wr t = one;
	t.sg_list = sge;
	for (int i = 0; i < one.num_sge && !rc; i++) {
		sge[i] = one.sg_list[i];
		rc = xlate_lkey(r, sge[i].lkey, sge[i].length, &sge[i].lkey);
	}
	if (!rc) {
		struct ibv_recv_wr *bad = NULL;
		rc = -r->cur_ctx->post_recv(r->cur_qp, &t, &bad);
	}
	if (rc) {
		r2cc_qp_shadow_unpost_recv(r->cur_sh, &one, &one);
		return rc;
	}
	r2cc_counter_add(&r->cur_nic->cnt.recv_posted, 1);
	return 0;
}

static int hold_send(struct r2cc_rqp *r, const struct ibv_send_wr *w)
{
	size_t inl = 0;
	if (w->send_flags & IBV_SEND_INLINE)
		for (int i = 0; i < w->num_sge; i++)
			inl += w->sg_list[i].length;
	if (w->num_sge < 0 || w->num_sge > 16)
		return -EINVAL;
	struct held_send *h =
	    malloc(sizeof(*h) + (size_t)w->num_sge * sizeof(struct ibv_sge) + inl);
	if (!h)
		return -ENOMEM;
	h->wr = *w;
	h->wr.next = NULL;
	h->wr.sg_list = h->sge;
	uint8_t *p = (uint8_t *)&h->sge[w->num_sge];
	for (int i = 0; i < w->num_sge; i++) {
		h->sge[i] = w->sg_list[i];
		if (inl) { /* the source may change after the call: keep the bytes */
			memcpy(p, (const void *)(uintptr_t)w->sg_list[i].addr,
			       w->sg_list[i].length);
			h->sge[i].addr = (uintptr_t)p;
			p += w->sg_list[i].length;
		}
	}
	h->next = NULL;
	*r->hs_tail = h;
	r->hs_tail = &h->next;
	return 0;
}

static int hold_recv(struct r2cc_rqp *r, const struct ibv_recv_wr *w)
{
	if (w->num_sge < 0 || w->num_sge > 16)
		return -EINVAL;
	struct held_recv *h = malloc(sizeof(*h) + (size_t)w->num_sge * sizeof(struct ibv_sge));
	if (!h)
		return -ENOMEM;
	h->wr = *w;
	h->wr.next = NULL;
	h->wr.sg_list = h->sge;
	/* NCCL's receives carry no SGE and may have no list at all. */
	if (w->num_sge)
		memcpy(h->sge, w->sg_list, (size_t)w->num_sge * sizeof(struct ibv_sge));
	h->next = NULL;
	*r->hr_tail = h;
	r->hr_tail = &h->next;
	return 0;
}

/*
 * Whether a post on one queue (send or receive) of r, in state s, is held rather
 * than posted: while fenced; during the exchange until that queue's new path is
 * live; before it (the failure seen, or a declared QP's first post) once anything
 * is held on the queue or everything must be. Under r->mu.
 */
static bool hold_now(const struct r2cc_rqp *r, int s, bool live, bool queued)
{
	if (s == RQ_FENCING || queued) /* (queued: posts keep their order) */
		return true;
	if (s == RQ_EXCHANGE)
		return !live;
	return s != RQ_MIGRATED && r->hold_all;
}

/* NCCL's first post on a QP of a declared-failed NIC: its direction is known now
 * (receivers post a receive first); hold everything and move it. Under r->mu. */
static void declared_first_post(struct r2cc_rqp *r, bool recv)
{
	if (!r->declared_pending)
		return;
	r->declared_pending = false;
	r->hold_all = true;
	if (recv)
		r2cc_counter_add(&r->q->rx_wrs, 1);
	detect(r, "declared failed (R2CC_FAILED_NODE/R2CC_FAILED_HCA)", 0);
}

static void nic_failed(struct r2cc_nic *nic, const char *why);

/* Errors with which a dead device refuses posts (the provider's EIO after a fatal
 * event, ENETDOWN): the NIC has failed, not the request. */
static bool refused_by_dead_device(int rc)
{
	return rc == EIO || rc == ENETDOWN;
}

/* A call on nic's device (`what`: "a post on it", ...) was refused with rc because
 * the device is dead: the NIC has failed. */
static void failback_never(const struct r2cc_nic *nic);
static void nic_dead(struct r2cc_nic *nic, const char *what, int rc)
{
	char why[112];
	snprintf(why, sizeof(why), "%s failed (%s): the device is dead", what, strerror(rc));
	failback_never(nic);
	nic_failed(nic, why);
}

bool r2cc_repair_reg_refused(struct r2cc_nic *nic, int rc)
{
	if (!nic || !refused_by_dead_device(rc) || !r2cc_repair_enabled())
		return false;
	nic_dead(nic, "a memory registration on it", rc);
	return true;
}

bool r2cc_repair_modify_refused(struct r2cc_qp *q, int rc, int to_state)
{
	struct r2cc_rqp *r = q->rep;
	/* On RoCE the RTR resolves the peer's address through the NIC's network device,
	 * which refuses while its link is down: those errors too, on a NIC that failed. */
	bool dead = refused_by_dead_device(rc);
	bool down =
	    __atomic_load_n(&q->ctx->nic->state, __ATOMIC_RELAXED) == R2CC_NIC_DOWN &&
	    (rc == ENETUNREACH || rc == EHOSTUNREACH || rc == ENODATA || rc == EADDRNOTAVAIL);
	if (!r || !(dead || down) || !r2cc_active() ||
	    (to_state != IBV_QPS_INIT && to_state != IBV_QPS_RTR && to_state != IBV_QPS_RTS))
		return false;
	if (dead) /* (a NIC that is down has failed already) */
		nic_dead(q->ctx->nic, "connecting a queue pair on it", rc);
	return true;
}

/*
 * A post that the device of `nic` refused because the device is dead: that NIC has
 * failed (every QP on it is detected), and r, taken by the repair, holds what it is
 * asked to post until its new path is live; or the repair already moved r off that
 * NIC (another QP's detection got there first), and the requests go to the new
 * path. They never reached the dead QP (the refused ones are not in its shadow), so
 * this is their only post. false when no repair took r (the error is NCCL's).
 * Slow path: it follows a failure, and waits on nothing.
 */
static bool refused_take(struct r2cc_rqp *r, int rc, struct r2cc_nic *nic)
{
	if (!refused_by_dead_device(rc) || !nic)
		return false;
	nic_dead(nic, "a post on it", rc);
	pthread_mutex_lock(&r->mu);
	int s = load_state(r);
	bool moved = s == RQ_MIGRATED && r->cur_nic != nic;
	bool taken = moved || s == RQ_DETECTED || s == RQ_FENCING || s == RQ_EXCHANGE;
	if (taken && !moved)
		r->hold_all = true;
	pthread_mutex_unlock(&r->mu);
	return taken;
}

static int repair_post_send(struct r2cc_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int repair_post_recv(struct r2cc_qp *q, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);

static struct r2cc_nic *cur_nic_of(const struct r2cc_qp *q)
{
	return q->rep ? __atomic_load_n(&q->rep->cur_nic, __ATOMIC_ACQUIRE) : NULL;
}

int r2cc_repair_post_send(struct r2cc_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct r2cc_nic *at = cur_nic_of(q);
	int rc = repair_post_send(q, wr, bad);
	return rc && q->rep && refused_take(q->rep, rc, at) ? repair_post_send(q, *bad, bad) : rc;
}

int r2cc_repair_post_recv(struct r2cc_qp *q, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct r2cc_nic *at = cur_nic_of(q);
	int rc = repair_post_recv(q, wr, bad);
	return rc && q->rep && refused_take(q->rep, rc, at) ? repair_post_recv(q, *bad, bad) : rc;
}

int r2cc_repair_send_refused(struct r2cc_qp *q, int rc, struct ibv_send_wr **bad)
{
	return q->rep && refused_take(q->rep, rc, q->ctx->nic) ? repair_post_send(q, *bad, bad)
							       : rc;
}

int r2cc_repair_recv_refused(struct r2cc_qp *q, int rc, struct ibv_recv_wr **bad)
{
	return q->rep && refused_take(q->rep, rc, q->ctx->nic) ? repair_post_recv(q, *bad, bad)
							       : rc;
}

static int repair_post_send(struct r2cc_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct r2cc_rqp *r = q->rep;
	if (!r)
		return q->ctx->post_send(q->qp, wr, bad);
	pthread_mutex_lock(&r->mu);
	declared_first_post(r, false);
	app_flush_run(r);
	int s = load_state(r), rc = 0;
	struct ibv_send_wr *w = wr;
	for (; w && !rc; w = w->next) {
		if (s == RQ_FAILED) {
			struct ibv_send_wr one = *w, *b = NULL;
			one.next = NULL;
			rc = -r->orig_ctx->post_send(q->qp, &one, &b);
		} else if (hold_now(r, s, r->send_live, r->hs_head != NULL)) {
			rc = hold_send(r, w);
		} else if ((rc = post_one_send(r, w)) == -EAGAIN) {
			rc = hold_send(r, w);
			keys_need(r);
		}
		if (rc)
			break;
	}
	pthread_mutex_unlock(&r->mu);
	if (rc) {
		*bad = w;
		return rc < 0 ? -rc : rc;
	}
	return 0;
}

static int repair_post_recv(struct r2cc_qp *q, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct r2cc_rqp *r = q->rep;
	if (!r)
		return q->ctx->post_recv(q->qp, wr, bad);
	pthread_mutex_lock(&r->mu);
	declared_first_post(r, true);
	int s = load_state(r), rc = 0;
	struct ibv_recv_wr *w = wr;
	for (; w && !rc; w = w->next) {
		if (s == RQ_FAILED) {
			struct ibv_recv_wr one = *w, *b = NULL;
			one.next = NULL;
			rc = -r->orig_ctx->post_recv(q->qp, &one, &b);
		} else if (hold_now(r, s, r->recv_live, r->hr_head != NULL)) {
			rc = hold_recv(r, w);
		} else {
			rc = post_one_recv(r, w);
		}
		if (rc)
			break;
	}
	pthread_mutex_unlock(&r->mu);
	if (rc) {
		*bad = w;
		return rc < 0 ? -rc : rc;
	}
	return 0;
}

/* Under r->mu. */
static int flush_held_recvs(struct r2cc_rqp *r)
{
	int rc = 0;
	while (r->hr_head && !rc) {
		struct held_recv *h = r->hr_head;
		rc = post_one_recv(r, &h->wr);
		if (rc)
			break;
		r->hr_head = h->next;
		free(h);
	}
	if (!r->hr_head)
		r->hr_tail = &r->hr_head;
	return rc;
}

static int flush_held_sends(struct r2cc_rqp *r, uint64_t *n)
{
	int rc = 0;
	while (r->hs_head && !rc) {
		struct held_send *h = r->hs_head;
		rc = post_one_send(r, &h->wr);
		if (rc == -EAGAIN) { /* it and the rest wait for the peer's keys */
			keys_need(r);
			return 0;
		}
		if (rc)
			break;
		r->hs_head = h->next;
		free(h);
		(*n)++;
	}
	if (!r->hs_head)
		r->hs_tail = &r->hs_head;
	return rc;
}

/* --- records ----------------------------------------------------------------------- */

void r2cc_repair_cq_created(struct r2cc_cq *c)
{
	if (!r2cc_repair_enabled())
		return;
	struct r2cc_vcq *v = calloc(1, sizeof(*v));
	if (!v)
		return;
	pthread_mutex_init(&v->mu, NULL);
	c->v = v;
}

void r2cc_repair_cq_destroyed(struct r2cc_cq *c)
{
	struct r2cc_vcq *v = c->v;
	if (!v)
		return;
	/* Kept: a late pump may still look at it; only the stash goes. */
	pthread_mutex_lock(&v->mu);
	free(v->stash);
	v->stash = NULL;
	v->cap = v->count = v->head = 0;
	free(v->flush);
	v->flush = NULL;
	v->capflush = 0;
	__atomic_store_n(&v->nflush, 0, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&v->mu);
}

void r2cc_repair_qp_created(struct r2cc_qp *q, const struct ibv_qp_init_attr *attr)
{
	if (!r2cc_repair_enabled() || attr->qp_type != IBV_QPT_RC)
		return;
	if (!q->send_cq || q->send_cq != q->recv_cq || !q->send_cq->v) {
		R2CC_WARN_ONCE("repair: a QP with separate send and receive CQs runs without hot "
			       "repair");
		return;
	}
	struct r2cc_qp_shadow_attr sa = {
	    .max_send_wr = attr->cap.max_send_wr,
	    .max_recv_wr = attr->cap.max_recv_wr,
	    .max_send_sge = attr->cap.max_send_sge,
	    .max_recv_sge = attr->cap.max_recv_sge,
	    .max_inline_data = attr->cap.max_inline_data,
	    .sq_sig_all = attr->sq_sig_all,
	};
	struct r2cc_rqp *r = calloc(1, sizeof(*r));
	if (!r || r2cc_qp_shadow_create(&sa, &q->shadow)) {
		free(r);
		R2CC_WARN("repair: out of memory for qp 0x%x's shadow; it runs without hot repair",
			  q->qpn);
		return;
	}
	/* The stash entry for the error completion fail() may owe NCCL, taken now:
	 * when the repair runs out of memory later, that error must still get out. */
	struct r2cc_vcq *v = q->send_cq->v;
	pthread_mutex_lock(&v->mu);
	r->stash_held = stash_room(v, 1);
	if (r->stash_held)
		v->reserved++;
	pthread_mutex_unlock(&v->mu);
	if (!r->stash_held) {
		r2cc_qp_shadow_destroy(q->shadow);
		q->shadow = NULL;
		free(r);
		R2CC_WARN("repair: out of memory for qp 0x%x's completions; it runs without hot "
			  "repair",
			  q->qpn);
		return;
	}
	pthread_mutex_init(&r->mu, NULL);
	r->q = q;
	r->vcq = q->send_cq;
	r->qpn = q->qpn;
	r->orig_ctx = q->ctx;
	r->orig_nic = q->ctx->nic;
	r->cap = attr->cap;
	r->sq_sig_all = attr->sq_sig_all;
	r->cur_qp = q->qp;
	r->cur_ctx = q->ctx;
	r->cur_nic = q->ctx->nic;
	r->cur_sh = q->shadow;
	r->hs_tail = &r->hs_head;
	r->hr_tail = &r->hr_head;
	r->incident = -1;
	pthread_mutex_lock(&eng.mu);
	r->next_all = eng.all;
	eng.all = r;
	eng.records++;
	start_locked();
	pthread_mutex_unlock(&eng.mu);
	__atomic_store_n(&q->rep, r, __ATOMIC_RELEASE);
}

/* Entries a path of r takes in a shared CQ: both queues, the markers. */
static int path_need(const struct r2cc_rqp *r)
{
	return (int)(r->cap.max_send_wr + r->cap.max_recv_wr) + 64;
}

/* A shared CQ on c with room for a path of r (made if none has room). */
static struct pcq *pcq_get(struct r2cc_rqp *r, struct r2cc_ctx *c)
{
	struct r2cc_vcq *v = r->vcq->v;
	int need = path_need(r);
	pthread_mutex_lock(&v->mu);
	struct pcq *pc = v->pcqs;
	while (pc && (pc->ctx != c || pc->room < need))
		pc = pc->next;
	if (pc) {
		pc->room -= need;
		pc->users++;
	}
	pthread_mutex_unlock(&v->mu);
	if (pc)
		return pc;
	pc = calloc(1, sizeof(*pc));
	if (!pc)
		return NULL;
	/* As large as the device takes, up to PCQ_PATHS paths. */
	for (int depth = need * PCQ_PATHS; depth >= need && !pc->cq; depth /= 2) {
		pc->cq = eng.v.create_cq(c->ctx, depth, NULL, NULL, 0);
		pc->room = depth;
	}
	if (!pc->cq) {
		free(pc);
		return NULL;
	}
	own_add(pc->cq);
	pc->ctx = c;
	pc->room -= need;
	pc->users = 1;
	pthread_mutex_lock(&v->mu);
	pc->next = v->pcqs;
	v->pcqs = pc;
	pthread_mutex_unlock(&v->mu);
	return pc;
}

/* A path of r on pc goes (its QP destroyed first); the CQ with its last path. */
static void path_put(struct r2cc_rqp *r, struct ibv_qp *qp, struct pcq *pc)
{
	struct r2cc_vcq *v = r->vcq->v;
	uint32_t qpn = qp ? qp->qp_num : 0;
	if (qp) {
		eng.v.destroy_qp(qp);
		own_remove(qp);
	}
	if (!pc)
		return;
	pthread_mutex_lock(&v->mu);
	if (qp && r2cc_hmap_get(&pc->by_qpn, qpn) == r)
		r2cc_hmap_del(&pc->by_qpn, qpn);
	pc->room += path_need(r);
	bool last = --pc->users == 0;
	if (last)
		for (struct pcq **pp = &v->pcqs; *pp; pp = &(*pp)->next)
			if (*pp == pc) {
				*pp = pc->next;
				break;
			}
	pthread_mutex_unlock(&v->mu);
	if (last) {
		eng.v.destroy_cq(pc->cq);
		own_remove(pc->cq);
		r2cc_hmap_free(&pc->by_qpn);
		free(pc);
	}
}

static void destroy_private(struct ibv_qp *qp, struct ibv_cq *cq)
{
	if (qp) {
		eng.v.destroy_qp(qp);
		own_remove(qp);
	}
	if (cq) {
		eng.v.destroy_cq(cq);
		own_remove(cq);
	}
}

/* r gives back its reserved stash entry. Under r->mu and its vcq->mu. */
static void stash_release_locked(struct r2cc_rqp *r)
{
	if (!r->stash_held)
		return;
	r->stash_held = false;
	r->vcq->v->reserved--;
}

/* The same, under r->mu only. */
static void stash_release(struct r2cc_rqp *r)
{
	pthread_mutex_lock(&r->vcq->v->mu);
	stash_release_locked(r);
	pthread_mutex_unlock(&r->vcq->v->mu);
}

/* Forget the path being built (a failure, or the peer's exchange won). Under
 * r->mu. */
static void drop_new_path(struct r2cc_rqp *r)
{
	if (r->new_qp)
		path_put(r, r->new_qp, r->new_pcq);
	r->new_qp = NULL;
	r->new_cq = NULL;
	r->new_pcq = NULL;
	if (r->new_sh)
		r2cc_qp_shadow_destroy(r->new_sh);
	r->new_sh = NULL;
}

static void ledger_move(struct r2cc_rqp *r, struct r2cc_nic *nic, int dir);

void r2cc_repair_qp_destroying(struct r2cc_qp *q)
{
	struct r2cc_rqp *r = q->rep;
	if (!r)
		return;
	/* Wait for the repair thread to leave this QP (bounded: it never waits on NCCL). */
	pthread_mutex_lock(&eng.mu);
	while (r->busy)
		pthread_cond_wait(&eng.cond, &eng.mu);
	r->dead = true;
	pthread_mutex_unlock(&eng.mu);
	/* off its CQ's list of re-posts for NCCL's thread */
	struct r2cc_vcq *fv = r->vcq ? r->vcq->v : NULL;
	if (fv) {
		pthread_mutex_lock(&fv->mu);
		for (int i = 0; i < fv->nflush; i++)
			if (fv->flush[i] == r) {
				fv->flush[i--] = fv->flush[fv->nflush - 1];
				__atomic_store_n(&fv->nflush, fv->nflush - 1, __ATOMIC_RELAXED);
			}
		pthread_mutex_unlock(&fv->mu);
	}
	if (r->tracked)
		r2cc_peer_forget(&r->ep_local);
	pthread_mutex_lock(&r->mu);
	if (r->cur_cq)
		path_put(r, r->cur_qp, r->cur_pcq);
	r->cur_qp = NULL;
	r->cur_cq = NULL;
	r->cur_pcq = NULL;
	drop_new_path(r);
	ledger_move(r, NULL, 0);
	if (r->cur_sh != q->shadow)
		r2cc_qp_shadow_destroy(r->cur_sh);
	r->cur_sh = NULL;
	r2cc_qp_shadow_destroy(q->shadow);
	q->shadow = NULL;
	r->q = NULL;
	while (r->hs_head) {
		struct held_send *h = r->hs_head;
		r->hs_head = h->next;
		free(h);
	}
	while (r->hr_head) {
		struct held_recv *h = r->hr_head;
		r->hr_head = h->next;
		free(h);
	}
	if (r->have_plan)
		r2cc_qp_shadow_plan_free(&r->plan);
	r->have_plan = false;
	stash_release(r);
	set_state(r, RQ_FAILED);
	pthread_mutex_unlock(&r->mu);
	/* The record stays on eng.all (marked dead) until the repair thread frees it
	 * (records_sweep_locked): the stall scan and other threads' lists may hold it. */
}

void r2cc_repair_qp_destroyed(struct r2cc_qp *q)
{
	struct r2cc_rqp *r = q->rep;
	if (!r)
		return;
	pthread_mutex_lock(&eng.mu);
	r->gone = true;
	pthread_mutex_unlock(&eng.mu);
}

/*
 * The records of destroyed QPs, freed. Only the repair thread frees them, and only
 * between its pieces of work (its own walks of eng.all may let go of eng.mu while
 * they hold a busy record), and only while no other thread holds a list of records
 * (collect): a thread that lists records after the unlink cannot see them. Not
 * freed: a record NCCL's destroy has not finished with (busy, or its destroy did
 * not succeed), or one still queued for work. Under eng.mu.
 */
static void records_sweep_locked(void)
{
	if (eng.holders)
		return;
	for (struct r2cc_rqp **pp = &eng.all; *pp;) {
		struct r2cc_rqp *r = *pp;
		if (!r->dead || !r->gone || r->busy || r->queued) {
			pp = &r->next_all;
			continue;
		}
		*pp = r->next_all;
		pthread_mutex_destroy(&r->mu);
		free(r);
		eng.records--;
		eng.records_freed++;
	}
}

/* --- fencing ---------------------------------------------------------------------- */

/*
 * Close the gates, move the current path to ERR, post the markers behind NCCL's
 * requests and pump the CQ until both came back (at most DRAIN_NS); then count
 * the receives the path consumed. 0, -ETIMEDOUT, or the shadow's error. For
 * many queue pairs at once, fence_begin() each, then fence_end() each: their
 * drains overlap.
 */
static void fence_begin(struct r2cc_rqp *r)
{
	gate_close(&r->q->gate);
	gate_close(&r->vcq->gate);
	pthread_mutex_lock(&r->mu);
	set_state(r, RQ_FENCING);
	r->mark_s = r->mark_r = false;
	r->probe_at = 0; /* a probe out on this path flushes with it */
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
	int rc = eng.v.modify_qp(r->cur_qp, &a, IBV_QP_STATE);
	if (rc)
		R2CC_WARN("repair: qp 0x%x: cannot move to ERR (%s)", r->qpn, strerror(rc));
	struct ibv_send_wr sw = {.wr_id = MARK_S,
				 .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED},
			   *sbad;
	struct ibv_recv_wr rw = {.wr_id = MARK_R}, *rbad;
	/* A queue too full for its marker: the drain ends at what the CQ holds. */
	if (r->cur_ctx->post_send(r->cur_qp, &sw, &sbad))
		r->mark_s = true;
	if (r->cur_ctx->post_recv(r->cur_qp, &rw, &rbad))
		r->mark_r = true;
	pthread_mutex_unlock(&r->mu);
}

static int fence_end(struct r2cc_rqp *r, int64_t until)
{
	for (;;) {
		pthread_mutex_lock(&r->vcq->v->mu);
		vcq_pump(r->vcq);
		bool done = r->mark_s && r->mark_r;
		pthread_mutex_unlock(&r->vcq->v->mu);
		if (done)
			break;
		if (now_ns() > until)
			return -ETIMEDOUT;
		usleep(50);
	}
	r->k_local = r2cc_qp_shadow_recv_consumed(r->cur_sh);
	return r2cc_qp_shadow_error(r->cur_sh);
}

static int fence(struct r2cc_rqp *r)
{
	fence_begin(r);
	return fence_end(r, now_ns() + DRAIN_NS);
}

/*
 * Fences every record of list[0..n) (NULL ones skipped) and sets rc[i], at once
 * as far as each CQ allows: moving a QP to ERR flushes everything outstanding on
 * it, and two markers, into its CQ, and one of NCCL's CQs shared by many QPs holds
 * only so much (half its depth is given to a wave of fences, at least one QP). A
 * migrated QP's own CQ has room for its flush by construction (path_need()).
 */
#define FENCE_WAVE_CQS 64

static void fence_all(struct r2cc_rqp **list, int n, int *rc)
{
	for (int first = 0; first < n;) {
		struct cq_load {
			const struct r2cc_cq *cq;
			int used;
		} load[FENCE_WAVE_CQS];
		int ncq = 0, last = first;
		for (; last < n; last++) {
			struct r2cc_rqp *r = list[last];
			if (!r || r->cur_cq) {
				if (r)
					fence_begin(r);
				continue;
			}
			int need = 2 + (int)r2cc_qp_shadow_send_outstanding(r->cur_sh) +
				   (int)r2cc_qp_shadow_recv_outstanding(r->cur_sh);
			int k = 0;
			while (k < ncq && load[k].cq != r->vcq)
				k++;
			if (k == ncq) {
				if (ncq == FENCE_WAVE_CQS)
					break;
				load[ncq++] = (struct cq_load){r->vcq, 0};
			}
			if (load[k].used && r->vcq->depth > 0 &&
			    load[k].used + need > r->vcq->depth / 2)
				break;
			load[k].used += need;
			fence_begin(r);
		}
		int64_t until = now_ns() + DRAIN_NS;
		for (int i = first; i < last; i++)
			rc[i] = list[i] ? fence_end(list[i], until) : 0;
		first = last;
	}
}

static const char *fence_failure(int rc)
{
	return rc == -ETIMEDOUT ? "the old path did not drain" : "shadow inconsistent";
}

/* --- placement ---------------------------------------------------------------------- */

/* Which way a QP's data goes: NCCL's send-side QPs post the data, its receive-side
 * QPs post receives (and small clear-to-send writes). Balancing each kind on its
 * own keeps both directions of every NIC even. NCCL gives receive-side QPs remote
 * atomic access at INIT (send-side ones only remote write), which tells them apart
 * before the first post; receives posted tell it too. */
static bool receiving(const struct r2cc_rqp *r)
{
	return r->q && ((r->q->access & IBV_ACCESS_REMOTE_ATOMIC) || r->q->rx_wrs > 0);
}

static int nic_load(const struct r2cc_nic *nic, bool rx)
{
	int n = 0;
	pthread_mutex_lock(&eng.mu);
	for (struct r2cc_rqp *r = eng.all; r; r = r->next_all)
		if (!r->dead && receiving(r) == rx &&
		    (r->new_ctx && r->new_qp ? r->new_ctx->nic : r->cur_nic) == nic)
			n++; /* a path being built counts where it goes */
	pthread_mutex_unlock(&eng.mu);
	return n;
}

/* The context and PD a new path on nic lives in: NCCL's own on the QP's original
 * NIC (NCCL's keys then hold as they are), R2CC's mirror PD elsewhere. */
static struct r2cc_ctx *ctx_of_nic(struct r2cc_nic *nic);
static struct ibv_pd *pd_on(struct r2cc_rqp *r, struct r2cc_nic *nic)
{
	return nic == r->orig_nic ? r->q->qp->pd : r2cc_mr_mirror_pd(nic);
}

/* Normally another NIC than the QP's own and its current one; as a last resort
 * (nothing else is up) those too, if their port is up: a stall can be a false
 * alarm, and a fresh QP pair on the same NICs then just works. */
static bool nic_usable(struct r2cc_rqp *r, struct r2cc_nic *nic, bool last_resort)
{
	if (!nic || __atomic_load_n(&nic->state, __ATOMIC_RELAXED) != R2CC_NIC_UP ||
	    !pd_on(r, nic) || !(nic == r->orig_nic ? r->orig_ctx : ctx_of_nic(nic)))
		return false;
	return last_resort || (nic != r->orig_nic && nic != r->cur_nic);
}

/* Per NIC (registry index), when QPs of this process last left a path on it
 * because the path failed (left_failed): the placement's evidence against a NIC
 * that every candidate QP has failed on lately. */
#define NIC_LEFT_RING 16
static struct {
	unsigned n;
	int64_t t[NIC_LEFT_RING];
} nic_left[R2CC_MAX_NICS];

/* The NIC r is on showed a failure of its path (an error completion of the
 * transport, a failed self-test): r avoids it for CHURN_NS. A NIC whose black hole
 * r's transport has just found is otherwise often r's first choice at its next
 * move (asked by its peer, say), where it fails again, and enough such moves make
 * its repair give up (churning). The NIC itself stays up for the other QPs: the
 * fault may be the peer's, or one path's. */
static void left_failed(struct r2cc_rqp *r)
{
	int64_t now = now_ns();
	r->left[r->nleft % LEFT_RING] = (struct left_nic){r->cur_nic, now};
	r->nleft++;
	int i = r->cur_nic ? r->cur_nic->index : -1;
	if (i >= 0 && i < R2CC_MAX_NICS) {
		unsigned k = __atomic_fetch_add(&nic_left[i].n, 1, __ATOMIC_RELAXED);
		__atomic_store_n(&nic_left[i].t[k % NIC_LEFT_RING], now, __ATOMIC_RELAXED);
	}
}

/* How many QPs of this process left a path on nic because it failed, within
 * CHURN_NS (up to NIC_LEFT_RING). */
static int nic_left_lately(const struct r2cc_nic *nic)
{
	if (!nic || nic->index < 0 || nic->index >= R2CC_MAX_NICS)
		return 0;
	int64_t now = now_ns();
	int n = 0;
	for (int k = 0; k < NIC_LEFT_RING; k++) {
		int64_t t = __atomic_load_n(&nic_left[nic->index].t[k], __ATOMIC_RELAXED);
		n += t && now - t < CHURN_NS;
	}
	return n;
}

static bool failed_on_lately(const struct r2cc_rqp *r, const struct r2cc_nic *nic)
{
	int64_t now = now_ns();
	for (int i = 0; i < LEFT_RING; i++)
		if (r->left[i].nic == nic && r->left[i].t && now - r->left[i].t < CHURN_NS)
			return true;
	return false;
}

/* Placement passes, in order: another NIC than the QP's own and its current one,
 * and not one it failed on lately; then its own or current one too (a fresh QP
 * pair on the same NICs), still not one it failed on lately; then any NIC that is
 * up. */
static bool nic_usable_pass(struct r2cc_rqp *r, struct r2cc_nic *nic, int pass)
{
	if (!nic_usable(r, nic, pass > 0))
		return false;
	return pass == 2 || !failed_on_lately(r, nic);
}

/* The node ledger (repair/ledger.h), opened at the first placement once the
 * job is known; its counts read 0 without it. */
static void ledger_use(void)
{
	pthread_mutex_lock(&eng.mu);
	uint64_t job = eng.ndirs > 0 ? eng.dirs[0]->job.id : 0;
	pthread_mutex_unlock(&eng.mu);
	if (job) {
		char key[256];
		r2cc_ledger_open(job, r2cc_node_key(key, sizeof(key)));
	}
}

/* This QP now counts on nic (NULL: on none) in the node's ledger. */
static void ledger_move(struct r2cc_rqp *r, struct r2cc_nic *nic, int dir)
{
	if (r->ledger_nic)
		r2cc_ledger_add(r->ledger_nic->name, r->ledger_dir, -1);
	r->ledger_nic = nic;
	r->ledger_dir = dir;
	if (nic)
		r2cc_ledger_add(nic->name, dir, 1);
}

/* Evidence against nic at a placement pass: whether QPs of this process left a
 * path on it for a failure lately; at the last pass, where every NIC up is a
 * candidate, how many did (the NIC most of them fled is the likely culprit,
 * though it is not down: the fault may be a peer's or one path's). */
static int place_evidence(const struct r2cc_nic *nic, int pass)
{
	int n = nic_left_lately(nic);
	return pass == 2 ? n : n > 0;
}

/* A candidate NIC, compared in this order: the evidence against it, the QPs
 * the node has moved onto it, this process's QPs on it, off the peer's rail. */
struct place_key {
	int evidence, node, load, off_rail;
};

static bool place_key_less(const struct place_key *a, const struct place_key *b)
{
	if (a->evidence != b->evidence)
		return a->evidence < b->evidence;
	if (a->node != b->node)
		return a->node < b->node;
	if (a->load != b->load)
		return a->load < b->load;
	return a->off_rail < b->off_rail;
}

/* Within a pass, a NIC without such evidence first (place_evidence). Then:
 * Mode 1: the first usable NIC (the peer's rail first, when it asked for one).
 * Mode 2 and up, for this QP's direction: the NIC the node's R2CC processes
 * have moved the fewest QPs onto (the node ledger), then the one with the
 * fewest of this process's QPs, then the peer's rail. Each node balances its
 * own NICs, and a node whose NIC failed does not inherit the healthy side's
 * choices (NCCL pairs NICs across rails anyway). The choice is entered in the
 * ledger at once, so that a placement running at the same moment in another
 * process of the node sees it. */
static struct r2cc_nic *place(struct r2cc_rqp *r, const char *rail)
{
	int n = r2cc_nic_count();
	bool want_rail = rail && rail[0];
	for (int pass = 0; pass < 3; pass++) {
		if (r2cc_param.mode == 1) {
			struct r2cc_nic *first = NULL;
			struct place_key first_key = {0};
			for (int i = 0; i < n; i++) {
				struct r2cc_nic *nic = r2cc_nic_by_index(i);
				if (!nic_usable_pass(r, nic, pass))
					continue;
				struct place_key key = {place_evidence(nic, pass), 0, 0,
							!(want_rail && !strcmp(nic->name, rail))};
				if (!first || place_key_less(&key, &first_key)) {
					first = nic;
					first_key = key;
				}
			}
			if (first)
				return first;
			continue;
		}
		ledger_use();
		struct r2cc_nic *best = NULL;
		struct place_key best_key = {0};
		/* Ties go round from a per-process start, so that the processes of a
		 * node do not all pick the same one. */
		int start = n > 0 ? (int)(getpid() % n) : 0;
		bool rx = receiving(r);
		for (int k = 0; k < n; k++) {
			struct r2cc_nic *nic = r2cc_nic_by_index((start + k) % n);
			if (!nic_usable_pass(r, nic, pass))
				continue;
			struct place_key key = {place_evidence(nic, pass),
						r2cc_ledger_get(nic->name, rx), nic_load(nic, rx),
						!(want_rail && !strcmp(nic->name, rail))};
			if (!best || place_key_less(&key, &best_key)) {
				best = nic;
				best_key = key;
			}
		}
		if (best) {
			ledger_move(r, best, rx);
			return best;
		}
	}
	return NULL;
}

/* The registry has no NIC -> context index: find one of NCCL's contexts through
 * the mirror's PD, which was allocated on it. */
static struct r2cc_ctx *ctx_of_nic(struct r2cc_nic *nic)
{
	struct ibv_pd *pd = r2cc_mr_mirror_pd(nic);
	return pd ? r2cc_ctx_find(pd->context) : NULL;
}

/* --- QP state transitions of R2CC's own QPs ------------------------------------ */

/* RESET -> INIT on nic's port with the given access and partition key index.
 * 0 or a positive errno. */
static int qp_init(struct ibv_qp *qp, const struct r2cc_nic *nic, int access, uint16_t pkey_index)
{
	struct ibv_qp_attr a = {
	    .qp_state = IBV_QPS_INIT,
	    .pkey_index = pkey_index,
	    .port_num = nic->port ? nic->port : 1,
	    .qp_access_flags = access,
	};
	return eng.v.modify_qp(
	    qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

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

/* INIT -> RTR -> RTS towards l (PSNs 0, one outstanding READ each way). 0 or a
 * negative errno. */
static int qp_connect(struct ibv_qp *qp, const struct r2cc_nic *nic, const struct qp_link *l)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = l->mtu;
	a.dest_qp_num = l->qpn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = l->lid;
	a.ah_attr.sl = l->sl;
	a.ah_attr.port_num = nic->port ? nic->port : 1;
	if (l->gid) {
		a.ah_attr.is_global = 1;
		memcpy(a.ah_attr.grh.dgid.raw, l->gid, 16);
		a.ah_attr.grh.sgid_index = l->sgid_index;
		a.ah_attr.grh.hop_limit = l->hop_limit ? l->hop_limit : 255;
		a.ah_attr.grh.traffic_class = l->traffic_class;
		a.ah_attr.grh.flow_label = l->flow_label;
	}
	int rc =
	    eng.v.modify_qp(qp, &a,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (rc)
		return -rc;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = l->timeout;
	a.retry_cnt = l->retry_cnt;
	a.rnr_retry = l->rnr_retry;
	a.max_rd_atomic = 1;
	return -eng.v.modify_qp(qp, &a,
				IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* What kind of address a GID is: 0 none (an empty entry), 1 IPv4-mapped, 2 IPv6
 * link-local, 3 another IPv6 address. */
static int gid_class(const union ibv_gid *g)
{
	static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	if (!memcmp(g->raw, v4, sizeof(v4)))
		return 1;
	if (g->raw[0] == 0xfe && (g->raw[1] & 0xc0) == 0x80)
		return 2;
	for (int i = 0; i < 16; i++)
		if (g->raw[i])
			return 3;
	return 0;
}

/* Entry i of c's GID table, when it is of the same kind as the old path's
 * source GID: the same class of address and, where the library tells GID types,
 * the same type (RoCE v1 or v2). */
static bool gid_like(struct r2cc_ctx *c, uint8_t port, int i, const struct r2cc_qp *q,
		     union ibv_gid *gid)
{
	if (eng.v.query_gid(c->ctx, port, i, gid))
		return false;
	int cls = gid_class(gid);
	if (!cls || cls != gid_class(&q->peer.sgid))
		return false;
	int t = q->path.sgid_type >= 0 && eng.v.gid_type ? eng.v.gid_type(c->ctx, port, i) : -1;
	return t < 0 || t == q->path.sgid_type;
}

/*
 * The source GID of a new path on c for NCCL's QP q, which has a GRH (RoCE, or IB
 * across subnets): the entry with the index NCCL chose (NCCL_IB_GID_INDEX, or its
 * own pick) when it is of the same kind on this NIC, as on NICs of one model and
 * configuration, else the first entry of that kind (NCCL's pick can differ between
 * NICs whose tables differ). Its index, or -1 when the NIC has none: a GID of
 * another kind would be unroutable or leave the traffic class's network.
 */
#define GID_TABLE_MAX 256
static int match_sgid(struct r2cc_ctx *c, uint8_t port, const struct r2cc_qp *q, union ibv_gid *gid)
{
	if (!eng.v.query_gid)
		return -1;
	if (gid_like(c, port, q->path.sgid_index, q, gid))
		return q->path.sgid_index;
	for (int i = 0; i < GID_TABLE_MAX; i++)
		if (i != q->path.sgid_index && gid_like(c, port, i, q, gid))
			return i;
	return -1;
}

static int new_path(struct r2cc_rqp *r, struct r2cc_nic *nic);
static int connect_path(struct r2cc_rqp *r, const struct peer_path *p);

/* A new path on the NIC placement gives (rail: the peer's, or NULL), and, with p,
 * connected to it; a NIC whose device refuses (dead: EIO, ENETDOWN) has failed,
 * and the next one is tried. 0 (*nicp the NIC), -ENODEV when none is left, or the
 * error of the last try (a connection refused otherwise leaves the path made). */
static int path_on_healthy(struct r2cc_rqp *r, struct r2cc_nic *first, const char *rail,
			   const struct peer_path *p, struct r2cc_nic **nicp)
{
	struct r2cc_nic *nic = first ? first : place(r, rail);
	int rc = -ENODEV;
	for (int tries = 0; nic && tries <= R2CC_MAX_NICS; tries++) {
		rc = new_path(r, nic);
		if (!rc && p && (rc = connect_path(r, p)) && refused_by_dead_device(-rc))
			drop_new_path(r);
		*nicp = nic;
		if (!rc || !refused_by_dead_device(-rc))
			return rc;
		nic_dead(nic, "a queue pair of hot repair's on it", -rc);
		nic = place(r, rail);
		rc = -ENODEV;
	}
	return rc;
}

/* A QP (and its CQ) of R2CC's own on nic, in INIT. */
static int new_path(struct r2cc_rqp *r, struct r2cc_nic *nic)
{
	struct r2cc_ctx *c = nic == r->orig_nic ? r->orig_ctx : ctx_of_nic(nic);
	struct ibv_pd *pd = pd_on(r, nic);
	if (!c || !pd || !r->q)
		return -ENODEV;
	struct pcq *pc = pcq_get(r, c);
	if (!pc)
		return -errno ? -errno : -ENOMEM;
	struct ibv_cq *cq = pc->cq;
	struct ibv_qp_init_attr ia = {
	    .send_cq = cq,
	    .recv_cq = cq,
	    .cap = r->cap,
	    .qp_type = IBV_QPT_RC,
	    .sq_sig_all = r->sq_sig_all,
	};
	ia.cap.max_send_wr += 8; /* room for the markers of a later fence */
	ia.cap.max_recv_wr += 8;
	struct ibv_qp *qp = eng.v.create_qp(pd, &ia);
	if (!qp) {
		int e = errno ? errno : ENOMEM;
		path_put(r, NULL, pc);
		return -e;
	}
	own_add(qp);
	int rc = qp_init(qp, nic,
			 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
			 r->q->path.pkey_index);
	if (!rc && r->q->peer.has_grh) {
		int i = match_sgid(c, nic->port ? nic->port : 1, r->q, &r->new_sgid);
		if (i < 0) {
			R2CC_WARN("repair: qp 0x%x: %s has no GID of the kind NCCL's path uses "
				  "(index %u there)",
				  r->qpn, nic->name, r->q->path.sgid_index);
			rc = ENOENT;
		}
		r->new_sgid_index = (uint8_t)(i < 0 ? 0 : i);
	}
	/* The shadow records NCCL's requests only (markers and probes go around
	 * it): NCCL's caps, not the QP's, which would double its rings. */
	struct r2cc_qp_shadow_attr sa = {
	    .max_send_wr = r->cap.max_send_wr,
	    .max_recv_wr = r->cap.max_recv_wr,
	    .max_send_sge = r->cap.max_send_sge,
	    .max_recv_sge = r->cap.max_recv_sge,
	    .max_inline_data = r->cap.max_inline_data,
	    .sq_sig_all = r->sq_sig_all,
	};
	struct r2cc_qp_shadow *sh = NULL;
	if (!rc)
		rc = -r2cc_qp_shadow_create(&sa, &sh);
	if (rc) {
		path_put(r, qp, pc);
		return -rc;
	}
	r->new_qp = qp;
	r->new_cq = cq;
	r->new_pcq = pc;
	r->new_ctx = c;
	r->new_sh = sh;
	return 0;
}

/* The new path towards p with NCCL's path attributes (its GRH's class, flow and
 * hop limit, its service level) from the matching source GID. */
static int connect_path(struct r2cc_rqp *r, const struct peer_path *p)
{
	const struct r2cc_qp *q = r->q;
	const struct r2cc_nic *nic = r->new_ctx->nic;
	int mtu = path_mtu(r, nic);
	struct qp_link l = {
	    .qpn = p->qpn,
	    .lid = p->lid,
	    .mtu = (enum ibv_mtu)(p->mtu && p->mtu < mtu ? p->mtu : mtu),
	    .gid = q->peer.has_grh ? p->gid : NULL,
	    .sgid_index = r->new_sgid_index,
	    .hop_limit = q->path.hop_limit,
	    .traffic_class = q->path.traffic_class,
	    .flow_label = q->path.flow_label,
	    .sl = q->path.sl,
	    .timeout = q->timeout ? q->timeout : 20,
	    .retry_cnt = q->retry_cnt ? q->retry_cnt : 7,
	    .rnr_retry = q->rnr_retry ? q->rnr_retry : 7,
	};
	return qp_connect(r->new_qp, nic, &l);
}

/* --- commit ------------------------------------------------------------------------ */

/*
 * The receive completions of messages the peer retired and this side never
 * counted: its device lost them (repair/qp_shadow.h), made from the peer's
 * record of those messages into wc. How many, or -EPROTO when the record does
 * not reach back to this side's count. Under r->mu, fenced.
 */
static int recv_lost(struct r2cc_rqp *r, struct ibv_wc *wc)
{
	uint64_t k = r2cc_qp_shadow_recv_consumed(r->cur_sh);
	if (r->peer_sent <= k)
		return 0;
	uint64_t first = r->peer_sent - (uint64_t)r->npeer_lost + 1;
	if (k + 1 < first)
		return -EPROTO;
	int n = 0;
	for (uint64_t m = k + 1; m <= r->peer_sent; m++, n++) {
		int rc =
		    r2cc_qp_shadow_recv_lost(r->cur_sh, &r->peer_lost[m - first], r->qpn, &wc[n]);
		if (rc)
			return rc;
	}
	R2CC_WARN("repair: qp 0x%x: %d receive completion(s) lost by %s (the peer's sends were "
		  "acknowledged); made from the peer's record",
		  r->qpn, n, r->cur_nic->name);
	r->k_local = k + (uint64_t)n;
	return n;
}

/* The plan from the drained current path and the peer's count; the receive
 * completions this side's device lost and the plan's synthesised completions go to
 * NCCL first. Under r->mu. */
static int make_plan(struct r2cc_rqp *r)
{
	struct ibv_wc lost[R2CC_SHADOW_LOST_MAX];
	int nlost = recv_lost(r, lost);
	if (nlost < 0)
		return nlost;
	struct r2cc_qp_shadow_plan_in in = {.peer_recv_consumed = r->k_peer, .lost_sent = true};
	int rc = r2cc_qp_shadow_plan_build(r->cur_sh, &in, &r->plan);
	if (rc)
		return rc;
	struct r2cc_vcq *v = r->vcq->v;
	pthread_mutex_lock(&v->mu);
	if (!stash_room(v, r->plan.n_synth + (size_t)nlost)) {
		pthread_mutex_unlock(&v->mu);
		r2cc_qp_shadow_plan_free(&r->plan);
		return -ENOMEM;
	}
	r->have_plan = true;
	r->lost_synth = nlost;
	for (int i = 0; i < nlost; i++)
		stash_push(v, &lost[i]);
	for (size_t i = 0; i < r->plan.n_synth; i++) {
		struct ibv_wc wc;
		r2cc_qp_shadow_plan_wc(&r->plan, i, r->qpn, &wc);
		stash_push(v, &wc);
	}
	pthread_mutex_unlock(&v->mu);
	return 0;
}

/* The new path becomes the current one (its completions registered by
 * register_path()). Under r->mu. */
static void switch_path(struct r2cc_rqp *r, const struct peer_path *p, struct ibv_qp **old_qp,
			struct pcq **old_pcq, struct r2cc_qp_shadow **old_sh)
{
	struct r2cc_vcq *v = r->vcq->v;
	/* Off the declared NIC now (the peer may have moved it first): NCCL's
	 * first post has nothing left to move. */
	r->declared_pending = false;
	*old_qp = r->cur_cq ? r->cur_qp : NULL;
	*old_pcq = r->cur_pcq;
	*old_sh = r->cur_sh != (r->q ? r->q->shadow : NULL) ? r->cur_sh : NULL;
	pthread_mutex_lock(&v->mu);
	if (*old_qp && r2cc_hmap_get(&r->cur_pcq->by_qpn, (*old_qp)->qp_num) == r)
		r2cc_hmap_del(&r->cur_pcq->by_qpn, (*old_qp)->qp_num);
	r->cur_qp = r->new_qp;
	r->cur_cq = r->new_cq;
	r->cur_pcq = r->new_pcq;
	r->cur_ctx = r->new_ctx;
	__atomic_store_n(&r->cur_nic, r->new_ctx->nic, __ATOMIC_RELEASE);
	r->cur_sh = r->new_sh;
	__atomic_store_n(&r->new_path_err, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&r->switched, 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&v->mu);
	r->new_qp = NULL;
	r->new_cq = NULL;
	r->new_pcq = NULL;
	r->new_sh = NULL;
	snprintf(r->peer_cur_nic, sizeof(r->peer_cur_nic), "%s", p->nic);
	r->recv_live = r->send_live = false;
	r->hold_all = false;
}

static int post_plan_recvs(struct r2cc_rqp *r)
{
	for (size_t i = 0; i < r->plan.n_recv; i++) {
		struct ibv_sge sge[16];
		struct ibv_recv_wr w;
		if (r->plan.recv[i].num_sge > 16)
			return -E2BIG;
		r2cc_qp_shadow_plan_recv_wr(&r->plan, i, &w, sge);
		int rc = post_one_recv(r, &w);
		if (rc)
			return rc;
	}
	int rc = flush_held_recvs(r);
	if (!rc)
		r->recv_live = true;
	return rc;
}

/* The plan's sends from i on are held ahead of NCCL's held posts, in their order,
 * and the path is live (what follows is held behind them). Under r->mu. */
static int hold_plan_sends(struct r2cc_rqp *r, size_t i)
{
	struct held_send *rest = r->hs_head, **rest_tail = r->hs_tail;
	r->hs_head = NULL;
	r->hs_tail = &r->hs_head;
	int rc = 0;
	for (; i < r->plan.n_send && !rc; i++) {
		struct ibv_sge sge[17];
		struct ibv_send_wr w;
		r2cc_qp_shadow_plan_send_wr(&r->plan, i, &w, sge);
		rc = hold_send(r, &w);
	}
	*r->hs_tail = rest;
	if (rest)
		r->hs_tail = rest_tail;
	if (rc)
		return rc;
	r->send_live = true;
	return 0;
}

/*
 * The re-posts of a migration go out on NCCL's own thread, never on the repair
 * thread: a re-posted clear-to-send write reads its FIFO element when it is
 * posted, and NCCL's thread rewrites those elements only between its own calls
 * (it fills one, then posts it), so a re-post there never carries a torn element
 * (repair/qp_shadow.h, "Clear-to-send"). The plan's sends are held in front of
 * NCCL's held posts, and NCCL's next post on the QP or poll of its CQ (which it
 * makes while it waits for them) posts them all, in order. false (post them
 * here) only when the CQ's list cannot grow. Under r->mu.
 */
static bool app_flush_need(struct r2cc_rqp *r)
{
	if (r->app_flush)
		return true;
	struct r2cc_vcq *v = r->vcq ? r->vcq->v : NULL;
	if (!v)
		return false;
	pthread_mutex_lock(&v->mu);
	if (v->nflush == v->capflush) {
		int cap = v->capflush ? 2 * v->capflush : 16;
		struct r2cc_rqp **f = realloc(v->flush, (size_t)cap * sizeof(*f));
		if (!f) {
			pthread_mutex_unlock(&v->mu);
			return false;
		}
		v->flush = f;
		v->capflush = cap;
	}
	v->flush[v->nflush] = r;
	__atomic_store_n(&v->nflush, v->nflush + 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&v->mu);
	r->app_flush = true;
	return true;
}

/* NCCL's thread, under r->mu: the held sends posted (app_flush_need). A key the
 * cache lacks holds the rest (keys_need); any other error is the QP's, which the
 * repair thread gives it (keys_tick). */
static void app_flush_run(struct r2cc_rqp *r)
{
	if (!r->app_flush || r->dead)
		return;
	r->app_flush = false;
	/* Another repair took the QP meanwhile (its path fenced or being replaced):
	 * they stay held, and that repair's commit asks again (app_flush_need). */
	int s = load_state(r);
	if (s != RQ_MIGRATED && !(s == RQ_EXCHANGE && r->send_live))
		return;
	uint64_t n = 0;
	int rc = flush_held_sends(r, &n);
	__atomic_add_fetch(&eng.reposts_nccl, n, __ATOMIC_RELAXED);
	if (rc) {
		__atomic_store_n(&r->flush_err, rc, __ATOMIC_RELAXED);
		__atomic_store_n(&eng.keys_due, 1, __ATOMIC_RELEASE);
	}
}

/* The poll side of app_flush_run: every QP of this CQ waiting for it. NCCL's
 * thread, without locks held. */
static void app_flush_poll(struct r2cc_vcq *v)
{
	if (r2cc_likely(!__atomic_load_n(&v->nflush, __ATOMIC_ACQUIRE)))
		return;
	for (;;) {
		struct r2cc_rqp *batch[16];
		int n = 0;
		pthread_mutex_lock(&v->mu);
		while (n < 16 && v->nflush) {
			batch[n++] = v->flush[v->nflush - 1];
			__atomic_store_n(&v->nflush, v->nflush - 1, __ATOMIC_RELAXED);
		}
		pthread_mutex_unlock(&v->mu);
		if (!n)
			return;
		/* (records outlive their QPs: r->dead says it is gone) */
		for (int i = 0; i < n; i++) {
			pthread_mutex_lock(&batch[i]->mu);
			app_flush_run(batch[i]);
			pthread_mutex_unlock(&batch[i]->mu);
		}
	}
}

static int post_plan_sends(struct r2cc_rqp *r, uint64_t *held)
{
	if (app_flush_need(r))
		return hold_plan_sends(r, 0);
	for (size_t i = 0; i < r->plan.n_send; i++) {
		struct ibv_sge sge[17];
		struct ibv_send_wr w;
		if (r->plan.send[i].num_sge > 16)
			return -E2BIG;
		r2cc_qp_shadow_plan_send_wr(&r->plan, i, &w, sge);
		int rc = post_one_send(r, &w);
		if (rc == -EAGAIN) {
			keys_need(r);
			return hold_plan_sends(r, i);
		}
		if (rc)
			return rc;
		__atomic_add_fetch(&eng.reposts_repair, 1, __ATOMIC_RELAXED);
	}
	uint64_t before = *held;
	int rc = flush_held_sends(r, held);
	__atomic_add_fetch(&eng.reposts_repair, *held - before, __ATOMIC_RELAXED);
	if (!rc)
		r->send_live = true;
	return rc;
}

/* The new path's QP number in its shared CQ, so that its completions reach r;
 * before anything else of the switch, because this may run out of memory: a
 * path whose completions could not be routed must not become current (they
 * would be lost). Nothing completes on the path yet. Under r->mu. */
static int register_path(struct r2cc_rqp *r)
{
	pthread_mutex_lock(&r->vcq->v->mu);
	int rc = r2cc_hmap_put(&r->new_pcq->by_qpn, r->new_qp->qp_num, r);
	pthread_mutex_unlock(&r->vcq->v->mu);
	return rc;
}

/*
 * The plan against the peer's count (its synthesised completions queued for NCCL),
 * the new path made current, the receives re-posted and, with sends, the sends and
 * NCCL's held posts too: then the QP has migrated. The previous private path, if
 * any, is destroyed after. 0 or a negative errno.
 */
static int commit_path(struct r2cc_rqp *r, const struct peer_path *p, bool sends, uint64_t *held)
{
	struct ibv_qp *oq = NULL;
	struct pcq *oc = NULL;
	struct r2cc_qp_shadow *osh = NULL;
	pthread_mutex_lock(&r->mu);
	int rc = register_path(r);
	if (!rc)
		rc = make_plan(r);
	if (!rc) {
		switch_path(r, p, &oq, &oc, &osh);
		rc = post_plan_recvs(r);
	}
	if (!rc && sends) {
		rc = post_plan_sends(r, held);
		if (!rc)
			set_state(r, RQ_MIGRATED);
	}
	pthread_mutex_unlock(&r->mu);
	if (oq || oc)
		path_put(r, oq, oc);
	if (osh)
		r2cc_qp_shadow_destroy(osh);
	return rc;
}

/* --- failure ------------------------------------------------------------------------- */

/* Repair is impossible: NCCL gets one error completion for the QP and the held
 * posts flush on its (ERR) QP. */
static void fail(struct r2cc_rqp *r, const char *why)
{
	if (r->dead || !r->q)
		return;
	/* NCCL's posts and polls on this QP and its CQ go through R2CC from now on:
	 * the error below waits in the CQ's stash. */
	gate_close(&r->q->gate);
	gate_close(&r->vcq->gate);
	pthread_mutex_lock(&r->mu);
	if (load_state(r) == RQ_FAILED || r->dead) {
		pthread_mutex_unlock(&r->mu);
		return;
	}
	R2CC_WARN("repair: qp 0x%x on %s cannot be repaired (%s); NCCL gets the error", r->qpn,
		  r->orig_nic->name, why);
	drop_new_path(r);
	ledger_move(r, NULL, 0);
	r->failback_to = NULL;
	set_state(r, RQ_FAILED);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
	eng.v.modify_qp(r->q->qp, &a, IBV_QP_STATE);
	struct ibv_wc wc;
	memset(&wc, 0, sizeof(wc));
	wc.status = r->status_seen ? (enum ibv_wc_status)r->status_seen : IBV_WC_RETRY_EXC_ERR;
	wc.qp_num = r->qpn;
	wc.opcode = IBV_WC_RDMA_WRITE;
	pthread_mutex_lock(&r->vcq->v->mu);
	/* Into the entry reserved for it when the QP was created. */
	bool room = r->stash_held;
	stash_release_locked(r);
	if (room || stash_room(r->vcq->v, 1))
		stash_push(r->vcq->v, &wc);
	pthread_mutex_unlock(&r->vcq->v->mu);
	while (r->hr_head) {
		struct held_recv *h = r->hr_head;
		struct ibv_recv_wr *b;
		r->hr_head = h->next;
		r->orig_ctx->post_recv(r->q->qp, &h->wr, &b);
		free(h);
	}
	r->hr_tail = &r->hr_head;
	while (r->hs_head) {
		struct held_send *h = r->hs_head;
		struct ibv_send_wr *b;
		r->hs_head = h->next;
		r->orig_ctx->post_send(r->q->qp, &h->wr, &b);
		free(h);
	}
	r->hs_tail = &r->hs_head;
	pthread_mutex_unlock(&r->mu);
	pthread_mutex_lock(&eng.mu);
	if (r->incident >= 0)
		eng.inc[r->incident].failed++;
	pthread_mutex_unlock(&eng.mu);
	incident_event(r->incident, "qp 0x%x: repair impossible: %s", r->qpn, why);
}

static void done(struct r2cc_rqp *r, uint64_t held)
{
	int64_t t = now_ns();
	bool back = r->failback_to != NULL;
	/* Home again: no longer one of the QPs the node moved onto a NIC. */
	if (r->cur_nic == r->orig_nic)
		ledger_move(r, NULL, 0);
	pthread_mutex_lock(&eng.mu);
	/* A declared move is no failure of a path, a failback none either, and the
	 * failure of a path a failback made is the NIC's flap, which its hold-down
	 * bounds: none of them counts towards churning. */
	if ((r->incident < 0 || !eng.inc[r->incident].declared) && !r->churn_skip && !back &&
	    !r->back_path)
		r->recent[r->churn++ % CHURN_RING] = t;
	r->churn_skip = false;
	r->back_path = back && r->cur_nic == r->orig_nic;
	r->failback_to = NULL;
	r->migrations++;
	r->moved_at = t;
	if (r->cur_sh) {
		uint64_t posted;
		r2cc_qp_shadow_signalled(r->cur_sh, &posted, &r->moved_retired);
	}
	if (r->incident >= 0) {
		struct incident *in = &eng.inc[r->incident];
		in->migrated++;
		in->bytes_reposted += r->plan.bytes_reposted;
		in->bytes_saved += r->plan.bytes_saved;
		in->synth += r->plan.completions_synth + (uint64_t)r->lost_synth;
		in->held += held;
		if (t > in->t_done)
			in->t_done = t;
	}
	pthread_mutex_unlock(&eng.mu);
	incident_event(r->incident,
		       "qp 0x%x: %s -> %s (peer %s -> %s), re-posted %zu sends %zu receives "
		       "%llu held, %zu completions synthesised",
		       r->qpn, r->orig_nic->name, r->cur_nic->name, r->peer_orig_nic,
		       r->peer_cur_nic, r->plan.n_send, r->plan.n_recv, (unsigned long long)held,
		       r->plan.n_synth + (size_t)r->lost_synth);
	R2CC_INFO("repair: qp 0x%x %s %s in %.1f ms (%s)", r->qpn, back ? "back on" : "migrated to",
		  r->cur_nic->name, (t - r->t_detect) / 1e6, r->cause);
	r2cc_qp_shadow_plan_free(&r->plan);
	r->have_plan = false;
	__atomic_store_n(&r->switched, 0, __ATOMIC_RELEASE);
	/* The new path failed while the exchange went on (its error was kept from NCCL,
	 * as a repair's are): repaired now, not when the stall scan finds the wait. */
	int e = __atomic_exchange_n(&r->new_path_err, 0, __ATOMIC_ACQ_REL);
	if (e) {
		char why[128];
		snprintf(why, sizeof(why),
			 "error completion (status %d) on its new path %.40s "
			 "during the exchange",
			 e, r->cur_nic->name);
		detect(r, why, e);
	}
}

/* --- the exchange ---------------------------------------------------------------------- */

static void path_from_wire(struct peer_path *p, const struct rep_wire *m)
{
	p->qpn = le32toh(m->new_qpn);
	p->lid = le16toh(m->new_lid);
	p->port = m->new_port;
	p->mtu = m->new_mtu >= IBV_MTU_256 && m->new_mtu <= IBV_MTU_4096 ? m->new_mtu : 0;
	memcpy(p->gid, m->new_gid, 16);
	snprintf(p->nic, sizeof(p->nic), "%s", m->new_nic);
}

/* Our NCCL QP addressed by an entry: exactly the connection whose this end is
 * the entry's dst and whose other end is its src (repair/peer.h). Under eng.mu
 * (the record is then kept from NCCL's destroy by its busy flag). */
static struct r2cc_rqp *rqp_of_msg(const struct rep_wire *m)
{
	struct r2cc_peer_ep local, remote;
	r2cc_peer_ep_get(m->dst, &local);
	r2cc_peer_ep_get(m->src, &remote);
	struct r2cc_rqp *r = r2cc_peer_find(&local, &remote);
	return r && !r->dead ? r : NULL;
}

/* Of the two ends, whose exchange goes on when both started one. */
static bool lower_id(const struct r2cc_rqp *r)
{
	return r2cc_peer_ep_cmp(&r->ep_local, &r->ep_remote) < 0;
}

/* A NACK answering entry m. */
static void nack_entry(struct rep_wire *out, const struct rep_wire *m, int status)
{
	memset(out, 0, sizeof(*out));
	out->op = OP_NACK;
	out->status = (int32_t)htole32((uint32_t)status);
	out->pair_id = m->pair_id;
	memcpy(out->src, m->dst, sizeof(out->src));
	memcpy(out->dst, m->src, sizeof(out->dst));
}

static void nack(struct outboxes *o, const struct r2cc_ctl_dir *dir, int rank,
		 const struct rep_wire *m, int status)
{
	struct rep_wire *e = out_add(o, dir, rank);
	if (e)
		nack_entry(e, m, status);
}

/* How long an exchange of n queue pairs in one message may take: the base,
 * and per queue pair what fencing, a new QP and the re-posts cost both ends,
 * with a wide margin. */
static int64_t exchange_ns(int n)
{
	return (int64_t)R2CC_REPAIR_BASE_MS * 1000000 + (int64_t)n * R2CC_REPAIR_PER_QP_US * 1000;
}

/* The rkeys of the peer on its new NIC, once per (peer, NIC pair) of a batch,
 * when its message did not carry them. */
struct refresh_set {
	struct r2cc_hmap seen;
};

static void refresh_once(struct refresh_set *rs, const struct r2cc_ctl_dir *dir, int rank,
			 const char *from, const char *to)
{
	if (!strcmp(from, to))
		return;
	char key[2 * R2CC_NIC_NAME_MAX + 32];
	int n = snprintf(key, sizeof(key), "%p/%d/%s/%s", (const void *)dir, rank, from, to);
	uint64_t k = r2cc_hmap_hash_bytes(key, (size_t)n);
	if (r2cc_hmap_get(&rs->seen, k))
		return;
	r2cc_hmap_put(&rs->seen, k, (void *)1);
	r2cc_mr_mirror_remote_refresh(dir, rank, from, to, 2000);
}

/* Did the message carry (and the key cache take) the sender's map from to? */
static bool map_carried(const struct inbox *in, const char *from, const char *to)
{
	const unsigned char *p = in->maps;
	for (int j = 0; j < in->nmaps; j++) {
		struct rep_map h;
		memcpy(&h, p, sizeof(h));
		if (in->map_ok[j] && !strcmp(h.from, from) && !strcmp(h.to, to))
			return true;
		p += sizeof(h) + le32toh(h.len);
	}
	return false;
}

/* The maps a message carries, into the key cache before its entries are
 * handled. */
static void maps_store(struct inbox *in, const struct r2cc_ctl_dir *dir)
{
	const unsigned char *p = in->maps;
	for (int j = 0; j < in->nmaps; j++) {
		struct rep_map h;
		memcpy(&h, p, sizeof(h));
		size_t len = le32toh(h.len);
		int rc = r2cc_mr_mirror_remote_store(dir, in->from_rank, h.from, h.to,
						     p + sizeof(h), len);
		in->map_ok[j] = rc == 0;
		if (rc)
			R2CC_WARN_ONCE("repair: the rkey map %s -> %s from rank %d cannot be used "
				       "(%s); it is fetched",
				       h.from, h.to, in->from_rank, strerror(-rc));
		p += sizeof(h) + len;
	}
}

/* The keys of r's peer on the NIC to which its side moved: r's posts carry its
 * keys on the original NIC. With the peer's message as a rule; fetched (the
 * old round trip) when that did not carry them. */
static void peer_keys(struct refresh_set *rs, const struct inbox *in,
		      const struct r2cc_ctl_dir *dir, const struct r2cc_rqp *r, const char *to)
{
	const char *from = r->peer_orig_nic;
	if (!strcmp(from, to))
		return;
	bool carried = map_carried(in, from, to);
	pthread_mutex_lock(&eng.mu);
	if (r->incident >= 0) {
		if (carried)
			eng.inc[r->incident].maps_carried++;
		else
			eng.inc[r->incident].maps_fetched++;
	}
	pthread_mutex_unlock(&eng.mu);
	if (carried)
		return;
	R2CC_WARN_ONCE("repair: rank %d's exchange message came without its rkey map %s -> %s; "
		       "fetching it",
		       in->from_rank, from, to);
	refresh_once(rs, dir, in->from_rank, from, to);
}

static void selftest_start(struct r2cc_nic *a, const char *why, bool stall);

/* The live records pred picks, copied out under eng.mu so that the caller acts on
 * them without it; *list is malloc'd (NULL when none, or out of memory: logged). */
typedef bool (*rqp_pred)(const struct r2cc_rqp *r, const void *arg);
/* The records of the queue pairs that pred selects, listed for use outside eng.mu:
 * until collect_done(), no record is freed (records_sweep_locked). */
static int collect(struct r2cc_rqp ***list, rqp_pred pred, const void *arg)
{
	int n = 0, cap = 0;
	*list = NULL;
	pthread_mutex_lock(&eng.mu);
	eng.holders++;
	for (struct r2cc_rqp *r = eng.all; r; r = r->next_all) {
		if (r->dead || !pred(r, arg))
			continue;
		if (n == cap) {
			int ncap = cap ? 2 * cap : 64;
			struct r2cc_rqp **g = realloc(*list, (size_t)ncap * sizeof(*g));
			if (!g) {
				R2CC_WARN("repair: out of memory listing queue pairs; %d of them "
					  "are moved only when their own failure shows",
					  n);
				break;
			}
			*list = g;
			cap = ncap;
		}
		(*list)[n++] = r;
	}
	pthread_mutex_unlock(&eng.mu);
	return n;
}

static void collect_done(struct r2cc_rqp **list)
{
	free(list);
	pthread_mutex_lock(&eng.mu);
	eng.holders--;
	pthread_mutex_unlock(&eng.mu);
}

struct same_path {
	const struct r2cc_rqp *r;
	const struct r2cc_nic *nic;
	bool port_down;
};

static bool on_same_path(const struct r2cc_rqp *o, const void *arg)
{
	const struct same_path *sp = arg;
	return o != sp->r && o->q && o->cur_nic == sp->nic &&
	       (sp->port_down || o->q->peer.lid == sp->r->q->peer.lid);
}

static bool on_nic(const struct r2cc_rqp *r, const void *nic)
{
	return r->cur_nic == nic;
}

/*
 * Localise a failure seen on one QP: with the local port down it is the NIC, and
 * every QP on it moves; with the port up it is the path to the peer's NIC (or the
 * peer's NIC), and every QP of this NIC to that peer NIC moves, since the ones
 * that have nothing outstanding would only find out later. Repair thread.
 */
static void localise(struct r2cc_rqp *r)
{
	struct ibv_port_attr pa;
	memset(&pa, 0, sizeof(pa));
	struct r2cc_nic *nic = r->cur_nic;
	bool port_down = eng.v.query_port(r->cur_ctx->ctx, nic->port ? nic->port : 1, &pa) == 0 &&
			 pa.state != IBV_PORT_ACTIVE;
	if (port_down && __atomic_load_n(&nic->state, __ATOMIC_RELAXED) == R2CC_NIC_UP) {
		__atomic_store_n(&nic->state, R2CC_NIC_DOWN, __ATOMIC_SEQ_CST);
		R2CC_WARN("repair: %s: port not active; migrating its queue pairs", nic->name);
	}
	struct same_path sp = {.r = r, .nic = nic, .port_down = port_down};
	struct r2cc_rqp **list;
	int n = collect(&list, on_same_path, &sp);
	char why[128];
	snprintf(why, sizeof(why), "%s as qp 0x%x (%s)", port_down ? "same NIC" : "same path",
		 r->qpn, r->cause);
	for (int i = 0; i < n; i++)
		detect_on(list[i], nic, why, r->status_seen);
	collect_done(list);
	incident_event(r->incident, "qp 0x%x: localised to %s %s%s, %d more QP(s) to move", r->qpn,
		       port_down ? "NIC" : "path from", nic->name, port_down ? "" : " to its peer",
		       n);
	if (!port_down)
		selftest_start(nic, why, false);
}

/*
 * NIC self-test. A failure with the port up is a dead path (or a dead NIC on the
 * other side), or a dead NIC here whose port still says active (a black hole);
 * a stall may also be no failure at all, only a loaded fabric. The test tells
 * them apart: a signalled zero-byte write from the suspect NIC to a sibling NIC
 * of this process, through the fabric, on a QP pair of R2CC's own. It queues
 * behind what the node has queued on both NICs, so it is given a base time (1.5
 * x R2CC_STALL_MS: 150 ms by default) plus what those queues explain
 * (repair/stall.h). R2CC_STALL_MS is the longest pause of a healthy port beyond its
 * queue that R2CC tolerates: the test's write, delayed that long, still answers in
 * time, and so does some request of a port that has work. A user who raises it
 * for a fabric whose healthy ports pause longer raises the test's patience too. Without an answer
 * by then, the NIC is dead only if it also completed nothing at all while it had work: a NIC that
 * drains is alive however slowly (the test is extended, up to SELFTEST_MAX_NS,
 * then called inconclusive), and congestion cannot make a NIC that has work
 * complete nothing while its test goes unanswered. A dead NIC has every QP on it
 * moved. Runs on a short-lived thread, at most one per NIC at a time; a NIC that
 * passed is not tested again for a back-off that doubles while the suspicions
 * go on (a healthy, loaded NIC is not tested on every scan).
 */
#define SELFTEST_MAX_NS	     5000000000ll
#define SELFTEST_BACKOFF_NS  100000000ll
#define SELFTEST_BACKOFF_MAX 2000000000ll
#define SELFTEST_SIBLINGS    3		  /* tested through at once */
#define SUSPECT_NIC_NS	     2000000000ll /* a NIC with a failure this recent is no witness */

struct selftest {
	struct r2cc_nic *a;
	struct r2cc_ctx *ca;
	int nb;
	struct r2cc_nic *b[SELFTEST_SIBLINGS];
	struct r2cc_ctx *cb[SELFTEST_SIBLINGS];
	struct ibv_qp *qa[SELFTEST_SIBLINGS], *qb[SELFTEST_SIBLINGS];
	struct ibv_cq *cqa, *cqb[SELFTEST_SIBLINGS];
	bool calibrate; /* RoCE: only which siblings answer; no back-off after it */
	bool failback;	/* a failed NIC's probe: the verdict goes to failback_tick() */
	char why[128];
};

/* Per NIC (registry index): no new self-test before next, the back-off, and
 * the last time a failure was seen on it (it is then a poor witness for its
 * siblings' tests). next and failure_at are read by other threads (atomic);
 * backoff only by the NIC's self-test, of which one runs at a time. */
static struct {
	int64_t next, backoff, failure_at;
	/* RoCE: siblings (bits of their registry index) whose self-test QP answered
	 * this NIC's once, so that the fabric routes between them: only those are
	 * witnesses (unrouted rails never answer, and would make any NIC look dead);
	 * calib_at: the last test run to learn them (atomic, both) */
	uint64_t reach;
	int64_t calib_at;
} st_nic[R2CC_STALL_MAX_NICS];

/*
 * Failback (R2CC_FAILBACK_MS), per NIC (registry index). A failed NIC is probed
 * while its port is ACTIVE: a self-test through its siblings, whose verdict the
 * self-test thread leaves here (atomic). Once its probes have passed for
 * R2CC_FAILBACK_MS with no failure seen between, and its hold-down since its
 * last failback is over, it is up again and the QPs moved off it return. The
 * hold-down starts at R2CC_FAILBACK_MS and doubles (up to FAILBACK_HOLD_MAX_NS)
 * each time the NIC fails again within twice the hold-down after its failback:
 * a flapping NIC comes back at most once per hold-down. A NIC whose device
 * died never comes back (its contexts are gone for good). Everything but the
 * verdict is the repair thread's.
 */
#define FB_NONE 2 /* no verdict (a self-test's are -1, 0 and 1) */
static struct {
	int verdict;
	int64_t probe_at; /* the running probe began then (0: none runs) */
	int64_t healthy_since, next_probe, failed_seen;
	int64_t hold, last_back; /* hold-down; when the last failback began */
	bool weighed;		 /* the first failure after the last failback was weighed */
	int backs;		 /* failbacks */
	bool dead;
} fb_nic[R2CC_STALL_MAX_NICS];

/* Its device is dead: it never comes back. */
static void failback_never(const struct r2cc_nic *nic)
{
	if (nic->index >= 0 && nic->index < R2CC_STALL_MAX_NICS)
		__atomic_store_n(&fb_nic[nic->index].dead, true, __ATOMIC_RELAXED);
}

static void failback_verdict(int i, int verdict)
{
	__atomic_store_n(&fb_nic[i].verdict, verdict, __ATOMIC_RELEASE);
}

static void nic_failure_seen(const struct r2cc_nic *nic)
{
	if (nic && nic->index >= 0 && nic->index < R2CC_STALL_MAX_NICS)
		__atomic_store_n(&st_nic[nic->index].failure_at, now_ns(), __ATOMIC_RELAXED);
}

static bool nic_failed_lately(const struct r2cc_nic *nic)
{
	if (!nic || nic->index < 0 || nic->index >= R2CC_STALL_MAX_NICS)
		return false;
	int64_t t = __atomic_load_n(&st_nic[nic->index].failure_at, __ATOMIC_RELAXED);
	return t && now_ns() - t < SUSPECT_NIC_NS;
}

/* Transport timeouts long enough for a loaded fabric (about 0.5 s on hardware);
 * the verdict is the test's own, from its answer and the NIC's progress. */
static int selftest_connect(struct ibv_qp *qp, struct r2cc_nic *self, struct r2cc_nic *peer,
			    struct r2cc_ctx *peer_ctx, uint32_t peer_qpn)
{
	struct qp_link l = {.qpn = peer_qpn,
			    .lid = peer->lid,
			    .mtu = IBV_MTU_1024,
			    .timeout = 14,
			    .retry_cnt = 7,
			    .rnr_retry = 7};
	/* RoCE: addressed as NCCL addresses its own QPs on both NICs (GID index and
	 * class), to the peer NIC's GID of that index */
	union ibv_gid g;
	if (self->link_layer == IBV_LINK_LAYER_ETHERNET) {
		if (!__atomic_load_n(&self->roce_known, __ATOMIC_ACQUIRE) ||
		    !__atomic_load_n(&peer->roce_known, __ATOMIC_ACQUIRE) || !eng.v.query_gid ||
		    eng.v.query_gid(peer_ctx->ctx, peer->port ? peer->port : 1,
				    peer->roce_sgid_index, &g))
			return -ENOENT;
		l.gid = g.raw;
		l.sgid_index = self->roce_sgid_index;
		l.traffic_class = self->roce_tclass;
	}
	int rc = qp_init(qp, self, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE, 0);
	if (rc)
		return -rc;
	return qp_connect(qp, self, &l);
}

/* RoCE: does b witness a's test (it answered one of a's before)? IB: always. */
static bool selftest_reaches(const struct r2cc_nic *a, const struct r2cc_nic *b)
{
	if (a->link_layer != IBV_LINK_LAYER_ETHERNET)
		return true;
	return a->index >= 0 && a->index < R2CC_STALL_MAX_NICS && b->index >= 0 && b->index < 64 &&
	       (__atomic_load_n(&st_nic[a->index].reach, __ATOMIC_RELAXED) >> b->index & 1);
}

static void nic_failed(struct r2cc_nic *nic, const char *why);
static int64_t stall_floor(void);

/* The test's base wait: 1.5 x the stall floor. */
static int64_t selftest_base_ns(void)
{
	return stall_floor() * 3 / 2;
}

/* How long the test waits for its answer before the NIC's progress is looked at:
 * the base time, and what the largest request in service on the NICs may take
 * (a NIC busy with one long request completes nothing meanwhile). What is queued
 * ahead does not count: a NIC that completes anything at all is alive. */
static int64_t selftest_window(const struct selftest *t)
{
	int64_t w = 0;
	for (int i = 0; i < t->nb; i++) {
		int64_t x = r2cc_stall_explained_ns(t->b[i], 0, 0);
		w = x > w ? x : w;
	}
	return selftest_base_ns() + r2cc_stall_explained_ns(t->a, 0, 0) + w;
}

/*
 * One signalled zero-byte write from a to every sibling at once; an answer from
 * any of them means a is alive. -1 inconclusive, 0 alive, 1 dead.
 */
static int selftest_run(struct selftest *t)
{
	int posted = 0;
	for (int i = 0; i < t->nb; i++) {
		struct ibv_send_wr w = {.wr_id = (uint64_t)i + 1,
					.opcode = IBV_WR_RDMA_WRITE,
					.send_flags = IBV_SEND_SIGNALED},
				   *bad;
		if (t->qa[i] && t->ca->post_send(t->qa[i], &w, &bad) == 0)
			posted |= 1 << i;
	}
	if (!posted)
		return -1;
	int64_t start = now_ns(), until = start + selftest_window(t);
	uint64_t da = r2cc_stall_drained(t->a), db[SELFTEST_SIBLINGS];
	bool b_busy[SELFTEST_SIBLINGS];
	for (int i = 0; i < t->nb; i++) {
		db[i] = r2cc_stall_drained(t->b[i]);
		b_busy[i] = r2cc_stall_queued(t->b[i]) > 0;
	}
	int answered = 0; /* with an error: a congested fabric can give one too */
	for (;;) {
		bool late = now_ns() >= until;
		/* polled once more after the deadline: this thread may have been
		 * off the CPU while an answer came */
		struct ibv_wc wc[SELFTEST_SIBLINGS];
		int n = answered == posted ? 0 : t->ca->poll_cq(t->cqa, SELFTEST_SIBLINGS, wc);
		for (int k = 0; k < n; k++) {
			if (wc[k].status == IBV_WC_SUCCESS) {
				/* the pair's QPs talk both ways: a witness for either */
				int i = (int)wc[k].wr_id - 1, a = t->a->index;
				int b = i >= 0 && i < t->nb ? t->b[i]->index : -1;
				if (a >= 0 && a < 64 && b >= 0 && b < 64) {
					__atomic_fetch_or(&st_nic[a].reach, 1ull << b,
							  __ATOMIC_RELAXED);
					__atomic_fetch_or(&st_nic[b].reach, 1ull << a,
							  __ATOMIC_RELAXED);
				}
				return 0;
			}
			if (wc[k].wr_id >= 1 && wc[k].wr_id <= SELFTEST_SIBLINGS)
				answered |= 1 << (wc[k].wr_id - 1);
		}
		if (__atomic_load_n(&eng.stop, __ATOMIC_RELAXED))
			return -1; /* the process is exiting */
		if (!late) {
			usleep(200);
			continue;
		}
		/* No answer by the deadline: the NIC's own progress decides, once
		 * the load model has been brought up to date meanwhile. A sibling that
		 * had work and completed none, or failed lately, is no witness. */
		uint64_t da2 = r2cc_stall_drained(t->a);
		bool fresh = r2cc_stall_updated() > until - selftest_base_ns() / 2, witness = false;
		for (int i = 0; i < t->nb; i++) {
			uint64_t d2 = r2cc_stall_drained(t->b[i]);
			b_busy[i] = b_busy[i] || r2cc_stall_queued(t->b[i]) > 0;
			witness = witness ||
				  ((posted >> i & 1) && !(b_busy[i] && d2 == db[i]) &&
				   !nic_failed_lately(t->b[i]) && selftest_reaches(t->a, t->b[i]));
			db[i] = d2;
		}
		if (fresh && da2 == da && witness)
			return 1; /* it completed nothing (busy or idle) and its tests went
				   * unanswered by siblings that are not stuck themselves */
		if (now_ns() - start >= SELFTEST_MAX_NS || (fresh && answered == posted))
			return -1;
		/* it drains, alive and busy (or the model lags): wait a while longer */
		da = da2;
		until = now_ns() + selftest_window(t);
	}
}

static void selftest_free(struct selftest *t)
{
	for (int i = 0; i < t->nb; i++) {
		destroy_private(t->qa[i], NULL);
		destroy_private(t->qb[i], t->cqb[i]);
	}
	destroy_private(NULL, t->cqa);
	__atomic_store_n(&t->a->selftest, 0, __ATOMIC_RELEASE);
	free(t);
}

static void *selftest_main(void *arg)
{
	struct selftest *t = arg;
	int verdict = -1;
	struct ibv_qp_init_attr ia = {
	    .qp_type = IBV_QPT_RC,
	    .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
	t->cqa = eng.v.create_cq(t->ca->ctx, 4 * SELFTEST_SIBLINGS, NULL, NULL, 0);
	if (t->cqa)
		own_add(t->cqa);
	for (int i = 0; i < t->nb && t->cqa; i++) {
		t->cqb[i] = eng.v.create_cq(t->cb[i]->ctx, 8, NULL, NULL, 0);
		if (!t->cqb[i])
			continue;
		own_add(t->cqb[i]);
		ia.send_cq = ia.recv_cq = t->cqa;
		t->qa[i] = eng.v.create_qp(r2cc_mr_mirror_pd(t->a), &ia);
		ia.send_cq = ia.recv_cq = t->cqb[i];
		t->qb[i] = eng.v.create_qp(r2cc_mr_mirror_pd(t->b[i]), &ia);
		if (t->qa[i])
			own_add(t->qa[i]);
		if (t->qb[i])
			own_add(t->qb[i]);
		if (!t->qa[i] || !t->qb[i] ||
		    selftest_connect(t->qa[i], t->a, t->b[i], t->cb[i], t->qb[i]->qp_num) ||
		    selftest_connect(t->qb[i], t->b[i], t->a, t->ca, t->qa[i]->qp_num)) {
			destroy_private(t->qa[i], NULL);
			destroy_private(t->qb[i], NULL);
			t->qa[i] = t->qb[i] = NULL;
		}
	}
	if (t->cqa)
		verdict = selftest_run(t);
	char through[3 * R2CC_NIC_NAME_MAX] = "";
	for (int i = 0; i < t->nb; i++)
		snprintf(through + strlen(through), sizeof(through) - strlen(through), "%s%s",
			 i ? "," : "", t->b[i]->name);
	int i = t->a->index;
	bool indexed = i >= 0 && i < R2CC_STALL_MAX_NICS;
	if (t->failback) {
		if (indexed)
			failback_verdict(i, verdict);
	} else if (verdict == 1) {
		__atomic_add_fetch(&eng.selftests_failed, 1, __ATOMIC_RELAXED);
		char why[256];
		snprintf(why, sizeof(why),
			 "self-test through %.60s got no answer and the NIC completed nothing "
			 "(%.100s)",
			 through, t->why);
		nic_failed(t->a, why);
	} else {
		__atomic_add_fetch(verdict ? &eng.selftests_inconclusive : &eng.selftests_passed, 1,
				   __ATOMIC_RELAXED);
		R2CC_INFO("repair: %s: self-test through %s %s (%s)", t->a->name, through,
			  verdict == 0 ? "passed: the NIC is alive" : "inconclusive", t->why);
		if (indexed && !t->calibrate) {
			int64_t b = st_nic[i].backoff;
			b = b ? 2 * b : SELFTEST_BACKOFF_NS;
			st_nic[i].backoff = b < SELFTEST_BACKOFF_MAX ? b : SELFTEST_BACKOFF_MAX;
			/* Read by the repair thread before it claims the NIC's test. */
			__atomic_store_n(&st_nic[i].next, now_ns() + st_nic[i].backoff,
					 __ATOMIC_RELAXED);
		}
	}
	selftest_free(t);
	__atomic_sub_fetch(&eng.selftests, 1, __ATOMIC_ACQ_REL);
	return NULL;
}

/* The siblings to test through: UP NICs of this process with their mirror,
 * those that completed work most recently first, and none with a failure seen
 * lately while there are others (a sibling that is itself dead would fail the
 * test of a healthy NIC). */
static void selftest_siblings(struct selftest *t)
{
	int n = r2cc_nic_count();
	for (int pass = 0; pass < 2 && t->nb < SELFTEST_SIBLINGS; pass++)
		while (t->nb < SELFTEST_SIBLINGS) {
			struct r2cc_nic *best = NULL;
			for (int i = 0; i < n; i++) {
				struct r2cc_nic *b = r2cc_nic_by_index(i);
				bool taken = false;
				for (int j = 0; j < t->nb; j++)
					taken = taken || t->b[j] == b;
				if (taken || b == t->a ||
				    __atomic_load_n(&b->state, __ATOMIC_RELAXED) != R2CC_NIC_UP ||
				    (pass == 0 && nic_failed_lately(b)) || !r2cc_mr_mirror_pd(b) ||
				    !ctx_of_nic(b))
					continue;
				if (!best || r2cc_stall_last_drain(b) > r2cc_stall_last_drain(best))
					best = b;
			}
			if (!best)
				break;
			t->cb[t->nb] = ctx_of_nic(best);
			t->b[t->nb++] = best;
		}
}

/* stall: the test confirms a suspected stall, and a NIC that passed one lately
 * is left alone; evidence of a failure (an error, the peer's request) is always
 * tested. */
static bool selftest_spawn(struct r2cc_nic *a, const char *why, bool calibrate, bool failback);
static void selftest_launch(struct r2cc_nic *a, const char *why, bool stall, bool calibrate)
{
	if (__atomic_load_n(&a->state, __ATOMIC_RELAXED) != R2CC_NIC_UP)
		return;
	int i = a->index;
	if (stall && i >= 0 && i < R2CC_STALL_MAX_NICS &&
	    now_ns() < __atomic_load_n(&st_nic[i].next, __ATOMIC_RELAXED))
		return;
	selftest_spawn(a, why, calibrate, false);
}

/* A self-test thread for a (unless one runs): true if it was started. */
static bool selftest_spawn(struct r2cc_nic *a, const char *why, bool calibrate, bool failback)
{
	int zero = 0;
	if (!__atomic_compare_exchange_n(&a->selftest, &zero, 1, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_RELAXED))
		return false;
	struct selftest *t = calloc(1, sizeof(*t));
	if (t) {
		t->a = a;
		t->calibrate = calibrate;
		t->failback = failback;
		selftest_siblings(t);
		snprintf(t->why, sizeof(t->why), "%s", why ? why : "");
	}
	pthread_t th;
	if (t && t->nb && r2cc_mr_mirror_pd(a) && (t->ca = ctx_of_nic(a))) {
		pthread_attr_t at;
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		/* counted first: the thread may end before pthread_create returns */
		__atomic_add_fetch(&eng.selftests, 1, __ATOMIC_ACQ_REL);
		int rc = __atomic_load_n(&eng.stop, __ATOMIC_ACQUIRE)
			     ? EAGAIN
			     : pthread_create(&th, &at, selftest_main, t);
		if (rc)
			__atomic_sub_fetch(&eng.selftests, 1, __ATOMIC_ACQ_REL);
		pthread_attr_destroy(&at);
		if (rc == 0) {
			pthread_setname_np(th, "r2cc-selftest");
			return true;
		}
	}
	free(t);
	__atomic_store_n(&a->selftest, 0, __ATOMIC_RELEASE);
	return false;
}

static void selftest_start(struct r2cc_nic *a, const char *why, bool stall)
{
	selftest_launch(a, why, stall, false);
}

/* RoCE: learns which siblings' self-test QPs answer this NIC's (a fabric routes
 * between rails, or not), at most once a second until one has; before that, no
 * self-test of the NIC is conclusive. Once NCCL's first QP on it is connected. */
static void selftest_calibrate(struct r2cc_nic *a)
{
	int i = a->index;
	if (a->link_layer != IBV_LINK_LAYER_ETHERNET || i < 0 || i >= R2CC_STALL_MAX_NICS ||
	    __atomic_load_n(&st_nic[i].reach, __ATOMIC_RELAXED) ||
	    !__atomic_load_n(&a->roce_known, __ATOMIC_ACQUIRE))
		return;
	int64_t t = now_ns(), last = __atomic_load_n(&st_nic[i].calib_at, __ATOMIC_RELAXED);
	if ((last && t - last < 1000000000ll) ||
	    !__atomic_compare_exchange_n(&st_nic[i].calib_at, &last, t, false, __ATOMIC_RELAXED,
					 __ATOMIC_RELAXED))
		return;
	selftest_launch(a, "which siblings answer it (RoCE)", false, true);
}

/* A QP that moved off nic and may return to it. */
static bool homed_on(const struct r2cc_rqp *r, const void *nic)
{
	return !r->dead && r->orig_nic == nic && r->cur_nic != nic && load_state(r) == RQ_MIGRATED;
}

/* r returns to nic: queued as a detection whose cause is the failback (NCCL's
 * threads may detect a failure of r at the same moment: the first one wins). Its
 * incident, or -1 when it does not move. */
static int detect_failback(struct r2cc_rqp *r, struct r2cc_nic *nic, const char *why)
{
	int s = RQ_MIGRATED;
	if (!r2cc_active() || !connected(r) ||
	    !__atomic_compare_exchange_n(&r->state, &s, RQ_DETECTED, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_RELAXED))
		return -1;
	pthread_mutex_lock(&eng.mu);
	r->failback_to = nic;
	note_detection(r, why, 0);
	int inc = r->incident;
	if (!r->queued) {
		r->queued = true;
		r->next_work = eng.work_head;
		eng.work_head = r;
	}
	pthread_cond_signal(&eng.cond);
	pthread_mutex_unlock(&eng.mu);
	return inc;
}

static bool live_rqp(const struct r2cc_rqp *r, const void *arg)
{
	(void)arg;
	return !r->dead && r->q;
}

/*
 * After the QPs of nic are on their way home: QPs whose own NIC is still down move
 * to nic too, one at a time, from the NIC with the most of this process's QPs of
 * their direction, while it has at least two more than nic (Balance, as at a
 * failure; a move that would only swap the imbalance is not made). How many.
 */
static int failback_spread(struct r2cc_nic *nic, const char *why, int *inc)
{
	struct r2cc_rqp **list;
	int n = collect(&list, live_rqp, NULL), moved = 0, me = nic->index;
	bool *skip = n ? calloc((size_t)n, sizeof(*skip)) : NULL;
	for (int rx = 0; skip && rx < 2; rx++) {
		int cnt[R2CC_MAX_NICS] = {0};
		for (int k = 0; k < n; k++) {
			const struct r2cc_nic *at =
			    list[k]->failback_to ? list[k]->failback_to : list[k]->cur_nic;
			if (receiving(list[k]) == rx && at && at->index >= 0 &&
			    at->index < R2CC_MAX_NICS)
				cnt[at->index]++;
		}
		for (;;) {
			int best = -1;
			for (int k = 0; k < n; k++) {
				struct r2cc_rqp *r = list[k];
				const struct r2cc_nic *at = r->cur_nic;
				if (skip[k] || receiving(r) != rx || r->failback_to ||
				    r->loopback || !at || at == nic || at->index < 0 ||
				    at->index >= R2CC_MAX_NICS || r->orig_nic == nic ||
				    load_state(r) != RQ_MIGRATED ||
				    __atomic_load_n(&r->orig_nic->state, __ATOMIC_RELAXED) ==
					R2CC_NIC_UP ||
				    cnt[at->index] - cnt[me] < 2)
					continue;
				if (best < 0 || cnt[at->index] > cnt[list[best]->cur_nic->index])
					best = k;
			}
			if (best < 0)
				break;
			skip[best] = true;
			int from = list[best]->cur_nic->index,
			    in = detect_failback(list[best], nic, why);
			if (in >= 0) {
				*inc = in;
				cnt[from]--;
				cnt[me]++;
				moved++;
			}
		}
	}
	free(skip);
	collect_done(list);
	return moved;
}

/* nic has been healthy long enough: it is up, and its QPs come back. */
static void failback_start(struct r2cc_nic *nic, int64_t t)
{
	int i = nic->index;
	fb_nic[i].last_back = t;
	fb_nic[i].weighed = false;
	fb_nic[i].healthy_since = 0;
	fb_nic[i].backs++;
	__atomic_store_n(&nic->state, R2CC_NIC_UP, __ATOMIC_SEQ_CST);
	__atomic_add_fetch(&nic->failbacks, 1, __ATOMIC_RELAXED);
	char why[96];
	snprintf(why, sizeof(why), "failback: port active, self-tests passed for %d ms",
		 r2cc_param.failback_ms);
	struct r2cc_rqp **list;
	int n = collect(&list, homed_on, nic), back = 0, inc = -1;
	for (int k = 0; k < n; k++) {
		int in = detect_failback(list[k], nic, why);
		if (in >= 0) {
			back++;
			inc = in;
		}
	}
	collect_done(list);
	int spread = r2cc_param.mode >= 2 ? failback_spread(nic, why, &inc) : 0;
	R2CC_WARN("repair: %s is back (port active, self-tests passed for %d ms): %d queue "
		  "pair(s) return to it, %d more from NICs still down; failback %d, next one no "
		  "sooner than %lld ms after this",
		  nic->name, r2cc_param.failback_ms, back, spread, fb_nic[i].backs,
		  (long long)(fb_nic[i].hold / 1000000));
	incident_event(inc,
		       "%s healthy for %d ms: %d queue pair(s) return, %d more from NICs "
		       "still down (failback %d)",
		       nic->name, r2cc_param.failback_ms, back, spread, fb_nic[i].backs);
}

/* The repair thread's round of failback: each failed NIC probed, and brought back
 * once it has stayed healthy (see fb_nic). */
static void failback_tick(int64_t t)
{
	int64_t base = (int64_t)r2cc_param.failback_ms * 1000000;
	if (!base)
		return;
	int64_t period = base / 5 < 10000000ll	   ? 10000000ll
			 : base / 5 > 1000000000ll ? 1000000000ll
						   : base / 5;
	int n = r2cc_nic_count();
	for (int i = 0; i < n && i < R2CC_STALL_MAX_NICS; i++) {
		struct r2cc_nic *nic = r2cc_nic_by_index(i);
		if (!nic || nic->index != i)
			continue;
		__typeof__(&fb_nic[0]) f = &fb_nic[i];
		if (!f->hold)
			f->hold = base;
		int64_t fa = __atomic_load_n(&st_nic[i].failure_at, __ATOMIC_RELAXED);
		if (fa > f->failed_seen) {
			f->failed_seen = fa;
			f->healthy_since = 0;
			if (f->last_back && fa > f->last_back && !f->weighed) {
				f->weighed = true;
				bool flap = fa - f->last_back < 2 * f->hold;
				int64_t h = flap ? 2 * f->hold : base;
				f->hold = h < FAILBACK_HOLD_MAX_NS ? h : FAILBACK_HOLD_MAX_NS;
				if (flap)
					R2CC_WARN(
					    "repair: %s failed again %.0f ms after its failback: "
					    "held down for %lld ms",
					    nic->name, (fa - f->last_back) / 1e6,
					    (long long)(f->hold / 1000000));
			}
		}
		if (__atomic_load_n(&nic->state, __ATOMIC_RELAXED) != R2CC_NIC_DOWN ||
		    __atomic_load_n(&f->dead, __ATOMIC_RELAXED))
			continue;
		int v = __atomic_exchange_n(&f->verdict, FB_NONE, __ATOMIC_ACQ_REL);
		if (v != FB_NONE) {
			if (v == 0 && fa < f->probe_at) {
				if (!f->healthy_since) {
					f->healthy_since = f->probe_at;
					R2CC_INFO(
					    "repair: %s: port active and self-test passed; back "
					    "once healthy for %d ms",
					    nic->name, r2cc_param.failback_ms);
				}
			} else {
				f->healthy_since = 0;
			}
			f->probe_at = 0;
		}
		if (f->probe_at)
			continue; /* its probe runs */
		if (f->healthy_since && t - f->healthy_since >= base &&
		    (!f->last_back || t - f->last_back >= f->hold)) {
			failback_start(nic, t);
			continue;
		}
		if (t < f->next_probe)
			continue;
		f->next_probe = t + period;
		struct r2cc_ctx *c = ctx_of_nic(nic);
		struct ibv_port_attr pa;
		if (!c || eng.v.query_port(c->ctx, nic->port ? nic->port : 1, &pa) != 0 ||
		    pa.state != IBV_PORT_ACTIVE) {
			f->healthy_since = 0;
			continue;
		}
		f->probe_at = t;
		if (!selftest_spawn(nic, "failback probe", false, true))
			f->probe_at = 0;
	}
}

/* As many migrations of this QP within CHURN_NS as the process has NICs (at
 * least 3): every NIC it could use keeps failing (e.g. every NIC of a node
 * black-holed); give NCCL the error instead of migrating forever. Every
 * migration had evidence of a failure (a stall alone moves nothing), and NICs
 * failing one after the other may each take a QP along once. */
static int churn_limit(void)
{
	int k = r2cc_nic_count();
	return k < 3 ? 3 : k > CHURN_RING ? CHURN_RING : k;
}

/* How long one attempt of r's transport may take before it reports an error:
 * the local ACK timeout (4.096 us << timeout) times the tries, twice over, capped. */
static int64_t attempt_ns(const struct r2cc_rqp *r)
{
	unsigned t = r->q && r->q->timeout ? r->q->timeout : 20;
	unsigned tries = (r->q && r->q->retry_cnt ? r->q->retry_cnt : 7) + 1u;
	if (t > 31)
		t = 31;
	double ns = 2.0 * 4096.0 * (double)(1u << t) * tries;
	return ns < (double)BARREN_MAX_NS ? (int64_t)ns : BARREN_MAX_NS;
}

/* A failure of r's path, once per move: was that move barren? Its path owed
 * signalled sends and completed none of them since the move, and the failure
 * came while that attempt could still be running (a QP that sat idle for an
 * hour and is moved again has not failed twice in a row). The churn window
 * alone does not bound a repair whose every path black-holes: each attempt
 * then ends at the transport timeout, which on hardware is far above
 * CHURN_NS / NICs (4.3 s x 8 tries at NCCL's default NCCL_IB_TIMEOUT of 20). */
static void barren_check(struct r2cc_rqp *r)
{
	if (!r->migrations || r->barren_seen == r->migrations || !r->cur_sh)
		return;
	r->barren_seen = r->migrations;
	uint64_t posted, retired;
	r2cc_qp_shadow_signalled(r->cur_sh, &posted, &retired);
	bool barren = posted != retired && retired == r->moved_retired &&
		      now_ns() - r->moved_at < attempt_ns(r);
	r->barren = barren ? r->barren + 1 : 0;
}

/* At a failure of r's path: the reason r's repair gives up, or NULL. */
static const char *churning(struct r2cc_rqp *r)
{
	if (r->failback_to)
		return NULL; /* a failback is no failure */
	if (r->back_path) {
		/* the returned NIC failed again: its hold-down bounds this, not the
		 * QP's churn (nor does it make the move before a barren one) */
		r->barren_seen = r->migrations;
		return NULL;
	}
	barren_check(r);
	unsigned k = (unsigned)churn_limit();
	if (r->barren >= k)
		return BARREN_WHY;
	if (r->churn < k)
		return NULL;
	int64_t oldest = r->recent[(r->churn - k) % CHURN_RING];
	return now_ns() - oldest < CHURN_NS ? CHURN_WHY : NULL;
}

/*
 * A QP connected to itself (NCCL's GPU flush QP: RDMA READs from its own NIC)
 * has no peer to ask: both ends are here. Fence, a new QP on a healthy NIC
 * connected to itself, the plan with our own count on both sides, re-post.
 */
static void migrate_loopback(struct r2cc_rqp *r)
{
	incident_event(r->incident, "qp 0x%x: failure seen (%s), loopback QP", r->qpn, r->cause);
	int rc = fence(r);
	if (rc) {
		fail(r, fence_failure(rc));
		return;
	}
	struct r2cc_nic *nic =
	    r->failback_to && nic_usable(r, r->failback_to, true) ? r->failback_to : place(r, NULL);
	if (!nic || new_path(r, nic)) {
		fail(r, nic ? "cannot create a QP on the new NIC" : "no healthy NIC left");
		return;
	}
	struct peer_path p = {
	    .qpn = r->new_qp->qp_num,
	    .lid = nic->lid,
	    .port = nic->port ? nic->port : 1,
	    .mtu = path_mtu(r, nic),
	};
	memcpy(p.gid, new_path_gid(r, nic), 16);
	snprintf(p.nic, sizeof(p.nic), "%s", nic->name);
	set_state(r, RQ_EXCHANGE);
	rc = connect_path(r, &p);
	uint64_t held = 0;
	pthread_mutex_lock(&r->mu);
	r->loopback = true;
	r->initiator = true;
	r->k_peer = r->k_local;
	r->peer_sent = 0; /* its receives are its own sends: nothing lost between */
	r->npeer_lost = 0;
	if (!r->migrations)
		snprintf(r->peer_orig_nic, sizeof(r->peer_orig_nic), "%s", r->orig_nic->name);
	pthread_mutex_unlock(&r->mu);
	if (!rc)
		rc = commit_path(r, &p, true, &held);
	if (rc) {
		fail(r, "cannot connect or re-post the loopback QP on the new NIC");
		return;
	}
	done(r, held);
}

/* A batch: the records the repair thread works on together, each marked busy
 * (NCCL's destroy of one waits) until batch_release(). */
struct batch {
	struct r2cc_rqp **r;
	int n, cap;
};

static void fail(struct r2cc_rqp *r, const char *why);

static void batch_add(struct batch *b, struct r2cc_rqp *r)
{
	if (b->n == b->cap) {
		int cap = b->cap ? 2 * b->cap : 64;
		struct r2cc_rqp **g = realloc(b->r, sizeof(*g) * (size_t)cap);
		if (!g) {
			/* Leave it queued: the next round takes it. While memory stays
			 * short that is never, and NCCL would wait forever on a QP
			 * whose errors are hidden: past a bound it gets them. */
			int64_t t = now_ns();
			if (!r->oom_since)
				r->oom_since = t;
			bool give_up = t - r->oom_since > OOM_GIVEUP_NS;
			if (give_up)
				fail(r, "out of memory for its repair");
			pthread_mutex_lock(&eng.mu);
			r->busy = false;
			if (!give_up && !r->queued) {
				r->queued = true;
				r->next_work = eng.work_head;
				eng.work_head = r;
			}
			pthread_cond_broadcast(&eng.cond);
			pthread_mutex_unlock(&eng.mu);
			return;
		}
		b->r = g;
		b->cap = cap;
	}
	r->oom_since = 0;
	b->r[b->n++] = r;
}

/* Every queued record waiting for its repair, marked busy. Under eng.mu. */
static void take_work_locked(struct batch *b)
{
	while (eng.work_head) {
		struct r2cc_rqp *r = eng.work_head;
		eng.work_head = r->next_work;
		r->queued = false;
		if (r->dead || load_state(r) != RQ_DETECTED)
			continue;
		r->busy = true;
		pthread_mutex_unlock(&eng.mu);
		batch_add(b, r);
		pthread_mutex_lock(&eng.mu);
	}
}

static void batch_release(struct batch *b)
{
	pthread_mutex_lock(&eng.mu);
	for (int i = 0; i < b->n; i++)
		if (b->r[i])
			b->r[i]->busy = false;
	pthread_cond_broadcast(&eng.cond);
	pthread_mutex_unlock(&eng.mu);
	free(b->r);
	*b = (struct batch){0};
}

/* One queue pair's checks before the fence: false when it is done with
 * (migrated alone, failed, or left to its transport). */
static bool initiate_check(struct r2cc_rqp *r)
{
	if (!eng.have_verbs) {
		fail(r, "verbs functions unavailable");
		return false;
	}
	if (r2cc_peer_ep_equal(&r->ep_local, &r->ep_remote)) {
		const char *why = churning(r);
		if (why)
			fail(r, why);
		else
			migrate_loopback(r);
		return false;
	}
	if (peer_of(r) == -ENOENT) {
		fail(r, "no control-plane peer for this QP (communicator without a directory)");
		return false;
	}
	if (r->failback_to)
		incident_event(r->incident, "qp 0x%x: returns to %s", r->qpn, r->failback_to->name);
	else
		incident_event(r->incident, "qp 0x%x: failure seen (%s)", r->qpn, r->cause);
	/* A declared NIC, or one that had failed before the QP was made: not a failure
	 * of the path the QP is on. */
	bool of_path = strncmp(r->cause, "declared", 8) && strncmp(r->cause, "created on", 10) &&
		       !r->failback_to;
	if (!of_path)
		r->barren_seen = r->migrations;
	const char *why = churning(r);
	if (why) {
		fail(r, why);
		return false;
	}
	/* A path-level symptom (the transport gave up, a stall, a port event) widens to
	 * the NIC or the path; any other error status (access, protection, a QP error
	 * event) is this QP's own: only it moves. */
	bool path_level = r->status_seen == 0 || r->status_seen == IBV_WC_RETRY_EXC_ERR ||
			  r->status_seen == IBV_WC_RNR_RETRY_EXC_ERR;
	bool path_failed = path_level && of_path;
	if (path_failed)
		left_failed(r);
	if (path_failed && strncmp(r->cause, "same ", 5))
		localise(r);
	else if (!path_level)
		incident_event(r->incident, "qp 0x%x: localised to this QP (status %d)", r->qpn,
			       r->status_seen);
	return true;
}

/* Fenced, then a new path: the REQ entry in *m. 0, or the QP failed. */
static int initiate_path(struct r2cc_rqp *r, struct rep_wire *m)
{
	r->churn_skip = false;
	struct r2cc_nic *nic = NULL, *home = r->failback_to;
	int rc =
	    path_on_healthy(r, home && nic_usable(r, home, true) ? home : NULL, NULL, NULL, &nic);
	if (rc == -ENODEV) {
		fail(r, r2cc_param.mr_mirror ? "no healthy NIC left"
					     : "R2CC_MR_MIRROR=0: queue pairs cannot migrate");
		return rc;
	}
	if (rc) {
		fail(r, "cannot create a QP on the new NIC");
		return rc;
	}
	pthread_mutex_lock(&r->mu);
	set_state(r, RQ_EXCHANGE);
	r->recv_live = r->send_live = false;
	r->initiator = true;
	pthread_mutex_lock(&eng.mu);
	r->pair_id = ((uint64_t)getpid() << 32) | ++eng.next_pair;
	pthread_mutex_unlock(&eng.mu);
	wire_fill(m, OP_REQ, r);
	wire_counts(m, r);
	wire_path(m, r);
	r->resends = 0;
	pthread_mutex_unlock(&r->mu);
	return 0;
}

static int cmp_by_peer(const void *a, const void *b)
{
	const struct r2cc_rqp *x = *(struct r2cc_rqp *const *)a, *y = *(struct r2cc_rqp *const *)b;
	if (x->dir != y->dir)
		return (uintptr_t)x->dir < (uintptr_t)y->dir ? -1 : 1;
	return (x->peer_rank > y->peer_rank) - (x->peer_rank < y->peer_rank);
}

static void handle_msg(struct inbox *in);

/* The oldest message in from the control thread, taken off the queue. Under eng.mu. */
static struct inbox *inbox_pop_locked(void)
{
	struct inbox *in = eng.in_head;
	if (in) {
		eng.in_head = in->next;
		if (!eng.in_head)
			eng.in_tail = &eng.in_head;
	}
	return in;
}

/*
 * While a batch is being initiated, the messages already in that carry no
 * REQ (REPs, GOs, NACKs, notices), in their order of arrival: the queue pairs
 * whose REP is in migrate while the next peers' paths are built. The first
 * message with a REQ, and all behind it, waits for the end of the batch (it
 * may concern a queue pair of the batch that has not asked its peer yet).
 */
static void replies_now(void)
{
	for (;;) {
		pthread_mutex_lock(&eng.mu);
		struct inbox *in = eng.in_head;
		bool req = false;
		for (int i = 0; in && i < in->n && !req; i++)
			req = in->m[i].op == OP_REQ;
		if (!in || req) {
			pthread_mutex_unlock(&eng.mu);
			return;
		}
		inbox_pop_locked();
		pthread_mutex_unlock(&eng.mu);
		handle_msg(in);
		free(in);
	}
}

/*
 * Initiator, for every queue pair the repair thread took up at once (one
 * failure puts all of a NIC's on the queue, and localising adds the rest of
 * the path's): the checks of each, then every fence at once (the drains
 * overlap), then peer process by peer process the new paths and one REQ with
 * all of that peer's queue pairs, sent before the next peer's are built, so
 * that the peers work while this side goes on; between two peers, the REPs
 * already in are handled (replies_now()), so no peer's migration waits for the
 * last peer's REQ. A queue pair whose peer is not known yet (the search was
 * hurried) sends its REQ when it is (resend_due()).
 */
static void initiate_batch(struct batch *b)
{
	/* The records still in the game; b keeps them all for the release. */
	struct batch w = {0};
	for (int checked = 0;;) {
		for (int i = checked; i < b->n; i++)
			if (initiate_check(b->r[i]))
				batch_add(&w, b->r[i]);
		checked = b->n;
		/* Localising queued the rest of the path: they join this batch. */
		pthread_mutex_lock(&eng.mu);
		take_work_locked(b);
		pthread_mutex_unlock(&eng.mu);
		if (b->n == checked)
			break;
	}
	int *frc = calloc((size_t)(w.n ? w.n : 1), sizeof(*frc));
	int n = 0;
	if (frc)
		fence_all(w.r, w.n, frc);
	for (int i = 0; i < w.n; i++) {
		int rc = frc ? frc[i] : -ENOMEM;
		if (rc)
			fail(w.r[i],
			     rc == -ENOMEM ? "out of memory for the exchange" : fence_failure(rc));
		else
			w.r[n++] = w.r[i];
	}
	free(frc);
	qsort(w.r, (size_t)n, sizeof(*w.r), cmp_by_peer);
	struct rep_wire *m = n ? malloc(sizeof(*m) * (size_t)n) : NULL;
	if (n && !m) {
		for (int i = 0; i < n; i++)
			fail(w.r[i], "out of memory for the exchange");
		n = 0;
	}
	for (int first = 0; first < n;) {
		const struct r2cc_ctl_dir *dir = w.r[first]->dir;
		int rank = w.r[first]->peer_rank, k = 0, last = first;
		while (last < n && w.r[last]->dir == dir && w.r[last]->peer_rank == rank)
			last++;
		for (int i = first; i < last; i++)
			if (initiate_path(w.r[i], &m[k]) == 0)
				w.r[first + k++] = w.r[i];
		int64_t t = now_ns();
		for (int i = first; i < first + k; i++) {
			struct r2cc_rqp *r = w.r[i];
			pthread_mutex_lock(&r->mu);
			r->batch = n;
			r->t_sent = dir ? t : 0; /* 0: waits for its peer to be found */
			r->t_deadline = t + exchange_ns(n);
			pthread_mutex_unlock(&r->mu);
			m[i - first].work = htole32((uint32_t)n);
			incident_event(r->incident, "qp 0x%x: fenced (k=%llu), new path on %s, %s",
				       r->qpn, (unsigned long long)r->k_local,
				       r->new_ctx->nic->name,
				       dir ? "asking its peer" : "its peer is being searched");
		}
		if (dir && k)
			send_entries(dir, rank, m, k);
		/* Their exchange goes on by messages now: released to them (and to
		 * NCCL's destroy) before the next peer's. */
		pthread_mutex_lock(&eng.mu);
		for (int i = first; i < first + k; i++)
			w.r[i]->busy = false;
		pthread_cond_broadcast(&eng.cond);
		pthread_mutex_unlock(&eng.mu);
		replies_now();
		first = last;
	}
	free(m);
	free(w.r);
}

/*
 * Is the peer process still there? A request its control thread does not
 * answer comes back as -ENODATA (alive); a refused or reset connection means
 * the process is gone. Asked after a few unanswered REQs, so that a dead peer
 * ends the repair at once instead of at the exchange's deadline.
 */
static bool peer_gone(const struct r2cc_ctl_dir *dir, int rank)
{
	uint8_t ping = 0;
	unsigned char reply[8];
	size_t len = sizeof(reply);
	int rc = r2cc_ctl_request(dir, rank, R2CC_REPAIR_MSG, &ping, 1, reply, &len, 300);
	return rc == -ECONNREFUSED || rc == -ECONNRESET;
}

/* A stall this side suspects: the peer's NIC may be the dead one, and only the
 * peer can test it. A notice, not a request: nothing is fenced. Sent only when
 * the peer is known already (the search is hurried otherwise). */
static void peer_suspect(struct r2cc_rqp *r)
{
	if (r->loopback || !r->q || r2cc_peer_ep_equal(&r->ep_local, &r->ep_remote) || peer_of(r))
		return;
	struct rep_wire m;
	pthread_mutex_lock(&r->mu);
	wire_fill(&m, OP_SUSPECT, r);
	const struct r2cc_ctl_dir *dir = r->dir;
	int rank = r->peer_rank;
	pthread_mutex_unlock(&r->mu);
	send_entries(dir, rank, &m, 1);
}

/* Responder, one REQ entry, before the fence: true when it is to be fenced
 * here; *serve when it is served at all. */
static bool serve_check(struct r2cc_rqp *r, const struct inbox *in, const struct rep_wire *m,
			struct outboxes *out, const struct r2cc_ctl_dir *dir, bool *serve)
{
	bool peer_nic_failed = le16toh(m->flags) & WIRE_F_SENDER_NIC_FAILED;
	bool back = le16toh(m->flags) & WIRE_F_FAILBACK;
	int s = load_state(r);
	*serve = false;
	if (s == RQ_FAILED || r->dead) {
		nack(out, dir, in->from_rank, m, -EHOSTDOWN);
		return false;
	}
	if (!connected(r))
		return false; /* still connecting: the initiator asks again */
	const char *gave_up = s != RQ_EXCHANGE && !back ? churning(r) : NULL;
	if (gave_up) {
		nack(out, dir, in->from_rank, m, -ENETUNREACH);
		fail(r, gave_up);
		return false;
	}
	if (s == RQ_EXCHANGE) {
		if (r->initiator && r->pair_id == le64toh(m->pair_id))
			return false;
		if (r->initiator && lower_id(r))
			return false; /* ours wins; the peer serves our REQ */
		if (!r->initiator && r->pair_id == le64toh(m->pair_id))
			return false; /* a re-sent REQ we already answered */
		/* Serving another exchange that has not seen its GO: the current path
		 * is live, not fenced, so this REQ waits (the initiator asks again)
		 * until that one ends. */
		if (!r->initiator)
			return false;
		/* theirs wins: drop our new path, serve theirs (already fenced) */
		pthread_mutex_lock(&r->mu);
		drop_new_path(r);
		pthread_mutex_unlock(&r->mu);
		*serve = true;
		return false;
	}
	if (s == RQ_HEALTHY || s == RQ_MIGRATED) {
		char why[64];
		if (back)
			snprintf(why, sizeof(why), "failback: peer rank %d's NIC is back",
				 in->from_rank);
		else
			snprintf(why, sizeof(why), "peer notice from rank %d%s", in->from_rank,
				 le16toh(m->flags) & WIRE_F_DECLARED
				     ? " (its NIC is declared failed)"
				     : "");
		/* The failback's is the peer's: this side returns home too, if it can. */
		r->failback_to = back ? r->orig_nic : NULL;
		pthread_mutex_lock(&eng.mu);
		note_detection(r, why, r->status_seen);
		pthread_mutex_unlock(&eng.mu);
		set_state(r, RQ_DETECTED);
	}
	incident_event(r->incident, "qp 0x%x: peer rank %d asks to migrate%s", r->qpn,
		       in->from_rank,
		       back		 ? " (failback: its NIC is back)"
		       : peer_nic_failed ? " (its own NIC failed)"
					 : "");
	/* The peer saw the failure; whether it is this side's NIC only a self-test
	 * can say (a port that is down says so itself), unless the peer knows its
	 * own NIC is the failed one. A failback is no failure. */
	if (!peer_nic_failed && !back)
		selftest_start(r->cur_nic, "the peer asks to migrate", false);
	*serve = true;
	return true;
}

/* Responder, one fenced entry: a path on its rail, connected, receives
 * re-posted; its REP (or NACK) into out. */
static void serve_path(struct r2cc_rqp *r, const struct inbox *in, const struct rep_wire *m,
		       struct outboxes *out, const struct r2cc_ctl_dir *dir)
{
	bool peer_nic_failed = le16toh(m->flags) & WIRE_F_SENDER_NIC_FAILED;
	struct peer_path p;
	path_from_wire(&p, m);
	/* The peer's own NIC failed: this side stays where NCCL put it (a fresh QP on
	 * the same NIC), so this node's NICs stay as evenly loaded as they were;
	 * following the peer's new rail instead would pile every moved QP of this
	 * node onto the NICs the peer picked. Otherwise this side's NIC is suspect
	 * too: another one, the least loaded, on the peer's rail among equals. */
	bool back = le16toh(m->flags) & WIRE_F_FAILBACK;
	if (!peer_nic_failed && !back)
		left_failed(r);
	/* A move for the peer's own NIC is not this side leaving a failing path: it
	 * does not count towards this QP's churning (the peer's QP counts it). */
	r->churn_skip = peer_nic_failed || back;
	/* A failback: this side's original NIC if it is up, else where it is. */
	struct r2cc_nic *first = NULL, *nic = NULL;
	if (back && r->failback_to && nic_usable(r, r->failback_to, true))
		first = r->failback_to;
	else if ((peer_nic_failed || r->failback_to) && nic_usable(r, r->cur_nic, true))
		first = r->cur_nic;
	int rc = path_on_healthy(r, first, p.nic, &p, &nic);
	if (rc == -ENODEV || (rc && !r->new_qp)) {
		nack(out, dir, in->from_rank, m, rc);
		fail(r,
		     rc != -ENODEV ? "cannot create a QP on the new NIC" : "no healthy NIC left");
		return;
	}
	struct rep_wire rep;
	pthread_mutex_lock(&r->mu);
	set_state(r, RQ_EXCHANGE);
	r->initiator = false;
	r->dir = dir;
	r->peer_rank = in->from_rank;
	r->pair_id = le64toh(m->pair_id);
	wire_take_counts(r, m);
	/* The initiator answers with its GO once it has been through everything
	 * it repairs, not just this message. */
	int work = (int)le32toh(m->work);
	r->batch = work > in->n ? work : in->n;
	if (!r->peer_orig_nic[0] || !r->migrations)
		snprintf(r->peer_orig_nic, sizeof(r->peer_orig_nic), "%s", m->orig_nic);
	wire_fill(&rep, OP_REP, r);
	rep.pair_id = m->pair_id;
	wire_counts(&rep, r);
	wire_path(&rep, r);
	r->t_deadline = now_ns() + exchange_ns(r->batch);
	pthread_mutex_unlock(&r->mu);
	const char *step = "connect";
	if (!rc) { /* sends wait for the initiator's GO */
		step = "re-post on";
		rc = commit_path(r, &p, false, NULL);
	}
	if (rc) {
		char why[96];
		snprintf(why, sizeof(why), "cannot %s the new path (%s)", step, strerror(-rc));
		nack(out, dir, in->from_rank, m, rc);
		fail(r, why);
		return;
	}
	struct rep_wire *e = out_add(out, dir, in->from_rank);
	if (e)
		*e = rep;
}

/* Responder, every REQ entry of one message: checks, all fences at once, the
 * paths, one message back with every REP and NACK. */
static void serve_batch(const struct inbox *in, struct r2cc_rqp **rq,
			const struct r2cc_ctl_dir *dir)
{
	struct outboxes out = {0};
	bool *serve = calloc((size_t)in->n, sizeof(*serve));
	struct r2cc_rqp **fence_list = calloc((size_t)in->n, sizeof(*fence_list));
	int *frc = calloc((size_t)in->n, sizeof(*frc));
	if (!serve || !fence_list || !frc) {
		free(serve);
		free(fence_list);
		free(frc);
		return; /* the initiator asks again */
	}
	for (int i = 0; i < in->n; i++)
		if (rq[i] && in->m[i].op == OP_REQ &&
		    serve_check(rq[i], in, &in->m[i], &out, dir, &serve[i]))
			fence_list[i] = rq[i];
	fence_all(fence_list, in->n, frc);
	for (int i = 0; i < in->n; i++) {
		int rc = frc[i];
		if (rc) {
			nack(&out, dir, in->from_rank, &in->m[i], rc);
			fail(rq[i], fence_failure(rc));
			serve[i] = false;
		}
	}
	for (int i = 0; i < in->n; i++)
		if (serve[i])
			serve_path(rq[i], in, &in->m[i], &out, dir);
	out_flush(&out);
	/* The initiator's rkeys on its new NIC, before its GO needs them: its REQ
	 * carried them. */
	struct refresh_set rs = {{0}};
	for (int i = 0; i < in->n; i++) {
		struct r2cc_rqp *r = rq[i];
		if (!serve[i] || load_state(r) != RQ_EXCHANGE || r->initiator)
			continue;
		peer_keys(&rs, in, dir, r, r->peer_cur_nic);
		incident_event(r->incident,
			       "qp 0x%x: path %s <-> %s connected, %zu receives re-posted", r->qpn,
			       r->cur_nic->name, r->peer_cur_nic, r->plan.n_recv);
	}
	r2cc_hmap_free(&rs.seen);
	free(serve);
	free(fence_list);
	free(frc);
}

/* Initiator, every REP entry of one message: connect each, the peer's keys
 * (which the message carried), re-post everything, one GO with all of them. */
static void on_rep_batch(const struct inbox *in, struct r2cc_rqp **rq,
			 const struct r2cc_ctl_dir *dir)
{
	struct outboxes out = {0};
	struct refresh_set rs = {{0}};
	struct peer_path *p = malloc(sizeof(*p) * (size_t)in->n);
	bool *ok = calloc((size_t)in->n, sizeof(*ok));
	if (!p || !ok) {
		free(p);
		free(ok);
		return; /* the deadline ends these exchanges */
	}
	for (int i = 0; i < in->n; i++) {
		struct r2cc_rqp *r = rq[i];
		const struct rep_wire *m = &in->m[i];
		if (!r || m->op != OP_REP || load_state(r) != RQ_EXCHANGE || !r->initiator ||
		    r->pair_id != le64toh(m->pair_id) || !r->new_qp)
			continue;
		path_from_wire(&p[i], m);
		int rc = connect_path(r, &p[i]);
		pthread_mutex_lock(&r->mu);
		r->dir = dir;
		r->peer_rank = in->from_rank;
		wire_take_counts(r, m);
		if (!r->migrations)
			snprintf(r->peer_orig_nic, sizeof(r->peer_orig_nic), "%s", m->orig_nic);
		pthread_mutex_unlock(&r->mu);
		if (rc) {
			char why[96];
			snprintf(why, sizeof(why), "cannot connect the new path (%s)",
				 strerror(-rc));
			fail(r, why);
			continue;
		}
		peer_keys(&rs, in, dir, r, p[i].nic);
		ok[i] = true;
	}
	for (int i = 0; i < in->n; i++) {
		if (!ok[i])
			continue;
		struct r2cc_rqp *r = rq[i];
		uint64_t held = 0;
		int rc = commit_path(r, &p[i], true, &held);
		if (rc) {
			char why[96];
			snprintf(why, sizeof(why), "cannot re-post on the new path (%s)",
				 strerror(-rc));
			fail(r, why);
			continue;
		}
		struct rep_wire *e = out_add(&out, dir, in->from_rank);
		if (e)
			wire_fill(e, OP_GO, r);
		done(r, held);
	}
	out_flush(&out);
	r2cc_hmap_free(&rs.seen);
	free(p);
	free(ok);
}

/* Responder, every GO entry of one message: re-post the sends. */
static void on_go_batch(const struct inbox *in, struct r2cc_rqp **rq)
{
	for (int i = 0; i < in->n; i++) {
		struct r2cc_rqp *r = rq[i];
		const struct rep_wire *m = &in->m[i];
		if (!r || m->op != OP_GO || load_state(r) != RQ_EXCHANGE || r->initiator ||
		    r->pair_id != le64toh(m->pair_id))
			continue;
		uint64_t held = 0;
		pthread_mutex_lock(&r->mu);
		int rc = post_plan_sends(r, &held);
		if (!rc)
			set_state(r, RQ_MIGRATED);
		pthread_mutex_unlock(&r->mu);
		if (rc) {
			fail(r, "cannot re-post on the new path");
			continue;
		}
		done(r, held);
	}
}

/* Stalls the peer suspects on these QPs: this side's NIC is tested. */
static void on_suspects(const struct inbox *in, struct r2cc_rqp **rq)
{
	for (int i = 0; i < in->n; i++) {
		struct r2cc_rqp *r = rq[i];
		if (!r || in->m[i].op != OP_SUSPECT)
			continue;
		int st = load_state(r);
		if (st == RQ_HEALTHY || st == RQ_MIGRATED) {
			char why[64];
			snprintf(why, sizeof(why), "rank %d suspects the path", in->from_rank);
			selftest_start(r->cur_nic, why, true);
		}
	}
}

static void on_nacks(const struct inbox *in, struct r2cc_rqp **rq)
{
	for (int i = 0; i < in->n; i++) {
		struct r2cc_rqp *r = rq[i];
		const struct rep_wire *m = &in->m[i];
		if (r && m->op == OP_NACK && load_state(r) == RQ_EXCHANGE && r->initiator &&
		    r->pair_id == le64toh(m->pair_id)) {
			char why[128];
			snprintf(why, sizeof(why), "the peer cannot repair its side (%s)",
				 strerror(-(int32_t)le32toh((uint32_t)m->status)));
			fail(r, why);
		}
	}
}

/* One message from one peer: every entry's queue pair found (exactly: both
 * ends), then each kind of entry handled together. */
static void handle_msg(struct inbox *in)
{
	const struct r2cc_ctl_dir *dir = dir_of_job(in->job_id, in->from_rank);
	if (!dir)
		return;
	maps_store(in, dir);
	struct r2cc_rqp **rq = calloc((size_t)in->n, sizeof(*rq));
	if (!rq)
		return;
	bool ops[OP_SUSPECT + 1] = {false};
	pthread_mutex_lock(&eng.mu);
	for (int i = 0; i < in->n; i++) {
		struct r2cc_rqp *r = rqp_of_msg(&in->m[i]);
		/* Not ours, not connected yet (the initiator asks again), or twice in
		 * one message (the first counts). */
		if (!r || r->busy)
			continue;
		r->busy = true;
		rq[i] = r;
		ops[in->m[i].op] = true;
	}
	pthread_mutex_unlock(&eng.mu);
	if (ops[OP_REQ])
		serve_batch(in, rq, dir);
	if (ops[OP_REP])
		on_rep_batch(in, rq, dir);
	if (ops[OP_GO])
		on_go_batch(in, rq);
	if (ops[OP_NACK])
		on_nacks(in, rq);
	if (ops[OP_SUSPECT])
		on_suspects(in, rq);
	pthread_mutex_lock(&eng.mu);
	for (int i = 0; i < in->n; i++)
		if (rq[i])
			rq[i]->busy = false;
	pthread_cond_broadcast(&eng.cond);
	pthread_mutex_unlock(&eng.mu);
	free(rq);
}

static bool resend_due(const struct r2cc_rqp *r, int64_t t)
{
	if (!r->initiator || r->recv_live)
		return false;
	if (!r->t_sent)
		return true; /* its peer may be known now */
	return t - r->t_sent > RESEND_NS + (int64_t)r->batch * RESEND_PER_QP_NS;
}

/*
 * Exchanges in flight, from the repair thread's idle loop: those past their
 * deadline fail; initiators still unanswered (or whose peer has just been
 * found) send their REQ again, one message per peer; a peer that stays silent
 * for three REQs is asked whether it is alive at all.
 */
static void exchanges_tick(int64_t t)
{
	struct batch late = {0}, again = {0};
	pthread_mutex_lock(&eng.mu);
	for (struct r2cc_rqp *r = eng.all; r; r = r->next_all) {
		if (r->dead || r->busy || load_state(r) != RQ_EXCHANGE)
			continue;
		if (t > r->t_deadline || resend_due(r, t)) {
			r->busy = true;
			pthread_mutex_unlock(&eng.mu);
			batch_add(t > r->t_deadline ? &late : &again, r);
			pthread_mutex_lock(&eng.mu);
		}
	}
	pthread_mutex_unlock(&eng.mu);
	for (int i = 0; i < late.n; i++) {
		struct r2cc_rqp *r = late.r[i];
		fail(r, r->initiator && !r->t_sent
			    ? "the peer process was not found in time"
			    : "the peer did not finish the exchange in time");
	}
	/* Those whose peer is known; the others wait for the search. */
	struct r2cc_rqp **w = again.n ? malloc(sizeof(*w) * (size_t)again.n) : NULL;
	int n = 0;
	for (int i = 0; w && i < again.n; i++) {
		struct r2cc_rqp *r = again.r[i];
		if (r->t_sent || peer_of(r) == 0)
			w[n++] = r;
	}
	if (w)
		qsort(w, (size_t)n, sizeof(*w), cmp_by_peer);
	struct rep_wire *m = n ? malloc(sizeof(*m) * (size_t)n) : NULL;
	for (int first = 0; m && first < n;) {
		const struct r2cc_ctl_dir *dir = w[first]->dir;
		int rank = w[first]->peer_rank, last = first, k = 0;
		bool asked = false, gone = false;
		while (last < n && w[last]->dir == dir && w[last]->peer_rank == rank)
			last++;
		for (int i = first; i < last; i++) {
			struct r2cc_rqp *r = w[i];
			if (r->t_sent && ++r->resends >= 3 && !asked) {
				asked = true;
				gone = peer_gone(dir, rank);
			}
			if (gone) {
				fail(r, "the peer process is gone (its control plane refuses "
					"connections)");
				continue;
			}
			pthread_mutex_lock(&r->mu);
			wire_fill(&m[k], OP_REQ, r);
			wire_counts(&m[k], r);
			m[k].work = htole32((uint32_t)r->batch);
			wire_path(&m[k], r);
			r->t_sent = now_ns();
			pthread_mutex_unlock(&r->mu);
			k++;
		}
		if (k)
			send_entries(dir, rank, m, k);
		first = last;
	}
	free(m);
	free(w);
	batch_release(&late);
	batch_release(&again);
}

/* repair/peer.c found a queue pair's peer: a REQ may wait for it. */
static void peer_found(void *cookie)
{
	(void)cookie;
	pthread_mutex_lock(&eng.mu);
	pthread_cond_signal(&eng.cond);
	pthread_mutex_unlock(&eng.mu);
}

/* --- stall scan ------------------------------------------------------------------------ */

static int64_t stall_floor(void)
{
	return r2cc_param.stall_ms > 0 ? (int64_t)r2cc_param.stall_ms * 1000000
				       : R2CC_STALL_FLOOR_NS;
}

/* A signalled zero-byte write behind trailing unsignalled ones: their fate shows
 * in its completion. Repair thread; the provider serialises it with NCCL's posts. */
static void probe(struct r2cc_rqp *r, int64_t t, uint64_t posted_now)
{
	struct ibv_send_wr w = {.wr_id = R2CC_PROBE_WRID,
				.opcode = IBV_WR_RDMA_WRITE,
				.send_flags = IBV_SEND_SIGNALED},
			   *bad;
	pthread_mutex_lock(&r->mu);
	int s = load_state(r);
	if ((s == RQ_HEALTHY || s == RQ_MIGRATED) && !r->dead) {
		__atomic_store_n(&r->probe_done, 0, __ATOMIC_RELEASE);
		if (r->cur_ctx->post_send(r->cur_qp, &w, &bad) == 0)
			r->probe_at = t;
		r->probed = posted_now;
	}
	pthread_mutex_unlock(&r->mu);
}

/* The load model (repair/stall.h): every live QP's queued bytes and what it
 * retired since the last scan, on the NIC it uses now. Under eng.mu. */
static void account(int64_t t)
{
	r2cc_stall_scan_begin();
	for (struct r2cc_rqp *r = eng.all; r; r = r->next_all) {
		int s = load_state(r);
		if (r->dead || !r->cur_sh ||
		    (s != RQ_HEALTHY && s != RQ_MIGRATED && s != RQ_DETECTED))
			continue;
		uint64_t posted, retired, sig_posted, sig_retired;
		uint32_t big;
		r2cc_qp_shadow_bytes(r->cur_sh, &posted, &retired, &big);
		r2cc_qp_shadow_signalled(r->cur_sh, &sig_posted, &sig_retired);
		if (r->acct_sh != r->cur_sh || retired < r->acct_retired) {
			r->acct_sh = r->cur_sh;
			r->acct_retired = retired;
		}
		/* Queued is what a completion is still owed for: trailing unsignalled
		 * requests (NCCL's clear-to-send writes) retire only with a later
		 * signalled one, and most of them left the NIC long ago. */
		bool owed = sig_posted != sig_retired;
		r2cc_stall_account(r->cur_nic, owed && posted > retired ? posted - retired : 0,
				   retired - r->acct_retired, big);
		r->acct_retired = retired;
	}
	r2cc_stall_scan_end(t);
}

static void peer_suspect(struct r2cc_rqp *r);

/*
 * A wait the queue does not explain: suspected, never acted on by itself. The
 * NIC's self-test (and, through the peer's notice, the peer NIC's) decides; only a
 * failed self-test moves anything. The wait is suspected again after a growing
 * back-off while it lasts. Repair thread, without eng.mu.
 */
static void suspect(struct r2cc_rqp *r, int64_t waited, int64_t explained)
{
	static unsigned long logged;
	if (__atomic_fetch_add(&logged, 1, __ATOMIC_RELAXED) < 32)
		R2CC_INFO(
		    "repair: qp 0x%x on %s: no completion for %lld ms, while %.1f MB queued on "
		    "the NIC at %.0f MB/s explain %lld ms; confirming",
		    r->qpn, r->cur_nic->name, (long long)(waited / 1000000),
		    (double)r->wait_ahead / 1e6, r2cc_stall_rate(r->cur_nic) / 1e6,
		    (long long)(explained / 1000000));
	__atomic_add_fetch(&eng.stalls_suspected, 1, __ATOMIC_RELAXED);
	char why[128];
	snprintf(why, sizeof(why), "qp 0x%x waited %lld ms", r->qpn, (long long)(waited / 1000000));
	selftest_start(r->cur_nic, why, true);
	peer_suspect(r);
}

/*
 * Stall scan, every SCAN_NS. A QP whose oldest signalled request (NCCL's, or
 * R2CC's probe) has waited longer than what the node had queued ahead of it on
 * its NIC explains at the NIC's drain rate (repair/stall.h) is suspected; when no
 * other path of this process completed work after it last did, only once it waited
 * one stall floor longer (the process may not be polling at all, or the only work
 * left waits on the dead path: a ring behind one black hole). When every NIC of
 * this process that has work (two or more) waits at once, that is the whole node slowing down
 * (congestion, or this process not getting a CPU), not a failure: nothing is
 * suspected. Under eng.mu.
 */
static void scan(int64_t t)
{
	account(t);
	int64_t floor = stall_floor();
	bool busy[R2CC_STALL_MAX_NICS] = {false}, hit[R2CC_STALL_MAX_NICS] = {false};
	struct r2cc_rqp *sus[16];
	int64_t sus_wait[16], sus_expl[16];
	int nsus = 0;
	for (struct r2cc_rqp *r = eng.all; r; r = r->next_all) {
		int s = load_state(r);
		if (r->dead || (s != RQ_HEALTHY && s != RQ_MIGRATED) || !r->cur_sh)
			continue;
		uint64_t posted, retired;
		r2cc_qp_shadow_signalled(r->cur_sh, &posted, &retired);
		struct r2cc_qp_shadow_stats st;
		r2cc_qp_shadow_get_stats(r->cur_sh, &st);
		if (r->probe_at && __atomic_load_n(&r->probe_done, __ATOMIC_ACQUIRE)) {
			r->probe_at = 0;
			eng.last_progress = t;
		}
		bool waiting = posted != retired || r->probe_at;
		int ni = r->cur_nic->index;
		if (waiting && ni >= 0 && ni < R2CC_STALL_MAX_NICS)
			busy[ni] = true;
		if (!waiting || retired != r->scan_retired || !r->scan_progress) {
			if (retired != r->scan_retired && r->scan_progress)
				eng.last_progress = t;
			r->scan_retired = retired;
			r->scan_progress = t;
			r->wait_ahead = r2cc_stall_queued(r->cur_nic);
			r->suspect_after = 0;
			/* Trailing unsignalled requests, nothing posted for a while, not
			 * probed since: probe them. */
			if (st.send_posted != r->scan_posted) {
				r->scan_posted = st.send_posted;
				r->scan_idle = t;
			} else if (!waiting && r2cc_qp_shadow_send_outstanding(r->cur_sh) &&
				   r2cc_qp_shadow_recv_outstanding(r->cur_sh) &&
				   r->probed != st.send_posted &&
				   t - r->scan_idle > PROBE_IDLE_NS) {
				/* Only where the application waits for this peer (a
				 * receive outstanding here: it polls this CQ, so the
				 * probe's completion will be seen). */
				pthread_mutex_unlock(&eng.mu);
				probe(r, t, st.send_posted);
				pthread_mutex_lock(&eng.mu);
				r->scan_progress = t;
			}
			continue;
		}
		/* What was queued ahead of this request: at least what the node
		 * had queued on the NIC when the wait began, or since. */
		uint64_t q = r2cc_stall_queued(r->cur_nic);
		if (q > r->wait_ahead)
			r->wait_ahead = q;
		int64_t waited = t - r->scan_progress;
		int64_t explained = r2cc_stall_explained_ns(r->cur_nic, r->wait_ahead, floor);
		/* Nothing else progressed since the wait began: the process may not be
		 * polling, or only dead paths have work left (a ring waits on one
		 * black-holed path). Suspected after one floor more; the self-test,
		 * which polls its own queues, tells the two apart. */
		bool alone = eng.last_progress <= r->scan_progress;
		if (waited <= explained + r->suspect_after + (alone ? floor : 0))
			continue;
		r->suspect_after = r->suspect_after ? 2 * r->suspect_after : SUSPECT_AGAIN_NS;
		if (r->suspect_after > SUSPECT_MAX_NS)
			r->suspect_after = SUSPECT_MAX_NS;
		if (ni >= 0 && ni < R2CC_STALL_MAX_NICS)
			hit[ni] = true;
		if (nsus < (int)(sizeof(sus) / sizeof(sus[0]))) {
			sus_wait[nsus] = waited;
			sus_expl[nsus] = explained;
			sus[nsus++] = r;
		}
	}
	if (!nsus)
		return;
	bool all = true;
	int nbusy = 0;
	for (int i = 0; i < R2CC_STALL_MAX_NICS; i++) {
		nbusy += busy[i];
		all = all && (!busy[i] || hit[i]);
	}
	if (all && nbusy > 1) {
		static unsigned long logged;
		if (__atomic_fetch_add(&logged, 1, __ATOMIC_RELAXED) < 8)
			R2CC_INFO(
			    "repair: every NIC with work waits longer than its queue explains: "
			    "the node is slow (congestion or CPU), not failed; nothing moves");
		__atomic_add_fetch(&eng.stalls_node_wide, 1, __ATOMIC_RELAXED);
		return;
	}
	pthread_mutex_unlock(&eng.mu);
	for (int i = 0; i < nsus; i++)
		suspect(sus[i], sus_wait[i], sus_expl[i]);
	pthread_mutex_lock(&eng.mu);
}

#define KEYS_TRIES 3 /* fetches of a map that fail in a row before the QP's error */

/* Whether a held send's rkey is still not in the cache. Under r->mu. */
static bool held_keys_missing(struct r2cc_rqp *r)
{
	for (const struct held_send *h = r->hs_head; h; h = h->next) {
		const struct ibv_send_wr *w = &h->wr;
		uint64_t bytes;
		uint32_t k;
		if (carries_rkey(w, &bytes) &&
		    xlate_rkey(r, w->wr.rdma.rkey, w->wr.rdma.remote_addr, bytes, &k) == -EAGAIN)
			return true;
	}
	return false;
}

/*
 * The QPs whose sends wait for their peer's rkey map (keys_need): the map fetched
 * (the network round trip, here and without any lock NCCL takes), then the held
 * sends posted. A key still missing from a map just fetched is not the peer's, and
 * a map that cannot be fetched KEYS_TRIES times in a row (2 s each) gives up: the
 * QP's clean error either way. Repair thread, without eng.mu.
 */
static void keys_tick(void)
{
	if (!__atomic_exchange_n(&eng.keys_due, 0, __ATOMIC_ACQ_REL))
		return;
	struct r2cc_rqp *list[64];
	int n = 0;
	bool more = false;
	pthread_mutex_lock(&eng.mu);
	for (struct r2cc_rqp *r = eng.all; r; r = r->next_all) {
		if (r->dead || r->busy ||
		    !(__atomic_load_n(&r->keys_wait, __ATOMIC_RELAXED) ||
		      __atomic_load_n(&r->flush_err, __ATOMIC_RELAXED)))
			continue;
		if (n == (int)(sizeof(list) / sizeof(list[0]))) {
			more = true;
			break;
		}
		r->busy = true;
		list[n++] = r;
	}
	pthread_mutex_unlock(&eng.mu);
	for (int i = 0; i < n; i++) {
		struct r2cc_rqp *r = list[i];
		char from[R2CC_NIC_NAME_MAX], to[R2CC_NIC_NAME_MAX];
		pthread_mutex_lock(&r->mu);
		snprintf(from, sizeof(from), "%s", r->peer_orig_nic);
		snprintf(to, sizeof(to), "%s", r->peer_cur_nic);
		pthread_mutex_unlock(&r->mu);
		int rc = __atomic_exchange_n(&r->flush_err, 0, __ATOMIC_RELAXED);
		int frc = rc ? 0
			  : r->dir
			      ? r2cc_mr_mirror_remote_refresh(r->dir, r->peer_rank, from, to, 2000)
			      : -ENOENT;
		pthread_mutex_lock(&r->mu);
		int s = load_state(r);
		uint64_t posted = 0;
		/* (in another repair now: its commit posts them, or asks again) */
		bool flush = !rc && r->keys_wait &&
			     (s == RQ_MIGRATED || (s == RQ_EXCHANGE && r->send_live)),
		     still = false;
		if (flush && !held_keys_missing(r)) {
			/* NCCL's thread posts them (app_flush_need), or here if it
			 * cannot be asked to */
			__atomic_store_n(&r->keys_wait, false, __ATOMIC_RELAXED);
			if (!app_flush_need(r)) {
				rc = flush_held_sends(r, &posted);
				__atomic_add_fetch(&eng.reposts_repair, posted, __ATOMIC_RELAXED);
			}
			still = r->keys_wait;
		} else if (flush) {
			still = true;
		}
		r->keys_tries = still && frc ? r->keys_tries + 1 : 0;
		bool give_up = rc || (still && (!frc || r->keys_tries >= KEYS_TRIES));
		if (still && !give_up)
			__atomic_store_n(&eng.keys_due, 1, __ATOMIC_RELEASE); /* again next tick */
		pthread_mutex_unlock(&r->mu);
		pthread_mutex_lock(&eng.mu);
		if (r->incident >= 0 && r->incident < eng.ninc) { /* the repair that moved it */
			eng.inc[r->incident].maps_later += frc == 0;
			eng.inc[r->incident].held += posted;
		}
		pthread_mutex_unlock(&eng.mu);
		if (give_up) {
			char why[160];
			if (rc)
				snprintf(why, sizeof(why), "a held send could not be posted (%s)",
					 strerror(rc < 0 ? -rc : rc));
			else if (!frc)
				snprintf(why, sizeof(why),
					 "a send's rkey is not registered by rank %d on %s",
					 r->peer_rank, from);
			else
				snprintf(why, sizeof(why), "rank %d's rkey map %s -> %s: %s",
					 r->peer_rank, from, to, strerror(-frc));
			R2CC_WARN("repair: qp 0x%x: %s; NCCL gets its error", r->qpn, why);
			fail(r, why);
		}
	}
	pthread_mutex_lock(&eng.mu);
	for (int i = 0; i < n; i++)
		list[i]->busy = false;
	pthread_cond_broadcast(&eng.cond);
	pthread_mutex_unlock(&eng.mu);
	if (more)
		__atomic_store_n(&eng.keys_due, 1, __ATOMIC_RELEASE);
}

static void *repair_main(void *arg)
{
	(void)arg;
	int64_t next_scan = now_ns() + SCAN_NS;
	pthread_mutex_lock(&eng.mu);
	while (!__atomic_load_n(&eng.stop, __ATOMIC_ACQUIRE)) {
		/* The scan runs between pieces of work too: the load model the
		 * self-tests judge by must stay current during a repair. */
		int64_t t0 = now_ns();
		if (t0 >= next_scan) {
			scan(t0);
			next_scan = t0 + SCAN_NS;
		}
		if (__atomic_load_n(&eng.keys_due, __ATOMIC_ACQUIRE)) {
			pthread_mutex_unlock(&eng.mu);
			keys_tick();
			pthread_mutex_lock(&eng.mu);
		}
		if (t0 >= eng.next_failback) {
			eng.next_failback = t0 + SCAN_NS;
			pthread_mutex_unlock(&eng.mu);
			failback_tick(t0);
			pthread_mutex_lock(&eng.mu);
		}
		if (!eng.work_head && !eng.in_head) {
			int64_t t = now_ns();
			if (t - eng.last_dir_sweep > DIR_SWEEP_NS) {
				dirs_sweep_locked();
				eng.last_dir_sweep = t;
			}
			if (t - eng.last_record_sweep > RECORD_SWEEP_NS) {
				records_sweep_locked();
				eng.last_record_sweep = t;
			}
			/* deadlines and re-sends of exchanges in flight */
			pthread_mutex_unlock(&eng.mu);
			exchanges_tick(t);
			pthread_mutex_lock(&eng.mu);
			if (eng.work_head || eng.in_head)
				continue;
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += SCAN_NS;
			if (ts.tv_nsec >= 1000000000L) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000L;
			}
			pthread_cond_timedwait(&eng.cond, &eng.mu, &ts);
			continue;
		}
		if (eng.in_head) {
			struct inbox *in = inbox_pop_locked();
			pthread_mutex_unlock(&eng.mu);
			handle_msg(in);
			free(in);
			pthread_mutex_lock(&eng.mu);
			continue;
		}
		/* Everything detected so far, repaired together. */
		struct batch b = {0};
		take_work_locked(&b);
		pthread_mutex_unlock(&eng.mu);
		initiate_batch(&b);
		batch_release(&b);
		pthread_mutex_lock(&eng.mu);
	}
	pthread_mutex_unlock(&eng.mu);
	__atomic_store_n(&eng.running, false, __ATOMIC_RELEASE);
	return NULL;
}

/* --- declared failures ---------------------------------------------------------------- */

/*
 * R2CC_FAILED_NODE / R2CC_FAILED_HCA name NICs of this node: they are marked, and
 * every QP on them moves as after a failure (R2CC-Balance placement from the start).
 */
static void declared_move(struct r2cc_rqp *r);

/* Mark this node's declared NICs (the node index is known once a directory came;
 * NCCL may open NICs later, so this runs again when a QP gets ready). */
static bool declared_mark(void)
{
	pthread_mutex_lock(&eng.mu);
	int node = eng.node_index;
	bool any = eng.declared.nentries > 0;
	pthread_mutex_unlock(&eng.mu);
	if (!any || node < 0)
		return false;
	char key[R2CC_CTL_NODE_KEY_MAX];
	r2cc_node_key(key, sizeof(key));
	return r2cc_nic_mark_declared(&eng.declared, node, key) > 0;
}

static bool declared_fresh(const struct r2cc_rqp *r, const void *arg)
{
	(void)arg;
	return r->q && r->q->state == IBV_QPS_RTS && !r->declared_pending &&
	       load_state(r) == RQ_HEALTHY &&
	       __atomic_load_n(&r->cur_nic->state, __ATOMIC_RELAXED) == R2CC_NIC_DECLARED;
}

/* The first directory: QPs connected before it was known move now. */
static void declared_apply(void)
{
	if (!declared_mark())
		return;
	struct r2cc_rqp **list;
	int n = collect(&list, declared_fresh, NULL);
	for (int i = 0; i < n; i++)
		declared_move(list[i]);
	collect_done(list);
}

/*
 * A QP on a declared-failed NIC moves before it carries anything. Its direction
 * (what Balance evens out per NIC) shows in NCCL's first post, so until then the
 * QP's posts take the slow path, which moves it at that first post. A QP that
 * already carried work moves at once.
 */
static void declared_move(struct r2cc_rqp *r)
{
	pthread_mutex_lock(&r->mu);
	bool fresh = r->q && !r->q->tx_wrs && !r->q->rx_wrs && load_state(r) == RQ_HEALTHY;
	if (fresh) {
		r->declared_pending = true;
		gate_close(&r->q->gate);
	}
	pthread_mutex_unlock(&r->mu);
	if (!fresh)
		detect(r, "declared failed (R2CC_FAILED_NODE/R2CC_FAILED_HCA)", 0);
}

void r2cc_repair_qp_ready(struct r2cc_qp *q)
{
	if (!q->rep)
		return;
	/* Its peer's process is searched from now on (loopback QPs have none). */
	struct r2cc_rqp *r = q->rep;
	if (!r->tracked) {
		r2cc_peer_ep_local(q, &r->ep_local);
		r2cc_peer_ep_remote(q, &r->ep_remote);
		r->tracked = !r2cc_peer_ep_equal(&r->ep_local, &r->ep_remote) &&
			     r2cc_peer_track_qp(q, r) == 0;
	}
	__atomic_store_n(&r->ready, true, __ATOMIC_SEQ_CST);
	selftest_calibrate(q->ctx->nic);
	declared_mark();
	int st = __atomic_load_n(&q->ctx->nic->state, __ATOMIC_SEQ_CST);
	if (st == R2CC_NIC_DECLARED && !q->rep->declared_pending)
		declared_move(q->rep);
	else if (st == R2CC_NIC_DOWN)
		detect(q->rep, "created on a NIC that has failed", 0);
}

/* --- async events ------------------------------------------------------------------- */

static void nic_failed(struct r2cc_nic *nic, const char *why)
{
	nic_failure_seen(nic);
	if (__atomic_load_n(&nic->state, __ATOMIC_RELAXED) == R2CC_NIC_UP)
		R2CC_WARN("repair: %s: %s; migrating its queue pairs", nic->name, why);
	__atomic_store_n(&nic->state, R2CC_NIC_DOWN, __ATOMIC_SEQ_CST);
	struct r2cc_rqp **list;
	int n = collect(&list, on_nic, nic);
	for (int i = 0; i < n; i++)
		detect_on(list[i], nic, why, IBV_WC_RETRY_EXC_ERR);
	collect_done(list);
}

bool r2cc_repair_async_event(struct ibv_context *ctx, struct ibv_async_event *ev)
{
	if (!r2cc_repair_enabled())
		return false;
	struct r2cc_ctx *c = r2cc_ctx_find(ctx);
	switch (ev->event_type) {
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_DEVICE_FATAL:
		if (!c)
			return false;
		if (ev->event_type == IBV_EVENT_DEVICE_FATAL)
			failback_never(c->nic);
		nic_failed(c->nic, ev->event_type == IBV_EVENT_PORT_ERR ? "port error event"
									: "device fatal event");
		break;
	case IBV_EVENT_PORT_ACTIVE:
		/* With failback the repair thread probes it and brings it back;
		 * without, it serves new placements from now on. */
		if (c && __atomic_load_n(&c->nic->state, __ATOMIC_RELAXED) == R2CC_NIC_DOWN) {
			R2CC_INFO("repair: %s: port active again; %s", c->nic->name,
				  r2cc_param.failback_ms ? "failback once its self-tests pass"
							 : "usable for new placements");
			if (!r2cc_param.failback_ms)
				__atomic_store_n(&c->nic->state, R2CC_NIC_UP, __ATOMIC_RELAXED);
		}
		return false;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED: {
		struct ibv_qp *qp = ev->element.qp;
		if (own_has(qp))
			break; /* ours: the failure shows in its completions */
		struct r2cc_qp *q = r2cc_qp_find(qp);
		if (!q || !q->rep || load_state(q->rep) == RQ_FAILED)
			return false;
		if (ev->event_type == IBV_EVENT_QP_FATAL ||
		    ev->event_type == IBV_EVENT_QP_REQ_ERR ||
		    ev->event_type == IBV_EVENT_QP_ACCESS_ERR)
			detect(q->rep, "QP error event", IBV_WC_GENERAL_ERR);
		break;
	}
	case IBV_EVENT_CQ_ERR:
		if (!own_has(ev->element.cq))
			return false;
		break;
	default:
		return false;
	}
	if (eng.v.ack_async_event)
		eng.v.ack_async_event(ev);
	return true;
}

/* --- report --------------------------------------------------------------------------- */

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fputc('\\', f);
		if ((unsigned char)*s >= 0x20)
			fputc(*s, f);
	}
	fputc('"', f);
}

/* The stall scan's suspicions and how their confirmations ended. */
static void report_stalls(FILE *text, FILE *json)
{
	pthread_mutex_lock(&eng.mu);
	uint64_t recs = eng.records, freed = eng.records_freed;
	pthread_mutex_unlock(&eng.mu);
	uint64_t v[7] = {
	    __atomic_load_n(&eng.stalls_suspected, __ATOMIC_RELAXED),
	    __atomic_load_n(&eng.stalls_node_wide, __ATOMIC_RELAXED),
	    __atomic_load_n(&eng.selftests_passed, __ATOMIC_RELAXED),
	    __atomic_load_n(&eng.selftests_failed, __ATOMIC_RELAXED),
	    __atomic_load_n(&eng.selftests_inconclusive, __ATOMIC_RELAXED),
	    __atomic_load_n(&eng.reposts_nccl, __ATOMIC_RELAXED),
	    __atomic_load_n(&eng.reposts_repair, __ATOMIC_RELAXED),
	};
	if (text)
		fprintf(
		    text,
		    "stall scan: %llu suspected, %llu node-wide slowdowns ignored; self-tests "
		    "%llu passed, %llu failed, %llu inconclusive\n"
		    "sends posted on moved paths: %llu by NCCL's threads, %llu by the repair "
		    "thread\n"
		    "queue pair records: %llu held, %llu of destroyed QPs freed\n",
		    (unsigned long long)v[0], (unsigned long long)v[1], (unsigned long long)v[2],
		    (unsigned long long)v[3], (unsigned long long)v[4], (unsigned long long)v[5],
		    (unsigned long long)v[6], (unsigned long long)recs, (unsigned long long)freed);
	if (json)
		fprintf(
		    json,
		    "{\"suspected\":%llu,\"node_wide\":%llu,\"selftests_passed\":%llu,"
		    "\"selftests_failed\":%llu,\"selftests_inconclusive\":%llu,"
		    "\"reposts_nccl_thread\":%llu,\"reposts_repair_thread\":%llu,"
		    "\"qp_records\":%llu,\"qp_records_freed\":%llu}",
		    (unsigned long long)v[0], (unsigned long long)v[1], (unsigned long long)v[2],
		    (unsigned long long)v[3], (unsigned long long)v[4], (unsigned long long)v[5],
		    (unsigned long long)v[6], (unsigned long long)recs, (unsigned long long)freed);
}

void r2cc_repair_report(FILE *text, FILE *json)
{
	/* Wall-clock times too, for tools that injected the fault and only know
	 * the wall clock (scripts/drill). */
	struct timespec rt;
	clock_gettime(CLOCK_REALTIME, &rt);
	double mono_to_unix = (double)rt.tv_sec + rt.tv_nsec / 1e9 - now_ns() / 1e9;
	pthread_mutex_lock(&eng.mu);
	int n = eng.ninc;
	if (text) {
		if (!n)
			fprintf(text, "incidents: none\n");
		for (int i = 0; i < n; i++) {
			const struct incident *in = &eng.inc[i];
			double mig = in->t_done ? (in->t_done - in->t_detect) / 1e6 : -1;
			fprintf(text,
				"incident %d: %s, %s%s%s: %s=%lld qps=%d migrated=%d failed=%d "
				"%s=%.3f bytes_reposted=%llu bytes_saved=%llu "
				"completions_synthesised=%llu posts_held=%llu peer_maps_carried=%d "
				"peer_maps_fetched=%d peer_maps_later=%d\n",
				i + 1, in->nic, in->declared ? "[declared] " : "",
				in->failback ? "[failback] " : "", in->evidence,
				in->failback ? "started_ns" : "detected_ns",
				(long long)in->t_detect, in->qps, in->migrated, in->failed,
				in->failback ? "failback_ms" : "migrate_ms", mig,
				(unsigned long long)in->bytes_reposted,
				(unsigned long long)in->bytes_saved, (unsigned long long)in->synth,
				(unsigned long long)in->held, in->maps_carried, in->maps_fetched,
				in->maps_later);
			for (int e = 0; e < in->nevents; e++)
				fprintf(text, "  +%.3f ms %s\n", (in->ev[e].t - in->t_detect) / 1e6,
					in->ev[e].text);
		}
	}
	if (json) {
		for (int i = 0; i < n; i++) {
			const struct incident *in = &eng.inc[i];
			fprintf(json, "%s{\"nic\":", i ? "," : "");
			json_str(json, in->nic);
			fprintf(json, ",\"declared\":%s,\"failback\":%s,\"evidence\":",
				in->declared ? "true" : "false", in->failback ? "true" : "false");
			json_str(json, in->evidence);
			/* a failback is no detection: its start and time have keys of
			 * their own */
			const char *k0 = in->failback ? "started" : "detected";
			fprintf(json,
				",\"%s_ns\":%lld,\"%s_unix\":%.6f,\"qps\":%d,"
				"\"migrated\":%d,\"failed\":%d",
				k0, (long long)in->t_detect, k0, in->t_detect / 1e9 + mono_to_unix,
				in->qps, in->migrated, in->failed);
			if (in->t_done)
				fprintf(json, ",\"%s\":%.3f,\"done_unix\":%.6f",
					in->failback ? "failback_ms" : "migrate_ms",
					(in->t_done - in->t_detect) / 1e6,
					in->t_done / 1e9 + mono_to_unix);
			fprintf(json,
				",\"bytes_reposted\":%llu,\"bytes_saved\":%llu,"
				"\"completions_synthesised\":%llu,\"posts_held\":%llu,"
				"\"peer_maps_carried\":%d,\"peer_maps_fetched\":%d,"
				"\"peer_maps_later\":%d,\"timeline\":[",
				(unsigned long long)in->bytes_reposted,
				(unsigned long long)in->bytes_saved, (unsigned long long)in->synth,
				(unsigned long long)in->held, in->maps_carried, in->maps_fetched,
				in->maps_later);
			for (int e = 0; e < in->nevents; e++) {
				fprintf(json, "%s{\"ms\":%.3f,\"event\":", e ? "," : "",
					(in->ev[e].t - in->t_detect) / 1e6);
				json_str(json, in->ev[e].text);
				fputc('}', json);
			}
			fprintf(json, "]}");
		}
	}
	pthread_mutex_unlock(&eng.mu);
}
