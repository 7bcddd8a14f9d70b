/* MR mirror (repair/model/mr_mirror.c) without a device: the bookkeeping over test
 * doubles of the verbs (mirrors on every other NIC, same range and access,
 * dma-buf mirrored while the fd is open, failures leave the range unmirrored,
 * deregistration removes the mirrors), the service's answers (full map,
 * unchanged, unknown NIC, malformed requests of every shape), the reply
 * decoder, and the peer cache (one fetch, then hits; revalidation by
 * generation; retry with a larger buffer; a malformed reply; a map carried by
 * hot repair's exchange, stored without a fetch), and the translations of the
 * post path: no lock taken (the mutex calls of the code under test are counted:
 * it is linked with --wrap=pthread_mutex_lock), and right while registrations and
 * map updates churn beside them. */
#include "repair/model/mr_mirror.h"
#include "shim/registry.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* --- verbs doubles ------------------------------------------------------------ */

#define MAXREC 64
static struct {
	struct ibv_pd *pd;
	void *addr;
	size_t len;
	uint64_t iova;
	int access, fd, fd_was_open;
	bool dmabuf, live;
	struct ibv_mr *mr;
} regs[MAXREC];
static int nrec, npds, fail_pd_ctx;
static struct ibv_pd *fail_pd; /* reg on this PD fails */
static uint32_t next_key = 0x100;

static struct ibv_pd *d_alloc_pd(struct ibv_context *ctx)
{
	if (fail_pd_ctx && ctx == (struct ibv_context *)(uintptr_t)fail_pd_ctx) {
		errno = ENOMEM;
		return NULL;
	}
	struct ibv_pd *pd = calloc(1, sizeof(*pd));
	pd->context = ctx;
	npds++;
	return pd;
}

static int d_dealloc_pd(struct ibv_pd *pd)
{
	npds--;
	free(pd);
	return 0;
}

/* Mutex acquisitions by the code under test, per thread. */
static __thread int locks_taken;
int __real_pthread_mutex_lock(pthread_mutex_t *m);
int __wrap_pthread_mutex_lock(pthread_mutex_t *m);
int __wrap_pthread_mutex_lock(pthread_mutex_t *m)
{
	locks_taken++;
	return __real_pthread_mutex_lock(m);
}

static struct ibv_mr *record(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access,
			     int fd)
{
	if (nrec == MAXREC) /* a long test: reuse a deregistered slot */
		for (int i = 0; i < nrec; i++)
			if (!regs[i].live) {
				regs[i] = regs[--nrec];
				break;
			}
	if (pd == fail_pd || nrec == MAXREC) {
		errno = ENOMEM;
		return NULL;
	}
	struct ibv_mr *mr = calloc(1, sizeof(*mr));
	mr->pd = pd;
	mr->lkey = next_key++;
	mr->rkey = next_key++ | 0x800000;
	regs[nrec] = (__typeof__(regs[0])){
	    pd, addr, len, iova, access, fd, fd >= 0 && fcntl(fd, F_GETFD) >= 0, fd >= 0, true, mr};
	nrec++;
	return mr;
}

static struct ibv_mr *d_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	return record(pd, addr, len, (uintptr_t)addr, access, -1);
}

static struct ibv_mr *d_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				     unsigned access)
{
	return record(pd, addr, len, iova, (int)access, -1);
}

static struct ibv_mr *d_reg_dmabuf(struct ibv_pd *pd, uint64_t off, size_t len, uint64_t iova,
				   int fd, int access)
{
	return record(pd, (void *)(uintptr_t)off, len, iova, access, fd);
}

static int d_dereg(struct ibv_mr *mr)
{
	for (int i = 0; i < nrec; i++)
		if (regs[i].mr == mr && regs[i].live) {
			regs[i].live = false;
			free(mr);
			return 0;
		}
	cr_expect(false, "dereg of an MR the double never registered");
	return EINVAL;
}

static const struct r2cc_mr_mirror_verbs doubles = {d_alloc_pd,	    d_dealloc_pd, d_reg_mr,
						    d_reg_mr_iova2, d_reg_dmabuf, d_dereg};

static int live_mirrors(void)
{
	int n = 0;
	for (int i = 0; i < nrec; i++)
		n += regs[i].live;
	return n;
}

/* --- a process with three NICs, as the wrappers would record it ------------- */

static struct r2cc_nic *nic[3];
static struct ibv_pd app_pd[3]; /* "NCCL's" PDs */

static void setup(void)
{
	cr_assert_eq(r2cc_registry_init(), 0);
	r2cc_mr_mirror_force(true);
	static const char *names[] = {"mlx5_0", "mlx5_1", "mlx5_2"};
	for (int i = 0; i < 3; i++) {
		nic[i] = r2cc_nic_get(names[i]);
		struct ibv_context *ctx = (struct ibv_context *)(uintptr_t)(0x1000 * (i + 1));
		struct r2cc_ctx *c = r2cc_ctx_add(ctx, nic[i]);
		cr_assert(c);
		r2cc_pd_add(&app_pd[i], c);
		r2cc_mr_mirror_ctx_opened(ctx, nic[i], &doubles);
	}
}

TestSuite(mirror, .init = setup);

static struct ibv_mr nccl_mr(uint32_t lkey)
{
	return (struct ibv_mr){.lkey = lkey, .rkey = lkey | 0x400000};
}

static void reg(struct ibv_mr *mr, int on, void *addr, size_t len, int access)
{
	r2cc_mr_mirror_reg(&app_pd[on], mr,
			   &(struct r2cc_mr_mirror_src){
			       .kind = R2CC_MR_VA, .addr = addr, .len = len, .access = access});
}

Test(mirror, mirrors_on_every_other_nic_and_translates)
{
	static char buf[8192];
	struct ibv_mr mr = nccl_mr(0x11);
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	reg(&mr, 0, buf, sizeof(buf), acc);
	cr_assert_eq(nrec, 2, "expected mirrors on 2 other NICs, got %d", nrec);
	cr_expect_eq(npds, 2, "one PD of R2CC's per other NIC");
	for (int i = 0; i < 2; i++) {
		cr_expect_eq(regs[i].addr, buf);
		cr_expect_eq(regs[i].len, sizeof(buf));
		cr_expect_eq(regs[i].access, acc);
		cr_expect_neq(regs[i].pd, &app_pd[0]);
	}
	uint32_t k = 0, back = 0;
	cr_expect_eq(r2cc_mr_mirror_lkey(nic[0], 0x11, nic[1], &k), 0);
	cr_expect(k == regs[0].mr->lkey || k == regs[1].mr->lkey);
	cr_expect_eq(regs[0].mr->lkey == k ? regs[0].pd : regs[1].pd, r2cc_mr_mirror_pd(nic[1]),
		     "the mirror on mlx5_1 must live in R2CC's PD there");
	cr_expect_eq(r2cc_mr_mirror_lkey(nic[1], k, nic[0], &back), 0);
	cr_expect_eq(back, 0x11u);
	cr_expect_eq(r2cc_mr_mirror_lkey(nic[1], k, nic[2], &back), 0, "mirror to mirror");
	cr_expect_eq(r2cc_mr_mirror_rkey(nic[0], mr.rkey, nic[2], &back), 0);
	cr_expect_eq(r2cc_mr_mirror_lkey(nic[0], 0x12, nic[1], &k), -ENOENT);
	cr_expect_eq(r2cc_mr_mirror_lkey(nic[0], 0x11, NULL, &k), -EINVAL);

	struct r2cc_mr_mirror_stats st;
	r2cc_mr_mirror_get_stats(&st);
	uint64_t gen = st.generation;
	r2cc_mr_mirror_dereg(&mr);
	cr_expect_eq(live_mirrors(), 0, "dereg left %d mirrors", live_mirrors());
	cr_expect_eq(r2cc_mr_mirror_lkey(nic[0], 0x11, nic[1], &k), -ENOENT);
	r2cc_mr_mirror_get_stats(&st);
	cr_expect_eq(st.groups, 0);
	cr_expect_eq(st.mirrors, 0);
	cr_expect_gt(st.generation, gen);
}

Test(mirror, dmabuf_mirrored_while_fd_open)
{
	int p[2];
	cr_assert_eq(pipe(p), 0);
	struct ibv_mr mr = nccl_mr(0x21);
	r2cc_mr_mirror_reg(&app_pd[1], &mr,
			   &(struct r2cc_mr_mirror_src){.kind = R2CC_MR_DMABUF,
							.offset = 4096,
							.iova = 0x7f0000000000,
							.fd = p[0],
							.len = 1 << 20,
							.access = IBV_ACCESS_REMOTE_READ});
	close(p[0]);
	close(p[1]);
	cr_assert_eq(nrec, 2);
	for (int i = 0; i < 2; i++) {
		cr_expect(regs[i].dmabuf);
		cr_expect(regs[i].fd_was_open, "mirror registered after the fd was gone");
		cr_expect_eq(regs[i].iova, 0x7f0000000000u);
		cr_expect_eq((uintptr_t)regs[i].addr, 4096u);
	}
}

Test(mirror, iova_kept)
{
	static char buf[64];
	struct ibv_mr mr = nccl_mr(0x31);
	r2cc_mr_mirror_reg(&app_pd[2], &mr,
			   &(struct r2cc_mr_mirror_src){
			       .kind = R2CC_MR_IOVA, .addr = buf, .iova = 0xabc000, .len = 64});
	cr_assert_eq(nrec, 2);
	cr_expect_eq(regs[0].iova, 0xabc000u);
	cr_expect_eq(regs[1].iova, 0xabc000u);
}

Test(mirror, failure_leaves_range_unmirrored)
{
	static char buf[64];
	fail_pd = r2cc_mr_mirror_pd(nic[2]);
	cr_assert(fail_pd);
	struct ibv_mr mr = nccl_mr(0x41);
	reg(&mr, 0, buf, 64, 0);
	uint32_t k;
	cr_expect_eq(r2cc_mr_mirror_lkey(nic[0], 0x41, nic[1], &k), 0);
	cr_expect_eq(r2cc_mr_mirror_lkey(nic[0], 0x41, nic[2], &k), -ENOENT);
	struct r2cc_mr_mirror_stats st;
	r2cc_mr_mirror_get_stats(&st);
	cr_expect_eq(st.mirror_fail, 1);
	cr_expect_eq(st.mirrors, 1);
	r2cc_mr_mirror_dereg(&mr);
	cr_expect_eq(live_mirrors(), 0);
}

Test(mirror, off_registers_nothing)
{
	static char buf[64];
	r2cc_mr_mirror_force(false);
	struct ibv_mr mr = nccl_mr(0x51);
	reg(&mr, 0, buf, 64, 0);
	cr_expect_eq(nrec, 0);
	cr_expect_eq(npds, 0);
}

Test(mirror, close_releases_pd_and_mirrors)
{
	static char buf[64];
	struct ibv_mr mr = nccl_mr(0x61);
	reg(&mr, 0, buf, 64, 0);
	cr_assert_eq(live_mirrors(), 2);
	r2cc_mr_mirror_ctx_closing((struct ibv_context *)(uintptr_t)0x2000); /* mlx5_1 */
	cr_expect_eq(live_mirrors(), 1);
	cr_expect_eq(npds, 1);
	uint32_t k;
	cr_expect_eq(r2cc_mr_mirror_lkey(nic[0], 0x61, nic[1], &k), -ENOENT);
	cr_expect_eq(r2cc_mr_mirror_lkey(nic[0], 0x61, nic[2], &k), 0);
}

/* --- the service --------------------------------------------------------------- */

static int encode(const char *from, const char *to, uint64_t epoch, uint64_t gen,
		  unsigned char *out)
{
	struct r2cc_mr_mirror_req r = {.epoch = epoch, .gen = gen};
	strcpy(r.from, from);
	strcpy(r.to, to);
	return r2cc_mr_mirror_req_encode(&r, out, R2CC_MR_MIRROR_REQ_MAX);
}

Test(mirror, answers_full_then_unchanged)
{
	static char b1[64], b2[128];
	struct ibv_mr m1 = nccl_mr(0x71), m2 = nccl_mr(0x73);
	reg(&m1, 0, b1, 64, 0);
	reg(&m2, 0, b2, 128, 0);
	unsigned char req[R2CC_MR_MIRROR_REQ_MAX], *rep;
	size_t n;
	int len = encode("mlx5_0", "mlx5_2", 0, 0, req);
	cr_assert_gt(len, 0);
	cr_assert_eq(r2cc_mr_mirror_answer(req, (size_t)len, &rep, &n), 0);
	struct r2cc_mr_mirror_map m;
	cr_assert_eq(r2cc_mr_mirror_map_decode(rep, n, &m), 0);
	free(rep);
	cr_expect_eq(m.kind, R2CC_MR_MIRROR_FULL);
	cr_assert_eq(m.count, 2);
	for (uint32_t i = 0; i < 2; i++) {
		uint32_t want;
		cr_expect_eq(r2cc_mr_mirror_rkey(nic[0], m.e[i].rkey_from, nic[2], &want), 0);
		cr_expect_eq(m.e[i].rkey_to, want);
	}
	cr_expect(m.e[0].rkey_from < m.e[1].rkey_from, "map not sorted");
	len = encode("mlx5_0", "mlx5_2", m.epoch, m.gen, req);
	cr_assert_eq(r2cc_mr_mirror_answer(req, (size_t)len, &rep, &n), 0);
	struct r2cc_mr_mirror_map same;
	cr_assert_eq(r2cc_mr_mirror_map_decode(rep, n, &same), 0);
	cr_expect_eq(same.kind, R2CC_MR_MIRROR_SAME);
	cr_expect_eq(n, 24u);
	free(rep);
	len = encode("mlx5_0", "mlx9_9", 0, 0, req);
	cr_expect_eq(r2cc_mr_mirror_answer(req, (size_t)len, &rep, &n), -ENODEV);
	cr_expect_null(rep);
	r2cc_mr_mirror_map_free(&m);
}

Test(mirror, malformed_requests_refused)
{
	unsigned char good[R2CC_MR_MIRROR_REQ_MAX], bad[R2CC_MR_MIRROR_REQ_MAX + 8], *rep;
	size_t n;
	int len = encode("mlx5_0", "mlx5_1", 0, 0, good);
	cr_assert_gt(len, 0);
	struct r2cc_mr_mirror_stats st0, st;
	r2cc_mr_mirror_get_stats(&st0);
	uint64_t refused = 0;
	/* Every truncation and every extension. */
	for (int l = 0; l < len; l++, refused++)
		cr_expect_eq(r2cc_mr_mirror_answer(good, (size_t)l, &rep, &n), -EPROTO, "len %d",
			     l);
	memcpy(bad, good, (size_t)len);
	bad[len] = 0;
	cr_expect_eq(r2cc_mr_mirror_answer(bad, (size_t)len + 1, &rep, &n), -EPROTO);
	refused++;
	/* Header bytes, name lengths and name bytes. */
	const int at[] = {0, 1, 2, 3, 4, 5, 11, 12};
	const unsigned char val[] = {2, 2, 1, 1, 0, 0, 64, '\n'};
	for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++, refused++) {
		memcpy(bad, good, (size_t)len);
		bad[at[i]] = val[i];
		cr_expect_eq(r2cc_mr_mirror_answer(bad, (size_t)len, &rep, &n), -EPROTO,
			     "byte %d = %d accepted", at[i], val[i]);
		cr_expect_null(rep);
	}
	/* Random garbage never crashes and is never taken for a request. */
	srand(7);
	for (int t = 0; t < 2000; t++) {
		size_t l = (size_t)(rand() % (int)sizeof(bad));
		for (size_t i = 0; i < l; i++)
			bad[i] = (unsigned char)rand();
		if (r2cc_mr_mirror_answer(bad, l, &rep, &n) == -EPROTO)
			refused++;
		free(rep);
	}
	r2cc_mr_mirror_get_stats(&st);
	cr_expect_eq(st.bad_requests - st0.bad_requests, refused);
	cr_expect_eq(st.served, st0.served);
}

Test(mirror, malformed_replies_refused)
{
	unsigned char r[24 + 24] = {1, 0, 0, 0};
	struct r2cc_mr_mirror_map m;
	r[23] = 1; /* count 1 */
	cr_expect_eq(r2cc_mr_mirror_map_decode(r, sizeof(r), &m), 0);
	r2cc_mr_mirror_map_free(&m);
	cr_expect_eq(r2cc_mr_mirror_map_decode(r, sizeof(r) - 1, &m), -EPROTO);
	r[20] = 0xff; /* count far beyond the length */
	cr_expect_eq(r2cc_mr_mirror_map_decode(r, sizeof(r), &m), -EPROTO);
	r[20] = 0;
	r[1] = R2CC_MR_MIRROR_SAME; /* unchanged with entries */
	cr_expect_eq(r2cc_mr_mirror_map_decode(r, sizeof(r), &m), -EPROTO);
	r[1] = 7;
	cr_expect_eq(r2cc_mr_mirror_map_decode(r, sizeof(r), &m), -EPROTO);
	cr_expect_eq(r2cc_mr_mirror_map_decode(r, 3, &m), -EPROTO);
}

/* --- the cache, with this process as its own peer ------------------------------- */

static int fetches, fetch_mode; /* 1: say EMSGSIZE once; 2: garbage */

static int fake_fetch(const struct r2cc_ctl_dir *dir, int peer, const void *req, size_t len,
		      void *reply, size_t *reply_len, int timeout_ms)
{
	fetches++;
	unsigned char *rep;
	size_t n;
	if (fetch_mode == 2) {
		memset(reply, 0xab, 30);
		*reply_len = 30;
		return 0;
	}
	int rc = r2cc_mr_mirror_answer(req, len, &rep, &n);
	if (rc)
		return rc;
	if (fetch_mode == 1 || n > *reply_len) {
		fetch_mode = 0;
		*reply_len = n + 100000;
		free(rep);
		return -EMSGSIZE;
	}
	memcpy(reply, rep, n);
	*reply_len = n;
	free(rep);
	return 0;
}

static struct r2cc_ctl_dir fake_dir = {.job = {.id = 42}, .nranks = 2, .self_rank = 1};

Test(mirror, cache_fetches_once_and_revalidates)
{
	static char b1[64], b2[64];
	r2cc_mr_mirror_set_fetch(fake_fetch);
	struct ibv_mr m1 = nccl_mr(0x81), m2 = nccl_mr(0x83);
	reg(&m1, 0, b1, 64, 0);
	uint32_t want, got = 0;
	cr_assert_eq(r2cc_mr_mirror_rkey(nic[0], m1.rkey, nic[1], &want), 0);
	cr_expect_eq(r2cc_mr_mirror_remote_rkey(&fake_dir, 0, "mlx5_0", m1.rkey, (uintptr_t)b1, 64,
						"mlx5_1", &got, 100),
		     0);
	cr_expect_eq(got, want);
	cr_expect_eq(fetches, 1);
	cr_expect_eq(r2cc_mr_mirror_remote_rkey(&fake_dir, 0, "mlx5_0", m1.rkey, (uintptr_t)b1, 64,
						"mlx5_1", &got, 100),
		     0);
	cr_expect_eq(fetches, 1, "a cached translation went to the peer");
	cr_expect_eq(r2cc_mr_mirror_remote_rkey(&fake_dir, 0, "mlx5_0", m1.rkey, (uintptr_t)b1, 64,
						"mlx5_0", &got, 100),
		     0);
	cr_expect_eq(got, m1.rkey);
	cr_expect_eq(fetches, 1);

	/* A key registered after the fetch: the miss revalidates. */
	reg(&m2, 0, b2, 64, 0);
	cr_expect_eq(r2cc_mr_mirror_remote_rkey(&fake_dir, 0, "mlx5_0", m2.rkey, (uintptr_t)b2, 64,
						"mlx5_1", &got, 100),
		     0);
	cr_expect_eq(fetches, 2);
	/* Unknown: asked once, unchanged answer, -ENOENT. */
	cr_expect_eq(r2cc_mr_mirror_remote_rkey(&fake_dir, 0, "mlx5_0", 0x123456, 0, 64, "mlx5_1",
						&got, 100),
		     -ENOENT);
	cr_expect_eq(fetches, 3);
	/* The peer deregisters: a refresh drops the stale entry. */
	r2cc_mr_mirror_dereg(&m1);
	cr_expect_eq(r2cc_mr_mirror_remote_refresh(&fake_dir, 0, "mlx5_0", "mlx5_1", 100), 0);
	cr_expect_eq(r2cc_mr_mirror_remote_rkey(&fake_dir, 0, "mlx5_0", m1.rkey, (uintptr_t)b1, 64,
						"mlx5_1", &got, 100),
		     -ENOENT);
	/* Other peers and jobs have caches of their own; forget empties one. */
	int before = fetches;
	cr_expect_eq(r2cc_mr_mirror_remote_rkey(&fake_dir, 1, "mlx5_0", m2.rkey, (uintptr_t)b2, 64,
						"mlx5_1", &got, 100),
		     0);
	cr_expect_eq(fetches, before + 1);
	r2cc_mr_mirror_remote_forget(42, -1);
	cr_expect_eq(r2cc_mr_mirror_remote_rkey(&fake_dir, 1, "mlx5_0", m2.rkey, (uintptr_t)b2, 64,
						"mlx5_1", &got, 100),
		     0);
	cr_expect_eq(fetches, before + 2);
	cr_expect_eq(r2cc_mr_mirror_remote_rkey(&fake_dir, 2, "mlx5_0", m2.rkey, (uintptr_t)b2, 64,
						"mlx5_1", &got, 100),
		     -EINVAL, "rank out of range");
}

/* The peer deregisters a buffer and registers another that gets the same rkey: a
 * request on the new buffer must not translate through the cached entry of the old
 * one (its mirror key is the old registration's). The range misses, the map is
 * fetched again, and the translation is the new registration's. */
Test(mirror, recycled_rkey_never_translates_to_the_old_mirror)
{
	static char b1[64], b2[4096];
	r2cc_mr_mirror_set_fetch(fake_fetch);
	struct ibv_mr m1 = nccl_mr(0xa1);
	reg(&m1, 0, b1, sizeof(b1), 0);
	uint32_t old, now, got = 0;
	cr_assert_eq(r2cc_mr_mirror_rkey(nic[0], m1.rkey, nic[1], &old), 0);
	cr_expect_eq(r2cc_mr_mirror_remote_rkey(&fake_dir, 0, "mlx5_0", m1.rkey, (uintptr_t)b1,
						sizeof(b1), "mlx5_1", &got, 100),
		     0);
	cr_expect_eq(got, old);
	int before = fetches;
	r2cc_mr_mirror_dereg(&m1);
	struct ibv_mr m2 = nccl_mr(0xa1); /* the same keys, another buffer */
	reg(&m2, 0, b2, sizeof(b2), 0);
	cr_assert_eq(r2cc_mr_mirror_rkey(nic[0], m2.rkey, nic[1], &now), 0);
	cr_assert_neq(now, old);
	cr_expect_eq(r2cc_mr_mirror_remote_rkey(&fake_dir, 0, "mlx5_0", m2.rkey,
						(uintptr_t)b2 + 1024, 512, "mlx5_1", &got, 100),
		     0);
	cr_expect_eq(got, now, "a recycled rkey translated to the old registration's mirror");
	cr_expect_eq(fetches, before + 1);
	/* Beyond the registration: no translation. */
	cr_expect_eq(r2cc_mr_mirror_remote_rkey(&fake_dir, 0, "mlx5_0", m2.rkey,
						(uintptr_t)b2 + 4000, 512, "mlx5_1", &got, 100),
		     -ENOENT);
	r2cc_mr_mirror_dereg(&m2);
	r2cc_mr_mirror_remote_forget(42, -1);
}

Test(mirror, cache_retries_larger_and_refuses_garbage)
{
	static char b1[64];
	r2cc_mr_mirror_set_fetch(fake_fetch);
	struct ibv_mr m1 = nccl_mr(0x91);
	reg(&m1, 0, b1, 64, 0);
	uint32_t got;
	fetch_mode = 1;
	cr_expect_eq(r2cc_mr_mirror_remote_rkey(&fake_dir, 0, "mlx5_0", m1.rkey, (uintptr_t)b1, 64,
						"mlx5_2", &got, 100),
		     0);
	cr_expect_eq(fetches, 2, "no retry with the size the peer said");
	fetch_mode = 2;
	cr_expect_eq(r2cc_mr_mirror_remote_rkey(&fake_dir, 0, "mlx5_0", m1.rkey, (uintptr_t)b1, 64,
						"mlx5_1", &got, 100),
		     -EPROTO);
}

/* Hot repair's exchange carries the sender's map: the receiver stores it and
 * translates without asking; an overtaken (older) map does not replace a newer
 * one; what is not a well-formed full map is refused. */
Test(mirror, map_carried_in_a_message_needs_no_fetch)
{
	static char b1[64], b2[64];
	r2cc_mr_mirror_set_fetch(fake_fetch);
	struct ibv_mr m1 = nccl_mr(0x91), m2 = nccl_mr(0x93);
	reg(&m1, 0, b1, 64, 0);
	unsigned char *old = NULL, *cur = NULL;
	size_t old_len = 0, cur_len = 0;
	cr_assert_eq(r2cc_mr_mirror_map_encode("mlx5_0", "mlx5_1", &old, &old_len), 0);
	reg(&m2, 0, b2, 64, 0);
	cr_assert_eq(r2cc_mr_mirror_map_encode("mlx5_0", "mlx5_1", &cur, &cur_len), 0);
	cr_expect_eq(cur_len, old_len + R2CC_MR_MIRROR_ENTRY);

	cr_expect_eq(r2cc_mr_mirror_remote_store(&fake_dir, 0, "mlx5_0", "mlx5_1", cur, cur_len),
		     0);
	cr_expect_eq(r2cc_mr_mirror_remote_store(&fake_dir, 0, "mlx5_0", "mlx5_1", old, old_len), 0,
		     "an older map is no error, it is only not kept");
	uint32_t want, got = 0;
	cr_assert_eq(r2cc_mr_mirror_rkey(nic[0], m2.rkey, nic[1], &want), 0);
	cr_expect_eq(r2cc_mr_mirror_remote_rkey(&fake_dir, 0, "mlx5_0", m2.rkey, (uintptr_t)b2, 64,
						"mlx5_1", &got, 100),
		     0);
	cr_expect_eq(got, want);
	cr_assert_eq(r2cc_mr_mirror_rkey(nic[0], m1.rkey, nic[1], &want), 0);
	cr_expect_eq(r2cc_mr_mirror_remote_rkey(&fake_dir, 0, "mlx5_0", m1.rkey, (uintptr_t)b1, 64,
						"mlx5_1", &got, 100),
		     0);
	cr_expect_eq(got, want);
	cr_expect_eq(fetches, 0, "a map the message carried was fetched again");
	/* Another NIC pair, or another peer, was not carried: that one is asked for. */
	cr_expect_eq(r2cc_mr_mirror_remote_rkey(&fake_dir, 1, "mlx5_0", m1.rkey, (uintptr_t)b1, 64,
						"mlx5_1", &got, 100),
		     0);
	cr_expect_eq(fetches, 1);
	struct r2cc_mr_mirror_stats st;
	r2cc_mr_mirror_get_stats(&st);
	cr_expect_eq(st.pushed, 2);
	cr_expect_eq(st.received, 2);

	/* Refused: truncated, padded, an "unchanged" reply, unknown NICs, bad ranks. */
	cr_expect_eq(
	    r2cc_mr_mirror_remote_store(&fake_dir, 0, "mlx5_0", "mlx5_1", cur, cur_len - 1),
	    -EPROTO);
	unsigned char same[24] = {R2CC_MR_MIRROR_VERSION, R2CC_MR_MIRROR_SAME};
	cr_expect_eq(
	    r2cc_mr_mirror_remote_store(&fake_dir, 0, "mlx5_0", "mlx5_1", same, sizeof(same)),
	    -EPROTO);
	cr_expect_eq(r2cc_mr_mirror_remote_store(&fake_dir, 2, "mlx5_0", "mlx5_1", cur, cur_len),
		     -EINVAL);
	unsigned char *none = NULL;
	size_t none_len = 0;
	cr_expect_eq(r2cc_mr_mirror_map_encode("mlx5_0", "mlx5_9", &none, &none_len), -ENODEV);
	cr_expect_null(none);
	free(old);
	free(cur);
}

/* The post path's translations (local keys, local rkeys, the peer's rkeys from
 * the cache) take no lock. */
Test(mirror, translations_take_no_lock)
{
	static char b1[64];
	struct ibv_mr m1 = nccl_mr(0xa1);
	reg(&m1, 0, b1, 64, 0);
	unsigned char *map = NULL;
	size_t len = 0;
	cr_assert_eq(r2cc_mr_mirror_map_encode("mlx5_0", "mlx5_1", &map, &len), 0);
	cr_assert_eq(r2cc_mr_mirror_remote_store(&fake_dir, 0, "mlx5_0", "mlx5_1", map, len), 0);
	free(map);
	uint32_t k;
	locks_taken = 0;
	cr_expect_eq(r2cc_mr_mirror_lkey(nic[0], 0xa1, nic[1], &k), 0);
	cr_expect_eq(r2cc_mr_mirror_rkey(nic[0], m1.rkey, nic[2], &k), 0);
	cr_expect_eq(r2cc_mr_mirror_remote_rkey(&fake_dir, 0, "mlx5_0", m1.rkey, (uintptr_t)b1, 64,
						"mlx5_1", &k, 0),
		     0);
	cr_expect_eq(
	    r2cc_mr_mirror_remote_rkey(&fake_dir, 0, "mlx5_0", 0x7777, 0, 8, "mlx5_1", &k, 0),
	    -EAGAIN, "the cache only, with no timeout: a miss is -EAGAIN, not a fetch");
	cr_expect_eq(locks_taken, 0, "%d mutex acquisitions in translations", locks_taken);
}

static atomic_bool churn_stop;
static uint32_t churn_lkey_want, churn_rkey_want, churn_rkey;
static char churn_b1[64], churn_b2[64];

static void *churn_reader(void *arg)
{
	(void)arg;
	long bad = 0;
	while (!atomic_load(&churn_stop)) {
		uint32_t k = 0;
		if (r2cc_mr_mirror_lkey(nic[0], 0xb1, nic[1], &k) || k != churn_lkey_want)
			bad++;
		int rc = r2cc_mr_mirror_lkey(nic[0], 0xb3, nic[2], &k);
		bad += rc && rc != -ENOENT;
		rc = r2cc_mr_mirror_remote_rkey(&fake_dir, 0, "mlx5_0", churn_rkey,
						(uintptr_t)churn_b1, 64, "mlx5_1", &k, 0);
		bad += rc ? rc != -EAGAIN : k != churn_rkey_want;
	}
	return (void *)bad;
}

/* Lock-free readers beside a writer that registers and deregisters another
 * buffer and replaces the peer's cached map, thousands of times: every
 * translation of the stable key is right, the churning one is found or not
 * (never an error or a crash; a freed group or map read here is what the
 * sanitizer builds would report). */
Test(mirror, translations_right_while_registrations_churn, .timeout = 60)
{
	struct ibv_mr m1 = nccl_mr(0xb1);
	reg(&m1, 0, churn_b1, 64, 0);
	cr_assert_eq(r2cc_mr_mirror_lkey(nic[0], 0xb1, nic[1], &churn_lkey_want), 0);
	cr_assert_eq(r2cc_mr_mirror_rkey(nic[0], m1.rkey, nic[1], &churn_rkey_want), 0);
	churn_rkey = m1.rkey;
	pthread_t th[2];
	for (int i = 0; i < 2; i++)
		cr_assert_eq(pthread_create(&th[i], NULL, churn_reader, NULL), 0);
	for (int i = 0; i < 3000; i++) {
		struct ibv_mr m2 = nccl_mr(0xb3);
		reg(&m2, 0, churn_b2, 64, 0);
		unsigned char *map = NULL;
		size_t len = 0;
		cr_assert_eq(r2cc_mr_mirror_map_encode("mlx5_0", "mlx5_1", &map, &len), 0);
		cr_assert_eq(
		    r2cc_mr_mirror_remote_store(&fake_dir, 0, "mlx5_0", "mlx5_1", map, len), 0);
		free(map);
		r2cc_mr_mirror_dereg(&m2);
		if (i % 500 == 250)
			r2cc_mr_mirror_remote_forget(fake_dir.job.id, 0);
	}
	atomic_store(&churn_stop, true);
	for (int i = 0; i < 2; i++) {
		void *bad;
		pthread_join(th[i], &bad);
		cr_expect_eq((long)bad, 0, "reader %d: %ld wrong translations", i, (long)bad);
	}
}

/* A registration a dead device refused (mlx5_0): a stand-in whose keys R2CC made,
 * none of mlx5_0's known ones, mirrored on the other NICs and translated both ways;
 * its dereg says it was virtual (the provider must not see it). */
Test(mirror, virtual_registration_translates_and_deregisters)
{
	static char b1[64], b2[128];
	struct ibv_mr real = nccl_mr(0xfe000001); /* a real key where virtual ones start */
	reg(&real, 0, b1, 64, 0);
	struct ibv_mr *v = r2cc_mr_mirror_reg_virtual(
	    &app_pd[0], &(struct r2cc_mr_mirror_src){
			    .kind = R2CC_MR_VA, .addr = b2, .len = sizeof(b2), .access = 0});
	cr_assert(v, "no virtual registration");
	cr_expect_eq(v->pd, &app_pd[0]);
	cr_expect_eq(v->addr, (void *)b2);
	cr_expect_eq(v->length, sizeof(b2));
	cr_expect_neq(v->lkey, real.lkey, "a virtual key equals a real one");
	uint32_t k, back;
	cr_expect_eq(r2cc_mr_mirror_lkey(nic[0], v->lkey, nic[1], &k), 0);
	cr_expect_eq(r2cc_mr_mirror_lkey(nic[1], k, nic[0], &back), 0);
	cr_expect_eq(back, v->lkey);
	cr_expect_eq(r2cc_mr_mirror_rkey(nic[0], v->rkey, nic[2], &k), 0);
	unsigned char *map = NULL;
	size_t len = 0;
	cr_assert_eq(r2cc_mr_mirror_map_encode("mlx5_0", "mlx5_1", &map, &len), 0);
	cr_expect_eq(len, 24 + 2 * R2CC_MR_MIRROR_ENTRY, "the peers' map lacks it");
	free(map);
	cr_expect(r2cc_mr_mirror_dereg(v), "its dereg did not say it was virtual");
	free(v);
	cr_expect_not(r2cc_mr_mirror_dereg(&real), "a real registration said virtual");
	cr_expect_eq(live_mirrors(), 0);
}
