/*
 * `r2cc doctor`: the pre-flight check. It gathers what this machine offers
 * (RDMA NICs through libibverbs and sysfs, GPUs, NCCL, R2CC's own settings),
 * turns each finding into one check with a verdict (OK / INFO / WARN / FAIL)
 * and, for each problem, what it means and how to fix it, then prints a report
 * (or JSON) and exits 0 (all good), 1 (warnings) or 2 (R2CC cannot repair).
 *
 * doctor.c owns the report and the repairability verdict, doctor_nic.c the
 * NICs and GPUs, doctor_env.c the NCCL and R2CC settings. Nothing is linked
 * against libibverbs, libnccl or CUDA: they are dlopen()ed at run time.
 */
#ifndef R2CC_TOOLS_DOCTOR_H
#define R2CC_TOOLS_DOCTOR_H

#include <stdbool.h>
#include <stddef.h>

enum dr_level {
	DR_OK = 0,
	DR_INFO = 1, /* a fact, no verdict; does not change the exit status */
	DR_WARN = 2,
	DR_FAIL = 3,
};

enum dr_section {
	DR_SEC_NIC = 0,
	DR_SEC_GPU,
	DR_SEC_NCCL,
	DR_SEC_R2CC,
	DR_SEC_REPAIR,
	DR_SEC_COUNT
};

struct dr_check {
	enum dr_section section;
	enum dr_level level;
	char item[48];
	char msg[400];
	char means[400]; /* what a problem means; empty for OK/INFO */
	char fix[400];	 /* the command or setting that fixes it */
};

#define DR_MAX_NICS 64
#define DR_MAX_GPUS 32

struct dr_nic {
	char name[64]; /* device name; "dev:port" when the device has several ports */
	char dev[64];
	int port;
	bool active;
	char state[16];	     /* ACTIVE, DOWN, INIT, ARMED, ... */
	double gbps;	     /* active_speed x width, or sysfs rate */
	char speed_str[32];  /* "4X EDR" */
	char link_layer[16]; /* InfiniBand, Ethernet */
	unsigned lid, sm_lid;
	int mtu;
	int gid_index; /* RoCE v2 GID NCCL would pick; -1 none / not RoCE */
	char gid[48];
	char netdev[32];
	char fw[64];
	bool soft;	    /* no PCI path: a software device */
	char pci[32];	    /* PCI address (BDF) */
	char pci_path[256]; /* sysfs device path */
	int numa;
	char driver[32];
	char gpu[32];	    /* nearest GPU, PCI address */
	char gpu_rel[48];   /* how near */
	bool nccl_uses;	    /* passes NCCL_IB_HCA */
	char query_err[96]; /* why the device could not be queried */
};

struct dr_gpu {
	char pci[32];
	char path[256];
	char model[64];
	int numa;
};

struct dr_state {
	/* options */
	bool json, quiet;
	int nodes;
	const char *nccl_path;	  /* --nccl / R2CC_DOCTOR_NCCL, else libnccl.so.2 */
	const char *ibverbs_path; /* --ibverbs / R2CC_DOCTOR_IBVERBS, else as NCCL */
	const char *sysroot;	  /* R2CC_DOCTOR_SYSROOT: prefix of /sys and /proc (tests) */

	/* what was found */
	char verbs_lib[256]; /* file the loader picked, empty: none */
	int verbs_ndev;	     /* devices listed, -1 when the list failed */
	char verbs_why[128]; /* why there are no devices, when known */
	int nnics;
	struct dr_nic nics[DR_MAX_NICS];
	int ngpus;
	struct dr_gpu gpus[DR_MAX_GPUS];
	bool gdr_peermem, gdr_memory_peers;

	char nccl_lib[256];
	int nccl_code; /* ncclGetVersion, 0 = not found */

	char r2cc_lib[300]; /* libr2cc.so next to the tool, empty: not found */
	int r2cc_mode;	    /* as the library would read it, -1 when invalid */

	int nchecks;
	struct dr_check checks[256];
};

/* Add a check; msg is printf-formatted. Returns it so that a problem can get
 * its meaning and fix with dr_explain(). */
struct dr_check *dr_add(struct dr_state *st, enum dr_section sec, enum dr_level lvl,
			const char *item, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void dr_explain(struct dr_check *c, const char *means, const char *fixfmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Path under the sysfs/proc root; returns buf. */
const char *dr_path(const struct dr_state *st, char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Copy a string, truncated to fit dst (always terminated). */
void dr_copy(char *dst, size_t len, const char *src);
/* First line of a file, newline stripped; 0 or -errno. */
int dr_read_line(const char *path, char *buf, size_t len);

/* NCCL's NCCL_IB_HCA / NCCL_SOCKET_IFNAME matching ("^" excludes, "=" exact,
 * otherwise prefix; entries "name[:port]"). port < 0 ignores the port. */
bool dr_nccl_match(const char *filter, const char *name, int port);

/* "2.28.9" from ncclGetVersion's code (both encodings). */
void dr_nccl_version_str(int code, char *buf, size_t len);

/* doctor_nic.c */
void dr_scan_nics(struct dr_state *st);
void dr_scan_gpus(struct dr_state *st);
void dr_check_nics(struct dr_state *st);
void dr_check_gpus(struct dr_state *st);

/* doctor_env.c */
void dr_check_nccl(struct dr_state *st);
void dr_check_r2cc(struct dr_state *st, const char *argv0);

int r2cc_doctor_main(int argc, char **argv);

#endif
