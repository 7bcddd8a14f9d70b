/*
 * The lock-free map's readers against a writer that reuses a slot for another
 * key. The deterministic test runs the writer between a reader's loads (the
 * R2CC_MAP_TEST_RACE hook of shim/map.h); the stress test does the same with
 * real threads, keys chosen to share one slot.
 */
#include <stddef.h>
#include <stdint.h>

struct r2cc_map;
static void map_race(const struct r2cc_map *m, size_t slot);
static void map_race2(const struct r2cc_map *m, size_t slot);
#define R2CC_MAP_TEST_RACE(m, i)  map_race((m), (i))
#define R2CC_MAP_TEST_RACE2(m, i) map_race2((m), (i))

#include "shim/map.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <time.h>

#include "tests/common/util.h"

static int va, vb;
static uint64_t key_a = 1, key_b;
static int armed, armed2;

/* Once armed: A leaves its slot and B takes it, between the reader's loads. */
static void map_race(const struct r2cc_map *m, size_t slot)
{
	if (!armed)
		return;
	armed = 0;
	struct r2cc_map *w = (struct r2cc_map *)m;
	cr_assert_eq(r2cc_map_remove(w, key_a), &va);
	cr_assert_eq(r2cc_map_insert(w, key_b, &vb), 0);
	cr_assert_eq(w->t->slots[slot].key, key_b, "B reuses A's slot");
}

/* Once armed: B leaves the slot and A takes it back, after the reader's key load. */
static void map_race2(const struct r2cc_map *m, size_t slot)
{
	if (!armed2)
		return;
	armed2 = 0;
	struct r2cc_map *w = (struct r2cc_map *)m;
	cr_assert_eq(r2cc_map_remove(w, key_b), &vb);
	cr_assert_eq(r2cc_map_insert(w, key_a, &va), 0);
	cr_assert_eq(w->t->slots[slot].key, key_a, "A takes its slot back");
}

/* A key other than key_a whose probe starts in key_a's slot of a table of cap slots. */
static uint64_t same_slot_key(size_t cap)
{
	uint64_t k = key_a + 1;
	while ((r2cc_map_hash(k) & (cap - 1)) != (r2cc_map_hash(key_a) & (cap - 1)))
		k++;
	return k;
}

Test(map_race, value_of_previous_key_never_returned)
{
	struct r2cc_map m;
	cr_assert_eq(r2cc_map_init(&m, 16), 0);
	key_b = same_slot_key(m.t->mask + 1);
	cr_assert_eq(r2cc_map_insert(&m, key_a, &va), 0);
	armed = 1;
	void *got = r2cc_map_get(&m, key_b);
	cr_expect_eq(armed, 0, "the writer ran inside the lookup");
	cr_expect_neq(got, &va, "A's value returned under key B");
	cr_expect_eq(got, &vb);
	r2cc_map_fini(&m);
}

Test(map_race, key_that_left_is_not_found_with_the_new_value)
{
	struct r2cc_map m;
	cr_assert_eq(r2cc_map_init(&m, 16), 0);
	key_b = same_slot_key(m.t->mask + 1);
	cr_assert_eq(r2cc_map_insert(&m, key_a, &va), 0);
	armed = 1;
	void *got = r2cc_map_get(&m, key_a);
	cr_expect_eq(armed, 0);
	cr_expect(got == NULL || got == &va, "B's value returned under key A");
	r2cc_map_fini(&m);
}

/* A, then B, then A again in one slot while a reader looks up B: the value it
 * read first is A's again when it looks a second time, but the key it read was B's. */
Test(map_race, slot_reused_and_given_back_aba)
{
	struct r2cc_map m;
	cr_assert_eq(r2cc_map_init(&m, 16), 0);
	key_b = same_slot_key(m.t->mask + 1);
	cr_assert_eq(r2cc_map_insert(&m, key_a, &va), 0);
	armed = armed2 = 1;
	void *got = r2cc_map_get(&m, key_b);
	cr_expect_eq(armed + armed2, 0, "both writers ran inside the lookup");
	cr_expect_neq(got, &va, "A's value returned under key B");
	cr_expect_null(got, "B was removed before the lookup ended");
	r2cc_map_fini(&m);
}

struct stress {
	struct r2cc_map *m;
	int stop;
	long wrong;
	long hits;
};

static void *stress_reader(void *arg)
{
	struct stress *s = arg;
	while (!__atomic_load_n(&s->stop, __ATOMIC_RELAXED)) {
		void *a = r2cc_map_get(s->m, key_a), *b = r2cc_map_get(s->m, key_b);
		if ((a && a != &va) || (b && b != &vb))
			__atomic_fetch_add(&s->wrong, 1, __ATOMIC_RELAXED);
		if (a || b)
			__atomic_fetch_add(&s->hits, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

/* Two keys take turns in one slot for a second while two threads read both. */
Test(map_race, stress_same_slot)
{
	struct r2cc_map m;
	cr_assert_eq(r2cc_map_init(&m, 16), 0);
	key_b = same_slot_key(m.t->mask + 1);
	struct stress s = {.m = &m};
	pthread_t t[2];
	for (int i = 0; i < 2; i++)
		cr_assert_eq(pthread_create(&t[i], NULL, stress_reader, &s), 0);
	/* A second at least, and until the readers have seen values a thousand times
	 * (on a loaded machine they may not run at first), 20 s at most. */
	double t0 = now_s(), dt;
	do {
		for (int k = 0; k < 1000; k++) {
			r2cc_map_insert(&m, key_a, &va);
			r2cc_map_remove(&m, key_a);
			r2cc_map_insert(&m, key_b, &vb);
			r2cc_map_remove(&m, key_b);
		}
		dt = now_s() - t0;
	} while (dt < 20 && (dt < 1 || __atomic_load_n(&s.hits, __ATOMIC_RELAXED) < 1000));
	__atomic_store_n(&s.stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	cr_expect_eq(s.wrong, 0, "%ld lookups returned the other key's value (%ld hits)", s.wrong,
		     s.hits);
	cr_expect_geq(s.hits, 1000, "the readers ran");
	r2cc_map_fini(&m);
}

Test(map_cache, hits_until_a_removal_then_looks_up_afresh)
{
	struct r2cc_map m;
	cr_assert_eq(r2cc_map_init(&m, 16), 0);
	struct r2cc_map_cache c = {0};
	int a, b, other;
	const uint64_t k = 0x7f00deadbee0, k2 = 0x7f00deadbf00;
	cr_assert_null(r2cc_map_get_cached(&m, &c, k)); /* a miss is never cached */
	cr_assert_eq(r2cc_map_insert(&m, k, &a), 0);
	cr_assert_eq(r2cc_map_get_cached(&m, &c, k), &a);
	cr_assert_eq(r2cc_map_insert(&m, k2, &other), 0);
	cr_assert_eq(r2cc_map_get_cached(&m, &c, k2), &other);
	cr_assert_eq(r2cc_map_get_cached(&m, &c, k), &a);
	/* The object at k goes and a new one comes at the same address: the cache must
	 * not hand out the old one, nor keep a removed key. */
	cr_assert_eq(r2cc_map_remove(&m, k), &a);
	cr_assert_null(r2cc_map_get_cached(&m, &c, k));
	cr_assert_eq(r2cc_map_insert(&m, k, &b), 0);
	cr_assert_eq(r2cc_map_get_cached(&m, &c, k), &b);
	/* A removal of another key also ends what was cached before it. */
	cr_assert_eq(r2cc_map_remove(&m, k2), &other);
	cr_assert_null(r2cc_map_get_cached(&m, &c, k2));
	cr_assert_eq(r2cc_map_get_cached(&m, &c, k), &b);
	/* Many keys through four ways: every answer is the map's. */
	int vals[64];
	for (int i = 0; i < 64; i++)
		cr_assert_eq(r2cc_map_insert(&m, 0x1000 + 16 * (uint64_t)i, &vals[i]), 0);
	for (int round = 0; round < 3; round++)
		for (int i = 0; i < 64; i++)
			cr_assert_eq(r2cc_map_get_cached(&m, &c, 0x1000 + 16 * (uint64_t)i),
				     &vals[i]);
	r2cc_map_fini(&m);
}
