# strategies/: R2CC-AllReduce, the cost model and r2cc-plan.

STRAT_LIB_SRCS := strategies/allreduce2.c strategies/cost.c strategies/failview.c strategies/cuda.c
LIBR2CC_SRCS += $(STRAT_LIB_SRCS)

STRAT_HDRS := strategies/allreduce2.h strategies/cost.h strategies/watch.h shim/cost_params.h \
	      shim/failspec.h shim/log.h
STRAT_TDIR := $(BUILD)/tests/unit
STRAT_TESTS := test_failspec test_strategies_split test_strategies_exec test_strategies_cost \
	       test_strategies_watch
R2CC_PLAN := $(BUILD)/bin/r2cc-plan
R2CC_FIT_COST := $(BUILD)/bin/r2cc-fit-cost

ALL_TARGETS += $(R2CC_PLAN) $(R2CC_FIT_COST)
TEST_DEPS += $(STRAT_TESTS:%=$(STRAT_TDIR)/%) $(R2CC_PLAN) $(R2CC_FIT_COST)
CPU_TESTS += $(STRAT_TESTS:%=60@$(STRAT_TDIR)/%:--jobs=2) \
	30@strategies/plan_test.sh:$(R2CC_PLAN):$(R2CC_FIT_COST)
FORMAT_SRCS += $(STRAT_LIB_SRCS) strategies/allreduce2.h strategies/cost.h strategies/watch.h \
	strategies/cost_fit.c strategies/plan_main.c strategies/fit_cost_main.c \
	tests/unit/test_failspec.c \
	$(wildcard tests/unit/test_strategies_*.c tests/unit/test_strategies_*.h)

$(R2CC_PLAN): strategies/plan_main.c strategies/cost.c strategies/allreduce2.c shim/cost_params.c \
		$(STRAT_HDRS)
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ strategies/plan_main.c strategies/cost.c strategies/allreduce2.c \
		shim/cost_params.c -lm

$(R2CC_FIT_COST): strategies/fit_cost_main.c strategies/cost.c strategies/cost_fit.c \
		shim/cost_params.c $(STRAT_HDRS)
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ strategies/fit_cost_main.c strategies/cost.c \
		strategies/cost_fit.c shim/cost_params.c -lm

$(STRAT_TDIR)/test_failspec: tests/unit/test_failspec.c shim/failspec.c $(STRAT_HDRS)
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ tests/unit/test_failspec.c shim/failspec.c -lcriterion

$(STRAT_TDIR)/test_strategies_split: tests/unit/test_strategies_split.c strategies/allreduce2.c \
		tests/unit/test_strategies_logstub.c $(STRAT_HDRS)
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ tests/unit/test_strategies_split.c strategies/allreduce2.c \
		tests/unit/test_strategies_logstub.c -lcriterion -lm

$(STRAT_TDIR)/test_strategies_exec: tests/unit/test_strategies_exec.c strategies/allreduce2.c \
		tests/unit/test_strategies_double.c tests/unit/test_strategies_double.h \
		tests/unit/test_strategies_logstub.c $(STRAT_HDRS)
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ tests/unit/test_strategies_exec.c strategies/allreduce2.c \
		tests/unit/test_strategies_double.c tests/unit/test_strategies_logstub.c \
		-lcriterion -lm

$(STRAT_TDIR)/test_strategies_cost: tests/unit/test_strategies_cost.c strategies/cost.c \
		strategies/cost_fit.c shim/cost_params.c $(STRAT_HDRS)
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ tests/unit/test_strategies_cost.c strategies/cost.c \
		strategies/cost_fit.c shim/cost_params.c -lcriterion -lm

$(STRAT_TDIR)/test_strategies_watch: tests/unit/test_strategies_watch.c strategies/watch.h
	@mkdir -p $(@D)
	$(CC) $(BIN_CFLAGS) -o $@ tests/unit/test_strategies_watch.c -lcriterion
