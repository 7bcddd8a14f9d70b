/*
 * When the check for repairs (strategies/failview.c, R2CC_AR_AFTER_REPAIR) is issued
 * and read: a clock of eligible AllReduce calls, nothing else. Every rank makes the
 * same eligible calls in the same order with the same sizes, so every rank issues and
 * reads each check at the same call and takes a new failure view at the same call;
 * nothing here may depend on what one rank knows (its own repaired NICs travel in the
 * check's all-gather instead). Pure: tests/unit/test_strategies_watch.c drives it.
 *
 * A check is issued after R2CC_WATCH_EVERY eligible calls or R2CC_WATCH_BYTES of them,
 * and read after R2CC_WATCH_LAG more calls or R2CC_WATCH_BYTES more: by then the GPU has
 * normally run it, so reading it stalls nothing. With AllReduces of 1 GiB or more each
 * call reads the check the one before issued, then issues the next.
 */
#ifndef R2CC_STRATEGIES_WATCH_H
#define R2CC_STRATEGIES_WATCH_H

#include <stdbool.h>
#include <string.h>

#define R2CC_WATCH_EVERY 16
#define R2CC_WATCH_BYTES (1024.0 * 1024 * 1024)
#define R2CC_WATCH_LAG	 4

struct r2cc_watch_clock {
	unsigned long calls; /* eligible calls since the last check was issued/read */
	double bytes;	     /* their bytes */
	bool pending;	     /* a check is in flight */
};

/* One eligible call of `bytes`: true when the pending check is to be read now (it is
 * then no longer pending). Call r2cc_watch_issue_due() after, unless the read
 * answer ends the call. */
static inline bool r2cc_watch_read_due(struct r2cc_watch_clock *w, double bytes)
{
	w->calls++;
	w->bytes += bytes;
	if (w->pending && (w->calls >= R2CC_WATCH_LAG || w->bytes >= R2CC_WATCH_BYTES)) {
		w->pending = false;
		return true;
	}
	return false;
}

/* True when a check is to be issued at this call (it is then pending). */
static inline bool r2cc_watch_issue_due(struct r2cc_watch_clock *w)
{
	if (w->pending || (w->calls < R2CC_WATCH_EVERY && w->bytes < R2CC_WATCH_BYTES))
		return false;
	w->calls = 0;
	w->bytes = 0;
	w->pending = true;
	return true;
}

/* A check's answer (repaired NICs per rank, n ranks) against the last one: true, and
 * `seen` updated, when they differ (a repair, another, a NIC back). */
static inline bool r2cc_watch_changed(int *seen, const int *answer, int n)
{
	if (!memcmp(seen, answer, sizeof(int) * (size_t)n))
		return false;
	memcpy(seen, answer, sizeof(int) * (size_t)n);
	return true;
}

#endif
