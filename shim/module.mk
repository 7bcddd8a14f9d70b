# shim/: the library's core (settings, logging, registries, start-up).
LIBR2CC_SRCS += shim/core.c shim/params.c shim/failspec.c shim/drillspec.c shim/log.c shim/map.c shim/registry.c shim/comm.c shim/report.c shim/stats.c \
		shim/fault.c shim/fault_alloc.c shim/protect.c shim/cost_params.c
# Fault injection's allocation hooks (shim/fault_alloc.c) see every allocation of the library.
LIBR2CC_LIBS += -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=aligned_alloc

FORMAT_SRCS += $(wildcard shim/*.c shim/*.h) include/r2cc.h
R2CC_VERSION := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
LIB_CFLAGS += -DR2CC_VERSION_STRING='"0.1-$(R2CC_VERSION)"'
