/* The node's placement ledger (repair/model/ledger.c): shared between processes of
 * one job and node, separate for another node or job, removed by its last user. */
#include "repair/model/ledger.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t job(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec;
}

static bool table_exists(uint64_t j)
{
	char cmd[256];
	snprintf(cmd, sizeof(cmd), "ls /dev/shm/r2cc-place-%u-%016llx-* >/dev/null 2>&1",
		 (unsigned)getuid(), (unsigned long long)j);
	return system(cmd) == 0;
}

/* A child process of the same node: opens the table, adds, tells the parent,
 * waits for the parent to have read, then drops its use as the library's exit
 * handler does. */
struct child {
	pid_t pid;
	int to_parent[2], to_child[2];
};

static void child_start(struct child *c, uint64_t j, const char *node)
{
	cr_assert_eq(pipe(c->to_parent), 0);
	cr_assert_eq(pipe(c->to_child), 0);
	c->pid = fork();
	cr_assert_geq(c->pid, 0);
	if (c->pid == 0) {
		char b = r2cc_ledger_open(j, node) ? 'e' : 'k';
		r2cc_ledger_add("mlx5_0", 1, 2);
		r2cc_ledger_add("mlx5_3", 0, 1);
		if (write(c->to_parent[1], &b, 1) != 1 || read(c->to_child[0], &b, 1) != 1)
			_exit(2);
		r2cc_ledger_close();
		_exit(0);
	}
	char b = 0;
	cr_assert_eq(read(c->to_parent[0], &b, 1), 1);
	cr_assert_eq(b, 'k', "the child could not open the table");
}

static int child_finish(struct child *c)
{
	char b = 'd';
	int st = 0;
	cr_assert_eq(write(c->to_child[1], &b, 1), 1);
	waitpid(c->pid, &st, 0);
	for (int i = 0; i < 2; i++) {
		close(c->to_parent[i]);
		close(c->to_child[i]);
	}
	return WIFEXITED(st) ? WEXITSTATUS(st) : 99;
}

Test(ledger, shared_by_the_processes_of_a_node)
{
	uint64_t j = job();
	struct child c;
	child_start(&c, j, "node0");
	cr_assert_eq(r2cc_ledger_open(j, "node0"), 0);
	cr_expect_eq(r2cc_ledger_get("mlx5_0", 1), 2);
	cr_expect_eq(r2cc_ledger_get("mlx5_0", 0), 0);
	cr_expect_eq(r2cc_ledger_get("mlx5_3", 0), 1);
	cr_expect_eq(r2cc_ledger_get("mlx5_2", 0), 0);
	r2cc_ledger_add("mlx5_0", 1, -1);
	cr_expect_eq(r2cc_ledger_get("mlx5_0", 1), 1);
	cr_assert_eq(child_finish(&c), 0);
	cr_expect(table_exists(j), "removed while this process still used it");
	r2cc_ledger_close();
	cr_expect_not(table_exists(j), "the last user did not remove the table");
	cr_expect_eq(r2cc_ledger_get("mlx5_0", 1), 0, "read after close");
	r2cc_ledger_close(); /* idempotent */
}

Test(ledger, another_node_or_job_has_its_own)
{
	uint64_t j = job();
	struct child c;
	child_start(&c, j, "node0");
	cr_assert_eq(r2cc_ledger_open(j, "node1"), 0);
	cr_expect_eq(r2cc_ledger_get("mlx5_0", 1), 0);
	/* once per process: a second open keeps the first table */
	cr_expect_eq(r2cc_ledger_open(j + 1, "node0"), 0);
	cr_expect_eq(r2cc_ledger_get("mlx5_0", 1), 0);
	r2cc_ledger_close();
	cr_assert_eq(child_finish(&c), 0);
	cr_expect_not(table_exists(j), "a table outlived its users");
}

Test(ledger, without_a_table_counts_read_zero)
{
	cr_expect_eq(r2cc_ledger_get("mlx5_0", 0), 0);
	r2cc_ledger_add("mlx5_0", 0, 5); /* nothing to add to: no crash */
	cr_expect_eq(r2cc_ledger_get("mlx5_0", 0), 0);
	cr_expect_eq(r2cc_ledger_get(NULL, 0), 0);
	cr_expect_eq(r2cc_ledger_get("", 1), 0);
}

/* The stall scan's load rows: each process publishes its own, every process reads
 * the node's sum; a process that is gone no longer counts. */
Test(ledger, load_is_summed_over_the_live_processes_of_the_node)
{
	uint64_t j = job();
	int go[2], ready[2];
	cr_assert_eq(pipe(go), 0);
	cr_assert_eq(pipe(ready), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		char b = 'k';
		if (r2cc_ledger_open(j, "node0"))
			b = 'e';
		r2cc_ledger_load_put("mlx5_1", 300, 7000);
		if (write(ready[1], &b, 1) != 1 || read(go[0], &b, 1) != 1)
			_exit(2);
		_exit(0); /* killed-like: no close, its row stays until it is seen dead */
	}
	char b = 0;
	cr_assert_eq(read(ready[0], &b, 1), 1);
	cr_assert_eq(b, 'k');
	cr_assert_eq(r2cc_ledger_open(j, "node0"), 0);
	r2cc_ledger_load_put("mlx5_1", 100, 5000);
	uint64_t q = 0, d = 0;
	cr_assert(r2cc_ledger_load_get("mlx5_1", &q, &d));
	cr_expect_eq(q, 400);
	cr_expect_eq(d, 12000);
	cr_assert(r2cc_ledger_load_get("mlx5_0", &q, &d) == false || (q == 0 && d == 0));
	cr_assert_eq(write(go[1], &b, 1), 1);
	int st;
	waitpid(pid, &st, 0);
	/* the row of the dead process is checked again within a second */
	sleep(2);
	cr_assert(r2cc_ledger_load_get("mlx5_1", &q, &d));
	cr_expect_eq(q, 100, "a dead process's queue still counted");
	cr_expect_eq(d, 5000);
	r2cc_ledger_close();
	/* the child never dropped its use: remove the table by hand, as a user would */
	char cmd[256];
	snprintf(cmd, sizeof(cmd), "rm -f /dev/shm/r2cc-place-%u-%016llx-*", (unsigned)getuid(),
		 (unsigned long long)j);
	cr_expect_eq(system(cmd), 0);
}

/* /dev/shm path of job j's table on node (the library's name). */
static void table_path(uint64_t j, char *out, size_t len)
{
	char cmd[256];
	snprintf(cmd, sizeof(cmd), "ls /dev/shm/r2cc-place-%u-%016llx-* 2>/dev/null | head -1",
		 (unsigned)getuid(), (unsigned long long)j);
	FILE *f = popen(cmd, "r");
	out[0] = '\0';
	if (f && fgets(out, (int)len, f))
		out[strcspn(out, "\n")] = '\0';
	if (f)
		pclose(f);
}

/* A table as a killed job leaves it: its only process opened it and was killed
 * (no exit handler); then aged past the sweep's threshold. A table whose process
 * lives stays, however old; so does this job's own. */
Test(ledger, tables_of_killed_jobs_are_removed)
{
	uint64_t dead = job(), alive = dead + 7, mine = dead + 11;
	struct child c;
	pid_t k = fork();
	cr_assert_geq(k, 0);
	if (k == 0) {
		r2cc_ledger_open(dead, "node0");
		raise(SIGKILL);
	}
	int st;
	waitpid(k, &st, 0);
	cr_assert(WIFSIGNALED(st));
	child_start(&c, alive, "node0");
	char pd[256], pa[256];
	table_path(dead, pd, sizeof(pd));
	table_path(alive, pa, sizeof(pa));
	cr_assert(pd[0] && pa[0], "the tables were not made");
	struct timespec old[2] = {{.tv_sec = time(NULL) - 3600}, {.tv_sec = time(NULL) - 3600}};
	cr_assert_eq(utimensat(AT_FDCWD, pd, old, 0), 0);
	cr_assert_eq(utimensat(AT_FDCWD, pa, old, 0), 0);
	cr_assert_eq(r2cc_ledger_open(mine, "node0"), 0);
	cr_expect_not(table_exists(dead), "the killed job's table is still there");
	cr_expect(table_exists(alive), "a live process's table was removed");
	cr_expect(table_exists(mine), "this process's own table was removed");
	r2cc_ledger_close();
	cr_assert_eq(child_finish(&c), 0);
}

/* A NIC one process finds dead reaches the node's others with its time, the
 * process and its reason (cut to R2CC_LEDGER_WHY - 1 bytes); an older verdict
 * changes none of them; without the reason asked, the time and process only. */
Test(ledger, dead_nic_verdicts_are_shared_by_the_node)
{
	uint64_t j = job();
	int to_parent[2], to_child[2];
	char why[300];
	memset(why, 'x', sizeof(why) - 1);
	why[sizeof(why) - 1] = 0;
	memcpy(why, "self-test through mlx5_0", 24);
	cr_assert_eq(pipe(to_parent), 0);
	cr_assert_eq(pipe(to_child), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		char b = r2cc_ledger_open(j, "node0") ? 'e' : 'k';
		r2cc_ledger_dead_put("mlx5_1", 1000, getpid(), why);
		if (write(to_parent[1], &b, 1) != 1 || read(to_child[0], &b, 1) != 1)
			_exit(2);
		r2cc_ledger_close();
		_exit(0);
	}
	char b = 0;
	cr_assert_eq(read(to_parent[0], &b, 1), 1);
	cr_assert_eq(b, 'k');
	cr_assert_eq(r2cc_ledger_open(j, "node0"), 0);
	int by = 0;
	char got[R2CC_LEDGER_WHY];
	cr_expect_eq(r2cc_ledger_dead_at("mlx5_1", &by, got), 1000);
	cr_expect_eq(by, pid);
	cr_expect_eq(strlen(got), R2CC_LEDGER_WHY - 1);
	cr_expect_eq(strncmp(got, why, R2CC_LEDGER_WHY - 1), 0);
	r2cc_ledger_dead_put("mlx5_1", 500, 1, "older");
	cr_expect_eq(r2cc_ledger_dead_at("mlx5_1", &by, got), 1000);
	cr_expect_eq(by, pid, "an older verdict replaced the process");
	cr_expect_eq(strncmp(got, "self-test", 9), 0, "an older verdict replaced the reason");
	r2cc_ledger_dead_put("mlx5_1", 2000, 7, "port error event");
	cr_expect_eq(r2cc_ledger_dead_at("mlx5_1", &by, NULL), 2000);
	cr_expect_eq(by, 7);
	cr_expect_eq(r2cc_ledger_dead_at("mlx5_1", &by, got), 2000);
	cr_expect_str_eq(got, "port error event");
	cr_expect_eq(r2cc_ledger_dead_at("mlx5_2", &by, got), 0);
	cr_expect_eq(by, 0);
	cr_expect_str_eq(got, "");
	b = 'd';
	cr_assert_eq(write(to_child[1], &b, 1), 1);
	int st = 0;
	waitpid(pid, &st, 0);
	cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	r2cc_ledger_close();
	for (int i = 0; i < 2; i++) {
		close(to_parent[i]);
		close(to_child[i]);
	}
}
