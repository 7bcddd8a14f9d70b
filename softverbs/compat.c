/*
 * The rest of libibverbs' ABI (rdma-core 44-50, libibverbs.map.in): functions that
 * rdma-core's programs and libraries link against and that the device answers
 * without emulating anything new. Pure helpers (rate conversions, names, the
 * kernel-struct copies librdmacm uses) do what rdma-core's do. What the device does
 * not have fails at call time, as a verbs provider without the feature does: address
 * handles and multicast (UD only), object import (kernel fds), the RoCE L2 lookup.
 *
 * IBVERBS_PRIVATE_34 is the ABI between libibverbs and its hardware providers.
 * perftest links libmlx5 and libefa directly, and they link these names, so the
 * device exports them; each provider's constructor registers its driver through
 * verbs_register_driver_34, which is accepted and ignored. The ibv_cmd_* family and
 * the context helpers are reached only from a provider's own context, which never
 * exists here (the device list is the device's own), so they report EOPNOTSUPP.
 */
#include "softverbs/internal.h"

#include <errno.h>
#include <infiniband/sa.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- rates (IB spec: the static_rate encodings and what they carry) ---- */

static const struct {
	enum ibv_rate rate;
	int mult; /* of 2.5 Gb/s; -1 for the rates that are not a multiple */
	int mbps;
} sv_rates[] = {
    {IBV_RATE_2_5_GBPS, 1, 2500},	{IBV_RATE_5_GBPS, 2, 5000},
    {IBV_RATE_10_GBPS, 4, 10000},	{IBV_RATE_20_GBPS, 8, 20000},
    {IBV_RATE_30_GBPS, 12, 30000},	{IBV_RATE_40_GBPS, 16, 40000},
    {IBV_RATE_60_GBPS, 24, 60000},	{IBV_RATE_80_GBPS, 32, 80000},
    {IBV_RATE_120_GBPS, 48, 120000},	{IBV_RATE_14_GBPS, -1, 14062},
    {IBV_RATE_56_GBPS, -1, 56250},	{IBV_RATE_112_GBPS, -1, 112500},
    {IBV_RATE_168_GBPS, -1, 168750},	{IBV_RATE_25_GBPS, -1, 25781},
    {IBV_RATE_100_GBPS, -1, 103125},	{IBV_RATE_200_GBPS, -1, 206250},
    {IBV_RATE_300_GBPS, -1, 309375},	{IBV_RATE_28_GBPS, 11, 28125},
    {IBV_RATE_50_GBPS, 20, 53125},	{IBV_RATE_400_GBPS, 160, 425000},
    {IBV_RATE_600_GBPS, 240, 637500},	{IBV_RATE_800_GBPS, 320, 850000},
    {IBV_RATE_1200_GBPS, 480, 1275000},
};

#define SV_NRATES (int)(sizeof(sv_rates) / sizeof(sv_rates[0]))

SV_EXPORT int ibv_rate_to_mult(enum ibv_rate rate)
{
	for (int i = 0; i < SV_NRATES; i++)
		if (sv_rates[i].rate == rate)
			return sv_rates[i].mult;
	return -1;
}

SV_EXPORT enum ibv_rate mult_to_ibv_rate(int mult)
{
	for (int i = 0; i < SV_NRATES; i++)
		if (mult > 0 && sv_rates[i].mult == mult)
			return sv_rates[i].rate;
	return IBV_RATE_MAX;
}

SV_EXPORT int ibv_rate_to_mbps(enum ibv_rate rate)
{
	for (int i = 0; i < SV_NRATES; i++)
		if (sv_rates[i].rate == rate)
			return sv_rates[i].mbps;
	return -1;
}

SV_EXPORT enum ibv_rate mbps_to_ibv_rate(int mbps)
{
	for (int i = 0; i < SV_NRATES; i++)
		if (sv_rates[i].mbps == mbps)
			return sv_rates[i].rate;
	return IBV_RATE_MAX;
}

/* ---- names ---- */

SV_EXPORT const char *ibv_node_type_str(enum ibv_node_type node_type)
{
	static const char *const names[] = {
	    [IBV_NODE_CA] = "InfiniBand channel adapter",
	    [IBV_NODE_SWITCH] = "InfiniBand switch",
	    [IBV_NODE_ROUTER] = "InfiniBand router",
	    [IBV_NODE_RNIC] = "iWARP NIC",
	    [IBV_NODE_USNIC] = "usNIC",
	    [IBV_NODE_USNIC_UDP] = "usNIC UDP",
	    [IBV_NODE_UNSPECIFIED] = "unspecified",
	};

	if ((unsigned)node_type < sizeof(names) / sizeof(names[0]) && names[node_type])
		return names[node_type];
	return "unknown";
}

const char *ibv_wr_opcode_str(enum ibv_wr_opcode opcode);
SV_EXPORT const char *ibv_wr_opcode_str(enum ibv_wr_opcode opcode)
{
	static const char *const names[] = {
	    [IBV_WR_RDMA_WRITE] = "rdma-write",
	    [IBV_WR_RDMA_WRITE_WITH_IMM] = "rdma-write-with-imm",
	    [IBV_WR_SEND] = "send",
	    [IBV_WR_SEND_WITH_IMM] = "send-with-imm",
	    [IBV_WR_RDMA_READ] = "rdma-read",
	    [IBV_WR_ATOMIC_CMP_AND_SWP] = "atomic-cmp-and-swp",
	    [IBV_WR_ATOMIC_FETCH_AND_ADD] = "atomic-fetch-and-add",
	    [IBV_WR_LOCAL_INV] = "local-inv",
	    [IBV_WR_BIND_MW] = "bind-mw",
	    [IBV_WR_SEND_WITH_INV] = "send-with-inv",
	    [IBV_WR_TSO] = "tso",
	    [IBV_WR_DRIVER1] = "driver1",
	    [IBV_WR_ATOMIC_WRITE] = "atomic-write",
	};

	if ((unsigned)opcode < sizeof(names) / sizeof(names[0]) && names[opcode])
		return names[opcode];
	return "unknown";
}

/* ---- kernel structs <-> verbs structs (librdmacm hands the kernel's answers over) ---- */

void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src);
SV_EXPORT void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src)
{
	memcpy(dst->grh.dgid.raw, src->grh.dgid, sizeof(dst->grh.dgid.raw));
	dst->grh.flow_label = src->grh.flow_label;
	dst->grh.sgid_index = src->grh.sgid_index;
	dst->grh.hop_limit = src->grh.hop_limit;
	dst->grh.traffic_class = src->grh.traffic_class;
	dst->dlid = src->dlid;
	dst->sl = src->sl;
	dst->src_path_bits = src->src_path_bits;
	dst->static_rate = src->static_rate;
	dst->is_global = src->is_global;
	dst->port_num = src->port_num;
}

void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src);
SV_EXPORT void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src)
{
	dst->cur_qp_state = src->cur_qp_state;
	dst->path_mtu = src->path_mtu;
	dst->path_mig_state = src->path_mig_state;
	dst->qkey = src->qkey;
	dst->rq_psn = src->rq_psn;
	dst->sq_psn = src->sq_psn;
	dst->dest_qp_num = src->dest_qp_num;
	dst->qp_access_flags = src->qp_access_flags;
	dst->cap.max_send_wr = src->max_send_wr;
	dst->cap.max_recv_wr = src->max_recv_wr;
	dst->cap.max_send_sge = src->max_send_sge;
	dst->cap.max_recv_sge = src->max_recv_sge;
	dst->cap.max_inline_data = src->max_inline_data;
	ibv_copy_ah_attr_from_kern(&dst->ah_attr, &src->ah_attr);
	ibv_copy_ah_attr_from_kern(&dst->alt_ah_attr, &src->alt_ah_attr);
	dst->pkey_index = src->pkey_index;
	dst->alt_pkey_index = src->alt_pkey_index;
	dst->en_sqd_async_notify = src->en_sqd_async_notify;
	dst->sq_draining = src->sq_draining;
	dst->max_rd_atomic = src->max_rd_atomic;
	dst->max_dest_rd_atomic = src->max_dest_rd_atomic;
	dst->min_rnr_timer = src->min_rnr_timer;
	dst->port_num = src->port_num;
	dst->timeout = src->timeout;
	dst->retry_cnt = src->retry_cnt;
	dst->rnr_retry = src->rnr_retry;
	dst->alt_port_num = src->alt_port_num;
	dst->alt_timeout = src->alt_timeout;
}

/* The path record fields have the same names on both sides; only their widths differ. */
#define SV_PATH_REC_COPY(dst, src)                                                                 \
	do {                                                                                       \
		(dst)->dlid = (src)->dlid;                                                         \
		(dst)->slid = (src)->slid;                                                         \
		(dst)->raw_traffic = (src)->raw_traffic;                                           \
		(dst)->flow_label = (src)->flow_label;                                             \
		(dst)->hop_limit = (src)->hop_limit;                                               \
		(dst)->traffic_class = (src)->traffic_class;                                       \
		(dst)->reversible = (src)->reversible;                                             \
		(dst)->numb_path = (src)->numb_path;                                               \
		(dst)->pkey = (src)->pkey;                                                         \
		(dst)->sl = (src)->sl;                                                             \
		(dst)->mtu_selector = (src)->mtu_selector;                                         \
		(dst)->mtu = (src)->mtu;                                                           \
		(dst)->rate_selector = (src)->rate_selector;                                       \
		(dst)->rate = (src)->rate;                                                         \
		(dst)->packet_life_time_selector = (src)->packet_life_time_selector;               \
		(dst)->packet_life_time = (src)->packet_life_time;                                 \
		(dst)->preference = (src)->preference;                                             \
	} while (0)

void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src);
SV_EXPORT void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst,
					   struct ib_user_path_rec *src)
{
	memcpy(dst->dgid.raw, src->dgid, sizeof(dst->dgid.raw));
	memcpy(dst->sgid.raw, src->sgid, sizeof(dst->sgid.raw));
	SV_PATH_REC_COPY(dst, src);
}

void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src);
SV_EXPORT void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src)
{
	memcpy(dst->dgid, src->dgid.raw, sizeof(dst->dgid));
	memcpy(dst->sgid, src->sgid.raw, sizeof(dst->sgid));
	SV_PATH_REC_COPY(dst, src);
}

/* ---- sysfs and fork ---- */

/* Where rdma-core reads sysfs; the device has no entries there (device.c). */
const char *ibv_get_sysfs_path(void);
SV_EXPORT const char *ibv_get_sysfs_path(void)
{
	const char *env = getuid() == geteuid() ? getenv("SYSFS_PATH") : NULL;

	return env && *env ? env : "/sys";
}

/* Memory is never pinned here, so fork() needs no protection of registered ranges. */
int ibv_dontfork_range(void *base, size_t size);
int ibv_dofork_range(void *base, size_t size);
SV_EXPORT int ibv_dontfork_range(void *base, size_t size)
{
	return 0;
}

SV_EXPORT int ibv_dofork_range(void *base, size_t size)
{
	return 0;
}

SV_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void)
{
	return IBV_FORK_UNNEEDED;
}

/* The pre-2013 driver registration: the device list here is the device's own. */
typedef struct ibv_device *(*sv_driver_init_fn)(const char *uverbs_sys_path, int abi_version);
void ibv_register_driver(const char *name, sv_driver_init_fn init_func);
SV_EXPORT void ibv_register_driver(const char *name, sv_driver_init_fn init_func)
{
}

/* ---- address handles and multicast: UD only, and only RC QPs exist here ---- */

SV_EXPORT struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	errno = EOPNOTSUPP;
	return NULL;
}

SV_EXPORT int ibv_destroy_ah(struct ibv_ah *ah)
{
	return EINVAL; /* no AH can have been created */
}

/* The address that answers a received completion (no GRH: the IB local route). */
SV_EXPORT int ibv_init_ah_from_wc(struct ibv_context *context, uint8_t port_num, struct ibv_wc *wc,
				  struct ibv_grh *grh, struct ibv_ah_attr *ah_attr)
{
	memset(ah_attr, 0, sizeof(*ah_attr));
	if (wc->wc_flags & IBV_WC_GRH)
		return EOPNOTSUPP; /* the device never delivers a GRH */
	ah_attr->dlid = wc->slid;
	ah_attr->sl = wc->sl;
	ah_attr->src_path_bits = wc->dlid_path_bits;
	ah_attr->port_num = port_num;
	return 0;
}

SV_EXPORT struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc,
					       struct ibv_grh *grh, uint8_t port_num)
{
	struct ibv_ah_attr attr;
	int rc = ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr);

	if (rc) {
		errno = rc;
		return NULL;
	}
	return ibv_create_ah(pd, &attr);
}

/* What the kernel answers for a QP that is not UD. */
SV_EXPORT int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	return EINVAL;
}

SV_EXPORT int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	return EINVAL;
}

/* RoCE only: an InfiniBand port has no Ethernet neighbour to resolve. */
int ibv_resolve_eth_l2_from_gid(struct ibv_context *context, struct ibv_ah_attr *attr,
				uint8_t eth_mac[6], uint16_t *vid);
SV_EXPORT int ibv_resolve_eth_l2_from_gid(struct ibv_context *context, struct ibv_ah_attr *attr,
					  uint8_t eth_mac[6], uint16_t *vid)
{
	return -EINVAL;
}

/* ---- sharing objects through a kernel command fd: there is none ---- */

SV_EXPORT struct ibv_context *ibv_import_device(int cmd_fd)
{
	errno = EOPNOTSUPP;
	return NULL;
}

SV_EXPORT struct ibv_pd *ibv_import_pd(struct ibv_context *context, uint32_t pd_handle)
{
	errno = EOPNOTSUPP;
	return NULL;
}

SV_EXPORT struct ibv_mr *ibv_import_mr(struct ibv_pd *pd, uint32_t mr_handle)
{
	errno = EOPNOTSUPP;
	return NULL;
}

SV_EXPORT struct ibv_dm *ibv_import_dm(struct ibv_context *context, uint32_t dm_handle)
{
	errno = EOPNOTSUPP;
	return NULL;
}

/* Nothing can have been imported, so there is nothing to release. */
SV_EXPORT void ibv_unimport_pd(struct ibv_pd *pd)
{
}

SV_EXPORT void ibv_unimport_mr(struct ibv_mr *mr)
{
}

SV_EXPORT void ibv_unimport_dm(struct ibv_dm *dm)
{
}

/*
 * Whether a receiver may read a message's bytes in order as they land: the device
 * promises nothing beyond "the data lands before its completion" (large requests are
 * copied by the kernel in whatever order it likes), which rdma-core answers as 0.
 */
SV_EXPORT int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags)
{
	return 0;
}

/*
 * ---- IBVERBS_PRIVATE_34: the providers' ABI ----
 *
 * A provider library's constructor registers its driver; libibverbs would match it
 * against sysfs. The device list here is the device's own, so the registration is
 * accepted and no provider ever opens a context, which is the only way to reach the
 * other names below. They are defined without their rdma-core parameter lists
 * (driver.h is not installed) and answer like a kernel without the command.
 */
extern bool verbs_allow_disassociate_destroy;
SV_EXPORT bool verbs_allow_disassociate_destroy;

struct verbs_device_ops;
void verbs_register_driver_34(const struct verbs_device_ops *ops);
SV_EXPORT void verbs_register_driver_34(const struct verbs_device_ops *ops)
{
}

#define SV_PRIVATE_INT(name)                                                                       \
	int name(void);                                                                            \
	SV_EXPORT int name(void)                                                                   \
	{                                                                                          \
		return EOPNOTSUPP;                                                                 \
	}
#define SV_PRIVATE_PTR(name)                                                                       \
	void *name(void);                                                                          \
	SV_EXPORT void *name(void)                                                                 \
	{                                                                                          \
		errno = EOPNOTSUPP;                                                                \
		return NULL;                                                                       \
	}
#define SV_PRIVATE_VOID(name)                                                                      \
	void name(void);                                                                           \
	SV_EXPORT void name(void)                                                                  \
	{                                                                                          \
	}

SV_PRIVATE_VOID(__verbs_log)
SV_PRIVATE_VOID(verbs_init_cq)
SV_PRIVATE_VOID(verbs_set_ops)
SV_PRIVATE_VOID(verbs_uninit_context)
SV_PRIVATE_PTR(_verbs_init_and_alloc_context)
SV_PRIVATE_PTR(verbs_open_device)
SV_PRIVATE_INT(__ioctl_final_num_attrs)
SV_PRIVATE_INT(execute_ioctl)
SV_PRIVATE_INT(ibv_read_ibdev_sysfs_file)
SV_PRIVATE_INT(ibv_cmd_advise_mr)
SV_PRIVATE_INT(ibv_cmd_alloc_dm)
SV_PRIVATE_INT(ibv_cmd_alloc_mw)
SV_PRIVATE_INT(ibv_cmd_alloc_pd)
SV_PRIVATE_INT(ibv_cmd_attach_mcast)
SV_PRIVATE_INT(ibv_cmd_close_xrcd)
SV_PRIVATE_INT(ibv_cmd_create_ah)
SV_PRIVATE_INT(ibv_cmd_create_counters)
SV_PRIVATE_INT(ibv_cmd_create_cq)
SV_PRIVATE_INT(ibv_cmd_create_cq_ex)
SV_PRIVATE_INT(ibv_cmd_create_flow)
SV_PRIVATE_INT(ibv_cmd_create_flow_action_esp)
SV_PRIVATE_INT(ibv_cmd_create_qp)
SV_PRIVATE_INT(ibv_cmd_create_qp_ex)
SV_PRIVATE_INT(ibv_cmd_create_qp_ex2)
SV_PRIVATE_INT(ibv_cmd_create_rwq_ind_table)
SV_PRIVATE_INT(ibv_cmd_create_srq)
SV_PRIVATE_INT(ibv_cmd_create_srq_ex)
SV_PRIVATE_INT(ibv_cmd_create_wq)
SV_PRIVATE_INT(ibv_cmd_dealloc_mw)
SV_PRIVATE_INT(ibv_cmd_dealloc_pd)
SV_PRIVATE_INT(ibv_cmd_dereg_mr)
SV_PRIVATE_INT(ibv_cmd_destroy_ah)
SV_PRIVATE_INT(ibv_cmd_destroy_counters)
SV_PRIVATE_INT(ibv_cmd_destroy_cq)
SV_PRIVATE_INT(ibv_cmd_destroy_flow)
SV_PRIVATE_INT(ibv_cmd_destroy_flow_action)
SV_PRIVATE_INT(ibv_cmd_destroy_qp)
SV_PRIVATE_INT(ibv_cmd_destroy_rwq_ind_table)
SV_PRIVATE_INT(ibv_cmd_destroy_srq)
SV_PRIVATE_INT(ibv_cmd_destroy_wq)
SV_PRIVATE_INT(ibv_cmd_detach_mcast)
SV_PRIVATE_INT(ibv_cmd_free_dm)
SV_PRIVATE_INT(ibv_cmd_get_context)
SV_PRIVATE_INT(ibv_cmd_modify_cq)
SV_PRIVATE_INT(ibv_cmd_modify_flow_action_esp)
SV_PRIVATE_INT(ibv_cmd_modify_qp)
SV_PRIVATE_INT(ibv_cmd_modify_qp_ex)
SV_PRIVATE_INT(ibv_cmd_modify_srq)
SV_PRIVATE_INT(ibv_cmd_modify_wq)
SV_PRIVATE_INT(ibv_cmd_open_qp)
SV_PRIVATE_INT(ibv_cmd_open_xrcd)
SV_PRIVATE_INT(ibv_cmd_poll_cq)
SV_PRIVATE_INT(ibv_cmd_post_recv)
SV_PRIVATE_INT(ibv_cmd_post_send)
SV_PRIVATE_INT(ibv_cmd_post_srq_recv)
SV_PRIVATE_INT(ibv_cmd_query_context)
SV_PRIVATE_INT(ibv_cmd_query_device_any)
SV_PRIVATE_INT(ibv_cmd_query_mr)
SV_PRIVATE_INT(ibv_cmd_query_port)
SV_PRIVATE_INT(ibv_cmd_query_qp)
SV_PRIVATE_INT(ibv_cmd_query_srq)
SV_PRIVATE_INT(ibv_cmd_read_counters)
SV_PRIVATE_INT(ibv_cmd_reg_dm_mr)
SV_PRIVATE_INT(ibv_cmd_reg_dmabuf_mr)
SV_PRIVATE_INT(ibv_cmd_reg_mr)
SV_PRIVATE_INT(ibv_cmd_req_notify_cq)
SV_PRIVATE_INT(ibv_cmd_rereg_mr)
SV_PRIVATE_INT(ibv_cmd_resize_cq)
