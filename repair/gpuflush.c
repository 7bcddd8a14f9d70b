/*
 * GPUDirect's flush across NICs. NCCL reads a byte back through a loopback QP
 * (gpuFlush.qp, on the receive connection's CQ) before the GPU may use received data:
 * the READ's response is ordered behind that NIC's writes into GPU memory, and behind
 * no other NIC's. Once repair moves data QPs of a CQ to other NICs, their data reaches
 * GPU memory through those NICs, and NCCL's one READ no longer orders it.
 *
 * So each NIC that has carried data of the CQ's QPs since a repair (vcq->carried) gets
 * a loopback QP of R2CC's next to NCCL's flush QP, made by the repair thread before
 * the moved QP's new path goes live. NCCL's flush READs then take the slow path
 * (its QP's gate is closed): each is held back while the same READ runs on every
 * other such NIC, and posted on NCCL's QP (its current path) once those came back,
 * at NCCL's next poll of the CQ. NCCL's completion therefore comes after every
 * NIC's: nothing NCCL sees is reordered or made up. A NIC that failed is still read
 * through, each READ waited for at most GF_DEAD_NS, until its device refuses one, its
 * QP fails or a READ goes unanswered (a NIC declared dead may still work; a dead one
 * refuses or never answers, and what it wrote before it died is taken to have
 * landed). A READ that cannot be posted on a NIC that is not dead gives the flush
 * QP an error: the flush cannot be done, and NCCL is not told it was.
 */
#include "repair/engine_priv.h"

#include <stdlib.h>
#include <string.h>

/* A helper READ's wr_id: the tag and the held READ's sequence number. */
#define GF_TAG	0x5246000000000000ull /* "RF" */
#define GF_MASK 0xffff000000000000ull
#define GF_SEQ	0x0000ffffffffffffull
#define GF_SGE	4

struct gf_helper {
	struct r2cc_nic *nic;
	struct ibv_qp *qp;
	struct pcq *pc;
	int retired; /* atomic: not read through any more (its post was refused, its QP
		      * failed, or a READ on its failed NIC went unanswered) */
};

/* How long a READ through a NIC that has failed is waited for: a dead device's that
 * accepts the post may never answer it. */
#define GF_DEAD_NS (1000 * 1000000ll)

struct gf_entry {
	uint64_t seq;  /* atomic: which held READ the entry is */
	uint64_t wait; /* atomic: helpers (bits of their index in h[]) still out */
	int64_t t_ns;  /* when its helpers' READs were posted */
	struct ibv_send_wr wr;
	struct ibv_sge sge[GF_SGE];
};

struct r2cc_gflush {
	struct gf_helper h[R2CC_MAX_NICS];
	int nh; /* atomic: helpers ready in h[] */
	/* NCCL's held posts, in order: [head, tail). Under the QP's mu. */
	uint64_t head, tail;
	uint32_t size;
	struct gf_entry *ring;
	uint64_t flushes, helped; /* NCCL's flush READs held, helper READs they waited for */
};

/* A QP NCCL connected to itself (its ends known from its RTS on: ready). */
static bool self_connected(const struct r2cc_rqp *r)
{
	return r->q && __atomic_load_n(&r->ready, __ATOMIC_ACQUIRE) &&
	       r2cc_peer_ep_equal(&r->ep_local, &r->ep_remote);
}

static bool gf_pred(const struct r2cc_rqp *r, const void *arg)
{
	return r->vcq == arg && self_connected(r) && load_state(r) != RQ_FAILED;
}

/* Under r->mu: L's flush state, made with room for NCCL's whole send queue. */
static struct r2cc_gflush *gf_get(struct r2cc_rqp *l)
{
	if (l->gf)
		return l->gf;
	struct r2cc_gflush *g = calloc(1, sizeof(*g));
	uint32_t size = l->cap.max_send_wr + 1;
	if (g)
		g->ring = calloc(size, sizeof(*g->ring));
	if (!g || !g->ring) {
		free(g);
		return NULL;
	}
	g->size = size;
	struct r2cc_vcq *v = l->vcq->v;
	pthread_mutex_lock(&v->mu);
	if (v->ngfl == v->capgfl) {
		int cap = v->capgfl ? 2 * v->capgfl : 8;
		struct r2cc_rqp **n = realloc(v->gfl, (size_t)cap * sizeof(*n));
		if (!n) {
			pthread_mutex_unlock(&v->mu);
			free(g->ring);
			free(g);
			return NULL;
		}
		v->gfl = n;
		v->capgfl = cap;
	}
	v->gfl[v->ngfl++] = l;
	pthread_mutex_unlock(&v->mu);
	__atomic_store_n(&l->gf, g, __ATOMIC_RELEASE);
	return g;
}

/* Repair thread: a loopback QP of R2CC's on nic beside L, its completions routed to
 * L (r2cc_gflush_wc). Under l->mu. */
static int helper_add(struct r2cc_rqp *l, struct r2cc_gflush *g, struct r2cc_nic *nic)
{
	int n = __atomic_load_n(&g->nh, __ATOMIC_RELAXED);
	for (int i = 0; i < n; i++)
		if (g->h[i].nic == nic && !__atomic_load_n(&g->h[i].retired, __ATOMIC_ACQUIRE))
			return 0;
	if (n == R2CC_MAX_NICS)
		return -ENOSPC;
	if (l->new_qp)
		return -EBUSY;
	int rc = r2cc_path_new_self(l, nic);
	if (rc)
		return rc;
	struct r2cc_vcq *v = l->vcq->v;
	pthread_mutex_lock(&v->mu);
	rc = r2cc_hmap_put(&l->new_pcq->by_qpn, l->new_qp->qp_num, l);
	pthread_mutex_unlock(&v->mu);
	if (rc) {
		r2cc_path_drop_new(l);
		return rc;
	}
	g->h[n] = (struct gf_helper){nic, l->new_qp, l->new_pcq, 0};
	r2cc_qp_shadow_destroy(l->new_sh);
	l->new_qp = NULL;
	l->new_cq = NULL;
	l->new_pcq = NULL;
	l->new_sh = NULL;
	__atomic_store_n(&g->nh, n + 1, __ATOMIC_RELEASE);
	return 0;
}

/*
 * Repair thread, before r's new path on nic goes live: nic (and r's own NIC, which
 * still carries what came before) may now carry data of r's CQ, so every GPU flush
 * QP of that CQ gets a helper on each NIC that has. A QP of NCCL's own that is
 * connected to itself is a flush QP, not a data QP. Non-zero when a flush QP could
 * not get a helper it needs on a NIC that is up (memory, or the device refused the
 * QP): r must not go live there, since its data would reach GPU memory unordered by
 * NCCL's flush. NICs that failed get a helper too where they still make one (r's
 * old NIC: what it wrote before the fence); where they do not, the device is dead.
 * The error is the refusal of nic's device where it died since r's new path was
 * made there (the repair then begins again from another NIC), -ENOMEM otherwise.
 */
int r2cc_gflush_cover(struct r2cc_rqp *r, struct r2cc_nic *nic)
{
	struct r2cc_vcq *v = r->vcq ? r->vcq->v : NULL;
	if (!v || self_connected(r) || r->loopback || !nic || nic->index < 0 ||
	    r->orig_nic->index < 0)
		return 0;
	int failed = 0, dead = 0;
	uint64_t add = 1ull << (nic->index & 63) | 1ull << (r->orig_nic->index & 63);
	uint64_t carried = __atomic_or_fetch(&v->carried, add, __ATOMIC_ACQ_REL);
	struct r2cc_rqp **ls;
	int n = r2cc_rqp_collect(&ls, gf_pred, r->vcq);
	for (int i = 0; i < n; i++) {
		struct r2cc_rqp *l = ls[i];
		pthread_mutex_lock(&l->mu);
		struct r2cc_gflush *g = l->dead ? NULL : gf_get(l);
		for (int k = 0; g && k < R2CC_MAX_NICS; k++) {
			struct r2cc_nic *at = r2cc_nic_by_index(k);
			if (!(carried & 1ull << k) || !at)
				continue;
			int rc = helper_add(l, g, at);
			if (rc && __atomic_load_n(&at->state, __ATOMIC_RELAXED) != R2CC_NIC_UP) {
				/* A NIC that failed is read through if it still can be (it
				 * may have been declared dead while it works: its writes
				 * then still need ordering); one that cannot even make the
				 * helper is dead, and what it wrote is taken to have landed. */
				R2CC_INFO("repair: GPU flush qp 0x%x: no helper on failed %s (%s); "
					  "what it wrote is taken to have landed",
					  l->qpn, at->name, strerror(-rc));
			} else if (rc == -EBUSY) { /* L's own repair is making its new path now */
				R2CC_WARN(
				    "repair: GPU flush qp 0x%x cannot read through %s yet (its "
				    "own repair is under way): data that arrives there "
				    "before its next flush may not be ordered",
				    l->qpn, at->name);
			} else if (rc) {
				if (at == nic && r2cc_refused_by_dead_device(rc))
					dead = rc;
				failed++;
				R2CC_WARN("repair: GPU flush qp 0x%x cannot read through %s (%s): "
					  "qp 0x%x does not move there",
					  l->qpn, at->name, strerror(-rc), r->qpn);
			}
		}
		if (!g && !l->dead) {
			failed++;
			R2CC_WARN("repair: out of memory for GPU flush qp 0x%x: qp 0x%x does not "
				  "move",
				  l->qpn, r->qpn);
		}
		pthread_mutex_unlock(&l->mu);
		/* its posts from now on through repair_post_send (r2cc_gflush_take) */
		if (g && l->q)
			r2cc_cq_gate_close(&l->q->gate);
	}
	r2cc_rqp_collect_done(ls);
	return dead ? dead : failed ? -ENOMEM : 0;
}

/* The repair thread gives the QP its error (r2cc_keys_tick). */
static void gf_error(struct r2cc_rqp *l, int rc)
{
	__atomic_store_n(&l->flush_err, rc, __ATOMIC_RELAXED);
	__atomic_store_n(&r2cc_eng.keys_due, 1, __ATOMIC_RELEASE);
}

/* NCCL's READ onto helper h: keys of NCCL's NIC translated to h's. */
static int helper_post(struct r2cc_rqp *l, const struct gf_helper *h, const struct ibv_send_wr *w,
		       uint64_t seq)
{
	struct ibv_sge sge[GF_SGE];
	struct ibv_send_wr t = *w, *bad = NULL;
	t.next = NULL;
	t.sg_list = sge;
	t.wr_id = GF_TAG | (seq & GF_SEQ);
	t.send_flags = IBV_SEND_SIGNALED;
	bool same = h->nic == l->orig_nic;
	for (int i = 0; i < w->num_sge; i++) {
		sge[i] = w->sg_list[i];
		if (!same && r2cc_mr_mirror_lkey(l->orig_nic, sge[i].lkey, h->nic, &sge[i].lkey))
			return -ENOENT;
	}
	if (!same && r2cc_mr_mirror_rkey(l->orig_nic, w->wr.rdma.rkey, h->nic, &t.wr.rdma.rkey))
		return -ENOENT;
	struct r2cc_ctx *c = r2cc_ctx_of_nic(h->nic);
	return c ? r2cc_from_verbs(c->post_send(h->qp, &t, &bad)) : -ENODEV;
}

/*
 * NCCL's post on a flush QP with helpers, under r->mu: a signalled READ runs on
 * every helper's NIC first and is held; anything behind a held post is held too
 * (order). true: w is held (posted later by r2cc_gflush_release).
 * A NIC that failed is still read through, each READ there waited for up to
 * GF_DEAD_NS: a NIC declared dead while it still works (a false death) may still
 * land writes that no READ ordered; a dead device refuses the post or never
 * answers, and is read through no more.
 */
bool r2cc_gflush_take(struct r2cc_rqp *r, const struct ibv_send_wr *w)
{
	struct r2cc_gflush *g = __atomic_load_n(&r->gf, __ATOMIC_ACQUIRE);
	if (!g || w->num_sge > GF_SGE || g->tail - g->head >= g->size)
		return false;
	bool flush =
	    w->opcode == IBV_WR_RDMA_READ && ((w->send_flags & IBV_SEND_SIGNALED) || r->sq_sig_all);
	if (!flush && g->tail == g->head)
		return false;
	uint64_t seq = g->tail, want = 0;
	int nh = __atomic_load_n(&g->nh, __ATOMIC_ACQUIRE);
	/* every helper, the current NIC's too: the held READ goes on the path current
	 * when it is released, which may be on another NIC by then */
	for (int i = 0; flush && i < nh; i++)
		if (!__atomic_load_n(&g->h[i].retired, __ATOMIC_ACQUIRE))
			want |= 1ull << i;
	if (!want && g->tail == g->head)
		return false;
	/* The entry first: a helper's completion may be polled before its post returns. */
	struct gf_entry *e = &g->ring[seq % g->size];
	e->wr = *w;
	e->wr.next = NULL;
	e->wr.sg_list = e->sge;
	memcpy(e->sge, w->sg_list, (size_t)w->num_sge * sizeof(*e->sge));
	__atomic_store_n(&e->wait, want, __ATOMIC_RELAXED);
	e->t_ns = now_ns();
	__atomic_store_n(&e->seq, seq, __ATOMIC_RELEASE);
	uint64_t wait = want;
	for (int i = 0; i < nh; i++) {
		if (!(want & 1ull << i))
			continue;
		int rc = helper_post(r, &g->h[i], w, seq);
		if (!rc)
			continue;
		wait &= ~(1ull << i);
		__atomic_and_fetch(&e->wait, ~(1ull << i), __ATOMIC_RELEASE);
		__atomic_store_n(&g->h[i].retired, 1, __ATOMIC_RELEASE);
		if (r2cc_refused_by_dead_device(rc))
			continue; /* a dead device: what it wrote landed, nothing to read */
		/* data came through that NIC, and no READ can order it: the QP's error,
		 * not a flush that claims what it did not do */
		R2CC_WARN("repair: GPU flush qp 0x%x: a flush READ could not be posted on %s "
			  "(%s); the QP gets an error",
			  r->qpn, g->h[i].nic->name, strerror(-rc));
		gf_error(r, rc);
	}
	g->tail = seq + 1;
	if (flush) {
		g->flushes++;
		g->helped += (uint64_t)__builtin_popcountll(wait);
	}
	__atomic_add_fetch(&r->vcq->v->gf_held, 1, __ATOMIC_RELEASE);
	return true;
}

/* A completion of one of r's helpers (route(), under the CQ's mu): true if it was
 * one. Errors too: a helper that failed has nothing left to wait for. */
bool r2cc_gflush_wc(struct r2cc_rqp *r, const struct ibv_wc *wc)
{
	struct r2cc_gflush *g = __atomic_load_n(&r->gf, __ATOMIC_ACQUIRE);
	if (!g || (wc->wr_id & GF_MASK) != GF_TAG)
		return false;
	int nh = __atomic_load_n(&g->nh, __ATOMIC_ACQUIRE), i = 0;
	while (i < nh && g->h[i].qp->qp_num != wc->qp_num)
		i++;
	if (i == nh)
		return false;
	uint64_t seq = wc->wr_id & GF_SEQ;
	struct gf_entry *e = &g->ring[seq % g->size];
	/* the helper's QP failed: nothing more through it */
	if (wc->status != IBV_WC_SUCCESS)
		__atomic_store_n(&g->h[i].retired, 1, __ATOMIC_RELEASE);
	if ((__atomic_load_n(&e->seq, __ATOMIC_ACQUIRE) & GF_SEQ) == seq)
		__atomic_and_fetch(&e->wait, ~(1ull << i), __ATOMIC_RELEASE);
	return true;
}

/* Whether e waits for nothing more: each READ still out is on a retired helper, or
 * on a failed NIC for longer than GF_DEAD_NS (which retires it). Under the QP's mu. */
static bool entry_done(struct r2cc_gflush *g, const struct gf_entry *e, int64_t now)
{
	uint64_t w = __atomic_load_n(&e->wait, __ATOMIC_ACQUIRE);
	for (int i = 0; w; i++, w >>= 1) {
		struct gf_helper *h = &g->h[i];
		if (!(w & 1) || __atomic_load_n(&h->retired, __ATOMIC_ACQUIRE))
			continue;
		if (__atomic_load_n(&h->nic->state, __ATOMIC_RELAXED) == R2CC_NIC_UP ||
		    now - e->t_ns < GF_DEAD_NS)
			return false;
		__atomic_store_n(&h->retired, 1, __ATOMIC_RELEASE);
	}
	return true;
}

/* A released READ that nic's dead device refused, now held first on l: the NIC
 * fails, and l's repair posts it on its next path; or l had already moved off nic,
 * and NCCL's next post or poll posts it there; or no repair takes l, and the error
 * is NCCL's. No locks held. */
static void gf_refused(struct r2cc_rqp *l, struct r2cc_nic *nic)
{
	if (!r2cc_refused_take(l, -EIO, nic)) {
		gf_error(l, -EIO);
		return;
	}
	pthread_mutex_lock(&l->mu);
	if (load_state(l) == RQ_MIGRATED && l->cur_nic != nic && !r2cc_app_flush_need(l))
		gf_error(l, -ENOMEM);
	pthread_mutex_unlock(&l->mu);
}

/* NCCL's thread, no locks held: the held posts of v's flush QPs whose helpers are
 * back go to their QP's current path, in order. */
void r2cc_gflush_release(struct r2cc_vcq *v)
{
	if (r2cc_likely(!__atomic_load_n(&v->gf_held, __ATOMIC_ACQUIRE)))
		return;
	struct r2cc_rqp *ls[16];
	int n = 0;
	pthread_mutex_lock(&v->mu);
	for (int i = 0; i < v->ngfl && n < 16; i++)
		ls[n++] = v->gfl[i];
	pthread_mutex_unlock(&v->mu);
	for (int i = 0; i < n; i++) {
		struct r2cc_rqp *l = ls[i];
		pthread_mutex_lock(&l->mu);
		struct r2cc_gflush *g = l->gf;
		int64_t now = now_ns();
		struct r2cc_nic *refused = NULL;
		while (g && g->head != g->tail && !l->dead) {
			struct gf_entry *e = &g->ring[g->head % g->size];
			if (!entry_done(g, e, now))
				break;
			struct r2cc_nic *at = l->cur_nic;
			int rc = r2cc_send_one_locked(l, &e->wr);
			/* A dead device refused it: held, first, for the QP's next path (the
			 * rest stay in the ring, and are held behind it when released). */
			if (rc && r2cc_refused_by_dead_device(rc) && load_state(l) != RQ_FAILED &&
			    !r2cc_hold_send(l, &e->wr)) {
				refused = at;
				rc = 0;
			}
			g->head++;
			__atomic_sub_fetch(&v->gf_held, 1, __ATOMIC_RELEASE);
			if (rc)
				gf_error(l, rc);
			if (refused)
				break;
		}
		pthread_mutex_unlock(&l->mu);
		if (refused)
			gf_refused(l, refused);
	}
}

/* The QP goes (NCCL destroys it), under r->mu: its helpers and held posts too. */
void r2cc_gflush_destroy(struct r2cc_rqp *r)
{
	struct r2cc_gflush *g = r->gf;
	if (!g)
		return;
	struct r2cc_vcq *v = r->vcq->v;
	/* route() reads r->gf under v->mu: once it is gone there, nothing uses g */
	pthread_mutex_lock(&v->mu);
	for (int i = 0; i < v->ngfl; i++)
		if (v->gfl[i] == r)
			v->gfl[i--] = v->gfl[--v->ngfl];
	__atomic_store_n(&r->gf, NULL, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&v->mu);
	__atomic_sub_fetch(&v->gf_held, g->tail - g->head, __ATOMIC_RELEASE);
	for (int i = 0; i < g->nh; i++)
		r2cc_path_put(r, g->h[i].qp, g->h[i].pc);
	if (g->flushes)
		R2CC_INFO("repair: GPU flush qp 0x%x: %llu flush READs waited for %llu READs "
			  "on other NICs",
			  r->qpn, (unsigned long long)g->flushes, (unsigned long long)g->helped);
	free(g->ring);
	free(g);
}
