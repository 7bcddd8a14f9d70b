/*
 * NCCL as R2CC reaches it, shared by the NCCL door (intercept/nccl.c) and the
 * strategies (strategies/), and calling neither: the real NCCL functions
 * (resolved on first use), the thread's group depth, which the door keeps, and
 * the hooks the strategies install and the door calls. A hook pointer is NULL
 * while nothing is armed, which keeps the collective wrappers to one
 * predictable branch.
 */
#ifndef R2CC_INTERCEPT_NCCL_REAL_H
#define R2CC_INTERCEPT_NCCL_REAL_H

#include "shim/common.h"

#include <nccl.h>
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

/*
 * A step the door runs once, when the first communicator is created with R2CC
 * active: the strategies arm themselves so (strategies/failview.c), set from
 * their constructor. NCCL may be called before this library's constructors have
 * run (shim/core.c): a step set after the first communicator came runs at once,
 * so that it is never missed. Returns 0 or a negative errno, which nobody reads
 * (a step logs its own failure).
 */
typedef int (*r2cc_nccl_first_comm_fn)(void);
void r2cc_nccl_at_first_comm(r2cc_nccl_first_comm_fn fn);
/* The door, once: runs the step if one is set. */
void r2cc_nccl_first_comm(void);

/* Depth of ncclGroupStart nesting on this thread (the door's count). */
extern __thread int r2cc_nccl_groups;
int r2cc_nccl_group_depth(void);
/* Notes NCCL's version from the loaded NCCL if it is not known yet (the first QP
 * NCCL creates; quiet when there is no NCCL). */
void r2cc_nccl_version_probe(void);

/* Every function of nccl_funcs.def: real_nccl<name>, of type real_nccl<name>_fn,
 * NULL until resolved. */
#define R2CC_NCCL_FN(name, params, args)                                                           \
	typedef ncclResult_t(*real_nccl##name##_fn) params;                                        \
	extern real_nccl##name##_fn real_nccl##name;
#define R2CC_NCCL_OWN  R2CC_NCCL_FN
#define R2CC_NCCL_REAL R2CC_NCCL_FN
#include "intercept/nccl_funcs.def"
#undef R2CC_NCCL_FN
#undef R2CC_NCCL_OWN
#undef R2CC_NCCL_REAL

/* NCCL's function nccl<name>: NCCL's strong alias pnccl<name>, else the next
 * definition of nccl<name>; NULL (and one warning) when the loaded NCCL lacks it. */
void *r2cc_nccl_resolve(const char *name);

/* The real nccl<name>, resolved on its first use. */
#define R2CC_NCCL_REAL_FN(name)                                                                    \
	(r2cc_likely(real_nccl##name != NULL)                                                      \
	     ? real_nccl##name                                                                     \
	     : (real_nccl##name = (real_nccl##name##_fn)r2cc_nccl_resolve(#name)))

/* The real NCCL functions the strategies call, as void pointers to be cast by
 * the user. */
struct r2cc_nccl_real {
	void *AllReduce, *AllGather, *Reduce, *Broadcast, *CommSplit, *CommDestroy, *CommAbort;
	void *CommCount, *CommUserRank, *GroupStart, *GroupEnd, *CommGetAsyncError;
};
const struct r2cc_nccl_real *r2cc_nccl_real(void);

#endif
