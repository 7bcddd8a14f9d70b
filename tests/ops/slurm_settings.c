/*
 * Unit tests of --r2cc's settings (ops/slurm/settings.c): splitting, precedence, the
 * library's judgement with the source named, and LD_PRELOAD's new value. No Slurm.
 */
#include "ops/slurm/settings.h"
#include "shim/params.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

static int idx(const char *name)
{
	return r2cc_spank_param_index(name, strlen(name));
}

static const char *val(const struct r2cc_spank_settings *s, const char *name)
{
	int i = idx(name);
	cr_assert(i >= 0, "%s is in the table", name);
	return s->value[i];
}

Test(spank_settings, names_with_or_without_prefix_in_any_case)
{
	int mode = idx("R2CC_MODE");

	cr_assert(mode >= 0);
	cr_assert_eq(idx("mode"), mode);
	cr_assert_eq(idx("MODE"), mode);
	cr_assert_eq(idx("r2cc_mode"), mode);
	cr_assert_str_eq(r2cc_param_name(idx("failed_hca")), "R2CC_FAILED_HCA");
	cr_assert_eq(idx("R2CC_"), -1);
	cr_assert_eq(idx("modes"), -1);
	cr_assert_eq(idx(""), -1);
}

Test(spank_settings, values_keep_their_commas_and_equals)
{
	struct r2cc_spank_settings s = {0};
	char err[512] = "";

	cr_assert_eq(r2cc_spank_settings_parse(&s,
					       "mode=2,failed_hca=mlx5_1,mlx5_2,failed_node=1,"
					       "cost_model=\"alpha_us=3,beta_us_per_byte=0.5\","
					       "drill=node1/mlx5_1=blackhole@0;node1/mlx5_1=up@5s,"
					       "R2CC_REPORT=/tmp/r.%h.%p",
					       R2CC_SPANK_OPTION, err, sizeof(err)),
		     0, "%s", err);
	cr_assert_str_eq(val(&s, "mode"), "2");
	cr_assert_str_eq(val(&s, "failed_hca"), "mlx5_1,mlx5_2");
	cr_assert_str_eq(val(&s, "failed_node"), "1");
	cr_assert_str_eq(val(&s, "cost_model"), "alpha_us=3,beta_us_per_byte=0.5");
	cr_assert_str_eq(val(&s, "drill"), "node1/mlx5_1=blackhole@0;node1/mlx5_1=up@5s");
	cr_assert_str_eq(val(&s, "report"), "/tmp/r.%h.%p");
	cr_assert_eq(s.src[idx("mode")], R2CC_SPANK_OPTION);
	cr_assert_eq(s.src[idx("stall_ms")], R2CC_SPANK_UNSET);
	cr_assert_eq(r2cc_spank_settings_check(&s, err, sizeof(err)), 0, "%s", err);
	r2cc_spank_settings_free(&s);
}

Test(spank_settings, empty_is_no_setting)
{
	struct r2cc_spank_settings s = {0};
	char err[512] = "";

	cr_assert_eq(r2cc_spank_settings_parse(&s, "", R2CC_SPANK_OPTION, err, sizeof(err)), 0);
	cr_assert_eq(r2cc_spank_settings_parse(&s, NULL, R2CC_SPANK_OPTION, err, sizeof(err)), 0);
	for (int i = 0; i < R2CC_SPANK_MAX_PARAMS; i++)
		cr_assert_eq(s.src[i], R2CC_SPANK_UNSET);
	cr_assert_eq(r2cc_spank_settings_check(&s, err, sizeof(err)), 0);
}

Test(spank_settings, malformed_lists_are_one_error_naming_the_item)
{
	struct r2cc_spank_settings s = {0};
	char err[512];

	cr_assert_eq(r2cc_spank_settings_parse(&s, "mode=2,colour=blue", R2CC_SPANK_OPTION, err,
					       sizeof(err)),
		     -EINVAL);
	cr_assert(strstr(err, "'colour' is not an R2CC setting"), "%s", err);
	cr_assert_eq(r2cc_spank_settings_parse(&s, "mode", R2CC_SPANK_OPTION, err, sizeof(err)),
		     -EINVAL);
	cr_assert(strstr(err, "'mode' is not NAME=VALUE"), "%s", err);
	cr_assert_eq(r2cc_spank_settings_parse(&s, ",mode=2", R2CC_SPANK_OPTION, err, sizeof(err)),
		     -EINVAL);
	/* a NAME=VALUE list as a value needs its quotes */
	cr_assert_eq(r2cc_spank_settings_parse(&s, "cost_model=alpha_us=3,beta_us_per_byte=1",
					       R2CC_SPANK_OPTION, err, sizeof(err)),
		     -EINVAL);
	cr_assert(strstr(err, "'beta_us_per_byte' is not an R2CC setting"), "%s", err);
	cr_assert_eq(r2cc_spank_settings_parse(&s, "cost_model=\"alpha_us=3,mode=2",
					       R2CC_SPANK_OPTION, err, sizeof(err)),
		     -EINVAL);
	cr_assert(strstr(err, "R2CC_COST_MODEL"), "%s", err);
	cr_assert_eq(
	    r2cc_spank_settings_parse(&s, "report=\"/a\"b", R2CC_SPANK_OPTION, err, sizeof(err)),
	    -EINVAL);
	r2cc_spank_settings_free(&s);
}

Test(spank_settings, precedence_option_over_environment_over_defaults)
{
	struct r2cc_spank_settings s = {0};
	char err[512];
	int mode = idx("mode"), report = idx("report"), stall = idx("stall_ms");

	cr_assert_eq(r2cc_spank_settings_parse(&s, "mode=1,report=/d,stall_ms=50",
					       R2CC_SPANK_DEFAULT, err, sizeof(err)),
		     0);
	cr_assert_eq(r2cc_spank_settings_put(&s, mode, "3", R2CC_SPANK_ENV), 0);
	cr_assert_eq(r2cc_spank_settings_put(&s, report, "/e", R2CC_SPANK_ENV), 0);
	cr_assert_eq(r2cc_spank_settings_parse(&s, "mode=2", R2CC_SPANK_OPTION, err, sizeof(err)),
		     0);
	/* a default read late never replaces what the job or the option said */
	cr_assert_eq(r2cc_spank_settings_put(&s, mode, "0", R2CC_SPANK_DEFAULT), 0);
	cr_assert_str_eq(s.value[mode], "2");
	cr_assert_eq(s.src[mode], R2CC_SPANK_OPTION);
	cr_assert_str_eq(s.value[report], "/e");
	cr_assert_eq(s.src[report], R2CC_SPANK_ENV);
	cr_assert_str_eq(s.value[stall], "50");
	cr_assert_eq(s.src[stall], R2CC_SPANK_DEFAULT);
	r2cc_spank_settings_free(&s);
}

Test(spank_settings, the_library_judges_and_the_source_is_named)
{
	struct r2cc_spank_settings s = {0};
	char err[512];

	cr_assert_eq(r2cc_spank_settings_parse(&s, "mode=7", R2CC_SPANK_OPTION, err, sizeof(err)),
		     0);
	cr_assert_eq(r2cc_spank_settings_check(&s, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "R2CC_MODE='7' is not valid"), "%s", err);
	cr_assert(strstr(err, "(R2CC_MODE from --r2cc)"), "%s", err);
	r2cc_spank_settings_free(&s);

	cr_assert_eq(r2cc_spank_settings_parse(&s, "drill=node1/mlx5_1=melt@0", R2CC_SPANK_DEFAULT,
					       err, sizeof(err)),
		     0);
	cr_assert_eq(r2cc_spank_settings_check(&s, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "R2CC_DRILL"), "%s", err);
	cr_assert(strstr(err, "from plugstack.conf's defaults="), "%s", err);
	r2cc_spank_settings_free(&s);

	/* NICs without a node: the declared failure is judged as a whole */
	cr_assert_eq(r2cc_spank_settings_put(&s, idx("failed_hca"), "mlx5_1", R2CC_SPANK_ENV), 0);
	cr_assert_eq(r2cc_spank_settings_check(&s, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "R2CC_FAILED_HCA from the job's environment"), "%s", err);
	r2cc_spank_settings_free(&s);
}

Test(spank_settings, preload_goes_first_once)
{
	char out[64];
	const char *lib = "/opt/r2cc/libr2cc.so";

	cr_assert_eq(r2cc_spank_preload(NULL, lib, out, sizeof(out)), 0);
	cr_assert_str_eq(out, lib);
	cr_assert_eq(r2cc_spank_preload("", lib, out, sizeof(out)), 0);
	cr_assert_str_eq(out, lib);
	cr_assert_eq(r2cc_spank_preload("/a.so", lib, out, sizeof(out)), 0);
	cr_assert_str_eq(out, "/opt/r2cc/libr2cc.so:/a.so");
	cr_assert_eq(r2cc_spank_preload("/a.so:/opt/r2cc/libr2cc.so", lib, out, sizeof(out)), 0);
	cr_assert_str_eq(out, "/a.so:/opt/r2cc/libr2cc.so");
	cr_assert_eq(r2cc_spank_preload("/a.so /opt/r2cc/libr2cc.so", lib, out, sizeof(out)), 0);
	cr_assert_str_eq(out, "/a.so /opt/r2cc/libr2cc.so");
	cr_assert_eq(r2cc_spank_preload("/opt/r2cc/libr2cc.so.1", lib, out, sizeof(out)), 0);
	cr_assert_str_eq(out, "/opt/r2cc/libr2cc.so:/opt/r2cc/libr2cc.so.1");
	cr_assert_eq(r2cc_spank_preload("/a-long-name-that-does-not-fit-beside-it.so", lib, out,
					sizeof(out)),
		     -ENOSPC);
}
