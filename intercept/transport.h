/*
 * Which transport made a queue pair, told by the code that called the verbs
 * function (its return address, through dladdr): NCCL's own IB transport (NCCL,
 * by dlvsym or linked against libibverbs), HPC-X's IBext net plugin, or another
 * NCCL net plugin. Hot repair re-posts a transport's clear-to-send writes by the
 * layout that transport writes, so it repairs only the transports whose layout it
 * knows; the others get one warning each and pass through.
 */
#ifndef R2CC_INTERCEPT_TRANSPORT_H
#define R2CC_INTERCEPT_TRANSPORT_H

#include <stdbool.h>

enum r2cc_transport_kind {
	R2CC_TRANSPORT_NCCL,   /* NCCL's IB transport: the dlvsym door, or pncclGetVersion */
	R2CC_TRANSPORT_IBEXT,  /* nccl-rdma-sharp-plugins' IB transport */
	R2CC_TRANSPORT_PLUGIN, /* any other code: a net plugin, UCX, a program of rdma-core's */
};

struct r2cc_transport {
	enum r2cc_transport_kind kind;
	char name[96]; /* "NCCL IB (libnccl.so.2)", "IBext (net API v11, libnccl-net.so)", ... */
	/* The clear-to-send layout it writes (repair/model/cts.h); NULL: the loaded NCCL's
	 * (cts_unknown false) or one R2CC does not know (true). */
	const struct r2cc_cts_layout *cts;
	bool cts_unknown;
	/* Why hot repair leaves its queue pairs alone, or NULL. */
	const char *why_not;
	bool net_plugin; /* the object defines ncclNetPlugin_vN */
};

/* The transport of the code at caller (never NULL; control path: may take a lock,
 * call dladdr and dlopen with RTLD_NOLOAD once per loaded object). by_dlvsym: the
 * call came through the dlvsym door, which only NCCL's own transport uses: code that
 * is no net plugin is NCCL's then, even where it does not export pncclGetVersion (an
 * NCCL linked statically into another library). */
const struct r2cc_transport *r2cc_transport_of(const void *caller, bool by_dlvsym);

#endif
