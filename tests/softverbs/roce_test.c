/*
 * Conformance tests of the software RDMA device's RoCE mode (SOFTVERBS_LINK=roce).
 * Each test forks node "A" and node "B" on a private fabric, two NICs each (rail 0 and
 * rail 1); they open both, exchange their GID tables, QP numbers and keys over a
 * socketpair and connect RC QPs with the GRHs a test names. What is checked: the port
 * attributes and the exact GID table through ibv_query_gid, ibv_query_gid_ex,
 * ibv_query_gid_table and ibv_query_gid_type; modify_qp's errors for a missing GRH or
 * a bad sgid_index; which GRHs deliver (same rail with every GID type; across rails
 * only RoCE v2 over IPv4 with SOFTVERBS_ROUTED=1) and that every other one is a black
 * hole in both directions (RETRY_EXC_ERR after the transport timeout, nothing lands);
 * lossy_bytes for a traffic class outside SOFTVERBS_LOSSLESS_TC; the RoCE MTU; the GRH
 * in softverbs-ctl's listing; and that the first process of a fabric sets its mode.
 *
 *   roce [TEST...]     run all tests, or the named ones
 */
#include "softverbs/softverbs.h"
#include "tests/softverbs/harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NNIC	  2
#define NGID	  4
#define MAXQ	  8 /* connections per test */
#define LEN	  (64u << 10)
#define BUF_LEN	  (2u * MAXQ * LEN)
#define TIMEOUT	  14 /* 4.096 us * 2^14 = 67 ms per try */
#define RETRY	  7
#define SCALE	  0.2
#define RETRY_MS  (4.096e-3 * (1 << TIMEOUT) * (RETRY + 1) * SCALE)
#define ACCESS_RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#define NOWHERE	  "::ffff:10.0.0.99" /* an address on rail 0 that no NIC owns */

/* rdma-core's private query (IBVERBS_PRIVATE_*), which ibv_devinfo uses. */
int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
		       int *type);

struct wire {
	union ibv_gid gid[NNIC][NGID];
	uint32_t rkey[NNIC];
	uint32_t qpn[2 * MAXQ];
	uint64_t addr;
};

/* One connection: A's end on a_nic with sgid a_idx, B's on b_nic with b_idx. */
struct conn {
	int a_nic, a_idx, b_nic, b_idx;
	int tc, b_tc;	  /* traffic class of A's end, of B's end */
	bool a_nowhere;	  /* A's dgid is NOWHERE instead of B's GID */
	bool a_other_nic; /* A's dgid is the GID of B's other NIC, not of b_nic's */
	bool delivers;	  /* what the network does with it, both ways */
	const char *what; /* for the failure message */
};

struct peer {
	char role;
	int sock;
	struct ibv_context *ctx[NNIC];
	struct ibv_pd *pd[NNIC];
	struct ibv_cq *cq[NNIC];
	struct ibv_mr *mr[NNIC];
	struct ibv_qp
	    *qp[2 * MAXQ]; /* connection i: qp[i] carries A's requests, qp[MAXQ + i] B's */
	uint8_t *buf;
	struct wire me, peer;
};

typedef void (*role_fn)(struct peer *p);

static union ibv_gid gid_of(const char *text)
{
	union ibv_gid g;

	if (inet_pton(AF_INET6, text, g.raw) != 1)
		memset(&g, 0xee, sizeof(g));
	return g;
}

static bool gid_is(const union ibv_gid *g, const char *text)
{
	union ibv_gid want = gid_of(text);

	return memcmp(g, &want, sizeof(want)) == 0;
}

static const char *gid_str(const union ibv_gid *g, char *buf, size_t len)
{
	return inet_ntop(AF_INET6, g->raw, buf, (socklen_t)len) ? buf : "?";
}

/* Runs softverbs-ctl on the test's fabric; its stdout in out (NUL-terminated). */
static void ctl_out(struct peer *p, const char *args, char *out, size_t len)
{
	char cmd[PATH_MAX + 256];
	size_t n = 0;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "%s --fabric %s %s", ctl_path, fabric, args);
	f = popen(cmd, "r");
	CHECK(p, f != NULL, "(%s)", cmd);
	while (n + 1 < len && fgets(out + n, (int)(len - n), f))
		n += strlen(out + n);
	out[n] = '\0';
	CHECK(p, pclose(f) == 0, "(%s)", cmd);
}

/* Opens both NICs and registers the buffer on each; no QPs yet. */
static void open_nics(struct peer *p)
{
	struct ibv_device **devs = ibv_get_device_list(NULL);
	struct ibv_port_attr pa;

	CHECK(p, devs && devs[0] && devs[1]);
	p->buf = mmap(NULL, BUF_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(p, p->buf != MAP_FAILED);
	memset(p->buf, p->role, BUF_LEN);
	for (int k = 0; k < NNIC; k++) {
		p->ctx[k] = ibv_open_device(devs[k]);
		CHECK(p, p->ctx[k] != NULL);
		p->pd[k] = ibv_alloc_pd(p->ctx[k]);
		p->cq[k] = ibv_create_cq(p->ctx[k], 256, NULL, NULL, 0);
		p->mr[k] = ibv_reg_mr(p->pd[k], p->buf, BUF_LEN, ACCESS_RW);
		CHECK(p, p->pd[k] && p->cq[k] && p->mr[k]);
		CHECK(p, ibv_query_port(p->ctx[k], 1, &pa) == 0);
		for (int i = 0; i < NGID && i < pa.gid_tbl_len; i++)
			CHECK(p, ibv_query_gid(p->ctx[k], 1, i, &p->me.gid[k][i]) == 0);
		p->me.rkey[k] = p->mr[k]->rkey;
	}
	ibv_free_device_list(devs);
	p->me.addr = (uintptr_t)p->buf;
}

static struct ibv_qp *make_qp(struct peer *p, int k)
{
	struct ibv_qp_init_attr init = {
	    .send_cq = p->cq[k],
	    .recv_cq = p->cq[k],
	    .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
	    .qp_type = IBV_QPT_RC,
	};
	struct ibv_qp_attr a = {
	    .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = ACCESS_RW};
	struct ibv_qp *qp = ibv_create_qp(p->pd[k], &init);

	CHECK(p, qp != NULL, "(errno %d)", errno);
	CHECK(p, ibv_modify_qp(qp, &a,
			       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				   IBV_QP_ACCESS_FLAGS) == 0);
	return qp;
}

/* INIT -> RTR with this address vector: modify_qp's return value. */
static int to_rtr(struct ibv_qp *qp, uint32_t dqpn, const struct ibv_ah_attr *ah)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_4096;
	a.dest_qp_num = dqpn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr = *ah;
	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				 IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

/* NCCL's RTR address vector: GRH with sgid_index, the peer's GID, hop limit 255, tc. */
static struct ibv_ah_attr grh_av(int sgid_index, const union ibv_gid *dgid, int tc)
{
	struct ibv_ah_attr ah;

	memset(&ah, 0, sizeof(ah));
	ah.is_global = 1;
	ah.grh.dgid = *dgid;
	ah.grh.sgid_index = (uint8_t)sgid_index;
	ah.grh.hop_limit = 255;
	ah.grh.traffic_class = (uint8_t)tc;
	ah.port_num = 1;
	return ah;
}

static void to_rts(struct peer *p, struct ibv_qp *qp)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTS,
				.timeout = TIMEOUT,
				.retry_cnt = RETRY,
				.rnr_retry = 7,
				.max_rd_atomic = 1};

	CHECK(p, ibv_modify_qp(qp, &a,
			       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				   IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

/* The QP of connection i that carries the requests of `sender`. */
static int qp_index(int i, char sender)
{
	return sender == 'A' ? i : MAXQ + i;
}

/* Creates and connects the QPs of every connection on this side, one per direction. */
static void connect_all(struct peer *p, const struct conn *c, int n)
{
	bool a = p->role == 'A';

	open_nics(p);
	for (int i = 0; i < n; i++)
		for (int d = 0; d < 2; d++) {
			int q = qp_index(i, d ? 'B' : 'A');

			p->qp[q] = make_qp(p, a ? c[i].a_nic : c[i].b_nic);
			p->me.qpn[q] = p->qp[q]->qp_num;
		}
	CHECK(p, write(p->sock, &p->me, sizeof(p->me)) == sizeof(p->me));
	CHECK(p, read(p->sock, &p->peer, sizeof(p->peer)) == sizeof(p->peer));
	for (int i = 0; i < n; i++) {
		union ibv_gid dgid =
		    a ? p->peer.gid[c[i].b_nic][c[i].b_idx] : p->peer.gid[c[i].a_nic][c[i].a_idx];
		struct ibv_ah_attr ah;

		if (a && c[i].a_nowhere)
			dgid = gid_of(NOWHERE);
		if (a && c[i].a_other_nic)
			dgid = p->peer.gid[1 - c[i].b_nic][c[i].b_idx];
		ah = grh_av(a ? c[i].a_idx : c[i].b_idx, &dgid, a ? c[i].tc : c[i].b_tc);
		for (int d = 0; d < 2; d++) {
			int q = qp_index(i, d ? 'B' : 'A');

			CHECK(p, to_rtr(p->qp[q], p->peer.qpn[q], &ah) == 0, "(%s)", c[i].what);
			to_rts(p, p->qp[q]);
		}
	}
	sync_send(p, 100);
	sync_wait(p, 100);
}

/* The sender's data for connection i lands in the receiver's half for that sender. */
static uint64_t landing(char sender, int i)
{
	return (sender == 'A' ? 0 : MAXQ * LEN) + (uint64_t)i * LEN;
}

/* Polls the CQs of both NICs for one completion for up to ms; 1 or 0. */
static int poll_any(struct peer *p, struct ibv_wc *wc, double ms)
{
	double end = now_ms() + ms;

	do {
		for (int k = 0; k < NNIC; k++)
			if (ibv_poll_cq(p->cq[k], 1, wc) == 1)
				return 1;
		usleep(50);
	} while (now_ms() < end);
	return 0;
}

/*
 * One direction: `sender` writes LEN bytes with an immediate on every connection. A
 * connection that delivers completes at once on both ends with the data there; one
 * that does not completes at the sender with RETRY_EXC_ERR after the transport timeout,
 * and the receiver sees neither data nor a completion.
 */
static void traffic(struct peer *p, const struct conn *c, int n, char sender)
{
	bool send = p->role == sender, done[MAXQ] = {false};
	int expect = 0;
	double t0;

	if (!send) {
		for (int i = 0; i < n; i++) {
			struct ibv_recv_wr wr = {.wr_id = 1000 + (uint64_t)i}, *bad = NULL;

			CHECK(p, ibv_post_recv(p->qp[qp_index(i, sender)], &wr, &bad) == 0);
			expect += c[i].delivers;
		}
		sync_send(p, 200 + sender);
		for (int k = 0; k < expect; k++) {
			struct ibv_wc wc;
			int i;

			CHECK(p, poll_any(p, &wc, 3000) == 1, "(%d of %d receives)", k, expect);
			i = (int)wc.wr_id - 1000;
			CHECK(p, wc.status == IBV_WC_SUCCESS && i >= 0 && i < n && c[i].delivers,
			      "(receive %llu status %d)", (unsigned long long)wc.wr_id, wc.status);
			CHECK(p, check_fill(p->buf + landing(sender, i), LEN, (unsigned)i + sender),
			      "(%s: data)", c[i].what);
		}
		sync_wait(p, 300 + sender);
		for (int i = 0; i < n; i++)
			if (!c[i].delivers)
				CHECK(p, p->buf[landing(sender, i)] == p->role,
				      "(%s: landed through a black hole)", c[i].what);
		{
			struct ibv_wc wc;

			CHECK(p, poll_any(p, &wc, 5) == 0, "(stray completion %llu)",
			      (unsigned long long)wc.wr_id);
		}
		return;
	}
	sync_wait(p, 200 + sender);
	t0 = now_ms();
	for (int i = 0; i < n; i++) {
		int mine = p->role == 'A' ? c[i].a_nic : c[i].b_nic;
		int theirs = p->role == 'A' ? c[i].b_nic : c[i].a_nic;
		struct ibv_sge sge = {.addr = (uintptr_t)p->buf + (uint64_t)i * LEN,
				      .length = LEN,
				      .lkey = p->mr[mine]->lkey};
		struct ibv_send_wr wr = {.wr_id = (uint64_t)i,
					 .sg_list = &sge,
					 .num_sge = 1,
					 .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
					 .send_flags = IBV_SEND_SIGNALED,
					 .imm_data = htonl((uint32_t)i)};
		struct ibv_send_wr *bad = NULL;

		fill(p->buf + (uint64_t)i * LEN, LEN, (unsigned)i + sender);
		wr.wr.rdma.remote_addr = p->peer.addr + landing(sender, i);
		wr.wr.rdma.rkey = p->peer.rkey[theirs];
		CHECK(p, ibv_post_send(p->qp[qp_index(i, sender)], &wr, &bad) == 0);
	}
	for (int k = 0; k < n; k++) {
		struct ibv_wc wc;
		double dt;
		int i;

		CHECK(p, poll_any(p, &wc, RETRY_MS * 3 + 2000) == 1, "(%d of %d completions)", k,
		      n);
		dt = now_ms() - t0;
		i = (int)wc.wr_id;
		CHECK(p, i >= 0 && i < n && !done[i]);
		done[i] = true;
		if (c[i].delivers) {
			CHECK(p, wc.status == IBV_WC_SUCCESS, "(%s: status %d)", c[i].what,
			      wc.status);
		} else {
			CHECK(p, wc.status == IBV_WC_RETRY_EXC_ERR, "(%s: status %d, want 12)",
			      c[i].what, wc.status);
			CHECK(p, dt >= RETRY_MS * 0.95, "(%s: gave up after %.0f ms of %.0f)",
			      c[i].what, dt, RETRY_MS);
		}
	}
	sync_send(p, 300 + sender);
}

/* Both directions over the same connections (a black hole swallows acknowledgements). */
static void both_ways(struct peer *p, const struct conn *c, int n)
{
	connect_all(p, c, n);
	traffic(p, c, n, 'A');
	traffic(p, c, n, 'B');
}

/* ---- the port and its GID table ---- */

static void check_port(struct peer *p, struct ibv_context *ctx, int mtu)
{
	struct ibv_port_attr pa;

	CHECK(p, ibv_query_port(ctx, 1, &pa) == 0);
	CHECK(p, pa.link_layer == IBV_LINK_LAYER_ETHERNET && pa.state == IBV_PORT_ACTIVE);
	CHECK(p, pa.lid == 0 && pa.sm_lid == 0 && pa.lmc == 0);
	CHECK(p, pa.port_cap_flags == (IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS), "(0x%08x)",
	      pa.port_cap_flags);
	CHECK(p, pa.gid_tbl_len == 255 && pa.pkey_tbl_len == 1);
	CHECK(p, pa.max_mtu == IBV_MTU_4096 && (int)pa.active_mtu == mtu, "(active_mtu %d)",
	      pa.active_mtu);
}

/* The table of a NIC that is rail `rail` of the n-th node to join (n from 0). */
static void check_gids(struct peer *p, struct ibv_context *ctx, int rail, int n)
{
	char ll[64], v4[64], s[INET6_ADDRSTRLEN];
	struct ibv_gid_entry e[8], big[2];
	union ibv_gid g;
	int type;

	snprintf(ll, sizeof(ll), "fe80::5e:feff:fe%02x:%02x01", rail, n);
	snprintf(v4, sizeof(v4), "::ffff:10.%d.0.%d", rail, n + 1);
	for (int i = 0; i < NGID; i++) {
		CHECK(p, ibv_query_gid(ctx, 1, i, &g) == 0);
		CHECK(p, gid_is(&g, i < 2 ? ll : v4), "(GID[%d] %s)", i, gid_str(&g, s, sizeof(s)));
		CHECK(p, ibv_query_gid_type(ctx, 1, (unsigned)i, &type) == 0 && type == i % 2,
		      "(GID[%d] sysfs type %d)", i, type);
		CHECK(p, ibv_query_gid_ex(ctx, 1, (uint32_t)i, &e[0], 0) == 0);
		CHECK(p, memcmp(&e[0].gid, &g, sizeof(g)) == 0 && e[0].gid_index == (uint32_t)i &&
			     e[0].port_num == 1 && e[0].ndev_ifindex == 0);
		CHECK(p, e[0].gid_type == (i % 2 ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1));
	}
	/* Empty entries up to the table's length, then nothing. */
	for (int i = NGID; i < 255; i++) {
		memset(&g, 0xff, sizeof(g));
		CHECK(p, ibv_query_gid(ctx, 1, i, &g) == 0);
		CHECK(p, gid_is(&g, "::"), "(empty GID[%d])", i);
		CHECK(p, ibv_query_gid_ex(ctx, 1, (uint32_t)i, &e[0], 0) == ENODATA);
		type = -1;
		CHECK(p, ibv_query_gid_type(ctx, 1, (unsigned)i, &type) == 0 && type == 0);
	}
	errno = 0;
	CHECK(p, ibv_query_gid(ctx, 1, 255, &g) == -1 && errno == EINVAL);
	CHECK(p, ibv_query_gid(ctx, 2, 0, &g) == -1 && errno == EINVAL);
	CHECK(p, ibv_query_gid_type(ctx, 1, 255, &type) == -1);
	CHECK(p, ibv_query_gid_ex(ctx, 1, 255, &e[0], 0) == EINVAL);
	CHECK(p, ibv_query_gid_ex(ctx, 2, 0, &e[0], 0) == EINVAL);
	CHECK(p, ibv_query_gid_ex(ctx, 1, 3, &e[0], 1) == EOPNOTSUPP);
	/* The table: the 4 populated entries in order, whatever room is offered past them. */
	memset(e, 0xa5, sizeof(e));
	CHECK(p, ibv_query_gid_table(ctx, e, 8, 0) == NGID);
	for (int i = 0; i < NGID; i++) {
		CHECK(p, gid_is(&e[i].gid, i < 2 ? ll : v4) && e[i].gid_index == (uint32_t)i);
		CHECK(p,
		      e[i].port_num == 1 && e[i].ndev_ifindex == 0 &&
			  e[i].gid_type == (i % 2 ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1));
	}
	CHECK(p, e[NGID].gid_index == 0xa5a5a5a5, "(wrote past the entries)");
	CHECK(p, ibv_query_gid_table(ctx, e, 3, 0) == -EINVAL);
	CHECK(p, ibv_query_gid_table(ctx, e, 8, 1) == -EOPNOTSUPP);
	/* A caller with a larger entry (newer headers) gets zeros past ours. */
	memset(big, 0xa5, sizeof(big));
	CHECK(p, _ibv_query_gid_ex(ctx, 1, 3, big, 0, sizeof(big)) == 0);
	CHECK(p, gid_is(&big[0].gid, v4) && big[1].gid_index == 0 && big[1].gid_type == 0);
}

static void port_a(struct peer *p)
{
	struct ibv_device **devs;
	struct ibv_context *ctx;

	/* A joins first: it is node 0, B node 1. */
	open_nics(p);
	sync_send(p, 1);
	check_port(p, p->ctx[0], IBV_MTU_4096);
	check_port(p, p->ctx[1], IBV_MTU_4096);
	check_gids(p, p->ctx[1], 1, 0);
	check_gids(p, p->ctx[0], 0, 0);
	/* The device list's GUIDs are still unique; the link layer does not change them. */
	devs = ibv_get_device_list(NULL);
	CHECK(p, ibv_get_device_guid(devs[0]) != ibv_get_device_guid(devs[1]));
	ctx = ibv_open_device(devs[1]);
	CHECK(p, ctx != NULL);
	check_gids(p, ctx, 1, 0);
	ibv_close_device(ctx);
	ibv_free_device_list(devs);
	sync_wait(p, 2);
}

static void port_b(struct peer *p)
{
	sync_wait(p, 1);
	open_nics(p);
	check_gids(p, p->ctx[0], 0, 1);
	check_gids(p, p->ctx[1], 1, 1);
	sync_send(p, 2);
}

/* SOFTVERBS_MTU=1024 (a 1500-byte Ethernet MTU): the active MTU and packets of it. */
static void mtu_a(struct peer *p)
{
	static const struct conn c[] = {
	    {.a_idx = 3, .b_idx = 3, .delivers = true, .what = "same rail, v2"}};
	struct softverbs_nic_stat st[2];

	connect_all(p, c, 1);
	check_port(p, p->ctx[0], IBV_MTU_1024);
	traffic(p, c, 1, 'A');
	CHECK(p, softverbs_nic_stats("A", st, 2) == 2);
	CHECK(p, st[0].tx_bytes == LEN && st[0].tx_packets == LEN / 1024, "(%llu packets)",
	      (unsigned long long)st[0].tx_packets);
}

static void mtu_b(struct peer *p)
{
	static const struct conn c[] = {
	    {.a_idx = 3, .b_idx = 3, .delivers = true, .what = "same rail, v2"}};

	connect_all(p, c, 1);
	traffic(p, c, 1, 'A');
}

/* IB mode keeps its one IB GID, now also through the extended queries. */
static void ib_gids(struct peer *p)
{
	struct ibv_gid_entry e[4];
	struct ibv_port_attr pa;
	union ibv_gid g;
	int type = -1;

	open_nics(p);
	CHECK(p, ibv_query_port(p->ctx[0], 1, &pa) == 0);
	CHECK(p, pa.link_layer == IBV_LINK_LAYER_INFINIBAND && pa.lid != 0 && pa.gid_tbl_len == 1);
	CHECK(p, ibv_query_gid(p->ctx[0], 1, 0, &g) == 0);
	CHECK(p, g.global.subnet_prefix == htobe64(0xfe80000000000000ull));
	CHECK(p, ibv_query_gid_ex(p->ctx[0], 1, 0, &e[0], 0) == 0);
	CHECK(p, e[0].gid_type == IBV_GID_TYPE_IB && memcmp(&e[0].gid, &g, sizeof(g)) == 0);
	CHECK(p, ibv_query_gid_table(p->ctx[0], e, 4, 0) == 1);
	CHECK(p, ibv_query_gid_type(p->ctx[0], 1, 0, &type) == 0 && type == 0);
	CHECK(p, ibv_query_gid(p->ctx[0], 1, 1, &g) == -1 && errno == EINVAL);
	CHECK(p, ibv_query_gid_ex(p->ctx[0], 1, 1, &e[0], 0) == EINVAL);
	sync_send(p, 1);
	sync_wait(p, 1);
}

/* ---- modify_qp's checks ---- */

static void rtr_a(struct peer *p)
{
	static const struct conn c[] = {
	    {.a_idx = 3, .b_idx = 3, .delivers = true, .what = "same rail, v2"}};
	struct ibv_ah_attr ah;
	struct ibv_qp *qp;
	union ibv_gid dgid;

	connect_all(p, c, 1);
	dgid = p->peer.gid[0][3];
	qp = make_qp(p, 0);
	/* An InfiniBand address vector (no GRH) on a RoCE port. */
	memset(&ah, 0, sizeof(ah));
	ah.dlid = 1;
	ah.port_num = 1;
	CHECK(p, to_rtr(qp, p->peer.qpn[0], &ah) == EINVAL);
	/* An sgid_index of an empty entry, then one past the table. */
	ah = grh_av(4, &dgid, 0);
	CHECK(p, to_rtr(qp, p->peer.qpn[0], &ah) == ENODATA);
	ah = grh_av(255, &dgid, 0);
	CHECK(p, to_rtr(qp, p->peer.qpn[0], &ah) == EINVAL);
	{
		struct ibv_qp_attr a;
		struct ibv_qp_init_attr init;

		CHECK(p,
		      ibv_query_qp(qp, &a, IBV_QP_STATE, &init) == 0 && a.qp_state == IBV_QPS_INIT);
	}
	/* A dgid nobody owns is accepted: the network, not the kernel, drops it. */
	dgid = gid_of(NOWHERE);
	ah = grh_av(3, &dgid, 0);
	CHECK(p, to_rtr(qp, p->peer.qpn[0], &ah) == 0);
	/* What was set reads back, and the control tool shows it. */
	{
		struct ibv_qp_attr a;
		struct ibv_qp_init_attr init;
		char out[8192], want[256];

		CHECK(p, ibv_query_qp(qp, &a, IBV_QP_AV, &init) == 0);
		CHECK(p, a.ah_attr.is_global && a.ah_attr.grh.sgid_index == 3 &&
			     gid_is(&a.ah_attr.grh.dgid, NOWHERE) &&
			     a.ah_attr.grh.hop_limit == 255);
		ctl_out(p, "list", out, sizeof(out));
		snprintf(want, sizeof(want),
			 "qpn=0x%06x pid=%d node=A nic=mlx5_0 state=RTR dest_qpn=0x%06x peer=-/- "
			 "rq=0/16 sgid_index=3 dgid=" NOWHERE
			 " traffic_class=0 flow_label=0 hop_limit=255\n",
			 qp->qp_num, (int)getpid(), p->peer.qpn[0]);
		CHECK(p, strstr(out, want), "(want '%s' in:\n%s)", want, out);
		snprintf(want, sizeof(want), "qpn=0x%06x pid=%d node=A nic=mlx5_0 state=RTS",
			 p->qp[0]->qp_num, (int)getpid());
		CHECK(p, strstr(out, want) && strstr(out, "peer=B/mlx5_0"), "(%s)", out);
		CHECK(p, strstr(out, "fabric ") && strstr(out, " link_layer=roce routed=0"));
		CHECK(p, strstr(out, "name=mlx5_1 lid=0 ip=10.1.0."), "(%s)", out);
	}
	traffic(p, c, 1, 'A');
}

static void rtr_b(struct peer *p)
{
	static const struct conn c[] = {
	    {.a_idx = 3, .b_idx = 3, .delivers = true, .what = "same rail, v2"}};

	connect_all(p, c, 1);
	traffic(p, c, 1, 'A');
}

/* ---- reachability ---- */

/* One rail: every GID type works, a v2 GRH mixing families does not, nor a stray dgid. */
static const struct conn same_rail[] = {
    {.a_idx = 0, .b_idx = 0, .delivers = true, .what = "link-local v1"},
    {.a_idx = 1, .b_idx = 1, .delivers = true, .what = "link-local v2"},
    {.a_idx = 2, .b_idx = 2, .delivers = true, .what = "IPv4 v1"},
    {.a_idx = 3, .b_idx = 3, .delivers = true, .what = "IPv4 v2"},
    {.a_nic = 1, .b_nic = 1, .a_idx = 3, .b_idx = 3, .delivers = true, .what = "rail 1 v2"},
    {.a_idx = 1, .b_idx = 3, .delivers = false, .what = "v2 link-local to IPv4"},
    {.a_idx = 3, .b_idx = 3, .a_nowhere = true, .delivers = false, .what = "no owner"},
};

static void same_rail_role(struct peer *p)
{
	both_ways(p, same_rail, sizeof(same_rail) / sizeof(same_rail[0]));
}

/* Across rails on a fabric that does not route: nothing goes through. */
static const struct conn across[] = {
    {.a_nic = 0, .b_nic = 1, .a_idx = 3, .b_idx = 3, .delivers = false, .what = "IPv4 v2"},
    {.a_nic = 0, .b_nic = 1, .a_idx = 2, .b_idx = 2, .delivers = false, .what = "IPv4 v1"},
    {.a_nic = 1, .b_nic = 0, .a_idx = 1, .b_idx = 1, .delivers = false, .what = "ll v2"},
    {.a_idx = 3, .b_idx = 3, .delivers = true, .what = "control: same rail"},
};

static void across_role(struct peer *p)
{
	both_ways(p, across, sizeof(across) / sizeof(across[0]));
}

/* With SOFTVERBS_ROUTED=1 only RoCE v2 between IPv4 addresses crosses rails. */
static const struct conn routed[] = {
    {.a_nic = 0, .b_nic = 1, .a_idx = 3, .b_idx = 3, .delivers = true, .what = "IPv4 v2"},
    {.a_nic = 1, .b_nic = 0, .a_idx = 3, .b_idx = 3, .delivers = true, .what = "IPv4 v2 back"},
    {.a_nic = 0, .b_nic = 1, .a_idx = 2, .b_idx = 2, .delivers = false, .what = "IPv4 v1"},
    {.a_nic = 0, .b_nic = 1, .a_idx = 1, .b_idx = 1, .delivers = false, .what = "ll v2"},
    {.a_nic = 0, .b_nic = 1, .a_idx = 0, .b_idx = 0, .delivers = false, .what = "ll v1"},
    {.a_nic = 0, .b_nic = 1, .a_idx = 3, .b_idx = 2, .delivers = false, .what = "v1 back"},
    {.a_nic = 0,
     .b_nic = 1,
     .a_idx = 3,
     .b_idx = 3,
     .a_other_nic = true,
     .delivers = false,
     .what = "dgid of the QP's other NIC"},
};

static void routed_role(struct peer *p)
{
	both_ways(p, routed, sizeof(routed) / sizeof(routed[0]));
}

/* ---- lossless traffic class ---- */

static const struct conn classes[] = {
    {.a_idx = 3, .b_idx = 3, .tc = 106, .b_tc = 106, .delivers = true, .what = "tc 106"},
    {.a_idx = 3, .b_idx = 3, .tc = 104, .b_tc = 104, .delivers = true, .what = "tc 104"},
    {.a_idx = 3, .b_idx = 3, .tc = 0, .b_tc = 0, .delivers = true, .what = "tc 0"},
    {.a_idx = 3, .b_idx = 3, .tc = 106, .b_tc = 0, .delivers = true, .what = "tc 106, 0 back"},
};

#define NCLASS ((int)(sizeof(classes) / sizeof(classes[0])))

static uint64_t lossy(struct peer *p, const char *node, const char *nic)
{
	uint64_t n = ~0ull;

	CHECK(p, softverbs_nic_lossy_bytes(node, nic, &n) == 0);
	return n;
}

static void lossless_a(struct peer *p)
{
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad = NULL;
	struct ibv_wc wc;
	char out[4096];

	connect_all(p, classes, NCLASS);
	traffic(p, classes, NCLASS, 'A');
	/* Only the write in class 0 was lossy (104 has 106's DSCP), on the sender's NIC. */
	CHECK(p, lossy(p, "A", "mlx5_0") == LEN, "(%llu)",
	      (unsigned long long)lossy(p, "A", "mlx5_0"));
	CHECK(p, lossy(p, "B", "mlx5_0") == 0 && lossy(p, "A", "mlx5_1") == 0);
	CHECK(p, softverbs_nic_lossy_bytes("A", "mlx5_9", &(uint64_t){0}) == -ENOENT);
	/* READs: the responses come from B's NIC in B's class. */
	for (int i = 0; i < NCLASS; i++) {
		sge = (struct ibv_sge){.addr = (uintptr_t)p->buf + landing('B', i),
				       .length = LEN / 2,
				       .lkey = p->mr[0]->lkey};
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = 50 + (uint64_t)i;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_RDMA_READ;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.wr.rdma.remote_addr = p->peer.addr;
		wr.wr.rdma.rkey = p->peer.rkey[0];
		CHECK(p, ibv_post_send(p->qp[i], &wr, &bad) == 0);
		CHECK(p, poll_any(p, &wc, 2000) == 1 && wc.status == IBV_WC_SUCCESS &&
			     wc.wr_id == wr.wr_id);
	}
	CHECK(p, lossy(p, "B", "mlx5_0") == LEN && lossy(p, "A", "mlx5_0") == LEN, "(%llu %llu)",
	      (unsigned long long)lossy(p, "B", "mlx5_0"),
	      (unsigned long long)lossy(p, "A", "mlx5_0"));
	ctl_out(p, "counters", out, sizeof(out));
	CHECK(p, strstr(out, "counters node=A nic=mlx5_0 ") && strstr(out, "lossy_bytes=65536\n"),
	      "(%s)", out);
	ctl_out(p, "counters --json", out, sizeof(out));
	CHECK(p, strstr(out, "\"lossy_bytes\": 65536}") && strstr(out, "\"lossy_bytes\": 0}"),
	      "(%s)", out);
	sync_send(p, 1);
}

static void lossless_b(struct peer *p)
{
	connect_all(p, classes, NCLASS);
	traffic(p, classes, NCLASS, 'A');
	sync_wait(p, 1);
}

/* The same traffic on a fabric without SOFTVERBS_LOSSLESS_TC counts nothing. */
static void no_class_a(struct peer *p)
{
	connect_all(p, classes, NCLASS);
	traffic(p, classes, NCLASS, 'A');
	CHECK(p, lossy(p, "A", "mlx5_0") == 0 && lossy(p, "B", "mlx5_0") == 0);
}

static void no_class_b(struct peer *p)
{
	connect_all(p, classes, NCLASS);
	traffic(p, classes, NCLASS, 'A');
}

/* ---- the fabric's first process decides its mode ---- */

static void first_a(struct peer *p)
{
	open_nics(p);
	sync_send(p, 1);
	sync_wait(p, 2);
}

static void later_b(struct peer *p)
{
	struct ibv_port_attr pa;

	sync_wait(p, 1);
	open_nics(p); /* with SOFTVERBS_LINK=ib */
	CHECK(p, ibv_query_port(p->ctx[0], 1, &pa) == 0);
	CHECK(p, pa.link_layer == IBV_LINK_LAYER_ETHERNET && pa.lid == 0);
	sync_send(p, 2);
}

struct test {
	const char *name;
	role_fn a, b;
	const char *env;   /* NAME=VALUE;... for both processes */
	const char *env_b; /* and then for B only */
};

#define ROCE "SOFTVERBS_LINK=roce"

static const struct test tests[] = {
    {.name = "port_gids", .a = port_a, .b = port_b, .env = ROCE},
    {.name = "mtu", .a = mtu_a, .b = mtu_b, .env = ROCE ";SOFTVERBS_MTU=1024"},
    {.name = "ib_gids", .a = ib_gids, .b = ib_gids},
    {.name = "rtr_checks", .a = rtr_a, .b = rtr_b, .env = ROCE},
    {.name = "same_rail", .a = same_rail_role, .b = same_rail_role, .env = ROCE},
    {.name = "across_rails", .a = across_role, .b = across_role, .env = ROCE},
    {.name = "routed", .a = routed_role, .b = routed_role, .env = ROCE ";SOFTVERBS_ROUTED=1"},
    {.name = "lossless_tc",
     .a = lossless_a,
     .b = lossless_b,
     .env = ROCE ";SOFTVERBS_LOSSLESS_TC=106"},
    {.name = "no_lossless_tc", .a = no_class_a, .b = no_class_b, .env = ROCE},
    {.name = "first_decides",
     .a = first_a,
     .b = later_b,
     .env = ROCE,
     .env_b = "SOFTVERBS_LINK=ib"},
};

static void child(const void *arg, char role, int sock)
{
	const struct test *t = arg;
	struct peer p = {.role = role, .sock = sock};
	char node[2] = {role, 0};

	setenv("SOFTVERBS_FABRIC", fabric, 1);
	setenv("SOFTVERBS_NODE", node, 1);
	setenv("SOFTVERBS_NICS", "mlx5_0:100,mlx5_1:100", 1);
	setenv("SOFTVERBS_TIME_SCALE", "0.2", 1);
	unsetenv("SOFTVERBS_LINK");
	unsetenv("SOFTVERBS_ROUTED");
	unsetenv("SOFTVERBS_LOSSLESS_TC");
	unsetenv("SOFTVERBS_MTU");
	unsetenv("SOFTVERBS_SHAPING");
	unsetenv("SOFTVERBS_FAULT");
	sv_put_env(t->env);
	if (role == 'B')
		sv_put_env(t->env_b);
	(role == 'A' ? t->a : t->b)(&p);
}

static const char *test_name(size_t i)
{
	return tests[i].name;
}

static bool run(size_t i)
{
	const struct sv_pair pair = {.name = tests[i].name};

	return sv_run_pair("svroce", &pair, child, &tests[i]);
}

int main(int argc, char **argv)
{
	if (sv_test_init() != 0)
		return 2;
	return sv_run_named(argc, argv, sizeof(tests) / sizeof(tests[0]), test_name, run);
}
