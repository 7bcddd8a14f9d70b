/*
 * r2cc-verbs-drill: runs NCCL-shaped verbs traffic between emulated nodes of the
 * software RDMA device, under LD_PRELOAD=libr2cc.so (or without, --no-preload),
 * injects a NIC fault at a random moment of each scenario and reports whether every
 * message arrived exactly once with the right bytes. See tools/drill/README.md.
 *
 * This file is the parent: options, one private fabric and directory per scenario,
 * the worker processes (this program again, exec'ed with --worker so that the
 * preload applies), the deadline, fault injection through softverbs-ctl, R2CC's
 * incident reports, and the output. The workers are in worker.c.
 */
#include "tools/drill/drill.h"
#include "shim/stats.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DRILL_GRACE_NS	   1000000000 /* after a worker fails, the others may still report */
#define DRILL_TERM_NS	   500000000  /* from SIGTERM to SIGKILL */
#define DRILL_CTL_WAIT_NS  5000000000
#define DRILL_SLOW_GBPS	   1
#define DRILL_MAX_INCIDENT 4096
#define DRILL_MAX_STEPS	   32 /* R2CC_DRILL's (shim/drillspec.h) */
#define DRILL_MAX_DET	   512
#define DRILL_MAX_MOVED	   1024
#define DRILL_TIMELINE_MAX 48 /* events an incident keeps (repair/engine_priv.h MAX_EVENTS) */

extern char **environ;

static const char *const drill_fault_names[] = {
    "none",    "down",	       "blackhole",    "flap",	"slow",	 "kill",
    "ackloss", "blackhole-tx", "blackhole-rx", "fatal", "jitter"};

static volatile sig_atomic_t drill_stop;

struct drill_paths {
	char exe[PATH_MAX];
	char softverbs[PATH_MAX];
	char libr2cc[PATH_MAX];
	char ctl[PATH_MAX];
	char nccl[PATH_MAX];
	char tmp[PATH_MAX];
};

/* Detection and migration times (ms) from R2CC's reports, over the whole run, and
 * (--expect clean-error) the times from the fault to the first application error. */
struct drill_times {
	double detect[DRILL_MAX_INCIDENT], migrate[DRILL_MAX_INCIDENT], back[DRILL_MAX_INCIDENT];
	int nback;
	double app[DRILL_MAX_INCIDENT];
	int ndetect, nmigrate, napp;
};

struct drill_scenario {
	int kind;
	int seed;
	int index;
	char fabric[80];
	char dir[PATH_MAX];
	/* the fault */
	int node, nic, arg;
	int nic2;	  /* --second-fault: the other NIC */
	int hold;	  /* --fault-phase connect: where the workers hold (enum drill_hold) */
	uint64_t trigger; /* inject when this many messages were delivered */
	bool injected, inject_failed;
	uint64_t injected_at;
	int64_t start_ns, injected_ns;
	bool second_injected, second_failed;
	uint64_t second_at;
	int64_t second_ns;
	int killed; /* the rank SIGKILLed (kill), else -1 */
	/* outcome */
	int64_t app_ns; /* the survivors' first application error, 0 if none */
	int64_t end_ns; /* when the last survivor ended */
	int app_rank;
	char app_error[DRILL_ERR_LEN];
	uint64_t delivered, expected, errors;
	int not_interposed; /* workers whose data path was not libr2cc's */
	bool timed_out, pass;
	int ndetect, nmigrate;
	int reports;	    /* workers whose R2CC report was read */
	int repairs;	    /* incidents that were not declared failures */
	uint64_t suspected; /* stalls R2CC's scan suspected (and confirmed or cleared) */
	/* queue pairs whose peer's rkey map came with its exchange message, and
	 * those for which it did not (R2CC fetched it: a message without its map) */
	uint64_t maps_carried, maps_fetched;
	uint64_t maps_later; /* fetched after a move, for keys registered since (--fresh-mr) */
	/* clear-to-send writes the peers were asked about after a fence, and those found
	 * landed and not re-posted (repair/model/cts.h) */
	uint64_t cts_checked, cts_landed;
	int unprotected; /* reports that say not protected, for --expect-unprotected's word */
	/* sends R2CC posted on moved paths, by NCCL's thread and by its repair thread; how
	 * many reports said so */
	uint64_t reposts_nccl, reposts_repair;
	int reposts_said;
	/* --restore: when the NIC came back, when every process of the faulted node had
	 * brought it back (0: not yet), the node's wire bytes per NIC then, and the most
	 * failbacks of the NIC any of its reports counts */
	bool restored, released, seen_down, page_seen;
	int64_t restored_ns, back_ns;
	uint64_t bytes_back[DRILL_MAX_NICS];
	int backs_max;
	double back_ms[DRILL_MAX_INCIDENT]; /* R2CC's failback times (reports) */
	char shares[128];		    /* each NIC's share of the bytes after it */
	uint64_t churned, records_freed;    /* --churn */
	uint64_t churn_conns, churn_msgs, churn_errors, in_repair;
	int64_t churn_destroy_max_ns;
	int nback;
	char why[DRILL_ERR_LEN + 64];
	char stall[256]; /* each node's phase and progress at the deadline */
	double secs;
	/* R2CC's incidents in the reports, for --summary: the classes of their evidence
	 * (a bit each, enum drill_evidence), the queue pairs they moved, the first and
	 * the last detection after the fault (ms; < 0 none) */
	unsigned evidence;
	int incidents, drill_marked; /* drill_marked: those the report says "drill": true */
	/* qps_moved: queue pairs moved, each once per process however often it moved
	 * (from the incidents' timelines; timelines_full: those cut at R2CC's limit, so
	 * that some may be missing); migrations: the reports' "migrated", summed */
	uint64_t qps_moved, migrations;
	int timelines_full;
	double det_first, det_last;
	uint64_t checks; /* check failures: corrupt, duplicate, out of order, late */
	/* --inject, --drill-plan: R2CC_DRILL as the workers got it, its steps, each
	 * worker's ncclAllReduce mark (own messages), and what the reports say: how many
	 * carry the drill, per step how many applied it, the earliest time (unix s) and
	 * the queue pairs; the first reason a step was not applied; the reports whose
	 * unapplied step gives --expect-drill-problem's word */
	char plan[1024];
	int nsteps;
	uint64_t coll_at;
	int drill_reports;
	int step_applied[DRILL_MAX_STEPS];
	double step_unix[DRILL_MAX_STEPS];
	uint64_t step_qps[DRILL_MAX_STEPS];
	bool step_up[DRILL_MAX_STEPS]; /* an up step: it may find nothing still cut */
	char step_why[256];
	int problem;
	/* --inject: each incident's detected_unix, until the steps' times are known */
	double det_unix[DRILL_MAX_DET];
	int ndet_unix;
};

static int drill_fmt(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* snprintf that says whether it all fitted (paths must; messages may be cut). */
static int drill_fmt(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, len, fmt, ap);
	va_end(ap);
	return n >= 0 && (size_t)n < len ? 0 : -ENAMETOOLONG;
}

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

static int drill_parse(int argc, char **argv, struct drill_opts *o)
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

/* ---- paths: everything is found next to this program (build/bin/..) ---- */

static int drill_paths(struct drill_paths *p, const struct drill_opts *o)
{
	char bin[PATH_MAX], build[PATH_MAX], *slash;
	ssize_t n = readlink("/proc/self/exe", p->exe, sizeof(p->exe) - 1);
	const char *tmp = getenv("TMPDIR");

	if (n <= 0) {
		fprintf(stderr, "r2cc-verbs-drill: cannot read /proc/self/exe: %s\n",
			strerror(errno));
		return -1;
	}
	p->exe[n] = '\0';
	snprintf(bin, sizeof(bin), "%s", p->exe);
	slash = strrchr(bin, '/');
	if (slash)
		*slash = '\0';
	snprintf(build, sizeof(build), "%s", bin);
	slash = strrchr(build, '/');
	if (slash)
		*slash = '\0';
	if (drill_fmt(p->softverbs, sizeof(p->softverbs), "%s/softverbs", build) ||
	    drill_fmt(p->libr2cc, sizeof(p->libr2cc), "%s/lib/libr2cc.so", build) ||
	    drill_fmt(p->ctl, sizeof(p->ctl), "%s/softverbs-ctl", bin) ||
	    drill_fmt(p->nccl, sizeof(p->nccl), "%s/tests/ncclstub/libnccl.so.2", build) ||
	    drill_fmt(p->tmp, sizeof(p->tmp), "%s/r2cc-drill.XXXXXX", tmp && *tmp ? tmp : "/tmp")) {
		fprintf(stderr, "r2cc-verbs-drill: paths too long\n");
		return -1;
	}
	if (access(p->ctl, X_OK) != 0) {
		fprintf(stderr, "r2cc-verbs-drill: %s missing (make %s)\n", p->ctl, p->ctl);
		return -1;
	}
	if (drill_fmt(bin, sizeof(bin), "%s/libibverbs.so.1", p->softverbs) ||
	    access(bin, R_OK) != 0) {
		fprintf(stderr, "r2cc-verbs-drill: %s missing (make it)\n", bin);
		return -1;
	}
	if (o->nccl_stub && access(p->nccl, R_OK) != 0) {
		fprintf(stderr, "r2cc-verbs-drill: %s missing (make it, or drop --nccl-stub)\n",
			p->nccl);
		return -1;
	}
	if (o->preload && access(p->libr2cc, R_OK) != 0) {
		fprintf(stderr, "r2cc-verbs-drill: %s missing (make it, or use --no-preload)\n",
			p->libr2cc);
		return -1;
	}
	if (!mkdtemp(p->tmp)) {
		fprintf(stderr, "r2cc-verbs-drill: cannot make %s: %s\n", p->tmp, strerror(errno));
		return -1;
	}
	return 0;
}

static int drill_rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	remove(path);
	return 0;
}

static void drill_rmtree(const char *dir)
{
	nftw(dir, drill_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- processes ---- */

static void drill_on_signal(int sig)
{
	drill_stop = sig;
}

static bool drill_env_ours(const char *kv)
{
	static const char *const keys[] = {
	    "LD_LIBRARY_PATH=",	 "LD_PRELOAD=",		  "SOFTVERBS_FABRIC=", "SOFTVERBS_NODE=",
	    "SOFTVERBS_NICS=",	 "SOFTVERBS_TIME_SCALE=", "SOFTVERBS_FAULT=",  "R2CC_REPORT=",
	    "NCCL_HOSTID=",	 "SOFTVERBS_SHAPING=",	  "R2CC_FAILED_NODE=", "R2CC_FAILED_HCA=",
	    "SOFTVERBS_DMABUF=", "SOFTVERBS_MLX5DV=",	  "R2CC_DRILL=",
	};

	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (strncmp(kv, keys[i], strlen(keys[i])) == 0)
			return true;
	return false;
}

/* The worker's environment: ours on top of the caller's. */
static char **drill_worker_env(const struct drill_opts *o, const struct drill_paths *p,
			       const struct drill_scenario *s, int rank, char *store, size_t len)
{
	size_t n = 0, used = 0;
	char **env;
	const char *ld = getenv("LD_LIBRARY_PATH");
	char nics[256] = "";

	for (char **e = environ; *e; e++)
		n++;
	env = calloc(n + 20, sizeof(*env));
	if (!env)
		return NULL;
	n = 0;
	for (char **e = environ; *e; e++)
		if (!drill_env_ours(*e) &&
		    !(o->restore_ms >= 0 && !strncmp(*e, "R2CC_FAILBACK_MS=", 17)) &&
		    !(o->nccl_net && !strncmp(*e, "NCCL_NET=", 9)) &&
		    !(o->net_plugin && !strncmp(*e, "NCCL_NET_PLUGIN=", 16)))
			env[n++] = *e;
	for (int k = 0; k < o->nics; k++)
		snprintf(nics + strlen(nics), sizeof(nics) - strlen(nics), "%smlx5_%d:%d",
			 k ? "," : "", k, o->gbps > 0 ? (int)o->gbps : 100);
#define DRILL_ENV(...)                                                                             \
	do {                                                                                       \
		int w_ = snprintf(store + used, len - used, __VA_ARGS__);                          \
		if (w_ < 0 || (size_t)w_ >= len - used) {                                          \
			free(env);                                                                 \
			return NULL;                                                               \
		}                                                                                  \
		env[n++] = store + used;                                                           \
		used += (size_t)w_ + 1;                                                            \
	} while (0)
	/* --mlx5dv: the device's libmlx5 stand-in, its NICs passing for mlx5 ones;
	 * --net-plugin: the NCCL test double's folder, where the test plugin is */
	char stubdir[PATH_MAX] = "";
	if (o->net_plugin) {
		snprintf(stubdir, sizeof(stubdir), "%s", p->nccl);
		char *slash = strrchr(stubdir, '/');
		if (slash)
			slash[0] = ':', slash[1] = '\0';
	}
	DRILL_ENV("LD_LIBRARY_PATH=%s%s%s%s%s%s", stubdir, o->mlx5dv ? p->softverbs : "",
		  o->mlx5dv ? "/mlx5:" : "", p->softverbs, ld && *ld ? ":" : "", ld ? ld : "");
	if (o->net_plugin)
		DRILL_ENV("NCCL_NET_PLUGIN=%s", o->net_plugin);
	if (o->nccl_net)
		DRILL_ENV("NCCL_NET=%s", o->nccl_net);
	if (o->mlx5dv)
		DRILL_ENV("SOFTVERBS_MLX5DV=1");
	/* R2CC_TEST_PRELOAD goes first (the sanitizer runtime, README: Tests). */
	if (o->preload) {
		const char *first = getenv("R2CC_TEST_PRELOAD");
		DRILL_ENV("LD_PRELOAD=%s%s%s", first && *first ? first : "",
			  first && *first ? ":" : "", p->libr2cc);
	}
	DRILL_ENV("SOFTVERBS_FABRIC=%s", s->fabric);
	DRILL_ENV("SOFTVERBS_NODE=node%d", rank / o->per_node);
	DRILL_ENV("NCCL_HOSTID=node%d", rank / o->per_node);
	DRILL_ENV("SOFTVERBS_NICS=%s", nics);
	if (o->gbps > 0)
		DRILL_ENV("SOFTVERBS_SHAPING=1");
	if (o->declare_node >= 0) {
		DRILL_ENV("R2CC_FAILED_NODE=%d", o->declare_node);
		DRILL_ENV("R2CC_FAILED_HCA=mlx5_%d", o->declare_nic);
	}
	DRILL_ENV("SOFTVERBS_TIME_SCALE=%g", o->time_scale);
	if (o->flush)
		DRILL_ENV("SOFTVERBS_DMABUF=1");
	DRILL_ENV("R2CC_REPORT=%s/r2cc-report.%d", s->dir, rank);
	/* --fresh-mr: the process that stops is the faulted node's (the one that
	 * moves to another NIC, so that its peer translates its new keys) */
	if (o->fresh_mr)
		DRILL_ENV("DRILL_FRESH_STOP=%d", s->node * o->per_node);
	if (o->restore_ms >= 0)
		DRILL_ENV("R2CC_FAILBACK_MS=%d", o->failback_ms);
	if (s->plan[0])
		DRILL_ENV("R2CC_DRILL=%s", s->plan);
#undef DRILL_ENV
	env[n] = NULL;
	return env;
}

static pid_t drill_spawn_worker(const struct drill_opts *o, const struct drill_paths *p,
				const struct drill_scenario *s, int rank)
{
	char a[13][40], log[PATH_MAX + 32], store[32768];
	char *argv[44];
	char **env;
	int n = 0, fd;
	pid_t pid;

	env = drill_worker_env(o, p, s, rank, store, sizeof(store));
	if (!env)
		return -1;
	snprintf(a[0], sizeof(a[0]), "%d", rank);
	snprintf(a[1], sizeof(a[1]), "%d", o->procs);
	snprintf(a[2], sizeof(a[2]), "%d", o->nics);
	snprintf(a[3], sizeof(a[3]), "%d", s->seed);
	snprintf(a[4], sizeof(a[4]), "%d", o->messages);
	snprintf(a[5], sizeof(a[5]), "%d", o->window);
	snprintf(a[6], sizeof(a[6]), "%llu", (unsigned long long)o->max_size);
	snprintf(a[7], sizeof(a[7]), "%g", o->timeout_s);
	snprintf(a[8], sizeof(a[8]), "%d", o->qp_timeout);
	snprintf(a[9], sizeof(a[9]), "%d", o->retry_cnt);
	snprintf(a[10], sizeof(a[10]), "%d", o->qps);
	argv[n++] = (char *)"r2cc-verbs-drill";
	argv[n++] = (char *)"--worker";
	argv[n++] = (char *)"--rank";
	argv[n++] = a[0];
	argv[n++] = (char *)"--procs";
	argv[n++] = a[1];
	argv[n++] = (char *)"--nics";
	argv[n++] = a[2];
	argv[n++] = (char *)"--seed";
	argv[n++] = a[3];
	argv[n++] = (char *)"--messages";
	argv[n++] = a[4];
	argv[n++] = (char *)"--window";
	argv[n++] = a[5];
	argv[n++] = (char *)"--max-size";
	argv[n++] = a[6];
	argv[n++] = (char *)"--timeout";
	argv[n++] = a[7];
	argv[n++] = (char *)"--ib-timeout";
	argv[n++] = a[8];
	argv[n++] = (char *)"--retry-cnt";
	argv[n++] = a[9];
	argv[n++] = (char *)"--qps";
	argv[n++] = a[10];
	argv[n++] = (char *)"--dir";
	argv[n++] = (char *)s->dir;
	if (o->selftest_corrupt)
		argv[n++] = (char *)"--selftest-corrupt";
	if (o->flush)
		argv[n++] = (char *)"--flush";
	if (o->no_fusion)
		argv[n++] = (char *)"--no-fusion";
	if (o->mlx5dv) {
		argv[n++] = (char *)"--mlx5dv";
		argv[n++] = (char *)(o->mlx5dv == 2 ? "ooo" : "plain");
	}
	if (o->fresh_mr)
		argv[n++] = (char *)"--fresh-mr";
	if (o->churn)
		argv[n++] = (char *)"--churn";
	if (o->pattern != drill_pattern_default()) {
		argv[n++] = (char *)"--nccl-version";
		argv[n++] = (char *)o->pattern->name;
	}
	if (o->nccl_stub) {
		argv[n++] = (char *)"--nccl-lib";
		argv[n++] = (char *)p->nccl;
	}
	if (s->hold != DRILL_HOLD_NONE) {
		argv[n++] = (char *)"--hold-connect";
		argv[n++] = (char *)(s->hold == DRILL_HOLD_INIT ? "init" : "rts");
	}
	if (s->plan[0]) {
		snprintf(a[11], sizeof(a[11]), "%llu", (unsigned long long)s->coll_at);
		argv[n++] = (char *)"--collective-at";
		argv[n++] = a[11];
		if (!o->inject_own)
			argv[n++] = (char *)"--collective-sum";
	}
	argv[n] = NULL;
	snprintf(log, sizeof(log), "%s/worker%d.log", s->dir, rank);
	pid = fork();
	if (pid == 0) {
		fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (fd >= 0) {
			dup2(fd, STDOUT_FILENO);
			dup2(fd, STDERR_FILENO);
		}
		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		execve(p->exe, argv, env);
		_exit(127);
	}
	free(env);
	return pid;
}

static int drill_ctl(const struct drill_paths *p, const struct drill_scenario *s,
		     char *const args[]);

/* RoCE: no byte of the scenario may have left the lossless class (softverbs-ctl
 * list's lossy_bytes, every NIC); a failure names the NIC. */
/* Runs softverbs-ctl list: its output (appended to the scenario's ctl.log), open at its
 * first line, or NULL when it failed. */
static FILE *drill_ctl_list(const struct drill_paths *p, const struct drill_scenario *s)
{
	char *list[] = {(char *)"list", NULL}, path[PATH_MAX + 16];
	struct stat st;
	FILE *f;
	long from;

	snprintf(path, sizeof(path), "%s/ctl.log", s->dir);
	from = stat(path, &st) == 0 ? (long)st.st_size : 0;
	if (drill_ctl(p, s, list) != 0 || !(f = fopen(path, "r")))
		return NULL;
	fseek(f, from, SEEK_SET);
	return f;
}

static void drill_check_lossless(const struct drill_paths *p, struct drill_scenario *s)
{
	char line[512];
	FILE *f = drill_ctl_list(p, s);
	bool listed = false;

	if (!f) {
		snprintf(s->why, sizeof(s->why), "softverbs-ctl list of %s failed", s->fabric);
		return;
	}
	while (fgets(line, sizeof(line), f)) {
		const char *l = strstr(line, " lossy_bytes="), *node = strstr(line, "node=");
		const char *nic = strstr(line, " name=");
		unsigned long long n;

		if (strncmp(line, "nic ", 4) || !l || sscanf(l, " lossy_bytes=%llu", &n) != 1)
			continue;
		listed = true;
		if (n && !s->why[0])
			snprintf(s->why, sizeof(s->why),
				 "%llu bytes left the lossless class (%.*s, %.*s)", n,
				 node ? (int)strcspn(node, " ") : 0, node ? node : "",
				 nic ? (int)strcspn(nic + 1, " ") : 0, nic ? nic + 1 : "");
	}
	fclose(f);
	if (!listed && !s->why[0])
		snprintf(s->why, sizeof(s->why), "softverbs-ctl list of %s shows no NIC",
			 s->fabric);
}

/* Runs softverbs-ctl with its output in the scenario's ctl.log; 0 if it succeeded. */
static int drill_ctl(const struct drill_paths *p, const struct drill_scenario *s,
		     char *const args[])
{
	char *argv[16], log[PATH_MAX + 16];
	posix_spawn_file_actions_t fa;
	int n = 0, status = 0, rc;
	int64_t end = drill_now_ns() + DRILL_CTL_WAIT_NS;
	pid_t pid;

	argv[n++] = (char *)"softverbs-ctl";
	argv[n++] = (char *)"--fabric";
	argv[n++] = (char *)s->fabric;
	for (int i = 0; args[i] && n < 15; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	snprintf(log, sizeof(log), "%s/ctl.log", s->dir);
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log, O_WRONLY | O_CREAT | O_APPEND,
					 0600);
	posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
	rc = posix_spawn(&pid, p->ctl, &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (rc)
		return -rc;
	while ((rc = waitpid(pid, &status, WNOHANG)) == 0) {
		struct timespec ts = {0, 200000};

		if (drill_now_ns() > end) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			return -ETIMEDOUT;
		}
		nanosleep(&ts, NULL);
	}
	return rc > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -EIO;
}

static double drill_qp_timeout_ms(const struct drill_opts *o)
{
	return 4.096e-3 * (double)(1ull << o->qp_timeout) * (o->retry_cnt + 1) * o->time_scale;
}

/* R2CC's stall floor as the workers get it: R2CC_STALL_MS, or its default (auto). */
static double drill_stall_floor_ms(void)
{
	const char *v = getenv("R2CC_STALL_MS");
	char *end;
	long ms = v ? strtol(v, &end, 10) : 0;

	return v && *v && !*end && ms > 0 ? (double)ms : 20.0;
}

/* ---- --restore ---- */

/* Process pid's failbacks of mlx5_<nic> and whether the NIC is up, from its live
 * statistics page (shim/stats.h); -1 when the page is not there or has another
 * layout. */
static int drill_failbacks_live(pid_t pid, int nic, bool *up)
{
	char path[64], name[32];
	struct stat sb;
	int fd, n = -1;
	struct r2cc_stats_page *pg;

	*up = false;
	snprintf(path, sizeof(path), "/dev/shm/" R2CC_STATS_PREFIX "%d", (int)pid);
	snprintf(name, sizeof(name), "mlx5_%d", nic);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	if (fstat(fd, &sb) != 0 || sb.st_size < (off_t)sizeof(*pg)) {
		close(fd);
		return -1;
	}
	pg = mmap(NULL, sizeof(*pg), PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (pg == MAP_FAILED)
		return -1;
	if (__atomic_load_n(&pg->magic, __ATOMIC_ACQUIRE) == R2CC_STATS_MAGIC &&
	    pg->version == R2CC_STATS_VERSION && pg->nic_size == sizeof(struct r2cc_nic))
		for (int i = 0; i < pg->nnics && i < R2CC_MAX_NICS; i++)
			if (!strcmp(pg->nics[i].name, name)) {
				n = __atomic_load_n(&pg->nics[i].failbacks, __ATOMIC_RELAXED);
				*up = __atomic_load_n(&pg->nics[i].state, __ATOMIC_RELAXED) ==
				      R2CC_NIC_UP;
			}
	munmap(pg, sizeof(*pg));
	return n;
}

/* The faulted node's wire bytes (sent and received) on each NIC, from softverbs-ctl
 * list; 0 when every NIC was found. */
static int drill_node_bytes(const struct drill_opts *o, const struct drill_paths *p,
			    const struct drill_scenario *s, uint64_t *out)
{
	char line[512], node[40];
	FILE *f = drill_ctl_list(p, s);
	int found = 0;

	if (!f)
		return -1;
	snprintf(node, sizeof(node), " node=node%d ", s->node);
	while (fgets(line, sizeof(line), f)) {
		const char *nm = strstr(line, " name=mlx5_"), *tx = strstr(line, " tx_bytes=");
		const char *rx = strstr(line, " rx_bytes=");
		unsigned long long a, b;
		int k;

		if (strncmp(line, "nic", 3) || !strstr(line, node) || !nm || !tx || !rx ||
		    sscanf(nm, " name=mlx5_%d", &k) != 1 || k < 0 || k >= o->nics ||
		    sscanf(tx, " tx_bytes=%llu", &a) != 1 || sscanf(rx, " rx_bytes=%llu", &b) != 1)
			continue;
		out[k] = a + b;
		found |= 1 << k;
	}
	fclose(f);
	return found == (1 << o->nics) - 1 ? 0 : -1;
}

/* The most failbacks a process may make in the faulted run: the hold-down starts at
 * R2CC_FAILBACK_MS and at most doubles per failback, so n failbacks span at least
 * FAILBACK x (2^n - 2) ms; one more after the flapping ends. */
static int drill_backs_allowed(const struct drill_opts *o)
{
	return (int)floor(log2(o->restore_ms / o->failback_ms + 2.0)) + 1;
}

/* One step of --restore, from the parent's loop: the NIC back at its time, then
 * the failback watched in the faulted node's statistics pages; the workers'
 * trickle ends once every one of them has had the NIC up again, after a
 * failback, for 100 ms. */
static void drill_restore_step(const struct drill_opts *o, const struct drill_paths *p,
			       struct drill_scenario *s, struct drill_status *st, const pid_t *pids,
			       int64_t now)
{
	int64_t limit;
	bool all = true;

	if (!s->injected || s->inject_failed || s->released)
		return;
	for (int r = s->node * o->per_node; r < (s->node + 1) * o->per_node; r++) {
		bool up;

		if (pids[r] > 0 && drill_failbacks_live(pids[r], s->nic, &up) >= 0) {
			s->page_seen = true;
			s->seen_down = s->seen_down || !up;
		}
	}
	if (!s->restored) {
		char node[32], nic[32];
		char *args[] = {(char *)"fault", node, nic, (char *)"up", NULL};

		if (now < s->injected_ns + (int64_t)(o->restore_ms * 1e6))
			return;
		snprintf(node, sizeof(node), "node%d", s->node);
		snprintf(nic, sizeof(nic), "mlx5_%d", s->nic);
		s->restored = true;
		s->restored_ns = now;
		if (drill_ctl(p, s, args)) {
			snprintf(s->why, sizeof(s->why), "the NIC could not be restored");
			s->released = true;
			atomic_store(&st[0].back_done, 1);
		}
		return;
	}
	for (int r = s->node * o->per_node; r < (s->node + 1) * o->per_node; r++) {
		bool up;

		all = all && pids[r] > 0 && drill_failbacks_live(pids[r], s->nic, &up) >= 1 && up;
	}
	if (!all)
		s->back_ns = 0;
	else if (!s->back_ns)
		s->back_ns = now;
	limit = s->restored_ns + (int64_t)((2.0 * o->restore_ms + 4.0 * o->failback_ms) * 1e6) +
		3000000000LL;
	if (s->back_ns && now - s->back_ns >= 100000000LL) {
		if (drill_node_bytes(o, p, s, s->bytes_back) && !s->why[0])
			snprintf(s->why, sizeof(s->why), "softverbs-ctl list of the node failed");
		s->released = true;
		atomic_store(&st[0].back_done, 1);
	} else if (now > limit) {
		if (!s->why[0])
			snprintf(s->why, sizeof(s->why),
				 "mlx5_%d was not back in every process of node%d %.1f s after "
				 "its restore%s",
				 s->nic, s->node, (double)(now - s->restored_ns) / 1e9,
				 !s->page_seen	? " (no R2CC statistics page of this layout was "
						  "readable: R2CC_STATS=0, or another R2CC version)"
				 : s->seen_down ? ""
						: " (R2CC never had it down: restored before its "
						  "failure was found?)");
		s->released = true;
		s->back_ns = 0;
		atomic_store(&st[0].back_done, 1);
	}
}

/* After the run: the NIC's failbacks within what the hold-down allows, and each NIC's
 * share of the node's wire bytes since the failback a third (1/K) again. */
static void drill_restore_check(const struct drill_opts *o, const struct drill_paths *p,
				struct drill_scenario *s)
{
	uint64_t end[DRILL_MAX_NICS] = {0}, sum = 0;
	char *shares = s->shares;
	bool even = true;

	if (s->why[0] || !s->released || !s->back_ns)
		return;
	if (drill_node_bytes(o, p, s, end)) {
		snprintf(s->why, sizeof(s->why), "softverbs-ctl list of the node failed");
		return;
	}
	for (int k = 0; k < o->nics; k++)
		sum += end[k] - s->bytes_back[k];
	/* --second-fault: that NIC stays down, and the others share its load */
	int up = o->second_ms >= 0 ? o->nics - 1 : o->nics;
	for (int k = 0; k < o->nics && sum; k++) {
		double share = (double)(end[k] - s->bytes_back[k]) / (double)sum;
		bool down = o->second_ms >= 0 && k == s->nic2;

		snprintf(shares + strlen(shares), sizeof(s->shares) - strlen(shares), "%s%.3f",
			 k ? "/" : "", share);
		even = even && fabs(share - (down ? 0.0 : 1.0 / up)) <= 0.08;
	}
	if (!sum || !even)
		snprintf(
		    s->why, sizeof(s->why),
		    "after the failback the node's NICs carried %s of its %llu wire bytes, not "
		    "1/%d each%s",
		    sum ? shares : "none", (unsigned long long)sum, up,
		    up < o->nics ? " (none on the NIC still down)" : "");
}

/* The NICs of a node that carry connections: all of them with NIC fusion; without
 * it those its processes' connections took (a fault elsewhere would test nothing). */
static uint64_t drill_node_nics(const struct drill_opts *o, int node)
{
	uint64_t all = (1ull << o->nics) - 1, m = 0;
	if (!o->pattern->one_nic && !o->no_fusion)
		return all;
	for (int p = node * o->per_node; p < (node + 1) * o->per_node; p++)
		for (int q = 0; q < o->procs; q++)
			if (q != p)
				m |= 1ull << drill_pair_nic(o, p, q) |
				     1ull << drill_pair_nic(o, q, p);
	return m ? m : all;
}

/* The k-th (mod their count) NIC of mask m. */
static int drill_nth_nic(uint64_t m, uint64_t k)
{
	k %= (uint64_t)__builtin_popcountll(m);
	for (int i = 0;; i++)
		if (m >> i & 1 && !k--)
			return i;
}

/*
 * --inject: R2CC_DRILL for the drawn fault, @0 from each process's first collective:
 * node<n>/mlx5_<k>=KIND@0, with --fault-nics all one step per NIC of the node (the
 * drawn one first), with --second-fault MS a second step on the other NIC @<MS>ms.
 * --drill-plan: that plan as given.
 */
static void drill_plan_text(const struct drill_opts *o, struct drill_scenario *s)
{
	char kind[32];
	size_t n;

	if (o->drill_plan) {
		snprintf(s->plan, sizeof(s->plan), "%s", o->drill_plan);
	} else {
		if (s->kind == DRILL_FAULT_FLAP)
			snprintf(kind, sizeof(kind), "flap:%d", s->arg);
		else
			snprintf(kind, sizeof(kind), "%s", drill_fault_names[s->kind]);
		for (int i = 0; i < (o->fault_all_nics ? o->nics : 1); i++) {
			n = strlen(s->plan);
			snprintf(s->plan + n, sizeof(s->plan) - n, "%snode%d/mlx5_%d=%s@0",
				 i ? ";" : "", s->node, (s->nic + i) % o->nics, kind);
		}
		n = strlen(s->plan);
		if (o->second_ms >= 0)
			snprintf(s->plan + n, sizeof(s->plan) - n, ";node%d/mlx5_%d=%s@%.0fms",
				 s->node, s->nic2, kind, o->second_ms);
	}
	s->nsteps = 1;
	for (const char *c = s->plan; *c; c++)
		s->nsteps += *c == ';';
}

/* Where, what and when, all from the seed. */
static void drill_plan(const struct drill_opts *o, struct drill_scenario *s)
{
	uint64_t h = drill_hash((uint64_t)s->seed, (uint64_t)s->kind, 0x4641554c54ull, 0);
	uint64_t expected = (uint64_t)o->procs * (uint64_t)(o->procs - 1) * (uint64_t)o->messages;
	double frac = 0.15 + (double)(drill_mix(h) % 1000) / 1000.0 * 0.5;

	s->node = (int)(h % (uint64_t)(o->procs / o->per_node));
	uint64_t used = drill_node_nics(o, s->node);
	s->nic = drill_nth_nic(used, h >> 20);
	/* the second fault: another NIC that carries connections if there is one */
	uint64_t rest = used & ~(1ull << s->nic);
	if (!rest)
		rest = ((1ull << o->nics) - 1) & ~(1ull << s->nic);
	s->nic2 = rest ? drill_nth_nic(rest, h >> 32) : s->nic;
	s->hold = DRILL_HOLD_NONE;
	if (o->fault_phase == DRILL_AT_CONNECT && s->kind != DRILL_FAULT_NONE &&
	    s->kind != DRILL_FAULT_KILL)
		s->hold = (h >> 44) & 1 ? DRILL_HOLD_RTS : DRILL_HOLD_INIT;
	s->trigger = (uint64_t)(frac * (double)expected);
	if (s->trigger < 1)
		s->trigger = 1;
	if (o->restore_ms >= 0) {
		/* early, so that most of the traffic comes after the restore */
		s->trigger = (uint64_t)((0.10 + (double)(drill_mix(h) % 1000) / 1000.0 * 0.15) *
					(double)expected);
		if (s->trigger < 1)
			s->trigger = 1;
	}
	if (s->kind == DRILL_FAULT_FLAP && o->flap_ms) {
		s->arg = o->flap_ms;
	} else if (s->kind == DRILL_FAULT_FLAP) {
		/* Down phases outlast the QP transport timeout, as a flap that hurts does. */
		s->arg = (int)ceil(1.5 * drill_qp_timeout_ms(o));
		if (s->arg < 50)
			s->arg = 50;
	} else if (s->kind == DRILL_FAULT_SLOW) {
		s->arg = DRILL_SLOW_GBPS;
	} else if (s->kind == DRILL_FAULT_JITTER) {
		/* Delays of every request by up to R2CC's stall floor (20 ms by
		 * default): the longest pause of a healthy port that R2CC promises to
		 * tolerate beyond its queue, so it must raise no alarm. It follows
		 * R2CC_STALL_MS, not --time-scale: R2CC's floor is a time of its own,
		 * which no transport timeout scales. */
		s->arg = (int)ceil(drill_stall_floor_ms());
	}
	/* --inject, --drill-plan: every worker's collective once all workers together
	 * delivered the trigger's messages, where softverbs-ctl's fault would come; or
	 * (--inject-at own) once it delivered the same fraction of its own */
	if (o->inject || o->drill_plan) {
		uint64_t own = (uint64_t)(o->procs - 1) * (uint64_t)o->messages;

		s->coll_at = o->inject_own ? (uint64_t)(frac * (double)own) : s->trigger;
		if (s->coll_at < 1)
			s->coll_at = 1;
		drill_plan_text(o, s);
	}
}

/* softverbs-ctl fault node<n> mlx5_<nic> KIND [ARG]; 0 if it worked. */
static int drill_ctl_fault(const struct drill_paths *p, const struct drill_scenario *s, int n)
{
	char node[32], nic[32], arg[32];
	char *args[] = {(char *)"fault", node, nic, (char *)drill_fault_names[s->kind], arg, NULL};

	snprintf(node, sizeof(node), "node%d", s->node);
	snprintf(nic, sizeof(nic), "mlx5_%d", n);
	snprintf(arg, sizeof(arg), "%d", s->arg);
	if (s->kind != DRILL_FAULT_FLAP && s->kind != DRILL_FAULT_SLOW &&
	    s->kind != DRILL_FAULT_JITTER)
		args[4] = NULL;
	return drill_ctl(p, s, args);
}

/* Is it time for the fault? */
static bool drill_fault_due(const struct drill_opts *o, const struct drill_scenario *s,
			    uint64_t delivered)
{
	if (o->fault_phase == DRILL_AT_TRAFFIC)
		return delivered >= s->trigger;
	/* connect: every worker has its QPs and has published them */
	for (int r = 0; r < o->procs; r++)
		if (!drill_file_exists(s->dir, "ep", r))
			return false;
	return true;
}

/* The fault: on the drawn NIC, or on every NIC of the node one after the other (the drawn
 * one first), or a SIGKILL of the node's worker. */
static void drill_inject(const struct drill_opts *o, const struct drill_paths *p,
			 struct drill_scenario *s, const pid_t *pids, uint64_t delivered)
{
	s->injected = true;
	s->injected_at = delivered;
	s->injected_ns = drill_now_ns();
	if (s->kind == DRILL_FAULT_KILL) {
		int victim = s->node * o->per_node; /* the node's first process */
		if (pids[victim] > 0 && kill(pids[victim], SIGKILL) == 0)
			s->killed = victim;
		else
			s->inject_failed = true;
		return;
	}
	for (int i = 0; i < (o->fault_all_nics ? o->nics : 1); i++)
		if (drill_ctl_fault(p, s, (s->nic + i) % o->nics))
			s->inject_failed = true;
	/* The workers hold until the fault is in (or could not be put in). */
	if (s->hold != DRILL_HOLD_NONE && drill_file_put(s->dir, "fault", 0, &s->node, sizeof(int)))
		s->inject_failed = true;
}

/* --inject, --drill-plan: the fault's start is the first worker's collective. */
static void drill_watch_collectives(const struct drill_opts *o, struct drill_scenario *s,
				    struct drill_status *st)
{
	for (int r = 0; r < o->procs; r++) {
		int64_t ns = atomic_load(&st[r].coll_ns);

		if (ns && (!s->injected || ns < s->injected_ns)) {
			s->injected = true;
			s->injected_ns = ns;
			s->injected_at = atomic_load(&st[r].coll_all);
		}
	}
}

static void drill_inject_second(const struct drill_paths *p, struct drill_scenario *s,
				uint64_t delivered)
{
	s->second_injected = true;
	s->second_at = delivered;
	s->second_ns = drill_now_ns();
	if (drill_ctl_fault(p, s, s->nic2))
		s->second_failed = true;
}

/* --inject: every step of the plan applied by some process to some queue pairs, as
 * its report says. */
static const char *drill_steps_missed(const struct drill_scenario *s)
{
	static char why[DRILL_ERR_LEN];

	if (!s->drill_reports)
		return "no R2CC report says what became of R2CC_DRILL (a libr2cc.so without "
		       "the drill?)";
	for (int k = 0; k < s->nsteps && k < DRILL_MAX_STEPS; k++)
		if (!s->step_applied[k]) {
			snprintf(why, sizeof(why), "drill step %d was applied in no process%s%s",
				 k + 1, s->step_why[0] ? ": " : "", s->step_why);
			return why;
		} else if (!s->step_qps[k] && !s->step_up[k]) {
			snprintf(why, sizeof(why), "drill step %d cut no queue pair in any process",
				 k + 1);
			return why;
		}
	return NULL;
}

/* Why the fault (or the second fault) tested nothing; NULL when it was in time. */
static const char *drill_fault_missed(const struct drill_opts *o, const struct drill_scenario *s)
{
	if (s->kind == DRILL_FAULT_NONE)
		return NULL;
	if (!s->injected)
		return o->inject ? "no worker made its collective: the drill's steps never began"
				 : "the fault was never injected";
	if (s->inject_failed)
		return s->kind == DRILL_FAULT_KILL
			   ? "the worker could not be killed"
			   : "the fault was not injected (softverbs-ctl failed)";
	if (o->fault_phase == DRILL_AT_CONNECT && s->injected_at > 0)
		return "the fault came after the traffic had started";
	if (s->injected_at >= s->expected)
		return "the fault came after the traffic had ended";
	if (o->inject)
		return drill_steps_missed(s);
	if (o->second_ms < 0)
		return NULL;
	if (!s->second_injected)
		return "the second fault was never injected";
	if (s->second_failed)
		return "the second fault was not injected (softverbs-ctl failed)";
	if (s->second_at >= s->expected)
		return "the second fault came after the traffic had ended";
	return NULL;
}

/* ---- R2CC's incident reports ---- */

static int drill_scan_key(const char *text, const char *key, double *out, int room)
{
	const char *q = text;
	int n = 0;

	while (n < room && (q = strstr(q, key))) {
		bool whole =
		    (q == text || strchr("\" \t\n,{", q[-1])) && strchr("\" \t:=", q[strlen(key)]);
		char *end;
		double v;

		q += strlen(key);
		if (!whole)
			continue; /* part of another key, e.g. max_detect_ms */
		while (*q == '"' || *q == ' ' || *q == ':' || *q == '=' || *q == '\t')
			q++;
		v = strtod(q, &end);
		if (end != q && v >= 0)
			out[n++] = v;
	}
	return n;
}

/*
 * R2CC's JSON report, read as far as the comparison needs: a member of an object, the
 * elements of an array, strings, numbers and booleans. The report is R2CC's own
 * output (shim/report.c), so this is no general parser: it only keeps strings and
 * nesting apart.
 */

/* Where the JSON value at p ends: one past a string, object or array, at the comma or
 * closing bracket after a scalar. */
static const char *drill_json_end(const char *p)
{
	int depth = 0;
	bool str = false;

	for (; *p; p++) {
		if (str) {
			if (*p == '\\' && p[1])
				p++;
			else if (*p == '"' && !depth)
				return p + 1;
			else if (*p == '"')
				str = false;
		} else if (*p == '"') {
			str = true;
		} else if (*p == '{' || *p == '[') {
			depth++;
		} else if (*p == '}' || *p == ']' || *p == ',') {
			if (!depth)
				return p;
			if (*p != ',' && --depth == 0)
				return p + 1;
		}
	}
	return p;
}

static const char *drill_json_ws(const char *p)
{
	while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
		p++;
	return p;
}

/* The value of member `key` of the object at obj, or NULL. */
static const char *drill_json_get(const char *obj, const char *key)
{
	const char *p = drill_json_ws(obj);
	size_t len = strlen(key);

	if (*p != '{')
		return NULL;
	p = drill_json_ws(p + 1);
	while (*p == '"') {
		const char *name = p + 1, *v;

		p = drill_json_end(p);
		p = drill_json_ws(p);
		if (*p != ':')
			return NULL;
		v = drill_json_ws(p + 1);
		if ((size_t)(p - name) >= len + 1 && !strncmp(name, key, len) && name[len] == '"')
			return v;
		p = drill_json_ws(drill_json_end(v));
		if (*p != ',')
			return NULL;
		p = drill_json_ws(p + 1);
	}
	return NULL;
}

/* The n-th element of the array at arr, or NULL past its end. */
static const char *drill_json_at(const char *arr, int n)
{
	const char *p = arr ? drill_json_ws(arr) : NULL;

	if (!p || *p != '[')
		return NULL;
	p = drill_json_ws(p + 1);
	for (int i = 0; *p && *p != ']'; i++) {
		if (i == n)
			return p;
		p = drill_json_ws(drill_json_end(p));
		if (*p != ',')
			return NULL;
		p = drill_json_ws(p + 1);
	}
	return NULL;
}

static double drill_json_num(const char *obj, const char *key, double dflt)
{
	const char *v = drill_json_get(obj, key);
	char *end;
	double x = v ? strtod(v, &end) : 0;

	return v && end != v ? x : dflt;
}

static bool drill_json_true(const char *obj, const char *key)
{
	const char *v = drill_json_get(obj, key);

	return v && !strncmp(v, "true", 4);
}

/* Member `key`'s string, unescaped (a \u escape as '?'), cut to fit; "" if none. */
static void drill_json_str(const char *obj, const char *key, char *buf, size_t len)
{
	const char *v = drill_json_get(obj, key);
	size_t n = 0;

	if (v && *v == '"')
		for (v++; *v && *v != '"' && n + 1 < len; v++) {
			if (*v == '\\' && v[1]) {
				v++;
				if (*v == 'u' && v[1] && v[2] && v[3] && v[4]) {
					v += 4;
					buf[n++] = '?';
					continue;
				}
				buf[n++] = *v == 'n' ? ' ' : *v == 't' ? ' ' : *v;
				continue;
			}
			buf[n++] = *v;
		}
	if (len)
		buf[n] = '\0';
}

/*
 * The classes of an incident's evidence (what repair/ writes: the cause of the
 * incident's first detection), for comparing runs whose fault came different ways.
 * "same NIC/path as qp 0x.. (CAUSE)" is classed by its CAUSE.
 */
enum drill_evidence {
	DRILL_EV_DECLARED,
	DRILL_EV_FAILBACK,
	DRILL_EV_PEER,
	DRILL_EV_SELFTEST,
	DRILL_EV_PORT,
	DRILL_EV_DEAD,
	DRILL_EV_NEW_PATH,
	DRILL_EV_RETRY,
	DRILL_EV_ERROR_WC,
	DRILL_EV_QP_EVENT,
	DRILL_EV_LATE,
	DRILL_EV_STALL,
	DRILL_EV_OTHER,
	DRILL_EV_CLASSES,
};

static const char *const drill_evidence_names[] = {
    "declared",	    "failback",	      "peer-notice",	"self-test",	    "port-event",
    "dead-device",  "new-path-error", "retry-exceeded", "error-completion", "qp-error-event",
    "created-late", "stall",	      "other"};

static int drill_evidence_class(const char *ev)
{
	static const struct {
		const char *text;
		bool prefix;
		int cls;
	} rules[] = {
	    {"declared", true, DRILL_EV_DECLARED},
	    {"failback", true, DRILL_EV_FAILBACK},
	    {"peer notice", true, DRILL_EV_PEER},
	    {"self-test through", false, DRILL_EV_SELFTEST},
	    {"port error event", false, DRILL_EV_PORT},
	    {"port not active", false, DRILL_EV_PORT},
	    {"device fatal event", false, DRILL_EV_DEAD},
	    {"the device is dead", false, DRILL_EV_DEAD},
	    {"on its new path", false, DRILL_EV_NEW_PATH},
	    {"error completion (status 12)", true, DRILL_EV_RETRY},
	    {"error completion", true, DRILL_EV_ERROR_WC},
	    {"QP error event", false, DRILL_EV_QP_EVENT},
	    {"created on a NIC that has failed", false, DRILL_EV_LATE},
	    {"waited", false, DRILL_EV_STALL},
	};

	if (!strncmp(ev, "same NIC as ", 12) || !strncmp(ev, "same path as ", 13)) {
		const char *in = strchr(ev, '(');
		if (in)
			ev = in + 1;
	}
	for (size_t i = 0; i < sizeof(rules) / sizeof(rules[0]); i++)
		if (rules[i].prefix ? !strncmp(ev, rules[i].text, strlen(rules[i].text))
				    : strstr(ev, rules[i].text) != NULL)
			return rules[i].cls;
	return DRILL_EV_OTHER;
}

/* One JSON report's incidents (classes, queue pairs moved, --inject's detection
 * times) and drill section (the steps' states). */
static void drill_read_json(const struct drill_opts *o, struct drill_scenario *s, const char *text)
{
	const char *inc = drill_json_get(text, "incidents"), *e;
	const char *drill = drill_json_get(text, "drill");
	const char *steps = drill ? drill_json_get(drill, "steps") : NULL;
	char ev[160], state[32], why[200];
	unsigned moved[DRILL_MAX_MOVED];
	int nmoved = 0;

	for (int i = 0; (e = drill_json_at(inc, i)); i++) {
		const char *tl = drill_json_get(e, "timeline"), *te;
		double d = drill_json_num(e, "detected_unix", -1);
		int j;

		drill_json_str(e, "evidence", ev, sizeof(ev));
		s->evidence |= 1u << drill_evidence_class(ev);
		s->incidents++;
		s->drill_marked += drill_json_true(e, "drill");
		s->migrations += (uint64_t)drill_json_num(e, "migrated", 0);
		if (o->inject && d > 0 && s->ndet_unix < DRILL_MAX_DET)
			s->det_unix[s->ndet_unix++] = d;
		/* the queue pairs this process moved (repair/migrate.c's event "qp 0x..: A ->
		 * B (peer C -> D), re-posted ..."), each once however often it moved */
		for (j = 0; (te = drill_json_at(tl, j)); j++) {
			unsigned qpn;
			int k;

			drill_json_str(te, "event", ev, sizeof(ev));
			if (sscanf(ev, "qp 0x%x:", &qpn) != 1 || !strstr(ev, " (peer ") ||
			    !strstr(ev, "), re-posted "))
				continue;
			for (k = 0; k < nmoved && moved[k] != qpn; k++)
				;
			if (k == nmoved && nmoved < DRILL_MAX_MOVED)
				moved[nmoved++] = qpn;
		}
		s->timelines_full += j >= DRILL_TIMELINE_MAX;
	}
	s->qps_moved += (uint64_t)nmoved;
	if (!drill || *drill != '{')
		return;
	s->drill_reports++;
	bool problem = false;
	for (int i = 0; (e = drill_json_at(steps, i)); i++) {
		int k = (int)drill_json_num(e, "step", i + 1) - 1;
		double at = drill_json_num(e, "applied_unix", 0);

		if (k < 0 || k >= DRILL_MAX_STEPS)
			continue;
		drill_json_str(e, "state", state, sizeof(state));
		drill_json_str(e, "why", why, sizeof(why));
		char kind[32];
		drill_json_str(e, "kind", kind, sizeof(kind));
		s->step_up[k] = !strcmp(kind, "up");
		if (!strcmp(state, "applied")) {
			s->step_applied[k]++;
			s->step_qps[k] += (uint64_t)drill_json_num(e, "qps", 0);
			if (at > 0 && (!s->step_unix[k] || at < s->step_unix[k]))
				s->step_unix[k] = at;
			continue;
		}
		if (!s->step_why[0])
			snprintf(s->step_why, sizeof(s->step_why), "step %d %s%s%s", k + 1,
				 state[0] ? state : "not applied", why[0] ? ": " : "", why);
		if (o->expect_drill_problem && strstr(why, o->expect_drill_problem))
			problem = true;
	}
	s->problem += problem;
}

static void drill_read_reports(const struct drill_opts *o, struct drill_scenario *s,
			       struct drill_times *t)
{
	for (int r = 0; r < o->procs; r++) {
		static const char *const suffix[] = {".json", ""};

		for (int k = 0; k < 2; k++) {
			char path[PATH_MAX + 64], *text;
			FILE *f;
			long len;
			int n, found;

			snprintf(path, sizeof(path), "%s/r2cc-report.%d%s", s->dir, r, suffix[k]);
			f = fopen(path, "r");
			if (!f)
				continue;
			fseek(f, 0, SEEK_END);
			len = ftell(f);
			rewind(f);
			text = len > 0 && len < (1 << 24) ? calloc(1, (size_t)len + 1) : NULL;
			found = 0;
			if (text && fread(text, 1, (size_t)len, f) == (size_t)len) {
				/* detected_ns is R2CC's CLOCK_MONOTONIC time of the
				 * detection, the clock the injection time is read on.
				 * --inject: from the steps' applied times instead, known
				 * once every report is read (below). */
				double ns[DRILL_MAX_INCIDENT];
				n = drill_scan_key(text, "detected_ns", ns,
						   DRILL_MAX_INCIDENT - t->ndetect);
				for (int i = 0; i < n; i++)
					if (s->injected && !o->inject &&
					    ns[i] >= (double)s->injected_ns) {
						t->detect[t->ndetect++] =
						    (ns[i] - (double)s->injected_ns) / 1e6;
						s->ndetect++;
					}
				found += n;
				n = drill_scan_key(text, "detect_ms", t->detect + t->ndetect,
						   DRILL_MAX_INCIDENT - t->ndetect);
				t->ndetect += n;
				s->ndetect += n;
				found += n;
				n = drill_scan_key(text, "migrate_ms", t->migrate + t->nmigrate,
						   DRILL_MAX_INCIDENT - t->nmigrate);
				t->nmigrate += n;
				s->nmigrate += n;
				found += n;
				n = drill_scan_key(text, "failback_ms", t->back + t->nback,
						   DRILL_MAX_INCIDENT - t->nback);
				for (int i = 0; i < n && s->nback < DRILL_MAX_INCIDENT; i++)
					s->back_ms[s->nback++] = t->back[t->nback + i];
				t->nback += n;
				found += n;
				/* the faulted NIC's failbacks: in its entry of "nics" */
				char nicname[48];
				const char *e;
				double fb[1];
				snprintf(nicname, sizeof(nicname), "\"name\":\"mlx5_%d\"", s->nic);
				if (k == 0 && r / o->per_node == s->node &&
				    (e = strstr(text, nicname)) &&
				    drill_scan_key(e, "failbacks", fb, 1) == 1 &&
				    fb[0] > s->backs_max)
					s->backs_max = (int)fb[0];
				for (const char *q = text; (q = strstr(q, "\"declared\":false"));
				     q++)
					s->repairs++;
				double sus[1], maps[DRILL_MAX_INCIDENT];
				if (drill_scan_key(text, "suspected", sus, 1) == 1)
					s->suspected += (uint64_t)sus[0];
				if (drill_scan_key(text, "reposts_nccl_thread", sus, 1) == 1) {
					s->reposts_nccl += (uint64_t)sus[0];
					s->reposts_said++;
				}
				if (drill_scan_key(text, "reposts_repair_thread", sus, 1) == 1)
					s->reposts_repair += (uint64_t)sus[0];
				if (k == 0 && drill_scan_key(text, "qp_records_freed", sus, 1) == 1)
					s->records_freed += (uint64_t)sus[0];
				if (k == 0 &&
				    drill_scan_key(text, "qp_destroyed_in_repair", sus, 1) == 1)
					s->in_repair += (uint64_t)sus[0];
				n = drill_scan_key(text, "peer_maps_carried", maps,
						   DRILL_MAX_INCIDENT);
				for (int i = 0; i < n; i++)
					s->maps_carried += (uint64_t)maps[i];
				n = drill_scan_key(text, "peer_maps_fetched", maps,
						   DRILL_MAX_INCIDENT);
				for (int i = 0; i < n; i++)
					s->maps_fetched += (uint64_t)maps[i];
				n = drill_scan_key(text, "peer_maps_later", maps,
						   DRILL_MAX_INCIDENT);
				for (int i = 0; i < n; i++)
					s->maps_later += (uint64_t)maps[i];
				n = drill_scan_key(text, "cts_checked", maps, DRILL_MAX_INCIDENT);
				for (int i = 0; i < n; i++)
					s->cts_checked += (uint64_t)maps[i];
				n = drill_scan_key(text, "cts_landed", maps, DRILL_MAX_INCIDENT);
				for (int i = 0; i < n; i++)
					s->cts_landed += (uint64_t)maps[i];
				/* a whole JSON report, at exit, with or without incidents */
				if (k == 0 && strstr(text, "\"nics\":["))
					found++;
				if (k == 0)
					drill_read_json(o, s, text);
				const char *np;
				if (k == 0 && o->expect_unprotected &&
				    strstr(text, "\"protected\":false") &&
				    (np = strstr(text, "\"not_protected\":\"")) &&
				    strstr(np, o->expect_unprotected))
					s->unprotected++;
			}
			free(text);
			fclose(f);
			if (found) {
				s->reports++;
				break; /* the JSON said it; the text copy would count twice */
			}
		}
	}
}

/* --inject: detection times from the plan's first applied step (the earliest
 * applied_unix of any report) to each incident's detected_unix. */
static void drill_inject_times(struct drill_scenario *s, struct drill_times *t)
{
	double from = 0;

	for (int k = 0; k < DRILL_MAX_STEPS; k++)
		if (s->step_unix[k] > 0 && (!from || s->step_unix[k] < from))
			from = s->step_unix[k];
	for (int i = 0; from && i < s->ndet_unix && t->ndetect < DRILL_MAX_INCIDENT; i++)
		if (s->det_unix[i] >= from) {
			t->detect[t->ndetect++] = (s->det_unix[i] - from) * 1e3;
			s->ndetect++;
		}
}

static int drill_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void drill_print_times(const char *what, double *v, int n)
{
	if (!n) {
		printf(" %s n/a", what);
		return;
	}
	qsort(v, (size_t)n, sizeof(*v), drill_cmp);
	printf(" %s median %.1f ms max %.1f ms (%d)", what,
	       n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v[n - 1], n);
}

/* ---- one scenario ---- */

static void drill_describe_exit(char *buf, size_t len, int rank, int status)
{
	if (WIFEXITED(status))
		snprintf(buf, len, "node%d exited with status %d", rank, WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(buf, len, "node%d died of signal %d (%s)", rank, WTERMSIG(status),
			 strsignal(WTERMSIG(status)));
}

/* The workers' and the fault tool's logs, indented: every line, or (`match`) only those
 * that contain it, at most `max` of them (0: no limit). */
static void drill_dump_logs(const struct drill_opts *o, const struct drill_scenario *s,
			    const char *match, int max)
{
	int shown = 0;

	for (int r = 0; r <= o->procs; r++) {
		char path[PATH_MAX + 32], line[512], label[16];
		FILE *f;

		if (r < o->procs) {
			snprintf(path, sizeof(path), "%s/worker%d.log", s->dir, r);
			snprintf(label, sizeof(label), "node%d", r);
		} else {
			snprintf(path, sizeof(path), "%s/ctl.log", s->dir);
			snprintf(label, sizeof(label), "ctl");
		}
		f = fopen(path, "r");
		if (!f)
			continue;
		while (fgets(line, sizeof(line), f)) {
			if (match && !strstr(line, match))
				continue;
			if (max && shown++ >= max)
				break;
			printf("    [%s] %s%s", label, line, strchr(line, '\n') ? "" : "\n");
		}
		fclose(f);
	}
}

/* Where each worker was when the deadline struck: phase and messages received. */
static void drill_snapshot(const struct drill_opts *o, struct drill_scenario *s,
			   struct drill_status *st)
{
	static const char *const phases[] = {"start", "connect", "run",	  "wait",
					     "drain", "done",	 "failed"};

	s->stall[0] = '\0';
	for (int r = 0; r < o->procs; r++) {
		int ph = atomic_load(&st[r].phase);

		drill_fmt(s->stall + strlen(s->stall), sizeof(s->stall) - strlen(s->stall),
			  "%snode%d %s %llu", r ? ", " : "", r,
			  ph >= 0 && ph <= DRILL_PHASE_FAILED ? phases[ph] : "?",
			  (unsigned long long)atomic_load(&st[r].delivered));
	}
}

/* Why a scenario failed, the most telling reason first. */
static void drill_explain(const struct drill_opts *o, struct drill_scenario *s,
			  struct drill_status *st, int failed_exit, int exit_status,
			  const char *missed)
{
	char first[DRILL_ERR_LEN] = "";
	int64_t first_ns = INT64_MAX;

	/* The earliest failure is the cause; later ones are mostly its consequences. */
	for (int r = 0; r < o->procs; r++) {
		int64_t t = atomic_load(&st[r].err_ns);

		if (atomic_load(&st[r].err_claimed) && t && t < first_ns) {
			first_ns = t;
			snprintf(first, sizeof(first), "%.*s", DRILL_ERR_LEN - 1, st[r].error);
		}
	}
	if (s->timed_out) {
		drill_fmt(s->why, sizeof(s->why),
			  "stalled: timed out after %g s at %llu/%llu messages (%s)%s%s",
			  o->timeout_s, (unsigned long long)s->delivered,
			  (unsigned long long)s->expected, s->stall, first[0] ? "; " : "", first);
	} else if (first[0] && s->injected && first_ns > s->injected_ns) {
		drill_fmt(s->why, sizeof(s->why), "%s [%.0f ms after the fault]", first,
			  (double)(first_ns - s->injected_ns) / 1e6);
	} else if (first[0]) {
		snprintf(s->why, sizeof(s->why), "%s", first);
	} else if (drill_stop) {
		snprintf(s->why, sizeof(s->why), "interrupted (signal %d): workers killed",
			 (int)drill_stop);
	} else if (failed_exit >= 0) {
		drill_describe_exit(s->why, sizeof(s->why), failed_exit, exit_status);
	} else if (missed) {
		snprintf(s->why, sizeof(s->why), "%s", missed);
	} else {
		snprintf(s->why, sizeof(s->why), "%llu/%llu messages delivered",
			 (unsigned long long)s->delivered, (unsigned long long)s->expected);
	}
	/* A crash is never only a consequence: say so even after an earlier cause. */
	if (failed_exit >= 0 && WIFSIGNALED(exit_status) && !strstr(s->why, "died of signal")) {
		char d[96];
		size_t n = strlen(s->why);
		drill_describe_exit(d, sizeof(d), failed_exit, exit_status);
		drill_fmt(s->why + n, sizeof(s->why) - n, "; %s", d);
	}
}

/*
 * --expect clean-error: the fault cannot be repaired (no NIC left on the node, or a peer
 * process died), so the scenario passes only if an error reached the application (an
 * error completion, a fatal async event, a failed verbs call) within --bound of the
 * fault, every surviving worker ended on its own (failed, or done with its own traffic)
 * before the deadline and exited normally, and nothing delivered was corrupt, duplicated
 * or late. Returns true on a pass; else s->why says why.
 */
static bool drill_judge_clean(const struct drill_opts *o, struct drill_scenario *s,
			      struct drill_status *st, const int *status, const char *missed)
{
	char check[DRILL_ERR_LEN] = "";
	int64_t check_ns = INT64_MAX;
	uint64_t checks = 0;
	int bad_exit = -1;
	double ms;

	for (int r = 0; r < o->procs; r++) {
		int64_t t = atomic_load(&st[r].check_ns);

		checks += atomic_load(&st[r].check_failures);
		if (atomic_load(&st[r].check_claimed) && t && t < check_ns) {
			check_ns = t;
			snprintf(check, sizeof(check), "%.*s", DRILL_ERR_LEN - 1,
				 st[r].check_error);
		}
		if (r == s->killed)
			continue;
		if (bad_exit < 0 && !(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) <= 1))
			bad_exit = r;
	}
	ms = s->app_ns ? (double)(s->app_ns - s->injected_ns) / 1e6 : 0;
	if (s->why[0])
		return false;
	if (drill_stop) {
		snprintf(s->why, sizeof(s->why), "interrupted (signal %d): workers killed",
			 (int)drill_stop);
	} else if (missed) {
		snprintf(s->why, sizeof(s->why), "%s", missed);
	} else if (s->timed_out) {
		drill_fmt(s->why, sizeof(s->why), "stalled: timed out after %g s (%s)%s%s",
			  o->timeout_s, s->stall, s->app_ns ? "; first application error: " : "",
			  s->app_ns ? s->app_error : "");
	} else if (checks) {
		drill_fmt(s->why, sizeof(s->why),
			  "%llu check failure(s) (corrupt, duplicate or late): %s",
			  (unsigned long long)checks, check);
	} else if (bad_exit >= 0) {
		drill_describe_exit(s->why, sizeof(s->why), bad_exit, status[bad_exit]);
	} else if (!s->app_ns) {
		snprintf(s->why, sizeof(s->why),
			 "no error reached the application (%llu/%llu messages delivered)",
			 (unsigned long long)s->delivered, (unsigned long long)s->expected);
	} else if (ms < 0) {
		drill_fmt(s->why, sizeof(s->why),
			  "an application error came %.0f ms before the fault: %s", -ms,
			  s->app_error);
	} else if (ms > o->bound_s * 1e3) {
		drill_fmt(s->why, sizeof(s->why),
			  "the first application error came %.0f ms after the fault, over the "
			  "bound of %g s: %s",
			  ms, o->bound_s, s->app_error);
	} else {
		return true;
	}
	return false;
}

/* --expect clean-error: a worker that finished its own traffic waits for the others'
 * done marks; once a worker failed (or was killed) and all that still run only wait,
 * nothing more can come. */
static bool drill_only_waiting(const struct drill_opts *o, const pid_t *pids,
			       struct drill_status *st)
{
	for (int r = 0; r < o->procs; r++)
		if (pids[r] > 0 && atomic_load(&st[r].phase) != DRILL_PHASE_WAIT)
			return false;
	return true;
}

static void drill_run_scenario(const struct drill_opts *o, const struct drill_paths *p,
			       struct drill_scenario *s, struct drill_times *t)
{
	size_t st_len = sizeof(struct drill_status) * (size_t)o->procs;
	pid_t pids[DRILL_MAX_PROCS] = {0};
	int status[DRILL_MAX_PROCS] = {0}, alive = 0, fd, failed_exit = -1;
	bool termed[DRILL_MAX_PROCS] = {false};
	bool clean = o->expect == DRILL_EXPECT_CLEAN;
	int64_t start = drill_now_ns(), deadline, kill_at = INT64_MAX, next_look = 0;
	struct drill_status *st;
	const char *missed;
	char *reset[] = {(char *)"reset", NULL};

	s->expected = (uint64_t)o->procs * (uint64_t)(o->procs - 1) * (uint64_t)o->messages;
	s->start_ns = start;
	s->killed = -1;
	s->app_rank = -1;
	deadline = start + (int64_t)(o->timeout_s * 1e9);
	snprintf(s->fabric, sizeof(s->fabric), "r2cc-drill-%d-%d", (int)getpid(), s->index);
	drill_plan(o, s);
	if (drill_fmt(s->dir, sizeof(s->dir), "%s/s%d-%s-%d", p->tmp, s->index,
		      drill_fault_names[s->kind], s->seed) ||
	    mkdir(s->dir, 0700) != 0) {
		drill_fmt(s->why, sizeof(s->why), "cannot make %s: %s", s->dir, strerror(errno));
		return;
	}
	if (drill_fmt(s->why, sizeof(s->why), "%s/status", s->dir))
		return;
	fd = open(s->why, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || ftruncate(fd, (off_t)st_len) != 0) {
		snprintf(s->why, sizeof(s->why), "cannot make the status file: %s",
			 strerror(errno));
		if (fd >= 0)
			close(fd);
		return;
	}
	st = mmap(NULL, st_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	s->why[0] = '\0';
	if (st == MAP_FAILED) {
		snprintf(s->why, sizeof(s->why), "cannot map the status file");
		return;
	}
	/* A window's worth of messages past the trigger, and always before the end. */
	if (s->kind != DRILL_FAULT_NONE && o->fault_phase == DRILL_AT_TRAFFIC && s->expected > 1 &&
	    !o->inject) {
		uint64_t at = s->trigger + (uint64_t)o->window * (uint64_t)o->procs;
		atomic_store(&st[0].hold_at, at < s->expected ? at : s->expected - 1);
		/* --restore: the trickle from half the messages (and after the fault) */
		if (o->restore_ms >= 0)
			atomic_store(&st[0].back_at,
				     s->expected / 2 > at ? s->expected / 2 : at + 1);
	}
	for (int r = 0; r < o->procs; r++) {
		pids[r] = drill_spawn_worker(o, p, s, r);
		if (pids[r] <= 0) {
			snprintf(s->why, sizeof(s->why), "cannot start worker %d", r);
			kill_at = drill_now_ns();
			break;
		}
		alive++;
	}

	while (alive > 0) {
		struct timespec ts = {0, 1000000};
		uint64_t delivered = 0;
		int64_t now;

		for (int r = 0; r < o->procs; r++) {
			if (pids[r] <= 0 || waitpid(pids[r], &status[r], WNOHANG) != pids[r])
				continue;
			pids[r] = -pids[r];
			alive--;
			if (r == s->killed)
				continue; /* its death is the fault */
			s->end_ns = drill_now_ns();
			if (!(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0)) {
				if (failed_exit < 0)
					failed_exit = r;
				/* Expecting an error, every survivor must end on its own. */
				if (!clean && kill_at == INT64_MAX)
					kill_at = drill_now_ns() + DRILL_GRACE_NS;
			}
		}
		for (int r = 0; r < o->procs; r++)
			delivered += atomic_load(&st[r].delivered);
		if (s->kind != DRILL_FAULT_NONE && !o->inject && !s->injected &&
		    alive == o->procs && drill_fault_due(o, s, delivered)) {
			drill_inject(o, p, s, pids, delivered);
			atomic_store(&st[0].fault_done, 1);
		}
		if (s->plan[0])
			drill_watch_collectives(o, s, st);
		now = drill_now_ns();
		if (o->second_ms >= 0 && !o->inject && s->injected && !s->second_injected &&
		    alive > 0 && now >= s->injected_ns + (int64_t)(o->second_ms * 1e6))
			drill_inject_second(p, s, delivered);
		if (o->restore_ms >= 0 && alive > 0 && (now >= next_look || !s->restored)) {
			drill_restore_step(o, p, s, st, pids, now);
			next_look = now + 10000000LL;
		}
		if (now > deadline && alive > 0 && !s->timed_out) {
			char *list[] = {(char *)"list", NULL};

			s->timed_out = true;
			drill_snapshot(o, s, st);
			/* The device's view of the stall (every QP's state and receive
			 * queue), kept in ctl.log with --keep. */
			drill_ctl(p, s, list);
			if (kill_at > now)
				kill_at = now;
		}
		if (clean && kill_at == INT64_MAX && alive > 0 &&
		    (failed_exit >= 0 || s->killed >= 0) && drill_only_waiting(o, pids, st))
			kill_at = now;
		if (drill_stop && kill_at == INT64_MAX)
			kill_at = drill_now_ns();
		/* SIGTERM first: a worker then exits normally and R2CC writes its report. */
		if (now >= kill_at) {
			int sig = now >= kill_at + DRILL_TERM_NS ? SIGKILL : SIGTERM;

			for (int r = 0; r < o->procs; r++)
				if (pids[r] > 0 && (sig == SIGKILL || !termed[r])) {
					kill(pids[r], sig);
					termed[r] = true;
				}
		}
		if (alive > 0)
			nanosleep(&ts, NULL);
	}
	s->secs = (double)(drill_now_ns() - start) / 1e9;

	for (int r = 0; r < o->procs; r++) {
		int64_t e = atomic_load(&st[r].app_err_ns);

		s->delivered += atomic_load(&st[r].delivered);
		s->errors += atomic_load(&st[r].errors);
		s->checks += atomic_load(&st[r].check_failures);
		s->not_interposed += atomic_load(&st[r].interposed) == 2;
		s->churned += atomic_load(&st[r].churned);
		s->churn_conns += atomic_load(&st[r].churn_conns);
		s->churn_msgs += atomic_load(&st[r].churn_msgs);
		s->churn_errors += atomic_load(&st[r].churn_errors);
		if (atomic_load(&st[r].churn_destroy_max_ns) > s->churn_destroy_max_ns)
			s->churn_destroy_max_ns = atomic_load(&st[r].churn_destroy_max_ns);
		/* The first error the application saw, on a worker that lived on. */
		if (r != s->killed && atomic_load(&st[r].app_claimed) && e &&
		    (!s->app_ns || e < s->app_ns)) {
			s->app_ns = e;
			s->app_rank = r;
			snprintf(s->app_error, sizeof(s->app_error), "%.*s", DRILL_ERR_LEN - 1,
				 st[r].app_error);
		}
	}
	if (o->roce && !s->why[0])
		drill_check_lossless(p, s);
	if (o->restore_ms >= 0)
		drill_restore_check(o, p, s);
	if (drill_ctl(p, s, reset) != 0 && !s->why[0])
		snprintf(s->why, sizeof(s->why), "softverbs-ctl reset of %s failed", s->fabric);
	int det0 = t->ndetect;
	drill_read_reports(o, s, t);
	if (o->inject)
		drill_inject_times(s, t);
	s->det_first = s->det_last = -1;
	for (int i = det0; i < t->ndetect; i++) {
		if (s->det_first < 0 || t->detect[i] < s->det_first)
			s->det_first = t->detect[i];
		if (t->detect[i] > s->det_last)
			s->det_last = t->detect[i];
	}
	/* --fresh-mr: no post waited for the stopped peer (that the new keys were
	 * fetched at all is judged over the run: main) */
	for (int r = 0; o->fresh_mr && r < o->procs; r++) {
		int64_t ns = atomic_load(&st[r].max_post_ns);
		if (ns > 250000000 && !s->why[0])
			snprintf(
			    s->why, sizeof(s->why),
			    "node%d: a data ibv_post_send took %.0f ms (--fresh-mr: 250 at most)",
			    r, ns / 1e6);
	}

	/* --detect-within: every incident of the fault found in time */
	for (int i = det0; o->detect_within_ms > 0 && i < t->ndetect; i++)
		if (t->detect[i] > o->detect_within_ms && !s->why[0])
			snprintf(s->why, sizeof(s->why),
				 "a detection came %.0f ms after the fault "
				 "(--detect-within %g)",
				 t->detect[i], o->detect_within_ms);

	/* A fault run tests nothing unless the fault hit while messages were moving. */
	missed = drill_fault_missed(o, s);
	if (clean) {
		s->pass = drill_judge_clean(o, s, st, status, missed);
		if (s->app_ns && s->injected && t->napp < DRILL_MAX_INCIDENT)
			t->app[t->napp++] = (double)(s->app_ns - s->injected_ns) / 1e6;
	} else {
		s->pass = !s->why[0] && !s->timed_out && failed_exit < 0 && s->errors == 0 &&
			  s->delivered == s->expected && !drill_stop && !missed;
		if (!s->pass && !s->why[0])
			drill_explain(o, s, st, failed_exit,
				      failed_exit >= 0 ? status[failed_exit] : 0, missed);
		/* --expect-unprotected: every worker's report says so, naming the word */
		if (s->pass && o->expect_unprotected && s->unprotected < o->procs) {
			s->pass = false;
			snprintf(s->why, sizeof(s->why),
				 "%d of %d R2CC reports say 'not protected' for '%s'",
				 s->unprotected, o->procs, o->expect_unprotected);
		}
		/* Nothing failed, so nothing may have been repaired: a migration here is a
		 * false repair, whatever the data say. */
		if (s->pass && o->expect == DRILL_EXPECT_NO_REPAIR && o->preload &&
		    s->reports < o->procs) {
			s->pass = false;
			snprintf(s->why, sizeof(s->why),
				 "only %d of %d R2CC reports found: no-repair cannot be judged",
				 s->reports, o->procs);
		}
		/* Every REQ and REP carries its sender's rkey map for the NICs its
		 * queue pairs move between: a fetch instead is a message without it.
		 * Except under R2CC's fault injection (tests/fault/walk.sh): a map that
		 * could not be encoded for want of memory is fetched, and the job's data
		 * are still right, which is what the walk asks. */
		if (s->pass && s->maps_fetched && !getenv("R2CC_FAULT_INJECT")) {
			s->pass = false;
			snprintf(s->why, sizeof(s->why),
				 "%llu queue pair(s) migrated with a peer's rkey map that its "
				 "exchange message did not carry",
				 (unsigned long long)s->maps_fetched);
		}
		/* Re-posts go out on NCCL's own thread (a clear-to-send re-posted on the
		 * repair thread could read a FIFO element NCCL is rewriting), and every
		 * report of a repair says where they went. */
		if (s->pass && o->preload && s->repairs && !getenv("R2CC_FAULT_INJECT") &&
		    (s->reposts_repair || s->reposts_said < s->reports)) {
			s->pass = false;
			snprintf(s->why, sizeof(s->why),
				 "%llu send(s) re-posted on R2CC's repair thread, %llu on the "
				 "application's (%d of %d reports say)",
				 (unsigned long long)s->reposts_repair,
				 (unsigned long long)s->reposts_nccl, s->reposts_said, s->reports);
		}
		/* --churn: the records of the QPs destroyed meanwhile were freed */
		if (s->pass && o->churn && o->preload && (!s->churned || !s->records_freed)) {
			s->pass = false;
			snprintf(
			    s->why, sizeof(s->why),
			    "--churn: %llu QPs created and destroyed, %llu of R2CC's records of "
			    "destroyed QPs freed",
			    (unsigned long long)s->churned, (unsigned long long)s->records_freed);
		}
		/* --churn: connections were made and carried messages */
		if (s->pass && o->churn && o->procs > o->per_node &&
		    (!s->churn_conns || !s->churn_msgs)) {
			s->pass = false;
			snprintf(s->why, sizeof(s->why),
				 "--churn: %llu connections made, %llu messages checked on them",
				 (unsigned long long)s->churn_conns,
				 (unsigned long long)s->churn_msgs);
		}
		if (s->pass && o->restore_ms >= 0 && s->backs_max > drill_backs_allowed(o)) {
			s->pass = false;
			snprintf(s->why, sizeof(s->why),
				 "a process brought mlx5_%d back %d times; its hold-down allows %d",
				 s->nic, s->backs_max, drill_backs_allowed(o));
		}
		/* --expect-drill-problem: a worker's report says why a step was not applied
		 * (a node not in the job and a time after the end are in every report; a
		 * NIC a node lacks, in that node's: the others only see no peer using it) */
		if (s->pass && o->expect_drill_problem && s->problem < 1) {
			s->pass = false;
			snprintf(s->why, sizeof(s->why),
				 "%d of %d R2CC reports (%d with the drill) say a step was not "
				 "applied for '%s'%s%s",
				 s->problem, o->procs, s->drill_reports, o->expect_drill_problem,
				 s->step_why[0] ? "; the first unapplied: " : "", s->step_why);
		}
		if (s->pass && o->expect == DRILL_EXPECT_NO_REPAIR && s->repairs) {
			s->pass = false;
			snprintf(s->why, sizeof(s->why),
				 "false repair: %d incident(s) in R2CC's reports with no failure",
				 s->repairs);
		}
	}
	munmap(st, st_len);
}

/* --summary: one line per scenario with what a comparison of runs needs
 * (tests/drill/inject-compare.sh): key=value, no spaces in a value. wrong: the
 * messages not delivered exactly once (check failures and messages missing). */
static void drill_summary(FILE *f, const struct drill_opts *o, const struct drill_scenario *s)
{
	char ev[256] = "";

	for (int c = 0; c < DRILL_EV_CLASSES; c++)
		if (s->evidence >> c & 1)
			snprintf(ev + strlen(ev), sizeof(ev) - strlen(ev), "%s%s", ev[0] ? "," : "",
				 drill_evidence_names[c]);
	fprintf(f,
		"compare: mode=%s kind=%s link=%s procs=%d seed=%d node=%d nic=%d verdict=%s "
		"evidence=%s qps_moved=%llu%s migrations=%llu wrong=%llu incidents=%d "
		"drill_marked=%d",
		o->inject ? "drill" : "device", drill_fault_names[s->kind], o->roce ? "roce" : "ib",
		o->procs, s->seed, s->node, s->nic, s->pass ? "PASS" : "FAIL", ev[0] ? ev : "none",
		(unsigned long long)s->qps_moved, s->timelines_full ? "+" : "",
		(unsigned long long)s->migrations,
		(unsigned long long)(s->checks +
				     (s->expected > s->delivered ? s->expected - s->delivered : 0)),
		s->incidents, s->drill_marked);
	if (s->det_first >= 0)
		fprintf(f, " detect_ms=%.1f detect_last_ms=%.1f\n", s->det_first, s->det_last);
	else
		fprintf(f, " detect_ms=- detect_last_ms=-\n");
	fflush(f);
}

static void drill_print_scenario(const struct drill_opts *o, const struct drill_scenario *s)
{
	static const char *const holds[] = {"", "init", "rts"};
	char fault[160] = "-", nic[16], kind[32];
	size_t n;

	snprintf(nic, sizeof(nic), o->fault_all_nics ? "all" : "mlx5_%d", s->nic);
	if (s->kind == DRILL_FAULT_FLAP)
		snprintf(kind, sizeof(kind), "flap:%dms", s->arg);
	else if (s->kind == DRILL_FAULT_SLOW)
		snprintf(kind, sizeof(kind), "slow:%dGbps", s->arg);
	else if (s->kind == DRILL_FAULT_JITTER)
		snprintf(kind, sizeof(kind), "jitter:%dms", s->arg);
	else
		snprintf(kind, sizeof(kind), "%s", drill_fault_names[s->kind]);
	if (s->kind == DRILL_FAULT_KILL)
		snprintf(fault, sizeof(fault), "node%d killed", s->node);
	else if (s->kind != DRILL_FAULT_NONE)
		snprintf(fault, sizeof(fault), "node%d/%s %s%s", s->node, nic, kind,
			 o->inject ? " (drill)" : "");
	else if (s->plan[0])
		snprintf(fault, sizeof(fault), "drill plan");
	n = strlen(fault);
	if (s->injected && o->fault_phase == DRILL_AT_CONNECT)
		snprintf(fault + n, sizeof(fault) - n, " at connect/%s +%.2fs", holds[s->hold],
			 (double)(s->injected_ns - s->start_ns) / 1e9);
	else if (s->injected)
		snprintf(fault + n, sizeof(fault) - n, " at %llu/%llu +%.2fs",
			 (unsigned long long)s->injected_at, (unsigned long long)s->expected,
			 (double)(s->injected_ns - s->start_ns) / 1e9);
	n = strlen(fault);
	if (s->second_injected)
		snprintf(fault + n, sizeof(fault) - n, ", then mlx5_%d +%.0fms", s->nic2,
			 (double)(s->second_ns - s->injected_ns) / 1e6);
	else if (o->inject && o->second_ms >= 0 && s->step_unix[0] > 0 && s->step_unix[1] > 0)
		snprintf(fault + n, sizeof(fault) - n, ", then mlx5_%d +%.0fms", s->nic2,
			 (s->step_unix[1] - s->step_unix[0]) * 1e3);
	printf("%-9s seed %-4d fault %-44s messages %llu/%llu errors %llu %s %.1fs",
	       drill_fault_names[s->kind], s->seed, fault, (unsigned long long)s->delivered,
	       (unsigned long long)s->expected, (unsigned long long)s->errors,
	       s->pass ? "PASS" : "FAIL", s->secs);
	if (o->expect == DRILL_EXPECT_CLEAN && s->app_ns && s->injected)
		printf(" app-error +%.0fms node%d, all ended +%.1fs",
		       (double)(s->app_ns - s->injected_ns) / 1e6, s->app_rank,
		       (double)(s->end_ns - s->injected_ns) / 1e9);
	else if (o->expect == DRILL_EXPECT_CLEAN)
		printf(" app-error none");
	if (s->ndetect || s->nmigrate)
		printf(" incidents %d", s->ndetect > s->nmigrate ? s->ndetect : s->nmigrate);
	if (s->suspected)
		printf(" suspected %llu", (unsigned long long)s->suspected);
	if (s->plan[0]) {
		int applied = 0;
		for (int k = 0; k < s->nsteps && k < DRILL_MAX_STEPS; k++)
			applied += s->step_applied[k] > 0;
		printf(" drill-steps %d/%d applied", applied, s->nsteps);
		if (o->drill_plan && s->step_why[0])
			printf(" (%s)", s->step_why);
	}
	if (s->maps_carried || s->maps_fetched)
		printf(" maps %llu/%llu", (unsigned long long)s->maps_carried,
		       (unsigned long long)(s->maps_carried + s->maps_fetched));
	if (s->maps_later)
		printf(" later-maps %llu", (unsigned long long)s->maps_later);
	if (s->cts_checked)
		printf(" cts-landed %llu/%llu", (unsigned long long)s->cts_landed,
		       (unsigned long long)s->cts_checked);
	if (o->churn)
		printf(" churned %llu freed %llu conns %llu msgs %llu errors %llu in-repair %llu "
		       "destroy-max %.1f ms",
		       (unsigned long long)s->churned, (unsigned long long)s->records_freed,
		       (unsigned long long)s->churn_conns, (unsigned long long)s->churn_msgs,
		       (unsigned long long)s->churn_errors, (unsigned long long)s->in_repair,
		       s->churn_destroy_max_ns / 1e6);
	if (o->restore_ms >= 0 && s->restored)
		printf(" failbacks %d (allowed %d)%s%s", s->backs_max, drill_backs_allowed(o),
		       s->shares[0] ? " shares-after " : "", s->shares);
	if (s->nback) {
		double mx = 0;
		for (int i = 0; i < s->nback; i++)
			mx = s->back_ms[i] > mx ? s->back_ms[i] : mx;
		printf(" failback-max %.1fms", mx);
	}
	if (!s->pass)
		printf(" -- %s", s->why);
	printf("\n");
	if (s->pass && o->expect == DRILL_EXPECT_CLEAN && o->verbose)
		printf("    first application error: %s\n", s->app_error);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	static struct drill_times times;
	struct drill_opts o;
	struct drill_paths p;
	struct sigaction sa;
	uint64_t delivered = 0, expected = 0, maps_later = 0, cts_checked = 0, cts_landed = 0;
	int kinds[DRILL_FAULT_KINDS], nkinds = 0, passed = 0, total = 0, fault_failed = 0;
	int not_interposed = 0;
	FILE *summary = NULL;

	if (drill_parse(argc, argv, &o))
		return 2;
	if (o.worker)
		return drill_worker_main(&o);
	setvbuf(stdout, NULL, _IOLBF, 0);
	/* RoCE: the fabric (read by its first process: a worker, or softverbs-ctl) and
	 * NCCL's settings for it, which the workers and the library inherit. */
	if (o.roce) {
		setenv("SOFTVERBS_LINK", "roce", 1);
		setenv("SOFTVERBS_ROUTED", "1", 1);
		setenv("SOFTVERBS_LOSSLESS_TC", DRILL_ROCE_TC, 1);
		setenv("NCCL_IB_GID_INDEX", "3", 0);
		setenv("NCCL_IB_TC", DRILL_ROCE_TC, 0);
	}
	if (drill_paths(&p, &o))
		return 2;
	if (o.summary && strcmp(o.summary, "-") && !(summary = fopen(o.summary, "a"))) {
		fprintf(stderr, "r2cc-verbs-drill: cannot open %s: %s\n", o.summary,
			strerror(errno));
		drill_rmtree(p.tmp);
		return 2;
	}
	if (o.summary && !summary)
		summary = stdout;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = drill_on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	if (o.fault >= 0)
		kinds[nkinds++] = o.fault;
	else
		for (int k = DRILL_FAULT_DOWN; k <= DRILL_FAULT_SLOW; k++)
			kinds[nkinds++] = k;

	printf("r2cc-verbs-drill: %d processes x %d NICs, %d messages per connection "
	       "(window %d, 0..%llu B%s), %s, QP timeout %.0f ms (time scale %g), deadline %g s\n",
	       o.procs, o.nics, o.messages, o.window, (unsigned long long)o.max_size,
	       o.flush	     ? (o.no_fusion ? ", GPU flush, no NIC fusion" : ", GPU flush")
	       : o.no_fusion ? ", no NIC fusion"
			     : "",
	       o.preload ? "LD_PRELOAD=libr2cc.so" : "no preload (baseline)",
	       drill_qp_timeout_ms(&o), o.time_scale, o.timeout_s);
	if (o.roce)
		printf("  RoCE v2: a subnet per rail, routed; GID index %s, traffic class %s, "
		       "lossless class %s\n",
		       getenv("NCCL_IB_GID_INDEX"), getenv("NCCL_IB_TC"), DRILL_ROCE_TC);
	if (o.pattern != drill_pattern_default())
		printf(
		    "  verbs of NCCL %s: %d request slots, %d-byte FIFO elements (idx at %d)%s%s\n",
		    o.pattern->releases, o.pattern->slots, o.pattern->elem, o.pattern->off_idx,
		    o.pattern->one_nic ? ", each connection on one NIC, clear-to-send on qps[0]"
				       : "",
		    o.pattern->send_no_rq ? ", no receive queue where nothing is received" : "");
	if (o.inject)
		printf("  fault from R2CC_DRILL (libr2cc.so's own drill, not softverbs-ctl): the "
		       "drawn fault @0 from each worker's ncclAllReduce at its own share of its "
		       "messages; detection from the earliest applied step (reports' "
		       "applied_unix)\n");
	else if (o.drill_plan)
		printf("  R2CC_DRILL=\"%s\": each worker's ncclAllReduce at its own share of its "
		       "messages\n",
		       o.drill_plan);
	else if (o.fault != DRILL_FAULT_NONE && o.fault != DRILL_FAULT_KILL)
		printf("  fault by softverbs-ctl; detection from its call\n");
	if (o.fault_phase == DRILL_AT_CONNECT || o.fault_all_nics || o.second_ms >= 0 ||
	    o.expect == DRILL_EXPECT_CLEAN) {
		printf("  fault %s%s",
		       o.fault_phase == DRILL_AT_CONNECT ? "while connecting" : "in traffic",
		       o.fault_all_nics ? ", on every NIC of the node" : "");
		if (o.second_ms >= 0)
			printf(", a second NIC of the node %g ms later", o.second_ms);
		if (o.expect == DRILL_EXPECT_CLEAN)
			printf("; expect a clean error within %g s", o.bound_s);
		printf("\n");
	}
	for (int k = 0; k < nkinds && !drill_stop; k++) {
		for (int i = 0; i < o.seeds && !drill_stop; i++) {
			struct drill_scenario s;

			memset(&s, 0, sizeof(s));
			s.kind = kinds[k];
			s.seed = o.first_seed + i;
			s.index = total;
			drill_run_scenario(&o, &p, &s, &times);
			drill_print_scenario(&o, &s);
			if (summary)
				drill_summary(summary, &o, &s);
			if (o.verbose)
				drill_dump_logs(&o, &s, NULL, 0);
			else if (!s.pass) { /* what R2CC said, for a failure seen only in CI */
				drill_dump_logs(&o, &s, "R2CC WARN", 12);
				drill_dump_logs(&o, &s, "Sanitizer", 12);
				drill_dump_logs(&o, &s, "runtime error", 4);
			}
			total++;
			passed += s.pass;
			delivered += s.delivered;
			expected += s.expected;
			not_interposed += s.not_interposed;
			maps_later += s.maps_later;
			cts_checked += s.cts_checked;
			cts_landed += s.cts_landed;
			if (!s.pass && s.kind != DRILL_FAULT_NONE && s.kind != DRILL_FAULT_SLOW &&
			    o.expect == DRILL_EXPECT_PASS)
				fault_failed++;
			if (!o.keep)
				drill_rmtree(s.dir);
		}
	}
	if (summary && summary != stdout)
		fclose(summary);
	if (o.keep)
		printf("kept: %s\n", p.tmp);
	else
		drill_rmtree(p.tmp);
	if (drill_stop)
		printf("interrupted by signal %d\n", (int)drill_stop);
	if (o.preload && not_interposed)
		printf(
		    "warning: libr2cc.so was preloaded but the verbs data path was not R2CC's in "
		    "%d worker run(s): R2CC inactive (R2CC_MODE=0 or a bad setting?)\n",
		    not_interposed);
	if (fault_failed && !times.ndetect)
		printf(
		    "note: %d NIC-fault scenario(s) failed and no R2CC incident report was found: "
		    "without hot repair a dead NIC reaches the application (error completions "
		    "or a stall), as with plain NCCL\n",
		    fault_failed);
	/* --fresh-mr shows nothing unless some scenario's new keys were fetched after a
	 * move (a fault that came late moves the QPs after the new registration, whose
	 * keys the exchange then carries). */
	bool vacuous = o.fresh_mr && o.preload && !maps_later && o.fault != DRILL_FAULT_NONE;
	if (vacuous) {
		printf("--fresh-mr: no scenario fetched a peer's rkey map after a move; nothing "
		       "was shown\n");
		passed = 0;
	}
	if (o.expect_landed && !cts_landed) {
		printf("--expect-landed: no repair found a clear-to-send write landed (%llu "
		       "asked about)\n",
		       (unsigned long long)cts_checked);
		passed = 0;
	}
	printf("%s messages %llu/%llu scenarios %d/%d",
	       passed == total && total > 0 && !drill_stop ? "PASS" : "FAIL",
	       (unsigned long long)delivered, (unsigned long long)expected, passed, total);
	drill_print_times("detection", times.detect, times.ndetect);
	drill_print_times("migration", times.migrate, times.nmigrate);
	if (o.restore_ms >= 0)
		drill_print_times("failback", times.back, times.nback);
	if (o.expect == DRILL_EXPECT_CLEAN)
		drill_print_times("app-error", times.app, times.napp);
	if (cts_checked)
		printf(" cts-landed %llu/%llu", (unsigned long long)cts_landed,
		       (unsigned long long)cts_checked);
	printf("\n");
	return passed == total && total > 0 && !drill_stop ? 0 : 1;
}
