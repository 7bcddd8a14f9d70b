/*
 * Test double of struct r2cc_ar2_ops: threads are ranks, host memory is
 * device memory. Every collective is a rendezvous of the communicator's
 * ranks, matched by per-communicator sequence number and checked for equal
 * arguments; the last rank to arrive computes the result for everyone, so a
 * call returns only when the collective is complete (streams are synchronous).
 * An executor whose calls would deadlock under NCCL's rule (each
 * communicator's calls serialised per rank, in issue order) deadlocks here
 * too; the rendezvous times out and records it.
 *
 * Streams and events are modelled for ordering only: each stream carries the
 * set of operations that precede its tail (record copies it into the event,
 * wait merges it in). After a call, dbl_check_order() verifies that every
 * two operations of the rank that touch overlapping memory (one writing) are
 * ordered by streams and events in issue order, that all of them follow the
 * user's earlier work and that the user's stream ends after all of them.
 */
#ifndef R2CC_TESTS_STRATEGIES_DOUBLE_H
#define R2CC_TESTS_STRATEGIES_DOUBLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strategies/allreduce2.h"

#define DBL_MAX_OPS 512

struct dbl_world;

struct dbl_stream {
	uint64_t clock[DBL_MAX_OPS / 64];
};

struct dbl_op {
	int kind; /* DBL_ALLREDUCE ... */
	void *comm;
	bool on_parent;
	size_t count;
	uintptr_t rd[1][2], wr[1][2]; /* [start, end) byte ranges, end == start: none */
	uint64_t deps[DBL_MAX_OPS / 64];
};

enum { DBL_ALLREDUCE, DBL_REDUCE, DBL_BCAST, DBL_SPLIT, DBL_AGREE };

/* One rank: the ctx of its ops table. */
struct dbl_rank {
	struct dbl_world *w;
	int rank;
	void *parent; /* this rank's handle of the world communicator */
	struct dbl_stream user;
	unsigned epoch; /* one per dbl_begin */
	int nops;	/* operations since dbl_begin; op 0 is the user's earlier work */
	struct dbl_op ops[DBL_MAX_OPS];
	int ncalls[5];	       /* per kind, since dbl_begin */
	int parent_allreduces; /* allreduce calls on the parent since dbl_begin */
	int parent_bcasts;     /* broadcast calls on the parent since dbl_begin */
	int aborts;	       /* comm_abort calls, ever */
	int live_subs;	       /* this rank's sub-communicators not yet destroyed */
	int flagged;	       /* of those, how many comm_abort has flagged */
	/* comm_abort as NCCL's: it flags the communicator, then waits (up to 2 s) for
	 * every kernel of the process, that is until every live sub-communicator of
	 * the rank is flagged too; a wait that times out is an error of the rank */
	bool abort_waits_for_all;
	int async_error; /* what comm_async_error reports for sub-communicators */
	/* faults */
	bool fail_split;	 /* this rank's comm_split calls fail */
	bool fail_stream_create; /* this rank's stream_create calls fail */
	bool fail_agree;	 /* this rank's agree call fails */
	char error[256];	 /* first problem seen by the double on this rank */
};

struct dbl_world *dbl_world_new(int nranks);
void dbl_world_free(struct dbl_world *w);
/* True when some rendezvous timed out or saw mismatched arguments. */
bool dbl_world_failed(struct dbl_world *w, char *why, size_t len);
/* Live objects of the whole world: sub-communicators, streams, events. */
int dbl_live_comms(struct dbl_world *w);
int dbl_live_streams(struct dbl_world *w);
int dbl_live_events(struct dbl_world *w);

void dbl_rank_init(struct dbl_rank *r, struct dbl_world *w, int rank);
struct r2cc_ar2_ops dbl_ops(struct dbl_rank *r);
/* Start a new call: forget recorded operations, op 0 = user's earlier work. */
void dbl_begin(struct dbl_rank *r);
/* 0, or -1 with r->error set. */
int dbl_check_order(struct dbl_rank *r);

/* Element arithmetic, shared with the tests' reference. */
double dbl_decode(int dtype, const void *p);   /* floating types */
void dbl_encode(int dtype, double v, void *p); /* floating types, RNE */
bool dbl_is_float(int dtype);
bool dbl_is_signed(int dtype);
void dbl_reduce_elem(int dtype, int op, void *acc, const void *in);

#endif
