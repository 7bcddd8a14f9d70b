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

struct r2cc_job_reg;

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
