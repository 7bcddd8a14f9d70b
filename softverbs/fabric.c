/*
 * Fabric management for the software RDMA device: settings, creating and mapping
 * the shared region, registering nodes, NICs and processes, reaping what dead
 * processes left, faults (set now or scheduled by SOFTVERBS_FAULT) and the per-NIC
 * token bucket and counters. Used by the device library and by softverbs-ctl.
 */
#include "softverbs/fabric.h"
#include "softverbs/softverbs.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SV_DEFAULT_NICS	    "mlx5_0:100,mlx5_1:100,mlx5_2:100"
#define SV_DEFAULT_SEED	    1
#define SV_DEFAULT_INFLIGHT (1u << 20)

int64_t sv_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

bool sv_pid_alive(int pid)
{
	return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

/* Also true for a zombie: its memory is gone, only its parent has not waited yet. */
static bool sv_pid_gone(int pid)
{
	char path[64], buf[256], *p;
	FILE *f;
	bool gone = false;

	if (!sv_pid_alive(pid))
		return true;
	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	f = fopen(path, "r");
	if (!f)
		return false;
	if (fgets(buf, sizeof(buf), f)) {
		p = strrchr(buf, ')');
		gone = p && (p[2] == 'Z' || p[2] == 'X');
	}
	fclose(f);
	return gone;
}

void sv_lock(pthread_mutex_t *m)
{
	if (pthread_mutex_lock(m) == EOWNERDEAD)
		pthread_mutex_consistent(m);
}

void sv_mutex_init_shared(pthread_mutex_t *m)
{
	pthread_mutexattr_t a;

	pthread_mutexattr_init(&a);
	pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(m, &a);
	pthread_mutexattr_destroy(&a);
}

/* The network settings; a bad value is named on stderr and the default taken. */
static void sv_net_config_read(struct sv_config *cfg)
{
	const char *v;
	char *end;
	long n;

	cfg->net.link = SV_LL_IB;
	cfg->net.lossless_tc = -1;
	cfg->net.active_mtu = IBV_MTU_4096;
	v = getenv("SOFTVERBS_LINK");
	if (v && *v) {
		cfg->net_set = true;
		if (strcmp(v, "roce") == 0)
			cfg->net.link = SV_LL_ROCE;
		else if (strcmp(v, "ib") != 0)
			fprintf(stderr, "softverbs: SOFTVERBS_LINK=%s: want ib or roce; using ib\n",
				v);
	}
	v = getenv("SOFTVERBS_ROUTED");
	if (v && *v) {
		cfg->net_set = true;
		cfg->net.routed = strcmp(v, "0") != 0;
	}
	v = getenv("SOFTVERBS_LOSSLESS_TC");
	if (v && *v) {
		cfg->net_set = true;
		n = strtol(v, &end, 0);
		if (*end || n < 0 || n > 255)
			fprintf(stderr,
				"softverbs: SOFTVERBS_LOSSLESS_TC=%s: want a traffic class 0-255; "
				"ignored\n",
				v);
		else
			cfg->net.lossless_tc = (int)n;
	}
	v = getenv("SOFTVERBS_MTU");
	if (v && *v) {
		cfg->net_set = true;
		n = strtol(v, &end, 10);
		if (*end || n < 256 || n > 4096 || (n & (n - 1)))
			fprintf(stderr,
				"softverbs: SOFTVERBS_MTU=%s: want 256, 512, 1024, 2048 or 4096; "
				"using 4096\n",
				v);
		else
			for (cfg->net.active_mtu = IBV_MTU_256; 128l << cfg->net.active_mtu < n;)
				cfg->net.active_mtu++;
	}
}

void sv_config_read(struct sv_config *cfg)
{
	const char *v;

	memset(cfg, 0, sizeof(*cfg));
	v = getenv("SOFTVERBS_FABRIC");
	if (v && *v)
		snprintf(cfg->fabric, sizeof(cfg->fabric), "%s", v);
	else
		snprintf(cfg->fabric, sizeof(cfg->fabric), "softverbs-%u", (unsigned)getuid());
	v = getenv("SOFTVERBS_NODE");
	if (!v || !*v)
		v = getenv("NCCL_HOSTID");
	if (v && *v)
		snprintf(cfg->node, sizeof(cfg->node), "%s", v);
	else if (gethostname(cfg->node, sizeof(cfg->node) - 1) != 0)
		snprintf(cfg->node, sizeof(cfg->node), "localhost");
	v = getenv("SOFTVERBS_NICS");
	snprintf(cfg->nics, sizeof(cfg->nics), "%s", v && *v ? v : SV_DEFAULT_NICS);
	v = getenv("SOFTVERBS_TIME_SCALE");
	cfg->time_scale = v && *v ? strtod(v, NULL) : 1.0;
	if (!(cfg->time_scale > 0))
		cfg->time_scale = 1.0;
	v = getenv("SOFTVERBS_SHAPING");
	cfg->shaping = v && *v && strcmp(v, "0") != 0;
	v = getenv("SOFTVERBS_ENGINES");
	cfg->engines = !(v && *v && strcmp(v, "0") == 0);
	cfg->faults = getenv("SOFTVERBS_FAULT");
	sv_net_config_read(cfg);
	v = getenv("SOFTVERBS_SEED");
	cfg->seed = v && *v ? strtoull(v, NULL, 0) : SV_DEFAULT_SEED;
	v = getenv("SOFTVERBS_INFLIGHT");
	cfg->inflight = v && *v ? strtoull(v, NULL, 0) : SV_DEFAULT_INFLIGHT;
	v = getenv("SOFTVERBS_DMABUF");
	cfg->dmabuf = v && !strcmp(v, "1");
}

static void sv_fabric_init(struct sv_fabric *f)
{
	f->version = SV_VERSION;
	f->size = sizeof(*f);
	sv_mutex_init_shared(&f->lock);
	sv_mutex_init_shared(&f->posted_lock);
	f->start_ns = sv_now_ns();
	f->next_lid = 1;
	f->net = (struct sv_net){.link = SV_LL_IB, .lossless_tc = -1, .active_mtu = IBV_MTU_4096};
	atomic_store(&f->gen, 1);
	atomic_store_explicit(&f->magic, SV_MAGIC, memory_order_release);
}

#define SV_ATTACH_WAIT_MS 10000 /* for a fabric being made by another process */

struct sv_fabric *sv_fabric_attach(const char *name, bool create)
{
	char path[128];
	struct sv_fabric *f;
	struct stat st;
	bool creator = false;
	int fd, i;

	snprintf(path, sizeof(path), "/%s", name);
	fd = create ? shm_open(path, O_RDWR | O_CREAT | O_EXCL, 0600) : -1;
	if (fd >= 0) {
		creator = true;
		if (ftruncate(fd, sizeof(struct sv_fabric)) != 0)
			goto err_unlink;
	} else {
		if (create && errno != EEXIST)
			return NULL;
		fd = shm_open(path, O_RDWR, 0600);
		if (fd < 0)
			return NULL;
		/* The creator sizes the region right after creating it (a creator that
		 * loses its CPU on a loaded machine may take seconds: wait up to 10 s). */
		for (i = 0; i < SV_ATTACH_WAIT_MS; i++) {
			if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(struct sv_fabric))
				break;
			usleep(1000);
		}
		if ((size_t)st.st_size != sizeof(struct sv_fabric)) {
			close(fd);
			errno = EPROTO;
			return NULL;
		}
	}
	f = mmap(NULL, sizeof(*f), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (f == MAP_FAILED)
		return NULL;
	if (creator)
		sv_fabric_init(f);
	for (i = 0; i < SV_ATTACH_WAIT_MS &&
		    atomic_load_explicit(&f->magic, memory_order_acquire) != SV_MAGIC;
	     i++)
		usleep(1000);
	if (atomic_load(&f->magic) != SV_MAGIC || f->version != SV_VERSION) {
		munmap(f, sizeof(*f));
		errno = EPROTO;
		return NULL;
	}
	return f;

err_unlink:
	i = errno;
	close(fd);
	shm_unlink(path);
	errno = i;
	return NULL;
}

void sv_fabric_detach(struct sv_fabric *f)
{
	if (f)
		munmap(f, sizeof(*f));
}

int sv_fabric_remove(const char *name)
{
	char path[128];

	snprintf(path, sizeof(path), "/%s", name);
	return shm_unlink(path) == 0 ? 0 : -errno;
}

int sv_fabric_find_node(struct sv_fabric *f, const char *name)
{
	for (int i = 0; i < SV_MAX_NODES; i++)
		if (atomic_load(&f->nodes[i].used) && strcmp(f->nodes[i].name, name) == 0)
			return i;
	return -ENOENT;
}

int sv_fabric_find_nic(struct sv_fabric *f, const char *node, const char *nic)
{
	int n = sv_fabric_find_node(f, node);

	if (n < 0)
		return n;
	for (int i = 0; i < f->nodes[n].nnics; i++)
		if (strcmp(f->nics[f->nodes[n].nics[i]].name, nic) == 0)
			return f->nodes[n].nics[i];
	return -ENOENT;
}

static int sv_nic_add(struct sv_fabric *f, int node, const char *name, int gbps)
{
	struct sv_node *nd = &f->nodes[node];
	int i;

	if (nd->nnics >= SV_NICS_PER_NODE)
		return -ENOSPC;
	for (i = 0; i < SV_MAX_NICS && atomic_load(&f->nics[i].used); i++)
		;
	if (i == SV_MAX_NICS)
		return -ENOSPC;
	memset(&f->nics[i], 0, sizeof(f->nics[i]));
	f->nics[i].node = node;
	snprintf(f->nics[i].name, SV_NAME_LEN, "%s", name);
	f->nics[i].gbps = gbps;
	f->nics[i].lid = (uint16_t)f->next_lid++;
	f->nics[i].rail = (uint8_t)nd->nnics;
	f->nics[i].guid = 0x5efe000000000000ull | ((uint64_t)node << 16) | f->nics[i].lid;
	atomic_store(&f->nics[i].used, 1);
	nd->nics[nd->nnics++] = i;
	return i;
}

/* Under f->lock. */
static int sv_fabric_node(struct sv_fabric *f, const char *name, const char *spec)
{
	char buf[1024], *save = NULL, *tok;
	int n, i, rc;

	n = sv_fabric_find_node(f, name);
	if (n >= 0)
		goto out;
	for (i = 0; i < SV_MAX_NODES && atomic_load(&f->nodes[i].used); i++)
		;
	if (i == SV_MAX_NODES) {
		n = -ENOSPC;
		goto out;
	}
	n = i;
	memset(&f->nodes[n], 0, sizeof(f->nodes[n]));
	snprintf(f->nodes[n].name, SV_NAME_LEN, "%s", name);
	snprintf(buf, sizeof(buf), "%s", spec);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *colon = strchr(tok, ':');
		int gbps = 100;

		while (isspace((unsigned char)*tok))
			tok++;
		if (colon) {
			*colon = '\0';
			gbps = atoi(colon + 1);
		}
		if (!*tok || gbps <= 0) {
			fprintf(stderr,
				"softverbs: bad SOFTVERBS_NICS entry '%s' (want name:gbps)\n", tok);
			continue;
		}
		rc = sv_nic_add(f, n, tok, gbps);
		if (rc < 0) {
			fprintf(stderr, "softverbs: no room for NIC %s of node %s\n", tok, name);
			break;
		}
	}
	atomic_store(&f->nodes[n].used, 1);
out:
	return n;
}

/* A gone process's device-memory writes (devmem.c) that no flush ordered. */
static void sv_devmem_forget(struct sv_fabric *f, int pid)
{
	sv_lock(&f->posted_lock);
	for (int i = 0; i < atomic_load(&f->nposted); i++)
		if (f->posted[i].pid == pid) {
			int n = atomic_load(&f->nposted) - 1;

			f->posted[i--] = f->posted[n];
			atomic_store(&f->nposted, n);
		}
	pthread_mutex_unlock(&f->posted_lock);
}

static void sv_free_pid(struct sv_fabric *f, int pid)
{
	for (int i = 0; i < SV_MAX_MRS; i++)
		if (atomic_load(&f->mrs[i].key) && f->mrs[i].pid == pid)
			atomic_store(&f->mrs[i].key, 0);
	/* A slot being claimed may still carry its last owner's pid: left alone (a
	 * maker that died between its claim and its QPN leaves the slot taken). */
	for (int i = 0; i < SV_MAX_QPS; i++)
		if (atomic_load(&f->qps[i].qpn) && atomic_load(&f->qps[i].qpn) != SV_QPN_CLAIMED &&
		    f->qps[i].pid == pid) {
			atomic_store(&f->qps[i].state, IBV_QPS_ERR);
			atomic_store(&f->qps[i].qpn, 0);
		}
	for (int i = 0; i < SV_MAX_SRQS; i++)
		if (atomic_load(&f->srqs[i].id) && f->srqs[i].pid == pid)
			atomic_store(&f->srqs[i].id, 0);
	for (int i = 0; i < SV_MAX_CQS; i++)
		if (atomic_load(&f->cqs[i].id) && f->cqs[i].pid == pid)
			atomic_store(&f->cqs[i].id, 0);
	sv_devmem_forget(f, pid);
}

/*
 * Under f->lock: a fabric nobody is attached to any more starts afresh for the next
 * job (time origin, schedule, faults, counters, nodes), so that a fabric name used
 * again never hands a new run the NIC left down by the last one.
 */
static void sv_fabric_restart(struct sv_fabric *f, const struct sv_net *net)
{
	f->net = *net;
	for (int i = 0; i < SV_MAX_NODES; i++)
		atomic_store(&f->nodes[i].used, 0);
	for (int i = 0; i < SV_MAX_NICS; i++)
		atomic_store(&f->nics[i].used, 0);
	for (int i = 0; i < SV_MAX_SCHED; i++)
		atomic_store(&f->sched[i].state, 0);
	atomic_store(&f->sched_pending, 0);
	for (int i = 0; i < SV_MAX_MRS; i++)
		atomic_store(&f->mrs[i].key, 0);
	for (int i = 0; i < SV_MAX_QPS; i++)
		atomic_store(&f->qps[i].qpn, 0);
	for (int i = 0; i < SV_MAX_SRQS; i++)
		atomic_store(&f->srqs[i].id, 0);
	for (int i = 0; i < SV_MAX_CQS; i++)
		atomic_store(&f->cqs[i].id, 0);
	atomic_store(&f->nposted, 0);
	atomic_store(&f->posted_overflow, 0);
	f->next_lid = 1;
	f->start_ns = sv_now_ns();
}

int sv_fabric_join(struct sv_fabric *f, const struct sv_config *cfg, int *proc_p)
{
	bool empty = true;
	int n, i;

	sv_lock(&f->lock);
	for (i = 0; i < SV_MAX_PROCS; i++) {
		int pid = atomic_load(&f->procs[i].pid);

		if (pid && sv_pid_gone(pid)) {
			sv_free_pid(f, pid);
			atomic_store(&f->procs[i].pid, 0);
		} else if (pid) {
			empty = false;
		}
	}
	if (empty)
		sv_fabric_restart(f, &cfg->net);
	else if (cfg->net_set && memcmp(&cfg->net, &f->net, sizeof(f->net)) != 0)
		fprintf(stderr,
			"softverbs: fabric %s keeps the network of its first process (link %s, "
			"routed %d, lossless_tc %d, mtu %d); this process's SOFTVERBS_LINK/ROUTED/"
			"LOSSLESS_TC/MTU differ and are ignored\n",
			cfg->fabric, sv_link_layer_name(f->net.link), f->net.routed,
			f->net.lossless_tc, 128 << f->net.active_mtu);
	n = sv_fabric_node(f, cfg->node, cfg->nics);
	if (n < 0)
		goto out;
	for (i = 0; i < SV_MAX_PROCS && atomic_load(&f->procs[i].pid); i++)
		;
	if (i == SV_MAX_PROCS) {
		n = -ENOSPC;
		goto out;
	}
	f->procs[i].node = n;
	atomic_store(&f->procs[i].pid, (int)getpid());
	*proc_p = i;
out:
	pthread_mutex_unlock(&f->lock);
	return n;
}

int sv_fabric_reap(struct sv_fabric *f)
{
	int n = 0;
	bool any = false;

	/* Look without the lock first: every progress thread reaps five times a
	 * second, and with many processes the /proc reads under the fabric lock
	 * would hold up every QP and CQ creation. */
	for (int i = 0; i < SV_MAX_PROCS && !any; i++) {
		int pid = atomic_load(&f->procs[i].pid);

		any = pid && sv_pid_gone(pid);
	}
	if (!any)
		return 0;
	sv_lock(&f->lock);
	for (int i = 0; i < SV_MAX_PROCS; i++) {
		int pid = atomic_load(&f->procs[i].pid);

		if (pid && sv_pid_gone(pid)) {
			sv_free_pid(f, pid);
			atomic_store(&f->procs[i].pid, 0);
			n++;
		}
	}
	pthread_mutex_unlock(&f->lock);
	return n;
}

static const char *const sv_fault_names[SV_FAULT_KINDS] = {
    [SV_FAULT_UP] = "up",
    [SV_FAULT_DOWN] = "down",
    [SV_FAULT_BLACKHOLE] = "blackhole",
    [SV_FAULT_FLAP] = "flap",
    [SV_FAULT_SLOW] = "slow",
    [SV_FAULT_ACKLOSS] = "ackloss",
    [SV_FAULT_BLACKHOLE_TX] = "blackhole-tx",
    [SV_FAULT_BLACKHOLE_RX] = "blackhole-rx",
    [SV_FAULT_FATAL] = "fatal",
    [SV_FAULT_JITTER] = "jitter",
};

const char *sv_fault_name(int kind)
{
	return kind >= 0 && kind < SV_FAULT_KINDS ? sv_fault_names[kind] : "?";
}

int sv_fault_parse(const char *word, int *kind)
{
	for (int i = 0; i < SV_FAULT_KINDS; i++)
		if (strcmp(word, sv_fault_names[i]) == 0) {
			*kind = i;
			return 0;
		}
	return -EINVAL;
}

/* flap PERIOD_MS, slow GBPS and jitter MS take a positive number. */
bool sv_fault_takes_arg(int kind)
{
	return kind == SV_FAULT_FLAP || kind == SV_FAULT_SLOW || kind == SV_FAULT_JITTER;
}

/*
 * Every kind replaces the one before (`up` clears them all). The sequence number
 * marks the moment, so each QP handles a black hole opening once; a fatal fault
 * moves the NIC to a new epoch, which leaves every context opened before it dead
 * even after `up`.
 */
void sv_fabric_set_fault(struct sv_fabric *f, int nic, int kind, int arg)
{
	struct sv_nic *n = &f->nics[nic];

	atomic_store(&n->fault_arg, arg);
	atomic_store(&n->fault_ns, sv_now_ns());
	if (kind == SV_FAULT_FATAL)
		atomic_fetch_add(&n->epoch, 1);
	atomic_fetch_add(&n->fault_seq, 1);
	atomic_store(&n->fault, kind);
}

/*
 * SOFTVERBS_FAULT="node/nic=kind[:arg]@ms;..." — kind as for softverbs-ctl, the time
 * in ms after the fabric was created. Entries already scheduled (same text) are not
 * added twice, so every process of a job may carry the same setting.
 */
int sv_fabric_schedule(struct sv_fabric *f, const char *spec)
{
	char buf[1024], *save = NULL, *tok;
	int added = 0;

	snprintf(buf, sizeof(buf), "%s", spec);
	for (tok = strtok_r(buf, ";", &save); tok; tok = strtok_r(NULL, ";", &save)) {
		char node[SV_NAME_LEN], nic[SV_NAME_LEN], what[32];
		int kind, arg = 0, i, dup = 0;
		long at = 0;
		char *at_p = strchr(tok, '@'), *colon;

		if (at_p) {
			*at_p = '\0';
			at = atol(at_p + 1);
		}
		if (sscanf(tok, " %63[^/]/%63[^=]=%31s", node, nic, what) != 3)
			goto bad;
		colon = strchr(what, ':');
		if (colon) {
			*colon = '\0';
			arg = atoi(colon + 1);
		}
		if (sv_fault_parse(what, &kind) != 0)
			goto bad;
		if (sv_fault_takes_arg(kind) ? arg <= 0 : colon != NULL)
			goto bad;
		sv_lock(&f->lock);
		for (i = 0; i < SV_MAX_SCHED; i++) {
			struct sv_sched *s = &f->sched[i];

			if (atomic_load(&s->state) && !strcmp(s->node, node) &&
			    !strcmp(s->nic, nic) && s->kind == kind && s->arg == arg &&
			    s->at_ns == f->start_ns + at * 1000000)
				dup = 1;
		}
		for (i = 0; !dup && i < SV_MAX_SCHED; i++) {
			struct sv_sched *s = &f->sched[i];

			if (atomic_load(&s->state))
				continue;
			snprintf(s->node, SV_NAME_LEN, "%s", node);
			snprintf(s->nic, SV_NAME_LEN, "%s", nic);
			s->kind = kind;
			s->arg = arg;
			s->at_ns = f->start_ns + at * 1000000;
			atomic_store(&s->state, 2);
			atomic_fetch_add(&f->sched_pending, 1);
			added++;
			break;
		}
		pthread_mutex_unlock(&f->lock);
		continue;
	bad:
		fprintf(stderr,
			"softverbs: bad SOFTVERBS_FAULT entry '%s' (want "
			"node/nic=KIND[:ARG]@MS, KIND down|blackhole|blackhole-tx|blackhole-rx|"
			"ackloss|fatal|up|flap:MS|slow:GBPS|jitter:MS)\n",
			tok);
	}
	return added;
}

void sv_fabric_sched_apply(struct sv_fabric *f, int64_t now)
{
	if (atomic_load_explicit(&f->sched_pending, memory_order_relaxed) == 0)
		return;
	for (int i = 0; i < SV_MAX_SCHED; i++) {
		struct sv_sched *s = &f->sched[i];
		int expect = 2, nic;

		if (atomic_load(&s->state) != 2 || s->at_ns > now)
			continue;
		nic = sv_fabric_find_nic(f, s->node, s->nic);
		if (nic < 0)
			continue;
		if (atomic_compare_exchange_strong(&s->state, &expect, 3)) {
			sv_fabric_set_fault(f, nic, s->kind, s->arg);
			atomic_fetch_sub(&f->sched_pending, 1);
		}
	}
}

enum sv_link sv_nic_link(struct sv_fabric *f, int nic, int64_t now)
{
	struct sv_nic *n = &f->nics[nic];
	int64_t period;

	sv_fabric_sched_apply(f, now);
	switch (atomic_load(&n->fault)) {
	case SV_FAULT_DOWN:
		return SV_LINK_DOWN;
	case SV_FAULT_BLACKHOLE:
		return SV_LINK_BLACKHOLE;
	case SV_FAULT_BLACKHOLE_TX:
		return SV_LINK_BLACKHOLE_TX;
	case SV_FAULT_BLACKHOLE_RX:
		return SV_LINK_BLACKHOLE_RX;
	case SV_FAULT_ACKLOSS:
		return SV_LINK_ACKLOSS;
	case SV_FAULT_FATAL:
		return SV_LINK_DEAD;
	case SV_FAULT_FLAP:
		period = (int64_t)atomic_load(&n->fault_arg) * 1000000;
		if (period <= 0)
			return SV_LINK_DOWN;
		return ((now - atomic_load(&n->fault_ns)) / period) % 2 == 0 ? SV_LINK_DOWN
									     : SV_LINK_UP;
	default:
		return SV_LINK_UP;
	}
}

bool sv_nic_dead(struct sv_fabric *f, int nic, uint32_t epoch)
{
	struct sv_nic *n = &f->nics[nic];

	return atomic_load(&n->fault) == SV_FAULT_FATAL || atomic_load(&n->epoch) != epoch;
}

int sv_nic_jitter(struct sv_fabric *f, int nic)
{
	struct sv_nic *n = &f->nics[nic];

	return atomic_load(&n->fault) == SV_FAULT_JITTER ? atomic_load(&n->fault_arg) : 0;
}

int sv_nic_rate(struct sv_fabric *f, int nic, bool shaping)
{
	struct sv_nic *n = &f->nics[nic];
	int rate = shaping ? n->gbps : 0;

	if (atomic_load(&n->fault) == SV_FAULT_SLOW) {
		int slow = atomic_load(&n->fault_arg);

		if (rate == 0 || slow < rate)
			rate = slow;
	}
	return rate;
}

int64_t sv_nic_reserve(struct sv_fabric *f, int nic, enum sv_dir dir, int gbps, uint64_t bytes,
		       int64_t from)
{
	_Atomic int64_t *clock = &f->nics[nic].shape_ns[dir];
	int64_t dur = sv_wire_time(bytes, gbps);
	int64_t next = atomic_load(clock), start;

	do {
		start = next > from ? next : from;
	} while (!atomic_compare_exchange_weak(clock, &next, start + dur));
	return start + dur;
}

void sv_nic_account(struct sv_fabric *f, int from, int to, uint64_t bytes)
{
	uint64_t mtu = 128u << f->net.active_mtu;
	uint64_t pkts = bytes ? (bytes + mtu - 1) / mtu : 1;

	atomic_fetch_add_explicit(&f->nics[from].tx_bytes, bytes, memory_order_relaxed);
	atomic_fetch_add_explicit(&f->nics[from].tx_packets, pkts, memory_order_relaxed);
	atomic_fetch_add_explicit(&f->nics[to].rx_bytes, bytes, memory_order_relaxed);
	atomic_fetch_add_explicit(&f->nics[to].rx_packets, pkts, memory_order_relaxed);
}

int sv_fabric_nic_stats(struct sv_fabric *f, const char *node, struct softverbs_nic_stat *out,
			int max)
{
	int n = 0;

	for (int i = 0; i < SV_MAX_NICS && n < max; i++) {
		struct sv_nic *nic = &f->nics[i];

		if (!atomic_load(&nic->used))
			continue;
		if (node && strcmp(f->nodes[nic->node].name, node) != 0)
			continue;
		memset(&out[n], 0, sizeof(out[n]));
		snprintf(out[n].node, sizeof(out[n].node), "%s", f->nodes[nic->node].name);
		snprintf(out[n].name, sizeof(out[n].name), "%s", nic->name);
		out[n].gbps = nic->gbps;
		out[n].state = atomic_load(&nic->fault);
		out[n].tx_bytes = atomic_load(&nic->tx_bytes);
		out[n].rx_bytes = atomic_load(&nic->rx_bytes);
		out[n].tx_packets = atomic_load(&nic->tx_packets);
		out[n].rx_packets = atomic_load(&nic->rx_packets);
		n++;
	}
	return n;
}
