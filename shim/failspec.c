/*
 * Declared failures (R2CC_FAILED_NODE / R2CC_FAILED_HCA): the parser and the
 * resolver described in failspec.h. The parser works on a bounded copy of the
 * input and tokenises it in place; nothing here allocates or logs, the caller
 * logs the message it gets back once.
 */
#include "shim/failspec.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define INPUT_MAX 4096

#define NODE_ACCEPTS "a comma-separated list of node indices (0 = the node of rank 0) or host names"
#define HCA_ACCEPTS                                                                                \
	"a comma-separated list of NIC names (e.g. mlx5_2) or indices, or per node "               \
	"\"NODE:HCA[,HCA...][;NODE:HCA...]\" with R2CC_FAILED_NODE empty"

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

static char *trim(char *s)
{
	char *end;

	while (isspace((unsigned char)*s))
		s++;
	end = s + strlen(s);
	while (end > s && isspace((unsigned char)end[-1]))
		*--end = '\0';
	return s;
}

static bool name_char(char c)
{
	return isalnum((unsigned char)c) || c == '_' || c == '-' || c == '.';
}

/* Parse one token into a reference; 0 or -EINVAL with err filled. */
static int parse_ref(char *tok, struct r2cc_failspec_ref *ref, const char *var, const char *what,
		     const char *accepts, char *err, size_t errlen)
{
	const char *p;
	bool digits = true;
	long v = 0;

	tok = trim(tok);
	if (!*tok)
		return fail(err, errlen, "%s: empty %s; accepts %s", var, what, accepts);
	if (!isalnum((unsigned char)*tok) && *tok != '_')
		return fail(err, errlen,
			    "%s: %s \"%s\" must start with a letter or digit; accepts %s", var,
			    what, tok, accepts);
	for (p = tok; *p; p++) {
		if (!name_char(*p))
			return fail(err, errlen, "%s: bad character '%c' in %s \"%s\"; accepts %s",
				    var, *p, what, tok, accepts);
		if (!isdigit((unsigned char)*p))
			digits = false;
	}
	memset(ref, 0, sizeof(*ref));
	if (digits) {
		for (p = tok; *p; p++) {
			v = v * 10 + (*p - '0');
			if (v > R2CC_FAILSPEC_MAX_INDEX)
				return fail(err, errlen, "%s: %s index %s out of range 0..%d", var,
					    what, tok, R2CC_FAILSPEC_MAX_INDEX);
		}
		ref->index = (int)v;
		return 0;
	}
	if (strlen(tok) >= sizeof(ref->name))
		return fail(err, errlen, "%s: %s name \"%.16s...\" longer than %d characters", var,
			    what, tok, R2CC_FAILSPEC_NAME_MAX - 1);
	ref->index = -1;
	strcpy(ref->name, tok);
	return 0;
}

static bool ref_equal(const struct r2cc_failspec_ref *a, const struct r2cc_failspec_ref *b)
{
	return a->index == b->index && strcmp(a->name, b->name) == 0;
}

static const char *ref_str(const struct r2cc_failspec_ref *r, char *buf, size_t len)
{
	if (r->index >= 0)
		snprintf(buf, len, "%d", r->index);
	else
		snprintf(buf, len, "%s", r->name);
	return buf;
}

/* Parse "HCA[,HCA...]" into e->nics; separators already checked. */
static int parse_nic_list(char *list, struct r2cc_failspec_entry *e, char *err, size_t errlen)
{
	char *save = NULL, *tok;
	char buf[R2CC_FAILSPEC_NAME_MAX];
	int i, ret;

	for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (e->nnics == R2CC_FAILSPEC_MAX_NICS)
			return fail(err, errlen, "R2CC_FAILED_HCA: more than %d NICs for one node",
				    R2CC_FAILSPEC_MAX_NICS);
		ret = parse_ref(tok, &e->nics[e->nnics], "R2CC_FAILED_HCA", "NIC", HCA_ACCEPTS, err,
				errlen);
		if (ret)
			return ret;
		for (i = 0; i < e->nnics; i++)
			if (ref_equal(&e->nics[i], &e->nics[e->nnics]))
				return fail(err, errlen, "R2CC_FAILED_HCA: NIC %s named twice",
					    ref_str(&e->nics[i], buf, sizeof(buf)));
		e->nnics++;
	}
	return 0;
}

/* Reject ",," and leading commas, which strtok_r would silently skip. */
static int check_separators(const char *s, char sep, const char *var, const char *accepts,
			    char *err, size_t errlen)
{
	const char *p;
	bool empty = true;

	for (p = s; *p; p++) {
		if (*p == sep) {
			if (empty)
				return fail(err, errlen, "%s: empty item before '%c'; accepts %s",
					    var, sep, accepts);
			empty = true;
		} else if (!isspace((unsigned char)*p)) {
			empty = false;
		}
	}
	if (empty && p != s)
		return fail(err, errlen, "%s: empty item at the end; accepts %s", var, accepts);
	return 0;
}

static int add_node(struct r2cc_failspec *out, const struct r2cc_failspec_ref *node,
		    const char *var, char *err, size_t errlen)
{
	char buf[R2CC_FAILSPEC_NAME_MAX];
	int i;

	for (i = 0; i < out->nentries; i++)
		if (ref_equal(&out->entries[i].node, node))
			return fail(err, errlen, "%s: node %s named twice", var,
				    ref_str(node, buf, sizeof(buf)));
	if (out->nentries == R2CC_FAILSPEC_MAX_NODES)
		return fail(err, errlen, "%s: more than %d nodes", var, R2CC_FAILSPEC_MAX_NODES);
	out->entries[out->nentries].node = *node;
	out->entries[out->nentries].nnics = 0;
	out->nentries++;
	return 0;
}

static int parse_groups(char *hca, struct r2cc_failspec *out, char *err, size_t errlen)
{
	char *save = NULL, *group, *colon;
	struct r2cc_failspec_ref node;
	int ret;

	ret = check_separators(hca, ';', "R2CC_FAILED_HCA", HCA_ACCEPTS, err, errlen);
	if (ret)
		return ret;
	for (group = strtok_r(hca, ";", &save); group; group = strtok_r(NULL, ";", &save)) {
		colon = strchr(group, ':');
		if (!colon)
			return fail(err, errlen,
				    "R2CC_FAILED_HCA: \"%s\" lacks \"NODE:\" (every group of the "
				    "per-node form names its node); accepts %s",
				    trim(group), HCA_ACCEPTS);
		*colon = '\0';
		if (strchr(colon + 1, ':'))
			return fail(
			    err, errlen,
			    "R2CC_FAILED_HCA: more than one ':' in a group (port suffixes are "
			    "not accepted; use ';' between nodes); accepts %s",
			    HCA_ACCEPTS);
		ret = parse_ref(group, &node, "R2CC_FAILED_HCA", "node", HCA_ACCEPTS, err, errlen);
		if (ret)
			return ret;
		ret = add_node(out, &node, "R2CC_FAILED_HCA", err, errlen);
		if (ret)
			return ret;
		if (!*trim(colon + 1))
			return fail(err, errlen,
				    "R2CC_FAILED_HCA: no NIC after \"%s:\"; accepts %s",
				    trim(group), HCA_ACCEPTS);
		ret = check_separators(colon + 1, ',', "R2CC_FAILED_HCA", HCA_ACCEPTS, err, errlen);
		if (ret)
			return ret;
		ret = parse_nic_list(colon + 1, &out->entries[out->nentries - 1], err, errlen);
		if (ret)
			return ret;
	}
	return 0;
}

static int parse(const char *node_in, const char *hca_in, struct r2cc_failspec *out, char *err,
		 size_t errlen)
{
	char nodebuf[INPUT_MAX], hcabuf[INPUT_MAX];
	char *node, *hca, *save = NULL, *tok;
	struct r2cc_failspec_ref ref;
	int i, ret;

	if (strlen(node_in) >= sizeof(nodebuf))
		return fail(err, errlen, "R2CC_FAILED_NODE: longer than %d characters",
			    INPUT_MAX - 1);
	if (strlen(hca_in) >= sizeof(hcabuf))
		return fail(err, errlen, "R2CC_FAILED_HCA: longer than %d characters",
			    INPUT_MAX - 1);
	strcpy(nodebuf, node_in);
	strcpy(hcabuf, hca_in);
	node = trim(nodebuf);
	hca = trim(hcabuf);

	if (!*node && !*hca)
		return 0;
	if (strchr(hca, ':') || strchr(hca, ';')) {
		if (*node)
			return fail(
			    err, errlen,
			    "R2CC_FAILED_NODE: must be empty when R2CC_FAILED_HCA names the "
			    "nodes (\"NODE:HCA,...;NODE:HCA...\")");
		return parse_groups(hca, out, err, errlen);
	}
	if (!*hca)
		return fail(err, errlen,
			    "R2CC_FAILED_HCA: required with R2CC_FAILED_NODE=%s; accepts %s", node,
			    HCA_ACCEPTS);
	if (!*node)
		return fail(err, errlen,
			    "R2CC_FAILED_NODE: required with R2CC_FAILED_HCA=%s; accepts %s", hca,
			    NODE_ACCEPTS);

	ret = check_separators(node, ',', "R2CC_FAILED_NODE", NODE_ACCEPTS, err, errlen);
	if (ret)
		return ret;
	for (tok = strtok_r(node, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		ret = parse_ref(tok, &ref, "R2CC_FAILED_NODE", "node", NODE_ACCEPTS, err, errlen);
		if (ret)
			return ret;
		ret = add_node(out, &ref, "R2CC_FAILED_NODE", err, errlen);
		if (ret)
			return ret;
	}
	ret = check_separators(hca, ',', "R2CC_FAILED_HCA", HCA_ACCEPTS, err, errlen);
	if (ret)
		return ret;
	ret = parse_nic_list(hca, &out->entries[0], err, errlen);
	if (ret)
		return ret;
	for (i = 1; i < out->nentries; i++) {
		out->entries[i].nnics = out->entries[0].nnics;
		memcpy(out->entries[i].nics, out->entries[0].nics,
		       sizeof(out->entries[0].nics[0]) * (size_t)out->entries[0].nnics);
	}
	return 0;
}

int r2cc_failspec_parse(const char *node, const char *hca, struct r2cc_failspec *out, char *err,
			size_t errlen)
{
	int ret;

	out->nentries = 0;
	if (err && errlen)
		err[0] = '\0';
	ret = parse(node ? node : "", hca ? hca : "", out, err, errlen);
	if (ret)
		out->nentries = 0;
	return ret;
}

/* "node-1" matches "node-1.cluster" and the other way round. */
static bool host_match(const char *want, const char *host)
{
	size_t wl, hl;

	if (!host)
		return false;
	if (strcmp(want, host) == 0)
		return true;
	wl = strcspn(want, ".");
	hl = strcspn(host, ".");
	if (want[wl] && host[hl])
		return false; /* both fully qualified and different */
	return wl == hl && strncmp(want, host, wl) == 0;
}

static int find_node(const struct r2cc_failspec_ref *ref, const struct r2cc_failspec_node *nodes,
		     int nnodes, char *err, size_t errlen)
{
	int i, found = -1;

	if (ref->index >= 0) {
		if (ref->index >= nnodes) {
			fail(err, errlen, "declared failed node %d does not exist (the job has %d)",
			     ref->index, nnodes);
			return -ENOENT;
		}
		return ref->index;
	}
	for (i = 0; i < nnodes; i++) {
		if (!host_match(ref->name, nodes[i].host))
			continue;
		if (found >= 0)
			return fail(err, errlen,
				    "declared failed node \"%s\" matches nodes %d (%s) and %d (%s)",
				    ref->name, found, nodes[found].host, i, nodes[i].host);
		found = i;
	}
	if (found < 0) {
		fail(err, errlen, "declared failed node \"%s\" is not a host of this job",
		     ref->name);
		return -ENOENT;
	}
	return found;
}

static int find_nic(const struct r2cc_failspec_ref *ref, const struct r2cc_failspec_node *node,
		    int nodeidx, char *err, size_t errlen)
{
	int i;

	if (ref->index >= 0) {
		if (ref->index < node->nnics)
			return ref->index;
		fail(err, errlen, "declared failed NIC %d does not exist on node %d (%s has %d)",
		     ref->index, nodeidx, node->host ? node->host : "?", node->nnics);
		return -ENOENT;
	}
	for (i = 0; i < node->nnics; i++)
		if (node->nic_names[i] && strcmp(node->nic_names[i], ref->name) == 0)
			return i;
	fail(err, errlen, "declared failed NIC %s does not exist on node %d (%s)", ref->name,
	     nodeidx, node->host ? node->host : "?");
	return -ENOENT;
}

int r2cc_failspec_resolve(const struct r2cc_failspec *spec, const struct r2cc_failspec_node *nodes,
			  int nnodes, uint64_t *failed_mask, char *err, size_t errlen)
{
	const struct r2cc_failspec_entry *e;
	int i, j, n, nic;

	if (err && errlen)
		err[0] = '\0';
	for (i = 0; i < nnodes; i++)
		failed_mask[i] = 0;
	for (i = 0; i < spec->nentries; i++) {
		e = &spec->entries[i];
		n = find_node(&e->node, nodes, nnodes, err, errlen);
		if (n < 0)
			goto err_clear;
		if (nodes[n].nnics > R2CC_FAILSPEC_MAX_NICS) {
			fail(err, errlen, "node %d has %d NICs, more than the %d supported", n,
			     nodes[n].nnics, R2CC_FAILSPEC_MAX_NICS);
			n = -EINVAL;
			goto err_clear;
		}
		for (j = 0; j < e->nnics; j++) {
			nic = find_nic(&e->nics[j], &nodes[n], n, err, errlen);
			if (nic < 0) {
				n = nic;
				goto err_clear;
			}
			if (failed_mask[n] & (1ull << nic)) {
				fail(err, errlen, "NIC %d of node %d is declared failed twice", nic,
				     n);
				n = -EINVAL;
				goto err_clear;
			}
			failed_mask[n] |= 1ull << nic;
		}
	}
	return 0;

err_clear:
	for (i = 0; i < nnodes; i++)
		failed_mask[i] = 0;
	return n;
}
