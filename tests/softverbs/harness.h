/*
 * The two-process harness of the device's multi-process tests (conformance, roce):
 * each test forks node "A" and node "B" on a private fabric, joined by a socketpair
 * for synchronisation; a failed CHECK ends the process with the line that failed, and
 * the parent prints one "ok"/"FAIL" line per test and a count. A program keeps its
 * own `struct peer`; the harness needs of it only the members `role` ('A' or 'B') and
 * `sock` (its end of the socketpair).
 */
#ifndef SV_TEST_HARNESS_H
#define SV_TEST_HARNESS_H

#include "tests/common/util.h"

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* softverbs-ctl next to the test (set by sv_test_init) and the running test's fabric. */
extern char ctl_path[PATH_MAX];
extern char fabric[64];

/* Prints "FAIL [role] line N: cond ..." to stderr and exits 1. */
__attribute__((noreturn)) void sv_test_fail(char role, int line, const char *cond, const char *fmt,
					    ...);

#define CHECK(p, cond, ...)                                                                        \
	do {                                                                                       \
		if (!(cond))                                                                       \
			sv_test_fail((p) ? (p)->role : '-', __LINE__, #cond, "" __VA_ARGS__);      \
	} while (0)

/* One tag through the socketpair, and waiting for the peer's (a CHECK failure if
 * the peer is gone or sent another). */
void sv_sync_send(char role, int sock, int tag);
void sv_sync_wait(char role, int sock, int tag);
#define sync_send(p, tag) sv_sync_send((p)->role, (p)->sock, (tag))
#define sync_wait(p, tag) sv_sync_wait((p)->role, (p)->sock, (tag))

/* The tests' data: byte i of a buffer filled with `seed` is (uint8_t)(i * 131 + seed). */
void fill(uint8_t *b, size_t len, unsigned seed);
bool check_fill(const uint8_t *b, size_t len, unsigned seed);

/* putenv of each NAME=VALUE of a ';'-separated list; NULL does nothing. */
void sv_put_env(const char *env);

/* What the parent needs of a test. */
struct sv_pair {
	const char *name;
	bool b_dies;	       /* B ends by SIGKILL, not exit(0) */
	bool keep;	       /* leave the fabric to the next test */
	bool (*verdict)(void); /* then, in this process: whether the runs' results hold */
};

/* Runs one test: a fresh fabric "<prefix>-<pid>-<n>" (or the one the last test kept),
 * forks A and B, each with a 30 s alarm, calling child(arg, role, sock) and exiting 0;
 * waits for both and prints the result line. Returns whether it passed. */
bool sv_run_pair(const char *prefix, const struct sv_pair *t,
		 void (*child)(const void *arg, char role, int sock), const void *arg);

/* Finds softverbs-ctl (bin/ next to the test's build folder) and makes stdout line
 * buffered; -1 if this program's path cannot be read. */
int sv_test_init(void);

/* Runs the n tests whose names are given on the command line, all of them with none;
 * prints "N tests, M failed" and returns main's exit status. */
int sv_run_named(int argc, char **argv, size_t n, const char *(*name)(size_t i),
		 bool (*run)(size_t i));

#endif
