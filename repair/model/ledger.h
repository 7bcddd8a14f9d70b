/*
 * The node's placement ledger: how many queue pairs hot repair has moved onto
 * each NIC of this node, per direction, counted by every R2CC process of the
 * node. The processes of a node share its NICs, and each one balancing only
 * its own queue pairs can leave the node unbalanced (two processes each
 * putting their odd one on the same NIC). Placement reads these counts first.
 *
 * It also keeps, per NIC, when any process of the node last saw it fail: a NIC
 * another process just found dead is no witness for this process's self-tests.
 *
 * The same table carries the node's load for the stall scan: every process
 * publishes, per NIC, the bytes it has posted and not seen complete and the
 * bytes it has seen complete, in a row of its own, and reads the node's sums. A
 * request waits for what the whole node queued ahead of it on the NIC, not
 * only for what its own process did.
 *
 * A small shared-memory table named by the user, the job and the node
 * (/dev/shm/r2cc-place-<uid>-<job>-<node>); its counters change with atomic
 * adds, so a choice made in one process is seen by the next placement in any
 * other at once. The last process to close it (at exit) removes it. A job whose
 * processes were all killed leaves it behind: every process claims a row (its
 * pid) when it opens the table, and each open removes this user's tables left
 * untouched for a minute whose rows all name processes that are gone (one log
 * line). Everything here is
 * the repair thread's (slow path); without a table (no job yet, shm refused)
 * every count reads 0 and placement is per process, as before.
 */
#ifndef R2CC_REPAIR_LEDGER_H
#define R2CC_REPAIR_LEDGER_H

#include <stdbool.h>
#include <stdint.h>

/* Opens (creating if needed) the table of job_id on the node called node_key.
 * Once per process: later calls with any arguments return the first result.
 * 0 or a negative errno. */
int r2cc_ledger_open(uint64_t job_id, const char *node_key);

/* Queue pairs moved onto nic (by name) in direction dir (0 send, 1 receive). */
int r2cc_ledger_get(const char *nic, int dir);

/* Adds delta (+1 when a queue pair is placed on nic, -1 when it leaves). */
void r2cc_ledger_add(const char *nic, int dir, int delta);

/* A failure of nic seen by this process at when (monotonic ns); the table keeps the
 * latest any process of the node saw. Any thread. */
void r2cc_ledger_failed_put(const char *nic, int64_t when);

/* The latest failure of nic any process of the node saw (0: none, or no table). Any
 * thread. */
int64_t r2cc_ledger_failed_at(const char *nic);

/* A process of the node found the NIC itself dead (a failed self-test, a port error,
 * a fatal device event) at when: every other process of the node moves its queue
 * pairs off it too (repair/scan.c), instead of finding out on its own. */
#define R2CC_LEDGER_WHY 96
void r2cc_ledger_dead_put(const char *nic, int64_t when, int pid, const char *why);
/* The last such verdict's time (0: none), the process that reached it and, unless
 * why is NULL, its reason (R2CC_LEDGER_WHY bytes). */
int64_t r2cc_ledger_dead_at(const char *nic, int *pid, char *why);

/* This process's bytes queued on nic and drained through it so far (cumulative).
 * The repair thread, every stall scan. */
void r2cc_ledger_load_put(const char *nic, uint64_t queued, uint64_t drained);

/* The node's sums over the processes that are alive; false without a table.
 * drained drops when a process leaves: callers take differences and must
 * re-baseline on a decrease. */
bool r2cc_ledger_load_get(const char *nic, uint64_t *queued, uint64_t *drained);

/* Drops this process's use; the last user removes the table. Idempotent. */
void r2cc_ledger_close(void);

#endif
