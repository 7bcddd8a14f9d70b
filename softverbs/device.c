/*
 * Control-path verbs of the software RDMA device: process start-up (attach the
 * fabric, register this node's NICs), the device list, contexts (a real struct
 * verbs_context with query_port, and a pipe as async_fd), async events, queries,
 * protection domains and memory regions. Every int-returning verb returns an errno
 * value, every pointer-returning one NULL with errno set, as libibverbs does.
 *
 * A NIC that died (fault `fatal`) raises IBV_EVENT_DEVICE_FATAL on every context opened
 * on it; from then on those contexts answer EIO to everything but the calls that free
 * resources (close, dealloc, dereg, destroy) and modify_qp to ERR or RESET, which
 * succeed and do nothing, as mlx5 answers firmware commands after an internal error.
 */
#include "softverbs/internal.h"
#include "softverbs/softverbs.h"
#include "softverbs/wc_status.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct sv_process sv_proc = {
    .once = PTHREAD_ONCE_INIT,
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .proc_slot = -1,
};

/*
 * The child of a fork() starts with no device objects and no progress thread (the
 * parent's objects are not usable there, as with real verbs) and joins the fabric as
 * a member of its own.
 */
static void sv_atfork_child(void)
{
	static const pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;

	sv_proc.lock = fresh;
	sv_proc.thread_started = false;
	sv_proc.kicked = false;
	sv_proc.qps = NULL;
	sv_proc.ctxs = NULL;
	sv_proc.cqs = NULL;
	sv_proc.srqs = NULL;
	atomic_store(&sv_proc.live_pds, 0);
	sv_engines_forget();
	sv_proc.pd_base = (uint32_t)getpid() << 12;
	if (sv_proc.f && sv_fabric_join(sv_proc.f, &sv_proc.cfg, &sv_proc.proc_slot) < 0)
		fprintf(stderr, "softverbs: forked child %d cannot join the fabric\n",
			(int)getpid());
}

static void sv_init_once(void)
{
	struct sv_fabric *f;
	int i, n;

	sv_config_read(&sv_proc.cfg);
	f = sv_fabric_attach(sv_proc.cfg.fabric, true);
	if (!f) {
		sv_proc.init_err = errno;
		fprintf(stderr, "softverbs: cannot map fabric /dev/shm/%s: %s%s\n",
			sv_proc.cfg.fabric, strerror(errno),
			errno == EPROTO ? " (left by another version, or its creator died: "
					  "softverbs-ctl reset)"
					: "");
		return;
	}
	n = sv_fabric_join(f, &sv_proc.cfg, &sv_proc.proc_slot);
	if (n < 0) {
		sv_proc.init_err = -n;
		fprintf(stderr, "softverbs: cannot join node %s to fabric %s: %s\n",
			sv_proc.cfg.node, sv_proc.cfg.fabric, strerror(-n));
		return;
	}
	if (sv_proc.cfg.faults && *sv_proc.cfg.faults)
		sv_fabric_schedule(f, sv_proc.cfg.faults);
	sv_proc.node = n;
	sv_proc.ndevs = f->nodes[n].nnics;
	sv_proc.devs = calloc(sv_proc.ndevs ? sv_proc.ndevs : 1, sizeof(*sv_proc.devs));
	if (!sv_proc.devs) {
		sv_proc.init_err = ENOMEM;
		return;
	}
	for (i = 0; i < sv_proc.ndevs; i++) {
		struct sv_device *d = &sv_proc.devs[i];
		struct sv_nic *nic = &f->nics[f->nodes[n].nics[i]];

		d->nic = f->nodes[n].nics[i];
		d->dev.node_type = IBV_NODE_CA;
		d->dev.transport_type = IBV_TRANSPORT_IB;
		snprintf(d->dev.name, sizeof(d->dev.name), "%s", nic->name);
		snprintf(d->dev.dev_name, sizeof(d->dev.dev_name), "uverbs%d", i);
		snprintf(d->dev.dev_path, sizeof(d->dev.dev_path),
			 "/sys/class/infiniband_verbs/uverbs%d", i);
		snprintf(d->dev.ibdev_path, sizeof(d->dev.ibdev_path), "/sys/class/infiniband/%s",
			 nic->name);
	}
	/* PD ids are fabric-wide so an rkey of another PD is refused. */
	sv_proc.pd_base = (uint32_t)getpid() << 12;
	sv_proc.f = f;
	pthread_atfork(NULL, NULL, sv_atfork_child);
}

int sv_init(void)
{
	pthread_once(&sv_proc.once, sv_init_once);
	return sv_proc.f ? 0 : (sv_proc.init_err ? sv_proc.init_err : ENODEV);
}

struct sv_ctx *sv_ctx_of(struct ibv_context *context)
{
	return sv_container_of(context, struct sv_ctx, vctx.context);
}

bool sv_ctx_dead(struct ibv_context *context)
{
	struct sv_ctx *ctx = sv_ctx_of(context);

	return sv_nic_dead(sv_proc.f, ctx->nic, ctx->epoch);
}

SV_EXPORT struct ibv_device **ibv_get_device_list(int *num_devices)
{
	struct ibv_device **list;
	int rc = sv_init();

	if (rc) {
		errno = rc;
		return NULL;
	}
	list = calloc(sv_proc.ndevs + 1, sizeof(*list));
	if (!list) {
		errno = ENOMEM;
		return NULL;
	}
	for (int i = 0; i < sv_proc.ndevs; i++)
		list[i] = &sv_proc.devs[i].dev;
	if (num_devices)
		*num_devices = sv_proc.ndevs;
	return list;
}

SV_EXPORT void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

SV_EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
	return device->name;
}

SV_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device)
{
	struct sv_device *d = sv_container_of(device, struct sv_device, dev);

	return htobe64(sv_proc.f->nics[d->nic].guid);
}

/* The kernel's index of the device; here its place in the device list. */
SV_EXPORT int ibv_get_device_index(struct ibv_device *device)
{
	struct sv_device *d = sv_container_of(device, struct sv_device, dev);

	return (int)(d - sv_proc.devs);
}

SV_EXPORT int ibv_fork_init(void)
{
	return 0;
}

static int sv_query_port_op(struct ibv_context *context, uint8_t port_num,
			    struct ibv_port_attr *port_attr, size_t len);
static int sv_query_device_ex_op(struct ibv_context *context,
				 const struct ibv_query_device_ex_input *input,
				 struct ibv_device_attr_ex *attr, size_t attr_size);

SV_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct sv_device *d = sv_container_of(device, struct sv_device, dev);
	struct sv_ctx *ctx;
	int fds[2], rc = sv_init();

	if (rc) {
		errno = rc;
		return NULL;
	}
	/* A dead device cannot be opened; after `up` it can, and that context works. */
	if (atomic_load(&sv_proc.f->nics[d->nic].fault) == SV_FAULT_FATAL) {
		errno = EIO;
		return NULL;
	}
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx) {
		errno = ENOMEM;
		return NULL;
	}
	if (pipe2(fds, O_CLOEXEC) != 0)
		goto err_free;
	/*
	 * No kernel command channel stands behind a context, but programs dup() cmd_fd to
	 * hand the context to a child or to ibv_import_device; a descriptor that exists
	 * (reads end at once, writes and ioctls fail) lets them reach that call, which
	 * answers EOPNOTSUPP (compat.c), instead of stopping at dup() with EBADF.
	 */
	ctx->vctx.context.cmd_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (ctx->vctx.context.cmd_fd < 0)
		goto err_close_pipe;
	ctx->nic = d->nic;
	ctx->epoch = atomic_load(&sv_proc.f->nics[d->nic].epoch);
	ctx->ev_wfd = fds[1];
	pthread_mutex_init(&ctx->ev_lock, NULL);
	ctx->port_active = sv_nic_link(sv_proc.f, d->nic, sv_now_ns()) != SV_LINK_DOWN;
	ctx->vctx.sz = sizeof(struct verbs_context);
	ctx->vctx.query_port = sv_query_port_op;
	ctx->vctx.query_device_ex = sv_query_device_ex_op;
	ctx->vctx.create_qp_ex = sv_create_qp_ex;
	ctx->vctx.context.device = device;
	ctx->vctx.context.async_fd = fds[0];
	ctx->vctx.context.num_comp_vectors = 1;
	ctx->vctx.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
	pthread_mutex_init(&ctx->vctx.context.mutex, NULL);
	ctx->vctx.context.ops.poll_cq = sv_poll_cq;
	ctx->vctx.context.ops.req_notify_cq = sv_req_notify_cq;
	ctx->vctx.context.ops.post_send = sv_post_send;
	ctx->vctx.context.ops.post_recv = sv_post_recv;
	ctx->vctx.context.ops.post_srq_recv = sv_post_srq_recv;
	pthread_mutex_lock(&sv_proc.lock);
	ctx->next = sv_proc.ctxs;
	sv_proc.ctxs = ctx;
	pthread_mutex_unlock(&sv_proc.lock);
	sv_thread_start();
	return &ctx->vctx.context;

err_close_pipe:
	rc = errno;
	close(fds[0]);
	close(fds[1]);
	errno = rc;
err_free:
	rc = errno;
	free(ctx);
	errno = rc;
	return NULL;
}

SV_EXPORT int ibv_close_device(struct ibv_context *context)
{
	struct sv_ctx *ctx = sv_container_of(context, struct sv_ctx, vctx.context);
	struct sv_ctx **pp;

	pthread_mutex_lock(&sv_proc.lock);
	for (pp = &sv_proc.ctxs; *pp && *pp != ctx; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = ctx->next;
	pthread_mutex_unlock(&sv_proc.lock);
	close(context->async_fd);
	close(context->cmd_fd);
	close(ctx->ev_wfd);
	pthread_mutex_destroy(&ctx->ev_lock);
	free(ctx);
	return 0;
}

void sv_ctx_push_event(struct sv_ctx *ctx, struct ibv_async_event *ev)
{
	char one = 1;

	pthread_mutex_lock(&ctx->ev_lock);
	if (ctx->ev_tail - ctx->ev_head < SV_EVQ_CAP) {
		ctx->evq[ctx->ev_tail++ % SV_EVQ_CAP] = *ev;
		if (write(ctx->ev_wfd, &one, 1) != 1)
			ctx->ev_tail--;
	}
	pthread_mutex_unlock(&ctx->ev_lock);
}

/*
 * Called by the progress thread: turns port state changes into async events, and a
 * device's death into IBV_EVENT_DEVICE_FATAL (once; nothing follows it).
 */
void sv_ctx_check_ports(int64_t now)
{
	pthread_mutex_lock(&sv_proc.lock);
	for (struct sv_ctx *ctx = sv_proc.ctxs; ctx; ctx = ctx->next) {
		bool active = sv_nic_link(sv_proc.f, ctx->nic, now) != SV_LINK_DOWN;
		struct ibv_async_event ev = {0};

		if (ctx->fatal_told)
			continue;
		if (sv_nic_dead(sv_proc.f, ctx->nic, ctx->epoch)) {
			ctx->fatal_told = true;
			ev.event_type = IBV_EVENT_DEVICE_FATAL;
			ev.element.port_num = 0; /* a device event names no element */
			sv_ctx_push_event(ctx, &ev);
			continue;
		}
		if (active == ctx->port_active)
			continue;
		ctx->port_active = active;
		ev.event_type = active ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR;
		ev.element.port_num = 1;
		sv_ctx_push_event(ctx, &ev);
	}
	pthread_mutex_unlock(&sv_proc.lock);
}

SV_EXPORT int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
	struct sv_ctx *ctx = sv_container_of(context, struct sv_ctx, vctx.context);
	char one;
	ssize_t n;

	do
		n = read(context->async_fd, &one, 1);
	while (n < 0 && errno == EINTR);
	if (n != 1)
		return -1; /* errno from read (EAGAIN on a non-blocking fd), as rdma-core */
	pthread_mutex_lock(&ctx->ev_lock);
	*event = ctx->evq[ctx->ev_head++ % SV_EVQ_CAP];
	ctx->ev_unacked++;
	pthread_mutex_unlock(&ctx->ev_lock);
	return 0;
}

SV_EXPORT void ibv_ack_async_event(struct ibv_async_event *event)
{
	struct ibv_srq *srq = event->element.srq;

	/* Port and device events carry the port or nothing; SRQ limit events count on their SRQ. */
	if (event->event_type != IBV_EVENT_SRQ_LIMIT_REACHED)
		return;
	pthread_mutex_lock(&srq->mutex);
	srq->events_completed++;
	pthread_cond_signal(&srq->cond);
	pthread_mutex_unlock(&srq->mutex);
}

SV_EXPORT const char *ibv_event_type_str(enum ibv_event_type event)
{
	static const char *const names[] = {
	    [IBV_EVENT_CQ_ERR] = "CQ error",
	    [IBV_EVENT_QP_FATAL] = "local work queue catastrophic error",
	    [IBV_EVENT_QP_REQ_ERR] = "invalid request local work queue error",
	    [IBV_EVENT_QP_ACCESS_ERR] = "local access violation work queue error",
	    [IBV_EVENT_COMM_EST] = "communication established",
	    [IBV_EVENT_SQ_DRAINED] = "send queue drained",
	    [IBV_EVENT_PATH_MIG] = "path migrated",
	    [IBV_EVENT_PATH_MIG_ERR] = "path migration request error",
	    [IBV_EVENT_DEVICE_FATAL] = "local catastrophic error",
	    [IBV_EVENT_PORT_ACTIVE] = "port active",
	    [IBV_EVENT_PORT_ERR] = "port error",
	    [IBV_EVENT_LID_CHANGE] = "LID change",
	    [IBV_EVENT_PKEY_CHANGE] = "P_Key change",
	    [IBV_EVENT_SM_CHANGE] = "SM change",
	    [IBV_EVENT_SRQ_ERR] = "SRQ catastrophic error",
	    [IBV_EVENT_SRQ_LIMIT_REACHED] = "SRQ limit reached",
	    [IBV_EVENT_QP_LAST_WQE_REACHED] = "last WQE reached",
	    [IBV_EVENT_CLIENT_REREGISTER] = "client reregistration",
	    [IBV_EVENT_GID_CHANGE] = "GID table change",
	    [IBV_EVENT_WQ_FATAL] = "WQ fatal",
	};

	if ((unsigned)event < sizeof(names) / sizeof(names[0]) && names[event])
		return names[event];
	return "unknown";
}

SV_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status status)
{
	const char *name = softverbs_wc_status_name((int)status);

	return name ? name : "unknown";
}

SV_EXPORT const char *ibv_port_state_str(enum ibv_port_state state)
{
	static const char *const names[] = {"PORT_NOP",	  "PORT_DOWN",	 "PORT_INIT",
					    "PORT_ARMED", "PORT_ACTIVE", "PORT_ACTIVE_DEFER"};

	return (unsigned)state < 6 ? names[state] : "unknown";
}

static struct sv_nic *sv_ctx_nic(struct ibv_context *context)
{
	struct sv_ctx *ctx = sv_container_of(context, struct sv_ctx, vctx.context);

	return &sv_proc.f->nics[ctx->nic];
}

SV_EXPORT int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *attr)
{
	struct sv_nic *nic = sv_ctx_nic(context);

	if (sv_ctx_dead(context))
		return EIO;
	memset(attr, 0, sizeof(*attr));
	snprintf(attr->fw_ver, sizeof(attr->fw_ver), "softverbs-%d", SV_VERSION);
	attr->node_guid = htobe64(nic->guid);
	attr->sys_image_guid = htobe64(nic->guid);
	attr->max_mr_size = UINT64_MAX;
	attr->page_size_cap = 4096;
	attr->vendor_id = 0x5efe;
	attr->vendor_part_id = 1;
	attr->hw_ver = 1;
	/*
	 * What every QP, CQ, SRQ and MR call accepts (conformance's `limits` creates each
	 * maximum and is refused one more). Per queue the receive side is the smaller one
	 * (internal.h); tables are fabric-wide, PDs counted per process.
	 */
	attr->max_qp = SV_MAX_QPS;
	attr->max_qp_wr = SV_RQ_CAP;
	attr->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT;
	attr->max_sge = SV_RQ_SGE;
	attr->max_sge_rd = SV_MAX_SEND_SGE;
	attr->max_cq = SV_MAX_CQS;
	attr->max_cqe = SV_MAX_CQE;
	attr->max_mr = SV_MAX_MRS - 1; /* slot 0 is never a key */
	attr->max_pd = SV_MAX_PDS;
	attr->max_srq = SV_MAX_SRQS;
	attr->max_srq_wr = SV_SRQ_CAP;
	attr->max_srq_sge = SV_RQ_SGE;
	attr->max_qp_rd_atom = SV_MAX_RD_ATOM;
	attr->max_res_rd_atom = SV_MAX_RD_ATOM * SV_MAX_QPS;
	attr->max_qp_init_rd_atom = SV_MAX_RD_ATOM;
	attr->atomic_cap = IBV_ATOMIC_NONE;
	attr->max_pkeys = 1;
	attr->local_ca_ack_delay = 16;
	attr->phys_port_cnt = 1;
	return 0;
}

/*
 * The extended query: what ibv_query_device answers, and zero for every capability
 * the device lacks (no ODP, TSO, RSS, tag matching, device memory, timestamps).
 */
static int sv_query_device_ex_op(struct ibv_context *context,
				 const struct ibv_query_device_ex_input *input,
				 struct ibv_device_attr_ex *attr, size_t attr_size)
{
	struct ibv_device_attr_ex a = {0};

	if (input && input->comp_mask)
		return EINVAL;
	if (attr_size < sizeof(a.orig_attr))
		return EINVAL;
	ibv_query_device(context, &a.orig_attr);
	a.device_cap_flags_ex = a.orig_attr.device_cap_flags;
	a.phys_port_cnt_ex = a.orig_attr.phys_port_cnt;
	memset(attr, 0, attr_size);
	memcpy(attr, &a, attr_size < sizeof(a) ? attr_size : sizeof(a));
	return 0;
}

/* The (speed, width) pair whose product is closest to the NIC's rate, as NCCL decodes it. */
static void sv_speed_width(int gbps, uint8_t *speed, uint8_t *width)
{
	static const int speeds[] = {2500, 5000, 10000, 10000, 14000, 25000, 50000, 100000};
	static const int widths[] = {1, 4, 8, 12, 2};
	long best = -1;

	for (int s = 0; s < 8; s++)
		for (int w = 0; w < 5; w++) {
			long d = (long)speeds[s] * widths[w] - (long)gbps * 1000;

			d = d < 0 ? -d : d;
			if (best < 0 || d < best) {
				best = d;
				*speed = (uint8_t)(1 << s);
				*width = (uint8_t)(1 << w);
			}
		}
}

static int sv_port_fill(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *a)
{
	struct sv_ctx *ctx = sv_container_of(context, struct sv_ctx, vctx.context);
	struct sv_nic *nic = &sv_proc.f->nics[ctx->nic];
	bool down = sv_nic_link(sv_proc.f, ctx->nic, sv_now_ns()) == SV_LINK_DOWN;

	if (sv_ctx_dead(context))
		return EIO;
	if (port_num != 1)
		return EINVAL;
	memset(a, 0, sizeof(*a));
	a->state = down ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
	a->phys_state = down ? 3 /* disabled */ : 5 /* link up */;
	a->max_mtu = IBV_MTU_4096;
	a->active_mtu = sv_proc.f->net.active_mtu;
	a->gid_tbl_len = sv_port_gid_tbl_len(sv_proc.f);
	a->max_msg_sz = 1u << 31;
	a->pkey_tbl_len = 1;
	sv_speed_width(nic->gbps, &a->active_speed, &a->active_width);
	if (sv_proc.f->net.link == SV_LL_ROCE) {
		/* As a ConnectX port on Ethernet: no LID, no subnet manager, IP-based GIDs. */
		a->link_layer = IBV_LINK_LAYER_ETHERNET;
		a->port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS;
		return 0;
	}
	a->lid = nic->lid;
	a->sm_lid = 1;
	a->max_vl_num = 1;
	a->subnet_timeout = 18;
	a->link_layer = IBV_LINK_LAYER_INFINIBAND;
	return 0;
}

static int sv_query_port_op(struct ibv_context *context, uint8_t port_num,
			    struct ibv_port_attr *port_attr, size_t len)
{
	struct ibv_port_attr a;
	int rc = sv_port_fill(context, port_num, &a);

	/*
	 * A caller built against newer headers passes a larger struct (NCCL's has
	 * active_speed_ex at the end and uses it when non-zero): zero what we do not know.
	 */
	if (rc == 0) {
		memset(port_attr, 0, len);
		memcpy(port_attr, &a, len < sizeof(a) ? len : sizeof(a));
	}
	return rc;
}

/* The exported symbol takes the old (compat) layout, which is a prefix of today's. */
#undef ibv_query_port
SV_EXPORT int ibv_query_port(struct ibv_context *context, uint8_t port_num,
			     struct _compat_ibv_port_attr *port_attr)
{
	return sv_query_port_op(context, port_num, (struct ibv_port_attr *)port_attr,
				offsetof(struct ibv_port_attr, link_layer) + 1);
}

/*
 * The GID query family, as rdma-core 44-50 answers it: ibv_query_gid gives zeros for
 * an empty entry and -1 with errno for an index past the table; ibv_query_gid_ex
 * returns ENODATA / EINVAL; ibv_query_gid_table lists the populated entries.
 */
static int sv_gid_entry(struct ibv_context *context, uint32_t port_num, uint32_t index,
			struct ibv_gid_entry *e)
{
	struct sv_ctx *ctx = sv_container_of(context, struct sv_ctx, vctx.context);
	enum ibv_gid_type type;
	int rc;

	if (sv_ctx_dead(context))
		return EIO;
	if (port_num != 1)
		return EINVAL;
	memset(e, 0, sizeof(*e));
	rc = sv_nic_gid(sv_proc.f, ctx->nic, index, &e->gid, &type);
	if (rc)
		return -rc;
	e->gid_index = index;
	e->port_num = port_num;
	e->gid_type = type;
	e->ndev_ifindex = 0; /* there is no netdev behind a soft NIC */
	return 0;
}

SV_EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index,
			    union ibv_gid *gid)
{
	struct ibv_gid_entry e;
	int rc = index < 0 ? EINVAL : sv_gid_entry(context, port_num, (uint32_t)index, &e);

	if (rc == ENODATA) {
		memset(gid, 0, sizeof(*gid));
		return 0;
	}
	if (rc) {
		errno = rc;
		return -1;
	}
	*gid = e.gid;
	return 0;
}

int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
		      struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size);
SV_EXPORT int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
				struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
	struct ibv_gid_entry e;
	int rc;

	if (flags)
		return EOPNOTSUPP; /* no flag is defined */
	if (!entry_size)
		return EINVAL;
	rc = sv_gid_entry(context, port_num, gid_index, &e);
	if (rc)
		return rc;
	/* A caller built against a larger entry gets zeros past ours, a smaller one a prefix. */
	memset(entry, 0, entry_size);
	memcpy(entry, &e, entry_size < sizeof(e) ? entry_size : sizeof(e));
	return 0;
}

ssize_t _ibv_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries,
			     size_t max_entries, uint32_t flags, size_t entry_size);
SV_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries,
				       size_t max_entries, uint32_t flags, size_t entry_size)
{
	int len = sv_port_gid_tbl_len(sv_proc.f);
	struct ibv_gid_entry e;
	size_t n = 0;

	if (sv_ctx_dead(context))
		return -EIO;
	if (flags)
		return -EOPNOTSUPP;
	if (!entry_size)
		return -EINVAL;
	for (int i = 0; i < len; i++) {
		char *slot = (char *)entries + n * entry_size;

		if (sv_gid_entry(context, 1, (uint32_t)i, &e) != 0)
			continue;
		if (n == max_entries)
			return -EINVAL; /* more valid entries than room, as the kernel says */
		memset(slot, 0, entry_size);
		memcpy(slot, &e, entry_size < sizeof(e) ? entry_size : sizeof(e));
		n++;
	}
	return (ssize_t)n;
}

SV_EXPORT int ibv_query_pkey(struct ibv_context *context, uint8_t port_num, int index, __be16 *pkey)
{
	if (sv_ctx_dead(context))
		return EIO;
	if (port_num != 1 || index != 0)
		return EINVAL;
	*pkey = htobe16(0xffff);
	return 0;
}

/* The one P_Key is the default full-membership key at index 0; -1 for any other. */
SV_EXPORT int ibv_get_pkey_index(struct ibv_context *context, uint8_t port_num, __be16 pkey)
{
	__be16 p;

	if (ibv_query_pkey(context, port_num, 0, &p) != 0 || p != pkey)
		return -1;
	return 0;
}

SV_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	struct sv_pd *pd;

	if (sv_ctx_dead(context)) {
		errno = EIO;
		return NULL;
	}
	/* As a device out of PD numbers: ENOMEM past what max_pd reports. */
	if (atomic_fetch_add(&sv_proc.live_pds, 1) >= SV_MAX_PDS) {
		atomic_fetch_sub(&sv_proc.live_pds, 1);
		errno = ENOMEM;
		return NULL;
	}
	pd = calloc(1, sizeof(*pd));
	if (!pd) {
		atomic_fetch_sub(&sv_proc.live_pds, 1);
		errno = ENOMEM;
		return NULL;
	}
	pd->pd.context = context;
	pd->id = sv_proc.pd_base + atomic_fetch_add(&sv_proc.next_pd, 1) + 1;
	pd->pd.handle = pd->id;
	return &pd->pd;
}

SV_EXPORT int ibv_dealloc_pd(struct ibv_pd *ibpd)
{
	struct sv_pd *pd = sv_container_of(ibpd, struct sv_pd, pd);

	if (atomic_load(&pd->users))
		return EBUSY;
	free(pd);
	atomic_fetch_sub(&sv_proc.live_pds, 1);
	return 0;
}

struct sv_mr_slot *sv_mr_find(struct sv_fabric *f, uint32_t key)
{
	struct sv_mr_slot *m = &f->mrs[key & (SV_MAX_MRS - 1)];

	return key && atomic_load(&m->key) == key ? m : NULL;
}

/*
 * MR access flags as the kernel checks them (ib_check_mr_access): a bit it does not
 * know is EINVAL, remote write and atomics need local write (the IB spec), and on-demand
 * paging, which this device lacks, is EOPNOTSUPP.
 */
static int sv_mr_access_check(unsigned int access)
{
	if (access & ~((IBV_ACCESS_HUGETLB << 1) - 1))
		return EINVAL;
	if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
	    !(access & IBV_ACCESS_LOCAL_WRITE))
		return EINVAL;
	if (access & IBV_ACCESS_ON_DEMAND)
		return EOPNOTSUPP;
	return 0;
}

/* An MR; dmabuf: the device-memory buffer it is in (devmem.c), 0 for host memory. */
struct ibv_mr *sv_mr_register(struct ibv_pd *ibpd, void *addr, size_t length, uint64_t iova,
			      unsigned int access, uint64_t dmabuf, uint64_t dmabuf_off)
{
	struct sv_pd *pd = sv_container_of(ibpd, struct sv_pd, pd);
	struct sv_fabric *f = sv_proc.f;
	struct sv_mr *mr;
	uint32_t gen, key;
	int i, err;

	if (sv_ctx_dead(ibpd->context)) {
		errno = EIO;
		return NULL;
	}
	access &= ~IBV_ACCESS_OPTIONAL_RANGE; /* hints a device may ignore, as libibverbs does */
	err = sv_mr_access_check(access);
	if (err) {
		errno = err;
		return NULL;
	}
	if (!addr && length) {
		errno = EINVAL;
		return NULL;
	}
	mr = calloc(1, sizeof(*mr));
	if (!mr) {
		errno = ENOMEM;
		return NULL;
	}
	sv_lock(&f->lock);
	for (i = 1; i < SV_MAX_MRS && atomic_load(&f->mrs[i].key); i++)
		;
	if (i == SV_MAX_MRS) {
		pthread_mutex_unlock(&f->lock);
		free(mr);
		errno = ENOMEM;
		return NULL;
	}
	gen = atomic_fetch_add(&f->gen, 1) & ((1u << (32 - SV_MR_SHIFT)) - 1);
	key = (gen ? gen : 1) << SV_MR_SHIFT | (uint32_t)i;
	f->mrs[i].pid = getpid();
	f->mrs[i].pd = pd->id;
	f->mrs[i].access = access;
	f->mrs[i].addr = (uintptr_t)addr;
	f->mrs[i].iova = iova;
	f->mrs[i].len = length;
	f->mrs[i].dmabuf = dmabuf;
	f->mrs[i].dmabuf_off = dmabuf_off;
	atomic_store(&f->mrs[i].key, key);
	pthread_mutex_unlock(&f->lock);
	mr->slot = i;
	mr->mr.context = ibpd->context;
	mr->mr.pd = ibpd;
	mr->mr.addr = addr;
	mr->mr.length = length;
	mr->mr.handle = key;
	mr->mr.lkey = key;
	mr->mr.rkey = key;
	atomic_fetch_add(&pd->users, 1);
	return &mr->mr;
}

SV_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
					  uint64_t iova, unsigned int access)
{
	return sv_mr_register(pd, addr, length, iova, access, 0, 0);
}

#undef ibv_reg_mr
SV_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned)access);
}

#undef ibv_reg_mr_iova
SV_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length,
					 uint64_t iova, int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, iova, (unsigned)access);
}

/*
 * Changes an MR in place, keeping its keys: the new range (iova = address, as
 * rdma-core passes it), PD or access. Errors follow rdma-core: bad input is
 * IBV_REREG_MR_ERR_INPUT, an access the device refuses IBV_REREG_MR_ERR_CMD, with errno.
 */
SV_EXPORT int ibv_rereg_mr(struct ibv_mr *ibmr, int flags, struct ibv_pd *ibpd, void *addr,
			   size_t length, int access)
{
	struct sv_mr *mr = sv_container_of(ibmr, struct sv_mr, mr);
	struct sv_mr_slot *m = &sv_proc.f->mrs[mr->slot];
	struct sv_pd *old_pd = sv_container_of(ibmr->pd, struct sv_pd, pd), *pd = old_pd;

	if ((flags & ~IBV_REREG_MR_FLAGS_SUPPORTED) ||
	    ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!addr || !length)) ||
	    (access && !(flags & IBV_REREG_MR_CHANGE_ACCESS)) ||
	    ((flags & IBV_REREG_MR_CHANGE_PD) && !ibpd)) {
		errno = EINVAL;
		return IBV_REREG_MR_ERR_INPUT;
	}
	if (flags & IBV_REREG_MR_CHANGE_ACCESS) {
		int err;

		access &= ~IBV_ACCESS_OPTIONAL_RANGE;
		err = sv_mr_access_check((unsigned)access);
		if (err) {
			errno = err;
			return IBV_REREG_MR_ERR_CMD;
		}
	}
	if (flags & IBV_REREG_MR_CHANGE_PD)
		pd = sv_container_of(ibpd, struct sv_pd, pd);
	sv_lock(&sv_proc.f->lock);
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		m->addr = (uintptr_t)addr;
		m->iova = (uintptr_t)addr;
		m->len = length;
		m->dmabuf = 0; /* host memory now; the mapping stays until dereg */
	}
	m->pd = pd->id;
	if (flags & IBV_REREG_MR_CHANGE_ACCESS)
		m->access = (uint32_t)access;
	pthread_mutex_unlock(&sv_proc.f->lock);
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		ibmr->addr = addr;
		ibmr->length = length;
	}
	if (pd != old_pd) {
		atomic_fetch_add(&pd->users, 1);
		atomic_fetch_sub(&old_pd->users, 1);
		ibmr->pd = ibpd;
	}
	return 0;
}

SV_EXPORT int ibv_dereg_mr(struct ibv_mr *ibmr)
{
	struct sv_mr *mr = sv_container_of(ibmr, struct sv_mr, mr);
	struct sv_pd *pd = sv_container_of(ibmr->pd, struct sv_pd, pd);

	atomic_store(&sv_proc.f->mrs[mr->slot].key, 0);
	atomic_fetch_sub(&pd->users, 1);
	if (mr->map)
		munmap(mr->map, mr->maplen);
	free(mr);
	return 0;
}

SV_EXPORT int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	return EOPNOTSUPP;
}

SV_EXPORT int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	return EOPNOTSUPP;
}

/* For ibverbs-utils: no sysfs here. */
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);
SV_EXPORT int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)
{
	errno = ENOENT;
	return -1;
}

/*
 * Private to rdma-core's tools (ibv_devinfo): rdma-core's enum ibv_gid_type_sysfs, 0 for
 * IB and RoCE v1 (and an empty entry), 1 for RoCE v2; -1 with errno past the table.
 */
int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
		       int *type);
SV_EXPORT int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
				 int *type)
{
	struct ibv_gid_entry e;
	int rc = sv_gid_entry(context, port_num, index, &e);

	if (rc && rc != ENODATA) {
		errno = rc;
		return -1;
	}
	*type = !rc && e.gid_type == IBV_GID_TYPE_ROCE_V2;
	return 0;
}

SV_EXPORT int softverbs_nic_lossy_bytes(const char *node, const char *nic, uint64_t *bytes)
{
	struct sv_config cfg;
	struct sv_fabric *f = sv_proc.f;
	int i;

	if (!node || !nic || !bytes)
		return -EINVAL;
	if (!f) {
		sv_config_read(&cfg);
		f = sv_fabric_attach(cfg.fabric, false);
		if (!f)
			return -errno;
	}
	i = sv_fabric_find_nic(f, node, nic);
	if (i >= 0)
		*bytes = atomic_load(&f->nics[i].lossy_bytes);
	if (f != sv_proc.f)
		sv_fabric_detach(f);
	return i < 0 ? i : 0;
}

SV_EXPORT int softverbs_nic_stats(const char *node, struct softverbs_nic_stat *out, int max)
{
	struct sv_config cfg;
	struct sv_fabric *f = sv_proc.f;
	int n;

	if (!out || max < 0)
		return -EINVAL;
	if (f)
		return sv_fabric_nic_stats(f, node, out, max);
	sv_config_read(&cfg);
	f = sv_fabric_attach(cfg.fabric, false);
	if (!f)
		return -errno;
	n = sv_fabric_nic_stats(f, node, out, max);
	sv_fabric_detach(f);
	return n;
}
