# tests/fuzz: libFuzzer targets (clang) for every parser of bytes from outside the
# process and every setting's parser, plus a Python harness for the scenario result
# reader (tests/fuzz/README.md). Built where clang has libFuzzer (scripts/deps.sh
# installs it), into $(BUILD)/fuzz with ASan + UBSan.
#   make fuzz [FUZZ_SECONDS=N]   each target N seconds (default 600), corpus kept in
#                                $(BUILD)/fuzz/corpus, crashes in $(BUILD)/fuzz/crash
#   make test                    each target 5 s over its seeds and regression inputs

FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 600
FUZZ_DIR     := $(BUILD)/fuzz
FUZZ_NAMES   := ctl_frame ctl_uid ctl_dir mr_mirror rep_wire settings
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_CFLAGS   = $(CSTD) -O1 -g $(WARN) -I. $(if $(CUDA_INC),-isystem $(CUDA_INC)) \
		$(if $(NCCL_INC),-isystem $(NCCL_INC)) -pthread -fsanitize=fuzzer-no-link $(FUZZ_SAN) \
		-DR2CC_VERSION_STRING='"fuzz"'
# The library without its interposed entry points (the fuzzer must not interpose itself)
# and the NCCL-level failure view that calls them.
FUZZ_LIB_SRCS = $(filter-out intercept/% strategies/failview.c shim/fault_alloc.c,$(LIBR2CC_SRCS))
FUZZ_LIB_OBJS = $(FUZZ_LIB_SRCS:%.c=$(FUZZ_DIR)/obj/%.o)
FUZZ_BINS    := $(FUZZ_NAMES:%=$(FUZZ_DIR)/fuzz_%)
FUZZ_HAVE    := $(if $(shell command -v $(FUZZ_CC) 2>/dev/null),$(wildcard $(shell $(FUZZ_CC) \
		  -print-file-name=libclang_rt.fuzzer-x86_64.a 2>/dev/null)))

$(FUZZ_DIR)/obj/%.o: %.c
	@mkdir -p $(@D)
	@echo "  FUZZCC $<"; $(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -c -o $@ $<

$(FUZZ_DIR)/fuzz_%: $(FUZZ_DIR)/obj/tests/fuzz/fuzz_%.o $(FUZZ_LIB_OBJS)
	$(FUZZ_CC) -fsanitize=fuzzer $(FUZZ_SAN) -o $@ $^ -ldl -lpthread -lcrypto -lm

-include $(wildcard $(FUZZ_DIR)/obj/*/*.d $(FUZZ_DIR)/obj/*/*/*.d)

.PHONY: fuzz
ifneq ($(FUZZ_HAVE),)
# make test-asan-ci runs no fuzz target (make test runs them, with ASan + UBSan): it
# builds none (FUZZ_BUILD=0).
ifneq ($(FUZZ_BUILD),0)
TEST_DEPS += $(FUZZ_BINS)
endif
CPU_TESTS += 150@tests/fuzz/run.sh:$(FUZZ_DIR):5
fuzz: deps
	@$(MAKE) --no-print-directory $(FUZZ_BINS)
	@nice tests/fuzz/run.sh $(FUZZ_DIR) $(FUZZ_SECONDS) keep
else
CPU_TESTS += 60@tests/fuzz/results_fuzz.py:5
fuzz:
	@echo "make fuzz: $(FUZZ_CC) with libFuzzer is missing (scripts/deps.sh installs it)"; false
endif
FORMAT_SRCS += $(wildcard tests/fuzz/*.c)

# The seed corpora, written by the library's own encoders (after a wire-format change).
FUZZ_SEEDS_SRCS = tests/fuzz/seeds.c $(FUZZ_LIB_SRCS)
.PHONY: fuzz-seeds
fuzz-seeds:
	@mkdir -p $(FUZZ_DIR)
	$(CC) $(BIN_CFLAGS) -DR2CC_VERSION_STRING='"seeds"' -o $(FUZZ_DIR)/seeds $(FUZZ_SEEDS_SRCS) \
		-ldl -lpthread -lcrypto -lm
	$(FUZZ_DIR)/seeds tests/fuzz/corpus
