/*
 * The parameter table: every R2CC_* setting with its default, help text and
 * validator. r2cc_params_load() reads the environment once; nothing else in
 * the library calls getenv() for an R2CC_* name. Validators write one message
 * that names the variable and says what it accepts.
 */
#include "shim/params.h"
#include "shim/drillspec.h"
#include "shim/failspec.h"
#include "shim/log.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct r2cc_params r2cc_param;

typedef int (*param_parse_fn)(struct r2cc_params *p, const char *v);

struct param_def {
	const char *name;
	const char *def;     /* default, as the user would write it */
	const char *accepts; /* what the validator accepts, for the error line */
	const char *help;
	param_parse_fn parse; /* 0 or -EINVAL */
};

/* Strict integer in [lo, hi]: no sign games, no trailing junk. */
static int parse_int(const char *v, long lo, long hi, long *out)
{
	char *end;
	if (!v[0] || isspace((unsigned char)v[0]))
		return -EINVAL;
	errno = 0;
	long x = strtol(v, &end, 10);
	if (errno || *end || x < lo || x > hi)
		return -EINVAL;
	*out = x;
	return 0;
}

/* Byte size with an optional K/M/G/T suffix (binary, as nccl-tests). */
static int parse_size(const char *v, uint64_t *out)
{
	char *end;
	if (!v[0] || !isdigit((unsigned char)v[0]))
		return -EINVAL;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 10);
	if (errno)
		return -EINVAL;
	unsigned shift = 0;
	switch (toupper((unsigned char)*end)) {
	case '\0':
		break;
	case 'K':
		shift = 10;
		break;
	case 'M':
		shift = 20;
		break;
	case 'G':
		shift = 30;
		break;
	case 'T':
		shift = 40;
		break;
	default:
		return -EINVAL;
	}
	if (*end) {
		end++;
		if (*end == 'B' || *end == 'b' || (*end == 'i' && end[1] == 'B' && end++))
			end++;
		if (*end)
			return -EINVAL;
	}
	if (shift && x > (~0ULL >> shift))
		return -EINVAL;
	*out = (uint64_t)x << shift;
	return 0;
}

static int copy_str(char *dst, size_t n, const char *v)
{
	size_t len = strlen(v);
	if (len >= n)
		return -EINVAL;
	for (size_t i = 0; i < len; i++)
		if (!isprint((unsigned char)v[i]))
			return -EINVAL;
	memcpy(dst, v, len + 1);
	return 0;
}

static int parse_mode(struct r2cc_params *p, const char *v)
{
	long x;
	if (!strcasecmp(v, "auto")) {
		p->mode = R2CC_MODE_AUTO;
		return 0;
	}
	if (parse_int(v, 0, 3, &x))
		return -EINVAL;
	p->mode = (int)x;
	return 0;
}

static int parse_failed_node(struct r2cc_params *p, const char *v)
{
	return copy_str(p->failed_node, sizeof(p->failed_node), v);
}

static int parse_drill(struct r2cc_params *p, const char *v)
{
	return copy_str(p->drill, sizeof(p->drill), v);
}

static int parse_failed_hca(struct r2cc_params *p, const char *v)
{
	return copy_str(p->failed_hca, sizeof(p->failed_hca), v);
}

static int parse_after_repair(struct r2cc_params *p, const char *v)
{
	long x;
	if (parse_int(v, 2, 3, &x))
		return -EINVAL;
	p->ar_after_repair = (int)x;
	return 0;
}

static int parse_chunks(struct r2cc_params *p, const char *v)
{
	long x;
	if (parse_int(v, 1, 64, &x))
		return -EINVAL;
	p->ar_stage2_chunks = (int)x;
	return 0;
}

static int parse_schedule(struct r2cc_params *p, const char *v)
{
	long x;
	if (parse_int(v, 0, 3, &x))
		return -EINVAL;
	p->ar_schedule = (int)x;
	return 0;
}

static int parse_min_bytes(struct r2cc_params *p, const char *v)
{
	return parse_size(v, &p->ar_min_bytes);
}

static int parse_stall(struct r2cc_params *p, const char *v)
{
	long x;
	if (!strcasecmp(v, "auto")) {
		p->stall_ms = 0;
		return 0;
	}
	if (parse_int(v, 1, 600000, &x))
		return -EINVAL;
	p->stall_ms = (int)x;
	return 0;
}

static int parse_debug(struct r2cc_params *p, const char *v)
{
	static const char *const names[] = {"NONE", "WARN", "INFO", "TRACE"};
	for (int i = 0; i < 4; i++) {
		if (!strcasecmp(v, names[i])) {
			p->debug = i;
			return 0;
		}
	}
	return -EINVAL;
}

static int parse_debug_file(struct r2cc_params *p, const char *v)
{
	return v[0] ? copy_str(p->debug_file, sizeof(p->debug_file), v) : -EINVAL;
}

static int parse_report(struct r2cc_params *p, const char *v)
{
	return v[0] ? copy_str(p->report, sizeof(p->report), v) : -EINVAL;
}

static int parse_oob_root(struct r2cc_params *p, const char *v)
{
	const char *colon = strrchr(v, ':');
	long port;
	if (!colon || colon == v || parse_int(colon + 1, 1, 65535, &port))
		return -EINVAL;
	return copy_str(p->oob_root, sizeof(p->oob_root), v);
}

static int parse_stats(struct r2cc_params *p, const char *v)
{
	long x;
	if (parse_int(v, 0, 1, &x))
		return -EINVAL;
	p->stats = x == 1;
	return 0;
}

/* After R2CC_MODE in the table: "auto" follows it (hot repair needs mirrors). */
static int parse_failback(struct r2cc_params *p, const char *v)
{
	long x;
	if (parse_int(v, 0, 3600000, &x))
		return -EINVAL;
	p->failback_ms = (int)x;
	return 0;
}

/* A shell command line: printable, not blank (unset the variable for none). */
static int parse_on_incident(struct r2cc_params *p, const char *v)
{
	const char *c = v;
	while (*c == ' ' || *c == '\t')
		c++;
	if (!*c)
		return -EINVAL;
	return copy_str(p->on_incident, sizeof(p->on_incident), v);
}

static int parse_on_incident_max(struct r2cc_params *p, const char *v)
{
	long x;
	if (parse_int(v, 1, 600, &x))
		return -EINVAL;
	p->on_incident_max = (int)x;
	return 0;
}

static int parse_on_incident_timeout(struct r2cc_params *p, const char *v)
{
	long x;
	if (parse_int(v, 100, 600000, &x))
		return -EINVAL;
	p->on_incident_timeout_ms = (int)x;
	return 0;
}

static int parse_mr_mirror(struct r2cc_params *p, const char *v)
{
	long x;
	if (!strcmp(v, "auto")) {
		p->mr_mirror = p->mode != 0;
		return 0;
	}
	if (parse_int(v, 0, 1, &x))
		return -EINVAL;
	p->mr_mirror = x == 1;
	return 0;
}

/* Names not given keep the built-in model's values. */
static int parse_cost_model(struct r2cc_params *p, const char *v)
{
	struct r2cc_cost_model m = r2cc_cost_default;
	if (r2cc_cost_model_parse(v, &m, NULL, 0))
		return -EINVAL;
	p->cost_model = m;
	return 0;
}

static const struct param_def params[] = {
    {"R2CC_MODE", "2", "0, 1, 2, 3 or auto",
     "0 plain NCCL (pure pass-through); 1 live migration to one backup NIC; 2 R2CC-Balance; "
     "3 Balance + R2CC-AllReduce; auto: per call from the cost model",
     parse_mode},
    {"R2CC_FAILED_NODE", "", "a node index (0 = node of rank 0) or host name, or a list of them",
     "declared failure: the node whose NICs in R2CC_FAILED_HCA are treated as failed",
     parse_failed_node},
    {"R2CC_FAILED_HCA", "", "HCA names or indices (see R2CC_FAILED_NODE)",
     "declared failure: the NICs treated as failed from the start", parse_failed_hca},
    {"R2CC_DRILL", "", "NODE/NIC=KIND@TIME[;...] (see docs/drills.md)",
     "fault drill: NIC faults the library itself makes inside this job (down, blackhole, "
     "blackhole-tx, blackhole-rx, ackloss, flap:MS, up), each at a time from the first "
     "collective (or from init with :init); unset: none",
     parse_drill},
    {"R2CC_AR_AFTER_REPAIR", "", "2 (Balance) or 3 (R2CC-AllReduce)",
     "strategy after a detected repair; unset: follow R2CC_MODE", parse_after_repair},
    {"R2CC_AR_STAGE2_CHUNKS", "4", "an integer from 1 to 64",
     "R2CC-AllReduce: chunks of the stage-2 Reduce/Broadcast pipeline", parse_chunks},
    {"R2CC_AR_SCHEDULE", "0", "0, 1, 2 or 3",
     "R2CC-AllReduce: 0 all concurrent (stage 2's Broadcasts on a communicator of their "
     "own); 1 stage 2 after the main AllReduce; 2 the partial AllReduce also after it; 3 "
     "additionally serialise each Reduce/Broadcast pair",
     parse_schedule},
    {"R2CC_AR_MIN_BYTES", "16M", "a byte count with an optional K, M, G or T suffix",
     "R2CC-AllReduce: smaller messages use Balance", parse_min_bytes},
    {"R2CC_STALL_MS", "auto", "auto or an integer from 1 to 600000 (milliseconds)",
     "hot repair: the longest pause of a healthy port that causes no repair (auto: 20 ms); "
     "a NIC whose self-test goes unanswered this long x 6/5 while it completes nothing is "
     "failed",
     parse_stall},
    {"R2CC_FAILBACK_MS", "10000", "an integer from 0 to 3600000 (milliseconds)",
     "hot repair: a failed NIC whose port is active again and whose self-tests pass for this "
     "long gets its queue pairs back (a NIC that fails again soon after is held down for "
     "twice as long each time; 0: no failback)",
     parse_failback},
    {"R2CC_ON_INCIDENT", "",
     "a shell command line (one line of printable characters, at most 1023)",
     "run at the end of each incident (a NIC's repair or failback, a drill's too) with the "
     "incident's JSON on standard input and R2CC_INCIDENT_* variables; off the repair path, "
     "bounded by R2CC_ON_INCIDENT_MAX and R2CC_ON_INCIDENT_TIMEOUT_MS (docs/operations.md)",
     parse_on_incident},
    {"R2CC_ON_INCIDENT_MAX", "10", "an integer from 1 to 600",
     "R2CC_ON_INCIDENT: at most this many runs per minute per process (the others are "
     "counted in one log line)",
     parse_on_incident_max},
    {"R2CC_ON_INCIDENT_TIMEOUT_MS", "10000", "an integer from 100 to 600000 (milliseconds)",
     "R2CC_ON_INCIDENT: a run still going after this long is killed (one log line)",
     parse_on_incident_timeout},
    {"R2CC_DEBUG", "WARN", "NONE, WARN, INFO or TRACE", "log level", parse_debug},
    {"R2CC_DEBUG_FILE", "", "a file path (%h host, %p pid)", "log destination (default stderr)",
     parse_debug_file},
    {"R2CC_REPORT", "", "a file path (%h host, %p pid)",
     "summary report at exit (text, and JSON in PATH.json)", parse_report},
    {"R2CC_OOB_ROOT", "", "host:port",
     "control-plane rendezvous address (default: carried in the NCCL unique id)", parse_oob_root},
    {"R2CC_STATS", "1", "0 or 1",
     "publish live per-NIC statistics in /dev/shm for `r2cc top` (0: off)", parse_stats},
    {"R2CC_MR_MIRROR", "auto", "auto, 0 or 1",
     "hot repair: register a mirror of every memory region on every other NIC, so that queue "
     "pairs can migrate (more MR registrations; auto: on unless R2CC_MODE=0; 0: off, and "
     "queue pairs then cannot migrate)",
     parse_mr_mirror},
    {"R2CC_COST_MODEL", "",
     "NAME=VALUE[,NAME=VALUE...] with NAME one of alpha_us, beta_us_per_byte, "
     "ar2_beta_us_per_byte, ar2_stage_us, ar2_chunk_us and VALUE a number >= 0",
     "R2CC_MODE=auto: the cost model's constants, as r2cc-fit-cost prints them from your "
     "cluster's measurements (unset: the built-in model, per-byte costs from the NICs' link "
     "rate and fitted latencies; names left out keep its values; a per-byte constant of 0 "
     "is the link rate's)",
     parse_cost_model},
};

#define NPARAMS (sizeof(params) / sizeof(params[0]))

const char *r2cc_param_name(int i)
{
	return i >= 0 && (size_t)i < NPARAMS ? params[i].name : NULL;
}

const char *r2cc_param_help(int i)
{
	return i >= 0 && (size_t)i < NPARAMS ? params[i].help : NULL;
}

const char *r2cc_param_default(int i)
{
	return i >= 0 && (size_t)i < NPARAMS ? params[i].def : NULL;
}

void r2cc_params_defaults(struct r2cc_params *p)
{
	memset(p, 0, sizeof(*p));
	p->cost_model = r2cc_cost_default;
	for (size_t i = 0; i < NPARAMS; i++)
		if (params[i].def[0])
			params[i].parse(p, params[i].def);
	p->valid = true;
}

int r2cc_param_set(struct r2cc_params *p, const char *name, const char *value, char *err,
		   size_t errlen)
{
	for (size_t i = 0; i < NPARAMS; i++) {
		if (strcmp(params[i].name, name))
			continue;
		if (params[i].parse(p, value) == 0)
			return 0;
		snprintf(err, errlen, "%s='%.64s' is not valid: it accepts %s", name, value,
			 params[i].accepts);
		return -EINVAL;
	}
	snprintf(err, errlen, "%s is not an R2CC setting", name);
	return -EINVAL;
}

int r2cc_params_load(void)
{
	static int loaded;
	static int result;
	if (__atomic_load_n(&loaded, __ATOMIC_ACQUIRE))
		return result;
	struct r2cc_params p;
	r2cc_params_defaults(&p);
	int rc = 0;
	char errs[NPARAMS][320];
	size_t nerr = 0;
	for (size_t i = 0; i < NPARAMS; i++) {
		const char *v = getenv(params[i].name);
		if (!v)
			continue;
		if (r2cc_param_set(&p, params[i].name, v, errs[nerr], sizeof(errs[nerr])))
			nerr++;
	}
	if (!nerr) {
		static struct r2cc_failspec spec;
		if (r2cc_failspec_parse(p.failed_node, p.failed_hca, &spec, errs[0],
					sizeof(errs[0])))
			nerr = 1;
		static struct r2cc_drill_plan plan;
		if (!nerr && r2cc_drill_parse(p.drill, &plan, errs[0], sizeof(errs[0])))
			nerr = 1;
	}
	if (nerr) {
		p.valid = false;
		rc = -EINVAL;
	}
	r2cc_param = p;
	r2cc_log_init();
	/* Errors are printed even with R2CC_DEBUG=NONE: they change behaviour. */
	for (size_t i = 0; i < nerr; i++)
		r2cc_log_write(R2CC_LOG_WARN, -1, "error: %s; R2CC runs as plain NCCL", errs[i]);
	result = rc;
	__atomic_store_n(&loaded, 1, __ATOMIC_RELEASE);
	return rc;
}

void r2cc_params_log_nondefault(const struct r2cc_params *p)
{
	(void)p;
	for (size_t i = 0; i < NPARAMS; i++) {
		const char *v = getenv(params[i].name);
		if (v && strcmp(v, params[i].def))
			R2CC_INFO("setting %s=%s (default %s)", params[i].name, v,
				  params[i].def[0] ? params[i].def : "unset");
	}
}
