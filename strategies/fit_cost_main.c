/*
 * r2cc-fit-cost: fits the cost model's constants (strategies/cost.h) to
 * measurements and prints them in the form r2cc-plan --model accepts and as a
 * C initializer for r2cc_cost_default. Input: CSV rows
 * "strategy,n,k,f,bytes,time_us[,chunks]" from a file or stdin ("-").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strategies/cost.h"

int main(int argc, char **argv)
{
	struct r2cc_cost_model m = r2cc_cost_default;
	struct r2cc_cost_sample *s = NULL, *grown;
	char line[1024], err[256], spec[256];
	int n = 0, cap = 0, lineno = 0, ret;
	double rms;
	FILE *in;

	if (argc != 2 || !strcmp(argv[1], "--help")) {
		fprintf(argc == 2 ? stdout : stderr,
			"usage: r2cc-fit-cost FILE.csv|-\n"
			"CSV rows: strategy,n,k,f,bytes,time_us[,chunks] with strategy one of\n"
			"healthy|backup|balance|ar2 (or 0..3); a header and # comments are "
			"skipped.\n");
		return argc == 2 ? 0 : 2;
	}
	in = strcmp(argv[1], "-") ? fopen(argv[1], "r") : stdin;
	if (!in) {
		perror(argv[1]);
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
			fprintf(stderr, "r2cc-fit-cost: %s line %d: %s\n", argv[1], lineno, err);
			return 1;
		}
		n += ret;
	}
	if (in != stdin)
		fclose(in);
	if (r2cc_cost_fit(&m, s, n, &rms)) {
		fprintf(stderr, "r2cc-fit-cost: cannot fit %d samples\n", n);
		return 1;
	}
	r2cc_cost_model_format(&m, spec, sizeof(spec));
	printf("samples: %d\nrms_relative_error: %.4f\nmodel: %s\n", n, rms, spec);
	printf("/* fitted by r2cc-fit-cost from %s (%d samples, rms %.1f %%) */\n", argv[1], n,
	       100 * rms);
	printf("const struct r2cc_cost_model r2cc_cost_default = {\n"
	       "\t.alpha_us = %.6g,\n\t.beta_us_per_byte = %.6g,\n"
	       "\t.ar2_beta_us_per_byte = %.6g,\n\t.ar2_stage_us = %.6g,\n"
	       "\t.ar2_chunk_us = %.6g,\n};\n",
	       m.alpha_us, m.beta_us_per_byte, m.ar2_beta_us_per_byte, m.ar2_stage_us,
	       m.ar2_chunk_us);
	free(s);
	return 0;
}
