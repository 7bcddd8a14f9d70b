/*
 * libFuzzer target: the directory a rendezvous sends back and the member
 * record each rank registers (ctl/ctl_dir.c), and the directory of a split
 * derived from a decoded one. A member that decodes must re-encode and decode
 * again to the same record (encodings are not unique: an IPv4 address has 12
 * unused bytes); every lookup on a decoded directory stays in bounds.
 */
#include "ctl/ctl.h"
#include "ctl/ctl_priv.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct r2cc_ctl_member m;
	if (r2cc_ctl_member_decode(data, size, &m) == 0) {
		unsigned char *out = malloc(R2CC_CTL_MEMBER_MAX_ENC);
		struct r2cc_ctl_member again;
		int n = out ? r2cc_ctl_member_encode(&m, out, R2CC_CTL_MEMBER_MAX_ENC) : -1;
		if (out && (n < 0 || r2cc_ctl_member_decode(out, (size_t)n, &again) != 0 ||
			    memcmp(&again, &m, sizeof(m)) != 0))
			abort();
		free(out);
	}
	struct r2cc_ctl_job job = {0};
	memset(job.secret, 0x5a, sizeof(job.secret));
	r2cc_ctl_job_derive_id(&job);
	int self = size ? data[0] % 4 : 0;
	struct r2cc_ctl_dir *dir = NULL;
	if (r2cc_ctl_dir_decode(data, size, &job, self, &dir) != 0)
		return 0;
	int ranks[16];
	for (int nd = -1; nd <= dir->nnodes; nd++)
		r2cc_ctl_dir_node_ranks(dir, nd, ranks, 16);
	for (int r = -1; r <= dir->nranks; r++) {
		r2cc_ctl_dir_node(dir, r);
		r2cc_ctl_dir_member(dir, r);
	}
	/* Every other rank, as ncclCommSplit would make them a communicator. */
	int *sub = malloc(sizeof(int) * (size_t)dir->nranks);
	int nsub = 0;
	for (int r = 0; sub && r < dir->nranks; r += 2)
		sub[nsub++] = r;
	struct r2cc_ctl_dir *child = NULL;
	if (nsub && r2cc_ctl_dir_derive(dir, sub, nsub, 0, 99, &child) == 0)
		r2cc_ctl_dir_free(child);
	free(sub);
	r2cc_ctl_dir_free(dir);
	return 0;
}
