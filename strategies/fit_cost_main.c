/*
 * r2cc-fit-cost: fits the cost model's constants (strategies/cost.h) to
 * measurements and prints them in the form r2cc-plan --model accepts and as a
 * C initializer for r2cc_cost_default; or, with --check, prints what a model
 * predicts for each measurement. Input: CSV rows
 * "strategy,n,k,f,bytes,time_us[,chunks]" from a file or stdin ("-").
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strategies/cost.h"

static const char usage[] =
    "usage: r2cc-fit-cost [--rate GBPS] [--check] [--model SPEC] FILE.csv|-\n"
    "CSV rows: strategy,n,k,f,bytes,time_us[,chunks] with strategy one of\n"
    "healthy|backup|balance|ar2 (or 0..3); a header and # comments are skipped.\n"
    "  (default)     fit every constant\n"
    "  --rate GBPS   fit only the fixed (latency) terms; the per-byte ones are the\n"
    "                link rate's, GBPS Gb/s per NIC (the physical default's form)\n"
    "  --check       fit nothing: print, for each row, the time the model predicts\n"
    "                (the built-in one, or --model SPEC; a link rate from --rate,\n"
    "                else 100 Gb/s, where the model has no per-byte constant)\n";

static int check(const struct r2cc_cost_model *m, const struct r2cc_cost_sample *s, int n,
		 double gbps)
{
	static const char *const sname[] = {"healthy", "backup", "balance", "ar2"};
	static const double edge[] = {1 << 20, 256.0 * (1 << 20), HUGE_VAL};
	static const char *const cls[] = {"< 1 MiB", "1-256 MiB", ">= 256 MiB"};
	double sse[3] = {0}, worst[3] = {0};
	int cnt[3] = {0};

	printf("%-8s %3s %3s %3s %14s %14s %14s %8s\n", "strategy", "n", "k", "f", "bytes",
	       "measured_us", "predicted_us", "pred/meas");
	for (int i = 0; i < n; i++) {
		struct r2cc_cost_case c = {s[i].nodes,	s[i].nics, s[i].failed, s[i].bytes,
					   s[i].chunks, 1,	   gbps};
		double t = r2cc_cost_time(m, s[i].strategy, &c), r = t / s[i].time_us;
		int k = 0;

		while (s[i].bytes >= edge[k])
			k++;
		printf("%-8s %3d %3d %3d %14.0f %14.1f %14.1f %8.3f\n", sname[s[i].strategy],
		       s[i].nodes, s[i].nics, s[i].failed, s[i].bytes, s[i].time_us, t, r);
		sse[k] += (r - 1) * (r - 1);
		worst[k] = fabs(r - 1) > worst[k] ? fabs(r - 1) : worst[k];
		cnt[k]++;
	}
	for (int k = 0; k < 3; k++)
		if (cnt[k])
			printf("%s: %d rows, RMS relative error %.1f %%, largest %.1f %%\n", cls[k],
			       cnt[k], 100 * sqrt(sse[k] / cnt[k]), 100 * worst[k]);
	return 0;
}

int main(int argc, char **argv)
{
	struct r2cc_cost_model m = r2cc_cost_default;
	struct r2cc_cost_sample *s = NULL, *grown;
	char line[1024], err[256], spec[256];
	int n = 0, cap = 0, lineno = 0, ret, a;
	double rms, gbps = 0;
	const char *file = NULL;
	bool do_check = false;
	FILE *in;

	for (a = 1; a < argc; a++) {
		if (!strcmp(argv[a], "--help")) {
			fputs(usage, stdout);
			return 0;
		} else if (!strcmp(argv[a], "--check")) {
			do_check = true;
		} else if (!strcmp(argv[a], "--rate") && a + 1 < argc) {
			char *end;
			gbps = strtod(argv[++a], &end);
			if (*end || !(gbps > 0) || gbps > 1e6) {
				fprintf(stderr,
					"r2cc-fit-cost: --rate needs Gb/s > 0, not \"%s\"\n",
					argv[a]);
				return 2;
			}
		} else if (!strcmp(argv[a], "--model") && a + 1 < argc) {
			if (r2cc_cost_model_parse(argv[++a], &m, err, sizeof(err))) {
				fprintf(stderr, "r2cc-fit-cost: --%s\n", err);
				return 2;
			}
		} else if (!file && (argv[a][0] != '-' || !strcmp(argv[a], "-"))) {
			file = argv[a];
		} else {
			fprintf(stderr, "r2cc-fit-cost: unexpected \"%s\"\n%s", argv[a], usage);
			return 2;
		}
	}
	if (!file) {
		fputs(usage, stderr);
		return 2;
	}
	in = strcmp(file, "-") ? fopen(file, "r") : stdin;
	if (!in) {
		perror(file);
		return 1;
	}
	while (fgets(line, sizeof(line), in)) {
		lineno++;
		if (n == cap) {
			cap = cap ? 2 * cap : 256;
			grown = realloc(s, sizeof(*s) * (size_t)cap);
			if (!grown) {
				fprintf(stderr, "r2cc-fit-cost: out of memory\n");
				return 1;
			}
			s = grown;
		}
		ret = r2cc_cost_parse_csv_line(line, &s[n], err, sizeof(err));
		if (ret < 0) {
			fprintf(stderr, "r2cc-fit-cost: %s line %d: %s\n", file, lineno, err);
			return 1;
		}
		n += ret;
	}
	if (in != stdin)
		fclose(in);
	if (do_check) {
		ret = check(&m, s, n, gbps);
		free(s);
		return ret;
	}
	if (gbps > 0 ? r2cc_cost_fit_latency(&m, s, n, gbps, &rms)
		     : r2cc_cost_fit(&m, s, n, &rms)) {
		fprintf(stderr, "r2cc-fit-cost: cannot fit %d samples\n", n);
		return 1;
	}
	r2cc_cost_model_format(&m, spec, sizeof(spec));
	printf("samples: %d\nrms_relative_error: %.4f\nmodel: %s\n", n, rms, spec);
	if (gbps > 0)
		printf("(per-byte terms 0: the link rate's, %g Gb/s here)\n", gbps);
	printf("/* fitted by r2cc-fit-cost%s from %s (%d samples, rms %.1f %%) */\n",
	       gbps > 0 ? " --rate" : "", file, n, 100 * rms);
	printf("const struct r2cc_cost_model r2cc_cost_default = {\n"
	       "\t.alpha_us = %.6g,\n\t.beta_us_per_byte = %.6g,\n"
	       "\t.ar2_beta_us_per_byte = %.6g,\n\t.ar2_stage_us = %.6g,\n"
	       "\t.ar2_chunk_us = %.6g,\n};\n",
	       m.alpha_us, m.beta_us_per_byte, m.ar2_beta_us_per_byte, m.ar2_stage_us,
	       m.ar2_chunk_us);
	free(s);
	return 0;
}
