/*
 * Control plane, pure parts: framing and authentication (every drop reason
 * the frame layer decides), the replay filter, the unique-id tail,
 * R2CC_OOB_ROOT parsing, NCCL_SOCKET_IFNAME matching and the directory
 * encoding. No sockets, no threads.
 */
#include "ctl/ctl_msg.h"
#include "ctl/ctl_priv.h"

#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static const unsigned char key_a[32] = "0123456789abcdef0123456789abcdef";
static const unsigned char key_b[32] = "0123456789abcdef0123456789abcdeF";

static struct r2cc_ctl_hdr sample_hdr(size_t len)
{
	struct r2cc_ctl_hdr h = {
	    .magic = R2CC_CTL_MAGIC,
	    .version = R2CC_CTL_VERSION,
	    .flags = R2CC_CTL_F_REQUEST,
	    .type = 42,
	    .len = (uint32_t)len,
	    .req_id = 7,
	    .job_id = 0x1122334455667788ull,
	    .sender = 0xabcdefull,
	    .seq = 1,
	    .ts_ns = r2cc_ctl_now_ns(),
	    .from_rank = 3,
	    .to_rank = -1,
	};
	return h;
}

/* Seals a frame into a fresh buffer. */
static unsigned char *make_frame(const unsigned char *key, struct r2cc_ctl_hdr *h,
				 const char *payload, size_t *size)
{
	size_t len = strlen(payload);
	h->len = (uint32_t)len;
	*size = r2cc_ctl_frame_size(len);
	unsigned char *f = malloc(*size);
	cr_assert(f);
	cr_assert_eq(r2cc_ctl_frame_seal(key, h, payload, len, f), 0);
	return f;
}

/* Feeds bytes to an assembler `step` at a time; returns the last advance
 * result and the drop reason. */
static int feed(struct r2cc_ctl_rx *rx, const unsigned char *data, size_t size, size_t step,
		int *drop)
{
	size_t off = 0;
	int rc = 0;
	*drop = R2CC_CTL_DROP_NONE;
	while (off < size) {
		unsigned char *where;
		size_t want;
		r2cc_ctl_rx_space(rx, &where, &want);
		size_t n = want < step ? want : step;
		if (n > size - off)
			n = size - off;
		memcpy(where, data + off, n);
		off += n;
		rc = r2cc_ctl_rx_advance(rx, n, drop);
		if (rc != 0)
			break;
	}
	return rc;
}

/* Assembles and verifies a whole frame with key; returns the drop reason. */
static int receive(const unsigned char *key, const unsigned char *frame, size_t size)
{
	struct r2cc_ctl_rx rx;
	int drop;
	r2cc_ctl_rx_init(&rx, R2CC_CTL_MAX_PAYLOAD);
	int rc = feed(&rx, frame, size, size, &drop);
	if (rc < 0)
		return drop;
	cr_assert_eq(rc, 1);
	drop = r2cc_ctl_frame_verify(key, &rx.hdr, rx.frame, r2cc_ctl_now_ns());
	r2cc_ctl_rx_reset(&rx);
	return drop;
}

Test(ctl_frame, round_trip_in_any_chunking)
{
	struct r2cc_ctl_hdr h = sample_hdr(0);
	size_t size;
	unsigned char *f = make_frame(key_a, &h, "hello, rank 3", &size);
	for (size_t step = 1; step <= size; step = step * 3 + 1) {
		struct r2cc_ctl_rx rx;
		int drop;
		r2cc_ctl_rx_init(&rx, R2CC_CTL_MAX_PAYLOAD);
		cr_assert_eq(feed(&rx, f, size, step, &drop), 1, "step %zu", step);
		cr_assert_eq(rx.hdr.type, 42);
		cr_assert_eq(rx.hdr.len, 13);
		cr_assert_eq(rx.hdr.req_id, 7);
		cr_assert_eq(rx.hdr.job_id, h.job_id);
		cr_assert_eq(rx.hdr.sender, h.sender);
		cr_assert_eq(rx.hdr.seq, 1);
		cr_assert_eq(rx.hdr.ts_ns, h.ts_ns);
		cr_assert_eq(rx.hdr.from_rank, 3);
		cr_assert_eq(rx.hdr.to_rank, -1);
		cr_assert_eq(rx.hdr.flags, R2CC_CTL_F_REQUEST);
		cr_assert_eq(memcmp(rx.frame + R2CC_CTL_HDR_SIZE, "hello, rank 3", 13), 0);
		cr_assert_eq(r2cc_ctl_frame_verify(key_a, &rx.hdr, rx.frame, r2cc_ctl_now_ns()),
			     R2CC_CTL_DROP_NONE);
		r2cc_ctl_rx_reset(&rx);
	}
	free(f);
}

Test(ctl_frame, empty_payload)
{
	struct r2cc_ctl_hdr h = sample_hdr(0);
	size_t size;
	unsigned char *f = make_frame(key_a, &h, "", &size);
	cr_assert_eq(size, R2CC_CTL_HDR_SIZE + R2CC_CTL_TAG_SIZE);
	cr_assert_eq(receive(key_a, f, size), R2CC_CTL_DROP_NONE);
	free(f);
}

Test(ctl_frame, any_flipped_bit_is_caught)
{
	struct r2cc_ctl_hdr h = sample_hdr(0);
	size_t size;
	unsigned char *f = make_frame(key_a, &h, "payload bytes", &size);
	for (size_t i = 0; i < size; i++) {
		if (i >= 8 && i < 12)
			continue; /* length: see the length tests */
		for (int bit = 0; bit < 8; bit += 3) {
			f[i] ^= (unsigned char)(1 << bit);
			int drop = receive(key_a, f, size);
			f[i] ^= (unsigned char)(1 << bit);
			int want;
			if (i < 6 || (i >= 56 && i < 64))
				want =
				    R2CC_CTL_DROP_BAD_HEADER; /* magic, version, flags, reserved */
			else
				want = R2CC_CTL_DROP_BAD_TAG; /* rest of header, payload, tag */
			if (i == 5 && bit == 0)
				want = R2CC_CTL_DROP_BAD_TAG; /* request -> no-flag: still valid
								 bits */
			cr_assert_eq(drop, want, "byte %zu bit %d: %d", i, bit, drop);
		}
	}
	free(f);
}

Test(ctl_frame, wrong_key_is_bad_tag)
{
	struct r2cc_ctl_hdr h = sample_hdr(0);
	size_t size;
	unsigned char *f = make_frame(key_a, &h, "secret stuff", &size);
	cr_assert_eq(receive(key_b, f, size), R2CC_CTL_DROP_BAD_TAG);
	cr_assert_eq(receive(key_a, f, size), R2CC_CTL_DROP_NONE);
	free(f);
}

Test(ctl_frame, bad_magic_and_version)
{
	struct r2cc_ctl_hdr h = sample_hdr(0);
	size_t size;
	h.magic = 0x4e43434c;
	unsigned char *f = make_frame(key_a, &h, "x", &size);
	cr_assert_eq(receive(key_a, f, size), R2CC_CTL_DROP_BAD_HEADER);
	free(f);
	h = sample_hdr(0);
	h.version = 2;
	f = make_frame(key_a, &h, "x", &size);
	cr_assert_eq(receive(key_a, f, size), R2CC_CTL_DROP_BAD_HEADER);
	free(f);
	h = sample_hdr(0);
	h.flags = 0x80;
	f = make_frame(key_a, &h, "x", &size);
	cr_assert_eq(receive(key_a, f, size), R2CC_CTL_DROP_BAD_HEADER);
	free(f);
}

Test(ctl_frame, oversized_length_is_refused_before_buffering)
{
	struct r2cc_ctl_hdr h = sample_hdr(0);
	unsigned char hdr[R2CC_CTL_HDR_SIZE];
	uint32_t lens[] = {R2CC_CTL_MAX_PAYLOAD + 1, 0x7fffffffu, 0xffffffffu};
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		h.len = lens[i];
		r2cc_ctl_hdr_encode(&h, hdr);
		struct r2cc_ctl_rx rx;
		int drop;
		r2cc_ctl_rx_init(&rx, R2CC_CTL_MAX_PAYLOAD);
		cr_assert_eq(feed(&rx, hdr, sizeof(hdr), sizeof(hdr), &drop), -1);
		cr_assert_eq(drop, R2CC_CTL_DROP_BAD_LENGTH);
		cr_assert_null(rx.frame, "nothing allocated for a refused length");
		r2cc_ctl_rx_reset(&rx);
	}
	/* The cap itself is fine. */
	h.len = R2CC_CTL_MAX_PAYLOAD;
	r2cc_ctl_hdr_encode(&h, hdr);
	struct r2cc_ctl_hdr out;
	cr_assert_eq(r2cc_ctl_hdr_decode(hdr, R2CC_CTL_MAX_PAYLOAD, &out), R2CC_CTL_DROP_NONE);
}

Test(ctl_frame, length_mismatch_breaks_the_tag)
{
	/* A frame whose length field was shortened: the tag is then read from the
	 * payload and cannot match. */
	struct r2cc_ctl_hdr h = sample_hdr(0);
	size_t size;
	unsigned char *f = make_frame(key_a, &h, "0123456789012345678901234567890123456789", &size);
	f[11] = (unsigned char)(f[11] - 4);
	cr_assert_eq(receive(key_a, f, size - 4), R2CC_CTL_DROP_BAD_TAG);
	free(f);
}

Test(ctl_frame, truncated_frame_stays_partial)
{
	struct r2cc_ctl_hdr h = sample_hdr(0);
	size_t size;
	unsigned char *f = make_frame(key_a, &h, "twenty bytes of data", &size);
	for (size_t cut = 1; cut < size; cut += 7) {
		struct r2cc_ctl_rx rx;
		int drop;
		r2cc_ctl_rx_init(&rx, R2CC_CTL_MAX_PAYLOAD);
		cr_assert_eq(feed(&rx, f, cut, 5, &drop), 0);
		cr_assert(r2cc_ctl_rx_partial(&rx));
		r2cc_ctl_rx_reset(&rx);
	}
	free(f);
}

Test(ctl_frame, stale_timestamp)
{
	struct r2cc_ctl_hdr h = sample_hdr(0);
	size_t size;
	h.ts_ns -= R2CC_CTL_STALE_NS + 1000000000LL;
	unsigned char *f = make_frame(key_a, &h, "old", &size);
	cr_assert_eq(receive(key_a, f, size), R2CC_CTL_DROP_STALE);
	free(f);
	h = sample_hdr(0);
	h.ts_ns += R2CC_CTL_STALE_NS + 1000000000LL;
	f = make_frame(key_a, &h, "future", &size);
	cr_assert_eq(receive(key_a, f, size), R2CC_CTL_DROP_STALE);
	free(f);
}

Test(ctl_replay, monotonic_per_sender_and_job)
{
	struct r2cc_ctl_replay *r = r2cc_ctl_replay_new(16);
	cr_assert(r);
	cr_assert_eq(r2cc_ctl_replay_check(r, 1, 10, 1), R2CC_CTL_DROP_NONE);
	cr_assert_eq(r2cc_ctl_replay_check(r, 1, 10, 2), R2CC_CTL_DROP_NONE);
	cr_assert_eq(r2cc_ctl_replay_check(r, 1, 10, 2), R2CC_CTL_DROP_REPLAY);
	cr_assert_eq(r2cc_ctl_replay_check(r, 1, 10, 1), R2CC_CTL_DROP_REPLAY);
	cr_assert_eq(r2cc_ctl_replay_check(r, 1, 10, 5), R2CC_CTL_DROP_NONE);
	cr_assert_eq(r2cc_ctl_replay_check(r, 1, 10, 4), R2CC_CTL_DROP_REPLAY);
	cr_assert_eq(r2cc_ctl_replay_check(r, 1, 11, 1), R2CC_CTL_DROP_NONE);
	cr_assert_eq(r2cc_ctl_replay_check(r, 2, 10, 1), R2CC_CTL_DROP_NONE);
	cr_assert_eq(r2cc_ctl_replay_check(r, 3, 10, 0), R2CC_CTL_DROP_REPLAY);
	r2cc_ctl_replay_free(r);
}

Test(ctl_replay, bounded_with_lru_eviction)
{
	struct r2cc_ctl_replay *r = r2cc_ctl_replay_new(4);
	for (uint64_t s = 1; s <= 4; s++)
		cr_assert_eq(r2cc_ctl_replay_check(r, 1, s, 9), R2CC_CTL_DROP_NONE);
	cr_assert_eq(r2cc_ctl_replay_check(r, 1, 1, 10), R2CC_CTL_DROP_NONE); /* 1 is fresh */
	cr_assert_eq(r2cc_ctl_replay_check(r, 1, 5, 1), R2CC_CTL_DROP_NONE);  /* evicts 2 */
	cr_assert_eq(r2cc_ctl_replay_check(r, 1, 1, 10), R2CC_CTL_DROP_REPLAY);
	cr_assert_eq(r2cc_ctl_replay_check(r, 1, 3, 9), R2CC_CTL_DROP_REPLAY);
	for (uint64_t s = 100; s < 10000; s++)
		cr_assert_eq(r2cc_ctl_replay_check(r, 7, s, 1), R2CC_CTL_DROP_NONE);
	r2cc_ctl_replay_free(r);
}

static struct r2cc_ctl_job sample_job(int family)
{
	struct r2cc_ctl_job job;
	memset(&job, 0, sizeof(job));
	for (int i = 0; i < 32; i++)
		job.secret[i] = (unsigned char)(i * 7 + 1);
	if (family == AF_INET) {
		struct sockaddr_in *sin = (struct sockaddr_in *)&job.rdv;
		sin->sin_family = AF_INET;
		sin->sin_port = htons(29500);
		inet_pton(AF_INET, "10.1.2.3", &sin->sin_addr);
	} else {
		struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&job.rdv;
		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = htons(40000);
		inet_pton(AF_INET6, "fd00::1:2", &sin6->sin6_addr);
	}
	cr_assert_eq(r2cc_ctl_job_derive_id(&job), 0);
	return job;
}

Test(ctl_uid, round_trip_v4_v6_leaves_nccl_bytes_alone)
{
	int fams[] = {AF_INET, AF_INET6};
	for (int k = 0; k < 2; k++) {
		struct r2cc_ctl_job job = sample_job(fams[k]), back;
		unsigned char id[128], orig[128];
		for (int i = 0; i < 128; i++)
			id[i] = (unsigned char)(0xa5 ^ i);
		memcpy(orig, id, sizeof(id));
		cr_assert_eq(r2cc_ctl_uid_encode(id, &job), 0);
		cr_assert_eq(memcmp(id, orig, R2CC_CTL_UID_NCCL_USED), 0);
		cr_assert(r2cc_ctl_uid_decode(id, &back));
		cr_assert_eq(back.id, job.id);
		cr_assert_neq(back.id, 0);
		cr_assert_eq(memcmp(back.secret, job.secret, 32), 0);
		cr_assert(r2cc_ctl_addr_equal(&back.rdv, &job.rdv));
	}
}

Test(ctl_uid, random_or_tampered_tail_not_recognised)
{
	unsigned char id[128];
	struct r2cc_ctl_job job;
	memset(id, 0, sizeof(id));
	cr_assert_not(r2cc_ctl_uid_decode(id, &job), "NCCL 2.28 zeroes the tail");
	for (int n = 0; n < 20000; n++) {
		cr_assert_eq(r2cc_ctl_random(id, sizeof(id)), 0);
		cr_assert_not(r2cc_ctl_uid_decode(id, &job));
	}
	/* Marker present, anything else changed: the check value catches it. */
	struct r2cc_ctl_job good = sample_job(AF_INET);
	cr_assert_eq(r2cc_ctl_uid_encode(id, &good), 0);
	for (int i = R2CC_CTL_UID_MARKER_OFF; i < 108; i++) {
		id[i] ^= 0x10;
		cr_assert_not(r2cc_ctl_uid_decode(id, &job), "byte %d", i);
		id[i] ^= 0x10;
	}
	cr_assert(r2cc_ctl_uid_decode(id, &job));
	/* A random tail behind a valid marker. */
	cr_assert_eq(r2cc_ctl_random(id + 48, 80), 0);
	cr_assert_not(r2cc_ctl_uid_decode(id, &job));
}

Test(ctl_uid, different_secrets_different_jobs)
{
	struct r2cc_ctl_job a = sample_job(AF_INET), b = a;
	b.secret[31] ^= 1;
	cr_assert_eq(r2cc_ctl_job_derive_id(&b), 0);
	cr_assert_neq(a.id, b.id);
}

Test(ctl_uid, oob_root_overrides_rendezvous)
{
	setenv("R2CC_OOB_ROOT", "127.0.0.1:4567", 1);
	struct r2cc_ctl_job job = sample_job(AF_INET), back;
	unsigned char id[128] = {0};
	cr_assert_eq(r2cc_ctl_uid_encode(id, &job), 0);
	cr_assert(r2cc_ctl_uid_parse(id, &back));
	char s[64];
	cr_assert_str_eq(r2cc_ctl_addr_str(&back.rdv, s, sizeof(s)), "127.0.0.1:4567");
	cr_assert_eq(back.id, job.id);
}

Test(ctl_uid, parse_without_oob_root_uses_id)
{
	unsetenv("R2CC_OOB_ROOT");
	struct r2cc_ctl_job job = sample_job(AF_INET6), back;
	unsigned char id[128] = {0};
	cr_assert_eq(r2cc_ctl_uid_encode(id, &job), 0);
	cr_assert(r2cc_ctl_uid_parse(id, &back));
	char s[64];
	cr_assert_str_eq(r2cc_ctl_addr_str(&back.rdv, s, sizeof(s)), "[fd00::1:2]:40000");
}

Test(ctl_uid, hostport_parsing)
{
	struct {
		const char *in;
		const char *out; /* NULL: rejected */
	} cases[] = {
	    {"127.0.0.1:1234", "127.0.0.1:1234"},
	    {"[::1]:5000", "[::1]:5000"},
	    {"::1:5001", "[::1]:5001"},
	    {"localhost:80", NULL /* checked below: resolves to loopback */},
	    {"127.0.0.1:65535", "127.0.0.1:65535"},
	    {"127.0.0.1", NULL},
	    {":1234", NULL},
	    {"127.0.0.1:", NULL},
	    {"127.0.0.1:0", NULL},
	    {"127.0.0.1:65536", NULL},
	    {"127.0.0.1:12x", NULL},
	    {"127.0.0.1:-5", NULL},
	    {"[::1:5000", NULL},
	    {"[::1]5000", NULL},
	    {"no-such-host.invalid:1", NULL},
	    {"", NULL},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct sockaddr_storage a;
		char s[64];
		int rc = r2cc_ctl_hostport_parse(cases[i].in, &a);
		if (!strcmp(cases[i].in, "localhost:80")) {
			cr_assert_eq(rc, 0);
			cr_assert_eq(r2cc_ctl_addr_port(&a), 80);
			continue;
		}
		if (cases[i].out) {
			cr_assert_eq(rc, 0, "%s", cases[i].in);
			cr_assert_str_eq(r2cc_ctl_addr_str(&a, s, sizeof(s)), cases[i].out);
		} else {
			cr_assert_eq(rc, -EINVAL, "%s accepted", cases[i].in);
		}
	}
}

Test(ctl_iface, socket_ifname_rules)
{
	cr_assert(r2cc_ctl_ifname_match("eth", "eth0"));
	cr_assert(r2cc_ctl_ifname_match("ib,eth", "eth1"));
	cr_assert_not(r2cc_ctl_ifname_match("ib,eth", "lo"));
	cr_assert_not(r2cc_ctl_ifname_match("^eth", "eth0"));
	cr_assert(r2cc_ctl_ifname_match("^eth,docker", "lo"));
	cr_assert_not(r2cc_ctl_ifname_match("^eth,docker", "docker0"));
	cr_assert(r2cc_ctl_ifname_match("=eth0", "eth0"));
	cr_assert_not(r2cc_ctl_ifname_match("=eth0", "eth01"));
	cr_assert_not(r2cc_ctl_ifname_match("^=eth0", "eth0"));
	cr_assert(r2cc_ctl_ifname_match("^=eth0", "eth01"));
	cr_assert(r2cc_ctl_ifname_match("lo", "lo"));
}

static struct ifaddrs *fake_if(struct ifaddrs *ifa, struct ifaddrs *next, const char *name,
			       int family, const char *ip, unsigned flags,
			       struct sockaddr_storage *store)
{
	memset(ifa, 0, sizeof(*ifa));
	memset(store, 0, sizeof(*store));
	store->ss_family = (sa_family_t)family;
	if (family == AF_INET)
		inet_pton(AF_INET, ip, &((struct sockaddr_in *)store)->sin_addr);
	else
		inet_pton(AF_INET6, ip, &((struct sockaddr_in6 *)store)->sin6_addr);
	ifa->ifa_next = next;
	ifa->ifa_name = (char *)name;
	ifa->ifa_flags = flags;
	ifa->ifa_addr = (struct sockaddr *)store;
	return ifa;
}

Test(ctl_iface, pick)
{
	struct sockaddr_storage st[5], out;
	struct ifaddrs ifs[5];
	char name[IF_NAMESIZE];
	/* Built back to front: lo, eth0 (down), eth1 (v6 link-local, v6 global,
	 * v4). */
	struct ifaddrs *l = fake_if(&ifs[0], NULL, "eth1", AF_INET, "10.0.0.2", IFF_UP, &st[0]);
	l = fake_if(&ifs[1], l, "eth1", AF_INET6, "fd00::2", IFF_UP, &st[1]);
	l = fake_if(&ifs[2], l, "eth1", AF_INET6, "fe80::2", IFF_UP, &st[2]);
	l = fake_if(&ifs[3], l, "eth0", AF_INET, "10.0.0.1", 0, &st[3]);
	l = fake_if(&ifs[4], l, "lo", AF_INET, "127.0.0.1", IFF_UP | IFF_LOOPBACK, &st[4]);
	char s[64];
	cr_assert_eq(r2cc_ctl_iface_pick(l, NULL, &out, name), 0);
	cr_assert_str_eq(name, "eth1");
	cr_assert_str_eq(r2cc_ctl_addr_str(&out, s, sizeof(s)), "10.0.0.2:0");
	cr_assert_eq(r2cc_ctl_iface_pick(l, "lo", &out, name), 0);
	cr_assert_str_eq(r2cc_ctl_addr_str(&out, s, sizeof(s)), "127.0.0.1:0");
	cr_assert_eq(r2cc_ctl_iface_pick(l, "eth0", &out, name), -ENODEV, "eth0 is down");
	cr_assert_eq(r2cc_ctl_iface_pick(l, "^eth", &out, name), 0);
	cr_assert_str_eq(name, "lo");
	/* Without IPv4 on eth1, the global IPv6 address, never the link-local one. */
	struct ifaddrs *v6only = l->ifa_next->ifa_next;
	v6only->ifa_next->ifa_next = NULL;
	cr_assert_eq(r2cc_ctl_iface_pick(v6only, "eth1", &out, name), 0);
	cr_assert_str_eq(r2cc_ctl_addr_str(&out, s, sizeof(s)), "[fd00::2]:0");
	/* Only loopback left: the default falls back to it. */
	l->ifa_next = NULL;
	cr_assert_eq(r2cc_ctl_iface_pick(l, NULL, &out, name), 0);
	cr_assert_str_eq(name, "lo");
}

static void fill_member(struct r2cc_ctl_member *m, const char *host, const char *key, int pid,
			int nnics)
{
	memset(m, 0, sizeof(*m));
	strcpy(m->host, host);
	strcpy(m->node_key, key);
	m->pid = pid;
	m->nnics = nnics;
	for (int i = 0; i < nnics; i++) {
		snprintf(m->nics[i].name, sizeof(m->nics[i].name), "mlx5_%d", i);
		m->nics[i].lid = (uint16_t)(100 + i);
		m->nics[i].port = 1;
		m->nics[i].state = 4;
		m->nics[i].speed_gbps = 400;
		memset(m->nics[i].gid, i + 1, 16);
	}
	struct sockaddr_in *sin = (struct sockaddr_in *)&m->ctl_addr;
	sin->sin_family = AF_INET;
	sin->sin_port = htons((uint16_t)(20000 + pid));
	sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
}

/* The rendezvous' copy of a round of n members whose node keys are keys[i]
 * (member i: host "host<i>", pid 1000 + i, i % 3 + 1 NICs). */
static struct r2cc_ctl_rdir *make_rdir(int n, const char *const *keys)
{
	unsigned char **mem = malloc(sizeof(*mem) * (size_t)n);
	size_t *len = malloc(sizeof(*len) * (size_t)n);
	cr_assert(mem && len);
	for (int i = 0; i < n; i++) {
		struct r2cc_ctl_member m;
		unsigned char buf[R2CC_CTL_MEMBER_MAX_ENC];
		char host[32];
		snprintf(host, sizeof(host), "host%d", i);
		fill_member(&m, host, keys[i], 1000 + i, i % 3 + 1);
		int l = r2cc_ctl_member_encode(&m, buf, sizeof(buf));
		cr_assert_gt(l, 0);
		mem[i] = malloc((size_t)l);
		memcpy(mem[i], buf, (size_t)l);
		len[i] = (size_t)l;
	}
	int err = 0;
	struct r2cc_ctl_rdir *rd = r2cc_ctl_rdir_new(n, 1, mem, len, &err);
	cr_assert_not_null(rd, "rdir: %d", err);
	return rd;
}

/* What rank `self` of the round gets back from its registration. */
static struct r2cc_ctl_dir *dir_of(const struct r2cc_ctl_rdir *rd, int self, size_t *head_len)
{
	struct r2cc_ctl_job job = sample_job(AF_INET);
	unsigned char *head;
	size_t len;
	struct r2cc_ctl_dir *d;
	cr_assert_eq(r2cc_ctl_rdir_head(rd, self, &head, &len), 0);
	cr_assert_eq(r2cc_ctl_dir_decode(head, len, &job, self, &d), 0);
	free(head);
	if (head_len)
		*head_len = len;
	return d;
}

/* A lookup from d answered by rd and taken back into d: the owners of the
 * addresses in owners/nowners (8 per address). */
static int lookup(struct r2cc_ctl_rdir *rd, struct r2cc_ctl_dir *d, const int *ranks, int nr,
		  const struct r2cc_ctl_nicaddr *addrs, int na, int *owners, int *nowners)
{
	unsigned char *req, *reply;
	size_t len, rlen;
	cr_assert_eq(r2cc_ctl_lookup_encode(d, ranks, nr, addrs, na, &req, &len), 0);
	int rc = r2cc_ctl_rdir_lookup(rd, req, len, &reply, &rlen);
	free(req);
	if (rc)
		return rc;
	rc = r2cc_ctl_dir_take_lookup(d, reply, rlen, na, owners, 8, nowners);
	free(reply);
	return rc;
}

static struct r2cc_ctl_nicaddr lid_addr(uint16_t lid)
{
	struct r2cc_ctl_nicaddr a = {.kind = R2CC_CTL_NICADDR_LID};
	a.bytes[0] = (uint8_t)(lid >> 8);
	a.bytes[1] = (uint8_t)lid;
	return a;
}

Test(ctl_dir, member_round_trip)
{
	struct r2cc_ctl_member m, back;
	unsigned char buf[R2CC_CTL_MEMBER_MAX_ENC];
	fill_member(&m, "gpu-node-7", "hostid:abc", 4242, R2CC_CTL_MAX_NICS);
	int len = r2cc_ctl_member_encode(&m, buf, sizeof(buf));
	cr_assert_gt(len, 0);
	cr_assert_eq(r2cc_ctl_member_decode(buf, (size_t)len, &back), 0);
	cr_assert_str_eq(back.host, "gpu-node-7");
	cr_assert_str_eq(back.node_key, "hostid:abc");
	cr_assert_eq(back.pid, 4242);
	cr_assert_eq(back.nnics, R2CC_CTL_MAX_NICS);
	cr_assert_str_eq(back.nics[5].name, "mlx5_5");
	cr_assert_eq(back.nics[5].lid, 105);
	cr_assert_eq(back.nics[5].speed_gbps, 400);
	cr_assert_eq(memcmp(back.nics[5].gid, m.nics[5].gid, 16), 0);
	cr_assert(r2cc_ctl_addr_equal(&back.ctl_addr, &m.ctl_addr));
	m.nnics = R2CC_CTL_MAX_NICS + 1;
	cr_assert_eq(r2cc_ctl_member_encode(&m, buf, sizeof(buf)), -EINVAL);
}

Test(ctl_dir, nodes_in_rank_order)
{
	static const char *const keys[] = {"B", "A", "B", "C", "A", "A"};
	struct r2cc_ctl_rdir *rd = make_rdir(6, keys);
	struct r2cc_ctl_dir *d = dir_of(rd, 4, NULL);
	cr_assert_eq(d->nranks, 6);
	cr_assert_eq(d->self_rank, 4);
	cr_assert_eq(d->nnodes, 3);
	int want[] = {0, 1, 0, 2, 1, 1};
	for (int r = 0; r < 6; r++)
		cr_assert_eq(r2cc_ctl_dir_node(d, r), want[r], "rank %d", r);
	int ranks[8];
	cr_assert_eq(r2cc_ctl_dir_node_ranks(d, 1, ranks, 8), 3);
	cr_assert(ranks[0] == 1 && ranks[1] == 4 && ranks[2] == 5);
	cr_assert_eq(r2cc_ctl_dir_node_ranks(d, 1, ranks, 1), 3);
	cr_assert_eq(r2cc_ctl_dir_node_ranks(d, 3, ranks, 8), -EINVAL);
	cr_assert_eq(r2cc_ctl_dir_node(d, 6), -EINVAL);
	cr_assert_null(r2cc_ctl_dir_member(d, -1));
	/* The registration brings this rank's node only ... */
	cr_assert_str_eq(r2cc_ctl_dir_member(d, 1)->host, "host1");
	cr_assert_eq(r2cc_ctl_dir_member(d, 5)->node, 1);
	cr_assert_null(r2cc_ctl_dir_member(d, 3));
	cr_assert_null(r2cc_ctl_dir_member(d, 0));
	/* ... the others come on request, once. */
	int three = 3;
	cr_assert_eq(lookup(rd, d, &three, 1, NULL, 0, NULL, NULL), 0);
	cr_assert_str_eq(r2cc_ctl_dir_member(d, 3)->host, "host3");
	cr_assert_eq(r2cc_ctl_dir_member(d, 3)->nnics, 1);
	cr_assert_eq(r2cc_ctl_dir_member(d, 3)->node, 2);
	cr_assert_null(r2cc_ctl_dir_member(d, 0));
	struct r2cc_ctl_dir *d2 = dir_of(rd, 0, NULL);
	cr_assert_eq(memcmp(d->digest, d2->digest, 32), 0, "same round, same digest");
	cr_assert_str_eq(r2cc_ctl_dir_member(d2, 2)->host, "host2");
	r2cc_ctl_dir_free(d);
	r2cc_ctl_dir_free(d2);
	r2cc_ctl_rdir_free(rd);
}

/* Node layouts of large jobs travel in a few runs, whatever the size. */
static void check_layout(int n, int (*node_of)(int rank, int n), int max_head)
{
	const char **keys = malloc(sizeof(*keys) * (size_t)n);
	char(*names)[16] = malloc(16 * (size_t)n);
	cr_assert(keys && names);
	for (int r = 0; r < n; r++) {
		snprintf(names[r], 16, "k%d", node_of(r, n));
		keys[r] = names[r];
	}
	struct r2cc_ctl_rdir *rd = make_rdir(n, keys);
	size_t head;
	struct r2cc_ctl_dir *d = dir_of(rd, n / 2, &head);
	cr_assert_leq(head, (size_t)max_head, "head of %zu bytes", head);
	/* The numbering is by first appearance; check it against the keys. */
	int *seen = calloc((size_t)n, sizeof(int)), next = 0;
	for (int r = 0; r < n; r++) {
		int k = node_of(r, n);
		if (!seen[k])
			seen[k] = ++next;
		cr_assert_eq(r2cc_ctl_dir_node(d, r), seen[k] - 1, "rank %d", r);
	}
	cr_assert_eq(d->nnodes, next);
	int *ranks = malloc(sizeof(int) * (size_t)n), total = 0;
	for (int k = 0; k < d->nnodes; k++) {
		int m = r2cc_ctl_dir_node_ranks(d, k, ranks, n);
		for (int i = 0; i < m; i++) {
			cr_assert_eq(r2cc_ctl_dir_node(d, ranks[i]), k);
			cr_assert(i == 0 || ranks[i] > ranks[i - 1]);
		}
		total += m;
	}
	cr_assert_eq(total, n);
	free(ranks);
	free(seen);
	r2cc_ctl_dir_free(d);
	r2cc_ctl_rdir_free(rd);
	free(names);
	free(keys);
}

static int blocks_of_8(int r, int n)
{
	return r / 8;
}

static int dealt_over_512(int r, int n)
{
	return r % 512;
}

static int irregular(int r, int n)
{
	return r < 100 ? 0 : r < 107 ? 1 : (r * 7919) % 13 + 2;
}

Test(ctl_dir, large_layouts_in_few_runs)
{
	/* 8 members of one node (at most 140 bytes each here) and one run. */
	check_layout(8192, blocks_of_8, 8 * 140 + 100);
	/* One run per round of the deal: 16 rounds, 16 members. */
	check_layout(8192, dealt_over_512, 16 * 12 + 16 * 140 + 100);
	check_layout(1000, irregular, 1000 * 12 + 1000 * 100);
}

Test(ctl_dir, nics_reported_then_found)
{
	static const char *const keys[] = {"n0", "n0", "n1", "n1"};
	struct r2cc_ctl_rdir *rd = make_rdir(4, keys);
	struct r2cc_ctl_dir *d0 = dir_of(rd, 0, NULL), *d2 = dir_of(rd, 2, NULL),
			    *d3 = dir_of(rd, 3, NULL);
	/* Rank 2 uses an IB NIC (LID 700) and a RoCE one (LID 0, a GID). */
	struct r2cc_ctl_nic nics[2];
	memset(nics, 0, sizeof(nics));
	strcpy(nics[0].name, "ib0");
	nics[0].lid = 700;
	strcpy(nics[1].name, "roce0");
	memset(nics[1].gid, 0xab, 16);
	unsigned char *req;
	size_t len;
	cr_assert_eq(r2cc_ctl_nics_encode(d2, nics, 2, &req, &len), 0);
	cr_assert_eq(r2cc_ctl_rdir_nics(rd, 3, req, len), -EPERM, "a rank speaks for itself");
	cr_assert_eq(r2cc_ctl_rdir_nics(rd, 2, req, len), 0);
	cr_assert_eq(r2cc_ctl_rdir_nics(rd, 2, req, len), 0, "again: no change");
	free(req);
	/* Rank 3, on the same node, uses ib0 as well. */
	cr_assert_eq(r2cc_ctl_nics_encode(d3, nics, 1, &req, &len), 0);
	cr_assert_eq(r2cc_ctl_rdir_nics(rd, 3, req, len), 0);
	free(req);
	struct r2cc_ctl_nicaddr a[3] = {
	    lid_addr(700), {.kind = R2CC_CTL_NICADDR_GID}, lid_addr(701)};
	memset(a[1].bytes, 0xab, 16);
	int owners[24], nowners[3];
	cr_assert_eq(lookup(rd, d0, NULL, 0, a, 3, owners, nowners), 0);
	cr_assert_eq(nowners[0], 2);
	cr_assert(owners[0] == 2 && owners[1] == 3);
	cr_assert_eq(nowners[1], 1);
	cr_assert_eq(owners[8], 2);
	cr_assert_eq(nowners[2], 0);
	/* The owners' members came with the answer, NICs included. */
	const struct r2cc_ctl_member *m2 = r2cc_ctl_dir_member(d0, 2);
	cr_assert_not_null(m2);
	cr_assert_eq(m2->nnics, 3 + 2, "registered NICs, then the two reported");
	cr_assert_str_eq(m2->nics[3].name, "ib0");
	cr_assert_eq(m2->nics[4].gid[7], 0xab);
	cr_assert_not_null(r2cc_ctl_dir_member(d0, 3));
	/* Another round's lookup is refused. */
	unsigned char bad[12] = {0, 0, 0, 9};
	unsigned char *out;
	size_t olen;
	cr_assert_eq(r2cc_ctl_rdir_lookup(rd, bad, sizeof(bad), &out, &olen), -ENOENT);
	cr_assert(!r2cc_ctl_rdir_leave(rd, 0));
	cr_assert(!r2cc_ctl_rdir_leave(rd, 0));
	cr_assert(!r2cc_ctl_rdir_leave(rd, 1));
	cr_assert(!r2cc_ctl_rdir_leave(rd, 2));
	cr_assert(r2cc_ctl_rdir_leave(rd, 3), "the last one out");
	r2cc_ctl_dir_free(d0);
	r2cc_ctl_dir_free(d2);
	r2cc_ctl_dir_free(d3);
	r2cc_ctl_rdir_free(rd);
}

Test(ctl_dir, malformed_blobs_rejected)
{
	static const char *const keys[] = {"n0", "n1", "n0"};
	struct r2cc_ctl_rdir *rd = make_rdir(3, keys);
	struct r2cc_ctl_job job = sample_job(AF_INET);
	unsigned char *blob;
	size_t len;
	struct r2cc_ctl_dir *d;
	cr_assert_eq(r2cc_ctl_rdir_head(rd, 0, &blob, &len), 0);
	for (size_t cut = 0; cut < len; cut++)
		cr_assert_eq(r2cc_ctl_dir_decode(blob, cut, &job, 0, &d), -EPROTO, "cut %zu", cut);
	unsigned char *longer = malloc(len + 1);
	memcpy(longer, blob, len);
	longer[len] = 0;
	cr_assert_eq(r2cc_ctl_dir_decode(longer, len + 1, &job, 0, &d), -EPROTO);
	free(longer);
	cr_assert_eq(r2cc_ctl_dir_decode(blob, len, &job, 3, &d), -EPROTO, "self out of range");
	cr_assert_eq(r2cc_ctl_dir_decode(blob, len, &job, 1, &d), -EPROTO,
		     "self must be among the members it brings");
	/* Random garbage never crashes and never passes. */
	for (int n = 0; n < 2000; n++) {
		unsigned char g[512];
		r2cc_ctl_random(g, sizeof(g));
		g[0] = g[1] = g[2] = 0;
		g[3] = (unsigned char)(g[3] % 4 + 1);
		cr_assert_eq(r2cc_ctl_dir_decode(g, sizeof(g), &job, 0, &d), -EPROTO);
	}
	cr_assert_eq(r2cc_ctl_dir_decode(blob, len, &job, 2, &d), 0);
	/* Lookups and their answers are checked as strictly. */
	int one = 1;
	unsigned char *req, *reply;
	size_t rlen, alen;
	cr_assert_eq(r2cc_ctl_lookup_encode(d, &one, 1, NULL, 0, &req, &rlen), 0);
	for (size_t cut = 0; cut < rlen; cut++) {
		unsigned char *out;
		size_t olen;
		int rc = r2cc_ctl_rdir_lookup(rd, req, cut, &out, &olen);
		cr_assert(rc == -EPROTO || rc == -ENOENT, "cut %zu: %d", cut, rc);
	}
	cr_assert_eq(r2cc_ctl_rdir_lookup(rd, req, rlen, &reply, &alen), 0);
	for (size_t cut = 0; cut < alen; cut++)
		cr_assert_eq(r2cc_ctl_dir_take_lookup(d, reply, cut, 0, NULL, 0, NULL), -EPROTO);
	cr_assert_eq(r2cc_ctl_dir_take_lookup(d, reply, alen, 0, NULL, 0, NULL), 0);
	cr_assert_str_eq(r2cc_ctl_dir_member(d, 1)->host, "host1");
	free(req);
	free(reply);
	free(blob);
	r2cc_ctl_dir_free(d);
	r2cc_ctl_rdir_free(rd);
}

/* A blob too short for the ranks it claims is refused before the members are
 * allocated: 65,536 ranks in 4 bytes used to cost 65,536 members (200 MB). Under
 * a 64 MB address-space headroom the old decoder ran out of memory (-ENOMEM). */
Test(ctl_dir, short_blob_claiming_many_ranks_costs_nothing)
{
	long pages = 0, rss;
	FILE *f = fopen("/proc/self/statm", "r");
	cr_assert(f && fscanf(f, "%ld %ld", &pages, &rss) == 2);
	fclose(f);
	struct rlimit rl = {(rlim_t)pages * 4096 + (64u << 20), RLIM_INFINITY};
	cr_assert_eq(setrlimit(RLIMIT_AS, &rl), 0);
	unsigned char blob[4] = {0, 1, 0, 0};
	struct r2cc_ctl_job job = sample_job(AF_INET);
	struct r2cc_ctl_dir *d;
	cr_assert_eq(r2cc_ctl_dir_decode(blob, sizeof(blob), &job, 0, &d), -EPROTO);
}

Test(ctl_dir, split_makes_a_job_of_its_own)
{
	static const char *const keys[] = {"A", "A", "B", "B", "C", "C"};
	struct r2cc_ctl_rdir *rd = make_rdir(6, keys);
	struct r2cc_ctl_dir *parent = dir_of(rd, 0, NULL), *same, *child, *child2, *other;
	/* The parent holds every member here, as after lookups. */
	int all[6] = {0, 1, 2, 3, 4, 5};
	cr_assert_eq(lookup(rd, parent, all, 6, NULL, 0, NULL, NULL), 0);
	cr_assert_eq(r2cc_ctl_dir_derive(parent, all, 6, 0, 1, &same), 0);
	cr_assert_neq(same->job.id, parent->job.id);
	cr_assert(r2cc_ctl_job_check(&same->job));
	/* Odd parent ranks, reversed: nodes renumbered from the child's rank 0. */
	int odd[3] = {5, 3, 1};
	cr_assert_eq(r2cc_ctl_dir_derive(parent, odd, 3, 2, 77, &child), 0);
	cr_assert_eq(r2cc_ctl_dir_derive(parent, odd, 3, 0, 77, &child2), 0);
	cr_assert_eq(r2cc_ctl_dir_derive(parent, odd, 3, 0, 78, &other), 0);
	cr_assert_eq(child->nranks, 3);
	cr_assert_eq(child->self_rank, 2);
	cr_assert_eq(child->nnodes, 3);
	cr_assert_str_eq(r2cc_ctl_dir_member(child, 0)->host, "host5");
	cr_assert_eq(r2cc_ctl_dir_node(child, 0), 0);
	cr_assert_eq(r2cc_ctl_dir_member(child, 0)->node, 0);
	cr_assert_str_eq(r2cc_ctl_dir_member(child, 0)->node_key, "C");
	cr_assert_eq(child->job.id, child2->job.id, "every member derives the same job");
	cr_assert_eq(memcmp(child->digest, child2->digest, 32), 0);
	cr_assert_neq(child->job.id, other->job.id, "another tag, another job");
	cr_assert_neq(memcmp(child->digest, other->digest, 32), 0);
	/* A child's lookups go to the parent's rendezvous in the parent's numbering. */
	struct r2cc_ctl_dir *fresh = dir_of(rd, 0, NULL), *kid;
	cr_assert_eq(r2cc_ctl_dir_derive(fresh, odd, 3, 0, 77, &kid), 0);
	cr_assert_null(r2cc_ctl_dir_member(kid, 1), "parent rank 3 is on another node");
	int one = 1;
	cr_assert_eq(lookup(rd, kid, &one, 1, NULL, 0, NULL, NULL), 0);
	cr_assert_str_eq(r2cc_ctl_dir_member(kid, 1)->host, "host3");
	cr_assert_eq(r2cc_ctl_dir_member(kid, 1)->node, 1);
	int bad[2] = {0, 6};
	struct r2cc_ctl_dir *none;
	cr_assert_eq(r2cc_ctl_dir_derive(parent, bad, 2, 0, 1, &none), -EINVAL);
	cr_assert_eq(r2cc_ctl_dir_derive(parent, odd, 3, 3, 1, &none), -EINVAL);
	r2cc_ctl_dir_free(parent);
	r2cc_ctl_dir_free(same);
	r2cc_ctl_dir_free(child);
	r2cc_ctl_dir_free(child2);
	r2cc_ctl_dir_free(other);
	r2cc_ctl_dir_free(fresh);
	r2cc_ctl_dir_free(kid);
	r2cc_ctl_rdir_free(rd);
}
