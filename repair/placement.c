/*
 * Placement: the NIC a QP moves to, among the NICs that are up. Mode 1 takes the
 * first in the registry's order (the peer's rail first), mode 2 (Balance) the least
 * loaded for the QP's direction, counted over the whole node (the ledger of
 * ledger.h); NICs with recent evidence against them, or that this QP's path failed
 * on lately, come last.
 */
#include "repair/engine_priv.h"

#include <string.h>
#include <unistd.h>

/* Which way a QP's data goes: NCCL's send-side QPs post the data, its receive-side
 * QPs post receives (and small clear-to-send writes). Balancing each kind on its
 * own keeps both directions of every NIC even. NCCL gives receive-side QPs remote
 * atomic access at INIT (send-side ones only remote write), which tells them apart
 * before the first post; receives posted tell it too. Only of a QP NCCL has brought
 * to RTS (ready: its INIT attributes are written, by NCCL's thread, before that). */
bool r2cc_rqp_receiving(const struct r2cc_rqp *r)
{
	const struct r2cc_qp *q = r2cc_rqp_qp(r);
	return q && __atomic_load_n(&r->ready, __ATOMIC_ACQUIRE) &&
	       ((q->access & IBV_ACCESS_REMOTE_ATOMIC) || r2cc_qp_received(q));
}

static int nic_load(const struct r2cc_nic *nic, bool rx)
{
	int n = 0;
	pthread_mutex_lock(&r2cc_eng.mu);
	for (struct r2cc_rqp *r = r2cc_eng.all; r; r = r->next_all)
		if (!r->dead && __atomic_load_n(&r->ready, __ATOMIC_ACQUIRE) &&
		    r2cc_rqp_receiving(r) == rx &&
		    (r->new_ctx && r->new_qp ? r->new_ctx->nic : r->cur_nic) == nic)
			n++; /* a path being built counts where it goes */
	pthread_mutex_unlock(&r2cc_eng.mu);
	return n;
}
struct ibv_pd *r2cc_pd_on(struct r2cc_rqp *r, struct r2cc_nic *nic)
{
	return nic == r->orig_nic ? r->q->qp->pd : r2cc_mr_mirror_pd(nic);
}

/* Normally another NIC than the QP's own and its current one; as a last resort
 * (nothing else is up) those too, if their port is up: a stall can be a false
 * alarm, and a fresh QP pair on the same NICs then just works. */
bool r2cc_nic_usable(struct r2cc_rqp *r, struct r2cc_nic *nic, bool last_resort)
{
	if (!nic || __atomic_load_n(&nic->state, __ATOMIC_RELAXED) != R2CC_NIC_UP ||
	    !r2cc_pd_on(r, nic) || !(nic == r->orig_nic ? r->orig_ctx : r2cc_ctx_of_nic(nic)))
		return false;
	return last_resort || (nic != r->orig_nic && nic != r->cur_nic);
}

/* Per NIC (registry index), when QPs of this process last left a path on it
 * because the path failed (r2cc_left_failed): the placement's evidence against a NIC
 * that every candidate QP has failed on lately. */
#define NIC_LEFT_RING 16
static struct {
	unsigned n;
	int64_t t[NIC_LEFT_RING];
} nic_left[R2CC_MAX_NICS];

/* The NIC r is on showed a failure of its path (an error completion of the
 * transport, a failed self-test): r avoids it for CHURN_NS. A NIC whose black hole
 * r's transport has just found is otherwise often r's first choice at its next
 * move (asked by its peer, say), where it fails again, and enough such moves make
 * its repair give up (churning). The NIC itself stays up for the other QPs: the
 * fault may be the peer's, or one path's. */
void r2cc_left_failed(struct r2cc_rqp *r)
{
	int64_t now = now_ns();
	r->left[r->nleft % LEFT_RING] = (struct left_nic){r->cur_nic, now};
	r->nleft++;
	int i = r->cur_nic ? r->cur_nic->index : -1;
	if (i >= 0 && i < R2CC_MAX_NICS) {
		unsigned k = __atomic_fetch_add(&nic_left[i].n, 1, __ATOMIC_RELAXED);
		__atomic_store_n(&nic_left[i].t[k % NIC_LEFT_RING], now, __ATOMIC_RELAXED);
	}
}

/* How many QPs of this process left a path on nic because it failed, within
 * CHURN_NS (up to NIC_LEFT_RING). */
static int nic_left_lately(const struct r2cc_nic *nic)
{
	if (!nic || nic->index < 0 || nic->index >= R2CC_MAX_NICS)
		return 0;
	int64_t now = now_ns();
	int n = 0;
	for (int k = 0; k < NIC_LEFT_RING; k++) {
		int64_t t = __atomic_load_n(&nic_left[nic->index].t[k], __ATOMIC_RELAXED);
		n += t && now - t < CHURN_NS;
	}
	return n;
}

static bool failed_on_lately(const struct r2cc_rqp *r, const struct r2cc_nic *nic)
{
	int64_t now = now_ns();
	for (int i = 0; i < LEFT_RING; i++)
		if (r->left[i].nic == nic && r->left[i].t && now - r->left[i].t < CHURN_NS)
			return true;
	return false;
}

/* Placement passes, in order: another NIC than the QP's own and its current one,
 * and not one it failed on lately; then its own or current one too (a fresh QP
 * pair on the same NICs), still not one it failed on lately; then any NIC that is
 * up. */
static bool nic_usable_pass(struct r2cc_rqp *r, struct r2cc_nic *nic, int pass)
{
	if (!r2cc_nic_usable(r, nic, pass > 0))
		return false;
	return pass == 2 || !failed_on_lately(r, nic);
}

/* The node ledger (repair/model/ledger.h), opened once the job is known: by the
 * stall scan (the node's NIC verdicts go through it from the start) or at the first
 * placement (from which on the stall scan also reads the node's load there); its
 * counts read 0 without it. */
void r2cc_place_ledger_use(void)
{
	pthread_mutex_lock(&r2cc_eng.mu);
	uint64_t job = r2cc_eng.ndirs > 0 ? r2cc_eng.dirs[0]->job.id : 0;
	pthread_mutex_unlock(&r2cc_eng.mu);
	if (job) {
		char key[256];
		r2cc_ledger_open(job, r2cc_node_key(key, sizeof(key)));
	}
}

/* This QP now counts on nic (NULL: on none) in the node's ledger. */
void r2cc_place_ledger_move(struct r2cc_rqp *r, struct r2cc_nic *nic, int dir)
{
	if (r->ledger_nic)
		r2cc_ledger_add(r->ledger_nic->name, r->ledger_dir, -1);
	r->ledger_nic = nic;
	r->ledger_dir = dir;
	if (nic)
		r2cc_ledger_add(nic->name, dir, 1);
}

/* Evidence against nic at a placement pass: whether QPs of this process left a
 * path on it for a failure lately; at the last pass, where every NIC up is a
 * candidate, how many did (the NIC most of them fled is the likely culprit,
 * though it is not down: the fault may be a peer's or one path's). */
static int place_evidence(const struct r2cc_nic *nic, int pass)
{
	int n = nic_left_lately(nic);
	return pass == 2 ? n : n > 0;
}

/* A candidate NIC, compared in this order: the evidence against it, the QPs
 * the node has moved onto it, this process's QPs on it, off the peer's rail. */
struct place_key {
	int evidence, node, load, off_rail;
};

static bool place_key_less(const struct place_key *a, const struct place_key *b)
{
	if (a->evidence != b->evidence)
		return a->evidence < b->evidence;
	if (a->node != b->node)
		return a->node < b->node;
	if (a->load != b->load)
		return a->load < b->load;
	return a->off_rail < b->off_rail;
}

/* Within a pass, a NIC without such evidence first (place_evidence). Then:
 * Mode 1: the first usable NIC (the peer's rail first, when it asked for one).
 * Mode 2 and up, for this QP's direction: the NIC the node's R2CC processes
 * have moved the fewest QPs onto (the node ledger), then the one with the
 * fewest of this process's QPs, then the peer's rail. Each node balances its
 * own NICs, and a node whose NIC failed does not inherit the healthy side's
 * choices (NCCL pairs NICs across rails anyway). The choice is entered in the
 * ledger at once, so that a placement running at the same moment in another
 * process of the node sees it. */
struct r2cc_nic *r2cc_place(struct r2cc_rqp *r, const char *rail)
{
	int n = r2cc_nic_count();
	bool want_rail = rail && rail[0];
	for (int pass = 0; pass < 3; pass++) {
		if (r2cc_param.mode == 1) {
			struct r2cc_nic *first = NULL;
			struct place_key first_key = {0};
			for (int i = 0; i < n; i++) {
				struct r2cc_nic *nic = r2cc_nic_by_index(i);
				if (!nic_usable_pass(r, nic, pass))
					continue;
				struct place_key key = {place_evidence(nic, pass), 0, 0,
							!(want_rail && !strcmp(nic->name, rail))};
				if (!first || place_key_less(&key, &first_key)) {
					first = nic;
					first_key = key;
				}
			}
			if (first)
				return first;
			continue;
		}
		r2cc_place_ledger_use();
		r2cc_stall_node_load();
		struct r2cc_nic *best = NULL;
		struct place_key best_key = {0};
		/* Ties go round from a per-process start, so that the processes of a
		 * node do not all pick the same one. */
		int start = n > 0 ? (int)(getpid() % n) : 0;
		bool rx = r2cc_rqp_receiving(r);
		for (int k = 0; k < n; k++) {
			struct r2cc_nic *nic = r2cc_nic_by_index((start + k) % n);
			if (!nic_usable_pass(r, nic, pass))
				continue;
			struct place_key key = {place_evidence(nic, pass),
						r2cc_ledger_get(nic->name, rx), nic_load(nic, rx),
						!(want_rail && !strcmp(nic->name, rail))};
			if (!best || place_key_less(&key, &best_key)) {
				best = nic;
				best_key = key;
			}
		}
		if (best) {
			r2cc_place_ledger_move(r, best, rx);
			return best;
		}
	}
	return NULL;
}

/* The registry has no NIC -> context index: find one of NCCL's contexts through
 * the mirror's PD, which was allocated on it. */
struct r2cc_ctx *r2cc_ctx_of_nic(struct r2cc_nic *nic)
{
	struct ibv_pd *pd = r2cc_mr_mirror_pd(nic);
	return pd ? r2cc_ctx_find(pd->context) : NULL;
}
