# ctl: the control plane (see the top Makefile): the control thread, rendezvous,
# directory, authenticated peer messages and the job's table (job.c). Linked into
# libr2cc.so; its tests (and r2cc-ctl-load, tools/module.mk) compile these sources
# directly, without the engine.
CTL_SRCS := ctl/ctl.c ctl/ctl_loop.c ctl/ctl_conn.c ctl/ctl_rdv.c ctl/ctl_req.c ctl/ctl_msg.c ctl/ctl_uid.c ctl/ctl_iface.c ctl/hmap.c ctl/ctl_dir.c
CTL_HDRS := ctl/ctl.h ctl/ctl_msg.h ctl/ctl_priv.h ctl/ctl_thread.h ctl/hmap.h
LIBR2CC_SRCS += $(CTL_SRCS) ctl/job.c
LIBR2CC_LIBS += -lcrypto

CTL_TEST_SRCS := $(CTL_SRCS) shim/log.c shim/params.c shim/failspec.c shim/drillspec.c shim/cost_params.c shim/fault.c
CTL_TEST_LIBS := -lcrypto -ldl
CTL_UNIT_TESTS := $(BUILD)/tests/unit/test_ctl_msg $(BUILD)/tests/unit/test_ctl_live
CTL_MULTI := $(BUILD)/tests/ctl/ctl_multi

$(CTL_UNIT_TESTS): $(BUILD)/tests/unit/%: tests/unit/%.c $(CTL_TEST_SRCS) $(CTL_HDRS)
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ $< $(CTL_TEST_SRCS) -lcriterion $(CTL_TEST_LIBS)

$(CTL_MULTI): tests/ctl/ctl_multi.c $(CTL_TEST_SRCS) $(CTL_HDRS)
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ $< $(CTL_TEST_SRCS) $(CTL_TEST_LIBS)

# The live test measures latencies and CPU time: one test at a time.
TEST_DEPS += $(CTL_UNIT_TESTS) $(CTL_MULTI)
CPU_TESTS += 60@$(BUILD)/tests/unit/test_ctl_msg:--jobs=2 \
	     60@$(BUILD)/tests/unit/test_ctl_live:--jobs=1 \
	     60@$(CTL_MULTI):dir:2 60@$(CTL_MULTI):dir:4 60@$(CTL_MULTI):dir:8 \
	     60@$(CTL_MULTI):badkey 60@$(CTL_MULTI):garbage 60@$(CTL_MULTI):timeout
FORMAT_SRCS += $(CTL_SRCS) $(CTL_HDRS) $(wildcard tests/unit/test_ctl_*.c) $(wildcard tests/ctl/*.c)
