/* Registries: the lock-free map, MR lookups by address range, lkey and rkey,
 * QP lookups by object and number, and NIC records. */
#include "shim/map.h"
#include "shim/params.h"
#include "shim/registry.h"
#include "shim/stats.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

Test(map, insert_get_remove)
{
	struct r2cc_map m;
	cr_assert_eq(r2cc_map_init(&m, 64), 0);
	int vals[100];
	for (int i = 0; i < 40; i++)
		cr_expect_eq(r2cc_map_insert(&m, (uint64_t)i * 4096, &vals[i]), 0);
	cr_expect_eq(r2cc_map_insert(&m, 0, &vals[0]), -EEXIST);
	cr_expect_eq(r2cc_map_insert(&m, 5, NULL), -EINVAL);
	for (int i = 0; i < 40; i++)
		cr_expect_eq(r2cc_map_get(&m, (uint64_t)i * 4096), &vals[i]);
	cr_expect_null(r2cc_map_get(&m, 4096 * 41));
	for (int i = 0; i < 40; i += 2)
		cr_expect_eq(r2cc_map_remove(&m, (uint64_t)i * 4096), &vals[i]);
	cr_expect_null(r2cc_map_remove(&m, 0));
	for (int i = 0; i < 40; i++)
		cr_expect_eq(r2cc_map_get(&m, (uint64_t)i * 4096), i % 2 ? &vals[i] : NULL);
	r2cc_map_fini(&m);
}

Test(map, growth_and_tombstone_reuse)
{
	struct r2cc_map m;
	cr_assert_eq(r2cc_map_init(&m, 16), 0);
	int v[64];
	int n = 12;
	for (int i = 0; i < n; i++)
		cr_assert_eq(r2cc_map_insert(&m, (uint64_t)i + 1, &v[i]), 0);
	cr_expect_eq(m.t->mask + 1, 16, "12 entries fit in 16 slots");
	cr_expect_eq(r2cc_map_insert(&m, 1000, &v[50]), 0, "the table grows");
	cr_expect_eq(m.t->mask + 1, 32);
	cr_expect_eq(r2cc_map_remove(&m, 1000), &v[50]);
	/* Removing and inserting forever must neither exhaust nor keep growing it. */
	for (int round = 0; round < 1000; round++) {
		uint64_t k = (uint64_t)(round % n) + 1;
		cr_assert_not_null(r2cc_map_remove(&m, k));
		cr_assert_eq(r2cc_map_insert(&m, 5000 + (uint64_t)round, &v[round % n]), 0,
			     "round %d", round);
		cr_assert_not_null(r2cc_map_remove(&m, 5000 + (uint64_t)round));
		cr_assert_eq(r2cc_map_insert(&m, k, &v[round % n]), 0);
	}
	for (int i = 0; i < n; i++)
		cr_expect_eq(r2cc_map_get(&m, (uint64_t)i + 1), &v[i]);
	cr_expect_leq(m.t->mask + 1, 64, "churn rebuilt to %zu slots", m.t->mask + 1);
	r2cc_map_fini(&m);
}

Test(map, capacity_limit)
{
	struct r2cc_map m;
	cr_assert_eq(r2cc_map_init(&m, 16), 0);
	m.max_capacity = 32;
	int v;
	int n = 0;
	while (r2cc_map_insert(&m, (uint64_t)n + 1, &v) == 0)
		n++;
	cr_expect_eq(n, 24, "a 32-slot limit keeps a quarter free");
	cr_expect_eq(r2cc_map_insert(&m, 99999, &v), -ENOSPC);
	r2cc_map_fini(&m);
}

/* Readers never see a value under a foreign key while a writer churns. */
struct churn {
	struct r2cc_map *m;
	volatile int stop;
	long bad, seen;
};

static int churn_vals[256];

static void *reader(void *arg)
{
	struct churn *c = arg;
	while (!c->stop) {
		for (uint64_t k = 0; k < 256; k++) {
			int *v = r2cc_map_get(c->m, k);
			if (v) {
				c->seen++;
				if (v != &churn_vals[k])
					c->bad++;
			}
		}
	}
	return NULL;
}

Test(map, concurrent_readers)
{
	struct r2cc_map m;
	cr_assert_eq(r2cc_map_init(&m, 512), 0);
	struct churn c = {.m = &m};
	pthread_t t[2];
	for (int i = 0; i < 2; i++)
		pthread_create(&t[i], NULL, reader, &c);
	for (int round = 0; round < 20000; round++) {
		uint64_t k = (uint64_t)(round * 7) % 256;
		if (r2cc_map_get(&m, k))
			r2cc_map_remove(&m, k);
		else
			r2cc_map_insert(&m, k, &churn_vals[k]);
	}
	c.stop = 1;
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	cr_expect_eq(c.bad, 0, "%ld foreign values seen", c.bad);
	r2cc_map_fini(&m);
}

static void reg_setup(void)
{
	cr_assert_eq(r2cc_registry_init(), 0);
}

TestSuite(registry, .init = reg_setup);

Test(registry, nics)
{
	struct r2cc_nic *a = r2cc_nic_get("mlx5_0");
	struct r2cc_nic *b = r2cc_nic_get("mlx5_2");
	cr_assert_not_null(a);
	cr_assert_not_null(b);
	cr_expect_eq(r2cc_nic_get("mlx5_0"), a, "one record per physical NIC");
	cr_expect_eq(a->index, 0);
	cr_expect_eq(b->index, 1);
	cr_expect_eq(r2cc_nic_by_index(1), b);
	cr_expect_null(r2cc_nic_by_index(2));
	cr_expect_eq(r2cc_nic_count(), 2);
	a->cnt.tx_bytes = 1234;
	b->cnt.rx_bytes = 99;
	struct r2cc_nic_stat st[4];
	cr_expect_eq(r2cc_nic_stats(st, 4), 2);
	cr_expect_str_eq(st[0].name, "mlx5_0");
	cr_expect_eq(st[0].tx_bytes, 1234);
	cr_expect_eq(st[1].rx_bytes, 99);
	cr_expect_eq(r2cc_nic_stats(st, 1), 2, "count of all NICs even when truncated");
}

Test(registry, mr_lookups)
{
	struct r2cc_nic *n0 = r2cc_nic_get("n0");
	struct r2cc_nic *n1 = r2cc_nic_get("n1");
	/* Fake MR objects: only their addresses matter to the registry. */
	static struct ibv_mr mr[5];
	/* The same buffer registered on two NICs, as NCCL does, plus others. */
	cr_assert_not_null(r2cc_mr_add(&mr[0], n0, 0x10000, 0x1000, 11, 111, 0));
	cr_assert_not_null(r2cc_mr_add(&mr[1], n1, 0x10000, 0x1000, 21, 211, 0));
	cr_assert_not_null(r2cc_mr_add(&mr[2], n0, 0x40000, 0x100000, 12, 112, 0));
	cr_assert_not_null(r2cc_mr_add(&mr[3], n0, 0x20000, 0x10, 13, 113, 0));
	cr_assert_not_null(r2cc_mr_add(&mr[4], n1, 0x40100, 0x100, 22, 222, 0));
	cr_expect_eq(r2cc_mr_count(), 5);

	cr_expect_eq(r2cc_mr_by_addr(n0, 0x10000, 0x1000)->mr, &mr[0]);
	cr_expect_eq(r2cc_mr_by_addr(n1, 0x10800, 0x10)->mr, &mr[1]);
	cr_expect_null(r2cc_mr_by_addr(n0, 0x10800, 0x1000), "range runs past the MR");
	cr_expect_null(r2cc_mr_by_addr(n0, 0xffff, 2));
	cr_expect_eq(r2cc_mr_by_addr(n0, 0x20000, 0x10)->mr, &mr[3]);
	cr_expect_null(r2cc_mr_by_addr(n0, 0x20000, 0x11));
	/* A long MR that starts before a short one on another NIC. */
	cr_expect_eq(r2cc_mr_by_addr(n0, 0x40150, 0x10)->mr, &mr[2]);
	cr_expect_eq(r2cc_mr_by_addr(n1, 0x40150, 0x10)->mr, &mr[4]);
	cr_expect_eq(r2cc_mr_by_addr(n0, 0x13ffff, 1)->mr, &mr[2]);
	cr_expect_null(r2cc_mr_by_addr(n0, 0x140000, 1));
	cr_expect_not_null(r2cc_mr_by_addr(NULL, 0x10000, 4));
	cr_expect_null(r2cc_mr_by_addr(NULL, UINT64_MAX, 2), "wrapping range");

	cr_expect_eq(r2cc_mr_by_lkey(n0, 12)->mr, &mr[2]);
	cr_expect_eq(r2cc_mr_by_rkey(n1, 222)->mr, &mr[4]);
	cr_expect_null(r2cc_mr_by_lkey(n1, 12), "keys are per NIC");
	cr_expect_null(r2cc_mr_by_rkey(n0, 222));
	cr_expect_eq(r2cc_mr_find(&mr[3])->rkey, 113);

	r2cc_mr_remove(&mr[2]);
	cr_expect_null(r2cc_mr_by_addr(n0, 0x40150, 0x10));
	cr_expect_null(r2cc_mr_by_lkey(n0, 12));
	cr_expect_null(r2cc_mr_by_rkey(n0, 112));
	cr_expect_eq(r2cc_mr_by_addr(n1, 0x40150, 0x10)->mr, &mr[4]);
	cr_expect_eq(r2cc_mr_count(), 4);
}

Test(registry, many_mrs_sorted)
{
	struct r2cc_nic *n = r2cc_nic_get("many");
	static struct ibv_mr mr[2000];
	/* Insert in a scrambled order; every lookup must still find its MR. */
	for (int i = 0; i < 2000; i++) {
		int j = (i * 7919) % 2000;
		cr_assert_not_null(r2cc_mr_add(&mr[j], n, 0x100000 + (uint64_t)j * 0x2000, 0x1000,
					       (uint32_t)j + 1, (uint32_t)j + 5001, 0));
	}
	for (int j = 0; j < 2000; j++) {
		cr_assert_eq(r2cc_mr_by_addr(n, 0x100000 + (uint64_t)j * 0x2000 + 0x800, 0x800)->mr,
			     &mr[j]);
		cr_assert_null(r2cc_mr_by_addr(n, 0x100000 + (uint64_t)j * 0x2000 + 0x1000, 1));
		cr_assert_eq(r2cc_mr_by_lkey(n, (uint32_t)j + 1)->mr, &mr[j]);
	}
}

Test(registry, qps_and_cqs)
{
	struct r2cc_nic *n = r2cc_nic_get("q0");
	static struct ibv_context ctx;
	static struct ibv_cq cq;
	static struct ibv_qp qp[3];
	struct r2cc_ctx *c = r2cc_ctx_add(&ctx, n);
	cr_assert_not_null(c);
	cr_expect_eq(r2cc_ctx_find(&ctx), c);
	struct r2cc_cq *rcq = r2cc_cq_add(&cq, c, 512);
	cr_assert_not_null(rcq);
	cr_expect_eq(r2cc_cq_find(&cq), rcq);
	for (int i = 0; i < 3; i++)
		cr_assert_not_null(
		    r2cc_qp_add(&qp[i], c, rcq, rcq, 0x100u + (uint32_t)i, IBV_QPT_RC));
	cr_expect_eq(r2cc_qp_find(&qp[1])->qpn, 0x101);
	cr_expect_eq(r2cc_qp_by_num(n, 0x102)->qp, &qp[2]);
	cr_expect_eq(r2cc_qp_find(&qp[0])->state, IBV_QPS_RESET);
	cr_expect_eq(r2cc_qp_count(), 3);
	r2cc_qp_remove(&qp[1]);
	cr_expect_null(r2cc_qp_find(&qp[1]));
	cr_expect_null(r2cc_qp_by_num(n, 0x101));
	cr_expect_eq(r2cc_qp_count(), 2);
	/* Unlinked (a QP hot repair knows, whose record frees it later): no lookup finds
	 * it, the object keeps what it held until freed. */
	struct r2cc_qp *gone = r2cc_qp_unlink(&qp[2]);
	cr_assert_not_null(gone);
	cr_expect_null(r2cc_qp_find(&qp[2]));
	cr_expect_null(r2cc_qp_by_num(n, 0x102));
	cr_expect_eq(r2cc_qp_count(), 1);
	cr_expect_eq(gone->qpn, 0x102);
	cr_expect_null(r2cc_qp_unlink(&qp[2]));
	r2cc_qp_free(gone);
	r2cc_cq_remove(&cq);
	cr_expect_null(r2cc_cq_find(&cq));
	r2cc_ctx_remove(&ctx);
	cr_expect_null(r2cc_ctx_find(&ctx));
}

/*
 * The data path's own counts (registry.h, struct r2cc_fold): an owner thread adds
 * with plain stores, another thread's posts go to the NIC at once, a folder runs all
 * the while; the NIC's counters come out exact, and a record's removal folds what
 * was left. Only the owner writes its counts, so no add can be lost.
 */
struct fold_run {
	struct r2cc_qp *q;
	struct r2cc_cq *c;
	struct r2cc_nic *nic;
	volatile int stop;
};

#define FOLD_N 200000

static void *fold_owner(void *arg)
{
	struct fold_run *f = arg;
	for (int i = 0; i < FOLD_N; i++) {
		r2cc_count_own(&f->q->tx_wrs, 1);
		r2cc_count_own(&f->q->tx_bytes, 3);
		r2cc_count_own(&f->q->recv_wrs, 2);
		r2cc_count_own(&f->c->rx_wrs, 1);
		r2cc_count_own(&f->c->rx_bytes, 5);
		r2cc_count_own(&f->c->tx_cqes, 1);
	}
	return NULL;
}

static void *fold_other(void *arg)
{
	struct fold_run *f = arg;
	for (int i = 0; i < FOLD_N; i++) {
		r2cc_counter_add(&f->nic->cnt.tx_wrs, 1);
		r2cc_counter_add(&f->nic->cnt.tx_bytes, 7);
		r2cc_counter_add(&f->q->other_tx, 1);
	}
	return NULL;
}

static void *fold_folder(void *arg)
{
	struct fold_run *f = arg;
	while (!f->stop)
		r2cc_counters_fold();
	return NULL;
}

Test(registry, own_counts_fold_exactly)
{
	struct r2cc_nic *n = r2cc_nic_get("f0");
	static struct ibv_context ctx;
	static struct ibv_cq cq;
	static struct ibv_qp qp;
	struct r2cc_ctx *c = r2cc_ctx_add(&ctx, n);
	struct r2cc_cq *rcq = r2cc_cq_add(&cq, c, 64);
	struct r2cc_qp *q = r2cc_qp_add(&qp, c, rcq, rcq, 0x200, IBV_QPT_RC);
	cr_assert(c && rcq && q);
	cr_expect_not(r2cc_qp_sent(q) || r2cc_qp_received(q), "nothing posted yet");
	struct fold_run f = {.q = q, .c = rcq, .nic = n};
	pthread_t t[3];
	pthread_create(&t[0], NULL, fold_folder, &f);
	pthread_create(&t[1], NULL, fold_owner, &f);
	pthread_create(&t[2], NULL, fold_other, &f);
	pthread_join(t[1], NULL);
	pthread_join(t[2], NULL);
	f.stop = 1;
	pthread_join(t[0], NULL);
	cr_expect(r2cc_qp_sent(q) && r2cc_qp_received(q));

	struct r2cc_nic_stat st[16];
	int k = r2cc_nic_stats(st, 16);
	for (k = k - 1; k >= 0 && strcmp(st[k].name, "f0"); k--)
		;
	cr_assert_geq(k, 0);
	cr_expect_eq(st[k].tx_wrs, 2ull * FOLD_N);
	cr_expect_eq(st[k].tx_bytes, 10ull * FOLD_N);
	cr_expect_eq(st[k].rx_wrs, 1ull * FOLD_N);
	cr_expect_eq(st[k].rx_bytes, 5ull * FOLD_N);
	cr_expect_eq(n->cnt.recv_posted, 2ull * FOLD_N);
	cr_expect_eq(n->cnt.tx_cqes, 1ull * FOLD_N);

	/* counted after the last fold, then the records go: nothing is lost */
	r2cc_count_own(&q->tx_wrs, 4);
	r2cc_count_own(&rcq->tx_cqes, 6);
	r2cc_qp_remove(&qp);
	r2cc_cq_remove(&cq);
	r2cc_counters_fold();
	cr_expect_eq(n->cnt.tx_wrs, 2ull * FOLD_N + 4);
	cr_expect_eq(n->cnt.tx_cqes, 1ull * FOLD_N + 6);
	r2cc_ctx_remove(&ctx);
}

/* The NIC records live in the published page: a reader sees the counters the
 * data path updates, and the page goes away when the process unpublishes. */
Test(stats, published_page)
{
	setenv("R2CC_STATS", "1", 1);
	setenv("R2CC_DEBUG", "NONE", 1);
	cr_assert_eq(r2cc_params_load(), 0);
	cr_assert_eq(r2cc_registry_init(), 0);
	struct r2cc_nic *nic = r2cc_nic_get("pub0");
	cr_assert_not_null(nic);
	r2cc_counter_add(&nic->cnt.tx_bytes, 4096);
	char path[128];
	snprintf(path, sizeof(path), "/dev/shm/" R2CC_STATS_PREFIX "%d", (int)getpid());
	int fd = open(path, O_RDONLY);
	cr_assert(fd >= 0, "no page at %s", path);
	struct r2cc_stats_page *pg = mmap(NULL, sizeof(*pg), PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	cr_assert_neq(pg, MAP_FAILED);
	cr_expect_eq(pg->magic, R2CC_STATS_MAGIC);
	cr_expect_eq(pg->version, R2CC_STATS_VERSION);
	cr_expect_eq(pg->pid, getpid());
	cr_expect_eq(pg->nic_size, sizeof(struct r2cc_nic));
	cr_expect_eq(pg->nnics, 1);
	cr_expect_str_eq(pg->nics[0].name, "pub0");
	cr_expect_eq(pg->nics[0].cnt.tx_bytes, 4096);
	r2cc_counter_add(&nic->cnt.tx_bytes, 1);
	cr_expect_eq(pg->nics[0].cnt.tx_bytes, 4097, "the page is the live record");
	munmap(pg, sizeof(*pg));
	r2cc_stats_unpublish();
	cr_expect_neq(access(path, F_OK), 0, "page left behind");
}

Test(stats, off)
{
	/* The settings were read when the library's constructor ran; this is
	 * what R2CC_STATS=0 sets. */
	r2cc_params_load();
	r2cc_param.stats = false;
	cr_assert_eq(r2cc_registry_init(), 0);
	cr_assert_not_null(r2cc_nic_get("priv0"));
	cr_expect_null(r2cc_stats_page());
	char path[128];
	snprintf(path, sizeof(path), "/dev/shm/" R2CC_STATS_PREFIX "%d", (int)getpid());
	cr_expect_neq(access(path, F_OK), 0);
}

/*
 * The CQ gate's owner door against the closer (shim/registry.h): once
 * r2cc_cq_gate_close() returns, no poller is in the fast path again and each sees
 * the slow door at its next entry. A poller's `inside` changes only in the fast
 * path, with plain stores: a closer that returned while a poller was still inside
 * (for the owner, the store-load reordering the membarrier is there to rule out)
 * shows up as a count that moved after the close, and, under TSan, as a race.
 */
struct gate_poller {
	struct r2cc_cq_gate *g;
	long inside;	/* plain: only in the fast path */
	long progress;	/* atomic: entries so far */
	const void *me; /* the thread's r2cc_self() */
	int doors[3];	/* entries by door */
};

static void *gate_poll(void *arg)
{
	struct gate_poller *p = arg;
	p->me = r2cc_self();
	for (long n = 1;; n++) {
		int door = r2cc_cq_gate_enter(p->g);
		p->doors[door]++;
		if (door == R2CC_DOOR_SLOW)
			break;
		p->inside++;
		r2cc_cq_gate_exit(p->g, door);
		__atomic_store_n(&p->progress, n, __ATOMIC_RELAXED);
	}
	return NULL;
}

/* Right after a close returned: none of the n users moved on (`at_close`, their
 * counts then), now or before they ended, and each met the slow door once. */
static void gate_expect_stopped(struct gate_poller *p, pthread_t *t, int n, const long *at_close,
				int round)
{
	for (volatile int spin = 0; spin < 2000; spin++)
		;
	for (int k = 0; k < n; k++) {
		cr_assert_eq(p[k].inside, at_close[k],
			     "round %d: user %d in the fast path after the close", round, k);
		pthread_join(t[k], NULL);
		cr_assert_eq(p[k].inside, at_close[k], "round %d: user %d ran after the close",
			     round, k);
		cr_assert_eq(p[k].doors[R2CC_DOOR_SLOW], 1);
	}
}

/* One round: `n` pollers of one gate, closed once the first has entered
 * `wait_for` times; returns how many entered through the owner door. */
static int gate_round(int n, long wait_for, int round)
{
	struct r2cc_cq_gate g;
	struct gate_poller p[2];
	pthread_t t[2];
	memset(&g, 0, sizeof(g));
	memset(p, 0, sizeof(p));
	for (int k = 0; k < n; k++) {
		p[k].g = &g;
		cr_assert_eq(pthread_create(&t[k], NULL, gate_poll, &p[k]), 0);
		while (__atomic_load_n(&p[k].progress, __ATOMIC_RELAXED) < (k ? 1 : wait_for))
			;
	}
	r2cc_cq_gate_close(&g);
	long at_close[2] = {p[0].inside, p[1].inside};
	gate_expect_stopped(p, t, n, at_close, round);
	int solo = 0;
	for (int k = 0; k < n; k++)
		solo += p[k].doors[R2CC_DOOR_SOLO] > 0;
	if (r2cc_cq_gate_solo_ok) {
		cr_assert_eq(g.owner, p[0].me, "round %d: the first poller owns the door", round);
		cr_assert_eq(p[0].doors[R2CC_DOOR_SHARED], 1, "the claiming entry only");
		cr_assert_eq(p[0].doors[R2CC_DOOR_SOLO] + 1, p[0].progress);
		if (n > 1)
			cr_assert_eq(p[1].doors[R2CC_DOOR_SOLO], 0,
				     "a second poller counts itself in");
	} else {
		cr_assert_null(g.owner);
	}
	return solo;
}

Test(registry, cq_gate_owner_door_and_close)
{
	r2cc_cq_gate_init();
	unsigned seed = 7;
	int rounds = 3000, solo = 0;
	for (int i = 0; i < rounds; i++)
		solo += gate_round(1, 2 + rand_r(&seed) % 2000, i);
	if (r2cc_cq_gate_solo_ok)
		cr_assert_eq(solo, rounds);
	else
		cr_log_warn("membarrier(2) unavailable here: only the counting door was tested");
}

Test(registry, cq_gate_two_pollers)
{
	r2cc_cq_gate_init();
	unsigned seed = 11;
	for (int i = 0; i < 500; i++)
		gate_round(2, 2 + rand_r(&seed) % 500, i);
}

/* A QP's gate and its CQ's closed together (r2cc_cq_gates_close: one membarrier for
 * both), each with its owner inside: neither moves after the close returns. */
Test(registry, cq_gates_close_two_owners)
{
	r2cc_cq_gate_init();
	unsigned seed = 13;
	for (int i = 0; i < 1500; i++) {
		struct r2cc_cq_gate g[2];
		struct gate_poller p[2];
		pthread_t t[2];
		memset(g, 0, sizeof(g));
		memset(p, 0, sizeof(p));
		long wait_for = 2 + rand_r(&seed) % 1000;
		for (int k = 0; k < 2; k++) {
			p[k].g = &g[k];
			cr_assert_eq(pthread_create(&t[k], NULL, gate_poll, &p[k]), 0);
			while (__atomic_load_n(&p[k].progress, __ATOMIC_RELAXED) < wait_for)
				;
		}
		r2cc_cq_gates_close(&g[0], &g[1]);
		long at_close[2] = {p[0].inside, p[1].inside};
		gate_expect_stopped(p, t, 2, at_close, i);
		for (int k = 0; k < 2 && r2cc_cq_gate_solo_ok; k++)
			cr_assert_eq(g[k].owner, p[k].me, "round %d: each gate its owner", i);
	}
}
