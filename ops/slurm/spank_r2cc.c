/*
 * spank_r2cc.so: `srun --r2cc[=SETTINGS]` preloads libr2cc.so into the job step's
 * tasks and gives them R2CC's settings (ops/slurm/README.md). A step without --r2cc
 * is never touched.
 *
 * Where each part runs:
 *  - slurm_spank_init (srun, sbatch/salloc, slurmstepd): reads plugstack.conf's
 *    arguments (library=PATH, defaults=SETTINGS) and registers --r2cc.
 *  - the option's callback, in srun (and sbatch/salloc): judges defaults, the
 *    submitting environment's R2CC_* and the option together with the library's own
 *    parser. A bad setting is one error naming the variable and srun stops before
 *    anything is allocated: the user asked for R2CC, so a typo is not left to turn
 *    into an unprotected run. In slurmstepd it only records the option.
 *  - slurm_spank_user_init (slurmstepd, once per step): the same judgement over the
 *    job's environment as it reached the node, and the library must be readable
 *    there. A batch script's (or salloc's interactive) step is left alone: its sruns
 *    inherit --r2cc through the environment and their steps get R2CC. On an error nothing is set;
 * the step then fails if plugstack.conf says `required`, or runs without R2CC if `optional`, with
 * the error in its output.
 *  - slurm_spank_task_init (each task): sets the settings and LD_PRELOAD.
 *
 * Precedence: --r2cc over the job's own R2CC_* variables over defaults=.
 */
#include "ops/slurm/settings.h"
#include "shim/params.h"

#include <errno.h>
#include <limits.h>
#include <slurm/slurm.h>
#include <slurm/spank.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef R2CC_SPANK_LIBRARY
#define R2CC_SPANK_LIBRARY "/usr/local/lib/r2cc/libr2cc.so"
#endif

SPANK_PLUGIN(r2cc, 1)

#define OPT_R2CC    1
#define PRELOAD_MAX 8192
#define VALUE_MAX   4096

static struct {
	char library[PATH_MAX];
	char *defaults;	    /* defaults=, as written */
	char *config_error; /* a bad plugstack.conf line: --r2cc is refused */
	bool requested;	    /* --r2cc given */
	char *option;	    /* its SETTINGS ("" when none) */
	bool ready;	    /* user_init judged the step's settings good */
	bool failed;	    /* or found them bad: each task fails (if required) */
	struct r2cc_spank_settings settings;
} r2cc_spank;

static int r2cc_spank_opt_cb(int val, const char *optarg, int remote);

static struct spank_option r2cc_spank_opt = {
    .name = "r2cc",
    .arginfo = "SETTINGS",
    .usage = "Run the step's tasks under R2CC: libr2cc.so preloaded, with the optional "
	     "SETTINGS, NAME=VALUE[,NAME=VALUE...] of R2CC_* variables (R2CC_ left out or "
	     "not), e.g. --r2cc=mode=2,report=/tmp/r2cc.%h.%p",
    .has_arg = 2,
    .val = OPT_R2CC,
    .cb = r2cc_spank_opt_cb,
};

static int r2cc_spank_config(int ac, char **av)
{
	char err[512];

	snprintf(r2cc_spank.library, sizeof(r2cc_spank.library), "%s", R2CC_SPANK_LIBRARY);
	for (int i = 0; i < ac; i++) {
		if (strncmp(av[i], "library=", 8) == 0) {
			const char *path = av[i] + 8;
			if (path[0] != '/' || strlen(path) >= sizeof(r2cc_spank.library)) {
				snprintf(err, sizeof(err),
					 "library='%.200s' is not an absolute path", path);
				goto bad;
			}
			snprintf(r2cc_spank.library, sizeof(r2cc_spank.library), "%s", path);
		} else if (strncmp(av[i], "defaults=", 9) == 0) {
			struct r2cc_spank_settings probe = {0};
			char why[400];
			int rc = r2cc_spank_settings_parse(&probe, av[i] + 9, R2CC_SPANK_DEFAULT,
							   why, sizeof(why));
			if (!rc)
				rc = r2cc_spank_settings_check(&probe, why, sizeof(why));
			r2cc_spank_settings_free(&probe);
			if (rc) {
				snprintf(err, sizeof(err), "defaults=: %s", why);
				goto bad;
			}
			free(r2cc_spank.defaults);
			r2cc_spank.defaults = strdup(av[i] + 9);
		} else {
			snprintf(err, sizeof(err),
				 "unknown argument '%.200s' (it takes library=PATH and "
				 "defaults=SETTINGS)",
				 av[i]);
			goto bad;
		}
	}
	return 0;
bad:
	free(r2cc_spank.config_error);
	r2cc_spank.config_error = strdup(err);
	return -1;
}

/* Where the variables of the job come from: srun's own environment in srun (what
 * --export=ALL hands the tasks), the step's environment in slurmstepd. */
typedef const char *(*env_get_fn)(void *ctx, const char *name, char *buf, size_t len);

static const char *env_local(void *ctx, const char *name, char *buf, size_t len)
{
	(void)ctx, (void)buf, (void)len;
	return getenv(name);
}

static const char *env_step(void *ctx, const char *name, char *buf, size_t len)
{
	return spank_getenv((spank_t)ctx, name, buf, (int)len) == ESPANK_SUCCESS ? buf : NULL;
}

/* Gathers defaults, the job's variables and --r2cc into r2cc_spank.settings and
 * judges them. 0, or -1 with one line in err. */
static int r2cc_spank_gather(env_get_fn get, void *ctx, char *err, size_t errlen)
{
	struct r2cc_spank_settings *s = &r2cc_spank.settings;
	char why[640], buf[VALUE_MAX];
	int rc;

	if (r2cc_spank.config_error) {
		snprintf(err, errlen, "plugstack.conf: %s", r2cc_spank.config_error);
		return -1;
	}
	r2cc_spank_settings_free(s);
	rc =
	    r2cc_spank_settings_parse(s, r2cc_spank.defaults, R2CC_SPANK_DEFAULT, why, sizeof(why));
	for (int i = 0; !rc && i < R2CC_SPANK_MAX_PARAMS && r2cc_param_name(i); i++) {
		const char *v = get(ctx, r2cc_param_name(i), buf, sizeof(buf));
		if (v)
			rc = r2cc_spank_settings_put(s, i, v, R2CC_SPANK_ENV);
	}
	if (!rc)
		rc = r2cc_spank_settings_parse(s, r2cc_spank.option, R2CC_SPANK_OPTION, why,
					       sizeof(why));
	if (rc) {
		snprintf(err, errlen, "--r2cc: %s", why);
		return -1;
	}
	return r2cc_spank_settings_check(s, err, errlen) ? -1 : 0;
}

static int r2cc_spank_opt_cb(int val, const char *optarg, int remote)
{
	char err[768];

	(void)val;
	free(r2cc_spank.option);
	r2cc_spank.option = strdup(optarg ? optarg : "");
	if (!r2cc_spank.option)
		return -1;
	r2cc_spank.requested = true;
	if (remote)
		return 0;
	if (r2cc_spank_gather(env_local, NULL, err, sizeof(err))) {
		slurm_error("r2cc: %s", err);
		return -1;
	}
	return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	if (spank_option_register(sp, &r2cc_spank_opt) != ESPANK_SUCCESS) {
		slurm_error("r2cc: cannot register --r2cc");
		return -1;
	}
	if (r2cc_spank_config(ac, av)) {
		/* Only the steps that ask for R2CC hear of it (the option refuses). */
		slurm_debug("r2cc: plugstack.conf: %s", r2cc_spank.config_error);
	}
	return 0;
}

/* Judged once per step and node; a failure is said here, once, and acted on by each
 * task (task_init), whose failure Slurm turns into the task's exit status. */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	char err[768];
	uint32_t step;

	(void)ac, (void)av;
	if (!r2cc_spank.requested || !spank_remote(sp))
		return 0;
	/* sbatch --r2cc, salloc --r2cc: the job's shell runs plain; the option rides in
	 * its environment (SLURM_SPANK_*) to every srun of it, whose steps get R2CC. */
	if (spank_get_item(sp, S_JOB_STEPID, &step) == ESPANK_SUCCESS &&
	    (step == SLURM_BATCH_SCRIPT || step == SLURM_INTERACTIVE_STEP))
		return 0;
	if (r2cc_spank_gather(env_step, sp, err, sizeof(err)) == 0) {
		if (access(r2cc_spank.library, R_OK) == 0) {
			r2cc_spank.ready = true;
			return 0;
		}
		snprintf(err, sizeof(err), "%.600s: %s (plugstack.conf's library=)",
			 r2cc_spank.library, strerror(errno));
	}
	r2cc_spank.failed = true;
	slurm_error("r2cc: %s; the tasks get no R2CC (no preload, no settings)", err);
	return 0;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	struct r2cc_spank_settings *s = &r2cc_spank.settings;
	char old[PRELOAD_MAX], preload[PRELOAD_MAX];

	(void)ac, (void)av;
	if (r2cc_spank.failed)
		return -1;
	if (!r2cc_spank.ready)
		return 0;
	for (int i = 0; i < R2CC_SPANK_MAX_PARAMS && r2cc_param_name(i); i++) {
		/* The job's own values are already in its environment. */
		if (s->src[i] != R2CC_SPANK_DEFAULT && s->src[i] != R2CC_SPANK_OPTION)
			continue;
		if (spank_setenv(sp, r2cc_param_name(i), s->value[i], 1) != ESPANK_SUCCESS) {
			slurm_error("r2cc: cannot set %s in the task's environment",
				    r2cc_param_name(i));
			return -1;
		}
	}
	if (spank_getenv(sp, "LD_PRELOAD", old, sizeof(old)) != ESPANK_SUCCESS)
		old[0] = '\0';
	if (r2cc_spank_preload(old, r2cc_spank.library, preload, sizeof(preload)) ||
	    spank_setenv(sp, "LD_PRELOAD", preload, 1) != ESPANK_SUCCESS) {
		slurm_error("r2cc: cannot set LD_PRELOAD in the task's environment");
		return -1;
	}
	return 0;
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	(void)sp, (void)ac, (void)av;
	r2cc_spank_settings_free(&r2cc_spank.settings);
	free(r2cc_spank.option);
	free(r2cc_spank.defaults);
	free(r2cc_spank.config_error);
	memset(&r2cc_spank, 0, sizeof(r2cc_spank));
	return 0;
}
