/*
 * Live statistics a process publishes for `r2cc top`: a page in shared
 * memory (/dev/shm/r2cc-stats.<pid>) that holds the process's NIC records
 * themselves: the repair thread folds the data path's counts into them every 5 ms
 * (registry.h, struct r2cc_fold), at no cost to the data path.
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

/* Hot repair's incidents once each settles (all its queue pairs moved or failed;
 * repair/incident.c). Declared failures are not counted. Durations are from the
 * detection to the last queue pair moved, as a Prometheus histogram: le[i] counts the
 * repairs that took at most r2cc_stats_repair_bounds_s[i] (cumulative), `repairs`
 * all of them (+Inf). */
#define R2CC_STATS_REPAIR_BUCKETS 12
static const double r2cc_stats_repair_bounds_s[R2CC_STATS_REPAIR_BUCKETS] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};

struct r2cc_stats_repairs {
	uint64_t repairs;   /* NIC or path failures whose queue pairs moved */
	uint64_t failbacks; /* NICs that came back and got their queue pairs again */
	uint64_t qps_moved, qps_failed;
	uint64_t le[R2CC_STATS_REPAIR_BUCKETS];
	uint64_t duration_ns_sum;
};

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
	/* [0]: real incidents, [1]: a drill's (repair/drill.h). Written by the repair
	 * thread under its lock; readers take the values as they are. */
	struct r2cc_stats_repairs rep[2];
};

/* Map the page (once); NULL when publishing is off or failed (logged). */
struct r2cc_stats_page *r2cc_stats_page(void);
/* Remove the page at exit. */
void r2cc_stats_unpublish(void);

#endif
