/*
 * End-to-end test of the MR mirror over the software RDMA device, run by
 * tests/mirror/run.sh under LD_PRELOAD of the test copy of libr2cc.so
 * (libr2cc-door.so: the library plus the r2cc_test_* door).
 *
 *   mirror_e2e --dir DIR --rank 0|1 --nccl LIBNCCL   two processes, one job
 *   mirror_e2e --expect-none                         R2CC_MR_MIRROR=0
 *
 * Both ranks load libibverbs as NCCL does (dlopen + dlvsym, so R2CC's hook
 * sees every call), form a job through the NCCL test double (R2CC's wrappers
 * stamp the id and register the communicator) and join it through the door.
 * Rank 0 registers a buffer on mlx5_0; rank 1 registers its source on
 * mlx5_0, translates its lkey to mlx5_1 and rank 0's rkey to mlx5_1 over the
 * control plane, and RDMA-WRITEs through a QP on mlx5_1 (in R2CC's PD there)
 * into rank 0's buffer, which rank 0 checks byte for byte. Rank 0 then
 * deregisters: its mirrors go, and a write with the stale translated rkey
 * must end in a remote access error. Along the way: the cache (one fetch,
 * then hits), unknown keys and NICs, a malformed and a forged request (both
 * dropped by rank 0, which keeps serving). Last line PASS or FAIL.
 */
#include "tools/drill/drill.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NICS	 3
#define BUF_LEN	 (1u << 20)
#define WAIT_MS	 20000
#define CTL_MS	 5000
#define HOME	 "mlx5_0"
#define BACKUP	 "mlx5_1"
#define ACC_DATA (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

/* The door (found in the preloaded library). */
static int (*t_join)(const unsigned char *, int, int, int);
static int (*t_lkey)(const char *, uint32_t, const char *, uint32_t *);
static int (*t_local_rkey)(const char *, uint32_t, const char *, uint32_t *);
static int (*t_remote_rkey)(int, const char *, uint32_t, uint64_t, uint64_t, const char *,
			    uint32_t *, int);
static int (*t_refresh)(int, const char *, const char *, int);
static struct ibv_pd *(*t_pd)(const char *);
static void (*t_stats)(uint64_t *);
static int (*t_raw)(int, const void *, size_t, int);
static int (*t_forged)(int);

enum { S_GROUPS, S_MIRRORS, S_FAIL, S_SERVED, S_BAD, S_FETCHES, S_HITS, S_GEN, S_BADTAG };

static int failures;
static int rank = -1;
static const char *dir;

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			failures++;                                                                \
			printf("rank %d: CHECK FAILED line %d: ", rank, __LINE__);                 \
			printf(__VA_ARGS__);                                                       \
			printf("\n");                                                              \
			fflush(stdout);                                                            \
		}                                                                                  \
	} while (0)

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("rank %d: ", rank);
	vprintf(fmt, ap);
	printf("\nFAIL\n");
	va_end(ap);
	exit(1);
}

static uint64_t stat_of(int i)
{
	uint64_t s[10];
	t_stats(s);
	return s[i];
}

/* --- files between the two processes --------------------------------------- */

static void put(const char *name, const void *data, size_t len)
{
	char tmp[512], path[512];
	snprintf(tmp, sizeof(tmp), "%s/%s.tmp%d", dir, name, rank);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(tmp, "wb");
	if (!f || fwrite(data, 1, len, f) != len || fclose(f) || rename(tmp, path))
		die("cannot write %s", path);
}

static void get(const char *name, void *data, size_t len)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	for (int ms = 0; ms < WAIT_MS; ms++) {
		FILE *f = fopen(path, "rb");
		if (f) {
			size_t n = fread(data, 1, len, f);
			fclose(f);
			if (n == len)
				return;
			die("%s is short", path);
		}
		if (access(dir, F_OK))
			die("%s is gone", dir);
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	die("timed out waiting for %s", path);
}

/* --- verbs ------------------------------------------------------------------ */

struct dev {
	const char *name;
	struct ibv_context *ctx;
	struct ibv_pd *pd; /* "NCCL's" */
	uint16_t lid;
};
static struct dev devs[NICS];

static void open_devs(void)
{
	char err[256];
	if (drill_ibv_load(err, sizeof(err)))
		die("%s", err);
	int n = 0;
	struct ibv_device **list = drill_ibv.get_device_list(&n);
	if (!list || n < NICS)
		die("need %d soft NICs, found %d", NICS, n);
	for (int i = 0; i < NICS; i++) {
		struct dev *d = &devs[i];
		d->ctx = drill_ibv.open_device(list[i]);
		if (!d->ctx)
			die("open_device %d failed", i);
		d->name = drill_ibv.get_device_name(list[i]);
		struct ibv_port_attr pa;
		memset(&pa, 0, sizeof(pa));
		if (drill_ibv.query_port(d->ctx, 1, &pa))
			die("query_port %s failed", d->name);
		d->lid = pa.lid;
		d->pd = drill_ibv.alloc_pd(d->ctx);
		if (!d->pd)
			die("alloc_pd %s failed", d->name);
	}
	if (strcmp(devs[0].name, HOME) || strcmp(devs[1].name, BACKUP))
		die("expected NICs %s and %s, got %s and %s", HOME, BACKUP, devs[0].name,
		    devs[1].name);
}

static void *find(const char *name)
{
	void *f = dlsym(RTLD_DEFAULT, name);
	if (!f)
		die("%s not found: run under LD_PRELOAD=libr2cc-door.so", name);
	return f;
}

static void load_door(void)
{
	*(void **)&t_join = find("r2cc_test_join");
	*(void **)&t_lkey = find("r2cc_test_lkey");
	*(void **)&t_local_rkey = find("r2cc_test_local_rkey");
	*(void **)&t_remote_rkey = find("r2cc_test_remote_rkey");
	*(void **)&t_refresh = find("r2cc_test_refresh");
	*(void **)&t_pd = find("r2cc_test_pd");
	*(void **)&t_stats = find("r2cc_test_stats");
	*(void **)&t_raw = find("r2cc_test_raw");
	*(void **)&t_forged = find("r2cc_test_forged");
}

struct ep {
	uint32_t qpn, rkey;
	uint16_t lid;
	uint64_t addr;
};

struct conn {
	struct ibv_cq *cq;
	struct ibv_qp *qp;
};

/* A QP on `d` in R2CC's PD there, as hot repair will create it. */
static struct conn make_qp(struct dev *d)
{
	struct conn c;
	struct ibv_pd *pd = t_pd(d->name);
	if (!pd)
		die("no R2CC PD on %s", d->name);
	CHECK(pd != d->pd, "R2CC's PD is the application's");
	c.cq = drill_ibv.create_cq(d->ctx, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = {
	    .send_cq = c.cq,
	    .recv_cq = c.cq,
	    .cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1},
	    .qp_type = IBV_QPT_RC};
	c.qp = c.cq ? drill_ibv.create_qp(pd, &ia) : NULL;
	if (!c.qp)
		die("create_qp on %s failed", d->name);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
				.port_num = 1,
				.qp_access_flags =
				    IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ};
	if (drill_ibv.modify_qp(
		c.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("modify_qp INIT failed");
	return c;
}

static void connect_qp(struct conn *c, const struct ep *peer)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR,
				.path_mtu = IBV_MTU_4096,
				.dest_qp_num = peer->qpn,
				.max_dest_rd_atomic = 1,
				.min_rnr_timer = 12,
				.ah_attr = {.dlid = peer->lid, .port_num = 1}};
	if (drill_ibv.modify_qp(c->qp, &a,
				IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				    IBV_QP_MIN_RNR_TIMER))
		die("modify_qp RTR failed");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	if (drill_ibv.modify_qp(c->qp, &a,
				IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		die("modify_qp RTS failed");
}

/* One signalled RDMA WRITE; returns the completion's status. */
static int write_once(struct conn *c, void *src, uint32_t lkey, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = {(uintptr_t)src, BUF_LEN, lkey};
	struct ibv_send_wr wr = {.wr_id = 7,
				 .sg_list = &sge,
				 .num_sge = 1,
				 .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED,
				 .wr = {.rdma = {raddr, rkey}}};
	struct ibv_send_wr *bad;
	if (c->qp->context->ops.post_send(c->qp, &wr, &bad))
		die("post_send failed");
	struct ibv_wc wc;
	for (int spins = 0; spins < WAIT_MS * 100; spins++) {
		int n = c->cq->context->ops.poll_cq(c->cq, 1, &wc);
		if (n < 0)
			die("poll_cq failed");
		if (n == 1)
			return wc.status;
		struct timespec ts = {0, 10000};
		nanosleep(&ts, NULL);
	}
	die("no completion");
	return -1;
}

static unsigned char pattern(size_t i)
{
	return (unsigned char)(i * 131 + (i >> 8) * 7 + 1);
}

/* --- the job ------------------------------------------------------------------ */

/* ncclUniqueId travels by value: a 128-byte struct. */
struct uid128 {
	unsigned char b[128];
};

static void form_job(const char *nccl)
{
	struct uid128 id;
	void *comm;
	if (!dlopen(nccl, RTLD_NOW | RTLD_GLOBAL))
		die("cannot dlopen %s: %s", nccl, dlerror());
	int (*get_uid)(struct uid128 *);
	int (*init)(void **, int, struct uid128, int);
	*(void **)&get_uid = find("ncclGetUniqueId");
	*(void **)&init = find("ncclCommInitRank");
	if (rank == 0) {
		if (get_uid(&id))
			die("ncclGetUniqueId failed");
		put("uid", id.b, sizeof(id.b));
	}
	get("uid", id.b, sizeof(id.b));
	if (init(&comm, 2, id, rank))
		die("ncclCommInitRank failed");
	int rc = t_join(id.b, rank, 2, WAIT_MS);
	if (rc)
		die("joining the job through the door failed: %s", strerror(-rc));
}

static void rank0(void)
{
	unsigned char *buf = aligned_alloc(4096, BUF_LEN);
	memset(buf, 0, BUF_LEN);
	struct ibv_mr *mr = drill_ibv.reg_mr(devs[0].pd, buf, BUF_LEN, ACC_DATA);
	if (!mr)
		die("reg_mr failed");
	CHECK(stat_of(S_GROUPS) == 1 && stat_of(S_MIRRORS) == NICS - 1,
	      "expected 1 registration mirrored on %d NICs, stats say %llu / %llu", NICS - 1,
	      (unsigned long long)stat_of(S_GROUPS), (unsigned long long)stat_of(S_MIRRORS));
	uint32_t r1 = 0, back = 0;
	CHECK(t_local_rkey(HOME, mr->rkey, BACKUP, &r1) == 0 && r1 != mr->rkey,
	      "no mirror rkey on %s", BACKUP);
	CHECK(t_local_rkey(BACKUP, r1, HOME, &back) == 0 && back == mr->rkey,
	      "mirror rkey does not translate back");

	struct conn c = make_qp(&devs[1]);
	struct ep me = {c.qp->qp_num, mr->rkey, devs[1].lid, (uintptr_t)buf}, peer;
	put("ep0", &me, sizeof(me));
	get("ep1", &peer, sizeof(peer));
	connect_qp(&c, &peer);
	put("ready0", "", 0);

	char ok;
	get("wrote1", &ok, 1);
	size_t bad = 0, first = 0;
	for (size_t i = 0; i < BUF_LEN; i++)
		if (buf[i] != pattern(i) && !bad++)
			first = i;
	CHECK(bad == 0, "%zu bytes wrong through the mirror, first at %zu", bad, first);
	put("verified0", "", 0);

	uint64_t gen = stat_of(S_GEN);
	CHECK(drill_ibv.dereg_mr(mr) == 0, "dereg_mr failed");
	CHECK(stat_of(S_GROUPS) == 0 && stat_of(S_MIRRORS) == 0, "mirrors left after dereg");
	CHECK(stat_of(S_GEN) > gen, "generation did not move on dereg");
	CHECK(t_local_rkey(HOME, me.rkey, BACKUP, &r1) == -ENOENT, "stale translation served");
	put("dereg0", "", 0);

	get("done1", &ok, 0);
	CHECK(stat_of(S_SERVED) >= 3, "served %llu map requests, expected >= 3",
	      (unsigned long long)stat_of(S_SERVED));
	CHECK(stat_of(S_BAD) >= 1, "the malformed request was not counted");
	CHECK(stat_of(S_BADTAG) >= 1, "the forged request was not dropped as bad_tag");
	bad = 0;
	for (size_t i = 0; i < BUF_LEN; i++)
		bad += buf[i] != pattern(i);
	CHECK(bad == 0, "the write with the stale rkey changed %zu bytes", bad);
}

static void rank1(void)
{
	unsigned char *src = aligned_alloc(4096, BUF_LEN);
	for (size_t i = 0; i < BUF_LEN; i++)
		src[i] = pattern(i);
	struct ibv_mr *mr = drill_ibv.reg_mr(devs[0].pd, src, BUF_LEN, ACC_DATA);
	if (!mr)
		die("reg_mr failed");
	uint32_t l1 = 0, x;
	CHECK(t_lkey(HOME, mr->lkey, BACKUP, &l1) == 0 && l1 != mr->lkey, "no mirror lkey on %s",
	      BACKUP);
	CHECK(t_lkey(HOME, mr->lkey, HOME, &x) == 0 && x == mr->lkey, "same-NIC translation");
	CHECK(t_lkey(HOME, mr->lkey ^ 0x5a5a00, BACKUP, &x) == -ENOENT, "unknown lkey translated");

	struct ep peer;
	get("ep0", &peer, sizeof(peer));
	uint32_t r1 = 0, again = 0;
	int rc = t_remote_rkey(0, HOME, peer.rkey, peer.addr, 1, BACKUP, &r1, CTL_MS);
	CHECK(rc == 0 && r1 != peer.rkey, "remote rkey translation: %s", strerror(-rc));
	uint64_t fetches = stat_of(S_FETCHES);
	CHECK(fetches == 1, "%llu fetches for one translation", (unsigned long long)fetches);
	CHECK(t_remote_rkey(0, HOME, peer.rkey, peer.addr, 1, BACKUP, &again, CTL_MS) == 0 &&
		  again == r1,
	      "second translation differs");
	CHECK(stat_of(S_FETCHES) == fetches && stat_of(S_HITS) == 1,
	      "second translation not cached");
	CHECK(t_remote_rkey(0, HOME, peer.rkey ^ 0x5a5a00, peer.addr, 1, BACKUP, &x, CTL_MS) ==
		  -ENOENT,
	      "unknown remote rkey translated");
	CHECK(t_remote_rkey(0, HOME, peer.rkey, peer.addr, 1, "mlx9_9", &x, CTL_MS) == -ENODEV,
	      "unknown remote NIC not reported");

	/* Malformed (authenticated) and forged (unauthenticated) requests. */
	static const unsigned char junk[] = {1, 1, 0, 0, 200, 'x'};
	CHECK(t_raw(0, junk, sizeof(junk), CTL_MS) == -EPROTO, "malformed request not refused");
	CHECK(t_raw(0, junk, 0, CTL_MS) == -EPROTO, "empty request not refused");
	CHECK(t_forged(0) == 0, "could not send the forged request");
	CHECK(t_refresh(0, HOME, BACKUP, CTL_MS) == 0, "the service stopped answering");

	struct conn c = make_qp(&devs[1]);
	struct ep me = {c.qp->qp_num, 0, devs[1].lid, 0};
	put("ep1", &me, sizeof(me));
	char ok;
	get("ready0", &ok, 0);
	connect_qp(&c, &peer);
	int st = write_once(&c, src, l1, peer.addr, r1);
	CHECK(st == IBV_WC_SUCCESS, "write through the mirror: %s", drill_wc_status_str(st));
	put("wrote1", "", 1);
	get("verified0", &ok, 0);

	get("dereg0", &ok, 0);
	CHECK(t_refresh(0, HOME, BACKUP, CTL_MS) == 0, "refresh after the peer's dereg failed");
	CHECK(t_remote_rkey(0, HOME, peer.rkey, peer.addr, 1, BACKUP, &x, CTL_MS) == -ENOENT,
	      "the peer's deregistered rkey is still translated after a refresh");
	memset(src, 0xee, BUF_LEN);
	st = write_once(&c, src, l1, peer.addr, r1);
	CHECK(st == IBV_WC_REM_ACCESS_ERR, "write with the stale rkey: %s, expected %s",
	      drill_wc_status_str(st), drill_wc_status_str(IBV_WC_REM_ACCESS_ERR));
	put("done1", "", 0);
}

/* R2CC_MR_MIRROR=0: nothing extra registered, nothing translated. */
static void expect_none(void)
{
	unsigned char *buf = aligned_alloc(4096, BUF_LEN);
	struct ibv_mr *mr = drill_ibv.reg_mr(devs[0].pd, buf, BUF_LEN, ACC_DATA);
	uint32_t x;
	if (!mr)
		die("reg_mr failed");
	CHECK(stat_of(S_GROUPS) == 0 && stat_of(S_MIRRORS) == 0, "mirrored with R2CC_MR_MIRROR=0");
	CHECK(t_pd(BACKUP) == NULL, "R2CC allocated a PD with R2CC_MR_MIRROR=0");
	CHECK(t_lkey(HOME, mr->lkey, BACKUP, &x) == -ENOENT, "translated with R2CC_MR_MIRROR=0");
	CHECK(drill_ibv.dereg_mr(mr) == 0, "dereg_mr failed");
}

int main(int argc, char **argv)
{
	const char *nccl = NULL;
	bool none = false;
	static const struct option opts[] = {{"dir", required_argument, NULL, 'd'},
					     {"rank", required_argument, NULL, 'r'},
					     {"nccl", required_argument, NULL, 'n'},
					     {"expect-none", no_argument, NULL, 'z'},
					     {NULL, 0, NULL, 0}};
	for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
		if (o == 'd')
			dir = optarg;
		else if (o == 'r')
			rank = atoi(optarg);
		else if (o == 'n')
			nccl = optarg;
		else if (o == 'z')
			none = true;
		else
			return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	load_door();
	if (none) {
		rank = 0;
		open_devs();
		expect_none();
	} else {
		if (!dir || !nccl || (rank != 0 && rank != 1))
			die("usage: mirror_e2e --dir DIR --rank 0|1 --nccl LIBNCCL | "
			    "--expect-none");
		form_job(nccl);
		open_devs();
		if (rank == 0)
			rank0();
		else
			rank1();
	}
	printf("rank %d: %s\n", rank, failures ? "FAIL" : "PASS");
	return failures ? 1 : 0;
}
