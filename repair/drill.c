/*
 * R2CC_DRILL's runtime (repair/drill.h). One mutex (drill.mu) guards everything
 * here; it is a leaf: nothing is called under it that takes another R2CC lock
 * (the verbs calls under it are the provider's own). Hot repair's locks may be
 * held when the filters and r2cc_drill_cut() take it.
 */
#include "repair/drill.h"
#include "repair/engine_priv.h"
#include "shim/drillspec.h"
#include "shim/report.h"
#include "shim/stats.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int r2cc_drill_on;
int r2cc_drill_wait_collective;

#define LOSE_REQ_TX 1u
#define LOSE_REQ_RX 2u
#define LOSE_ACK_TX 4u
#define LOSE_ACK_RX 8u
#define LOSE_ALL    15u
#define MAX_ADDRS   16	/* LIDs and GIDs one drilled NIC is reached by */
#define MAX_CTXS    256 /* device contexts a process opens */
#define MAX_KEPT    65536
#define TICK_NS	    2000000ll

/* What the wire of a drilled NIC does now. */
struct target {
	int node; /* index, or -1: host */
	char host[R2CC_DRILL_NAME_MAX];
	char nic[R2CC_DRILL_NAME_MAX];
	int kind;      /* the last step's kind (R2CC_DRILL_UP: none) */
	int flap_ms;   /* flap: half period */
	int64_t since; /* when that step applied */
	bool down_now; /* down, or flap in a down half */
	int mine;      /* -1 unknown, 0 another node, 1 this node */
	bool resolved; /* mine and addr known (ahead of its steps: incidents on its paths
			* are a drill's even where this process's own step comes later) */
	bool cuts;     /* a step of the plan cuts it (not only up) */
	struct r2cc_ctl_nicaddr addr[MAX_ADDRS];
	int naddr;
};

struct step_state {
	int state; /* 0 pending, 1 applied, 2 unresolved */
	int64_t applied_ns;
	double applied_unix;
	int qps;
	char why[160];
};

struct held {
	struct ibv_send_wr wr;
	struct ibv_sge *sge;
	void *inline_data;
};

struct dqp {
	struct ibv_qp *qp;
	struct ibv_context *ctx;
	uint32_t qpn;
	struct r2cc_nic *nic;
	struct r2cc_ctl_nicaddr remote;
	int state;
	uint8_t timeout, retry_cnt;
	bool cut;	 /* a step ever cut it */
	bool hold, hide; /* see drill.h */
	bool down;	 /* moved to ERR by a down step */
	bool flushing;	 /* in ERR: what the hardware still completes is flushed */
	bool retry_first;
	int64_t since;
	struct held *held;
	int nheld, capheld;
	struct ibv_wc *kept;
	int nkept, capkept;
};

struct inject {
	struct ibv_cq *cq;
	struct ibv_wc *v;
	int head, n, cap;
};

static struct {
	pthread_mutex_t mu;
	pthread_cond_t cond;
	struct r2cc_drill_plan plan;
	struct step_state st[R2CC_DRILL_MAX_STEPS];
	bool pre[R2CC_DRILL_MAX_STEPS]; /* its target was resolved ahead of its time */
	struct target tg[R2CC_DRILL_MAX_STEPS];
	int ntg;
	int64_t t0_init, t0_coll;
	bool thread_started;
	struct r2cc_hmap by_qp, by_num, inj;
	struct ibv_context *ctxs[MAX_CTXS];
	int nctx;
	int active; /* entries with hold, hide, flushing, or injections pending */
	int applied;
	char plan_str[2048];
} drill = {.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static unsigned kind_loss(int kind, bool down_now)
{
	switch (kind) {
	case R2CC_DRILL_DOWN:
	case R2CC_DRILL_BLACKHOLE:
		return LOSE_ALL;
	case R2CC_DRILL_FLAP:
		return down_now ? LOSE_ALL : 0;
	case R2CC_DRILL_BLACKHOLE_TX:
		return LOSE_REQ_TX | LOSE_ACK_TX;
	case R2CC_DRILL_BLACKHOLE_RX:
		return LOSE_REQ_RX | LOSE_ACK_RX;
	case R2CC_DRILL_ACKLOSS:
		return LOSE_ACK_TX | LOSE_ACK_RX;
	default:
		return 0;
	}
}

static bool host_matches(const char *want, const char *host)
{
	size_t n = strcspn(want, "."), m = strcspn(host, ".");
	return !strcmp(want, host) || (n == m && !strncmp(want, host, n));
}

static uint64_t num_key(struct ibv_context *ctx, uint32_t qpn)
{
	int i;
	for (i = 0; i < drill.nctx; i++)
		if (drill.ctxs[i] == ctx)
			break;
	if (i == drill.nctx) {
		if (drill.nctx == MAX_CTXS)
			return 0;
		drill.ctxs[drill.nctx++] = ctx;
	}
	return ((uint64_t)(i + 1) << 32) | qpn;
}

static struct dqp *by_num(struct ibv_context *ctx, uint32_t qpn)
{
	uint64_t k = num_key(ctx, qpn);
	return k ? r2cc_hmap_get(&drill.by_num, k) : NULL;
}

static bool addr_eq(const struct r2cc_ctl_nicaddr *a, const struct r2cc_ctl_nicaddr *b)
{
	return a->kind && a->kind == b->kind && !memcmp(a->bytes, b->bytes, sizeof(a->bytes));
}

static void addr_lid(struct r2cc_ctl_nicaddr *a, uint16_t lid)
{
	memset(a, 0, sizeof(*a));
	a->kind = R2CC_CTL_NICADDR_LID;
	a->bytes[0] = (uint8_t)(lid >> 8);
	a->bytes[1] = (uint8_t)lid;
}

static void addr_gid(struct r2cc_ctl_nicaddr *a, const union ibv_gid *g)
{
	memset(a, 0, sizeof(*a));
	a->kind = R2CC_CTL_NICADDR_GID;
	memcpy(a->bytes, g->raw, 16);
}

static void target_add_addr(struct target *t, const struct r2cc_ctl_nicaddr *a)
{
	if (!a->kind)
		return;
	for (int i = 0; i < t->naddr; i++)
		if (addr_eq(&t->addr[i], a))
			return;
	if (t->naddr < MAX_ADDRS)
		t->addr[t->naddr++] = *a;
}

/* --- what a queue pair sees --------------------------------------------------- */

static bool is_local(const struct target *t, const struct dqp *d)
{
	return t->mine == 1 && d->nic && !strcmp(d->nic->name, t->nic);
}

static bool is_remote(const struct target *t, const struct dqp *d)
{
	for (int i = 0; i < t->naddr; i++)
		if (addr_eq(&t->addr[i], &d->remote))
			return true;
	return false;
}

static struct inject *inject_of(struct ibv_cq *cq, bool make)
{
	struct inject *in = r2cc_hmap_get(&drill.inj, (uint64_t)(uintptr_t)cq);
	if (in || !make)
		return in;
	in = calloc(1, sizeof(*in));
	if (!in)
		return NULL;
	in->cq = cq;
	if (r2cc_hmap_put(&drill.inj, (uint64_t)(uintptr_t)cq, in)) {
		free(in);
		return NULL;
	}
	return in;
}

static void inject_push(struct ibv_cq *cq, const struct ibv_wc *wc)
{
	struct inject *in = inject_of(cq, true);
	if (!in)
		return;
	if (in->head + in->n == in->cap) {
		if (in->head) {
			memmove(in->v, in->v + in->head, (size_t)in->n * sizeof(*in->v));
			in->head = 0;
		} else {
			int cap = in->cap ? 2 * in->cap : 64;
			struct ibv_wc *v = realloc(in->v, (size_t)cap * sizeof(*v));
			if (!v)
				return;
			in->v = v;
			in->cap = cap;
		}
	}
	if (!in->n)
		__atomic_add_fetch(&drill.active, 1, __ATOMIC_RELAXED);
	in->v[in->head + in->n++] = *wc;
}

static void held_free(struct held *h)
{
	free(h->sge);
	free(h->inline_data);
}

/* Post what was held, in order, to the hardware; a request the hardware refuses
 * completes as flushed. */
static void held_release(struct dqp *d, r2cc_post_send_fn post)
{
	for (int i = 0; i < d->nheld; i++) {
		struct held *h = &d->held[i];
		struct ibv_send_wr *bad;
		h->wr.next = NULL;
		if (!post || post(d->qp, &h->wr, &bad)) {
			struct ibv_wc wc = {
			    .wr_id = h->wr.wr_id, .status = IBV_WC_WR_FLUSH_ERR, .qp_num = d->qpn};
			inject_push(d->qp->send_cq, &wc);
		}
		held_free(h);
	}
	d->nheld = 0;
}

/* What was kept back completes: as it did (acknowledged at last), or flushed. */
static void kept_release(struct dqp *d, bool flushed, bool first_retry)
{
	for (int i = 0; i < d->nkept; i++) {
		struct ibv_wc wc = d->kept[i];
		if (flushed) {
			wc.status =
			    first_retry && i == 0 ? IBV_WC_RETRY_EXC_ERR : IBV_WC_WR_FLUSH_ERR;
			wc.byte_len = 0;
		}
		inject_push(d->qp->send_cq, &wc);
	}
	d->nkept = 0;
}

static void set_active(struct dqp *d, bool was)
{
	bool now = d->hold || d->hide || d->flushing;
	if (now != was)
		__atomic_add_fetch(&drill.active, now ? 1 : -1, __ATOMIC_RELAXED);
}

static int (*real_modify)(struct ibv_qp *, struct ibv_qp_attr *, int);

static r2cc_post_send_fn wire_send(struct ibv_context *ctx)
{
	struct r2cc_ctx *c = r2cc_ctx_find(ctx);
	return c ? (c->wire_post_send ? c->wire_post_send : c->post_send) : NULL;
}

static int f_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int f_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
static int f_poll_cq(struct ibv_cq *cq, int num, struct ibv_wc *wc);

/* The context's post and poll go through the drill from now on. */
static void install(struct ibv_context *ctx)
{
	struct r2cc_ctx *c = r2cc_ctx_find(ctx);
	if (!c || c->wire_post_send)
		return;
	c->wire_post_send = c->post_send;
	c->wire_post_recv = c->post_recv;
	c->wire_poll_cq = c->poll_cq;
	__atomic_store_n(&c->post_send, f_post_send, __ATOMIC_RELEASE);
	__atomic_store_n(&c->post_recv, f_post_recv, __ATOMIC_RELEASE);
	__atomic_store_n(&c->poll_cq, f_poll_cq, __ATOMIC_RELEASE);
}

/* Moves d to ERR (the real call) and lets go of what it held and kept back. */
static void to_error(struct dqp *d, bool retry)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
	bool was = d->hold || d->hide || d->flushing;
	if (d->state != IBV_QPS_ERR && real_modify)
		real_modify(d->qp, &a, IBV_QP_STATE);
	d->state = IBV_QPS_ERR;
	bool kept = d->nkept > 0;
	kept_release(d, true, retry);
	if (retry && !kept)
		d->retry_first = true;
	held_release(d, wire_send(d->ctx));
	d->hold = d->hide = false;
	d->flushing = true;
	d->since = 0;
	set_active(d, was);
}

/* Applies the targets' state now to d: what it holds and keeps back, a down. At a
 * down step (at_step) the queue pairs connected on the NIC go to ERR; one connected
 * while it is down only loses its traffic (a port that is down takes a connect as
 * a real one does, and its requests go nowhere). */
static void recompute(struct dqp *d, bool at_step)
{
	unsigned local = 0, remote = 0;
	bool down_local = false;
	for (int i = 0; i < drill.ntg; i++) {
		const struct target *t = &drill.tg[i];
		unsigned l = kind_loss(t->kind, t->down_now);
		if (!l)
			continue;
		if (is_local(t, d)) {
			local |= l;
			down_local |= t->down_now;
		}
		if (is_remote(t, d))
			remote |= l;
	}
	bool connected = d->state == IBV_QPS_RTR || d->state == IBV_QPS_RTS;
	if (!connected)
		return; /* a dead or unconnected QP: the hardware does what there is to do */
	if (down_local && at_step) {
		d->cut = d->down = true;
		install(d->ctx);
		to_error(d, false);
		return;
	}
	bool out = (local & LOSE_REQ_TX) || (remote & LOSE_REQ_RX);
	bool ack = (remote & LOSE_ACK_TX) || (local & LOSE_ACK_RX);
	bool was = d->hold || d->hide || d->flushing;
	if (out || ack) {
		d->cut = true;
		install(d->ctx);
	}
	if (d->hold && !out)
		held_release(d, wire_send(d->ctx)); /* the link is back: the retries go out */
	if (d->hide && !(out || ack))
		kept_release(d, false, false); /* and are acknowledged */
	d->hold = out;
	d->hide = out || ack;
	if (!d->hold && !d->hide)
		d->since = 0;
	set_active(d, was);
}

static bool any_cutting(void)
{
	for (int i = 0; i < drill.ntg; i++)
		if (kind_loss(drill.tg[i].kind, drill.tg[i].down_now))
			return true;
	return false;
}

/* --- the data path's filters (installed by install()) ----------------------- */

static int f_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct r2cc_ctx *c = r2cc_ctx_find(qp->context);
	r2cc_post_send_fn real = c ? c->wire_post_send : NULL;
	if (!real) {
		*bad = wr;
		return EINVAL;
	}
	if (!__atomic_load_n(&drill.active, __ATOMIC_RELAXED))
		return real(qp, wr, bad);
	pthread_mutex_lock(&drill.mu);
	struct dqp *d = r2cc_hmap_get(&drill.by_qp, (uint64_t)(uintptr_t)qp);
	if (!d || !d->hold) {
		pthread_mutex_unlock(&drill.mu);
		return real(qp, wr, bad);
	}
	/* Held: the requests are lost on the wire, so they wait in the send queue as
	 * they would for their acknowledgement. Inline data is copied now. */
	int rc = 0;
	for (struct ibv_send_wr *w = wr; w; w = w->next) {
		if (d->nheld == d->capheld) {
			int cap = d->capheld ? 2 * d->capheld : 64;
			struct held *v =
			    cap <= MAX_KEPT ? realloc(d->held, (size_t)cap * sizeof(*v)) : NULL;
			if (!v) {
				rc = ENOMEM; /* as a full send queue */
				*bad = w;
				break;
			}
			d->held = v;
			d->capheld = cap;
		}
		struct held *h = &d->held[d->nheld];
		memset(h, 0, sizeof(*h));
		h->wr = *w;
		int n = w->num_sge > 0 ? w->num_sge : 0;
		if (w->send_flags & IBV_SEND_INLINE) {
			size_t len = 0;
			for (int i = 0; i < n; i++)
				len += w->sg_list[i].length;
			h->inline_data = malloc(len ? len : 1);
			h->sge = calloc(1, sizeof(*h->sge));
			if (!h->inline_data || !h->sge) {
				held_free(h);
				rc = ENOMEM;
				*bad = w;
				break;
			}
			size_t off = 0;
			for (int i = 0; i < n; i++) {
				memcpy((char *)h->inline_data + off,
				       (const void *)(uintptr_t)w->sg_list[i].addr,
				       w->sg_list[i].length);
				off += w->sg_list[i].length;
			}
			h->sge->addr = (uintptr_t)h->inline_data;
			h->sge->length = (uint32_t)len;
			h->wr.num_sge = n ? 1 : 0;
		} else if (n) {
			h->sge = malloc((size_t)n * sizeof(*h->sge));
			if (!h->sge) {
				rc = ENOMEM;
				*bad = w;
				break;
			}
			memcpy(h->sge, w->sg_list, (size_t)n * sizeof(*h->sge));
		}
		h->wr.sg_list = h->sge;
		h->wr.next = NULL;
		d->nheld++;
		if (!d->since)
			d->since = now_ns();
	}
	pthread_mutex_unlock(&drill.mu);
	return rc;
}

static int f_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct r2cc_ctx *c = r2cc_ctx_find(qp->context);
	r2cc_post_recv_fn real = c ? c->wire_post_recv : NULL;
	if (!real) {
		*bad = wr;
		return EINVAL;
	}
	return real(qp, wr, bad); /* receive queues are the NIC's own: nothing on the wire */
}

static int f_poll_cq(struct ibv_cq *cq, int num, struct ibv_wc *wc)
{
	struct r2cc_ctx *c = r2cc_ctx_find(cq->context);
	r2cc_poll_cq_fn real = c ? c->wire_poll_cq : NULL;
	if (!real)
		return -EINVAL;
	if (!__atomic_load_n(&drill.active, __ATOMIC_RELAXED))
		return real(cq, num, wc);
	int k = 0;
	pthread_mutex_lock(&drill.mu);
	struct inject *in = inject_of(cq, false);
	while (in && in->n && k < num) {
		wc[k++] = in->v[in->head++];
		if (!--in->n) {
			in->head = 0;
			__atomic_sub_fetch(&drill.active, 1, __ATOMIC_RELAXED);
		}
	}
	pthread_mutex_unlock(&drill.mu);
	if (k == num)
		return k;
	int got = real(cq, num - k, wc + k);
	if (got <= 0)
		return k ? k : got;
	pthread_mutex_lock(&drill.mu);
	int out = k;
	for (int i = k; i < k + got; i++) {
		struct dqp *d = by_num(cq->context, wc[i].qp_num);
		if (d && wc[i].status == IBV_WC_SUCCESS && !(wc[i].opcode & IBV_WC_RECV)) {
			if (d->flushing) {
				wc[i].status = IBV_WC_WR_FLUSH_ERR;
			} else if (d->hide && d->nkept < MAX_KEPT) {
				if (d->nkept == d->capkept) {
					int cap = d->capkept ? 2 * d->capkept : 64;
					struct ibv_wc *v =
					    realloc(d->kept, (size_t)cap * sizeof(*v));
					if (v) {
						d->kept = v;
						d->capkept = cap;
					}
				}
				if (d->nkept < d->capkept) {
					d->kept[d->nkept++] = wc[i];
					if (!d->since)
						d->since = now_ns();
					continue;
				}
			}
		} else if (d && wc[i].status != IBV_WC_SUCCESS && d->retry_first) {
			wc[i].status = IBV_WC_RETRY_EXC_ERR;
			d->retry_first = false;
		}
		if (out != i)
			wc[out] = wc[i];
		out++;
	}
	pthread_mutex_unlock(&drill.mu);
	return out;
}

/* --- control path -------------------------------------------------------------- */

int r2cc_drill_modify(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
		      int (*real)(struct ibv_qp *, struct ibv_qp_attr *, int))
{
	if (!real_modify)
		real_modify = real;
	bool to_err = (mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_ERR;
	pthread_mutex_lock(&drill.mu);
	struct dqp *d = r2cc_hmap_get(&drill.by_qp, (uint64_t)(uintptr_t)qp);
	if (d && to_err && (d->hold || d->hide || d->nheld || d->nkept)) {
		/* what was lost on the wire flushes with the rest */
		to_error(d, false);
		pthread_mutex_unlock(&drill.mu);
		return 0;
	}
	pthread_mutex_unlock(&drill.mu);
	int rc = real(qp, attr, mask);
	if (rc || !(mask & (IBV_QP_STATE | IBV_QP_AV | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT)))
		return rc;
	pthread_mutex_lock(&drill.mu);
	d = r2cc_hmap_get(&drill.by_qp, (uint64_t)(uintptr_t)qp);
	if (!d) {
		struct r2cc_ctx *c = r2cc_ctx_find(qp->context);
		uint64_t k = num_key(qp->context, qp->qp_num);
		d = c && k ? calloc(1, sizeof(*d)) : NULL;
		if (d) {
			d->qp = qp;
			d->ctx = qp->context;
			d->qpn = qp->qp_num;
			d->nic = c->nic;
			d->state = IBV_QPS_RESET;
			if (r2cc_hmap_put(&drill.by_qp, (uint64_t)(uintptr_t)qp, d)) {
				free(d);
				d = NULL;
			} else if (r2cc_hmap_put(&drill.by_num, k, d)) {
				r2cc_hmap_del(&drill.by_qp, (uint64_t)(uintptr_t)qp);
				free(d);
				d = NULL;
			}
		}
		if (!d)
			R2CC_WARN_ONCE("drill: out of memory recording a queue pair; the drill "
				       "cannot cut it");
	}
	if (d) {
		if (mask & IBV_QP_AV) {
			if (attr->ah_attr.is_global)
				addr_gid(&d->remote, &attr->ah_attr.grh.dgid);
			else
				addr_lid(&d->remote, attr->ah_attr.dlid);
		}
		if (mask & IBV_QP_TIMEOUT)
			d->timeout = attr->timeout;
		if (mask & IBV_QP_RETRY_CNT)
			d->retry_cnt = attr->retry_cnt;
		if (mask & IBV_QP_STATE) {
			bool was = d->hold || d->hide || d->flushing;
			d->state = attr->qp_state;
			if (d->state == IBV_QPS_RESET || d->state == IBV_QPS_ERR) {
				d->hold = d->hide = false;
				d->flushing = d->state == IBV_QPS_ERR && d->cut;
				d->since = 0;
			}
			set_active(d, was);
			/* connected while a fault is in effect: it has the fault too */
			if ((d->state == IBV_QPS_RTR || d->state == IBV_QPS_RTS) && any_cutting())
				recompute(d, false);
		}
	}
	pthread_mutex_unlock(&drill.mu);
	return rc;
}

static void purge_injected(struct ibv_cq *cq, uint32_t qpn)
{
	struct inject *in = cq ? inject_of(cq, false) : NULL;
	if (!in || !in->n)
		return;
	int out = 0;
	for (int i = 0; i < in->n; i++)
		if (in->v[in->head + i].qp_num != qpn)
			in->v[out++] = in->v[in->head + i];
	in->head = 0;
	in->n = out;
	if (!out)
		__atomic_sub_fetch(&drill.active, 1, __ATOMIC_RELAXED);
}

void r2cc_drill_qp_destroyed(struct ibv_qp *qp)
{
	pthread_mutex_lock(&drill.mu);
	struct dqp *d = r2cc_hmap_del(&drill.by_qp, (uint64_t)(uintptr_t)qp);
	if (d) {
		uint64_t k = num_key(d->ctx, d->qpn);
		if (k && r2cc_hmap_get(&drill.by_num, k) == d)
			r2cc_hmap_del(&drill.by_num, k);
		bool was = d->hold || d->hide || d->flushing;
		d->hold = d->hide = d->flushing = false;
		set_active(d, was);
		purge_injected(qp->send_cq, d->qpn);
		if (qp->recv_cq != qp->send_cq)
			purge_injected(qp->recv_cq, d->qpn);
		for (int i = 0; i < d->nheld; i++)
			held_free(&d->held[i]);
		free(d->held);
		free(d->kept);
		free(d);
	}
	pthread_mutex_unlock(&drill.mu);
}

void r2cc_drill_cq_destroyed(struct ibv_cq *cq)
{
	pthread_mutex_lock(&drill.mu);
	struct inject *in = r2cc_hmap_del(&drill.inj, (uint64_t)(uintptr_t)cq);
	if (in) {
		if (in->n)
			__atomic_sub_fetch(&drill.active, 1, __ATOMIC_RELAXED);
		free(in->v);
		free(in);
	}
	pthread_mutex_unlock(&drill.mu);
}

void r2cc_drill_port(struct ibv_context *ctx, struct ibv_port_attr *attr)
{
	struct r2cc_ctx *c = r2cc_ctx_find(ctx);
	if (!c)
		return;
	pthread_mutex_lock(&drill.mu);
	for (int i = 0; i < drill.ntg; i++)
		if (drill.tg[i].mine == 1 && drill.tg[i].down_now &&
		    !strcmp(drill.tg[i].nic, c->nic->name))
			attr->state = IBV_PORT_DOWN;
	pthread_mutex_unlock(&drill.mu);
}

bool r2cc_drill_names(const struct r2cc_ctl_dir *dir, int rank, const char *nic)
{
	if (!r2cc_drill_on || !dir || !nic || !nic[0])
		return false;
	const struct r2cc_ctl_member *m = r2cc_ctl_dir_member(dir, rank);
	int node = r2cc_ctl_dir_node(dir, rank);
	for (int k = 0; k < drill.plan.nsteps; k++) {
		const struct r2cc_drill_step *s = &drill.plan.steps[k];
		if (s->kind == R2CC_DRILL_UP || strcmp(s->nic, nic))
			continue;
		if (s->node >= 0 ? s->node == node
				 : m && (host_matches(s->host, m->host) ||
					 host_matches(s->host, m->node_key)))
			return true;
	}
	return false;
}

bool r2cc_drill_cut(const struct ibv_qp *qp)
{
	if (!r2cc_drill_on || !qp)
		return false;
	pthread_mutex_lock(&drill.mu);
	struct dqp *d = r2cc_hmap_get(&drill.by_qp, (uint64_t)(uintptr_t)qp);
	bool cut = d && d->cut;
	for (int i = 0; d && !cut && i < drill.ntg; i++)
		cut = drill.tg[i].cuts && drill.tg[i].resolved &&
		      (is_local(&drill.tg[i], d) || is_remote(&drill.tg[i], d));
	pthread_mutex_unlock(&drill.mu);
	return cut;
}

/* --- the steps ------------------------------------------------------------------ */

static bool same_target(const struct target *t, const struct r2cc_drill_step *s)
{
	return t->node == s->node && !strcmp(t->host, s->host) && !strcmp(t->nic, s->nic);
}

static bool member_is(const struct r2cc_ctl_member *m, const struct target *t)
{
	return t->node >= 0 ? m->node == t->node
			    : host_matches(t->host, m->host) || host_matches(t->host, m->node_key);
}

/*
 * Where the step's NIC is: on this node (then it must be one this process opened),
 * or elsewhere (its LIDs and GIDs from the members of the job's directory this
 * process holds: those of its peers). Takes r2cc_eng.mu; drill.mu not held. 0, 1
 * (not yet: no directory), or -1 with why.
 */
/*
 * The members of the peers this process's queue pairs reach, as the rendezvous has
 * them now: a member fetched before its process reported the NICs it uses (at the
 * first message to it) names none of them. One request, by the remote addresses of
 * the connected queue pairs; the directory is borrowed meanwhile (not freed).
 * Neither lock held.
 */
static void refresh_members(void)
{
	enum { MAX = 256 };
	struct r2cc_ctl_nicaddr addrs[MAX];
	int n = 0;
	pthread_mutex_lock(&drill.mu);
	struct r2cc_hmap *h = &drill.by_qp;
	for (size_t i = 0; i < h->cap && n < MAX; i++) {
		const struct dqp *d = h->vals[i];
		if (!d || !d->remote.kind || (d->state != IBV_QPS_RTR && d->state != IBV_QPS_RTS))
			continue;
		int j = 0;
		while (j < n && !addr_eq(&addrs[j], &d->remote))
			j++;
		if (j == n)
			addrs[n++] = d->remote;
	}
	pthread_mutex_unlock(&drill.mu);
	if (!n)
		return;
	pthread_mutex_lock(&r2cc_eng.mu);
	const struct r2cc_ctl_dir *dir = r2cc_eng.ndirs ? r2cc_eng.dirs[0] : NULL;
	r2cc_eng.dir_borrowed = dir;
	pthread_mutex_unlock(&r2cc_eng.mu);
	static int owners[MAX * 4], nowners[MAX];
	int rc = dir ? r2cc_ctl_dir_owners(dir, addrs, n, owners, 4, nowners, 2000) : 0;
	if (rc)
		R2CC_INFO("drill: cannot ask the rendezvous for the peers' NICs (%s); the "
			  "members held are used",
			  strerror(-rc));
	pthread_mutex_lock(&r2cc_eng.mu);
	r2cc_eng.dir_borrowed = NULL;
	pthread_mutex_unlock(&r2cc_eng.mu);
}

static int resolve(struct target *t, bool refresh, char *why, size_t len)
{
	char host[256], key[256];
	r2cc_host_name(host, sizeof(host));
	r2cc_node_key(key, sizeof(key));
	bool mine_now =
	    t->node >= 0 ? false : host_matches(t->host, host) || host_matches(t->host, key);
	pthread_mutex_lock(&r2cc_eng.mu);
	bool mine_idx = t->node >= 0 && t->node == r2cc_eng.node_index;
	pthread_mutex_unlock(&r2cc_eng.mu);
	if (refresh && !mine_now && !mine_idx)
		refresh_members();
	pthread_mutex_lock(&r2cc_eng.mu);
	int me = r2cc_eng.node_index;
	const struct r2cc_ctl_dir *dir = r2cc_eng.ndirs ? r2cc_eng.dirs[0] : NULL;
	int rc = 0;
	if (t->node >= 0 && (me < 0 || !dir)) {
		rc = 1;
		snprintf(why, len, "this process has no communicator, so no node index");
		goto out;
	}
	if (t->node >= 0 && t->node >= dir->nnodes) {
		rc = -1;
		snprintf(why, len, "node %d is not in the job (it has %d)", t->node, dir->nnodes);
		goto out;
	}
	t->mine = t->node >= 0 ? t->node == me
			       : host_matches(t->host, host) || host_matches(t->host, key);
	t->naddr = 0;
	if (t->mine) {
		struct r2cc_nic *nic = NULL;
		for (int i = 0; i < r2cc_nic_count() && !nic; i++)
			if (!strcmp(r2cc_nic_by_index(i)->name, t->nic))
				nic = r2cc_nic_by_index(i);
		if (!nic) {
			rc = -1;
			snprintf(why, len, "this process (node %d) has no NIC %s", me, t->nic);
			goto out;
		}
		struct r2cc_ctl_nicaddr a;
		if (nic->lid) {
			addr_lid(&a, nic->lid);
			target_add_addr(t, &a);
		}
		uint32_t known = __atomic_load_n(&nic->gids_known, __ATOMIC_ACQUIRE);
		for (int i = 0; i < R2CC_GID_CACHE; i++)
			if (known & (1u << i)) {
				addr_gid(&a, &nic->gids[i]);
				target_add_addr(t, &a);
			}
		if (nic->gid_known) {
			addr_gid(&a, &nic->gid);
			target_add_addr(t, &a);
		}
		goto out;
	}
	bool node_seen = false;
	for (int d = 0; d < r2cc_eng.ndirs; d++)
		for (int r = 0; r < r2cc_eng.dirs[d]->nranks; r++) {
			const struct r2cc_ctl_member *m = r2cc_ctl_dir_member(r2cc_eng.dirs[d], r);
			/* node indices are the first directory's */
			if (!m || (t->node >= 0 && d) || !member_is(m, t))
				continue;
			node_seen = true;
			for (int j = 0; j < m->nnics; j++) {
				const struct r2cc_ctl_nic *n = &m->nics[j];
				if (strcmp(n->name, t->nic))
					continue;
				struct r2cc_ctl_nicaddr a;
				static const uint8_t zero[16];
				if (n->lid) {
					addr_lid(&a, n->lid);
					target_add_addr(t, &a);
				}
				if (memcmp(n->gid, zero, 16)) {
					memset(&a, 0, sizeof(a));
					a.kind = R2CC_CTL_NICADDR_GID;
					memcpy(a.bytes, n->gid, 16);
					target_add_addr(t, &a);
				}
			}
		}
	if (!t->naddr)
		snprintf(why, len, "%s",
			 node_seen ? "no peer of this process uses that NIC"
				   : "no peer of this process is on that node");
out:
	pthread_mutex_unlock(&r2cc_eng.mu);
	return rc;
}

static const char *step_name(const struct r2cc_drill_step *s, char *buf, size_t len)
{
	r2cc_drill_step_str(s, buf, len);
	return buf;
}

/* Hot repair hears of a port change as from the device (not under drill.mu). */
static void port_event(const char *nic, bool up)
{
	struct ibv_context *ctx = NULL;
	pthread_mutex_lock(&drill.mu);
	for (int i = 0; i < drill.nctx && !ctx; i++) {
		struct r2cc_ctx *c = r2cc_ctx_find(drill.ctxs[i]);
		if (c && !strcmp(c->nic->name, nic))
			ctx = drill.ctxs[i];
	}
	pthread_mutex_unlock(&drill.mu);
	if (!ctx)
		return;
	struct ibv_async_event ev = {.event_type = up ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR};
	ev.element.port_num = 1;
	r2cc_repair_async_event(ctx, &ev);
}

/* Sets the target's new kind and applies it to every queue pair; drill.mu held.
 * Returns the queue pairs it cuts or lets go. */
static int apply_target(struct target *t)
{
	int n = 0;
	struct r2cc_hmap *h = &drill.by_qp;
	for (size_t i = 0; i < h->cap; i++) {
		struct dqp *d = h->vals[i];
		if (!d || !(is_local(t, d) || is_remote(t, d)))
			continue;
		if (d->state != IBV_QPS_RTR && d->state != IBV_QPS_RTS)
			continue; /* not connected: nothing on the wire to cut */
		recompute(d, true);
		R2CC_INFO("drill: qp 0x%x on %s (%s end): %s%s%s, %d held, %d kept back", d->qpn,
			  d->nic ? d->nic->name : "?", is_local(t, d) ? "local" : "remote",
			  d->down   ? "down"
			  : d->hold ? "requests lost"
			  : d->hide ? "acks lost"
				    : "clear",
			  d->flushing ? ", flushing" : "", d->state == IBV_QPS_ERR ? ", ERR" : "",
			  d->nheld, d->nkept);
		n++;
	}
	return n;
}

static void publish(void);

/* The target of step k, made and resolved now; drill.mu held (let go meanwhile).
 * Returns its index and resolve()'s result. */
static int target_of(int k, bool refresh, int *rc, char *why, size_t len)
{
	const struct r2cc_drill_step *s = &drill.plan.steps[k];
	int ti;
	for (ti = 0; ti < drill.ntg && !same_target(&drill.tg[ti], s); ti++)
		;
	if (ti == drill.ntg) {
		struct target *t = &drill.tg[drill.ntg++];
		memset(t, 0, sizeof(*t));
		t->node = s->node;
		memcpy(t->host, s->host, sizeof(t->host));
		memcpy(t->nic, s->nic, sizeof(t->nic));
		t->mine = -1;
		t->kind = R2CC_DRILL_UP;
	}
	struct target tmp = drill.tg[ti];
	pthread_mutex_unlock(&drill.mu);
	*rc = resolve(&tmp, refresh, why, len);
	/* another node's NIC no member held names: ask the rendezvous again */
	if (!*rc && !refresh && tmp.mine != 1 && !tmp.naddr) {
		why[0] = '\0';
		*rc = resolve(&tmp, true, why, len);
	}
	pthread_mutex_lock(&drill.mu);
	struct target *t = &drill.tg[ti];
	if (!*rc) {
		memcpy(t->addr, tmp.addr, sizeof(t->addr));
		t->naddr = tmp.naddr;
		t->mine = tmp.mine;
		t->resolved = tmp.mine == 1 || tmp.naddr > 0;
	}
	t->cuts |= s->kind != R2CC_DRILL_UP;
	return ti;
}

/* The connected queue pairs on the target's paths now. drill.mu held. */
static int count_target(const struct target *t)
{
	int n = 0;
	const struct r2cc_hmap *h = &drill.by_qp;
	for (size_t i = 0; i < h->cap; i++) {
		const struct dqp *d = h->vals[i];
		n += d && (d->state == IBV_QPS_RTR || d->state == IBV_QPS_RTS) &&
		     (is_local(t, d) || is_remote(t, d));
	}
	return n;
}

static void fire(int k, int64_t now)
{
	struct r2cc_drill_step *s = &drill.plan.steps[k];
	struct step_state *st = &drill.st[k];
	char name[200], why[160] = "";
	int rc;
	int ti = target_of(k, false, &rc, why, sizeof(why));
	if (rc > 0)
		return; /* again at the next tick */
	step_name(s, name, sizeof(name));
	if (rc < 0) {
		st->state = 2;
		snprintf(st->why, sizeof(st->why), "%s", why);
		R2CC_WARN("drill: step %d (%s) not applied: %s", s->index, name, why);
		return;
	}
	struct target *t = &drill.tg[ti];
	bool was_down = t->down_now;
	t->kind = s->kind;
	t->flap_ms = s->arg_ms;
	t->since = now;
	t->down_now = s->kind == R2CC_DRILL_DOWN || s->kind == R2CC_DRILL_FLAP;
	/* applied from here on: its port event below may be detected at once */
	struct timespec rt;
	clock_gettime(CLOCK_REALTIME, &rt);
	double applied_unix = (double)rt.tv_sec + rt.tv_nsec / 1e9;
	/* the queue pairs it cuts: those on its paths now (hot repair may fence them
	 * in answer to the port event before apply_target() gets to them) */
	int n_before = count_target(t);
	/* A port that goes down is heard of (its event, R2CC's port view) before its
	 * queue pairs' flushes, as from a real one. */
	if (t->mine == 1 && t->down_now && !was_down) {
		char nic0[R2CC_DRILL_NAME_MAX];
		snprintf(nic0, sizeof(nic0), "%s", t->nic);
		pthread_mutex_unlock(&drill.mu);
		port_event(nic0, false);
		pthread_mutex_lock(&drill.mu);
	}
	int n = apply_target(t);
	if (r2cc_log_level >= R2CC_LOG_INFO) {
		char list[400] = "";
		size_t used = 0;
		for (int i = 0; i < t->naddr && used < sizeof(list) - 48; i++) {
			const struct r2cc_ctl_nicaddr *a = &t->addr[i];
			if (a->kind == R2CC_CTL_NICADDR_LID)
				used +=
				    (size_t)snprintf(list + used, sizeof(list) - used, " lid %u",
						     (unsigned)(a->bytes[0] << 8 | a->bytes[1]));
			else
				used += (size_t)snprintf(list + used, sizeof(list) - used,
							 " gid ..%02x%02x:%02x%02x", a->bytes[12],
							 a->bytes[13], a->bytes[14], a->bytes[15]);
		}
		R2CC_INFO("drill: step %d: %s is %s, reached at%s", s->index, t->nic,
			  t->mine == 1 ? "this node's" : "another node's",
			  used ? list : " (no address known)");
	}
	st->state = 1;
	st->applied_ns = now;
	st->applied_unix = applied_unix;
	st->qps = n > n_before ? n : n_before;
	snprintf(st->why, sizeof(st->why), "%s", why);
	drill.applied++;
	publish();
	bool mine = t->mine == 1;
	bool down = t->down_now;
	char nic[R2CC_DRILL_NAME_MAX];
	snprintf(nic, sizeof(nic), "%s", t->nic);
	R2CC_WARN("drill: step %d: %s applied to %d queue pair(s) of this process (%s)%s%s",
		  s->index, name, st->qps, mine ? "its NIC" : "peers of that NIC", *why ? ": " : "",
		  why);
	if (mine && !down && was_down) {
		pthread_mutex_unlock(&drill.mu);
		port_event(nic, true);
		pthread_mutex_lock(&drill.mu);
	}
}

/* r2cc top and its metrics: the plan, the steps applied, the NICs cut. drill.mu held. */
static void publish(void)
{
	struct r2cc_stats_page *pg = r2cc_stats_page();
	if (!pg)
		return;
	uint64_t nics = 0;
	struct r2cc_hmap *h = &drill.by_qp;
	for (size_t i = 0; i < h->cap; i++) {
		const struct dqp *d = h->vals[i];
		if (d && d->cut && d->nic && d->nic->index < 64)
			nics |= 1ull << d->nic->index;
	}
	size_t n = strnlen(drill.plan_str, sizeof(pg->drill_plan) - 1);
	memcpy(pg->drill_plan, drill.plan_str, n); /* cut to fit */
	pg->drill_plan[n] = '\0';
	__atomic_store_n(&pg->drill_steps, drill.plan.nsteps, __ATOMIC_RELAXED);
	__atomic_store_n(&pg->drill_applied, drill.applied, __ATOMIC_RELAXED);
	__atomic_store_n(&pg->drill_nics, nics, __ATOMIC_RELEASE);
}

/* Flapping targets change half; queue pairs without an acknowledgement for their
 * transport timeout fail as on the wire. drill.mu held. */
static void tick(int64_t now)
{
	for (int i = 0; i < drill.ntg; i++) {
		struct target *t = &drill.tg[i];
		if (t->kind != R2CC_DRILL_FLAP)
			continue;
		bool down = ((now - t->since) / ((int64_t)t->flap_ms * 1000000)) % 2 == 0;
		if (down == t->down_now)
			continue;
		t->down_now = down;
		char nic[R2CC_DRILL_NAME_MAX];
		snprintf(nic, sizeof(nic), "%s", t->nic);
		bool mine = t->mine == 1;
		if (mine && down) { /* the port's event before the flushes, as in fire() */
			pthread_mutex_unlock(&drill.mu);
			port_event(nic, false);
			pthread_mutex_lock(&drill.mu);
		}
		apply_target(t);
		if (mine && !down) {
			pthread_mutex_unlock(&drill.mu);
			port_event(nic, true);
			pthread_mutex_lock(&drill.mu);
		}
	}
	if (!drill.active)
		return;
	struct r2cc_hmap *h = &drill.by_qp;
	for (size_t i = 0; i < h->cap; i++) {
		struct dqp *d = h->vals[i];
		if (!d || !d->since || !d->timeout || !(d->nheld || d->nkept))
			continue;
		/* 4.096 us x 2^timeout x (retry_cnt + 1) */
		int64_t ns =
		    (int64_t)(4096ll << (d->timeout < 31 ? d->timeout : 31)) * (d->retry_cnt + 1);
		if (now - d->since > ns) {
			R2CC_INFO("drill: qp 0x%x: no acknowledgement within its transport timeout "
				  "(%.0f ms): retry exceeded, as on the wire",
				  d->qpn, ns / 1e6);
			to_error(d, true);
		}
	}
}

static bool origin_known(const struct r2cc_drill_step *s)
{
	return s->from_init ? drill.t0_init != 0 : drill.t0_coll != 0;
}

static void *drill_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&drill.mu);
	for (;;) {
		int64_t now = now_ns();
		bool pending = false;
		for (int k = 0; k < drill.plan.nsteps; k++) {
			const struct r2cc_drill_step *s = &drill.plan.steps[k];
			if (drill.st[k].state)
				continue;
			pending = true;
			if (!origin_known(s))
				continue;
			int64_t t0 = s->from_init ? drill.t0_init : drill.t0_coll;
			if (now >= t0 + s->at_ms * 1000000) {
				fire(k, now); /* due: its NIC's addresses from what is held */
			} else if (!drill.pre[k]) {
				/* ahead of its time (once; again while unresolved): the
				 * peers' members asked for, and incidents on its paths are
				 * a drill's even before this process's own step */
				char why[160];
				int rc;
				int ti = target_of(k, true, &rc, why, sizeof(why));
				drill.pre[k] = drill.tg[ti].resolved || rc < 0;
			}
		}
		tick(now);
		bool flap = false;
		for (int i = 0; i < drill.ntg; i++)
			flap |= drill.tg[i].kind == R2CC_DRILL_FLAP;
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		int64_t wait = pending || flap || drill.active ? TICK_NS : 1000000000ll;
		ts.tv_sec += (ts.tv_nsec + wait) / 1000000000;
		ts.tv_nsec = (ts.tv_nsec + wait) % 1000000000;
		pthread_cond_timedwait(&drill.cond, &drill.mu, &ts);
	}
	return NULL;
}

static void start_thread(void)
{
	if (drill.thread_started)
		return;
	drill.thread_started = true;
	if (r2cc_thread_start(drill_main, NULL, "r2cc-drill")) {
		drill.thread_started = false;
		R2CC_WARN("drill: cannot start its thread; no drill runs");
	}
}

static void at_origin(int64_t *t0, const char *what)
{
	if (!r2cc_drill_on)
		return;
	pthread_mutex_lock(&drill.mu);
	if (!*t0) {
		*t0 = now_ns();
		R2CC_INFO("drill: time origin: %s", what);
		start_thread();
		pthread_cond_broadcast(&drill.cond);
	}
	pthread_mutex_unlock(&drill.mu);
}

void r2cc_drill_at_init(void)
{
	at_origin(&drill.t0_init, "the first communicator's init ended");
}

void r2cc_drill_at_collective(void)
{
	__atomic_store_n(&r2cc_drill_wait_collective, 0, __ATOMIC_RELAXED);
	at_origin(&drill.t0_coll, "the first collective");
}

void r2cc_drill_init(void)
{
	static int once;
	if (!r2cc_param.drill[0] || __atomic_exchange_n(&once, 1, __ATOMIC_ACQ_REL))
		return;
	char err[320];
	if (r2cc_drill_parse(r2cc_param.drill, &drill.plan, err, sizeof(err)) || !drill.plan.nsteps)
		return; /* refused at start-up already */
	if (r2cc_param.mode == R2CC_MODE_PASSTHROUGH || !r2cc_repair_enabled()) {
		R2CC_WARN("drill: R2CC_DRILL is set but hot repair is off (R2CC_MODE=%d): no drill "
			  "runs",
			  r2cc_param.mode);
		return;
	}
	snprintf(drill.plan_str, sizeof(drill.plan_str), "%s", r2cc_param.drill);
	bool coll = false;
	for (int i = 0; i < drill.plan.nsteps; i++)
		coll |= !drill.plan.steps[i].from_init;
	__atomic_store_n(&r2cc_drill_wait_collective, coll, __ATOMIC_RELAXED);
	__atomic_store_n(&r2cc_report_drill_hook, r2cc_drill_report, __ATOMIC_RELEASE);
	__atomic_store_n(&r2cc_drill_on, 1, __ATOMIC_RELEASE);
	pthread_mutex_lock(&drill.mu);
	publish();
	pthread_mutex_unlock(&drill.mu);
	R2CC_INFO("drill: R2CC_DRILL=\"%s\": %d step(s); this process cuts its own queue "
		  "pairs on the drilled NICs, as the wire would",
		  drill.plan_str, drill.plan.nsteps);
}

int r2cc_drill_applied(void)
{
	return __atomic_load_n(&drill.applied, __ATOMIC_RELAXED);
}

const char *r2cc_drill_plan_str(void)
{
	return drill.plan_str;
}

/* --- the report ------------------------------------------------------------------- */

void r2cc_drill_report(FILE *text, FILE *json)
{
	if (!r2cc_drill_on)
		return;
	pthread_mutex_lock(&drill.mu);
	int64_t now = now_ns();
	for (int k = 0; k < drill.plan.nsteps; k++) {
		const struct r2cc_drill_step *s = &drill.plan.steps[k];
		struct step_state *st = &drill.st[k];
		if (!st->state) {
			int64_t t0 = s->from_init ? drill.t0_init : drill.t0_coll;
			int64_t left = t0 + s->at_ms * 1000000 - now;
			if (t0 && left > 0)
				snprintf(st->why, sizeof(st->why),
					 "the process ended %lld ms before its time",
					 (long long)(left / 1000000));
			else if (t0)
				snprintf(
				    st->why, sizeof(st->why),
				    "the process ended %lld ms after its time, before the drill's "
				    "thread applied it",
				    (long long)(-left / 1000000));
			else
				snprintf(st->why, sizeof(st->why), "the process never reached %s",
					 s->from_init
					     ? "a communicator's init"
					     : "a collective (its time counts from the first)");
		}
	}
	if (text) {
		fprintf(text, "drill: R2CC_DRILL=\"%s\", %d of %d step(s) applied\n",
			drill.plan_str, drill.applied, drill.plan.nsteps);
		for (int k = 0; k < drill.plan.nsteps; k++) {
			const struct r2cc_drill_step *s = &drill.plan.steps[k];
			const struct step_state *st = &drill.st[k];
			char name[200];
			step_name(s, name, sizeof(name));
			if (st->state == 1)
				fprintf(text,
					"drill step %d: %s: applied at unix %.6f to %d queue "
					"pair(s)%s%s\n",
					s->index, name, st->applied_unix, st->qps,
					*st->why ? " (" : "", *st->why ? st->why : "");
			else
				fprintf(text, "drill step %d: %s: not applied (%s)\n", s->index,
					name, st->why);
		}
	}
	if (json) {
		fprintf(json, "{\"plan\":");
		r2cc_json_str(json, drill.plan_str);
		fprintf(json, ",\"applied\":%d,\"steps\":[", drill.applied);
		for (int k = 0; k < drill.plan.nsteps; k++) {
			const struct r2cc_drill_step *s = &drill.plan.steps[k];
			const struct step_state *st = &drill.st[k];
			char node[R2CC_DRILL_NAME_MAX + 8];
			if (s->node >= 0)
				snprintf(node, sizeof(node), "%d", s->node);
			else
				snprintf(node, sizeof(node), "%s", s->host);
			fprintf(json, "%s{\"step\":%d,\"node\":", k ? "," : "", s->index);
			r2cc_json_str(json, node);
			fprintf(json, ",\"nic\":");
			r2cc_json_str(json, s->nic);
			fprintf(json,
				",\"kind\":\"%s\",\"arg_ms\":%d,\"at_ms\":%lld,\"from\":\"%s\","
				"\"state\":\"%s\"",
				r2cc_drill_kind_name(s->kind), s->arg_ms, (long long)s->at_ms,
				s->from_init ? "init" : "collective",
				st->state == 1	 ? "applied"
				: st->state == 2 ? "unresolved"
						 : "pending");
			if (st->state == 1)
				fprintf(json, ",\"applied_unix\":%.6f,\"qps\":%d", st->applied_unix,
					st->qps);
			fprintf(json, ",\"why\":");
			r2cc_json_str(json, st->why);
			fputc('}', json);
		}
		fprintf(json, "]}");
	}
	pthread_mutex_unlock(&drill.mu);
}
