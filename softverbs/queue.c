/*
 * Completion queues, RC queue pairs and the data path of the software RDMA device.
 *
 * A send work request is copied into the QP's process-local send queue at post
 * time and executed in order by the engine of the QP's NIC: one thread per NIC of
 * this process, so that the NICs of a process move data in parallel, as hardware
 * does, and the posting thread (NCCL's single proxy thread) does not copy. The
 * engine serves its QPs round-robin, a slice (up to SV_SLICE bytes: one slice of a
 * large request, or several small requests) per QP with work per round, so a QP
 * never waits behind another's bulk; when the NIC is shaped, each slice takes its turn
 * on the NIC's clock in shared memory, which interleaves the processes of a node that
 * share the NIC the same way. Requests of up to SV_POST_RUN bytes run at once in the
 * posting thread when the engine is not busy with that QP, which keeps small-message
 * latency free of a thread hand-over. With SOFTVERBS_ENGINES=0 everything runs in the
 * posting thread, and what has to wait (shaping, a missing receive, a path that does
 * not answer) in this process's progress thread. Executing a write checks the
 * target's rkey in the shared MR table, moves the bytes with process_vm_writev
 * (memcpy within one process), then consumes the target's posted receive and places
 * its completion in the target's CQ ring in shared memory: the target process need
 * not run. No lock shared between processes or NICs is held while bytes move.
 *
 * Landing and completing are two steps, as on a wire: a request lands when its
 * request packets get to the responder, and completes when the acknowledgement comes
 * back (fabric.h says which faults lose which). A path that does not answer (local or
 * remote port down or black-holed, remote QP gone or not ready, remote process or
 * device dead, acknowledgements lost) is retried until the QP's own transport timeout,
 * 4.096 us * 2^timeout * (retry_cnt + 1) * SOFTVERBS_TIME_SCALE, has passed; then the
 * oldest request completes with IBV_WC_RETRY_EXC_ERR, the QP moves to ERR and
 * everything still queued (send and receive, landed or not) is flushed. A request
 * that landed is never executed again: the retransmission of a WRITE_WITH_IMM whose
 * acknowledgement was lost only gets the acknowledgement, it consumes no receive.
 */
#include "softverbs/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#define SV_SMALL_WRITE 1024    /* lands in address order, 8-byte word by word */
#define SV_RETRY_POLL  1000000 /* ns between attempts on a silent path */
#define SV_RNR_POLL    100000  /* ns between attempts while no receive is posted */
#define SV_RNR_DELAY   1000000 /* ns per RNR retry when rnr_retry < 7 */
#define SV_IDLE_TICK   2000000 /* ns: port events, scheduled faults, faults seen by engines */
#define SV_REAP_PERIOD 200000000
#define SV_NEVER       INT64_MAX
#define SV_POST_RUN    65536 /* bytes a posting thread executes itself, per call */
#define SV_SLICE       65536 /* bytes of one QP per round of its engine, and per turn on a link */
#define SV_SOLO	       (1u << 20) /* per round when no other QP of the engine has work */
#define SV_AHEAD       100000	  /* ns: a shaped slice due this soon lands now (a wake-up saved) */
#define SV_LATE	       1000000000 /* ns of its turns on the wire a late engine may catch up */
#define SV_ENG_SPIN    50000	  /* ns an engine that just worked polls before sleeping */
#define SV_DRAW_JITTER 0x6a6974746572ull /* "jitter": what a jitter draw is for */

/* What executing a request gives besides 0 (done) and an ibv_wc_status for the requester. */
#define SV_WAIT	  (-1) /* not yet: look again at *wake */
#define SV_RNR	  (-2) /* the responder has no receive posted */
#define SV_SILENT (-3) /* the responder does not answer */
#define SV_MORE	  (-4) /* a slice landed, the rest of the request has not */

static int64_t sv_qp_step(struct sv_qp *qp, int64_t now, uint64_t max_len, uint64_t budget);
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
 * Seeded draws (what lands at a black hole, jitter delays): a pure function of
 * SOFTVERBS_SEED, the QP's identity, what the draw is for and the request's index in
 * its send queue, so that a program that does the same things draws the same.
 */
static uint64_t sv_mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static uint64_t sv_draw(uint64_t key, uint64_t what, uint32_t idx)
{
	return sv_mix(sv_proc.cfg.seed ^ sv_mix(key ^ sv_mix(what ^ sv_mix(idx))));
}

static uint64_t sv_str_hash(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
	return h;
}

/* A QP is known by its node, its NIC and how many QPs this process created before it. */
static uint64_t sv_qp_key(int nic, uint32_t ordinal)
{
	struct sv_fabric *f = sv_proc.f;

	return sv_mix(sv_str_hash(f->nodes[f->nics[nic].node].name) ^
		      sv_mix(sv_str_hash(f->nics[nic].name) ^ sv_mix(ordinal)));
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

static int cq_hint;
static _Atomic int qp_hint;

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

/*
 * A free QP slot, claimed without the fabric lock: its qpn goes from 0 to
 * SV_QPN_CLAIMED by compare-and-swap, and the maker fills the slot in and stores
 * the real QPN last. Every lookup compares QPNs, which the claim value never
 * matches. With the lock, a job of 65 processes on 2 cores made its QPs one after
 * another behind whichever holder the scheduler had preempted: 106 ms of one
 * repair of 512 QPs went there (docs/scale.md). SV_MAX_QPS when every slot is
 * taken.
 */
static int sv_qp_claim(struct sv_fabric *f)
{
	int h = atomic_load_explicit(&qp_hint, memory_order_relaxed);

	for (int k = 0; k < SV_MAX_QPS; k++) {
		int i = (h + k) % SV_MAX_QPS;
		uint32_t free_qpn = 0;

		if (atomic_load_explicit(&f->qps[i].qpn, memory_order_relaxed) == 0 &&
		    atomic_compare_exchange_strong(&f->qps[i].qpn, &free_qpn, SV_QPN_CLAIMED)) {
			atomic_store_explicit(&qp_hint, (i + 1) % SV_MAX_QPS, memory_order_relaxed);
			return i;
		}
	}
	return SV_MAX_QPS;
}

/* ---- completion queues ---- */

/*
 * CQ rings. A CQ of up to SV_CQ_CAP entries uses the ring inside its slot of the
 * fabric. A larger one (mlx5 accepts up to max_cqe, and NCCL's port failover asks
 * for more than SV_CQ_CAP) gets a memfd of its own, which the owner maps for polling;
 * since other processes place completions in it too (a SEND's or WRITE_WITH_IMM's
 * receive completion is placed by the sender), each takes the memfd from the owner
 * with pidfd_getfd the first time it places one, maps it, and keeps the mapping in
 * sv_rings, per slot, with the CQ id and ring id it was made for. Entry `slot`
 * changes only under f->cqs[slot].lock, which every producer holds while it writes
 * and the owner while it replaces or closes the memfd, so a descriptor taken under
 * it with the id checked is the ring's. The progress thread unmaps the mappings
 * whose CQ was destroyed or whose ring was replaced.
 */
struct sv_ring_map {
	uint32_t id, ring_id; /* what it maps: the CQ and its ring */
	uint32_t mask;
	bool owned; /* the owner's own mapping: its sv_cq unmaps it */
	struct ibv_wc *ring;
};

static struct sv_ring_map sv_rings[SV_MAX_CQS];

/* A slot's mapping is written under its CQ slot's lock; `ring` is also read without
 * it (sv_cq_rings_sweep()'s first look), so it is stored atomically, last. */
static void sv_ring_put(struct sv_ring_map *m, const struct sv_ring_map *v)
{
	m->id = v->id;
	m->ring_id = v->ring_id;
	m->mask = v->mask;
	m->owned = v->owned;
	__atomic_store_n(&m->ring, v->ring, __ATOMIC_RELEASE);
}
static _Atomic int sv_rings_foreign; /* mappings of other processes' rings */
static _Atomic bool sv_rings_warned;

/* Entries of the ring of a CQ of `cqe` entries: the inline ring, or a power of two. */
static uint32_t sv_ring_entries(int cqe)
{
	uint32_t n = SV_CQ_CAP;

	while (n < (uint32_t)cqe)
		n <<= 1;
	return n;
}

static size_t sv_ring_bytes(uint32_t entries)
{
	return (size_t)entries * sizeof(struct ibv_wc);
}

/*
 * A new ring of `entries` entries: its memfd in *fd, its memory allocated (a store
 * into a page tmpfs cannot give would be SIGBUS, and a NIC pins its CQ's memory
 * too), mapped; NULL with errno.
 */
static struct ibv_wc *sv_ring_create(uint32_t entries, int *fd)
{
	size_t bytes = sv_ring_bytes(entries);
	struct ibv_wc *ring = MAP_FAILED;
	int err;

	*fd = memfd_create("softverbs-cq", MFD_CLOEXEC);
	if (*fd < 0)
		return NULL;
	err = posix_fallocate(*fd, 0, (off_t)bytes);
	if (!err) {
		ring = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
		err = ring == MAP_FAILED ? errno : 0;
	}
	if (!err)
		return ring;
	close(*fd);
	errno = err == ENOSPC ? ENOMEM : err;
	return NULL;
}

/* Maps another process's ring of CQ slot `s`, under its lock; NULL with errno. */
static struct ibv_wc *sv_ring_fetch(struct sv_cq_slot *s)
{
	size_t bytes = sv_ring_bytes(s->ring_cap);
	struct ibv_wc *ring = NULL;
	struct stat st;
	int pidfd, fd, err = 0;

	pidfd = (int)syscall(SYS_pidfd_open, s->pid, 0);
	if (pidfd < 0)
		return NULL;
	fd = (int)syscall(SYS_pidfd_getfd, pidfd, s->ring_fd, 0);
	err = fd < 0 ? errno : 0;
	close(pidfd);
	if (!err && (fstat(fd, &st) != 0 || (size_t)st.st_size != bytes))
		err = EPROTO;
	if (!err) {
		ring = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (ring == MAP_FAILED) {
			err = errno;
			ring = NULL;
		}
	}
	if (fd >= 0)
		close(fd);
	errno = err;
	return ring;
}

/*
 * The ring completions of CQ slot `slot` (id `id`, checked) go to, its mask in
 * *mask; under the slot's lock. NULL when another process's ring cannot be mapped.
 */
static struct ibv_wc *sv_ring_of(struct sv_cq_slot *s, int slot, uint32_t id, uint32_t *mask)
{
	struct sv_ring_map *m = &sv_rings[slot];
	struct ibv_wc *ring;

	if (s->ring_cap == SV_CQ_CAP) {
		*mask = SV_CQ_CAP - 1;
		return s->ring;
	}
	if (m->ring && m->id == id && m->ring_id == s->ring_id) {
		*mask = m->mask;
		return m->ring;
	}
	if (m->ring && !m->owned) {
		munmap(m->ring, sv_ring_bytes(m->mask + 1));
		atomic_fetch_sub(&sv_rings_foreign, 1);
	}
	__atomic_store_n(&m->ring, NULL, __ATOMIC_RELEASE);
	ring = sv_ring_fetch(s);
	if (!ring) {
		if (!atomic_exchange(&sv_rings_warned, true))
			fprintf(stderr,
				"softverbs: cannot map the ring of a CQ of pid %d: %s (its "
				"completions are lost; pidfd_getfd needs Linux >= 5.6 and the "
				"permission process_vm_writev needs)\n",
				s->pid, strerror(errno));
		return NULL;
	}
	sv_ring_put(m, &(struct sv_ring_map){
			   .id = id, .ring_id = s->ring_id, .mask = s->ring_cap - 1, .ring = ring});
	atomic_fetch_add(&sv_rings_foreign, 1);
	*mask = m->mask;
	return ring;
}

void sv_cq_rings_sweep(void)
{
	struct sv_fabric *f = sv_proc.f;

	if (!atomic_load(&sv_rings_foreign))
		return;
	for (int i = 0; i < SV_MAX_CQS; i++) {
		struct sv_ring_map *m = &sv_rings[i];
		struct sv_cq_slot *s = &f->cqs[i];

		if (!__atomic_load_n(&m->ring, __ATOMIC_ACQUIRE))
			continue;
		sv_lock(&s->lock);
		if (m->ring && !m->owned &&
		    (atomic_load(&s->id) != m->id || s->ring_id != m->ring_id)) {
			munmap(m->ring, sv_ring_bytes(m->mask + 1));
			__atomic_store_n(&m->ring, NULL, __ATOMIC_RELEASE);
			atomic_fetch_sub(&sv_rings_foreign, 1);
		}
		pthread_mutex_unlock(&s->lock);
	}
}

SV_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
				       struct ibv_comp_channel *channel, int comp_vector)
{
	struct sv_fabric *f = sv_proc.f;
	struct ibv_wc *ring = NULL;
	uint32_t entries, id;
	struct sv_cq *cq;
	int i, fd = -1;

	if (sv_ctx_dead(context)) {
		errno = EIO;
		return NULL;
	}
	/* As the kernel checks them: a vector the context lacks, a size past max_cqe. */
	if (cqe < 1 || cqe > SV_MAX_CQE || comp_vector < 0 ||
	    comp_vector >= context->num_comp_vectors) {
		errno = EINVAL;
		return NULL;
	}
	cq = calloc(1, sizeof(*cq));
	if (!cq) {
		errno = ENOMEM;
		return NULL;
	}
	entries = sv_ring_entries(cqe);
	if (entries > SV_CQ_CAP) {
		ring = sv_ring_create(entries, &fd);
		if (!ring) {
			free(cq);
			return NULL;
		}
	}
	sv_lock(&f->lock);
	i = sv_free_slot(&cq_hint, SV_MAX_CQS, cq_slot_used, f);
	if (i == SV_MAX_CQS) {
		pthread_mutex_unlock(&f->lock);
		if (ring) {
			munmap(ring, sv_ring_bytes(entries));
			close(fd);
		}
		free(cq);
		errno = ENOMEM;
		return NULL;
	}
	cq->s = &f->cqs[i];
	cq->slot = i;
	/*
	 * Initialised once, as another thread of this process may hold it on a free slot
	 * (the progress thread letting a mapping go); robust, a dead holder is recovered.
	 */
	if (!atomic_load(&cq->s->lock_ready)) {
		sv_mutex_init_shared(&cq->s->lock);
		atomic_store(&cq->s->lock_ready, true);
	}
	/* Under the producers' lock: a producer that checked the slot's old id under it
	 * may still be reading these (sv_cq_push). */
	sv_lock(&cq->s->lock);
	cq->s->pid = getpid();
	cq->s->nic = sv_ctx_of(context)->nic;
	cq->s->epoch = sv_ctx_of(context)->epoch;
	pthread_mutex_unlock(&cq->s->lock);
	atomic_store(&cq->s->head, 0);
	atomic_store(&cq->s->tail, 0);
	atomic_store(&cq->s->overruns, 0);
	id = sv_next_gen(f, 31);
	cq->s->ring_cap = entries;
	cq->s->ring_id = id;
	cq->s->ring_fd = fd;
	cq->ring = ring ? ring : cq->s->ring;
	cq->mask = entries - 1;
	if (ring) {
		sv_lock(&cq->s->lock);
		if (sv_rings[i].ring && !sv_rings[i].owned) {
			munmap(sv_rings[i].ring, sv_ring_bytes(sv_rings[i].mask + 1));
			atomic_fetch_sub(&sv_rings_foreign, 1);
		}
		sv_ring_put(
		    &sv_rings[i],
		    &(struct sv_ring_map){
			.id = id, .ring_id = id, .mask = cq->mask, .owned = true, .ring = ring});
		pthread_mutex_unlock(&cq->s->lock);
	}
	cq->s->ch_fd = channel ? channel->fd : -1;
	atomic_store(&cq->s->armed, false);
	atomic_store(&cq->s->events, 0);
	atomic_store(&cq->s->id, id);
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
	struct sv_cq_slot *s = cq->s;
	bool own = cq->ring != s->ring;
	int fd = s->ring_fd;

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
	/* Under the producers' lock: none is taking the memfd while it is closed. */
	sv_lock(&s->lock);
	atomic_store(&s->id, 0);
	if (own) {
		__atomic_store_n(&sv_rings[cq->slot].ring, NULL, __ATOMIC_RELEASE);
		close(fd);
	}
	pthread_mutex_unlock(&s->lock);
	if (own)
		munmap(cq->ring, sv_ring_bytes(cq->mask + 1));
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
	struct ibv_wc *ring;
	uint64_t tail;
	uint32_t mask;
	bool ok = false;

	sv_lock(&s->lock);
	/* A dead device writes no more completions, not even flush errors. */
	if (atomic_load(&s->id) != id || sv_nic_dead(f, s->nic, s->epoch))
		goto out;
	ring = sv_ring_of(s, slot, id, &mask);
	if (!ring)
		goto out;
	tail = atomic_load_explicit(&s->tail, memory_order_relaxed);
	if (tail - atomic_load(&s->head) > mask) {
		if (atomic_fetch_add(&s->overruns, 1) == 0)
			fprintf(stderr, "softverbs: CQ %d overrun, completions lost\n", slot);
		goto out;
	}
	ring[tail & mask] = *wc;
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
		wc[k] = cq->ring[head & cq->mask];
	atomic_store_explicit(&s->head, head, memory_order_release);
	pthread_mutex_unlock(&cq->poll_lock);
	return k;
}

/*
 * Up to max_cqe, as ibv_create_cq. A CQ that needs a larger ring than it has gets a
 * new one of its own, with what is queued copied over, while neither producers (the
 * slot's lock) nor pollers (poll_lock) run; the others map it when they next place a
 * completion. A smaller size keeps the ring.
 */
SV_EXPORT int ibv_resize_cq(struct ibv_cq *ibcq, int cqe)
{
	struct sv_cq *cq = to_cq(ibcq);
	struct sv_cq_slot *s = cq->s;
	struct ibv_wc *ring = NULL, *old = cq->ring;
	uint32_t entries, old_mask = cq->mask;
	int fd = -1, old_fd = -1, err = 0;
	uint64_t head, tail;

	if (sv_ctx_dead(ibcq->context))
		return EIO;
	if (cqe < 1 || cqe > SV_MAX_CQE)
		return EINVAL;
	entries = sv_ring_entries(cqe);
	if (entries > cq->mask + 1) {
		ring = sv_ring_create(entries, &fd);
		if (!ring)
			return errno;
	}
	sv_lock(&s->lock);
	pthread_mutex_lock(&cq->poll_lock);
	head = atomic_load(&s->head);
	tail = atomic_load(&s->tail);
	if ((uint64_t)cqe < tail - head) {
		err = EINVAL;
		goto out;
	}
	if (ring) {
		for (uint64_t k = head; k != tail; k++)
			ring[k & (entries - 1)] = old[k & old_mask];
		if (old != s->ring)
			old_fd = s->ring_fd;
		s->ring_cap = entries;
		s->ring_id = sv_next_gen(sv_proc.f, 31);
		s->ring_fd = fd;
		sv_ring_put(&sv_rings[cq->slot], &(struct sv_ring_map){.id = atomic_load(&s->id),
								       .ring_id = s->ring_id,
								       .mask = entries - 1,
								       .owned = true,
								       .ring = ring});
		cq->ring = ring;
		cq->mask = entries - 1;
		if (old_fd >= 0)
			close(old_fd);
	}
	pthread_mutex_lock(&ibcq->mutex);
	ibcq->cqe = cqe;
	pthread_mutex_unlock(&ibcq->mutex);
out:
	pthread_mutex_unlock(&cq->poll_lock);
	pthread_mutex_unlock(&s->lock);
	if (ring && err) {
		munmap(ring, sv_ring_bytes(entries));
		close(fd);
	} else if (ring && old != s->ring) {
		munmap(old, sv_ring_bytes(old_mask + 1));
	}
	return err;
}

SV_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	struct ibv_comp_channel *ch;

	if (sv_ctx_dead(context)) {
		errno = EIO;
		return NULL;
	}
	ch = calloc(1, sizeof(*ch));
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

	if (sv_ctx_dead(ibcq->context))
		return EIO;
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
static void sv_srq_release(struct sv_qp *qp);

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

	if (sv_ctx_dead(pd->context)) {
		errno = EIO;
		return NULL;
	}
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

	i = sv_qp_claim(f);
	if (i == SV_MAX_QPS) {
		err = ENOMEM;
		goto err_free;
	}
	s = &f->qps[i];
	s->pid = getpid();
	/* read by requesters that hold this slot's old QPN (sv_path_view) */
	__atomic_store_n(&s->nic, sv_ctx_nic(pd->context), __ATOMIC_RELAXED);
	s->pd = spd->id;
	__atomic_store_n(&s->epoch, sv_ctx_of(pd->context)->epoch, __ATOMIC_RELAXED); /* as nic */
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
	/* last: the slot is found by this QPN from now on */
	atomic_store(&s->qpn, (sv_next_gen(f, 24 - SV_QP_SHIFT) << SV_QP_SHIFT) | (uint32_t)i);

	qp->slot = i;
	qp->s = s;
	qp->key = sv_qp_key(s->nic, atomic_fetch_add(&sv_proc.qps_made, 1));
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

/*
 * Under qp->lock: completes everything queued with a flush error, what landed without
 * its acknowledgement too (the requester cannot know it landed).
 */
static void sv_qp_flush(struct sv_qp *qp)
{
	uint32_t head = atomic_load_explicit(&qp->sq_head, memory_order_relaxed);

	for (; head != atomic_load_explicit(&qp->sq_tail, memory_order_acquire); head++)
		sv_sq_retire(qp, head, IBV_WC_WR_FLUSH_ERR);
	qp->sq_exec = head;
	qp->nak = 0;
	sv_srq_release(qp);
	sv_rq_flush(qp);
}

static void sv_qp_set_state(struct sv_qp *qp, enum ibv_qp_state st)
{
	qp->attr.qp_state = st;
	qp->qp.state = st;
	atomic_store(&qp->s->state, st);
}

/*
 * Removes a QP's completions from a CQ, as mlx5 does when the QP goes to RESET
 * (mlx5_modify_qp -> mlx5_cq_clean): a QP reused after ERR -> RESET must not poll the
 * flushes of its last life. The others' completions stay, in order: the ones kept are
 * moved toward the tail and the head advances past the gap. Neither producers (the
 * slot's lock) nor pollers (poll_lock) run meanwhile; that is resize's order.
 */
static void sv_cq_clean(struct ibv_cq *ibcq, uint32_t qpn)
{
	struct sv_cq *cq = to_cq(ibcq);
	struct sv_cq_slot *s = cq->s;
	uint64_t head, tail, keep;

	sv_lock(&s->lock);
	pthread_mutex_lock(&cq->poll_lock);
	head = atomic_load(&s->head);
	tail = atomic_load(&s->tail);
	keep = tail;
	for (uint64_t k = tail; k != head; k--) {
		struct ibv_wc *wc = &cq->ring[(k - 1) & cq->mask];

		if (wc->qp_num == qpn)
			continue;
		keep--;
		if (keep != k - 1)
			cq->ring[keep & cq->mask] = *wc;
	}
	atomic_store_explicit(&s->head, keep, memory_order_release);
	pthread_mutex_unlock(&cq->poll_lock);
	pthread_mutex_unlock(&s->lock);
}

/* A QP entering RESET: its completions leave both of its CQs (an SRQ's receives too). */
static void sv_qp_clean_cqs(struct sv_qp *qp)
{
	sv_cq_clean(qp->qp.recv_cq, qp->qp.qp_num);
	if (qp->qp.send_cq != qp->qp.recv_cq)
		sv_cq_clean(qp->qp.send_cq, qp->qp.qp_num);
}

SV_EXPORT int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask)
{
	struct sv_qp *qp = to_qp(ibqp);
	enum ibv_qp_state cur, next;
	int rc = EINVAL;

	pthread_mutex_lock(&qp->lock);
	cur = qp->attr.qp_state;
	next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
	if (sv_ctx_dead(ibqp->context)) {
		/* As mlx5 after an internal error: ERR and RESET "succeed", nothing is flushed. */
		rc = EIO;
		if ((mask & IBV_QP_STATE) && (next == IBV_QPS_ERR || next == IBV_QPS_RESET)) {
			sv_qp_set_state(qp, next);
			if (next == IBV_QPS_RESET)
				sv_qp_clean_cqs(qp); /* mlx5 cleans in user space, dead or not */
			rc = 0;
		}
		goto out;
	}
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
	    ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr->max_rd_atomic > SV_MAX_RD_ATOM) ||
	    ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr->max_dest_rd_atomic > SV_MAX_RD_ATOM) ||
	    ((mask & IBV_QP_PKEY_INDEX) && attr->pkey_index != 0) || /* pkey_tbl_len 1 */
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
			sv_srq_release(qp);
			qp->sq_exec = atomic_load(&qp->sq_tail);
			qp->nak = 0;
			atomic_store(&qp->sq_head, qp->sq_exec);
			sv_lock(&qp->s->rq_lock);
			qp->s->rq_head = qp->s->rq_tail;
			pthread_mutex_unlock(&qp->s->rq_lock);
		}
		sv_qp_set_state(qp, next);
		if (next == IBV_QPS_ERR)
			sv_qp_flush(qp);
		else if (next == IBV_QPS_RESET)
			sv_qp_clean_cqs(qp);
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

	if (sv_ctx_dead(ibqp->context))
		return EIO;
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
	sv_srq_release(qp);
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

	if (sv_nic_dead(sv_proc.f, s->nic, s->epoch)) {
		*bad_wr = wr;
		return EIO;
	}
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
 * Under post_lock, for a request about to be published at `now`: nothing of it has
 * landed or taken the wire yet (shaping takes its turns slice by slice as it lands).
 */
static void sv_swr_queue(struct sv_swr *w, int64_t now)
{
	w->post_ns = now;
	w->first_ns = 0;
	w->due_ns = 0;
	w->done = 0;
	w->slice = 0;
}

/* After publishing: small requests go at once unless the engine is running this QP. */
static void sv_sq_kick(struct sv_qp *qp, int64_t now)
{
	int64_t wake = 0;

	if (qp->eng) {
		if (pthread_mutex_trylock(&qp->lock) == 0) {
			wake = sv_qp_step(qp, now, SV_POST_RUN, SV_POST_RUN);
			pthread_mutex_unlock(&qp->lock);
		}
		if (wake != SV_NEVER)
			sv_engine_hand(qp);
		return;
	}
	pthread_mutex_lock(&qp->lock);
	wake = sv_qp_step(qp, now, UINT64_MAX, UINT64_MAX);
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
	int64_t now = sv_now_ns();
	uint32_t tail;
	int rc = 0;

	if (sv_nic_dead(sv_proc.f, qp->s->nic, qp->s->epoch)) {
		*bad_wr = wr;
		return EIO;
	}
	if (st != IBV_QPS_RTS && st != IBV_QPS_ERR) {
		*bad_wr = wr;
		return EINVAL;
	}
	pthread_mutex_lock(&qp->post_lock);
	tail = atomic_load_explicit(&qp->sq_tail, memory_order_relaxed);
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
		sv_swr_queue(w, now);
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
	sv_sq_kick(qp, now);
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
	int st = atomic_load(&qp->s->state), rc = qp->wr_err;
	int64_t now = sv_now_ns();

	/* A dead device refuses them, as ibv_post_send does. */
	if (sv_nic_dead(sv_proc.f, qp->s->nic, qp->s->epoch))
		rc = EIO;
	if (!rc && st != IBV_QPS_RTS && st != IBV_QPS_ERR)
		rc = EINVAL;
	if (!rc) {
		for (uint32_t t = atomic_load_explicit(&qp->sq_tail, memory_order_relaxed);
		     t != qp->wr_tail; t++)
			sv_swr_queue(&qp->sq[t % qp->cap.max_send_wr], now);
		atomic_store_explicit(&qp->sq_tail, qp->wr_tail, memory_order_release);
	}
	qp->wr_cur = NULL;
	pthread_mutex_unlock(&qp->post_lock);
	if (!rc)
		sv_sq_kick(qp, now);
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

/* The bytes [off, off + len) of an iovec list, as iovecs (none of length 0) into `out`. */
static int sv_iov_range(const struct iovec *iov, int n, uint64_t off, uint64_t len,
			struct iovec *out)
{
	int k = 0;

	for (int i = 0; i < n && len; i++) {
		uint64_t l = iov[i].iov_len;

		if (off >= l) {
			off -= l;
			continue;
		}
		out[k].iov_base = (char *)iov[i].iov_base + off;
		out[k].iov_len = l - off < len ? l - off : len;
		len -= out[k].iov_len;
		off = 0;
		k++;
	}
	return k;
}

/*
 * Cuts the local side of a small write so that no piece crosses an aligned 8-byte
 * word of the target. process_vm_writev pins the target's pages once per target
 * iovec and copies the local pieces into them one after the other, each a copy of
 * its own, so the target's words land whole and in address order (NCCL's FIFO
 * entries: `idx` at offset 40 after bytes 0-39) for about 1.6 times the cost of one
 * copy; cutting the target side instead costs a page pin per word (40 times).
 */
static int sv_split_local(const struct iovec *liov, const struct iovec *riov, int nr,
			  struct iovec *out)
{
	size_t lo = 0;
	int k = 0, li = 0;

	/* One source and one target range (a write from one SGE, as NCCL's FIFO
	 * entries and small steps are): the pieces in one pass, a fifth of the
	 * general loop's time, which was about half of a 1 KiB write's extra cost. */
	if (nr == 1 && liov[0].iov_len >= riov[0].iov_len) {
		char *l = liov[0].iov_base;
		size_t n = riov[0].iov_len, off = (8 - (uintptr_t)riov[0].iov_base % 8) % 8;

		if (off > n)
			off = n;
		if (off) {
			out[k].iov_base = l;
			out[k++].iov_len = off;
		}
		for (; off < n; off += 8) {
			out[k].iov_base = l + off;
			out[k++].iov_len = n - off < 8 ? n - off : 8;
		}
		return k;
	}
	for (int ri = 0; ri < nr; ri++) {
		uintptr_t ra = (uintptr_t)riov[ri].iov_base;
		size_t rl = riov[ri].iov_len;

		while (rl) {
			size_t piece = 8 - ra % 8;

			if (piece > rl)
				piece = rl;
			if (piece > liov[li].iov_len - lo)
				piece = liov[li].iov_len - lo;
			out[k].iov_base = (char *)liov[li].iov_base + lo;
			out[k].iov_len = piece;
			k++;
			ra += piece;
			rl -= piece;
			lo += piece;
			if (lo == liov[li].iov_len) {
				li++;
				lo = 0;
			}
		}
	}
	return k;
}

/*
 * Moves `len` bytes between local iovecs and iovecs of process `pid`: to it when
 * `write`, from it otherwise; `small` writes land in order, word by word. Returns 0,
 * -ESRCH (the process is gone) or -EFAULT.
 */
static int sv_xfer(int pid, bool write, struct iovec *liov, int nl, struct iovec *riov, int nr,
		   uint64_t len, bool small)
{
	struct iovec split[SV_SMALL_WRITE / 8 + SV_MAX_SEND_SGE + SV_RQ_SGE + 2];
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
	if (write && small) {
		nl = sv_split_local(liov, riov, nr, split);
		liov = split;
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
			   unsigned need, uint64_t *addr, struct sv_mr_slot **mp)
{
	struct sv_mr_slot *m = sv_mr_find(sv_proc.f, rkey);

	if (!m || m->pid != t->pid || m->pd != t->pd || !(m->access & need) ||
	    !(atomic_load(&t->access) & need) || raddr < m->iova || raddr - m->iova > m->len ||
	    len > m->len - (raddr - m->iova))
		return false;
	*addr = m->addr + (raddr - m->iova);
	*mp = m;
	return true;
}

/* What the path of a QP does right now, seen from the requester. */
struct sv_pathv {
	struct sv_qp_slot *t; /* the responder QP; NULL when there is none that could answer */
	bool req;	      /* requests get there */
	bool ack;	      /* acknowledgements and READ responses come back */
	int jitter;	      /* ms, 0 = none */
	int bh_side;	      /* a black hole just opened: on the local (0) or remote (1) NIC */
	uint32_t bh_seq;      /* its fault_seq */
	int64_t bh_ns;	      /* and when */
};

static void sv_path_view(struct sv_qp *qp, int64_t now, struct sv_pathv *pv)
{
	struct sv_fabric *f = sv_proc.f;
	uint32_t dqpn = qp->attr.dest_qp_num;
	struct sv_qp_slot *t = &f->qps[dqpn & (SV_MAX_QPS - 1)];
	/* t's fields are read once each, atomically: the slot may be reused meanwhile
	 * (its QP destroyed, another created, as a self-test's on another thread) */
	int nic[2] = {qp->s->nic, __atomic_load_n(&t->nic, __ATOMIC_RELAXED)}, st, jit;
	enum sv_link l[2];
	unsigned loss[2], lost_req[2] = {SV_LOSE_REQ_TX, SV_LOSE_REQ_RX};

	memset(pv, 0, sizeof(*pv));
	pv->bh_side = -1;
	if (!dqpn || atomic_load(&t->qpn) != dqpn)
		return;
	st = atomic_load(&t->state);
	if ((st != IBV_QPS_RTR && st != IBV_QPS_RTS) ||
	    sv_nic_dead(f, nic[1], __atomic_load_n(&t->epoch, __ATOMIC_RELAXED)))
		return;
	/*
	 * IB: the dlid names the target's NIC. RoCE: our GRH reaches it and its GRH
	 * reaches us (the acknowledgements and read responses travel by it); a GRH that
	 * leads elsewhere is silence both ways.
	 */
	if (f->net.link == SV_LL_ROCE
		? atomic_load(&qp->s->grh_peer) != nic[1] || atomic_load(&t->grh_peer) != qp->s->nic
		: f->nics[nic[1]].lid != qp->attr.ah_attr.dlid)
		return;
	pv->t = t;
	for (int i = 0; i < 2; i++) {
		l[i] = sv_nic_link(f, nic[i], now);
		loss[i] = sv_link_loss(l[i]);
	}
	pv->req = !(loss[0] & SV_LOSE_REQ_TX) && !(loss[1] & SV_LOSE_REQ_RX);
	pv->ack = !(loss[1] & SV_LOSE_ACK_TX) && !(loss[0] & SV_LOSE_ACK_RX);
	pv->jitter = sv_nic_jitter(f, nic[0]);
	jit = sv_nic_jitter(f, nic[1]);
	if (jit > pv->jitter)
		pv->jitter = jit;
	for (int i = 0; i < 2; i++) {
		uint32_t seq;

		if (!sv_link_is_blackhole(l[i]) || !(loss[i] & lost_req[i]))
			continue;
		seq = atomic_load(&f->nics[nic[i]].fault_seq);
		if (seq == qp->bh_seq[i])
			continue;
		qp->bh_seq[i] = seq;
		pv->bh_side = i;
		pv->bh_seq = seq;
		pv->bh_ns = atomic_load(&f->nics[nic[i]].fault_ns);
	}
}

static int64_t sv_retry_deadline(struct sv_qp *qp, struct sv_swr *w)
{
	double ns = 4096.0 * (double)(1ull << qp->attr.timeout) * (qp->attr.retry_cnt + 1) *
		    sv_proc.cfg.time_scale;
	int64_t from = w->first_ns > qp->progress_ns ? w->first_ns : qp->progress_ns;

	return from + (int64_t)ns;
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
 * flushed or reset the queue meanwhile (then the receive already completed, and
 * false: the responder left RTS while the message was landing, and drops it unacked,
 * as a NIC's responder in ERR does).
 */
static bool sv_rq_consume(struct sv_qp_slot *t, uint32_t idx, const struct ibv_wc *wc)
{
	bool ok;

	sv_lock(&t->rq_lock);
	ok = t->rq_head == idx && t->rq_tail != idx;
	if (ok) {
		t->rq_head++;
		sv_cq_push(sv_proc.f, t->rcq, t->rcq_id, wc);
	}
	pthread_mutex_unlock(&t->rq_lock);
	return ok;
}

/*
 * The receive a SEND or WRITE_WITH_IMM consumes: peeked at in the target QP's own
 * queue at each slice (and consumed when the last one lands), or taken from its SRQ,
 * which other requesters take from too: then at the first slice, under the SRQ's lock,
 * and held by the requester QP until the last one completes it; a request that fails
 * after taking it completes it in error.
 */
struct sv_recv {
	struct sv_rwqe wqe;
	uint32_t idx; /* own queue: where it was */
	bool srq;
	uint32_t pd; /* the PD of its lkeys: the QP's, or the SRQ's */
};

static bool sv_recv_get(struct sv_qp *qp, struct sv_qp_slot *t, struct sv_recv *r)
{
	bool got;

	if (t->srq >= 0) {
		r->srq = true;
		r->pd = sv_proc.f->srqs[t->srq].pd;
		if (!qp->srq_held && !sv_srq_take(sv_proc.f, t->srq, t->srq_id, &qp->srq_wqe))
			return false;
		qp->srq_held = true;
		r->wqe = qp->srq_wqe;
		return true;
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

/* False when the responder's own queue was flushed or reset meanwhile (sv_rq_consume). */
static bool sv_recv_done(struct sv_qp *qp, struct sv_qp_slot *t, struct sv_recv *r,
			 const struct ibv_wc *wc)
{
	if (r->srq) {
		qp->srq_held = false;
		sv_cq_push(sv_proc.f, t->rcq, t->rcq_id, wc);
		return true;
	}
	return sv_rq_consume(t, r->idx, wc);
}

/* A request that failed after taking an SRQ receive: the receive completes in error. */
static int sv_recv_fail(struct sv_qp *qp, struct sv_qp_slot *t, struct sv_recv *r, int recv_status,
			int status)
{
	struct ibv_wc wc;

	if (r->srq) {
		sv_wc_fill(&wc, r->wqe.wr_id, recv_status, IBV_WC_RECV, 0, atomic_load(&t->qpn));
		sv_recv_done(qp, t, r, &wc);
	}
	return status;
}

/*
 * Under qp->lock: the request holding an SRQ receive will not land the rest (flushed,
 * reset, destroyed). The receive, which may hold part of its data, completes with a
 * flush error at the responder, unless that QP is gone (its receives went with it).
 */
static void sv_srq_release(struct sv_qp *qp)
{
	struct sv_fabric *f = sv_proc.f;
	uint32_t dqpn = qp->attr.dest_qp_num;
	struct sv_qp_slot *t = &f->qps[dqpn & (SV_MAX_QPS - 1)];
	struct ibv_wc wc;

	if (!qp->srq_held)
		return;
	qp->srq_held = false;
	if (!dqpn || atomic_load(&t->qpn) != dqpn)
		return;
	sv_wc_fill(&wc, qp->srq_wqe.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, dqpn);
	sv_cq_push(f, t->rcq, t->rcq_id, &wc);
}

/*
 * Lands the bytes [w->done, w->done + n) of `w` at the responder `t`; with `last`,
 * the request's receive is then consumed and completed. Checks are those of the whole
 * request. Returns 0, SV_RNR, SV_SILENT or the requester's error status.
 */
static int sv_deliver(struct sv_qp *qp, struct sv_swr *w, struct sv_qp_slot *t, uint64_t n,
		      bool last)
{
	struct sv_fabric *f = sv_proc.f;
	struct iovec liov[SV_MAX_SEND_SGE], riov[SV_RQ_SGE];
	struct iovec lpart[SV_MAX_SEND_SGE], rpart[SV_RQ_SGE];
	bool read = w->opcode == IBV_WR_RDMA_READ;
	bool needs_recv = w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM || w->opcode == IBV_WR_SEND ||
			  w->opcode == IBV_WR_SEND_WITH_IMM;
	struct sv_recv rcv = {0};
	struct sv_mr_slot *target = NULL;
	uint64_t addr = 0, cap = 0;
	int nl = (int)w->nsge, nr = 1, rc;
	struct ibv_wc wc;

	if (w->flags & IBV_SEND_INLINE) {
		liov[0].iov_base = w->inl;
		liov[0].iov_len = w->len;
		nl = 1;
	} else if (!sv_local_iov(qp, w, liov, read)) {
		return IBV_WC_LOC_PROT_ERR;
	}
	if (needs_recv && !sv_recv_get(qp, t, &rcv))
		return SV_RNR;
	switch (w->opcode) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		/* A zero-length write carries no address: the rkey is not checked. */
		if (w->len && !sv_remote_addr(t, w->rkey, w->raddr, w->len, IBV_ACCESS_REMOTE_WRITE,
					      &addr, &target))
			return sv_recv_fail(qp, t, &rcv, IBV_WC_LOC_ACCESS_ERR,
					    IBV_WC_REM_ACCESS_ERR);
		riov[0].iov_base = (void *)(uintptr_t)addr;
		riov[0].iov_len = w->len;
		break;
	case IBV_WR_RDMA_READ:
		if (!sv_remote_addr(t, w->rkey, w->raddr, w->len, IBV_ACCESS_REMOTE_READ, &addr,
				    &target))
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
				return sv_recv_fail(qp, t, &rcv, IBV_WC_LOC_PROT_ERR,
						    IBV_WC_REM_OP_ERR);
			riov[nr].iov_base = (void *)(uintptr_t)(m->addr + (g->addr - m->iova));
			riov[nr].iov_len = g->length;
			cap += g->length;
			nr++;
		}
		if (cap < w->len) {
			sv_wc_fill(&wc, rcv.wqe.wr_id, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0,
				   atomic_load(&t->qpn));
			sv_recv_done(qp, t, &rcv, &wc);
			return IBV_WC_REM_INV_REQ_ERR;
		}
		break;
	}
	/* Nothing to copy finds out whether the responder is alive: ask. */
	if (n == 0 && t->pid != getpid() && !sv_pid_alive(t->pid))
		return SV_SILENT;
	nl = sv_iov_range(liov, nl, w->done, n, lpart);
	nr = sv_iov_range(riov, nr, w->done, n, rpart);
	rc = sv_xfer(t->pid, !read, lpart, nl, rpart, nr, n, w->len <= SV_SMALL_WRITE);
	if (rc == -ESRCH)
		return SV_SILENT;
	if (rc)
		return sv_recv_fail(qp, t, &rcv, IBV_WC_LOC_ACCESS_ERR, IBV_WC_REM_ACCESS_ERR);
	/* Device memory: a write through the responder's NIC owes a flush there; a read
	 * through it orders every write it made to that process's memory (devmem.c). */
	if (read)
		sv_devmem_read(t->pid, t->nic);
	else if (target && target->dmabuf)
		sv_devmem_write(t->pid, t->nic, target, addr + w->done, n);
	/* A read response travels in the responder's traffic class. */
	if (read) {
		sv_nic_account(f, t->nic, qp->s->nic, n);
		sv_nic_account_class(f, t->nic, t->grh.traffic_class, n);
	} else {
		sv_nic_account(f, qp->s->nic, t->nic, n);
		sv_nic_account_class(f, qp->s->nic, qp->attr.ah_attr.grh.traffic_class, n);
	}
	if (last && needs_recv) {
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
		/* Its responder left RTS while it landed: no acknowledgement comes back (the
		 * requester retries), so the requester never retires a message whose receive
		 * the responder flushed. */
		if (!sv_recv_done(qp, t, &rcv, &wc))
			return SV_SILENT;
	}
	return 0;
}

/*
 * Lands what is due of `w`, in one copy of up to `max` bytes (at least one slice):
 * unshaped, that is everything; shaped, each slice (SV_SLICE bytes) first takes its
 * turn on both links and is due once its last bit has passed both. Each QP holds at
 * most one turn that is not due yet, so the QPs sharing a link alternate on it slice
 * by slice, while the copies stay large. The local turn starts where the QP's
 * previous one ended, or when the request was posted (or its jitter let it go),
 * whichever is later: an engine that gets the CPU late (by up to SV_LATE) does not lose
 * link time, as a NIC would not. The remote turn starts when the first bit left the
 * local link, or now if that is later (never from the future: a link's clock takes
 * turns in order). Returns 0 when the request is all there, SV_MORE, SV_WAIT (*wake
 * set), SV_RNR, SV_SILENT or an error status.
 */
static int sv_land(struct sv_qp *qp, struct sv_swr *w, struct sv_qp_slot *t, int64_t now,
		   uint64_t max, int64_t *wake)
{
	struct sv_fabric *f = sv_proc.f;
	bool read = w->opcode == IBV_WR_RDMA_READ;
	int rate_l = sv_nic_rate(f, qp->s->nic, sv_proc.cfg.shaping);
	int rate_r = sv_nic_rate(f, t->nic, sv_proc.cfg.shaping);
	uint64_t n = 0, left = w->len - w->done;
	int rc;

	while (n < left && (n == 0 || n + SV_SLICE <= max)) {
		uint64_t turn = left - n < SV_SLICE ? left - n : SV_SLICE;
		int64_t due;

		if ((rate_l || rate_r) && !w->slice) {
			int64_t from = qp->wire_ready;

			if (from < w->post_ns)
				from = w->post_ns;
			if (from < w->due_ns)
				from = w->due_ns;
			if (from < now - SV_LATE)
				from = now - SV_LATE;
			w->wire_ns = rate_l ? sv_nic_reserve(f, qp->s->nic, read ? SV_RX : SV_TX,
							     rate_l, turn, from)
					    : 0;
			w->start_ns = rate_l ? w->wire_ns - sv_wire_time(turn, rate_l) : from;
			w->far_ns =
			    rate_r ? sv_nic_reserve(f, t->nic, read ? SV_TX : SV_RX, rate_r, turn,
						    w->start_ns < now ? w->start_ns : now)
				   : 0;
			w->slice = turn;
		}
		if (w->slice) {
			due = w->wire_ns > w->far_ns ? w->wire_ns : w->far_ns;
			if (due > now + SV_AHEAD) {
				*wake = due;
				break;
			}
			qp->wire_ready = due;
			w->slice = 0;
		}
		n += turn;
	}
	if (n == 0 && left)
		return SV_WAIT;
	rc = sv_deliver(qp, w, t, n, n == left);
	if (rc)
		return rc;
	w->done += n;
	return w->done == w->len ? 0 : SV_MORE;
}

/*
 * A black hole just opened on the path. What was on the wire then (requests posted
 * before it, up to SOFTVERBS_INFLIGHT bytes counted from the head of the send queue)
 * may still land, in order: each request is drawn from the seed to land whole
 * (1 in 2), land in part (1 in 4: its first packets of path_mtu bytes, when it has more
 * than one), or be lost (1 in 4). Nothing behind a request that did not land whole
 * gets there, nor behind a READ (its response would have to come back through the
 * hole). What landed waits for acknowledgements that do not come.
 */
static void sv_inflight(struct sv_qp *qp, const struct sv_pathv *pv, int64_t now)
{
	uint64_t mtu = 128ull << qp->attr.path_mtu, from_head = 0;
	uint64_t what = (uint64_t)pv->bh_side << 32 | pv->bh_seq;
	uint32_t tail = atomic_load_explicit(&qp->sq_tail, memory_order_acquire);

	for (uint32_t i = atomic_load_explicit(&qp->sq_head, memory_order_relaxed);
	     i != qp->sq_exec; i++)
		from_head += qp->sq[i % qp->cap.max_send_wr].len;
	while (!qp->nak && qp->sq_exec != tail) {
		struct sv_swr *w = &qp->sq[qp->sq_exec % qp->cap.max_send_wr];
		uint64_t left = w->len - w->done, u, room, pk, fit;

		from_head += w->done;
		if (w->post_ns > pv->bh_ns || from_head >= sv_proc.cfg.inflight ||
		    w->opcode == IBV_WR_RDMA_READ)
			break;
		room = sv_proc.cfg.inflight - from_head;
		u = sv_draw(qp->key, what, qp->sq_exec);
		if (!w->first_ns)
			w->first_ns = now;
		if (u % 4 < 2 && left <= room) {
			if (sv_deliver(qp, w, pv->t, left, true))
				break;
			w->done = w->len;
			w->slice = 0;
			from_head += left;
			qp->sq_exec++;
			continue;
		}
		/* In part: whole packets, never the last one (that would be all of it). */
		fit = (left < room ? left : room) / mtu;
		if (fit >= (left + mtu - 1) / mtu)
			fit = left ? (left + mtu - 1) / mtu - 1 : 0;
		if (u % 4 == 3 || fit == 0)
			break;
		pk = u % 4 == 2 ? 1 + (u >> 8) % fit : fit;
		if (sv_deliver(qp, w, pv->t, pk * mtu, false) == 0) {
			w->done += pk * mtu;
			w->slice = 0;
		}
		break;
	}
}

/* Draws when a request may land, in order behind the request before it. */
static void sv_jitter(struct sv_qp *qp, struct sv_swr *w, int ms)
{
	int64_t due = w->post_ns + (int64_t)(sv_draw(qp->key, SV_DRAW_JITTER, qp->sq_exec) %
					     ((uint64_t)ms * 1000000));

	if (due < qp->jitter_ns)
		due = qp->jitter_ns;
	w->due_ns = qp->jitter_ns = due;
}

/*
 * Under qp->lock: completes what landed, as its acknowledgements come, oldest first;
 * each slot is free before its completion can be polled (sv_sq_retire).
 */
static void sv_ack(struct sv_qp *qp, int64_t now)
{
	uint32_t head = atomic_load_explicit(&qp->sq_head, memory_order_relaxed);

	for (; head != qp->sq_exec; head++) {
		sv_sq_retire(qp, head, IBV_WC_SUCCESS);
		qp->progress_ns = now;
	}
}

/* Under qp->lock: the oldest request fails with `status`; the QP goes to ERR. */
static void sv_qp_fail(struct sv_qp *qp, int status)
{
	sv_sq_retire(qp, atomic_load_explicit(&qp->sq_head, memory_order_relaxed), status);
	sv_qp_set_state(qp, IBV_QPS_ERR);
	sv_qp_flush(qp);
}

/*
 * Under qp->lock: the oldest request waits for an answer that does not come (a
 * silent path, an acknowledgement lost): the requester retries until its transport
 * timeout, counted from its first attempt or the last acknowledged progress, then
 * fails it with RETRY_EXC_ERR (timeout 0 = forever, as in the spec). No async event
 * for that (as mlx5).
 */
static int64_t sv_stalled(struct sv_qp *qp, int64_t now, int64_t wake)
{
	struct sv_swr *w =
	    &qp->sq[atomic_load_explicit(&qp->sq_head, memory_order_relaxed) % qp->cap.max_send_wr];
	int64_t deadline = qp->attr.timeout ? sv_retry_deadline(qp, w) : SV_NEVER;

	if (now >= deadline) {
		sv_qp_fail(qp, IBV_WC_RETRY_EXC_ERR);
		return SV_NEVER;
	}
	if (deadline < wake)
		wake = deadline;
	return wake < now + SV_RETRY_POLL ? wake : now + SV_RETRY_POLL;
}

/*
 * Under qp->lock: moves the send queue on as far as it goes now: acknowledges what
 * landed when the path answers, lands the following requests in order (a slice of a
 * large one at a time), stopping before a request longer than `max_len` or once
 * `budget` bytes went. Returns SV_NEVER when nothing is left to do (an empty queue, or
 * a dead device, which does nothing at all), otherwise when to look again (`now`: at
 * once).
 */
static int64_t sv_qp_step(struct sv_qp *qp, int64_t now, uint64_t max_len, uint64_t budget)
{
	uint32_t tail = atomic_load_explicit(&qp->sq_tail, memory_order_acquire);
	int64_t wake = SV_NEVER;
	bool stalled = false;
	uint64_t spent = 0;
	struct sv_pathv pv;

	if (atomic_load_explicit(&qp->sq_head, memory_order_relaxed) == tail ||
	    sv_nic_dead(sv_proc.f, qp->s->nic, qp->s->epoch))
		return SV_NEVER;
	if (qp->attr.qp_state == IBV_QPS_ERR) {
		sv_qp_flush(qp);
		return SV_NEVER;
	}
	sv_path_view(qp, now, &pv);
	if (pv.bh_side >= 0)
		sv_inflight(qp, &pv, now);
	/* A retransmission of what landed gets through and is acknowledged. */
	if (pv.req && pv.ack)
		sv_ack(qp, now);
	while (!qp->nak && qp->sq_exec != tail) {
		struct sv_swr *w = &qp->sq[qp->sq_exec % qp->cap.max_send_wr];
		uint64_t before = w->done;
		int rc;

		if (w->len > max_len || spent >= budget) {
			wake = now;
			break;
		}
		if (!w->first_ns)
			w->first_ns = now;
		/* A READ's data is its response: it travels the acknowledgements' way. */
		if (!pv.req || (!pv.ack && w->opcode == IBV_WR_RDMA_READ)) {
			stalled = true;
			break;
		}
		if (pv.jitter && !w->due_ns)
			sv_jitter(qp, w, pv.jitter);
		if (w->due_ns > now + SV_AHEAD) {
			wake = w->due_ns;
			break;
		}
		rc = sv_land(qp, w, pv.t, now, budget - spent, &wake);
		if (rc == SV_WAIT)
			break;
		if (rc == SV_SILENT || (rc == SV_RNR && !pv.ack)) {
			stalled = true; /* the RNR NAK is lost: a transport retry */
			break;
		}
		if (rc == SV_RNR) {
			qp->wire_ready = now; /* its stream on the wire starts again later */
			rc = sv_rnr(qp, w, now, &wake);
			if (rc == SV_WAIT)
				break;
		}
		spent += w->done - before;
		if (pv.ack)
			qp->progress_ns = now;
		if (rc == SV_MORE) {
			now = sv_now_ns();
			continue;
		}
		if (rc) {
			qp->nak = rc; /* the responder refused it; heard when the path answers */
			break;
		}
		spent += 64; /* a request costs something even when empty */
		qp->sq_exec++;
		if (pv.ack)
			sv_ack(qp, now);
		now = sv_now_ns();
	}
	if (qp->nak && pv.req && pv.ack) {
		sv_qp_fail(qp, qp->nak);
		return SV_NEVER;
	}
	if (stalled)
		qp->wire_ready = now;
	if (stalled || qp->nak ||
	    atomic_load_explicit(&qp->sq_head, memory_order_relaxed) != qp->sq_exec)
		return sv_stalled(qp, now, wake);
	return wake;
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
			w = sv_qp_step(qp, now, UINT64_MAX, UINT64_MAX);
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
 * One thread per NIC of this process runs the send queues of that NIC's QPs in
 * rounds: each QP that is due gets one step (SV_SLICE bytes) per round, so they are
 * served round-robin. A posting thread hands a QP over by setting its `ready` flag and
 * bumping the engine's futex word; the engine sleeps on that word when it has nothing
 * to do, with a timeout at the earliest time one of its QPs waits for (shaping, RNR,
 * jitter, a silent path) but no longer than SV_IDLE_TICK while any QP has work: faults
 * are set by other processes and wake nobody. After a hand-over it polls the word
 * briefly, so a stream of requests needs no wake-up system call.
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
	int busy = 0; /* QPs with work after the last round */

	/* Shaped slices land at their wire time: wake then, not 50 us later. */
	prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
	for (;;) {
		uint32_t seq = atomic_load(&e->seq);
		int64_t now = sv_now_ns(), next = SV_NEVER, spin_end;
		/*
		 * Copies are cheaper large: a QP alone with work gets SV_SOLO per round. With
		 * others waiting (for their turn on the wire too), one slice each, or the QPs
		 * first in the list would take more turns whenever the engine catches up.
		 */
		uint64_t budget = busy > 1 ? SV_SLICE : SV_SOLO;
		bool handed = false;
		struct timespec ts;

		busy = 0;
		pthread_mutex_lock(&e->lock);
		for (struct sv_qp *qp = e->qps; qp; qp = qp->eng_next) {
			bool ready = atomic_exchange(&qp->ready, false);

			if (ready || qp->eng_wake <= now) {
				pthread_mutex_lock(&qp->lock);
				qp->eng_wake = sv_qp_step(qp, now, UINT64_MAX, budget);
				pthread_mutex_unlock(&qp->lock);
				now = sv_now_ns();
				handed |= ready;
			}
			busy += qp->eng_wake != SV_NEVER;
			if (qp->eng_wake < next)
				next = qp->eng_wake;
		}
		pthread_mutex_unlock(&e->lock);
		if (next <= now)
			continue;
		if (next != SV_NEVER && next > now + SV_IDLE_TICK)
			next = now + SV_IDLE_TICK;
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
			sv_cq_rings_sweep();
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
