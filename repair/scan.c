/*
 * The stall scan (repair thread, every SCAN_NS): a QP with work outstanding that
 * retires nothing is suspected only beyond what the node's load explains (the load
 * model of stall.h), and a suspicion is confirmed by a self-test of the NIC
 * (localise.c) before anything moves, so that a slow, loaded fabric is never taken
 * for a dead one. A NIC with a request that made no progress for a scan period is
 * tested at once: the fast way to a black hole (the test, not the wait, is the
 * evidence). Trailing unsignalled requests are probed with a signalled zero-byte
 * write.
 */
#include "repair/engine_priv.h"

#include <stdio.h>
#include <unistd.h>

int64_t r2cc_scan_floor(void)
{
	return r2cc_param.stall_ms > 0 ? (int64_t)r2cc_param.stall_ms * 1000000
				       : R2CC_STALL_FLOOR_NS;
}

/* A signalled zero-byte write behind trailing unsignalled ones: their fate shows
 * in its completion. Repair thread; the provider serialises it with NCCL's posts. */
void r2cc_probe(struct r2cc_rqp *r, int64_t t, uint64_t posted_now)
{
	pthread_mutex_lock(&r->mu);
	int s = load_state(r);
	if ((s == RQ_HEALTHY || s == RQ_MIGRATED) && !r->dead) {
		__atomic_store_n(&r->probe_done, 0, __ATOMIC_RELEASE);
		if (r2cc_post_zero_write(r->cur_ctx, r->cur_qp, R2CC_PROBE_WRID) == 0)
			r->probe_at = t;
		r->probed = posted_now;
	}
	pthread_mutex_unlock(&r->mu);
}

/* The load model (repair/model/stall.h): every live QP's queued bytes and what it
 * retired since the last scan, on the NIC it uses now. Under r2cc_eng.mu. */
static void account(int64_t t)
{
	r2cc_stall_scan_begin();
	for (struct r2cc_rqp *r = r2cc_eng.all; r; r = r->next_all) {
		int s = load_state(r);
		if (r->dead || !r->cur_sh ||
		    (s != RQ_HEALTHY && s != RQ_MIGRATED && s != RQ_DETECTED))
			continue;
		uint64_t posted, retired, sig_posted, sig_retired;
		uint32_t big;
		r2cc_qp_shadow_bytes(r->cur_sh, &posted, &retired, &big);
		r2cc_qp_shadow_signalled(r->cur_sh, &sig_posted, &sig_retired);
		if (r->acct_sh != r->cur_sh || retired < r->acct_retired) {
			r->acct_sh = r->cur_sh;
			r->acct_retired = retired;
		}
		/* Queued is what a completion is still owed for: trailing unsignalled
		 * requests (NCCL's clear-to-send writes) retire only with a later
		 * signalled one, and most of them left the NIC long ago. */
		bool owed = sig_posted != sig_retired;
		r2cc_stall_account(r->cur_nic, owed && posted > retired ? posted - retired : 0,
				   retired - r->acct_retired, big);
		r->acct_retired = retired;
	}
	r2cc_stall_scan_end(t);
}

/*
 * A wait the queue does not explain: suspected, never acted on by itself. The
 * NIC's self-test (and, through the peer's notice, the peer NIC's) decides; only a
 * failed self-test moves anything. The wait is suspected again after a growing
 * back-off while it lasts. Repair thread, without r2cc_eng.mu.
 */
static void suspect(struct r2cc_rqp *r, int64_t waited, int64_t explained)
{
	static unsigned long logged;
	if (__atomic_fetch_add(&logged, 1, __ATOMIC_RELAXED) < 32)
		R2CC_INFO(
		    "repair: qp 0x%x on %s: no completion for %lld ms, while %.1f MB queued on "
		    "the NIC at %.0f MB/s explain %lld ms; confirming",
		    r->qpn, r->cur_nic->name, (long long)(waited / 1000000),
		    (double)r->wait_ahead / 1e6, r2cc_stall_rate(r->cur_nic) / 1e6,
		    (long long)(explained / 1000000));
	__atomic_add_fetch(&r2cc_eng.stalls_suspected, 1, __ATOMIC_RELAXED);
	char why[128];
	snprintf(why, sizeof(why), "qp 0x%x waited %lld ms", r->qpn, (long long)(waited / 1000000));
	r2cc_selftest_start(r->cur_nic, why, true);
	r2cc_exchange_suspect(r);
}

/*
 * A NIC with a request that waited a scan period: its self-test starts now (repair/localise.c; at
 * most one per NIC at a time, and not again within a short back-off after it passed). Not a
 * suspicion: nothing is logged or sent to the peer, and only a failed test moves anything. Repair
 * thread, without r2cc_eng.mu.
 */
static void probe_quiet(struct r2cc_rqp *r, int64_t waited)
{
	char why[128];
	snprintf(why, sizeof(why), "qp 0x%x made no progress for %lld ms", r->qpn,
		 (long long)(waited / 1000000));
	r2cc_selftest_start(r->cur_nic, why, true);
}

/*
 * A request still waiting after its NIC passed a self-test (r2cc_scan): the peer's
 * process is asked to test its end (a suspect notice; it tests its NIC within its own
 * back-off). Not a suspicion of this side: nothing here moves. Repair thread, without
 * r2cc_eng.mu (far_noticed is the repair thread's).
 */
static void ask_far_end(struct r2cc_rqp *r, int64_t waited)
{
	static unsigned long logged;
	int rank = r2cc_exchange_suspect(r);
	if (rank == -EAGAIN)
		return; /* the peer is still being searched (hurried): asked at a later scan */
	r->far_noticed = r->scan_progress;
	if (rank < 0)
		return;
	if (__atomic_fetch_add(&logged, 1, __ATOMIC_RELAXED) < 16) {
		pthread_mutex_lock(&r->mu);
		R2CC_INFO("repair: qp 0x%x on %s: no progress for %lld ms though the NIC passed a "
			  "self-test meanwhile; asked rank %d to test its end",
			  r->qpn, r->cur_nic->name, (long long)(waited / 1000000), rank);
		pthread_mutex_unlock(&r->mu);
	}
	__atomic_add_fetch(&r2cc_eng.far_ends_asked, 1, __ATOMIC_RELAXED);
}

/*
 * A NIC another process of this node found dead in the last NODE_DEAD_NS (the
 * ledger): this process's queue pairs on it move now, not when its own scan and
 * self-test find the same (the processes of a node share the NIC; the verdict is
 * about the NIC, not a path). Each verdict is taken once. Repair thread.
 */
#define NODE_DEAD_NS 2000000000ll
static void node_verdict(struct r2cc_nic *nic, int64_t t)
{
	static int64_t taken[R2CC_STALL_MAX_NICS];
	int i = nic->index, pid = 0;
	if (i < 0 || i >= R2CC_STALL_MAX_NICS ||
	    __atomic_load_n(&nic->state, __ATOMIC_RELAXED) != R2CC_NIC_UP)
		return;
	int64_t d = r2cc_ledger_dead_at(nic->name, &pid, NULL);
	if (d <= taken[i] || pid == r2cc_eng.pid || t - d > NODE_DEAD_NS)
		return;
	char why[R2CC_LEDGER_WHY]; /* read only for a verdict taken */
	d = r2cc_ledger_dead_at(nic->name, &pid, why);
	taken[i] = d;
	r2cc_nic_failed_on_node(nic, pid, why);
}

/*
 * Stall scan, every SCAN_NS. A QP whose oldest signalled request waited a scan
 * period has its NIC tested (probe_quiet). A QP whose oldest signalled request
 * (NCCL's, or R2CC's probe) has waited longer than what the node had queued ahead of it on
 * its NIC explains at the NIC's drain rate (repair/model/stall.h) is suspected; when no
 * other path of this process completed work after it last did, only once it waited
 * one stall floor longer (the process may not be polling at all, or the only work
 * left waits on the dead path: a ring behind one black hole). When every NIC of
 * this process that has work (two or more) waits at once, that is the whole node slowing down
 * (congestion, or this process not getting a CPU), not a failure: nothing is
 * suspected. Under r2cc_eng.mu.
 */
void r2cc_scan(int64_t t)
{
	static bool ledger;
	if (!ledger && r2cc_eng.ndirs > 0) {
		/* the node's table, as soon as the job is known (not under the mutex) */
		pthread_mutex_unlock(&r2cc_eng.mu);
		r2cc_place_ledger_use();
		ledger = true;
		pthread_mutex_lock(&r2cc_eng.mu);
	}
	account(t);
	/* per NIC: its floor (0 until looked up: R2CC_STALL_MS, or ONE_SIBLING_FLOOR_X
	 * times it with one sibling to test through), and whether it has the siblings
	 * for the fast test (r2cc_selftest_witnesses) */
	int64_t nic_floor[R2CC_STALL_MAX_NICS] = {0};
	bool nic_fast[R2CC_STALL_MAX_NICS] = {false};
	bool busy[R2CC_STALL_MAX_NICS] = {false}, hit[R2CC_STALL_MAX_NICS] = {false};
	struct r2cc_rqp *sus[16];
	int64_t sus_wait[16], sus_expl[16];
	int nsus = 0;
	/* NICs to test now: a request of theirs waited a scan period (the first QP
	 * found, and how long it waited) */
	struct r2cc_rqp *quiet[R2CC_STALL_MAX_NICS] = {NULL};
	int64_t quiet_wait[R2CC_STALL_MAX_NICS];
	/* per NIC: the QP that has waited longest since a self-test proved the NIC alive
	 * (its peer's end is asked to test itself) */
	struct r2cc_rqp *far[R2CC_STALL_MAX_NICS] = {NULL};
	int64_t far_wait[R2CC_STALL_MAX_NICS];
	/* NICs with a connection: their far pairs are made, the node's verdicts read */
	struct r2cc_nic *nic_seen[R2CC_STALL_MAX_NICS] = {NULL};
	for (struct r2cc_rqp *r = r2cc_eng.all; r; r = r->next_all) {
		int s = load_state(r);
		if (r->dead || (s != RQ_HEALTHY && s != RQ_MIGRATED) || !r->cur_sh)
			continue;
		uint64_t posted, retired;
		r2cc_qp_shadow_signalled(r->cur_sh, &posted, &retired);
		struct r2cc_qp_shadow_stats st;
		r2cc_qp_shadow_get_stats(r->cur_sh, &st);
		if (r->probe_at && __atomic_load_n(&r->probe_done, __ATOMIC_ACQUIRE)) {
			r->probe_at = 0;
			r2cc_eng.last_progress = t;
		}
		bool waiting = posted != retired || r->probe_at;
		int ni = r->cur_nic->index;
		if (ni >= 0 && ni < R2CC_STALL_MAX_NICS && !r->loopback &&
		    __atomic_load_n(&r->ready, __ATOMIC_ACQUIRE) && r->tracked)
			nic_seen[ni] = r->cur_nic;
		if (waiting && ni >= 0 && ni < R2CC_STALL_MAX_NICS)
			busy[ni] = true;
		/* A wait is timed from the first scan that saw it: a request posted
		 * since the last scan (which saw none outstanding) has waited less
		 * than a scan period, however long ago that scan was. */
		bool seen = r->scan_waiting;
		r->scan_waiting = waiting;
		if (!waiting || !seen || retired != r->scan_retired || !r->scan_progress) {
			if (retired != r->scan_retired && r->scan_progress)
				r2cc_eng.last_progress = t;
			r->scan_retired = retired;
			r->scan_progress = t;
			r->wait_ahead = r2cc_stall_queued(r->cur_nic);
			r->suspect_after = 0;
			/* Trailing unsignalled requests, nothing posted for a while, not
			 * probed since: probe them. */
			if (st.send_posted != r->scan_posted) {
				r->scan_posted = st.send_posted;
				r->scan_idle = t;
			} else if (!waiting && r2cc_qp_shadow_send_outstanding(r->cur_sh) &&
				   r2cc_qp_shadow_recv_outstanding(r->cur_sh) &&
				   r->probed != st.send_posted &&
				   t - r->scan_idle > PROBE_IDLE_NS) {
				/* Only where the application waits for this peer (a
				 * receive outstanding here: it polls this CQ, so the
				 * probe's completion will be seen). */
				pthread_mutex_unlock(&r2cc_eng.mu);
				r2cc_probe(r, t, st.send_posted);
				pthread_mutex_lock(&r2cc_eng.mu);
				r->scan_progress = t;
			}
			continue;
		}
		/* This request made no progress over a scan period, or its NIC
		 * completed nothing (for this process or another of the node) for
		 * one while it waited: the NIC is tested at once (its self-test
		 * answers in microseconds on a live NIC, queued data or not; only a
		 * NIC that stays silent for R2CC_STALL_MS fails it). One test per NIC
		 * at a time, and a short back-off after one passed, bound the tests
		 * by the NICs, whatever the number of queue pairs. Only a NIC with two
		 * siblings or more to test through (r2cc_selftest_witnesses). */
		int64_t floor = r2cc_scan_floor();
		if (ni >= 0 && ni < R2CC_STALL_MAX_NICS) {
			if (!nic_floor[ni]) {
				int w = r2cc_selftest_witnesses(r->cur_nic);
				nic_fast[ni] = w >= 2 || (w == 1 && r2cc_far_ready(r->cur_nic));
				nic_floor[ni] = nic_fast[ni] ? floor : ONE_SIBLING_FLOOR_X * floor;
			}
			floor = nic_floor[ni];
		}
		int64_t waited = t - r->scan_progress,
			quiet_since = r2cc_stall_last_drain(r->cur_nic);
		if (quiet_since < r->scan_progress)
			quiet_since = r->scan_progress;
		if (ni >= 0 && ni < R2CC_STALL_MAX_NICS && nic_fast[ni] && !quiet[ni] &&
		    (t - quiet_since >= SCAN_NS || waited >= SCAN_NS)) {
			quiet[ni] = r;
			quiet_wait[ni] = waited;
		}
		/* Alive here, stuck there: a self-test of this NIC passed after this
		 * request's wait began, and the request is still waiting. The other
		 * end may be the dead one (a NIC whose own process has nothing of its
		 * own outstanding on it, only what it receives): its process is asked
		 * to test it now, not once this wait is beyond what the queue explains.
		 * Once per wait, one QP per NIC per scan. */
		if (ni >= 0 && ni < R2CC_STALL_MAX_NICS && nic_fast[ni] &&
		    r->far_noticed != r->scan_progress &&
		    r2cc_selftest_alive_from(r->cur_nic) > r->scan_progress &&
		    (!far[ni] || waited > far_wait[ni])) {
			far[ni] = r;
			far_wait[ni] = waited;
		}
		/* What was queued ahead of this request: at least what the node
		 * had queued on the NIC when the wait began, or since. */
		uint64_t q = r2cc_stall_queued(r->cur_nic);
		if (q > r->wait_ahead)
			r->wait_ahead = q;
		int64_t explained = r2cc_stall_explained_ns(r->cur_nic, r->wait_ahead, floor);
		/* Nothing else progressed since the wait began: the process may not be
		 * polling, or only dead paths have work left (a ring waits on one
		 * black-holed path). Suspected after one floor more; the self-test,
		 * which polls its own queues, tells the two apart. */
		bool alone = r2cc_eng.last_progress <= r->scan_progress;
		if (waited <= explained + r->suspect_after + (alone ? floor : 0))
			continue;
		r->suspect_after = r->suspect_after ? 2 * r->suspect_after : SUSPECT_AGAIN_NS;
		if (r->suspect_after > SUSPECT_MAX_NS)
			r->suspect_after = SUSPECT_MAX_NS;
		if (ni >= 0 && ni < R2CC_STALL_MAX_NICS)
			hit[ni] = true;
		if (nsus < (int)(sizeof(sus) / sizeof(sus[0]))) {
			sus_wait[nsus] = waited;
			sus_expl[nsus] = explained;
			sus[nsus++] = r;
		}
	}
	pthread_mutex_unlock(&r2cc_eng.mu);
	for (int i = 0; i < R2CC_STALL_MAX_NICS; i++) {
		if (nic_seen[i] && r2cc_selftest_witnesses(nic_seen[i]) >= 1)
			r2cc_far_warm(nic_seen[i]);
		if (nic_seen[i])
			node_verdict(nic_seen[i], t);
		if (quiet[i])
			probe_quiet(quiet[i], quiet_wait[i]);
		if (far[i])
			ask_far_end(far[i], far_wait[i]);
	}
	pthread_mutex_lock(&r2cc_eng.mu);
	if (!nsus)
		return;
	bool all = true;
	int nbusy = 0;
	for (int i = 0; i < R2CC_STALL_MAX_NICS; i++) {
		nbusy += busy[i];
		all = all && (!busy[i] || hit[i]);
	}
	if (all && nbusy > 1) {
		static unsigned long logged;
		if (__atomic_fetch_add(&logged, 1, __ATOMIC_RELAXED) < 8)
			R2CC_INFO(
			    "repair: every NIC with work waits longer than its queue explains: "
			    "the node is slow (congestion or CPU), not failed; nothing moves");
		__atomic_add_fetch(&r2cc_eng.stalls_node_wide, 1, __ATOMIC_RELAXED);
		return;
	}
	pthread_mutex_unlock(&r2cc_eng.mu);
	for (int i = 0; i < nsus; i++)
		suspect(sus[i], sus_wait[i], sus_expl[i]);
	pthread_mutex_lock(&r2cc_eng.mu);
}
