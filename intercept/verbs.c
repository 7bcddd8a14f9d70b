/*
 * The verbs door. NCCL never links libibverbs: it dlopen()s it and resolves
 * every function with dlvsym(handle, name, "IBVERBS_1.x"), so R2CC interposes
 * dlvsym itself and hands back its own wrappers for the ibv_* names listed in
 * verbs_funcs.def. The wrappers forward to the real functions (same return
 * values, same errno), feed the registries, and replace the three data-path
 * ops (post_send, post_recv, poll_cq) in every context opened through them.
 *
 * The data-path wrappers take no lock, allocate nothing and make no system
 * call: one lock-free registry lookup, the real op, relaxed counter updates.
 * With R2CC inactive (R2CC_MODE=0 or a bad setting) the hook returns the real
 * functions untouched.
 */
#include "intercept/nccl_real.h"
#include "intercept/netcheck.h"
#include "intercept/transport.h"
#include "repair/model/cts.h"
#include "repair/drill.h"
#include "repair/engine.h"
#include "repair/model/mr_mirror.h"
#include "repair/model/qp_shadow.h"
#include "shim/common.h"
#include "shim/core.h"
#include "shim/fault.h"
#include "shim/log.h"
#include "shim/params.h"
#include "shim/protect.h"
#include "shim/registry.h"

#include <dlfcn.h>
#include <errno.h>
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- real functions ------------------------------------------------------- */

#define R2CC_VERBS_FN(ret, name, ver, params, args) typedef ret(*name##_fn) params;
#define R2CC_VERBS_OWN				    R2CC_VERBS_FN
#include "intercept/verbs_funcs.def"
#undef R2CC_VERBS_FN
#undef R2CC_VERBS_OWN

#define R2CC_VERBS_FN(ret, name, ver, params, args)                                                \
	static name##_fn real_##name;                                                              \
	static const char *const name##_ver = ver;
#define R2CC_VERBS_OWN R2CC_VERBS_FN
#include "intercept/verbs_funcs.def"
#undef R2CC_VERBS_FN
#undef R2CC_VERBS_OWN

typedef void *(*dlvsym_fn)(void *, const char *, const char *);
static dlvsym_fn real_dlvsym;
static void *verbs_handle; /* the libibverbs handle NCCL resolved through */

/* Calls made while resolving (libunwind, libcrypto, …) go straight through. */
static __thread int in_hook;

/*
 * Nesting: a verbs call made while a wrapper runs (the real ibv_reg_mr calling
 * ibv_reg_mr_iova2 through its PLT, which reaches libr2cc.so's export of that name)
 * goes straight to the real function, so that one registration is recorded once.
 * verbs_caller is the return address of the outermost call: the code whose
 * transport a new QP belongs to (intercept/transport.h).
 */
static __thread int in_verbs;
static __thread const void *verbs_caller;
static __thread bool verbs_by_dlvsym; /* the outermost call came through dlvsym's door */

static inline int verbs_enter(const void *caller, bool by_dlvsym)
{
	if (!in_verbs++) {
		verbs_caller = caller;
		verbs_by_dlvsym = by_dlvsym;
	}
	return 0;
}

static inline void verbs_leave(int *unused)
{
	in_verbs--;
}

#define VERBS_ENTER(by_dlvsym)                                                                     \
	int verbs_guard_ __attribute__((cleanup(verbs_leave), unused)) =                           \
	    verbs_enter(__builtin_return_address(0), by_dlvsym)

/*
 * The sanitizers' runtimes resolve their own interceptors through dlvsym while
 * they initialise, before any instrumented code may run (its shadow memory is
 * not mapped yet): the hook's path for names that are not ibv_* is left
 * uninstrumented (the attributes do nothing in other builds).
 */
#define R2CC_EARLY __attribute__((no_sanitize_address, no_sanitize_thread))

R2CC_EARLY static dlvsym_fn get_real_dlvsym(void)
{
	dlvsym_fn f = __atomic_load_n(&real_dlvsym, __ATOMIC_ACQUIRE);
	if (!f) {
		f = (dlvsym_fn)dlsym(RTLD_NEXT, "dlvsym");
		__atomic_store_n(&real_dlvsym, f, __ATOMIC_RELEASE);
	}
	return f;
}

/*
 * The library whose functions are the real ones: the handle NCCL resolved through,
 * else (a caller that links the library) the one already loaded as that caller's
 * dependency, found by soname: it may sit in a plugin's local scope, where
 * RTLD_NEXT would not see it.
 */
static void *lib_handle(void **slot, const char *soname)
{
	void *h = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
	if (h)
		return h;
	h = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
	if (!h)
		h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
	void *none = NULL;
	if (h && !__atomic_compare_exchange_n(slot, &none, h, false, __ATOMIC_ACQ_REL,
					      __ATOMIC_ACQUIRE)) {
		dlclose(h);
		h = none;
	}
	return h;
}

static void *verbs_lib(void)
{
	return lib_handle(&verbs_handle, "libibverbs.so.1");
}

static void *mlx5_handle; /* libmlx5: NCCL's handle, or the one loaded */

static void *mlx5_lib(void)
{
	return lib_handle(&mlx5_handle, "libmlx5.so.1");
}

/* Resolve a real function a wrapper needs that its caller has not asked for yet,
 * at rdma-core's default version of the name. */
static void *resolve_real(const char *name, const char *version)
{
	dlvsym_fn f = get_real_dlvsym();
	void *h = verbs_lib();
	if (!f || !h)
		return NULL;
	return f(h, name, version);
}

/* The real function behind an export, at the version the caller linked against. */
static bool sym_real(void **slot, void *(*lib)(void), const char *name, const char *version)
{
	if (r2cc_likely(__atomic_load_n(slot, __ATOMIC_ACQUIRE) != NULL))
		return true;
	dlvsym_fn f = get_real_dlvsym();
	void *h = lib();
	void *fn = f && h ? f(h, name, version) : NULL;
	if (!fn) {
		R2CC_WARN("verbs: %s@%s: the library has no such function (%s)", name, version,
			  h ? "it is older than the caller's" : "it cannot be found");
		return false;
	}
	__atomic_store_n(slot, fn, __ATOMIC_RELEASE);
	return true;
}

#define REAL(name)                                                                                 \
	(real_##name ? real_##name : (real_##name = (name##_fn)resolve_real(#name, name##_ver)))

/* --- data path ------------------------------------------------------------- */

static struct r2cc_ctx *ctx_of(const struct ibv_context *ctx)
{
	return r2cc_ctx_find(ctx);
}

/* What a post handed the provider, counted (registry.h, struct r2cc_fold); out of
 * q's gate. */
static inline void post_send_counted(struct r2cc_qp *q, uint64_t n, uint64_t bytes, int door)
{
	if (r2cc_likely(r2cc_counts_own(door))) {
		r2cc_count_own(&q->tx_wrs, n);
		r2cc_count_own(&q->tx_bytes, bytes);
	} else {
		struct r2cc_nic *nic = q->ctx->nic;
		r2cc_counter_add(&nic->cnt.tx_bytes, bytes);
		r2cc_counter_add(&nic->cnt.tx_wrs, n);
		r2cc_counter_add(&q->other_tx, n);
	}
	r2cc_cq_gate_exit(&q->gate, door);
}

/* A post the provider refused, or whose record the shadow refused: the counters
 * count what the provider took; a refused post goes to hot repair. Inside the gate. */
static __attribute__((noinline)) int post_send_mended(struct r2cc_qp *q, struct ibv_send_wr *wr,
						      struct ibv_send_wr **bad, int rc, int door)
{
	struct r2cc_qp_shadow *sh = q->shadow;
	if (rc != 0 && sh)
		r2cc_qp_shadow_unpost_send(sh, wr, *bad);
	uint64_t bytes = 0, n = 0;
	const struct ibv_send_wr *stop = rc ? *bad : NULL;
	for (const struct ibv_send_wr *w = wr; w && w != stop; w = w->next, n++)
		for (int i = 0; i < w->num_sge; i++)
			bytes += w->sg_list[i].length;
	post_send_counted(q, n, bytes, door);
	if (rc != 0 && q->rep)
		rc = r2cc_to_verbs(r2cc_repair_send_refused(q, r2cc_from_verbs(rc), bad));
	return rc;
}

/* A post inside q's gate (door): recorded before the real post, so that its completion
 * can never be polled first. A refused record breaks the shadow (that QP then cannot
 * be repaired); the record's sums are the counters' unless the post or the record
 * fails. */
static inline __attribute__((always_inline)) int post_send_in(struct r2cc_qp *q, struct ibv_qp *qp,
							      struct ibv_send_wr *wr,
							      struct ibv_send_wr **bad, int door)
{
	struct r2cc_qp_shadow *sh = q->shadow;
	uint64_t bytes = 0, n = 0;
	bool summed = sh && r2cc_qp_shadow_post_send_all(sh, wr, &n, &bytes) == 0;
	int rc = q->ctx->post_send(qp, wr, bad);
	if (r2cc_unlikely(rc != 0 || !summed))
		return post_send_mended(q, wr, bad, rc, door);
	post_send_counted(q, n, bytes, door);
	return 0;
}

/* A post that does not come in through the owner door with a cached QP (as
 * poll_slow). */
static __attribute__((noinline)) int post_send_slow(struct ibv_qp *qp, struct ibv_send_wr *wr,
						    struct ibv_send_wr **bad)
{
	struct r2cc_qp *q = r2cc_qp_find_hot(qp);
	if (!q) {
		struct r2cc_ctx *c = ctx_of(qp->context);
		if (r2cc_unlikely(!c)) {
			r2cc_disable("post_send on a context R2CC has no record of");
			*bad = wr;
			return EINVAL;
		}
		return c->post_send(qp, wr, bad);
	}
	int door = r2cc_cq_gate_enter(&q->gate);
	if (door == R2CC_DOOR_SLOW)
		return r2cc_to_verbs(r2cc_repair_post_send(q, wr, bad));
	return post_send_in(q, qp, wr, bad, door);
}

static int wrap_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct r2cc_qp *q = r2cc_qp_peek_hot(qp);
	if (r2cc_unlikely(!q || !r2cc_cq_gate_solo_enter(&q->gate)))
		return post_send_slow(qp, wr, bad);
	return post_send_in(q, qp, wr, bad, R2CC_DOOR_SOLO);
}

static int wrap_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct r2cc_qp *q = r2cc_qp_find_hot(qp);
	if (r2cc_unlikely(!q)) {
		struct r2cc_ctx *c = ctx_of(qp->context);
		if (r2cc_unlikely(!c)) {
			r2cc_disable("post_recv on a context R2CC has no record of");
			*bad = wr;
			return EINVAL;
		}
		return c->post_recv(qp, wr, bad);
	}
	int door = r2cc_cq_gate_enter(&q->gate);
	if (r2cc_unlikely(door == R2CC_DOOR_SLOW))
		return r2cc_to_verbs(r2cc_repair_post_recv(q, wr, bad));
	struct r2cc_ctx *c = q->ctx;
	struct r2cc_qp_shadow *sh = q->shadow;
	if (sh)
		r2cc_qp_shadow_post_recv(sh, wr, NULL);
	int rc = c->post_recv(qp, wr, bad);
	if (r2cc_unlikely(rc != 0) && sh)
		r2cc_qp_shadow_unpost_recv(sh, wr, *bad);
	uint64_t n = 0;
	const struct ibv_recv_wr *stop = rc ? *bad : NULL;
	for (const struct ibv_recv_wr *w = wr; w && w != stop; w = w->next)
		n++;
	if (r2cc_likely(r2cc_counts_own(door))) {
		r2cc_count_own(&q->recv_wrs, n);
	} else {
		r2cc_counter_add(&c->nic->cnt.recv_posted, n);
		r2cc_counter_add(&q->other_rx, n);
	}
	r2cc_cq_gate_exit(&q->gate, door);
	if (r2cc_unlikely(rc != 0) && q->rep)
		rc = r2cc_to_verbs(r2cc_repair_recv_refused(q, r2cc_from_verbs(rc), bad));
	return rc;
}

static int err_status(const struct ibv_wc *wc, int n)
{
	for (int i = 0; i < n; i++)
		if (wc[i].status != IBV_WC_SUCCESS)
			return wc[i].status;
	return 0;
}

static unsigned err_qpn(const struct ibv_wc *wc, int n)
{
	for (int i = 0; i < n; i++)
		if (wc[i].status != IBV_WC_SUCCESS)
			return wc[i].qp_num;
	return 0;
}

/* A poll that found completions: probes taken out, shadows retired, counters (own:
 * into rc's own counts); errors to hot repair. Out of line, so that the empty poll
 * (most of NCCL's polls) keeps few registers live and saves few. Inside the CQ's
 * gate. */
static __attribute__((noinline)) int poll_got(struct r2cc_cq *rc, int got, struct ibv_wc *wc,
					      bool own)
{
	struct r2cc_nic *nic = rc->ctx->nic;
	uint64_t rx_bytes = 0, rx = 0, tx = 0, err = 0;
	bool shadows = rc->v != NULL;
	int kept = 0;
	for (int i = 0; i < got; i++) {
		if (r2cc_unlikely(wc[i].wr_id == R2CC_PROBE_WRID) &&
		    wc[i].status == IBV_WC_SUCCESS && shadows) {
			r2cc_repair_probe_done(rc, &wc[i]);
			continue;
		}
		if (r2cc_unlikely(kept != i))
			wc[kept] = wc[i];
		kept++;
		if (shadows) {
			struct r2cc_qp *q = r2cc_qp_by_num_hot(nic, wc[i].qp_num);
			if (q && q->shadow)
				r2cc_qp_shadow_wc(q->shadow, &wc[i]);
		}
		if (r2cc_unlikely(wc[i].status != IBV_WC_SUCCESS))
			err++;
		else if (wc[i].opcode & IBV_WC_RECV) {
			rx++;
			rx_bytes += wc[i].byte_len;
		} else {
			tx++;
		}
	}
	got = kept;
	if (r2cc_likely(own)) {
		r2cc_count_own(&rc->rx_wrs, rx);
		r2cc_count_own(&rc->rx_bytes, rx_bytes);
		r2cc_count_own(&rc->tx_cqes, tx);
	} else {
		if (rx) {
			r2cc_counter_add(&nic->cnt.rx_wrs, rx);
			r2cc_counter_add(&nic->cnt.rx_bytes, rx_bytes);
		}
		if (tx)
			r2cc_counter_add(&nic->cnt.tx_cqes, tx);
	}
	if (r2cc_unlikely(err)) {
		r2cc_counter_add(&nic->cnt.err_cqes, err);
		int left = shadows ? r2cc_repair_poll_errors(rc, wc, got) : got;
		/* The first few, then one in a thousand: a dying path can
		 * flush hundreds of work requests. */
		static unsigned long reports;
		if ((uint64_t)(got - left) < err) {
			unsigned long n = __atomic_fetch_add(&reports, 1, __ATOMIC_RELAXED);
			if (n < 8 || n % 1000 == 0)
				R2CC_WARN("%s: %llu completion(s) with an error status "
					  "reach NCCL, first status %d on qp 0x%x",
					  nic->name, (unsigned long long)(err - (got - left)),
					  err_status(wc, left), err_qpn(wc, left));
		}
		got = left;
	}
	return got;
}

/* A poll that does not come in through the owner door with a cached CQ: a lookup
 * the thread's cache missed, a CQ R2CC has no record of (made before R2CC wrapped
 * its context), another thread's poll, or hot repair's. */
static __attribute__((noinline)) int poll_slow(struct ibv_cq *cq, int num, struct ibv_wc *wc)
{
	struct r2cc_cq *rc = r2cc_cq_find_hot(cq);
	if (!rc) {
		struct r2cc_ctx *c = ctx_of(cq->context);
		if (r2cc_unlikely(!c)) {
			r2cc_disable("poll_cq on a context R2CC has no record of");
			return -EINVAL;
		}
		return c->poll_cq(cq, num, wc);
	}
	int door = r2cc_cq_gate_enter(&rc->gate);
	if (door == R2CC_DOOR_SLOW)
		return r2cc_repair_poll(rc, num, wc);
	int got = rc->ctx->poll_cq(cq, num, wc);
	if (got > 0)
		got = poll_got(rc, got, wc, r2cc_counts_own(door));
	r2cc_cq_gate_exit(&rc->gate, door);
	return got;
}

/* The fast path: a CQ in the thread's cache, whose gate the thread owns, and nothing
 * failed. */
static int wrap_poll_cq(struct ibv_cq *cq, int num, struct ibv_wc *wc)
{
	struct r2cc_cq *rc = r2cc_cq_peek_hot(cq);
	if (r2cc_unlikely(!rc || !r2cc_cq_gate_solo_enter(&rc->gate)))
		return poll_slow(cq, num, wc);
	int got = rc->ctx->poll_cq(cq, num, wc);
	if (got > 0)
		got = poll_got(rc, got, wc, r2cc_counts_own(R2CC_DOOR_SOLO));
	r2cc_cq_gate_solo_exit(&rc->gate);
	return got;
}

/* --- control path ---------------------------------------------------------- */

/*
 * The verbs calls R2CC makes of its own (hot repair's and the MR mirror's, never
 * NCCL's and never the data path) go through these, so that R2CC_FAULT_INJECT=verbs:N
 * (shim/fault.h) can fail the Nth: creations with NULL and ENOMEM, the others
 * with EIO, as a dying device would.
 */
#define FI_PTR(call)                                                                               \
	do {                                                                                       \
		if (r2cc_fault_fire(R2CC_FAULT_VERBS)) {                                           \
			errno = ENOMEM;                                                            \
			return NULL;                                                               \
		}                                                                                  \
		return call;                                                                       \
	} while (0)
#define FI_INT(call) return r2cc_fault_fire(R2CC_FAULT_VERBS) ? EIO : (call)

static struct ibv_cq *fi_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
				   struct ibv_comp_channel *ch, int vec)
{
	FI_PTR(real_ibv_create_cq(ctx, cqe, cq_context, ch, vec));
}

static int fi_destroy_cq(struct ibv_cq *cq)
{
	if (r2cc_drill_on)
		r2cc_drill_cq_destroyed(cq);
	FI_INT(real_ibv_destroy_cq(cq));
}

static struct ibv_qp *fi_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	FI_PTR(real_ibv_create_qp(pd, attr));
}

/* The real ibv_modify_qp, through the drill while R2CC_DRILL runs (repair/drill.h). */
static int modify_qp_wire(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	return r2cc_drill_on ? r2cc_drill_modify(qp, attr, mask, real_ibv_modify_qp)
			     : real_ibv_modify_qp(qp, attr, mask);
}

static int fi_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	FI_INT(modify_qp_wire(qp, attr, mask));
}

static int fi_destroy_qp(struct ibv_qp *qp)
{
	if (r2cc_drill_on)
		r2cc_drill_qp_destroyed(qp);
	FI_INT(real_ibv_destroy_qp(qp));
}

static int fi_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
	if (r2cc_fault_fire(R2CC_FAULT_VERBS))
		return EIO;
	int rc = real_ibv_query_port(ctx, port, attr);
	if (!rc && r2cc_drill_on) /* R2CC's port view: a drilled NIC's port is down */
		r2cc_drill_port(ctx, attr);
	return rc;
}

static int fi_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
	FI_INT(real_ibv_query_gid(ctx, port, index, gid));
}

/* The type (IBV_GID_TYPE_*) of a GID table entry: from rdma-core's
 * ibv_query_gid_ex (IBVERBS_1.11, rdma-core 32 on), looked up once; -1 when the
 * library has none, the entry is empty or the call fails. */
typedef int (*query_gid_ex_fn)(struct ibv_context *, uint32_t, uint32_t, struct ibv_gid_entry *,
			       uint32_t, size_t);
static query_gid_ex_fn real_query_gid_ex;
static int query_gid_ex_looked; /* 1: real_query_gid_ex is what there is */

static int gid_type_of(struct ibv_context *ctx, uint8_t port, int index)
{
	if (!__atomic_load_n(&query_gid_ex_looked, __ATOMIC_ACQUIRE)) {
		dlvsym_fn f = get_real_dlvsym();
		void *h = __atomic_load_n(&verbs_handle, __ATOMIC_ACQUIRE);
		if (!f || !h)
			return -1;
		__atomic_store_n(&real_query_gid_ex,
				 (query_gid_ex_fn)f(h, "_ibv_query_gid_ex", "IBVERBS_1.11"),
				 __ATOMIC_RELEASE);
		__atomic_store_n(&query_gid_ex_looked, 1, __ATOMIC_RELEASE);
	}
	query_gid_ex_fn q = __atomic_load_n(&real_query_gid_ex, __ATOMIC_ACQUIRE);
	struct ibv_gid_entry e;
	if (!q || index < 0 || q(ctx, port, (uint32_t)index, &e, 0, sizeof(e)))
		return -1;
	return (int)e.gid_type;
}

static struct ibv_pd *fi_alloc_pd(struct ibv_context *ctx)
{
	FI_PTR(real_ibv_alloc_pd(ctx));
}

static int fi_dealloc_pd(struct ibv_pd *pd)
{
	FI_INT(real_ibv_dealloc_pd(pd));
}

static struct ibv_mr *fi_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	FI_PTR(real_ibv_reg_mr(pd, addr, len, access));
}

static struct ibv_mr *fi_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				      unsigned int access)
{
	FI_PTR(real_ibv_reg_mr_iova2(pd, addr, len, iova, access));
}

static struct ibv_mr *fi_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len,
				       uint64_t iova, int fd, int access)
{
	FI_PTR(real_ibv_reg_dmabuf_mr(pd, offset, len, iova, fd, access));
}

static int fi_dereg_mr(struct ibv_mr *mr)
{
	FI_INT(real_ibv_dereg_mr(mr));
}

/* MR mirror hooks (repair/model/mr_mirror.h), only with R2CC_MR_MIRROR=1: the real
 * functions the mirror registers its own PDs and MRs with. */
static void mirror_ctx_opened(struct ibv_context *ctx, struct r2cc_nic *nic)
{
	struct r2cc_mr_mirror_verbs v = {
	    .alloc_pd = REAL(ibv_alloc_pd) ? fi_alloc_pd : NULL,
	    .dealloc_pd = REAL(ibv_dealloc_pd) ? fi_dealloc_pd : NULL,
	    .reg_mr = REAL(ibv_reg_mr) ? fi_reg_mr : NULL,
	    .reg_mr_iova2 = REAL(ibv_reg_mr_iova2) ? fi_reg_mr_iova2 : NULL,
	    .reg_dmabuf_mr = REAL(ibv_reg_dmabuf_mr) ? fi_reg_dmabuf_mr : NULL,
	    .dereg_mr = REAL(ibv_dereg_mr) ? fi_dereg_mr : NULL,
	};
	r2cc_mr_mirror_ctx_opened(ctx, nic, &v);
}

static void query_port_attrs(struct ibv_context *ctx, struct r2cc_nic *nic)
{
	struct ibv_port_attr pa;
	memset(&pa, 0, sizeof(pa));
	if (REAL(ibv_query_port) && real_ibv_query_port(ctx, nic->port, &pa) == 0) {
		nic->port_state = pa.state;
		nic->lid = pa.lid;
		nic->link_layer = pa.link_layer;
		nic->active_mtu = pa.active_mtu;
	}
}

static struct ibv_device **wrap_ibv_get_device_list(int *num)
{
	int n = 0;
	struct ibv_device **list = real_ibv_get_device_list(num ? num : &n);
	if (list && r2cc_active()) {
		int saved = errno;
		r2cc_net_listed(r2cc_transport_of(verbs_caller, verbs_by_dlvsym), num ? *num : n);
		errno = saved;
	}
	return list;
}

/* What a port query told: NCCL's view of the NIC's port. */
static void note_port(struct r2cc_ctx *c, uint8_t port, const struct ibv_port_attr *attr)
{
	c->nic->port = port;
	c->nic->port_state = attr->state;
	c->nic->lid = attr->lid;
	c->nic->link_layer = attr->link_layer;
	c->nic->active_mtu = attr->active_mtu;
}

/* Why hot repair must leave a QP alone: what it is, why, the way back (or NULL). */
struct refusal {
	const char *what, *why, *fix;
};

static struct ibv_qp *record_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr, struct ibv_qp *qp,
				const struct refusal *no);

/*
 * The extended context's ops that verbs.h's inlines call instead of a symbol: a
 * caller linked against libibverbs queries a port through query_port (NCCL 2.27.6+
 * too), and ibv_create_qp_ex with more than a PD reaches create_qp_ex. Nested
 * calls (a provider's own) pass through.
 */
static int wrap_vctx_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr,
				size_t len)
{
	struct r2cc_ctx *c = r2cc_ctx_find(ctx);
	if (!c || !c->query_port)
		return EOPNOTSUPP;
	int rc = c->query_port(ctx, port, attr, len);
	if (rc == 0 && len >= offsetof(struct ibv_port_attr, active_mtu) + sizeof(attr->active_mtu))
		note_port(c, port, attr);
	return rc;
}

static struct ibv_qp *wrap_vctx_create_qp_ex(struct ibv_context *ctx,
					     struct ibv_qp_init_attr_ex *attr)
{
	struct r2cc_ctx *c = r2cc_ctx_find(ctx);
	if (!c || !c->create_qp_ex) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (in_verbs)
		return c->create_qp_ex(ctx, attr);
	VERBS_ENTER(false);
	struct ibv_qp *qp = c->create_qp_ex(ctx, attr);
	if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !r2cc_active())
		return qp; /* no PD: not a QP R2CC can place */
	static const struct refusal wr_api = {
	    "queue pairs made for the ibv_wr_* send API",
	    "ibv_create_qp_ex with send_ops_flags: R2CC does not see their posts", NULL};
	static const struct refusal ex_attrs = {
	    "queue pairs made by ibv_create_qp_ex",
	    "they ask for attributes hot repair cannot give a new path", NULL};
	const struct refusal *no = NULL;
	if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
		no = &wr_api;
	else if (attr->comp_mask & ~(uint32_t)(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS))
		no = &ex_attrs;
	return record_qp(attr->pd, (struct ibv_qp_init_attr *)attr, qp, no);
}

/* Replaces the data-path ops and the extended ops above in a new context. */
static void wrap_ops(struct ibv_context *ctx, struct r2cc_ctx *c)
{
	c->post_send = ctx->ops.post_send;
	c->post_recv = ctx->ops.post_recv;
	c->poll_cq = ctx->ops.poll_cq;
	struct verbs_context *vc = verbs_get_ctx_op(ctx, query_port);
	if (vc)
		c->query_port = vc->query_port;
	vc = verbs_get_ctx_op(ctx, create_qp_ex);
	if (vc)
		c->create_qp_ex = vc->create_qp_ex;
	/* Publish the originals before the wrappers can run. */
	__atomic_thread_fence(__ATOMIC_RELEASE);
	ctx->ops.post_send = wrap_post_send;
	ctx->ops.post_recv = wrap_post_recv;
	ctx->ops.poll_cq = wrap_poll_cq;
	vc = verbs_get_ctx(ctx);
	if (c->query_port)
		vc->query_port = wrap_vctx_query_port;
	if (c->create_qp_ex)
		vc->create_qp_ex = wrap_vctx_create_qp_ex;
}

/* Puts back what wrap_ops() replaced; again: wrap them again (a close that failed). */
static void unwrap_ops(struct ibv_context *ctx, const struct r2cc_ctx *c, bool again)
{
	struct verbs_context *vc = verbs_get_ctx(ctx);
	/* the provider's own, also where the drill filters them (repair/drill.h) */
	ctx->ops.post_send = again		 ? wrap_post_send
			     : c->wire_post_send ? c->wire_post_send
						 : c->post_send;
	ctx->ops.post_recv = again		 ? wrap_post_recv
			     : c->wire_post_recv ? c->wire_post_recv
						 : c->post_recv;
	ctx->ops.poll_cq = again ? wrap_poll_cq : c->wire_poll_cq ? c->wire_poll_cq : c->poll_cq;
	if (c->query_port)
		vc->query_port = again ? wrap_vctx_query_port : c->query_port;
	if (c->create_qp_ex)
		vc->create_qp_ex = again ? wrap_vctx_create_qp_ex : c->create_qp_ex;
}

static struct ibv_context *wrap_ibv_open_device(struct ibv_device *dev)
{
	struct ibv_context *ctx = real_ibv_open_device(dev);
	if (!ctx || !r2cc_active()) /* pass-through since (a forked child, a disable) */
		return ctx;
	int saved = errno;
	const char *name = REAL(ibv_get_device_name) ? real_ibv_get_device_name(dev) : NULL;
	struct r2cc_nic *nic = r2cc_nic_get(name ? name : "?");
	struct r2cc_ctx *c = nic ? r2cc_ctx_add(ctx, nic) : NULL;
	if (!c) {
		R2CC_WARN("%s: cannot register the device; its traffic passes through unobserved",
			  name ? name : "?");
		errno = saved;
		return ctx;
	}
	query_port_attrs(ctx, nic);
	if (r2cc_repair_enabled()) {
		struct r2cc_repair_verbs rv = {
		    .create_cq = REAL(ibv_create_cq) ? fi_create_cq : NULL,
		    .destroy_cq = REAL(ibv_destroy_cq) ? fi_destroy_cq : NULL,
		    .create_qp = REAL(ibv_create_qp) ? fi_create_qp : NULL,
		    .modify_qp = REAL(ibv_modify_qp) ? fi_modify_qp : NULL,
		    .destroy_qp = REAL(ibv_destroy_qp) ? fi_destroy_qp : NULL,
		    .query_port = REAL(ibv_query_port) ? fi_query_port : NULL,
		    .query_gid = REAL(ibv_query_gid) ? fi_query_gid : NULL,
		    .gid_type = gid_type_of,
		    .ack_async_event = REAL(ibv_ack_async_event),
		};
		r2cc_repair_set_verbs(&rv);
		if (r2cc_param.drill[0])
			r2cc_drill_init();
	}
	wrap_ops(ctx, c);
	r2cc_net_opened(r2cc_transport_of(verbs_caller, verbs_by_dlvsym));
	R2CC_INFO("%s: opened (NIC %d, lid %u, port %s)", nic->name, nic->index, nic->lid,
		  nic->port_state == IBV_PORT_ACTIVE ? "active" : "not active");
	if (r2cc_param.mr_mirror) /* MR mirror hook */
		mirror_ctx_opened(ctx, nic);
	errno = saved;
	return ctx;
}

static int wrap_ibv_close_device(struct ibv_context *ctx)
{
	struct r2cc_ctx *c = r2cc_ctx_find(ctx);
	if (r2cc_param.mr_mirror) /* MR mirror hook: R2CC's PD and MRs on ctx go first */
		r2cc_mr_mirror_ctx_closing(ctx);
	if (c)
		unwrap_ops(ctx, c, false);
	int rc = real_ibv_close_device(ctx);
	if (rc == 0)
		r2cc_ctx_remove(ctx);
	else if (c)
		unwrap_ops(ctx, c, true);
	return rc;
}

static int wrap_ibv_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
	int rc = real_ibv_query_port(ctx, port, attr);
	struct r2cc_ctx *c;
	if (rc == 0 && (c = r2cc_ctx_find(ctx)))
		note_port(c, port, attr);
	return rc;
}

static int wrap_ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
	int rc = real_ibv_query_gid(ctx, port, index, gid);
	struct r2cc_ctx *c;
	if (rc == 0 && (c = r2cc_ctx_find(ctx))) {
		if (!c->nic->gid_known) {
			c->nic->gid = *gid;
			c->nic->gid_known = true;
		}
		/* what NCCL read, for a device that dies before the QP's RTR */
		r2cc_nic_gid_cache(c->nic, index, gid);
	}
	return rc;
}

static struct ibv_pd *wrap_ibv_alloc_pd(struct ibv_context *ctx)
{
	struct ibv_pd *pd = real_ibv_alloc_pd(ctx);
	if (pd) {
		int saved = errno;
		struct r2cc_ctx *c = r2cc_ctx_find(ctx);
		if (c)
			r2cc_pd_add(pd, c);
		errno = saved;
		if (r2cc_param.mr_mirror) /* MR mirror hook */
			r2cc_mr_mirror_pd_allocated(ctx);
	}
	return pd;
}

static int wrap_ibv_dealloc_pd(struct ibv_pd *pd)
{
	int rc = real_ibv_dealloc_pd(pd);
	if (rc == 0)
		r2cc_pd_remove(pd);
	return rc;
}

/* va: addr is the registration's virtual address (not an IOVA or a dma-buf). */
static struct ibv_mr *note_mr(struct ibv_pd *pd, struct ibv_mr *mr, uint64_t addr, size_t len,
			      int access, bool va)
{
	if (mr) {
		int saved = errno;
		struct r2cc_pd *p = r2cc_pd_find(pd);
		struct r2cc_mr *m =
		    p ? r2cc_mr_add(mr, p->ctx->nic, addr, len, mr->lkey, mr->rkey, access) : NULL;
		if (m && va && r2cc_repair_enabled() && r2cc_cts_host_readable(addr, len))
			__atomic_store_n(&m->host_ok, 1, __ATOMIC_RELEASE);
		errno = saved;
	}
	return mr;
}

/* MR mirror hook (R2CC_MR_MIRROR=1): the mirrors are registered inside
 * NCCL's call, while a dma-buf fd is certainly open. */
static struct ibv_mr *mirror_mr(struct ibv_pd *pd, struct ibv_mr *mr, struct r2cc_mr_mirror_src src)
{
	if (mr && r2cc_param.mr_mirror)
		r2cc_mr_mirror_reg(pd, mr, &src);
	return mr;
}

/* A registration the device refused: if the device is dead and hot repair takes
 * its NIC over (its QPs are virtual), a virtual registration made on the other
 * NICs (r2cc_mr_mirror_reg_virtual), so that NCCL goes on as it does with its QPs
 * there; otherwise NCCL's NULL and errno. */
static struct ibv_mr *refused_mr(struct ibv_pd *pd, struct r2cc_mr_mirror_src src)
{
	int err = errno;
	struct r2cc_pd *p = r2cc_pd_find(pd);
	struct ibv_mr *mr = NULL;
	if (p && p->ctx && p->ctx->nic && r2cc_param.mr_mirror &&
	    r2cc_repair_reg_refused(p->ctx->nic, r2cc_from_verbs(err)))
		mr = r2cc_mr_mirror_reg_virtual(pd, &src);
	if (!mr) {
		errno = err;
		return NULL;
	}
	R2CC_WARN_ONCE("%s: the dead device refused a memory registration (%s); it is made on "
		       "the other NICs, for the queue pairs that moved off this one (further "
		       "ones not logged)",
		       p->ctx->nic->name, strerror(err));
	return note_mr(pd, mr, mr->addr ? (uintptr_t)mr->addr : src.iova, src.len, src.access,
		       src.kind == R2CC_MR_VA);
}

static struct ibv_mr *wrap_ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	struct r2cc_mr_mirror_src src = {R2CC_MR_VA, addr, 0, 0, -1, len, access};
	struct ibv_mr *mr = real_ibv_reg_mr(pd, addr, len, access);
	if (!mr)
		return refused_mr(pd, src);
	return mirror_mr(pd, note_mr(pd, mr, (uintptr_t)addr, len, access, true), src);
}

static struct ibv_mr *wrap_ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
					   int access)
{
	struct r2cc_mr_mirror_src src = {R2CC_MR_IOVA, addr, iova, 0, -1, len, access};
	struct ibv_mr *mr = real_ibv_reg_mr_iova(pd, addr, len, iova, access);
	if (!mr)
		return refused_mr(pd, src);
	return mirror_mr(pd, note_mr(pd, mr, (uintptr_t)addr, len, access, iova == (uintptr_t)addr),
			 src);
}

static struct ibv_mr *wrap_ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len,
					    uint64_t iova, unsigned int access)
{
	struct r2cc_mr_mirror_src src = {R2CC_MR_IOVA, addr, iova, 0, -1, len, (int)access};
	struct ibv_mr *mr = real_ibv_reg_mr_iova2(pd, addr, len, iova, access);
	if (!mr)
		return refused_mr(pd, src);
	/* verbs.h's ibv_reg_mr comes here with iova = addr: a plain VA registration */
	return mirror_mr(
	    pd, note_mr(pd, mr, (uintptr_t)addr, len, (int)access, iova == (uintptr_t)addr), src);
}

static struct ibv_mr *wrap_ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len,
					     uint64_t iova, int fd, int access)
{
	struct r2cc_mr_mirror_src src = {R2CC_MR_DMABUF, NULL, iova, offset, fd, len, access};
	struct ibv_mr *mr = real_ibv_reg_dmabuf_mr(pd, offset, len, iova, fd, access);
	if (!mr)
		return refused_mr(pd, src);
	return mirror_mr(pd, note_mr(pd, mr, iova, len, access, false), src);
}

static int wrap_ibv_dereg_mr(struct ibv_mr *mr)
{
	/* MR mirror hook: before the real call, while mr cannot be a new MR's
	 * address yet (a failed dereg leaves that MR unmirrored). A virtual
	 * registration never reaches the provider. */
	if (r2cc_param.mr_mirror && r2cc_mr_mirror_dereg(mr)) {
		r2cc_mr_remove(mr);
		free(mr);
		return 0;
	}
	int rc = real_ibv_dereg_mr(mr);
	if (rc == 0)
		r2cc_mr_remove(mr);
	return rc;
}

/*
 * A dead device refused NCCL a CQ or a QP (docs/architecture.md, Hot repair: QPs on a failed
 * NIC are virtual from birth): the object is made on a healthy sibling instead
 * (r2cc_repair_stand_in), and recorded as the dead NIC's. A stand-in CQ is polled
 * as NCCL's CQ (the completions of its QPs' new paths come through it); a stand-in
 * QP stays in RESET, with a CQ of its own, and NCCL's state changes are kept for
 * its migration. NULL (errno kept) where there is no such stand-in.
 */
static struct ibv_cq *stand_in_cq(struct ibv_context *ctx, int cqe, void *cq_context,
				  struct ibv_comp_channel *ch)
{
	int err = errno;
	struct r2cc_ctx *c = ch ? NULL : r2cc_ctx_find(ctx); /* a channel is the dead one's */
	struct r2cc_ctx *s = c ? r2cc_repair_stand_in(c, r2cc_from_verbs(err)) : NULL;
	struct ibv_cq *cq = s ? real_ibv_create_cq(s->ctx, cqe, cq_context, NULL, 0) : NULL;
	if (!cq) {
		errno = err;
		return NULL;
	}
	R2CC_WARN_ONCE("%s: the dead device refused a completion queue (%s); R2CC made it on "
		       "%s, for the queue pairs that move off this NIC (further ones not "
		       "logged)",
		       c->nic->name, strerror(err), s->nic->name);
	return cq;
}

static struct ibv_qp *stand_in_qp(struct ibv_pd *pd, const struct ibv_qp_init_attr *attr,
				  struct ibv_cq **own_cq)
{
	int err = errno;
	struct r2cc_pd *p = r2cc_pd_find(pd);
	struct r2cc_ctx *s = p && attr->qp_type == IBV_QPT_RC && !attr->srq
				 ? r2cc_repair_stand_in(p->ctx, r2cc_from_verbs(err))
				 : NULL;
	struct ibv_pd *spd = s ? r2cc_mr_mirror_pd(s->nic) : NULL;
	struct ibv_cq *cq = spd ? real_ibv_create_cq(s->ctx, 2, NULL, NULL, 0) : NULL;
	struct ibv_qp *qp = NULL;
	if (cq) {
		struct ibv_qp_init_attr ia = {.send_cq = cq,
					      .recv_cq = cq,
					      .cap = {.max_send_wr = 1,
						      .max_recv_wr = 1,
						      .max_send_sge = 1,
						      .max_recv_sge = 1},
					      .qp_type = IBV_QPT_RC};
		qp = real_ibv_create_qp(spd, &ia);
		if (!qp)
			real_ibv_destroy_cq(cq);
	}
	if (!qp) {
		errno = err;
		return NULL;
	}
	*own_cq = cq;
	R2CC_WARN_ONCE("%s: the dead device refused a queue pair (%s); R2CC stands one in on "
		       "%s, and NCCL's queue pairs there move as soon as NCCL connects them "
		       "(further ones not logged)",
		       p->ctx->nic->name, strerror(err), s->nic->name);
	return qp;
}

static struct ibv_cq *wrap_ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
					 struct ibv_comp_channel *ch, int vec)
{
	struct ibv_cq *cq = real_ibv_create_cq(ctx, cqe, cq_context, ch, vec);
	if (!cq)
		cq = stand_in_cq(ctx, cqe, cq_context, ch);
	if (cq) {
		int saved = errno;
		struct r2cc_ctx *c = r2cc_ctx_find(ctx);
		struct r2cc_cq *rc = c ? r2cc_cq_add(cq, c, cq->cqe) : NULL;
		if (rc)
			r2cc_repair_cq_created(rc);
		errno = saved;
	}
	return cq;
}

static int wrap_ibv_destroy_cq(struct ibv_cq *cq)
{
	struct r2cc_cq *c = r2cc_cq_find(cq);
	if (c)
		r2cc_repair_cq_destroyed(c);
	if (r2cc_drill_on)
		r2cc_drill_cq_destroyed(cq);
	int rc = real_ibv_destroy_cq(cq);
	if (rc == 0)
		r2cc_cq_remove(cq);
	return rc;
}

/*
 * Records a QP the caller made (qp, or NULL: a stand-in is then tried). no: why hot
 * repair must leave it alone (an out-of-order receive queue), or NULL; the transport
 * that made it may have its own reason. Returns the QP the caller gets.
 */
static struct ibv_qp *record_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr, struct ibv_qp *qp,
				const struct refusal *no)
{
	struct ibv_cq *own_cq = NULL;
	const struct r2cc_transport *t = r2cc_transport_of(verbs_caller, verbs_by_dlvsym);
	char what[160];
	struct refusal by_transport = {
	    what, t->why_not,
	    t->kind == R2CC_TRANSPORT_NCCL
		? NULL
		: "NCCL_NET_PLUGIN=none, NCCL_IBEXT_DISABLE=1 or NCCL_NET=IB "
		  "give NCCL's own IB transport, which R2CC repairs"};
	if (!no && t->why_not) {
		snprintf(what, sizeof(what), "queue pairs of %s", t->name);
		no = &by_transport;
	}
	if (!qp && !no)
		qp = stand_in_qp(pd, attr, &own_cq);
	if (qp) {
		int saved = errno;
		struct r2cc_pd *p = r2cc_pd_find(pd);
		struct r2cc_qp *q = NULL;
		if (p) {
			q = r2cc_qp_add(qp, p->ctx, r2cc_cq_find(attr->send_cq),
					r2cc_cq_find(attr->recv_cq), qp->qp_num, attr->qp_type);
			if (q) {
				q->max_send_wr = attr->cap.max_send_wr;
				q->max_recv_wr = attr->cap.max_recv_wr;
				q->cap = attr->cap;
				q->sq_sig_all = attr->sq_sig_all != 0;
				q->stand_in_cq = own_cq;
				q->cts = t->cts;
				q->cts_unknown = t->cts_unknown;
				q->transport = t->name;
				r2cc_nccl_version_probe(); /* the layout of its FIFO */
				r2cc_net_attempt();	   /* a transport's queue pairs tell */
				if (!no)
					r2cc_repair_qp_created(q, attr);
				else if (attr->qp_type == IBV_QPT_RC && r2cc_repair_enabled())
					r2cc_unprotected(no->what, no->why, no->fix);
				R2CC_TRACE("%s: qp 0x%x created by %s (send_wr %u recv_wr %u)",
					   p->ctx->nic->name, qp->qp_num, t->name, q->max_send_wr,
					   q->max_recv_wr);
			}
		}
		if (own_cq && !q) { /* no record: the stand-in cannot serve */
			real_ibv_destroy_qp(qp);
			real_ibv_destroy_cq(own_cq);
			qp = NULL;
			saved = ENOMEM;
		}
		errno = saved;
	}
	return qp;
}

static struct ibv_qp *wrap_ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	return record_qp(pd, attr, real_ibv_create_qp(pd, attr), NULL);
}

static int wrap_ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	struct r2cc_qp *q = r2cc_qp_find(qp);
	/* A stand-in is refused as the dead device would refuse it. */
	int rc = q && q->stand_in_cq ? EIO : modify_qp_wire(qp, attr, mask);
	/* A dead device refuses the connection of a QP hot repair can move: it connects
	 * on a healthy NIC instead, once NCCL has given it all its attributes. */
	if (rc && (mask & IBV_QP_STATE) && q &&
	    r2cc_repair_modify_refused(q, r2cc_from_verbs(rc), attr->qp_state))
		rc = 0;
	if (rc == 0 && q) {
		if (mask & IBV_QP_STATE)
			__atomic_store_n(&q->state, attr->qp_state, __ATOMIC_RELAXED);
		if (mask & IBV_QP_DEST_QPN)
			q->peer.qpn = attr->dest_qp_num;
		if (mask & IBV_QP_PKEY_INDEX)
			q->path.pkey_index = attr->pkey_index;
		if (mask & IBV_QP_AV) {
			q->peer.lid = attr->ah_attr.dlid;
			q->peer.has_grh = attr->ah_attr.is_global;
			q->peer.port = attr->ah_attr.port_num;
			q->path.sl = attr->ah_attr.sl;
			q->path.sgid_type = -1;
			if (attr->ah_attr.is_global) {
				const struct ibv_global_route *g = &attr->ah_attr.grh;
				q->peer.gid = g->dgid;
				q->path.sgid_index = g->sgid_index;
				q->path.hop_limit = g->hop_limit;
				q->path.traffic_class = g->traffic_class;
				q->path.flow_label = g->flow_label;
				/* This end's identity as the peer sees it (hot repair
				 * finds QPs by GID and QP number on RoCE). */
				uint8_t port = mask & IBV_QP_PORT ? attr->port_num : q->port_num;
				port = port ? port : 1;
				struct ibv_context *own = q->ctx->ctx; /* a stand-in's is not */
				if (real_ibv_query_gid(own, port, g->sgid_index, &q->peer.sgid) &&
				    !r2cc_nic_gid_cached(q->ctx->nic, g->sgid_index, &q->peer.sgid))
					memset(&q->peer.sgid, 0, sizeof(q->peer.sgid));
				q->path.sgid_type = gid_type_of(own, port, g->sgid_index);
				struct r2cc_nic *nic = q->ctx->nic;
				if (!__atomic_load_n(&nic->roce_known, __ATOMIC_ACQUIRE)) {
					nic->roce_sgid_index = g->sgid_index;
					nic->roce_tclass = g->traffic_class;
					__atomic_store_n(&nic->roce_known, 1, __ATOMIC_RELEASE);
				}
			}
		}
		if (mask & IBV_QP_TIMEOUT)
			q->timeout = attr->timeout;
		if (mask & IBV_QP_PATH_MTU)
			q->path_mtu = (uint8_t)attr->path_mtu;
		if (mask & IBV_QP_PORT)
			q->port_num = attr->port_num;
		if (mask & IBV_QP_ACCESS_FLAGS)
			q->access = attr->qp_access_flags;
		if (mask & IBV_QP_RETRY_CNT)
			q->retry_cnt = attr->retry_cnt;
		if (mask & IBV_QP_RNR_RETRY)
			q->rnr_retry = attr->rnr_retry;
		if ((mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RTR)
			R2CC_TRACE("%s: qp 0x%x -> RTR, peer lid %u qpn 0x%x", q->ctx->nic->name,
				   q->qpn, q->peer.lid, q->peer.qpn);
		if ((mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RTS && q->rep)
			r2cc_repair_qp_ready(q);
	}
	return rc;
}

static int wrap_ibv_destroy_qp(struct ibv_qp *qp)
{
	struct r2cc_qp *q = r2cc_qp_find(qp);
	struct ibv_cq *own_cq = q ? q->stand_in_cq : NULL;
	if (q)
		r2cc_repair_qp_destroying(q);
	if (r2cc_drill_on)
		r2cc_drill_qp_destroyed(qp);
	int rc = real_ibv_destroy_qp(qp);
	if (rc == 0) {
		if (own_cq)
			real_ibv_destroy_cq(own_cq);
		/* A QP hot repair knows is freed with its record (repair/rqp.c). */
		struct r2cc_qp *gone = r2cc_qp_unlink(qp);
		if (gone && !(gone == q && r2cc_repair_qp_destroyed(q)))
			r2cc_qp_free(gone);
	}
	return rc;
}

/* Async events: those of NICs and QPs hot repair handles are acked and kept from
 * NCCL (a port error would otherwise end its communicators). */
static int wrap_ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *ev)
{
	for (;;) {
		int rc = real_ibv_get_async_event(ctx, ev);
		if (rc || !r2cc_repair_async_event(ctx, ev))
			return rc;
	}
}

/* --- generated forwarding wrappers ---------------------------------------- */

#define R2CC_VERBS_OWN(ret, name, ver, params, args)
#define R2CC_VERBS_FN(ret, name, ver, params, args)                                                \
	static ret wrap_##name params                                                              \
	{                                                                                          \
		return real_##name args;                                                           \
	}
#include "intercept/verbs_funcs.def"
#undef R2CC_VERBS_FN
#undef R2CC_VERBS_OWN

/* What dlvsym hands out: the wrapper, entered as the outermost verbs call. */
#define R2CC_VERBS_FN(ret, name, ver, params, args)                                                \
	static ret hook_##name params                                                              \
	{                                                                                          \
		VERBS_ENTER(true);                                                                 \
		return wrap_##name args;                                                           \
	}
#define R2CC_VERBS_OWN R2CC_VERBS_FN
#include "intercept/verbs_funcs.def"
#undef R2CC_VERBS_FN
#undef R2CC_VERBS_OWN

/* --- by symbol -------------------------------------------------------------- */

/*
 * libr2cc.so exports every name of verbs_funcs.def at rdma-core's default version
 * of it (shim/exports.map), so that code linked against libibverbs (HPC-X's net
 * plugin, NCCL built with RDMA_CORE=1, rdma-core's own programs) reaches the same
 * wrappers as NCCL's dlvsym path. Each export resolves the real function at that
 * version; a nested call, or any call while R2CC is not active (R2CC_MODE=0, a bad
 * setting, a forked child), goes straight to it. A caller of an older version of
 * a name (the IBVERBS_1.0 ABI) binds to libibverbs itself.
 */
#define VERBS_NONE(ret) ((ret)(__builtin_types_compatible_p(ret, int) ? ENOSYS : 0))
#define R2CC_VERBS_FN(ret, name, ver, params, args)                                                \
	R2CC_EXPORT ret export_##name params __asm__(#name);                                       \
	ret export_##name params                                                                   \
	{                                                                                          \
		if (r2cc_unlikely(!sym_real((void **)&real_##name, verbs_lib, #name, ver))) {      \
			errno = ENOSYS;                                                            \
			return VERBS_NONE(ret);                                                    \
		}                                                                                  \
		if (in_verbs || !r2cc_active())                                                    \
			return real_##name args;                                                   \
		r2cc_net_verbs_seen();                                                             \
		VERBS_ENTER(false);                                                                \
		return wrap_##name args;                                                           \
	}
#define R2CC_VERBS_OWN R2CC_VERBS_FN
#include "intercept/verbs_funcs.def"
#undef R2CC_VERBS_FN
#undef R2CC_VERBS_OWN

/* --- mlx5 Direct Verbs ------------------------------------------------------ */

/*
 * NCCL's own transport resolves mlx5dv_* from libmlx5 with dlvsym (2.27.3+ data
 * direct: mlx5dv_reg_dmabuf_mr; 2.30+ with NCCL_IB_OOO_RQ=1: mlx5dv_create_qp), and
 * HPC-X's net plugin links libmlx5: both doors lead here, as for libibverbs. A QP
 * mlx5dv_create_qp makes is recorded as ibv_create_qp's are, and repaired alike
 * (its new path is a plain RC QP, which is what it is), unless it asks for what a
 * new path cannot give: an out-of-order receive queue (MLX5DV_QP_CREATE_OOO_DP)
 * lets the NIC place a message's data and consume receives out of order, and hot
 * repair's exactly-once plan rests on RC's in-order placement, so such a QP is
 * refused with one warning naming NCCL_IB_OOO_RQ. A data-direct registration
 * enters the MR records and mirrors as a dma-buf one.
 */
#define R2CC_MLX5DV_QP_CREATE_OOO_DP (1u << 7) /* rdma-core 50+'s mlx5dv.h */

typedef struct ibv_qp *(*mlx5dv_create_qp_fn)(struct ibv_context *, struct ibv_qp_init_attr_ex *,
					      struct mlx5dv_qp_init_attr *);
typedef struct ibv_mr *(*mlx5dv_reg_dmabuf_mr_fn)(struct ibv_pd *, uint64_t, size_t, uint64_t, int,
						  int, int);
static mlx5dv_create_qp_fn real_mlx5dv_create_qp;
static mlx5dv_reg_dmabuf_mr_fn real_mlx5dv_reg_dmabuf_mr;

static struct ibv_qp *wrap_mlx5dv_create_qp(struct ibv_context *ctx,
					    struct ibv_qp_init_attr_ex *attr,
					    struct mlx5dv_qp_init_attr *mattr)
{
	struct ibv_qp *qp = real_mlx5dv_create_qp(ctx, attr, mattr);
	if (!attr || !(attr->comp_mask & IBV_QP_INIT_ATTR_PD))
		return qp; /* no PD: not a QP R2CC can place */
	static const struct refusal ooo = {
	    "queue pairs with an out-of-order receive queue (mlx5dv_create_qp with "
	    "MLX5DV_QP_CREATE_OOO_DP)",
	    "hot repair's exactly-once plan rests on RC's in-order data placement",
	    "unset NCCL_IB_OOO_RQ, which is off by default"};
	static const struct refusal dv = {
	    "queue pairs made by mlx5dv_create_qp with mlx5 attributes",
	    "hot repair cannot give a new path those attributes", NULL};
	static const struct refusal ex = {
	    "queue pairs made by mlx5dv_create_qp with extended attributes",
	    "hot repair cannot give a new path those attributes", NULL};
	const struct refusal *no = NULL;
	uint64_t mmask = mattr ? mattr->comp_mask : 0;
	uint32_t flags = mmask & MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS ? mattr->create_flags : 0;
	if (flags & R2CC_MLX5DV_QP_CREATE_OOO_DP)
		no = &ooo;
	else if ((mmask & ~(uint64_t)MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS) || flags)
		no = &dv;
	else if (attr->comp_mask & ~(uint32_t)(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS))
		no = &ex;
	return record_qp(attr->pd, (struct ibv_qp_init_attr *)attr, qp, no);
}

static struct ibv_mr *wrap_mlx5dv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len,
						uint64_t iova, int fd, int access, int mlx5_access)
{
	struct r2cc_mr_mirror_src src = {R2CC_MR_DMABUF, NULL, iova, offset, fd, len, access};
	struct ibv_mr *mr =
	    real_mlx5dv_reg_dmabuf_mr(pd, offset, len, iova, fd, access, mlx5_access);
	if (!mr)
		return NULL;
	return mirror_mr(pd, note_mr(pd, mr, iova, len, access, false), src);
}

static struct ibv_qp *hook_mlx5dv_create_qp(struct ibv_context *ctx,
					    struct ibv_qp_init_attr_ex *attr,
					    struct mlx5dv_qp_init_attr *mattr)
{
	VERBS_ENTER(true);
	return wrap_mlx5dv_create_qp(ctx, attr, mattr);
}

static struct ibv_mr *hook_mlx5dv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len,
						uint64_t iova, int fd, int access, int mlx5_access)
{
	VERBS_ENTER(true);
	return wrap_mlx5dv_reg_dmabuf_mr(pd, offset, len, iova, fd, access, mlx5_access);
}

R2CC_EXPORT struct ibv_qp *
export_mlx5dv_create_qp(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *attr,
			struct mlx5dv_qp_init_attr *mattr) __asm__("mlx5dv_create_qp");
struct ibv_qp *export_mlx5dv_create_qp(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *attr,
				       struct mlx5dv_qp_init_attr *mattr)
{
	if (r2cc_unlikely(!sym_real((void **)&real_mlx5dv_create_qp, mlx5_lib, "mlx5dv_create_qp",
				    "MLX5_1.3"))) {
		errno = ENOSYS;
		return NULL;
	}
	if (in_verbs || !r2cc_active())
		return real_mlx5dv_create_qp(ctx, attr, mattr);
	VERBS_ENTER(false);
	return wrap_mlx5dv_create_qp(ctx, attr, mattr);
}

R2CC_EXPORT struct ibv_mr *
export_mlx5dv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova, int fd,
			    int access, int mlx5_access) __asm__("mlx5dv_reg_dmabuf_mr");
struct ibv_mr *export_mlx5dv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len,
					   uint64_t iova, int fd, int access, int mlx5_access)
{
	if (r2cc_unlikely(!sym_real((void **)&real_mlx5dv_reg_dmabuf_mr, mlx5_lib,
				    "mlx5dv_reg_dmabuf_mr", "MLX5_1.25"))) {
		errno = ENOSYS;
		return NULL;
	}
	if (in_verbs || !r2cc_active())
		return real_mlx5dv_reg_dmabuf_mr(pd, offset, len, iova, fd, access, mlx5_access);
	VERBS_ENTER(false);
	return wrap_mlx5dv_reg_dmabuf_mr(pd, offset, len, iova, fd, access, mlx5_access);
}

/* --- the hook ------------------------------------------------------------- */

struct verbs_entry {
	const char *name;
	void **real;
	void *wrapper;
};

static const struct verbs_entry mlx5_table[] = {
    {"mlx5dv_create_qp", (void **)&real_mlx5dv_create_qp, (void *)hook_mlx5dv_create_qp},
    {"mlx5dv_reg_dmabuf_mr", (void **)&real_mlx5dv_reg_dmabuf_mr,
     (void *)hook_mlx5dv_reg_dmabuf_mr},
};

static const struct verbs_entry verbs_table[] = {
#define R2CC_VERBS_FN(ret, name, ver, params, args)                                                \
	{#name, (void **)&real_##name, (void *)hook_##name},
#define R2CC_VERBS_OWN R2CC_VERBS_FN
#include "intercept/verbs_funcs.def"
#undef R2CC_VERBS_FN
#undef R2CC_VERBS_OWN
};

/* Counts of names handed out as wrappers, for tests and INFO. */
static int verbs_wrapped;

static void *verbs_hook(void *handle, const char *symbol, const char *version, void *fn);

R2CC_EXPORT R2CC_EARLY void *dlvsym(void *handle, const char *symbol, const char *version)
{
	dlvsym_fn real = get_real_dlvsym();
	if (!real)
		return NULL;
	void *fn = real(handle, symbol, version);
	/* By hand, and before the thread-local in_hook: strncmp and __tls_get_addr are
	 * intercepted too. */
	if (!fn)
		return fn;
	if (symbol[0] == 'i' && symbol[1] == 'b' && symbol[2] == 'v' && symbol[3] == '_')
		return verbs_hook(handle, symbol, version, fn);
	if (symbol[0] == 'm' && symbol[1] == 'l' && symbol[2] == 'x' && symbol[3] == '5' &&
	    symbol[4] == 'd' && symbol[5] == 'v' && symbol[6] == '_')
		return verbs_hook(handle, symbol, version, fn);
	return fn;
}

/* dlvsym's ibv_* and mlx5dv_* names: hand back the wrapper and remember the real
 * function. */
static void *verbs_hook(void *handle, const char *symbol, const char *version, void *fn)
{
	if (in_hook)
		return fn;
	in_hook = 1;
	if (!r2cc_active()) {
		in_hook = 0;
		return fn;
	}
	r2cc_net_verbs_seen();
	bool mlx5 = symbol[0] == 'm';
	const struct verbs_entry *table = mlx5 ? mlx5_table : verbs_table;
	size_t n = mlx5 ? R2CC_ARRAY_SIZE(mlx5_table) : R2CC_ARRAY_SIZE(verbs_table);
	void *out = fn;
	for (size_t i = 0; i < n; i++) {
		if (strcmp(table[i].name, symbol))
			continue;
		void *none = NULL;
		__atomic_compare_exchange_n(mlx5 ? &mlx5_handle : &verbs_handle, &none, handle,
					    false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
		__atomic_store_n(table[i].real, fn, __ATOMIC_RELEASE);
		out = table[i].wrapper;
		if (__atomic_fetch_add(&verbs_wrapped, 1, __ATOMIC_RELAXED) == 0)
			R2CC_INFO("verbs: wrapping %s's functions (first: %s@%s)",
				  mlx5 ? "libmlx5" : "libibverbs", symbol, version);
		break;
	}
	in_hook = 0;
	return out;
}
