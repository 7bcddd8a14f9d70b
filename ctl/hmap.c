/*
 * struct r2cc_hmap (see hmap.h). Deletion shifts the following entries of the
 * probe run back into the hole, so lookups never meet a tombstone and stop at
 * the first empty slot.
 */
#include "ctl/hmap.h"

#include <errno.h>
#include <stdlib.h>

static uint64_t mix(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdULL;
	k ^= k >> 33;
	k *= 0xc4ceb9fe1a85ec53ULL;
	k ^= k >> 33;
	return k;
}

uint64_t r2cc_hmap_hash_bytes(const void *p, size_t len)
{
	const unsigned char *b = p;
	uint64_t h = 0xcbf29ce484222325ULL;
	for (size_t i = 0; i < len; i++) {
		h ^= b[i];
		h *= 0x100000001b3ULL;
	}
	return mix(h);
}

static size_t slot_of(const struct r2cc_hmap *h, uint64_t key)
{
	return (size_t)mix(key) & (h->cap - 1);
}

static int grow(struct r2cc_hmap *h)
{
	size_t cap = h->cap ? 2 * h->cap : 16;
	uint64_t *keys = calloc(cap, sizeof(*keys));
	void **vals = calloc(cap, sizeof(*vals));
	if (!keys || !vals) {
		free(keys);
		free(vals);
		return -ENOMEM;
	}
	struct r2cc_hmap n = {keys, vals, cap, 0};
	for (size_t i = 0; i < h->cap; i++) {
		if (!h->vals[i])
			continue;
		size_t s = slot_of(&n, h->keys[i]);
		while (n.vals[s])
			s = (s + 1) & (cap - 1);
		n.keys[s] = h->keys[i];
		n.vals[s] = h->vals[i];
		n.count++;
	}
	free(h->keys);
	free(h->vals);
	*h = n;
	return 0;
}

int r2cc_hmap_put(struct r2cc_hmap *h, uint64_t key, void *val)
{
	if (!val)
		return -EINVAL;
	if ((h->count + 1) * 4 > h->cap * 3 && grow(h))
		return -ENOMEM;
	size_t s = slot_of(h, key);
	while (h->vals[s] && h->keys[s] != key)
		s = (s + 1) & (h->cap - 1);
	if (!h->vals[s])
		h->count++;
	h->keys[s] = key;
	h->vals[s] = val;
	return 0;
}

void *r2cc_hmap_get(const struct r2cc_hmap *h, uint64_t key)
{
	if (!h->cap)
		return NULL;
	for (size_t s = slot_of(h, key); h->vals[s]; s = (s + 1) & (h->cap - 1))
		if (h->keys[s] == key)
			return h->vals[s];
	return NULL;
}

void *r2cc_hmap_del(struct r2cc_hmap *h, uint64_t key)
{
	if (!h->cap)
		return NULL;
	size_t mask = h->cap - 1, s = slot_of(h, key);
	while (h->vals[s] && h->keys[s] != key)
		s = (s + 1) & mask;
	void *val = h->vals[s];
	if (!val)
		return NULL;
	/* Pull back every later entry of the run that may sit in the hole. */
	size_t hole = s;
	for (size_t j = (s + 1) & mask; h->vals[j]; j = (j + 1) & mask) {
		size_t home = slot_of(h, h->keys[j]);
		if (((j - home) & mask) >= ((j - hole) & mask)) {
			h->keys[hole] = h->keys[j];
			h->vals[hole] = h->vals[j];
			hole = j;
		}
	}
	h->vals[hole] = NULL;
	h->count--;
	return val;
}

void r2cc_hmap_free(struct r2cc_hmap *h)
{
	free(h->keys);
	free(h->vals);
	*h = (struct r2cc_hmap){0};
}

size_t r2cc_hmap_bytes(const struct r2cc_hmap *h)
{
	return h->cap * (sizeof(*h->keys) + sizeof(*h->vals));
}
