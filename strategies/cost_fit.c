/*
 * Least-squares fit of the cost model's constants to measurements, and the
 * CSV reader for them (see cost.h). Used by build/bin/r2cc-fit-cost and the
 * tests; not part of the library.
 */
#include "strategies/cost.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Design row of one sample: time = row . p with p in struct order. */
static void design_row(const struct r2cc_cost_sample *s, double *row)
{
	struct r2cc_cost_case c = {s->nodes, s->nics, s->failed, s->bytes, s->chunks, 1, 0};
	double load = r2cc_cost_nic_load(&c);

	memset(row, 0, sizeof(double) * R2CC_COST_NPARAMS);
	row[0] = 1.0;
	switch (s->strategy) {
	case R2CC_STRAT_HEALTHY:
		row[1] = load;
		break;
	case R2CC_STRAT_BACKUP:
		row[1] = load * r2cc_cost_factor_backup(s->nics, s->failed);
		break;
	case R2CC_STRAT_BALANCE:
		row[1] = load * r2cc_cost_factor_balance(s->nics, s->failed);
		break;
	default:
		row[2] = load * r2cc_cost_factor_ar2(s->nodes, s->nics, s->failed);
		row[3] = 2.0;
		row[4] = r2cc_cost_chunks(&c);
		break;
	}
}

static bool sample_usable(const struct r2cc_cost_sample *s)
{
	return (unsigned)s->strategy < R2CC_STRAT_COUNT && s->time_us > 0 && s->nodes >= 1 &&
	       s->nics >= 1 && s->failed >= 0 && s->failed < s->nics && s->bytes >= 0;
}

/* Solve a x = b (n x n, row-major) in place by Gaussian elimination. */
static int solve(double *a, double *b, int n)
{
	int i, j, k, p;
	double t;

	for (k = 0; k < n; k++) {
		p = k;
		for (i = k + 1; i < n; i++)
			if (fabs(a[i * n + k]) > fabs(a[p * n + k]))
				p = i;
		if (a[p * n + k] == 0)
			return -EINVAL;
		if (p != k) {
			for (j = 0; j < n; j++) {
				t = a[k * n + j];
				a[k * n + j] = a[p * n + j];
				a[p * n + j] = t;
			}
			t = b[k];
			b[k] = b[p];
			b[p] = t;
		}
		for (i = k + 1; i < n; i++) {
			t = a[i * n + k] / a[k * n + k];
			for (j = k; j < n; j++)
				a[i * n + j] -= t * a[k * n + j];
			b[i] -= t * b[k];
		}
	}
	for (k = n - 1; k >= 0; k--) {
		for (j = k + 1; j < n; j++)
			b[k] -= a[k * n + j] * b[j];
		b[k] /= a[k * n + k];
	}
	return 0;
}

/*
 * Weighted least squares on rows divided by the measured time (relative
 * error), in coordinates scaled so that every column has unit RMS, with a
 * tiny ridge pulling towards the starting values: it decides only the
 * directions the data leave undetermined. Every constant is a time, so none may
 * be negative: one that the unconstrained solution drives below zero (sizes far
 * above the latency terms cannot see them, and noise then pushes them anywhere)
 * is held at zero and the others are fitted again, until none is negative.
 */
/* gbps > 0: the per-byte constants are the link rate's, not fitted (columns 1, 2
 * known: their part of each time is subtracted, the model keeps them at 0). */
static int fit(struct r2cc_cost_model *m, const struct r2cc_cost_sample *s, int n, double gbps,
	       double *rms_rel_p)
{
	enum { P = R2CC_COST_NPARAMS };
	double known_beta = gbps > 0 ? 8.0 / (1000.0 * gbps) : 0, y;
	double p0[P] = {m->alpha_us, m->beta_us_per_byte, m->ar2_beta_us_per_byte, m->ar2_stage_us,
			m->ar2_chunk_us};
	double scale[P] = {0}, ata[P * P], atb[P], row[P], q[P], lambda, e, sse = 0;
	bool zero[P] = {false};
	int i, j, k, used = 0, round;

	if (gbps > 0) {
		zero[1] = zero[2] = true;
		p0[1] = p0[2] = 0;
	}

	for (i = 0; i < n; i++) {
		if (!sample_usable(&s[i]))
			continue;
		design_row(&s[i], row);
		for (j = 0; j < P; j++)
			scale[j] += (row[j] / s[i].time_us) * (row[j] / s[i].time_us);
		used++;
	}
	if (!used)
		return -EINVAL;
	for (j = 0; j < P; j++) {
		if (scale[j] > 0)
			scale[j] = sqrt(scale[j] / used);
		else
			scale[j] = p0[j] != 0 ? 1.0 / fabs(p0[j]) : 1.0;
		if (p0[j] < 0)
			p0[j] = 0;
	}
	lambda = 1e-9 * used;
	for (round = 0; round <= P; round++) {
		bool again = false;

		memset(ata, 0, sizeof(ata));
		memset(atb, 0, sizeof(atb));
		for (i = 0; i < n; i++) {
			if (!sample_usable(&s[i]))
				continue;
			design_row(&s[i], row);
			y = 1.0 - known_beta * (row[1] + row[2]) / s[i].time_us;
			for (j = 0; j < P; j++)
				row[j] = zero[j] ? 0 : row[j] / (s[i].time_us * scale[j]);
			for (j = 0; j < P; j++) {
				atb[j] += row[j] * y;
				for (k = 0; k < P; k++)
					ata[j * P + k] += row[j] * row[k];
			}
		}
		for (j = 0; j < P; j++) {
			ata[j * P + j] += zero[j] ? 1.0 : lambda;
			atb[j] += zero[j] ? 0 : lambda * p0[j] * scale[j];
		}
		if (solve(ata, atb, P))
			return -EINVAL;
		for (j = 0; j < P; j++) {
			q[j] = zero[j] ? 0 : atb[j] / scale[j];
			if (q[j] < 0) {
				zero[j] = true;
				again = true;
			}
		}
		if (!again)
			break;
	}
	m->alpha_us = q[0];
	m->beta_us_per_byte = q[1];
	m->ar2_beta_us_per_byte = q[2];
	m->ar2_stage_us = q[3];
	m->ar2_chunk_us = q[4];
	if (rms_rel_p) {
		for (i = 0; i < n; i++) {
			if (!sample_usable(&s[i]))
				continue;
			design_row(&s[i], row);
			e = -s[i].time_us + known_beta * (row[1] + row[2]);
			for (j = 0; j < P; j++)
				e += row[j] * q[j];
			e /= s[i].time_us;
			sse += e * e;
		}
		*rms_rel_p = sqrt(sse / used);
	}
	return 0;
}

int r2cc_cost_fit(struct r2cc_cost_model *m, const struct r2cc_cost_sample *s, int n,
		  double *rms_rel_p)
{
	return fit(m, s, n, 0, rms_rel_p);
}

int r2cc_cost_fit_latency(struct r2cc_cost_model *m, const struct r2cc_cost_sample *s, int n,
			  double gbps, double *rms_rel_p)
{
	return gbps > 0 ? fit(m, s, n, gbps, rms_rel_p) : -EINVAL;
}

static int csv_fail(char *err, size_t errlen, const char *what, const char *line)
{
	if (err && errlen)
		snprintf(err, errlen, "%s in \"%.60s\"", what, line);
	return -EINVAL;
}

static int parse_strategy(const char *f, size_t len)
{
	static const struct {
		const char *name;
		int s;
	} names[] = {
	    {"healthy", R2CC_STRAT_HEALTHY},	{"ring", R2CC_STRAT_HEALTHY},
	    {"0", R2CC_STRAT_HEALTHY},		{"backup", R2CC_STRAT_BACKUP},
	    {"1", R2CC_STRAT_BACKUP},		{"balance", R2CC_STRAT_BALANCE},
	    {"2", R2CC_STRAT_BALANCE},		{"ar2", R2CC_STRAT_AR2},
	    {"r2cc-allreduce", R2CC_STRAT_AR2}, {"3", R2CC_STRAT_AR2},
	};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strlen(names[i].name) == len && strncasecmp(f, names[i].name, len) == 0)
			return names[i].s;
	return -1;
}

int r2cc_cost_parse_csv_line(const char *line, struct r2cc_cost_sample *s, char *err, size_t errlen)
{
	const char *p = line, *f;
	char *end;
	double v[6];
	int nf = 0, st;
	size_t len;

	while (*p == ' ' || *p == '\t')
		p++;
	if (!*p || *p == '\n' || *p == '\r' || *p == '#')
		return 0;
	if (strncasecmp(p, "strategy,", 9) == 0)
		return 0;
	f = p;
	len = strcspn(f, ",");
	while (len && (f[len - 1] == ' ' || f[len - 1] == '\t'))
		len--;
	st = parse_strategy(f, len);
	if (st < 0)
		return csv_fail(err, errlen, "unknown strategy (healthy|backup|balance|ar2|0..3)",
				line);
	p = f + strcspn(f, ",");
	while (*p == ',' && nf < 6) {
		v[nf] = strtod(p + 1, &end);
		if (end == p + 1)
			return csv_fail(err, errlen, "missing number", line);
		while (*end == ' ' || *end == '\t')
			end++;
		p = end;
		nf++;
	}
	if (*p && *p != '\n' && *p != '\r')
		return csv_fail(err, errlen, "trailing text", line);
	if (nf < 5)
		return csv_fail(err, errlen, "fewer than 6 fields", line);
	if (v[0] < 1 || v[1] < 1 || v[2] < 0 || v[2] >= v[1] || v[3] < 0 || v[4] <= 0 ||
	    (nf == 6 && v[5] < 1) || v[0] != (int)v[0] || v[1] != (int)v[1] || v[2] != (int)v[2])
		return csv_fail(err, errlen,
				"values out of range (n>=1, k>=1, 0<=f<k, bytes>=0, "
				"time_us>0, chunks>=1)",
				line);
	s->strategy = (enum r2cc_strategy)st;
	s->nodes = (int)v[0];
	s->nics = (int)v[1];
	s->failed = (int)v[2];
	s->bytes = v[3];
	s->time_us = v[4];
	s->chunks = nf == 6 ? (int)v[5] : 0; /* 0: the default K */
	return 1;
}
