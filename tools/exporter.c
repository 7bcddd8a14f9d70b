/*
 * `r2cc exporter`: the statistics pages of every R2CC process on this node
 * (shim/stats.h, read through tools/pages.h) as Prometheus metrics, served
 * over HTTP (`--listen ADDR:PORT`, GET /metrics) and/or written for
 * node_exporter's textfile collector (`--textfile DIR`, DIR/r2cc.prom replaced
 * by rename every --interval). One thread, one ppoll() loop: the listening
 * socket, the connections (each read until its request's end, answered,
 * closed; 10 s at most each) and the textfile's timer. Every scrape reads the
 * pages anew, so jobs may come and go; a page whose process is gone, or
 * that is not a page this build reads, is skipped and counted in
 * r2cc_exporter_pages{state=...}, and a bad or unreadable page is named once
 * on stderr. Needs no privilege: pages are created 0644 (shim/stats.c).
 */
#include "tools/exporter.h"
#include "tools/pages.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_PAGES    512 /* pages read per scrape (46 KiB each) */
#define MAX_CONNS    32
#define CONN_TIMEOUT 10.0 /* seconds a connection may take, request and answer */
#define REQ_MAX	     8192
#define MAX_WARNED   256

/* A growing text buffer; oom sticks once an allocation failed. */
struct buf {
	char *p;
	size_t len, cap;
	bool oom;
};

static void buf_grow(struct buf *b, size_t more)
{
	if (b->oom || b->len + more + 1 <= b->cap)
		return;
	size_t cap = b->cap ? b->cap : 4096;
	while (cap < b->len + more + 1)
		cap *= 2;
	char *p = realloc(b->p, cap);
	if (!p) {
		b->oom = true;
		return;
	}
	b->p = p;
	b->cap = cap;
}

static void buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void buf_printf(struct buf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	buf_grow(b, (size_t)n);
	if (b->oom)
		return;
	va_start(ap, fmt);
	vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}

static void buf_free(struct buf *b)
{
	free(b->p);
	*b = (struct buf){0};
}

/* A label value as the text format wants it: backslash, double quote and line
 * feed escaped. Other control bytes and bytes outside ASCII (the format is
 * UTF-8; a page's strings are ASCII unless the file is foreign) become '?'. */
static void buf_label(struct buf *b, const char *s)
{
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '\\' || c == '"')
			buf_printf(b, "\\%c", c);
		else if (c == '\n')
			buf_printf(b, "\\n");
		else
			buf_printf(b, "%c", c < 0x20 || c >= 0x7f ? '?' : c);
	}
}

/* --- One collection of the node's pages ------------------------------------ */

/* A live page and the NIC records of it to export (bit i: nics[i]). */
struct entry {
	struct r2cc_stats_page page;
	uint64_t nics;
};

struct snapshot {
	struct entry *e; /* the live pages, by pid */
	int n, cap;
	int count[R2CC_PAGE_NSTATES];
	int skipped; /* live pages past MAX_PAGES */
};

/* Pages already named on stderr, so that each bad one is said once while it lasts. */
static struct {
	char name[MAX_WARNED][256];
	bool seen[MAX_WARNED];
	int n;
} warned;

static void warn_once(const char *name, enum r2cc_page_state st, const char *why)
{
	for (int i = 0; i < warned.n; i++)
		if (!strcmp(warned.name[i], name)) {
			warned.seen[i] = true;
			return;
		}
	fprintf(stderr, "r2cc exporter: skipping %s/%s (%s): %s\n", R2CC_PAGES_DIR, name,
		r2cc_page_state_names[st], why);
	if (warned.n < MAX_WARNED) {
		snprintf(warned.name[warned.n], sizeof(warned.name[0]), "%s", name);
		warned.seen[warned.n++] = true;
	}
}

/* Forget the pages not met in this collection (removed: said again if they come back). */
static void warned_prune(void)
{
	int k = 0;
	for (int i = 0; i < warned.n; i++)
		if (warned.seen[i]) {
			if (k != i)
				memcpy(warned.name[k], warned.name[i], sizeof(warned.name[0]));
			warned.seen[k++] = false;
		}
	warned.n = k;
}

static bool collect_one(const char *name, void *arg)
{
	struct snapshot *s = arg;
	if (s->n == s->cap) {
		int cap = s->cap ? 2 * s->cap : 8;
		cap = cap > MAX_PAGES ? MAX_PAGES : cap;
		struct entry *e = cap > s->cap ? realloc(s->e, (size_t)cap * sizeof(*e)) : NULL;
		if (!e) {
			s->skipped++;
			return true;
		}
		s->e = e;
		s->cap = cap;
	}
	char why[160];
	struct r2cc_stats_page *pg = &s->e[s->n].page;
	enum r2cc_page_state st = r2cc_page_read(name, pg, why, sizeof(why));
	s->count[st]++;
	if (st == R2CC_PAGE_BAD || st == R2CC_PAGE_UNREADABLE)
		warn_once(name, st, why);
	if (st != R2CC_PAGE_LIVE)
		return true;
	/* Two records of one name would be two identical series, which makes
	 * Prometheus reject the whole scrape: the first one stands. */
	uint64_t m = 0;
	for (int i = 0; i < r2cc_page_nnics(pg); i++) {
		bool dup = false;
		for (int j = 0; j < i && !dup; j++)
			dup = (m >> j & 1) && !strcmp(pg->nics[i].name, pg->nics[j].name);
		if (!dup)
			m |= 1ull << i;
	}
	s->e[s->n++].nics = m;
	return true;
}

static int by_pid(const void *a, const void *b)
{
	const struct entry *x = a, *y = b;
	return (x->page.pid > y->page.pid) - (x->page.pid < y->page.pid);
}

static void collect(struct snapshot *s)
{
	s->n = 0;
	s->skipped = 0;
	memset(s->count, 0, sizeof(s->count));
	int rc = r2cc_pages_each(collect_one, s);
	if (rc < 0)
		fprintf(stderr, "r2cc exporter: cannot list %s: %s\n", R2CC_PAGES_DIR,
			strerror(-rc));
	warned_prune();
	if (s->n > 1)
		qsort(s->e, (size_t)s->n, sizeof(*s->e), by_pid);
}

/* --- The exposition ----------------------------------------------------------- */

static void family(struct buf *b, const char *name, const char *type, const char *help)
{
	buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{host="..",node="..",pid=".." */
static void series(struct buf *b, const char *name, const struct r2cc_stats_page *pg)
{
	buf_printf(b, "%s{host=\"", name);
	buf_label(b, pg->host);
	buf_printf(b, "\",node=\"");
	buf_label(b, pg->node);
	buf_printf(b, "\",pid=\"%d\"", (int)pg->pid);
}

static void nic_series(struct buf *b, const char *name, const struct r2cc_stats_page *pg, int j)
{
	series(b, name, pg);
	buf_printf(b, ",nic=\"");
	buf_label(b, pg->nics[j].name);
	buf_printf(b, "\"");
}

static const char *nic_state(const struct r2cc_nic *n)
{
	if (n->state == R2CC_NIC_DOWN)
		return "failed";
	if (n->state == R2CC_NIC_DECLARED)
		return "declared";
	return n->port_state == 4 /* IBV_PORT_ACTIVE */ ? "up" : "port_down";
}

static const struct {
	const char *name, *help;
	size_t off;
} nic_counters[] = {
#define C(n, f, h)                                                                                 \
	{                                                                                          \
		"r2cc_nic_" n "_total", h, offsetof(struct r2cc_nic_counters, f)                   \
	}
    C("tx_bytes", tx_bytes, "Bytes the process posted for sending on the NIC."),
    C("tx_wrs", tx_wrs, "Send work requests the process posted on the NIC."),
    C("tx_cqes", tx_cqes, "Send completions the process polled on the NIC."),
    C("recv_cqe_bytes", rx_bytes, "Bytes of the receive completions the process polled."),
    C("recv_cqes", rx_wrs, "Receive completions the process polled on the NIC."),
    C("recv_posted", recv_posted, "Receive work requests the process posted on the NIC."),
    C("err_cqes", err_cqes, "Completions with an error status the process polled on the NIC."),
#undef C
};

static const struct {
	const char *name, *help;
	size_t off;
} rep_counters[] = {
#define C(n, f, h)                                                                                 \
	{                                                                                          \
		n, h, offsetof(struct r2cc_stats_repairs, f)                                       \
	}
    C("r2cc_repairs_total", repairs,
      "NIC or path failures hot repair settled (queue pairs moved); drill=\"1\": those of an "
      "R2CC_DRILL. Declared failures and failbacks are not counted."),
    C("r2cc_failbacks_total", failbacks,
      "NICs that came back and got their queue pairs again; drill=\"1\": after a drill's up."),
    C("r2cc_repair_qps_moved_total", qps_moved, "Queue pairs hot repair moved to another NIC."),
    C("r2cc_repair_qps_failed_total", qps_failed,
      "Queue pairs hot repair could not move (their errors reached the application)."),
#undef C
};

static void format_nics(struct buf *b, const struct snapshot *s)
{
	for (size_t k = 0; k < sizeof(nic_counters) / sizeof(nic_counters[0]); k++) {
		family(b, nic_counters[k].name, "counter", nic_counters[k].help);
		for (int i = 0; i < s->n; i++)
			for (int j = 0; j < R2CC_MAX_NICS; j++)
				if (s->e[i].nics >> j & 1) {
					const char *c = (const char *)&s->e[i].page.nics[j].cnt;
					uint64_t v;
					memcpy(&v, c + nic_counters[k].off, sizeof(v));
					nic_series(b, nic_counters[k].name, &s->e[i].page, j);
					buf_printf(b, "} %llu\n", (unsigned long long)v);
				}
	}
	family(b, "r2cc_nic_failbacks_total", "counter",
	       "Times hot repair brought the NIC back after a failure.");
	for (int i = 0; i < s->n; i++)
		for (int j = 0; j < R2CC_MAX_NICS; j++)
			if (s->e[i].nics >> j & 1) {
				int v = s->e[i].page.nics[j].failbacks;
				nic_series(b, "r2cc_nic_failbacks_total", &s->e[i].page, j);
				buf_printf(b, "} %d\n", v > 0 ? v : 0);
			}
	family(b, "r2cc_nic_up", "gauge",
	       "1 when the NIC is usable: R2CC has not failed it and its port is ACTIVE.");
	for (int i = 0; i < s->n; i++)
		for (int j = 0; j < R2CC_MAX_NICS; j++)
			if (s->e[i].nics >> j & 1) {
				nic_series(b, "r2cc_nic_up", &s->e[i].page, j);
				buf_printf(b, "} %d\n",
					   !strcmp(nic_state(&s->e[i].page.nics[j]), "up"));
			}
	static const char *const states[] = {"up", "port_down", "failed", "declared"};
	family(b, "r2cc_nic_state", "gauge",
	       "The NIC's state, one series per state, 1 for the current one: up, port_down "
	       "(the port is not ACTIVE), failed (hot repair moved its queue pairs away), "
	       "declared (R2CC_FAILED_HCA).");
	for (int i = 0; i < s->n; i++)
		for (int j = 0; j < R2CC_MAX_NICS; j++)
			if (s->e[i].nics >> j & 1)
				for (size_t k = 0; k < sizeof(states) / sizeof(states[0]); k++) {
					nic_series(b, "r2cc_nic_state", &s->e[i].page, j);
					buf_printf(
					    b, ",state=\"%s\"} %d\n", states[k],
					    !strcmp(nic_state(&s->e[i].page.nics[j]), states[k]));
				}
	family(b, "r2cc_nic_drilled", "gauge",
	       "1 for a NIC whose queue pairs R2CC_DRILL cut in the process: a drill, not a "
	       "failure.");
	for (int i = 0; i < s->n; i++)
		for (int j = 0; j < R2CC_MAX_NICS; j++)
			if (s->e[i].nics >> j & 1) {
				nic_series(b, "r2cc_nic_drilled", &s->e[i].page, j);
				buf_printf(b, "} %d\n", (int)(s->e[i].page.drill_nics >> j & 1));
			}
}

static void format_repairs(struct buf *b, const struct snapshot *s)
{
	for (size_t k = 0; k < sizeof(rep_counters) / sizeof(rep_counters[0]); k++) {
		family(b, rep_counters[k].name, "counter", rep_counters[k].help);
		for (int i = 0; i < s->n; i++)
			for (int d = 0; d < 2; d++) {
				uint64_t v;
				memcpy(&v, (const char *)&s->e[i].page.rep[d] + rep_counters[k].off,
				       sizeof(v));
				series(b, rep_counters[k].name, &s->e[i].page);
				buf_printf(b, ",drill=\"%d\"} %llu\n", d, (unsigned long long)v);
			}
	}
	const char *h = "r2cc_repair_duration_seconds";
	family(b, h, "histogram",
	       "Time from a failure's detection to the last queue pair moved, per repair "
	       "counted in r2cc_repairs_total.");
	for (int i = 0; i < s->n; i++)
		for (int d = 0; d < 2; d++) {
			const struct r2cc_stats_repairs *r = &s->e[i].page.rep[d];
			/* The repair thread adds to the buckets before the count: a copy
			 * taken between them is cut back to a valid histogram. */
			uint64_t count = r->repairs, prev = 0;
			for (int k = 0; k < R2CC_STATS_REPAIR_BUCKETS; k++) {
				uint64_t v = r->le[k] < count ? r->le[k] : count;
				prev = v > prev ? v : prev;
				series(b, "r2cc_repair_duration_seconds_bucket", &s->e[i].page);
				buf_printf(b, ",drill=\"%d\",le=\"%g\"} %llu\n", d,
					   r2cc_stats_repair_bounds_s[k], (unsigned long long)prev);
			}
			series(b, "r2cc_repair_duration_seconds_bucket", &s->e[i].page);
			buf_printf(b, ",drill=\"%d\",le=\"+Inf\"} %llu\n", d,
				   (unsigned long long)count);
			series(b, "r2cc_repair_duration_seconds_sum", &s->e[i].page);
			buf_printf(b, ",drill=\"%d\"} %.9f\n", d, (double)r->duration_ns_sum / 1e9);
			series(b, "r2cc_repair_duration_seconds_count", &s->e[i].page);
			buf_printf(b, ",drill=\"%d\"} %llu\n", d, (unsigned long long)count);
		}
}

static void format_processes(struct buf *b, const struct snapshot *s)
{
	family(b, "r2cc_protected", "gauge",
	       "1 when every transport the process used is one R2CC repairs; 0 with the reason "
	       "in why.");
	for (int i = 0; i < s->n; i++) {
		const struct r2cc_stats_page *pg = &s->e[i].page;
		series(b, "r2cc_protected", pg);
		buf_printf(b, ",why=\"");
		buf_label(b, pg->unprotected);
		buf_printf(b, "\"} %d\n", !pg->unprotected[0]);
	}
	family(b, "r2cc_drill_steps", "gauge",
	       "Steps of the process's R2CC_DRILL plan (given in plan); only processes with one.");
	for (int i = 0; i < s->n; i++)
		if (s->e[i].page.drill_plan[0]) {
			series(b, "r2cc_drill_steps", &s->e[i].page);
			buf_printf(b, ",plan=\"");
			buf_label(b, s->e[i].page.drill_plan);
			buf_printf(b, "\"} %d\n", (int)s->e[i].page.drill_steps);
		}
	family(b, "r2cc_drill_steps_applied", "gauge",
	       "Steps of the process's R2CC_DRILL plan applied so far.");
	for (int i = 0; i < s->n; i++)
		if (s->e[i].page.drill_plan[0]) {
			series(b, "r2cc_drill_steps_applied", &s->e[i].page);
			buf_printf(b, "} %d\n", (int)s->e[i].page.drill_applied);
		}
	family(b, "r2cc_mode", "gauge",
	       "R2CC_MODE of the process: 0 plain NCCL, 1 backup NIC, 2 Balance, 3 Balance and "
	       "R2CC-AllReduce, 4 auto.");
	for (int i = 0; i < s->n; i++) {
		series(b, "r2cc_mode", &s->e[i].page);
		buf_printf(b, "} %d\n", (int)s->e[i].page.mode);
	}
	family(b, "r2cc_process_start_time_seconds", "gauge",
	       "When the process started R2CC, seconds since the epoch.");
	for (int i = 0; i < s->n; i++) {
		series(b, "r2cc_process_start_time_seconds", &s->e[i].page);
		buf_printf(b, "} %.3f\n", (double)s->e[i].page.start_unix_ns / 1e9);
	}
}

static void format_all(struct buf *b, const struct snapshot *s)
{
	format_nics(b, s);
	format_repairs(b, s);
	format_processes(b, s);
	family(b, "r2cc_exporter_pages", "gauge",
	       "Statistics pages in " R2CC_PAGES_DIR " at this scrape, by state: live ones are "
	       "exported; stale (process gone), bad (not a page this exporter reads), "
	       "unreadable, not_ready (being made or removed) and over_limit are skipped.");
	for (int k = 0; k < R2CC_PAGE_NSTATES; k++)
		buf_printf(b, "r2cc_exporter_pages{state=\"%s\"} %d\n", r2cc_page_state_names[k],
			   s->count[k]);
	buf_printf(b, "r2cc_exporter_pages{state=\"over_limit\"} %d\n", s->skipped);
}

/* Collect and format; false when memory ran out. */
static bool render(struct snapshot *s, struct buf *b)
{
	collect(s);
	b->len = 0;
	b->oom = false;
	format_all(b, s);
	return !b->oom;
}

/* --- The textfile ------------------------------------------------------------- */

/* DIR/r2cc.prom replaced at once: a reader sees the old file or the new one. */
static int write_textfile(const char *dir, const struct buf *b, char *err, size_t err_len)
{
	char tmp[1024], dst[1024];
	snprintf(tmp, sizeof(tmp), "%s/.r2cc.prom.%d.tmp", dir, (int)getpid());
	snprintf(dst, sizeof(dst), "%s/r2cc.prom", dir);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		snprintf(err, err_len, "cannot create %s: %s", tmp, strerror(errno));
		return -1;
	}
	size_t off = 0;
	while (off < b->len) {
		ssize_t n = write(fd, b->p + off, b->len - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			snprintf(err, err_len, "cannot write %s: %s", tmp,
				 n < 0 ? strerror(errno) : "no space");
			goto err_unlink;
		}
		off += (size_t)n;
	}
	if (close(fd) != 0) {
		fd = -1;
		snprintf(err, err_len, "cannot write %s: %s", tmp, strerror(errno));
		goto err_unlink;
	}
	fd = -1;
	if (rename(tmp, dst) != 0) {
		snprintf(err, err_len, "cannot rename %s to %s: %s", tmp, dst, strerror(errno));
		goto err_unlink;
	}
	return 0;
err_unlink:
	if (fd >= 0)
		close(fd);
	unlink(tmp);
	return -1;
}

/* --- HTTP ----------------------------------------------------------------------- */

struct conn {
	int fd;
	char req[REQ_MAX];
	size_t rlen;
	struct buf out;
	size_t off;
	bool writing;
	double deadline;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void respond(struct conn *c, const char *status, const char *type, const char *extra,
		    const char *body, size_t len, bool head)
{
	c->out.len = 0;
	c->out.oom = false;
	buf_printf(&c->out,
		   "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: "
		   "close\r\n\r\n",
		   status, type, len, extra);
	if (!head) {
		buf_grow(&c->out, len);
		if (!c->out.oom) {
			memcpy(c->out.p + c->out.len, body, len);
			c->out.len += len;
		}
	}
	c->writing = true;
	c->off = 0;
}

static void respond_text(struct conn *c, const char *status, const char *extra, const char *body)
{
	respond(c, status, "text/plain; charset=utf-8", extra, body, strlen(body), false);
}

static const char index_html[] =
    "<html><head><title>r2cc exporter</title></head><body>\n"
    "<h1>r2cc exporter</h1>\n"
    "<p>Statistics of the R2CC processes on this node, from " R2CC_PAGES_DIR "/" R2CC_STATS_PREFIX
    "*: <a href=\"/metrics\">/metrics</a></p>\n"
    "</body></html>\n";

/* The request in c->req is whole (ends in an empty line): answer it. */
static void handle(struct conn *c, struct snapshot *s, struct buf *metrics)
{
	char method[16], target[1024], version[16];
	c->req[c->rlen] = '\0';
	if (sscanf(c->req, "%15s %1023s %15s", method, target, version) != 3 ||
	    (strcmp(version, "HTTP/1.0") && strcmp(version, "HTTP/1.1"))) {
		respond_text(c, "400 Bad Request", "", "bad request\n");
		return;
	}
	bool head = !strcmp(method, "HEAD");
	if (!head && strcmp(method, "GET")) {
		respond_text(c, "405 Method Not Allowed", "Allow: GET, HEAD\r\n",
			     "only GET and HEAD\n");
		return;
	}
	target[strcspn(target, "?#")] = '\0';
	if (!strcmp(target, "/metrics")) {
		if (!render(s, metrics)) {
			respond_text(c, "500 Internal Server Error", "", "out of memory\n");
			return;
		}
		respond(c, "200 OK", "text/plain; version=0.0.4; charset=utf-8", "", metrics->p,
			metrics->len, head);
	} else if (!strcmp(target, "/")) {
		respond(c, "200 OK", "text/html; charset=utf-8", "", index_html,
			sizeof(index_html) - 1, head);
	} else {
		respond_text(c, "404 Not Found", "", "not found: try /metrics\n");
	}
}

static bool request_complete(const struct conn *c)
{
	for (size_t i = 0; i + 1 < c->rlen; i++)
		if (c->req[i] == '\n' &&
		    (c->req[i + 1] == '\n' ||
		     (c->req[i + 1] == '\r' && i + 2 < c->rlen && c->req[i + 2] == '\n')))
			return true;
	return false;
}

/* Reads what came; false when the connection is to be closed. */
static bool conn_read(struct conn *c, struct snapshot *s, struct buf *metrics)
{
	ssize_t n = recv(c->fd, c->req + c->rlen, sizeof(c->req) - 1 - c->rlen, 0);
	if (n < 0)
		return errno == EAGAIN || errno == EINTR;
	if (n == 0)
		return false;
	c->rlen += (size_t)n;
	if (request_complete(c))
		handle(c, s, metrics);
	else if (c->rlen == sizeof(c->req) - 1)
		respond_text(c, "431 Request Header Fields Too Large", "", "request too large\n");
	return true;
}

/* Writes what it can; false when done or failed. */
static bool conn_write(struct conn *c)
{
	ssize_t n = send(c->fd, c->out.p + c->off, c->out.len - c->off, MSG_NOSIGNAL);
	if (n < 0)
		return errno == EAGAIN || errno == EINTR;
	c->off += (size_t)n;
	return c->off < c->out.len;
}

/* ADDR:PORT ([V6]:PORT, :PORT for every address) to a listening socket, or -1
 * after one line naming the address. The bound address goes to shown. */
static int listen_on(const char *spec, char *shown, size_t shown_len)
{
	char host[256];
	const char *colon = strrchr(spec, ':');
	if (!colon || !colon[1] || (size_t)(colon - spec) >= sizeof(host)) {
		fprintf(
		    stderr,
		    "r2cc exporter: --listen takes ADDR:PORT (127.0.0.1:9877, :9877), not '%s'\n",
		    spec);
		return -1;
	}
	memcpy(host, spec, (size_t)(colon - spec));
	host[colon - spec] = '\0';
	size_t hl = strlen(host);
	if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
		memmove(host, host + 1, hl - 2);
		host[hl - 2] = '\0';
	}
	char *end;
	long port = strtol(colon + 1, &end, 10);
	if (*end || port < 0 || port > 65535) {
		fprintf(stderr, "r2cc exporter: --listen %s: the port must be 0 to 65535\n", spec);
		return -1;
	}
	struct addrinfo hints = {.ai_family = AF_UNSPEC,
				 .ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
			*res;
	int rc = getaddrinfo(host[0] ? host : "0.0.0.0", colon + 1, &hints, &res);
	if (rc) {
		fprintf(stderr, "r2cc exporter: cannot listen on %s: %s\n", spec, gai_strerror(rc));
		return -1;
	}
	int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	int one = 1;
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
	    bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 64) != 0) {
		fprintf(stderr, "r2cc exporter: cannot listen on %s: %s\n", spec, strerror(errno));
		if (fd >= 0)
			close(fd);
		freeaddrinfo(res);
		return -1;
	}
	freeaddrinfo(res);
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char a[INET6_ADDRSTRLEN] = "?";
	int p = 0;
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
		if (ss.ss_family == AF_INET6) {
			struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
			inet_ntop(AF_INET6, &s6->sin6_addr, a, sizeof(a));
			p = ntohs(s6->sin6_port);
		} else {
			struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
			inet_ntop(AF_INET, &s4->sin_addr, a, sizeof(a));
			p = ntohs(s4->sin_port);
		}
	}
	snprintf(shown, shown_len, ss.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", a, p);
	return fd;
}

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static void usage(FILE *f)
{
	fputs("usage: r2cc exporter [--listen ADDR:PORT] [--textfile DIR] [--interval SEC] "
	      "[--once]\n"
	      "  Prometheus metrics of the R2CC processes on this node (from " R2CC_PAGES_DIR
	      "/" R2CC_STATS_PREFIX "*)\n"
	      "  --listen ADDR:PORT  serve GET /metrics there (127.0.0.1:9877, [::1]:9877, :9877 "
	      "for every address; port 0: any free one)\n"
	      "  --textfile DIR      write DIR/r2cc.prom (node_exporter's textfile collector), "
	      "replaced atomically\n"
	      "  --interval SEC      how often --textfile is written (default 15)\n"
	      "  --once              collect once: write DIR/r2cc.prom with --textfile, else "
	      "print to stdout; then exit\n"
	      "exit status: 0, or 2 for a bad option, an address that cannot be listened on or a "
	      "DIR that cannot be written\n",
	      f);
}

int r2cc_exporter_main(int argc, char **argv)
{
	const char *listen_spec = NULL, *textdir = NULL;
	double interval = 15;
	bool once = false;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--listen") && i + 1 < argc) {
			listen_spec = argv[++i];
		} else if (!strcmp(argv[i], "--textfile") && i + 1 < argc) {
			textdir = argv[++i];
		} else if (!strcmp(argv[i], "--interval") && i + 1 < argc) {
			char *end;
			interval = strtod(argv[++i], &end);
			if (*end || !(interval >= 0.05 && interval <= 86400)) {
				fprintf(stderr, "r2cc exporter: --interval takes seconds from 0.05 "
						"to 86400\n");
				return 2;
			}
		} else if (!strcmp(argv[i], "--once")) {
			once = true;
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage(stdout);
			return 0;
		} else {
			usage(stderr);
			return 2;
		}
	}
	if (!listen_spec && !textdir && !once) {
		fprintf(stderr,
			"r2cc exporter: give --listen ADDR:PORT, --textfile DIR or --once\n");
		usage(stderr);
		return 2;
	}
	struct stat sb;
	if (textdir && strlen(textdir) > 900) {
		fprintf(stderr, "r2cc exporter: --textfile: the directory's name is too long\n");
		return 2;
	}
	if (textdir && stat(textdir, &sb) != 0) {
		fprintf(stderr, "r2cc exporter: --textfile %s: %s\n", textdir, strerror(errno));
		return 2;
	}
	if (textdir && !S_ISDIR(sb.st_mode)) {
		fprintf(stderr, "r2cc exporter: --textfile %s: not a directory\n", textdir);
		return 2;
	}
	struct snapshot snap = {0};
	struct buf metrics = {0};
	char err[2400];
	int ret = 0;
	if (once) {
		if (!render(&snap, &metrics)) {
			fprintf(stderr, "r2cc exporter: out of memory\n");
			ret = 1;
		} else if (textdir) {
			if (write_textfile(textdir, &metrics, err, sizeof(err)) != 0) {
				fprintf(stderr, "r2cc exporter: %s\n", err);
				ret = 2;
			}
		} else if (fwrite(metrics.p, 1, metrics.len, stdout) != metrics.len ||
			   fflush(stdout) != 0) {
			ret = 1;
		}
		goto out;
	}
	int lfd = -1;
	if (listen_spec) {
		char shown[INET6_ADDRSTRLEN + 16];
		lfd = listen_on(listen_spec, shown, sizeof(shown));
		if (lfd < 0) {
			ret = 2;
			goto out;
		}
		fprintf(stderr, "r2cc exporter: serving http://%s/metrics\n", shown);
	}
	double next_write = 0;
	if (textdir) {
		/* The first write says at once whether DIR can be written. */
		if (!render(&snap, &metrics) ||
		    write_textfile(textdir, &metrics, err, sizeof(err)) != 0) {
			fprintf(stderr, "r2cc exporter: %s\n", metrics.oom ? "out of memory" : err);
			ret = 2;
			goto out_close;
		}
		fprintf(stderr, "r2cc exporter: writing %s/r2cc.prom every %g s\n", textdir,
			interval);
		next_write = now_s() + interval;
	}
	/* SIGINT and SIGTERM only come through ppoll(), so none is missed between
	 * the check of stop and the wait. */
	struct sigaction sa = {.sa_handler = on_signal};
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigset_t block, waitmask;
	sigemptyset(&block);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGTERM);
	sigprocmask(SIG_BLOCK, &block, &waitmask);
	sigdelset(&waitmask, SIGINT);
	sigdelset(&waitmask, SIGTERM);
	fflush(stderr);
	static struct conn conns[MAX_CONNS];
	int nconns = 0;
	bool text_failing = false;
	while (!stop) {
		double t = now_s(), wake = textdir ? next_write : t + 3600;
		for (int i = 0; i < nconns; i++)
			wake = conns[i].deadline < wake ? conns[i].deadline : wake;
		struct pollfd pfd[MAX_CONNS + 1];
		int np = 0;
		for (int i = 0; i < nconns; i++)
			pfd[np++] = (struct pollfd){.fd = conns[i].fd,
						    .events = conns[i].writing ? POLLOUT : POLLIN};
		if (lfd >= 0 && nconns < MAX_CONNS)
			pfd[np++] = (struct pollfd){.fd = lfd, .events = POLLIN};
		double secs = wake - t;
		secs = secs < 0 ? 0 : secs > 3600 ? 3600 : secs + 1e-3;
		struct timespec ts = {(time_t)secs, (long)((secs - (time_t)secs) * 1e9)};
		int rc = ppoll(pfd, (nfds_t)np, &ts, &waitmask);
		if (rc < 0 && errno != EINTR) {
			fprintf(stderr, "r2cc exporter: ppoll: %s\n", strerror(errno));
			ret = 1;
			break;
		}
		t = now_s();
		/* Connections first (pfd[i] is conns[i]), closing from the end so
		 * that moving the last one into a hole keeps the indices right. */
		for (int i = nconns - 1; i >= 0; i--) {
			struct conn *c = &conns[i];
			bool keep = t < c->deadline;
			if (keep && rc > 0 && pfd[i].revents) {
				if (pfd[i].revents & (POLLERR | POLLNVAL))
					keep = false;
				else if (c->writing)
					keep = conn_write(c);
				else
					keep = conn_read(c, &snap, &metrics);
			}
			if (!keep) {
				close(c->fd);
				struct buf out = c->out;
				conns[i] = conns[--nconns];
				conns[nconns].out = out;
				conns[nconns].fd = -1;
			}
		}
		if (rc > 0 && lfd >= 0 && np > 0 && pfd[np - 1].fd == lfd &&
		    (pfd[np - 1].revents & POLLIN)) {
			while (nconns < MAX_CONNS) {
				int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
				if (fd < 0)
					break;
				struct conn *c = &conns[nconns++];
				c->fd = fd;
				c->rlen = 0;
				c->off = 0;
				c->out.len = 0;
				c->writing = false;
				c->deadline = t + CONN_TIMEOUT;
			}
		}
		if (textdir && t >= next_write) {
			next_write = t + interval;
			if (render(&snap, &metrics) &&
			    write_textfile(textdir, &metrics, err, sizeof(err)) == 0) {
				if (text_failing)
					fprintf(stderr,
						"r2cc exporter: %s/r2cc.prom written again\n",
						textdir);
				text_failing = false;
			} else if (!text_failing) {
				fprintf(stderr,
					"r2cc exporter: %s (said once until it works again)\n",
					metrics.oom ? "out of memory" : err);
				text_failing = true;
			}
		}
	}
	for (int i = 0; i < nconns; i++)
		close(conns[i].fd);
	for (int i = 0; i < MAX_CONNS; i++)
		buf_free(&conns[i].out);
out_close:
	if (lfd >= 0)
		close(lfd);
out:
	buf_free(&metrics);
	free(snap.e);
	return ret;
}
