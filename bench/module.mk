# bench: sources and targets of this folder (see the top Makefile).
#
# r2cc-perf, the verifying nccl-tests-compatible benchmark, with symlinks named after
# nccl-tests' programs. Built only where nvcc, nccl.h and libnccl.so.2 are present, so
# that `make` never fails for lack of CUDA. NCCL is linked normally (no rpath): the loader
# finds the system libnccl.so.2 or the one on LD_LIBRARY_PATH, and an LD_PRELOADed
# libr2cc.so interposes every call. The host-only parts (options, patterns and expected
# values, rendezvous, spawner, NIC counters) are plain C and unit-tested without a GPU.

CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90

# the directory holding libnccl.so.2: NCCL_HOME, CUDA_HOME, the system, scripts/deps.sh's copy
NCCL_LIBDIR := $(firstword $(foreach d,$(if $(NCCL_HOME),$(NCCL_HOME)/lib) $(CUDA_HOME)/lib64 \
	/usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib $(BUILD)/deps/nccl/lib,$(if $(wildcard $(d)/libnccl.so.2),$(d))))

BENCH_C_SRCS := bench/perf_opts.c bench/perf_rdv.c bench/perf_launch.c bench/perf_nic.c
BENCH_C_OBJS := $(BENCH_C_SRCS:%.c=$(BUILD)/obj/%.o)
BENCH_HDRS   := $(wildcard bench/*.h)
R2CC_PERF    := $(BUILD)/bin/r2cc-perf
R2CC_PERF_LINKS := all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf \
	reduce_perf alltoall_perf sendrecv_perf
PERF_UNIT    := $(BUILD)/tests/perf/perf_unit

FORMAT_SRCS += $(BENCH_C_SRCS) bench/perf_unit.c $(BENCH_HDRS)

# CPU tests: need only a C compiler (perf_unit) and a C++ compiler (the whole program
# on the host emulation of CUDA and NCCL in perf_emu.h, driven by emu-check.sh)
PERF_EMU := $(BUILD)/tests/perf/emu/r2cc-perf-emu
ALL_TARGETS += $(PERF_UNIT)
CPU_TESTS   += 60@$(PERF_UNIT)

$(PERF_UNIT): bench/perf_unit.c $(BENCH_C_OBJS) $(BENCH_HDRS)
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -rdynamic -o $@ bench/perf_unit.c $(BENCH_C_OBJS) -ldl -lm

ifneq ($(shell command -v $(CXX) 2>/dev/null),)
ALL_TARGETS += $(PERF_EMU)
CPU_TESTS   += 180@bench/emu-check.sh

$(PERF_EMU): bench/r2cc_perf.cu $(BENCH_C_OBJS) $(BENCH_HDRS)
	@mkdir -p $(@D)
	$(CXX) -std=c++17 -O1 -g -DPERF_EMU -I. -Wall -Wextra -Werror -Wno-unused-parameter \
	  -o $@ -x c++ bench/r2cc_perf.cu -x none $(BENCH_C_OBJS) -ldl -lpthread -lm -lrt
	@for l in $(R2CC_PERF_LINKS); do ln -sfn r2cc-perf-emu $(@D)/$$l; done
endif

ifneq ($(and $(wildcard $(NVCC)),$(NCCL_INC),$(NCCL_LIBDIR)),)
ALL_TARGETS   += $(R2CC_PERF)
BENCH_TARGETS += $(R2CC_PERF)

$(BUILD)/obj/bench/r2cc_perf.o: bench/r2cc_perf.cu $(BENCH_HDRS)
	@mkdir -p $(@D)
	$(NVCC) -std=c++17 -O2 -g $(CUDA_ARCH) -I. -isystem $(NCCL_INC) \
	  -Xcompiler -Wall,-Wextra,-Wno-unused-parameter -c -o $@ $<

$(R2CC_PERF): $(BUILD)/obj/bench/r2cc_perf.o $(BENCH_C_OBJS)
	@mkdir -p $(@D)
	$(NVCC) $(CUDA_ARCH) -o $@ $^ -L$(NCCL_LIBDIR) -l:libnccl.so.2 -ldl -lpthread -lm
	@for l in $(R2CC_PERF_LINKS); do ln -sfn r2cc-perf $(@D)/$$l; done
endif

ifneq ($(and $(wildcard $(NVCC)),$(NCCL_INC),$(NCCL_LIBDIR)),)
GPU_TARGETS += $(R2CC_PERF)
GPU_TESTS   += 1200@bench/gpu-check.sh
endif
