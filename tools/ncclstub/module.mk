# tools/ncclstub: the NCCL test double (libnccl.so.2, and a 2.18-like one under old/)
# that r2cc-verbs-drill's --nccl-stub forms its communicators through, and the net
# plugin of the project's own (testnet.c) it loads with --net-plugin testnet. The
# pass-through test over them is tests/ncclstub (see tests/ncclstub/README.md).
# The outputs stay in $(BUILD)/tests/ncclstub, where the drill, the installed tree and
# the pass-through test find them (the plugin beside the stub, on its library path).

NCCLSTUB_DIR  := $(BUILD)/tests/ncclstub
NCCLSTUB_HDR  := tools/ncclstub/ncclstub.h tools/ncclstub/ncclstub_calls.def
NCCLSTUB_LIBS := $(NCCLSTUB_DIR)/libnccl.so.2 $(NCCLSTUB_DIR)/old/libnccl.so.2

# The stub's soname is that of real NCCL, so a program finds it the way an application
# finds libnccl.so.2 (through its $ORIGIN runpath, for the pass-through test).
$(NCCLSTUB_DIR)/libnccl.so.2: tools/ncclstub/ncclstub.c $(NCCLSTUB_HDR)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) -shared -Wl,-soname,libnccl.so.2 -Wl,-z,defs -o $@ $<

$(NCCLSTUB_DIR)/old/libnccl.so.2: tools/ncclstub/ncclstub.c $(NCCLSTUB_HDR)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) -DNCCLSTUB_OLD -shared -Wl,-soname,libnccl.so.2 -Wl,-z,defs -o $@ $<

# A net plugin of the project's own (testnet.c), which the stub loads as NCCL loads one
# (NCCL_NET_PLUGIN=testnet): for the tests of what R2CC says of the network NCCL chose.
$(NCCLSTUB_DIR)/libnccl-net-testnet.so: tools/ncclstub/testnet.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) -fvisibility=hidden -shared -o $@ $<

$(NCCLSTUB_DIR)/libnccl.so $(NCCLSTUB_DIR)/old/libnccl.so: %/libnccl.so: %/libnccl.so.2
	ln -sf libnccl.so.2 $@

ALL_TARGETS += $(NCCLSTUB_LIBS) $(NCCLSTUB_DIR)/libnccl-net-testnet.so
FORMAT_SRCS += tools/ncclstub/ncclstub.h tools/ncclstub/ncclstub.c tools/ncclstub/testnet.c
