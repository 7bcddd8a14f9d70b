/*
 * A map from 64-bit keys (object addresses, packed NIC/key pairs) to pointers,
 * for the lookups on R2CC's hot path: post/poll wrappers find their queue pair,
 * collectives find their communicator. Readers take no lock and make no system
 * call: open addressing with linear probing over a fixed-size table whose slots
 * are written with release stores. Writers (object creation and destruction,
 * never on the hot path) serialise on a mutex. Deleted slots become tombstones,
 * so a reader probing concurrently with a delete never stops early. When live
 * entries and tombstones fill three quarters of the table, the writer builds
 * a new table (twice as large if more than half of it is live) and publishes
 * it with one pointer store; a reader may still be probing the old one, so old
 * tables are retired, not freed, until r2cc_map_fini(). Growth stops at a
 * fixed maximum: beyond it an insert fails with -ENOSPC and the caller runs
 * that object as pass-through. A lookup returns a value only if the slot held
 * it under the key looked up (see r2cc_map_get()).
 */
#ifndef R2CC_SHIM_MAP_H
#define R2CC_SHIM_MAP_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

struct r2cc_map_slot {
	uint64_t seq; /* odd while a writer gives the slot a new key */
	uint64_t key;
	void *val; /* NULL: empty; R2CC_MAP_TOMBSTONE: deleted */
};

struct r2cc_map_table {
	size_t mask;			/* capacity - 1, capacity a power of two */
	struct r2cc_map_table *retired; /* older tables, freed at fini */
	struct r2cc_map_slot slots[];
};

struct r2cc_map {
	struct r2cc_map_table *t;
	size_t live, used; /* used: live + tombstones; writers only */
	size_t max_capacity;
	pthread_mutex_t lock;
	uint64_t gen; /* removals so far (a thread's cache of lookups holds while it stands) */
};

#define R2CC_MAP_TOMBSTONE ((void *)1)

int r2cc_map_init(struct r2cc_map *m, size_t capacity);
void r2cc_map_fini(struct r2cc_map *m);
/* 0, -EEXIST if the key is present, -ENOSPC if full, -EINVAL for a NULL value. */
int r2cc_map_insert(struct r2cc_map *m, uint64_t key, void *val);
/* The removed value, or NULL. */
void *r2cc_map_remove(struct r2cc_map *m, uint64_t key);

static inline uint64_t r2cc_map_hash(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdULL;
	k ^= k >> 33;
	k *= 0xc4ceb9fe1a85ec53ULL;
	k ^= k >> 33;
	return k;
}

/* Test builds define these to act between a reader's loads. */
#ifndef R2CC_MAP_TEST_RACE
#define R2CC_MAP_TEST_RACE(m, i) ((void)0)
#endif
#ifndef R2CC_MAP_TEST_RACE2
#define R2CC_MAP_TEST_RACE2(m, i) ((void)0)
#endif

/*
 * Lock-free lookup: the hot path. A slot's key changes only when an insert
 * takes an empty or deleted slot; that writer makes the slot's sequence odd,
 * stores key and value, and makes it even again (a sequence lock per slot). A
 * reader takes the key and value only if the sequence was even and unchanged
 * around its loads, so it never pairs a value with a foreign key, even when
 * the slot went to another key and back in between (an A-B-A reuse). A slot
 * being given a new key was empty or deleted, so the reader treats it so:
 * it waits for nothing. A remove changes only the value (to the tombstone).
 */
static inline void *r2cc_map_get(const struct r2cc_map *m, uint64_t key)
{
	const struct r2cc_map_table *t = __atomic_load_n(&m->t, __ATOMIC_ACQUIRE);
	if (!t)
		return NULL;
	const struct r2cc_map_slot *slots = t->slots;
	for (size_t i = r2cc_map_hash(key) & t->mask, n = 0; n <= t->mask;
	     i = (i + 1) & t->mask, n++) {
		uint64_t s;
		void *v;
	again:
		s = __atomic_load_n(&slots[i].seq, __ATOMIC_ACQUIRE);
		v = __atomic_load_n((void *const *)&slots[i].val, __ATOMIC_ACQUIRE);
		if (s & 1)
			continue; /* taking a new key: it was empty or deleted */
		if (!v)
			return NULL;
		if (v == R2CC_MAP_TOMBSTONE)
			continue;
		R2CC_MAP_TEST_RACE(m, i);
		uint64_t k = __atomic_load_n(&slots[i].key, __ATOMIC_RELAXED);
		R2CC_MAP_TEST_RACE2(m, i);
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		if (__atomic_load_n(&slots[i].seq, __ATOMIC_RELAXED) != s)
			goto again;
		if (k != key)
			continue;
		return v;
	}
	return NULL;
}

/*
 * A thread's cache of its lookups in one map (thread-local, initial-exec: the data
 * path's wrappers keep one per map they look up in; libr2cc.so is preloaded, so they
 * sit in the static TLS block): direct-mapped, R2CC_MAP_CACHE_WAYS entries. A value is
 * taken from it only while the map has had no removal since it was cached: a removed
 * key, and a new object at a freed one's address, are always looked up afresh. A
 * concurrent removal of the very key looked up races as the lookup itself does (the
 * object's owner destroys it while using it). A hit is about a dozen instructions, a
 * lookup in the map about 40, a miss 20 or so more: NCCL's proxy thread turns over tens
 * of QPs, hence 128 ways (its keys, heap addresses and QP numbers, spread over the
 * ways without collisions while there are fewer than that; past it, they take turns
 * missing). 2 KiB a map and thread.
 */
#define R2CC_MAP_CACHE_BITS 7
#define R2CC_MAP_CACHE_WAYS (1 << R2CC_MAP_CACHE_BITS)

struct r2cc_map_cache {
	uint64_t gen;
	struct {
		uint64_t key;
		void *val; /* NULL: nothing cached in that way */
	} way[R2CC_MAP_CACHE_WAYS];
};

static inline unsigned r2cc_map_cache_way(uint64_t key)
{
	return (unsigned)((key * 0x9e3779b97f4a7c15ULL) >> (64 - R2CC_MAP_CACHE_BITS));
}

/* The cache alone: the value of a hit, NULL on a miss (then r2cc_map_get_miss). */
static inline void *r2cc_map_peek_cached(const struct r2cc_map *m, const struct r2cc_map_cache *c,
					 uint64_t key)
{
	uint64_t g = __atomic_load_n(&m->gen, __ATOMIC_ACQUIRE);
	unsigned w = r2cc_map_cache_way(key);
	return c->gen == g && c->way[w].key == key ? c->way[w].val : NULL;
}

/* A miss: the lookup in the map, kept in the cache (out of line: the wrappers' hit
 * path keeps fewer registers live, and so saves and restores fewer of them a call). */
void *r2cc_map_get_miss(const struct r2cc_map *m, struct r2cc_map_cache *c, uint64_t key);

static inline void *r2cc_map_get_cached(const struct r2cc_map *m, struct r2cc_map_cache *c,
					uint64_t key)
{
	void *v = r2cc_map_peek_cached(m, c, key);
	return __builtin_expect(v != NULL, 1) ? v : r2cc_map_get_miss(m, c, key);
}

#endif
