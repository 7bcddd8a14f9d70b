/*
 * Multi-process conformance tests of the software RDMA device. Each test forks two
 * processes, node "A" and node "B" on a private fabric, which open their NICs,
 * connect RC QPs over a socketpair and check data, completions, QP states, async
 * events, counters, shaping and faults, shared receive queues, send queue slots that
 * are free once their completion is polled, and completion channels woken by the
 * other process. Any mismatch exits non-zero.
 *
 *   conformance [TEST...]     run all tests, or the named ones
 */
#include "tests/softverbs/softverbs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BUF_LEN	  (8u << 20)
#define NQP	  2
#define TIMEOUT	  14 /* 4.096 us * 2^14 = 67 ms per try */
#define RETRY	  7
#define SCALE	  0.2 /* SOFTVERBS_TIME_SCALE of the tests */
#define RETRY_MS  (4.096e-3 * (1 << TIMEOUT) * (RETRY + 1) * SCALE)
#define ACCESS_RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

struct wire {
	uint32_t qpn[NQP];
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
	struct ibv_srq *srq;
	struct ibv_comp_channel *ch;
	struct ibv_qp *qp[NQP];
	struct ibv_mr *mr;
	uint8_t *buf;
	struct wire me, peer;
};

typedef void (*role_fn)(struct peer *p);

static char ctl_path[PATH_MAX];
static char fabric[64];

static void fail(struct peer *p, int line, const char *cond, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "FAIL [%c] line %d: %s ", p ? p->role : '-', line, cond);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
	exit(1);
}

#define CHECK(p, cond, ...)                                                                        \
	do {                                                                                       \
		if (!(cond))                                                                       \
			fail(p, __LINE__, #cond, "" __VA_ARGS__);                                  \
	} while (0)

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sync_send(struct peer *p, int tag)
{
	CHECK(p, write(p->sock, &tag, sizeof(tag)) == sizeof(tag));
}

static void sync_wait(struct peer *p, int tag)
{
	int got = -1;

	CHECK(p, read(p->sock, &got, sizeof(got)) == sizeof(got), "(peer gone)");
	CHECK(p, got == tag, "(got sync %d, want %d)", got, tag);
}

/* Polls one completion for up to `ms`; returns 1 or 0. */
static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc, double ms)
{
	double end = now_ms() + ms;

	do {
		int n = ibv_poll_cq(cq, 1, wc);

		if (n)
			return n;
		usleep(50);
	} while (now_ms() < end);
	return 0;
}

static void ctl(struct peer *p, const char *args)
{
	char cmd[PATH_MAX + 256];

	snprintf(cmd, sizeof(cmd), "%s --fabric %s %s >/dev/null", ctl_path, fabric, args);
	CHECK(p, system(cmd) == 0, "(%s)", cmd);
}

/* Waits for one async event; returns its type or -1 after `ms`. */
static int async_event(struct peer *p, int ms)
{
	struct pollfd pfd = {.fd = p->ctx->async_fd, .events = POLLIN};
	struct ibv_async_event ev;
	int type;

	if (poll(&pfd, 1, ms) != 1)
		return -1;
	CHECK(p, ibv_get_async_event(p->ctx, &ev) == 0);
	type = ev.event_type;
	CHECK(p, ev.element.port_num == 1);
	ibv_ack_async_event(&ev);
	return type;
}

static void connect_qp(struct peer *p, int i)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_4096;
	a.dest_qp_num = p->peer.qpn[i];
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = p->peer.lid;
	a.ah_attr.port_num = 1;
	CHECK(p, ibv_modify_qp(p->qp[i], &a,
			       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				   IBV_QP_MIN_RNR_TIMER) == 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = TIMEOUT;
	a.retry_cnt = RETRY;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	CHECK(p, ibv_modify_qp(p->qp[i], &a,
			       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				   IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

static struct ibv_qp *make_qp(struct peer *p)
{
	struct ibv_qp_init_attr init = {
	    .send_cq = p->cq,
	    .recv_cq = p->cq,
	    .cap = {.max_send_wr = 512,
		    .max_recv_wr = 256,
		    .max_send_sge = 4,
		    .max_recv_sge = 4,
		    .max_inline_data = 128},
	    .qp_type = IBV_QPT_RC,
	    .srq = p->srq,
	};
	struct ibv_qp_attr a = {
	    .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = ACCESS_RW};
	struct ibv_qp *qp;

	if (p->srq)
		init.cap.max_recv_wr = init.cap.max_recv_sge = 0;
	qp = ibv_create_qp(p->pd, &init);

	CHECK(p, qp != NULL, "(errno %d)", errno);
	CHECK(p, ibv_modify_qp(qp, &a,
			       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				   IBV_QP_ACCESS_FLAGS) == 0);
	return qp;
}

/* Opens the first NIC, makes NQP QPs and connects them to the peer's. */
static void setup(struct peer *p)
{
	struct ibv_device **devs = ibv_get_device_list(NULL);
	struct ibv_port_attr pa;

	CHECK(p, devs && devs[0]);
	p->ctx = ibv_open_device(devs[0]);
	CHECK(p, p->ctx != NULL);
	ibv_free_device_list(devs);
	p->pd = ibv_alloc_pd(p->ctx);
	if (p->want_channel) {
		p->ch = ibv_create_comp_channel(p->ctx);
		CHECK(p, p->ch != NULL);
	}
	p->cq = ibv_create_cq(p->ctx, 512, p, p->ch, 0);
	CHECK(p, p->pd && p->cq);
	if (p->want_srq) {
		struct ibv_srq_init_attr si = {.attr = {.max_wr = 16, .max_sge = 1}};

		p->srq = ibv_create_srq(p->pd, &si);
		CHECK(p, p->srq != NULL, "(errno %d)", errno);
		CHECK(p, si.attr.max_wr == 16 && si.attr.max_sge == 1);
	}
	p->buf = mmap(NULL, BUF_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(p, p->buf != MAP_FAILED);
	memset(p->buf, p->role, BUF_LEN);
	p->mr = ibv_reg_mr(p->pd, p->buf, BUF_LEN, ACCESS_RW);
	CHECK(p, p->mr != NULL);
	for (int i = 0; i < NQP; i++) {
		p->qp[i] = make_qp(p);
		p->me.qpn[i] = p->qp[i]->qp_num;
	}
	CHECK(p, ibv_query_port(p->ctx, 1, &pa) == 0);
	p->me.lid = pa.lid;
	p->me.addr = (uintptr_t)p->buf;
	p->me.rkey = p->mr->rkey;
	p->me.pid = getpid();
	CHECK(p, write(p->sock, &p->me, sizeof(p->me)) == sizeof(p->me));
	CHECK(p, read(p->sock, &p->peer, sizeof(p->peer)) == sizeof(p->peer));
	for (int i = 0; i < NQP; i++)
		connect_qp(p, i);
	sync_send(p, 0);
	sync_wait(p, 0);
}

static void post(struct peer *p, int q, int opcode, uint64_t wr_id, unsigned flags, uint64_t loff,
		 uint32_t len, uint64_t roff, uint32_t rkey, uint32_t imm)
{
	struct ibv_sge sge = {.addr = (uintptr_t)p->buf + loff, .length = len, .lkey = p->mr->lkey};
	struct ibv_send_wr wr = {.wr_id = wr_id,
				 .sg_list = &sge,
				 .num_sge = len ? 1 : 0,
				 .opcode = opcode,
				 .send_flags = flags,
				 .imm_data = imm};
	struct ibv_send_wr *bad = NULL;

	wr.wr.rdma.remote_addr = p->peer.addr + roff;
	wr.wr.rdma.rkey = rkey;
	CHECK(p, ibv_post_send(p->qp[q], &wr, &bad) == 0);
}

static void post_recv(struct peer *p, int q, uint64_t wr_id)
{
	struct ibv_recv_wr wr = {.wr_id = wr_id}, *bad = NULL;

	CHECK(p, ibv_post_recv(p->qp[q], &wr, &bad) == 0);
}

static void expect_wc(struct peer *p, uint64_t wr_id, int status, double ms, struct ibv_wc *out)
{
	struct ibv_wc wc;

	CHECK(p, poll_one(p->cq, &wc, ms) == 1, "(no completion for wr_id %llu)",
	      (unsigned long long)wr_id);
	CHECK(p, wc.wr_id == wr_id && (int)wc.status == status,
	      "(got wr_id %llu status %d (%s), want %llu status %d)", (unsigned long long)wc.wr_id,
	      wc.status, ibv_wc_status_str(wc.status), (unsigned long long)wr_id, status);
	if (out)
		*out = wc;
}

/* `n` completions with these wr_ids, in any order (a CQ shared by send and receive). */
static void expect_wcs(struct peer *p, const uint64_t *ids, int n, int status)
{
	bool seen[8] = {false};

	for (int k = 0; k < n; k++) {
		struct ibv_wc wc;
		int i;

		CHECK(p, poll_one(p->cq, &wc, 2000) == 1, "(%d of %d completions)", k, n);
		CHECK(p, (int)wc.status == status, "(wr_id %llu status %d, want %d)",
		      (unsigned long long)wc.wr_id, wc.status, status);
		for (i = 0; i < n && (ids[i] != wc.wr_id || seen[i]); i++)
			;
		CHECK(p, i < n, "(unexpected wr_id %llu)", (unsigned long long)wc.wr_id);
		seen[i] = true;
	}
}

static void expect_no_wc(struct peer *p, double ms)
{
	struct ibv_wc wc;

	CHECK(p, poll_one(p->cq, &wc, ms) == 0, "(unexpected wr_id %llu status %d)",
	      (unsigned long long)wc.wr_id, wc.status);
}

static int qp_state(struct peer *p, int q)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr init;

	CHECK(p, ibv_query_qp(p->qp[q], &a, IBV_QP_STATE, &init) == 0);
	return a.qp_state;
}

static void fill(uint8_t *b, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		b[i] = (uint8_t)(i * 131 + seed);
}

static bool check_fill(const uint8_t *b, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		if (b[i] != (uint8_t)(i * 131 + seed))
			return false;
	return true;
}

/* ---- write, immediate data, zero length, chains, multiple SGEs, inline ---- */

static void write_a(struct peer *p)
{
	struct ibv_sge sge[3], inl;
	struct ibv_send_wr wr[4], *bad = NULL;
	struct ibv_wc wc;

	setup(p);
	fill(p->buf, 1 << 20, 7);
	fill(p->buf + (4 << 20), 100, 9);
	/* 1 MiB from three SGEs, a zero-length write, an inline write, a WRITE_WITH_IMM. */
	for (int i = 0; i < 3; i++) {
		sge[i].addr = (uintptr_t)p->buf + (uint64_t)i * (1 << 20) / 4;
		sge[i].length = i < 2 ? (1 << 20) / 4 : (1 << 20) / 2;
		sge[i].lkey = p->mr->lkey;
	}
	inl = (struct ibv_sge){.addr = (uintptr_t)p->buf + (4 << 20), .length = 100, .lkey = 0};
	memset(wr, 0, sizeof(wr));
	for (int i = 0; i < 4; i++) {
		wr[i].wr_id = (uint64_t)i + 1;
		wr[i].next = i < 3 ? &wr[i + 1] : NULL;
		wr[i].opcode = IBV_WR_RDMA_WRITE;
		wr[i].wr.rdma.rkey = p->peer.rkey;
	}
	wr[0].sg_list = sge;
	wr[0].num_sge = 3;
	wr[0].wr.rdma.remote_addr = p->peer.addr;
	wr[1].send_flags = IBV_SEND_SIGNALED;		    /* zero length */
	wr[1].wr.rdma.remote_addr = p->peer.addr + BUF_LEN; /* not checked when zero length */
	wr[1].wr.rdma.rkey = 0;
	wr[2].sg_list = &inl;
	wr[2].num_sge = 1;
	wr[2].send_flags = IBV_SEND_INLINE;
	wr[2].wr.rdma.remote_addr = p->peer.addr + (2 << 20);
	wr[3].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr[3].send_flags = IBV_SEND_SIGNALED;
	wr[3].imm_data = htonl(0x12345678);
	CHECK(p, ibv_post_send(p->qp[0], wr, &bad) == 0);
	/* The arrays may be reused at once: scribble over them. */
	memset(wr, 0xff, sizeof(wr));
	memset(sge, 0xff, sizeof(sge));
	memset(p->buf + (4 << 20), 0, 100);
	expect_wc(p, 2, IBV_WC_SUCCESS, 2000, &wc);
	CHECK(p, wc.opcode == IBV_WC_RDMA_WRITE && wc.qp_num == p->qp[0]->qp_num);
	expect_wc(p, 4, IBV_WC_SUCCESS, 2000, &wc);
	CHECK(p, wc.opcode == IBV_WC_RDMA_WRITE);
	/* A WRITE_WITH_IMM that carries data. */
	fill(p->buf + (5 << 20), 4096, 11);
	post(p, 1, IBV_WR_RDMA_WRITE_WITH_IMM, 5, IBV_SEND_SIGNALED, 5 << 20, 4096, 3 << 20,
	     p->peer.rkey, htonl(42));
	expect_wc(p, 5, IBV_WC_SUCCESS, 2000, NULL);
	expect_no_wc(p, 50);
	sync_wait(p, 1);
}

static void write_b(struct peer *p)
{
	struct ibv_wc wc;

	setup(p);
	post_recv(p, 0, 77);
	post_recv(p, 1, 78);
	expect_wc(p, 77, IBV_WC_SUCCESS, 2000, &wc);
	CHECK(p, wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && (wc.wc_flags & IBV_WC_WITH_IMM));
	CHECK(p, wc.imm_data == htonl(0x12345678) && wc.byte_len == 0);
	CHECK(p, wc.qp_num == p->qp[0]->qp_num && wc.src_qp == p->peer.qpn[0]);
	CHECK(p, check_fill(p->buf, 1 << 20, 7), "(1 MiB write)");
	CHECK(p, check_fill(p->buf + (2 << 20), 100, 9), "(inline write)");
	CHECK(p, p->buf[(2 << 20) + 100] == 'B');
	expect_wc(p, 78, IBV_WC_SUCCESS, 2000, &wc);
	CHECK(p, wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && wc.imm_data == htonl(42));
	CHECK(p, wc.byte_len == 4096 && check_fill(p->buf + (3 << 20), 4096, 11));
	expect_no_wc(p, 50);
	sync_send(p, 1);
}

/* ---- ordering: a long stream of writes, then the IMM ---- */

#define ORDER_N	 2048
#define ORDER_SZ (BUF_LEN / ORDER_N)

static void order_a(struct peer *p)
{
	setup(p);
	for (int round = 0; round < 2; round++) {
		fill(p->buf, BUF_LEN, 100 + round);
		for (int i = 0; i < ORDER_N; i++) {
			bool sig = i % 256 == 255;

			post(p, 0, IBV_WR_RDMA_WRITE, i, sig ? IBV_SEND_SIGNALED : 0,
			     (uint64_t)i * ORDER_SZ, ORDER_SZ, (uint64_t)i * ORDER_SZ, p->peer.rkey,
			     0);
			if (sig)
				expect_wc(p, i, IBV_WC_SUCCESS, 5000, NULL);
		}
		post(p, 0, IBV_WR_RDMA_WRITE_WITH_IMM, 9999, 0, 0, 0, 0, p->peer.rkey, round);
		sync_wait(p, round + 1);
	}
}

static void order_b(struct peer *p)
{
	struct ibv_wc wc;

	setup(p);
	for (int round = 0; round < 2; round++) {
		post_recv(p, 0, round);
		expect_wc(p, round, IBV_WC_SUCCESS, 10000, &wc);
		CHECK(p, wc.imm_data == (uint32_t)round);
		CHECK(p, check_fill(p->buf, BUF_LEN, 100 + round), "(data incomplete at IMM)");
		sync_send(p, round + 1);
	}
}

/*
 * Large requests go to the NIC's engine, small ones may run in the posting thread:
 * mixed sizes on one QP still complete in the order posted, with their data there.
 */
#define MIX_N 600

static uint32_t mix_size(int i)
{
	return i % 3 == 0 ? 1u << 20 : i % 3 == 1 ? 8 : 20000;
}

static void mixed_a(struct peer *p)
{
	int posted = 0, done = 0;

	setup(p);
	fill(p->buf, BUF_LEN, 77);
	while (done < MIX_N) {
		struct ibv_wc wc;

		while (posted < MIX_N && posted - done < 64) {
			uint64_t off = (uint64_t)(posted % 7) << 20;

			post(p, 0, IBV_WR_RDMA_WRITE, (uint64_t)posted, IBV_SEND_SIGNALED, off,
			     mix_size(posted), off, p->peer.rkey, 0);
			posted++;
		}
		expect_wc(p, (uint64_t)done, IBV_WC_SUCCESS, 5000, &wc);
		CHECK(p, wc.opcode == IBV_WC_RDMA_WRITE && wc.byte_len == mix_size(done));
		done++;
	}
	post(p, 0, IBV_WR_RDMA_WRITE_WITH_IMM, 9999, 0, 0, 0, 0, p->peer.rkey, 5);
	sync_wait(p, 1);
}

static void mixed_b(struct peer *p)
{
	struct ibv_wc wc;

	setup(p);
	post_recv(p, 0, 1);
	expect_wc(p, 1, IBV_WC_SUCCESS, 10000, &wc);
	CHECK(p, wc.imm_data == 5);
	CHECK(p, check_fill(p->buf, 7u << 20, 77), "(data incomplete at IMM)");
	sync_send(p, 1);
}

/*
 * modify_qp(ERR) while the engine is copying: every request completes exactly once,
 * in order, those done before the error with success and the rest flushed.
 */
static void idle_b(struct peer *p);

static void err_busy_a(struct peer *p)
{
	int ok = 0;
	bool flushed = false;
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};

	setup(p);
	for (int i = 0; i < 100; i++)
		post(p, 0, IBV_WR_RDMA_WRITE, (uint64_t)i, IBV_SEND_SIGNALED, 0, 1 << 20,
		     (uint64_t)(i % 7) << 20, p->peer.rkey, 0);
	CHECK(p, ibv_modify_qp(p->qp[0], &a, IBV_QP_STATE) == 0);
	for (int i = 0; i < 100; i++) {
		struct ibv_wc wc;

		CHECK(p, poll_one(p->cq, &wc, 5000) == 1, "(%d of 100 completions)", i);
		CHECK(p, wc.wr_id == (uint64_t)i, "(wr_id %llu, want %d)",
		      (unsigned long long)wc.wr_id, i);
		CHECK(p,
		      wc.status == (flushed ? IBV_WC_WR_FLUSH_ERR : wc.status) &&
			  (wc.status == IBV_WC_SUCCESS || wc.status == IBV_WC_WR_FLUSH_ERR),
		      "(wr_id %d status %d)", i, wc.status);
		flushed = wc.status == IBV_WC_WR_FLUSH_ERR;
		ok += !flushed;
	}
	fprintf(stderr, "  error in flight: %d done, %d flushed\n", ok, 100 - ok);
	expect_no_wc(p, 50);
	sync_send(p, 1);
}

/* ---- RDMA READ ---- */

static void read_a(struct peer *p)
{
	struct ibv_sge sge[2] = {
	    {.addr = (uintptr_t)p->buf, .length = 1000, .lkey = 0},
	    {.addr = (uintptr_t)p->buf + 4096, .length = (1 << 20) - 1000, .lkey = 0},
	};
	struct ibv_send_wr wr = {.wr_id = 1,
				 .sg_list = sge,
				 .num_sge = 2,
				 .opcode = IBV_WR_RDMA_READ,
				 .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr *bad;
	struct ibv_wc wc;

	setup(p);
	sge[0].addr = (uintptr_t)p->buf;
	sge[1].addr = (uintptr_t)p->buf + 4096;
	sge[0].lkey = sge[1].lkey = p->mr->lkey;
	sync_wait(p, 1);
	wr.wr.rdma.remote_addr = p->peer.addr + 12345;
	wr.wr.rdma.rkey = p->peer.rkey;
	CHECK(p, ibv_post_send(p->qp[0], &wr, &bad) == 0);
	expect_wc(p, 1, IBV_WC_SUCCESS, 2000, &wc);
	CHECK(p, wc.opcode == IBV_WC_RDMA_READ && wc.byte_len == 1 << 20);
	for (uint32_t i = 0; i < (1 << 20); i++) {
		uint8_t got = i < 1000 ? p->buf[i] : p->buf[4096 + i - 1000];

		CHECK(p, got == (uint8_t)((12345 + i) * 131 + 3), "(byte %u)", i);
	}
	sync_send(p, 2);
}

static void read_b(struct peer *p)
{
	setup(p);
	fill(p->buf, BUF_LEN, 3);
	sync_send(p, 1);
	sync_wait(p, 2);
	expect_no_wc(p, 10);
}

/* ---- SEND / SEND_WITH_IMM into posted receives with SGEs ---- */

static void send_a(struct peer *p)
{
	setup(p);
	fill(p->buf, 3000, 21);
	fill(p->buf + 8192, 10, 22);
	sync_wait(p, 1);
	post(p, 0, IBV_WR_SEND_WITH_IMM, 1, IBV_SEND_SIGNALED, 0, 3000, 0, 0, htonl(7));
	post(p, 0, IBV_WR_SEND, 2, IBV_SEND_SIGNALED, 8192, 10, 0, 0, 0);
	expect_wc(p, 1, IBV_WC_SUCCESS, 2000, NULL);
	expect_wc(p, 2, IBV_WC_SUCCESS, 2000, NULL);
	sync_wait(p, 2);
}

static void send_b(struct peer *p)
{
	struct ibv_sge sge[2];
	struct ibv_recv_wr wr = {.sg_list = sge, .num_sge = 2}, *bad;
	struct ibv_wc wc;

	setup(p);
	sge[0] = (struct ibv_sge){.addr = (uintptr_t)p->buf, .length = 100, .lkey = p->mr->lkey};
	sge[1] = (struct ibv_sge){
	    .addr = (uintptr_t)p->buf + 65536, .length = 4000, .lkey = p->mr->lkey};
	wr.wr_id = 10;
	CHECK(p, ibv_post_recv(p->qp[0], &wr, &bad) == 0);
	sge[0].addr = (uintptr_t)p->buf + 200000;
	wr.wr_id = 11;
	CHECK(p, ibv_post_recv(p->qp[0], &wr, &bad) == 0);
	sync_send(p, 1);
	expect_wc(p, 10, IBV_WC_SUCCESS, 2000, &wc);
	CHECK(p, wc.opcode == IBV_WC_RECV && wc.byte_len == 3000 &&
		     (wc.wc_flags & IBV_WC_WITH_IMM) && wc.imm_data == htonl(7));
	for (int i = 0; i < 3000; i++) {
		uint8_t got = i < 100 ? p->buf[i] : p->buf[65536 + i - 100];

		CHECK(p, got == (uint8_t)(i * 131 + 21), "(byte %d)", i);
	}
	expect_wc(p, 11, IBV_WC_SUCCESS, 2000, &wc);
	CHECK(p, wc.opcode == IBV_WC_RECV && wc.byte_len == 10 && !(wc.wc_flags & IBV_WC_WITH_IMM));
	CHECK(p, check_fill(p->buf + 200000, 10, 22));
	sync_send(p, 2);
}

/* ---- RNR: WRITE_WITH_IMM before the receive is posted waits ---- */

static void rnr_a(struct peer *p)
{
	double t0;

	setup(p);
	t0 = now_ms();
	post(p, 0, IBV_WR_RDMA_WRITE_WITH_IMM, 1, IBV_SEND_SIGNALED, 0, 64, 0, p->peer.rkey, 5);
	post(p, 0, IBV_WR_RDMA_WRITE, 2, IBV_SEND_SIGNALED, 0, 64, 64, p->peer.rkey, 0);
	expect_wc(p, 1, IBV_WC_SUCCESS, 3000, NULL);
	CHECK(p, now_ms() - t0 >= 180, "(completed after %.0f ms, before the receive)",
	      now_ms() - t0);
	expect_wc(p, 2, IBV_WC_SUCCESS, 1000, NULL);
	sync_wait(p, 1);
}

static void rnr_b(struct peer *p)
{
	struct ibv_wc wc;

	setup(p);
	usleep(200000);
	expect_no_wc(p, 1);
	post_recv(p, 0, 9);
	expect_wc(p, 9, IBV_WC_SUCCESS, 2000, &wc);
	CHECK(p, wc.imm_data == 5 && wc.byte_len == 64);
	sync_send(p, 1);
}

/* ---- access errors: bad rkey, out of bounds ---- */

static void access_a(struct peer *p)
{
	struct ibv_wc wc;

	setup(p);
	post_recv(p, 0, 500);
	post(p, 0, IBV_WR_RDMA_WRITE, 1, IBV_SEND_SIGNALED, 0, 64, 0, p->peer.rkey ^ 0x10000, 0);
	post(p, 0, IBV_WR_RDMA_WRITE, 2, 0, 0, 64, 0, p->peer.rkey, 0);
	post(p, 0, IBV_WR_RDMA_WRITE, 3, IBV_SEND_SIGNALED, 0, 64, 0, p->peer.rkey, 0);
	expect_wc(p, 1, IBV_WC_REM_ACCESS_ERR, 2000, &wc);
	CHECK(p, wc.qp_num == p->qp[0]->qp_num);
	/* The rest is flushed, unsignalled ones too, and so is the posted receive. */
	expect_wcs(p, (uint64_t[]){2, 3, 500}, 3, IBV_WC_WR_FLUSH_ERR);
	CHECK(p, qp_state(p, 0) == IBV_QPS_ERR);
	/* Posting on a QP in ERR completes with a flush error. */
	post(p, 0, IBV_WR_RDMA_WRITE, 4, 0, 0, 64, 0, p->peer.rkey, 0);
	expect_wc(p, 4, IBV_WC_WR_FLUSH_ERR, 2000, NULL);
	/* Out of bounds by one byte. */
	post(p, 1, IBV_WR_RDMA_WRITE, 5, IBV_SEND_SIGNALED, 0, 100, BUF_LEN - 99, p->peer.rkey, 0);
	expect_wc(p, 5, IBV_WC_REM_ACCESS_ERR, 2000, NULL);
	CHECK(p, qp_state(p, 1) == IBV_QPS_ERR);
	expect_no_wc(p, 20);
	sync_send(p, 1);
}

static void access_b(struct peer *p)
{
	setup(p);
	sync_wait(p, 1);
	for (size_t i = 0; i < BUF_LEN; i += 4096)
		CHECK(p, p->buf[i] == 'B' && p->buf[BUF_LEN - 1] == 'B', "(target written)");
	CHECK(p, qp_state(p, 0) == IBV_QPS_RTS, "(responder QP left alone)");
	expect_no_wc(p, 10);
}

/* ---- counters ---- */

static struct softverbs_nic_stat *stat_of(struct peer *p, const char *node,
					  struct softverbs_nic_stat *st)
{
	int n = softverbs_nic_stats(node, st, 4);

	CHECK(p, n >= 1, "(softverbs_nic_stats %d)", n);
	CHECK(p, strcmp(st[0].name, "mlx5_0") == 0);
	return &st[0];
}

static void counters_a(struct peer *p)
{
	struct softverbs_nic_stat st[4], *s;
	char cmd[PATH_MAX + 128], line[512];
	bool seen = false;
	FILE *f;

	setup(p);
	post(p, 0, IBV_WR_RDMA_WRITE, 1, 0, 0, 12345, 0, p->peer.rkey, 0);
	post(p, 0, IBV_WR_RDMA_WRITE_WITH_IMM, 2, IBV_SEND_SIGNALED, 0, 0, 0, 0, 0);
	post(p, 0, IBV_WR_RDMA_READ, 3, IBV_SEND_SIGNALED, 0, 5000, 0, p->peer.rkey, 0);
	expect_wc(p, 2, IBV_WC_SUCCESS, 2000, NULL);
	expect_wc(p, 3, IBV_WC_SUCCESS, 2000, NULL);
	s = stat_of(p, "A", st);
	CHECK(p, s->tx_bytes == 12345 && s->tx_packets == 4 + 1, "(tx %llu/%llu)",
	      (unsigned long long)s->tx_bytes, (unsigned long long)s->tx_packets);
	CHECK(p, s->rx_bytes == 5000 && s->rx_packets == 2);
	s = stat_of(p, "B", st);
	CHECK(p, s->rx_bytes == 12345 && s->rx_packets == 5 && s->tx_bytes == 5000);
	snprintf(cmd, sizeof(cmd), "%s --fabric %s counters", ctl_path, fabric);
	f = popen(cmd, "r");
	CHECK(p, f != NULL);
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "node=B nic=mlx5_0 ") && strstr(line, "rx_bytes=12345 "))
			seen = true;
	CHECK(p, pclose(f) == 0 && seen, "(softverbs-ctl counters)");
	ctl(p, "counters --json");
	sync_send(p, 1);
}

static void counters_b(struct peer *p)
{
	setup(p);
	post_recv(p, 0, 1);
	sync_wait(p, 1);
}

/* ---- shaping and the slow fault ---- */

/* Writes `total` bytes in 1 MiB writes; returns the rate in Gb/s. */
static double stream(struct peer *p, int q, uint64_t total)
{
	uint64_t n = total >> 20;
	double t0 = now_ms();

	for (uint64_t i = 0; i < n; i++) {
		bool sig = i + 1 == n || i % 128 == 127;

		post(p, q, IBV_WR_RDMA_WRITE, i, sig ? IBV_SEND_SIGNALED : 0, 0, 1 << 20,
		     (i % 8) << 20, p->peer.rkey, 0);
		if (sig)
			expect_wc(p, i, IBV_WC_SUCCESS, 10000, NULL);
	}
	return (double)total * 8 / ((now_ms() - t0) * 1e6);
}

static void shaping_a(struct peer *p)
{
	double gbps;

	setup(p);
	gbps = stream(p, 0, 160ull << 20); /* 2 Gb/s: about 0.67 s */
	fprintf(stderr, "  shaping: %.3f Gb/s at 2 Gb/s\n", gbps);
	CHECK(p, gbps > 1.8 && gbps < 2.2, "(%.3f Gb/s)", gbps);
	sync_send(p, 1);
}

static void slow_a(struct peer *p)
{
	double gbps;

	setup(p);
	ctl(p, "fault A mlx5_0 slow 1");
	gbps = stream(p, 0, 64ull << 20); /* 1 Gb/s: about 0.54 s */
	fprintf(stderr, "  slow: %.3f Gb/s at 1 Gb/s\n", gbps);
	CHECK(p, gbps > 0.9 && gbps < 1.1, "(%.3f Gb/s)", gbps);
	ctl(p, "fault A mlx5_0 up");
	gbps = stream(p, 0, 64ull << 20);
	fprintf(stderr, "  after up: %.3f Gb/s\n", gbps);
	CHECK(p, gbps > 2, "(%.3f Gb/s after up)", gbps);
	sync_send(p, 1);
}

/* A slow NIC also slows what it receives. */
static void slow_rx_a(struct peer *p)
{
	double gbps;

	setup(p);
	ctl(p, "fault B mlx5_0 slow 1");
	gbps = stream(p, 0, 64ull << 20);
	fprintf(stderr, "  slow receiver: %.3f Gb/s at 1 Gb/s\n", gbps);
	CHECK(p, gbps > 0.9 && gbps < 1.1, "(%.3f Gb/s)", gbps);
	sync_send(p, 1);
}

static void idle_b(struct peer *p)
{
	setup(p);
	sync_wait(p, 1);
}

/* ---- link down ---- */

static void down_a(struct peer *p)
{
	double t0, dt;

	setup(p);
	sync_wait(p, 1); /* B's port is down */
	post_recv(p, 0, 100);
	t0 = now_ms();
	post(p, 0, IBV_WR_RDMA_WRITE, 1, IBV_SEND_SIGNALED, 0, 4096, 0, p->peer.rkey, 0);
	post(p, 0, IBV_WR_RDMA_WRITE, 2, 0, 0, 4096, 0, p->peer.rkey, 0);
	post(p, 0, IBV_WR_RDMA_WRITE_WITH_IMM, 3, IBV_SEND_SIGNALED, 0, 0, 0, 0, 1);
	expect_wc(p, 1, IBV_WC_RETRY_EXC_ERR, 5000, NULL);
	dt = now_ms() - t0;
	fprintf(stderr, "  down: status 12 after %.0f ms (timeout %.0f ms)\n", dt, RETRY_MS);
	CHECK(p, dt >= RETRY_MS * 0.95 && dt < RETRY_MS * 1.5, "(after %.0f ms)", dt);
	expect_wcs(p, (uint64_t[]){2, 3, 100}, 3, IBV_WC_WR_FLUSH_ERR);
	CHECK(p, qp_state(p, 0) == IBV_QPS_ERR);
	CHECK(p, async_event(p, 0) == -1, "(event on the healthy side)");
	sync_send(p, 2);
	sync_wait(p, 3); /* B's port is up again */
	CHECK(p, qp_state(p, 0) == IBV_QPS_ERR, "(ERR stays ERR after up)");
	post(p, 1, IBV_WR_RDMA_WRITE_WITH_IMM, 4, IBV_SEND_SIGNALED, 0, 4096, 0, p->peer.rkey, 2);
	expect_wc(p, 4, IBV_WC_SUCCESS, 2000, NULL);
	sync_wait(p, 4);
}

static void down_b(struct peer *p)
{
	struct ibv_port_attr pa;
	struct ibv_wc wc;

	setup(p);
	ctl(p, "fault B mlx5_0 down");
	CHECK(p, async_event(p, 1000) == IBV_EVENT_PORT_ERR);
	CHECK(p, ibv_query_port(p->ctx, 1, &pa) == 0 && pa.state == IBV_PORT_DOWN);
	memset(&pa, 0, sizeof(pa));
	CHECK(p, (ibv_query_port)(p->ctx, 1, (struct _compat_ibv_port_attr *)&pa) == 0 &&
		     pa.state == IBV_PORT_DOWN);
	post_recv(p, 1, 7);
	sync_send(p, 1);
	sync_wait(p, 2);
	CHECK(p, p->buf[0] == 'B', "(written through a down port)");
	ctl(p, "fault B mlx5_0 up");
	CHECK(p, async_event(p, 1000) == IBV_EVENT_PORT_ACTIVE);
	CHECK(p, ibv_query_port(p->ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE);
	sync_send(p, 3);
	expect_wc(p, 7, IBV_WC_SUCCESS, 2000, &wc);
	CHECK(p, wc.imm_data == 2 && p->buf[0] == 'A');
	CHECK(p, async_event(p, 0) == -1);
	sync_send(p, 4);
}

/* ---- black hole ---- */

static void blackhole_a(struct peer *p)
{
	double t0, dt;

	setup(p);
	sync_wait(p, 1);
	t0 = now_ms();
	post(p, 0, IBV_WR_RDMA_WRITE_WITH_IMM, 1, IBV_SEND_SIGNALED, 0, 4096, 0, p->peer.rkey, 1);
	expect_wc(p, 1, IBV_WC_RETRY_EXC_ERR, 5000, NULL);
	dt = now_ms() - t0;
	fprintf(stderr, "  blackhole: status 12 after %.0f ms (timeout %.0f ms)\n", dt, RETRY_MS);
	CHECK(p, dt >= RETRY_MS * 0.95 && dt < RETRY_MS * 1.5, "(after %.0f ms)", dt);
	CHECK(p, qp_state(p, 0) == IBV_QPS_ERR);
	sync_send(p, 2);
	sync_wait(p, 3);
	post(p, 1, IBV_WR_RDMA_WRITE, 2, IBV_SEND_SIGNALED, 0, 4096, 0, p->peer.rkey, 0);
	expect_wc(p, 2, IBV_WC_SUCCESS, 2000, NULL);
	sync_send(p, 4);
}

static void blackhole_b(struct peer *p)
{
	struct ibv_port_attr pa;

	setup(p);
	post_recv(p, 0, 1);
	ctl(p, "fault B mlx5_0 blackhole");
	CHECK(p, ibv_query_port(p->ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE);
	sync_send(p, 1);
	sync_wait(p, 2);
	CHECK(p, async_event(p, 0) == -1, "(no event for a black hole)");
	CHECK(p, p->buf[0] == 'B', "(delivered through a black hole)");
	expect_no_wc(p, 10);
	ctl(p, "fault B mlx5_0 up");
	sync_send(p, 3);
	sync_wait(p, 4);
	CHECK(p, p->buf[0] == 'A');
}

/* ---- flapping ---- */

static void flap_a(struct peer *p)
{
	struct ibv_port_attr pa;
	int want = IBV_EVENT_PORT_ERR, seen = 0, down = 0, up = 0;
	double end;

	setup(p);
	ctl(p, "fault A mlx5_0 flap 100");
	end = now_ms() + 550;
	while (now_ms() < end) {
		int ev = async_event(p, 10);

		if (ev >= 0) {
			CHECK(p, ev == want, "(event %d, want %d)", ev, want);
			want =
			    want == IBV_EVENT_PORT_ERR ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR;
			seen++;
		}
		CHECK(p, ibv_query_port(p->ctx, 1, &pa) == 0);
		down += pa.state == IBV_PORT_DOWN;
		up += pa.state == IBV_PORT_ACTIVE;
	}
	fprintf(stderr, "  flap: %d events, %d down / %d up samples\n", seen, down, up);
	CHECK(p, seen >= 4 && down > 0 && up > 0);
	ctl(p, "fault A mlx5_0 up");
	sync_send(p, 1);
}

/* ---- a peer dies ---- */

static void death_a(struct peer *p)
{
	char cmd[PATH_MAX + 128], line[512], pat[64];
	struct ibv_qp *l0, *l1;
	double t0, dt;
	int gone = 0;
	FILE *f;

	setup(p);
	CHECK(p, read(p->sock, line, 1) == 0, "(B should have died)");
	usleep(20000);
	t0 = now_ms();
	post(p, 0, IBV_WR_RDMA_WRITE, 1, IBV_SEND_SIGNALED, 0, 4096, 0, p->peer.rkey, 0);
	expect_wc(p, 1, IBV_WC_RETRY_EXC_ERR, 5000, NULL);
	dt = now_ms() - t0;
	CHECK(p, dt >= RETRY_MS * 0.95 && dt < RETRY_MS * 1.5, "(after %.0f ms)", dt);
	/* Its resources are reclaimed. */
	snprintf(cmd, sizeof(cmd), "%s --fabric %s list", ctl_path, fabric);
	snprintf(pat, sizeof(pat), "pid=%d ", p->peer.pid);
	f = popen(cmd, "r");
	CHECK(p, f != NULL);
	while (fgets(line, sizeof(line), f))
		gone += strstr(line, pat) != NULL;
	CHECK(p, pclose(f) == 0 && gone == 0, "(dead process still listed)");
	/* The fabric still works: a loopback pair inside A. */
	l0 = make_qp(p);
	l1 = make_qp(p);
	p->qp[0] = l0;
	p->qp[1] = l1;
	p->peer.qpn[0] = l1->qp_num;
	p->peer.qpn[1] = l0->qp_num;
	p->peer.lid = p->me.lid;
	p->peer.addr = (uintptr_t)p->buf;
	p->peer.rkey = p->mr->rkey;
	connect_qp(p, 0);
	connect_qp(p, 1);
	fill(p->buf, 4096, 5);
	post_recv(p, 1, 50);
	post(p, 0, IBV_WR_RDMA_WRITE_WITH_IMM, 2, IBV_SEND_SIGNALED, 0, 4096, 8192, p->mr->rkey, 3);
	expect_wcs(p, (uint64_t[]){2, 50}, 2, IBV_WC_SUCCESS);
	CHECK(p, check_fill(p->buf + 8192, 4096, 5));
}

static void death_b(struct peer *p)
{
	setup(p);
	raise(SIGKILL);
}

/* ---- a fault scheduled by SOFTVERBS_FAULT ---- */

static void sched_a(struct peer *p)
{
	setup(p);
	post(p, 0, IBV_WR_RDMA_WRITE, 1, IBV_SEND_SIGNALED, 0, 64, 0, p->peer.rkey, 0);
	expect_wc(p, 1, IBV_WC_SUCCESS, 1000, NULL);
	usleep(400000);
	post(p, 0, IBV_WR_RDMA_WRITE, 2, IBV_SEND_SIGNALED, 0, 64, 0, p->peer.rkey, 0);
	expect_wc(p, 2, IBV_WC_RETRY_EXC_ERR, 5000, NULL);
	sync_send(p, 1);
}

/* ---- NCCL's pattern: receiver posts zero-SGE receives and writes FIFO elements ---- */

#define NP_N	 3000
#define NP_DEPTH 4
#define NP_SLOTS 64
#define NP_FIFO	 (7u << 20) /* A's FIFO, in its buffer */
#define NP_DATA	 65536

/* NCCL's 64-byte FIFO element: fields in bytes 0-39, idx at offset 40. */
struct np_elem {
	uint64_t addr;
	uint32_t rkey;
	uint32_t nreqs;
	uint64_t size;
	uint64_t tag;
	uint64_t check;
	uint64_t idx;
	uint64_t pad[2];
};

static uint32_t np_size(int i)
{
	return 1 + (uint32_t)(i * 7919) % (NP_DATA - 1);
}

/* NCCL's async thread: blocks in ibv_get_async_event all along. */
static void *np_async(void *arg)
{
	struct peer *p = arg;
	struct ibv_async_event ev;

	while (ibv_get_async_event(p->ctx, &ev) == 0)
		ibv_ack_async_event(&ev);
	return NULL;
}

static void np_sender(struct peer *p)
{
	volatile struct np_elem *fifo;
	int done = 0;
	pthread_t th;

	setup(p);
	fifo = (volatile struct np_elem *)(p->buf + NP_FIFO);
	pthread_create(&th, NULL, np_async, p);
	for (int i = 0; i < NP_N; i++) {
		volatile struct np_elem *e = &fifo[i % NP_SLOTS];
		struct ibv_wc wc;
		double end = now_ms() + 5000;
		uint64_t addr, size;
		uint32_t rkey;

		while (e->idx != (uint64_t)i + 1)
			CHECK(p, now_ms() < end, "(FIFO element %d never arrived)", i);
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		addr = e->addr;
		rkey = e->rkey;
		size = e->size;
		CHECK(p, e->check == (addr ^ rkey ^ size ^ (uint64_t)i) && size == np_size(i),
		      "(FIFO element %d torn: idx landed before its fields)", i);
		/* Source slots are reused only after their WRITE_WITH_IMM completed. */
		while (i - done >= 8) {
			CHECK(p, poll_one(p->cq, &wc, 5000) == 1 && wc.status == IBV_WC_SUCCESS);
			CHECK(p, wc.wr_id == (uint64_t)done);
			done++;
		}
		fill(p->buf + (uint64_t)(i % 8) * NP_DATA, size, (unsigned)i);
		post(p, 0, IBV_WR_RDMA_WRITE, 1u << 31, 0, (uint64_t)(i % 8) * NP_DATA,
		     (uint32_t)size, addr - p->peer.addr, rkey, 0);
		post(p, 0, IBV_WR_RDMA_WRITE_WITH_IMM, (uint64_t)i, IBV_SEND_SIGNALED, 0, 0, 0, 0,
		     (uint32_t)size);
	}
	for (; done < NP_N; done++) {
		struct ibv_wc wc;

		CHECK(p, poll_one(p->cq, &wc, 5000) == 1 && wc.status == IBV_WC_SUCCESS &&
			     wc.wr_id == (uint64_t)done);
	}
	sync_wait(p, 1);
}

static void np_receiver(struct peer *p)
{
	struct np_elem *elems;
	int posted = 0, completed = 0;
	pthread_t th;

	setup(p);
	elems = (struct np_elem *)(p->buf + (6u << 20));
	pthread_create(&th, NULL, np_async, p);
	while (completed < NP_N) {
		struct ibv_wc wc;

		while (posted < NP_N && posted - completed < NP_DEPTH) {
			struct np_elem *e = &elems[posted % NP_SLOTS];

			post_recv(p, 0, (uint64_t)posted % 256);
			e->addr = (uintptr_t)p->buf + (uint64_t)(posted % NP_DEPTH) * NP_DATA;
			e->rkey = p->mr->rkey;
			e->nreqs = 1;
			e->size = np_size(posted);
			e->check = e->addr ^ e->rkey ^ e->size ^ (uint64_t)posted;
			e->idx = (uint64_t)posted + 1;
			post(p, 1, IBV_WR_RDMA_WRITE, 0, posted % 64 == 63 ? IBV_SEND_SIGNALED : 0,
			     (6u << 20) + (uint64_t)(posted % NP_SLOTS) * 64, 64,
			     NP_FIFO + (uint64_t)(posted % NP_SLOTS) * 64, p->peer.rkey, 0);
			posted++;
		}
		CHECK(p, poll_one(p->cq, &wc, 5000) == 1, "(request %d)", completed);
		if (wc.opcode == IBV_WC_RDMA_WRITE)
			continue; /* a signalled FIFO write */
		CHECK(p, wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM);
		CHECK(p, wc.wr_id == (uint64_t)completed % 256 && wc.imm_data == np_size(completed),
		      "(request %d: wr_id %llu imm %u)", completed, (unsigned long long)wc.wr_id,
		      wc.imm_data);
		CHECK(p,
		      check_fill(p->buf + (uint64_t)(completed % NP_DEPTH) * NP_DATA,
				 np_size(completed), (unsigned)completed),
		      "(request %d: data not there at its completion)", completed);
		completed++;
	}
	sync_send(p, 1);
}

/* ---- two processes of one node share its NIC: one wire, one set of counters ---- */

static void shared_nic(struct peer *p)
{
	struct softverbs_nic_stat st[4];
	double t0, secs, gbps;

	setup(p);
	t0 = now_ms();
	stream(p, 0, 48ull << 20);
	sync_send(p, 1);
	sync_wait(p, 1);
	secs = (now_ms() - t0) / 1e3;
	/* Both send 48 MiB through A/mlx5_0 at 2 Gb/s: together about 0.4 s. */
	gbps = 2.0 * (48ull << 20) * 8 / secs / 1e9;
	fprintf(stderr, "  shared nic [%c]: %.3f Gb/s together at 2 Gb/s\n", p->role, gbps);
	CHECK(p, gbps > 1.8 && gbps < 2.2, "(%.3f Gb/s)", gbps);
	CHECK(p, softverbs_nic_stats("A", st, 4) == 2);
	CHECK(p, st[0].tx_bytes == 2 * (48ull << 20) && st[0].rx_bytes == 2 * (48ull << 20),
	      "(tx %llu rx %llu)", (unsigned long long)st[0].tx_bytes,
	      (unsigned long long)st[0].rx_bytes);
}

/* ---- a fabric left by a finished job starts afresh for the next one ---- */

static void leave_down(struct peer *p)
{
	setup(p);
	post(p, 0, IBV_WR_RDMA_WRITE, 1, IBV_SEND_SIGNALED, 0, 1000, 0, p->peer.rkey, 0);
	expect_wc(p, 1, IBV_WC_SUCCESS, 2000, NULL);
	ctl(p, "fault A mlx5_0 down");
	sync_send(p, 1);
}

static void find_fresh(struct peer *p)
{
	struct softverbs_nic_stat st[4];
	struct ibv_port_attr pa;

	setup(p);
	CHECK(p, ibv_query_port(p->ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE);
	CHECK(p, softverbs_nic_stats("A", st, 4) == 2 && st[0].state == SOFTVERBS_NIC_UP &&
		     st[0].tx_bytes == 0);
	sync_send(p, 1);
	sync_wait(p, 1);
}

/* ---- shared receive queue: two QPs take from one, limit event, RNR on an empty one ---- */

static void post_srq(struct peer *p, uint64_t wr_id, uint64_t off, uint32_t len)
{
	struct ibv_sge sge = {.addr = (uintptr_t)p->buf + off, .length = len, .lkey = p->mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1}, *bad = NULL;

	CHECK(p, ibv_post_srq_recv(p->srq, &wr, &bad) == 0);
}

static void srq_a(struct peer *p)
{
	uint64_t ids[6] = {0, 1, 2, 3, 4, 5};

	setup(p);
	sync_wait(p, 1);
	/* Six SEND_WITH_IMMs, alternating between the two QPs, each 1000 bytes of seed k. */
	for (int k = 0; k < 6; k++) {
		fill(p->buf + (uint64_t)k * 4096, 1000, (unsigned)k);
		post(p, k % 2, IBV_WR_SEND_WITH_IMM, (uint64_t)k, IBV_SEND_SIGNALED,
		     (uint64_t)k * 4096, 1000, 0, 0, htonl((uint32_t)k));
	}
	expect_wcs(p, ids, 6, IBV_WC_SUCCESS);
	sync_wait(p, 2);
	/* Three WRITE_WITH_IMMs to an SRQ that holds two receives: the third waits for one. */
	for (int k = 0; k < 3; k++)
		post(p, k % 2, IBV_WR_RDMA_WRITE_WITH_IMM, 10 + (uint64_t)k, IBV_SEND_SIGNALED, 0,
		     64, 1 << 20, p->peer.rkey, (uint32_t)k);
	for (int k = 0; k < 3; k++)
		ids[k] = 10 + (uint64_t)k;
	expect_wcs(p, ids, 3, IBV_WC_SUCCESS);
	sync_send(p, 3);
	sync_wait(p, 4);
}

static void srq_b(struct peer *p)
{
	struct ibv_srq_attr sa = {.srq_limit = 4};
	struct pollfd pfd;
	struct ibv_async_event ev;
	struct ibv_recv_wr rwr = {.wr_id = 1}, *bad;
	int per_qp[NQP] = {0};
	bool used[8] = {false};
	struct ibv_wc wc;

	p->want_srq = true;
	setup(p);
	for (int i = 0; i < 8; i++)
		post_srq(p, 100 + (uint64_t)i, (uint64_t)i * 4096, 4096);
	CHECK(p, ibv_modify_srq(p->srq, &sa, IBV_SRQ_LIMIT) == 0);
	memset(&sa, 0, sizeof(sa));
	CHECK(p, ibv_query_srq(p->srq, &sa) == 0 && sa.max_wr == 16 && sa.max_sge == 1 &&
		     sa.srq_limit == 4);
	sync_send(p, 1);
	for (int k = 0; k < 6; k++) {
		int q, i;

		CHECK(p, poll_one(p->cq, &wc, 2000) == 1, "(%d of 6 receives)", k);
		i = (int)wc.wr_id - 100;
		CHECK(p,
		      wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV &&
			  wc.byte_len == 1000 && (wc.wc_flags & IBV_WC_WITH_IMM) && i >= 0 &&
			  i < 8 && !used[i],
		      "(wr_id %llu status %d)", (unsigned long long)wc.wr_id, wc.status);
		used[i] = true;
		for (q = 0; q < NQP && p->qp[q]->qp_num != wc.qp_num; q++)
			;
		CHECK(p, q < NQP && wc.src_qp == p->peer.qpn[q], "(qp 0x%x from 0x%x)", wc.qp_num,
		      wc.src_qp);
		CHECK(p, (int)ntohl(wc.imm_data) % 2 == q, "(message %u on QP %d)",
		      ntohl(wc.imm_data), q);
		CHECK(p, check_fill(p->buf + (uint64_t)i * 4096, 1000, ntohl(wc.imm_data)));
		per_qp[q]++;
	}
	CHECK(p, per_qp[0] == 3 && per_qp[1] == 3);
	/* Two receives left, fewer than the limit of 4: one event, and the limit disarms. */
	pfd = (struct pollfd){.fd = p->ctx->async_fd, .events = POLLIN};
	CHECK(p, poll(&pfd, 1, 1000) == 1, "(no SRQ limit event)");
	CHECK(p, ibv_get_async_event(p->ctx, &ev) == 0);
	CHECK(p, ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && ev.element.srq == p->srq,
	      "(event %d)", ev.event_type);
	ibv_ack_async_event(&ev);
	CHECK(p, p->srq->events_completed == 1);
	CHECK(p, ibv_query_srq(p->srq, &sa) == 0 && sa.srq_limit == 0);
	CHECK(p, poll(&pfd, 1, 50) == 0, "(a second limit event)");
	/* What an SRQ and its QPs refuse. */
	CHECK(p, ibv_post_recv(p->qp[0], &rwr, &bad) == EINVAL && bad == &rwr);
	CHECK(p, ibv_destroy_srq(p->srq) == EBUSY);
	sa.max_wr = 32;
	CHECK(p, ibv_modify_srq(p->srq, &sa, IBV_SRQ_MAX_WR) == EINVAL);
	sa.srq_limit = 16;
	CHECK(p, ibv_modify_srq(p->srq, &sa, IBV_SRQ_LIMIT) == EINVAL);
	sync_send(p, 2);
	/* The two left take two WRITE_WITH_IMMs; the third waits (RNR) until one is posted. */
	for (int k = 0; k < 2; k++) {
		CHECK(p, poll_one(p->cq, &wc, 2000) == 1, "(write_imm %d)", k);
		CHECK(p, wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
			     wc.byte_len == 64 && wc.wr_id >= 100 && wc.wr_id < 108 &&
			     !used[wc.wr_id - 100]);
		used[wc.wr_id - 100] = true;
	}
	expect_no_wc(p, 100);
	post_srq(p, 200, 0, 4096);
	expect_wc(p, 200, IBV_WC_SUCCESS, 2000, &wc);
	CHECK(p, wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && wc.imm_data == 2);
	sync_wait(p, 3);
	for (int q = 0; q < NQP; q++)
		CHECK(p, ibv_destroy_qp(p->qp[q]) == 0);
	CHECK(p, ibv_destroy_srq(p->srq) == 0);
	sync_send(p, 4);
}

/*
 * ---- a send queue slot is free once its completion can be polled ----
 *
 * As ib_write_bw does: the queue is kept full of writes large enough for the engine
 * to execute them, one in SQ_SIG signalled, and each time a completion is polled
 * SQ_SIG more are posted at once, which a queue that frees its slots after the
 * completion refuses (ENOMEM) whenever the engine is preempted between the two.
 */
#define SQ_DEPTH  512 /* make_qp's max_send_wr */
#define SQ_SIG	  1
#define SQ_LEN	  (65536 + 4096)
#define SQ_ROUNDS 20000

static void sq_post_batch(struct peer *p, uint64_t *n)
{
	for (int k = 0; k < SQ_SIG; k++, (*n)++) {
		struct ibv_sge sge = {
		    .addr = (uintptr_t)p->buf, .length = SQ_LEN, .lkey = p->mr->lkey};
		struct ibv_send_wr wr = {.wr_id = *n,
					 .sg_list = &sge,
					 .num_sge = 1,
					 .opcode = IBV_WR_RDMA_WRITE,
					 .send_flags = k == SQ_SIG - 1 ? IBV_SEND_SIGNALED : 0};
		struct ibv_send_wr *bad = NULL;
		int rc;

		wr.wr.rdma.remote_addr = p->peer.addr + (*n % 64) * SQ_LEN;
		wr.wr.rdma.rkey = p->peer.rkey;
		rc = ibv_post_send(p->qp[0], &wr, &bad);
		CHECK(p, rc == 0, "(request %llu: %s, after a completion freed its slots)",
		      (unsigned long long)*n, strerror(rc));
	}
}

static void sq_refill_a(struct peer *p)
{
	uint64_t n = 0;
	struct ibv_wc wc;

	setup(p);
	for (int b = 0; b < SQ_DEPTH / SQ_SIG; b++)
		sq_post_batch(p, &n);
	for (int r = 0; r < SQ_ROUNDS; r++) {
		int got;

		do
			got = ibv_poll_cq(p->cq, 1, &wc);
		while (got == 0);
		CHECK(p, got == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id % SQ_SIG == SQ_SIG - 1,
		      "(wr_id %llu status %d)", (unsigned long long)wc.wr_id, wc.status);
		sq_post_batch(p, &n);
	}
	for (int b = 0; b < SQ_DEPTH / SQ_SIG; b++)
		expect_wc(p, (SQ_ROUNDS + (uint64_t)b) * SQ_SIG + SQ_SIG - 1, IBV_WC_SUCCESS, 5000,
			  NULL);
	sync_send(p, 1);
}

/* ---- completion channels: armed, woken by the other process's completion, at once ---- */

#define CH_ITERS 300

static void ch_post_recv(struct peer *p, uint64_t wr_id)
{
	struct ibv_sge sge = {.addr = (uintptr_t)p->buf, .length = 64, .lkey = p->mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1}, *bad = NULL;

	CHECK(p, ibv_post_recv(p->qp[0], &wr, &bad) == 0);
}

/* Waits up to `ms` for the channel's next event: 1 (its CQ is p->cq) or 0. */
static int ch_event(struct peer *p, int ms)
{
	struct pollfd pfd = {.fd = p->ch->fd, .events = POLLIN};
	struct ibv_cq *cq;
	void *cq_ctx;

	if (poll(&pfd, 1, ms) != 1)
		return 0;
	CHECK(p, ibv_get_cq_event(p->ch, &cq, &cq_ctx) == 0);
	CHECK(p, cq == p->cq && cq_ctx == p);
	ibv_ack_cq_events(cq, 1);
	return 1;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void channel_a(struct peer *p)
{
	static double lat[CH_ITERS];
	struct ibv_cq *cq;
	struct ibv_wc wc;
	void *cq_ctx;
	double med, sent;

	p->want_channel = true;
	setup(p);
	for (int i = 0; i < 3; i++)
		ch_post_recv(p, (uint64_t)i);
	/* Not armed: a completion raises no event, nor does arming after it. */
	sync_send(p, 1);
	sync_wait(p, 1);
	CHECK(p, ch_event(p, 50) == 0, "(event while not armed)");
	CHECK(p, ibv_req_notify_cq(p->cq, 0) == 0);
	CHECK(p, ch_event(p, 50) == 0, "(event for a completion before arming)");
	expect_wc(p, 0, IBV_WC_SUCCESS, 100, NULL);
	/* Armed: the next completion raises one event, however many follow. */
	sync_send(p, 2);
	CHECK(p, ch_event(p, 2000) == 1, "(no event)");
	sync_wait(p, 2);
	CHECK(p, ch_event(p, 50) == 0, "(second event for one arming)");
	expect_wc(p, 1, IBV_WC_SUCCESS, 100, NULL);
	expect_wc(p, 2, IBV_WC_SUCCESS, 100, NULL);
	/* A non-blocking channel answers EAGAIN when there is no event. */
	CHECK(p, fcntl(p->ch->fd, F_SETFL, fcntl(p->ch->fd, F_GETFL) | O_NONBLOCK) == 0);
	errno = 0;
	CHECK(p, ibv_get_cq_event(p->ch, &cq, &cq_ctx) == -1 && errno == EAGAIN);
	CHECK(p, fcntl(p->ch->fd, F_SETFL, fcntl(p->ch->fd, F_GETFL) & ~O_NONBLOCK) == 0);
	expect_no_wc(p, 1);
	/*
	 * How soon the event wakes this process after the peer posted the SEND that
	 * completes here (its post time travels in the message): an owner that watched its
	 * armed CQs every 100 us would take 50 us or more at the median.
	 */
	for (int i = 0; i < CH_ITERS; i++) {
		ch_post_recv(p, 10 + (uint64_t)i);
		CHECK(p, ibv_req_notify_cq(p->cq, 0) == 0);
		sync_send(p, 3);
		CHECK(p, ibv_get_cq_event(p->ch, &cq, &cq_ctx) == 0 && cq == p->cq);
		lat[i] = now_ms();
		ibv_ack_cq_events(cq, 1);
		expect_wc(p, 10 + (uint64_t)i, IBV_WC_SUCCESS, 100, &wc);
		memcpy(&sent, p->buf, sizeof(sent));
		lat[i] = (lat[i] - sent) * 1e3;
	}
	qsort(lat, CH_ITERS, sizeof(lat[0]), cmp_double);
	med = lat[CH_ITERS / 2];
	fprintf(stderr, "  channel wake: median %.1f us, 90th %.1f us\n", med,
		lat[CH_ITERS * 9 / 10]);
	CHECK(p, med < 40, "(median wake %.1f us)", med);
	sync_send(p, 4);
	CHECK(p, ibv_destroy_qp(p->qp[0]) == 0 && ibv_destroy_qp(p->qp[1]) == 0);
	CHECK(p, ibv_destroy_comp_channel(p->ch) == EBUSY, "(a CQ still uses it)");
	CHECK(p, ibv_destroy_cq(p->cq) == 0 && ibv_destroy_comp_channel(p->ch) == 0);
}

static void channel_b(struct peer *p)
{
	setup(p);
	sync_wait(p, 1);
	post(p, 0, IBV_WR_SEND, 1, IBV_SEND_SIGNALED, 0, 8, 0, 0, 0);
	expect_wc(p, 1, IBV_WC_SUCCESS, 2000, NULL);
	sync_send(p, 1);
	sync_wait(p, 2);
	post(p, 0, IBV_WR_SEND, 2, IBV_SEND_SIGNALED, 0, 8, 0, 0, 0);
	post(p, 0, IBV_WR_SEND, 3, IBV_SEND_SIGNALED, 0, 8, 0, 0, 0);
	expect_wc(p, 2, IBV_WC_SUCCESS, 2000, NULL);
	expect_wc(p, 3, IBV_WC_SUCCESS, 2000, NULL);
	sync_send(p, 2);
	for (int i = 0; i < CH_ITERS; i++) {
		double t;

		sync_wait(p, 3);
		t = now_ms();
		memcpy(p->buf, &t, sizeof(t));
		post(p, 0, IBV_WR_SEND, 10, IBV_SEND_SIGNALED, 0, 8, 0, 0, 0);
		expect_wc(p, 10, IBV_WC_SUCCESS, 2000, NULL);
	}
	sync_wait(p, 4);
}

struct test {
	const char *name;
	role_fn a, b;
	const char *env; /* NAME=VALUE;... for both processes */
	bool b_dies;
	const char *node_b; /* B's node name, default "B" */
	bool keep;	    /* leave the fabric to the next test */
};

#define SHAPED_2G "SOFTVERBS_SHAPING=1;SOFTVERBS_NICS=mlx5_0:2,mlx5_1:2"

static const struct test tests[] = {
    {.name = "write", .a = write_a, .b = write_b},
    {.name = "order", .a = order_a, .b = order_b},
    {.name = "mixed_order", .a = mixed_a, .b = mixed_b},
    {.name = "err_in_flight", .a = err_busy_a, .b = idle_b},
    {.name = "read", .a = read_a, .b = read_b},
    {.name = "send", .a = send_a, .b = send_b},
    {.name = "rnr", .a = rnr_a, .b = rnr_b},
    {.name = "access", .a = access_a, .b = access_b},
    {.name = "counters", .a = counters_a, .b = counters_b},
    {.name = "shaping", .a = shaping_a, .b = idle_b, .env = SHAPED_2G},
    {.name = "slow", .a = slow_a, .b = idle_b},
    {.name = "slow_receiver", .a = slow_rx_a, .b = idle_b},
    {.name = "down", .a = down_a, .b = down_b},
    {.name = "blackhole", .a = blackhole_a, .b = blackhole_b},
    {.name = "flap", .a = flap_a, .b = idle_b},
    {.name = "peer_death", .a = death_a, .b = death_b, .b_dies = true},
    {.name = "scheduled_fault",
     .a = sched_a,
     .b = idle_b,
     .env = "SOFTVERBS_FAULT=B/mlx5_0=blackhole@300"},
    {.name = "nccl_pattern", .a = np_sender, .b = np_receiver},
    {.name = "shared_nic", .a = shared_nic, .b = shared_nic, .env = SHAPED_2G, .node_b = "A"},
    {.name = "reuse_left_down", .a = leave_down, .b = idle_b, .keep = true},
    {.name = "reuse_starts_fresh", .a = find_fresh, .b = find_fresh, .node_b = "A"},
    {.name = "srq", .a = srq_a, .b = srq_b},
    {.name = "sq_refill", .a = sq_refill_a, .b = idle_b},
    {.name = "channel", .a = channel_a, .b = channel_b},
};

static void child_env(const struct test *t, char role)
{
	char buf[512], *save = NULL, *tok, node[2] = {role, 0};
	const char *env = t->env;

	setenv("SOFTVERBS_FABRIC", fabric, 1);
	setenv("SOFTVERBS_NODE", role == 'B' && t->node_b ? t->node_b : node, 1);
	setenv("SOFTVERBS_NICS", "mlx5_0:100,mlx5_1:100", 1);
	setenv("SOFTVERBS_TIME_SCALE", "0.2", 1);
	unsetenv("SOFTVERBS_SHAPING");
	unsetenv("SOFTVERBS_FAULT");
	if (!env)
		return;
	snprintf(buf, sizeof(buf), "%s", env);
	for (tok = strtok_r(buf, ";", &save); tok; tok = strtok_r(NULL, ";", &save))
		putenv(strdup(tok));
}

static pid_t spawn(const struct test *t, char role, int sock, int other)
{
	pid_t pid = fork();

	if (pid == 0) {
		struct peer p = {.role = role, .sock = sock};

		close(other);
		child_env(t, role);
		alarm(30);
		(role == 'A' ? t->a : t->b)(&p);
		exit(0);
	}
	return pid;
}

static bool run(const struct test *t)
{
	static int seq;
	static bool kept;
	int sv[2], st_a = 0, st_b = 0;
	double t0 = now_ms();
	char path[96];
	pid_t a, b;
	bool ok;

	if (!kept)
		snprintf(fabric, sizeof(fabric), "svtest-%d-%d", (int)getpid(), seq++);
	kept = t->keep;
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
		return false;
	a = spawn(t, 'A', sv[0], sv[1]);
	b = spawn(t, 'B', sv[1], sv[0]);
	close(sv[0]);
	close(sv[1]);
	waitpid(a, &st_a, 0);
	waitpid(b, &st_b, 0);
	ok = WIFEXITED(st_a) && WEXITSTATUS(st_a) == 0 &&
	     (t->b_dies ? WIFSIGNALED(st_b) && WTERMSIG(st_b) == SIGKILL
			: WIFEXITED(st_b) && WEXITSTATUS(st_b) == 0);
	snprintf(path, sizeof(path), "/%s", fabric);
	if (!t->keep)
		shm_unlink(path);
	printf("%s %s (%.0f ms)\n", ok ? "ok  " : "FAIL", t->name, now_ms() - t0);
	if (!ok)
		printf("     A: %s %d, B: %s %d\n", WIFSIGNALED(st_a) ? "signal" : "exit",
		       WIFSIGNALED(st_a) ? WTERMSIG(st_a) : WEXITSTATUS(st_a),
		       WIFSIGNALED(st_b) ? "signal" : "exit",
		       WIFSIGNALED(st_b) ? WTERMSIG(st_b) : WEXITSTATUS(st_b));
	fflush(stdout);
	return ok;
}

int main(int argc, char **argv)
{
	ssize_t n = readlink("/proc/self/exe", ctl_path, sizeof(ctl_path) - 64);
	int failed = 0, ran = 0;

	if (n <= 0)
		return 2;
	ctl_path[n] = '\0';
	*strrchr(ctl_path, '/') = '\0';
	strcat(ctl_path, "/../../bin/softverbs-ctl");
	setvbuf(stdout, NULL, _IOLBF, 0);
	for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
		bool pick = argc == 1;

		for (int k = 1; k < argc; k++)
			pick |= strcmp(argv[k], tests[i].name) == 0;
		if (!pick)
			continue;
		ran++;
		failed += !run(&tests[i]);
	}
	printf("%d tests, %d failed\n", ran, failed);
	return failed || !ran ? 1 : 0;
}
