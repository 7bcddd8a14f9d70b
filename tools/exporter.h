/* `r2cc exporter`: see exporter.c. */
#ifndef R2CC_TOOLS_EXPORTER_H
#define R2CC_TOOLS_EXPORTER_H

int r2cc_exporter_main(int argc, char **argv);

#endif
