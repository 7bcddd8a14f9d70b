/*
 * Single-process unit tests (Criterion; each test in its own process on its own
 * fabric) of what the software RDMA device offers rdma-core's own programs: every
 * version node and name of rdma-core 44-50's libibverbs, the helpers and queries they
 * call (rates, P_Key and device indexes, the IB GID table, ibv_query_device_ex,
 * rereg and resize, CQs beyond the inline ring), what fails cleanly at call time, shared receive
 * queues and the extended send API (ibv_wr_*), each over a QP connected to another of this process.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <dlfcn.h>
#include <endian.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static char fabric[64];
static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static uint8_t *buf;
static struct ibv_mr *mr;

#define BUF_LEN	  (1 << 20)
#define MAX_CQE	  4194303 /* ConnectX's max_cqe, which the device reports */
#define ACCESS_RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static void setup(void)
{
	struct ibv_device **devs;
	int n = 0;

	snprintf(fabric, sizeof(fabric), "svcompat-%d", (int)getpid());
	setenv("SOFTVERBS_FABRIC", fabric, 1);
	setenv("SOFTVERBS_NODE", "compat", 1);
	setenv("SOFTVERBS_NICS", "mlx5_0:100,mlx5_1:100", 1);
	setenv("SOFTVERBS_TIME_SCALE", "0.01", 1);
	devs = ibv_get_device_list(&n);
	cr_assert(devs && n == 2);
	ctx = ibv_open_device(devs[0]);
	ibv_free_device_list(devs);
	cr_assert(ctx);
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	buf = calloc(1, BUF_LEN);
	cr_assert(pd && cq && buf);
	mr = ibv_reg_mr(pd, buf, BUF_LEN, ACCESS_RW);
	cr_assert(mr);
}

static void teardown(void)
{
	char path[80];

	snprintf(path, sizeof(path), "/%s", fabric);
	shm_unlink(path);
}

TestSuite(compat, .init = setup, .fini = teardown);

static uint16_t my_lid(void)
{
	struct ibv_port_attr pa;

	cr_assert(ibv_query_port(ctx, 1, &pa) == 0);
	return pa.lid;
}

/* RESET -> INIT -> RTR (to `dqpn` on this NIC) -> RTS. */
static void qp_connect(struct ibv_qp *qp, uint32_t dqpn)
{
	struct ibv_qp_attr a = {
	    .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = ACCESS_RW};

	cr_assert(ibv_modify_qp(qp, &a,
				IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				    IBV_QP_ACCESS_FLAGS) == 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_4096;
	a.dest_qp_num = dqpn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = my_lid();
	a.ah_attr.port_num = 1;
	cr_assert(ibv_modify_qp(qp, &a,
				IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				    IBV_QP_MIN_RNR_TIMER) == 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	cr_assert(ibv_modify_qp(qp, &a,
				IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) ==
		  0);
}

static struct ibv_qp *qp_new(struct ibv_srq *srq, uint32_t depth)
{
	struct ibv_qp_init_attr init = {
	    .send_cq = cq,
	    .recv_cq = cq,
	    .srq = srq,
	    .cap = {.max_send_wr = depth,
		    .max_recv_wr = srq ? 0 : 16,
		    .max_send_sge = 2,
		    .max_recv_sge = srq ? 0 : 1,
		    .max_inline_data = 64},
	    .qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &init);

	cr_assert(qp, "create_qp: errno %d", errno);
	return qp;
}

static struct ibv_wc wait_wc(void)
{
	struct ibv_wc wc;

	for (int i = 0; i < 2000; i++, usleep(500))
		if (ibv_poll_cq(cq, 1, &wc) == 1)
			return wc;
	cr_assert_fail("no completion");
	return wc;
}

static void expect_no_wc(void)
{
	struct ibv_wc wc;

	usleep(20000);
	cr_expect(ibv_poll_cq(cq, 1, &wc) == 0, "unexpected completion wr_id %llu",
		  (unsigned long long)wc.wr_id);
}

static void post_write(struct ibv_qp *qp, uint64_t wr_id, void *src, uint32_t len, void *dst,
		       uint32_t rkey)
{
	struct ibv_sge sge = {.addr = (uintptr_t)src, .length = len, .lkey = mr->lkey};
	struct ibv_send_wr wr = {.wr_id = wr_id,
				 .sg_list = &sge,
				 .num_sge = 1,
				 .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED},
			   *bad;

	wr.wr.rdma.remote_addr = (uintptr_t)dst;
	wr.wr.rdma.rkey = rkey;
	cr_assert(ibv_post_send(qp, &wr, &bad) == 0);
}

/* ---- the ABI: every name of rdma-core 44-50 at its version ---- */

Test(compat, every_rdma_core_version_node)
{
	static const struct {
		const char *version, *names;
	} nodes[] = {
	    {"IBVERBS_1.0", "ibv_create_comp_channel ibv_destroy_comp_channel ibv_rate_to_mult "
			    "mult_to_ibv_rate ibv_copy_path_rec_from_kern "
			    "ibv_copy_path_rec_to_kern ibv_copy_qp_attr_from_kern "
			    "ibv_get_sysfs_path ibv_read_sysfs_file"},
	    {"IBVERBS_1.1",
	     "ibv_ack_async_event ibv_ack_cq_events ibv_alloc_pd ibv_attach_mcast "
	     "ibv_close_device ibv_create_ah ibv_create_ah_from_wc ibv_create_cq ibv_create_qp "
	     "ibv_create_srq ibv_dealloc_pd ibv_dereg_mr ibv_destroy_ah ibv_destroy_cq "
	     "ibv_destroy_qp ibv_destroy_srq ibv_detach_mcast ibv_dofork_range "
	     "ibv_dontfork_range ibv_event_type_str ibv_fork_init ibv_free_device_list "
	     "ibv_get_async_event ibv_get_cq_event ibv_get_device_guid ibv_get_device_list "
	     "ibv_get_device_name ibv_init_ah_from_wc ibv_modify_qp ibv_modify_srq "
	     "ibv_node_type_str ibv_open_device ibv_port_state_str ibv_query_device "
	     "ibv_query_gid ibv_query_pkey ibv_query_port ibv_query_qp ibv_query_srq "
	     "ibv_rate_to_mbps ibv_reg_mr ibv_register_driver ibv_rereg_mr ibv_resize_cq "
	     "ibv_resolve_eth_l2_from_gid ibv_wc_status_str mbps_to_ibv_rate "
	     "ibv_copy_ah_attr_from_kern"},
	    {"IBVERBS_1.5", "ibv_get_pkey_index"},
	    {"IBVERBS_1.6", "ibv_qp_to_qp_ex"},
	    {"IBVERBS_1.7", "ibv_reg_mr_iova"},
	    {"IBVERBS_1.8", "ibv_reg_mr_iova2"},
	    {"IBVERBS_1.9", "ibv_get_device_index"},
	    {"IBVERBS_1.10", "ibv_import_device ibv_import_mr ibv_import_pd ibv_query_ece "
			     "ibv_set_ece ibv_unimport_mr ibv_unimport_pd"},
	    {"IBVERBS_1.11", "_ibv_query_gid_ex _ibv_query_gid_table"},
	    {"IBVERBS_1.12", "ibv_reg_dmabuf_mr"},
	    {"IBVERBS_1.13", "ibv_import_dm ibv_is_fork_initialized ibv_unimport_dm"},
	    {"IBVERBS_1.14", "ibv_query_qp_data_in_order"},
	    {"IBVERBS_PRIVATE_34", "verbs_register_driver_34 verbs_allow_disassociate_destroy "
				   "ibv_cmd_create_qp_ex2 execute_ioctl ibv_query_gid_type "
				   "_verbs_init_and_alloc_context __verbs_log"},
	};
	void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);

	cr_assert(h, "the device is not the libibverbs.so.1 loaded");
	for (size_t i = 0; i < sizeof(nodes) / sizeof(nodes[0]); i++) {
		char names[2048], *save = NULL;

		snprintf(names, sizeof(names), "%s", nodes[i].names);
		for (char *n = strtok_r(names, " ", &save); n; n = strtok_r(NULL, " ", &save))
			cr_expect(dlvsym(h, n, nodes[i].version), "%s@%s", n, nodes[i].version);
	}
	dlclose(h);
}

/* A provider's constructor registers its driver; its ibv_cmd_* are never reached here. */
Test(compat, provider_abi_answers_without_a_kernel)
{
	void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
	void (*reg)(const void *) = dlvsym(h, "verbs_register_driver_34", "IBVERBS_PRIVATE_34");
	int (*cmd)(void) = dlvsym(h, "ibv_cmd_create_qp_ex2", "IBVERBS_PRIVATE_34");
	void *(*alloc)(void) = dlvsym(h, "_verbs_init_and_alloc_context", "IBVERBS_PRIVATE_34");

	cr_assert(reg && cmd && alloc);
	reg(NULL);
	cr_expect(cmd() == EOPNOTSUPP);
	errno = 0;
	cr_expect(alloc() == NULL && errno == EOPNOTSUPP);
	dlclose(h);
}

/* ---- helpers and queries ---- */

Test(compat, rates)
{
	static const enum ibv_rate all[] = {
	    IBV_RATE_2_5_GBPS, IBV_RATE_5_GBPS,	  IBV_RATE_10_GBPS,  IBV_RATE_20_GBPS,
	    IBV_RATE_30_GBPS,  IBV_RATE_40_GBPS,  IBV_RATE_60_GBPS,  IBV_RATE_80_GBPS,
	    IBV_RATE_120_GBPS, IBV_RATE_14_GBPS,  IBV_RATE_56_GBPS,  IBV_RATE_112_GBPS,
	    IBV_RATE_168_GBPS, IBV_RATE_25_GBPS,  IBV_RATE_100_GBPS, IBV_RATE_200_GBPS,
	    IBV_RATE_300_GBPS, IBV_RATE_28_GBPS,  IBV_RATE_50_GBPS,  IBV_RATE_400_GBPS,
	    IBV_RATE_600_GBPS, IBV_RATE_800_GBPS, IBV_RATE_1200_GBPS};

	cr_expect(ibv_rate_to_mbps(IBV_RATE_100_GBPS) == 103125);
	cr_expect(ibv_rate_to_mbps(IBV_RATE_400_GBPS) == 425000);
	cr_expect(ibv_rate_to_mult(IBV_RATE_10_GBPS) == 4);
	cr_expect(ibv_rate_to_mult(IBV_RATE_25_GBPS) == -1, "not a multiple of 2.5 Gb/s");
	cr_expect(mult_to_ibv_rate(48) == IBV_RATE_120_GBPS);
	cr_expect(mult_to_ibv_rate(3) == IBV_RATE_MAX && mbps_to_ibv_rate(1) == IBV_RATE_MAX);
	cr_expect(ibv_rate_to_mbps(IBV_RATE_MAX) == -1);
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		int mult = ibv_rate_to_mult(all[i]);

		cr_expect(mbps_to_ibv_rate(ibv_rate_to_mbps(all[i])) == all[i], "rate %d", all[i]);
		cr_expect(mult == -1 || mult_to_ibv_rate(mult) == all[i], "rate %d", all[i]);
	}
	cr_expect(strcmp(ibv_node_type_str(IBV_NODE_CA), "InfiniBand channel adapter") == 0);
}

Test(compat, indexes_gid_table_and_extended_query)
{
	struct ibv_device **devs = ibv_get_device_list(NULL);
	struct ibv_device_attr_ex ax;
	struct ibv_gid_entry e[4];
	union ibv_gid gid;

	cr_expect(ibv_get_device_index(devs[0]) == 0 && ibv_get_device_index(devs[1]) == 1);
	ibv_free_device_list(devs);
	cr_expect(ibv_get_pkey_index(ctx, 1, htobe16(0xffff)) == 0);
	cr_expect(ibv_get_pkey_index(ctx, 1, htobe16(0x7fff)) == -1);
	cr_assert(ibv_query_gid(ctx, 1, 0, &gid) == 0);
	cr_assert(ibv_query_gid_ex(ctx, 1, 0, &e[0], 0) == 0);
	cr_expect(memcmp(&e[0].gid, &gid, sizeof(gid)) == 0 && e[0].gid_type == IBV_GID_TYPE_IB &&
		  e[0].gid_index == 0 && e[0].port_num == 1 && e[0].ndev_ifindex == 0);
	cr_expect(ibv_query_gid_ex(ctx, 1, 1, &e[0], 0) == EINVAL, "one GID per port");
	cr_expect(ibv_query_gid_ex(ctx, 1, 0, &e[0], 1) == EOPNOTSUPP);
	cr_expect(ibv_query_gid_table(ctx, e, 4, 0) == 1);
	cr_expect(ibv_query_gid_table(ctx, e, 0, 0) == -EINVAL);
	memset(&ax, 0xff, sizeof(ax));
	cr_assert(ibv_query_device_ex(ctx, NULL, &ax) == 0);
	cr_expect(ax.phys_port_cnt_ex == 1 && ax.orig_attr.phys_port_cnt == 1);
	cr_expect(ax.orig_attr.max_srq > 0 && ax.orig_attr.max_srq_wr >= 4096 &&
		  ax.orig_attr.max_srq_sge >= 1);
	cr_expect(ax.odp_caps.general_caps == 0 && ax.max_dm_size == 0 &&
		      ax.completion_timestamp_mask == 0,
		  "no ODP, device memory or timestamps");
}

/* rereg: the same keys now name another buffer, another access. */
Test(compat, rereg_mr_and_resize_cq)
{
	struct ibv_qp *qp = qp_new(NULL, 8);
	static uint8_t other[4096];
	struct ibv_mr *dst = ibv_reg_mr(pd, buf + 8192, 4096, ACCESS_RW);
	struct ibv_wc wc;

	cr_assert(dst);
	qp_connect(qp, qp->qp_num);
	memset(buf, 0x3c, 64);
	cr_assert(
	    ibv_rereg_mr(dst, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, other, sizeof(other), 0) == 0);
	cr_expect(dst->addr == other && dst->length == sizeof(other));
	post_write(qp, 1, buf, 64, other, dst->rkey);
	wc = wait_wc();
	cr_expect(wc.status == IBV_WC_SUCCESS && other[63] == 0x3c && buf[8192] == 0);
	cr_assert(ibv_rereg_mr(dst, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			       IBV_ACCESS_LOCAL_WRITE) == 0);
	post_write(qp, 2, buf, 64, other, dst->rkey);
	wc = wait_wc();
	cr_expect(wc.status == IBV_WC_REM_ACCESS_ERR, "status %d", wc.status);
	errno = 0;
	cr_expect(ibv_rereg_mr(dst, 1 << 5, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT &&
		  errno == EINVAL);
	cr_expect(ibv_rereg_mr(dst, 0, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE) ==
		      IBV_REREG_MR_ERR_INPUT,
		  "access without CHANGE_ACCESS");
	cr_expect(ibv_resize_cq(cq, 1024) == 0 && cq->cqe == 1024);
	cr_expect(ibv_resize_cq(cq, 0) == EINVAL);
	cr_expect(ibv_resize_cq(cq, MAX_CQE + 1) == EINVAL);
}

/* ---- CQs larger than the ring inside the fabric (NCCL's port failover asks for them) ---- */

/* The rings of this process's large CQs: memfds, as /proc/self/fd shows them. */
static int cq_memfds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	char path[300], link[256];
	int n = 0;

	cr_assert(d);
	while ((e = readdir(d))) {
		ssize_t len;

		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		len = readlink(path, link, sizeof(link) - 1);
		if (len > 0) {
			link[len] = '\0';
			n += strstr(link, "memfd:softverbs-cq") != NULL;
		}
	}
	closedir(d);
	return n;
}

/* `n` signalled writes (wr_id first...), posted without polling. */
static void post_writes(struct ibv_qp *qp, uint64_t first, int n)
{
	for (int k = 0; k < n; k++)
		post_write(qp, first + (uint64_t)k, buf, 8, buf + 4096, mr->rkey);
}

/* Waits until `c` holds more than `n` completions (a resize to n is then refused). */
static void wait_queued(struct ibv_cq *c, int n)
{
	for (int i = 0; i < 4000 && ibv_resize_cq(c, n) != EINVAL; i++)
		usleep(500);
	cr_assert(ibv_resize_cq(c, n) == EINVAL, "fewer than %d completions queued", n + 1);
}

/* `n` completions, wr_id first... in order, and nothing after them. */
static void drain_in_order(struct ibv_cq *c, uint64_t first, int n)
{
	static struct ibv_wc wc[256];
	int got = 0;

	for (int tries = 0; got < n && tries < 4000;) {
		int k = ibv_poll_cq(c, 256, wc);

		cr_assert(k >= 0);
		if (!k) {
			usleep(500);
			tries++;
		}
		for (int i = 0; i < k; i++, got++)
			cr_assert(wc[i].status == IBV_WC_SUCCESS &&
				      wc[i].wr_id == first + (uint64_t)got,
				  "completion %d: wr_id %llu status %d", got,
				  (unsigned long long)wc[i].wr_id, wc[i].status);
	}
	cr_assert(got == n, "%d of %d completions", got, n);
	cr_expect(ibv_poll_cq(c, 256, wc) == 0);
}

Test(compat, large_cq_and_resize)
{
	struct ibv_device_attr da;
	struct ibv_device_attr_ex ax;
	struct ibv_cq *small = cq, *big;
	struct ibv_qp *qp;
	int fds = cq_memfds();

	cr_assert(ibv_query_device(ctx, &da) == 0 && ibv_query_device_ex(ctx, NULL, &ax) == 0);
	cr_expect(da.max_cqe == MAX_CQE && ax.orig_attr.max_cqe == MAX_CQE, "max_cqe %d",
		  da.max_cqe);
	errno = 0;
	cr_expect(!ibv_create_cq(ctx, MAX_CQE + 1, NULL, NULL, 0) && errno == EINVAL);
	big = ibv_create_cq(ctx, 65536, NULL, NULL, 0);
	cr_assert(big && big->cqe == 65536, "create_cq(65536): errno %d", errno);
	cr_expect(cq_memfds() == fds + 1);

	/* 5000 completions before the first poll; then a resize that keeps the ring. */
	cq = big;
	qp = qp_new(NULL, 8192);
	qp_connect(qp, qp->qp_num);
	post_writes(qp, 0, 5000);
	wait_queued(big, 4999);
	drain_in_order(big, 0, 5000);
	cr_expect(ibv_resize_cq(big, 4096) == 0 && big->cqe == 4096);
	/* Grown with 3000 queued: they move to the new ring, in order, and more follow. */
	post_writes(qp, 5000, 3000);
	wait_queued(big, 2999);
	cr_expect(ibv_resize_cq(big, 100000) == 0 && big->cqe == 100000);
	cr_expect(cq_memfds() == fds + 1, "the old ring is closed");
	post_writes(qp, 8000, 2000);
	drain_in_order(big, 5000, 5000);
	cr_expect(ibv_resize_cq(big, MAX_CQE + 1) == EINVAL && big->cqe == 100000);
	cr_expect(ibv_destroy_cq(big) == EBUSY);
	cr_assert(ibv_destroy_qp(qp) == 0 && ibv_destroy_cq(big) == 0);
	cr_expect(cq_memfds() == fds, "destroy closes the ring");

	/* A CQ on the fabric's ring grown past it with completions queued. */
	cq = small;
	qp = qp_new(NULL, 8192);
	qp_connect(qp, qp->qp_num);
	post_writes(qp, 0, 1000);
	wait_queued(small, 999);
	cr_expect(ibv_resize_cq(small, 8192) == 0 && small->cqe == 8192);
	cr_expect(cq_memfds() == fds + 1);
	post_writes(qp, 1000, 3000);
	wait_queued(small, 3999);
	drain_in_order(small, 0, 4000);
	cr_assert(ibv_destroy_qp(qp) == 0);
}

Test(compat, unsupported_fails_at_call_time)
{
	struct ibv_qp *qp = qp_new(NULL, 4);
	struct ibv_ah_attr ah = {.dlid = 1, .port_num = 1};
	struct ibv_qp_init_attr ud = {
	    .send_cq = cq, .recv_cq = cq, .cap = {.max_send_wr = 1}, .qp_type = IBV_QPT_UD};
	struct ibv_qp_init_attr_ex ex = {.send_cq = cq,
					 .recv_cq = cq,
					 .cap = {.max_send_wr = 1},
					 .qp_type = IBV_QPT_RC,
					 .comp_mask =
					     IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
					 .pd = pd,
					 .send_ops_flags = IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD};
	struct ibv_srq_init_attr_ex srqx = {.attr = {.max_wr = 4, .max_sge = 1},
					    .comp_mask =
						IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD,
					    .srq_type = IBV_SRQT_XRC,
					    .pd = pd};
	union ibv_gid gid = {0};

	errno = 0;
	cr_expect(ibv_create_ah(pd, &ah) == NULL && errno == EOPNOTSUPP);
	cr_expect(ibv_attach_mcast(qp, &gid, 0xc001) == EINVAL, "as for any QP but UD");
	errno = 0;
	cr_expect(ibv_import_device(0) == NULL && errno == EOPNOTSUPP);
	errno = 0;
	cr_expect(ibv_import_pd(ctx, 1) == NULL && errno == EOPNOTSUPP);
	errno = 0;
	cr_expect(ibv_create_qp(pd, &ud) == NULL && errno == EOPNOTSUPP);
	errno = 0;
	cr_expect(ibv_create_qp_ex(ctx, &ex) == NULL && errno == EOPNOTSUPP, "atomics");
	errno = 0;
	cr_expect(ibv_create_srq_ex(ctx, &srqx) == NULL && errno == EOPNOTSUPP, "XRC SRQ");
	errno = 0;
	cr_expect(ibv_qp_to_qp_ex(qp) == NULL && errno == EOPNOTSUPP, "no send_ops_flags");
	cr_expect(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED);
	cr_expect(ibv_query_qp_data_in_order(qp, IBV_WR_RDMA_WRITE, 0) == 0);
}

/* ---- shared receive queues ---- */

Test(compat, srq_checks_and_sends)
{
	struct ibv_srq_init_attr si = {.attr = {.max_wr = 4, .max_sge = 1}};
	struct ibv_srq *srq;
	struct ibv_qp *tx, *rx;
	struct ibv_sge sge = {.addr = (uintptr_t)buf + 4096, .length = 128, .lkey = mr->lkey};
	struct ibv_recv_wr rwr[5], *bad;
	struct ibv_send_wr swr = {.wr_id = 7,
				  .sg_list = &sge,
				  .num_sge = 1,
				  .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED},
			   *sbad;
	struct ibv_wc wc;

	si.attr.max_wr = 0;
	cr_expect(ibv_create_srq(pd, &si) == NULL && errno == EINVAL);
	si.attr.max_wr = 4;
	si.attr.max_sge = 5;
	cr_expect(ibv_create_srq(pd, &si) == NULL && errno == EINVAL);
	si.attr.max_sge = 1;
	srq = ibv_create_srq(pd, &si);
	cr_assert(srq, "errno %d", errno);
	for (int i = 0; i < 5; i++)
		rwr[i] = (struct ibv_recv_wr){.wr_id = 100 + (uint64_t)i,
					      .next = i < 4 ? &rwr[i + 1] : NULL,
					      .sg_list = &sge,
					      .num_sge = 1};
	cr_expect(ibv_post_srq_recv(srq, rwr, &bad) == ENOMEM && bad == &rwr[4], "4 of 5 fit");
	rwr[0].num_sge = 2;
	rwr[0].next = NULL;
	tx = qp_new(NULL, 4);
	rx = qp_new(srq, 4);
	qp_connect(tx, rx->qp_num);
	qp_connect(rx, tx->qp_num);
	sge.addr = (uintptr_t)buf;
	memset(buf, 0x77, 100);
	sge.length = 100;
	cr_assert(ibv_post_send(tx, &swr, &sbad) == 0);
	for (int k = 0; k < 2; k++) {
		wc = wait_wc();
		if (wc.wr_id == 7)
			cr_expect(wc.status == IBV_WC_SUCCESS && wc.qp_num == tx->qp_num);
		else
			cr_expect(wc.wr_id == 100 && wc.status == IBV_WC_SUCCESS &&
				      wc.qp_num == rx->qp_num && wc.src_qp == tx->qp_num &&
				      wc.byte_len == 100,
				  "wr_id %llu status %d", (unsigned long long)wc.wr_id, wc.status);
	}
	cr_expect(buf[4096 + 99] == 0x77 && buf[4096 + 100] == 0);
	/* One slot free again; a receive with more SGEs than max_sge is refused. */
	cr_expect(ibv_post_srq_recv(srq, rwr, &bad) == EINVAL && bad == rwr);
	cr_expect(ibv_destroy_srq(srq) == EBUSY);
	cr_assert(ibv_destroy_qp(rx) == 0);
	cr_expect(ibv_destroy_srq(srq) == 0);
}

/* ---- the extended send API ---- */

static struct ibv_qp *qpx_new(uint32_t depth)
{
	struct ibv_qp_init_attr_ex ex = {
	    .send_cq = cq,
	    .recv_cq = cq,
	    .cap = {.max_send_wr = depth,
		    .max_recv_wr = 8,
		    .max_send_sge = 2,
		    .max_recv_sge = 1,
		    .max_inline_data = 64},
	    .qp_type = IBV_QPT_RC,
	    .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
	    .pd = pd,
	    .send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
			      IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_SEND};
	struct ibv_qp *qp = ibv_create_qp_ex(ctx, &ex);

	cr_assert(qp, "create_qp_ex: errno %d", errno);
	cr_expect(ex.cap.max_send_wr == depth);
	return qp;
}

Test(compat, wr_api_posts_all_or_nothing)
{
	struct ibv_qp *qp = qpx_new(4);
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(qp);
	struct ibv_sge sg[2] = {{.addr = (uintptr_t)buf, .length = 16, .lkey = mr->lkey},
				{.addr = (uintptr_t)buf + 100, .length = 16, .lkey = mr->lkey}};
	struct ibv_sge rsge = {.addr = (uintptr_t)buf + 8192, .length = 64, .lkey = mr->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 50, .sg_list = &rsge, .num_sge = 1}, *rbad;
	uint8_t inl[40];
	struct ibv_wc wc;
	int seen = 0;

	cr_assert(x && &x->qp_base == qp);
	qp_connect(qp, qp->qp_num);
	for (int i = 0; i < 200; i++)
		buf[i] = (uint8_t)i;
	memset(inl, 0xab, sizeof(inl));
	cr_assert(ibv_post_recv(qp, &rwr, &rbad) == 0);
	/* Two SGEs written, inline data written with immediate, one READ back. */
	ibv_wr_start(x);
	x->wr_id = 1;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(x, mr->rkey, (uintptr_t)buf + 4096);
	ibv_wr_set_sge_list(x, 2, sg);
	x->wr_id = 2;
	ibv_wr_rdma_write_imm(x, mr->rkey, (uintptr_t)buf + 5000, htobe32(9));
	ibv_wr_set_inline_data(x, inl, sizeof(inl));
	memset(inl, 0, sizeof(inl)); /* inline data is copied at the call */
	x->wr_id = 3;
	ibv_wr_rdma_read(x, mr->rkey, (uintptr_t)buf + 4096);
	ibv_wr_set_sge(x, mr->lkey, (uintptr_t)buf + 6000, 32);
	cr_assert(ibv_wr_complete(x) == 0);
	for (int k = 0; k < 4; k++) {
		wc = wait_wc();
		cr_expect(wc.status == IBV_WC_SUCCESS, "wr_id %llu status %d",
			  (unsigned long long)wc.wr_id, wc.status);
		seen |= 1 << (wc.wr_id == 50 ? 0 : wc.wr_id);
		if (wc.wr_id == 50)
			cr_expect(wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
				  wc.imm_data == htobe32(9) && wc.byte_len == 40);
	}
	cr_expect(seen == 0xf, "completions %#x", seen);
	cr_expect(memcmp(buf + 4096, buf, 16) == 0 && memcmp(buf + 4112, buf + 100, 16) == 0);
	cr_expect(buf[5000] == 0xab && buf[5039] == 0xab && buf[5040] == 0);
	cr_expect(memcmp(buf + 6000, buf + 4096, 32) == 0);
	/* Aborted: nothing runs. */
	ibv_wr_start(x);
	x->wr_id = 4;
	ibv_wr_rdma_write(x, mr->rkey, (uintptr_t)buf + 7000);
	ibv_wr_set_sge(x, mr->lkey, (uintptr_t)buf, 8);
	ibv_wr_abort(x);
	expect_no_wc();
	cr_expect(buf[7001] == 0);
	/* More than the queue holds: ibv_wr_complete says ENOMEM and posts none of them. */
	ibv_wr_start(x);
	for (int i = 0; i < 5; i++) {
		x->wr_id = 10 + (uint64_t)i;
		ibv_wr_rdma_write(x, mr->rkey, (uintptr_t)buf + 7000);
		ibv_wr_set_sge(x, mr->lkey, (uintptr_t)buf, 8);
	}
	cr_expect(ibv_wr_complete(x) == ENOMEM);
	expect_no_wc();
	cr_expect(buf[7001] == 0);
	/* Too much inline data, or a READ with inline data, fails the batch. */
	ibv_wr_start(x);
	ibv_wr_rdma_write(x, mr->rkey, (uintptr_t)buf + 7000);
	ibv_wr_set_inline_data(x, buf, 65);
	cr_expect(ibv_wr_complete(x) == ENOMEM);
	ibv_wr_start(x);
	ibv_wr_rdma_read(x, mr->rkey, (uintptr_t)buf + 7000);
	ibv_wr_set_inline_data(x, buf, 8);
	cr_expect(ibv_wr_complete(x) == EINVAL);
	expect_no_wc();
	/* The queue still takes a full batch afterwards. */
	ibv_wr_start(x);
	for (int i = 0; i < 4; i++) {
		x->wr_id = 20 + (uint64_t)i;
		ibv_wr_rdma_write(x, mr->rkey, (uintptr_t)buf + 7000 + 8 * (uint64_t)i);
		ibv_wr_set_sge(x, mr->lkey, (uintptr_t)buf + 8, 8);
	}
	cr_assert(ibv_wr_complete(x) == 0);
	for (int i = 0; i < 4; i++)
		cr_expect(wait_wc().wr_id == 20 + (uint64_t)i);
	cr_expect(memcmp(buf + 7024, buf + 8, 8) == 0);
}
