/*
 * Pieces of the control plane that hold no state, shared between repair/ctl*.c
 * and exposed to the unit tests: the unique-id tail (ctl_uid.c), the choice of
 * the bootstrap interface (ctl_iface.c) and the directory encoding
 * (ctl_dir.c).
 */
#ifndef R2CC_REPAIR_CTL_PRIV_H
#define R2CC_REPAIR_CTL_PRIV_H

#include "repair/ctl.h"

#include <ifaddrs.h>
#include <net/if.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Unique-id tail, bytes 40..127 (NCCL reads 0..39):
 *   40  8  marker "R2CCuid" + version (1)
 *   48  1  address family: 4 or 6
 *   49  1  zero
 *   50  2  rendezvous port, big-endian
 *   52 16  rendezvous address (IPv4: first 4 bytes, rest zero)
 *   68 32  job secret
 *  100  8  check: SHA-256 of bytes 40..99, first 8 bytes
 *  108 20  zero
 */
#define R2CC_CTL_UID_MARKER_OFF 40
#define R2CC_CTL_UID_VERSION	1

/* Fills job->id from job->secret. */
int r2cc_ctl_job_derive_id(struct r2cc_ctl_job *job);
/* True when job->id is the one job->secret derives. */
bool r2cc_ctl_job_check(const struct r2cc_ctl_job *job);
/* Writes the tail for job (rdv = the address to carry). */
int r2cc_ctl_uid_encode(unsigned char id[R2CC_CTL_UID_SIZE], const struct r2cc_ctl_job *job);
/* Reads the tail back, without R2CC_OOB_ROOT. */
bool r2cc_ctl_uid_decode(const unsigned char id[R2CC_CTL_UID_SIZE], struct r2cc_ctl_job *job);
/* "host:port", "[v6]:port" or "v6:port"; host numeric or resolved (first
 * IPv4, else IPv6 result). 0 or -EINVAL. */
int r2cc_ctl_hostport_parse(const char *s, struct sockaddr_storage *out);

/* NCCL_SOCKET_IFNAME rules: comma-separated prefixes; a leading '^' excludes
 * the list; a leading '=' (after any '^') makes the names exact. */
bool r2cc_ctl_ifname_match(const char *spec, const char *name);
/* Picks the bootstrap address from an interface list: with a spec, the first
 * matching interface that is up (IPv4 before IPv6, no link-local IPv6);
 * without, the first up non-loopback interface with IPv4, else loopback.
 * Returns 0 or -ENODEV. */
int r2cc_ctl_iface_pick(const struct ifaddrs *list, const char *spec, struct sockaddr_storage *addr,
			char name[IF_NAMESIZE]);
/* Same from getifaddrs() and NCCL_SOCKET_IFNAME. */
int r2cc_ctl_iface_find(struct sockaddr_storage *addr, char name[IF_NAMESIZE]);

/* Tests: shorten the idle limit of half-received frames and of incoming
 * connections that have not authenticated (default 10 s), and how long a
 * frame for a job not known yet is kept before it counts as unknown_job
 * (default 2 s). */
void r2cc_ctl_set_timeouts(int stall_ms, int park_ms);
/* Tests: how long an incoming connection has, from accept, to deliver its
 * first authenticated frame (default 5 s). */
void r2cc_ctl_set_auth_ms(int auth_ms);

socklen_t r2cc_ctl_addr_len(const struct sockaddr_storage *addr);
bool r2cc_ctl_addr_equal(const struct sockaddr_storage *a, const struct sockaddr_storage *b);
uint16_t r2cc_ctl_addr_port(const struct sockaddr_storage *addr);

/*
 * Directory encoding. A member: host, node key (u8 length + bytes each), pid
 * (u32), control address (family u8, port u16, 16 address bytes), NIC count
 * (u8), per NIC: name (u8 length + bytes), lid u16, port u8, state u8, speed
 * u32, gid 16. A directory: nranks (u32), then per rank u32 length + member.
 * Everything big-endian; decoding checks every length.
 */
#define R2CC_CTL_MEMBER_MAX_ENC                                                                    \
	(2 + R2CC_CTL_HOST_MAX + R2CC_CTL_NODE_KEY_MAX + 4 + 19 + 1 +                              \
	 R2CC_CTL_MAX_NICS * (1 + R2CC_CTL_NIC_NAME_MAX + 24))

/* Returns the encoded length, or -EINVAL (a string too long, too many NICs). */
int r2cc_ctl_member_encode(const struct r2cc_ctl_member *m, unsigned char *out, size_t cap);
/* Returns 0 or -EPROTO. */
int r2cc_ctl_member_decode(const unsigned char *in, size_t len, struct r2cc_ctl_member *m);
/* Checks a directory blob and builds the directory (node indices, digest).
 * 0, -EPROTO or -ENOMEM. */
/* r2cc_ctl_dir_split() without making the job known to the control thread. */
int r2cc_ctl_dir_derive(const struct r2cc_ctl_dir *parent, const int *parent_ranks, int nranks,
			int self_rank, uint64_t tag, struct r2cc_ctl_dir **child_p);
int r2cc_ctl_dir_decode(const unsigned char *blob, size_t len, const struct r2cc_ctl_job *job,
			int self_rank, struct r2cc_ctl_dir **dir_p);

#endif
