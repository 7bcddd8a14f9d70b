/*
 * Incidents (a NIC's failure or failback and the QPs it moved, with a timeline of
 * events) and hot repair's part of the exit report, in text and JSON.
 */
#include "repair/engine_priv.h"
#include "shim/report.h"
#include "shim/stats.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* Under r2cc_eng.mu. */
int r2cc_incident_get(const char *nic, const char *evidence, int64_t t, bool born_late)
{
	/* A failback's QPs all start at once (the peer's within its batch): a later
	 * failback of the same NIC is an incident of its own. A QP created on the NIC
	 * after it failed joins the NIC's last failure, however long ago: it is no new
	 * one. */
	bool back = !strncmp(evidence, "failback", 8);
	for (int i = r2cc_eng.ninc - 1; i >= 0; i--)
		if (!strcmp(r2cc_eng.inc[i].nic, nic) && r2cc_eng.inc[i].failback == back &&
		    ((born_late && !back) ||
		     t - r2cc_eng.inc[i].t_detect < (back ? FAILBACK_JOIN_NS : INCIDENT_JOIN_NS)))
			return i;
	if (r2cc_eng.ninc == MAX_INCIDENTS)
		return MAX_INCIDENTS - 1;
	struct incident *in = &r2cc_eng.inc[r2cc_eng.ninc];
	memset(in, 0, sizeof(*in));
	snprintf(in->nic, sizeof(in->nic), "%s", nic);
	snprintf(in->evidence, sizeof(in->evidence), "%s", evidence);
	in->declared = strstr(evidence, "declared") != NULL;
	in->failback = back;
	in->t_detect = t;
	return r2cc_eng.ninc++;
}

double r2cc_mono_to_unix(void)
{
	struct timespec rt;
	clock_gettime(CLOCK_REALTIME, &rt);
	return (double)rt.tv_sec + rt.tv_nsec / 1e9 - now_ns() / 1e9;
}

/* Settled: every queue pair it took is moved or failed. Counted once in the
 * statistics page (r2cc top, the exporter), and R2CC_ON_INCIDENT woken. */
void r2cc_incident_progress(int idx)
{
	struct incident *in = &r2cc_eng.inc[idx];
	if (in->settled || in->migrated + in->failed < in->qps)
		return;
	in->settled = true;
	in->t_settled = now_ns();
	struct r2cc_stats_page *pg = in->declared ? NULL : r2cc_stats_page();
	if (pg) {
		struct r2cc_stats_repairs *c = &pg->rep[in->drill ? 1 : 0];
		if (in->failback) {
			c->failbacks++;
		} else {
			int64_t ns = (in->t_done ? in->t_done : in->t_settled) - in->t_detect;
			for (int b = 0; b < R2CC_STATS_REPAIR_BUCKETS; b++)
				if (ns <= (int64_t)(r2cc_stats_repair_bounds_s[b] * 1e9))
					c->le[b]++;
			c->duration_ns_sum += (uint64_t)(ns > 0 ? ns : 0);
			c->qps_moved += (uint64_t)in->migrated;
			c->qps_failed += (uint64_t)in->failed;
			__atomic_store_n(&c->repairs, c->repairs + 1, __ATOMIC_RELEASE);
		}
	}
	r2cc_hook_wake();
}

static void event_locked(int idx, const char *fmt, va_list ap)
{
	if (idx < 0)
		return;
	struct incident *in = &r2cc_eng.inc[idx];
	if (in->nevents < MAX_EVENTS) {
		in->ev[in->nevents].t = now_ns();
		vsnprintf(in->ev[in->nevents].text, sizeof(in->ev[0].text), fmt, ap);
		in->nevents++;
	}
}

void r2cc_incident_event(int idx, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	pthread_mutex_lock(&r2cc_eng.mu);
	event_locked(idx, fmt, ap);
	pthread_mutex_unlock(&r2cc_eng.mu);
	va_end(ap);
}

/* An event of r's incident. Its index is read under r2cc_eng.mu, where a detection
 * writes it: another thread's detection of r may be under way (a peer's REQ is
 * served while NCCL's thread detects the same QP). */
void r2cc_rqp_event(const struct r2cc_rqp *r, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	pthread_mutex_lock(&r2cc_eng.mu);
	event_locked(r->incident, fmt, ap);
	pthread_mutex_unlock(&r2cc_eng.mu);
	va_end(ap);
}

/* The stall scan's suspicions and how their confirmations ended. */
void r2cc_report_stalls(FILE *text, FILE *json)
{
	pthread_mutex_lock(&r2cc_eng.mu);
	uint64_t recs = r2cc_eng.records, freed = r2cc_eng.records_freed;
	uint64_t mid = r2cc_eng.destroyed_in_repair;
	pthread_mutex_unlock(&r2cc_eng.mu);
	uint64_t v[7] = {
	    __atomic_load_n(&r2cc_eng.stalls_suspected, __ATOMIC_RELAXED),
	    __atomic_load_n(&r2cc_eng.stalls_node_wide, __ATOMIC_RELAXED),
	    __atomic_load_n(&r2cc_eng.selftests_passed, __ATOMIC_RELAXED),
	    __atomic_load_n(&r2cc_eng.selftests_failed, __ATOMIC_RELAXED),
	    __atomic_load_n(&r2cc_eng.selftests_inconclusive, __ATOMIC_RELAXED),
	    __atomic_load_n(&r2cc_eng.reposts_nccl, __ATOMIC_RELAXED),
	    __atomic_load_n(&r2cc_eng.reposts_repair, __ATOMIC_RELAXED),
	};
	double answer_ms =
	    (double)__atomic_load_n(&r2cc_eng.selftest_answer_max_ns, __ATOMIC_RELAXED) / 1e6;
	unsigned long long far = __atomic_load_n(&r2cc_eng.selftests_far, __ATOMIC_RELAXED);
	unsigned long long asked = __atomic_load_n(&r2cc_eng.far_ends_asked, __ATOMIC_RELAXED);
	if (text)
		fprintf(
		    text,
		    "stall scan: %llu suspected, %llu node-wide slowdowns ignored, %llu peers "
		    "asked to test their end; self-tests %llu passed (slowest answer %.1f ms), "
		    "%llu failed, %llu inconclusive, %llu with a far witness\n"
		    "sends posted on moved paths: %llu by NCCL's threads, %llu by the repair "
		    "thread\n"
		    "queue pair records: %llu held, %llu of destroyed QPs freed (%llu destroyed "
		    "during their repair)\n",
		    (unsigned long long)v[0], (unsigned long long)v[1], asked,
		    (unsigned long long)v[2], answer_ms, (unsigned long long)v[3],
		    (unsigned long long)v[4], far, (unsigned long long)v[5],
		    (unsigned long long)v[6], (unsigned long long)recs, (unsigned long long)freed,
		    (unsigned long long)mid);
	if (json)
		fprintf(json,
			"{\"suspected\":%llu,\"node_wide\":%llu,\"far_ends_asked\":%llu,"
			"\"selftests_passed\":%llu,\"selftests_failed\":%llu,"
			"\"selftests_inconclusive\":%llu,"
			"\"selftest_answer_max_ms\":%.3f,\"selftests_far\":%llu,"
			"\"reposts_nccl_thread\":%llu,\"reposts_repair_thread\":%llu,"
			"\"qp_records\":%llu,\"qp_records_freed\":%llu,\"qp_destroyed_in_repair\":%"
			"llu}",
			(unsigned long long)v[0], (unsigned long long)v[1], asked,
			(unsigned long long)v[2], (unsigned long long)v[3],
			(unsigned long long)v[4], answer_ms, far, (unsigned long long)v[5],
			(unsigned long long)v[6], (unsigned long long)recs,
			(unsigned long long)freed, (unsigned long long)mid);
}

/* One incident as JSON (the report's and R2CC_ON_INCIDENT's). Under r2cc_eng.mu. */
void r2cc_incident_json(FILE *json, const struct incident *in, double mono_to_unix)
{
	fprintf(json, "{\"nic\":");
	r2cc_json_str(json, in->nic);
	fprintf(json, ",\"drill\":%s,\"declared\":%s,\"failback\":%s,\"evidence\":",
		in->drill ? "true" : "false", in->declared ? "true" : "false",
		in->failback ? "true" : "false");
	r2cc_json_str(json, in->evidence);
	/* a failback is no detection: its start and time have keys of
	 * their own */
	const char *k0 = in->failback ? "started" : "detected";
	fprintf(json,
		",\"%s_ns\":%lld,\"%s_unix\":%.6f,\"qps\":%d,"
		"\"migrated\":%d,\"failed\":%d,\"created_after\":%d",
		k0, (long long)in->t_detect, k0, in->t_detect / 1e9 + mono_to_unix, in->qps,
		in->migrated, in->failed, in->created_after);
	if (in->t_done)
		fprintf(json, ",\"%s\":%.3f,\"done_unix\":%.6f",
			in->failback ? "failback_ms" : "migrate_ms",
			(in->t_done - in->t_detect) / 1e6, in->t_done / 1e9 + mono_to_unix);
	fprintf(json,
		",\"bytes_reposted\":%llu,\"bytes_saved\":%llu,"
		"\"completions_synthesised\":%llu,\"posts_held\":%llu,"
		"\"peer_maps_carried\":%d,\"peer_maps_fetched\":%d,"
		"\"peer_maps_later\":%d,\"cts_checked\":%llu,\"cts_landed\":%llu,"
		"\"timeline\":[",
		(unsigned long long)in->bytes_reposted, (unsigned long long)in->bytes_saved,
		(unsigned long long)in->synth, (unsigned long long)in->held, in->maps_carried,
		in->maps_fetched, in->maps_later, (unsigned long long)in->cts_checked,
		(unsigned long long)in->cts_landed);
	for (int e = 0; e < in->nevents; e++) {
		fprintf(json, "%s{\"ms\":%.3f,\"event\":", e ? "," : "",
			(in->ev[e].t - in->t_detect) / 1e6);
		r2cc_json_str(json, in->ev[e].text);
		fputc('}', json);
	}
	fprintf(json, "]}");
}

void r2cc_repair_report(FILE *text, FILE *json)
{
	/* Wall-clock times too, for tools that injected the fault and only know
	 * the wall clock (scripts/drill). */
	double mono_to_unix = r2cc_mono_to_unix();
	pthread_mutex_lock(&r2cc_eng.mu);
	int n = r2cc_eng.ninc;
	if (text) {
		if (!n)
			fprintf(text, "incidents: none\n");
		for (int i = 0; i < n; i++) {
			const struct incident *in = &r2cc_eng.inc[i];
			double mig = in->t_done ? (in->t_done - in->t_detect) / 1e6 : -1;
			fprintf(text,
				"incident %d: %s, %s%s%s%s: %s=%lld qps=%d migrated=%d failed=%d "
				"created_after=%d %s=%.3f bytes_reposted=%llu bytes_saved=%llu "
				"completions_synthesised=%llu posts_held=%llu peer_maps_carried=%d "
				"peer_maps_fetched=%d peer_maps_later=%d cts_checked=%llu "
				"cts_landed=%llu\n",
				i + 1, in->nic, in->drill ? "[drill] " : "",
				in->declared ? "[declared] " : "",
				in->failback ? "[failback] " : "", in->evidence,
				in->failback ? "started_ns" : "detected_ns",
				(long long)in->t_detect, in->qps, in->migrated, in->failed,
				in->created_after, in->failback ? "failback_ms" : "migrate_ms", mig,
				(unsigned long long)in->bytes_reposted,
				(unsigned long long)in->bytes_saved, (unsigned long long)in->synth,
				(unsigned long long)in->held, in->maps_carried, in->maps_fetched,
				in->maps_later, (unsigned long long)in->cts_checked,
				(unsigned long long)in->cts_landed);
			for (int e = 0; e < in->nevents; e++)
				fprintf(text, "  +%.3f ms %s\n", (in->ev[e].t - in->t_detect) / 1e6,
					in->ev[e].text);
		}
	}
	if (json)
		for (int i = 0; i < n; i++) {
			if (i)
				fputc(',', json);
			r2cc_incident_json(json, &r2cc_eng.inc[i], mono_to_unix);
		}
	pthread_mutex_unlock(&r2cc_eng.mu);
}
