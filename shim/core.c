/*
 * Start-up: the constructor and every entry point call r2cc_init(), which
 * reads the settings once, starts logging, creates the registries and
 * decides whether R2CC is active. Constructor order is not guaranteed (NCCL
 * or the application may call in first), so initialisation is a once-only
 * function rather than constructor work. Fork: the registries describe verbs
 * objects the child inherits only as memory; a child keeps them read-only.
 */
#include "shim/core.h"
#include "include/r2cc.h"
#include "shim/common.h"
#include "shim/log.h"
#include "shim/params.h"
#include "shim/registry.h"
#include "shim/report.h"
#include "shim/stats.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int r2cc_state;
int r2cc_nccl_version;

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

/*
 * A forked child (a data loader worker, a launcher's helper) has none of the
 * parent's threads: no repair, control-plane or self-test thread runs there, so
 * nothing R2CC started would be finished. The child runs as plain NCCL from the
 * fork on: what it opens is passed through, errors on what it inherited reach it,
 * one line says so (at INFO, since data loaders fork many).
 */
static void atfork_child(void)
{
	if (__atomic_exchange_n(&r2cc_state, -1, __ATOMIC_ACQ_REL) > 0)
		R2CC_INFO("forked child: R2CC runs as plain NCCL (pass-through) in this process");
}

static void init_once_fn(void)
{
	int rc = r2cc_params_load();
	int state = 1;
	if (rc) {
		state = -1;
	} else if (r2cc_param.mode == R2CC_MODE_PASSTHROUGH) {
		R2CC_INFO("R2CC_MODE=0: plain NCCL, every call passed through");
		if (r2cc_param.drill[0]) /* the drill is hot repair's: told, not silently dropped */
			r2cc_log_write(R2CC_LOG_WARN, -1,
				       "R2CC_DRILL is set but R2CC_MODE=0: no drill runs");
		state = -1;
	} else if (r2cc_registry_init()) {
		r2cc_log_write(R2CC_LOG_WARN, -1,
			       "cannot allocate registries; R2CC runs as plain NCCL");
		state = -1;
	}
	if (state > 0) {
		r2cc_cq_gate_init();
		R2CC_INFO("R2CC %s active, mode %d", R2CC_VERSION_STRING, r2cc_param.mode);
		r2cc_params_log_nondefault(&r2cc_param);
		pthread_atfork(NULL, NULL, atfork_child);
	}
	__atomic_store_n(&r2cc_state, state, __ATOMIC_RELEASE);
}

bool r2cc_init(void)
{
	pthread_once(&init_once, init_once_fn);
	return __atomic_load_n(&r2cc_state, __ATOMIC_ACQUIRE) > 0;
}

void r2cc_disable(const char *why)
{
	if (__atomic_exchange_n(&r2cc_state, -1, __ATOMIC_ACQ_REL) > 0)
		r2cc_log_backtrace(why);
}

void r2cc_note_nccl_version(int code)
{
	if (__atomic_exchange_n(&r2cc_nccl_version, code, __ATOMIC_RELAXED) == code)
		return;
	int major = code >= 10000 ? code / 10000 : code / 1000;
	int minor = code >= 10000 ? code / 100 % 100 : code / 100 % 10;
	int patch = code >= 10000 ? code % 100 : code % 100;
	R2CC_INFO("NCCL %d.%d.%d", major, minor, patch);
	if (major < 2 || (major == 2 && minor < 18)) {
		r2cc_log_write(
		    R2CC_LOG_WARN, -1,
		    "NCCL %d.%d.%d is older than 2.18, which R2CC needs; running as plain NCCL",
		    major, minor, patch);
		__atomic_store_n(&r2cc_state, -1, __ATOMIC_RELEASE);
	}
}

int r2cc_thread_start(void *(*fn)(void *), void *arg, const char *name)
{
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_t t;
	int rc = pthread_create(&t, &attr, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&attr);
	if (!rc)
		pthread_setname_np(t, name);
	return -rc;
}

const char *r2cc_host_name(char *buf, size_t len)
{
	if (gethostname(buf, len) != 0)
		snprintf(buf, len, "?");
	buf[len - 1] = '\0';
	return buf;
}

const char *r2cc_node_key(char *buf, size_t len)
{
	const char *id = getenv("NCCL_HOSTID");
	if (id && id[0]) {
		snprintf(buf, len, "%s", id);
		return buf;
	}
	return r2cc_host_name(buf, len);
}

R2CC_EXPORT const char *r2cc_version(void)
{
	return R2CC_VERSION_STRING;
}

__attribute__((constructor)) static void r2cc_constructor(void)
{
	r2cc_init();
}

__attribute__((destructor)) static void r2cc_destructor(void)
{
	if (__atomic_load_n(&r2cc_state, __ATOMIC_ACQUIRE) > 0)
		r2cc_report_at_exit();
	r2cc_stats_unpublish();
}
