/*
 * Keeps a software-device fabric alive for the doctor's tests: a fabric with
 * no live process starts afresh when the next one attaches, so a fault set
 * with softverbs-ctl only lasts while some process is attached. This one
 * attaches as its node (SOFTVERBS_NODE / NCCL_HOSTID), prints "ready" and
 * waits until stdin closes or SECONDS (default 30) pass.
 */
#include <dlfcn.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	int secs = argc > 1 ? atoi(argv[1]) : 30;
	void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
	void **(*list)(int *);
	struct pollfd pfd = {.fd = 0, .events = POLLIN};
	char buf[64];
	int n = 0;

	if (!h) {
		fprintf(stderr, "hold: %s\n", dlerror());
		return 1;
	}
	list = (void **(*)(int *))dlsym(h, "ibv_get_device_list");
	if (!list || !list(&n)) {
		fprintf(stderr, "hold: no device list\n");
		return 1;
	}
	printf("ready %d\n", n);
	fflush(stdout);
	while (poll(&pfd, 1, secs * 1000) > 0 && read(0, buf, sizeof(buf)) > 0)
		;
	return 0;
}
