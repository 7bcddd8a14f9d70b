/*
 * libFuzzer target: the rkey-map messages of repair/model/mr_mirror.c, a peer's
 * request as the serving side parses and answers it, and a map as the
 * fetching side decodes it. A request that decodes must re-encode to the
 * same bytes; an answer, when there is one, must decode as a map.
 */
#include "repair/model/mr_mirror.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct r2cc_mr_mirror_req req;
	if (r2cc_mr_mirror_req_decode(data, size, &req) == 0) {
		unsigned char out[512];
		int n = r2cc_mr_mirror_req_encode(&req, out, sizeof(out));
		if (n < 0 || (size_t)n != size || memcmp(out, data, size) != 0)
			abort();
	}
	unsigned char *reply = NULL;
	size_t rlen = 0;
	if (r2cc_mr_mirror_answer(data, size, &reply, &rlen) == 0) {
		struct r2cc_mr_mirror_map m;
		if (r2cc_mr_mirror_map_decode(reply, rlen, &m) != 0)
			abort();
		r2cc_mr_mirror_map_free(&m);
	}
	free(reply);
	struct r2cc_mr_mirror_map m;
	if (r2cc_mr_mirror_map_decode(data, size, &m) == 0) {
		for (uint32_t i = 1; i < m.count; i++)
			if (m.e[i].rkey_from < m.e[i - 1].rkey_from)
				abort();
		r2cc_mr_mirror_map_free(&m);
	}
	return 0;
}
