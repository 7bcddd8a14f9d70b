# tests/ncclstub: the NCCL pass-through test (see tests/ncclstub/README.md). A program
# linked against NCCL's test double (tools/ncclstub: libnccl.so.2, and a 2.18-like one
# under old/) that checks every NCCL call, bare and under LD_PRELOAD=$(LIBR2CC).
#
# NCCLSTUB_EXPECT_WRAPPED=1 adds the entry that requires libr2cc.so to interpose the NCCL
# functions docs/architecture.md (Interposition facts) lists (switch it on once the wrappers are in).

NCCLSTUB_EXPECT_WRAPPED ?= 1

NCCLSTUB_BINS := $(NCCLSTUB_DIR)/passthrough $(NCCLSTUB_DIR)/old/passthrough
NCCLSTUB_RUN  := tests/ncclstub/run.sh:$(NCCLSTUB_DIR):$(LIBR2CC)

$(NCCLSTUB_DIR)/passthrough: tests/ncclstub/passthrough.c $(NCCLSTUB_HDR) \
		$(NCCLSTUB_DIR)/libnccl.so
	$(CC) $(BIN_CFLAGS) -o $@ $< -L$(@D) -lnccl -Wl,-rpath,'$$ORIGIN' -ldl

$(NCCLSTUB_DIR)/old/passthrough: tests/ncclstub/passthrough.c $(NCCLSTUB_HDR) \
		$(NCCLSTUB_DIR)/old/libnccl.so
	$(CC) $(BIN_CFLAGS) -DNCCLSTUB_OLD -o $@ $< -L$(@D) -lnccl -Wl,-rpath,'$$ORIGIN' -ldl

ALL_TARGETS += $(NCCLSTUB_BINS)
TEST_DEPS   += $(NCCLSTUB_LIBS) $(NCCLSTUB_BINS) $(LIBR2CC)
CPU_TESTS   += 60@$(NCCLSTUB_RUN):direct \
	       60@$(NCCLSTUB_RUN):preload:0 \
	       60@$(NCCLSTUB_RUN):preload:2 \
	       60@$(NCCLSTUB_RUN):old:2 \
	       60@$(NCCLSTUB_RUN):negative
ifeq ($(NCCLSTUB_EXPECT_WRAPPED),1)
CPU_TESTS   += 60@$(NCCLSTUB_RUN):wrapped:2
endif
FORMAT_SRCS += tests/ncclstub/passthrough.c
