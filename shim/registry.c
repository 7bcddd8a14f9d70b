/*
 * The registries declared in registry.h. Records are created and removed by
 * the verbs wrappers (never on the data path) under registry_lock; the maps
 * give the data path lock-free lookups. MRs also live in an array sorted by
 * start address for interval lookups (read under a rwlock: MR lookups are
 * repair-time work, not data-path work).
 */
#include "shim/registry.h"
#include "shim/core.h"
#include "shim/failspec.h"
#include "shim/common.h"
#include "shim/log.h"
#include "shim/stats.h"

#include <errno.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

struct r2cc_map r2cc_qp_map, r2cc_cq_map, r2cc_ctx_map;
static struct r2cc_map pd_map, mr_map, qpnum_map, lkey_map, rkey_map;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct r2cc_nic *nics[R2CC_MAX_NICS];
static int nnics;

static pthread_rwlock_t mr_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct r2cc_mr **mrs; /* sorted by addr */
static size_t nmrs, mrs_cap;
static uint64_t mr_max_len;

static size_t nqps;

/* --- counts folded into the NICs' counters (registry.h, struct r2cc_fold) ------ */

static pthread_mutex_t fold_lock = PTHREAD_MUTEX_INITIALIZER; /* a leaf lock */
static struct r2cc_fold *folds;
bool r2cc_fold_live;

/* Under fold_lock. */
static void fold_one(struct r2cc_fold *f)
{
	for (int i = 0; i < 3; i++) {
		uint64_t v = __atomic_load_n(&f->own[i], __ATOMIC_RELAXED);
		if (v != f->done[i]) {
			r2cc_counter_add(f->to[i], v - f->done[i]);
			f->done[i] = v;
		}
	}
}

static void fold_link(struct r2cc_fold *f, uint64_t *own, uint64_t *a, uint64_t *b, uint64_t *c)
{
	f->own = own;
	f->to[0] = a;
	f->to[1] = b;
	f->to[2] = c;
	pthread_mutex_lock(&fold_lock);
	f->next = folds;
	if (folds)
		folds->pprev = &f->next;
	f->pprev = &folds;
	folds = f;
	pthread_mutex_unlock(&fold_lock);
}

/* The record is going: what it counted goes to its NIC now. */
static void fold_unlink(struct r2cc_fold *f)
{
	if (!f->pprev)
		return;
	pthread_mutex_lock(&fold_lock);
	fold_one(f);
	*f->pprev = f->next;
	if (f->next)
		f->next->pprev = f->pprev;
	f->pprev = NULL;
	pthread_mutex_unlock(&fold_lock);
}

void r2cc_counters_fold(void)
{
	pthread_mutex_lock(&fold_lock);
	for (struct r2cc_fold *f = folds; f; f = f->next)
		fold_one(f);
	pthread_mutex_unlock(&fold_lock);
}

_Static_assert(offsetof(struct r2cc_qp, tx_bytes) == offsetof(struct r2cc_qp, tx_wrs) + 16,
	       "a QP's own counts are three in a row");
_Static_assert(offsetof(struct r2cc_cq, tx_cqes) == offsetof(struct r2cc_cq, rx_wrs) + 16,
	       "a CQ's own counts are three in a row");
_Static_assert(offsetof(struct r2cc_qp, rep) + sizeof(void *) <= 64 &&
		   offsetof(struct r2cc_cq, tx_cqes) + sizeof(uint64_t) <= 64,
	       "what a post or a poll reads and writes of its record is in its first line");

/* fork(2) with the fold lock free in the child, whose parent's threads are gone:
 * nobody folds there. */
static void fold_atfork_prepare(void)
{
	pthread_mutex_lock(&fold_lock);
}

static void fold_atfork_parent(void)
{
	pthread_mutex_unlock(&fold_lock);
}

static void fold_atfork_child(void)
{
	__atomic_store_n(&r2cc_fold_live, false, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&fold_lock);
}

void r2cc_counters_folding(bool live)
{
	if (!live) {
		/* a post that read the flag just before counts own after this fold: the
		 * next reader's fold (r2cc_nic_stats(), a record's removal) takes it */
		__atomic_store_n(&r2cc_fold_live, false, __ATOMIC_RELAXED);
		r2cc_counters_fold();
		return;
	}
	__atomic_store_n(&r2cc_fold_live, true, __ATOMIC_RELAXED);
}

/* --- the CQ gate's owner door (registry.h) ---------------------------------- */

__thread char r2cc_self_tag __attribute__((tls_model("initial-exec")));
bool r2cc_cq_gate_solo_ok;

static long membarrier(int cmd)
{
	return syscall(__NR_membarrier, cmd, 0, 0);
}

void r2cc_cq_gate_init(void)
{
	long have = membarrier(MEMBARRIER_CMD_QUERY);
	if (have < 0 || !(have & MEMBARRIER_CMD_PRIVATE_EXPEDITED) ||
	    membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) != 0) {
		R2CC_INFO("membarrier(2) private expedited unavailable: CQ polls count "
			  "themselves in with an atomic operation");
		return;
	}
	__atomic_store_n(&r2cc_cq_gate_solo_ok, true, __ATOMIC_RELEASE);
}

void r2cc_cq_gates_close(struct r2cc_cq_gate *a, struct r2cc_cq_gate *b)
{
	struct r2cc_cq_gate *g[2] = {a, b};
	bool owned = false;
	for (int i = 0; i < 2; i++) {
		if (!g[i])
			continue;
		__atomic_or_fetch(&g[i]->n, R2CC_GATE_SLOW, __ATOMIC_SEQ_CST);
		owned |= __atomic_load_n(&g[i]->owner, __ATOMIC_SEQ_CST) != NULL;
	}
	if (owned && membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0) {
		/* Registered at start-up, so this does not happen; if it did, the
		 * owner's store is still seen within a scheduling quantum on every
		 * architecture R2CC builds for, and waiting on it below is what is left. */
		static int told;
		if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
			R2CC_WARN("membarrier(2) failed (%s) while closing a data-path gate",
				  strerror(errno));
	}
	for (int i = 0; i < 2; i++)
		while (g[i] && ((__atomic_load_n(&g[i]->n, __ATOMIC_ACQUIRE) & ~R2CC_GATE_SLOW) ||
				__atomic_load_n(&g[i]->solo_in, __ATOMIC_ACQUIRE)))
			sched_yield();
}

void r2cc_cq_gate_close(struct r2cc_cq_gate *g)
{
	r2cc_cq_gates_close(g, NULL);
}

int r2cc_registry_init(void)
{
	static int done;
	static int rc;
	pthread_mutex_lock(&registry_lock);
	if (!done) {
		struct {
			struct r2cc_map *m;
			size_t cap;
		} maps[] = {{&r2cc_qp_map, 1 << 16}, {&r2cc_cq_map, 1 << 12}, {&r2cc_ctx_map, 256},
			    {&pd_map, 1 << 10},	     {&mr_map, 1 << 16},      {&qpnum_map, 1 << 16},
			    {&lkey_map, 1 << 16},    {&rkey_map, 1 << 16}};
		for (size_t i = 0; i < sizeof(maps) / sizeof(maps[0]) && !rc; i++)
			rc = r2cc_map_init(maps[i].m, maps[i].cap);
		pthread_atfork(fold_atfork_prepare, fold_atfork_parent, fold_atfork_child);
		done = 1;
	}
	pthread_mutex_unlock(&registry_lock);
	return rc;
}

/* --- NICs ----------------------------------------------------------------- */

void r2cc_nic_gid_cache(struct r2cc_nic *nic, int index, const union ibv_gid *gid)
{
	if (index < 0 || index >= R2CC_GID_CACHE)
		return;
	nic->gids[index] = *gid; /* the same value each time NCCL reads it */
	__atomic_fetch_or(&nic->gids_known, 1u << index, __ATOMIC_RELEASE);
}

bool r2cc_nic_gid_cached(const struct r2cc_nic *nic, int index, union ibv_gid *gid)
{
	if (index < 0 || index >= R2CC_GID_CACHE ||
	    !(__atomic_load_n(&nic->gids_known, __ATOMIC_ACQUIRE) >> index & 1))
		return false;
	*gid = nic->gids[index];
	return true;
}

struct r2cc_nic *r2cc_nic_get(const char *name)
{
	struct r2cc_nic *nic = NULL;
	pthread_mutex_lock(&registry_lock);
	for (int i = 0; i < nnics; i++)
		if (!strcmp(nics[i]->name, name))
			nic = nics[i];
	if (!nic && nnics < R2CC_MAX_NICS) {
		/* In the published page when there is one: the counters the data
		 * path updates are then the ones `r2cc top` reads. */
		struct r2cc_stats_page *page = r2cc_stats_page();
		nic = page ? &page->nics[nnics] : calloc(1, sizeof(*nic));
		if (nic) {
			nic->index = nnics;
			snprintf(nic->name, sizeof(nic->name), "%s", name);
			nic->port = 1;
			__atomic_store_n(&nics[nnics], nic, __ATOMIC_RELEASE);
			__atomic_store_n(&nnics, nnics + 1, __ATOMIC_RELEASE);
			if (page)
				__atomic_store_n(&page->nnics, nnics, __ATOMIC_RELEASE);
		}
	}
	pthread_mutex_unlock(&registry_lock);
	return nic;
}

struct r2cc_nic *r2cc_nic_by_index(int index)
{
	if (index < 0 || index >= __atomic_load_n(&nnics, __ATOMIC_ACQUIRE))
		return NULL;
	return __atomic_load_n(&nics[index], __ATOMIC_ACQUIRE);
}

int r2cc_nic_count(void)
{
	return __atomic_load_n(&nnics, __ATOMIC_ACQUIRE);
}

R2CC_EXPORT int r2cc_nic_stats(struct r2cc_nic_stat *out, int max)
{
	int n = r2cc_nic_count();
	r2cc_counters_fold();
	for (int i = 0; i < n && i < max; i++) {
		const struct r2cc_nic *nic = r2cc_nic_by_index(i);
		memset(&out[i], 0, sizeof(out[i]));
		snprintf(out[i].name, sizeof(out[i].name), "%s", nic->name);
		out[i].tx_bytes = __atomic_load_n(&nic->cnt.tx_bytes, __ATOMIC_RELAXED);
		out[i].tx_wrs = __atomic_load_n(&nic->cnt.tx_wrs, __ATOMIC_RELAXED);
		out[i].rx_bytes = __atomic_load_n(&nic->cnt.rx_bytes, __ATOMIC_RELAXED);
		out[i].rx_wrs = __atomic_load_n(&nic->cnt.rx_wrs, __ATOMIC_RELAXED);
		out[i].state = __atomic_load_n(&nic->state, __ATOMIC_RELAXED);
	}
	return n;
}

/* --- generic add/remove ---------------------------------------------------- */

/* Records start on a cache line: the data path's fields, first in each, then share
 * one line. */
static void *record_add(struct r2cc_map *m, const void *key, size_t size)
{
	void *rec = r2cc_zalloc_lines(size);
	if (!rec)
		return NULL;
	int rc = r2cc_map_insert(m, (uint64_t)(uintptr_t)key, rec);
	if (rc) {
		R2CC_WARN_ONCE(
		    "registry full or inconsistent (%s); the object runs as pass-through",
		    strerror(-rc));
		free(rec);
		return NULL;
	}
	return rec;
}

/* --- contexts, PDs, CQs ------------------------------------------------------ */

struct r2cc_ctx *r2cc_ctx_add(struct ibv_context *ctx, struct r2cc_nic *nic)
{
	struct r2cc_ctx *c = record_add(&r2cc_ctx_map, ctx, sizeof(*c));
	if (c) {
		c->ctx = ctx;
		c->nic = nic;
	}
	return c;
}

struct r2cc_ctx *r2cc_ctx_find(const struct ibv_context *ctx)
{
	return r2cc_map_get(&r2cc_ctx_map, (uint64_t)(uintptr_t)ctx);
}

void r2cc_ctx_remove(struct ibv_context *ctx)
{
	free(r2cc_map_remove(&r2cc_ctx_map, (uint64_t)(uintptr_t)ctx));
}

struct r2cc_pd *r2cc_pd_add(struct ibv_pd *pd, struct r2cc_ctx *ctx)
{
	struct r2cc_pd *p = record_add(&pd_map, pd, sizeof(*p));
	if (p) {
		p->pd = pd;
		p->ctx = ctx;
	}
	return p;
}

struct r2cc_pd *r2cc_pd_find(const struct ibv_pd *pd)
{
	return r2cc_map_get(&pd_map, (uint64_t)(uintptr_t)pd);
}

void r2cc_pd_remove(struct ibv_pd *pd)
{
	free(r2cc_map_remove(&pd_map, (uint64_t)(uintptr_t)pd));
}

struct r2cc_cq *r2cc_cq_add(struct ibv_cq *cq, struct r2cc_ctx *ctx, int depth)
{
	struct r2cc_cq *c = record_add(&r2cc_cq_map, cq, sizeof(*c));
	if (c) {
		c->cq = cq;
		c->ctx = ctx;
		c->depth = depth;
		if (ctx && ctx->nic)
			fold_link(&c->fold, &c->rx_wrs, &ctx->nic->cnt.rx_wrs,
				  &ctx->nic->cnt.rx_bytes, &ctx->nic->cnt.tx_cqes);
	}
	return c;
}

void r2cc_cq_remove(struct ibv_cq *cq)
{
	struct r2cc_cq *c = r2cc_map_remove(&r2cc_cq_map, (uint64_t)(uintptr_t)cq);
	if (c)
		fold_unlink(&c->fold);
	free(c);
}

/* --- QPs --------------------------------------------------------------------- */

static uint64_t nic_key(const struct r2cc_nic *nic, uint32_t k)
{
	return ((uint64_t)(unsigned)nic->index << 32) | k;
}

struct r2cc_qp *r2cc_qp_add(struct ibv_qp *qp, struct r2cc_ctx *ctx, struct r2cc_cq *send_cq,
			    struct r2cc_cq *recv_cq, uint32_t qpn, int qp_type)
{
	struct r2cc_qp *q = record_add(&r2cc_qp_map, qp, sizeof(*q));
	if (!q)
		return NULL;
	q->qp = qp;
	q->ctx = ctx;
	q->send_cq = send_cq;
	q->recv_cq = recv_cq;
	q->qpn = qpn;
	q->qp_type = qp_type;
	q->state = IBV_QPS_RESET;
	if (ctx && ctx->nic) {
		r2cc_map_insert(&qpnum_map, nic_key(ctx->nic, qpn), q);
		fold_link(&q->fold, &q->tx_wrs, &ctx->nic->cnt.tx_wrs, &ctx->nic->cnt.recv_posted,
			  &ctx->nic->cnt.tx_bytes);
	}
	__atomic_fetch_add(&nqps, 1, __ATOMIC_RELAXED);
	return q;
}

struct r2cc_qp *r2cc_qp_by_num(const struct r2cc_nic *nic, uint32_t qpn)
{
	return r2cc_map_get(&qpnum_map, nic_key(nic, qpn));
}

__thread struct r2cc_map_cache r2cc_qp_cache __attribute__((tls_model("initial-exec")));
__thread struct r2cc_map_cache r2cc_cq_cache __attribute__((tls_model("initial-exec")));
/* Not static, as the two above: GCC 12 took a static one for never written (the miss
 * that fills it is in another file) and left every lookup to the miss. */
__thread struct r2cc_map_cache r2cc_qpnum_cache __attribute__((tls_model("initial-exec")));

struct r2cc_qp *r2cc_qp_by_num_hot(const struct r2cc_nic *nic, uint32_t qpn)
{
	return r2cc_map_get_cached(&qpnum_map, &r2cc_qpnum_cache, nic_key(nic, qpn));
}

struct r2cc_qp *r2cc_qp_unlink(struct ibv_qp *qp)
{
	struct r2cc_qp *q = r2cc_map_remove(&r2cc_qp_map, (uint64_t)(uintptr_t)qp);
	if (!q)
		return NULL;
	if (q->ctx && q->ctx->nic)
		r2cc_map_remove(&qpnum_map, nic_key(q->ctx->nic, q->qpn));
	fold_unlink(&q->fold);
	__atomic_fetch_sub(&nqps, 1, __ATOMIC_RELAXED);
	return q;
}

void r2cc_qp_free(struct r2cc_qp *q)
{
	free(q);
}

void r2cc_qp_remove(struct ibv_qp *qp)
{
	r2cc_qp_free(r2cc_qp_unlink(qp));
}

size_t r2cc_qp_count(void)
{
	return __atomic_load_n(&nqps, __ATOMIC_RELAXED);
}

/* --- MRs --------------------------------------------------------------------- */

/* First index whose addr > a. */
static size_t mr_upper(uint64_t a)
{
	size_t lo = 0, hi = nmrs;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (mrs[mid]->addr <= a)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

struct r2cc_mr *r2cc_mr_add(struct ibv_mr *mr, struct r2cc_nic *nic, uint64_t addr, uint64_t len,
			    uint32_t lkey, uint32_t rkey, int access)
{
	struct r2cc_mr *r = record_add(&mr_map, mr, sizeof(*r));
	if (!r)
		return NULL;
	r->mr = mr;
	r->nic = nic;
	r->addr = addr;
	r->len = len;
	r->lkey = lkey;
	r->rkey = rkey;
	r->access = access;
	pthread_rwlock_wrlock(&mr_lock);
	if (nmrs == mrs_cap) {
		size_t cap = mrs_cap ? mrs_cap * 2 : 256;
		struct r2cc_mr **n = realloc(mrs, cap * sizeof(*n));
		if (!n) {
			pthread_rwlock_unlock(&mr_lock);
			free(r2cc_map_remove(&mr_map, (uint64_t)(uintptr_t)mr));
			return NULL;
		}
		mrs = n;
		mrs_cap = cap;
	}
	size_t at = mr_upper(addr);
	memmove(&mrs[at + 1], &mrs[at], (nmrs - at) * sizeof(*mrs));
	mrs[at] = r;
	nmrs++;
	if (len > mr_max_len)
		mr_max_len = len;
	pthread_rwlock_unlock(&mr_lock);
	if (nic) {
		r2cc_map_insert(&lkey_map, nic_key(nic, lkey), r);
		r2cc_map_insert(&rkey_map, nic_key(nic, rkey), r);
	}
	return r;
}

struct r2cc_mr *r2cc_mr_find(const struct ibv_mr *mr)
{
	return r2cc_map_get(&mr_map, (uint64_t)(uintptr_t)mr);
}

struct r2cc_mr *r2cc_mr_by_addr(const struct r2cc_nic *nic, uint64_t addr, uint64_t len)
{
	struct r2cc_mr *found = NULL;
	if (addr + len < addr)
		return NULL;
	pthread_rwlock_rdlock(&mr_lock);
	/* Candidates start at or before addr and no earlier than addr - longest MR. */
	for (size_t i = mr_upper(addr); i-- > 0;) {
		struct r2cc_mr *r = mrs[i];
		if (addr - r->addr > mr_max_len)
			break;
		if ((!nic || r->nic == nic) && addr + len <= r->addr + r->len) {
			found = r;
			break;
		}
	}
	pthread_rwlock_unlock(&mr_lock);
	return found;
}

struct r2cc_mr *r2cc_mr_by_lkey(const struct r2cc_nic *nic, uint32_t lkey)
{
	return r2cc_map_get(&lkey_map, nic_key(nic, lkey));
}

struct r2cc_mr *r2cc_mr_by_rkey(const struct r2cc_nic *nic, uint32_t rkey)
{
	return r2cc_map_get(&rkey_map, nic_key(nic, rkey));
}

void r2cc_mr_remove(struct ibv_mr *mr)
{
	struct r2cc_mr *r = r2cc_map_remove(&mr_map, (uint64_t)(uintptr_t)mr);
	if (!r)
		return;
	pthread_rwlock_wrlock(&mr_lock);
	for (size_t i = 0; i < nmrs; i++) {
		if (mrs[i] == r) {
			memmove(&mrs[i], &mrs[i + 1], (nmrs - i - 1) * sizeof(*mrs));
			nmrs--;
			break;
		}
	}
	pthread_rwlock_unlock(&mr_lock);
	if (r->nic) {
		r2cc_map_remove(&lkey_map, nic_key(r->nic, r->lkey));
		r2cc_map_remove(&rkey_map, nic_key(r->nic, r->rkey));
	}
	free(r);
}

size_t r2cc_mr_count(void)
{
	pthread_rwlock_rdlock(&mr_lock);
	size_t n = nmrs;
	pthread_rwlock_unlock(&mr_lock);
	return n;
}

/* --- declared failures ------------------------------------------------------------ */

static bool host_matches(const char *want, const char *host)
{
	size_t n = strcspn(want, "."), m = strcspn(host, ".");
	return !strcmp(want, host) || (n == m && !strncmp(want, host, n));
}

int r2cc_nic_mark_declared(const struct r2cc_failspec *spec, int node_index, const char *key)
{
	char host[256];
	r2cc_host_name(host, sizeof(host));
	int n = r2cc_nic_count();
	uint64_t mask = 0;
	for (int e = 0; e < spec->nentries; e++) {
		const struct r2cc_failspec_entry *en = &spec->entries[e];
		bool mine = en->node.index >= 0 ? en->node.index == node_index
						: host_matches(en->node.name, host) ||
						      host_matches(en->node.name, key);
		if (!mine)
			continue;
		for (int j = 0; j < en->nnics; j++)
			for (int i = 0; i < n && i < 64; i++) {
				struct r2cc_nic *nic = r2cc_nic_by_index(i);
				if (en->nics[j].index >= 0 ? en->nics[j].index == i
							   : !strcmp(en->nics[j].name, nic->name)) {
					mask |= 1ull << i;
					__atomic_store_n(&nic->state, R2CC_NIC_DECLARED,
							 __ATOMIC_RELAXED);
				}
			}
	}
	return __builtin_popcountll(mask);
}
