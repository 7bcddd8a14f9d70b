/* NIC counter sources of r2cc-perf (see perf_nic.h). The library symbols are looked up
 * in the global scope first and then in the already loaded library itself, because NCCL
 * dlopens libibverbs without RTLD_GLOBAL.
 */
#include "bench/perf_nic.h"

#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int (*softverbs_stats_fn)(const char *node, struct softverbs_nic_stat *out, int max);
typedef int (*r2cc_stats_fn)(struct r2cc_nic_stat *out, int max);

static void *find_symbol(const char *sym, const char *const *libs)
{
	void *p = dlsym(RTLD_DEFAULT, sym);
	for (int i = 0; !p && libs[i]; i++) {
		void *h = dlopen(libs[i], RTLD_NOW | RTLD_NOLOAD);
		if (h)
			p = dlsym(h, sym);
	}
	return p;
}

static softverbs_stats_fn softverbs_fn(void)
{
	static const char *const libs[] = {"libibverbs.so.1", "libibverbs.so", NULL};
	return (softverbs_stats_fn)find_symbol("softverbs_nic_stats", libs);
}

static r2cc_stats_fn r2cc_fn(void)
{
	static const char *const libs[] = {"libr2cc.so", NULL};
	return (r2cc_stats_fn)find_symbol("r2cc_nic_stats", libs);
}

static int sysfs_has_ib(void)
{
	DIR *d = opendir("/sys/class/infiniband");
	struct dirent *e;
	int found = 0;
	if (!d)
		return 0;
	while (!found && (e = readdir(d)))
		found = e->d_name[0] != '.';
	closedir(d);
	return found;
}

int perf_nic_source(void)
{
	if (softverbs_fn())
		return PERF_NIC_SOFTVERBS;
	if (r2cc_fn())
		return PERF_NIC_R2CC;
	if (sysfs_has_ib())
		return PERF_NIC_SYSFS;
	return PERF_NIC_NONE;
}

const char *perf_nic_source_name(int source)
{
	switch (source) {
	case PERF_NIC_SOFTVERBS:
		return "softverbs_nic_stats";
	case PERF_NIC_R2CC:
		return "r2cc_nic_stats (sum over the node's processes)";
	case PERF_NIC_SYSFS:
		return "port_rcv_data/port_xmit_data *4B";
	default:
		return "none";
	}
}

static void add(struct perf_nic_sample *s, const char *name, uint64_t rx, uint64_t tx)
{
	int i;
	for (i = 0; i < s->n; i++)
		if (!strcmp(s->name[i], name))
			break;
	if (i == s->n) {
		if (s->n == PERF_NIC_MAX)
			return;
		snprintf(s->name[i], sizeof(s->name[i]), "%s", name);
		s->rx[i] = s->tx[i] = 0;
		s->n++;
	}
	s->rx[i] += rx;
	s->tx[i] += tx;
}

static uint64_t read_counter(const char *path)
{
	unsigned long long v = 0;
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	if (fscanf(f, "%llu", &v) != 1)
		v = 0;
	fclose(f);
	return v;
}

static void read_sysfs(struct perf_nic_sample *s)
{
	DIR *d = opendir("/sys/class/infiniband"), *pd;
	struct dirent *e, *pe;
	char path[1024], name[520];
	if (!d)
		return;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports", e->d_name);
		pd = opendir(path);
		if (!pd)
			continue;
		while ((pe = readdir(pd))) {
			uint64_t rx, tx;
			if (pe->d_name[0] == '.')
				continue;
			snprintf(path, sizeof(path),
				 "/sys/class/infiniband/%s/ports/%s/counters/port_rcv_data",
				 e->d_name, pe->d_name);
			rx = read_counter(path) * 4;
			snprintf(path, sizeof(path),
				 "/sys/class/infiniband/%s/ports/%s/counters/port_xmit_data",
				 e->d_name, pe->d_name);
			tx = read_counter(path) * 4;
			if (!strcmp(pe->d_name, "1"))
				snprintf(name, sizeof(name), "%s", e->d_name);
			else
				snprintf(name, sizeof(name), "%s:%s", e->d_name, pe->d_name);
			add(s, name, rx, tx);
		}
		closedir(pd);
	}
	closedir(d);
}

void perf_nic_read(int source, const char *node, int contribute, struct perf_nic_sample *s)
{
	memset(s, 0, sizeof(*s));
	s->source = source;
	if (!contribute && source != PERF_NIC_R2CC)
		return;
	if (source == PERF_NIC_SOFTVERBS) {
		struct softverbs_nic_stat st[PERF_NIC_MAX * 4];
		softverbs_stats_fn fn = softverbs_fn();
		int n = fn ? fn(node, st, PERF_NIC_MAX * 4) : 0;
		for (int i = 0; i < n && i < PERF_NIC_MAX * 4; i++)
			if (!node || !*node || !strcmp(st[i].node, node))
				add(s, st[i].name, st[i].rx_bytes, st[i].tx_bytes);
	} else if (source == PERF_NIC_R2CC) {
		struct r2cc_nic_stat st[PERF_NIC_MAX];
		r2cc_stats_fn fn = r2cc_fn();
		int n = contribute && fn ? fn(st, PERF_NIC_MAX) : 0;
		for (int i = 0; i < n && i < PERF_NIC_MAX; i++)
			add(s, st[i].name, st[i].rx_bytes, st[i].tx_bytes);
	} else if (source == PERF_NIC_SYSFS) {
		read_sysfs(s);
	}
}

void perf_nic_merge(struct perf_nic_sample *a, const struct perf_nic_sample *b)
{
	for (int i = 0; i < b->n; i++)
		add(a, b->name[i], b->rx[i], b->tx[i]);
}
