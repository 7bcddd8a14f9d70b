/*
 * Single-process unit tests of the software RDMA device (Criterion; each test runs in
 * its own process on its own fabric): the exported symbols and versions NCCL looks
 * up, queries, the QP state machine and its attribute checks, posting errors, a
 * loopback data path, the introspection API, and the engine threads (one per NIC in
 * use; none with SOFTVERBS_ENGINES=0).
 */
#include "softverbs/softverbs.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <dlfcn.h>
#include <poll.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <pthread.h>
#include <unistd.h>

static char fabric[64];
static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;

static void open_first(void)
{
	struct ibv_device **devs;
	int n = 0;

	snprintf(fabric, sizeof(fabric), "svunit-%d", (int)getpid());
	setenv("SOFTVERBS_FABRIC", fabric, 1);
	setenv("SOFTVERBS_NODE", "unit", 1);
	setenv("SOFTVERBS_NICS", "mlx5_0:25,mlx5_2:100,mlx5_3:200", 1);
	setenv("SOFTVERBS_TIME_SCALE", "0.01", 1);
	devs = ibv_get_device_list(&n);
	cr_assert(devs && n == 3);
	ctx = ibv_open_device(devs[0]);
	cr_assert(ctx);
	ibv_free_device_list(devs);
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 512, NULL, NULL, 0);
	cr_assert(pd && cq);
}

static void setup(void)
{
	unsetenv("SOFTVERBS_ENGINES");
	open_first();
}

static void teardown(void)
{
	char path[80];

	snprintf(path, sizeof(path), "/%s", fabric);
	shm_unlink(path);
}

TestSuite(softverbs, .init = setup, .fini = teardown);

static struct ibv_qp *qp_new(void)
{
	struct ibv_qp_init_attr init = {
	    .send_cq = cq,
	    .recv_cq = cq,
	    .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
	    .qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &init);

	cr_assert(qp, "create_qp: errno %d", errno);
	return qp;
}

static int to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
				.port_num = 1,
				.qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
						   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE};

	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int to_rtr(struct ibv_qp *qp, uint32_t dqpn, uint16_t dlid)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR,
				.path_mtu = IBV_MTU_4096,
				.dest_qp_num = dqpn,
				.max_dest_rd_atomic = 1,
				.min_rnr_timer = 12};

	a.ah_attr.dlid = dlid;
	a.ah_attr.port_num = 1;
	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				 IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTS,
				.timeout = 14,
				.retry_cnt = 7,
				.rnr_retry = 7,
				.max_rd_atomic = 1};

	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				 IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static uint16_t my_lid(void)
{
	struct ibv_port_attr pa;

	cr_assert(ibv_query_port(ctx, 1, &pa) == 0);
	return pa.lid;
}

static int state_of(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr init;

	cr_assert(ibv_query_qp(qp, &a, IBV_QP_STATE, &init) == 0);
	return a.qp_state;
}

Test(softverbs, nccl_symbols)
{
	static const char *const v11[] = {
	    "ibv_get_device_list", "ibv_free_device_list", "ibv_get_device_name",
	    "ibv_get_device_guid", "ibv_open_device",	   "ibv_close_device",
	    "ibv_get_async_event", "ibv_ack_async_event",  "ibv_query_device",
	    "ibv_query_port",	   "ibv_query_gid",	   "ibv_query_qp",
	    "ibv_alloc_pd",	   "ibv_dealloc_pd",	   "ibv_reg_mr",
	    "ibv_dereg_mr",	   "ibv_create_cq",	   "ibv_destroy_cq",
	    "ibv_create_qp",	   "ibv_modify_qp",	   "ibv_destroy_qp",
	    "ibv_fork_init",	   "ibv_event_type_str",
	};
	void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);

	cr_assert(h, "the device is not the libibverbs.so.1 loaded");
	for (size_t i = 0; i < sizeof(v11) / sizeof(v11[0]); i++)
		cr_expect(dlvsym(h, v11[i], "IBVERBS_1.1"), "%s@IBVERBS_1.1", v11[i]);
	cr_expect(dlvsym(h, "ibv_reg_mr_iova2", "IBVERBS_1.8"));
	cr_expect(dlvsym(h, "ibv_query_ece", "IBVERBS_1.10"));
	cr_expect(dlvsym(h, "ibv_set_ece", "IBVERBS_1.10"));
	cr_expect(dlvsym(h, "ibv_reg_dmabuf_mr", "IBVERBS_1.12"));
	cr_expect(dlsym(RTLD_DEFAULT, "softverbs_nic_stats") == (void *)softverbs_nic_stats);
	cr_expect(dlsym(h, "sv_fabric_attach") == NULL, "internal symbols stay hidden");
	dlclose(h);
}

Test(softverbs, dmabuf_probe_says_unsupported)
{
	errno = 0;
	cr_expect(ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0) == NULL);
	cr_expect(errno == EOPNOTSUPP);
}

Test(softverbs, ece_unsupported)
{
	struct ibv_qp *qp = qp_new();
	struct ibv_ece ece;

	cr_expect(ibv_query_ece(qp, &ece) == EOPNOTSUPP);
}

Test(softverbs, query_device_port_gid)
{
	struct ibv_device_attr da;
	struct ibv_port_attr pa, pb;
	union ibv_gid gid;
	struct ibv_device **devs = ibv_get_device_list(NULL);
	struct ibv_context *c2 = ibv_open_device(devs[1]);

	cr_assert(ibv_query_device(ctx, &da) == 0);
	cr_expect(da.max_qp_wr >= 2048 && da.max_sge >= 4 && da.max_sge_rd >= 30 &&
		  da.max_cqe >= 512);
	cr_expect(da.phys_port_cnt == 1 && da.max_qp > 0 && da.max_mr > 0);
	cr_expect(strcmp(ibv_get_device_name(devs[0]), "mlx5_0") == 0);
	cr_expect(strcmp(ibv_get_device_name(devs[2]), "mlx5_3") == 0);
	/* The inline wrapper goes through verbs_context->query_port, as NCCL >= 2.27.6 does. */
	cr_assert(ibv_query_port(ctx, 1, &pa) == 0);
	cr_expect(pa.state == IBV_PORT_ACTIVE && pa.link_layer == IBV_LINK_LAYER_INFINIBAND);
	cr_expect(pa.active_mtu == IBV_MTU_4096 && pa.lid != 0);
	/* 25 Gb/s = EDR x1; NCCL decodes speed (bit 5 = 25000) times width (bit 0 = 1x). */
	cr_expect(pa.active_speed == 32 && pa.active_width == 1, "speed %d width %d",
		  pa.active_speed, pa.active_width);
	cr_assert(ibv_query_port(c2, 1, &pb) == 0);
	cr_expect(pb.active_speed == 32 && pb.active_width == 2); /* EDR x4 = 100 */
	cr_expect(pb.lid != pa.lid);
	{
		/* NCCL >= 2.27.6 calls the op with its own, larger struct (active_speed_ex last).
		 */
		struct {
			struct ibv_port_attr a;
			uint32_t active_speed_ex;
		} big;
		struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);

		cr_assert(vctx, "context is a verbs_context with query_port");
		memset(&big, 0xa5, sizeof(big));
		cr_assert(vctx->query_port(ctx, 1, &big.a, sizeof(big)) == 0);
		cr_expect(big.active_speed_ex == 0 && big.a.lid == pa.lid);
	}
	memset(&pb, 0, sizeof(pb));
	cr_assert((ibv_query_port)(ctx, 1, (struct _compat_ibv_port_attr *)&pb) == 0);
	cr_expect(pb.lid == pa.lid && pb.state == IBV_PORT_ACTIVE);
	cr_expect(ibv_query_port(ctx, 2, &pa) == EINVAL);
	cr_assert(ibv_query_gid(ctx, 1, 0, &gid) == 0);
	cr_expect(gid.global.interface_id == ibv_get_device_guid(devs[0]));
	cr_expect(ibv_get_device_guid(devs[0]) != ibv_get_device_guid(devs[1]));
	cr_expect(strcmp(ibv_event_type_str(IBV_EVENT_PORT_ERR), "port error") == 0);
	ibv_close_device(c2);
	ibv_free_device_list(devs);
}

/* QP slots are claimed without the fabric lock: threads making QPs at once each get
 * a slot and a QPN of their own, and destroyed ones free their slots. */
#define CLAIM_THREADS 8
#define CLAIM_QPS     256
static struct ibv_qp *claimed[CLAIM_THREADS][CLAIM_QPS];

static void *claim_main(void *arg)
{
	struct ibv_qp **out = arg;

	for (int i = 0; i < CLAIM_QPS; i++)
		out[i] = qp_new();
	return NULL;
}

Test(softverbs, qp_slots_claimed_at_once)
{
	static unsigned char seen[4096];
	pthread_t t[CLAIM_THREADS];

	for (int round = 0; round < 2; round++) {
		memset(seen, 0, sizeof(seen));
		for (int k = 0; k < CLAIM_THREADS; k++)
			cr_assert(pthread_create(&t[k], NULL, claim_main, claimed[k]) == 0);
		for (int k = 0; k < CLAIM_THREADS; k++)
			pthread_join(t[k], NULL);
		for (int k = 0; k < CLAIM_THREADS; k++)
			for (int i = 0; i < CLAIM_QPS; i++) {
				uint32_t qpn = claimed[k][i]->qp_num;
				cr_assert(qpn && qpn < (1u << 24), "qpn 0x%x", qpn);
				cr_assert(!seen[qpn & 4095], "slot %u given twice", qpn & 4095);
				seen[qpn & 4095] = 1;
			}
		for (int k = 0; k < CLAIM_THREADS; k++)
			for (int i = 0; i < CLAIM_QPS; i++)
				cr_assert(ibv_destroy_qp(claimed[k][i]) == 0);
	}
}

Test(softverbs, qp_state_machine)
{
	struct ibv_qp *qp = qp_new();
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR};

	cr_expect(state_of(qp) == IBV_QPS_RESET);
	cr_expect(qp->qp_num >= 1024 && qp->qp_num < (1 << 24));
	cr_expect(to_rtr(qp, qp->qp_num, my_lid()) == EINVAL, "RESET -> RTR");
	cr_expect(to_rts(qp) == EINVAL, "RESET -> RTS");
	/* RESET -> INIT with an attribute that transition does not allow. */
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.timeout = 3;
	cr_expect(ibv_modify_qp(qp, &a,
				IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				    IBV_QP_ACCESS_FLAGS | IBV_QP_TIMEOUT) == EINVAL);
	/* ... and without one it requires. */
	cr_expect(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) ==
		  EINVAL);
	a.port_num = 2;
	cr_expect(ibv_modify_qp(qp, &a,
				IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				    IBV_QP_ACCESS_FLAGS) == EINVAL,
		  "port 2");
	cr_expect(state_of(qp) == IBV_QPS_RESET);
	cr_assert(to_init(qp) == 0);
	cr_expect(state_of(qp) == IBV_QPS_INIT);
	/* INIT -> RTR without DEST_QPN. */
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_4096;
	cr_expect(ibv_modify_qp(qp, &a,
				IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_RQ_PSN |
				    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == EINVAL);
	cr_expect(to_rts(qp) == EINVAL, "INIT -> RTS");
	cr_assert(to_rtr(qp, qp->qp_num, my_lid()) == 0);
	cr_expect(state_of(qp) == IBV_QPS_RTR);
	cr_assert(to_rts(qp) == 0);
	cr_expect(state_of(qp) == IBV_QPS_RTS && qp->state == IBV_QPS_RTS);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 40;
	cr_expect(ibv_modify_qp(qp, &a,
				IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) ==
		      EINVAL,
		  "RTS -> RTS may not set the timeout");
	a.qp_state = IBV_QPS_ERR;
	cr_assert(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0);
	cr_expect(state_of(qp) == IBV_QPS_ERR);
	cr_expect(to_rtr(qp, qp->qp_num, my_lid()) == EINVAL, "ERR -> RTR");
	a.qp_state = IBV_QPS_RESET;
	cr_assert(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0);
	cr_expect(to_init(qp) == 0, "RESET again -> INIT");
	cr_expect(ibv_destroy_cq(cq) == EBUSY);
	cr_expect(ibv_destroy_qp(qp) == 0);
	cr_expect(ibv_destroy_cq(cq) == 0);
}

Test(softverbs, bad_create_and_reg)
{
	struct ibv_qp_init_attr init = {
	    .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .cap = {.max_send_wr = 1 << 20}};
	char buf[64];

	errno = 0;
	cr_expect(ibv_create_qp(pd, &init) == NULL && errno == EINVAL);
	init.cap.max_send_wr = 1;
	init.qp_type = IBV_QPT_UD;
	cr_expect(ibv_create_qp(pd, &init) == NULL && errno == EOPNOTSUPP);
	cr_expect(ibv_create_cq(ctx, 1 << 30, NULL, NULL, 0) == NULL && errno == EINVAL);
	cr_expect(ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_REMOTE_WRITE) == NULL &&
		      errno == EINVAL,
		  "remote write needs local write");
}

Test(softverbs, post_errors_and_overflow)
{
	struct ibv_qp *qp = qp_new();
	static char buf[4096];
	struct ibv_mr *mr =
	    ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey};
	struct ibv_send_wr wr[6], *bad = NULL;
	struct ibv_recv_wr rwr = {.wr_id = 1}, *rbad = NULL;
	struct ibv_wc wc;

	memset(wr, 0, sizeof(wr));
	for (int i = 0; i < 6; i++) {
		wr[i].wr_id = (uint64_t)i;
		wr[i].next = i < 5 ? &wr[i + 1] : NULL;
		wr[i].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
		wr[i].wr.rdma.remote_addr = (uintptr_t)buf;
		wr[i].wr.rdma.rkey = mr->rkey;
		wr[i].sg_list = &sge;
		wr[i].num_sge = 1;
	}
	cr_expect(ibv_post_recv(qp, &rwr, &rbad) == EINVAL && rbad == &rwr, "recv in RESET");
	cr_assert(to_init(qp) == 0);
	cr_expect(ibv_post_send(qp, wr, &bad) == EINVAL && bad == &wr[0], "send in INIT");
	/* Loopback: the QP sends to itself; no receive posted, so WRITE_WITH_IMM waits (RNR). */
	cr_assert(to_rtr(qp, qp->qp_num, my_lid()) == 0 && to_rts(qp) == 0);
	cr_expect(ibv_post_send(qp, wr, &bad) == ENOMEM && bad == &wr[4], "5th of 4 slots");
	bad = NULL;
	cr_expect(ibv_post_send(qp, &wr[5], &bad) == ENOMEM && bad == &wr[5]);
	usleep(20000);
	cr_expect(ibv_poll_cq(cq, 1, &wc) == 0, "waits for a receive");
	/* Receives release them, in order; the last WR was never posted. */
	for (int i = 0; i < 4; i++) {
		rwr.wr_id = 100 + (uint64_t)i;
		cr_assert(ibv_post_recv(qp, &rwr, &rbad) == 0);
	}
	for (int i = 0, n = 0; n < 4 && i < 2000; i++) {
		if (ibv_poll_cq(cq, 1, &wc) == 1) {
			cr_expect(wc.status == IBV_WC_SUCCESS);
			cr_expect(wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM);
			cr_expect(wc.wr_id == 100 + (uint64_t)n);
			n++;
		}
		usleep(1000);
	}
	cr_expect(ibv_poll_cq(cq, 1, &wc) == 0, "unsignalled: no send completions");
	/* A bad opcode and too many SGEs are refused at post time. */
	wr[0].next = NULL;
	wr[0].opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	cr_expect(ibv_post_send(qp, wr, &bad) == EINVAL && bad == wr);
	wr[0].opcode = IBV_WR_RDMA_WRITE;
	wr[0].num_sge = 2;
	cr_expect(ibv_post_send(qp, wr, &bad) == EINVAL && bad == wr);
}

Test(softverbs, loopback_small_write_order)
{
	struct ibv_qp *qp = qp_new();
	static uint64_t src[8], dst[8];
	struct ibv_mr *ms = ibv_reg_mr(pd, src, sizeof(src), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *md =
	    ibv_reg_mr(pd, dst, sizeof(dst), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_sge sge = {.addr = (uintptr_t)src, .length = sizeof(src), .lkey = ms->lkey};
	struct ibv_send_wr wr = {.wr_id = 9,
				 .sg_list = &sge,
				 .num_sge = 1,
				 .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr *bad;
	struct ibv_wc wc;
	int n = 0;

	cr_assert(to_init(qp) == 0 && to_rtr(qp, qp->qp_num, my_lid()) == 0 && to_rts(qp) == 0);
	for (int i = 0; i < 8; i++)
		src[i] = 0x1111111111111111ull * (uint64_t)(i + 1);
	wr.wr.rdma.remote_addr = (uintptr_t)dst;
	wr.wr.rdma.rkey = md->rkey;
	cr_assert(ibv_post_send(qp, &wr, &bad) == 0);
	for (int i = 0; i < 1000 && !n; i++, usleep(1000))
		n = ibv_poll_cq(cq, 1, &wc);
	cr_assert(n == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 9 &&
		  wc.qp_num == qp->qp_num);
	cr_expect(memcmp(src, dst, sizeof(src)) == 0);
	/* The MR's rkey is refused once deregistered. */
	cr_assert(ibv_dereg_mr(md) == 0);
	cr_assert(ibv_post_send(qp, &wr, &bad) == 0);
	for (n = 0, wc.wr_id = 0; n == 0;)
		n = ibv_poll_cq(cq, 1, &wc);
	cr_expect(wc.status == IBV_WC_REM_ACCESS_ERR);
}

Test(softverbs, nic_stats_api)
{
	struct softverbs_nic_stat st[8];
	int n = softverbs_nic_stats(NULL, st, 8);

	cr_assert(n == 3, "%d", n);
	cr_expect(strcmp(st[0].node, "unit") == 0 && strcmp(st[0].name, "mlx5_0") == 0);
	cr_expect(st[0].gbps == 25 && st[2].gbps == 200 && st[1].state == SOFTVERBS_NIC_UP);
	cr_expect(softverbs_nic_stats("nosuchnode", st, 8) == 0);
	cr_expect(softverbs_nic_stats(NULL, NULL, 8) == -EINVAL);
}

/* Two QPs of this process connected to each other; rnr_retry as given. */
static void loop_pair(struct ibv_qp **a, struct ibv_qp **b, int rnr_retry)
{
	struct ibv_qp_attr at = {.qp_state = IBV_QPS_RTS,
				 .timeout = 14,
				 .retry_cnt = 7,
				 .rnr_retry = (uint8_t)rnr_retry,
				 .max_rd_atomic = 1};
	int mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
		   IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;

	*a = qp_new();
	*b = qp_new();
	cr_assert(to_init(*a) == 0 && to_init(*b) == 0);
	cr_assert(to_rtr(*a, (*b)->qp_num, my_lid()) == 0 &&
		  to_rtr(*b, (*a)->qp_num, my_lid()) == 0);
	cr_assert(ibv_modify_qp(*a, &at, mask) == 0 && ibv_modify_qp(*b, &at, mask) == 0);
}

static struct ibv_wc wait_wc(void)
{
	struct ibv_wc wc;

	for (int i = 0; i < 2000; i++, usleep(1000))
		if (ibv_poll_cq(cq, 1, &wc) == 1)
			return wc;
	cr_assert_fail("no completion");
	return wc;
}

Test(softverbs, error_statuses)
{
	static char buf[8192];
	struct ibv_mr *rw =
	    ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_mr *ro = ibv_reg_mr(pd, buf + 4096, 4096, 0);
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 64, .lkey = rw->lkey};
	struct ibv_send_wr wr = {
	    .wr_id = 1, .sg_list = &sge, .num_sge = 1, .send_flags = IBV_SEND_SIGNALED};
	struct ibv_recv_wr rwr = {.wr_id = 2, .sg_list = &sge, .num_sge = 1}, *rbad;
	struct ibv_send_wr *bad;
	struct ibv_qp *a, *b;
	struct ibv_wc wc;

	/* rnr_retry 0: a missing receive is an error after the retries. */
	loop_pair(&a, &b, 0);
	wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr.wr.rdma.remote_addr = (uintptr_t)buf;
	wr.wr.rdma.rkey = rw->rkey;
	cr_assert(ibv_post_send(a, &wr, &bad) == 0);
	wc = wait_wc();
	cr_expect(wc.status == IBV_WC_RNR_RETRY_EXC_ERR, "status %d", wc.status);
	/* A bad lkey: local protection error. */
	loop_pair(&a, &b, 7);
	sge.lkey = rw->lkey + 1;
	wr.opcode = IBV_WR_RDMA_WRITE;
	cr_assert(ibv_post_send(a, &wr, &bad) == 0);
	wc = wait_wc();
	cr_expect(wc.status == IBV_WC_LOC_PROT_ERR, "status %d", wc.status);
	/* READ from an MR without remote read: remote access error. */
	loop_pair(&a, &b, 7);
	sge.lkey = rw->lkey;
	wr.opcode = IBV_WR_RDMA_READ;
	wr.wr.rdma.remote_addr = (uintptr_t)buf + 4096;
	wr.wr.rdma.rkey = ro->rkey;
	cr_assert(ibv_post_send(a, &wr, &bad) == 0);
	wc = wait_wc();
	cr_expect(wc.status == IBV_WC_REM_ACCESS_ERR, "status %d", wc.status);
	/* READ into an MR without local write: local protection error. */
	loop_pair(&a, &b, 7);
	sge.addr = (uintptr_t)buf + 4096;
	sge.lkey = ro->lkey;
	wr.wr.rdma.remote_addr = (uintptr_t)buf;
	wr.wr.rdma.rkey = rw->rkey;
	cr_assert(ibv_post_send(a, &wr, &bad) == 0);
	wc = wait_wc();
	cr_expect(wc.status == IBV_WC_LOC_PROT_ERR, "status %d", wc.status);
	/* A SEND larger than the receive: the requester and the receive both fail. */
	loop_pair(&a, &b, 7);
	sge.addr = (uintptr_t)buf;
	sge.lkey = rw->lkey;
	sge.length = 16;
	cr_assert(ibv_post_recv(b, &rwr, &rbad) == 0);
	sge.length = 64;
	wr.opcode = IBV_WR_SEND;
	cr_assert(ibv_post_send(a, &wr, &bad) == 0);
	for (int i = 0; i < 2; i++) {
		wc = wait_wc();
		if (wc.wr_id == 1)
			cr_expect(wc.status == IBV_WC_REM_INV_REQ_ERR, "status %d", wc.status);
		else
			cr_expect(wc.wr_id == 2 && wc.status == IBV_WC_LOC_LEN_ERR, "status %d",
				  wc.status);
	}
}

/* Threads of this process whose name is `name`. */
static int threads_named(const char *name)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;

	cr_assert(d);
	while ((e = readdir(d))) {
		char path[300], comm[32] = "";
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (fgets(comm, sizeof(comm), f))
			comm[strcspn(comm, "\n")] = '\0';
		fclose(f);
		n += strcmp(comm, name) == 0;
	}
	closedir(d);
	return n;
}

/* One engine per NIC that has QPs, however many QPs and contexts. */
Test(softverbs, engines_one_per_nic)
{
	struct ibv_device **devs = ibv_get_device_list(NULL);
	struct ibv_context *c2 = ibv_open_device(devs[1]);
	struct ibv_pd *pd2 = ibv_alloc_pd(c2);
	struct ibv_cq *cq2 = ibv_create_cq(c2, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr init = {
	    .send_cq = cq2,
	    .recv_cq = cq2,
	    .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
	    .qp_type = IBV_QPT_RC,
	};

	cr_expect(threads_named("sv-mlx5_0") == 0, "no engine before a QP");
	qp_new();
	qp_new();
	cr_assert(ibv_create_qp(pd2, &init));
	cr_expect(threads_named("sv-mlx5_0") == 1);
	cr_expect(threads_named("sv-mlx5_2") == 1);
	cr_expect(threads_named("sv-mlx5_3") == 0);
	ibv_free_device_list(devs);
}

static void setup_inline(void)
{
	setenv("SOFTVERBS_ENGINES", "0", 1);
	open_first();
}

/* SOFTVERBS_ENGINES=0: no engine; the posting thread runs even a large write. */
Test(softverbs_inline, no_engines, .init = setup_inline, .fini = teardown)
{
	struct ibv_qp *qp = qp_new();
	size_t len = 8u << 20;
	uint8_t *src = malloc(len), *dst = calloc(1, len);
	struct ibv_mr *ms = ibv_reg_mr(pd, src, len, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *md =
	    ibv_reg_mr(pd, dst, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_sge sge = {.addr = (uintptr_t)src, .length = (uint32_t)len, .lkey = ms->lkey};
	struct ibv_send_wr wr = {.wr_id = 3,
				 .sg_list = &sge,
				 .num_sge = 1,
				 .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED},
			   *bad;
	struct ibv_wc wc;

	cr_assert(src && dst && ms && md);
	memset(src, 0x5a, len);
	cr_assert(to_init(qp) == 0 && to_rtr(qp, qp->qp_num, my_lid()) == 0 && to_rts(qp) == 0);
	wr.wr.rdma.remote_addr = (uintptr_t)dst;
	wr.wr.rdma.rkey = md->rkey;
	cr_assert(ibv_post_send(qp, &wr, &bad) == 0);
	cr_expect(dst[len - 1] == 0x5a, "copied before post_send returned");
	cr_expect(ibv_poll_cq(cq, 1, &wc) == 1 && wc.wr_id == 3 && wc.status == IBV_WC_SUCCESS);
	cr_expect(threads_named("sv-mlx5_0") == 0);
}

/* Faults scheduled with SOFTVERBS_FAULT from the start (or soon after) of the process. */
static void setup_ackloss(void)
{
	setenv("SOFTVERBS_FAULT", "unit/mlx5_0=ackloss@0", 1);
	setup();
}

/* Lost acknowledgements on a loopback pair: the receive completes, the send times out. */
Test(softverbs_ackloss, lands_unheard, .init = setup_ackloss, .fini = teardown)
{
	static char buf[4096];
	struct ibv_mr *mr =
	    ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 1,
				 .sg_list = &sge,
				 .num_sge = 1,
				 .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
				 .send_flags = IBV_SEND_SIGNALED,
				 .imm_data = 5},
			   *bad;
	struct ibv_recv_wr rwr = {.wr_id = 2}, *rbad;
	struct softverbs_nic_stat st[4];
	struct ibv_qp *a, *b;
	struct ibv_wc wc;

	loop_pair(&a, &b, 7);
	cr_assert(softverbs_nic_stats("unit", st, 4) == 3 && st[0].state == SOFTVERBS_NIC_ACKLOSS);
	wr.wr.rdma.remote_addr = (uintptr_t)buf + 1024;
	wr.wr.rdma.rkey = mr->rkey;
	cr_assert(ibv_post_recv(b, &rwr, &rbad) == 0);
	cr_assert(ibv_post_send(a, &wr, &bad) == 0);
	wc = wait_wc();
	cr_expect(wc.wr_id == 2 && wc.status == IBV_WC_SUCCESS && wc.imm_data == 5);
	wc = wait_wc();
	cr_expect(wc.wr_id == 1 && wc.status == IBV_WC_RETRY_EXC_ERR, "wr %llu status %d",
		  (unsigned long long)wc.wr_id, wc.status);
	cr_expect(state_of(a) == IBV_QPS_ERR && state_of(b) == IBV_QPS_RTS);
}

static void setup_bad_schedule(void)
{
	setenv("SOFTVERBS_FAULT",
	       "unit/mlx5_0=jitter@0;unit/mlx5_2=down:5@0;unit/mlx5_3=jitter:7@0", 1);
	setup();
}

/* Kinds that take a number need one, the others take none; good entries still apply. */
Test(softverbs_schedule, kinds_and_args, .init = setup_bad_schedule, .fini = teardown)
{
	struct softverbs_nic_stat st[4];

	my_lid(); /* a port query applies what is due */
	cr_assert(softverbs_nic_stats("unit", st, 4) == 3);
	cr_expect(st[0].state == SOFTVERBS_NIC_UP && st[1].state == SOFTVERBS_NIC_UP);
	cr_expect(st[2].state == SOFTVERBS_NIC_JITTER);
}

static void setup_fatal(void)
{
	setenv("SOFTVERBS_FAULT", "unit/mlx5_0=fatal@200", 1);
	setup();
}

/* The device dies under a posted receive and a queued send: an event, EIO, no flush. */
Test(softverbs_fatal, dies_silently, .init = setup_fatal, .fini = teardown)
{
	struct pollfd pfd = {.fd = ctx->async_fd, .events = POLLIN};
	struct ibv_qp_attr at = {.qp_state = IBV_QPS_ERR};
	struct ibv_recv_wr rwr = {.wr_id = 2}, *rbad;
	struct ibv_send_wr wr = {.wr_id = 1, .opcode = IBV_WR_RDMA_WRITE_WITH_IMM}, *bad;
	struct ibv_async_event ev;
	struct ibv_port_attr pa;
	struct ibv_qp *a, *b;
	struct ibv_wc wc;

	loop_pair(&a, &b, 7); /* a's WRITE_WITH_IMM waits for a receive: RNR, forever */
	cr_assert(ibv_post_send(a, &wr, &bad) == 0);
	cr_assert(poll(&pfd, 1, 2000) == 1);
	cr_assert(ibv_get_async_event(ctx, &ev) == 0);
	cr_expect(ev.event_type == IBV_EVENT_DEVICE_FATAL, "event %d", ev.event_type);
	ibv_ack_async_event(&ev);
	cr_expect(ibv_query_port(ctx, 1, &pa) == EIO);
	cr_expect(ibv_post_recv(b, &rwr, &rbad) == EIO && rbad == &rwr);
	cr_expect(ibv_post_send(a, &wr, &bad) == EIO && bad == &wr);
	cr_expect(ibv_modify_qp(a, &at, IBV_QP_STATE) == 0 &&
		  ibv_modify_qp(b, &at, IBV_QP_STATE) == 0);
	usleep(20000);
	cr_expect(ibv_poll_cq(cq, 1, &wc) == 0, "a completion from a dead device");
	cr_expect(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0 && ibv_destroy_cq(cq) == 0);
}

static void setup_dmabuf(void)
{
	setenv("SOFTVERBS_DMABUF", "1", 1);
	setup();
}

/* A loopback QP on a NIC of its own (context, PD, CQ). */
struct dev_loop {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
};

static void dev_loop_open(struct dev_loop *l, int nic)
{
	struct ibv_device **devs;
	struct ibv_qp_init_attr init = {
	    .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
	    .qp_type = IBV_QPT_RC,
	};
	struct ibv_port_attr pa;
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
				.port_num = 1,
				.qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
						   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE};
	int n = 0;

	devs = ibv_get_device_list(&n);
	cr_assert(devs && n > nic);
	l->ctx = nic ? ibv_open_device(devs[nic]) : ctx;
	ibv_free_device_list(devs);
	l->pd = nic ? ibv_alloc_pd(l->ctx) : pd;
	l->cq = nic ? ibv_create_cq(l->ctx, 16, NULL, NULL, 0) : cq;
	cr_assert(l->ctx && l->pd && l->cq);
	init.send_cq = init.recv_cq = l->cq;
	l->qp = ibv_create_qp(l->pd, &init);
	cr_assert(l->qp);
	cr_assert(ibv_modify_qp(l->qp, &a,
				IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				    IBV_QP_ACCESS_FLAGS) == 0);
	cr_assert(ibv_query_port(l->ctx, 1, &pa) == 0);
	a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR,
				 .path_mtu = IBV_MTU_4096,
				 .dest_qp_num = l->qp->qp_num,
				 .max_dest_rd_atomic = 1,
				 .min_rnr_timer = 12};
	a.ah_attr.dlid = pa.lid;
	a.ah_attr.port_num = 1;
	cr_assert(ibv_modify_qp(l->qp, &a,
				IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				    IBV_QP_MIN_RNR_TIMER) == 0);
	cr_assert(to_rts(l->qp) == 0);
}

/* One signalled WRITE or READ between two MRs of this process through l's NIC. */
static void dev_loop_op(struct dev_loop *l, int opcode, struct ibv_mr *local, void *laddr,
			struct ibv_mr *remote, uint64_t raddr, uint32_t len)
{
	struct ibv_sge sge = {.addr = (uintptr_t)laddr, .length = len, .lkey = local->lkey};
	struct ibv_send_wr wr = {.wr_id = 3,
				 .sg_list = &sge,
				 .num_sge = 1,
				 .opcode = opcode,
				 .send_flags = IBV_SEND_SIGNALED},
			   *bad;
	struct ibv_wc wc;
	int n = 0;

	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = remote->rkey;
	cr_assert(ibv_post_send(l->qp, &wr, &bad) == 0);
	for (int i = 0; i < 2000 && !n; i++, usleep(1000))
		n = ibv_poll_cq(l->cq, 1, &wc);
	cr_assert(n == 1 && wc.status == IBV_WC_SUCCESS, "status %d", wc.status);
}

static uint64_t dm_iova; /* where the test's device memory is, as peers address it */

static uint64_t unflushed(struct ibv_mr *mr, uint64_t off, uint64_t len)
{
	uint64_t nics = ~0ull, over = ~0ull;

	cr_assert(softverbs_unflushed(mr, dm_iova + off, len, &nics, &over) >= 0);
	cr_assert(over == 0);
	return nics;
}

/*
 * Device memory: a memfd registered through ibv_reg_dmabuf_mr on two NICs (one MR per
 * PD, as R2CC's mirrors make them). A write through a NIC owes a flush there, seen
 * through either MR; a READ through another NIC does not order it, one through the
 * same NIC does; the bytes are in the memory all along.
 */
Test(softverbs_dmabuf, writes_owe_their_nics_flush, .init = setup_dmabuf, .fini = teardown)
{
	struct dev_loop a, b;
	static char src[256], scratch[8];
	int fd = memfd_create("svunit-dmabuf", 0);
	char *view;
	struct ibv_mr *ma, *mb, *sa, *sb, *host;
	uint64_t nics = 0;

	cr_assert(fd >= 0 && ftruncate(fd, 8192) == 0);
	view = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	cr_assert(view != MAP_FAILED);
	dev_loop_open(&a, 0);
	dev_loop_open(&b, 1);
	dm_iova = (uintptr_t)view + 4096;
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	ma = ibv_reg_dmabuf_mr(a.pd, 4096, 4096, (uintptr_t)view + 4096, fd, acc);
	mb = ibv_reg_dmabuf_mr(b.pd, 4096, 4096, (uintptr_t)view + 4096, fd, acc);
	cr_assert(ma && mb, "errno %d", errno);
	cr_expect((uintptr_t)ma->addr == 4096, "addr is the offset, as rdma-core sets it");
	sa = ibv_reg_mr(a.pd, src, sizeof(src), acc);
	sb = ibv_reg_mr(b.pd, src, sizeof(src), acc);
	host = ibv_reg_mr(a.pd, scratch, sizeof(scratch), acc);
	cr_assert(sa && sb && host);
	cr_expect(softverbs_unflushed(host, (uintptr_t)scratch, 1, &nics, NULL) == -EINVAL);
	cr_expect(softverbs_unflushed(ma, (uintptr_t)view + 4096 + 4000, 200, &nics, NULL) ==
		  -ERANGE);
	memset(src, 0x5a, sizeof(src));
	dev_loop_op(&a, IBV_WR_RDMA_WRITE, sa, src, ma, (uintptr_t)view + 4096, 128);
	cr_expect(view[4096] == 0x5a && view[4096 + 127] == 0x5a && view[4096 + 128] == 0);
	cr_expect(unflushed(ma, 0, 4096) == 1, "through mlx5_0: %#llx",
		  (unsigned long long)unflushed(ma, 0, 4096));
	cr_expect(unflushed(ma, 128, 128) == 0, "nothing written there");
	dev_loop_op(&b, IBV_WR_RDMA_WRITE, sb, src, mb, (uintptr_t)view + 4096 + 128, 128);
	cr_expect(unflushed(ma, 0, 256) == 3 && unflushed(mb, 128, 1) == 2);
	/* mlx5_2's flush READ orders its own write only */
	dev_loop_op(&b, IBV_WR_RDMA_READ, sb, src, mb, (uintptr_t)view + 4096, 1);
	cr_expect(unflushed(ma, 0, 256) == 1);
	/* a later write through mlx5_2 over mlx5_0's bytes replaces them */
	dev_loop_op(&b, IBV_WR_RDMA_WRITE, sb, src, mb, (uintptr_t)view + 4096 + 32, 32);
	cr_expect(unflushed(ma, 0, 32) == 1 && unflushed(ma, 32, 32) == 2 &&
		  unflushed(ma, 64, 64) == 1);
	dev_loop_op(&a, IBV_WR_RDMA_READ, sa, src, ma, (uintptr_t)view + 4096, 1);
	cr_expect(unflushed(ma, 0, 4096) == 2);
	dev_loop_op(&b, IBV_WR_RDMA_READ, sb, src, mb, (uintptr_t)view + 4096, 1);
	cr_expect(unflushed(ma, 0, 4096) == 0);
	/* a buffer of its own stays apart */
	int fd2 = memfd_create("svunit-dmabuf2", 0);
	cr_assert(fd2 >= 0 && ftruncate(fd2, 4096) == 0);
	struct ibv_mr *mc = ibv_reg_dmabuf_mr(a.pd, 0, 4096, 0x10000, fd2, acc);
	cr_assert(mc);
	dev_loop_op(&a, IBV_WR_RDMA_WRITE, sa, src, mc, 0x10000, 64);
	cr_expect(unflushed(ma, 0, 4096) == 0, "another buffer's write");
	cr_expect(softverbs_unflushed(mc, 0x10000, 64, &nics, NULL) == 1 && nics == 1);
	cr_expect(ibv_dereg_mr(ma) == 0 && ibv_dereg_mr(mb) == 0 && ibv_dereg_mr(mc) == 0);
	close(fd);
	close(fd2);
}
