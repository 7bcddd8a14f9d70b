/*
 * The job directory, in the three places it lives: the encoding of what each
 * rank registers (members, NICs); a rank's view (struct r2cc_ctl_dir: the node
 * of every rank as runs, and a cache of the members this rank has needed); and
 * the rendezvous' copy of a completed round (struct r2cc_ctl_rdir: every
 * member, the node numbering, the NIC index), which answers the registrations
 * and later lookups. Everything read from the network is checked to the last
 * length: authenticated bytes are still not trusted to be well formed.
 *
 * Node indices come from the node keys in rank order (a node's index is the
 * order of its first rank), so every rank derives the same numbering. The
 * map travels as runs: (first node, ranks per node, nodes) covers ranks per
 * node x nodes consecutive ranks whose nodes count up from first node. Ranks
 * laid out node by node take one run; ranks dealt round-robin over the nodes
 * take one per round. A registration answer is therefore O(runs + ranks of
 * the registrant's node), and the rendezvous' work for a round O(ranks).
 *
 * Wire formats (big-endian), beyond the member encoding in ctl_priv.h:
 *   head (reply to REGISTER): u32 nranks, u32 nnodes, u32 gen, 32 digest,
 *        u32 nruns, nruns x (u32 first_node, u32 per_node, u32 nodes),
 *        u32 nmembers, nmembers x (u32 rank, u32 len, member)
 *   LOOKUP request: u32 gen, u32 nranks, nranks x u32, u32 naddrs,
 *        naddrs x (u8 kind, 16 bytes)
 *   LOOKUP reply: u32 naddrs, naddrs x (u32 owners, owners x u32 rank),
 *        u32 nmembers, nmembers x (u32 rank, u32 len, member)
 *   NICS request: u32 gen, u32 rank, u32 n, n x NIC
 *   LEAVE: u32 gen, u32 rank
 */
#include "ctl/ctl_priv.h"
#include "ctl/hmap.h"

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

struct wbuf {
	unsigned char *p;
	size_t len;
	size_t cap;
	bool over;
};

static void w_bytes(struct wbuf *w, const void *d, size_t n)
{
	if (w->over || n > w->cap - w->len) {
		w->over = true;
		return;
	}
	memcpy(w->p + w->len, d, n);
	w->len += n;
}

static void w_u8(struct wbuf *w, unsigned v)
{
	unsigned char b = (unsigned char)v;
	w_bytes(w, &b, 1);
}

static void w_u16(struct wbuf *w, unsigned v)
{
	unsigned char b[2] = {(unsigned char)(v >> 8), (unsigned char)v};
	w_bytes(w, b, 2);
}

static void w_u32(struct wbuf *w, uint32_t v)
{
	unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16),
			      (unsigned char)(v >> 8), (unsigned char)v};
	w_bytes(w, b, 4);
}

static int w_str(struct wbuf *w, const char *s, size_t max)
{
	size_t n = strnlen(s, max);
	if (n >= max || n > 255)
		return -EINVAL;
	w_u8(w, (unsigned)n);
	w_bytes(w, s, n);
	return 0;
}

struct rbuf {
	const unsigned char *p;
	size_t len;
	size_t off;
	bool bad;
};

static const unsigned char *r_bytes(struct rbuf *r, size_t n)
{
	if (r->bad || n > r->len - r->off) {
		r->bad = true;
		return NULL;
	}
	const unsigned char *p = r->p + r->off;
	r->off += n;
	return p;
}

static unsigned r_u8(struct rbuf *r)
{
	const unsigned char *p = r_bytes(r, 1);
	return p ? p[0] : 0;
}

static unsigned r_u16(struct rbuf *r)
{
	const unsigned char *p = r_bytes(r, 2);
	return p ? (unsigned)(p[0] << 8 | p[1]) : 0;
}

static uint32_t r_u32(struct rbuf *r)
{
	const unsigned char *p = r_bytes(r, 4);
	return p ? (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3] : 0;
}

/* A string must fit with its NUL and hold no NUL itself. */
static void r_str(struct rbuf *r, char *dst, size_t max)
{
	size_t n = r_u8(r);
	const unsigned char *p = r_bytes(r, n);
	if (!p || n >= max || memchr(p, 0, n)) {
		r->bad = true;
		dst[0] = '\0';
		return;
	}
	memcpy(dst, p, n);
	dst[n] = '\0';
}

static void w_addr(struct wbuf *w, const struct sockaddr_storage *a)
{
	unsigned char ip[16] = {0};
	unsigned fam = 0;
	if (a->ss_family == AF_INET) {
		fam = 4;
		memcpy(ip, &((const struct sockaddr_in *)a)->sin_addr, 4);
	} else if (a->ss_family == AF_INET6) {
		fam = 6;
		memcpy(ip, &((const struct sockaddr_in6 *)a)->sin6_addr, 16);
	}
	w_u8(w, fam);
	w_u16(w, r2cc_ctl_addr_port(a));
	w_bytes(w, ip, 16);
}

static void r_addr(struct rbuf *r, struct sockaddr_storage *a)
{
	unsigned fam = r_u8(r);
	unsigned port = r_u16(r);
	const unsigned char *ip = r_bytes(r, 16);
	memset(a, 0, sizeof(*a));
	if (!ip || port == 0 || (fam != 4 && fam != 6)) {
		r->bad = true;
		return;
	}
	if (fam == 4) {
		struct sockaddr_in *sin = (struct sockaddr_in *)a;
		sin->sin_family = AF_INET;
		sin->sin_port = htons((uint16_t)port);
		memcpy(&sin->sin_addr, ip, 4);
	} else {
		struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)a;
		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = htons((uint16_t)port);
		memcpy(&sin6->sin6_addr, ip, 16);
	}
}

/* --- members -------------------------------------------------------------- */

static int w_nic(struct wbuf *w, const struct r2cc_ctl_nic *n)
{
	if (w_str(w, n->name, sizeof(n->name)))
		return -EINVAL;
	w_u16(w, n->lid);
	w_u8(w, n->port);
	w_u8(w, n->state);
	w_u32(w, n->speed_gbps);
	w_bytes(w, n->gid, 16);
	return 0;
}

static void r_nic(struct rbuf *r, struct r2cc_ctl_nic *n)
{
	r_str(r, n->name, sizeof(n->name));
	n->lid = (uint16_t)r_u16(r);
	n->port = (uint8_t)r_u8(r);
	n->state = (uint8_t)r_u8(r);
	n->speed_gbps = r_u32(r);
	const unsigned char *gid = r_bytes(r, 16);
	if (gid)
		memcpy(n->gid, gid, 16);
}

int r2cc_ctl_member_encode(const struct r2cc_ctl_member *m, unsigned char *out, size_t cap)
{
	struct wbuf w = {out, 0, cap, false};
	if (m->nnics < 0 || m->nnics > R2CC_CTL_MAX_NICS || w_str(&w, m->host, sizeof(m->host)) ||
	    w_str(&w, m->node_key, sizeof(m->node_key)))
		return -EINVAL;
	w_u32(&w, (uint32_t)m->pid);
	w_addr(&w, &m->ctl_addr);
	w_u8(&w, (unsigned)m->nnics);
	for (int i = 0; i < m->nnics; i++)
		if (w_nic(&w, &m->nics[i]))
			return -EINVAL;
	return w.over ? -EINVAL : (int)w.len;
}

int r2cc_ctl_member_decode(const unsigned char *in, size_t len, struct r2cc_ctl_member *m)
{
	struct rbuf r = {in, len, 0, false};
	memset(m, 0, sizeof(*m));
	r_str(&r, m->host, sizeof(m->host));
	r_str(&r, m->node_key, sizeof(m->node_key));
	m->pid = (int32_t)r_u32(&r);
	r_addr(&r, &m->ctl_addr);
	m->nnics = (int)r_u8(&r);
	if (m->nnics > R2CC_CTL_MAX_NICS)
		return -EPROTO;
	for (int i = 0; i < m->nnics && !r.bad; i++)
		r_nic(&r, &m->nics[i]);
	return r.bad || r.off != len ? -EPROTO : 0;
}

/* A member with room for its own NICs only (nics is the struct's last field). */
static size_t member_size(int nnics)
{
	return offsetof(struct r2cc_ctl_member, nics) + (size_t)nnics * sizeof(struct r2cc_ctl_nic);
}

void r2cc_ctl_nicaddr_of(const struct r2cc_ctl_nic *nic, bool want_gid,
			 struct r2cc_ctl_nicaddr *out)
{
	static const uint8_t zero[16];
	memset(out, 0, sizeof(*out));
	if (want_gid && memcmp(nic->gid, zero, 16)) {
		out->kind = R2CC_CTL_NICADDR_GID;
		memcpy(out->bytes, nic->gid, 16);
	} else if (nic->lid) {
		out->kind = R2CC_CTL_NICADDR_LID;
		out->bytes[0] = (uint8_t)(nic->lid >> 8);
		out->bytes[1] = (uint8_t)nic->lid;
	}
}

static bool nicaddr_ok(const struct r2cc_ctl_nicaddr *a)
{
	static const uint8_t zero[16];
	if (a->kind == R2CC_CTL_NICADDR_LID)
		return (a->bytes[0] || a->bytes[1]) && !memcmp(a->bytes + 2, zero, 14);
	return a->kind == R2CC_CTL_NICADDR_GID && memcmp(a->bytes, zero, 16);
}

static uint64_t nicaddr_key(const struct r2cc_ctl_nicaddr *a)
{
	unsigned char b[17];
	b[0] = a->kind;
	memcpy(b + 1, a->bytes, 16);
	return r2cc_hmap_hash_bytes(b, sizeof(b));
}

/* --- node runs --------------------------------------------------------------- */

struct dir_run {
	uint32_t first_rank, first_node, per_node, nodes;
};

/* Greedy: a block of equal nodes, then as many further blocks of the same
 * length as continue the node count. */
static int runs_from_nodes(const int *node, int n, struct dir_run **out, int *nruns_p)
{
	int cap = 16, nruns = 0;
	struct dir_run *runs = malloc((size_t)cap * sizeof(*runs));
	if (!runs)
		return -ENOMEM;
	for (int i = 0; i < n;) {
		int per = 1;
		while (i + per < n && node[i + per] == node[i])
			per++;
		int nodes = 1, j = i + per;
		while (j + per <= n) {
			bool same = true;
			for (int k = 0; k < per && same; k++)
				same = node[j + k] == node[i] + nodes;
			if (!same || (j + per < n && node[j + per] == node[i] + nodes))
				break;
			nodes++;
			j += per;
		}
		if (nruns == cap) {
			struct dir_run *g = realloc(runs, 2 * (size_t)cap * sizeof(*runs));
			if (!g) {
				free(runs);
				return -ENOMEM;
			}
			runs = g;
			cap *= 2;
		}
		runs[nruns++] = (struct dir_run){(uint32_t)i, (uint32_t)node[i], (uint32_t)per,
						 (uint32_t)nodes};
		i = j;
	}
	*out = runs;
	*nruns_p = nruns;
	return 0;
}

static void w_runs(struct wbuf *w, const struct dir_run *runs, int nruns)
{
	w_u32(w, (uint32_t)nruns);
	for (int i = 0; i < nruns; i++) {
		w_u32(w, runs[i].first_node);
		w_u32(w, runs[i].per_node);
		w_u32(w, runs[i].nodes);
	}
}

/* Runs that cover exactly nranks ranks and number nnodes nodes in order of
 * first appearance. */
static int r_runs(struct rbuf *r, uint32_t nranks, uint32_t nnodes, struct dir_run **out,
		  int *nruns_p)
{
	uint32_t nruns = r_u32(r);
	/* 12 bytes a run: a short blob cannot make a long table. */
	if (r->bad || nruns == 0 || nruns > nranks || nruns > (r->len - r->off) / 12)
		return -EPROTO;
	struct dir_run *runs = malloc(nruns * sizeof(*runs));
	if (!runs)
		return -ENOMEM;
	uint64_t rank = 0, next_node = 0;
	for (uint32_t i = 0; i < nruns; i++) {
		struct dir_run *d = &runs[i];
		d->first_rank = (uint32_t)rank;
		d->first_node = r_u32(r);
		d->per_node = r_u32(r);
		d->nodes = r_u32(r);
		if (r->bad || d->per_node == 0 || d->nodes == 0 ||
		    (uint64_t)d->per_node * d->nodes > nranks - rank ||
		    (uint64_t)d->first_node + d->nodes > nnodes || d->first_node > next_node)
			goto err_proto;
		if ((uint64_t)d->first_node + d->nodes > next_node)
			next_node = (uint64_t)d->first_node + d->nodes;
		rank += (uint64_t)d->per_node * d->nodes;
	}
	if (rank != nranks || next_node != nnodes)
		goto err_proto;
	*out = runs;
	*nruns_p = (int)nruns;
	return 0;

err_proto:
	free(runs);
	return -EPROTO;
}

/* --- a rank's view -------------------------------------------------------------- */

struct retired_member {
	struct retired_member *next;
	struct r2cc_ctl_member *m;
};

struct r2cc_ctl_dir_priv {
	int nruns;
	struct dir_run *runs;
	pthread_mutex_t mu;	    /* the members map and what hangs off it */
	struct r2cc_hmap members;   /* rank -> struct r2cc_ctl_member (member_size) */
	size_t member_bytes;	    /* what those take */
	struct retired_member *old; /* replaced members: callers may still hold them */
	/* Where members are looked up: the rendezvous of lk_job, round lk_gen, in
	 * whose numbering this rank is lk_self; lk_rank[r] is rank r there (NULL: the
	 * same numbering); lk_back the inverse, made on first use. */
	struct r2cc_ctl_job lk_job;
	uint32_t lk_gen;
	int lk_self;
	int *lk_rank;
	struct r2cc_hmap lk_back;
};

static struct r2cc_ctl_dir *dir_alloc(int nranks, int self_rank)
{
	struct r2cc_ctl_dir *dir = calloc(1, sizeof(*dir));
	struct r2cc_ctl_dir_priv *p = calloc(1, sizeof(*p));
	if (!dir || !p) {
		free(dir);
		free(p);
		return NULL;
	}
	pthread_mutex_init(&p->mu, NULL);
	dir->priv = p;
	dir->nranks = nranks;
	dir->self_rank = self_rank;
	return dir;
}

void r2cc_ctl_dir_free(struct r2cc_ctl_dir *dir)
{
	if (!dir)
		return;
	struct r2cc_ctl_dir_priv *p = dir->priv;
	for (size_t i = 0; i < p->members.cap; i++)
		free(p->members.vals[i]);
	r2cc_hmap_free(&p->members);
	r2cc_hmap_free(&p->lk_back);
	while (p->old) {
		struct retired_member *o = p->old;
		p->old = o->next;
		free(o->m);
		free(o);
	}
	pthread_mutex_destroy(&p->mu);
	free(p->runs);
	free(p->lk_rank);
	free(p);
	free(dir);
}

int r2cc_ctl_dir_node(const struct r2cc_ctl_dir *dir, int rank)
{
	if (!dir || rank < 0 || rank >= dir->nranks)
		return -EINVAL;
	const struct r2cc_ctl_dir_priv *p = dir->priv;
	int lo = 0, hi = p->nruns - 1;
	while (lo < hi) {
		int mid = (lo + hi + 1) / 2;
		if (p->runs[mid].first_rank <= (uint32_t)rank)
			lo = mid;
		else
			hi = mid - 1;
	}
	const struct dir_run *d = &p->runs[lo];
	return (int)(d->first_node + ((uint32_t)rank - d->first_rank) / d->per_node);
}

int r2cc_ctl_dir_node_ranks(const struct r2cc_ctl_dir *dir, int node, int *ranks, int max)
{
	if (!dir || node < 0 || node >= dir->nnodes)
		return -EINVAL;
	const struct r2cc_ctl_dir_priv *p = dir->priv;
	int n = 0;
	for (int i = 0; i < p->nruns; i++) {
		const struct dir_run *d = &p->runs[i];
		if ((uint32_t)node < d->first_node || (uint32_t)node >= d->first_node + d->nodes)
			continue;
		uint32_t first = d->first_rank + ((uint32_t)node - d->first_node) * d->per_node;
		for (uint32_t k = 0; k < d->per_node; k++, n++)
			if (n < max)
				ranks[n] = (int)(first + k);
	}
	return n;
}

/* Under p->mu. A member replaced is kept until the directory goes: callers may
 * still hold it. */
static int put_locked(struct r2cc_ctl_dir_priv *p, int rank, const struct r2cc_ctl_member *m)
{
	size_t size = member_size(m->nnics);
	struct r2cc_ctl_member *c = malloc(size);
	if (!c)
		return -ENOMEM;
	memcpy(c, m, size);
	struct r2cc_ctl_member *prev = r2cc_hmap_get(&p->members, (uint64_t)rank);
	if (prev) {
		struct retired_member *o = malloc(sizeof(*o));
		if (!o) {
			free(c);
			return -ENOMEM;
		}
		o->m = prev;
		o->next = p->old;
		p->old = o;
	}
	if (r2cc_hmap_put(&p->members, (uint64_t)rank, c)) {
		if (prev) { /* still in the map: not retired after all */
			struct retired_member *o = p->old;
			p->old = o->next;
			free(o);
		}
		free(c);
		return -ENOMEM;
	}
	p->member_bytes += size;
	return 0;
}

const struct r2cc_ctl_member *r2cc_ctl_dir_member(const struct r2cc_ctl_dir *dir, int rank)
{
	if (!dir || rank < 0 || rank >= dir->nranks)
		return NULL;
	struct r2cc_ctl_dir_priv *p = dir->priv;
	pthread_mutex_lock(&p->mu);
	const struct r2cc_ctl_member *m = r2cc_hmap_get(&p->members, (uint64_t)rank);
	pthread_mutex_unlock(&p->mu);
	return m;
}

size_t r2cc_ctl_dir_bytes(const struct r2cc_ctl_dir *dir)
{
	if (!dir)
		return 0;
	struct r2cc_ctl_dir_priv *p = dir->priv;
	pthread_mutex_lock(&p->mu);
	size_t n = sizeof(*dir) + sizeof(*p) + (size_t)p->nruns * sizeof(*p->runs) +
		   p->member_bytes + r2cc_hmap_bytes(&p->members) + r2cc_hmap_bytes(&p->lk_back) +
		   (p->lk_rank ? (size_t)dir->nranks * sizeof(int) : 0);
	pthread_mutex_unlock(&p->mu);
	return n;
}

void r2cc_ctl_dir_lookup_target(const struct r2cc_ctl_dir *dir, const struct r2cc_ctl_job **job,
				int *self, uint32_t *gen)
{
	*job = &dir->priv->lk_job;
	*self = dir->priv->lk_self;
	*gen = dir->priv->lk_gen;
}

int r2cc_ctl_dir_to_lookup(const struct r2cc_ctl_dir *dir, int rank)
{
	if (rank < 0 || rank >= dir->nranks)
		return -1;
	return dir->priv->lk_rank ? dir->priv->lk_rank[rank] : rank;
}

/* Under p->mu. */
static int from_lookup_locked(const struct r2cc_ctl_dir *dir, int lrank)
{
	struct r2cc_ctl_dir_priv *p = dir->priv;
	if (!p->lk_rank)
		return lrank >= 0 && lrank < dir->nranks ? lrank : -1;
	if (!p->lk_back.count)
		for (int r = 0; r < dir->nranks; r++)
			if (r2cc_hmap_put(&p->lk_back, (uint64_t)p->lk_rank[r],
					  (void *)(uintptr_t)(r + 1)))
				return -1;
	uintptr_t v = (uintptr_t)r2cc_hmap_get(&p->lk_back, (uint64_t)lrank);
	return v ? (int)v - 1 : -1;
}

int r2cc_ctl_dir_decode(const unsigned char *blob, size_t len, const struct r2cc_ctl_job *job,
			int self_rank, struct r2cc_ctl_dir **dir_p)
{
	struct rbuf r = {blob, len, 0, false};
	/* What the blob makes costs memory in proportion to the blob (runs of 12
	 * bytes, members of their own length), not to the ranks it claims. */
	uint32_t nranks = r_u32(&r), nnodes = r_u32(&r), gen = r_u32(&r);
	const unsigned char *digest = r_bytes(&r, 32);
	if (r.bad || nranks == 0 || nranks > R2CC_CTL_MAX_RANKS || nnodes == 0 || nnodes > nranks ||
	    self_rank < 0 || (uint32_t)self_rank >= nranks)
		return -EPROTO;
	struct r2cc_ctl_dir *dir = dir_alloc((int)nranks, self_rank);
	if (!dir)
		return -ENOMEM;
	struct r2cc_ctl_dir_priv *p = dir->priv;
	dir->job = *job;
	dir->nnodes = (int)nnodes;
	dir->gen = gen;
	memcpy(dir->digest, digest, 32);
	p->lk_job = *job;
	p->lk_gen = gen;
	p->lk_self = self_rank;
	int rc = r_runs(&r, nranks, nnodes, &p->runs, &p->nruns);
	if (rc)
		goto err_free;
	uint32_t nm = r_u32(&r);
	if (r.bad || nm > nranks)
		goto err_proto;
	struct r2cc_ctl_member *m = malloc(sizeof(*m));
	if (!m) {
		rc = -ENOMEM;
		goto err_free;
	}
	for (uint32_t i = 0; i < nm && rc == 0; i++) {
		uint32_t rank = r_u32(&r), mlen = r_u32(&r);
		const unsigned char *b = r_bytes(&r, mlen);
		if (!b || rank >= nranks || r2cc_ctl_member_decode(b, mlen, m) ||
		    r2cc_hmap_get(&p->members, rank)) {
			rc = -EPROTO;
			break;
		}
		m->node = r2cc_ctl_dir_node(dir, (int)rank);
		rc = put_locked(p, (int)rank, m);
	}
	free(m);
	if (rc)
		goto err_free;
	/* The registrant's own member comes with its node. */
	if (r.off != len || !r2cc_hmap_get(&p->members, (uint64_t)self_rank))
		goto err_proto;
	*dir_p = dir;
	return 0;

err_proto:
	rc = -EPROTO;
err_free:
	r2cc_ctl_dir_free(dir);
	return rc;
}

/* --- lookups (client side) ---------------------------------------------------------- */

int r2cc_ctl_lookup_encode(const struct r2cc_ctl_dir *dir, const int *ranks, int nr,
			   const struct r2cc_ctl_nicaddr *addrs, int na, unsigned char **out,
			   size_t *len)
{
	if (nr < 0 || na < 0 || nr > R2CC_CTL_MAX_RANKS || na > R2CC_CTL_LOOKUP_MAX_ADDRS)
		return -EINVAL;
	size_t cap = 12 + 4 * (size_t)nr + 17 * (size_t)na;
	unsigned char *b = malloc(cap);
	if (!b)
		return -ENOMEM;
	struct wbuf w = {b, 0, cap, false};
	w_u32(&w, dir->priv->lk_gen);
	w_u32(&w, (uint32_t)nr);
	for (int i = 0; i < nr; i++) {
		int l = r2cc_ctl_dir_to_lookup(dir, ranks[i]);
		if (l < 0) {
			free(b);
			return -EINVAL;
		}
		w_u32(&w, (uint32_t)l);
	}
	w_u32(&w, (uint32_t)na);
	for (int i = 0; i < na; i++) {
		w_u8(&w, addrs[i].kind);
		w_bytes(&w, addrs[i].bytes, 16);
	}
	*out = b;
	*len = w.len;
	return 0;
}

int r2cc_ctl_dir_take_lookup(const struct r2cc_ctl_dir *dir, const unsigned char *reply, size_t len,
			     int naddrs, int *owners, int max_per_addr, int *nowners)
{
	struct r2cc_ctl_dir_priv *p = dir->priv;
	struct rbuf r = {reply, len, 0, false};
	int rc = 0;
	if (r_u32(&r) != (uint32_t)naddrs || r.bad)
		return -EPROTO;
	pthread_mutex_lock(&p->mu);
	for (int i = 0; i < naddrs && !r.bad; i++) {
		uint32_t k = r_u32(&r);
		int got = 0;
		for (uint32_t j = 0; j < k && !r.bad; j++) {
			int rank = from_lookup_locked(dir, (int)r_u32(&r));
			if (rank >= 0 && got < max_per_addr)
				owners[i * max_per_addr + got] = rank;
			got += rank >= 0;
		}
		if (nowners)
			nowners[i] = got;
	}
	uint32_t nm = r_u32(&r);
	struct r2cc_ctl_member *m = malloc(sizeof(*m));
	if (!m)
		rc = -ENOMEM;
	for (uint32_t i = 0; i < nm && !r.bad && rc == 0; i++) {
		int rank = from_lookup_locked(dir, (int)r_u32(&r));
		uint32_t mlen = r_u32(&r);
		const unsigned char *b = r_bytes(&r, mlen);
		if (!b || r2cc_ctl_member_decode(b, mlen, m)) {
			r.bad = true;
			break;
		}
		if (rank < 0)
			continue; /* not in this directory (a split's parent has more) */
		m->node = r2cc_ctl_dir_node(dir, rank);
		rc = put_locked(p, rank, m);
	}
	pthread_mutex_unlock(&p->mu);
	free(m);
	if (!rc && (r.bad || r.off != len))
		rc = -EPROTO;
	return rc;
}

int r2cc_ctl_nics_encode(const struct r2cc_ctl_dir *dir, const struct r2cc_ctl_nic *nics, int n,
			 unsigned char **out, size_t *len)
{
	if (n < 1 || n > R2CC_CTL_MAX_NICS)
		return -EINVAL;
	size_t cap = 12 + (size_t)n * (1 + R2CC_CTL_NIC_NAME_MAX + 24);
	unsigned char *b = malloc(cap);
	if (!b)
		return -ENOMEM;
	struct wbuf w = {b, 0, cap, false};
	w_u32(&w, dir->priv->lk_gen);
	w_u32(&w, (uint32_t)dir->priv->lk_self);
	w_u32(&w, (uint32_t)n);
	for (int i = 0; i < n; i++)
		if (w_nic(&w, &nics[i])) {
			free(b);
			return -EINVAL;
		}
	*out = b;
	*len = w.len;
	return 0;
}

/* --- split ----------------------------------------------------------------------------- */

int r2cc_ctl_dir_derive(const struct r2cc_ctl_dir *parent, const int *parent_ranks, int nranks,
			int self_rank, uint64_t tag, struct r2cc_ctl_dir **child_p)
{
	static const char label[] = "r2cc-ctl split";
	unsigned char msg[sizeof(label) + 8];
	unsigned int mlen = 0;
	if (!parent || !parent_ranks || nranks < 1 || nranks > parent->nranks || self_rank < 0 ||
	    self_rank >= nranks)
		return -EINVAL;
	for (int i = 0; i < nranks; i++)
		if (parent_ranks[i] < 0 || parent_ranks[i] >= parent->nranks)
			return -EINVAL;
	struct r2cc_ctl_dir *dir = dir_alloc(nranks, self_rank);
	int *node = malloc(sizeof(int) * (size_t)nranks);
	int *renum = malloc(sizeof(int) * (size_t)parent->nnodes);
	struct r2cc_ctl_member *m = malloc(sizeof(*m));
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	int rc = -ENOMEM;
	if (!dir || !node || !renum || !m || !md)
		goto out_free;
	struct r2cc_ctl_dir_priv *p = dir->priv;
	const struct r2cc_ctl_dir_priv *pp = parent->priv;
	dir->job.rdv = parent->job.rdv;
	memcpy(msg, label, sizeof(label));
	for (int i = 0; i < 8; i++)
		msg[sizeof(label) + (size_t)i] = (unsigned char)(tag >> (56 - 8 * i));
	if (!HMAC(EVP_sha256(), parent->job.secret, R2CC_CTL_SECRET_SIZE, msg, sizeof(msg),
		  dir->job.secret, &mlen) ||
	    mlen != R2CC_CTL_SECRET_SIZE || r2cc_ctl_job_derive_id(&dir->job))
		goto out_free;
	dir->gen = parent->gen;
	p->lk_job = pp->lk_job;
	p->lk_gen = pp->lk_gen;
	p->lk_self = r2cc_ctl_dir_to_lookup(parent, parent_ranks[self_rank]);
	p->lk_rank = malloc(sizeof(int) * (size_t)nranks);
	if (!p->lk_rank)
		goto out_free;
	/* Nodes renumbered in the child's rank order. */
	for (int k = 0; k < parent->nnodes; k++)
		renum[k] = -1;
	int nnodes = 0;
	for (int i = 0; i < nranks; i++) {
		int pn = r2cc_ctl_dir_node(parent, parent_ranks[i]);
		if (renum[pn] < 0)
			renum[pn] = nnodes++;
		node[i] = renum[pn];
		p->lk_rank[i] = r2cc_ctl_dir_to_lookup(parent, parent_ranks[i]);
	}
	dir->nnodes = nnodes;
	rc = runs_from_nodes(node, nranks, &p->runs, &p->nruns);
	if (rc)
		goto out_free;
	/* The members the parent holds come along; the others are looked up
	 * through the parent's rendezvous in its numbering. */
	for (int i = 0; i < nranks && rc == 0; i++) {
		const struct r2cc_ctl_member *pm = r2cc_ctl_dir_member(parent, parent_ranks[i]);
		if (!pm)
			continue;
		memcpy(m, pm, member_size(pm->nnics));
		m->node = node[i];
		rc = put_locked(p, i, m);
	}
	if (rc)
		goto out_free;
	/* The same on every rank that derives this child: the parent's digest, the
	 * tag and the ranks. */
	unsigned char word[8];
	rc = -EIO;
	if (!EVP_DigestInit_ex(md, EVP_sha256(), NULL) ||
	    !EVP_DigestUpdate(md, label, sizeof(label)) ||
	    !EVP_DigestUpdate(md, parent->digest, 32) ||
	    !EVP_DigestUpdate(md, msg + sizeof(label), 8))
		goto out_free;
	for (int i = 0; i < nranks; i++) {
		struct wbuf w = {word, 0, 4, false};
		w_u32(&w, (uint32_t)parent_ranks[i]);
		if (!EVP_DigestUpdate(md, word, 4))
			goto out_free;
	}
	if (!EVP_DigestFinal_ex(md, dir->digest, NULL))
		goto out_free;
	*child_p = dir;
	dir = NULL;
	rc = 0;
out_free:
	EVP_MD_CTX_free(md);
	free(m);
	free(renum);
	free(node);
	r2cc_ctl_dir_free(dir);
	return rc;
}

/* --- the rendezvous' copy of a round ---------------------------------------------- */

struct owner_list {
	struct owner_list *next; /* same hash, another address */
	struct r2cc_ctl_nicaddr a;
	int n, cap;
	int *ranks;
};

struct node_key {
	struct node_key *next; /* same hash, another key */
	int node;
	char key[R2CC_CTL_NODE_KEY_MAX];
};

struct r2cc_ctl_rdir {
	int nranks, nnodes;
	uint32_t gen;
	unsigned char **member; /* [nranks] encoded, as registered (then as NICs were reported) */
	size_t *mlen;
	int *node;		      /* [nranks] */
	int *node_start, *node_ranks; /* node n: node_ranks[node_start[n] .. node_start[n+1]) */
	unsigned char digest[32];
	unsigned char *runs; /* encoded: u32 count, entries */
	size_t runs_len;
	struct r2cc_hmap index; /* nicaddr_key -> struct owner_list chain */
	uint8_t *left;		/* [nranks]: this rank has left */
	int nleft;
	size_t bytes;
};

static void owners_free(struct r2cc_hmap *h)
{
	for (size_t i = 0; i < h->cap; i++) {
		struct owner_list *o = h->vals[i];
		while (o) {
			struct owner_list *next = o->next;
			free(o->ranks);
			free(o);
			o = next;
		}
	}
	r2cc_hmap_free(h);
}

void r2cc_ctl_rdir_free(struct r2cc_ctl_rdir *rd)
{
	if (!rd)
		return;
	for (int i = 0; rd->member && i < rd->nranks; i++)
		free(rd->member[i]);
	free(rd->member);
	free(rd->mlen);
	free(rd->node);
	free(rd->node_start);
	free(rd->node_ranks);
	free(rd->runs);
	free(rd->left);
	owners_free(&rd->index);
	free(rd);
}

uint32_t r2cc_ctl_rdir_gen(const struct r2cc_ctl_rdir *rd)
{
	return rd->gen;
}

size_t r2cc_ctl_rdir_bytes(const struct r2cc_ctl_rdir *rd)
{
	return rd->bytes + r2cc_hmap_bytes(&rd->index);
}

/* Node numbers from the node keys in rank order, with a hash of the keys. */
static int rdir_number_nodes(struct r2cc_ctl_rdir *rd)
{
	struct r2cc_hmap keys = {0};
	struct r2cc_ctl_member *m = malloc(sizeof(*m));
	struct node_key **all = calloc((size_t)rd->nranks, sizeof(*all));
	int rc = m && all ? 0 : -ENOMEM;
	for (int r = 0; r < rd->nranks && rc == 0; r++) {
		if (r2cc_ctl_member_decode(rd->member[r], rd->mlen[r], m)) {
			rc = -EPROTO;
			break;
		}
		uint64_t h = r2cc_hmap_hash_bytes(m->node_key, strlen(m->node_key));
		struct node_key *head = r2cc_hmap_get(&keys, h), *k = head;
		while (k && strcmp(k->key, m->node_key))
			k = k->next;
		if (!k) {
			k = malloc(sizeof(*k));
			if (!k || r2cc_hmap_put(&keys, h, k)) {
				free(k);
				rc = -ENOMEM;
				break;
			}
			k->next = head;
			k->node = rd->nnodes++;
			snprintf(k->key, sizeof(k->key), "%s", m->node_key);
			all[k->node] = k;
		}
		rd->node[r] = k->node;
	}
	for (int i = 0; all && i < rd->nnodes; i++)
		free(all[i]);
	free(all);
	free(m);
	r2cc_hmap_free(&keys);
	return rc;
}

static int rdir_digest(struct r2cc_ctl_rdir *rd)
{
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	unsigned char word[4];
	struct wbuf w = {word, 0, 4, false};
	int rc = -EIO;
	if (!md)
		return -ENOMEM;
	w_u32(&w, (uint32_t)rd->nranks);
	if (!EVP_DigestInit_ex(md, EVP_sha256(), NULL) || !EVP_DigestUpdate(md, word, 4))
		goto out;
	for (int r = 0; r < rd->nranks; r++) {
		w.len = 0;
		w_u32(&w, (uint32_t)rd->mlen[r]);
		if (!EVP_DigestUpdate(md, word, 4) ||
		    !EVP_DigestUpdate(md, rd->member[r], rd->mlen[r]))
			goto out;
	}
	rc = EVP_DigestFinal_ex(md, rd->digest, NULL) ? 0 : -EIO;
out:
	EVP_MD_CTX_free(md);
	return rc;
}

struct r2cc_ctl_rdir *r2cc_ctl_rdir_new(int nranks, uint32_t gen, unsigned char **member,
					size_t *mlen, int *err)
{
	struct r2cc_ctl_rdir *rd = calloc(1, sizeof(*rd));
	struct dir_run *runs = NULL;
	int nruns = 0, rc = -ENOMEM;
	if (!rd) {
		for (int i = 0; i < nranks; i++)
			free(member[i]);
		free(member);
		free(mlen);
		*err = rc;
		return NULL;
	}
	rd->nranks = nranks;
	rd->gen = gen;
	rd->member = member;
	rd->mlen = mlen;
	rd->node = malloc(sizeof(int) * (size_t)nranks);
	rd->node_ranks = malloc(sizeof(int) * (size_t)nranks);
	rd->left = calloc((size_t)nranks, 1);
	if (!rd->node || !rd->node_ranks || !rd->left)
		goto err_free;
	rc = rdir_number_nodes(rd);
	if (rc)
		goto err_free;
	rd->node_start = calloc((size_t)rd->nnodes + 1, sizeof(int));
	if (!rd->node_start)
		goto err_nomem;
	for (int r = 0; r < nranks; r++)
		rd->node_start[rd->node[r] + 1]++;
	for (int k = 0; k < rd->nnodes; k++)
		rd->node_start[k + 1] += rd->node_start[k];
	{
		int *pos = malloc(sizeof(int) * (size_t)rd->nnodes);
		if (!pos)
			goto err_nomem;
		memcpy(pos, rd->node_start, sizeof(int) * (size_t)rd->nnodes);
		for (int r = 0; r < nranks; r++)
			rd->node_ranks[pos[rd->node[r]]++] = r;
		free(pos);
	}
	rc = rdir_digest(rd);
	if (rc)
		goto err_free;
	rc = runs_from_nodes(rd->node, nranks, &runs, &nruns);
	if (rc)
		goto err_free;
	rd->runs_len = 4 + 12 * (size_t)nruns;
	rd->runs = malloc(rd->runs_len);
	if (!rd->runs)
		goto err_nomem;
	struct wbuf w = {rd->runs, 0, rd->runs_len, false};
	w_runs(&w, runs, nruns);
	free(runs);
	runs = NULL;
	rd->bytes = sizeof(*rd) +
		    (size_t)nranks * (sizeof(*member) + sizeof(*mlen) + 2 * sizeof(int) + 1) +
		    sizeof(int) * ((size_t)rd->nnodes + 1) + rd->runs_len;
	for (int r = 0; r < nranks; r++)
		rd->bytes += mlen[r];
	return rd;

err_nomem:
	rc = -ENOMEM;
err_free:
	free(runs);
	r2cc_ctl_rdir_free(rd);
	*err = rc;
	return NULL;
}

int r2cc_ctl_rdir_head(const struct r2cc_ctl_rdir *rd, int rank, unsigned char **out, size_t *len)
{
	if (rank < 0 || rank >= rd->nranks)
		return -EINVAL;
	int node = rd->node[rank];
	int first = rd->node_start[node], last = rd->node_start[node + 1];
	size_t cap = 12 + 32 + rd->runs_len + 4;
	for (int i = first; i < last; i++)
		cap += 8 + rd->mlen[rd->node_ranks[i]];
	if (cap > R2CC_CTL_MAX_PAYLOAD)
		return -EMSGSIZE;
	unsigned char *b = malloc(cap);
	if (!b)
		return -ENOMEM;
	struct wbuf w = {b, 0, cap, false};
	w_u32(&w, (uint32_t)rd->nranks);
	w_u32(&w, (uint32_t)rd->nnodes);
	w_u32(&w, rd->gen);
	w_bytes(&w, rd->digest, 32);
	w_bytes(&w, rd->runs, rd->runs_len);
	w_u32(&w, (uint32_t)(last - first));
	for (int i = first; i < last; i++) {
		int r = rd->node_ranks[i];
		w_u32(&w, (uint32_t)r);
		w_u32(&w, (uint32_t)rd->mlen[r]);
		w_bytes(&w, rd->member[r], rd->mlen[r]);
	}
	*out = b;
	*len = w.len;
	return 0;
}

static const struct owner_list *owners_find(const struct r2cc_ctl_rdir *rd,
					    const struct r2cc_ctl_nicaddr *a)
{
	const struct owner_list *o = r2cc_hmap_get(&rd->index, nicaddr_key(a));
	while (o && (o->a.kind != a->kind || memcmp(o->a.bytes, a->bytes, 16)))
		o = o->next;
	return o;
}

static int owners_add(struct r2cc_ctl_rdir *rd, const struct r2cc_ctl_nicaddr *a, int rank)
{
	uint64_t key = nicaddr_key(a);
	struct owner_list *head = r2cc_hmap_get(&rd->index, key), *o = head;
	while (o && (o->a.kind != a->kind || memcmp(o->a.bytes, a->bytes, 16)))
		o = o->next;
	if (!o) {
		o = calloc(1, sizeof(*o));
		if (!o || r2cc_hmap_put(&rd->index, key, o)) {
			free(o);
			return -ENOMEM;
		}
		o->a = *a;
		o->next = head;
		rd->bytes += sizeof(*o);
	}
	for (int i = 0; i < o->n; i++)
		if (o->ranks[i] == rank)
			return 0;
	if (o->n == o->cap) {
		int cap = o->cap ? 2 * o->cap : 4;
		int *g = realloc(o->ranks, sizeof(int) * (size_t)cap);
		if (!g)
			return -ENOMEM;
		rd->bytes += sizeof(int) * (size_t)(cap - o->cap);
		o->ranks = g;
		o->cap = cap;
	}
	/* Kept ascending, so that every asker sees the same order. */
	int i = o->n++;
	while (i > 0 && o->ranks[i - 1] > rank) {
		o->ranks[i] = o->ranks[i - 1];
		i--;
	}
	o->ranks[i] = rank;
	return 0;
}

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

int r2cc_ctl_rdir_lookup(const struct r2cc_ctl_rdir *rd, const unsigned char *req, size_t len,
			 unsigned char **out, size_t *olen)
{
	struct rbuf r = {req, len, 0, false};
	if (r_u32(&r) != rd->gen)
		return r.bad ? -EPROTO : -ENOENT;
	uint32_t nr = r_u32(&r);
	if (r.bad || nr > (uint32_t)rd->nranks)
		return -EPROTO;
	const unsigned char *rks = r_bytes(&r, 4 * (size_t)nr);
	uint32_t na = r_u32(&r);
	if (r.bad || na > R2CC_CTL_LOOKUP_MAX_ADDRS)
		return -EPROTO;
	const unsigned char *ads = r_bytes(&r, 17 * (size_t)na);
	if (r.bad || r.off != len)
		return -EPROTO;
	const struct owner_list **ol = calloc(na ? na : 1, sizeof(*ol));
	size_t nwant = nr;
	for (uint32_t i = 0; ol && i < na; i++) {
		struct r2cc_ctl_nicaddr a = {.kind = ads[17 * i]};
		memcpy(a.bytes, ads + 17 * i + 1, 16);
		ol[i] = owners_find(rd, &a);
		if (ol[i])
			nwant += (size_t)(ol[i]->n < R2CC_CTL_OWNERS_MAX ? ol[i]->n
									 : R2CC_CTL_OWNERS_MAX);
	}
	int *want = ol ? malloc(sizeof(int) * (nwant ? nwant : 1)) : NULL;
	if (!want) {
		free(ol);
		return -ENOMEM;
	}
	size_t k = 0;
	struct rbuf rr = {rks, 4 * (size_t)nr, 0, false};
	for (uint32_t i = 0; i < nr; i++) {
		uint32_t rank = r_u32(&rr);
		if (rank >= (uint32_t)rd->nranks) {
			free(want);
			free(ol);
			return -EPROTO;
		}
		want[k++] = (int)rank;
	}
	size_t cap = 8;
	for (uint32_t i = 0; i < na; i++) {
		int n =
		    ol[i] ? (ol[i]->n < R2CC_CTL_OWNERS_MAX ? ol[i]->n : R2CC_CTL_OWNERS_MAX) : 0;
		cap += 4 + 4 * (size_t)n;
		for (int j = 0; j < n; j++)
			want[k++] = ol[i]->ranks[j];
	}
	qsort(want, k, sizeof(int), cmp_int);
	size_t nm = 0;
	for (size_t i = 0; i < k; i++) {
		if (i && want[i] == want[i - 1])
			continue;
		want[nm++] = want[i];
		cap += 8 + rd->mlen[want[i]];
	}
	unsigned char *b = cap <= R2CC_CTL_MAX_PAYLOAD ? malloc(cap) : NULL;
	if (!b) {
		free(want);
		free(ol);
		return cap > R2CC_CTL_MAX_PAYLOAD ? -EMSGSIZE : -ENOMEM;
	}
	struct wbuf w = {b, 0, cap, false};
	w_u32(&w, na);
	for (uint32_t i = 0; i < na; i++) {
		int n =
		    ol[i] ? (ol[i]->n < R2CC_CTL_OWNERS_MAX ? ol[i]->n : R2CC_CTL_OWNERS_MAX) : 0;
		w_u32(&w, (uint32_t)n);
		for (int j = 0; j < n; j++)
			w_u32(&w, (uint32_t)ol[i]->ranks[j]);
	}
	w_u32(&w, (uint32_t)nm);
	for (size_t i = 0; i < nm; i++) {
		w_u32(&w, (uint32_t)want[i]);
		w_u32(&w, (uint32_t)rd->mlen[want[i]]);
		w_bytes(&w, rd->member[want[i]], rd->mlen[want[i]]);
	}
	free(want);
	free(ol);
	*out = b;
	*olen = w.len;
	return 0;
}

static bool nic_same(const struct r2cc_ctl_nic *a, const struct r2cc_ctl_nic *b)
{
	return !strcmp(a->name, b->name) && a->lid == b->lid && !memcmp(a->gid, b->gid, 16);
}

int r2cc_ctl_rdir_nics(struct r2cc_ctl_rdir *rd, int from_rank, const unsigned char *req,
		       size_t len)
{
	struct rbuf r = {req, len, 0, false};
	uint32_t gen = r_u32(&r), rank = r_u32(&r), n = r_u32(&r);
	if (r.bad || n == 0 || n > R2CC_CTL_MAX_NICS)
		return -EPROTO;
	if (gen != rd->gen)
		return -ENOENT;
	/* A rank speaks for itself only. */
	if (rank >= (uint32_t)rd->nranks || (int)rank != from_rank)
		return -EPERM;
	struct r2cc_ctl_nic nics[R2CC_CTL_MAX_NICS];
	for (uint32_t i = 0; i < n; i++) {
		memset(&nics[i], 0, sizeof(nics[i]));
		r_nic(&r, &nics[i]);
	}
	if (r.bad || r.off != len)
		return -EPROTO;
	struct r2cc_ctl_member *m = malloc(sizeof(*m));
	unsigned char *enc = malloc(R2CC_CTL_MEMBER_MAX_ENC);
	int rc = m && enc ? 0 : -ENOMEM;
	if (!rc && r2cc_ctl_member_decode(rd->member[rank], rd->mlen[rank], m))
		rc = -EPROTO;
	bool changed = false;
	for (uint32_t i = 0; i < n && !rc; i++) {
		bool known = false;
		for (int k = 0; k < m->nnics && !known; k++)
			known = nic_same(&m->nics[k], &nics[i]);
		if (!known && m->nnics < R2CC_CTL_MAX_NICS) {
			m->nics[m->nnics++] = nics[i];
			changed = true;
		}
		struct r2cc_ctl_nicaddr a;
		for (int want_gid = 0; want_gid < 2 && !rc; want_gid++) {
			r2cc_ctl_nicaddr_of(&nics[i], want_gid, &a);
			if (nicaddr_ok(&a) && (a.kind == R2CC_CTL_NICADDR_GID) == want_gid)
				rc = owners_add(rd, &a, (int)rank);
		}
	}
	if (!rc && changed) {
		int elen = r2cc_ctl_member_encode(m, enc, R2CC_CTL_MEMBER_MAX_ENC);
		unsigned char *copy = elen > 0 ? malloc((size_t)elen) : NULL;
		if (!copy) {
			rc = elen > 0 ? -ENOMEM : elen;
		} else {
			memcpy(copy, enc, (size_t)elen);
			rd->bytes += (size_t)elen - rd->mlen[rank];
			free(rd->member[rank]);
			rd->member[rank] = copy;
			rd->mlen[rank] = (size_t)elen;
		}
	}
	free(enc);
	free(m);
	return rc;
}

bool r2cc_ctl_rdir_leave(struct r2cc_ctl_rdir *rd, int rank)
{
	if (rank >= 0 && rank < rd->nranks && !rd->left[rank]) {
		rd->left[rank] = 1;
		rd->nleft++;
	}
	return rd->nleft == rd->nranks;
}
