/*
 * A stand-in for one NCCL release's libnccl.so.2 in tests/compat: what
 * scripts/gpu/gpu-compat.sh's preflight looks at and no more. ncclGetVersion()
 * answers FAKE_NCCL_VERSION (a code such as 21803), and the library exports
 * the pncclX aliases R2CC forwards to. With -DFAKE_NCCL_OLD it lacks what
 * NCCL 2.18 lacks, as the real 2.18.3 does.
 */
#define FAKE_EXPORT __attribute__((visibility("default")))

FAKE_EXPORT int ncclGetVersion(int *version)
{
	*version = FAKE_NCCL_VERSION;
	return 0;
}

FAKE_EXPORT int pncclGetVersion(int *version)
{
	return ncclGetVersion(version);
}

#define FAKE_FN(name)                                                                              \
	FAKE_EXPORT int pnccl##name(void)                                                          \
	{                                                                                          \
		return 5;                                                                          \
	}
FAKE_FN(GetUniqueId)
FAKE_FN(CommInitRank)
FAKE_FN(CommInitRankConfig)
FAKE_FN(CommInitAll)
FAKE_FN(CommSplit)
FAKE_FN(CommFinalize)
FAKE_FN(CommDestroy)
FAKE_FN(CommAbort)
FAKE_FN(AllReduce)
FAKE_FN(Broadcast)
FAKE_FN(Bcast)
FAKE_FN(Reduce)
FAKE_FN(AllGather)
FAKE_FN(ReduceScatter)
FAKE_FN(Send)
FAKE_FN(Recv)
FAKE_FN(CommGetAsyncError)
FAKE_FN(GroupStart)
FAKE_FN(GroupEnd)
FAKE_FN(CommCount)
FAKE_FN(CommUserRank)
FAKE_FN(CommCuDevice)
#ifndef FAKE_NCCL_OLD
FAKE_FN(CommInitRankScalable)
FAKE_FN(CommShrink)
FAKE_FN(AlltoAll)
FAKE_FN(Gather)
FAKE_FN(Scatter)
FAKE_FN(GroupSimulateEnd)
#endif
