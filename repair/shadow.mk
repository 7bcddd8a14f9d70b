# repair/qp_shadow: the per-QP shadow of posted work and the exactly-once
# re-post plan (pure code; not linked into libr2cc.so until the data path is
# wired). Include this fragment from repair/module.mk to build and run its
# tests with `make test`; until then:
#   make -f Makefile -f repair/shadow.mk shadow-test
# Adding repair/qp_shadow.c to LIBR2CC_SRCS is part of wiring it.

SHADOW_SRCS := repair/qp_shadow.c
SHADOW_HDRS := repair/qp_shadow.h
SHADOW_TESTS := $(BUILD)/tests/unit/test_qp_shadow $(BUILD)/tests/unit/test_qp_shadow_model

$(SHADOW_TESTS): $(BUILD)/tests/unit/%: tests/unit/%.c $(SHADOW_SRCS) $(SHADOW_HDRS)
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ $< $(SHADOW_SRCS) -lcriterion

TEST_DEPS += $(SHADOW_TESTS)
CPU_TESTS += 60@$(BUILD)/tests/unit/test_qp_shadow:--jobs=2 \
	     120@$(BUILD)/tests/unit/test_qp_shadow_model:--jobs=2
FORMAT_SRCS += $(SHADOW_SRCS) $(SHADOW_HDRS) tests/unit/test_qp_shadow.c \
	       tests/unit/test_qp_shadow_model.c

.PHONY: shadow-test
shadow-test: $(SHADOW_TESTS)
	@scripts/run-tests.sh 60@$(BUILD)/tests/unit/test_qp_shadow:--jobs=2 \
	  120@$(BUILD)/tests/unit/test_qp_shadow_model:--jobs=2
