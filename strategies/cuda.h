/*
 * The CUDA driver functions the strategies use, loaded from libcuda.so.1 at
 * run time (R2CC links no CUDA library). The driver is the one copy every
 * CUDA runtime in the process talks to, and its stream and event handles are
 * the runtime's cudaStream_t and cudaEvent_t.
 */
#ifndef R2CC_STRATEGIES_CUDA_H
#define R2CC_STRATEGIES_CUDA_H

#include <stddef.h>

struct r2cc_cuda {
	int (*StreamCreate)(void **stream, unsigned flags);
	int (*StreamDestroy)(void *stream);
	int (*StreamSynchronize)(void *stream);
	int (*StreamIsCapturing)(void *stream, int *status);
	int (*StreamWaitEvent)(void *stream, void *event, unsigned flags);
	int (*EventCreate)(void **event, unsigned flags);
	int (*EventRecord)(void *event, void *stream);
	int (*EventDestroy)(void *event);
	int (*MemAlloc)(unsigned long long *dptr, size_t bytes);
	int (*MemFree)(unsigned long long dptr);
	int (*MemcpyHtoD)(unsigned long long dst, const void *src, size_t bytes);
	int (*MemcpyDtoH)(void *dst, unsigned long long src, size_t bytes);
	int (*MemAllocHost)(void **p, size_t bytes);
	int (*MemFreeHost)(void *p);
	int (*MemsetD32Async)(unsigned long long dst, unsigned value, size_t n, void *stream);
	int (*MemcpyDtoHAsync)(void *dst, unsigned long long src, size_t bytes, void *stream);
	int (*EventSynchronize)(void *event);
	int (*StreamQuery)(void *stream); /* 0 done, 600 (CUDA_ERROR_NOT_READY) not yet */
	int (*EventQuery)(void *event);
};

#define R2CC_CU_STREAM_NON_BLOCKING  0x1
#define R2CC_CU_EVENT_DISABLE_TIMING 0x2

/* The table, or NULL (logged once) when the driver cannot be loaded. */
const struct r2cc_cuda *r2cc_cuda(void);

#endif
