/*
 * The failure view of each communicator and the AllReduce hook that applies
 * R2CC-AllReduce (R2CC_MODE=3, or auto when the cost model prefers it) to
 * communicators with a degraded node. See failview.c.
 */
#ifndef R2CC_STRATEGIES_FAILVIEW_H
#define R2CC_STRATEGIES_FAILVIEW_H

/* Called once, when the first communicator is created with R2CC active (the
 * NCCL door's first-communicator step, intercept/nccl_real.h): arms the hook
 * when the mode and the declared failures call for it. Returns 0 or -EINVAL. */
int r2cc_strategies_init(void);

#endif
