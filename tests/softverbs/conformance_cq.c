/*
 * Conformance tests of completion queues: send queue slots free once their
 * completion can be polled, a CQ beyond the fabric's inline ring filled by the other
 * process (and the ring of a dead owner), and completion channels woken by the other
 * process.
 */
#include "tests/softverbs/conformance.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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

void sq_refill_a(struct peer *p)
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

/*
 * ---- a CQ beyond the fabric's inline ring (NCCL's port failover asks for 4608 over
 * three fused NICs), filled by the other process before its owner polls ----
 */

#define BIGCQ_N	 65536
#define BIGCQ_RQ 2048 /* receives per QP: NCCL's failover asks 256 per device */

/* Mappings of CQ rings of their own (memfds) in this process. */
static int ring_maps(struct peer *p)
{
	char line[512];
	FILE *f = fopen("/proc/self/maps", "r");
	int n = 0;

	CHECK(p, f != NULL);
	while (fgets(line, sizeof(line), f))
		n += strstr(line, "memfd:softverbs-cq") != NULL;
	fclose(f);
	return n;
}

/* A asks B for `n` receive completions (n = 0: done) and waits until B has them sent. */
static void bigcq_ask(struct peer *p, int n)
{
	sync_send(p, n);
	if (n)
		sync_wait(p, -1);
}

/* `n` receive completions, wr_id and immediate data first..., in order, then none. */
static void bigcq_drain(struct peer *p, uint32_t first, int n)
{
	static struct ibv_wc wc[512];
	int got = 0;

	for (double end = now_ms() + 5000; got < n && now_ms() < end;) {
		int k = ibv_poll_cq(p->cq, 512, wc);

		CHECK(p, k >= 0);
		for (int i = 0; i < k; i++, got++) {
			uint32_t want = first + (uint32_t)got;

			CHECK(p, wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == want,
			      "(completion %d: wr_id %llu status %d, want %u)", got,
			      (unsigned long long)wc[i].wr_id, wc[i].status, want);
			CHECK(p, wc[i].opcode == IBV_WC_RECV &&
				     (wc[i].wc_flags & IBV_WC_WITH_IMM) &&
				     wc[i].imm_data == htonl(want) && wc[i].byte_len == 0 &&
				     wc[i].qp_num == p->qp[0]->qp_num);
		}
	}
	CHECK(p, got == n, "(%d of %d completions)", got, n);
	expect_no_wc(p, 20);
}

static void bigcq_recvs(struct peer *p, uint32_t first, int n)
{
	for (int k = 0; k < n; k++)
		post_recv(p, 0, first + (uint32_t)k);
}

void bigcq_a(struct peer *p)
{
	uint32_t next;

	p->nqp = 1;
	p->want_cqe = BIGCQ_N;
	p->want_rq = BIGCQ_RQ;
	setup(p);
	CHECK(p, p->cq->cqe == BIGCQ_N);
	/* B fills it a receive queue at a time; A does not poll. */
	for (next = 0; next < BIGCQ_N; next += BIGCQ_RQ) {
		bigcq_recvs(p, next, BIGCQ_RQ);
		bigcq_ask(p, BIGCQ_RQ);
	}
	CHECK(p, ring_maps(p) == 1);
	/* One more finds it full: that completion is lost (and logged), its receive taken. */
	bigcq_recvs(p, next++, 1);
	bigcq_ask(p, 1);
	bigcq_drain(p, 0, BIGCQ_N);
	/* The CQ goes on after the overrun. */
	bigcq_recvs(p, next, 1);
	bigcq_ask(p, 1);
	bigcq_drain(p, next++, 1);
	/* Grown with completions queued, while B has the old ring mapped. */
	bigcq_recvs(p, next, BIGCQ_RQ);
	bigcq_ask(p, BIGCQ_RQ);
	CHECK(p, ibv_resize_cq(p->cq, 100000) == 0 && p->cq->cqe == 100000);
	CHECK(p, ring_maps(p) == 1, "(the old ring is unmapped)");
	bigcq_recvs(p, next + BIGCQ_RQ, BIGCQ_RQ);
	bigcq_ask(p, BIGCQ_RQ);
	bigcq_drain(p, next, 2 * BIGCQ_RQ);
	bigcq_ask(p, 0);
	/* The CQ stays until B has counted its mappings: destroyed, B's progress thread
	 * would unmap the ring before B looks (a clean-clone CI run with a hog saw 0). */
	sync_wait(p, 9);
}

/* SEND_WITH_IMMs of no data, immediate = wr_id = 0, 1, ..., 256 a batch, as A asks. */
void bigcq_b(struct peer *p)
{
	uint32_t next = 0;
	int n;

	p->nqp = 1;
	setup(p);
	while (read(p->sock, &n, sizeof(n)) == sizeof(n) && n > 0) {
		for (int k = 0; k < n; k++, next++) {
			bool last = k == n - 1 || k % 256 == 255;

			post(p, 0, IBV_WR_SEND_WITH_IMM, next, last ? IBV_SEND_SIGNALED : 0, 0, 0,
			     0, 0, htonl(next));
			if (last)
				expect_wc(p, next, IBV_WC_SUCCESS, 5000, NULL);
		}
		sync_send(p, -1);
	}
	CHECK(p, n == 0);
	/* B placed A's completions: it maps A's ring, the one after the resize only. */
	CHECK(p, ring_maps(p) == 1, "(%d rings mapped)", ring_maps(p));
	sync_send(p, 9);
}

/* The owner of a large CQ dies: the peer that mapped its ring lets it go. */
void bigcq_dies_a(struct peer *p)
{
	char c;

	p->nqp = 1;
	setup(p);
	post(p, 0, IBV_WR_RDMA_WRITE_WITH_IMM, 1, IBV_SEND_SIGNALED, 0, 64, 0, p->peer.rkey, 7);
	expect_wc(p, 1, IBV_WC_SUCCESS, 2000, NULL);
	CHECK(p, ring_maps(p) == 1, "(A placed B's completion in B's ring)");
	sync_send(p, 1);
	CHECK(p, read(p->sock, &c, 1) == 0, "(B should have died)");
	/* Reaping (every 200 ms) frees B's CQ slot; the same tick unmaps the ring. */
	for (double end = now_ms() + 3000; ring_maps(p) && now_ms() < end;)
		usleep(10000);
	CHECK(p, ring_maps(p) == 0, "(the dead owner's ring is still mapped)");
}

void bigcq_dies_b(struct peer *p)
{
	p->nqp = 1;
	p->want_cqe = 4096;
	setup(p);
	post_recv(p, 0, 9);
	expect_wc(p, 9, IBV_WC_SUCCESS, 2000, NULL);
	CHECK(p, ring_maps(p) == 1);
	sync_wait(p, 1);
	raise(SIGKILL);
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

void channel_a(struct peer *p)
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
	/* An event-driven wake takes tens of microseconds; a poller's tick would take a
	 * millisecond. 40 us failed once on a 2-core clean-clone CI run (43.3 us). */
	CHECK(p, med < 200, "(median wake %.1f us)", med);
	sync_send(p, 4);
	for (int q = 0; q < p->nqp; q++)
		CHECK(p, ibv_destroy_qp(p->qp[q]) == 0);
	CHECK(p, ibv_destroy_comp_channel(p->ch) == EBUSY, "(a CQ still uses it)");
	CHECK(p, ibv_destroy_cq(p->cq) == 0 && ibv_destroy_comp_channel(p->ch) == 0);
}

void channel_b(struct peer *p)
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
