/*
 * The exchange's messages (see engine_priv.h for their layout): one per peer
 * process and step, built from the records, with the rkey maps the receiver needs;
 * their check (r2cc_repair_wire_parse(), fuzzed) and the control plane's delivery
 * to the repair thread's inbox.
 */
#include "repair/engine_priv.h"

#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

void r2cc_wire_fill(struct rep_wire *m, int op, const struct r2cc_rqp *r)
{
	memset(m, 0, sizeof(*m));
	m->op = (uint8_t)op;
	m->pair_id = htole64(r->pair_id);
	r2cc_peer_ep_put(&r->ep_local, m->src);
	r2cc_peer_ep_put(&r->ep_remote, m->dst);
	snprintf(m->orig_nic, sizeof(m->orig_nic), "%s", r->orig_nic->name);
	int st = __atomic_load_n(&r->cur_nic->state, __ATOMIC_RELAXED);
	if (op == OP_REQ && r->failback_to)
		m->flags = htole16(WIRE_F_FAILBACK);
	else if (op == OP_REQ && st != R2CC_NIC_UP)
		m->flags = htole16(WIRE_F_SENDER_NIC_FAILED |
				   (st == R2CC_NIC_DECLARED ? WIRE_F_DECLARED : 0) |
				   (r->born_late ? WIRE_F_CREATED_AFTER : 0));
}

/* This side's counts after its fence: the receives its old path consumed, the
 * messages its sends retired and its record of the last of them. */
void r2cc_wire_counts(struct rep_wire *m, const struct r2cc_rqp *r)
{
	m->count = htole64(r->k_local);
	const struct r2cc_shadow_msg *last = r->fenced_lost;
	int n = r->fenced_nlost;
	m->sent = htole64(r->fenced_sent);
	m->nlost = (uint8_t)n;
	for (int i = 0; i < n; i++) {
		m->lost_op[i] = last[i].opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? WIRE_MSG_WRITE_IMM
				: last[i].opcode == IBV_WR_SEND		     ? WIRE_MSG_SEND
									     : WIRE_MSG_SEND_IMM;
		m->lost_imm[i] = last[i].imm_data; /* network order, as posted */
		m->lost_len[i] = htole32(last[i].byte_len);
	}
}

/* The peer's counts from its REQ or REP. Under r->mu. */
void r2cc_wire_take_counts(struct r2cc_rqp *r, const struct rep_wire *m)
{
	static const enum ibv_wr_opcode op[] = {
	    [WIRE_MSG_WRITE_IMM] = IBV_WR_RDMA_WRITE_WITH_IMM,
	    [WIRE_MSG_SEND] = IBV_WR_SEND,
	    [WIRE_MSG_SEND_IMM] = IBV_WR_SEND_WITH_IMM,
	};
	r->k_peer = le64toh(m->count);
	r->peer_sent = le64toh(m->sent);
	r->npeer_lost = m->nlost; /* checked by r2cc_repair_wire_parse() */
	for (int i = 0; i < r->npeer_lost; i++)
		r->peer_lost[i] = (struct r2cc_shadow_msg){
		    .n = r->peer_sent - (uint64_t)(r->npeer_lost - 1 - i),
		    .imm_data = m->lost_imm[i],
		    .byte_len = le32toh(m->lost_len[i]),
		    .opcode = op[m->lost_op[i]],
		};
}

void r2cc_wire_path(struct rep_wire *m, const struct r2cc_rqp *r)
{
	struct r2cc_nic *nic = r->new_ctx->nic;
	m->new_qpn = htole32(r->new_qp->qp_num);
	m->new_lid = htole16(nic->lid);
	m->new_port = nic->port ? nic->port : 1;
	m->new_mtu = r2cc_path_mtu(r, nic);
	memcpy(m->new_gid, r2cc_path_gid(r, nic), 16);
	snprintf(m->new_nic, sizeof(m->new_nic), "%s", nic->name);
}

static uint64_t peer_key(const struct r2cc_ctl_dir *dir, int rank)
{
	uint64_t k[2] = {(uint64_t)(uintptr_t)dir, (uint64_t)rank};
	return r2cc_hmap_hash_bytes(k, sizeof(k));
}

static struct outbox *box_of(struct outboxes *o, const struct r2cc_ctl_dir *dir, int rank)
{
	uint64_t key = peer_key(dir, rank);
	uintptr_t v = (uintptr_t)r2cc_hmap_get(&o->by_peer, key);
	if (v && o->box[v - 1].dir == dir && o->box[v - 1].rank == rank)
		return &o->box[v - 1];
	for (int i = 0; v && i < o->n; i++) /* another peer behind the same hash */
		if (o->box[i].dir == dir && o->box[i].rank == rank)
			return &o->box[i];
	if (o->n == o->cap) {
		int cap = o->cap ? 2 * o->cap : 16;
		struct outbox *g = realloc(o->box, sizeof(*g) * (size_t)cap);
		if (!g)
			return NULL;
		o->box = g;
		o->cap = cap;
	}
	struct outbox *b = &o->box[o->n];
	*b = (struct outbox){.dir = dir, .rank = rank};
	if (!v)
		r2cc_hmap_put(&o->by_peer, key, (void *)(uintptr_t)(o->n + 1));
	o->n++;
	return b;
}

/* Room for one more entry to (dir, rank), or NULL (out of memory: logged by
 * the caller's outcome, the deadline). */
struct rep_wire *r2cc_out_add(struct outboxes *o, const struct r2cc_ctl_dir *dir, int rank)
{
	struct outbox *b = box_of(o, dir, rank);
	if (!b)
		return NULL;
	if (b->n == b->cap) {
		int cap = b->cap ? 2 * b->cap : 8;
		struct rep_wire *g = realloc(b->e, sizeof(*g) * (size_t)cap);
		if (!g)
			return NULL;
		b->e = g;
		b->cap = cap;
	}
	return &b->e[b->n++];
}

int r2cc_out_cts(struct outboxes *o, const struct r2cc_ctl_dir *dir, int rank,
		 const struct rep_cts *c, int n)
{
	struct outbox *b = box_of(o, dir, rank);
	if (!b || !b->n)
		return -ENOMEM;
	if (b->nc + n > b->ccap) {
		int cap = b->ccap ? 2 * b->ccap : 64;
		while (cap < b->nc + n)
			cap *= 2;
		struct rep_cts *g = realloc(b->c, sizeof(*g) * (size_t)cap);
		if (!g)
			return -ENOMEM;
		b->c = g;
		b->ccap = cap;
	}
	for (int i = 0; i < n; i++) {
		b->c[b->nc] = c[i];
		b->c[b->nc++].entry = htole16((uint16_t)(b->n - 1));
	}
	return 0;
}

/*
 * This process's rkey maps that the entries of one send call for, each made
 * once: for a REQ or REP whose QP's new path is on another NIC than its
 * original path, the map between the two (the receiver posts with keys of
 * the original NIC, which NCCL's peer holds).
 */
struct wire_map {
	char from[64], to[64];
	unsigned char *b; /* NULL: could not be made; the receiver fetches it */
	size_t len;
};

struct map_set {
	struct wire_map *m;
	int n, cap;
};

/* The map entry e calls for (made now if it is the first), or -1: none. */
static int map_of(struct map_set *ms, const struct rep_wire *e)
{
	if ((e->op != OP_REQ && e->op != OP_REP) || !strcmp(e->orig_nic, e->new_nic))
		return -1;
	for (int i = 0; i < ms->n; i++)
		if (!strcmp(ms->m[i].from, e->orig_nic) && !strcmp(ms->m[i].to, e->new_nic))
			return i;
	if (ms->n == ms->cap) {
		int cap = ms->cap ? 2 * ms->cap : 4;
		struct wire_map *g = realloc(ms->m, sizeof(*g) * (size_t)cap);
		if (!g)
			return -1;
		ms->m = g;
		ms->cap = cap;
	}
	struct wire_map *w = &ms->m[ms->n];
	memset(w, 0, sizeof(*w));
	snprintf(w->from, sizeof(w->from), "%s", e->orig_nic);
	snprintf(w->to, sizeof(w->to), "%s", e->new_nic);
	int rc = r2cc_mr_mirror_map_encode(w->from, w->to, &w->b, &w->len);
	if (rc)
		R2CC_WARN_ONCE("repair: cannot send the rkey map %s -> %s with the exchange (%s); "
			       "the peer will fetch it",
			       w->from, w->to, strerror(-rc));
	return ms->n++;
}

static void map_set_free(struct map_set *ms)
{
	for (int i = 0; i < ms->n; i++)
		free(ms->m[i].b);
	free(ms->m);
	*ms = (struct map_set){0};
}

/* The records of entries [first, first + k) of c[0..nc) (sorted by entry). */
static const struct rep_cts *cts_range(const struct rep_cts *c, int nc, int first, int k, int *n)
{
	int i = 0;
	while (i < nc && le16toh(c[i].entry) < first)
		i++;
	int j = i;
	while (j < nc && le16toh(c[j].entry) < first + k)
		j++;
	*n = j - i;
	return c ? c + i : NULL;
}

/* One message of entries e[0..k), with the maps they call for unless !maps and
 * the clear-to-send records c[0..nc) (entry first + index in e): 0 and *buf
 * (malloc'd, *len bytes), -E2BIG (more than a frame holds) or -ENOMEM. */
static int wire_build(struct map_set *ms, const struct rep_wire *e, int k, bool maps,
		      const struct rep_cts *c, int nc, int first, unsigned char **buf, size_t *len)
{
	int used[WIRE_MAX_MAPS], nu = 0;
	size_t n = sizeof(struct rep_hdr) + (size_t)k * sizeof(*e) + (size_t)nc * sizeof(*c);
	for (int i = 0; maps && i < k; i++) {
		int j = map_of(ms, &e[i]), u = 0;
		if (j < 0 || !ms->m[j].b)
			continue;
		while (u < nu && used[u] != j)
			u++;
		if (u < nu)
			continue;
		if (nu == WIRE_MAX_MAPS)
			return -E2BIG;
		used[nu++] = j;
		n += sizeof(struct rep_map) + ms->m[j].len;
	}
	if (n > R2CC_CTL_MAX_PAYLOAD)
		return -E2BIG;
	unsigned char *b = malloc(n), *p = b;
	if (!b)
		return -ENOMEM;
	struct rep_hdr h = {.version = WIRE_VERSION,
			    .nmaps = (uint8_t)nu,
			    .n = htole16((uint16_t)k),
			    .ncts = htole32((uint32_t)nc)};
	memcpy(p, &h, sizeof(h));
	p += sizeof(h);
	memcpy(p, e, (size_t)k * sizeof(*e));
	p += (size_t)k * sizeof(*e);
	for (int u = 0; u < nu; u++) {
		const struct wire_map *w = &ms->m[used[u]];
		struct rep_map mh = {.len = htole32((uint32_t)w->len)};
		memcpy(mh.from, w->from, sizeof(mh.from));
		memcpy(mh.to, w->to, sizeof(mh.to));
		memcpy(p, &mh, sizeof(mh));
		memcpy(p + sizeof(mh), w->b, w->len);
		p += sizeof(mh) + w->len;
	}
	for (int i = 0; i < nc; i++) {
		struct rep_cts r = c[i];
		r.entry = htole16((uint16_t)(le16toh(r.entry) - first));
		memcpy(p, &r, sizeof(r));
		p += sizeof(r);
	}
	*buf = b;
	*len = n;
	return 0;
}

/* Entries to one peer, in as few messages as their number and maps allow: a
 * message that would not fit in a frame is split, each part with the maps of
 * its own entries; a map too large for a frame on its own stays behind (the
 * peer's fetch of it fails the same way). */
int r2cc_wire_send(const struct r2cc_ctl_dir *dir, int rank, const struct rep_wire *e, int n,
		   const struct rep_cts *c, int nc)
{
	struct map_set ms = {0};
	int rc = 0;
	for (int first = 0; first < n && rc == 0;) {
		int k = n - first < WIRE_MAX_ENTRIES ? n - first : WIRE_MAX_ENTRIES;
		bool maps = true;
		unsigned char *buf = NULL;
		size_t len = 0;
		int kc = 0;
		const struct rep_cts *kr = cts_range(c, nc, first, k, &kc);
		while ((rc = wire_build(&ms, e + first, k, maps, kr, kc, first, &buf, &len)) ==
			   -E2BIG &&
		       maps) {
			if (k > 1)
				k /= 2;
			else
				maps = false;
			kr = cts_range(c, nc, first, k, &kc);
		}
		if (rc)
			break;
		rc = r2cc_ctl_send(dir, rank, R2CC_REPAIR_MSG, buf, len);
		free(buf);
		first += k;
	}
	map_set_free(&ms);
	if (rc)
		R2CC_WARN("repair: cannot queue a message of %d queue pair(s) to rank %d (%s)", n,
			  rank, strerror(-rc));
	return rc;
}

/* Sends every box and empties the set. */
void r2cc_out_flush(struct outboxes *o)
{
	for (int i = 0; i < o->n; i++) {
		if (o->box[i].n)
			r2cc_wire_send(o->box[i].dir, o->box[i].rank, o->box[i].e, o->box[i].n,
				       o->box[i].c, o->box[i].nc);
		free(o->box[i].e);
		free(o->box[i].c);
	}
	free(o->box);
	r2cc_hmap_free(&o->by_peer);
	*o = (struct outboxes){0};
}

_Static_assert(sizeof(struct rep_hdr) == R2CC_REPAIR_WIRE_HDR, "exchange header size");
_Static_assert(sizeof(struct rep_wire) == R2CC_REPAIR_WIRE_SIZE, "exchange entry size");
_Static_assert(sizeof(struct rep_map) == R2CC_REPAIR_WIRE_MAP_HDR, "rkey map header size");
_Static_assert(sizeof(struct rep_cts) == R2CC_REPAIR_WIRE_CTS, "clear-to-send record size");
_Static_assert(R2CC_CTS_MAX_QUERY *WIRE_MAX_ENTRIES <= UINT32_MAX, "records per message");
_Static_assert(offsetof(struct rep_wire, new_nic) == R2CC_REPAIR_WIRE_NEW_NIC, "new_nic");
_Static_assert(offsetof(struct rep_wire, orig_nic) == R2CC_REPAIR_WIRE_ORIG_NIC, "orig_nic");
_Static_assert(offsetof(struct rep_wire, sent) == R2CC_REPAIR_WIRE_SENT, "sent");
_Static_assert(R2CC_SHADOW_LOST_MAX == R2CC_REPAIR_WIRE_LOST, "records per entry");
_Static_assert(WIRE_MAX_ENTRIES <= R2CC_REPAIR_WIRE_MAX, "entries per message");

/* The maps after a message's entries: nmaps of them in the first len bytes,
 * each with both NIC names terminated and not empty, and a body (checked in
 * full when it is stored). Their bytes, or -1. */
static ssize_t wire_maps_len(const unsigned char *p, size_t len, int nmaps)
{
	size_t used = 0;
	for (int j = 0; j < nmaps; j++) {
		struct rep_map h;
		if (len - used < sizeof(h))
			return -1;
		memcpy(&h, p + used, sizeof(h));
		size_t n = le32toh(h.len);
		if (!h.from[0] || !h.to[0] || !memchr(h.from, 0, sizeof(h.from)) ||
		    !memchr(h.to, 0, sizeof(h.to)) || n == 0 || n > len - used - sizeof(h))
			return -1;
		used += sizeof(h) + n;
	}
	return (ssize_t)used;
}

/* The clear-to-send records: each for an entry of the n, of a known kind, with a
 * layout that keeps idx inside its element. */
static bool wire_cts_ok(const unsigned char *p, uint32_t ncts, int n)
{
	for (uint32_t i = 0; i < ncts; i++) {
		struct rep_cts c;
		memcpy(&c, p + (size_t)i * sizeof(c), sizeof(c));
		if (le16toh(c.entry) >= n || (c.kind != CTS_QUERY && c.kind != CTS_ANSWER) ||
		    c.nelem < 1 || c.nelem > R2CC_CTS_MAX_ELEMS || (c.elem != 32 && c.elem != 64) ||
		    c.idx_off % 8 || c.idx_off + 8 > c.elem || c.landed > 1)
			return false;
	}
	return true;
}

int r2cc_repair_wire_parse(const void *payload, size_t len, void *out, int max)
{
	struct rep_hdr h;
	if (len < sizeof(h))
		return -EPROTO;
	memcpy(&h, payload, sizeof(h));
	int n = le16toh(h.n);
	size_t body = sizeof(h) + (size_t)n * sizeof(struct rep_wire);
	if (h.version != WIRE_VERSION || n == 0 || n > max || len < body)
		return -EPROTO;
	const unsigned char *tail = (const unsigned char *)payload + body;
	ssize_t maps = wire_maps_len(tail, len - body, h.nmaps);
	uint32_t ncts = le32toh(h.ncts);
	if (maps < 0 || (len - body - (size_t)maps) / sizeof(struct rep_cts) != ncts ||
	    (len - body - (size_t)maps) % sizeof(struct rep_cts) ||
	    !wire_cts_ok(tail + maps, ncts, n))
		return -EPROTO;
	struct rep_wire *m = out;
	memcpy(m, (const unsigned char *)payload + sizeof(h), (size_t)n * sizeof(*m));
	for (int i = 0; i < n; i++) {
		if (m[i].op < OP_REQ || m[i].op > OP_FAR_REP || m[i].nlost > R2CC_SHADOW_LOST_MAX ||
		    m[i].nlost > le64toh(m[i].sent))
			return -EPROTO;
		for (int j = 0; j < m[i].nlost; j++)
			if (m[i].lost_op[j] < WIRE_MSG_WRITE_IMM ||
			    m[i].lost_op[j] > WIRE_MSG_SEND_IMM)
				return -EPROTO;
		m[i].new_nic[sizeof(m[i].new_nic) - 1] = 0;
		m[i].orig_nic[sizeof(m[i].orig_nic) - 1] = 0;
	}
	return n;
}

/* Control thread: validate, copy, hand to the repair thread. Never blocks. (A
 * payload too short for a header is a liveness probe: no answer, see
 * peer_gone().) */
void r2cc_wire_on_msg(void *arg, int from_rank, const void *payload, size_t len,
		      struct r2cc_ctl_call *call)
{
	(void)arg;
	struct rep_hdr h;
	if (len < sizeof(h))
		return;
	memcpy(&h, payload, sizeof(h));
	int n = le16toh(h.n);
	size_t body = sizeof(h) + (size_t)n * sizeof(struct rep_wire);
	if (n == 0 || n > WIRE_MAX_ENTRIES || len < body)
		return;
	struct inbox *in = malloc(sizeof(*in) + (len - sizeof(h)));
	if (!in)
		return;
	if (r2cc_repair_wire_parse(payload, len, in->m, n) != n) {
		free(in);
		return;
	}
	in->n = n;
	in->nmaps = h.nmaps;
	in->maps = (const unsigned char *)(in->m + n);
	memcpy(in->m + n, (const unsigned char *)payload + body, len - body);
	in->ncts = (int)le32toh(h.ncts);
	in->cts = (const struct rep_cts *)(in->maps + wire_maps_len(in->maps, len - body, h.nmaps));
	memset(in->map_ok, 0, sizeof(in->map_ok));
	in->job_id = call->job_id;
	in->from_rank = from_rank;
	in->next = NULL;
	pthread_mutex_lock(&r2cc_eng.mu);
	*r2cc_eng.in_tail = in;
	r2cc_eng.in_tail = &in->next;
	pthread_cond_signal(&r2cc_eng.cond);
	pthread_mutex_unlock(&r2cc_eng.mu);
}
