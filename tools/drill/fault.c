/*
 * r2cc-verbs-drill's fault (main.c has the overview): where, what and when, drawn
 * from the seed; its injection through softverbs-ctl or R2CC_DRILL, a second fault,
 * whether it came in time; --restore and the failback it checks.
 */
#include "tools/drill/parent.h"
#include "shim/stats.h"

#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- --restore ---- */

/* Process pid's failbacks of mlx5_<nic> and whether the NIC is up, from its live
 * statistics page (shim/stats.h); -1 when the page is not there or has another
 * layout. */
static int drill_failbacks_live(pid_t pid, int nic, bool *up)
{
	char path[64], name[32];
	struct stat sb;
	int fd, n = -1;
	struct r2cc_stats_page *pg;

	*up = false;
	snprintf(path, sizeof(path), "/dev/shm/" R2CC_STATS_PREFIX "%d", (int)pid);
	snprintf(name, sizeof(name), "mlx5_%d", nic);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	if (fstat(fd, &sb) != 0 || sb.st_size < (off_t)sizeof(*pg)) {
		close(fd);
		return -1;
	}
	pg = mmap(NULL, sizeof(*pg), PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (pg == MAP_FAILED)
		return -1;
	if (__atomic_load_n(&pg->magic, __ATOMIC_ACQUIRE) == R2CC_STATS_MAGIC &&
	    pg->version == R2CC_STATS_VERSION && pg->nic_size == sizeof(struct r2cc_nic))
		for (int i = 0; i < pg->nnics && i < R2CC_MAX_NICS; i++)
			if (!strcmp(pg->nics[i].name, name)) {
				n = __atomic_load_n(&pg->nics[i].failbacks, __ATOMIC_RELAXED);
				*up = __atomic_load_n(&pg->nics[i].state, __ATOMIC_RELAXED) ==
				      R2CC_NIC_UP;
			}
	munmap(pg, sizeof(*pg));
	return n;
}

/* The faulted node's wire bytes (sent and received) on each NIC, from softverbs-ctl
 * list; 0 when every NIC was found. */
static int drill_node_bytes(const struct drill_opts *o, const struct drill_paths *p,
			    const struct drill_scenario *s, uint64_t *out)
{
	char line[512], node[40];
	FILE *f = drill_ctl_list(p, s);
	int found = 0;

	if (!f)
		return -1;
	snprintf(node, sizeof(node), " node=node%d ", s->node);
	while (fgets(line, sizeof(line), f)) {
		const char *nm = strstr(line, " name=mlx5_"), *tx = strstr(line, " tx_bytes=");
		const char *rx = strstr(line, " rx_bytes=");
		unsigned long long a, b;
		int k;

		if (strncmp(line, "nic", 3) || !strstr(line, node) || !nm || !tx || !rx ||
		    sscanf(nm, " name=mlx5_%d", &k) != 1 || k < 0 || k >= o->nics ||
		    sscanf(tx, " tx_bytes=%llu", &a) != 1 || sscanf(rx, " rx_bytes=%llu", &b) != 1)
			continue;
		out[k] = a + b;
		found |= 1 << k;
	}
	fclose(f);
	return found == (1 << o->nics) - 1 ? 0 : -1;
}

/* The most failbacks a process may make in the faulted run: the hold-down starts at
 * R2CC_FAILBACK_MS and at most doubles per failback, so n failbacks span at least
 * FAILBACK x (2^n - 2) ms; one more after the flapping ends. */
int drill_backs_allowed(const struct drill_opts *o)
{
	return (int)floor(log2(o->restore_ms / o->failback_ms + 2.0)) + 1;
}

/* One step of --restore, from the parent's loop: the NIC back at its time, then
 * the failback watched in the faulted node's statistics pages; the workers'
 * trickle ends once every one of them has had the NIC up again, after a
 * failback, for 100 ms. */
void drill_restore_step(const struct drill_opts *o, const struct drill_paths *p,
			struct drill_scenario *s, struct drill_status *st, const pid_t *pids,
			int64_t now)
{
	int64_t limit;
	bool all = true;

	if (!s->injected || s->inject_failed || s->released)
		return;
	for (int r = s->node * o->per_node; r < (s->node + 1) * o->per_node; r++) {
		bool up;

		if (pids[r] > 0 && drill_failbacks_live(pids[r], s->nic, &up) >= 0) {
			s->page_seen = true;
			s->seen_down = s->seen_down || !up;
		}
	}
	if (!s->restored) {
		char node[32], nic[32];
		char *args[] = {(char *)"fault", node, nic, (char *)"up", NULL};

		if (now < s->injected_ns + (int64_t)(o->restore_ms * 1e6))
			return;
		snprintf(node, sizeof(node), "node%d", s->node);
		snprintf(nic, sizeof(nic), "mlx5_%d", s->nic);
		s->restored = true;
		s->restored_ns = now;
		if (drill_ctl(p, s, args)) {
			snprintf(s->why, sizeof(s->why), "the NIC could not be restored");
			s->released = true;
			atomic_store(&st[0].back_done, 1);
		}
		return;
	}
	for (int r = s->node * o->per_node; r < (s->node + 1) * o->per_node; r++) {
		bool up;

		all = all && pids[r] > 0 && drill_failbacks_live(pids[r], s->nic, &up) >= 1 && up;
	}
	if (!all)
		s->back_ns = 0;
	else if (!s->back_ns)
		s->back_ns = now;
	limit = s->restored_ns + (int64_t)((2.0 * o->restore_ms + 4.0 * o->failback_ms) * 1e6) +
		3000000000LL;
	if (s->back_ns && now - s->back_ns >= 100000000LL) {
		if (drill_node_bytes(o, p, s, s->bytes_back) && !s->why[0])
			snprintf(s->why, sizeof(s->why), "softverbs-ctl list of the node failed");
		s->released = true;
		atomic_store(&st[0].back_done, 1);
	} else if (now > limit) {
		if (!s->why[0])
			snprintf(s->why, sizeof(s->why),
				 "mlx5_%d was not back in every process of node%d %.1f s after "
				 "its restore%s",
				 s->nic, s->node, (double)(now - s->restored_ns) / 1e9,
				 !s->page_seen	? " (no R2CC statistics page of this layout was "
						  "readable: R2CC_STATS=0, or another R2CC version)"
				 : s->seen_down ? ""
						: " (R2CC never had it down: restored before its "
						  "failure was found?)");
		s->released = true;
		s->back_ns = 0;
		atomic_store(&st[0].back_done, 1);
	}
}

/* After the run: the NIC's failbacks within what the hold-down allows, and each NIC's
 * share of the node's wire bytes since the failback a third (1/K) again. */
void drill_restore_check(const struct drill_opts *o, const struct drill_paths *p,
			 struct drill_scenario *s)
{
	uint64_t end[DRILL_MAX_NICS] = {0}, sum = 0;
	char *shares = s->shares;
	bool even = true;

	if (s->why[0] || !s->released || !s->back_ns)
		return;
	if (drill_node_bytes(o, p, s, end)) {
		snprintf(s->why, sizeof(s->why), "softverbs-ctl list of the node failed");
		return;
	}
	for (int k = 0; k < o->nics; k++)
		sum += end[k] - s->bytes_back[k];
	/* --second-fault: that NIC stays down, and the others share its load */
	int up = o->second_ms >= 0 ? o->nics - 1 : o->nics;
	for (int k = 0; k < o->nics && sum; k++) {
		double share = (double)(end[k] - s->bytes_back[k]) / (double)sum;
		bool down = o->second_ms >= 0 && k == s->nic2;

		snprintf(shares + strlen(shares), sizeof(s->shares) - strlen(shares), "%s%.3f",
			 k ? "/" : "", share);
		even = even && fabs(share - (down ? 0.0 : 1.0 / up)) <= 0.08;
	}
	if (!sum || !even)
		snprintf(
		    s->why, sizeof(s->why),
		    "after the failback the node's NICs carried %s of its %llu wire bytes, not "
		    "1/%d each%s",
		    sum ? shares : "none", (unsigned long long)sum, up,
		    up < o->nics ? " (none on the NIC still down)" : "");
}

/* The NICs of a node that carry connections: all of them with NIC fusion; without
 * it those its processes' connections took (a fault elsewhere would test nothing). */
static uint64_t drill_node_nics(const struct drill_opts *o, int node)
{
	uint64_t all = (1ull << o->nics) - 1, m = 0;
	if (!o->pattern->one_nic && !o->no_fusion)
		return all;
	for (int p = node * o->per_node; p < (node + 1) * o->per_node; p++)
		for (int q = 0; q < o->procs; q++)
			if (q != p)
				m |= 1ull << drill_pair_nic(o, p, q) |
				     1ull << drill_pair_nic(o, q, p);
	return m ? m : all;
}

/* The k-th (mod their count) NIC of mask m. */
static int drill_nth_nic(uint64_t m, uint64_t k)
{
	k %= (uint64_t)__builtin_popcountll(m);
	for (int i = 0;; i++)
		if (m >> i & 1 && !k--)
			return i;
}

/*
 * --inject: R2CC_DRILL for the drawn fault, @0 from each process's first collective:
 * node<n>/mlx5_<k>=KIND@0, with --fault-nics all one step per NIC of the node (the
 * drawn one first), with --second-fault MS a second step on the other NIC @<MS>ms.
 * --drill-plan: that plan as given.
 */
static void drill_plan_text(const struct drill_opts *o, struct drill_scenario *s)
{
	char kind[32];
	size_t n;

	if (o->drill_plan) {
		snprintf(s->plan, sizeof(s->plan), "%s", o->drill_plan);
	} else {
		if (s->kind == DRILL_FAULT_FLAP)
			snprintf(kind, sizeof(kind), "flap:%d", s->arg);
		else
			snprintf(kind, sizeof(kind), "%s", drill_fault_names[s->kind]);
		for (int i = 0; i < (o->fault_all_nics ? o->nics : 1); i++) {
			n = strlen(s->plan);
			snprintf(s->plan + n, sizeof(s->plan) - n, "%snode%d/mlx5_%d=%s@0",
				 i ? ";" : "", s->node, (s->nic + i) % o->nics, kind);
		}
		n = strlen(s->plan);
		if (o->second_ms >= 0)
			snprintf(s->plan + n, sizeof(s->plan) - n, ";node%d/mlx5_%d=%s@%.0fms",
				 s->node, s->nic2, kind, o->second_ms);
	}
	s->nsteps = 1;
	for (const char *c = s->plan; *c; c++)
		s->nsteps += *c == ';';
}

/* Where, what and when, all from the seed. */
void drill_plan(const struct drill_opts *o, struct drill_scenario *s)
{
	uint64_t h = drill_hash((uint64_t)s->seed, (uint64_t)s->kind, 0x4641554c54ull, 0);
	uint64_t expected = (uint64_t)o->procs * (uint64_t)(o->procs - 1) * (uint64_t)o->messages;
	double frac = 0.15 + (double)(drill_mix(h) % 1000) / 1000.0 * 0.5;

	s->node = (int)(h % (uint64_t)(o->procs / o->per_node));
	uint64_t used = drill_node_nics(o, s->node);
	s->nic = drill_nth_nic(used, h >> 20);
	/* the second fault: another NIC that carries connections if there is one */
	uint64_t rest = used & ~(1ull << s->nic);
	if (!rest)
		rest = ((1ull << o->nics) - 1) & ~(1ull << s->nic);
	s->nic2 = rest ? drill_nth_nic(rest, h >> 32) : s->nic;
	s->hold = DRILL_HOLD_NONE;
	if (o->fault_phase == DRILL_AT_CONNECT && s->kind != DRILL_FAULT_NONE &&
	    s->kind != DRILL_FAULT_KILL)
		s->hold = (h >> 44) & 1 ? DRILL_HOLD_RTS : DRILL_HOLD_INIT;
	s->trigger = (uint64_t)(frac * (double)expected);
	if (s->trigger < 1)
		s->trigger = 1;
	if (o->restore_ms >= 0) {
		/* early, so that most of the traffic comes after the restore */
		s->trigger = (uint64_t)((0.10 + (double)(drill_mix(h) % 1000) / 1000.0 * 0.15) *
					(double)expected);
		if (s->trigger < 1)
			s->trigger = 1;
	}
	if (s->kind == DRILL_FAULT_FLAP && o->flap_ms) {
		s->arg = o->flap_ms;
	} else if (s->kind == DRILL_FAULT_FLAP) {
		/* Down phases outlast the QP transport timeout, as a flap that hurts does. */
		s->arg = (int)ceil(1.5 * drill_qp_timeout_ms(o));
		if (s->arg < 50)
			s->arg = 50;
	} else if (s->kind == DRILL_FAULT_SLOW) {
		s->arg = DRILL_SLOW_GBPS;
	} else if (s->kind == DRILL_FAULT_JITTER) {
		/* Delays of every request by up to R2CC's stall floor (20 ms by
		 * default): the longest pause of a healthy port that R2CC promises to
		 * tolerate beyond its queue, so it must raise no alarm. It follows
		 * R2CC_STALL_MS, not --time-scale: R2CC's floor is a time of its own,
		 * which no transport timeout scales. */
		s->arg = (int)ceil(drill_stall_floor_ms());
	}
	/* --inject, --drill-plan: every worker's collective once all workers together
	 * delivered the trigger's messages, where softverbs-ctl's fault would come; or
	 * (--inject-at own) once it delivered the same fraction of its own */
	if (o->inject || o->drill_plan) {
		uint64_t own = (uint64_t)(o->procs - 1) * (uint64_t)o->messages;

		s->coll_at = o->inject_own ? (uint64_t)(frac * (double)own) : s->trigger;
		if (s->coll_at < 1)
			s->coll_at = 1;
		drill_plan_text(o, s);
	}
}

/* softverbs-ctl fault node<n> mlx5_<nic> KIND [ARG]; 0 if it worked. */
static int drill_ctl_fault(const struct drill_paths *p, const struct drill_scenario *s, int n)
{
	char node[32], nic[32], arg[32];
	char *args[] = {(char *)"fault", node, nic, (char *)drill_fault_names[s->kind], arg, NULL};

	snprintf(node, sizeof(node), "node%d", s->node);
	snprintf(nic, sizeof(nic), "mlx5_%d", n);
	snprintf(arg, sizeof(arg), "%d", s->arg);
	if (s->kind != DRILL_FAULT_FLAP && s->kind != DRILL_FAULT_SLOW &&
	    s->kind != DRILL_FAULT_JITTER)
		args[4] = NULL;
	return drill_ctl(p, s, args);
}

/* Is it time for the fault? */
bool drill_fault_due(const struct drill_opts *o, const struct drill_scenario *s, uint64_t delivered)
{
	if (o->fault_phase == DRILL_AT_TRAFFIC)
		return delivered >= s->trigger;
	/* connect: every worker has its QPs and has published them */
	for (int r = 0; r < o->procs; r++)
		if (!drill_file_exists(s->dir, "ep", r))
			return false;
	return true;
}

/* The fault: on the drawn NIC, or on every NIC of the node one after the other (the drawn
 * one first), or a SIGKILL of the node's worker. */
void drill_inject(const struct drill_opts *o, const struct drill_paths *p, struct drill_scenario *s,
		  const pid_t *pids, uint64_t delivered)
{
	s->injected = true;
	s->injected_at = delivered;
	s->injected_ns = drill_now_ns();
	if (s->kind == DRILL_FAULT_KILL) {
		int victim = s->node * o->per_node; /* the node's first process */
		if (pids[victim] > 0 && kill(pids[victim], SIGKILL) == 0)
			s->killed = victim;
		else
			s->inject_failed = true;
		return;
	}
	for (int i = 0; i < (o->fault_all_nics ? o->nics : 1); i++)
		if (drill_ctl_fault(p, s, (s->nic + i) % o->nics))
			s->inject_failed = true;
	/* The workers hold until the fault is in (or could not be put in). */
	if (s->hold != DRILL_HOLD_NONE && drill_file_put(s->dir, "fault", 0, &s->node, sizeof(int)))
		s->inject_failed = true;
}

/* --inject, --drill-plan: the fault's start is the first worker's collective. */
void drill_watch_collectives(const struct drill_opts *o, struct drill_scenario *s,
			     struct drill_status *st)
{
	for (int r = 0; r < o->procs; r++) {
		int64_t ns = atomic_load(&st[r].coll_ns);

		if (ns && (!s->injected || ns < s->injected_ns)) {
			s->injected = true;
			s->injected_ns = ns;
			s->injected_at = atomic_load(&st[r].coll_all);
		}
	}
}

void drill_inject_second(const struct drill_paths *p, struct drill_scenario *s, uint64_t delivered)
{
	s->second_injected = true;
	s->second_at = delivered;
	s->second_ns = drill_now_ns();
	if (drill_ctl_fault(p, s, s->nic2))
		s->second_failed = true;
}

/* --inject: every step of the plan applied by some process to some queue pairs, as
 * its report says. */
static const char *drill_steps_missed(const struct drill_scenario *s)
{
	static char why[DRILL_ERR_LEN];

	if (!s->drill_reports)
		return "no R2CC report says what became of R2CC_DRILL (a libr2cc.so without "
		       "the drill?)";
	for (int k = 0; k < s->nsteps && k < DRILL_MAX_STEPS; k++)
		if (!s->step_applied[k]) {
			snprintf(why, sizeof(why), "drill step %d was applied in no process%s%s",
				 k + 1, s->step_why[0] ? ": " : "", s->step_why);
			return why;
		} else if (!s->step_qps[k] && !s->step_up[k]) {
			snprintf(why, sizeof(why), "drill step %d cut no queue pair in any process",
				 k + 1);
			return why;
		}
	return NULL;
}

/* Why the fault (or the second fault) tested nothing; NULL when it was in time. */
const char *drill_fault_missed(const struct drill_opts *o, const struct drill_scenario *s)
{
	if (s->kind == DRILL_FAULT_NONE)
		return NULL;
	if (!s->injected)
		return o->inject ? "no worker made its collective: the drill's steps never began"
				 : "the fault was never injected";
	if (s->inject_failed)
		return s->kind == DRILL_FAULT_KILL
			   ? "the worker could not be killed"
			   : "the fault was not injected (softverbs-ctl failed)";
	if (o->fault_phase == DRILL_AT_CONNECT && s->injected_at > 0)
		return "the fault came after the traffic had started";
	if (s->injected_at >= s->expected)
		return "the fault came after the traffic had ended";
	if (o->inject)
		return drill_steps_missed(s);
	if (o->second_ms < 0)
		return NULL;
	if (!s->second_injected)
		return "the second fault was never injected";
	if (s->second_failed)
		return "the second fault was not injected (softverbs-ctl failed)";
	if (s->second_at >= s->expected)
		return "the second fault came after the traffic had ended";
	return NULL;
}
