/*
 * softverbs-bw: bandwidth and latency of the software RDMA device, CPU only.
 *
 * It forks N processes, each an emulated node of a private fabric with K NICs. On
 * every NIC each process has one QP that writes to the next process (ring order) and
 * one that receives from the previous one, and one thread per process posts and
 * polls all its NICs, as NCCL's proxy thread does. A batch is a chain of W
 * unsignalled RDMA WRITEs of S bytes and a signalled zero-length WRITE_WITH_IMM
 * (the receiver takes a receive completion for it); D batches stay in flight per
 * QP. Two phases: one direction (node0 writes, node1 receives) and all directions
 * at once. It reports the rate per NIC and the aggregate, the CPU cores each process
 * used, and checks the data that arrived. --latency measures an 8-byte (or --size)
 * WRITE_WITH_IMM ping-pong between two nodes instead.
 *
 * The device is linked directly (build/softverbs, found through the run path);
 * the fabric is removed at the end.
 */
#include "softverbs/softverbs.h"

#include <errno.h>
#include <getopt.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_PROCS  16
#define MAX_NICS   8
#define MAX_WINDOW 64
#define RQ_DEPTH   256
#define LAT_WARMUP 1000
#define ACCESS_RW  (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)

enum phase { PHASE_UNI, PHASE_BI, NPHASES };

struct opts {
	int procs, nics, window, depth, gbps, iters;
	uint64_t size, bytes;
	double secs;
	bool shaping, latency;
};

/* Where a receiving QP and its buffer are. */
struct endpoint {
	uint32_t qpn;
	uint16_t lid;
	uint64_t addr;
	uint32_t rkey;
};

struct result {
	uint64_t bytes;
	double secs;
};

/* Shared by the parent and the workers (an anonymous shared mapping made before fork). */
struct shared {
	pthread_barrier_t bar;
	_Atomic int senders_done[NPHASES];
	struct endpoint send[MAX_PROCS][MAX_NICS]; /* qpn and lid of the writing QP */
	struct endpoint recv[MAX_PROCS][MAX_NICS]; /* the receiving QP and its buffer */
	struct result res[NPHASES][MAX_PROCS][MAX_NICS];
	double cpu[NPHASES][MAX_PROCS]; /* cores used during the phase */
	double lat_us[3];		/* median, mean, 99th percentile */
};

struct nic {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *sqp, *rqp;
	struct ibv_mr *smr, *rmr;
	uint8_t *src, *dst;
	struct endpoint peer; /* where sqp writes */
	int inflight;	      /* batches */
	uint64_t done;	      /* bytes completed */
	uint64_t posted;      /* bytes posted */
};

static struct opts o = {.procs = 2,
			.nics = 3,
			.window = 4,
			.depth = 2,
			.gbps = 25,
			.iters = 20000,
			.size = 4u << 20,
			.secs = 3};
static struct shared *sh;
static int rank;

static void die(int line, const char *cond, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "softverbs-bw: node%d line %d: %s ", rank, line, cond);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
	exit(1);
}

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond))                                                                       \
			die(__LINE__, #cond, "" __VA_ARGS__);                                      \
	} while (0)

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_s(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
	       (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

static void barrier(void)
{
	pthread_barrier_wait(&sh->bar);
}

static uint8_t pattern(int r, int k)
{
	return (uint8_t)(0x40 + r * MAX_NICS + k);
}

static struct ibv_qp *make_qp(struct nic *n, uint32_t send_wr)
{
	struct ibv_qp_init_attr init = {
	    .send_cq = n->cq,
	    .recv_cq = n->cq,
	    .cap = {.max_send_wr = send_wr,
		    .max_recv_wr = RQ_DEPTH,
		    .max_send_sge = 1,
		    .max_recv_sge = 1},
	    .qp_type = IBV_QPT_RC,
	};
	struct ibv_qp_attr a = {
	    .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = ACCESS_RW};
	struct ibv_qp *qp = ibv_create_qp(n->pd, &init);

	CHECK(qp != NULL, "(errno %d)", errno);
	CHECK(ibv_modify_qp(qp, &a,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) ==
	      0);
	return qp;
}

static void connect_qp(struct ibv_qp *qp, uint32_t qpn, uint16_t lid)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR,
				.path_mtu = IBV_MTU_4096,
				.dest_qp_num = qpn,
				.max_dest_rd_atomic = 1,
				.min_rnr_timer = 12,
				.ah_attr = {.dlid = lid, .port_num = 1}};

	CHECK(ibv_modify_qp(qp, &a,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) ==
	      0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	CHECK(ibv_modify_qp(qp, &a,
			    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

static void post_recv(struct nic *n)
{
	struct ibv_recv_wr wr = {.wr_id = 0}, *bad;

	CHECK(ibv_post_recv(n->rqp, &wr, &bad) == 0);
}

static void *map(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);

	CHECK(p != MAP_FAILED, "(%zu bytes)", len);
	return p;
}

/* Opens every NIC of this node, makes and connects the QPs along the ring. */
static void setup(struct nic *nics)
{
	struct ibv_device **devs = ibv_get_device_list(NULL);
	int next = (rank + 1) % o.procs, prev = (rank + o.procs - 1) % o.procs;
	/* Each write of a batch has a source and a destination of its own, as NCCL's steps. */
	size_t len = o.latency ? o.size : o.size * (size_t)o.window;

	CHECK(devs != NULL);
	for (int k = 0; k < o.nics; k++) {
		struct nic *n = &nics[k];
		struct ibv_port_attr pa;

		CHECK(devs[k] != NULL, "(NIC %d missing)", k);
		n->ctx = ibv_open_device(devs[k]);
		CHECK(n->ctx != NULL);
		n->pd = ibv_alloc_pd(n->ctx);
		n->cq = ibv_create_cq(n->ctx, 2048, NULL, NULL, 0);
		CHECK(n->pd && n->cq);
		n->src = map(len);
		n->dst = map(len);
		memset(n->src, pattern(rank, k), len);
		n->smr = ibv_reg_mr(n->pd, n->src, len, IBV_ACCESS_LOCAL_WRITE);
		n->rmr = ibv_reg_mr(n->pd, n->dst, len, ACCESS_RW);
		CHECK(n->smr && n->rmr);
		n->sqp = make_qp(n, (uint32_t)(o.window + 1) * (uint32_t)o.depth + 8);
		n->rqp = make_qp(n, 8);
		CHECK(ibv_query_port(n->ctx, 1, &pa) == 0);
		sh->send[rank][k] = (struct endpoint){.qpn = n->sqp->qp_num, .lid = pa.lid};
		sh->recv[rank][k] = (struct endpoint){.qpn = n->rqp->qp_num,
						      .lid = pa.lid,
						      .addr = (uintptr_t)n->dst,
						      .rkey = n->rmr->rkey};
	}
	ibv_free_device_list(devs);
	{
		struct softverbs_nic_stat st[MAX_NICS + 1];
		char node[32];

		/* Also makes sure the soft device is the libibverbs.so.1 that got loaded. */
		snprintf(node, sizeof(node), "node%d", rank);
		CHECK(softverbs_nic_stats(node, st, MAX_NICS + 1) == o.nics);
	}
	barrier();
	for (int k = 0; k < o.nics; k++) {
		struct nic *n = &nics[k];

		n->peer = sh->recv[next][k];
		connect_qp(n->sqp, n->peer.qpn, n->peer.lid);
		connect_qp(n->rqp, sh->send[prev][k].qpn, sh->send[prev][k].lid);
		for (int i = 0; i < RQ_DEPTH; i++)
			post_recv(n);
	}
	barrier();
}

/* W writes and a signalled WRITE_WITH_IMM, posted with one call as NCCL does. */
static void post_batch(struct nic *n, uint32_t tag)
{
	struct ibv_send_wr wr[MAX_WINDOW + 1], *bad;
	struct ibv_sge sge[MAX_WINDOW];
	int w = o.window;

	memset(wr, 0, sizeof(wr[0]) * (size_t)(w + 1));
	for (int i = 0; i <= w; i++) {
		if (i < w)
			sge[i] = (struct ibv_sge){.addr = (uintptr_t)n->src + (uint64_t)i * o.size,
						  .length = (uint32_t)o.size,
						  .lkey = n->smr->lkey};
		wr[i].wr_id = tag;
		wr[i].next = i < w ? &wr[i + 1] : NULL;
		wr[i].sg_list = i < w ? &sge[i] : NULL;
		wr[i].num_sge = i < w ? 1 : 0;
		wr[i].opcode = i < w ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_WRITE_WITH_IMM;
		wr[i].send_flags = i < w ? 0 : IBV_SEND_SIGNALED;
		wr[i].imm_data = tag;
		wr[i].wr.rdma.remote_addr = n->peer.addr + (uint64_t)i * o.size * (i < w);
		wr[i].wr.rdma.rkey = n->peer.rkey;
	}
	CHECK(ibv_post_send(n->sqp, wr, &bad) == 0);
	n->inflight++;
	n->posted += (uint64_t)w * o.size;
}

/*
 * Polls every NIC once: send completions end batches, receive completions are
 * reposted. Yields the CPU when nothing came, as NCCL's proxy thread does when idle,
 * so that on a machine with few cores the engines get to run.
 */
static void poll_all(struct nic *nics)
{
	struct ibv_wc wc[32];
	int seen = 0;

	for (int k = 0; k < o.nics; k++) {
		struct nic *n = &nics[k];
		int got = ibv_poll_cq(n->cq, 32, wc);

		CHECK(got >= 0);
		seen += got;
		for (int i = 0; i < got; i++) {
			CHECK(wc[i].status == IBV_WC_SUCCESS, "(NIC %d: %s)", k,
			      ibv_wc_status_str(wc[i].status));
			if (wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
				post_recv(n);
			} else {
				n->inflight--;
				n->done += (uint64_t)o.window * o.size;
			}
		}
	}
	if (!seen)
		sched_yield();
}

static void run_phase(struct nic *nics, enum phase ph)
{
	bool active = ph == PHASE_BI || rank == 0;
	int nactive = ph == PHASE_BI ? o.procs : 1, pending = o.nics;
	double t0, cpu0, end = 0;
	bool stopping = false;

	for (int k = 0; k < o.nics; k++)
		nics[k].done = nics[k].posted = 0;
	barrier();
	cpu0 = cpu_s();
	t0 = now_s();
	while (atomic_load(&sh->senders_done[ph]) < nactive) {
		if (active && pending) {
			double t = now_s();

			stopping |= t - t0 >= o.secs;
			for (int k = 0; k < o.nics; k++) {
				struct nic *n = &nics[k];

				while (!stopping && n->inflight < o.depth &&
				       (!o.bytes || n->posted < o.bytes))
					post_batch(n, (uint32_t)n->inflight);
			}
		}
		poll_all(nics);
		if (active && pending) {
			pending = 0;
			for (int k = 0; k < o.nics; k++) {
				struct nic *n = &nics[k];

				pending += n->inflight > 0 ||
					   (!stopping && (!o.bytes || n->posted < o.bytes));
			}
			if (!pending) {
				end = now_s();
				for (int k = 0; k < o.nics; k++)
					sh->res[ph][rank][k] = (struct result){
					    .bytes = nics[k].done, .secs = end - t0};
				atomic_fetch_add(&sh->senders_done[ph], 1);
			}
		}
	}
	sh->cpu[ph][rank] = (cpu_s() - cpu0) / ((end ? end : now_s()) - t0);
	barrier();
	/* What arrived is what the previous node's NIC k sent. */
	if (ph == PHASE_BI || rank == 1 % o.procs) {
		int prev = (rank + o.procs - 1) % o.procs;

		for (int k = 0; k < o.nics; k++)
			for (size_t i = 0; i < o.size * (size_t)o.window; i += 4093)
				CHECK(nics[k].dst[i] == pattern(prev, k),
				      "(NIC %d byte %zu is %#x, want %#x)", k, i, nics[k].dst[i],
				      pattern(prev, k));
	}
	barrier();
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* One WRITE_WITH_IMM of 8 bytes each way; node0 measures the round trips. */
static void run_latency(struct nic *n)
{
	struct ibv_sge sge = {
	    .addr = (uintptr_t)n->src, .length = (uint32_t)o.size, .lkey = n->smr->lkey};
	struct ibv_send_wr wr = {.sg_list = &sge,
				 .num_sge = 1,
				 .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
				 .send_flags = IBV_SEND_SIGNALED},
			   *bad;
	int total = LAT_WARMUP + o.iters;
	double *rtt = calloc((size_t)o.iters, sizeof(*rtt)), sum = 0;

	CHECK(rtt != NULL);
	wr.wr.rdma.remote_addr = n->peer.addr;
	wr.wr.rdma.rkey = n->peer.rkey;
	for (int i = 0; i < total; i++) {
		double t = now_s();
		bool got_recv = false, got_send = rank != 0;
		struct ibv_wc wc;

		if (rank == 0)
			CHECK(ibv_post_send(n->sqp, &wr, &bad) == 0);
		while (!got_recv || !got_send) {
			if (ibv_poll_cq(n->cq, 1, &wc) != 1)
				continue;
			CHECK(wc.status == IBV_WC_SUCCESS, "(%s)", ibv_wc_status_str(wc.status));
			if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
				got_recv = true;
				post_recv(n);
				if (rank != 0)
					CHECK(ibv_post_send(n->sqp, &wr, &bad) == 0);
			} else {
				got_send = true;
			}
		}
		/* node1's own send completion is polled in the next round (or left). */
		if (rank == 0 && i >= LAT_WARMUP)
			rtt[i - LAT_WARMUP] = (now_s() - t) * 1e6;
	}
	if (rank == 0) {
		for (int i = 0; i < o.iters; i++)
			sum += rtt[i];
		qsort(rtt, (size_t)o.iters, sizeof(*rtt), cmp_double);
		sh->lat_us[0] = rtt[o.iters / 2];
		sh->lat_us[1] = sum / o.iters;
		sh->lat_us[2] = rtt[(size_t)o.iters * 99 / 100];
	}
	free(rtt);
	barrier();
}

static void worker(const char *fabric)
{
	char node[32], nics[MAX_NICS * 32] = "";
	struct nic n[MAX_NICS];

	memset(n, 0, sizeof(n));
	snprintf(node, sizeof(node), "node%d", rank);
	for (int k = 0; k < o.nics; k++)
		snprintf(nics + strlen(nics), sizeof(nics) - strlen(nics), "%smlx5_%d:%d",
			 k ? "," : "", k, o.gbps);
	setenv("SOFTVERBS_FABRIC", fabric, 1);
	setenv("SOFTVERBS_NODE", node, 1);
	setenv("SOFTVERBS_NICS", nics, 1);
	setenv("SOFTVERBS_SHAPING", o.shaping ? "1" : "0", 1);
	unsetenv("SOFTVERBS_FAULT");
	alarm((unsigned)(o.secs * 4 + 120));
	setup(n);
	if (o.latency) {
		run_latency(&n[0]);
		return;
	}
	run_phase(n, PHASE_UNI);
	run_phase(n, PHASE_BI);
}

static void report(void)
{
	const char *names[NPHASES] = {"one-direction", "bidirectional"};
	double nic_gbps = o.gbps / 8.0;

	if (o.latency) {
		printf("latency node0<->node1 mlx5_0: %llu-byte WRITE_WITH_IMM round trip median "
		       "%.2f us, mean %.2f us, p99 %.2f us (%d iterations)\n",
		       (unsigned long long)o.size, sh->lat_us[0], sh->lat_us[1], sh->lat_us[2],
		       o.iters);
		return;
	}
	for (int ph = 0; ph < NPHASES; ph++) {
		int senders = ph == PHASE_BI ? o.procs : 1;
		double total = 0;

		printf("%s:\n", names[ph]);
		for (int r = 0; r < senders; r++) {
			double node_total = 0;

			for (int k = 0; k < o.nics; k++) {
				struct result *x = &sh->res[ph][r][k];
				double gbs = x->secs > 0 ? (double)x->bytes / x->secs / 1e9 : 0;

				printf("  node%d mlx5_%d -> node%d   %7.3f GB/s  (%6.2f Gb/s)\n", r,
				       k, (r + 1) % o.procs, gbs, gbs * 8);
				node_total += gbs;
			}
			printf("  node%d sends               %7.3f GB/s\n", r, node_total);
			total += node_total;
		}
		printf("  aggregate                  %7.3f GB/s", total);
		if (o.shaping)
			printf("  (shaped: %.3f GB/s per NIC, %.3f GB/s per node: %.1f%%)",
			       nic_gbps, nic_gbps * o.nics,
			       100 * total / (nic_gbps * o.nics * senders));
		printf("\n  cpu cores used:");
		for (int r = 0; r < o.procs; r++)
			printf(" node%d %.2f", r, sh->cpu[ph][r]);
		printf("\n");
	}
}

static uint64_t parse_size(const char *s)
{
	char *end;
	double v = strtod(s, &end);

	switch (*end) {
	case 'k':
	case 'K':
		v *= 1024;
		break;
	case 'm':
	case 'M':
		v *= 1024 * 1024;
		break;
	case 'g':
	case 'G':
		v *= 1024.0 * 1024 * 1024;
		break;
	default:
		break;
	}
	return (uint64_t)v;
}

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: softverbs-bw [--procs N] [--nics K] [--size S] [--window W] [--depth D]\n"
	    "                    [--time SECS | --bytes B] [--shaping] [--gbps G]\n"
	    "       softverbs-bw --latency [--size S] [--iters N] [--shaping] [--gbps G]\n"
	    "  N processes (emulated nodes, default 2) with K NICs each (default 3) write along\n"
	    "  a ring: per NIC one QP to the next node, one from the previous; batches of W\n"
	    "  (default 4) RDMA WRITEs of S bytes (default 4M) and a signalled WRITE_WITH_IMM,\n"
	    "  D batches in flight per QP (default 2), for SECS seconds (default 3) or B bytes\n"
	    "  per NIC. Phases: node0 -> node1 alone, then every node at once.\n"
	    "  --shaping: SOFTVERBS_SHAPING=1, NICs of G Gb/s (default 25).\n"
	    "  --latency: WRITE_WITH_IMM ping-pong node0 <-> node1 of S bytes (default 8 here),\n"
	    "  N round trips (default 20000).\n"
	    "  SOFTVERBS_ENGINES is passed on (0 = no engine threads).\n");
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {{"procs", required_argument, NULL, 'p'},
					   {"nics", required_argument, NULL, 'n'},
					   {"size", required_argument, NULL, 's'},
					   {"window", required_argument, NULL, 'w'},
					   {"depth", required_argument, NULL, 'd'},
					   {"time", required_argument, NULL, 't'},
					   {"bytes", required_argument, NULL, 'b'},
					   {"shaping", no_argument, NULL, 'S'},
					   {"gbps", required_argument, NULL, 'g'},
					   {"latency", no_argument, NULL, 'l'},
					   {"iters", required_argument, NULL, 'i'},
					   {"help", no_argument, NULL, 'h'},
					   {NULL, 0, NULL, 0}};
	pthread_barrierattr_t ba;
	pid_t pids[MAX_PROCS];
	char fabric[64], path[80];
	const char *eng = getenv("SOFTVERBS_ENGINES");
	bool size_set = false;
	int c, failed = 0;

	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 'p':
			o.procs = atoi(optarg);
			break;
		case 'n':
			o.nics = atoi(optarg);
			break;
		case 's':
			o.size = parse_size(optarg);
			size_set = true;
			break;
		case 'w':
			o.window = atoi(optarg);
			break;
		case 'd':
			o.depth = atoi(optarg);
			break;
		case 't':
			o.secs = atof(optarg);
			break;
		case 'b':
			o.bytes = parse_size(optarg);
			o.secs = 1e9;
			break;
		case 'S':
			o.shaping = true;
			break;
		case 'g':
			o.gbps = atoi(optarg);
			break;
		case 'l':
			o.latency = true;
			break;
		case 'i':
			o.iters = atoi(optarg);
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc || o.procs < 2 || o.procs > MAX_PROCS || o.nics < 1 ||
	    o.nics > MAX_NICS || o.window < 1 || o.window > MAX_WINDOW || o.depth < 1 ||
	    o.size < 1 || o.size > (1u << 30) || !(o.secs > 0) || o.gbps < 1 || o.iters < 1 ||
	    (o.window + 1) * o.depth + 8 > 32768) {
		usage(stderr);
		return 2;
	}
	if (o.latency) {
		o.procs = 2;
		o.nics = 1;
		if (!size_set)
			o.size = 8;
	}
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		return 1;
	pthread_barrierattr_init(&ba);
	pthread_barrierattr_setpshared(&ba, PTHREAD_PROCESS_SHARED);
	pthread_barrier_init(&sh->bar, &ba, (unsigned)o.procs);
	snprintf(fabric, sizeof(fabric), "softverbs-bw-%d", (int)getpid());
	if (o.latency)
		printf("softverbs-bw: latency, 2 nodes, 1 NIC, %s, engines %s\n",
		       o.shaping ? "shaped" : "unshaped", eng && !strcmp(eng, "0") ? "off" : "on");
	else
		printf("softverbs-bw: %d nodes x %d NICs, %llu-byte writes, window %d + "
		       "WRITE_WITH_IMM, depth %d, %s, %s, engines %s\n",
		       o.procs, o.nics, (unsigned long long)o.size, o.window, o.depth,
		       o.bytes ? "by bytes" : "timed", o.shaping ? "shaped" : "unshaped",
		       eng && !strcmp(eng, "0") ? "off" : "on");
	fflush(stdout);
	for (int r = 0; r < o.procs; r++) {
		pids[r] = fork();
		if (pids[r] == 0) {
			rank = r;
			worker(fabric);
			exit(0);
		}
		if (pids[r] < 0) {
			perror("fork");
			failed = 1;
			for (int k = 0; k < r; k++)
				kill(pids[k], SIGKILL);
			o.procs = r;
			break;
		}
	}
	for (int left = o.procs; left > 0; left--) {
		int st;
		pid_t p = wait(&st);

		if (p < 0)
			break;
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			if (!failed)
				fprintf(stderr, "softverbs-bw: a worker failed (%s %d)\n",
					WIFSIGNALED(st) ? "signal" : "exit",
					WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
			failed = 1;
			for (int r = 0; r < o.procs; r++)
				if (pids[r] != p)
					kill(pids[r], SIGKILL);
		}
	}
	snprintf(path, sizeof(path), "/%s", fabric);
	shm_unlink(path);
	if (failed)
		return 1;
	report();
	return 0;
}
