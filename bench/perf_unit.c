/* Host-only unit test of r2cc-perf's plain-C parts: size and option parsing, nccl-tests'
 * geometry and bandwidth formulas, the exactness of the data patterns in every type and
 * reduction (every partial result of every order representable), the expected values of
 * every collective against a direct simulation, the checker catching one bad element,
 * the TCP rendezvous between forked processes, the spawner, and the NIC counter lookup.
 * Needs no GPU and no CUDA runtime.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/perf_launch.h"
#include "bench/perf_nic.h"
#include "bench/perf_opts.h"
#include "bench/perf_pattern.h"
#include "bench/perf_rdv.h"

static int failures;

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			failures++;                                                                \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);            \
			fprintf(stderr, __VA_ARGS__);                                              \
			fprintf(stderr, "\n");                                                     \
		}                                                                                  \
	} while (0)

/* A stand-in for the software RDMA device's export, found through dlsym like the real
 * one (the test is linked with --export-dynamic). */
int softverbs_nic_stats(const char *node, struct softverbs_nic_stat *out, int max);
int softverbs_nic_stats(const char *node, struct softverbs_nic_stat *out, int max)
{
	static const char *const nodes[] = {"node0", "node0", "node1"};
	static const char *const names[] = {"soft0", "soft1", "soft0"};
	int n = 0;
	for (int i = 0; i < 3 && n < max; i++) {
		if (node && strcmp(node, nodes[i]))
			continue;
		memset(&out[n], 0, sizeof(out[n]));
		snprintf(out[n].node, sizeof(out[n].node), "%s", nodes[i]);
		snprintf(out[n].name, sizeof(out[n].name), "%s", names[i]);
		out[n].rx_bytes = 1000u * (unsigned)(i + 1);
		out[n].tx_bytes = 10u * (unsigned)(i + 1);
		n++;
	}
	return n;
}

static void test_sizes(void)
{
	CHECK(perf_parse_size("8") == 8, "8");
	CHECK(perf_parse_size("1K") == 1024, "1K");
	CHECK(perf_parse_size("128M") == 128 << 20, "128M");
	CHECK(perf_parse_size("4G") == 4ll << 30, "4G");
	CHECK(perf_parse_size("1.5m") == 3 << 19, "1.5m");
	CHECK(perf_parse_size("16KB") == 16384, "16KB");
	CHECK(perf_parse_size("x") == -1, "x");
	CHECK(perf_parse_size("4X") == -1, "4X");
	CHECK(perf_parse_size("-1") == -1, "-1");
}

static int parse(struct perf_opts *o, const char *line)
{
	char buf[512], *argv[64];
	int argc = 0;
	snprintf(buf, sizeof(buf), "%s", line);
	for (char *t = strtok(buf, " "); t && argc < 63; t = strtok(NULL, " "))
		argv[argc++] = t;
	argv[argc] = NULL;
	return perf_opts_parse(o, argc, argv);
}

static void test_opts(void)
{
	struct perf_opts o;
	int rc = parse(&o, "/opt/nccl-tests/build/all_reduce_perf -b 8 -e 4G -f 2 -g 1 -c 1 -n 5 "
			   "-w 2 -d float -o sum");
	CHECK(rc == 0, "rc %d", rc);
	CHECK(o.coll == PERF_ALLREDUCE && o.minbytes == 8 && o.maxbytes == 4ull << 30, "sizes");
	CHECK(o.stepfactor == 2 && o.iters == 5 && o.warmup_iters == 2 && o.check == 1, "steps");
	CHECK(o.type == PERF_FLOAT && o.op == PERF_SUM && o.timeout_s == 600, "type/op");

	CHECK(parse(&o, "reduce_scatter_perf") == 0 && o.coll == PERF_REDUCESCATTER, "rs");
	CHECK(o.minbytes == 32 << 20 && o.iters == 20 && o.warmup_iters == 1, "defaults");
	CHECK(parse(&o, "./reduce_perf -r all -d all -o all") == 0 && o.coll == PERF_REDUCE &&
		  o.root == PERF_ALL && o.type == PERF_ALL && o.op == PERF_ALL,
	      "all");
	CHECK(parse(&o, "sendrecv_perf_mpi") == 0 && o.coll == PERF_SENDRECV, "mpi suffix");
	CHECK(parse(&o, "alltoall_perf") == 0 && o.coll == PERF_ALLTOALL, "a2a");
	CHECK(parse(&o, "all_gather_perf") == 0 && o.coll == PERF_ALLGATHER, "ag");
	CHECK(parse(&o, "broadcast_perf") == 0 && o.coll == PERF_BROADCAST, "bc");
	CHECK(parse(&o, "r2cc-perf --coll reducescatter -d bf16 -o avg") == 0 &&
		  o.coll == PERF_REDUCESCATTER && o.type == PERF_BF16 && o.op == PERF_AVG,
	      "--coll");
	CHECK(parse(&o, "r2cc-perf") == 0 && o.coll == PERF_ALLREDUCE, "default coll");
	CHECK(parse(&o, "r2cc-perf --nodes 2 --gpus-per-node 2 --nic-table=node1 --iters-table "
			"-T 30 -i 1M") == 0 &&
		  o.nodes == 2 && o.gpus_per_node == 2 && o.nic_table &&
		  !strcmp(o.nic_node, "node1") && o.iters_table && o.timeout_s == 30 &&
		  o.stepfactor == 0 && o.stepbytes == 1 << 20,
	      "r2cc flags");
	CHECK(parse(&o, "r2cc-perf --nic-table --selftest-wrong") == 0 && o.nic_table &&
		  !o.nic_node[0] && o.selftest_wrong,
	      "nic-table without node");
	CHECK(parse(&o, "all_reduce_perf -C 0 -R 0 -I 0 -u 0 -M 0") == 0, "newer flags accepted");
	fprintf(stderr, "(the next lines are expected parse errors)\n");
	CHECK(parse(&o, "r2cc-perf -d float7") == -EINVAL, "bad type");
	CHECK(parse(&o, "r2cc-perf -o mean") == -EINVAL, "bad op");
	CHECK(parse(&o, "r2cc-perf -b 2G -e 1G") == -EINVAL, "min > max");
	CHECK(parse(&o, "r2cc-perf -n 0") == -EINVAL, "-n 0");
	CHECK(parse(&o, "r2cc-perf --nodes 2") == -EINVAL, "nodes alone");
	CHECK(parse(&o, "r2cc-perf --coll gather") == -EINVAL, "bad coll");
	CHECK(parse(&o, "r2cc-perf -t 2") == -EINVAL, "threads");
	CHECK(parse(&o, "r2cc-perf stray") == -EINVAL, "stray argument");
}

static int close_to(double a, double b)
{
	return fabs(a - b) <= 1e-9 * fabs(b);
}

static void test_geometry(void)
{
	struct perf_geom g;
	double alg, bus;

	perf_geom_make(&g, PERF_ALLREDUCE, 1024, PERF_FLOAT, 4);
	CHECK(g.sendcount == 256 && g.recvcount == 256 && g.paramcount == 256, "ar");
	perf_bandwidth(PERF_ALLREDUCE, &g, PERF_FLOAT, 4, 1e-6, &alg, &bus);
	CHECK(close_to(alg, 1.024) && close_to(bus, 1.536), "ar bw %g %g", alg, bus);

	perf_geom_make(&g, PERF_ALLGATHER, 1024, PERF_FLOAT, 4);
	CHECK(g.paramcount == 64 && g.recvcount == 256 && g.send_inplace_off == 64, "ag");
	perf_bandwidth(PERF_ALLGATHER, &g, PERF_FLOAT, 4, 1e-6, &alg, &bus);
	CHECK(close_to(alg, 1.024) && close_to(bus, 0.768), "ag bw %g %g", alg, bus);

	perf_geom_make(&g, PERF_REDUCESCATTER, 1000, PERF_INT8, 3);
	CHECK(g.paramcount == 320 && g.sendcount == 960 && g.recv_inplace_off == 320, "rs %llu",
	      (unsigned long long)g.paramcount);
	perf_bandwidth(PERF_REDUCESCATTER, &g, PERF_INT8, 3, 1e-6, &alg, &bus);
	CHECK(close_to(alg, 0.96) && close_to(bus, 0.64), "rs bw");

	perf_geom_make(&g, PERF_ALLTOALL, 4096, PERF_DOUBLE, 2);
	CHECK(g.paramcount == 256 && g.sendcount == 512 && g.recvcount == 512, "a2a");
	perf_bandwidth(PERF_ALLTOALL, &g, PERF_DOUBLE, 2, 1e-6, &alg, &bus);
	CHECK(close_to(alg, 4.096) && close_to(bus, 2.048), "a2a bw");

	perf_geom_make(&g, PERF_BROADCAST, 4096, PERF_HALF, 4);
	perf_bandwidth(PERF_BROADCAST, &g, PERF_HALF, 4, 1e-6, &alg, &bus);
	CHECK(g.paramcount == 2048 && close_to(alg, 4.096) && close_to(bus, 4.096), "bcast");
	perf_geom_make(&g, PERF_SENDRECV, 4096, PERF_HALF, 4);
	perf_bandwidth(PERF_SENDRECV, &g, PERF_HALF, 4, 1e-6, &alg, &bus);
	CHECK(close_to(bus, 4.096), "sendrecv");
	perf_geom_make(&g, PERF_REDUCE, 4096, PERF_HALF, 4);
	perf_bandwidth(PERF_REDUCE, &g, PERF_HALF, 4, 1e-6, &alg, &bus);
	CHECK(close_to(bus, 4.096), "reduce");

	char t[16];
	perf_format_time(t, sizeof(t), 35.114);
	CHECK(!strcmp(t, "  35.11"), "'%s'", t);
	perf_format_time(t, sizeof(t), 141.94);
	CHECK(!strcmp(t, "  141.9"), "'%s'", t);
	perf_format_time(t, sizeof(t), 20656.2);
	CHECK(!strcmp(t, "  20656"), "'%s'", t);
}

static void test_float_codecs(void)
{
	int exact = 1;
	CHECK(perf_small_float_decode(0x3C00, PERF_HALF) == 1.0, "half 1");
	CHECK(perf_small_float_decode(0xC000, PERF_HALF) == -2.0, "half -2");
	CHECK(perf_small_float_decode(0x7BFF, PERF_HALF) == 65504.0, "half max");
	CHECK(perf_small_float_decode(0x0001, PERF_HALF) == ldexp(1, -24), "half denorm");
	CHECK(isnan(perf_small_float_decode(0x7C00, PERF_HALF)), "half inf -> nan");
	CHECK(perf_small_float_decode(0x3F80, PERF_BF16) == 1.0, "bf16 1");
	CHECK(perf_small_float_decode(0x38, PERF_F8E4M3) == 1.0, "e4m3 1");
	CHECK(perf_small_float_decode(0x7E, PERF_F8E4M3) == 448.0, "e4m3 max");
	CHECK(isnan(perf_small_float_decode(0x7F, PERF_F8E4M3)), "e4m3 nan");
	CHECK(perf_small_float_decode(0x3C, PERF_F8E5M2) == 1.0, "e5m2 1");
	CHECK(perf_small_float_decode(0x7B, PERF_F8E5M2) == 57344.0, "e5m2 max");
	CHECK(perf_small_float_encode(1.0, PERF_HALF, &exact) == 0x3C00 && exact, "enc half");
	CHECK(perf_small_float_encode(-2.0, PERF_BF16, &exact) == 0xC000 && exact, "enc bf16");
	CHECK(perf_small_float_encode(448.0, PERF_F8E4M3, &exact) == 0x7E && exact, "enc e4m3");
	CHECK(perf_small_float_encode(0.1875, PERF_F8E5M2, &exact) == 0x32 && exact, "enc e5m2");
	perf_small_float_encode(17.0, PERF_F8E4M3, &exact);
	CHECK(!exact, "17 is not exact in e4m3");
	exact = 1;
	perf_small_float_encode(2049.0, PERF_HALF, &exact);
	CHECK(!exact, "2049 is not exact in half");
	/* every integer within the exact limit round-trips */
	for (int t = PERF_HALF; t < PERF_NTYPES; t++) {
		if (t == PERF_FLOAT || t == PERF_DOUBLE)
			continue;
		int64_t lim = perf_type_exact_limit(t);
		for (int64_t v = -lim; v <= lim; v++) {
			unsigned char b[8];
			perf_store(b, 0, t, v);
			CHECK(perf_load(b, 0, t) == (double)v, "%s %lld", perf_type_name(t),
			      (long long)v);
		}
	}
}

/* Whether v is exactly representable in type t. */
static int representable(int t, double v)
{
	int exact = 1;
	if (v != floor(v) && !perf_type_is_float(t))
		return 0;
	switch (t) {
	case PERF_INT8:
		return v >= -128 && v <= 127;
	case PERF_UINT8:
		return v >= 0 && v <= 255;
	case PERF_INT32:
		return v >= -2147483648.0 && v <= 2147483647.0;
	case PERF_UINT32:
		return v >= 0 && v <= 4294967295.0;
	case PERF_INT64:
		return 1;
	case PERF_UINT64:
		return v >= 0;
	case PERF_FLOAT:
		return (double)(float)v == v;
	case PERF_DOUBLE:
		return 1;
	default:
		perf_small_float_encode(v, t, &exact);
		return exact;
	}
}

static double apply(int op, double a, double b)
{
	switch (op) {
	case PERF_PROD:
		return a * b;
	case PERF_MAX:
		return a > b ? a : b;
	case PERF_MIN:
		return a < b ? a : b;
	default:
		return a + b;
	}
}

/* Reduces element i in the order given by perm, requiring every partial result to be
 * representable; returns NAN when one is not. For avg the inputs are pre-multiplied by
 * 1/n first when n is a power of two (what NCCL does for floats, exact then). */
static double reduce_in_order(const struct perf_pattern *p, uint64_t i, const int *perm)
{
	int n = p->nranks, t = p->type;
	int premul = p->op == PERF_AVG && perf_type_is_float(t);
	double acc = 0;
	for (int k = 0; k < n; k++) {
		double v = (double)perf_value(p, perm[k], i);
		if (!representable(t, v))
			return NAN;
		if (premul)
			v /= n;
		acc = k ? apply(p->op, acc, v) : v;
		if (!representable(t, acc))
			return NAN;
	}
	if (p->op == PERF_AVG && !premul)
		acc = (double)((int64_t)acc / n);
	return acc;
}

static void test_patterns(void)
{
	static const int ns[] = {1, 2, 3, 4, 5, 7, 8, 16, 32};
	int perm[32], checked = 0;

	for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
		int n = ns[ni];
		for (int t = 0; t < PERF_NTYPES; t++) {
			for (int op = 0; op < PERF_NOPS; op++) {
				struct perf_pattern p =
				    perf_pattern_make(t, op, n, 77 + (uint32_t)n);
				int pow2 = (n & (n - 1)) == 0;
				int distinct = 0;
				double first = 0;
				CHECK(p.hi >= p.lo, "range");
				for (uint64_t i = 0; i < 1500; i++) {
					double want = perf_reduce_expect(&p, i);
					double tol = perf_pattern_tolerance(&p);
					for (int k = 0; k < n; k++)
						perm[k] = k;
					for (int order = 0; order < 3; order++) {
						if (order == 1)
							for (int k = 0; k < n; k++)
								perm[k] = n - 1 - k;
						if (order == 2)
							for (int k = n - 1; k > 0; k--) {
								int j = (int)(perf_hash(9, k, i) %
									      (uint32_t)(k + 1));
								int x = perm[k];
								perm[k] = perm[j], perm[j] = x;
							}
						if (op == PERF_AVG && perf_type_is_float(t) &&
						    !pow2)
							continue;
						double got = reduce_in_order(&p, i, perm);
						CHECK(got == want,
						      "%s %s n=%d i=%llu order %d: %g != %g",
						      perf_type_name(t), perf_op_name(op), n,
						      (unsigned long long)i, order, got, want);
						checked++;
					}
					if (op == PERF_AVG && perf_type_is_float(t) && !pow2 &&
					    t != PERF_BF16 && t < PERF_F8E4M3)
						CHECK(tol > 0 && tol < 1.0 / n,
						      "%s avg n=%d tol %g", perf_type_name(t), n,
						      tol);
					if (!(op == PERF_AVG && perf_type_is_float(t) && !pow2))
						CHECK(tol == 0, "tolerance only for float avg");
					if (i == 0)
						first = want;
					else if (want != first)
						distinct = 1;
				}
				/* a constant result would not catch a wrong reduction */
				CHECK(n == 1 || distinct || op == PERF_AVG, "%s %s n=%d constant",
				      perf_type_name(t), perf_op_name(op), n);
			}
		}
	}
	CHECK(checked > 100000, "checked %d", checked);
	/* different ranks and seeds give different data */
	struct perf_pattern a = perf_pattern_make(PERF_FLOAT, PERF_SUM, 4, 1);
	struct perf_pattern b = perf_pattern_make(PERF_FLOAT, PERF_SUM, 4, 2);
	int same_rank = 0, same_seed = 0;
	for (uint64_t i = 0; i < 1000; i++) {
		same_rank += perf_value(&a, 0, i) == perf_value(&a, 1, i);
		same_seed += perf_value(&a, 0, i) == perf_value(&b, 0, i);
	}
	CHECK(same_rank < 50 && same_seed < 50, "patterns too similar %d %d", same_rank, same_seed);
}

/* Simulates each collective on the host from the inputs and compares every output
 * element with perf_expect, then checks that one corrupted element is caught. */
static void test_expect(void)
{
	enum { N = 3, BYTES = 3 * 1000 };
	for (int coll = 0; coll < PERF_NCOLLS; coll++) {
		struct perf_geom g;
		int t = PERF_INT32, op = coll == PERF_REDUCESCATTER ? PERF_MAX : PERF_SUM, root = 1;
		struct perf_pattern p = perf_pattern_make(t, op, N, 5);
		perf_geom_make(&g, coll, BYTES, t, N);
		for (int r = 0; r < N; r++) {
			int32_t *out = calloc(g.recvcount, sizeof(int32_t));
			uint64_t wrong = 0;
			for (uint64_t i = 0; i < g.recvcount; i++) {
				int64_t v = 0;
				switch (coll) {
				case PERF_ALLGATHER:
					v = perf_value(&p, (int)(i / g.paramcount),
						       i % g.paramcount);
					break;
				case PERF_BROADCAST:
					v = perf_value(&p, root, i);
					break;
				case PERF_ALLTOALL: {
					int src = (int)(i / g.paramcount);
					v = perf_value(&p, src,
						       r * g.paramcount + i % g.paramcount);
					break;
				}
				case PERF_SENDRECV:
					v = perf_value(&p, (r + N - 1) % N, i);
					break;
				default: {
					uint64_t at =
					    coll == PERF_REDUCESCATTER ? r * g.recvcount + i : i;
					v = perf_value(&p, 0, at);
					for (int q = 1; q < N; q++)
						v = (int64_t)apply(op, (double)v,
								   (double)perf_value(&p, q, at));
				}
				}
				out[i] = (int32_t)v;
			}
			out[g.recvcount / 2] += 1; /* what --selftest-wrong does */
			for (uint64_t i = 0; i < g.recvcount; i++)
				wrong += !perf_match(perf_load(out, i, t),
						     perf_expect(&p, coll, &g, r, root, i), 0);
			CHECK(wrong == 1, "%s rank %d: %llu wrong", perf_coll_name(coll), r,
			      (unsigned long long)wrong);
			free(out);
		}
	}
	CHECK(!perf_match(NAN, 1.0, 0.5), "NaN never matches");
}

static int free_tcp_port(void)
{
	struct sockaddr_in sa;
	socklen_t len = sizeof(sa);
	int port = 40000 + (int)(getpid() % 20000), fd = socket(AF_INET, SOCK_STREAM, 0);
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd >= 0 && !bind(fd, (struct sockaddr *)&sa, sizeof(sa)) &&
	    !getsockname(fd, (struct sockaddr *)&sa, &len))
		port = ntohs(sa.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

static void test_rendezvous(void)
{
	enum { NP = 4 };
	int port = free_tcp_port();
	pid_t kids[NP];
	struct perf_rdv r;
	char host[64];
	int p;

	setenv("R2CC_PERF_ROOT", "10.1.2.3:1234", 1);
	CHECK(perf_rdv_address(host, sizeof(host), &p) == 0 && !strcmp(host, "10.1.2.3") &&
		  p == 1234,
	      "R2CC_PERF_ROOT");
	unsetenv("R2CC_PERF_ROOT");
	setenv("MASTER_ADDR", "nodeA", 1);
	setenv("MASTER_PORT", "5555", 1);
	CHECK(perf_rdv_address(host, sizeof(host), &p) == 0 && !strcmp(host, "nodeA") && p == 5556,
	      "MASTER_*");
	unsetenv("MASTER_ADDR");
	unsetenv("MASTER_PORT");
	CHECK(perf_rdv_address(host, sizeof(host), &p) == 0 && !strcmp(host, "127.0.0.1") &&
		  p == PERF_RDV_DEFAULT_PORT,
	      "default");

	fflush(stderr);
	for (int i = 1; i < NP; i++) {
		kids[i] = fork();
		if (kids[i] == 0) {
			unsigned char id[128];
			double v[2] = {(double)i, (double)i};
			char all_dummy;
			/* late joiners exercise the connect retry */
			usleep(100000u * (unsigned)i);
			if (perf_rdv_open(&r, i, NP, "127.0.0.1", port, 20))
				_exit(10);
			if (perf_rdv_bcast(&r, id, sizeof(id)))
				_exit(11);
			for (int k = 0; k < 128; k++)
				if (id[k] != (unsigned char)(k * 7 + 3))
					_exit(12);
			if (perf_rdv_gather(&r, &i, &all_dummy, sizeof(int)) ||
			    perf_rdv_allreduce(&r, v, 2, PERF_RDV_SUM) || v[0] != 6 ||
			    perf_rdv_allreduce(&r, v, 1, PERF_RDV_MAX) || v[0] != 6 ||
			    perf_rdv_barrier(&r))
				_exit(13);
			perf_rdv_close(&r);
			_exit(0);
		}
	}
	unsigned char id[128];
	int got[NP], me = 0;
	double v[2] = {0, 0};
	for (int k = 0; k < 128; k++)
		id[k] = (unsigned char)(k * 7 + 3);
	CHECK(perf_rdv_open(&r, 0, NP, "127.0.0.1", port, 20) == 0, "open");
	CHECK(perf_rdv_bcast(&r, id, sizeof(id)) == 0, "bcast");
	CHECK(perf_rdv_gather(&r, &me, got, sizeof(int)) == 0, "gather");
	for (int i = 0; i < NP; i++)
		CHECK(got[i] == i, "gather slot %d = %d", i, got[i]);
	CHECK(perf_rdv_allreduce(&r, v, 2, PERF_RDV_SUM) == 0 && v[0] == 6 && v[1] == 6, "sum");
	v[0] = 0;
	CHECK(perf_rdv_allreduce(&r, v, 1, PERF_RDV_MAX) == 0 && v[0] == 6, "max");
	CHECK(perf_rdv_barrier(&r) == 0, "barrier");
	perf_rdv_close(&r);
	for (int i = 1; i < NP; i++) {
		int st;
		waitpid(kids[i], &st, 0);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rendezvous child %d status %d", i,
		      st);
	}
}

static void test_world(void)
{
	struct perf_world w;
	CHECK(perf_world_from_env(&w) == 0 && w.nprocs == 1 && w.proc == 0, "single");
	setenv("OMPI_COMM_WORLD_RANK", "3", 1);
	setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
	setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
	setenv("RANK", "0", 1);
	setenv("WORLD_SIZE", "2", 1);
	CHECK(perf_world_from_env(&w) == 0 && w.proc == 3 && w.nprocs == 4 && w.local_proc == 1,
	      "ompi first");
	unsetenv("OMPI_COMM_WORLD_RANK");
	unsetenv("OMPI_COMM_WORLD_SIZE");
	unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
	CHECK(perf_world_from_env(&w) == 0 && w.proc == 0 && w.nprocs == 2 && w.local_proc == 0,
	      "torchrun");
	setenv("WORLD_SIZE", "0", 1);
	CHECK(perf_world_from_env(&w) == -EINVAL, "bad size");
	unsetenv("RANK");
	unsetenv("WORLD_SIZE");
	setenv("SLURM_PROCID", "2", 1);
	setenv("SLURM_NTASKS", "3", 1);
	setenv("SLURM_LOCALID", "0", 1);
	CHECK(perf_world_from_env(&w) == 0 && w.proc == 2 && w.nprocs == 3, "slurm");
	unsetenv("SLURM_PROCID");
	unsetenv("SLURM_NTASKS");
	unsetenv("SLURM_LOCALID");
}

/* Child side of test_spawn: checks its environment; argv[2] = rank that fails. */
static int spawn_child(char **argv)
{
	const char *r = getenv("R2CC_PERF_RANK"), *hid = getenv("NCCL_HOSTID");
	const char *local = getenv("R2CC_PERF_LOCAL_RANK"), *root = getenv("R2CC_PERF_ROOT");
	char want[32];
	int rank;
	if (!r || !hid || !local || !root || strcmp(getenv("R2CC_PERF_NRANKS"), "6") ||
	    strcmp(getenv("PERF_UNIT_INHERITED"), "yes"))
		return 20;
	rank = atoi(r);
	snprintf(want, sizeof(want), "node%d", rank / 2);
	if (strcmp(hid, want) || atoi(local) != rank % 2 || !getenv("R2CC_PERF_DEVICE") ||
	    atoi(getenv("R2CC_PERF_DEVICE")) != rank)
		return 21;
	if (rank == atoi(argv[2]))
		return 7;
	if (atoi(argv[2]) >= 0)
		sleep(30); /* must be killed by the parent */
	return 0;
}

static void test_spawn(void)
{
	struct perf_opts o;
	char *ok_argv[] = {(char *)"perf_unit", (char *)"--spawn-child", (char *)"-1", NULL};
	char *bad_argv[] = {(char *)"perf_unit", (char *)"--spawn-child", (char *)"2", NULL};
	struct timespec t0, t1;
	int rc;

	memset(&o, 0, sizeof(o));
	o.nodes = 3, o.gpus_per_node = 2;
	setenv("PERF_UNIT_INHERITED", "yes", 1);
	rc = perf_spawn(&o, 3, ok_argv);
	CHECK(rc == 0, "spawn all ok: %d", rc);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	fprintf(stderr, "(the next lines are an expected rank failure)\n");
	rc = perf_spawn(&o, 3, bad_argv);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	CHECK(rc == 7, "spawn with failing rank: %d", rc);
	CHECK(t1.tv_sec - t0.tv_sec < 15, "the other ranks were not stopped");
}

static void test_nic(void)
{
	struct perf_nic_sample s, t;
	CHECK(perf_nic_source() == PERF_NIC_SOFTVERBS, "softverbs symbol found through dlsym");
	perf_nic_read(PERF_NIC_SOFTVERBS, "node0", 1, &s);
	CHECK(s.n == 2 && !strcmp(s.name[0], "soft0") && s.rx[1] == 2000 && s.tx[1] == 20,
	      "node0 sample n=%d", s.n);
	perf_nic_read(PERF_NIC_SOFTVERBS, "node1", 1, &t);
	CHECK(t.n == 1 && t.rx[0] == 3000, "node1 sample");
	perf_nic_read(PERF_NIC_SOFTVERBS, "node1", 0, &t);
	CHECK(t.n == 0, "non-contributing process");
	perf_nic_read(PERF_NIC_SOFTVERBS, "node1", 1, &t);
	perf_nic_merge(&s, &t);
	CHECK(s.n == 2 && s.rx[0] == 4000, "merge by name");
	perf_nic_read(PERF_NIC_NONE, NULL, 1, &t);
	CHECK(t.n == 0, "none");
	CHECK(sizeof(struct softverbs_nic_stat) == 168 && sizeof(struct r2cc_nic_stat) == 104,
	      "export layouts %zu %zu", sizeof(struct softverbs_nic_stat),
	      sizeof(struct r2cc_nic_stat));
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "--spawn-child"))
		return spawn_child(argv);
	test_sizes();
	test_opts();
	test_geometry();
	test_float_codecs();
	test_patterns();
	test_expect();
	test_world();
	test_rendezvous();
	test_spawn();
	test_nic();
	if (failures) {
		printf("perf_unit: %d checks failed\n", failures);
		return 1;
	}
	printf("perf_unit: all checks passed\n");
	return 0;
}
