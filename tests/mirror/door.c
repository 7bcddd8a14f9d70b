/*
 * Test door to the MR mirror. Linked only into the test copy of the library
 * (build/tests/mirror/libr2cc-door.so: libr2cc.so's objects plus this file),
 * whose version script exports r2cc_test_*; libr2cc.so itself exports none of
 * it. Lets tests/mirror/mirror_e2e drive, from a program running under the
 * preload, what hot repair will call from inside: key translation, R2CC's PDs,
 * the peer's rkey map over the control plane, and raw frames to the service.
 */
#include "ctl/ctl.h"
#include "ctl/ctl_msg.h"
#include "ctl/ctl_priv.h"
#include "ctl/job.h"
#include "repair/model/mr_mirror.h"
#include "shim/common.h"
#include "shim/core.h"
#include "shim/registry.h"
#include "tests/mirror/door.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static struct r2cc_ctl_dir *door_dir;

static const struct r2cc_nic *nic_named(const char *name)
{
	for (int i = 0; i < r2cc_nic_count(); i++) {
		const struct r2cc_nic *n = r2cc_nic_by_index(i);
		if (n && !strcmp(n->name, name))
			return n;
	}
	return NULL;
}

/* Join the job of a stamped unique id as rank/nranks (a registration round of
 * its own, after the communicator's) and keep the directory: hot repair will
 * keep the communicator's own. */
R2CC_EXPORT int r2cc_test_join(const unsigned char id[128], int rank, int nranks, int timeout_ms)
{
	struct r2cc_ctl_job job;
	struct r2cc_ctl_member self;
	if (!r2cc_ctl_uid_parse(id, &job))
		return -EINVAL;
	/* A new round while the communicator's is open would cancel that one. */
	r2cc_job_quiesce(timeout_ms);
	memset(&self, 0, sizeof(self));
	snprintf(self.host, sizeof(self.host), "door");
	r2cc_node_key(self.node_key, sizeof(self.node_key));
	self.pid = (int32_t)getpid();
	return r2cc_ctl_register(&job, &self, rank, nranks, timeout_ms, &door_dir);
}

R2CC_EXPORT int r2cc_test_lkey(const char *from, uint32_t lkey, const char *to, uint32_t *out)
{
	return r2cc_mr_mirror_lkey(nic_named(from), lkey, nic_named(to), out);
}

R2CC_EXPORT int r2cc_test_local_rkey(const char *from, uint32_t rkey, const char *to, uint32_t *out)
{
	return r2cc_mr_mirror_rkey(nic_named(from), rkey, nic_named(to), out);
}

R2CC_EXPORT int r2cc_test_remote_rkey(int peer, const char *from, uint32_t rkey, uint64_t addr,
				      uint64_t len, const char *to, uint32_t *out, int timeout_ms)
{
	return r2cc_mr_mirror_remote_rkey(door_dir, peer, from, rkey, addr, len, to, out,
					  timeout_ms);
}

R2CC_EXPORT int r2cc_test_refresh(int peer, const char *from, const char *to, int timeout_ms)
{
	return r2cc_mr_mirror_remote_refresh(door_dir, peer, from, to, timeout_ms);
}

R2CC_EXPORT struct ibv_pd *r2cc_test_pd(const char *nic)
{
	const struct r2cc_nic *n = nic_named(nic);
	return n && r2cc_mr_mirror_enabled() ? r2cc_mr_mirror_pd(n) : NULL;
}

/* groups, mirrors, mirror_fail, served, bad_requests, fetches, cache_hits,
 * generation, then the control plane's bad_tag and malformed drops. */
R2CC_EXPORT void r2cc_test_stats(uint64_t out[10])
{
	struct r2cc_mr_mirror_stats s;
	struct r2cc_ctl_stats c;
	r2cc_mr_mirror_get_stats(&s);
	r2cc_ctl_stats(&c);
	const uint64_t v[10] = {s.groups,
				s.mirrors,
				s.mirror_fail,
				s.served,
				s.bad_requests,
				s.fetches,
				s.cache_hits,
				s.generation,
				c.drops[R2CC_CTL_DROP_BAD_TAG],
				c.drops[R2CC_CTL_DROP_UNKNOWN_TYPE]};
	memcpy(out, v, sizeof(v));
}

/* An authenticated request with an arbitrary payload: the peer's status. */
R2CC_EXPORT int r2cc_test_raw(int peer, const void *payload, size_t len, int timeout_ms)
{
	unsigned char reply[256];
	size_t rlen = sizeof(reply);
	return r2cc_ctl_request(door_dir, peer, R2CC_MR_MIRROR_MSG, payload, len, reply, &rlen,
				timeout_ms);
}

/* A well-formed map request sealed with a wrong key, written straight to the
 * peer's control listener; 0 once written. */
R2CC_EXPORT int r2cc_test_forged(int peer)
{
	if (!door_dir || peer < 0 || peer >= door_dir->nranks)
		return -EINVAL;
	struct r2cc_mr_mirror_req r = {.from = "mlx5_0", .to = "mlx5_1"};
	unsigned char req[R2CC_MR_MIRROR_REQ_MAX], frame[R2CC_CTL_HDR_SIZE + sizeof(req) + 32];
	int len = r2cc_mr_mirror_req_encode(&r, req, sizeof(req));
	unsigned char key[R2CC_CTL_SECRET_SIZE];
	memcpy(key, door_dir->job.secret, sizeof(key));
	key[0] ^= 0x5a;
	struct r2cc_ctl_hdr h = {
	    .magic = R2CC_CTL_MAGIC,
	    .version = R2CC_CTL_VERSION,
	    .flags = R2CC_CTL_F_REQUEST,
	    .type = R2CC_MR_MIRROR_MSG,
	    .len = (uint32_t)len,
	    .req_id = 1,
	    .job_id = door_dir->job.id,
	    .sender = 0x5eed,
	    .seq = 1,
	    .ts_ns = r2cc_ctl_now_ns(),
	    .from_rank = door_dir->self_rank,
	    .to_rank = peer,
	};
	if (len < 0 || r2cc_ctl_frame_seal(key, &h, req, (size_t)len, frame))
		return -EINVAL;
	if (r2cc_ctl_dir_fetch(door_dir, &peer, 1, 5000))
		return -ENOENT;
	const struct sockaddr_storage *a = &r2cc_ctl_dir_member(door_dir, peer)->ctl_addr;
	int fd = socket(a->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	int rc = 0;
	struct timeval tv = {5, 0};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	size_t n = r2cc_ctl_frame_size((size_t)len);
	if (connect(fd, (const struct sockaddr *)a, r2cc_ctl_addr_len(a)) ||
	    write(fd, frame, n) != (ssize_t)n)
		rc = -errno;
	/* Wait for the peer to close the stream: it gives no second try. */
	char c;
	while (rc == 0 && read(fd, &c, 1) > 0)
		;
	close(fd);
	return rc;
}
