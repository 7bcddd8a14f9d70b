/*
 * Fault injection for tests (SQLite's test_malloc.c is the model): a countdown
 * per kind of call that makes the Nth call of that kind fail, once or from then
 * on, set by the test-only variable R2CC_FAULT_INJECT:
 *
 *   alloc:N[+]   the Nth heap allocation R2CC makes itself (malloc, calloc,
 *                realloc of libr2cc.so's own code; --wrap at link time) returns
 *                NULL; with '+', every one from the Nth on
 *   verbs:N[+]   the Nth verbs call R2CC makes of its own (hot repair's CQs, QPs
 *                and port queries; the MR mirror's PDs and registrations) fails
 *   send:N[+]    the Nth control-plane message queued fails as if the queue
 *                were full
 *   post:N[+]    the Nth request hot repair posts itself (NCCL's posts on the
 *                slow path, held ones replayed, re-posts onto a new path) is
 *                refused with EIO, as a dead device refuses it
 *   count:PATH   nothing fails; at exit the calls of each kind are written to
 *                PATH (%h host, %p pid) as "KIND COUNT" lines
 *
 * Compiled in always; while R2CC_FAULT_INJECT is unset a call site costs one
 * load and one predictable branch. None of these calls is on the post/poll fast
 * path (post counts the slow path's posts only). r2cc_fault_hit() runs at each
 * injected failure and does nothing: a place for a breakpoint.
 */
#ifndef R2CC_SHIM_FAULT_H
#define R2CC_SHIM_FAULT_H

#include "shim/common.h"

#include <stdbool.h>
#include <stdint.h>

enum r2cc_fault_kind {
	R2CC_FAULT_ALLOC = 0,
	R2CC_FAULT_VERBS,
	R2CC_FAULT_SEND,
	R2CC_FAULT_POST,
	R2CC_FAULT_KINDS
};

/* 0: off; anything else: armed, counting, or R2CC_FAULT_INJECT not read yet. */
extern int r2cc_fault_active;

bool r2cc_fault_check(int kind);
void r2cc_fault_hit(int kind, uint64_t n);

/* True when this call of `kind` must fail. */
static inline bool r2cc_fault_fire(int kind)
{
	if (r2cc_likely(__atomic_load_n(&r2cc_fault_active, __ATOMIC_RELAXED) == 0))
		return false;
	return r2cc_fault_check(kind);
}

#endif
