/*
 * The cost model of AllReduce on a cluster with degraded servers, and the
 * per-call choice of `R2CC_MODE=auto`.
 *
 * n servers, k NICs per server, f of them failed on the most degraded server,
 * X = f / k, m degraded servers, message of S bytes. The healthy ring moves
 * L = 2(n-1)/n * S / k bytes through each NIC; a strategy's time is an
 * alpha-beta sum
 *
 *   healthy (T0)     alpha + beta * L
 *   mode 1 backup    alpha + beta * L * (1 + ceil(f / (k - f)))
 *                    (each failed NIC's share moves whole to one backup NIC,
 *                    spread round-robin: the most loaded NIC carries that many
 *                    shares; f = 1 gives 2)
 *   mode 2 Balance   alpha + beta * L * 1 / (1 - X)
 *   mode 3 R2CC-AR   alpha + s * ar2_stage + K * ar2_chunk + ar2_beta * L * F
 *                    one degraded server (s = 2):
 *                      F = 1 + n X / (2 (n-1) (1-X))
 *                    m >= 2 (s = 3; allreduce2.h): the most loaded server, of
 *                      the degraded ones, 1 + n X / (2 (n-1) (1-X)) as above,
 *                      and of the helpers (c = ceil(m / (n-m)) degraded servers
 *                      each), (1-X) + X n / (2(n-1)) * (2(h-1)/h + c), h = n-m
 *
 * so that for large S, T/T0 tends to the closed forms of docs/architecture.md (Cost model)
 * (equal for Balance and R2CC-AllReduce at n = 2; 1.5 vs 1.375 at n = 3,
 * X = 1/3), while the fixed terms make Balance win for small messages.
 *
 * The per-byte terms are physical: beta = ar2_beta = 8 / (1000 * rate) us per
 * byte for NICs of `rate` Gb/s (struct r2cc_cost_case's gbps, from the NICs
 * themselves), the same for both strategies, whose bytes cross the same wires.
 * A model whose beta_us_per_byte / ar2_beta_us_per_byte is 0 (the built-in
 * one) uses that; a nonzero one (R2CC_COST_MODEL, a fit) replaces it. The
 * fixed terms (alpha, ar2_stage, ar2_chunk) are latencies, fitted by
 * r2cc_cost_fit() (and the tool build/bin/r2cc-fit-cost) by least squares on
 * relative error from measurements in CSV rows
 * "strategy,n,k,f,bytes,time_us[,chunks]" (strategy: healthy|backup|balance|ar2,
 * or the mode numbers 0..3; chunks = K of the ar2 rows, default 4).
 */
#ifndef R2CC_STRATEGIES_COST_H
#define R2CC_STRATEGIES_COST_H

#include "shim/cost_params.h"

#include <stddef.h>

/* Values 1..3 are the R2CC_MODE numbers. */
enum r2cc_strategy {
	R2CC_STRAT_HEALTHY = 0, /* the healthy ring: the reference T0 */
	R2CC_STRAT_BACKUP = 1,
	R2CC_STRAT_BALANCE = 2,
	R2CC_STRAT_AR2 = 3,
	R2CC_STRAT_COUNT
};
const char *r2cc_strategy_name(enum r2cc_strategy s);

struct r2cc_cost_case {
	int nodes, nics, failed; /* n, k, f (of the most degraded server) */
	double bytes;		 /* S */
	int chunks;		 /* K of R2CC-AllReduce, <= 0: 4 */
	int degraded;		 /* m, degraded servers; <= 0: 1 when f > 0 */
	double gbps;		 /* NIC link rate, for a model without beta; <= 0: 100 */
};
#define R2CC_COST_DEFAULT_GBPS 100.0

/* Bytes through each NIC of the healthy ring (0 for one node); K or its default. */
double r2cc_cost_nic_load(const struct r2cc_cost_case *c);
int r2cc_cost_chunks(const struct r2cc_cost_case *c);

/* Bandwidth factors relative to the healthy ring; a huge value (HUGE_VAL)
 * when nothing can run (f >= k). Balance and backup are 1 for f = 0. */
double r2cc_cost_factor_backup(int nics, int failed);
double r2cc_cost_factor_balance(int nics, int failed);
/* n < 2: no inter-node traffic to save, same as Balance. */
double r2cc_cost_factor_ar2(int nodes, int nics, int failed);
/* m degraded servers (m <= 1: the above); HUGE_VAL when none is healthy. */
double r2cc_cost_factor_ar2_multi(int nodes, int nics, int failed, int degraded);
/* The per-byte costs the model uses for c: its own, or the link rate's. */
double r2cc_cost_beta(const struct r2cc_cost_model *m, const struct r2cc_cost_case *c);
double r2cc_cost_ar2_beta(const struct r2cc_cost_model *m, const struct r2cc_cost_case *c);

/* Predicted time in microseconds; HUGE_VAL when the strategy cannot run. */
double r2cc_cost_time(const struct r2cc_cost_model *m, enum r2cc_strategy s,
		      const struct r2cc_cost_case *c);
/* time(s) / time(healthy) */
double r2cc_cost_relative(const struct r2cc_cost_model *m, enum r2cc_strategy s,
			  const struct r2cc_cost_case *c);

/*
 * The choice of R2CC_MODE=auto for one AllReduce: Balance or R2CC-AllReduce
 * (mode 1 never beats Balance in this model), with a one-line reason in
 * reason (may be NULL) for an INFO log line. R2CC-AllReduce only when it is
 * predicted strictly faster, so ties (n = 2) stay on Balance. Other
 * collectives always run Balance.
 */
enum r2cc_strategy r2cc_cost_choose(const struct r2cc_cost_model *m, const struct r2cc_cost_case *c,
				    char *reason, size_t len);

/* Smallest message (bytes) for which R2CC-AllReduce wins in case c (its bytes
 * ignored); HUGE_VAL if never. */
double r2cc_cost_crossover(const struct r2cc_cost_model *m, const struct r2cc_cost_case *c);
/* The same with one degraded server and no link rate (the model's own beta). */
double r2cc_cost_crossover_bytes(const struct r2cc_cost_model *m, int nodes, int nics, int failed,
				 int chunks);

/* ---- fitting (strategies/cost_fit.c: tools and tests, not the library) ---- */

struct r2cc_cost_sample {
	enum r2cc_strategy strategy;
	int nodes, nics, failed, chunks; /* chunks <= 0: the default K */
	double bytes, time_us;
};

/*
 * Least-squares fit of the model to samples, minimising the squared relative
 * error. Parameters the samples cannot determine (no R2CC-AllReduce rows, one
 * K only, ...) stay at (or, for a combination, as close as possible to) their
 * values in *m on entry; *m is updated. *rms_rel_p (may be NULL) gets the RMS
 * relative error of the fit. Returns 0, or -EINVAL (no usable sample, a
 * singular system).
 */
int r2cc_cost_fit(struct r2cc_cost_model *m, const struct r2cc_cost_sample *s, int n,
		  double *rms_rel_p);

/* The same for the fixed terms only (alpha, ar2_stage, ar2_chunk), the per-byte
 * ones being the link rate's (gbps > 0): *m gets beta_us_per_byte =
 * ar2_beta_us_per_byte = 0, the physical default. */
int r2cc_cost_fit_latency(struct r2cc_cost_model *m, const struct r2cc_cost_sample *s, int n,
			  double gbps, double *rms_rel_p);

/* Parse one CSV line into *s: 1 = a sample, 0 = blank, comment (#) or the
 * header, -EINVAL = malformed (a message in err). */
int r2cc_cost_parse_csv_line(const char *line, struct r2cc_cost_sample *s, char *err,
			     size_t errlen);

#endif
