/* Unit tests of the declared-failure parser and resolver (shim/failspec.c). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "shim/failspec.h"

static struct r2cc_failspec spec;
static char err[256];

static int parse(const char *node, const char *hca)
{
	return r2cc_failspec_parse(node, hca, &spec, err, sizeof(err));
}

static void expect_bad(const char *node, const char *hca, const char *var, const char *needle)
{
	int ret = parse(node, hca);

	cr_assert_eq(ret, -EINVAL, "node=\"%s\" hca=\"%s\" accepted", node ? node : "(null)",
		     hca ? hca : "(null)");
	cr_assert_eq(spec.nentries, 0);
	cr_assert(strncmp(err, var, strlen(var)) == 0, "message \"%s\" does not start with %s", err,
		  var);
	cr_assert(strstr(err, needle), "message \"%s\" lacks \"%s\"", err, needle);
}

Test(failspec, empty_means_none)
{
	cr_assert_eq(parse(NULL, NULL), 0);
	cr_assert_eq(spec.nentries, 0);
	cr_assert_eq(parse("", "  "), 0);
	cr_assert_eq(spec.nentries, 0);
	cr_assert_str_empty(err);
}

Test(failspec, seed_form)
{
	cr_assert_eq(parse("0", "mlx5_2"), 0, "%s", err);
	cr_assert_eq(spec.nentries, 1);
	cr_assert_eq(spec.entries[0].node.index, 0);
	cr_assert_eq(spec.entries[0].nnics, 1);
	cr_assert_eq(spec.entries[0].nics[0].index, -1);
	cr_assert_str_eq(spec.entries[0].nics[0].name, "mlx5_2");
}

Test(failspec, lists_and_names)
{
	cr_assert_eq(parse(" 0 , node-3.lab ", "mlx5_2, 1"), 0, "%s", err);
	cr_assert_eq(spec.nentries, 2);
	cr_assert_eq(spec.entries[0].node.index, 0);
	cr_assert_eq(spec.entries[1].node.index, -1);
	cr_assert_str_eq(spec.entries[1].node.name, "node-3.lab");
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(spec.entries[i].nnics, 2);
		cr_assert_str_eq(spec.entries[i].nics[0].name, "mlx5_2");
		cr_assert_eq(spec.entries[i].nics[1].index, 1);
	}
}

Test(failspec, per_node_form)
{
	cr_assert_eq(parse("", "0:mlx5_2,mlx5_3;2:mlx5_1 ; gpu7 : 0"), 0, "%s", err);
	cr_assert_eq(spec.nentries, 3);
	cr_assert_eq(spec.entries[0].node.index, 0);
	cr_assert_eq(spec.entries[0].nnics, 2);
	cr_assert_str_eq(spec.entries[0].nics[1].name, "mlx5_3");
	cr_assert_eq(spec.entries[1].node.index, 2);
	cr_assert_eq(spec.entries[1].nnics, 1);
	cr_assert_str_eq(spec.entries[1].nics[0].name, "mlx5_1");
	cr_assert_str_eq(spec.entries[2].node.name, "gpu7");
	cr_assert_eq(spec.entries[2].nics[0].index, 0);
}

Test(failspec, bad_values)
{
	expect_bad("0", "", "R2CC_FAILED_HCA", "required");
	expect_bad("", "mlx5_2", "R2CC_FAILED_NODE", "required");
	expect_bad("0,", "mlx5_2", "R2CC_FAILED_NODE", "empty item");
	expect_bad(",0", "mlx5_2", "R2CC_FAILED_NODE", "empty item");
	expect_bad("0,,1", "mlx5_2", "R2CC_FAILED_NODE", "empty item");
	expect_bad("0", "mlx5_2,", "R2CC_FAILED_HCA", "empty item");
	expect_bad("0", "mlx5_2,,mlx5_3", "R2CC_FAILED_HCA", "empty item");
	expect_bad("-1", "mlx5_2", "R2CC_FAILED_NODE", "must start with");
	expect_bad("0", ".x", "R2CC_FAILED_HCA", "must start with");
	expect_bad("0", "mlx5 2", "R2CC_FAILED_HCA", "bad character ' '");
	expect_bad("nod/e", "1", "R2CC_FAILED_NODE", "bad character '/'");
	expect_bad("0", "mlx5_2$", "R2CC_FAILED_HCA", "bad character");
	expect_bad("99999999999999999999", "1", "R2CC_FAILED_NODE", "out of range");
	expect_bad("0", "65536", "R2CC_FAILED_HCA", "out of range");
	expect_bad("0,0", "1", "R2CC_FAILED_NODE", "named twice");
	expect_bad("0", "mlx5_2,mlx5_2", "R2CC_FAILED_HCA", "named twice");
	expect_bad("0", "0:mlx5_2", "R2CC_FAILED_NODE", "must be empty");
	expect_bad("", "0:mlx5_2;mlx5_3", "R2CC_FAILED_HCA", "lacks \"NODE:\"");
	expect_bad("", "0:mlx5_2:1", "R2CC_FAILED_HCA", "more than one ':'");
	expect_bad("", "0:", "R2CC_FAILED_HCA", "no NIC");
	expect_bad("", ":mlx5_2", "R2CC_FAILED_HCA", "empty node");
	expect_bad("", "0:mlx5_2;;1:mlx5_3", "R2CC_FAILED_HCA", "empty item");
	expect_bad("", "0:mlx5_2;", "R2CC_FAILED_HCA", "empty item");
	expect_bad("", "0:a;0:b", "R2CC_FAILED_HCA", "named twice");
	expect_bad("", "0:a,,b", "R2CC_FAILED_HCA", "empty item");
}

Test(failspec, limits)
{
	char name[80], list[4200], big[5000];
	size_t len = 0;

	memset(name, 'a', 64);
	name[64] = '\0';
	expect_bad("0", name, "R2CC_FAILED_HCA", "longer than 63");
	name[63] = '\0';
	cr_assert_eq(parse("0", name), 0, "%s", err);

	for (int i = 0; i <= R2CC_FAILSPEC_MAX_NICS; i++)
		len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%d", i ? "," : "", i);
	expect_bad("0", list, "R2CC_FAILED_HCA", "more than 64 NICs");
	len = 0;
	for (int i = 0; i <= R2CC_FAILSPEC_MAX_NODES; i++)
		len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%d", i ? "," : "", i);
	expect_bad(list, "1", "R2CC_FAILED_NODE", "more than 64 nodes");

	memset(big, '1', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	expect_bad(big, "1", "R2CC_FAILED_NODE", "longer than");
	expect_bad("1", big, "R2CC_FAILED_HCA", "longer than");
}

Test(failspec, error_buffer_may_be_small_or_null)
{
	char tiny[8];

	cr_assert_eq(r2cc_failspec_parse("x", NULL, &spec, NULL, 0), -EINVAL);
	cr_assert_eq(r2cc_failspec_parse("x", NULL, &spec, tiny, sizeof(tiny)), -EINVAL);
	cr_assert_eq(strlen(tiny), sizeof(tiny) - 1);
}

static const char *const nics0[] = {"mlx5_0", "mlx5_2", "mlx5_3"};
static const char *const nics1[] = {"mlx5_0", "mlx5_1"};
static const struct r2cc_failspec_node nodes[] = {
    {"node-1.cluster", 3, nics0},
    {"node-2", 3, nics0},
    {"node-3", 2, nics1},
};

Test(failspec, resolve)
{
	uint64_t mask[3];

	cr_assert_eq(parse("0", "mlx5_2"), 0);
	cr_assert_eq(r2cc_failspec_resolve(&spec, nodes, 3, mask, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(mask[0], 2);
	cr_assert_eq(mask[1], 0);
	cr_assert_eq(mask[2], 0);

	cr_assert_eq(parse("node-1,node-2.cluster", "2,mlx5_0"), 0, "%s", err);
	cr_assert_eq(r2cc_failspec_resolve(&spec, nodes, 3, mask, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(mask[0], 5);
	cr_assert_eq(mask[1], 5);

	cr_assert_eq(parse("", "0:mlx5_2,mlx5_3;2:mlx5_1"), 0);
	cr_assert_eq(r2cc_failspec_resolve(&spec, nodes, 3, mask, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(mask[0], 6);
	cr_assert_eq(mask[1], 0);
	cr_assert_eq(mask[2], 2);
}

static void expect_resolve_bad(const char *node, const char *hca, int want, const char *needle)
{
	uint64_t mask[3] = {7, 7, 7};

	cr_assert_eq(parse(node, hca), 0, "%s", err);
	cr_assert_eq(r2cc_failspec_resolve(&spec, nodes, 3, mask, err, sizeof(err)), want,
		     "node=%s hca=%s", node, hca);
	cr_assert(strstr(err, needle), "message \"%s\" lacks \"%s\"", err, needle);
	cr_assert(!mask[0] && !mask[1] && !mask[2], "mask not cleared on error");
}

Test(failspec, resolve_errors)
{
	expect_resolve_bad("3", "0", -ENOENT, "node 3 does not exist");
	expect_resolve_bad("node-9", "0", -ENOENT, "not a host");
	expect_resolve_bad("2", "mlx5_2", -ENOENT, "NIC mlx5_2 does not exist");
	expect_resolve_bad("2", "2", -ENOENT, "NIC 2 does not exist");
	expect_resolve_bad("0", "mlx5_2,1", -EINVAL, "twice");
	expect_resolve_bad("0,node-1", "1", -EINVAL, "twice");
}

Test(failspec, resolve_ambiguous_host)
{
	static const struct r2cc_failspec_node dup[] = {
	    {"gpu.a", 1, nics1},
	    {"gpu.b", 1, nics1},
	};
	uint64_t mask[2];

	cr_assert_eq(parse("gpu", "0"), 0);
	cr_assert_eq(r2cc_failspec_resolve(&spec, dup, 2, mask, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "matches nodes 0"), "%s", err);
	cr_assert_eq(parse("gpu.b", "0"), 0);
	cr_assert_eq(r2cc_failspec_resolve(&spec, dup, 2, mask, err, sizeof(err)), 0);
	cr_assert_eq(mask[1], 1);
}
