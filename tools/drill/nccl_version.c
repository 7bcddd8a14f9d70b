/*
 * --nccl-version: the verbs pattern of each family of NCCL releases, as far as it
 * differs in what net_ib posts and creates (docs/nccl-versions.md has the sources):
 * the number of request slots, the layout of the FIFO element the receiver writes
 * into the sender's clear-to-send FIFO, whether a connection spans the NICs of a fused
 * virtual NIC, and whether the QPs that receive nothing have a receive queue. worker.c asks this
 * table instead of hard-coding NCCL 2.28's values.
 */
#include "tools/drill/drill.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct drill_pattern patterns[] = {
    /*
     * 2.18-2.19: MAX_REQUESTS 8 x 8 = 64; struct ncclIbSendFifo {addr; int size; rkey;
     * nreqs; tag; idx} is 32 bytes; no NIC fusion, so a connection's QPs sit on one NIC,
     * every clear-to-send goes on qps[0] and is signalled when slot == 0; the data is
     * split over every QP (NCCL_IB_SPLIT_DATA_ON_QPS=1 then).
     */
    {"2.18", "2.18-2.19", 64, 32, 8, 4, 12, 1, 16, 20, 24, true, false, 21805, true},
    /* 2.20-2.23: 256 slots; rkeys[2] (NCCL_IB_MAX_DEVS_PER_NIC 2), int size, idx at 32. */
    {"2.20", "2.20-2.23", 256, 64, 8, 4, 12, 2, 20, 24, 32, false, false, 22005, true},
    /* 2.24-2.28: uint64_t size, rkeys[4], idx at 40 (the drill's own layout). */
    {"2.28", "2.24-2.28", 256, 64, 8, 8, 16, 4, 32, 36, 40, false, false, 22803, true},
    /* 2.29: as 2.28, and the QPs that receive nothing (the sender's, the GPU flush QPs)
     * are made with max_recv_wr 0; a flush QP with max_send_wr 256. */
    {"2.29", "2.29", 256, 64, 8, 8, 16, 4, 32, 36, 40, false, true, 22907, false},
    /* 2.30 on: rkeys[8] (NCCL_NET_MAX_DEVS_PER_NIC 8), no padding, idx at 56. */
    {"2.30", "2.30-2.32", 256, 64, 8, 8, 16, 8, 48, 52, 56, false, true, 23003, false},
};

_Static_assert(offsetof(struct drill_fifo_elem, size) == 8 &&
		   offsetof(struct drill_fifo_elem, rkeys) == 16 &&
		   offsetof(struct drill_fifo_elem, nreqs) == 32 &&
		   offsetof(struct drill_fifo_elem, tag) == 36 &&
		   offsetof(struct drill_fifo_elem, idx) == 40,
	       "the 2.28 row of the table is struct drill_fifo_elem's layout");

/* The newest family: a connection over a fused virtual NIC of 3 NICs (the drill's
 * default) is one hot repair can make exactly-once only from 2.29 on (repair/model/cts.h). */
const struct drill_pattern *drill_pattern_default(void)
{
	return &patterns[4];
}

/* "2.18", "2.21.5", ...: the family of that release; NULL outside 2.18-2.32. */
const struct drill_pattern *drill_pattern_find(const char *version)
{
	unsigned major, minor;
	char rest[16] = "";

	if (sscanf(version, "%u.%u%15s", &major, &minor, rest) < 2 || major != 2 || minor < 18 ||
	    minor > 32)
		return NULL;
	if (rest[0] &&
	    (rest[0] != '.' || strspn(rest + 1, "0123456789") != strlen(rest + 1) || !rest[1]))
		return NULL;
	if (minor < 20)
		return &patterns[0];
	if (minor < 24)
		return &patterns[1];
	if (minor < 29)
		return &patterns[2];
	if (minor < 30)
		return &patterns[3];
	return &patterns[4];
}

/*
 * NCCL's pncclGetVersion, as the release the pattern stands for reports it: a preloaded
 * libr2cc.so learns the layout of the FIFO element from it (repair/model/cts.h), as it does
 * from the real NCCL. Exported from the program (module.mk); set by the worker.
 */
const struct drill_pattern *drill_pattern_reported;

int pncclGetVersion(int *version);
int pncclGetVersion(int *version)
{
	const struct drill_pattern *p = drill_pattern_reported;
	if (!version || !p)
		return 4; /* ncclInvalidArgument */
	*version = p->code;
	return 0;
}

/* Fields in order of offset, idx last: a reader that sees idx sees the rest. */
void drill_fifo_put(const struct drill_pattern *p, void *slot, const struct drill_fifo_elem *e)
{
	uint8_t *b = slot;
	uint32_t size32 = (uint32_t)e->size;
	int n = p->nrkeys < DRILL_MAX_NICS ? p->nrkeys : DRILL_MAX_NICS;

	memset(b, 0, (size_t)p->elem);
	memcpy(b, &e->addr, sizeof(e->addr));
	if (p->size_len == 4)
		memcpy(b + p->off_size, &size32, sizeof(size32));
	else
		memcpy(b + p->off_size, &e->size, sizeof(e->size));
	memcpy(b + p->off_rkeys, e->rkeys, (size_t)n * sizeof(e->rkeys[0]));
	memcpy(b + p->off_nreqs, &e->nreqs, sizeof(e->nreqs));
	memcpy(b + p->off_tag, &e->tag, sizeof(e->tag));
	__atomic_store_n((uint64_t *)(b + p->off_idx), e->idx, __ATOMIC_RELEASE);
}

uint64_t drill_fifo_idx(const struct drill_pattern *p, const void *slot)
{
	return __atomic_load_n((const uint64_t *)((const uint8_t *)slot + p->off_idx),
			       __ATOMIC_ACQUIRE);
}

void drill_fifo_get(const struct drill_pattern *p, const void *slot, struct drill_fifo_elem *e)
{
	const uint8_t *b = slot;
	uint32_t size32;
	int n = p->nrkeys < DRILL_MAX_NICS ? p->nrkeys : DRILL_MAX_NICS;

	memset(e, 0, sizeof(*e));
	e->idx = drill_fifo_idx(p, slot);
	memcpy(&e->addr, b, sizeof(e->addr));
	if (p->size_len == 4) {
		memcpy(&size32, b + p->off_size, sizeof(size32));
		e->size = size32;
	} else {
		memcpy(&e->size, b + p->off_size, sizeof(e->size));
	}
	memcpy(e->rkeys, b + p->off_rkeys, (size_t)n * sizeof(e->rkeys[0]));
	memcpy(&e->nreqs, b + p->off_nreqs, sizeof(e->nreqs));
	memcpy(&e->tag, b + p->off_tag, sizeof(e->tag));
}
