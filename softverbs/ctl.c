/*
 * softverbs-ctl: looks at and acts on a software RDMA fabric from outside the job.
 * Every output line is one item, "kind field=value ...", for people and for awk.
 *
 *   softverbs-ctl [--fabric NAME] list
 *   softverbs-ctl [--fabric NAME] fault NODE NIC KIND [ARG]   (kinds: usage())
 *   softverbs-ctl [--fabric NAME] counters [--json]
 *   softverbs-ctl [--fabric NAME] reset
 */
#include "softverbs/fabric.h"
#include "softverbs/softverbs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const sv_qp_states[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};

static int usage(void)
{
	fprintf(stderr, "usage: softverbs-ctl [--fabric NAME] list\n"
			"       softverbs-ctl [--fabric NAME] fault NODE NIC "
			"down|blackhole|blackhole-tx|blackhole-rx|ackloss|fatal|up|\n"
			"                                          "
			"flap PERIOD_MS|slow GBPS|jitter MS\n"
			"       softverbs-ctl [--fabric NAME] counters [--json]\n"
			"       softverbs-ctl [--fabric NAME] reset\n"
			"The fabric defaults to SOFTVERBS_FABRIC, else softverbs-<uid>.\n");
	return 2;
}

static const char *link_name(enum sv_link l)
{
	static const char *const names[] = {
	    [SV_LINK_UP] = "up",
	    [SV_LINK_DOWN] = "down",
	    [SV_LINK_BLACKHOLE] = "blackhole",
	    [SV_LINK_BLACKHOLE_TX] = "blackhole-tx",
	    [SV_LINK_BLACKHOLE_RX] = "blackhole-rx",
	    [SV_LINK_ACKLOSS] = "ackloss",
	    [SV_LINK_DEAD] = "dead",
	};

	return names[l];
}

static int peer_nic(struct sv_fabric *f, uint32_t dlid)
{
	for (int i = 0; i < SV_MAX_NICS; i++)
		if (atomic_load(&f->nics[i].used) && f->nics[i].lid == dlid)
			return i;
	return -1;
}

static void nic_line(struct sv_fabric *f, int i, int64_t now)
{
	struct sv_nic *n = &f->nics[i];
	enum sv_link l = sv_nic_link(f, i, now);
	int fault = atomic_load(&n->fault);

	printf("nic node=%s name=%s lid=%u", f->nodes[n->node].name, n->name,
	       f->net.link == SV_LL_ROCE ? 0u : (unsigned)n->lid);
	if (f->net.link == SV_LL_ROCE) {
		uint32_t ip = sv_nic_ipv4(f, i);

		printf(" ip=%u.%u.%u.%u/24", ip >> 24, ip >> 16 & 0xff, ip >> 8 & 0xff, ip & 0xff);
	}
	printf(" gbps=%d port=%s fault=%s", n->gbps,
	       l == SV_LINK_DOWN   ? "DOWN"
	       : l == SV_LINK_DEAD ? "FATAL"
				   : "ACTIVE",
	       sv_fault_name(fault));
	if (sv_fault_takes_arg(fault))
		printf(":%d", atomic_load(&n->fault_arg));
	printf(" link=%s tx_bytes=%llu rx_bytes=%llu tx_packets=%llu rx_packets=%llu "
	       "lossy_bytes=%llu\n",
	       link_name(l), (unsigned long long)atomic_load(&n->tx_bytes),
	       (unsigned long long)atomic_load(&n->rx_bytes),
	       (unsigned long long)atomic_load(&n->tx_packets),
	       (unsigned long long)atomic_load(&n->rx_packets),
	       (unsigned long long)atomic_load(&n->lossy_bytes));
}

/* A QP's GRH (RoCE); peer=- above when it reaches no NIC. */
static void grh_fields(const struct ibv_global_route *g)
{
	char dgid[INET6_ADDRSTRLEN];

	if (!inet_ntop(AF_INET6, g->dgid.raw, dgid, sizeof(dgid)))
		snprintf(dgid, sizeof(dgid), "?");
	printf(" sgid_index=%u dgid=%s traffic_class=%u flow_label=%u hop_limit=%u", g->sgid_index,
	       dgid, g->traffic_class, g->flow_label, g->hop_limit);
}

static int cmd_list(struct sv_fabric *f)
{
	int64_t now = sv_now_ns();

	sv_fabric_reap(f);
	printf("fabric age_ms=%lld link_layer=%s routed=%d lossless_tc=%d mtu=%d\n",
	       (long long)((now - f->start_ns) / 1000000), sv_link_layer_name(f->net.link),
	       f->net.routed, f->net.lossless_tc, 128 << f->net.active_mtu);
	for (int i = 0; i < SV_MAX_NODES; i++)
		if (atomic_load(&f->nodes[i].used))
			printf("node name=%s nics=%d\n", f->nodes[i].name, f->nodes[i].nnics);
	for (int i = 0; i < SV_MAX_NICS; i++)
		if (atomic_load(&f->nics[i].used))
			nic_line(f, i, now);
	for (int i = 0; i < SV_MAX_PROCS; i++) {
		int pid = atomic_load(&f->procs[i].pid);

		if (pid)
			printf("proc pid=%d node=%s\n", pid, f->nodes[f->procs[i].node].name);
	}
	for (int i = 0; i < SV_MAX_QPS; i++) {
		struct sv_qp_slot *q = &f->qps[i];
		uint32_t qpn = atomic_load(&q->qpn);
		int st = atomic_load(&q->state), peer;

		if (!qpn || qpn == SV_QPN_CLAIMED)
			continue;
		peer = f->net.link == SV_LL_ROCE ? atomic_load(&q->grh_peer)
						 : peer_nic(f, atomic_load(&q->dlid));
		printf("qp qpn=0x%06x pid=%d node=%s nic=%s state=%s dest_qpn=0x%06x peer=%s/%s "
		       "rq=%u/%u",
		       qpn, q->pid, f->nodes[f->nics[q->nic].node].name, f->nics[q->nic].name,
		       st >= 0 && st <= IBV_QPS_ERR ? sv_qp_states[st] : "?",
		       atomic_load(&q->dest_qpn),
		       peer < 0 ? "-" : f->nodes[f->nics[peer].node].name,
		       peer < 0 ? "-" : f->nics[peer].name, q->rq_tail - q->rq_head, q->rq_size);
		if (f->net.link == SV_LL_ROCE)
			grh_fields(&q->grh);
		printf("\n");
	}
	for (int i = 0; i < SV_MAX_SCHED; i++) {
		struct sv_sched *s = &f->sched[i];
		int st = atomic_load(&s->state);

		if (st >= 2)
			printf("scheduled node=%s nic=%s fault=%s arg=%d at_ms=%lld %s\n", s->node,
			       s->nic, sv_fault_name(s->kind), s->arg,
			       (long long)((s->at_ns - f->start_ns) / 1000000),
			       st == 3 ? "applied" : "pending");
	}
	return 0;
}

static int cmd_counters(struct sv_fabric *f, bool json)
{
	struct softverbs_nic_stat st[SV_MAX_NICS];
	int n = sv_fabric_nic_stats(f, NULL, st, SV_MAX_NICS);

	if (json)
		printf("[\n");
	for (int i = 0; i < n; i++) {
		int k = sv_fabric_find_nic(f, st[i].node, st[i].name);
		unsigned long long lossy = k < 0 ? 0 : atomic_load(&f->nics[k].lossy_bytes);

		if (json)
			printf("  {\"node\": \"%s\", \"nic\": \"%s\", \"gbps\": %d, \"fault\": "
			       "\"%s\", "
			       "\"tx_bytes\": %llu, \"rx_bytes\": %llu, \"tx_packets\": %llu, "
			       "\"rx_packets\": %llu, \"lossy_bytes\": %llu}%s\n",
			       st[i].node, st[i].name, st[i].gbps, sv_fault_name(st[i].state),
			       (unsigned long long)st[i].tx_bytes,
			       (unsigned long long)st[i].rx_bytes,
			       (unsigned long long)st[i].tx_packets,
			       (unsigned long long)st[i].rx_packets, lossy, i + 1 < n ? "," : "");
		else
			printf(
			    "counters node=%s nic=%s tx_bytes=%llu rx_bytes=%llu tx_packets=%llu "
			    "rx_packets=%llu lossy_bytes=%llu\n",
			    st[i].node, st[i].name, (unsigned long long)st[i].tx_bytes,
			    (unsigned long long)st[i].rx_bytes,
			    (unsigned long long)st[i].tx_packets,
			    (unsigned long long)st[i].rx_packets, lossy);
	}
	if (json)
		printf("]\n");
	return 0;
}

static int cmd_fault(struct sv_fabric *f, int argc, char **argv)
{
	int kind, arg = 0, nic;
	char *end;

	if (argc < 3 || sv_fault_parse(argv[2], &kind) != 0)
		return usage();
	if (sv_fault_takes_arg(kind)) {
		if (argc != 4)
			return usage();
		arg = (int)strtol(argv[3], &end, 10);
		if (*end || arg <= 0) {
			fprintf(stderr, "softverbs-ctl: %s needs a positive number, not '%s'\n",
				argv[2], argv[3]);
			return 2;
		}
	} else if (argc != 3) {
		return usage();
	}
	nic = sv_fabric_find_nic(f, argv[0], argv[1]);
	if (nic < 0) {
		fprintf(stderr, "softverbs-ctl: no NIC %s on node %s\n", argv[1], argv[0]);
		return 1;
	}
	sv_fabric_set_fault(f, nic, kind, arg);
	nic_line(f, nic, sv_now_ns());
	return 0;
}

int main(int argc, char **argv)
{
	struct sv_config cfg;
	struct sv_fabric *f;
	const char *cmd;
	int i = 1, rc;

	sv_config_read(&cfg);
	if (i + 1 < argc && strcmp(argv[i], "--fabric") == 0) {
		snprintf(cfg.fabric, sizeof(cfg.fabric), "%s", argv[i + 1]);
		i += 2;
	}
	if (i >= argc)
		return usage();
	cmd = argv[i++];
	if (strcmp(cmd, "reset") == 0) {
		rc = sv_fabric_remove(cfg.fabric);
		if (rc < 0 && rc != -ENOENT) {
			fprintf(stderr, "softverbs-ctl: cannot remove %s: %s\n", cfg.fabric,
				strerror(-rc));
			return 1;
		}
		printf("reset fabric=%s\n", cfg.fabric);
		return 0;
	}
	if (strcmp(cmd, "list") && strcmp(cmd, "fault") && strcmp(cmd, "counters"))
		return usage();
	f = sv_fabric_attach(cfg.fabric, false);
	if (!f) {
		fprintf(stderr, "softverbs-ctl: no fabric %s: %s%s\n", cfg.fabric, strerror(errno),
			errno == EPROTO ? " (another version's, or half made: use reset)" : "");
		return 1;
	}
	if (strcmp(cmd, "list") == 0)
		rc = argc == i ? cmd_list(f) : usage();
	else if (strcmp(cmd, "counters") == 0)
		rc = argc == i					       ? cmd_counters(f, false)
		     : argc == i + 1 && strcmp(argv[i], "--json") == 0 ? cmd_counters(f, true)
								       : usage();
	else
		rc = cmd_fault(f, argc - i, argv + i);
	sv_fabric_detach(f);
	return rc;
}
