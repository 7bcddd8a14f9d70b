/*
 * Far probes: a witness beyond the node for a NIC's self-test (repair/localise.c).
 *
 * A self-test through one sibling cannot tell which of the two NICs died once the
 * live one's traffic stops behind the dead one's: each test of the pair fails the
 * other's; and a sibling whose own data waits on the dead NIC (a ring) completes
 * nothing and is no witness however many there are. A far probe asks the peer process of one of the
 * NIC's connections for a responder QP on that connection's peer NIC, p, for each of two requester
 * QPs of this process: one on the suspect NIC a, one on its sibling b. a's QP takes the data's own
 * path (NCCL's GID index, traffic class, SL, flow label, MTU); b's the matching GID of b. A
 * zero-byte write on each is answered by p's hardware: an answer to a's proves a alive; silence
 * from a while b's is answered proves b and p alive and reachable, so a, silent to both b and p, is
 * the dead one. Silence from both says nothing about a (p may be the dead one; its own process
 * tests it).
 *
 * The set-up is one message each way over the control plane (OP_FAR_REQ, OP_FAR_REP
 * in the repair exchange's wire format), made once per NIC and peer and kept: a
 * test is then a post and a poll. The first is made before any failure, when the
 * stall scan sees a NIC with a sibling whose connections' peers are known
 * (r2cc_far_warm); no probe is sent then. The responder keeps at most
 * FAR_SERVED_MAX QPs for other processes' tests, the oldest going first; a QP it
 * dropped makes that peer's far probes silent, which never fails a NIC (it only
 * takes the witness away).
 */
#include "repair/engine_priv.h"

#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAR_SERVED_MAX	 64
#define FAR_CANDIDATES	 8
#define FAR_RETRY_NS	 20000000ll   /* a warm-up that found nothing is tried again after, */
#define FAR_RETRY_MAX_NS 2000000000ll /* doubling up to this */
#define FAR_REQ_WAIT_MS	 200	      /* the longest wait for a peer's answer to a set-up */

/* Per NIC (registry index): the far pairs its tests use. Only the NIC's own test
 * thread touches them (one runs at a time); ready is read by the stall scan. */
static struct far_nic {
	struct far_pair p[R2CC_FAR_PEERS];
	int ready;	  /* atomic: pairs set up (0..R2CC_FAR_PEERS) */
	int64_t next_try; /* atomic: no warm-up before */
	int64_t retry;	  /* the wait after a warm-up that made none (its thread) */
} far_nic[R2CC_STALL_MAX_NICS];

/* Set-ups waiting for their OP_FAR_REP. */
static pthread_mutex_t far_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t far_cv = PTHREAD_COND_INITIALIZER;
static struct far_wait {
	uint64_t id;
	bool done;
	int status;
	uint32_t qpn;
} far_waits[2 * R2CC_STALL_MAX_NICS];
static uint64_t far_next_id;

/* Responder QPs kept for other processes' tests (repair thread only). */
static struct far_served {
	struct ibv_qp *qp;
	int64_t made;
} far_served[FAR_SERVED_MAX];
static struct ibv_cq *far_served_cq[R2CC_STALL_MAX_NICS];

/* A connection of a to probe its peer NIC through: what the set-up needs of it,
 * copied under r2cc_eng.mu. */
struct far_cand {
	struct r2cc_peer_ep ours, theirs;
	struct r2cc_qp q; /* NCCL's QP's path, peer and MTU (nothing else is copied) */
};

struct far_scan {
	const struct r2cc_nic *a;
	int n;
	struct far_cand c[FAR_CANDIDATES];
};

static bool far_candidate(const struct r2cc_rqp *r, const void *arg)
{
	/* A test thread, under r2cc_eng.mu: only what the repair thread does not change
	 * meanwhile, or changes atomically (the NIC a QP is on, its state); what NCCL set
	 * by RTR is published by the ready flag. */
	struct far_scan *s = (struct far_scan *)arg;
	const struct r2cc_qp *q = r2cc_rqp_qp(r);
	if (!q || __atomic_load_n(&r->cur_nic, __ATOMIC_ACQUIRE) != s->a || r->orig_nic != s->a ||
	    load_state(r) != RQ_HEALTHY || !__atomic_load_n(&r->ready, __ATOMIC_ACQUIRE) ||
	    !r->tracked || r2cc_peer_ep_equal(&r->ep_local, &r->ep_remote))
		return false;
	struct r2cc_qp path;
	memset(&path, 0, sizeof(path));
	path.path = q->path;
	path.peer = q->peer;
	path.path_mtu = q->path_mtu;
	/* distinct peer NICs only */
	for (int i = 0; i < s->n; i++)
		if (s->c[i].q.peer.lid == q->peer.lid &&
		    !memcmp(s->c[i].q.peer.gid.raw, q->peer.gid.raw, 16))
			return false;
	if (s->n < FAR_CANDIDATES)
		s->c[s->n++] = (struct far_cand){r->ep_local, r->ep_remote, path};
	return false;
}

static void far_pair_free(struct far_pair *p)
{
	for (int j = 0; j < 2; j++) {
		r2cc_destroy_private(p->qp[j], p->cq[j]);
		p->qp[j] = NULL;
		p->cq[j] = NULL;
	}
	p->b = NULL;
	p->dir = NULL;
}

/* A QP of a far pair on nic (in its mirror PD), on cq, in INIT with NCCL's partition
 * key index of q; *qp is set as soon as it exists. 0 or a negative errno. */
static int far_qp_on(struct r2cc_nic *nic, struct ibv_cq *cq, const struct r2cc_qp *q,
		     struct ibv_qp **qp)
{
	struct ibv_pd *pd = r2cc_mr_mirror_pd(nic);
	if (!pd)
		return -ENODEV;
	struct ibv_qp_init_attr ia = {
	    .send_cq = cq,
	    .recv_cq = cq,
	    .qp_type = IBV_QPT_RC,
	    .cap = {.max_send_wr = 2, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
	*qp = r2cc_eng.v.create_qp(pd, &ia);
	if (!*qp)
		return -ENOMEM;
	r2cc_own_add(*qp);
	return r2cc_own_qp_init(*qp, nic, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
				q->path.pkey_index);
}

/* Our end of a pair on via, in INIT, on its own CQ. */
static int far_qp_new(struct r2cc_nic *via, const struct r2cc_qp *q, struct ibv_qp **qp,
		      struct ibv_cq **cq)
{
	struct r2cc_ctx *c = r2cc_ctx_of_nic(via);
	if (!c)
		return -ENODEV;
	*cq = r2cc_eng.v.create_cq(c->ctx, 4, NULL, NULL, 0);
	if (!*cq)
		return -ENOMEM;
	r2cc_own_add(*cq);
	return far_qp_on(via, *cq, q, qp);
}

/* A far pair's link with NCCL's path attributes of q (class, flow label, hop limit,
 * SL), towards qpn at lid (and gid, with a GRH) from our GID index sgid_index. The
 * transport's timeouts are the self-test's (repair/localise.c, selftest_connect). */
static struct qp_link far_link(const struct r2cc_qp *q, uint32_t qpn, uint16_t lid,
			       const uint8_t *gid, int sgid_index, int mtu)
{
	return (struct qp_link){
	    .qpn = qpn,
	    .lid = lid,
	    .mtu = (enum ibv_mtu)mtu,
	    .gid = gid,
	    .sgid_index = (uint8_t)sgid_index,
	    .hop_limit = q->path.hop_limit,
	    .traffic_class = q->path.traffic_class,
	    .flow_label = q->path.flow_label,
	    .sl = q->path.sl,
	    .timeout = 18,
	    .retry_cnt = 7,
	    .rnr_retry = 7,
	};
}

/* Asks the peer for a responder QP on its NIC of connection c, for our QP qp on
 * via (whose source GID there is gid); waits for its answer. 0 and *qpn, or a
 * negative errno. The test thread. */
static int far_ask(const struct r2cc_ctl_dir *dir, int rank, const struct far_cand *c,
		   struct r2cc_nic *via, struct ibv_qp *qp, const uint8_t *gid, uint32_t *qpn)
{
	struct far_wait *w = NULL;
	pthread_mutex_lock(&far_mu);
	for (size_t i = 0; i < sizeof(far_waits) / sizeof(far_waits[0]) && !w; i++)
		if (!far_waits[i].id)
			w = &far_waits[i];
	if (w) {
		w->id = ++far_next_id;
		w->done = false;
	}
	pthread_mutex_unlock(&far_mu);
	if (!w)
		return -EBUSY;
	struct rep_wire m;
	memset(&m, 0, sizeof(m));
	m.op = OP_FAR_REQ;
	m.pair_id = htole64(w->id);
	r2cc_peer_ep_put(&c->ours, m.src);
	r2cc_peer_ep_put(&c->theirs, m.dst);
	m.new_qpn = htole32(qp->qp_num);
	m.new_lid = htole16(via->lid);
	m.new_port = via->port ? via->port : 1;
	m.new_mtu = (uint8_t)(c->q.path_mtu ? c->q.path_mtu : IBV_MTU_1024);
	memcpy(m.new_gid, gid, 16);
	snprintf(m.new_nic, sizeof(m.new_nic), "%s", via->name);
	int rc = r2cc_wire_send(dir, rank, &m, 1, NULL, 0);
	/* in slices of 10 ms, so that a process that exits does not wait on its peers */
	pthread_mutex_lock(&far_mu);
	for (int waited = 0; !rc && !w->done; waited += 10) {
		if (waited >= FAR_REQ_WAIT_MS ||
		    __atomic_load_n(&r2cc_eng.stop, __ATOMIC_RELAXED)) {
			rc = -ETIMEDOUT;
			break;
		}
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += 10000000L;
		until.tv_sec += until.tv_nsec / 1000000000L;
		until.tv_nsec %= 1000000000L;
		pthread_cond_timedwait(&far_cv, &far_mu, &until);
	}
	if (!rc) {
		rc = w->status;
		*qpn = w->qpn;
	}
	w->id = 0;
	pthread_mutex_unlock(&far_mu);
	return rc;
}

/* One pair towards the peer NIC of c: a's QP and b's, each with a responder there. */
static int far_pair_build(struct far_pair *p, struct r2cc_nic *a, struct r2cc_nic *b,
			  const struct far_cand *c, const struct r2cc_ctl_dir *dir, int rank)
{
	const struct r2cc_qp *q = &c->q;
	struct r2cc_nic *via[2] = {a, b};
	p->dir = dir;
	p->rank = rank;
	p->theirs = c->theirs;
	p->b = b;
	for (int j = 0; j < 2; j++) {
		/* our source GID as the peer addresses it: with a GRH, NCCL's on a and the
		 * matching one on b; without, the NIC's own */
		union ibv_gid sgid;
		int sgid_index = q->path.sgid_index;
		memcpy(sgid.raw, q->peer.has_grh ? q->peer.sgid.raw : via[j]->gid.raw, 16);
		if (j == 1 && q->peer.has_grh) {
			struct r2cc_ctx *cb = r2cc_ctx_of_nic(b);
			sgid_index =
			    cb ? r2cc_path_match_sgid(cb, b->port ? b->port : 1, q, &sgid) : -1;
			if (sgid_index < 0)
				return -ENOENT;
		}
		uint32_t qpn = 0;
		int rc = far_qp_new(via[j], q, &p->qp[j], &p->cq[j]);
		if (!rc)
			rc = far_ask(dir, rank, c, via[j], p->qp[j], sgid.raw, &qpn);
		if (rc)
			return rc;
		struct qp_link l =
		    far_link(q, qpn, q->peer.lid, q->peer.has_grh ? q->peer.gid.raw : NULL,
			     sgid_index, q->path_mtu ? q->path_mtu : IBV_MTU_1024);
		rc = r2cc_own_qp_connect(p->qp[j], via[j], &l);
		if (rc)
			return rc;
	}
	return 0;
}

/* Counts a's pairs in use into ready (what the stall scan reads); returns it. */
static int far_count(struct far_nic *f)
{
	int n = 0;
	for (int k = 0; k < R2CC_FAR_PEERS; k++)
		n += f->p[k].dir != NULL;
	__atomic_store_n(&f->ready, n, __ATOMIC_RELAXED);
	return n;
}

/*
 * The far pairs of a's test through its sibling b: those kept (through b, the
 * NICs involved not failed since), and with build (the warm-up), completed up to
 * R2CC_FAR_PEERS with new ones to the peer NICs of a's connections. A stall test
 * only takes what is ready: a set-up waits on the peer.
 * Returns how many are ready. The NIC's test thread.
 */
int r2cc_far_prepare(struct r2cc_nic *a, struct r2cc_nic *b, struct far_pair **out, bool build)
{
	int i = a->index;
	if (i < 0 || i >= R2CC_STALL_MAX_NICS || !b)
		return 0;
	struct far_nic *f = &far_nic[i];
	int ready = 0;
	for (int k = 0; k < R2CC_FAR_PEERS; k++) {
		struct far_pair *p = &f->p[k];
		if (p->dir && (p->b != b || r2cc_nic_failure_at(i) >= p->built ||
			       r2cc_nic_failure_at(b->index) >= p->built))
			far_pair_free(p);
		if (p->dir)
			ready++;
	}
	if (build && ready < R2CC_FAR_PEERS) {
		struct far_scan s = {.a = a};
		struct r2cc_rqp **none;
		r2cc_rqp_collect(&none, far_candidate, &s);
		r2cc_rqp_collect_done(none);
		for (int c = 0; c < s.n && ready < R2CC_FAR_PEERS; c++) {
			const struct r2cc_ctl_dir *dir;
			int rank;
			if (r2cc_peer_of(&s.c[c].ours, &dir, &rank))
				continue;
			bool have = false;
			for (int k = 0; k < R2CC_FAR_PEERS; k++)
				have = have || (f->p[k].dir && r2cc_peer_ep_equal(&f->p[k].theirs,
										  &s.c[c].theirs));
			if (have)
				continue;
			struct far_pair *p = NULL;
			for (int k = 0; k < R2CC_FAR_PEERS && !p; k++)
				if (!f->p[k].dir)
					p = &f->p[k];
			if (!p)
				break;
			p->built = now_ns();
			if (far_pair_build(p, a, b, &s.c[c], dir, rank) == 0)
				ready++;
			else
				far_pair_free(p);
		}
	}
	int n = far_count(f);
	for (int k = 0, j = 0; k < R2CC_FAR_PEERS; k++)
		if (f->p[k].dir)
			out[j++] = &f->p[k];
	if (build) {
		f->retry = n ? 0 : f->retry ? 2 * f->retry : FAR_RETRY_NS;
		if (f->retry > FAR_RETRY_MAX_NS)
			f->retry = FAR_RETRY_MAX_NS;
		__atomic_store_n(&f->next_try, now_ns() + f->retry, __ATOMIC_RELAXED);
	}
	return n;
}

/* A pair whose probe did not come back successfully in a test is not kept (it
 * may hold a write that never completes). The NIC's test thread. */
void r2cc_far_drop(struct r2cc_nic *a, struct far_pair *p)
{
	far_pair_free(p);
	if (a->index >= 0 && a->index < R2CC_STALL_MAX_NICS)
		far_count(&far_nic[a->index]);
}

/* Whether a's tests have a far witness ready (any thread). */
bool r2cc_far_ready(const struct r2cc_nic *a)
{
	int i = a->index;
	return i >= 0 && i < R2CC_STALL_MAX_NICS &&
	       __atomic_load_n(&far_nic[i].ready, __ATOMIC_RELAXED) > 0;
}

/* The stall scan: a NIC with a sibling and without far pairs gets them made (no probe
 * sent); one that found no peer known yet is tried again after 20 ms, then twice
 * as long each time up to 2 s. Repair thread. */
void r2cc_far_warm(struct r2cc_nic *a)
{
	int i = a->index;
	if (i < 0 || i >= R2CC_STALL_MAX_NICS || r2cc_far_ready(a))
		return;
	int64_t t = now_ns(), next = __atomic_load_n(&far_nic[i].next_try, __ATOMIC_RELAXED);
	if (t < next ||
	    !__atomic_compare_exchange_n(&far_nic[i].next_try, &next, t + FAR_RETRY_MAX_NS, false,
					 __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		return;
	if (!r2cc_selftest_spawn_far(a)) /* a test of the NIC runs: soon again */
		__atomic_store_n(&far_nic[i].next_try, t + FAR_RETRY_NS, __ATOMIC_RELAXED);
}

/* Responder: a QP on this connection's NIC, connected to the requester's, for
 * its far probes; answered with OP_FAR_REP. Repair thread. */
static int far_serve_one(struct r2cc_rqp *r, const struct rep_wire *m, uint32_t *qpn)
{
	const struct r2cc_qp *q = r2cc_rqp_qp(r);
	struct r2cc_nic *nic = r->orig_nic;
	int i = nic ? nic->index : -1;
	if (!q || r->cur_nic != nic || load_state(r) != RQ_HEALTHY || i < 0 ||
	    i >= R2CC_STALL_MAX_NICS ||
	    __atomic_load_n(&nic->state, __ATOMIC_RELAXED) != R2CC_NIC_UP)
		return -EAGAIN;
	struct r2cc_ctx *c = r2cc_ctx_of_nic(nic);
	if (!c)
		return -ENODEV;
	if (!far_served_cq[i]) {
		far_served_cq[i] = r2cc_eng.v.create_cq(c->ctx, 4, NULL, NULL, 0);
		if (!far_served_cq[i])
			return -ENOMEM;
		r2cc_own_add(far_served_cq[i]);
	}
	struct ibv_qp *qp = NULL;
	int mtu = q->path_mtu ? q->path_mtu : IBV_MTU_1024;
	struct qp_link l = far_link(q, le32toh(m->new_qpn), le16toh(m->new_lid),
				    q->peer.has_grh ? m->new_gid : NULL, q->path.sgid_index,
				    m->new_mtu && m->new_mtu < mtu ? m->new_mtu : mtu);
	int rc = far_qp_on(nic, far_served_cq[i], q, &qp);
	if (!rc)
		rc = r2cc_own_qp_connect(qp, nic, &l);
	if (rc) {
		r2cc_destroy_private(qp, NULL);
		return rc;
	}
	/* a free slot, else the oldest */
	int k = 0;
	for (int j = 0; j < FAR_SERVED_MAX && far_served[k].qp; j++)
		if (!far_served[j].qp || far_served[j].made < far_served[k].made)
			k = j;
	if (far_served[k].qp)
		r2cc_destroy_private(far_served[k].qp, NULL);
	far_served[k] = (struct far_served){qp, now_ns()};
	*qpn = qp->qp_num;
	return 0;
}

void r2cc_far_serve(const struct inbox *in, struct r2cc_rqp **rq, const struct r2cc_ctl_dir *dir)
{
	for (int i = 0; i < in->n; i++) {
		const struct rep_wire *m = &in->m[i];
		if (!rq[i] || m->op != OP_FAR_REQ)
			continue;
		uint32_t qpn = 0;
		int rc = far_serve_one(rq[i], m, &qpn);
		struct rep_wire a;
		r2cc_wire_fill(&a, OP_FAR_REP, rq[i]); /* both ends, as the request named them */
		a.pair_id = m->pair_id;		       /* the request's, not the connection's */
		a.status = (int32_t)htole32((uint32_t)rc);
		a.new_qpn = htole32(qpn);
		r2cc_wire_send(dir, in->from_rank, &a, 1, NULL, 0);
	}
}

/* Requester: a peer's answer to a set-up wakes its test thread. Repair thread. */
void r2cc_far_answered(const struct inbox *in, struct r2cc_rqp **rq)
{
	pthread_mutex_lock(&far_mu);
	for (int i = 0; i < in->n; i++) {
		const struct rep_wire *m = &in->m[i];
		uint64_t id = le64toh(m->pair_id);
		if (!rq[i] || m->op != OP_FAR_REP || !id)
			continue;
		for (size_t k = 0; k < sizeof(far_waits) / sizeof(far_waits[0]); k++)
			if (far_waits[k].id == id && !far_waits[k].done) {
				far_waits[k].done = true;
				far_waits[k].status = (int32_t)le32toh((uint32_t)m->status);
				far_waits[k].qpn = le32toh(m->new_qpn);
			}
	}
	pthread_cond_broadcast(&far_cv);
	pthread_mutex_unlock(&far_mu);
}
