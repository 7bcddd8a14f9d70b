/*
 * R2CC_ON_INCIDENT: a command run at the end of each incident (every queue pair it
 * took moved or failed, and 0.2 s more for the peers' queue pairs that join it), with
 * the incident's JSON on standard input and R2CC_INCIDENT_* variables:
 *
 *   R2CC_INCIDENT_KIND      repair | failback
 *   R2CC_INCIDENT_DRILL     1 when R2CC_DRILL made it (repair/drill.h), else 0
 *   R2CC_INCIDENT_NIC       this process's NIC (mlx5_2)
 *   R2CC_INCIDENT_EVIDENCE  what found it (the report's evidence)
 *   R2CC_INCIDENT_QPS, _MIGRATED, _FAILED   its queue pairs
 *   R2CC_INCIDENT_MS        detection to the last queue pair moved
 *   R2CC_INCIDENT_HOST, _NODE, _PID         where
 *
 * One thread ("r2cc-hook") runs it with /bin/sh -c, in a process group of its own,
 * stdout and stderr to /dev/null, without this library in its LD_PRELOAD. It never
 * blocks hot repair (which only wakes it) and is bounded: at most
 * R2CC_ON_INCIDENT_MAX runs a minute (the rest are counted in one log line a minute),
 * each killed after R2CC_ON_INCIDENT_TIMEOUT_MS. A command that fails, hangs or cannot
 * start costs one log line. An incident that settles in the last 0.2 s before the
 * process exits is not told.
 */
#include "repair/engine_priv.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define SETTLE_NS 200000000ll /* peers' queue pairs join an incident within this */
#define WINDOW_NS 60000000000ll

static pthread_mutex_t hook_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hook_cond = PTHREAD_COND_INITIALIZER;
static bool hook_started, hook_woken;

struct told {
	char *json;
	char env[12][192];
	int nenv;
};

static void add_env(struct told *t, const char *k, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void add_env(struct told *t, const char *k, const char *fmt, ...)
{
	if (t->nenv == 12)
		return;
	char v[160];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(v, sizeof(v), fmt, ap);
	va_end(ap);
	for (char *c = v; *c; c++)
		if (*c == '\n')
			*c = ' ';
	snprintf(t->env[t->nenv++], sizeof(t->env[0]), "R2CC_INCIDENT_%s=%s", k, v);
}

/* The first incident settled long enough and not told yet; under r2cc_eng.mu. */
static bool take(struct told *t, int64_t now, double mono_to_unix)
{
	for (int i = 0; i < r2cc_eng.ninc; i++) {
		struct incident *in = &r2cc_eng.inc[i];
		if (!in->settled || in->told || in->declared || now - in->t_settled < SETTLE_NS)
			continue;
		in->told = true;
		size_t len = 0;
		FILE *f = open_memstream(&t->json, &len);
		if (!f)
			return false;
		r2cc_incident_json(f, in, mono_to_unix);
		fputc('\n', f);
		fclose(f);
		char host[64], node[64];
		add_env(t, "KIND", "%s", in->failback ? "failback" : "repair");
		add_env(t, "DRILL", "%d", in->drill);
		add_env(t, "NIC", "%s", in->nic);
		add_env(t, "EVIDENCE", "%s", in->evidence);
		add_env(t, "QPS", "%d", in->qps);
		add_env(t, "MIGRATED", "%d", in->migrated);
		add_env(t, "FAILED", "%d", in->failed);
		add_env(t, "MS", "%.3f",
			((in->t_done ? in->t_done : in->t_settled) - in->t_detect) / 1e6);
		add_env(t, "HOST", "%s", r2cc_host_name(host, sizeof(host)));
		add_env(t, "NODE", "%s", r2cc_node_key(node, sizeof(node)));
		add_env(t, "PID", "%d", (int)getpid());
		return true;
	}
	return false;
}

/* The command's environment: ours less LD_PRELOAD (R2CC stays out of it), plus
 * the incident's variables. NULL when out of memory. */
static char **child_env(struct told *t)
{
	size_t n = 0;
	for (char **e = environ; *e; e++)
		n++;
	char **env = calloc(n + (size_t)t->nenv + 1, sizeof(*env));
	if (!env)
		return NULL;
	size_t k = 0;
	for (char **e = environ; *e; e++)
		if (strncmp(*e, "LD_PRELOAD=", 11) && strncmp(*e, "R2CC_INCIDENT_", 14))
			env[k++] = *e;
	for (int i = 0; i < t->nenv; i++)
		env[k++] = t->env[i];
	env[k] = NULL;
	return env;
}

/* Runs the command once; one log line when it does not go well. */
static void run_one(struct told *t)
{
	const char *cmd = r2cc_param.on_incident;
	int p[2];
	if (pipe2(p, O_CLOEXEC)) {
		R2CC_WARN("R2CC_ON_INCIDENT: cannot make a pipe (%s); incident not told",
			  strerror(errno));
		return;
	}
	char **env = child_env(t);
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, p[0], 0);
	posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
	posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
	posix_spawnattr_init(&at);
	sigset_t none, all;
	sigemptyset(&none);
	sigfillset(&all);
	posix_spawnattr_setsigmask(&at, &none);
	posix_spawnattr_setsigdefault(&at, &all);
	posix_spawnattr_setpgroup(&at, 0);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
					  POSIX_SPAWN_SETSIGDEF);
	char *argv[] = {"sh", "-c", (char *)cmd, NULL};
	pid_t pid = -1;
	int rc = env ? posix_spawn(&pid, "/bin/sh", &fa, &at, argv, env) : ENOMEM;
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&at);
	free(env);
	close(p[0]);
	if (rc) {
		close(p[1]);
		R2CC_WARN("R2CC_ON_INCIDENT: cannot start /bin/sh (%s); incident not told",
			  strerror(rc));
		return;
	}
	/* The JSON is a few KiB, under the pipe's buffer: written at once, or cut
	 * short if the command does not read it. */
	fcntl(p[1], F_SETFL, O_NONBLOCK);
	size_t len = strlen(t->json), off = 0;
	while (off < len) {
		ssize_t w = write(p[1], t->json + off, len - off);
		if (w <= 0)
			break;
		off += (size_t)w;
	}
	close(p[1]);
	int64_t until = now_ns() + (int64_t)r2cc_param.on_incident_timeout_ms * 1000000;
	int st = 0;
	pid_t w;
	while ((w = waitpid(pid, &st, WNOHANG)) == 0 && now_ns() < until)
		usleep(5000);
	if (w == 0) {
		kill(-pid, SIGKILL);
		waitpid(pid, &st, 0);
		R2CC_WARN("R2CC_ON_INCIDENT: the command ran longer than %d ms and was killed",
			  r2cc_param.on_incident_timeout_ms);
	} else if (w < 0) {
		R2CC_WARN("R2CC_ON_INCIDENT: cannot wait for the command (%s)", strerror(errno));
	} else if (WIFSIGNALED(st)) {
		R2CC_WARN("R2CC_ON_INCIDENT: the command died of signal %d", WTERMSIG(st));
	} else if (WEXITSTATUS(st)) {
		R2CC_WARN("R2CC_ON_INCIDENT: the command exited with status %d%s", WEXITSTATUS(st),
			  WEXITSTATUS(st) == 127 ? " (not found?)" : "");
	} else {
		R2CC_INFO("R2CC_ON_INCIDENT: told (%s)", t->env[0]);
	}
}

static void *hook_main(void *arg)
{
	(void)arg;
	int64_t runs[600];
	int nruns = 0;
	uint64_t dropped = 0;
	int64_t last_drop_note = 0;
	for (;;) {
		pthread_mutex_lock(&hook_mu);
		if (!hook_woken) {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += 100000000;
			if (ts.tv_nsec >= 1000000000) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&hook_cond, &hook_mu, &ts);
		}
		hook_woken = false;
		pthread_mutex_unlock(&hook_mu);
		for (;;) {
			struct told t = {0};
			int64_t now = now_ns();
			double m2u = r2cc_mono_to_unix();
			pthread_mutex_lock(&r2cc_eng.mu);
			bool got = take(&t, now, m2u);
			pthread_mutex_unlock(&r2cc_eng.mu);
			if (!got)
				break;
			int k = 0;
			for (int i = 0; i < nruns; i++)
				if (now - runs[i] < WINDOW_NS)
					runs[k++] = runs[i];
			nruns = k;
			if (nruns >= r2cc_param.on_incident_max) {
				dropped++;
				if (now - last_drop_note >= WINDOW_NS) {
					R2CC_WARN("R2CC_ON_INCIDENT: more than %d incidents a "
						  "minute; %llu "
						  "not told so far (R2CC_ON_INCIDENT_MAX)",
						  r2cc_param.on_incident_max,
						  (unsigned long long)dropped);
					last_drop_note = now;
				}
			} else {
				runs[nruns++] = now;
				run_one(&t);
			}
			free(t.json);
		}
	}
	return NULL;
}

/* From hot repair, under r2cc_eng.mu: never waits. */
void r2cc_hook_wake(void)
{
	if (!r2cc_param.on_incident[0])
		return;
	pthread_mutex_lock(&hook_mu);
	if (!hook_started) {
		hook_started = true;
		if (r2cc_thread_start(hook_main, NULL, "r2cc-hook"))
			R2CC_WARN(
			    "R2CC_ON_INCIDENT: cannot start its thread; incidents are not told");
	}
	hook_woken = true;
	pthread_cond_signal(&hook_cond);
	pthread_mutex_unlock(&hook_mu);
}
