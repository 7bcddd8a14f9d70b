/*
 * Reading the statistics pages R2CC processes publish in /dev/shm
 * (shim/stats.h), for `r2cc top` and `r2cc exporter`. A page is read with
 * pread() into the caller's memory, never mapped: a file that shrinks under
 * the reader (another user's garbage, a pid reused) then gives a short read,
 * not a SIGBUS, and each sample is one consistent-enough copy.
 */
#ifndef R2CC_TOOLS_PAGES_H
#define R2CC_TOOLS_PAGES_H

#include "shim/stats.h"

#include <stdbool.h>
#include <stddef.h>

#define R2CC_PAGES_DIR "/dev/shm"

enum r2cc_page_state {
	R2CC_PAGE_LIVE,	      /* a valid page of a running process */
	R2CC_PAGE_STALE,      /* the file of a process that is gone */
	R2CC_PAGE_BAD,	      /* not a page of this version: short, bad magic, version, size */
	R2CC_PAGE_UNREADABLE, /* cannot be opened or read (permissions, not a regular file) */
	R2CC_PAGE_NOT_READY,  /* removed since the listing, or still being made */
	R2CC_PAGE_NSTATES
};

/* Names of the states ("live", "stale", ...), for labels and messages. */
extern const char *const r2cc_page_state_names[R2CC_PAGE_NSTATES];

/* Whether a process exists (also one of another user). */
bool r2cc_page_alive(int pid);

/* Reads /dev/shm/NAME into *pg. With why (may be NULL), a short reason for BAD
 * and UNREADABLE ("page version 3, this tool reads version 4"). *pg holds the
 * page only for LIVE. A file named for a process that is gone is STALE,
 * whatever it holds. */
enum r2cc_page_state r2cc_page_read(const char *name, struct r2cc_stats_page *pg, char *why,
				    size_t why_len);

/* Calls fn for each r2cc-stats.* name in /dev/shm; fn returns false to stop.
 * Returns 0, or a negative errno when the directory cannot be read. */
int r2cc_pages_each(bool (*fn)(const char *name, void *arg), void *arg);

/* Removes the page NAME (r2cc top --clean). */
int r2cc_page_remove(const char *name);

/* Number of NIC records of a page that may be read: nnics within [0, R2CC_MAX_NICS]. */
int r2cc_page_nnics(const struct r2cc_stats_page *pg);

#endif
