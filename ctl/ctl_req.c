/*
 * The calling side of the control plane (any thread but the control thread;
 * ctl.c has the overview): requests and their waiters, the directory's
 * lookups, NIC reports and leaving, messages to ranks, handlers and their
 * replies, and registration with the rendezvous.
 */
#include "ctl/ctl_thread.h"
#include "ctl/ctl_priv.h"
#include "shim/log.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Requests (any thread). */

static void request_begin(struct pending *p, const struct sockaddr_storage *dst,
			  const struct r2cc_ctl_job *job, struct r2cc_ctl_hdr *h,
			  const void *payload, size_t len)
{
	pthread_mutex_lock(&r2cc_ctl.lock);
	if (++r2cc_ctl.next_req == 0)
		r2cc_ctl.next_req = 1;
	p->req_id = r2cc_ctl.next_req;
	p->job_id = job->id;
	int rc = r2cc_ctl_pending_link_locked(p);
	pthread_mutex_unlock(&r2cc_ctl.lock);
	h->flags = R2CC_CTL_F_REQUEST;
	h->req_id = p->req_id;
	h->job_id = job->id;
	if (rc == 0)
		rc = r2cc_ctl_queue_out(dst, job->secret, h, payload, len);
	if (rc) {
		pthread_mutex_lock(&r2cc_ctl.lock);
		r2cc_ctl_pending_complete_locked(p, rc);
		pthread_mutex_unlock(&r2cc_ctl.lock);
	}
}

static void deadline_after(struct timespec *ts, int timeout_ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += timeout_ms / 1000;
	ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

/* Waits for p until the deadline and unlinks it; returns its status. */
static int request_wait(struct pending *p, const struct timespec *deadline)
{
	pthread_mutex_lock(&r2cc_ctl.lock);
	while (!p->done)
		if (pthread_cond_timedwait(&r2cc_ctl.done_cv, &r2cc_ctl.lock, deadline) ==
		    ETIMEDOUT)
			break;
	int rc = p->done ? p->status : -ETIMEDOUT;
	r2cc_ctl_pending_unlink_locked(p);
	pthread_mutex_unlock(&r2cc_ctl.lock);
	return rc;
}

static int ms_left(const struct timespec *deadline)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	int64_t ms = (int64_t)(deadline->tv_sec - now.tv_sec) * 1000 +
		     (deadline->tv_nsec - now.tv_nsec) / 1000000;
	return ms > 0 ? (int)ms : 0;
}

/* A request to the rendezvous that serves dir's lookups; the reply is
 * malloc'd into *reply. */
static int rdv_request(const struct r2cc_ctl_dir *dir, uint16_t type, const void *payload,
		       size_t len, unsigned char **reply, size_t *rlen, int timeout_ms)
{
	const struct r2cc_ctl_job *job;
	int self;
	uint32_t gen;
	if (r2cc_ctl_on_thread())
		return -EDEADLK;
	r2cc_ctl_dir_lookup_target(dir, &job, &self, &gen);
	int rc = r2cc_ctl_start();
	if (rc == 0)
		rc = r2cc_ctl_job_ensure(job, false, &self, 1);
	if (rc)
		return rc;
	struct pending p = {.peer_rank = -1, .grow = true};
	struct r2cc_ctl_hdr h = {.type = type, .from_rank = self, .to_rank = -1};
	struct timespec deadline;
	deadline_after(&deadline, timeout_ms);
	request_begin(&p, &job->rdv, job, &h, payload, len);
	rc = request_wait(&p, &deadline);
	if (rc == 0) {
		*reply = p.buf;
		*rlen = p.len;
	} else {
		free(p.buf);
	}
	return rc;
}

#define FETCH_CHUNK 4096

static int cmp_rank(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

int r2cc_ctl_dir_fetch(const struct r2cc_ctl_dir *dir, const int *ranks, int n, int timeout_ms)
{
	if (!dir || n < 0 || (n && !ranks) || timeout_ms < 0)
		return -EINVAL;
	int *want = malloc(sizeof(int) * (size_t)(n ? n : 1));
	if (!want)
		return -ENOMEM;
	int k = 0;
	for (int i = 0; i < n; i++) {
		if (ranks[i] < 0 || ranks[i] >= dir->nranks) {
			free(want);
			return -EINVAL;
		}
		if (!r2cc_ctl_dir_member(dir, ranks[i]))
			want[k++] = ranks[i];
	}
	/* Each rank once: a request never names more ranks than the round has. */
	qsort(want, (size_t)k, sizeof(int), cmp_rank);
	int u = 0;
	for (int i = 0; i < k; i++)
		if (!u || want[i] != want[u - 1])
			want[u++] = want[i];
	k = u;
	struct timespec deadline;
	deadline_after(&deadline, timeout_ms);
	int rc = 0;
	for (int i = 0; i < k && rc == 0; i += FETCH_CHUNK) {
		int nr = k - i < FETCH_CHUNK ? k - i : FETCH_CHUNK;
		unsigned char *req = NULL, *reply = NULL;
		size_t len = 0, rlen = 0;
		rc = r2cc_ctl_lookup_encode(dir, want + i, nr, NULL, 0, &req, &len);
		if (rc == 0)
			rc = rdv_request(dir, CTL_T_LOOKUP, req, len, &reply, &rlen,
					 ms_left(&deadline));
		if (rc == 0)
			rc = r2cc_ctl_dir_take_lookup(dir, reply, rlen, 0, NULL, 0, NULL);
		free(req);
		free(reply);
	}
	for (int i = 0; i < k && rc == 0; i++)
		if (!r2cc_ctl_dir_member(dir, want[i]))
			rc = -ENOENT;
	free(want);
	return rc;
}

int r2cc_ctl_dir_owners(const struct r2cc_ctl_dir *dir, const struct r2cc_ctl_nicaddr *addrs, int n,
			int *owners, int max_per_addr, int *nowners, int timeout_ms)
{
	if (!dir || n < 1 || n > R2CC_CTL_LOOKUP_MAX_ADDRS || !addrs || !owners ||
	    max_per_addr < 1 || !nowners || timeout_ms < 0)
		return -EINVAL;
	unsigned char *req = NULL, *reply = NULL;
	size_t len = 0, rlen = 0;
	int rc = r2cc_ctl_lookup_encode(dir, NULL, 0, addrs, n, &req, &len);
	if (rc == 0)
		rc = rdv_request(dir, CTL_T_LOOKUP, req, len, &reply, &rlen, timeout_ms);
	if (rc == 0)
		rc = r2cc_ctl_dir_take_lookup(dir, reply, rlen, n, owners, max_per_addr, nowners);
	free(req);
	free(reply);
	return rc;
}

int r2cc_ctl_dir_report_nics(const struct r2cc_ctl_dir *dir, const struct r2cc_ctl_nic *nics, int n,
			     int timeout_ms)
{
	if (!dir || !nics || timeout_ms < 0)
		return -EINVAL;
	unsigned char *req = NULL, *reply = NULL;
	size_t len = 0, rlen = 0;
	int rc = r2cc_ctl_nics_encode(dir, nics, n, &req, &len);
	if (rc == 0)
		rc = rdv_request(dir, CTL_T_NICS, req, len, &reply, &rlen, timeout_ms);
	free(req);
	free(reply);
	return rc;
}

void r2cc_ctl_dir_leave(const struct r2cc_ctl_dir *dir)
{
	const struct r2cc_ctl_job *job;
	int self;
	uint32_t gen;
	if (!dir)
		return;
	r2cc_ctl_dir_lookup_target(dir, &job, &self, &gen);
	/* A split's ranks leave through their parent's communicator. */
	if (job->id != dir->job.id || r2cc_ctl_start() || r2cc_ctl_job_ensure(job, false, &self, 1))
		return;
	unsigned char b[8];
	r2cc_ctl_put_u32(b, gen);
	r2cc_ctl_put_u32(b + 4, (uint32_t)self);
	struct r2cc_ctl_hdr h = {
	    .type = CTL_T_LEAVE, .job_id = job->id, .from_rank = self, .to_rank = -1};
	r2cc_ctl_queue_out(&job->rdv, job->secret, &h, b, sizeof(b));
}

/* Where rank's process listens; its member is fetched first when the
 * directory does not hold it. */
static int member_addr(const struct r2cc_ctl_dir *dir, int rank, int timeout_ms,
		       struct sockaddr_storage *out)
{
	const struct r2cc_ctl_member *m = r2cc_ctl_dir_member(dir, rank);
	if (!m) {
		if (r2cc_ctl_on_thread())
			return -ENOENT;
		int rc = r2cc_ctl_dir_fetch(dir, &rank, 1, timeout_ms);
		if (rc)
			return rc;
		m = r2cc_ctl_dir_member(dir, rank);
		if (!m)
			return -ENOENT;
	}
	*out = m->ctl_addr;
	return 0;
}

int r2cc_ctl_request(const struct r2cc_ctl_dir *dir, int rank, uint16_t type, const void *payload,
		     size_t len, void *reply, size_t *reply_len, int timeout_ms)
{
	if (!dir || rank < 0 || rank >= dir->nranks || type < R2CC_CTL_TYPE_USER ||
	    type >= R2CC_CTL_TYPE_MAX || !reply_len || (*reply_len && !reply) || timeout_ms < 0)
		return -EINVAL;
	/* A handler waiting for a reply would wait for its own thread. */
	if (r2cc_ctl_on_thread())
		return -EDEADLK;
	int rc = r2cc_ctl_start();
	if (rc == 0)
		rc = r2cc_ctl_job_ensure(&dir->job, false, &dir->self_rank, 1);
	if (rc)
		return rc;
	struct pending p = {.peer_rank = rank, .buf = reply, .cap = *reply_len};
	struct r2cc_ctl_hdr h = {.type = type, .from_rank = dir->self_rank, .to_rank = rank};
	struct timespec deadline;
	struct sockaddr_storage dst;
	deadline_after(&deadline, timeout_ms);
	rc = member_addr(dir, rank, timeout_ms, &dst);
	if (rc)
		return rc;
	request_begin(&p, &dst, &dir->job, &h, payload, len);
	rc = request_wait(&p, &deadline);
	if (rc == 0 || rc == -EMSGSIZE)
		*reply_len = p.len;
	return rc;
}

int r2cc_ctl_request_batch(struct r2cc_ctl_batch_req *reqs, int n, uint16_t type, int timeout_ms)
{
	if (n < 0 || (n && !reqs) || type < R2CC_CTL_TYPE_USER || type >= R2CC_CTL_TYPE_MAX ||
	    timeout_ms < 0)
		return -EINVAL;
	for (int i = 0; i < n; i++)
		if (!reqs[i].dir || reqs[i].rank < 0 || reqs[i].rank >= reqs[i].dir->nranks ||
		    (reqs[i].reply_len && !reqs[i].reply))
			return -EINVAL;
	if (r2cc_ctl_on_thread())
		return -EDEADLK;
	int rc = r2cc_ctl_start();
	if (rc)
		return rc;
	struct pending *p = calloc((size_t)(n ? n : 1), sizeof(*p));
	if (!p)
		return -ENOMEM;
	struct timespec deadline;
	deadline_after(&deadline, timeout_ms);
	for (int i = 0; i < n; i++) {
		struct r2cc_ctl_batch_req *q = &reqs[i];
		struct sockaddr_storage dst;
		q->status = r2cc_ctl_job_ensure(&q->dir->job, false, &q->dir->self_rank, 1);
		if (q->status == 0)
			q->status = member_addr(q->dir, q->rank, ms_left(&deadline), &dst);
		if (q->status)
			continue;
		p[i] = (struct pending){.peer_rank = q->rank, .buf = q->reply, .cap = q->reply_len};
		struct r2cc_ctl_hdr h = {
		    .type = type, .from_rank = q->dir->self_rank, .to_rank = q->rank};
		request_begin(&p[i], &dst, &q->dir->job, &h, q->payload, q->len);
		q->status = 1; /* in flight */
	}
	for (int i = 0; i < n; i++) {
		struct r2cc_ctl_batch_req *q = &reqs[i];
		if (q->status == 1) {
			q->status = request_wait(&p[i], &deadline);
			if (q->status == 0 || q->status == -EMSGSIZE)
				q->reply_len = p[i].len;
		}
		if (q->status && !rc)
			rc = q->status;
	}
	free(p);
	return rc;
}

int r2cc_ctl_send(const struct r2cc_ctl_dir *dir, int rank, uint16_t type, const void *payload,
		  size_t len)
{
	if (!dir || rank < 0 || rank >= dir->nranks || type < R2CC_CTL_TYPE_USER ||
	    type >= R2CC_CTL_TYPE_MAX || (len && !payload))
		return -EINVAL;
	int rc = r2cc_ctl_start();
	if (rc == 0)
		rc = r2cc_ctl_job_ensure(&dir->job, false, &dir->self_rank, 1);
	if (rc)
		return rc;
	struct r2cc_ctl_hdr h = {
	    .type = type,
	    .job_id = dir->job.id,
	    .from_rank = dir->self_rank,
	    .to_rank = rank,
	};
	struct sockaddr_storage dst;
	rc = member_addr(dir, rank, 2000, &dst);
	if (rc)
		return rc;
	return r2cc_ctl_queue_out(&dst, dir->job.secret, &h, payload, len);
}

void r2cc_ctl_set_conn_per_rank(bool on)
{
	__atomic_store_n(&r2cc_ctl.conn_per_rank, on, __ATOMIC_RELAXED);
}

int r2cc_ctl_dir_split(const struct r2cc_ctl_dir *parent, const int *parent_ranks, int nranks,
		       int self_rank, uint64_t tag, struct r2cc_ctl_dir **child_p)
{
	struct r2cc_ctl_dir *child;
	int rc = r2cc_ctl_dir_derive(parent, parent_ranks, nranks, self_rank, tag, &child);
	if (rc)
		return rc;
	/* Known from now on, so that peers' frames for it are accepted. */
	rc = r2cc_ctl_job_ensure(&child->job, false, &child->self_rank, 1);
	if (rc) {
		r2cc_ctl_dir_free(child);
		return rc;
	}
	*child_p = child;
	return 0;
}

int r2cc_ctl_set_handler(uint16_t type, r2cc_ctl_handler_fn fn, void *arg)
{
	if (type < R2CC_CTL_TYPE_USER || type >= R2CC_CTL_TYPE_MAX)
		return -EINVAL;
	pthread_mutex_lock(&r2cc_ctl.lock);
	r2cc_ctl.handlers[type] = (struct handler){fn, arg};
	pthread_mutex_unlock(&r2cc_ctl.lock);
	return 0;
}

int r2cc_ctl_reply(struct r2cc_ctl_call *call, int status, const void *payload, size_t len)
{
	struct call_priv *cp = (struct call_priv *)((char *)call - offsetof(struct call_priv, pub));
	if (!call->is_request || cp->replied || !r2cc_ctl_on_thread())
		return -EINVAL;
	if (len > R2CC_CTL_MAX_PAYLOAD || (len && !payload))
		return -EMSGSIZE;
	cp->replied = true;
	return r2cc_ctl_send_reply(cp->conn, cp->key, call->job_id, cp->req_id, call->to_rank,
				   call->from_rank, status, payload, len);
}

/* Registration. */

static void send_cancel(const struct r2cc_ctl_job *job, int rank, uint32_t req_id)
{
	unsigned char b[8];
	r2cc_ctl_put_u32(b, (uint32_t)rank);
	r2cc_ctl_put_u32(b + 4, req_id);
	struct r2cc_ctl_hdr h = {
	    .type = CTL_T_CANCEL, .job_id = job->id, .from_rank = rank, .to_rank = -1};
	r2cc_ctl_queue_out(&job->rdv, job->secret, &h, b, sizeof(b));
}

/* Registers ranks[i] as member selves[i * stride] (stride 0: all the same). */
/* A request whose connection broke before its answer came: worth sending
 * again (a rendezvous flooded with connections refuses some of them). */
static bool conn_lost(int status)
{
	return status == -ECONNRESET || status == -ECONNREFUSED || status == -EPIPE ||
	       status == -ECONNABORTED || status == -ENOTCONN;
}

/* (Re)sends local rank i's registration; p is reset first. */
static void register_send(const struct r2cc_ctl_job *job, struct r2cc_ctl_member *selves,
			  size_t stride, const int *ranks, int i, int nranks, unsigned char *msg,
			  struct pending *p)
{
	struct r2cc_ctl_member *self =
	    (struct r2cc_ctl_member *)((char *)selves + (size_t)i * stride);
	free(p->buf);
	*p = (struct pending){.peer_rank = -1, .grow = true};
	r2cc_ctl_local_addr(&self->ctl_addr);
	int mlen = r2cc_ctl_member_encode(self, msg + 8, R2CC_CTL_MEMBER_MAX_ENC);
	if (mlen < 0) {
		p->done = true;
		p->status = mlen;
		return;
	}
	r2cc_ctl_put_u32(msg, (uint32_t)ranks[i]);
	r2cc_ctl_put_u32(msg + 4, (uint32_t)nranks);
	struct r2cc_ctl_hdr h = {.type = CTL_T_REGISTER, .from_rank = ranks[i], .to_rank = -1};
	request_begin(p, &job->rdv, job, &h, msg, 8 + (size_t)mlen);
}

/* Until every registration is answered, one has lost its connection, or the
 * deadline; returns how many lost their connection. */
static int register_wait(struct pending *p, int n, const struct timespec *deadline)
{
	int lost = 0;
	pthread_mutex_lock(&r2cc_ctl.lock);
	for (;;) {
		int done = 0;
		lost = 0;
		for (int i = 0; i < n; i++) {
			done += p[i].done;
			lost += p[i].done && conn_lost(p[i].status);
		}
		if (done == n || lost ||
		    pthread_cond_timedwait(&r2cc_ctl.done_cv, &r2cc_ctl.lock, deadline) ==
			ETIMEDOUT)
			break;
	}
	pthread_mutex_unlock(&r2cc_ctl.lock);
	return lost;
}

static int register_impl(const struct r2cc_ctl_job *job, struct r2cc_ctl_member *selves,
			 size_t stride, const int *ranks, int nlocal, int nranks, int timeout_ms,
			 struct r2cc_ctl_dir **dirs_p)
{
	if (!job || !selves || !ranks || !dirs_p || nlocal < 1 || nranks < 1 ||
	    nranks > R2CC_CTL_MAX_RANKS || nlocal > nranks || timeout_ms < 0)
		return -EINVAL;
	unsigned char *seen = calloc((size_t)nranks, 1);
	if (!seen)
		return -ENOMEM;
	for (int i = 0; i < nlocal; i++) {
		if (ranks[i] < 0 || ranks[i] >= nranks || seen[ranks[i]]) {
			free(seen);
			return -EINVAL;
		}
		seen[ranks[i]] = 1;
	}
	free(seen);
	if (r2cc_ctl_on_thread())
		return -EDEADLK;
	int rc = r2cc_ctl_start();
	if (rc == 0)
		rc = r2cc_ctl_job_ensure(job, false, ranks, nlocal);
	if (rc)
		return rc;
	unsigned char *msg = malloc(8 + R2CC_CTL_MEMBER_MAX_ENC);
	struct pending *p = calloc((size_t)nlocal, sizeof(*p));
	if (!msg || !p) {
		rc = -ENOMEM;
		goto out_free;
	}
	struct timespec deadline;
	deadline_after(&deadline, timeout_ms);
	for (int i = 0; i < nlocal; i++)
		register_send(job, selves, stride, ranks, i, nranks, msg, &p[i]);
	/* Those whose connection broke are sent again, after a pause that grows
	 * (with some jitter, so that many ranks do not come back at once). */
	unsigned seed = (unsigned)getpid() ^ (unsigned)r2cc_ctl_now_ms();
	int pause_ms = 20;
	for (;;) {
		int lost = register_wait(p, nlocal, &deadline);
		if (!lost || ms_left(&deadline) <= 2 * pause_ms)
			break;
		usleep((useconds_t)(pause_ms + (int)(rand_r(&seed) % (unsigned)pause_ms)) * 1000);
		pause_ms = pause_ms < 500 ? 2 * pause_ms : 1000;
		for (int i = 0; i < nlocal; i++) {
			pthread_mutex_lock(&r2cc_ctl.lock);
			bool again = p[i].done && conn_lost(p[i].status);
			if (again)
				r2cc_ctl_pending_unlink_locked(&p[i]);
			pthread_mutex_unlock(&r2cc_ctl.lock);
			if (again)
				register_send(job, selves, stride, ranks, i, nranks, msg, &p[i]);
		}
	}
	for (int i = 0; i < nlocal; i++) {
		int r = request_wait(&p[i], &deadline);
		if (r == -ETIMEDOUT)
			send_cancel(job, ranks[i], p[i].req_id);
		if (r && !rc)
			rc = r;
	}
	for (int i = 0; i < nlocal && rc == 0; i++) {
		rc = r2cc_ctl_dir_decode(p[i].buf, p[i].len, job, ranks[i], &dirs_p[i]);
		if (rc == -EPROTO)
			r2cc_ctl_count_drop(R2CC_CTL_DROP_MALFORMED, NULL);
		if (rc)
			while (i-- > 0)
				r2cc_ctl_dir_free(dirs_p[i]);
	}
	if (rc) {
		char a[64];
		R2CC_WARN("control plane: registration of rank %d/%d with %s failed: %s", ranks[0],
			  nranks, r2cc_ctl_addr_str(&job->rdv, a, sizeof(a)), strerror(-rc));
	}
out_free:
	for (int i = 0; p && i < nlocal; i++)
		free(p[i].buf);
	free(p);
	free(msg);
	return rc;
}

int r2cc_ctl_register_ranks(const struct r2cc_ctl_job *job, struct r2cc_ctl_member *self,
			    const int *ranks, int nlocal, int nranks, int timeout_ms,
			    struct r2cc_ctl_dir **dirs_p)
{
	return register_impl(job, self, 0, ranks, nlocal, nranks, timeout_ms, dirs_p);
}

int r2cc_ctl_register_each(const struct r2cc_ctl_job *job, struct r2cc_ctl_member *members,
			   const int *ranks, int nlocal, int nranks, int timeout_ms,
			   struct r2cc_ctl_dir **dirs_p)
{
	return register_impl(job, members, sizeof(*members), ranks, nlocal, nranks, timeout_ms,
			     dirs_p);
}

int r2cc_ctl_register(const struct r2cc_ctl_job *job, struct r2cc_ctl_member *self, int rank,
		      int nranks, int timeout_ms, struct r2cc_ctl_dir **dir_p)
{
	return r2cc_ctl_register_ranks(job, self, &rank, 1, nranks, timeout_ms, dir_p);
}
