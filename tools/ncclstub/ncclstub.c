/*
 * A test double of NCCL's public API (nccl.h 2.28; with NCCLSTUB_OLD, the subset of 2.18).
 * It exports every function the way real NCCL does: ncclX weak, pncclX a strong alias of the
 * same body, so a preloaded library can wrap ncclX and reach the original through pncclX. It
 * keeps the internal call structure that matters to such a wrapper: ncclCommInitAll calls the
 * exported ncclGetUniqueId but not ncclCommInitRank, and ncclBcast calls the exported
 * ncclBroadcast, both through the PLT. Every call is logged (ncclstub.h) and returns a
 * result that depends on its arguments; nothing touches device memory, so no GPU is needed.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/ncclstub/ncclstub.h"

/* ncclX weak, pncclX a strong alias: NCCL's own NCCL_API macro does the same. */
#define STUB_API(ret, name, ...)                                                                   \
	__attribute__((visibility("default"), alias(#name))) ret p##name(__VA_ARGS__);             \
	__attribute__((visibility("default"), weak)) ret name(__VA_ARGS__)

#define STUB_COMM_MAGIC	   0x6e63636c636f6d6dULL /* "ncclcomm" */
#define STUB_CONFIG_MAGIC  0xcafebeefu
#define STUB_SIMINFO_MAGIC 0x74685283u

#ifdef NCCLSTUB_OLD
#define STUB_VERSION   NCCLSTUB_VERSION_OLD
#define STUB_NUM_TYPES 10 /* 2.18 has no Float8 types */
#else
#define STUB_VERSION   NCCLSTUB_VERSION
#define STUB_NUM_TYPES ncclNumTypes
#endif

struct ncclComm {
	unsigned long long magic;
	int nranks;
	int rank;
	int cuda_dev;
	ncclResult_t async_err;
};

static struct ncclstub_call log_recs[NCCLSTUB_LOG_CAP];
static atomic_size_t log_n;
static atomic_uint id_seq;
static atomic_int premul_ops;
static _Thread_local int stub_depth;
static _Thread_local int group_depth;
static _Thread_local struct ncclstub_call lost_call;
static char last_error[128] = "";

static const char *const fn_names[NCCLSTUB_NFUNCS] = {
#define STUB_NAME(name) [NCCLSTUB_##name] = #name,
    NCCLSTUB_FUNCS(STUB_NAME, STUB_NAME)
#undef STUB_NAME
	[NCCLSTUB_internal_init] = "internal_init",
};

__attribute__((visibility("default"))) const char *ncclstub_fn_name(enum ncclstub_fn fn)
{
	return (unsigned)fn < NCCLSTUB_NFUNCS ? fn_names[fn] : "?";
}

__attribute__((visibility("default"))) size_t ncclstub_log_count(void)
{
	return atomic_load(&log_n);
}

__attribute__((visibility("default"))) int ncclstub_log_get(size_t i, struct ncclstub_call *call_p)
{
	if (i >= atomic_load(&log_n) || i >= NCCLSTUB_LOG_CAP)
		return -1;
	*call_p = log_recs[i];
	return 0;
}

__attribute__((visibility("default"))) void ncclstub_log_clear(void)
{
	atomic_store(&log_n, 0);
}

__attribute__((visibility("default"))) int ncclstub_version(void)
{
	return STUB_VERSION;
}

static struct ncclstub_call *call_begin(enum ncclstub_fn fn)
{
	size_t i = atomic_fetch_add(&log_n, 1);
	struct ncclstub_call *c = i < NCCLSTUB_LOG_CAP ? &log_recs[i] : &lost_call;

	memset(c, 0, sizeof(*c));
	c->fn = fn;
	c->depth = stub_depth++;
	return c;
}

static ncclResult_t call_end(struct ncclstub_call *c, ncclResult_t res)
{
	c->result = res;
	stub_depth--;
	if (res != ncclSuccess && res != ncclInProgress)
		snprintf(last_error, sizeof(last_error), "ncclstub: %s failed with %d",
			 ncclstub_fn_name(c->fn), res);
	return res;
}

static void arg(struct ncclstub_call *c, uint64_t v)
{
	if (c->nargs < NCCLSTUB_MAX_ARGS)
		c->args[c->nargs++] = v;
}

static void argp(struct ncclstub_call *c, const void *p)
{
	arg(c, (uint64_t)(uintptr_t)p);
}

static void out(struct ncclstub_call *c, uint64_t v)
{
	if (c->nouts < NCCLSTUB_MAX_OUTS)
		c->outs[c->nouts++] = v;
}

static void outp(struct ncclstub_call *c, const void *p)
{
	out(c, (uint64_t)(uintptr_t)p);
}

static void log_id(struct ncclstub_call *c, const ncclUniqueId *id)
{
	if (c->nids < NCCLSTUB_MAX_IDS)
		memcpy(c->ids[c->nids++], id->internal, NCCL_UNIQUE_ID_BYTES);
}

static void log_int(struct ncclstub_call *c, int v)
{
	if (c->nints < NCCLSTUB_MAX_INTS)
		c->ints[c->nints++] = v;
}

/* The error a magic count or size asks for, or ncclSuccess. */
static ncclResult_t size_fail(size_t v)
{
	if (v > NCCLSTUB_FAIL_SIZE(0) && v < NCCLSTUB_FAIL_SIZE(ncclNumResults))
		return (ncclResult_t)(v - NCCLSTUB_FAIL_SIZE(0));
	return ncclSuccess;
}

static ncclResult_t id_fail(const ncclUniqueId *id)
{
	unsigned char b = (unsigned char)id->internal[NCCLSTUB_ID_FAIL_BYTE];

	if ((b & 0xf0) == 0xe0 && (b & 0x0f) > 0 && (b & 0x0f) < ncclNumResults)
		return (ncclResult_t)(b & 0x0f);
	return ncclSuccess;
}

static ncclResult_t comm_check(ncclComm_t comm)
{
	return comm && comm->magic == STUB_COMM_MAGIC ? ncclSuccess : ncclInvalidArgument;
}

/* Reads the config as NCCL does: never past config->size; a bad magic is rejected. */
static ncclResult_t config_read(struct ncclstub_call *c, const ncclConfig_t *config,
				int *blocking_p)
{
	*blocking_p = 1;
	if (!config)
		return ncclSuccess;
	if (config->size < offsetof(ncclConfig_t, blocking) || config->magic != STUB_CONFIG_MAGIC)
		return ncclInvalidArgument;
	c->config_bytes = config->size < sizeof(*config) ? config->size : sizeof(*config);
	memcpy(c->config, config, c->config_bytes);
	if (config->size >= offsetof(ncclConfig_t, cgaClusterSize) && config->blocking == 0)
		*blocking_p = 0;
	return ncclSuccess;
}

/* A fresh communicator; the device is made up from the rank so that it differs from it. */
static ncclComm_t comm_new(int nranks, int rank, int cuda_dev, ncclResult_t async_err)
{
	struct ncclComm *comm = calloc(1, sizeof(*comm));

	if (!comm)
		return NULL;
	comm->magic = STUB_COMM_MAGIC;
	comm->nranks = nranks;
	comm->rank = rank;
	comm->cuda_dev = cuda_dev;
	comm->async_err = async_err;
	return comm;
}

static int fake_device(int rank)
{
	return 7 - rank % 8;
}

/* Shared by the three exported inits: argument checks, then the new comm in *comm_p. */
/*
 * The net plugin, loaded at the first init as NCCL loads it (NCCL_NET_PLUGIN unset:
 * libnccl-net.so; "none": none; NAME: libnccl-net-NAME.so, then NAME), and
 * initialised: its init and devices called, so that its ncclNet struct's name
 * becomes the one NCCL would use. Only the ncclNetPlugin_v6-v9 interface, whose init
 * takes the logger alone (the project's test plugin, tools/ncclstub/testnet.c).
 */
struct stub_net {
	const char *name;
	int (*init)(void *logger);
	int (*devices)(int *ndev);
};

static void net_load_once(void)
{
	const char *v = getenv("NCCL_NET_PLUGIN");
	char names[2][256];
	int n = 0;
	if (!v || !*v)
		snprintf(names[n++], sizeof(names[0]), "libnccl-net.so");
	else if (strcmp(v, "none")) {
		snprintf(names[n++], sizeof(names[0]), "libnccl-net-%s.so", v);
		snprintf(names[n++], sizeof(names[0]), "%s", v);
	}
	for (int i = 0; i < n; i++) {
		void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
		if (!h)
			continue;
		for (int api = 9; api >= 6; api--) {
			char sym[32];
			snprintf(sym, sizeof(sym), "ncclNetPlugin_v%d", api);
			struct stub_net *net = dlsym(h, sym);
			int ndev = 0;
			if (net && net->init && net->init(NULL) == 0 && net->devices &&
			    net->devices(&ndev) == 0)
				return; /* kept loaded, as NCCL keeps the net it uses */
		}
		dlclose(h);
	}
}

static void net_load(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, net_load_once);
}

static ncclResult_t init_common(struct ncclstub_call *c, ncclComm_t *comm_p, int nranks, int rank,
				int cuda_dev, const ncclUniqueId *id, const ncclConfig_t *config)
{
	net_load();
	ncclResult_t res;
	int blocking;

	if (!comm_p)
		return ncclInvalidArgument;
	*comm_p = NULL;
	res = config_read(c, config, &blocking);
	if (res == ncclSuccess && (nranks < 1 || rank < 0 || rank >= nranks))
		res = ncclInvalidArgument;
	if (res == ncclSuccess)
		res = id_fail(id);
	if (res == ncclSuccess) {
		*comm_p = comm_new(nranks, rank, cuda_dev, blocking ? ncclSuccess : ncclInProgress);
		if (!*comm_p)
			res = ncclSystemError;
		else if (!blocking)
			res = ncclInProgress;
	}
	outp(c, *comm_p);
	return res;
}

/* Real NCCL's ncclCommInitAll runs its internal ncclCommInitRankDev per device, not the
 * exported ncclCommInitRank; this is its stand-in, logged at depth 1. */
static ncclResult_t internal_init(ncclComm_t *comm_p, int ndev, const ncclUniqueId *id, int rank,
				  int dev)
{
	struct ncclstub_call *c = call_begin(NCCLSTUB_internal_init);

	argp(c, comm_p);
	arg(c, (uint64_t)ndev);
	arg(c, 0);
	log_id(c, id);
	arg(c, (uint64_t)rank);
	arg(c, (uint64_t)dev);
	return call_end(c, init_common(c, comm_p, ndev, rank, dev, id, NULL));
}

static bool type_ok(ncclDataType_t type)
{
	return (int)type >= 0 && (int)type < STUB_NUM_TYPES;
}

static bool op_ok(ncclRedOp_t op)
{
	return (int)op >= 0 && (int)op < ncclNumOps + atomic_load(&premul_ops);
}

/* Checks of a collective; root or peer -1 when the collective has none. */
static ncclResult_t coll_check(ncclComm_t comm, size_t count, ncclDataType_t type, bool has_op,
			       ncclRedOp_t op, int root)
{
	if (comm_check(comm) != ncclSuccess || !type_ok(type) || (has_op && !op_ok(op)))
		return ncclInvalidArgument;
	if (root != -1 && (root < 0 || root >= comm->nranks))
		return ncclInvalidArgument;
	return size_fail(count);
}

#ifndef NCCLSTUB_OLD
/* A fake, never dereferenced address, distinct per call. */
static void *fake_handle(unsigned long long base)
{
	static atomic_uint handle_seq;

	return (void *)(uintptr_t)(base + 0x1000ULL * atomic_fetch_add(&handle_seq, 1));
}

STUB_API(ncclResult_t, ncclMemAlloc, void **ptr, size_t size)
{
	struct ncclstub_call *c = call_begin(NCCLSTUB_ncclMemAlloc);
	ncclResult_t res = ptr && size ? size_fail(size) : ncclInvalidArgument;

	argp(c, ptr);
	arg(c, size);
	if (res == ncclSuccess) {
		*ptr = fake_handle(0x7a1100000000ULL);
		outp(c, *ptr);
	}
	return call_end(c, res);
}
#endif

STUB_API(ncclResult_t, ncclGetVersion, int *version)
{
	struct ncclstub_call *c = call_begin(NCCLSTUB_ncclGetVersion);

	argp(c, version);
	if (!version)
		return call_end(c, ncclInvalidArgument);
	/* NCCLSTUB_REPORT_VERSION: the version code to report (a test of what R2CC
	 * does with a release the double does not otherwise imitate). */
	const char *v = getenv("NCCLSTUB_REPORT_VERSION");
	*version = v && *v ? atoi(v) : STUB_VERSION;
	out(c, (uint64_t)*version);
	return call_end(c, ncclSuccess);
}

/* Bytes 0-35 differ per call (NCCL's magic and socket address); 36-127 are zero, as in 2.28. */
STUB_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId *uniqueId)
{
	struct ncclstub_call *c = call_begin(NCCLSTUB_ncclGetUniqueId);
	unsigned seq = atomic_fetch_add(&id_seq, 1) + 1;

	argp(c, uniqueId);
	if (!uniqueId)
		return call_end(c, ncclInvalidArgument);
	memset(uniqueId, 0, sizeof(*uniqueId));
	for (int i = 0; i < 36; i++)
		uniqueId->internal[i] = (char)(seq * 31 + (unsigned)i * 7 + 1);
	log_id(c, uniqueId);
	return call_end(c, ncclSuccess);
}

STUB_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t *comm, int nranks, ncclUniqueId commId,
	 int rank, ncclConfig_t *config)
{
	struct ncclstub_call *c = call_begin(NCCLSTUB_ncclCommInitRankConfig);

	argp(c, comm);
	arg(c, (uint64_t)nranks);
	arg(c, 0);
	log_id(c, &commId);
	arg(c, (uint64_t)rank);
	argp(c, config);
	return call_end(c, init_common(c, comm, nranks, rank, fake_device(rank), &commId, config));
}

STUB_API(ncclResult_t, ncclCommInitRank, ncclComm_t *comm, int nranks, ncclUniqueId commId,
	 int rank)
{
	struct ncclstub_call *c = call_begin(NCCLSTUB_ncclCommInitRank);

	argp(c, comm);
	arg(c, (uint64_t)nranks);
	arg(c, 0);
	log_id(c, &commId);
	arg(c, (uint64_t)rank);
	return call_end(c, init_common(c, comm, nranks, rank, fake_device(rank), &commId, NULL));
}

STUB_API(ncclResult_t, ncclCommInitAll, ncclComm_t *comms, int ndev, const int *devlist)
{
	struct ncclstub_call *c = call_begin(NCCLSTUB_ncclCommInitAll);
	ncclResult_t res = ncclSuccess;
	ncclUniqueId id;

	argp(c, comms);
	arg(c, (uint64_t)ndev);
	argp(c, devlist);
	if (!comms || ndev < 1)
		return call_end(c, ncclInvalidArgument);
	for (int i = 0; devlist && i < ndev; i++) {
		log_int(c, devlist[i]);
		if (devlist[i] < 0)
			return call_end(c, ncclInvalidArgument);
	}
	/* Through the PLT, like NCCL: a preloaded ncclGetUniqueId sees this nested call. */
	res = ncclGetUniqueId(&id);
	for (int i = 0; res == ncclSuccess && i < ndev; i++)
		res = internal_init(comms + i, ndev, &id, i, devlist ? devlist[i] : i);
	for (int i = 0; i < ndev; i++)
		outp(c, comms[i]);
	return call_end(c, res);
}

#ifndef NCCLSTUB_OLD
STUB_API(ncclResult_t, ncclCommRevoke, ncclComm_t comm, int revokeFlags)
{
	struct ncclstub_call *c = call_begin(NCCLSTUB_ncclCommRevoke);
	ncclResult_t res = comm_check(comm);

	argp(c, comm);
	arg(c, (uint64_t)revokeFlags);
	if (res == ncclSuccess && revokeFlags != NCCL_REVOKE_DEFAULT)
		res = ncclInvalidArgument;
	return call_end(c, res);
}
#endif

/* The child's rank is the key modulo the parent's size; NOCOLOR gives a NULL child. */
STUB_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
	 ncclConfig_t *config)
{
	struct ncclstub_call *c = call_begin(NCCLSTUB_ncclCommSplit);
	ncclResult_t res = comm_check(comm);
	int blocking;

	argp(c, comm);
	arg(c, (uint64_t)color);
	arg(c, (uint64_t)key);
	argp(c, newcomm);
	argp(c, config);
	if (res == ncclSuccess && !newcomm)
		res = ncclInvalidArgument;
	if (res == ncclSuccess)
		res = config_read(c, config, &blocking);
	if (res != ncclSuccess)
		return call_end(c, res);
	*newcomm = NULL;
	if (color != NCCL_SPLIT_NOCOLOR) {
		int rank = (key % comm->nranks + comm->nranks) % comm->nranks;

		*newcomm = comm_new(comm->nranks, rank, comm->cuda_dev, ncclSuccess);
		if (!*newcomm)
			res = ncclSystemError;
	}
	outp(c, *newcomm);
	return call_end(c, res);
}

#ifndef NCCLSTUB_OLD
STUB_API(ncclResult_t, ncclCommShrink, ncclComm_t comm, int *excludeRanksList,
	 int excludeRanksCount, ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags)
{
	struct ncclstub_call *c = call_begin(NCCLSTUB_ncclCommShrink);
	ncclResult_t res = comm_check(comm);
	int excluded_below = 0, blocking;

	argp(c, comm);
	argp(c, excludeRanksList);
	arg(c, (uint64_t)excludeRanksCount);
	argp(c, newcomm);
	argp(c, config);
	arg(c, (uint64_t)shrinkFlags);
	if (res == ncclSuccess &&
	    (!newcomm || excludeRanksCount < 0 || (excludeRanksCount > 0 && !excludeRanksList) ||
	     excludeRanksCount >= comm->nranks))
		res = ncclInvalidArgument;
	if (res == ncclSuccess)
		res = config_read(c, config, &blocking);
	for (int i = 0; res == ncclSuccess && i < excludeRanksCount; i++) {
		log_int(c, excludeRanksList[i]);
		if (excludeRanksList[i] == comm->rank)
			res = ncclInvalidArgument;
		excluded_below += excludeRanksList[i] < comm->rank;
	}
	if (res != ncclSuccess)
		return call_end(c, res);
	*newcomm = comm_new(comm->nranks - excludeRanksCount, comm->rank - excluded_below,
			    comm->cuda_dev, ncclSuccess);
	outp(c, *newcomm);
	return call_end(c, *newcomm ? ncclSuccess : ncclSystemError);
}

STUB_API(ncclResult_t, ncclCommInitRankScalable, ncclComm_t *newcomm, int nranks, int myrank,
	 int nId, ncclUniqueId *commIds, ncclConfig_t *config)
{
	struct ncclstub_call *c = call_begin(NCCLSTUB_ncclCommInitRankScalable);
	int id;

	argp(c, newcomm);
	arg(c, (uint64_t)nranks);
	arg(c, (uint64_t)myrank);
	arg(c, (uint64_t)nId);
	argp(c, commIds);
	argp(c, config);
	if (nId < 1 || nId > nranks || !commIds)
		return call_end(c, ncclInvalidArgument);
	for (int i = 0; i < nId; i++)
		log_id(c, &commIds[i]);
	/* Each rank bootstraps through the id of its block of ranks, as in NCCL. */
	id = myrank >= 0 && myrank < nranks ? (int)((long)myrank * nId / nranks) : 0;
	return call_end(
	    c, init_common(c, newcomm, nranks, myrank, fake_device(myrank), &commIds[id], config));
}
#endif

STUB_API(const char *, ncclGetErrorString, ncclResult_t result)
{
	static const char *const strings[ncclNumResults] = {
	    [ncclSuccess] = "ncclstub: no error",
	    [ncclUnhandledCudaError] = "ncclstub: unhandled cuda error",
	    [ncclSystemError] = "ncclstub: unhandled system error",
	    [ncclInternalError] = "ncclstub: internal error",
	    [ncclInvalidArgument] = "ncclstub: invalid argument",
	    [ncclInvalidUsage] = "ncclstub: invalid usage",
	    [ncclRemoteError] = "ncclstub: remote process exited or there was a network error",
	    [ncclInProgress] = "ncclstub: NCCL operation in progress",
	};
	struct ncclstub_call *c = call_begin(NCCLSTUB_ncclGetErrorString);
	const char *s = (unsigned)result < ncclNumResults ? strings[result] : "ncclstub: unknown";

	arg(c, (uint64_t)result);
	outp(c, s);
	call_end(c, ncclSuccess);
	c->result = -1;
	return s;
}

STUB_API(const char *, ncclGetLastError, ncclComm_t comm)
{
	struct ncclstub_call *c = call_begin(NCCLSTUB_ncclGetLastError);

	argp(c, comm);
	outp(c, last_error);
	call_end(c, ncclSuccess);
	c->result = -1;
	return last_error;
}

STUB_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t *asyncError)
{
	struct ncclstub_call *c = call_begin(NCCLSTUB_ncclCommGetAsyncError);
	ncclResult_t res = comm_check(comm);

	argp(c, comm);
	argp(c, asyncError);
	if (res == ncclSuccess && !asyncError)
		res = ncclInvalidArgument;
	if (res == ncclSuccess) {
		*asyncError = comm->async_err;
		out(c, (uint64_t)*asyncError);
	}
	return call_end(c, res);
}

static ncclResult_t comm_query(enum ncclstub_fn fn, ncclComm_t comm, int *value_p, int what)
{
	struct ncclstub_call *c = call_begin(fn);
	ncclResult_t res = comm_check(comm);

	argp(c, comm);
	argp(c, value_p);
	if (res == ncclSuccess && !value_p)
		res = ncclInvalidArgument;
	if (res == ncclSuccess) {
		*value_p = what == 0 ? comm->nranks : what == 1 ? comm->cuda_dev : comm->rank;
		out(c, (uint64_t)*value_p);
	}
	return call_end(c, res);
}

STUB_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int *count)
{
	return comm_query(NCCLSTUB_ncclCommCount, comm, count, 0);
}

STUB_API(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int *device)
{
	return comm_query(NCCLSTUB_ncclCommCuDevice, comm, device, 1);
}

STUB_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int *rank)
{
	return comm_query(NCCLSTUB_ncclCommUserRank, comm, rank, 2);
}

#ifndef NCCLSTUB_OLD
STUB_API(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void *buff, size_t size,
	 void **handle)
{
	struct ncclstub_call *c = call_begin(NCCLSTUB_ncclCommRegister);
	ncclResult_t res = comm_check(comm);

	argp(c, comm);
	argp(c, buff);
	arg(c, size);
	argp(c, handle);
	if (res == ncclSuccess && !handle)
		res = ncclInvalidArgument;
	if (res == ncclSuccess)
		res = size_fail(size);
	if (res == ncclSuccess) {
		*handle = fake_handle(0x4e6700000000ULL);
		outp(c, *handle);
	}
	return call_end(c, res);
}

STUB_API(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void *buff, size_t size,
	 ncclWindow_t *win, int winFlags)
{
	struct ncclstub_call *c = call_begin(NCCLSTUB_ncclCommWindowRegister);
	ncclResult_t res = comm_check(comm);

	argp(c, comm);
	argp(c, buff);
	arg(c, size);
	argp(c, win);
	arg(c, (uint64_t)winFlags);
	if (res == ncclSuccess && !win)
		res = ncclInvalidArgument;
	if (res == ncclSuccess)
		res = size_fail(size);
	if (res == ncclSuccess) {
		*win = fake_handle(0x3d1700000000ULL);
		outp(c, *win);
	}
	return call_end(c, res);
}
#endif

static size_t type_size(ncclDataType_t type)
{
	static const unsigned char sizes[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

	return type_ok(type) ? sizes[type] : 0;
}

/* Ops are handed out as ncclNumOps, ncclNumOps + 1, ...; a host scalar is read at once. */
STUB_API(ncclResult_t, ncclRedOpCreatePreMulSum, ncclRedOp_t *op, void *scalar,
	 ncclDataType_t datatype, ncclScalarResidence_t residence, ncclComm_t comm)
{
	struct ncclstub_call *c = call_begin(NCCLSTUB_ncclRedOpCreatePreMulSum);
	ncclResult_t res = comm_check(comm);

	argp(c, op);
	argp(c, scalar);
	arg(c, (uint64_t)datatype);
	arg(c, (uint64_t)residence);
	argp(c, comm);
	if (res == ncclSuccess && (!op || !scalar || !type_ok(datatype)))
		res = ncclInvalidArgument;
	if (res != ncclSuccess)
		return call_end(c, res);
	if (residence == ncclScalarHostImmediate) {
		c->data_bytes = type_size(datatype);
		memcpy(c->data, scalar, c->data_bytes);
	}
	*op = (ncclRedOp_t)(ncclNumOps + atomic_fetch_add(&premul_ops, 1));
	out(c, (uint64_t)*op);
	return call_end(c, ncclSuccess);
}

STUB_API(ncclResult_t, ncclRedOpDestroy, ncclRedOp_t op, ncclComm_t comm)
{
	struct ncclstub_call *c = call_begin(NCCLSTUB_ncclRedOpDestroy);
	ncclResult_t res = comm_check(comm);

	arg(c, (uint64_t)op);
	argp(c, comm);
	if (res == ncclSuccess && ((int)op < ncclNumOps || !op_ok(op)))
		res = ncclInvalidArgument;
	return call_end(c, res);
}

/* The stubs that only record their arguments and return one result, from one list. */
#define ARGP(x)		     argp(c, x);
#define ARG(x)		     arg(c, (uint64_t)(x));
#define NCCLSTUB_PARAMS(...) __VA_ARGS__
#define NCCLSTUB_CALL(name, params, record, result)                                                \
	STUB_API(ncclResult_t, name, NCCLSTUB_PARAMS params)                                       \
	{                                                                                          \
		struct ncclstub_call *c = call_begin(NCCLSTUB_##name);                             \
                                                                                                   \
		record return call_end(c, result);                                                 \
	}
#include "tools/ncclstub/ncclstub_calls.def"
#undef NCCLSTUB_CALL
#undef NCCLSTUB_PARAMS
#undef ARG
#undef ARGP

/* nccl.h declares the two without a prototype. */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

STUB_API(ncclResult_t, ncclGroupStart, void)
{
	struct ncclstub_call *c = call_begin(NCCLSTUB_ncclGroupStart);

	group_depth++;
	out(c, (uint64_t)group_depth);
	return call_end(c, ncclSuccess);
}

/* Without a matching ncclGroupStart, NCCL answers ncclInvalidUsage. */
STUB_API(ncclResult_t, ncclGroupEnd, void)
{
	struct ncclstub_call *c = call_begin(NCCLSTUB_ncclGroupEnd);

	if (group_depth == 0)
		return call_end(c, ncclInvalidUsage);
	group_depth--;
	out(c, (uint64_t)group_depth);
	return call_end(c, ncclSuccess);
}

#ifndef NCCLSTUB_OLD
/* Ends the group like ncclGroupEnd; the estimate is made up from the group depth. */
STUB_API(ncclResult_t, ncclGroupSimulateEnd, ncclSimInfo_t *simInfo)
{
	struct ncclstub_call *c = call_begin(NCCLSTUB_ncclGroupSimulateEnd);
	float estimate = 1.5f * (float)group_depth;
	uint32_t bits;

	argp(c, simInfo);
	if (group_depth == 0)
		return call_end(c, ncclInvalidUsage);
	if (simInfo && (simInfo->magic != STUB_SIMINFO_MAGIC ||
			simInfo->size < offsetof(ncclSimInfo_t, estimatedTime) + sizeof(float)))
		return call_end(c, ncclInvalidArgument);
	group_depth--;
	out(c, (uint64_t)group_depth);
	if (simInfo) {
		simInfo->estimatedTime = estimate;
		memcpy(&bits, &estimate, sizeof(bits));
		out(c, bits);
	}
	return call_end(c, ncclSuccess);
}
#endif
