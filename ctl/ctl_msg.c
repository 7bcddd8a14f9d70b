/*
 * Control-plane framing and authentication: header encoding, HMAC-SHA256
 * tags (OpenSSL's HMAC(), compared with CRYPTO_memcmp), the per-sender replay
 * filter and incremental frame assembly. No sockets and no global state here,
 * so every drop reason can be tested byte by byte (tests/unit/test_ctl_msg.c).
 */
#include "ctl/ctl_msg.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

int64_t r2cc_ctl_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int r2cc_ctl_random(void *buf, size_t len)
{
	unsigned char *p = buf;
	while (len) {
		ssize_t n = getrandom(p, len, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static void put16(unsigned char *p, uint16_t v)
{
	p[0] = (unsigned char)(v >> 8);
	p[1] = (unsigned char)v;
}

static void put32(unsigned char *p, uint32_t v)
{
	put16(p, (uint16_t)(v >> 16));
	put16(p + 2, (uint16_t)v);
}

static void put64(unsigned char *p, uint64_t v)
{
	put32(p, (uint32_t)(v >> 32));
	put32(p + 4, (uint32_t)v);
}

static uint16_t get16(const unsigned char *p)
{
	return (uint16_t)((p[0] << 8) | p[1]);
}

static uint32_t get32(const unsigned char *p)
{
	return ((uint32_t)get16(p) << 16) | get16(p + 2);
}

static uint64_t get64(const unsigned char *p)
{
	return ((uint64_t)get32(p) << 32) | get32(p + 4);
}

void r2cc_ctl_hdr_encode(const struct r2cc_ctl_hdr *h, unsigned char out[R2CC_CTL_HDR_SIZE])
{
	put32(out, h->magic);
	out[4] = h->version;
	out[5] = h->flags;
	put16(out + 6, h->type);
	put32(out + 8, h->len);
	put32(out + 12, h->req_id);
	put64(out + 16, h->job_id);
	put64(out + 24, h->sender);
	put64(out + 32, h->seq);
	put64(out + 40, (uint64_t)h->ts_ns);
	put32(out + 48, (uint32_t)h->from_rank);
	put32(out + 52, (uint32_t)h->to_rank);
	memset(out + 56, 0, 8);
}

int r2cc_ctl_hdr_decode(const unsigned char in[R2CC_CTL_HDR_SIZE], size_t max_payload,
			struct r2cc_ctl_hdr *h)
{
	h->magic = get32(in);
	h->version = in[4];
	h->flags = in[5];
	h->type = get16(in + 6);
	h->len = get32(in + 8);
	h->req_id = get32(in + 12);
	h->job_id = get64(in + 16);
	h->sender = get64(in + 24);
	h->seq = get64(in + 32);
	h->ts_ns = (int64_t)get64(in + 40);
	h->from_rank = (int32_t)get32(in + 48);
	h->to_rank = (int32_t)get32(in + 52);
	if (h->magic != R2CC_CTL_MAGIC || h->version != R2CC_CTL_VERSION ||
	    (h->flags & ~R2CC_CTL_F_ALL) || get64(in + 56) != 0)
		return R2CC_CTL_DROP_BAD_HEADER;
	if (h->len > max_payload)
		return R2CC_CTL_DROP_BAD_LENGTH;
	return R2CC_CTL_DROP_NONE;
}

static int compute_tag(const unsigned char key[R2CC_CTL_SECRET_SIZE], const unsigned char *data,
		       size_t len, unsigned char tag[R2CC_CTL_TAG_SIZE])
{
	unsigned int tlen = 0;
	if (!HMAC(EVP_sha256(), key, R2CC_CTL_SECRET_SIZE, data, len, tag, &tlen) ||
	    tlen != R2CC_CTL_TAG_SIZE)
		return -EIO;
	return 0;
}

int r2cc_ctl_frame_seal(const unsigned char key[R2CC_CTL_SECRET_SIZE], const struct r2cc_ctl_hdr *h,
			const void *payload, size_t len, unsigned char *out)
{
	if (h->len != len)
		return -EINVAL;
	r2cc_ctl_hdr_encode(h, out);
	if (len)
		memcpy(out + R2CC_CTL_HDR_SIZE, payload, len);
	return compute_tag(key, out, R2CC_CTL_HDR_SIZE + len, out + R2CC_CTL_HDR_SIZE + len);
}

int r2cc_ctl_frame_verify(const unsigned char key[R2CC_CTL_SECRET_SIZE],
			  const struct r2cc_ctl_hdr *h, const unsigned char *frame, int64_t now_ns)
{
	unsigned char tag[R2CC_CTL_TAG_SIZE];
	size_t body = R2CC_CTL_HDR_SIZE + h->len;
	if (compute_tag(key, frame, body, tag) ||
	    CRYPTO_memcmp(tag, frame + body, R2CC_CTL_TAG_SIZE) != 0)
		return R2CC_CTL_DROP_BAD_TAG;
	int64_t skew = now_ns - h->ts_ns;
	if (skew > R2CC_CTL_STALE_NS || skew < -R2CC_CTL_STALE_NS)
		return R2CC_CTL_DROP_STALE;
	return R2CC_CTL_DROP_NONE;
}

/* Replay filter: chained hash table plus a use clock for LRU eviction. */

#define REPLAY_BUCKETS 16384

struct replay_entry {
	uint64_t job_id;
	uint64_t sender;
	uint64_t last_seq;
	uint64_t used;
	struct replay_entry *next;
};

struct r2cc_ctl_replay {
	struct replay_entry *bucket[REPLAY_BUCKETS];
	size_t count;
	size_t cap;
	uint64_t clock;
};

struct r2cc_ctl_replay *r2cc_ctl_replay_new(size_t cap)
{
	struct r2cc_ctl_replay *r = calloc(1, sizeof(*r));
	if (r)
		r->cap = cap ? cap : 1;
	return r;
}

void r2cc_ctl_replay_free(struct r2cc_ctl_replay *r)
{
	if (!r)
		return;
	for (size_t b = 0; b < REPLAY_BUCKETS; b++) {
		while (r->bucket[b]) {
			struct replay_entry *e = r->bucket[b];
			r->bucket[b] = e->next;
			free(e);
		}
	}
	free(r);
}

static size_t replay_hash(uint64_t job_id, uint64_t sender)
{
	uint64_t x = job_id ^ (sender * 0x9e3779b97f4a7c15ull);
	x ^= x >> 29;
	return (size_t)(x % REPLAY_BUCKETS);
}

static void replay_evict_oldest(struct r2cc_ctl_replay *r)
{
	struct replay_entry **oldest = NULL;
	for (size_t b = 0; b < REPLAY_BUCKETS; b++)
		for (struct replay_entry **pp = &r->bucket[b]; *pp; pp = &(*pp)->next)
			if (!oldest || (*pp)->used < (*oldest)->used)
				oldest = pp;
	if (oldest) {
		struct replay_entry *e = *oldest;
		*oldest = e->next;
		free(e);
		r->count--;
	}
}

int r2cc_ctl_replay_check(struct r2cc_ctl_replay *r, uint64_t job_id, uint64_t sender, uint64_t seq)
{
	size_t b = replay_hash(job_id, sender);
	for (struct replay_entry *e = r->bucket[b]; e; e = e->next) {
		if (e->job_id != job_id || e->sender != sender)
			continue;
		if (seq <= e->last_seq)
			return R2CC_CTL_DROP_REPLAY;
		e->last_seq = seq;
		e->used = ++r->clock;
		return R2CC_CTL_DROP_NONE;
	}
	if (seq == 0)
		return R2CC_CTL_DROP_REPLAY;
	if (r->count >= r->cap)
		replay_evict_oldest(r);
	struct replay_entry *e = malloc(sizeof(*e));
	if (!e)
		/* Cannot remember it, so cannot vouch for it. */
		return R2CC_CTL_DROP_REPLAY;
	*e = (struct replay_entry){job_id, sender, seq, ++r->clock, r->bucket[b]};
	r->bucket[b] = e;
	r->count++;
	return R2CC_CTL_DROP_NONE;
}

/* Frame assembly. */

void r2cc_ctl_rx_init(struct r2cc_ctl_rx *rx, size_t max_payload)
{
	memset(rx, 0, sizeof(*rx));
	rx->max_payload = max_payload;
}

void r2cc_ctl_rx_reset(struct r2cc_ctl_rx *rx)
{
	free(rx->frame);
	rx->frame = NULL;
	rx->have = 0;
}

void r2cc_ctl_rx_space(const struct r2cc_ctl_rx *rx, unsigned char **where, size_t *n)
{
	if (rx->have < R2CC_CTL_HDR_SIZE) {
		*where = (unsigned char *)rx->hdr_buf + rx->have;
		*n = R2CC_CTL_HDR_SIZE - rx->have;
	} else {
		*where = rx->frame + rx->have;
		*n = r2cc_ctl_frame_size(rx->hdr.len) - rx->have;
	}
}

int r2cc_ctl_rx_advance(struct r2cc_ctl_rx *rx, size_t n, int *drop)
{
	*drop = R2CC_CTL_DROP_NONE;
	bool in_hdr = rx->have < R2CC_CTL_HDR_SIZE;
	rx->have += n;
	if (in_hdr) {
		if (rx->have < R2CC_CTL_HDR_SIZE)
			return 0;
		/* Nothing past the header is buffered until the header is sane. */
		*drop = r2cc_ctl_hdr_decode(rx->hdr_buf, rx->max_payload, &rx->hdr);
		if (*drop != R2CC_CTL_DROP_NONE)
			return -1;
		rx->frame = malloc(r2cc_ctl_frame_size(rx->hdr.len));
		if (!rx->frame)
			return -1;
		memcpy(rx->frame, rx->hdr_buf, R2CC_CTL_HDR_SIZE);
	}
	return rx->have == r2cc_ctl_frame_size(rx->hdr.len) ? 1 : 0;
}
