/*
 * The failure view of each communicator: which node of the communicator is
 * degraded and how many of its NICs failed: the declared failures
 * (R2CC_FAILED_NODE / R2CC_FAILED_HCA, shim/failspec.c) and the NICs hot repair
 * found failed, once the ranks have agreed that a repair happened (see
 * R2CC_AR_AFTER_REPAIR below).
 *
 * Every rank must hold the same view, so it is agreed on the communicator's
 * first AllReduce outside a group and outside graph capture (all ranks make
 * that call at the same point of their collective sequence): two all-gathers
 * of a few integers on a private stream, the first for the node of every
 * rank (NCCL_HOSTID, else the host name) and its NIC count, the second for
 * the NICs each rank found declared failed on its own node. Ranks of one node
 * that disagree are reported and the lowest rank's count is taken.
 *
 * The hook itself is the slow path: the NCCL wrapper calls it only while a
 * strategy is armed. Its per-call work after the view exists is one call into
 * the R2CC-AllReduce executor, which falls back to the plain AllReduce for
 * ineligible calls; while it watches for a repair, some eligible calls
 * also issue or read the asynchronous check (below).
 */
#include "strategies/failview.h"
#include "intercept/nccl_real.h"
#include "shim/comm.h"
#include "shim/common.h"
#include "shim/core.h"
#include "shim/failspec.h"
#include "shim/log.h"
#include "shim/params.h"
#include "shim/registry.h"
#include "strategies/allreduce2.h"
#include "strategies/cost.h"
#include "strategies/cuda.h"
#include "strategies/watch.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nccl.h>

static struct r2cc_failspec spec;

enum view_state { VIEW_UNKNOWN = 0, VIEW_READY, VIEW_NONE };

struct comm_strategy {
	int state;
	struct r2cc_ar2_ops ops; /* must outlive ar2 */
	struct r2cc_ar2_comm *ar2;
	double gbps;		      /* the slowest NIC's link rate, 0 unknown */
	bool said[R2CC_STRAT_COUNT];  /* auto's choice said at INFO, per view */
	bool capture_said;	      /* capture before the view: said once */
	unsigned long ran, fell_back; /* calls, for the log at destruction */
	bool switched;		      /* R2CC_AR_AFTER_REPAIR applies from now on */
	struct watch {		      /* R2CC_AR_AFTER_REPAIR: the check for repairs */
		bool made, broken;    /* resources below made; could not be made */
		struct r2cc_watch_clock clock;
		void *stream, *event;
		unsigned long long dbuf; /* nranks ints on the GPU */
		int *hbuf;		 /* nranks ints, pinned */
		int *seen;		 /* the last check's answer: repaired NICs per rank */
	} w;
};

/* Local NICs hot repair found failed (not declared ones). */
static int nics_down_here(void)
{
	int n = 0, k = r2cc_nic_count();
	for (int i = 0; i < k; i++)
		n += __atomic_load_n(&r2cc_nic_by_index(i)->state, __ATOMIC_RELAXED) ==
		     R2CC_NIC_DOWN;
	return n;
}

/* --- the ops table: real NCCL and the CUDA driver --------------------------- */

typedef ncclResult_t (*allreduce_fn)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
				     ncclComm_t, cudaStream_t);
typedef ncclResult_t (*reduce_fn)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int,
				  ncclComm_t, cudaStream_t);
typedef ncclResult_t (*broadcast_fn)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
				     cudaStream_t);
typedef ncclResult_t (*allgather_fn)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
				     cudaStream_t);
typedef ncclResult_t (*split_fn)(ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *);
typedef ncclResult_t (*comm_fn)(ncclComm_t);
typedef ncclResult_t (*comm_int_fn)(const ncclComm_t, int *);
typedef ncclResult_t (*async_fn)(ncclComm_t, ncclResult_t *);

static const struct r2cc_nccl_real *nccl;
static const struct r2cc_cuda *cu;

static int cu_rc(int rc)
{
	return rc ? ncclUnhandledCudaError : 0;
}

static int op_allreduce(void *ctx, const void *s, void *r, size_t n, int t, int o, void *comm,
			void *st)
{
	return ((allreduce_fn)nccl->AllReduce)(s, r, n, t, o, comm, st);
}

static int op_reduce(void *ctx, const void *s, void *r, size_t n, int t, int o, int root,
		     void *comm, void *st)
{
	return ((reduce_fn)nccl->Reduce)(s, r, n, t, o, root, comm, st);
}

static int op_broadcast(void *ctx, const void *s, void *r, size_t n, int t, int root, void *comm,
			void *st)
{
	return ((broadcast_fn)nccl->Broadcast)(s, r, n, t, root, comm, st);
}

static int op_split(void *ctx, void *comm, int color, int key, void **newcomm)
{
	ncclComm_t out = NULL;
	int rc = ((split_fn)nccl->CommSplit)(comm, color, key, &out, NULL);
	*newcomm = out;
	return rc;
}

static int op_destroy(void *ctx, void *comm)
{
	return ((comm_fn)nccl->CommDestroy)(comm);
}

static int op_abort(void *ctx, void *comm)
{
	return ((comm_fn)nccl->CommAbort)(comm);
}

static int op_async_error(void *ctx, void *comm, int *err)
{
	ncclResult_t e = ncclSuccess;
	int rc = ((async_fn)nccl->CommGetAsyncError)(comm, &e);
	*err = (int)e;
	return rc;
}

static int op_count(void *ctx, void *comm, int *n)
{
	return ((comm_int_fn)nccl->CommCount)(comm, n);
}

static int op_rank(void *ctx, void *comm, int *r)
{
	return ((comm_int_fn)nccl->CommUserRank)(comm, r);
}

static int op_stream_create(void *ctx, void **s)
{
	return cu_rc(cu->StreamCreate(s, R2CC_CU_STREAM_NON_BLOCKING));
}

static int op_stream_destroy(void *ctx, void *s)
{
	return cu_rc(cu->StreamDestroy(s));
}

static int op_event_create(void *ctx, void **e)
{
	return cu_rc(cu->EventCreate(e, R2CC_CU_EVENT_DISABLE_TIMING));
}

static int op_event_record(void *ctx, void *e, void *s)
{
	return cu_rc(cu->EventRecord(e, s));
}

static int op_event_destroy(void *ctx, void *e)
{
	return cu_rc(cu->EventDestroy(e));
}

static int op_wait(void *ctx, void *s, void *e)
{
	return cu_rc(cu->StreamWaitEvent(s, e, 0));
}

#define R2CC_CU_NOT_READY 600 /* CUDA_ERROR_NOT_READY */

static int async_error_hook(struct r2cc_comm *c);

/*
 * Waits for a stream (or an event) of ours without ever blocking on the GPU
 * alone: while the work is not done, the parent's and the sub-communicators'
 * asynchronous errors are looked at, and one ends the wait with that error. A
 * collective whose peer died never completes; a wait that only synchronised
 * would hold the application's thread inside its NCCL call forever, where it
 * can neither see the error nor abort.
 */
static int gpu_wait(struct r2cc_comm *c, void *stream, void *event)
{
	for (unsigned spin = 0;; spin++) {
		int q = stream ? cu->StreamQuery(stream) : cu->EventQuery(event);
		if (q != R2CC_CU_NOT_READY)
			return cu_rc(q);
		ncclResult_t e = ncclSuccess;
		if (((async_fn)nccl->CommGetAsyncError)(c->comm, &e) == ncclSuccess &&
		    e == ncclSuccess)
			e = (ncclResult_t)async_error_hook(c);
		if (e != ncclSuccess && e != ncclInProgress) {
			R2CC_WARN(
			    "comm %p: a collective of R2CC's will not complete (NCCL error %d); "
			    "the call returns it",
			    c->comm, (int)e);
			return (int)e;
		}
		if (spin < 1000)
			sched_yield();
		else
			usleep(50);
	}
}

/*
 * All-gather of `n` ints per rank on comm (c's or one of its own), on a private stream,
 * waited for with gpu_wait(). Used for the view and for agree(); every rank
 * calls it at the same point.
 */
static int gather_ints(struct r2cc_comm *c, void *comm, int nranks, const int *mine, int n,
		       int *all)
{
	void *stream = NULL;
	unsigned long long dbuf = 0;
	size_t bytes = (size_t)nranks * (size_t)n * sizeof(int);
	int rc = ncclUnhandledCudaError;
	if (cu->StreamCreate(&stream, R2CC_CU_STREAM_NON_BLOCKING))
		return rc;
	if (cu->MemAlloc(&dbuf, bytes))
		goto err_stream;
	if (cu->MemcpyHtoD(dbuf, mine, (size_t)n * sizeof(int)))
		goto err_mem;
	rc = ((allgather_fn)nccl->AllGather)((void *)(uintptr_t)dbuf, (void *)(uintptr_t)dbuf,
					     (size_t)n, ncclInt32, comm, stream);
	if (rc)
		goto err_mem;
	rc = gpu_wait(c, stream, NULL);
	if (rc) {
		/* The all-gather will never end: freeing its buffer would wait for it
		 * (cuMemFree synchronises), so the few bytes stay allocated. */
		cu->StreamDestroy(stream);
		return rc;
	}
	rc = cu_rc(cu->MemcpyDtoH(all, dbuf, bytes));
err_mem:
	cu->MemFree(dbuf);
err_stream:
	cu->StreamDestroy(stream);
	return rc;
}

static int op_agree(void *ctx, void *comm, int ok, int *all_ok)
{
	struct r2cc_comm *c = ctx;
	int *all = calloc((size_t)c->nranks, sizeof(int));
	if (!all)
		return ncclSystemError;
	int rc = gather_ints(c, comm, c->nranks, &ok, 1, all);
	*all_ok = 1;
	for (int i = 0; i < c->nranks && !rc; i++)
		if (!all[i])
			*all_ok = 0;
	free(all);
	return rc;
}

/* --- the view ----------------------------------------------------------------- */

static struct r2cc_ar2_ops ops_for(struct r2cc_comm *c)
{
	struct r2cc_ar2_ops ops = {
	    .ctx = c,
	    .allreduce = op_allreduce,
	    .reduce = op_reduce,
	    .broadcast = op_broadcast,
	    .comm_split = op_split,
	    .comm_destroy = op_destroy,
	    .comm_abort = op_abort,
	    .comm_async_error = op_async_error,
	    .comm_count = op_count,
	    .comm_user_rank = op_rank,
	    .stream_create = op_stream_create,
	    .stream_destroy = op_stream_destroy,
	    .event_create = op_event_create,
	    .event_record = op_event_record,
	    .event_destroy = op_event_destroy,
	    .stream_wait_event = op_wait,
	    .agree = op_agree,
	};
	return ops;
}

/* The view of c, agreed by all ranks; builds the strategy state, or gives the
 * existing one the new view (a NIC repaired or back since). */
static int build_view(struct r2cc_comm *c, struct comm_strategy *st)
{
	int n = c->nranks;
	char buf[256];
	const char *key = r2cc_node_key(buf, sizeof(buf));
	int mine[3] = {(int)(r2cc_hash32(key) & 0x7fffffff), r2cc_nic_count(), 0};
	int *all = calloc((size_t)n * 3, sizeof(int));
	int *rank_node = calloc((size_t)n, sizeof(int));
	int *node_nics = calloc((size_t)n, sizeof(int));
	int *node_failed = calloc((size_t)n, sizeof(int));
	int rc = -ENOMEM;
	if (!all || !rank_node || !node_nics || !node_failed)
		goto out;
	/* the slowest NIC's link rate, for the cost model's per-byte terms */
	for (int i = 0; i < mine[1]; i++) {
		int g = r2cc_nic_by_index(i)->speed_gbps;
		if (g > 0 && (mine[2] == 0 || g < mine[2]))
			mine[2] = g;
	}
	rc = gather_ints(c, c->comm, n, mine, 3, all);
	if (rc)
		goto out;
	/* Nodes numbered in order of first appearance in rank order. */
	int nnodes = 0, my_node = -1, gbps = 0;
	for (int r = 0; r < n; r++) {
		int node = -1;
		for (int q = 0; q < r && node < 0; q++)
			if (all[3 * q] == all[3 * r])
				node = rank_node[q];
		if (node < 0) {
			node = nnodes++;
			node_nics[node] = all[3 * r + 1];
		}
		rank_node[r] = node;
		if (r == c->rank)
			my_node = node;
		if (all[3 * r + 2] > 0 && (gbps == 0 || all[3 * r + 2] < gbps))
			gbps = all[3 * r + 2];
	}
	int f = r2cc_nic_mark_declared(&spec, my_node, key) + nics_down_here();
	int *fails = all; /* reuse: n ints */
	rc = gather_ints(c, c->comm, n, &f, 1, fails);
	if (rc)
		goto out;
	for (int node = 0; node < nnodes; node++)
		node_failed[node] = -1;
	for (int r = 0; r < n; r++) {
		int node = rank_node[r];
		if (node_failed[node] < 0)
			node_failed[node] = fails[r];
		else if (node_failed[node] != fails[r] && c->rank == 0)
			R2CC_WARN(
			    "ranks of node %d disagree on its failed NICs (%d vs %d); using rank "
			    "order's first",
			    node, node_failed[node], fails[r]);
	}
	/* more failed than NICs cannot be; a node whose ranks count more is clamped */
	for (int node = 0; node < nnodes; node++)
		if (node_failed[node] > node_nics[node])
			node_failed[node] = node_nics[node];
	r2cc_comm_set_nodes(c->comm, rank_node, n, 0);
	struct r2cc_ar2_view view = {.nranks = n,
				     .rank_node = rank_node,
				     .node_nics = node_nics,
				     .node_failed = node_failed};
	struct r2cc_ar2_cfg cfg = {.chunks = r2cc_param.ar_stage2_chunks,
				   .schedule = r2cc_param.ar_schedule,
				   .min_bytes = r2cc_param.ar_min_bytes};
	if (st->ar2) {
		rc = r2cc_ar2_comm_set_view(st->ar2, &view);
	} else {
		st->ops = ops_for(c);
		rc = r2cc_ar2_comm_create(&st->ops, c->comm, &cfg, &view, &st->ar2);
	}
	if (rc)
		goto out;
	st->gbps = gbps;
	memset(st->said, 0, sizeof(st->said));
	if (c->rank == 0) {
		int ndeg = r2cc_ar2_comm_layout(st->ar2)->ndegraded;
		R2CC_INFO("comm %p: failure view: %d nodes, %s", c->comm, nnodes,
			  ndeg == 0   ? "no degraded node"
			  : ndeg == 1 ? "one degraded node"
				      : "several degraded nodes");
		for (int node = 0; node < nnodes; node++)
			if (node_failed[node] > 0)
				R2CC_INFO("comm %p: node %d has %d of %d NICs failed (declared or "
					  "repaired)",
					  c->comm, node, node_failed[node], node_nics[node]);
	}
out:
	free(all);
	free(rank_node);
	free(node_nics);
	free(node_failed);
	return rc;
}

/* What runs after a repair: R2CC_AR_AFTER_REPAIR, else what R2CC_MODE says
 * (3 and auto: R2CC-AllReduce on the repaired topology; 1 and 2: Balance, which
 * needs no watching). */
static int after_repair(void)
{
	if (r2cc_param.mode == R2CC_MODE_PASSTHROUGH)
		return 0;
	if (r2cc_param.ar_after_repair)
		return r2cc_param.ar_after_repair;
	return r2cc_param.mode == R2CC_MODE_AR2 || r2cc_param.mode == R2CC_MODE_AUTO ? 3 : 0;
}

/*
 * R2CC_AR_AFTER_REPAIR: have the ranks' repaired NICs changed? Every rank must switch
 * at the same call, and ranks learn of a repair at different times, so the answer
 * comes from the ranks themselves, at AllReduce calls every rank makes in the same
 * order and decides on identically (over R2CC_AR_MIN_BYTES, outside groups and
 * capture): a 4-byte all-gather of each rank's count of repaired NICs, issued and read
 * on the clock of strategies/watch.h, never stalling the job while nothing has
 * failed. Every rank reads the same answer at the same call and compares it with the
 * last one: with AllReduces of 1 GiB or more the switch comes at the second call
 * after the repair; with small ones, at most R2CC_WATCH_EVERY + R2CC_WATCH_LAG
 * eligible calls after it. The buffers are made, and agreed on, at the first eligible
 * call.
 */

/* abort: never wait on the GPU. The check may sit behind a collective that will
 * never end, and the communicators are aborted only after this returns: an
 * event synchronisation, or a cuMemFree (which synchronises the device), would
 * wait for kernels that only the abort can stop. Its buffers (4 bytes per rank,
 * device and host) then stay allocated; events and streams are released by
 * CUDA once their work is done. */
static void watch_free(struct watch *w, bool abort)
{
	if (w->clock.pending && w->event && !abort)
		cu->EventSynchronize(w->event);
	if (w->event)
		cu->EventDestroy(w->event);
	if (w->stream)
		cu->StreamDestroy(w->stream);
	if (w->dbuf && !abort)
		cu->MemFree(w->dbuf);
	if (w->hbuf && !abort)
		cu->MemFreeHost(w->hbuf);
	free(w->seen);
	memset(w, 0, sizeof(*w));
}

static bool watch_make(struct watch *w, int nranks)
{
	size_t bytes = (size_t)nranks * sizeof(int);
	void *h = NULL;
	bool ok = !cu->StreamCreate(&w->stream, R2CC_CU_STREAM_NON_BLOCKING) &&
		  !cu->EventCreate(&w->event, R2CC_CU_EVENT_DISABLE_TIMING) &&
		  !cu->MemAlloc(&w->dbuf, bytes) && !cu->MemAllocHost(&h, bytes);
	w->hbuf = h;
	w->seen = calloc((size_t)nranks, sizeof(int));
	return ok && w->seen;
}

/* One eligible call: issue or read the check. True when the ranks' counts of
 * repaired NICs differ from the last check's (all zero before the first): a
 * repair, a second one, or a NIC back. */
static bool watch_repair(struct r2cc_comm *c, struct comm_strategy *st, size_t bytes)
{
	struct watch *w = &st->w;
	if (!w->made) {
		/* Once, at the first eligible call: every rank makes its buffers and
		 * all agree, so that no rank issues a check the others skip. */
		int all_ok = 0;
		bool ok = watch_make(w, c->nranks);
		if (op_agree(c, c->comm, ok, &all_ok) || !all_ok) {
			watch_free(w, false);
			w->broken = true;
			R2CC_WARN(
			    "comm %p: cannot watch for repairs (CUDA resources on some rank); "
			    "AllReduce keeps its strategy after a repair",
			    c->comm);
		}
		w->made = true;
	}
	if (w->broken)
		return false;
	if (r2cc_watch_read_due(&w->clock, (double)bytes)) {
		if (gpu_wait(c, NULL, w->event) == 0 &&
		    r2cc_watch_changed(w->seen, w->hbuf, c->nranks))
			return true;
		/* (an error here is the same on every rank: none switches) */
	}
	if (!r2cc_watch_issue_due(&w->clock))
		return false;
	/* Every rank issues the all-gather here, whatever fails locally around it,
	 * or the others would wait in it. */
	unsigned long long mine = w->dbuf + (unsigned long long)c->rank * sizeof(int);
	int rc = cu->MemsetD32Async(mine, (unsigned)nics_down_here(), 1, w->stream);
	int nrc = ((allgather_fn)nccl->AllGather)(
	    (void *)(uintptr_t)mine, (void *)(uintptr_t)w->dbuf, 1, ncclInt32, c->comm, w->stream);
	if (!rc)
		rc = cu->MemcpyDtoHAsync(w->hbuf, w->dbuf, (size_t)c->nranks * sizeof(int),
					 w->stream);
	if (!rc)
		rc = cu->EventRecord(w->event, w->stream);
	if (rc || nrc) {
		/* Read at the same call as everywhere else all the same: a rank that
		 * stopped issuing checks would leave the others waiting in theirs. With
		 * CUDA or NCCL failing here the job has bigger trouble anyway. */
		static int warned;
		if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
			R2CC_WARN("comm %p: the check for repairs failed (CUDA %d, NCCL %d)",
				  c->comm, rc, nrc);
	}
	return false;
}

/* --- the hook ------------------------------------------------------------------ */

/* NCCL and the driver are loaded by the time the first AllReduce arrives. */
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;
static bool tables_ok;

static void tables_load(void)
{
	nccl = r2cc_nccl_real();
	cu = r2cc_cuda();
	tables_ok = cu && nccl->AllReduce && nccl->AllGather && nccl->Reduce && nccl->Broadcast &&
		    nccl->CommSplit && nccl->CommDestroy && nccl->CommAbort && nccl->CommCount &&
		    nccl->CommUserRank;
	if (!tables_ok)
		R2CC_WARN("R2CC-AllReduce unavailable (CUDA driver or NCCL functions missing); "
			  "AllReduce runs as Balance");
}

static int allreduce_hook(struct r2cc_comm *c, const void *sendbuf, void *recvbuf, size_t count,
			  int dtype, int op, void *stream)
{
	pthread_once(&tables_once, tables_load);
	if (!tables_ok)
		return nccl->AllReduce
			   ? op_allreduce(NULL, sendbuf, recvbuf, count, dtype, op, c->comm, stream)
			   : ncclInternalError;
	struct comm_strategy *st = c->strategy;
	unsigned flags = 0;
	if (r2cc_nccl_group_depth() > 0)
		flags |= R2CC_AR2_IN_GROUP;
	int capturing = 0;
	if (cu->StreamIsCapturing(stream, &capturing) == 0 && capturing)
		flags |= R2CC_AR2_CAPTURING;
	if (!c->blocking)
		flags |= R2CC_AR2_NONBLOCKING;
	if (!st) {
		st = calloc(1, sizeof(*st));
		if (!st)
			return op_allreduce(NULL, sendbuf, recvbuf, count, dtype, op, c->comm,
					    stream);
		c->strategy = st;
	}
	bool base_ar2 = r2cc_param.mode == R2CC_MODE_AR2 || r2cc_param.mode == R2CC_MODE_AUTO;
	int after = after_repair();
	size_t bytes = count * (size_t)r2cc_nccl_type_size(dtype);
	/* A repair, a second one, a NIC back: every rank learns it at the same call
	 * (watch_repair) and takes the new view there. The R2CC-AllReduce state is
	 * kept: sub-communicators a captured graph uses must outlive the switch. */
	if (after && !flags && c->nranks > 0 && c->rank >= 0 &&
	    (double)count * (double)r2cc_nccl_type_size(dtype) >= (double)r2cc_param.ar_min_bytes &&
	    watch_repair(c, st, bytes)) {
		bool first = !st->switched;
		st->switched = true;
		if (after == 3 && st->state == VIEW_READY) {
			int rc = build_view(c, st);
			if (rc) {
				st->state = VIEW_NONE;
				R2CC_WARN("comm %p: no new failure view (%d); AllReduce runs as "
					  "Balance",
					  c->comm, rc);
			}
		}
		if (c->rank == 0 && first)
			R2CC_INFO("comm %p: a NIC was repaired; AllReduce runs as %s from now on "
				  "(R2CC_AR_AFTER_REPAIR=%d)",
				  c->comm, after == 3 ? "R2CC-AllReduce" : "Balance", after);
		else if (c->rank == 0)
			R2CC_INFO("comm %p: the repaired NICs changed; AllReduce takes the new "
				  "failure view",
				  c->comm);
	}
	bool ar2_now = st->switched ? after == 3 : base_ar2;
	if (!ar2_now)
		return op_allreduce(NULL, sendbuf, recvbuf, count, dtype, op, c->comm, stream);
	if (st->state == VIEW_UNKNOWN && !flags && c->nranks > 0 && c->rank >= 0) {
		int rc = build_view(c, st);
		st->state = rc ? VIEW_NONE : VIEW_READY;
		if (rc)
			R2CC_WARN("comm %p: no failure view (%d); AllReduce runs as Balance",
				  c->comm, rc);
	}
	if (st->state == VIEW_UNKNOWN && (flags & R2CC_AR2_CAPTURING) && !st->capture_said) {
		/* The view is agreed at an AllReduce outside capture (blocking
		 * all-gathers). Said as a warning only where there is something to
		 * protect: a declared failure, or a NIC of this node repaired. */
		st->capture_said = true;
		if (spec.nentries || nics_down_here())
			R2CC_WARN("comm %p: an AllReduce captured into a CUDA graph before the "
				  "communicator's first AllReduce outside capture: it runs as "
				  "Balance (R2CC-AllReduce needs that first call to agree on the "
				  "failure view)",
				  c->comm);
	}
	if (st->state != VIEW_READY)
		return op_allreduce(NULL, sendbuf, recvbuf, count, dtype, op, c->comm, stream);
	/* the cost model's case from the agreed layout: nodes, degraded nodes, the
	 * largest failed share */
	const struct r2cc_ar2_layout *lay = r2cc_ar2_comm_layout(st->ar2);
	if (r2cc_param.mode == R2CC_MODE_AUTO && lay->failed > 0) {
		struct r2cc_cost_case cc = {.nodes = lay->nnodes,
					    .nics = lay->nics,
					    .failed = lay->failed,
					    .bytes = (double)bytes,
					    .chunks = r2cc_param.ar_stage2_chunks,
					    .degraded = lay->ndegraded,
					    .gbps = st->gbps};
		char why[320];
		enum r2cc_strategy pick =
		    r2cc_cost_choose(&r2cc_param.cost_model, &cc, why, sizeof(why));
		/* each choice said once per view, at INFO, with the model's numbers */
		if (!st->said[pick]) {
			st->said[pick] = true;
			R2CC_INFO("comm %p: auto: %s: %s", c->comm, r2cc_strategy_name(pick), why);
		} else {
			R2CC_TRACE("auto: %s", why);
		}
		if (pick != R2CC_STRAT_AR2)
			return op_allreduce(NULL, sendbuf, recvbuf, count, dtype, op, c->comm,
					    stream);
	}
	enum r2cc_ar2_reason why = R2CC_AR2_RAN;
	int rc =
	    r2cc_ar2_allreduce(st->ar2, sendbuf, recvbuf, count, dtype, op, stream, flags, &why);
	if (why == R2CC_AR2_RAN)
		st->ran++;
	else
		st->fell_back++;
	return rc;
}

static void release_hook(struct r2cc_comm *c, bool abort)
{
	struct comm_strategy *st = c->strategy;
	if (!st)
		return;
	c->strategy = NULL;
	watch_free(&st->w, abort);
	if (st->state == VIEW_READY || st->ar2)
		R2CC_INFO("comm %p rank %d: R2CC-AllReduce ran %lu times (%lu of them captured "
			  "into CUDA graphs), %lu AllReduces ran as Balance",
			  c->comm, c->rank, st->ran, r2cc_ar2_comm_captured(st->ar2),
			  st->fell_back);
	r2cc_ar2_comm_destroy(st->ar2, abort);
	free(st);
}

static int async_error_hook(struct r2cc_comm *c)
{
	const struct comm_strategy *st = c->strategy;
	return st && st->ar2 ? r2cc_ar2_comm_async_error(st->ar2) : 0;
}

int r2cc_strategies_init(void)
{
	char err[320];
	/* Validated when the settings were read; cannot fail here. */
	if (r2cc_failspec_parse(r2cc_param.failed_node, r2cc_param.failed_hca, &spec, err,
				sizeof(err)))
		return -EINVAL;
	bool base_ar2 = r2cc_param.mode == R2CC_MODE_AR2 || r2cc_param.mode == R2CC_MODE_AUTO;
	int after = after_repair();
	if (spec.nentries)
		R2CC_INFO("declared failure: R2CC_FAILED_NODE='%s' R2CC_FAILED_HCA='%s'",
			  r2cc_param.failed_node, r2cc_param.failed_hca);
	bool now = base_ar2 && spec.nentries;
	if (!now && after != 3 && !(base_ar2 && after == 2))
		return 0;
	__atomic_store_n(&r2cc_comm_release_hook, release_hook, __ATOMIC_RELEASE);
	__atomic_store_n(&r2cc_comm_async_error_hook, async_error_hook, __ATOMIC_RELEASE);
	__atomic_store_n(&r2cc_allreduce_hook, allreduce_hook, __ATOMIC_RELEASE);
	R2CC_INFO("R2CC-AllReduce armed (mode %s, %s, after a repair: %s; K=%d, schedule %d, min "
		  "%llu bytes)",
		  r2cc_param.mode == R2CC_MODE_AUTO ? "auto"
		  : r2cc_param.mode == 3	    ? "3"
						    : "2",
		  now ? "declared failure" : "no failure declared",
		  after == 3 ? "R2CC-AllReduce" : "Balance", r2cc_param.ar_stage2_chunks,
		  r2cc_param.ar_schedule, (unsigned long long)r2cc_param.ar_min_bytes);
	return 0;
}

/* The NCCL door runs it at the first communicator (intercept/nccl_real.h). */
__attribute__((constructor)) static void strategies_constructor(void)
{
	r2cc_nccl_at_first_comm(r2cc_strategies_init);
}
