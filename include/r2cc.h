/*
 * R2CC's public C interface: the few functions libr2cc.so exports besides the
 * NCCL and verbs entry points it interposes. Tools (r2cc-perf's NIC table,
 * the live view) find them with dlsym(RTLD_DEFAULT, ...) so that they work with
 * or without R2CC loaded.
 */
#ifndef R2CC_H
#define R2CC_H

#include <stdint.h>

#define R2CC_NIC_NAME_MAX 64

enum r2cc_nic_state {
	R2CC_NIC_UP = 0,
	R2CC_NIC_DOWN = 1,     /* failure detected */
	R2CC_NIC_DECLARED = 2, /* declared failed (R2CC_FAILED_NODE/HCA) */
};

/* Traffic of this process through one physical NIC, since start. tx: work
 * requests this process posted to send (bytes are the sum of their scatter
 * lists); rx: receive completions it polled (bytes from the completions). */
struct r2cc_nic_stat {
	char name[R2CC_NIC_NAME_MAX];
	uint64_t tx_bytes, rx_bytes, tx_wrs, rx_wrs;
	int state; /* enum r2cc_nic_state */
	int pad;
};

/* Fills up to max entries; returns the number of NICs known (may exceed max). */
int r2cc_nic_stats(struct r2cc_nic_stat *out, int max);

/* The library's version string. */
const char *r2cc_version(void);

#endif
