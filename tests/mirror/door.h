/*
 * The test door of libr2cc-door.so (door.c): the MR mirror's functions, by
 * NIC name, for programs running under that preload (found with dlsym).
 * Return 0 or a negative errno value, as the functions they call.
 */
#ifndef R2CC_TESTS_MIRROR_DOOR_H
#define R2CC_TESTS_MIRROR_DOOR_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

int r2cc_test_join(const unsigned char id[128], int rank, int nranks, int timeout_ms);
int r2cc_test_lkey(const char *from, uint32_t lkey, const char *to, uint32_t *out);
int r2cc_test_local_rkey(const char *from, uint32_t rkey, const char *to, uint32_t *out);
int r2cc_test_remote_rkey(int peer, const char *from, uint32_t rkey, uint64_t addr, uint64_t len,
			  const char *to, uint32_t *out, int timeout_ms);
int r2cc_test_refresh(int peer, const char *from, const char *to, int timeout_ms);
struct ibv_pd *r2cc_test_pd(const char *nic);
void r2cc_test_stats(uint64_t out[10]);
int r2cc_test_raw(int peer, const void *payload, size_t len, int timeout_ms);
int r2cc_test_forged(int peer);

#endif
