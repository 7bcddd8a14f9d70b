/*
 * libnccl-net-testnet.so: a net plugin of the project's own, for the tests of what
 * R2CC says about the network NCCL chose (intercept/netcheck.h). It carries no
 * traffic and opens no RDMA device: NCCL's test double (ncclstub.c) loads it as NCCL
 * loads a plugin, calls its init and devices, and that is all. Like HPC-X's plugin,
 * its struct's name changes at init: to TESTNET_NAME when set (e.g. "UCX", what HPC-X's
 * plugin answers over UCX), else "TestNet". Before init it is TESTNET_PREINIT_NAME when
 * set (e.g. "NCCL RDMA Plugin v8", HPC-X's own), for `r2cc doctor`'s tests.
 */
#include <stddef.h>
#include <stdlib.h>

#define EXPORT __attribute__((visibility("default")))

static int tn_init(void *logger);
static int tn_devices(int *ndev);

/* ncclNet_v8_t's first three members; NCCL's other members are never called here. */
EXPORT struct {
	const char *name;
	int (*init)(void *logger);
	int (*devices)(int *ndev);
	void *rest[16];
} ncclNetPlugin_v8 = {"TestNet (not initialised)", tn_init, tn_devices, {NULL}};

__attribute__((constructor)) static void tn_load(void)
{
	const char *n = getenv("TESTNET_PREINIT_NAME");
	if (n && *n)
		ncclNetPlugin_v8.name = n;
}

static int tn_init(void *logger)
{
	(void)logger;
	const char *n = getenv("TESTNET_NAME");
	ncclNetPlugin_v8.name = n && *n ? n : "TestNet";
	return 0;
}

static int tn_devices(int *ndev)
{
	*ndev = 1;
	return 0;
}
