/*
 * The published statistics page (see stats.h). Created on the first NIC
 * registration, never on the data path; removed at exit. A crashed process
 * leaves its page behind: readers skip pages whose pid no longer exists and
 * `r2cc top --clean` removes them.
 */
#include "shim/stats.h"
#include "shim/core.h"
#include "shim/log.h"
#include "shim/params.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static struct r2cc_stats_page *page;
static char page_name[64];
static pthread_once_t page_once = PTHREAD_ONCE_INIT;

static void page_create(void)
{
	if (!r2cc_param.stats)
		return;
	snprintf(page_name, sizeof(page_name), "/" R2CC_STATS_PREFIX "%d", (int)getpid());
	/* A name another user made first (/dev/shm is shared) is not ours to fill. */
	int fd = shm_open(page_name, O_CREAT | O_RDWR, 0644);
	struct stat st;
	if (fd >= 0 && (fstat(fd, &st) != 0 || st.st_uid != getuid() || ftruncate(fd, 0) != 0)) {
		close(fd);
		fd = -1;
		errno = EPERM;
	}
	if (fd < 0) {
		R2CC_INFO("stats: cannot create %s (%s); r2cc top will not see this process",
			  page_name, strerror(errno));
		return;
	}
	void *p = MAP_FAILED;
	if (ftruncate(fd, sizeof(*page)) == 0)
		p = mmap(NULL, sizeof(*page), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		R2CC_INFO("stats: cannot map %s (%s)", page_name, strerror(errno));
		shm_unlink(page_name);
		return;
	}
	struct r2cc_stats_page *s = p;
	s->version = R2CC_STATS_VERSION;
	s->pid = (int32_t)getpid();
	r2cc_host_name(s->host, sizeof(s->host));
	r2cc_node_key(s->node, sizeof(s->node));
	s->mode = r2cc_param.mode;
	s->nic_size = sizeof(struct r2cc_nic);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	s->start_unix_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	__atomic_store_n(&s->magic, R2CC_STATS_MAGIC, __ATOMIC_RELEASE);
	page = s;
}

struct r2cc_stats_page *r2cc_stats_page(void)
{
	pthread_once(&page_once, page_create);
	return page;
}

void r2cc_stats_unpublish(void)
{
	if (page && page->pid == (int32_t)getpid())
		shm_unlink(page_name);
}
