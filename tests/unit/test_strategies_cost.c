/* Unit tests of the cost model, the auto choice and the fit (strategies/cost*.c). */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strategies/cost.h"

#define EPS 1e-12

/* The model of docs/architecture.md (equal cost per byte for both strategies, small fixed
 * costs): the closed forms are its large-message limits. The shipped defaults
 * are a fit to one fabric and are checked on their own below. */
static const struct r2cc_cost_model design = {
    .alpha_us = 20.0,
    .beta_us_per_byte = 1.0 / 11250.0,
    .ar2_beta_us_per_byte = 1.0 / 11250.0,
    .ar2_stage_us = 20.0,
    .ar2_chunk_us = 20.0,
};

Test(cost, closed_forms)
{
	/* n = 2: R2CC-AllReduce moves as much as Balance */
	for (int k = 2; k <= 8; k++)
		for (int f = 1; f < k; f++)
			cr_assert_float_eq(r2cc_cost_factor_ar2(2, k, f),
					   r2cc_cost_factor_balance(k, f), EPS);
	/* n = 3, X = 1/3: 1 + 3 (1/3) / (2 * 2 * 2/3) = 1.375 vs 1.5 */
	cr_assert_float_eq(r2cc_cost_factor_balance(3, 1), 1.5, EPS);
	cr_assert_float_eq(r2cc_cost_factor_ar2(3, 3, 1), 1.375, EPS);
	cr_assert_float_eq(r2cc_cost_factor_balance(8, 2), 8.0 / 6.0, EPS);
	cr_assert_float_eq(r2cc_cost_factor_ar2(16, 8, 2), 1 + 16 * 0.25 / (2 * 15 * 0.75), EPS);
	/* mode 1: the backup NIC carries two shares for one failure */
	cr_assert_float_eq(r2cc_cost_factor_backup(3, 1), 2.0, EPS);
	cr_assert_float_eq(r2cc_cost_factor_backup(8, 1), 2.0, EPS);
	cr_assert_float_eq(r2cc_cost_factor_backup(8, 4), 2.0, EPS);
	cr_assert_float_eq(r2cc_cost_factor_backup(8, 5), 3.0, EPS); /* ceil(5/3) + 1 */
	cr_assert_float_eq(r2cc_cost_factor_backup(3, 2), 3.0, EPS);
	/* healthy and dead */
	cr_assert_float_eq(r2cc_cost_factor_balance(4, 0), 1.0, EPS);
	cr_assert_float_eq(r2cc_cost_factor_backup(4, 0), 1.0, EPS);
	cr_assert_eq(r2cc_cost_factor_balance(4, 4), HUGE_VAL);
	cr_assert_eq(r2cc_cost_factor_backup(4, 4), HUGE_VAL);
	cr_assert_eq(r2cc_cost_factor_ar2(4, 4, 4), HUGE_VAL);
}

Test(cost, large_messages_tend_to_closed_forms)
{
	struct r2cc_cost_case c = {3, 3, 1, 1e13, 4, 1, 0};

	cr_assert_float_eq(r2cc_cost_relative(&design, R2CC_STRAT_BALANCE, &c), 1.5, 1e-6);
	cr_assert_float_eq(r2cc_cost_relative(&design, R2CC_STRAT_AR2, &c), 1.375, 1e-6);
	cr_assert_float_eq(r2cc_cost_relative(&design, R2CC_STRAT_BACKUP, &c), 2.0, 1e-6);
	cr_assert_float_eq(r2cc_cost_relative(&design, R2CC_STRAT_HEALTHY, &c), 1.0, EPS);
}

Test(cost, monotonic)
{
	for (int n = 2; n <= 64; n++)
		for (int k = 1; k <= 8; k++)
			for (int f = 1; f < k; f++) {
				double a = r2cc_cost_factor_ar2(n, k, f),
				       b = r2cc_cost_factor_balance(k, f);

				/* more failures: worse */
				cr_assert_gt(r2cc_cost_factor_balance(k, f),
					     r2cc_cost_factor_balance(k, f - 1));
				if (f > 1)
					cr_assert_gt(a, r2cc_cost_factor_ar2(n, k, f - 1));
				/* more nodes: R2CC-AllReduce better, never worse than Balance */
				cr_assert_lt(r2cc_cost_factor_ar2(n + 1, k, f), a + EPS);
				cr_assert_leq(a, b + EPS);
				/* backup never beats Balance */
				cr_assert_geq(r2cc_cost_factor_backup(k, f), b - EPS);
				cr_assert_geq(a, 1.0);
			}
	/* bigger messages: relative fixed costs shrink, R2CC-AllReduce gains */
	double prev = HUGE_VAL;

	for (double s = 1024; s < 1e12; s *= 4) {
		struct r2cc_cost_case c = {4, 4, 1, s, 4, 1, 0};
		double r = r2cc_cost_time(&design, R2CC_STRAT_AR2, &c) /
			   r2cc_cost_time(&design, R2CC_STRAT_BALANCE, &c);

		cr_assert_lt(r, prev);
		prev = r;
	}
}

Test(cost, auto_choice)
{
	char why[256];
	struct r2cc_cost_case c = {3, 3, 1, 4.0 * (1 << 30), 4, 1, 0};
	double x;

	cr_assert_eq(r2cc_cost_choose(&design, &c, why, sizeof(why)), R2CC_STRAT_AR2);
	cr_assert(strstr(why, "1.37") && strstr(why, "1.500"), "%s", why);
	c.bytes = 4096;
	cr_assert_eq(r2cc_cost_choose(&design, &c, why, sizeof(why)), R2CC_STRAT_BALANCE);
	c.bytes = 4.0 * (1 << 30);
	c.nodes = 2;
	cr_assert_eq(r2cc_cost_choose(&design, &c, why, sizeof(why)), R2CC_STRAT_BALANCE);
	cr_assert(strstr(why, "2 nodes"), "%s", why);
	c.nodes = 1;
	cr_assert_eq(r2cc_cost_choose(&design, &c, NULL, 0), R2CC_STRAT_BALANCE);
	c.nodes = 8;
	c.failed = 0;
	cr_assert_eq(r2cc_cost_choose(&design, &c, why, sizeof(why)), R2CC_STRAT_BALANCE);
	cr_assert(strstr(why, "no failed NIC"), "%s", why);
	c.failed = 3;
	cr_assert_eq(r2cc_cost_choose(&design, &c, why, sizeof(why)), R2CC_STRAT_BALANCE);
	cr_assert(strstr(why, "no NIC left"), "%s", why);

	/* the crossover is where the choice flips */
	x = r2cc_cost_crossover_bytes(&design, 4, 4, 1, 4);
	cr_assert(x > 0 && x < HUGE_VAL);
	c = (struct r2cc_cost_case){4, 4, 1, x * 0.99, 4, 1, 0};
	cr_assert_eq(r2cc_cost_choose(&design, &c, NULL, 0), R2CC_STRAT_BALANCE);
	c.bytes = x * 1.01;
	cr_assert_eq(r2cc_cost_choose(&design, &c, NULL, 0), R2CC_STRAT_AR2);
	cr_assert_eq(r2cc_cost_crossover_bytes(&design, 2, 4, 1, 4), HUGE_VAL);
	/* more chunks cost more fixed time: the crossover moves up */
	cr_assert_gt(r2cc_cost_crossover_bytes(&design, 4, 4, 1, 16), x);
}

/* The built-in model (shim/cost_params.c, strategies/fit/fit.txt): per-byte
 * costs from the link rate, the same for both strategies; fitted latencies that
 * R2CC_COST_MODEL would accept; the choices the README states. */
Test(cost, physical_defaults)
{
	const struct r2cc_cost_model *m = &r2cc_cost_default;
	struct r2cc_cost_case c = {2, 3, 1, 4.0 * (1 << 30), 4, 1, 25};
	char spec[256], err[128];
	struct r2cc_cost_model back = design;

	cr_assert(m->alpha_us >= 0 && m->ar2_stage_us >= 0 && m->ar2_chunk_us >= 0);
	cr_assert(m->beta_us_per_byte == 0 && m->ar2_beta_us_per_byte == 0);
	r2cc_cost_model_format(m, spec, sizeof(spec));
	cr_assert_eq(r2cc_cost_model_parse(spec, &back, err, sizeof(err)), 0, "%s", err);
	cr_assert_float_eq(r2cc_cost_beta(m, &c), 8.0 / 25000.0, EPS); /* 25 Gb/s */
	cr_assert_float_eq(r2cc_cost_ar2_beta(m, &c), 8.0 / 25000.0, EPS);
	c.gbps = 0;
	cr_assert_float_eq(r2cc_cost_beta(m, &c), 8.0 / 100000.0, EPS); /* unknown: 100 */
	c.gbps = 25;
	cr_assert_eq(r2cc_cost_choose(m, &c, NULL, 0), R2CC_STRAT_BALANCE); /* 2 nodes */
	c.nodes = 4;
	c.bytes = 1 << 30;
	cr_assert_eq(r2cc_cost_choose(m, &c, NULL, 0), R2CC_STRAT_AR2); /* 4 nodes, 1 GiB */
	c.bytes = 1 << 20;
	cr_assert_eq(r2cc_cost_choose(m, &c, NULL, 0), R2CC_STRAT_BALANCE); /* 1 MiB */
	/* a faster link: the same latencies weigh more, the crossover moves up */
	c.gbps = 400;
	struct r2cc_cost_case slow = c;
	slow.gbps = 25;
	cr_assert_gt(r2cc_cost_crossover(m, &c), 8 * r2cc_cost_crossover(m, &slow));
	/* a model with its own per-byte constant ignores the link rate */
	cr_assert_float_eq(r2cc_cost_beta(&design, &c), design.beta_us_per_byte, EPS);
}

/* Several degraded nodes: the most loaded node, degraded or helper. */
Test(cost, several_degraded_nodes)
{
	/* m <= 1 is the one-node form */
	cr_assert_float_eq(r2cc_cost_factor_ar2_multi(4, 4, 1, 1), r2cc_cost_factor_ar2(4, 4, 1),
			   EPS);
	/* n = 4, m = 2, X = 1/4: degraded 1 + 4/4/(2*3*3/4) = 1.2222, helpers (one each)
	 * 3/4 + 1/4 * 4/6 * (1 + 1) = 1.0833 */
	cr_assert_float_eq(r2cc_cost_factor_ar2_multi(4, 4, 1, 2), 1 + 1.0 / 4.5, EPS);
	/* n = 3, m = 2, X = 1/4: one helper for both: 3/4 + 1/4 * 3/4 * (0 + 2) = 1.125;
	 * degraded 1 + 3/4/(2*2*3/4) = 1.25 */
	cr_assert_float_eq(r2cc_cost_factor_ar2_multi(3, 4, 1, 2), 1.25, EPS);
	/* n = 5, m = 4, X = 1/8: the one helper of four is the busiest:
	 * 7/8 + 1/8 * 5/8 * (0 + 4) = 1.1875 > 1 + 5/8 / (8 * 7/8) */
	cr_assert_float_eq(r2cc_cost_factor_ar2_multi(5, 8, 1, 4), 1.1875, EPS);
	cr_assert_gt(r2cc_cost_factor_ar2_multi(5, 8, 1, 4), 1 + 5.0 / 8 / (8 * 7.0 / 8));
	/* nobody healthy, or a node without NICs: cannot run */
	cr_assert_eq(r2cc_cost_factor_ar2_multi(3, 4, 1, 3), HUGE_VAL);
	cr_assert_eq(r2cc_cost_factor_ar2_multi(4, 4, 4, 2), HUGE_VAL);

	struct r2cc_cost_case c = {4, 4, 1, 1e13, 4, 2, 0};
	char why[320];
	cr_assert_float_eq(r2cc_cost_relative(&design, R2CC_STRAT_AR2, &c), 1 + 1.0 / 4.5, 1e-6);
	cr_assert_eq(r2cc_cost_choose(&design, &c, why, sizeof(why)), R2CC_STRAT_AR2);
	cr_assert(strstr(why, "2 degraded"), "%s", why);
	c.degraded = 4;
	cr_assert_eq(r2cc_cost_choose(&design, &c, why, sizeof(why)), R2CC_STRAT_BALANCE);
	cr_assert(strstr(why, "every node is degraded"), "%s", why);
	cr_assert_eq(r2cc_cost_crossover(&design, &c), HUGE_VAL);
	/* three stages, not two: a larger crossover than one degraded node's */
	c.degraded = 2;
	struct r2cc_cost_case one = c;
	one.degraded = 1;
	cr_assert_gt(r2cc_cost_crossover(&design, &c), 0);
	cr_assert_lt(r2cc_cost_crossover(&design, &one), HUGE_VAL);
}

static const struct r2cc_cost_model truth = {
    .alpha_us = 31.5,
    .beta_us_per_byte = 1.0 / 9000.0,
    .ar2_beta_us_per_byte = 1.1 / 9000.0,
    .ar2_stage_us = 42.0,
    .ar2_chunk_us = 12.5,
};

static int synth(struct r2cc_cost_sample *s, bool ar2, bool vary_k, double noise)
{
	static const int nodes[] = {2, 3, 4, 8}, nics[] = {2, 3, 4, 8}, ks[] = {2, 4, 8};
	int n = 0;

	srand(7);
	for (size_t a = 0; a < 4; a++)
		for (size_t b = 0; b < 4; b++)
			for (int f = 0; f < nics[b]; f++)
				for (double bytes = 1024; bytes <= 4e9; bytes *= 16)
					for (int st = 0; st < R2CC_STRAT_COUNT; st++)
						for (size_t k = 0; k < (vary_k ? 3u : 1u); k++) {
							struct r2cc_cost_case c = {
							    nodes[a],		nics[b], f, bytes,
							    vary_k ? ks[k] : 4, 1,	 0};
							double e =
							    noise * (2.0 * rand() / RAND_MAX - 1);

							if (st == R2CC_STRAT_AR2 && !ar2)
								continue;
							s[n] = (struct r2cc_cost_sample){
							    st,
							    c.nodes,
							    c.nics,
							    c.failed,
							    c.chunks,
							    bytes,
							    r2cc_cost_time(&truth, st, &c) * (1 + e)};
							n++;
						}
	return n;
}

static void expect_close(double got, double want, double rel, const char *what)
{
	cr_assert(fabs(got - want) <= rel * fabs(want), "%s: %g, want %g", what, got, want);
}

Test(cost_fit, recovers_constants)
{
	struct r2cc_cost_sample *s = malloc(sizeof(*s) * 20000);
	struct r2cc_cost_model m = r2cc_cost_default;
	double rms;
	int n = synth(s, true, true, 0);

	cr_assert_eq(r2cc_cost_fit(&m, s, n, &rms), 0);
	cr_assert_lt(rms, 1e-6);
	expect_close(m.alpha_us, truth.alpha_us, 1e-4, "alpha");
	expect_close(m.beta_us_per_byte, truth.beta_us_per_byte, 1e-4, "beta");
	expect_close(m.ar2_beta_us_per_byte, truth.ar2_beta_us_per_byte, 1e-4, "ar2 beta");
	expect_close(m.ar2_stage_us, truth.ar2_stage_us, 1e-3, "stage");
	expect_close(m.ar2_chunk_us, truth.ar2_chunk_us, 1e-3, "chunk");
	free(s);
}

Test(cost_fit, noisy_measurements)
{
	struct r2cc_cost_sample *s = malloc(sizeof(*s) * 20000);
	struct r2cc_cost_model m = r2cc_cost_default;
	double rms;
	int n = synth(s, true, true, 0.02);

	cr_assert_eq(r2cc_cost_fit(&m, s, n, &rms), 0);
	cr_assert_lt(rms, 0.02);
	expect_close(m.alpha_us, truth.alpha_us, 0.05, "alpha");
	expect_close(m.beta_us_per_byte, truth.beta_us_per_byte, 0.02, "beta");
	expect_close(m.ar2_beta_us_per_byte, truth.ar2_beta_us_per_byte, 0.02, "ar2 beta");
	free(s);
}

Test(cost_fit, undetermined_constants_keep_their_values)
{
	struct r2cc_cost_sample *s = malloc(sizeof(*s) * 20000);
	struct r2cc_cost_model m = r2cc_cost_default;
	struct r2cc_cost_case c = {4, 4, 1, 1 << 20, 4, 1, 0};
	int n = synth(s, false, false, 0);

	/* no R2CC-AllReduce rows: its constants stay */
	cr_assert_eq(r2cc_cost_fit(&m, s, n, NULL), 0);
	expect_close(m.alpha_us, truth.alpha_us, 1e-4, "alpha");
	expect_close(m.beta_us_per_byte, truth.beta_us_per_byte, 1e-4, "beta");
	expect_close(m.ar2_stage_us, r2cc_cost_default.ar2_stage_us, 1e-6, "stage");
	expect_close(m.ar2_chunk_us, r2cc_cost_default.ar2_chunk_us, 1e-6, "chunk");
	expect_close(m.ar2_beta_us_per_byte, r2cc_cost_default.ar2_beta_us_per_byte, 1e-6,
		     "ar2 beta");

	/* one K only: stage and chunk are not separable, their sum at K is */
	m = r2cc_cost_default;
	n = synth(s, true, false, 0);
	cr_assert_eq(r2cc_cost_fit(&m, s, n, NULL), 0);
	expect_close(r2cc_cost_time(&m, R2CC_STRAT_AR2, &c),
		     r2cc_cost_time(&truth, R2CC_STRAT_AR2, &c), 1e-5, "time at K = 4");
	cr_assert_eq(r2cc_cost_fit(&m, s, 0, NULL), -EINVAL);
	free(s);
}

/* Sizes far above the latency terms, with noise: unconstrained least squares
 * drives some fixed terms below zero; the fit holds them at zero instead, and
 * every constant it returns is one R2CC_COST_MODEL and r2cc-plan accept. */
Test(cost_fit, constants_never_negative)
{
	static const struct r2cc_cost_model flat = {0, 1.0 / 9000.0, 1.1 / 9000.0, 0, 0};
	struct r2cc_cost_sample s[64];
	struct r2cc_cost_model m = r2cc_cost_default;
	double rms;
	char spec[256], err[128];
	int n = 0;

	srand(3);
	for (int nodes = 2; nodes <= 4; nodes += 2)
		for (double bytes = 256e6; bytes <= 4.3e9; bytes *= 2)
			for (int st = R2CC_STRAT_BALANCE; st <= R2CC_STRAT_AR2; st++) {
				struct r2cc_cost_case c = {nodes, 3, 1, bytes, 4, 1, 0};
				double e = 0.03 * (2.0 * rand() / RAND_MAX - 1);
				s[n++] = (struct r2cc_cost_sample){
				    st,
				    nodes,
				    3,
				    1,
				    4,
				    bytes,
				    r2cc_cost_time(&flat, st, &c) * (1 + e)};
			}
	cr_assert_eq(r2cc_cost_fit(&m, s, n, &rms), 0);
	cr_expect_geq(m.alpha_us, 0);
	cr_expect_geq(m.ar2_stage_us, 0);
	cr_expect_geq(m.ar2_chunk_us, 0);
	expect_close(m.beta_us_per_byte, flat.beta_us_per_byte, 0.03, "beta");
	expect_close(m.ar2_beta_us_per_byte, flat.ar2_beta_us_per_byte, 0.03, "ar2 beta");
	cr_expect_lt(rms, 0.03);
	r2cc_cost_model_format(&m, spec, sizeof(spec));
	cr_expect_eq(r2cc_cost_model_parse(spec, &m, err, sizeof(err)), 0, "%s: %s", spec, err);
}

Test(cost_fit, csv)
{
	struct r2cc_cost_sample s;
	char err[128];

	cr_assert_eq(
	    r2cc_cost_parse_csv_line("strategy,n,k,f,bytes,time_us\n", &s, err, sizeof(err)), 0);
	cr_assert_eq(r2cc_cost_parse_csv_line("# comment\n", &s, err, sizeof(err)), 0);
	cr_assert_eq(r2cc_cost_parse_csv_line("\n", &s, err, sizeof(err)), 0);
	cr_assert_eq(
	    r2cc_cost_parse_csv_line("balance,3,3,1,268435456,1234.5\n", &s, err, sizeof(err)), 1);
	cr_assert_eq(s.strategy, R2CC_STRAT_BALANCE);
	cr_assert_eq(s.nodes, 3);
	cr_assert_eq(s.failed, 1);
	cr_assert_float_eq(s.bytes, 268435456.0, 0);
	cr_assert_float_eq(s.time_us, 1234.5, 0);
	cr_assert_eq(r2cc_cost_parse_csv_line("3, 4, 3, 1, 1e9, 99, 8\r\n", &s, err, sizeof(err)),
		     1);
	cr_assert_eq(s.strategy, R2CC_STRAT_AR2);
	cr_assert_eq(s.chunks, 8);
	cr_assert_eq(r2cc_cost_parse_csv_line("fast,3,3,1,1,1", &s, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "unknown strategy"), "%s", err);
	cr_assert_eq(r2cc_cost_parse_csv_line("ar2,3,3,1,1", &s, err, sizeof(err)), -EINVAL);
	cr_assert_eq(r2cc_cost_parse_csv_line("ar2,3,3,3,1,1", &s, err, sizeof(err)), -EINVAL);
	cr_assert_eq(r2cc_cost_parse_csv_line("ar2,3,3,1,1,0", &s, err, sizeof(err)), -EINVAL);
	cr_assert_eq(r2cc_cost_parse_csv_line("ar2,3.5,3,1,1,1", &s, err, sizeof(err)), -EINVAL);
	cr_assert_eq(r2cc_cost_parse_csv_line("ar2,3,3,1,1,1,4,9", &s, err, sizeof(err)), -EINVAL);
	cr_assert_eq(r2cc_cost_parse_csv_line("ar2,3,3,1,x,1", &s, err, sizeof(err)), -EINVAL);
}

Test(cost, model_string_round_trip)
{
	struct r2cc_cost_model m = r2cc_cost_default, back = {0};
	char buf[256], err[256];

	r2cc_cost_model_format(&truth, buf, sizeof(buf));
	cr_assert_eq(r2cc_cost_model_parse(buf, &back, err, sizeof(err)), 0, "%s", err);
	expect_close(back.alpha_us, truth.alpha_us, 1e-5, "alpha");
	expect_close(back.ar2_chunk_us, truth.ar2_chunk_us, 1e-5, "chunk");
	cr_assert_eq(r2cc_cost_model_parse("alpha_us=5", &m, err, sizeof(err)), 0);
	cr_assert_float_eq(m.alpha_us, 5.0, 0);
	cr_assert_float_eq(m.ar2_stage_us, r2cc_cost_default.ar2_stage_us, 0);
	cr_assert_eq(r2cc_cost_model_parse("alpha=5", &m, err, sizeof(err)), -EINVAL);
	cr_assert_eq(r2cc_cost_model_parse("alpha_us=-1", &m, err, sizeof(err)), -EINVAL);
	cr_assert_eq(r2cc_cost_model_parse("alpha_us=1x", &m, err, sizeof(err)), -EINVAL);
	cr_assert_float_eq(m.alpha_us, 5.0, 0); /* unchanged on error */
}

/* The latency-only fit: the per-byte terms stay the link rate's. */
Test(cost_fit, latency_only)
{
	struct r2cc_cost_sample *s = malloc(sizeof(*s) * 4000);
	struct r2cc_cost_model phys = {12.0, 0, 0, 30.0, 7.0}, m = r2cc_cost_default;
	int n = 0;
	double rms;

	for (int nodes = 2; nodes <= 8; nodes *= 2)
		for (double bytes = 1024; bytes <= 4e9; bytes *= 8)
			for (int st = 0; st < R2CC_STRAT_COUNT; st++)
				for (int k = 2; k <= 8; k *= 2) {
					struct r2cc_cost_case c = {nodes, 4, 1, bytes, k, 1, 50};
					s[n++] = (struct r2cc_cost_sample){
					    st,
					    nodes,
					    4,
					    1,
					    k,
					    bytes,
					    r2cc_cost_time(&phys, st, &c)};
				}
	cr_assert_eq(r2cc_cost_fit_latency(&m, s, n, 50, &rms), 0);
	cr_assert_lt(rms, 1e-6);
	cr_assert(m.beta_us_per_byte == 0 && m.ar2_beta_us_per_byte == 0);
	expect_close(m.alpha_us, 12.0, 1e-4, "alpha");
	expect_close(m.ar2_stage_us, 30.0, 1e-3, "stage");
	expect_close(m.ar2_chunk_us, 7.0, 1e-3, "chunk");
	cr_assert_eq(r2cc_cost_fit_latency(&m, s, n, 0, NULL), -EINVAL);
	free(s);
}
