/*
 * The parent's shared definitions: the files of r2cc-verbs-drill that run
 * scenarios (main.c: the run and its output; parse.c: options; proc.c: paths,
 * worker processes and softverbs-ctl; fault.c: the fault's plan, injection and
 * --restore; reports.c: R2CC's incident reports; scenario.c: one scenario). The
 * workers (worker.c) do not use it.
 */
#ifndef R2CC_DRILL_PARENT_H
#define R2CC_DRILL_PARENT_H

#include "tools/drill/drill.h"

#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define DRILL_GRACE_NS	   1000000000 /* after a worker fails, the others may still report */
#define DRILL_TERM_NS	   500000000  /* from SIGTERM to SIGKILL */
#define DRILL_CTL_WAIT_NS  5000000000
#define DRILL_SLOW_GBPS	   1
#define DRILL_MAX_INCIDENT 4096
#define DRILL_MAX_STEPS	   32 /* R2CC_DRILL's (shim/drillspec.h) */
#define DRILL_MAX_DET	   512
#define DRILL_MAX_MOVED	   1024
#define DRILL_TIMELINE_MAX 48 /* events an incident keeps (repair/engine_priv.h MAX_EVENTS) */

extern const char *const drill_fault_names[];

extern volatile sig_atomic_t drill_stop;

struct drill_paths {
	char exe[PATH_MAX];
	char softverbs[PATH_MAX];
	char libr2cc[PATH_MAX];
	char ctl[PATH_MAX];
	char nccl[PATH_MAX];
	char tmp[PATH_MAX];
};

/* Detection and migration times (ms) from R2CC's reports, over the whole run (every
 * process's incidents; first: each scenario's earliest, the fault found at all), and
 * (--expect clean-error) the times from the fault to the first application error. */
struct drill_times {
	double detect[DRILL_MAX_INCIDENT], migrate[DRILL_MAX_INCIDENT], back[DRILL_MAX_INCIDENT];
	double first[DRILL_MAX_INCIDENT];
	int nfirst;
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

int drill_fmt(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

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

extern const char *const drill_evidence_names[];

/* parse.c */
int drill_parse(int argc, char **argv, struct drill_opts *o);

/* proc.c */
int drill_paths(struct drill_paths *p, const struct drill_opts *o);
void drill_rmtree(const char *dir);
void drill_on_signal(int sig);
pid_t drill_spawn_worker(const struct drill_opts *o, const struct drill_paths *p,
			 const struct drill_scenario *s, int rank);
int drill_ctl(const struct drill_paths *p, const struct drill_scenario *s, char *const args[]);
FILE *drill_ctl_list(const struct drill_paths *p, const struct drill_scenario *s);
void drill_check_lossless(const struct drill_paths *p, struct drill_scenario *s);
double drill_qp_timeout_ms(const struct drill_opts *o);
double drill_stall_floor_ms(void);

/* fault.c */
int drill_backs_allowed(const struct drill_opts *o);
void drill_restore_step(const struct drill_opts *o, const struct drill_paths *p,
			struct drill_scenario *s, struct drill_status *st, const pid_t *pids,
			int64_t now);
void drill_restore_check(const struct drill_opts *o, const struct drill_paths *p,
			 struct drill_scenario *s);
void drill_plan(const struct drill_opts *o, struct drill_scenario *s);
bool drill_fault_due(const struct drill_opts *o, const struct drill_scenario *s,
		     uint64_t delivered);
void drill_inject(const struct drill_opts *o, const struct drill_paths *p, struct drill_scenario *s,
		  const pid_t *pids, uint64_t delivered);
void drill_watch_collectives(const struct drill_opts *o, struct drill_scenario *s,
			     struct drill_status *st);
void drill_inject_second(const struct drill_paths *p, struct drill_scenario *s, uint64_t delivered);
const char *drill_fault_missed(const struct drill_opts *o, const struct drill_scenario *s);

/* reports.c */
void drill_read_reports(const struct drill_opts *o, struct drill_scenario *s,
			struct drill_times *t);
void drill_inject_times(struct drill_scenario *s, struct drill_times *t);

/* scenario.c */
void drill_dump_logs(const struct drill_opts *o, const struct drill_scenario *s, const char *match,
		     int max);
void drill_run_scenario(const struct drill_opts *o, const struct drill_paths *p,
			struct drill_scenario *s, struct drill_times *t);

#endif
