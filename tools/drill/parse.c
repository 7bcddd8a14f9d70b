/*
 * r2cc-verbs-drill's options (main.c has the overview): the usage text, the parser
 * and the checks of combinations that would test nothing.
 */
#include "tools/drill/parent.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: r2cc-verbs-drill [--procs N] [--nics K] "
	    "[--fault none|down|blackhole|flap|slow|kill|all|\n"
	    "                         ackloss|blackhole-tx|blackhole-rx|fatal|jitter]\n"
	    "                        [--seeds S] [--first-seed B] [--messages M] [--window W]\n"
	    "                        [--max-size BYTES] [--timeout SEC] [--time-scale X]\n"
	    "                        [--ib-timeout T] [--retry-cnt R] [--no-preload] [--keep] "
	    "[--verbose]\n"
	    "                        [--nccl-stub] [--fault-phase traffic|connect] "
	    "[--fault-nics one|all]\n"
	    "                        [--second-fault MS] [--kill-peer] "
	    "[--expect pass|clean-error|no-repair] [--bound SEC]\n"
	    "                        [--flush] [--no-fusion] [--gbps G] [--qps Q] [--per-node P] "
	    "[--declare NODE:NIC]\n"
	    "                        [--nccl-version 2.18..2.32] [--link ib|roce] "
	    "[--detect-within MS] [--fresh-mr] [--expect-landed]\n"
	    "                        [--restore MS] [--failback-ms MS] [--flap-ms MS] [--churn]\n"
	    "                        [--mlx5dv plain|ooo] [--net-plugin NAME] [--nccl-net NAME]\n"
	    "                        [--expect-unprotected WORD]\n"
	    "                        [--inject] [--inject-at all|own] [--drill-plan PLAN]\n"
	    "                        [--expect-drill-problem WORD] [--summary FILE]\n"
	    "Runs NCCL-shaped verbs traffic between N emulated nodes of K soft NICs each, one\n"
	    "scenario per (fault kind, seed), and checks that every message arrives exactly\n"
	    "once with the right bytes. Defaults: 2 procs, 3 NICs, all fault kinds (down,\n"
	    "blackhole, flap, slow), 20 seeds from 1, 128 messages per connection, window 8,\n"
	    "max size 4 MiB, timeout 15 s, time scale 0.01, IB timeout 20, retry count 7.\n"
	    "--expect clean-error: a scenario passes only if an error reaches the application\n"
	    "within --bound (10 s) of the fault, no worker hangs and nothing is corrupt.\n"
	    "--flush: NCCL's GPU Direct flush too: receive rings are device memory (a memfd\n"
	    "through ibv_reg_dmabuf_mr, SOFTVERBS_DMABUF=1), and each received message is\n"
	    "read back with an RDMA READ on a loopback QP per NIC of its connection before it\n"
	    "counts as delivered; a scenario fails if, once those READs are back, bytes of\n"
	    "the message came through a NIC that no READ through it ordered since\n"
	    "(softverbs_unflushed: the GPU could read stale data).\n"
	    "--no-fusion: each connection on one NIC, the ordered pairs taking the NICs in\n"
	    "turn (NCCL_NET_MERGE_LEVEL=LOC, no virtual NIC); with --qps Q its Q QPs there.\n"
	    "--gbps G: every NIC shaped to G Gb/s; --qps Q: Q QPs per NIC per connection\n"
	    "(NCCL_IB_QPS_PER_CONNECTION); --per-node P: P processes share each node's NICs;\n"
	    "--declare NODE:NIC: R2CC_FAILED_NODE/HCA; --expect no-repair: as pass, and no\n"
	    "incident in any R2CC report but declared moves (a migration is a false repair).\n"
	    "--mlx5dv plain|ooo: data QPs made by libmlx5's mlx5dv_create_qp (the device's\n"
	    "stand-in, SOFTVERBS_MLX5DV=1), as NCCL 2.30 makes them with NCCL_IB_OOO_RQ=1; ooo\n"
	    "asks for an out-of-order receive queue (MLX5DV_QP_CREATE_OOO_DP).\n"
	    "--net-plugin NAME, --nccl-net NAME: NCCL_NET_PLUGIN and NCCL_NET for the workers,\n"
	    "whose NCCL test double loads the plugin as NCCL does (testnet: the project's own,\n"
	    "which opens no RDMA device); --expect-unprotected WORD: every worker's R2CC report\n"
	    "must say it is not protected, for a reason that names WORD.\n"
	    "--nccl-version V: the verbs pattern of that NCCL release (default 2.28): request\n"
	    "slots, FIFO layout, one NIC per connection before 2.20, no receive queue on the\n"
	    "QPs that receive nothing from 2.29 (docs/nccl-versions.md).\n"
	    "--link roce: RoCE v2 soft NICs, a subnet per rail routed between rails, lossless\n"
	    "class 106; NCCL's GID index 3 and NCCL_IB_TC=106 (unless set); a scenario fails\n"
	    "if any byte travelled outside the lossless class (lossy_bytes).\n"
	    "--detect-within MS: a scenario fails if any R2CC incident of its fault was\n"
	    "detected more than MS ms after the fault.\n"
	    "--fresh-mr: 3/4 into its messages each receiver registers its data ring again\n"
	    "and sends the new rkeys; the faulted node's then stops for 1 s. A scenario\n"
	    "fails if a data ibv_post_send took more than 250 ms (a migrated QP's key lookup\n"
	    "waited on the stopped peer); the run fails if no scenario fetched a map.\n"
	    "--expect-landed: the run fails unless hot repair found some clear-to-send\n"
	    "write landed at the peer and did not re-post it (cts-landed, repair/model/cts.h).\n"
	    "--restore MS: the faulted NIC comes back MS ms after the fault (softverbs-ctl\n"
	    "up; for flap, the flapping ends then), with R2CC_FAILBACK_MS=--failback-ms\n"
	    "(300). Traffic trickles from half the messages on until every process of the\n"
	    "faulted node has brought the NIC back. A scenario fails if that does not\n"
	    "happen, if a process brought it back more often than R2CC's hold-down allows\n"
	    "(it doubles from R2CC_FAILBACK_MS at each flap: floor(log2(MS/FAILBACK + 2))\n"
	    "+ 1), or if the node's NICs did not each carry a third (1/K, +-0.08) of the\n"
	    "node's wire bytes after the failback. --flap-ms: the flap's period.\n"
	    "--churn: all through the traffic and the fault, each worker keeps making and\n"
	    "destroying connections (its own CQ and QP, 8 messages each way checked at the\n"
	    "receiver, each side destroying without asking the other after 1-40 ms) with the\n"
	    "worker --per-node ranks on and back, on its NICs in turn, and creates and destroys\n"
	    "QPs (to INIT) beside them. A scenario fails if a message on a connection is not\n"
	    "its next one exactly as sent, if destroying a connection fails or takes 2 s, if\n"
	    "no connection carried a message, or if no R2CC report freed the records of\n"
	    "destroyed QPs. Its line counts the connections, their messages and error\n"
	    "completions, the QPs R2CC saw destroyed during their repair, and the longest\n"
	    "destroy.\n"
	    "--inject: the fault from R2CC_DRILL, libr2cc.so's own drill, instead of\n"
	    "softverbs-ctl (needs --nccl-stub; down, blackhole, blackhole-tx/rx, ackloss,\n"
	    "flap): the drawn fault as a plan, @0 from each worker's one ncclAllReduce, made\n"
	    "once all workers together delivered the drawn fraction (--inject-at own: once\n"
	    "it delivered that fraction of its own); every step must be applied; detection\n"
	    "is timed from the earliest applied step in the reports.\n"
	    "--drill-plan PLAN: R2CC_DRILL=PLAN as given (with --fault none, or replacing\n"
	    "--inject's); --expect-drill-problem WORD: a scenario fails unless some report\n"
	    "says a step was not applied for a reason naming WORD.\n"
	    "--summary FILE: one 'compare:' line per scenario appended to FILE (- stdout):\n"
	    "verdict, evidence classes, queue pairs moved, messages wrong, detection.\n"
	    "The last line is PASS or FAIL with the totals; exit 0 only on PASS.\n");
}

static int drill_parse_fault(const char *s)
{
	if (strcmp(s, "all") == 0)
		return -1;
	for (int k = 0; k < DRILL_FAULT_KINDS; k++)
		if (strcmp(s, drill_fault_names[k]) == 0)
			return k;
	return -2;
}

static bool drill_num(const char *s, double lo, double hi, double *v)
{
	char *end;

	errno = 0;
	*v = strtod(s, &end);
	return !errno && end != s && !*end && *v >= lo && *v <= hi;
}

/* The kinds R2CC_DRILL has (shim/drillspec.h), by the drill's fault kind. */
static bool drill_inject_kind(int kind)
{
	return kind == DRILL_FAULT_DOWN || kind == DRILL_FAULT_BLACKHOLE ||
	       kind == DRILL_FAULT_FLAP || kind == DRILL_FAULT_ACKLOSS ||
	       kind == DRILL_FAULT_BLACKHOLE_TX || kind == DRILL_FAULT_BLACKHOLE_RX;
}

/* --inject and --drill-plan: what the library's drill can stand in for; NULL if fine. */
static const char *drill_check_inject(const struct drill_opts *o)
{
	static char bad[320];

	if (!o->inject && !o->drill_plan)
		return o->expect_drill_problem ? "--expect-drill-problem needs --drill-plan or "
						 "--inject"
					       : NULL;
	if (!o->nccl_stub || !o->preload)
		return "--inject and --drill-plan need --nccl-stub (its ncclAllReduce is R2CC's "
		       "first collective, from which the plan's times count) and libr2cc.so "
		       "preloaded (which carries the plan out): not --no-preload";
	if (!o->inject && o->fault != DRILL_FAULT_NONE)
		return "--drill-plan with a fault kind needs --inject (the plan then replaces "
		       "the drawn one); or --fault none";
	if (!o->inject)
		return NULL;
	if (!drill_inject_kind(o->fault)) {
		snprintf(bad, sizeof(bad),
			 "--inject: R2CC_DRILL has no fault like --fault %s; it has down, "
			 "blackhole, blackhole-tx, blackhole-rx, ackloss and flap",
			 o->fault < 0 ? "all" : drill_fault_names[o->fault]);
		return bad;
	}
	if (o->fault_phase != DRILL_AT_TRAFFIC)
		return "--inject: the drill's steps count from the first collective, during the "
		       "traffic: not with --fault-phase connect";
	if (o->restore_ms >= 0)
		return "--inject: not with --restore (its failback watch follows softverbs-ctl's "
		       "fault)";
	if (o->second_ms >= 0 && o->second_ms != floor(o->second_ms))
		return "--inject: --second-fault in whole ms (the plan's times are)";
	return NULL;
}

/* Combinations that would test nothing, or something else than they say. */
static int drill_check_opts(const struct drill_opts *o)
{
	const char *bad = NULL;
	bool nic_fault = o->fault != DRILL_FAULT_NONE && o->fault != DRILL_FAULT_KILL;

	if (o->fault == DRILL_FAULT_NONE &&
	    (o->fault_phase != DRILL_AT_TRAFFIC || o->fault_all_nics || o->second_ms >= 0 ||
	     o->expect == DRILL_EXPECT_CLEAN))
		bad = "--fault-phase, --fault-nics, --second-fault and --expect clean-error need a "
		      "fault";
	else if (o->procs % o->per_node || o->procs / o->per_node < 2)
		bad = "--procs must be a multiple of --per-node, with 2 nodes or more";
	else if (o->declare_node >= o->procs / o->per_node || o->declare_nic >= o->nics)
		bad = "--declare names a node or NIC the drill does not have";
	else if (o->fault == DRILL_FAULT_KILL && o->expect != DRILL_EXPECT_CLEAN)
		bad = "--kill-peer needs --expect clean-error (a dead process cannot be repaired)";
	else if (!nic_fault &&
		 (o->fault_phase != DRILL_AT_TRAFFIC || o->fault_all_nics || o->second_ms >= 0))
		bad = "--fault-phase, --fault-nics and --second-fault apply to NIC faults";
	else if (o->second_ms >= 0 && o->fault_all_nics)
		bad = "--second-fault needs a NIC left: not with --fault-nics all";
	else if (o->second_ms >= 0 && o->nics < 2)
		bad = "--second-fault needs --nics 2 or more";
	else if (o->restore_ms >= 0 &&
		 (!nic_fault || o->fault == DRILL_FAULT_SLOW || o->fault == DRILL_FAULT_FATAL ||
		  o->fault_all_nics || o->expect != DRILL_EXPECT_PASS ||
		  o->fault_phase != DRILL_AT_TRAFFIC || !o->preload))
		bad =
		    "--restore needs a NIC fault that can end (down, blackhole, flap, ackloss, "
		    "jitter, blackhole-tx/rx) on one NIC during the traffic, libr2cc and --expect "
		    "pass";
	else if (o->restore_ms >= 0 && (o->no_fusion || o->pattern->one_nic))
		bad = "--restore checks that the NICs share a node's bytes evenly after the "
		      "failback, "
		      "which needs connections over every NIC: not with --no-fusion or one NIC per "
		      "connection (--nccl-version before 2.20)";
	else if (!o->pattern->one_nic && o->nics > o->pattern->nrkeys)
		bad = "--nccl-version 2.20-2.23 fuses at most 2 NICs per connection: --nics 2 or "
		      "fewer";
	else
		bad = drill_check_inject(o);
	if (bad) {
		fprintf(stderr, "r2cc-verbs-drill: %s\n", bad);
		return -1;
	}
	return 0;
}

int drill_parse(int argc, char **argv, struct drill_opts *o)
{
	enum {
		O_PROCS = 256,
		O_NICS,
		O_FAULT,
		O_SEEDS,
		O_FIRST,
		O_MSGS,
		O_WINDOW,
		O_MAX,
		O_TIMEOUT,
		O_SCALE,
		O_IBT,
		O_RETRY,
		O_NOPRE,
		O_KEEP,
		O_VERBOSE,
		O_CORRUPT,
		O_WORKER,
		O_RANK,
		O_SEED,
		O_DIR,
		O_NCCL_LIB,
		O_NCCL_STUB,
		O_PHASE,
		O_SECOND,
		O_FNICS,
		O_EXPECT,
		O_BOUND,
		O_KILL,
		O_HOLD,
		O_FLUSH,
		O_NO_FUSION,
		O_MLX5DV,
		O_NET_PLUGIN,
		O_NCCL_NET,
		O_EXPECT_UNPROT,
		O_FRESH_MR,
		O_EXPECT_LANDED,
		O_CHURN,
		O_QPS,
		O_PER_NODE,
		O_GBPS,
		O_DECLARE,
		O_NCCL_VERSION,
		O_LINK,
		O_DETECT,
		O_RESTORE,
		O_FAILBACK,
		O_FLAP,
		O_INJECT,
		O_DRILL_PLAN,
		O_EXPECT_PROBLEM,
		O_SUMMARY,
		O_COLL_AT,
		O_COLL_SUM,
		O_INJECT_AT,
		O_HELP,
	};
	static const struct option opts[] = {
	    {"procs", required_argument, NULL, O_PROCS},
	    {"nics", required_argument, NULL, O_NICS},
	    {"fault", required_argument, NULL, O_FAULT},
	    {"seeds", required_argument, NULL, O_SEEDS},
	    {"first-seed", required_argument, NULL, O_FIRST},
	    {"messages", required_argument, NULL, O_MSGS},
	    {"window", required_argument, NULL, O_WINDOW},
	    {"max-size", required_argument, NULL, O_MAX},
	    {"timeout", required_argument, NULL, O_TIMEOUT},
	    {"time-scale", required_argument, NULL, O_SCALE},
	    {"ib-timeout", required_argument, NULL, O_IBT},
	    {"retry-cnt", required_argument, NULL, O_RETRY},
	    {"no-preload", no_argument, NULL, O_NOPRE},
	    {"keep", no_argument, NULL, O_KEEP},
	    {"verbose", no_argument, NULL, O_VERBOSE},
	    {"selftest-corrupt", no_argument, NULL, O_CORRUPT},
	    {"worker", no_argument, NULL, O_WORKER},
	    {"rank", required_argument, NULL, O_RANK},
	    {"seed", required_argument, NULL, O_SEED},
	    {"dir", required_argument, NULL, O_DIR},
	    {"nccl-lib", required_argument, NULL, O_NCCL_LIB},
	    {"nccl-stub", no_argument, NULL, O_NCCL_STUB},
	    {"fault-phase", required_argument, NULL, O_PHASE},
	    {"second-fault", required_argument, NULL, O_SECOND},
	    {"fault-nics", required_argument, NULL, O_FNICS},
	    {"expect", required_argument, NULL, O_EXPECT},
	    {"bound", required_argument, NULL, O_BOUND},
	    {"kill-peer", no_argument, NULL, O_KILL},
	    {"hold-connect", required_argument, NULL, O_HOLD},
	    {"flush", no_argument, NULL, O_FLUSH},
	    {"no-fusion", no_argument, NULL, O_NO_FUSION},
	    {"mlx5dv", required_argument, NULL, O_MLX5DV},
	    {"net-plugin", required_argument, NULL, O_NET_PLUGIN},
	    {"nccl-net", required_argument, NULL, O_NCCL_NET},
	    {"expect-unprotected", required_argument, NULL, O_EXPECT_UNPROT},
	    {"fresh-mr", no_argument, NULL, O_FRESH_MR},
	    {"expect-landed", no_argument, NULL, O_EXPECT_LANDED},
	    {"churn", no_argument, NULL, O_CHURN},
	    {"qps", required_argument, NULL, O_QPS},
	    {"per-node", required_argument, NULL, O_PER_NODE},
	    {"gbps", required_argument, NULL, O_GBPS},
	    {"declare", required_argument, NULL, O_DECLARE},
	    {"nccl-version", required_argument, NULL, O_NCCL_VERSION},
	    {"link", required_argument, NULL, O_LINK},
	    {"detect-within", required_argument, NULL, O_DETECT},
	    {"restore", required_argument, NULL, O_RESTORE},
	    {"failback-ms", required_argument, NULL, O_FAILBACK},
	    {"flap-ms", required_argument, NULL, O_FLAP},
	    {"inject", no_argument, NULL, O_INJECT},
	    {"drill-plan", required_argument, NULL, O_DRILL_PLAN},
	    {"expect-drill-problem", required_argument, NULL, O_EXPECT_PROBLEM},
	    {"summary", required_argument, NULL, O_SUMMARY},
	    {"collective-at", required_argument, NULL, O_COLL_AT},
	    {"collective-sum", no_argument, NULL, O_COLL_SUM},
	    {"inject-at", required_argument, NULL, O_INJECT_AT},
	    {"help", no_argument, NULL, O_HELP},
	    {NULL, 0, NULL, 0},
	};
	int c;
	double v;
	bool fault_set = false, kill_peer = false, inject_at_set = false;
	bool msgs_set = false, max_set = false, timeout_set = false, scale_set = false;

	*o = (struct drill_opts){
	    .procs = 2,
	    .nics = 3,
	    .qps = 1,
	    .per_node = 1,
	    .declare_node = -1,
	    .fault = -1,
	    .seeds = 20,
	    .first_seed = 1,
	    .messages = 128,
	    .window = 8,
	    .max_size = 4u << 20,
	    .timeout_s = 15,
	    .time_scale = 0.01,
	    .qp_timeout = 20,
	    .retry_cnt = 7,
	    .preload = true,
	    .second_ms = -1,
	    .bound_s = 10,
	    .restore_ms = -1,
	    .failback_ms = 300,
	    .pattern = drill_pattern_default(),
	};
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		const char *name = NULL;
		bool ok = true;

		switch (c) {
		case O_PROCS:
			ok = drill_num(optarg, 2, DRILL_MAX_PROCS, &v);
			o->procs = (int)v;
			name = "--procs (2..16)";
			break;
		case O_NICS:
			ok = drill_num(optarg, 1, DRILL_MAX_NICS, &v);
			o->nics = (int)v;
			name = "--nics (1..4, NCCL's devices per connection)";
			break;
		case O_FAULT:
			o->fault = drill_parse_fault(optarg);
			ok = o->fault != -2;
			fault_set = true;
			name = "--fault (none, down, blackhole, flap, slow, kill, all, ackloss, "
			       "blackhole-tx, blackhole-rx, fatal or jitter)";
			break;
		case O_SEEDS:
			ok = drill_num(optarg, 1, 100000, &v);
			o->seeds = (int)v;
			name = "--seeds (1..100000)";
			break;
		case O_FIRST:
			ok = drill_num(optarg, 0, 1e9, &v);
			o->first_seed = (int)v;
			name = "--first-seed (0..1e9)";
			break;
		case O_MSGS:
			ok = drill_num(optarg, 1, 1e7, &v);
			o->messages = (int)v;
			msgs_set = true;
			name = "--messages (1..1e7)";
			break;
		case O_WINDOW:
			ok = drill_num(optarg, 1, DRILL_MAX_WINDOW, &v);
			o->window = (int)v;
			name = "--window (1..64)";
			break;
		case O_MAX:
			ok = drill_num(optarg, 0, 1 << 30, &v);
			o->max_size = (uint64_t)v;
			max_set = true;
			name = "--max-size (0..1 GiB)";
			break;
		case O_TIMEOUT:
			ok = drill_num(optarg, 0.1, 86400, &v);
			o->timeout_s = v;
			timeout_set = true;
			name = "--timeout (seconds, 0.1..86400)";
			break;
		case O_SCALE:
			ok = drill_num(optarg, 1e-6, 1e3, &v);
			o->time_scale = v;
			scale_set = true;
			name = "--time-scale (1e-6..1000)";
			break;
		case O_IBT:
			ok = drill_num(optarg, 1, 31, &v);
			o->qp_timeout = (int)v;
			name = "--ib-timeout (1..31)";
			break;
		case O_RETRY:
			ok = drill_num(optarg, 0, 7, &v);
			o->retry_cnt = (int)v;
			name = "--retry-cnt (0..7)";
			break;
		case O_NOPRE:
			o->preload = false;
			break;
		case O_KEEP:
			o->keep = true;
			break;
		case O_VERBOSE:
			o->verbose = true;
			break;
		case O_CORRUPT:
			o->selftest_corrupt = true;
			break;
		case O_WORKER:
			o->worker = true;
			break;
		case O_RANK:
			ok = drill_num(optarg, 0, DRILL_MAX_PROCS - 1, &v);
			o->rank = (int)v;
			name = "--rank";
			break;
		case O_SEED:
			ok = drill_num(optarg, 0, 1e9, &v);
			o->seed = (uint64_t)v;
			name = "--seed";
			break;
		case O_DIR:
			o->dir = optarg;
			break;
		case O_NCCL_LIB:
			o->nccl_lib = optarg;
			break;
		case O_NCCL_STUB:
			o->nccl_stub = true;
			break;
		case O_PHASE:
			ok = !strcmp(optarg, "traffic") || !strcmp(optarg, "connect");
			o->fault_phase =
			    strcmp(optarg, "connect") ? DRILL_AT_TRAFFIC : DRILL_AT_CONNECT;
			name = "--fault-phase (traffic or connect)";
			break;
		case O_SECOND:
			ok = drill_num(optarg, 0, 600000, &v);
			o->second_ms = v;
			name = "--second-fault (ms, 0..600000)";
			break;
		case O_FNICS:
			ok = !strcmp(optarg, "one") || !strcmp(optarg, "all");
			o->fault_all_nics = !strcmp(optarg, "all");
			name = "--fault-nics (one or all)";
			break;
		case O_EXPECT:
			ok = !strcmp(optarg, "pass") || !strcmp(optarg, "clean-error") ||
			     !strcmp(optarg, "no-repair");
			o->expect = !strcmp(optarg, "pass")	   ? DRILL_EXPECT_PASS
				    : !strcmp(optarg, "no-repair") ? DRILL_EXPECT_NO_REPAIR
								   : DRILL_EXPECT_CLEAN;
			name = "--expect (pass, clean-error or no-repair)";
			break;
		case O_QPS:
			ok = drill_num(optarg, 1, DRILL_MAX_QPN, &v);
			o->qps = (int)v;
			name = "--qps (1..8, QPs per NIC per connection)";
			break;
		case O_PER_NODE:
			ok = drill_num(optarg, 1, DRILL_MAX_PROCS, &v);
			o->per_node = (int)v;
			name = "--per-node (1..16, processes per emulated node)";
			break;
		case O_GBPS:
			ok = drill_num(optarg, 1, 400, &v) && v == (int)v;
			o->gbps = v;
			name = "--gbps (whole Gb/s, 1..400)";
			break;
		case O_DECLARE: {
			char *end;
			long node = strtol(optarg, &end, 10);
			ok = end != optarg && *end == ':' && node >= 0 && node < DRILL_MAX_PROCS;
			if (ok) {
				char *nend;
				long nic = strtol(end + 1, &nend, 10);
				ok = nend != end + 1 && !*nend && nic >= 0 && nic < DRILL_MAX_NICS;
				o->declare_node = (int)node;
				o->declare_nic = (int)nic;
			}
			name = "--declare (NODE:NIC, e.g. 0:2 for node0's mlx5_2)";
			break;
		}
		case O_BOUND:
			ok = drill_num(optarg, 0.001, 86400, &v);
			o->bound_s = v;
			name = "--bound (seconds, 0.001..86400)";
			break;
		case O_KILL:
			kill_peer = true;
			break;
		case O_HOLD:
			ok = !strcmp(optarg, "init") || !strcmp(optarg, "rts");
			o->hold = strcmp(optarg, "init") ? DRILL_HOLD_RTS : DRILL_HOLD_INIT;
			name = "--hold-connect (init or rts)";
			break;
		case O_FLUSH:
			o->flush = true;
			break;
		case O_NO_FUSION:
			o->no_fusion = true;
			break;
		case O_NET_PLUGIN:
			o->net_plugin = optarg;
			break;
		case O_NCCL_NET:
			o->nccl_net = optarg;
			break;
		case O_EXPECT_UNPROT:
			o->expect_unprotected = optarg;
			break;
		case O_MLX5DV:
			ok = !strcmp(optarg, "plain") || !strcmp(optarg, "ooo");
			o->mlx5dv = strcmp(optarg, "ooo") ? 1 : 2;
			name = "--mlx5dv (plain or ooo)";
			break;
		case O_FRESH_MR:
			o->fresh_mr = true;
			break;
		case O_EXPECT_LANDED:
			o->expect_landed = true;
			break;
		case O_CHURN:
			o->churn = true;
			break;
		case O_NCCL_VERSION:
			o->pattern = drill_pattern_find(optarg);
			ok = o->pattern != NULL;
			if (!ok)
				o->pattern = drill_pattern_default();
			name = "--nccl-version (an NCCL release 2.18 to 2.32, e.g. 2.18 or 2.21.5)";
			break;
		case O_LINK:
			ok = !strcmp(optarg, "ib") || !strcmp(optarg, "roce");
			o->roce = !strcmp(optarg, "roce");
			name = "--link (ib or roce)";
			break;
		case O_DETECT:
			ok = drill_num(optarg, 0.001, 86400000, &v);
			o->detect_within_ms = v;
			name = "--detect-within (ms, 0.001..86400000)";
			break;
		case O_RESTORE:
			ok = drill_num(optarg, 0, 600000, &v);
			o->restore_ms = v;
			name = "--restore (ms, 0..600000)";
			break;
		case O_FAILBACK:
			ok = drill_num(optarg, 1, 600000, &v);
			o->failback_ms = (int)v;
			name = "--failback-ms (1..600000)";
			break;
		case O_FLAP:
			ok = drill_num(optarg, 1, 600000, &v);
			o->flap_ms = (int)v;
			name = "--flap-ms (1..600000)";
			break;
		case O_INJECT:
			o->inject = true;
			break;
		case O_DRILL_PLAN:
			o->drill_plan = optarg;
			break;
		case O_EXPECT_PROBLEM:
			o->expect_drill_problem = optarg;
			break;
		case O_SUMMARY:
			o->summary = optarg;
			break;
		case O_COLL_AT:
			ok = drill_num(optarg, 1, 1e12, &v);
			o->coll_at = (uint64_t)v;
			name = "--collective-at";
			break;
		case O_COLL_SUM:
			o->coll_sum = true;
			break;
		case O_INJECT_AT:
			ok = !strcmp(optarg, "all") || !strcmp(optarg, "own");
			o->inject_own = !strcmp(optarg, "own");
			inject_at_set = true;
			name = "--inject-at (all or own)";
			break;
		case O_HELP:
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			return -1;
		}
		if (!ok) {
			fprintf(stderr, "r2cc-verbs-drill: bad value '%s' for %s\n", optarg, name);
			return -1;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "r2cc-verbs-drill: unexpected argument '%s'\n", argv[optind]);
		return -1;
	}
	if (o->worker && (!o->dir || o->rank >= o->procs)) {
		fprintf(stderr,
			"r2cc-verbs-drill: --worker needs --dir and a --rank below --procs\n");
		return -1;
	}
	if (inject_at_set && !o->inject && !o->drill_plan) {
		fprintf(stderr, "r2cc-verbs-drill: --inject-at needs --inject or --drill-plan\n");
		return -1;
	}
	/* --drill-plan alone: healthy traffic that carries the plan */
	if (o->drill_plan && !fault_set)
		o->fault = DRILL_FAULT_NONE;
	if (kill_peer) {
		if (fault_set && o->fault != DRILL_FAULT_KILL) {
			fprintf(stderr, "r2cc-verbs-drill: --kill-peer is a fault of its own: "
					"drop --fault\n");
			return -1;
		}
		o->fault = DRILL_FAULT_KILL;
	}
	/* More than 4 workers on a small machine: the defaults shrink so that a
	 * scenario moves about what 4 workers move in messages, in much smaller ones
	 * (with 16 workers on 2 cores, copies of megabytes keep healthy paths
	 * waiting longer than the stall threshold: tools/drill/README.md), and the
	 * scaled QP timeout and the deadline grow with the workers that share the
	 * CPUs. Workers get the parent's values explicitly. */
	if (!o->worker && o->procs > DRILL_FULL_PROCS) {
		double k = (double)o->procs / DRILL_FULL_PROCS;
		if (!msgs_set)
			o->messages = (int)(128.0 * (DRILL_FULL_PROCS - 1) / (o->procs - 1) + 0.5);
		if (!max_set)
			o->max_size = DRILL_MANY_MAX_SIZE;
		if (!scale_set)
			o->time_scale *= k;
		if (!timeout_set)
			o->timeout_s *= k;
	}
	/* --restore: the NIC comes back, is probed for R2CC_FAILBACK_MS, and a flap's
	 * hold-down may have doubled to about twice the flap's time. */
	if (!o->worker && o->restore_ms >= 0 && !timeout_set)
		o->timeout_s += (2.0 * o->restore_ms + 4.0 * o->failback_ms) / 1000.0 + 5.0;
	return o->worker ? 0 : drill_check_opts(o);
}
