/*
 * Key translation for hot repair (docs/architecture.md, Hot repair, step 6): a mirror of
 * every memory region NCCL registers, on every other NIC the process has
 * opened, and the peer's rkey map fetched over the control plane.
 *
 * Local side. When NCCL registers [addr, addr+len) on NIC A, the verbs
 * wrapper calls r2cc_mr_mirror_reg() while the registration is happening
 * (a dma-buf fd may be closed right after), and the same range is registered
 * with the same access on every other NIC in a protection domain of R2CC's
 * own (one per NIC, allocated through the real ibv_alloc_pd on a context
 * NCCL opened). The original and its mirrors form a group; a key on one NIC
 * translates to the key on another through the group. A mirror that cannot
 * be made (resource limits, no PD) is logged once and that range stays
 * unmirrored on that NIC: migrating a QP that uses it then fails cleanly
 * with -ENOENT. NCCL's registration never fails because of a mirror.
 * QPs that use mirror keys must be created in r2cc_mr_mirror_pd(nic).
 *
 * Remote side. r2cc_mr_mirror_serve() answers R2CC_MR_MIRROR_MSG requests
 * ("the rkey map of your NIC N to your NIC M"); r2cc_mr_mirror_remote_rkey()
 * asks a peer once per (peer, N, M) and caches the map. Each map carries the
 * peer's epoch (random per process) and generation (bumped on every
 * registration and deregistration there); an rkey missing from the cache
 * revalidates with them (an unchanged peer answers with a few bytes), and
 * r2cc_mr_mirror_remote_refresh() revalidates on demand. Hot repair does not
 * wait for a fetch: each side's exchange message carries its own map for the
 * NIC pair the QPs move between (r2cc_mr_mirror_map_encode(), stored by the
 * receiver with r2cc_mr_mirror_remote_store()), made when the message is, so a
 * peer's re-registration before a migration is never served from a stale map;
 * one after it misses the cache and is fetched.
 *
 * Wire format (big-endian), message type R2CC_MR_MIRROR_MSG:
 *   request  u8 version (1), u8 op (1 = map), u16 zero,
 *            u8 n, n bytes NIC name N, u8 m, m bytes NIC name M  (1..63 each),
 *            u64 epoch, u64 generation the requester holds (0, 0: none)
 *   reply    u8 version, u8 kind (0 = full map, 1 = unchanged), u16 zero,
 *            u64 epoch, u64 generation, u32 count,
 *            count x {u32 rkey on N, u32 rkey on M, u64 addr, u64 len}
 * Anything else is malformed: counted and answered with -EPROTO (the control
 * plane itself drops and counts what is not authenticated). Unknown NIC
 * names are answered with -ENODEV.
 *
 * Lock order: mirror lock, then the registry's locks; the mirror lock is
 * never held across a control-plane call.
 *
 * Off unless R2CC_MR_MIRROR=1: mirroring doubles MR registrations and only
 * pays off when hot repair is on.
 */
#ifndef R2CC_REPAIR_MR_MIRROR_H
#define R2CC_REPAIR_MR_MIRROR_H

#include "ctl/ctl.h"
#include "shim/registry.h"

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Control-plane message type of the rkey-map service (>= R2CC_CTL_TYPE_USER). */
#define R2CC_MR_MIRROR_MSG     32
#define R2CC_MR_MIRROR_VERSION 1
#define R2CC_MR_MIRROR_OP_MAP  1
#define R2CC_MR_MIRROR_FULL    0
#define R2CC_MR_MIRROR_SAME    1
#define R2CC_MR_MIRROR_REQ_MAX (4 + 2 * 64 + 16)
#define R2CC_MR_MIRROR_ENTRY   24

/* The real verbs functions the mirror calls (intercept/verbs.c fills them;
 * unit tests hand in doubles). reg_mr_iova2 and reg_dmabuf_mr may be NULL. */
struct r2cc_mr_mirror_verbs {
	struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
	int (*dealloc_pd)(struct ibv_pd *pd);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
	struct ibv_mr *(*reg_mr_iova2)(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				       unsigned int access);
	struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t len,
					uint64_t iova, int fd, int access);
	int (*dereg_mr)(struct ibv_mr *mr);
};

/* What NCCL registered, as the wrapper saw it. */
enum r2cc_mr_mirror_kind { R2CC_MR_VA, R2CC_MR_IOVA, R2CC_MR_DMABUF };
struct r2cc_mr_mirror_src {
	int kind;      /* enum r2cc_mr_mirror_kind */
	void *addr;    /* VA, IOVA */
	uint64_t iova; /* IOVA, DMABUF: the address remote peers use */
	uint64_t offset;
	int fd; /* DMABUF */
	size_t len;
	int access;
};

struct r2cc_mr_mirror_stats {
	uint64_t groups;       /* registrations of NCCL's being mirrored now */
	uint64_t mirrors;      /* mirror MRs registered now */
	uint64_t mirror_fail;  /* mirrors that could not be made */
	uint64_t served;       /* map requests answered */
	uint64_t bad_requests; /* malformed requests (answered -EPROTO) */
	uint64_t fetches;      /* map requests sent */
	uint64_t cache_hits;
	uint64_t pushed;   /* maps encoded for hot repair's messages */
	uint64_t received; /* maps a peer's hot-repair message carried, stored */
	uint64_t generation;
};

/* R2CC_MR_MIRROR=1 and the library active. */
bool r2cc_mr_mirror_enabled(void);

/* Hooks of the verbs wrappers (each a no-op unless enabled). */
void r2cc_mr_mirror_ctx_opened(struct ibv_context *ctx, struct r2cc_nic *nic,
			       const struct r2cc_mr_mirror_verbs *verbs);
void r2cc_mr_mirror_ctx_closing(struct ibv_context *ctx);
void r2cc_mr_mirror_pd_allocated(struct ibv_context *ctx);
void r2cc_mr_mirror_reg(struct ibv_pd *pd, struct ibv_mr *mr, const struct r2cc_mr_mirror_src *src);
/* Before the provider's dereg: the mirrors go. Returns true when mr was a virtual
 * registration (below): the provider must not see it, and the caller frees it. */
bool r2cc_mr_mirror_dereg(struct ibv_mr *mr);
/* A registration NCCL asked of a dead device (r2cc_repair_reg_refused said so):
 * made on every other NIC, behind a stand-in ibv_mr of pd whose keys exist only in
 * R2CC's indices, where NCCL's QPs on that NIC (virtual once it failed) and the
 * peers (through the rkey map) translate them. NULL when no other NIC took it. */
struct ibv_mr *r2cc_mr_mirror_reg_virtual(struct ibv_pd *pd, const struct r2cc_mr_mirror_src *src);

/* Local translation: the key on `to` of the registration whose lkey on `from`
 * is lkey (from == to: lkey itself). 0, -ENOENT (unknown key, or no mirror on
 * `to`), -EINVAL. */
int r2cc_mr_mirror_lkey(const struct r2cc_nic *from, uint32_t lkey, const struct r2cc_nic *to,
			uint32_t *out);
/* Same for a local rkey (what a peer would be told). */
int r2cc_mr_mirror_rkey(const struct r2cc_nic *from, uint32_t rkey, const struct r2cc_nic *to,
			uint32_t *out);
/* R2CC's PD on nic (QPs using mirror keys live there), or NULL. */
struct ibv_pd *r2cc_mr_mirror_pd(const struct r2cc_nic *nic);

/* Remote translation. Register the service handler (idempotent). */
int r2cc_mr_mirror_serve(void);
/* The peer's rkey on its NIC to_nic for its rkey on from_nic, for a request on
 * [addr, addr + len) of it (the registration must cover that range: a recycled
 * key of another registration is a miss). 0, -ENOENT (no such rkey or range, or
 * not mirrored there), -ENODEV (no such NIC there), a control
 * plane error (-ETIMEDOUT, -ECONNREFUSED, -EOPNOTSUPP: the peer does not
 * mirror), -EPROTO (malformed reply), -EINVAL. timeout_ms <= 0: from the cache
 * only, never the network: -EAGAIN when it is not there (the caller fetches with
 * r2cc_mr_mirror_remote_refresh() where it may wait). */
int r2cc_mr_mirror_remote_rkey(const struct r2cc_ctl_dir *dir, int peer_rank, const char *from_nic,
			       uint32_t rkey, uint64_t addr, uint64_t len, const char *to_nic,
			       uint32_t *out, int timeout_ms);
/* Revalidate (or fetch) the cached map of one peer and NIC pair. */
int r2cc_mr_mirror_remote_refresh(const struct r2cc_ctl_dir *dir, int peer_rank,
				  const char *from_nic, const char *to_nic, int timeout_ms);
/* This process's full map from its NIC from_nic to its NIC to_nic, encoded as
 * a reply (*out malloc'd, *len bytes), for a peer that will need it: hot repair
 * sends it with its exchange messages. 0, -ENODEV, -E2BIG (beyond a message),
 * -ENOMEM. */
int r2cc_mr_mirror_map_encode(const char *from_nic, const char *to_nic, unsigned char **out,
			      size_t *len);
/* A peer's full map (as encoded above) that came with one of its messages:
 * cached as if fetched, unless the cache holds a later generation of the same
 * epoch. 0, -EPROTO (malformed, or not a full map), -ENOMEM, -EINVAL. */
int r2cc_mr_mirror_remote_store(const struct r2cc_ctl_dir *dir, int peer_rank, const char *from_nic,
				const char *to_nic, const void *map, size_t len);
/* Forget cached maps of a job's peer (peer_rank < 0: every peer of the job). */
void r2cc_mr_mirror_remote_forget(uint64_t job_id, int peer_rank);

void r2cc_mr_mirror_get_stats(struct r2cc_mr_mirror_stats *out);

/* --- the pieces below are exposed for the unit tests ----------------------- */

struct r2cc_mr_mirror_req {
	char from[64], to[64];
	uint64_t epoch, gen;
};
struct r2cc_mr_mirror_entry {
	uint32_t rkey_from, rkey_to;
	uint64_t addr, len;
};
struct r2cc_mr_mirror_map {
	int kind; /* R2CC_MR_MIRROR_FULL / _SAME */
	uint64_t epoch, gen;
	uint32_t count;
	struct r2cc_mr_mirror_entry *e; /* sorted by rkey_from; malloc'd */
};

/* Returns the encoded length or -EINVAL. */
int r2cc_mr_mirror_req_encode(const struct r2cc_mr_mirror_req *r, unsigned char *out, size_t cap);
/* 0 or -EPROTO. */
int r2cc_mr_mirror_req_decode(const void *in, size_t len, struct r2cc_mr_mirror_req *r);
/* Answer a request as the handler would: *reply_p malloc'd. 0 or a negative
 * status to reply with. */
int r2cc_mr_mirror_answer(const void *req, size_t len, unsigned char **reply_p, size_t *reply_len);
/* 0 or -EPROTO / -ENOMEM; m->e malloc'd (free with r2cc_mr_mirror_map_free). */
int r2cc_mr_mirror_map_decode(const void *in, size_t len, struct r2cc_mr_mirror_map *m);
void r2cc_mr_mirror_map_free(struct r2cc_mr_mirror_map *m);

/* Tests: replace how maps are fetched (NULL: the control plane). */
typedef int (*r2cc_mr_mirror_fetch_fn)(const struct r2cc_ctl_dir *dir, int peer_rank,
				       const void *req, size_t len, void *reply, size_t *reply_len,
				       int timeout_ms);
void r2cc_mr_mirror_set_fetch(r2cc_mr_mirror_fetch_fn fn);
/* Tests: turn mirroring on or off without the environment. */
void r2cc_mr_mirror_force(bool on);

#endif
