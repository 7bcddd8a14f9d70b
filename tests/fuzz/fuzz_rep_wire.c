/*
 * libFuzzer target: hot repair's exchange messages (repair/engine.c) as the
 * control thread receives them from a peer: the check that decides what the
 * repair thread is handed. What passes must carry a known version and op and
 * NUL-terminated NIC names.
 */
#include "repair/engine.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	unsigned char m[R2CC_REPAIR_WIRE_SIZE];
	if (r2cc_repair_wire_parse(data, size, m) != 0)
		return 0;
	/* version 1, op 1..4; the names end at bytes 59 and 123 of the packed struct. */
	if (size != R2CC_REPAIR_WIRE_SIZE || m[0] != 1 || m[1] < 1 || m[1] > 4 ||
	    strnlen((const char *)m + 60, 64) == 64 || strnlen((const char *)m + 124, 64) == 64)
		abort();
	return 0;
}
