/*
 * Small definitions every part of R2CC uses: symbol export, branch hints,
 * the monotonic clock, a string hash.
 */
#ifndef R2CC_SHIM_COMMON_H
#define R2CC_SHIM_COMMON_H

#include <stdint.h>
#include <time.h>

/* Only interposed entry points and include/r2cc.h carry this. */
#define R2CC_EXPORT __attribute__((visibility("default")))

#define r2cc_likely(x)	 __builtin_expect(!!(x), 1)
#define r2cc_unlikely(x) __builtin_expect(!!(x), 0)

#define R2CC_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

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
