/*
 * slurm-task: one task of a Slurm job step as a worker of the verbs drill
 * (tools/drill/README.md), for tests/ops/slurm.sh. Under srun, each task becomes the
 * drill's worker of rank SLURM_PROCID out of SLURM_NTASKS, on the emulated node of
 * the software RDMA device that its Slurm node names (SLURMD_NODENAME), so the job's
 * two Slurm nodes are two servers with their own soft NICs. It execs the worker: the
 * task's environment, LD_PRELOAD and R2CC's settings included, is the worker's, as
 * Slurm made it. Workers meet through files in --dir (shared: one machine).
 *
 * --collective-at N: every worker makes its one ncclAllReduce (of the NCCL test
 * double: R2CC's first collective, from which R2CC_DRILL's times count) once the
 * workers together received N messages, so that all start the drill's clock within
 * moments of each other, as the ranks of an NCCL job do at their first collective.
 *
 *   slurm-task --dir DIR --drill PATH --nccl-lib PATH [--messages N] [--seed S]
 *              [--nics K] [--collective-at N]
 *   slurm-task --summary --dir DIR --procs N --messages M [--expect r2cc|plain]
 *
 * --summary, after the step, reads the workers' shared status: one line per task with
 * the messages each received and checked, and exit 0 only if every task finished with
 * all its messages, no error and the data path expected (libr2cc.so's or plain verbs).
 */
#include "tools/drill/drill.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct task_opts {
	const char *dir, *drill, *nccl_lib, *expect;
	int messages, seed, nics, procs;
	long collective_at;
	bool summary;
};

static int env_int(const char *name)
{
	const char *v = getenv(name);
	char *end;
	long x;

	if (!v || !*v)
		return -1;
	x = strtol(v, &end, 10);
	return *end || x < 0 || x > 1000000 ? -1 : (int)x;
}

/* The workers' shared status (drill.h): zeroed, one record per rank. Every task may
 * make it; growing a file to a size it has is harmless. */
static int status_file(const char *dir, int procs, bool create)
{
	char path[4096];
	size_t len = sizeof(struct drill_status) * (size_t)procs;
	struct stat st;
	int fd;

	snprintf(path, sizeof(path), "%s/status", dir);
	fd = open(path, (create ? O_RDWR | O_CREAT : O_RDONLY) | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) == 0 && (size_t)st.st_size < len && create && ftruncate(fd, (off_t)len))
		return -errno;
	return fd;
}

static int run_task(const struct task_opts *o)
{
	int rank = env_int("SLURM_PROCID"), procs = env_int("SLURM_NTASKS");
	const char *node = getenv("SLURMD_NODENAME");
	char a[6][32];
	char *argv[32];
	int n = 0, fd;

	if (rank < 0 || procs < 2 || procs > DRILL_MAX_PROCS || rank >= procs || !node) {
		fprintf(stderr,
			"slurm-task: run me under srun with 2 to %d tasks (SLURM_PROCID, "
			"SLURM_NTASKS, SLURMD_NODENAME)\n",
			DRILL_MAX_PROCS);
		return 2;
	}
	fd = status_file(o->dir, procs, true);
	if (fd < 0) {
		fprintf(stderr, "slurm-task: %s/status: %s\n", o->dir, strerror(-fd));
		return 1;
	}
	close(fd);
	/* The Slurm node is the emulated server: its NICs and its host id for NCCL. */
	setenv("SOFTVERBS_NODE", node, 1);
	setenv("NCCL_HOSTID", node, 1);
	snprintf(a[0], sizeof(a[0]), "%d", rank);
	snprintf(a[1], sizeof(a[1]), "%d", procs);
	snprintf(a[2], sizeof(a[2]), "%d", o->nics);
	snprintf(a[3], sizeof(a[3]), "%d", o->seed);
	snprintf(a[4], sizeof(a[4]), "%d", o->messages);
	snprintf(a[5], sizeof(a[5]), "%ld", o->collective_at);
	argv[n++] = (char *)"r2cc-verbs-drill";
	argv[n++] = (char *)"--worker";
	argv[n++] = (char *)"--rank";
	argv[n++] = a[0];
	argv[n++] = (char *)"--procs";
	argv[n++] = a[1];
	argv[n++] = (char *)"--nics";
	argv[n++] = a[2];
	argv[n++] = (char *)"--seed";
	argv[n++] = a[3];
	argv[n++] = (char *)"--messages";
	argv[n++] = a[4];
	argv[n++] = (char *)"--dir";
	argv[n++] = (char *)o->dir;
	argv[n++] = (char *)"--nccl-lib";
	argv[n++] = (char *)o->nccl_lib;
	if (o->collective_at > 0) {
		argv[n++] = (char *)"--collective-at";
		argv[n++] = a[5];
		argv[n++] = (char *)"--collective-sum";
	}
	argv[n] = NULL;
	execv(o->drill, argv);
	fprintf(stderr, "slurm-task: %s: %s\n", o->drill, strerror(errno));
	return 127;
}

static const char *phase_name(int phase)
{
	static const char *const names[] = {"start", "connect", "run",	 "wait",
					    "drain", "done",	"failed"};
	return phase >= 0 && phase <= DRILL_PHASE_FAILED ? names[phase] : "?";
}

static int summary(const struct task_opts *o)
{
	uint64_t want = (uint64_t)o->messages * (uint64_t)(o->procs - 1);
	size_t len = sizeof(struct drill_status) * (size_t)o->procs;
	struct drill_status *st;
	struct stat sb;
	int fd, bad = 0;

	fd = status_file(o->dir, o->procs, false);
	if (fd < 0 || fstat(fd, &sb) || (size_t)sb.st_size < len) {
		fprintf(stderr, "slurm-task: no status of %d tasks in %s\n", o->procs, o->dir);
		return 1;
	}
	st = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (st == MAP_FAILED)
		return 1;
	for (int r = 0; r < o->procs; r++) {
		const struct drill_status *s = &st[r];
		int interposed = atomic_load(&s->interposed);
		uint64_t got = atomic_load(&s->delivered), errors = atomic_load(&s->errors),
			 checks = atomic_load(&s->check_failures);
		bool ok =
		    atomic_load(&s->phase) == DRILL_PHASE_DONE && got == want && !errors && !checks;

		if (o->expect && strcmp(o->expect, "r2cc") == 0)
			ok = ok && interposed == 1;
		else if (o->expect)
			ok = ok && interposed == 2;
		printf("task %d: %s, %llu/%llu messages received and checked, %llu errors, %llu "
		       "check failures, data path %s%s%s %s\n",
		       r, phase_name(atomic_load(&s->phase)), (unsigned long long)got,
		       (unsigned long long)want, (unsigned long long)errors,
		       (unsigned long long)checks,
		       interposed == 1	 ? "libr2cc.so's"
		       : interposed == 2 ? "plain verbs"
					 : "unknown",
		       s->error[0] ? "; first error: " : "", s->error, ok ? "PASS" : "FAIL");
		bad += !ok;
	}
	munmap(st, len);
	return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {{"dir", required_argument, NULL, 'd'},
						 {"drill", required_argument, NULL, 'D'},
						 {"nccl-lib", required_argument, NULL, 'l'},
						 {"messages", required_argument, NULL, 'm'},
						 {"seed", required_argument, NULL, 's'},
						 {"nics", required_argument, NULL, 'n'},
						 {"procs", required_argument, NULL, 'p'},
						 {"expect", required_argument, NULL, 'e'},
						 {"collective-at", required_argument, NULL, 'c'},
						 {"summary", no_argument, NULL, 'S'},
						 {NULL, 0, NULL, 0}};
	struct task_opts o = {.messages = 128, .seed = 1, .nics = 3, .procs = 2};
	int c;

	while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (c) {
		case 'd':
			o.dir = optarg;
			break;
		case 'D':
			o.drill = optarg;
			break;
		case 'l':
			o.nccl_lib = optarg;
			break;
		case 'm':
			o.messages = atoi(optarg);
			break;
		case 's':
			o.seed = atoi(optarg);
			break;
		case 'n':
			o.nics = atoi(optarg);
			break;
		case 'p':
			o.procs = atoi(optarg);
			break;
		case 'e':
			o.expect = optarg;
			break;
		case 'c':
			o.collective_at = atol(optarg);
			break;
		case 'S':
			o.summary = true;
			break;
		default:
			return 2;
		}
	}
	if (!o.dir || o.messages < 1 || o.procs < 2 || o.procs > DRILL_MAX_PROCS ||
	    (o.expect && strcmp(o.expect, "r2cc") && strcmp(o.expect, "plain")) ||
	    (!o.summary && (!o.drill || !o.nccl_lib))) {
		fprintf(stderr, "usage: slurm-task --dir DIR --drill PATH --nccl-lib PATH "
				"[--messages N] [--seed S] [--nics K] [--collective-at N]\n"
				"       slurm-task --summary --dir DIR --procs N --messages M "
				"[--expect r2cc|plain]\n");
		return 2;
	}
	return o.summary ? summary(&o) : run_task(&o);
}
