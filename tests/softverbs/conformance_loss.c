/*
 * Conformance tests of what the wire loses: acknowledgements (on either end, and
 * healing before the timeout), one direction of a path (black holes seen from both
 * ends), and requests on the wire when a black hole opens, per seed (what lands is
 * left in `results` for the parent to compare) and on a live shaped stream.
 */
#include "softverbs/softverbs.h"
#include "tests/softverbs/conformance.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- lost acknowledgements ---- */

/*
 * ackloss on either end: A's requests land at B (data, receives consumed, B's
 * completions), A sees nothing until its transport timeout, then RETRY_EXC_ERR on the
 * oldest and flushes; each byte counted once; the third receive stays posted.
 */
void ackloss_a(struct peer *p)
{
	struct softverbs_nic_stat st[4];
	double t0, dt;

	setup(p);
	sync_wait(p, 1); /* B posted its receives and set the fault where the test says */
	fill(p->buf, 65536 + 4096 + 100, 31);
	t0 = now_ms();
	post(p, 0, IBV_WR_RDMA_WRITE, 1, 0, 0, 65536, 0, p->peer.rkey, 0);
	post(p, 0, IBV_WR_RDMA_WRITE_WITH_IMM, 2, IBV_SEND_SIGNALED, 65536, 4096, 65536,
	     p->peer.rkey, 11);
	post(p, 0, IBV_WR_RDMA_WRITE, 3, IBV_SEND_SIGNALED, 65536 + 4096, 100, 65536 + 4096,
	     p->peer.rkey, 0);
	post(p, 0, IBV_WR_RDMA_WRITE_WITH_IMM, 4, IBV_SEND_SIGNALED, 0, 0, 0, 0, 12);
	expect_wc(p, 1, IBV_WC_RETRY_EXC_ERR, 5000, NULL);
	dt = now_ms() - t0;
	fprintf(stderr, "  ackloss: status 12 after %.0f ms (timeout %.0f ms)\n", dt, RETRY_MS);
	CHECK(p, dt >= RETRY_MS * 0.95 && dt < RETRY_MS * 1.5, "(after %.0f ms)", dt);
	expect_wcs(p, (uint64_t[]){2, 3, 4}, 3, IBV_WC_WR_FLUSH_ERR);
	CHECK(p, qp_state(p, 0) == IBV_QPS_ERR);
	expect_no_wc(p, 20);
	CHECK(p, softverbs_nic_stats("A", st, 4) == 2);
	CHECK(p, st[0].tx_bytes == 65536 + 4096 + 100 && st[0].tx_packets == 16 + 1 + 1 + 1,
	      "(tx %llu bytes %llu packets)", (unsigned long long)st[0].tx_bytes,
	      (unsigned long long)st[0].tx_packets);
	sync_send(p, 2);
	sync_wait(p, 3);
}

void ackloss_b(struct peer *p)
{
	const char *where = getenv("SVTEST_FAULT");
	struct softverbs_nic_stat st[4];
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
	struct ibv_wc wc;
	char cmd[64];

	setup(p);
	post_recv(p, 0, 100);
	post_recv(p, 0, 101);
	post_recv(p, 0, 102);
	snprintf(cmd, sizeof(cmd), "fault %s mlx5_0 ackloss", where);
	ctl(p, cmd);
	sync_send(p, 1);
	/* Everything lands, in order, while A hears nothing. */
	expect_wc(p, 100, IBV_WC_SUCCESS, 2000, &wc);
	CHECK(p,
	      wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && wc.imm_data == 11 && wc.byte_len == 4096);
	/* What came before the WRITE_WITH_IMM is there at its completion; the 100-byte
	 * write after it only at the next one's. */
	CHECK(p, check_fill(p->buf, 65536 + 4096, 31), "(data)");
	expect_wc(p, 101, IBV_WC_SUCCESS, 2000, &wc);
	CHECK(p, wc.imm_data == 12 && wc.byte_len == 0);
	CHECK(p, check_fill(p->buf, 65536 + 4096 + 100, 31), "(data of the last write)");
	sync_wait(p, 2); /* A's QP failed: its retries consumed no receive */
	expect_no_wc(p, 10);
	CHECK(p, softverbs_nic_stats("B", st, 4) == 2);
	CHECK(p, st[0].rx_bytes == 65536 + 4096 + 100, "(rx %llu)",
	      (unsigned long long)st[0].rx_bytes);
	CHECK(p, ibv_modify_qp(p->qp[0], &a, IBV_QP_STATE) == 0);
	expect_wc(p, 102, IBV_WC_WR_FLUSH_ERR, 2000, NULL);
	sync_send(p, 3);
}

/*
 * The acknowledgement path heals before the timeout: the retransmission of a
 * WRITE_WITH_IMM that landed is only acknowledged, it consumes no second receive.
 */
void ackheal_a(struct peer *p)
{
	setup(p);
	sync_wait(p, 1);
	ctl(p, "fault A mlx5_0 ackloss");
	post(p, 0, IBV_WR_RDMA_WRITE_WITH_IMM, 1, IBV_SEND_SIGNALED, 0, 512, 0, p->peer.rkey, 7);
	sync_wait(p, 2); /* B has its completion */
	expect_no_wc(p, 30);
	ctl(p, "fault A mlx5_0 up");
	expect_wc(p, 1, IBV_WC_SUCCESS, 1000, NULL);
	post(p, 0, IBV_WR_RDMA_WRITE_WITH_IMM, 2, IBV_SEND_SIGNALED, 0, 0, 0, 0, 8);
	expect_wc(p, 2, IBV_WC_SUCCESS, 1000, NULL);
	CHECK(p, qp_state(p, 0) == IBV_QPS_RTS);
	sync_wait(p, 3);
}

void ackheal_b(struct peer *p)
{
	struct ibv_wc wc;

	setup(p);
	post_recv(p, 0, 100);
	post_recv(p, 0, 101);
	sync_send(p, 1);
	expect_wc(p, 100, IBV_WC_SUCCESS, 2000, &wc);
	CHECK(p, wc.imm_data == 7 && wc.byte_len == 512);
	sync_send(p, 2);
	expect_wc(p, 101, IBV_WC_SUCCESS, 2000, &wc);
	CHECK(p, wc.imm_data == 8, "(the retransmission took the second receive: imm %u)",
	      wc.imm_data);
	expect_no_wc(p, 20);
	sync_send(p, 3);
}

/* ---- one-direction black holes ---- */

/*
 * On three QPs at once, with B's NIC black-holed in one direction: A writes to B
 * (qp 0), B writes to A (qp 1), A reads from B (qp 2). A request gets there if its
 * sender's transmit and its receiver's receive side work; its acknowledgement (or a
 * READ's response) travels back the other way. Every requester ends with
 * RETRY_EXC_ERR after its timeout; what landed is checked at the other end.
 */
static void oneway(struct peer *p, bool tx)
{
	bool a = p->role == 'A';
	/* What gets through: A's requests land at B with tx, B's at A with rx. */
	bool mine_land = a ? tx : !tx;
	bool theirs_land = !mine_land;
	double t0, dt;

	setup(p);
	fill(p->buf, 8192, a ? 41 : 42);
	memset(p->buf + 65536, p->role, 4096);
	if (a) {
		post_recv(p, 1, 200);
		sync_wait(p, 1);
	} else {
		post_recv(p, 0, 300);
		ctl(p, tx ? "fault B mlx5_0 blackhole-tx" : "fault B mlx5_0 blackhole-rx");
		sync_send(p, 1);
	}
	t0 = now_ms();
	post(p, a ? 0 : 1, IBV_WR_RDMA_WRITE_WITH_IMM, 1, IBV_SEND_SIGNALED, 0, 8192, 0,
	     p->peer.rkey, 5);
	if (a)
		post(p, 2, IBV_WR_RDMA_READ, 2, IBV_SEND_SIGNALED, 65536, 4096, 0, p->peer.rkey, 0);
	/* What the peer sent may land here first, with its receive completion. */
	if (theirs_land) {
		struct ibv_wc wc;

		expect_wc(p, a ? 200 : 300, IBV_WC_SUCCESS, 2000, &wc);
		CHECK(p, wc.imm_data == 5 && check_fill(p->buf, 8192, a ? 42 : 41));
	}
	expect_wcs(p, a ? (uint64_t[]){1, 2} : (uint64_t[]){1}, a ? 2 : 1, IBV_WC_RETRY_EXC_ERR);
	dt = now_ms() - t0;
	CHECK(p, dt >= RETRY_MS * 0.95 && dt < RETRY_MS * 1.5, "(after %.0f ms)", dt);
	/* A's READ never brought anything back. */
	if (a)
		for (int i = 0; i < 4096; i++)
			CHECK(p, p->buf[65536 + i] == 'A', "(READ response through the hole)");
	sync_send(p, 2);
	sync_wait(p, 2);
	if (!theirs_land) {
		CHECK(p, p->buf[8191] == (uint8_t)(8191 * 131 + (a ? 41 : 42)),
		      "(a write came through the hole)");
		expect_no_wc(p, 10);
	}
	fprintf(stderr, "  %s [%c]: my requests %s, %s\n", tx ? "blackhole-tx" : "blackhole-rx",
		p->role, mine_land ? "land, unacknowledged" : "lost",
		theirs_land ? "the peer's land" : "the peer's lost");
}

void bh_tx(struct peer *p)
{
	oneway(p, true);
}

void bh_rx(struct peer *p)
{
	oneway(p, false);
}

/* ---- a black hole opens with requests on the wire ---- */

/*
 * A's requests wait on a path whose far end is down; then the far end turns into a
 * black hole (within the QPs' timeout, made long enough for a loaded machine): what was posted (all
 * of it on the wire, within SOFTVERBS_INFLIGHT) lands as the seed draws it, in order, and A hears
 * nothing: RETRY_EXC_ERR, flushes. B reads what landed from its memory and its receive completions
 * and writes it down (W whole, Pn the first n bytes, - nothing) for the parent to compare across
 * seeds.
 */
#define BH_N	8
#define BH_SLOT (256u << 10)

static const struct {
	int opcode;
	uint32_t len;
} bh_req[BH_N] = {
    {IBV_WR_RDMA_WRITE, 96u << 10},	     {IBV_WR_RDMA_WRITE_WITH_IMM, 64u << 10},
    {IBV_WR_RDMA_WRITE, (200u << 10) + 512}, {IBV_WR_RDMA_WRITE_WITH_IMM, 0},
    {IBV_WR_RDMA_WRITE, 128u << 10},	     {IBV_WR_RDMA_WRITE_WITH_IMM, 8u << 10},
    {IBV_WR_RDMA_WRITE, 160u << 10},	     {IBV_WR_RDMA_WRITE_WITH_IMM, 0},
};

struct results *results;

void inflight_a(struct peer *p)
{
	double t0, dt;

	setup(p);
	sync_wait(p, 1);
	ctl(p, "fault B mlx5_0 down");
	t0 = now_ms();
	for (int i = 0; i < BH_N; i++) {
		fill(p->buf + i * BH_SLOT, bh_req[i].len, 50 + i);
		post(p, 0, bh_req[i].opcode, (uint64_t)i, IBV_SEND_SIGNALED, i * BH_SLOT,
		     bh_req[i].len, i * BH_SLOT, p->peer.rkey, 1000 + i);
	}
	ctl(p, "fault B mlx5_0 blackhole");
	expect_wc(p, 0, IBV_WC_RETRY_EXC_ERR, 5000, NULL);
	dt = now_ms() - t0;
	CHECK(p, dt >= retry_ms() * 0.95 && dt < retry_ms() * 1.5, "(after %.0f ms)", dt);
	expect_wcs(p, (uint64_t[]){1, 2, 3, 4, 5, 6, 7}, BH_N - 1, IBV_WC_WR_FLUSH_ERR);
	expect_no_wc(p, 10);
	sync_send(p, 2);
	sync_wait(p, 3);
}

void inflight_b(struct peer *p)
{
	struct softverbs_nic_stat st[4];
	const char *slot = getenv("SVTEST_SLOT");
	uint64_t landed = 0;
	int imms = 0, n = 0, got = 0;
	bool cut = false;
	char pat[128] = "";
	struct ibv_wc wc;

	setup(p);
	for (int i = 0; i < 4; i++)
		post_recv(p, 0, 100 + i);
	sync_send(p, 1);
	sync_wait(p, 2); /* A's QP failed: nothing more comes */
	while (poll_one(p->cq, &wc, 20) == 1) {
		CHECK(p, wc.status == IBV_WC_SUCCESS && wc.wr_id == 100 + (uint64_t)got,
		      "(receive %llu status %d)", (unsigned long long)wc.wr_id, wc.status);
		got++;
	}
	for (int i = 0; i < BH_N; i++) {
		const uint8_t *b = p->buf + i * BH_SLOT;
		uint32_t len = bh_req[i].len, m = 0;
		bool imm = bh_req[i].opcode == IBV_WR_RDMA_WRITE_WITH_IMM, whole;

		while (m < len && b[m] == (uint8_t)(m * 131 + 50 + i))
			m++;
		for (uint32_t k = m; k < len; k++)
			CHECK(p, b[k] == 'B', "(request %d: byte %u landed out of order)", i, k);
		whole = imm ? imms < got : m == len;
		if (imm && whole)
			CHECK(p, m == len, "(request %d completed at B without its data)", i);
		CHECK(p, !cut || (m == 0 && !whole), "(request %d landed behind one that did not)",
		      i);
		if (m && !whole)
			CHECK(p, m % 4096 == 0, "(request %d: %u bytes, not whole packets)", i, m);
		n += snprintf(pat + n, sizeof(pat) - (size_t)n, "%s", n ? " " : "");
		if (whole)
			n += snprintf(pat + n, sizeof(pat) - (size_t)n, "W");
		else if (m)
			n += snprintf(pat + n, sizeof(pat) - (size_t)n, "P%u", m);
		else
			n += snprintf(pat + n, sizeof(pat) - (size_t)n, "-");
		cut |= !whole;
		landed += m;
		imms += imm;
	}
	CHECK(p, softverbs_nic_stats(NULL, st, 4) == 4);
	for (int i = 0; i < 4; i++)
		if (!strcmp(st[i].node, "A") && !strcmp(st[i].name, "mlx5_0"))
			CHECK(p, st[i].tx_bytes == landed, "(A sent %llu, %llu landed)",
			      (unsigned long long)st[i].tx_bytes, (unsigned long long)landed);
		else if (!strcmp(st[i].name, "mlx5_0"))
			CHECK(p, st[i].rx_bytes == landed, "(B received %llu, %llu landed)",
			      (unsigned long long)st[i].rx_bytes, (unsigned long long)landed);
	fprintf(stderr, "  landed at B (seed %s): %s\n", getenv("SOFTVERBS_SEED"), pat);
	if (slot)
		snprintf(results->pattern[atoi(slot)], sizeof(results->pattern[0]), "%s", pat);
	sync_send(p, 3);
}

/* Seed 27 lands requests whole (three WRITE_WITH_IMMs among them) and one in part. */
bool inflight_first_verdict(void)
{
	return strchr(results->pattern[0], 'P') && !strncmp(results->pattern[0], "W W W W", 7);
}

/* Same seed, same landings; another seed, others. */
bool inflight_verdict(void)
{
	const char *p0 = results->pattern[0];

	printf("     seed 27: %s | seed 27 again: %s | seed 1: %s\n", p0, results->pattern[1],
	       results->pattern[2]);
	return *p0 && !strcmp(p0, results->pattern[1]) && strcmp(p0, results->pattern[2]) &&
	       *results->pattern[2];
}

/*
 * The same on a live stream: A keeps NCCL-like pairs (a 128 KiB write, a signalled
 * zero-length WRITE_WITH_IMM) on the wire of a shaped NIC and black-holes its own
 * NIC. Whatever was drawn, both ends agree: what A saw complete landed, what landed
 * is a prefix of what was posted with at most one write in part, and A ends with
 * RETRY_EXC_ERR on the oldest request it did not hear about.
 */
#define BS_PAIRS 48
#define BS_LEN	 (128u << 10)

void bhstream_a(struct peer *p)
{
	int posted = 0, ok = 0, status = -1;
	struct ibv_wc wc;
	double end;

	setup(p);
	sync_wait(p, 1);
	for (int i = 0; i < BS_PAIRS; i++)
		fill(p->buf + (uint64_t)i * BS_LEN, BS_LEN, (unsigned)i);
	end = now_ms() + 20;
	while (posted + 2 < BS_PAIRS && (now_ms() < end || posted - ok < 8)) {
		while (posted + 2 < BS_PAIRS && posted - ok < 8) {
			post(p, 0, IBV_WR_RDMA_WRITE, 1000 + (uint64_t)posted, 0,
			     (uint64_t)posted * BS_LEN, BS_LEN, (uint64_t)posted * BS_LEN,
			     p->peer.rkey, 0);
			post(p, 0, IBV_WR_RDMA_WRITE_WITH_IMM, (uint64_t)posted, IBV_SEND_SIGNALED,
			     0, 0, 0, 0, (uint32_t)posted);
			posted++;
		}
		if (now_ms() >= end)
			break;
		CHECK(p, poll_one(p->cq, &wc, 2000) == 1 && wc.status == IBV_WC_SUCCESS &&
			     wc.wr_id == (uint64_t)ok);
		ok++;
	}
	CHECK(p, posted + 2 <= BS_PAIRS, "(the stream ended before the fault)");
	ctl(p, "fault A mlx5_0 blackhole");
	/* What was on the wire may all have landed and completed before: these do not. */
	for (int k = 0; k < 2; k++, posted++) {
		post(p, 0, IBV_WR_RDMA_WRITE, 1000 + (uint64_t)posted, 0, (uint64_t)posted * BS_LEN,
		     BS_LEN, (uint64_t)posted * BS_LEN, p->peer.rkey, 0);
		post(p, 0, IBV_WR_RDMA_WRITE_WITH_IMM, (uint64_t)posted, IBV_SEND_SIGNALED, 0, 0, 0,
		     0, (uint32_t)posted);
	}
	/* Successes in order, then the timeout on the oldest unacknowledged, then flushes. */
	while (poll_one(p->cq, &wc, 2000) == 1) {
		if (status < 0 && wc.status == IBV_WC_SUCCESS) {
			CHECK(p, wc.wr_id == (uint64_t)ok);
			ok++;
			continue;
		}
		if (status < 0) {
			status = wc.status;
			CHECK(p, wc.status == IBV_WC_RETRY_EXC_ERR, "(status %d)", wc.status);
			CHECK(p, wc.wr_id == (uint64_t)ok || wc.wr_id == 1000 + (uint64_t)ok,
			      "(failed wr_id %llu, first unheard pair %d)",
			      (unsigned long long)wc.wr_id, ok);
			continue;
		}
		CHECK(p, wc.status == IBV_WC_WR_FLUSH_ERR);
		if (wc.wr_id == (uint64_t)posted - 1)
			break;
	}
	CHECK(p, status == IBV_WC_RETRY_EXC_ERR);
	CHECK(p, write(p->sock, &ok, sizeof(ok)) == sizeof(ok));
	CHECK(p, write(p->sock, &posted, sizeof(posted)) == sizeof(posted));
	sync_wait(p, 2);
}

void bhstream_b(struct peer *p)
{
	int ok, posted, got = 0, partial = 0;
	bool cut = false;
	struct ibv_wc wc;

	setup(p);
	for (int i = 0; i < BS_PAIRS; i++)
		post_recv(p, 0, (uint64_t)i);
	sync_send(p, 1);
	CHECK(p, read(p->sock, &ok, sizeof(ok)) == sizeof(ok));
	CHECK(p, read(p->sock, &posted, sizeof(posted)) == sizeof(posted));
	while (poll_one(p->cq, &wc, 20) == 1) {
		CHECK(p, wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)got &&
			     wc.imm_data == (uint32_t)got);
		got++;
	}
	CHECK(p, got >= ok && got <= posted, "(A heard %d, %d landed of %d)", ok, got, posted);
	for (int i = 0; i < posted; i++) {
		const uint8_t *b = p->buf + (uint64_t)i * BS_LEN;
		uint32_t m = 0;

		while (m < BS_LEN && b[m] == (uint8_t)(m * 131 + (unsigned)i))
			m++;
		for (uint32_t k = m; k < BS_LEN; k++)
			CHECK(p, b[k] == 'B', "(write %d: byte %u out of order)", i, k);
		CHECK(p, i >= got || m == BS_LEN, "(pair %d completed without its data)", i);
		CHECK(p, !cut || m == 0, "(write %d landed behind one that did not)", i);
		if (m && m < BS_LEN) {
			CHECK(p, m % 4096 == 0, "(write %d: %u bytes)", i, m);
			partial++;
		}
		cut |= m < BS_LEN || i >= got;
	}
	fprintf(stderr,
		"  blackhole in a stream: %d pairs posted, %d heard by A, %d landed, "
		"%d in part\n",
		posted, ok, got, partial);
	sync_send(p, 2);
}
