/*
 * The process at the other end of each of NCCL's queue pairs, found before
 * anything fails, so that a repair asks exactly that process and nobody else.
 *
 * A connection's two ends name each other in their RTR attributes: the peer's
 * QP number and its port's LID (InfiniBand without a GRH) or GID (RoCE, or
 * InfiniBand with a GRH). That identity (struct r2cc_peer_ep) is exact: on
 * RoCE every LID is 0 and QP numbers repeat across devices, but a GID and a QP
 * number name one queue pair. What RTR does not say is which process, which
 * rank, owns it. So when a QP reaches RTS:
 *
 *  1. this process reports the NIC address of its own end (its LID or GID) to
 *     the rendezvous of every job it is in (r2cc_ctl_dir_report_nics), once per
 *     address: the rendezvous' index then lists the ranks that use that NIC,
 *     a few per node;
 *  2. it asks the rendezvous for the owners of the peer's NIC address
 *     (r2cc_ctl_dir_owners), and
 *  3. asks those owners, all at once and in one message each, whether the
 *     exact pair (this end, the peer's end) is theirs (PAIR). The one that
 *     has a queue pair with the peer's identity whose own peer is this end
 *     says so, and records this rank as its own QP's peer at the same time.
 *
 * No candidate list and no cap: what a process learns is O(its peers), and
 * what it asks is O(the owners of its peers' NICs). Whichever side gets to
 * step 3 first pairs both (NCCL's accept side reaches RTS before the connect
 * side has reported anything, and is then paired by the connect side). A
 * search that finds nothing is retried with backoff for a minute and at once
 * when a repair needs it (r2cc_peer_hurry()).
 *
 * One thread ("r2cc-peer") does the asking; the PAIR handler runs on the
 * control thread. Lock: peer.mu, taken by neither while it waits on the
 * network; it is a leaf lock (the notify hook runs without it).
 */
#ifndef R2CC_REPAIR_PEER_H
#define R2CC_REPAIR_PEER_H

#include "ctl/ctl.h"
#include "shim/registry.h"

#include <stdbool.h>
#include <stdint.h>

#define R2CC_PEER_MSG 41 /* control-plane message type of the PAIR exchange */

/* One end of an RC connection as the other end names it. */
struct r2cc_peer_ep {
	uint8_t gid[16]; /* global: the GID; else zero */
	uint16_t lid;	 /* not global: the LID */
	uint8_t global;	 /* 1: named by GID (a GRH), 0: by LID */
	uint32_t qpn;
};

#define R2CC_PEER_EP_WIRE 23 /* gid 16, lid u16, global u8, qpn u32 (big-endian) */

void r2cc_peer_ep_local(const struct r2cc_qp *q, struct r2cc_peer_ep *ep);
void r2cc_peer_ep_remote(const struct r2cc_qp *q, struct r2cc_peer_ep *ep);
bool r2cc_peer_ep_equal(const struct r2cc_peer_ep *a, const struct r2cc_peer_ep *b);
/* A total order on identities (the tie-break of a repair both ends start). */
int r2cc_peer_ep_cmp(const struct r2cc_peer_ep *a, const struct r2cc_peer_ep *b);
void r2cc_peer_ep_put(const struct r2cc_peer_ep *ep, uint8_t out[R2CC_PEER_EP_WIRE]);
void r2cc_peer_ep_get(const uint8_t in[R2CC_PEER_EP_WIRE], struct r2cc_peer_ep *ep);
/* "lid 7 qpn 0x1c" / "gid fe80::...:1 qpn 0x1c" */
const char *r2cc_peer_ep_str(const struct r2cc_peer_ep *ep, char *buf, size_t len);

/* A job this process is in: peers are searched and reached through it. The
 * directory must stay valid until r2cc_peer_remove_dir() returned. */
void r2cc_peer_add_dir(const struct r2cc_ctl_dir *dir);
/* Forgets dir: peers found through it are searched again through the other
 * jobs; waits while the search thread uses it. */
void r2cc_peer_remove_dir(const struct r2cc_ctl_dir *dir);

/*
 * Track a connection: local and remote as in its RTR, on the NIC described by
 * nic (name, LID, port, state, speed; its gid is this end's GID when global).
 * cookie comes back from r2cc_peer_find() (the repair engine's record). The
 * search starts in the background. -ENOMEM, or -EEXIST when local is tracked.
 */
int r2cc_peer_track(const struct r2cc_peer_ep *local, const struct r2cc_peer_ep *remote,
		    const struct r2cc_ctl_nic *nic, void *cookie);
/* The same from a QP of the registry at RTS. */
int r2cc_peer_track_qp(const struct r2cc_qp *q, void *cookie);
void r2cc_peer_forget(const struct r2cc_peer_ep *local);

/* The tracked connection with exactly these ends: its cookie, or NULL. */
void *r2cc_peer_find(const struct r2cc_peer_ep *local, const struct r2cc_peer_ep *remote);
/* Its peer's job directory and rank: 0 when known, -EAGAIN while searching,
 * -ENOENT when local is not tracked. */
int r2cc_peer_of(const struct r2cc_peer_ep *local, const struct r2cc_ctl_dir **dir, int *rank);
/* Search now (a repair waits for this peer). */
void r2cc_peer_hurry(const struct r2cc_peer_ep *local);
/* Called without locks (search or control thread) each time a peer is found. */
void r2cc_peer_set_notify(void (*fn)(void *cookie));

struct r2cc_peer_stats {
	uint64_t tracked, found, by_pair_request, lookups, pair_requests, misses;
};
void r2cc_peer_stats(struct r2cc_peer_stats *out);
/* Bytes of the table (what tracking costs this process). */
size_t r2cc_peer_bytes(void);

#endif
