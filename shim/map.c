/*
 * Writers of struct r2cc_map; readers are inline in map.h. An insert gives its
 * slot the new key under the slot's sequence lock: sequence odd, key and
 * value stored, sequence even (release). A remove stores the tombstone in the
 * value only. A reader that overlapped a key change sees the sequence move
 * and reads the slot again (r2cc_map_get()), so it never returns a value
 * under a foreign key. Rebuilt tables are published whole; retired ones stay
 * mapped.
 */
#include "shim/map.h"

#include <errno.h>
#include <stdlib.h>

#define MAP_MAX_CAPACITY (1u << 22)

static struct r2cc_map_table *table_new(size_t cap)
{
	struct r2cc_map_table *t = calloc(1, sizeof(*t) + cap * sizeof(t->slots[0]));
	if (t)
		t->mask = cap - 1;
	return t;
}

int r2cc_map_init(struct r2cc_map *m, size_t capacity)
{
	size_t cap = 16;
	while (cap < capacity)
		cap <<= 1;
	m->t = table_new(cap);
	if (!m->t)
		return -ENOMEM;
	m->live = m->used = 0;
	m->max_capacity = cap > MAP_MAX_CAPACITY ? cap : MAP_MAX_CAPACITY;
	pthread_mutex_init(&m->lock, NULL);
	return 0;
}

void r2cc_map_fini(struct r2cc_map *m)
{
	struct r2cc_map_table *t = m->t;
	while (t) {
		struct r2cc_map_table *next = t->retired;
		free(t);
		t = next;
	}
	m->t = NULL;
	__atomic_fetch_add(&m->gen, 1, __ATOMIC_RELEASE); /* nothing cached holds past it */
	pthread_mutex_destroy(&m->lock);
}

/* Place key in a table known to have room and no such key. */
static void table_put(struct r2cc_map_table *t, uint64_t key, void *val)
{
	size_t i = r2cc_map_hash(key) & t->mask;
	while (t->slots[i].val)
		i = (i + 1) & t->mask;
	t->slots[i].key = key;
	t->slots[i].val = val;
}

/* Rebuild without tombstones, larger if needed; under the writer lock. */
static int rebuild(struct r2cc_map *m)
{
	struct r2cc_map_table *old = m->t;
	size_t cap = old->mask + 1;
	if (m->live * 2 >= cap)
		cap *= 2;
	if (cap > m->max_capacity)
		return -ENOSPC;
	struct r2cc_map_table *t = table_new(cap);
	if (!t)
		return -ENOMEM;
	for (size_t i = 0; i <= old->mask; i++) {
		void *v = old->slots[i].val;
		if (v && v != R2CC_MAP_TOMBSTONE)
			table_put(t, old->slots[i].key, v);
	}
	t->retired = old;
	m->used = m->live;
	__atomic_store_n(&m->t, t, __ATOMIC_RELEASE);
	return 0;
}

int r2cc_map_insert(struct r2cc_map *m, uint64_t key, void *val)
{
	int rc = 0;
	if (!val || val == R2CC_MAP_TOMBSTONE)
		return -EINVAL;
	pthread_mutex_lock(&m->lock);
	for (;;) {
		struct r2cc_map_table *t = m->t;
		size_t reuse = (size_t)-1, empty = (size_t)-1;
		for (size_t i = r2cc_map_hash(key) & t->mask, n = 0; n <= t->mask;
		     i = (i + 1) & t->mask, n++) {
			void *v = t->slots[i].val;
			if (v == R2CC_MAP_TOMBSTONE) {
				if (reuse == (size_t)-1)
					reuse = i;
			} else if (!v) {
				empty = i;
				break;
			} else if (t->slots[i].key == key) {
				rc = -EEXIST;
				break;
			}
		}
		if (rc)
			break;
		size_t at = reuse;
		if (at == (size_t)-1) {
			/* Keep a quarter of the slots empty so probes stay short. */
			if (empty == (size_t)-1 || (m->used + 1) * 4 > (t->mask + 1) * 3) {
				rc = rebuild(m);
				if (rc)
					break;
				continue;
			}
			at = empty;
			m->used++;
		}
		struct r2cc_map_slot *sl = &t->slots[at];
		uint64_t seq = sl->seq;
		__atomic_store_n(&sl->seq, seq + 1, __ATOMIC_RELAXED);
		__atomic_thread_fence(__ATOMIC_RELEASE);
		__atomic_store_n(&sl->key, key, __ATOMIC_RELAXED);
		__atomic_store_n(&sl->val, val, __ATOMIC_RELEASE);
		__atomic_store_n(&sl->seq, seq + 2, __ATOMIC_RELEASE);
		m->live++;
		break;
	}
	pthread_mutex_unlock(&m->lock);
	return rc;
}

void *r2cc_map_remove(struct r2cc_map *m, uint64_t key)
{
	void *out = NULL;
	pthread_mutex_lock(&m->lock);
	struct r2cc_map_table *t = m->t;
	for (size_t i = r2cc_map_hash(key) & t->mask, n = 0; n <= t->mask;
	     i = (i + 1) & t->mask, n++) {
		void *v = t->slots[i].val;
		if (!v)
			break;
		if (v != R2CC_MAP_TOMBSTONE && t->slots[i].key == key) {
			out = v;
			__atomic_store_n(&t->slots[i].val, R2CC_MAP_TOMBSTONE, __ATOMIC_RELEASE);
			/* after the tombstone: a cache that sees the new count looks it up */
			__atomic_fetch_add(&m->gen, 1, __ATOMIC_RELEASE);
			m->live--;
			break;
		}
	}
	pthread_mutex_unlock(&m->lock);
	return out;
}

__attribute__((noinline)) void *r2cc_map_get_miss(const struct r2cc_map *m,
						  struct r2cc_map_cache *c, uint64_t key)
{
	/* the count before the lookup: a removal after it makes the cache look again */
	uint64_t gen = __atomic_load_n(&m->gen, __ATOMIC_ACQUIRE);
	unsigned w = r2cc_map_cache_way(key);
	if (c->gen != gen) {
		for (int i = 0; i < R2CC_MAP_CACHE_WAYS; i++)
			c->way[i].val = NULL;
		c->gen = gen;
	}
	void *v = r2cc_map_get(m, key);
	if (v) {
		c->way[w].key = key;
		c->way[w].val = v;
	}
	return v;
}
