/*
 * The check for repairs (strategies/watch.h) across ranks: each rank learns of a
 * repair at its own time (its own count of repaired NICs), the check's all-gather
 * gives every rank the counts as they were at the call that issued it, and every
 * rank must take each new failure view at the same call: a first repair, a second
 * node degrading while the job runs, a NIC back.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "strategies/watch.h"

#define RANKS 8
#define CALLS 400

/* repaired[r][i]: what rank r counts at call i */
static int repaired[RANKS][CALLS];

/* Rank r's NICs: n repaired from call `from` on. */
static void set_from(int r, int from, int n)
{
	for (int i = from; i < CALLS; i++)
		repaired[r][i] = n;
}

struct rank_run {
	struct r2cc_watch_clock clock;
	int seen[RANKS], answer[RANKS];
	int switches, at[8], view[8][RANKS];
};

/* Every rank through CALLS eligible calls of bytes[i]. */
static void run(struct rank_run *rr, const double *bytes)
{
	memset(rr, 0, sizeof(*rr) * RANKS);
	for (int r = 0; r < RANKS; r++) {
		struct rank_run *me = &rr[r];
		for (int i = 0; i < CALLS; i++) {
			if (r2cc_watch_read_due(&me->clock, bytes[i]) &&
			    r2cc_watch_changed(me->seen, me->answer, RANKS)) {
				cr_assert_lt(me->switches, 8);
				me->at[me->switches] = i;
				memcpy(me->view[me->switches], me->seen, sizeof(me->seen));
				me->switches++;
				continue; /* the call takes the new view, issues nothing */
			}
			if (r2cc_watch_issue_due(&me->clock))
				for (int q = 0; q < RANKS; q++) /* the all-gather, at this call */
					me->answer[q] = repaired[q][i];
		}
	}
}

static void same_everywhere(const struct rank_run *rr)
{
	for (int r = 1; r < RANKS; r++) {
		cr_assert_eq(rr[r].switches, rr[0].switches, "rank %d", r);
		for (int k = 0; k < rr[0].switches; k++) {
			cr_assert_eq(rr[r].at[k], rr[0].at[k], "rank %d switch %d", r, k);
			cr_assert_arr_eq(rr[r].view[k], rr[0].view[k], sizeof(rr[0].view[k]));
		}
	}
}

Test(watch, a_second_node_degrades_and_a_nic_comes_back)
{
	static double bytes[CALLS];
	static struct rank_run rr[RANKS];

	memset(repaired, 0, sizeof(repaired));
	/* node 1 (ranks 2, 3): its ranks see the repair 5 calls apart */
	set_from(2, 30, 1);
	set_from(3, 35, 1);
	/* node 3 (ranks 6, 7) degrades later, one of its ranks much later */
	set_from(6, 120, 1);
	set_from(7, 150, 1);
	/* node 1's NIC back */
	set_from(2, 300, 0);
	set_from(3, 300, 0);
	for (int i = 0; i < CALLS; i++)
		bytes[i] = (i % 3 + 1) * 32.0 * 1024 * 1024; /* 32-96 MiB, mixed */
	run(rr, bytes);
	same_everywhere(rr);
	/* each change is taken once its last rank knew it, at most a period + lag later
	 * (a period of 16 calls or 1 GiB), and the views are what the ranks counted */
	cr_assert_geq(rr[0].switches, 3);
	int first = rr[0].at[0];
	cr_assert(first > 30 && first <= 30 + 2 * (R2CC_WATCH_EVERY + R2CC_WATCH_LAG), "%d", first);
	cr_assert_eq(rr[0].view[0][2], 1);
	int k = rr[0].switches - 1;
	cr_assert(rr[0].at[k] > 300 &&
		  rr[0].at[k] <= 300 + 2 * (R2CC_WATCH_EVERY + R2CC_WATCH_LAG));
	int want[RANKS] = {0, 0, 0, 0, 0, 0, 1, 1};
	cr_assert_arr_eq(rr[0].view[k], want, sizeof(want)); /* both of node 3, none of node 1 */
	/* somewhere between, a view with both degraded nodes */
	bool both = false;
	for (int s = 0; s < rr[0].switches; s++)
		both |= rr[0].view[s][2] == 1 && rr[0].view[s][6] == 1 && rr[0].view[s][7] == 1;
	cr_assert(both);
}

/* AllReduces of 1 GiB: each call reads the check the one before issued. */
Test(watch, large_calls_switch_at_the_second_call)
{
	static double bytes[CALLS];
	static struct rank_run rr[RANKS];

	memset(repaired, 0, sizeof(repaired));
	set_from(5, 10, 2);
	for (int i = 0; i < CALLS; i++)
		bytes[i] = R2CC_WATCH_BYTES;
	run(rr, bytes);
	same_everywhere(rr);
	cr_assert_eq(rr[0].switches, 1);
	/* issued at call 10 (rank 5 knows), read and taken at call 11 */
	cr_assert_eq(rr[0].at[0], 11);
	cr_assert_eq(rr[0].view[0][5], 2);
}

/* Nothing repaired: no check ever answers with a change. */
Test(watch, nothing_changes_nothing_switches)
{
	static double bytes[CALLS];
	static struct rank_run rr[RANKS];

	memset(repaired, 0, sizeof(repaired));
	for (int i = 0; i < CALLS; i++)
		bytes[i] = 17.0 * 1024 * 1024;
	run(rr, bytes);
	for (int r = 0; r < RANKS; r++)
		cr_assert_eq(rr[r].switches, 0);
}
