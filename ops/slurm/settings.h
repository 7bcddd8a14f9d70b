/*
 * The settings of `srun --r2cc=SETTINGS` and of plugstack.conf's `defaults=`:
 *
 *   SETTINGS := SETTING[,SETTING...]
 *   SETTING  := NAME=VALUE | NAME="VALUE"
 *   NAME     := an R2CC_* variable of the library's table, with or without its
 *               R2CC_ prefix, in any case (mode, R2CC_MODE)
 *
 * A comma begins the next setting where a word of letters, digits and '_' and then
 * '=' follows it; other commas are part of the value (failed_hca=mlx5_1,mlx5_2). A
 * value that holds ",WORD=" itself (cost_model's list, a command line) goes in double
 * quotes. Nothing here knows Slurm: the SPANK plugin (spank_r2cc.c) merges the three
 * sources and the library's own parser (shim/params.c, failspec.c, drillspec.c) judges
 * the result, as it will in the job.
 */
#ifndef R2CC_OPS_SLURM_SETTINGS_H
#define R2CC_OPS_SLURM_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>

#define R2CC_SPANK_MAX_PARAMS 64

/* Where a value came from, lowest precedence first. */
enum r2cc_spank_src {
	R2CC_SPANK_UNSET = 0,
	R2CC_SPANK_DEFAULT, /* plugstack.conf's defaults= */
	R2CC_SPANK_ENV,	    /* the job's own environment */
	R2CC_SPANK_OPTION,  /* --r2cc=SETTINGS */
};

struct r2cc_spank_settings {
	char *value[R2CC_SPANK_MAX_PARAMS]; /* by the library's table index */
	enum r2cc_spank_src src[R2CC_SPANK_MAX_PARAMS];
};

/* Looks up the table entry of NAME (len bytes: "mode", "R2CC_MODE"); -1 if none. */
int r2cc_spank_param_index(const char *name, size_t len);

/* Parses text as coming from src into *s; a later value of the same name replaces
 * an earlier one of lower or equal precedence. 0, or -EINVAL/-ENOMEM with one
 * line in err naming what is wrong (s may then hold part of text). */
int r2cc_spank_settings_parse(struct r2cc_spank_settings *s, const char *text,
			      enum r2cc_spank_src src, char *err, size_t errlen);

/* Sets entry i from src unless it holds a value of higher precedence. 0 or -ENOMEM. */
int r2cc_spank_settings_put(struct r2cc_spank_settings *s, int i, const char *value,
			    enum r2cc_spank_src src);

/* Judges every value with the library's parser, then the declared failure and the
 * drill plan together. 0, or -EINVAL with the library's message in err followed by
 * where the value came from. */
int r2cc_spank_settings_check(const struct r2cc_spank_settings *s, char *err, size_t errlen);

void r2cc_spank_settings_free(struct r2cc_spank_settings *s);

/* "--r2cc", "the job's environment", ... */
const char *r2cc_spank_src_name(enum r2cc_spank_src src);

/* LD_PRELOAD with lib first: old unchanged when it already lists lib (separated by
 * ':' or spaces, as ld.so reads it), else "lib:old" (or lib alone). 0 or -ENOSPC. */
int r2cc_spank_preload(const char *old, const char *lib, char *out, size_t len);

#endif
