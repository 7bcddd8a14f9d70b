/*
 * R2CC_DRILL (shim/drillspec.h): NIC faults the library makes itself, inside a
 * real job, so that operators can drill a failure without root, a switch or the
 * subnet manager. The drill stands in for the wire and for nothing else: hot
 * repair's detection, localisation, migration and exactly-once logic run as they
 * do for a real failure.
 *
 * Every process reads the same plan and applies each step, at its own time, to
 * its own queue pairs (NCCL's and R2CC's) whose local end is the drilled NIC (on
 * the drilled node) or whose remote end is (on every other node: the NIC's LID
 * or GID, as the job's directory and the peers' RTR attributes give it). What a
 * queue pair then sees follows the software device's table of losses
 * (softverbs/README.md) by direction:
 *
 *   its requests lost (down, blackhole, blackhole-tx on the local end,
 *   blackhole-rx on the remote end): its sends are held, unposted; what the
 *   hardware completes from then on is not acknowledged (its completion is kept
 *   back);
 *   only its acknowledgements lost (ackloss; blackhole-rx locally, blackhole-tx
 *   remotely): its sends go out and land, their completions are kept back;
 *   down on the local end, besides: the queue pair is moved to ERR at once (the
 *   hardware flushes it), R2CC's port view says DOWN and hot repair gets the port
 *   error event a real port gives.
 *
 * When the queue pair is moved to ERR (hot repair's fence, or NCCL), what was kept
 * back completes with IBV_WC_WR_FLUSH_ERR ahead of the hardware's own flushes and
 * the held sends are posted behind them, as the hardware flushes what is
 * outstanding. After the queue pair's transport timeout (4.096 us x 2^timeout x
 * (retry_cnt + 1), from its RTS attributes) with nothing acknowledged, it goes to
 * ERR as a real one does: the oldest completes with IBV_WC_RETRY_EXC_ERR. On `up`
 * before either, the held sends go out and what was kept back completes, as
 * retries do once a link returns.
 *
 * Cost: with R2CC_DRILL unset nothing here runs. With a plan, the control path
 * (modify, destroy, port queries) records each queue pair's ends; the data path
 * is untouched until a step cuts something: then the contexts of the queue pairs
 * it cuts get filters in place of the provider's post and poll calls (one lookup
 * and one lock per call) for the rest of the process.
 */
#ifndef R2CC_REPAIR_DRILL_H
#define R2CC_REPAIR_DRILL_H

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stdio.h>

/* A plan was given and is being carried out (set at start-up, read freely). */
extern int r2cc_drill_on;
/* Waiting for the first collective (the wrappers' one check, intercept/nccl.c). */
extern int r2cc_drill_wait_collective;

/* At start-up, after the settings: reads the plan, logs it. */
void r2cc_drill_init(void);

/* The origins of the plan's times: the end of the first communicator's init, the
 * first collective. The first call of each counts. */
void r2cc_drill_at_init(void);
void r2cc_drill_at_collective(void);

/* The real ibv_modify_qp through the drill: records the queue pair's ends and
 * timeouts, applies the faults in effect to a queue pair being connected, and lets
 * go of what was held and kept back when it moves to ERR. */
int r2cc_drill_modify(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
		      int (*real)(struct ibv_qp *, struct ibv_qp_attr *, int));
void r2cc_drill_qp_destroyed(struct ibv_qp *qp);
void r2cc_drill_cq_destroyed(struct ibv_cq *cq);
/* R2CC's port view: DOWN while a down step holds the NIC on this node. */
void r2cc_drill_port(struct ibv_context *ctx, struct ibv_port_attr *attr);

/* The queue pair was cut by a step of the drill (an incident it causes is a drill's). */
bool r2cc_drill_cut(const struct ibv_qp *qp);

/* A cutting step of the plan names this NIC of that rank's node (a peer's notice of
 * its NIC's failure is a drill's). Any thread; no lock taken but the directory's. */
struct r2cc_ctl_dir;
bool r2cc_drill_names(const struct r2cc_ctl_dir *dir, int rank, const char *nic);

/* Steps applied so far in this process, and the plan as given ("" when none). */
int r2cc_drill_applied(void);
const char *r2cc_drill_plan_str(void);

/* The report's drill section: text lines and the JSON value of "drill". */
void r2cc_drill_report(FILE *text, FILE *json);

#endif
