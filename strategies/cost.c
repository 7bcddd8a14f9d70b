/*
 * The cost model and the `auto` choice (see cost.h); the fit of the constants
 * is in cost_fit.c, outside the library. Pure arithmetic: no allocation, no
 * logging, no libm calls (the library is linked without -lm).
 */
#include "strategies/cost.h"

#include <math.h>
#include <stdio.h>

#define DEFAULT_CHUNKS 4 /* R2CC_AR_STAGE2_CHUNKS default */

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

static int degraded_of(const struct r2cc_cost_case *c)
{
	return c->failed <= 0 ? 0 : c->degraded > 1 ? c->degraded : 1;
}

double r2cc_cost_factor_ar2_multi(int nodes, int nics, int failed, int degraded)
{
	double x, deg, help;
	int h, per;

	if (degraded <= 1)
		return r2cc_cost_factor_ar2(nodes, nics, failed);
	h = nodes - degraded;
	if (h < 1 || failed >= nics)
		return HUGE_VAL;
	if (failed <= 0)
		return 1.0;
	x = (double)failed / nics;
	per = (degraded + h - 1) / h;
	deg = 1.0 + nodes * x / (2.0 * (nodes - 1) * (1.0 - x));
	help = (1.0 - x) + x * nodes / (2.0 * (nodes - 1)) * (2.0 * (h - 1) / h + per);
	return deg > help ? deg : help;
}

double r2cc_cost_beta(const struct r2cc_cost_model *m, const struct r2cc_cost_case *c)
{
	double gbps = c->gbps > 0 ? c->gbps : R2CC_COST_DEFAULT_GBPS;

	return m->beta_us_per_byte > 0 ? m->beta_us_per_byte : 8.0 / (1000.0 * gbps);
}

double r2cc_cost_ar2_beta(const struct r2cc_cost_model *m, const struct r2cc_cost_case *c)
{
	return m->ar2_beta_us_per_byte > 0 ? m->ar2_beta_us_per_byte : r2cc_cost_beta(m, c);
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
	double load = r2cc_cost_nic_load(c), f, beta = r2cc_cost_beta(m, c);
	int deg = degraded_of(c);

	switch (s) {
	case R2CC_STRAT_HEALTHY:
		return m->alpha_us + beta * load;
	case R2CC_STRAT_BACKUP:
		f = r2cc_cost_factor_backup(c->nics, c->failed);
		break;
	case R2CC_STRAT_BALANCE:
		f = r2cc_cost_factor_balance(c->nics, c->failed);
		break;
	case R2CC_STRAT_AR2:
		f = r2cc_cost_factor_ar2_multi(c->nodes, c->nics, c->failed, deg);
		if (f == HUGE_VAL)
			return HUGE_VAL;
		return m->alpha_us + (deg > 1 ? 3 : 2) * m->ar2_stage_us +
		       r2cc_cost_chunks(c) * m->ar2_chunk_us + r2cc_cost_ar2_beta(m, c) * load * f;
	default:
		return HUGE_VAL;
	}
	if (f == HUGE_VAL)
		return HUGE_VAL;
	return m->alpha_us + beta * load * f;
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
	int deg = degraded_of(c);

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
				 "a degraded node has no NIC left: R2CC-AllReduce cannot help");
		return R2CC_STRAT_BALANCE;
	}
	if (deg >= c->nodes) {
		if (len)
			snprintf(reason, len,
				 "every node is degraded: no healthy node to help (R2CC-AllReduce "
				 "cannot run)");
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
			 "%d degraded, at worst %d of %d NICs failed, %s, K=%d, %.0f Gb/s NICs)",
			 ta / t0, tb / t0, c->nodes, deg, c->failed, c->nics,
			 size_str(c->bytes, sz, sizeof(sz)), r2cc_cost_chunks(c),
			 8.0 / (1000.0 * r2cc_cost_beta(m, c)));
	return ta < tb ? R2CC_STRAT_AR2 : R2CC_STRAT_BALANCE;
}

double r2cc_cost_crossover(const struct r2cc_cost_model *m, const struct r2cc_cost_case *c)
{
	struct r2cc_cost_case x = *c;
	double diff0, diff1;

	if (x.nodes < 3 || x.failed <= 0 || x.failed >= x.nics || degraded_of(&x) >= x.nodes)
		return HUGE_VAL;
	/* time_ar2 - time_balance = diff0 - (diff0 - diff1) * S */
	x.bytes = 0.0;
	diff0 = r2cc_cost_time(m, R2CC_STRAT_AR2, &x) - r2cc_cost_time(m, R2CC_STRAT_BALANCE, &x);
	x.bytes = 1.0;
	diff1 = r2cc_cost_time(m, R2CC_STRAT_AR2, &x) - r2cc_cost_time(m, R2CC_STRAT_BALANCE, &x);
	if (diff0 - diff1 <= 0)
		return HUGE_VAL;
	return diff0 <= 0 ? 0 : diff0 / (diff0 - diff1);
}

double r2cc_cost_crossover_bytes(const struct r2cc_cost_model *m, int nodes, int nics, int failed,
				 int chunks)
{
	struct r2cc_cost_case c = {nodes, nics, failed, 0.0, chunks, 1, 0};

	return r2cc_cost_crossover(m, &c);
}
