/*
 * The NCCL pass-through test. Linked against the NCCL test double (libnccl.so.2 from
 * ncclstub.c) like an application linked with -lnccl, it calls every function of NCCL's API
 * with distinctive arguments, run bare or under LD_PRELOAD=libr2cc.so, and checks through
 * the stub's call log that each call reached NCCL exactly once with exactly its arguments
 * and that results and out-parameters came back unchanged, errors included.
 *
 * Each call runs in a window: the log is cleared, the call made, and every record the call
 * caused must be claimed by a check. Unclaimed records are failures, except queries
 * (ncclCommCount and the like) that a wrapper may make to learn about a communicator.
 * Built with NCCLSTUB_OLD it is the program of an NCCL 2.18 installation (no ncclAlltoAll,
 * ncclCommShrink, ...). --inject=KIND plants one wrong expectation, to prove that the
 * checks catch it; see usage().
 */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/ncclstub/ncclstub.h"

#define P(x) ((uint64_t)(uintptr_t)(x))
#define I(x) ((uint64_t)(x))

/* Buffers and streams are never dereferenced by the stub: distinctive fake addresses. */
#define BUF(k)	  ((void *)(uintptr_t)(0x5e0d00000000ULL + 0x10000ULL * (k)))
#define RBUF(k)	  ((void *)(uintptr_t)(0x7ec000000000ULL + 0x10000ULL * (k)))
#define STREAM(k) ((cudaStream_t)(uintptr_t)(0x57e400000000ULL + 0x100ULL * (k)))

#define WINDOW_MAX  64
#define EXIT_CHECKS 1
#define EXIT_SETUP  2

struct window {
	const char *what;
	size_t n;
	struct ncclstub_call rec[WINDOW_MAX];
	bool used[WINDOW_MAX];
};

static int failures;
static int calls_checked;
static int wrapper_queries;
static const char *inject;
/* --strict: R2CC_MODE=0 promises plain NCCL, so no extra query and no marker either. */
static bool strict;
static bool inject_done;
/* ncclGetUniqueId is interposed: bytes 40-127 of a new id may carry the wrapper's marker. */
static bool id_tail_free;

static bool injecting(const char *kind)
{
	if (!inject || inject_done || strcmp(inject, kind) != 0)
		return false;
	inject_done = true;
	return true;
}

static void fail(const struct window *w, const char *fmt, ...)
{
	va_list ap;

	failures++;
	printf("FAIL [%s] ", w->what);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
}

static void dump(const struct ncclstub_call *c)
{
	printf("     %s depth %d result %d args", ncclstub_fn_name(c->fn), c->depth, c->result);
	for (int i = 0; i < c->nargs; i++)
		printf(" %#llx", (unsigned long long)c->args[i]);
	printf(" outs");
	for (int i = 0; i < c->nouts; i++)
		printf(" %#llx", (unsigned long long)c->outs[i]);
	putchar('\n');
}

static void win_begin(struct window *w, const char *what)
{
	w->what = what;
	w->n = 0;
	ncclstub_log_clear();
}

/* Takes the log of the call just made into the window. */
static void win_collect(struct window *w)
{
	size_t n = ncclstub_log_count();

	if (n > WINDOW_MAX) {
		fail(w, "%zu calls reached NCCL, more than any wrapper should make", n);
		n = WINDOW_MAX;
	}
	for (w->n = 0; w->n < n; w->n++) {
		if (ncclstub_log_get(w->n, &w->rec[w->n]) != 0)
			break;
		w->used[w->n] = false;
	}
}

static bool args_equal(const struct ncclstub_call *c, const uint64_t *args, int nargs)
{
	return c->nargs == nargs &&
	       (nargs == 0 || memcmp(c->args, args, sizeof(*args) * (size_t)nargs) == 0);
}

/*
 * Claims the record of one call to fn at the given depth: the first whose arguments are
 * args (nargs -1: any arguments), else the first of fn, reported as a mismatch.
 */
static struct ncclstub_call *take(struct window *w, enum ncclstub_fn fn, int depth,
				  const uint64_t *args, int nargs)
{
	int first = -1;

	for (size_t i = 0; i < w->n; i++) {
		if (w->used[i] || w->rec[i].fn != fn || w->rec[i].depth != depth)
			continue;
		if (nargs < 0 || args_equal(&w->rec[i], args, nargs)) {
			first = (int)i;
			break;
		}
		if (first < 0)
			first = (int)i;
	}
	calls_checked++;
	if (first < 0) {
		fail(w, "%s (depth %d) never reached NCCL", ncclstub_fn_name(fn), depth);
		return NULL;
	}
	w->used[first] = true;
	if (nargs >= 0 && !args_equal(&w->rec[first], args, nargs)) {
		fail(w, "%s reached NCCL with other arguments; expected:", ncclstub_fn_name(fn));
		printf("     ");
		for (int i = 0; i < nargs; i++)
			printf(" %#llx", (unsigned long long)args[i]);
		printf("\n     got:\n");
		dump(&w->rec[first]);
	}
	return &w->rec[first];
}

#define NARGS(...) ((int)(sizeof((const uint64_t[]){__VA_ARGS__}) / sizeof(uint64_t)))
#define TAKE(w, fn, depth, ...)                                                                    \
	take(w, NCCLSTUB_##fn, depth, (const uint64_t[]){__VA_ARGS__}, NARGS(__VA_ARGS__))
#define TAKE_NOARGS(w, fn, depth) take(w, NCCLSTUB_##fn, depth, NULL, 0)
#define TAKE_ANY(w, fn, depth)	  take(w, NCCLSTUB_##fn, depth, NULL, -1)

static bool is_query(enum ncclstub_fn fn)
{
	switch (fn) {
	case NCCLSTUB_ncclGetVersion:
	case NCCLSTUB_ncclGetErrorString:
	case NCCLSTUB_ncclGetLastError:
	case NCCLSTUB_ncclCommGetAsyncError:
	case NCCLSTUB_ncclCommCount:
	case NCCLSTUB_ncclCommCuDevice:
	case NCCLSTUB_ncclCommUserRank:
		return true;
	default:
		return false;
	}
}

/* Every record not claimed must be a wrapper's query; anything else is an extra call. */
static void win_end(struct window *w)
{
	for (size_t i = 0; i < w->n; i++) {
		if (w->used[i])
			continue;
		if (!strict && is_query(w->rec[i].fn)) {
			wrapper_queries++;
			continue;
		}
		fail(w, "extra call reached NCCL:");
		dump(&w->rec[i]);
	}
}

static void expect_result(struct window *w, const struct ncclstub_call *c, int got, int planned)
{
	if (!c)
		return;
	if (c->result != got)
		fail(w, "%s: NCCL returned %d, the caller got %d", ncclstub_fn_name(c->fn),
		     c->result, got);
	if (got != planned)
		fail(w, "%s returned %d, the test planned %d", ncclstub_fn_name(c->fn), got,
		     planned);
}

static void expect_outs(struct window *w, const struct ncclstub_call *c, const uint64_t *outs,
			int nouts)
{
	if (!c)
		return;
	if (c->nouts != nouts) {
		fail(w, "%s: NCCL wrote %d out-values, the caller sees %d", ncclstub_fn_name(c->fn),
		     c->nouts, nouts);
		return;
	}
	for (int i = 0; i < nouts; i++)
		if (c->outs[i] != outs[i])
			fail(w, "%s: out-value %d: NCCL wrote %#llx, the caller got %#llx",
			     ncclstub_fn_name(c->fn), i, (unsigned long long)c->outs[i],
			     (unsigned long long)outs[i]);
}

#define EXPECT_OUTS(w, c, ...)                                                                     \
	expect_outs(w, c, (const uint64_t[]){__VA_ARGS__}, NARGS(__VA_ARGS__))
#define EXPECT_NO_OUTS(w, c) expect_outs(w, c, NULL, 0)

/* Bytes [from, to) of logged id i must be the caller's. */
static void expect_id(struct window *w, const struct ncclstub_call *c, int i, const void *id,
		      size_t from, size_t to)
{
	const unsigned char *b = id;

	if (!c)
		return;
	if (i >= c->nids) {
		fail(w, "%s: unique id %d missing from the log", ncclstub_fn_name(c->fn), i);
		return;
	}
	for (size_t k = from; k < to; k++)
		if (c->ids[i][k] != b[k]) {
			fail(w, "%s: unique id %d byte %zu: NCCL has %#x, the caller %#x",
			     ncclstub_fn_name(c->fn), i, k, c->ids[i][k], b[k]);
			return;
		}
}

/* before: the caller's config as it was before the call; after: the caller's config now. */
static void expect_config(struct window *w, const struct ncclstub_call *c,
			  const ncclConfig_t *before, const ncclConfig_t *after)
{
	size_t bytes = before->size < sizeof(*before) ? before->size : sizeof(*before);

	if (c && (c->config_bytes != bytes || memcmp(c->config, before, bytes) != 0))
		fail(w, "%s: NCCL read %zu config bytes that differ from the caller's %zu",
		     ncclstub_fn_name(c->fn), c->config_bytes, bytes);
	if (memcmp(before, after, bytes) != 0)
		fail(w, "the caller's config was changed");
}

static void expect_ints(struct window *w, const struct ncclstub_call *c, const int *v, int n)
{
	if (c && (c->nints != n || memcmp(c->ints, v, sizeof(*v) * (size_t)n) != 0))
		fail(w, "%s: NCCL read another int list", ncclstub_fn_name(c->fn));
}

static void expect_true(struct window *w, bool ok, const char *what)
{
	if (!ok)
		fail(w, "%s", what);
}

/* A unique id with known bytes that no wrapper wrote: a foreign or hand-made id. */
static ncclUniqueId known_id(unsigned seed)
{
	ncclUniqueId id;

	for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
		id.internal[i] = (char)(seed * 13 + (unsigned)i * 29 + 5);
	id.internal[NCCLSTUB_ID_FAIL_BYTE] = 0x11;
	return id;
}

static ncclUniqueId new_id(const char *what)
{
	struct window w;
	ncclUniqueId id;
	struct ncclstub_call *c;
	int res;

	memset(&id, 0x3c, sizeof(id));
	win_begin(&w, what);
	res = ncclGetUniqueId(&id);
	win_collect(&w);
	c = TAKE(&w, ncclGetUniqueId, 0, P(&id));
	expect_result(&w, c, res, ncclSuccess);
	expect_id(&w, c, 0, &id, 0,
		  id_tail_free ? NCCLSTUB_ID_MARKER_OFFSET : NCCL_UNIQUE_ID_BYTES);
	win_end(&w);
	return id;
}

static ncclComm_t init_rank(const char *what, int nranks, ncclUniqueId id, int rank, int planned)
{
	struct window w;
	ncclComm_t comm = (ncclComm_t)(uintptr_t)0xdeadbeef;
	ncclUniqueId sent = id;
	struct ncclstub_call *c;
	int res;

	win_begin(&w, what);
	res = ncclCommInitRank(&comm, nranks, id, rank);
	win_collect(&w);
	c = TAKE(&w, ncclCommInitRank, 0, P(&comm), I(nranks), 0, I(rank));
	expect_result(&w, c, res, planned);
	if (injecting("id"))
		sent.internal[NCCL_UNIQUE_ID_BYTES - 1] ^= 1;
	expect_id(&w, c, 0, &sent, 0, NCCL_UNIQUE_ID_BYTES);
	EXPECT_OUTS(&w, c, P(comm));
	win_end(&w);
	return comm;
}

/* ncclCommCount, ncclCommCuDevice or ncclCommUserRank on comm, expected to give want. */
static void query(const char *what, enum ncclstub_fn fn, ncclComm_t comm, int want)
{
	struct window w;
	int value = -12345, res;
	struct ncclstub_call *c;

	win_begin(&w, what);
	res = fn == NCCLSTUB_ncclCommCount	? ncclCommCount(comm, &value)
	      : fn == NCCLSTUB_ncclCommCuDevice ? ncclCommCuDevice(comm, &value)
						: ncclCommUserRank(comm, &value);
	win_collect(&w);
	c = take(&w, fn, 0, (const uint64_t[]){P(comm), P(&value)}, 2);
	expect_result(&w, c, res, ncclSuccess);
	EXPECT_OUTS(&w, c, I(value + injecting("out")));
	expect_true(&w, value == want, "query gave an unplanned value");
	win_end(&w);
}

static void queries(const char *what, ncclComm_t comm, int nranks, int rank, int dev)
{
	query(what, NCCLSTUB_ncclCommCount, comm, nranks);
	query(what, NCCLSTUB_ncclCommUserRank, comm, rank);
	query(what, NCCLSTUB_ncclCommCuDevice, comm, dev);
}

/* ncclCommDestroy / Finalize / Abort: fn picks which. */
static void comm_end(const char *what, enum ncclstub_fn fn, ncclComm_t comm, int planned)
{
	struct window w;
	struct ncclstub_call *c;
	int res;

	win_begin(&w, what);
	res = fn == NCCLSTUB_ncclCommDestroy	? ncclCommDestroy(comm)
	      : fn == NCCLSTUB_ncclCommFinalize ? ncclCommFinalize(comm)
						: ncclCommAbort(comm);
	win_collect(&w);
	c = take(&w, fn, 0, (const uint64_t[]){P(comm)}, 1);
	expect_result(&w, c, res, planned);
	EXPECT_NO_OUTS(&w, c);
	win_end(&w);
}

static void check_version(void)
{
	struct window w;
	struct ncclstub_call *c;
	int version = 0, res;

	win_begin(&w, "ncclGetVersion");
	res = ncclGetVersion(&version);
	win_collect(&w);
	c = TAKE(&w, ncclGetVersion, 0, P(&version));
	expect_result(&w, c, res, ncclSuccess);
	EXPECT_OUTS(&w, c, I(version));
	expect_true(&w, version == ncclstub_version(), "version is not the stub's");
	win_end(&w);

	win_begin(&w, "ncclGetVersion(NULL)");
	res = ncclGetVersion(NULL);
	win_collect(&w);
	c = TAKE(&w, ncclGetVersion, 0, 0);
	expect_result(&w, c, res, ncclInvalidArgument);
	win_end(&w);
}

static void check_unique_id(void)
{
	struct window w;
	struct ncclstub_call *c;
	int res;

	/* A wrapper may only write its marker on success: here there is nowhere to write. */
	win_begin(&w, "ncclGetUniqueId(NULL)");
	res = ncclGetUniqueId(NULL);
	win_collect(&w);
	c = TAKE(&w, ncclGetUniqueId, 0, 0);
	expect_result(&w, c, res, ncclInvalidArgument);
	win_end(&w);
}

struct comms {
	ncclComm_t one;	  /* 1 rank, id from ncclGetUniqueId */
	ncclComm_t four;  /* rank 2 of 4, known id */
	ncclComm_t eight; /* rank 5 of 8, known id, full config */
};

static ncclComm_t init_config(const char *what, int nranks, ncclUniqueId id, int rank,
			      ncclConfig_t *cfg, int planned)
{
	struct window w;
	ncclComm_t comm = (ncclComm_t)(uintptr_t)0xdeadbeef;
	ncclConfig_t before = {0};
	struct ncclstub_call *c;
	int res;

	if (cfg)
		memcpy(&before, cfg, sizeof(before));
	win_begin(&w, what);
	res = ncclCommInitRankConfig(&comm, nranks, id, rank, cfg);
	win_collect(&w);
	c = TAKE(&w, ncclCommInitRankConfig, 0, P(&comm), I(nranks), 0, I(rank), P(cfg));
	expect_result(&w, c, res, planned);
	expect_id(&w, c, 0, &id, 0, NCCL_UNIQUE_ID_BYTES);
	if (cfg && before.magic == 0xcafebeef)
		expect_config(&w, c, &before, cfg);
	EXPECT_OUTS(&w, c, P(comm));
	win_end(&w);
	return comm;
}

static void check_inits(struct comms *cs)
{
	ncclConfig_t full = NCCL_CONFIG_INITIALIZER, nonblocking = NCCL_CONFIG_INITIALIZER;
	ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
	/* A 2.18-sized config: the callee must not read or write past its size. */
	union {
		ncclConfig_t cfg;
		unsigned char bytes[sizeof(ncclConfig_t) + 64];
	} old;
	ncclUniqueId id;
	ncclComm_t comm;
	struct window w;

	id = new_id("ncclGetUniqueId");
	cs->one = init_rank("ncclCommInitRank, id from ncclGetUniqueId", 1, id, 0, ncclSuccess);
	queries("queries on the 1-rank comm", cs->one, 1, 0, 7);

	cs->four = init_rank("ncclCommInitRank, known id", 4, known_id(4), 2, ncclSuccess);
	queries("queries on the 4-rank comm", cs->four, 4, 2, 5);

	init_rank("ncclCommInitRank, rank out of range", 4, known_id(5), 4, ncclInvalidArgument);
	init_rank("ncclCommInitRank, no ranks", 0, known_id(6), 0, ncclInvalidArgument);
	id = new_id("ncclGetUniqueId for a failing init");
	id.internal[NCCLSTUB_ID_FAIL_BYTE] = NCCLSTUB_ID_FAIL(ncclRemoteError);
	init_rank("ncclCommInitRank, remote error", 1, id, 0, ncclRemoteError);

	full.blocking = 1;
	full.cgaClusterSize = 2;
	full.minCTAs = 3;
	full.maxCTAs = 17;
	full.netName = "Socket";
	full.splitShare = 1;
	full.trafficClass = 106;
	full.commName = "ncclstub-full";
	full.collnetEnable = 0;
	full.CTAPolicy = NCCL_CTA_POLICY_EFFICIENCY;
	full.shrinkShare = 1;
	full.nvlsCTAs = 9;
	full.nChannelsPerNetPeer = 5;
	full.nvlinkCentricSched = 1;
	cs->eight = init_config("ncclCommInitRankConfig, full config", 8, known_id(8), 5, &full,
				ncclSuccess);
	queries("queries on the 8-rank comm", cs->eight, 8, 5, 2);

	nonblocking.blocking = 0;
	comm = init_config("ncclCommInitRankConfig, non-blocking", 3, known_id(3), 1, &nonblocking,
			   ncclInProgress);
	{
		ncclResult_t async = ncclSuccess;
		struct ncclstub_call *c;
		int res;

		win_begin(&w, "ncclCommGetAsyncError, init in progress");
		res = ncclCommGetAsyncError(comm, &async);
		win_collect(&w);
		c = TAKE(&w, ncclCommGetAsyncError, 0, P(comm), P(&async));
		expect_result(&w, c, res, ncclSuccess);
		EXPECT_OUTS(&w, c, I(async));
		expect_true(&w, async == ncclInProgress, "async error is not ncclInProgress");
		win_end(&w);
	}
	comm_end("ncclCommAbort, non-blocking comm", NCCLSTUB_ncclCommAbort, comm, ncclSuccess);

	memset(old.bytes, 0xa5, sizeof(old.bytes));
	old.cfg.size = offsetof(ncclConfig_t, trafficClass);
	old.cfg.magic = 0xcafebeef;
	old.cfg.version = 21805;
	old.cfg.blocking = 1;
	old.cfg.cgaClusterSize = 4;
	old.cfg.minCTAs = 1;
	old.cfg.maxCTAs = 32;
	old.cfg.netName = "IB";
	old.cfg.splitShare = 0;
	w.what = "ncclCommInitRankConfig, 2.18-sized config";
	comm = init_config("ncclCommInitRankConfig, 2.18-sized config", 2, known_id(2), 1, &old.cfg,
			   ncclSuccess);
	for (size_t i = old.cfg.size; i < sizeof(old.bytes); i++)
		if (old.bytes[i] != 0xa5) {
			fail(&w, "byte %zu past the config's size was written", i);
			break;
		}
	comm_end("ncclCommDestroy, 2-rank comm", NCCLSTUB_ncclCommDestroy, comm, ncclSuccess);

	comm = init_config("ncclCommInitRankConfig, NULL config", 2, known_id(9), 0, NULL,
			   ncclSuccess);
	comm_end("ncclCommDestroy, NULL-config comm", NCCLSTUB_ncclCommDestroy, comm, ncclSuccess);
	bad.magic = 0x12345678;
	init_config("ncclCommInitRankConfig, bad magic", 2, known_id(10), 0, &bad,
		    ncclInvalidArgument);
}

/* ncclCommInitAll: one call, a nested ncclGetUniqueId, internal per-rank inits. */
static void init_all(const char *what, int ndev, const int *devlist, ncclComm_t *comms, int planned)
{
	struct window w;
	struct ncclstub_call *c, *idc;
	const unsigned char *first_id = NULL;
	int res;

	for (int i = 0; i < ndev; i++)
		comms[i] = (ncclComm_t)(uintptr_t)0xdeadbeef;
	win_begin(&w, what);
	res = ncclCommInitAll(comms, ndev, devlist);
	win_collect(&w);
	c = TAKE(&w, ncclCommInitAll, 0, P(comms), I(ndev), P(devlist));
	expect_result(&w, c, res, planned);
	if (devlist)
		expect_ints(&w, c, devlist, ndev);
	if (planned != ncclSuccess) {
		win_end(&w);
		return;
	}
	{
		uint64_t outs[NCCLSTUB_MAX_OUTS];

		for (int i = 0; i < ndev; i++)
			outs[i] = P(comms[i]);
		expect_outs(&w, c, outs, ndev);
	}
	/* NCCL's own ncclGetUniqueId call: a wrapper may mark the id, as for the caller's. */
	idc = TAKE_ANY(&w, ncclGetUniqueId, 1);
	expect_result(&w, idc, ncclSuccess, ncclSuccess);
	for (int i = 0; i < ndev; i++) {
		struct ncclstub_call *ic = TAKE(&w, internal_init, 1, P(comms + i), I(ndev), 0,
						I(i), I(devlist ? devlist[i] : i));

		expect_result(&w, ic, ncclSuccess, ncclSuccess);
		if (!ic || ic->nids != 1)
			continue;
		if (idc && idc->nids == 1)
			expect_id(&w, ic, 0, idc->ids[0], 0,
				  id_tail_free ? NCCLSTUB_ID_MARKER_OFFSET : NCCL_UNIQUE_ID_BYTES);
		if (!first_id)
			first_id = ic->ids[0];
		expect_id(&w, ic, 0, first_id, 0, NCCL_UNIQUE_ID_BYTES);
	}
	win_end(&w);
}

static void check_init_all(void)
{
	const int devs[3] = {6, 4, 2}, bad[2] = {1, -1};
	ncclComm_t comms[3];

	init_all("ncclCommInitAll, devlist", 3, devs, comms, ncclSuccess);
	queries("queries on an InitAll comm", comms[1], 3, 1, 4);
	for (int i = 0; i < 3; i++)
		comm_end("ncclCommDestroy, InitAll comm", NCCLSTUB_ncclCommDestroy, comms[i],
			 ncclSuccess);
	init_all("ncclCommInitAll, no devlist", 2, NULL, comms, ncclSuccess);
	queries("queries on an InitAll comm", comms[1], 2, 1, 1);
	for (int i = 0; i < 2; i++)
		comm_end("ncclCommDestroy, InitAll comm", NCCLSTUB_ncclCommDestroy, comms[i],
			 ncclSuccess);
	init_all("ncclCommInitAll, bad device", 2, bad, comms, ncclInvalidArgument);
}

static ncclComm_t split(const char *what, ncclComm_t parent, int color, int key, ncclConfig_t *cfg)
{
	struct window w;
	ncclComm_t child = (ncclComm_t)(uintptr_t)0xdeadbeef;
	ncclConfig_t before = {0};
	struct ncclstub_call *c;
	int res;

	if (cfg)
		before = *cfg;
	win_begin(&w, what);
	res = ncclCommSplit(parent, color, key, &child, cfg);
	win_collect(&w);
	c = TAKE(&w, ncclCommSplit, 0, P(parent), I(color), I(key), P(&child), P(cfg));
	expect_result(&w, c, res, ncclSuccess);
	if (cfg)
		expect_config(&w, c, &before, cfg);
	EXPECT_OUTS(&w, c, P(child));
	win_end(&w);
	return child;
}

static void check_split(const struct comms *cs)
{
	ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
	ncclComm_t child;

	child = split("ncclCommSplit", cs->eight, 3, 13, NULL);
	queries("queries on a split comm", child, 8, 5, 2);
	comm_end("ncclCommDestroy, split comm", NCCLSTUB_ncclCommDestroy, child, ncclSuccess);
	cfg.splitShare = 1;
	cfg.commName = "ncclstub-split";
	child = split("ncclCommSplit, config", cs->four, 0, -1, &cfg);
	queries("queries on a split comm", child, 4, 3, 5);
	comm_end("ncclCommFinalize, split comm", NCCLSTUB_ncclCommFinalize, child, ncclSuccess);
	comm_end("ncclCommDestroy, split comm", NCCLSTUB_ncclCommDestroy, child, ncclSuccess);
	child = split("ncclCommSplit, NOCOLOR", cs->eight, NCCL_SPLIT_NOCOLOR, 0, NULL);
	{
		struct window w = {.what = "ncclCommSplit, NOCOLOR"};

		expect_true(&w, child == NULL, "NOCOLOR split gave a communicator");
	}
}

#ifndef NCCLSTUB_OLD
static void check_shrink(const struct comms *cs)
{
	int exclude[2] = {1, 6};
	ncclComm_t child = (ncclComm_t)(uintptr_t)0xdeadbeef;
	ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER, before;
	struct ncclstub_call *c;
	struct window w;
	int res;

	cfg.shrinkShare = 1;
	before = cfg;
	win_begin(&w, "ncclCommShrink");
	res = ncclCommShrink(cs->eight, exclude, 2, &child, &cfg, NCCL_SHRINK_ABORT);
	win_collect(&w);
	c = TAKE(&w, ncclCommShrink, 0, P(cs->eight), P(exclude), 2, P(&child), P(&cfg),
		 NCCL_SHRINK_ABORT);
	expect_result(&w, c, res, ncclSuccess);
	expect_ints(&w, c, exclude, 2);
	expect_config(&w, c, &before, &cfg);
	EXPECT_OUTS(&w, c, P(child));
	win_end(&w);
	queries("queries on a shrunk comm", child, 6, 4, 2);
	comm_end("ncclCommDestroy, shrunk comm", NCCLSTUB_ncclCommDestroy, child, ncclSuccess);

	exclude[0] = 5;
	child = (ncclComm_t)(uintptr_t)0xdeadbeef;
	win_begin(&w, "ncclCommShrink, excluding itself");
	res = ncclCommShrink(cs->eight, exclude, 1, &child, NULL, NCCL_SHRINK_DEFAULT);
	win_collect(&w);
	c = TAKE(&w, ncclCommShrink, 0, P(cs->eight), P(exclude), 1, P(&child), 0,
		 NCCL_SHRINK_DEFAULT);
	expect_result(&w, c, res, ncclInvalidArgument);
	win_end(&w);
}

static void check_scalable(void)
{
	ncclUniqueId ids[3] = {known_id(31), known_id(32), known_id(33)};
	ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER, before;
	ncclComm_t comm = (ncclComm_t)(uintptr_t)0xdeadbeef;
	struct ncclstub_call *c;
	struct window w;
	int res;

	cfg.commName = "ncclstub-scalable";
	before = cfg;
	win_begin(&w, "ncclCommInitRankScalable, 3 known ids");
	res = ncclCommInitRankScalable(&comm, 6, 4, 3, ids, &cfg);
	win_collect(&w);
	c = TAKE(&w, ncclCommInitRankScalable, 0, P(&comm), 6, 4, 3, P(ids), P(&cfg));
	expect_result(&w, c, res, ncclSuccess);
	for (int i = 0; i < 3; i++)
		expect_id(&w, c, i, &ids[i], 0, NCCL_UNIQUE_ID_BYTES);
	expect_config(&w, c, &before, &cfg);
	EXPECT_OUTS(&w, c, P(comm));
	win_end(&w);
	queries("queries on a scalable comm", comm, 6, 4, 3);
	comm_end("ncclCommDestroy, scalable comm", NCCLSTUB_ncclCommDestroy, comm, ncclSuccess);

	ids[0] = new_id("ncclGetUniqueId for ncclCommInitRankScalable");
	comm = (ncclComm_t)(uintptr_t)0xdeadbeef;
	win_begin(&w, "ncclCommInitRankScalable, id from ncclGetUniqueId");
	res = ncclCommInitRankScalable(&comm, 1, 0, 1, ids, NULL);
	win_collect(&w);
	c = TAKE(&w, ncclCommInitRankScalable, 0, P(&comm), 1, 0, 1, P(ids), 0);
	expect_result(&w, c, res, ncclSuccess);
	expect_id(&w, c, 0, &ids[0], 0, NCCL_UNIQUE_ID_BYTES);
	EXPECT_OUTS(&w, c, P(comm));
	win_end(&w);
	comm_end("ncclCommDestroy, scalable comm", NCCLSTUB_ncclCommDestroy, comm, ncclSuccess);
}

static void check_memory(const struct comms *cs)
{
	struct window w;
	struct ncclstub_call *c;
	void *ptr = NULL, *handle = NULL;
	ncclWindow_t win = NULL;
	int res;

	win_begin(&w, "ncclMemAlloc");
	res = ncclMemAlloc(&ptr, 3 << 20);
	win_collect(&w);
	c = TAKE(&w, ncclMemAlloc, 0, P(&ptr), 3 << 20);
	expect_result(&w, c, res, ncclSuccess);
	EXPECT_OUTS(&w, c, P(ptr));
	win_end(&w);

	win_begin(&w, "ncclCommRegister");
	res = ncclCommRegister(cs->eight, ptr, 1 << 20, &handle);
	win_collect(&w);
	c = TAKE(&w, ncclCommRegister, 0, P(cs->eight), P(ptr), 1 << 20, P(&handle));
	expect_result(&w, c, res, ncclSuccess);
	EXPECT_OUTS(&w, c, P(handle));
	win_end(&w);

	win_begin(&w, "ncclCommWindowRegister");
	res = ncclCommWindowRegister(cs->four, ptr, 2 << 20, &win, NCCL_WIN_COLL_SYMMETRIC);
	win_collect(&w);
	c = TAKE(&w, ncclCommWindowRegister, 0, P(cs->four), P(ptr), 2 << 20, P(&win),
		 NCCL_WIN_COLL_SYMMETRIC);
	expect_result(&w, c, res, ncclSuccess);
	EXPECT_OUTS(&w, c, P(win));
	win_end(&w);

	win_begin(&w, "ncclCommWindowDeregister");
	res = ncclCommWindowDeregister(cs->four, win);
	win_collect(&w);
	c = TAKE(&w, ncclCommWindowDeregister, 0, P(cs->four), P(win));
	expect_result(&w, c, res, ncclSuccess);
	win_end(&w);

	win_begin(&w, "ncclCommDeregister");
	res = ncclCommDeregister(cs->eight, handle);
	win_collect(&w);
	c = TAKE(&w, ncclCommDeregister, 0, P(cs->eight), P(handle));
	expect_result(&w, c, res, ncclSuccess);
	win_end(&w);

	handle = BUF(99);
	win_begin(&w, "ncclCommRegister, system error");
	res = ncclCommRegister(cs->eight, ptr, NCCLSTUB_FAIL_SIZE(ncclSystemError), &handle);
	win_collect(&w);
	c = TAKE(&w, ncclCommRegister, 0, P(cs->eight), P(ptr), NCCLSTUB_FAIL_SIZE(ncclSystemError),
		 P(&handle));
	expect_result(&w, c, res, ncclSystemError);
	expect_true(&w, handle == BUF(99), "failed registration wrote the handle");
	win_end(&w);

	win_begin(&w, "ncclMemFree");
	res = ncclMemFree(ptr);
	win_collect(&w);
	c = TAKE(&w, ncclMemFree, 0, P(ptr));
	expect_result(&w, c, res, ncclSuccess);
	win_end(&w);

	ptr = BUF(98);
	win_begin(&w, "ncclMemAlloc, unhandled cuda error");
	res = ncclMemAlloc(&ptr, NCCLSTUB_FAIL_SIZE(ncclUnhandledCudaError));
	win_collect(&w);
	c = TAKE(&w, ncclMemAlloc, 0, P(&ptr), NCCLSTUB_FAIL_SIZE(ncclUnhandledCudaError));
	expect_result(&w, c, res, ncclUnhandledCudaError);
	expect_true(&w, ptr == BUF(98), "failed allocation wrote the pointer");
	win_end(&w);
}
#endif

static void all_reduce(const char *what, int k, size_t count, ncclDataType_t type, ncclRedOp_t op,
		       ncclComm_t comm, cudaStream_t stream, int planned)
{
	struct window w;
	struct ncclstub_call *c;
	int res;

	win_begin(&w, what);
	if (injecting("extra"))
		ncclReduce(BUF(k), RBUF(k), count, type, op, 0, comm, stream);
	res = ncclAllReduce(BUF(k), RBUF(k), count, type, op, comm, stream);
	win_collect(&w);
	c = TAKE(&w, ncclAllReduce, 0, P(BUF(k)), P(RBUF(k)), count + injecting("arg"), I(type),
		 I(op), P(comm), P(stream));
	expect_result(&w, c, injecting("result") ? res ^ 1 : res, planned);
	EXPECT_NO_OUTS(&w, c);
	win_end(&w);
}

static void check_redop(const struct comms *cs)
{
	struct window w;
	struct ncclstub_call *c;
	ncclRedOp_t op = ncclSum, op2 = ncclSum;
	float scale = 0.25f;
	int res;

	win_begin(&w, "ncclRedOpCreatePreMulSum, host scalar");
	res =
	    ncclRedOpCreatePreMulSum(&op, &scale, ncclFloat32, ncclScalarHostImmediate, cs->eight);
	win_collect(&w);
	c = TAKE(&w, ncclRedOpCreatePreMulSum, 0, P(&op), P(&scale), ncclFloat32,
		 ncclScalarHostImmediate, P(cs->eight));
	expect_result(&w, c, res, ncclSuccess);
	EXPECT_OUTS(&w, c, I(op));
	expect_true(&w, c && c->data_bytes == sizeof(scale) && !memcmp(c->data, &scale, 4),
		    "NCCL read another scalar");
	win_end(&w);

	win_begin(&w, "ncclRedOpCreatePreMulSum, device scalar");
	res = ncclRedOpCreatePreMulSum(&op2, BUF(77), ncclFloat64, ncclScalarDevice, cs->four);
	win_collect(&w);
	c = TAKE(&w, ncclRedOpCreatePreMulSum, 0, P(&op2), P(BUF(77)), ncclFloat64,
		 ncclScalarDevice, P(cs->four));
	expect_result(&w, c, res, ncclSuccess);
	EXPECT_OUTS(&w, c, I(op2));
	win_end(&w);

	all_reduce("ncclAllReduce, PreMulSum op", 40, 4096, ncclFloat32, op, cs->eight, STREAM(4),
		   ncclSuccess);
	all_reduce("ncclAllReduce, second PreMulSum op", 41, 8192, ncclFloat64, op2, cs->four,
		   STREAM(5), ncclSuccess);

	win_begin(&w, "ncclRedOpDestroy");
	res = ncclRedOpDestroy(op, cs->eight);
	win_collect(&w);
	c = TAKE(&w, ncclRedOpDestroy, 0, I(op), P(cs->eight));
	expect_result(&w, c, res, ncclSuccess);
	win_end(&w);

	win_begin(&w, "ncclRedOpDestroy, built-in op");
	res = ncclRedOpDestroy(ncclMax, cs->eight);
	win_collect(&w);
	c = TAKE(&w, ncclRedOpDestroy, 0, I(ncclMax), P(cs->eight));
	expect_result(&w, c, res, ncclInvalidArgument);
	win_end(&w);
}

/* The collectives with a root or peer, and those without an op; fn picks which. */
static void coll(const char *what, enum ncclstub_fn fn, int k, size_t count, ncclDataType_t type,
		 ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream, int planned)
{
	const void *s = BUF(k);
	void *r = RBUF(k);
	struct window w;
	struct ncclstub_call *c = NULL;
	int res = -1;
	bool missing = fn == NCCLSTUB_ncclAllGather && injecting("missing");

	win_begin(&w, what);
	switch (fn) {
	case NCCLSTUB_ncclReduce:
		res = ncclReduce(s, r, count, type, op, root, comm, stream);
		break;
	case NCCLSTUB_ncclBroadcast:
		res = ncclBroadcast(s, r, count, type, root, comm, stream);
		break;
	case NCCLSTUB_ncclReduceScatter:
		res = ncclReduceScatter(s, r, count, type, op, comm, stream);
		break;
	case NCCLSTUB_ncclAllGather:
		res = missing ? planned : (int)ncclAllGather(s, r, count, type, comm, stream);
		break;
#ifndef NCCLSTUB_OLD
	case NCCLSTUB_ncclAlltoAll:
		res = ncclAlltoAll(s, r, count, type, comm, stream);
		break;
	case NCCLSTUB_ncclGather:
		res = ncclGather(s, r, count, type, root, comm, stream);
		break;
	case NCCLSTUB_ncclScatter:
		res = ncclScatter(s, r, count, type, root, comm, stream);
		break;
#endif
	case NCCLSTUB_ncclSend:
		res = ncclSend(s, count, type, root, comm, stream);
		break;
	case NCCLSTUB_ncclRecv:
		res = ncclRecv(r, count, type, root, comm, stream);
		break;
	default:
		break;
	}
	win_collect(&w);
	switch (fn) {
	case NCCLSTUB_ncclReduce:
		c = TAKE(&w, ncclReduce, 0, P(s), P(r), count, I(type), I(op), I(root), P(comm),
			 P(stream));
		break;
	case NCCLSTUB_ncclReduceScatter:
		c = TAKE(&w, ncclReduceScatter, 0, P(s), P(r), count, I(type), I(op), P(comm),
			 P(stream));
		break;
	case NCCLSTUB_ncclAllGather:
	case NCCLSTUB_ncclAlltoAll:
		c = take(&w, fn, 0,
			 (const uint64_t[]){P(s), P(r), count, I(type), P(comm), P(stream)}, 6);
		break;
	case NCCLSTUB_ncclBroadcast:
	case NCCLSTUB_ncclGather:
	case NCCLSTUB_ncclScatter:
		c = take(
		    &w, fn, 0,
		    (const uint64_t[]){P(s), P(r), count, I(type), I(root), P(comm), P(stream)}, 7);
		break;
	case NCCLSTUB_ncclSend:
		c = TAKE(&w, ncclSend, 0, P(s), count, I(type), I(root), P(comm), P(stream));
		break;
	case NCCLSTUB_ncclRecv:
		c = TAKE(&w, ncclRecv, 0, P(r), count, I(type), I(root), P(comm), P(stream));
		break;
	default:
		fail(&w, "no such collective");
	}
	expect_result(&w, c, res, planned);
	EXPECT_NO_OUTS(&w, c);
	win_end(&w);
}

/* ncclBcast: one call, and inside it NCCL's own call of the exported ncclBroadcast. */
static void bcast(const char *what, int k, size_t count, ncclDataType_t type, int root,
		  ncclComm_t comm, cudaStream_t stream, int planned)
{
	struct window w;
	struct ncclstub_call *c;
	int res;

	win_begin(&w, what);
	res = ncclBcast(BUF(k), count, type, root, comm, stream);
	win_collect(&w);
	c = TAKE(&w, ncclBcast, 0, P(BUF(k)), count, I(type), I(root), P(comm), P(stream));
	expect_result(&w, c, res, planned);
	c = TAKE(&w, ncclBroadcast, 1, P(BUF(k)), P(BUF(k)), count, I(type), I(root), P(comm),
		 P(stream));
	expect_result(&w, c, res, planned);
	win_end(&w);
}

static void group_call(const char *what, bool start, int planned)
{
	struct window w;
	struct ncclstub_call *c;
	int res;

	win_begin(&w, what);
	res = start ? ncclGroupStart() : ncclGroupEnd();
	win_collect(&w);
	if (start)
		c = TAKE_NOARGS(&w, ncclGroupStart, 0);
	else
		c = TAKE_NOARGS(&w, ncclGroupEnd, 0);
	expect_result(&w, c, res, planned);
	win_end(&w);
}

static void check_collectives(const struct comms *cs)
{
	static const struct {
		ncclDataType_t type;
		ncclRedOp_t op;
	} combos[] = {
	    {ncclFloat32, ncclSum},    {ncclBfloat16, ncclAvg},	  {ncclInt64, ncclMax},
	    {ncclUint8, ncclMin},      {ncclFloat16, ncclProd},	  {ncclInt32, ncclSum},
	    {ncclUint64, ncclMax},     {ncclFloat64, ncclAvg},	  {ncclInt8, ncclMin},
	    {ncclUint32, ncclProd},
#ifndef NCCLSTUB_OLD
	    {ncclFloat8e4m3, ncclMax}, {ncclFloat8e5m2, ncclSum},
#endif
	};

	for (int i = 0; i < (int)(sizeof(combos) / sizeof(combos[0])); i++)
		all_reduce("ncclAllReduce", i, (size_t)1 << (i + 8), combos[i].type, combos[i].op,
			   i % 2 ? cs->four : cs->eight, i % 3 ? STREAM(i) : NULL, ncclSuccess);
	all_reduce("ncclAllReduce, count 0", 20, 0, ncclFloat32, ncclSum, cs->one, STREAM(1),
		   ncclSuccess);
	all_reduce("ncclAllReduce, remote error", 21, NCCLSTUB_FAIL_SIZE(ncclRemoteError),
		   ncclFloat32, ncclSum, cs->eight, STREAM(2), ncclRemoteError);
	all_reduce("ncclAllReduce, NULL comm", 22, 64, ncclFloat32, ncclSum, NULL, STREAM(2),
		   ncclInvalidArgument);
	all_reduce("ncclAllReduce, bad type", 23, 64, (ncclDataType_t)ncclNumTypes, ncclSum,
		   cs->eight, STREAM(2), ncclInvalidArgument);
#ifdef NCCLSTUB_OLD
	all_reduce("ncclAllReduce, Float8 on 2.18", 24, 64, ncclFloat8e4m3, ncclSum, cs->eight,
		   STREAM(2), ncclInvalidArgument);
#endif

	coll("ncclBroadcast, root 0", NCCLSTUB_ncclBroadcast, 30, 1000, ncclInt8, ncclSum, 0,
	     cs->eight, STREAM(3), ncclSuccess);
	coll("ncclBroadcast, root 7", NCCLSTUB_ncclBroadcast, 31, 1001, ncclFloat16, ncclSum, 7,
	     cs->eight, NULL, ncclSuccess);
	coll("ncclBroadcast, root out of range", NCCLSTUB_ncclBroadcast, 32, 1002, ncclFloat16,
	     ncclSum, 8, cs->eight, NULL, ncclInvalidArgument);
	coll("ncclReduce", NCCLSTUB_ncclReduce, 33, 777, ncclUint32, ncclProd, 3, cs->four,
	     STREAM(6), ncclSuccess);
	coll("ncclReduce, root 0, Max", NCCLSTUB_ncclReduce, 34, 778, ncclBfloat16, ncclMax, 0,
	     cs->eight, STREAM(7), ncclSuccess);
	coll("ncclAllGather", NCCLSTUB_ncclAllGather, 35, 4097, ncclUint64, ncclSum, -1, cs->eight,
	     STREAM(8), ncclSuccess);
	coll("ncclAllGather, internal error", NCCLSTUB_ncclAllGather, 36,
	     NCCLSTUB_FAIL_SIZE(ncclInternalError), ncclInt32, ncclSum, -1, cs->four, STREAM(8),
	     ncclInternalError);
	coll("ncclReduceScatter", NCCLSTUB_ncclReduceScatter, 37, 333, ncclFloat64, ncclMin, -1,
	     cs->four, STREAM(9), ncclSuccess);
	coll("ncclReduceScatter, Avg", NCCLSTUB_ncclReduceScatter, 38, 334, ncclFloat32, ncclAvg,
	     -1, cs->eight, STREAM(9), ncclSuccess);
#ifndef NCCLSTUB_OLD
	coll("ncclAlltoAll", NCCLSTUB_ncclAlltoAll, 50, 2048, ncclInt32, ncclSum, -1, cs->eight,
	     STREAM(10), ncclSuccess);
	coll("ncclGather", NCCLSTUB_ncclGather, 51, 512, ncclFloat16, ncclSum, 2, cs->eight,
	     STREAM(11), ncclSuccess);
	coll("ncclScatter", NCCLSTUB_ncclScatter, 52, 256, ncclUint8, ncclSum, 1, cs->four,
	     STREAM(12), ncclSuccess);
	coll("ncclScatter, remote error", NCCLSTUB_ncclScatter, 53,
	     NCCLSTUB_FAIL_SIZE(ncclRemoteError), ncclUint8, ncclSum, 3, cs->four, STREAM(12),
	     ncclRemoteError);
#endif
	bcast("ncclBcast, root 6", 60, 12345, ncclInt64, 6, cs->eight, STREAM(13), ncclSuccess);
	bcast("ncclBcast, root 1", 61, 7, ncclUint8, 1, cs->four, NULL, ncclSuccess);
	bcast("ncclBcast, remote error", 62, NCCLSTUB_FAIL_SIZE(ncclRemoteError), ncclInt64, 0,
	      cs->eight, STREAM(13), ncclRemoteError);

	/* Point-to-point in a group, as NCCL requires for a send/receive pair. */
	group_call("ncclGroupStart", true, ncclSuccess);
	coll("ncclSend, peer 3", NCCLSTUB_ncclSend, 70, 1 << 16, ncclFloat32, ncclSum, 3, cs->eight,
	     STREAM(14), ncclSuccess);
	coll("ncclRecv, peer 6", NCCLSTUB_ncclRecv, 71, 1 << 16, ncclFloat32, ncclSum, 6, cs->eight,
	     STREAM(14), ncclSuccess);
	coll("ncclSend, peer 0", NCCLSTUB_ncclSend, 72, 99, ncclBfloat16, ncclSum, 0, cs->four,
	     STREAM(15), ncclSuccess);
	coll("ncclRecv, peer 3", NCCLSTUB_ncclRecv, 73, 99, ncclBfloat16, ncclSum, 3, cs->four,
	     STREAM(15), ncclSuccess);
	group_call("ncclGroupEnd", false, ncclSuccess);

	/* Nested groups, collectives inside. */
	group_call("ncclGroupStart, outer", true, ncclSuccess);
	group_call("ncclGroupStart, inner", true, ncclSuccess);
	all_reduce("ncclAllReduce in a group", 80, 1 << 20, ncclFloat32, ncclSum, cs->eight,
		   STREAM(16), ncclSuccess);
	all_reduce("ncclAllReduce in a group, other comm", 81, 1 << 19, ncclBfloat16, ncclSum,
		   cs->four, STREAM(17), ncclSuccess);
	coll("ncclRecv in a group, bad peer", NCCLSTUB_ncclRecv, 82, 5, ncclInt8, ncclSum, 4,
	     cs->four, STREAM(17), ncclInvalidArgument);
	group_call("ncclGroupEnd, inner", false, ncclSuccess);
	coll("ncclReduce in the outer group", NCCLSTUB_ncclReduce, 83, 55, ncclInt32, ncclSum, 1,
	     cs->four, STREAM(17), ncclSuccess);
	group_call("ncclGroupEnd, outer", false, ncclSuccess);
	group_call("ncclGroupEnd without ncclGroupStart", false, ncclInvalidUsage);

#ifndef NCCLSTUB_OLD
	{
		ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
		struct ncclstub_call *c;
		struct window w;
		uint32_t bits;
		int res;

		group_call("ncclGroupStart before ncclGroupSimulateEnd", true, ncclSuccess);
		all_reduce("ncclAllReduce, simulated", 90, 1 << 24, ncclFloat16, ncclSum, cs->eight,
			   STREAM(18), ncclSuccess);
		win_begin(&w, "ncclGroupSimulateEnd");
		res = ncclGroupSimulateEnd(&sim);
		win_collect(&w);
		c = TAKE(&w, ncclGroupSimulateEnd, 0, P(&sim));
		expect_result(&w, c, res, ncclSuccess);
		memcpy(&bits, &sim.estimatedTime, sizeof(bits));
		EXPECT_OUTS(&w, c, 0, bits);
		win_end(&w);
	}
#endif
}

static void check_errors(const struct comms *cs)
{
	struct window w;
	struct ncclstub_call *c;
	const char *s;

	for (int r = 0; r <= ncclNumResults; r++) {
		win_begin(&w, "ncclGetErrorString");
		s = ncclGetErrorString((ncclResult_t)r);
		win_collect(&w);
		c = TAKE(&w, ncclGetErrorString, 0, I(r));
		EXPECT_OUTS(&w, c, P(s));
		expect_result(&w, c, -1, -1);
		win_end(&w);
	}
	all_reduce("ncclAllReduce, remote error before ncclGetLastError", 95,
		   NCCLSTUB_FAIL_SIZE(ncclRemoteError), ncclFloat32, ncclSum, cs->eight, NULL,
		   ncclRemoteError);
	win_begin(&w, "ncclGetLastError");
	s = ncclGetLastError(cs->eight);
	win_collect(&w);
	c = TAKE(&w, ncclGetLastError, 0, P(cs->eight));
	EXPECT_OUTS(&w, c, P(s));
	expect_true(&w, s && strstr(s, "ncclAllReduce failed with 6"), "another last error");
	win_end(&w);

	{
		ncclResult_t async = ncclInProgress;
		int res;

		win_begin(&w, "ncclCommGetAsyncError");
		res = ncclCommGetAsyncError(cs->eight, &async);
		win_collect(&w);
		c = TAKE(&w, ncclCommGetAsyncError, 0, P(cs->eight), P(&async));
		expect_result(&w, c, res, ncclSuccess);
		EXPECT_OUTS(&w, c, I(async));
		win_end(&w);

		win_begin(&w, "ncclCommGetAsyncError, NULL comm");
		res = ncclCommGetAsyncError(NULL, &async);
		win_collect(&w);
		c = TAKE(&w, ncclCommGetAsyncError, 0, 0, P(&async));
		expect_result(&w, c, res, ncclInvalidArgument);
		win_end(&w);
	}
}

static void check_teardown(const struct comms *cs)
{
#ifndef NCCLSTUB_OLD
	struct window w;
	struct ncclstub_call *c;
	int res;

	win_begin(&w, "ncclCommRevoke, bad flags");
	res = ncclCommRevoke(cs->eight, 5);
	win_collect(&w);
	c = TAKE(&w, ncclCommRevoke, 0, P(cs->eight), 5);
	expect_result(&w, c, res, ncclInvalidArgument);
	win_end(&w);

	win_begin(&w, "ncclCommRevoke");
	res = ncclCommRevoke(cs->eight, NCCL_REVOKE_DEFAULT);
	win_collect(&w);
	c = TAKE(&w, ncclCommRevoke, 0, P(cs->eight), NCCL_REVOKE_DEFAULT);
	expect_result(&w, c, res, ncclSuccess);
	win_end(&w);
#endif
	comm_end("ncclCommFinalize", NCCLSTUB_ncclCommFinalize, cs->four, ncclSuccess);
	comm_end("ncclCommFinalize, NULL", NCCLSTUB_ncclCommFinalize, NULL, ncclInvalidArgument);
	comm_end("ncclCommDestroy, NULL", NCCLSTUB_ncclCommDestroy, NULL, ncclSuccess);
	comm_end("ncclCommAbort, NULL", NCCLSTUB_ncclCommAbort, NULL, ncclSuccess);
	comm_end("ncclCommDestroy", NCCLSTUB_ncclCommDestroy, cs->four, ncclSuccess);
	comm_end("ncclCommAbort", NCCLSTUB_ncclCommAbort, cs->eight, ncclSuccess);
	comm_end("ncclCommDestroy, 1-rank comm", NCCLSTUB_ncclCommDestroy, cs->one, ncclSuccess);
}

/* Names the design says a wrapper must interpose (docs/architecture.md, Interposition facts). */
static const char *const must_wrap[] = {
    "ncclGetUniqueId", "ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitRankScalable",
    "ncclCommInitAll", "ncclCommSplit",	   "ncclCommShrink",	     "ncclCommDestroy",
    "ncclCommAbort",   "ncclCommFinalize", "ncclAllReduce",	     "ncclBroadcast",
    "ncclBcast",       "ncclReduce",	   "ncclAllGather",	     "ncclReduceScatter",
    "ncclSend",	       "ncclRecv",	   "ncclAlltoAll",	     "ncclGather",
    "ncclScatter",     "ncclGroupStart",   "ncclGroupEnd",
};

static const char *const all_names[] = {
#define NAME(name) #name,
    NCCLSTUB_FUNCS(NAME, NAME)
#undef NAME
};

static void *stub_handle;

/* Where the program's calls to name go: NULL when nowhere, else the object's path. */
static const char *resolved_in(const char *name, void **addr_p)
{
	Dl_info info;

	*addr_p = dlsym(RTLD_DEFAULT, name);
	if (!*addr_p || !dladdr(*addr_p, &info))
		return NULL;
	return info.dli_fname;
}

static bool interposed(const char *name)
{
	void *addr;

	return resolved_in(name, &addr) && addr != dlsym(stub_handle, name);
}

/* --expect-direct: every NCCL call goes to the stub. --expect-wrapped: the must-wrap
 * functions the stub has go to libr2cc.so. */
static void check_resolution(bool want_wrapped, bool want_direct)
{
	struct window w = {.what = "symbol resolution"};
	int n = 0;

	for (size_t i = 0; i < sizeof(all_names) / sizeof(all_names[0]); i++) {
		void *addr;
		const char *obj = resolved_in(all_names[i], &addr);

		if (!dlsym(stub_handle, all_names[i]) || !interposed(all_names[i]))
			continue;
		n++;
		printf("interposed: %s -> %s\n", all_names[i], obj ? obj : "?");
		if (want_direct)
			fail(&w, "%s does not resolve to the stub", all_names[i]);
	}
	printf("%d NCCL functions interposed\n", n);
	for (size_t i = 0; want_wrapped && i < sizeof(must_wrap) / sizeof(must_wrap[0]); i++) {
		void *addr;
		const char *obj = resolved_in(must_wrap[i], &addr);

		if (!dlsym(stub_handle, must_wrap[i]))
			continue;
		if (!obj || !interposed(must_wrap[i]) || !strstr(obj, "libr2cc"))
			fail(&w, "%s is not wrapped by libr2cc.so (resolves to %s)", must_wrap[i],
			     obj ? obj : "nothing");
	}
}

#ifdef NCCLSTUB_OLD
/*
 * A program may look a function up by name to learn whether NCCL has it. A wrapper the
 * preloaded library exports for a function this NCCL lacks must then fail cleanly, without
 * reaching NCCL and without crashing.
 */
static void check_absent(const struct comms *cs)
{
	struct window w;
	void *f;
	int res;

	f = dlsym(RTLD_DEFAULT, "ncclAlltoAll");
	if (f) {
		win_begin(&w, "wrapper of absent ncclAlltoAll");
		res = ((__typeof__(&ncclAlltoAll))f)(BUF(1), RBUF(1), 64, ncclFloat32, cs->eight,
						     STREAM(1));
		win_collect(&w);
		expect_true(&w, res != ncclSuccess, "absent ncclAlltoAll returned success");
		win_end(&w);
	}
	f = dlsym(RTLD_DEFAULT, "ncclGather");
	if (f) {
		win_begin(&w, "wrapper of absent ncclGather");
		res = ((__typeof__(&ncclGather))f)(BUF(1), RBUF(1), 64, ncclFloat32, 0, cs->eight,
						   STREAM(1));
		win_collect(&w);
		expect_true(&w, res != ncclSuccess, "absent ncclGather returned success");
		win_end(&w);
	}
	f = dlsym(RTLD_DEFAULT, "ncclScatter");
	if (f) {
		win_begin(&w, "wrapper of absent ncclScatter");
		res = ((__typeof__(&ncclScatter))f)(BUF(1), RBUF(1), 64, ncclFloat32, 0, cs->eight,
						    STREAM(1));
		win_collect(&w);
		expect_true(&w, res != ncclSuccess, "absent ncclScatter returned success");
		win_end(&w);
	}
	f = dlsym(RTLD_DEFAULT, "ncclCommShrink");
	if (f) {
		int exclude[1] = {0};
		ncclComm_t child = NULL;

		win_begin(&w, "wrapper of absent ncclCommShrink");
		res = ((__typeof__(&ncclCommShrink))f)(cs->eight, exclude, 1, &child, NULL,
						       NCCL_SHRINK_DEFAULT);
		win_collect(&w);
		expect_true(&w, res != ncclSuccess, "absent ncclCommShrink returned success");
		win_end(&w);
	}
	f = dlsym(RTLD_DEFAULT, "ncclCommInitRankScalable");
	if (f) {
		ncclUniqueId id = known_id(40);
		ncclComm_t comm = NULL;

		win_begin(&w, "wrapper of absent ncclCommInitRankScalable");
		res = ((__typeof__(&ncclCommInitRankScalable))f)(&comm, 2, 0, 1, &id, NULL);
		win_collect(&w);
		expect_true(&w, res != ncclSuccess,
			    "absent ncclCommInitRankScalable returned success");
		win_end(&w);
	}
}
#endif

static void usage(const char *prog)
{
	fprintf(
	    stderr,
	    "usage: %s [--expect-direct | --expect-wrapped] [--strict] [--inject=KIND]\n"
	    "  --expect-direct   every NCCL function must resolve to the stub (no preload)\n"
	    "  --expect-wrapped  the functions R2CC must wrap must resolve to libr2cc.so\n"
	    "  --strict          no extra call at all, unique ids unchanged (for R2CC_MODE=0)\n"
	    "  --inject=KIND     plant one wrong expectation; the run must then fail (exit 1):\n"
	    "                    arg, id, result, out, missing, extra\n"
	    "exit status: 0 all checks passed, 1 a check failed, 2 bad usage or setup\n",
	    prog);
}

int main(int argc, char **argv)
{
	bool want_wrapped = false, want_direct = false;
	struct comms cs;
	Dl_info info;

	setvbuf(stdout, NULL, _IOLBF, 0);
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--expect-wrapped")) {
			want_wrapped = true;
		} else if (!strcmp(argv[i], "--expect-direct")) {
			want_direct = true;
		} else if (!strcmp(argv[i], "--strict")) {
			strict = true;
		} else if (!strncmp(argv[i], "--inject=", 9)) {
			inject = argv[i] + 9;
		} else {
			usage(argv[0]);
			return EXIT_SETUP;
		}
	}
	if (!dladdr((void *)ncclstub_log_count, &info) ||
	    !(stub_handle = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD))) {
		fprintf(stderr, "passthrough: cannot find the NCCL stub: %s\n", dlerror());
		return EXIT_SETUP;
	}
	printf("NCCL stub %s (version %d)\n", info.dli_fname, ncclstub_version());
	check_resolution(want_wrapped, want_direct);
	id_tail_free = !strict && interposed("ncclGetUniqueId");

	check_version();
	check_unique_id();
	check_inits(&cs);
	check_init_all();
	check_split(&cs);
#ifndef NCCLSTUB_OLD
	check_shrink(&cs);
	check_scalable();
	check_memory(&cs);
#else
	check_absent(&cs);
#endif
	check_redop(&cs);
	check_collectives(&cs);
	check_errors(&cs);
	check_teardown(&cs);

	printf("%d calls checked, %d extra queries by a wrapper, %d failures\n", calls_checked,
	       wrapper_queries, failures);
	if (inject && !inject_done) {
		fprintf(stderr, "passthrough: nothing to inject for '%s'\n", inject);
		return EXIT_SETUP;
	}
	return failures ? EXIT_CHECKS : 0;
}
