/*
 * The cost model's constants: the built-in model and their text form (see
 * cost_params.h). No allocation, no logging, no libm calls.
 */
#include "shim/cost_params.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * The physical default (strategies/cost.h): the per-byte terms are 0, that is
 * the NICs' link rate, which the library reads from the NICs, and the same for
 * Balance and R2CC-AllReduce (the same bytes on the same wires). Only the fixed
 * terms are fitted: r2cc-fit-cost --rate 25 on strategies/fit/fit.csv (88
 * verified AllReduces on the software fabric: 2 and 4 nodes, 3 NICs each at
 * 25 Gb/s, one declared failed, Balance and R2CC-AllReduce, 8 B-4 GiB; ranks
 * sharing one GPU under MPS, so these latencies hold what sharing the GPU cost
 * too; strategies/fit/fit.txt). R2CC_COST_MODEL installs a fit of one's own
 * cluster, per-byte terms included if one wishes.
 */
const struct r2cc_cost_model r2cc_cost_default = {
    .alpha_us = 46.8029,
    .beta_us_per_byte = 0,
    .ar2_beta_us_per_byte = 0,
    .ar2_stage_us = 291.962,
    .ar2_chunk_us = 155.981,
};

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
