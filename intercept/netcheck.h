/*
 * Which network NCCL chose for this process, and whether R2CC repairs it: told once,
 * after the first communicator that spans nodes (NCCL picks its network at init, once
 * per process: its external net plugin first, then its own IB transport, then
 * sockets, the first that initialises with devices and whose name matches NCCL_NET).
 * A network R2CC cannot repair (sockets, UCX inside HPC-X's plugin, EFA, TCPX, an
 * unknown plugin) is one NOT PROTECTED warning with the zero-code way back
 * (shim/protect.h); a repaired one, one INFO line. Where the evidence does not tell,
 * nothing is said.
 */
#ifndef R2CC_INTERCEPT_NETCHECK_H
#define R2CC_INTERCEPT_NETCHECK_H

#include "intercept/transport.h"

/* A device opened, or listed (n devices), through code of transport t. */
void r2cc_net_opened(const struct r2cc_transport *t);
void r2cc_net_listed(const struct r2cc_transport *t, int n);
/* A verbs call of any kind was seen (NCCL resolved libibverbs, or called it). */
void r2cc_net_verbs_seen(void);

/*
 * The moments the verdict is tried, until one is reached: NCCL finished a
 * communicator's init (a blocking init returned, or the group that held it ended),
 * a communicator's node map arrived (its node count), a queue pair was made. Only
 * once NCCL finished an init does the absence of evidence count (sockets).
 */
void r2cc_net_init_done(void);
void r2cc_net_nodes(int nnodes);
void r2cc_net_attempt(void);

#endif
