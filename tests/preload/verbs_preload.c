/*
 * Preload test of the verbs door. Loads libibverbs exactly as NCCL does
 * (dlopen, then dlvsym(handle, name, "IBVERBS_1.1")), drives one device
 * through a loopback RC connection (WRITE, WRITE_WITH_IMM into a posted
 * zero-SGE receive, READ), plus calls that must fail, and prints a transcript
 * of every call's result and errno. Run without and with
 * LD_PRELOAD=libr2cc.so, the transcripts must be identical; with the preload
 * the functions handed out and the context's data-path ops must be R2CC's,
 * and R2CC's per-NIC counters must show the bytes posted.
 *
 * verbs_preload_direct is the same program linked against libibverbs: it
 * reaches every function by symbol, as code that links libibverbs does.
 *
 *   verbs_preload [--expect-wrapped | --expect-real | --expect-forwarded]
 * (--expect-forwarded: R2CC_MODE=0 under the preload by symbol, where the names
 * bind to libr2cc.so's exports, which forward; the data-path ops stay the
 * provider's.)
 */
#include "include/r2cc.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define FN(ret, name, params) static ret(*p_##name) params;
FN(struct ibv_device **, ibv_get_device_list, (int *))
FN(void, ibv_free_device_list, (struct ibv_device **))
FN(const char *, ibv_get_device_name, (struct ibv_device *))
FN(struct ibv_context *, ibv_open_device, (struct ibv_device *))
FN(int, ibv_close_device, (struct ibv_context *))
FN(int, ibv_query_device, (struct ibv_context *, struct ibv_device_attr *))
FN(int, ibv_query_port, (struct ibv_context *, uint8_t, struct ibv_port_attr *))
FN(int, ibv_query_gid, (struct ibv_context *, uint8_t, int, union ibv_gid *))
FN(struct ibv_pd *, ibv_alloc_pd, (struct ibv_context *))
FN(int, ibv_dealloc_pd, (struct ibv_pd *))
FN(struct ibv_mr *, ibv_reg_mr, (struct ibv_pd *, void *, size_t, int))
FN(int, ibv_dereg_mr, (struct ibv_mr *))
FN(struct ibv_cq *, ibv_create_cq,
   (struct ibv_context *, int, void *, struct ibv_comp_channel *, int))
FN(int, ibv_destroy_cq, (struct ibv_cq *))
FN(struct ibv_qp *, ibv_create_qp, (struct ibv_pd *, struct ibv_qp_init_attr *))
FN(int, ibv_modify_qp, (struct ibv_qp *, struct ibv_qp_attr *, int))
FN(int, ibv_query_qp, (struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *))
FN(int, ibv_destroy_qp, (struct ibv_qp *))
FN(int, ibv_fork_init, (void))
FN(const char *, ibv_event_type_str, (enum ibv_event_type))
#undef FN

static int failures;
static const char *mode;

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			failures++;                                                                \
			printf("CHECK FAILED %s:%d: ", __FILE__, __LINE__);                        \
			printf(__VA_ARGS__);                                                       \
			printf("\n");                                                              \
		}                                                                                  \
	} while (0)

/* The transcript: what every call returned, with errno for failures. */
static void note_int(const char *what, int rc)
{
	printf("%-36s rc=%d%s%s\n", what, rc, rc ? " " : "", rc ? strerror(rc) : "");
}

static void note_ptr(const char *what, const void *p, int err)
{
	printf("%-36s %s", what, p ? "ok" : "NULL");
	if (!p)
		printf(" errno=%d", err);
	printf("\n");
}

static const char *owner(const void *fn)
{
	Dl_info info;
	if (!dladdr(fn, &info) || !info.dli_fname)
		return "?";
	const char *slash = strrchr(info.dli_fname, '/');
	return slash ? slash + 1 : info.dli_fname;
}

static void check_owner(const char *name, const void *fn)
{
	const char *o = owner(fn);
	if (!strcmp(mode, "--expect-wrapped"))
		CHECK(strstr(o, "libr2cc") != NULL, "%s handed out by %s, not libr2cc", name, o);
	else if (!strcmp(mode, "--expect-real"))
		CHECK(strstr(o, "libibverbs") != NULL, "%s handed out by %s", name, o);
	else if (!strcmp(mode, "--expect-forwarded")) /* by symbol, R2CC_MODE=0 */
		CHECK(strstr(o, "libr2cc") != NULL || strstr(o, "libibverbs") != NULL,
		      "%s bound to %s", name, o);
}

/* A context's data-path op: R2CC's when wrapped, the provider's otherwise. */
static void check_op(const char *name, const void *fn)
{
	const char *o = owner(fn);
	if (!strcmp(mode, "--expect-wrapped"))
		CHECK(strstr(o, "libr2cc") != NULL, "%s is %s's, not libr2cc's", name, o);
	else
		CHECK(strstr(o, "libibverbs") != NULL, "%s is %s's", name, o);
}

static void *resolve(void *h, const char *name)
{
	void *f = dlvsym(h, name, "IBVERBS_1.1");
	if (!f) {
		printf("missing %s@IBVERBS_1.1\n", name);
		failures++;
		return NULL;
	}
	check_owner(name, f);
	return f;
}

static int to_rts(struct ibv_qp *qp, uint16_t lid, uint32_t dqpn)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	int rc = p_ibv_modify_qp(
	    qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	note_int("modify_qp INIT", rc);
	if (rc)
		return rc;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_4096;
	a.dest_qp_num = dqpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = lid;
	a.ah_attr.port_num = 1;
	rc = p_ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				 IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	note_int("modify_qp RTR", rc);
	if (rc)
		return rc;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	rc = p_ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				 IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	note_int("modify_qp RTS", rc);
	return rc;
}

static int poll_n(struct ibv_cq *cq, int want, struct ibv_wc *wc)
{
	int got = 0;
	for (long spins = 0; got < want && spins < 200000000L; spins++) {
		int n = cq->context->ops.poll_cq(cq, want - got, wc + got);
		if (n < 0)
			return n;
		got += n;
	}
	return got;
}

/* One completion, printed as "WHAT  N wr_id=... status=...": whether it is wr_id's
 * with status st. */
static int poll_one(struct ibv_cq *cq, const char *what, uint64_t wr_id, int st, struct ibv_wc *wc)
{
	int got = poll_n(cq, 1, wc);
	printf("%-36s %d wr_id=%llu status=%d\n", what, got,
	       got == 1 ? (unsigned long long)wc[0].wr_id : 0ull,
	       got == 1 ? (int)wc[0].status : -1);
	return got == 1 && wc[0].wr_id == wr_id && (int)wc[0].status == st;
}

int main(int argc, char **argv)
{
	mode = argc > 1 ? argv[1] : "";
	setvbuf(stdout, NULL, _IOLBF, 0);
	void *h = dlopen("libibverbs.so", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		printf("cannot dlopen libibverbs: %s\n", dlerror());
		return 2;
	}
#ifdef PRELOAD_DIRECT
	/* verbs_preload_direct: linked against libibverbs, each function is the symbol
	 * the dynamic linker bound at rdma-core's default version, as for HPC-X's net
	 * plugin; an interposer must export it. */
	(void)resolve;
#define R(name)                                                                                    \
	do {                                                                                       \
		p_##name = (__typeof__(p_##name))(void *)&name;                                    \
		check_owner(#name, (const void *)p_##name);                                        \
	} while (0)
#else
#define R(name) p_##name = (__typeof__(p_##name))resolve(h, #name)
#endif
	R(ibv_get_device_list);
	R(ibv_free_device_list);
	R(ibv_get_device_name);
	R(ibv_open_device);
	R(ibv_close_device);
	R(ibv_query_device);
	R(ibv_query_port);
	R(ibv_query_gid);
	R(ibv_alloc_pd);
	R(ibv_dealloc_pd);
	R(ibv_reg_mr);
	R(ibv_dereg_mr);
	R(ibv_create_cq);
	R(ibv_destroy_cq);
	R(ibv_create_qp);
	R(ibv_modify_qp);
	R(ibv_query_qp);
	R(ibv_destroy_qp);
	R(ibv_fork_init);
	R(ibv_event_type_str);
#undef R
	if (failures)
		return 1;

	printf("event_type_str(PORT_ERR)            %s\n",
	       p_ibv_event_type_str(IBV_EVENT_PORT_ERR));
	int ndev = -1;
	struct ibv_device **list = p_ibv_get_device_list(&ndev);
	note_ptr("get_device_list", list, errno);
	printf("devices                              %d\n", ndev);
	if (!list || ndev < 1)
		return 1;
	printf("device 0                             %s\n", p_ibv_get_device_name(list[0]));
	struct ibv_context *ctx = p_ibv_open_device(list[0]);
	note_ptr("open_device", ctx, errno);
	if (!ctx)
		return 1;
	check_op("ops.post_send", (void *)ctx->ops.post_send);
	check_op("ops.post_recv", (void *)ctx->ops.post_recv);
	check_op("ops.poll_cq", (void *)ctx->ops.poll_cq);

	struct ibv_device_attr da;
	note_int("query_device", p_ibv_query_device(ctx, &da));
	struct ibv_port_attr pa;
	memset(&pa, 0, sizeof(pa));
	note_int("query_port 1", p_ibv_query_port(ctx, 1, &pa));
	printf("port state/lid/link                  %d %u %d\n", pa.state, pa.lid, pa.link_layer);
	note_int("query_port 9 (no such port)", p_ibv_query_port(ctx, 9, &pa));
	union ibv_gid gid;
	note_int("query_gid 0", p_ibv_query_gid(ctx, 1, 0, &gid));

	struct ibv_pd *pd = p_ibv_alloc_pd(ctx);
	note_ptr("alloc_pd", pd, errno);
	size_t len = 1 << 20;
	char *src = malloc(len), *dst = calloc(1, len), *back = calloc(1, len);
	for (size_t i = 0; i < len; i++)
		src[i] = (char)(i * 31 + 7);
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	struct ibv_mr *msrc = p_ibv_reg_mr(pd, src, len, acc);
	struct ibv_mr *mdst = p_ibv_reg_mr(pd, dst, len, acc);
	struct ibv_mr *mback = p_ibv_reg_mr(pd, back, len, acc);
	note_ptr("reg_mr src", msrc, errno);
	note_ptr("reg_mr dst", mdst, errno);
	note_ptr("reg_mr back", mback, errno);
	struct ibv_cq *cq = p_ibv_create_cq(ctx, 512, NULL, NULL, 0);
	note_ptr("create_cq 512", cq, errno);

	struct ibv_qp_init_attr qa;
	memset(&qa, 0, sizeof(qa));
	qa.send_cq = cq;
	qa.recv_cq = cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 512;
	qa.cap.max_recv_wr = 256;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	struct ibv_qp *qp = p_ibv_create_qp(pd, &qa);
	note_ptr("create_qp RC 512/256", qp, errno);
	struct ibv_qp *qp2 = p_ibv_create_qp(pd, &qa);
	note_ptr("create_qp second", qp2, errno);
	if (!qp || !qp2 || !msrc || !mdst || !mback || !cq)
		return 1;

	/* RESET -> RTS directly is an invalid transition. */
	struct ibv_qp_attr bad;
	memset(&bad, 0, sizeof(bad));
	bad.qp_state = IBV_QPS_RTS;
	note_int("modify_qp RESET->RTS (invalid)", p_ibv_modify_qp(qp2, &bad, IBV_QP_STATE));
	/* The loopback connection: qp talks to qp2 and back. */
	if (to_rts(qp, pa.lid, qp2->qp_num) || to_rts(qp2, pa.lid, qp->qp_num))
		return 1;
	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	note_int("query_qp", p_ibv_query_qp(qp, &qattr, IBV_QP_STATE, &qinit));
	printf("qp state                             %d\n", qattr.qp_state);

	/* NCCL's pattern: a zero-SGE receive, data as a plain WRITE, then a
	 * WRITE_WITH_IMM carrying the size. */
	struct ibv_recv_wr rwr, *rbad = NULL;
	memset(&rwr, 0, sizeof(rwr));
	rwr.wr_id = 77;
	note_int("post_recv zero-SGE", qp2->context->ops.post_recv(qp2, &rwr, &rbad));
	size_t half = len / 2;
	struct ibv_sge s1 = {.addr = (uintptr_t)src, .length = (uint32_t)half, .lkey = msrc->lkey};
	struct ibv_sge s2 = {
	    .addr = (uintptr_t)src + half, .length = (uint32_t)(len - half), .lkey = msrc->lkey};
	struct ibv_send_wr w2 = {.wr_id = 2,
				 .sg_list = &s2,
				 .num_sge = 1,
				 .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
				 .send_flags = IBV_SEND_SIGNALED};
	w2.imm_data = htonl((uint32_t)len);
	w2.wr.rdma.remote_addr = (uintptr_t)dst + half;
	w2.wr.rdma.rkey = mdst->rkey;
	struct ibv_send_wr w1 = {
	    .wr_id = 1, .next = &w2, .sg_list = &s1, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE};
	w1.wr.rdma.remote_addr = (uintptr_t)dst;
	w1.wr.rdma.rkey = mdst->rkey;
	struct ibv_send_wr *sbad = NULL;
	note_int("post_send WRITE + WRITE_WITH_IMM", qp->context->ops.post_send(qp, &w1, &sbad));
	struct ibv_wc wc[4];
	int got = poll_n(cq, 2, wc);
	printf("completions                          %d\n", got);
	CHECK(got == 2, "expected 2 completions, got %d", got);
	int saw_send = 0, saw_recv = 0;
	for (int i = 0; i < got; i++) {
		printf("wc wr_id=%llu status=%d opcode=%d imm=%u len=%u\n",
		       (unsigned long long)wc[i].wr_id, wc[i].status, wc[i].opcode,
		       wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM ? ntohl(wc[i].imm_data) : 0,
		       wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM ? wc[i].byte_len : 0);
		saw_send += wc[i].wr_id == 2 && wc[i].status == IBV_WC_SUCCESS;
		saw_recv += wc[i].wr_id == 77 && wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
			    ntohl(wc[i].imm_data) == (uint32_t)len;
	}
	CHECK(saw_send == 1 && saw_recv == 1, "completions wrong (send %d recv %d)", saw_send,
	      saw_recv);
	CHECK(memcmp(src, dst, len) == 0, "written data differs");

	/* READ it back. */
	struct ibv_sge s3 = {.addr = (uintptr_t)back, .length = (uint32_t)len, .lkey = mback->lkey};
	struct ibv_send_wr w3 = {.wr_id = 3,
				 .sg_list = &s3,
				 .num_sge = 1,
				 .opcode = IBV_WR_RDMA_READ,
				 .send_flags = IBV_SEND_SIGNALED};
	w3.wr.rdma.remote_addr = (uintptr_t)dst;
	w3.wr.rdma.rkey = mdst->rkey;
	note_int("post_send READ", qp->context->ops.post_send(qp, &w3, &sbad));
	got = poll_n(cq, 1, wc);
	CHECK(got == 1 && wc[0].wr_id == 3 && wc[0].status == IBV_WC_SUCCESS, "READ completion");
	CHECK(memcmp(src, back, len) == 0, "read data differs");
	printf("read back                            %s\n",
	       memcmp(src, back, len) ? "differs" : "equal");

	/* A chain whose second request the device refuses (two SGEs, max_send_sge 1): the
	 * first is posted, *bad names the second, the third is not posted. */
	struct ibv_sge s4[2] = {{.addr = (uintptr_t)back, .length = 64, .lkey = mback->lkey},
				{.addr = (uintptr_t)back + 64, .length = 64, .lkey = mback->lkey}};
	struct ibv_send_wr c[3];
	memset(c, 0, sizeof(c));
	for (int i = 0; i < 3; i++) {
		c[i].wr_id = 11 + (uint64_t)i;
		c[i].next = i < 2 ? &c[i + 1] : NULL;
		c[i].sg_list = s4;
		c[i].num_sge = i == 1 ? 2 : 1;
		c[i].opcode = IBV_WR_RDMA_WRITE;
		c[i].send_flags = IBV_SEND_SIGNALED;
		c[i].wr.rdma.remote_addr = (uintptr_t)dst;
		c[i].wr.rdma.rkey = mdst->rkey;
	}
	sbad = NULL;
	int crc = qp->context->ops.post_send(qp, c, &sbad);
	int at = sbad ? (int)(sbad - c) : -1;
	printf("post_send chain, 2nd refused         %s bad=%d\n", crc ? "error" : "ok", at);
	CHECK(crc != 0 && at == 1, "chain post: rc %d, bad at %d, expected an error at 1", crc, at);
	CHECK(poll_one(cq, "chain completions", 11, IBV_WC_SUCCESS, wc),
	      "the chain's first request");
	int late = 0;
	for (int i = 0; i < 100000 && !late; i++)
		late = cq->context->ops.poll_cq(cq, 1, wc);
	CHECK(late == 0, "a request behind the refused one completed (wr_id %llu)",
	      (unsigned long long)wc[0].wr_id);

	/* A receive flushed by NCCL's own move to ERR (as at teardown): its error
	 * completion is the application's, not a failure to hide. */
	memset(&rwr, 0, sizeof(rwr));
	rwr.wr_id = 88;
	note_int("post_recv before ERR", qp2->context->ops.post_recv(qp2, &rwr, &rbad));
	struct ibv_qp_attr err;
	memset(&err, 0, sizeof(err));
	err.qp_state = IBV_QPS_ERR;
	note_int("modify_qp ERR", p_ibv_modify_qp(qp2, &err, IBV_QP_STATE));
	CHECK(poll_one(cq, "flushed", 88, IBV_WC_WR_FLUSH_ERR, wc),
	      "the flushed receive's completion");

	if (!strcmp(mode, "--expect-wrapped")) {
		int (*stats)(struct r2cc_nic_stat *, int) =
		    (int (*)(struct r2cc_nic_stat *, int))dlsym(RTLD_DEFAULT, "r2cc_nic_stats");
		CHECK(stats != NULL, "r2cc_nic_stats not found");
		if (stats) {
			struct r2cc_nic_stat st[8];
			int n = stats(st, 8);
			uint64_t tx = 0, rxw = 0;
			for (int i = 0; i < n && i < 8; i++) {
				tx += st[i].tx_bytes;
				rxw += st[i].rx_wrs;
			}
			/* WRITE + WRITE_WITH_IMM + READ's scatter list + the chain's first. */
			CHECK(tx == 2 * len + 64, "R2CC counted %llu bytes posted, expected %zu",
			      (unsigned long long)tx, 2 * len + 64);
			CHECK(rxw == 1, "R2CC counted %llu receive completions",
			      (unsigned long long)rxw);
		}
	}

	/* A forked child runs as plain verbs: a device it opens through the same
	 * functions keeps the provider's data-path ops. */
	fflush(stdout);
	pid_t child = fork();
	if (child == 0) {
		struct ibv_context *cc = p_ibv_open_device(list[0]);
		int plain = cc && !strstr(owner((void *)cc->ops.post_send), "libr2cc") &&
			    !strstr(owner((void *)cc->ops.poll_cq), "libr2cc");
		if (cc)
			p_ibv_close_device(cc);
		_exit(plain ? 0 : 1);
	}
	int st = 0;
	int plain =
	    child > 0 && waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0;
	printf("forked child's device                %s\n", plain ? "plain" : "wrapped");
	CHECK(plain, "a forked child's device has R2CC's data-path ops (status %d)", st);

	note_int("destroy_qp", p_ibv_destroy_qp(qp));
	note_int("destroy_qp second", p_ibv_destroy_qp(qp2));

	note_int("destroy_cq", p_ibv_destroy_cq(cq));
	note_int("dereg_mr", p_ibv_dereg_mr(msrc));
	note_int("dereg_mr", p_ibv_dereg_mr(mdst));
	note_int("dereg_mr", p_ibv_dereg_mr(mback));
	note_int("dealloc_pd", p_ibv_dealloc_pd(pd));
	note_int("close_device", p_ibv_close_device(ctx));
	p_ibv_free_device_list(list);
	printf("failures                             %d\n", failures);
	return failures ? 1 : 0;
}
