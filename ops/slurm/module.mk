# ops/slurm: spank_r2cc.so, the Slurm SPANK plugin behind `srun --r2cc[=SETTINGS]`
# (ops/slurm/README.md). It compiles the library's own parser in (shim/params.c and
# what it calls, as the r2cc tool does) and links nothing of Slurm's: srun and
# slurmstepd provide spank_* and slurm_* when they load it. Built only where
# libslurm-dev's slurm/spank.h is found (SLURM_INCLUDE); elsewhere skipped with a note.
#
# R2CC_SPANK_LIBRARY is the libr2cc.so the plugin preloads unless plugstack.conf says
# library=PATH: the installed library (make install's $(PREFIX)/lib/r2cc).

SLURM_INCLUDE      ?= /usr/include
R2CC_SPANK_LIBRARY  = $(or $(PREFIX),/usr/local)/lib/r2cc/libr2cc.so
SPANK_R2CC         := $(BUILD)/lib/spank_r2cc.so
SPANK_R2CC_SRCS    := ops/slurm/spank_r2cc.c ops/slurm/settings.c
SPANK_R2CC_LIBSRCS := shim/params.c shim/failspec.c shim/drillspec.c shim/log.c shim/cost_params.c
SPANK_R2CC_HDRS    := ops/slurm/settings.h shim/params.h shim/failspec.h shim/drillspec.h \
		      shim/log.h shim/cost_params.h

# Only the SPANK symbols are exported (ops/slurm/spank_r2cc.map): the library's
# parser stays private, so it can never bind to a libr2cc.so loaded beside it.
$(SPANK_R2CC): $(SPANK_R2CC_SRCS) $(SPANK_R2CC_LIBSRCS) $(SPANK_R2CC_HDRS) ops/slurm/spank_r2cc.map
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) $(if $(filter-out /usr/include,$(SLURM_INCLUDE)),-isystem $(SLURM_INCLUDE)) -pthread -shared \
	  -DR2CC_SPANK_LIBRARY='"$(R2CC_SPANK_LIBRARY)"' \
	  -Wl,--version-script=ops/slurm/spank_r2cc.map -o $@ \
	  $(SPANK_R2CC_SRCS) $(SPANK_R2CC_LIBSRCS) -ldl -lm

# The settings' parser needs no Slurm: its unit test is in `make test` everywhere.
SPANK_SETTINGS_TEST := $(BUILD)/tests/ops/slurm_settings

$(SPANK_SETTINGS_TEST): tests/ops/slurm_settings.c ops/slurm/settings.c $(SPANK_R2CC_LIBSRCS) \
		$(SPANK_R2CC_HDRS)
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ tests/ops/slurm_settings.c ops/slurm/settings.c \
	  $(SPANK_R2CC_LIBSRCS) -lcriterion -ldl -lm

TEST_DEPS   += $(SPANK_SETTINGS_TEST)
CPU_TESTS   += 60@$(SPANK_SETTINGS_TEST):--jobs=2
FORMAT_SRCS += $(SPANK_R2CC_SRCS) ops/slurm/settings.h tests/ops/slurm_settings.c \
	       tests/ops/slurm_task.c

# `make test-ops` (tests/ops/module.mk): Slurm's own daemons on this machine, two nodes,
# `srun --r2cc -N 2` through a fault (tests/ops/slurm.sh). slurm-task is one task of
# that job: a worker of the verbs drill (tools/drill), on the emulated node its Slurm
# node names.
SLURM_TASK := $(BUILD)/tests/ops/slurm-task

$(SLURM_TASK): tests/ops/slurm_task.c tools/drill/drill.h
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ tests/ops/slurm_task.c

OPS_DEPS    += $(SLURM_TASK) $(DRILL) $(DRILL_RUNTIME)
OPS_TESTS   += 300@tests/ops/slurm.sh:$(BUILD)
ifneq ($(wildcard $(SLURM_INCLUDE)/slurm/spank.h),)
ALL_TARGETS += $(SPANK_R2CC)
OPS_DEPS    += $(SPANK_R2CC)
else ifeq ($(MAKELEVEL),0)
# test-ops still runs the Slurm test, which then says what is missing and fails.
$(info ops/slurm: no $(SLURM_INCLUDE)/slurm/spank.h: spank_r2cc.so (srun --r2cc) is not built; apt-get install libslurm-dev)
endif
