/*
 * Multi-process conformance tests of the software RDMA device. Each test forks two
 * processes, node "A" and node "B" on a private fabric, which open their NICs,
 * connect RC QPs over a socketpair and check data, completions, QP states, async
 * events, counters, shaping and faults, shared receive queues, send queue slots that
 * are free once their completion is polled, and completion channels woken by the
 * other process. Any mismatch exits non-zero. Tests whose outcome depends on
 * SOFTVERBS_SEED leave what they saw in memory shared with this parent, which
 * compares runs.
 *
 * This file has the test table and main; the tests are in conformance_*.c, one file
 * per verbs area, and the steps they share in conformance_peer.c (conformance.h).
 *
 *   conformance [TEST...]     run all tests, or the named ones
 */
#include "tests/softverbs/conformance.h"

#include <stdlib.h>
#include <sys/mman.h>

struct test {
	const char *name;
	role_fn a, b;
	const char *env; /* NAME=VALUE;... for both processes */
	bool b_dies;
	const char *node_b;    /* B's node name, default "B" */
	bool keep;	       /* leave the fabric to the next test */
	bool (*verdict)(void); /* then, in this process: what the runs left in `results` */
};

#define SHAPED_2G "SOFTVERBS_SHAPING=1;SOFTVERBS_NICS=mlx5_0:2,mlx5_1:2"

static const struct test tests[] = {
    {.name = "write", .a = write_a, .b = write_b},
    {.name = "order", .a = order_a, .b = order_b},
    {.name = "mixed_order", .a = mixed_a, .b = mixed_b},
    {.name = "err_in_flight", .a = err_busy_a, .b = idle_b},
    {.name = "read", .a = read_a, .b = read_b},
    {.name = "send", .a = send_a, .b = send_b},
    {.name = "rnr", .a = rnr_a, .b = rnr_b},
    {.name = "access", .a = access_a, .b = access_b},
    {.name = "counters", .a = counters_a, .b = counters_b},
    {.name = "shaping", .a = shaping_a, .b = idle_b, .env = SHAPED_2G},
    {.name = "slow", .a = slow_a, .b = idle_b},
    {.name = "slow_receiver", .a = slow_rx_a, .b = idle_b},
    {.name = "down", .a = down_a, .b = down_b},
    {.name = "blackhole", .a = blackhole_a, .b = blackhole_b},
    {.name = "flap", .a = flap_a, .b = idle_b},
    {.name = "peer_death", .a = death_a, .b = death_b, .b_dies = true},
    {.name = "scheduled_fault",
     .a = sched_a,
     .b = idle_b,
     .env = "SOFTVERBS_FAULT=B/mlx5_0=blackhole@300"},
    {.name = "nccl_pattern", .a = np_sender, .b = np_receiver},
    {.name = "shared_nic", .a = shared_nic, .b = shared_nic, .env = SHAPED_2G, .node_b = "A"},
    {.name = "reuse_left_down", .a = leave_down, .b = idle_b, .keep = true},
    {.name = "reuse_starts_fresh", .a = find_fresh, .b = find_fresh, .node_b = "A"},
    {.name = "srq", .a = srq_a, .b = srq_b},
    {.name = "sq_refill", .a = sq_refill_a, .b = idle_b},
    {.name = "channel", .a = channel_a, .b = channel_b},
    {.name = "large_cq", .a = bigcq_a, .b = bigcq_b},
    {.name = "large_cq_owner_dies", .a = bigcq_dies_a, .b = bigcq_dies_b, .b_dies = true},
    {.name = "ackloss_sender", .a = ackloss_a, .b = ackloss_b, .env = "SVTEST_FAULT=A"},
    {.name = "ackloss_responder", .a = ackloss_a, .b = ackloss_b, .env = "SVTEST_FAULT=B"},
    {.name = "ackloss_heals", .a = ackheal_a, .b = ackheal_b},
    {.name = "blackhole_tx", .a = bh_tx, .b = bh_tx},
    {.name = "blackhole_rx", .a = bh_rx, .b = bh_rx},
    {.name = "blackhole_inflight",
     .a = inflight_a,
     .b = inflight_b,
     .env = "SOFTVERBS_SEED=27;SVTEST_SLOT=0;SVTEST_TIMEOUT=16",
     .verdict = inflight_first_verdict},
    {.name = "blackhole_inflight_again",
     .a = inflight_a,
     .b = inflight_b,
     .env = "SOFTVERBS_SEED=27;SVTEST_SLOT=1;SVTEST_TIMEOUT=16"},
    {.name = "blackhole_inflight_seed1",
     .a = inflight_a,
     .b = inflight_b,
     .env = "SOFTVERBS_SEED=1;SVTEST_SLOT=2;SVTEST_TIMEOUT=16",
     .verdict = inflight_verdict},
    {.name = "blackhole_stream", .a = bhstream_a, .b = bhstream_b, .env = SHAPED_2G},
    {.name = "fatal", .a = fatal_a, .b = fatal_b},
    {.name = "fatal_shared", .a = fatal_shared, .b = fatal_shared, .node_b = "A"},
    {.name = "jitter", .a = jitter_a, .b = jitter_b},
    {.name = "fairness",
     .a = fair_a,
     .b = fair_b,
     .env = "SOFTVERBS_SHAPING=1;SOFTVERBS_NICS=mlx5_0:5,mlx5_1:5"},
    {.name = "limits", .a = limits_a, .b = absent_b},
    {.name = "reset_cleans_cq", .a = reset_clean_a, .b = reset_clean_b},
    {.name = "comp_vector", .a = comp_vector_a, .b = absent_b},
    {.name = "cmd_fd", .a = cmd_fd_a, .b = absent_b},
};

static void child_env(const struct test *t, char role)
{
	char node[2] = {role, 0};

	setenv("SOFTVERBS_FABRIC", fabric, 1);
	setenv("SOFTVERBS_NODE", role == 'B' && t->node_b ? t->node_b : node, 1);
	setenv("SOFTVERBS_NICS", "mlx5_0:100,mlx5_1:100", 1);
	setenv("SOFTVERBS_TIME_SCALE", "0.2", 1);
	unsetenv("SOFTVERBS_SHAPING");
	unsetenv("SOFTVERBS_FAULT");
	unsetenv("SOFTVERBS_SEED");
	unsetenv("SOFTVERBS_INFLIGHT");
	sv_put_env(t->env);
}

static void child(const void *arg, char role, int sock)
{
	const struct test *t = arg;
	struct peer p = {.role = role, .sock = sock};

	child_env(t, role);
	(role == 'A' ? t->a : t->b)(&p);
}

static const char *test_name(size_t i)
{
	return tests[i].name;
}

static bool run(size_t i)
{
	const struct test *t = &tests[i];
	const struct sv_pair pair = {
	    .name = t->name, .b_dies = t->b_dies, .keep = t->keep, .verdict = t->verdict};

	return sv_run_pair("svtest", &pair, child, t);
}

int main(int argc, char **argv)
{
	if (sv_test_init() != 0)
		return 2;
	results =
	    mmap(NULL, sizeof(*results), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (results == MAP_FAILED)
		return 2;
	return sv_run_named(argc, argv, sizeof(tests) / sizeof(tests[0]), test_name, run);
}
