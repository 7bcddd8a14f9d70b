/*
 * Small definitions every part of R2CC uses: symbol export, branch hints,
 * the monotonic clock, a string hash, and the library's error convention.
 */
#ifndef R2CC_SHIM_COMMON_H
#define R2CC_SHIM_COMMON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Only interposed entry points and include/r2cc.h carry this. */
#define R2CC_EXPORT __attribute__((visibility("default")))

#define r2cc_likely(x)	 __builtin_expect(!!(x), 1)
#define r2cc_unlikely(x) __builtin_expect(!!(x), 0)

#define R2CC_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* A counter only one thread adds to, with a plain load and store (no locked add); any
 * thread may read it at any time with a relaxed atomic load. The writer's own read need
 * not be atomic (no other thread writes it), which leaves the compiler free to keep it in
 * a register. */
static inline void r2cc_count_own(uint64_t *c, uint64_t v)
{
	__atomic_store_n(c, *c + v, __ATOMIC_RELAXED);
}

/* Zeroed memory that starts on a cache line, its size rounded up to whole lines
 * (aligned_alloc's contract); freed with free(). */
static inline void *r2cc_zalloc_lines(size_t size)
{
	size = size ? (size + 63) & ~(size_t)63 : 64;
	void *p = aligned_alloc(64, size);
	if (p)
		memset(p, 0, size);
	return p;
}

/* *p = max(*p, v), atomically; order is the memory order of the store that raises it. */
static inline void r2cc_atomic_max_i64(int64_t *p, int64_t v, int order)
{
	int64_t was = __atomic_load_n(p, __ATOMIC_RELAXED);
	while (was < v && !__atomic_compare_exchange_n(p, &was, v, false, order, __ATOMIC_RELAXED))
		;
}

/*
 * Errors. Inside R2CC a function returns 0 or a negative errno, and an error
 * handed to a function is a negative errno too; a predicate returns bool. Each
 * boundary converts once:
 *  - verbs: ibverbs' int-returning calls give a positive errno, pointer-returning
 *    ones NULL with errno set. A value from a real verbs call (a provider's op,
 *    the real ibv_* function, or errno after one) enters through
 *    r2cc_from_verbs(); a wrapper (intercept/verbs.c, and the drill's filters in
 *    repair/drill.c, which stand in for a provider's ops and keep their contract)
 *    hands R2CC's value to its caller through r2cc_to_verbs(). Both are a plain
 *    negation, so a provider's value reaches the caller as the provider gave it.
 *  - NCCL: the entry points in intercept/nccl.c return ncclResult_t.
 */
static inline int r2cc_from_verbs(int rc)
{
	return -rc;
}

static inline int r2cc_to_verbs(int rc)
{
	return -rc;
}

static inline uint64_t r2cc_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* FNV-1a of a NUL-terminated string: names that must map alike in every process
 * (node keys), not a defence against anyone choosing them. */
static inline uint32_t r2cc_hash32(const char *s)
{
	uint32_t h = 2166136261u;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h;
}

#endif
