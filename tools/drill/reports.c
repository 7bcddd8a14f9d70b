/*
 * r2cc-verbs-drill reads R2CC's incident reports (main.c has the overview): a small
 * JSON reader, the classes of an incident's evidence, and what each scenario's
 * reports say.
 */
#include "tools/drill/parent.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- R2CC's incident reports ---- */

static int drill_scan_key(const char *text, const char *key, double *out, int room)
{
	const char *q = text;
	int n = 0;

	while (n < room && (q = strstr(q, key))) {
		bool whole =
		    (q == text || strchr("\" \t\n,{", q[-1])) && strchr("\" \t:=", q[strlen(key)]);
		char *end;
		double v;

		q += strlen(key);
		if (!whole)
			continue; /* part of another key, e.g. max_detect_ms */
		while (*q == '"' || *q == ' ' || *q == ':' || *q == '=' || *q == '\t')
			q++;
		v = strtod(q, &end);
		if (end != q && v >= 0)
			out[n++] = v;
	}
	return n;
}

/*
 * R2CC's JSON report, read as far as the comparison needs: a member of an object, the
 * elements of an array, strings, numbers and booleans. The report is R2CC's own
 * output (shim/report.c), so this is no general parser: it only keeps strings and
 * nesting apart.
 */

/* Where the JSON value at p ends: one past a string, object or array, at the comma or
 * closing bracket after a scalar. */
static const char *drill_json_end(const char *p)
{
	int depth = 0;
	bool str = false;

	for (; *p; p++) {
		if (str) {
			if (*p == '\\' && p[1])
				p++;
			else if (*p == '"' && !depth)
				return p + 1;
			else if (*p == '"')
				str = false;
		} else if (*p == '"') {
			str = true;
		} else if (*p == '{' || *p == '[') {
			depth++;
		} else if (*p == '}' || *p == ']' || *p == ',') {
			if (!depth)
				return p;
			if (*p != ',' && --depth == 0)
				return p + 1;
		}
	}
	return p;
}

static const char *drill_json_ws(const char *p)
{
	while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
		p++;
	return p;
}

/* The value of member `key` of the object at obj, or NULL. */
static const char *drill_json_get(const char *obj, const char *key)
{
	const char *p = drill_json_ws(obj);
	size_t len = strlen(key);

	if (*p != '{')
		return NULL;
	p = drill_json_ws(p + 1);
	while (*p == '"') {
		const char *name = p + 1, *v;

		p = drill_json_end(p);
		p = drill_json_ws(p);
		if (*p != ':')
			return NULL;
		v = drill_json_ws(p + 1);
		if ((size_t)(p - name) >= len + 1 && !strncmp(name, key, len) && name[len] == '"')
			return v;
		p = drill_json_ws(drill_json_end(v));
		if (*p != ',')
			return NULL;
		p = drill_json_ws(p + 1);
	}
	return NULL;
}

/* The n-th element of the array at arr, or NULL past its end. */
static const char *drill_json_at(const char *arr, int n)
{
	const char *p = arr ? drill_json_ws(arr) : NULL;

	if (!p || *p != '[')
		return NULL;
	p = drill_json_ws(p + 1);
	for (int i = 0; *p && *p != ']'; i++) {
		if (i == n)
			return p;
		p = drill_json_ws(drill_json_end(p));
		if (*p != ',')
			return NULL;
		p = drill_json_ws(p + 1);
	}
	return NULL;
}

static double drill_json_num(const char *obj, const char *key, double dflt)
{
	const char *v = drill_json_get(obj, key);
	char *end;
	double x = v ? strtod(v, &end) : 0;

	return v && end != v ? x : dflt;
}

static bool drill_json_true(const char *obj, const char *key)
{
	const char *v = drill_json_get(obj, key);

	return v && !strncmp(v, "true", 4);
}

/* Member `key`'s string, unescaped (a \u escape as '?'), cut to fit; "" if none. */
static void drill_json_str(const char *obj, const char *key, char *buf, size_t len)
{
	const char *v = drill_json_get(obj, key);
	size_t n = 0;

	if (v && *v == '"')
		for (v++; *v && *v != '"' && n + 1 < len; v++) {
			if (*v == '\\' && v[1]) {
				v++;
				if (*v == 'u' && v[1] && v[2] && v[3] && v[4]) {
					v += 4;
					buf[n++] = '?';
					continue;
				}
				buf[n++] = *v == 'n' ? ' ' : *v == 't' ? ' ' : *v;
				continue;
			}
			buf[n++] = *v;
		}
	if (len)
		buf[n] = '\0';
}

const char *const drill_evidence_names[] = {
    "declared",	    "failback",	      "peer-notice",	"self-test",	    "port-event",
    "dead-device",  "new-path-error", "retry-exceeded", "error-completion", "qp-error-event",
    "created-late", "stall",	      "other"};

static int drill_evidence_class(const char *ev)
{
	static const struct {
		const char *text;
		bool prefix;
		int cls;
	} rules[] = {
	    {"declared", true, DRILL_EV_DECLARED},
	    {"failback", true, DRILL_EV_FAILBACK},
	    {"peer notice", true, DRILL_EV_PEER},
	    {"self-test through", false, DRILL_EV_SELFTEST},
	    {"port error event", false, DRILL_EV_PORT},
	    {"port not active", false, DRILL_EV_PORT},
	    {"device fatal event", false, DRILL_EV_DEAD},
	    {"the device is dead", false, DRILL_EV_DEAD},
	    {"on its new path", false, DRILL_EV_NEW_PATH},
	    {"error completion (status 12)", true, DRILL_EV_RETRY},
	    {"error completion", true, DRILL_EV_ERROR_WC},
	    {"QP error event", false, DRILL_EV_QP_EVENT},
	    {"created on a NIC that has failed", false, DRILL_EV_LATE},
	    {"waited", false, DRILL_EV_STALL},
	};

	if (!strncmp(ev, "same NIC as ", 12) || !strncmp(ev, "same path as ", 13)) {
		const char *in = strchr(ev, '(');
		if (in)
			ev = in + 1;
	}
	for (size_t i = 0; i < sizeof(rules) / sizeof(rules[0]); i++)
		if (rules[i].prefix ? !strncmp(ev, rules[i].text, strlen(rules[i].text))
				    : strstr(ev, rules[i].text) != NULL)
			return rules[i].cls;
	return DRILL_EV_OTHER;
}

/* One JSON report's incidents (classes, queue pairs moved, --inject's detection
 * times) and drill section (the steps' states). */
static void drill_read_json(const struct drill_opts *o, struct drill_scenario *s, const char *text)
{
	const char *inc = drill_json_get(text, "incidents"), *e;
	const char *drill = drill_json_get(text, "drill");
	const char *steps = drill ? drill_json_get(drill, "steps") : NULL;
	char ev[160], state[32], why[200];
	unsigned moved[DRILL_MAX_MOVED];
	int nmoved = 0;

	for (int i = 0; (e = drill_json_at(inc, i)); i++) {
		const char *tl = drill_json_get(e, "timeline"), *te;
		double d = drill_json_num(e, "detected_unix", -1);
		int j;

		drill_json_str(e, "evidence", ev, sizeof(ev));
		s->evidence |= 1u << drill_evidence_class(ev);
		s->incidents++;
		s->drill_marked += drill_json_true(e, "drill");
		s->migrations += (uint64_t)drill_json_num(e, "migrated", 0);
		if (o->inject && d > 0 && s->ndet_unix < DRILL_MAX_DET)
			s->det_unix[s->ndet_unix++] = d;
		/* the queue pairs this process moved (repair/migrate.c's event "qp 0x..: A ->
		 * B (peer C -> D), re-posted ..."), each once however often it moved */
		for (j = 0; (te = drill_json_at(tl, j)); j++) {
			unsigned qpn;
			int k;

			drill_json_str(te, "event", ev, sizeof(ev));
			if (sscanf(ev, "qp 0x%x:", &qpn) != 1 || !strstr(ev, " (peer ") ||
			    !strstr(ev, "), re-posted "))
				continue;
			for (k = 0; k < nmoved && moved[k] != qpn; k++)
				;
			if (k == nmoved && nmoved < DRILL_MAX_MOVED)
				moved[nmoved++] = qpn;
		}
		s->timelines_full += j >= DRILL_TIMELINE_MAX;
	}
	s->qps_moved += (uint64_t)nmoved;
	if (!drill || *drill != '{')
		return;
	s->drill_reports++;
	bool problem = false;
	for (int i = 0; (e = drill_json_at(steps, i)); i++) {
		int k = (int)drill_json_num(e, "step", i + 1) - 1;
		double at = drill_json_num(e, "applied_unix", 0);

		if (k < 0 || k >= DRILL_MAX_STEPS)
			continue;
		drill_json_str(e, "state", state, sizeof(state));
		drill_json_str(e, "why", why, sizeof(why));
		char kind[32];
		drill_json_str(e, "kind", kind, sizeof(kind));
		s->step_up[k] = !strcmp(kind, "up");
		if (!strcmp(state, "applied")) {
			s->step_applied[k]++;
			s->step_qps[k] += (uint64_t)drill_json_num(e, "qps", 0);
			if (at > 0 && (!s->step_unix[k] || at < s->step_unix[k]))
				s->step_unix[k] = at;
			continue;
		}
		if (!s->step_why[0])
			snprintf(s->step_why, sizeof(s->step_why), "step %d %s%s%s", k + 1,
				 state[0] ? state : "not applied", why[0] ? ": " : "", why);
		if (o->expect_drill_problem && strstr(why, o->expect_drill_problem))
			problem = true;
	}
	s->problem += problem;
}

void drill_read_reports(const struct drill_opts *o, struct drill_scenario *s, struct drill_times *t)
{
	for (int r = 0; r < o->procs; r++) {
		static const char *const suffix[] = {".json", ""};

		for (int k = 0; k < 2; k++) {
			char path[PATH_MAX + 64], *text;
			FILE *f;
			long len;
			int n, found;

			snprintf(path, sizeof(path), "%s/r2cc-report.%d%s", s->dir, r, suffix[k]);
			f = fopen(path, "r");
			if (!f)
				continue;
			fseek(f, 0, SEEK_END);
			len = ftell(f);
			rewind(f);
			text = len > 0 && len < (1 << 24) ? calloc(1, (size_t)len + 1) : NULL;
			found = 0;
			if (text && fread(text, 1, (size_t)len, f) == (size_t)len) {
				/* detected_ns is R2CC's CLOCK_MONOTONIC time of the
				 * detection, the clock the injection time is read on.
				 * --inject: from the steps' applied times instead, known
				 * once every report is read (below). */
				double ns[DRILL_MAX_INCIDENT];
				n = drill_scan_key(text, "detected_ns", ns,
						   DRILL_MAX_INCIDENT - t->ndetect);
				for (int i = 0; i < n; i++)
					if (s->injected && !o->inject &&
					    ns[i] >= (double)s->injected_ns) {
						t->detect[t->ndetect++] =
						    (ns[i] - (double)s->injected_ns) / 1e6;
						s->ndetect++;
					}
				found += n;
				n = drill_scan_key(text, "detect_ms", t->detect + t->ndetect,
						   DRILL_MAX_INCIDENT - t->ndetect);
				t->ndetect += n;
				s->ndetect += n;
				found += n;
				n = drill_scan_key(text, "migrate_ms", t->migrate + t->nmigrate,
						   DRILL_MAX_INCIDENT - t->nmigrate);
				t->nmigrate += n;
				s->nmigrate += n;
				found += n;
				n = drill_scan_key(text, "failback_ms", t->back + t->nback,
						   DRILL_MAX_INCIDENT - t->nback);
				for (int i = 0; i < n && s->nback < DRILL_MAX_INCIDENT; i++)
					s->back_ms[s->nback++] = t->back[t->nback + i];
				t->nback += n;
				found += n;
				/* the faulted NIC's failbacks: in its entry of "nics" */
				char nicname[48];
				const char *e;
				double fb[1];
				snprintf(nicname, sizeof(nicname), "\"name\":\"mlx5_%d\"", s->nic);
				if (k == 0 && r / o->per_node == s->node &&
				    (e = strstr(text, nicname)) &&
				    drill_scan_key(e, "failbacks", fb, 1) == 1 &&
				    fb[0] > s->backs_max)
					s->backs_max = (int)fb[0];
				for (const char *q = text; (q = strstr(q, "\"declared\":false"));
				     q++)
					s->repairs++;
				double sus[1], maps[DRILL_MAX_INCIDENT];
				if (drill_scan_key(text, "suspected", sus, 1) == 1)
					s->suspected += (uint64_t)sus[0];
				if (drill_scan_key(text, "reposts_nccl_thread", sus, 1) == 1) {
					s->reposts_nccl += (uint64_t)sus[0];
					s->reposts_said++;
				}
				if (drill_scan_key(text, "reposts_repair_thread", sus, 1) == 1)
					s->reposts_repair += (uint64_t)sus[0];
				if (k == 0 && drill_scan_key(text, "qp_records_freed", sus, 1) == 1)
					s->records_freed += (uint64_t)sus[0];
				if (k == 0 &&
				    drill_scan_key(text, "qp_destroyed_in_repair", sus, 1) == 1)
					s->in_repair += (uint64_t)sus[0];
				n = drill_scan_key(text, "peer_maps_carried", maps,
						   DRILL_MAX_INCIDENT);
				for (int i = 0; i < n; i++)
					s->maps_carried += (uint64_t)maps[i];
				n = drill_scan_key(text, "peer_maps_fetched", maps,
						   DRILL_MAX_INCIDENT);
				for (int i = 0; i < n; i++)
					s->maps_fetched += (uint64_t)maps[i];
				n = drill_scan_key(text, "peer_maps_later", maps,
						   DRILL_MAX_INCIDENT);
				for (int i = 0; i < n; i++)
					s->maps_later += (uint64_t)maps[i];
				n = drill_scan_key(text, "cts_checked", maps, DRILL_MAX_INCIDENT);
				for (int i = 0; i < n; i++)
					s->cts_checked += (uint64_t)maps[i];
				n = drill_scan_key(text, "cts_landed", maps, DRILL_MAX_INCIDENT);
				for (int i = 0; i < n; i++)
					s->cts_landed += (uint64_t)maps[i];
				/* a whole JSON report, at exit, with or without incidents */
				if (k == 0 && strstr(text, "\"nics\":["))
					found++;
				if (k == 0)
					drill_read_json(o, s, text);
				const char *np;
				if (k == 0 && o->expect_unprotected &&
				    strstr(text, "\"protected\":false") &&
				    (np = strstr(text, "\"not_protected\":\"")) &&
				    strstr(np, o->expect_unprotected))
					s->unprotected++;
			}
			free(text);
			fclose(f);
			if (found) {
				s->reports++;
				break; /* the JSON said it; the text copy would count twice */
			}
		}
	}
}

/* --inject: detection times from the plan's first applied step (the earliest
 * applied_unix of any report) to each incident's detected_unix. */
void drill_inject_times(struct drill_scenario *s, struct drill_times *t)
{
	double from = 0;

	for (int k = 0; k < DRILL_MAX_STEPS; k++)
		if (s->step_unix[k] > 0 && (!from || s->step_unix[k] < from))
			from = s->step_unix[k];
	for (int i = 0; from && i < s->ndet_unix && t->ndetect < DRILL_MAX_INCIDENT; i++)
		if (s->det_unix[i] >= from) {
			t->detect[t->ndetect++] = (s->det_unix[i] - from) * 1e3;
			s->ndetect++;
		}
}
