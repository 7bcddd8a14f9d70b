/*
 * The cost model's constants (strategies/cost.h has the model): their struct,
 * the built-in fit, and the text form R2CC_COST_MODEL, r2cc-plan and
 * r2cc-fit-cost read and write. Here, below the settings (params.c) that parse
 * them, so that the settings need nothing of strategies/.
 */
#ifndef R2CC_SHIM_COST_PARAMS_H
#define R2CC_SHIM_COST_PARAMS_H

#include <stddef.h>

struct r2cc_cost_model {
	double alpha_us; /* fixed cost of one collective call */
	/* per byte of NIC load: 1 / effective NIC bandwidth; 0: the link rate's */
	double beta_us_per_byte;
	double ar2_beta_us_per_byte; /* the same for R2CC-AllReduce's; 0: beta's */
	double ar2_stage_us;	     /* fixed cost of each of its two extra stages */
	double ar2_chunk_us;	     /* fixed cost per stage-2 chunk (Reduce + Broadcast) */
};
#define R2CC_COST_NPARAMS 5

extern const struct r2cc_cost_model r2cc_cost_default;

/* "alpha_us=20,beta_us_per_byte=9e-5,..." (any subset, any order) over *m;
 * 0 or -EINVAL with a message. r2cc_cost_model_format writes all five. */
int r2cc_cost_model_parse(const char *str, struct r2cc_cost_model *m, char *err, size_t errlen);
void r2cc_cost_model_format(const struct r2cc_cost_model *m, char *buf, size_t len);

#endif
