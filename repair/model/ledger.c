/* The node's placement ledger (see ledger.h). */
#include "repair/model/ledger.h"
#include "include/r2cc.h"
#include "shim/common.h"
#include "shim/log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LEDGER_MAGIC 0x52325045u /* "R2PE": load rows, failures and dead NICs with why */
#define LEDGER_SLOTS 64
#define LEDGER_ROWS  64		  /* processes of one node that publish their load */
#define LIVE_NS	     1000000000ll /* how long a row's liveness check is trusted */
#define STALE_S	     60		  /* a table left this long with no live process goes */
#define SWEEP_MAX    256	  /* tables looked at per sweep */

enum { SLOT_FREE = 0, SLOT_CLAIMING, SLOT_NAMED };

struct slot {
	uint32_t state;
	char name[R2CC_NIC_NAME_MAX];
	int32_t moved[2];
	int64_t failed_at; /* the last failure any process saw on the NIC (monotonic ns) */
	int64_t dead_at;   /* the last time a process found the NIC itself dead */
	int32_t dead_pid;  /* ... which process */
	int32_t pad;
	char dead_why[R2CC_LEDGER_WHY]; /* ... and why (bytes stored one by one, atomically) */
};

/* One process's load, per NIC slot; pid 0 is a free row. */
struct row {
	uint32_t pid;
	uint32_t pad;
	uint64_t queued[LEDGER_SLOTS];
	uint64_t drained[LEDGER_SLOTS];
};

struct table {
	uint32_t magic;
	uint32_t users;
	struct slot slot[LEDGER_SLOTS];
	struct row row[LEDGER_ROWS];
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct table *tab;
static int open_rc = 1; /* 1: not tried yet */
static char path[128];
/* The repair thread's own: this process's row, and when each row was last seen alive. */
static struct row *own_row;
static bool own_row_tried;
static int64_t row_alive_at[LEDGER_ROWS];
static uint32_t row_alive_pid[LEDGER_ROWS];
static bool row_alive[LEDGER_ROWS];

static bool pid_alive(uint32_t pid);
static struct row *row_claim(struct table *t);

/*
 * Tables that killed jobs left behind (their last process never ran its exit
 * handler): this user's, of this layout, untouched for STALE_S, whose every row is
 * free or names a process that is gone. Every process claims its row when it opens
 * a table, so such a table has no user. Returns how many were removed.
 */
static int sweep_stale(const char *keep)
{
	char prefix[64];
	snprintf(prefix, sizeof(prefix), "r2cc-place-%u-", (unsigned)getuid());
	DIR *d = opendir("/dev/shm");
	if (!d)
		return 0;
	int removed = 0, seen = 0;
	time_t now = time(NULL);
	for (struct dirent *e; (e = readdir(d)) && seen < SWEEP_MAX;) {
		if (strncmp(e->d_name, prefix, strlen(prefix)) || !strcmp(e->d_name, keep + 1))
			continue;
		seen++;
		char name[300];
		snprintf(name, sizeof(name), "/%s", e->d_name);
		int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
		struct stat st;
		if (fd < 0)
			continue;
		const struct table *t = MAP_FAILED;
		if (fstat(fd, &st) == 0 && st.st_uid == getuid() &&
		    st.st_size == sizeof(struct table) && now - st.st_mtime > STALE_S)
			t = mmap(NULL, sizeof(struct table), PROT_READ, MAP_SHARED, fd, 0);
		close(fd);
		if (t == MAP_FAILED)
			continue;
		bool live = __atomic_load_n(&t->magic, __ATOMIC_ACQUIRE) != LEDGER_MAGIC;
		for (int i = 0; i < LEDGER_ROWS && !live; i++)
			live = pid_alive(__atomic_load_n(&t->row[i].pid, __ATOMIC_ACQUIRE));
		munmap((void *)t, sizeof(struct table));
		if (!live && shm_unlink(name) == 0)
			removed++;
	}
	closedir(d);
	return removed;
}

int r2cc_ledger_open(uint64_t job_id, const char *node_key)
{
	pthread_mutex_lock(&mu);
	if (open_rc != 1) {
		pthread_mutex_unlock(&mu);
		return open_rc;
	}
	snprintf(path, sizeof(path), "/r2cc-place-%u-%016llx-%08x", (unsigned)getuid(),
		 (unsigned long long)job_id, r2cc_hash32(node_key ? node_key : ""));
	int fd = shm_open(path, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
	struct stat st;
	void *p = MAP_FAILED;
	/* Only a table this user made, of the right size (a concurrent creator's
	 * ftruncate to the same size is harmless). */
	if (fd >= 0 && fstat(fd, &st) == 0 && st.st_uid == getuid() &&
	    (st.st_size == sizeof(struct table) ||
	     (st.st_size == 0 && ftruncate(fd, sizeof(struct table)) == 0)))
		p = mmap(NULL, sizeof(struct table), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	int err = errno;
	if (fd >= 0)
		close(fd);
	if (p == MAP_FAILED) {
		open_rc = -(err ? err : EINVAL);
		R2CC_INFO("repair: no placement ledger for this node (%s): NICs are balanced per "
			  "process",
			  strerror(-open_rc));
		pthread_mutex_unlock(&mu);
		return open_rc;
	}
	struct table *t = p;
	uint32_t zero = 0;
	__atomic_compare_exchange_n(&t->magic, &zero, LEDGER_MAGIC, false, __ATOMIC_ACQ_REL,
				    __ATOMIC_ACQUIRE);
	if (__atomic_load_n(&t->magic, __ATOMIC_ACQUIRE) != LEDGER_MAGIC) {
		munmap(p, sizeof(struct table));
		open_rc = -EPROTO;
		pthread_mutex_unlock(&mu);
		return open_rc;
	}
	__atomic_add_fetch(&t->users, 1, __ATOMIC_ACQ_REL);
	/* The row at once: a table whose rows are all gone has no user (sweep_stale). */
	own_row = row_claim(t);
	own_row_tried = true;
	__atomic_store_n(&tab, t, __ATOMIC_RELEASE);
	open_rc = 0;
	atexit(r2cc_ledger_close);
	pthread_mutex_unlock(&mu);
	int n = sweep_stale(path);
	if (n)
		R2CC_INFO("repair: removed %d placement table(s) that ended jobs left in /dev/shm",
			  n);
	return 0;
}

/* The slot named nic, claimed if claim and none is; NULL without a table. */
static struct slot *find(const char *nic, bool claim)
{
	struct table *t = __atomic_load_n(&tab, __ATOMIC_ACQUIRE);
	if (!t || !nic || !nic[0])
		return NULL;
	for (int pass = 0; pass < 2; pass++) {
		for (int i = 0; i < LEDGER_SLOTS; i++) {
			struct slot *s = &t->slot[i];
			uint32_t st = __atomic_load_n(&s->state, __ATOMIC_ACQUIRE);
			for (int spin = 0; st == SLOT_CLAIMING && spin < 1000; spin++)
				st = __atomic_load_n(&s->state, __ATOMIC_ACQUIRE);
			if (st == SLOT_NAMED && !strncmp(s->name, nic, sizeof(s->name)))
				return s;
			if (st != SLOT_FREE || !claim || pass == 0)
				continue;
			uint32_t free_ = SLOT_FREE;
			if (!__atomic_compare_exchange_n(&s->state, &free_, SLOT_CLAIMING, false,
							 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
				continue;
			snprintf(s->name, sizeof(s->name), "%s", nic);
			__atomic_store_n(&s->state, SLOT_NAMED, __ATOMIC_RELEASE);
			return s;
		}
		/* pass 0 looked for the name everywhere; pass 1 also claims */
	}
	return NULL;
}

void r2cc_ledger_failed_put(const char *nic, int64_t when)
{
	struct slot *s = find(nic, true);
	if (!s)
		return;
	r2cc_atomic_max_i64(&s->failed_at, when, __ATOMIC_RELAXED);
}

int64_t r2cc_ledger_failed_at(const char *nic)
{
	struct slot *s = find(nic, false);
	return s ? __atomic_load_n(&s->failed_at, __ATOMIC_RELAXED) : 0;
}

void r2cc_ledger_dead_put(const char *nic, int64_t when, int pid, const char *why)
{
	struct slot *s = find(nic, true);
	if (!s || when <= __atomic_load_n(&s->dead_at, __ATOMIC_RELAXED))
		return; /* a later verdict's reason stays */
	/* the pid and the reason first: a reader that sees the time sees whose it is (or a
	 * later one's; two at once may mix their reasons, which are only text) */
	size_t n = strnlen(why, R2CC_LEDGER_WHY - 1);
	for (size_t i = 0; i < R2CC_LEDGER_WHY; i++)
		__atomic_store_n(&s->dead_why[i], i < n ? why[i] : '\0', __ATOMIC_RELAXED);
	__atomic_store_n(&s->dead_pid, pid, __ATOMIC_RELAXED);
	r2cc_atomic_max_i64(&s->dead_at, when, __ATOMIC_RELEASE);
}

int64_t r2cc_ledger_dead_at(const char *nic, int *pid, char *why)
{
	struct slot *s = find(nic, false);
	int64_t t = s ? __atomic_load_n(&s->dead_at, __ATOMIC_ACQUIRE) : 0;
	*pid = s ? __atomic_load_n(&s->dead_pid, __ATOMIC_RELAXED) : 0;
	for (size_t i = 0; why && i < R2CC_LEDGER_WHY; i++)
		why[i] = s ? __atomic_load_n(&s->dead_why[i], __ATOMIC_RELAXED) : '\0';
	if (why)
		why[R2CC_LEDGER_WHY - 1] = '\0';
	return t;
}

int r2cc_ledger_get(const char *nic, int dir)
{
	struct slot *s = find(nic, false);
	return s ? __atomic_load_n(&s->moved[dir != 0], __ATOMIC_ACQUIRE) : 0;
}

void r2cc_ledger_add(const char *nic, int dir, int delta)
{
	struct slot *s = find(nic, true);
	if (s)
		__atomic_add_fetch(&s->moved[dir != 0], delta, __ATOMIC_ACQ_REL);
}

static bool pid_alive(uint32_t pid)
{
	return pid && (kill((pid_t)pid, 0) == 0 || errno != ESRCH);
}

/* A row for this process: a free one, or one a dead process left. */
static struct row *row_claim(struct table *t)
{
	uint32_t me = (uint32_t)getpid();
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < LEDGER_ROWS; i++) {
			struct row *w = &t->row[i];
			uint32_t pid = __atomic_load_n(&w->pid, __ATOMIC_ACQUIRE);
			if (pid == me)
				return w;
			if (pass == 0 ? pid != 0 : pid_alive(pid))
				continue;
			if (!__atomic_compare_exchange_n(&w->pid, &pid, me, false, __ATOMIC_ACQ_REL,
							 __ATOMIC_ACQUIRE))
				continue;
			for (int k = 0; k < LEDGER_SLOTS; k++) {
				__atomic_store_n(&w->queued[k], 0, __ATOMIC_RELAXED);
				__atomic_store_n(&w->drained[k], 0, __ATOMIC_RELAXED);
			}
			return w;
		}
	return NULL;
}

void r2cc_ledger_load_put(const char *nic, uint64_t queued, uint64_t drained)
{
	struct table *t = __atomic_load_n(&tab, __ATOMIC_ACQUIRE);
	struct slot *s = find(nic, true);
	if (!t || !s)
		return;
	if (!own_row_tried) {
		own_row_tried = true;
		own_row = row_claim(t);
	}
	if (!own_row)
		return;
	int k = (int)(s - t->slot);
	__atomic_store_n(&own_row->queued[k], queued, __ATOMIC_RELAXED);
	__atomic_store_n(&own_row->drained[k], drained, __ATOMIC_RELAXED);
}

bool r2cc_ledger_load_get(const char *nic, uint64_t *queued, uint64_t *drained)
{
	struct table *t = __atomic_load_n(&tab, __ATOMIC_ACQUIRE);
	struct slot *s = find(nic, false);
	*queued = *drained = 0;
	if (!t || !s)
		return false;
	int k = (int)(s - t->slot);
	int64_t now = (int64_t)r2cc_now_ns();
	for (int i = 0; i < LEDGER_ROWS; i++) {
		struct row *w = &t->row[i];
		uint32_t pid = __atomic_load_n(&w->pid, __ATOMIC_ACQUIRE);
		if (!pid)
			continue;
		/* A process killed before it could free its row must not hold its
		 * last queue forever: rows are checked once a second. */
		if (w != own_row && (pid != row_alive_pid[i] || now - row_alive_at[i] > LIVE_NS)) {
			row_alive[i] = pid_alive(pid);
			row_alive_pid[i] = pid;
			row_alive_at[i] = now;
		}
		if (w != own_row && !row_alive[i])
			continue;
		*queued += __atomic_load_n(&w->queued[k], __ATOMIC_RELAXED);
		*drained += __atomic_load_n(&w->drained[k], __ATOMIC_RELAXED);
	}
	return true;
}

/* The mapping stays: the repair thread may still be reading it while the
 * process exits. */
void r2cc_ledger_close(void)
{
	pthread_mutex_lock(&mu);
	struct table *t = tab;
	__atomic_store_n(&tab, NULL, __ATOMIC_RELEASE);
	if (own_row)
		__atomic_store_n(&own_row->pid, 0, __ATOMIC_RELEASE);
	if (t && __atomic_sub_fetch(&t->users, 1, __ATOMIC_ACQ_REL) == 0)
		shm_unlink(path);
	pthread_mutex_unlock(&mu);
}
