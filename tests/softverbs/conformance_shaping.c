/*
 * Conformance tests of what the NIC's wire does to traffic: counters, shaping and
 * the slow fault (either end), a NIC shared by two processes of one node, jitter, and
 * QPs served as fairly as a NIC serves them.
 */
#include "softverbs/softverbs.h"
#include "tests/softverbs/conformance.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- counters ---- */

static struct softverbs_nic_stat *stat_of(struct peer *p, const char *node,
					  struct softverbs_nic_stat *st)
{
	int n = softverbs_nic_stats(node, st, 4);

	CHECK(p, n >= 1, "(softverbs_nic_stats %d)", n);
	CHECK(p, strcmp(st[0].name, "mlx5_0") == 0);
	return &st[0];
}

void counters_a(struct peer *p)
{
	struct softverbs_nic_stat st[4], *s;
	char cmd[PATH_MAX + 128], line[512];
	bool seen = false;
	FILE *f;

	setup(p);
	post(p, 0, IBV_WR_RDMA_WRITE, 1, 0, 0, 12345, 0, p->peer.rkey, 0);
	post(p, 0, IBV_WR_RDMA_WRITE_WITH_IMM, 2, IBV_SEND_SIGNALED, 0, 0, 0, 0, 0);
	post(p, 0, IBV_WR_RDMA_READ, 3, IBV_SEND_SIGNALED, 0, 5000, 0, p->peer.rkey, 0);
	expect_wc(p, 2, IBV_WC_SUCCESS, 2000, NULL);
	expect_wc(p, 3, IBV_WC_SUCCESS, 2000, NULL);
	s = stat_of(p, "A", st);
	CHECK(p, s->tx_bytes == 12345 && s->tx_packets == 4 + 1, "(tx %llu/%llu)",
	      (unsigned long long)s->tx_bytes, (unsigned long long)s->tx_packets);
	CHECK(p, s->rx_bytes == 5000 && s->rx_packets == 2);
	s = stat_of(p, "B", st);
	CHECK(p, s->rx_bytes == 12345 && s->rx_packets == 5 && s->tx_bytes == 5000);
	snprintf(cmd, sizeof(cmd), "%s --fabric %s counters", ctl_path, fabric);
	f = popen(cmd, "r");
	CHECK(p, f != NULL);
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "node=B nic=mlx5_0 ") && strstr(line, "rx_bytes=12345 "))
			seen = true;
	CHECK(p, pclose(f) == 0 && seen, "(softverbs-ctl counters)");
	ctl(p, "counters --json");
	sync_send(p, 1);
}

void counters_b(struct peer *p)
{
	setup(p);
	post_recv(p, 0, 1);
	sync_wait(p, 1);
}

/* ---- shaping and the slow fault ---- */

/* Writes `total` bytes in 1 MiB writes; returns the rate in Gb/s. */
static double stream(struct peer *p, int q, uint64_t total)
{
	uint64_t n = total >> 20;
	double t0 = now_ms();

	for (uint64_t i = 0; i < n; i++) {
		bool sig = i + 1 == n || i % 128 == 127;

		post(p, q, IBV_WR_RDMA_WRITE, i, sig ? IBV_SEND_SIGNALED : 0, 0, 1 << 20,
		     (i % 8) << 20, p->peer.rkey, 0);
		if (sig)
			expect_wc(p, i, IBV_WC_SUCCESS, 10000, NULL);
	}
	return (double)total * 8 / ((now_ms() - t0) * 1e6);
}

void shaping_a(struct peer *p)
{
	double gbps;

	setup(p);
	gbps = stream(p, 0, 160ull << 20); /* 2 Gb/s: about 0.67 s */
	fprintf(stderr, "  shaping: %.3f Gb/s at 2 Gb/s\n", gbps);
	CHECK(p, gbps > 1.8 && gbps < 2.2, "(%.3f Gb/s)", gbps);
	sync_send(p, 1);
}

void slow_a(struct peer *p)
{
	double gbps;

	setup(p);
	ctl(p, "fault A mlx5_0 slow 1");
	gbps = stream(p, 0, 64ull << 20); /* 1 Gb/s: about 0.54 s */
	fprintf(stderr, "  slow: %.3f Gb/s at 1 Gb/s\n", gbps);
	CHECK(p, gbps > 0.9 && gbps < 1.1, "(%.3f Gb/s)", gbps);
	ctl(p, "fault A mlx5_0 up");
	gbps = stream(p, 0, 64ull << 20);
	fprintf(stderr, "  after up: %.3f Gb/s\n", gbps);
	CHECK(p, gbps > 2, "(%.3f Gb/s after up)", gbps);
	sync_send(p, 1);
}

/* A slow NIC also slows what it receives. */
void slow_rx_a(struct peer *p)
{
	double gbps;

	setup(p);
	ctl(p, "fault B mlx5_0 slow 1");
	gbps = stream(p, 0, 64ull << 20);
	fprintf(stderr, "  slow receiver: %.3f Gb/s at 1 Gb/s\n", gbps);
	CHECK(p, gbps > 0.9 && gbps < 1.1, "(%.3f Gb/s)", gbps);
	sync_send(p, 1);
}

/* ---- two processes of one node share its NIC: one wire, one set of counters ---- */

void shared_nic(struct peer *p)
{
	struct softverbs_nic_stat st[4];
	double t0, secs, gbps;

	setup(p);
	t0 = now_ms();
	stream(p, 0, 48ull << 20);
	sync_send(p, 1);
	sync_wait(p, 1);
	secs = (now_ms() - t0) / 1e3;
	/* Both send 48 MiB through A/mlx5_0 at 2 Gb/s: together about 0.4 s. */
	gbps = 2.0 * (48ull << 20) * 8 / secs / 1e9;
	fprintf(stderr, "  shared nic [%c]: %.3f Gb/s together at 2 Gb/s\n", p->role, gbps);
	CHECK(p, gbps > 1.8 && gbps < 2.2, "(%.3f Gb/s)", gbps);
	CHECK(p, softverbs_nic_stats("A", st, 4) == 2);
	CHECK(p, st[0].tx_bytes == 2 * (48ull << 20) && st[0].rx_bytes == 2 * (48ull << 20),
	      "(tx %llu rx %llu)", (unsigned long long)st[0].tx_bytes,
	      (unsigned long long)st[0].rx_bytes);
}

/* ---- congestion ---- */

/*
 * jitter 300 on A's NIC: 10 WRITE_WITH_IMMs posted at once are each delayed by up to
 * 300 ms (requests wait longer than the 107 ms transport timeout), complete in order
 * without an error, their data there at B's completions; `up` ends the delays.
 */
#define JIT_N  10
#define JIT_MS 300

void jitter_a(struct peer *p)
{
	double t0, last = 0, first = 0;
	struct ibv_wc wc;

	setup(p);
	CHECK(p, ctl_status(p, "fault A mlx5_0 jitter") == 2);
	CHECK(p, ctl_status(p, "fault A mlx5_0 jitter 0") == 2);
	CHECK(p, ctl_status(p, "fault A mlx5_0 ackloss 3") == 2);
	ctl(p, "fault A mlx5_0 jitter 300");
	sync_wait(p, 1);
	fill(p->buf, JIT_N * 4096, 71);
	t0 = now_ms();
	for (int i = 0; i < JIT_N; i++)
		post(p, 0, IBV_WR_RDMA_WRITE_WITH_IMM, (uint64_t)i, IBV_SEND_SIGNALED,
		     (uint64_t)i * 4096, 4096, (uint64_t)i * 4096, p->peer.rkey, (uint32_t)i);
	for (int i = 0; i < JIT_N; i++) {
		expect_wc(p, (uint64_t)i, IBV_WC_SUCCESS, 1000, &wc);
		last = now_ms() - t0;
		if (i == 0)
			first = last;
	}
	fprintf(stderr, "  jitter %d ms: first after %.0f ms, last after %.0f ms\n", JIT_MS, first,
		last);
	CHECK(p, last > RETRY_MS && last < JIT_MS * 1.3 + 30, "(last after %.0f ms)", last);
	ctl(p, "fault A mlx5_0 up");
	t0 = now_ms();
	post(p, 0, IBV_WR_RDMA_WRITE_WITH_IMM, 99, IBV_SEND_SIGNALED, 0, 64, 0, p->peer.rkey, 99);
	expect_wc(p, 99, IBV_WC_SUCCESS, 1000, NULL);
	CHECK(p, now_ms() - t0 < 20, "(%.0f ms after up)", now_ms() - t0);
	sync_wait(p, 2);
}

void jitter_b(struct peer *p)
{
	struct ibv_wc wc;

	setup(p);
	for (int i = 0; i <= JIT_N; i++)
		post_recv(p, 0, (uint64_t)i);
	sync_send(p, 1);
	for (int i = 0; i < JIT_N; i++) {
		expect_wc(p, (uint64_t)i, IBV_WC_SUCCESS, 1000, &wc);
		CHECK(p, wc.imm_data == (uint32_t)i &&
			     check_fill(p->buf + (uint64_t)i * 4096, 4096, 71 + i * 4096 * 131));
	}
	expect_wc(p, JIT_N, IBV_WC_SUCCESS, 1000, &wc);
	CHECK(p, wc.imm_data == 99);
	sync_send(p, 2);
}

/* ---- QPs served like a NIC serves them ---- */

/*
 * 20 QPs stream 1 MiB writes (eight in flight each) through one NIC shaped at 5 Gb/s,
 * and one more QP posts a 64-byte signalled write, waits for it, and again (at most one
 * a millisecond). A NIC
 * interleaves its QPs a slice at a time: the small writes wait about one round (a
 * 64 KiB slice of each busy QP, 21 x 105 us = 2.2 ms), not for the bulk queued
 * ahead of them, and the streams get equal shares.
 */
#define FAIR_BULK  20
#define FAIR_GBPS  5
#define FAIR_SECS  1.0
#define FAIR_SKIP  0.2 /* ramp-up not measured */
#define FAIR_SMALL 4000
#define FAIR_DEPTH 8 /* writes in flight per stream: the NIC stays busy if this thread is late */

void fair_a(struct peer *p)
{
	static double lat[FAIR_SMALL];
	uint64_t bytes[FAIR_BULK] = {0}, seq[FAIR_BULK] = {0};
	double t0, round_ms, small_t = 0, sum = 0, sum2 = 0, lo = 1e300, hi = 0, jain, p50, p90;
	int nlat = 0;
	bool small_out = false;

	p->nqp = FAIR_BULK + 1;
	setup(p);
	t0 = now_ms();
	for (int q = 0; q < FAIR_BULK; q++)
		for (int k = 0; k < FAIR_DEPTH; k++)
			post(p, q, IBV_WR_RDMA_WRITE, (uint64_t)q << 32 | seq[q]++,
			     IBV_SEND_SIGNALED, 0, 1u << 20, 0, p->peer.rkey, 0);
	while (now_ms() - t0 < FAIR_SECS * 1000) {
		struct ibv_wc wc;
		int q;

		/* At most one a millisecond: samples spread over time, not over idle moments. */
		if (!small_out && nlat < FAIR_SMALL && now_ms() - small_t >= 1) {
			small_t = now_ms();
			post(p, FAIR_BULK, IBV_WR_RDMA_WRITE, (uint64_t)FAIR_BULK << 32,
			     IBV_SEND_SIGNALED, 0, 64, 2u << 20, p->peer.rkey, 0);
			small_out = true;
		}
		if (ibv_poll_cq(p->cq, 1, &wc) != 1)
			continue;
		CHECK(p, wc.status == IBV_WC_SUCCESS);
		q = (int)(wc.wr_id >> 32);
		if (q == FAIR_BULK) {
			if (now_ms() - t0 > FAIR_SKIP * 1000)
				lat[nlat++] = now_ms() - small_t;
			small_out = false;
			continue;
		}
		if (now_ms() - t0 > FAIR_SKIP * 1000)
			bytes[q] += 1u << 20;
		post(p, q, IBV_WR_RDMA_WRITE, (uint64_t)q << 32 | seq[q]++, IBV_SEND_SIGNALED, 0,
		     1u << 20, 0, p->peer.rkey, 0);
	}
	for (int q = 0; q < FAIR_BULK; q++) {
		double x = (double)bytes[q];

		sum += x;
		sum2 += x * x;
		lo = x < lo ? x : lo;
		hi = x > hi ? x : hi;
	}
	jain = sum * sum / (FAIR_BULK * sum2);
	qsort(lat, (size_t)nlat, sizeof(lat[0]), cmp_double);
	CHECK(p, nlat > 0, "(no small write completed)");
	p50 = lat[nlat / 2];
	p90 = lat[nlat * 9 / 10];
	round_ms = (FAIR_BULK + 1) * 65536 * 8.0 / (FAIR_GBPS * 1e6);
	fprintf(stderr,
		"  fairness: %.2f Gb/s over %d streams, Jain %.3f, max/min %.2f; small write "
		"p50 %.2f ms p90 %.2f ms (%d; a round is %.2f ms)\n",
		sum * 8 / ((FAIR_SECS - FAIR_SKIP) * 1e9), FAIR_BULK, jain, hi / lo, p50, p90, nlat,
		round_ms);
	/* Jain's index over the streams, and no stream far behind: max/min reached 1.35-1.42
	 * (Jain 0.991-0.994) on the 2-core machine with a CI run and a fault walk beside it,
	 * about 24 writes a stream in the window; a starved stream gives far more. */
	CHECK(p, jain > 0.98 && hi / lo < 1.6, "(the streams are not served alike)");
	CHECK(p, p50 < 3 * round_ms && p90 < 5 * round_ms,
	      "(small writes wait behind the bulk: p50 %.2f p90 %.2f ms)", p50, p90);
	sync_send(p, 1);
}

void fair_b(struct peer *p)
{
	p->nqp = FAIR_BULK + 1;
	setup(p);
	sync_wait(p, 1);
}
