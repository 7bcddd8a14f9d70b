/*
 * The fault-injection countdown (see fault.h). R2CC_FAULT_INJECT is read on
 * the first call of any kind (allocations come before every constructor's
 * work), with getenv only: nothing here allocates.
 */
#include "shim/fault.h"
#include "shim/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int r2cc_fault_active = -1;

static const char *const kind_names[R2CC_FAULT_KINDS] = {"alloc", "verbs", "send", "post"};

static struct {
	int kind; /* the armed kind, or -1 */
	uint64_t at;
	bool repeat;
	bool counting;
	char count_path[256];
	uint64_t calls[R2CC_FAULT_KINDS];
	uint64_t fired[R2CC_FAULT_KINDS];
} fi = {.kind = -1};

static void fault_read_env(void)
{
	const char *v = getenv("R2CC_FAULT_INJECT");
	if (!v || !*v) {
		__atomic_store_n(&r2cc_fault_active, 0, __ATOMIC_RELEASE);
		return;
	}
	if (strncmp(v, "count:", 6) == 0 && v[6]) {
		snprintf(fi.count_path, sizeof(fi.count_path), "%s", v + 6);
		fi.counting = true;
	}
	for (int k = 0; k < R2CC_FAULT_KINDS && !fi.counting; k++) {
		size_t n = strlen(kind_names[k]);
		char *end;
		if (strncmp(v, kind_names[k], n) != 0 || v[n] != ':')
			continue;
		unsigned long long at = strtoull(v + n + 1, &end, 10);
		if (end != v + n + 1 && at > 0 && (*end == 0 || (end[0] == '+' && !end[1]))) {
			fi.kind = k;
			fi.at = at;
			fi.repeat = *end == '+';
		}
	}
	/* A value that is neither arms nothing; the log says so once it can. */
	__atomic_store_n(&r2cc_fault_active, 1, __ATOMIC_RELEASE);
}

bool r2cc_fault_check(int kind)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, fault_read_env);
	if (!__atomic_load_n(&r2cc_fault_active, __ATOMIC_ACQUIRE))
		return false;
	uint64_t n = __atomic_add_fetch(&fi.calls[kind], 1, __ATOMIC_RELAXED);
	if (kind != fi.kind || n < fi.at || (n > fi.at && !fi.repeat))
		return false;
	__atomic_fetch_add(&fi.fired[kind], 1, __ATOMIC_RELAXED);
	r2cc_fault_hit(kind, n);
	return true;
}

__attribute__((noinline)) void r2cc_fault_hit(int kind, uint64_t n)
{
	/* Nothing: a breakpoint target ("break r2cc_fault_hit"). */
	__asm__ volatile("" : : "r"(kind), "r"(n) : "memory");
}

/* Last of the destructors, so that what the others allocate is counted too. */
__attribute__((destructor(101))) static void fault_at_exit(void)
{
	if (__atomic_load_n(&r2cc_fault_active, __ATOMIC_ACQUIRE) <= 0)
		return;
	if (!fi.counting && fi.kind < 0) {
		R2CC_WARN("R2CC_FAULT_INJECT=%s: accepts alloc|verbs|send|post:N[+] or count:PATH; "
			  "nothing was injected",
			  getenv("R2CC_FAULT_INJECT") ? getenv("R2CC_FAULT_INJECT") : "");
		return;
	}
	if (!fi.counting)
		return;
	char path[512];
	r2cc_path_expand(fi.count_path, path, sizeof(path));
	FILE *f = fopen(path, "w");
	if (!f)
		return;
	for (int k = 0; k < R2CC_FAULT_KINDS; k++)
		fprintf(f, "%s %llu\n", kind_names[k], (unsigned long long)fi.calls[k]);
	fclose(f);
}
