/*
 * Control plane across processes, on loopback only. Usage: ctl_multi MODE [N]
 *
 *   dir N    N processes, each its own node, register with the rendezvous
 *            stamped by process 0 (its unique id travels through pipes, as
 *            the job's own bootstrap would carry it); every directory must be
 *            identical; then every process sends a request and a message to
 *            every other and checks the replies.
 *   badkey   a process holding a forged id (same job id or same rendezvous,
 *            other secret) cannot register; the rendezvous counts it and
 *            still serves the real job.
 *   garbage  a process writes noise, half frames and absurd lengths to the
 *            rendezvous listener and hangs up mid-frame, over and over; the
 *            listener survives, counts, and the real job still registers.
 *   timeout  nranks=3 with 2 registrants: both get -ETIMEDOUT on time.
 *
 * The parent only relays and judges; the workers are forked before any
 * control-plane call. Exit status 0 = pass.
 */
#include "ctl/ctl.h"
#include "ctl/ctl_msg.h"
#include "ctl/ctl_priv.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/common/util.h"

#define T_ECHO	200
#define T_COUNT 201
#define MAXP	16

enum rec_kind { REC_UID, REC_DIR, REC_DONE, REC_STATS };

/* One pipe record: small enough to be written atomically. */
struct rec {
	int kind;
	int rank;
	int status;
	double secs;
	unsigned char uid[R2CC_CTL_UID_SIZE];
	unsigned char digest[32];
	uint64_t drops[R2CC_CTL_DROP_COUNT];
};

static int to_parent;	      /* worker side of the report pipe */
static int from_parent[MAXP]; /* per worker: parent -> worker */
static int to_worker[MAXP];
static pid_t pids[MAXP];
static int nworkers;
static int counted;

static void fail(const char *what, int rank, int rc)
{
	fprintf(stderr, "ctl_multi: rank %d: %s (%d: %s)\n", rank, what, rc,
		strerror(rc < 0 ? -rc : rc));
}

static void report(struct rec *r)
{
	if (write(to_parent, r, sizeof(*r)) != (ssize_t)sizeof(*r))
		_exit(3);
}

static void report_status(int kind, int rank, int status)
{
	struct rec r = {.kind = kind, .rank = rank, .status = status};
	report(&r);
}

static void report_stats(int rank)
{
	struct r2cc_ctl_stats st;
	struct rec r = {.kind = REC_STATS, .rank = rank};
	r2cc_ctl_stats(&st);
	memcpy(r.drops, st.drops, sizeof(r.drops));
	report(&r);
}

/* Worker: blocks for the parent's next record. */
static int worker_read(int rank, struct rec *r)
{
	size_t got = 0;
	while (got < sizeof(*r)) {
		ssize_t n = read(from_parent[rank], (char *)r + got, sizeof(*r) - got);
		if (n <= 0)
			return -EPIPE;
		got += (size_t)n;
	}
	return 0;
}

/* Parent: next record from any worker, within timeout. */
static int parent_read(struct rec *r, int fd, int timeout_ms)
{
	struct pollfd p = {fd, POLLIN, 0};
	size_t got = 0;
	while (got < sizeof(*r)) {
		if (poll(&p, 1, timeout_ms) != 1)
			return -ETIMEDOUT;
		ssize_t n = read(fd, (char *)r + got, sizeof(*r) - got);
		if (n <= 0)
			return -EPIPE;
		got += (size_t)n;
	}
	return 0;
}

static void send_to(int rank, const struct rec *r)
{
	if (write(to_worker[rank], r, sizeof(*r)) != (ssize_t)sizeof(*r))
		fprintf(stderr, "ctl_multi: cannot reach worker %d\n", rank);
}

static void member_of(struct r2cc_ctl_member *m, int rank)
{
	memset(m, 0, sizeof(*m));
	snprintf(m->host, sizeof(m->host), "host%d", rank);
	snprintf(m->node_key, sizeof(m->node_key), "node-%d", rank);
	m->pid = getpid();
	m->nnics = 1 + rank % 3;
	for (int i = 0; i < m->nnics; i++) {
		snprintf(m->nics[i].name, sizeof(m->nics[i].name), "soft%d", i);
		m->nics[i].lid = (uint16_t)(rank * 16 + i + 1);
		m->nics[i].speed_gbps = 100;
		m->nics[i].state = 4;
		m->nics[i].gid[15] = (uint8_t)rank;
	}
}

static void echo(void *arg, int from, const void *p, size_t len, struct r2cc_ctl_call *call)
{
	char out[128];
	int n = snprintf(out, sizeof(out), "%d got [%.*s] from %d", call->to_rank, (int)len,
			 (const char *)p, from);
	r2cc_ctl_reply(call, 0, out, (size_t)n);
}

static void count(void *arg, int from, const void *p, size_t len, struct r2cc_ctl_call *call)
{
	__atomic_fetch_add(&counted, 1, __ATOMIC_RELAXED);
}

/* Rank 0 stamps and publishes; everyone gets the id back from the parent. */
static int get_uid(int rank, unsigned char uid[R2CC_CTL_UID_SIZE])
{
	struct rec r;
	if (rank == 0) {
		struct rec u = {.kind = REC_UID};
		memset(u.uid, 0x5a, sizeof(u.uid));
		int rc = r2cc_ctl_uid_stamp(u.uid);
		if (rc) {
			fail("stamp", rank, rc);
			return rc;
		}
		report(&u);
	}
	int rc = worker_read(rank, &r);
	if (rc == 0)
		memcpy(uid, r.uid, R2CC_CTL_UID_SIZE);
	return rc;
}

static int wait_exit(int rank)
{
	struct rec r;
	return worker_read(rank, &r);
}

static int check_dir(const struct r2cc_ctl_dir *d, int rank, int n)
{
	if (d->nranks != n || d->self_rank != rank || d->nnodes != n)
		return -EPROTO;
	/* Each process is its own node: the registration brought only itself. */
	for (int r = 0; r < n; r++)
		if ((r2cc_ctl_dir_member(d, r) != NULL) != (r == rank))
			return -EPROTO;
	/* Every rank three times, as a caller that collects one rank per QP asks:
	 * more names than the round has ranks. */
	int all[3 * MAXP];
	for (int r = 0; r < 3 * n; r++)
		all[r] = (3 * n - 1 - r) % n;
	int rc = r2cc_ctl_dir_fetch(d, all, 3 * n, 10000);
	if (rc)
		return rc;
	for (int r = 0; r < n; r++) {
		const struct r2cc_ctl_member *m = r2cc_ctl_dir_member(d, r);
		char host[32];
		snprintf(host, sizeof(host), "host%d", r);
		if (r2cc_ctl_dir_node(d, r) != r || strcmp(m->host, host) ||
		    m->nnics != 1 + r % 3 || m->nics[m->nnics - 1].lid != r * 16 + m->nnics ||
		    m->nics[0].gid[15] != r)
			return -EPROTO;
		for (int q = 0; q < r; q++)
			if (r2cc_ctl_dir_member(d, q)->pid == m->pid ||
			    r2cc_ctl_addr_equal(&r2cc_ctl_dir_member(d, q)->ctl_addr, &m->ctl_addr))
				return -EPROTO;
	}
	return 0;
}

/* The even ranks form a child communicator without a new id and talk in its
 * numbering. */
static int talk_in_split(const struct r2cc_ctl_dir *d, int rank, int n)
{
	int evens[MAXP], k = 0;
	struct r2cc_ctl_dir *c = NULL;
	for (int r = 0; r < n; r += 2)
		evens[k++] = r;
	int rc = r2cc_ctl_dir_split(d, evens, k, rank / 2, 0x5eed, &c);
	if (rc)
		return rc;
	if (k > 1) {
		int peer = (rank / 2 + 1) % k;
		char want[128], reply[128];
		size_t rlen = sizeof(reply);
		snprintf(want, sizeof(want), "%d got [split] from %d", peer, rank / 2);
		rc = r2cc_ctl_request(c, peer, T_ECHO, "split", 5, reply, &rlen, 10000);
		if (rc == 0 && (rlen != strlen(want) || memcmp(reply, want, rlen)))
			rc = -EPROTO;
	}
	if (rc)
		fail("split request", rank, rc);
	r2cc_ctl_dir_free(c);
	return rc;
}

static int worker_dir(int rank, int n)
{
	unsigned char uid[R2CC_CTL_UID_SIZE];
	struct r2cc_ctl_job job;
	struct r2cc_ctl_member m;
	struct r2cc_ctl_dir *d = NULL;
	r2cc_ctl_set_handler(T_ECHO, echo, NULL);
	r2cc_ctl_set_handler(T_COUNT, count, NULL);
	int rc = get_uid(rank, uid);
	if (rc)
		return rc;
	if (!r2cc_ctl_uid_parse(uid, &job)) {
		fail("parse", rank, 0);
		return -EPROTO;
	}
	member_of(&m, rank);
	rc = r2cc_ctl_register(&job, &m, rank, n, 15000, &d);
	struct rec dr = {.kind = REC_DIR, .rank = rank, .status = rc};
	if (rc == 0) {
		rc = dr.status = check_dir(d, rank, n);
		memcpy(dr.digest, d->digest, 32);
	}
	report(&dr);
	if (rc) {
		fail("register", rank, rc);
		return rc;
	}
	for (int k = 1; k < n && rc == 0; k++) {
		int peer = (rank + k) % n;
		char msg[32], want[128], reply[128];
		size_t rlen = sizeof(reply);
		snprintf(msg, sizeof(msg), "hello %d->%d", rank, peer);
		snprintf(want, sizeof(want), "%d got [%s] from %d", peer, msg, rank);
		rc = r2cc_ctl_request(d, peer, T_ECHO, msg, strlen(msg), reply, &rlen, 10000);
		if (rc == 0 && (rlen != strlen(want) || memcmp(reply, want, rlen)))
			rc = -EPROTO;
		if (rc == 0)
			rc = r2cc_ctl_send(d, peer, T_COUNT, msg, strlen(msg));
		if (rc)
			fail("request", rank, rc);
	}
	for (int i = 0; i < 2000 && rc == 0 && __atomic_load_n(&counted, __ATOMIC_RELAXED) < n - 1;
	     i++)
		usleep(5000);
	if (rc == 0 && __atomic_load_n(&counted, __ATOMIC_RELAXED) != n - 1) {
		fail("messages received", rank, __atomic_load_n(&counted, __ATOMIC_RELAXED));
		rc = -ETIMEDOUT;
	}
	if (rc == 0 && rank % 2 == 0)
		rc = talk_in_split(d, rank, n);
	report_status(REC_DONE, rank, rc);
	wait_exit(rank);
	r2cc_ctl_dir_free(d);
	r2cc_ctl_shutdown();
	return rc;
}

static int connect_to(const struct sockaddr_storage *a);

/* A registration for the real job id sealed with another secret: the
 * rendezvous must hang up without answering. */
static int forged_by_hand(const struct r2cc_ctl_job *job, const struct r2cc_ctl_job *forged)
{
	unsigned char f[256], b[64];
	struct r2cc_ctl_hdr h = {.magic = R2CC_CTL_MAGIC,
				 .version = R2CC_CTL_VERSION,
				 .flags = R2CC_CTL_F_REQUEST,
				 .type = 1,
				 .len = 8,
				 .req_id = 1,
				 .job_id = job->id,
				 .sender = 77,
				 .seq = 1,
				 .ts_ns = r2cc_ctl_now_ns(),
				 .from_rank = 1,
				 .to_rank = -1};
	int fd = connect_to(&job->rdv);
	if (fd < 0)
		return fd;
	memset(b, 0, sizeof(b));
	b[7] = 2; /* rank 0 of 2, then an empty-looking member */
	if (r2cc_ctl_frame_seal(forged->secret, &h, b, 8, f) ||
	    send(fd, f, r2cc_ctl_frame_size(8), MSG_NOSIGNAL) < 0) {
		close(fd);
		return -EIO;
	}
	struct pollfd p = {fd, POLLIN, 0};
	int rc = poll(&p, 1, 3000) == 1 && recv(fd, b, sizeof(b), 0) <= 0 ? 0 : -EPROTO;
	close(fd);
	return rc;
}

static uint64_t drops_of(int reason)
{
	struct r2cc_ctl_stats st;
	r2cc_ctl_stats(&st);
	return st.drops[reason];
}

/* badkey: rank 0 serves, rank 1 tries forged ids first, then the real one. */
static int worker_badkey(int rank)
{
	unsigned char uid[R2CC_CTL_UID_SIZE];
	struct r2cc_ctl_job job, forged;
	struct r2cc_ctl_member m;
	struct r2cc_ctl_dir *d = NULL;
	int rc = get_uid(rank, uid);
	if (rc || !r2cc_ctl_uid_parse(uid, &job))
		return -EPROTO;
	member_of(&m, rank);
	if (rank == 1) {
		/* Another secret (so another job id) at the same rendezvous: no
		 * answer, ever. */
		forged = job;
		r2cc_ctl_random(forged.secret, sizeof(forged.secret));
		r2cc_ctl_job_derive_id(&forged);
		rc = r2cc_ctl_register(&forged, &m, 1, 2, 1000, &d);
		if (rc != -ETIMEDOUT) {
			fail("forged job registered", rank, rc);
			return -EPROTO;
		}
		/* The real job id with another secret: refused here already... */
		forged = job;
		forged.secret[0] ^= 0x80;
		rc = r2cc_ctl_register(&forged, &m, 1, 2, 3000, &d);
		if (rc != -EINVAL) {
			fail("mismatched job accepted", rank, rc);
			return -EPROTO;
		}
		/* ...and refused there when sent by hand. */
		rc = forged_by_hand(&job, &forged);
		if (rc) {
			fail("forged frame not refused", rank, rc);
			return -EPROTO;
		}
		report_status(REC_DONE, rank, 0);
	}
	if (rank == 0) {
		/* Wait until rank 1 has made its forged attempts. */
		struct rec r;
		if (worker_read(rank, &r))
			return -EPIPE;
	}
	rc = r2cc_ctl_register(&job, &m, rank, 2, 10000, &d);
	report_status(REC_DIR, rank, rc);
	if (rank == 0) {
		/* The forged job's frames are kept a moment before they count. */
		for (int i = 0; i < 1000 && drops_of(R2CC_CTL_DROP_UNKNOWN_JOB) < 1; i++)
			usleep(5000);
		report_stats(rank);
	}
	wait_exit(rank);
	r2cc_ctl_dir_free(d);
	r2cc_ctl_shutdown();
	return rc;
}

static int connect_to(const struct sockaddr_storage *a)
{
	int fd = socket(a->ss_family, SOCK_STREAM, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (const struct sockaddr *)a, r2cc_ctl_addr_len(a)) != 0) {
		int e = -errno;
		close(fd);
		return e;
	}
	return fd;
}

#define GARBAGE_CONNS 120

static uint64_t total_drops(void)
{
	struct r2cc_ctl_stats st;
	uint64_t t = 0;
	r2cc_ctl_stats(&st);
	for (int k = 1; k < R2CC_CTL_DROP_COUNT; k++)
		t += st.drops[k];
	return t;
}

/* The garbage client: no control-plane calls of its own, raw sockets only. */
static int garbage(const struct r2cc_ctl_job *job)
{
	unsigned char buf[4096];
	for (int i = 0; i < GARBAGE_CONNS; i++) {
		int fd = connect_to(&job->rdv);
		if (fd < 0)
			return fd;
		struct r2cc_ctl_hdr h = {.magic = R2CC_CTL_MAGIC,
					 .version = R2CC_CTL_VERSION,
					 .job_id = job->id,
					 .seq = 1,
					 .ts_ns = r2cc_ctl_now_ns()};
		size_t n = 0;
		r2cc_ctl_random(buf, sizeof(buf));
		switch (i % 6) {
		case 0: /* noise */
			buf[0] = 0;
			n = 1 + buf[1] % 2000;
			break;
		case 1: /* absurd length */
			h.len = 0x80000000u | buf[2];
			r2cc_ctl_hdr_encode(&h, buf);
			n = R2CC_CTL_HDR_SIZE + 10;
			break;
		case 2: /* half a header */
			r2cc_ctl_hdr_encode(&h, buf);
			n = R2CC_CTL_HDR_SIZE / 2;
			break;
		case 3: /* a sane header, then hang up halfway through the payload */
			h.len = 3000;
			r2cc_ctl_hdr_encode(&h, buf);
			n = 1500;
			break;
		case 4: /* whole frame, random tag */
			h.len = 100;
			r2cc_ctl_hdr_encode(&h, buf);
			n = r2cc_ctl_frame_size(100);
			break;
		case 5: /* whole frame for a job nobody has */
			h.len = 10;
			h.job_id = ~job->id;
			r2cc_ctl_hdr_encode(&h, buf);
			n = r2cc_ctl_frame_size(10);
			break;
		}
		/* Peer may already have closed on us: errors are fine here. */
		if (send(fd, buf, n, MSG_NOSIGNAL) < 0 && errno != EPIPE && errno != ECONNRESET)
			return -errno;
		if (i % 7 == 0)
			usleep(1000);
		close(fd);
	}
	return 0;
}

static int worker_garbage(int rank)
{
	unsigned char uid[R2CC_CTL_UID_SIZE];
	struct r2cc_ctl_job job;
	struct r2cc_ctl_member m;
	struct r2cc_ctl_dir *d = NULL;
	int rc = get_uid(rank, uid);
	if (rc || !r2cc_ctl_uid_parse(uid, &job))
		return -EPROTO;
	if (rank == 1) {
		rc = garbage(&job);
		report_status(REC_DONE, rank, rc);
		wait_exit(rank);
		return rc;
	}
	if (rank == 0) {
		struct rec r;
		if (worker_read(rank, &r)) /* the garbage is over */
			return -EPIPE;
		/* Every garbage connection ends in exactly one drop. */
		for (int i = 0; i < 1000 && total_drops() < GARBAGE_CONNS; i++)
			usleep(5000);
	}
	r2cc_ctl_set_handler(T_ECHO, echo, NULL);
	member_of(&m, rank);
	int me = rank == 0 ? 0 : 1;
	rc = r2cc_ctl_register(&job, &m, me, 2, 10000, &d);
	if (rc == 0) {
		char reply[128];
		size_t rlen = sizeof(reply);
		rc = r2cc_ctl_request(d, 1 - me, T_ECHO, "still there?", 12, reply, &rlen, 5000);
	}
	report_status(REC_DIR, rank, rc);
	if (rank == 0)
		report_stats(rank);
	wait_exit(rank);
	r2cc_ctl_dir_free(d);
	r2cc_ctl_shutdown();
	return rc;
}

static int worker_timeout(int rank)
{
	unsigned char uid[R2CC_CTL_UID_SIZE];
	struct r2cc_ctl_job job;
	struct r2cc_ctl_member m;
	struct r2cc_ctl_dir *d = NULL;
	int rc = get_uid(rank, uid);
	if (rc || !r2cc_ctl_uid_parse(uid, &job))
		return -EPROTO;
	member_of(&m, rank);
	double t0 = now_s();
	rc = r2cc_ctl_register(&job, &m, rank, 3, 1500, &d);
	struct rec r = {.kind = REC_DIR, .rank = rank, .status = rc, .secs = now_s() - t0};
	report(&r);
	wait_exit(rank);
	r2cc_ctl_shutdown();
	return 0;
}

static int run_worker(const char *mode, int rank, int n)
{
	alarm(50);
	r2cc_ctl_set_timeouts(10000, 300);
	if (!strcmp(mode, "dir"))
		return worker_dir(rank, n);
	if (!strcmp(mode, "badkey"))
		return worker_badkey(rank);
	if (!strcmp(mode, "garbage"))
		return worker_garbage(rank);
	return worker_timeout(rank);
}

static void release_all(void)
{
	struct rec r = {.kind = REC_DONE};
	for (int i = 0; i < nworkers; i++)
		send_to(i, &r);
}

static int judge(const char *mode, int n, int rfd)
{
	struct rec r, first_dir = {0}, stats = {0};
	int ndir = 0, ndone = 0, bad = 0, have_stats = 0;
	int want_dir = !strcmp(mode, "garbage") ? 2 : n, want_done = !strcmp(mode, "dir")	? n
								     : !strcmp(mode, "timeout") ? 0
												: 1;
	int want_stats = !strcmp(mode, "badkey") || !strcmp(mode, "garbage");
	while (!bad && (ndir < want_dir || ndone < want_done || have_stats < want_stats)) {
		if (parent_read(&r, rfd, 40000)) {
			fprintf(stderr,
				"ctl_multi: %s: workers went silent (%d/%d dirs, %d/%d done)\n",
				mode, ndir, want_dir, ndone, want_done);
			return 1;
		}
		switch (r.kind) {
		case REC_UID:
			for (int i = 0; i < n; i++)
				send_to(i, &r);
			break;
		case REC_DIR:
			if (!strcmp(mode, "timeout")) {
				if (r.status != -ETIMEDOUT || r.secs < 1.45 || r.secs > 3.0) {
					fprintf(stderr,
						"rank %d: %d after %.2f s, want -ETIMEDOUT "
						"after 1.5 s\n",
						r.rank, r.status, r.secs);
					bad++;
				}
			} else if (r.status) {
				fprintf(stderr, "rank %d: registration: %s\n", r.rank,
					strerror(-r.status));
				bad++;
			} else if (ndir == 0) {
				first_dir = r;
			} else if (!strcmp(mode, "dir") && memcmp(first_dir.digest, r.digest, 32)) {
				fprintf(stderr, "rank %d: directory differs from rank %d's\n",
					r.rank, first_dir.rank);
				bad++;
			}
			ndir++;
			break;
		case REC_DONE:
			if (r.status) {
				fprintf(stderr, "rank %d: %s\n", r.rank, strerror(-r.status));
				bad++;
			}
			ndone++;
			/* badkey / garbage: rank 0 waits for rank 1's act. */
			if (strcmp(mode, "dir"))
				send_to(0, &r);
			break;
		case REC_STATS:
			stats = r;
			have_stats++;
			break;
		}
	}
	if (!strcmp(mode, "badkey")) {
		if (stats.drops[R2CC_CTL_DROP_BAD_TAG] < 1 ||
		    stats.drops[R2CC_CTL_DROP_UNKNOWN_JOB] < 1) {
			fprintf(stderr, "badkey: bad_tag %llu, unknown_job %llu\n",
				(unsigned long long)stats.drops[R2CC_CTL_DROP_BAD_TAG],
				(unsigned long long)stats.drops[R2CC_CTL_DROP_UNKNOWN_JOB]);
			bad++;
		}
	}
	if (!strcmp(mode, "garbage")) {
		uint64_t total = 0;
		for (int k = 1; k < R2CC_CTL_DROP_COUNT; k++) {
			printf("garbage: %s %llu\n", r2cc_ctl_drop_name(k),
			       (unsigned long long)stats.drops[k]);
			total += stats.drops[k];
		}
		if (stats.drops[R2CC_CTL_DROP_BAD_HEADER] < 1 ||
		    stats.drops[R2CC_CTL_DROP_BAD_LENGTH] < 1 ||
		    stats.drops[R2CC_CTL_DROP_TRUNCATED] < 1 ||
		    stats.drops[R2CC_CTL_DROP_UNKNOWN_JOB] < 1 ||
		    stats.drops[R2CC_CTL_DROP_BAD_TAG] < 1 || total != GARBAGE_CONNS) {
			fprintf(stderr, "garbage: not every kind of garbage was counted\n");
			bad++;
		}
	}
	return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: ctl_multi dir N | badkey | garbage | timeout\n");
		return 2;
	}
	const char *mode = argv[1];
	int n = !strcmp(mode, "dir")	   ? (argc > 2 ? atoi(argv[2]) : 2)
		: !strcmp(mode, "garbage") ? 3
					   : 2;
	if (n < 2 || n > MAXP ||
	    (strcmp(mode, "dir") && strcmp(mode, "badkey") && strcmp(mode, "garbage") &&
	     strcmp(mode, "timeout"))) {
		fprintf(stderr, "ctl_multi: bad arguments\n");
		return 2;
	}
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	unsetenv("R2CC_OOB_ROOT");
	int rp[2];
	if (pipe(rp))
		return 2;
	nworkers = n;
	for (int i = 0; i < n; i++) {
		int cp[2];
		if (pipe(cp))
			return 2;
		from_parent[i] = cp[0];
		to_worker[i] = cp[1];
	}
	double t0 = now_s();
	for (int i = 0; i < n; i++) {
		pids[i] = fork();
		if (pids[i] < 0)
			return 2;
		if (pids[i] == 0) {
			close(rp[0]);
			to_parent = rp[1];
			int rc = run_worker(mode, i, n);
			if (rc)
				report_status(REC_DONE, i, rc ? rc : -EPROTO);
			_exit(rc ? 1 : 0);
		}
	}
	close(rp[1]);
	int bad = judge(mode, n, rp[0]);
	release_all();
	if (bad)
		for (int i = 0; i < n; i++)
			kill(pids[i], SIGKILL);
	for (int i = 0; i < n; i++) {
		int st;
		/* A worker that outlives everything gets killed by its own alarm. */
		if (waitpid(pids[i], &st, 0) != pids[i] || !WIFEXITED(st) || WEXITSTATUS(st)) {
			fprintf(stderr, "ctl_multi: worker %d ended badly (status %#x)\n", i, st);
			bad++;
		}
	}
	printf("ctl_multi %s %d: %s in %.2f s\n", mode, n, bad ? "FAIL" : "ok", now_s() - t0);
	return bad ? 1 : 0;
}
