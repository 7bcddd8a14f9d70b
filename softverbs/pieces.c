/*
 * What the soft device's ordered small writes cost in the kernel: one
 * process_vm_writev of SIZE bytes into another process, its local side cut into
 * PIECES equal pieces (the device cuts writes of up to 1 KiB into 8-byte words,
 * so that they land in address order: exec.c, sv_split_local). Best mean of 5
 * rounds of ITERS calls, per size and piece count, side by side in one run.
 *
 *   softverbs-pieces [--iters N]
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
	static char target[4096] __attribute__((aligned(64)));
	static struct iovec l[512];
	long iters = 200000;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
			iters = atol(argv[++i]);
		} else {
			fprintf(stderr, "usage: softverbs-pieces [--iters N]\n");
			return 2;
		}
	}
	if (iters < 1)
		iters = 1;
	char *src = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (src == MAP_FAILED)
		return 1;
	memset(src, 0x5a, 1 << 16);
	pid_t child = fork(); /* the target: the same address of its own copy */
	if (child < 0)
		return 1;
	if (child == 0) {
		for (;;)
			pause();
	}
	static const int sizes[] = {1024, 2048}, pieces[] = {1, 16, 32, 64, 128};
	printf("%8s %8s %10s\n", "bytes", "pieces", "ns/call");
	int rc = 0;
	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++)
		for (size_t pi = 0; pi < sizeof(pieces) / sizeof(pieces[0]); pi++) {
			int n = sizes[si], k = pieces[pi];
			struct iovec r = {target, (size_t)n};
			for (int i = 0; i < k; i++)
				l[i] = (struct iovec){src + (size_t)i * (size_t)(n / k),
						      (size_t)(n / k)};
			double best = 1e30;
			for (int rep = 0; rep < 5; rep++) {
				double t0 = now_ns();
				for (long i = 0; i < iters; i++)
					if (process_vm_writev(child, l, (unsigned long)k, &r, 1,
							      0) != n)
						rc = 1;
				double d = (now_ns() - t0) / (double)iters;
				best = d < best ? d : best;
			}
			printf("%8d %8d %10.0f\n", n, k, best);
		}
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	if (rc)
		fprintf(stderr, "softverbs-pieces: a process_vm_writev moved fewer bytes\n");
	return rc;
}
