/*
 * libmlx5.so.1 of the software RDMA device: the mlx5 Direct Verbs that NCCL's
 * own IB transport (2.27.3+: data direct; 2.30+: NCCL_IB_OOO_RQ) and HPC-X's net
 * plugin resolve or link, so that they load, build and run over soft NICs and an
 * interposer meets their mlx5dv calls as on ConnectX NICs.
 *
 * A soft NIC answers as an mlx5 device only with SOFTVERBS_MLX5DV=1: then
 * mlx5dv_is_supported() is true, mlx5dv_query_device() reports out-of-order
 * receive queues (as deep as the device's receive queues), and mlx5dv_create_qp()
 * makes an RC QP, with or without MLX5DV_QP_CREATE_OOO_DP: the device places data
 * and consumes receives in order, which a QP that allows reordering must accept.
 * Otherwise, as rdma-core's libmlx5 on a device that is not mlx5: false, and
 * EOPNOTSUPP. Data direct (a DMA path of its own) is never there: the sysfs path
 * query says ENODEV and mlx5dv_reg_dmabuf_mr with mlx5 access flags EOPNOTSUPP.
 */
#include <errno.h>
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SV_EXPORT __attribute__((visibility("default")))

/* rdma-core 50 and later append to struct mlx5dv_context, after crypto_caps (the last
 * member rdma-core 44's header knows): max_dc_rd_atom and max_dc_init_rd_atom (u64),
 * reg_c0 {u32 value, mask}, then ooo_recv_wrs_caps {u32 max_rc, max_xrc, max_dct,
 * max_ud, max_uc}, asked for with comp_mask bit 16; and MLX5DV_QP_CREATE_OOO_DP is
 * create_flags bit 7. */
struct sv_mlx5dv_context {
	struct mlx5dv_context base;
	uint64_t max_dc_rd_atom, max_dc_init_rd_atom;
	struct {
		uint32_t value, mask;
	} reg_c0;
	struct {
		uint32_t max_rc, max_xrc, max_dct, max_ud, max_uc;
	} ooo_recv_wrs_caps;
};
_Static_assert(offsetof(struct sv_mlx5dv_context, ooo_recv_wrs_caps) == 176,
	       "rdma-core's struct mlx5dv_context places ooo_recv_wrs_caps at 176");
#define SV_MLX5DV_CONTEXT_MASK_OOO_RECV_WRS (1ull << 16)
#define SV_MLX5DV_QP_CREATE_OOO_DP	    (1u << 7)

SV_EXPORT bool mlx5dv_is_supported(struct ibv_device *device);
SV_EXPORT int mlx5dv_query_device(struct ibv_context *ctx, struct mlx5dv_context *attrs);
SV_EXPORT struct ibv_qp *mlx5dv_create_qp(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *attr,
					  struct mlx5dv_qp_init_attr *mlx5_attr);
SV_EXPORT struct ibv_mr *mlx5dv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
					      uint64_t iova, int fd, int access, int mlx5_access);
SV_EXPORT int mlx5dv_get_data_direct_sysfs_path(struct ibv_context *ctx, char *buf, size_t len);

/* Whether the soft NICs pass for mlx5 devices (SOFTVERBS_MLX5DV=1). A value other
 * than 0 or 1 is reported once, on stderr as the device's other settings are, and
 * taken as 0. */
static bool as_mlx5(void)
{
	const char *v = getenv("SOFTVERBS_MLX5DV");
	if (v && *v && strcmp(v, "0") && strcmp(v, "1")) {
		static int told;
		if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
			fprintf(stderr, "softverbs: SOFTVERBS_MLX5DV=%s: want 0 or 1; taken as 0\n",
				v);
		return false;
	}
	return v && !strcmp(v, "1");
}

bool mlx5dv_is_supported(struct ibv_device *device)
{
	return device && as_mlx5();
}

int mlx5dv_query_device(struct ibv_context *ctx, struct mlx5dv_context *attrs)
{
	if (!ctx || !attrs)
		return EINVAL;
	if (!as_mlx5())
		return EOPNOTSUPP;
	uint64_t asked = attrs->comp_mask;
	struct ibv_device_attr da;
	int rc = ibv_query_device(ctx, &da);
	if (rc)
		return rc;
	attrs->version = 1;
	attrs->flags = MLX5DV_CONTEXT_FLAGS_CQE_V1;
	attrs->comp_mask = 0;
	if (asked & SV_MLX5DV_CONTEXT_MASK_OOO_RECV_WRS) {
		struct sv_mlx5dv_context *x = (struct sv_mlx5dv_context *)attrs;
		memset(&x->ooo_recv_wrs_caps, 0, sizeof(x->ooo_recv_wrs_caps));
		x->ooo_recv_wrs_caps.max_rc = (uint32_t)da.max_qp_wr;
		attrs->comp_mask |= SV_MLX5DV_CONTEXT_MASK_OOO_RECV_WRS;
	}
	return 0;
}

struct ibv_qp *mlx5dv_create_qp(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *attr,
				struct mlx5dv_qp_init_attr *mlx5_attr)
{
	if (!as_mlx5()) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (!ctx || !attr || !(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd ||
	    attr->pd->context != ctx) {
		errno = EINVAL;
		return NULL;
	}
	/* What a plain RC QP is: a PD (create flags none), and among the mlx5 attributes
	 * only the out-of-order flag. */
	if ((attr->comp_mask & ~(uint32_t)IBV_QP_INIT_ATTR_PD) || attr->qp_type != IBV_QPT_RC ||
	    (mlx5_attr &&
	     ((mlx5_attr->comp_mask & ~(uint64_t)MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS) ||
	      (mlx5_attr->create_flags & ~SV_MLX5DV_QP_CREATE_OOO_DP)))) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	struct ibv_qp_init_attr ia = {
	    .qp_context = attr->qp_context,
	    .send_cq = attr->send_cq,
	    .recv_cq = attr->recv_cq,
	    .srq = attr->srq,
	    .cap = attr->cap,
	    .qp_type = attr->qp_type,
	    .sq_sig_all = attr->sq_sig_all,
	};
	struct ibv_qp *qp = ibv_create_qp(attr->pd, &ia);
	if (qp)
		attr->cap = ia.cap;
	return qp;
}

struct ibv_mr *mlx5dv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
				    uint64_t iova, int fd, int access, int mlx5_access)
{
	if (!as_mlx5() || mlx5_access) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	return ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access);
}

int mlx5dv_get_data_direct_sysfs_path(struct ibv_context *ctx, char *buf, size_t len)
{
	return ctx && buf && len ? ENODEV : EINVAL;
}
