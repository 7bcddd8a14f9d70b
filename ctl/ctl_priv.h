/*
 * Pieces of the control plane that hold no state, shared between ctl/ctl*.c
 * and exposed to the unit tests: the unique-id tail (ctl_uid.c), the choice of
 * the bootstrap interface (ctl_iface.c) and the directory encoding
 * (ctl_dir.c).
 */
#ifndef R2CC_REPAIR_CTL_PRIV_H
#define R2CC_REPAIR_CTL_PRIV_H

#include "ctl/ctl.h"

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
/* Tests that stand in for many hosts from one address (tools/ctl_load.c):
 * how many connections one source address may hold before they authenticate
 * (default 64, the ranks of a few nodes' worth). */
void r2cc_ctl_set_preauth_per_src(int n);

socklen_t r2cc_ctl_addr_len(const struct sockaddr_storage *addr);
bool r2cc_ctl_addr_equal(const struct sockaddr_storage *a, const struct sockaddr_storage *b);
uint16_t r2cc_ctl_addr_port(const struct sockaddr_storage *addr);

/*
 * Directory encoding (ctl_dir.c). A member: host, node key (u8 length + bytes
 * each), pid (u32), control address (family u8, port u16, 16 address bytes),
 * NIC count (u8), per NIC: name (u8 length + bytes), lid u16, port u8, state
 * u8, speed u32, gid 16. Everything big-endian; decoding checks every length.
 * The messages built from it are listed at the top of ctl_dir.c.
 */
#define R2CC_CTL_MEMBER_MAX_ENC                                                                    \
	(2 + R2CC_CTL_HOST_MAX + R2CC_CTL_NODE_KEY_MAX + 4 + 19 + 1 +                              \
	 R2CC_CTL_MAX_NICS * (1 + R2CC_CTL_NIC_NAME_MAX + 24))
#define R2CC_CTL_LOOKUP_MAX_ADDRS 4096
#define R2CC_CTL_OWNERS_MAX	  256 /* owners of one NIC address in one answer */

/* Returns the encoded length, or -EINVAL (a string too long, too many NICs). */
int r2cc_ctl_member_encode(const struct r2cc_ctl_member *m, unsigned char *out, size_t cap);
/* Returns 0 or -EPROTO. */
int r2cc_ctl_member_decode(const unsigned char *in, size_t len, struct r2cc_ctl_member *m);
/* r2cc_ctl_dir_split() without making the job known to the control thread. */
int r2cc_ctl_dir_derive(const struct r2cc_ctl_dir *parent, const int *parent_ranks, int nranks,
			int self_rank, uint64_t tag, struct r2cc_ctl_dir **child_p);
/* Checks a registration answer (the head: node runs, the registrant's node's
 * members) and builds the rank's directory. 0, -EPROTO or -ENOMEM. */
int r2cc_ctl_dir_decode(const unsigned char *blob, size_t len, const struct r2cc_ctl_job *job,
			int self_rank, struct r2cc_ctl_dir **dir_p);
/* Where dir's members are looked up: the job whose rendezvous holds them, this
 * rank's number there and the round. A split's lookups go to its parent's. */
void r2cc_ctl_dir_lookup_target(const struct r2cc_ctl_dir *dir, const struct r2cc_ctl_job **job,
				int *self, uint32_t *gen);
/* rank of dir in the lookup job's numbering, -1 if out of range. */
int r2cc_ctl_dir_to_lookup(const struct r2cc_ctl_dir *dir, int rank);
/* A LOOKUP request for these ranks (dir's numbering) and NIC addresses. */
int r2cc_ctl_lookup_encode(const struct r2cc_ctl_dir *dir, const int *ranks, int nr,
			   const struct r2cc_ctl_nicaddr *addrs, int na, unsigned char **out,
			   size_t *len);
/* Takes a LOOKUP answer: its members into dir, the owners of the naddrs
 * addresses into owners/nowners (as r2cc_ctl_dir_owners(); both may be NULL
 * when naddrs is 0). 0, -EPROTO or -ENOMEM. */
int r2cc_ctl_dir_take_lookup(const struct r2cc_ctl_dir *dir, const unsigned char *reply, size_t len,
			     int naddrs, int *owners, int max_per_addr, int *nowners);
/* A NICS request: this rank of dir reports these NICs. */
int r2cc_ctl_nics_encode(const struct r2cc_ctl_dir *dir, const struct r2cc_ctl_nic *nics, int n,
			 unsigned char **out, size_t *len);

/*
 * The rendezvous' copy of a completed round: every member as registered (then
 * with the NICs reported since), the node numbering, the digest, the node runs
 * and the NIC index. Made from the round's encoded members (taken over, also
 * on error); answers registrations (the head for one rank), lookups and NIC
 * reports; freed once every rank has left.
 */
struct r2cc_ctl_rdir;
struct r2cc_ctl_rdir *r2cc_ctl_rdir_new(int nranks, uint32_t gen, unsigned char **member,
					size_t *mlen, int *err);
void r2cc_ctl_rdir_free(struct r2cc_ctl_rdir *rd);
uint32_t r2cc_ctl_rdir_gen(const struct r2cc_ctl_rdir *rd);
size_t r2cc_ctl_rdir_bytes(const struct r2cc_ctl_rdir *rd);
/* The registration answer for rank (malloc'd). */
int r2cc_ctl_rdir_head(const struct r2cc_ctl_rdir *rd, int rank, unsigned char **out, size_t *len);
/* The answer to a LOOKUP request (malloc'd); -ENOENT for another round,
 * -EPROTO, -EMSGSIZE, -ENOMEM. */
int r2cc_ctl_rdir_lookup(const struct r2cc_ctl_rdir *rd, const unsigned char *req, size_t len,
			 unsigned char **out, size_t *olen);
/* Applies a NICS request from from_rank: -EPERM when it speaks for another
 * rank, -ENOENT for another round, -EPROTO. */
int r2cc_ctl_rdir_nics(struct r2cc_ctl_rdir *rd, int from_rank, const unsigned char *req,
		       size_t len);
/* rank left; true once every rank has. */
bool r2cc_ctl_rdir_leave(struct r2cc_ctl_rdir *rd, int rank);

/* r2cc_ctl_register_ranks() with a member of its own for each local rank
 * (members[i] for ranks[i]): simulated ranks of several nodes in one process. */
int r2cc_ctl_register_each(const struct r2cc_ctl_job *job, struct r2cc_ctl_member *members,
			   const int *ranks, int nlocal, int nranks, int timeout_ms,
			   struct r2cc_ctl_dir **dirs_p);

/* Tests and the load generator: one outgoing connection per sending rank
 * instead of one per destination process, so that ranks simulated in one
 * process reach the rendezvous as separate processes would. */
void r2cc_ctl_set_conn_per_rank(bool on);

#endif
