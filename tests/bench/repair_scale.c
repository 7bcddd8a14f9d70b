/*
 * Repair time after detection for many queue pairs on one NIC (make bench).
 *
 *   repair_scale --qps N[,N...] [--peers P] [--reps R] [--no-preload] [--keep]
 *                [--load-ms MS [--load-gbps G]] [--fault down|none]
 *
 * One run: process 0 (node0) has N RC queue pairs on mlx5_0, spread over P
 * peer processes (four per emulated node; default N/8, at most 64), each
 * queue pair connected to one on the peer's mlx5_0, every process with two
 * soft NICs and libr2cc.so preloaded, all of them in one NCCL communicator
 * made through the NCCL test double (so R2CC's control plane knows the job).
 * Each peer posts one receive per queue pair. Once every queue pair is in RTS
 * and R2CC has had time to find the peers, node0's mlx5_0 goes down
 * (softverbs-ctl), node0 posts one RDMA WRITE_WITH_IMM on every queue pair at
 * once (NCCL keeps posting) and every process polls until its completions
 * are in: all N writes must arrive, with the right bytes.
 *
 * Printed per run: detection (fault to R2CC's first detection), repair (from
 * node0's detection to the last queue pair migrated in any process, from the
 * R2CC reports), node0's own migration time, the time from the fault until
 * every write was delivered, node0's peak resident memory (which counts the
 * pages of the soft device's shared region it touched, so it varies from run
 * to run) and node0's heap in use at the end (malloc'd bytes). --no-preload
 * runs the same set-up without R2CC and without the fault: the baseline, so
 * that the heap difference is what R2CC holds. Exit 0 when every run
 * delivered everything (2: usage).
 *
 * --load-ms MS: before the fault, node0 keeps every queue pair busy for MS ms with
 * 64 KB RDMA writes, two outstanding on each, over NICs shaped to G Gb/s (default 10;
 * every process then has three NICs, so that the fast self-test has two siblings):
 * with 512 queue pairs that is 64 MB queued on one NIC, about 50 ms of it at 10 Gb/s,
 * so every request waits far longer than the stall scan's period and R2CC's NIC
 * self-test runs as often as it may. Printed then: the load's rate, node0's NIC
 * self-tests (passed, failed, inconclusive, from its report) per second of load, the
 * peers' (tests their end on node0's asking: a request still waiting after node0's
 * NIC passed a test), the waits node0 asked a peer about, per second, and
 * the incidents any process detected before the fault (false repairs: there must be
 * none; with --fault none, every incident is one).
 * --fault none leaves the NIC up (the final writes then need no repair).
 *
 * The soft device holds 4096 QPs and 2048 CQs in all; R2CC rebuilds both ends
 * of every queue pair (a QP and a CQ each), so N is at most 1000.
 */
#include "tools/drill/drill.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/common/util.h"

#define MAX_PEERS  64
#define PER_NODE   4
#define SLOT	   64 /* bytes of one queue pair's target in a peer's buffer */
#define MAX_QPS	   1000
#define WAIT_S	   60
#define NICS	   "mlx5_0:100,mlx5_1:100"
#define LOAD_BYTES 65536 /* one write of the load */
#define LOAD_DEPTH 2	 /* outstanding per queue pair */

struct ep {
	uint16_t lid;
	uint32_t qpn;
};

/* What a process publishes: its endpoints and where its buffer is. */
struct ep_file {
	int n;
	uint64_t addr;
	uint32_t rkey;
	uint64_t load_addr; /* LOAD_BYTES that node0's load writes land in */
	uint32_t load_rkey;
	struct ep ep[MAX_QPS];
};

/* What a process reports when it is done. */
struct done_file {
	int status; /* 0: every completion in, right bytes */
	int got;
	double t_all; /* CLOCK_REALTIME when the last completion came */
	long hwm_kb;
	double heap_mib; /* malloc'd and in use (R2CC's share: with minus without it) */
	double load_s;	 /* node0: how long the load ran, and the bytes it moved */
	double load_bytes;
	char err[160];
};

static int nqps, npeers, rank, nprocs, load_ms, load_gbps = 10;
static const char *dir;
static bool preload = true, keep, fault_down = true;

static double real_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int put(const char *name, int r, const void *data, size_t len)
{
	char path[PATH_MAX], tmp[PATH_MAX + 8];
	snprintf(path, sizeof(path), "%s/%s.%d", dir, name, r);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		return -errno;
	bool ok = write(fd, data, len) == (ssize_t)len;
	close(fd);
	return ok && rename(tmp, path) == 0 ? 0 : -EIO;
}

/* Waits (up to WAIT_S) for name.r and reads it. */
static int get(const char *name, int r, void *data, size_t len)
{
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/%s.%d", dir, name, r);
	for (int i = 0; i < WAIT_S * 1000; i++) {
		int fd = open(path, O_RDONLY);
		if (fd >= 0) {
			ssize_t n = read(fd, data, len);
			close(fd);
			return n == (ssize_t)len ? 0 : -EIO;
		}
		usleep(1000);
	}
	return -ETIMEDOUT;
}

static bool exists(const char *name, int r)
{
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/%s.%d", dir, name, r);
	return access(path, F_OK) == 0;
}

/* Queue pair q of node0 belongs to peer 1 + q % npeers, as its index q / npeers. */
static int peer_of(int q)
{
	return 1 + q % npeers;
}

static int count_of(int r)
{
	if (r == 0)
		return nqps;
	int n = 0;
	for (int q = 0; q < nqps; q++)
		n += peer_of(q) == r;
	return n;
}

/* NCCL's async-event thread (ncclIbAsyncThreadMain): the port events it reads
 * are where R2CC learns a port went down. */
static void *async_main(void *arg)
{
	struct ibv_context *ctx = arg;
	struct ibv_async_event ev;
	while (drill_ibv.get_async_event(ctx, &ev) == 0)
		drill_ibv.ack_async_event(&ev);
	return NULL;
}

static void fail(struct done_file *d, const char *what, int rc)
{
	if (!d->status) {
		d->status = rc ? rc : -EPROTO;
		snprintf(d->err, sizeof(d->err), "rank %d: %s (%s)", rank, what,
			 strerror(rc < 0 ? -rc : rc));
	}
}

struct nccl_uid {
	char b[128];
};

/* The NCCL test double's communicator, looked up globally as NCCL would be. */
static int nccl_join(const char *lib, void **comm)
{
	struct nccl_uid uid;
	int (*get_uid)(struct nccl_uid *) = NULL;
	int (*init)(void **, int, struct nccl_uid, int) = NULL;
	if (!dlopen(lib, RTLD_NOW | RTLD_GLOBAL))
		return -ENOENT;
	*(void **)&get_uid = dlsym(RTLD_DEFAULT, "ncclGetUniqueId");
	*(void **)&init = dlsym(RTLD_DEFAULT, "ncclCommInitRank");
	if (!get_uid || !init)
		return -ENOENT;
	if (rank == 0 && (get_uid(&uid) || put("uid", 0, &uid, sizeof(uid))))
		return -EIO;
	if (get("uid", 0, &uid, sizeof(uid)))
		return -ETIMEDOUT;
	return init(comm, nprocs, uid, rank) ? -EIO : 0;
}

/* One write of node0's load on queue pair i. */
static int load_post(struct ibv_qp *qp, int i, const struct ep_file *eps, unsigned char *lbuf,
		     struct ibv_mr *lmr)
{
	int r = peer_of(i);
	struct ibv_sge sge = {(uintptr_t)lbuf, LOAD_BYTES, lmr->lkey};
	struct ibv_send_wr w = {.wr_id = (uint64_t)i,
				.sg_list = &sge,
				.num_sge = 1,
				.opcode = IBV_WR_RDMA_WRITE,
				.send_flags = IBV_SEND_SIGNALED},
			   *bad;
	w.wr.rdma.remote_addr = eps[r].load_addr;
	w.wr.rdma.rkey = eps[r].load_rkey;
	return -qp->context->ops.post_send(qp, &w, &bad);
}

/* node0's load: LOAD_DEPTH writes of LOAD_BYTES outstanding on every queue pair for
 * load_ms, each reposted when it completes; then every one of them drained. */
static int load(struct ibv_qp **qp, int n, struct ibv_cq *cq, const struct ep_file *eps,
		unsigned char *lbuf, struct ibv_mr *lmr, struct done_file *d)
{
	int out = 0, rc;
	double t0 = real_s(), stop = t0 + load_ms / 1e3, until = stop + WAIT_S;
	for (int k = 0; k < LOAD_DEPTH * n; k++, out++)
		if ((rc = load_post(qp[k % n], k % n, eps, lbuf, lmr)))
			return rc;
	while (out > 0 && real_s() < until) {
		struct ibv_wc wc[32];
		int k = cq->context->ops.poll_cq(cq, 32, wc);
		for (int j = 0; j < k; j++) {
			if (wc[j].status != IBV_WC_SUCCESS)
				return -EIO;
			out--;
			d->load_bytes += LOAD_BYTES;
			int i = (int)wc[j].wr_id;
			if (real_s() < stop) {
				if ((rc = load_post(qp[i], i, eps, lbuf, lmr)))
					return rc;
				out++;
			}
		}
		if (!k)
			usleep(50);
	}
	d->load_s = real_s() - t0;
	return out ? -ETIMEDOUT : 0;
}

static int worker(const char *nccl_lib)
{
	static struct ep_file me;
	struct done_file d = {0};
	char err[256];
	void *comm = NULL;
	int n = count_of(rank), rc;
	if ((rc = drill_ibv_load(err, sizeof(err)))) {
		fail(&d, err, -ENOENT);
		goto out;
	}
	if (preload && (rc = nccl_join(nccl_lib, &comm))) {
		fail(&d, "NCCL communicator", rc);
		goto out;
	}
	int ndev = 0;
	struct ibv_device **devs = drill_ibv.get_device_list(&ndev);
	/* With the load, a third NIC: R2CC's fast self-test wants two siblings. */
	int nnic = load_ms ? 3 : 2;
	struct ibv_context *ctx[3] = {NULL, NULL, NULL};
	for (int i = 0; devs && i < ndev; i++) {
		const char *name = drill_ibv.get_device_name(devs[i]);
		for (int k = 0; k < nnic; k++) {
			char want[16];
			snprintf(want, sizeof(want), "mlx5_%d", k);
			if (!strcmp(name, want))
				ctx[k] = drill_ibv.open_device(devs[i]);
		}
	}
	if (!ctx[0] || !ctx[1] || (nnic > 2 && !ctx[2])) {
		fail(&d, "open mlx5_0 and mlx5_1 (and mlx5_2)", -ENODEV);
		goto out;
	}
	for (int i = 0; i < nnic; i++) {
		pthread_t t;
		if (pthread_create(&t, NULL, async_main, ctx[i]) == 0)
			pthread_detach(t);
	}
	struct ibv_port_attr pa;
	memset(&pa, 0, sizeof(pa));
	drill_ibv.query_port(ctx[0], 1, &pa);
	union ibv_gid gid;
	drill_ibv.query_gid(ctx[0], 1, 0, &gid);
	struct ibv_pd *pd = drill_ibv.alloc_pd(ctx[0]);
	/* The other NIC is opened and used as NCCL would (R2CC mirrors onto it). */
	struct ibv_pd *pd1 = drill_ibv.alloc_pd(ctx[1]);
	size_t blen = (size_t)(n ? n : 1) * SLOT;
	unsigned char *buf = calloc(1, blen);
	struct ibv_mr *mr =
	    pd && buf ? drill_ibv.reg_mr(pd, buf, blen,
					 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					     IBV_ACCESS_REMOTE_READ)
		      : NULL;
	struct ibv_mr *mr1 =
	    pd1 && buf
		? drill_ibv.reg_mr(pd1, buf, blen, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
		: NULL;
	struct ibv_pd *pd2 = ctx[2] ? drill_ibv.alloc_pd(ctx[2]) : NULL;
	if (ctx[2] &&
	    !(pd2 && buf &&
	      drill_ibv.reg_mr(pd2, buf, blen, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE))) {
		fail(&d, "PD or MR on mlx5_2", -ENOMEM);
		goto out;
	}
	int depth = n * 2 + 16 < 2048 ? n * 2 + 16 : 2048;
	struct ibv_cq *cq = drill_ibv.create_cq(ctx[0], depth, NULL, NULL, 0);
	struct ibv_qp **qp = calloc((size_t)(n ? n : 1), sizeof(*qp));
	if (!mr || !mr1 || !cq || !qp) {
		fail(&d, "PD, MR or CQ", -ENOMEM);
		goto out;
	}
	me.n = n;
	me.addr = (uint64_t)(uintptr_t)buf;
	me.rkey = mr->rkey;
	unsigned char *lbuf = load_ms ? calloc(1, LOAD_BYTES) : NULL;
	struct ibv_mr *lmr =
	    lbuf ? drill_ibv.reg_mr(pd, lbuf, LOAD_BYTES,
				    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
		 : NULL;
	if (load_ms && !lmr) {
		fail(&d, "load buffer", -ENOMEM);
		goto out;
	}
	me.load_addr = (uint64_t)(uintptr_t)lbuf;
	me.load_rkey = lmr ? lmr->rkey : 0;
	for (int i = 0; i < n; i++) {
		struct ibv_qp_init_attr ia = {
		    .send_cq = cq,
		    .recv_cq = cq,
		    .qp_type = IBV_QPT_RC,
		    .cap = {.max_send_wr = 4,
			    .max_recv_wr = 4,
			    .max_send_sge = 1,
			    .max_recv_sge = 1},
		};
		qp[i] = drill_ibv.create_qp(pd, &ia);
		if (!qp[i]) {
			fail(&d, "create_qp", -errno);
			goto out;
		}
		struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
					.port_num = 1,
					.qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
							   (rank ? IBV_ACCESS_REMOTE_ATOMIC : 0)};
		if ((rc = drill_ibv.modify_qp(qp[i], &a,
					      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
						  IBV_QP_ACCESS_FLAGS))) {
			fail(&d, "INIT", -rc);
			goto out;
		}
		me.ep[i] = (struct ep){pa.lid, qp[i]->qp_num};
	}
	if ((rc = put("ep", rank, &me, sizeof(me)))) {
		fail(&d, "publish endpoints", rc);
		goto out;
	}
	/* Everyone's endpoints (node0 needs all peers', a peer node0's). */
	static struct ep_file eps[MAX_PEERS + 1];
	for (int r = rank ? 0 : 1; r <= (rank ? 0 : npeers); r++)
		if ((rc = get("ep", r, &eps[r], sizeof(eps[r])))) {
			fail(&d, "endpoints", rc);
			goto out;
		}
	/* Connect: node0's QP q to peer_of(q)'s QP q / npeers. */
	for (int i = 0; i < n; i++) {
		int r = rank ? 0 : peer_of(i);
		int idx = rank ? -1 : i / npeers;
		if (rank) { /* my i-th QP is node0's q with peer_of(q) == rank, i-th such */
			int seen = 0;
			for (int q = 0; q < nqps && idx < 0; q++)
				if (peer_of(q) == rank && seen++ == i)
					idx = q;
		}
		const struct ep_file *other = &eps[r];
		struct ibv_qp_attr a;
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_RTR;
		a.path_mtu = IBV_MTU_4096;
		a.dest_qp_num = other->ep[idx].qpn;
		a.ah_attr.dlid = other->ep[idx].lid;
		a.ah_attr.port_num = 1;
		a.max_dest_rd_atomic = 1;
		a.min_rnr_timer = 12;
		if ((rc = drill_ibv.modify_qp(
			 qp[i], &a,
			 IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))) {
			fail(&d, "RTR", -rc);
			goto out;
		}
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_RTS;
		a.timeout = 20;
		a.retry_cnt = 7;
		a.rnr_retry = 7;
		a.max_rd_atomic = 1;
		if ((rc = drill_ibv.modify_qp(qp[i], &a,
					      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
						  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
						  IBV_QP_MAX_QP_RD_ATOMIC))) {
			fail(&d, "RTS", -rc);
			goto out;
		}
		if (rank) { /* the receive the write will consume */
			struct ibv_recv_wr rw = {.wr_id = (uint64_t)i}, *bad;
			if ((rc = qp[i]->context->ops.post_recv(qp[i], &rw, &bad))) {
				fail(&d, "post_recv", -rc);
				goto out;
			}
		}
	}
	if (rank == 0 && load_ms && (rc = load(qp, n, cq, eps, lbuf, lmr, &d))) {
		fail(&d, "load", rc);
		goto out;
	}
	put("rts", rank, &d, 1);
	/* The fault; then node0 writes on every QP at once and all poll. */
	char go;
	if ((rc = get("fault", 0, &go, 1))) {
		fail(&d, "the fault", rc);
		goto out;
	}
	if (rank == 0) {
		for (int i = 0; i < n; i++) {
			uint64_t *src = (uint64_t *)(buf + (size_t)i * SLOT);
			*src = 0x5232434300000000ull | (uint64_t)i;
			int r = peer_of(i), idx = i / npeers;
			struct ibv_sge sge = {(uintptr_t)src, 8, mr->lkey};
			struct ibv_send_wr w = {.wr_id = (uint64_t)i,
						.sg_list = &sge,
						.num_sge = 1,
						.opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
						.send_flags = IBV_SEND_SIGNALED,
						.imm_data = htonl((uint32_t)i)},
					   *bad;
			w.wr.rdma.remote_addr = eps[r].addr + (uint64_t)idx * SLOT;
			w.wr.rdma.rkey = eps[r].rkey;
			if ((rc = qp[i]->context->ops.post_send(qp[i], &w, &bad))) {
				fail(&d, "post_send", -rc);
				goto out;
			}
		}
	}
	double until = real_s() + WAIT_S;
	while (d.got < n && real_s() < until && !d.status) {
		struct ibv_wc wc[32];
		int k = cq->context->ops.poll_cq(cq, 32, wc);
		for (int j = 0; j < k; j++) {
			if (wc[j].status != IBV_WC_SUCCESS) {
				fail(&d, "error completion", -EIO);
				break;
			}
			if (rank) { /* the bytes of node0's QP idx */
				int seen = 0, q = -1;
				for (int x = 0; x < nqps && q < 0; x++)
					if (peer_of(x) == rank && seen++ == (int)wc[j].wr_id)
						q = x;
				uint64_t v;
				memcpy(&v, buf + (size_t)(q / npeers) * SLOT, 8);
				if (v != (0x5232434300000000ull | (uint64_t)q) ||
				    ntohl(wc[j].imm_data) != (uint32_t)q)
					fail(&d, "wrong bytes or immediate", -EPROTO);
			}
			d.got++;
		}
		/* node0 polls as NCCL does; 64 peers doing so would starve 2 cores. */
		if (!k)
			usleep(rank ? 1000 : 50);
	}
	d.t_all = real_s();
	if (d.got < n)
		fail(&d, "completions missing", -ETIMEDOUT);
	/* Others may still repair with this process: wait for everyone. */
	put("got", rank, &d, 1);
	for (int r = 0; r < nprocs; r++)
		while (!exists("got", r) && real_s() < until + 5)
			usleep(2000);
out:
	d.hwm_kb = hwm_kb();
	struct mallinfo2 mi = mallinfo2();
	d.heap_mib = (double)(mi.uordblks + mi.hblkhd) / (1 << 20);
	put("done", rank, &d, sizeof(d));
	return d.status ? 1 : 0;
}

/* --- the parent -------------------------------------------------------------------- */

static char build[PATH_MAX];

static pid_t spawn(int r, const char *fabric, const char *self)
{
	pid_t p = fork();
	if (p)
		return p;
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	char node[32], lp[PATH_MAX + 32], pre[PATH_MAX + 32], rep[PATH_MAX + 64], fab[128];
	snprintf(node, sizeof(node), "node%d", r ? 1 + (r - 1) / PER_NODE : 0);
	snprintf(fab, sizeof(fab), "%s", fabric);
	setenv("SOFTVERBS_FABRIC", fab, 1);
	setenv("SOFTVERBS_NODE", node, 1);
	setenv("NCCL_HOSTID", node, 1);
	char nics[64];
	snprintf(nics, sizeof(nics), "mlx5_0:%d,mlx5_1:%d,mlx5_2:%d", load_gbps, load_gbps,
		 load_gbps);
	setenv("SOFTVERBS_NICS", load_ms ? nics : NICS, 1);
	if (load_ms)
		setenv("SOFTVERBS_SHAPING", "1", 1);
	setenv("SOFTVERBS_TIME_SCALE", "0.01", 1);
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	snprintf(lp, sizeof(lp), "%s/softverbs", build);
	setenv("LD_LIBRARY_PATH", lp, 1);
	if (preload) {
		snprintf(pre, sizeof(pre), "%s/lib/libr2cc.so", build);
		setenv("LD_PRELOAD", pre, 1);
		snprintf(rep, sizeof(rep), "%s/report.%d", dir, r);
		setenv("R2CC_REPORT", rep, 1);
	}
	char rs[16], qs[16], ps[16], ls[16];
	snprintf(rs, sizeof(rs), "%d", r);
	snprintf(qs, sizeof(qs), "%d", nqps);
	snprintf(ps, sizeof(ps), "%d", npeers);
	snprintf(ls, sizeof(ls), "%d", load_ms);
	execl(self, self, "--worker", rs, "--qps", qs, "--peers", ps, "--dir", dir,
	      preload ? "--preload" : "--no-preload", "--load-ms", ls, (char *)NULL);
	_exit(127);
}

/* The sum of the numbers following key in buf (JSON: "key":1.5). */
static double report_sum(const char *buf, const char *key)
{
	double v = 0;
	size_t k = strlen(key);
	for (const char *p = buf; (p = strstr(p, key)); p += k)
		v += strtod(p + k, NULL);
	return v;
}

/* Process r's JSON report (its first sizeof(buf) - 1 bytes; "" if there is none). */
static void report_read(int r, char *buf, size_t len)
{
	char path[PATH_MAX + 64];
	snprintf(path, sizeof(path), "%s/report.%d.json", dir, r);
	FILE *f = fopen(path, "r");
	size_t n = f ? fread(buf, 1, len - 1, f) : 0;
	if (f)
		fclose(f);
	buf[n] = 0;
}

/* Its self-tests: passed, failed, inconclusive. */
static void report_tests(const char *buf, double *tests)
{
	tests[0] = report_sum(buf, "\"selftests_passed\":");
	tests[1] = report_sum(buf, "\"selftests_failed\":");
	tests[2] = report_sum(buf, "\"selftests_inconclusive\":");
}

/* Its incidents detected before t (a time of day). */
static int report_early(const char *buf, double t)
{
	int n = 0;
	for (const char *p = buf; (p = strstr(p, "\"detected_unix\":")); p++)
		n += strtod(p + 16, NULL) < t;
	return n;
}

/* Its first detection, last repair done and (mig) longest migration. */
static void report_times(const char *buf, double *det, double *done, double *mig)
{
	for (const char *p = buf; (p = strstr(p, "\"detected_unix\":")); p++) {
		double v = strtod(p + 16, NULL);
		if (*det == 0 || v < *det)
			*det = v;
	}
	for (const char *p = buf; (p = strstr(p, "\"done_unix\":")); p++) {
		double v = strtod(p + 12, NULL);
		if (v > *done)
			*done = v;
	}
	for (const char *p = buf; mig && (p = strstr(p, "\"migrate_ms\":")); p++) {
		double v = strtod(p + 13, NULL);
		if (v > *mig)
			*mig = v;
	}
}

static int run_once(const char *self, int q, int peers, double *out)
{
	char d[] = "/tmp/r2cc-repair-scale.XXXXXX", fabric[64], cmd[PATH_MAX * 2];
	if (!mkdtemp(d))
		return -1;
	dir = d;
	nqps = q;
	npeers = peers;
	nprocs = peers + 1;
	snprintf(fabric, sizeof(fabric), "r2cc-repair-scale-%d", getpid());
	pid_t *pid = calloc((size_t)nprocs, sizeof(*pid));
	for (int r = 0; r < nprocs; r++)
		pid[r] = spawn(r, fabric, self);
	int bad = 0;
	char c;
	for (int r = 0; r < nprocs && !bad; r++)
		bad = get("rts", r, &c, 1) != 0;
	/* R2CC finds every QP's peer in the background: give it time. */
	usleep((useconds_t)(300000 + q * 500));
	double t_fault = real_s();
	snprintf(cmd, sizeof(cmd),
		 "%s/bin/softverbs-ctl --fabric %s fault node0 mlx5_0 down >/dev/null", build,
		 fabric);
	if (!bad && preload && fault_down && system(cmd) != 0)
		bad = 1;
	put("fault", 0, &c, 1);
	struct done_file dn[MAX_PEERS + 1];
	double t_all = 0;
	for (int r = 0; r < nprocs; r++) {
		int st;
		waitpid(pid[r], &st, 0);
		if (get("done", r, &dn[r], sizeof(dn[r])) || dn[r].status) {
			if (!bad)
				fprintf(stderr, "repair_scale: %s\n",
					dn[r].status ? dn[r].err : "a worker did not report");
			bad = 1;
		} else if (dn[r].t_all > t_all) {
			t_all = dn[r].t_all;
		}
	}
	/* every process's report, read once: detection and repair times; node0's
	 * self-tests; incidents before the fault (with none injected: any) */
	double det = 0, done = 0, mig0 = 0, tests[3] = {0, 0, 0}, peer_tests = 0, asked = 0;
	int early = 0;
	for (int r = 0; preload && r < nprocs; r++) {
		static char buf[65536];
		report_read(r, buf, sizeof(buf));
		report_times(buf, &det, &done, r == 0 ? &mig0 : NULL);
		early += report_early(buf, fault_down ? t_fault : 1e300);
		double t[3];
		report_tests(buf, r == 0 ? tests : t);
		if (r)
			peer_tests += t[0] + t[1] + t[2];
		else
			asked = report_sum(buf, "\"far_ends_asked\":");
	}
	out[0] = det ? (det - t_fault) * 1e3 : -1;
	out[1] = det && done ? (done - det) * 1e3 : -1;
	out[2] = mig0;
	out[3] = (t_all - t_fault) * 1e3;
	out[4] = dn[0].hwm_kb / 1024.0;
	out[5] = dn[0].heap_mib;
	out[6] = dn[0].load_s > 0 ? dn[0].load_bytes * 8 / dn[0].load_s / 1e9 : 0;
	out[7] = dn[0].load_s > 0 ? (tests[0] + tests[1] + tests[2]) / dn[0].load_s : 0;
	out[8] = tests[0];
	out[9] = tests[1] + tests[2];
	out[10] = early;
	out[11] = dn[0].load_s > 0 ? peer_tests / dn[0].load_s : 0;
	out[12] = dn[0].load_s > 0 ? asked / dn[0].load_s : 0;
	if (!fault_down)
		out[0] = out[1] = -1;
	snprintf(cmd, sizeof(cmd), "%s/bin/softverbs-ctl --fabric %s reset >/dev/null 2>&1; %s %s",
		 build, fabric, keep ? "echo kept" : "rm -rf", d);
	if (system(cmd) != 0)
		fprintf(stderr, "repair_scale: could not clean up %s\n", d);
	free(pid);
	return bad ? -1 : 0;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"qps", required_argument, NULL, 'q'},     {"peers", required_argument, NULL, 'p'},
	    {"reps", required_argument, NULL, 'r'},    {"worker", required_argument, NULL, 'w'},
	    {"dir", required_argument, NULL, 'd'},     {"no-preload", no_argument, NULL, 'n'},
	    {"preload", no_argument, NULL, 'P'},       {"keep", no_argument, NULL, 'k'},
	    {"load-ms", required_argument, NULL, 'l'}, {"load-gbps", required_argument, NULL, 'g'},
	    {"fault", required_argument, NULL, 'f'},   {NULL, 0, NULL, 0}};
	char *qlist = NULL;
	int reps = 1, peers = 0, c, wrank = -1;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'q':
			qlist = optarg;
			break;
		case 'p':
			peers = atoi(optarg);
			break;
		case 'r':
			reps = atoi(optarg);
			break;
		case 'w':
			wrank = atoi(optarg);
			break;
		case 'd':
			dir = optarg;
			break;
		case 'n':
			preload = false;
			break;
		case 'P':
			preload = true;
			break;
		case 'k':
			keep = true;
			break;
		case 'l':
			load_ms = atoi(optarg);
			break;
		case 'g':
			load_gbps = atoi(optarg);
			break;
		case 'f':
			if (strcmp(optarg, "down") && strcmp(optarg, "none")) {
				fprintf(stderr, "repair_scale: --fault down or none, not %s\n",
					optarg);
				return 2;
			}
			fault_down = !strcmp(optarg, "down");
			break;
		default:
			return 2;
		}
	}
	char self[PATH_MAX];
	ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (sl <= 0)
		return 2;
	self[sl] = 0;
	/* build/tests/bench/repair_scale -> build */
	snprintf(build, sizeof(build), "%s", self);
	for (int i = 0; i < 3; i++) {
		char *s = strrchr(build, '/');
		if (s)
			*s = 0;
	}
	if (wrank >= 0) {
		rank = wrank;
		nqps = qlist ? atoi(qlist) : 0;
		npeers = peers;
		nprocs = npeers + 1;
		char lib[PATH_MAX + 64];
		snprintf(lib, sizeof(lib), "%s/tests/ncclstub/libnccl.so.2", build);
		return worker(lib);
	}
	if (!qlist || reps < 1 || peers < 0 || peers > MAX_PEERS || load_ms < 0 ||
	    load_ms > 30000 || load_gbps < 1) {
		fprintf(stderr,
			"usage: repair_scale --qps N[,N...] [--peers P (1-%d)] [--reps R] "
			"[--no-preload] [--load-ms MS [--load-gbps G]] [--fault down|none]\n",
			MAX_PEERS);
		return 2;
	}
	int ok = 1;
	printf("%6s %6s %9s %10s %10s %12s %10s %10s", "qps", "peers", "detect", "repair", "node0",
	       "delivered", "node0 RSS", "node0 heap");
	if (load_ms)
		printf(" %8s %9s %7s %7s %6s %9s %9s", "load", "tests", "passed", "not", "false",
		       "peers'", "asked");
	printf("\n%6s %6s %9s %10s %10s %12s %10s %10s", "", "", "ms", "ms (all)", "ms", "ms",
	       "MiB", "MiB");
	if (load_ms)
		printf(" %8s %9s %7s %7s %6s %9s %9s", "Gb/s", "per s", "", "passed", "repair",
		       "tests/s", "per s");
	printf("\n");
	for (char *t = strtok(qlist, ","); t; t = strtok(NULL, ",")) {
		int q = atoi(t);
		int p = peers ? peers : (q / 8 < 1 ? 1 : q / 8 > MAX_PEERS ? MAX_PEERS : q / 8);
		if (q < 1 || q > MAX_QPS || p > q) {
			fprintf(stderr,
				"repair_scale: --qps between 1 and %d, at least one per peer\n",
				MAX_QPS);
			return 2;
		}
		double v[16][13];
		int got = 0;
		for (int i = 0; i < reps && i < 16; i++)
			if (run_once(self, q, p, v[got]) == 0)
				got++;
			else
				ok = 0;
		if (!got) {
			printf("%6d %6d  failed\n", q, p);
			continue;
		}
		double m[13];
		for (int k = 0; k < 13; k++) {
			double col[16];
			for (int i = 0; i < got; i++)
				col[i] = v[i][k];
			qsort(col, (size_t)got, sizeof(double), cmp_d);
			m[k] = col[got / 2];
		}
		if (preload && fault_down)
			printf("%6d %6d %9.1f %10.1f %10.1f %12.1f %10.1f %10.1f", q, p, m[0], m[1],
			       m[2], m[3], m[4], m[5]);
		else
			printf("%6d %6d %9s %10s %10s %12s %10.1f %10.1f", q, p, "-", "-", "-", "-",
			       m[4], m[5]);
		/* a repair before the fault, in any run, is a false one */
		int false_repairs = 0;
		for (int i = 0; i < got; i++)
			false_repairs += (int)v[i][10];
		if (load_ms)
			printf(" %8.2f %9.1f %7.0f %7.0f %6d %9.1f %9.1f", m[6], m[7], m[8], m[9],
			       false_repairs, m[11], m[12]);
		ok = ok && !false_repairs;
		printf("\n");
		fflush(stdout);
	}
	return ok ? 0 : 1;
}
