/*
 * Loads the CUDA driver API lazily (see cuda.h). Versioned entry points
 * (_v2) are taken where the driver has them, as the runtime does.
 */
#include "strategies/cuda.h"
#include "shim/log.h"

#include <dlfcn.h>
#include <pthread.h>

static struct r2cc_cuda cuda;
static const struct r2cc_cuda *cuda_p;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;

static void *sym(void *h, const char *a, const char *b)
{
	void *f = dlsym(h, a);
	return f ? f : (b ? dlsym(h, b) : NULL);
}

static void load(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!h)
		h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) {
		R2CC_WARN("cannot load the CUDA driver (libcuda.so.1): %s", dlerror());
		return;
	}
#define S(field, a, b) *(void **)&cuda.field = sym(h, a, b)
	S(StreamCreate, "cuStreamCreate", NULL);
	S(StreamDestroy, "cuStreamDestroy_v2", "cuStreamDestroy");
	S(StreamSynchronize, "cuStreamSynchronize", NULL);
	S(StreamIsCapturing, "cuStreamIsCapturing", NULL);
	S(StreamWaitEvent, "cuStreamWaitEvent", NULL);
	S(EventCreate, "cuEventCreate", NULL);
	S(EventRecord, "cuEventRecord", NULL);
	S(EventDestroy, "cuEventDestroy_v2", "cuEventDestroy");
	S(MemAlloc, "cuMemAlloc_v2", "cuMemAlloc");
	S(MemFree, "cuMemFree_v2", "cuMemFree");
	S(MemcpyHtoD, "cuMemcpyHtoD_v2", "cuMemcpyHtoD");
	S(MemcpyDtoH, "cuMemcpyDtoH_v2", "cuMemcpyDtoH");
	S(MemAllocHost, "cuMemAllocHost_v2", "cuMemAllocHost");
	S(MemFreeHost, "cuMemFreeHost", NULL);
	S(MemsetD32Async, "cuMemsetD32Async", NULL);
	S(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync");
	S(EventSynchronize, "cuEventSynchronize", NULL);
	S(StreamQuery, "cuStreamQuery", NULL);
	S(EventQuery, "cuEventQuery", NULL);
#undef S
	void **f = (void **)&cuda;
	for (size_t i = 0; i < sizeof(cuda) / sizeof(void *); i++) {
		if (!f[i]) {
			R2CC_WARN(
			    "the CUDA driver lacks a function R2CC needs; strategies stay off");
			return;
		}
	}
	cuda_p = &cuda;
}

const struct r2cc_cuda *r2cc_cuda(void)
{
	pthread_once(&cuda_once, load);
	return cuda_p;
}
