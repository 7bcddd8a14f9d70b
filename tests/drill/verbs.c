/*
 * The drill's door to libibverbs, opened exactly as NCCL 2.28 opens it
 * (src/misc/ibvsymbols.cc): dlopen("libibverbs.so"), then "libibverbs.so.1", and
 * dlvsym(handle, "ibv_<name>", "IBVERBS_1.1") for every function, plus the optional
 * newer symbols NCCL probes. The drill never links libibverbs, so an interposer that
 * hooks dlvsym (libr2cc.so) sees the drill exactly as it sees NCCL. The data path
 * has no symbol: callers use qp->context->ops and cq->context->ops directly.
 */
#include "tests/drill/drill.h"

#include <dlfcn.h>
#include <stdio.h>

#define DRILL_IBVERBS_VERSION "IBVERBS_1.1"

struct drill_ibv drill_ibv;
struct ibv_mr *(*drill_reg_dmabuf_mr)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int);
int (*drill_sv_unflushed)(const struct ibv_mr *, uint64_t, uint64_t, uint64_t *, uint64_t *);

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

/* NCCL carries its own table too (ibvWcStatusStr); libibverbs' is not resolved. */
const char *drill_wc_status_str(int status)
{
	static const char *const names[] = {
	    [IBV_WC_SUCCESS] = "success",
	    [IBV_WC_LOC_LEN_ERR] = "local length error",
	    [IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
	    [IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
	    [IBV_WC_LOC_PROT_ERR] = "local protection error",
	    [IBV_WC_WR_FLUSH_ERR] = "work request flushed error",
	    [IBV_WC_MW_BIND_ERR] = "memory management operation error",
	    [IBV_WC_BAD_RESP_ERR] = "bad response error",
	    [IBV_WC_LOC_ACCESS_ERR] = "local access error",
	    [IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
	    [IBV_WC_REM_ACCESS_ERR] = "remote access error",
	    [IBV_WC_REM_OP_ERR] = "remote operation error",
	    [IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
	    [IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
	    [IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
	    [IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
	    [IBV_WC_REM_ABORT_ERR] = "aborted error",
	    [IBV_WC_INV_EECN_ERR] = "invalid EE context number",
	    [IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
	    [IBV_WC_FATAL_ERR] = "fatal error",
	    [IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
	    [IBV_WC_GENERAL_ERR] = "general error",
	};

	if (status >= 0 && (size_t)status < sizeof(names) / sizeof(names[0]) && names[status])
		return names[status];
	return "unknown status";
}
