/*
 * R2CC-AllReduce: layout arithmetic, the executor over struct r2cc_ar2_ops and
 * the per-communicator state (see allreduce2.h for the contract).
 *
 * Streams. The call is joined to the user's stream U like this:
 *   U: record Start; every internal stream waits Start.
 *   SA: main AllReduce (full comm)                       -> record EvA
 *   SB: [wait EvA if schedule >= 2] tail AllReduce (healthy) -> record EvB
 *   SR: wait EvB [and EvA if schedule >= 1]; Reduce_i (aPlusH)
 *       schedule 3: Broadcast_i right after Reduce_i on SR
 *       otherwise:  record EvR[i]; SC waits EvR[i]; Broadcast_i on SC, on `bcast`
 *                   (schedule 0) or on the full comm (1, 2)
 *   every internal stream records its End event, U waits all of them.
 * Data hazards this covers: the helper's Reduce reads its stage-1 result
 * (EvB), every Broadcast overwrites the tail that the healthy AllReduce wrote
 * (EvB before SR, EvR[i] after it) and, in place, the degraded ranks' input
 * that Reduce_i reads (EvR[i]). The main part and the tail are disjoint, so
 * SA needs nothing but Start.
 *
 * Why `bcast`. NCCL runs the kernels of one communicator one after another,
 * whatever streams they are issued on. Broadcast_i on the full communicator
 * therefore cannot start before the main AllReduce has ended, and on the
 * degraded node stage 2's receiving half (the Broadcasts) follows stage 1
 * instead of overlapping it: at 2 nodes that made R2CC-AllReduce 1.65 x
 * slower than Balance with the same bytes on every NIC. Schedule 0 therefore
 * broadcasts on `bcast`, a second communicator over all ranks (split off the
 * parent with one colour), so that a NIC's two directions stay busy: stage 1
 * and the Reduces send, the Broadcasts receive, at the same time. Schedules 1
 * and 2 order stage 2 after the main AllReduce anyway and use the parent.
 *
 * Collective order. On every rank the calls are issued in one order: main
 * AllReduce, tail AllReduce (healthy ranks), then Reduce_0, Broadcast_0,
 * Reduce_1, ... (members only). Per communicator all ranks therefore issue the
 * same sequence (full: AllReduce [, Broadcast_0..K-1 without bcast]; bcast:
 * Broadcast_0..K-1; healthy: one AllReduce; aPlusH: Reduce_0..K-1), and each
 * dependency above points from an earlier issued call to a later one, so no
 * cycle of waits can form across ranks.
 * Schedules 0-2 still let kernels of different communicators be in flight on
 * one GPU together (0: everything; 1: the two stage-1 AllReduces, then
 * Reduce_i+1 with Broadcast_i; 2: only the latter) and, like any concurrent use
 * of several NCCL communicators, rely on the GPU running them side by side;
 * schedule 3 makes each rank's work a single chain and needs no such thing.
 */
#include "strategies/allreduce2.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim/log.h"

enum { S_A, S_B, S_R, S_C, NSTREAMS };
/* EV_R0 + i: after stage 2's Reduce(s) of chunk i; with several degraded nodes
 * EV_R0 + K + i: after the healthy AllReduce of chunk i. */
enum { EV_START, EV_A, EV_B, EV_END0, EV_R0 = EV_END0 + NSTREAMS };
#define NSUBS (2 + R2CC_AR2_MAX_DEGRADED) /* healthy, bcast, aPlusH_j */

enum setup_state { SETUP_NONE, SETUP_READY, SETUP_FAILED };

struct r2cc_ar2_comm {
	const struct r2cc_ar2_ops *ops;
	void *parent;
	int rank;
	struct r2cc_ar2_cfg cfg;
	struct r2cc_ar2_layout lay;
	enum setup_state setup;
	/* sub[0] healthy (NULL on degraded nodes), sub[1] bcast (one degraded node,
	 * schedule 0: every rank, for stage 2's Broadcasts), sub[2 + j] aPlusH_j
	 * (NULL where not a member) */
	void *sub[NSUBS];
	bool pinned;		/* a graph captured a call on these sub-communicators */
	unsigned long captured; /* calls run during capture, ever */
	void **kept;		/* pinned sub-communicators of earlier views */
	int nkept;
	void *stream[NSTREAMS];
	int nevents;
	void *event[EV_R0 + 2 * R2CC_AR2_MAX_CHUNKS];
};
#define SUB_HEALTHY 0
#define SUB_BCAST   1
#define SUB_DEG(j)  (2 + (j))

size_t r2cc_nccl_type_size(int dtype)
{
	switch (dtype) {
	case R2CC_NCCL_INT8:
	case R2CC_NCCL_UINT8:
	case R2CC_NCCL_FLOAT8E4M3:
	case R2CC_NCCL_FLOAT8E5M2:
		return 1;
	case R2CC_NCCL_FLOAT16:
	case R2CC_NCCL_BFLOAT16:
		return 2;
	case R2CC_NCCL_INT32:
	case R2CC_NCCL_UINT32:
	case R2CC_NCCL_FLOAT32:
		return 4;
	case R2CC_NCCL_INT64:
	case R2CC_NCCL_UINT64:
	case R2CC_NCCL_FLOAT64:
		return 8;
	default:
		return 0;
	}
}

/* ---- Layout ---- */

struct id_rank {
	int id, rank;
};

static int cmp_id_rank(const void *a, const void *b)
{
	const struct id_rank *x = a, *y = b;

	if (x->id != y->id)
		return x->id < y->id ? -1 : 1;
	return x->rank < y->rank ? -1 : x->rank > y->rank;
}

static int cmp_rank(const void *a, const void *b)
{
	const struct id_rank *x = a, *y = b;

	return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* Node index of every rank: nodes numbered in order of their first rank. */
static int number_nodes(const struct r2cc_ar2_view *view, int *idx, int *nnodes_p)
{
	struct id_rank *v, *first;
	int i, n = view->nranks, nfirst = 0, lo, hi, mid;

	v = malloc(sizeof(*v) * (size_t)n);
	first = malloc(sizeof(*first) * (size_t)n);
	if (!v || !first) {
		free(v);
		free(first);
		return -ENOMEM;
	}
	for (i = 0; i < n; i++) {
		v[i].id = view->rank_node[i];
		v[i].rank = i;
	}
	qsort(v, (size_t)n, sizeof(*v), cmp_id_rank);
	for (i = 0; i < n; i++)
		if (i == 0 || v[i].id != v[i - 1].id)
			first[nfirst++] = v[i];
	/* Number the nodes by first rank, then go back to id order for lookups;
	 * .rank now holds the node index. */
	qsort(first, (size_t)nfirst, sizeof(*first), cmp_rank);
	for (i = 0; i < nfirst; i++)
		first[i].rank = i;
	qsort(first, (size_t)nfirst, sizeof(*first), cmp_id_rank);
	for (i = 0; i < n; i++) {
		lo = 0;
		hi = nfirst - 1;
		for (;;) {
			mid = lo + (hi - lo) / 2;
			if (first[mid].id == view->rank_node[i])
				break;
			if (first[mid].id < view->rank_node[i])
				lo = mid + 1;
			else
				hi = mid - 1;
		}
		idx[i] = first[mid].rank;
	}
	free(v);
	free(first);
	*nnodes_p = nfirst;
	return 0;
}

/* The helper of each degraded node: the lowest rank of the first healthy node
 * after it in node order that helps no other degraded node yet, or, when every
 * healthy node already helps one, of the first healthy node after it. */
static void pick_helpers(struct r2cc_ar2_layout *lay, int *first_rank)
{
	bool *used = calloc((size_t)lay->nnodes, sizeof(bool));
	int j, t, node, pick;

	for (j = 0; j < lay->ndeg; j++) {
		pick = -1;
		for (t = 1; t < lay->nnodes && used; t++) {
			node = (lay->deg_node[j] + t) % lay->nnodes;
			if (lay->node_slot[node] < 0 && !used[node]) {
				pick = node;
				break;
			}
		}
		for (t = 1; t < lay->nnodes && pick < 0; t++) {
			node = (lay->deg_node[j] + t) % lay->nnodes;
			if (lay->node_slot[node] < 0)
				pick = node;
		}
		if (used)
			used[pick] = true;
		lay->deg_helper[j] = first_rank[pick];
	}
	free(used);
}

int r2cc_ar2_layout_init(struct r2cc_ar2_layout *lay, const struct r2cc_ar2_view *view)
{
	int i, j, ret, *first_rank = NULL;

	memset(lay, 0, sizeof(*lay));
	lay->degraded = -1;
	lay->helper = -1;
	lay->share_node = -1;
	if (!view || view->nranks < 1 || view->nranks > R2CC_AR2_MAX_RANKS || !view->rank_node ||
	    !view->node_nics || !view->node_failed)
		return -EINVAL;
	lay->nranks = view->nranks;
	lay->rank_node_idx = malloc(sizeof(int) * (size_t)view->nranks);
	if (!lay->rank_node_idx)
		return -ENOMEM;
	ret = number_nodes(view, lay->rank_node_idx, &lay->nnodes);
	if (ret)
		goto err_free;
	lay->node_slot = malloc(sizeof(int) * (size_t)lay->nnodes);
	first_rank = malloc(sizeof(int) * (size_t)lay->nnodes);
	ret = -ENOMEM;
	if (!lay->node_slot || !first_rank)
		goto err_free;
	for (i = 0; i < lay->nnodes; i++) {
		lay->node_slot[i] = -1;
		first_rank[i] = -1;
		if (view->node_nics[i] < 0 || view->node_failed[i] < 0 ||
		    view->node_failed[i] > view->node_nics[i]) {
			ret = -EINVAL;
			goto err_free;
		}
		if (view->node_failed[i] == 0) {
			lay->healthy_nodes++;
			continue;
		}
		/* the tail's share: the largest failed / nics (cross-multiplied) */
		if (lay->ndegraded++ == 0 || (long)view->node_failed[i] * lay->nics >
						 (long)lay->failed * view->node_nics[i]) {
			lay->nics = view->node_nics[i];
			lay->failed = view->node_failed[i];
			lay->share_node = i;
		}
		if (lay->ndeg < R2CC_AR2_MAX_DEGRADED) {
			lay->deg_node[lay->ndeg] = i;
			lay->deg_nics[lay->ndeg] = view->node_nics[i];
			lay->deg_failed[lay->ndeg] = view->node_failed[i];
			lay->node_slot[i] = lay->ndeg++;
		}
	}
	for (i = lay->nranks - 1; i >= 0; i--)
		first_rank[lay->rank_node_idx[i]] = i;
	if (lay->ndegraded == 1)
		lay->degraded = lay->deg_node[0];
	if (lay->ndegraded > R2CC_AR2_MAX_DEGRADED || lay->healthy_nodes == 0 || lay->nnodes < 2) {
		/* no schedule: every rank is a member of nothing */
		for (i = 0; i < lay->nnodes; i++)
			lay->node_slot[i] = -1;
		lay->ndeg = 0;
		free(first_rank);
		return 0;
	}
	pick_helpers(lay, first_rank);
	free(first_rank);
	for (i = 0; i < lay->nranks; i++) {
		int slot = lay->node_slot[lay->rank_node_idx[i]];

		if (slot < 0)
			lay->healthy_size++;
		for (j = 0; j < lay->ndeg; j++)
			if (slot == j || i == lay->deg_helper[j]) {
				if (i < lay->deg_helper[j])
					lay->deg_root[j]++;
				lay->deg_size[j]++;
			}
	}
	if (lay->ndegraded == 1) {
		lay->helper = lay->deg_helper[0];
		lay->aplush_size = lay->deg_size[0];
		lay->aplush_root = lay->deg_root[0];
	}
	return 0;

err_free:
	free(first_rank);
	free(lay->node_slot);
	free(lay->rank_node_idx);
	lay->node_slot = NULL;
	lay->rank_node_idx = NULL;
	return ret;
}

void r2cc_ar2_layout_fini(struct r2cc_ar2_layout *lay)
{
	free(lay->rank_node_idx);
	free(lay->node_slot);
	lay->rank_node_idx = NULL;
	lay->node_slot = NULL;
}

/* Index into deg_* of r's node, -1 for a healthy node (or no schedule). */
static int slot_of(const struct r2cc_ar2_layout *lay, int r)
{
	return lay->ndeg ? lay->node_slot[lay->rank_node_idx[r]] : -1;
}

static bool on_degraded(const struct r2cc_ar2_layout *lay, int r)
{
	return slot_of(lay, r) >= 0;
}

void r2cc_ar2_healthy_color(const struct r2cc_ar2_layout *lay, int r, int *color, int *key)
{
	*color = lay->ndeg && !on_degraded(lay, r) ? 0 : R2CC_NCCL_SPLIT_NOCOLOR;
	*key = r;
}

void r2cc_ar2_deg_color(const struct r2cc_ar2_layout *lay, int j, int r, int *color, int *key)
{
	*color = j < lay->ndeg && (slot_of(lay, r) == j || r == lay->deg_helper[j])
		     ? 0
		     : R2CC_NCCL_SPLIT_NOCOLOR;
	*key = r;
}

void r2cc_ar2_aplush_color(const struct r2cc_ar2_layout *lay, int r, int *color, int *key)
{
	r2cc_ar2_deg_color(lay, 0, r, color, key);
}

/* ---- Split of one buffer ---- */

int r2cc_ar2_split(size_t count, size_t esize, int nics, int failed, int k,
		   struct r2cc_ar2_split *sp)
{
	unsigned __int128 num, den, units, frac;
	size_t align, main, tail_units, start, end;
	int i;

	memset(sp, 0, offsetof(struct r2cc_ar2_split, chunk));
	if (!esize || nics < 1 || failed < 0)
		return -EINVAL;
	if (k < 1)
		k = 1;
	if (k > R2CC_AR2_MAX_CHUNKS)
		k = R2CC_AR2_MAX_CHUNKS;
	align = R2CC_AR2_ALIGN_BYTES % esize == 0 ? R2CC_AR2_ALIGN_BYTES / esize : 1;

	if (failed == 0) {
		main = count;
	} else if (failed >= nics) {
		main = 0;
	} else {
		/* nearest multiple of align to count * (nics - failed) / nics */
		num = (unsigned __int128)count * (unsigned)(nics - failed);
		den = (unsigned __int128)nics * align;
		units = num / den;
		frac = num - units * den;
		if (2 * frac >= den)
			units++;
		main = units * align > count ? count : (size_t)(units * align);
	}
	sp->main_count = main;
	sp->tail_offset = main;
	sp->tail_count = count - main;
	if (!sp->tail_count)
		return 0;
	tail_units = (sp->tail_count + align - 1) / align;
	sp->nchunks = tail_units < (size_t)k ? (int)tail_units : k;
	for (i = 0; i < sp->nchunks; i++) {
		start =
		    (size_t)((unsigned __int128)tail_units * (unsigned)i / (unsigned)sp->nchunks);
		end = (size_t)((unsigned __int128)tail_units * (unsigned)(i + 1) /
			       (unsigned)sp->nchunks);
		start = main + start * align;
		end = main + end * align;
		if (end > count)
			end = count;
		sp->chunk[i].offset = start;
		sp->chunk[i].count = end - start;
	}
	return 0;
}

/* ---- Eligibility ---- */

static const char *const reason_str[R2CC_AR2_NREASONS] = {
    [R2CC_AR2_RAN] = "ran",
    [R2CC_AR2_FB_SMALL] = "message below R2CC_AR_MIN_BYTES",
    [R2CC_AR2_FB_OP] = "reduction op Avg or PreMulSum",
    [R2CC_AR2_FB_DTYPE] = "unknown datatype",
    [R2CC_AR2_FB_GROUP] = "called inside a user group",
    [R2CC_AR2_FB_CAPTURE] = ("CUDA graph capture before R2CC-AllReduce was set up on this "
			     "communicator (an eligible AllReduce outside capture sets it up)"),
    [R2CC_AR2_FB_NONBLOCKING] = "non-blocking communicator",
    [R2CC_AR2_FB_ONE_NODE] = "communicator spans fewer than two nodes",
    [R2CC_AR2_FB_NO_DEGRADED] = "no degraded node",
    [R2CC_AR2_FB_MULTI] = "more than 8 degraded nodes",
    [R2CC_AR2_FB_NO_NIC] = "a degraded node has no healthy NIC",
    [R2CC_AR2_FB_NO_HEALTHY] = "every node is degraded: no healthy node to help",
    [R2CC_AR2_FB_SETUP] = "sub-communicator setup failed on some rank",
};

const char *r2cc_ar2_reason_str(enum r2cc_ar2_reason r)
{
	return (unsigned)r < R2CC_AR2_NREASONS ? reason_str[r] : "?";
}

enum r2cc_ar2_reason r2cc_ar2_check(const struct r2cc_ar2_layout *lay,
				    const struct r2cc_ar2_cfg *cfg, size_t count, int dtype, int op,
				    unsigned flags)
{
	size_t esize = r2cc_nccl_type_size(dtype);

	if (!esize)
		return R2CC_AR2_FB_DTYPE;
	if (op < R2CC_NCCL_SUM || op >= R2CC_NCCL_AVG)
		return R2CC_AR2_FB_OP;
	if (flags & R2CC_AR2_IN_GROUP)
		return R2CC_AR2_FB_GROUP;
	if (flags & R2CC_AR2_NONBLOCKING)
		return R2CC_AR2_FB_NONBLOCKING;
	if (lay->nnodes < 2)
		return R2CC_AR2_FB_ONE_NODE;
	if (lay->ndegraded == 0)
		return R2CC_AR2_FB_NO_DEGRADED;
	if (lay->ndegraded > R2CC_AR2_MAX_DEGRADED)
		return R2CC_AR2_FB_MULTI;
	if (lay->failed >= lay->nics)
		return R2CC_AR2_FB_NO_NIC;
	if (lay->healthy_nodes == 0)
		return R2CC_AR2_FB_NO_HEALTHY;
	if (count > SIZE_MAX / esize || (uint64_t)(count * esize) < cfg->min_bytes)
		return R2CC_AR2_FB_SMALL;
	return R2CC_AR2_RAN;
}

/* Balance in place of R2CC-AllReduce, said once per reason: at INFO where that is
 * the design (nothing degraded, a message below the threshold, one node), as a
 * warning where R2CC steps aside from a case it would otherwise serve. A healthy
 * job in mode 3 warns about nothing. */
static void warn_fallback(enum r2cc_ar2_reason r)
{
	static int warned[R2CC_AR2_NREASONS];

	if (__atomic_exchange_n(&warned[r], 1, __ATOMIC_RELAXED))
		return;
	if (r == R2CC_AR2_FB_NO_DEGRADED || r == R2CC_AR2_FB_SMALL || r == R2CC_AR2_FB_ONE_NODE)
		R2CC_INFO("R2CC-AllReduce: running Balance (%s); said once per reason",
			  reason_str[r]);
	else
		R2CC_WARN("R2CC-AllReduce: running Balance instead (%s); said once per reason",
			  reason_str[r]);
}

/* ---- Per-communicator state ---- */

/* One sub-communicator's abort, on a thread of its own. */
struct sub_abort {
	const struct r2cc_ar2_ops *ops;
	void *comm;
	pthread_t thread;
	bool started;
};

static void *sub_abort_main(void *arg)
{
	struct sub_abort *a = arg;
	a->ops->comm_abort(a->ops->ctx, a->comm);
	return NULL;
}

/*
 * Aborts the sub-communicators all at once, each on a thread, and waits for
 * them. NCCL's abort of a communicator sets its abort flag and then frees its
 * device memory, and cuMemFree waits for every kernel of the process: aborted
 * one after the other, the first abort would wait for the kernels of the others,
 * which only their own aborts stop (a job whose node lost every NIC hung so in
 * mode 3). A thread that cannot start aborts its communicator here, last.
 */
static void abort_subs(const struct r2cc_ar2_ops *ops, void **subs, int n)
{
	struct sub_abort *a = calloc((size_t)(n > 0 ? n : 1), sizeof(*a));
	int i, k = 0;

	for (i = 0; i < n; i++) {
		if (!subs[i])
			continue;
		if (!a) { /* no memory for threads: one after the other */
			ops->comm_abort(ops->ctx, subs[i]);
			continue;
		}
		a[k] = (struct sub_abort){.ops = ops, .comm = subs[i]};
		a[k].started = pthread_create(&a[k].thread, NULL, sub_abort_main, &a[k]) == 0;
		k++;
	}
	for (i = 0; i < k; i++)
		if (!a[i].started)
			ops->comm_abort(ops->ctx, a[i].comm);
	for (i = 0; i < k; i++)
		if (a[i].started)
			pthread_join(a[i].thread, NULL);
	free(a);
}

static void free_subs(const struct r2cc_ar2_ops *ops, void **subs, int n, bool abort)
{
	if (abort && ops->comm_abort) {
		abort_subs(ops, subs, n);
		return;
	}
	for (int i = 0; i < n; i++)
		if (subs[i])
			ops->comm_destroy(ops->ctx, subs[i]);
}

/*
 * Sub-communicators first (unless keep: then they join c->kept, for a captured
 * graph), then the events and streams; CUDA releases those once pending work
 * completes. On destroy, the healthy one before the aPlusH ones since stage 2
 * waits for it; on abort all at once (abort_subs).
 */
static void release(struct r2cc_ar2_comm *c, bool abort, bool keep)
{
	const struct r2cc_ar2_ops *ops = c->ops;
	int i, n = 0;

	if (keep) {
		void **k = realloc(c->kept, sizeof(void *) * (size_t)(c->nkept + NSUBS));
		if (k) {
			c->kept = k;
			for (i = 0; i < NSUBS; i++)
				if (c->sub[i])
					c->kept[c->nkept++] = c->sub[i];
			n = NSUBS;
		}
		/* else (no memory): destroyed after all, as before graphs existed */
	}
	if (!n)
		free_subs(ops, c->sub, NSUBS, abort);
	for (i = 0; i < c->nevents; i++)
		if (c->event[i])
			ops->event_destroy(ops->ctx, c->event[i]);
	for (i = 0; i < NSTREAMS; i++)
		if (c->stream[i])
			ops->stream_destroy(ops->ctx, c->stream[i]);
	memset(c->event, 0, sizeof(c->event));
	memset(c->stream, 0, sizeof(c->stream));
	memset(c->sub, 0, sizeof(c->sub));
	c->nevents = 0;
	c->pinned = false;
}

/* Local part of the setup: 1 when everything this rank needs exists. */
static int check_sub(struct r2cc_ar2_comm *c, void *sub, int want_size, int want_rank)
{
	const struct r2cc_ar2_ops *ops = c->ops;
	int n = -1, r = -1;

	if (!sub)
		return 0;
	if (ops->comm_count(ops->ctx, sub, &n) || ops->comm_user_rank(ops->ctx, sub, &r))
		return 0;
	return n == want_size && r == want_rank;
}

/* Rank of `me` in the sub-communicator of colour function j (-1: healthy). */
static int sub_rank(const struct r2cc_ar2_layout *lay, int me, int j)
{
	int i, r = 0, color, key;

	for (i = 0; i < me; i++) {
		if (j >= 0)
			r2cc_ar2_deg_color(lay, j, i, &color, &key);
		else
			r2cc_ar2_healthy_color(lay, i, &color, &key);
		r += color != R2CC_NCCL_SPLIT_NOCOLOR;
	}
	return r;
}

/* One split over the parent into c->sub[idx]; 1 when this rank has what it needs. */
static int split_one(struct r2cc_ar2_comm *c, int idx, int color, int key, int want_size,
		     int want_rank)
{
	const struct r2cc_ar2_ops *ops = c->ops;

	if (ops->comm_split(ops->ctx, c->parent, color, key, &c->sub[idx])) {
		c->sub[idx] = NULL;
		return 0;
	}
	if (color == R2CC_NCCL_SPLIT_NOCOLOR)
		return 1;
	return check_sub(c, c->sub[idx], want_size, want_rank);
}

/*
 * Collective over the parent: every rank makes every split (whatever happened
 * locally before, so no rank is left waiting in a split), then all agree.
 */
static void setup(struct r2cc_ar2_comm *c)
{
	const struct r2cc_ar2_ops *ops = c->ops;
	const struct r2cc_ar2_layout *lay = &c->lay;
	int ok = 1, all_ok = 0, i, j, color, key;

	for (i = 0; i < NSTREAMS; i++)
		if (ops->stream_create(ops->ctx, &c->stream[i])) {
			c->stream[i] = NULL;
			ok = 0;
		}
	c->nevents = EV_R0 + (lay->ndeg > 1 ? 2 : 1) * c->cfg.chunks;
	for (i = 0; i < c->nevents; i++)
		if (ops->event_create(ops->ctx, &c->event[i])) {
			c->event[i] = NULL;
			ok = 0;
		}

	r2cc_ar2_healthy_color(lay, c->rank, &color, &key);
	ok &= split_one(c, SUB_HEALTHY, color, key, lay->healthy_size, sub_rank(lay, c->rank, -1));
	for (j = 0; j < lay->ndeg; j++) {
		r2cc_ar2_deg_color(lay, j, c->rank, &color, &key);
		ok &= split_one(c, SUB_DEG(j), color, key, lay->deg_size[j],
				sub_rank(lay, c->rank, j));
	}
	if (c->cfg.schedule == 0 && lay->ndeg == 1)
		ok &= split_one(c, SUB_BCAST, 0, c->rank, lay->nranks, c->rank);

	if (ops->agree(ops->ctx, c->parent, ok, &all_ok))
		all_ok = 0;
	if (all_ok) {
		c->setup = SETUP_READY;
		if (lay->ndeg == 1)
			R2CC_INFO(
			    "R2CC-AllReduce: %d ranks on %d nodes, degraded node %d (%d of %d "
			    "NICs failed), helper rank %d, K=%d, schedule %d",
			    lay->nranks, lay->nnodes, lay->degraded, lay->failed, lay->nics,
			    lay->helper, c->cfg.chunks, c->cfg.schedule);
		else
			R2CC_INFO(
			    "R2CC-AllReduce: %d ranks on %d nodes, %d degraded nodes (the "
			    "largest share %d of %d NICs failed), helpers on %d healthy nodes, "
			    "K=%d, schedule %d",
			    lay->nranks, lay->nnodes, lay->ndeg, lay->failed, lay->nics,
			    lay->healthy_nodes, c->cfg.chunks, c->cfg.schedule);
		return;
	}
	if (!ok)
		R2CC_WARN("R2CC-AllReduce: sub-communicator or stream setup failed on rank %d",
			  c->rank);
	release(c, false, false);
	c->setup = SETUP_FAILED;
}

int r2cc_ar2_comm_create(const struct r2cc_ar2_ops *ops, void *parent,
			 const struct r2cc_ar2_cfg *cfg, const struct r2cc_ar2_view *view,
			 struct r2cc_ar2_comm **out)
{
	struct r2cc_ar2_comm *c;
	int n = -1, ret;

	*out = NULL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->ops = ops;
	c->parent = parent;
	c->cfg = *cfg;
	if (c->cfg.chunks < 1)
		c->cfg.chunks = 1;
	if (c->cfg.chunks > R2CC_AR2_MAX_CHUNKS)
		c->cfg.chunks = R2CC_AR2_MAX_CHUNKS;
	if (c->cfg.schedule < 0 || c->cfg.schedule > 3)
		c->cfg.schedule = 0;
	ret = ops->comm_count(ops->ctx, parent, &n);
	if (!ret)
		ret = ops->comm_user_rank(ops->ctx, parent, &c->rank);
	if (ret) {
		ret = ret > 0 ? -ret : ret;
		goto err_free;
	}
	ret = r2cc_ar2_layout_init(&c->lay, view);
	if (ret)
		goto err_free;
	if (n != c->lay.nranks || c->rank < 0 || c->rank >= n) {
		ret = -EINVAL;
		goto err_fini;
	}
	*out = c;
	return 0;

err_fini:
	r2cc_ar2_layout_fini(&c->lay);
err_free:
	free(c);
	return ret;
}

/* Whether two layouts make the same sub-communicators. */
static bool same_subs(const struct r2cc_ar2_layout *a, const struct r2cc_ar2_layout *b)
{
	if (a->ndeg != b->ndeg ||
	    memcmp(a->rank_node_idx, b->rank_node_idx, sizeof(int) * (size_t)a->nranks))
		return false;
	for (int j = 0; j < a->ndeg; j++)
		if (a->deg_node[j] != b->deg_node[j] || a->deg_helper[j] != b->deg_helper[j])
			return false;
	return true;
}

int r2cc_ar2_comm_set_view(struct r2cc_ar2_comm *c, const struct r2cc_ar2_view *view)
{
	struct r2cc_ar2_layout lay;
	int ret;

	ret = r2cc_ar2_layout_init(&lay, view);
	if (ret)
		return ret;
	if (lay.nranks != c->lay.nranks) {
		r2cc_ar2_layout_fini(&lay);
		return -EINVAL;
	}
	if (!same_subs(&lay, &c->lay)) {
		/* Sub-communicators that failed are aborted: destroying one waits for
		 * work that will never complete. Pinned ones stay for their graphs. */
		int perr = 0;
		if (c->ops->comm_async_error)
			c->ops->comm_async_error(c->ops->ctx, c->parent, &perr);
		release(c, perr || r2cc_ar2_comm_async_error(c), c->pinned);
		c->setup = SETUP_NONE;
	}
	r2cc_ar2_layout_fini(&c->lay);
	c->lay = lay;
	return 0;
}

void r2cc_ar2_comm_destroy(struct r2cc_ar2_comm *c, bool abort)
{
	if (!c)
		return;
	if (abort && c->ops->comm_abort) {
		/* every sub-communicator at once, the kept ones too */
		void **all = realloc(c->kept, sizeof(void *) * (size_t)(c->nkept + NSUBS));
		if (all) {
			c->kept = all;
			memcpy(all + c->nkept, c->sub, sizeof(c->sub));
			c->nkept += NSUBS;
			memset(c->sub, 0, sizeof(c->sub));
		}
	}
	release(c, abort, false);
	free_subs(c->ops, c->kept, c->nkept, abort);
	free(c->kept);
	r2cc_ar2_layout_fini(&c->lay);
	free(c);
}

int r2cc_ar2_comm_async_error(const struct r2cc_ar2_comm *c)
{
	int err = 0;

	if (!c || !c->ops->comm_async_error)
		return 0;
	for (int i = 0; i < NSUBS + c->nkept; i++) {
		void *sub = i < NSUBS ? c->sub[i] : c->kept[i - NSUBS];
		if (sub && c->ops->comm_async_error(c->ops->ctx, sub, &err) == 0 && err)
			return err;
	}
	return 0;
}

unsigned long r2cc_ar2_comm_captured(const struct r2cc_ar2_comm *c)
{
	return c ? c->captured : 0;
}

const struct r2cc_ar2_layout *r2cc_ar2_comm_layout(const struct r2cc_ar2_comm *c)
{
	return c ? &c->lay : NULL;
}

bool r2cc_ar2_comm_ready(const struct r2cc_ar2_comm *c)
{
	return c && c->setup == SETUP_READY;
}

/* ---- Executor ---- */

static void *at(const void *buf, size_t elems, size_t esize)
{
	return (char *)buf + elems * esize;
}

/* Every internal stream waits for the work enqueued on the user's stream so far. */
static int fork_from(struct r2cc_ar2_comm *c, void *user)
{
	const struct r2cc_ar2_ops *ops = c->ops;
	int ret = ops->event_record(ops->ctx, c->event[EV_START], user);

	for (int i = 0; i < NSTREAMS && !ret; i++)
		ret = ops->stream_wait_event(ops->ctx, c->stream[i], c->event[EV_START]);
	return ret;
}

/* Join every internal stream back into the user's stream, even after an
 * error, so that the user's stream covers whatever was issued. */
static int join(struct r2cc_ar2_comm *c, void *user, int ret)
{
	const struct r2cc_ar2_ops *ops = c->ops;

	for (int i = 0; i < NSTREAMS; i++) {
		int err = ops->event_record(ops->ctx, c->event[EV_END0 + i], c->stream[i]);
		if (!err)
			err = ops->stream_wait_event(ops->ctx, user, c->event[EV_END0 + i]);
		if (!ret)
			ret = err;
	}
	return ret;
}

static int run(struct r2cc_ar2_comm *c, const void *sendbuf, void *recvbuf, size_t count, int dtype,
	       int op, void *user)
{
	const struct r2cc_ar2_ops *ops = c->ops;
	const struct r2cc_ar2_layout *lay = &c->lay;
	void *ctx = ops->ctx, **s = c->stream, **ev = c->event;
	size_t esize = r2cc_nccl_type_size(dtype);
	struct r2cc_ar2_split sp;
	bool healthy = !on_degraded(lay, c->rank), member = !healthy || c->rank == lay->helper;
	bool serial = c->cfg.schedule >= 3;
	void *sc = serial ? s[S_R] : s[S_C];
	void *bcomm = c->sub[SUB_BCAST] ? c->sub[SUB_BCAST] : c->parent;
	int ret, i;

	r2cc_ar2_split(count, esize, lay->nics, lay->failed, c->cfg.chunks, &sp);
	R2CC_TRACE("R2CC-AllReduce: count %zu = main %zu + tail %zu in %d chunks, schedule %d",
		   count, sp.main_count, sp.tail_count, sp.nchunks, c->cfg.schedule);

	ret = fork_from(c, user);
	if (ret)
		return ret; /* nothing issued yet */

	if (sp.main_count)
		ret = ops->allreduce(ctx, sendbuf, recvbuf, sp.main_count, dtype, op, c->parent,
				     s[S_A]);
	if (!ret)
		ret = ops->event_record(ctx, ev[EV_A], s[S_A]);
	if (!ret && c->cfg.schedule >= 2)
		ret = ops->stream_wait_event(ctx, s[S_B], ev[EV_A]);
	if (!ret && healthy && sp.tail_count)
		ret = ops->allreduce(ctx, at(sendbuf, sp.tail_offset, esize),
				     at(recvbuf, sp.tail_offset, esize), sp.tail_count, dtype, op,
				     c->sub[SUB_HEALTHY], s[S_B]);
	if (!ret)
		ret = ops->event_record(ctx, ev[EV_B], s[S_B]);
	if (!ret)
		ret = ops->stream_wait_event(ctx, s[S_R], ev[EV_B]);
	if (!ret && c->cfg.schedule >= 1)
		ret = ops->stream_wait_event(ctx, s[S_R], ev[EV_A]);

	for (i = 0; i < sp.nchunks && !ret; i++) {
		void *rc = at(recvbuf, sp.chunk[i].offset, esize);
		size_t n = sp.chunk[i].count;

		/* The helper reduces its stage-1 result in place; degraded
		 * ranks contribute their own input. */
		if (member)
			ret = ops->reduce(
			    ctx,
			    c->rank == lay->helper ? rc : at(sendbuf, sp.chunk[i].offset, esize),
			    rc, n, dtype, op, lay->aplush_root, c->sub[SUB_DEG(0)], s[S_R]);
		if (!ret && !serial) {
			ret = ops->event_record(ctx, ev[EV_R0 + i], s[S_R]);
			if (!ret)
				ret = ops->stream_wait_event(ctx, sc, ev[EV_R0 + i]);
		}
		if (!ret)
			ret = ops->broadcast(ctx, rc, rc, n, dtype, lay->helper, bcomm, sc);
	}

	return join(c, user, ret);
}

/*
 * Several degraded nodes (allreduce2.h). Streams, after Start:
 *   SA: main AllReduce (full comm)
 *   SR: for each chunk i: Reduce_j(i) on aPlusH_j for every j this rank is in
 *       (a helper of several nodes reduces them one after the other, in place
 *       from the second on); record EvR[i]
 *   SB: for each chunk i: wait EvR[i]; AllReduce of chunk i on healthy (a
 *       helper in place: its chunk holds its nodes' parts); record EvB[i]
 *   SC: for each chunk i: wait EvB[i]; Broadcast_j(i) on aPlusH_j from helper j
 * (schedule 3: SB and SC are SR, one chain). Issue order on every rank: main
 * AllReduce, all Reduces (chunk-major), all tail AllReduces, all Broadcasts;
 * per communicator every rank issues the same sequence (aPlusH_j: Reduces
 * then Broadcasts) and every dependency points from an earlier issued call to
 * a later one, so no cycle of waits can form across ranks. A degraded rank's
 * Broadcast of chunk i overwrites what its Reduce of chunk i read (in place):
 * EvR[i] -> SB -> EvB[i] -> SC orders them.
 */
static int run_multi(struct r2cc_ar2_comm *c, const void *sendbuf, void *recvbuf, size_t count,
		     int dtype, int op, void *user)
{
	const struct r2cc_ar2_ops *ops = c->ops;
	const struct r2cc_ar2_layout *lay = &c->lay;
	void *ctx = ops->ctx, **s = c->stream, **ev = c->event;
	size_t esize = r2cc_nccl_type_size(dtype);
	struct r2cc_ar2_split sp;
	int mine = slot_of(lay, c->rank), K, ret, i, j;
	bool serial = c->cfg.schedule >= 3, helper = false; /* of any degraded node */
	void *sb = serial ? s[S_R] : s[S_B], *sc = serial ? s[S_R] : s[S_C];

	r2cc_ar2_split(count, esize, lay->nics, lay->failed, c->cfg.chunks, &sp);
	K = sp.nchunks;
	R2CC_TRACE("R2CC-AllReduce: count %zu = main %zu + tail %zu in %d chunks, %d degraded "
		   "nodes",
		   count, sp.main_count, sp.tail_count, K, lay->ndeg);

	ret = fork_from(c, user);
	if (ret)
		return ret; /* nothing issued yet */
	if (sp.main_count)
		ret = ops->allreduce(ctx, sendbuf, recvbuf, sp.main_count, dtype, op, c->parent,
				     s[S_A]);

	for (i = 0; i < K && !ret; i++) {
		size_t off = sp.chunk[i].offset, n = sp.chunk[i].count;
		bool reduced = false; /* this helper's chunk already holds a Reduce's result */

		for (j = 0; j < lay->ndeg && !ret; j++) {
			bool helps = c->rank == lay->deg_helper[j];
			if (mine != j && !helps)
				continue;
			ret = ops->reduce(ctx,
					  helps && reduced ? at(recvbuf, off, esize)
							   : at(sendbuf, off, esize),
					  at(recvbuf, off, esize), n, dtype, op, lay->deg_root[j],
					  c->sub[SUB_DEG(j)], s[S_R]);
			reduced |= helps;
		}
		if (!ret && !serial)
			ret = ops->event_record(ctx, ev[EV_R0 + i], s[S_R]);
	}
	for (j = 0; j < lay->ndeg; j++)
		helper |= c->rank == lay->deg_helper[j];
	for (i = 0; i < K && !ret; i++) {
		size_t off = sp.chunk[i].offset, n = sp.chunk[i].count;

		if (!serial)
			ret = ops->stream_wait_event(ctx, sb, ev[EV_R0 + i]);
		if (!ret && mine < 0)
			ret = ops->allreduce(
			    ctx, helper ? at(recvbuf, off, esize) : at(sendbuf, off, esize),
			    at(recvbuf, off, esize), n, dtype, op, c->sub[SUB_HEALTHY], sb);
		if (!ret && !serial)
			ret = ops->event_record(ctx, ev[EV_R0 + K + i], sb);
	}
	for (i = 0; i < K && !ret; i++) {
		void *rc = at(recvbuf, sp.chunk[i].offset, esize);

		if (!serial)
			ret = ops->stream_wait_event(ctx, sc, ev[EV_R0 + K + i]);
		for (j = 0; j < lay->ndeg && !ret; j++)
			if (mine == j || c->rank == lay->deg_helper[j])
				ret = ops->broadcast(ctx, rc, rc, sp.chunk[i].count, dtype,
						     lay->deg_root[j], c->sub[SUB_DEG(j)], sc);
	}
	return join(c, user, ret);
}

int r2cc_ar2_allreduce(struct r2cc_ar2_comm *c, const void *sendbuf, void *recvbuf, size_t count,
		       int dtype, int op, void *stream, unsigned flags,
		       enum r2cc_ar2_reason *reason_p)
{
	const struct r2cc_ar2_ops *ops = c->ops;
	enum r2cc_ar2_reason why;
	bool capturing = flags & R2CC_AR2_CAPTURING;
	int ret;

	why = r2cc_ar2_check(&c->lay, &c->cfg, count, dtype, op, flags);
	/* Setup is collective and blocking: never during capture. */
	if (why == R2CC_AR2_RAN && c->setup == SETUP_NONE && !capturing)
		setup(c);
	if (why == R2CC_AR2_RAN && c->setup == SETUP_NONE)
		why = R2CC_AR2_FB_CAPTURE;
	if (why == R2CC_AR2_RAN && c->setup != SETUP_READY)
		why = R2CC_AR2_FB_SETUP;
	if (reason_p)
		*reason_p = why;
	if (why != R2CC_AR2_RAN) {
		warn_fallback(why);
		return ops->allreduce(ops->ctx, sendbuf, recvbuf, count, dtype, op, c->parent,
				      stream);
	}
	if (capturing) {
		c->pinned = true;
		c->captured++;
	}
	if (c->lay.ndeg > 1)
		ret = run_multi(c, sendbuf, recvbuf, count, dtype, op, stream);
	else
		ret = run(c, sendbuf, recvbuf, count, dtype, op, stream);
	return ret;
}
