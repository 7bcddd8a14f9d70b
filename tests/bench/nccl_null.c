/*
 * A do-nothing libnccl.so.2 for measuring R2CC's wrapper cost: the
 * collectives return at once, weak ncclX and strong pncclX as in NCCL.
 */
#include <nccl.h>

#define NULL_COLL(name, params)                                                                    \
	ncclResult_t p##name params;                                                               \
	ncclResult_t p##name params                                                                \
	{                                                                                          \
		return ncclSuccess;                                                                \
	}                                                                                          \
	ncclResult_t name params __attribute__((weak, alias("p" #name)));

NULL_COLL(ncclAllReduce, (const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t o,
			  ncclComm_t c, cudaStream_t st))
NULL_COLL(ncclSend,
	  (const void *s, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st))

ncclResult_t pncclGetVersion(int *v);
ncclResult_t pncclGetVersion(int *v)
{
	*v = NCCL_VERSION_CODE;
	return ncclSuccess;
}
ncclResult_t ncclGetVersion(int *v) __attribute__((weak, alias("pncclGetVersion")));
