# tests/fault: the fault-injection walk (shim/fault.h, tests/fault/walk.sh). CI walks
# 8 injection points of each kind, spread over its calls; `make fault-walk` walks all
# of them and writes the table to logs/fault/walk.txt.
TEST_DEPS += $(BUILD)/bin/r2cc-verbs-drill
CPU_TESTS += 300@tests/fault/walk.sh:$(BUILD):8

.PHONY: fault-walk
fault-walk: all
	@mkdir -p logs/fault
	nice tests/fault/walk.sh $(BUILD) 0 logs/fault/walk.txt
