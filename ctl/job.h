/*
 * The job a communicator belongs to, as the control plane knows it: the
 * NCCL wrappers stamp R2CC's rendezvous into every unique id they create and
 * register each new communicator's rank with it. Registration runs on a
 * short-lived thread so that ncclCommInitRank never waits for other ranks
 * (they may be created in a group from one thread); the directory it brings
 * back gives the communicator record the node of every rank.
 */
#ifndef R2CC_REPAIR_JOB_H
#define R2CC_REPAIR_JOB_H

#include <stdbool.h>

struct r2cc_ctl_dir;
struct r2cc_job_reg;

/*
 * Where a communicator's directory goes once its registration is done: hot
 * repair keeps it for finding and reaching peers while the communicator lives
 * (repair/engine.h, r2cc_repair_dir_ops). The control plane sits below the
 * engine and does not call it by name: the NCCL door, which knows both, sets
 * these before it begins any registration. Unset, or while take() says no, a
 * directory is left and freed when its registration is done.
 */
struct r2cc_job_dir_ops {
	bool (*take)(void);			   /* directories are wanted now */
	void (*add)(struct r2cc_ctl_dir *dir);	   /* takes ownership */
	void (*release)(struct r2cc_ctl_dir *dir); /* its communicator is gone */
};

/* Sets the hand-over (the same ops every time; may be called again). */
void r2cc_job_set_dir_ops(const struct r2cc_job_dir_ops *ops);

/* After the real ncclGetUniqueId: write the rendezvous into bytes 40-127. */
void r2cc_job_stamp(unsigned char id[128]);

/* Before the real init: start registering rank/nranks with the id's job.
 * NULL when the id has no R2CC marker (warned once) or registration cannot
 * start; the communicator then runs without the control plane. */
struct r2cc_job_reg *r2cc_job_register_begin(const unsigned char id[128], int rank, int nranks);

/* After the real init: the communicator the registration belongs to (NULL
 * when the init failed). Consumes reg. */
void r2cc_job_register_end(struct r2cc_job_reg *reg, void *comm);

/* The communicator is being destroyed: its directory is released (hot repair
 * frees it once no repair uses it). */
void r2cc_job_comm_gone(void *comm);

/* A registration is in flight: its directory may come soon. */
bool r2cc_job_registering(void);

/* Wait until no registration is in flight (tests, exit), at most ms. */
void r2cc_job_quiesce(int ms);

#endif
