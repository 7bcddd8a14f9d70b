/*
 * R2CC_DRILL's parser (drillspec.h). Works on a copy of the value in a fixed
 * buffer; every message names the variable and what it accepts.
 */
#include "shim/drillspec.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define VAR "R2CC_DRILL"
#define ACCEPTS                                                                                    \
	"NODE/NIC=KIND@TIME[;...] with KIND down, blackhole, blackhole-tx, blackhole-rx, "         \
	"ackloss, flap:MS or up and TIME such as 5000, 5000ms or 5s, optionally :init"

static const char *const kind_names[R2CC_DRILL_KINDS] = {
    [R2CC_DRILL_UP] = "up",
    [R2CC_DRILL_DOWN] = "down",
    [R2CC_DRILL_BLACKHOLE] = "blackhole",
    [R2CC_DRILL_BLACKHOLE_TX] = "blackhole-tx",
    [R2CC_DRILL_BLACKHOLE_RX] = "blackhole-rx",
    [R2CC_DRILL_ACKLOSS] = "ackloss",
    [R2CC_DRILL_FLAP] = "flap",
};

const char *r2cc_drill_kind_name(int kind)
{
	return kind >= 0 && kind < R2CC_DRILL_KINDS ? kind_names[kind] : "?";
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int
fail(char *err, size_t errlen, const char *fmt, ...)
{
	if (err && errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

static char *trim(char *s)
{
	while (isspace((unsigned char)*s))
		s++;
	size_t n = strlen(s);
	while (n && isspace((unsigned char)s[n - 1]))
		s[--n] = '\0';
	return s;
}

static bool name_char(char c)
{
	return isalnum((unsigned char)c) || c == '.' || c == '_' || c == '-';
}

static bool all_digits(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (!isdigit((unsigned char)*s))
			return false;
	return true;
}

/* A name of [A-Za-z0-9._-], starting with a letter, digit or '_'. */
static int check_name(const char *tok, const char *what, int k, char *err, size_t errlen)
{
	if (!*tok)
		return fail(err, errlen, VAR ": step %d: empty %s; accepts " ACCEPTS, k, what);
	if (!isalnum((unsigned char)*tok) && *tok != '_')
		return fail(err, errlen,
			    VAR ": step %d: %s \"%.32s\" must start with a letter or digit", k,
			    what, tok);
	for (const char *p = tok; *p; p++)
		if (!name_char(*p))
			return fail(err, errlen,
				    VAR ": step %d: bad character '%c' in %s \"%.32s\"", k, *p,
				    what, tok);
	if (strlen(tok) >= R2CC_DRILL_NAME_MAX)
		return fail(err, errlen, VAR ": step %d: %s \"%.16s...\" longer than %d characters",
			    k, what, tok, R2CC_DRILL_NAME_MAX - 1);
	return 0;
}

static int parse_node(char *tok, struct r2cc_drill_step *s, int k, char *err, size_t errlen)
{
	int rc = check_name(tok, "node", k, err, errlen);
	if (rc)
		return rc;
	const char *num = all_digits(tok)				    ? tok
			  : !strncmp(tok, "node", 4) && all_digits(tok + 4) ? tok + 4
									    : NULL;
	if (!num) {
		s->node = -1;
		strcpy(s->host, tok);
		return 0;
	}
	long v = 0;
	for (const char *p = num; *p; p++) {
		v = v * 10 + (*p - '0');
		if (v > R2CC_DRILL_MAX_NODE)
			return fail(err, errlen, VAR ": step %d: node index %s out of range 0..%d",
				    k, num, R2CC_DRILL_MAX_NODE);
	}
	s->node = (int)v;
	return 0;
}

/* A non-negative decimal with up to `decimals` digits after a '.', times `scale`
 * (10^decimals); -1 when malformed or above max. */
static long long parse_fixed(const char *p, const char **end, int decimals, long long max)
{
	long long v = 0;
	int n = 0, frac = -1;
	for (; *p; p++) {
		if (*p == '.' && frac < 0 && decimals > 0) {
			frac = 0;
			continue;
		}
		if (!isdigit((unsigned char)*p))
			break;
		if (frac >= 0 && ++frac > decimals)
			return -1;
		v = v * 10 + (*p - '0');
		n++;
		if (v > max * 1000)
			return -1;
	}
	if (!n || frac == 0)
		return -1;
	for (int f = frac < 0 ? 0 : frac; f < decimals; f++)
		v *= 10;
	*end = p;
	return v;
}

static int parse_time(char *tok, struct r2cc_drill_step *s, int k, char *err, size_t errlen)
{
	tok = trim(tok);
	char *colon = strchr(tok, ':');
	s->from_init = 0;
	if (colon) {
		*colon = '\0';
		if (strcmp(trim(colon + 1), "init"))
			return fail(
			    err, errlen,
			    VAR ": step %d: time suffix \":%.16s\" unknown; accepts :init (from "
				"the communicator's init; none: from the first collective)",
			    k, colon + 1);
		s->from_init = 1;
		tok = trim(tok);
	}
	const char *end = NULL;
	long long v = parse_fixed(tok, &end, 3, R2CC_DRILL_MAX_MS);
	if (v < 0)
		goto bad;
	if (strcmp(end, "s")) { /* "s": thousandths of a second are milliseconds */
		if (strcmp(end, "ms") && *end)
			goto bad;
		if (v % 1000)
			goto bad; /* fractions of a millisecond */
		v /= 1000;
	}
	if (v > R2CC_DRILL_MAX_MS)
		goto bad;
	s->at_ms = v;
	return 0;
bad:
	return fail(err, errlen,
		    VAR
		    ": step %d: time \"%.24s\" is not valid; accepts milliseconds (5000 or 5000ms) "
		    "or seconds with up to 3 decimals (5s, 1.5s), at most 24 h, optionally "
		    "followed by :init",
		    k, tok);
}

static int parse_kind(char *tok, struct r2cc_drill_step *s, int k, char *err, size_t errlen)
{
	tok = trim(tok);
	char *arg = strchr(tok, ':');
	if (arg)
		*arg++ = '\0';
	for (int i = 0; i < R2CC_DRILL_KINDS; i++) {
		if (strcmp(tok, kind_names[i]))
			continue;
		s->kind = i;
		if (i != R2CC_DRILL_FLAP) {
			if (arg)
				return fail(err, errlen, VAR ": step %d: %s takes no argument", k,
					    tok);
			return 0;
		}
		const char *end = NULL;
		long long v = arg ? parse_fixed(trim(arg), &end, 0, R2CC_DRILL_MAX_FLAP) : -1;
		if (v < 1 || v > R2CC_DRILL_MAX_FLAP || *end)
			return fail(err, errlen,
				    VAR
				    ": step %d: flap needs its half period, flap:MS with MS from 1 "
				    "to %d",
				    k, R2CC_DRILL_MAX_FLAP);
		s->arg_ms = (int)v;
		return 0;
	}
	return fail(err, errlen,
		    VAR ": step %d: unknown kind \"%.24s\"; accepts down, blackhole, blackhole-tx, "
			"blackhole-rx, ackloss, flap:MS or up",
		    k, tok);
}

static int parse_step(char *item, struct r2cc_drill_step *s, int k, char *err, size_t errlen)
{
	memset(s, 0, sizeof(*s));
	s->index = k;
	char *slash = strchr(item, '/'), *eq = strchr(item, '='), *at = strrchr(item, '@');
	if (!slash || !eq || !at || !(slash < eq && eq < at))
		return fail(err, errlen,
			    VAR ": step %d \"%.48s\" is not NODE/NIC=KIND@TIME; accepts " ACCEPTS,
			    k, item);
	*slash = *eq = *at = '\0';
	int rc = parse_node(trim(item), s, k, err, errlen);
	if (!rc) {
		char *nic = trim(slash + 1);
		rc = check_name(nic, "NIC", k, err, errlen);
		if (!rc)
			strcpy(s->nic, nic);
	}
	if (!rc)
		rc = parse_kind(eq + 1, s, k, err, errlen);
	if (!rc)
		rc = parse_time(at + 1, s, k, err, errlen);
	return rc;
}

int r2cc_drill_parse(const char *value, struct r2cc_drill_plan *out, char *err, size_t errlen)
{
	static const size_t cap = R2CC_DRILL_MAX_STEPS * 2 * (R2CC_DRILL_NAME_MAX + 32);
	char buf[R2CC_DRILL_MAX_STEPS * 2 * (R2CC_DRILL_NAME_MAX + 32)];
	out->nsteps = 0;
	if (err && errlen)
		err[0] = '\0';
	if (!value)
		return 0;
	if (strlen(value) >= cap)
		return fail(err, errlen, VAR ": longer than %zu characters", cap - 1);
	strcpy(buf, value);
	char *s = trim(buf);
	if (!*s)
		return 0;
	int k = 0;
	for (char *item = s, *next; item; item = next) {
		next = strchr(item, ';');
		if (next)
			*next++ = '\0';
		item = trim(item);
		k++;
		if (!*item) {
			out->nsteps = 0;
			return fail(err, errlen, VAR ": step %d is empty; accepts " ACCEPTS, k);
		}
		if (out->nsteps == R2CC_DRILL_MAX_STEPS) {
			out->nsteps = 0;
			return fail(err, errlen, VAR ": more than %d steps", R2CC_DRILL_MAX_STEPS);
		}
		int rc = parse_step(item, &out->steps[out->nsteps], k, err, errlen);
		if (rc) {
			out->nsteps = 0;
			return rc;
		}
		out->nsteps++;
	}
	return 0;
}

void r2cc_drill_step_str(const struct r2cc_drill_step *s, char *buf, size_t len)
{
	char node[R2CC_DRILL_NAME_MAX + 8], kind[32];
	if (s->node >= 0)
		snprintf(node, sizeof(node), "node%d", s->node);
	else
		snprintf(node, sizeof(node), "%s", s->host);
	if (s->kind == R2CC_DRILL_FLAP)
		snprintf(kind, sizeof(kind), "flap:%d", s->arg_ms);
	else
		snprintf(kind, sizeof(kind), "%s", r2cc_drill_kind_name(s->kind));
	snprintf(buf, len, "%s/%s=%s@%lldms%s", node, s->nic, kind, (long long)s->at_ms,
		 s->from_init ? ":init" : "");
}
