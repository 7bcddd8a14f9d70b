/* Logging: level filtering, the NCCL-like prefix, errno preserved, the
 * backtrace path never crashes. */
#include "shim/log.h"
#include "shim/params.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char buf[8192];
static FILE *mem;

static void setup(void)
{
	memset(buf, 0, sizeof(buf));
	mem = fmemopen(buf, sizeof(buf), "w");
	r2cc_log_init();
	r2cc_log_set_stream(mem);
}

static void teardown(void)
{
	r2cc_log_set_stream(NULL);
	fclose(mem);
}

TestSuite(log, .init = setup, .fini = teardown);

Test(log, levels_filter)
{
	r2cc_log_set_level(R2CC_LOG_WARN);
	R2CC_INFO("hidden %d", 1);
	R2CC_WARN("shown %d", 2);
	fflush(mem);
	cr_expect_null(strstr(buf, "hidden"));
	cr_expect_not_null(strstr(buf, "shown 2"));
	r2cc_log_set_level(R2CC_LOG_NONE);
	R2CC_WARN("silenced");
	fflush(mem);
	cr_expect_null(strstr(buf, "silenced"));
}

Test(log, prefix_shape)
{
	r2cc_log_set_level(R2CC_LOG_INFO);
	R2CC_INFO("hello");
	R2CC_INFO_DEV(3, "dev line");
	fflush(mem);
	char host[64];
	gethostname(host, sizeof(host));
	char *dot = strchr(host, '.');
	if (dot)
		*dot = '\0';
	char want[128];
	snprintf(want, sizeof(want), "%s:%d:", host, (int)getpid());
	cr_expect(strncmp(buf, want, strlen(want)) == 0, "prefix: %s", buf);
	cr_expect_not_null(strstr(buf, " R2CC INFO hello\n"));
	cr_expect_not_null(strstr(buf, "[3] R2CC INFO dev line\n"));
}

Test(log, preserves_errno)
{
	r2cc_log_set_level(R2CC_LOG_TRACE);
	errno = EAGAIN;
	R2CC_TRACE("x %s", "y");
	cr_expect_eq(errno, EAGAIN);
	errno = ENOENT;
	r2cc_log_backtrace("test");
	cr_expect_eq(errno, ENOENT);
	fflush(mem);
	cr_expect_not_null(strstr(buf, "internal error: test"));
	cr_expect_not_null(strstr(buf, "#0 "), "backtrace frames: %s", buf);
}

Test(log, long_lines_are_cut_not_overflowed)
{
	r2cc_log_set_level(R2CC_LOG_WARN);
	char big[4000];
	memset(big, 'z', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	R2CC_WARN("%s", big);
	fflush(mem);
	size_t len = strlen(buf);
	cr_expect(len < 1100 && len > 900, "line length %zu", len);
	cr_expect_eq(buf[len - 1], '\n');
}

Test(log, warn_once)
{
	r2cc_log_set_level(R2CC_LOG_WARN);
	for (int i = 0; i < 5; i++)
		R2CC_WARN_ONCE("once-only %d", i);
	fflush(mem);
	cr_expect_not_null(strstr(buf, "once-only 0"));
	cr_expect_null(strstr(buf, "once-only 1"));
}

Test(log, path_expand)
{
	char out[256], want[256], host[64];
	gethostname(host, sizeof(host));
	host[sizeof(host) - 1] = '\0';
	char *dot = strchr(host, '.');
	if (dot)
		*dot = '\0';
	snprintf(want, sizeof(want), "/tmp/r2cc.%s.%d.txt%%", host, (int)getpid());
	cr_expect_str_eq(r2cc_path_expand("/tmp/r2cc.%h.%p.txt%", out, sizeof(out)), want);
	cr_expect_str_eq(r2cc_path_expand("plain", out, sizeof(out)), "plain");
	char tiny[40];
	r2cc_path_expand("%p%p%p%p%p%p%p%p%p%p%p%p%p%p", tiny, sizeof(tiny));
	cr_expect_lt(strlen(tiny), sizeof(tiny), "expansion overflowed");
}
