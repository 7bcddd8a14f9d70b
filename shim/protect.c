/*
 * Cases where R2CC does not protect this process (protect.h). A few distinct
 * cases at most, noted from control paths (communicator set-up, QP creation):
 * a mutex, no allocation.
 */
#include "shim/protect.h"
#include "shim/log.h"
#include "shim/stats.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define SEEN_MAX 16

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char seen[SEEN_MAX][64]; /* the `what` of each case logged */
static int nseen;
static char first[R2CC_UNPROTECTED_MAX];
static unsigned long count;

void r2cc_unprotected(const char *what, const char *why, const char *fix)
{
	bool log = true;
	pthread_mutex_lock(&mu);
	count++;
	for (int i = 0; i < nseen && log; i++)
		log = strncmp(seen[i], what, sizeof(seen[i]) - 1) != 0;
	if (log && nseen < SEEN_MAX)
		snprintf(seen[nseen++], sizeof(seen[0]), "%s", what);
	if (!first[0]) {
		snprintf(first, sizeof(first), "%s: %s", what, why);
		struct r2cc_stats_page *pg = r2cc_stats_page();
		if (pg)
			snprintf(pg->unprotected, sizeof(pg->unprotected), "%s", first);
	}
	pthread_mutex_unlock(&mu);
	if (log)
		R2CC_WARN("NOT PROTECTED: %s: %s; R2CC will not repair it%s%s%s", what, why,
			  fix ? " (" : "", fix ? fix : "", fix ? ")" : "");
}

const char *r2cc_unprotected_first(void)
{
	pthread_mutex_lock(&mu);
	const char *f = first[0] ? first : NULL;
	pthread_mutex_unlock(&mu);
	return f;
}

unsigned long r2cc_unprotected_count(void)
{
	pthread_mutex_lock(&mu);
	unsigned long n = count;
	pthread_mutex_unlock(&mu);
	return n;
}
