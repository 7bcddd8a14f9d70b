/*
 * libFuzzer target: hot repair's exchange messages (repair/wire.c) as the
 * control thread receives them from a peer: the check that decides what the
 * repair thread is handed. What passes must be a message of the current version whose
 * length is its header, its entries, each with a known op and NUL-terminated
 * NIC names, and exactly the rkey maps its header counts, each with two
 * NUL-terminated, non-empty NIC names and a body within the message, then exactly
 * the clear-to-send records its header counts, each for one of its entries, of a known
 * kind and with idx inside its element; each entry's records of retired messages no
 * more than it has room for and than its retired count, each with a known opcode.
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
	size_t at = R2CC_REPAIR_WIRE_HDR + (size_t)n * R2CC_REPAIR_WIRE_SIZE;
	if (n < 1 || n > R2CC_REPAIR_WIRE_MAX || data[0] != R2CC_REPAIR_WIRE_VERSION ||
	    (data[2] | data[3] << 8) != n || size < at)
		abort();
	for (int j = 0; j < data[1]; j++) {
		const uint8_t *h = data + at;
		if (size - at < R2CC_REPAIR_WIRE_MAP_HDR || !h[0] || !h[64] ||
		    strnlen((const char *)h, 64) == 64 || strnlen((const char *)h + 64, 64) == 64)
			abort();
		uint32_t len = h[128] | h[129] << 8 | h[130] << 16 | (uint32_t)h[131] << 24;
		if (len == 0 || len > size - at - R2CC_REPAIR_WIRE_MAP_HDR)
			abort();
		at += R2CC_REPAIR_WIRE_MAP_HDR + len;
	}
	uint32_t ncts = data[4] | data[5] << 8 | data[6] << 16 | (uint32_t)data[7] << 24;
	if ((size - at) % R2CC_REPAIR_WIRE_CTS || (size - at) / R2CC_REPAIR_WIRE_CTS != ncts)
		abort();
	for (; at < size; at += R2CC_REPAIR_WIRE_CTS) {
		const uint8_t *c = data + at;
		int entry = c[0] | c[1] << 8;
		/* kind 1 (query) or 2 (answer), 1..8 elements of 32 or 64 bytes, idx 8-aligned
		 * inside one, landed 0 or 1 */
		if (entry >= n || c[2] < 1 || c[2] > 2 || c[3] < 1 || c[3] > 8 ||
		    (c[4] != 32 && c[4] != 64) || c[5] % 8 || c[5] + 8 > c[4] || c[6] > 1)
			abort();
	}
	for (int i = 0; i < n; i++) {
		const unsigned char *m = out + (size_t)i * R2CC_REPAIR_WIRE_SIZE;
		/* op 1..7: REQ, REP, GO, NACK, SUSPECT, FAR_REQ, FAR_REP */
		if (m[0] < 1 || m[0] > 7 ||
		    strnlen((const char *)m + R2CC_REPAIR_WIRE_NEW_NIC, 64) == 64 ||
		    strnlen((const char *)m + R2CC_REPAIR_WIRE_ORIG_NIC, 64) == 64)
			abort();
		uint64_t sent = 0;
		for (int b = 7; b >= 0; b--)
			sent = sent << 8 | m[R2CC_REPAIR_WIRE_SENT + b];
		int nlost = m[R2CC_REPAIR_WIRE_SENT + 8];
		if (nlost > R2CC_REPAIR_WIRE_LOST || (uint64_t)nlost > sent)
			abort();
		for (int j = 0; j < nlost; j++)
			if (m[R2CC_REPAIR_WIRE_SENT + 9 + j] < 1 ||
			    m[R2CC_REPAIR_WIRE_SENT + 9 + j] > 3)
				abort();
	}
	return 0;
}
