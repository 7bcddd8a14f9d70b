/*
 * NCCL's external net plugins (netplugin.h): the names NCCL tries, and what a loaded
 * one is. Only dlopen/dlsym/dladdr: the library and `r2cc doctor` both use it.
 */
#include "intercept/netplugin.h"

#include <dlfcn.h>
#include <link.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int r2cc_netplugin_candidates(char names[][256])
{
	const char *v = getenv("NCCL_NET_PLUGIN");
	if (!v || !*v) {
		snprintf(names[0], 256, "libnccl-net.so");
		return 1;
	}
	if (!strcmp(v, "none"))
		return 0;
	int n = 0;
	char list[512];
	snprintf(list, sizeof(list), "%s", v);
	char *save = NULL;
	for (char *t = strtok_r(list, ",", &save); t && n + 2 <= R2CC_NETPLUGIN_CANDIDATES;
	     t = strtok_r(NULL, ",", &save)) {
		snprintf(names[n++], 256, "libnccl-net-%s.so", t);
		snprintf(names[n++], 256, "%s", t);
	}
	return n;
}

int r2cc_netplugin_probe(const char *file, bool load, struct r2cc_netplugin *p)
{
	memset(p, 0, sizeof(*p));
	snprintf(p->file, sizeof(p->file), "%s", file);
	void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL | (load ? 0 : RTLD_NOLOAD));
	if (!h)
		return -ENOENT;
	struct link_map *lm = NULL;
	if (dlinfo(h, RTLD_DI_LINKMAP, &lm) || !lm) {
		dlclose(h);
		return -ENOENT;
	}
	for (int v = R2CC_NETPLUGIN_API_MAX; v >= 2 && !p->api; v--) {
		char sym[32];
		snprintf(sym, sizeof(sym), "ncclNetPlugin_v%d", v);
		const char *const *s = dlsym(h, sym);
		Dl_info di;
		/* its own, not one of a library it depends on */
		if (!s || !dladdr(s, &di) || !di.dli_fname || strcmp(di.dli_fname, lm->l_name))
			continue;
		p->api = v;
		snprintf(p->path, sizeof(p->path), "%s", lm->l_name);
		snprintf(p->name, sizeof(p->name), "%s", *s ? *s : "?");
	}
	dlclose(h);
	return p->api ? 0 : -ENOTSUP;
}

bool r2cc_netplugin_is_ibext(const struct r2cc_netplugin *p)
{
	return !strncmp(p->name, "IBext", 5) || !strncmp(p->name, "NCCL RDMA Plugin", 16);
}
