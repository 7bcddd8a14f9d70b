/*
 * Library-wide state and start-up: whether R2CC is active (a valid setting
 * other than R2CC_MODE=0 and a supported NCCL), the NCCL version, and the
 * one-time initialisation that every entry point calls first.
 */
#ifndef R2CC_SHIM_CORE_H
#define R2CC_SHIM_CORE_H

#include <stdbool.h>
#include <stddef.h>

/* 0 until start-up has run, then 1 (active) or -1 (pass-through). */
extern int r2cc_state;

/* Runs start-up once; cheap afterwards. Returns true when R2CC is active. */
bool r2cc_init(void);

static inline bool r2cc_active(void)
{
	int s = __atomic_load_n(&r2cc_state, __ATOMIC_ACQUIRE);
	return s ? s > 0 : r2cc_init();
}

/* Switch the whole library to pass-through after an internal failure that
 * makes its state untrustworthy; logs once. New objects are then passed
 * through; existing ones keep working as far as they can. */
void r2cc_disable(const char *why);

/* The host name ("?" when it cannot be read), NUL-terminated within len. */
const char *r2cc_host_name(char *buf, size_t len);

/* This process's node as NCCL sees it: NCCL_HOSTID when set, else the host
 * name. Writes at most len bytes into buf and returns buf. */
const char *r2cc_node_key(char *buf, size_t len);

/* A detached thread of R2CC's own, named name (15 characters at most), with every
 * signal blocked: the application's signals stay the application's. 0 or the error
 * of pthread_create, negated. */
int r2cc_thread_start(void *(*fn)(void *), void *arg, const char *name);

/* NCCL version code as ncclGetVersion reports it (0 until known). */
extern int r2cc_nccl_version;
void r2cc_note_nccl_version(int code);

#endif
