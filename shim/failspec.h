/*
 * Declared failures: R2CC_FAILED_NODE and R2CC_FAILED_HCA. Parsing is pure
 * (no environment, no allocation); resolving turns the parsed names into a
 * mask of failed NICs per node once the job's directory is known. The result
 * is the same degraded topology as a real failure, without cutting anything.
 *
 * Syntax (whitespace around items is ignored; both variables empty or unset
 * means no declared failure):
 *
 *   NODE   := a node index (decimal, 0 = the node of rank 0, nodes numbered in
 *             rank order) or a host name ([A-Za-z0-9._-], not all digits)
 *   HCA    := a NIC index on that node (decimal, position in the node's NIC
 *             list) or a NIC name such as mlx5_2 (same character set; no port
 *             suffix: a declared failure is always the whole NIC)
 *
 *   Form 1, the same NICs on one or several nodes (the seed's form):
 *     R2CC_FAILED_NODE=NODE[,NODE...]   R2CC_FAILED_HCA=HCA[,HCA...]
 *     e.g. R2CC_FAILED_NODE=0 R2CC_FAILED_HCA=mlx5_2
 *          R2CC_FAILED_NODE=0,node-3 R2CC_FAILED_HCA=mlx5_2,1
 *
 *   Form 2, different NICs per node, all in R2CC_FAILED_HCA (then
 *   R2CC_FAILED_NODE must be empty):
 *     R2CC_FAILED_HCA=NODE:HCA[,HCA...][;NODE:HCA[,HCA...]...]
 *     e.g. R2CC_FAILED_HCA="0:mlx5_2,mlx5_3;2:mlx5_1"
 *
 * Rejected, with one line naming the variable and what it accepts: a node
 * without NICs or NICs without a node, empty items, a node or NIC named twice,
 * bad characters, numbers out of range, too many nodes or NICs, names longer
 * than R2CC_FAILSPEC_NAME_MAX - 1.
 */
#ifndef R2CC_SHIM_FAILSPEC_H
#define R2CC_SHIM_FAILSPEC_H

#include <stddef.h>
#include <stdint.h>

#define R2CC_FAILSPEC_MAX_NODES 64 /* nodes named in one declaration */
#define R2CC_FAILSPEC_MAX_NICS	64 /* NICs named per node; also the mask width */
#define R2CC_FAILSPEC_NAME_MAX	64 /* host and NIC names, with the NUL */
#define R2CC_FAILSPEC_MAX_INDEX 65535

/* A node or NIC: by index (index >= 0, name empty) or by name (index -1). */
struct r2cc_failspec_ref {
	int index;
	char name[R2CC_FAILSPEC_NAME_MAX];
};

struct r2cc_failspec_entry {
	struct r2cc_failspec_ref node;
	int nnics;
	struct r2cc_failspec_ref nics[R2CC_FAILSPEC_MAX_NICS];
};

struct r2cc_failspec {
	int nentries; /* 0: no declared failure */
	struct r2cc_failspec_entry entries[R2CC_FAILSPEC_MAX_NODES];
};

/*
 * Parse the raw values of R2CC_FAILED_NODE (node) and R2CC_FAILED_HCA (hca);
 * NULL counts as empty. Returns 0 and fills *out, or -EINVAL with a one-line
 * message in err (naming the variable and what it accepts) and *out left
 * empty.
 */
int r2cc_failspec_parse(const char *node, const char *hca, struct r2cc_failspec *out, char *err,
			size_t errlen);

/* One node of the job's directory, in node-index order. */
struct r2cc_failspec_node {
	const char *host;	      /* host name as reported by the node */
	int nnics;		      /* <= R2CC_FAILSPEC_MAX_NICS */
	const char *const *nic_names; /* nnics names, in NIC-index order */
};

/*
 * Resolve a parsed declaration against the directory: failed_mask[i] gets
 * bit j set when NIC j of node i is declared failed (all nnodes entries are
 * written). A host name matches a node's host exactly, or by its short name
 * (up to the first '.') on either side, and must match exactly one node.
 * Returns 0, -ENOENT for a node or NIC that does not exist (message in err),
 * or -EINVAL for an ambiguous host name or a NIC declared twice through its
 * name and its index.
 */
int r2cc_failspec_resolve(const struct r2cc_failspec *spec, const struct r2cc_failspec_node *nodes,
			  int nnodes, uint64_t *failed_mask, char *err, size_t errlen);

#endif
