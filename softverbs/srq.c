/*
 * Shared receive queues of the software RDMA device. An SRQ lives in the fabric's
 * SRQ table, like a QP's own receive queue, because the process that executes a SEND
 * or WRITE_WITH_IMM takes the receive itself (exec.c, sv_recv_get) while the owner need
 * not run. Several QPs, executed by different processes, take from one SRQ, so a
 * receive is removed under the SRQ's lock when it is taken, never peeked at. When
 * that leaves fewer receives than an armed limit, the limit is disarmed and the
 * owner's progress thread raises IBV_EVENT_SRQ_LIMIT_REACHED on the SRQ's context
 * (within its 2 ms tick). Resizing (IBV_SRQ_MAX_WR) is refused, as mlx5 refuses it.
 */
#include "softverbs/internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct sv_srq *to_srq(struct ibv_srq *srq)
{
	return sv_container_of(srq, struct sv_srq, srq);
}

SV_EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *init)
{
	struct sv_fabric *f = sv_proc.f;
	struct sv_srq_slot *s;
	struct sv_srq *srq;
	uint32_t gen;
	int i;

	if (init->attr.max_wr < 1 || init->attr.max_wr > SV_SRQ_CAP ||
	    init->attr.max_sge > SV_RQ_SGE) {
		errno = EINVAL;
		return NULL;
	}
	srq = calloc(1, sizeof(*srq));
	if (!srq) {
		errno = ENOMEM;
		return NULL;
	}
	sv_lock(&f->lock);
	for (i = 0; i < SV_MAX_SRQS && atomic_load(&f->srqs[i].id); i++)
		;
	if (i == SV_MAX_SRQS) {
		pthread_mutex_unlock(&f->lock);
		free(srq);
		errno = ENOMEM;
		return NULL;
	}
	s = &f->srqs[i];
	s->pid = getpid();
	s->pd = sv_container_of(pd, struct sv_pd, pd)->id;
	s->size = init->attr.max_wr;
	s->max_sge = init->attr.max_sge ? init->attr.max_sge : 1;
	sv_mutex_init_shared(&s->lock);
	s->head = s->tail = 0;
	s->limit = 0; /* srq_limit is not used at creation */
	atomic_store(&s->limit_hit, false);
	gen = atomic_fetch_add(&f->gen, 1) & 0x7fffffff;
	atomic_store(&s->id, gen ? gen : 1);
	pthread_mutex_unlock(&f->lock);

	srq->slot = i;
	srq->s = s;
	srq->srq.context = pd->context;
	srq->srq.srq_context = init->srq_context;
	srq->srq.pd = pd;
	srq->srq.handle = (uint32_t)i;
	pthread_mutex_init(&srq->srq.mutex, NULL);
	pthread_cond_init(&srq->srq.cond, NULL);
	atomic_fetch_add(&sv_container_of(pd, struct sv_pd, pd)->users, 1);
	init->attr.max_wr = s->size;
	init->attr.max_sge = s->max_sge;
	pthread_mutex_lock(&sv_proc.lock);
	srq->next = sv_proc.srqs;
	sv_proc.srqs = srq;
	pthread_mutex_unlock(&sv_proc.lock);
	return &srq->srq;
}

SV_EXPORT int ibv_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr, int mask)
{
	struct sv_srq_slot *s = to_srq(ibsrq)->s;
	int rc = 0;

	if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT))
		return EINVAL;
	if (mask & IBV_SRQ_MAX_WR)
		return EINVAL; /* no resizing */
	if (!(mask & IBV_SRQ_LIMIT))
		return 0;
	sv_lock(&s->lock);
	if (attr->srq_limit >= s->size)
		rc = EINVAL;
	else
		s->limit = attr->srq_limit;
	pthread_mutex_unlock(&s->lock);
	return rc;
}

SV_EXPORT int ibv_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr)
{
	struct sv_srq_slot *s = to_srq(ibsrq)->s;

	sv_lock(&s->lock);
	attr->max_wr = s->size;
	attr->max_sge = s->max_sge;
	attr->srq_limit = s->limit;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

SV_EXPORT int ibv_destroy_srq(struct ibv_srq *ibsrq)
{
	struct sv_srq *srq = to_srq(ibsrq);
	struct sv_srq **pp;

	if (atomic_load(&srq->users))
		return EBUSY;
	pthread_mutex_lock(&sv_proc.lock);
	for (pp = &sv_proc.srqs; *pp && *pp != srq; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = srq->next;
	pthread_mutex_unlock(&sv_proc.lock);
	atomic_store(&srq->s->id, 0);
	atomic_fetch_sub(&sv_container_of(ibsrq->pd, struct sv_pd, pd)->users, 1);
	pthread_mutex_destroy(&ibsrq->mutex);
	pthread_cond_destroy(&ibsrq->cond);
	free(srq);
	return 0;
}

int sv_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct sv_srq_slot *s = to_srq(ibsrq)->s;
	int rc = 0;

	sv_lock(&s->lock);
	for (; wr; wr = wr->next) {
		struct sv_rwqe *e;

		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > s->max_sge) {
			rc = EINVAL;
			break;
		}
		if (s->tail - s->head >= s->size) {
			rc = ENOMEM;
			break;
		}
		e = &s->rq[s->tail % SV_SRQ_CAP];
		e->wr_id = wr->wr_id;
		e->num_sge = (uint32_t)wr->num_sge;
		if (wr->num_sge)
			memcpy(e->sge, wr->sg_list, sizeof(struct ibv_sge) * (size_t)wr->num_sge);
		s->tail++;
	}
	pthread_mutex_unlock(&s->lock);
	if (rc)
		*bad_wr = wr;
	return rc;
}

bool sv_srq_take(struct sv_fabric *f, int slot, uint32_t id, struct sv_rwqe *out)
{
	struct sv_srq_slot *s = &f->srqs[slot];
	bool got = false;

	sv_lock(&s->lock);
	if (atomic_load(&s->id) == id && s->head != s->tail) {
		*out = s->rq[s->head++ % SV_SRQ_CAP];
		got = true;
		if (s->limit && s->tail - s->head < s->limit) {
			s->limit = 0;
			atomic_store(&s->limit_hit, true);
		}
	}
	pthread_mutex_unlock(&s->lock);
	return got;
}

void sv_srq_events(void)
{
	pthread_mutex_lock(&sv_proc.lock);
	for (struct sv_srq *srq = sv_proc.srqs; srq; srq = srq->next) {
		struct ibv_async_event ev = {.event_type = IBV_EVENT_SRQ_LIMIT_REACHED};

		if (!atomic_exchange(&srq->s->limit_hit, false))
			continue;
		ev.element.srq = &srq->srq;
		sv_ctx_push_event(sv_container_of(srq->srq.context, struct sv_ctx, vctx.context),
				  &ev);
	}
	pthread_mutex_unlock(&sv_proc.lock);
}
