/*
 * The statistics pages of the node's R2CC processes (see pages.h): listing
 * /dev/shm, reading one page into private memory and telling a live page from
 * a stale, a foreign or an unreadable one. Nothing here trusts the file: any
 * size, any bytes, any file type (a FIFO is not opened for reading by
 * blocking) ends as one of the states with a reason.
 */
#include "tools/pages.h"

#include <dirent.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *const r2cc_page_state_names[R2CC_PAGE_NSTATES] = {"live", "stale", "bad", "unreadable",
							      "not_ready"};

bool r2cc_page_alive(int pid)
{
	return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

static void set_why(char *why, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_why(char *why, size_t len, const char *fmt, ...)
{
	if (!why || !len)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, len, fmt, ap);
	va_end(ap);
}

/* The pid a page's name carries (r2cc-stats.<pid>), or -1. */
static int name_pid(const char *name)
{
	const char *s = name + strlen(R2CC_STATS_PREFIX);
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (s[0] < '1' || s[0] > '9' || *end || errno || v > 0x7fffffff)
		return -1;
	return (int)v;
}

/* Strings of a copy end inside their arrays whatever the file held. */
static void terminate(struct r2cc_stats_page *pg)
{
	pg->host[sizeof(pg->host) - 1] = '\0';
	pg->node[sizeof(pg->node) - 1] = '\0';
	pg->unprotected[sizeof(pg->unprotected) - 1] = '\0';
	pg->drill_plan[sizeof(pg->drill_plan) - 1] = '\0';
	for (int i = 0; i < R2CC_MAX_NICS; i++)
		pg->nics[i].name[sizeof(pg->nics[i].name) - 1] = '\0';
}

enum r2cc_page_state r2cc_page_read(const char *name, struct r2cc_stats_page *pg, char *why,
				    size_t why_len)
{
	set_why(why, why_len, "%s", "");
	if (strncmp(name, R2CC_STATS_PREFIX, strlen(R2CC_STATS_PREFIX)) || strchr(name, '/')) {
		set_why(why, why_len, "not a statistics page name");
		return R2CC_PAGE_BAD;
	}
	int pid = name_pid(name);
	if (pid < 0) {
		set_why(why, why_len, "the name does not end in a process id");
		return R2CC_PAGE_BAD;
	}
	char path[300];
	snprintf(path, sizeof(path), R2CC_PAGES_DIR "/%s", name);
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return R2CC_PAGE_NOT_READY;
		set_why(why, why_len, "%s", errno == ELOOP ? "a symbolic link" : strerror(errno));
		return R2CC_PAGE_UNREADABLE;
	}
	enum r2cc_page_state st = R2CC_PAGE_BAD;
	struct stat sb;
	if (fstat(fd, &sb) != 0) {
		set_why(why, why_len, "%s", strerror(errno));
		st = R2CC_PAGE_UNREADABLE;
		goto out_close;
	}
	if (!S_ISREG(sb.st_mode)) {
		set_why(why, why_len, "not a regular file");
		st = R2CC_PAGE_UNREADABLE;
		goto out_close;
	}
	/* A process sizes its page, fills it and writes the magic last
	 * (shim/stats.c): empty, or the right size with no magic yet, is a page
	 * being made. */
	if (sb.st_size == 0) {
		st = R2CC_PAGE_NOT_READY;
		goto out_close;
	}
	size_t got = 0;
	while (got < sizeof(*pg)) {
		ssize_t n = pread(fd, (char *)pg + got, sizeof(*pg) - got, (off_t)got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			set_why(why, why_len, "%s", strerror(errno));
			st = R2CC_PAGE_UNREADABLE;
			goto out_close;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	bool head = got >= offsetof(struct r2cc_stats_page, pid);
	if (head && pg->magic == R2CC_STATS_MAGIC && pg->version != R2CC_STATS_VERSION) {
		set_why(why, why_len, "page version %u, this tool reads version %d", pg->version,
			R2CC_STATS_VERSION);
		goto out_bad;
	}
	if (got < sizeof(*pg)) {
		set_why(why, why_len, "%zu bytes, a page has %zu", got, sizeof(*pg));
		goto out_bad;
	}
	if (pg->magic == 0 && (size_t)sb.st_size == sizeof(*pg)) {
		st = R2CC_PAGE_NOT_READY;
		goto out_close;
	}
	if (pg->magic != R2CC_STATS_MAGIC) {
		set_why(why, why_len, "not an R2CC statistics page (bad magic)");
		goto out_bad;
	}
	if (pg->nic_size != sizeof(struct r2cc_nic)) {
		set_why(why, why_len, "NIC records of %u bytes, this tool reads %zu", pg->nic_size,
			sizeof(struct r2cc_nic));
		goto out_bad;
	}
	if (pg->pid != pid) {
		set_why(why, why_len, "holds pid %d, its name %d", (int)pg->pid, pid);
		goto out_bad;
	}
	if (pg->nnics < 0 || pg->nnics > R2CC_MAX_NICS) {
		set_why(why, why_len, "%d NIC records", (int)pg->nnics);
		goto out_bad;
	}
	terminate(pg);
	st = r2cc_page_alive(pid) ? R2CC_PAGE_LIVE : R2CC_PAGE_STALE;
	goto out_close;
out_bad:
	/* Whatever it holds, a file named for a process that is gone is a leftover
	 * (an older R2CC's page, a crash's) and no one's concern but --clean's. */
	st = r2cc_page_alive(pid) ? R2CC_PAGE_BAD : R2CC_PAGE_STALE;
out_close:
	close(fd);
	return st;
}

int r2cc_pages_each(bool (*fn)(const char *name, void *arg), void *arg)
{
	DIR *d = opendir(R2CC_PAGES_DIR);
	if (!d)
		return -errno;
	struct dirent *e;
	while ((e = readdir(d)))
		if (!strncmp(e->d_name, R2CC_STATS_PREFIX, strlen(R2CC_STATS_PREFIX)) &&
		    !fn(e->d_name, arg))
			break;
	closedir(d);
	return 0;
}

int r2cc_page_remove(const char *name)
{
	char path[300];
	snprintf(path, sizeof(path), R2CC_PAGES_DIR "/%s", name);
	return unlink(path) == 0 ? 0 : -errno;
}

int r2cc_page_nnics(const struct r2cc_stats_page *pg)
{
	int n = pg->nnics;
	return n < 0 ? 0 : n > R2CC_MAX_NICS ? R2CC_MAX_NICS : n;
}
