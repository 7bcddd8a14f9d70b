/*
 * `r2cc top`: the live per-NIC view of every R2CC process on this node, from
 * the statistics pages the library publishes in /dev/shm (shim/stats.h), read
 * through tools/pages.h as `r2cc exporter` reads them. Each refresh shows,
 * per process and NIC, the NIC's state and the send rate (bytes and work
 * requests posted per second), receive completions per second and error
 * completions; with --prometheus it prints the counters once in the
 * Prometheus text exposition format instead.
 */
#include "tools/top.h"
#include "tools/pages.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_PROCS 256

struct proc {
	char name[256];
	struct r2cc_stats_page *page; /* the last copy read (tools/pages.h) */
	bool gone;		      /* its process ended, or its page went */
	struct r2cc_nic_counters last[R2CC_MAX_NICS];
};

static int nprocs;
static struct proc procs[MAX_PROCS];

struct scan_arg {
	bool clean;
	int *stale_count;
	struct r2cc_stats_page *buf;
};

static bool scan_one(const char *name, void *arg)
{
	struct scan_arg *a = arg;
	for (int i = 0; i < nprocs; i++)
		if (!strcmp(procs[i].name, name))
			return true;
	if (!a->buf && !(a->buf = malloc(sizeof(*a->buf))))
		return false;
	enum r2cc_page_state st = r2cc_page_read(name, a->buf, NULL, 0);
	if (st == R2CC_PAGE_STALE) {
		(*a->stale_count)++;
		if (a->clean)
			r2cc_page_remove(name);
		return true;
	}
	if (st != R2CC_PAGE_LIVE)
		return true;
	if (nprocs == MAX_PROCS)
		return false;
	struct proc *p = &procs[nprocs++];
	snprintf(p->name, sizeof(p->name), "%s", name);
	p->page = a->buf;
	a->buf = NULL;
	for (int i = 0; i < r2cc_page_nnics(p->page); i++)
		p->last[i] = p->page->nics[i].cnt;
	return true;
}

/* Read every live page not known yet; with clean, remove stale ones. */
static void scan(bool clean, int *stale_count)
{
	struct scan_arg a = {clean, stale_count, NULL};
	r2cc_pages_each(scan_one, &a);
	free(a.buf);
}

/* Read the known pages again; a process whose page is no longer live is gone. */
static void refresh(void)
{
	for (int i = 0; i < nprocs; i++)
		if (!procs[i].gone &&
		    r2cc_page_read(procs[i].name, procs[i].page, NULL, 0) != R2CC_PAGE_LIVE)
			procs[i].gone = true;
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
		if (p->gone)
			continue;
		int n = r2cc_page_nnics(p->page);
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
			if (procs[i].gone)
				continue;
			int n = r2cc_page_nnics(pg);
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
		if (procs[i].gone)
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
		if (!procs[i].gone && pg->drill_plan[0])
			printf("r2cc_drill_steps_applied{host=\"%s\",node=\"%s\",pid=\"%d\"} %d\n",
			       pg->host, pg->node, pg->pid, pg->drill_applied);
	}
	printf("# TYPE r2cc_nic_drilled gauge\n");
	for (int i = 0; i < nprocs; i++) {
		const struct r2cc_stats_page *pg = procs[i].page;
		if (procs[i].gone || !pg->drill_plan[0])
			continue;
		for (int j = 0; j < pg->nnics && j < R2CC_MAX_NICS; j++)
			printf(
			    "r2cc_nic_drilled{host=\"%s\",node=\"%s\",pid=\"%d\",nic=\"%s\"} %d\n",
			    pg->host, pg->node, pg->pid, pg->nics[j].name, drilled(pg, j));
	}
	printf("# TYPE r2cc_nic_up gauge\n");
	for (int i = 0; i < nprocs; i++) {
		const struct r2cc_stats_page *pg = procs[i].page;
		if (procs[i].gone)
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
		refresh();
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
