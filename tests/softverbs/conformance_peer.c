/*
 * The steps the conformance tests share (conformance.h): opening a NIC and connecting
 * RC QPs with the other process over the socketpair (setup), softverbs-ctl, posting,
 * polling and expecting completions and async events, and the B that only sets up
 * and waits (idle_b).
 */
#include "tests/softverbs/conformance.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/* Polls one completion for up to `ms`; returns 1 or 0. */
int poll_one(struct ibv_cq *cq, struct ibv_wc *wc, double ms)
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

void ctl(struct peer *p, const char *args)
{
	char cmd[PATH_MAX + 256];

	snprintf(cmd, sizeof(cmd), "%s --fabric %s %s >/dev/null", ctl_path, fabric, args);
	CHECK(p, system(cmd) == 0, "(%s)", cmd);
}

/* softverbs-ctl's exit status. */
int ctl_status(struct peer *p, const char *args)
{
	char cmd[PATH_MAX + 256];
	int st;

	snprintf(cmd, sizeof(cmd), "%s --fabric %s %s >/dev/null 2>&1", ctl_path, fabric, args);
	st = system(cmd);
	CHECK(p, st != -1 && WIFEXITED(st), "(%s)", cmd);
	return WEXITSTATUS(st);
}

/* Waits for one async event of a context; returns its type or -1 after `ms`. */
int ctx_event(struct peer *p, struct ibv_context *ctx, int ms)
{
	struct pollfd pfd = {.fd = ctx->async_fd, .events = POLLIN};
	struct ibv_async_event ev;
	int type;

	if (poll(&pfd, 1, ms) != 1)
		return -1;
	CHECK(p, ibv_get_async_event(ctx, &ev) == 0);
	type = ev.event_type;
	if (type == IBV_EVENT_PORT_ERR || type == IBV_EVENT_PORT_ACTIVE)
		CHECK(p, ev.element.port_num == 1);
	ibv_ack_async_event(&ev);
	return type;
}

int async_event(struct peer *p, int ms)
{
	return ctx_event(p, p->ctx, ms);
}

/* The QPs' transport timeout: TIMEOUT, or SVTEST_TIMEOUT for a test that needs longer. */
static int qp_timeout(void)
{
	const char *v = getenv("SVTEST_TIMEOUT");

	return v ? atoi(v) : TIMEOUT;
}

double retry_ms(void)
{
	return 4.096e-3 * (1 << qp_timeout()) * (RETRY + 1) * SCALE;
}

void connect_qp(struct peer *p, int i)
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
	a.timeout = (uint8_t)qp_timeout();
	a.retry_cnt = RETRY;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	CHECK(p, ibv_modify_qp(p->qp[i], &a,
			       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				   IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

struct ibv_qp *make_qp(struct peer *p)
{
	struct ibv_qp_init_attr init = {
	    .send_cq = p->cq,
	    .recv_cq = p->cq,
	    .cap = {.max_send_wr = 512,
		    .max_recv_wr = p->want_rq ? (uint32_t)p->want_rq : 256,
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

/* Opens the first NIC, makes nqp (default NQP) QPs and connects them to the peer's. */
void setup(struct peer *p)
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
	p->cq = ibv_create_cq(p->ctx, p->want_cqe ? p->want_cqe : 512, p, p->ch, 0);
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
	if (!p->nqp)
		p->nqp = NQP;
	for (int i = 0; i < p->nqp; i++) {
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
	for (int i = 0; i < p->nqp; i++)
		connect_qp(p, i);
	sync_send(p, 0);
	sync_wait(p, 0);
}

void post(struct peer *p, int q, int opcode, uint64_t wr_id, unsigned flags, uint64_t loff,
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

void post_recv(struct peer *p, int q, uint64_t wr_id)
{
	struct ibv_recv_wr wr = {.wr_id = wr_id}, *bad = NULL;

	CHECK(p, ibv_post_recv(p->qp[q], &wr, &bad) == 0);
}

void expect_wc(struct peer *p, uint64_t wr_id, int status, double ms, struct ibv_wc *out)
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
void expect_wcs(struct peer *p, const uint64_t *ids, int n, int status)
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

void expect_no_wc(struct peer *p, double ms)
{
	struct ibv_wc wc;

	CHECK(p, poll_one(p->cq, &wc, ms) == 0, "(unexpected wr_id %llu status %d)",
	      (unsigned long long)wc.wr_id, wc.status);
}

int qp_state(struct peer *p, int q)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr init;

	CHECK(p, ibv_query_qp(p->qp[q], &a, IBV_QP_STATE, &init) == 0);
	return a.qp_state;
}

void idle_b(struct peer *p)
{
	setup(p);
	sync_wait(p, 1);
}

int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}
