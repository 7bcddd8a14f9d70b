/*
 * Writers of struct r2cc_map; readers are inline in map.h. A slot's key is
 * written before its value (release), so a reader that sees the value sees the
 * key. A removed slot becomes a tombstone and is reused by a later insert:
 * the new key is stored before the new value is published, so a reader that
 * sees the new value also sees the new key and never returns a value under a
 * foreign key.
 */
#include "shim/map.h"

#include <errno.h>
#include <stdlib.h>

int r2cc_map_init(struct r2cc_map *m, size_t capacity)
{
	size_t cap = 16;
	while (cap < capacity)
		cap <<= 1;
	m->slots = calloc(cap, sizeof(*m->slots));
	if (!m->slots)
		return -ENOMEM;
	m->mask = cap - 1;
	m->used = 0;
	pthread_mutex_init(&m->lock, NULL);
	return 0;
}

void r2cc_map_fini(struct r2cc_map *m)
{
	free(m->slots);
	m->slots = NULL;
	pthread_mutex_destroy(&m->lock);
}

int r2cc_map_insert(struct r2cc_map *m, uint64_t key, void *val)
{
	int rc = -ENOSPC;
	if (!val || val == R2CC_MAP_TOMBSTONE)
		return -EINVAL;
	pthread_mutex_lock(&m->lock);
	size_t reuse = (size_t)-1;
	for (size_t i = r2cc_map_hash(key) & m->mask, n = 0; n <= m->mask; i = (i + 1) & m->mask, n++) {
		void *v = m->slots[i].val;
		if (v == R2CC_MAP_TOMBSTONE) {
			if (reuse == (size_t)-1)
				reuse = i;
			continue;
		}
		if (!v) {
			/* Keep a 1/4 reserve of empty slots so probes stay short. */
			if (reuse == (size_t)-1 && (m->used + 1) * 4 > (m->mask + 1) * 3)
				break;
			size_t j = reuse != (size_t)-1 ? reuse : i;
			if (j == i)
				m->used++;
			__atomic_store_n(&m->slots[j].key, key, __ATOMIC_RELAXED);
			__atomic_store_n(&m->slots[j].val, val, __ATOMIC_RELEASE);
			rc = 0;
			break;
		}
		if (m->slots[i].key == key) {
			rc = -EEXIST;
			break;
		}
	}
	pthread_mutex_unlock(&m->lock);
	return rc;
}

void *r2cc_map_remove(struct r2cc_map *m, uint64_t key)
{
	void *out = NULL;
	pthread_mutex_lock(&m->lock);
	for (size_t i = r2cc_map_hash(key) & m->mask, n = 0; n <= m->mask; i = (i + 1) & m->mask, n++) {
		void *v = m->slots[i].val;
		if (!v)
			break;
		if (v != R2CC_MAP_TOMBSTONE && m->slots[i].key == key) {
			out = v;
			__atomic_store_n(&m->slots[i].val, R2CC_MAP_TOMBSTONE, __ATOMIC_RELEASE);
			break;
		}
	}
	pthread_mutex_unlock(&m->lock);
	return out;
}

int r2cc_map_for_each(struct r2cc_map *m, int (*fn)(void *val, void *arg), void *arg)
{
	int rc = 0;
	pthread_mutex_lock(&m->lock);
	for (size_t i = 0; i <= m->mask && !rc; i++) {
		void *v = m->slots[i].val;
		if (v && v != R2CC_MAP_TOMBSTONE)
			rc = fn(v, arg);
	}
	pthread_mutex_unlock(&m->lock);
	return rc;
}
