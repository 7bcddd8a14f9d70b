/*
 * Conformance tests of RDMA WRITE and READ: immediate data, zero length, chains,
 * several SGEs, inline; ordering of a long stream and of mixed large and small
 * requests; READ; access errors (bad rkey, out of bounds).
 */
#include "tests/softverbs/conformance.h"

#include <arpa/inet.h>
#include <string.h>

/* ---- write, immediate data, zero length, chains, multiple SGEs, inline ---- */

void write_a(struct peer *p)
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

void write_b(struct peer *p)
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

void order_a(struct peer *p)
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

void order_b(struct peer *p)
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

void mixed_a(struct peer *p)
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

void mixed_b(struct peer *p)
{
	struct ibv_wc wc;

	setup(p);
	post_recv(p, 0, 1);
	expect_wc(p, 1, IBV_WC_SUCCESS, 10000, &wc);
	CHECK(p, wc.imm_data == 5);
	CHECK(p, check_fill(p->buf, 7u << 20, 77), "(data incomplete at IMM)");
	sync_send(p, 1);
}

/* ---- RDMA READ ---- */

void read_a(struct peer *p)
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

void read_b(struct peer *p)
{
	setup(p);
	fill(p->buf, BUF_LEN, 3);
	sync_send(p, 1);
	sync_wait(p, 2);
	expect_no_wc(p, 10);
}

/* ---- access errors: bad rkey, out of bounds ---- */

void access_a(struct peer *p)
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

void access_b(struct peer *p)
{
	setup(p);
	sync_wait(p, 1);
	for (size_t i = 0; i < BUF_LEN; i += 4096)
		CHECK(p, p->buf[i] == 'B' && p->buf[BUF_LEN - 1] == 'B', "(target written)");
	CHECK(p, qp_state(p, 0) == IBV_QPS_RTS, "(responder QP left alone)");
	expect_no_wc(p, 10);
}
