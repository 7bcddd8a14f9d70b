/*
 * Communicator records (see comm.h). Created by the init/split wrappers after
 * the real call succeeded, removed by destroy/abort before the real call.
 */
#include "shim/comm.h"
#include "shim/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct r2cc_map r2cc_comm_map;
static int ncomms;
/* Serialises record removal with node-map updates from other threads (the
 * control plane's registration threads). Lock order: before the map's lock. */
static pthread_mutex_t comm_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t comm_once = PTHREAD_ONCE_INIT;
static int comm_init_rc;

static void comm_init_once(void)
{
	comm_init_rc = r2cc_map_init(&r2cc_comm_map, 4096);
}

int r2cc_comm_registry_init(void)
{
	pthread_once(&comm_once, comm_init_once);
	return comm_init_rc;
}

struct r2cc_comm *r2cc_comm_add(void *comm, int rank, int nranks, struct r2cc_comm *parent)
{
	if (r2cc_comm_registry_init())
		return NULL;
	struct r2cc_comm *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->comm = comm;
	c->rank = rank;
	c->nranks = nranks;
	c->parent = parent;
	c->cuda_dev = -1;
	c->blocking = true;
	if (r2cc_map_insert(&r2cc_comm_map, (uint64_t)(uintptr_t)comm, c)) {
		R2CC_WARN_ONCE(
		    "communicator registry full; further communicators run as plain NCCL");
		free(c);
		return NULL;
	}
	__atomic_fetch_add(&ncomms, 1, __ATOMIC_RELAXED);
	return c;
}

void r2cc_comm_remove(void *comm)
{
	if (!__atomic_load_n(&r2cc_comm_map.t, __ATOMIC_ACQUIRE))
		return;
	pthread_mutex_lock(&comm_lock);
	struct r2cc_comm *c = r2cc_map_remove(&r2cc_comm_map, (uint64_t)(uintptr_t)comm);
	if (c) {
		__atomic_fetch_sub(&ncomms, 1, __ATOMIC_RELAXED);
		free(c->node_of_rank);
		free(c);
	}
	pthread_mutex_unlock(&comm_lock);
}

int r2cc_comm_count(void)
{
	return __atomic_load_n(&ncomms, __ATOMIC_RELAXED);
}

void (*r2cc_comm_nodes_hook)(int nnodes);

int r2cc_comm_set_nodes(void *comm, const int *node_of_rank, int nranks, uint64_t job)
{
	int *map = malloc((size_t)nranks * sizeof(*map));
	if (!map)
		return -ENOMEM;
	memcpy(map, node_of_rank, (size_t)nranks * sizeof(*map));
	int nnodes = 0;
	for (int i = 0; i < nranks; i++)
		if (map[i] + 1 > nnodes)
			nnodes = map[i] + 1;
	int rc = -ENOENT;
	pthread_mutex_lock(&comm_lock);
	struct r2cc_comm *c = r2cc_comm_find(comm);
	if (c && (c->nranks < 0 || c->nranks == nranks)) {
		int *old = c->node_of_rank;
		c->node_of_rank = map;
		c->nnodes = nnodes;
		if (job)
			c->job = job;
		map = old;
		rc = 0;
	}
	pthread_mutex_unlock(&comm_lock);
	free(map);
	void (*hook)(int) = __atomic_load_n(&r2cc_comm_nodes_hook, __ATOMIC_ACQUIRE);
	if (rc == 0 && hook)
		hook(nnodes);
	return rc;
}
