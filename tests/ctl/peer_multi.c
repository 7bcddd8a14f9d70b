/*
 * A repair request reaches exactly the right process: N processes, two per
 * emulated node, each node with two NICs shared by its two processes, every
 * process connected on both NICs to every process of the other nodes, with
 * QPC queue pairs per connection on each (more ends per peer than the job has
 * ranks, as NCCL's channels give). QP
 * numbers collide on purpose (see end_of()): every device hands out the same
 * numbers, even the same pairs of numbers, so only the port (LID, or GID on
 * RoCE, where every LID is 0) and the QP number together name an end. Usage:
 * peer_multi N ib|roce (N even, 4-32)
 *
 * Each process registers its rank with the real control plane, tracks its
 * connections with repair/peer.c at staggered moments (as NCCL's two sides
 * reach RTS at different times), waits until every peer is found and checks
 * it is the right rank; then sends, for each connection, a request to the
 * peer it found, naming both ends. The receiver must find the connection with
 * exactly those ends among its own and check that the sender is the rank at
 * the other end. Every process must get exactly one such request per
 * connection and no wrong one. Exit 0 = pass.
 */
#include "ctl/ctl.h"
#include "ctl/ctl_priv.h"
#include "repair/peer.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/common/util.h"

#define MAXP	  32
#define NICS	  2
#define QPC	  3 /* QPs per connection on each NIC (NCCL_IB_QPS_PER_CONNECTION) */
#define QPN_BASE  0x400
#define T_REQ	  210
#define TIMEOUT_S 20

struct res {
	int status;
	int found, wrong_peer, missing_members;
	int got_good, got_bad;
	int expected;
	char err[128];
};

struct shared {
	unsigned char uid[R2CC_CTL_UID_SIZE];
	int uid_ready;
	int resolved; /* processes whose peers are all found */
	int sent;     /* processes that sent their requests */
	struct res res[MAXP];
};

static struct shared *sh;
static int nproc;
static bool roce;

static int node_of(int p)
{
	return p / 2;
}

static int slot_of(int p)
{
	return p % 2;
}

/*
 * p's end of its connection to q on NIC k of p's node, QP j of it. The number is unique on
 * its device (for one p and k, q's slot and node tell it apart) and repeats
 * everywhere else, down to the pair: p's connection on NIC 0 to the process q
 * of node n + 1 and its connection on NIC 1 to the process of node n in q's
 * slot have the same local and the same remote QP number. Only the NIC address
 * tells those two apart.
 */
static void end_of(int p, int q, int k, int j, struct r2cc_peer_ep *ep)
{
	memset(ep, 0, sizeof(*ep));
	ep->qpn = (uint32_t)(QPN_BASE + j * 128 + slot_of(p) * 64 + slot_of(q) * 32 +
			     (node_of(p) + node_of(q) + k) % 32);
	if (roce) {
		ep->global = 1;
		ep->gid[0] = 0xfe;
		ep->gid[1] = 0x80;
		ep->gid[14] = (uint8_t)node_of(p);
		ep->gid[15] = (uint8_t)(k + 1);
	} else {
		ep->lid = (uint16_t)(1 + node_of(p) * NICS + k);
	}
}

static void nic_of(int p, int k, struct r2cc_ctl_nic *nic)
{
	struct r2cc_peer_ep ep;
	end_of(p, 0, k, 0, &ep);
	memset(nic, 0, sizeof(*nic));
	snprintf(nic->name, sizeof(nic->name), "mlx5_%d", k);
	nic->lid = ep.lid;
	memcpy(nic->gid, ep.gid, 16);
	nic->port = 1;
	nic->state = 4;
}

static int self;

/* The request: both ends, as the sender names them. Cookies are the rank of
 * the other end + 1. */
static void on_req(void *arg, int from, const void *p, size_t len, struct r2cc_ctl_call *call)
{
	struct res *r = &sh->res[self];
	struct r2cc_peer_ep src, dst;
	if (len != 2 * R2CC_PEER_EP_WIRE) {
		__atomic_fetch_add(&r->got_bad, 1, __ATOMIC_RELAXED);
		return;
	}
	r2cc_peer_ep_get(p, &src);
	r2cc_peer_ep_get((const uint8_t *)p + R2CC_PEER_EP_WIRE, &dst);
	void *cookie = r2cc_peer_find(&dst, &src);
	if (cookie && (intptr_t)cookie == from + 1 && call->to_rank == self)
		__atomic_fetch_add(&r->got_good, 1, __ATOMIC_RELAXED);
	else
		__atomic_fetch_add(&r->got_bad, 1, __ATOMIC_RELAXED);
}

static int child(int p)
{
	struct res *r = &sh->res[p];
	self = p;
	r2cc_ctl_set_handler(T_REQ, on_req, NULL);
	if (p == 0) {
		memset(sh->uid, 0x5a, sizeof(sh->uid));
		if (r2cc_ctl_uid_stamp(sh->uid))
			return 1;
		__atomic_store_n(&sh->uid_ready, 1, __ATOMIC_RELEASE);
	}
	while (!__atomic_load_n(&sh->uid_ready, __ATOMIC_ACQUIRE))
		usleep(500);
	struct r2cc_ctl_job job;
	struct r2cc_ctl_member m;
	struct r2cc_ctl_dir *dir = NULL;
	if (!r2cc_ctl_uid_parse(sh->uid, &job))
		return 1;
	memset(&m, 0, sizeof(m));
	snprintf(m.host, sizeof(m.host), "host%d", node_of(p));
	snprintf(m.node_key, sizeof(m.node_key), "node%d", node_of(p));
	m.pid = getpid();
	int rc = r2cc_ctl_register(&job, &m, p, nproc, TIMEOUT_S * 1000, &dir);
	if (rc) {
		snprintf(r->err, sizeof(r->err), "register: %s", strerror(-rc));
		return 1;
	}
	r2cc_peer_add_dir(dir);
	/* Connections in an order of this process's own, at its own moment. */
	usleep((useconds_t)(p % 5) * 20000);
	for (int i = 0; i < nproc; i++) {
		int q = (p + 1 + i) % nproc;
		if (node_of(q) == node_of(p))
			continue;
		for (int k = 0; k < NICS * QPC; k++) {
			struct r2cc_peer_ep local, remote;
			struct r2cc_ctl_nic nic;
			end_of(p, q, k % NICS, k / NICS, &local);
			end_of(q, p, k % NICS, k / NICS, &remote);
			nic_of(p, k % NICS, &nic);
			rc = r2cc_peer_track(&local, &remote, &nic, (void *)(intptr_t)(q + 1));
			if (rc) {
				snprintf(r->err, sizeof(r->err), "track: %s", strerror(-rc));
				return 1;
			}
			r->expected++;
		}
	}
	/* Every peer found, and the right one. */
	double until = now_s() + TIMEOUT_S;
	for (;;) {
		int found = 0, wrong = 0;
		for (int q = 0; q < nproc; q++) {
			if (node_of(q) == node_of(p))
				continue;
			for (int k = 0; k < NICS * QPC; k++) {
				struct r2cc_peer_ep local;
				const struct r2cc_ctl_dir *d;
				int rank;
				end_of(p, q, k % NICS, k / NICS, &local);
				if (r2cc_peer_of(&local, &d, &rank) == 0) {
					found++;
					wrong += d != dir || rank != q;
				}
			}
		}
		r->found = found;
		r->wrong_peer = wrong;
		if (found == r->expected || now_s() > until)
			break;
		usleep(2000);
	}
	/* The members of every peer come too (a repair then needs nothing from the
	 * rendezvous), also of peers that found this process first. */
	for (;;) {
		int missing = 0;
		for (int q = 0; q < nproc; q++)
			missing += node_of(q) != node_of(p) && !r2cc_ctl_dir_member(dir, q);
		r->missing_members = missing;
		if (!missing || now_s() > until)
			break;
		usleep(2000);
	}
	__atomic_fetch_add(&sh->resolved, 1, __ATOMIC_RELEASE);
	while (__atomic_load_n(&sh->resolved, __ATOMIC_ACQUIRE) < nproc && now_s() < until)
		usleep(1000);
	/* The repair requests: each to the peer found, and to nobody else. */
	for (int q = 0; q < nproc; q++) {
		if (node_of(q) == node_of(p))
			continue;
		for (int k = 0; k < NICS * QPC; k++) {
			struct r2cc_peer_ep local, remote;
			const struct r2cc_ctl_dir *d;
			int rank;
			uint8_t msg[2 * R2CC_PEER_EP_WIRE];
			end_of(p, q, k % NICS, k / NICS, &local);
			end_of(q, p, k % NICS, k / NICS, &remote);
			if (r2cc_peer_of(&local, &d, &rank))
				continue;
			r2cc_peer_ep_put(&local, msg);
			r2cc_peer_ep_put(&remote, msg + R2CC_PEER_EP_WIRE);
			r2cc_ctl_send(d, rank, T_REQ, msg, sizeof(msg));
		}
	}
	__atomic_fetch_add(&sh->sent, 1, __ATOMIC_RELEASE);
	while ((__atomic_load_n(&sh->sent, __ATOMIC_ACQUIRE) < nproc ||
		__atomic_load_n(&r->got_good, __ATOMIC_ACQUIRE) +
			__atomic_load_n(&r->got_bad, __ATOMIC_ACQUIRE) <
		    r->expected) &&
	       now_s() < until)
		usleep(1000);
	usleep(200000); /* a wrong extra request would come now */
	struct r2cc_peer_stats st;
	r2cc_peer_stats(&st);
	printf("process %d: %d connections, found %d (%llu by its own search, %llu by the peer's "
	       "PAIR), %d wrong, %d peer members missing; requests received %d right, %d "
	       "wrong\n",
	       p, r->expected, r->found, (unsigned long long)(st.found - st.by_pair_request),
	       (unsigned long long)st.by_pair_request, r->wrong_peer, r->missing_members,
	       r->got_good, r->got_bad);
	fflush(stdout);
	/* Others may still send to this process: stay until all are done. */
	__atomic_fetch_add(&sh->resolved, 1, __ATOMIC_RELEASE);
	while (__atomic_load_n(&sh->resolved, __ATOMIC_ACQUIRE) < 2 * nproc && now_s() < until)
		usleep(1000);
	bool ok = r->found == r->expected && !r->wrong_peer && !r->missing_members &&
		  r->got_good == r->expected && !r->got_bad;
	r2cc_ctl_shutdown();
	return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
	if (argc != 3 || (nproc = atoi(argv[1])) < 4 || nproc > MAXP || nproc % 2 ||
	    (strcmp(argv[2], "ib") && strcmp(argv[2], "roce"))) {
		fprintf(stderr, "usage: peer_multi N(4-%d, even) ib|roce\n", MAXP);
		return 2;
	}
	roce = !strcmp(argv[2], "roce");
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	unsetenv("R2CC_OOB_ROOT");
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		return 1;
	memset(sh, 0, sizeof(*sh));
	pid_t pids[MAXP];
	for (int p = 0; p < nproc; p++) {
		pids[p] = fork();
		if (pids[p] == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			_exit(child(p));
		}
	}
	int bad = 0;
	for (int p = 0; p < nproc; p++) {
		int st;
		waitpid(pids[p], &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st)) {
			bad++;
			fprintf(stderr, "peer_multi: process %d failed %s\n", p, sh->res[p].err);
		}
	}
	printf("peer_multi %d %s: %s\n", nproc, argv[2], bad ? "FAIL" : "PASS");
	return bad ? 1 : 0;
}
