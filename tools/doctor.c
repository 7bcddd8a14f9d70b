/*
 * `r2cc doctor`: options, the repairability verdict (with what R2CC would do
 * if each NIC failed, from the cost model in strategies/cost.c) and the
 * report, human (sections of OK / INFO / WARN / FAIL lines, then "What to
 * do") or JSON. The exit status is the worst verdict: 0 OK, 1 WARN, 2 FAIL.
 */
#include "tools/doctor.h"
#include "shim/params.h"
#include "strategies/cost.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const section_title[DR_SEC_COUNT] = {
    [DR_SEC_NIC] = "RDMA NICs",
    [DR_SEC_GPU] = "GPUs and GPUDirect RDMA",
    [DR_SEC_NCCL] = "NCCL",
    [DR_SEC_R2CC] = "R2CC settings",
    [DR_SEC_REPAIR] = "Repairability",
};
static const char *const section_key[DR_SEC_COUNT] = {
    [DR_SEC_NIC] = "nic",   [DR_SEC_GPU] = "gpu",	[DR_SEC_NCCL] = "nccl",
    [DR_SEC_R2CC] = "r2cc", [DR_SEC_REPAIR] = "repair",
};
static const char *const level_tag[] = {"OK", "INFO", "WARN", "FAIL"};

/* Repair predictions, for the report and the JSON. */
struct dr_whatif {
	int nic; /* index in st->nics */
	double balance, backup, ar2, speed_aware;
	int backup_nic;
	double share_after[DR_MAX_NICS]; /* per NIC, fraction of the node's traffic */
};

static struct dr_whatif whatif[DR_MAX_NICS];
static int nwhatif;
static double share_now[DR_MAX_NICS];

struct dr_check *dr_add(struct dr_state *st, enum dr_section sec, enum dr_level lvl,
			const char *item, const char *fmt, ...)
{
	static struct dr_check overflow;
	struct dr_check *c;
	va_list ap;

	if (st->nchecks >= (int)(sizeof(st->checks) / sizeof(st->checks[0])))
		c = &overflow;
	else
		c = &st->checks[st->nchecks++];
	memset(c, 0, sizeof(*c));
	c->section = sec;
	c->level = lvl;
	dr_copy(c->item, sizeof(c->item), item);
	va_start(ap, fmt);
	vsnprintf(c->msg, sizeof(c->msg), fmt, ap);
	va_end(ap);
	return c;
}

void dr_explain(struct dr_check *c, const char *means, const char *fixfmt, ...)
{
	va_list ap;

	dr_copy(c->means, sizeof(c->means), means);
	va_start(ap, fixfmt);
	vsnprintf(c->fix, sizeof(c->fix), fixfmt, ap);
	va_end(ap);
}

const char *dr_path(const struct dr_state *st, char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;
	int n = snprintf(buf, len, "%s", st->sysroot ? st->sysroot : "");

	if (n < 0 || (size_t)n >= len)
		n = 0;
	va_start(ap, fmt);
	vsnprintf(buf + n, len - (size_t)n, fmt, ap);
	va_end(ap);
	return buf;
}

void dr_copy(char *dst, size_t len, const char *src)
{
	size_t n = strnlen(src, len - 1);

	memcpy(dst, src, n);
	dst[n] = '\0';
}

int dr_read_line(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");

	if (!f)
		return -errno;
	if (!fgets(buf, (int)len, f)) {
		fclose(f);
		return -EIO;
	}
	fclose(f);
	buf[strcspn(buf, "\n")] = '\0';
	return 0;
}

void dr_nccl_version_str(int code, char *buf, size_t len)
{
	if (code >= 10000) /* 2.9 and later: major * 10000 + minor * 100 + patch */
		snprintf(buf, len, "%d.%d.%d", code / 10000, code % 10000 / 100, code % 100);
	else
		snprintf(buf, len, "%d.%d.%d", code / 1000, code % 1000 / 100, code % 100);
}

bool dr_nccl_match(const char *filter, const char *name, int port)
{
	bool exclude = false, exact = false, hit = false;
	char buf[512], *save = NULL, *tok;

	if (*filter == '^') {
		exclude = true;
		filter++;
	}
	if (*filter == '=') {
		exact = true;
		filter++;
	}
	dr_copy(buf, sizeof(buf), filter);
	for (tok = strtok_r(buf, ",", &save); tok && !hit; tok = strtok_r(NULL, ",", &save)) {
		char *colon = strchr(tok, ':');
		int want_port = -1;
		if (colon) {
			*colon = '\0';
			want_port = atoi(colon + 1);
		}
		bool name_ok = exact ? !strcmp(tok, name) : !strncmp(tok, name, strlen(tok));
		hit = name_ok && (want_port < 0 || port < 0 || want_port == port);
	}
	return hit != exclude;
}

/* ---- repairability ---- */

static void check_repair(struct dr_state *st)
{
	struct dr_check *c;
	int use[DR_MAX_NICS], nuse = 0, nactive = 0, nactive_all = 0, ndown = 0;
	int other_active = 0;
	bool mixed_ll = false, mixed_speed = false;

	nwhatif = 0;
	for (int i = 0; i < st->nnics; i++) {
		const struct dr_nic *n = &st->nics[i];
		nactive_all += n->active;
		if (!n->nccl_uses) {
			other_active += n->active;
			continue;
		}
		use[nuse++] = i;
		if (n->active)
			nactive++;
		else
			ndown++;
	}
	for (int a = 0; a < nuse; a++) {
		const struct dr_nic *x = &st->nics[use[a]];
		if (!x->active)
			continue;
		for (int b = 0; b < nuse; b++) {
			const struct dr_nic *y = &st->nics[use[b]];
			if (!y->active)
				continue;
			mixed_ll |= strcmp(x->link_layer, y->link_layer) != 0;
			mixed_speed |= fabs(x->gbps - y->gbps) > 0.5;
		}
	}

	if (st->nnics == 0) {
		c = dr_add(st, DR_SEC_REPAIR, DR_FAIL, "verdict", "no RDMA NIC: nothing to repair");
		dr_explain(c, "NCCL would run over TCP sockets",
			   "fix the NIC problems above first");
		return;
	}
	if (nactive == 0) {
		c = dr_add(st, DR_SEC_REPAIR, DR_FAIL, "verdict",
			   "none of the NICs NCCL will use is ACTIVE");
		dr_explain(c, "NCCL has no working RDMA NIC on this node",
			   "bring a port up (see the NIC section) or widen NCCL_IB_HCA");
		return;
	}
	if (nactive == 1 && other_active == 0) {
		const char *only = "";
		for (int a = 0; a < nuse; a++)
			if (st->nics[use[a]].active)
				only = st->nics[use[a]].name;
		c = dr_add(st, DR_SEC_REPAIR, DR_FAIL, "verdict",
			   "only one ACTIVE NIC (%s): if it fails there is no NIC to move its "
			   "traffic to",
			   only);
		dr_explain(c,
			   "R2CC repairs by migrating queue pairs to another NIC of the same "
			   "server; with a single NIC a failure stops the job as with plain NCCL",
			   "give the node at least two ACTIVE RDMA NICs (software device: "
			   "SOFTVERBS_NICS=mlx5_0:100,mlx5_1:100)");
		return;
	}
	if (st->r2cc_mode == 0 || st->r2cc_mode < 0) {
		c = dr_add(st, DR_SEC_REPAIR, st->r2cc_mode < 0 ? DR_FAIL : DR_WARN, "verdict",
			   "%d ACTIVE NICs, but R2CC %s", nactive,
			   st->r2cc_mode < 0 ? "refuses its settings (see above)"
					     : "is set to plain NCCL (R2CC_MODE=0)");
		dr_explain(c, "no repair in this configuration", "fix the R2CC settings above");
	} else if (nactive == 1) {
		c = dr_add(st, DR_SEC_REPAIR, DR_WARN, "verdict",
			   "NCCL uses one ACTIVE NIC; %d other ACTIVE NIC(s) are outside "
			   "NCCL_IB_HCA",
			   other_active);
		dr_explain(c,
			   "repair depends on R2CC opening those NICs itself as backup paths "
			   "(docs/architecture.md, Hot repair)",
			   "include them in NCCL_IB_HCA");
	} else if (!st->r2cc_lib[0]) {
		c = dr_add(st, DR_SEC_REPAIR, DR_FAIL, "verdict",
			   "%d ACTIVE NICs, but libr2cc.so is missing", nactive);
		dr_explain(c, "nothing to preload", "build it: make");
	} else {
		int nfail = 0;
		for (int i = 0; i < st->nchecks; i++)
			nfail += st->checks[i].level == DR_FAIL;
		dr_add(st, DR_SEC_REPAIR, DR_OK, "verdict",
		       "repair conditions met: %d ACTIVE NICs used by NCCL%s%s", nactive,
		       ndown ? " (some already down)" : "",
		       nfail ? "; the job needs the FAILs above fixed first" : "");
	}
	if (mixed_ll) {
		c = dr_add(st, DR_SEC_REPAIR, DR_WARN, "link layer",
			   "the ACTIVE NICs mix InfiniBand and Ethernet");
		dr_explain(c, "a queue pair can only move to a NIC of the same fabric",
			   "restrict NCCL_IB_HCA to NICs of one link layer");
	} else {
		const char *ll = "";
		for (int a = nuse - 1; a >= 0; a--)
			if (st->nics[use[a]].active)
				ll = st->nics[use[a]].link_layer;
		dr_add(st, DR_SEC_REPAIR, DR_OK, "link layer", "all ACTIVE NICs are %s", ll);
	}
	bool soft = false;
	for (int a = 0; a < nuse; a++)
		soft |= st->nics[use[a]].soft;
	if (soft)
		dr_add(st, DR_SEC_REPAIR, DR_OK, "rails",
		       "soft fabric: every NIC reaches every node's NIC of the same name");
	else
		dr_add(st, DR_SEC_REPAIR, DR_INFO, "rails",
		       "cross-node reachability per rail is not visible from one node: "
		       "ib_write_bw -d NIC between two nodes, for each NIC");
	if (ndown)
		dr_add(st, DR_SEC_REPAIR, DR_INFO, "now",
		       "%d of %d NICs down: mode 2 Balance predicts x%.2f, mode 1 x%.2f, "
		       "R2CC-AllReduce x%.2f at %d nodes",
		       ndown, nuse, r2cc_cost_factor_balance(nuse, ndown),
		       r2cc_cost_factor_backup(nuse, ndown),
		       r2cc_cost_factor_ar2(st->nodes, nuse, ndown), st->nodes);
	if (nactive < 2)
		return;

	/* What R2CC would do if each healthy NIC failed, f = ndown + 1 of nuse. */
	double slow_now = 0;
	for (int a = 0; a < nuse; a++) {
		const struct dr_nic *n = &st->nics[use[a]];
		share_now[use[a]] = n->active ? 1.0 / nactive : 0;
		if (n->active && n->gbps > 0 && share_now[use[a]] / n->gbps > slow_now)
			slow_now = share_now[use[a]] / n->gbps;
	}
	for (int a = 0; a < nuse; a++) {
		int j = use[a];
		struct dr_whatif *w;
		double slow = 0, best_gbps = -1;

		if (!st->nics[j].active)
			continue;
		w = &whatif[nwhatif++];
		memset(w, 0, sizeof(*w));
		w->nic = j;
		w->balance = r2cc_cost_factor_balance(nuse, ndown + 1);
		w->backup = r2cc_cost_factor_backup(nuse, ndown + 1);
		w->ar2 = r2cc_cost_factor_ar2(st->nodes, nuse, ndown + 1);
		w->backup_nic = -1;
		for (int b = 0; b < nuse; b++) {
			const struct dr_nic *n = &st->nics[use[b]];
			if (use[b] == j || !n->active)
				continue;
			w->share_after[use[b]] = 1.0 / (nactive - 1);
			if (n->gbps > 0 && w->share_after[use[b]] / n->gbps > slow)
				slow = w->share_after[use[b]] / n->gbps;
			if (n->gbps > best_gbps) {
				best_gbps = n->gbps;
				w->backup_nic = use[b];
			}
		}
		w->speed_aware = slow_now > 0 ? slow / slow_now : w->balance;
		char shares[400] = "";
		for (int b = 0; b < nuse; b++) {
			char one[96];
			if (w->share_after[use[b]] <= 0)
				continue;
			snprintf(one, sizeof(one), "%s%s %.0f%%", shares[0] ? ", " : "",
				 st->nics[use[b]].name, 100 * w->share_after[use[b]]);
			if (strlen(shares) + strlen(one) < sizeof(shares))
				strcat(shares, one);
		}
		char speed[96] = "";
		if (mixed_speed)
			snprintf(speed, sizeof(speed), " (x%.2f counting NIC speeds)",
				 w->speed_aware);
		dr_add(st, DR_SEC_REPAIR, DR_INFO, st->nics[j].name,
		       "if it fails: mode 2 Balance -> %s, time x%.2f%s; mode 1 -> all to %s, "
		       "x%.2f; R2CC-AllReduce at %d nodes x%.2f",
		       shares, w->balance, speed, st->nics[w->backup_nic].name, w->backup,
		       st->nodes, w->ar2);
	}
	if (mixed_speed)
		dr_add(st, DR_SEC_REPAIR, DR_INFO, "speeds",
		       "the ACTIVE NICs differ in speed: NCCL splits traffic evenly, so the "
		       "slowest NIC sets the pace; the cost model assumes equal NICs");
}

/* ---- output ---- */

static void json_str(FILE *o, const char *s)
{
	fputc('"', o);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			fprintf(o, "\\%c", ch);
		else if (ch == '\n')
			fputs("\\n", o);
		else if (ch < 0x20)
			fprintf(o, "\\u%04x", ch);
		else
			fputc(ch, o);
	}
	fputc('"', o);
}

static void json_num(FILE *o, double x)
{
	if (isfinite(x))
		fprintf(o, "%.4g", x);
	else
		fputs("null", o);
}

static void print_json(const struct dr_state *st, int worst, int exit_code)
{
	FILE *o = stdout;
	char ver[32] = "";

	if (st->nccl_code)
		dr_nccl_version_str(st->nccl_code, ver, sizeof(ver));
	fprintf(o, "{\n  \"status\": \"%s\",\n  \"exit\": %d,\n  \"nodes\": %d,\n",
		level_tag[worst], exit_code, st->nodes);
	fputs("  \"ibverbs\": ", o);
	json_str(o, st->verbs_lib);
	fprintf(o, ",\n  \"devices\": %d,\n  \"nics\": [", st->verbs_ndev);
	for (int i = 0; i < st->nnics; i++) {
		const struct dr_nic *n = &st->nics[i];
		fprintf(o, "%s\n    {\"name\": ", i ? "," : "");
		json_str(o, n->name);
		fputs(", \"device\": ", o);
		json_str(o, n->dev);
		fprintf(o, ", \"port\": %d, \"state\": ", n->port);
		json_str(o, n->state);
		fprintf(o, ", \"active\": %s, \"gbps\": ", n->active ? "true" : "false");
		json_num(o, n->gbps);
		fputs(", \"speed\": ", o);
		json_str(o, n->speed_str);
		fputs(", \"link_layer\": ", o);
		json_str(o, n->link_layer);
		fprintf(o, ", \"lid\": %u, \"mtu\": %d, \"gid_index\": %d, \"gid\": ", n->lid,
			n->mtu, n->gid_index);
		json_str(o, n->gid);
		fprintf(o, ", \"soft\": %s, \"pci\": ", n->soft ? "true" : "false");
		json_str(o, n->pci);
		fprintf(o, ", \"numa\": %d, \"driver\": ", n->numa);
		json_str(o, n->driver);
		fputs(", \"nearest_gpu\": ", o);
		json_str(o, n->gpu);
		fputs(", \"gpu_relation\": ", o);
		json_str(o, n->gpu_rel);
		fprintf(o, ", \"nccl_uses\": %s}", n->nccl_uses ? "true" : "false");
	}
	fprintf(o, "\n  ],\n  \"gpus\": %d,\n  \"gpudirect\": %s,\n", st->ngpus,
		st->gdr_peermem || st->gdr_memory_peers ? "true" : "false");
	fputs("  \"nccl\": {\"library\": ", o);
	json_str(o, st->nccl_lib);
	fputs(", \"version\": ", o);
	json_str(o, ver);
	fprintf(o, ", \"code\": %d},\n  \"r2cc\": {\"library\": ", st->nccl_code);
	json_str(o, st->r2cc_lib);
	fprintf(o, ", \"mode\": %d},\n  \"if_failed\": [", st->r2cc_mode);
	for (int i = 0; i < nwhatif; i++) {
		const struct dr_whatif *w = &whatif[i];
		fprintf(o, "%s\n    {\"nic\": ", i ? "," : "");
		json_str(o, st->nics[w->nic].name);
		fputs(", \"balance\": ", o);
		json_num(o, w->balance);
		fputs(", \"backup\": ", o);
		json_num(o, w->backup);
		fputs(", \"backup_nic\": ", o);
		json_str(o, w->backup_nic >= 0 ? st->nics[w->backup_nic].name : "");
		fputs(", \"ar2\": ", o);
		json_num(o, w->ar2);
		fputs(", \"speed_aware\": ", o);
		json_num(o, w->speed_aware);
		fputs(", \"shares\": {", o);
		int first = 1;
		for (int j = 0; j < st->nnics; j++) {
			if (w->share_after[j] <= 0)
				continue;
			fputs(first ? "" : ", ", o);
			first = 0;
			json_str(o, st->nics[j].name);
			fputs(": ", o);
			json_num(o, w->share_after[j]);
		}
		fputs("}}", o);
	}
	fputs("\n  ],\n  \"checks\": [", o);
	for (int i = 0; i < st->nchecks; i++) {
		const struct dr_check *c = &st->checks[i];
		fprintf(o,
			"%s\n    {\"section\": \"%s\", \"level\": \"%s\", \"item\": ", i ? "," : "",
			section_key[c->section], level_tag[c->level]);
		json_str(o, c->item);
		fputs(", \"message\": ", o);
		json_str(o, c->msg);
		fputs(", \"means\": ", o);
		json_str(o, c->means);
		fputs(", \"fix\": ", o);
		json_str(o, c->fix);
		fputc('}', o);
	}
	fputs("\n  ]\n}\n", o);
}

static void print_human(const struct dr_state *st, int worst, int exit_code)
{
	char host[64] = "?", when[32] = "";
	time_t now = time(NULL);
	struct tm tm;
	const char *rule = "=========================================================="
			   "======================";

	gethostname(host, sizeof(host) - 1);
	if (localtime_r(&now, &tm))
		strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
	if (!st->quiet)
		printf("%s\n* r2cc doctor    host %s    %s\n%s\n", rule, host, when, rule);
	for (int s = 0; s < DR_SEC_COUNT; s++) {
		bool header = false;
		for (int i = 0; i < st->nchecks; i++) {
			const struct dr_check *c = &st->checks[i];
			if (c->section != (enum dr_section)s)
				continue;
			if (st->quiet && c->level < DR_WARN)
				continue;
			if (!header) {
				printf("%s* %s\n", st->quiet ? "" : "\n", section_title[s]);
				header = true;
			}
			printf("  %-4s  %-20s %s\n", level_tag[c->level], c->item, c->msg);
			if (c->means[0] && !st->quiet)
				printf("        %-20s means: %s\n", "", c->means);
			if (c->fix[0] && !st->quiet)
				printf("        %-20s fix:   %s\n", "", c->fix);
		}
	}
	int n = 0;
	for (int i = 0; i < st->nchecks; i++)
		n += st->checks[i].level >= DR_WARN && st->checks[i].fix[0];
	if (n) {
		printf("\n* What to do\n");
		n = 0;
		for (int l = DR_FAIL; l >= DR_WARN; l--)
			for (int i = 0; i < st->nchecks; i++) {
				const struct dr_check *c = &st->checks[i];
				if ((int)c->level != l || !c->fix[0])
					continue;
				printf("  %2d. [%s] %s: %s\n", ++n, level_tag[c->level], c->item,
				       c->fix);
			}
	}
	printf("%s%s\n* result: %s (exit %d)%s\n", st->quiet ? "" : "\n", rule,
	       worst == DR_FAIL	  ? "FAIL: problems that stop the job or R2CC's repair"
	       : worst == DR_WARN ? "WARN: R2CC can run; see the warnings"
				  : "OK: nothing stops R2CC from repairing NIC failures here",
	       exit_code, "");
}

static void usage(FILE *o)
{
	fputs("usage: r2cc doctor [--json] [--quiet] [--nodes N] [--nccl LIB] [--ibverbs LIB]\n"
	      "\n"
	      "Checks whether R2CC can keep NCCL jobs running through RDMA NIC failures on\n"
	      "this machine: NICs (libibverbs, sysfs), GPUs and GPUDirect, NCCL and its\n"
	      "settings, R2CC's settings, and what R2CC would do if each NIC failed.\n"
	      "\n"
	      "  --json        JSON instead of the report\n"
	      "  --quiet       only warnings, problems and what to do\n"
	      "  --nodes N     servers in the job, for the R2CC-AllReduce prediction (2)\n"
	      "  --nccl LIB    the NCCL to check (R2CC_DOCTOR_NCCL; default libnccl.so.2)\n"
	      "  --ibverbs LIB the libibverbs to load (R2CC_DOCTOR_IBVERBS; default as NCCL)\n"
	      "\n"
	      "Exit status: 0 all good, 1 warnings, 2 problems that stop R2CC from repairing.\n"
	      "\nR2CC settings:\n",
	      o);
	for (int i = 0; r2cc_param_name(i); i++)
		fprintf(o, "  %-22s %s (default %s)\n", r2cc_param_name(i), r2cc_param_help(i),
			r2cc_param_default(i)[0] ? r2cc_param_default(i) : "unset");
}

int r2cc_doctor_main(int argc, char **argv)
{
	struct dr_state *st = calloc(1, sizeof(*st));
	int worst = DR_OK, exit_code;

	if (!st) {
		fprintf(stderr, "r2cc doctor: out of memory\n");
		return 2;
	}
	st->nodes = 2;
	st->nccl_path = getenv("R2CC_DOCTOR_NCCL");
	st->ibverbs_path = getenv("R2CC_DOCTOR_IBVERBS");
	st->sysroot = getenv("R2CC_DOCTOR_SYSROOT");
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--json")) {
			st->json = true;
		} else if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
			st->quiet = true;
		} else if (!strcmp(a, "--nodes") && i + 1 < argc) {
			char *end;
			long n = strtol(argv[++i], &end, 10);
			if (*end || n < 1 || n > 100000) {
				fprintf(stderr, "r2cc doctor: --nodes takes a number >= 1\n");
				free(st);
				return 2;
			}
			st->nodes = (int)n;
		} else if (!strcmp(a, "--nccl") && i + 1 < argc) {
			st->nccl_path = argv[++i];
		} else if (!strcmp(a, "--ibverbs") && i + 1 < argc) {
			st->ibverbs_path = argv[++i];
		} else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			free(st);
			return 0;
		} else {
			fprintf(stderr, "r2cc doctor: unknown option '%s'\n", a);
			usage(stderr);
			free(st);
			return 2;
		}
	}
	if (st->nccl_path && !*st->nccl_path)
		st->nccl_path = NULL;
	if (st->ibverbs_path && !*st->ibverbs_path)
		st->ibverbs_path = NULL;

	dr_scan_nics(st);
	dr_scan_gpus(st);
	dr_check_nics(st);
	dr_check_gpus(st);
	dr_check_nccl(st);
	dr_check_r2cc(st, argv[0]);
	check_repair(st);

	for (int i = 0; i < st->nchecks; i++)
		if (st->checks[i].level != DR_INFO && (int)st->checks[i].level > worst)
			worst = st->checks[i].level;
	exit_code = worst == DR_FAIL ? 2 : worst == DR_WARN ? 1 : 0;
	if (st->json)
		print_json(st, worst, exit_code);
	else
		print_human(st, worst, exit_code);
	fflush(stdout);
	free(st);
	return exit_code;
}
