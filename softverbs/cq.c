/*
 * Completion queues of the software RDMA device: their rings (in the CQ's slot of the
 * fabric, or a memfd of their own for a large CQ), placing a completion (sv_cq_push, by
 * whichever process executes the request), polling, resizing, and completion channels,
 * woken by the process that places the completion.
 */
#include "softverbs/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

uint32_t sv_next_gen(struct sv_fabric *f, unsigned bits)
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

static int cq_hint;

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
