/*
 * A stand-in libnccl.so.2 for the doctor's tests: only ncclGetVersion, whose
 * answer DOCTOR_STUB_NCCL_VERSION sets (default 22809, NCCL 2.28.9), so the
 * tests neither depend on the NCCL a machine has nor load a real one.
 */
#include <stdlib.h>

int ncclGetVersion(int *version);

int ncclGetVersion(int *version)
{
	const char *v = getenv("DOCTOR_STUB_NCCL_VERSION");

	*version = v ? atoi(v) : 22809;
	return 0;
}
