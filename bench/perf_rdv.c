/* TCP star between the processes of one r2cc-perf job (see perf_rdv.h). Every message
 * has a fixed length known to both ends, so the protocol is plain send/receive in lock
 * step; a peer that dies shows up as end of file and ends the job with a message.
 */
#include "bench/perf_rdv.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RDV_MAGIC 0x52324343504552ull /* "R2CCPER" */

struct rdv_hello {
	uint64_t magic;
	int32_t proc, nprocs;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int perf_rdv_address(char *host, size_t hostlen, int *port)
{
	const char *root = getenv("R2CC_PERF_ROOT");
	const char *addr = getenv("MASTER_ADDR");
	const char *mport = getenv("MASTER_PORT");
	const char *colon;
	char *end;
	long p = PERF_RDV_DEFAULT_PORT;

	snprintf(host, hostlen, "%s", "127.0.0.1");
	if (root && *root) {
		colon = strrchr(root, ':');
		if (colon) {
			if (colon > root)
				snprintf(host, hostlen, "%.*s", (int)(colon - root), root);
			p = strtol(colon + 1, &end, 10);
			if (end == colon + 1 || *end || p <= 0 || p > 65535) {
				fprintf(stderr,
					"r2cc-perf: R2CC_PERF_ROOT='%s': expected host:port\n",
					root);
				return -EINVAL;
			}
		} else {
			snprintf(host, hostlen, "%s", root);
		}
	} else {
		if (addr && *addr)
			snprintf(host, hostlen, "%s", addr);
		if (mport && *mport) {
			/* the port after MASTER_PORT: torchrun's own store holds MASTER_PORT */
			p = strtol(mport, &end, 10) + 1;
			if (*end || p <= 1 || p > 65535) {
				fprintf(stderr, "r2cc-perf: MASTER_PORT='%s' is not a port\n",
					mport);
				return -EINVAL;
			}
		}
	}
	*port = (int)p;
	return 0;
}

static int send_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -errno ? -errno : -EIO;
		p += n, len -= (size_t)n;
	}
	return 0;
}

static int recv_all(int fd, void *buf, size_t len)
{
	char *p = buf;
	while (len) {
		ssize_t n = recv(fd, p, len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0)
			return -ECONNRESET;
		if (n < 0)
			return -errno;
		p += n, len -= (size_t)n;
	}
	return 0;
}

static void set_nodelay(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static int resolve(const char *host, int port, struct sockaddr_storage *sa, socklen_t *salen)
{
	struct addrinfo hints, *res;
	char ports[16];
	int rc;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	snprintf(ports, sizeof(ports), "%d", port);
	rc = getaddrinfo(host, ports, &hints, &res);
	if (rc) {
		fprintf(stderr, "r2cc-perf: cannot resolve rendezvous host '%s': %s\n", host,
			gai_strerror(rc));
		return -EINVAL;
	}
	memcpy(sa, res->ai_addr, res->ai_addrlen);
	*salen = res->ai_addrlen;
	freeaddrinfo(res);
	return 0;
}

static int serve(struct perf_rdv *r, int port, int timeout_s)
{
	struct sockaddr_in6 sa6;
	struct sockaddr_in sa4;
	int one = 1, got = 1, rc = 0, lfd;
	double deadline = now_s() + timeout_s;

	/* listen on all addresses so that a host name that resolves anywhere works */
	lfd = socket(AF_INET6, SOCK_STREAM, 0);
	if (lfd >= 0) {
		int zero = 0;
		setsockopt(lfd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
		setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		memset(&sa6, 0, sizeof(sa6));
		sa6.sin6_family = AF_INET6;
		sa6.sin6_port = htons((uint16_t)port);
		sa6.sin6_addr = in6addr_any;
		if (bind(lfd, (struct sockaddr *)&sa6, sizeof(sa6))) {
			close(lfd);
			lfd = -1;
		}
	}
	if (lfd < 0) {
		lfd = socket(AF_INET, SOCK_STREAM, 0);
		if (lfd < 0)
			return -errno;
		setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		memset(&sa4, 0, sizeof(sa4));
		sa4.sin_family = AF_INET;
		sa4.sin_port = htons((uint16_t)port);
		sa4.sin_addr.s_addr = htonl(INADDR_ANY);
		if (bind(lfd, (struct sockaddr *)&sa4, sizeof(sa4))) {
			rc = -errno;
			fprintf(stderr,
				"r2cc-perf: rank 0: cannot listen on port %d: %s "
				"(set R2CC_PERF_ROOT=host:port to another port)\n",
				port, strerror(-rc));
			close(lfd);
			return rc;
		}
	}
	if (listen(lfd, 256)) {
		rc = -errno;
		close(lfd);
		return rc;
	}
	while (got < r->nprocs) {
		struct pollfd pfd = {.fd = lfd, .events = POLLIN};
		struct rdv_hello h;
		int left = (int)((deadline - now_s()) * 1000), fd;
		if (left <= 0) {
			fprintf(stderr,
				"r2cc-perf: rank 0: only %d of %d processes reached the rendezvous "
				"on port %d within %d s\n",
				got, r->nprocs, port, timeout_s);
			rc = -ETIMEDOUT;
			break;
		}
		if (poll(&pfd, 1, left) <= 0)
			continue;
		fd = accept(lfd, NULL, NULL);
		if (fd < 0)
			continue;
		set_nodelay(fd);
		if (recv_all(fd, &h, sizeof(h)) || h.magic != RDV_MAGIC || h.nprocs != r->nprocs ||
		    h.proc <= 0 || h.proc >= r->nprocs || r->fds[h.proc] >= 0) {
			fprintf(stderr, "r2cc-perf: rank 0: refused a rendezvous connection "
					"(another job, or a mismatched world size)\n");
			close(fd);
			continue;
		}
		r->fds[h.proc] = fd;
		got++;
	}
	close(lfd);
	return rc;
}

static int join(struct perf_rdv *r, const char *host, int port, int timeout_s)
{
	struct sockaddr_storage sa;
	socklen_t salen;
	struct rdv_hello h = {RDV_MAGIC, r->proc, r->nprocs};
	double deadline = now_s() + timeout_s;
	useconds_t backoff = 10000;
	int rc = resolve(host, port, &sa, &salen);

	if (rc)
		return rc;
	for (;;) {
		int fd = socket(sa.ss_family, SOCK_STREAM, 0);
		if (fd < 0)
			return -errno;
		if (connect(fd, (struct sockaddr *)&sa, salen) == 0) {
			set_nodelay(fd);
			rc = send_all(fd, &h, sizeof(h));
			if (rc) {
				close(fd);
				return rc;
			}
			r->fd = fd;
			return 0;
		}
		rc = -errno;
		close(fd);
		if (now_s() > deadline) {
			fprintf(
			    stderr,
			    "r2cc-perf: rank process %d: no rendezvous at %s:%d after %d s (%s); "
			    "is process 0 running? set R2CC_PERF_ROOT=host:port\n",
			    r->proc, host, port, timeout_s, strerror(-rc));
			return -ETIMEDOUT;
		}
		usleep(backoff);
		if (backoff < 500000)
			backoff *= 2;
	}
}

int perf_rdv_open(struct perf_rdv *r, int proc, int nprocs, const char *host, int port,
		  int timeout_s)
{
	memset(r, 0, sizeof(*r));
	r->proc = proc, r->nprocs = nprocs, r->fd = -1;
	if (nprocs == 1)
		return 0;
	if (proc == 0) {
		r->fds = malloc(sizeof(int) * (size_t)nprocs);
		if (!r->fds)
			return -ENOMEM;
		for (int i = 0; i < nprocs; i++)
			r->fds[i] = -1;
		return serve(r, port, timeout_s);
	}
	return join(r, host, port, timeout_s);
}

void perf_rdv_close(struct perf_rdv *r)
{
	if (r->fds) {
		for (int i = 1; i < r->nprocs; i++)
			if (r->fds[i] >= 0)
				close(r->fds[i]);
		free(r->fds);
		r->fds = NULL;
	}
	if (r->fd >= 0)
		close(r->fd);
	r->fd = -1;
}

static int lost(const struct perf_rdv *r, int peer, int rc)
{
	fprintf(stderr,
		"r2cc-perf: process %d: lost the rendezvous connection to process %d "
		"(%s); did it fail?\n",
		r->proc, peer, strerror(-rc));
	return rc;
}

int perf_rdv_gather(struct perf_rdv *r, const void *mine, void *all, size_t len)
{
	int rc;
	if (r->proc != 0) {
		rc = send_all(r->fd, mine, len);
		return rc ? lost(r, 0, rc) : 0;
	}
	memcpy(all, mine, len);
	for (int i = 1; i < r->nprocs; i++) {
		rc = recv_all(r->fds[i], (char *)all + (size_t)i * len, len);
		if (rc)
			return lost(r, i, rc);
	}
	return 0;
}

int perf_rdv_bcast(struct perf_rdv *r, void *buf, size_t len)
{
	int rc;
	if (r->proc != 0) {
		rc = recv_all(r->fd, buf, len);
		return rc ? lost(r, 0, rc) : 0;
	}
	for (int i = 1; i < r->nprocs; i++) {
		rc = send_all(r->fds[i], buf, len);
		if (rc)
			return lost(r, i, rc);
	}
	return 0;
}

int perf_rdv_barrier(struct perf_rdv *r)
{
	char b = 0, *all = NULL;
	int rc;
	if (r->nprocs == 1)
		return 0;
	if (r->proc == 0) {
		all = malloc((size_t)r->nprocs);
		if (!all)
			return -ENOMEM;
	}
	rc = perf_rdv_gather(r, &b, all, 1);
	free(all);
	return rc ? rc : perf_rdv_bcast(r, &b, 1);
}

int perf_rdv_allreduce(struct perf_rdv *r, double *v, int n, int how)
{
	double *all = NULL;
	size_t len = sizeof(double) * (size_t)n;
	int rc;
	if (r->nprocs == 1)
		return 0;
	if (r->proc == 0) {
		all = malloc(len * (size_t)r->nprocs);
		if (!all)
			return -ENOMEM;
	}
	rc = perf_rdv_gather(r, v, all, len);
	if (!rc && r->proc == 0) {
		for (int p = 1; p < r->nprocs; p++) {
			for (int i = 0; i < n; i++) {
				double x = all[(size_t)p * (size_t)n + (size_t)i];
				if (how == PERF_RDV_SUM)
					v[i] += x;
				else if (how == PERF_RDV_MIN)
					v[i] = x < v[i] ? x : v[i];
				else
					v[i] = x > v[i] ? x : v[i];
			}
		}
	}
	free(all);
	return rc ? rc : perf_rdv_bcast(r, v, len);
}
