/*
 * libFuzzer target: hot repair's exchange messages (repair/engine.c) as the
 * control thread receives them from a peer: the check that decides what the
 * repair thread is handed. What passes must be a version-2 message whose
 * length is its header and exactly its entries, each with a known op and
 * NUL-terminated NIC names.
 */
#include "repair/engine.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unsigned char out[R2CC_REPAIR_WIRE_MAX * R2CC_REPAIR_WIRE_SIZE];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int n = r2cc_repair_wire_parse(data, size, out, R2CC_REPAIR_WIRE_MAX);
	if (n < 0)
		return 0;
	if (n < 1 || n > R2CC_REPAIR_WIRE_MAX || data[0] != 2 || (data[2] | data[3] << 8) != n ||
	    size != R2CC_REPAIR_WIRE_HDR + (size_t)n * R2CC_REPAIR_WIRE_SIZE)
		abort();
	for (int i = 0; i < n; i++) {
		const unsigned char *m = out + (size_t)i * R2CC_REPAIR_WIRE_SIZE;
		/* op 1..5: REQ, REP, GO, NACK, SUSPECT */
		if (m[0] < 1 || m[0] > 5 ||
		    strnlen((const char *)m + R2CC_REPAIR_WIRE_NEW_NIC, 64) == 64 ||
		    strnlen((const char *)m + R2CC_REPAIR_WIRE_ORIG_NIC, 64) == 64)
			abort();
	}
	return 0;
}
