/*
 * The two-process harness of the device's multi-process tests (see harness.h).
 */
#include "tests/softverbs/harness.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

char ctl_path[PATH_MAX];
char fabric[64];

void sv_test_fail(char role, int line, const char *cond, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "FAIL [%c] line %d: %s ", role, line, cond);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
	exit(1);
}

/* CHECK for the harness's own calls, which have a role but no peer. */
#define CHECK_ROLE(role, cond, ...)                                                                \
	do {                                                                                       \
		if (!(cond))                                                                       \
			sv_test_fail(role, __LINE__, #cond, "" __VA_ARGS__);                       \
	} while (0)

void sv_sync_send(char role, int sock, int tag)
{
	CHECK_ROLE(role, write(sock, &tag, sizeof(tag)) == sizeof(tag));
}

void sv_sync_wait(char role, int sock, int tag)
{
	int got = -1;

	CHECK_ROLE(role, read(sock, &got, sizeof(got)) == sizeof(got), "(peer gone)");
	CHECK_ROLE(role, got == tag, "(got sync %d, want %d)", got, tag);
}

void fill(uint8_t *b, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		b[i] = (uint8_t)(i * 131 + seed);
}

bool check_fill(const uint8_t *b, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		if (b[i] != (uint8_t)(i * 131 + seed))
			return false;
	return true;
}

void sv_put_env(const char *env)
{
	char buf[512], *save = NULL, *tok;

	if (!env)
		return;
	snprintf(buf, sizeof(buf), "%s", env);
	for (tok = strtok_r(buf, ";", &save); tok; tok = strtok_r(NULL, ";", &save))
		putenv(strdup(tok));
}

static pid_t spawn(char role, int sock, int other,
		   void (*child)(const void *arg, char role, int sock), const void *arg)
{
	pid_t pid = fork();

	if (pid == 0) {
		close(other);
		alarm(30);
		child(arg, role, sock);
		exit(0);
	}
	return pid;
}

bool sv_run_pair(const char *prefix, const struct sv_pair *t,
		 void (*child)(const void *arg, char role, int sock), const void *arg)
{
	static int seq;
	static bool kept;
	int sv[2], st_a = 0, st_b = 0;
	double t0 = now_ms();
	char path[96];
	pid_t a, b;
	bool ok;

	if (!kept)
		snprintf(fabric, sizeof(fabric), "%s-%d-%d", prefix, (int)getpid(), seq++);
	kept = t->keep;
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
		return false;
	a = spawn('A', sv[0], sv[1], child, arg);
	b = spawn('B', sv[1], sv[0], child, arg);
	close(sv[0]);
	close(sv[1]);
	waitpid(a, &st_a, 0);
	waitpid(b, &st_b, 0);
	ok = WIFEXITED(st_a) && WEXITSTATUS(st_a) == 0 &&
	     (t->b_dies ? WIFSIGNALED(st_b) && WTERMSIG(st_b) == SIGKILL
			: WIFEXITED(st_b) && WEXITSTATUS(st_b) == 0);
	if (ok && t->verdict)
		ok = t->verdict();
	snprintf(path, sizeof(path), "/%s", fabric);
	if (!t->keep)
		shm_unlink(path);
	printf("%s %s (%.0f ms)\n", ok ? "ok  " : "FAIL", t->name, now_ms() - t0);
	if (!ok)
		printf("     A: %s %d, B: %s %d\n", WIFSIGNALED(st_a) ? "signal" : "exit",
		       WIFSIGNALED(st_a) ? WTERMSIG(st_a) : WEXITSTATUS(st_a),
		       WIFSIGNALED(st_b) ? "signal" : "exit",
		       WIFSIGNALED(st_b) ? WTERMSIG(st_b) : WEXITSTATUS(st_b));
	fflush(stdout);
	return ok;
}

int sv_test_init(void)
{
	ssize_t n = readlink("/proc/self/exe", ctl_path, sizeof(ctl_path) - 64);

	if (n <= 0)
		return -1;
	ctl_path[n] = '\0';
	*strrchr(ctl_path, '/') = '\0';
	strcat(ctl_path, "/../../bin/softverbs-ctl");
	setvbuf(stdout, NULL, _IOLBF, 0);
	return 0;
}

int sv_run_named(int argc, char **argv, size_t n, const char *(*name)(size_t i),
		 bool (*run)(size_t i))
{
	int failed = 0, ran = 0;

	for (size_t i = 0; i < n; i++) {
		bool pick = argc == 1;

		for (int k = 1; k < argc; k++)
			pick |= strcmp(argv[k], name(i)) == 0;
		if (!pick)
			continue;
		ran++;
		failed += !run(i);
	}
	printf("%d tests, %d failed\n", ran, failed);
	return failed || !ran ? 1 : 0;
}
