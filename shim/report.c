/*
 * Exit report (see report.h). Runs from a destructor, so it only reads
 * R2CC's own records: NICs with their counters, communicators, settings.
 */
#include "shim/report.h"
#include "include/r2cc.h"
#include "shim/comm.h"
#include "shim/common.h"
#include "shim/core.h"
#include "shim/log.h"
#include "shim/params.h"
#include "shim/protect.h"
#include "shim/registry.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *state_name(int s)
{
	return s == R2CC_NIC_DOWN ? "down" : s == R2CC_NIC_DECLARED ? "declared-failed" : "up";
}

void (*r2cc_report_incidents_hook)(FILE *text, FILE *json);
void (*r2cc_report_stalls_hook)(FILE *text, FILE *json);
void (*r2cc_report_drill_hook)(FILE *text, FILE *json);

/* How often hot repair brought NIC i back (failback). */
static int failbacks(int i)
{
	const struct r2cc_nic *nic = r2cc_nic_by_index(i);
	return nic ? __atomic_load_n(&nic->failbacks, __ATOMIC_RELAXED) : 0;
}

void r2cc_json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fputc('\\', f);
		if ((unsigned char)*s >= 0x20)
			fputc(*s, f);
	}
	fputc('"', f);
}

void r2cc_report_write(FILE *text, FILE *json)
{
	char host[256];
	r2cc_host_name(host, sizeof(host));
	char nodebuf[256];
	const char *node = r2cc_node_key(nodebuf, sizeof(nodebuf));
	int n = r2cc_nic_count();
	struct r2cc_nic_stat st[R2CC_MAX_NICS];
	if (n > R2CC_MAX_NICS)
		n = R2CC_MAX_NICS;
	r2cc_nic_stats(st, n);
	if (text) {
		fprintf(text, "R2CC %s report: host %s node %s pid %d mode %d\n", r2cc_version(),
			host, node, (int)getpid(), r2cc_param.mode);
		/* RDMA writes are one-sided: a process sees the bytes it sends, and
		 * of what it receives only what its receive completions report. */
		fprintf(text, "%-16s %-16s %16s %12s %16s %12s %9s\n", "nic", "state", "tx_bytes",
			"tx_wrs", "recv_cqe_bytes", "recv_cqes", "failbacks");
		for (int i = 0; i < n; i++)
			fprintf(text, "%-16s %-16s %16llu %12llu %16llu %12llu %9d\n", st[i].name,
				state_name(st[i].state), (unsigned long long)st[i].tx_bytes,
				(unsigned long long)st[i].tx_wrs,
				(unsigned long long)st[i].rx_bytes,
				(unsigned long long)st[i].rx_wrs, failbacks(i));
		fprintf(text, "communicators alive at exit: %d\n", r2cc_comm_count());
		const char *unprot = r2cc_unprotected_first();
		if (unprot)
			fprintf(text, "protection: NOT PROTECTED: %s\n", unprot);
		else
			fprintf(text, "protection: every transport seen is one R2CC repairs\n");
		void (*inc)(FILE *, FILE *) =
		    __atomic_load_n(&r2cc_report_incidents_hook, __ATOMIC_ACQUIRE);
		if (inc)
			inc(text, NULL);
		else
			fprintf(text, "incidents: none\n");
		void (*stalls)(FILE *, FILE *) =
		    __atomic_load_n(&r2cc_report_stalls_hook, __ATOMIC_ACQUIRE);
		if (stalls)
			stalls(text, NULL);
		void (*drill_fn)(FILE *, FILE *) =
		    __atomic_load_n(&r2cc_report_drill_hook, __ATOMIC_ACQUIRE);
		if (drill_fn)
			drill_fn(text, NULL);
	}
	if (json) {
		fprintf(
		    json,
		    "{\"version\":\"%s\",\"host\":\"%s\",\"node\":\"%s\",\"pid\":%d,\"mode\":%d,"
		    "\"nics\":[",
		    r2cc_version(), host, node, (int)getpid(), r2cc_param.mode);
		for (int i = 0; i < n; i++)
			fprintf(
			    json,
			    "%s{\"name\":\"%s\",\"state\":\"%s\",\"tx_bytes\":%llu,\"tx_wrs\":%llu,"
			    "\"recv_cqe_bytes\":%llu,\"recv_cqes\":%llu,\"failbacks\":%d}",
			    i ? "," : "", st[i].name, state_name(st[i].state),
			    (unsigned long long)st[i].tx_bytes, (unsigned long long)st[i].tx_wrs,
			    (unsigned long long)st[i].rx_bytes, (unsigned long long)st[i].rx_wrs,
			    failbacks(i));
		fprintf(json, "],\"communicators\":%d,\"protected\":%s,", r2cc_comm_count(),
			r2cc_unprotected_first() ? "false" : "true");
		if (r2cc_unprotected_first()) {
			fprintf(json, "\"not_protected\":");
			r2cc_json_str(json, r2cc_unprotected_first());
			fputc(',', json);
		}
		fprintf(json, "\"incidents\":[");
		void (*inc)(FILE *, FILE *) =
		    __atomic_load_n(&r2cc_report_incidents_hook, __ATOMIC_ACQUIRE);
		if (inc)
			inc(NULL, json);
		fprintf(json, "]");
		void (*stalls)(FILE *, FILE *) =
		    __atomic_load_n(&r2cc_report_stalls_hook, __ATOMIC_ACQUIRE);
		if (stalls) {
			fprintf(json, ",\"stall_scan\":");
			stalls(NULL, json);
		}
		void (*drill_fn)(FILE *, FILE *) =
		    __atomic_load_n(&r2cc_report_drill_hook, __ATOMIC_ACQUIRE);
		if (drill_fn) {
			fprintf(json, ",\"drill\":");
			drill_fn(NULL, json);
		}
		fprintf(json, "}\n");
	}
}

void r2cc_report_at_exit(void)
{
	int saved = errno;
	if (!r2cc_param.report[0])
		return;
	char path[512], jpath[530];
	r2cc_path_expand(r2cc_param.report, path, sizeof(path));
	snprintf(jpath, sizeof(jpath), "%s.json", path);
	FILE *t = fopen(path, "w");
	FILE *j = fopen(jpath, "w");
	if (!t || !j)
		R2CC_WARN("R2CC_REPORT: cannot write %s: %s", !t ? path : jpath, strerror(errno));
	r2cc_report_write(t, j);
	if (t)
		fclose(t);
	if (j)
		fclose(j);
	errno = saved;
}
