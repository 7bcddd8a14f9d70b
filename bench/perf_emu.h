/* Host emulation of the CUDA runtime and NCCL calls that r2cc_perf.cu makes, so that the
 * whole program (rendezvous, spawner, calls, checks, output, exit status, watchdog) runs
 * as a CPU test without a GPU: build/tests/bench/r2cc-perf-emu. "Device" memory is host
 * memory and streams complete at once. The collectives really move data between the
 * processes, through a shared memory segment named in the ncclUniqueId: each rank copies
 * its input into its slot, a process-shared barrier, each rank computes its own output
 * from all slots in double arithmetic, a barrier. It is a test double of NCCL's semantics,
 * not of its performance; R2CC_PERF_EMU_CORRUPT=<rank> makes that rank's allreduce
 * results wrong in one element, to test the checker against a faulty library.
 */
#ifndef R2CC_BENCH_PERF_EMU_H
#define R2CC_BENCH_PERF_EMU_H

#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench/perf_pattern.h"

/* ---- CUDA runtime ---- */

typedef enum { cudaSuccess = 0, cudaErrorNotReady = 600 } cudaError_t;
typedef int *cudaStream_t;
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };
#define cudaStreamNonBlocking 1

struct cudaDeviceProp {
	char name[256];
	int pciBusID;
	size_t totalGlobalMem;
};

static inline const char *cudaGetErrorString(cudaError_t e)
{
	return e == cudaSuccess ? "no error" : "emulated error";
}
static inline cudaError_t cudaGetDeviceCount(int *n)
{
	*n = 2;
	return cudaSuccess;
}
static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev)
{
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "Emulated GPU (host memory)");
	p->pciBusID = 0x10 + dev;
	return cudaSuccess;
}
static inline cudaError_t cudaSetDevice(int dev)
{
	return cudaSuccess;
}
static inline cudaError_t cudaGetLastError(void)
{
	return cudaSuccess;
}
static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
	*s = (cudaStream_t)malloc(sizeof(int));
	return cudaSuccess;
}
static inline cudaError_t cudaStreamDestroy(cudaStream_t s)
{
	free(s);
	return cudaSuccess;
}
static inline cudaError_t cudaStreamQuery(cudaStream_t s)
{
	return cudaSuccess;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
	return cudaSuccess;
}
template <typename T> static inline cudaError_t cudaMalloc(T **p, size_t len)
{
	*p = (T *)malloc(len);
	return *p ? cudaSuccess : cudaErrorNotReady;
}
static inline cudaError_t cudaFree(void *p)
{
	free(p);
	return cudaSuccess;
}
static inline cudaError_t cudaMemset(void *p, int v, size_t len)
{
	memset(p, v, len);
	return cudaSuccess;
}
static inline cudaError_t cudaMemsetAsync(void *p, int v, size_t len, cudaStream_t s)
{
	memset(p, v, len);
	return cudaSuccess;
}
static inline cudaError_t cudaMemcpy(void *d, const void *s, size_t len, cudaMemcpyKind k)
{
	memcpy(d, s, len);
	return cudaSuccess;
}
static inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t len, cudaMemcpyKind k,
					  cudaStream_t st)
{
	memcpy(d, s, len);
	return cudaSuccess;
}
static inline cudaError_t cudaDeviceSynchronize(void)
{
	return cudaSuccess;
}

/* ---- NCCL ---- */

#define NCCL_VERSION(X, Y, Z) ((X)*10000 + (Y)*100 + (Z))
#define NCCL_VERSION_CODE     NCCL_VERSION(2, 28, 9)

typedef enum {
	ncclSuccess = 0,
	ncclSystemError = 2,
	ncclInvalidUsage = 5,
	ncclInProgress = 7
} ncclResult_t;
typedef enum {
	ncclInt8,
	ncclUint8,
	ncclInt32,
	ncclUint32,
	ncclInt64,
	ncclUint64,
	ncclFloat16,
	ncclFloat32,
	ncclFloat64,
	ncclBfloat16,
	ncclFloat8e4m3,
	ncclFloat8e5m2
} ncclDataType_t;
typedef enum { ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg } ncclRedOp_t;
typedef struct {
	char internal[128];
} ncclUniqueId;

#define EMU_MAX_RANKS 16
#define EMU_MAX_P2P   64

struct emu_shared {
	pthread_barrier_t barrier;
	volatile int ready;
};

struct emu_p2p {
	int send, peer;
	const void *sbuf;
	void *rbuf;
	size_t bytes;
};

typedef struct emu_comm {
	int nranks, rank;
	struct emu_shared *sh;
	char *slots; /* nranks slots, then nranks x nranks mailboxes */
	size_t slot, maplen;
} * ncclComm_t;

static int emu_group_depth;
static struct emu_p2p emu_pending[EMU_MAX_P2P];
static int emu_npending;
static ncclComm_t emu_pending_comm;

static inline const char *ncclGetErrorString(ncclResult_t r)
{
	return r == ncclSuccess ? "no error" : "emulated NCCL error";
}
static inline const char *ncclGetLastError(ncclComm_t c)
{
	return "";
}
static inline ncclResult_t ncclGetVersion(int *v)
{
	*v = NCCL_VERSION_CODE;
	return ncclSuccess;
}
static inline ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	memset(id, 0, sizeof(*id));
	snprintf(id->internal, sizeof(id->internal), "/r2cc-perf-emu-%d-%ld", (int)getpid(),
		 (long)ts.tv_nsec);
	return ncclSuccess;
}

static inline size_t emu_slot_bytes(void)
{
	const char *s = getenv("R2CC_PERF_EMU_SLOT");
	return s && atol(s) > 0 ? (size_t)atol(s) : (size_t)4 << 20;
}

static inline ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank)
{
	struct emu_comm *c = (struct emu_comm *)calloc(1, sizeof(*c));
	size_t slot = emu_slot_bytes();
	size_t len = 4096 + slot * (size_t)nranks * (size_t)(nranks + 1);
	int fd = -1;
	if (!c || nranks > EMU_MAX_RANKS)
		return ncclInvalidUsage;
	if (rank == 0) {
		fd = shm_open(id.internal, O_RDWR | O_CREAT | O_EXCL, 0600);
		if (fd < 0 || ftruncate(fd, (off_t)len))
			return ncclSystemError;
	} else {
		for (int tries = 0; fd < 0 && tries < 3000; tries++) {
			fd = shm_open(id.internal, O_RDWR, 0600);
			if (fd < 0)
				usleep(10000);
		}
		if (fd < 0)
			return ncclSystemError;
		for (int tries = 0; tries < 3000; tries++) {
			struct stat st;
			if (!fstat(fd, &st) && (size_t)st.st_size == len)
				break;
			usleep(10000);
		}
	}
	void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		return ncclSystemError;
	c->sh = (struct emu_shared *)m;
	c->slots = (char *)m + 4096;
	c->slot = slot, c->maplen = len;
	c->nranks = nranks, c->rank = rank;
	if (rank == 0) {
		pthread_barrierattr_t a;
		pthread_barrierattr_init(&a);
		pthread_barrierattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
		pthread_barrier_init(&c->sh->barrier, &a, (unsigned)nranks);
		__atomic_store_n(&c->sh->ready, 1, __ATOMIC_RELEASE);
	} else {
		while (!__atomic_load_n(&c->sh->ready, __ATOMIC_ACQUIRE))
			usleep(1000);
	}
	pthread_barrier_wait(&c->sh->barrier);
	if (rank == 0)
		shm_unlink(id.internal); /* everyone has it mapped now */
	*out = c;
	return ncclSuccess;
}

static inline ncclResult_t ncclCommDestroy(ncclComm_t c)
{
	munmap(c->sh, c->maplen);
	free(c);
	return ncclSuccess;
}
static inline ncclResult_t ncclCommAbort(ncclComm_t c)
{
	return ncclSuccess;
}
static inline ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *r)
{
	*r = ncclSuccess;
	return ncclSuccess;
}

static inline int emu_type(ncclDataType_t t)
{
	return (int)t; /* same order as enum perf_type */
}

static inline void emu_store_double(void *buf, uint64_t i, int t, double v)
{
	int exact = 1;
	switch (t) {
	case PERF_FLOAT:
		((float *)buf)[i] = (float)v;
		break;
	case PERF_DOUBLE:
		((double *)buf)[i] = v;
		break;
	case PERF_HALF:
	case PERF_BF16:
		((uint16_t *)buf)[i] = (uint16_t)perf_small_float_encode(v, t, &exact);
		break;
	case PERF_F8E4M3:
	case PERF_F8E5M2:
		((uint8_t *)buf)[i] = (uint8_t)perf_small_float_encode(v, t, &exact);
		break;
	default:
		perf_store(buf, i, t, (int64_t)v);
		break;
	}
}

/* The corruption hook: the allreduce of rank R gets one element wrong. */
static inline void emu_corrupt(ncclComm_t c, void *buf, size_t count, int t)
{
	const char *s = getenv("R2CC_PERF_EMU_CORRUPT");
	if (s && *s && atoi(s) == c->rank && count)
		emu_store_double(buf, count / 3, t, perf_load(buf, count / 3, t) + 1);
}

static inline char *emu_slot(ncclComm_t c, int r)
{
	return c->slots + (size_t)r * c->slot;
}

static inline ncclResult_t emu_publish(ncclComm_t c, const void *buf, size_t bytes)
{
	if (bytes > c->slot) {
		fprintf(stderr, "emulated NCCL: %zu bytes exceed R2CC_PERF_EMU_SLOT\n", bytes);
		return ncclInvalidUsage;
	}
	memcpy(emu_slot(c, c->rank), buf, bytes);
	pthread_barrier_wait(&c->sh->barrier);
	return ncclSuccess;
}

/* out[i] = op over ranks of slot[r][off + i] */
static inline void emu_reduce(ncclComm_t c, void *out, size_t off, size_t count, int t,
			      ncclRedOp_t op)
{
	for (size_t i = 0; i < count; i++) {
		double acc = perf_load(emu_slot(c, 0), off + i, t);
		for (int r = 1; r < c->nranks; r++) {
			double v = perf_load(emu_slot(c, r), off + i, t);
			if (op == ncclProd)
				acc *= v;
			else if (op == ncclMax)
				acc = v > acc ? v : acc;
			else if (op == ncclMin)
				acc = v < acc ? v : acc;
			else
				acc += v;
		}
		if (op == ncclAvg)
			acc = perf_type_is_float(t) ? acc / c->nranks
						    : (double)((int64_t)acc / c->nranks);
		emu_store_double(out, i, t, acc);
	}
}

static inline ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, ncclDataType_t dt,
					 ncclRedOp_t op, ncclComm_t c, cudaStream_t st)
{
	int t = emu_type(dt);
	ncclResult_t res = emu_publish(c, s, count * (size_t)perf_type_size(t));
	if (res)
		return res;
	emu_reduce(c, r, 0, count, t, op);
	emu_corrupt(c, r, count, t);
	pthread_barrier_wait(&c->sh->barrier);
	return ncclSuccess;
}

static inline ncclResult_t ncclReduce(const void *s, void *r, size_t count, ncclDataType_t dt,
				      ncclRedOp_t op, int root, ncclComm_t c, cudaStream_t st)
{
	int t = emu_type(dt);
	ncclResult_t res = emu_publish(c, s, count * (size_t)perf_type_size(t));
	if (res)
		return res;
	if (c->rank == root)
		emu_reduce(c, r, 0, count, t, op);
	pthread_barrier_wait(&c->sh->barrier);
	return ncclSuccess;
}

static inline ncclResult_t ncclReduceScatter(const void *s, void *r, size_t count,
					     ncclDataType_t dt, ncclRedOp_t op, ncclComm_t c,
					     cudaStream_t st)
{
	int t = emu_type(dt);
	ncclResult_t res = emu_publish(c, s, count * (size_t)c->nranks * (size_t)perf_type_size(t));
	if (res)
		return res;
	emu_reduce(c, r, count * (size_t)c->rank, count, t, op);
	pthread_barrier_wait(&c->sh->barrier);
	return ncclSuccess;
}

static inline ncclResult_t ncclAllGather(const void *s, void *r, size_t count, ncclDataType_t dt,
					 ncclComm_t c, cudaStream_t st)
{
	size_t bytes = count * (size_t)perf_type_size(emu_type(dt));
	ncclResult_t res = emu_publish(c, s, bytes);
	if (res)
		return res;
	for (int q = 0; q < c->nranks; q++)
		memcpy((char *)r + (size_t)q * bytes, emu_slot(c, q), bytes);
	pthread_barrier_wait(&c->sh->barrier);
	return ncclSuccess;
}

static inline ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, ncclDataType_t dt,
					 int root, ncclComm_t c, cudaStream_t st)
{
	size_t bytes = count * (size_t)perf_type_size(emu_type(dt));
	ncclResult_t res = emu_publish(c, s, bytes);
	if (res)
		return res;
	memmove(r, emu_slot(c, root), bytes);
	pthread_barrier_wait(&c->sh->barrier);
	return ncclSuccess;
}

static inline ncclResult_t ncclGroupStart(void)
{
	emu_group_depth++;
	return ncclSuccess;
}

/* Point-to-point: sends go to mailbox [src][dst] at the outermost group end, a barrier,
 * then the receives, a barrier. */
static inline ncclResult_t ncclGroupEnd(void)
{
	ncclComm_t c = emu_pending_comm;
	if (--emu_group_depth > 0 || !emu_npending)
		return ncclSuccess;
	for (int i = 0; i < emu_npending; i++) {
		struct emu_p2p *p = &emu_pending[i];
		char *box = emu_slot(c, c->nranks * (1 + c->rank) + p->peer);
		if (p->send && p->bytes <= c->slot)
			memcpy(box, p->sbuf, p->bytes);
	}
	pthread_barrier_wait(&c->sh->barrier);
	for (int i = 0; i < emu_npending; i++) {
		struct emu_p2p *p = &emu_pending[i];
		char *box = emu_slot(c, c->nranks * (1 + p->peer) + c->rank);
		if (!p->send && p->bytes <= c->slot)
			memcpy(p->rbuf, box, p->bytes);
	}
	pthread_barrier_wait(&c->sh->barrier);
	emu_npending = 0;
	return ncclSuccess;
}

static inline ncclResult_t emu_p2p_add(int send, const void *sbuf, void *rbuf, size_t count,
				       ncclDataType_t dt, int peer, ncclComm_t c)
{
	struct emu_p2p *p;
	if (emu_npending == EMU_MAX_P2P || !emu_group_depth)
		return ncclInvalidUsage;
	p = &emu_pending[emu_npending++];
	p->send = send, p->peer = peer, p->sbuf = sbuf, p->rbuf = rbuf;
	p->bytes = count * (size_t)perf_type_size(emu_type(dt));
	emu_pending_comm = c;
	return ncclSuccess;
}

static inline ncclResult_t ncclSend(const void *s, size_t count, ncclDataType_t dt, int peer,
				    ncclComm_t c, cudaStream_t st)
{
	return emu_p2p_add(1, s, NULL, count, dt, peer, c);
}

static inline ncclResult_t ncclRecv(void *r, size_t count, ncclDataType_t dt, int peer,
				    ncclComm_t c, cudaStream_t st)
{
	return emu_p2p_add(0, NULL, r, count, dt, peer, c);
}

#endif
