/* Per-NIC byte counters for r2cc-perf's per-iteration tables, from the first source
 * that exists: the software RDMA device (softverbs_nic_stats, every emulated node of
 * the host), libr2cc.so (r2cc_nic_stats, this process's traffic only), or the kernel's
 * InfiniBand port counters (this host).
 */
#ifndef R2CC_BENCH_PERF_NIC_H
#define R2CC_BENCH_PERF_NIC_H

#include <stdint.h>

/* As exported by the software RDMA device (tests/); must stay identical. */
struct softverbs_nic_stat {
	char node[64];
	char name[64];
	int gbps;
	int state;
	uint64_t tx_bytes, rx_bytes, tx_packets, rx_packets;
};

/* As exported by libr2cc.so; must stay identical. */
struct r2cc_nic_stat {
	char name[64];
	uint64_t tx_bytes, rx_bytes, tx_wrs, rx_wrs;
	int state;
	int pad;
};

#define PERF_NIC_MAX 16

enum perf_nic_source { PERF_NIC_NONE, PERF_NIC_SOFTVERBS, PERF_NIC_R2CC, PERF_NIC_SYSFS };

/* One process's sample, sent to process 0 (fixed size for the rendezvous). */
struct perf_nic_sample {
	int32_t n, source;
	char name[PERF_NIC_MAX][32];
	uint64_t rx[PERF_NIC_MAX], tx[PERF_NIC_MAX];
};

/* Picks the source; call after the communicator exists (NCCL loads libibverbs then). */
int perf_nic_source(void);
const char *perf_nic_source_name(int source);

/* Counters of node `node` (softverbs), of this process (r2cc) or of this host (sysfs),
 * whichever `source` is; `contribute` = 0 gives an empty sample (another process of the
 * node reports it). */
void perf_nic_read(int source, const char *node, int contribute, struct perf_nic_sample *s);

/* Adds b into a, matching NICs by name. */
void perf_nic_merge(struct perf_nic_sample *a, const struct perf_nic_sample *b);

#endif
