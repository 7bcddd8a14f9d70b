# R2CC build. `make` builds everything that needs no GPU; each folder adds its
# own sources and targets through a module.mk fragment included below, so the
# folders can grow independently.
#
#   make            libr2cc.so, tools, test programs, the software RDMA device
#   make test       the CPU test suite (what CI runs)
#   make demo       the main job on the built-in default (software RDMA device)
#   make gpu-test   GPU tests (GPU machine only)
#   make bench      benchmarks
#   make format / make lint

BUILD     ?= build
CUDA_HOME ?= /usr/local/cuda
NCCL_HOME ?=
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CC        ?= cc

# nccl.h: NCCL_HOME, then CUDA_HOME, then the system, then the copy that
# scripts/deps.sh unpacks from PyPI when none of those has one.
NCCL_INC := $(firstword $(foreach d,$(if $(NCCL_HOME),$(NCCL_HOME)/include) $(CUDA_HOME)/include /usr/include $(BUILD)/deps/nccl/include,$(if $(wildcard $(d)/nccl.h),$(d))))
CUDA_INC := $(firstword $(foreach d,$(CUDA_HOME)/include $(BUILD)/deps/cuda/include,$(if $(wildcard $(d)/cuda_runtime_api.h),$(d))))

# Build dependencies: a missing header or tool stops `make` here, with the list and the
# command that installs them (scripts/deps.sh --check: one $(CC) -E probe when all is
# there), instead of a compiler error halfway through. Goals that install them first
# (deps, test, demo: their own build comes after) or build nothing skip it, and so does
# DEPS_CHECK=0.
DEPS_CHECK_SKIP := deps test demo clean format test-ops test-asan test-asan-ci test-tsan
ifeq ($(DEPS_CHECK)$(filter $(DEPS_CHECK_SKIP),$(MAKECMDGOALS)),)
ifneq ($(shell CC='$(CC)' NCCL_INC='$(NCCL_INC)' scripts/deps.sh --check >&2; echo $$?),0)
$(error missing build dependencies (listed above))
endif
endif

WARN     := -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter -Wstrict-prototypes -Wmissing-prototypes
CSTD     := -std=c11 -D_GNU_SOURCE
OPT      ?= -O2 -g
# Parallel jobs for the builds that `make test` and the sanitizer targets start
# themselves (the tests run one at a time whatever this is).
BUILD_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
CFLAGS_BASE := $(CSTD) $(OPT) $(WARN) -fPIC -I. $(if $(CUDA_INC),-isystem $(CUDA_INC)) $(if $(NCCL_INC),-isystem $(NCCL_INC))
LIB_CFLAGS  := $(CFLAGS_BASE) -fvisibility=hidden -pthread
BIN_CFLAGS  := $(CFLAGS_BASE) -pthread

LIBR2CC := $(BUILD)/lib/libr2cc.so

# Filled in by the module.mk fragments.
LIBR2CC_SRCS :=
LIBR2CC_LIBS := -ldl -lpthread
ALL_TARGETS  :=
TEST_DEPS    :=
CPU_TESTS    :=
GPU_TARGETS  :=
GPU_TESTS    :=
BENCH_TARGETS :=
BENCHES      :=
FORMAT_SRCS  :=

# tests/sanitize comes last: its test-build lists every module's TEST_DEPS when it is read.
MODULES := shim intercept ctl repair strategies tests softverbs tools/ncclstub tools/drill tests/softverbs tests/ncclstub tests/drill tests/plot tests/scenarios tests/compat tools bench \
	   tests/fuzz tests/fault tests/ops ops/slurm packaging tests/hook tests/sanitize
include $(wildcard $(MODULES:%=%/module.mk))

LIBR2CC_OBJS := $(LIBR2CC_SRCS:%.c=$(BUILD)/obj/%.o)

.PHONY: all test demo gpu-test bench format lint deps clean
.DEFAULT_GOAL := all

all: $(LIBR2CC) $(ALL_TARGETS)

$(LIBR2CC): $(LIBR2CC_OBJS) shim/exports.map
	@mkdir -p $(@D)
	$(CC) -shared -o $@ $(LIBR2CC_OBJS) -Wl,--version-script=shim/exports.map -Wl,-z,defs $(LIBR2CC_LIBS)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(@D)
	@echo "  CC $<"; $(CC) $(LIB_CFLAGS) -MMD -MP -c -o $@ $<

-include $(LIBR2CC_OBJS:.o=.d)

deps:
	@scripts/deps.sh

test: deps
	@$(MAKE) --no-print-directory -j$(BUILD_JOBS) all $(TEST_DEPS)
	@scripts/ci/run-tests.sh $(CPU_TESTS)

demo: deps
	@$(MAKE) --no-print-directory all
	@scripts/demo.sh

gpu-test: all $(GPU_TARGETS)
	@scripts/ci/run-tests.sh $(GPU_TESTS)

bench: all $(BENCH_TARGETS)
	@scripts/ci/run-bench.sh $(BENCHES)

format:
	clang-format -i $(FORMAT_SRCS)

lint: all
	clang-format --dry-run --Werror $(FORMAT_SRCS)
	tests/lint/layers.py
	tests/preload/exports.sh $(BUILD)
	tests/lint/links.py
	cppcheck --quiet --error-exitcode=1 --std=c11 --enable=warning,performance,portability \
	  --suppress=missingIncludeSystem -I. $(LIBR2CC_SRCS)

clean:
	rm -rf $(BUILD)
