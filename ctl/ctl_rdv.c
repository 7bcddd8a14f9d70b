/*
 * The rendezvous: a round collects one registration per rank (slots), then
 * becomes a struct r2cc_ctl_rdir (ctl_dir.c) that answers every rank with its
 * head and, for as long as any rank of the round remains, the lookups and NIC
 * reports of its ranks. Each completed round of a job has its own number.
 *
 * (Control thread; ctl.c has the overview.)
 */
#include "ctl/ctl_thread.h"
#include "ctl/ctl_priv.h"
#include "shim/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Rendezvous (control thread). */

/* Only connections that wait in an open round cost a look at its slots. */
void r2cc_ctl_rdv_forget_conn(const struct conn *c)
{
	if (c->rdv_slots == 0)
		return;
	pthread_mutex_lock(&r2cc_ctl.lock);
	for (struct job_ent *j = r2cc_ctl.jobs; j; j = j->next) {
		struct rdv_round *r = j->round;
		for (int i = 0; r && i < r->nranks; i++) {
			if (r->slots[i].present && r->slots[i].conn_uid == c->uid) {
				free(r->slots[i].member);
				r->slots[i] = (struct rdv_slot){0};
				r->count--;
			}
		}
		/* An empty round can start over with another size. */
		if (r && r->count == 0) {
			r2cc_ctl_round_free(r);
			j->round = NULL;
		}
	}
	pthread_mutex_unlock(&r2cc_ctl.lock);
}

uint32_t r2cc_ctl_get_u32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

void r2cc_ctl_put_u32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)(v >> 24);
	p[1] = (unsigned char)(v >> 16);
	p[2] = (unsigned char)(v >> 8);
	p[3] = (unsigned char)v;
}

/* The slot's connection no longer waits in the round. */
static void slot_release(struct rdv_slot *s)
{
	struct conn *c = r2cc_ctl_conn_by_uid(s->conn_uid);
	if (c && c->rdv_slots > 0)
		c->rdv_slots--;
}

/* Every rank is in: the round becomes a directory of the rendezvous, and each
 * rank gets its head (O(runs + its node's ranks) bytes). */
static void rdv_complete(struct job_ent *j)
{
	struct rdv_round *r = j->round;
	unsigned char **member = malloc(sizeof(*member) * (size_t)r->nranks);
	size_t *mlen = malloc(sizeof(*mlen) * (size_t)r->nranks);
	struct rdv_done *d = malloc(sizeof(*d));
	int status = member && mlen && d ? 0 : -ENOMEM;
	struct r2cc_ctl_rdir *rd = NULL;
	if (status == 0) {
		for (int i = 0; i < r->nranks; i++) {
			member[i] = r->slots[i].member;
			mlen[i] = r->slots[i].mlen;
			r->slots[i].member = NULL;
		}
		rd = r2cc_ctl_rdir_new(r->nranks, ++j->next_gen, member, mlen, &status);
	} else {
		free(member);
		free(mlen);
	}
	if (status)
		R2CC_WARN("control plane: cannot build the directory of job %016llx (%d ranks): "
			  "%s",
			  (unsigned long long)j->job.id, r->nranks, strerror(-status));
	for (int i = 0; i < r->nranks; i++) {
		struct rdv_slot *s = &r->slots[i];
		struct conn *c = r2cc_ctl_conn_by_uid(s->conn_uid);
		slot_release(s);
		if (!c)
			continue;
		unsigned char *head = NULL;
		size_t len = 0;
		int st = rd ? r2cc_ctl_rdir_head(rd, i, &head, &len) : status;
		r2cc_ctl_send_reply(c, j->job.secret, j->job.id, s->req_id, -1, i, st, head, len);
		free(head);
	}
	if (rd) {
		R2CC_INFO("control plane: job %016llx: all %d ranks registered (round %u, %zu "
			  "bytes here)",
			  (unsigned long long)j->job.id, r->nranks, r2cc_ctl_rdir_gen(rd),
			  r2cc_ctl_rdir_bytes(rd));
		d->rd = rd;
		d->next = j->done;
		j->done = d;
	} else {
		free(d);
	}
	pthread_mutex_lock(&r2cc_ctl.lock);
	r2cc_ctl_round_free(r);
	j->round = NULL;
	pthread_mutex_unlock(&r2cc_ctl.lock);
}

void r2cc_ctl_rdv_register(struct conn *c, struct job_ent *j, const struct r2cc_ctl_hdr *h,
			   const unsigned char *p)
{
	struct r2cc_ctl_member m;
	uint32_t rank = h->len >= 8 ? r2cc_ctl_get_u32(p) : 0;
	uint32_t nranks = h->len >= 8 ? r2cc_ctl_get_u32(p + 4) : 0;
	if (h->len < 8 || nranks == 0 || nranks > R2CC_CTL_MAX_RANKS || rank >= nranks ||
	    !(h->flags & R2CC_CTL_F_REQUEST) ||
	    r2cc_ctl_member_decode(p + 8, h->len - 8, &m) != 0) {
		r2cc_ctl_count_drop(R2CC_CTL_DROP_MALFORMED, c);
		r2cc_ctl_send_reply(c, j->job.secret, j->job.id, h->req_id, -1, h->from_rank,
				    -EPROTO, NULL, 0);
		return;
	}
	if (!__atomic_load_n(&j->serve, __ATOMIC_ACQUIRE)) {
		r2cc_ctl_send_reply(c, j->job.secret, j->job.id, h->req_id, -1, h->from_rank,
				    -ENOENT, NULL, 0);
		return;
	}
	struct rdv_round *r = j->round;
	if (r && r->nranks != (int)nranks) {
		R2CC_WARN("control plane: job %016llx: rank %u registers with %u ranks, others "
			  "with %d",
			  (unsigned long long)j->job.id, rank, nranks, r->nranks);
		r2cc_ctl_send_reply(c, j->job.secret, j->job.id, h->req_id, -1, h->from_rank,
				    -EINVAL, NULL, 0);
		return;
	}
	unsigned char *copy = malloc(h->len - 8);
	if (!r) {
		r = calloc(1, sizeof(*r));
		if (r)
			r->slots = calloc(nranks, sizeof(*r->slots));
		if (!r || !r->slots || !copy) {
			free(r);
			free(copy);
			r2cc_ctl_send_reply(c, j->job.secret, j->job.id, h->req_id, -1,
					    h->from_rank, -ENOMEM, NULL, 0);
			return;
		}
		r->nranks = (int)nranks;
		j->round = r;
	} else if (!copy) {
		r2cc_ctl_send_reply(c, j->job.secret, j->job.id, h->req_id, -1, h->from_rank,
				    -ENOMEM, NULL, 0);
		return;
	}
	memcpy(copy, p + 8, h->len - 8);
	struct rdv_slot *s = &r->slots[rank];
	if (s->present) {
		/* The same rank again before the round completed: the newest wins. */
		struct conn *old = r2cc_ctl_conn_by_uid(s->conn_uid);
		if (old)
			r2cc_ctl_send_reply(old, j->job.secret, j->job.id, s->req_id, -1,
					    (int32_t)rank, -ECANCELED, NULL, 0);
		slot_release(s);
		free(s->member);
		r->count--;
	}
	pthread_mutex_lock(&r2cc_ctl.lock);
	*s = (struct rdv_slot){true, c->uid, h->req_id, copy, h->len - 8};
	r->count++;
	pthread_mutex_unlock(&r2cc_ctl.lock);
	c->rdv_slots++;
	if (r->count == r->nranks)
		rdv_complete(j);
}

void r2cc_ctl_rdv_cancel(struct conn *c, struct job_ent *j, const struct r2cc_ctl_hdr *h,
			 const unsigned char *p)
{
	if (h->len != 8) {
		r2cc_ctl_count_drop(R2CC_CTL_DROP_MALFORMED, c);
		return;
	}
	uint32_t rank = r2cc_ctl_get_u32(p), req_id = r2cc_ctl_get_u32(p + 4);
	struct rdv_round *r = j->round;
	if (!r || rank >= (uint32_t)r->nranks)
		return;
	struct rdv_slot *s = &r->slots[rank];
	if (s->present && s->conn_uid == c->uid && s->req_id == req_id) {
		slot_release(s);
		pthread_mutex_lock(&r2cc_ctl.lock);
		free(s->member);
		*s = (struct rdv_slot){0};
		if (--r->count == 0) {
			r2cc_ctl_round_free(r);
			j->round = NULL;
		}
		pthread_mutex_unlock(&r2cc_ctl.lock);
	}
}

/* The completed round a request names in its first word; NULL when it is
 * gone (every rank left) or never was. */
static struct rdv_done *rdv_find(struct job_ent *j, const struct r2cc_ctl_hdr *h,
				 const unsigned char *p)
{
	if (h->len < 4)
		return NULL;
	uint32_t gen = r2cc_ctl_get_u32(p);
	for (struct rdv_done *d = j->done; d; d = d->next)
		if (r2cc_ctl_rdir_gen(d->rd) == gen)
			return d;
	return NULL;
}

/* LOOKUP and NICS: requests of a round's ranks, answered from its directory. */
void r2cc_ctl_rdv_serve(struct conn *c, struct job_ent *j, const struct r2cc_ctl_hdr *h,
			const unsigned char *p)
{
	if (!(h->flags & R2CC_CTL_F_REQUEST)) {
		r2cc_ctl_count_drop(R2CC_CTL_DROP_MALFORMED, c);
		return;
	}
	struct rdv_done *d =
	    __atomic_load_n(&j->serve, __ATOMIC_ACQUIRE) ? rdv_find(j, h, p) : NULL;
	unsigned char *out = NULL;
	size_t olen = 0;
	int rc = -ENOENT;
	if (d && h->type == CTL_T_LOOKUP)
		rc = r2cc_ctl_rdir_lookup(d->rd, p, h->len, &out, &olen);
	else if (d)
		rc = r2cc_ctl_rdir_nics(d->rd, h->from_rank, p, h->len);
	if (rc == -EPROTO)
		r2cc_ctl_count_drop(R2CC_CTL_DROP_MALFORMED, c);
	r2cc_ctl_send_reply(c, j->job.secret, j->job.id, h->req_id, -1, h->from_rank, rc, out,
			    olen);
	free(out);
}

void r2cc_ctl_rdv_leave(struct conn *c, struct job_ent *j, const struct r2cc_ctl_hdr *h,
			const unsigned char *p)
{
	if (h->len != 8) {
		r2cc_ctl_count_drop(R2CC_CTL_DROP_MALFORMED, c);
		return;
	}
	struct rdv_done **dp = &j->done;
	while (*dp && r2cc_ctl_rdir_gen((*dp)->rd) != r2cc_ctl_get_u32(p))
		dp = &(*dp)->next;
	struct rdv_done *d = *dp;
	if (!d || (int32_t)r2cc_ctl_get_u32(p + 4) != h->from_rank)
		return;
	if (r2cc_ctl_rdir_leave(d->rd, h->from_rank)) {
		R2CC_INFO("control plane: job %016llx: every rank of round %u left",
			  (unsigned long long)j->job.id, r2cc_ctl_rdir_gen(d->rd));
		*dp = d->next;
		r2cc_ctl_rdir_free(d->rd);
		free(d);
	}
}
