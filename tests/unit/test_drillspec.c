/*
 * R2CC_DRILL's parser (shim/drillspec.h): every kind and time form, node by index
 * and by host name, and each refusal naming the variable and the step.
 */
#include "shim/drillspec.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

static struct r2cc_drill_plan plan;
static char err[512];

static int parse(const char *v)
{
	return r2cc_drill_parse(v, &plan, err, sizeof(err));
}

Test(drillspec, empty_is_no_drill)
{
	cr_assert_eq(parse(NULL), 0);
	cr_assert_eq(plan.nsteps, 0);
	cr_assert_eq(parse("   "), 0);
	cr_assert_eq(plan.nsteps, 0);
}

Test(drillspec, two_steps)
{
	cr_assert_eq(parse("node1/mlx5_2=blackhole@5s; node1/mlx5_2=up@15000"), 0, "%s", err);
	cr_assert_eq(plan.nsteps, 2);
	const struct r2cc_drill_step *a = &plan.steps[0], *b = &plan.steps[1];
	cr_assert_eq(a->node, 1);
	cr_assert_str_eq(a->nic, "mlx5_2");
	cr_assert_eq(a->kind, R2CC_DRILL_BLACKHOLE);
	cr_assert_eq(a->at_ms, 5000);
	cr_assert_eq(a->from_init, 0);
	cr_assert_eq(a->index, 1);
	cr_assert_eq(b->kind, R2CC_DRILL_UP);
	cr_assert_eq(b->at_ms, 15000);
	cr_assert_eq(b->index, 2);
}

Test(drillspec, every_kind)
{
	static const char *const k[] = {"up",		"down",	   "blackhole", "blackhole-tx",
					"blackhole-rx", "ackloss", "flap:250"};
	for (int i = 0; i < 7; i++) {
		char v[128];
		snprintf(v, sizeof(v), "0/mlx5_0=%s@0", k[i]);
		cr_assert_eq(parse(v), 0, "%s: %s", v, err);
		cr_assert_eq(plan.steps[0].kind, i, "%s", v);
	}
	cr_assert_eq(plan.steps[0].arg_ms, 250);
}

Test(drillspec, times_and_origin)
{
	cr_assert_eq(parse("0/a=down@1.5s"), 0, "%s", err);
	cr_assert_eq(plan.steps[0].at_ms, 1500);
	cr_assert_eq(parse("0/a=down@0.004s"), 0, "%s", err);
	cr_assert_eq(plan.steps[0].at_ms, 4);
	cr_assert_eq(parse("0/a=down@250ms:init"), 0, "%s", err);
	cr_assert_eq(plan.steps[0].at_ms, 250);
	cr_assert_eq(plan.steps[0].from_init, 1);
	cr_assert_eq(parse("0/a=down@86400s"), 0, "%s", err);
	cr_assert_neq(parse("0/a=down@86400001"), 0);
	cr_assert_neq(parse("0/a=down@1.5"), 0);
	cr_assert_neq(parse("0/a=down@1.2345s"), 0);
	cr_assert_neq(parse("0/a=down@5m"), 0);
	cr_assert_neq(parse("0/a=down@-5"), 0);
	cr_assert_neq(parse("0/a=down@5s:boot"), 0);
	cr_assert(strstr(err, "R2CC_DRILL") && strstr(err, ":init"), "%s", err);
}

Test(drillspec, node_by_host)
{
	cr_assert_eq(parse("gpu-node-3.cluster/mlx5_0=down@1s"), 0, "%s", err);
	cr_assert_eq(plan.steps[0].node, -1);
	cr_assert_str_eq(plan.steps[0].host, "gpu-node-3.cluster");
	cr_assert_eq(parse("node12/mlx5_0=down@1s"), 0, "%s", err);
	cr_assert_eq(plan.steps[0].node, 12);
	cr_assert_neq(parse("65536/mlx5_0=down@1s"), 0);
}

Test(drillspec, refusals_name_the_variable_and_step)
{
	static const char *const bad[] = {
	    "0/mlx5_0=down",	"0/mlx5_0@1s",	      "mlx5_0=down@1s",	      "0/mlx5_0=fatal@1s",
	    "0/mlx5_0=flap@1s", "0/mlx5_0=flap:0@1s", "0/mlx5_0=down:3@1s",   "0/mlx5 0=down@1s",
	    "0/=down@1s",	"0/mlx5_0=down@1s;;", "0/mlx5_0=down@1s;0/x", "0/$x=down@1s",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = 0;
		cr_assert_eq(parse(bad[i]), -EINVAL, "%s accepted", bad[i]);
		cr_assert(strstr(err, "R2CC_DRILL") && strstr(err, "step"), "%s: %s", bad[i], err);
		cr_assert_eq(plan.nsteps, 0);
	}
}

Test(drillspec, too_many_steps)
{
	char v[4096] = "";
	for (int i = 0; i <= R2CC_DRILL_MAX_STEPS; i++)
		strcat(v, "0/a=down@1;");
	v[strlen(v) - 1] = 0;
	cr_assert_eq(parse(v), -EINVAL);
	cr_assert(strstr(err, "more than"), "%s", err);
}

Test(drillspec, prints_back)
{
	cr_assert_eq(parse("h1/mlx5_1=flap:200@1.5s:init"), 0, "%s", err);
	char s[256];
	r2cc_drill_step_str(&plan.steps[0], s, sizeof(s));
	cr_assert_str_eq(s, "h1/mlx5_1=flap:200@1500ms:init");
}
