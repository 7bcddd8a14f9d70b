/*
 * The control thread's objects and what the files that make up the control
 * thread share (ctl.c has the state, its lock order, start-up, fork and
 * shutdown; ctl_loop.c the loop and dispatch; ctl_conn.c the connections and
 * sending; ctl_rdv.c the rendezvous; ctl_req.c the calling side). Only for
 * those files: the rest of the control plane and its tests use ctl.h and
 * ctl_priv.h.
 */
#ifndef R2CC_CTL_THREAD_H
#define R2CC_CTL_THREAD_H

#include "ctl/ctl.h"
#include "ctl/ctl_msg.h"
#include "ctl/hmap.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* Internal message types. */
enum {
	CTL_T_REGISTER = 1, /* request: u32 rank, u32 nranks, member; reply: head (ctl_dir.c) */
	CTL_T_CANCEL = 2,   /* u32 rank, u32 request id of a REGISTER given up on */
	CTL_T_LOOKUP = 3,   /* request: members and NIC owners of a round (ctl_dir.c) */
	CTL_T_NICS = 4,	    /* request: the NICs a rank uses (ctl_dir.c) */
	CTL_T_LEAVE = 5,    /* u32 round, u32 rank: that rank's communicator is gone */
};

#define CTL_MAX_CONNS	    65536
#define CTL_EVENTS	    256
#define CTL_OUTQ_MAX_ITEMS  65536
#define CTL_OUTQ_MAX_BYTES  (64u << 20)
#define CTL_CONN_TX_MAX	    (16u << 20)
#define CTL_RX_BUDGET	    (256u << 20) /* all half-received frames together */
#define CTL_CONNECT_MS	    10000
#define CTL_TX_STALL_MS	    30000
#define CTL_POLL_MS	    100
#define CTL_IDLE_POLL_MS    1000
#define CTL_REPLAY_SENDERS  131072
#define CTL_READS_PER_PASS  64
#define CTL_PARK_MAX_FRAMES 256
#define CTL_PARK_MAX_BYTES  (8u << 20)
/* Incoming connections that have not authenticated yet ("strangers"). */
#define CTL_PREAUTH_CONNS	  4096
#define CTL_PREAUTH_CONNS_PER_SRC 64
#define CTL_PREAUTH_BYTES_PER_SRC (16u << 20) /* their half-received frames */
#define CTL_SRC_BUCKETS		  1024
#define CTL_STALE_WARN_MS	  60000

/* What the strangers from one source address hold (control thread only). */
struct src_ent {
	struct src_ent *next;
	struct sockaddr_storage addr; /* port zero */
	int conns;
	size_t bytes;
};

struct out_item {
	struct out_item *next;
	struct sockaddr_storage dst;
	int32_t lane; /* -1: the destination's shared connection */
	unsigned char key[R2CC_CTL_SECRET_SIZE];
	struct r2cc_ctl_hdr hdr; /* sender, seq, ts filled when sealed */
	unsigned char payload[];
};

struct txbuf {
	struct txbuf *next;
	size_t len;
	size_t off;
	unsigned char data[];
};

struct conn {
	int fd;
	int idx;       /* in r2cc_ctl.conns */
	uint64_t uid;  /* never reused; names the conn in pendings and rounds */
	int32_t lane;  /* outgoing: see out_item */
	uint32_t ev;   /* epoll events asked for */
	int rdv_slots; /* slots of open rounds that wait for this connection */
	bool outgoing;
	bool connecting;
	bool dead;
	bool authed;	     /* a frame from this peer passed every check */
	struct src_ent *src; /* incoming and not authenticated yet: its source */
	size_t src_charged;  /* bytes of rx charged to src */
	int dead_status;
	int parked;		      /* frames of this connection waiting in the park */
	uint64_t park_held;	      /* the park_retry() pass that kept one of them */
	struct sockaddr_storage peer; /* outgoing: where it connects; incoming: who */
	struct r2cc_ctl_rx rx;
	size_t rx_charged;
	int64_t rx_progress_ms;
	struct txbuf *txq;
	struct txbuf **txtail;
	size_t tx_bytes;
	int64_t tx_progress_ms;
	int64_t opened_ms;
	uint64_t tx_sender;
	uint64_t tx_seq;
};

struct pending {
	struct pending *next, *prev;
	uint32_t req_id;
	uint64_t job_id;
	int32_t peer_rank; /* expected from_rank of the reply; -1 for the rendezvous */
	uint64_t conn_uid; /* 0 until sent */
	bool done;
	int status;
	unsigned char *buf; /* caller's buffer, or malloc'd here when grow is set */
	size_t cap;
	size_t len;
	bool grow;
};

struct rdv_slot {
	bool present;
	uint64_t conn_uid;
	uint32_t req_id;
	unsigned char *member;
	size_t mlen;
};

struct rdv_round {
	int nranks;
	int count;
	struct rdv_slot *slots;
};

/* A completed round, while any of its ranks remains. */
struct rdv_done {
	struct rdv_done *next;
	struct r2cc_ctl_rdir *rd;
};

struct job_ent {
	struct job_ent *next;
	struct r2cc_ctl_job job;
	bool serve; /* stamped here: this process runs its rendezvous (atomic: the
		     * control thread reads it without r2cc_ctl.lock) */
	int *ranks; /* the ranks this process holds in the job */
	int nlocal;
	int cap_local;
	struct rdv_round *round; /* control thread only, as are done and next_gen */
	struct rdv_done *done;
	uint32_t next_gen;
};

/* A frame for a job this process does not know yet. */
struct parked {
	struct parked *next;
	struct r2cc_ctl_hdr hdr;
	unsigned char *frame;
	size_t size;
	uint64_t conn_uid;
	int64_t since_ms;
};

struct handler {
	r2cc_ctl_handler_fn fn;
	void *arg;
};

struct call_priv {
	struct r2cc_ctl_call pub;
	struct conn *conn;
	unsigned char key[R2CC_CTL_SECRET_SIZE];
	uint32_t req_id;
	bool replied;
};
struct r2cc_ctl_state {
	pthread_mutex_t start_lock;
	pthread_mutex_t lock;
	pthread_cond_t done_cv;
	bool cv_ready;
	bool started;
	bool shut;
	bool stop;
	pthread_t thread;
	int wake_fd;
	int listen_fd;
	int oob_fd;
	int ep_fd;
	struct sockaddr_storage local;
	struct out_item *outq;
	struct out_item **outtail;
	size_t out_items;
	size_t out_bytes;
	struct pending *pending;
	struct r2cc_hmap pending_by_id; /* req_id -> struct pending */
	struct job_ent *jobs;
	struct handler handlers[R2CC_CTL_TYPE_MAX];
	uint32_t next_req;
	struct conn **conns;
	int nconns, conncap;
	bool conn_per_rank;
	/* control thread only */
	struct r2cc_hmap conn_by_uid;
	struct r2cc_hmap conn_by_dst; /* hash of (destination, lane) -> outgoing conn */
	bool timers;		      /* something may time out: sweep every CTL_POLL_MS */
	int64_t last_sweep_ms;
	struct r2cc_ctl_replay *replay;
	uint64_t next_conn_uid;
	size_t rx_charged;
	struct parked *park;
	struct parked **park_tail;
	int nparked;
	size_t parked_bytes;
	struct src_ent *src[CTL_SRC_BUCKETS];
	int preauth_conns;
	int64_t stale_warned_ms;
};

extern struct r2cc_ctl_state r2cc_ctl;
extern struct r2cc_ctl_stats r2cc_ctl_counts;
extern int r2cc_ctl_ndead; /* connections killed, not reaped yet */

#define STAT_INC(field) __atomic_fetch_add(&r2cc_ctl_counts.field, 1, __ATOMIC_RELAXED)

/* ctl.c: counters, clock, wake-up, jobs, rounds, waiters, the thread. */
void r2cc_ctl_count_stale(const struct conn *c, const struct r2cc_ctl_hdr *h, int64_t now_ns);
void r2cc_ctl_count_drop(int reason, const struct conn *c);
int64_t r2cc_ctl_now_ms(void);
void r2cc_ctl_wake_thread_locked(void);
struct job_ent *r2cc_ctl_job_find_locked(uint64_t id);
int r2cc_ctl_job_ensure(const struct r2cc_ctl_job *job, bool serve, const int *ranks, int n);
void r2cc_ctl_round_free(struct rdv_round *r);
struct pending *r2cc_ctl_pending_find_locked(uint32_t req_id, uint64_t job_id);
int r2cc_ctl_pending_link_locked(struct pending *p);
void r2cc_ctl_pending_unlink_locked(struct pending *p);
void r2cc_ctl_pending_complete_locked(struct pending *p, int status);
void r2cc_ctl_pending_fail_conn(uint64_t conn_uid, int status);
bool r2cc_ctl_on_thread(void);
int r2cc_ctl_start(void);

/* ctl_loop.c. */
void *r2cc_ctl_main(void *arg);

/* ctl_conn.c: strangers, connections, sending. */
struct src_ent *r2cc_ctl_src_get(const struct sockaddr_storage *peer);
void r2cc_ctl_src_put(struct src_ent *e);
void r2cc_ctl_conn_src_release(struct conn *c);
int r2cc_ctl_conn_add(struct conn *c);
struct conn *r2cc_ctl_conn_new(int fd, bool outgoing);
void r2cc_ctl_conn_kill(struct conn *c, int status);
void r2cc_ctl_conn_rx_uncharge(struct conn *c);
void r2cc_ctl_conn_free(struct conn *c);
void r2cc_ctl_conns_reap(void);
struct conn *r2cc_ctl_conn_by_uid(uint64_t uid);
void r2cc_ctl_conn_flush(struct conn *c);
int r2cc_ctl_send_reply(struct conn *c, const unsigned char *key, uint64_t job_id, uint32_t req_id,
			int32_t from_rank, int32_t to_rank, int status, const void *payload,
			size_t len);
void r2cc_ctl_route_out(void);
int r2cc_ctl_queue_out(const struct sockaddr_storage *dst, const unsigned char *key,
		       const struct r2cc_ctl_hdr *h, const void *payload, size_t len);

/* ctl_rdv.c: the rendezvous, and the big-endian words of its messages. */
void r2cc_ctl_rdv_forget_conn(const struct conn *c);
uint32_t r2cc_ctl_get_u32(const unsigned char *p);
void r2cc_ctl_put_u32(unsigned char *p, uint32_t v);
void r2cc_ctl_rdv_register(struct conn *c, struct job_ent *j, const struct r2cc_ctl_hdr *h,
			   const unsigned char *p);
void r2cc_ctl_rdv_cancel(struct conn *c, struct job_ent *j, const struct r2cc_ctl_hdr *h,
			 const unsigned char *p);
void r2cc_ctl_rdv_serve(struct conn *c, struct job_ent *j, const struct r2cc_ctl_hdr *h,
			const unsigned char *p);
void r2cc_ctl_rdv_leave(struct conn *c, struct job_ent *j, const struct r2cc_ctl_hdr *h,
			const unsigned char *p);

#endif
