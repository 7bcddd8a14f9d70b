/*
 * r2cc-verbs-drill's processes (main.c has the overview): the paths of what a run
 * needs (found next to this program), the worker processes and their environment,
 * and softverbs-ctl.
 */
#include "tools/drill/parent.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* ---- paths: everything is found next to this program (build/bin/..) ---- */

int drill_paths(struct drill_paths *p, const struct drill_opts *o)
{
	char bin[PATH_MAX], build[PATH_MAX], *slash;
	ssize_t n = readlink("/proc/self/exe", p->exe, sizeof(p->exe) - 1);
	const char *tmp = getenv("TMPDIR");

	if (n <= 0) {
		fprintf(stderr, "r2cc-verbs-drill: cannot read /proc/self/exe: %s\n",
			strerror(errno));
		return -1;
	}
	p->exe[n] = '\0';
	snprintf(bin, sizeof(bin), "%s", p->exe);
	slash = strrchr(bin, '/');
	if (slash)
		*slash = '\0';
	snprintf(build, sizeof(build), "%s", bin);
	slash = strrchr(build, '/');
	if (slash)
		*slash = '\0';
	if (drill_fmt(p->softverbs, sizeof(p->softverbs), "%s/softverbs", build) ||
	    drill_fmt(p->libr2cc, sizeof(p->libr2cc), "%s/lib/libr2cc.so", build) ||
	    drill_fmt(p->ctl, sizeof(p->ctl), "%s/softverbs-ctl", bin) ||
	    drill_fmt(p->nccl, sizeof(p->nccl), "%s/tests/ncclstub/libnccl.so.2", build) ||
	    drill_fmt(p->tmp, sizeof(p->tmp), "%s/r2cc-drill.XXXXXX", tmp && *tmp ? tmp : "/tmp")) {
		fprintf(stderr, "r2cc-verbs-drill: paths too long\n");
		return -1;
	}
	if (access(p->ctl, X_OK) != 0) {
		fprintf(stderr, "r2cc-verbs-drill: %s missing (make %s)\n", p->ctl, p->ctl);
		return -1;
	}
	if (drill_fmt(bin, sizeof(bin), "%s/libibverbs.so.1", p->softverbs) ||
	    access(bin, R_OK) != 0) {
		fprintf(stderr, "r2cc-verbs-drill: %s missing (make it)\n", bin);
		return -1;
	}
	if (o->nccl_stub && access(p->nccl, R_OK) != 0) {
		fprintf(stderr, "r2cc-verbs-drill: %s missing (make it, or drop --nccl-stub)\n",
			p->nccl);
		return -1;
	}
	if (o->preload && access(p->libr2cc, R_OK) != 0) {
		fprintf(stderr, "r2cc-verbs-drill: %s missing (make it, or use --no-preload)\n",
			p->libr2cc);
		return -1;
	}
	if (!mkdtemp(p->tmp)) {
		fprintf(stderr, "r2cc-verbs-drill: cannot make %s: %s\n", p->tmp, strerror(errno));
		return -1;
	}
	return 0;
}

static int drill_rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	remove(path);
	return 0;
}

void drill_rmtree(const char *dir)
{
	nftw(dir, drill_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- processes ---- */

void drill_on_signal(int sig)
{
	drill_stop = sig;
}

static bool drill_env_ours(const char *kv)
{
	static const char *const keys[] = {
	    "LD_LIBRARY_PATH=",	 "LD_PRELOAD=",		  "SOFTVERBS_FABRIC=", "SOFTVERBS_NODE=",
	    "SOFTVERBS_NICS=",	 "SOFTVERBS_TIME_SCALE=", "SOFTVERBS_FAULT=",  "R2CC_REPORT=",
	    "NCCL_HOSTID=",	 "SOFTVERBS_SHAPING=",	  "R2CC_FAILED_NODE=", "R2CC_FAILED_HCA=",
	    "SOFTVERBS_DMABUF=", "SOFTVERBS_MLX5DV=",	  "R2CC_DRILL=",
	};

	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (strncmp(kv, keys[i], strlen(keys[i])) == 0)
			return true;
	return false;
}

/* The worker's environment: ours on top of the caller's. */
static char **drill_worker_env(const struct drill_opts *o, const struct drill_paths *p,
			       const struct drill_scenario *s, int rank, char *store, size_t len)
{
	size_t n = 0, used = 0;
	char **env;
	const char *ld = getenv("LD_LIBRARY_PATH");
	char nics[256] = "";

	for (char **e = environ; *e; e++)
		n++;
	env = calloc(n + 20, sizeof(*env));
	if (!env)
		return NULL;
	n = 0;
	for (char **e = environ; *e; e++)
		if (!drill_env_ours(*e) &&
		    !(o->restore_ms >= 0 && !strncmp(*e, "R2CC_FAILBACK_MS=", 17)) &&
		    !(o->nccl_net && !strncmp(*e, "NCCL_NET=", 9)) &&
		    !(o->net_plugin && !strncmp(*e, "NCCL_NET_PLUGIN=", 16)))
			env[n++] = *e;
	for (int k = 0; k < o->nics; k++)
		snprintf(nics + strlen(nics), sizeof(nics) - strlen(nics), "%smlx5_%d:%d",
			 k ? "," : "", k, o->gbps > 0 ? (int)o->gbps : 100);
#define DRILL_ENV(...)                                                                             \
	do {                                                                                       \
		int w_ = snprintf(store + used, len - used, __VA_ARGS__);                          \
		if (w_ < 0 || (size_t)w_ >= len - used) {                                          \
			free(env);                                                                 \
			return NULL;                                                               \
		}                                                                                  \
		env[n++] = store + used;                                                           \
		used += (size_t)w_ + 1;                                                            \
	} while (0)
	/* --mlx5dv: the device's libmlx5 stand-in, its NICs passing for mlx5 ones;
	 * --net-plugin: the NCCL test double's folder, where the test plugin is */
	char stubdir[PATH_MAX] = "";
	if (o->net_plugin) {
		snprintf(stubdir, sizeof(stubdir), "%s", p->nccl);
		char *slash = strrchr(stubdir, '/');
		if (slash)
			slash[0] = ':', slash[1] = '\0';
	}
	DRILL_ENV("LD_LIBRARY_PATH=%s%s%s%s%s%s", stubdir, o->mlx5dv ? p->softverbs : "",
		  o->mlx5dv ? "/mlx5:" : "", p->softverbs, ld && *ld ? ":" : "", ld ? ld : "");
	if (o->net_plugin)
		DRILL_ENV("NCCL_NET_PLUGIN=%s", o->net_plugin);
	if (o->nccl_net)
		DRILL_ENV("NCCL_NET=%s", o->nccl_net);
	if (o->mlx5dv)
		DRILL_ENV("SOFTVERBS_MLX5DV=1");
	/* R2CC_TEST_PRELOAD goes first (the sanitizer runtime, README: Tests). */
	if (o->preload) {
		const char *first = getenv("R2CC_TEST_PRELOAD");
		DRILL_ENV("LD_PRELOAD=%s%s%s", first && *first ? first : "",
			  first && *first ? ":" : "", p->libr2cc);
	}
	DRILL_ENV("SOFTVERBS_FABRIC=%s", s->fabric);
	DRILL_ENV("SOFTVERBS_NODE=node%d", rank / o->per_node);
	DRILL_ENV("NCCL_HOSTID=node%d", rank / o->per_node);
	DRILL_ENV("SOFTVERBS_NICS=%s", nics);
	if (o->gbps > 0)
		DRILL_ENV("SOFTVERBS_SHAPING=1");
	if (o->declare_node >= 0) {
		DRILL_ENV("R2CC_FAILED_NODE=%d", o->declare_node);
		DRILL_ENV("R2CC_FAILED_HCA=mlx5_%d", o->declare_nic);
	}
	DRILL_ENV("SOFTVERBS_TIME_SCALE=%g", o->time_scale);
	if (o->flush)
		DRILL_ENV("SOFTVERBS_DMABUF=1");
	DRILL_ENV("R2CC_REPORT=%s/r2cc-report.%d", s->dir, rank);
	/* --fresh-mr: the process that stops is the faulted node's (the one that
	 * moves to another NIC, so that its peer translates its new keys) */
	if (o->fresh_mr)
		DRILL_ENV("DRILL_FRESH_STOP=%d", s->node * o->per_node);
	if (o->restore_ms >= 0)
		DRILL_ENV("R2CC_FAILBACK_MS=%d", o->failback_ms);
	if (s->plan[0])
		DRILL_ENV("R2CC_DRILL=%s", s->plan);
#undef DRILL_ENV
	env[n] = NULL;
	return env;
}

pid_t drill_spawn_worker(const struct drill_opts *o, const struct drill_paths *p,
			 const struct drill_scenario *s, int rank)
{
	char a[13][40], log[PATH_MAX + 32], store[32768];
	char *argv[44];
	char **env;
	int n = 0, fd;
	pid_t pid;

	env = drill_worker_env(o, p, s, rank, store, sizeof(store));
	if (!env)
		return -1;
	snprintf(a[0], sizeof(a[0]), "%d", rank);
	snprintf(a[1], sizeof(a[1]), "%d", o->procs);
	snprintf(a[2], sizeof(a[2]), "%d", o->nics);
	snprintf(a[3], sizeof(a[3]), "%d", s->seed);
	snprintf(a[4], sizeof(a[4]), "%d", o->messages);
	snprintf(a[5], sizeof(a[5]), "%d", o->window);
	snprintf(a[6], sizeof(a[6]), "%llu", (unsigned long long)o->max_size);
	snprintf(a[7], sizeof(a[7]), "%g", o->timeout_s);
	snprintf(a[8], sizeof(a[8]), "%d", o->qp_timeout);
	snprintf(a[9], sizeof(a[9]), "%d", o->retry_cnt);
	snprintf(a[10], sizeof(a[10]), "%d", o->qps);
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
	argv[n++] = (char *)"--window";
	argv[n++] = a[5];
	argv[n++] = (char *)"--max-size";
	argv[n++] = a[6];
	argv[n++] = (char *)"--timeout";
	argv[n++] = a[7];
	argv[n++] = (char *)"--ib-timeout";
	argv[n++] = a[8];
	argv[n++] = (char *)"--retry-cnt";
	argv[n++] = a[9];
	argv[n++] = (char *)"--qps";
	argv[n++] = a[10];
	argv[n++] = (char *)"--dir";
	argv[n++] = (char *)s->dir;
	if (o->selftest_corrupt)
		argv[n++] = (char *)"--selftest-corrupt";
	if (o->flush)
		argv[n++] = (char *)"--flush";
	if (o->no_fusion)
		argv[n++] = (char *)"--no-fusion";
	if (o->mlx5dv) {
		argv[n++] = (char *)"--mlx5dv";
		argv[n++] = (char *)(o->mlx5dv == 2 ? "ooo" : "plain");
	}
	if (o->fresh_mr)
		argv[n++] = (char *)"--fresh-mr";
	if (o->churn)
		argv[n++] = (char *)"--churn";
	if (o->pattern != drill_pattern_default()) {
		argv[n++] = (char *)"--nccl-version";
		argv[n++] = (char *)o->pattern->name;
	}
	if (o->nccl_stub) {
		argv[n++] = (char *)"--nccl-lib";
		argv[n++] = (char *)p->nccl;
	}
	if (s->hold != DRILL_HOLD_NONE) {
		argv[n++] = (char *)"--hold-connect";
		argv[n++] = (char *)(s->hold == DRILL_HOLD_INIT ? "init" : "rts");
	}
	if (s->plan[0]) {
		snprintf(a[11], sizeof(a[11]), "%llu", (unsigned long long)s->coll_at);
		argv[n++] = (char *)"--collective-at";
		argv[n++] = a[11];
		if (!o->inject_own)
			argv[n++] = (char *)"--collective-sum";
	}
	argv[n] = NULL;
	snprintf(log, sizeof(log), "%s/worker%d.log", s->dir, rank);
	pid = fork();
	if (pid == 0) {
		fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (fd >= 0) {
			dup2(fd, STDOUT_FILENO);
			dup2(fd, STDERR_FILENO);
		}
		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		execve(p->exe, argv, env);
		_exit(127);
	}
	free(env);
	return pid;
}

/* RoCE: no byte of the scenario may have left the lossless class (softverbs-ctl
 * list's lossy_bytes, every NIC); a failure names the NIC. */
/* Runs softverbs-ctl list: its output (appended to the scenario's ctl.log), open at its
 * first line, or NULL when it failed. */
FILE *drill_ctl_list(const struct drill_paths *p, const struct drill_scenario *s)
{
	char *list[] = {(char *)"list", NULL}, path[PATH_MAX + 16];
	struct stat st;
	FILE *f;
	long from;

	snprintf(path, sizeof(path), "%s/ctl.log", s->dir);
	from = stat(path, &st) == 0 ? (long)st.st_size : 0;
	if (drill_ctl(p, s, list) != 0 || !(f = fopen(path, "r")))
		return NULL;
	fseek(f, from, SEEK_SET);
	return f;
}

void drill_check_lossless(const struct drill_paths *p, struct drill_scenario *s)
{
	char line[512];
	FILE *f = drill_ctl_list(p, s);
	bool listed = false;

	if (!f) {
		snprintf(s->why, sizeof(s->why), "softverbs-ctl list of %s failed", s->fabric);
		return;
	}
	while (fgets(line, sizeof(line), f)) {
		const char *l = strstr(line, " lossy_bytes="), *node = strstr(line, "node=");
		const char *nic = strstr(line, " name=");
		unsigned long long n;

		if (strncmp(line, "nic ", 4) || !l || sscanf(l, " lossy_bytes=%llu", &n) != 1)
			continue;
		listed = true;
		if (n && !s->why[0])
			snprintf(s->why, sizeof(s->why),
				 "%llu bytes left the lossless class (%.*s, %.*s)", n,
				 node ? (int)strcspn(node, " ") : 0, node ? node : "",
				 nic ? (int)strcspn(nic + 1, " ") : 0, nic ? nic + 1 : "");
	}
	fclose(f);
	if (!listed && !s->why[0])
		snprintf(s->why, sizeof(s->why), "softverbs-ctl list of %s shows no NIC",
			 s->fabric);
}

/* Runs softverbs-ctl with its output in the scenario's ctl.log; 0 if it succeeded. */
int drill_ctl(const struct drill_paths *p, const struct drill_scenario *s, char *const args[])
{
	char *argv[16], log[PATH_MAX + 16];
	posix_spawn_file_actions_t fa;
	int n = 0, status = 0, rc;
	int64_t end = drill_now_ns() + DRILL_CTL_WAIT_NS;
	pid_t pid;

	argv[n++] = (char *)"softverbs-ctl";
	argv[n++] = (char *)"--fabric";
	argv[n++] = (char *)s->fabric;
	for (int i = 0; args[i] && n < 15; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	snprintf(log, sizeof(log), "%s/ctl.log", s->dir);
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log, O_WRONLY | O_CREAT | O_APPEND,
					 0600);
	posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
	rc = posix_spawn(&pid, p->ctl, &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (rc)
		return -rc;
	while ((rc = waitpid(pid, &status, WNOHANG)) == 0) {
		struct timespec ts = {0, 200000};

		if (drill_now_ns() > end) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			return -ETIMEDOUT;
		}
		nanosleep(&ts, NULL);
	}
	return rc > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -EIO;
}

double drill_qp_timeout_ms(const struct drill_opts *o)
{
	return 4.096e-3 * (double)(1ull << o->qp_timeout) * (o->retry_cnt + 1) * o->time_scale;
}

/* R2CC's stall floor as the workers get it: R2CC_STALL_MS, or its default (auto). */
double drill_stall_floor_ms(void)
{
	const char *v = getenv("R2CC_STALL_MS");
	char *end;
	long ms = v ? strtol(v, &end, 10) : 0;

	return v && *v && !*end && ms > 0 ? (double)ms : 20.0;
}
