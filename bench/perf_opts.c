/* Command line, names and nccl-tests' formulas of r2cc-perf (see perf_opts.h). The
 * flags and defaults follow NVIDIA nccl-tests so that scripts written for its binaries
 * run unchanged; the long options that nccl-tests does not have are R2CC's.
 */
#include "bench/perf_opts.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const type_names[PERF_NTYPES] = {
    "int8", "uint8", "int32",  "uint32",   "int64",  "uint64",
    "half", "float", "double", "bfloat16", "f8e4m3", "f8e5m2",
};

static const char *const op_names[PERF_NOPS] = {"sum", "prod", "max", "min", "avg"};

static const struct {
	const char *name, *verb, *prog;
} colls[PERF_NCOLLS] = {
    [PERF_ALLREDUCE] = {"allreduce", "AllReduce", "all_reduce_perf"},
    [PERF_ALLGATHER] = {"allgather", "AllGather", "all_gather_perf"},
    [PERF_REDUCESCATTER] = {"reducescatter", "ReduceScatter", "reduce_scatter_perf"},
    [PERF_BROADCAST] = {"broadcast", "Broadcast", "broadcast_perf"},
    [PERF_REDUCE] = {"reduce", "Reduce", "reduce_perf"},
    [PERF_ALLTOALL] = {"alltoall", "AlltoAll", "alltoall_perf"},
    [PERF_SENDRECV] = {"sendrecv", "SendRecv", "sendrecv_perf"},
};

int64_t perf_parse_size(const char *s)
{
	char *end;
	double v;
	double unit = 1;

	errno = 0;
	v = strtod(s, &end);
	if (end == s || errno || v < 0)
		return -1;
	switch (*end) {
	case 'G':
	case 'g':
		unit = 1024.0 * 1024 * 1024, end++;
		break;
	case 'M':
	case 'm':
		unit = 1024.0 * 1024, end++;
		break;
	case 'K':
	case 'k':
		unit = 1024, end++;
		break;
	default:
		break;
	}
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end)
		return -1;
	v *= unit;
	if (v > 9.0e18)
		return -1;
	return (int64_t)v;
}

int perf_type_from_name(const char *s)
{
	static const struct {
		const char *alias;
		int type;
	} aliases[] = {
	    {"char", PERF_INT8},      {"int", PERF_INT32},	{"float16", PERF_HALF},
	    {"fp16", PERF_HALF},      {"float32", PERF_FLOAT},	{"fp32", PERF_FLOAT},
	    {"float64", PERF_DOUBLE}, {"fp64", PERF_DOUBLE},	{"bf16", PERF_BF16},
	    {"fp8e4m3", PERF_F8E4M3}, {"fp8e5m2", PERF_F8E5M2},
	};
	if (!strcasecmp(s, "all"))
		return PERF_ALL;
	for (int t = 0; t < PERF_NTYPES; t++)
		if (!strcasecmp(s, type_names[t]))
			return t;
	for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++)
		if (!strcasecmp(s, aliases[i].alias))
			return aliases[i].type;
	return -EINVAL;
}

int perf_op_from_name(const char *s)
{
	if (!strcasecmp(s, "all"))
		return PERF_ALL;
	for (int op = 0; op < PERF_NOPS; op++)
		if (!strcasecmp(s, op_names[op]))
			return op;
	return -EINVAL;
}

int perf_coll_from_name(const char *s)
{
	const char *base = strrchr(s, '/');
	base = base ? base + 1 : s;
	for (int c = 0; c < PERF_NCOLLS; c++) {
		size_t n = strlen(colls[c].prog);
		if (!strcasecmp(base, colls[c].name) || !strcasecmp(base, colls[c].verb))
			return c;
		/* all_reduce_perf, all_reduce_perf_mpi, all_reduce */
		if (!strncmp(base, colls[c].prog, n) && (base[n] == 0 || base[n] == '_'))
			return c;
		if (!strncmp(base, colls[c].prog, n - 5) && base[n - 5] == 0)
			return c;
	}
	return -EINVAL;
}

const char *perf_type_name(int t)
{
	return t >= 0 && t < PERF_NTYPES ? type_names[t] : "?";
}

const char *perf_op_name(int op)
{
	return op >= 0 && op < PERF_NOPS ? op_names[op] : "none";
}

const char *perf_coll_name(int coll)
{
	return colls[coll].name;
}

const char *perf_coll_verb(int coll)
{
	return colls[coll].verb;
}

int perf_coll_has_op(int coll)
{
	return coll == PERF_ALLREDUCE || coll == PERF_REDUCESCATTER || coll == PERF_REDUCE;
}

int perf_coll_has_root(int coll)
{
	return coll == PERF_BROADCAST || coll == PERF_REDUCE;
}

int perf_coll_checks_inplace(int coll)
{
	return coll != PERF_ALLTOALL && coll != PERF_SENDRECV;
}

void perf_geom_make(struct perf_geom *g, int coll, uint64_t bytes, int t, int n)
{
	uint64_t es = (uint64_t)perf_type_size(t);
	uint64_t count = bytes / es;
	/* keeps per-rank chunks 16-byte aligned, as nccl-tests does */
	uint64_t base = (count / (uint64_t)n) & ~(16 / es - 1);

	memset(g, 0, sizeof(*g));
	switch (coll) {
	case PERF_ALLGATHER:
		g->sendcount = base, g->recvcount = base * (uint64_t)n, g->paramcount = base;
		g->send_inplace_off = base;
		break;
	case PERF_REDUCESCATTER:
		g->sendcount = base * (uint64_t)n, g->recvcount = base, g->paramcount = base;
		g->recv_inplace_off = base;
		break;
	case PERF_ALLTOALL:
		g->paramcount = base;
		g->sendcount = g->recvcount = base * (uint64_t)n;
		break;
	default:
		g->sendcount = g->recvcount = g->paramcount = count;
		break;
	}
}

void perf_bandwidth(int coll, const struct perf_geom *g, int t, int n, double sec, double *algbw,
		    double *busbw)
{
	double bytes = (double)g->paramcount * perf_type_size(t);
	double factor = 1;

	switch (coll) {
	case PERF_ALLREDUCE:
		factor = 2.0 * (n - 1) / n;
		break;
	case PERF_ALLGATHER:
	case PERF_REDUCESCATTER:
	case PERF_ALLTOALL:
		bytes *= n;
		factor = (double)(n - 1) / n;
		break;
	default:
		break;
	}
	*algbw = sec > 0 ? bytes / 1.0e9 / sec : 0;
	*busbw = *algbw * factor;
}

void perf_format_time(char *buf, size_t len, double usec)
{
	if (usec >= 10000.0)
		snprintf(buf, len, "%7.0f", usec);
	else if (usec >= 100.0)
		snprintf(buf, len, "%7.1f", usec);
	else
		snprintf(buf, len, "%7.2f", usec);
}

void perf_opts_usage(const char *prog)
{
	printf(
	    "USAGE: %s\n"
	    "  nccl-tests flags:\n"
	    "  [-t,--nthreads <1>] [-g,--ngpus <GPUs per process>]\n"
	    "  [-b,--minbytes <min size>] [-e,--maxbytes <max size>] (K/M/G suffixes)\n"
	    "  [-i,--stepbytes <increment>] [-f,--stepfactor <factor>]\n"
	    "  [-n,--iters <n>] [-w,--warmup_iters <n>] [-m,--agg_iters <n>]\n"
	    "  [-N,--run_cycles <n, 0=forever>] [-p,--parallel_init <0/1>]\n"
	    "  [-c,--check <check iterations>] [-o,--op <sum/prod/max/min/avg/all>]\n"
	    "  [-d,--datatype <int8/uint8/int32/uint32/int64/uint64/half/float/double/\n"
	    "                  bfloat16/f8e4m3/f8e5m2/all>] [-r,--root <root/all>]\n"
	    "  [-z,--blocking <0/1>] [-a,--average <0/1/2/3>] [-T,--timeout <seconds>]\n"
	    "  [-h,--help]\n"
	    "  R2CC flags:\n"
	    "  [--coll allreduce|allgather|reducescatter|broadcast|reduce|alltoall|sendrecv]\n"
	    "  [--nodes N --gpus-per-node G]  spawn N x G ranks on this host, one NCCL_HOSTID\n"
	    "                                 per emulated node (node0, node1, ...)\n"
	    "  [--split-cpus]  with --nodes: each emulated node's ranks run on their own\n"
	    "                  share of this process's cores, as separate hosts would\n"
	    "  [--nic-table[=node]] [--nic-table-all]  per-iteration NIC bytes (last size / all)\n"
	    "  [--iters-table]  verify and report every iteration (hot-repair test)\n"
	    "  [--selftest-wrong]  corrupt one output element to prove the checker\n"
	    "  Environment: R2CC_PERF_ROOT=host:port (rendezvous; default MASTER_ADDR and\n"
	    "  MASTER_PORT+1, or 127.0.0.1:29517)\n",
	    prog);
}

static int parse_int(const char *arg, const char *name, int min, int *out)
{
	char *end;
	long v;
	errno = 0;
	v = strtol(arg, &end, 0);
	if (end == arg || *end || errno || v < min || v > 1000000000) {
		fprintf(stderr, "r2cc-perf: invalid value '%s' for %s (an integer >= %d)\n", arg,
			name, min);
		return -EINVAL;
	}
	*out = (int)v;
	return 0;
}

static int parse_size_arg(const char *arg, const char *name, uint64_t *out)
{
	int64_t v = perf_parse_size(arg);
	if (v < 0) {
		fprintf(stderr, "r2cc-perf: invalid size '%s' for %s (bytes, K/M/G suffixes)\n",
			arg, name);
		return -EINVAL;
	}
	*out = (uint64_t)v;
	return 0;
}

enum {
	OPT_COLL = 256,
	OPT_NODES,
	OPT_GPN,
	OPT_SPLITCPUS,
	OPT_SELFTEST,
	OPT_NICTABLE,
	OPT_NICTABLE_ALL,
	OPT_ITERSTABLE,
};

int perf_opts_parse(struct perf_opts *o, int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"nthreads", required_argument, 0, 't'},
	    {"ngpus", required_argument, 0, 'g'},
	    {"minbytes", required_argument, 0, 'b'},
	    {"maxbytes", required_argument, 0, 'e'},
	    {"stepbytes", required_argument, 0, 'i'},
	    {"stepfactor", required_argument, 0, 'f'},
	    {"iters", required_argument, 0, 'n'},
	    {"agg_iters", required_argument, 0, 'm'},
	    {"warmup_iters", required_argument, 0, 'w'},
	    {"run_cycles", required_argument, 0, 'N'},
	    {"parallel_init", required_argument, 0, 'p'},
	    {"check", required_argument, 0, 'c'},
	    {"op", required_argument, 0, 'o'},
	    {"datatype", required_argument, 0, 'd'},
	    {"root", required_argument, 0, 'r'},
	    {"blocking", required_argument, 0, 'z'},
	    {"stream_null", required_argument, 0, 'y'},
	    {"timeout", required_argument, 0, 'T'},
	    {"cudagraph", required_argument, 0, 'G'},
	    {"report_cputime", required_argument, 0, 'C'},
	    {"local_register", required_argument, 0, 'R'},
	    {"report_timestamps", required_argument, 0, 'S'},
	    {"output_file", required_argument, 0, 'J'},
	    {"memory", required_argument, 0, 'M'},
	    {"unalign", required_argument, 0, 'u'},
	    {"per_iter_timing", required_argument, 0, 'I'},
	    {"per_iter_skip", required_argument, 0, 'K'},
	    {"cta_policy", required_argument, 0, 'x'},
	    {"device_implementation", required_argument, 0, 'D'},
	    {"device_cta_count", required_argument, 0, 'V'},
	    {"average", required_argument, 0, 'a'},
	    {"help", no_argument, 0, 'h'},
	    {"coll", required_argument, 0, OPT_COLL},
	    {"nodes", required_argument, 0, OPT_NODES},
	    {"gpus-per-node", required_argument, 0, OPT_GPN},
	    {"split-cpus", no_argument, 0, OPT_SPLITCPUS},
	    {"selftest-wrong", no_argument, 0, OPT_SELFTEST},
	    {"nic-table", optional_argument, 0, OPT_NICTABLE},
	    {"nic-table-all", no_argument, 0, OPT_NICTABLE_ALL},
	    {"iters-table", no_argument, 0, OPT_ITERSTABLE},
	    {0, 0, 0, 0},
	};
	int c, v, rc = 0;

	memset(o, 0, sizeof(*o));
	o->coll = perf_coll_from_name(argv[0]);
	if (o->coll < 0)
		o->coll = PERF_ALLREDUCE;
	o->minbytes = o->maxbytes = 32 << 20;
	o->stepbytes = 1 << 20;
	o->nthreads = o->ngpus = 1;
	o->iters = 20, o->warmup_iters = 1, o->agg_iters = 1, o->run_cycles = 1;
	o->check = 1;
	o->type = PERF_FLOAT, o->op = PERF_SUM, o->root = 0;
	o->average = 1;
	o->timeout_s = 600;

	optind = 1;
	opterr = 1;
	while (rc == 0 &&
	       (c = getopt_long(argc, argv,
				"t:g:b:e:i:f:n:m:w:N:p:c:o:d:r:z:y:T:G:a:C:R:S:J:M:u:I:K:x:D:V:h",
				longopts, NULL)) != -1) {
		switch (c) {
		case 't':
			rc = parse_int(optarg, "-t", 1, &o->nthreads);
			if (!rc && o->nthreads != 1) {
				fprintf(stderr, "r2cc-perf: -t supports 1 thread only; use -g or "
						"one process per GPU\n");
				rc = -EINVAL;
			}
			break;
		case 'g':
			rc = parse_int(optarg, "-g", 1, &o->ngpus);
			break;
		case 'b':
			rc = parse_size_arg(optarg, "-b", &o->minbytes);
			break;
		case 'e':
			rc = parse_size_arg(optarg, "-e", &o->maxbytes);
			break;
		case 'i':
			rc = parse_size_arg(optarg, "-i", &o->stepbytes);
			o->stepfactor = 0;
			break;
		case 'f':
			rc = parse_int(optarg, "-f", 1, &v);
			o->stepfactor = v > 1 ? (uint64_t)v : 0;
			break;
		case 'n':
			rc = parse_int(optarg, "-n", 1, &o->iters);
			break;
		case 'm':
			rc = parse_int(optarg, "-m", 1, &o->agg_iters);
			break;
		case 'w':
			rc = parse_int(optarg, "-w", 0, &o->warmup_iters);
			break;
		case 'N':
			rc = parse_int(optarg, "-N", 0, &o->run_cycles);
			break;
		case 'p':
			rc = parse_int(optarg, "-p", 0, &o->parallel_init);
			break;
		case 'c':
			rc = parse_int(optarg, "-c", 0, &o->check);
			break;
		case 'o':
			o->op = perf_op_from_name(optarg);
			if (o->op == -EINVAL) {
				fprintf(stderr,
					"r2cc-perf: invalid op '%s' (sum/prod/max/min/avg/all)\n",
					optarg);
				rc = -EINVAL;
			}
			break;
		case 'd':
			o->type = perf_type_from_name(optarg);
			if (o->type == -EINVAL) {
				fprintf(stderr, "r2cc-perf: invalid datatype '%s'\n", optarg);
				rc = -EINVAL;
			}
			break;
		case 'r':
			if (!strcasecmp(optarg, "all"))
				o->root = PERF_ALL;
			else
				rc = parse_int(optarg, "-r", 0, &o->root);
			break;
		case 'z':
			rc = parse_int(optarg, "-z", 0, &o->blocking);
			break;
		case 'y':
			rc = parse_int(optarg, "-y", 0, &v);
			break;
		case 'T':
			rc = parse_int(optarg, "-T", 0, &o->timeout_s);
			break;
		case 'G':
			rc = parse_int(optarg, "-G", 0, &v);
			if (!rc && v)
				fprintf(stderr,
					"r2cc-perf: -G (CUDA graphs) not supported, ignored\n");
			break;
		case 'C':
		case 'R':
		case 'S':
		case 'J':
		case 'M':
		case 'u':
		case 'I':
		case 'K':
		case 'x':
		case 'D':
		case 'V':
			/* newer nccl-tests options: accepted so that scripts run, not implemented
			 */
			if (strcmp(optarg, "0") && strcmp(optarg, "-1"))
				fprintf(stderr, "r2cc-perf: -%c %s is not supported, ignored\n", c,
					optarg);
			break;
		case 'a':
			rc = parse_int(optarg, "-a", 0, &o->average);
			if (!rc && o->average > 3) {
				fprintf(stderr, "r2cc-perf: -a takes 0..3\n");
				rc = -EINVAL;
			}
			break;
		case OPT_COLL:
			o->coll = perf_coll_from_name(optarg);
			if (o->coll < 0) {
				fprintf(stderr, "r2cc-perf: unknown collective '%s'\n", optarg);
				rc = -EINVAL;
			}
			break;
		case OPT_NODES:
			rc = parse_int(optarg, "--nodes", 1, &o->nodes);
			break;
		case OPT_GPN:
			rc = parse_int(optarg, "--gpus-per-node", 1, &o->gpus_per_node);
			break;
		case OPT_SPLITCPUS:
			o->split_cpus = 1;
			break;
		case OPT_SELFTEST:
			o->selftest_wrong = 1;
			break;
		case OPT_NICTABLE:
			o->nic_table = 1;
			if (optarg) {
				if (strlen(optarg) >= sizeof(o->nic_node)) {
					fprintf(stderr, "r2cc-perf: node name too long\n");
					rc = -EINVAL;
				}
				snprintf(o->nic_node, sizeof(o->nic_node), "%s", optarg);
			}
			break;
		case OPT_NICTABLE_ALL:
			o->nic_table = o->nic_table_all = 1;
			break;
		case OPT_ITERSTABLE:
			o->iters_table = 1;
			break;
		case 'h':
			perf_opts_usage(argv[0]);
			return 1;
		default:
			perf_opts_usage(argv[0]);
			return -EINVAL;
		}
	}
	if (rc)
		return rc;
	if (optind < argc) {
		fprintf(stderr, "r2cc-perf: unexpected argument '%s'\n", argv[optind]);
		return -EINVAL;
	}
	if (o->minbytes > o->maxbytes) {
		fprintf(stderr, "r2cc-perf: invalid sizes: minbytes %llu > maxbytes %llu\n",
			(unsigned long long)o->minbytes, (unsigned long long)o->maxbytes);
		return -EINVAL;
	}
	if (!o->stepfactor && !o->stepbytes && o->minbytes != o->maxbytes) {
		fprintf(stderr, "r2cc-perf: -i 0 needs -b equal to -e\n");
		return -EINVAL;
	}
	if ((o->nodes > 0) != (o->gpus_per_node > 0)) {
		fprintf(stderr, "r2cc-perf: --nodes and --gpus-per-node go together\n");
		return -EINVAL;
	}
	if (o->split_cpus && !o->nodes) {
		fprintf(stderr, "r2cc-perf: --split-cpus goes with --nodes\n");
		return -EINVAL;
	}
	if (o->nodes && o->ngpus != 1) {
		fprintf(stderr, "r2cc-perf: --nodes runs one GPU per process; drop -g\n");
		return -EINVAL;
	}
	if (o->iters_table && o->agg_iters != 1) {
		fprintf(stderr, "r2cc-perf: --iters-table needs -m 1\n");
		return -EINVAL;
	}
	return 0;
}
