/*
 * The R2CC tail of ncclUniqueId (layout in ctl_priv.h), socket-address
 * helpers and R2CC_OOB_ROOT parsing. r2cc_ctl_uid_parse() lives here because
 * it needs no control thread; r2cc_ctl_uid_stamp() is in ctl.c because it
 * starts one.
 */
#include "ctl/ctl_priv.h"
#include "shim/log.h"
#include "shim/params.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

static const unsigned char uid_marker[8] = {'R', '2', 'C', 'C',
					    'u', 'i', 'd', R2CC_CTL_UID_VERSION};

static int sha256(const void *data, size_t len, unsigned char md[32])
{
	unsigned int mdlen = 0;
	if (!EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL) || mdlen != 32)
		return -EIO;
	return 0;
}

int r2cc_ctl_job_derive_id(struct r2cc_ctl_job *job)
{
	static const char label[] = "r2cc-ctl job id";
	unsigned char buf[sizeof(label) + R2CC_CTL_SECRET_SIZE];
	unsigned char md[32];
	memcpy(buf, label, sizeof(label));
	memcpy(buf + sizeof(label), job->secret, R2CC_CTL_SECRET_SIZE);
	if (sha256(buf, sizeof(buf), md))
		return -EIO;
	uint64_t id = 0;
	for (int i = 0; i < 8; i++)
		id = id << 8 | md[i];
	job->id = id ? id : 1;
	return 0;
}

bool r2cc_ctl_job_check(const struct r2cc_ctl_job *job)
{
	struct r2cc_ctl_job j = *job;
	return r2cc_ctl_job_derive_id(&j) == 0 && j.id == job->id;
}

socklen_t r2cc_ctl_addr_len(const struct sockaddr_storage *addr)
{
	return addr->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
					   : sizeof(struct sockaddr_in);
}

uint16_t r2cc_ctl_addr_port(const struct sockaddr_storage *addr)
{
	if (addr->ss_family == AF_INET6)
		return ntohs(((const struct sockaddr_in6 *)addr)->sin6_port);
	return ntohs(((const struct sockaddr_in *)addr)->sin_port);
}

bool r2cc_ctl_addr_equal(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	if (a->ss_family != b->ss_family)
		return false;
	if (a->ss_family == AF_INET) {
		const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
		return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
	}
	if (a->ss_family == AF_INET6) {
		const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
		return x->sin6_port == y->sin6_port &&
		       !memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(x->sin6_addr)) &&
		       x->sin6_scope_id == y->sin6_scope_id;
	}
	return false;
}

const char *r2cc_ctl_addr_str(const struct sockaddr_storage *addr, char *buf, size_t len)
{
	char ip[INET6_ADDRSTRLEN] = "?";
	if (addr->ss_family == AF_INET) {
		inet_ntop(AF_INET, &((const struct sockaddr_in *)addr)->sin_addr, ip, sizeof(ip));
		snprintf(buf, len, "%s:%u", ip, r2cc_ctl_addr_port(addr));
	} else if (addr->ss_family == AF_INET6) {
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)addr)->sin6_addr, ip,
			  sizeof(ip));
		snprintf(buf, len, "[%s]:%u", ip, r2cc_ctl_addr_port(addr));
	} else {
		snprintf(buf, len, "(none)");
	}
	return buf;
}

int r2cc_ctl_uid_encode(unsigned char id[R2CC_CTL_UID_SIZE], const struct r2cc_ctl_job *job)
{
	unsigned char *t = id + R2CC_CTL_UID_MARKER_OFF;
	unsigned char tail[R2CC_CTL_UID_SIZE - R2CC_CTL_UID_MARKER_OFF] = {0};
	uint16_t port = r2cc_ctl_addr_port(&job->rdv);
	memcpy(tail, uid_marker, 8);
	if (job->rdv.ss_family == AF_INET) {
		tail[8] = 4;
		memcpy(tail + 12, &((const struct sockaddr_in *)&job->rdv)->sin_addr, 4);
	} else if (job->rdv.ss_family == AF_INET6) {
		tail[8] = 6;
		memcpy(tail + 12, &((const struct sockaddr_in6 *)&job->rdv)->sin6_addr, 16);
	} else {
		return -EAFNOSUPPORT;
	}
	tail[10] = (unsigned char)(port >> 8);
	tail[11] = (unsigned char)port;
	memcpy(tail + 28, job->secret, R2CC_CTL_SECRET_SIZE);
	unsigned char md[32];
	if (sha256(tail, 60, md))
		return -EIO;
	memcpy(tail + 60, md, 8);
	memcpy(t, tail, sizeof(tail));
	return 0;
}

bool r2cc_ctl_uid_decode(const unsigned char id[R2CC_CTL_UID_SIZE], struct r2cc_ctl_job *job)
{
	const unsigned char *t = id + R2CC_CTL_UID_MARKER_OFF;
	unsigned char md[32];
	if (memcmp(t, uid_marker, 8) != 0 || sha256(t, 60, md) || memcmp(md, t + 60, 8) != 0)
		return false;
	uint16_t port = (uint16_t)(t[10] << 8 | t[11]);
	if (t[9] != 0 || port == 0)
		return false;
	memset(job, 0, sizeof(*job));
	if (t[8] == 4) {
		struct sockaddr_in *sin = (struct sockaddr_in *)&job->rdv;
		sin->sin_family = AF_INET;
		sin->sin_port = htons(port);
		memcpy(&sin->sin_addr, t + 12, 4);
	} else if (t[8] == 6) {
		struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&job->rdv;
		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = htons(port);
		memcpy(&sin6->sin6_addr, t + 12, 16);
	} else {
		return false;
	}
	memcpy(job->secret, t + 28, R2CC_CTL_SECRET_SIZE);
	return r2cc_ctl_job_derive_id(job) == 0;
}

int r2cc_ctl_hostport_parse(const char *s, struct sockaddr_storage *out)
{
	char host[256];
	const char *colon, *hstart = s;
	size_t hlen;
	if (s[0] == '[') {
		const char *close = strchr(s, ']');
		if (!close || close[1] != ':')
			return -EINVAL;
		hstart = s + 1;
		hlen = (size_t)(close - hstart);
		colon = close + 1;
	} else {
		colon = strrchr(s, ':');
		if (!colon)
			return -EINVAL;
		hlen = (size_t)(colon - s);
	}
	if (hlen == 0 || hlen >= sizeof(host))
		return -EINVAL;
	memcpy(host, hstart, hlen);
	host[hlen] = '\0';
	char *end;
	errno = 0;
	long port = strtol(colon + 1, &end, 10);
	if (colon[1] < '0' || colon[1] > '9' || *end || errno || port < 1 || port > 65535)
		return -EINVAL;

	struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
	if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res)
		return -EINVAL;
	const struct addrinfo *pick = NULL;
	for (const struct addrinfo *ai = res; ai; ai = ai->ai_next)
		if (ai->ai_family == AF_INET && !pick)
			pick = ai;
	for (const struct addrinfo *ai = res; ai && !pick; ai = ai->ai_next)
		if (ai->ai_family == AF_INET6)
			pick = ai;
	int rc = -EINVAL;
	if (pick && pick->ai_addrlen <= sizeof(*out)) {
		memset(out, 0, sizeof(*out));
		memcpy(out, pick->ai_addr, pick->ai_addrlen);
		if (out->ss_family == AF_INET)
			((struct sockaddr_in *)out)->sin_port = htons((uint16_t)port);
		else
			((struct sockaddr_in6 *)out)->sin6_port = htons((uint16_t)port);
		rc = 0;
	}
	freeaddrinfo(res);
	return rc;
}

bool r2cc_ctl_uid_parse(const unsigned char id[R2CC_CTL_UID_SIZE], struct r2cc_ctl_job *job)
{
	struct r2cc_ctl_job j;
	if (!r2cc_ctl_uid_decode(id, &j))
		return false;
	r2cc_params_load();
	if (r2cc_param.oob_root[0]) {
		struct sockaddr_storage root;
		if (r2cc_ctl_hostport_parse(r2cc_param.oob_root, &root) == 0)
			j.rdv = root;
		else
			R2CC_WARN_ONCE("R2CC_OOB_ROOT=%s cannot be resolved; using the address "
				       "carried in the unique id",
				       r2cc_param.oob_root);
	}
	*job = j;
	return true;
}
