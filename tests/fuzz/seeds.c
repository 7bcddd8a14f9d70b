/*
 * Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/NAME/) from
 * the library's own encoders, so every seed is a well-formed message of the
 * current wire formats: `make fuzz-seeds` after a format change.
 */
#include "ctl/ctl.h"
#include "ctl/ctl_msg.h"
#include "ctl/ctl_priv.h"
#include "repair/engine.h"
#include "repair/model/mr_mirror.h"
#include "shim/params.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *root;

static void put(const char *target, const char *name, const void *data, size_t len)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", root, target);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/%s/%s", root, target, name);
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(data, 1, len, f) != len || fclose(f)) {
		perror(path);
		exit(1);
	}
}

static void be32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)(v >> 24);
	p[1] = (unsigned char)(v >> 16);
	p[2] = (unsigned char)(v >> 8);
	p[3] = (unsigned char)v;
}

static void member(struct r2cc_ctl_member *m, const char *host, const char *key, int nics)
{
	memset(m, 0, sizeof(*m));
	strcpy(m->host, host);
	strcpy(m->node_key, key);
	m->pid = 4242;
	m->nnics = nics;
	for (int i = 0; i < nics; i++) {
		snprintf(m->nics[i].name, sizeof(m->nics[i].name), "mlx5_%d", i);
		m->nics[i].lid = (uint16_t)(i + 1);
		m->nics[i].port = 1;
		m->nics[i].state = 4;
		m->nics[i].speed_gbps = 200;
	}
	struct sockaddr_in *a = (struct sockaddr_in *)&m->ctl_addr;
	a->sin_family = AF_INET;
	a->sin_port = htons(29500);
	a->sin_addr.s_addr = htonl(0x7f000001);
}

/* A directory of 3 ranks on 2 nodes, as the rendezvous sends it to rank 0:
 * the node runs and the members of rank 0's node. */
static size_t directory(unsigned char *out)
{
	struct r2cc_ctl_member m;
	unsigned char **enc = malloc(3 * sizeof(*enc));
	size_t *len = malloc(3 * sizeof(*len));
	for (int r = 0; r < 3; r++) {
		member(&m, r < 2 ? "node-a" : "node-b", r < 2 ? "key-a" : "key-b", 1 + r);
		enc[r] = malloc(R2CC_CTL_MEMBER_MAX_ENC);
		len[r] = (size_t)r2cc_ctl_member_encode(&m, enc[r], R2CC_CTL_MEMBER_MAX_ENC);
	}
	int status = 0;
	struct r2cc_ctl_rdir *rd = r2cc_ctl_rdir_new(3, 1, enc, len, &status);
	unsigned char *head = NULL;
	size_t n = 0;
	if (!rd || r2cc_ctl_rdir_head(rd, 0, &head, &n)) {
		fprintf(stderr, "seeds: cannot build a directory (%d)\n", status);
		exit(1);
	}
	memcpy(out, head, n);
	free(head);
	r2cc_ctl_rdir_free(rd);
	return n;
}

static void ctl_seeds(void)
{
	static const unsigned char key[R2CC_CTL_SECRET_SIZE] = "r2cc fuzz job secret, 32 bytes!";
	unsigned char *b = malloc(1 << 16), *f = malloc(1 << 16);
	struct r2cc_ctl_member m;
	member(&m, "node-a", "key-a", 2);
	/* frame: mode 0, no chunking, a sealed frame as the fuzz target's key makes it. */
	struct r2cc_ctl_hdr h = {.magic = R2CC_CTL_MAGIC,
				 .version = R2CC_CTL_VERSION,
				 .flags = R2CC_CTL_F_REQUEST,
				 .type = 100,
				 .len = 5,
				 .req_id = 9,
				 .job_id = 42,
				 .sender = 7,
				 .seq = 1,
				 .ts_ns = 1700000000000000000LL,
				 .from_rank = 1,
				 .to_rank = 0};
	f[0] = 0;
	f[1] = 0;
	r2cc_ctl_frame_seal(key, &h, "hello", 5, f + 2);
	put("ctl_frame", "sealed-request", f, 2 + r2cc_ctl_frame_size(5));
	/* mode 1 templates: type, flags, seq, from, to, 2 chunk sizes, payload */
	size_t n;
	f[0] = 1;
	f[1] = 0, f[2] = 1, f[3] = R2CC_CTL_F_REQUEST, f[4] = 0;
	be32(f + 5, 3);
	be32(f + 9, 0xffffffffu);
	f[13] = 200, f[14] = 7;
	be32(f + 15, 3);
	be32(f + 19, 4);
	n = (size_t)r2cc_ctl_member_encode(&m, f + 23, R2CC_CTL_MEMBER_MAX_ENC);
	put("ctl_frame", "register", f, 23 + n);
	f[1] = 0, f[2] = 1, f[3] = R2CC_CTL_F_REPLY;
	be32(f + 5, 0xffffffffu);
	be32(f + 9, 1);
	n = directory(f + 15);
	put("ctl_frame", "directory-reply", f, 15 + n);
	f[3] = R2CC_CTL_F_REPLY | R2CC_CTL_F_ERROR;
	be32(f + 15, EPROTO);
	put("ctl_frame", "error-reply", f, 19);

	/* uid: v4 and v6 rendezvous, then an R2CC_OOB_ROOT value */
	struct r2cc_ctl_job job = {0};
	memset(job.secret, 0x33, sizeof(job.secret));
	r2cc_ctl_job_derive_id(&job);
	job.rdv = m.ctl_addr;
	memset(b, 0, 256);
	r2cc_ctl_uid_encode(b, &job);
	memcpy(b + 128, "10.1.2.3:29500", 14);
	put("ctl_uid", "v4", b, 142);
	struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&job.rdv;
	memset(&job.rdv, 0, sizeof(job.rdv));
	a6->sin6_family = AF_INET6;
	a6->sin6_port = htons(5000);
	a6->sin6_addr = in6addr_loopback;
	r2cc_ctl_uid_encode(b, &job);
	memcpy(b + 128, "[::1]:5000", 10);
	put("ctl_uid", "v6", b, 138);

	/* dir: a member alone, and a directory */
	n = (size_t)r2cc_ctl_member_encode(&m, b, R2CC_CTL_MEMBER_MAX_ENC);
	put("ctl_dir", "member", b, n);
	n = directory(b);
	put("ctl_dir", "directory", b, n);
	free(b);
	free(f);
}

static void mirror_seeds(void)
{
	unsigned char b[256];
	struct r2cc_mr_mirror_req r = {.from = "mlx5_0", .to = "mlx5_2", .epoch = 3, .gen = 8};
	int n = r2cc_mr_mirror_req_encode(&r, b, sizeof(b));
	put("mr_mirror", "request", b, (size_t)n);
	memset(b, 0, sizeof(b));
	b[0] = R2CC_MR_MIRROR_VERSION;
	b[1] = R2CC_MR_MIRROR_FULL;
	b[23] = 2; /* count */
	for (int i = 0; i < 2; i++) {
		unsigned char *e = b + 24 + 24 * i;
		be32(e, (uint32_t)(0x100 * (2 - i)));
		be32(e + 4, (uint32_t)(0x900 + i));
		e[15] = 0x10;
		e[23] = 0x40;
	}
	put("mr_mirror", "map-full", b, 24 + 2 * 24);
	memset(b, 0, 24);
	b[0] = R2CC_MR_MIRROR_VERSION;
	b[1] = R2CC_MR_MIRROR_SAME;
	put("mr_mirror", "map-same", b, 24);
}

static void wire_entry(unsigned char *m, int op)
{
	memset(m, 0, R2CC_REPAIR_WIRE_SIZE);
	m[0] = (unsigned char)op;
	m[8] = 0x12;				       /* pair id */
	m[16 + 15] = 0x10, m[16 + 17] = 1;	       /* source end: LID 1, */
	m[16 + 22] = 0x34;			       /* QP 0x34 */
	m[39 + 17] = 2, m[39 + 22] = 0x56;	       /* destination end: LID 2, QP 0x56 */
	m[70] = 8;				       /* work */
	m[74] = 0x78, m[78] = 3, m[80] = 1, m[81] = 5; /* new QP, LID, port, MTU */
	strcpy((char *)m + R2CC_REPAIR_WIRE_NEW_NIC, "mlx5_0");
	strcpy((char *)m + R2CC_REPAIR_WIRE_ORIG_NIC, "mlx5_2");
	/* two messages retired, both on record: a WRITE_WITH_IMM and a SEND */
	m[R2CC_REPAIR_WIRE_SENT] = 2;
	m[R2CC_REPAIR_WIRE_SENT + 8] = 2;
	m[R2CC_REPAIR_WIRE_SENT + 9] = 1, m[R2CC_REPAIR_WIRE_SENT + 10] = 2;
	m[R2CC_REPAIR_WIRE_SENT + 17] = 0x2a; /* the first one's immediate */
	m[R2CC_REPAIR_WIRE_SENT + 49] = 0x40; /* lengths 64 and 8 */
	m[R2CC_REPAIR_WIRE_SENT + 53] = 8;
}

static void wire_seeds(void)
{
	unsigned char m[R2CC_REPAIR_WIRE_HDR + 3 * R2CC_REPAIR_WIRE_SIZE +
			R2CC_REPAIR_WIRE_MAP_HDR + 24 + 24] = {R2CC_REPAIR_WIRE_VERSION, 0, 1, 0};
	for (int op = 1; op <= 7; op++) { /* REQ .. SUSPECT, FAR_REQ, FAR_REP */
		wire_entry(m + R2CC_REPAIR_WIRE_HDR, op);
		char name[16];
		snprintf(name, sizeof(name), "op%d", op);
		put("rep_wire", name, m, R2CC_REPAIR_WIRE_HDR + R2CC_REPAIR_WIRE_SIZE);
	}
	/* a batch: three entries, as one message per peer carries */
	m[2] = 3;
	for (int i = 0; i < 3; i++)
		wire_entry(m + R2CC_REPAIR_WIRE_HDR + i * R2CC_REPAIR_WIRE_SIZE, 1 + i);
	size_t at = R2CC_REPAIR_WIRE_HDR + 3 * R2CC_REPAIR_WIRE_SIZE;
	put("rep_wire", "batch3", m, at);
	/* ... with the sender's rkey map mlx5_2 -> mlx5_0: one MR */
	m[1] = 1;
	unsigned char *h = m + at, *b = h + R2CC_REPAIR_WIRE_MAP_HDR;
	memset(h, 0, R2CC_REPAIR_WIRE_MAP_HDR + 48);
	strcpy((char *)h, "mlx5_2");
	strcpy((char *)h + 64, "mlx5_0");
	h[128] = 48;
	b[0] = R2CC_MR_MIRROR_VERSION;
	b[1] = R2CC_MR_MIRROR_FULL;
	b[11] = 7, b[19] = 2, b[23] = 1; /* epoch, generation, one entry */
	b[27] = 0x11, b[31] = 0x22, b[32] = 0x10, b[47] = 0x40;
	put("rep_wire", "batch3-map", m, sizeof(m));
	/* ... and clear-to-send records: a query for entry 0, an answer for entry 2 */
	unsigned char c[sizeof(m) + 2 * R2CC_REPAIR_WIRE_CTS];
	memcpy(c, m, sizeof(m));
	c[4] = 2;
	unsigned char *q = c + sizeof(m);
	memset(q, 0, 2 * R2CC_REPAIR_WIRE_CTS);
	q[2] = 1, q[3] = 1, q[4] = 64, q[5] = 40; /* 1 element of 64 B, idx at 40 */
	q[8 + 1] = 0x40, q[8 + 5] = 0x7f;	  /* its address, */
	q[16] = 0x21;				  /* idx 33 */
	q += R2CC_REPAIR_WIRE_CTS;
	q[0] = 2, q[2] = 2, q[3] = 2, q[4] = 32, q[5] = 24, q[6] = 1;
	q[8 + 1] = 0x80, q[8 + 5] = 0x7f, q[16] = 0x05;
	put("rep_wire", "batch3-map-cts", c, sizeof(c));
}

static void settings_seeds(void)
{
	char b[300];
	int n = 0;
	while (r2cc_param_name(n))
		n++;
	for (int i = 0; i < n; i++) {
		b[0] = (char)i;
		const char *v = r2cc_param_default(i);
		size_t len = strlen(v ? v : "");
		memcpy(b + 1, v ? v : "", len);
		put("settings", r2cc_param_name(i), b, 1 + len);
	}
	static const char *const extra[][2] = {
	    {"R2CC_COST_MODEL", "alpha_us=5,beta_us_per_byte=0.0001"},
	    {"R2CC_AR_MIN_BYTES", "16M"},
	    {"R2CC_STALL_MS", "250"},
	};
	for (size_t k = 0; k < sizeof(extra) / sizeof(extra[0]); k++) {
		for (int i = 0; i < n; i++) {
			if (strcmp(r2cc_param_name(i), extra[k][0]))
				continue;
			b[0] = (char)i;
			memcpy(b + 1, extra[k][1], strlen(extra[k][1]));
			char name[64];
			snprintf(name, sizeof(name), "%s-2", extra[k][0]);
			put("settings", name, b, 1 + strlen(extra[k][1]));
		}
	}
	/* failure specs: node NUL hca */
	static const char *const spec[][2] = {{"0", "mlx5_2"},
					      {"node-b", "0,2"},
					      {"", "0:mlx5_2;1:mlx5_0,mlx5_1"},
					      {"0,2", "mlx5_1"}};
	for (size_t k = 0; k < sizeof(spec) / sizeof(spec[0]); k++) {
		b[0] = (char)n;
		size_t a = strlen(spec[k][0]), h = strlen(spec[k][1]);
		memcpy(b + 1, spec[k][0], a);
		b[1 + a] = 0;
		memcpy(b + 2 + a, spec[k][1], h);
		char name[32];
		snprintf(name, sizeof(name), "failspec-%zu", k);
		put("settings", name, b, 2 + a + h);
	}
}

int main(int argc, char **argv)
{
	root = argc > 1 ? argv[1] : "tests/fuzz/corpus";
	mkdir(root, 0755);
	ctl_seeds();
	mirror_seeds();
	wire_seeds();
	settings_seeds();
	return 0;
}
