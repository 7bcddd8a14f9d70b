/*
 * Logging. One line per event, with NCCL's prefix shape
 * ("host:pid:tid [dev] R2CC INFO ..."), levels from R2CC_DEBUG (WARN, INFO,
 * TRACE), output to stderr or R2CC_DEBUG_FILE. The level is checked before any
 * formatting, so a disabled log statement costs one load and one compare;
 * errno is preserved across every call. Data-path trace statements use
 * R2CC_DTRACE, which compiles to nothing unless R2CC_DATAPATH_TRACE is defined.
 */
#ifndef R2CC_SHIM_LOG_H
#define R2CC_SHIM_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

enum r2cc_log_level {
	R2CC_LOG_NONE = 0,
	R2CC_LOG_WARN = 1,
	R2CC_LOG_INFO = 2,
	R2CC_LOG_TRACE = 3,
};

/* Current level; written once by r2cc_log_init(), read everywhere. */
extern int r2cc_log_level;

void r2cc_log_init(void);
void r2cc_log_set_level(int level);
/* Redirect output (tests); NULL restores stderr. */
void r2cc_log_set_stream(void *file);
void r2cc_log_write(int level, int dev, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A file name with %h (short host name) and %p (pid) expanded, as in
 * NCCL_DEBUG_FILE; writes at most len bytes into path and returns it. */
const char *r2cc_path_expand(const char *pattern, char *path, size_t len);
/* Fatal internal problem: log with a backtrace (libunwind), never abort. */
void r2cc_log_backtrace(const char *why);

#define R2CC_LOG_AT(lvl, dev, ...)                                                                 \
	do {                                                                                       \
		if (__builtin_expect(r2cc_log_level >= (lvl), 0))                                  \
			r2cc_log_write((lvl), (dev), __VA_ARGS__);                                 \
	} while (0)

#define R2CC_WARN(...)	R2CC_LOG_AT(R2CC_LOG_WARN, -1, __VA_ARGS__)
#define R2CC_INFO(...)	R2CC_LOG_AT(R2CC_LOG_INFO, -1, __VA_ARGS__)
#define R2CC_TRACE(...) R2CC_LOG_AT(R2CC_LOG_TRACE, -1, __VA_ARGS__)
/* With the CUDA device (or NIC index) shown in the prefix. */
#define R2CC_WARN_DEV(dev, ...) R2CC_LOG_AT(R2CC_LOG_WARN, (dev), __VA_ARGS__)
#define R2CC_INFO_DEV(dev, ...) R2CC_LOG_AT(R2CC_LOG_INFO, (dev), __VA_ARGS__)

/* Warn at most once per call site. */
#define R2CC_WARN_ONCE(...)                                                                        \
	do {                                                                                       \
		static int r2cc_warned_;                                                           \
		if (!__atomic_exchange_n(&r2cc_warned_, 1, __ATOMIC_RELAXED))                      \
			R2CC_WARN(__VA_ARGS__);                                                    \
	} while (0)

#ifdef R2CC_DATAPATH_TRACE
#define R2CC_DTRACE(...) R2CC_TRACE(__VA_ARGS__)
#else
#define R2CC_DTRACE(...)                                                                           \
	do {                                                                                       \
	} while (0)
#endif

#endif
