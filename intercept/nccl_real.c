/*
 * NCCL as R2CC reaches it (nccl_real.h): the real functions, found where NCCL
 * is, the hook pointers and the thread's group depth. The NCCL door
 * (intercept/nccl.c) and the strategies (strategies/) share this; it calls
 * neither by name (the strategies set their first-communicator step).
 */
#include "intercept/nccl_real.h"
#include "shim/common.h"
#include "shim/core.h"
#include "shim/log.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define R2CC_NCCL_FN(name, params, args) real_nccl##name##_fn real_nccl##name;
#define R2CC_NCCL_OWN			 R2CC_NCCL_FN
#define R2CC_NCCL_REAL			 R2CC_NCCL_FN
#include "intercept/nccl_funcs.def"
#undef R2CC_NCCL_FN
#undef R2CC_NCCL_OWN
#undef R2CC_NCCL_REAL

r2cc_allreduce_hook_fn r2cc_allreduce_hook;
r2cc_comm_release_fn r2cc_comm_release_hook;
r2cc_comm_async_error_fn r2cc_comm_async_error_hook;
__thread int r2cc_nccl_groups;

static pthread_mutex_t first_comm_lock = PTHREAD_MUTEX_INITIALIZER;
static r2cc_nccl_first_comm_fn first_comm_step; /* under first_comm_lock */
static bool first_comm_came;			/* under first_comm_lock */

void r2cc_nccl_at_first_comm(r2cc_nccl_first_comm_fn fn)
{
	pthread_mutex_lock(&first_comm_lock);
	bool now = first_comm_came;
	if (!now)
		first_comm_step = fn;
	pthread_mutex_unlock(&first_comm_lock);
	if (now)
		fn();
}

void r2cc_nccl_first_comm(void)
{
	pthread_mutex_lock(&first_comm_lock);
	first_comm_came = true;
	r2cc_nccl_first_comm_fn fn = first_comm_step;
	pthread_mutex_unlock(&first_comm_lock);
	if (fn)
		fn();
}

int r2cc_nccl_group_depth(void)
{
	return r2cc_nccl_groups;
}

/*
 * Where NCCL is. An application linked with -lnccl has it in the global
 * scope; PyTorch loads it as a dependency of a library that Python opened
 * with RTLD_LOCAL, where RTLD_DEFAULT does not look. The fallback walks the
 * loaded objects for one that defines pncclGetVersion and takes a handle on
 * it without loading anything.
 */
static int find_nccl_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	void **out = arg;
	if (!info->dlpi_name || !strstr(info->dlpi_name, "libnccl"))
		return 0;
	void *h = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
	if (h && dlsym(h, "pncclGetVersion")) {
		*out = h;
		return 1;
	}
	if (h)
		dlclose(h);
	return 0;
}

static void *nccl_handle(void)
{
	static void *h;
	void *cur = __atomic_load_n(&h, __ATOMIC_ACQUIRE);
	if (!cur) {
		dl_iterate_phdr(find_nccl_cb, &cur);
		if (cur)
			__atomic_store_n(&h, cur, __ATOMIC_RELEASE);
	}
	return cur;
}

/* NCCL's own strong alias first: it is exactly the library's function even
 * when another interposer sits between us and libnccl. */
void *r2cc_nccl_resolve(const char *name)
{
	char p[64];
	snprintf(p, sizeof(p), "pnccl%s", name);
	void *f = dlsym(RTLD_DEFAULT, p);
	if (!f) {
		void *h = nccl_handle();
		if (h)
			f = dlsym(h, p);
	}
	if (!f) {
		snprintf(p, sizeof(p), "nccl%s", name);
		f = dlsym(RTLD_NEXT, p);
	}
	if (!f)
		R2CC_WARN("nccl%s is not in the loaded NCCL; the call fails with ncclInvalidUsage",
			  name);
	return f;
}

#define REAL(name) R2CC_NCCL_REAL_FN(name)

const struct r2cc_nccl_real *r2cc_nccl_real(void)
{
	static struct r2cc_nccl_real t;
	t.AllReduce = (void *)REAL(AllReduce);
	t.AllGather = (void *)REAL(AllGather);
	t.Reduce = (void *)REAL(Reduce);
	t.Broadcast = (void *)REAL(Broadcast);
	t.CommSplit = (void *)REAL(CommSplit);
	t.CommDestroy = (void *)REAL(CommDestroy);
	t.CommAbort = (void *)REAL(CommAbort);
	t.CommCount = (void *)REAL(CommCount);
	t.CommUserRank = (void *)REAL(CommUserRank);
	t.GroupStart = (void *)REAL(GroupStart);
	t.GroupEnd = (void *)REAL(GroupEnd);
	t.CommGetAsyncError = (void *)REAL(CommGetAsyncError);
	return &t;
}

void r2cc_nccl_version_probe(void)
{
	static int tried;
	if (__atomic_load_n(&r2cc_nccl_version, __ATOMIC_RELAXED) ||
	    __atomic_exchange_n(&tried, 1, __ATOMIC_RELAXED))
		return;
	/* quietly: a program without NCCL (perftest) is no error */
	real_ncclGetVersion_fn f = __atomic_load_n(&real_ncclGetVersion, __ATOMIC_RELAXED);
	if (!f)
		f = (real_ncclGetVersion_fn)dlsym(RTLD_DEFAULT, "pncclGetVersion");
	void *h = f ? NULL : nccl_handle();
	if (h)
		f = (real_ncclGetVersion_fn)dlsym(h, "pncclGetVersion");
	int v = 0;
	if (f && f(&v) == ncclSuccess && v > 0)
		r2cc_note_nccl_version(v);
}
