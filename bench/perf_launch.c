/* Rank discovery from launcher variables and the built-in spawner of r2cc-perf (see
 * perf_launch.h). Children get the parent's environment unchanged (LD_PRELOAD, NCCL_*,
 * the software RDMA device's settings) plus their rank variables and the node's
 * NCCL_HOSTID; ranks are node-major.
 */
#include "bench/perf_launch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/perf_opts.h"
#include "bench/perf_rdv.h"

static int env_int(const char *name, int *out)
{
	const char *s = getenv(name);
	char *end;
	long v;
	if (!s || !*s)
		return 0;
	v = strtol(s, &end, 10);
	if (*end || v < 0 || v > 1000000) {
		fprintf(stderr, "r2cc-perf: %s='%s' is not a rank number\n", name, s);
		return -EINVAL;
	}
	*out = (int)v;
	return 1;
}

int perf_world_from_env(struct perf_world *w)
{
	static const struct {
		const char *rank, *size, *local, *source;
	} vars[] = {
	    {"R2CC_PERF_RANK", "R2CC_PERF_NRANKS", "R2CC_PERF_LOCAL_RANK", "r2cc-perf --nodes"},
	    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
	     "Open MPI"},
	    {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "PMI"},
	    {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "Slurm"},
	    {"RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun"},
	};
	w->proc = 0, w->nprocs = 1, w->local_proc = 0, w->source = "single process";
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		int rank, size, local = -1, rc;
		rc = env_int(vars[i].rank, &rank);
		if (rc < 0)
			return rc;
		if (rc == 0)
			continue;
		rc = env_int(vars[i].size, &size);
		if (rc <= 0 || size < 1 || rank >= size) {
			fprintf(stderr, "r2cc-perf: %s is set but %s is missing or too small\n",
				vars[i].rank, vars[i].size);
			return -EINVAL;
		}
		if (env_int(vars[i].local, &local) < 0)
			return -EINVAL;
		w->proc = rank, w->nprocs = size;
		w->local_proc = local >= 0 ? local : rank;
		w->source = vars[i].source;
		return 0;
	}
	return 0;
}

static pid_t *children;
static int nchildren;

static void forward_signal(int sig)
{
	for (int i = 0; i < nchildren; i++)
		if (children[i] > 0)
			kill(children[i], sig);
}

static int free_port(void)
{
	struct sockaddr_in sa;
	socklen_t len = sizeof(sa);
	int port = -1, fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		return -1;
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (!bind(fd, (struct sockaddr *)&sa, sizeof(sa)) &&
	    !getsockname(fd, (struct sockaddr *)&sa, &len))
		port = ntohs(sa.sin_port);
	close(fd);
	return port;
}

static void setenv_int(const char *name, int v)
{
	char buf[16];
	snprintf(buf, sizeof(buf), "%d", v);
	setenv(name, buf, 1);
}

static int status_failed(int st)
{
	return !WIFEXITED(st) || WEXITSTATUS(st) != 0;
}

static void describe(int rank, pid_t pid, int st)
{
	if (WIFSIGNALED(st))
		fprintf(stderr, "r2cc-perf: rank %d (pid %d) was killed by signal %d (%s)\n", rank,
			(int)pid, WTERMSIG(st), strsignal(WTERMSIG(st)));
	else
		fprintf(stderr, "r2cc-perf: rank %d (pid %d) exited with status %d\n", rank,
			(int)pid, WEXITSTATUS(st));
}

/* A CPU's core, as "package:core" folded into one number; the CPU itself where the
 * topology cannot be read. */
static long core_of(int cpu)
{
	char path[96];
	long id[2] = {-1, -1};
	const char *file[2] = {"physical_package_id", "core_id"};

	for (int k = 0; k < 2; k++) {
		FILE *f;
		snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/%s", cpu,
			 file[k]);
		f = fopen(path, "r");
		if (!f || fscanf(f, "%ld", &id[k]) != 1)
			id[k] = -1;
		if (f)
			fclose(f);
	}
	return id[0] < 0 || id[1] < 0 ? -1 - cpu : id[0] * 65536 + id[1];
}

/*
 * --split-cpus: node i's share of the cores this process may run on (whole cores, so
 * that two emulated nodes never share one core's hyperthreads), in order; *set stays
 * untouched and 0 is returned when there are fewer cores than nodes.
 */
static int node_cpus(int node, int nodes, cpu_set_t *set)
{
	static long cores[CPU_SETSIZE];
	static int cpu_core[CPU_SETSIZE];
	cpu_set_t all;
	int ncores = 0, lo, hi, n = 0;

	if (sched_getaffinity(0, sizeof(all), &all) != 0)
		return 0;
	for (int c = 0; c < CPU_SETSIZE; c++) {
		int k;
		long id;
		if (!CPU_ISSET(c, &all))
			continue;
		id = core_of(c);
		for (k = 0; k < ncores && cores[k] != id; k++)
			;
		if (k == ncores)
			cores[ncores++] = id;
		cpu_core[c] = k;
	}
	if (ncores < nodes)
		return 0;
	lo = node * ncores / nodes;
	hi = (node + 1) * ncores / nodes;
	CPU_ZERO(set);
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &all) && cpu_core[c] >= lo && cpu_core[c] < hi) {
			CPU_SET(c, set);
			n++;
		}
	return n;
}

/* "0-3,8-11" */
static void cpus_str(const cpu_set_t *set, char *buf, size_t len)
{
	size_t at = 0;
	buf[0] = '\0';
	for (int c = 0; c < CPU_SETSIZE && at + 24 < len; c++) {
		int e = c;
		if (!CPU_ISSET(c, set))
			continue;
		while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, set))
			e++;
		at += (size_t)snprintf(buf + at, len - at, e > c ? "%s%d-%d" : "%s%d",
				       at ? "," : "", c, e);
		c = e;
	}
}

int perf_spawn(const struct perf_opts *o, int argc, char **argv)
{
	int total = o->nodes * o->gpus_per_node, left, result = 0, killing = 0;
	char root[64];
	struct sigaction sa;
	time_t kill_deadline = 0;

	(void)argc;
	if (!getenv("R2CC_PERF_ROOT")) {
		int port = free_port();
		if (port < 0)
			port = PERF_RDV_DEFAULT_PORT;
		snprintf(root, sizeof(root), "127.0.0.1:%d", port);
		setenv("R2CC_PERF_ROOT", root, 1);
	}
	children = calloc((size_t)total, sizeof(pid_t));
	if (!children)
		return 1;
	nchildren = total;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = forward_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	/* --split-cpus: each node's CPUs, worked out once; a child takes its node's */
	cpu_set_t *sets = o->split_cpus ? calloc((size_t)o->nodes, sizeof(*sets)) : NULL;
	if (o->split_cpus && !sets)
		fprintf(stderr,
			"r2cc-perf: --split-cpus: out of memory; the nodes share all CPUs\n");
	for (int node = 0; sets && node < o->nodes; node++) {
		char buf[256];
		if (!node_cpus(node, o->nodes, &sets[node])) {
			fprintf(stderr, "r2cc-perf: --split-cpus: fewer cores than nodes; "
					"the nodes share all CPUs\n");
			free(sets);
			sets = NULL;
			break;
		}
		cpus_str(&sets[node], buf, sizeof(buf));
		printf("# node%d runs on CPUs %s\n", node, buf);
	}
	fflush(stdout);
	fflush(stderr);

	for (int rank = 0; rank < total; rank++) {
		int node = rank / o->gpus_per_node, local = rank % o->gpus_per_node;
		pid_t pid = fork();
		if (pid < 0) {
			perror("r2cc-perf: fork");
			result = 1;
			break;
		}
		if (pid == 0) {
			char hostid[32];
			snprintf(hostid, sizeof(hostid), "node%d", node);
			setenv_int("R2CC_PERF_RANK", rank);
			setenv_int("R2CC_PERF_NRANKS", total);
			setenv_int("R2CC_PERF_LOCAL_RANK", local);
			setenv_int("RANK", rank);
			setenv_int("WORLD_SIZE", total);
			setenv_int("LOCAL_RANK", local);
			setenv_int("LOCAL_WORLD_SIZE", o->gpus_per_node);
			setenv_int("NODE_RANK", node);
			setenv_int("R2CC_PERF_DEVICE", rank);
			setenv("NCCL_HOSTID", hostid, 1);
			if (sets && sched_setaffinity(0, sizeof(sets[node]), &sets[node]) != 0)
				fprintf(stderr, "r2cc-perf: rank %d: sched_setaffinity: %s\n", rank,
					strerror(errno));
			execv("/proc/self/exe", argv);
			fprintf(stderr, "r2cc-perf: exec of /proc/self/exe failed: %s\n",
				strerror(errno));
			_exit(127);
		}
		children[rank] = pid;
	}
	if (result)
		forward_signal(SIGTERM);

	left = 0;
	for (int i = 0; i < total; i++)
		left += children[i] > 0;
	while (left > 0) {
		int st;
		pid_t pid = waitpid(-1, &st, killing ? WNOHANG : 0);
		if (pid < 0 && errno == EINTR)
			continue;
		if (pid < 0)
			break;
		if (pid == 0) {
			if (time(NULL) >= kill_deadline)
				forward_signal(SIGKILL);
			usleep(100000);
			continue;
		}
		for (int i = 0; i < total; i++) {
			if (children[i] != pid)
				continue;
			children[i] = 0;
			left--;
			if (status_failed(st)) {
				describe(i, pid, st);
				if (!result)
					result =
					    WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
				if (!killing && left > 0) {
					fprintf(stderr, "r2cc-perf: stopping the other %d ranks\n",
						left);
					forward_signal(SIGTERM);
					killing = 1;
					kill_deadline = time(NULL) + 5;
				}
			}
		}
	}
	free(sets);
	free(children);
	children = NULL;
	nchildren = 0;
	return result;
}
