/* The stall scan's load model (repair/model/stall.c): what a wait on a NIC is explained
 * by. The registry is replaced by two NICs of this file; without a node ledger the
 * model is this process's own. */
#include "repair/model/stall.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

static struct r2cc_nic nics[2];

int r2cc_nic_count(void)
{
	return 2;
}

struct r2cc_nic *r2cc_nic_by_index(int index)
{
	return index >= 0 && index < 2 ? &nics[index] : NULL;
}

static void setup(void)
{
	memset(nics, 0, sizeof(nics));
	for (int i = 0; i < 2; i++) {
		nics[i].index = i;
		snprintf(nics[i].name, sizeof(nics[i].name), "mlx5_%d", i);
		nics[i].speed_gbps = 8; /* 1e9 bytes/s until measured */
	}
}

#define MS 1000000ll

/* One scan at time t: nic 0 owes `queued` bytes and retired `drained` since the last. */
static void scan(int64_t t, uint64_t queued, uint64_t drained, uint32_t big)
{
	r2cc_stall_scan_begin();
	r2cc_stall_account(&nics[0], queued, drained, big);
	r2cc_stall_scan_end(t);
}

TestSuite(stall, .init = setup);

/* Before any measurement the port's rate (speed x width) is the drain rate. */
Test(stall, port_rate_until_measured)
{
	cr_assert_float_eq(r2cc_stall_rate(&nics[1]), 1e9, 1);
	/* 100 ms floor + 2 x 1 GB at 1 GB/s */
	cr_assert_eq(r2cc_stall_explained_ns(&nics[1], 1000000000ull, 100 * MS), 2100 * MS);
}

/* A busy NIC's rate is measured from what it retires; the largest request counts. */
Test(stall, measured_rate_and_largest_request)
{
	int64_t t = 1000 * MS;
	scan(t, 0, 0, 0);
	for (int i = 1; i <= 60; i++) /* 300 ms busy at 4 MB per 5 ms = 0.8 GB/s */
		scan(t + i * 5 * MS, 8u << 20, 4000000, 10000000);
	cr_assert_float_eq(r2cc_stall_rate(&nics[0]), 8e8, 1e6);
	cr_assert_eq(r2cc_stall_queued(&nics[0]), 8u << 20);
	cr_assert_eq(r2cc_stall_drained(&nics[0]), 240000000ull);
	cr_assert_eq(r2cc_stall_last_drain(&nics[0]), t + 300 * MS);
	/* floor 0 + 2 (ahead 8e6 + largest 1e7) / 8e8 = 45 ms */
	cr_assert_eq(r2cc_stall_explained_ns(&nics[0], 8000000, 0), 45 * MS);
}

/* A NIC that stops draining (a black hole) keeps the rate it had: what is queued
 * on it is explained as quickly as before, so the stall is suspected at once. */
Test(stall, a_dead_nic_keeps_its_rate)
{
	int64_t t = 1000 * MS;
	scan(t, 0, 0, 0);
	for (int i = 1; i <= 40; i++)
		scan(t + i * 5 * MS, 1u << 20, 5000000, 0); /* 1 GB/s */
	double before = r2cc_stall_rate(&nics[0]);
	for (int i = 41; i <= 400; i++) /* 1.8 s owed, nothing retired */
		scan(t + i * 5 * MS, 1u << 20, 0, 0);
	cr_assert_float_eq(r2cc_stall_rate(&nics[0]), before, 1);
	cr_assert_eq(r2cc_stall_last_drain(&nics[0]), t + 200 * MS);
}

/* A NIC that goes black before its first full window keeps the port's rate: the
 * wait that no completion ended is not service time. Before, the window it fell in
 * closed with a few bytes over 100 ms (here 2 MB/s), which explained a wait of
 * seconds and delayed the suspicion by as much. */
Test(stall, a_wait_no_drain_ended_measures_nothing)
{
	int64_t t = 1000 * MS;
	scan(t, 0, 0, 0);
	for (int i = 1; i <= 4; i++) /* 20 ms busy, 50 kB each 5 ms */
		scan(t + i * 5 * MS, 1u << 20, 50000, 4000000);
	for (int i = 5; i <= 300; i++) /* then 1.5 s owed, nothing retired */
		scan(t + i * 5 * MS, 1u << 20, 0, 4000000);
	cr_assert_float_eq(r2cc_stall_rate(&nics[0]), 1e9, 1); /* still the port's */
	/* floor 100 ms + 2 (0 + 4 MB) / 1 GB/s = 108 ms, not 4 s at 2 MB/s */
	cr_assert_eq(r2cc_stall_explained_ns(&nics[0], 0, 100 * MS), 108 * MS);
}

/* A wait that a completion ends was service, however slow: a slow fabric is
 * measured slow. */
Test(stall, a_wait_a_drain_ends_is_service)
{
	int64_t t = 1000 * MS;
	scan(t, 0, 0, 0);
	for (int i = 1; i <= 40; i++) /* 195 ms owed, nothing retired */
		scan(t + i * 5 * MS, 1u << 20, 0, 0);
	scan(t + 205 * MS, 1u << 20, 2000000, 0); /* then 2 MB: 10 MB/s over 200 ms */
	cr_assert_float_eq(r2cc_stall_rate(&nics[0]), 1e7, 1);
}

/* A wait that ends because its requests went elsewhere (moved off a dead NIC)
 * is forgotten: when the NIC is back after the samples before it have expired,
 * the dead time must not enter its first sample. */
Test(stall, a_wait_that_moved_away_is_forgotten)
{
	int64_t t = 1000 * MS;
	scan(t, 0, 0, 0);
	for (int i = 1; i <= 40; i++) /* 195 ms busy at 1 GB/s */
		scan(t + i * 5 * MS, 1u << 20, 5000000, 0);
	for (int i = 41; i <= 200; i++) /* 800 ms owed, nothing retired */
		scan(t + i * 5 * MS, 1u << 20, 0, 0);
	scan(t + 1005 * MS, 0, 0, 0); /* moved away */
	int64_t back = t + 12000 * MS;
	scan(back, 1u << 20, 0, 0);
	scan(back + 5 * MS, 1u << 20, 10000000, 0); /* back: 2 GB/s */
	/* (95 MB + 10 MB) / 100 ms of service; with the dead 800 ms, 117 MB/s */
	cr_assert_geq(r2cc_stall_rate(&nics[0]), 1e9);
}

/* Time the NIC was idle (nothing owed) measures nothing. */
Test(stall, idle_time_is_not_measured)
{
	int64_t t = 1000 * MS;
	scan(t, 0, 0, 0);
	for (int i = 1; i <= 100; i++)
		scan(t + i * 5 * MS, 0, 0, 0);
	cr_assert_float_eq(r2cc_stall_rate(&nics[0]), 1e9, 1); /* still the port's */
	cr_assert_geq(r2cc_stall_updated(), t + 500 * MS);
}

/* A self-test's write waits for one turn (64 KB, at most the largest request) of
 * each QP with work on the NIC, not for a whole request in service. */
Test(stall, a_turn_per_busy_qp)
{
	int64_t t = 1000 * MS;
	cr_assert_eq(r2cc_stall_turn_ns(&nics[0]), 0); /* nothing queued: no wait */
	r2cc_stall_scan_begin();
	for (int i = 0; i < 10; i++) /* ten QPs owe 4 MB each; the largest request 4 MB */
		r2cc_stall_account(&nics[0], 4u << 20, 0, 4u << 20);
	r2cc_stall_account(&nics[0], 0, 0, 0); /* an idle QP takes no turn */
	/* small requests on nic 1: ten turns of a request, but never more than one
	 * largest request (the allowance before turns) */
	for (int i = 0; i < 10; i++)
		r2cc_stall_account(&nics[1], 1000, 0, 1000);
	r2cc_stall_scan_end(t);
	/* 10 x 64 KiB at the port's 1 GB/s */
	cr_assert_eq(r2cc_stall_turn_ns(&nics[0]), 655360);
	cr_assert_eq(r2cc_stall_turn_ns(&nics[1]), 1000);
	/* two QPs busy behind 4 MB requests: two turns */
	r2cc_stall_scan_begin();
	r2cc_stall_account(&nics[0], 1u << 20, 0, 0);
	r2cc_stall_account(&nics[0], 1u << 20, 0, 0);
	r2cc_stall_scan_end(t + 5 * MS);
	cr_assert_eq(r2cc_stall_turn_ns(&nics[0]), 131072);
	/* idle again */
	r2cc_stall_scan_begin();
	r2cc_stall_scan_end(t + 10 * MS);
	cr_assert_eq(r2cc_stall_turn_ns(&nics[0]), 0);
}
