/*
 * MR mirrors and rkey maps (see mr_mirror.h). One mutex guards the mirror
 * state: per NIC the context and R2CC's own PD, the groups (an NCCL
 * registration and its mirrors) with three indexes — by NCCL's ibv_mr, by
 * (NIC, lkey) and by (NIC, rkey) — the generation, and the cache of peers'
 * maps. Registrations of mirrors run outside the lock (pinning a large buffer
 * takes a while and the control thread's handler takes the same lock); they
 * only need the PDs, which live until their context closes. The lock is
 * taken around fork() so that a child never inherits it held.
 */
#include "repair/model/mr_mirror.h"
#include "shim/log.h"
#include "shim/map.h"
#include "shim/params.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define FETCH_FIRST_CAP (64u << 10)
#define REPLY_HDR	24

struct mkey {
	int nic;
	uint32_t lkey, rkey;
	struct ibv_mr *mr; /* R2CC's mirror; NULL for NCCL's original */
};

struct group {
	struct group *next, **pprev;
	struct ibv_mr *orig;
	bool virt;     /* orig is R2CC's stand-in for a registration a dead device refused */
	uint64_t addr; /* the address peers use (iova) */
	uint64_t len;
	int nkeys;
	struct mkey keys[R2CC_MAX_NICS]; /* keys[0]: the original */
};

struct mnic {
	struct ibv_context *ctx;
	struct r2cc_nic *nic;
	struct ibv_pd *pd;
	bool pd_failed;
	bool warned;
};

/* Published to lock-free readers: the list link and the map pointer are stored
 * atomically, and a replaced map (or an unlinked entry) is freed only once no
 * reader is inside (readers_drain). */
struct cache_ent {
	struct cache_ent *next;
	struct cache_ent *gone; /* r2cc_mr_mirror_remote_forget's list; next stays for readers */
	uint64_t job;
	int peer;
	char from[64], to[64];
	struct r2cc_mr_mirror_map *map;
};

static struct {
	pthread_mutex_t lock;
	struct r2cc_mr_mirror_verbs v;
	struct mnic nics[R2CC_MAX_NICS];
	struct group *groups;
	struct r2cc_map by_mr, by_lkey, by_rkey;
	bool maps_ready;     /* atomic: read by the lock-free translations */
	int readers;	     /* atomic: lock-free translations in progress */
	uint64_t cache_hits; /* atomic */
	uint64_t epoch, gen;
	struct r2cc_mr_mirror_stats st;
	struct cache_ent *cache;
	int forced; /* 0: follow the setting; 1 on; -1 off */
	r2cc_mr_mirror_fetch_fn fetch;
	bool serving;
} mm = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* --- byte order ------------------------------------------------------------- */

static void put_u32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)(v >> 24);
	p[1] = (unsigned char)(v >> 16);
	p[2] = (unsigned char)(v >> 8);
	p[3] = (unsigned char)v;
}

static void put_u64(unsigned char *p, uint64_t v)
{
	put_u32(p, (uint32_t)(v >> 32));
	put_u32(p + 4, (uint32_t)v);
}

static uint32_t get_u32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t get_u64(const unsigned char *p)
{
	return (uint64_t)get_u32(p) << 32 | get_u32(p + 4);
}

/* --- state ------------------------------------------------------------------ */

bool r2cc_mr_mirror_enabled(void)
{
	int f = __atomic_load_n(&mm.forced, __ATOMIC_RELAXED);
	return f ? f > 0 : r2cc_param.mr_mirror;
}

void r2cc_mr_mirror_force(bool on)
{
	__atomic_store_n(&mm.forced, on ? 1 : -1, __ATOMIC_RELAXED);
}

void r2cc_mr_mirror_set_fetch(r2cc_mr_mirror_fetch_fn fn)
{
	pthread_mutex_lock(&mm.lock);
	mm.fetch = fn;
	pthread_mutex_unlock(&mm.lock);
}

static uint64_t key_of(int nic, uint32_t k)
{
	return (uint64_t)(unsigned)nic << 32 | k;
}

/* Under the lock. */
static int ready_locked(void)
{
	if (mm.maps_ready)
		return 0;
	if (r2cc_map_init(&mm.by_mr, 1024) || r2cc_map_init(&mm.by_lkey, 4096) ||
	    r2cc_map_init(&mm.by_rkey, 4096))
		return -ENOMEM;
	if (getrandom(&mm.epoch, sizeof(mm.epoch), GRND_NONBLOCK) != sizeof(mm.epoch))
		mm.epoch = (uint64_t)time(NULL) << 20 ^ (uint64_t)getpid();
	if (!mm.epoch)
		mm.epoch = 1;
	mm.gen = 1;
	__atomic_store_n(&mm.maps_ready, true, __ATOMIC_RELEASE);
	return 0;
}

/*
 * The translations on the post path take no lock: a reader announces itself
 * around its lookup, and a writer that unpublished an object (a group out of the
 * key indices, a cache entry out of its list, a cache entry's replaced map)
 * frees it only once no reader is inside, since a reader that enters after the
 * unpublishing cannot find it. Readers hold an object for a few loads, so the
 * wait is short; writers are registrations and map updates, never the data path.
 */
static void read_enter(void)
{
	__atomic_add_fetch(&mm.readers, 1, __ATOMIC_SEQ_CST);
}

static void read_exit(void)
{
	__atomic_sub_fetch(&mm.readers, 1, __ATOMIC_RELEASE);
}

static void readers_drain(void)
{
	__atomic_thread_fence(__ATOMIC_SEQ_CST); /* the unpublishing before the count */
	while (__atomic_load_n(&mm.readers, __ATOMIC_ACQUIRE))
		sched_yield();
}

static void ensure_pd_locked(int i)
{
	struct mnic *n = &mm.nics[i];
	if (n->pd || n->pd_failed || !n->ctx || !mm.v.alloc_pd)
		return;
	n->pd = mm.v.alloc_pd(n->ctx);
	if (!n->pd) {
		n->pd_failed = true;
		R2CC_WARN("%s: cannot allocate R2CC's protection domain (%s); no memory is "
			  "mirrored onto this NIC, so queue pairs cannot migrate to it",
			  n->nic->name, strerror(errno));
	}
}

/* A fork while another thread holds the lock must not leave it held in the
 * child. */
static void atfork_prepare(void)
{
	pthread_mutex_lock(&mm.lock);
}

static void atfork_release(void)
{
	pthread_mutex_unlock(&mm.lock);
}

/* The child has one thread, inside no translation: a count a reader of the
 * parent left would make every later writer of the child wait for ever. */
static void atfork_child(void)
{
	__atomic_store_n(&mm.readers, 0, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&mm.lock);
}

static void atfork_once(void)
{
	pthread_atfork(atfork_prepare, atfork_release, atfork_child);
}

void r2cc_mr_mirror_ctx_opened(struct ibv_context *ctx, struct r2cc_nic *nic,
			       const struct r2cc_mr_mirror_verbs *verbs)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	if (!r2cc_mr_mirror_enabled() || !ctx || !nic || nic->index < 0 ||
	    nic->index >= R2CC_MAX_NICS)
		return;
	int saved = errno;
	pthread_once(&once, atfork_once);
	pthread_mutex_lock(&mm.lock);
	if (verbs)
		mm.v = *verbs;
	struct mnic *n = &mm.nics[nic->index];
	if (!n->ctx) {
		n->ctx = ctx;
		n->nic = nic;
		n->pd_failed = false;
	}
	pthread_mutex_unlock(&mm.lock);
	r2cc_mr_mirror_serve();
	errno = saved;
}

void r2cc_mr_mirror_pd_allocated(struct ibv_context *ctx)
{
	if (!r2cc_mr_mirror_enabled())
		return;
	int saved = errno;
	pthread_mutex_lock(&mm.lock);
	for (int i = 0; i < R2CC_MAX_NICS; i++)
		ensure_pd_locked(i);
	pthread_mutex_unlock(&mm.lock);
	errno = saved;
}

static void index_locked(struct group *g, const struct mkey *k)
{
	r2cc_map_insert(&mm.by_lkey, key_of(k->nic, k->lkey), g);
	r2cc_map_insert(&mm.by_rkey, key_of(k->nic, k->rkey), g);
}

static void unindex_locked(const struct mkey *k)
{
	r2cc_map_remove(&mm.by_lkey, key_of(k->nic, k->lkey));
	r2cc_map_remove(&mm.by_rkey, key_of(k->nic, k->rkey));
}

static struct ibv_mr *reg_one(const struct r2cc_mr_mirror_verbs *v, struct ibv_pd *pd,
			      const struct r2cc_mr_mirror_src *s)
{
	switch (s->kind) {
	case R2CC_MR_VA:
		return v->reg_mr ? v->reg_mr(pd, s->addr, s->len, s->access) : NULL;
	case R2CC_MR_IOVA:
		if (v->reg_mr_iova2)
			return v->reg_mr_iova2(pd, s->addr, s->len, s->iova, (unsigned)s->access);
		if (v->reg_mr && s->iova == (uint64_t)(uintptr_t)s->addr)
			return v->reg_mr(pd, s->addr, s->len, s->access);
		break;
	case R2CC_MR_DMABUF:
		/* The fd is valid now, inside NCCL's call; it may not be later. */
		if (v->reg_dmabuf_mr)
			return v->reg_dmabuf_mr(pd, s->offset, s->len, s->iova, s->fd, s->access);
		break;
	}
	errno = EOPNOTSUPP;
	return NULL;
}

/* A key for a virtual registration on nic: none of nic's keys (real or virtual)
 * has it. Under the lock. */
static uint32_t virtual_key_locked(struct r2cc_map *idx, int nic)
{
	static uint32_t next;
	for (int tries = 0; tries < 1 << 16; tries++) {
		uint32_t k = 0xfe000000u | (++next & 0xffffffu);
		if (!r2cc_map_get(idx, key_of(nic, k)))
			return k;
	}
	return 0;
}

/* The registration mr (NCCL's, on pd) with mirrors on every other NIC; with virt,
 * mr is R2CC's stand-in, whose keys are made here, and which needs a mirror
 * somewhere. false when nothing was recorded. */
static bool reg_group(struct ibv_pd *pd, struct ibv_mr *mr, const struct r2cc_mr_mirror_src *src,
		      bool virt)
{
	struct r2cc_pd *p = r2cc_pd_find(pd);
	if (!p || !p->ctx || !p->ctx->nic)
		return false;
	int home = p->ctx->nic->index;
	struct group *g = calloc(1, sizeof(*g));
	if (!g)
		return false;
	g->orig = mr;
	g->virt = virt;
	g->addr = src->kind == R2CC_MR_VA ? (uint64_t)(uintptr_t)src->addr : src->iova;
	g->len = src->len;

	struct ibv_pd *pds[R2CC_MAX_NICS] = {0};
	struct r2cc_mr_mirror_verbs v;
	pthread_mutex_lock(&mm.lock);
	if (ready_locked()) {
		pthread_mutex_unlock(&mm.lock);
		free(g);
		R2CC_WARN_ONCE("MR mirror: out of memory; registrations are not mirrored");
		return false;
	}
	if (virt) {
		mr->lkey = virtual_key_locked(&mm.by_lkey, home);
		mr->rkey = virtual_key_locked(&mm.by_rkey, home);
	}
	g->keys[g->nkeys++] = (struct mkey){home, mr->lkey, mr->rkey, NULL};
	for (int i = 0; i < R2CC_MAX_NICS; i++) {
		if (i == home)
			continue;
		ensure_pd_locked(i);
		pds[i] = mm.nics[i].pd;
	}
	v = mm.v;
	pthread_mutex_unlock(&mm.lock);

	for (int i = 0; i < R2CC_MAX_NICS; i++) {
		if (!pds[i])
			continue;
		struct ibv_mr *m = reg_one(&v, pds[i], src);
		if (m) {
			g->keys[g->nkeys++] = (struct mkey){i, m->lkey, m->rkey, m};
			continue;
		}
		int err = errno;
		pthread_mutex_lock(&mm.lock);
		mm.st.mirror_fail++;
		bool warn = !mm.nics[i].warned;
		mm.nics[i].warned = true;
		pthread_mutex_unlock(&mm.lock);
		if (warn)
			R2CC_WARN("%s: cannot mirror a %zu-byte registration of %s (%s); it stays "
				  "unmirrored there, and queue pairs using it cannot migrate to "
				  "this NIC (further failures not logged)",
				  mm.nics[i].nic ? mm.nics[i].nic->name : "?", src->len,
				  p->ctx->nic->name, strerror(err));
	}

	pthread_mutex_lock(&mm.lock);
	if ((virt && (g->nkeys < 2 || !mr->lkey || !mr->rkey)) ||
	    r2cc_map_insert(&mm.by_mr, (uint64_t)(uintptr_t)mr, g)) {
		pthread_mutex_unlock(&mm.lock);
		for (int k = 1; k < g->nkeys; k++)
			v.dereg_mr(g->keys[k].mr);
		free(g);
		if (!virt)
			R2CC_WARN_ONCE("MR mirror: index full; a registration stays unmirrored");
		return false;
	}
	for (int k = 0; k < g->nkeys; k++)
		index_locked(g, &g->keys[k]);
	g->next = mm.groups;
	g->pprev = &mm.groups;
	if (mm.groups)
		mm.groups->pprev = &g->next;
	mm.groups = g;
	mm.gen++;
	mm.st.groups++;
	mm.st.mirrors += (uint64_t)g->nkeys - 1;
	pthread_mutex_unlock(&mm.lock);
	R2CC_TRACE("%s: %s 0x%x mirrored on %d other NIC(s)", p->ctx->nic->name,
		   virt ? "virtual lkey" : "lkey", mr->lkey, g->nkeys - 1);
	return true;
}

void r2cc_mr_mirror_reg(struct ibv_pd *pd, struct ibv_mr *mr, const struct r2cc_mr_mirror_src *src)
{
	if (!mr || !src || !r2cc_mr_mirror_enabled())
		return;
	int saved = errno;
	reg_group(pd, mr, src, false);
	errno = saved;
}

struct ibv_mr *r2cc_mr_mirror_reg_virtual(struct ibv_pd *pd, const struct r2cc_mr_mirror_src *src)
{
	int saved = errno;
	if (!pd || !src || !r2cc_mr_mirror_enabled())
		return NULL;
	struct ibv_mr *mr = calloc(1, sizeof(*mr));
	if (!mr)
		return NULL;
	mr->context = pd->context;
	mr->pd = pd;
	mr->addr = src->kind == R2CC_MR_VA ? src->addr : (void *)(uintptr_t)src->iova;
	mr->length = src->len;
	if (!reg_group(pd, mr, src, true)) {
		free(mr);
		errno = saved;
		return NULL;
	}
	errno = saved;
	return mr;
}

bool r2cc_mr_mirror_dereg(struct ibv_mr *mr)
{
	if (!mr)
		return false;
	int saved = errno;
	bool virt = false;
	pthread_mutex_lock(&mm.lock);
	struct group *g =
	    mm.maps_ready ? r2cc_map_remove(&mm.by_mr, (uint64_t)(uintptr_t)mr) : NULL;
	if (g) {
		for (int k = 0; k < g->nkeys; k++) {
			if (g->keys[k].nic < 0)
				continue; /* its NIC was closed */
			unindex_locked(&g->keys[k]);
			mm.st.mirrors -= k > 0;
		}
		*g->pprev = g->next;
		if (g->next)
			g->next->pprev = g->pprev;
		mm.gen++;
		mm.st.groups--;
	}
	int (*dereg)(struct ibv_mr *) = mm.v.dereg_mr;
	pthread_mutex_unlock(&mm.lock);
	if (g) {
		readers_drain();
		for (int k = 1; k < g->nkeys; k++)
			if (g->keys[k].mr && dereg && dereg(g->keys[k].mr))
				R2CC_WARN_ONCE("MR mirror: deregistering a mirror failed (%s)",
					       strerror(errno));
		virt = g->virt;
		free(g);
	}
	errno = saved;
	return virt;
}

void r2cc_mr_mirror_ctx_closing(struct ibv_context *ctx)
{
	int saved = errno;
	pthread_mutex_lock(&mm.lock);
	for (int i = 0; i < R2CC_MAX_NICS; i++) {
		struct mnic *n = &mm.nics[i];
		if (n->ctx != ctx)
			continue;
		for (struct group *g = mm.groups; g; g = g->next) {
			for (int k = 1; k < g->nkeys; k++) {
				if (g->keys[k].nic != i)
					continue;
				/* Marked, not compacted: a lock-free reader may be
				 * walking the keys through another NIC's index. */
				unindex_locked(&g->keys[k]);
				__atomic_store_n(&g->keys[k].nic, -1, __ATOMIC_RELEASE);
				if (mm.v.dereg_mr)
					mm.v.dereg_mr(g->keys[k].mr);
				g->keys[k].mr = NULL;
				mm.st.mirrors--;
				mm.gen++;
				break;
			}
		}
		if (n->pd && mm.v.dealloc_pd)
			mm.v.dealloc_pd(n->pd);
		*n = (struct mnic){0};
	}
	pthread_mutex_unlock(&mm.lock);
	errno = saved;
}

/* --- local translation ---------------------------------------------------------- */

static int translate(struct r2cc_map *idx, bool rkey, const struct r2cc_nic *from, uint32_t key,
		     const struct r2cc_nic *to, uint32_t *out)
{
	if (!from || !to || !out)
		return -EINVAL;
	if (from == to) {
		*out = key;
		return 0;
	}
	int rc = -ENOENT;
	if (!__atomic_load_n(&mm.maps_ready, __ATOMIC_ACQUIRE))
		return rc;
	read_enter();
	const struct group *g = r2cc_map_get(idx, key_of(from->index, key));
	for (int k = 0; g && k < g->nkeys; k++) {
		if (__atomic_load_n(&g->keys[k].nic, __ATOMIC_ACQUIRE) == to->index) {
			*out = rkey ? g->keys[k].rkey : g->keys[k].lkey;
			rc = 0;
			break;
		}
	}
	read_exit();
	return rc;
}

int r2cc_mr_mirror_lkey(const struct r2cc_nic *from, uint32_t lkey, const struct r2cc_nic *to,
			uint32_t *out)
{
	return translate(&mm.by_lkey, false, from, lkey, to, out);
}

int r2cc_mr_mirror_rkey(const struct r2cc_nic *from, uint32_t rkey, const struct r2cc_nic *to,
			uint32_t *out)
{
	return translate(&mm.by_rkey, true, from, rkey, to, out);
}

struct ibv_pd *r2cc_mr_mirror_pd(const struct r2cc_nic *nic)
{
	if (!nic || nic->index < 0 || nic->index >= R2CC_MAX_NICS)
		return NULL;
	pthread_mutex_lock(&mm.lock);
	ensure_pd_locked(nic->index);
	struct ibv_pd *pd = mm.nics[nic->index].pd;
	pthread_mutex_unlock(&mm.lock);
	return pd;
}

void r2cc_mr_mirror_get_stats(struct r2cc_mr_mirror_stats *out)
{
	pthread_mutex_lock(&mm.lock);
	*out = mm.st;
	out->generation = mm.gen;
	pthread_mutex_unlock(&mm.lock);
	out->cache_hits = __atomic_load_n(&mm.cache_hits, __ATOMIC_RELAXED);
}

/* --- wire format ------------------------------------------------------------------ */

static bool name_ok(const unsigned char *s, size_t n)
{
	if (n < 1 || n > 63)
		return false;
	for (size_t i = 0; i < n; i++)
		if (s[i] < 0x21 || s[i] > 0x7e)
			return false;
	return true;
}

int r2cc_mr_mirror_req_encode(const struct r2cc_mr_mirror_req *r, unsigned char *out, size_t cap)
{
	size_t n = strnlen(r->from, sizeof(r->from)), m = strnlen(r->to, sizeof(r->to));
	size_t len = 4 + 1 + n + 1 + m + 16;
	if (!name_ok((const unsigned char *)r->from, n) ||
	    !name_ok((const unsigned char *)r->to, m) || len > cap)
		return -EINVAL;
	unsigned char *p = out;
	*p++ = R2CC_MR_MIRROR_VERSION;
	*p++ = R2CC_MR_MIRROR_OP_MAP;
	*p++ = 0;
	*p++ = 0;
	*p++ = (unsigned char)n;
	memcpy(p, r->from, n);
	p += n;
	*p++ = (unsigned char)m;
	memcpy(p, r->to, m);
	p += m;
	put_u64(p, r->epoch);
	put_u64(p + 8, r->gen);
	return (int)len;
}

int r2cc_mr_mirror_req_decode(const void *in, size_t len, struct r2cc_mr_mirror_req *r)
{
	if (!in || len < 4 + 2 + 16 || len > R2CC_MR_MIRROR_REQ_MAX)
		return -EPROTO;
	const unsigned char *p = in, *end = p + len;
	if (p[0] != R2CC_MR_MIRROR_VERSION || p[1] != R2CC_MR_MIRROR_OP_MAP || p[2] || p[3])
		return -EPROTO;
	p += 4;
	size_t n = *p++;
	if ((size_t)(end - p) < n + 1 || !name_ok(p, n))
		return -EPROTO;
	memcpy(r->from, p, n);
	r->from[n] = '\0';
	p += n;
	size_t m = *p++;
	if ((size_t)(end - p) != m + 16 || !name_ok(p, m))
		return -EPROTO;
	memcpy(r->to, p, m);
	r->to[m] = '\0';
	p += m;
	r->epoch = get_u64(p);
	r->gen = get_u64(p + 8);
	return 0;
}

static int nic_index_by_name(const char *name)
{
	int n = r2cc_nic_count();
	for (int i = 0; i < n; i++) {
		const struct r2cc_nic *nic = r2cc_nic_by_index(i);
		if (nic && !strcmp(nic->name, name))
			return nic->index;
	}
	return -1;
}

static const struct mkey *key_on(const struct group *g, int nic)
{
	for (int k = 0; k < g->nkeys; k++)
		if (g->keys[k].nic == nic)
			return &g->keys[k];
	return NULL;
}

/* This process's map from NIC from to NIC to (a reply, FULL or SAME) in
 * *out, malloc'd. Under the lock. */
static int map_build_locked(int from, int to, bool same, unsigned char **out, size_t *size)
{
	int rc = ready_locked();
	size_t count = 0;
	same = same && !rc;
	for (const struct group *g = mm.groups; !rc && !same && g; g = g->next)
		if (key_on(g, from) && key_on(g, to))
			count++;
	*size = REPLY_HDR + count * R2CC_MR_MIRROR_ENTRY;
	if (!rc && *size > R2CC_CTL_MAX_PAYLOAD)
		rc = -E2BIG;
	if (!rc && !(*out = malloc(*size)))
		rc = -ENOMEM;
	if (rc)
		return rc;
	unsigned char *o = *out;
	o[0] = R2CC_MR_MIRROR_VERSION;
	o[1] = same ? R2CC_MR_MIRROR_SAME : R2CC_MR_MIRROR_FULL;
	o[2] = o[3] = 0;
	put_u64(o + 4, mm.epoch);
	put_u64(o + 12, mm.gen);
	put_u32(o + 20, (uint32_t)count);
	unsigned char *p = o + REPLY_HDR;
	for (const struct group *g = mm.groups; !same && g; g = g->next) {
		const struct mkey *a = key_on(g, from), *b = key_on(g, to);
		if (!a || !b)
			continue;
		put_u32(p, a->rkey);
		put_u32(p + 4, b->rkey);
		put_u64(p + 8, g->addr);
		put_u64(p + 16, g->len);
		p += R2CC_MR_MIRROR_ENTRY;
	}
	return 0;
}

int r2cc_mr_mirror_answer(const void *req, size_t len, unsigned char **reply_p, size_t *reply_len)
{
	struct r2cc_mr_mirror_req r;
	*reply_p = NULL;
	*reply_len = 0;
	if (r2cc_mr_mirror_req_decode(req, len, &r)) {
		pthread_mutex_lock(&mm.lock);
		mm.st.bad_requests++;
		pthread_mutex_unlock(&mm.lock);
		return -EPROTO;
	}
	int from = nic_index_by_name(r.from), to = nic_index_by_name(r.to);
	if (from < 0 || to < 0)
		return -ENODEV;
	pthread_mutex_lock(&mm.lock);
	bool same = mm.maps_ready && r.epoch == mm.epoch && r.gen == mm.gen;
	int rc = map_build_locked(from, to, same, reply_p, reply_len);
	if (!rc)
		mm.st.served++;
	pthread_mutex_unlock(&mm.lock);
	if (rc)
		*reply_len = 0;
	return rc;
}

int r2cc_mr_mirror_map_encode(const char *from_nic, const char *to_nic, unsigned char **out,
			      size_t *len)
{
	*out = NULL;
	*len = 0;
	int from = nic_index_by_name(from_nic), to = nic_index_by_name(to_nic);
	if (from < 0 || to < 0)
		return -ENODEV;
	pthread_mutex_lock(&mm.lock);
	int rc = map_build_locked(from, to, false, out, len);
	if (!rc)
		mm.st.pushed++;
	pthread_mutex_unlock(&mm.lock);
	if (rc)
		*len = 0;
	return rc;
}

static int entry_cmp(const void *a, const void *b)
{
	uint32_t x = ((const struct r2cc_mr_mirror_entry *)a)->rkey_from;
	uint32_t y = ((const struct r2cc_mr_mirror_entry *)b)->rkey_from;
	return x < y ? -1 : x > y;
}

int r2cc_mr_mirror_map_decode(const void *in, size_t len, struct r2cc_mr_mirror_map *m)
{
	const unsigned char *p = in;
	memset(m, 0, sizeof(*m));
	if (!in || len < REPLY_HDR || p[0] != R2CC_MR_MIRROR_VERSION || p[2] || p[3] ||
	    (p[1] != R2CC_MR_MIRROR_FULL && p[1] != R2CC_MR_MIRROR_SAME))
		return -EPROTO;
	uint32_t count = get_u32(p + 20);
	if (count > (len - REPLY_HDR) / R2CC_MR_MIRROR_ENTRY ||
	    len != REPLY_HDR + (size_t)count * R2CC_MR_MIRROR_ENTRY ||
	    (p[1] == R2CC_MR_MIRROR_SAME && count))
		return -EPROTO;
	m->kind = p[1];
	m->epoch = get_u64(p + 4);
	m->gen = get_u64(p + 12);
	m->count = count;
	if (count) {
		m->e = malloc((size_t)count * sizeof(*m->e));
		if (!m->e)
			return -ENOMEM;
		for (uint32_t i = 0; i < count; i++) {
			const unsigned char *q = p + REPLY_HDR + (size_t)i * R2CC_MR_MIRROR_ENTRY;
			m->e[i] = (struct r2cc_mr_mirror_entry){get_u32(q), get_u32(q + 4),
								get_u64(q + 8), get_u64(q + 16)};
		}
		qsort(m->e, count, sizeof(*m->e), entry_cmp);
	}
	return 0;
}

void r2cc_mr_mirror_map_free(struct r2cc_mr_mirror_map *m)
{
	if (!m)
		return;
	free(m->e);
	m->e = NULL;
	m->count = 0;
}

/* --- service ------------------------------------------------------------------------- */

static void serve_handler(void *arg, int from_rank, const void *payload, size_t len,
			  struct r2cc_ctl_call *call)
{
	(void)arg;
	if (!call->is_request) {
		pthread_mutex_lock(&mm.lock);
		mm.st.bad_requests++;
		pthread_mutex_unlock(&mm.lock);
		return;
	}
	unsigned char *reply;
	size_t n;
	int rc = r2cc_mr_mirror_answer(payload, len, &reply, &n);
	if (rc == -EPROTO)
		R2CC_WARN_ONCE("MR mirror: malformed rkey-map request from rank %d dropped "
			       "(further ones only counted)",
			       from_rank);
	r2cc_ctl_reply(call, rc, reply, n);
	free(reply);
}

int r2cc_mr_mirror_serve(void)
{
	pthread_mutex_lock(&mm.lock);
	bool first = !mm.serving;
	mm.serving = true;
	pthread_mutex_unlock(&mm.lock);
	if (!first)
		return 0;
	int rc = r2cc_ctl_set_handler(R2CC_MR_MIRROR_MSG, serve_handler, NULL);
	if (rc)
		R2CC_WARN("MR mirror: cannot serve rkey maps (%s)", strerror(-rc));
	return rc;
}

/* --- remote translation -------------------------------------------------------------- */

/* Under the lock, or between read_enter() and read_exit(). */
static struct cache_ent *cache_find(uint64_t job, int peer, const char *from, const char *to)
{
	for (struct cache_ent *c = __atomic_load_n(&mm.cache, __ATOMIC_ACQUIRE); c;
	     c = __atomic_load_n(&c->next, __ATOMIC_ACQUIRE))
		if (c->job == job && c->peer == peer && !strcmp(c->from, from) &&
		    !strcmp(c->to, to))
			return c;
	return NULL;
}

/* The translation of rkey for a request on [addr, addr + len): an entry of that key
 * whose registration covers the range. A key the peer recycled for another
 * registration (dereg, then reg) covers another range: a miss, then a refresh,
 * never the old registration's mirror key. */
static int cache_lookup(const struct cache_ent *c, uint32_t rkey, uint64_t addr, uint64_t len,
			uint32_t *out)
{
	const struct r2cc_mr_mirror_entry key = {.rkey_from = rkey};
	const struct r2cc_mr_mirror_map *m = c ? __atomic_load_n(&c->map, __ATOMIC_ACQUIRE) : NULL;
	const struct r2cc_mr_mirror_entry *e =
	    m && m->count ? bsearch(&key, m->e, m->count, sizeof(key), entry_cmp) : NULL;
	if (!e || addr < e->addr || addr - e->addr > e->len || len > e->len - (addr - e->addr))
		return -ENOENT;
	*out = e->rkey_to;
	return 0;
}

static int fetch_ctl(const struct r2cc_ctl_dir *dir, int peer, const void *req, size_t len,
		     void *reply, size_t *reply_len, int timeout_ms)
{
	return r2cc_ctl_request(dir, peer, R2CC_MR_MIRROR_MSG, req, len, reply, reply_len,
				timeout_ms);
}

/* Takes *m (a full map) as the cached map of (job, peer, from, to); with
 * only_newer, not over a map of the same epoch and a later generation (a
 * message that was overtaken). Under the lock. */
static int cache_put_locked(uint64_t job, int peer, const char *from, const char *to,
			    struct r2cc_mr_mirror_map *m, bool only_newer)
{
	struct cache_ent *e = cache_find(job, peer, from, to);
	struct r2cc_mr_mirror_map *old = e ? e->map : NULL, *nm;
	if (old && only_newer && old->epoch == m->epoch && old->gen > m->gen) {
		r2cc_mr_mirror_map_free(m);
		return 0;
	}
	if (!(nm = malloc(sizeof(*nm)))) {
		r2cc_mr_mirror_map_free(m);
		return -ENOMEM;
	}
	*nm = *m;
	if (!e) {
		if (!(e = calloc(1, sizeof(*e)))) {
			r2cc_mr_mirror_map_free(nm);
			free(nm);
			return -ENOMEM;
		}
		e->job = job;
		e->peer = peer;
		strcpy(e->from, from);
		strcpy(e->to, to);
		e->map = nm;
		e->next = mm.cache;
		__atomic_store_n(&mm.cache, e, __ATOMIC_RELEASE);
		return 0;
	}
	__atomic_store_n(&e->map, nm, __ATOMIC_RELEASE);
	readers_drain();
	r2cc_mr_mirror_map_free(old);
	free(old);
	return 0;
}

/* Ask the peer (outside the lock) and store what it says. */
static int refresh(const struct r2cc_ctl_dir *dir, int peer, const char *from, const char *to,
		   int timeout_ms)
{
	struct r2cc_mr_mirror_req r = {0};
	unsigned char req[R2CC_MR_MIRROR_REQ_MAX];
	if (strlen(from) >= sizeof(r.from) || strlen(to) >= sizeof(r.to))
		return -EINVAL;
	strcpy(r.from, from);
	strcpy(r.to, to);
	pthread_mutex_lock(&mm.lock);
	const struct cache_ent *c = cache_find(dir->job.id, peer, from, to);
	if (c && c->map) {
		r.epoch = c->map->epoch;
		r.gen = c->map->gen;
	}
	r2cc_mr_mirror_fetch_fn fetch = mm.fetch ? mm.fetch : fetch_ctl;
	mm.st.fetches++;
	pthread_mutex_unlock(&mm.lock);
	int len = r2cc_mr_mirror_req_encode(&r, req, sizeof(req));
	if (len < 0)
		return len;

	size_t cap = FETCH_FIRST_CAP, got = cap;
	unsigned char *buf = malloc(cap);
	if (!buf)
		return -ENOMEM;
	int rc = fetch(dir, peer, req, (size_t)len, buf, &got, timeout_ms);
	if (rc == -EMSGSIZE && got > cap && got <= R2CC_CTL_MAX_PAYLOAD) {
		unsigned char *bigger = realloc(buf, got);
		if (!bigger) {
			free(buf);
			return -ENOMEM;
		}
		buf = bigger;
		cap = got;
		rc = fetch(dir, peer, req, (size_t)len, buf, &got, timeout_ms);
	}
	struct r2cc_mr_mirror_map m;
	if (rc == 0)
		rc = r2cc_mr_mirror_map_decode(buf, got, &m);
	free(buf);
	if (rc)
		return rc;
	if (m.kind == R2CC_MR_MIRROR_SAME)
		return 0;
	pthread_mutex_lock(&mm.lock);
	rc = cache_put_locked(dir->job.id, peer, from, to, &m, false);
	pthread_mutex_unlock(&mm.lock);
	return rc;
}

int r2cc_mr_mirror_remote_refresh(const struct r2cc_ctl_dir *dir, int peer_rank,
				  const char *from_nic, const char *to_nic, int timeout_ms)
{
	if (!dir || !from_nic || !to_nic || peer_rank < 0 || peer_rank >= dir->nranks)
		return -EINVAL;
	return refresh(dir, peer_rank, from_nic, to_nic, timeout_ms);
}

int r2cc_mr_mirror_remote_rkey(const struct r2cc_ctl_dir *dir, int peer_rank, const char *from_nic,
			       uint32_t rkey, uint64_t addr, uint64_t len, const char *to_nic,
			       uint32_t *out, int timeout_ms)
{
	if (!dir || !from_nic || !to_nic || !out || peer_rank < 0 || peer_rank >= dir->nranks)
		return -EINVAL;
	if (!strcmp(from_nic, to_nic)) {
		*out = rkey;
		return 0;
	}
	/* No lock: this runs inside NCCL's post on a moved QP. */
	read_enter();
	int rc = cache_lookup(cache_find(dir->job.id, peer_rank, from_nic, to_nic), rkey, addr, len,
			      out);
	read_exit();
	if (rc == 0) {
		__atomic_add_fetch(&mm.cache_hits, 1, __ATOMIC_RELAXED);
		return 0;
	}
	if (timeout_ms <= 0) /* the cache only: the caller fetches elsewhere */
		return -EAGAIN;
	/* Not cached: the peer may have registered it since; ask once. */
	rc = refresh(dir, peer_rank, from_nic, to_nic, timeout_ms);
	if (rc)
		return rc;
	read_enter();
	rc = cache_lookup(cache_find(dir->job.id, peer_rank, from_nic, to_nic), rkey, addr, len,
			  out);
	read_exit();
	return rc;
}

int r2cc_mr_mirror_remote_store(const struct r2cc_ctl_dir *dir, int peer_rank, const char *from_nic,
				const char *to_nic, const void *map, size_t len)
{
	if (!dir || !from_nic || !to_nic || peer_rank < 0 || peer_rank >= dir->nranks ||
	    strlen(from_nic) >= sizeof(mm.cache->from) || strlen(to_nic) >= sizeof(mm.cache->to))
		return -EINVAL;
	struct r2cc_mr_mirror_map m;
	int rc = r2cc_mr_mirror_map_decode(map, len, &m);
	if (rc)
		return rc;
	if (m.kind != R2CC_MR_MIRROR_FULL) {
		r2cc_mr_mirror_map_free(&m);
		return -EPROTO;
	}
	pthread_mutex_lock(&mm.lock);
	rc = cache_put_locked(dir->job.id, peer_rank, from_nic, to_nic, &m, true);
	if (!rc)
		mm.st.received++;
	pthread_mutex_unlock(&mm.lock);
	return rc;
}

void r2cc_mr_mirror_remote_forget(uint64_t job_id, int peer_rank)
{
	struct cache_ent *gone = NULL;
	pthread_mutex_lock(&mm.lock);
	for (struct cache_ent **pp = &mm.cache; *pp;) {
		struct cache_ent *c = *pp;
		if (c->job == job_id && (peer_rank < 0 || c->peer == peer_rank)) {
			__atomic_store_n(pp, c->next, __ATOMIC_RELEASE);
			c->gone = gone; /* (a reader still on c goes on through next) */
			gone = c;
		} else {
			pp = &c->next;
		}
	}
	pthread_mutex_unlock(&mm.lock);
	if (gone)
		readers_drain();
	while (gone) {
		struct cache_ent *c = gone;
		gone = c->gone;
		r2cc_mr_mirror_map_free(c->map);
		free(c->map);
		free(c);
	}
}
