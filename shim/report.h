/*
 * The summary R2CC writes at exit when R2CC_REPORT names a file: the
 * process's per-NIC traffic and state as text, and the same as JSON in
 * PATH.json, with hot repair's incidents and their timelines.
 */
#ifndef R2CC_SHIM_REPORT_H
#define R2CC_SHIM_REPORT_H

#include <stdio.h>

/* Hot repair's incidents (repair/incident.c sets it when it starts): text lines to
 * text, the members of the JSON "incidents" array to json (either may be NULL).
 * Unset: "incidents: none" and an empty array. */
extern void (*r2cc_report_incidents_hook)(FILE *text, FILE *json);
/* R2CC_DRILL's steps (repair/drill.c): text lines, and the JSON value of "drill". */
extern void (*r2cc_report_drill_hook)(FILE *text, FILE *json);
/* Hot repair's stall-scan summary: one text line, or one JSON object. */
extern void (*r2cc_report_stalls_hook)(FILE *text, FILE *json);

/* s as a JSON string: quoted, '"' and '\\' escaped, control characters left out. */
void r2cc_json_str(FILE *f, const char *s);

/* Write the text and JSON forms to the two streams (either may be NULL). */
void r2cc_report_write(FILE *text, FILE *json);
/* Write to R2CC_REPORT and R2CC_REPORT.json; called once at exit. */
void r2cc_report_at_exit(void);

#endif
