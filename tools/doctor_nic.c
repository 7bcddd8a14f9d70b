/*
 * The NICs and GPUs of `r2cc doctor`. libibverbs is dlopen()ed the way NCCL
 * does it (libibverbs.so, then libibverbs.so.1, every function through
 * dlvsym(..., "IBVERBS_1.1")), so the doctor sees exactly the devices NCCL
 * would see, the software device included. sysfs adds what verbs does not
 * say: PCI path, NUMA node, driver, RoCE GID types; GPUs come from sysfs too
 * (vendor 0x10de), so no CUDA is needed.
 */
#include "tools/doctor.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

typedef struct ibv_device **(*get_device_list_fn)(int *);
typedef void (*free_device_list_fn)(struct ibv_device **);
typedef const char *(*get_device_name_fn)(struct ibv_device *);
typedef struct ibv_context *(*open_device_fn)(struct ibv_device *);
typedef int (*close_device_fn)(struct ibv_context *);
typedef int (*query_device_fn)(struct ibv_context *, struct ibv_device_attr *);
typedef int (*query_port_fn)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
typedef int (*query_gid_fn)(struct ibv_context *, uint8_t, int, union ibv_gid *);

struct verbs {
	void *handle;
	get_device_list_fn get_device_list;
	free_device_list_fn free_device_list;
	get_device_name_fn get_device_name;
	open_device_fn open_device;
	close_device_fn close_device;
	query_device_fn query_device;
	query_port_fn query_port;
	query_gid_fn query_gid;
};

static void *sym(void *h, const char *name)
{
	void *p = dlvsym(h, name, "IBVERBS_1.1");
	return p ? p : dlsym(h, name);
}

static int verbs_load(struct dr_state *st, struct verbs *v, char *err, size_t errlen)
{
	static const char *const names[] = {"libibverbs.so", "libibverbs.so.1"};
	Dl_info info;

	memset(v, 0, sizeof(*v));
	if (st->ibverbs_path) {
		v->handle = dlopen(st->ibverbs_path, RTLD_NOW | RTLD_LOCAL);
	} else {
		for (size_t i = 0; i < 2 && !v->handle; i++)
			v->handle = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	}
	if (!v->handle) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "not found");
		return -ENOENT;
	}
	v->get_device_list = (get_device_list_fn)sym(v->handle, "ibv_get_device_list");
	v->free_device_list = (free_device_list_fn)sym(v->handle, "ibv_free_device_list");
	v->get_device_name = (get_device_name_fn)sym(v->handle, "ibv_get_device_name");
	v->open_device = (open_device_fn)sym(v->handle, "ibv_open_device");
	v->close_device = (close_device_fn)sym(v->handle, "ibv_close_device");
	v->query_device = (query_device_fn)sym(v->handle, "ibv_query_device");
	v->query_port = (query_port_fn)sym(v->handle, "ibv_query_port");
	v->query_gid = (query_gid_fn)sym(v->handle, "ibv_query_gid");
	if (dladdr((void *)v->get_device_list, &info) && info.dli_fname)
		dr_copy(st->verbs_lib, sizeof(st->verbs_lib), info.dli_fname);
	if (!v->get_device_list || !v->free_device_list || !v->get_device_name || !v->open_device ||
	    !v->close_device || !v->query_device || !v->query_port || !v->query_gid) {
		snprintf(err, errlen, "%s lacks the IBVERBS_1.1 functions NCCL needs",
			 st->verbs_lib[0] ? st->verbs_lib : "the library");
		return -ENOSYS;
	}
	return 0;
}

static const char *port_state_str(enum ibv_port_state s)
{
	switch (s) {
	case IBV_PORT_NOP:
		return "NOP";
	case IBV_PORT_DOWN:
		return "DOWN";
	case IBV_PORT_INIT:
		return "INIT";
	case IBV_PORT_ARMED:
		return "ARMED";
	case IBV_PORT_ACTIVE:
		return "ACTIVE";
	case IBV_PORT_ACTIVE_DEFER:
		return "ACTIVE_DEFER";
	}
	return "UNKNOWN";
}

/* Per-lane rate (Gb/s) and name of ibv_port_attr.active_speed. */
static void speed_of(unsigned speed, unsigned width, double *gbps, char *str, size_t len)
{
	static const struct {
		unsigned code;
		double gbps;
		const char *name;
	} sp[] = {{1, 2.5, "SDR"}, {2, 5, "DDR"},   {4, 10, "QDR"},  {8, 10, "FDR10"},
		  {16, 14, "FDR"}, {32, 25, "EDR"}, {64, 50, "HDR"}, {128, 100, "NDR"}};
	static const struct {
		unsigned code, lanes;
	} wd[] = {{1, 1}, {2, 4}, {4, 8}, {8, 12}, {16, 2}};
	double lane = 0;
	unsigned lanes = 0;
	const char *name = "?";

	for (size_t i = 0; i < sizeof(sp) / sizeof(sp[0]); i++)
		if (sp[i].code == speed) {
			lane = sp[i].gbps;
			name = sp[i].name;
		}
	for (size_t i = 0; i < sizeof(wd) / sizeof(wd[0]); i++)
		if (wd[i].code == width)
			lanes = wd[i].lanes;
	*gbps = lane * lanes;
	snprintf(str, len, "%uX %s", lanes, name);
}

static const char *link_layer_str(uint8_t ll)
{
	switch (ll) {
	case IBV_LINK_LAYER_ETHERNET:
		return "Ethernet";
	case IBV_LINK_LAYER_INFINIBAND:
	case IBV_LINK_LAYER_UNSPECIFIED:
	default:
		return "InfiniBand";
	}
}

/* sysfs facts of the device: PCI path, NUMA node, driver. No device link
 * means a software device. */
static void sysfs_device(const struct dr_state *st, struct dr_nic *n)
{
	char p[PATH_MAX], real[PATH_MAX], buf[64];
	ssize_t r;

	n->numa = -1;
	dr_path(st, p, sizeof(p), "/sys/class/infiniband/%s/device", n->dev);
	if (!realpath(p, real)) {
		n->soft = true;
		return;
	}
	dr_copy(n->pci_path, sizeof(n->pci_path), real);
	dr_copy(n->pci, sizeof(n->pci), strrchr(real, '/') + 1);
	dr_path(st, p, sizeof(p), "/sys/class/infiniband/%s/device/numa_node", n->dev);
	if (dr_read_line(p, buf, sizeof(buf)) == 0)
		n->numa = atoi(buf);
	dr_path(st, p, sizeof(p), "/sys/class/infiniband/%s/device/driver", n->dev);
	r = readlink(p, real, sizeof(real) - 1);
	if (r > 0) {
		real[r] = '\0';
		dr_copy(n->driver, sizeof(n->driver),
			strrchr(real, '/') ? strrchr(real, '/') + 1 : real);
	}
}

/* The sysfs rate ("400 Gb/sec (4X NDR)") knows speeds newer than the
 * compat port struct (active_speed_ex). */
static void sysfs_rate(const struct dr_state *st, struct dr_nic *n)
{
	char p[PATH_MAX], buf[96];
	double g;

	dr_path(st, p, sizeof(p), "/sys/class/infiniband/%s/ports/%d/rate", n->dev, n->port);
	if (dr_read_line(p, buf, sizeof(buf)) || sscanf(buf, "%lf", &g) != 1 || g <= 0)
		return;
	n->gbps = g;
	char *l = strchr(buf, '('), *r = strchr(buf, ')');
	if (l && r && r > l + 1) {
		*r = '\0';
		dr_copy(n->speed_str, sizeof(n->speed_str), l + 1);
	}
}

static bool gid_is_zero(const char *s)
{
	for (; *s; s++)
		if (*s != '0' && *s != ':')
			return false;
	return true;
}

/*
 * The GID index NCCL picks for RoCE when NCCL_IB_GID_INDEX is unset: the first
 * GID of the wanted RoCE version (NCCL_IB_ROCE_VERSION_NUM, default 2) whose
 * address is of the wanted family (NCCL_IB_ADDR_FAMILY, default AF_INET, i.e.
 * an IPv4-mapped GID).
 */
static void roce_gid(const struct dr_state *st, struct dr_nic *n, int tbl_len)
{
	const char *ver = getenv("NCCL_IB_ROCE_VERSION_NUM");
	const char *fam = getenv("NCCL_IB_ADDR_FAMILY");
	bool want_v1 = ver && atoi(ver) == 1;
	bool want_v6 = fam && !strcasecmp(fam, "AF_INET6");
	char p[PATH_MAX], type[32], gid[64];

	n->gid_index = -1;
	for (int i = 0; i < tbl_len && i < 256; i++) {
		dr_path(st, p, sizeof(p), "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d",
			n->dev, n->port, i);
		if (dr_read_line(p, type, sizeof(type)))
			continue;
		if (want_v1 ? strcasecmp(type, "IB/RoCE v1") && strcasecmp(type, "RoCE v1")
			    : strcasecmp(type, "RoCE v2"))
			continue;
		dr_path(st, p, sizeof(p), "/sys/class/infiniband/%s/ports/%d/gids/%d", n->dev,
			n->port, i);
		if (dr_read_line(p, gid, sizeof(gid)) || gid_is_zero(gid))
			continue;
		bool v4 = !strncmp(gid, "0000:0000:0000:0000:0000:ffff:", 30);
		if (v4 == want_v6)
			continue;
		n->gid_index = i;
		dr_copy(n->gid, sizeof(n->gid), gid);
		dr_path(st, p, sizeof(p), "/sys/class/infiniband/%s/ports/%d/gid_attrs/ndevs/%d",
			n->dev, n->port, i);
		dr_read_line(p, n->netdev, sizeof(n->netdev));
		return;
	}
}

static void scan_port(struct dr_state *st, struct verbs *v, struct ibv_context *ctx,
		      const char *dev, int port, int nports, const char *fw)
{
	struct dr_nic *n;
	struct ibv_port_attr pa;
	union ibv_gid gid;
	const char *hca = getenv("NCCL_IB_HCA");

	if (st->nnics >= DR_MAX_NICS)
		return;
	n = &st->nics[st->nnics++];
	memset(n, 0, sizeof(*n));
	dr_copy(n->dev, sizeof(n->dev), dev);
	if (nports > 1)
		snprintf(n->name, sizeof(n->name), "%s:%d", dev, port);
	else
		dr_copy(n->name, sizeof(n->name), dev);
	n->port = port;
	n->gid_index = -1;
	dr_copy(n->fw, sizeof(n->fw), fw);
	sysfs_device(st, n);
	n->nccl_uses = !hca || !*hca || dr_nccl_match(hca, dev, port);
	memset(&pa, 0, sizeof(pa));
	if (v->query_port(ctx, (uint8_t)port, &pa)) {
		snprintf(n->query_err, sizeof(n->query_err), "ibv_query_port: %s", strerror(errno));
		snprintf(n->state, sizeof(n->state), "UNKNOWN");
		return;
	}
	n->active = pa.state == IBV_PORT_ACTIVE;
	dr_copy(n->state, sizeof(n->state), port_state_str(pa.state));
	speed_of(pa.active_speed, pa.active_width, &n->gbps, n->speed_str, sizeof(n->speed_str));
	sysfs_rate(st, n);
	dr_copy(n->link_layer, sizeof(n->link_layer), link_layer_str(pa.link_layer));
	n->lid = pa.lid;
	n->sm_lid = pa.sm_lid;
	n->mtu = pa.active_mtu >= IBV_MTU_256 && pa.active_mtu <= IBV_MTU_4096
		     ? 128 << pa.active_mtu
		     : 0;
	if (pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
		roce_gid(st, n, pa.gid_tbl_len);
	} else if (v->query_gid(ctx, (uint8_t)port, 0, &gid) == 0) {
		const uint8_t *b = gid.raw;
		snprintf(n->gid, sizeof(n->gid),
			 "%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x",
			 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
			 b[12], b[13], b[14], b[15]);
	}
}

void dr_scan_nics(struct dr_state *st)
{
	struct verbs v;
	struct ibv_device **list;
	char err[512];
	int num = 0;
	struct dr_check *c;

	st->verbs_ndev = -1;
	if (verbs_load(st, &v, err, sizeof(err))) {
		c = dr_add(st, DR_SEC_NIC, DR_FAIL, "libibverbs", "cannot load libibverbs: %s",
			   err);
		dr_explain(c,
			   "no RDMA user-space stack (rdma-core) is installed or found, so NCCL "
			   "cannot use any RDMA NIC and falls back to TCP sockets: there is "
			   "nothing for R2CC to repair",
			   "install rdma-core (apt-get install libibverbs1 ibverbs-providers "
			   "ibverbs-utils | yum install rdma-core libibverbs-utils); without "
			   "hardware, use the software device: "
			   "export LD_LIBRARY_PATH=$PWD/build/softverbs:$LD_LIBRARY_PATH");
		return;
	}
	errno = 0;
	list = v.get_device_list(&num);
	if (!list && (errno == ENOSYS || errno == ENODEV || errno == 0)) {
		/* rdma-core without kernel RDMA support (no ib_uverbs): no devices. */
		st->verbs_ndev = 0;
		snprintf(st->verbs_why, sizeof(st->verbs_why),
			 "ibv_get_device_list: %s, i.e. no uverbs device in the kernel",
			 strerror(errno ? errno : ENODEV));
		return;
	}
	if (!list) {
		c = dr_add(st, DR_SEC_NIC, DR_FAIL, "devices",
			   "ibv_get_device_list failed (%s) in %s",
			   strerror(errno ? errno : ENODEV), st->verbs_lib);
		dr_explain(c, "libibverbs loads but cannot list devices",
			   "check /dev/infiniband (containers: --device=/dev/infiniband "
			   "--cap-add=IPC_LOCK); for the software device, SOFTVERBS_FABRIC must "
			   "name a usable fabric (build/bin/softverbs-ctl --fabric NAME reset)");
		return;
	}
	st->verbs_ndev = num;
	for (int i = 0; i < num; i++) {
		const char *name = v.get_device_name(list[i]);
		struct ibv_context *ctx = v.open_device(list[i]);
		struct ibv_device_attr da;

		if (!ctx) {
			if (st->nnics < DR_MAX_NICS) {
				struct dr_nic *n = &st->nics[st->nnics++];
				memset(n, 0, sizeof(*n));
				dr_copy(n->name, sizeof(n->name), name ? name : "?");
				dr_copy(n->dev, sizeof(n->dev), n->name);
				snprintf(n->state, sizeof(n->state), "UNKNOWN");
				snprintf(n->query_err, sizeof(n->query_err), "ibv_open_device: %s",
					 strerror(errno));
				n->gid_index = -1;
				n->port = 1;
				sysfs_device(st, n);
			}
			continue;
		}
		memset(&da, 0, sizeof(da));
		if (v.query_device(ctx, &da) || da.phys_port_cnt == 0)
			da.phys_port_cnt = 1;
		for (int p = 1; p <= da.phys_port_cnt; p++)
			scan_port(st, &v, ctx, name, p, da.phys_port_cnt, da.fw_ver);
		v.close_device(ctx);
	}
	v.free_device_list(list);
	/* The library stays loaded: a provider's threads may still be winding down. */
}

/* Number of leading components two sysfs device paths share. */
static int common_depth(const char *root, const char *a, const char *b)
{
	size_t lr = strlen(root);
	int depth = 0;

	if (lr && !strncmp(a, root, lr) && !strncmp(b, root, lr)) {
		a += lr;
		b += lr;
	}
	if (strncmp(a, "/sys/devices/", 13) == 0 && strncmp(b, "/sys/devices/", 13) == 0) {
		a += 13;
		b += 13;
	}
	for (;;) {
		size_t la = strcspn(a, "/"), lb = strcspn(b, "/");
		if (la != lb || la == 0 || strncmp(a, b, la))
			return depth;
		depth++;
		a += la;
		b += lb;
		if (*a != '/' || *b != '/')
			return depth;
		a++;
		b++;
	}
}

void dr_scan_gpus(struct dr_state *st)
{
	char dir[PATH_MAX], p[PATH_MAX + 300], buf[256];
	struct dirent *e;
	DIR *d;

	dr_path(st, dir, sizeof(dir), "/sys/bus/pci/devices");
	d = opendir(dir);
	if (d) {
		while ((e = readdir(d)) && st->ngpus < DR_MAX_GPUS) {
			if (e->d_name[0] == '.')
				continue;
			snprintf(p, sizeof(p), "%s/%s/vendor", dir, e->d_name);
			if (dr_read_line(p, buf, sizeof(buf)) || strcasecmp(buf, "0x10de"))
				continue;
			snprintf(p, sizeof(p), "%s/%s/class", dir, e->d_name);
			if (dr_read_line(p, buf, sizeof(buf)) ||
			    (strncmp(buf, "0x0302", 6) && strncmp(buf, "0x0300", 6)))
				continue;
			struct dr_gpu *g = &st->gpus[st->ngpus++];
			memset(g, 0, sizeof(*g));
			dr_copy(g->pci, sizeof(g->pci), e->d_name);
			snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
			if (!realpath(p, g->path))
				dr_copy(g->path, sizeof(g->path), p);
			snprintf(p, sizeof(p), "%s/%s/numa_node", dir, e->d_name);
			g->numa = dr_read_line(p, buf, sizeof(buf)) ? -1 : atoi(buf);
			dr_path(st, p, sizeof(p), "/proc/driver/nvidia/gpus/%s/information",
				e->d_name);
			FILE *f = fopen(p, "r");
			while (f && fgets(buf, sizeof(buf), f)) {
				if (strncmp(buf, "Model:", 6))
					continue;
				char *m = buf + 6;
				m += strspn(m, " \t");
				m[strcspn(m, "\n")] = '\0';
				dr_copy(g->model, sizeof(g->model), m);
			}
			if (f)
				fclose(f);
		}
		closedir(d);
	}
	dr_path(st, p, sizeof(p), "/sys/module/nvidia_peermem");
	st->gdr_peermem = access(p, F_OK) == 0;
	if (!st->gdr_peermem) {
		dr_path(st, p, sizeof(p), "/proc/modules");
		FILE *f = fopen(p, "r");
		while (f && fgets(buf, sizeof(buf), f))
			if (!strncmp(buf, "nvidia_peermem ", 15))
				st->gdr_peermem = true;
		if (f)
			fclose(f);
	}
	dr_path(st, p, sizeof(p), "/sys/kernel/mm/memory_peers");
	st->gdr_memory_peers = access(p, F_OK) == 0;

	/*
	 * The nearest GPU of each NIC: deepest shared PCI ancestor, then NUMA node.
	 * Sharing a root port means sharing the switch behind it (a root port
	 * has one link).
	 */
	char root[PATH_MAX] = "";
	if (st->sysroot && *st->sysroot && !realpath(st->sysroot, root))
		root[0] = '\0';
	for (int i = 0; i < st->nnics; i++) {
		struct dr_nic *n = &st->nics[i];
		int best = -1, best_depth = -1;

		if (n->soft || !n->pci_path[0])
			continue;
		for (int j = 0; j < st->ngpus; j++) {
			int depth = common_depth(root, n->pci_path, st->gpus[j].path) * 2 +
				    (n->numa >= 0 && n->numa == st->gpus[j].numa);
			if (depth > best_depth) {
				best_depth = depth;
				best = j;
			}
		}
		if (best < 0)
			continue;
		dr_copy(n->gpu, sizeof(n->gpu), st->gpus[best].pci);
		int depth = best_depth / 2;
		snprintf(n->gpu_rel, sizeof(n->gpu_rel), "%s",
			 depth >= 2	  ? "same PCIe switch (PIX/PXB)"
			 : depth == 1	  ? "same host bridge (PHB)"
			 : best_depth & 1 ? "same NUMA node (NODE)"
					  : "other CPU socket (SYS)");
	}
}

void dr_check_nics(struct dr_state *st)
{
	struct dr_check *c;

	if (st->verbs_ndev < 0)
		return;
	if (st->verbs_ndev == 0) {
		c = dr_add(st, DR_SEC_NIC, DR_FAIL, "devices",
			   "%s loads but lists no RDMA device%s%s", st->verbs_lib,
			   st->verbs_why[0] ? " - " : "", st->verbs_why);
		dr_explain(c,
			   "rdma-core is installed, but no NIC is visible to it: no RDMA "
			   "hardware, its kernel driver or provider is missing, or a container "
			   "was started without /dev/infiniband; NCCL would fall back to TCP",
			   "ibv_devinfo to confirm; modprobe mlx5_ib ib_uverbs rdma_ucm; install "
			   "ibverbs-providers; containers: --device=/dev/infiniband "
			   "--cap-add=IPC_LOCK; without hardware: export "
			   "LD_LIBRARY_PATH=$PWD/build/softverbs");
		return;
	}
	dr_add(st, DR_SEC_NIC, DR_INFO, "libibverbs", "%s: %d device%s", st->verbs_lib,
	       st->verbs_ndev, st->verbs_ndev == 1 ? "" : "s");
	for (int i = 0; i < st->nnics; i++) {
		struct dr_nic *n = &st->nics[i];
		char where[160], gid[96];

		if (n->query_err[0]) {
			c = dr_add(st, DR_SEC_NIC, DR_FAIL, n->name, "cannot query: %s",
				   n->query_err);
			dr_explain(c, "NCCL will not be able to use this NIC either",
				   "check permissions on /dev/infiniband/uverbs* and the memlock "
				   "limit (ulimit -l unlimited); ibv_devinfo -d %s",
				   n->dev);
			continue;
		}
		if (n->soft)
			snprintf(where, sizeof(where), "soft device (no PCI path)");
		else
			snprintf(where, sizeof(where), "PCI %s NUMA %d%s%s%s%s", n->pci, n->numa,
				 n->driver[0] ? " driver " : "", n->driver,
				 n->gpu[0] ? " nearest GPU " : "", n->gpu);
		if (!strcmp(n->link_layer, "Ethernet"))
			snprintf(gid, sizeof(gid), "RoCE v2 GID index %d%s%s", n->gid_index,
				 n->netdev[0] ? " on " : "", n->netdev);
		else
			snprintf(gid, sizeof(gid), "LID %u", n->lid);
		c = dr_add(st, DR_SEC_NIC, n->active ? DR_OK : DR_WARN, n->name,
			   "%s %g Gb/s (%s) %s %s MTU %d; %s%s", n->state, n->gbps, n->speed_str,
			   n->link_layer, gid, n->mtu, where,
			   n->nccl_uses ? "" : "; not in NCCL_IB_HCA");
		if (!n->active && n->soft)
			dr_explain(c,
				   "the port is not ACTIVE: NCCL skips it at start-up and R2CC "
				   "cannot move traffic onto it; a NIC that goes down during a "
				   "job is what R2CC repairs",
				   "build/bin/softverbs-ctl%s%s fault %s %s up",
				   getenv("SOFTVERBS_FABRIC") ? " --fabric " : "",
				   getenv("SOFTVERBS_FABRIC") ? getenv("SOFTVERBS_FABRIC") : "",
				   getenv("SOFTVERBS_NODE") ? getenv("SOFTVERBS_NODE")
				   : getenv("NCCL_HOSTID")  ? getenv("NCCL_HOSTID")
							    : "NODE",
				   n->dev);
		else if (!n->active)
			dr_explain(c,
				   "the port is not ACTIVE: NCCL skips it at start-up and R2CC "
				   "cannot move traffic onto it; a NIC that goes down during a "
				   "job is what R2CC repairs",
				   "ibv_devinfo -d %s; ibstat %s (IB: cable, switch port, subnet "
				   "manager) or ip link (RoCE: the netdev must be up)",
				   n->dev, n->dev);
		if (n->active && !strcmp(n->link_layer, "Ethernet") && n->gid_index < 0 &&
		    !n->soft) {
			c = dr_add(st, DR_SEC_NIC, DR_WARN, n->name,
				   "no RoCE v2 GID with an IPv4 address");
			dr_explain(c,
				   "NCCL finds no usable GID on its own and needs "
				   "NCCL_IB_GID_INDEX; the path may use RoCE v1 or fail",
				   "give the NIC's netdev an IP address (ip addr add ADDR/LEN "
				   "dev NETDEV) and check show_gids / "
				   "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/",
				   n->dev, n->port);
		}
		if (n->active && !n->soft && !strcmp(n->link_layer, "InfiniBand") &&
		    (n->lid == 0 || n->sm_lid == 0)) {
			c = dr_add(st, DR_SEC_NIC, DR_WARN, n->name,
				   "no LID or subnet manager (LID %u, SM LID %u)", n->lid,
				   n->sm_lid);
			dr_explain(c, "without a subnet manager the rail is not routed",
				   "start opensm on the fabric or check the switch's SM; sminfo "
				   "-C %s",
				   n->dev);
		}
	}
}

void dr_check_gpus(struct dr_state *st)
{
	struct dr_check *c;
	bool soft = false;

	for (int i = 0; i < st->nnics; i++)
		soft |= st->nics[i].soft;
	if (st->ngpus == 0)
		dr_add(st, DR_SEC_GPU, DR_INFO, "GPUs",
		       "no NVIDIA GPU in sysfs (fine for CPU tests; NCCL jobs need one)");
	for (int i = 0; i < st->ngpus; i++)
		dr_add(st, DR_SEC_GPU, DR_INFO, st->gpus[i].pci, "%s NUMA %d",
		       st->gpus[i].model[0] ? st->gpus[i].model : "NVIDIA GPU", st->gpus[i].numa);
	for (int i = 0; i < st->nnics; i++) {
		struct dr_nic *n = &st->nics[i];
		if (n->gpu[0])
			dr_add(st, DR_SEC_GPU, DR_INFO, n->name, "nearest GPU %s: %s", n->gpu,
			       n->gpu_rel);
	}
	if (st->gdr_peermem || st->gdr_memory_peers) {
		dr_add(st, DR_SEC_GPU, DR_OK, "GPUDirect", "GPUDirect RDMA available (%s)",
		       st->gdr_peermem ? "nvidia_peermem loaded" : "/sys/kernel/mm/memory_peers");
	} else if (st->ngpus > 0 && st->nnics > 0 && !soft) {
		c = dr_add(st, DR_SEC_GPU, DR_WARN, "GPUDirect",
			   "GPUDirect RDMA not available: no nvidia_peermem, no memory_peers");
		dr_explain(c,
			   "NCCL stages every transfer through host memory (lower bandwidth), "
			   "unless it uses dma-buf",
			   "modprobe nvidia_peermem (part of the driver since R470), or use "
			   "dma-buf (NCCL_DMABUF_ENABLE=1, kernel >= 5.12, open GPU driver); "
			   "confirm with NCCL_DEBUG=INFO: 'via NET/IB/0/GDRDMA'");
	} else {
		dr_add(st, DR_SEC_GPU, DR_INFO, "GPUDirect", "GPUDirect RDMA not available%s",
		       soft ? " (soft devices stage through "
			      "host memory: NCCL_NET_GDR_LEVEL=LOC)"
			    : "");
	}
}
