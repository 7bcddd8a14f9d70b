# tests/fault: the fault-injection walk (shim/fault.h, tests/fault/walk.sh). CI walks
# 8 injection points of each kind, spread over its calls, each failing once, 4 of each
# failing from then on (kind:N+), and 6 of each over the GPU flush scenario
# (WALK_SCENARIO=flush); `make fault-walk` walks all of them once and writes the table
# to logs/fault/walk.txt. vcq_oom fails each allocation of a virtual
# CQ's life in turn (tests/fault/vcq_oom.c): the library's objects without the verbs
# interposer, with its --wrap of the allocator.
VCQ_OOM := $(BUILD)/tests/fault/vcq_oom
$(VCQ_OOM): tests/fault/vcq_oom.c $(filter-out %/intercept/verbs.o,$(LIBR2CC_SRCS:%.c=$(BUILD)/obj/%.o))
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ $^ $(LIBR2CC_LIBS)

TEST_DEPS += $(BUILD)/bin/r2cc-verbs-drill $(VCQ_OOM)
CPU_TESTS += 300@tests/fault/walk.sh:$(BUILD):8 300@tests/fault/walk.sh:$(BUILD):4::+ 60@$(VCQ_OOM) \
	     300@env:WALK_SCENARIO=flush:tests/fault/walk.sh:$(BUILD):6
FORMAT_SRCS += tests/fault/vcq_oom.c

.PHONY: fault-walk
fault-walk: all
	@mkdir -p logs/fault
	nice tests/fault/walk.sh $(BUILD) 0 logs/fault/walk.txt
