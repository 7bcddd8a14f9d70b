/*
 * Logging: the level and the destination are read once from R2CC_DEBUG and
 * R2CC_DEBUG_FILE; each line carries NCCL's prefix shape so that R2CC's lines
 * interleave readably with NCCL_DEBUG=INFO output. One write(2)-sized fprintf
 * per line keeps lines from different threads whole.
 */
#include "shim/log.h"
#include "shim/params.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <dlfcn.h>
#include <execinfo.h>

int r2cc_log_level = R2CC_LOG_WARN;
static FILE *log_stream;
static char log_host[64];

static const char *const level_names[] = {"NONE", "WARN", "INFO", "TRACE"};

void r2cc_log_set_level(int level)
{
	r2cc_log_level = level;
}

void r2cc_log_set_stream(void *file)
{
	log_stream = file;
}

/* The host name up to its first dot, as NCCL prints it. (log.c stands alone:
 * the tests link it without the rest of the shim.) */
static void short_host(char *host, size_t len)
{
	if (gethostname(host, len) != 0)
		snprintf(host, len, "?");
	host[len - 1] = '\0';
	char *dot = strchr(host, '.');
	if (dot)
		*dot = '\0';
}

const char *r2cc_path_expand(const char *pattern, char *path, size_t len)
{
	/* %h and %p as in NCCL_DEBUG_FILE. */
	char host[64];
	short_host(host, sizeof(host));
	size_t o = 0;
	for (const char *s = pattern; *s && o + 32 < len; s++) {
		if (s[0] == '%' && s[1] == 'h') {
			o += (size_t)snprintf(path + o, len - o, "%s", host);
			s++;
		} else if (s[0] == '%' && s[1] == 'p') {
			o += (size_t)snprintf(path + o, len - o, "%d", (int)getpid());
			s++;
		} else {
			path[o++] = *s;
		}
	}
	path[o < len ? o : len - 1] = '\0';
	return path;
}

static void open_debug_file(const char *pattern)
{
	char path[512];
	r2cc_path_expand(pattern, path, sizeof(path));
	FILE *f = fopen(path, "a");
	if (f) {
		setvbuf(f, NULL, _IOLBF, 0);
		log_stream = f;
	} else {
		r2cc_log_write(R2CC_LOG_WARN, -1,
			       "R2CC_DEBUG_FILE: cannot open '%s' (%s); logging to stderr", path,
			       strerror(errno));
	}
}

void r2cc_log_init(void)
{
	int saved = errno;
	short_host(log_host, sizeof(log_host));
	r2cc_log_level = r2cc_param.debug;
	if (r2cc_param.debug_file[0])
		open_debug_file(r2cc_param.debug_file);
	errno = saved;
}

void r2cc_log_write(int level, int dev, const char *fmt, ...)
{
	int saved = errno;
	char line[1024];
	int n;
	if (level < R2CC_LOG_WARN || level > R2CC_LOG_TRACE)
		level = R2CC_LOG_WARN;
	if (dev >= 0)
		n = snprintf(line, sizeof(line), "%s:%d:%ld [%d] R2CC %s ", log_host, (int)getpid(),
			     (long)syscall(SYS_gettid), dev, level_names[level]);
	else
		n = snprintf(line, sizeof(line), "%s:%d:%ld R2CC %s ", log_host, (int)getpid(),
			     (long)syscall(SYS_gettid), level_names[level]);
	if (n < 0)
		n = 0;
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
	if (len > sizeof(line) - 2)
		len = sizeof(line) - 2;
	line[len++] = '\n';
	line[len] = '\0';
	FILE *out = log_stream ? log_stream : stderr;
	fputs(line, out);
	fflush(out);
	errno = saved;
}

/*
 * libunwind is loaded when needed rather than linked, so that a machine
 * without it still runs R2CC; glibc's backtrace() is the fallback.
 */
typedef int (*unw_backtrace_fn)(void **buffer, int size);

void r2cc_log_backtrace(const char *why)
{
	int saved = errno;
	void *ips[32];
	int n = 0;
	void *h = dlopen("libunwind.so.8", RTLD_LAZY | RTLD_LOCAL);
	unw_backtrace_fn unw = h ? (unw_backtrace_fn)dlsym(h, "unw_backtrace") : NULL;
	n = unw ? unw(ips, 32) : backtrace(ips, 32);
	r2cc_log_write(R2CC_LOG_WARN, -1, "internal error: %s; backtrace (%s) follows", why,
		       unw ? "libunwind" : "glibc");
	for (int i = 1; i < n; i++) {
		Dl_info info;
		if (dladdr(ips[i], &info) && info.dli_sname)
			r2cc_log_write(R2CC_LOG_WARN, -1, "  #%d %p %s+0x%lx (%s)", i - 1, ips[i],
				       info.dli_sname,
				       (unsigned long)((char *)ips[i] - (char *)info.dli_saddr),
				       info.dli_fname);
		else
			r2cc_log_write(R2CC_LOG_WARN, -1, "  #%d %p (%s)", i - 1, ips[i],
				       info.dli_fname ? info.dli_fname : "?");
	}
	if (h)
		dlclose(h);
	errno = saved;
}
