/* Settings: every variable's good values, and every kind of bad one gives
 * an error that names the variable and what it accepts. */
#include "shim/params.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct r2cc_params p;
static char err[512];

static void setup(void)
{
	r2cc_params_defaults(&p);
	err[0] = '\0';
}

TestSuite(params, .init = setup);

static int set(const char *name, const char *value)
{
	return r2cc_param_set(&p, name, value, err, sizeof(err));
}

static void expect_bad(const char *name, const char *value, const char *accepts_fragment)
{
	cr_expect_eq(set(name, value), -EINVAL, "%s=%s accepted", name, value);
	cr_expect(strstr(err, name) != NULL, "error does not name %s: %s", name, err);
	cr_expect(strstr(err, accepts_fragment) != NULL, "error for %s=%s lacks '%s': %s", name,
		  value, accepts_fragment, err);
}

Test(params, defaults)
{
	cr_expect_eq(p.mode, R2CC_MODE_BALANCE);
	cr_expect_eq(p.ar_stage2_chunks, 4);
	cr_expect_eq(p.ar_schedule, 0);
	cr_expect_eq(p.ar_min_bytes, 16ull << 20);
	cr_expect_eq(p.stall_ms, 0);
	cr_expect_eq(p.debug, 1);
	cr_expect_eq(p.ar_after_repair, 0);
	cr_expect_str_empty(p.failed_node);
	cr_expect(p.valid);
}

/* auto by default: on with hot repair (any mode but 0), off in mode 0. */
Test(params, mr_mirror)
{
	cr_expect(p.mr_mirror);
	cr_expect_eq(set("R2CC_MR_MIRROR", "0"), 0);
	cr_expect_not(p.mr_mirror);
	cr_expect_eq(set("R2CC_MR_MIRROR", "1"), 0);
	cr_expect(p.mr_mirror);
	cr_expect_eq(set("R2CC_MODE", "0"), 0);
	cr_expect_eq(set("R2CC_MR_MIRROR", "auto"), 0);
	cr_expect_not(p.mr_mirror);
	cr_expect_eq(set("R2CC_MODE", "2"), 0);
	cr_expect_eq(set("R2CC_MR_MIRROR", "auto"), 0);
	cr_expect(p.mr_mirror);
	const char *bad[] = {"2", "-1", "", "yes", "on", " 1", "1 ", "Auto"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		expect_bad("R2CC_MR_MIRROR", bad[i], "auto, 0 or 1");
}

Test(params, mode)
{
	const char *good[] = {"0", "1", "2", "3"};
	for (int i = 0; i < 4; i++) {
		cr_expect_eq(set("R2CC_MODE", good[i]), 0);
		cr_expect_eq(p.mode, i);
	}
	cr_expect_eq(set("R2CC_MODE", "auto"), 0);
	cr_expect_eq(p.mode, R2CC_MODE_AUTO);
	cr_expect_eq(set("R2CC_MODE", "AUTO"), 0);
	const char *bad[] = {
	    "4", "-1", "", " 2", "2 ", "2x", "balance", "0x2", "99999999999999999999"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		expect_bad("R2CC_MODE", bad[i], "0, 1, 2, 3 or auto");
}

Test(params, sizes)
{
	struct {
		const char *v;
		unsigned long long want;
	} good[] = {{"0", 0},		{"1", 1},     {"16M", 16ull << 20}, {"16m", 16ull << 20},
		    {"4G", 4ull << 30}, {"2K", 2048}, {"1T", 1ull << 40},   {"8MiB", 8ull << 20},
		    {"8MB", 8ull << 20}};
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		cr_expect_eq(set("R2CC_AR_MIN_BYTES", good[i].v), 0, "%s", good[i].v);
		cr_expect_eq(p.ar_min_bytes, good[i].want, "%s", good[i].v);
	}
	const char *bad[] = {"", "-1", "M", "16X", "16MM", "1.5G", "99999999999T", " 1"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		expect_bad("R2CC_AR_MIN_BYTES", bad[i], "byte count");
}

Test(params, ranges)
{
	cr_expect_eq(set("R2CC_AR_STAGE2_CHUNKS", "1"), 0);
	cr_expect_eq(set("R2CC_AR_STAGE2_CHUNKS", "64"), 0);
	cr_expect_eq(p.ar_stage2_chunks, 64);
	expect_bad("R2CC_AR_STAGE2_CHUNKS", "0", "1 to 64");
	expect_bad("R2CC_AR_STAGE2_CHUNKS", "65", "1 to 64");
	for (int s = 0; s <= 3; s++) {
		char v[12];
		snprintf(v, sizeof(v), "%d", s);
		cr_expect_eq(set("R2CC_AR_SCHEDULE", v), 0);
		cr_expect_eq(p.ar_schedule, s);
	}
	expect_bad("R2CC_AR_SCHEDULE", "4", "0, 1, 2 or 3");
	cr_expect_eq(set("R2CC_AR_AFTER_REPAIR", "3"), 0);
	cr_expect_eq(p.ar_after_repair, 3);
	expect_bad("R2CC_AR_AFTER_REPAIR", "1", "2 (Balance) or 3");
	cr_expect_eq(set("R2CC_STALL_MS", "250"), 0);
	cr_expect_eq(p.stall_ms, 250);
	cr_expect_eq(set("R2CC_STALL_MS", "auto"), 0);
	cr_expect_eq(p.stall_ms, 0);
	expect_bad("R2CC_STALL_MS", "0", "auto or an integer");
	expect_bad("R2CC_STALL_MS", "fast", "auto or an integer");
	cr_expect_eq(p.failback_ms, 10000, "failback is on by default, after 10 s");
	cr_expect_eq(set("R2CC_FAILBACK_MS", "0"), 0);
	cr_expect_eq(p.failback_ms, 0);
	cr_expect_eq(set("R2CC_FAILBACK_MS", "2500"), 0);
	cr_expect_eq(p.failback_ms, 2500);
	expect_bad("R2CC_FAILBACK_MS", "-1", "an integer from 0 to 3600000");
	expect_bad("R2CC_FAILBACK_MS", "3600001", "an integer from 0 to 3600000");
	expect_bad("R2CC_FAILBACK_MS", "soon", "an integer from 0 to 3600000");
}

Test(params, debug)
{
	const char *names[] = {"NONE", "WARN", "INFO", "TRACE"};
	for (int i = 0; i < 4; i++) {
		cr_expect_eq(set("R2CC_DEBUG", names[i]), 0);
		cr_expect_eq(p.debug, i);
	}
	cr_expect_eq(set("R2CC_DEBUG", "info"), 0);
	expect_bad("R2CC_DEBUG", "VERBOSE", "NONE, WARN, INFO or TRACE");
	expect_bad("R2CC_DEBUG", "", "NONE, WARN, INFO or TRACE");
}

Test(params, strings)
{
	cr_expect_eq(set("R2CC_FAILED_NODE", "0"), 0);
	cr_expect_str_eq(p.failed_node, "0");
	cr_expect_eq(set("R2CC_FAILED_HCA", "mlx5_2"), 0);
	cr_expect_str_eq(p.failed_hca, "mlx5_2");
	char big[400];
	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	expect_bad("R2CC_FAILED_HCA", big, "HCA names");
	expect_bad("R2CC_FAILED_NODE", "node\x01", "node index");
	cr_expect_eq(set("R2CC_OOB_ROOT", "10.0.0.1:5000"), 0);
	cr_expect_eq(set("R2CC_OOB_ROOT", "[::1]:5000"), 0);
	expect_bad("R2CC_OOB_ROOT", "10.0.0.1", "host:port");
	expect_bad("R2CC_OOB_ROOT", "host:0", "host:port");
	expect_bad("R2CC_OOB_ROOT", ":5000", "host:port");
	expect_bad("R2CC_REPORT", "", "file path");
	cr_expect_eq(set("R2CC_REPORT", "/tmp/r2cc.txt"), 0);
}

/* The cost model: the built-in model by default; names given replace its values. */
Test(params, cost_model)
{
	cr_expect(!memcmp(&p.cost_model, &r2cc_cost_default, sizeof(p.cost_model)));
	cr_expect_eq(set("R2CC_COST_MODEL", "alpha_us=12.5,ar2_chunk_us=0"), 0);
	cr_expect_eq(p.cost_model.alpha_us, 12.5);
	cr_expect_eq(p.cost_model.ar2_chunk_us, 0);
	cr_expect_eq(p.cost_model.beta_us_per_byte, r2cc_cost_default.beta_us_per_byte);
	const char *bad[] = {"alpha_us=-1",	   "alpha=1",
			     "alpha_us",	   "alpha_us=1;beta_us_per_byte=2",
			     "beta_us_per_byte=x", "ar2_stage_us=1e999"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		expect_bad("R2CC_COST_MODEL", bad[i], "alpha_us, beta_us_per_byte");
	/* a refused value leaves the model as it was */
	cr_expect_eq(p.cost_model.alpha_us, 12.5);
}

Test(params, unknown_name)
{
	cr_expect_eq(set("R2CC_NOPE", "1"), -EINVAL);
	cr_expect(strstr(err, "R2CC_NOPE") != NULL);
}

Test(params, table_is_complete)
{
	const char *expected[] = {"R2CC_MODE",
				  "R2CC_FAILED_NODE",
				  "R2CC_FAILED_HCA",
				  "R2CC_AR_AFTER_REPAIR",
				  "R2CC_AR_STAGE2_CHUNKS",
				  "R2CC_AR_SCHEDULE",
				  "R2CC_AR_MIN_BYTES",
				  "R2CC_STALL_MS",
				  "R2CC_FAILBACK_MS",
				  "R2CC_DEBUG",
				  "R2CC_DEBUG_FILE",
				  "R2CC_REPORT",
				  "R2CC_OOB_ROOT",
				  "R2CC_STATS",
				  "R2CC_MR_MIRROR",
				  "R2CC_COST_MODEL"};
	for (size_t i = 0; i < sizeof(expected) / sizeof(expected[0]); i++) {
		int found = 0;
		for (int j = 0; r2cc_param_name(j); j++)
			if (!strcmp(r2cc_param_name(j), expected[i])) {
				found = 1;
				cr_expect(r2cc_param_help(j)[0] != '\0');
			}
		cr_expect(found, "%s missing from the table", expected[i]);
	}
}

/* The environment is read once; a bad value makes the library pass through. */
Test(params, load_bad_env_disables)
{
	setenv("R2CC_MODE", "7", 1);
	setenv("R2CC_DEBUG", "NONE", 1);
	cr_expect_eq(r2cc_params_load(), -EINVAL);
	cr_expect_not(r2cc_param.valid);
	setenv("R2CC_MODE", "1", 1);
	cr_expect_eq(r2cc_params_load(), -EINVAL, "settings must be read only once");
}

Test(params, load_good_env)
{
	setenv("R2CC_MODE", "3", 1);
	setenv("R2CC_AR_STAGE2_CHUNKS", "8", 1);
	setenv("R2CC_DEBUG", "NONE", 1);
	cr_expect_eq(r2cc_params_load(), 0);
	cr_expect(r2cc_param.valid);
	cr_expect_eq(r2cc_param.mode, 3);
	cr_expect_eq(r2cc_param.ar_stage2_chunks, 8);
}

/* A declared failure that does not parse is a bad setting like any other. */
Test(params, load_bad_failure_declaration)
{
	setenv("R2CC_FAILED_NODE", "0", 1);
	setenv("R2CC_FAILED_HCA", "", 1);
	setenv("R2CC_DEBUG", "NONE", 1);
	cr_expect_eq(r2cc_params_load(), -EINVAL);
	cr_expect_not(r2cc_param.valid);
}

Test(params, load_good_failure_declaration)
{
	setenv("R2CC_FAILED_NODE", "0", 1);
	setenv("R2CC_FAILED_HCA", "mlx5_2", 1);
	setenv("R2CC_DEBUG", "NONE", 1);
	cr_expect_eq(r2cc_params_load(), 0);
	cr_expect(r2cc_param.valid);
}

/* A drill plan that does not parse is one error line naming R2CC_DRILL, and no drill
 * (nor anything else of R2CC) runs. */
Test(params, load_bad_drill_plan)
{
	char path[] = "/tmp/r2cc-params-drill-XXXXXX";
	int fd = mkstemp(path);
	cr_assert(fd >= 0);
	close(fd);
	setenv("R2CC_DRILL", "node1/mlx5_2=blackhole@5 minutes", 1);
	setenv("R2CC_DEBUG_FILE", path, 1);
	cr_expect_eq(r2cc_params_load(), -EINVAL);
	cr_expect_not(r2cc_param.valid);
	FILE *f = fopen(path, "r");
	cr_assert(f);
	char line[1024];
	int lines = 0, named = 0;
	while (fgets(line, sizeof(line), f)) {
		lines++;
		named += strstr(line, "R2CC_DRILL") && strstr(line, "step 1") &&
			 strstr(line, "plain NCCL");
	}
	fclose(f);
	unlink(path);
	cr_expect_eq(lines, 1, "one error line, not %d", lines);
	cr_expect_eq(named, 1);
}

Test(params, load_good_drill_plan)
{
	setenv("R2CC_DRILL", "node1/mlx5_2=blackhole@5s; node1/mlx5_2=up@15s", 1);
	setenv("R2CC_DEBUG", "NONE", 1);
	cr_expect_eq(r2cc_params_load(), 0);
	cr_expect(r2cc_param.valid);
	cr_expect_str_eq(r2cc_param.drill, "node1/mlx5_2=blackhole@5s; node1/mlx5_2=up@15s");
}

/* R2CC_ON_INCIDENT: a one-line shell command; blank or with control characters is
 * refused naming the variable; its bounds are checked. */
Test(params, on_incident)
{
	cr_expect_eq(p.on_incident_max, 10);
	cr_expect_eq(p.on_incident_timeout_ms, 10000);
	cr_expect_eq(set("R2CC_ON_INCIDENT", "logger -t r2cc \"$R2CC_INCIDENT_NIC\""), 0);
	cr_expect_str_eq(p.on_incident, "logger -t r2cc \"$R2CC_INCIDENT_NIC\"");
	expect_bad("R2CC_ON_INCIDENT", "", "shell command");
	expect_bad("R2CC_ON_INCIDENT", "   ", "shell command");
	expect_bad("R2CC_ON_INCIDENT", "echo a\necho b", "shell command");
	expect_bad("R2CC_ON_INCIDENT_MAX", "0", "1 to 600");
	expect_bad("R2CC_ON_INCIDENT_TIMEOUT_MS", "50", "100 to 600000");
	cr_expect_eq(set("R2CC_ON_INCIDENT_TIMEOUT_MS", "300"), 0);
	cr_expect_eq(p.on_incident_timeout_ms, 300);
}
