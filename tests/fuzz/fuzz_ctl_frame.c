/*
 * libFuzzer target: control-plane frames as a stranger sends them (before
 * authentication) and as a peer holding the job secret sends them (after).
 *
 * First input byte: 0 = the rest is a raw byte stream, fed to the frame
 * assembler (ctl/ctl_msg.c) in chunks whose sizes come from the input;
 * every whole frame goes through header, tag, clock-window and replay checks.
 * 1 = the rest is a header template and a payload that are sealed with the
 * job key first, so they pass authentication, and then the payload goes to
 * the parsers the control thread applies to authenticated frames: the
 * registration (rank, size, member), an error reply's status, the directory
 * a registration reply carries (ctl/ctl_dir.c).
 */
#include "ctl/ctl.h"
#include "ctl/ctl_msg.h"
#include "ctl/ctl_priv.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const unsigned char key[R2CC_CTL_SECRET_SIZE] = "r2cc fuzz job secret, 32 bytes!";
/* Small enough that announced lengths are exercised on both sides of it. */
#define FUZZ_MAX_PAYLOAD 65536
#define FUZZ_NOW_NS	 1700000000000000000LL

static uint32_t be32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* What the control thread does with an authenticated frame's payload. */
static void parse_authenticated(const struct r2cc_ctl_hdr *h, const unsigned char *p)
{
	struct r2cc_ctl_member m;
	if (h->len >= 8)
		r2cc_ctl_member_decode(p + 8, h->len - 8, &m);
	if ((h->flags & R2CC_CTL_F_ERROR) && h->len == 4)
		(void)be32(p);
	struct r2cc_ctl_job job = {.id = h->job_id};
	memcpy(job.secret, key, sizeof(key));
	struct r2cc_ctl_dir *dir = NULL;
	int self = h->to_rank >= 0 ? h->to_rank : 0;
	if (r2cc_ctl_dir_decode(p, h->len, &job, self, &dir) == 0) {
		int ranks[8];
		for (int n = 0; n < dir->nnodes; n++)
			r2cc_ctl_dir_node_ranks(dir, n, ranks, 8);
		/* Every rank has a node; the members are those of the registrant's
		 * node (the others are looked up later), its own among them. */
		for (int r = 0; r < dir->nranks; r++)
			if (r2cc_ctl_dir_node(dir, r) < 0 ||
			    r2cc_ctl_dir_node(dir, r) >= dir->nnodes)
				abort();
		if (!r2cc_ctl_dir_member(dir, dir->self_rank))
			abort();
		r2cc_ctl_dir_free(dir);
	}
}

/* Feeds stream through one connection's assembler; chunk sizes from sizes. */
static void feed(const unsigned char *stream, size_t len, const unsigned char *sizes, size_t nsizes,
		 struct r2cc_ctl_replay *replay)
{
	struct r2cc_ctl_rx rx;
	r2cc_ctl_rx_init(&rx, FUZZ_MAX_PAYLOAD);
	size_t off = 0, k = 0;
	while (off < len) {
		unsigned char *where;
		size_t want;
		r2cc_ctl_rx_space(&rx, &where, &want);
		size_t n = nsizes ? (size_t)sizes[k++ % nsizes] + 1 : want;
		if (n > want)
			n = want;
		if (n > len - off)
			n = len - off;
		memcpy(where, stream + off, n);
		off += n;
		int drop;
		int rc = r2cc_ctl_rx_advance(&rx, n, &drop);
		if (rc < 0)
			break;
		if (rc == 1) {
			const struct r2cc_ctl_hdr *h = &rx.hdr;
			if (r2cc_ctl_frame_verify(key, h, rx.frame, FUZZ_NOW_NS) ==
				R2CC_CTL_DROP_NONE &&
			    r2cc_ctl_replay_check(replay, h->job_id, h->sender, h->seq) ==
				R2CC_CTL_DROP_NONE)
				parse_authenticated(h, rx.frame + R2CC_CTL_HDR_SIZE);
			r2cc_ctl_rx_reset(&rx);
		}
	}
	r2cc_ctl_rx_reset(&rx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	struct r2cc_ctl_replay *replay = r2cc_ctl_replay_new(4);
	if (!replay)
		return 0;
	int mode = data[0] & 1;
	data++;
	size--;
	if (mode == 0) {
		/* Up to 8 chunk sizes first, then the stream. */
		size_t ns = size ? data[0] % 9 : 0;
		if (size >= 1 + ns)
			feed(data + 1 + ns, size - 1 - ns, data + 1, ns, replay);
	} else if (size >= 14) {
		/* type, flags, from_rank, to_rank, seq byte, then the payload. */
		size_t len = size - 14 > FUZZ_MAX_PAYLOAD ? FUZZ_MAX_PAYLOAD : size - 14;
		struct r2cc_ctl_hdr h = {
		    .magic = R2CC_CTL_MAGIC,
		    .version = R2CC_CTL_VERSION,
		    .type = (uint16_t)(data[0] << 8 | data[1]),
		    .flags = data[2] & R2CC_CTL_F_ALL,
		    .len = (uint32_t)len,
		    .job_id = 42,
		    .sender = 7,
		    .seq = (uint64_t)data[3] + 1,
		    .ts_ns = FUZZ_NOW_NS,
		    .from_rank = (int32_t)be32(data + 4),
		    .to_rank = (int32_t)be32(data + 8),
		};
		unsigned char *frame = malloc(r2cc_ctl_frame_size(len));
		if (frame && r2cc_ctl_frame_seal(key, &h, data + 14, len, frame) == 0)
			feed(frame, r2cc_ctl_frame_size(len), data + 12, 2, replay);
		free(frame);
	}
	r2cc_ctl_replay_free(replay);
	return 0;
}
