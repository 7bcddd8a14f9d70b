/*
 * What the files of the device's conformance tests share (conformance.c has the test
 * table and main): the two peers' settings, `struct peer`, the common steps
 * (conformance_peer.c) and each test's roles, A and B, by the verbs area they test.
 */
#ifndef SV_TEST_CONFORMANCE_H
#define SV_TEST_CONFORMANCE_H

#include "tests/softverbs/harness.h"

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stdint.h>

#define BUF_LEN	  (8u << 20)
#define NQP	  3 /* QPs per peer, unless a test sets peer.nqp */
#define NQP_MAX	  24
#define TIMEOUT	  14 /* 4.096 us * 2^14 = 67 ms per try */
#define RETRY	  7
#define SCALE	  0.2 /* SOFTVERBS_TIME_SCALE of the tests */
#define RETRY_MS  (4.096e-3 * (1 << TIMEOUT) * (RETRY + 1) * SCALE)
#define ACCESS_RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

struct wire {
	uint32_t qpn[NQP_MAX];
	uint16_t lid;
	uint64_t addr;
	uint32_t rkey;
	int pid;
};

struct peer {
	char role; /* 'A' or 'B' */
	int sock;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	bool want_srq;	   /* set before setup(): the QPs take receives from p->srq */
	bool want_channel; /* set before setup(): p->cq reports to p->ch */
	int want_cqe;	   /* set before setup(): p->cq's size, default 512 */
	int want_rq;	   /* set before setup(): each QP's max_recv_wr, default 256 */
	struct ibv_srq *srq;
	struct ibv_comp_channel *ch;
	int nqp;
	struct ibv_qp *qp[NQP_MAX];
	struct ibv_mr *mr;
	uint8_t *buf;
	struct wire me, peer;
};

typedef void (*role_fn)(struct peer *p);

/* What the seeded tests (blackhole_inflight*) leave for the parent, which maps it. */
struct results {
	char pattern[4][128];
};

extern struct results *results;

/* conformance_peer.c */
/* Polls one completion for up to `ms`; returns 1 or 0. */
int poll_one(struct ibv_cq *cq, struct ibv_wc *wc, double ms);
void ctl(struct peer *p, const char *args);
/* softverbs-ctl's exit status. */
int ctl_status(struct peer *p, const char *args);
/* Waits for one async event of a context; returns its type or -1 after `ms`. */
int ctx_event(struct peer *p, struct ibv_context *ctx, int ms);
int async_event(struct peer *p, int ms);
double retry_ms(void);
void connect_qp(struct peer *p, int i);
struct ibv_qp *make_qp(struct peer *p);
/* Opens the first NIC, makes nqp (default NQP) QPs and connects them to the peer's. */
void setup(struct peer *p);
void post(struct peer *p, int q, int opcode, uint64_t wr_id, unsigned flags, uint64_t loff,
	  uint32_t len, uint64_t roff, uint32_t rkey, uint32_t imm);
void post_recv(struct peer *p, int q, uint64_t wr_id);
void expect_wc(struct peer *p, uint64_t wr_id, int status, double ms, struct ibv_wc *out);
/* `n` completions with these wr_ids, in any order (a CQ shared by send and receive). */
void expect_wcs(struct peer *p, const uint64_t *ids, int n, int status);
void expect_no_wc(struct peer *p, double ms);
int qp_state(struct peer *p, int q);
/* The B of tests that need only A's traffic: sets up, waits for A's tag 1. */
void idle_b(struct peer *p);
int cmp_double(const void *a, const void *b);

/* conformance_rdma.c */
void write_a(struct peer *p);
void write_b(struct peer *p);
void order_a(struct peer *p);
void order_b(struct peer *p);
void mixed_a(struct peer *p);
void mixed_b(struct peer *p);
void read_a(struct peer *p);
void read_b(struct peer *p);
void access_a(struct peer *p);
void access_b(struct peer *p);

/* conformance_send.c */
void send_a(struct peer *p);
void send_b(struct peer *p);
void rnr_a(struct peer *p);
void rnr_b(struct peer *p);
void np_sender(struct peer *p);
void np_receiver(struct peer *p);
void srq_a(struct peer *p);
void srq_b(struct peer *p);

/* conformance_qp.c */
void err_busy_a(struct peer *p);
void reset_clean_a(struct peer *p);
void reset_clean_b(struct peer *p);

/* conformance_cq.c */
void sq_refill_a(struct peer *p);
void bigcq_a(struct peer *p);
void bigcq_b(struct peer *p);
void bigcq_dies_a(struct peer *p);
void bigcq_dies_b(struct peer *p);
void channel_a(struct peer *p);
void channel_b(struct peer *p);

/* conformance_shaping.c */
void counters_a(struct peer *p);
void counters_b(struct peer *p);
void shaping_a(struct peer *p);
void slow_a(struct peer *p);
void slow_rx_a(struct peer *p);
void shared_nic(struct peer *p);
void jitter_a(struct peer *p);
void jitter_b(struct peer *p);
void fair_a(struct peer *p);
void fair_b(struct peer *p);

/* conformance_faults.c */
void down_a(struct peer *p);
void down_b(struct peer *p);
void blackhole_a(struct peer *p);
void blackhole_b(struct peer *p);
void flap_a(struct peer *p);
void death_a(struct peer *p);
void death_b(struct peer *p);
void sched_a(struct peer *p);
void fatal_a(struct peer *p);
void fatal_b(struct peer *p);
void fatal_shared(struct peer *p);

/* conformance_loss.c */
void ackloss_a(struct peer *p);
void ackloss_b(struct peer *p);
void ackheal_a(struct peer *p);
void ackheal_b(struct peer *p);
void bh_tx(struct peer *p);
void bh_rx(struct peer *p);
void inflight_a(struct peer *p);
void inflight_b(struct peer *p);
bool inflight_first_verdict(void);
bool inflight_verdict(void);
void bhstream_a(struct peer *p);
void bhstream_b(struct peer *p);

/* conformance_device.c */
void leave_down(struct peer *p);
void find_fresh(struct peer *p);
void absent_b(struct peer *p);
void limits_a(struct peer *p);
void comp_vector_a(struct peer *p);
void cmd_fd_a(struct peer *p);

#endif
