/*
 * One scenario of r2cc-verbs-drill (main.c has the overview): its fabric and
 * workers, the fault, the deadline, and the verdict with the reason for a failure.
 */
#include "tools/drill/parent.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- one scenario ---- */

static void drill_describe_exit(char *buf, size_t len, int rank, int status)
{
	if (WIFEXITED(status))
		snprintf(buf, len, "node%d exited with status %d", rank, WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(buf, len, "node%d died of signal %d (%s)", rank, WTERMSIG(status),
			 strsignal(WTERMSIG(status)));
}

/* The workers' and the fault tool's logs, indented: every line, or (`match`) only those
 * that contain it, at most `max` of them (0: no limit). */
void drill_dump_logs(const struct drill_opts *o, const struct drill_scenario *s, const char *match,
		     int max)
{
	int shown = 0;

	for (int r = 0; r <= o->procs; r++) {
		char path[PATH_MAX + 32], line[512], label[16];
		FILE *f;

		if (r < o->procs) {
			snprintf(path, sizeof(path), "%s/worker%d.log", s->dir, r);
			snprintf(label, sizeof(label), "node%d", r);
		} else {
			snprintf(path, sizeof(path), "%s/ctl.log", s->dir);
			snprintf(label, sizeof(label), "ctl");
		}
		f = fopen(path, "r");
		if (!f)
			continue;
		while (fgets(line, sizeof(line), f)) {
			if (match && !strstr(line, match))
				continue;
			if (max && shown++ >= max)
				break;
			printf("    [%s] %s%s", label, line, strchr(line, '\n') ? "" : "\n");
		}
		fclose(f);
	}
}

/* Where each worker was when the deadline struck: phase and messages received. */
static void drill_snapshot(const struct drill_opts *o, struct drill_scenario *s,
			   struct drill_status *st)
{
	static const char *const phases[] = {"start", "connect", "run",	  "wait",
					     "drain", "done",	 "failed"};

	s->stall[0] = '\0';
	for (int r = 0; r < o->procs; r++) {
		int ph = atomic_load(&st[r].phase);

		drill_fmt(s->stall + strlen(s->stall), sizeof(s->stall) - strlen(s->stall),
			  "%snode%d %s %llu", r ? ", " : "", r,
			  ph >= 0 && ph <= DRILL_PHASE_FAILED ? phases[ph] : "?",
			  (unsigned long long)atomic_load(&st[r].delivered));
	}
}

/* Why a scenario failed, the most telling reason first. */
static void drill_explain(const struct drill_opts *o, struct drill_scenario *s,
			  struct drill_status *st, int failed_exit, int exit_status,
			  const char *missed)
{
	char first[DRILL_ERR_LEN] = "";
	int64_t first_ns = INT64_MAX;

	/* The earliest failure is the cause; later ones are mostly its consequences. */
	for (int r = 0; r < o->procs; r++) {
		int64_t t = atomic_load(&st[r].err_ns);

		if (atomic_load(&st[r].err_claimed) && t && t < first_ns) {
			first_ns = t;
			snprintf(first, sizeof(first), "%.*s", DRILL_ERR_LEN - 1, st[r].error);
		}
	}
	if (s->timed_out) {
		drill_fmt(s->why, sizeof(s->why),
			  "stalled: timed out after %g s at %llu/%llu messages (%s)%s%s",
			  o->timeout_s, (unsigned long long)s->delivered,
			  (unsigned long long)s->expected, s->stall, first[0] ? "; " : "", first);
	} else if (first[0] && s->injected && first_ns > s->injected_ns) {
		drill_fmt(s->why, sizeof(s->why), "%s [%.0f ms after the fault]", first,
			  (double)(first_ns - s->injected_ns) / 1e6);
	} else if (first[0]) {
		snprintf(s->why, sizeof(s->why), "%s", first);
	} else if (drill_stop) {
		snprintf(s->why, sizeof(s->why), "interrupted (signal %d): workers killed",
			 (int)drill_stop);
	} else if (failed_exit >= 0) {
		drill_describe_exit(s->why, sizeof(s->why), failed_exit, exit_status);
	} else if (missed) {
		snprintf(s->why, sizeof(s->why), "%s", missed);
	} else {
		snprintf(s->why, sizeof(s->why), "%llu/%llu messages delivered",
			 (unsigned long long)s->delivered, (unsigned long long)s->expected);
	}
	/* A crash is never only a consequence: say so even after an earlier cause. */
	if (failed_exit >= 0 && WIFSIGNALED(exit_status) && !strstr(s->why, "died of signal")) {
		char d[96];
		size_t n = strlen(s->why);
		drill_describe_exit(d, sizeof(d), failed_exit, exit_status);
		drill_fmt(s->why + n, sizeof(s->why) - n, "; %s", d);
	}
}

/*
 * --expect clean-error: the fault cannot be repaired (no NIC left on the node, or a peer
 * process died), so the scenario passes only if an error reached the application (an
 * error completion, a fatal async event, a failed verbs call) within --bound of the
 * fault, every surviving worker ended on its own (failed, or done with its own traffic)
 * before the deadline and exited normally, and nothing delivered was corrupt, duplicated
 * or late. Returns true on a pass; else s->why says why.
 */
static bool drill_judge_clean(const struct drill_opts *o, struct drill_scenario *s,
			      struct drill_status *st, const int *status, const char *missed)
{
	char check[DRILL_ERR_LEN] = "";
	int64_t check_ns = INT64_MAX;
	uint64_t checks = 0;
	int bad_exit = -1;
	double ms;

	for (int r = 0; r < o->procs; r++) {
		int64_t t = atomic_load(&st[r].check_ns);

		checks += atomic_load(&st[r].check_failures);
		if (atomic_load(&st[r].check_claimed) && t && t < check_ns) {
			check_ns = t;
			snprintf(check, sizeof(check), "%.*s", DRILL_ERR_LEN - 1,
				 st[r].check_error);
		}
		if (r == s->killed)
			continue;
		if (bad_exit < 0 && !(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) <= 1))
			bad_exit = r;
	}
	ms = s->app_ns ? (double)(s->app_ns - s->injected_ns) / 1e6 : 0;
	if (s->why[0])
		return false;
	if (drill_stop) {
		snprintf(s->why, sizeof(s->why), "interrupted (signal %d): workers killed",
			 (int)drill_stop);
	} else if (missed) {
		snprintf(s->why, sizeof(s->why), "%s", missed);
	} else if (s->timed_out) {
		drill_fmt(s->why, sizeof(s->why), "stalled: timed out after %g s (%s)%s%s",
			  o->timeout_s, s->stall, s->app_ns ? "; first application error: " : "",
			  s->app_ns ? s->app_error : "");
	} else if (checks) {
		drill_fmt(s->why, sizeof(s->why),
			  "%llu check failure(s) (corrupt, duplicate or late): %s",
			  (unsigned long long)checks, check);
	} else if (bad_exit >= 0) {
		drill_describe_exit(s->why, sizeof(s->why), bad_exit, status[bad_exit]);
	} else if (!s->app_ns) {
		snprintf(s->why, sizeof(s->why),
			 "no error reached the application (%llu/%llu messages delivered)",
			 (unsigned long long)s->delivered, (unsigned long long)s->expected);
	} else if (ms < 0) {
		drill_fmt(s->why, sizeof(s->why),
			  "an application error came %.0f ms before the fault: %s", -ms,
			  s->app_error);
	} else if (ms > o->bound_s * 1e3) {
		drill_fmt(s->why, sizeof(s->why),
			  "the first application error came %.0f ms after the fault, over the "
			  "bound of %g s: %s",
			  ms, o->bound_s, s->app_error);
	} else {
		return true;
	}
	return false;
}

/* --expect clean-error: a worker that finished its own traffic waits for the others'
 * done marks; once a worker failed (or was killed) and all that still run only wait,
 * nothing more can come. */
static bool drill_only_waiting(const struct drill_opts *o, const pid_t *pids,
			       struct drill_status *st)
{
	for (int r = 0; r < o->procs; r++)
		if (pids[r] > 0 && atomic_load(&st[r].phase) != DRILL_PHASE_WAIT)
			return false;
	return true;
}

void drill_run_scenario(const struct drill_opts *o, const struct drill_paths *p,
			struct drill_scenario *s, struct drill_times *t)
{
	size_t st_len = sizeof(struct drill_status) * (size_t)o->procs;
	pid_t pids[DRILL_MAX_PROCS] = {0};
	int status[DRILL_MAX_PROCS] = {0}, alive = 0, fd, failed_exit = -1;
	bool termed[DRILL_MAX_PROCS] = {false};
	bool clean = o->expect == DRILL_EXPECT_CLEAN;
	int64_t start = drill_now_ns(), deadline, kill_at = INT64_MAX, next_look = 0;
	struct drill_status *st;
	const char *missed;
	char *reset[] = {(char *)"reset", NULL};

	s->expected = (uint64_t)o->procs * (uint64_t)(o->procs - 1) * (uint64_t)o->messages;
	s->start_ns = start;
	s->killed = -1;
	s->app_rank = -1;
	deadline = start + (int64_t)(o->timeout_s * 1e9);
	snprintf(s->fabric, sizeof(s->fabric), "r2cc-drill-%d-%d", (int)getpid(), s->index);
	drill_plan(o, s);
	if (drill_fmt(s->dir, sizeof(s->dir), "%s/s%d-%s-%d", p->tmp, s->index,
		      drill_fault_names[s->kind], s->seed) ||
	    mkdir(s->dir, 0700) != 0) {
		drill_fmt(s->why, sizeof(s->why), "cannot make %s: %s", s->dir, strerror(errno));
		return;
	}
	if (drill_fmt(s->why, sizeof(s->why), "%s/status", s->dir))
		return;
	fd = open(s->why, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || ftruncate(fd, (off_t)st_len) != 0) {
		snprintf(s->why, sizeof(s->why), "cannot make the status file: %s",
			 strerror(errno));
		if (fd >= 0)
			close(fd);
		return;
	}
	st = mmap(NULL, st_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	s->why[0] = '\0';
	if (st == MAP_FAILED) {
		snprintf(s->why, sizeof(s->why), "cannot map the status file");
		return;
	}
	/* A window's worth of messages past the trigger, and always before the end. */
	if (s->kind != DRILL_FAULT_NONE && o->fault_phase == DRILL_AT_TRAFFIC && s->expected > 1 &&
	    !o->inject) {
		uint64_t at = s->trigger + (uint64_t)o->window * (uint64_t)o->procs;
		atomic_store(&st[0].hold_at, at < s->expected ? at : s->expected - 1);
		/* --restore: the trickle from half the messages (and after the fault) */
		if (o->restore_ms >= 0)
			atomic_store(&st[0].back_at,
				     s->expected / 2 > at ? s->expected / 2 : at + 1);
	}
	for (int r = 0; r < o->procs; r++) {
		pids[r] = drill_spawn_worker(o, p, s, r);
		if (pids[r] <= 0) {
			snprintf(s->why, sizeof(s->why), "cannot start worker %d", r);
			kill_at = drill_now_ns();
			break;
		}
		alive++;
	}

	while (alive > 0) {
		struct timespec ts = {0, 1000000};
		uint64_t delivered = 0;
		int64_t now;

		for (int r = 0; r < o->procs; r++) {
			if (pids[r] <= 0 || waitpid(pids[r], &status[r], WNOHANG) != pids[r])
				continue;
			pids[r] = -pids[r];
			alive--;
			if (r == s->killed)
				continue; /* its death is the fault */
			s->end_ns = drill_now_ns();
			if (!(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0)) {
				if (failed_exit < 0)
					failed_exit = r;
				/* Expecting an error, every survivor must end on its own. */
				if (!clean && kill_at == INT64_MAX)
					kill_at = drill_now_ns() + DRILL_GRACE_NS;
			}
		}
		for (int r = 0; r < o->procs; r++)
			delivered += atomic_load(&st[r].delivered);
		if (s->kind != DRILL_FAULT_NONE && !o->inject && !s->injected &&
		    alive == o->procs && drill_fault_due(o, s, delivered)) {
			drill_inject(o, p, s, pids, delivered);
			atomic_store(&st[0].fault_done, 1);
		}
		if (s->plan[0])
			drill_watch_collectives(o, s, st);
		now = drill_now_ns();
		if (o->second_ms >= 0 && !o->inject && s->injected && !s->second_injected &&
		    alive > 0 && now >= s->injected_ns + (int64_t)(o->second_ms * 1e6))
			drill_inject_second(p, s, delivered);
		if (o->restore_ms >= 0 && alive > 0 && (now >= next_look || !s->restored)) {
			drill_restore_step(o, p, s, st, pids, now);
			next_look = now + 10000000LL;
		}
		if (now > deadline && alive > 0 && !s->timed_out) {
			char *list[] = {(char *)"list", NULL};

			s->timed_out = true;
			drill_snapshot(o, s, st);
			/* The device's view of the stall (every QP's state and receive
			 * queue), kept in ctl.log with --keep. */
			drill_ctl(p, s, list);
			if (kill_at > now)
				kill_at = now;
		}
		if (clean && kill_at == INT64_MAX && alive > 0 &&
		    (failed_exit >= 0 || s->killed >= 0) && drill_only_waiting(o, pids, st))
			kill_at = now;
		if (drill_stop && kill_at == INT64_MAX)
			kill_at = drill_now_ns();
		/* SIGTERM first: a worker then exits normally and R2CC writes its report. */
		if (now >= kill_at) {
			int sig = now >= kill_at + DRILL_TERM_NS ? SIGKILL : SIGTERM;

			for (int r = 0; r < o->procs; r++)
				if (pids[r] > 0 && (sig == SIGKILL || !termed[r])) {
					kill(pids[r], sig);
					termed[r] = true;
				}
		}
		if (alive > 0)
			nanosleep(&ts, NULL);
	}
	s->secs = (double)(drill_now_ns() - start) / 1e9;

	for (int r = 0; r < o->procs; r++) {
		int64_t e = atomic_load(&st[r].app_err_ns);

		s->delivered += atomic_load(&st[r].delivered);
		s->errors += atomic_load(&st[r].errors);
		s->checks += atomic_load(&st[r].check_failures);
		s->not_interposed += atomic_load(&st[r].interposed) == 2;
		s->churned += atomic_load(&st[r].churned);
		s->churn_conns += atomic_load(&st[r].churn_conns);
		s->churn_msgs += atomic_load(&st[r].churn_msgs);
		s->churn_errors += atomic_load(&st[r].churn_errors);
		if (atomic_load(&st[r].churn_destroy_max_ns) > s->churn_destroy_max_ns)
			s->churn_destroy_max_ns = atomic_load(&st[r].churn_destroy_max_ns);
		/* The first error the application saw, on a worker that lived on. */
		if (r != s->killed && atomic_load(&st[r].app_claimed) && e &&
		    (!s->app_ns || e < s->app_ns)) {
			s->app_ns = e;
			s->app_rank = r;
			snprintf(s->app_error, sizeof(s->app_error), "%.*s", DRILL_ERR_LEN - 1,
				 st[r].app_error);
		}
	}
	if (o->roce && !s->why[0])
		drill_check_lossless(p, s);
	if (o->restore_ms >= 0)
		drill_restore_check(o, p, s);
	if (drill_ctl(p, s, reset) != 0 && !s->why[0])
		snprintf(s->why, sizeof(s->why), "softverbs-ctl reset of %s failed", s->fabric);
	int det0 = t->ndetect;
	drill_read_reports(o, s, t);
	if (o->inject)
		drill_inject_times(s, t);
	s->det_first = s->det_last = -1;
	for (int i = det0; i < t->ndetect; i++) {
		if (s->det_first < 0 || t->detect[i] < s->det_first)
			s->det_first = t->detect[i];
		if (t->detect[i] > s->det_last)
			s->det_last = t->detect[i];
	}
	if (s->det_first >= 0 && t->nfirst < DRILL_MAX_INCIDENT)
		t->first[t->nfirst++] = s->det_first;
	/* --fresh-mr: no post waited for the stopped peer (that the new keys were
	 * fetched at all is judged over the run: main) */
	for (int r = 0; o->fresh_mr && r < o->procs; r++) {
		int64_t ns = atomic_load(&st[r].max_post_ns);
		if (ns > 250000000 && !s->why[0])
			snprintf(
			    s->why, sizeof(s->why),
			    "node%d: a data ibv_post_send took %.0f ms (--fresh-mr: 250 at most)",
			    r, ns / 1e6);
	}

	/* --detect-within: every incident of the fault found in time */
	for (int i = det0; o->detect_within_ms > 0 && i < t->ndetect; i++)
		if (t->detect[i] > o->detect_within_ms && !s->why[0])
			snprintf(s->why, sizeof(s->why),
				 "a detection came %.0f ms after the fault "
				 "(--detect-within %g)",
				 t->detect[i], o->detect_within_ms);

	/* A fault run tests nothing unless the fault hit while messages were moving. */
	missed = drill_fault_missed(o, s);
	if (clean) {
		s->pass = drill_judge_clean(o, s, st, status, missed);
		if (s->app_ns && s->injected && t->napp < DRILL_MAX_INCIDENT)
			t->app[t->napp++] = (double)(s->app_ns - s->injected_ns) / 1e6;
	} else {
		s->pass = !s->why[0] && !s->timed_out && failed_exit < 0 && s->errors == 0 &&
			  s->delivered == s->expected && !drill_stop && !missed;
		if (!s->pass && !s->why[0])
			drill_explain(o, s, st, failed_exit,
				      failed_exit >= 0 ? status[failed_exit] : 0, missed);
		/* --expect-unprotected: every worker's report says so, naming the word */
		if (s->pass && o->expect_unprotected && s->unprotected < o->procs) {
			s->pass = false;
			snprintf(s->why, sizeof(s->why),
				 "%d of %d R2CC reports say 'not protected' for '%s'",
				 s->unprotected, o->procs, o->expect_unprotected);
		}
		/* Nothing failed, so nothing may have been repaired: a migration here is a
		 * false repair, whatever the data say. */
		if (s->pass && o->expect == DRILL_EXPECT_NO_REPAIR && o->preload &&
		    s->reports < o->procs) {
			s->pass = false;
			snprintf(s->why, sizeof(s->why),
				 "only %d of %d R2CC reports found: no-repair cannot be judged",
				 s->reports, o->procs);
		}
		/* Every REQ and REP carries its sender's rkey map for the NICs its
		 * queue pairs move between: a fetch instead is a message without it.
		 * Except under R2CC's fault injection (tests/fault/walk.sh): a map that
		 * could not be encoded for want of memory is fetched, and the job's data
		 * are still right, which is what the walk asks. */
		if (s->pass && s->maps_fetched && !getenv("R2CC_FAULT_INJECT")) {
			s->pass = false;
			snprintf(s->why, sizeof(s->why),
				 "%llu queue pair(s) migrated with a peer's rkey map that its "
				 "exchange message did not carry",
				 (unsigned long long)s->maps_fetched);
		}
		/* Re-posts go out on NCCL's own thread (a clear-to-send re-posted on the
		 * repair thread could read a FIFO element NCCL is rewriting), and every
		 * report of a repair says where they went. */
		if (s->pass && o->preload && s->repairs && !getenv("R2CC_FAULT_INJECT") &&
		    (s->reposts_repair || s->reposts_said < s->reports)) {
			s->pass = false;
			snprintf(s->why, sizeof(s->why),
				 "%llu send(s) re-posted on R2CC's repair thread, %llu on the "
				 "application's (%d of %d reports say)",
				 (unsigned long long)s->reposts_repair,
				 (unsigned long long)s->reposts_nccl, s->reposts_said, s->reports);
		}
		/* --churn: the records of the QPs destroyed meanwhile were freed */
		if (s->pass && o->churn && o->preload && (!s->churned || !s->records_freed)) {
			s->pass = false;
			snprintf(
			    s->why, sizeof(s->why),
			    "--churn: %llu QPs created and destroyed, %llu of R2CC's records of "
			    "destroyed QPs freed",
			    (unsigned long long)s->churned, (unsigned long long)s->records_freed);
		}
		/* --churn: connections were made and carried messages */
		if (s->pass && o->churn && o->procs > o->per_node &&
		    (!s->churn_conns || !s->churn_msgs)) {
			s->pass = false;
			snprintf(s->why, sizeof(s->why),
				 "--churn: %llu connections made, %llu messages checked on them",
				 (unsigned long long)s->churn_conns,
				 (unsigned long long)s->churn_msgs);
		}
		if (s->pass && o->restore_ms >= 0 && s->backs_max > drill_backs_allowed(o)) {
			s->pass = false;
			snprintf(s->why, sizeof(s->why),
				 "a process brought mlx5_%d back %d times; its hold-down allows %d",
				 s->nic, s->backs_max, drill_backs_allowed(o));
		}
		/* --expect-drill-problem: a worker's report says why a step was not applied
		 * (a node not in the job and a time after the end are in every report; a
		 * NIC a node lacks, in that node's: the others only see no peer using it) */
		if (s->pass && o->expect_drill_problem && s->problem < 1) {
			s->pass = false;
			snprintf(s->why, sizeof(s->why),
				 "%d of %d R2CC reports (%d with the drill) say a step was not "
				 "applied for '%s'%s%s",
				 s->problem, o->procs, s->drill_reports, o->expect_drill_problem,
				 s->step_why[0] ? "; the first unapplied: " : "", s->step_why);
		}
		if (s->pass && o->expect == DRILL_EXPECT_NO_REPAIR && s->repairs) {
			s->pass = false;
			snprintf(s->why, sizeof(s->why),
				 "false repair: %d incident(s) in R2CC's reports with no failure",
				 s->repairs);
		}
	}
	munmap(st, st_len);
}
