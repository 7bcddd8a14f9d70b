/*
 * Conformance tests of the device and its fabric: a fabric left by a finished job
 * starts afresh, and the device's promises (issue #39): every limit it reports taken
 * and one past it refused, completion vectors, cmd_fd and the import calls.
 */
#include "softverbs/softverbs.h"
#include "tests/softverbs/conformance.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- a fabric left by a finished job starts afresh for the next one ---- */

void leave_down(struct peer *p)
{
	setup(p);
	post(p, 0, IBV_WR_RDMA_WRITE, 1, IBV_SEND_SIGNALED, 0, 1000, 0, p->peer.rkey, 0);
	expect_wc(p, 1, IBV_WC_SUCCESS, 2000, NULL);
	ctl(p, "fault A mlx5_0 down");
	sync_send(p, 1);
}

void find_fresh(struct peer *p)
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
/* ---- issue #39: what ibv_query_device advertises is what the device accepts ---- */

/* B of the single-process tests below: no verbs at all, so A has the fabric's tables. */
void absent_b(struct peer *p)
{
}

static struct ibv_context *open_first(struct peer *p)
{
	struct ibv_device **devs = ibv_get_device_list(NULL);
	struct ibv_context *ctx;

	CHECK(p, devs && devs[0]);
	ctx = ibv_open_device(devs[0]);
	CHECK(p, ctx != NULL, "(errno %d)", errno);
	ibv_free_device_list(devs);
	return ctx;
}

/* A QP with these capabilities, or NULL with errno. */
static struct ibv_qp *qp_with(struct ibv_pd *pd, struct ibv_cq *cq, uint32_t swr, uint32_t rwr,
			      uint32_t ssge, uint32_t rsge)
{
	struct ibv_qp_init_attr init = {.send_cq = cq,
					.recv_cq = cq,
					.cap = {.max_send_wr = swr,
						.max_recv_wr = rwr,
						.max_send_sge = ssge,
						.max_recv_sge = rsge},
					.qp_type = IBV_QPT_RC};

	return ibv_create_qp(pd, &init);
}

#define REFUSED(p, call, err)                                                                      \
	do {                                                                                       \
		errno = 0;                                                                         \
		CHECK(p, (call) == NULL && errno == (err), "(errno %d, want %d)", errno, err);     \
	} while (0)

/*
 * Each limit of ibv_device_attr and ibv_port_attr taken at its value, and refused one
 * past it with the errno a kernel provider gives: EINVAL for a size, ENOMEM for a table
 * that is full. The tables are the fabric's: B opens nothing, so A has all of them.
 */
void limits_a(struct peer *p)
{
	struct ibv_context *ctx = open_first(p);
	struct ibv_device_attr da;
	struct ibv_port_attr pa;
	struct ibv_pd *pd = ibv_alloc_pd(ctx), **pds;
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0), **cqs;
	struct ibv_qp **qps, *qp;
	struct ibv_srq **srqs;
	struct ibv_mr **mrs;
	struct ibv_qp_attr a;
	union ibv_gid gid;
	__be16 pkey;
	unsigned seed = 39;
	static char page[4096];

	CHECK(p, pd && cq);
	CHECK(p, ibv_query_device(ctx, &da) == 0 && ibv_query_port(ctx, 1, &pa) == 0);

	/* Receive queues, the smaller side: both sides at max_qp_wr x max_sge. */
	qp = qp_with(pd, cq, (uint32_t)da.max_qp_wr, (uint32_t)da.max_qp_wr, (uint32_t)da.max_sge,
		     (uint32_t)da.max_sge);
	CHECK(p, qp != NULL, "(max_qp_wr %d max_sge %d: errno %d)", da.max_qp_wr, da.max_sge,
	      errno);
	CHECK(p, ibv_destroy_qp(qp) == 0);
	REFUSED(p, qp_with(pd, cq, 1, (uint32_t)da.max_qp_wr + 1, 1, 1), EINVAL);
	REFUSED(p, qp_with(pd, cq, 1, 1, 1, (uint32_t)da.max_sge + 1), EINVAL);
	/* The program: random sizes up to the reported maximum, every one taken. */
	for (int i = 0; i < 64; i++) {
		uint32_t s = 1 + (uint32_t)rand_r(&seed) % (uint32_t)da.max_qp_wr;
		uint32_t r = 1 + (uint32_t)rand_r(&seed) % (uint32_t)da.max_qp_wr;
		uint32_t g = 1 + (uint32_t)rand_r(&seed) % (uint32_t)da.max_sge;

		qp = qp_with(pd, cq, s, r, g, g);
		CHECK(p, qp != NULL, "(send %u recv %u sge %u: errno %d)", s, r, g, errno);
		CHECK(p, ibv_destroy_qp(qp) == 0);
	}
	/* Send queues are process-local and take more, as a kernel's max_send_sge may. */
	qp = qp_with(pd, cq, 32768, 1, 30, 1);
	CHECK(p, qp != NULL, "(errno %d)", errno);
	CHECK(p, ibv_destroy_qp(qp) == 0);
	REFUSED(p, qp_with(pd, cq, 32769, 1, 1, 1), EINVAL);
	REFUSED(p, qp_with(pd, cq, 1, 1, 31, 1), EINVAL);
	{
		struct ibv_qp_init_attr ud = {
		    .send_cq = cq, .recv_cq = cq, .cap = {1, 1, 1, 1, 0}, .qp_type = IBV_QPT_UD};

		REFUSED(p, ibv_create_qp(pd, &ud), EOPNOTSUPP);
	}

	/* SRQs. */
	{
		struct ibv_srq_init_attr si = {.attr = {.max_wr = (uint32_t)da.max_srq_wr,
							.max_sge = (uint32_t)da.max_srq_sge}};
		struct ibv_srq *srq = ibv_create_srq(pd, &si);

		CHECK(p, srq != NULL, "(max_srq_wr %d max_srq_sge %d: errno %d)", da.max_srq_wr,
		      da.max_srq_sge, errno);
		CHECK(p, ibv_destroy_srq(srq) == 0);
		si.attr.max_wr = (uint32_t)da.max_srq_wr + 1;
		si.attr.max_sge = 1;
		REFUSED(p, ibv_create_srq(pd, &si), EINVAL);
		si.attr.max_wr = 1;
		si.attr.max_sge = (uint32_t)da.max_srq_sge + 1;
		REFUSED(p, ibv_create_srq(pd, &si), EINVAL);
	}

	/* CQ size (the largest takes its ring at once, 192 MiB, and gives it back). */
	{
		struct ibv_cq *big = ibv_create_cq(ctx, da.max_cqe, NULL, NULL, 0);

		CHECK(p, big != NULL, "(max_cqe %d: errno %d)", da.max_cqe, errno);
		CHECK(p, ibv_destroy_cq(big) == 0);
		REFUSED(p, ibv_create_cq(ctx, da.max_cqe + 1, NULL, NULL, 0), EINVAL);
		REFUSED(p, ibv_create_cq(ctx, 0, NULL, NULL, 0), EINVAL);
	}

	/* RDMA READ depth, P_Key and GID tables, MTU, on a QP connected to itself. */
	qp = qp_with(pd, cq, 4, 4, 1, 1);
	CHECK(p, qp != NULL);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.pkey_index = pa.pkey_tbl_len;
	CHECK(p, ibv_modify_qp(qp, &a,
			       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				   IBV_QP_ACCESS_FLAGS) == EINVAL);
	a.pkey_index = pa.pkey_tbl_len - 1;
	CHECK(p, ibv_modify_qp(qp, &a,
			       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				   IBV_QP_ACCESS_FLAGS) == 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = pa.max_mtu;
	a.dest_qp_num = qp->qp_num;
	a.ah_attr.dlid = pa.lid;
	a.ah_attr.port_num = 1;
	a.max_dest_rd_atomic = (uint8_t)(da.max_qp_rd_atom + 1);
	int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	CHECK(p, ibv_modify_qp(qp, &a, rtr) == EINVAL);
	a.max_dest_rd_atomic = (uint8_t)da.max_qp_rd_atom;
	CHECK(p, ibv_modify_qp(qp, &a, rtr) == 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = (uint8_t)(da.max_qp_init_rd_atom + 1);
	int rts = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
		  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
	CHECK(p, ibv_modify_qp(qp, &a, rts) == EINVAL);
	a.max_rd_atomic = (uint8_t)da.max_qp_init_rd_atom;
	CHECK(p, ibv_modify_qp(qp, &a, rts) == 0);
	CHECK(p, ibv_destroy_qp(qp) == 0);
	CHECK(p, ibv_query_pkey(ctx, 1, pa.pkey_tbl_len - 1, &pkey) == 0);
	CHECK(p, ibv_query_pkey(ctx, 1, pa.pkey_tbl_len, &pkey) == EINVAL);
	CHECK(p, da.max_pkeys == pa.pkey_tbl_len);
	CHECK(p, ibv_query_gid(ctx, 1, pa.gid_tbl_len - 1, &gid) == 0);
	CHECK(p, ibv_query_gid(ctx, 1, pa.gid_tbl_len, &gid) == -1 && errno == EINVAL);

	/* MR access flags as the kernel checks them. */
	{
		struct ibv_mr *mr = ibv_reg_mr(
		    pd, page, sizeof(page), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING);

		CHECK(p, mr != NULL, "(an optional flag is a hint: errno %d)", errno);
		CHECK(p, ibv_dereg_mr(mr) == 0);
		REFUSED(p, ibv_reg_mr(pd, page, sizeof(page), IBV_ACCESS_REMOTE_WRITE), EINVAL);
		REFUSED(p, ibv_reg_mr(pd, page, sizeof(page), IBV_ACCESS_LOCAL_WRITE | (1 << 10)),
			EINVAL);
		REFUSED(p, ibv_reg_mr(pd, page, sizeof(page), IBV_ACCESS_ON_DEMAND), EOPNOTSUPP);
	}

	/* The tables: every entry, then one more is ENOMEM. */
	CHECK(p, ibv_destroy_cq(cq) == 0);
	cqs = calloc((size_t)da.max_cq, sizeof(*cqs));
	CHECK(p, cqs != NULL);
	for (int i = 0; i < da.max_cq; i++) {
		cqs[i] = ibv_create_cq(ctx, 1, NULL, NULL, 0);
		CHECK(p, cqs[i] != NULL, "(CQ %d of max_cq %d: errno %d)", i, da.max_cq, errno);
	}
	REFUSED(p, ibv_create_cq(ctx, 1, NULL, NULL, 0), ENOMEM);
	for (int i = 1; i < da.max_cq; i++)
		CHECK(p, ibv_destroy_cq(cqs[i]) == 0);
	cq = cqs[0];
	free(cqs);

	qps = calloc((size_t)da.max_qp, sizeof(*qps));
	CHECK(p, qps != NULL);
	for (int i = 0; i < da.max_qp; i++) {
		qps[i] = qp_with(pd, cq, 1, 1, 1, 1);
		CHECK(p, qps[i] != NULL, "(QP %d of max_qp %d: errno %d)", i, da.max_qp, errno);
	}
	REFUSED(p, qp_with(pd, cq, 1, 1, 1, 1), ENOMEM);
	for (int i = 0; i < da.max_qp; i++)
		CHECK(p, ibv_destroy_qp(qps[i]) == 0);
	free(qps);

	srqs = calloc((size_t)da.max_srq, sizeof(*srqs));
	CHECK(p, srqs != NULL);
	for (int i = 0; i < da.max_srq; i++) {
		struct ibv_srq_init_attr si = {.attr = {.max_wr = 1, .max_sge = 1}};

		srqs[i] = ibv_create_srq(pd, &si);
		CHECK(p, srqs[i] != NULL, "(SRQ %d of max_srq %d: errno %d)", i, da.max_srq, errno);
	}
	{
		struct ibv_srq_init_attr si = {.attr = {.max_wr = 1, .max_sge = 1}};

		REFUSED(p, ibv_create_srq(pd, &si), ENOMEM);
	}
	for (int i = 0; i < da.max_srq; i++)
		CHECK(p, ibv_destroy_srq(srqs[i]) == 0);
	free(srqs);

	mrs = calloc((size_t)da.max_mr, sizeof(*mrs));
	CHECK(p, mrs != NULL);
	for (int i = 0; i < da.max_mr; i++) {
		mrs[i] = ibv_reg_mr(pd, page, sizeof(page), IBV_ACCESS_LOCAL_WRITE);
		CHECK(p, mrs[i] != NULL, "(MR %d of max_mr %d: errno %d)", i, da.max_mr, errno);
	}
	REFUSED(p, ibv_reg_mr(pd, page, sizeof(page), IBV_ACCESS_LOCAL_WRITE), ENOMEM);
	for (int i = 0; i < da.max_mr; i++)
		CHECK(p, ibv_dereg_mr(mrs[i]) == 0);
	free(mrs);

	/* PDs: this process holds one already. */
	pds = calloc((size_t)da.max_pd, sizeof(*pds));
	CHECK(p, pds != NULL);
	for (int i = 1; i < da.max_pd; i++) {
		pds[i] = ibv_alloc_pd(ctx);
		CHECK(p, pds[i] != NULL, "(PD %d of max_pd %d: errno %d)", i, da.max_pd, errno);
	}
	REFUSED(p, ibv_alloc_pd(ctx), ENOMEM);
	for (int i = 1; i < da.max_pd; i++)
		CHECK(p, ibv_dealloc_pd(pds[i]) == 0);
	free(pds);

	CHECK(p, ibv_destroy_cq(cq) == 0 && ibv_dealloc_pd(pd) == 0);
	CHECK(p, ibv_close_device(ctx) == 0);
}

/* Completion vectors: those below num_comp_vectors, and nothing else (EINVAL). */
void comp_vector_a(struct peer *p)
{
	struct ibv_context *ctx = open_first(p);
	const int bad[] = {-1, 1000, INT_MAX};

	CHECK(p, ctx->num_comp_vectors >= 1);
	for (int v = 0; v < ctx->num_comp_vectors; v++) {
		struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, v);

		CHECK(p, cq != NULL, "(vector %d: errno %d)", v, errno);
		CHECK(p, ibv_destroy_cq(cq) == 0);
	}
	REFUSED(p, ibv_create_cq(ctx, 16, NULL, NULL, ctx->num_comp_vectors), EINVAL);
	REFUSED(p, ibv_create_cq(ctx, 16, NULL, NULL, ctx->num_comp_vectors + 1), EINVAL);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		REFUSED(p, ibv_create_cq(ctx, 16, NULL, NULL, bad[i]), EINVAL);
	CHECK(p, ibv_close_device(ctx) == 0);
}

/* Descriptors of /dev/null, what a context's cmd_fd is (other threads open others). */
static int null_fds(void)
{
	char path[64], target[64];
	int n = 0;

	for (int fd = 0; fd < 1024; fd++) {
		ssize_t len;

		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		len = readlink(path, target, sizeof(target) - 1);
		if (len > 0) {
			target[len] = '\0';
			n += strcmp(target, "/dev/null") == 0;
		}
	}
	return n;
}

/*
 * cmd_fd is a descriptor a program can dup() and hand on (to a child, to
 * ibv_import_device); sharing objects that way is unsupported, and the import calls
 * say so (NULL, EOPNOTSUPP), in this process and in a child. Contexts give theirs back.
 */
void cmd_fd_a(struct peer *p)
{
	struct ibv_context *ctx = open_first(p);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	static char page[4096];
	struct ibv_mr *mr = ibv_reg_mr(pd, page, sizeof(page), IBV_ACCESS_LOCAL_WRITE);
	int fd, st, before;
	pid_t child;

	CHECK(p, pd && mr);
	fd = dup(ctx->cmd_fd);
	CHECK(p, fd >= 0, "(dup(cmd_fd %d): errno %d)", ctx->cmd_fd, errno);
	REFUSED(p, ibv_import_device(fd), EOPNOTSUPP);
	REFUSED(p, ibv_import_pd(ctx, pd->handle), EOPNOTSUPP);
	REFUSED(p, ibv_import_mr(pd, mr->handle), EOPNOTSUPP);
	child = fork();
	CHECK(p, child >= 0);
	if (child == 0) {
		errno = 0;
		_exit(ibv_import_device(fd) == NULL && errno == EOPNOTSUPP ? 0 : 1);
	}
	CHECK(p, waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CHECK(p, close(fd) == 0);
	CHECK(p, ibv_dereg_mr(mr) == 0 && ibv_dealloc_pd(pd) == 0);
	CHECK(p, ibv_close_device(ctx) == 0);
	before = null_fds();
	for (int i = 0; i < 32; i++) {
		ctx = open_first(p);
		CHECK(p, ctx->cmd_fd >= 0 && ctx->cmd_fd != ctx->async_fd);
		CHECK(p, ibv_close_device(ctx) == 0);
	}
	CHECK(p, null_fds() == before, "(%d descriptors, were %d)", null_fds(), before);
}
