/*
 * Hot repair's virtual CQ (repair/vcq.c) under failed allocations: whichever
 * allocation of the library fails, every completion of a CQ must come out of
 * r2cc_repair_poll() exactly once and in order. The CQ is a fake (a counter
 * behind a poll_cq of our own) holding more completions than the stash's first
 * size, so that pumping them all grows the stash more than once.
 *
 *   vcq_oom        counts the allocations of one run (R2CC_FAULT_INJECT=count:),
 *                  then runs itself once per allocation N with alloc:N; exit 0
 *                  when every run passed
 *   vcq_oom run    one run (R2CC_FAULT_INJECT as set): exit 0 pass, 1 a
 *                  completion lost, repeated or out of order, 2 stalled
 *
 * Linked with libr2cc.so's objects (not the verbs interposer) and its --wrap of
 * malloc, calloc and realloc, so R2CC_FAULT_INJECT reaches every allocation.
 * Single-threaded: the Nth allocation is the same one in every run.
 */
#include "repair/engine.h"
#include "shim/core.h"
#include "shim/registry.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define TOTAL 3000 /* the stash starts at 256 entries */
#define QPN   0x77 /* no QP of the registry: completions pass to the stash as they are */

static uint64_t produced;

static int fake_poll(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	int k = 0;
	for (; k < n && produced < TOTAL; k++) {
		memset(&wc[k], 0, sizeof(wc[k]));
		wc[k].wr_id = produced++;
		wc[k].status = IBV_WC_SUCCESS;
		wc[k].opcode = IBV_WC_RECV;
		wc[k].qp_num = QPN;
	}
	return k;
}

static int one_run(void)
{
	if (!r2cc_repair_enabled()) {
		fprintf(stderr, "vcq_oom: hot repair is off (R2CC did not start)\n");
		return 0; /* a failed start-up allocation: plain pass-through, nothing to check */
	}
	struct r2cc_nic *nic = r2cc_nic_get("fake_0");
	if (!nic)
		return 0;
	struct r2cc_ctx ctx = {.nic = nic, .poll_cq = fake_poll};
	static char cq_obj[64];
	struct r2cc_cq c = {.cq = (struct ibv_cq *)cq_obj, .ctx = &ctx};
	r2cc_repair_cq_created(&c);
	uint64_t got = 0;
	for (int idle = 0; got < TOTAL && idle < 100;) {
		struct ibv_wc wc[16];
		int n = r2cc_repair_poll(&c, 16, wc);
		idle = n > 0 ? 0 : idle + 1;
		for (int i = 0; i < n; i++, got++)
			if (wc[i].wr_id != got) {
				printf(
				    "completion %llu where %llu was next: lost, repeated or out of "
				    "order\n",
				    (unsigned long long)wc[i].wr_id, (unsigned long long)got);
				return 1;
			}
	}
	if (got < TOTAL) {
		printf("stalled at %llu of %d completions\n", (unsigned long long)got, TOTAL);
		return 2;
	}
	return 0;
}

static int run_child(const char *self, const char *inject)
{
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		setenv("R2CC_FAULT_INJECT", inject, 1);
		execl(self, self, "run", (char *)NULL);
		_exit(127);
	}
	int st;
	if (waitpid(pid, &st, 0) < 0)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "run"))
		return one_run();
	char path[64], inject[96];
	snprintf(path, sizeof(path), "/tmp/vcq_oom.%d", (int)getpid());
	snprintf(inject, sizeof(inject), "count:%s", path);
	if (run_child("/proc/self/exe", inject)) {
		printf("FAIL: the counting run failed\n");
		return 1;
	}
	FILE *f = fopen(path, "r");
	unsigned long long allocs = 0, v;
	char kind[16];
	while (f && fscanf(f, "%15s %llu", kind, &v) == 2)
		if (!strcmp(kind, "alloc"))
			allocs = v;
	if (f)
		fclose(f);
	unlink(path);
	if (!allocs) {
		printf("FAIL: no allocations counted\n");
		return 1;
	}
	int bad = 0;
	for (unsigned long long n = 1; n <= allocs + 1; n++) {
		snprintf(inject, sizeof(inject), "alloc:%llu", n);
		int rc = run_child("/proc/self/exe", inject);
		if (rc) {
			printf("alloc:%llu: %s (status %d)\n", n,
			       rc == 1	 ? "wrong completions"
			       : rc == 2 ? "stalled"
					 : "crashed",
			       rc);
			bad++;
		}
	}
	printf("%s: %llu allocations, each failed in turn, %d run(s) wrong\n",
	       bad ? "FAIL" : "PASS", allocs, bad);
	return bad != 0;
}
