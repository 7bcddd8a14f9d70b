# tests/softverbs: the tests of the software RDMA device (softverbs/, its README says
# how to run them).
#   $(BUILD)/tests/softverbs/{unit,compat,conformance,roce}  its test programs

SV_TESTS_DIR := tests/softverbs
SV_TDIR  := $(BUILD)/tests/softverbs
SV_TOBJ  := $(SV_TDIR)/obj
SV_UNIT  := $(SV_TDIR)/unit
SV_CONF  := $(SV_TDIR)/conformance
SV_ROCE  := $(SV_TDIR)/roce
SV_COMPAT := $(SV_TDIR)/compat
# Test programs link against the device itself and find it next to them at run time.
SV_TLIBS    := -L$(SV_OUT) -libverbs -Wl,-rpath,'$$ORIGIN/../../softverbs' -ldl

$(SV_TOBJ)/%.o: $(SV_TESTS_DIR)/%.c
	@mkdir -p $(@D)
	$(CC) $(SV_CFLAGS) -MMD -MP -c -o $@ $<

$(SV_UNIT): $(SV_TOBJ)/test_unit.o $(SV_LINK)
	@mkdir -p $(@D)
	$(CC) -o $@ $(SV_TOBJ)/test_unit.o $(SV_TLIBS) -lcriterion -pthread

$(SV_COMPAT): $(SV_TOBJ)/test_compat.o $(SV_LINK)
	@mkdir -p $(@D)
	$(CC) -o $@ $(SV_TOBJ)/test_compat.o $(SV_TLIBS) -lcriterion -pthread

# conformance.c has the test table and main; the tests are in one file per verbs area.
SV_CONF_OBJS := $(patsubst %,$(SV_TOBJ)/conformance%.o,_peer _rdma _send _qp _cq _shaping \
                  _faults _loss _device) $(SV_TOBJ)/conformance.o $(SV_TOBJ)/harness.o

$(SV_CONF): $(SV_CONF_OBJS) $(SV_LINK) $(SV_CTL)
	@mkdir -p $(@D)
	$(CC) -o $@ $(SV_CONF_OBJS) $(SV_TLIBS) -pthread

$(SV_ROCE): $(SV_TOBJ)/roce_test.o $(SV_TOBJ)/harness.o $(SV_LINK) $(SV_CTL)
	@mkdir -p $(@D)
	$(CC) -o $@ $(SV_TOBJ)/roce_test.o $(SV_TOBJ)/harness.o $(SV_TLIBS) -pthread

-include $(SV_TOBJ)/*.d

TEST_DEPS   += $(SV_UNIT) $(SV_COMPAT) $(SV_CONF) $(SV_ROCE)
CPU_TESTS   += 60@$(SV_UNIT) 60@$(SV_COMPAT) 150@$(SV_CONF) 60@$(SV_ROCE) 30@$(SV_TESTS_DIR)/topo_check.py \
               30@$(SV_LIMITS)
# rdma-core's own programs over the device (scripts/deps.sh installs them): every one
# loads, ibv_*_pingpong and perftest between two emulated nodes.
CPU_TESTS   += 60@$(SV_TESTS_DIR)/abi.sh:$(BUILD) 60@$(SV_TESTS_DIR)/pingpong.sh:$(BUILD) \
               240@$(SV_TESTS_DIR)/perftest.sh:$(BUILD)

# More perftest runs than make test makes: make softverbs-perftest SV_PERFTEST_RUNS=20
SV_PERFTEST_RUNS ?= 10
.PHONY: softverbs-perftest
softverbs-perftest: $(SV_LINK) $(SV_CTL)
	$(SV_TESTS_DIR)/perftest.sh $(BUILD) $(SV_PERFTEST_RUNS)
FORMAT_SRCS += $(wildcard $(SV_TESTS_DIR)/*.c $(SV_TESTS_DIR)/*.h)
