/* The node's placement ledger (see ledger.h). */
#include "repair/ledger.h"
#include "include/r2cc.h"
#include "shim/common.h"
#include "shim/log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define LEDGER_MAGIC 0x5232504cu /* "R2PL" */
#define LEDGER_SLOTS 64

enum { SLOT_FREE = 0, SLOT_CLAIMING, SLOT_NAMED };

struct slot {
	uint32_t state;
	char name[R2CC_NIC_NAME_MAX];
	int32_t moved[2];
};

struct table {
	uint32_t magic;
	uint32_t users;
	struct slot slot[LEDGER_SLOTS];
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct table *tab;
static int open_rc = 1; /* 1: not tried yet */
static char path[128];

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
	__atomic_store_n(&tab, t, __ATOMIC_RELEASE);
	open_rc = 0;
	atexit(r2cc_ledger_close);
	pthread_mutex_unlock(&mu);
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

/* The mapping stays: the repair thread may still be reading it while the
 * process exits. */
void r2cc_ledger_close(void)
{
	pthread_mutex_lock(&mu);
	struct table *t = tab;
	__atomic_store_n(&tab, NULL, __ATOMIC_RELEASE);
	if (t && __atomic_sub_fetch(&t->users, 1, __ATOMIC_ACQ_REL) == 0)
		shm_unlink(path);
	pthread_mutex_unlock(&mu);
}
