/*
 * The network NCCL chose (netcheck.h), from what R2CC saw during NCCL's init: the
 * devices each transport opened through the verbs wrappers, the net plugins NCCL
 * loaded (netplugin.h) and NCCL_NET.
 */
#include "intercept/netcheck.h"
#include "intercept/netplugin.h"
#include "repair/model/cts.h"
#include "shim/log.h"
#include "shim/protect.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int decided;
static int nodes_max;	/* the most nodes a communicator of this process spans */
static int init_done;	/* NCCL finished an init: its network is set up */
static int opened[3];	/* devices opened, by enum r2cc_transport_kind */
static int listed = -1; /* devices NCCL's IB transport listed; -1 before it asked */
static int verbs_seen;

void r2cc_net_opened(const struct r2cc_transport *t)
{
	__atomic_fetch_add(&opened[t->kind], 1, __ATOMIC_RELAXED);
}

void r2cc_net_listed(const struct r2cc_transport *t, int n)
{
	if (t->kind == R2CC_TRANSPORT_NCCL)
		__atomic_store_n(&listed, n, __ATOMIC_RELAXED);
}

void r2cc_net_verbs_seen(void)
{
	if (!__atomic_load_n(&verbs_seen, __ATOMIC_RELAXED))
		__atomic_store_n(&verbs_seen, 1, __ATOMIC_RELAXED);
}

static void protected(const char *what)
{
	R2CC_INFO("%s: R2CC's hot repair covers it", what);
}

#define NO_PLUGIN_FIX "NCCL_NET_PLUGIN=none gives NCCL's own IB transport, which R2CC repairs"

/* The loaded plugin's verdict: 1 decided, 0 not yet. final: NCCL's init is over. */
static int plugin_verdict(const struct r2cc_netplugin *p, int by_nccl, int by_ibext, bool final)
{
	char what[400];
	if (by_nccl && !by_ibext) { /* the plugin found no devices: NCCL's IB won */
		protected("network IB, NCCL's own transport (its net plugin found no device)");
		return 1;
	}
	if (!strncmp(p->name, "NCCL RDMA Plugin", 16))
		return 0; /* HPC-X's plugin before its init: not chosen yet */
	if (!strncmp(p->name, "IBext", 5)) {
		if (!by_ibext)
			return 0;
		snprintf(what, sizeof(what), "network %s (%s)", p->name, p->path);
		if (p->api >= R2CC_IBEXT_API_MIN && p->api <= R2CC_IBEXT_API_MAX) {
			protected(what);
			return 1;
		}
		r2cc_unprotected(what,
				 "R2CC does not know the clear-to-send layout of this release of "
				 "nccl-rdma-sharp-plugins",
				 NO_PLUGIN_FIX);
		return 1;
	}
	if (!final)
		return 0; /* NCCL's own IB may still take over from a plugin that failed */
	snprintf(what, sizeof(what), "network %s (net plugin %s)", p->name, p->path);
	bool ucx = !strncasecmp(p->name, "UCX", 3);
	r2cc_unprotected(what,
			 ucx ? "UCX posts to the NIC itself, where no verbs call of R2CC's sees it"
			     : "R2CC repairs RDMA verbs transports only (NCCL's IB, HPC-X's IBext)",
			 ucx ? "NCCL_PLUGIN_P2P=ib gives HPC-X's verbs transport and " NO_PLUGIN_FIX
			     : NO_PLUGIN_FIX);
	return 1;
}

static int verdict(bool final)
{
	int by_nccl = __atomic_load_n(&opened[R2CC_TRANSPORT_NCCL], __ATOMIC_RELAXED);
	int by_ibext = __atomic_load_n(&opened[R2CC_TRANSPORT_IBEXT], __ATOMIC_RELAXED);
	const char *net = getenv("NCCL_NET");
	char what[200];
	if (net && *net) {
		snprintf(what, sizeof(what), "network %.60s (NCCL_NET=%.60s)", net, net);
		if (!strcasecmp(net, "IB"))
		protected(what);
		else if (strncasecmp(net, "IBext", 5))
		    r2cc_unprotected(what,
				     "R2CC repairs RDMA verbs transports only (NCCL's IB, HPC-X's "
				     "IBext)",
				     "NCCL_NET=IB where the nodes have RDMA NICs");
		else if (!by_ibext) return 0; /* the plugin's own verdict comes with its queue pairs
					       */
		else protected(what);
		return 1;
	}
	char names[R2CC_NETPLUGIN_CANDIDATES][256];
	int n = r2cc_netplugin_candidates(names);
	for (int i = 0; i < n; i++) {
		struct r2cc_netplugin p;
		if (r2cc_netplugin_probe(names[i], false, &p) == 0)
			return plugin_verdict(&p, by_nccl, by_ibext, final);
	}
	if (by_nccl) {
		protected("network IB, NCCL's own transport");
		return 1;
	}
	int l = __atomic_load_n(&listed, __ATOMIC_RELAXED);
	if (final && (l == 0 || !__atomic_load_n(&verbs_seen, __ATOMIC_RELAXED))) {
		r2cc_unprotected("network Socket",
				 l == 0 ? "NCCL's IB transport found no RDMA device"
					: "NCCL loaded no libibverbs (rdma-core missing?)",
				 NULL);
		return 1;
	}
	return 0;
}

void r2cc_net_attempt(void)
{
	if (__atomic_load_n(&decided, __ATOMIC_ACQUIRE) ||
	    __atomic_load_n(&nodes_max, __ATOMIC_RELAXED) < 2)
		return;
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	pthread_mutex_lock(&mu);
	if (!decided && verdict(__atomic_load_n(&init_done, __ATOMIC_ACQUIRE)))
		__atomic_store_n(&decided, 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&mu);
}

void r2cc_net_init_done(void)
{
	__atomic_store_n(&init_done, 1, __ATOMIC_RELEASE);
	r2cc_net_attempt();
}

void r2cc_net_nodes(int nnodes)
{
	int cur = __atomic_load_n(&nodes_max, __ATOMIC_RELAXED);
	while (nnodes > cur && !__atomic_compare_exchange_n(&nodes_max, &cur, nnodes, false,
							    __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
	r2cc_net_attempt();
}
