/*
 * `r2cc top`: the live per-NIC view of every R2CC process on this node, from
 * the statistics pages the library publishes in /dev/shm (shim/stats.h). Each
 * refresh shows, per process and NIC, the NIC's state and the send rate (bytes
 * and work requests posted per second), receive completions per second and
 * error completions; with --prometheus it prints the counters once in the
 * Prometheus text exposition format instead.
 */
#include "tools/top.h"
#include "shim/stats.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_PROCS 256

struct proc {
	char name[256];
	const struct r2cc_stats_page *page;
	struct r2cc_nic_counters last[R2CC_MAX_NICS];
};

static int nprocs;
static struct proc procs[MAX_PROCS];

static bool alive(int pid)
{
	return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

static const struct r2cc_stats_page *map_page(const char *name, bool *stale)
{
	char path[300];
	snprintf(path, sizeof(path), "/dev/shm/%s", name);
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return NULL;
	struct stat st;
	void *p = MAP_FAILED;
	if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(struct r2cc_stats_page))
		p = mmap(NULL, sizeof(struct r2cc_stats_page), PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return NULL;
	const struct r2cc_stats_page *pg = p;
	if (__atomic_load_n(&pg->magic, __ATOMIC_ACQUIRE) != R2CC_STATS_MAGIC ||
	    pg->version != R2CC_STATS_VERSION || pg->nic_size != sizeof(struct r2cc_nic)) {
		munmap(p, sizeof(struct r2cc_stats_page));
		return NULL;
	}
	*stale = !alive(pg->pid);
	return pg;
}

/* Map every live page not mapped yet; with clean, remove stale ones. */
static void scan(bool clean, int *stale_count)
{
	DIR *d = opendir("/dev/shm");
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (strncmp(e->d_name, R2CC_STATS_PREFIX, strlen(R2CC_STATS_PREFIX)))
			continue;
		bool known = false;
		for (int i = 0; i < nprocs && !known; i++)
			known = !strcmp(procs[i].name, e->d_name);
		if (known)
			continue;
		bool stale = false;
		const struct r2cc_stats_page *pg = map_page(e->d_name, &stale);
		if (!pg)
			continue;
		if (stale) {
			(*stale_count)++;
			if (clean) {
				char path[300];
				snprintf(path, sizeof(path), "/dev/shm/%s", e->d_name);
				unlink(path);
			}
			munmap((void *)pg, sizeof(*pg));
			continue;
		}
		if (nprocs == MAX_PROCS) {
			munmap((void *)pg, sizeof(*pg));
			break;
		}
		struct proc *p = &procs[nprocs++];
		snprintf(p->name, sizeof(p->name), "%s", e->d_name);
		p->page = pg;
		for (int i = 0; i < pg->nnics && i < R2CC_MAX_NICS; i++)
			p->last[i] = pg->nics[i].cnt;
	}
	closedir(d);
}

static const char *nic_state(const struct r2cc_nic *n)
{
	if (n->state == R2CC_NIC_DOWN)
		return "FAILED";
	if (n->state == R2CC_NIC_DECLARED)
		return "DECLARED";
	return n->port_state == 4 /* IBV_PORT_ACTIVE */ ? "up" : "port-down";
}

/* A NIC whose queue pairs R2CC_DRILL cut in that process (repair/drill.h). */
static bool drilled(const struct r2cc_stats_page *pg, int j)
{
	return j < 64 && (__atomic_load_n(&pg->drill_nics, __ATOMIC_ACQUIRE) >> j & 1);
}

static void print_table(double secs)
{
	printf("%-8s %-12s %-10s %-12s %12s %12s %12s %10s\n", "pid", "node", "nic", "state",
	       "send MB/s", "send WR/s", "recv CQE/s", "err CQEs");
	int rows = 0;
	for (int i = 0; i < nprocs; i++) {
		struct proc *p = &procs[i];
		if (!alive(p->page->pid))
			continue;
		int n = __atomic_load_n(&p->page->nnics, __ATOMIC_ACQUIRE);
		for (int j = 0; j < n && j < R2CC_MAX_NICS; j++) {
			const struct r2cc_nic *nic = &p->page->nics[j];
			struct r2cc_nic_counters now = nic->cnt;
			char st[24];
			snprintf(st, sizeof(st), "%s%s", nic_state(nic),
				 drilled(p->page, j) ? "/drill" : "");
			printf("%-8d %-12.12s %-10.10s %-12s %12.1f %12.0f %12.0f %10llu\n",
			       p->page->pid, p->page->node, nic->name, st,
			       (double)(now.tx_bytes - p->last[j].tx_bytes) / secs / 1e6,
			       (double)(now.tx_wrs - p->last[j].tx_wrs) / secs,
			       (double)(now.rx_wrs - p->last[j].rx_wrs) / secs,
			       (unsigned long long)now.err_cqes);
			p->last[j] = now;
			rows++;
		}
		if (p->page->unprotected[0])
			printf("%-8d NOT PROTECTED: %.*s\n", p->page->pid,
			       (int)sizeof(p->page->unprotected), p->page->unprotected);
		if (p->page->drill_plan[0])
			printf(
			    "%-8d DRILL: R2CC_DRILL=\"%.*s\", %d of %d step(s) applied; '/drill' "
			    "marks the NICs it cut (not a real failure)\n",
			    p->page->pid, (int)sizeof(p->page->drill_plan), p->page->drill_plan,
			    p->page->drill_applied, p->page->drill_steps);
	}
	if (!rows)
		printf("(no R2CC process with NICs on this node)\n");
}

static void print_prometheus(void)
{
	static const char *const names[] = {"tx_bytes", "tx_wrs", "recv_cqe_bytes", "recv_cqes",
					    "err_cqes"};
	for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
		printf("# TYPE r2cc_nic_%s_total counter\n", names[k]);
		for (int i = 0; i < nprocs; i++) {
			const struct r2cc_stats_page *pg = procs[i].page;
			if (!alive(pg->pid))
				continue;
			int n = __atomic_load_n(&pg->nnics, __ATOMIC_ACQUIRE);
			for (int j = 0; j < n && j < R2CC_MAX_NICS; j++) {
				const struct r2cc_nic_counters *c = &pg->nics[j].cnt;
				uint64_t v[] = {c->tx_bytes, c->tx_wrs, c->rx_bytes, c->rx_wrs,
						c->err_cqes};
				printf("r2cc_nic_%s_total{host=\"%s\",node=\"%s\",pid=\"%d\",nic="
				       "\"%s\"} "
				       "%llu\n",
				       names[k], pg->host, pg->node, pg->pid, pg->nics[j].name,
				       (unsigned long long)v[k]);
			}
		}
	}
	/* 1: every transport the process used is one R2CC repairs; 0, with why
	 * (shim/protect.h) */
	printf("# TYPE r2cc_protected gauge\n");
	for (int i = 0; i < nprocs; i++) {
		const struct r2cc_stats_page *pg = procs[i].page;
		if (!alive(pg->pid))
			continue;
		char why[2 * sizeof(pg->unprotected)];
		size_t w = 0;
		for (size_t k = 0; k < sizeof(pg->unprotected) && pg->unprotected[k]; k++) {
			char ch = pg->unprotected[k];
			if (ch == '"' || ch == '\\')
				why[w++] = '\\';
			why[w++] = ch == '\n' ? ' ' : ch;
		}
		why[w] = '\0';
		printf("r2cc_protected{host=\"%s\",node=\"%s\",pid=\"%d\",why=\"%s\"} %d\n",
		       pg->host, pg->node, pg->pid, why, !pg->unprotected[0]);
	}
	/* R2CC_DRILL: steps applied, and the NICs a drill cut (1), apart from real failures */
	printf("# TYPE r2cc_drill_steps_applied gauge\n");
	for (int i = 0; i < nprocs; i++) {
		const struct r2cc_stats_page *pg = procs[i].page;
		if (alive(pg->pid) && pg->drill_plan[0])
			printf("r2cc_drill_steps_applied{host=\"%s\",node=\"%s\",pid=\"%d\"} %d\n",
			       pg->host, pg->node, pg->pid, pg->drill_applied);
	}
	printf("# TYPE r2cc_nic_drilled gauge\n");
	for (int i = 0; i < nprocs; i++) {
		const struct r2cc_stats_page *pg = procs[i].page;
		if (!alive(pg->pid) || !pg->drill_plan[0])
			continue;
		for (int j = 0; j < pg->nnics && j < R2CC_MAX_NICS; j++)
			printf(
			    "r2cc_nic_drilled{host=\"%s\",node=\"%s\",pid=\"%d\",nic=\"%s\"} %d\n",
			    pg->host, pg->node, pg->pid, pg->nics[j].name, drilled(pg, j));
	}
	printf("# TYPE r2cc_nic_up gauge\n");
	for (int i = 0; i < nprocs; i++) {
		const struct r2cc_stats_page *pg = procs[i].page;
		if (!alive(pg->pid))
			continue;
		for (int j = 0; j < pg->nnics && j < R2CC_MAX_NICS; j++)
			printf("r2cc_nic_up{host=\"%s\",node=\"%s\",pid=\"%d\",nic=\"%s\"} %d\n",
			       pg->host, pg->node, pg->pid, pg->nics[j].name,
			       pg->nics[j].state == R2CC_NIC_UP && pg->nics[j].port_state == 4);
	}
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: r2cc top [--interval SEC] [--count N] [--once] [--prometheus] [--clean]\n"
		"  live per-NIC view of the R2CC processes on this node (from /dev/shm/%s*)\n"
		"  --once        one sample over one interval, then exit\n"
		"  --count N     N refreshes, then exit (default: until interrupted)\n"
		"  --prometheus  print the counters once in Prometheus text format\n"
		"  --clean       remove pages left by processes that no longer exist\n",
		R2CC_STATS_PREFIX);
}

int r2cc_top_main(int argc, char **argv)
{
	double interval = 1.0;
	long count = -1;
	bool prom = false, clean = false;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--interval") && i + 1 < argc) {
			char *end;
			interval = strtod(argv[++i], &end);
			if (*end || !(interval >= 0.05 && interval <= 3600)) {
				fprintf(stderr,
					"r2cc top: --interval takes seconds from 0.05 to 3600\n");
				return 2;
			}
		} else if (!strcmp(argv[i], "--count") && i + 1 < argc) {
			char *end;
			count = strtol(argv[++i], &end, 10);
			if (*end || count < 1) {
				fprintf(stderr, "r2cc top: --count takes a positive integer\n");
				return 2;
			}
		} else if (!strcmp(argv[i], "--once")) {
			count = 1;
		} else if (!strcmp(argv[i], "--prometheus")) {
			prom = true;
		} else if (!strcmp(argv[i], "--clean")) {
			clean = true;
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage(stdout);
			return 0;
		} else {
			usage(stderr);
			return 2;
		}
	}
	int stale = 0;
	scan(clean, &stale);
	if (clean) {
		printf("removed %d stale page(s)\n", stale);
		return 0;
	}
	if (prom) {
		print_prometheus();
		return 0;
	}
	bool tty = isatty(STDOUT_FILENO);
	for (long n = 0; count < 0 || n < count; n++) {
		struct timespec ts = {(time_t)interval,
				      (long)((interval - (time_t)interval) * 1e9)};
		nanosleep(&ts, NULL);
		scan(false, &stale);
		if (tty && count != 1)
			printf("\033[H\033[2J");
		time_t t = time(NULL);
		char when[32];
		strftime(when, sizeof(when), "%H:%M:%S", localtime(&t));
		printf("r2cc top  %s  %d process(es)  interval %.2fs%s\n", when, nprocs, interval,
		       stale ? "  (stale pages: r2cc top --clean)" : "");
		print_table(interval);
		fflush(stdout);
	}
	return 0;
}
