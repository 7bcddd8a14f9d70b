/*
 * Where R2CC does not protect this process, and why: a network NCCL chose that
 * R2CC cannot repair (sockets, UCX, an unknown net plugin), or queue pairs hot
 * repair has to leave alone (an out-of-order receive queue, a transport whose
 * clear-to-send layout R2CC does not know). Each distinct case is one WARN line,
 * and the first is kept for the exit report, the statistics page (`r2cc top`) and
 * the metrics: a user must never believe a job is protected when it is not.
 */
#ifndef R2CC_SHIM_PROTECT_H
#define R2CC_SHIM_PROTECT_H

#include <stdbool.h>

#define R2CC_UNPROTECTED_MAX 200 /* bytes of the kept reason, NUL included */

/* Notes a case: what is not protected ("network Socket", "qp of IBext 2.28"),
 * why, and the zero-code way back to a protected path (NULL: none). The first
 * of each `what` is logged at WARN; later ones are counted only. */
void r2cc_unprotected(const char *what, const char *why, const char *fix);

/* The first case as one line ("network Socket: ..."), or NULL when none. */
const char *r2cc_unprotected_first(void);
/* How many times a case was noted (queue pairs refused count one each). */
unsigned long r2cc_unprotected_count(void);

#endif
