/*
 * The summary R2CC writes at exit when R2CC_REPORT names a file: the
 * process's per-NIC traffic and state as text, and the same as JSON in
 * PATH.json. The incident timeline of hot repair will join it.
 */
#ifndef R2CC_SHIM_REPORT_H
#define R2CC_SHIM_REPORT_H

#include <stdio.h>

/* Write the text and JSON forms to the two streams (either may be NULL). */
void r2cc_report_write(FILE *text, FILE *json);
/* Write to R2CC_REPORT and R2CC_REPORT.json; called once at exit. */
void r2cc_report_at_exit(void);

#endif
