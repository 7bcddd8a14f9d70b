/* Unit tests of R2CC-AllReduce's pure arithmetic: buffer split and layout. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "strategies/allreduce2.h"

static const size_t counts[] = {
    0,
    1,
    2,
    3,
    5,
    7,
    31,
    63,
    127,
    128,
    129,
    255,
    1000,
    1021,
    4099,
    65537,
    (1u << 20) + 3,
    ((size_t)1 << 40) + 7,
};
static const size_t esizes[] = {1, 2, 4, 8, 3 /* not a divisor of 128 */};
static const int ks[] = {1, 2, 4, 7, 64, 100};

static void check_split(size_t count, size_t esize, int nics, int failed, int k)
{
	struct r2cc_ar2_split sp;
	size_t align = 128 % esize == 0 ? 128 / esize : 1, pos, units;
	int kk = k > R2CC_AR2_MAX_CHUNKS ? R2CC_AR2_MAX_CHUNKS : k;
	long double ideal;
	int i;

	cr_assert_eq(r2cc_ar2_split(count, esize, nics, failed, k, &sp), 0);
	cr_assert_eq(sp.main_count + sp.tail_count, count);
	cr_assert_eq(sp.tail_offset, sp.main_count);
	if (failed == 0)
		cr_assert_eq(sp.tail_count, 0);
	if (failed >= nics)
		cr_assert_eq(sp.main_count, 0, "count %zu nics %d failed %d", count, nics, failed);
	if (failed > 0 && failed < nics) {
		ideal = (long double)count * (nics - failed) / nics;
		if (sp.main_count != count) {
			cr_assert_eq(sp.main_count % align, 0, "main %zu not aligned to %zu",
				     sp.main_count, align);
			cr_assert_leq(fabsl((long double)sp.main_count - ideal),
				      align / 2.0L + 0.5L, "main %zu far from %Lf", sp.main_count,
				      ideal);
		} else {
			cr_assert_geq((long double)count + align / 2.0L, ideal);
		}
	}
	if (!sp.tail_count) {
		cr_assert_eq(sp.nchunks, 0);
		return;
	}
	units = (sp.tail_count + align - 1) / align;
	cr_assert_eq((size_t)sp.nchunks, units < (size_t)kk ? units : (size_t)kk);
	pos = sp.tail_offset;
	for (i = 0; i < sp.nchunks; i++) {
		cr_assert_eq(sp.chunk[i].offset, pos, "chunk %d starts at %zu, not %zu", i,
			     sp.chunk[i].offset, pos);
		cr_assert_gt(sp.chunk[i].count, 0);
		cr_assert_eq(sp.chunk[i].offset % align, 0);
		/* balanced: chunks differ by at most one unit (the last may be short) */
		if (i + 1 < sp.nchunks)
			cr_assert_leq(sp.chunk[i].count, (units / (size_t)sp.nchunks + 1) * align);
		pos += sp.chunk[i].count;
	}
	cr_assert_eq(pos, count, "chunks end at %zu, not %zu", pos, count);
}

Test(ar2_split, invariants)
{
	for (int nics = 1; nics <= 8; nics++)
		for (int failed = 0; failed <= nics; failed++)
			for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
				for (size_t e = 0; e < sizeof(esizes) / sizeof(esizes[0]); e++)
					for (size_t k = 0; k < sizeof(ks) / sizeof(ks[0]); k++)
						check_split(counts[c], esizes[e], nics, failed,
							    ks[k]);
}

Test(ar2_split, every_small_count)
{
	for (size_t count = 0; count < 3000; count++)
		for (int k = 1; k <= 9; k += 4) {
			check_split(count, 4, 3, 1, k);
			check_split(count, 1, 8, 3, k);
			check_split(count, 2, 2, 1, k);
		}
}

Test(ar2_split, seed_shape)
{
	struct r2cc_ar2_split sp;

	/* 4 GiB of float, 1 of 3 NICs failed, K = 4 */
	cr_assert_eq(r2cc_ar2_split((size_t)1 << 30, 4, 3, 1, 4, &sp), 0);
	cr_assert_eq(sp.main_count, 715827872); /* nearest multiple of 32 to 2/3 * 2^30 */
	cr_assert_eq(sp.tail_count, ((size_t)1 << 30) - 715827872);
	cr_assert_eq(sp.nchunks, 4);
	cr_assert_eq(sp.chunk[0].offset, sp.tail_offset);
}

Test(ar2_split, bad_arguments)
{
	struct r2cc_ar2_split sp;

	cr_assert_eq(r2cc_ar2_split(10, 0, 3, 1, 4, &sp), -EINVAL);
	cr_assert_eq(r2cc_ar2_split(10, 4, 0, 0, 4, &sp), -EINVAL);
	cr_assert_eq(r2cc_ar2_split(10, 4, 3, -1, 4, &sp), -EINVAL);
	cr_assert_eq(r2cc_ar2_split(1000, 4, 3, 1, 0, &sp), 0); /* K < 1 counts as 1 */
	cr_assert_eq(sp.nchunks, 1);
}

Test(ar2_split, type_sizes)
{
	static const size_t want[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

	for (int t = 0; t < R2CC_NCCL_NUM_TYPES; t++)
		cr_assert_eq(r2cc_nccl_type_size(t), want[t]);
	cr_assert_eq(r2cc_nccl_type_size(12), 0);
	cr_assert_eq(r2cc_nccl_type_size(-1), 0);
}

/* ---- layout ---- */

static void check_layout(int nnodes, int per, int degraded, bool interleave, int nics, int failed)
{
	int n = nnodes * per, *map = malloc(sizeof(int) * (size_t)n);
	int *nicv = malloc(sizeof(int) * (size_t)nnodes),
	    *failv = malloc(sizeof(int) * (size_t)nnodes);
	struct r2cc_ar2_view v = {n, map, nicv, failv};
	struct r2cc_ar2_layout lay;
	int r, color, key, hcolor, hkey, members = 0, healthy = 0, node_of_helper, hnode;

	cr_assert(map && nicv && failv);
	/* Node ids are arbitrary ints; node index = order of first rank. */
	for (r = 0; r < n; r++)
		map[r] = 1000 - 7 * (interleave ? r % nnodes : r / per);
	for (r = 0; r < nnodes; r++) {
		nicv[r] = nics;
		failv[r] = r == degraded ? failed : 0;
	}
	cr_assert_eq(r2cc_ar2_layout_init(&lay, &v), 0);
	cr_assert_eq(lay.nnodes, nnodes);
	cr_assert_eq(lay.degraded, degraded);
	cr_assert_eq(lay.ndegraded, 1);
	cr_assert_eq(lay.nics, nics);
	cr_assert_eq(lay.failed, failed);
	for (r = 0; r < n; r++)
		cr_assert_eq(lay.rank_node_idx[r], interleave ? r % nnodes : r / per);

	/* helper: lowest rank of the node after the degraded one */
	hnode = (degraded + 1) % nnodes;
	cr_assert_eq(lay.helper, interleave ? hnode : hnode * per);
	node_of_helper = lay.rank_node_idx[lay.helper];
	cr_assert_neq(node_of_helper, degraded);
	for (r = 0; r < lay.helper; r++)
		cr_assert_neq(lay.rank_node_idx[r], hnode);

	for (r = 0; r < n; r++) {
		bool on_d = lay.rank_node_idx[r] == degraded;

		r2cc_ar2_healthy_color(&lay, r, &hcolor, &hkey);
		r2cc_ar2_aplush_color(&lay, r, &color, &key);
		cr_assert_eq(hkey, r);
		cr_assert_eq(key, r);
		cr_assert_eq(hcolor, on_d ? R2CC_NCCL_SPLIT_NOCOLOR : 0);
		cr_assert_eq(color, on_d || r == lay.helper ? 0 : R2CC_NCCL_SPLIT_NOCOLOR);
		if (color == 0 && r < lay.helper)
			members++;
		healthy += hcolor == 0;
	}
	cr_assert_eq(lay.aplush_root, members);
	cr_assert_eq(lay.healthy_size, healthy);
	cr_assert_eq(lay.healthy_size, n - per);
	cr_assert_eq(lay.aplush_size, per + 1);
	r2cc_ar2_layout_fini(&lay);
	free(map);
	free(nicv);
	free(failv);
}

Test(ar2_layout, shapes)
{
	static const int pers[] = {1, 2, 3, 8};

	for (int nnodes = 2; nnodes <= 64; nnodes++)
		for (size_t p = 0; p < sizeof(pers) / sizeof(pers[0]); p++) {
			int ds[] = {0, nnodes / 2, nnodes - 1};

			for (int d = 0; d < 3; d++)
				for (int il = 0; il < 2; il++)
					check_layout(nnodes, pers[p], ds[d], il,
						     1 + (nnodes + d) % 8,
						     1 + d % (1 + (nnodes + d) % 8));
		}
}

static struct r2cc_ar2_cfg cfg = {4, 0, 0};

static enum r2cc_ar2_reason check_view(int nranks, const int *map, const int *nics,
				       const int *failed)
{
	struct r2cc_ar2_view v = {nranks, map, nics, failed};
	struct r2cc_ar2_layout lay;
	enum r2cc_ar2_reason why;

	cr_assert_eq(r2cc_ar2_layout_init(&lay, &v), 0);
	why = r2cc_ar2_check(&lay, &cfg, 1 << 20, R2CC_NCCL_FLOAT32, R2CC_NCCL_SUM, 0);
	r2cc_ar2_layout_fini(&lay);
	return why;
}

Test(ar2_layout, eligibility_from_view)
{
	int two[] = {0, 0, 1, 1}, one[] = {5, 5, 5, 5}, three[] = {0, 1, 2};
	int nics[] = {3, 3, 3}, f1[] = {1, 0, 0}, f0[] = {0, 0, 0}, f2[] = {1, 0, 1},
	    fall[] = {3, 0, 0}, f1b[] = {0, 0, 1};

	cr_assert_eq(check_view(4, two, nics, f1), R2CC_AR2_RAN);
	cr_assert_eq(check_view(4, one, nics, f1), R2CC_AR2_FB_ONE_NODE);
	cr_assert_eq(check_view(4, two, nics, f0), R2CC_AR2_FB_NO_DEGRADED);
	cr_assert_eq(check_view(3, three, nics, f2), R2CC_AR2_RAN); /* two degraded, one helps */
	int f3[] = {1, 1, 2};
	cr_assert_eq(check_view(3, three, nics, f3), R2CC_AR2_FB_NO_HEALTHY);
	/* k failed of k: the degraded node cannot talk at all; not this strategy's case */
	cr_assert_eq(check_view(3, three, nics, fall), R2CC_AR2_FB_NO_NIC);
	cr_assert_eq(check_view(3, three, nics, f1b), R2CC_AR2_RAN);
}

Test(ar2_layout, eligibility_of_call)
{
	int map[] = {0, 0, 1, 1}, nics[] = {3, 3}, failed[] = {0, 1};
	struct r2cc_ar2_view v = {4, map, nics, failed};
	struct r2cc_ar2_cfg c = {4, 0, 1000};
	struct r2cc_ar2_layout lay;

	cr_assert_eq(r2cc_ar2_layout_init(&lay, &v), 0);
	cr_assert_eq(lay.degraded, 1);
	cr_assert_eq(lay.helper, 0);
	cr_assert_eq(r2cc_ar2_check(&lay, &c, 250, R2CC_NCCL_FLOAT32, R2CC_NCCL_SUM, 0),
		     R2CC_AR2_RAN);
	cr_assert_eq(r2cc_ar2_check(&lay, &c, 249, R2CC_NCCL_FLOAT32, R2CC_NCCL_SUM, 0),
		     R2CC_AR2_FB_SMALL);
	cr_assert_eq(r2cc_ar2_check(&lay, &c, 250, R2CC_NCCL_FLOAT32, R2CC_NCCL_AVG, 0),
		     R2CC_AR2_FB_OP);
	cr_assert_eq(r2cc_ar2_check(&lay, &c, 250, R2CC_NCCL_FLOAT32, 7, 0), R2CC_AR2_FB_OP);
	cr_assert_eq(r2cc_ar2_check(&lay, &c, 250, R2CC_NCCL_FLOAT32, -1, 0), R2CC_AR2_FB_OP);
	cr_assert_eq(r2cc_ar2_check(&lay, &c, 2500, 12, R2CC_NCCL_SUM, 0), R2CC_AR2_FB_DTYPE);
	cr_assert_eq(
	    r2cc_ar2_check(&lay, &c, 250, R2CC_NCCL_FLOAT32, R2CC_NCCL_SUM, R2CC_AR2_IN_GROUP),
	    R2CC_AR2_FB_GROUP);
	/* capture: eligible here; the executor runs it once set up (test_strategies_exec) */
	cr_assert_eq(
	    r2cc_ar2_check(&lay, &c, 250, R2CC_NCCL_FLOAT32, R2CC_NCCL_SUM, R2CC_AR2_CAPTURING),
	    R2CC_AR2_RAN);
	cr_assert_eq(
	    r2cc_ar2_check(&lay, &c, 250, R2CC_NCCL_FLOAT32, R2CC_NCCL_SUM, R2CC_AR2_NONBLOCKING),
	    R2CC_AR2_FB_NONBLOCKING);
	cr_assert_eq(r2cc_ar2_check(&lay, &c, SIZE_MAX / 2, R2CC_NCCL_FLOAT32, R2CC_NCCL_SUM, 0),
		     R2CC_AR2_FB_SMALL); /* byte size overflows: never eligible */
	for (int r = 0; r < R2CC_AR2_NREASONS; r++)
		cr_assert(r2cc_ar2_reason_str(r)[0] != '?');
	r2cc_ar2_layout_fini(&lay);
}

/* Several degraded nodes: each its own helper on a healthy node while there are
 * enough; the tail's share from the node with the largest failed share;
 * aPlusH_j = node j's ranks + its helper. */
Test(ar2_layout, several_degraded_nodes)
{
	/* 6 nodes x 2 ranks, nodes 1, 2 and 5 degraded */
	int map[12], nics[] = {4, 4, 8, 4, 4, 2}, failed[] = {0, 1, 3, 0, 0, 1};
	struct r2cc_ar2_view v = {12, map, nics, failed};
	struct r2cc_ar2_layout lay;
	int color, key;

	for (int r = 0; r < 12; r++)
		map[r] = 50 + r / 2;
	cr_assert_eq(r2cc_ar2_layout_init(&lay, &v), 0);
	cr_assert_eq(lay.ndegraded, 3);
	cr_assert_eq(lay.ndeg, 3);
	cr_assert_eq(lay.degraded, -1);
	cr_assert_eq(lay.helper, -1);
	cr_assert_eq(lay.healthy_nodes, 3);
	cr_assert_eq(lay.nics, 2); /* 1 of 2 is the largest share (3 of 8, 1 of 4) */
	cr_assert_eq(lay.failed, 1);
	cr_assert_eq(lay.share_node, 5);
	cr_assert_eq(lay.healthy_size, 6);
	/* node 1 -> node 3; node 2 -> node 4 (3 is taken); node 5 -> node 0 */
	cr_assert_eq(lay.deg_helper[0], 6);
	cr_assert_eq(lay.deg_helper[1], 8);
	cr_assert_eq(lay.deg_helper[2], 0);
	for (int j = 0; j < 3; j++) {
		cr_assert_eq(lay.deg_size[j], 3);
		int members = 0, root = -1;
		for (int r = 0; r < 12; r++) {
			r2cc_ar2_deg_color(&lay, j, r, &color, &key);
			if (color == 0) {
				if (r == lay.deg_helper[j])
					root = members;
				members++;
			}
		}
		cr_assert_eq(members, 3);
		cr_assert_eq(lay.deg_root[j], root);
	}
	r2cc_ar2_layout_fini(&lay);

	/* more degraded nodes than healthy ones: helpers shared, in turn */
	int map4[] = {0, 1, 2, 3}, nics4[] = {2, 2, 2, 2}, f4[] = {1, 0, 1, 1};
	struct r2cc_ar2_view v4 = {4, map4, nics4, f4};
	cr_assert_eq(r2cc_ar2_layout_init(&lay, &v4), 0);
	cr_assert_eq(lay.ndeg, 3);
	for (int j = 0; j < 3; j++)
		cr_assert_eq(lay.deg_helper[j], 1);
	cr_assert_eq(lay.deg_root[0], 1); /* {0, 1}: rank 1 second */
	cr_assert_eq(lay.deg_root[1], 0); /* {1, 2} */
	r2cc_ar2_layout_fini(&lay);
}

Test(ar2_layout, bad_views)
{
	int map[] = {0, 1}, nics[] = {3, 3}, bad[] = {4, 0}, neg[] = {-1, 0};
	struct r2cc_ar2_layout lay;
	struct r2cc_ar2_view v = {2, map, nics, bad};

	cr_assert_eq(r2cc_ar2_layout_init(&lay, &v), -EINVAL);
	v.node_failed = neg;
	cr_assert_eq(r2cc_ar2_layout_init(&lay, &v), -EINVAL);
	v.nranks = 0;
	cr_assert_eq(r2cc_ar2_layout_init(&lay, &v), -EINVAL);
	cr_assert_eq(r2cc_ar2_layout_init(&lay, NULL), -EINVAL);
}
