/*
 * RoCE mode of the software RDMA device (SOFTVERBS_LINK=roce): the Ethernet network
 * the NICs are on, and what a ConnectX port shows of it. Each rail (the k-th NIC of
 * every node) is one L2 subnet, 10.k.0.0/24, and node n's NIC on it is 10.k.0.(n+1)
 * with MAC 02:5e:fe:k:n:01. Its port's GID table holds, as on a ConnectX port, the
 * link-local fe80::<EUI-64 of the MAC> as RoCE v1 (index 0) and v2 (1), then the
 * address as ::ffff:10.k.0.(n+1), v1 (2) and v2 (3); the rest of the 255 entries are
 * empty. A GRH reaches the NIC owning its dgid when both are on one rail (any type),
 * or across rails when SOFTVERBS_ROUTED=1 and the GRH is RoCE v2 between IPv4
 * addresses (what an IP router forwards); everything else goes nowhere and the
 * requester retries until its transport timeout, as on a real network. Traffic sent
 * with a DSCP other than SOFTVERBS_LOSSLESS_TC's is counted per NIC as lossy.
 *
 * Used by the device (queries, modify_qp, the data path) and by softverbs-ctl; in IB
 * mode only the GID table (one IB GID) and the packet size matter here.
 */
#include "softverbs/fabric.h"

#include <endian.h>
#include <errno.h>
#include <string.h>

#define SV_ROCE_GIDS 4 /* populated entries: link-local and IPv4, v1 and v2 each */

int sv_port_gid_tbl_len(const struct sv_fabric *f)
{
	return f->net.link == SV_LL_ROCE ? SV_ROCE_GID_TBL_LEN : 1;
}

uint32_t sv_nic_ipv4(const struct sv_fabric *f, int nic)
{
	const struct sv_nic *n = &f->nics[nic];

	return 10u << 24 | (uint32_t)n->rail << 16 | (uint32_t)(n->node + 1);
}

static void sv_gid_link_local(const struct sv_fabric *f, int nic, union ibv_gid *gid)
{
	const struct sv_nic *n = &f->nics[nic];
	/* The MAC 02:5e:fe:rail:node:01 as a modified EUI-64 (universal bit flipped). */
	const uint8_t eui[8] = {0x00, 0x5e, 0xfe, 0xff, 0xfe, n->rail, (uint8_t)n->node, 0x01};

	memset(gid, 0, sizeof(*gid));
	gid->raw[0] = 0xfe;
	gid->raw[1] = 0x80;
	memcpy(&gid->raw[8], eui, sizeof(eui));
}

static void sv_gid_ipv4(const struct sv_fabric *f, int nic, union ibv_gid *gid)
{
	uint32_t ip = htobe32(sv_nic_ipv4(f, nic));

	memset(gid, 0, sizeof(*gid));
	gid->raw[10] = 0xff;
	gid->raw[11] = 0xff;
	memcpy(&gid->raw[12], &ip, sizeof(ip));
}

static bool sv_gid_is_ipv4(const union ibv_gid *gid)
{
	static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

	return memcmp(gid->raw, prefix, sizeof(prefix)) == 0;
}

int sv_nic_gid(const struct sv_fabric *f, int nic, unsigned index, union ibv_gid *gid,
	       enum ibv_gid_type *type)
{
	if (f->net.link != SV_LL_ROCE) {
		if (index != 0)
			return -EINVAL;
		gid->global.subnet_prefix = htobe64(0xfe80000000000000ull);
		gid->global.interface_id = htobe64(f->nics[nic].guid);
		*type = IBV_GID_TYPE_IB;
		return 0;
	}
	if (index >= SV_ROCE_GID_TBL_LEN)
		return -EINVAL;
	if (index >= SV_ROCE_GIDS)
		return -ENODATA;
	if (index < 2)
		sv_gid_link_local(f, nic, gid);
	else
		sv_gid_ipv4(f, nic, gid);
	*type = index % 2 ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1;
	return 0;
}

int sv_gid_owner(const struct sv_fabric *f, const union ibv_gid *gid)
{
	union ibv_gid mine;

	for (int i = 0; i < SV_MAX_NICS; i++) {
		if (!atomic_load(&f->nics[i].used))
			continue;
		sv_gid_link_local(f, i, &mine);
		if (memcmp(&mine, gid, sizeof(mine)) == 0)
			return i;
		sv_gid_ipv4(f, i, &mine);
		if (memcmp(&mine, gid, sizeof(mine)) == 0)
			return i;
	}
	return -1;
}

/*
 * As the kernel checks an address vector of a connected QP on a RoCE port
 * (rdma_check_ah_attr, rdma_get_gid_attr): a GRH is required and its sgid_index must
 * name a populated entry of the QP's own port. Where the dgid leads is not checked
 * here: an address nobody answers is the network's business (sv_roce_route).
 */
int sv_roce_check_av(const struct sv_fabric *f, int nic, const struct ibv_ah_attr *ah)
{
	union ibv_gid gid;
	enum ibv_gid_type type;

	if (!ah->is_global)
		return EINVAL;
	return -sv_nic_gid(f, nic, ah->grh.sgid_index, &gid, &type);
}

int sv_roce_route(const struct sv_fabric *f, int nic, const struct ibv_global_route *grh)
{
	union ibv_gid sgid;
	enum ibv_gid_type type;
	bool v4;
	int to;

	if (f->net.link != SV_LL_ROCE || sv_nic_gid(f, nic, grh->sgid_index, &sgid, &type) != 0)
		return -1;
	to = sv_gid_owner(f, &grh->dgid);
	if (to < 0)
		return -1;
	v4 = sv_gid_is_ipv4(&sgid);
	/* A v2 packet has one IP header: source and destination of one family. */
	if (type == IBV_GID_TYPE_ROCE_V2 && v4 != sv_gid_is_ipv4(&grh->dgid))
		return -1;
	if (f->nics[to].rail == f->nics[nic].rail)
		return to; /* one L2 subnet: v1 frames and v2 packets alike */
	/* Between subnets only a router helps, and it forwards RoCE v2 over IPv4 only. */
	return f->net.routed && type == IBV_GID_TYPE_ROCE_V2 && v4 ? to : -1;
}

void sv_nic_account_class(struct sv_fabric *f, int nic, int tc, uint64_t bytes)
{
	int lossless = f->net.lossless_tc;

	/* Switches classify by DSCP (the upper 6 bits); the 2 ECN bits do not matter. */
	if (f->net.link == SV_LL_ROCE && lossless >= 0 && tc >> 2 != lossless >> 2)
		atomic_fetch_add_explicit(&f->nics[nic].lossy_bytes, bytes, memory_order_relaxed);
}

const char *sv_link_layer_name(int link)
{
	return link == SV_LL_ROCE ? "roce" : "ib";
}
