/*
 * `r2cc run [OPTIONS] -- COMMAND [ARGS]`: runs COMMAND under R2CC. It puts
 * libr2cc.so (next to this tool: <dir>/../lib/libr2cc.so, in the build tree
 * and in the installed private tree alike) at the front of LD_PRELOAD, keeping
 * the caller's other preloads, and sets the R2CC_* settings given as options,
 * in COMMAND's environment only. Every setting, given or inherited, goes
 * through the library's own parser (shim/params.c, failspec.c, drillspec.c)
 * first: a bad one is one error line naming the variable, and nothing runs,
 * rather than a job that the library would silently leave unprotected.
 *
 * Without --summary it execs COMMAND, so that a launcher (mpirun, srun,
 * torchrun --no-python) sees COMMAND itself: its pid, its signals, its exit
 * status. With --summary it forks, forwards the signals a launcher sends,
 * waits, prints one line per exit report (R2CC_REPORT's JSON: shim/report.c,
 * repair/incident.c, repair/drill.c) and exits with COMMAND's status, or
 * 128 + the signal that ended it. Its own errors exit 125, a COMMAND that
 * cannot be run 126, one not found 127 (as env and timeout do).
 */
#include "shim/drillspec.h"
#include "shim/failspec.h"
#include "shim/params.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <glob.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int r2cc_run_main(int argc, char **argv);

#define RUN_ERR	     125 /* r2cc run's own error: nothing ran */
#define RUN_NOEXEC   126
#define RUN_NOTFOUND 127
#define RUN_MAX_SET  64

struct run_setting {
	const char *name;
	char *value;
	const char *from; /* the option that gave it, for the error line */
};

struct run_opts {
	struct run_setting set[RUN_MAX_SET];
	int nset;
	const char *lib;
	const char *report;
	bool summary, dry_run;
};

static void run_usage(FILE *f)
{
	fputs("usage: r2cc run [OPTIONS] -- COMMAND [ARGS...]\n"
	      "\n"
	      "Runs COMMAND with libr2cc.so first in LD_PRELOAD (the caller's other preloads\n"
	      "kept) and the R2CC settings below in its environment, nowhere else. Each\n"
	      "setting, given here or inherited, is checked by the library's own parser\n"
	      "first: a bad one is one error naming it, and nothing runs. As the program of\n"
	      "a launcher: mpirun -np 16 r2cc run -- ./app, srun r2cc run -- ./app,\n"
	      "torchrun --no-python ... r2cc run -- python3 train.py.\n"
	      "\n"
	      "  --mode M          R2CC_MODE: 0, 1, 2, 3 or auto\n"
	      "  --drill PLAN      R2CC_DRILL: NODE/NIC=KIND@TIME[;...] (docs/drills.md)\n"
	      "  --report PATH     R2CC_REPORT: each process's exit report (%h host, %p pid)\n"
	      "  --debug LEVEL     R2CC_DEBUG: NONE, WARN, INFO or TRACE\n"
	      "  --set NAME=VALUE  any R2CC_* setting (repeatable; r2cc doctor --help lists them)\n"
	      "  --summary         wait for COMMAND, then print one line per process's exit\n"
	      "                    report on stderr (host, pid, incidents, repairs, drill\n"
	      "                    steps, protected or not); the reports go to a temporary\n"
	      "                    directory unless --report or R2CC_REPORT says where\n"
	      "  --lib PATH        the libr2cc.so to preload (default: ../lib/libr2cc.so\n"
	      "                    from this program)\n"
	      "  --dry-run         print the environment and the command; run nothing\n"
	      "  -h, --help\n"
	      "\n"
	      "Exit status: COMMAND's (128 + N if signal N ended it, with --summary; without,\n"
	      "r2cc run becomes COMMAND); 125 a bad option or setting, 126 COMMAND cannot be\n"
	      "run, 127 COMMAND not found.\n",
	      f);
}

/* ---- settings ---- */

static int run_add(struct run_opts *o, const char *name, const char *value, const char *from)
{
	if (o->nset == RUN_MAX_SET) {
		fprintf(stderr, "r2cc run: more than %d settings\n", RUN_MAX_SET);
		return -E2BIG;
	}
	o->set[o->nset].name = name;
	o->set[o->nset].value = strdup(value);
	o->set[o->nset].from = from;
	if (!o->set[o->nset].value)
		return -ENOMEM;
	o->nset++;
	return 0;
}

/* The last value given for name, or NULL. */
static const struct run_setting *run_given(const struct run_opts *o, const char *name)
{
	for (int i = o->nset - 1; i >= 0; i--)
		if (!strcmp(o->set[i].name, name))
			return &o->set[i];
	return NULL;
}

/*
 * Every R2CC_* setting COMMAND will see, through the library's parser in the
 * library's order, then the declared failure and the drill plan as
 * r2cc_params_load() checks them. Returns the number of bad settings (each
 * one line on stderr).
 */
static int run_check(const struct run_opts *o)
{
	struct r2cc_params p;
	char err[320];
	int nbad = 0;

	for (int i = 0; i < o->nset; i++) {
		bool known = false;
		for (int k = 0; r2cc_param_name(k) && !known; k++)
			known = !strcmp(r2cc_param_name(k), o->set[i].name);
		if (!known) {
			fprintf(stderr,
				"r2cc run: %s is not an R2CC setting (%s); r2cc doctor --help "
				"lists them\n",
				o->set[i].name, o->set[i].from);
			nbad++;
		}
	}
	r2cc_params_defaults(&p);
	for (int k = 0; r2cc_param_name(k); k++) {
		const char *name = r2cc_param_name(k);
		const struct run_setting *s = run_given(o, name);
		const char *v = s ? s->value : getenv(name);
		if (!v || r2cc_param_set(&p, name, v, err, sizeof(err)) == 0)
			continue;
		fprintf(stderr, "r2cc run: %s (%s)\n", err, s ? s->from : "from the environment");
		nbad++;
	}
	if (nbad)
		return nbad;
	struct r2cc_failspec *spec = calloc(1, sizeof(*spec));
	struct r2cc_drill_plan *plan = calloc(1, sizeof(*plan));
	if (!spec || !plan) {
		fprintf(stderr, "r2cc run: out of memory\n");
		nbad++;
	} else if (r2cc_failspec_parse(p.failed_node, p.failed_hca, spec, err, sizeof(err)) ||
		   r2cc_drill_parse(p.drill, plan, err, sizeof(err))) {
		fprintf(stderr, "r2cc run: %s\n", err);
		nbad++;
	}
	free(spec);
	free(plan);
	return nbad;
}

/* ---- the preload ---- */

/* libr2cc.so next to this program: <dir>/r2cc -> <dir>/../lib/libr2cc.so. */
static int run_find_lib(const char *given, char *out, size_t len)
{
	char exe[PATH_MAX], path[PATH_MAX + 32], real[PATH_MAX];

	if (given) {
		snprintf(path, sizeof(path), "%s", given);
	} else {
		ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
		if (n <= 0) {
			fprintf(stderr, "r2cc run: cannot read /proc/self/exe: %s; give --lib\n",
				strerror(errno));
			return -1;
		}
		exe[n] = '\0';
		*strrchr(exe, '/') = '\0';
		snprintf(path, sizeof(path), "%s/../lib/libr2cc.so", exe);
	}
	if (!realpath(path, real) || access(real, R_OK) != 0) {
		fprintf(stderr,
			"r2cc run: no libr2cc.so at %s (%s): build it (make), install bin/ and "
			"lib/ together, or give --lib\n",
			path, strerror(errno));
		return -1;
	}
	if (strlen(real) >= len || strpbrk(real, ": ")) {
		fprintf(stderr, "r2cc run: %s cannot go in LD_PRELOAD (a ':' or ' ' in it)\n",
			real);
		return -1;
	}
	snprintf(out, len, "%s", real);
	return 0;
}

static bool run_is_r2cc(const char *entry)
{
	const char *base = strrchr(entry, '/');
	return !strcmp(base ? base + 1 : entry, "libr2cc.so");
}

/* A sanitizer's runtime must stay first in LD_PRELOAD (it says so and stops otherwise). */
static bool run_is_sanitizer(const char *entry)
{
	static const char *const rt[] = {"libasan", "libtsan",	 "libubsan",
					 "liblsan", "libhwasan", "libclang_rt."};
	const char *base = strrchr(entry, '/');
	base = base ? base + 1 : entry;
	for (size_t i = 0; i < sizeof(rt) / sizeof(rt[0]); i++)
		if (!strncmp(base, rt[i], strlen(rt[i])))
			return true;
	return false;
}

/*
 * The new LD_PRELOAD: the caller's sanitizer runtimes, lib, then the caller's
 * other entries in their order; any other libr2cc.so left out (two copies of
 * the interposer in one process would each wrap the other).
 */
static char *run_preload(const char *lib)
{
	const char *old = getenv("LD_PRELOAD");
	size_t len = strlen(lib) + (old ? strlen(old) : 0) + 4;
	char *out = calloc(1, len), *save = NULL;
	if (!out)
		return NULL;
	for (int pass = 0; pass < 2; pass++) {
		char *work = strdup(old ? old : "");
		if (!work) {
			free(out);
			return NULL;
		}
		for (char *e = strtok_r(work, ": ", &save); e; e = strtok_r(NULL, ": ", &save)) {
			if (run_is_r2cc(e) || run_is_sanitizer(e) != (pass == 0))
				continue;
			if (*out)
				strcat(out, ":");
			strcat(out, e);
		}
		free(work);
		if (pass == 0) {
			if (*out)
				strcat(out, ":");
			strcat(out, lib);
		}
	}
	return out;
}

/* ---- the summary: a small JSON reader for the exit report ---- */

enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

struct jv {
	enum jtype type;
	bool b;
	double num;
	char *str; /* J_STR */
	char *key; /* as a member of an object */
	struct jv *kids, *next;
};

static void jv_free(struct jv *v)
{
	while (v) {
		struct jv *next = v->next;
		jv_free(v->kids);
		free(v->str);
		free(v->key);
		free(v);
		v = next;
	}
}

static void j_ws(const char **s)
{
	while (isspace((unsigned char)**s))
		(*s)++;
}

static char *j_string(const char **s)
{
	size_t n = 0, cap = 64;
	char *out = malloc(cap);
	if (!out || **s != '"')
		goto err_free;
	for ((*s)++; **s && **s != '"'; (*s)++) {
		char c = **s;
		if (c == '\\') {
			(*s)++;
			c = **s == 'n' ? '\n' : **s == 't' ? '\t' : **s;
			if (**s == 'u') { /* not written by the report; kept as '?' */
				for (int k = 0; k < 4 && (*s)[1]; k++)
					(*s)++;
				c = '?';
			}
			if (!c)
				goto err_free;
		}
		if (n + 2 > cap) {
			char *bigger = realloc(out, cap *= 2);
			if (!bigger)
				goto err_free;
			out = bigger;
		}
		out[n++] = c;
	}
	if (**s != '"')
		goto err_free;
	(*s)++;
	out[n] = '\0';
	return out;
err_free:
	free(out);
	return NULL;
}

static struct jv *j_value(const char **s, int depth)
{
	struct jv *v = calloc(1, sizeof(*v)), **tail;
	if (!v || depth > 32)
		goto err_free;
	j_ws(s);
	if (**s == '{' || **s == '[') {
		bool obj = **s == '{';
		v->type = obj ? J_OBJ : J_ARR;
		tail = &v->kids;
		(*s)++;
		j_ws(s);
		if (**s == (obj ? '}' : ']')) {
			(*s)++;
			return v;
		}
		for (;;) {
			char *key = NULL;
			j_ws(s);
			if (obj) {
				key = j_string(s);
				j_ws(s);
				if (!key || **s != ':') {
					free(key);
					goto err_free;
				}
				(*s)++;
			}
			struct jv *kid = j_value(s, depth + 1);
			if (!kid) {
				free(key);
				goto err_free;
			}
			kid->key = key;
			*tail = kid;
			tail = &kid->next;
			j_ws(s);
			if (**s == ',') {
				(*s)++;
				continue;
			}
			if (**s != (obj ? '}' : ']'))
				goto err_free;
			(*s)++;
			return v;
		}
	}
	if (**s == '"') {
		v->type = J_STR;
		if (!(v->str = j_string(s)))
			goto err_free;
		return v;
	}
	if (!strncmp(*s, "true", 4) || !strncmp(*s, "false", 5)) {
		v->type = J_BOOL;
		v->b = **s == 't';
		*s += v->b ? 4 : 5;
		return v;
	}
	if (!strncmp(*s, "null", 4)) {
		*s += 4;
		return v;
	}
	char *end;
	v->num = strtod(*s, &end);
	if (end == *s)
		goto err_free;
	v->type = J_NUM;
	*s = end;
	return v;
err_free:
	jv_free(v);
	return NULL;
}

static const struct jv *jv_get(const struct jv *obj, const char *key)
{
	if (!obj || obj->type != J_OBJ)
		return NULL;
	for (const struct jv *k = obj->kids; k; k = k->next)
		if (!strcmp(k->key, key))
			return k;
	return NULL;
}

static double jv_num(const struct jv *obj, const char *key)
{
	const struct jv *v = jv_get(obj, key);
	return v && v->type == J_NUM ? v->num : 0;
}

static bool jv_true(const struct jv *obj, const char *key)
{
	const struct jv *v = jv_get(obj, key);
	return v && v->type == J_BOOL && v->b;
}

static const char *jv_str(const struct jv *obj, const char *key)
{
	const struct jv *v = jv_get(obj, key);
	return v && v->type == J_STR ? v->str : "?";
}

static int jv_count(const struct jv *arr)
{
	int n = 0;
	for (const struct jv *k = arr && arr->type == J_ARR ? arr->kids : NULL; k; k = k->next)
		n++;
	return n;
}

static struct jv *run_read_report(const char *path)
{
	FILE *f = fopen(path, "r");
	char *buf = NULL;
	size_t len = 0;
	struct jv *root = NULL;

	if (!f)
		return NULL;
	FILE *mem = open_memstream(&buf, &len);
	if (mem) {
		char chunk[8192];
		size_t n;
		while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
			fwrite(chunk, 1, n, mem);
		fclose(mem);
	}
	fclose(f);
	if (buf) {
		const char *s = buf;
		root = j_value(&s, 0);
		j_ws(&s);
		if (root && (*s || root->type != J_OBJ || !jv_get(root, "pid"))) {
			jv_free(root);
			root = NULL;
		}
	}
	free(buf);
	return root;
}

/* One report's line; false for a process that used no RDMA NIC and no
 * communicator and had nothing to report (a launcher, a shell). */
static bool run_report_line(const struct jv *r, char *line, size_t len)
{
	const struct jv *incs = jv_get(r, "incidents"), *drill = jv_get(r, "drill");
	const struct jv *nics = jv_get(r, "nics");
	int ninc = 0, ndrill = 0, repaired = 0, failed = 0, failbacks = 0, down = 0;
	char drillbuf[32] = "-", prot[300];

	for (const struct jv *in = incs && incs->type == J_ARR ? incs->kids : NULL; in;
	     in = in->next) {
		if (jv_true(in, "failback")) {
			failbacks++;
			continue;
		}
		ninc++;
		ndrill += jv_true(in, "drill");
		if (jv_num(in, "failed") > 0)
			failed++;
		else if (jv_get(in, "migrate_ms"))
			repaired++;
	}
	for (const struct jv *n = nics && nics->type == J_ARR ? nics->kids : NULL; n; n = n->next)
		down += strcmp(jv_str(n, "state"), "up") != 0;
	if (drill)
		snprintf(drillbuf, sizeof(drillbuf), "%d/%d", (int)jv_num(drill, "applied"),
			 jv_count(jv_get(drill, "steps")));
	if (jv_true(r, "protected"))
		snprintf(prot, sizeof(prot), "yes");
	else
		snprintf(prot, sizeof(prot), "no (%s)", jv_str(r, "not_protected"));
	snprintf(line, len,
		 "host=%s node=%s pid=%d nics=%d down=%d incidents=%d drill_incidents=%d "
		 "repaired=%d failed=%d failbacks=%d drill_steps=%s protected=%s",
		 jv_str(r, "host"), jv_str(r, "node"), (int)jv_num(r, "pid"), jv_count(nics), down,
		 ninc, ndrill, repaired, failed, failbacks, drillbuf, prot);
	return jv_count(nics) || ninc || failbacks || drill || jv_num(r, "communicators") > 0 ||
	       !jv_true(r, "protected");
}

/* R2CC_REPORT's pattern as a glob for its JSON files: %h and %p match anything. */
static void run_report_glob(const char *pattern, char *out, size_t len)
{
	size_t o = 0;
	for (const char *s = pattern; *s && o + 8 < len; s++) {
		if (s[0] == '%' && (s[1] == 'h' || s[1] == 'p')) {
			out[o++] = '*';
			s++;
			continue;
		}
		if (strchr("*?[\\", *s))
			out[o++] = '\\';
		out[o++] = *s;
	}
	snprintf(out + o, len - o, ".json");
}

static void run_summary(const char *pattern, time_t since)
{
	char pat[PATH_MAX + 16], line[1024], idle_pids[256] = "";
	glob_t g;
	int nlines = 0, nidle = 0;

	run_report_glob(pattern, pat, sizeof(pat));
	if (glob(pat, 0, NULL, &g) != 0)
		g.gl_pathc = 0;
	for (size_t i = 0; i < g.gl_pathc; i++) {
		struct stat sb;
		/* A report left by an earlier run under the same pattern is not ours. */
		if (stat(g.gl_pathv[i], &sb) != 0 || sb.st_mtime < since)
			continue;
		struct jv *r = run_read_report(g.gl_pathv[i]);
		if (!r) {
			fprintf(stderr, "r2cc run: %s: not an R2CC report\n", g.gl_pathv[i]);
			continue;
		}
		if (run_report_line(r, line, sizeof(line))) {
			fprintf(stderr, "r2cc run: %s\n", line);
			nlines++;
		} else {
			size_t used = strlen(idle_pids);
			if (used + 16 < sizeof(idle_pids))
				snprintf(idle_pids + used, sizeof(idle_pids) - used, "%s%d",
					 nidle ? "," : "", (int)jv_num(r, "pid"));
			nidle++;
		}
		jv_free(r);
	}
	if (g.gl_pathc)
		globfree(&g);
	if (nidle)
		fprintf(stderr,
			"r2cc run: %d more process(es) under the preload used no RDMA NIC and no "
			"communicator (launchers, shells): pid=%s\n",
			nidle, idle_pids);
	if (!nlines && !nidle)
		fprintf(stderr,
			"r2cc run: no R2CC report at %s (COMMAND did not load libr2cc.so, or could "
			"not write there)\n",
			pattern);
}

/* Removes the temporary report directory: the reports and the directory only. */
static void run_rm_reports(const char *dir)
{
	char pat[PATH_MAX];
	glob_t g;

	if (snprintf(pat, sizeof(pat), "%s/r2cc-report.*", dir) >= (int)sizeof(pat))
		return; /* a directory of ours: never that long */
	if (glob(pat, 0, NULL, &g) == 0) {
		for (size_t i = 0; i < g.gl_pathc; i++)
			unlink(g.gl_pathv[i]);
		globfree(&g);
	}
	rmdir(dir);
}

/* ---- running COMMAND ---- */

static volatile sig_atomic_t run_child;

/* Forward what a launcher or a user sends with kill(); what the terminal sends
 * to the process group (si_code SI_KERNEL) has reached COMMAND already. */
static void run_forward(int sig, siginfo_t *si, void *ctx)
{
	(void)ctx;
	if (run_child > 0 && si->si_code <= 0)
		kill(run_child, sig);
}

static const int run_fwd_signals[] = {SIGTERM, SIGINT,	SIGHUP,	 SIGQUIT, SIGUSR1,
				      SIGUSR2, SIGCONT, SIGTSTP, SIGWINCH};

static _Noreturn void run_exec(char **cmd)
{
	execvp(cmd[0], cmd);
	int e = errno;
	fprintf(stderr, "r2cc run: cannot run %s: %s\n", cmd[0], strerror(e));
	_exit(e == ENOENT ? RUN_NOTFOUND : RUN_NOEXEC);
}

static int run_wait(char **cmd)
{
	sigset_t all, old;
	struct sigaction sa = {.sa_sigaction = run_forward, .sa_flags = SA_SIGINFO | SA_RESTART};
	int status;

	sigfillset(&all);
	sigprocmask(SIG_BLOCK, &all, &old);
	pid_t parent = getpid(), pid = fork();
	if (pid < 0) {
		fprintf(stderr, "r2cc run: fork: %s\n", strerror(errno));
		sigprocmask(SIG_SETMASK, &old, NULL);
		return RUN_ERR;
	}
	if (pid == 0) {
		/* COMMAND must not outlive r2cc run killed outright (SIGKILL). */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(RUN_ERR);
		sigprocmask(SIG_SETMASK, &old, NULL);
		run_exec(cmd);
	}
	run_child = pid;
	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < sizeof(run_fwd_signals) / sizeof(run_fwd_signals[0]); i++)
		sigaction(run_fwd_signals[i], &sa, NULL);
	sigprocmask(SIG_SETMASK, &old, NULL);
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR) {
			fprintf(stderr, "r2cc run: waitpid: %s\n", strerror(errno));
			return RUN_ERR;
		}
	run_child = 0;
	if (WIFSIGNALED(status))
		return 128 + WTERMSIG(status);
	return WEXITSTATUS(status);
}

static void run_print_quoted(const char *s)
{
	if (*s && !strpbrk(s, " \t\n'\"\\$`!*?[]{}()<>|&;#~")) {
		fputs(s, stdout);
		return;
	}
	putchar('\'');
	for (; *s; s++)
		if (*s == '\'')
			fputs("'\\''", stdout);
		else
			putchar(*s);
	putchar('\'');
}

/* ---- options ---- */

enum { O_MODE = 256, O_DRILL, O_REPORT, O_DEBUG, O_SET, O_SUMMARY, O_LIB, O_DRY_RUN };

static int run_parse(int argc, char **argv, struct run_opts *o)
{
	static const struct option longopts[] = {
	    {"mode", required_argument, NULL, O_MODE},
	    {"drill", required_argument, NULL, O_DRILL},
	    {"report", required_argument, NULL, O_REPORT},
	    {"debug", required_argument, NULL, O_DEBUG},
	    {"set", required_argument, NULL, O_SET},
	    {"summary", no_argument, NULL, O_SUMMARY},
	    {"lib", required_argument, NULL, O_LIB},
	    {"dry-run", no_argument, NULL, O_DRY_RUN},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	int c, rc = 0;

	optind = 1;
	opterr = 0;
	/* '+': stop at COMMAND, whose own options are its own. */
	while ((c = getopt_long(argc, argv, "+h", longopts, NULL)) != -1) {
		switch (c) {
		case O_MODE:
			rc = run_add(o, "R2CC_MODE", optarg, "--mode");
			break;
		case O_DRILL:
			rc = run_add(o, "R2CC_DRILL", optarg, "--drill");
			break;
		case O_REPORT:
			o->report = optarg;
			rc = run_add(o, "R2CC_REPORT", optarg, "--report");
			break;
		case O_DEBUG:
			rc = run_add(o, "R2CC_DEBUG", optarg, "--debug");
			break;
		case O_SET: {
			char *eq = strchr(optarg, '=');
			if (!eq || eq == optarg) {
				fprintf(stderr, "r2cc run: --set takes NAME=VALUE, not '%s'\n",
					optarg);
				return -EINVAL;
			}
			*eq = '\0';
			rc = run_add(o, optarg, eq + 1, "--set");
			break;
		}
		case O_SUMMARY:
			o->summary = true;
			break;
		case O_LIB:
			o->lib = optarg;
			break;
		case O_DRY_RUN:
			o->dry_run = true;
			break;
		case 'h':
			run_usage(stdout);
			exit(0);
		default:
			fprintf(stderr, "r2cc run: unknown option or missing value: %s\n",
				argv[optind - 1]);
			run_usage(stderr);
			return -EINVAL;
		}
		if (rc)
			return rc;
	}
	if (optind >= argc) {
		fprintf(stderr, "r2cc run: no COMMAND (r2cc run [OPTIONS] -- COMMAND [ARGS])\n");
		return -EINVAL;
	}
	return optind;
}

int r2cc_run_main(int argc, char **argv)
{
	struct run_opts o = {0};
	char lib[PATH_MAX], tmpdir[PATH_MAX] = "", pattern[PATH_MAX + 32];
	const char *report = NULL;
	int first = run_parse(argc, argv, &o);

	if (first < 0)
		return RUN_ERR;
	if (run_check(&o)) {
		fprintf(stderr, "r2cc run: nothing was run\n");
		return RUN_ERR;
	}
	if (run_find_lib(o.lib, lib, sizeof(lib)))
		return RUN_ERR;
	char *preload = run_preload(lib);
	if (!preload) {
		fprintf(stderr, "r2cc run: out of memory\n");
		return RUN_ERR;
	}
	/* --summary: the reports go where asked, else to a directory of our own. */
	if (o.summary) {
		report = o.report ? o.report : getenv("R2CC_REPORT");
		if (!report && !o.dry_run) {
			const char *t = getenv("TMPDIR");
			snprintf(tmpdir, sizeof(tmpdir), "%s/r2cc-run.XXXXXX",
				 t && *t ? t : "/tmp");
			if (!mkdtemp(tmpdir)) {
				fprintf(stderr, "r2cc run: cannot make %s: %s\n", tmpdir,
					strerror(errno));
				return RUN_ERR;
			}
			snprintf(pattern, sizeof(pattern), "%s/r2cc-report.%%h.%%p", tmpdir);
			report = pattern;
			if (run_add(&o, "R2CC_REPORT", report, "--summary"))
				return RUN_ERR;
		}
	}
	if (setenv("LD_PRELOAD", preload, 1)) {
		fprintf(stderr, "r2cc run: setenv: %s\n", strerror(errno));
		return RUN_ERR;
	}
	for (int i = 0; i < o.nset; i++)
		if (run_given(&o, o.set[i].name) == &o.set[i] &&
		    setenv(o.set[i].name, o.set[i].value, 1)) {
			fprintf(stderr, "r2cc run: setenv: %s\n", strerror(errno));
			return RUN_ERR;
		}
	if (o.dry_run) {
		printf("LD_PRELOAD=");
		run_print_quoted(preload);
		for (int i = 0; i < o.nset; i++)
			if (run_given(&o, o.set[i].name) == &o.set[i]) {
				printf(" %s=", o.set[i].name);
				run_print_quoted(o.set[i].value);
			}
		for (int i = first; i < argc; i++) {
			putchar(' ');
			run_print_quoted(argv[i]);
		}
		putchar('\n');
		return 0;
	}
	free(preload);
	if (!o.summary)
		run_exec(argv + first);

	time_t since = time(NULL) - 1;
	int rc = run_wait(argv + first);
	run_summary(report, since);
	if (tmpdir[0])
		run_rm_reports(tmpdir);
	return rc;
}
