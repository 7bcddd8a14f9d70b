/*
 * The drill's door to libibverbs, opened exactly as NCCL 2.28 opens it
 * (src/misc/ibvsymbols.cc): dlopen("libibverbs.so"), then "libibverbs.so.1", and
 * dlvsym(handle, "ibv_<name>", "IBVERBS_1.1") for every function, plus the optional
 * newer symbols NCCL probes. The drill never links libibverbs, so an interposer that
 * hooks dlvsym (libr2cc.so) sees the drill exactly as it sees NCCL. The data path
 * has no symbol: callers use qp->context->ops and cq->context->ops directly.
 */
#include "softverbs/wc_status.h"
#include "tools/drill/drill.h"

#include <dlfcn.h>
#include <infiniband/mlx5dv.h>
#include <stdio.h>

#define DRILL_IBVERBS_VERSION "IBVERBS_1.1"

struct drill_ibv drill_ibv;
struct ibv_mr *(*drill_reg_dmabuf_mr)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int);
int (*drill_sv_unflushed)(const struct ibv_mr *, uint64_t, uint64_t, uint64_t *, uint64_t *);

struct ibv_qp *(*drill_mlx5dv_create_qp)(struct ibv_context *, struct ibv_qp_init_attr_ex *,
					 struct mlx5dv_qp_init_attr *);
struct ibv_mr *(*drill_mlx5dv_reg_dmabuf_mr)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int,
					     int);
#ifdef DRILL_DIRECT
/* rdma-core 44's mlx5dv.h has no prototype of it (MLX5_1.25, rdma-core 50) */
struct ibv_mr *mlx5dv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
				    uint64_t iova, int fd, int access, int mlx5_access);
#endif

#ifdef DRILL_DIRECT
/* linked against libmlx5 too: by symbol */
int drill_mlx5_load(char *err, size_t len)
{
	drill_mlx5dv_create_qp = mlx5dv_create_qp;
	drill_mlx5dv_reg_dmabuf_mr = mlx5dv_reg_dmabuf_mr;
	(void)err;
	(void)len;
	return 0;
}

/*
 * r2cc-verbs-drill-direct: the same traffic from a program linked against
 * libibverbs, as HPC-X's net plugin and NCCL built with RDMA_CORE=1 are. Every call
 * is what verbs.h compiles a direct caller's call into: a symbol at rdma-core's
 * default version, ibv_reg_mr with access flags that are not constant into
 * ibv_reg_mr_iova2@IBVERBS_1.8, ibv_query_port into the context's query_port op.
 * An interposer must meet the drill there, by symbol and by op, with no dlvsym.
 */
static struct ibv_device **d_get_device_list(int *n)
{
	return ibv_get_device_list(n);
}

static struct ibv_mr *d_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	return ibv_reg_mr(pd, addr, len, access);
}

static int d_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
	return ibv_query_port(ctx, port, attr);
}

int drill_ibv_load(char *err, size_t len)
{
	drill_ibv = (struct drill_ibv){
	    .get_device_list = d_get_device_list,
	    .free_device_list = ibv_free_device_list,
	    .get_device_name = ibv_get_device_name,
	    .open_device = ibv_open_device,
	    .close_device = ibv_close_device,
	    .get_async_event = ibv_get_async_event,
	    .ack_async_event = ibv_ack_async_event,
	    .query_device = ibv_query_device,
	    .query_port = d_query_port,
	    .query_gid = ibv_query_gid,
	    .query_qp = ibv_query_qp,
	    .alloc_pd = ibv_alloc_pd,
	    .dealloc_pd = ibv_dealloc_pd,
	    .reg_mr = d_reg_mr,
	    .dereg_mr = ibv_dereg_mr,
	    .create_cq = ibv_create_cq,
	    .destroy_cq = ibv_destroy_cq,
	    .create_qp = ibv_create_qp,
	    .modify_qp = ibv_modify_qp,
	    .destroy_qp = ibv_destroy_qp,
	    .fork_init = ibv_fork_init,
	    .event_type_str = ibv_event_type_str,
	};
	drill_reg_dmabuf_mr = ibv_reg_dmabuf_mr;
	/* the device's own extension, by name as before: not a verbs symbol */
	drill_sv_unflushed = (int (*)(const struct ibv_mr *, uint64_t, uint64_t, uint64_t *,
				      uint64_t *))dlsym(RTLD_DEFAULT, "softverbs_unflushed");
	(void)err;
	(void)len;
	return 0;
}
#else
/* NCCL 2.30's way (src/misc/mlx5dvsymbols.cc): dlopen, then dlvsym at MLX5_1.3. */
int drill_mlx5_load(char *err, size_t len)
{
	void *h = dlopen("libmlx5.so.1", RTLD_NOW);
	if (h)
		drill_mlx5dv_create_qp =
		    (struct ibv_qp * (*)(struct ibv_context *, struct ibv_qp_init_attr_ex *,
					 struct mlx5dv_qp_init_attr *))
			dlvsym(h, "mlx5dv_create_qp", "MLX5_1.3");
	if (!drill_mlx5dv_create_qp) {
		snprintf(err, len, "libmlx5.so.1 lacks mlx5dv_create_qp@MLX5_1.3: %s", dlerror());
		return -1;
	}
	/* NCCL 2.27.3+'s data direct: optional, as in NCCL */
	drill_mlx5dv_reg_dmabuf_mr =
	    (struct ibv_mr * (*)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int, int))
		dlvsym(h, "mlx5dv_reg_dmabuf_mr", "MLX5_1.25");
	return 0;
}

/* Optional symbols NCCL looks up (and copes without); resolved only so that an
 * interposer sees the same lookups. */
static const struct {
	const char *name, *version;
} drill_ibv_optional[] = {
    {"ibv_reg_mr_iova2", "IBVERBS_1.8"},
    {"ibv_reg_dmabuf_mr", "IBVERBS_1.12"},
    {"ibv_query_ece", "IBVERBS_1.10"},
    {"ibv_set_ece", "IBVERBS_1.10"},
};

int drill_ibv_load(char *err, size_t len)
{
	void *h = dlopen("libibverbs.so", RTLD_NOW);

	if (!h)
		h = dlopen("libibverbs.so.1", RTLD_NOW);
	if (!h) {
		snprintf(err, len, "cannot dlopen libibverbs.so[.1]: %s", dlerror());
		return -1;
	}
#define DRILL_IBV_RESOLVE(ret, name, params)                                                       \
	drill_ibv.name = (ret(*) params)dlvsym(h, "ibv_" #name, DRILL_IBVERBS_VERSION);            \
	if (!drill_ibv.name) {                                                                     \
		snprintf(err, len, "libibverbs lacks ibv_%s@%s", #name, DRILL_IBVERBS_VERSION);    \
		return -1;                                                                         \
	}
	DRILL_IBV_FUNCS(DRILL_IBV_RESOLVE)
#undef DRILL_IBV_RESOLVE
	for (size_t i = 0; i < sizeof(drill_ibv_optional) / sizeof(drill_ibv_optional[0]); i++)
		(void)dlvsym(h, drill_ibv_optional[i].name, drill_ibv_optional[i].version);
	drill_reg_dmabuf_mr =
	    (struct ibv_mr * (*)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int))
		dlvsym(h, "ibv_reg_dmabuf_mr", "IBVERBS_1.12");
	drill_sv_unflushed = (int (*)(const struct ibv_mr *, uint64_t, uint64_t, uint64_t *,
				      uint64_t *))dlsym(h, "softverbs_unflushed");
	return 0;
}

#endif

/* NCCL carries its own table too (ibvWcStatusStr); libibverbs' is not resolved. */
const char *drill_wc_status_str(int status)
{
	const char *name = softverbs_wc_status_name(status);

	return name ? name : "unknown status";
}
