/*
 * Control plane between the R2CC instances of one job: a rendezvous carried in
 * the spare bytes of ncclUniqueId, a directory of every rank (host, node, pid,
 * NICs, control address), and authenticated peer-to-peer messages for the
 * repair engine. One control thread per process ("r2cc-ctl"), created lazily,
 * owns every socket; other threads only queue work for it and wait.
 *
 * Jobs: one ncclGetUniqueId makes one job (a random 32-byte secret, a job id
 * derived from it, and the rendezvous address: the control listener of the
 * process that stamped the id). Every message of a job carries an HMAC-SHA256
 * tag keyed by the secret. A message that fails authentication is dropped,
 * counted and never answered; an authenticated one that cannot be served
 * (unknown type, malformed payload) is counted too, and answered with an error
 * when it is a request. Wire format: ctl/ctl_msg.h; id tail: ctl_priv.h.
 *
 * Scale: the rendezvous answers each registration with the node map (as runs)
 * and the members of the registrant's node only, so registration costs the root
 * O(ranks) in all and each rank O(its node); other members are looked up one
 * request at a time when a rank needs them (ctl_dir.c, and the round's NIC
 * index in ctl_rdv.c). The control thread waits on epoll, and every lookup it
 * makes per frame (connection, waiter, rendezvous slot) is a hash.
 *
 * R2CC_OOB_ROOT=host:port changes where the rendezvous is. The process that
 * stamps a unique id (normally rank 0) listens on that port as well, bound to
 * host's address when it is one of its own, else to every address of that
 * family; every process that parses an id (all ranks) connects to host:port
 * instead of the address carried in the id. Use it when the address the stamping
 * process sees for itself is not the one the others can reach (NAT,
 * containers, a fixed firewall hole). A second stamp in the same process
 * reuses that listener; if the port cannot be bound the stamp fails and the
 * communicators of that id run without repair.
 *
 * Every function returns 0 or a negative errno value unless it says otherwise;
 * none of them ever ends the process.
 */
#ifndef R2CC_REPAIR_CTL_H
#define R2CC_REPAIR_CTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define R2CC_CTL_UID_SIZE      128 /* sizeof(ncclUniqueId) */
#define R2CC_CTL_UID_NCCL_USED 40  /* bytes NCCL reads: magic + socket address */
#define R2CC_CTL_SECRET_SIZE   32
#define R2CC_CTL_MAX_PAYLOAD   (4u << 20) /* larger frames are dropped unread */
#define R2CC_CTL_HOST_MAX      64
#define R2CC_CTL_NODE_KEY_MAX  128
#define R2CC_CTL_NIC_NAME_MAX  64
#define R2CC_CTL_MAX_NICS      32
#define R2CC_CTL_MAX_RANKS     65536
/* Message types below R2CC_CTL_TYPE_USER belong to the control plane itself. */
#define R2CC_CTL_TYPE_USER 16
#define R2CC_CTL_TYPE_MAX  1024

struct r2cc_ctl_job {
	uint64_t id; /* derived from the secret; never 0 */
	unsigned char secret[R2CC_CTL_SECRET_SIZE];
	struct sockaddr_storage rdv; /* rendezvous address (after R2CC_OOB_ROOT) */
};

struct r2cc_ctl_nic {
	char name[R2CC_CTL_NIC_NAME_MAX]; /* "mlx5_0" */
	uint16_t lid;
	uint8_t port;
	uint8_t state; /* enum ibv_port_state */
	uint32_t speed_gbps;
	uint8_t gid[16];
};

/* What one rank registers. host, node_key, pid and nics are the caller's;
 * ctl_addr is filled in by r2cc_ctl_register(); node is filled in the
 * directory. nics comes last: a directory keeps only the nnics it holds. */
struct r2cc_ctl_member {
	char host[R2CC_CTL_HOST_MAX];
	char node_key[R2CC_CTL_NODE_KEY_MAX]; /* NCCL_HOSTID-aware node identity */
	int32_t pid;
	struct sockaddr_storage ctl_addr; /* that rank's process's control listener */
	int node; /* node index: 0 = node of rank 0, then in order of first rank */
	int nnics;
	struct r2cc_ctl_nic nics[R2CC_CTL_MAX_NICS];
};

/*
 * A communicator's view of its job. nranks, nnodes, the node of every rank
 * (kept as runs, see ctl_dir.c), gen and digest are identical on every rank;
 * self_rank is this rank's. Members are not all here: the registration brings
 * those of this rank's node, and the others are fetched from the rendezvous
 * when first needed (r2cc_ctl_dir_fetch(), r2cc_ctl_dir_owners(), or
 * implicitly by a request or message to that rank) and kept. So a process
 * holds what its peers cost, not what the job costs. digest is the SHA-256 of
 * all registered members in rank order (as registered, before any NIC report).
 * Read-only for the caller (the member cache has its own lock); freed with
 * r2cc_ctl_dir_free().
 */
struct r2cc_ctl_dir_priv;
struct r2cc_ctl_dir {
	struct r2cc_ctl_job job;
	int nranks;
	int self_rank;
	int nnodes;
	uint32_t gen; /* the rendezvous round it came from */
	unsigned char digest[32];
	struct r2cc_ctl_dir_priv *priv;
};

/* Where a NIC port is reached on the fabric: its LID (InfiniBand without a
 * GRH) or a GID (RoCE, or InfiniBand with a GRH). Peers name each other's NICs
 * this way in their RTR attributes. */
#define R2CC_CTL_NICADDR_LID 1
#define R2CC_CTL_NICADDR_GID 2
struct r2cc_ctl_nicaddr {
	uint8_t kind;
	uint8_t bytes[16]; /* LID: big-endian in bytes 0-1, rest zero */
};

/* Reasons a received message is dropped (index into r2cc_ctl_stats.drops). */
enum r2cc_ctl_drop {
	R2CC_CTL_DROP_NONE = 0,
	R2CC_CTL_DROP_BAD_HEADER,   /* magic, version or reserved bits */
	R2CC_CTL_DROP_BAD_LENGTH,   /* payload length over the cap */
	R2CC_CTL_DROP_UNKNOWN_JOB,  /* no secret for that job id here */
	R2CC_CTL_DROP_BAD_TAG,	    /* HMAC mismatch: wrong key or tampered */
	R2CC_CTL_DROP_STALE,	    /* timestamp outside the accepted window */
	R2CC_CTL_DROP_REPLAY,	    /* sequence number not above the last one seen */
	R2CC_CTL_DROP_UNKNOWN_TYPE, /* authenticated, but nobody handles the type */
	R2CC_CTL_DROP_MALFORMED,    /* authenticated, but the payload does not parse */
	R2CC_CTL_DROP_TRUNCATED,    /* connection closed in the middle of a frame */
	R2CC_CTL_DROP_TIMEOUT,	    /* half a frame idle too long, or no authenticated
				     * frame in time from an incoming connection */
	R2CC_CTL_DROP_MISADDRESSED, /* authenticated, but for a rank this process
				     * does not hold in that job (a replay) */
	R2CC_CTL_DROP_COUNT
};

struct r2cc_ctl_stats {
	uint64_t sent;	       /* frames written completely */
	uint64_t received;     /* frames accepted (authenticated and well formed) */
	uint64_t send_failed;  /* queued frames dropped: queue full, peer unreachable */
	uint64_t conns_opened; /* outgoing */
	uint64_t conns_accepted;
	uint64_t conns_refused; /* accepted then closed at once: too many, in all or
				 * not yet authenticated from that source */
	uint64_t drops[R2CC_CTL_DROP_COUNT];
};

/* The reason's name for logs and reports ("bad_tag", ...). */
const char *r2cc_ctl_drop_name(int reason);

/*
 * Called by the ncclGetUniqueId wrapper right after the real call: starts the
 * control thread if needed, makes a new job served by this process and writes
 * the marker, rendezvous address, secret and check value into bytes 40..127.
 * On error the id is left untouched (no marker: its communicators run without
 * repair).
 */
int r2cc_ctl_uid_stamp(unsigned char id[R2CC_CTL_UID_SIZE]);

/* Recognises a stamped id and fills *job (R2CC_OOB_ROOT applied). False for an
 * id from a process without R2CC or with a random tail. Starts nothing. */
bool r2cc_ctl_uid_parse(const unsigned char id[R2CC_CTL_UID_SIZE], struct r2cc_ctl_job *job);

/*
 * Registers rank `rank` of `nranks` with the job's rendezvous and waits until
 * all nranks ranks have registered, then returns the directory in *dir_p. To be
 * called by every init wrapper before the real init. self->ctl_addr is filled
 * in. A rank that registers again (a second communicator from the same id)
 * joins a new round. Errors: -ETIMEDOUT when the others did not all come
 * within timeout_ms (the caller then runs that communicator without repair),
 * -ECONNREFUSED / -ECONNRESET when the rendezvous cannot be reached or rejects
 * the message (wrong secret), -EPROTO for a malformed directory, -EINVAL (also
 * for a job whose id and secret do not belong together), -EDEADLK from a
 * handler, -ESHUTDOWN.
 */
int r2cc_ctl_register(const struct r2cc_ctl_job *job, struct r2cc_ctl_member *self, int rank,
		      int nranks, int timeout_ms, struct r2cc_ctl_dir **dir_p);

/* Same for several ranks of this process at once (ncclCommInitAll): dirs_p[i]
 * is the directory seen by ranks[i]. All or nothing. */
int r2cc_ctl_register_ranks(const struct r2cc_ctl_job *job, struct r2cc_ctl_member *self,
			    const int *ranks, int nlocal, int nranks, int timeout_ms,
			    struct r2cc_ctl_dir **dirs_p);

void r2cc_ctl_dir_free(struct r2cc_ctl_dir *dir);
/* The member of rank if this directory holds it (no network); NULL when rank
 * is out of range or its member was never fetched. The pointer stays valid
 * until the directory is freed. */
const struct r2cc_ctl_member *r2cc_ctl_dir_member(const struct r2cc_ctl_dir *dir, int rank);
/* Fetches from the rendezvous the members of these ranks that the directory
 * does not hold yet (one request; a rank may be named more than once).
 * -EDEADLK from a handler, -ENOENT when the rendezvous no longer serves this
 * round, or a request's error. */
int r2cc_ctl_dir_fetch(const struct r2cc_ctl_dir *dir, const int *ranks, int n, int timeout_ms);
/* Node index of a rank (node 0 = node of rank 0), or -EINVAL. */
int r2cc_ctl_dir_node(const struct r2cc_ctl_dir *dir, int rank);
/* Writes up to max ranks of node `node`, ascending; returns how many the node
 * has (may exceed max), or -EINVAL. */
int r2cc_ctl_dir_node_ranks(const struct r2cc_ctl_dir *dir, int node, int *ranks, int max);
/* Bytes the directory takes in this process (node runs, members held, maps). */
size_t r2cc_ctl_dir_bytes(const struct r2cc_ctl_dir *dir);
/* NIC address of a NIC entry: its GID when want_gid (and the GID is not all
 * zero), else its LID (kind 0 when it has neither). */
void r2cc_ctl_nicaddr_of(const struct r2cc_ctl_nic *nic, bool want_gid,
			 struct r2cc_ctl_nicaddr *out);

/*
 * The NICs this rank uses (its queue pairs are on them) become part of its
 * member at the rendezvous and enter the job's NIC index under their LID and
 * GID, so that peers find this process from the addresses in their RTR
 * attributes. A NIC already reported with the same name, LID and GID is not
 * added again. One request; errors as r2cc_ctl_dir_fetch().
 */
int r2cc_ctl_dir_report_nics(const struct r2cc_ctl_dir *dir, const struct r2cc_ctl_nic *nics, int n,
			     int timeout_ms);
/*
 * The ranks that reported each of these NIC addresses, from the rendezvous'
 * index (one request): owners[i * max_per_addr + k] for k < min(nowners[i],
 * max_per_addr), ascending; nowners[i] may exceed max_per_addr. Their members
 * are fetched into the directory with the answer. Errors as
 * r2cc_ctl_dir_fetch().
 */
int r2cc_ctl_dir_owners(const struct r2cc_ctl_dir *dir, const struct r2cc_ctl_nicaddr *addrs, int n,
			int *owners, int max_per_addr, int *nowners, int timeout_ms);
/* This rank is done with the directory (its communicator is gone): tells the
 * rendezvous, which frees the round once every rank of it has left. Queued,
 * never waits; the directory itself stays valid until freed. */
void r2cc_ctl_dir_leave(const struct r2cc_ctl_dir *dir);

/*
 * Directory of a communicator made without a unique id (ncclCommSplit,
 * ncclCommShrink): child rank i is parent rank parent_ranks[i]. The child is a
 * job of its own, keyed by a secret derived from the parent's secret and tag,
 * so every member that passes the same tag and ranks gets the same job, and
 * its messages never mix with the parent's. No network traffic.
 */
int r2cc_ctl_dir_split(const struct r2cc_ctl_dir *parent, const int *parent_ranks, int nranks,
		       int self_rank, uint64_t tag, struct r2cc_ctl_dir **child_p);

/*
 * Handler for one message type (>= R2CC_CTL_TYPE_USER), run on the control
 * thread; it must not block (r2cc_ctl_request() and r2cc_ctl_register() from a
 * handler return -EDEADLK; r2cc_ctl_send() is fine). For a request, it answers with
 * r2cc_ctl_reply() before returning (call is only valid during the handler); a request left
 * unanswered gets an error reply (-ENODATA at the requester). NULL fn removes
 * the handler.
 */
struct r2cc_ctl_call {
	uint64_t job_id;
	int from_rank; /* sender's rank in that job (authenticated as a member) */
	int to_rank;   /* the local rank it was addressed to */
	bool is_request;
};
typedef void (*r2cc_ctl_handler_fn)(void *arg, int from_rank, const void *payload, size_t len,
				    struct r2cc_ctl_call *call);
int r2cc_ctl_set_handler(uint16_t type, r2cc_ctl_handler_fn fn, void *arg);
/* Answer a request from inside its handler. A negative status makes the
 * requester's r2cc_ctl_request() return that status (payload ignored). */
int r2cc_ctl_reply(struct r2cc_ctl_call *call, int status, const void *payload, size_t len);

/* Queue one message to `rank` of dir's communicator; returns 0 once queued
 * (the payload is copied). Connects on demand and keeps the connection. A rank
 * whose member the directory does not hold is fetched first (waits up to 2 s;
 * from a handler that is -ENOENT instead). -ENOBUFS when the queue is full,
 * -EMSGSIZE, -EINVAL, -ESHUTDOWN. Delivery is not confirmed: use
 * r2cc_ctl_request() for that. */
int r2cc_ctl_send(const struct r2cc_ctl_dir *dir, int rank, uint16_t type, const void *payload,
		  size_t len);

/* Send a request and wait up to timeout_ms for its reply (fetching rank's
 * member first if needed, within the same time). *reply_len: in, the
 * capacity of reply; out, the reply's length (with -EMSGSIZE: the length it
 * needed). Errors: -ETIMEDOUT, -ECONNREFUSED, -ECONNRESET, -EMSGSIZE, or the
 * negative status the handler replied with (-ENODATA when it did not,
 * -EOPNOTSUPP when the peer has no handler for the type); -EDEADLK from a
 * handler. */
int r2cc_ctl_request(const struct r2cc_ctl_dir *dir, int rank, uint16_t type, const void *payload,
		     size_t len, void *reply, size_t *reply_len, int timeout_ms);

/* Several requests at once, each to its own directory and rank, all waited
 * for together (until timeout_ms from the call): reqs[i].status gets what
 * r2cc_ctl_request() would return, reqs[i].reply_len the reply's length.
 * Returns 0 when every request got a reply (status 0), else the first error;
 * -EINVAL / -EDEADLK before anything is sent. */
struct r2cc_ctl_batch_req {
	const struct r2cc_ctl_dir *dir;
	int rank;
	const void *payload;
	size_t len;
	void *reply;
	size_t reply_len; /* in: capacity; out: length */
	int status;
};
int r2cc_ctl_request_batch(struct r2cc_ctl_batch_req *reqs, int n, uint16_t type, int timeout_ms);

void r2cc_ctl_stats(struct r2cc_ctl_stats *out);

/* This process's control listener address; -ENOTCONN when not started. */
int r2cc_ctl_local_addr(struct sockaddr_storage *addr);
/* "1.2.3.4:5678" / "[::1]:5678" */
const char *r2cc_ctl_addr_str(const struct sockaddr_storage *addr, char *buf, size_t len);

/* Stops the control thread and closes every socket. Safe to call twice, and
 * when nothing was ever started; later calls to the functions above return
 * -ESHUTDOWN. */
void r2cc_ctl_shutdown(void);

#endif
