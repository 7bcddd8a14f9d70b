# repair: sources and targets of this folder (see the top Makefile).

# Control plane (repair/ctl*.c): the control thread, rendezvous, directory and
# authenticated peer messages. Its tests compile these sources directly.
REPAIR_CTL_SRCS := repair/ctl.c repair/ctl_msg.c repair/ctl_uid.c repair/ctl_iface.c repair/hmap.c \
		   repair/ctl_dir.c
REPAIR_CTL_HDRS := repair/ctl.h repair/ctl_msg.h repair/ctl_priv.h repair/hmap.h
REPAIR_ENGINE_SRCS := $(addprefix repair/,engine.c rqp.c detect.c scan.c localise.c fence.c placement.c path.c wire.c \
			 exchange.c migrate.c vcq.c post.c failback.c incident.c gpuflush.c cts.c drill.c hook.c)
LIBR2CC_SRCS += $(REPAIR_CTL_SRCS) repair/job.c $(REPAIR_ENGINE_SRCS) repair/qp_shadow.c repair/ledger.c repair/stall.c \
		repair/peer.c
LIBR2CC_LIBS += -lcrypto

CTL_TEST_SRCS := $(REPAIR_CTL_SRCS) shim/log.c shim/params.c shim/failspec.c shim/drillspec.c shim/cost_params.c shim/fault.c
CTL_TEST_LIBS := -lcrypto -ldl
CTL_UNIT_TESTS := $(BUILD)/tests/unit/test_ctl_msg $(BUILD)/tests/unit/test_ctl_live
CTL_MULTI := $(BUILD)/tests/ctl/ctl_multi

$(CTL_UNIT_TESTS): $(BUILD)/tests/unit/%: tests/unit/%.c $(CTL_TEST_SRCS) $(REPAIR_CTL_HDRS)
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ $< $(CTL_TEST_SRCS) -lcriterion $(CTL_TEST_LIBS)

$(CTL_MULTI): tests/ctl/ctl_multi.c $(CTL_TEST_SRCS) $(REPAIR_CTL_HDRS)
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ $< $(CTL_TEST_SRCS) $(CTL_TEST_LIBS)

# r2cc-ctl-load: many simulated ranks against this control plane (tests/ctl/ctl_load.c).
CTL_LOAD := $(BUILD)/bin/r2cc-ctl-load
$(CTL_LOAD): tests/ctl/ctl_load.c $(CTL_TEST_SRCS) $(REPAIR_CTL_HDRS)
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ $< $(CTL_TEST_SRCS) $(CTL_TEST_LIBS)
ALL_TARGETS += $(CTL_LOAD)
CPU_TESTS += 120@$(CTL_LOAD):--ranks:1024

# The peer search (repair/peer.c) across processes: colliding QP numbers, IB and RoCE.
PEER_MULTI := $(BUILD)/tests/ctl/peer_multi
$(PEER_MULTI): tests/ctl/peer_multi.c repair/peer.c repair/peer.h $(CTL_TEST_SRCS) $(REPAIR_CTL_HDRS)
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ $< repair/peer.c $(CTL_TEST_SRCS) $(CTL_TEST_LIBS)
TEST_DEPS += $(PEER_MULTI)
CPU_TESTS += 60@$(PEER_MULTI):4:ib 60@$(PEER_MULTI):8:roce 60@$(PEER_MULTI):16:ib \
	     60@$(PEER_MULTI):16:roce

# The live test measures latencies and CPU time: one test at a time.
TEST_DEPS += $(CTL_UNIT_TESTS) $(CTL_MULTI)
CPU_TESTS += 60@$(BUILD)/tests/unit/test_ctl_msg:--jobs=2 \
	     60@$(BUILD)/tests/unit/test_ctl_live:--jobs=1 \
	     60@$(CTL_MULTI):dir:2 60@$(CTL_MULTI):dir:4 60@$(CTL_MULTI):dir:8 \
	     60@$(CTL_MULTI):badkey 60@$(CTL_MULTI):garbage 60@$(CTL_MULTI):timeout
FORMAT_SRCS += $(REPAIR_CTL_SRCS) $(REPAIR_CTL_HDRS) $(REPAIR_ENGINE_SRCS) repair/engine.h repair/engine_priv.h repair/stall.c repair/stall.h \
	       repair/peer.c repair/peer.h \
	       $(wildcard tests/unit/test_ctl_*.c) \
	       $(wildcard tests/ctl/*.c)
include repair/shadow.mk
include repair/mirror.mk
