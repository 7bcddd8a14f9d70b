/* How the processes of an r2cc-perf job come to be: started by a launcher (mpirun,
 * srun, torchrun, which tell each process its rank through the environment), or by
 * r2cc-perf itself with --nodes N --gpus-per-node G (one emulated node per NCCL_HOSTID
 * on this host, docs/architecture.md, Multi-node on one machine).
 */
#ifndef R2CC_BENCH_PERF_LAUNCH_H
#define R2CC_BENCH_PERF_LAUNCH_H

struct perf_opts;

struct perf_world {
	int proc, nprocs, local_proc;
	const char *source; /* which variables gave it, for the header */
};

/* From R2CC_PERF_RANK/_NRANKS/_LOCAL_RANK (our own children), OMPI_COMM_WORLD_*,
 * PMI_RANK/PMI_SIZE, SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID, RANK/WORLD_SIZE/LOCAL_RANK;
 * a single process otherwise. Returns 0 or -EINVAL (message printed). */
int perf_world_from_env(struct perf_world *w);

/* Spawns nodes x gpus_per_node copies of this program with the same arguments, waits for
 * them and returns the exit status of the job: 0 when every rank exited 0. A rank that
 * fails takes the others down. */
int perf_spawn(const struct perf_opts *o, int argc, char **argv);

#endif
