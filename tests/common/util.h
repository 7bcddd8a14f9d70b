/*
 * Small helpers the test programs share: the monotonic clock in seconds and in
 * milliseconds, and the process's peak resident memory. Header-only, so that a test
 * program takes them with an include and no change to its link line. Product code
 * (tools/, softverbs/, bench/) does not include tests/: it keeps its own.
 */
#ifndef R2CC_TESTS_COMMON_UTIL_H
#define R2CC_TESTS_COMMON_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* VmHWM of /proc/self/status in KiB, -1 where it cannot be read. */
static inline long hwm_kb(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kb = -1;

	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmHWM:", 6))
			kb = strtol(line + 6, NULL, 10);
	if (f)
		fclose(f);
	return kb;
}

#endif
