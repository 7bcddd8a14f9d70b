/*
 * Conformance tests of QP states: modify_qp(ERR) with requests in flight (each
 * completes once, in order), and a QP taken ERR -> RESET -> RTS, whose old flushes
 * leave the CQ it shares.
 */
#include "tests/softverbs/conformance.h"

#include <stdio.h>
#include <unistd.h>

/*
 * modify_qp(ERR) while the engine is copying: every request completes exactly once,
 * in order, those done before the error with success and the rest flushed.
 */
void err_busy_a(struct peer *p)
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

/* Polls exactly these completions, in this order, and then nothing. */
static void expect_only(struct peer *p, const uint64_t *ids, const int *status, int n)
{
	struct ibv_wc wc;

	for (int i = 0; i < n; i++) {
		CHECK(p, poll_one(p->cq, &wc, 1000) == 1, "(completion %d missing)", i);
		CHECK(p, wc.wr_id == ids[i] && (int)wc.status == status[i],
		      "(completion %d: wr_id %llu status %s, want wr_id %llu status %s)", i,
		      (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status),
		      (unsigned long long)ids[i], ibv_wc_status_str(status[i]));
	}
	CHECK(p, ibv_poll_cq(p->cq, 1, &wc) == 0, "(left: wr_id %llu status %s)",
	      (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
}

static void to_state(struct peer *p, int q, enum ibv_qp_state st)
{
	struct ibv_qp_attr a = {.qp_state = st};

	CHECK(p, ibv_modify_qp(p->qp[q], &a, IBV_QP_STATE) == 0);
}

/*
 * A QP taken ERR -> RESET -> RTS leaves no flush of its last life in the CQ it shares
 * with two other QPs, whose completions (a success, another QP's flushes) stay in order;
 * the reused QP's first completions are its new traffic.
 */
void reset_clean_a(struct peer *p)
{
	struct ibv_qp_attr a = {
	    .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = ACCESS_RW};
	const uint64_t kept[] = {11, 12, 21, 22};
	const int kept_st[] = {IBV_WC_SUCCESS, IBV_WC_SUCCESS, IBV_WC_WR_FLUSH_ERR,
			       IBV_WC_WR_FLUSH_ERR};
	const uint64_t fresh[] = {5, 6};
	const int fresh_st[] = {IBV_WC_SUCCESS, IBV_WC_SUCCESS};

	setup(p);
	for (int i = 1; i <= 4; i++)
		post_recv(p, 0, (uint64_t)i);
	post_recv(p, 2, 21);
	post_recv(p, 2, 22);
	/* Completions of three QPs interleaved in the one CQ, none polled yet. */
	post(p, 1, IBV_WR_RDMA_WRITE, 11, IBV_SEND_SIGNALED, 0, 64, 0, p->peer.rkey, 0);
	usleep(300000);		     /* it lands and is acknowledged in microseconds */
	to_state(p, 0, IBV_QPS_ERR); /* flushes 1..4 */
	post(p, 1, IBV_WR_RDMA_WRITE, 12, IBV_SEND_SIGNALED, 0, 64, 0, p->peer.rkey, 0);
	usleep(300000);
	to_state(p, 2, IBV_QPS_ERR); /* flushes 21, 22 */
	to_state(p, 0, IBV_QPS_RESET);
	expect_only(p, kept, kept_st, 4);

	/* The same QP again: RESET -> INIT -> RTR -> RTS, then traffic both ways. */
	CHECK(p, ibv_modify_qp(p->qp[0], &a,
			       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				   IBV_QP_ACCESS_FLAGS) == 0);
	connect_qp(p, 0);
	{
		struct ibv_sge sge = {.addr = (uintptr_t)p->buf, .length = 64, .lkey = p->mr->lkey};
		struct ibv_recv_wr wr = {.wr_id = 5, .sg_list = &sge, .num_sge = 1}, *bad;

		CHECK(p, ibv_post_recv(p->qp[0], &wr, &bad) == 0);
	}
	sync_send(p, 1); /* B sends to it */
	sync_wait(p, 2);
	post(p, 0, IBV_WR_RDMA_WRITE, 6, IBV_SEND_SIGNALED, 0, 64, 0, p->peer.rkey, 0);
	expect_only(p, fresh, fresh_st, 2);
	/* RESET with nothing of its own queued leaves the CQ as it is. */
	to_state(p, 0, IBV_QPS_RESET);
	CHECK(p, ibv_poll_cq(p->cq, 1, &(struct ibv_wc){0}) == 0);
	sync_send(p, 3);
}

void reset_clean_b(struct peer *p)
{
	struct ibv_wc wc;

	setup(p);
	sync_wait(p, 1);
	post(p, 0, IBV_WR_SEND, 7, IBV_SEND_SIGNALED, 0, 32, 0, 0, 0);
	CHECK(p, poll_one(p->cq, &wc, 2000) == 1 && wc.wr_id == 7 && wc.status == IBV_WC_SUCCESS,
	      "(status %s)", ibv_wc_status_str(wc.status));
	sync_send(p, 2);
	sync_wait(p, 3);
}
