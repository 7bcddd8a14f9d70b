/*
 * Unit tests of repair/model/qp_shadow: recording and retiring in NCCL 2.28's exact
 * work-request patterns (zero-SGE receives per request, unsignalled data
 * WRITEs plus a signalled WRITE_WITH_IMM per QP with packed wr_ids, mostly
 * unsignalled clear-to-send writes, the 1-byte flush READ), ring wrap-around,
 * sq_sig_all, partial posts, refused atomics, and the plan's rules one by one.
 * The randomised end-to-end check is test_qp_shadow_model.c.
 */
#include "repair/model/qp_shadow.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static struct r2cc_qp_shadow *mk(uint32_t sq, uint32_t rq, bool sig_all, uint32_t max_inline)
{
	struct r2cc_qp_shadow_attr a = {.max_send_wr = sq,
					.max_recv_wr = rq,
					.max_send_sge = 1,
					.max_recv_sge = 1,
					.max_inline_data = max_inline,
					.sq_sig_all = sig_all};
	struct r2cc_qp_shadow *sh = NULL;
	cr_assert_eq(r2cc_qp_shadow_create(&a, &sh), 0);
	return sh;
}

static struct ibv_wc wc_of(uint64_t wr_id, enum ibv_wc_opcode op)
{
	struct ibv_wc wc;
	memset(&wc, 0, sizeof(wc));
	wc.wr_id = wr_id;
	wc.status = IBV_WC_SUCCESS;
	wc.opcode = op;
	return wc;
}

/* One write request: opcode, flags, wr_id, remote target, one SGE (len 0: none). */
static void mkwr(struct ibv_send_wr *wr, struct ibv_sge *sge, enum ibv_wr_opcode op, unsigned flags,
		 uint64_t wr_id, uint64_t raddr, uint32_t rkey, uint64_t laddr, uint32_t len,
		 uint32_t lkey)
{
	memset(wr, 0, sizeof(*wr));
	wr->opcode = op;
	wr->send_flags = flags;
	wr->wr_id = wr_id;
	wr->wr.rdma.remote_addr = raddr;
	wr->wr.rdma.rkey = rkey;
	sge->addr = laddr;
	sge->length = len;
	sge->lkey = lkey;
	wr->sg_list = sge;
	wr->num_sge = len ? 1 : 0;
}

static int post1(struct r2cc_qp_shadow *sh, enum ibv_wr_opcode op, unsigned flags, uint64_t wr_id,
		 uint64_t raddr, uint32_t len)
{
	struct ibv_send_wr wr;
	struct ibv_sge sge;
	mkwr(&wr, &sge, op, flags, wr_id, raddr, 0x77, 0x1000 + raddr, len, 0x55);
	if (op == IBV_WR_RDMA_WRITE_WITH_IMM)
		wr.imm_data = htobe32(len);
	return r2cc_qp_shadow_post_send(sh, &wr, NULL);
}

static struct r2cc_qp_shadow_plan plan_k(struct r2cc_qp_shadow *sh, uint64_t k)
{
	struct r2cc_qp_shadow_plan p;
	struct r2cc_qp_shadow_plan_in in = {.peer_recv_consumed = k};
	cr_assert_eq(r2cc_qp_shadow_plan_build(sh, &in, &p), 0);
	return p;
}

Test(qp_shadow, create_rounds_capacity_and_tracks_nothing)
{
	struct r2cc_qp_shadow *sh = mk(500, 200, false, 0);
	cr_assert_eq(r2cc_qp_shadow_send_outstanding(sh), 0);
	/* 500 rounds up to 512: 512 fit, the 513th does not. */
	for (int i = 0; i < 512; i++)
		cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, 0, i, 64 * i, 64), 0);
	cr_assert_eq(r2cc_qp_shadow_send_outstanding(sh), 512);
	cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, 0, 512, 0, 64), -ENOSPC);
	cr_assert_eq(r2cc_qp_shadow_error(sh), -ENOSPC);
	struct r2cc_qp_shadow_plan p;
	struct r2cc_qp_shadow_plan_in in = {0};
	cr_assert_eq(r2cc_qp_shadow_plan_build(sh, &in, &p), -ENOSPC);
	r2cc_qp_shadow_destroy(sh);
	cr_assert_eq(r2cc_qp_shadow_create(NULL, &sh), -EINVAL);
}

/* Receiver: per request one zero-SGE receive with wr_id = slot. */
Test(qp_shadow, nccl_receives_retire_in_order)
{
	struct r2cc_qp_shadow *sh = mk(512, 256, false, 0);
	for (uint64_t slot = 0; slot < 6; slot++) {
		struct ibv_recv_wr r = {.wr_id = slot, .sg_list = NULL, .num_sge = 0};
		cr_assert_eq(r2cc_qp_shadow_post_recv(sh, &r, NULL), 0);
	}
	cr_assert_eq(r2cc_qp_shadow_recv_outstanding(sh), 6);
	struct ibv_wc wc = wc_of(0, IBV_WC_RECV_RDMA_WITH_IMM);
	cr_assert_eq(r2cc_qp_shadow_wc(sh, &wc), 0);
	wc = wc_of(1, IBV_WC_RECV);
	cr_assert_eq(r2cc_qp_shadow_recv_completed(sh, &wc), 0);
	/* Flush errors retire nothing. */
	wc = wc_of(2, IBV_WC_RECV);
	wc.status = IBV_WC_WR_FLUSH_ERR;
	cr_assert_eq(r2cc_qp_shadow_wc(sh, &wc), 0);
	cr_assert_eq(r2cc_qp_shadow_recv_consumed(sh), 2);
	struct r2cc_qp_shadow_stats st;
	r2cc_qp_shadow_get_stats(sh, &st);
	cr_assert_eq(st.recv_imm, 1);
	cr_assert_eq(st.recv_posted, 6);

	struct r2cc_qp_shadow_plan p = plan_k(sh, 0);
	cr_assert_eq(p.n_recv, 4);
	for (size_t i = 0; i < p.n_recv; i++) {
		cr_assert_eq(p.recv[i].wr_id, 2 + i);
		cr_assert_eq(p.recv[i].num_sge, 0);
		struct ibv_recv_wr r;
		struct ibv_sge sg;
		r2cc_qp_shadow_plan_recv_wr(&p, i, &r, &sg);
		cr_assert_eq(r.wr_id, 2 + i);
		cr_assert_eq(r.num_sge, 0);
	}
	cr_assert_eq(p.n_send, 0);
	r2cc_qp_shadow_plan_free(&p);

	/* Out of order (wrong wr_id) breaks the shadow. */
	wc = wc_of(9, IBV_WC_RECV_RDMA_WITH_IMM);
	cr_assert_eq(r2cc_qp_shadow_recv_completed(sh, &wc), -EPROTO);
	cr_assert_eq(r2cc_qp_shadow_error(sh), -EPROTO);
	r2cc_qp_shadow_destroy(sh);
}

/*
 * Sender, NCCL's multi-send: for nreqs = 2 receives in one slot group, an
 * unsignalled WRITE per request then a signalled WRITE_WITH_IMM of the sizes
 * array, chained, wr_id packing the slots (slot | slot << 8). NCCL reuses the
 * arrays right after the post: the shadow must have copied them.
 */
Test(qp_shadow, nccl_multisend_chain_copied_and_retired)
{
	struct r2cc_qp_shadow *sh = mk(512, 256, false, 0);
	struct ibv_send_wr wrs[3];
	struct ibv_sge sges[3];
	uint64_t wr_id = 5 | 5ull << 8;
	mkwr(&wrs[0], &sges[0], IBV_WR_RDMA_WRITE, 0, 5, 0xA000, 0x11, 0x1000, 4096, 0x21);
	mkwr(&wrs[1], &sges[1], IBV_WR_RDMA_WRITE, 0, wr_id, 0xB000, 0x12, 0x2000, 1024, 0x21);
	mkwr(&wrs[2], &sges[2], IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SIGNALED, wr_id, 0xC000, 0x13,
	     0x3000, 8, 0x22);
	wrs[2].imm_data = htobe32(4096);
	wrs[0].next = &wrs[1];
	wrs[1].next = &wrs[2];
	cr_assert_eq(r2cc_qp_shadow_post_send(sh, wrs, NULL), 0);
	memset(wrs, 0xab, sizeof(wrs));
	memset(sges, 0xcd, sizeof(sges));

	struct r2cc_qp_shadow_plan p = plan_k(sh, 0);
	cr_assert_eq(p.n_send, 3);
	cr_assert_eq(p.n_synth, 0);
	cr_assert_eq(p.send[0].sge[0].addr, 0x1000);
	cr_assert_eq(p.send[0].sge[0].length, 4096);
	cr_assert_eq(p.send[1].remote_addr, 0xB000);
	cr_assert_eq(p.send[1].rkey, 0x12);
	cr_assert_eq(p.send[2].wr_id, wr_id);
	cr_assert_eq(p.send[2].opcode, IBV_WR_RDMA_WRITE_WITH_IMM);
	cr_assert_eq(be32toh(p.send[2].imm_data), 4096);
	cr_assert_eq(p.send[2].msgs, 1);
	cr_assert_eq(p.bytes_reposted, 4096 + 1024 + 8);
	struct ibv_send_wr out;
	struct ibv_sge osg;
	r2cc_qp_shadow_plan_send_wr(&p, 2, &out, &osg);
	cr_assert_eq(out.opcode, IBV_WR_RDMA_WRITE_WITH_IMM);
	cr_assert_eq(out.send_flags, IBV_SEND_SIGNALED);
	cr_assert_eq(out.wr.rdma.remote_addr, 0xC000);
	cr_assert_eq(out.num_sge, 1);
	cr_assert_eq(osg.lkey, 0x22);
	cr_assert_null(out.next);
	r2cc_qp_shadow_plan_free(&p);

	/* k = 1: everything landed; the IMM's completion is synthesised. */
	p = plan_k(sh, 1);
	cr_assert_eq(p.n_send, 0);
	cr_assert_eq(p.n_synth, 1);
	cr_assert_eq(p.synth[0].wr_id, wr_id);
	cr_assert_eq(p.synth[0].opcode, IBV_WC_RDMA_WRITE);
	cr_assert_eq(p.synth[0].byte_len, 8);
	cr_assert_eq(p.bytes_saved, 4096 + 1024 + 8);
	struct ibv_wc wc;
	r2cc_qp_shadow_plan_wc(&p, 0, 0x123, &wc);
	cr_assert_eq(wc.status, IBV_WC_SUCCESS);
	cr_assert_eq(wc.qp_num, 0x123);
	cr_assert_eq(wc.wr_id, wr_id);
	r2cc_qp_shadow_plan_free(&p);

	/* The real completion retires all three. */
	wc = wc_of(wr_id, IBV_WC_RDMA_WRITE);
	cr_assert_eq(r2cc_qp_shadow_send_completed(sh, &wc), 0);
	cr_assert_eq(r2cc_qp_shadow_send_outstanding(sh), 0);
	/* k = 0 is now inconsistent: we saw the IMM acknowledged. */
	struct r2cc_qp_shadow_plan_in in = {.peer_recv_consumed = 0};
	cr_assert_eq(r2cc_qp_shadow_plan_build(sh, &in, &p), -EPROTO);
	in.peer_recv_consumed = 2;
	cr_assert_eq(r2cc_qp_shadow_plan_build(sh, &in, &p), -EPROTO);
	p = plan_k(sh, 1);
	cr_assert_eq(p.n_send + p.n_synth + p.n_recv, 0);
	r2cc_qp_shadow_plan_free(&p);
	r2cc_qp_shadow_destroy(sh);
}

/* Three requests of one QP: data WRITE + signalled IMM each; boundary at k. */
Test(qp_shadow, plan_boundary_at_kth_imm)
{
	struct r2cc_qp_shadow *sh = mk(512, 256, false, 0);
	for (int r = 0; r < 3; r++) {
		cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, 0, r, 0x10000 * (r + 1), 1000), 0);
		cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SIGNALED, r, 0, 0), 0);
	}
	for (uint64_t k = 0; k <= 3; k++) {
		struct r2cc_qp_shadow_plan p = plan_k(sh, k);
		cr_assert_eq(p.n_synth, k);
		cr_assert_eq(p.n_send, 2 * (3 - k));
		for (size_t i = 0; i < p.n_synth; i++)
			cr_assert_eq(p.synth[i].wr_id, i);
		for (size_t i = 0; i < p.n_send; i++)
			cr_assert_eq(p.send[i].wr_id, k + i / 2);
		cr_assert_eq(p.bytes_saved, 1000 * k);
		cr_assert_eq(p.bytes_reposted, 1000 * (3 - k));
		cr_assert_eq(p.completions_synth, k);
		r2cc_qp_shadow_plan_free(&p);
	}
	/* Retire the first request for real; k = 2 synthesises only the second. */
	struct ibv_wc wc = wc_of(0, IBV_WC_RDMA_WRITE);
	cr_assert_eq(r2cc_qp_shadow_send_completed(sh, &wc), 0);
	struct r2cc_qp_shadow_plan p = plan_k(sh, 2);
	cr_assert_eq(p.n_synth, 1);
	cr_assert_eq(p.synth[0].wr_id, 1);
	cr_assert_eq(p.n_send, 2);
	r2cc_qp_shadow_plan_free(&p);
	/* A completion that is not the oldest signalled one breaks the shadow. */
	wc = wc_of(2, IBV_WC_RDMA_WRITE);
	cr_assert_eq(r2cc_qp_shadow_send_completed(sh, &wc), -EPROTO);
	r2cc_qp_shadow_destroy(sh);
}

/* Clear-to-send: mostly unsignalled writes, a signalled one retires all before it. */
Test(qp_shadow, fifo_writes_retired_by_periodic_signal)
{
	struct r2cc_qp_shadow *sh = mk(512, 256, false, 0);
	for (int id = 0; id < 300; id++) {
		int slot = id % 256;
		unsigned f = slot == 0 ? IBV_SEND_SIGNALED : 0;
		cr_assert_eq(
		    post1(sh, IBV_WR_RDMA_WRITE, f, f ? slot : 0, 0x900000 + slot * 512, 64), 0);
	}
	cr_assert_eq(r2cc_qp_shadow_send_outstanding(sh), 300);
	struct ibv_wc wc = wc_of(0, IBV_WC_RDMA_WRITE);
	cr_assert_eq(r2cc_qp_shadow_send_completed(sh, &wc), 0);
	cr_assert_eq(r2cc_qp_shadow_send_outstanding(sh), 299);
	cr_assert_eq(r2cc_qp_shadow_send_completed(sh, &wc), 0);
	cr_assert_eq(r2cc_qp_shadow_send_outstanding(sh), 300 - 257);
	struct r2cc_qp_shadow_stats st;
	r2cc_qp_shadow_get_stats(sh, &st);
	cr_assert_eq(st.send_retired, 257);
	cr_assert_eq(st.send_posted, 300);
	r2cc_qp_shadow_destroy(sh);
}

Test(qp_shadow, wraps_around_many_times)
{
	struct r2cc_qp_shadow *sh = mk(8, 4, false, 0);
	uint64_t id = 0;
	for (int round = 0; round < 1000; round++) {
		int n = 1 + round % 8;
		for (int i = 0; i < n; i++, id++)
			cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE,
					   i == n - 1 ? IBV_SEND_SIGNALED : 0, id, id * 8, 8),
				     0);
		cr_assert_eq(r2cc_qp_shadow_send_outstanding(sh), n);
		struct r2cc_qp_shadow_plan p = plan_k(sh, 0);
		cr_assert_eq(p.n_send, n);
		cr_assert_eq(p.send[0].wr_id, id - n);
		cr_assert_eq(p.send[n - 1].seq, id);
		r2cc_qp_shadow_plan_free(&p);
		struct ibv_wc wc = wc_of(id - 1, IBV_WC_RDMA_WRITE);
		cr_assert_eq(r2cc_qp_shadow_send_completed(sh, &wc), 0);
		struct ibv_recv_wr r = {.wr_id = id};
		cr_assert_eq(r2cc_qp_shadow_post_recv(sh, &r, NULL), 0);
		wc = wc_of(id, IBV_WC_RECV);
		cr_assert_eq(r2cc_qp_shadow_recv_completed(sh, &wc), 0);
	}
	cr_assert_eq(r2cc_qp_shadow_error(sh), 0);
	/* Receive ring: 4 fit, the fifth does not. */
	for (int i = 0; i < 4; i++) {
		struct ibv_recv_wr r = {.wr_id = i};
		cr_assert_eq(r2cc_qp_shadow_post_recv(sh, &r, NULL), 0);
	}
	struct ibv_recv_wr r = {.wr_id = 4};
	cr_assert_eq(r2cc_qp_shadow_post_recv(sh, &r, NULL), -ENOSPC);
	r2cc_qp_shadow_destroy(sh);
}

Test(qp_shadow, sq_sig_all_signals_every_request)
{
	struct r2cc_qp_shadow *sh = mk(16, 4, true, 0);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, 0, i, 0, 16), 0);
	struct ibv_wc wc = wc_of(0, IBV_WC_RDMA_WRITE);
	cr_assert_eq(r2cc_qp_shadow_send_completed(sh, &wc), 0);
	cr_assert_eq(r2cc_qp_shadow_send_outstanding(sh), 3);
	/* Same target, no barrier: the last supersedes; signalled ones go hollow. */
	struct r2cc_qp_shadow_plan p = plan_k(sh, 0);
	cr_assert_eq(p.n_send, 3);
	cr_assert(p.send[0].hollow && p.send[1].hollow && !p.send[2].hollow);
	cr_assert_eq(p.send[2].wr_id, 3);
	cr_assert_eq(p.n_synth, 0);
	r2cc_qp_shadow_plan_free(&p);
	r2cc_qp_shadow_destroy(sh);

	sh = mk(16, 4, true, 0);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, 0, i, 64 * i, 16), 0);
	p = plan_k(sh, 0);
	cr_assert_eq(p.n_send, 3);
	for (int i = 0; i < 3; i++)
		cr_assert(p.send[i].send_flags & IBV_SEND_SIGNALED);
	r2cc_qp_shadow_plan_free(&p);
	r2cc_qp_shadow_destroy(sh);
}

Test(qp_shadow, partial_post_records_only_before_bad)
{
	struct r2cc_qp_shadow *sh = mk(16, 16, false, 0);
	struct ibv_send_wr w[3];
	struct ibv_sge s[3];
	for (int i = 0; i < 3; i++) {
		mkwr(&w[i], &s[i], IBV_WR_RDMA_WRITE, 0, i, 0x100 * i, 1, 0x100, 8, 2);
		w[i].next = i < 2 ? &w[i + 1] : NULL;
	}
	cr_assert_eq(r2cc_qp_shadow_post_send(sh, w, &w[1]), 0);
	cr_assert_eq(r2cc_qp_shadow_send_outstanding(sh), 1);
	cr_assert_eq(r2cc_qp_shadow_post_send(sh, w, &w[0]), 0);
	cr_assert_eq(r2cc_qp_shadow_send_outstanding(sh), 1);

	/* Two-thread protocol: record all, the provider refuses from w[2]. */
	cr_assert_eq(r2cc_qp_shadow_post_send(sh, w, NULL), 0);
	cr_assert_eq(r2cc_qp_shadow_send_outstanding(sh), 4);
	cr_assert_eq(r2cc_qp_shadow_unpost_send(sh, w, &w[2]), 0);
	cr_assert_eq(r2cc_qp_shadow_send_outstanding(sh), 3);
	cr_assert_eq(r2cc_qp_shadow_unpost_send(sh, w, NULL), 0);
	/* Recorded: w0, w0, w1; the second w0 supersedes the first. */
	struct r2cc_qp_shadow_plan p = plan_k(sh, 0);
	cr_assert_eq(p.n_send, 2);
	cr_assert_eq(p.bytes_superseded, 8);
	cr_assert_eq(p.send[1].wr_id, 1);
	r2cc_qp_shadow_plan_free(&p);

	struct ibv_recv_wr r[2] = {{.wr_id = 7, .next = NULL}, {.wr_id = 8}};
	r[0].next = &r[1];
	cr_assert_eq(r2cc_qp_shadow_post_recv(sh, r, &r[1]), 0);
	cr_assert_eq(r2cc_qp_shadow_recv_outstanding(sh), 1);
	cr_assert_eq(r2cc_qp_shadow_post_recv(sh, r, NULL), 0);
	cr_assert_eq(r2cc_qp_shadow_unpost_recv(sh, r, &r[1]), 0);
	cr_assert_eq(r2cc_qp_shadow_recv_outstanding(sh), 2);

	/* A bad that is not in the list is a caller bug: broken. */
	struct ibv_send_wr other;
	struct ibv_sge os;
	mkwr(&other, &os, IBV_WR_RDMA_WRITE, 0, 9, 0, 1, 0, 8, 2);
	w[2].next = NULL;
	cr_assert_eq(r2cc_qp_shadow_post_send(sh, w, &other), -EINVAL);
	cr_assert_eq(r2cc_qp_shadow_error(sh), -EINVAL);
	r2cc_qp_shadow_destroy(sh);
}

Test(qp_shadow, atomics_refused_and_break_the_shadow)
{
	struct r2cc_qp_shadow *sh = mk(16, 16, false, 0);
	struct ibv_send_wr w[2];
	struct ibv_sge s[2];
	mkwr(&w[0], &s[0], IBV_WR_RDMA_WRITE, 0, 1, 0, 1, 0, 8, 2);
	mkwr(&w[1], &s[1], IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_SEND_SIGNALED, 2, 0, 1, 0, 8, 2);
	w[0].next = &w[1];
	cr_assert_eq(r2cc_qp_shadow_post_send(sh, w, NULL), -EOPNOTSUPP);
	cr_assert_eq(r2cc_qp_shadow_send_outstanding(sh), 0); /* all or nothing */
	struct r2cc_qp_shadow_plan p;
	struct r2cc_qp_shadow_plan_in in = {0};
	cr_assert_eq(r2cc_qp_shadow_plan_build(sh, &in, &p), -EOPNOTSUPP);
	cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, 0, 3, 0, 8), -EINVAL);
	r2cc_qp_shadow_destroy(sh);

	/* An atomic after bad was never posted: fine. */
	sh = mk(16, 16, false, 0);
	cr_assert_eq(r2cc_qp_shadow_post_send(sh, w, &w[1]), 0);
	w[1].opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
	cr_assert_eq(r2cc_qp_shadow_post_send(sh, &w[1], NULL), -EOPNOTSUPP);
	r2cc_qp_shadow_destroy(sh);

	/* Too many SGEs. */
	sh = mk(16, 16, false, 0);
	struct ibv_sge two[2] = {{0x10, 8, 1}, {0x20, 8, 1}};
	mkwr(&w[0], &s[0], IBV_WR_RDMA_WRITE, 0, 1, 0, 1, 0, 8, 2);
	w[0].sg_list = two;
	w[0].num_sge = 2;
	cr_assert_eq(r2cc_qp_shadow_post_send(sh, w, &w[1]), -E2BIG);
	r2cc_qp_shadow_destroy(sh);
}

/* NCCL's GPU flush: a signalled 1-byte READ per flush, on a loopback QP. */
Test(qp_shadow, reads_reposted_unless_completed)
{
	struct r2cc_qp_shadow *sh = mk(64, 4, false, 0);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(post1(sh, IBV_WR_RDMA_READ, IBV_SEND_SIGNALED, 0x1000 + i, 0x500, 1),
			     0);
	struct ibv_wc wc = wc_of(0x1000, IBV_WC_RDMA_READ);
	cr_assert_eq(r2cc_qp_shadow_send_completed(sh, &wc), 0);
	struct r2cc_qp_shadow_plan p = plan_k(sh, 0);
	cr_assert_eq(p.n_send, 2);
	cr_assert_eq(p.reads_reposted, 2);
	cr_assert_eq(p.send[0].wr_id, 0x1001);
	cr_assert_eq(p.send[1].opcode, IBV_WR_RDMA_READ);
	cr_assert_not(p.reordered);
	r2cc_qp_shadow_plan_free(&p);
	r2cc_qp_shadow_destroy(sh);

	/* A READ before a consumed IMM is still re-posted; completions reorder. */
	sh = mk(64, 4, false, 0);
	cr_assert_eq(post1(sh, IBV_WR_RDMA_READ, IBV_SEND_SIGNALED, 1, 0x500, 1), 0);
	cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SIGNALED, 2, 0x600, 8), 0);
	p = plan_k(sh, 1);
	cr_assert_eq(p.n_send, 1);
	cr_assert_eq(p.send[0].wr_id, 1);
	cr_assert_eq(p.n_synth, 1);
	cr_assert_eq(p.synth[0].wr_id, 2);
	cr_assert(p.reordered);
	r2cc_qp_shadow_plan_free(&p);
	r2cc_qp_shadow_destroy(sh);
}

Test(qp_shadow, superseded_writes_and_hollow_signals)
{
	struct r2cc_qp_shadow *sh = mk(64, 4, false, 0);
	/* slot A, slot B, slot A (signalled), slot B: A#1 and B#1 superseded. */
	cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, 0, 0, 0xA00, 64), 0);
	cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 1, 0xB00, 64), 0);
	cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, 0, 0, 0xA00, 128), 0);
	cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, 0, 0, 0xB00, 64), 0);
	struct r2cc_qp_shadow_plan p = plan_k(sh, 0);
	cr_assert_eq(p.n_send, 3);
	cr_assert(p.send[0].hollow); /* B#1 was signalled: its completion still comes */
	cr_assert_eq(p.send[0].wr_id, 1);
	cr_assert_eq(p.send[0].num_sge, 0);
	cr_assert_eq(p.send[0].send_flags, IBV_SEND_SIGNALED);
	cr_assert_eq(p.send[1].remote_addr, 0xA00);
	cr_assert_eq(p.send[1].byte_len, 128);
	cr_assert_eq(p.send[2].remote_addr, 0xB00);
	cr_assert_eq(p.bytes_superseded, 128);
	cr_assert_eq(p.bytes_reposted, 192);
	struct ibv_send_wr out;
	struct ibv_sge sg;
	r2cc_qp_shadow_plan_send_wr(&p, 0, &out, &sg);
	cr_assert_eq(out.num_sge, 0);
	cr_assert_eq(out.opcode, IBV_WR_RDMA_WRITE);
	r2cc_qp_shadow_plan_free(&p);
	r2cc_qp_shadow_destroy(sh);

	/* An IMM between two writes to one target is a barrier: both stay. */
	sh = mk(64, 4, false, 0);
	cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, 0, 0, 0xA00, 64), 0);
	cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SIGNALED, 1, 0, 0), 0);
	cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, 0, 0, 0xA00, 64), 0);
	p = plan_k(sh, 0);
	cr_assert_eq(p.n_send, 3);
	cr_assert_eq(p.bytes_superseded, 0);
	r2cc_qp_shadow_plan_free(&p);
	/* A smaller later write does not cover a larger earlier one. */
	cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, 0, 0, 0xA00, 32), 0);
	p = plan_k(sh, 0);
	cr_assert_eq(p.n_send, 4);
	r2cc_qp_shadow_plan_free(&p);
	r2cc_qp_shadow_destroy(sh);
}

static uint64_t tag_first_word(void *ctx, const struct ibv_send_wr *wr)
{
	(*(int *)ctx)++;
	return wr->num_sge ? *(const uint64_t *)(uintptr_t)wr->sg_list[0].addr : 0;
}

static bool consumed_upto(void *ctx, const struct r2cc_shadow_send *w)
{
	return w->tag <= *(const uint64_t *)ctx;
}

/* Clear-to-send with the peer's FIFO head: consumed entries are not re-sent. */
Test(qp_shadow, fifo_consumed_filter_uses_tags_and_inline_copy)
{
	int calls = 0;
	struct r2cc_qp_shadow_attr a = {.max_send_wr = 64,
					.max_recv_wr = 4,
					.max_send_sge = 1,
					.max_recv_sge = 1,
					.max_inline_data = 64,
					.tag_fn = tag_first_word,
					.tag_ctx = &calls};
	struct r2cc_qp_shadow *sh;
	cr_assert_eq(r2cc_qp_shadow_create(&a, &sh), 0);
	uint64_t elem[4][8];
	for (uint64_t idx = 1; idx <= 4; idx++) {
		elem[idx - 1][0] = idx;
		struct ibv_send_wr w;
		struct ibv_sge s;
		mkwr(&w, &s, IBV_WR_RDMA_WRITE, IBV_SEND_INLINE, 0, 0x4000 + 64 * idx, 9,
		     (uintptr_t)elem[idx - 1], 64, 0);
		cr_assert_eq(r2cc_qp_shadow_post_send(sh, &w, NULL), 0);
		elem[idx - 1][0] = 1000 + idx; /* NCCL may reuse the element at once */
	}
	cr_assert_eq(calls, 4);
	uint64_t head = 2;
	struct r2cc_qp_shadow_plan p;
	struct r2cc_qp_shadow_plan_in in = {
	    .peer_recv_consumed = 0, .write_consumed = consumed_upto, .ctx = &head};
	cr_assert_eq(r2cc_qp_shadow_plan_build(sh, &in, &p), 0);
	cr_assert_eq(p.n_send, 2);
	cr_assert_eq(p.send[0].tag, 3);
	cr_assert_eq(p.bytes_consumed, 128);
	struct ibv_send_wr out;
	struct ibv_sge sg;
	r2cc_qp_shadow_plan_send_wr(&p, 0, &out, &sg);
	cr_assert(out.send_flags & IBV_SEND_INLINE);
	cr_assert_eq(out.num_sge, 1);
	cr_assert_eq(sg.length, 64);
	cr_assert_eq(*(const uint64_t *)(uintptr_t)sg.addr, 3); /* the bytes as posted */
	r2cc_qp_shadow_plan_free(&p);

	/* Inline payload over max_inline_data is refused. */
	uint8_t big[128] = {0};
	struct ibv_send_wr w;
	struct ibv_sge s;
	mkwr(&w, &s, IBV_WR_RDMA_WRITE, IBV_SEND_INLINE, 0, 0x4000, 9, (uintptr_t)big, 128, 0);
	cr_assert_eq(r2cc_qp_shadow_post_send(sh, &w, NULL), -E2BIG);
	r2cc_qp_shadow_destroy(sh);
}

static uint64_t tag_of_raddr(void *ctx, const struct ibv_send_wr *wr)
{
	(void)ctx;
	return wr->opcode == IBV_WR_RDMA_WRITE ? wr->wr.rdma.remote_addr / 64 : 0;
}

static bool tag_odd(void *ctx, const struct r2cc_shadow_send *w)
{
	(*(int *)ctx)++;
	return w->tag % 2 == 1;
}

static void count_tagged(void *ctx, const struct r2cc_shadow_send *w)
{
	cr_assert_neq(w->tag, 0);
	(*(int *)ctx)++;
}

/* The landed check's answers arrive after the plan: r2cc_qp_shadow_plan_drop(). */
Test(qp_shadow, plan_drop_after_the_plan)
{
	struct r2cc_qp_shadow_attr a = {.max_send_wr = 64,
					.max_recv_wr = 4,
					.max_send_sge = 1,
					.max_recv_sge = 1,
					.tag_fn = tag_of_raddr};
	struct r2cc_qp_shadow *sh;
	cr_assert_eq(r2cc_qp_shadow_create(&a, &sh), 0);
	cr_assert_eq(r2cc_qp_shadow_tag_step(sh), 0);
	/* five clear-to-send writes 3 slots apart (3 fused NICs), the 4th signalled, and a
	 * message after them */
	for (uint64_t t = 1; t <= 13; t += 3)
		cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, t == 10 ? IBV_SEND_SIGNALED : 0, 100 + t,
				   64 * t, 64),
			     0);
	cr_assert_eq(r2cc_qp_shadow_tag_step(sh), 3);
	cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SIGNALED, 7, 0x100000, 32), 0);
	int n = 0;
	r2cc_qp_shadow_tagged_writes(sh, count_tagged, &n);
	cr_assert_eq(n, 5);
	struct r2cc_qp_shadow_plan p = plan_k(sh, 0);
	cr_assert_eq(p.n_send, 6);
	uint64_t before = p.bytes_reposted;
	int calls = 0;
	/* tags 1, 7 and 13 are odd: dropped; 4 and the signalled 10 are even: kept */
	cr_assert_eq(r2cc_qp_shadow_plan_drop(&p, tag_odd, &calls), 3);
	cr_assert_eq(calls, 5); /* the plain writes only, not the IMM */
	cr_assert_eq(p.n_send, 3);
	cr_assert_eq(p.send[0].tag, 4);
	cr_assert_eq(p.send[1].tag, 10);
	cr_assert(!p.send[1].hollow);
	cr_assert_eq(p.send[2].opcode, IBV_WR_RDMA_WRITE_WITH_IMM);
	cr_assert_eq(p.bytes_consumed, 3 * 64);
	cr_assert_eq(p.bytes_reposted, before - 3 * 64);
	r2cc_qp_shadow_plan_free(&p);

	/* a signalled write found landed stays as a hollow one: its completion is owed */
	p = plan_k(sh, 0);
	cr_assert_eq(r2cc_qp_shadow_plan_drop(&p, consumed_upto, &(uint64_t){10}), 4);
	cr_assert_eq(p.n_send, 3);
	cr_assert(p.send[0].hollow);
	cr_assert_eq(p.send[0].wr_id, 110);
	cr_assert_eq(p.send[0].byte_len, 0);
	cr_assert(p.send[0].send_flags & IBV_SEND_SIGNALED);
	cr_assert_eq(p.send[1].tag, 13);
	/* a hollow one is never dropped again */
	cr_assert_eq(r2cc_qp_shadow_plan_drop(&p, consumed_upto, &(uint64_t){100}), 1);
	cr_assert_eq(p.n_send, 2);
	cr_assert(p.send[0].hollow);
	r2cc_qp_shadow_plan_free(&p);
	r2cc_qp_shadow_destroy(sh);
}

static int xlate(void *ctx, uint64_t addr, uint32_t len, uint32_t key, uint32_t *new_key_p)
{
	if (key == 0xdead)
		return -ENOENT;
	*new_key_p = key + *(uint32_t *)ctx;
	return 0;
}

Test(qp_shadow, translate_rewrites_keys)
{
	struct r2cc_qp_shadow *sh = mk(16, 16, false, 0);
	cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, 0, 0, 0x100, 8), 0); /* rkey 0x77, lkey 0x55 */
	struct ibv_sge rs = {0x900, 64, 0x66};
	struct ibv_recv_wr r = {.wr_id = 1, .sg_list = &rs, .num_sge = 1};
	cr_assert_eq(r2cc_qp_shadow_post_recv(sh, &r, NULL), 0);
	struct r2cc_qp_shadow_plan p = plan_k(sh, 0);
	uint32_t delta = 0x1000;
	cr_assert_eq(r2cc_qp_shadow_plan_translate(&p, xlate, xlate, &delta), 0);
	cr_assert_eq(p.send[0].rkey, 0x1077);
	cr_assert_eq(p.send[0].sge[0].lkey, 0x1055);
	cr_assert_eq(p.recv[0].sge[0].lkey, 0x1066);
	cr_assert_eq(r2cc_qp_shadow_plan_translate(&p, NULL, xlate, &delta), 0);
	cr_assert_eq(p.send[0].rkey, 0x2077);
	cr_assert_eq(p.send[0].sge[0].lkey, 0x1055);
	p.send[0].rkey = 0xdead;
	cr_assert_eq(r2cc_qp_shadow_plan_translate(&p, NULL, xlate, &delta), -ENOENT);
	r2cc_qp_shadow_plan_free(&p);
	r2cc_qp_shadow_destroy(sh);
}

/* One poster thread (record, then post) and one poller thread (retire). */
struct spsc {
	struct r2cc_qp_shadow *sh;
	uint64_t posted; /* the "NIC": requests handed to it */
	int n;
};

static void *poller(void *arg)
{
	struct spsc *s = arg;
	uint64_t next = 0;
	while (next < (uint64_t)s->n) {
		uint64_t avail = __atomic_load_n(&s->posted, __ATOMIC_ACQUIRE);
		for (; next < avail; next++) {
			if (next % 4 != 3)
				continue;
			struct ibv_wc wc = wc_of(next, IBV_WC_RDMA_WRITE);
			if (r2cc_qp_shadow_send_completed(s->sh, &wc))
				return (void *)1;
		}
	}
	return NULL;
}

Test(qp_shadow, one_poster_one_poller)
{
	struct spsc s = {.sh = mk(64, 4, false, 0), .n = 200000};
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, poller, &s), 0);
	for (int i = 0; i < s.n; i++) {
		while (r2cc_qp_shadow_send_outstanding(s.sh) >= 60)
			;
		cr_assert_eq(post1(s.sh, IBV_WR_RDMA_WRITE, i % 4 == 3 ? IBV_SEND_SIGNALED : 0, i,
				   8 * (i % 16), 8),
			     0);
		__atomic_store_n(&s.posted, (uint64_t)i + 1, __ATOMIC_RELEASE);
	}
	void *ret;
	pthread_join(t, &ret);
	cr_assert_null(ret);
	cr_assert_eq(r2cc_qp_shadow_error(s.sh), 0);
	cr_assert_eq(r2cc_qp_shadow_send_outstanding(s.sh), 0);
	r2cc_qp_shadow_destroy(s.sh);
}

/*
 * The peer's device acknowledged messages and died before writing their receive
 * completions: the sender retired N = R2CC_SHADOW_LOST_MAX + 2 messages, the
 * receiver counted 3. The
 * sender's record of its last R2CC_SHADOW_LOST_MAX messages lets the receiver
 * make the 3 completions (wr_id of its oldest receives, immediates, lengths);
 * the sender's plan takes k as its retired count, and only with a record sent.
 */
Test(qp_shadow, receive_completions_a_dead_device_lost)
{
	const uint64_t N = R2CC_SHADOW_LOST_MAX + 2;
	struct r2cc_qp_shadow *tx = mk(64, 64, false, 0), *rx = mk(64, 64, false, 0);
	for (uint64_t i = 0; i < N; i++) {
		struct ibv_recv_wr r = {.wr_id = 100 + i};
		cr_assert_eq(r2cc_qp_shadow_post_recv(rx, &r, NULL), 0);
		enum ibv_wr_opcode op = i == 4 ? IBV_WR_SEND : IBV_WR_RDMA_WRITE_WITH_IMM;
		cr_assert_eq(post1(tx, IBV_WR_RDMA_WRITE, 0, 50 + i, 4096 * i, 512), 0);
		cr_assert_eq(post1(tx, op, IBV_SEND_SIGNALED, i, 4096 * i + 512, 16 + (uint32_t)i),
			     0);
		struct ibv_wc wc = wc_of(i, op == IBV_WR_SEND ? IBV_WC_SEND : IBV_WC_RDMA_WRITE);
		cr_assert_eq(r2cc_qp_shadow_wc(tx, &wc), 0);
		if (i < 3) {
			wc = wc_of(100 + i, IBV_WC_RECV_RDMA_WITH_IMM);
			cr_assert_eq(r2cc_qp_shadow_wc(rx, &wc), 0);
		}
	}
	cr_assert_eq(r2cc_qp_shadow_msgs_retired(tx), N);
	cr_assert_eq(r2cc_qp_shadow_recv_consumed(rx), 3);
	struct r2cc_shadow_msg rec[R2CC_SHADOW_LOST_MAX];
	int n = r2cc_qp_shadow_retired_msgs(tx, rec);
	cr_assert_eq(n, R2CC_SHADOW_LOST_MAX);
	cr_assert_eq(rec[0].n, 3);
	cr_assert_eq(rec[n - 1].n, N);

	/* Not the next message: refused, nothing retired. */
	struct ibv_wc wc;
	cr_assert_eq(r2cc_qp_shadow_recv_lost(rx, &rec[0], 0x99, &wc), -EPROTO);
	for (int i = 1; i < n; i++) {
		cr_assert_eq(r2cc_qp_shadow_recv_lost(rx, &rec[i], 0x99, &wc), 0);
		cr_assert_eq(wc.wr_id, 100 + rec[i].n - 1);
		cr_assert_eq(wc.qp_num, 0x99);
		cr_assert_eq(wc.byte_len, 16 + rec[i].n - 1);
		if (rec[i].n == 5) { /* the SEND */
			cr_assert_eq(wc.opcode, IBV_WC_RECV);
			cr_assert_eq(wc.wc_flags & IBV_WC_WITH_IMM, 0);
		} else {
			cr_assert_eq(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
			cr_assert_eq(wc.wc_flags & IBV_WC_WITH_IMM, IBV_WC_WITH_IMM);
			cr_assert_eq(wc.imm_data, htobe32(16 + (uint32_t)rec[i].n - 1));
		}
	}
	cr_assert_eq(r2cc_qp_shadow_recv_consumed(rx), N);
	cr_assert_eq(r2cc_qp_shadow_recv_outstanding(rx), 0);

	/* The sender: k = 3 is refused without a record, taken as N with one. */
	struct r2cc_qp_shadow_plan p;
	struct r2cc_qp_shadow_plan_in in = {.peer_recv_consumed = 3};
	cr_assert_eq(r2cc_qp_shadow_plan_build(tx, &in, &p), -EPROTO);
	in.lost_sent = true;
	cr_assert_eq(r2cc_qp_shadow_plan_build(tx, &in, &p), 0);
	cr_assert_eq(p.n_send, 0);
	cr_assert_eq(p.n_synth, 0);
	r2cc_qp_shadow_plan_free(&p);
	/* More than the record holds: refused. */
	in.peer_recv_consumed = N - R2CC_SHADOW_LOST_MAX - 1;
	cr_assert_eq(r2cc_qp_shadow_plan_build(tx, &in, &p), -EPROTO);
	r2cc_qp_shadow_destroy(tx);
	r2cc_qp_shadow_destroy(rx);
}

Test(qp_shadow, whole_list_sums_and_one_refused_records_none)
{
	struct r2cc_qp_shadow *sh = mk(4, 4, false, 0);
	struct ibv_send_wr w[3];
	struct ibv_sge s[3];
	mkwr(&w[0], &s[0], IBV_WR_RDMA_WRITE, 0, 1, 0, 1, 0, 100, 2);
	mkwr(&w[1], &s[1], IBV_WR_RDMA_WRITE, 0, 2, 0, 1, 0, 20, 2);
	mkwr(&w[2], &s[2], IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SIGNALED, 3, 0, 1, 0, 3, 2);
	w[0].next = &w[1];
	w[1].next = &w[2];
	uint64_t n = 0, bytes = 0;
	cr_assert_eq(r2cc_qp_shadow_post_send_all(sh, w, &n, &bytes), 0);
	cr_assert_eq(n, 3);
	cr_assert_eq(bytes, 123);
	struct r2cc_qp_shadow_stats st;
	r2cc_qp_shadow_get_stats(sh, &st);
	cr_assert_eq(st.send_posted, 3);
	cr_assert_eq(st.send_bytes_posted, 123);
	uint64_t sig, ret;
	r2cc_qp_shadow_signalled(sh, &sig, &ret);
	cr_assert_eq(sig, 1);
	/* One slot left: the list's second request does not fit, and none of it is kept. */
	n = bytes = 7;
	cr_assert_eq(r2cc_qp_shadow_post_send_all(sh, w, &n, &bytes), -ENOSPC);
	cr_assert_eq(n, 7); /* untouched when refused */
	cr_assert_eq(r2cc_qp_shadow_send_outstanding(sh), 3);
	r2cc_qp_shadow_signalled(sh, &sig, &ret);
	cr_assert_eq(sig, 1);
	r2cc_qp_shadow_destroy(sh);

	/* An inline payload over the limit, last in its list: nothing of the list kept. */
	sh = mk(16, 16, false, 0);
	w[2].send_flags |= IBV_SEND_INLINE;
	cr_assert_eq(r2cc_qp_shadow_post_send(sh, w, NULL), -E2BIG);
	cr_assert_eq(r2cc_qp_shadow_send_outstanding(sh), 0);
	r2cc_qp_shadow_destroy(sh);
}

static int tag_calls;
static uint64_t tag_len(void *ctx, const struct ibv_send_wr *w)
{
	(void)ctx;
	tag_calls++;
	return w->sg_list[0].length;
}

Test(qp_shadow, tag_function_sees_only_requests_up_to_its_bound)
{
	struct r2cc_qp_shadow_attr a = {.max_send_wr = 16,
					.max_recv_wr = 16,
					.max_send_sge = 1,
					.max_recv_sge = 1,
					.tag_fn = tag_len,
					.tag_max_bytes = 512};
	struct r2cc_qp_shadow *sh = NULL;
	cr_assert_eq(r2cc_qp_shadow_create(&a, &sh), 0);
	tag_calls = 0;
	cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, 0, 1, 0, 0), 0);
	cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, 0, 2, 0, 1), 0);
	cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, 0, 3, 0, 512), 0);
	cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, 0, 4, 0, 513), 0);
	cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, 0, 5, 0, 1 << 20), 0);
	cr_assert_eq(tag_calls, 2, "called %d times", tag_calls);
	/* the tags recorded: 1, then 512 (a rise of 511); 0-byte and longer ones have none */
	cr_assert_eq(r2cc_qp_shadow_tag_step(sh), 511);
	r2cc_qp_shadow_destroy(sh);

	a.tag_max_bytes = 0; /* every request */
	cr_assert_eq(r2cc_qp_shadow_create(&a, &sh), 0);
	tag_calls = 0;
	cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, 0, 1, 0, 0), 0);
	cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, 0, 2, 0, 1 << 20), 0);
	cr_assert_eq(tag_calls, 2);
	r2cc_qp_shadow_destroy(sh);
}

/* The ring's one-line record: the first SGE in it, more in the side array; the retired
 * bytes summed at retirement; the limits of its narrow fields refused, not cut. */
Test(qp_shadow, compact_record_keeps_sges_bytes_and_its_limits)
{
	struct r2cc_qp_shadow_attr a = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 256};
	struct r2cc_qp_shadow *sh = NULL;
	cr_assert_eq(r2cc_qp_shadow_create(&a, &sh), -EINVAL);
	a.max_send_sge = 3;
	cr_assert_eq(r2cc_qp_shadow_create(&a, &sh), 0);

	struct ibv_send_wr w[3];
	struct ibv_sge s[3];
	struct ibv_sge three[3] = {{0x100, 8, 11}, {0x200, 16, 12}, {0x300, 4, 13}};
	mkwr(&w[0], &s[0], IBV_WR_RDMA_WRITE, 0, 1, 0x9000, 5, 0, 8, 2);
	w[0].sg_list = three;
	w[0].num_sge = 3;
	mkwr(&w[1], &s[1], IBV_WR_RDMA_WRITE, 0, 2, 0x9100, 5, 0x400, 32, 14);
	mkwr(&w[2], &s[2], IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SIGNALED, 3, 0x9200, 5, 0x500, 64,
	     15);
	w[0].next = &w[1];
	w[1].next = &w[2];
	cr_assert_eq(r2cc_qp_shadow_post_send(sh, w, NULL), 0);

	struct r2cc_qp_shadow_plan p = plan_k(sh, 0);
	cr_assert_eq(p.n_send, 3);
	cr_assert_eq(p.send[0].num_sge, 3);
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(p.send[0].sge[i].addr, three[i].addr);
		cr_assert_eq(p.send[0].sge[i].length, three[i].length);
		cr_assert_eq(p.send[0].sge[i].lkey, three[i].lkey);
	}
	cr_assert_eq(p.send[0].byte_len, 28);
	cr_assert_eq(p.send[1].num_sge, 1);
	cr_assert_eq(p.send[1].sge[0].addr, 0x400);
	cr_assert_eq(p.send[1].sge[0].lkey, 14);
	cr_assert_eq(p.send[2].seq, 3);
	cr_assert_eq(p.send[2].remote_addr, 0x9200);
	r2cc_qp_shadow_plan_free(&p);

	uint64_t posted, retired;
	uint32_t max_request;
	struct ibv_wc wc = wc_of(3, IBV_WC_RDMA_WRITE);
	cr_assert_eq(r2cc_qp_shadow_wc(sh, &wc), 0);
	r2cc_qp_shadow_bytes(sh, &posted, &retired, &max_request);
	cr_assert_eq(posted, 28 + 32 + 64);
	cr_assert_eq(retired, 28 + 32 + 64);
	cr_assert_eq(max_request, 64);
	cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 4, 0, 16), 0);
	wc = wc_of(4, IBV_WC_RDMA_WRITE);
	cr_assert_eq(r2cc_qp_shadow_wc(sh, &wc), 0);
	r2cc_qp_shadow_bytes(sh, &posted, &retired, &max_request);
	cr_assert_eq(retired, 28 + 32 + 64 + 16);

	/* A flag past what the record holds: refused, the shadow broken. */
	cr_assert_eq(post1(sh, IBV_WR_RDMA_WRITE, 1u << 16, 5, 0, 8), -EOPNOTSUPP);
	cr_assert_eq(r2cc_qp_shadow_error(sh), -EOPNOTSUPP);
	r2cc_qp_shadow_destroy(sh);
}

/* A QP of one SGE a send keeps each SGE in the record itself: a zero-SGE write with
 * immediate (NCCL's completion notice) and a one-SGE write replay as posted, and a
 * second SGE is refused before anything is written. */
Test(qp_shadow, single_sge_queue_keeps_zero_and_one_sge_sends)
{
	struct r2cc_qp_shadow_attr a = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1};
	struct r2cc_qp_shadow *sh = NULL;
	cr_assert_eq(r2cc_qp_shadow_create(&a, &sh), 0);

	struct ibv_send_wr w[2];
	struct ibv_sge s[2];
	mkwr(&w[0], &s[0], IBV_WR_RDMA_WRITE, 0, 1, 0x9000, 5, 0x400, 32, 14);
	mkwr(&w[1], &s[1], IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SIGNALED, 2, 0x9100, 5, 0, 0, 0);
	w[1].sg_list = NULL;
	w[1].num_sge = 0;
	w[1].imm_data = 77;
	w[0].next = &w[1];
	cr_assert_eq(r2cc_qp_shadow_post_send(sh, w, NULL), 0);

	struct r2cc_qp_shadow_plan p = plan_k(sh, 0);
	cr_assert_eq(p.n_send, 2);
	cr_assert_eq(p.send[0].num_sge, 1);
	cr_assert_eq(p.send[0].sge[0].addr, 0x400);
	cr_assert_eq(p.send[0].sge[0].length, 32);
	cr_assert_eq(p.send[0].sge[0].lkey, 14);
	cr_assert_eq(p.send[1].num_sge, 0);
	cr_assert_eq(p.send[1].byte_len, 0);
	cr_assert_eq(p.send[1].imm_data, 77);
	cr_assert_eq(p.send[1].remote_addr, 0x9100);
	r2cc_qp_shadow_plan_free(&p);

	struct ibv_sge two[2] = {{0x100, 8, 11}, {0x200, 16, 12}};
	mkwr(&w[0], &s[0], IBV_WR_RDMA_WRITE, 0, 3, 0x9200, 5, 0, 8, 2);
	w[0].sg_list = two;
	w[0].num_sge = 2;
	cr_assert_eq(r2cc_qp_shadow_post_send(sh, w, NULL), -E2BIG);
	cr_assert_eq(r2cc_qp_shadow_error(sh), -E2BIG);
	r2cc_qp_shadow_destroy(sh);
}
