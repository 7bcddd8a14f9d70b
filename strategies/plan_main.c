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

#include "shim/log.h"
#include "strategies/allreduce2.h"
#include "strategies/cost.h"

/* strategies/allreduce2.c logs through these; nothing r2cc-plan calls logs */
int r2cc_log_level = R2CC_LOG_WARN;

void r2cc_log_write(int level, int dev, const char *fmt, ...)
{
	(void)level;
	(void)dev;
	(void)fmt;
}

static const char usage[] =
    "usage: r2cc-plan --nodes N --nics K[,K...] --failed F[,F...] --bytes B [--chunks C]\n"
    "                 [--rate GBPS] [--min-bytes M] [--model SPEC]\n"
    "\n"
    "Predicted AllReduce time relative to a healthy ring, on N servers with K NICs\n"
    "each, for a message of B bytes, and what R2CC would run: with R2CC_MODE=3 and\n"
    "with R2CC_MODE=auto.\n"
    "\n"
    "  --nodes N      servers, 1..65536\n"
    "  --nics K       NICs per server, 1..64; or one count per server (N of them)\n"
    "  --failed F     failed NICs: one number (one degraded server), or one count\n"
    "                 per server (N of them, 0 for a healthy one), e.g. 1,0,2,0\n"
    "  --bytes B      message size: a number with an optional K, M, G or T suffix\n"
    "                 (powers of 1024; KiB/KB also accepted), e.g. 256M, 4G\n"
    "  --chunks C     R2CC_AR_STAGE2_CHUNKS for mode 3, 1..64 (default 4)\n"
    "  --rate GBPS    NIC link rate in Gb/s for the per-byte terms (default 400)\n"
    "  --min-bytes M  R2CC_AR_MIN_BYTES (default 16M)\n"
    "  --model SPEC   cost constants, e.g. as printed by r2cc-fit-cost:\n"
    "                 alpha_us=..,beta_us_per_byte=..,ar2_beta_us_per_byte=..,\n"
    "                 ar2_stage_us=..,ar2_chunk_us=.. (per-byte 0: the link rate's)\n"
    "  --help         this text\n";

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

#define MAX_NODES 65536

/* "K" or "K0,K1,..." into v (1 or up to max entries); the count, or -1. */
static int parse_list(const char *s, long lo, long hi, int *v, int max)
{
	char tok[16];
	int n = 0;

	for (;;) {
		size_t len = strcspn(s, ",");

		if (!len || len >= sizeof(tok) || n == max)
			return -1;
		memcpy(tok, s, len);
		tok[len] = '\0';
		if (parse_int(tok, lo, hi, &v[n++]))
			return -1;
		if (!s[len])
			return n;
		s += len + 1;
	}
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"nodes", required_argument, NULL, 'n'},  {"nics", required_argument, NULL, 'k'},
	    {"failed", required_argument, NULL, 'f'}, {"bytes", required_argument, NULL, 'b'},
	    {"chunks", required_argument, NULL, 'c'}, {"model", required_argument, NULL, 'm'},
	    {"rate", required_argument, NULL, 'r'},   {"min-bytes", required_argument, NULL, 'x'},
	    {"help", no_argument, NULL, 'h'},	      {NULL, 0, NULL, 0},
	};
	struct r2cc_cost_model model = r2cc_cost_default;
	struct r2cc_cost_case c = {-1, -1, -1, -1, 4, 1, 400};
	char reason[320], err[256], buf[32], mstr[256];
	enum r2cc_strategy s, pick;
	static int kv[MAX_NODES], fv[MAX_NODES], ranks[MAX_NODES]; /* per node */
	int opt, nk = 0, nf = 0;
	double t, t0, cross, min_bytes = 16.0 * 1024 * 1024;
	char *end;

	opterr = 0;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 'n':
			if (parse_int(optarg, 1, MAX_NODES, &c.nodes))
				return bad("--nodes needs an integer 1..65536, not \"%s\"", optarg);
			break;
		case 'k':
			if ((nk = parse_list(optarg, 1, 64, kv, MAX_NODES)) < 0)
				return bad(
				    "--nics needs an integer 1..64 or a comma-separated list "
				    "of them, one per node, not \"%s\"",
				    optarg);
			break;
		case 'f':
			if ((nf = parse_list(optarg, 0, 64, fv, MAX_NODES)) < 0)
				return bad("--failed needs an integer 0..64 or a comma-separated "
					   "list of them, one per node, not \"%s\"",
					   optarg);
			break;
		case 'b':
			if (parse_bytes(optarg, &c.bytes))
				return bad("--bytes needs a size > 0 such as 4096, 256M or 4G, not "
					   "\"%s\"",
					   optarg);
			break;
		case 'x':
			if (parse_bytes(optarg, &min_bytes))
				return bad("--min-bytes needs a size > 0 such as 16M, not \"%s\"",
					   optarg);
			break;
		case 'c':
			if (parse_int(optarg, 1, 64, &c.chunks))
				return bad("--chunks needs an integer 1..64, not \"%s\"", optarg);
			break;
		case 'r':
			c.gbps = strtod(optarg, &end);
			if (*end || !(c.gbps > 0) || c.gbps > 1e6)
				return bad("--rate needs Gb/s > 0, such as 400, not \"%s\"",
					   optarg);
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
	if (c.nodes < 0 || !nk || !nf || c.bytes < 0)
		return bad("%s", "--nodes, --nics, --failed and --bytes are all required");
	if (nk != 1 && nk != c.nodes)
		return bad("%s", "--nics needs one count, or one per node (--nodes of them)");
	if (nf != 1 && nf != c.nodes)
		return bad("%s", "--failed needs one count (one degraded node), or one per node "
				 "(--nodes of them)");
	for (int i = 1; i < c.nodes && nk == 1; i++)
		kv[i] = kv[0];
	if (nf == 1) /* one count: node 0 is the degraded one */
		for (int i = 1; i < c.nodes; i++)
			fv[i] = 0;
	for (int i = 0; i < c.nodes; i++)
		if (fv[i] > kv[i])
			return bad("%s", "--failed cannot exceed --nics on a node");
	/* The library's own layout and eligibility check: one rank a node. */
	for (int i = 0; i < c.nodes; i++)
		ranks[i] = i;
	struct r2cc_ar2_view view = {c.nodes, ranks, kv, fv};
	struct r2cc_ar2_layout lay;
	struct r2cc_ar2_cfg cfg = {c.chunks, 0, (uint64_t)min_bytes};
	if (r2cc_ar2_layout_init(&lay, &view)) {
		fprintf(stderr, "r2cc-plan: out of memory\n");
		return 1;
	}
	int ndeg = lay.ndegraded;
	c.nics = ndeg ? lay.nics : kv[0];
	c.failed = lay.failed;
	c.degraded = ndeg;

	r2cc_cost_model_format(&model, mstr, sizeof(mstr));
	if (ndeg <= 1)
		printf("cluster: %d nodes x %d NICs, %d failed on the degraded node (X = %.3f)\n",
		       c.nodes, c.nics, c.failed, (double)c.failed / c.nics);
	else
		printf("cluster: %d nodes, %d degraded; the largest failed share: %d of %d NICs "
		       "on node %d (X = %.3f)\n",
		       c.nodes, ndeg, c.failed, c.nics, lay.share_node, (double)c.failed / c.nics);
	printf("message: %.0f bytes (%s), K = %d, NICs at %g Gb/s\n", c.bytes,
	       human(c.bytes, buf, sizeof(buf)), c.chunks, c.gbps);
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
	/* R2CC_MODE=3: R2CC-AllReduce wherever it can run (strategies/allreduce2.c) */
	enum r2cc_ar2_reason why3 =
	    r2cc_ar2_check(&lay, &cfg, (size_t)c.bytes, R2CC_NCCL_INT8, R2CC_NCCL_SUM, 0);
	if (why3 != R2CC_AR2_RAN)
		printf("R2CC_MODE=3: %s (%s)\n", r2cc_strategy_name(R2CC_STRAT_BALANCE),
		       r2cc_ar2_reason_str(why3));
	else
		printf("R2CC_MODE=3: %s (%d degraded node%s, %s)\n",
		       r2cc_strategy_name(R2CC_STRAT_AR2), ndeg, ndeg == 1 ? "" : "s",
		       ndeg == 1		   ? "one helper"
		       : lay.healthy_nodes >= ndeg ? "a helper each"
						   : "helpers shared: fewer healthy nodes");
	pick = why3 != R2CC_AR2_RAN ? R2CC_STRAT_BALANCE
				    : r2cc_cost_choose(&model, &c, reason, sizeof(reason));
	printf("auto: %s (%s)\n", r2cc_strategy_name(pick),
	       why3 != R2CC_AR2_RAN ? r2cc_ar2_reason_str(why3) : reason);
	cross = r2cc_cost_crossover(&model, &c);
	if (cross == HUGE_VAL)
		printf("crossover: none (R2CC-AllReduce never wins here)\n");
	else
		printf("crossover: R2CC-AllReduce wins above %.0f bytes (%s)\n", cross,
		       human(cross, buf, sizeof(buf)));
	r2cc_ar2_layout_fini(&lay);
	return 0;
}
