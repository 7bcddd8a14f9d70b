/* Command line of r2cc-perf: nccl-tests' flags plus the R2CC extensions, the names of
 * types, reductions and collectives, and nccl-tests' buffer geometry and bandwidth
 * formulas. Plain C, shared by the program and its host-only unit test.
 */
#ifndef R2CC_BENCH_PERF_OPTS_H
#define R2CC_BENCH_PERF_OPTS_H

#include <stddef.h>
#include <stdint.h>

#include "bench/perf_pattern.h"

#define PERF_ALL (-1) /* -d all, -o all, -r all */

struct perf_opts {
	int coll;
	uint64_t minbytes, maxbytes, stepbytes;
	uint64_t stepfactor; /* 0: use stepbytes */
	int nthreads, ngpus;
	int iters, warmup_iters, agg_iters, run_cycles;
	int check;
	int type, op, root; /* PERF_ALL for all */
	int blocking;
	int average; /* 0 rank 0, 1 avg, 2 min, 3 max */
	int parallel_init;
	int timeout_s;
	/* R2CC extensions */
	int nodes, gpus_per_node; /* --nodes/--gpus-per-node: spawn the ranks ourselves */
	int split_cpus;		  /* --split-cpus: each emulated node its own cores */
	int selftest_wrong;
	int nic_table, nic_table_all;
	char nic_node[64]; /* "" = rank 0's node */
	int iters_table;
};

/* Parses argv into *o. argv[0]'s base name selects the collective when it is one of
 * nccl-tests' program names; --coll overrides. Returns 0, 1 when help was printed, or
 * -EINVAL after printing one line naming the bad argument to stderr. */
int perf_opts_parse(struct perf_opts *o, int argc, char **argv);

void perf_opts_usage(const char *prog);

/* "8", "64K", "1.5M", "4G" (binary units as nccl-tests); -1 on error. */
int64_t perf_parse_size(const char *s);

int perf_type_from_name(const char *s);
int perf_op_from_name(const char *s);
int perf_coll_from_name(const char *s);
const char *perf_type_name(int t);
const char *perf_op_name(int op);
const char *perf_coll_name(int coll); /* "allreduce" */
const char *perf_coll_verb(int coll); /* "AllReduce" */
int perf_coll_has_op(int coll);
int perf_coll_has_root(int coll);
/* Whether nccl-tests reports #wrong for the in-place variant (not for alltoall and
 * sendrecv, whose in-place forms overlap their send and receive data). */
int perf_coll_checks_inplace(int coll);

/* Element counts and in-place offsets of one call for `bytes` of type t on n ranks. */
void perf_geom_make(struct perf_geom *g, int coll, uint64_t bytes, int t, int n);

/* nccl-tests' algorithm and bus bandwidth (GB/s) for a call taking sec seconds. */
void perf_bandwidth(int coll, const struct perf_geom *g, int t, int n, double sec, double *algbw,
		    double *busbw);

/* nccl-tests' formatting of the time column (7 characters). */
void perf_format_time(char *buf, size_t len, double usec);

#endif
