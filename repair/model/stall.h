/*
 * What a wait on a NIC is explained by: the node's load model for hot repair's
 * stall scan (docs/architecture.md, Hot repair: a stall is no progress that the queue cannot
 * explain, never a fixed age).
 *
 * Per NIC it keeps the bytes the node has posted and not seen complete (from the
 * process's first repair placement on, every R2CC process of the node publishes its
 * own through the node ledger, repair/model/ledger.h, and reads the node's sums;
 * before, its own), the bytes seen complete, when that last advanced, and the
 * NIC's drain rate as measured: the best rate over 100 ms of busy time in the
 * last 10 s (the port's speed and width until there is a measurement). A request
 * behind Q queued bytes on a NIC draining at R may wait floor + 2 (Q + the
 * largest request) / R before its wait is unexplained. The best recent rate is
 * the right one to divide by: a path that died keeps its old rate (so a black
 * hole is suspected at once), while a fabric that merely slowed down is caught by
 * the confirmation that follows every suspicion (repair/scan.c, repair/localise.c), never acted on
 * by itself.
 *
 * The repair thread feeds the model once per scan (begin, one account per QP,
 * end); the self-test thread reads it. Nothing here runs on the data path.
 */
#ifndef R2CC_REPAIR_STALL_H
#define R2CC_REPAIR_STALL_H

#include "shim/registry.h"

#include <stdbool.h>
#include <stdint.h>

#define R2CC_STALL_MAX_NICS 64
#define R2CC_STALL_FLOOR_NS 20000000ll /* R2CC_STALL_MS by default: 20 ms */

/* One scan: begin, then each QP's queued bytes and the bytes it retired since
 * the last scan, on the NIC it currently uses, then end. Repair thread. */
void r2cc_stall_scan_begin(void);
void r2cc_stall_account(const struct r2cc_nic *nic, uint64_t queued, uint64_t retired_delta,
			uint32_t max_request);
void r2cc_stall_scan_end(int64_t now);
/* From now on the node's load from the ledger, not only this process's (the first
 * repair placement; repair/placement.c). Repair thread. */
void r2cc_stall_node_load(void);

/* The node's bytes queued on nic, drained through it so far, and when that last
 * advanced (0: never). Any thread. */
uint64_t r2cc_stall_queued(const struct r2cc_nic *nic);
uint64_t r2cc_stall_drained(const struct r2cc_nic *nic);
int64_t r2cc_stall_last_drain(const struct r2cc_nic *nic);

/* When the model was last updated (the end of the last scan; 0: never). */
int64_t r2cc_stall_updated(void);

/* The drain rate the model uses for nic, bytes per second (> 0). Any thread. */
double r2cc_stall_rate(const struct r2cc_nic *nic);

/*
 * How long a request may wait on nic behind `ahead` bytes before the wait is more
 * than the queue explains: floor_ns + 2 (ahead + the largest request seen on
 * nic) / rate. Any thread.
 */
int64_t r2cc_stall_explained_ns(const struct r2cc_nic *nic, uint64_t ahead, int64_t floor_ns);

/*
 * How long a write on a QP of its own may wait for its turn on nic: one turn (up
 * to 64 KB, the soft device's slice; a hardware NIC's scheduler interleaves QPs
 * at packet granularity, far less) for each QP with work queued on it, at the
 * model's rate, and never more than the largest request seen there takes (the
 * allowance before turns). Any thread.
 */
int64_t r2cc_stall_turn_ns(const struct r2cc_nic *nic);

#endif
