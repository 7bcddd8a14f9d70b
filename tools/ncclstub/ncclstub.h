/*
 * The NCCL test double's call log. libnccl.so.2 built from ncclstub.c exports NCCL's API
 * (weak ncclX, strong pncclX, as real NCCL does) and, next to it, these ncclstub_ functions:
 * every call into the API appends one record with every argument, what the stub read through
 * pointer arguments (unique ids, configs, int lists) and what it wrote back, so that a test
 * can prove that a preloaded wrapper passed a call through unchanged. See README.md.
 */
#ifndef NCCLSTUB_H
#define NCCLSTUB_H

#include <stddef.h>
#include <stdint.h>
#include <nccl.h>

/* NCCL's API in nccl.h (2.28) order; OLD marks functions that NCCL 2.18 does not have. */
#define NCCLSTUB_FUNCS(X, OLD)                                                                     \
	OLD(ncclMemAlloc)                                                                          \
	OLD(ncclMemFree)                                                                           \
	X(ncclGetVersion)                                                                          \
	X(ncclGetUniqueId)                                                                         \
	X(ncclCommInitRankConfig)                                                                  \
	X(ncclCommInitRank)                                                                        \
	X(ncclCommInitAll)                                                                         \
	X(ncclCommFinalize)                                                                        \
	X(ncclCommDestroy)                                                                         \
	X(ncclCommAbort)                                                                           \
	OLD(ncclCommRevoke)                                                                        \
	X(ncclCommSplit)                                                                           \
	OLD(ncclCommShrink)                                                                        \
	OLD(ncclCommInitRankScalable)                                                              \
	X(ncclGetErrorString)                                                                      \
	X(ncclGetLastError)                                                                        \
	X(ncclCommGetAsyncError)                                                                   \
	X(ncclCommCount)                                                                           \
	X(ncclCommCuDevice)                                                                        \
	X(ncclCommUserRank)                                                                        \
	OLD(ncclCommRegister)                                                                      \
	OLD(ncclCommDeregister)                                                                    \
	OLD(ncclCommWindowRegister)                                                                \
	OLD(ncclCommWindowDeregister)                                                              \
	X(ncclRedOpCreatePreMulSum)                                                                \
	X(ncclRedOpDestroy)                                                                        \
	X(ncclReduce)                                                                              \
	X(ncclBcast)                                                                               \
	X(ncclBroadcast)                                                                           \
	X(ncclAllReduce)                                                                           \
	X(ncclReduceScatter)                                                                       \
	X(ncclAllGather)                                                                           \
	OLD(ncclAlltoAll)                                                                          \
	OLD(ncclGather)                                                                            \
	OLD(ncclScatter)                                                                           \
	X(ncclSend)                                                                                \
	X(ncclRecv)                                                                                \
	X(ncclGroupStart)                                                                          \
	X(ncclGroupEnd)                                                                            \
	OLD(ncclGroupSimulateEnd)

enum ncclstub_fn {
#define NCCLSTUB_ENUM(name) NCCLSTUB_##name,
	NCCLSTUB_FUNCS(NCCLSTUB_ENUM, NCCLSTUB_ENUM)
#undef NCCLSTUB_ENUM
	/* Not exported: the per-rank init that ncclCommInitAll runs, as in real NCCL. */
	NCCLSTUB_internal_init,
	NCCLSTUB_NFUNCS
};

#define NCCLSTUB_MAX_ARGS 8
#define NCCLSTUB_MAX_IDS  4
#define NCCLSTUB_MAX_INTS 8
#define NCCLSTUB_MAX_OUTS 8
#define NCCLSTUB_LOG_CAP  4096

/* Version codes the two builds report (ncclGetVersion). */
#define NCCLSTUB_VERSION     22809
#define NCCLSTUB_VERSION_OLD 21805

/*
 * Errors on request. A count or size argument equal to NCCLSTUB_FAIL_SIZE(code) makes a
 * collective, ncclMemAlloc or a registration return code; a unique id whose byte
 * NCCLSTUB_ID_FAIL_BYTE (padding NCCL never reads, below the bytes 40-127 a wrapper may
 * use) equals NCCLSTUB_ID_FAIL(code) makes an init return code. Other errors follow real
 * NCCL's argument checks (NULL comm, rank out of range, unbalanced ncclGroupEnd, ...).
 */
#define NCCLSTUB_FAIL_SIZE(code)  ((size_t)0x0fa11000 + (size_t)(code))
#define NCCLSTUB_ID_FAIL_BYTE	  39
#define NCCLSTUB_ID_FAIL(code)	  (0xe0 | (code))
#define NCCLSTUB_ID_MARKER_OFFSET 40

struct ncclstub_call {
	enum ncclstub_fn fn;
	/* Stub calls already on this thread's stack: 0 for a call from outside the stub. */
	int depth;
	/* The ncclResult_t returned; -1 for the functions that return a string. */
	int result;
	/* Every argument in declaration order; pointers as integers, a unique id passed by
	 * value as 0 with its bytes in ids[]. */
	int nargs;
	uint64_t args[NCCLSTUB_MAX_ARGS];
	/* Unique ids: the one passed by value, those behind commIds, or the one written. */
	int nids;
	unsigned char ids[NCCLSTUB_MAX_IDS][NCCL_UNIQUE_ID_BYTES];
	/* The bytes of *config the stub read: min(config->size, sizeof(ncclConfig_t)). */
	size_t config_bytes;
	unsigned char config[sizeof(ncclConfig_t)];
	/* Contents of int arrays (devlist, excludeRanksList) and of a host scalar. */
	int nints;
	int ints[NCCLSTUB_MAX_INTS];
	size_t data_bytes;
	unsigned char data[16];
	/* Values written to out-parameters in order, or the pointer returned. */
	int nouts;
	uint64_t outs[NCCLSTUB_MAX_OUTS];
};

/* Records appended since the last clear (may exceed NCCLSTUB_LOG_CAP: then records are lost). */
size_t ncclstub_log_count(void);
/* Copies record i; -1 when i is past the end or was lost. */
int ncclstub_log_get(size_t i, struct ncclstub_call *call_p);
/* Forgets all records. Not safe against calls running concurrently. */
void ncclstub_log_clear(void);
const char *ncclstub_fn_name(enum ncclstub_fn fn);
/* NCCLSTUB_VERSION or NCCLSTUB_VERSION_OLD, without logging. */
int ncclstub_version(void);

#endif
