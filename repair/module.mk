# repair: sources and targets of this folder (see the top Makefile): the hot-repair
# engine, and under model/ its models (qp_shadow, mr_mirror, cts, ledger, stall).
REPAIR_ENGINE_SRCS := $(addprefix repair/,engine.c rqp.c detect.c scan.c localise.c farprobe.c fence.c placement.c path.c wire.c \
			 exchange.c migrate.c vcq.c post.c failback.c incident.c gpuflush.c landed.c model/cts.c drill.c hook.c)
LIBR2CC_SRCS += $(REPAIR_ENGINE_SRCS) repair/model/qp_shadow.c repair/model/ledger.c repair/model/stall.c \
		repair/peer.c

# The peer search (repair/peer.c) across processes: colliding QP numbers, IB and RoCE.
PEER_MULTI := $(BUILD)/tests/ctl/peer_multi
$(PEER_MULTI): tests/ctl/peer_multi.c repair/peer.c repair/peer.h $(CTL_TEST_SRCS) $(CTL_HDRS)
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ $< repair/peer.c $(CTL_TEST_SRCS) $(CTL_TEST_LIBS)
TEST_DEPS += $(PEER_MULTI)
CPU_TESTS += 60@$(PEER_MULTI):4:ib 60@$(PEER_MULTI):8:roce 60@$(PEER_MULTI):16:ib \
	     60@$(PEER_MULTI):16:roce

FORMAT_SRCS += $(REPAIR_ENGINE_SRCS) repair/engine.h repair/engine_priv.h repair/model/stall.c repair/model/stall.h \
	       repair/peer.c repair/peer.h
include repair/model/shadow.mk
include repair/model/mirror.mk
