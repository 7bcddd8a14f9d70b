# tests/ncclstub: the NCCL pass-through test (see tests/ncclstub/README.md). A test double of
# NCCL (libnccl.so.2, and a 2.18-like one under old/) and a program linked against it that
# checks every NCCL call, bare and under LD_PRELOAD=$(LIBR2CC).
#
# NCCLSTUB_EXPECT_WRAPPED=1 adds the entry that requires libr2cc.so to interpose the NCCL
# functions docs/architecture.md (Interposition facts) lists (switch it on once the wrappers are in).

NCCLSTUB_EXPECT_WRAPPED ?= 1

NCCLSTUB_DIR  := $(BUILD)/tests/ncclstub
NCCLSTUB_HDR  := tests/ncclstub/ncclstub.h
NCCLSTUB_LIBS := $(NCCLSTUB_DIR)/libnccl.so.2 $(NCCLSTUB_DIR)/old/libnccl.so.2
NCCLSTUB_BINS := $(NCCLSTUB_DIR)/passthrough $(NCCLSTUB_DIR)/old/passthrough
NCCLSTUB_RUN  := tests/ncclstub/run.sh:$(NCCLSTUB_DIR):$(LIBR2CC)

# The stub's soname is that of real NCCL, so the program finds it the way an application
# finds libnccl.so.2 (through its $ORIGIN runpath here).
$(NCCLSTUB_DIR)/libnccl.so.2: tests/ncclstub/ncclstub.c $(NCCLSTUB_HDR)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) -shared -Wl,-soname,libnccl.so.2 -Wl,-z,defs -o $@ $<

$(NCCLSTUB_DIR)/old/libnccl.so.2: tests/ncclstub/ncclstub.c $(NCCLSTUB_HDR)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) -DNCCLSTUB_OLD -shared -Wl,-soname,libnccl.so.2 -Wl,-z,defs -o $@ $<

# A net plugin of the project's own (testnet.c), which the stub loads as NCCL loads one
# (NCCL_NET_PLUGIN=testnet): for the tests of what R2CC says of the network NCCL chose.
$(NCCLSTUB_DIR)/libnccl-net-testnet.so: tests/ncclstub/testnet.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) -fvisibility=hidden -shared -o $@ $<

$(NCCLSTUB_DIR)/libnccl.so $(NCCLSTUB_DIR)/old/libnccl.so: %/libnccl.so: %/libnccl.so.2
	ln -sf libnccl.so.2 $@

$(NCCLSTUB_DIR)/passthrough: tests/ncclstub/passthrough.c $(NCCLSTUB_HDR) \
		$(NCCLSTUB_DIR)/libnccl.so
	$(CC) $(BIN_CFLAGS) -o $@ $< -L$(@D) -lnccl -Wl,-rpath,'$$ORIGIN' -ldl

$(NCCLSTUB_DIR)/old/passthrough: tests/ncclstub/passthrough.c $(NCCLSTUB_HDR) \
		$(NCCLSTUB_DIR)/old/libnccl.so
	$(CC) $(BIN_CFLAGS) -DNCCLSTUB_OLD -o $@ $< -L$(@D) -lnccl -Wl,-rpath,'$$ORIGIN' -ldl

ALL_TARGETS += $(NCCLSTUB_LIBS) $(NCCLSTUB_BINS) $(NCCLSTUB_DIR)/libnccl-net-testnet.so
TEST_DEPS   += $(NCCLSTUB_LIBS) $(NCCLSTUB_BINS) $(LIBR2CC)
CPU_TESTS   += 60@$(NCCLSTUB_RUN):direct \
	       60@$(NCCLSTUB_RUN):preload:0 \
	       60@$(NCCLSTUB_RUN):preload:2 \
	       60@$(NCCLSTUB_RUN):old:2 \
	       60@$(NCCLSTUB_RUN):negative
ifeq ($(NCCLSTUB_EXPECT_WRAPPED),1)
CPU_TESTS   += 60@$(NCCLSTUB_RUN):wrapped:2
endif
FORMAT_SRCS += tests/ncclstub/ncclstub.h tests/ncclstub/ncclstub.c tests/ncclstub/passthrough.c tests/ncclstub/testnet.c
