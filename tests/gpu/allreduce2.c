/*
 * GPU test: N ranks (default 2, one process each, GPU = rank mod the GPUs
 * present) run ncclAllReduce over a range of sizes and data types; every
 * result is compared element for element with a host reference. The ncclUniqueId
 * travels from rank 0 to the others through a pipe. Exits non-zero on any
 * mismatch or error. Runs with or without LD_PRELOAD=libr2cc.so; with
 * --hostid, each rank gets its own NCCL_HOSTID (an emulated node per rank).
 *
 *   allreduce2 [--ranks N] [--max-bytes B] [--iters I] [--hostid]
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CK(call)                                                                                   \
	do {                                                                                       \
		cudaError_t e_ = (call);                                                           \
		if (e_ != cudaSuccess) {                                                           \
			fprintf(stderr, "rank %d: %s failed: %s\n", rank, #call,                   \
				cudaGetErrorString(e_));                                           \
			exit(2);                                                                   \
		}                                                                                  \
	} while (0)
#define NK(call)                                                                                   \
	do {                                                                                       \
		ncclResult_t r_ = (call);                                                          \
		if (r_ != ncclSuccess) {                                                           \
			fprintf(stderr, "rank %d: %s failed: %s\n", rank, #call,                   \
				ncclGetErrorString(r_));                                           \
			exit(2);                                                                   \
		}                                                                                  \
	} while (0)

static int rank;

/* Values small enough that every sum is exact in float and int32. */
static double value(int r, size_t i)
{
	return (double)((int)((i * 7 + (size_t)r * 13) % 17) - 8);
}

static long run_rank(int nranks, ncclUniqueId id, size_t max_bytes, int iters)
{
	int ngpu = 0;
	CK(cudaGetDeviceCount(&ngpu));
	CK(cudaSetDevice(rank % ngpu));
	ncclComm_t comm;
	NK(ncclCommInitRank(&comm, nranks, id, rank));
	cudaStream_t s;
	CK(cudaStreamCreate(&s));
	size_t max_count = max_bytes / 4;
	float *hf = malloc(max_count * 4), *want = malloc(max_count * 4);
	int32_t *hi = malloc(max_count * 4), *wanti = malloc(max_count * 4);
	void *hout = malloc(max_count * 4);
	void *d_send, *d_recv;
	CK(cudaMalloc(&d_send, max_bytes));
	CK(cudaMalloc(&d_recv, max_bytes));
	long wrong = 0;
	for (size_t count = 1; count <= max_count; count = count * 4 + 3) {
		for (int t = 0; t < 2; t++) {
			ncclDataType_t dt = t ? ncclInt32 : ncclFloat32;
			for (size_t i = 0; i < count; i++) {
				double sum = 0;
				for (int r = 0; r < nranks; r++)
					sum += value(r, i);
				hf[i] = (float)value(rank, i);
				hi[i] = (int32_t)value(rank, i);
				want[i] = (float)sum;
				wanti[i] = (int32_t)sum;
			}
			for (int it = 0; it < iters; it++) {
				int inplace = it & 1;
				CK(cudaMemcpy(d_send, t ? (void *)hi : (void *)hf, count * 4,
					      cudaMemcpyHostToDevice));
				CK(cudaMemset(d_recv, 0xff, count * 4));
				void *out = inplace ? d_send : d_recv;
				NK(ncclAllReduce(d_send, out, count, dt, ncclSum, comm, s));
				CK(cudaStreamSynchronize(s));
				CK(cudaMemcpy(hout, out, count * 4, cudaMemcpyDeviceToHost));
				long bad = 0;
				for (size_t i = 0; i < count; i++)
					bad += t ? ((int32_t *)hout)[i] != wanti[i]
						 : ((float *)hout)[i] != want[i];
				if (bad)
					fprintf(stderr, "rank %d: %s count %zu %s: %ld wrong\n",
						rank, t ? "int32" : "float", count,
						inplace ? "in place" : "out of place", bad);
				wrong += bad;
			}
		}
	}
	NK(ncclCommDestroy(comm));
	if (rank == 0)
		printf("allreduce2: %d ranks, sizes 4 B .. %zu B, float and int32, %d iterations "
		       "each: %ld wrong\n",
		       nranks, max_bytes, iters, wrong);
	return wrong;
}

int main(int argc, char **argv)
{
	int nranks = 2, iters = 2, hostid = 0;
	size_t max_bytes = 64 << 20;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--ranks") && i + 1 < argc)
			nranks = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--max-bytes") && i + 1 < argc)
			max_bytes = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
			iters = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--hostid"))
			hostid = 1;
		else {
			fprintf(stderr,
				"usage: %s [--ranks N] [--max-bytes B] [--iters I] [--hostid]\n",
				argv[0]);
			return 2;
		}
	}
	ncclUniqueId id;
	NK(ncclGetUniqueId(&id));
	pid_t pids[64];
	for (int r = 1; r < nranks && r < 64; r++) {
		pids[r] = fork();
		if (pids[r] == 0) {
			rank = r;
			if (hostid) {
				char h[32];
				snprintf(h, sizeof(h), "node%d", r);
				setenv("NCCL_HOSTID", h, 1);
				setenv("SOFTVERBS_NODE", h, 1);
			}
			_exit(run_rank(nranks, id, max_bytes, iters) ? 1 : 0);
		}
	}
	if (hostid) {
		setenv("NCCL_HOSTID", "node0", 1);
		setenv("SOFTVERBS_NODE", "node0", 1);
	}
	long wrong = run_rank(nranks, id, max_bytes, iters);
	int failed = 0;
	for (int r = 1; r < nranks; r++) {
		int st;
		waitpid(pids[r], &st, 0);
		failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	if (wrong || failed) {
		printf("allreduce2: FAIL (%ld wrong on rank 0, %d other ranks failed)\n", wrong,
		       failed);
		return 1;
	}
	printf("allreduce2: PASS\n");
	return 0;
}
