/*
 * Conformance tests of faults of a link, a process and a device: link down, black
 * hole, flapping, a peer that dies, a fault scheduled by SOFTVERBS_FAULT, and a
 * device that dies (IBV_EVENT_DEVICE_FATAL, also on a NIC shared by two processes).
 */
#include "tests/softverbs/conformance.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- link down ---- */

void down_a(struct peer *p)
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

void down_b(struct peer *p)
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

void blackhole_a(struct peer *p)
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

void blackhole_b(struct peer *p)
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

void flap_a(struct peer *p)
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

void death_a(struct peer *p)
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

void death_b(struct peer *p)
{
	setup(p);
	raise(SIGKILL);
}

/* ---- a fault scheduled by SOFTVERBS_FAULT ---- */

void sched_a(struct peer *p)
{
	setup(p);
	post(p, 0, IBV_WR_RDMA_WRITE, 1, IBV_SEND_SIGNALED, 0, 64, 0, p->peer.rkey, 0);
	expect_wc(p, 1, IBV_WC_SUCCESS, 1000, NULL);
	usleep(400000);
	post(p, 0, IBV_WR_RDMA_WRITE, 2, IBV_SEND_SIGNALED, 0, 64, 0, p->peer.rkey, 0);
	expect_wc(p, 2, IBV_WC_RETRY_EXC_ERR, 5000, NULL);
	sync_send(p, 1);
}

/* ---- a device dies ---- */

void fatal_a(struct peer *p)
{
	struct ibv_qp *qp;
	uint32_t qpn;
	double t0, dt;

	setup(p);
	sync_wait(p, 1); /* B's WRITE_WITH_IMM on qp 1 waits for a receive here */
	sync_send(p, 2);
	sync_wait(p, 3); /* B's device is dead */
	post_recv(p, 1, 700);
	t0 = now_ms();
	post(p, 0, IBV_WR_RDMA_WRITE, 1, IBV_SEND_SIGNALED, 0, 4096, 0, p->peer.rkey, 0);
	expect_wc(p, 1, IBV_WC_RETRY_EXC_ERR, 5000, NULL);
	dt = now_ms() - t0;
	fprintf(stderr, "  fatal peer: status 12 after %.0f ms (timeout %.0f ms)\n", dt, RETRY_MS);
	CHECK(p, dt >= RETRY_MS * 0.95 && dt < RETRY_MS * 1.5, "(after %.0f ms)", dt);
	expect_no_wc(p, 10); /* the request B posted before it died never came */
	sync_send(p, 4);
	/* After `up`, a new context of B works: a fresh QP pair. */
	qp = make_qp(p);
	CHECK(p, read(p->sock, &qpn, sizeof(qpn)) == sizeof(qpn));
	CHECK(p, write(p->sock, &qp->qp_num, sizeof(qp->qp_num)) == sizeof(qp->qp_num));
	p->qp[2] = qp;
	p->peer.qpn[2] = qpn;
	CHECK(p, read(p->sock, &p->peer.rkey, sizeof(p->peer.rkey)) == sizeof(p->peer.rkey));
	connect_qp(p, 2);
	sync_wait(p, 5);
	fill(p->buf, 4096, 61);
	post(p, 2, IBV_WR_RDMA_WRITE_WITH_IMM, 2, IBV_SEND_SIGNALED, 0, 4096, 0, p->peer.rkey, 9);
	expect_wc(p, 2, IBV_WC_SUCCESS, 2000, NULL);
	sync_wait(p, 6);
}

void fatal_b(struct peer *p)
{
	struct ibv_device **devs = ibv_get_device_list(NULL);
	struct ibv_context *same = ibv_open_device(devs[0]), *other = ibv_open_device(devs[1]), *c;
	struct ibv_qp_init_attr init = {.send_cq = p->cq, .recv_cq = p->cq, .qp_type = IBV_QPT_RC};
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTS};
	struct ibv_qp_init_attr qinit;
	struct ibv_sge sge = {.addr = 0, .length = 8, .lkey = 0};
	struct ibv_send_wr wr = {.wr_id = 9, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
	struct ibv_recv_wr rwr = {.wr_id = 9}, *rbad = NULL;
	struct ibv_device_attr da;
	struct ibv_port_attr pa;
	union ibv_gid gid;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	struct ibv_qp *qp;
	struct ibv_wc wc;
	char cmd[PATH_MAX + 128], line[512];
	bool listed = false;
	FILE *f;

	CHECK(p, same && other);
	setup(p);
	post_recv(p, 0, 500);
	post(p, 1, IBV_WR_RDMA_WRITE_WITH_IMM, 600, IBV_SEND_SIGNALED, 0, 0, 0, 0, 1);
	sync_send(p, 1);
	sync_wait(p, 2);
	expect_no_wc(p, 5);
	ctl(p, "fault B mlx5_0 fatal");
	/* Every context of the NIC hears it; the other NIC's does not. */
	CHECK(p, async_event(p, 1000) == IBV_EVENT_DEVICE_FATAL);
	CHECK(p, ctx_event(p, same, 1000) == IBV_EVENT_DEVICE_FATAL);
	CHECK(p, ctx_event(p, other, 20) == -1);
	CHECK(p, async_event(p, 20) == -1, "(events after DEVICE_FATAL)");
	/* EIO from every verb that would reach the device. */
	CHECK(p, ibv_query_port(p->ctx, 1, &pa) == EIO && ibv_query_port(same, 1, &pa) == EIO);
	CHECK(p, ibv_query_port(other, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE);
	CHECK(p, ibv_query_device(p->ctx, &da) == EIO);
	errno = 0;
	CHECK(p, ibv_query_gid(p->ctx, 1, 0, &gid) == -1 && errno == EIO,
	      "(rdma-core's -1, errno)");
	errno = 0;
	CHECK(p, !ibv_alloc_pd(p->ctx) && errno == EIO);
	errno = 0;
	CHECK(p, !ibv_reg_mr(p->pd, p->buf, 4096, ACCESS_RW) && errno == EIO);
	errno = 0;
	CHECK(p, !ibv_create_cq(p->ctx, 16, NULL, NULL, 0) && errno == EIO);
	errno = 0;
	CHECK(p, !ibv_create_comp_channel(p->ctx) && errno == EIO);
	errno = 0;
	CHECK(p, !ibv_create_qp(p->pd, &init) && errno == EIO);
	errno = 0;
	CHECK(p, !ibv_open_device(devs[0]) && errno == EIO, "(a dead device opened)");
	CHECK(p, ibv_post_send(p->qp[0], &wr, &bad) == EIO && bad == &wr);
	CHECK(p, ibv_post_recv(p->qp[0], &rwr, &rbad) == EIO && rbad == &rwr);
	CHECK(p, ibv_modify_qp(p->qp[0], &a, IBV_QP_STATE) == EIO);
	CHECK(p, ibv_query_qp(p->qp[0], &a, IBV_QP_STATE, &qinit) == EIO);
	CHECK(p, ibv_req_notify_cq(p->cq, 0) == EIO);
	/* ERR is accepted, as mlx5 accepts it, and flushes nothing: no completion at all. */
	a.qp_state = IBV_QPS_ERR;
	CHECK(p, ibv_modify_qp(p->qp[0], &a, IBV_QP_STATE) == 0);
	CHECK(p, ibv_modify_qp(p->qp[1], &a, IBV_QP_STATE) == 0);
	expect_no_wc(p, 100);
	snprintf(cmd, sizeof(cmd), "%s --fabric %s list", ctl_path, fabric);
	f = popen(cmd, "r");
	CHECK(p, f != NULL);
	while (fgets(line, sizeof(line), f))
		listed |= strstr(line, "node=B name=mlx5_0 ") && strstr(line, " port=FATAL ") &&
			  strstr(line, " fault=fatal ") && strstr(line, " link=dead ");
	CHECK(p, pclose(f) == 0 && listed, "(softverbs-ctl list)");
	sync_send(p, 3);
	sync_wait(p, 4); /* A's write timed out */
	expect_no_wc(p, 5);
	/* `up`: the old contexts stay dead, a new one works. */
	ctl(p, "fault B mlx5_0 up");
	CHECK(p, ctx_event(p, p->ctx, 50) == -1);
	CHECK(p, ibv_query_port(p->ctx, 1, &pa) == EIO);
	c = ibv_open_device(devs[0]);
	CHECK(p, c != NULL, "(errno %d)", errno);
	CHECK(p, ibv_query_port(c, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE);
	pd = ibv_alloc_pd(c);
	cq = ibv_create_cq(c, 16, NULL, NULL, 0);
	CHECK(p, pd && cq);
	mr = ibv_reg_mr(pd, p->buf, BUF_LEN, ACCESS_RW);
	CHECK(p, mr != NULL);
	/* Freeing the dead objects works, as it must for a program to recover. */
	for (int i = 0; i < p->nqp; i++)
		CHECK(p, ibv_destroy_qp(p->qp[i]) == 0);
	CHECK(p, ibv_dereg_mr(p->mr) == 0 && ibv_destroy_cq(p->cq) == 0 &&
		     ibv_dealloc_pd(p->pd) == 0 && ibv_close_device(same) == 0 &&
		     ibv_close_device(p->ctx) == 0);
	p->ctx = c;
	p->pd = pd;
	p->cq = cq;
	p->mr = mr;
	qp = make_qp(p);
	p->qp[2] = qp;
	CHECK(p, write(p->sock, &qp->qp_num, sizeof(qp->qp_num)) == sizeof(qp->qp_num));
	CHECK(p, read(p->sock, &p->peer.qpn[2], sizeof(uint32_t)) == sizeof(uint32_t));
	CHECK(p, write(p->sock, &mr->rkey, sizeof(mr->rkey)) == sizeof(mr->rkey));
	connect_qp(p, 2);
	post_recv(p, 2, 800);
	sync_send(p, 5);
	expect_wc(p, 800, IBV_WC_SUCCESS, 2000, &wc);
	CHECK(p, wc.imm_data == 9 && check_fill(p->buf, 4096, 61));
	ibv_free_device_list(devs);
	sync_send(p, 6);
}

/* Two processes of one node share a NIC that dies: both hear it, on that NIC only. */
void fatal_shared(struct peer *p)
{
	struct ibv_device **devs = ibv_get_device_list(NULL);
	struct ibv_context *c = ibv_open_device(devs[1]);
	struct ibv_port_attr pa;

	CHECK(p, c != NULL);
	setup(p);
	if (p->role == 'A')
		ctl(p, "fault A mlx5_1 fatal");
	CHECK(p, ctx_event(p, c, 1000) == IBV_EVENT_DEVICE_FATAL);
	CHECK(p, ibv_query_port(c, 1, &pa) == EIO);
	CHECK(p, async_event(p, 20) == -1 && ibv_query_port(p->ctx, 1, &pa) == 0);
	sync_send(p, 1);
	sync_wait(p, 1);
	ibv_free_device_list(devs);
}
