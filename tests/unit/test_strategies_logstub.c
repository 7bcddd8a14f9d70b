/*
 * Logging stub for the strategies tests: counts warnings instead of printing
 * them (the tests assert on the counts), prints when R2CC_TEST_LOG is set.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "shim/log.h"

int r2cc_log_level = R2CC_LOG_INFO;
int r2cc_test_warnings;

void r2cc_log_write(int level, int dev, const char *fmt, ...)
{
	va_list ap;

	if (level == R2CC_LOG_WARN)
		__atomic_add_fetch(&r2cc_test_warnings, 1, __ATOMIC_RELAXED);
	if (!getenv("R2CC_TEST_LOG"))
		return;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}
