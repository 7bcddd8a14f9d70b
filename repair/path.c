/*
 * New paths: R2CC's own QP on the chosen NIC (in the mirror PD, on a CQ shared by
 * the paths of one NCCL CQ on that NIC), brought to INIT, RTR and RTS with the path
 * attributes NCCL gave the old QP (GID index of the matching GID class, traffic
 * class, flow label, hop limit, SL, pkey, MTU), and torn down when it goes.
 */
#include "repair/engine_priv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The MTU of a new path on nic: its port's, not above NCCL's (NCCL_IB_MTU). */
uint8_t r2cc_path_mtu(const struct r2cc_rqp *r, const struct r2cc_nic *nic)
{
	int mtu = nic->active_mtu ? nic->active_mtu : IBV_MTU_1024;
	return (uint8_t)(r->q->path_mtu && r->q->path_mtu < mtu ? r->q->path_mtu : mtu);
}

/* The new path's own GID, as its peer addresses it: the matching source GID with a
 * GRH, the NIC's otherwise. */
const uint8_t *r2cc_path_gid(const struct r2cc_rqp *r, const struct r2cc_nic *nic)
{
	return r->q->peer.has_grh ? r->new_sgid.raw : nic->gid.raw;
}

/* Entries a path of r takes in a shared CQ: both queues, the markers. */
static int path_need(const struct r2cc_rqp *r)
{
	return (int)(r->cap.max_send_wr + r->cap.max_recv_wr) + 64;
}

/* A shared CQ on c with room for a path of r (made if none has room). */
static struct pcq *pcq_get(struct r2cc_rqp *r, struct r2cc_ctx *c)
{
	struct r2cc_vcq *v = r->vcq->v;
	int need = path_need(r);
	pthread_mutex_lock(&v->mu);
	struct pcq *pc = v->pcqs;
	while (pc && (pc->ctx != c || pc->room < need))
		pc = pc->next;
	if (pc) {
		pc->room -= need;
		pc->users++;
	}
	pthread_mutex_unlock(&v->mu);
	if (pc)
		return pc;
	pc = calloc(1, sizeof(*pc));
	if (!pc)
		return NULL;
	/* As large as the device takes, up to PCQ_PATHS paths. */
	for (int depth = need * PCQ_PATHS; depth >= need && !pc->cq; depth /= 2) {
		pc->cq = r2cc_eng.v.create_cq(c->ctx, depth, NULL, NULL, 0);
		pc->room = depth;
	}
	if (!pc->cq) {
		free(pc);
		return NULL;
	}
	r2cc_own_add(pc->cq);
	pc->ctx = c;
	pc->room -= need;
	pc->users = 1;
	pthread_mutex_lock(&v->mu);
	pc->next = v->pcqs;
	v->pcqs = pc;
	pthread_mutex_unlock(&v->mu);
	return pc;
}

/* A path of r on pc goes (its QP destroyed first); the CQ with its last path. */
void r2cc_path_put(struct r2cc_rqp *r, struct ibv_qp *qp, struct pcq *pc)
{
	struct r2cc_vcq *v = r->vcq->v;
	uint32_t qpn = qp ? qp->qp_num : 0;
	if (qp) {
		r2cc_eng.v.destroy_qp(qp);
		r2cc_own_remove(qp);
	}
	if (!pc)
		return;
	pthread_mutex_lock(&v->mu);
	if (qp && r2cc_hmap_get(&pc->by_qpn, qpn) == r)
		r2cc_hmap_del(&pc->by_qpn, qpn);
	pc->room += path_need(r);
	bool last = --pc->users == 0;
	if (last)
		for (struct pcq **pp = &v->pcqs; *pp; pp = &(*pp)->next)
			if (*pp == pc) {
				*pp = pc->next;
				break;
			}
	pthread_mutex_unlock(&v->mu);
	if (last) {
		r2cc_eng.v.destroy_cq(pc->cq);
		r2cc_own_remove(pc->cq);
		r2cc_hmap_free(&pc->by_qpn);
		free(pc);
	}
}

void r2cc_destroy_private(struct ibv_qp *qp, struct ibv_cq *cq)
{
	if (qp) {
		r2cc_eng.v.destroy_qp(qp);
		r2cc_own_remove(qp);
	}
	if (cq) {
		r2cc_eng.v.destroy_cq(cq);
		r2cc_own_remove(cq);
	}
}

/* Forget the path being built (a failure, or the peer's exchange won). Under
 * r->mu. */
void r2cc_path_drop_new(struct r2cc_rqp *r)
{
	if (r->new_qp)
		r2cc_path_put(r, r->new_qp, r->new_pcq);
	r->new_qp = NULL;
	r->new_cq = NULL;
	r->new_pcq = NULL;
	if (r->new_sh)
		r2cc_qp_shadow_destroy(r->new_sh);
	r->new_sh = NULL;
}

/* RESET -> INIT on nic's port with the given access and partition key index.
 * 0 or a negative errno. */
int r2cc_own_qp_init(struct ibv_qp *qp, const struct r2cc_nic *nic, int access, uint16_t pkey_index)
{
	struct ibv_qp_attr a = {
	    .qp_state = IBV_QPS_INIT,
	    .pkey_index = pkey_index,
	    .port_num = nic->port ? nic->port : 1,
	    .qp_access_flags = access,
	};
	return r2cc_from_verbs(r2cc_eng.v.modify_qp(
	    qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
}

/* INIT -> RTR -> RTS towards l (PSNs 0, one outstanding READ each way). 0 or a
 * negative errno. */
int r2cc_own_qp_connect(struct ibv_qp *qp, const struct r2cc_nic *nic, const struct qp_link *l)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = l->mtu;
	a.dest_qp_num = l->qpn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = l->lid;
	a.ah_attr.sl = l->sl;
	a.ah_attr.port_num = nic->port ? nic->port : 1;
	if (l->gid) {
		a.ah_attr.is_global = 1;
		memcpy(a.ah_attr.grh.dgid.raw, l->gid, 16);
		a.ah_attr.grh.sgid_index = l->sgid_index;
		a.ah_attr.grh.hop_limit = l->hop_limit ? l->hop_limit : 255;
		a.ah_attr.grh.traffic_class = l->traffic_class;
		a.ah_attr.grh.flow_label = l->flow_label;
	}
	int rc = r2cc_from_verbs(r2cc_eng.v.modify_qp(
	    qp, &a,
	    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));
	if (rc)
		return rc;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = l->timeout;
	a.retry_cnt = l->retry_cnt;
	a.rnr_retry = l->rnr_retry;
	a.max_rd_atomic = 1;
	return r2cc_from_verbs(r2cc_eng.v.modify_qp(qp, &a,
						    IBV_QP_STATE | IBV_QP_TIMEOUT |
							IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
							IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC));
}

/* What kind of address a GID is: 0 none (an empty entry), 1 IPv4-mapped, 2 IPv6
 * link-local, 3 another IPv6 address. */
static int gid_class(const union ibv_gid *g)
{
	static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	if (!memcmp(g->raw, v4, sizeof(v4)))
		return 1;
	if (g->raw[0] == 0xfe && (g->raw[1] & 0xc0) == 0x80)
		return 2;
	for (int i = 0; i < 16; i++)
		if (g->raw[i])
			return 3;
	return 0;
}

/* Entry i of c's GID table, when it is of the same kind as the old path's
 * source GID: the same class of address and, where the library tells GID types,
 * the same type (RoCE v1 or v2). */
static bool gid_like(struct r2cc_ctx *c, uint8_t port, int i, const struct r2cc_qp *q,
		     union ibv_gid *gid)
{
	if (r2cc_eng.v.query_gid(c->ctx, port, i, gid))
		return false;
	int cls = gid_class(gid);
	if (!cls || cls != gid_class(&q->peer.sgid))
		return false;
	int t = q->path.sgid_type >= 0 && r2cc_eng.v.gid_type ? r2cc_eng.v.gid_type(c->ctx, port, i)
							      : -1;
	return t < 0 || t == q->path.sgid_type;
}

/*
 * The source GID of a new path on c for NCCL's QP q, which has a GRH (RoCE, or IB
 * across subnets): the entry with the index NCCL chose (NCCL_IB_GID_INDEX, or its
 * own pick) when it is of the same kind on this NIC, as on NICs of one model and
 * configuration, else the first entry of that kind (NCCL's pick can differ between
 * NICs whose tables differ). Its index, or -1 when the NIC has none: a GID of
 * another kind would be unroutable or leave the traffic class's network.
 */
#define GID_TABLE_MAX 256
int r2cc_path_match_sgid(struct r2cc_ctx *c, uint8_t port, const struct r2cc_qp *q,
			 union ibv_gid *gid)
{
	if (!r2cc_eng.v.query_gid)
		return -1;
	if (gid_like(c, port, q->path.sgid_index, q, gid))
		return q->path.sgid_index;
	for (int i = 0; i < GID_TABLE_MAX; i++)
		if (i != q->path.sgid_index && gid_like(c, port, i, q, gid))
			return i;
	return -1;
}

/* A loopback path (NCCL's GPU flush QP): the new QP, connected to itself. */
static void self_path(const struct r2cc_rqp *r, struct r2cc_nic *nic, struct peer_path *p)
{
	memset(p, 0, sizeof(*p));
	p->qpn = r->new_qp->qp_num;
	p->lid = nic->lid;
	p->port = nic->port ? nic->port : 1;
	p->mtu = r2cc_path_mtu(r, nic);
	memcpy(p->gid, r2cc_path_gid(r, nic), 16);
	snprintf(p->nic, sizeof(p->nic), "%s", nic->name);
}

/* The loop of the two below: with self, the path is made for the new QP itself
 * there (and connected to it) instead of p. */
static int on_healthy(struct r2cc_rqp *r, struct r2cc_nic *first, const char *rail,
		      const struct peer_path *p, struct peer_path *self, struct r2cc_nic **nicp)
{
	struct r2cc_nic *nic = first ? first : r2cc_place(r, rail);
	int rc = -ENODEV;
	for (int tries = 0; nic && tries <= R2CC_MAX_NICS; tries++) {
		rc = r2cc_path_new(r, nic);
		if (!rc && self) {
			self_path(r, nic, self);
			p = self;
		}
		if (!rc && p && (rc = r2cc_path_connect(r, p)) && r2cc_refused_by_dead_device(rc))
			r2cc_path_drop_new(r);
		*nicp = nic;
		if (!rc || !r2cc_refused_by_dead_device(rc))
			return rc;
		r2cc_nic_dead(nic, "a queue pair of hot repair's on it", rc);
		nic = r2cc_place(r, rail);
		rc = -ENODEV;
	}
	return rc;
}

/* A new path on the NIC placement gives (rail: the peer's, or NULL), and, with p,
 * connected to it; a NIC whose device refuses (dead: EIO, ENETDOWN) has failed,
 * and the next one is tried. 0 (*nicp the NIC), -ENODEV when none is left, or the
 * error of the last try (a connection refused otherwise leaves the path made). */
int r2cc_path_on_healthy(struct r2cc_rqp *r, struct r2cc_nic *first, const char *rail,
			 const struct peer_path *p, struct r2cc_nic **nicp)
{
	return on_healthy(r, first, rail, p, NULL, nicp);
}

/* The same for a loopback QP: connected to itself, *p its path. */
int r2cc_path_on_healthy_self(struct r2cc_rqp *r, struct r2cc_nic *first, struct peer_path *p,
			      struct r2cc_nic **nicp)
{
	return on_healthy(r, first, NULL, NULL, p, nicp);
}

/* A new path of r's on nic connected to itself (a GPU flush QP's helper). */
int r2cc_path_new_self(struct r2cc_rqp *r, struct r2cc_nic *nic)
{
	struct peer_path p;
	int rc = r2cc_path_new(r, nic);
	if (rc)
		return rc;
	self_path(r, nic, &p);
	rc = r2cc_path_connect(r, &p);
	if (rc)
		r2cc_path_drop_new(r);
	return rc;
}

/* A QP (and its CQ) of R2CC's own on nic, in INIT. */
int r2cc_path_new(struct r2cc_rqp *r, struct r2cc_nic *nic)
{
	struct r2cc_ctx *c = nic == r->orig_nic ? r->orig_ctx : r2cc_ctx_of_nic(nic);
	struct ibv_pd *pd = r2cc_pd_on(r, nic);
	if (!c || !pd || !r->q)
		return -ENODEV;
	struct pcq *pc = pcq_get(r, c);
	if (!pc)
		return -errno ? -errno : -ENOMEM;
	struct ibv_cq *cq = pc->cq;
	struct ibv_qp_init_attr ia = {
	    .send_cq = cq,
	    .recv_cq = cq,
	    .cap = r->cap,
	    .qp_type = IBV_QPT_RC,
	    .sq_sig_all = r->sq_sig_all,
	};
	ia.cap.max_send_wr += 8; /* room for the markers of a later fence */
	ia.cap.max_recv_wr += 8;
	struct ibv_qp *qp = r2cc_eng.v.create_qp(pd, &ia);
	if (!qp) {
		int e = errno ? errno : ENOMEM;
		r2cc_path_put(r, NULL, pc);
		return -e;
	}
	r2cc_own_add(qp);
	int rc = r2cc_own_qp_init(
	    qp, nic, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
	    r->q->path.pkey_index);
	if (!rc && r->q->peer.has_grh) {
		int i = r2cc_path_match_sgid(c, nic->port ? nic->port : 1, r->q, &r->new_sgid);
		if (i < 0) {
			R2CC_WARN("repair: qp 0x%x: %s has no GID of the kind NCCL's path uses "
				  "(index %u there)",
				  r->qpn, nic->name, r->q->path.sgid_index);
			rc = -ENOENT;
		}
		r->new_sgid_index = (uint8_t)(i < 0 ? 0 : i);
	}
	/* The shadow records NCCL's requests only (markers and probes go around
	 * it): NCCL's caps, not the QP's, which would double its rings. */
	struct r2cc_qp_shadow_attr sa = {
	    .max_send_wr = r->cap.max_send_wr,
	    .max_recv_wr = r->cap.max_recv_wr,
	    .max_send_sge = r->cap.max_send_sge,
	    .max_recv_sge = r->cap.max_recv_sge,
	    .max_inline_data = r->cap.max_inline_data,
	    .sq_sig_all = r->sq_sig_all,
	    .tag_fn = r2cc_cts_tag, /* NCCL's keys, as the shadow records them */
	    .tag_ctx = r->q,
	    .tag_max_bytes = R2CC_CTS_MAX_BYTES, /* longer: data */
	};
	struct r2cc_qp_shadow *sh = NULL;
	if (!rc)
		rc = r2cc_qp_shadow_create(&sa, &sh);
	if (rc) {
		r2cc_path_put(r, qp, pc);
		return rc;
	}
	r->new_qp = qp;
	r->new_cq = cq;
	r->new_pcq = pc;
	r->new_ctx = c;
	r->new_sh = sh;
	return 0;
}

/* The new path towards p with NCCL's path attributes (its GRH's class, flow and
 * hop limit, its service level) from the matching source GID. */
int r2cc_path_connect(struct r2cc_rqp *r, const struct peer_path *p)
{
	const struct r2cc_qp *q = r->q;
	const struct r2cc_nic *nic = r->new_ctx->nic;
	int mtu = r2cc_path_mtu(r, nic);
	struct qp_link l = {
	    .qpn = p->qpn,
	    .lid = p->lid,
	    .mtu = (enum ibv_mtu)(p->mtu && p->mtu < mtu ? p->mtu : mtu),
	    .gid = q->peer.has_grh ? p->gid : NULL,
	    .sgid_index = r->new_sgid_index,
	    .hop_limit = q->path.hop_limit,
	    .traffic_class = q->path.traffic_class,
	    .flow_label = q->path.flow_label,
	    .sl = q->path.sl,
	    .timeout = q->timeout ? q->timeout : 20,
	    .retry_cnt = q->retry_cnt ? q->retry_cnt : 7,
	    .rnr_retry = q->rnr_retry ? q->rnr_retry : 7,
	};
	return r2cc_own_qp_connect(r->new_qp, nic, &l);
}
