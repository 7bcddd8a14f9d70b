# tests/fault: the fault-injection walk (shim/fault.h, tests/fault/walk.sh). CI walks
# every 7th injection point of each kind; `make fault-walk` walks all of them and
# writes the table to logs/fault/walk.txt.
TEST_DEPS += $(BUILD)/bin/r2cc-verbs-drill
CPU_TESTS += 180@tests/fault/walk.sh:$(BUILD):7

.PHONY: fault-walk
fault-walk: all
	@mkdir -p logs/fault
	nice tests/fault/walk.sh $(BUILD) 1 logs/fault/walk.txt
