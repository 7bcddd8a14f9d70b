/* `r2cc top`: see top.c. */
#ifndef R2CC_TOOLS_TOP_H
#define R2CC_TOOLS_TOP_H

int r2cc_top_main(int argc, char **argv);

#endif
