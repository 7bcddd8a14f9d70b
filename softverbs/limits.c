/*
 * softverbs-limits: every limit of ibv_device_attr and ibv_port_attr, as the device
 * reports it against what its verbs accept, found by trying (the largest size taken,
 * by bisection; how many objects a table takes; the largest index answered). It prints
 * a Markdown table; issue #39's evidence (logs/softverbs/contract-39.md) is its output
 * for the device before and after. It makes a fabric of its own and removes it. Run
 * it against another build of the device with LD_LIBRARY_PATH (its RUNPATH yields).
 *
 *   softverbs-limits        exit status 0 when every limit is honoured, 1 otherwise
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_port_attr pa;
static int failures;

/* One row; `ok`: the reported limit is taken and one more is not (or as noted). */
static void row(const char *field, long long reported, const char *accepted, bool ok)
{
	printf("| %s | %lld | %s | %s |\n", field, reported, accepted, ok ? "yes" : "**no**");
	failures += !ok;
}

/* The largest v in [0, hi] with try(v) true, try being monotone; -1 if none. */
static long long largest(bool (*try)(long long), long long hi)
{
	long long lo = -1;

	while (lo < hi) {
		long long mid = lo + (hi - lo + 1) / 2;

		if (try(mid))
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

static void size_row(const char *field, long long reported, bool (*try)(long long), long long hi)
{
	long long got = largest(try, hi);
	char buf[64];

	snprintf(buf, sizeof(buf), got == hi ? ">= %lld" : "%lld", got);
	row(field, reported, buf, got == reported);
}

/*
 * A send queue is the program's own memory and takes more than max_qp_wr x max_sge,
 * as a kernel's max_sge is min(max_send_sge, max_recv_sge): at least is honoured.
 */
static void send_row(const char *field, long long reported, bool (*try)(long long), long long hi)
{
	long long got = largest(try, hi);
	char buf[64];

	snprintf(buf, sizeof(buf), got == hi ? ">= %lld" : "%lld", got);
	row(field, reported, buf, got >= reported);
}

static bool qp_try(uint32_t swr, uint32_t rwr, uint32_t ssge, uint32_t rsge)
{
	struct ibv_qp_init_attr init = {
	    .send_cq = cq, .recv_cq = cq, .cap = {swr, rwr, ssge, rsge, 0}, .qp_type = IBV_QPT_RC};
	struct ibv_qp *qp = ibv_create_qp(pd, &init);

	return qp && ibv_destroy_qp(qp) == 0;
}

static bool recv_wr(long long v)
{
	return v < 1 || qp_try(1, (uint32_t)v, 1, 1);
}
static bool send_wr(long long v)
{
	return v < 1 || qp_try((uint32_t)v, 1, 1, 1);
}
static bool recv_sge(long long v)
{
	return v < 1 || qp_try(1, 1, 1, (uint32_t)v);
}
static bool send_sge(long long v)
{
	return v < 1 || qp_try(1, 1, (uint32_t)v, 1);
}

static bool srq_try(uint32_t wr, uint32_t sge)
{
	struct ibv_srq_init_attr si = {.attr = {.max_wr = wr, .max_sge = sge}};
	struct ibv_srq *srq = ibv_create_srq(pd, &si);

	return srq && ibv_destroy_srq(srq) == 0;
}
static bool srq_wr(long long v)
{
	return v < 1 || srq_try((uint32_t)v, 1);
}
static bool srq_sge(long long v)
{
	return v < 1 || srq_try(1, (uint32_t)v);
}

static bool cqe_try(long long v)
{
	struct ibv_cq *c = ibv_create_cq(ctx, (int)v, NULL, NULL, 0);

	return c && ibv_destroy_cq(c) == 0;
}

static bool vector_try(long long v)
{
	struct ibv_cq *c = ibv_create_cq(ctx, 1, NULL, NULL, (int)v);

	return c && ibv_destroy_cq(c) == 0;
}

/* A QP connected to itself up to RTR (dest_rd: max_dest_rd_atomic) or RTS (init_rd). */
static bool rd_atom_try(int dest_rd, int init_rd, enum ibv_mtu mtu)
{
	struct ibv_qp_init_attr init = {
	    .send_cq = cq, .recv_cq = cq, .cap = {1, 1, 1, 1, 0}, .qp_type = IBV_QPT_RC};
	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1};
	bool ok;

	if (!qp)
		return false;
	ok = ibv_modify_qp(
		 qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = qp->qp_num;
	a.ah_attr.dlid = pa.lid;
	a.ah_attr.port_num = 1;
	a.max_dest_rd_atomic = (uint8_t)dest_rd;
	ok = ok && ibv_modify_qp(qp, &a,
				 IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				     IBV_QP_MIN_RNR_TIMER) == 0;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = (uint8_t)init_rd;
	ok = ok &&
	     ibv_modify_qp(qp, &a,
			   IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			       IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0;
	ibv_destroy_qp(qp);
	return ok;
}
static bool dest_rd(long long v)
{
	return rd_atom_try((int)v, 1, IBV_MTU_1024);
}
static bool init_rd(long long v)
{
	return rd_atom_try(1, (int)v, IBV_MTU_1024);
}

static bool pkey_try(long long v)
{
	__be16 pkey;

	return ibv_query_pkey(ctx, 1, (int)v, &pkey) == 0;
}
static bool pkey_index_try(long long v)
{
	struct ibv_qp_init_attr init = {
	    .send_cq = cq, .recv_cq = cq, .cap = {1, 1, 1, 1, 0}, .qp_type = IBV_QPT_RC};
	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .pkey_index = (uint16_t)v};
	bool ok;

	if (!qp)
		return false;
	ok = ibv_modify_qp(
		 qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0;
	ibv_destroy_qp(qp);
	return ok;
}
static bool gid_try(long long v)
{
	union ibv_gid gid;

	return ibv_query_gid(ctx, 1, (int)v, &gid) == 0;
}

/* Lengths: the largest index answered, plus one. */
static bool pkey_len(long long v)
{
	return v < 1 || pkey_try(v - 1);
}
static bool pkey_index_len(long long v)
{
	return v < 1 || pkey_index_try(v - 1);
}
static bool gid_len(long long v)
{
	return v < 1 || gid_try(v - 1);
}
static bool vector_len(long long v)
{
	return v < 1 || vector_try(v - 1);
}

/* How many objects a table takes, up to cap; `make` makes one, `drop` frees them. */
enum obj { OBJ_QP, OBJ_CQ, OBJ_MR, OBJ_SRQ, OBJ_PD };

static long long count(enum obj kind, long long cap)
{
	static char page[4096];
	void **o = calloc((size_t)cap, sizeof(*o));
	long long n = 0;

	if (!o)
		return -1;
	for (; n < cap; n++) {
		struct ibv_qp_init_attr qi = {
		    .send_cq = cq, .recv_cq = cq, .cap = {1, 1, 1, 1, 0}, .qp_type = IBV_QPT_RC};
		struct ibv_srq_init_attr si = {.attr = {.max_wr = 1, .max_sge = 1}};

		switch (kind) {
		case OBJ_QP:
			o[n] = ibv_create_qp(pd, &qi);
			break;
		case OBJ_CQ:
			o[n] = ibv_create_cq(ctx, 1, NULL, NULL, 0);
			break;
		case OBJ_MR:
			o[n] = ibv_reg_mr(pd, page, sizeof(page), IBV_ACCESS_LOCAL_WRITE);
			break;
		case OBJ_SRQ:
			o[n] = ibv_create_srq(pd, &si);
			break;
		case OBJ_PD:
			o[n] = ibv_alloc_pd(ctx);
			break;
		}
		if (!o[n])
			break;
	}
	for (long long i = 0; i < n; i++) {
		switch (kind) {
		case OBJ_QP:
			ibv_destroy_qp(o[i]);
			break;
		case OBJ_CQ:
			ibv_destroy_cq(o[i]);
			break;
		case OBJ_MR:
			ibv_dereg_mr(o[i]);
			break;
		case OBJ_SRQ:
			ibv_destroy_srq(o[i]);
			break;
		case OBJ_PD:
			ibv_dealloc_pd(o[i]);
			break;
		}
	}
	free(o);
	return n;
}

/* held: objects of that table this program holds already (its PD, its CQ). */
static void table_row(const char *field, long long reported, enum obj kind, long long held)
{
	long long n = count(kind, reported + 1 - held) + held;
	char buf[64];

	snprintf(buf, sizeof(buf), n > reported ? "> %lld" : "%lld", n > reported ? reported : n);
	row(field, reported, buf, n == reported);
}

/* A capability reported as none: its verb must refuse. */
static void zero_row(const char *field, long long reported, bool refused, const char *verb)
{
	char buf[96];

	snprintf(buf, sizeof(buf), "%s %s", verb, refused ? "refused" : "taken");
	row(field, reported, buf, reported == 0 && refused);
}

int main(void)
{
	char fabric[64], shm[72];
	struct ibv_device **devs;
	struct ibv_device_attr da;
	struct ibv_ah_attr ah = {.dlid = 1, .port_num = 1};
	union ibv_gid mgid = {{0}};
	struct ibv_qp *qp;
	struct ibv_qp_init_attr qi;
	bool mcast;
	char buf[64];

	snprintf(fabric, sizeof(fabric), "softverbs-limits-%d", (int)getpid());
	setenv("SOFTVERBS_FABRIC", fabric, 1);
	setenv("SOFTVERBS_NODE", "limits", 1);
	devs = ibv_get_device_list(NULL);
	if (!devs || !devs[0]) {
		fprintf(stderr, "softverbs-limits: no device\n");
		return 2;
	}
	ctx = ibv_open_device(devs[0]);
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	cq = ctx ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
	if (!pd || !cq || ibv_query_device(ctx, &da) || ibv_query_port(ctx, 1, &pa)) {
		fprintf(stderr, "softverbs-limits: cannot open %s\n", ibv_get_device_name(devs[0]));
		return 2;
	}
	printf("| limit | reported | accepted | honoured |\n|---|---:|---:|---|\n");
	size_row("max_qp_wr (max_recv_wr)", da.max_qp_wr, recv_wr, 65536);
	send_row("max_qp_wr (max_send_wr)", da.max_qp_wr, send_wr, 65536);
	size_row("max_sge (max_recv_sge)", da.max_sge, recv_sge, 64);
	send_row("max_sge (max_send_sge)", da.max_sge, send_sge, 64);
	snprintf(buf, sizeof(buf), "%s",
		 qp_try((uint32_t)da.max_qp_wr, (uint32_t)da.max_qp_wr, (uint32_t)da.max_sge,
			(uint32_t)da.max_sge)
		     ? "taken"
		     : "refused");
	row("a QP of max_qp_wr x max_sge both ways", da.max_qp_wr, buf, buf[0] == 't');
	size_row("max_sge_rd (send SGEs of a READ)", da.max_sge_rd, send_sge, 64);
	row("max_cqe", da.max_cqe,
	    cqe_try(da.max_cqe) ? (cqe_try((long long)da.max_cqe + 1) ? "> max_cqe" : "max_cqe")
				: "refused",
	    cqe_try(da.max_cqe) && !cqe_try((long long)da.max_cqe + 1));
	size_row("max_srq_wr", da.max_srq_wr, srq_wr, 65536);
	size_row("max_srq_sge", da.max_srq_sge, srq_sge, 64);
	size_row("max_qp_rd_atom (max_dest_rd_atomic)", da.max_qp_rd_atom, dest_rd, 255);
	size_row("max_qp_init_rd_atom (max_rd_atomic)", da.max_qp_init_rd_atom, init_rd, 255);
	table_row("max_qp", da.max_qp, OBJ_QP, 0);
	table_row("max_cq", da.max_cq, OBJ_CQ, 1);
	table_row("max_mr", da.max_mr, OBJ_MR, 0);
	table_row("max_srq", da.max_srq, OBJ_SRQ, 0);
	table_row("max_pd", da.max_pd, OBJ_PD, 1);
	/* A table's largest index + 1 is its length. */
	size_row("max_pkeys (ibv_query_pkey index + 1)", da.max_pkeys, pkey_len, 64);
	printf("| max_mr_size | %llu | any range the process has mapped (not probed) | - |\n",
	       (unsigned long long)da.max_mr_size);
	printf("| max_res_rd_atom | %d | max_qp x max_qp_rd_atom (not a per-call limit) | - |\n",
	       da.max_res_rd_atom);
	row("atomic_cap (IBV_ATOMIC_NONE = 0)", da.atomic_cap, "atomics refused at post",
	    da.atomic_cap == IBV_ATOMIC_NONE);
	zero_row("max_ah", da.max_ah, !ibv_create_ah(pd, &ah), "ibv_create_ah");
	zero_row("max_mw", da.max_mw, !ibv_alloc_mw(pd, IBV_MW_TYPE_1), "ibv_alloc_mw");
	memset(&qi, 0, sizeof(qi));
	qi.send_cq = qi.recv_cq = cq;
	qi.cap = (struct ibv_qp_cap){1, 1, 1, 1, 0};
	qi.qp_type = IBV_QPT_RC;
	qp = ibv_create_qp(pd, &qi);
	mcast = qp && ibv_attach_mcast(qp, &mgid, 0) != 0;
	zero_row("max_mcast_grp", da.max_mcast_grp, mcast, "ibv_attach_mcast");
	zero_row("max_mcast_qp_attach", da.max_mcast_qp_attach, mcast, "ibv_attach_mcast");
	zero_row("max_total_mcast_qp_attach", da.max_total_mcast_qp_attach, mcast,
		 "ibv_attach_mcast");
	if (qp)
		ibv_destroy_qp(qp);
	zero_row("max_fmr, max_map_per_fmr", da.max_fmr + da.max_map_per_fmr, true,
		 "(no FMR verbs in rdma-core)");
	zero_row("max_ee, max_rdd, max_ee_rd_atom, max_ee_init_rd_atom",
		 da.max_ee + da.max_rdd + da.max_ee_rd_atom + da.max_ee_init_rd_atom, true,
		 "(no EE/RD verbs in rdma-core)");
	qi.qp_type = IBV_QPT_RAW_PACKET;
	qp = ibv_create_qp(pd, &qi);
	zero_row("max_raw_ipv6_qp, max_raw_ethy_qp", da.max_raw_ipv6_qp + da.max_raw_ethy_qp, !qp,
		 "a RAW_PACKET QP");
	if (qp)
		ibv_destroy_qp(qp);
	size_row("num_comp_vectors (largest comp_vector + 1)", ctx->num_comp_vectors, vector_len,
		 1000);
	printf("| port max_msg_sz | %u | not probed (a message of 2 GiB) | - |\n", pa.max_msg_sz);
	size_row("port gid_tbl_len (ibv_query_gid index + 1)", pa.gid_tbl_len, gid_len, 1024);
	size_row("port pkey_tbl_len (ibv_query_pkey index + 1)", pa.pkey_tbl_len, pkey_len, 64);
	size_row("port pkey_tbl_len (modify_qp pkey_index + 1)", pa.pkey_tbl_len, pkey_index_len,
		 64);
	row("port max_mtu (path_mtu taken)", pa.max_mtu,
	    rd_atom_try(1, 1, pa.max_mtu) ? "taken" : "refused", rd_atom_try(1, 1, pa.max_mtu));
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(devs);
	snprintf(shm, sizeof(shm), "/%s", fabric);
	shm_unlink(shm);
	printf("\n%d limit(s) not honoured\n", failures);
	return failures ? 1 : 0;
}
