# tests/: unit tests (Criterion) of the shim, and the preload test.
UNIT_SHIM := shim/params.c shim/failspec.c shim/drillspec.c shim/cost_params.c shim/log.c shim/map.c shim/registry.c shim/comm.c \
	     shim/core.c shim/report.c shim/stats.c shim/protect.c
UNIT_CFLAGS = $(BIN_CFLAGS) -DR2CC_VERSION_STRING='"test"'

$(BUILD)/tests/unit/test_params: tests/unit/test_params.c shim/params.c shim/failspec.c shim/drillspec.c shim/log.c shim/cost_params.c
	@mkdir -p $(@D)
	$(CC) $(UNIT_CFLAGS) -o $@ $^ -lcriterion -ldl

$(BUILD)/tests/unit/test_registry: tests/unit/test_registry.c $(UNIT_SHIM)
	@mkdir -p $(@D)
	$(CC) $(UNIT_CFLAGS) -o $@ $^ -lcriterion -ldl

$(BUILD)/tests/unit/test_log: tests/unit/test_log.c shim/log.c shim/params.c shim/failspec.c shim/drillspec.c shim/cost_params.c
	@mkdir -p $(@D)
	$(CC) $(UNIT_CFLAGS) -o $@ $^ -lcriterion -ldl

$(BUILD)/tests/unit/test_ledger: tests/unit/test_ledger.c repair/model/ledger.c shim/log.c shim/params.c shim/failspec.c shim/drillspec.c shim/cost_params.c
	@mkdir -p $(@D)
	$(CC) $(UNIT_CFLAGS) -o $@ $^ -lcriterion -ldl

$(BUILD)/tests/unit/test_stall: tests/unit/test_stall.c repair/model/stall.c repair/model/ledger.c shim/log.c shim/params.c shim/failspec.c shim/drillspec.c shim/cost_params.c
	@mkdir -p $(@D)
	$(CC) $(UNIT_CFLAGS) -o $@ $^ -lcriterion -ldl

$(BUILD)/tests/unit/test_map: tests/unit/test_map.c shim/map.c shim/map.h
	@mkdir -p $(@D)
	$(CC) $(UNIT_CFLAGS) -o $@ tests/unit/test_map.c shim/map.c -lcriterion

$(BUILD)/tests/unit/test_drillspec: tests/unit/test_drillspec.c shim/drillspec.c shim/drillspec.h
	@mkdir -p $(@D)
	$(CC) $(UNIT_CFLAGS) -o $@ tests/unit/test_drillspec.c shim/drillspec.c -lcriterion

UNIT_TESTS := test_params test_registry test_log test_ledger test_stall test_map test_drillspec
TEST_DEPS += $(UNIT_TESTS:%=$(BUILD)/tests/unit/%)
CPU_TESTS += $(UNIT_TESTS:%=120@$(BUILD)/tests/unit/%:--jobs=2)
FORMAT_SRCS += $(wildcard tests/unit/test_params.c tests/unit/test_registry.c tests/unit/test_log.c tests/unit/test_ledger.c \
	tests/unit/test_stall.c tests/unit/test_map.c tests/unit/test_drillspec.c)

# Preload test: needs the software RDMA device and libr2cc.so.
$(BUILD)/tests/preload/verbs_preload: tests/preload/verbs_preload.c
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ $< -ldl
# The same linked against libibverbs (the software device's, found at run time through
# LD_LIBRARY_PATH): by symbol, no dlvsym.
$(BUILD)/tests/preload/verbs_preload_direct: tests/preload/verbs_preload.c $(BUILD)/softverbs/libibverbs.so
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -DPRELOAD_DIRECT -o $@ $< -L$(BUILD)/softverbs -libverbs -ldl

TEST_DEPS += $(BUILD)/tests/preload/verbs_preload $(BUILD)/tests/preload/verbs_preload_direct
CPU_TESTS += 120@tests/preload/run.sh 30@tests/preload/exports.sh:$(BUILD)
FORMAT_SRCS += tests/preload/verbs_preload.c

# GPU tests (make gpu-test, on a GPU machine): programs linked like an
# application, against the system NCCL and the CUDA runtime.
CUDA_LIBDIR ?= $(CUDA_HOME)/lib64
$(BUILD)/tests/gpu/allreduce2: tests/gpu/allreduce2.c
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ $< -L$(CUDA_LIBDIR) -lcudart -lnccl

GPU_TARGETS += $(BUILD)/tests/gpu/allreduce2
GPU_TESTS += 600@scripts/gpu/gpu-foundation.sh 900@scripts/gpu/gpu-softverbs.sh 600@scripts/gpu/gpu-strategies.sh \
	     600@scripts/gpu/gpu-repair.sh 600@scripts/gpu/gpu-ar2-vs-balance.sh
FORMAT_SRCS += tests/gpu/allreduce2.c

# Benchmark of the fast paths' per-call cost (make bench).
$(BUILD)/tests/bench/nccl_null/libnccl.so.2: tests/bench/nccl_null.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) -Wno-missing-prototypes -shared -Wl,-soname,libnccl.so.2 -o $@ $<
	ln -sf libnccl.so.2 $(@D)/libnccl.so

$(BUILD)/tests/bench/wrap_cost: tests/bench/wrap_cost.c $(BUILD)/tests/bench/nccl_null/libnccl.so.2
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ $< -L$(BUILD)/tests/bench/nccl_null -lnccl \
		-Wl,-rpath,'$$ORIGIN/nccl_null' -ldl

BENCH_TARGETS += $(BUILD)/tests/bench/wrap_cost
BENCHES += tests/bench/wrap_cost.sh tests/bench/wrap_instr.sh
FORMAT_SRCS += tests/bench/wrap_cost.c tests/bench/nccl_null.c

# Scale (docs/scale.md): repair time of many QPs on one NIC over the soft device, and the
# control plane's registration time and memory (r2cc-ctl-load).
$(BUILD)/tests/bench/repair_scale: tests/bench/repair_scale.c tools/drill/verbs.c tools/drill/drill.h
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ tests/bench/repair_scale.c tools/drill/verbs.c -ldl
BENCH_TARGETS += $(BUILD)/tests/bench/repair_scale $(BUILD)/bin/r2cc-verbs-drill $(BUILD)/bin/r2cc-ctl-load
BENCHES += tests/bench/scale.sh
FORMAT_SRCS += tests/bench/repair_scale.c
CPU_TESTS += 240@tests/preload/rdma-core.sh:$(BUILD)
