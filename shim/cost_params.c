/*
 * The cost model's constants: the built-in fit and their text form (see
 * cost_params.h). No allocation, no logging, no libm calls.
 */
#include "shim/cost_params.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
