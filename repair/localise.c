/*
 * Localisation: which part failed. With its port down the NIC failed and every QP
 * on it moves; otherwise the self-test decides whether the NIC is dead (every QP on
 * it moves) or only the path to one peer NIC (the QPs to that NIC move). The
 * self-test connects the NIC to its siblings on the same node and sees whether
 * anything comes through, on its own short-lived thread.
 */
#include "repair/engine_priv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct same_path {
	const struct r2cc_rqp *r;
	const struct r2cc_nic *nic;
	bool port_down;
};

static bool on_same_path(const struct r2cc_rqp *o, const void *arg)
{
	const struct same_path *sp = arg;
	const struct r2cc_qp *q = r2cc_rqp_qp(o), *mine = r2cc_rqp_qp(sp->r);
	/* A QP NCCL has not brought to RTS has no path yet (and NCCL's thread is still
	 * writing its attributes). */
	return o != sp->r && q && mine && __atomic_load_n(&o->ready, __ATOMIC_ACQUIRE) &&
	       o->cur_nic == sp->nic && (sp->port_down || q->peer.lid == mine->peer.lid);
}

/*
 * Localise a failure seen on one QP: with the local port down it is the NIC, and
 * every QP on it moves; with the port up it is the path to the peer's NIC (or the
 * peer's NIC), and every QP of this NIC to that peer NIC moves, since the ones
 * that have nothing outstanding would only find out later. Repair thread.
 */
void r2cc_localise(struct r2cc_rqp *r)
{
	struct ibv_port_attr pa;
	memset(&pa, 0, sizeof(pa));
	struct r2cc_nic *nic = r->cur_nic;
	bool port_down =
	    r2cc_eng.v.query_port(r->cur_ctx->ctx, nic->port ? nic->port : 1, &pa) == 0 &&
	    pa.state != IBV_PORT_ACTIVE;
	if (port_down && __atomic_load_n(&nic->state, __ATOMIC_RELAXED) == R2CC_NIC_UP) {
		__atomic_store_n(&nic->state, R2CC_NIC_DOWN, __ATOMIC_SEQ_CST);
		R2CC_WARN("repair: %s: port not active; migrating its queue pairs", nic->name);
	}
	struct same_path sp = {.r = r, .nic = nic, .port_down = port_down};
	struct r2cc_rqp **list;
	int n = r2cc_rqp_collect(&list, on_same_path, &sp);
	char why[128];
	snprintf(why, sizeof(why), "%s as qp 0x%x (%s)", port_down ? "same NIC" : "same path",
		 r->qpn, r->cause);
	for (int i = 0; i < n; i++)
		r2cc_detect_on(list[i], nic, why, r->status_seen);
	r2cc_rqp_collect_done(list);
	r2cc_rqp_event(r, "qp 0x%x: localised to %s %s%s, %d more QP(s) to move", r->qpn,
		       port_down ? "NIC" : "path from", nic->name, port_down ? "" : " to its peer",
		       n);
	if (!port_down)
		r2cc_selftest_start(nic, why, false);
}

/*
 * NIC self-test. A failure with the port up is a dead path (or a dead NIC on the
 * other side), or a dead NIC here whose port still says active (a black hole);
 * a stall may also be no failure at all, only a loaded fabric. The test tells
 * them apart: a signalled zero-byte write from the suspect NIC to a sibling NIC
 * of this process, through the fabric, on a QP pair of R2CC's own. The write is
 * on a QP of its own, so it does not queue behind the data: a NIC serves its QPs
 * in turn (hardware arbitration; the soft device's engine round-robin, one 64 KB
 * slice each), and a live NIC answers within about one request in service
 * however much is queued. It
 * is given R2CC_STALL_MS x 6/5 (24 ms by default) of this thread's time on a CPU,
 * plus what the largest request in service at either end takes (selftest_window):
 * R2CC_STALL_MS is the longest pause of a healthy port that R2CC tolerates (a PFC
 * pause, an incast burst: the write, held that long, still answers in time), and
 * the fifth more is margin for the answer's own way back and for scheduling. A
 * user who raises it for a fabric whose healthy ports pause longer raises the
 * test's patience too. Without an answer by then, the NIC is dead only if it also
 * completed nothing at all meanwhile: a NIC that drains is alive however slowly
 * (the test is extended, up to SELFTEST_MAX_NS, then called inconclusive), and
 * congestion cannot make a NIC that has work complete nothing while its test goes
 * unanswered. A dead NIC has every QP on it moved. Runs on a short-lived thread, at
 * most one per NIC at a time; a NIC that passed is not tested again for a short
 * back-off (SELFTEST_BACKOFF_NS, doubled while the NIC completes nothing between
 * tests, up to R2CC_STALL_MS): a healthy NIC busy with one long request is tested
 * a few times per request, never on every scan. The QP pairs of a test that all
 * answered are kept for the NIC's next test (st_cache): a test is then one post
 * and a poll, no QP created.
 */
#define SELFTEST_MAX_NS	    5000000000ll
#define SELFTEST_BACKOFF_NS 10000000ll	 /* first back-off after a test that passed */
#define SELFTEST_AWAKE_NS   2000000ll	 /* the longest sleep that counts as waiting */
#define SELFTEST_SIBLINGS   3		 /* tested through at once */
#define SUSPECT_NIC_NS	    2000000000ll /* a NIC with a failure this recent is no witness */

struct selftest {
	struct r2cc_nic *a;
	struct r2cc_ctx *ca;
	int nb;
	struct r2cc_nic *b[SELFTEST_SIBLINGS];
	struct r2cc_ctx *cb[SELFTEST_SIBLINGS];
	struct ibv_qp *qa[SELFTEST_SIBLINGS], *qb[SELFTEST_SIBLINGS];
	struct ibv_cq *cqa, *cqb[SELFTEST_SIBLINGS];
	bool calibrate; /* RoCE: only which siblings answer; no back-off after it */
	bool failback;	/* a failed NIC's probe: the verdict goes to r2cc_failback_tick() */
	bool far_only;	/* only the far pairs made (repair/farprobe.c): no probe, no verdict */
	/* far probes (through b[0]): pair k's writes are bits 2k (from a: an answer
	 * proves a alive) and 2k + 1 (from the sibling: an answer makes it a witness) */
	int nfar;
	struct far_pair *far[R2CC_FAR_PEERS];
	int far_posted, far_answered, far_okmask;
	uint64_t seq;	   /* wr_id = seq << 8 | sibling + 1 */
	int posted;	   /* siblings a write went to */
	int answered;	   /* ... whose write completed */
	int okmask;	   /* ... successfully */
	int64_t ok_ns;	   /* when the first success was seen */
	int64_t answer_ns; /* from the posts to the first success */
	int64_t run_ns;	   /* from the posts to the verdict */
	int64_t posted_at; /* when its writes went out */
	int64_t window_ns; /* the first window it was given */
	char why[128];
};

/* Per NIC (registry index): no new self-test before next, the back-off, and
 * the last time a failure was seen on it (it is then a poor witness for its
 * siblings' tests). next and failure_at are read by other threads (atomic);
 * backoff only by the NIC's self-test, of which one runs at a time. */
static struct {
	int64_t next, backoff, failure_at;
	/* RoCE: siblings (bits of their registry index) whose self-test QP answered
	 * this NIC's once, so that the fabric routes between them: only those are
	 * witnesses (unrouted rails never answer, and would make any NIC look dead);
	 * calib_at: the last test run to learn them (atomic, both) */
	uint64_t reach;
	int64_t calib_at;
	int64_t passed_at;  /* the last test that passed (its thread only) */
	int64_t alive_from; /* when the writes of the last test that passed went out (atomic) */
} st_nic[R2CC_STALL_MAX_NICS];

/* Per NIC (registry index): the QP pairs of its last test, kept while every one of
 * them answered and no NIC involved failed since they were made. Only the NIC's own
 * test thread touches them (one runs at a time). */
static struct st_cache {
	struct ibv_cq *cqa;
	int64_t built;
	struct r2cc_nic *b[SELFTEST_SIBLINGS];
	struct ibv_qp *qa[SELFTEST_SIBLINGS], *qb[SELFTEST_SIBLINGS];
	struct ibv_cq *cqb[SELFTEST_SIBLINGS];
	uint64_t seq; /* of the test's writes: an answer to an earlier test is no answer */
} st_cache[R2CC_STALL_MAX_NICS];
_Static_assert(R2CC_STALL_MAX_NICS <= 64, "reach is a 64-bit set of NICs");

void r2cc_nic_failure_seen(const struct r2cc_nic *nic)
{
	if (nic && nic->index >= 0 && nic->index < R2CC_STALL_MAX_NICS) {
		int64_t t = now_ns();
		__atomic_store_n(&st_nic[nic->index].failure_at, t, __ATOMIC_RELAXED);
		r2cc_ledger_failed_put(nic->name, t);
	}
}

/* When a failure was last seen on the NIC of registry index i (0: never). */
int64_t r2cc_nic_failure_at(int i)
{
	return i >= 0 && i < R2CC_STALL_MAX_NICS
		   ? __atomic_load_n(&st_nic[i].failure_at, __ATOMIC_RELAXED)
		   : 0;
}

/* A failure seen on nic in the last SUSPECT_NIC_NS, by this process or by another
 * of the node (the node's ledger). */
static bool nic_failed_lately(const struct r2cc_nic *nic)
{
	int64_t t = nic ? r2cc_nic_failure_at(nic->index) : 0,
		n = nic ? r2cc_ledger_failed_at(nic->name) : 0;
	t = n > t ? n : t;
	return t && now_ns() - t < SUSPECT_NIC_NS;
}

/* Transport timeouts far beyond the test's window (timeout 18: about 1.1 s a try, 8.6 s
 * with the retries, on hardware): the verdict is the test's own, from its answer and
 * the NIC's progress, and an error that came within the window would end the test
 * with nothing learnt (on the soft device, whose drills scale transport timeouts down
 * a hundredfold, 14 gave errors within 5 ms, and a first test that straddled the fault
 * ended inconclusive). */
static int selftest_connect(struct ibv_qp *qp, struct r2cc_nic *self, struct r2cc_nic *peer,
			    struct r2cc_ctx *peer_ctx, uint32_t peer_qpn)
{
	struct qp_link l = {.qpn = peer_qpn,
			    .lid = peer->lid,
			    .mtu = IBV_MTU_1024,
			    .timeout = 18,
			    .retry_cnt = 7,
			    .rnr_retry = 7};
	/* RoCE: addressed as NCCL addresses its own QPs on both NICs (GID index and
	 * class), to the peer NIC's GID of that index */
	union ibv_gid g;
	if (self->link_layer == IBV_LINK_LAYER_ETHERNET) {
		if (!__atomic_load_n(&self->roce_known, __ATOMIC_ACQUIRE) ||
		    !__atomic_load_n(&peer->roce_known, __ATOMIC_ACQUIRE) ||
		    !r2cc_eng.v.query_gid ||
		    r2cc_eng.v.query_gid(peer_ctx->ctx, peer->port ? peer->port : 1,
					 peer->roce_sgid_index, &g))
			return -ENOENT;
		l.gid = g.raw;
		l.sgid_index = self->roce_sgid_index;
		l.traffic_class = self->roce_tclass;
	}
	int rc = r2cc_own_qp_init(qp, self, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE, 0);
	if (rc)
		return rc;
	return r2cc_own_qp_connect(qp, self, &l);
}

/*
 * RoCE: does b witness a's test? It does when their self-test QPs answered each
 * other once. A NIC that no sibling has ever answered (it died, or went black,
 * before its calibration could be answered) is witnessed by a sibling that
 * answers some third NIC: this process's fabric routes between rails, so a's
 * silence is a's. (Where a fabric routes between some rails and not others, a
 * NIC on an unrouted rail that was never answered would then be tested by
 * siblings it cannot reach; such a test still finds the NIC alive if it completes
 * any work of its own meanwhile.) IB: always.
 */
static bool selftest_reaches(const struct r2cc_nic *a, const struct r2cc_nic *b)
{
	if (a->link_layer != IBV_LINK_LAYER_ETHERNET)
		return true;
	if (a->index < 0 || a->index >= R2CC_STALL_MAX_NICS || b->index < 0 ||
	    b->index >= R2CC_STALL_MAX_NICS)
		return false;
	uint64_t ra = __atomic_load_n(&st_nic[a->index].reach, __ATOMIC_RELAXED);
	if (ra)
		return ra >> b->index & 1;
	return (__atomic_load_n(&st_nic[b->index].reach, __ATOMIC_RELAXED) & ~(1ull << a->index)) !=
	       0;
}

/*
 * Siblings a test of a could go through: UP NICs of this process with their mirror
 * (selftest_siblings() picks among them). With two or more, a test answered by any
 * one proves a alive, so one dead sibling cannot fail a healthy NIC, and the fast
 * test (a request stuck for a scan period, the 20 ms floor) is sound. With one, the
 * test cannot tell which of the two died when the live one's traffic stops behind
 * the dead one's (a ring): a dead sibling that has nothing queued looks like a
 * witness. Such a NIC is tested as before the fast test: suspected only beyond
 * ONE_SIBLING_FLOOR_X x the floor (100 ms by default) and its test waits 1.5 x
 * that plus two largest requests in service at each end, by which time a dead
 * sibling shows as one with work that completes nothing. Any thread.
 */
/* Could a test of a go through b: another NIC of this process, UP, with its mirror. */
static bool sibling_usable(const struct r2cc_nic *a, struct r2cc_nic *b)
{
	return b && b != a && __atomic_load_n(&b->state, __ATOMIC_RELAXED) == R2CC_NIC_UP &&
	       r2cc_mr_mirror_pd(b) && r2cc_ctx_of_nic(b);
}

int r2cc_selftest_witnesses(const struct r2cc_nic *a)
{
	int n = r2cc_nic_count(), k = 0;
	for (int i = 0; i < n && k < 2; i++)
		k += sibling_usable(a, r2cc_nic_by_index(i));
	return k;
}

#define FAR_WITNESS_BITS 0xaaaa /* the sibling's far writes (odd bits) */

/* Whether the test has the fast timing: two siblings or more, or one and a far
 * witness write posted (repair/farprobe.c). */
static bool selftest_fast(const struct selftest *t)
{
	return t->nb >= 2 || (t->far_posted & FAR_WITNESS_BITS);
}

/* The test's wait for an answer: R2CC_STALL_MS x 6/5 with the fast timing, 1.5 x
 * the one-sibling floor without. */
static int64_t selftest_base_ns(const struct selftest *t)
{
	return selftest_fast(t) ? r2cc_scan_floor() * 6 / 5
				: ONE_SIBLING_FLOOR_X * r2cc_scan_floor() * 3 / 2;
}

/* How long the test waits for its answer before the NIC's progress is looked at:
 * the base time, and the write's wait for its turn. With the fast timing, one turn
 * for each QP with work at the busier end (r2cc_stall_turn_ns: the write has a QP of
 * its own, which the NIC serves in turn with the data's, a slice or a packet at a
 * time, not behind a whole request; the tests that passed on the soft device
 * answered within 0.1 ms without jitter and within 19.3 ms with up to 20 ms of it,
 * at 1-10 Gb/s: logs/stall/detection.md); a real port under incast queues the write
 * behind what is in flight to it, which the base's fifth covers (16 MB of switch
 * buffer is 1.3 ms at 100 Gb/s). Without the fast timing, the largest request in
 * service at each end, as before the fast test. */
static int64_t selftest_window(const struct selftest *t)
{
	bool fast = selftest_fast(t);
	int64_t w = 0;
	for (int i = 0; i < t->nb; i++) {
		int64_t x =
		    fast ? r2cc_stall_turn_ns(t->b[i]) : r2cc_stall_explained_ns(t->b[i], 0, 0);
		w = x > w ? x : w;
	}
	int64_t a = fast ? r2cc_stall_turn_ns(t->a) : r2cc_stall_explained_ns(t->a, 0, 0);
	if (fast)
		return selftest_base_ns(t) + (a > w ? a : w);
	return selftest_base_ns(t) + a + w;
}

/* The pair answered each other: each witnesses the other's tests from now on. */
static void selftest_reached(const struct selftest *t, int i)
{
	int a = t->a->index;
	int b = i >= 0 && i < t->nb ? t->b[i]->index : -1;
	if (a >= 0 && a < R2CC_STALL_MAX_NICS && b >= 0 && b < R2CC_STALL_MAX_NICS) {
		__atomic_fetch_or(&st_nic[a].reach, 1ull << b, __ATOMIC_RELAXED);
		__atomic_fetch_or(&st_nic[b].reach, 1ull << a, __ATOMIC_RELAXED);
	}
}

/* Alive, and the others' answers waited for long enough. */
static bool ok_at(struct selftest *t, int64_t now)
{
	if (!t->ok_ns)
		t->ok_ns = now;
	return now - t->ok_ns >= SELFTEST_AWAKE_NS;
}

/*
 * One signalled zero-byte write from a to every sibling at once; an answer from
 * any of them means a is alive. -1 inconclusive, 0 alive, 1 dead. A calibration
 * (RoCE) waits one window for every sibling's answer, to learn each pair the
 * fabric routes, and never calls the NIC dead: it runs when the NIC's first QP is
 * connected, idle or not, and must not hold the NIC's next test back for long.
 */
static int selftest_run(struct selftest *t)
{
	int posted = 0;
	for (int i = 0; i < t->nb; i++)
		if (t->qa[i] &&
		    r2cc_post_zero_write(t->ca, t->qa[i], t->seq << 8 | (uint64_t)(i + 1)) == 0)
			posted |= 1 << i;
	int far_posted = 0;
	for (int k = 0; k < t->nfar; k++)
		for (int j = 0; j < 2; j++)
			if (t->far[k]->qp[j] &&
			    r2cc_post_zero_write(j ? t->cb[0] : t->ca, t->far[k]->qp[j],
						 t->seq << 8 | (uint64_t)(0x80 | k << 1 | j)) == 0)
				far_posted |= 1 << (2 * k + j);
	t->far_posted = far_posted;
	if (far_posted & FAR_WITNESS_BITS)
		__atomic_add_fetch(&r2cc_eng.selftests_far, 1, __ATOMIC_RELAXED);
	if (!posted)
		return -1;
	int64_t start = now_ns(), until = start + selftest_window(t), last = start;
	t->window_ns = until - start;
	t->posted_at = start;
	uint64_t db[SELFTEST_SIBLINGS];
	bool b_busy[SELFTEST_SIBLINGS];
	for (int i = 0; i < t->nb; i++) {
		db[i] = r2cc_stall_drained(t->b[i]);
		b_busy[i] = r2cc_stall_queued(t->b[i]) > 0;
	}
	int answered = 0; /* with an error: a congested fabric can give one too */
	bool ok = false;  /* some sibling answered */
	for (;;) {
		/* Only time on a CPU counts: a thread kept off it (a loaded node) has
		 * not waited for the answer meanwhile, and neither, maybe, has the
		 * device's or the application's thread that would show it. */
		int64_t now = now_ns();
		if (now - last > SELFTEST_AWAKE_NS)
			until += now - last - SELFTEST_AWAKE_NS;
		last = now;
		bool late = now >= until;
		/* polled once more after the deadline: this thread may have been
		 * off the CPU while an answer came */
		struct ibv_wc wc[SELFTEST_SIBLINGS];
		int n = answered == posted ? 0 : t->ca->poll_cq(t->cqa, SELFTEST_SIBLINGS, wc);
		for (int k = 0; k < n; k++) {
			int i = (int)(wc[k].wr_id & 0xff) - 1;
			if (wc[k].wr_id >> 8 != t->seq || i < 0 || i >= t->nb)
				continue; /* an earlier test's late answer */
			answered |= 1 << i;
			if (wc[k].status != IBV_WC_SUCCESS)
				continue;
			/* the pair's QPs talk both ways: a witness for either */
			selftest_reached(t, i);
			t->okmask |= 1 << i;
			if (!ok)
				t->answer_ns = now - start;
			ok = true;
		}
		for (int k = 0; k < t->nfar; k++)
			for (int j = 0; j < 2; j++) {
				int bit = 1 << (2 * k + j);
				struct r2cc_ctx *c = j ? t->cb[0] : t->ca;
				struct ibv_wc fw;
				if (!(far_posted & bit) || (t->far_answered & bit) ||
				    c->poll_cq(t->far[k]->cq[j], 1, &fw) != 1 ||
				    fw.wr_id >> 8 != t->seq)
					continue;
				t->far_answered |= bit;
				if (fw.status != IBV_WC_SUCCESS)
					continue;
				t->far_okmask |= bit;
				if (j == 0 && !ok)
					t->answer_ns = now - start;
				ok = ok || j == 0; /* a answered through the fabric */
			}
		t->posted = posted;
		t->answered = answered;
		bool all = answered == posted && t->far_answered == far_posted;
		/* alive; the other siblings' answers are waited for a moment, so that
		 * the pairs can be kept (nothing of theirs outstanding) */
		if (ok && (all || (!t->calibrate && ok_at(t, now))))
			return 0;
		if (__atomic_load_n(&r2cc_eng.stop, __ATOMIC_RELAXED))
			return -1; /* the process is exiting */
		if (!late) {
			usleep(200);
			continue;
		}
		if (t->calibrate)
			return ok ? 0 : -1;
		/* No answer by the deadline (or only errors): the NIC's own progress
		 * decides, once the load model has been brought up to date meanwhile.
		 * It must have completed nothing for a whole window: one that drained
		 * within it (work that left before a failure) is given a window from
		 * that last drain. A sibling that had work and completed none since the
		 * test began, or failed lately (in any process of the node), is no
		 * witness. */
		int64_t drain = r2cc_stall_last_drain(t->a);
		if (drain > until - selftest_window(t)) {
			/* every write came back with an error while the NIC drained: no
			 * more evidence will come from this test */
			if (all)
				return -1;
			until = drain + selftest_window(t);
			continue;
		}
		bool fresh = r2cc_stall_updated() > until - selftest_base_ns(t) / 2,
		     witness = false;
		for (int i = 0; i < t->nb; i++) {
			b_busy[i] = b_busy[i] || r2cc_stall_queued(t->b[i]) > 0;
			witness = witness ||
				  ((posted >> i & 1) &&
				   !(b_busy[i] && r2cc_stall_drained(t->b[i]) == db[i]) &&
				   !nic_failed_lately(t->b[i]) && selftest_reaches(t->a, t->b[i]));
		}
		/* a far witness: the sibling reached a's peer NIC, which a did not */
		witness =
		    witness || ((t->far_okmask & FAR_WITNESS_BITS) && !nic_failed_lately(t->b[0]));
		if (fresh && witness) {
			t->run_ns = now_ns() - start;
			return 1; /* it completed nothing (busy or idle) and its tests went
				   * unanswered by siblings that are not stuck themselves */
		}
		if (now_ns() - start >= SELFTEST_MAX_NS || (fresh && all))
			return -1;
		/* the model lags, or no sibling is a witness yet: a while longer */
		until = now_ns() + selftest_window(t);
		last = now_ns();
	}
}

static void selftest_free(struct selftest *t)
{
	for (int i = 0; i < t->nb; i++) {
		r2cc_destroy_private(t->qa[i], NULL);
		r2cc_destroy_private(t->qb[i], t->cqb[i]);
	}
	r2cc_destroy_private(NULL, t->cqa);
	__atomic_store_n(&t->a->selftest, 0, __ATOMIC_RELEASE);
	free(t);
}

/* The NIC's kept QP pairs, or those of them not through the NICs in keep (NULL:
 * all of them, and its CQ), destroyed. Its test thread. */
static void cache_drop(struct st_cache *c, const struct selftest *keep)
{
	for (int j = 0; j < SELFTEST_SIBLINGS; j++) {
		bool kept = false;
		for (int i = 0; keep && i < keep->nb; i++)
			kept = kept || keep->b[i] == c->b[j];
		if (!c->b[j] || kept)
			continue;
		r2cc_destroy_private(c->qa[j], NULL);
		r2cc_destroy_private(c->qb[j], c->cqb[j]);
		c->b[j] = NULL;
		c->qa[j] = c->qb[j] = NULL;
		c->cqb[j] = NULL;
	}
	if (!keep) {
		r2cc_destroy_private(NULL, c->cqa);
		c->cqa = NULL;
	}
}

/* The cache of the NIC a test's QPs may come from and go back to: a stall test's
 * (not a calibration's or a failback's, which run rarely and on NICs in doubt). */
static struct st_cache *cache_of(const struct selftest *t)
{
	int i = t->a->index;
	return !t->calibrate && !t->failback && i >= 0 && i < R2CC_STALL_MAX_NICS ? &st_cache[i]
										  : NULL;
}

/* Takes what the cache has for this test: its CQ and the pairs through its siblings
 * (the rest is destroyed); all of it when a NIC involved failed since it was made. */
static void cache_take(struct selftest *t, struct st_cache *c)
{
	bool stale = c->cqa && r2cc_nic_failure_at(t->a->index) >= c->built;
	for (int j = 0; j < SELFTEST_SIBLINGS; j++)
		stale = stale || (c->b[j] && r2cc_nic_failure_at(c->b[j]->index) >= c->built);
	if (stale)
		cache_drop(c, NULL);
	cache_drop(c, t);
	t->seq = ++c->seq;
	t->cqa = c->cqa;
	c->cqa = NULL;
	for (int j = 0; j < SELFTEST_SIBLINGS; j++)
		for (int i = 0; c->b[j] && i < t->nb; i++)
			if (t->b[i] == c->b[j]) {
				t->qa[i] = c->qa[j];
				t->qb[i] = c->qb[j];
				t->cqb[i] = c->cqb[j];
				c->b[j] = NULL;
				c->qa[j] = c->qb[j] = NULL;
				c->cqb[j] = NULL;
			}
}

/* After the test: its CQ and every pair whose write completed successfully go back
 * to the cache (nothing of theirs is outstanding); the rest is left to
 * selftest_free. A NIC that failed keeps nothing. */
static void cache_put(struct selftest *t, struct st_cache *c, int verdict)
{
	if (verdict == 1 || !t->cqa || t->answered != t->posted)
		return;
	int64_t now = now_ns();
	if (!c->cqa)
		c->built = now;
	c->cqa = t->cqa;
	t->cqa = NULL;
	for (int i = 0, j = 0; i < t->nb; i++) {
		if (!(t->okmask >> i & 1) || !t->qa[i])
			continue;
		while (j < SELFTEST_SIBLINGS && c->b[j])
			j++;
		if (j == SELFTEST_SIBLINGS)
			break;
		c->b[j] = t->b[i];
		c->qa[j] = t->qa[i];
		c->qb[j] = t->qb[i];
		c->cqb[j] = t->cqb[i];
		t->qa[i] = t->qb[i] = NULL;
		t->cqb[i] = NULL;
	}
}

/* The QP pairs of the test that it did not take from the cache. */
static void selftest_build(struct selftest *t)
{
	struct ibv_qp_init_attr ia = {
	    .qp_type = IBV_QPT_RC,
	    .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
	if (!t->cqa) {
		t->cqa = r2cc_eng.v.create_cq(t->ca->ctx, 4 * SELFTEST_SIBLINGS, NULL, NULL, 0);
		if (t->cqa)
			r2cc_own_add(t->cqa);
	}
	for (int i = 0; i < t->nb && t->cqa; i++) {
		if (t->qa[i])
			continue; /* kept from an earlier test */
		t->cqb[i] = r2cc_eng.v.create_cq(t->cb[i]->ctx, 8, NULL, NULL, 0);
		if (!t->cqb[i])
			continue;
		r2cc_own_add(t->cqb[i]);
		ia.send_cq = ia.recv_cq = t->cqa;
		t->qa[i] = r2cc_eng.v.create_qp(r2cc_mr_mirror_pd(t->a), &ia);
		ia.send_cq = ia.recv_cq = t->cqb[i];
		t->qb[i] = r2cc_eng.v.create_qp(r2cc_mr_mirror_pd(t->b[i]), &ia);
		if (t->qa[i])
			r2cc_own_add(t->qa[i]);
		if (t->qb[i])
			r2cc_own_add(t->qb[i]);
		if (!t->qa[i] || !t->qb[i] ||
		    selftest_connect(t->qa[i], t->a, t->b[i], t->cb[i], t->qb[i]->qp_num) ||
		    selftest_connect(t->qb[i], t->b[i], t->a, t->ca, t->qa[i]->qp_num)) {
			r2cc_destroy_private(t->qa[i], NULL);
			r2cc_destroy_private(t->qb[i], NULL);
			t->qa[i] = t->qb[i] = NULL;
		}
	}
}

/* The next stall test of NIC i after one that did not fail: a short back-off, doubled
 * while the NIC completes nothing between tests (one long request in service), up to
 * R2CC_STALL_MS. Its test thread; next is read by the repair thread. */
static void selftest_backoff(int i)
{
	int64_t now = now_ns(), b = st_nic[i].backoff;
	bool drained = r2cc_stall_last_drain(r2cc_nic_by_index(i)) > st_nic[i].passed_at;
	b = !b || drained ? SELFTEST_BACKOFF_NS : 2 * b;
	if (b > r2cc_scan_floor())
		b = r2cc_scan_floor();
	st_nic[i].backoff = b;
	st_nic[i].passed_at = now;
	__atomic_store_n(&st_nic[i].next, now + b, __ATOMIC_RELAXED);
}

static void *selftest_main(void *arg)
{
	struct selftest *t = arg;
	int verdict = -1;
	if (t->nb >= 1 && !t->calibrate && !t->failback)
		t->nfar = r2cc_far_prepare(t->a, t->b[0], t->far, t->far_only);
	if (t->far_only) {
		R2CC_INFO("repair: %s: far probes through %s to %d peer NIC(s) %s", t->a->name,
			  t->b[0]->name, t->nfar,
			  t->nfar ? "ready" : "not set up (tried again later)");
		selftest_free(t);
		__atomic_sub_fetch(&r2cc_eng.selftests, 1, __ATOMIC_ACQ_REL);
		return NULL;
	}
	struct st_cache *c = cache_of(t);
	if (c)
		cache_take(t, c);
	selftest_build(t);
	if (t->cqa)
		verdict = selftest_run(t);
	if (c)
		cache_put(t, c, verdict);
	/* far pairs whose writes did not both come back successfully are not kept */
	for (int k = 0; k < t->nfar; k++) {
		int mine = t->far_posted >> (2 * k) & 3, good = t->far_okmask >> (2 * k) & 3;
		if (verdict == 1 || mine != good)
			r2cc_far_drop(t->a, t->far[k]);
	}
	char through[3 * R2CC_NIC_NAME_MAX] = "";
	for (int i = 0; i < t->nb; i++)
		snprintf(through + strlen(through), sizeof(through) - strlen(through), "%s%s",
			 i ? "," : "", t->b[i]->name);
	int i = t->a->index;
	bool indexed = i >= 0 && i < R2CC_STALL_MAX_NICS;
	if (t->failback) {
		if (indexed)
			r2cc_failback_verdict(i, verdict);
	} else if (verdict == 1) {
		__atomic_add_fetch(&r2cc_eng.selftests_failed, 1, __ATOMIC_RELAXED);
		char why[320];
		snprintf(why, sizeof(why),
			 "self-test through %.60s%s got no answer and the NIC completed nothing "
			 "(%.100s; tested for %.0f ms, window %.0f ms)",
			 through,
			 t->far_okmask & FAR_WITNESS_BITS
			     ? " and its peer NIC (which the sibling reached)"
			     : "",
			 t->why, (double)t->run_ns / 1e6, (double)t->window_ns / 1e6);
		r2cc_nic_failed(t->a, why);
	} else {
		static unsigned long logged;
		__atomic_add_fetch(verdict ? &r2cc_eng.selftests_inconclusive
					   : &r2cc_eng.selftests_passed,
				   1, __ATOMIC_RELAXED);
		if (verdict || __atomic_fetch_add(&logged, 1, __ATOMIC_RELAXED) < 32)
			R2CC_INFO("repair: %s: self-test through %s %s (%s)", t->a->name, through,
				  verdict == 0 ? "passed: the NIC is alive" : "inconclusive",
				  t->why);
		if (indexed && !t->calibrate)
			selftest_backoff(i);
		if (verdict == 0)
			r2cc_atomic_max_i64(&r2cc_eng.selftest_answer_max_ns, t->answer_ns,
					    __ATOMIC_RELAXED);
		if (verdict == 0 && indexed && !t->calibrate)
			r2cc_atomic_max_i64(&st_nic[i].alive_from, t->posted_at, __ATOMIC_RELEASE);
	}
	selftest_free(t);
	__atomic_sub_fetch(&r2cc_eng.selftests, 1, __ATOMIC_ACQ_REL);
	return NULL;
}

/* The siblings to test through: UP NICs of this process with their mirror,
 * those that completed work most recently first, and none with a failure seen
 * lately while there are others (a sibling that is itself dead would fail the
 * test of a healthy NIC). */
static void selftest_siblings(struct selftest *t)
{
	int n = r2cc_nic_count();
	for (int pass = 0; pass < 2 && t->nb < SELFTEST_SIBLINGS; pass++)
		while (t->nb < SELFTEST_SIBLINGS) {
			struct r2cc_nic *best = NULL;
			for (int i = 0; i < n; i++) {
				struct r2cc_nic *b = r2cc_nic_by_index(i);
				bool taken = false;
				for (int j = 0; j < t->nb; j++)
					taken = taken || t->b[j] == b;
				if (taken || !sibling_usable(t->a, b) ||
				    (pass == 0 && nic_failed_lately(b)))
					continue;
				if (!best || r2cc_stall_last_drain(b) > r2cc_stall_last_drain(best))
					best = b;
			}
			if (!best)
				break;
			t->cb[t->nb] = r2cc_ctx_of_nic(best);
			t->b[t->nb++] = best;
		}
}
static void selftest_launch(struct r2cc_nic *a, const char *why, bool stall, bool calibrate)
{
	if (__atomic_load_n(&a->state, __ATOMIC_RELAXED) != R2CC_NIC_UP)
		return;
	int i = a->index;
	if (stall && i >= 0 && i < R2CC_STALL_MAX_NICS &&
	    now_ns() < __atomic_load_n(&st_nic[i].next, __ATOMIC_RELAXED))
		return;
	r2cc_selftest_spawn(a, why, calibrate, false);
}

/* A self-test thread for a (unless one runs): true if it was started. */
static bool selftest_spawn(struct r2cc_nic *a, const char *why, bool calibrate, bool failback,
			   bool far_only)
{
	int zero = 0;
	if (!__atomic_compare_exchange_n(&a->selftest, &zero, 1, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_RELAXED))
		return false;
	struct selftest *t = calloc(1, sizeof(*t));
	if (t) {
		t->a = a;
		t->calibrate = calibrate;
		t->failback = failback;
		t->far_only = far_only;
		selftest_siblings(t);
		snprintf(t->why, sizeof(t->why), "%s", why ? why : "");
	}
	pthread_t th;
	if (t && t->nb && r2cc_mr_mirror_pd(a) && (t->ca = r2cc_ctx_of_nic(a))) {
		pthread_attr_t at;
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		/* counted first: the thread may end before pthread_create returns */
		__atomic_add_fetch(&r2cc_eng.selftests, 1, __ATOMIC_ACQ_REL);
		int rc = __atomic_load_n(&r2cc_eng.stop, __ATOMIC_ACQUIRE)
			     ? EAGAIN
			     : pthread_create(&th, &at, selftest_main, t);
		if (rc)
			__atomic_sub_fetch(&r2cc_eng.selftests, 1, __ATOMIC_ACQ_REL);
		pthread_attr_destroy(&at);
		if (rc == 0) {
			pthread_setname_np(th, "r2cc-selftest");
			return true;
		}
	}
	free(t);
	__atomic_store_n(&a->selftest, 0, __ATOMIC_RELEASE);
	return false;
}

bool r2cc_selftest_spawn(struct r2cc_nic *a, const char *why, bool calibrate, bool failback)
{
	return selftest_spawn(a, why, calibrate, failback, false);
}

/* The warm-up of a NIC's far pairs (repair/farprobe.c), on a test thread of its
 * own: true if it was started. */
bool r2cc_selftest_spawn_far(struct r2cc_nic *a)
{
	if (__atomic_load_n(&a->state, __ATOMIC_RELAXED) != R2CC_NIC_UP)
		return false;
	return selftest_spawn(a, "far probes", false, false, true);
}

int64_t r2cc_selftest_alive_from(const struct r2cc_nic *a)
{
	int i = a ? a->index : -1;
	return i >= 0 && i < R2CC_STALL_MAX_NICS
		   ? __atomic_load_n(&st_nic[i].alive_from, __ATOMIC_ACQUIRE)
		   : 0;
}

void r2cc_selftest_start(struct r2cc_nic *a, const char *why, bool stall)
{
	selftest_launch(a, why, stall, false);
}

/* RoCE: learns which siblings' self-test QPs answer this NIC's (a fabric routes
 * between rails, or not), at most once a second until one has; before that, no
 * self-test of the NIC is conclusive. Once NCCL's first QP on it is connected. */
void r2cc_selftest_calibrate(struct r2cc_nic *a)
{
	int i = a->index;
	if (a->link_layer != IBV_LINK_LAYER_ETHERNET || i < 0 || i >= R2CC_STALL_MAX_NICS ||
	    __atomic_load_n(&st_nic[i].reach, __ATOMIC_RELAXED) ||
	    !__atomic_load_n(&a->roce_known, __ATOMIC_ACQUIRE))
		return;
	int64_t t = now_ns(), last = __atomic_load_n(&st_nic[i].calib_at, __ATOMIC_RELAXED);
	if ((last && t - last < 1000000000ll) ||
	    !__atomic_compare_exchange_n(&st_nic[i].calib_at, &last, t, false, __ATOMIC_RELAXED,
					 __ATOMIC_RELAXED))
		return;
	selftest_launch(a, "which siblings answer it (RoCE)", false, true);
}
