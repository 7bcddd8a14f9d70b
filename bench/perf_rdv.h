/* Host-side agreement between the processes of one r2cc-perf job without MPI: a star of
 * TCP connections to process 0, which listens at R2CC_PERF_ROOT (host:port). It carries
 * the ncclUniqueId, the device lines, barriers and the small reductions of results
 * (times, wrong-element counts, NIC counters), so none of them depends on the NCCL that
 * is under test.
 */
#ifndef R2CC_BENCH_PERF_RDV_H
#define R2CC_BENCH_PERF_RDV_H

#include <stddef.h>
#include <stdint.h>

#define PERF_RDV_DEFAULT_PORT 29517

struct perf_rdv {
	int proc, nprocs;
	int *fds; /* process 0: one connection per other process (index = proc) */
	int fd;	  /* other processes: the connection to process 0 */
};

/* host:port from R2CC_PERF_ROOT, else MASTER_ADDR and MASTER_PORT + 1 (torchrun's store
 * holds MASTER_PORT itself), else 127.0.0.1 and the default port; a missing part takes
 * its default. Returns 0 or -EINVAL (message printed). */
int perf_rdv_address(char *host, size_t hostlen, int *port);

/* Connects the nprocs processes: process 0 listens, the others connect with retries for
 * up to timeout_s seconds. A connection carries a job check word so that a stray
 * process of another job is refused. Returns 0 or a negative errno (message printed). */
int perf_rdv_open(struct perf_rdv *r, int proc, int nprocs, const char *host, int port,
		  int timeout_s);
void perf_rdv_close(struct perf_rdv *r);

/* Process 0 receives len bytes from every process into all[proc * len] (its own
 * included); other processes only send; all may be NULL elsewhere. */
int perf_rdv_gather(struct perf_rdv *r, const void *mine, void *all, size_t len);
/* Process 0's buf to every process. */
int perf_rdv_bcast(struct perf_rdv *r, void *buf, size_t len);
int perf_rdv_barrier(struct perf_rdv *r);

enum { PERF_RDV_SUM, PERF_RDV_MIN, PERF_RDV_MAX };
/* Element-wise reduction of n doubles over all processes, result everywhere. */
int perf_rdv_allreduce(struct perf_rdv *r, double *v, int n, int how);

#endif
