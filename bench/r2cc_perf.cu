/* r2cc-perf: a verifying collective benchmark that takes NVIDIA nccl-tests' flags and
 * prints its output format, so that scripts written for all_reduce_perf and friends run
 * unchanged (build/bin holds symlinks with those names). What it adds for R2CC:
 *  - every checked result is compared element by element with a reference computed on
 *    the GPU from the input formula (perf_pattern.h), never with another NCCL result;
 *  - no MPI: processes find each other through a TCP rendezvous (perf_rdv.c), so it runs
 *    under mpirun, srun or torchrun, or spawns the ranks itself as emulated nodes
 *    (--nodes, perf_launch.c);
 *  - a watchdog turns a hung collective into a message and a non-zero exit;
 *  - per-iteration NIC traffic tables and the hot-repair test of seed 000
 *    (--nic-table, --iters-table).
 * NCCL is linked normally (through the PLT) so that an LD_PRELOADed libr2cc.so interposes
 * every call exactly as it does for nccl-tests.
 *
 * Exit status: 0 success, 1 wrong results, 2 CUDA/NCCL/system error, 3 timeout, 4 usage.
 */
#ifdef PERF_EMU
#include "bench/perf_emu.h"
#else
#include <cuda_runtime.h>
#include <nccl.h>
#endif

#include <atomic>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <string>
#include <vector>

extern "C" {
#include "bench/perf_launch.h"
#include "bench/perf_nic.h"
#include "bench/perf_opts.h"
#include "bench/perf_pattern.h"
#include "bench/perf_rdv.h"
}

enum { EXIT_WRONG = 1, EXIT_ERROR = 2, EXIT_TIMEOUT = 3, EXIT_USAGE = 4 };

#define MAX_LOCAL_GPUS 16

struct dev {
	int rank, cuda_dev;
	ncclComm_t comm;
	cudaStream_t stream;
	char *send, *recv;
	size_t bytes;
	unsigned long long *d_wrong; /* [0] count, [1] first wrong index */
};

static struct perf_opts O;
static struct perf_world W;
static struct perf_rdv R;
static int nranks, ndev;
static struct dev D[MAX_LOCAL_GPUS];
static int nccl_version;
static char my_node[64];
static std::atomic<long long> deadline_ms(0);
static int phase_limit_s;
static char phase[200] = "start-up";

static long long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int my_rank(void)
{
	return W.proc * O.ngpus;
}

static void quit(int code)
{
	fflush(stdout);
	fflush(stderr);
	_exit(code);
}

static void die_call(const char *call, const char *why)
{
	fprintf(stderr, "rank %d: %s failed: %s\n", my_rank(), call, why);
	quit(EXIT_ERROR);
}

static void die_nccl(const char *call, ncclResult_t r)
{
	const char *last = ncclGetLastError(NULL);
	fprintf(stderr, "rank %d: %s failed: %s%s%s\n", my_rank(), call, ncclGetErrorString(r),
		last && *last ? ": " : "", last ? last : "");
	quit(EXIT_ERROR);
}

#define CUDA_CHECK(call)                                                                           \
	do {                                                                                       \
		cudaError_t e_ = (call);                                                           \
		if (e_ != cudaSuccess)                                                             \
			die_call(#call, cudaGetErrorString(e_));                                   \
	} while (0)

#define NCCL_CHECK(call)                                                                           \
	do {                                                                                       \
		ncclResult_t r_ = (call);                                                          \
		if (r_ != ncclSuccess)                                                             \
			die_nccl(#call, r_);                                                       \
	} while (0)

#define RDV_CHECK(call)                                                                            \
	do {                                                                                       \
		if ((call) != 0)                                                                   \
			quit(EXIT_ERROR);                                                          \
	} while (0)

/* Watchdog: the main thread arms a deadline before anything that may block; a call that
 * never returns (communicator set-up, a blocked enqueue, abort itself) ends the process
 * with a message. Collectives are also watched by wait_all, which aborts the
 * communicator first. */
static void arm(const char *what, int seconds)
{
	/* a copy: callers pass stack buffers (the watchdog may read a torn string) */
	snprintf(phase, sizeof(phase), "%s", what);
	phase_limit_s = seconds;
	/* grace over the limit (up to 10 s) lets wait_all abort the communicator first */
	deadline_ms =
	    seconds > 0 ? now_ms() + (seconds + (seconds < 10 ? seconds : 10)) * 1000LL : 0;
}

static void *watchdog(void *arg)
{
	(void)arg;
	for (;;) {
		long long d = deadline_ms.load();
		sleep(1);
		if (d > 0 && d == deadline_ms.load() && now_ms() > d) {
			fprintf(stderr,
				"rank %d: no progress within the time limit (%d s) during %s; "
				"exiting\n",
				my_rank(), phase_limit_s, phase);
			quit(EXIT_TIMEOUT);
		}
	}
	return NULL;
}

static ncclDataType_t nccl_type(int t)
{
	switch (t) {
	case PERF_INT8:
		return ncclInt8;
	case PERF_UINT8:
		return ncclUint8;
	case PERF_INT32:
		return ncclInt32;
	case PERF_UINT32:
		return ncclUint32;
	case PERF_INT64:
		return ncclInt64;
	case PERF_UINT64:
		return ncclUint64;
	case PERF_HALF:
		return ncclFloat16;
	case PERF_FLOAT:
		return ncclFloat32;
	case PERF_DOUBLE:
		return ncclFloat64;
	case PERF_BF16:
		return ncclBfloat16;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
	case PERF_F8E4M3:
		return ncclFloat8e4m3;
	case PERF_F8E5M2:
		return ncclFloat8e5m2;
#endif
	default:
		fprintf(stderr, "r2cc-perf: type %s needs NCCL headers >= 2.24\n",
			perf_type_name(t));
		quit(EXIT_USAGE);
	}
	return ncclFloat32;
}

static int type_supported(int t)
{
	if (t >= PERF_F8E4M3)
		return NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0) && nccl_version >= 22400;
	return 1;
}

static ncclRedOp_t nccl_op(int op)
{
	static const ncclRedOp_t ops[PERF_NOPS] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
	return ops[op];
}

/* ---- kernels ---- */

#ifndef PERF_EMU
#define GRID_MAX 8192

static unsigned grid_for(uint64_t n)
{
	uint64_t g = (n + 255) / 256;
	return (unsigned)(g > GRID_MAX ? GRID_MAX : (g ? g : 1));
}

__global__ void init_kernel(void *buf, uint64_t n, struct perf_pattern p, int rank)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		perf_store(buf, i, p.type, perf_value(&p, rank, i));
}

__global__ void check_kernel(const void *buf, uint64_t n, struct perf_pattern p, int coll,
			     struct perf_geom g, int rank, int root, double tol,
			     unsigned long long *wrong)
{
	unsigned long long mine = 0, first = ~0ull;
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		double want = perf_expect(&p, coll, &g, rank, root, i);
		if (!perf_match(perf_load(buf, i, p.type), want, tol)) {
			mine++;
			if (i < first)
				first = i;
		}
	}
	if (mine) {
		atomicAdd(&wrong[0], mine);
		atomicMin(&wrong[1], first);
	}
}

static void run_init(cudaStream_t s, void *buf, uint64_t n, struct perf_pattern p, int rank)
{
	init_kernel<<<grid_for(n), 256, 0, s>>>(buf, n, p, rank);
}

static void run_check(cudaStream_t s, const void *buf, uint64_t n, struct perf_pattern p, int coll,
		      struct perf_geom g, int rank, int root, double tol, unsigned long long *wrong)
{
	check_kernel<<<grid_for(n), 256, 0, s>>>(buf, n, p, coll, g, rank, root, tol, wrong);
}
#else
/* the host emulation (perf_emu.h) runs the same element functions in a loop */
static void run_init(cudaStream_t s, void *buf, uint64_t n, struct perf_pattern p, int rank)
{
	for (uint64_t i = 0; i < n; i++)
		perf_store(buf, i, p.type, perf_value(&p, rank, i));
}

static void run_check(cudaStream_t s, const void *buf, uint64_t n, struct perf_pattern p, int coll,
		      struct perf_geom g, int rank, int root, double tol, unsigned long long *wrong)
{
	for (uint64_t i = 0; i < n; i++) {
		double want = perf_expect(&p, coll, &g, rank, root, i);
		if (!perf_match(perf_load(buf, i, p.type), want, tol)) {
			wrong[0]++;
			if (i < wrong[1])
				wrong[1] = i;
		}
	}
}
#endif

/* ---- one collective call ---- */

struct call {
	int coll, type, op, root;
	struct perf_geom g;
	int in_place;
};

static char *send_ptr(const struct dev *d, const struct call *c)
{
	size_t es = (size_t)perf_type_size(c->type);
	if (!c->in_place)
		return d->send;
	return d->recv + c->g.send_inplace_off * (size_t)d->rank * es;
}

static char *recv_ptr(const struct dev *d, const struct call *c)
{
	size_t es = (size_t)perf_type_size(c->type);
	if (!c->in_place)
		return d->recv;
	return d->recv + c->g.recv_inplace_off * (size_t)d->rank * es;
}

static void launch_one(struct dev *d, const struct call *c)
{
	const char *sb = send_ptr(d, c);
	char *rb = recv_ptr(d, c);
	size_t count = c->g.paramcount, es = (size_t)perf_type_size(c->type);
	ncclDataType_t dt = nccl_type(c->type);

	switch (c->coll) {
	case PERF_ALLREDUCE:
		NCCL_CHECK(ncclAllReduce(sb, rb, count, dt, nccl_op(c->op), d->comm, d->stream));
		break;
	case PERF_ALLGATHER:
		NCCL_CHECK(ncclAllGather(sb, rb, count, dt, d->comm, d->stream));
		break;
	case PERF_REDUCESCATTER:
		NCCL_CHECK(
		    ncclReduceScatter(sb, rb, count, dt, nccl_op(c->op), d->comm, d->stream));
		break;
	case PERF_BROADCAST:
		NCCL_CHECK(ncclBroadcast(sb, rb, count, dt, c->root, d->comm, d->stream));
		break;
	case PERF_REDUCE:
		NCCL_CHECK(
		    ncclReduce(sb, rb, count, dt, nccl_op(c->op), c->root, d->comm, d->stream));
		break;
	case PERF_ALLTOALL:
		NCCL_CHECK(ncclGroupStart());
		for (int peer = 0; peer < nranks; peer++) {
			NCCL_CHECK(ncclSend(sb + (size_t)peer * count * es, count, dt, peer,
					    d->comm, d->stream));
			NCCL_CHECK(ncclRecv(rb + (size_t)peer * count * es, count, dt, peer,
					    d->comm, d->stream));
		}
		NCCL_CHECK(ncclGroupEnd());
		break;
	case PERF_SENDRECV:
		NCCL_CHECK(ncclGroupStart());
		NCCL_CHECK(ncclSend(sb, count, dt, (d->rank + 1) % nranks, d->comm, d->stream));
		NCCL_CHECK(
		    ncclRecv(rb, count, dt, (d->rank - 1 + nranks) % nranks, d->comm, d->stream));
		NCCL_CHECK(ncclGroupEnd());
		break;
	}
}

/* One call on every local GPU (grouped when there are several). */
static void launch(const struct call *c)
{
	if (ndev > 1)
		NCCL_CHECK(ncclGroupStart());
	for (int i = 0; i < ndev; i++)
		launch_one(&D[i], c);
	if (ndev > 1)
		NCCL_CHECK(ncclGroupEnd());
}

static void abort_all(void)
{
	arm("ncclCommAbort", 60);
	for (int i = 0; i < ndev; i++)
		ncclCommAbort(D[i].comm);
}

/* Waits for every local stream like nccl-tests' testStreamSynchronize: polls the stream
 * and NCCL's asynchronous error, aborts the communicators on error or at the deadline. */
static void wait_all(const char *what)
{
	int done[MAX_LOCAL_GPUS] = {0}, left = ndev;
	double t0 = now_s();

	arm(what, O.timeout_s);

	while (left) {
		for (int i = 0; i < ndev; i++) {
			cudaError_t e;
			ncclResult_t ae;
			if (done[i])
				continue;
			e = cudaStreamQuery(D[i].stream);
			if (e == cudaSuccess) {
				done[i] = 1, left--;
				continue;
			}
			if (e != cudaErrorNotReady)
				die_call(what, cudaGetErrorString(e));
			NCCL_CHECK(ncclCommGetAsyncError(D[i].comm, &ae));
			if (ae != ncclSuccess && ae != ncclInProgress) {
				const char *last = ncclGetLastError(D[i].comm);
				fprintf(stderr,
					"rank %d: NCCL asynchronous error during %s: %s%s%s\n",
					D[i].rank, what, ncclGetErrorString(ae),
					last && *last ? ": " : "", last ? last : "");
				abort_all();
				quit(EXIT_ERROR);
			}
		}
		if (!left)
			break;
		if (O.timeout_s > 0 && now_s() - t0 > O.timeout_s) {
			fprintf(stderr,
				"rank %d: %s did not complete within %d s (-T); aborting "
				"the communicator\n",
				my_rank(), what, O.timeout_s);
			abort_all();
			quit(EXIT_TIMEOUT);
		}
		/* spin for the first millisecond (latency), then yield the core */
		if (now_s() - t0 > 1e-3)
			usleep(20);
	}
}

/* ---- data check ---- */

static uint32_t check_seed = 1;

/* Messages about wrong elements wait for the end of the table row (flush_msgs), so that
 * they do not break the row when stdout and stderr share a terminal. */
static std::vector<std::string> pending_msgs;

static void flush_msgs(void)
{
	RDV_CHECK(perf_rdv_barrier(&R));
	for (const std::string &m : pending_msgs)
		fputs(m.c_str(), stderr);
	fflush(stderr);
	pending_msgs.clear();
	RDV_CHECK(perf_rdv_barrier(&R));
}

static void poison_and_init(const struct call *c, struct perf_pattern *p)
{
	size_t es = (size_t)perf_type_size(c->type);
	*p = perf_pattern_make(c->type, c->op, nranks, check_seed++);
	for (int i = 0; i < ndev; i++) {
		struct dev *d = &D[i];
		CUDA_CHECK(cudaSetDevice(d->cuda_dev));
		CUDA_CHECK(cudaMemsetAsync(d->recv, 0xff, c->g.recvcount * es, d->stream));
		if (c->g.sendcount)
			run_init(d->stream, send_ptr(d, c), c->g.sendcount, *p, d->rank);
		CUDA_CHECK(cudaGetLastError());
	}
}

static int checks_output(const struct dev *d, const struct call *c)
{
	if (c->coll == PERF_REDUCE && d->rank != c->root)
		return 0;
	return !c->in_place || perf_coll_checks_inplace(c->coll);
}

/* Counts wrong output elements on the local GPUs (after the call completed); the first
 * one is described on stderr. */
static uint64_t verify(const struct call *c, const struct perf_pattern *p, const char *what)
{
	uint64_t total = 0;
	double tol = perf_pattern_tolerance(p);
	size_t es = (size_t)perf_type_size(c->type);
	unsigned long long init[2] = {0, ~0ull};

	for (int i = 0; i < ndev; i++) {
		struct dev *d = &D[i];
		if (!checks_output(d, c))
			continue;
		CUDA_CHECK(cudaSetDevice(d->cuda_dev));
		if (O.selftest_wrong && c->g.recvcount &&
		    d->rank == (c->coll == PERF_REDUCE ? c->root : nranks - 1)) {
			/* the checker's self-test: one element off by one (NaN for floats) */
			uint64_t at = c->g.recvcount / 2;
			double want = perf_expect(p, c->coll, &c->g, d->rank, c->root, at);
			unsigned char bad[8];
			if (perf_type_is_float(c->type))
				memset(bad, 0xff, sizeof(bad));
			else
				perf_store(bad, 0, c->type, (int64_t)want + 1);
			CUDA_CHECK(cudaMemcpyAsync(recv_ptr(d, c) + at * es, bad, es,
						   cudaMemcpyHostToDevice, d->stream));
		}
		/* on the stream: a pageable cudaMemcpy may return before its DMA lands, and the
		 * legacy stream does not order work on a non-blocking stream */
		CUDA_CHECK(cudaMemcpyAsync(d->d_wrong, init, sizeof(init), cudaMemcpyHostToDevice,
					   d->stream));
		if (c->g.recvcount)
			run_check(d->stream, recv_ptr(d, c), c->g.recvcount, *p, c->coll, c->g,
				  d->rank, c->root, tol, d->d_wrong);
		CUDA_CHECK(cudaGetLastError());
		CUDA_CHECK(cudaStreamSynchronize(d->stream));
		unsigned long long res[2];
		CUDA_CHECK(cudaMemcpy(res, d->d_wrong, sizeof(res), cudaMemcpyDeviceToHost));
		if (res[0]) {
			unsigned char got[8];
			char msg[400];
			double want = perf_expect(p, c->coll, &c->g, d->rank, c->root, res[1]);
			CUDA_CHECK(cudaMemcpy(got, recv_ptr(d, c) + res[1] * es, es,
					      cudaMemcpyDeviceToHost));
			snprintf(msg, sizeof(msg),
				 "rank %d: %s: %llu of %llu elements wrong; first at element %llu: "
				 "got %.9g, expected %.9g\n",
				 d->rank, what, res[0], (unsigned long long)c->g.recvcount, res[1],
				 perf_load(got, 0, c->type), want);
			pending_msgs.push_back(msg);
		}
		total += res[0];
	}
	return total;
}

/* ---- NIC tables ---- */

struct nic_iter {
	double ms;
	struct perf_nic_sample before, after;
};

static int nic_src = PERF_NIC_NONE;
static int nic_contribute;
static char nic_node[64];

/* Process 0 gets the chosen node's counters, summed over the processes that report. */
static void nic_sample(struct perf_nic_sample *out)
{
	struct perf_nic_sample mine;
	std::vector<struct perf_nic_sample> all(W.proc == 0 ? W.nprocs : 1);
	perf_nic_read(nic_src, nic_node, nic_contribute, &mine);
	RDV_CHECK(perf_rdv_gather(&R, &mine, all.data(), sizeof(mine)));
	memset(out, 0, sizeof(*out));
	if (W.proc == 0)
		for (int p = 0; p < W.nprocs; p++)
			perf_nic_merge(out, &all[p]);
}

static uint64_t nic_value(const struct perf_nic_sample *s, const char *name, int tx)
{
	for (int i = 0; i < s->n; i++)
		if (!strcmp(s->name[i], name))
			return tx ? s->tx[i] : s->rx[i];
	return 0;
}

static void nic_print(const std::vector<struct nic_iter> &its, const char *title)
{
	struct perf_nic_sample names;
	if (W.proc != 0 || its.empty())
		return;
	memset(&names, 0, sizeof(names));
	for (const struct nic_iter &it : its)
		perf_nic_merge(&names, &it.after);
	printf("[Rank 0] NIC bytes per iteration (MB = 1e6 B) of node %s, %s; source: %s\n",
	       nic_node, title, perf_nic_source_name(nic_src));
	if (nic_src == PERF_NIC_NONE || names.n == 0) {
		printf("[Rank 0] (no NIC counters: no software RDMA device, no libr2cc.so "
		       "counters and no /sys/class/infiniband)\n");
		return;
	}
	printf("Iter Time(ms)");
	for (int tx = 0; tx < 2; tx++)
		for (int i = 0; i < names.n; i++)
			printf(" %s_%s", names.name[i], tx ? "TX" : "RX");
	printf("\n");
	for (size_t k = 0; k < its.size(); k++) {
		printf("%4zu %8.0f", k + 1, its[k].ms);
		for (int tx = 0; tx < 2; tx++)
			for (int i = 0; i < names.n; i++) {
				int w = (int)strlen(names.name[i]) + 3;
				uint64_t b = nic_value(&its[k].before, names.name[i], tx);
				uint64_t a = nic_value(&its[k].after, names.name[i], tx);
				printf(" %*.0f", w, a >= b ? (double)(a - b) / 1e6 : 0.0);
			}
		printf("\n");
	}
	fflush(stdout);
}

/* Decides which node the NIC table shows and who reports its counters. */
static void nic_setup(const char *nodes /* process 0: nprocs x 64 */)
{
	int32_t first = 0;
	char chosen[64];
	memset(chosen, 0, sizeof(chosen));
	if (W.proc == 0) {
		int src = perf_nic_source();
		const char *want = O.nic_node;
		char *end;
		long idx = *want ? strtol(want, &end, 10) : 0;
		nic_src = src;
		if (!*want) {
			snprintf(chosen, sizeof(chosen), "%s", nodes);
		} else if (*end == 0) {
			/* a node index in rank order, as R2CC_FAILED_NODE counts them */
			int k = -1;
			for (int p = 0; p < W.nprocs && k < idx; p++) {
				int seen = 0;
				for (int q = 0; q < p; q++)
					seen |= !strcmp(nodes + 64 * q, nodes + 64 * p);
				if (!seen && ++k == idx)
					snprintf(chosen, sizeof(chosen), "%s", nodes + 64 * p);
			}
		} else {
			snprintf(chosen, sizeof(chosen), "%s", want);
		}
		first = -1;
		for (int p = 0; p < W.nprocs && first < 0; p++)
			if (!strcmp(nodes + 64 * p, chosen))
				first = p;
		if (first < 0) {
			fprintf(stderr, "r2cc-perf: --nic-table: no node '%s' in this job\n", want);
			first = 0;
			snprintf(chosen, sizeof(chosen), "%s", nodes);
		}
	}
	int32_t msg[2] = {first, nic_src};
	RDV_CHECK(perf_rdv_bcast(&R, msg, sizeof(msg)));
	RDV_CHECK(perf_rdv_bcast(&R, chosen, sizeof(chosen)));
	first = msg[0], nic_src = msg[1];
	memcpy(nic_node, chosen, sizeof(nic_node));
	nic_contribute =
	    !strcmp(my_node, nic_node) && (nic_src == PERF_NIC_R2CC || W.proc == first);
}

/* ---- benchmark ---- */

struct run_state {
	double bw_sum;
	int bw_count;
	uint64_t wrong_total;
	std::vector<std::string> failures;
};

static struct run_state S;

static double agree_time(double sec)
{
	double v = sec;
	switch (O.average) {
	case 0:
		RDV_CHECK(perf_rdv_bcast(&R, &v, sizeof(v)));
		break;
	case 1:
		RDV_CHECK(perf_rdv_allreduce(&R, &v, 1, PERF_RDV_SUM));
		v /= W.nprocs;
		break;
	case 2:
		RDV_CHECK(perf_rdv_allreduce(&R, &v, 1, PERF_RDV_MIN));
		break;
	default:
		RDV_CHECK(perf_rdv_allreduce(&R, &v, 1, PERF_RDV_MAX));
		break;
	}
	return v;
}

static void describe_call(char *buf, size_t len, const struct call *c, uint64_t bytes)
{
	snprintf(buf, len, "%s %s %s root %d size %llu B %s", perf_coll_name(c->coll),
		 perf_type_name(c->type), perf_coll_has_op(c->coll) ? perf_op_name(c->op) : "none",
		 perf_coll_has_root(c->coll) ? c->root : -1, (unsigned long long)bytes,
		 c->in_place ? "in-place" : "out-of-place");
}

/* Runs -c checked calls; returns the wrong elements over all ranks. */
static double check_call(const struct call *c, uint64_t bytes)
{
	char what[160];
	double wrong = 0;
	describe_call(what, sizeof(what), c, bytes);
	for (int k = 0; k < O.check; k++) {
		struct perf_pattern p;
		poison_and_init(c, &p);
		launch(c);
		wait_all(what);
		wrong += (double)verify(c, &p, what);
	}
	RDV_CHECK(perf_rdv_allreduce(&R, &wrong, 1, PERF_RDV_SUM));
	if (wrong > 0) {
		S.wrong_total += (uint64_t)wrong;
		S.failures.push_back(std::string(what) + ": " + std::to_string((uint64_t)wrong) +
				     " wrong elements");
	}
	return wrong;
}

static void bench_one(const struct call *c, uint64_t bytes)
{
	char what[160], tbuf[16];
	double t0, sec, algbw, busbw, wrong = 0;
	describe_call(what, sizeof(what), c, bytes);

	/* the untimed call nccl-tests makes before timing each variant */
	launch(c);
	wait_all(what);
	RDV_CHECK(perf_rdv_barrier(&R));

	t0 = now_s();
	for (int it = 0; it < O.iters; it++) {
		if (O.agg_iters > 1)
			NCCL_CHECK(ncclGroupStart());
		for (int a = 0; a < O.agg_iters; a++)
			launch(c);
		if (O.agg_iters > 1)
			NCCL_CHECK(ncclGroupEnd());
		if (O.blocking) {
			wait_all(what);
			RDV_CHECK(perf_rdv_barrier(&R));
		}
	}
	wait_all(what);
	sec = agree_time((now_s() - t0) / (O.iters * O.agg_iters));
	perf_bandwidth(c->coll, &c->g, c->type, nranks, sec, &algbw, &busbw);

	bool reported = !c->in_place || perf_coll_checks_inplace(c->coll);
	if (O.check && reported)
		wrong = check_call(c, bytes);
	perf_format_time(tbuf, sizeof(tbuf), sec * 1e6);
	if (W.proc == 0) {
		if (O.check && reported)
			printf("  %7s  %6.2f  %6.2f  %5g", tbuf, algbw, busbw, wrong);
		else
			printf("  %7s  %6.2f  %6.2f  %5s", tbuf, algbw, busbw, "N/A");
		fflush(stdout);
	}
	S.bw_sum += busbw;
	S.bw_count++;
}

/* The per-iteration NIC table of one size: -n more calls, each synchronised and sampled
 * (kept apart from the timed loop so that the row's numbers are nccl-tests'). */
static void nic_table_run(const struct call *c, uint64_t bytes)
{
	std::vector<struct nic_iter> its((size_t)O.iters);
	char what[160], title[200];
	describe_call(what, sizeof(what), c, bytes);
	for (int it = 0; it < O.iters; it++) {
		double t0;
		RDV_CHECK(perf_rdv_barrier(&R));
		nic_sample(&its[(size_t)it].before);
		t0 = now_s();
		launch(c);
		wait_all(what);
		its[(size_t)it].ms = (now_s() - t0) * 1e3;
		RDV_CHECK(perf_rdv_barrier(&R));
		nic_sample(&its[(size_t)it].after);
	}
	snprintf(title, sizeof(title), "%s", what);
	nic_print(its, title);
}

/* Fault hook for testing the watchdog: R2CC_PERF_TEST_HANG=<rank> makes that rank stop
 * taking part before its first collective, so that the others hang in it. */
static void test_hang(void)
{
	const char *h = getenv("R2CC_PERF_TEST_HANG");
	if (!h || !*h || atoi(h) < my_rank() || atoi(h) >= my_rank() + ndev)
		return;
	fprintf(stderr, "rank %d: R2CC_PERF_TEST_HANG: not taking part from here on\n", atoi(h));
	for (;;)
		pause();
}

static uint64_t next_size(uint64_t size)
{
	uint64_t n = O.stepfactor ? size * O.stepfactor : size + O.stepbytes;
	return n > size ? n : UINT64_MAX;
}

static void time_test(int type, int op, int root)
{
	struct call c;
	memset(&c, 0, sizeof(c));
	c.coll = O.coll, c.type = type, c.op = op, c.root = root;

	arm("warm-up", O.timeout_s);
	RDV_CHECK(perf_rdv_barrier(&R));
	test_hang();
	for (int pass = 0; pass < 2; pass++) {
		perf_geom_make(&c.g, c.coll, pass ? O.minbytes : O.maxbytes, type, nranks);
		for (int it = 0; it < O.warmup_iters; it++)
			launch(&c);
		wait_all("warm-up");
	}
	long cycles = O.run_cycles;
	do {
		for (uint64_t size = O.minbytes; size <= O.maxbytes; size = next_size(size)) {
			size_t es = (size_t)perf_type_size(type);
			char rootname[16];
			perf_geom_make(&c.g, c.coll, size, type, nranks);
			uint64_t shown =
			    (c.g.sendcount > c.g.recvcount ? c.g.sendcount : c.g.recvcount) * es;
			snprintf(rootname, sizeof(rootname), "%6d",
				 perf_coll_has_root(c.coll) ? root : -1);
			arm("benchmark", O.timeout_s);
			if (W.proc == 0) {
				printf("%12llu  %12llu  %8s  %6s  %6s", (unsigned long long)shown,
				       (unsigned long long)c.g.paramcount, perf_type_name(type),
				       perf_coll_has_op(c.coll) ? perf_op_name(op) : "none",
				       rootname);
				fflush(stdout);
			}
			for (int ip = 0; ip < 2; ip++) {
				c.in_place = ip;
				bench_one(&c, shown);
			}
			if (W.proc == 0) {
				printf("\n");
				fflush(stdout);
			}
			if (O.check)
				flush_msgs();
			bool last = next_size(size) > O.maxbytes;
			if (O.nic_table && (O.nic_table_all || last)) {
				c.in_place = 0;
				nic_table_run(&c, shown);
			}
		}
	} while (O.run_cycles == 0 || --cycles > 0);
}

/* seed 000's hot-repair test: every iteration timed, verified and reported. */
static int iters_table(int type, int op, int root)
{
	struct call c;
	std::vector<struct nic_iter> its((size_t)O.iters);
	char what[160], sizestr[32];
	int failed = 0;

	memset(&c, 0, sizeof(c));
	c.coll = O.coll, c.type = type, c.op = op, c.root = root;
	perf_geom_make(&c.g, c.coll, O.maxbytes, type, nranks);
	uint64_t bytes = (c.g.sendcount > c.g.recvcount ? c.g.sendcount : c.g.recvcount) *
			 (uint64_t)perf_type_size(type);
	describe_call(what, sizeof(what), &c, bytes);
	if (bytes >= (1ull << 30))
		snprintf(sizestr, sizeof(sizestr), "%.2f GiB", (double)bytes / (1ull << 30));
	else
		snprintf(sizestr, sizeof(sizestr), "%.2f MiB", (double)bytes / (1ull << 20));

	arm("warm-up", O.timeout_s);
	for (int it = 0; it < O.warmup_iters; it++)
		launch(&c);
	wait_all("warm-up");
	for (int it = 0; it < O.iters; it++) {
		struct perf_pattern p;
		double t0, wrong;
		arm("iteration", O.timeout_s);
		poison_and_init(&c, &p);
		for (int i = 0; i < ndev; i++)
			CUDA_CHECK(cudaStreamSynchronize(D[i].stream));
		RDV_CHECK(perf_rdv_barrier(&R));
		if (W.proc == 0) {
			printf("[Rank 0] Iter %d/%d START: %s %s\n", it + 1, O.iters,
			       perf_coll_name(c.coll), sizestr);
			fflush(stdout);
		}
		nic_sample(&its[(size_t)it].before);
		t0 = now_s();
		launch(&c);
		wait_all(what);
		its[(size_t)it].ms = (now_s() - t0) * 1e3;
		wrong = (double)verify(&c, &p, what);
		flush_msgs();
		RDV_CHECK(perf_rdv_allreduce(&R, &wrong, 1, PERF_RDV_SUM));
		RDV_CHECK(perf_rdv_barrier(&R));
		nic_sample(&its[(size_t)it].after);
		if (W.proc == 0) {
			if (wrong == 0)
				printf("[Rank 0] Iter %d/%d END: OK (elapsed %.0f ms)\n", it + 1,
				       O.iters, its[(size_t)it].ms);
			else
				printf("[Rank 0] Iter %d/%d END: WRONG RESULT, %.0f wrong elements "
				       "(elapsed %.0f ms)\n",
				       it + 1, O.iters, wrong, its[(size_t)it].ms);
			fflush(stdout);
		}
		if (wrong > 0) {
			failed++;
			S.wrong_total += (uint64_t)wrong;
			S.failures.push_back(std::string(what) + " iteration " +
					     std::to_string(it + 1) + ": " +
					     std::to_string((uint64_t)wrong) + " wrong elements");
		}
	}
	nic_print(its, what);
	if (W.proc == 0) {
		if (!failed)
			printf("[Rank 0] TEST PASS: All %ss completed and verified.\n",
			       perf_coll_name(c.coll));
		else
			printf("[Rank 0] TEST FAIL: %d of %d iterations had wrong results.\n",
			       failed, O.iters);
	}
	return failed;
}

/* ---- set-up ---- */

struct proc_info {
	char lines[MAX_LOCAL_GPUS * 160];
	char node[64];
	uint64_t args_hash, id_hash;
	int32_t ngpus;
};

static uint64_t fnv(const void *p, size_t len, uint64_t h)
{
	const unsigned char *b = (const unsigned char *)p;
	for (size_t i = 0; i < len; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

static const char *nccl_path(void)
{
	static char path[512];
	Dl_info info;
	void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
	void *sym = h ? dlsym(h, "ncclGetVersion") : NULL;
	if (sym && dladdr(sym, &info) && info.dli_fname) {
		char *real = realpath(info.dli_fname, NULL);
		snprintf(path, sizeof(path), "%s", real ? real : info.dli_fname);
		free(real);
		return path;
	}
	return "libnccl.so.2";
}

static void setup(int argc, char **argv)
{
	char host[256], rdv_host[256];
	int rdv_port, nvis;
	ncclUniqueId id;
	struct proc_info me;
	std::vector<struct proc_info> all;
	pthread_t wd;

	memset(&me, 0, sizeof(me));
	if (ndev > MAX_LOCAL_GPUS) {
		fprintf(stderr, "r2cc-perf: -g %d: at most %d GPUs per process\n", ndev,
			MAX_LOCAL_GPUS);
		quit(EXIT_USAGE);
	}
	pthread_create(&wd, NULL, watchdog, NULL);
	pthread_detach(wd);
	NCCL_CHECK(ncclGetVersion(&nccl_version));

	gethostname(host, sizeof(host));
	host[sizeof(host) - 1] = 0;
	const char *hostid = getenv("NCCL_HOSTID");
	snprintf(my_node, sizeof(my_node), "%.63s", hostid && *hostid ? hostid : host);
	snprintf(me.node, sizeof(me.node), "%s", my_node);

	CUDA_CHECK(cudaGetDeviceCount(&nvis));
	/* first GPU: R2CC_PERF_DEVICE (set by the spawner: the rank, so that emulated nodes
	 * spread over the GPUs) or NCCL_TESTS_DEVICE, else the local rank's; modulo the
	 * visible GPUs, so several ranks may share one
	 * (docs/architecture.md, Multi-node on one machine) */
	const char *devenv = getenv("R2CC_PERF_DEVICE");
	if (!devenv || !*devenv)
		devenv = getenv("NCCL_TESTS_DEVICE");
	int dev0 = devenv && *devenv ? atoi(devenv) : W.local_proc * ndev;
	size_t len = 0;
	for (int i = 0; i < ndev; i++) {
		struct dev *d = &D[i];
		cudaDeviceProp prop;
		d->rank = W.proc * ndev + i;
		d->cuda_dev = (dev0 + i) % nvis;
		CUDA_CHECK(cudaGetDeviceProperties(&prop, d->cuda_dev));
		len += (size_t)snprintf(
		    me.lines + len, sizeof(me.lines) - len,
		    "#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] %s%s%s\n", d->rank,
		    0, (int)getpid(), host, d->cuda_dev, prop.pciBusID, prop.name,
		    hostid ? "  NCCL_HOSTID=" : "", hostid ? hostid : "");
		if (len >= sizeof(me.lines))
			len = sizeof(me.lines) - 1;
	}
	me.ngpus = ndev;
	for (int i = 1; i < argc; i++)
		me.args_hash = fnv(argv[i], strlen(argv[i]) + 1, me.args_hash);

	if (perf_rdv_address(rdv_host, sizeof(rdv_host), &rdv_port))
		quit(EXIT_USAGE);
	const char *rt = getenv("R2CC_PERF_RDV_TIMEOUT");
	int rdv_timeout = rt && atoi(rt) > 0 ? atoi(rt) : 120;
	arm("rendezvous", rdv_timeout + 60);
	RDV_CHECK(perf_rdv_open(&R, W.proc, W.nprocs, rdv_host, rdv_port, rdv_timeout));

	arm("ncclGetUniqueId", 60);
	if (W.proc == 0)
		NCCL_CHECK(ncclGetUniqueId(&id));
	RDV_CHECK(perf_rdv_bcast(&R, &id, sizeof(id)));
	me.id_hash = fnv(&id, sizeof(id), 0xcbf29ce484222325ull);
	all.resize(W.proc == 0 ? W.nprocs : 1);
	RDV_CHECK(perf_rdv_gather(&R, &me, all.data(), sizeof(me)));
	int32_t ok = 1;
	if (W.proc == 0) {
		for (int p = 1; p < W.nprocs; p++) {
			if (all[p].id_hash != me.id_hash) {
				fprintf(stderr,
					"r2cc-perf: process %d received a different "
					"ncclUniqueId\n",
					p);
				ok = 0;
			}
			if (all[p].args_hash != me.args_hash || all[p].ngpus != me.ngpus) {
				fprintf(stderr,
					"r2cc-perf: process %d was started with other "
					"arguments than process 0\n",
					p);
				ok = 0;
			}
		}
	}
	RDV_CHECK(perf_rdv_bcast(&R, &ok, sizeof(ok)));
	if (!ok)
		quit(EXIT_USAGE);

	if (W.proc == 0) {
		printf("# r2cc-perf %s: NCCL library %d.%d.%d (%s), headers %d; %d ranks, "
		       "ranks from %s\n",
		       perf_coll_verb(O.coll), nccl_version / 10000, nccl_version / 100 % 100,
		       nccl_version % 100, nccl_path(), NCCL_VERSION_CODE, nranks, W.source);
		printf("# nThread %d nGpus %d minBytes %llu maxBytes %llu step: %llu(%s) warmup "
		       "iters: %d iters: %d agg iters: %d validation: %d graph: %d\n",
		       O.nthreads, O.ngpus, (unsigned long long)O.minbytes,
		       (unsigned long long)O.maxbytes,
		       (unsigned long long)(O.stepfactor ? O.stepfactor : O.stepbytes),
		       O.stepfactor ? "factor" : "bytes", O.warmup_iters, O.iters, O.agg_iters,
		       O.check, 0);
		if (O.blocking)
			printf("# Blocking Enabled: wait for completion and barrier after each "
			       "collective \n");
		if (O.selftest_wrong)
			printf("# Checker self-test: one element of each checked result is "
			       "corrupted on purpose; expect #wrong 1 and exit status 1\n");
		printf("#\n# Using devices\n");
		for (int p = 0; p < W.nprocs; p++)
			printf("%s", all[p].lines);
		fflush(stdout);
	}

	arm("ncclCommInitRank", O.timeout_s > 0 ? O.timeout_s : 600);
	if (ndev > 1)
		NCCL_CHECK(ncclGroupStart());
	for (int i = 0; i < ndev; i++) {
		CUDA_CHECK(cudaSetDevice(D[i].cuda_dev));
		NCCL_CHECK(ncclCommInitRank(&D[i].comm, nranks, id, D[i].rank));
	}
	if (ndev > 1)
		NCCL_CHECK(ncclGroupEnd());

	arm("buffer allocation", 120);
	for (int i = 0; i < ndev; i++) {
		struct dev *d = &D[i];
		CUDA_CHECK(cudaSetDevice(d->cuda_dev));
		CUDA_CHECK(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
		d->bytes = (size_t)O.maxbytes + 64;
		CUDA_CHECK(cudaMalloc(&d->send, d->bytes));
		CUDA_CHECK(cudaMalloc(&d->recv, d->bytes));
		CUDA_CHECK(cudaMalloc(&d->d_wrong, 2 * sizeof(unsigned long long)));
		CUDA_CHECK(cudaMemset(d->send, 0, d->bytes));
		CUDA_CHECK(cudaMemset(d->recv, 0, d->bytes));
		CUDA_CHECK(cudaDeviceSynchronize());
	}

	if (O.nic_table || O.iters_table) {
		std::vector<char> nodes(W.proc == 0 ? (size_t)W.nprocs * 64 : 64);
		if (W.proc == 0)
			for (int p = 0; p < W.nprocs; p++)
				memcpy(&nodes[(size_t)p * 64], all[p].node, 64);
		nic_setup(nodes.data());
	}
}

static void print_header(void)
{
	if (W.proc != 0 || O.iters_table)
		return;
	printf("#\n");
	printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       "
	       "in-place          \n",
	       "", "", "", "", "");
	printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size",
	       "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
	       "algbw", "busbw", "#wrong");
	printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)",
	       "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
	       "");
	fflush(stdout);
}

int main(int argc, char **argv)
{
	int rc;
	std::vector<int> types, ops, roots;

	setlinebuf(stdout);
	rc = perf_opts_parse(&O, argc, argv);
	if (rc)
		return rc > 0 ? 0 : EXIT_USAGE;
	if (O.nodes && !getenv("R2CC_PERF_RANK")) {
		if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE")) {
			fprintf(stderr, "r2cc-perf: --nodes starts the ranks itself; do not use it "
					"under mpirun\n");
			return EXIT_USAGE;
		}
		return perf_spawn(&O, argc, argv);
	}
	if (perf_world_from_env(&W))
		return EXIT_USAGE;
	ndev = O.ngpus;
	nranks = W.nprocs * ndev;
	if (O.nodes && nranks != O.nodes * O.gpus_per_node) {
		fprintf(stderr, "r2cc-perf: R2CC_PERF_RANK is set from outside; unset it\n");
		return EXIT_USAGE;
	}
	setup(argc, argv);

	for (int t = 0; t < PERF_NTYPES; t++)
		if ((O.type == PERF_ALL && type_supported(t)) || O.type == t)
			types.push_back(t);
	if (O.type >= 0 && !type_supported(O.type)) {
		if (W.proc == 0)
			fprintf(stderr, "r2cc-perf: %s needs NCCL >= 2.24 (library is %d)\n",
				perf_type_name(O.type), nccl_version);
		quit(EXIT_USAGE);
	}
	if (perf_coll_has_op(O.coll))
		for (int op = 0; op < PERF_NOPS; op++) {
			if (O.op == PERF_ALL || O.op == op)
				ops.push_back(op);
		}
	else
		ops.push_back(PERF_SUM);
	if (perf_coll_has_root(O.coll) && O.root == PERF_ALL)
		for (int r = 0; r < nranks; r++)
			roots.push_back(r);
	else if (perf_coll_has_root(O.coll) && O.root >= nranks) {
		if (W.proc == 0)
			fprintf(stderr, "r2cc-perf: -r %d: there are only %d ranks\n", O.root,
				nranks);
		quit(EXIT_USAGE);
	} else
		roots.push_back(perf_coll_has_root(O.coll) ? O.root : 0);

	print_header();
	if (O.iters_table) {
		iters_table(types[0], ops[0], roots[0]);
	} else {
		for (int t : types)
			for (int op : ops)
				for (int r : roots)
					time_test(t, op, r);
	}

	if (W.proc == 0 && !O.iters_table) {
		printf("# Out of bounds values : %llu %s\n", (unsigned long long)S.wrong_total,
		       S.wrong_total ? "FAILED" : "OK");
		printf("# Avg bus bandwidth    : %g \n", S.bw_count ? S.bw_sum / S.bw_count : 0.0);
		printf("#\n");
	}
	if (S.wrong_total && W.proc == 0) {
		printf("# r2cc-perf: FAILED: wrong results in:\n");
		for (const std::string &f : S.failures)
			printf("#   %s\n", f.c_str());
	}
	fflush(stdout);

	arm("ncclCommDestroy", 120);
	RDV_CHECK(perf_rdv_barrier(&R));
	for (int i = 0; i < ndev; i++) {
		CUDA_CHECK(cudaSetDevice(D[i].cuda_dev));
		NCCL_CHECK(ncclCommDestroy(D[i].comm));
		CUDA_CHECK(cudaFree(D[i].send));
		CUDA_CHECK(cudaFree(D[i].recv));
		CUDA_CHECK(cudaFree(D[i].d_wrong));
		CUDA_CHECK(cudaStreamDestroy(D[i].stream));
	}
	perf_rdv_close(&R);
	arm("exit", 0);
	return S.wrong_total ? EXIT_WRONG : 0;
}
