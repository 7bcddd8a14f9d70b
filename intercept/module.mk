# intercept/: the interposed entry points (NCCL API, dlvsym and the verbs wrappers).
LIBR2CC_SRCS += intercept/nccl.c intercept/nccl_real.c intercept/verbs.c intercept/transport.c intercept/netplugin.c intercept/netcheck.c
FORMAT_SRCS += $(wildcard intercept/*.c intercept/*.h)
