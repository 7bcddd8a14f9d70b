/*
 * Failback (R2CC_FAILBACK_MS): a failed NIC whose port is ACTIVE is probed with the
 * self-test; once healthy for the settle time and out of its hold-down, the QPs
 * whose own NIC it is return to it through the same fence, exchange and commit, and
 * Balance spreads the QPs of NICs still down onto it.
 */
#include "repair/engine_priv.h"

#include <stdio.h>
#include <stdlib.h>

/*
 * Failback (R2CC_FAILBACK_MS), per NIC (registry index). A failed NIC is probed
 * while its port is ACTIVE: a self-test through its siblings, whose verdict the
 * self-test thread leaves here (atomic). Once its probes have passed for
 * R2CC_FAILBACK_MS with no failure seen between, and its hold-down since its
 * last failback is over, it is up again and the QPs moved off it return. The
 * hold-down starts at R2CC_FAILBACK_MS and doubles (up to FAILBACK_HOLD_MAX_NS)
 * each time the NIC fails again within twice the hold-down after its failback:
 * a flapping NIC comes back at most once per hold-down. A NIC whose device
 * died never comes back (its contexts are gone for good). Everything but the
 * verdict is the repair thread's.
 */
#define FB_NONE 2 /* no verdict (a self-test's are -1, 0 and 1) */
static struct {
	int verdict;
	int64_t probe_at; /* the running probe began then (0: none runs) */
	int64_t healthy_since, next_probe, failed_seen;
	int64_t hold, last_back; /* hold-down; when the last failback began */
	bool weighed;		 /* the first failure after the last failback was weighed */
	int backs;		 /* failbacks */
	bool dead;
} fb_nic[R2CC_STALL_MAX_NICS];

/* Its device is dead: it never comes back. */
void r2cc_failback_never(const struct r2cc_nic *nic)
{
	if (nic->index >= 0 && nic->index < R2CC_STALL_MAX_NICS)
		__atomic_store_n(&fb_nic[nic->index].dead, true, __ATOMIC_RELAXED);
}

void r2cc_failback_verdict(int i, int verdict)
{
	__atomic_store_n(&fb_nic[i].verdict, verdict, __ATOMIC_RELEASE);
}

/* A QP that moved off nic and may return to it. */
static bool homed_on(const struct r2cc_rqp *r, const void *nic)
{
	return !r->dead && r->orig_nic == nic && r->cur_nic != nic && load_state(r) == RQ_MIGRATED;
}

/* r returns to nic: queued as a detection whose cause is the failback (NCCL's
 * threads may detect a failure of r at the same moment: the first one wins). Its
 * incident, or -1 when it does not move. */
static int detect_failback(struct r2cc_rqp *r, struct r2cc_nic *nic, const char *why)
{
	int s = RQ_MIGRATED;
	if (!r2cc_active() || !connected(r))
		return -1;
	pthread_mutex_lock(&r2cc_eng.mu); /* as r2cc_detect: the state changes with the note */
	if (!__atomic_compare_exchange_n(&r->state, &s, RQ_DETECTED, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_RELAXED)) {
		pthread_mutex_unlock(&r2cc_eng.mu);
		return -1;
	}
	r->failback_to = nic;
	r2cc_detect_note(r, why, 0);
	int inc = r->incident;
	r2cc_work_push_locked(r);
	pthread_mutex_unlock(&r2cc_eng.mu);
	return inc;
}

static bool live_rqp(const struct r2cc_rqp *r, const void *arg)
{
	(void)arg;
	return !r->dead && r2cc_rqp_qp(r) && __atomic_load_n(&r->ready, __ATOMIC_ACQUIRE);
}

/*
 * After the QPs of nic are on their way home: QPs whose own NIC is still down move
 * to nic too, one at a time, from the NIC with the most of this process's QPs of
 * their direction, while it has at least two more than nic (Balance, as at a
 * failure; a move that would only swap the imbalance is not made). How many.
 */
static int failback_spread(struct r2cc_nic *nic, const char *why, int *inc)
{
	struct r2cc_rqp **list;
	int n = r2cc_rqp_collect(&list, live_rqp, NULL), moved = 0, me = nic->index;
	bool *skip = n ? calloc((size_t)n, sizeof(*skip)) : NULL;
	for (int rx = 0; skip && rx < 2; rx++) {
		int cnt[R2CC_MAX_NICS] = {0};
		for (int k = 0; k < n; k++) {
			const struct r2cc_nic *at =
			    list[k]->failback_to ? list[k]->failback_to : list[k]->cur_nic;
			if (r2cc_rqp_receiving(list[k]) == rx && at && at->index >= 0 &&
			    at->index < R2CC_MAX_NICS)
				cnt[at->index]++;
		}
		for (;;) {
			int best = -1;
			for (int k = 0; k < n; k++) {
				struct r2cc_rqp *r = list[k];
				const struct r2cc_nic *at = r->cur_nic;
				if (skip[k] || r2cc_rqp_receiving(r) != rx || r->failback_to ||
				    r->loopback || !at || at == nic || at->index < 0 ||
				    at->index >= R2CC_MAX_NICS || r->orig_nic == nic ||
				    load_state(r) != RQ_MIGRATED ||
				    __atomic_load_n(&r->orig_nic->state, __ATOMIC_RELAXED) ==
					R2CC_NIC_UP ||
				    cnt[at->index] - cnt[me] < 2)
					continue;
				if (best < 0 || cnt[at->index] > cnt[list[best]->cur_nic->index])
					best = k;
			}
			if (best < 0)
				break;
			skip[best] = true;
			int from = list[best]->cur_nic->index,
			    in = detect_failback(list[best], nic, why);
			if (in >= 0) {
				*inc = in;
				cnt[from]--;
				cnt[me]++;
				moved++;
			}
		}
	}
	free(skip);
	r2cc_rqp_collect_done(list);
	return moved;
}

/* nic has been healthy long enough: it is up, and its QPs come back. */
static void failback_start(struct r2cc_nic *nic, int64_t t)
{
	int i = nic->index;
	fb_nic[i].last_back = t;
	fb_nic[i].weighed = false;
	fb_nic[i].healthy_since = 0;
	fb_nic[i].backs++;
	__atomic_store_n(&nic->state, R2CC_NIC_UP, __ATOMIC_SEQ_CST);
	__atomic_add_fetch(&nic->failbacks, 1, __ATOMIC_RELAXED);
	char why[96];
	snprintf(why, sizeof(why), "failback: port active, self-tests passed for %d ms",
		 r2cc_param.failback_ms);
	struct r2cc_rqp **list;
	int n = r2cc_rqp_collect(&list, homed_on, nic), back = 0, inc = -1;
	for (int k = 0; k < n; k++) {
		int in = detect_failback(list[k], nic, why);
		if (in >= 0) {
			back++;
			inc = in;
		}
	}
	r2cc_rqp_collect_done(list);
	int spread = r2cc_param.mode >= 2 ? failback_spread(nic, why, &inc) : 0;
	R2CC_WARN("repair: %s is back (port active, self-tests passed for %d ms): %d queue "
		  "pair(s) return to it, %d more from NICs still down; failback %d, next one no "
		  "sooner than %lld ms after this",
		  nic->name, r2cc_param.failback_ms, back, spread, fb_nic[i].backs,
		  (long long)(fb_nic[i].hold / 1000000));
	r2cc_incident_event(inc,
			    "%s healthy for %d ms: %d queue pair(s) return, %d more from NICs "
			    "still down (failback %d)",
			    nic->name, r2cc_param.failback_ms, back, spread, fb_nic[i].backs);
}

/* The repair thread's round of failback: each failed NIC probed, and brought back
 * once it has stayed healthy (see fb_nic). */
void r2cc_failback_tick(int64_t t)
{
	int64_t base = (int64_t)r2cc_param.failback_ms * 1000000;
	if (!base)
		return;
	int64_t period = base / 5 < 10000000ll	   ? 10000000ll
			 : base / 5 > 1000000000ll ? 1000000000ll
						   : base / 5;
	int n = r2cc_nic_count();
	for (int i = 0; i < n && i < R2CC_STALL_MAX_NICS; i++) {
		struct r2cc_nic *nic = r2cc_nic_by_index(i);
		if (!nic || nic->index != i)
			continue;
		__typeof__(&fb_nic[0]) f = &fb_nic[i];
		if (!f->hold)
			f->hold = base;
		int64_t fa = r2cc_nic_failure_at(i);
		if (fa > f->failed_seen) {
			f->failed_seen = fa;
			f->healthy_since = 0;
			if (f->last_back && fa > f->last_back && !f->weighed) {
				f->weighed = true;
				bool flap = fa - f->last_back < 2 * f->hold;
				int64_t h = flap ? 2 * f->hold : base;
				f->hold = h < FAILBACK_HOLD_MAX_NS ? h : FAILBACK_HOLD_MAX_NS;
				if (flap)
					R2CC_WARN(
					    "repair: %s failed again %.0f ms after its failback: "
					    "held down for %lld ms",
					    nic->name, (fa - f->last_back) / 1e6,
					    (long long)(f->hold / 1000000));
			}
		}
		if (__atomic_load_n(&nic->state, __ATOMIC_RELAXED) != R2CC_NIC_DOWN ||
		    __atomic_load_n(&f->dead, __ATOMIC_RELAXED))
			continue;
		int v = __atomic_exchange_n(&f->verdict, FB_NONE, __ATOMIC_ACQ_REL);
		if (v != FB_NONE) {
			if (v == 0 && fa < f->probe_at) {
				if (!f->healthy_since) {
					f->healthy_since = f->probe_at;
					R2CC_INFO(
					    "repair: %s: port active and self-test passed; back "
					    "once healthy for %d ms",
					    nic->name, r2cc_param.failback_ms);
				}
			} else {
				f->healthy_since = 0;
			}
			f->probe_at = 0;
		}
		if (f->probe_at)
			continue; /* its probe runs */
		if (f->healthy_since && t - f->healthy_since >= base &&
		    (!f->last_back || t - f->last_back >= f->hold)) {
			failback_start(nic, t);
			continue;
		}
		if (t < f->next_probe)
			continue;
		f->next_probe = t + period;
		struct r2cc_ctx *c = r2cc_ctx_of_nic(nic);
		struct ibv_port_attr pa;
		if (!c || r2cc_eng.v.query_port(c->ctx, nic->port ? nic->port : 1, &pa) != 0 ||
		    pa.state != IBV_PORT_ACTIVE) {
			f->healthy_since = 0;
			continue;
		}
		f->probe_at = t;
		if (!r2cc_selftest_spawn(nic, "failback probe", false, true))
			f->probe_at = 0;
	}
}
