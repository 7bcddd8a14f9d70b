/*
 * libFuzzer target: every setting's parser (the R2CC_* table of shim/params.c)
 * and the declared-failure specs of shim/failspec.c, parsed and resolved
 * against a small directory, and R2CC_DRILL's plans (shim/drillspec.c). Input:
 * one byte picks the variable (past the table: R2CC_FAILED_NODE /
 * R2CC_FAILED_HCA, then R2CC_DRILL's parser), the rest is its value; for the
 * failure specs, a NUL splits node from HCA. A refusal must come with a
 * message naming the variable; an accepted plan must print back as a plan
 * that parses to the same steps.
 */
#include "shim/drillspec.h"
#include "shim/failspec.h"
#include "shim/params.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int nparams(void)
{
	int n = 0;
	while (r2cc_param_name(n))
		n++;
	return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size > 600)
		return 0;
	char v[601];
	memcpy(v, data + 1, size - 1);
	v[size - 1] = 0;
	int n = nparams();
	int which = data[0] % (n + 2);
	char err[512];
	if (which < n) {
		struct r2cc_params p;
		r2cc_params_defaults(&p);
		const char *name = r2cc_param_name(which);
		err[0] = 0;
		if (r2cc_param_set(&p, name, v, err, sizeof(err)) != 0 && !strstr(err, name))
			abort();
		return 0;
	}
	if (which == n + 1) {
		static struct r2cc_drill_plan plan, again;
		err[0] = 0;
		if (r2cc_drill_parse(v, &plan, err, sizeof(err)) != 0) {
			if (!strstr(err, "R2CC_DRILL"))
				abort();
			return 0;
		}
		static char back[R2CC_DRILL_MAX_STEPS * (2 * R2CC_DRILL_NAME_MAX + 48)];
		size_t used = 0;
		back[0] = 0; /* an empty plan prints as "", not as the last input's plan */
		for (int i = 0; i < plan.nsteps; i++) {
			char one[2 * R2CC_DRILL_NAME_MAX + 48];
			r2cc_drill_step_str(&plan.steps[i], one, sizeof(one));
			used += (size_t)snprintf(back + used, sizeof(back) - used, "%s%s",
						 i ? ";" : "", one);
		}
		if (r2cc_drill_parse(back, &again, err, sizeof(err)) != 0 ||
		    again.nsteps != plan.nsteps)
			abort();
		for (int i = 0; i < plan.nsteps; i++) {
			const struct r2cc_drill_step *a = &plan.steps[i], *b = &again.steps[i];
			if (a->node != b->node || strcmp(a->host, b->host) ||
			    strcmp(a->nic, b->nic) || a->kind != b->kind ||
			    a->arg_ms != b->arg_ms || a->at_ms != b->at_ms ||
			    a->from_init != b->from_init)
				abort();
		}
		return 0;
	}
	const char *hca = v + strlen(v) + 1;
	if (hca > v + size - 1)
		hca = "";
	struct r2cc_failspec spec;
	err[0] = 0;
	if (r2cc_failspec_parse(v, hca, &spec, err, sizeof(err)) != 0) {
		if (!strstr(err, "R2CC_FAILED_"))
			abort();
		return 0;
	}
	static const char *const nics[] = {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"};
	const struct r2cc_failspec_node nodes[3] = {
	    {"node-a.cluster", 4, nics}, {"node-b", 3, nics}, {"node-c.cluster", 2, nics}};
	uint64_t mask[3];
	r2cc_failspec_resolve(&spec, nodes, 3, mask, err, sizeof(err));
	return 0;
}
