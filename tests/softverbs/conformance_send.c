/*
 * Conformance tests of SEND and receive queues: SEND / SEND_WITH_IMM into posted
 * receives, RNR, NCCL's pattern (zero-SGE receives, FIFO writes, an async-event
 * thread), and a shared receive queue (two QPs, limit event, RNR on an empty one).
 */
#include "tests/softverbs/conformance.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

/* ---- SEND / SEND_WITH_IMM into posted receives with SGEs ---- */

void send_a(struct peer *p)
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

void send_b(struct peer *p)
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

void rnr_a(struct peer *p)
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

void rnr_b(struct peer *p)
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

void np_sender(struct peer *p)
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

void np_receiver(struct peer *p)
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

/* ---- shared receive queue: two QPs take from one, limit event, RNR on an empty one ---- */

static void post_srq(struct peer *p, uint64_t wr_id, uint64_t off, uint32_t len)
{
	struct ibv_sge sge = {.addr = (uintptr_t)p->buf + off, .length = len, .lkey = p->mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1}, *bad = NULL;

	CHECK(p, ibv_post_srq_recv(p->srq, &wr, &bad) == 0);
}

void srq_a(struct peer *p)
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

void srq_b(struct peer *p)
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
