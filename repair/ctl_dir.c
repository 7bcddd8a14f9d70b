/*
 * The job directory: encoding of what each rank registers, decoding of the
 * directory the rendezvous sends back (every length checked: the bytes come
 * from the network, authenticated but still not trusted to be well formed),
 * and lookups by rank and node. Node indices come from the node keys in rank
 * order, so every rank derives the same numbering from the same bytes.
 */
#include "repair/ctl_priv.h"

#include <errno.h>
#include <netinet/in.h>
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

int r2cc_ctl_member_encode(const struct r2cc_ctl_member *m, unsigned char *out, size_t cap)
{
	struct wbuf w = {out, 0, cap, false};
	if (m->nnics < 0 || m->nnics > R2CC_CTL_MAX_NICS || w_str(&w, m->host, sizeof(m->host)) ||
	    w_str(&w, m->node_key, sizeof(m->node_key)))
		return -EINVAL;
	w_u32(&w, (uint32_t)m->pid);
	w_addr(&w, &m->ctl_addr);
	w_u8(&w, (unsigned)m->nnics);
	for (int i = 0; i < m->nnics; i++) {
		const struct r2cc_ctl_nic *n = &m->nics[i];
		if (w_str(&w, n->name, sizeof(n->name)))
			return -EINVAL;
		w_u16(&w, n->lid);
		w_u8(&w, n->port);
		w_u8(&w, n->state);
		w_u32(&w, n->speed_gbps);
		w_bytes(&w, n->gid, 16);
	}
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
	for (int i = 0; i < m->nnics && !r.bad; i++) {
		struct r2cc_ctl_nic *n = &m->nics[i];
		r_str(&r, n->name, sizeof(n->name));
		n->lid = (uint16_t)r_u16(&r);
		n->port = (uint8_t)r_u8(&r);
		n->state = (uint8_t)r_u8(&r);
		n->speed_gbps = r_u32(&r);
		const unsigned char *gid = r_bytes(&r, 16);
		if (gid)
			memcpy(n->gid, gid, 16);
	}
	return r.bad || r.off != len ? -EPROTO : 0;
}

void r2cc_ctl_dir_free(struct r2cc_ctl_dir *dir)
{
	if (!dir)
		return;
	free(dir->members);
	free(dir->node_start);
	free(dir->node_ranks);
	free(dir);
}

/* Node numbering: a rank's node is the index of the first rank with the same
 * key, renumbered densely in order of first appearance. */
static int dir_index_nodes(struct r2cc_ctl_dir *dir)
{
	int n = dir->nranks;
	int *first = malloc(sizeof(int) * (size_t)n);
	dir->node_start = calloc((size_t)n + 1, sizeof(int));
	dir->node_ranks = malloc(sizeof(int) * (size_t)n);
	if (!first || !dir->node_start || !dir->node_ranks) {
		free(first);
		return -ENOMEM;
	}
	int nnodes = 0;
	for (int r = 0; r < n; r++) {
		int node = -1;
		for (int k = 0; k < nnodes && node < 0; k++)
			if (!strcmp(dir->members[first[k]].node_key, dir->members[r].node_key))
				node = k;
		if (node < 0) {
			node = nnodes;
			first[nnodes++] = r;
		}
		dir->members[r].node = node;
		dir->node_start[node + 1]++;
	}
	free(first);
	dir->nnodes = nnodes;
	for (int k = 0; k < nnodes; k++)
		dir->node_start[k + 1] += dir->node_start[k];
	int *fill = calloc((size_t)nnodes, sizeof(int));
	if (!fill)
		return -ENOMEM;
	for (int r = 0; r < n; r++) {
		int node = dir->members[r].node;
		dir->node_ranks[dir->node_start[node] + fill[node]++] = r;
	}
	free(fill);
	return 0;
}

/* host and node key lengths, pid, address, NIC count */
#define DIR_MEMBER_MIN_ENC (1 + 1 + 4 + 19 + 1)

int r2cc_ctl_dir_decode(const unsigned char *blob, size_t len, const struct r2cc_ctl_job *job,
			int self_rank, struct r2cc_ctl_dir **dir_p)
{
	struct rbuf r = {blob, len, 0, false};
	uint32_t nranks = r_u32(&r);
	/* Each rank takes at least its length and the smallest member (26 bytes): a
	 * short blob claiming many ranks must not cost nranks members of memory. */
	if (r.bad || nranks == 0 || nranks > R2CC_CTL_MAX_RANKS || self_rank < 0 ||
	    (uint32_t)self_rank >= nranks || (len - 4) / (4 + DIR_MEMBER_MIN_ENC) < nranks)
		return -EPROTO;
	struct r2cc_ctl_dir *dir = calloc(1, sizeof(*dir));
	if (!dir)
		return -ENOMEM;
	dir->members = calloc(nranks, sizeof(*dir->members));
	if (!dir->members)
		goto err_free;
	dir->job = *job;
	dir->nranks = (int)nranks;
	dir->self_rank = self_rank;
	for (uint32_t i = 0; i < nranks; i++) {
		uint32_t mlen = r_u32(&r);
		const unsigned char *m = r_bytes(&r, mlen);
		if (!m || r2cc_ctl_member_decode(m, mlen, &dir->members[i]))
			goto err_proto;
	}
	if (r.off != len)
		goto err_proto;
	unsigned int mdlen = 0;
	if (!EVP_Digest(blob, len, dir->digest, &mdlen, EVP_sha256(), NULL) || dir_index_nodes(dir))
		goto err_free;
	*dir_p = dir;
	return 0;

err_proto:
	r2cc_ctl_dir_free(dir);
	return -EPROTO;
err_free:
	r2cc_ctl_dir_free(dir);
	return -ENOMEM;
}

const struct r2cc_ctl_member *r2cc_ctl_dir_member(const struct r2cc_ctl_dir *dir, int rank)
{
	return rank >= 0 && rank < dir->nranks ? &dir->members[rank] : NULL;
}

int r2cc_ctl_dir_node(const struct r2cc_ctl_dir *dir, int rank)
{
	return rank >= 0 && rank < dir->nranks ? dir->members[rank].node : -EINVAL;
}

int r2cc_ctl_dir_node_ranks(const struct r2cc_ctl_dir *dir, int node, int *ranks, int max)
{
	if (node < 0 || node >= dir->nnodes)
		return -EINVAL;
	int n = dir->node_start[node + 1] - dir->node_start[node];
	for (int i = 0; i < n && i < max; i++)
		ranks[i] = dir->node_ranks[dir->node_start[node] + i];
	return n;
}

/* Digest of the directory blob the rendezvous would send for these members. */
static int dir_digest(struct r2cc_ctl_dir *dir)
{
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	unsigned char *buf = malloc(R2CC_CTL_MEMBER_MAX_ENC);
	unsigned char word[4];
	int rc = -ENOMEM;
	if (!md || !buf || !EVP_DigestInit_ex(md, EVP_sha256(), NULL))
		goto out_free;
	struct wbuf w = {word, 0, 4, false};
	w_u32(&w, (uint32_t)dir->nranks);
	EVP_DigestUpdate(md, word, 4);
	for (int r = 0; r < dir->nranks; r++) {
		int len = r2cc_ctl_member_encode(&dir->members[r], buf, R2CC_CTL_MEMBER_MAX_ENC);
		if (len < 0) {
			rc = len;
			goto out_free;
		}
		w.len = 0;
		w_u32(&w, (uint32_t)len);
		EVP_DigestUpdate(md, word, 4);
		EVP_DigestUpdate(md, buf, (size_t)len);
	}
	rc = EVP_DigestFinal_ex(md, dir->digest, NULL) ? 0 : -EIO;
out_free:
	EVP_MD_CTX_free(md);
	free(buf);
	return rc;
}

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
	struct r2cc_ctl_dir *dir = calloc(1, sizeof(*dir));
	if (!dir)
		return -ENOMEM;
	dir->members = calloc((size_t)nranks, sizeof(*dir->members));
	if (!dir->members)
		goto err_free;
	dir->nranks = nranks;
	dir->self_rank = self_rank;
	dir->job.rdv = parent->job.rdv;
	memcpy(msg, label, sizeof(label));
	for (int i = 0; i < 8; i++)
		msg[sizeof(label) + (size_t)i] = (unsigned char)(tag >> (56 - 8 * i));
	if (!HMAC(EVP_sha256(), parent->job.secret, R2CC_CTL_SECRET_SIZE, msg, sizeof(msg),
		  dir->job.secret, &mlen) ||
	    mlen != R2CC_CTL_SECRET_SIZE || r2cc_ctl_job_derive_id(&dir->job))
		goto err_free;
	for (int i = 0; i < nranks; i++)
		dir->members[i] = parent->members[parent_ranks[i]];
	if (dir_index_nodes(dir) || dir_digest(dir))
		goto err_free;
	*child_p = dir;
	return 0;

err_free:
	r2cc_ctl_dir_free(dir);
	return -ENOMEM;
}
