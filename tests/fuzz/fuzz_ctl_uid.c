/*
 * libFuzzer target: the rendezvous marker in bytes 40..127 of an
 * ncclUniqueId (ctl/ctl_uid.c), as every rank reads it from an id it was
 * handed, and the host:port parser of R2CC_OOB_ROOT. A tail that decodes must
 * describe a job whose id belongs to its secret, and re-encode to a tail that
 * decodes to the same job (bytes the decoder does not read may differ).
 * Name lookups stay numeric (getaddrinfo below): a fuzzer must not query DNS.
 */
#include "ctl/ctl.h"
#include "ctl/ctl_priv.h"

#include <dlfcn.h>
#include <netdb.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
		struct addrinfo **res)
{
	static int (*real)(const char *, const char *, const struct addrinfo *, struct addrinfo **);
	if (!real)
		*(void **)&real = dlsym(RTLD_NEXT, "getaddrinfo");
	struct addrinfo h = hints ? *hints : (struct addrinfo){0};
	h.ai_flags |= AI_NUMERICHOST;
	return real(node, service, &h, res);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	unsigned char id[R2CC_CTL_UID_SIZE] = {0};
	memcpy(id, data, size < sizeof(id) ? size : sizeof(id));
	struct r2cc_ctl_job job;
	if (r2cc_ctl_uid_decode(id, &job)) {
		if (!r2cc_ctl_job_check(&job))
			abort();
		unsigned char again[R2CC_CTL_UID_SIZE];
		struct r2cc_ctl_job job2;
		memcpy(again, id, sizeof(again));
		if (r2cc_ctl_uid_encode(again, &job) != 0 || !r2cc_ctl_uid_decode(again, &job2) ||
		    memcmp(&job, &job2, sizeof(job)) != 0 ||
		    memcmp(again, id, R2CC_CTL_UID_NCCL_USED) != 0)
			abort();
		char a[64];
		r2cc_ctl_addr_str(&job.rdv, a, sizeof(a));
	}
	/* The rest of the input, as text, is an R2CC_OOB_ROOT value. */
	if (size > sizeof(id)) {
		size_t n = size - sizeof(id) > 255 ? 255 : size - sizeof(id);
		char s[256];
		memcpy(s, data + sizeof(id), n);
		s[n] = 0;
		struct sockaddr_storage ss;
		r2cc_ctl_hostport_parse(s, &ss);
	}
	return 0;
}
