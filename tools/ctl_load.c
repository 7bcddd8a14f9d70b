/*
 * r2cc-ctl-load: many simulated ranks against the real control plane (the
 * library's own ctl/ctl*.c: registration, directory, NIC reports and
 * lookups, authenticated requests), spread over a few processes of this
 * machine.
 *
 *   r2cc-ctl-load --ranks N [--procs P] [--per-node K] [--qps Q] [--timeout S]
 *
 * Process 0 stamps the job's id, so its control thread is the rendezvous, and
 * holds rank 0 (as NCCL's rank 0 does); process 1 holds rank 1 alone, to
 * measure what one rank costs; processes 2..P-1 share the other ranks. Every
 * rank has its own connection to the rendezvous and to its peer, as separate
 * processes would (unless the open-file limit is too low for that: then one
 * per process, and the output says so). Ranks are placed K per node; each
 * registers with no NIC (NCCL opens NICs after its first communicator), then
 * reports one NIC, looks up its peer (the same local rank on the next node)
 * by that peer's NIC address (LID for even ranks, GID for odd ones, as IB and
 * RoCE peers would), and finally every rank sends its peer at once a request
 * the size of a batched repair request for Q queue pairs and waits for the
 * answer (the repair exchange storm). Every answer and every owner found is
 * checked.
 *
 * Prints the time of each phase ("registered N ranks in S s"), the peak
 * resident memory of the rendezvous' process and of the one-rank process, and
 * the directory bytes per rank; the last line is PASS or FAIL (exit 0 / 1;
 * 2 on bad usage).
 */
#include "ctl/ctl.h"
#include "ctl/ctl_priv.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXP	     64
#define T_STORM	     300
#define STAGE_REG    1
#define STAGE_NICS   2
#define STAGE_LOOKUP 3
#define STAGE_STORM  4
#define STAGE_LEAVE  5
#define NSTAGES	     6
#define STORM_ENTRY  192 /* bytes of one queue pair in a batched repair message */
#define LOOKUP_CHUNK 512

struct proc_res {
	int status; /* 0 ok */
	int nranks;
	double t_end[NSTAGES];
	long hwm_kb;
	size_t dir_bytes; /* all its directories */
	int wrong;
	char err[160];
};

struct shared {
	unsigned char uid[R2CC_CTL_UID_SIZE];
	int uid_ready;
	int stage;
	int abort;
	double t_start[NSTAGES];
	int ready[MAXP]; /* the stage a process is ready for */
	struct proc_res res[MAXP];
};

static struct shared *sh;
static int nranks, nprocs = 4, per_node = 8, qps = 8, timeout_s = 60;
static bool per_rank_conns = true;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static long hwm_kb(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kb = -1;
	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmHWM:", 6))
			kb = strtol(line + 6, NULL, 10);
	if (f)
		fclose(f);
	return kb;
}

/* Ranks of process p: [first, first + n). */
static void ranks_of(int p, int *first, int *n)
{
	if (p < 2) {
		*first = p;
		*n = p < nranks ? 1 : 0;
		return;
	}
	int rest = nranks - 2, workers = nprocs - 2;
	int base = rest / workers, extra = rest % workers, k = p - 2;
	*first = 2 + k * base + (k < extra ? k : extra);
	*n = base + (k < extra);
}

static int peer_of(int r)
{
	return nranks > per_node ? (r + per_node) % nranks : r ^ 1;
}

static void nic_of(int r, struct r2cc_ctl_nic *n)
{
	memset(n, 0, sizeof(*n));
	snprintf(n->name, sizeof(n->name), "mlx5_%d", r % per_node);
	n->lid = (uint16_t)(r + 1);
	n->port = 1;
	n->state = 4;
	n->speed_gbps = 400;
	n->gid[0] = 0xfe;
	n->gid[1] = 0x80;
	n->gid[12] = (uint8_t)(r >> 24);
	n->gid[13] = (uint8_t)(r >> 16);
	n->gid[14] = (uint8_t)(r >> 8);
	n->gid[15] = (uint8_t)r;
}

static void fail(struct proc_res *res, const char *what, int rc)
{
	if (res->status == 0) {
		res->status = rc ? rc : -EPROTO;
		snprintf(res->err, sizeof(res->err), "%s: %s", what, strerror(rc < 0 ? -rc : rc));
	}
}

/* Waits for the parent to open stage s; false when the run was aborted. */
static bool stage_wait(int p, int s)
{
	__atomic_store_n(&sh->ready[p], s, __ATOMIC_RELEASE);
	double until = now_s() + timeout_s;
	while (__atomic_load_n(&sh->stage, __ATOMIC_ACQUIRE) < s) {
		if (__atomic_load_n(&sh->abort, __ATOMIC_ACQUIRE) || now_s() > until)
			return false;
		usleep(200);
	}
	return true;
}

/* The storm's handler: the answer names who answered and for whom. */
static void storm(void *arg, int from, const void *p, size_t len, struct r2cc_ctl_call *call)
{
	static unsigned char out[8 + 64 * STORM_ENTRY];
	size_t n = len < sizeof(out) ? len : sizeof(out);
	memcpy(out, p, n);
	if (n >= 8) {
		out[0] = (unsigned char)(call->to_rank >> 8);
		out[1] = (unsigned char)call->to_rank;
		out[2] = (unsigned char)(from >> 8);
		out[3] = (unsigned char)from;
	}
	r2cc_ctl_reply(call, 0, out, n);
}

static int child(int p)
{
	struct proc_res *res = &sh->res[p];
	int first, n;
	ranks_of(p, &first, &n);
	res->nranks = n;
	r2cc_ctl_set_conn_per_rank(per_rank_conns);
	/* Every emulated node connects from 127.0.0.1: the cap on connections
	 * of one host that have not authenticated yet would count all of them
	 * as one host's. The cap over all sources stays. */
	r2cc_ctl_set_preauth_per_src(1 << 30);
	r2cc_ctl_set_handler(T_STORM, storm, NULL);
	if (p == 0) {
		memset(sh->uid, 0x5a, sizeof(sh->uid));
		int rc = r2cc_ctl_uid_stamp(sh->uid);
		if (rc) {
			fail(res, "stamp", rc);
			__atomic_store_n(&sh->abort, 1, __ATOMIC_RELEASE);
			return 1;
		}
		__atomic_store_n(&sh->uid_ready, 1, __ATOMIC_RELEASE);
	}
	struct r2cc_ctl_job job;
	while (!__atomic_load_n(&sh->uid_ready, __ATOMIC_ACQUIRE))
		usleep(500);
	if (!r2cc_ctl_uid_parse(sh->uid, &job)) {
		fail(res, "parse", -EPROTO);
		return 1;
	}
	int *ranks = malloc(sizeof(int) * (size_t)(n ? n : 1));
	struct r2cc_ctl_dir **dirs = calloc((size_t)(n ? n : 1), sizeof(*dirs));
	struct r2cc_ctl_batch_req *req = calloc((size_t)(n ? n : 1), sizeof(*req));
	size_t msg = 8 + (size_t)qps * STORM_ENTRY;
	unsigned char *out = calloc((size_t)(n ? n : 1), msg),
		      *in = calloc((size_t)(n ? n : 1), msg);
	if (!ranks || !dirs || !req || !out || !in) {
		fail(res, "memory", -ENOMEM);
		return 1;
	}
	for (int i = 0; i < n; i++)
		ranks[i] = first + i;

	/* Registration: every rank of this process at once, each with its node's
	 * key (a process here may hold ranks of several nodes). */
	struct r2cc_ctl_member *self = calloc((size_t)(n ? n : 1), sizeof(*self));
	if (!self) {
		fail(res, "memory", -ENOMEM);
		return 1;
	}
	for (int i = 0; i < n; i++) {
		snprintf(self[i].host, sizeof(self[i].host), "sim%d", ranks[i] / per_node);
		snprintf(self[i].node_key, sizeof(self[i].node_key), "node%d", ranks[i] / per_node);
		self[i].pid = getpid();
	}
	int rc = 0;
	if (!stage_wait(p, STAGE_REG))
		return 1;
	rc = r2cc_ctl_register_each(&job, self, ranks, n, nranks, timeout_s * 1000, dirs);
	res->t_end[STAGE_REG] = now_s();
	if (rc) {
		fail(res, "register", rc);
		return 1;
	}
	for (int i = 0; i < n; i++)
		if (dirs[i]->nranks != nranks ||
		    dirs[i]->nnodes != (nranks + per_node - 1) / per_node ||
		    r2cc_ctl_dir_node(dirs[i], ranks[i]) != ranks[i] / per_node ||
		    memcmp(dirs[i]->digest, dirs[0]->digest, 32))
			res->wrong++;

	/* Each rank reports the NIC it uses. */
	if (!stage_wait(p, STAGE_NICS))
		return 1;
	for (int i = 0; i < n && rc == 0; i++) {
		struct r2cc_ctl_nic nic;
		nic_of(ranks[i], &nic);
		rc = r2cc_ctl_dir_report_nics(dirs[i], &nic, 1, timeout_s * 1000);
	}
	res->t_end[STAGE_NICS] = now_s();
	if (rc) {
		fail(res, "report NICs", rc);
		return 1;
	}

	/* Each rank finds its peer by the peer's NIC address: exactly one owner,
	 * the peer. */
	if (!stage_wait(p, STAGE_LOOKUP))
		return 1;
	for (int i = 0; i < n && rc == 0; i++) {
		int peer = peer_of(ranks[i]), owners[4], nowners = 0;
		struct r2cc_ctl_nic nic;
		struct r2cc_ctl_nicaddr a;
		nic_of(peer, &nic);
		r2cc_ctl_nicaddr_of(&nic, peer % 2 == 1, &a);
		rc = r2cc_ctl_dir_owners(dirs[i], &a, 1, owners, 4, &nowners, timeout_s * 1000);
		if (rc == 0 &&
		    (nowners != 1 || owners[0] != peer || !r2cc_ctl_dir_member(dirs[i], peer)))
			res->wrong++;
	}
	res->t_end[STAGE_LOOKUP] = now_s();
	if (rc) {
		fail(res, "look up peers", rc);
		return 1;
	}

	/* The storm: every rank asks its peer at once. */
	if (!stage_wait(p, STAGE_STORM))
		return 1;
	for (int i = 0; i < n; i++) {
		unsigned char *o = out + (size_t)i * msg;
		for (size_t b = 8; b < msg; b++)
			o[b] = (unsigned char)(ranks[i] + b);
		req[i] = (struct r2cc_ctl_batch_req){.dir = dirs[i],
						     .rank = peer_of(ranks[i]),
						     .payload = o,
						     .len = msg,
						     .reply = in + (size_t)i * msg,
						     .reply_len = msg};
	}
	rc = r2cc_ctl_request_batch(req, n, T_STORM, timeout_s * 1000);
	res->t_end[STAGE_STORM] = now_s();
	if (rc) {
		fail(res, "storm", rc);
		return 1;
	}
	for (int i = 0; i < n; i++) {
		const unsigned char *a = in + (size_t)i * msg;
		int peer = peer_of(ranks[i]);
		if (req[i].reply_len != msg || ((a[0] << 8) | a[1]) != (peer & 0xffff) ||
		    ((a[2] << 8) | a[3]) != (ranks[i] & 0xffff) ||
		    memcmp(a + 8, out + (size_t)i * msg + 8, msg - 8))
			res->wrong++;
	}

	for (int i = 0; i < n; i++)
		res->dir_bytes += r2cc_ctl_dir_bytes(dirs[i]);
	if (!stage_wait(p, STAGE_LEAVE))
		return 1;
	for (int i = 0; i < n; i++)
		r2cc_ctl_dir_leave(dirs[i]);
	usleep(100000); /* the leaves go out before the control thread stops */
	res->t_end[STAGE_LEAVE] = now_s();
	res->hwm_kb = hwm_kb();
	for (int i = 0; i < n; i++)
		r2cc_ctl_dir_free(dirs[i]);
	r2cc_ctl_shutdown();
	return res->wrong ? 1 : 0;
}

/* Every process ready for stage s (or one failed): open it. */
static bool open_stage(int s)
{
	double until = now_s() + timeout_s + 5;
	for (;;) {
		int ready = 0;
		for (int p = 0; p < nprocs; p++) {
			ready += __atomic_load_n(&sh->ready[p], __ATOMIC_ACQUIRE) >= s;
			if (sh->res[p].status)
				return false;
		}
		if (ready == nprocs)
			break;
		if (now_s() > until)
			return false;
		usleep(200);
	}
	sh->t_start[s] = now_s();
	__atomic_store_n(&sh->stage, s, __ATOMIC_RELEASE);
	return true;
}

static double stage_time(int s)
{
	double end = 0;
	for (int p = 0; p < nprocs; p++)
		if (sh->res[p].t_end[s] > end)
			end = sh->res[p].t_end[s];
	return end - sh->t_start[s];
}

static void usage(void)
{
	fprintf(stderr,
		"usage: r2cc-ctl-load --ranks N [--procs P (3-%d)] [--per-node K] "
		"[--qps Q] [--timeout S]\n",
		MAXP);
	exit(2);
}

/* One connection per rank needs about three descriptors per rank in the
 * fullest process; raise the soft limit as far as the hard one allows. */
static void plan_descriptors(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl))
		return;
	int first, n;
	ranks_of(2, &first, &n);
	rlim_t need = (rlim_t)(nranks > 3 * n ? nranks : 3 * n) + 256;
	if (rl.rlim_cur < need) {
		rl.rlim_cur = rl.rlim_max < need ? rl.rlim_max : need;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	if (rl.rlim_cur < need)
		per_rank_conns = false;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"ranks", required_argument, NULL, 'n'},	{"procs", required_argument, NULL, 'p'},
	    {"per-node", required_argument, NULL, 'k'}, {"qps", required_argument, NULL, 'q'},
	    {"timeout", required_argument, NULL, 't'},	{NULL, 0, NULL, 0}};
	int c;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'n':
			nranks = atoi(optarg);
			break;
		case 'p':
			nprocs = atoi(optarg);
			break;
		case 'k':
			per_node = atoi(optarg);
			break;
		case 'q':
			qps = atoi(optarg);
			break;
		case 't':
			timeout_s = atoi(optarg);
			break;
		default:
			usage();
		}
	}
	if (optind != argc || nranks < 4 || nranks > 65535 || nprocs < 3 || nprocs > MAXP ||
	    nprocs > nranks || per_node < 2 || qps < 1 || qps > 64 || timeout_s < 1)
		usage();
	setenv("NCCL_SOCKET_IFNAME", "lo", 0);
	unsetenv("R2CC_OOB_ROOT");
	if (!getenv("R2CC_DEBUG"))
		setenv("R2CC_DEBUG", "WARN", 1);
	plan_descriptors();
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	memset(sh, 0, sizeof(*sh));
	printf("r2cc-ctl-load: %d ranks (%d per node, %d nodes) in %d processes (process 0: the "
	       "rendezvous and rank 0; process 1: rank 1 alone), %s\n",
	       nranks, per_node, (nranks + per_node - 1) / per_node, nprocs,
	       per_rank_conns ? "one connection per rank"
			      : "one connection per process (the open-file limit allows no more)");
	fflush(stdout);
	pid_t pids[MAXP];
	for (int p = 0; p < nprocs; p++) {
		pids[p] = fork();
		if (pids[p] == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			_exit(child(p));
		}
		if (pids[p] < 0) {
			perror("fork");
			return 1;
		}
	}
	static const char *const names[NSTAGES] = {"",	      "register", "report NICs",
						   "look up", "storm",	  "leave"};
	bool ok = true;
	for (int s = STAGE_REG; s < NSTAGES && ok; s++)
		ok = open_stage(s);
	if (!ok)
		__atomic_store_n(&sh->abort, 1, __ATOMIC_RELEASE);
	int wrong = 0;
	for (int p = 0; p < nprocs; p++) {
		int st;
		if (waitpid(pids[p], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
			ok = false;
		wrong += sh->res[p].wrong;
		if (sh->res[p].status)
			printf("process %d (%d ranks): %s\n", p, sh->res[p].nranks, sh->res[p].err);
	}
	if (ok || sh->stage > STAGE_REG) {
		printf("registered %d ranks in %.3f s\n", nranks, stage_time(STAGE_REG));
		if (sh->stage >= STAGE_LOOKUP)
			printf("reported %d ranks' NICs in %.3f s\n", nranks,
			       stage_time(STAGE_NICS));
		if (sh->stage >= STAGE_STORM)
			printf("looked up %d peers by NIC address (LID or GID) in %.3f s\n", nranks,
			       stage_time(STAGE_LOOKUP));
		if (sh->stage >= STAGE_LEAVE)
			printf("repair exchange storm: %d requests of %d B (%d queue pairs each), "
			       "every rank to its peer at once, all answered in %.3f s\n",
			       nranks, 8 + qps * STORM_ENTRY, qps, stage_time(STAGE_STORM));
	} else {
		printf("stopped before %s\n", names[sh->stage + 1 < NSTAGES ? sh->stage + 1 : 1]);
	}
	if (ok) {
		size_t dir_total = 0;
		for (int p = 0; p < nprocs; p++)
			dir_total += sh->res[p].dir_bytes;
		printf("peak resident memory: rendezvous process (and rank 0) %.1f MiB, one rank "
		       "%.1f MiB; directory %.0f B per rank (rank 1: %zu B)\n",
		       sh->res[0].hwm_kb / 1024.0, sh->res[1].hwm_kb / 1024.0,
		       (double)dir_total / nranks, sh->res[1].dir_bytes);
	}
	if (wrong)
		printf("%d wrong answers (directories, owners or storm replies)\n", wrong);
	printf("%s\n", ok && !wrong ? "PASS" : "FAIL");
	return ok && !wrong ? 0 : 1;
}
