# repair/model/qp_shadow: the per-QP shadow of posted work and the exactly-once
# re-post plan (pure code, linked into libr2cc.so through repair/module.mk; its
# unit tests build it on its own). `make shadow-test` runs just those tests.

SHADOW_SRCS := repair/model/qp_shadow.c
SHADOW_HDRS := repair/model/qp_shadow.h
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
	@scripts/ci/run-tests.sh 60@$(BUILD)/tests/unit/test_qp_shadow:--jobs=2 \
	  120@$(BUILD)/tests/unit/test_qp_shadow_model:--jobs=2
