/*
 * Which transport made a queue pair (transport.h). The code that called the verbs
 * function is found with dladdr; the object it lies in is then asked, once, what
 * it is:
 * - it defines pncclGetVersion itself: NCCL (its own IB transport, reached by
 *   dlvsym or, built with RDMA_CORE=1, by symbol; the drill, which exports it to be
 *   taken for NCCL), whose clear-to-send layout is the loaded NCCL's;
 * - it defines a net plugin's ncclNetPlugin_vN whose name, once NCCL has
 *   initialised it, is "IBext...": HPC-X's nccl-rdma-sharp-plugins, whose layout is
 *   the one its source declares for the net API it was built for
 *   (r2cc_cts_ibext_layout());
 * - anything else (another net plugin, UCX's transports, rdma-core's programs):
 *   R2CC does not know what it writes, and hot repair leaves its QPs alone; except
 *   that code which came through the dlvsym door and is no net plugin is taken for
 *   NCCL (only NCCL's own transport resolves verbs so; an NCCL linked statically into
 *   another library may not export pncclGetVersion).
 * The answers are kept per object for the life of the process (objects are few).
 */
#include "intercept/transport.h"
#include "intercept/netplugin.h"
#include "repair/model/cts.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define KNOWN_MAX 16

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct known {
	const void *base; /* dli_fbase of the object */
	struct r2cc_transport t;
} known[KNOWN_MAX];
static int nknown;

static const struct r2cc_transport unknown_caller = {
    .kind = R2CC_TRANSPORT_PLUGIN,
    .name = "unknown code",
    .cts_unknown = true,
    .why_not = "R2CC cannot tell which code made it",
};

/* Whether sym, looked up from handle, is defined in the object at base itself
 * (not in one it depends on, nor in libr2cc.so). */
static void *own_symbol(void *handle, const void *base, const char *sym)
{
	void *p = dlsym(handle, sym);
	Dl_info di;
	return p && dladdr(p, &di) && di.dli_fbase == base ? p : NULL;
}

static void classify(const char *path, const void *base, struct r2cc_transport *t)
{
	const char *file = path ? strrchr(path, '/') : NULL;
	file = file ? file + 1 : path ? path : "?";
	void *h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
	/* the main program: dlopen gives no handle of its own, the global scope
	 * starts with it */
	void *look = h ? h : RTLD_DEFAULT;
	if (own_symbol(look, base, "pncclGetVersion") || own_symbol(look, base, "ncclGetVersion")) {
		t->kind = R2CC_TRANSPORT_NCCL;
		snprintf(t->name, sizeof(t->name), "NCCL IB (%s)", file);
		t->why_not = NULL;
		goto out;
	}
	struct r2cc_netplugin np;
	int api = path && r2cc_netplugin_probe(path, false, &np) == 0 ? np.api : 0;
	const char *net = api ? np.name : NULL;
	t->net_plugin = api != 0;
	if (api && r2cc_netplugin_is_ibext(&np)) {
		t->kind = R2CC_TRANSPORT_IBEXT;
		t->cts = r2cc_cts_ibext_layout(api);
		t->cts_unknown = !t->cts;
		snprintf(t->name, sizeof(t->name), "IBext (net API v%d, %s)", api, file);
		t->why_not = t->cts ? NULL
				    : "R2CC does not know the clear-to-send layout of this "
				      "release of nccl-rdma-sharp-plugins";
	} else {
		t->kind = R2CC_TRANSPORT_PLUGIN;
		t->cts_unknown = true;
		if (api)
			snprintf(t->name, sizeof(t->name), "net plugin %.40s (%s)", net ? net : "?",
				 file);
		else
			snprintf(t->name, sizeof(t->name), "%s", file);
		t->why_not = api ? "R2CC does not know what this net plugin writes"
				 : "it is not NCCL's transport (R2CC repairs NCCL's traffic)";
	}
out:
	if (h)
		dlclose(h);
}

/* NCCL's transport found by the door it came through (r2cc_transport_of). */
static const struct r2cc_transport nccl_by_dlvsym = {
    .kind = R2CC_TRANSPORT_NCCL,
    .name = "NCCL IB (through dlvsym)",
};

static const struct r2cc_transport *by_door(const struct r2cc_transport *t, bool by_dlvsym)
{
	return by_dlvsym && t->kind == R2CC_TRANSPORT_PLUGIN && !t->net_plugin ? &nccl_by_dlvsym
									       : t;
}

const struct r2cc_transport *r2cc_transport_of(const void *caller, bool by_dlvsym)
{
	Dl_info di;
	if (!caller || !dladdr(caller, &di) || !di.dli_fbase)
		return by_door(&unknown_caller, by_dlvsym);
	pthread_mutex_lock(&mu);
	for (int i = 0; i < nknown; i++)
		if (known[i].base == di.dli_fbase) {
			pthread_mutex_unlock(&mu);
			return by_door(&known[i].t, by_dlvsym);
		}
	const struct r2cc_transport *t = &unknown_caller;
	if (nknown < KNOWN_MAX) {
		struct known *k = &known[nknown];
		k->base = di.dli_fbase;
		classify(di.dli_fname, di.dli_fbase, &k->t);
		nknown++;
		t = &k->t;
	}
	pthread_mutex_unlock(&mu);
	return by_door(t, by_dlvsym);
}
