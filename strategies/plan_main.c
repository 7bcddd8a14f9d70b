/*
 * r2cc-plan: what the cost model predicts for one cluster and message, for
 * each strategy, and what R2CC_MODE=auto would pick and why.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "strategies/cost.h"

static const char usage[] =
    "usage: r2cc-plan --nodes N --nics K --failed F --bytes B [--chunks C] [--model SPEC]\n"
    "\n"
    "Predicted AllReduce time relative to a healthy ring, on N servers with K NICs\n"
    "each, F of them failed on one server, for a message of B bytes.\n"
    "\n"
    "  --nodes N     servers, 1..65536\n"
    "  --nics K      NICs per server, 1..64\n"
    "  --failed F    failed NICs on the degraded server, 0..K\n"
    "  --bytes B     message size: a number with an optional K, M, G or T suffix\n"
    "                (powers of 1024; KiB/KB also accepted), e.g. 256M, 4G\n"
    "  --chunks C    R2CC_AR_STAGE2_CHUNKS for mode 3, 1..64 (default 4)\n"
    "  --model SPEC  cost constants, e.g. as printed by r2cc-fit-cost:\n"
    "                alpha_us=..,beta_us_per_byte=..,ar2_beta_us_per_byte=..,\n"
    "                ar2_stage_us=..,ar2_chunk_us=..\n"
    "  --help        this text\n";

static int bad(const char *fmt, const char *arg)
{
	fprintf(stderr, "r2cc-plan: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\n(r2cc-plan --help for usage)\n");
	return 2;
}

static int parse_int(const char *s, long lo, long hi, int *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -EINVAL;
	*out = (int)v;
	return 0;
}

static int parse_bytes(const char *s, double *out)
{
	static const char *const suf[] = {"", "K", "M", "G", "T"};
	char *end;
	double v, mul = 1;
	size_t i;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || !(v > 0) || s[0] == '-' || s[0] == '+')
		return -EINVAL;
	if (*end) {
		for (i = 1; i < sizeof(suf) / sizeof(suf[0]); i++)
			if (strncasecmp(end, suf[i], 1) == 0)
				break;
		if (i == sizeof(suf) / sizeof(suf[0]))
			return -EINVAL;
		if (end[1] && strcasecmp(end + 1, "B") && strcasecmp(end + 1, "iB"))
			return -EINVAL;
		mul = ldexp(1.0, 10 * (int)i);
	}
	v *= mul;
	if (v > ldexp(1.0, 60))
		return -EINVAL;
	*out = v;
	return 0;
}

static const char *human(double bytes, char *buf, size_t len)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	int u = 0;

	while (bytes >= 1024 && u < 5) {
		bytes /= 1024;
		u++;
	}
	snprintf(buf, len, "%.4g %s", bytes, unit[u]);
	return buf;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"nodes", required_argument, NULL, 'n'},  {"nics", required_argument, NULL, 'k'},
	    {"failed", required_argument, NULL, 'f'}, {"bytes", required_argument, NULL, 'b'},
	    {"chunks", required_argument, NULL, 'c'}, {"model", required_argument, NULL, 'm'},
	    {"help", no_argument, NULL, 'h'},	      {NULL, 0, NULL, 0},
	};
	struct r2cc_cost_model model = r2cc_cost_default;
	struct r2cc_cost_case c = {-1, -1, -1, -1, 4};
	char reason[256], err[256], buf[32], mstr[256];
	enum r2cc_strategy s, pick;
	int opt;
	double t, t0, cross;

	opterr = 0;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 'n':
			if (parse_int(optarg, 1, 65536, &c.nodes))
				return bad("--nodes needs an integer 1..65536, not \"%s\"", optarg);
			break;
		case 'k':
			if (parse_int(optarg, 1, 64, &c.nics))
				return bad("--nics needs an integer 1..64, not \"%s\"", optarg);
			break;
		case 'f':
			if (parse_int(optarg, 0, 64, &c.failed))
				return bad("--failed needs an integer 0..64, not \"%s\"", optarg);
			break;
		case 'b':
			if (parse_bytes(optarg, &c.bytes))
				return bad("--bytes needs a size > 0 such as 4096, 256M or 4G, not "
					   "\"%s\"",
					   optarg);
			break;
		case 'c':
			if (parse_int(optarg, 1, 64, &c.chunks))
				return bad("--chunks needs an integer 1..64, not \"%s\"", optarg);
			break;
		case 'm':
			if (r2cc_cost_model_parse(optarg, &model, err, sizeof(err)))
				return bad("--%s", err);
			break;
		case 'h':
			fputs(usage, stdout);
			return 0;
		default:
			return bad("unknown or incomplete option \"%s\"", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return bad("unexpected argument \"%s\"", argv[optind]);
	if (c.nodes < 0 || c.nics < 0 || c.failed < 0 || c.bytes < 0)
		return bad("%s", "--nodes, --nics, --failed and --bytes are all required");
	if (c.failed > c.nics)
		return bad("%s", "--failed cannot exceed --nics");

	r2cc_cost_model_format(&model, mstr, sizeof(mstr));
	printf("cluster: %d nodes x %d NICs, %d failed on the degraded node (X = %.3f)\n", c.nodes,
	       c.nics, c.failed, (double)c.failed / c.nics);
	printf("message: %.0f bytes (%s), K = %d\n", c.bytes, human(c.bytes, buf, sizeof(buf)),
	       c.chunks);
	printf("model: %s\n", mstr);
	printf("%-24s %10s %14s\n", "strategy", "T/T0", "time_us");
	t0 = r2cc_cost_time(&model, R2CC_STRAT_HEALTHY, &c);
	for (s = R2CC_STRAT_HEALTHY; s < R2CC_STRAT_COUNT; s++) {
		t = r2cc_cost_time(&model, s, &c);
		if (t == HUGE_VAL)
			printf("%-24s %10s %14s\n", r2cc_strategy_name(s), "-", "cannot run");
		else
			printf("%-24s %10.3f %14.1f\n", r2cc_strategy_name(s), t / t0, t);
	}
	pick = r2cc_cost_choose(&model, &c, reason, sizeof(reason));
	printf("auto: %s (%s)\n", r2cc_strategy_name(pick), reason);
	cross = r2cc_cost_crossover_bytes(&model, c.nodes, c.nics, c.failed, c.chunks);
	if (cross == HUGE_VAL)
		printf("crossover: none (R2CC-AllReduce never wins here)\n");
	else
		printf("crossover: R2CC-AllReduce wins above %.0f bytes (%s)\n", cross,
		       human(cross, buf, sizeof(buf)));
	return 0;
}
