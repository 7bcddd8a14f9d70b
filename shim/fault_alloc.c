/*
 * The allocation side of fault injection (shim/fault.h): libr2cc.so is linked
 * with -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc (shim/module.mk), so
 * every allocation its own code makes comes here first; allocations inside
 * libc, OpenSSL or the verbs provider do not. Only libr2cc.so links this file:
 * test programs that compile the sources directly allocate as usual.
 */
#include "shim/fault.h"

#include <errno.h>
#include <stddef.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t align, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t k, size_t n);
void *__wrap_realloc(void *p, size_t n);
void *__wrap_aligned_alloc(size_t align, size_t n);

void *__wrap_malloc(size_t n)
{
	if (r2cc_fault_fire(R2CC_FAULT_ALLOC)) {
		errno = ENOMEM;
		return NULL;
	}
	return __real_malloc(n);
}

void *__wrap_calloc(size_t k, size_t n)
{
	if (r2cc_fault_fire(R2CC_FAULT_ALLOC)) {
		errno = ENOMEM;
		return NULL;
	}
	return __real_calloc(k, n);
}

void *__wrap_realloc(void *p, size_t n)
{
	if (r2cc_fault_fire(R2CC_FAULT_ALLOC)) {
		errno = ENOMEM;
		return NULL;
	}
	return __real_realloc(p, n);
}

void *__wrap_aligned_alloc(size_t align, size_t n)
{
	if (r2cc_fault_fire(R2CC_FAULT_ALLOC)) {
		errno = ENOMEM;
		return NULL;
	}
	return __real_aligned_alloc(align, n);
}
