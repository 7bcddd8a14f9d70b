/*
 * Introspection API of the software RDMA device (build/softverbs/libibverbs.so.1),
 * for tools that want the emulated NICs' state and traffic counters. Find it with
 * dlsym(RTLD_DEFAULT, "softverbs_nic_stats") in a process that loaded the device.
 */
#ifndef SOFTVERBS_H
#define SOFTVERBS_H

#include <stdint.h>

enum softverbs_nic_state {
	SOFTVERBS_NIC_UP = 0,
	SOFTVERBS_NIC_DOWN = 1,
	SOFTVERBS_NIC_BLACKHOLE = 2,
	SOFTVERBS_NIC_FLAP = 3,
	SOFTVERBS_NIC_SLOW = 4,
	SOFTVERBS_NIC_ACKLOSS = 5,
	SOFTVERBS_NIC_BLACKHOLE_TX = 6,
	SOFTVERBS_NIC_BLACKHOLE_RX = 7,
	SOFTVERBS_NIC_FATAL = 8,
	SOFTVERBS_NIC_JITTER = 9,
};

struct softverbs_nic_stat {
	char node[64];
	char name[64];
	int gbps;
	int state; /* enum softverbs_nic_state: the fault set on the NIC */
	uint64_t tx_bytes, rx_bytes, tx_packets, rx_packets;
};

/*
 * Fills `out` with up to `max` NICs of node `node` (NULL = all nodes) of the fabric
 * named by SOFTVERBS_FABRIC; returns the number filled, or -errno.
 */
int softverbs_nic_stats(const char *node, struct softverbs_nic_stat *out, int max);

/*
 * RoCE mode with SOFTVERBS_LOSSLESS_TC: the bytes NIC `nic` of node `node` sent
 * outside the lossless traffic class, in *bytes (0 in IB mode or without the
 * setting); returns 0, -ENOENT (no such NIC) or -errno. A function of its own because
 * struct softverbs_nic_stat is filled as an array and so cannot grow.
 */
int softverbs_nic_lossy_bytes(const char *node, const char *nic, uint64_t *bytes);

/*
 * Device memory (SOFTVERBS_DMABUF=1, ibv_reg_dmabuf_mr): of the bytes [addr, addr + len)
 * (iova, as a peer addresses them) of this process's MR `mr`, which were written through a NIC that
 * no RDMA READ through it ordered since (GPUDirect's flush: on hardware the GPU might still read
 * the old bytes). Returns how many NICs owe a flush, their indices in the node
 * (SOFTVERBS_NICS order) as bits of *nics, and in *overflow (if not NULL) how many
 * device-memory writes the device had no room to track (each could hide one);
 * -EINVAL for an MR that is not device memory, -ERANGE for a range outside it.
 */
struct ibv_mr;
int softverbs_unflushed(const struct ibv_mr *mr, uint64_t addr, uint64_t len, uint64_t *nics,
			uint64_t *overflow);

/* Internal: the same over an attached fabric (shared with softverbs-ctl). */
struct sv_fabric;
int sv_fabric_nic_stats(struct sv_fabric *f, const char *node, struct softverbs_nic_stat *out,
			int max);

#endif
