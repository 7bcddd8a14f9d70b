/*
 * Device memory: MRs of ibv_reg_dmabuf_mr (with SOFTVERBS_DMABUF=1) and the ordering
 * GPUDirect's flush exists for. A NIC's writes into GPU memory are PCIe posted writes;
 * the completion that tells the receiver they are done can overtake them, so NCCL
 * reads a byte back through the same NIC (an RDMA READ on a loopback QP) before the
 * GPU may use the data: the read's response is ordered behind every earlier write of
 * that NIC, and behind no other NIC's.
 *
 * Here the bytes are in memory at once. What the device tracks instead is which of
 * them a GPU could still miss: per buffer and NIC, the ranges written through that NIC
 * since an RDMA READ through it last touched that process's memory. A fault on the
 * NIC settles its ranges, and a NIC with a fault set (but jitter) owes nothing for
 * what it lands: PCIe's posted writes reach memory in microseconds, a repair takes
 * milliseconds, and a failed NIC cannot be read through. What the check is about is
 * the NICs that carry data after a repair.
 * softverbs_unflushed() answers, for a range of an MR (in its iova, as a peer
 * addresses it), which NICs still owe a flush.
 */
#include "softverbs/internal.h"
#include "softverbs/softverbs.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static void posted_drop(struct sv_fabric *f, int i)
{
	int n = atomic_load(&f->nposted) - 1;

	f->posted[i] = f->posted[n];
	atomic_store(&f->nposted, n);
}

static bool posted_settled(struct sv_fabric *f, const struct sv_posted *p)
{
	return atomic_load(&f->nics[p->nic].fault_seq) != p->fault_seq;
}

/* [lo, hi) of the buffer was written through `nic`: the bytes there that other NICs
 * wrote before are replaced (their ranges cut), and nic owes a flush for them. Under
 * posted_lock. */
static void posted_cut(struct sv_fabric *f, int pid, int nic, uint64_t dmabuf, uint64_t lo,
		       uint64_t hi)
{
	for (int i = 0; i < atomic_load(&f->nposted); i++) {
		struct sv_posted *p = &f->posted[i];

		if (p->pid != pid || p->dmabuf != dmabuf || p->nic == nic || p->hi <= lo ||
		    p->lo >= hi)
			continue;
		if (p->lo < lo &&
		    p->hi > hi) { /* split: the part above goes to a slot of its own */
			int n = atomic_load(&f->nposted);

			if (n == SV_MAX_POSTED) {
				atomic_fetch_add(&f->posted_overflow, 1);
				p->hi = lo;
				continue;
			}
			f->posted[n] = *p;
			f->posted[n].lo = hi;
			atomic_store(&f->nposted, n + 1);
			p->hi = lo;
		} else if (p->lo < lo) {
			p->hi = lo;
		} else if (p->hi > hi) {
			p->lo = hi;
		} else {
			posted_drop(f, i--);
		}
	}
}

void sv_devmem_write(int pid, int nic, const struct sv_mr_slot *m, uint64_t addr, uint64_t len)
{
	struct sv_fabric *f = sv_proc.f;
	uint64_t lo = m->dmabuf_off + (addr - m->addr), hi = lo + len;
	uint32_t seq = atomic_load(&f->nics[nic].fault_seq);
	int i, n;

	int fault = atomic_load(&f->nics[nic].fault);

	/* A NIC with a fault owes no flush: what it lands then (what was on the wire as
	 * the fault came) has reached memory long before any repair could act on it. */
	if (!len || (fault != SV_FAULT_UP && fault != SV_FAULT_JITTER))
		return;
	sv_lock(&f->posted_lock);
	posted_cut(f, pid, nic, m->dmabuf, lo, hi);
	n = atomic_load(&f->nposted);
	for (i = 0; i < n; i++) {
		struct sv_posted *p = &f->posted[i];

		if (p->pid == pid && p->nic == nic && p->dmabuf == m->dmabuf &&
		    p->fault_seq == seq && p->lo <= hi && lo <= p->hi) {
			p->lo = p->lo < lo ? p->lo : lo;
			p->hi = p->hi > hi ? p->hi : hi;
			break;
		}
	}
	if (i == n) {
		if (n == SV_MAX_POSTED) {
			atomic_fetch_add(&f->posted_overflow, 1);
		} else {
			f->posted[n] = (struct sv_posted){.pid = pid,
							  .nic = nic,
							  .fault_seq = seq,
							  .dmabuf = m->dmabuf,
							  .lo = lo,
							  .hi = hi};
			atomic_store(&f->nposted, n + 1);
		}
	}
	pthread_mutex_unlock(&f->posted_lock);
}

void sv_devmem_read(int pid, int nic)
{
	struct sv_fabric *f = sv_proc.f;

	if (!atomic_load(&f->nposted))
		return;
	sv_lock(&f->posted_lock);
	for (int i = 0; i < atomic_load(&f->nposted); i++)
		if (f->posted[i].pid == pid && f->posted[i].nic == nic)
			posted_drop(f, i--);
	pthread_mutex_unlock(&f->posted_lock);
}

SV_EXPORT int softverbs_unflushed(const struct ibv_mr *ibmr, uint64_t addr, uint64_t len,
				  uint64_t *nics, uint64_t *overflow)
{
	struct sv_fabric *f = sv_proc.f;
	const struct sv_mr *mr;
	const struct sv_mr_slot *m;
	uint64_t lo, hi, mask = 0;
	int pid = getpid(), count = 0;

	if (!f || !ibmr || !nics)
		return -EINVAL;
	mr = sv_container_of(ibmr, struct sv_mr, mr);
	m = &f->mrs[mr->slot];
	if (atomic_load(&m->key) != ibmr->lkey || m->pid != pid || !m->dmabuf)
		return -EINVAL;
	if (addr < m->iova || addr - m->iova > m->len || len > m->len - (addr - m->iova))
		return -ERANGE;
	lo = m->dmabuf_off + (addr - m->iova);
	hi = lo + len;
	sv_lock(&f->posted_lock);
	for (int i = 0; i < atomic_load(&f->nposted); i++) {
		struct sv_posted *p = &f->posted[i];

		if (posted_settled(f, p)) {
			posted_drop(f, i--);
			continue;
		}
		if (p->pid == pid && p->dmabuf == m->dmabuf && p->lo < hi && lo < p->hi &&
		    !(mask & 1ull << (f->nics[p->nic].rail & 63))) {
			mask |= 1ull << (f->nics[p->nic].rail & 63);
			count++;
		}
	}
	pthread_mutex_unlock(&f->posted_lock);
	*nics = mask;
	if (overflow)
		*overflow = atomic_load(&f->posted_overflow);
	return count;
}

/*
 * A buffer this process can map (a memfd, a udmabuf; not a GPU's: its CPU cannot
 * touch that memory, so the probe NCCL makes without SOFTVERBS_DMABUF, fd -1, is
 * still answered EOPNOTSUPP and NCCL stages through host memory).
 */
SV_EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
					   uint64_t iova, int fd, int access)
{
	long page = sysconf(_SC_PAGESIZE);
	uint64_t base = offset - offset % (uint64_t)page;
	size_t maplen = (size_t)(offset - base) + length;
	struct ibv_mr *ibmr;
	struct sv_mr *mr;
	struct stat st;
	void *map;

	if (!sv_proc.cfg.dmabuf) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (fd < 0 || fstat(fd, &st) != 0) {
		errno = EBADF;
		return NULL;
	}
	if (!length || offset + length < offset || (uint64_t)st.st_size < offset + length) {
		errno = EINVAL;
		return NULL;
	}
	map = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)base);
	if (map == MAP_FAILED)
		return NULL;
	ibmr = ibv_reg_mr_iova2(pd, (char *)map + (offset - base), length, iova, (unsigned)access);
	if (!ibmr) {
		int e = errno;

		munmap(map, maplen);
		errno = e;
		return NULL;
	}
	mr = sv_container_of(ibmr, struct sv_mr, mr);
	mr->map = map;
	mr->maplen = maplen;
	ibmr->addr = (void *)(uintptr_t)offset; /* as rdma-core sets it for a dmabuf MR */
	sv_proc.f->mrs[mr->slot].dmabuf =
	    ((uint64_t)st.st_dev << 40 ^ (uint64_t)st.st_ino) | 1ull << 63;
	sv_proc.f->mrs[mr->slot].dmabuf_off = offset;
	return ibmr;
}
