/*
 * The settings of `r2cc doctor`: the NCCL the loader finds (dlopen()ed, only
 * ncclGetVersion is called) and the NCCL_* settings that decide whether R2CC
 * has something to repair; then every R2CC_* setting, validated by the
 * library's own parser (shim/params.c, shim/failspec.c compiled in), so a bad
 * value gets exactly the line the library would print.
 */
#include "intercept/netplugin.h"
#include "repair/model/cts.h"
#include "tools/doctor.h"
#include "shim/failspec.h"
#include "shim/log.h"
#include "shim/params.h"

#include <dlfcn.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

extern char **environ;

#define NCCL_MIN_CODE 21800 /* 2.18.0 */

static int nccl_version(struct dr_state *st, char *err, size_t errlen)
{
	const char *path = st->nccl_path ? st->nccl_path : "libnccl.so.2";
	void *h = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
	int (*get)(int *);
	Dl_info info;
	int code = 0;

	if (!h) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "not found");
		return -ENOENT;
	}
	get = (int (*)(int *))dlsym(h, "ncclGetVersion");
	if (!get || get(&code) != 0 || code <= 0) {
		snprintf(err, errlen, "%s has no working ncclGetVersion", path);
		return -ENOSYS;
	}
	if (dladdr((void *)get, &info) && info.dli_fname)
		dr_copy(st->nccl_lib, sizeof(st->nccl_lib), info.dli_fname);
	else
		dr_copy(st->nccl_lib, sizeof(st->nccl_lib), path);
	st->nccl_code = code;
	return 0;
}

static bool set(const char *name)
{
	const char *v = getenv(name);
	return v && *v;
}

static long env_long(const char *name, long def)
{
	const char *v = getenv(name);
	char *end;
	long x;

	if (!v || !*v)
		return def;
	x = strtol(v, &end, 0);
	return *end ? def : x;
}

/* " mlx5_0:25 mlx5_1:100 ...": the soft NICs as softverbs/topo.sh takes them. */
static const char *soft_nic_list(const struct dr_state *st)
{
	static char list[512];
	size_t o = 0;

	list[0] = '\0';
	for (int i = 0; i < st->nnics && o + 80 < sizeof(list); i++)
		if (st->nics[i].soft)
			o += (size_t)snprintf(list + o, sizeof(list) - o, " %s:%.0f",
					      st->nics[i].dev, st->nics[i].gbps);
	return list;
}

/* Is NCCL's topology file usable: opens, looks like XML with balanced tags,
 * and names each soft NIC in a <net name="..."> (the soft NICs need it). */
static void check_topo_file(struct dr_state *st, bool soft)
{
	const char *path = getenv("NCCL_TOPO_FILE");
	struct dr_check *c;
	char *text = NULL, *p;
	size_t n = 0;
	int depth = 0, bad = 0;
	FILE *f;

	if (!set("NCCL_TOPO_FILE")) {
		if (!soft) {
			dr_add(st, DR_SEC_NCCL, DR_OK, "NCCL_TOPO_FILE",
			       "unset: NCCL reads the topology from sysfs");
			return;
		}
		c = dr_add(st, DR_SEC_NCCL, DR_FAIL, "NCCL_TOPO_FILE",
			   "unset, but the NICs are soft devices without a PCI path");
		dr_explain(c,
			   "NCCL stops with \"Could not find any local path from gpu 0 to net\" "
			   "(docs/architecture.md, The software RDMA device)",
			   "softverbs/topo.sh%s > /tmp/r2cc-topo.xml; export "
			   "NCCL_TOPO_FILE=/tmp/r2cc-topo.xml",
			   soft_nic_list(st));
		return;
	}
	f = fopen(path, "r");
	if (!f) {
		c = dr_add(st, DR_SEC_NCCL, DR_FAIL, "NCCL_TOPO_FILE", "%s: %s", path,
			   strerror(errno));
		dr_explain(c, "NCCL cannot read the topology it was told to use",
			   "fix the path, or unset NCCL_TOPO_FILE on real hardware");
		return;
	}
	text = calloc(1, 1 << 20);
	if (text)
		n = fread(text, 1, (1 << 20) - 1, f);
	fclose(f);
	if (!text)
		return;
	text[n] = '\0';
	/* Tags: <?...?>, <!--...-->, <x .../>, <x ...>, </x>. */
	for (p = text; (p = strchr(p, '<')); p++) {
		char *end = strchr(p, '>');
		if (!end) {
			bad = 1;
			break;
		}
		if (p[1] == '?' || p[1] == '!')
			continue;
		if (p[1] == '/')
			depth--;
		else if (end[-1] != '/')
			depth++;
		if (depth < 0)
			bad = 1;
	}
	if (bad || depth != 0 || !strstr(text, "<system")) {
		c = dr_add(st, DR_SEC_NCCL, DR_FAIL, "NCCL_TOPO_FILE",
			   "%s does not parse as an NCCL topology (%s)", path,
			   !strstr(text, "<system") ? "no <system> element" : "unbalanced tags");
		dr_explain(c, "NCCL rejects the file and the job does not start",
			   "regenerate it (softverbs/topo.sh for soft NICs, or dump one "
			   "with NCCL_TOPO_DUMP_FILE=/tmp/topo.xml)");
		free(text);
		return;
	}
	char missing[256] = "";
	for (int i = 0; i < st->nnics; i++) {
		char pat[96];
		const struct dr_nic *nic = &st->nics[i];
		if (!nic->soft || !nic->nccl_uses)
			continue;
		snprintf(pat, sizeof(pat), "name=\"%s\"", nic->dev);
		if (!strstr(text, pat) &&
		    strlen(missing) + strlen(nic->dev) + 2 < sizeof(missing)) {
			strcat(missing, missing[0] ? " " : "");
			strcat(missing, nic->dev);
		}
	}
	if (missing[0]) {
		c = dr_add(st, DR_SEC_NCCL, DR_FAIL, "NCCL_TOPO_FILE",
			   "%s names no <net> for soft NIC(s) %s", path, missing);
		dr_explain(c, "NCCL cannot place those NICs and will not use them",
			   "softverbs/topo.sh%s > %s", soft_nic_list(st), path);
	} else {
		dr_add(st, DR_SEC_NCCL, DR_OK, "NCCL_TOPO_FILE", "%s parses%s", path,
		       soft ? " and names every soft NIC" : "");
	}
	free(text);
}

/*
 * The net plugin NCCL would load (intercept/netplugin.h: libnccl-net.so on the library
 * path unless NCCL_NET_PLUGIN says otherwise), loaded as NCCL loads it, and what R2CC
 * will do with it. NCCL uses a plugin that loads and finds devices before its own IB
 * transport, unless NCCL_NET names another network.
 */
static void net_plugin(struct dr_state *st)
{
	struct dr_check *c;
	char names[R2CC_NETPLUGIN_CANDIDATES][256];
	int n = r2cc_netplugin_candidates(names);
	const char *net = getenv("NCCL_NET");
	if (!n) {
		dr_add(st, DR_SEC_NCCL, DR_OK, "net plugin",
		       "NCCL_NET_PLUGIN=none: NCCL loads none (its own IB transport)");
		return;
	}
	for (int i = 0; i < n; i++) {
		struct r2cc_netplugin p;
		int rc = r2cc_netplugin_probe(names[i], true, &p);
		if (rc == -ENOENT)
			continue;
		if (rc == -ENOTSUP) {
			dr_add(st, DR_SEC_NCCL, DR_WARN, "net plugin",
			       "%s loads but is no NCCL net plugin (no ncclNetPlugin_vN)",
			       names[i]);
			continue;
		}
		if (net && *net && strncasecmp(net, "IBext", 5) && strcasecmp(net, p.name)) {
			dr_add(st, DR_SEC_NCCL, DR_OK, "net plugin",
			       "%s (%s) would load, but NCCL_NET=%s chooses another network",
			       p.path, p.name, net);
			return;
		}
		if (!r2cc_netplugin_is_ibext(&p)) {
			c = dr_add(
			    st, DR_SEC_NCCL, DR_FAIL, "net plugin",
			    "%s (%s, net API v%d): NCCL uses it first; R2CC does not repair it",
			    p.path, p.name, p.api);
			dr_explain(
			    c,
			    "R2CC repairs RDMA verbs transports only: NCCL's own IB and HPC-X's "
			    "IBext",
			    "export NCCL_NET_PLUGIN=none to use NCCL's own IB transport");
			return;
		}
		const char *p2p = getenv("NCCL_PLUGIN_P2P");
		if (env_long("NCCL_IBEXT_DISABLE", 0) == 1) {
			dr_add(st, DR_SEC_NCCL, DR_OK, "net plugin",
			       "HPC-X's plugin %s with NCCL_IBEXT_DISABLE=1: NCCL uses its own IB "
			       "transport, which R2CC repairs",
			       p.path);
		} else if (p2p && *p2p && strcasecmp(p2p, "ib")) {
			c = dr_add(
			    st, DR_SEC_NCCL, DR_FAIL, "net plugin",
			    "HPC-X's plugin %s over %s (NCCL_PLUGIN_P2P): R2CC does not repair "
			    "it",
			    p.path, p2p);
			dr_explain(
			    c, "UCX posts to the NIC itself, where no verbs call of R2CC's sees it",
			    "unset NCCL_PLUGIN_P2P (or =ib), or export NCCL_NET_PLUGIN=none");
		} else if (p.api >= R2CC_IBEXT_API_MIN && p.api <= R2CC_IBEXT_API_MAX) {
			dr_add(st, DR_SEC_NCCL, DR_OK, "net plugin",
			       "HPC-X's nccl-rdma-sharp-plugins %s (net API v%d): NCCL loads it by "
			       "default and uses its IB transport (\"IBext\"), which R2CC repairs",
			       p.path, p.api);
			const char *tc = getenv("NCCL_IB_TC");
			if (tc && *tc && !set("NCCL_IB_FIFO_TC")) {
				c = dr_add(
				    st, DR_SEC_NCCL, DR_WARN, "NCCL_IB_FIFO_TC",
				    "unset: HPC-X's plugin sends its clear-to-send writes in "
				    "traffic class 0, outside NCCL_IB_TC=%s",
				    tc);
				dr_explain(
				    c,
				    "on RoCE those writes then leave the lossless class "
				    "(NCCL's own transport defaults the FIFO class to NCCL_IB_TC)",
				    "export NCCL_IB_FIFO_TC=$NCCL_IB_TC");
			}
		} else {
			c = dr_add(st, DR_SEC_NCCL, DR_FAIL, "net plugin",
				   "HPC-X's plugin %s (net API v%d): R2CC does not know the "
				   "clear-to-send layout of this release, and will not repair it",
				   p.path, p.api);
			dr_explain(
			    c,
			    "R2CC re-posts a transport's clear-to-send writes by the layout its "
			    "source declares; it knows releases of net API v9-v11 (NCCL 2.24-2.28)",
			    "export NCCL_NET_PLUGIN=none to use NCCL's own IB transport");
		}
		return;
	}
	dr_add(st, DR_SEC_NCCL, DR_OK, "net plugin",
	       "none found (%s%s): NCCL uses its own transports", names[0], n > 1 ? ", ..." : "");
}

static void check_socket_ifname(struct dr_state *st)
{
	const char *v = getenv("NCCL_SOCKET_IFNAME");
	struct ifaddrs *ifs, *i;
	char found[128] = "";
	struct dr_check *c;

	if (!set("NCCL_SOCKET_IFNAME")) {
		dr_add(st, DR_SEC_NCCL, DR_OK, "NCCL_SOCKET_IFNAME",
		       "unset: NCCL picks an interface (ib*, then others, not lo/docker); "
		       "R2CC's control plane follows the same rule");
		return;
	}
	if (getifaddrs(&ifs) == 0) {
		for (i = ifs; i; i = i->ifa_next) {
			if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET &&
					     i->ifa_addr->sa_family != AF_INET6))
				continue;
			if (!dr_nccl_match(v, i->ifa_name, -1) || strstr(found, i->ifa_name))
				continue;
			if (strlen(found) + strlen(i->ifa_name) + 2 < sizeof(found)) {
				strcat(found, found[0] ? " " : "");
				strcat(found, i->ifa_name);
			}
		}
		freeifaddrs(ifs);
	}
	if (found[0]) {
		dr_add(st, DR_SEC_NCCL, DR_OK, "NCCL_SOCKET_IFNAME",
		       "%s: matches %s (NCCL bootstrap and R2CC control plane)", v, found);
		return;
	}
	c = dr_add(st, DR_SEC_NCCL, DR_FAIL, "NCCL_SOCKET_IFNAME",
		   "%s matches no interface with an address", v);
	dr_explain(c,
		   "NCCL's bootstrap cannot start (\"no socket interface found\") and R2CC's "
		   "control plane has no address",
		   "ip -br addr; set NCCL_SOCKET_IFNAME to an interface listed there (prefix "
		   "match, =exact, ^exclude)");
}

void dr_check_nccl(struct dr_state *st)
{
	char err[512], ver[32];
	struct dr_check *c;
	int nuse = 0, nall = 0, nsoft = 0, nnot_mlx5 = 0, neth = 0;

	for (int i = 0; i < st->nnics; i++) {
		const struct dr_nic *n = &st->nics[i];
		nall++;
		nuse += n->nccl_uses;
		nsoft += n->soft;
		if (n->nccl_uses && strcmp(n->driver, "mlx5_core"))
			nnot_mlx5++;
		neth += !strcmp(n->link_layer, "Ethernet");
	}

	/* The library and its version. */
	if (nccl_version(st, err, sizeof(err))) {
		c = dr_add(st, DR_SEC_NCCL, DR_WARN, "libnccl", "no NCCL found by the loader (%s)",
			   err);
		dr_explain(c,
			   "the doctor cannot tell which NCCL the job will use; frameworks often "
			   "bring their own (e.g. PyTorch's nvidia/nccl/lib/libnccl.so.2)",
			   "point the doctor at the job's NCCL: r2cc doctor --nccl "
			   "/path/to/libnccl.so.2 (or R2CC_DOCTOR_NCCL=...)");
	} else {
		dr_nccl_version_str(st->nccl_code, ver, sizeof(ver));
		if (st->nccl_code < NCCL_MIN_CODE) {
			c = dr_add(st, DR_SEC_NCCL, DR_FAIL, "libnccl", "NCCL %s (%s) is too old",
				   ver, st->nccl_lib);
			dr_explain(c,
				   "R2CC interposes NCCL 2.18 and later; with this one it runs "
				   "as plain NCCL",
				   "install NCCL >= 2.18 (e.g. pip install nvidia-nccl-cu12) and "
				   "put it first on LD_LIBRARY_PATH");
		} else {
			dr_add(st, DR_SEC_NCCL, DR_OK, "libnccl", "NCCL %s (%s)%s", ver,
			       st->nccl_lib,
			       st->nccl_code > 23099 ? "; newer than the versions R2CC was "
						       "checked with (2.18-2.30)"
						     : "");
		}
	}

	/* Transport choice. */
	if (env_long("NCCL_IB_DISABLE", 0) == 1) {
		c = dr_add(st, DR_SEC_NCCL, DR_FAIL, "NCCL_IB_DISABLE",
			   "1: NCCL will not use RDMA at all");
		dr_explain(c, "traffic goes over TCP sockets; R2CC has nothing to repair",
			   "unset NCCL_IB_DISABLE");
	}
	if (set("NCCL_NET")) {
		const char *net = getenv("NCCL_NET");
		if (!strcasecmp(net, "IB")) {
			dr_add(st, DR_SEC_NCCL, DR_OK, "NCCL_NET",
			       "IB: NCCL's own verbs transport");
		} else if (!strcasecmp(net, "Socket")) {
			c = dr_add(st, DR_SEC_NCCL, DR_FAIL, "NCCL_NET",
				   "Socket: NCCL will not use RDMA");
			dr_explain(c, "R2CC repairs NCCL's IB transport only",
				   "export NCCL_NET=IB (or unset it)");
		} else if (!strncasecmp(net, "IBext", 5)) {
			dr_add(st, DR_SEC_NCCL, DR_OK, "NCCL_NET",
			       "%s: HPC-X's net plugin over verbs (see 'net plugin')", net);
		} else {
			c = dr_add(st, DR_SEC_NCCL, DR_FAIL, "NCCL_NET",
				   "%s: a network R2CC does not repair", net);
			dr_explain(
			    c,
			    "R2CC repairs RDMA verbs transports only: NCCL's own IB and HPC-X's "
			    "IBext; UCX, EFA, TCPX and sockets are not protected",
			    "export NCCL_NET=IB to use NCCL's own transport under R2CC");
		}
	} else {
		dr_add(st, DR_SEC_NCCL, DR_OK, "NCCL_NET",
		       "unset: NCCL uses its net plugin if it loads one, else IB when it finds a "
		       "usable NIC");
	}
	net_plugin(st);

	/* Which NICs NCCL will use. */
	if (set("NCCL_IB_HCA")) {
		const char *hca = getenv("NCCL_IB_HCA");
		if (nall > 0 && nuse == 0) {
			c = dr_add(st, DR_SEC_NCCL, DR_FAIL, "NCCL_IB_HCA",
				   "%s matches none of the %d NIC(s)", hca, nall);
			dr_explain(c, "NCCL finds no IB device and falls back to TCP sockets",
				   "list the NICs by name, e.g. NCCL_IB_HCA=%s (see the NIC "
				   "section above)",
				   st->nics[0].dev);
		} else if (nuse == 1 && nall > 1) {
			c = dr_add(st, DR_SEC_NCCL, DR_WARN, "NCCL_IB_HCA",
				   "%s restricts NCCL to one NIC of %d", hca, nall);
			char list[300] = "";
			for (int i = 0; i < st->nnics; i++) {
				if (strlen(list) + strlen(st->nics[i].dev) + 2 >= sizeof(list) ||
				    strstr(list, st->nics[i].dev))
					continue;
				strcat(list, list[0] ? "," : "");
				strcat(list, st->nics[i].dev);
			}
			dr_explain(c,
				   "if that NIC fails NCCL has nothing to fail over to; R2CC "
				   "can only move its traffic to NICs that it opens itself",
				   "list every NIC (export NCCL_IB_HCA=%s) or unset NCCL_IB_HCA",
				   list);
		} else {
			dr_add(st, DR_SEC_NCCL, DR_OK, "NCCL_IB_HCA",
			       "%s: NCCL uses %d of %d NIC(s)", hca, nuse, nall);
		}
	} else {
		dr_add(st, DR_SEC_NCCL, DR_OK, "NCCL_IB_HCA", "unset: NCCL uses all %d NIC(s)",
		       nall);
	}

	/* How long plain NCCL hangs on a dead path. */
	{
		long to = env_long("NCCL_IB_TIMEOUT", 20), rc = env_long("NCCL_IB_RETRY_CNT", 7);
		if (to < 0 || to > 31 || rc < 0 || rc > 7) {
			c = dr_add(st, DR_SEC_NCCL, DR_FAIL, "NCCL_IB_TIMEOUT",
				   "NCCL_IB_TIMEOUT=%ld / NCCL_IB_RETRY_CNT=%ld out of range", to,
				   rc);
			dr_explain(c, "ibv_modify_qp to RTS fails and NCCL cannot connect",
				   "NCCL_IB_TIMEOUT 1..31 (default 20), NCCL_IB_RETRY_CNT 0..7 "
				   "(default 7)");
		} else if (to == 0) {
			c = dr_add(st, DR_SEC_NCCL, DR_WARN, "NCCL_IB_TIMEOUT",
				   "0: the transport never times out");
			dr_explain(c,
				   "plain NCCL hangs forever on a dead path; R2CC's stall "
				   "detection still works, but when repair is impossible no "
				   "error ever reaches the job",
				   "unset NCCL_IB_TIMEOUT (default 20)");
		} else {
			double s = 4.096e-6 * ldexp(1.0, (int)to) * (double)(rc + 1);
			dr_add(
			    st, DR_SEC_NCCL, DR_OK, "NCCL_IB_TIMEOUT",
			    "timeout %ld, retry %ld: plain NCCL waits %.3g s (4.096 us x 2^%ld x "
			    "%ld) before failing on a dead path; R2CC detects it in ms",
			    to, rc, s, to, rc + 1);
		}
	}

	/* NCCL's own failover (2.29.7+) and the coexistence rule. */
	{
		static const char *const res[] = {"NCCL_IB_RESILIENCY_PORT_FAILOVER",
						  "NCCL_IB_RESILIENCY_PORT_RECOVERY"};
		for (int i = 0; i < 2; i++) {
			if (!set(res[i]) || env_long(res[i], 1) == 0)
				continue;
			if (st->nccl_code && st->nccl_code < 22907) {
				dr_nccl_version_str(st->nccl_code, ver, sizeof(ver));
				dr_add(st, DR_SEC_NCCL, DR_INFO, res[i],
				       "%s set, ignored by NCCL %s (needs 2.29.7+)", res[i], ver);
				continue;
			}
			c = dr_add(st, DR_SEC_NCCL, DR_FAIL, res[i],
				   "%s=%s: NCCL's own failover is on", res[i], getenv(res[i]));
			dr_explain(c,
				   "NCCL repairs inside fused virtual NICs itself; R2CC must not "
				   "act on the same errors, so the library turns its hot repair "
				   "off for the process, with one warning in the log (counters and "
				   "reports stay; docs/architecture.md)",
				   "unset %s to let R2CC repair (across rails, several NICs, "
				   "Balance, R2CC-AllReduce), or R2CC_MODE=0 to rely on NCCL's",
				   res[i]);
		}
	}

	/* Settings under which the library turns hot repair off (repair/engine.c,
	 * nccl_settings_unsafe: re-posted clear-to-send writes would not be safe). */
	if (set("NCCL_IB_USE_INLINE") && env_long("NCCL_IB_USE_INLINE", 0) != 0) {
		c = dr_add(st, DR_SEC_NCCL, DR_FAIL, "NCCL_IB_USE_INLINE",
			   "NCCL_IB_USE_INLINE=%s: hot repair is off",
			   getenv("NCCL_IB_USE_INLINE"));
		dr_explain(c,
			   "inline clear-to-send writes carry the FIFO element as it was when "
			   "posted, so re-posting them after a failure could overwrite a newer "
			   "one; the library turns hot repair off, with one warning",
			   "unset NCCL_IB_USE_INLINE (NCCL's default is 0)");
	}
	if (env_long("NCCL_IB_QPS_PER_CONNECTION", 1) > 1 &&
	    env_long("NCCL_IB_SPLIT_DATA_ON_QPS", st->nccl_code && st->nccl_code < 22000) != 0) {
		c = dr_add(st, DR_SEC_NCCL, DR_FAIL, "NCCL_IB_QPS_PER_CONNECTION",
			   "NCCL_IB_QPS_PER_CONNECTION=%s with data split over the QPs: hot "
			   "repair is off",
			   getenv("NCCL_IB_QPS_PER_CONNECTION"));
		dr_explain(c,
			   "one FIFO slot's clear-to-send writes then travel on several QPs, "
			   "and re-posting them after a failure is not safe; the library turns "
			   "hot repair off, with one warning",
			   "NCCL_IB_SPLIT_DATA_ON_QPS=0 (NCCL's default since 2.20), or one QP "
			   "per connection");
	}

	check_socket_ifname(st);

	if (set("NCCL_IB_GID_INDEX")) {
		long gi = env_long("NCCL_IB_GID_INDEX", -1);
		if (!neth) {
			dr_add(st, DR_SEC_NCCL, DR_INFO, "NCCL_IB_GID_INDEX",
			       "%ld: ignored on InfiniBand", gi);
		} else {
			bool mismatch = false;
			for (int i = 0; i < st->nnics; i++) {
				const struct dr_nic *n = &st->nics[i];
				if (n->nccl_uses && !strcmp(n->link_layer, "Ethernet") &&
				    n->gid_index >= 0 && n->gid_index != gi)
					mismatch = true;
			}
			if (mismatch) {
				c = dr_add(st, DR_SEC_NCCL, DR_WARN, "NCCL_IB_GID_INDEX",
					   "%ld differs from the RoCE v2 IPv4 GID of some NICs",
					   gi);
				dr_explain(c,
					   "with the wrong index traffic may use RoCE v1 or a "
					   "link-local GID and not cross the rails",
					   "unset NCCL_IB_GID_INDEX (NCCL picks as shown in the "
					   "NIC section) or use the index shown there");
			} else {
				dr_add(st, DR_SEC_NCCL, DR_OK, "NCCL_IB_GID_INDEX", "%ld", gi);
			}
		}
	}

	if (set("NCCL_NET_GDR_LEVEL"))
		dr_add(st, DR_SEC_NCCL,
		       nsoft && strcasecmp(getenv("NCCL_NET_GDR_LEVEL"), "LOC") ? DR_WARN : DR_OK,
		       "NCCL_NET_GDR_LEVEL", "%s%s", getenv("NCCL_NET_GDR_LEVEL"),
		       nsoft && strcasecmp(getenv("NCCL_NET_GDR_LEVEL"), "LOC")
			   ? ": soft devices need LOC (no GPUDirect)"
			   : "");
	else if (nsoft && st->ngpus > 0) {
		c = dr_add(st, DR_SEC_NCCL, DR_WARN, "NCCL_NET_GDR_LEVEL",
			   "unset, with soft devices");
		dr_explain(c, "the software device cannot reach GPU memory",
			   "export NCCL_NET_GDR_LEVEL=LOC NCCL_DMABUF_ENABLE=0");
	}

	check_topo_file(st, nsoft > 0);

	if (nsoft > 1) {
		const char *ml = getenv("NCCL_NET_MERGE_LEVEL");
		if (!ml || strcasecmp(ml, "LOC")) {
			c = dr_add(st, DR_SEC_NCCL, DR_WARN, "NCCL_NET_MERGE_LEVEL",
				   "%s, with path-less soft devices", ml ? ml : "unset");
			dr_explain(c,
				   "NCCL sees the soft NICs as co-located and fuses them into "
				   "one virtual NIC",
				   "export NCCL_NET_MERGE_LEVEL=LOC");
			/* repair/model/cts.h: before 2.29 a consumed clear-to-send element reads
			 * 0, and over 3 or 5-7 fused NICs a slot's writes use several QPs */
			bool odd = nsoft == 3 || (nsoft >= 5 && nsoft <= 7);
			if (odd && st->nccl_code > 0 && st->nccl_code < 22900 &&
			    env_long("NCCL_IB_MERGE_NICS", 1) != 0) {
				c = dr_add(st, DR_SEC_NCCL, DR_WARN, "NIC fusion",
					   "NCCL %d.%d would fuse %d soft NICs into one",
					   st->nccl_code / 10000, st->nccl_code / 100 % 100, nsoft);
				dr_explain(
				    c,
				    "hot repair does not repair the QPs of such a NIC (NCCL "
				    "before 2.29 clears consumed clear-to-send elements): "
				    "NCCL gets the error",
				    "export NCCL_NET_MERGE_LEVEL=LOC, or fuse 1, 2 or 4 NICs, or "
				    "use NCCL 2.29+");
			}
		} else {
			dr_add(st, DR_SEC_NCCL, DR_OK, "NCCL_NET_MERGE_LEVEL", "LOC");
		}
	}

	/* NCCL 2.28's GIN selection crashes with IB devices that are not mlx5. */
	if (st->nccl_code >= 22800 && st->nccl_code < 22900 && nnot_mlx5 > 0) {
		if (set("NCCL_GIN_TYPE")) {
			dr_add(st, DR_SEC_NCCL, DR_OK, "NCCL_GIN_TYPE", "%s",
			       getenv("NCCL_GIN_TYPE"));
		} else {
			c = dr_add(st, DR_SEC_NCCL, DR_FAIL, "NCCL_GIN_TYPE",
				   "unset, NCCL 2.28 with %d non-mlx5 device(s)", nnot_mlx5);
			dr_explain(c,
				   "NCCL 2.28's automatic GPU-initiated-networking selection "
				   "dereferences an invalid pointer with such devices: the "
				   "process crashes in ncclNetPluginInit (docs/architecture.md)",
				   "export NCCL_GIN_TYPE=2");
		}
	}

	if (nsoft && nsoft < nall) {
		c = dr_add(st, DR_SEC_NCCL, DR_FAIL, "soft+real",
			   "%d soft device(s) next to %d real NIC(s)", nsoft, nall - nsoft);
		dr_explain(c,
			   "path-less soft devices must never be mixed with real NICs "
			   "(docs/architecture.md, The software RDMA device): NCCL's topology and "
			   "R2CC's placement would be wrong",
			   "use one or the other: drop build/softverbs from LD_LIBRARY_PATH on "
			   "real hardware");
	}
}

/* ---- R2CC ---- */

/* The line the library prints for a bad setting, with its real prefix. */
static void library_error_line(const char *err, char *line, size_t len)
{
	char *buf = NULL;
	size_t n = 0;
	FILE *mem = open_memstream(&buf, &n);

	line[0] = '\0';
	if (!mem)
		return;
	r2cc_log_set_stream(mem);
	r2cc_log_write(R2CC_LOG_WARN, -1, "error: %s; R2CC runs as plain NCCL", err);
	r2cc_log_set_stream(NULL);
	fclose(mem);
	if (buf) {
		buf[strcspn(buf, "\n")] = '\0';
		snprintf(line, len, "%s", buf);
		free(buf);
	}
}

void dr_check_r2cc(struct dr_state *st, const char *argv0)
{
	struct r2cc_params p;
	struct r2cc_failspec *spec;
	struct dr_check *c;
	char err[320], line[400], exe[PATH_MAX], lib[PATH_MAX + 32];
	int nbad = 0, nset = 0;

	/* The logging prefix (host name), without opening R2CC_DEBUG_FILE. */
	r2cc_params_defaults(&r2cc_param);
	r2cc_log_init();
	r2cc_params_defaults(&p);
	for (int i = 0; r2cc_param_name(i); i++) {
		const char *name = r2cc_param_name(i), *v = getenv(name);
		if (!v)
			continue;
		nset++;
		if (r2cc_param_set(&p, name, v, err, sizeof(err)) == 0) {
			dr_add(st, DR_SEC_R2CC, DR_OK, name, "%s", v);
			continue;
		}
		nbad++;
		library_error_line(err, line, sizeof(line));
		c = dr_add(st, DR_SEC_R2CC, DR_FAIL, name, "%s", line);
		const char *acc = strstr(err, "it accepts ");
		const char *def = r2cc_param_default(i);
		dr_explain(c, "the library refuses the setting and runs as plain NCCL: no repair",
			   "unset %s (default %s) or set it to %s", name, def[0] ? def : "unset",
			   acc ? acc + 11 : "a valid value (r2cc doctor --help)");
	}
	spec = calloc(1, sizeof(*spec));
	if (!nbad && spec &&
	    r2cc_failspec_parse(p.failed_node, p.failed_hca, spec, err, sizeof(err))) {
		nbad++;
		library_error_line(err, line, sizeof(line));
		c = dr_add(st, DR_SEC_R2CC, DR_FAIL, "R2CC_FAILED_*", "%s", line);
		dr_explain(c, "the library refuses the declared failure and runs as plain NCCL",
			   "see shim/failspec.h for the syntax, e.g. R2CC_FAILED_NODE=0 "
			   "R2CC_FAILED_HCA=mlx5_2");
	} else if (!nbad && spec && spec->nentries) {
		dr_add(st, DR_SEC_R2CC, DR_INFO, "declared",
		       "declared failure on %d node(s): those NICs are treated as failed from "
		       "the start",
		       spec->nentries);
	}
	free(spec);
	st->r2cc_mode = nbad ? -1 : p.mode;
	if (!nset)
		dr_add(st, DR_SEC_R2CC, DR_OK, "settings",
		       "no R2CC_* set: defaults (mode 2, Balance)");

	/* Output files: the directory must be writable (the library falls back to
	 * stderr, or writes no report). */
	static const char *const files[] = {"R2CC_DEBUG_FILE", "R2CC_REPORT"};
	for (int i = 0; i < 2 && !nbad; i++) {
		const char *v = getenv(files[i]);
		char dir[PATH_MAX];
		if (!v || !*v)
			continue;
		dr_copy(dir, sizeof(dir), v);
		char *sl = strrchr(dir, '/');
		if (sl == dir)
			dir[1] = '\0';
		else if (sl)
			*sl = '\0';
		else
			dr_copy(dir, sizeof(dir), ".");
		if (access(dir, W_OK) == 0)
			continue;
		c = dr_add(st, DR_SEC_R2CC, DR_WARN, files[i], "%s: directory %s is not writable",
			   v, dir);
		dr_explain(c,
			   i == 0 ? "the library logs to stderr instead"
				  : "the library cannot write its exit report",
			   "mkdir -p %s, or point %s elsewhere", dir, files[i]);
	}

	/* R2CC_* names the library does not know: typos. */
	for (char **e = environ; *e; e++) {
		char name[128];
		size_t len = strcspn(*e, "=");
		if (strncmp(*e, "R2CC_", 5) || !strncmp(*e, "R2CC_DOCTOR_", 12) ||
		    len >= sizeof(name))
			continue;
		memcpy(name, *e, len);
		name[len] = '\0';
		bool known = false;
		for (int i = 0; r2cc_param_name(i); i++)
			known |= !strcmp(r2cc_param_name(i), name);
		if (known)
			continue;
		c = dr_add(st, DR_SEC_R2CC, DR_WARN, name, "%s is not an R2CC setting", name);
		dr_explain(c, "the library ignores it (a typo?)",
			   "r2cc doctor --help lists the settings");
	}

	if (!nbad && p.mode == R2CC_MODE_PASSTHROUGH) {
		c = dr_add(st, DR_SEC_R2CC, DR_WARN, "R2CC_MODE", "0: plain NCCL, no repair");
		dr_explain(c, "R2CC passes every call through: a NIC failure stops the job",
			   "unset R2CC_MODE (default 2, Balance)");
	}

	/* libr2cc.so next to the tool: <prefix>/bin/r2cc -> <prefix>/lib/libr2cc.so */
	ssize_t r = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (r > 0)
		exe[r] = '\0';
	else if (!realpath(argv0, exe))
		dr_copy(exe, sizeof(exe), argv0);
	char *slash = strrchr(exe, '/');
	if (slash)
		*slash = '\0';
	snprintf(lib, sizeof(lib), "%s/../lib/libr2cc.so", exe);
	if (realpath(lib, st->r2cc_lib) && access(st->r2cc_lib, R_OK) == 0) {
		dr_add(st, DR_SEC_R2CC, DR_OK, "libr2cc.so", "%s; run jobs with LD_PRELOAD=%s",
		       st->r2cc_lib, st->r2cc_lib);
	} else {
		st->r2cc_lib[0] = '\0';
		c = dr_add(st, DR_SEC_R2CC, DR_FAIL, "libr2cc.so", "not found at %s", lib);
		dr_explain(c, "there is no library to preload: no repair",
			   "build it (make) or install bin/ and lib/ together");
	}
}
