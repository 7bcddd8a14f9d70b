/*
 * The cost model and the `auto` choice (see cost.h); the fit of the constants
 * is in cost_fit.c, outside the library. Pure arithmetic: no allocation, no
 * logging, no libm calls (the library is linked without -lm).
 */
#include "strategies/cost.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_CHUNKS 4 /* R2CC_AR_STAGE2_CHUNKS default */

/*
 * Fitted by r2cc-fit-cost to 88 verified AllReduces on the software fabric
 * (strategies/fit/fit.csv: 2 and 4 nodes, 3 NICs each at
 * 25 Gb/s, one declared failed, Balance and R2CC-AllReduce, 8 B-4 GiB; ranks
 * sharing a GPU under MPS). RMS error 6 % from 256 MiB up, where `auto`
 * decides; the small sizes' latency regime fits a straight line poorly (45 %)
 * and below R2CC_AR_MIN_BYTES nothing is decided anyway. R2CC-AllReduce's bytes
 * cost 1.075 x Balance's here: `auto` picks it at 4 nodes and more for large
 * messages, never at 2. R2CC_COST_MODEL installs a fit of one's own cluster.
 */
const struct r2cc_cost_model r2cc_cost_default = {
    .alpha_us = 46.6957,
    .beta_us_per_byte = 0.000339922,
    .ar2_beta_us_per_byte = 0.000365273,
    .ar2_stage_us = 131.003,
    .ar2_chunk_us = 75.5015,
};

static const char *const strat_name[R2CC_STRAT_COUNT] = {
    [R2CC_STRAT_HEALTHY] = "healthy ring",
    [R2CC_STRAT_BACKUP] = "mode 1 backup NIC",
    [R2CC_STRAT_BALANCE] = "mode 2 Balance",
    [R2CC_STRAT_AR2] = "mode 3 R2CC-AllReduce",
};

const char *r2cc_strategy_name(enum r2cc_strategy s)
{
	return (unsigned)s < R2CC_STRAT_COUNT ? strat_name[s] : "?";
}

double r2cc_cost_factor_backup(int nics, int failed)
{
	int healthy = nics - failed;

	if (failed <= 0)
		return 1.0;
	if (healthy <= 0)
		return HUGE_VAL;
	return 1.0 + (double)((failed + healthy - 1) / healthy);
}

double r2cc_cost_factor_balance(int nics, int failed)
{
	if (failed <= 0)
		return 1.0;
	if (failed >= nics)
		return HUGE_VAL;
	return (double)nics / (double)(nics - failed);
}

double r2cc_cost_factor_ar2(int nodes, int nics, int failed)
{
	double x;

	if (nodes < 2 || failed <= 0 || failed >= nics)
		return r2cc_cost_factor_balance(nics, failed);
	x = (double)failed / nics;
	return 1.0 + nodes * x / (2.0 * (nodes - 1) * (1.0 - x));
}

double r2cc_cost_nic_load(const struct r2cc_cost_case *c)
{
	if (c->nodes < 2 || c->nics < 1)
		return 0;
	return 2.0 * (c->nodes - 1) / c->nodes * c->bytes / c->nics;
}

int r2cc_cost_chunks(const struct r2cc_cost_case *c)
{
	return c->chunks > 0 ? c->chunks : DEFAULT_CHUNKS;
}

double r2cc_cost_time(const struct r2cc_cost_model *m, enum r2cc_strategy s,
		      const struct r2cc_cost_case *c)
{
	double load = r2cc_cost_nic_load(c), f;

	switch (s) {
	case R2CC_STRAT_HEALTHY:
		return m->alpha_us + m->beta_us_per_byte * load;
	case R2CC_STRAT_BACKUP:
		f = r2cc_cost_factor_backup(c->nics, c->failed);
		break;
	case R2CC_STRAT_BALANCE:
		f = r2cc_cost_factor_balance(c->nics, c->failed);
		break;
	case R2CC_STRAT_AR2:
		f = r2cc_cost_factor_ar2(c->nodes, c->nics, c->failed);
		if (f == HUGE_VAL)
			return HUGE_VAL;
		return m->alpha_us + 2 * m->ar2_stage_us + r2cc_cost_chunks(c) * m->ar2_chunk_us +
		       m->ar2_beta_us_per_byte * load * f;
	default:
		return HUGE_VAL;
	}
	if (f == HUGE_VAL)
		return HUGE_VAL;
	return m->alpha_us + m->beta_us_per_byte * load * f;
}

double r2cc_cost_relative(const struct r2cc_cost_model *m, enum r2cc_strategy s,
			  const struct r2cc_cost_case *c)
{
	double t = r2cc_cost_time(m, s, c), t0 = r2cc_cost_time(m, R2CC_STRAT_HEALTHY, c);

	if (t == HUGE_VAL || t0 <= 0)
		return HUGE_VAL;
	return t / t0;
}

static const char *size_str(double bytes, char *buf, size_t len)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	int u = 0;

	while (bytes >= 1024 && u < 4) {
		bytes /= 1024;
		u++;
	}
	snprintf(buf, len, "%.4g %s", bytes, unit[u]);
	return buf;
}

enum r2cc_strategy r2cc_cost_choose(const struct r2cc_cost_model *m, const struct r2cc_cost_case *c,
				    char *reason, size_t len)
{
	double tb, ta, t0;
	char sz[32];

	if (!reason || !len) {
		reason = sz; /* scratch, discarded */
		len = 0;
	}
	if (c->failed <= 0) {
		if (len)
			snprintf(reason, len, "no failed NIC: Balance is plain NCCL");
		return R2CC_STRAT_BALANCE;
	}
	if (c->failed >= c->nics) {
		if (len)
			snprintf(reason, len,
				 "the degraded node has no NIC left: R2CC-AllReduce cannot help");
		return R2CC_STRAT_BALANCE;
	}
	if (c->nodes < 3) {
		if (len)
			snprintf(reason, len,
				 "%d node%s: R2CC-AllReduce moves as much data as Balance, plus "
				 "extra calls",
				 c->nodes, c->nodes == 1 ? "" : "s");
		return R2CC_STRAT_BALANCE;
	}
	tb = r2cc_cost_time(m, R2CC_STRAT_BALANCE, c);
	ta = r2cc_cost_time(m, R2CC_STRAT_AR2, c);
	t0 = r2cc_cost_time(m, R2CC_STRAT_HEALTHY, c);
	if (len)
		snprintf(reason, len,
			 "predicted R2CC-AllReduce %.3fx vs Balance %.3fx of healthy (%d nodes, "
			 "%d of %d NICs failed, %s, K=%d)",
			 ta / t0, tb / t0, c->nodes, c->failed, c->nics,
			 size_str(c->bytes, sz, sizeof(sz)), r2cc_cost_chunks(c));
	return ta < tb ? R2CC_STRAT_AR2 : R2CC_STRAT_BALANCE;
}

double r2cc_cost_crossover_bytes(const struct r2cc_cost_model *m, int nodes, int nics, int failed,
				 int chunks)
{
	struct r2cc_cost_case c = {nodes, nics, failed, 0.0, chunks};
	double diff0, diff1;

	if (nodes < 3 || failed <= 0 || failed >= nics)
		return HUGE_VAL;
	/* time_ar2 - time_balance = diff0 - (diff0 - diff1) * S */
	diff0 = r2cc_cost_time(m, R2CC_STRAT_AR2, &c) - r2cc_cost_time(m, R2CC_STRAT_BALANCE, &c);
	c.bytes = 1.0;
	diff1 = r2cc_cost_time(m, R2CC_STRAT_AR2, &c) - r2cc_cost_time(m, R2CC_STRAT_BALANCE, &c);
	if (diff0 - diff1 <= 0)
		return HUGE_VAL;
	return diff0 <= 0 ? 0 : diff0 / (diff0 - diff1);
}

static const char *const field_name[R2CC_COST_NPARAMS] = {
    "alpha_us", "beta_us_per_byte", "ar2_beta_us_per_byte", "ar2_stage_us", "ar2_chunk_us",
};

static double *field(struct r2cc_cost_model *m, int i)
{
	double *const f[R2CC_COST_NPARAMS] = {&m->alpha_us, &m->beta_us_per_byte,
					      &m->ar2_beta_us_per_byte, &m->ar2_stage_us,
					      &m->ar2_chunk_us};

	return f[i];
}

int r2cc_cost_model_parse(const char *str, struct r2cc_cost_model *m, char *err, size_t errlen)
{
	struct r2cc_cost_model tmp = *m;
	const char *p = str;
	char *end;
	size_t len;
	double v;
	int i;

	while (*p) {
		len = strcspn(p, "=,");
		for (i = 0; i < R2CC_COST_NPARAMS; i++)
			if (strlen(field_name[i]) == len && !strncmp(p, field_name[i], len))
				break;
		if (i == R2CC_COST_NPARAMS || p[len] != '=') {
			if (err && errlen)
				snprintf(err, errlen,
					 "model: \"%.*s\" is not NAME=VALUE with NAME one of "
					 "alpha_us, beta_us_per_byte, ar2_beta_us_per_byte, "
					 "ar2_stage_us, ar2_chunk_us",
					 (int)len, p);
			return -EINVAL;
		}
		v = strtod(p + len + 1, &end);
		if (end == p + len + 1 || (*end && *end != ',') || !(v >= 0) || v == HUGE_VAL) {
			if (err && errlen)
				snprintf(err, errlen, "model: %s needs a number >= 0",
					 field_name[i]);
			return -EINVAL;
		}
		*field(&tmp, i) = v;
		p = *end ? end + 1 : end;
	}
	*m = tmp;
	return 0;
}

void r2cc_cost_model_format(const struct r2cc_cost_model *m, char *buf, size_t len)
{
	struct r2cc_cost_model copy = *m;
	size_t used = 0;
	int i;

	if (len)
		buf[0] = '\0';
	for (i = 0; i < R2CC_COST_NPARAMS && used < len; i++)
		used += (size_t)snprintf(buf + used, len - used, "%s%s=%.6g", i ? "," : "",
					 field_name[i], *field(&copy, i));
}
