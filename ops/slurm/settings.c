/*
 * --r2cc's settings (settings.h): the splitting of NAME=VALUE lists, the precedence
 * of their sources, the check by the library's own parser, and LD_PRELOAD's new
 * value. Pure: no Slurm, no environment, so the unit test runs it without a cluster.
 */
#include "ops/slurm/settings.h"
#include "shim/drillspec.h"
#include "shim/failspec.h"
#include "shim/params.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int r2cc_spank_param_index(const char *name, size_t len)
{
	if (len > 5 && strncasecmp(name, "R2CC_", 5) == 0) {
		name += 5;
		len -= 5;
	}
	for (int i = 0; i < R2CC_SPANK_MAX_PARAMS; i++) {
		const char *full = r2cc_param_name(i);
		if (!full)
			break;
		if (strlen(full + 5) == len && strncasecmp(full + 5, name, len) == 0)
			return i;
	}
	return -1;
}

/* Whether a new setting begins at s: a word of letters, digits and '_', then '='. */
static bool setting_starts(const char *s)
{
	size_t n = strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_");
	return n > 0 && s[n] == '=';
}

int r2cc_spank_settings_put(struct r2cc_spank_settings *s, int i, const char *value,
			    enum r2cc_spank_src src)
{
	if (s->src[i] > src)
		return 0;
	char *copy = strdup(value);
	if (!copy)
		return -ENOMEM;
	free(s->value[i]);
	s->value[i] = copy;
	s->src[i] = src;
	return 0;
}

int r2cc_spank_settings_parse(struct r2cc_spank_settings *s, const char *text,
			      enum r2cc_spank_src src, char *err, size_t errlen)
{
	const char *p = text ? text : "";

	while (*p) {
		const char *eq = strchr(p, '=');
		const char *comma = strchr(p, ',');
		if (!eq || (comma && comma < eq)) {
			size_t n = comma ? (size_t)(comma - p) : strlen(p);
			snprintf(err, errlen, "'%.*s' is not NAME=VALUE (e.g. mode=2)",
				 (int)(n > 64 ? 64 : n), p);
			return -EINVAL;
		}
		int i = r2cc_spank_param_index(p, (size_t)(eq - p));
		if (i < 0) {
			snprintf(err, errlen,
				 "'%.*s' is not an R2CC setting (a name of the library's table, "
				 "with or without R2CC_: mode, drill, report, ...)",
				 (int)(eq - p > 64 ? 64 : eq - p), p);
			return -EINVAL;
		}
		/* A quoted value runs to its closing quote, any other to the first
		 * comma that begins another setting. */
		const char *v = eq + 1, *end = v;
		size_t vlen;
		if (*v == '"') {
			end = strchr(++v, '"');
			if (!end || (end[1] && end[1] != ',')) {
				snprintf(err, errlen,
					 "the value of %s opens a '\"' that must close it, right "
					 "before a ',' or the end",
					 r2cc_param_name(i));
				return -EINVAL;
			}
			vlen = (size_t)(end++ - v);
		} else {
			for (;; end++) {
				end += strcspn(end, ",");
				if (!*end || setting_starts(end + 1))
					break;
			}
			vlen = (size_t)(end - v);
		}
		char *value = strndup(v, vlen);
		if (!value) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
		int rc = r2cc_spank_settings_put(s, i, value, src);
		free(value);
		if (rc) {
			snprintf(err, errlen, "out of memory");
			return rc;
		}
		p = *end ? end + 1 : end;
	}
	return 0;
}

const char *r2cc_spank_src_name(enum r2cc_spank_src src)
{
	switch (src) {
	case R2CC_SPANK_DEFAULT:
		return "plugstack.conf's defaults=";
	case R2CC_SPANK_ENV:
		return "the job's environment";
	case R2CC_SPANK_OPTION:
		return "--r2cc";
	default:
		return "nowhere";
	}
}

/* err += " (NAME from SRC, ...)" for the entries named. */
static void append_sources(const struct r2cc_spank_settings *s, const char *const *names, char *err,
			   size_t errlen)
{
	size_t used = strlen(err);
	const char *sep = " (";

	for (; *names; names++) {
		int i = r2cc_spank_param_index(*names, strlen(*names));
		if (i < 0 || !s->src[i] || used >= errlen)
			continue;
		used += (size_t)snprintf(err + used, errlen - used, "%s%s from %s", sep, *names,
					 r2cc_spank_src_name(s->src[i]));
		sep = ", ";
	}
	if (*sep == ',' && used < errlen)
		snprintf(err + used, errlen - used, ")");
}

int r2cc_spank_settings_check(const struct r2cc_spank_settings *s, char *err, size_t errlen)
{
	/* The library's structures are large (the plan, the declared failure): heap. */
	struct r2cc_params *p = calloc(1, sizeof(*p));
	struct r2cc_failspec *spec = calloc(1, sizeof(*spec));
	struct r2cc_drill_plan *plan = calloc(1, sizeof(*plan));
	int rc = -ENOMEM;

	if (!p || !spec || !plan) {
		snprintf(err, errlen, "out of memory");
		goto out_free;
	}
	r2cc_params_defaults(p);
	rc = -EINVAL;
	for (int i = 0; i < R2CC_SPANK_MAX_PARAMS && r2cc_param_name(i); i++) {
		if (!s->src[i])
			continue;
		if (r2cc_param_set(p, r2cc_param_name(i), s->value[i], err, errlen)) {
			const char *names[] = {r2cc_param_name(i), NULL};
			append_sources(s, names, err, errlen);
			goto out_free;
		}
	}
	if (r2cc_failspec_parse(p->failed_node, p->failed_hca, spec, err, errlen)) {
		const char *names[] = {"R2CC_FAILED_NODE", "R2CC_FAILED_HCA", NULL};
		append_sources(s, names, err, errlen);
		goto out_free;
	}
	if (r2cc_drill_parse(p->drill, plan, err, errlen)) {
		const char *names[] = {"R2CC_DRILL", NULL};
		append_sources(s, names, err, errlen);
		goto out_free;
	}
	rc = 0;
out_free:
	free(plan);
	free(spec);
	free(p);
	return rc;
}

void r2cc_spank_settings_free(struct r2cc_spank_settings *s)
{
	for (int i = 0; i < R2CC_SPANK_MAX_PARAMS; i++) {
		free(s->value[i]);
		s->value[i] = NULL;
		s->src[i] = R2CC_SPANK_UNSET;
	}
}

int r2cc_spank_preload(const char *old, const char *lib, char *out, size_t len)
{
	size_t n = strlen(lib);
	int w;

	for (const char *e = old ? old : ""; *e;) {
		size_t m = strcspn(e, ": ");
		if (m == n && strncmp(e, lib, n) == 0) {
			w = snprintf(out, len, "%s", old);
			return w < 0 || (size_t)w >= len ? -ENOSPC : 0;
		}
		e += m;
		e += strspn(e, ": ");
	}
	if (old && old[strspn(old, ": ")])
		w = snprintf(out, len, "%s:%s", lib, old);
	else
		w = snprintf(out, len, "%s", lib);
	return w < 0 || (size_t)w >= len ? -ENOSPC : 0;
}
