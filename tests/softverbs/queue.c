/*
 * Completion queues, RC queue pairs and the data path of the software RDMA device.
 *
 * A send work request is copied into the QP's process-local send queue at post
 * time and executed in order by the engine of the QP's NIC: one thread per NIC of
 * this process, so that the NICs of a process move data in parallel, as hardware
 * does, and the posting thread (NCCL's single proxy thread) does not copy. Requests of
 * up to SV_POST_RUN bytes run at once in the posting thread when the engine is not
 * busy with that QP, which keeps small-message latency free of a thread hand-over.
 * With SOFTVERBS_ENGINES=0 everything runs in the posting thread, and what has to
 * wait (shaping, a missing receive, a path that does not answer) in this process's
 * progress thread. Executing a write checks the target's rkey in the shared MR table,
 * moves the bytes with process_vm_writev (memcpy within one process), then consumes
 * the target's posted receive and places its completion in the target's CQ ring in
 * shared memory: the target process need not run. No lock shared between processes
 * or NICs is held while bytes move.
 *
 * A path that does not deliver (local or remote port down or black-holed, remote QP
 * gone or not ready, remote process dead) is retried until the QP's own transport
 * timeout, 4.096 us * 2^timeout * (retry_cnt + 1) * SOFTVERBS_TIME_SCALE, has
 * passed; then the request completes with IBV_WC_RETRY_EXC_ERR, the QP moves to
 * ERR and everything still queued (send and receive) is flushed.
 */
#include "tests/softverbs/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#define SV_SMALL_WRITE 1024    /* copied 8 bytes at a time, in order */
#define SV_RETRY_POLL  1000000 /* ns between attempts on a silent path */
#define SV_RNR_POLL    100000  /* ns between attempts while no receive is posted */
#define SV_RNR_DELAY   1000000 /* ns per RNR retry when rnr_retry < 7 */
#define SV_IDLE_TICK   2000000 /* ns: port events and scheduled faults */
#define SV_REAP_PERIOD 200000000
#define SV_WAIT	       (-1)
#define SV_NEVER       INT64_MAX
#define SV_POST_RUN    65536	   /* bytes a posting thread executes itself, per call */
#define SV_ENG_BUDGET  (16u << 20) /* bytes of one QP before its engine looks at the others */
#define SV_ENG_SPIN    50000	   /* ns an engine that just worked polls before sleeping */

static int64_t sv_qp_run(struct sv_qp *qp, int64_t now, uint64_t max_len, uint64_t budget);
static struct sv_engine *sv_engine_get(int nic);
static void sv_engine_add(struct sv_qp *qp);
static void sv_engine_remove(struct sv_qp *qp);
static void sv_engine_hand(struct sv_qp *qp);

static struct sv_cq *to_cq(struct ibv_cq *cq)
{
	return sv_container_of(cq, struct sv_cq, cq);
}

static struct sv_qp *to_qp(struct ibv_qp *qp)
{
	return sv_container_of(qp, struct sv_qp, qp);
}

static int sv_ctx_nic(struct ibv_context *context)
{
	return sv_container_of(context, struct sv_ctx, vctx.context)->nic;
}

static uint32_t sv_next_gen(struct sv_fabric *f, unsigned bits)
{
	uint32_t g = atomic_fetch_add(&f->gen, 1) & ((1u << bits) - 1);

	return g ? g : 1;
}

/*
 * A free slot of a fabric table, under f->lock. The search starts where this
 * process last found one (slots are far apart in the region: a scan from 0
 * past a thousand used ones costs a page walk each), wraps, and gives n when
 * the table is full.
 */
static bool cq_slot_used(const struct sv_fabric *f, int i)
{
	return atomic_load(&f->cqs[i].id) != 0;
}

static bool qp_slot_used(const struct sv_fabric *f, int i)
{
	return atomic_load(&f->qps[i].qpn) != 0;
}

static int cq_hint, qp_hint;

static int sv_free_slot(int *hint, int n, bool (*used)(const struct sv_fabric *, int),
			const struct sv_fabric *f)
{
	for (int k = 0; k < n; k++) {
		int i = (*hint + k) % n;

		if (!used(f, i)) {
			*hint = (i + 1) % n;
			return i;
		}
	}
	return n;
}

/* ---- completion queues ---- */

SV_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
				       struct ibv_comp_channel *channel, int comp_vector)
{
	struct sv_fabric *f = sv_proc.f;
	struct sv_cq *cq;
	int i;

	if (cqe < 1 || cqe > SV_CQ_CAP) {
		errno = EINVAL;
		return NULL;
	}
	cq = calloc(1, sizeof(*cq));
	if (!cq) {
		errno = ENOMEM;
		return NULL;
	}
	sv_lock(&f->lock);
	i = sv_free_slot(&cq_hint, SV_MAX_CQS, cq_slot_used, f);
	if (i == SV_MAX_CQS) {
		pthread_mutex_unlock(&f->lock);
		free(cq);
		errno = ENOMEM;
		return NULL;
	}
	cq->s = &f->cqs[i];
	cq->slot = i;
	cq->s->pid = getpid();
	sv_mutex_init_shared(&cq->s->lock);
	atomic_store(&cq->s->head, 0);
	atomic_store(&cq->s->tail, 0);
	atomic_store(&cq->s->overruns, 0);
	cq->s->ch_fd = channel ? channel->fd : -1;
	atomic_store(&cq->s->armed, false);
	atomic_store(&cq->s->events, 0);
	atomic_store(&cq->s->id, sv_next_gen(f, 31));
	pthread_mutex_unlock(&f->lock);
	pthread_mutex_init(&cq->poll_lock, NULL);
	cq->cq.context = context;
	cq->cq.channel = channel;
	cq->cq.cq_context = cq_context;
	cq->cq.cqe = cqe;
	cq->cq.handle = (uint32_t)i;
	pthread_mutex_init(&cq->cq.mutex, NULL);
	pthread_cond_init(&cq->cq.cond, NULL);
	if (channel) {
		channel->refcnt++;
		pthread_mutex_lock(&sv_proc.lock);
		cq->next = sv_proc.cqs;
		sv_proc.cqs = cq;
		pthread_mutex_unlock(&sv_proc.lock);
	}
	return &cq->cq;
}

SV_EXPORT int ibv_destroy_cq(struct ibv_cq *ibcq)
{
	struct sv_cq *cq = to_cq(ibcq);

	if (atomic_load(&cq->users))
		return EBUSY;
	if (ibcq->channel) {
		struct sv_cq **pp;

		pthread_mutex_lock(&sv_proc.lock);
		for (pp = &sv_proc.cqs; *pp && *pp != cq; pp = &(*pp)->next)
			;
		if (*pp)
			*pp = cq->next;
		pthread_mutex_unlock(&sv_proc.lock);
		ibcq->channel->refcnt--;
	}
	atomic_store(&cq->s->id, 0);
	pthread_mutex_destroy(&cq->poll_lock);
	free(cq);
	return 0;
}

/*
 * Completion events. The channel is an eventfd in semaphore mode: one count per
 * event. The process that places the first completion after req_notify_cq (the
 * owner's engine, or another process executing a SEND to it) disarms the CQ, counts
 * an event on it and adds 1 to the channel, which it holds a duplicate of, taken
 * once from the owner with pidfd_getfd (the permission process_vm_writev already
 * needs) and kept per CQ slot. So the owner's thread wakes when the completion is
 * there, as with a NIC's interrupt, and the eventfd can be poll()ed like rdma-core's
 * channel fd. Every completion counts as solicited.
 */
static struct {
	pthread_mutex_t lock;		  /* fetching */
	_Atomic bool warned;		  /* once per process */
	_Atomic uint64_t key[SV_MAX_CQS]; /* the CQ id and fd below, as id << 32 | fd */
} sv_chfds = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* This process's descriptor for the channel of CQ slot `slot` (id `id`); -1 if none. */
static int sv_channel_fd(struct sv_cq_slot *s, int slot, uint32_t id)
{
	uint64_t key = atomic_load(&sv_chfds.key[slot]);
	int pidfd, fd;

	if (s->pid == getpid())
		return s->ch_fd;
	if (key >> 32 == id)
		return (int)(uint32_t)key;
	pthread_mutex_lock(&sv_chfds.lock);
	key = atomic_load(&sv_chfds.key[slot]);
	if (key >> 32 == id) {
		fd = (int)(uint32_t)key;
		goto out;
	}
	if (key)
		close((int)(uint32_t)key);
	atomic_store(&sv_chfds.key[slot], 0);
	fd = -1;
	pidfd = (int)syscall(SYS_pidfd_open, s->pid, 0);
	if (pidfd >= 0) {
		fd = (int)syscall(SYS_pidfd_getfd, pidfd, s->ch_fd, 0);
		close(pidfd);
	}
	/*
	 * The CQ (so its channel, which cannot be destroyed before it) was still there
	 * after the descriptor was taken: it is the channel's, not a reused number.
	 */
	if (fd >= 0 && atomic_load(&s->id) != id) {
		close(fd);
		fd = -1;
	}
	if (fd < 0 && !atomic_exchange(&sv_chfds.warned, true))
		fprintf(stderr,
			"softverbs: cannot reach the completion channel of pid %d: %s (its "
			"events are lost; run as root)\n",
			s->pid, strerror(errno));
	else
		atomic_store(&sv_chfds.key[slot], (uint64_t)id << 32 | (uint32_t)fd);
out:
	pthread_mutex_unlock(&sv_chfds.lock);
	return fd;
}

static void sv_cq_fire(struct sv_cq_slot *s, int slot, uint32_t id)
{
	uint64_t one = 1;
	int fd;

	atomic_fetch_add(&s->events, 1);
	fd = sv_channel_fd(s, slot, id);
	if (fd >= 0 && write(fd, &one, sizeof(one)) != sizeof(one))
		fprintf(stderr, "softverbs: completion event lost: %s\n", strerror(errno));
}

bool sv_cq_push(struct sv_fabric *f, int slot, uint32_t id, const struct ibv_wc *wc)
{
	struct sv_cq_slot *s = &f->cqs[slot];
	uint64_t tail;
	bool ok = false;

	sv_lock(&s->lock);
	if (atomic_load(&s->id) != id)
		goto out;
	tail = atomic_load_explicit(&s->tail, memory_order_relaxed);
	if (tail - atomic_load(&s->head) >= SV_CQ_CAP) {
		if (atomic_fetch_add(&s->overruns, 1) == 0)
			fprintf(stderr, "softverbs: CQ %d overrun, completions lost\n", slot);
		goto out;
	}
	s->ring[tail % SV_CQ_CAP] = *wc;
	atomic_store_explicit(&s->tail, tail + 1, memory_order_release);
	ok = true;
out:
	pthread_mutex_unlock(&s->lock);
	/* Pairs with req_notify_cq's fence: either it sees this completion or this sees it armed.
	 */
	atomic_thread_fence(memory_order_seq_cst);
	if (ok && atomic_load_explicit(&s->armed, memory_order_relaxed) &&
	    atomic_exchange(&s->armed, false))
		sv_cq_fire(s, slot, id);
	return ok;
}

int sv_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
	struct sv_cq *cq = to_cq(ibcq);
	struct sv_cq_slot *s = cq->s;
	uint64_t head, tail;
	int k = 0;

	if (atomic_load_explicit(&s->head, memory_order_relaxed) ==
	    atomic_load_explicit(&s->tail, memory_order_acquire))
		return 0;
	pthread_mutex_lock(&cq->poll_lock);
	head = atomic_load_explicit(&s->head, memory_order_relaxed);
	tail = atomic_load_explicit(&s->tail, memory_order_acquire);
	for (; k < n && head != tail; k++, head++)
		wc[k] = s->ring[head % SV_CQ_CAP];
	atomic_store_explicit(&s->head, head, memory_order_release);
	pthread_mutex_unlock(&cq->poll_lock);
	return k;
}

/* Entries beyond what is queued now, up to the ring's fixed size. */
SV_EXPORT int ibv_resize_cq(struct ibv_cq *ibcq, int cqe)
{
	struct sv_cq_slot *s = to_cq(ibcq)->s;

	if (cqe < 1 || cqe > SV_CQ_CAP ||
	    (uint64_t)cqe < atomic_load(&s->tail) - atomic_load(&s->head))
		return EINVAL;
	pthread_mutex_lock(&ibcq->mutex);
	ibcq->cqe = cqe;
	pthread_mutex_unlock(&ibcq->mutex);
	return 0;
}

SV_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	struct ibv_comp_channel *ch = calloc(1, sizeof(*ch));

	if (!ch) {
		errno = ENOMEM;
		return NULL;
	}
	ch->fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
	if (ch->fd < 0) {
		int err = errno;

		free(ch);
		errno = err;
		return NULL;
	}
	ch->context = context;
	return ch;
}

SV_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	if (channel->refcnt)
		return EBUSY;
	close(channel->fd);
	free(channel);
	return 0;
}

int sv_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	struct sv_cq *cq = to_cq(ibcq);

	if (!ibcq->channel)
		return EINVAL;
	atomic_store(&cq->s->armed, true);
	/* Completions placed before this count as before arming: the caller polls again. */
	atomic_thread_fence(memory_order_seq_cst);
	return 0;
}

/* Takes one event of one of the channel's CQs; NULL if none is counted. */
static struct sv_cq *sv_channel_take(struct ibv_comp_channel *channel)
{
	struct sv_cq *found = NULL;

	pthread_mutex_lock(&sv_proc.lock);
	for (struct sv_cq *cq = sv_proc.cqs; cq && !found; cq = cq->next) {
		uint32_t n = atomic_load(&cq->s->events);

		while (cq->cq.channel == channel && n &&
		       !atomic_compare_exchange_weak(&cq->s->events, &n, n - 1))
			;
		if (cq->cq.channel == channel && n)
			found = cq;
	}
	pthread_mutex_unlock(&sv_proc.lock);
	return found;
}

SV_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq,
			       void **cq_context)
{
	struct sv_cq *found;
	uint64_t v;
	ssize_t n;

	/* A count without a CQ belonged to a CQ destroyed with its event unread. */
	do {
		do
			n = read(channel->fd, &v, sizeof(v));
		while (n < 0 && errno == EINTR);
		if (n != sizeof(v))
			return -1; /* errno from read (EAGAIN on a non-blocking fd), as rdma-core */
		found = sv_channel_take(channel);
	} while (!found);
	*cq = &found->cq;
	*cq_context = found->cq.cq_context;
	return 0;
}

SV_EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += nevents;
	pthread_mutex_unlock(&cq->mutex);
}

/* ---- queue pairs: create, modify, query, destroy ---- */

static void sv_qpx_init(struct sv_qp *qp);

/* Creates an RC QP; `init` is updated with the capacities it got, as rdma-core does. */
static struct ibv_qp *sv_qp_create(struct ibv_pd *pd, struct ibv_qp_init_attr *init, bool qpx)
{
	struct sv_pd *spd = sv_container_of(pd, struct sv_pd, pd);
	struct sv_srq *srq = init->srq ? sv_container_of(init->srq, struct sv_srq, srq) : NULL;
	struct sv_fabric *f = sv_proc.f;
	struct ibv_qp_cap *cap = &init->cap;
	struct sv_qp *qp;
	struct sv_qp_slot *s;
	uint32_t nsq, nsge;
	int i, err = EINVAL;

	if (init->qp_type != IBV_QPT_RC) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (!init->send_cq || !init->recv_cq || cap->max_send_wr > SV_MAX_SEND_WR ||
	    (!srq && (cap->max_recv_wr > SV_RQ_CAP || cap->max_recv_sge > SV_RQ_SGE)) ||
	    cap->max_send_sge > SV_MAX_SEND_SGE || cap->max_inline_data > SV_MAX_INLINE) {
		errno = EINVAL;
		return NULL;
	}
	qp = calloc(1, sizeof(*qp));
	if (!qp) {
		errno = ENOMEM;
		return NULL;
	}
	nsq = cap->max_send_wr ? cap->max_send_wr : 1;
	nsge = cap->max_send_sge ? cap->max_send_sge : 1;
	qp->sq = calloc(nsq, sizeof(*qp->sq));
	qp->sge_pool = calloc((size_t)nsq * nsge, sizeof(*qp->sge_pool));
	qp->inl_pool = cap->max_inline_data ? malloc((size_t)nsq * cap->max_inline_data) : NULL;
	if (!qp->sq || !qp->sge_pool || (cap->max_inline_data && !qp->inl_pool)) {
		err = ENOMEM;
		goto err_free;
	}
	for (uint32_t k = 0; k < nsq; k++) {
		qp->sq[k].sge = &qp->sge_pool[(size_t)k * nsge];
		qp->sq[k].inl =
		    qp->inl_pool ? &qp->inl_pool[(size_t)k * cap->max_inline_data] : NULL;
	}
	cap->max_send_wr = nsq;
	cap->max_send_sge = nsge;
	if (srq) {
		cap->max_recv_wr = 0;
		cap->max_recv_sge = 0;
	} else {
		cap->max_recv_wr = cap->max_recv_wr ? cap->max_recv_wr : 1;
	}
	qp->cap = *cap;
	qp->sig_all = init->sq_sig_all;
	pthread_mutex_init(&qp->lock, NULL);
	pthread_mutex_init(&qp->post_lock, NULL);
	qp->eng_wake = SV_NEVER;

	sv_lock(&f->lock);
	i = sv_free_slot(&qp_hint, SV_MAX_QPS, qp_slot_used, f);
	if (i == SV_MAX_QPS) {
		pthread_mutex_unlock(&f->lock);
		err = ENOMEM;
		goto err_free;
	}
	s = &f->qps[i];
	s->pid = getpid();
	s->nic = sv_ctx_nic(pd->context);
	s->pd = spd->id;
	atomic_store(&s->state, IBV_QPS_RESET);
	atomic_store(&s->access, 0);
	atomic_store(&s->dest_qpn, 0);
	atomic_store(&s->dlid, 0);
	memset(&s->grh, 0, sizeof(s->grh));
	atomic_store(&s->grh_peer, -1);
	s->rcq = to_cq(init->recv_cq)->slot;
	s->rcq_id = atomic_load(&to_cq(init->recv_cq)->s->id);
	s->srq = srq ? srq->slot : -1;
	s->srq_id = srq ? atomic_load(&srq->s->id) : 0;
	s->rq_size = cap->max_recv_wr;
	sv_mutex_init_shared(&s->rq_lock);
	s->rq_head = s->rq_tail = 0;
	atomic_store(&s->qpn, (sv_next_gen(f, 24 - SV_QP_SHIFT) << SV_QP_SHIFT) | (uint32_t)i);
	pthread_mutex_unlock(&f->lock);

	qp->slot = i;
	qp->s = s;
	qp->attr.qp_state = IBV_QPS_RESET;
	qp->qp.context = pd->context;
	qp->qp.qp_context = init->qp_context;
	qp->qp.pd = pd;
	qp->qp.send_cq = init->send_cq;
	qp->qp.recv_cq = init->recv_cq;
	qp->qp.srq = init->srq;
	qp->qp.qp_num = atomic_load(&s->qpn);
	qp->qp.handle = qp->qp.qp_num;
	qp->qp.state = IBV_QPS_RESET;
	qp->qp.qp_type = IBV_QPT_RC;
	pthread_mutex_init(&qp->qp.mutex, NULL);
	pthread_cond_init(&qp->qp.cond, NULL);
	if (qpx)
		sv_qpx_init(qp);
	atomic_fetch_add(&to_cq(init->send_cq)->users, 1);
	atomic_fetch_add(&to_cq(init->recv_cq)->users, 1);
	atomic_fetch_add(&spd->users, 1);
	if (srq)
		atomic_fetch_add(&srq->users, 1);

	/* qp->eng before the QP is on the list: the progress thread reads it there. */
	if (sv_proc.cfg.engines)
		qp->eng = sv_engine_get(s->nic);
	pthread_mutex_lock(&sv_proc.lock);
	qp->next = sv_proc.qps;
	sv_proc.qps = qp;
	pthread_mutex_unlock(&sv_proc.lock);
	if (qp->eng)
		sv_engine_add(qp);
	return &qp->qp;

err_free:
	free(qp->inl_pool);
	free(qp->sge_pool);
	free(qp->sq);
	free(qp);
	errno = err;
	return NULL;
}

SV_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *init)
{
	return sv_qp_create(pd, init, false);
}

/* The opcodes of the extended send API the device executes (as ibv_post_send's). */
#define SV_QPX_OPS                                                                                 \
	(IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |    \
	 IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ)

/* context->create_qp_ex: an RC QP, with the ibv_wr_* API when send_ops_flags are given. */
struct ibv_qp *sv_create_qp_ex(struct ibv_context *context, struct ibv_qp_init_attr_ex *init)
{
	uint32_t mask = init->comp_mask;
	struct ibv_qp *qp;

	if (!(mask & IBV_QP_INIT_ATTR_PD) || !init->pd) {
		errno = EINVAL;
		return NULL;
	}
	if ((mask & ~(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS |
		      IBV_QP_INIT_ATTR_CREATE_FLAGS)) ||
	    ((mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && init->create_flags) ||
	    ((mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) && (init->send_ops_flags & ~SV_QPX_OPS))) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	/* The basic attributes are the first members of the extended ones, as rdma-core uses. */
	qp = sv_qp_create(init->pd, (struct ibv_qp_init_attr *)init,
			  mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS);
	return qp;
}

SV_EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *ibqp)
{
	struct sv_qp *qp = to_qp(ibqp);

	if (!qp->has_qpx) {
		errno = EOPNOTSUPP; /* created without send_ops_flags */
		return NULL;
	}
	return &qp->qpx;
}

/* Attributes each transition requires and allows (IB spec, as the kernel checks them). */
static const struct {
	enum ibv_qp_state cur, next;
	int req, opt;
} sv_trans[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_INIT, IBV_QPS_RTR,
     IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
	 IBV_QP_MIN_RNR_TIMER,
     IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
    {IBV_QPS_RTR, IBV_QPS_RTS,
     IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
     IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
	 IBV_QP_PATH_MIG_STATE},
    {IBV_QPS_RTS, IBV_QPS_RTS, 0,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
	 IBV_QP_MIN_RNR_TIMER},
};

static bool sv_modify_ok(enum ibv_qp_state cur, enum ibv_qp_state next, int mask)
{
	int req = 0, opt = 0;
	bool found = false;

	if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) {
		found = true;
	} else {
		for (size_t i = 0; i < sizeof(sv_trans) / sizeof(sv_trans[0]); i++)
			if (sv_trans[i].cur == cur && sv_trans[i].next == next) {
				req = sv_trans[i].req;
				opt = sv_trans[i].opt;
				found = true;
			}
	}
	return found && (mask & req) == req && (mask & ~(req | opt | IBV_QP_STATE)) == 0;
}

static void sv_wc_fill(struct ibv_wc *wc, uint64_t wr_id, int status, int opcode, uint32_t len,
		       uint32_t qpn)
{
	memset(wc, 0, sizeof(*wc));
	wc->wr_id = wr_id;
	wc->status = status;
	wc->opcode = opcode;
	wc->byte_len = len;
	wc->qp_num = qpn;
}

static int sv_wc_opcode(int wr_opcode)
{
	switch (wr_opcode) {
	case IBV_WR_RDMA_READ:
		return IBV_WC_RDMA_READ;
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_IMM:
		return IBV_WC_SEND;
	default:
		return IBV_WC_RDMA_WRITE;
	}
}

/*
 * Under qp->lock: frees the send queue slot at `head`, then completes its request
 * when it is signalled or failed. The slot is free before the completion can be
 * polled, as on a NIC: a program that posts as soon as it polled one never finds the
 * queue full, and the unsignalled requests before it are free too.
 */
static void sv_sq_retire(struct sv_qp *qp, uint32_t head, int status)
{
	struct sv_swr *w = &qp->sq[head % qp->cap.max_send_wr];
	struct sv_cq *cq = to_cq(qp->qp.send_cq);
	bool signal = status != IBV_WC_SUCCESS || (w->flags & IBV_SEND_SIGNALED) || qp->sig_all;
	struct ibv_wc wc;

	sv_wc_fill(&wc, w->wr_id, status, sv_wc_opcode(w->opcode), (uint32_t)w->len, qp->qp.qp_num);
	atomic_store_explicit(&qp->sq_head, head + 1, memory_order_release);
	if (signal)
		sv_cq_push(sv_proc.f, cq->slot, atomic_load(&cq->s->id), &wc);
}

/* Flushes the receive queue of a QP in ERR (may run in any thread). */
static void sv_rq_flush(struct sv_qp *qp)
{
	struct sv_qp_slot *s = qp->s;
	struct ibv_wc wc;

	sv_lock(&s->rq_lock);
	for (; s->rq_head != s->rq_tail; s->rq_head++) {
		sv_wc_fill(&wc, s->rq[s->rq_head % SV_RQ_CAP].wr_id, IBV_WC_WR_FLUSH_ERR,
			   IBV_WC_RECV, 0, qp->qp.qp_num);
		sv_cq_push(sv_proc.f, s->rcq, s->rcq_id, &wc);
	}
	pthread_mutex_unlock(&s->rq_lock);
}

/* Under qp->lock: completes everything queued with a flush error. */
static void sv_qp_flush(struct sv_qp *qp)
{
	uint32_t head = atomic_load_explicit(&qp->sq_head, memory_order_relaxed);

	for (; head != atomic_load_explicit(&qp->sq_tail, memory_order_acquire); head++)
		sv_sq_retire(qp, head, IBV_WC_WR_FLUSH_ERR);
	sv_rq_flush(qp);
}

static void sv_qp_set_state(struct sv_qp *qp, enum ibv_qp_state st)
{
	qp->attr.qp_state = st;
	qp->qp.state = st;
	atomic_store(&qp->s->state, st);
}

SV_EXPORT int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask)
{
	struct sv_qp *qp = to_qp(ibqp);
	enum ibv_qp_state cur, next;
	int rc = EINVAL;

	pthread_mutex_lock(&qp->lock);
	cur = qp->attr.qp_state;
	next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
	if ((mask & IBV_QP_CUR_STATE) && attr->cur_qp_state != cur)
		goto out;
	if (!sv_modify_ok(cur, next, mask))
		goto out;
	if (((mask & IBV_QP_PORT) && attr->port_num != 1) ||
	    ((mask & IBV_QP_PATH_MTU) &&
	     (attr->path_mtu < IBV_MTU_256 || attr->path_mtu > IBV_MTU_4096)) ||
	    ((mask & IBV_QP_TIMEOUT) && attr->timeout > 31) ||
	    ((mask & IBV_QP_RETRY_CNT) && attr->retry_cnt > 7) ||
	    ((mask & IBV_QP_RNR_RETRY) && attr->rnr_retry > 7) ||
	    ((mask & IBV_QP_MIN_RNR_TIMER) && attr->min_rnr_timer > 31) ||
	    ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr->max_rd_atomic > 16) ||
	    ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr->max_dest_rd_atomic > 16) ||
	    ((mask & IBV_QP_AV) && attr->ah_attr.port_num > 1))
		goto out;
	/* A RoCE port needs a GRH from a GID of its own (EINVAL, ENODATA for an empty one). */
	if ((mask & IBV_QP_AV) && sv_proc.f->net.link == SV_LL_ROCE) {
		rc = sv_roce_check_av(sv_proc.f, qp->s->nic, &attr->ah_attr);
		if (rc)
			goto out;
	}
	if (mask & IBV_QP_ACCESS_FLAGS) {
		qp->attr.qp_access_flags = attr->qp_access_flags;
		atomic_store(&qp->s->access, attr->qp_access_flags);
	}
	if (mask & IBV_QP_PKEY_INDEX)
		qp->attr.pkey_index = attr->pkey_index;
	if (mask & IBV_QP_PORT)
		qp->attr.port_num = attr->port_num;
	if (mask & IBV_QP_AV) {
		qp->attr.ah_attr = attr->ah_attr;
		atomic_store(&qp->s->dlid, attr->ah_attr.dlid);
		/* Where the GRH leads is resolved now, as the kernel resolves the MAC here. */
		qp->s->grh = attr->ah_attr.grh;
		atomic_store(&qp->s->grh_peer, sv_roce_route(sv_proc.f, qp->s->nic, &qp->s->grh));
	}
	if (mask & IBV_QP_PATH_MTU)
		qp->attr.path_mtu = attr->path_mtu;
	if (mask & IBV_QP_DEST_QPN) {
		qp->attr.dest_qp_num = attr->dest_qp_num;
		atomic_store(&qp->s->dest_qpn, attr->dest_qp_num);
	}
	if (mask & IBV_QP_RQ_PSN)
		qp->attr.rq_psn = attr->rq_psn;
	if (mask & IBV_QP_SQ_PSN)
		qp->attr.sq_psn = attr->sq_psn;
	if (mask & IBV_QP_MAX_DEST_RD_ATOMIC)
		qp->attr.max_dest_rd_atomic = attr->max_dest_rd_atomic;
	if (mask & IBV_QP_MAX_QP_RD_ATOMIC)
		qp->attr.max_rd_atomic = attr->max_rd_atomic;
	if (mask & IBV_QP_MIN_RNR_TIMER)
		qp->attr.min_rnr_timer = attr->min_rnr_timer;
	if (mask & IBV_QP_TIMEOUT)
		qp->attr.timeout = attr->timeout;
	if (mask & IBV_QP_RETRY_CNT)
		qp->attr.retry_cnt = attr->retry_cnt;
	if (mask & IBV_QP_RNR_RETRY)
		qp->attr.rnr_retry = attr->rnr_retry;
	if (mask & IBV_QP_STATE) {
		if (next == IBV_QPS_RESET) {
			atomic_store(&qp->sq_head, atomic_load(&qp->sq_tail));
			sv_lock(&qp->s->rq_lock);
			qp->s->rq_head = qp->s->rq_tail;
			pthread_mutex_unlock(&qp->s->rq_lock);
		}
		sv_qp_set_state(qp, next);
		if (next == IBV_QPS_ERR)
			sv_qp_flush(qp);
	}
	rc = 0;
out:
	pthread_mutex_unlock(&qp->lock);
	return rc;
}

SV_EXPORT int ibv_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask,
			   struct ibv_qp_init_attr *init)
{
	struct sv_qp *qp = to_qp(ibqp);

	pthread_mutex_lock(&qp->lock);
	*attr = qp->attr;
	attr->cur_qp_state = qp->attr.qp_state;
	attr->cap = qp->cap;
	attr->sq_draining = 0;
	pthread_mutex_unlock(&qp->lock);
	memset(init, 0, sizeof(*init));
	init->qp_context = ibqp->qp_context;
	init->send_cq = ibqp->send_cq;
	init->recv_cq = ibqp->recv_cq;
	init->srq = ibqp->srq;
	init->cap = qp->cap;
	init->qp_type = IBV_QPT_RC;
	init->sq_sig_all = qp->sig_all;
	return 0;
}

SV_EXPORT int ibv_destroy_qp(struct ibv_qp *ibqp)
{
	struct sv_qp *qp = to_qp(ibqp);
	struct sv_qp **pp;

	pthread_mutex_lock(&sv_proc.lock);
	for (pp = &sv_proc.qps; *pp && *pp != qp; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = qp->next;
	pthread_mutex_unlock(&sv_proc.lock);
	if (qp->eng)
		sv_engine_remove(qp);
	pthread_mutex_lock(&qp->lock);
	atomic_store(&qp->s->state, IBV_QPS_ERR);
	atomic_store(&qp->s->qpn, 0);
	pthread_mutex_unlock(&qp->lock);
	atomic_fetch_sub(&to_cq(ibqp->send_cq)->users, 1);
	atomic_fetch_sub(&to_cq(ibqp->recv_cq)->users, 1);
	atomic_fetch_sub(&sv_container_of(ibqp->pd, struct sv_pd, pd)->users, 1);
	if (ibqp->srq)
		atomic_fetch_sub(&sv_container_of(ibqp->srq, struct sv_srq, srq)->users, 1);
	pthread_mutex_destroy(&qp->lock);
	pthread_mutex_destroy(&qp->post_lock);
	free(qp->inl_pool);
	free(qp->sge_pool);
	free(qp->sq);
	free(qp);
	return 0;
}

/* ---- posting ---- */

int sv_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct sv_qp *qp = to_qp(ibqp);
	struct sv_qp_slot *s = qp->s;
	int rc = 0;

	/* A QP on an SRQ has no receive queue of its own. */
	if (atomic_load(&s->state) == IBV_QPS_RESET || ibqp->srq) {
		*bad_wr = wr;
		return EINVAL;
	}
	sv_lock(&s->rq_lock);
	for (; wr; wr = wr->next) {
		struct sv_rwqe *e;

		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->cap.max_recv_sge) {
			rc = EINVAL;
			break;
		}
		if (s->rq_tail - s->rq_head >= s->rq_size) {
			rc = ENOMEM;
			break;
		}
		e = &s->rq[s->rq_tail % SV_RQ_CAP];
		e->wr_id = wr->wr_id;
		e->num_sge = (uint32_t)wr->num_sge;
		if (wr->num_sge)
			memcpy(e->sge, wr->sg_list, sizeof(struct ibv_sge) * (size_t)wr->num_sge);
		s->rq_tail++;
	}
	pthread_mutex_unlock(&s->rq_lock);
	if (rc)
		*bad_wr = wr;
	if (atomic_load(&s->state) == IBV_QPS_ERR)
		sv_rq_flush(qp);
	return rc;
}

/*
 * Under post_lock, for a request about to be published: a shaped request takes its
 * turn on the wire when posted, as a NIC queues it, so the rate does not depend on how
 * soon this process runs.
 */
static void sv_swr_queue(struct sv_qp *qp, struct sv_swr *w, int st, int rate)
{
	w->first_ns = 0;
	w->wire_ns = rate && w->len && st == IBV_QPS_RTS
			 ? sv_nic_reserve(sv_proc.f, qp->s->nic,
					  w->opcode == IBV_WR_RDMA_READ ? SV_RX : SV_TX, rate,
					  w->len, sv_now_ns())
			 : 0;
	w->start_ns = w->wire_ns ? w->wire_ns - sv_wire_time(w->len, rate) : 0;
	w->far_ns = 0;
}

/* After publishing: small requests go at once unless the engine is running this QP. */
static void sv_sq_kick(struct sv_qp *qp)
{
	int64_t wake = 0;

	if (qp->eng) {
		if (pthread_mutex_trylock(&qp->lock) == 0) {
			wake = sv_qp_run(qp, sv_now_ns(), SV_POST_RUN, SV_POST_RUN);
			pthread_mutex_unlock(&qp->lock);
		}
		if (wake != SV_NEVER)
			sv_engine_hand(qp);
		return;
	}
	pthread_mutex_lock(&qp->lock);
	wake = sv_qp_run(qp, sv_now_ns(), UINT64_MAX, UINT64_MAX);
	pthread_mutex_unlock(&qp->lock);
	if (wake != SV_NEVER)
		sv_kick();
}

static bool sv_opcode_ok(int opcode)
{
	return opcode == IBV_WR_RDMA_WRITE || opcode == IBV_WR_RDMA_WRITE_WITH_IMM ||
	       opcode == IBV_WR_SEND || opcode == IBV_WR_SEND_WITH_IMM ||
	       opcode == IBV_WR_RDMA_READ;
}

int sv_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	struct sv_qp *qp = to_qp(ibqp);
	int st = atomic_load(&qp->s->state);
	uint32_t tail;
	int rc = 0, rate;

	if (st != IBV_QPS_RTS && st != IBV_QPS_ERR) {
		*bad_wr = wr;
		return EINVAL;
	}
	pthread_mutex_lock(&qp->post_lock);
	tail = atomic_load_explicit(&qp->sq_tail, memory_order_relaxed);
	rate = sv_nic_rate(sv_proc.f, qp->s->nic, sv_proc.cfg.shaping);
	for (; wr; wr = wr->next) {
		struct sv_swr *w;
		uint64_t len = 0;

		if (!sv_opcode_ok(wr->opcode)) {
			rc = EINVAL;
			break;
		}
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->cap.max_send_sge) {
			rc = EINVAL;
			break;
		}
		for (int i = 0; i < wr->num_sge; i++)
			len += wr->sg_list[i].length;
		if (len > (1ull << 31) ||
		    ((wr->send_flags & IBV_SEND_INLINE) &&
		     (wr->opcode == IBV_WR_RDMA_READ || len > qp->cap.max_inline_data))) {
			rc = EINVAL;
			break;
		}
		if (tail - atomic_load_explicit(&qp->sq_head, memory_order_acquire) >=
		    qp->cap.max_send_wr) {
			rc = ENOMEM;
			break;
		}
		w = &qp->sq[tail % qp->cap.max_send_wr];
		w->wr_id = wr->wr_id;
		w->opcode = wr->opcode;
		w->flags = wr->send_flags;
		w->imm = wr->imm_data;
		w->raddr = wr->wr.rdma.remote_addr;
		w->rkey = wr->wr.rdma.rkey;
		w->nsge = (uint32_t)wr->num_sge;
		w->len = len;
		sv_swr_queue(qp, w, st, rate);
		if (wr->send_flags & IBV_SEND_INLINE) {
			uint8_t *p = w->inl;

			for (int i = 0; i < wr->num_sge; i++) {
				memcpy(p, (void *)(uintptr_t)wr->sg_list[i].addr,
				       wr->sg_list[i].length);
				p += wr->sg_list[i].length;
			}
		} else {
			if (wr->num_sge)
				memcpy(w->sge, wr->sg_list,
				       sizeof(struct ibv_sge) * (size_t)wr->num_sge);
		}
		atomic_store_explicit(&qp->sq_tail, ++tail, memory_order_release);
	}
	pthread_mutex_unlock(&qp->post_lock);
	if (rc)
		*bad_wr = wr;
	sv_sq_kick(qp);
	return rc;
}

/*
 * ---- the extended send API (ibv_wr_*) ----
 *
 * As on mlx5, ibv_wr_start takes the send queue, each opcode call fills the next
 * slot (with the ibv_qp_ex's wr_id and wr_flags of that moment) and the ibv_wr_set_*
 * calls complete it; ibv_wr_complete publishes them all, or none when any call
 * failed (its error is the answer), and ibv_wr_abort drops them.
 */
static struct sv_qp *qpx_to_qp(struct ibv_qp_ex *qpx)
{
	return sv_container_of(qpx, struct sv_qp, qpx);
}

static void sv_wr_fail(struct sv_qp *qp, int err)
{
	if (!qp->wr_err)
		qp->wr_err = err;
	qp->wr_cur = NULL;
}

static void sv_wr_start(struct ibv_qp_ex *qpx)
{
	struct sv_qp *qp = qpx_to_qp(qpx);

	pthread_mutex_lock(&qp->post_lock);
	qp->wr_tail = atomic_load_explicit(&qp->sq_tail, memory_order_relaxed);
	qp->wr_err = 0;
	qp->wr_cur = NULL;
}

static void sv_wr_new(struct ibv_qp_ex *qpx, int opcode, uint32_t rkey, uint64_t raddr, __be32 imm)
{
	struct sv_qp *qp = qpx_to_qp(qpx);
	struct sv_swr *w;

	if (qp->wr_err)
		return;
	if (qp->wr_tail - atomic_load_explicit(&qp->sq_head, memory_order_acquire) >=
	    qp->cap.max_send_wr) {
		sv_wr_fail(qp, ENOMEM);
		return;
	}
	w = &qp->sq[qp->wr_tail++ % qp->cap.max_send_wr];
	w->wr_id = qpx->wr_id;
	w->opcode = opcode;
	w->flags = qpx->wr_flags & ~IBV_SEND_INLINE; /* inline is ibv_wr_set_inline_data's */
	w->imm = imm;
	w->raddr = raddr;
	w->rkey = rkey;
	w->nsge = 0;
	w->len = 0;
	qp->wr_cur = w;
}

static void sv_wr_rdma_write(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t raddr)
{
	sv_wr_new(qpx, IBV_WR_RDMA_WRITE, rkey, raddr, 0);
}

static void sv_wr_rdma_write_imm(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t raddr, __be32 imm)
{
	sv_wr_new(qpx, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, raddr, imm);
}

static void sv_wr_rdma_read(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t raddr)
{
	sv_wr_new(qpx, IBV_WR_RDMA_READ, rkey, raddr, 0);
}

static void sv_wr_send(struct ibv_qp_ex *qpx)
{
	sv_wr_new(qpx, IBV_WR_SEND, 0, 0, 0);
}

static void sv_wr_send_imm(struct ibv_qp_ex *qpx, __be32 imm)
{
	sv_wr_new(qpx, IBV_WR_SEND_WITH_IMM, 0, 0, imm);
}

static void sv_wr_set_sge_list(struct ibv_qp_ex *qpx, size_t n, const struct ibv_sge *sg)
{
	struct sv_qp *qp = qpx_to_qp(qpx);
	struct sv_swr *w = qp->wr_cur;
	uint64_t len = 0;

	if (!w || n > qp->cap.max_send_sge) {
		sv_wr_fail(qp, EINVAL);
		return;
	}
	for (size_t i = 0; i < n; i++)
		len += sg[i].length;
	if (len > (1ull << 31)) {
		sv_wr_fail(qp, EINVAL);
		return;
	}
	if (n)
		memcpy(w->sge, sg, n * sizeof(*sg));
	w->nsge = (uint32_t)n;
	w->len = len;
	w->flags &= ~IBV_SEND_INLINE;
}

static void sv_wr_set_sge(struct ibv_qp_ex *qpx, uint32_t lkey, uint64_t addr, uint32_t length)
{
	struct ibv_sge sge = {.addr = addr, .length = length, .lkey = lkey};

	sv_wr_set_sge_list(qpx, 1, &sge);
}

static void sv_wr_set_inline_data_list(struct ibv_qp_ex *qpx, size_t n,
				       const struct ibv_data_buf *buf)
{
	struct sv_qp *qp = qpx_to_qp(qpx);
	struct sv_swr *w = qp->wr_cur;
	uint64_t len = 0;

	if (!w || w->opcode == IBV_WR_RDMA_READ) {
		sv_wr_fail(qp, EINVAL);
		return;
	}
	for (size_t i = 0; i < n; i++)
		len += buf[i].length;
	if (len > qp->cap.max_inline_data) {
		sv_wr_fail(qp, ENOMEM); /* what mlx5 answers for too much inline data */
		return;
	}
	len = 0;
	for (size_t i = 0; i < n; i++) {
		memcpy(w->inl + len, buf[i].addr, buf[i].length);
		len += buf[i].length;
	}
	w->nsge = 0;
	w->len = len;
	w->flags |= IBV_SEND_INLINE;
}

static void sv_wr_set_inline_data(struct ibv_qp_ex *qpx, void *addr, size_t length)
{
	struct ibv_data_buf buf = {.addr = addr, .length = length};

	sv_wr_set_inline_data_list(qpx, 1, &buf);
}

static int sv_wr_complete(struct ibv_qp_ex *qpx)
{
	struct sv_qp *qp = qpx_to_qp(qpx);
	int st = atomic_load(&qp->s->state), rc = qp->wr_err, rate;

	if (!rc && st != IBV_QPS_RTS && st != IBV_QPS_ERR)
		rc = EINVAL;
	if (!rc) {
		rate = sv_nic_rate(sv_proc.f, qp->s->nic, sv_proc.cfg.shaping);
		for (uint32_t t = atomic_load_explicit(&qp->sq_tail, memory_order_relaxed);
		     t != qp->wr_tail; t++)
			sv_swr_queue(qp, &qp->sq[t % qp->cap.max_send_wr], st, rate);
		atomic_store_explicit(&qp->sq_tail, qp->wr_tail, memory_order_release);
	}
	qp->wr_cur = NULL;
	pthread_mutex_unlock(&qp->post_lock);
	if (!rc)
		sv_sq_kick(qp);
	return rc;
}

static void sv_wr_abort(struct ibv_qp_ex *qpx)
{
	struct sv_qp *qp = qpx_to_qp(qpx);

	qp->wr_cur = NULL;
	pthread_mutex_unlock(&qp->post_lock);
}

/*
 * The builders of the opcodes the device executes; the others (atomics, memory
 * windows, invalidation, TSO, UD and XRC addressing) stay NULL, as their
 * send_ops_flags are refused at create time.
 */
static void sv_qpx_init(struct sv_qp *qp)
{
	struct ibv_qp_ex *x = &qp->qpx;

	qp->has_qpx = true;
	x->wr_rdma_read = sv_wr_rdma_read;
	x->wr_rdma_write = sv_wr_rdma_write;
	x->wr_rdma_write_imm = sv_wr_rdma_write_imm;
	x->wr_send = sv_wr_send;
	x->wr_send_imm = sv_wr_send_imm;
	x->wr_set_inline_data = sv_wr_set_inline_data;
	x->wr_set_inline_data_list = sv_wr_set_inline_data_list;
	x->wr_set_sge = sv_wr_set_sge;
	x->wr_set_sge_list = sv_wr_set_sge_list;
	x->wr_start = sv_wr_start;
	x->wr_complete = sv_wr_complete;
	x->wr_abort = sv_wr_abort;
}

/* ---- executing ---- */

/* Copies in address order; small copies 8 bytes at a time so no aligned word tears. */
static void sv_ordered_copy(void *dst, const void *src, size_t n, bool small)
{
	volatile uint64_t *d8 = dst;
	const uint64_t *s8 = src;
	volatile uint8_t *d = dst;
	const uint8_t *s = src;

	if (!small) {
		memcpy(dst, src, n);
		return;
	}
	if (((uintptr_t)dst | (uintptr_t)src) % 8 == 0) {
		for (; n >= 8; n -= 8)
			*d8++ = *s8++;
		d = (volatile uint8_t *)d8;
		s = (const uint8_t *)s8;
	}
	while (n--)
		*d++ = *s++;
}

/*
 * Moves `len` bytes between local iovecs and iovecs of process `pid`: to it when
 * `write`, from it otherwise. Returns 0, -ESRCH (the process is gone) or -EFAULT.
 */
static int sv_xfer(int pid, bool write, struct iovec *liov, int nl, struct iovec *riov, int nr,
		   uint64_t len)
{
	bool small = len <= SV_SMALL_WRITE;
	struct iovec split[SV_SMALL_WRITE / 8];
	ssize_t n;

	if (len == 0)
		return 0;
	if (pid == getpid()) {
		int li = 0, ri = 0;
		size_t lo = 0, ro = 0;

		while (len) {
			size_t k = liov[li].iov_len - lo;

			if (riov[ri].iov_len - ro < k)
				k = riov[ri].iov_len - ro;
			if (len < k)
				k = len;
			if (write)
				sv_ordered_copy((char *)riov[ri].iov_base + ro,
						(char *)liov[li].iov_base + lo, k, small);
			else
				sv_ordered_copy((char *)liov[li].iov_base + lo,
						(char *)riov[ri].iov_base + ro, k, small);
			len -= k;
			lo += k;
			ro += k;
			if (lo == liov[li].iov_len) {
				li++;
				lo = 0;
			}
			if (ro == riov[ri].iov_len) {
				ri++;
				ro = 0;
			}
		}
		return 0;
	}
	/* The kernel copies iovec by iovec: 8-byte pieces land in order, untorn. */
	if (write && small && nr == 1 && (uintptr_t)riov[0].iov_base % 8 == 0) {
		nr = 0;
		for (uint64_t off = 0; off < len; off += 8) {
			split[nr].iov_base = (char *)riov[0].iov_base + off;
			split[nr].iov_len = len - off < 8 ? len - off : 8;
			nr++;
		}
		riov = split;
	}
	n = write ? process_vm_writev(pid, liov, (unsigned long)nl, riov, (unsigned long)nr, 0)
		  : process_vm_readv(pid, liov, (unsigned long)nl, riov, (unsigned long)nr, 0);
	if (n == (ssize_t)len)
		return 0;
	if (n < 0 && (errno == ESRCH || errno == EPERM)) {
		if (errno == EPERM)
			fprintf(stderr, "softverbs: process_vm_%s to pid %d: %s (run as root)\n",
				write ? "writev" : "readv", pid, strerror(errno));
		return -ESRCH;
	}
	return -EFAULT;
}

/* Local SGEs -> iovecs, checked against this process's MRs; false = protection error. */
static bool sv_local_iov(struct sv_qp *qp, struct sv_swr *w, struct iovec *iov, bool writable)
{
	struct sv_fabric *f = sv_proc.f;
	uint32_t pd = sv_container_of(qp->qp.pd, struct sv_pd, pd)->id;
	int pid = getpid();

	for (uint32_t i = 0; i < w->nsge; i++) {
		struct ibv_sge *g = &w->sge[i];
		struct sv_mr_slot *m = sv_mr_find(f, g->lkey);

		if (!m || m->pid != pid || m->pd != pd || g->addr < m->iova ||
		    g->addr - m->iova + g->length > m->len)
			return false;
		if (writable && !(m->access & IBV_ACCESS_LOCAL_WRITE))
			return false;
		iov[i].iov_base = (void *)(uintptr_t)(m->addr + (g->addr - m->iova));
		iov[i].iov_len = g->length;
	}
	return true;
}

/* The target's rkey range -> its address; false = remote access error. */
static bool sv_remote_addr(struct sv_qp_slot *t, uint32_t rkey, uint64_t raddr, uint64_t len,
			   unsigned need, uint64_t *addr)
{
	struct sv_mr_slot *m = sv_mr_find(sv_proc.f, rkey);

	if (!m || m->pid != t->pid || m->pd != t->pd || !(m->access & need) ||
	    !(atomic_load(&t->access) & need) || raddr < m->iova || raddr - m->iova > m->len ||
	    len > m->len - (raddr - m->iova))
		return false;
	*addr = m->addr + (raddr - m->iova);
	return true;
}

/* The remote QP if the path to it delivers right now, NULL if it does not answer. */
static struct sv_qp_slot *sv_path(struct sv_qp *qp, int64_t now)
{
	struct sv_fabric *f = sv_proc.f;
	uint32_t dqpn = qp->attr.dest_qp_num;
	struct sv_qp_slot *t = &f->qps[dqpn & (SV_MAX_QPS - 1)];
	int st;

	if (sv_nic_link(f, qp->s->nic, now) != SV_LINK_UP)
		return NULL;
	if (!dqpn || atomic_load(&t->qpn) != dqpn)
		return NULL;
	if (sv_nic_link(f, t->nic, now) != SV_LINK_UP)
		return NULL;
	/*
	 * IB: the dlid names the target's NIC. RoCE: our GRH reaches it and its GRH
	 * reaches us (the acknowledgements and read responses travel by it).
	 */
	if (f->net.link == SV_LL_ROCE
		? atomic_load(&qp->s->grh_peer) != t->nic || atomic_load(&t->grh_peer) != qp->s->nic
		: f->nics[t->nic].lid != qp->attr.ah_attr.dlid)
		return NULL;
	st = atomic_load(&t->state);
	if ((st != IBV_QPS_RTR && st != IBV_QPS_RTS) || !sv_pid_alive(t->pid))
		return NULL;
	return t;
}

static int64_t sv_retry_deadline(struct sv_qp *qp, struct sv_swr *w)
{
	double ns = 4096.0 * (double)(1ull << qp->attr.timeout) * (qp->attr.retry_cnt + 1) *
		    sv_proc.cfg.time_scale;

	return w->first_ns + (int64_t)ns;
}

/* Path silent: keep retrying until the transport timeout, then RETRY_EXC_ERR. */
static int sv_silent(struct sv_qp *qp, struct sv_swr *w, int64_t now, int64_t *wake)
{
	int64_t deadline;

	if (qp->attr.timeout == 0) { /* 0 = infinite, per the IB spec */
		*wake = now + SV_RETRY_POLL;
		return SV_WAIT;
	}
	deadline = sv_retry_deadline(qp, w);
	if (now >= deadline)
		return IBV_WC_RETRY_EXC_ERR;
	*wake = deadline < now + SV_RETRY_POLL ? deadline : now + SV_RETRY_POLL;
	return SV_WAIT;
}

/* Receiver not ready: rnr_retry 7 waits forever, otherwise gives up after the retries. */
static int sv_rnr(struct sv_qp *qp, struct sv_swr *w, int64_t now, int64_t *wake)
{
	if (qp->attr.rnr_retry < 7 &&
	    now - w->first_ns >=
		(int64_t)((qp->attr.rnr_retry + 1) * SV_RNR_DELAY * sv_proc.cfg.time_scale))
		return IBV_WC_RNR_RETRY_EXC_ERR;
	*wake = now + SV_RNR_POLL;
	return SV_WAIT;
}

/*
 * Consumes the receive peeked at index `idx` and completes it, unless the owner
 * flushed or reset the queue meanwhile (then the receive already completed).
 */
static void sv_rq_consume(struct sv_qp_slot *t, uint32_t idx, const struct ibv_wc *wc)
{
	sv_lock(&t->rq_lock);
	if (t->rq_head == idx && t->rq_tail != idx) {
		t->rq_head++;
		sv_cq_push(sv_proc.f, t->rcq, t->rcq_id, wc);
	}
	pthread_mutex_unlock(&t->rq_lock);
}

/*
 * The receive a SEND or WRITE_WITH_IMM consumes: peeked at in the target QP's own
 * queue (and consumed when it completes), or taken from its SRQ, which other
 * requesters take from too (then it completes, in error if the request fails).
 */
struct sv_recv {
	struct sv_rwqe wqe;
	uint32_t idx; /* own queue: where it was */
	bool srq;
	uint32_t pd; /* the PD of its lkeys: the QP's, or the SRQ's */
};

static bool sv_recv_get(struct sv_qp_slot *t, struct sv_recv *r)
{
	bool got;

	if (t->srq >= 0) {
		r->srq = true;
		r->pd = sv_proc.f->srqs[t->srq].pd;
		return sv_srq_take(sv_proc.f, t->srq, t->srq_id, &r->wqe);
	}
	r->srq = false;
	r->pd = t->pd;
	sv_lock(&t->rq_lock);
	r->idx = t->rq_head;
	got = r->idx != t->rq_tail;
	if (got)
		r->wqe = t->rq[r->idx % SV_RQ_CAP];
	pthread_mutex_unlock(&t->rq_lock);
	return got;
}

static void sv_recv_done(struct sv_qp_slot *t, struct sv_recv *r, const struct ibv_wc *wc)
{
	if (r->srq)
		sv_cq_push(sv_proc.f, t->rcq, t->rcq_id, wc);
	else
		sv_rq_consume(t, r->idx, wc);
}

/* A request that failed after taking an SRQ receive: the receive completes in error. */
static int sv_recv_fail(struct sv_qp_slot *t, struct sv_recv *r, int recv_status, int status)
{
	struct ibv_wc wc;

	if (r->srq) {
		sv_wc_fill(&wc, r->wqe.wr_id, recv_status, IBV_WC_RECV, 0, atomic_load(&t->qpn));
		sv_recv_done(t, r, &wc);
	}
	return status;
}

/*
 * Executes the WR at the head of the send queue. Returns 0 when done, SV_WAIT with
 * *wake set, or an ibv_wc_status for the requester.
 */
static int sv_exec(struct sv_qp *qp, struct sv_swr *w, int64_t now, int64_t *wake)
{
	struct sv_fabric *f = sv_proc.f;
	struct iovec liov[SV_MAX_SEND_SGE], riov[SV_RQ_SGE];
	struct sv_qp_slot *t = sv_path(qp, now);
	struct sv_recv rcv = {0};
	bool needs_recv = w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM || w->opcode == IBV_WR_SEND ||
			  w->opcode == IBV_WR_SEND_WITH_IMM;
	uint64_t addr = 0, cap = 0;
	bool read = w->opcode == IBV_WR_RDMA_READ;
	int nl = (int)w->nsge, nr = 1, rate, rc;
	struct ibv_wc wc;

	if (!t)
		return sv_silent(qp, w, now, wake);
	/*
	 * Both ends' links limit the transfer: the local one was reserved at post time
	 * (unless the NIC turned slow since), the remote one is reserved here, once.
	 */
	rate = sv_nic_rate(f, qp->s->nic, sv_proc.cfg.shaping);
	if (rate && w->len && !w->wire_ns) {
		w->wire_ns = sv_nic_reserve(f, qp->s->nic, read ? SV_RX : SV_TX, rate, w->len, now);
		w->start_ns = w->wire_ns - sv_wire_time(w->len, rate);
	}
	/*
	 * The bytes cross the remote link while they cross the local one: when this
	 * thread gets here late (it was copying the previous request), the turn is taken
	 * from when they started out, or the copy time would be lost on every request.
	 * Never from the future: the link's clock is shared and takes turns in order.
	 */
	rate = sv_nic_rate(f, t->nic, sv_proc.cfg.shaping);
	if (rate && w->len && !w->far_ns)
		w->far_ns = sv_nic_reserve(f, t->nic, read ? SV_TX : SV_RX, rate, w->len,
					   w->wire_ns && w->start_ns < now ? w->start_ns : now);
	if (w->wire_ns > now || w->far_ns > now) {
		*wake = w->wire_ns > w->far_ns ? w->wire_ns : w->far_ns;
		return SV_WAIT;
	}
	if (w->flags & IBV_SEND_INLINE) {
		liov[0].iov_base = w->inl;
		liov[0].iov_len = w->len;
		nl = 1;
	} else if (!sv_local_iov(qp, w, liov, w->opcode == IBV_WR_RDMA_READ)) {
		return IBV_WC_LOC_PROT_ERR;
	}
	if (needs_recv && !sv_recv_get(t, &rcv))
		return sv_rnr(qp, w, now, wake);
	switch (w->opcode) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		/* A zero-length write carries no address: the rkey is not checked. */
		if (w->len &&
		    !sv_remote_addr(t, w->rkey, w->raddr, w->len, IBV_ACCESS_REMOTE_WRITE, &addr))
			return sv_recv_fail(t, &rcv, IBV_WC_LOC_ACCESS_ERR, IBV_WC_REM_ACCESS_ERR);
		riov[0].iov_base = (void *)(uintptr_t)addr;
		riov[0].iov_len = w->len;
		break;
	case IBV_WR_RDMA_READ:
		if (!sv_remote_addr(t, w->rkey, w->raddr, w->len, IBV_ACCESS_REMOTE_READ, &addr))
			return IBV_WC_REM_ACCESS_ERR;
		riov[0].iov_base = (void *)(uintptr_t)addr;
		riov[0].iov_len = w->len;
		break;
	default: /* SEND: scatter into the receive's SGEs, checked against the target's MRs */
		nr = 0;
		for (uint32_t i = 0; i < rcv.wqe.num_sge && cap < w->len; i++) {
			struct sv_mr_slot *m = sv_mr_find(f, rcv.wqe.sge[i].lkey);
			struct ibv_sge *g = &rcv.wqe.sge[i];

			if (!m || m->pid != t->pid || m->pd != rcv.pd ||
			    !(m->access & IBV_ACCESS_LOCAL_WRITE) || g->addr < m->iova ||
			    g->addr - m->iova + g->length > m->len)
				return sv_recv_fail(t, &rcv, IBV_WC_LOC_PROT_ERR,
						    IBV_WC_REM_OP_ERR);
			riov[nr].iov_base = (void *)(uintptr_t)(m->addr + (g->addr - m->iova));
			riov[nr].iov_len = g->length;
			cap += g->length;
			nr++;
		}
		if (cap < w->len) {
			sv_wc_fill(&wc, rcv.wqe.wr_id, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0,
				   atomic_load(&t->qpn));
			sv_recv_done(t, &rcv, &wc);
			return IBV_WC_REM_INV_REQ_ERR;
		}
		break;
	}
	rc = sv_xfer(t->pid, w->opcode != IBV_WR_RDMA_READ, liov, nl, riov, nr, w->len);
	if (rc == -ESRCH)
		return sv_silent(qp, w, now, wake);
	if (rc)
		return sv_recv_fail(t, &rcv, IBV_WC_LOC_ACCESS_ERR, IBV_WC_REM_ACCESS_ERR);
	/* A read response travels in the responder's traffic class. */
	if (w->opcode == IBV_WR_RDMA_READ) {
		sv_nic_account(f, t->nic, qp->s->nic, w->len);
		sv_nic_account_class(f, t->nic, t->grh.traffic_class, w->len);
	} else {
		sv_nic_account(f, qp->s->nic, t->nic, w->len);
		sv_nic_account_class(f, qp->s->nic, qp->attr.ah_attr.grh.traffic_class, w->len);
	}
	if (needs_recv) {
		sv_wc_fill(&wc, rcv.wqe.wr_id, IBV_WC_SUCCESS,
			   w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RECV_RDMA_WITH_IMM
								   : IBV_WC_RECV,
			   (uint32_t)w->len, atomic_load(&t->qpn));
		if (w->opcode != IBV_WR_SEND) {
			wc.wc_flags = IBV_WC_WITH_IMM;
			wc.imm_data = w->imm;
		}
		wc.src_qp = qp->qp.qp_num;
		wc.slid = f->nics[qp->s->nic].lid;
		sv_recv_done(t, &rcv, &wc);
	}
	return 0;
}

/*
 * Under qp->lock: runs the send queue as far as it goes, stopping (and returning
 * `now`) before a request longer than `max_len` or once `budget` bytes went; returns
 * SV_NEVER when the queue is empty, otherwise when to look again.
 */
static int64_t sv_qp_run(struct sv_qp *qp, int64_t now, uint64_t max_len, uint64_t budget)
{
	int64_t wake = SV_NEVER;
	uint64_t done = 0;
	uint32_t head;

	while ((head = atomic_load_explicit(&qp->sq_head, memory_order_relaxed)) !=
	       atomic_load_explicit(&qp->sq_tail, memory_order_acquire)) {
		struct sv_swr *w = &qp->sq[head % qp->cap.max_send_wr];
		int rc;

		if (qp->attr.qp_state == IBV_QPS_ERR) {
			sv_qp_flush(qp);
			break;
		}
		if (w->len > max_len || done >= budget)
			return now;
		if (!w->first_ns)
			w->first_ns = now;
		rc = sv_exec(qp, w, now, &wake);
		if (rc == SV_WAIT)
			return wake;
		if (rc) {
			sv_sq_retire(qp, head, rc);
			sv_qp_set_state(qp, IBV_QPS_ERR);
			sv_qp_flush(qp);
			break;
		}
		done += w->len + 64; /* a request costs something even when empty */
		sv_sq_retire(qp, head, IBV_WC_SUCCESS);
		now = sv_now_ns();
	}
	return SV_NEVER;
}

int64_t sv_progress_all(int64_t now)
{
	int64_t wake = SV_NEVER, w;

	pthread_mutex_lock(&sv_proc.lock);
	for (struct sv_qp *qp = sv_proc.qps; qp; qp = qp->next) {
		if (qp->eng)
			continue; /* its engine runs it */
		/* A thread posting on it runs it itself. */
		if (pthread_mutex_trylock(&qp->lock) != 0) {
			w = now + SV_RNR_POLL;
		} else {
			w = sv_qp_run(qp, now, UINT64_MAX, UINT64_MAX);
			pthread_mutex_unlock(&qp->lock);
		}
		if (w < wake)
			wake = w;
	}
	pthread_mutex_unlock(&sv_proc.lock);
	return wake;
}

/*
 * ---- engines ----
 *
 * One thread per NIC of this process runs the send queues of that NIC's QPs. A
 * posting thread hands a QP over by setting its `ready` flag and bumping the
 * engine's futex word; the engine sleeps on that word when it has nothing to do,
 * with a timeout at the earliest time one of its QPs waits for (shaping, RNR, a
 * silent path), after polling it briefly when it just worked, so a stream of
 * requests needs no wake-up system call.
 */
struct sv_engine {
	pthread_mutex_t lock; /* qps; held while running them */
	struct sv_qp *qps;
	_Atomic uint32_t seq; /* futex word, bumped by every hand-over */
	_Atomic bool sleeping;
	bool started;
	pthread_t thread;
};

static struct sv_engine sv_engines[SV_MAX_NICS];

static inline void sv_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

static void sv_engine_hand(struct sv_qp *qp)
{
	struct sv_engine *e = qp->eng;

	if (atomic_exchange(&qp->ready, true))
		return; /* whoever set it wakes the engine */
	atomic_fetch_add(&e->seq, 1);
	if (atomic_load(&e->sleeping))
		syscall(SYS_futex, &e->seq, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static void *sv_engine_main(void *arg)
{
	struct sv_engine *e = arg;

	/* Shaped requests complete at their wire time: wake then, not 50 us later. */
	prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
	for (;;) {
		uint32_t seq = atomic_load(&e->seq);
		int64_t now = sv_now_ns(), next = SV_NEVER, spin_end;
		bool handed = false;
		struct timespec ts;

		pthread_mutex_lock(&e->lock);
		for (struct sv_qp *qp = e->qps; qp; qp = qp->eng_next) {
			bool ready = atomic_exchange(&qp->ready, false);

			if (ready || qp->eng_wake <= now) {
				pthread_mutex_lock(&qp->lock);
				qp->eng_wake = sv_qp_run(qp, now, UINT64_MAX, SV_ENG_BUDGET);
				pthread_mutex_unlock(&qp->lock);
				now = sv_now_ns();
				handed |= ready;
			}
			if (qp->eng_wake < next)
				next = qp->eng_wake;
		}
		pthread_mutex_unlock(&e->lock);
		if (next <= now)
			continue;
		spin_end = handed ? now + SV_ENG_SPIN : now;
		while (atomic_load(&e->seq) == seq && now < spin_end && now < next) {
			sv_cpu_relax();
			now = sv_now_ns();
		}
		if (atomic_load(&e->seq) != seq || next <= now)
			continue;
		ts.tv_sec = next / 1000000000;
		ts.tv_nsec = next % 1000000000;
		atomic_store(&e->sleeping, true);
		/* FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC time, as sv_now_ns. */
		if (atomic_load(&e->seq) == seq)
			syscall(SYS_futex, &e->seq, FUTEX_WAIT_BITSET_PRIVATE, seq,
				next == SV_NEVER ? NULL : &ts, NULL, FUTEX_BITSET_MATCH_ANY);
		atomic_store(&e->sleeping, false);
	}
	return NULL;
}

/* The engine of a NIC of this process, started on first use; NULL if it cannot start. */
static struct sv_engine *sv_engine_get(int nic)
{
	struct sv_engine *e = &sv_engines[nic];
	sigset_t all, old;
	char name[16];

	pthread_mutex_lock(&sv_proc.lock);
	if (!e->started) {
		pthread_mutex_init(&e->lock, NULL);
		sigfillset(&all);
		pthread_sigmask(SIG_BLOCK, &all, &old);
		if (pthread_create(&e->thread, NULL, sv_engine_main, e) == 0) {
			snprintf(name, sizeof(name), "sv-%s", sv_proc.f->nics[nic].name);
			pthread_setname_np(e->thread, name);
			e->started = true;
		} else {
			fprintf(stderr,
				"softverbs: cannot start the engine of %s, its QPs run inline\n",
				sv_proc.f->nics[nic].name);
		}
		pthread_sigmask(SIG_SETMASK, &old, NULL);
	}
	pthread_mutex_unlock(&sv_proc.lock);
	return e->started ? e : NULL;
}

static void sv_engine_add(struct sv_qp *qp)
{
	pthread_mutex_lock(&qp->eng->lock);
	qp->eng_next = qp->eng->qps;
	qp->eng->qps = qp;
	pthread_mutex_unlock(&qp->eng->lock);
}

/* Waits for the engine to leave the QP alone (it holds its lock while running it). */
static void sv_engine_remove(struct sv_qp *qp)
{
	struct sv_qp **pp;

	pthread_mutex_lock(&qp->eng->lock);
	for (pp = &qp->eng->qps; *pp && *pp != qp; pp = &(*pp)->eng_next)
		;
	if (*pp)
		*pp = qp->eng_next;
	pthread_mutex_unlock(&qp->eng->lock);
}

void sv_engines_forget(void)
{
	memset(sv_engines, 0, sizeof(sv_engines));
}

/* ---- the progress thread ---- */

static pthread_cond_t sv_cond;

void sv_kick(void)
{
	pthread_mutex_lock(&sv_proc.lock);
	sv_proc.kicked = true;
	if (sv_proc.thread_started)
		pthread_cond_signal(&sv_cond);
	pthread_mutex_unlock(&sv_proc.lock);
}

static void *sv_thread_main(void *arg)
{
	int64_t last_reap = 0;

	for (;;) {
		int64_t now = sv_now_ns(), wake = sv_progress_all(now);
		struct timespec ts;

		sv_ctx_check_ports(now);
		sv_srq_events();
		if (now - last_reap > SV_REAP_PERIOD) {
			sv_fabric_reap(sv_proc.f);
			last_reap = now;
		}
		if (wake > now + SV_IDLE_TICK)
			wake = now + SV_IDLE_TICK;
		ts.tv_sec = wake / 1000000000;
		ts.tv_nsec = wake % 1000000000;
		pthread_mutex_lock(&sv_proc.lock);
		if (!sv_proc.kicked)
			pthread_cond_timedwait(&sv_cond, &sv_proc.lock, &ts);
		sv_proc.kicked = false;
		pthread_mutex_unlock(&sv_proc.lock);
	}
	return NULL;
}

void sv_thread_start(void)
{
	pthread_condattr_t ca;
	sigset_t all, old;

	pthread_mutex_lock(&sv_proc.lock);
	if (sv_proc.thread_started) {
		pthread_mutex_unlock(&sv_proc.lock);
		return;
	}
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&sv_cond, &ca);
	pthread_condattr_destroy(&ca);
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	if (pthread_create(&sv_proc.thread, NULL, sv_thread_main, NULL) == 0) {
		pthread_setname_np(sv_proc.thread, "softverbs");
		sv_proc.thread_started = true;
	} else {
		fprintf(stderr, "softverbs: cannot start the progress thread\n");
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_mutex_unlock(&sv_proc.lock);
}
