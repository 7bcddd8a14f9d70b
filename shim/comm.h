/*
 * The communicator registry: one record per NCCL communicator created
 * through R2CC's wrappers, found from the ncclComm_t with one lock-free
 * lookup (the collective wrappers' only work while nothing has failed).
 * Records carry what the strategies need: rank, size, the node of every
 * rank, the parent of a split, the configuration, and the per-communicator
 * strategy state.
 */
#ifndef R2CC_SHIM_COMM_H
#define R2CC_SHIM_COMM_H

#include <stdbool.h>
#include <stdint.h>

struct r2cc_comm {
	void *comm;		  /* ncclComm_t */
	struct r2cc_comm *parent; /* split/shrink parent, or NULL */
	int rank, nranks;	  /* -1 until known */
	int cuda_dev;
	bool blocking;	   /* from the config; true by default */
	bool internal;	   /* created by R2CC itself (sub-communicators) */
	int nnodes;	   /* 0 until the node map is known */
	int *node_of_rank; /* [nranks], node index in rank order */
	uint64_t job;	   /* control-plane job id, 0 if none */
	void *strategy;	   /* strategies/ per-communicator state */
};

int r2cc_comm_registry_init(void);
struct r2cc_comm *r2cc_comm_add(void *comm, int rank, int nranks, struct r2cc_comm *parent);
void r2cc_comm_remove(void *comm);
int r2cc_comm_count(void);
/* Set the node map (copied) of a registered communicator, and its job id
 * when job is not 0; safe against a concurrent destroy. Returns 0, -ENOENT
 * (gone, or another size) or -ENOMEM. */
int r2cc_comm_set_nodes(void *comm, const int *node_of_rank, int nranks, uint64_t job);
/* Called (from any thread) with a communicator's node count once its map is set
 * (intercept/netcheck.c sets it). */
extern void (*r2cc_comm_nodes_hook)(int nnodes);

extern struct r2cc_map r2cc_comm_map;

#include "shim/map.h"

static inline struct r2cc_comm *r2cc_comm_find(const void *comm)
{
	return (struct r2cc_comm *)r2cc_map_get(&r2cc_comm_map, (uint64_t)(uintptr_t)comm);
}

#endif
