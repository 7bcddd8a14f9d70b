/*
 * r2cc-verbs-drill: runs NCCL-shaped verbs traffic between emulated nodes of the
 * software RDMA device, under LD_PRELOAD=libr2cc.so (or without, --no-preload),
 * injects a NIC fault at a random moment of each scenario and reports whether every
 * message arrived exactly once with the right bytes. See tools/drill/README.md.
 *
 * This file is the parent's run: the scenarios of every fault kind and seed, their
 * output and the totals. The rest of the parent: parse.c (options), proc.c (paths,
 * the worker processes: this program again, exec'ed with --worker so that the
 * preload applies; softverbs-ctl), fault.c (the fault's plan, injection and
 * --restore), reports.c (R2CC's incident reports), scenario.c (one scenario: its
 * deadline and verdict); parent.h has what they share. The workers are in
 * worker.c.
 */
#include "tools/drill/parent.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const drill_fault_names[] = {"none",	 "down",  "blackhole", "flap",
					 "slow",	 "kill",  "ackloss",   "blackhole-tx",
					 "blackhole-rx", "fatal", "jitter"};

volatile sig_atomic_t drill_stop;

/* snprintf that says whether it all fitted (paths must; messages may be cut). */
int drill_fmt(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, len, fmt, ap);
	va_end(ap);
	return n >= 0 && (size_t)n < len ? 0 : -ENAMETOOLONG;
}

static int drill_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void drill_print_times(const char *what, double *v, int n)
{
	if (!n) {
		printf(" %s n/a", what);
		return;
	}
	qsort(v, (size_t)n, sizeof(*v), drill_cmp);
	/* the 99th percentile by nearest rank: the smallest value with 99 % at or below */
	int p99 = (99 * n + 99) / 100 - 1;
	printf(" %s median %.1f ms max %.1f ms p99 %.1f ms (%d)", what,
	       n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v[n - 1], v[p99], n);
}

/* --summary: one line per scenario with what a comparison of runs needs
 * (tests/drill/inject-compare.sh): key=value, no spaces in a value. wrong: the
 * messages not delivered exactly once (check failures and messages missing). */
static void drill_summary(FILE *f, const struct drill_opts *o, const struct drill_scenario *s)
{
	char ev[256] = "";

	for (int c = 0; c < DRILL_EV_CLASSES; c++)
		if (s->evidence >> c & 1)
			snprintf(ev + strlen(ev), sizeof(ev) - strlen(ev), "%s%s", ev[0] ? "," : "",
				 drill_evidence_names[c]);
	fprintf(f,
		"compare: mode=%s kind=%s link=%s procs=%d seed=%d node=%d nic=%d verdict=%s "
		"evidence=%s qps_moved=%llu%s migrations=%llu wrong=%llu incidents=%d "
		"drill_marked=%d",
		o->inject ? "drill" : "device", drill_fault_names[s->kind], o->roce ? "roce" : "ib",
		o->procs, s->seed, s->node, s->nic, s->pass ? "PASS" : "FAIL", ev[0] ? ev : "none",
		(unsigned long long)s->qps_moved, s->timelines_full ? "+" : "",
		(unsigned long long)s->migrations,
		(unsigned long long)(s->checks +
				     (s->expected > s->delivered ? s->expected - s->delivered : 0)),
		s->incidents, s->drill_marked);
	if (s->det_first >= 0)
		fprintf(f, " detect_ms=%.1f detect_last_ms=%.1f\n", s->det_first, s->det_last);
	else
		fprintf(f, " detect_ms=- detect_last_ms=-\n");
	fflush(f);
}

static void drill_print_scenario(const struct drill_opts *o, const struct drill_scenario *s)
{
	static const char *const holds[] = {"", "init", "rts"};
	char fault[160] = "-", nic[16], kind[32];
	size_t n;

	snprintf(nic, sizeof(nic), o->fault_all_nics ? "all" : "mlx5_%d", s->nic);
	if (s->kind == DRILL_FAULT_FLAP)
		snprintf(kind, sizeof(kind), "flap:%dms", s->arg);
	else if (s->kind == DRILL_FAULT_SLOW)
		snprintf(kind, sizeof(kind), "slow:%dGbps", s->arg);
	else if (s->kind == DRILL_FAULT_JITTER)
		snprintf(kind, sizeof(kind), "jitter:%dms", s->arg);
	else
		snprintf(kind, sizeof(kind), "%s", drill_fault_names[s->kind]);
	if (s->kind == DRILL_FAULT_KILL)
		snprintf(fault, sizeof(fault), "node%d killed", s->node);
	else if (s->kind != DRILL_FAULT_NONE)
		snprintf(fault, sizeof(fault), "node%d/%s %s%s", s->node, nic, kind,
			 o->inject ? " (drill)" : "");
	else if (s->plan[0])
		snprintf(fault, sizeof(fault), "drill plan");
	n = strlen(fault);
	if (s->injected && o->fault_phase == DRILL_AT_CONNECT)
		snprintf(fault + n, sizeof(fault) - n, " at connect/%s +%.2fs", holds[s->hold],
			 (double)(s->injected_ns - s->start_ns) / 1e9);
	else if (s->injected)
		snprintf(fault + n, sizeof(fault) - n, " at %llu/%llu +%.2fs",
			 (unsigned long long)s->injected_at, (unsigned long long)s->expected,
			 (double)(s->injected_ns - s->start_ns) / 1e9);
	n = strlen(fault);
	if (s->second_injected)
		snprintf(fault + n, sizeof(fault) - n, ", then mlx5_%d +%.0fms", s->nic2,
			 (double)(s->second_ns - s->injected_ns) / 1e6);
	else if (o->inject && o->second_ms >= 0 && s->step_unix[0] > 0 && s->step_unix[1] > 0)
		snprintf(fault + n, sizeof(fault) - n, ", then mlx5_%d +%.0fms", s->nic2,
			 (s->step_unix[1] - s->step_unix[0]) * 1e3);
	printf("%-9s seed %-4d fault %-44s messages %llu/%llu errors %llu %s %.1fs",
	       drill_fault_names[s->kind], s->seed, fault, (unsigned long long)s->delivered,
	       (unsigned long long)s->expected, (unsigned long long)s->errors,
	       s->pass ? "PASS" : "FAIL", s->secs);
	if (o->expect == DRILL_EXPECT_CLEAN && s->app_ns && s->injected)
		printf(" app-error +%.0fms node%d, all ended +%.1fs",
		       (double)(s->app_ns - s->injected_ns) / 1e6, s->app_rank,
		       (double)(s->end_ns - s->injected_ns) / 1e9);
	else if (o->expect == DRILL_EXPECT_CLEAN)
		printf(" app-error none");
	if (s->ndetect || s->nmigrate)
		printf(" incidents %d", s->ndetect > s->nmigrate ? s->ndetect : s->nmigrate);
	if (s->suspected)
		printf(" suspected %llu", (unsigned long long)s->suspected);
	if (s->plan[0]) {
		int applied = 0;
		for (int k = 0; k < s->nsteps && k < DRILL_MAX_STEPS; k++)
			applied += s->step_applied[k] > 0;
		printf(" drill-steps %d/%d applied", applied, s->nsteps);
		if (o->drill_plan && s->step_why[0])
			printf(" (%s)", s->step_why);
	}
	if (s->maps_carried || s->maps_fetched)
		printf(" maps %llu/%llu", (unsigned long long)s->maps_carried,
		       (unsigned long long)(s->maps_carried + s->maps_fetched));
	if (s->maps_later)
		printf(" later-maps %llu", (unsigned long long)s->maps_later);
	if (s->cts_checked)
		printf(" cts-landed %llu/%llu", (unsigned long long)s->cts_landed,
		       (unsigned long long)s->cts_checked);
	if (o->churn)
		printf(" churned %llu freed %llu conns %llu msgs %llu errors %llu in-repair %llu "
		       "destroy-max %.1f ms",
		       (unsigned long long)s->churned, (unsigned long long)s->records_freed,
		       (unsigned long long)s->churn_conns, (unsigned long long)s->churn_msgs,
		       (unsigned long long)s->churn_errors, (unsigned long long)s->in_repair,
		       s->churn_destroy_max_ns / 1e6);
	if (o->restore_ms >= 0 && s->restored)
		printf(" failbacks %d (allowed %d)%s%s", s->backs_max, drill_backs_allowed(o),
		       s->shares[0] ? " shares-after " : "", s->shares);
	if (s->nback) {
		double mx = 0;
		for (int i = 0; i < s->nback; i++)
			mx = s->back_ms[i] > mx ? s->back_ms[i] : mx;
		printf(" failback-max %.1fms", mx);
	}
	if (!s->pass)
		printf(" -- %s", s->why);
	printf("\n");
	if (s->pass && o->expect == DRILL_EXPECT_CLEAN && o->verbose)
		printf("    first application error: %s\n", s->app_error);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	static struct drill_times times;
	struct drill_opts o;
	struct drill_paths p;
	struct sigaction sa;
	uint64_t delivered = 0, expected = 0, maps_later = 0, cts_checked = 0, cts_landed = 0;
	int kinds[DRILL_FAULT_KINDS], nkinds = 0, passed = 0, total = 0, fault_failed = 0;
	int not_interposed = 0;
	FILE *summary = NULL;

	if (drill_parse(argc, argv, &o))
		return 2;
	if (o.worker)
		return drill_worker_main(&o);
	setvbuf(stdout, NULL, _IOLBF, 0);
	/* RoCE: the fabric (read by its first process: a worker, or softverbs-ctl) and
	 * NCCL's settings for it, which the workers and the library inherit. */
	if (o.roce) {
		setenv("SOFTVERBS_LINK", "roce", 1);
		setenv("SOFTVERBS_ROUTED", "1", 1);
		setenv("SOFTVERBS_LOSSLESS_TC", DRILL_ROCE_TC, 1);
		setenv("NCCL_IB_GID_INDEX", "3", 0);
		setenv("NCCL_IB_TC", DRILL_ROCE_TC, 0);
	}
	if (drill_paths(&p, &o))
		return 2;
	if (o.summary && strcmp(o.summary, "-") && !(summary = fopen(o.summary, "a"))) {
		fprintf(stderr, "r2cc-verbs-drill: cannot open %s: %s\n", o.summary,
			strerror(errno));
		drill_rmtree(p.tmp);
		return 2;
	}
	if (o.summary && !summary)
		summary = stdout;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = drill_on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	if (o.fault >= 0)
		kinds[nkinds++] = o.fault;
	else
		for (int k = DRILL_FAULT_DOWN; k <= DRILL_FAULT_SLOW; k++)
			kinds[nkinds++] = k;

	printf("r2cc-verbs-drill: %d processes x %d NICs, %d messages per connection "
	       "(window %d, 0..%llu B%s), %s, QP timeout %.0f ms (time scale %g), deadline %g s\n",
	       o.procs, o.nics, o.messages, o.window, (unsigned long long)o.max_size,
	       o.flush	     ? (o.no_fusion ? ", GPU flush, no NIC fusion" : ", GPU flush")
	       : o.no_fusion ? ", no NIC fusion"
			     : "",
	       o.preload ? "LD_PRELOAD=libr2cc.so" : "no preload (baseline)",
	       drill_qp_timeout_ms(&o), o.time_scale, o.timeout_s);
	if (o.roce)
		printf("  RoCE v2: a subnet per rail, routed; GID index %s, traffic class %s, "
		       "lossless class %s\n",
		       getenv("NCCL_IB_GID_INDEX"), getenv("NCCL_IB_TC"), DRILL_ROCE_TC);
	if (o.pattern != drill_pattern_default())
		printf(
		    "  verbs of NCCL %s: %d request slots, %d-byte FIFO elements (idx at %d)%s%s\n",
		    o.pattern->releases, o.pattern->slots, o.pattern->elem, o.pattern->off_idx,
		    o.pattern->one_nic ? ", each connection on one NIC, clear-to-send on qps[0]"
				       : "",
		    o.pattern->send_no_rq ? ", no receive queue where nothing is received" : "");
	if (o.inject)
		printf("  fault from R2CC_DRILL (libr2cc.so's own drill, not softverbs-ctl): the "
		       "drawn fault @0 from each worker's ncclAllReduce at its own share of its "
		       "messages; detection from the earliest applied step (reports' "
		       "applied_unix)\n");
	else if (o.drill_plan)
		printf("  R2CC_DRILL=\"%s\": each worker's ncclAllReduce at its own share of its "
		       "messages\n",
		       o.drill_plan);
	else if (o.fault != DRILL_FAULT_NONE && o.fault != DRILL_FAULT_KILL)
		printf("  fault by softverbs-ctl; detection from its call\n");
	if (o.fault_phase == DRILL_AT_CONNECT || o.fault_all_nics || o.second_ms >= 0 ||
	    o.expect == DRILL_EXPECT_CLEAN) {
		printf("  fault %s%s",
		       o.fault_phase == DRILL_AT_CONNECT ? "while connecting" : "in traffic",
		       o.fault_all_nics ? ", on every NIC of the node" : "");
		if (o.second_ms >= 0)
			printf(", a second NIC of the node %g ms later", o.second_ms);
		if (o.expect == DRILL_EXPECT_CLEAN)
			printf("; expect a clean error within %g s", o.bound_s);
		printf("\n");
	}
	for (int k = 0; k < nkinds && !drill_stop; k++) {
		for (int i = 0; i < o.seeds && !drill_stop; i++) {
			struct drill_scenario s;

			memset(&s, 0, sizeof(s));
			s.kind = kinds[k];
			s.seed = o.first_seed + i;
			s.index = total;
			drill_run_scenario(&o, &p, &s, &times);
			drill_print_scenario(&o, &s);
			if (summary)
				drill_summary(summary, &o, &s);
			if (o.verbose)
				drill_dump_logs(&o, &s, NULL, 0);
			else if (!s.pass) { /* what R2CC said, for a failure seen only in CI */
				drill_dump_logs(&o, &s, "R2CC WARN", 12);
				drill_dump_logs(&o, &s, "Sanitizer", 12);
				drill_dump_logs(&o, &s, "runtime error", 4);
			}
			total++;
			passed += s.pass;
			delivered += s.delivered;
			expected += s.expected;
			not_interposed += s.not_interposed;
			maps_later += s.maps_later;
			cts_checked += s.cts_checked;
			cts_landed += s.cts_landed;
			if (!s.pass && s.kind != DRILL_FAULT_NONE && s.kind != DRILL_FAULT_SLOW &&
			    o.expect == DRILL_EXPECT_PASS)
				fault_failed++;
			if (!o.keep)
				drill_rmtree(s.dir);
		}
	}
	if (summary && summary != stdout)
		fclose(summary);
	if (o.keep)
		printf("kept: %s\n", p.tmp);
	else
		drill_rmtree(p.tmp);
	if (drill_stop)
		printf("interrupted by signal %d\n", (int)drill_stop);
	if (o.preload && not_interposed)
		printf(
		    "warning: libr2cc.so was preloaded but the verbs data path was not R2CC's in "
		    "%d worker run(s): R2CC inactive (R2CC_MODE=0 or a bad setting?)\n",
		    not_interposed);
	if (fault_failed && !times.ndetect)
		printf(
		    "note: %d NIC-fault scenario(s) failed and no R2CC incident report was found: "
		    "without hot repair a dead NIC reaches the application (error completions "
		    "or a stall), as with plain NCCL\n",
		    fault_failed);
	/* --fresh-mr shows nothing unless some scenario's new keys were fetched after a
	 * move (a fault that came late moves the QPs after the new registration, whose
	 * keys the exchange then carries). */
	bool vacuous = o.fresh_mr && o.preload && !maps_later && o.fault != DRILL_FAULT_NONE;
	if (vacuous) {
		printf("--fresh-mr: no scenario fetched a peer's rkey map after a move; nothing "
		       "was shown\n");
		passed = 0;
	}
	if (o.expect_landed && !cts_landed) {
		printf("--expect-landed: no repair found a clear-to-send write landed (%llu "
		       "asked about)\n",
		       (unsigned long long)cts_checked);
		passed = 0;
	}
	printf("%s messages %llu/%llu scenarios %d/%d",
	       passed == total && total > 0 && !drill_stop ? "PASS" : "FAIL",
	       (unsigned long long)delivered, (unsigned long long)expected, passed, total);
	drill_print_times("detection", times.detect, times.ndetect);
	if (times.nfirst)
		drill_print_times("first-incident", times.first, times.nfirst);
	drill_print_times("migration", times.migrate, times.nmigrate);
	if (o.restore_ms >= 0)
		drill_print_times("failback", times.back, times.nback);
	if (o.expect == DRILL_EXPECT_CLEAN)
		drill_print_times("app-error", times.app, times.napp);
	if (cts_checked)
		printf(" cts-landed %llu/%llu", (unsigned long long)cts_landed,
		       (unsigned long long)cts_checked);
	printf("\n");
	return passed == total && total > 0 && !drill_stop ? 0 : 1;
}
