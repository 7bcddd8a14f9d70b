/*
 * Control-plane framing and authentication (internal to ctl/ctl*.c).
 *
 * A frame is a 64-byte header, the payload, and a 32-byte HMAC-SHA256 tag over
 * header and payload keyed by the job secret. All integers are big-endian.
 *
 *   off size field
 *     0  4   magic "R2CC" (0x52324343)
 *     4  1   version (1)
 *     5  1   flags: 1 request, 2 reply, 4 error reply
 *     6  2   type
 *     8  4   payload length (<= R2CC_CTL_MAX_PAYLOAD)
 *    12  4   request id (pairs a reply with its request; 0 otherwise)
 *    16  8   job id
 *    24  8   sender id: random per sending stream (connection direction)
 *    32  8   sequence number: 1, 2, ... per sender id
 *    40  8   timestamp, ns since the epoch (CLOCK_REALTIME)
 *    48  4   from rank (-1: none)
 *    52  4   to rank (-1: none)
 *    56  8   reserved, zero
 *
 * Receiving is a pipeline whose every stage names its drop reason: header
 * (bad_header, bad_length) before any payload byte is buffered, then key
 * lookup (unknown_job), tag (bad_tag), timestamp window (stale), per-sender
 * sequence (replay); type and payload checks belong to the dispatcher.
 */
#ifndef R2CC_REPAIR_CTL_MSG_H
#define R2CC_REPAIR_CTL_MSG_H

#include "ctl/ctl.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define R2CC_CTL_MAGIC	  0x52324343u
#define R2CC_CTL_VERSION  1
#define R2CC_CTL_HDR_SIZE 64
#define R2CC_CTL_TAG_SIZE 32

#define R2CC_CTL_F_REQUEST 0x1
#define R2CC_CTL_F_REPLY   0x2
#define R2CC_CTL_F_ERROR   0x4
#define R2CC_CTL_F_ALL	   0x7

/* Accepted clock difference between sender and receiver. */
#define R2CC_CTL_STALE_NS (300LL * 1000000000LL)

struct r2cc_ctl_hdr {
	uint32_t magic;
	uint8_t version;
	uint8_t flags;
	uint16_t type;
	uint32_t len;
	uint32_t req_id;
	uint64_t job_id;
	uint64_t sender;
	uint64_t seq;
	int64_t ts_ns;
	int32_t from_rank;
	int32_t to_rank;
};

static inline size_t r2cc_ctl_frame_size(size_t len)
{
	return R2CC_CTL_HDR_SIZE + len + R2CC_CTL_TAG_SIZE;
}

int64_t r2cc_ctl_now_ns(void);
/* getrandom(2), all or nothing. */
int r2cc_ctl_random(void *buf, size_t len);

void r2cc_ctl_hdr_encode(const struct r2cc_ctl_hdr *h, unsigned char out[R2CC_CTL_HDR_SIZE]);
/* Returns R2CC_CTL_DROP_NONE, _BAD_HEADER or _BAD_LENGTH (len > max_payload). */
int r2cc_ctl_hdr_decode(const unsigned char in[R2CC_CTL_HDR_SIZE], size_t max_payload,
			struct r2cc_ctl_hdr *h);

/* Writes header (h->len must equal len), payload and tag into out, which holds
 * r2cc_ctl_frame_size(len) bytes. */
int r2cc_ctl_frame_seal(const unsigned char key[R2CC_CTL_SECRET_SIZE], const struct r2cc_ctl_hdr *h,
			const void *payload, size_t len, unsigned char *out);
/* Tag and timestamp of a whole frame whose header decoded as h: returns
 * R2CC_CTL_DROP_NONE, _BAD_TAG or _STALE. */
int r2cc_ctl_frame_verify(const unsigned char key[R2CC_CTL_SECRET_SIZE],
			  const struct r2cc_ctl_hdr *h, const unsigned char *frame, int64_t now_ns);

/*
 * Per-sender replay filter: remembers the highest sequence number seen per
 * (job, sender), up to cap senders (the least recently used is forgotten
 * first; by then its frames are stale anyway in practice).
 */
struct r2cc_ctl_replay;
struct r2cc_ctl_replay *r2cc_ctl_replay_new(size_t cap);
void r2cc_ctl_replay_free(struct r2cc_ctl_replay *r);
/* R2CC_CTL_DROP_NONE (and records seq) or R2CC_CTL_DROP_REPLAY. */
int r2cc_ctl_replay_check(struct r2cc_ctl_replay *r, uint64_t job_id, uint64_t sender,
			  uint64_t seq);

/*
 * Incremental frame assembly for one connection. r2cc_ctl_rx_space() says
 * where the next bytes go and how many belong to the current frame (never
 * more: a read never spans two frames); r2cc_ctl_rx_advance() takes them.
 */
struct r2cc_ctl_rx {
	unsigned char hdr_buf[R2CC_CTL_HDR_SIZE];
	struct r2cc_ctl_hdr hdr;
	unsigned char *frame; /* header + payload + tag once the header is valid */
	size_t have;	      /* bytes of the current frame received */
	size_t max_payload;
};

void r2cc_ctl_rx_init(struct r2cc_ctl_rx *rx, size_t max_payload);
void r2cc_ctl_rx_reset(struct r2cc_ctl_rx *rx);
void r2cc_ctl_rx_space(const struct r2cc_ctl_rx *rx, unsigned char **where, size_t *n);
/* 0: need more; 1: a whole frame is in rx->frame (call r2cc_ctl_rx_reset()
 * when done with it); -1: the stream cannot go on (close it), *drop says why
 * (R2CC_CTL_DROP_NONE: out of memory). */
int r2cc_ctl_rx_advance(struct r2cc_ctl_rx *rx, size_t n, int *drop);
static inline bool r2cc_ctl_rx_partial(const struct r2cc_ctl_rx *rx)
{
	return rx->have > 0;
}

#endif
