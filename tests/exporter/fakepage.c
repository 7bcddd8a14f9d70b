/*
 * Writes a statistics page (shim/stats.h) that no R2CC process made, for the
 * exporter's tests: a well-formed one with chosen strings and counters, or one
 * damaged on purpose. Built from the header itself, so it follows the layout.
 *
 *   fakepage FILE PID [--host S] [--node S] [--nic NAME]... [--why S] [--plan S]
 *                     [--repairs N] [--dup-nic] [--version V] [--magic X]
 *                     [--truncate BYTES]
 *
 * --repairs N: N real repairs, 1 ms, 30 ms and 3 s long in turn, with a
 * bucket counted ahead of the count (as a copy taken while the repair thread
 * writes can be), 2 failbacks; and N + 1 drill repairs, all under 1 ms.
 */
#include "shim/stats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: fakepage FILE PID [options]\n");
		return 2;
	}
	static struct r2cc_stats_page pg;
	pg.magic = R2CC_STATS_MAGIC;
	pg.version = R2CC_STATS_VERSION;
	pg.pid = atoi(argv[2]);
	snprintf(pg.host, sizeof(pg.host), "fakehost");
	snprintf(pg.node, sizeof(pg.node), "fakenode");
	pg.mode = 2;
	pg.nic_size = sizeof(struct r2cc_nic);
	pg.start_unix_ns = 1700000000ull * 1000000000ull;
	long truncate_to = -1;
	for (int i = 3; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : "";
		if (!strcmp(argv[i], "--host")) {
			snprintf(pg.host, sizeof(pg.host), "%s", v);
			i++;
		} else if (!strcmp(argv[i], "--node")) {
			snprintf(pg.node, sizeof(pg.node), "%s", v);
			i++;
		} else if (!strcmp(argv[i], "--nic") && pg.nnics < R2CC_MAX_NICS) {
			struct r2cc_nic *n = &pg.nics[pg.nnics];
			n->index = pg.nnics++;
			snprintf(n->name, sizeof(n->name), "%s", v);
			n->state = R2CC_NIC_UP;
			n->port_state = 4;
			n->cnt.tx_bytes = 1000u * (unsigned)pg.nnics;
			n->cnt.tx_wrs = 10u * (unsigned)pg.nnics;
			i++;
		} else if (!strcmp(argv[i], "--why")) {
			snprintf(pg.unprotected, sizeof(pg.unprotected), "%s", v);
			i++;
		} else if (!strcmp(argv[i], "--plan")) {
			snprintf(pg.drill_plan, sizeof(pg.drill_plan), "%s", v);
			pg.drill_steps = 2;
			pg.drill_applied = 1;
			pg.drill_nics = 1;
			i++;
		} else if (!strcmp(argv[i], "--repairs")) {
			int n = atoi(v);
			static const double took[] = {0.001, 0.03, 3};
			for (int k = 0; k < n; k++) {
				for (int b = 0; b < R2CC_STATS_REPAIR_BUCKETS; b++)
					pg.rep[0].le[b] +=
					    took[k % 3] <= r2cc_stats_repair_bounds_s[b];
				pg.rep[0].duration_ns_sum += (uint64_t)(took[k % 3] * 1e9);
			}
			pg.rep[0].repairs = (uint64_t)n;
			pg.rep[0].le[R2CC_STATS_REPAIR_BUCKETS - 1]++; /* ahead of the count */
			pg.rep[0].failbacks = 2;
			pg.rep[1].repairs = (uint64_t)n + 1;
			for (int b = 0; b < R2CC_STATS_REPAIR_BUCKETS; b++)
				pg.rep[1].le[b] = (uint64_t)n + 1;
			pg.rep[1].duration_ns_sum = (uint64_t)(n + 1) * 500000;
			i++;
		} else if (!strcmp(argv[i], "--dup-nic") && pg.nnics >= 2) {
			memcpy(pg.nics[1].name, pg.nics[0].name, sizeof(pg.nics[0].name));
		} else if (!strcmp(argv[i], "--version")) {
			pg.version = (uint32_t)atoi(v);
			i++;
		} else if (!strcmp(argv[i], "--magic")) {
			pg.magic = strtoull(v, NULL, 0);
			i++;
		} else if (!strcmp(argv[i], "--truncate")) {
			truncate_to = atol(v);
			i++;
		} else {
			fprintf(stderr, "fakepage: unknown option %s\n", argv[i]);
			return 2;
		}
	}
	size_t len =
	    truncate_to >= 0 && (size_t)truncate_to < sizeof(pg) ? (size_t)truncate_to : sizeof(pg);
	FILE *f = fopen(argv[1], "wb");
	if (!f || fwrite(&pg, 1, len, f) != len || fclose(f) != 0) {
		perror(argv[1]);
		return 1;
	}
	return 0;
}
