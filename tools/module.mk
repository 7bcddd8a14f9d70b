# tools/: the r2cc command (build/bin/r2cc, tools/README.md): `doctor`, the
# pre-flight check, and `top`, the live per-NIC view (built in when tools/top.c
# is there); `exporter` serves top's statistics to Prometheus. doctor compiles
# the library's own parser (shim/params.c,
# shim/failspec.c, shim/drillspec.c, shim/log.c, shim/cost_params.c) and cost model (strategies/cost.c) in, and
# dlopen()s libibverbs and libnccl at run time: no link-time dependency on
# either, nor on CUDA.

R2CC_TOOL      := $(BUILD)/bin/r2cc
R2CC_TOOL_SRCS := tools/r2cc.c tools/doctor.c tools/doctor_nic.c tools/doctor_env.c \
	$(wildcard tools/top.c) tools/run.c tools/pages.c tools/exporter.c
R2CC_TOOL_LIBS := shim/params.c shim/failspec.c shim/drillspec.c shim/log.c shim/cost_params.c strategies/cost.c intercept/netplugin.c
R2CC_TOOL_HDRS := tools/doctor.h $(wildcard tools/top.h) tools/pages.h tools/exporter.h shim/params.h shim/failspec.h shim/log.h \
	strategies/cost.h shim/cost_params.h intercept/netplugin.h $(wildcard shim/stats.h shim/registry.h)

$(R2CC_TOOL): $(R2CC_TOOL_SRCS) $(R2CC_TOOL_LIBS) $(R2CC_TOOL_HDRS)
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ $(R2CC_TOOL_SRCS) $(R2CC_TOOL_LIBS) -ldl -lm

# r2cc-ctl-load: many simulated ranks against the control plane (tools/ctl_load.c,
# compiled with ctl/'s sources: ctl/module.mk).
CTL_LOAD := $(BUILD)/bin/r2cc-ctl-load
$(CTL_LOAD): tools/ctl_load.c $(CTL_TEST_SRCS) $(CTL_HDRS)
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ $< $(CTL_TEST_SRCS) $(CTL_TEST_LIBS)
ALL_TARGETS += $(CTL_LOAD)
CPU_TESTS += 120@$(CTL_LOAD):--ranks:1024
FORMAT_SRCS += tools/ctl_load.c

# Tests: the doctor over the software RDMA device, with a stand-in libnccl.so.2.
DOCTOR_TDIR := $(BUILD)/tests/doctor

$(DOCTOR_TDIR)/nccl/libnccl.so.2: tests/doctor/nccl_stub.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) -shared -Wl,-soname,libnccl.so.2 -o $@ $<

$(DOCTOR_TDIR)/hold: tests/doctor/hold.c
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ $< -ldl

ALL_TARGETS += $(R2CC_TOOL)
TEST_DEPS   += $(R2CC_TOOL) $(DOCTOR_TDIR)/nccl/libnccl.so.2 $(DOCTOR_TDIR)/hold
CPU_TESTS   += 60@tests/doctor/run.sh:$(BUILD)
FORMAT_SRCS += $(R2CC_TOOL_SRCS) tools/doctor.h $(wildcard tools/top.h) tools/pages.h tools/exporter.h tests/doctor/nccl_stub.c tests/doctor/hold.c

# r2cc top against live processes (the drill under the preload).
TEST_DEPS   += $(BUILD)/bin/r2cc-verbs-drill $(BUILD)/tests/preload/verbs_preload
CPU_TESTS   += 60@tests/top/run.sh:$(BUILD)

# r2cc run (tools/run.c): exit status, the child's environment, bad settings refused,
# under the test double of mpirun, and --summary over the soft device and a drill.
TEST_DEPS   += $(R2CC_TOOL) $(BUILD)/tests/preload/verbs_preload \
	       $(BUILD)/tests/preload/verbs_preload_direct $(BUILD)/bin/r2cc-verbs-drill \
	       $(BUILD)/bin/softverbs-ctl $(BUILD)/tests/ncclstub/libnccl.so.2
CPU_TESTS   += 60@tests/run/run.sh:$(BUILD)

# r2cc exporter against a live drill job and fake pages (tests/exporter/run.sh).
$(BUILD)/tests/exporter/fakepage: tests/exporter/fakepage.c shim/stats.h shim/registry.h
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ $<

TEST_DEPS   += $(BUILD)/tests/exporter/fakepage
CPU_TESTS   += 60@tests/exporter/run.sh:$(BUILD)
FORMAT_SRCS += tests/exporter/fakepage.c

# Debian's real Prometheus scraping the exporter through a drill, in `make test-ops`.
OPS_TESTS += 300@tests/ops/prometheus.sh:$(BUILD)
OPS_DEPS  += $(R2CC_TOOL) $(BUILD)/bin/r2cc-verbs-drill $(DRILL_RUNTIME)
