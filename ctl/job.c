/*
 * Stamping and registration (see job.h). A registration object is shared by
 * the init wrapper and its registration thread; whichever finishes second
 * applies the directory to the communicator record and frees the object.
 * Each communicator's directory is remembered here (comm -> directory) until
 * the communicator is destroyed, when hot repair releases it; a communicator
 * destroyed before its registration finished has its directory released as
 * soon as it comes. The hand-over goes through the ops the NCCL door sets
 * (job.h, struct r2cc_job_dir_ops): hot repair sits above the control plane.
 * Lock order: reg_lock before the communicator registry's
 * writer lock.
 */
#include "ctl/job.h"
#include "ctl/ctl.h"
#include "ctl/hmap.h"
#include "shim/comm.h"
#include "shim/core.h"
#include "shim/log.h"
#include "shim/registry.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Long enough for slow starts of large jobs, short enough to end a thread
 * whose peers never come (the communicator then simply has no directory). */
#define REGISTER_TIMEOUT_MS 120000

struct r2cc_job_reg {
	struct r2cc_job_reg *next; /* registrations in flight */
	struct r2cc_ctl_job job;
	struct r2cc_ctl_member self;
	int rank, nranks;
	void *comm;	/* set by register_end */
	bool init_done; /* register_end ran */
	bool reg_done;	/* the thread finished */
	bool comm_gone; /* destroyed before the thread finished */
	struct r2cc_ctl_dir *dir;
};

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t reg_cond = PTHREAD_COND_INITIALIZER;
static int in_flight;
static struct r2cc_job_reg *regs;    /* in flight, under reg_lock */
static struct r2cc_hmap dir_of_comm; /* comm -> its directory, under reg_lock */

/* Set by the NCCL door before its first registration (job.h). */
static const struct r2cc_job_dir_ops *dir_ops;

void r2cc_job_set_dir_ops(const struct r2cc_job_dir_ops *ops)
{
	__atomic_store_n(&dir_ops, ops, __ATOMIC_RELEASE);
}

static void regs_unlink_locked(struct r2cc_job_reg *reg)
{
	for (struct r2cc_job_reg **pp = &regs; *pp; pp = &(*pp)->next)
		if (*pp == reg) {
			*pp = reg->next;
			return;
		}
}

void r2cc_job_stamp(unsigned char id[128])
{
	int rc = r2cc_ctl_uid_stamp(id);
	if (rc)
		R2CC_WARN("cannot start the control plane (%s); communicators from this id run "
			  "without it",
			  strerror(-rc));
}

/* Both sides done: hand the directory to the communicator, free the rest. */
static void reg_finish(struct r2cc_job_reg *reg)
{
	if (reg->dir && reg->comm) {
		int *nodes = malloc((size_t)reg->nranks * sizeof(int));
		if (nodes) {
			for (int r = 0; r < reg->nranks; r++)
				nodes[r] = r2cc_ctl_dir_node(reg->dir, r);
			if (r2cc_comm_set_nodes(reg->comm, nodes, reg->nranks, reg->job.id) == 0)
				R2CC_INFO("comm %p rank %d/%d: directory of %d nodes from the "
					  "control plane",
					  reg->comm, reg->rank, reg->nranks, reg->dir->nnodes);
		}
		free(nodes);
	}
	/* Hot repair finds and reaches peers through the directories, while the
	 * communicator lives. */
	regs_unlink_locked(reg);
	const struct r2cc_job_dir_ops *ops = __atomic_load_n(&dir_ops, __ATOMIC_ACQUIRE);
	if (reg->dir && reg->comm && !reg->comm_gone && ops && ops->take()) {
		ops->add(reg->dir);
		if (r2cc_hmap_put(&dir_of_comm, (uint64_t)(uintptr_t)reg->comm, reg->dir))
			R2CC_WARN("comm %p: out of memory; its directory stays until exit",
				  reg->comm);
	} else if (reg->dir) {
		r2cc_ctl_dir_leave(reg->dir);
		r2cc_ctl_dir_free(reg->dir);
	}
	free(reg);
}

void r2cc_job_comm_gone(void *comm)
{
	pthread_mutex_lock(&reg_lock);
	struct r2cc_ctl_dir *dir = r2cc_hmap_del(&dir_of_comm, (uint64_t)(uintptr_t)comm);
	for (struct r2cc_job_reg *r = regs; r; r = r->next)
		if (r->comm == comm)
			r->comm_gone = true;
	pthread_mutex_unlock(&reg_lock);
	/* only a directory the ops took is in dir_of_comm */
	if (dir)
		__atomic_load_n(&dir_ops, __ATOMIC_ACQUIRE)->release(dir);
}

static void *reg_thread(void *arg)
{
	struct r2cc_job_reg *reg = arg;
	struct r2cc_ctl_dir *dir = NULL;
	int rc = r2cc_ctl_register(&reg->job, &reg->self, reg->rank, reg->nranks,
				   REGISTER_TIMEOUT_MS, &dir);
	if (rc)
		R2CC_WARN("rank %d/%d: control-plane registration failed (%s); this communicator "
			  "runs without a directory",
			  reg->rank, reg->nranks, strerror(-rc));
	pthread_mutex_lock(&reg_lock);
	reg->dir = rc ? NULL : dir;
	reg->reg_done = true;
	bool last = reg->init_done;
	if (last)
		reg_finish(reg);
	in_flight--;
	pthread_cond_broadcast(&reg_cond);
	pthread_mutex_unlock(&reg_lock);
	return NULL;
}

static void fill_self(struct r2cc_ctl_member *m)
{
	memset(m, 0, sizeof(*m));
	r2cc_host_name(m->host, sizeof(m->host));
	r2cc_node_key(m->node_key, sizeof(m->node_key));
	m->pid = (int32_t)getpid();
	int n = r2cc_nic_count();
	for (int i = 0; i < n && m->nnics < R2CC_CTL_MAX_NICS; i++) {
		const struct r2cc_nic *nic = r2cc_nic_by_index(i);
		struct r2cc_ctl_nic *out = &m->nics[m->nnics++];
		snprintf(out->name, sizeof(out->name), "%s", nic->name);
		out->lid = nic->lid;
		out->port = nic->port;
		out->state = (uint8_t)nic->port_state;
	}
}

struct r2cc_job_reg *r2cc_job_register_begin(const unsigned char id[128], int rank, int nranks)
{
	struct r2cc_ctl_job job;
	if (nranks < 1 || rank < 0 || rank >= nranks)
		return NULL;
	if (!r2cc_ctl_uid_parse(id, &job)) {
		R2CC_WARN_ONCE("a communicator's unique id does not come from an R2CC process (no "
			       "marker); such communicators run without R2CC's control plane");
		return NULL;
	}
	struct r2cc_job_reg *reg = calloc(1, sizeof(*reg));
	if (!reg)
		return NULL;
	reg->job = job;
	reg->rank = rank;
	reg->nranks = nranks;
	fill_self(&reg->self);
	/* Listed before the thread can finish (it takes reg_lock to say so). */
	pthread_mutex_lock(&reg_lock);
	int rc = r2cc_thread_start(reg_thread, reg, "r2cc-reg");
	if (rc == 0) {
		in_flight++;
		reg->next = regs;
		regs = reg;
	}
	pthread_mutex_unlock(&reg_lock);
	if (rc) {
		R2CC_WARN("cannot start a registration thread (%s)", strerror(-rc));
		free(reg);
		return NULL;
	}
	return reg;
}

void r2cc_job_register_end(struct r2cc_job_reg *reg, void *comm)
{
	if (!reg)
		return;
	pthread_mutex_lock(&reg_lock);
	reg->comm = comm;
	reg->init_done = true;
	if (reg->reg_done)
		reg_finish(reg);
	pthread_mutex_unlock(&reg_lock);
}

bool r2cc_job_registering(void)
{
	pthread_mutex_lock(&reg_lock);
	bool any = in_flight > 0;
	pthread_mutex_unlock(&reg_lock);
	return any;
}

void r2cc_job_quiesce(int ms)
{
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += ms / 1000;
	until.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&reg_lock);
	while (in_flight > 0)
		if (pthread_cond_timedwait(&reg_cond, &reg_lock, &until) == ETIMEDOUT)
			break;
	pthread_mutex_unlock(&reg_lock);
}
