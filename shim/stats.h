/*
 * Live statistics a process publishes for `r2cc top`: a page in shared
 * memory (/dev/shm/r2cc-stats.<pid>) that holds the process's NIC records
 * themselves, so the data path updates published counters at no extra cost.
 * Readers map it read-only, check magic and version, and treat a page whose
 * process is gone as stale. R2CC_STATS=0 keeps the records in private memory.
 */
#ifndef R2CC_SHIM_STATS_H
#define R2CC_SHIM_STATS_H

#include "shim/protect.h"
#include "shim/registry.h"

#include <stdint.h>

#define R2CC_STATS_MAGIC   0x5441545343433252ull /* "R2CCSTAT" */
#define R2CC_STATS_VERSION 4
#define R2CC_STATS_PREFIX  "r2cc-stats."

struct r2cc_stats_page {
	uint64_t magic;
	uint32_t version;
	int32_t pid;
	char host[64];
	char node[64];
	int32_t mode;
	int32_t nnics;		/* records in use, written after each record is ready */
	uint64_t start_unix_ns; /* when the process started R2CC */
	uint32_t nic_size;	/* sizeof(struct r2cc_nic), checked by readers */
	uint32_t pad;
	struct r2cc_nic nics[R2CC_MAX_NICS];
	/* Where R2CC does not protect this process (shim/protect.h), NUL-terminated;
	 * empty when it does. Written once. */
	char unprotected[R2CC_UNPROTECTED_MAX];
	/* R2CC_DRILL (repair/drill.h): the plan (cut at 255 characters; empty: none),
	 * its steps and those applied so far, and the NICs whose queue pairs a step cut
	 * (bit i: nics[i]). Written by the drill's thread. */
	char drill_plan[256];
	int32_t drill_steps, drill_applied;
	uint64_t drill_nics;
};

/* Map the page (once); NULL when publishing is off or failed (logged). */
struct r2cc_stats_page *r2cc_stats_page(void);
/* Remove the page at exit. */
void r2cc_stats_unpublish(void);

#endif
