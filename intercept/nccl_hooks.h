/*
 * What the NCCL door offers the layers above it (strategies/, repair/):
 * the real NCCL functions they call, the thread's group depth, and hooks
 * they install. A hook pointer is NULL while nothing is armed, which keeps
 * the collective wrappers to one predictable branch.
 */
#ifndef R2CC_INTERCEPT_NCCL_HOOKS_H
#define R2CC_INTERCEPT_NCCL_HOOKS_H

#include <stdbool.h>
#include <stddef.h>

struct r2cc_comm;

/* Replaces ncclAllReduce for communicators whose record has strategy state.
 * Returns an ncclResult_t. */
typedef int (*r2cc_allreduce_hook_fn)(struct r2cc_comm *c, const void *sendbuff, void *recvbuff,
				      size_t count, int datatype, int op, void *stream);
extern r2cc_allreduce_hook_fn r2cc_allreduce_hook;

/* Called before a communicator with strategy state is destroyed, or aborted
 * (abort: nothing may wait on the GPU or on a peer). */
typedef void (*r2cc_comm_release_fn)(struct r2cc_comm *c, bool abort);
extern r2cc_comm_release_fn r2cc_comm_release_hook;

/* ncclCommGetAsyncError of a communicator with strategy state, when NCCL says
 * it is fine: the first error of the communicators R2CC made under it
 * (R2CC-AllReduce's), as an ncclResult_t, or 0. An error there stops the
 * parent's collectives as surely as one of its own. */
typedef int (*r2cc_comm_async_error_fn)(struct r2cc_comm *c);
extern r2cc_comm_async_error_fn r2cc_comm_async_error_hook;

/* Depth of ncclGroupStart nesting on this thread. */
int r2cc_nccl_group_depth(void);
/* Notes NCCL's version from the loaded NCCL if it is not known yet (the first QP
 * NCCL creates; quiet when there is no NCCL). */
void r2cc_nccl_version_probe(void);

/* The real NCCL functions, as void pointers to be cast by the user. */
struct r2cc_nccl_real {
	void *AllReduce, *AllGather, *Reduce, *Broadcast, *CommSplit, *CommDestroy, *CommAbort;
	void *CommCount, *CommUserRank, *GroupStart, *GroupEnd, *CommGetAsyncError;
};
const struct r2cc_nccl_real *r2cc_nccl_real(void);

#endif
