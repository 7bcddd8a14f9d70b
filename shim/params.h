/*
 * Settings. Every R2CC_* environment variable is declared once, in the table
 * in params.c (name, type, default, help, validator), read once at start-up
 * into the struct below, and never parsed anywhere else. A bad value is one
 * error line naming the variable and what it accepts; the library then runs as
 * pure pass-through rather than guess.
 */
#ifndef R2CC_SHIM_PARAMS_H
#define R2CC_SHIM_PARAMS_H

#include "shim/cost_params.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum r2cc_mode {
	R2CC_MODE_PASSTHROUGH = 0, /* plain NCCL, bit-identical behaviour */
	R2CC_MODE_BACKUP = 1,	   /* live migration to a single backup NIC */
	R2CC_MODE_BALANCE = 2,	   /* R2CC-Balance (default) */
	R2CC_MODE_AR2 = 3,	   /* Balance + R2CC-AllReduce */
	R2CC_MODE_AUTO = 4,	   /* per call, from the cost model */
};

struct r2cc_params {
	int mode;		/* enum r2cc_mode */
	char failed_node[256];	/* R2CC_FAILED_NODE, raw; parsed by failspec.c */
	char failed_hca[256];	/* R2CC_FAILED_HCA, raw */
	char drill[2048];	/* R2CC_DRILL, raw; parsed by drillspec.c */
	char on_incident[1024]; /* R2CC_ON_INCIDENT: a shell command line, empty = none */
	int on_incident_max;	/* runs per minute */
	int on_incident_timeout_ms;
	int ar_after_repair;  /* 0 = keep mode, 2 or 3 */
	int ar_stage2_chunks; /* K */
	int ar_schedule;      /* 0..3 */
	uint64_t ar_min_bytes;
	int stall_ms;	 /* 0 = adaptive */
	int failback_ms; /* R2CC_FAILBACK_MS: 0 = no failback */
	int debug;	 /* enum r2cc_log_level */
	char debug_file[256];
	char report[256];   /* R2CC_REPORT path, empty = none */
	char oob_root[256]; /* R2CC_OOB_ROOT host:port, empty = from the unique id */
	bool stats;	    /* R2CC_STATS: publish live statistics for r2cc top */
	bool mr_mirror;	    /* R2CC_MR_MIRROR: mirror every MR on every NIC (hot repair) */
	struct r2cc_cost_model cost_model; /* R2CC_COST_MODEL over r2cc_cost_default */
	bool valid;			   /* false: a setting was bad, run as pass-through */
};

extern struct r2cc_params r2cc_param;

/* Reads the environment once (idempotent). Returns 0, or -EINVAL after
 * logging one error per bad variable. */
int r2cc_params_load(void);

/* Parse one variable into *p. Returns 0 or -EINVAL with a message naming the
 * variable and what it accepts in err. Exposed for tests. */
int r2cc_param_set(struct r2cc_params *p, const char *name, const char *value, char *err,
		   size_t errlen);
void r2cc_params_defaults(struct r2cc_params *p);
/* INFO: print every setting that differs from its default. */
void r2cc_params_log_nondefault(const struct r2cc_params *p);
/* The table, for docs and `r2cc doctor`: iterate i = 0.. until NULL. */
const char *r2cc_param_name(int i);
const char *r2cc_param_help(int i);
const char *r2cc_param_default(int i);

#endif
