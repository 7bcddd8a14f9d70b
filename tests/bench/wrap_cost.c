/*
 * Benchmark of R2CC's per-call cost on its fast paths (no failure anywhere):
 *  - NCCL: ncclAllReduce / ncclSend through the preloaded wrapper against
 *    NCCL's own pnccl* entry point, both calling a do-nothing NCCL, measured
 *    side by side in one process;
 *  - verbs: poll_cq on an empty CQ, post_send of a zero-byte RDMA WRITE, and a
 *    signalled zero-byte WRITE posted and its completion polled (one request's
 *    whole round through the wrappers, as NCCL's proxy makes it), through the
 *    context ops, over the software device; run once with and once without the
 *    preload, the difference is the wrappers' cost.
 * Prints ns per call (best of 5 rounds).
 *   wrap_cost nccl | verbs [QPS]   (QPS: the round turns over that many QPs, default 1)
 */
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

ncclResult_t pncclAllReduce(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
			    cudaStream_t);
ncclResult_t pncclSend(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define ROUNDS		  5
#define WRAP_COST_MAX_QPS 256

#define TIME_LOOP(n, best, body)                                                                   \
	do {                                                                                       \
		best = 1e30;                                                                       \
		for (int r_ = 0; r_ < ROUNDS; r_++) {                                              \
			double t0_ = now();                                                        \
			for (long i_ = 0; i_ < (n); i_++) {                                        \
				body;                                                              \
			}                                                                          \
			double dt_ = (now() - t0_) * 1e9 / (double)(n);                            \
			if (dt_ < best)                                                            \
				best = dt_;                                                        \
		}                                                                                  \
	} while (0)

static int bench_nccl(void)
{
	const long n = 20 * 1000 * 1000;
	double wrapped, direct, swrapped, sdirect;
	volatile ncclComm_t comm = (ncclComm_t)0x1234;
	char buf[8];
	TIME_LOOP(n, wrapped, ncclAllReduce(buf, buf, 1, ncclFloat, ncclSum, comm, 0));
	TIME_LOOP(n, direct, pncclAllReduce(buf, buf, 1, ncclFloat, ncclSum, comm, 0));
	TIME_LOOP(n, swrapped, ncclSend(buf, 1, ncclFloat, 1, comm, 0));
	TIME_LOOP(n, sdirect, pncclSend(buf, 1, ncclFloat, 1, comm, 0));
	Dl_info info;
	dladdr((void *)ncclAllReduce, &info);
	printf("nccl: ncclAllReduce via %s: %.2f ns/call, pncclAllReduce direct: %.2f ns/call, "
	       "wrapper cost %.2f ns\n",
	       strrchr(info.dli_fname, '/') ? strrchr(info.dli_fname, '/') + 1 : info.dli_fname,
	       wrapped, direct, wrapped - direct);
	printf(
	    "nccl: ncclSend: %.2f ns/call, pncclSend direct: %.2f ns/call, wrapper cost %.2f ns\n",
	    swrapped, sdirect, swrapped - sdirect);
	return 0;
}

/* Polls cq until one completion comes: 0 if it succeeded, -1 on an error status or
 * a failed poll. */
static int reap_one(struct ibv_context *ctx, struct ibv_cq *cq)
{
	struct ibv_wc wc[16];
	for (;;) {
		int k = ctx->ops.poll_cq(cq, 16, wc);
		if (k < 0)
			return -1;
		if (k > 0)
			return wc[0].status == IBV_WC_SUCCESS ? 0 : -1;
	}
}

static int bench_verbs(int nqps)
{
	void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return fprintf(stderr, "no libibverbs: %s\n", dlerror()), 1;
#define R(name, type) __typeof__(type) name##_p = (__typeof__(type))dlvsym(h, #name, "IBVERBS_1.1")
	R(ibv_get_device_list, struct ibv_device * *(*)(int *));
	R(ibv_open_device, struct ibv_context * (*)(struct ibv_device *));
	R(ibv_alloc_pd, struct ibv_pd * (*)(struct ibv_context *));
	R(ibv_create_cq, struct ibv_cq * (*)(struct ibv_context *, int, void *, void *, int));
	R(ibv_create_qp, struct ibv_qp * (*)(struct ibv_pd *, struct ibv_qp_init_attr *));
	R(ibv_modify_qp, int (*)(struct ibv_qp *, struct ibv_qp_attr *, int));
	R(ibv_query_port, int (*)(struct ibv_context *, uint8_t, struct ibv_port_attr *));
	R(ibv_reg_mr, struct ibv_mr * (*)(struct ibv_pd *, void *, size_t, int));
#undef R
	int nd;
	struct ibv_device **devs = ibv_get_device_list_p(&nd);
	if (!devs || nd < 1)
		return fprintf(stderr, "no device\n"), 1;
	struct ibv_context *ctx = ibv_open_device_p(devs[0]);
	struct ibv_pd *pd = ibv_alloc_pd_p(ctx);
	struct ibv_cq *cq = ibv_create_cq_p(ctx, 1024, NULL, NULL, 0);
	struct ibv_port_attr pa;
	memset(&pa, 0, sizeof(pa));
	ibv_query_port_p(ctx, 1, &pa);
	static char buf[64];
	struct ibv_mr *mr =
	    ibv_reg_mr_p(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_qp *qps[WRAP_COST_MAX_QPS];
	for (int k = 0; k < nqps; k++) {
		struct ibv_qp_init_attr qa = {.send_cq = cq,
					      .recv_cq = cq,
					      .qp_type = IBV_QPT_RC,
					      .cap = {.max_send_wr = 512,
						      .max_recv_wr = 16,
						      .max_send_sge = 1,
						      .max_recv_sge = 1}};
		struct ibv_qp *qp = ibv_create_qp_p(pd, &qa);
		struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
					.port_num = 1,
					.qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
		ibv_modify_qp_p(
		    qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_RTR;
		a.path_mtu = IBV_MTU_4096;
		a.dest_qp_num = qp->qp_num;
		a.ah_attr.dlid = pa.lid;
		a.ah_attr.port_num = 1;
		a.max_dest_rd_atomic = 1;
		a.min_rnr_timer = 12;
		ibv_modify_qp_p(qp, &a,
				IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				    IBV_QP_MIN_RNR_TIMER);
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_RTS;
		a.timeout = 14;
		a.retry_cnt = 7;
		a.rnr_retry = 7;
		a.max_rd_atomic = 1;
		if (ibv_modify_qp_p(qp, &a,
				    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
			return fprintf(stderr, "cannot bring the QP up\n"), 1;
		qps[k] = qp;
	}
	struct ibv_qp *qp = qps[0];
	struct ibv_wc wc[16];
	double poll_ns, post_ns;
	TIME_LOOP(5 * 1000 * 1000, poll_ns, ctx->ops.poll_cq(cq, 16, wc));
	/* Zero-byte writes, every 64th signalled and reaped so the queue drains. */
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 0, .lkey = mr->lkey};
	struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE};
	wr.wr.rdma.remote_addr = (uintptr_t)buf;
	wr.wr.rdma.rkey = mr->rkey;
	struct ibv_send_wr *bad;
	long failed = 0;
	TIME_LOOP(200 * 1000, post_ns, {
		wr.send_flags = (i_ % 64 == 63) ? IBV_SEND_SIGNALED : 0;
		if (ctx->ops.post_send(qp, &wr, &bad))
			failed++;
		else if (i_ % 64 == 63 && reap_one(ctx, cq))
			failed++;
	});
	/* Every write signalled and its completion reaped before the next, on the QPs in
	 * turn (one QP unless asked for more: a proxy thread turns over many). */
	double reap_ns;
	TIME_LOOP(100 * 1000, reap_ns, {
		wr.send_flags = IBV_SEND_SIGNALED;
		if (ctx->ops.post_send(qps[i_ % nqps], &wr, &bad) || reap_one(ctx, cq))
			failed++;
	});
	Dl_info info;
	dladdr((void *)ctx->ops.poll_cq, &info);
	const char *who =
	    strrchr(info.dli_fname, '/') ? strrchr(info.dli_fname, '/') + 1 : info.dli_fname;
	printf("verbs (ops from %s): poll_cq empty %.1f ns/call, post_send zero-byte write %.1f "
	       "ns/call, signalled write posted and reaped %.1f ns (%d QP%s in turn)%s\n",
	       who, poll_ns, post_ns, reap_ns, nqps, nqps > 1 ? "s" : "",
	       failed ? " (some posts or completions failed)" : "");
	return failed ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "nccl"))
		return bench_nccl();
	if (argc > 1 && !strcmp(argv[1], "verbs")) {
		int nqps = argc > 2 ? atoi(argv[2]) : 1;
		if (nqps < 1 || nqps > WRAP_COST_MAX_QPS)
			return fprintf(stderr, "QPs: 1 to %d\n", WRAP_COST_MAX_QPS), 2;
		return bench_verbs(nqps);
	}
	fprintf(stderr, "usage: %s nccl | verbs [QPS]\n", argv[0]);
	return 2;
}
