/* The node's load model for the stall scan (see stall.h). */
#include "repair/model/stall.h"
#include "repair/model/ledger.h"

#define WINDOW_NS  100000000ll	 /* busy time one rate sample covers */
#define HORIZON_NS 10000000000ll /* samples older than this are forgotten */
#define SAMPLES	   (HORIZON_NS / WINDOW_NS)
#define MARGIN	   2
#define SLOWEST	   125000000ull /* bytes/s assumed when a port reports no speed: 1 Gb/s */
#define TURN_BYTES 65536ull	/* the most a NIC serves one QP before the next one's turn */

struct nic_load {
	/* this process, written by the repair thread */
	uint64_t own_queued, own_drained;
	uint32_t own_max, own_busy;
	/* the node, as of the last scan (atomics: the self-test thread reads them) */
	uint64_t queued, drained;
	int64_t last_drain;
	uint64_t rate; /* bytes/s, 0 until measured */
	uint32_t max_request;
	uint32_t busy; /* QPs with work queued (this process's, scaled to the node's bytes) */
	/* the rate estimate, repair thread only */
	uint64_t prev_drained, prev_queued;
	int64_t prev_t;
	int64_t win_busy;
	uint64_t win_bytes;
	int64_t stalled; /* busy time since the last drain: service only once one follows */
	uint64_t sample[SAMPLES];
	int64_t sample_t[SAMPLES];
	int nsample;
};

static struct nic_load load[R2CC_STALL_MAX_NICS];
static int64_t updated;
static bool node_load; /* the node's load from the ledger (repair thread) */

void r2cc_stall_node_load(void)
{
	node_load = true;
}

static struct nic_load *of(const struct r2cc_nic *nic)
{
	return nic && nic->index >= 0 && nic->index < R2CC_STALL_MAX_NICS ? &load[nic->index]
									  : NULL;
}

void r2cc_stall_scan_begin(void)
{
	for (int i = 0; i < R2CC_STALL_MAX_NICS; i++)
		load[i].own_queued = load[i].own_busy = 0;
}

void r2cc_stall_account(const struct r2cc_nic *nic, uint64_t queued, uint64_t retired_delta,
			uint32_t max_request)
{
	struct nic_load *l = of(nic);
	if (!l)
		return;
	l->own_queued += queued;
	l->own_drained += retired_delta;
	l->own_busy += queued > 0;
	if (max_request > l->own_max)
		l->own_max = max_request;
}

static void add_sample(struct nic_load *l, uint64_t rate, int64_t now)
{
	int slot = l->nsample++ % (int)SAMPLES;
	l->sample[slot] = rate;
	l->sample_t[slot] = now;
	uint64_t best = 0;
	int n = l->nsample < (int)SAMPLES ? l->nsample : (int)SAMPLES;
	for (int i = 0; i < n; i++)
		if (now - l->sample_t[i] <= HORIZON_NS && l->sample[i] > best)
			best = l->sample[i];
	if (best)
		__atomic_store_n(&l->rate, best, __ATOMIC_RELAXED);
}

void r2cc_stall_scan_end(int64_t now)
{
	int n = r2cc_nic_count();
	if (n > R2CC_STALL_MAX_NICS)
		n = R2CC_STALL_MAX_NICS;
	for (int i = 0; i < n; i++) {
		struct r2cc_nic *nic = r2cc_nic_by_index(i);
		struct nic_load *l = &load[i];
		uint64_t q = l->own_queued, d = l->own_drained;
		if (nic && node_load) {
			r2cc_ledger_load_put(nic->name, l->own_queued, l->own_drained);
			uint64_t nq, nd;
			if (r2cc_ledger_load_get(nic->name, &nq, &nd)) {
				q = nq;
				d = nd;
			}
		}
		/* The node's count drops when a process leaves: start again from it. */
		uint64_t delta = d >= l->prev_drained ? d - l->prev_drained : 0;
		if (delta)
			__atomic_store_n(&l->last_drain, now, __ATOMIC_RELAXED);
		/* Busy time enters a sample only up to a drain: a wait that no
		 * completion has ended yet measures nothing (a black hole would
		 * otherwise lower the rate of the window it falls in, and so lengthen
		 * the very wait that is to find it); one that ends was service, however
		 * slow. */
		if (l->prev_t && l->prev_queued)
			l->stalled += now - l->prev_t;
		if (delta && l->stalled) {
			l->win_busy += l->stalled;
			l->win_bytes += delta;
			l->stalled = 0;
			if (l->win_busy >= WINDOW_NS) {
				add_sample(
				    l, (uint64_t)((double)l->win_bytes * 1e9 / (double)l->win_busy),
				    now);
				l->win_busy = 0;
				l->win_bytes = 0;
			}
		} else if (!q && !delta) {
			l->stalled = 0; /* the wait ended without a drain: moved away */
		}
		l->prev_t = now;
		l->prev_queued = q;
		l->prev_drained = d;
		__atomic_store_n(&l->queued, q, __ATOMIC_RELAXED);
		__atomic_store_n(&l->drained, d, __ATOMIC_RELAXED);
		__atomic_store_n(&l->max_request, l->own_max, __ATOMIC_RELAXED);
		/* the node's other processes' QPs, as many per byte as this one's */
		uint64_t busy = l->own_busy;
		if (l->own_queued && q > l->own_queued)
			busy = busy * q / l->own_queued;
		__atomic_store_n(&l->busy, (uint32_t)(busy < UINT32_MAX ? busy : UINT32_MAX),
				 __ATOMIC_RELAXED);
	}
	__atomic_store_n(&updated, now, __ATOMIC_RELEASE);
}

int64_t r2cc_stall_updated(void)
{
	return __atomic_load_n(&updated, __ATOMIC_ACQUIRE);
}

uint64_t r2cc_stall_queued(const struct r2cc_nic *nic)
{
	struct nic_load *l = of(nic);
	return l ? __atomic_load_n(&l->queued, __ATOMIC_RELAXED) : 0;
}

uint64_t r2cc_stall_drained(const struct r2cc_nic *nic)
{
	struct nic_load *l = of(nic);
	return l ? __atomic_load_n(&l->drained, __ATOMIC_RELAXED) : 0;
}

int64_t r2cc_stall_last_drain(const struct r2cc_nic *nic)
{
	struct nic_load *l = of(nic);
	return l ? __atomic_load_n(&l->last_drain, __ATOMIC_RELAXED) : 0;
}

double r2cc_stall_rate(const struct r2cc_nic *nic)
{
	struct nic_load *l = of(nic);
	uint64_t r = l ? __atomic_load_n(&l->rate, __ATOMIC_RELAXED) : 0;
	if (!r && nic && nic->speed_gbps > 0)
		r = (uint64_t)nic->speed_gbps * 125000000ull;
	return (double)(r ? r : SLOWEST);
}

int64_t r2cc_stall_turn_ns(const struct r2cc_nic *nic)
{
	struct nic_load *l = of(nic);
	if (!l)
		return 0;
	uint64_t big = __atomic_load_n(&l->max_request, __ATOMIC_RELAXED);
	uint64_t busy = __atomic_load_n(&l->busy, __ATOMIC_RELAXED);
	uint64_t turns = busy * (big < TURN_BYTES ? big : TURN_BYTES);
	return (int64_t)((double)(turns < big ? turns : big) * 1e9 / r2cc_stall_rate(nic));
}

int64_t r2cc_stall_explained_ns(const struct r2cc_nic *nic, uint64_t ahead, int64_t floor_ns)
{
	struct nic_load *l = of(nic);
	uint64_t big = l ? __atomic_load_n(&l->max_request, __ATOMIC_RELAXED) : 0;
	double ns = (double)MARGIN * (double)(ahead + big) * 1e9 / r2cc_stall_rate(nic);
	if (ns > 3.6e12)
		ns = 3.6e12; /* an hour: beyond that a wait is left to the transport */
	return floor_ns + (int64_t)ns;
}
