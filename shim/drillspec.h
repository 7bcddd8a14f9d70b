/*
 * R2CC_DRILL: a fault plan the library carries out inside a real job (repair/drill.h
 * says how). Parsing is pure: no environment, no allocation.
 *
 *   PLAN := STEP[;STEP...]          (whitespace around items is ignored; empty: no drill)
 *   STEP := NODE/NIC=KIND@TIME
 *   NODE := a node index (decimal, or "node" and the index: 0 = the node of rank 0,
 *           nodes numbered in rank order) or a host name ([A-Za-z0-9._-], not all
 *           digits, not "node" and digits)
 *   NIC  := a NIC name as the device list gives it (mlx5_2; same characters)
 *   KIND := down | blackhole | blackhole-tx | blackhole-rx | ackloss | flap:MS | up
 *           (MS: the flap's half period, 1 to 600000 ms: down MS, up MS, ...)
 *   TIME := N | Nms | Ns | N.Ns (N.N: up to 3 decimals), at most 24 h, then
 *           optionally ":init". Without it the time counts from the process's first
 *           NCCL collective; with it, from the end of its first communicator's init.
 *
 *   e.g. R2CC_DRILL="node1/mlx5_2=blackhole@5s;node1/mlx5_2=up@15s"
 *        R2CC_DRILL="gpu-node-3/mlx5_0=down@2s:init"
 *
 * Each step runs at its own time; steps due at one moment run in the plan's order.
 * Rejected, with one line naming R2CC_DRILL and what it accepts: a step without
 * node, NIC, kind or time, bad characters, unknown kinds, numbers out of range,
 * more than R2CC_DRILL_MAX_STEPS steps, names longer than R2CC_DRILL_NAME_MAX - 1.
 */
#ifndef R2CC_SHIM_DRILLSPEC_H
#define R2CC_SHIM_DRILLSPEC_H

#include <stddef.h>
#include <stdint.h>

#define R2CC_DRILL_MAX_STEPS 32
#define R2CC_DRILL_NAME_MAX  64 /* host and NIC names, with the NUL */
#define R2CC_DRILL_MAX_NODE  65535
#define R2CC_DRILL_MAX_MS    86400000ll /* 24 h */
#define R2CC_DRILL_MAX_FLAP  600000

enum r2cc_drill_kind {
	R2CC_DRILL_UP = 0,
	R2CC_DRILL_DOWN,
	R2CC_DRILL_BLACKHOLE,
	R2CC_DRILL_BLACKHOLE_TX,
	R2CC_DRILL_BLACKHOLE_RX,
	R2CC_DRILL_ACKLOSS,
	R2CC_DRILL_FLAP,
	R2CC_DRILL_KINDS
};

struct r2cc_drill_step {
	int node;			/* node index, or -1: by host name */
	char host[R2CC_DRILL_NAME_MAX]; /* when node < 0 */
	char nic[R2CC_DRILL_NAME_MAX];
	int kind;      /* enum r2cc_drill_kind */
	int arg_ms;    /* flap: the half period */
	int64_t at_ms; /* from the origin */
	int from_init; /* 1: from the first init; 0: the first collective */
	int index;     /* 1-based position in the plan as written */
};

struct r2cc_drill_plan {
	int nsteps; /* 0: no drill */
	struct r2cc_drill_step steps[R2CC_DRILL_MAX_STEPS];
};

/* Parse the raw value of R2CC_DRILL (NULL counts as empty). 0 and *out filled in
 * the plan's order, or -EINVAL with a one-line message in err and *out empty. */
int r2cc_drill_parse(const char *value, struct r2cc_drill_plan *out, char *err, size_t errlen);

/* "blackhole-tx", "flap" ... */
const char *r2cc_drill_kind_name(int kind);

/* One step as the plan writes it ("node1/mlx5_2=flap:200@1500ms:init"). */
void r2cc_drill_step_str(const struct r2cc_drill_step *s, char *buf, size_t len);

#endif
