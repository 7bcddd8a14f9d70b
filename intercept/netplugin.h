/*
 * NCCL's external net plugins as NCCL finds them (2.19-2.32, src/plugin/net.cc):
 * NCCL_NET_PLUGIN unset tries libnccl-net.so on the library path (how images that
 * carry HPC-X get its "IBext"); "none" loads none; otherwise each comma-separated
 * name NAME tries libnccl-net-NAME.so, then NAME itself. A plugin is a library that
 * defines ncclNetPlugin_vN (NCCL asks for the newest it knows first), a struct whose
 * first member is the net's name: nccl-rdma-sharp-plugins answers "NCCL RDMA Plugin
 * vN" until NCCL initialises it, then the name of the transport it chose ("IBext_vN"
 * over verbs, "UCX", "UCX-RMA", ... over UCX, NCCL_PLUGIN_P2P). Shared by the library
 * (what NCCL loaded: netcheck.c) and `r2cc doctor` (what NCCL would load).
 */
#ifndef R2CC_INTERCEPT_NETPLUGIN_H
#define R2CC_INTERCEPT_NETPLUGIN_H

#include <stdbool.h>

#define R2CC_NETPLUGIN_CANDIDATES 8  /* names tried, at most */
#define R2CC_NETPLUGIN_API_MAX	  12 /* the newest ncclNetPlugin_vN looked for */
/* The releases of nccl-rdma-sharp-plugins whose clear-to-send layout R2CC knows:
 * R2CC_IBEXT_API_MIN/MAX, repair/model/cts.h. */

struct r2cc_netplugin {
	char file[256]; /* the name NCCL dlopen()s, as tried */
	char path[256]; /* where it was found (dladdr), when loaded */
	char name[64];	/* the net's name as its struct says now */
	int api;	/* the newest ncclNetPlugin_vN it defines, 0 if none */
};

/* The library names NCCL would try, in its order, into names (R2CC_NETPLUGIN_CANDIDATES
 * at most); returns how many. */
int r2cc_netplugin_candidates(char names[][256]);

/* Looks at file: only if it is already loaded (load false: what NCCL loaded), or
 * dlopen()ing it as NCCL does (load true: `r2cc doctor`). 0 with *p filled when it is
 * loaded and defines ncclNetPlugin_vN; -ENOENT when it is not there, -ENOTSUP when it
 * is no net plugin. */
int r2cc_netplugin_probe(const char *file, bool load, struct r2cc_netplugin *p);

/* Whether a net name is nccl-rdma-sharp-plugins' (before or after its init). */
bool r2cc_netplugin_is_ibext(const struct r2cc_netplugin *p);

#endif
