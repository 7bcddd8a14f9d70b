/*
 * `r2cc`: the command-line front of R2CC, one subcommand per entry of the
 * table below: `doctor` (tools/doctor.c), the pre-flight check, and `top`
 * (tools/top.c), the live per-NIC view. A subcommand whose source is not
 * built in (a weak reference left NULL) is simply not offered.
 */
#include "tools/doctor.h"

#include <stdio.h>
#include <string.h>

/* tools/top.h, declared here so that the front builds without it. */
int r2cc_top_main(int argc, char **argv) __attribute__((weak));
int r2cc_exporter_main(int argc, char **argv); /* tools/exporter.c */
/* tools/run.c */
int r2cc_run_main(int argc, char **argv);

static const struct {
	const char *name;
	int (*main)(int argc, char **argv);
	const char *help;
} commands[] = {
    {"doctor", r2cc_doctor_main, "check whether R2CC can repair NIC failures on this machine"},
    {"top", r2cc_top_main, "live per-NIC statistics of the R2CC processes on this node"},
    {"exporter", r2cc_exporter_main, "serve the node's R2CC statistics to Prometheus"},
    {"run", r2cc_run_main, "run a command (or each rank of a launcher) under R2CC"},
};

static void usage(FILE *o)
{
	fputs("usage: r2cc COMMAND [OPTIONS]\n\ncommands:\n", o);
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (commands[i].main)
			fprintf(o, "  %-8s %s\n", commands[i].name, commands[i].help);
	fputs("\nr2cc COMMAND --help for its options\n", o);
}

int main(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
	    !strcmp(argv[1], "help")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (commands[i].main && !strcmp(argv[1], commands[i].name))
			return commands[i].main(argc - 1, argv + 1);
	fprintf(stderr, "r2cc: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
