/*
 * R2CC-AllReduce executed against the test double (threads as ranks, host
 * memory), compared element for element with a reference AllReduce computed
 * here from the generated inputs. Input values are chosen per type and op so
 * that every partial result is exactly representable: the result then does
 * not depend on the order of reduction, and any difference is a bug.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strategies/allreduce2.h"
#include "tests/unit/test_strategies_double.h"

extern int r2cc_test_warnings;

#define MAX_RANKS  16
#define MAX_COUNTS 48
#define CANARY	   64

struct shape {
	const char *name;
	int nnodes, per;
	bool interleave;
	int degraded; /* node index; -1: none */
	int nics, failed;
	int degraded2; /* a second degraded node, -1: none */
};

struct run {
	struct shape sh;
	int dtype, op;
	bool inplace;
	struct r2cc_ar2_cfg cfg;
	unsigned flags;
	size_t counts[MAX_COUNTS];
	int ncounts;
	unsigned seed;
	bool check_result;
	int fail_split_rank, fail_stream_rank; /* -1: none */
	pthread_barrier_t before_destroy;
	/* a second view applied before the last count, -1: none */
	int new_degraded;
	bool abort;	  /* destroy with abort */
	bool abort_waits; /* the double's comm_abort waits for every kernel, as NCCL's */
	int sub_error;	  /* a sub-communicator's async error before destroy, 0: none */
	/* per node NICs and failed NICs instead of the shape's (use_failv), of the
	 * second view (use_failv2); per call flags instead of `flags` (use_call_flags) */
	bool use_failv, use_failv2, use_call_flags;
	int nicsv[MAX_RANKS], failv[MAX_RANKS], failv2[MAX_RANKS];
	unsigned call_flags[MAX_COUNTS];
	bool types_per_call; /* call n: type n / 4, op n % 4 (instead of dtype, op) */
	/* filled by the run */
	struct dbl_world *w;
	int nranks;
	int map[MAX_RANKS], nics[MAX_RANKS], failed[MAX_RANKS], failed2[MAX_RANKS];
	struct result {
		char err[512];
		enum r2cc_ar2_reason why[MAX_COUNTS];
		int parent_allreduces[MAX_COUNTS], parent_bcasts[MAX_COUNTS], ncalls[MAX_COUNTS][5];
		int live_comms_before_destroy;
		int aborts;
		int async_before, async_after; /* r2cc_ar2_comm_async_error */
		unsigned long captured;	       /* r2cc_ar2_comm_captured */
		int live_comms_after_view;     /* sub-communicators after the second view */
	} res[MAX_RANKS];
};

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* The type and op of call n. */
#define DT(run, n) ((run)->types_per_call ? (int)(n) / 4 % R2CC_NCCL_NUM_TYPES : (run)->dtype)
#define OP(run, n) ((run)->types_per_call ? (int)(n) % 4 : (run)->op)

static bool is_fp8(int dtype)
{
	return dtype == R2CC_NCCL_FLOAT8E4M3 || dtype == R2CC_NCCL_FLOAT8E5M2;
}

/* Input value of element i on rank r; exact in every type, see the header. */
static double gen(const struct run *run, int r, size_t i, unsigned call)
{
	uint64_t h =
	    mix(((uint64_t)run->seed << 40) ^ ((uint64_t)call << 32) ^ ((uint64_t)r << 24) ^ i);
	bool fl = dbl_is_float(DT(run, call)), sg = dbl_is_signed(DT(run, call));
	static const double prodf[] = {1, -1, 2, 0.5}, fp8mm[] = {-2, -1, -0.5, 0, 0.5, 1, 2, 3};

	switch (OP(run, call)) {
	case R2CC_NCCL_SUM:
		if (is_fp8(DT(run, call)))
			return (double)(h % 3) - 1;
		return fl || sg ? (double)(h % 9) - 4 : (double)(h % 5);
	case R2CC_NCCL_PROD:
		if (fl)
			return prodf[h % 4];
		return sg ? (double)(h % 3) - 1 + (h % 3 == 1 ? 2 : 0) : (double)(h % 3) + 1;
	default:
		if (is_fp8(DT(run, call)))
			return fp8mm[h % 8];
		if (fl)
			return ((double)(h % 64) - 32) * 0.25;
		return sg ? (double)(h % 200) - 100 : (double)(h % 250);
	}
}

static void store(int dtype, double v, void *p)
{
	int64_t iv = (int64_t)v;

	if (dbl_is_float(dtype))
		dbl_encode(dtype, v, p);
	else
		memcpy(p, &iv, r2cc_nccl_type_size(dtype)); /* little-endian low bytes */
}

/* The reference: fold the inputs of all ranks in exact arithmetic. */
static void expect(const struct run *run, size_t i, unsigned call, void *out)
{
	double acc = gen(run, 0, i, call), v;
	uint64_t iacc = (uint64_t)(int64_t)acc;
	int r;

	for (r = 1; r < run->nranks; r++) {
		v = gen(run, r, i, call);
		switch (OP(run, call)) {
		case R2CC_NCCL_SUM:
			acc += v;
			iacc += (uint64_t)(int64_t)v;
			break;
		case R2CC_NCCL_PROD:
			acc *= v;
			iacc *= (uint64_t)(int64_t)v;
			break;
		case R2CC_NCCL_MAX:
			acc = v > acc ? v : acc;
			iacc = (uint64_t)(int64_t)acc;
			break;
		default:
			acc = v < acc ? v : acc;
			iacc = (uint64_t)(int64_t)acc;
			break;
		}
	}
	if (dbl_is_float(DT(run, call)))
		dbl_encode(DT(run, call), acc, out);
	else
		memcpy(out, &iacc, r2cc_nccl_type_size(DT(run, call)));
}

static void fail_rank(struct result *res, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void fail_rank(struct result *res, const char *fmt, ...)
{
	va_list ap;

	if (res->err[0])
		return;
	va_start(ap, fmt);
	vsnprintf(res->err, sizeof(res->err), fmt, ap);
	va_end(ap);
}

struct targ {
	struct run *run;
	int rank;
};

static void *rank_main(void *p)
{
	struct targ *t = p;
	struct run *run = t->run;
	struct result *res = &run->res[t->rank];
	struct r2cc_ar2_view view = {run->nranks, run->map, run->nics, run->failed};
	struct r2cc_ar2_view view2 = {run->nranks, run->map, run->nics, run->failed2};
	struct r2cc_ar2_comm *c;
	struct r2cc_ar2_ops ops;
	struct dbl_rank *dr = calloc(1, sizeof(*dr));
	unsigned char want[8];
	int ret, n;

	dbl_rank_init(dr, run->w, t->rank);
	dr->fail_split = t->rank == run->fail_split_rank;
	dr->fail_stream_create = t->rank == run->fail_stream_rank;
	ops = dbl_ops(dr);
	ret = r2cc_ar2_comm_create(&ops, dr->parent, &run->cfg, &view, &c);
	if (ret)
		fail_rank(res, "comm_create: %d", ret);
	for (n = 0; n < run->ncounts && !res->err[0]; n++) {
		int dtype = DT(run, n), op = OP(run, n);
		size_t esize = r2cc_nccl_type_size(dtype), count = run->counts[n],
		       bytes = count * esize, i;
		unsigned char *send = malloc(bytes + CANARY), *recv, *orig = malloc(bytes + 1);

		if (n > 0 && n == run->ncounts - 1 && run->new_degraded >= 0 &&
		    (ret = r2cc_ar2_comm_set_view(c, &view2))) {
			fail_rank(res, "set_view: %d", ret);
			free(send);
			free(orig);
			break;
		}
		if (n > 0 && n == run->ncounts - 1 && run->new_degraded >= 0)
			res->live_comms_after_view = dr->live_subs;
		recv = run->inplace ? send : malloc(bytes + CANARY);
		for (i = 0; i < count; i++)
			store(dtype, gen(run, t->rank, i, (unsigned)n), send + i * esize);
		memset(send + bytes, 0x5a, CANARY);
		if (!run->inplace)
			memset(recv, 0xa5, bytes + CANARY);
		memcpy(orig, send, bytes);

		dbl_begin(dr);
		ret = r2cc_ar2_allreduce(c, send, recv, count, dtype, op, &dr->user,
					 run->use_call_flags ? run->call_flags[n] : run->flags,
					 &res->why[n]);
		res->parent_allreduces[n] = dr->parent_allreduces;
		res->parent_bcasts[n] = dr->parent_bcasts;
		memcpy(res->ncalls[n], dr->ncalls, sizeof(dr->ncalls));
		if (ret)
			fail_rank(res, "call %d (count %zu): allreduce returned %d", n, count, ret);
		else if (dbl_check_order(dr))
			fail_rank(res, "call %d (count %zu): %s", n, count, dr->error);
		for (i = 0; i < count && run->check_result && !res->err[0]; i++) {
			expect(run, i, (unsigned)n, want);
			if (memcmp(want, recv + i * esize, esize))
				fail_rank(res,
					  "call %d (count %zu, %s): element %zu is %g, want %g", n,
					  count, run->inplace ? "in place" : "out of place", i,
					  dbl_is_float(dtype) ? dbl_decode(dtype, recv + i * esize)
							      : (double)recv[i * esize],
					  dbl_is_float(dtype) ? dbl_decode(dtype, want)
							      : (double)want[0]);
		}
		for (i = 0; i < CANARY; i++)
			if (recv[bytes + i] != (run->inplace ? 0x5a : 0xa5) ||
			    (!run->inplace && send[bytes + i] != 0x5a))
				fail_rank(res, "call %d: write past the end of a buffer", n);
		if (!run->inplace && memcmp(orig, send, bytes))
			fail_rank(res, "call %d: the send buffer was modified", n);
		free(orig);
		if (!run->inplace)
			free(recv);
		free(send);
	}
	pthread_barrier_wait(&run->before_destroy);
	res->captured = r2cc_ar2_comm_captured(c);
	res->live_comms_before_destroy = dbl_live_comms(run->w);
	res->async_before = r2cc_ar2_comm_async_error(c);
	dr->async_error = run->sub_error;
	res->async_after = r2cc_ar2_comm_async_error(c);
	pthread_barrier_wait(&run->before_destroy);
	dr->abort_waits_for_all = run->abort_waits;
	r2cc_ar2_comm_destroy(c, run->abort);
	res->aborts = dr->aborts;
	if (run->abort_waits && dr->error[0])
		fail_rank(res, "destroy with abort: %s", dr->error);
	free(dr);
	return NULL;
}

static void run_one(struct run *run)
{
	const struct shape *sh = &run->sh;
	pthread_t th[MAX_RANKS];
	struct targ targ[MAX_RANKS];
	char why[256];
	int r;

	run->nranks = sh->nnodes * sh->per;
	cr_assert_leq(run->nranks, MAX_RANKS);
	for (r = 0; r < run->nranks; r++)
		run->map[r] = 100 + 3 * (sh->interleave ? r % sh->nnodes : r / sh->per);
	for (r = 0; r < sh->nnodes; r++) {
		run->nics[r] = run->use_failv ? run->nicsv[r] : sh->nics;
		run->failed[r] = run->use_failv				   ? run->failv[r]
				 : r == sh->degraded || r == sh->degraded2 ? sh->failed
									   : 0;
		run->failed2[r] = run->use_failv2	   ? run->failv2[r]
				  : r == run->new_degraded ? sh->failed
							   : 0;
	}
	memset(run->res, 0, sizeof(run->res));
	run->w = dbl_world_new(run->nranks);
	pthread_barrier_init(&run->before_destroy, NULL, (unsigned)run->nranks);
	for (r = 0; r < run->nranks; r++) {
		targ[r].run = run;
		targ[r].rank = r;
		cr_assert_eq(pthread_create(&th[r], NULL, rank_main, &targ[r]), 0);
	}
	for (r = 0; r < run->nranks; r++)
		pthread_join(th[r], NULL);
	pthread_barrier_destroy(&run->before_destroy);
	cr_assert(!dbl_world_failed(run->w, why, sizeof(why)),
		  "%s dtype %d op %d %s K %d sched %d: %s", sh->name, run->dtype, run->op,
		  run->inplace ? "in place" : "out of place", run->cfg.chunks, run->cfg.schedule,
		  why);
	for (r = 0; r < run->nranks; r++)
		cr_assert(!run->res[r].err[0], "%s dtype %d op %d %s K %d sched %d rank %d: %s",
			  sh->name, run->dtype, run->op, run->inplace ? "in place" : "out of place",
			  run->cfg.chunks, run->cfg.schedule, r, run->res[r].err);
	cr_assert_eq(dbl_live_comms(run->w), 0, "sub-communicators left after destroy");
	cr_assert_eq(dbl_live_streams(run->w), 0, "streams left after destroy");
	cr_assert_eq(dbl_live_events(run->w), 0, "events left after destroy");
	dbl_world_free(run->w);
}

static void init_run(struct run *run, const struct shape *sh)
{
	memset(run, 0, sizeof(*run));
	run->sh = *sh;
	run->cfg.chunks = 4;
	run->check_result = true;
	run->fail_split_rank = -1;
	run->fail_stream_rank = -1;
	run->new_degraded = -1;
	run->dtype = R2CC_NCCL_FLOAT32;
	run->op = R2CC_NCCL_SUM;
	run->counts[0] = 1021;
	run->ncounts = 1;
}

static const struct shape shapes[] = {
    {"2x2 seed", 2, 2, false, 0, 3, 1, -1},
    {"4x1", 4, 1, false, 2, 4, 2, -1},
    {"3x2", 3, 2, false, 1, 2, 1, -1},
    {"8x1 wrap", 8, 1, false, 7, 8, 3, -1},
    {"3x2 interleaved", 3, 2, true, 0, 3, 2, -1},
};

static void matrix(const struct shape *sh)
{
	static const int ks[] = {1, 3, 4, 64};
	static const size_t counts[] = {1, 37, 1021, 4099};
	struct run *run = malloc(sizeof(*run));
	unsigned seed = 1;

	for (int dtype = 0; dtype < R2CC_NCCL_NUM_TYPES; dtype++)
		for (int op = 0; op < 4; op++)
			for (int inplace = 0; inplace < 2; inplace++)
				for (int sched = 0; sched < 4; sched++) {
					init_run(run, sh);
					run->dtype = dtype;
					run->op = op;
					run->inplace = inplace;
					run->cfg.schedule = sched;
					run->cfg.chunks = ks[(dtype + op + sched + inplace) % 4];
					memcpy(run->counts, counts, sizeof(counts));
					run->ncounts = 4;
					run->seed = seed++;
					run_one(run);
					for (int r = 0; r < run->nranks; r++)
						for (int n = 0; n < run->ncounts; n++)
							cr_assert_eq(run->res[r].why[n],
								     R2CC_AR2_RAN);
				}
	free(run);
}

Test(ar2_exec, matrix_2x2)
{
	matrix(&shapes[0]);
}

Test(ar2_exec, matrix_4x1)
{
	matrix(&shapes[1]);
}

Test(ar2_exec, matrix_3x2)
{
	matrix(&shapes[2]);
}

Test(ar2_exec, matrix_8x1)
{
	matrix(&shapes[3]);
}

Test(ar2_exec, matrix_3x2_interleaved)
{
	matrix(&shapes[4]);
}

/* The stage calls actually happen: a 3x2 call issues what section 5 says; schedule 0
 * broadcasts on its own communicator over all ranks, schedules 1-3 on the parent. */
Test(ar2_exec, issues_the_two_stages)
{
	struct run *run = malloc(sizeof(*run));

	for (int sched = 0; sched < 4; sched++) {
		init_run(run, &shapes[2]); /* 3 nodes x 2, node 1 degraded, helper rank 4 */
		run->counts[0] = 3000;
		run->cfg.chunks = 3;
		run->cfg.schedule = sched;
		run_one(run);
		for (int r = 0; r < 6; r++) {
			bool degraded = r == 2 || r == 3, helper = r == 4;
			int *nc = run->res[r].ncalls[0];

			cr_assert_eq(nc[DBL_SPLIT], sched == 0 ? 3 : 2, "rank %d", r);
			cr_assert_eq(nc[DBL_AGREE], 1);
			cr_assert_eq(run->res[r].parent_allreduces[0], 1); /* main part */
			cr_assert_eq(nc[DBL_ALLREDUCE], degraded ? 1 : 2, "rank %d", r);
			cr_assert_eq(nc[DBL_REDUCE], degraded || helper ? 3 : 0, "rank %d", r);
			cr_assert_eq(nc[DBL_BCAST], 3, "rank %d", r);
			cr_assert_eq(run->res[r].parent_bcasts[0], sched == 0 ? 0 : 3, "rank %d",
				     r);
			/* 4 healthy + 3 aPlusH, and 6 bcast with schedule 0 */
			cr_assert_eq(run->res[r].live_comms_before_destroy,
				     4 + 3 + (sched == 0 ? 6 : 0));
		}
	}
	free(run);
}

/* Destruction with the parent's abort aborts the sub-communicators. */
Test(ar2_exec, destroy_with_abort)
{
	struct run *run = malloc(sizeof(*run));

	init_run(run, &shapes[2]);
	run->abort = true;
	run_one(run); /* and run_one checks nothing is left */
	for (int r = 0; r < 6; r++)
		/* every rank: bcast; healthy ranks: healthy; the helper also aPlusH */
		cr_assert_eq(run->res[r].aborts, r == 4 ? 3 : 2, "rank %d", r);
	init_run(run, &shapes[2]);
	run_one(run);
	for (int r = 0; r < 6; r++)
		cr_assert_eq(run->res[r].aborts, 0);
	free(run);
}

/* NCCL's abort flags its communicator, then waits for every kernel of the
 * process (cuMemFree): the sub-communicators are aborted all at once, or the
 * first abort waits for kernels that only the later ones stop. */
Test(ar2_exec, abort_flags_every_sub_communicator_before_any_waits)
{
	struct run *run = malloc(sizeof(*run));

	init_run(run, &shapes[2]);
	run->abort = true;
	run->abort_waits = true;
	run_one(run);
	for (int r = 0; r < 6; r++)
		cr_assert_eq(run->res[r].aborts, r == 4 ? 3 : 2, "rank %d", r);
	free(run);
}

/* An error of a sub-communicator is the parent's (the job polls the parent and
 * would otherwise wait forever); none is reported while there is none. */
Test(ar2_exec, sub_communicator_errors_reach_the_parent)
{
	struct run *run = malloc(sizeof(*run));

	init_run(run, &shapes[2]);
	run->sub_error = 6; /* ncclRemoteError */
	run->abort = true;
	run_one(run);
	for (int r = 0; r < 6; r++) {
		cr_assert_eq(run->res[r].async_before, 0, "rank %d", r);
		cr_assert_eq(run->res[r].async_after, 6, "rank %d", r);
	}
	free(run);
}

/* Degenerate splits: a tail that rounds away, a main part that rounds away. */
Test(ar2_exec, degenerate_splits)
{
	static const struct shape sh = {"4x1 8 NICs", 4, 1, false, 1, 8, 1, -1};
	struct run *run = malloc(sizeof(*run));

	init_run(run, &sh);
	run->counts[0] = 31; /* main 7/8 * 31 rounds up to 32 > 31: no tail */
	run->counts[1] = 1;  /* main rounds to 0: everything is tail */
	run->ncounts = 2;
	run->inplace = true;
	run_one(run);
	for (int r = 0; r < 4; r++) {
		cr_assert_eq(run->res[r].why[0], R2CC_AR2_RAN);
		cr_assert_eq(run->res[r].ncalls[0][DBL_ALLREDUCE], 1);
		cr_assert_eq(run->res[r].ncalls[0][DBL_REDUCE] + run->res[r].ncalls[0][DBL_BCAST],
			     0);
		cr_assert_eq(run->res[r].parent_allreduces[1], 0);
		cr_assert_eq(run->res[r].ncalls[1][DBL_BCAST], 1);
	}
	free(run);
}

/* Sub-communicators are made once and reused. */
Test(ar2_exec, setup_once)
{
	struct run *run = malloc(sizeof(*run));

	init_run(run, &shapes[0]);
	run->counts[1] = 777;
	run->counts[2] = 5000;
	run->ncounts = 3;
	run_one(run);
	for (int r = 0; r < 4; r++) {
		cr_assert_eq(run->res[r].ncalls[0][DBL_SPLIT], 3);
		cr_assert_eq(run->res[r].ncalls[1][DBL_SPLIT], 0);
		cr_assert_eq(run->res[r].ncalls[2][DBL_AGREE], 0);
	}
	free(run);
}

/* A new view with another degraded node re-makes the sub-communicators. */
Test(ar2_exec, new_view)
{
	struct run *run = malloc(sizeof(*run));

	init_run(run, &shapes[2]);
	run->counts[1] = 2000;
	run->counts[2] = 3001;
	run->ncounts = 3;
	run->new_degraded = 2;
	run_one(run);
	for (int r = 0; r < 6; r++) {
		cr_assert_eq(run->res[r].ncalls[1][DBL_SPLIT], 0);
		cr_assert_eq(run->res[r].ncalls[2][DBL_SPLIT], 3);
		cr_assert_eq(run->res[r].why[2], R2CC_AR2_RAN);
	}
	free(run);
}

/* Two calls, both the plain AllReduce; warns = warnings expected from them. */
static void expect_fallback_warns(struct run *run, enum r2cc_ar2_reason want, int warns)
{
	int before = r2cc_test_warnings;

	run->counts[1] = 2048;
	run->ncounts = 2;
	run_one(run);
	for (int r = 0; r < run->nranks; r++)
		for (int n = 0; n < 2; n++) {
			int *nc = run->res[r].ncalls[n];

			cr_assert_eq(run->res[r].why[n], want,
				     "rank %d call %d: reason %d, want %d", r, n,
				     run->res[r].why[n], want);
			cr_assert_eq(run->res[r].parent_allreduces[n], 1);
			cr_assert_eq(nc[DBL_ALLREDUCE], 1);
			cr_assert_eq(nc[DBL_REDUCE] + nc[DBL_BCAST], 0);
			if (want != R2CC_AR2_FB_SETUP || n > 0)
				cr_assert_eq(nc[DBL_SPLIT] + nc[DBL_AGREE], 0);
		}
	cr_assert_eq(r2cc_test_warnings - before, warns, "warned %d times for reason %d",
		     r2cc_test_warnings - before, want);
}

static void expect_fallback(struct run *run, enum r2cc_ar2_reason want)
{
	expect_fallback_warns(run, want, 1);
}

Test(ar2_exec, fallbacks)
{
	static const struct shape one_node = {"1x4", 1, 4, false, 0, 3, 1, -1};
	static const struct shape healthy = {"2x2 healthy", 2, 2, false, -1, 3, 1, -1};
	static const struct shape all_bad = {"2x1 both degraded", 2, 1, false, 0, 3, 1, 1};
	static const struct shape no_nic = {"3x1 no NIC", 3, 1, false, 1, 2, 2, -1};
	static const struct shape many = {"10x1", 10, 1, false, -1, 4, 1, -1};
	struct run *run = malloc(sizeof(*run));

	init_run(run, &shapes[0]);
	run->cfg.min_bytes = 4 * 4096;
	run->counts[0] = 4095;
	expect_fallback_warns(run, R2CC_AR2_FB_SMALL, 0); /* the design: said at INFO */

	init_run(run, &shapes[0]);
	run->op = R2CC_NCCL_AVG;
	run->check_result = false;
	expect_fallback(run, R2CC_AR2_FB_OP);
	init_run(run, &shapes[0]);
	run->op = 5; /* a PreMulSum op: same reason, no second warning */
	run->check_result = false;
	run->counts[0] = 100;
	run->ncounts = 1;
	run_one(run);
	cr_assert_eq(run->res[0].why[0], R2CC_AR2_FB_OP);

	init_run(run, &shapes[1]);
	run->flags = R2CC_AR2_IN_GROUP;
	expect_fallback(run, R2CC_AR2_FB_GROUP);
	init_run(run, &shapes[1]);
	run->flags = R2CC_AR2_CAPTURING;
	expect_fallback(run, R2CC_AR2_FB_CAPTURE);
	init_run(run, &shapes[1]);
	run->flags = R2CC_AR2_NONBLOCKING;
	expect_fallback(run, R2CC_AR2_FB_NONBLOCKING);

	init_run(run, &one_node);
	expect_fallback_warns(run, R2CC_AR2_FB_ONE_NODE, 0);
	init_run(run, &healthy); /* a healthy job warns about nothing */
	expect_fallback_warns(run, R2CC_AR2_FB_NO_DEGRADED, 0);
	init_run(run, &all_bad);
	expect_fallback(run, R2CC_AR2_FB_NO_HEALTHY);
	init_run(run, &many); /* 9 degraded nodes of 10: more than R2CC_AR2_MAX_DEGRADED */
	run->use_failv = true;
	for (int i = 0; i < 10; i++) {
		run->nicsv[i] = 4;
		run->failv[i] = i < 9;
	}
	expect_fallback(run, R2CC_AR2_FB_MULTI);
	init_run(run, &no_nic);
	expect_fallback(run, R2CC_AR2_FB_NO_NIC);
	free(run);
}

Test(ar2_exec, split_failure_on_one_rank)
{
	struct run *run = malloc(sizeof(*run));

	for (int bad = 0; bad < 4; bad++) {
		init_run(run, &shapes[2]);
		run->fail_split_rank = bad;
		run->inplace = bad & 1;
		/* the bad rank says what failed; the reason is said once per process */
		expect_fallback_warns(run, R2CC_AR2_FB_SETUP, bad == 0 ? 2 : 1);
		for (int r = 0; r < run->nranks; r++) {
			cr_assert_eq(run->res[r].ncalls[0][DBL_SPLIT], 3);
			cr_assert_eq(run->res[r].ncalls[0][DBL_AGREE], 1);
			cr_assert_eq(run->res[r].live_comms_before_destroy, 0,
				     "a sub-communicator outlived the failed setup");
		}
	}
	free(run);
}

Test(ar2_exec, stream_failure_on_one_rank)
{
	struct run *run = malloc(sizeof(*run));

	init_run(run, &shapes[3]);
	run->fail_stream_rank = 5;
	expect_fallback_warns(run, R2CC_AR2_FB_SETUP, 2);
	for (int r = 0; r < run->nranks; r++)
		cr_assert_eq(run->res[r].live_comms_before_destroy, 0);
	free(run);
}

/* ---- several degraded nodes ---- */

static int popcount(unsigned x)
{
	return __builtin_popcount(x);
}

/*
 * Every set of 1-3 degraded nodes among n nodes (2 ranks a node up to 3 nodes,
 * interleaved at odd counts), NIC counts 2-8 varying by node, 1..K-1 of them
 * failed, for every type and op: the result against the reference, and the
 * schedule that ran (Balance only where every node is degraded). One test per n
 * (2-8): 245 sets in all, x 48 types and ops.
 */
static void every_failure_set(int n)
{
	/* K = 64: several_degraded_nodes_issue_their_stages */
	static const int ks[] = {1, 2, 3, 8};
	struct run *run = malloc(sizeof(*run));
	struct shape sh = {"multi", n, n <= 3 ? 2 : 1, n % 2 == 1, -1, 4, 1, -1};
	unsigned seed = 7 + 1000u * (unsigned)n;
	int sets = 0;

	for (unsigned set = 1; set < 1u << n; set++) {
		bool all = popcount(set) == n;

		if (popcount(set) > 3)
			continue;
		sets++;
		int v = (int)set;

		init_run(run, &sh);
		run->use_failv = true;
		for (int i = 0; i < n; i++) {
			run->nicsv[i] = 2 + (i + v) % 7;
			run->failv[i] = set >> i & 1 ? 1 + (i * 5 + v) % (run->nicsv[i] - 1) : 0;
		}
		/* every type and op, one call each */
		run->types_per_call = true;
		run->ncounts = 4 * R2CC_NCCL_NUM_TYPES;
		for (int c = 0; c < run->ncounts; c++)
			run->counts[c] = 1021 - (size_t)c;
		run->inplace = v & 1;
		run->cfg.schedule = v % 4;
		run->cfg.chunks = ks[(v / 4) % 4];
		run->seed = seed++;
		run_one(run);
		for (int r = 0; r < run->nranks; r++)
			for (int c = 0; c < run->ncounts; c++)
				cr_assert_eq(run->res[r].why[c],
					     all ? R2CC_AR2_FB_NO_HEALTHY : R2CC_AR2_RAN,
					     "n %d set %#x rank %d call %d", n, set, r, c);
	}
	/* C(n,1) + C(n,2) + C(n,3) */
	cr_assert_eq(sets, n + n * (n - 1) / 2 + n * (n - 1) * (n - 2) / 6);
	free(run);
}

Test(ar2_exec, every_failure_set_of_2)
{
	every_failure_set(2);
}
Test(ar2_exec, every_failure_set_of_3)
{
	every_failure_set(3);
}
Test(ar2_exec, every_failure_set_of_4)
{
	every_failure_set(4);
}
Test(ar2_exec, every_failure_set_of_5)
{
	every_failure_set(5);
}
Test(ar2_exec, every_failure_set_of_6)
{
	every_failure_set(6);
}
Test(ar2_exec, every_failure_set_of_7)
{
	every_failure_set(7);
}
Test(ar2_exec, every_failure_set_of_8, .timeout = 300)
{
	every_failure_set(8);
}

/* Two degraded nodes of 4 x 1: each has a helper of its own; one healthy node of
 * 3 x 1 helps both. The calls each rank issues, and the sub-communicators. */
Test(ar2_exec, several_degraded_nodes_issue_their_stages)
{
	static const struct shape four = {"4x1 0,2", 4, 1, false, 0, 4, 1, 2};
	static const struct shape three = {"3x1 0,1", 3, 1, false, 0, 4, 1, 1};
	struct run *run = malloc(sizeof(*run));

	for (int sched = 0; sched < 4; sched++) {
		init_run(run, &four);
		run->counts[0] = 4000;
		run->cfg.chunks = 3;
		run->cfg.schedule = sched;
		run_one(run);
		for (int r = 0; r < 4; r++) {
			bool degraded = r == 0 || r == 2; /* helpers: rank 1 for 0, 3 for 2 */
			int *nc = run->res[r].ncalls[0];

			cr_assert_eq(run->res[r].why[0], R2CC_AR2_RAN);
			cr_assert_eq(nc[DBL_SPLIT], 3, "rank %d", r); /* healthy, aPlusH_0, _1 */
			cr_assert_eq(run->res[r].parent_allreduces[0], 1);
			cr_assert_eq(nc[DBL_ALLREDUCE], degraded ? 1 : 4, "rank %d", r);
			cr_assert_eq(nc[DBL_REDUCE], 3, "rank %d", r);
			cr_assert_eq(nc[DBL_BCAST], 3, "rank %d", r);
			cr_assert_eq(run->res[r].parent_bcasts[0], 0);
			/* healthy 2 + aPlusH_0 2 + aPlusH_1 2 */
			cr_assert_eq(run->res[r].live_comms_before_destroy, 6);
		}
		init_run(run, &three);
		run->counts[0] = 4000;
		run->cfg.chunks = 2;
		run->cfg.schedule = sched;
		run_one(run);
		for (int r = 0; r < 3; r++) {
			int *nc = run->res[r].ncalls[0];

			cr_assert_eq(run->res[r].why[0], R2CC_AR2_RAN);
			cr_assert_eq(nc[DBL_ALLREDUCE], r == 2 ? 3 : 1, "rank %d", r);
			cr_assert_eq(nc[DBL_REDUCE], r == 2 ? 4 : 2, "rank %d", r);
			cr_assert_eq(nc[DBL_BCAST], r == 2 ? 4 : 2, "rank %d", r);
			/* healthy 1 + aPlusH_0 2 + aPlusH_1 2 */
			cr_assert_eq(run->res[r].live_comms_before_destroy, 5);
		}
	}
	for (int inplace = 0; inplace < 2; inplace++) { /* the most chunks, every type */
		init_run(run, &three);
		run->cfg.chunks = 64;
		run->inplace = inplace;
		run->types_per_call = true;
		run->ncounts = 4 * R2CC_NCCL_NUM_TYPES;
		for (int c = 0; c < run->ncounts; c++)
			run->counts[c] = 20000 + (size_t)c;
		run_one(run);
		cr_assert_eq(run->res[2].ncalls[28][DBL_REDUCE], 128); /* float32 */
	}
	free(run);
}

/* A second node degrades while the job runs: the new view's schedule runs from
 * the next call, on new sub-communicators, results right. */
Test(ar2_exec, a_second_node_degrades)
{
	static const struct shape sh = {"4x2 1", 4, 2, true, 1, 4, 1, -1};
	struct run *run = malloc(sizeof(*run));

	for (int sched = 0; sched < 4; sched++) {
		init_run(run, &sh);
		run->cfg.schedule = sched;
		run->counts[1] = 2000;
		run->counts[2] = 3001;
		run->ncounts = 3;
		run->new_degraded = 3;
		run->use_failv2 = true;
		run->failv2[1] = 1;
		run->failv2[3] = 2;
		run_one(run);
		for (int r = 0; r < 8; r++) {
			cr_assert_eq(run->res[r].why[2], R2CC_AR2_RAN);
			cr_assert_eq(run->res[r].ncalls[2][DBL_SPLIT], 3); /* healthy, 2 x aPlusH */
			/* nodes 1 and 3 (rank % 4), their helpers: ranks 2 and 0 */
			cr_assert_eq(run->res[r].ncalls[2][DBL_REDUCE] > 0, r % 2 || r < 4,
				     "rank %d", r);
		}
	}
	free(run);
}

/*
 * CUDA graph capture: before setup the call steps aside (setup is collective
 * and blocking); after an eligible call outside capture, a captured call runs
 * R2CC-AllReduce, and a later view change keeps the sub-communicators that the
 * captured graph's replays use, until the state is destroyed.
 */
Test(ar2_exec, capture)
{
	struct run *run = malloc(sizeof(*run));
	int before = r2cc_test_warnings;

	for (int cap = 0; cap < 2; cap++) {
		init_run(run, &shapes[2]); /* 3 x 2, node 1 degraded, helper rank 4 */
		run->use_call_flags = true;
		run->call_flags[0] = R2CC_AR2_CAPTURING;
		run->call_flags[1] = 0;
		run->call_flags[2] = cap ? R2CC_AR2_CAPTURING : 0;
		run->call_flags[3] = 0;
		run->counts[1] = 2000;
		run->counts[2] = 3001;
		run->counts[3] = 1500;
		run->ncounts = 4;
		run->new_degraded = 2; /* before the last call */
		run_one(run);
		for (int r = 0; r < 6; r++) {
			cr_assert_eq(run->res[r].why[0], R2CC_AR2_FB_CAPTURE);
			cr_assert_eq(run->res[r].why[1], R2CC_AR2_RAN);
			cr_assert_eq(run->res[r].why[2], R2CC_AR2_RAN);
			cr_assert_eq(run->res[r].why[3], R2CC_AR2_RAN);
			cr_assert_eq(run->res[r].captured, (unsigned long)cap);
			/* after the new view: the old ones kept (captured) or destroyed */
			int had = r == 4 ? 3 : 2; /* old view's: bcast + healthy or aPlusH */
			cr_assert_eq(run->res[r].live_comms_after_view, cap ? had : 0, "rank %d",
				     r);
		}
	}
	cr_assert_eq(r2cc_test_warnings - before, 1); /* capture before setup, once */

	/* the parent aborted: the kept sub-communicators are aborted with the current
	 * ones, all at once (NCCL's abort waits for every kernel of the process) */
	init_run(run, &shapes[2]);
	run->use_call_flags = true;
	run->call_flags[1] = R2CC_AR2_CAPTURING; /* call 0 sets up, call 1 is captured */
	run->counts[1] = 2000;
	run->counts[2] = 3001;
	run->ncounts = 3;
	run->new_degraded = 2;
	run->abort = true;
	run->abort_waits = true;
	run_one(run);
	/* old view: bcast + healthy (aPlusH too for helper rank 4, only aPlusH on node 1);
	 * new: node 2 (ranks 4, 5) degraded, helper rank 0 */
	static const int aborts[6] = {2 + 3, 2 + 2, 2 + 2, 2 + 2, 3 + 2, 2 + 2};
	for (int r = 0; r < 6; r++)
		cr_assert_eq(run->res[r].aborts, aborts[r], "rank %d: %d aborts", r,
			     run->res[r].aborts);
	free(run);
}

/* The double itself: conversions at known bit patterns. */
Test(ar2_double, conversions)
{
	static const struct {
		int dtype;
		double v;
		unsigned bits;
	} k[] = {
	    {R2CC_NCCL_FLOAT16, 1.0, 0x3c00},
	    {R2CC_NCCL_FLOAT16, -2.0, 0xc000},
	    {R2CC_NCCL_FLOAT16, 65504, 0x7bff},
	    {R2CC_NCCL_FLOAT16, 0x1p-24, 0x0001},
	    {R2CC_NCCL_FLOAT16, 1.0 + 0x1p-11, 0x3c00}, /* tie: to even */
	    {R2CC_NCCL_FLOAT16, 1.0 + 0x1p-10 + 0x1p-11, 0x3c02},
	    {R2CC_NCCL_BFLOAT16, 1.0, 0x3f80},
	    {R2CC_NCCL_BFLOAT16, -0.5, 0xbf00},
	    {R2CC_NCCL_BFLOAT16, 3.0, 0x4040},
	    {R2CC_NCCL_FLOAT8E4M3, 1.0, 0x38},
	    {R2CC_NCCL_FLOAT8E4M3, 448, 0x7e},
	    {R2CC_NCCL_FLOAT8E4M3, 0x1p-9, 0x01},
	    {R2CC_NCCL_FLOAT8E4M3, -3.0, 0xc4},
	    {R2CC_NCCL_FLOAT8E4M3, 0x1p-6, 0x08},
	    {R2CC_NCCL_FLOAT8E5M2, 1.0, 0x3c},
	    {R2CC_NCCL_FLOAT8E5M2, 57344, 0x7b},
	    {R2CC_NCCL_FLOAT8E5M2, 0x1p-16, 0x01},
	    {R2CC_NCCL_FLOAT8E5M2, -1.5, 0xbe},
	};
	unsigned char b[2];
	unsigned got;

	for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
		memset(b, 0, sizeof(b));
		dbl_encode(k[i].dtype, k[i].v, b);
		got = b[0] | (r2cc_nccl_type_size(k[i].dtype) == 2 ? (unsigned)b[1] << 8 : 0);
		cr_assert_eq(got, k[i].bits, "type %d value %g: 0x%x, want 0x%x", k[i].dtype,
			     k[i].v, got, k[i].bits);
		if (k[i].v != 1.0 + 0x1p-11 && k[i].v != 1.0 + 0x1p-10 + 0x1p-11)
			cr_assert_eq(dbl_decode(k[i].dtype, b), k[i].v);
	}
	/* e4m3 has no infinity: overflow saturates; e5m2 overflows to infinity */
	dbl_encode(R2CC_NCCL_FLOAT8E4M3, 1000, b);
	cr_assert_eq(b[0], 0x7e);
	dbl_encode(R2CC_NCCL_FLOAT8E5M2, 1e6, b);
	cr_assert(isinf(dbl_decode(R2CC_NCCL_FLOAT8E5M2, b)));
	b[0] = 0x7f;
	cr_assert(isnan(dbl_decode(R2CC_NCCL_FLOAT8E4M3, b)));
}

/* The double's order checker is itself checked: two writers of one buffer on
 * two streams need an event between them. */
Test(ar2_double, order_checker_catches_missing_dependency)
{
	struct dbl_world *w = dbl_world_new(1);
	struct dbl_rank *r = calloc(1, sizeof(*r));
	struct r2cc_ar2_ops ops;
	void *s1, *s2, *e0, *e1;
	float buf[4] = {1, 2, 3, 4};

	dbl_rank_init(r, w, 0);
	ops = dbl_ops(r);
	cr_assert_eq(ops.stream_create(r, &s1), 0);
	cr_assert_eq(ops.stream_create(r, &s2), 0);
	cr_assert_eq(ops.event_create(r, &e0), 0);
	cr_assert_eq(ops.event_create(r, &e1), 0);
	for (int good = 0; good < 2; good++) {
		dbl_begin(r);
		r->error[0] = '\0';
		ops.event_record(r, e0, &r->user);
		ops.stream_wait_event(r, s1, e0);
		ops.stream_wait_event(r, s2, e0);
		cr_assert_eq(ops.allreduce(r, buf, buf, 4, R2CC_NCCL_FLOAT32, 0, r->parent, s1), 0);
		if (good) {
			ops.event_record(r, e1, s1);
			ops.stream_wait_event(r, s2, e1);
		}
		cr_assert_eq(ops.broadcast(r, buf, buf, 4, R2CC_NCCL_FLOAT32, 0, r->parent, s2), 0);
		ops.event_record(r, e1, s2);
		ops.stream_wait_event(r, &r->user, e1);
		ops.event_record(r, e1, s1);
		ops.stream_wait_event(r, &r->user, e1);
		if (good) {
			cr_assert_eq(dbl_check_order(r), 0, "%s", r->error);
		} else {
			cr_assert_eq(dbl_check_order(r), -1);
			cr_assert(strstr(r->error, "touch the same memory"), "%s", r->error);
		}
	}
	/* and the user's stream must wait for everything */
	dbl_begin(r);
	r->error[0] = '\0';
	ops.event_record(r, e0, &r->user);
	ops.stream_wait_event(r, s1, e0);
	cr_assert_eq(ops.allreduce(r, buf, buf, 4, R2CC_NCCL_FLOAT32, 0, r->parent, s1), 0);
	cr_assert_eq(dbl_check_order(r), -1);
	cr_assert(strstr(r->error, "does not wait"), "%s", r->error);
	ops.event_destroy(r, e0);
	ops.event_destroy(r, e1);
	ops.stream_destroy(r, s1);
	ops.stream_destroy(r, s2);
	cr_assert_eq(dbl_live_streams(w) + dbl_live_events(w), 0);
	free(r);
	dbl_world_free(w);
}
