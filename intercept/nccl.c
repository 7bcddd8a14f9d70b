/*
 * The NCCL door: R2CC's definitions of NCCL's public functions, found by the
 * application before libnccl's weak nccl* symbols because libr2cc.so is
 * preloaded. Each forwards to NCCL's strong pnccl* alias. Creation and
 * destruction wrappers keep the communicator registry; the collectives add
 * nothing but one predictable branch while no strategy is armed (no lock, no
 * allocation, no system call on that path).
 *
 * The real functions, the hooks and the thread's group depth are in
 * nccl_real.c, which the strategies share. The door keeps the group depth
 * (ncclGroupStart/End nesting): the strategies need to know whether a call is
 * inside a user's group.
 */
#include "intercept/nccl_real.h"
#include "intercept/netcheck.h"
#include "ctl/job.h"
#include "repair/drill.h"
#include "repair/engine.h"
#include "shim/comm.h"
#include "shim/common.h"
#include "shim/core.h"
#include "shim/log.h"

#include <nccl.h>
#include <pthread.h>
#include <stdlib.h>

/* nccl.h declares these without a prototype. */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t pncclGroupStart(void);
ncclResult_t pncclGroupEnd(void);

#define REAL(name) R2CC_NCCL_REAL_FN(name)

/* Forward to the real function, or report that this NCCL lacks it. */
#define FORWARD(name, args)                                                                        \
	do {                                                                                       \
		real_nccl##name##_fn f_ = REAL(name);                                              \
		return f_ ? f_ args : ncclInvalidUsage;                                            \
	} while (0)

/* --- versions and ids ----------------------------------------------------------- */

static void note_version(void)
{
	static int done;
	if (__atomic_exchange_n(&done, 1, __ATOMIC_RELAXED))
		return;
	int v = 0;
	if (REAL(GetVersion) && real_ncclGetVersion(&v) == ncclSuccess)
		r2cc_note_nccl_version(v);
}

R2CC_EXPORT ncclResult_t ncclGetVersion(int *version)
{
	FORWARD(GetVersion, (version));
}

/*
 * R2CC's rendezvous rides in bytes 40-127 of the id, which NCCL does not read.
 * Not with NCCL_COMM_ID: every rank then makes its own id and relies on them
 * being identical, which a random job secret would break.
 */
R2CC_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
	real_ncclGetUniqueId_fn f = REAL(GetUniqueId);
	if (!f)
		return ncclInvalidUsage;
	ncclResult_t rc = f(id);
	if (rc == ncclSuccess && id && r2cc_active()) {
		if (getenv("NCCL_COMM_ID"))
			R2CC_WARN_ONCE("NCCL_COMM_ID is set: unique ids carry no R2CC rendezvous; "
				       "set R2CC_OOB_ROOT for the control plane");
		else
			r2cc_job_stamp((unsigned char *)id->internal);
	}
	return rc;
}

/* --- creation ------------------------------------------------------------------- */

static bool config_blocking(const ncclConfig_t *config)
{
	/* Never read past the caller's size. */
	if (!config || config->size < offsetof(ncclConfig_t, blocking) + sizeof(config->blocking))
		return true;
	return config->blocking != 0;
}

static void register_comm(ncclComm_t comm, int rank, int nranks, struct r2cc_comm *parent,
			  const ncclConfig_t *config)
{
	if (!comm)
		return;
	struct r2cc_comm *c = r2cc_comm_add(comm, rank, nranks, parent);
	if (!c)
		return;
	c->blocking = config_blocking(config);
	if (c->blocking && REAL(CommCuDevice))
		real_ncclCommCuDevice(comm, &c->cuda_dev);
	R2CC_INFO("comm %p rank %d/%d registered%s", (void *)comm, rank, nranks,
		  parent ? " (split)" : "");
}

/*
 * The network NCCL chose (intercept/netcheck.h) can be told once NCCL has set it
 * up: when a blocking init returns, or, for an init inside a group (nccl-tests
 * makes its communicators so), when the outermost ncclGroupEnd returns, which is
 * when NCCL does that init's work.
 */
static int net_pending; /* an init waits for its group's end */

static void net_check(void)
{
	if (r2cc_nccl_groups > 0)
		__atomic_store_n(&net_pending, 1, __ATOMIC_RELAXED);
	else {
		r2cc_net_init_done();
		r2cc_drill_at_init();
	}
}

static bool on_create(void)
{
	static int armed;
	if (!r2cc_active())
		return false;
	note_version();
	__atomic_store_n(&r2cc_comm_nodes_hook, r2cc_net_nodes, __ATOMIC_RELEASE);
	/* before any registration begins, on every thread that may begin one */
	r2cc_job_set_dir_ops(&r2cc_repair_dir_ops);
	if (r2cc_active() && !__atomic_exchange_n(&armed, 1, __ATOMIC_ACQ_REL))
		r2cc_nccl_first_comm(); /* the strategies arm themselves */
	return r2cc_active();
}

R2CC_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
	bool active = on_create();
	real_ncclCommInitRank_fn f = REAL(CommInitRank);
	if (!f)
		return ncclInvalidUsage;
	struct r2cc_job_reg *reg =
	    active ? r2cc_job_register_begin((unsigned char *)id.internal, rank, nranks) : NULL;
	ncclResult_t rc = f(comm, nranks, id, rank);
	if (active && rc == ncclSuccess)
		register_comm(*comm, rank, nranks, NULL, NULL);
	r2cc_job_register_end(reg, rc == ncclSuccess ? *comm : NULL);
	if (active && rc == ncclSuccess)
		net_check();
	return rc;
}

R2CC_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id,
						int rank, ncclConfig_t *config)
{
	bool active = on_create();
	real_ncclCommInitRankConfig_fn f = REAL(CommInitRankConfig);
	if (!f)
		return ncclInvalidUsage;
	struct r2cc_job_reg *reg =
	    active ? r2cc_job_register_begin((unsigned char *)id.internal, rank, nranks) : NULL;
	ncclResult_t rc = f(comm, nranks, id, rank, config);
	bool ok = rc == ncclSuccess || rc == ncclInProgress;
	if (active && ok)
		register_comm(*comm, rank, nranks, NULL, config);
	r2cc_job_register_end(reg, ok ? *comm : NULL);
	if (active && rc == ncclSuccess)
		net_check();
	return rc;
}

R2CC_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t *comm, int nranks, int rank, int nid,
						  ncclUniqueId *ids, ncclConfig_t *config)
{
	bool active = on_create();
	real_ncclCommInitRankScalable_fn f = REAL(CommInitRankScalable);
	if (!f)
		return ncclInvalidUsage;
	/* The first id's rendezvous serves the whole job. */
	struct r2cc_job_reg *reg =
	    active && nid > 0 && ids
		? r2cc_job_register_begin((unsigned char *)ids[0].internal, rank, nranks)
		: NULL;
	ncclResult_t rc = f(comm, nranks, rank, nid, ids, config);
	bool ok = rc == ncclSuccess || rc == ncclInProgress;
	if (active && ok)
		register_comm(*comm, rank, nranks, NULL, config);
	r2cc_job_register_end(reg, ok ? *comm : NULL);
	if (active && rc == ncclSuccess)
		net_check();
	return rc;
}

R2CC_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
	bool active = on_create();
	real_ncclCommInitAll_fn f = REAL(CommInitAll);
	if (!f)
		return ncclInvalidUsage;
	ncclResult_t rc = f(comms, ndev, devlist);
	if (active && rc == ncclSuccess && ndev > 0) {
		/* All ranks in this process: one node. */
		int *nodes = calloc((size_t)ndev, sizeof(int));
		for (int i = 0; i < ndev; i++) {
			register_comm(comms[i], i, ndev, NULL, NULL);
			if (nodes)
				r2cc_comm_set_nodes(comms[i], nodes, ndev, 0);
		}
		free(nodes);
	}
	return rc;
}

/* Rank and size of a communicator NCCL made for us (split, shrink); -1 while
 * a non-blocking communicator is still being created. */
static void query_rank(ncclComm_t comm, int *rank, int *nranks)
{
	if (!REAL(CommUserRank) || real_ncclCommUserRank(comm, rank) != ncclSuccess)
		*rank = -1;
	if (!REAL(CommCount) || real_ncclCommCount(comm, nranks) != ncclSuccess)
		*nranks = -1;
}

static void register_child(ncclComm_t parent, ncclComm_t child, const ncclConfig_t *config)
{
	if (!child)
		return;
	int rank = -1, nranks = -1;
	if (config_blocking(config))
		query_rank(child, &rank, &nranks);
	register_comm(child, rank, nranks, r2cc_comm_find(parent), config);
}

R2CC_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
				       ncclConfig_t *config)
{
	real_ncclCommSplit_fn f = REAL(CommSplit);
	if (!f)
		return ncclInvalidUsage;
	ncclResult_t rc = f(comm, color, key, newcomm, config);
	if (r2cc_active() && (rc == ncclSuccess || rc == ncclInProgress))
		register_child(comm, *newcomm, config);
	return rc;
}

R2CC_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int *exclude, int nexclude,
					ncclComm_t *newcomm, ncclConfig_t *config, int flags)
{
	real_ncclCommShrink_fn f = REAL(CommShrink);
	if (!f)
		return ncclInvalidUsage;
	ncclResult_t rc = f(comm, exclude, nexclude, newcomm, config, flags);
	if (r2cc_active() && (rc == ncclSuccess || rc == ncclInProgress))
		register_child(comm, *newcomm, config);
	return rc;
}

/* --- destruction ------------------------------------------------------------ */

/* Strategy state first (its sub-communicators: aborted with the parent), then
 * the record. */
static void unregister_comm(ncclComm_t comm, bool abort)
{
	struct r2cc_comm *c = r2cc_comm_find(comm);
	if (!c)
		return;
	r2cc_job_comm_gone(comm);
	r2cc_comm_release_fn rel = __atomic_load_n(&r2cc_comm_release_hook, __ATOMIC_ACQUIRE);
	if (rel && c->strategy)
		rel(c, abort);
	r2cc_comm_remove(comm);
}

R2CC_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
	FORWARD(CommFinalize, (comm));
}

R2CC_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
	unregister_comm(comm, false);
	FORWARD(CommDestroy, (comm));
}

struct parent_abort {
	real_ncclCommAbort_fn f;
	ncclComm_t comm;
	ncclResult_t rc;
};

static void *parent_abort_main(void *arg)
{
	struct parent_abort *a = arg;
	a->rc = a->f(a->comm);
	return NULL;
}

/* A communicator with strategy state has sub-communicators of R2CC's: the
 * parent is aborted on a thread of its own while they are (strategies/
 * allreduce2.c says why all at once), so that each abort's wait for the GPU
 * ends when every kernel of the family has seen its abort flag. */
R2CC_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm)
{
	struct r2cc_comm *c = r2cc_comm_find(comm);
	struct parent_abort a = {REAL(CommAbort), comm, ncclInternalError};
	pthread_t t;

	if (c && c->strategy && a.f && pthread_create(&t, NULL, parent_abort_main, &a) == 0) {
		unregister_comm(comm, true);
		pthread_join(t, NULL);
		return a.rc;
	}
	unregister_comm(comm, true);
	FORWARD(CommAbort, (comm));
}

/* A job waits for its collectives by polling this (nccl-tests, PyTorch's
 * watchdog) and aborts the communicator on an error. R2CC-AllReduce's work runs
 * partly on communicators of R2CC's own: their errors are the parent's, or the
 * job would wait forever on a collective whose sub-communicator gave up. */
R2CC_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err)
{
	real_ncclCommGetAsyncError_fn f = REAL(CommGetAsyncError);
	if (!f)
		return ncclInvalidUsage;
	ncclResult_t rc = f(comm, err);
	r2cc_comm_async_error_fn hook =
	    __atomic_load_n(&r2cc_comm_async_error_hook, __ATOMIC_ACQUIRE);
	if (rc == ncclSuccess && err && *err == ncclSuccess && hook) {
		struct r2cc_comm *c = r2cc_comm_find(comm);
		int sub = c && c->strategy ? hook(c) : 0;
		if (sub)
			*err = (ncclResult_t)sub;
	}
	return rc;
}

/* --- collectives ------------------------------------------------------------ */

/* R2CC_DRILL's times count from the first collective (repair/drill.h): one load
 * and a branch not taken once it came, or without a drill. */
#define DRILL_MARK()                                                                               \
	do {                                                                                       \
		if (r2cc_unlikely(__atomic_load_n(&r2cc_drill_wait_collective, __ATOMIC_RELAXED))) \
			r2cc_drill_at_collective();                                                \
	} while (0)

R2CC_EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
				       ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
				       cudaStream_t stream)
{
	DRILL_MARK();
	r2cc_allreduce_hook_fn hook = __atomic_load_n(&r2cc_allreduce_hook, __ATOMIC_RELAXED);
	if (r2cc_unlikely(hook != NULL)) {
		struct r2cc_comm *c = r2cc_comm_find(comm);
		if (c)
			return (ncclResult_t)hook(c, sendbuff, recvbuff, count, (int)datatype,
						  (int)op, stream);
	}
	FORWARD(AllReduce, (sendbuff, recvbuff, count, datatype, op, comm, stream));
}

R2CC_EXPORT ncclResult_t ncclGroupStart(void)
{
	real_ncclGroupStart_fn f = REAL(GroupStart);
	if (!f)
		return ncclInvalidUsage;
	ncclResult_t rc = f();
	if (rc == ncclSuccess)
		r2cc_nccl_groups++;
	return rc;
}

R2CC_EXPORT ncclResult_t ncclGroupEnd(void)
{
	real_ncclGroupEnd_fn f = REAL(GroupEnd);
	if (!f)
		return ncclInvalidUsage;
	if (r2cc_nccl_groups > 0)
		r2cc_nccl_groups--;
	ncclResult_t rc = f();
	if (r2cc_unlikely(__atomic_load_n(&net_pending, __ATOMIC_RELAXED)) &&
	    r2cc_nccl_groups == 0 && __atomic_exchange_n(&net_pending, 0, __ATOMIC_RELAXED) &&
	    rc == ncclSuccess) {
		r2cc_net_init_done();
		r2cc_drill_at_init();
	}
	return rc;
}

/* Ends the group like ncclGroupEnd, without launching anything. */
R2CC_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *info)
{
	real_ncclGroupSimulateEnd_fn f = REAL(GroupSimulateEnd);
	if (!f)
		return ncclInvalidUsage;
	if (r2cc_nccl_groups > 0)
		r2cc_nccl_groups--;
	return f(info);
}

#define R2CC_NCCL_OWN(name, params, args)
#define R2CC_NCCL_REAL(name, params, args)
#define R2CC_NCCL_FN(name, params, args)                                                           \
	R2CC_EXPORT ncclResult_t nccl##name params                                                 \
	{                                                                                          \
		DRILL_MARK();                                                                      \
		FORWARD(name, args);                                                               \
	}
#include "intercept/nccl_funcs.def"
#undef R2CC_NCCL_FN
#undef R2CC_NCCL_OWN
#undef R2CC_NCCL_REAL
