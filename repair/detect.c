/*
 * Detection: what starts a repair. An error completion, a post or connect that a
 * dead device refuses, an async event (port down or up, device fatal, QP error),
 * a NIC declared failed (R2CC_FAILED_NODE / R2CC_FAILED_HCA, moved at NCCL's first
 * post). Each marks the record detected and queues it for the repair thread; the
 * stall scan (scan.c) and the peer's REQ (exchange.c) come here too.
 */
#include "repair/drill.h"
#include "repair/engine_priv.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static void declared_move(struct r2cc_rqp *r);

/* Record a detection on r: when, why, and the incident of its NIC. Under r2cc_eng.mu. */
void r2cc_detect_note(struct r2cc_rqp *r, const char *cause, int status)
{
	int64_t t = now_ns();
	r->t_detect = t;
	r->status_seen = status;
	snprintf(r->cause, sizeof(r->cause), "%s", cause);
	r->incident = r2cc_incident_get(r->failback_to ? r->failback_to->name : r->cur_nic->name,
					r->cause, t, r->born_late);
	r2cc_eng.inc[r->incident].qps++;
	/* the drill's (repair/drill.h): on a path it cuts, or its failback after up */
	if (r2cc_drill_on && (r2cc_drill_cut(r->cur_qp) || (r->q && r2cc_drill_cut(r->q->qp))))
		r2cc_eng.inc[r->incident].drill = true;
	r2cc_eng.inc[r->incident].created_after += r->born_late;
}

void r2cc_detect(struct r2cc_rqp *r, const char *cause, int status)
{
	if (!r2cc_active())
		return; /* pass-through now (a forked child has no repair thread) */
	int s = load_state(r);
	if ((s != RQ_HEALTHY && s != RQ_MIGRATED) || !connected(r))
		return;
	/* The state changes under r2cc_eng.mu, with the note: a thread that sees
	 * RQ_DETECTED and takes the lock reads the note's incident, not the one before. */
	pthread_mutex_lock(&r2cc_eng.mu);
	if (!__atomic_compare_exchange_n(&r->state, &s, RQ_DETECTED, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_RELAXED)) {
		pthread_mutex_unlock(&r2cc_eng.mu);
		return;
	}
	r2cc_detect_note(r, cause, status);
	r2cc_engine_start_locked();
	r2cc_work_push_locked(r);
	pthread_mutex_unlock(&r2cc_eng.mu);
}

/* An error completion on r: a repair takes it (and re-posts what failed), so it is
 * kept from NCCL; or none does, because NCCL moved the QP out of RTS itself (as at
 * teardown), and the completion is NCCL's. */
bool r2cc_detect_hides(struct r2cc_rqp *r, const char *why, int status)
{
	r2cc_detect(r, why, status);
	int s = load_state(r);
	return s != RQ_HEALTHY && s != RQ_MIGRATED;
}

/* A failure seen on nic, for a QP found on it: it counts only while the QP is still
 * there. A list of QPs is collected, then each is detected; one may have moved off
 * the NIC meanwhile (another detection got there first), and its new path has not
 * failed. */
void r2cc_detect_on(struct r2cc_rqp *r, const struct r2cc_nic *nic, const char *cause, int status)
{
	if (__atomic_load_n(&r->cur_nic, __ATOMIC_ACQUIRE) == nic)
		r2cc_detect(r, cause, status);
}

/* Errors with which a dead device refuses posts (the provider's EIO after a fatal
 * event, ENETDOWN), as negative errnos: the NIC has failed, not the request. */
bool r2cc_refused_by_dead_device(int rc)
{
	return rc == -EIO || rc == -ENETDOWN;
}
void r2cc_nic_dead(struct r2cc_nic *nic, const char *what, int rc)
{
	char why[112];
	snprintf(why, sizeof(why), "%s failed (%s): the device is dead", what, strerror(-rc));
	r2cc_failback_never(nic);
	r2cc_nic_failed(nic, why);
}

bool r2cc_repair_reg_refused(struct r2cc_nic *nic, int rc)
{
	if (!nic || !r2cc_refused_by_dead_device(rc) || !r2cc_repair_enabled())
		return false;
	r2cc_nic_dead(nic, "a memory registration on it", rc);
	return true;
}

/*
 * A dead device refused NCCL a CQ or a QP: the NIC has failed, and the object NCCL
 * asked for is made as a stand-in on a healthy sibling of the same provider (its
 * functions are the dead device's; a stand-in QP never leaves RESET there: NCCL's
 * state changes are kept, not applied, and the QP migrates at RTS as any QP on the
 * failed NIC does). The sibling's context, or NULL (no repair, no sibling).
 */
struct r2cc_ctx *r2cc_repair_stand_in(struct r2cc_ctx *dead, int rc)
{
	if (!dead || !dead->nic || !r2cc_refused_by_dead_device(rc) || !r2cc_repair_enabled() ||
	    !r2cc_active() || !r2cc_param.mr_mirror)
		return NULL;
	r2cc_nic_dead(dead->nic, "creating a queue or completion queue on it", rc);
	struct r2cc_ctx *best = NULL;
	int n = r2cc_nic_count();
	for (int i = 0; i < n; i++) {
		struct r2cc_nic *b = r2cc_nic_by_index(i);
		struct r2cc_ctx *c =
		    b && b != dead->nic &&
			    __atomic_load_n(&b->state, __ATOMIC_RELAXED) == R2CC_NIC_UP &&
			    r2cc_mr_mirror_pd(b)
			? r2cc_ctx_of_nic(b)
			: NULL;
		if (c && c->post_send == dead->post_send && c->poll_cq == dead->poll_cq &&
		    (!best || r2cc_stall_last_drain(b) > r2cc_stall_last_drain(best->nic)))
			best = c;
	}
	return best;
}

bool r2cc_repair_modify_refused(struct r2cc_qp *q, int rc, int to_state)
{
	struct r2cc_rqp *r = q->rep;
	/* On RoCE the RTR resolves the peer's address through the NIC's network device,
	 * which refuses while its link is down: those errors too, on a NIC that failed. */
	bool dead = r2cc_refused_by_dead_device(rc);
	bool down =
	    __atomic_load_n(&q->ctx->nic->state, __ATOMIC_RELAXED) == R2CC_NIC_DOWN &&
	    (rc == -ENETUNREACH || rc == -EHOSTUNREACH || rc == -ENODATA || rc == -EADDRNOTAVAIL);
	if (!r || !(dead || down) || !r2cc_active() ||
	    (to_state != IBV_QPS_INIT && to_state != IBV_QPS_RTR && to_state != IBV_QPS_RTS))
		return false;
	if (dead) /* (a NIC that is down has failed already) */
		r2cc_nic_dead(q->ctx->nic, "connecting a queue pair on it", rc);
	return true;
}

/* Mark this node's declared NICs (the node index is known once a directory came;
 * NCCL may open NICs later, so this runs again when a QP gets ready). */
static bool declared_mark(void)
{
	pthread_mutex_lock(&r2cc_eng.mu);
	int node = r2cc_eng.node_index;
	bool any = r2cc_eng.declared.nentries > 0;
	pthread_mutex_unlock(&r2cc_eng.mu);
	if (!any || node < 0)
		return false;
	char key[R2CC_CTL_NODE_KEY_MAX];
	r2cc_node_key(key, sizeof(key));
	return r2cc_nic_mark_declared(&r2cc_eng.declared, node, key) > 0;
}

static bool declared_fresh(const struct r2cc_rqp *r, const void *arg)
{
	(void)arg;
	const struct r2cc_qp *q = r2cc_rqp_qp(r);
	return q && __atomic_load_n(&q->state, __ATOMIC_RELAXED) == IBV_QPS_RTS &&
	       !r->declared_pending && load_state(r) == RQ_HEALTHY &&
	       __atomic_load_n(&r->cur_nic->state, __ATOMIC_RELAXED) == R2CC_NIC_DECLARED;
}

/* The first directory: QPs connected before it was known move now. */
void r2cc_declared_apply(void)
{
	if (!declared_mark())
		return;
	struct r2cc_rqp **list;
	int n = r2cc_rqp_collect(&list, declared_fresh, NULL);
	for (int i = 0; i < n; i++)
		declared_move(list[i]);
	r2cc_rqp_collect_done(list);
}

/*
 * A QP on a declared-failed NIC moves before it carries anything. Its direction
 * (what Balance evens out per NIC) shows in NCCL's first post, so until then the
 * QP's posts take the slow path, which moves it at that first post. A QP that
 * already carried work moves at once.
 */
static void declared_move(struct r2cc_rqp *r)
{
	pthread_mutex_lock(&r->mu);
	bool fresh =
	    r->q && !r2cc_qp_sent(r->q) && !r2cc_qp_received(r->q) && load_state(r) == RQ_HEALTHY;
	if (fresh) {
		r->declared_pending = true;
		r2cc_cq_gate_close(&r->q->gate);
	}
	pthread_mutex_unlock(&r->mu);
	if (!fresh)
		r2cc_detect(r, "declared failed (R2CC_FAILED_NODE/R2CC_FAILED_HCA)", 0);
}

void r2cc_repair_qp_ready(struct r2cc_qp *q)
{
	if (!q->rep)
		return;
	/* Its peer's process is searched from now on (loopback QPs have none). */
	struct r2cc_rqp *r = q->rep;
	if (!r->tracked) {
		r2cc_peer_ep_local(q, &r->ep_local);
		r2cc_peer_ep_remote(q, &r->ep_remote);
		r->tracked = !r2cc_peer_ep_equal(&r->ep_local, &r->ep_remote) &&
			     r2cc_peer_track_qp(q, r) == 0;
	}
	__atomic_store_n(&r->ready, true, __ATOMIC_SEQ_CST);
	r2cc_selftest_calibrate(q->ctx->nic);
	declared_mark();
	int st = __atomic_load_n(&q->ctx->nic->state, __ATOMIC_SEQ_CST);
	if (st == R2CC_NIC_DECLARED && !q->rep->declared_pending)
		declared_move(q->rep);
	else if (st == R2CC_NIC_DOWN) {
		pthread_mutex_lock(&r2cc_eng.mu);
		r->born_late = true;
		pthread_mutex_unlock(&r2cc_eng.mu);
		r2cc_detect(q->rep, "created on a NIC that has failed", 0);
	}
}

static void nic_failed(struct r2cc_nic *nic, const char *why, bool tell_node)
{
	r2cc_nic_failure_seen(nic);
	if (__atomic_load_n(&nic->state, __ATOMIC_RELAXED) == R2CC_NIC_UP) {
		if (tell_node)
			r2cc_ledger_dead_put(nic->name, now_ns(), r2cc_eng.pid, why);
		R2CC_WARN("repair: %s: %s; migrating its queue pairs", nic->name, why);
	}
	__atomic_store_n(&nic->state, R2CC_NIC_DOWN, __ATOMIC_SEQ_CST);
	struct r2cc_rqp **list;
	int n = r2cc_rqp_collect(&list, r2cc_rqp_on_nic, nic);
	for (int i = 0; i < n; i++)
		r2cc_detect_on(list[i], nic, why, IBV_WC_RETRY_EXC_ERR);
	r2cc_rqp_collect_done(list);
}

/* The NIC itself is dead (a failed self-test, a port error, a fatal event): every
 * queue pair on it moves, and the node's other processes are told through the
 * ledger (repair/model/ledger.h). */
void r2cc_nic_failed(struct r2cc_nic *nic, const char *why)
{
	nic_failed(nic, why, true);
}

/* Another process of this node found one of its NICs dead (the stall scan reads
 * the ledger): the queue pairs of this process on it move at once, with that
 * process's evidence. */
void r2cc_nic_failed_on_node(struct r2cc_nic *nic, int pid, const char *its_why)
{
	char why[R2CC_LEDGER_WHY + 48];
	snprintf(why, sizeof(why), "%s (found by process %d of this node)", its_why, pid);
	nic_failed(nic, why, false);
}

bool r2cc_repair_async_event(struct ibv_context *ctx, struct ibv_async_event *ev)
{
	if (!r2cc_repair_enabled())
		return false;
	struct r2cc_ctx *c = r2cc_ctx_find(ctx);
	switch (ev->event_type) {
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_DEVICE_FATAL:
		if (!c)
			return false;
		if (ev->event_type == IBV_EVENT_DEVICE_FATAL)
			r2cc_failback_never(c->nic);
		r2cc_nic_failed(c->nic, ev->event_type == IBV_EVENT_PORT_ERR
					    ? "port error event"
					    : "device fatal event");
		break;
	case IBV_EVENT_PORT_ACTIVE:
		/* With failback the repair thread probes it and brings it back;
		 * without, it serves new placements from now on. */
		if (c && __atomic_load_n(&c->nic->state, __ATOMIC_RELAXED) == R2CC_NIC_DOWN) {
			R2CC_INFO("repair: %s: port active again; %s", c->nic->name,
				  r2cc_param.failback_ms ? "failback once its self-tests pass"
							 : "usable for new placements");
			if (!r2cc_param.failback_ms)
				__atomic_store_n(&c->nic->state, R2CC_NIC_UP, __ATOMIC_RELAXED);
		}
		return false;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED: {
		struct ibv_qp *qp = ev->element.qp;
		if (r2cc_own_has(qp))
			break; /* ours: the failure shows in its completions */
		struct r2cc_qp *q = r2cc_qp_find(qp);
		if (!q || !q->rep || load_state(q->rep) == RQ_FAILED)
			return false;
		if (ev->event_type == IBV_EVENT_QP_FATAL ||
		    ev->event_type == IBV_EVENT_QP_REQ_ERR ||
		    ev->event_type == IBV_EVENT_QP_ACCESS_ERR)
			r2cc_detect(q->rep, "QP error event", IBV_WC_GENERAL_ERR);
		break;
	}
	case IBV_EVENT_CQ_ERR:
		if (!r2cc_own_has(ev->element.cq))
			return false;
		break;
	default:
		return false;
	}
	if (r2cc_eng.v.ack_async_event)
		r2cc_eng.v.ack_async_event(ev);
	return true;
}
