/*
 * A plain hash map from 64-bit keys to pointers for the control plane and the
 * peer index: connections by id, outgoing connections by address, waiting
 * requests by id, directory members by rank, the rendezvous' NIC index. Open
 * addressing with linear probing and backward-shift deletion (no tombstones,
 * so a map that sees constant insert/delete churn never degrades), doubled at
 * three quarters full. Not thread-safe: every user holds its own lock or
 * touches the map from one thread. Keys that are hashes of something longer
 * (addresses, node keys) may collide: such users compare the value they get
 * and keep a fallback for the rare collision.
 */
#ifndef R2CC_REPAIR_HMAP_H
#define R2CC_REPAIR_HMAP_H

#include <stddef.h>
#include <stdint.h>

struct r2cc_hmap {
	uint64_t *keys;
	void **vals; /* NULL: empty slot */
	size_t cap;  /* 0 or a power of two */
	size_t count;
};

/* 0, or -ENOMEM (the map is unchanged). A present key gets the new value. */
int r2cc_hmap_put(struct r2cc_hmap *h, uint64_t key, void *val);
void *r2cc_hmap_get(const struct r2cc_hmap *h, uint64_t key);
/* The removed value, or NULL. */
void *r2cc_hmap_del(struct r2cc_hmap *h, uint64_t key);
/* Frees the table, not the values. */
void r2cc_hmap_free(struct r2cc_hmap *h);
/* Bytes the table takes. */
size_t r2cc_hmap_bytes(const struct r2cc_hmap *h);

/* FNV-1a over bytes, finished with a mixer: keys for r2cc_hmap from strings and
 * addresses. */
uint64_t r2cc_hmap_hash_bytes(const void *p, size_t len);

#endif
