# tests/sanitize: the CPU suite under sanitizers, each in a build folder of its own
# (README: Tests, "Sanitizers").
#   make test-asan   every CPU test, libr2cc.so, the software device and every test
#                    program built with AddressSanitizer + UndefinedBehaviorSanitizer
#   make test-asan-ci  the same without the drill's hot-repair cases (what CI runs)
#   make test-tsan   ThreadSanitizer: the control-plane tests and the drill (the repair
#                    engine's threads against the drill's proxy and async-event threads),
#                    also by symbol (r2cc-verbs-drill-direct) and with the network check
# Programs that preload libr2cc.so themselves (the drill, tests/*/run.sh) put
# R2CC_TEST_PRELOAD in front of it: here the sanitizer's runtime, which must be the
# first library of a process.

ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
SAN_UBSAN  := -fsanitize=undefined -fno-sanitize-recover=all
SAN_ASAN   := -fsanitize=address $(SAN_UBSAN) -fno-omit-frame-pointer
# -Wno-tsan: gcc warns at every atomic fence, which TSan does not model.
SAN_TSAN   := -fsanitize=thread -Wno-tsan
# nvcc cannot link sanitized objects: r2cc-perf (a GPU program) is left out.
SAN_MAKE    = $(MAKE) --no-print-directory NVCC=/nonexistent OPT="-O1 -g"
ASAN_ENV   := ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:detect_stack_use_after_return=0:verify_asan_link_order=0 \
	      UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
TSAN_ENV   := TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/sanitize/tsan.supp"

# The control-plane tests and the drill's repair cases. Criterion's test runner cannot
# start under TSan (its shared arena clashes with TSan's memory layout), so the
# control plane runs through ctl_multi (several processes, every thread of the control
# plane) and the MR mirror end to end; the drill runs with transport timeouts x 10
# (--time-scale 0.1) because TSan slows every thread 5-15x and the soft NIC's retry
# timeout would otherwise expire before a repair under TSan completes. The black hole on
# every NIC ends on the transport timeouts, x 10 too: its bound and deadline are 40 and
# 60 s here. --kill-peer is left out: under TSan's slowdown the kill sometimes finds the
# survivor with nothing outstanding towards the dead peer (receives posted, sends held
# for its clear-to-send: 1 of 3 runs of seed 2), which sends no request and waits, as
# under plain NCCL (tools/drill/README.md, after the clean-error cases).
TSAN_DRILL := $(TSAN_BUILD)/bin/r2cc-verbs-drill
TSAN_TESTS := 60@$(TSAN_BUILD)/tests/ctl/ctl_multi:dir:2 60@$(TSAN_BUILD)/tests/ctl/ctl_multi:dir:8 \
	      60@$(TSAN_BUILD)/tests/ctl/ctl_multi:badkey 60@$(TSAN_BUILD)/tests/ctl/ctl_multi:garbage \
	      60@$(TSAN_BUILD)/tests/ctl/ctl_multi:timeout 120@tests/mirror/run.sh \
	      180@$(TSAN_DRILL):--fault:none:--seeds:2:--time-scale:0.1 \
	      300@$(TSAN_DRILL):--fault:down:--seeds:10:--nccl-stub:--time-scale:0.1 \
	      300@$(TSAN_DRILL):--fault:blackhole:--seeds:5:--nccl-stub:--time-scale:0.1 \
	      300@$(TSAN_DRILL):--fault:flap:--seeds:5:--nccl-stub:--time-scale:0.1 \
	      300@$(TSAN_DRILL):--fault:ackloss:--seeds:4:--nccl-stub:--time-scale:0.1 \
	      300@$(TSAN_DRILL):--fault:blackhole-tx:--link:roce:--procs:4:--seeds:3:--nccl-stub:--time-scale:0.1 \
	      300@$(TSAN_DRILL):--fault:blackhole:--fault-nics:all:--nics:2:--expect:clean-error:--bound:40:--timeout:60:--seeds:3:--nccl-stub:--time-scale:0.1 \
	      300@$(TSAN_DRILL):--fault:down:--seeds:3:--procs:4:--nics:2:--nccl-stub:--time-scale:0.1 \
	      300@$(TSAN_DRILL):--fault:down:--seeds:5:--flush:--nccl-stub:--time-scale:0.1 \
	      300@$(TSAN_DRILL):--fault:down:--seeds:3:--fresh-mr:--nccl-stub:--time-scale:0.1 \
	      300@$(TSAN_DRILL):--fault:down:--restore:300:--seeds:3:--messages:512:--nccl-stub:--time-scale:0.1 \
	      300@$(TSAN_DRILL):--fault:down:--second-fault:50:--restore:300:--qps:2:--seeds:2:--messages:512:--nccl-stub:--time-scale:0.1 \
	      300@$(TSAN_DRILL):--fault:down:--churn:--seeds:3:--messages:512:--nccl-stub:--time-scale:0.1 \
	      300@$(TSAN_DRILL):--fault:blackhole:--churn:--seeds:3:--messages:512:--nccl-stub:--time-scale:0.1 \
	      300@$(TSAN_DRILL):--fault:fatal:--fault-phase:connect:--procs:4:--flush:--seeds:2:--nccl-stub:--time-scale:0.1 \
	      300@$(TSAN_DRILL):--fault:fatal:--second-fault:0:--flush:--seeds:4:--nccl-stub:--time-scale:0.1 \
	      300@$(TSAN_DRILL):--fault:down:--flush:--no-fusion:--qps:2:--procs:4:--seeds:3:--nccl-stub:--time-scale:0.1 \
	      300@$(TSAN_DRILL):--fault:fatal:--seeds:6:--second-fault:2:--flush:--no-fusion:--qps:2:--nccl-stub:--time-scale:0.1 \
	      300@$(TSAN_BUILD)/bin/r2cc-verbs-drill-direct:--fault:down:--seeds:3:--mlx5dv:plain:--flush:--nccl-stub:--time-scale:0.1 \
	      300@$(TSAN_BUILD)/bin/r2cc-verbs-drill-direct:--fault:blackhole:--link:roce:--procs:4:--seeds:2:--nccl-stub:--time-scale:0.1 \
	      120@env:TESTNET_NAME=UCX:$(TSAN_DRILL):--fault:none:--seeds:2:--nccl-stub:--net-plugin:testnet:--expect-unprotected:UCX:--time-scale:0.1

# What CI runs under ASan (.ci/run): every CPU test except the drill's hot-repair cases
# (the --nccl-stub ones, and stall-matrix.sh, link-matrix.sh, inject-compare.sh and the
# incident hook's test, which run them), whose repair
# timing fails intermittently under ASan's slowdown on a loaded 2-core machine, and the
# software device's conformance test, which asserts shaped rates that ASan's slower
# copies miss (README, "Hardening: what was run"). Also left out: the tests whose code
# under test no sanitizer build changes: the fuzz targets (built with ASan + UBSan in
# make test already), the NCCL-compatibility test (fake NCCL libraries and a stand-in
# libr2cc.so), the scenario scripts' test (test doubles) and the plot script's.
ASAN_CI_TESTS = $(filter-out %--nccl-stub %--nccl-stub:--timeout:5 %/softverbs/conformance \
		  %:$(STALL_KINDS) %/link-matrix.sh:$(BUILD):3 \
		  %/link-matrix.sh:$(BUILD):1:-:r2cc-verbs-drill-direct \
		  %/inject-compare.sh:$(BUILD):$(INJECT_SEEDS):1 %/hook/run.sh:$(BUILD) \
		  %/fuzz/run.sh:$(FUZZ_DIR):5 %/compat/run.sh %/scenarios/run.sh %/plot/run.sh,$(CPU_TESTS))

.PHONY: test-build test-run test-run-ci test-asan test-asan-ci test-tsan

# What `make test` builds and runs, for a given BUILD (used by the targets below).
test-build: all $(TEST_DEPS)
test-run:
	@scripts/ci/run-tests.sh $(CPU_TESTS)
test-run-ci:
	@scripts/ci/run-tests.sh $(ASAN_CI_TESTS)

# The sanitizer builds reuse the headers scripts/deps.sh may have unpacked into build/deps.
san-deps-%:
	@mkdir -p $*
	@if [ -d build/deps ] && [ ! -e $*/deps ]; then ln -s ../build/deps $*/deps; fi

test-asan: deps san-deps-$(ASAN_BUILD)
	@$(SAN_MAKE) BUILD=$(ASAN_BUILD) CC="$(CC) $(SAN_ASAN)" CXX="$(CXX) $(SAN_ASAN)" -j$(BUILD_JOBS) test-build
	@BUILD=$(ASAN_BUILD) R2CC_TEST_PRELOAD=$$($(CC) -print-file-name=libasan.so) $(ASAN_ENV) \
	  $(SAN_MAKE) BUILD=$(ASAN_BUILD) CC="$(CC) $(SAN_ASAN)" CXX="$(CXX) $(SAN_ASAN)" test-run

test-asan-ci: deps san-deps-$(ASAN_BUILD)
	@$(SAN_MAKE) BUILD=$(ASAN_BUILD) CC="$(CC) $(SAN_ASAN)" CXX="$(CXX) $(SAN_ASAN)" FUZZ_BUILD=0 -j$(BUILD_JOBS) test-build
	@BUILD=$(ASAN_BUILD) R2CC_TEST_PRELOAD=$$($(CC) -print-file-name=libasan.so) $(ASAN_ENV) \
	  $(SAN_MAKE) BUILD=$(ASAN_BUILD) CC="$(CC) $(SAN_ASAN)" CXX="$(CXX) $(SAN_ASAN)" test-run-ci

test-tsan: deps san-deps-$(TSAN_BUILD)
	@$(SAN_MAKE) BUILD=$(TSAN_BUILD) CC="$(CC) $(SAN_TSAN)" CXX="$(CXX) $(SAN_TSAN)" -j$(BUILD_JOBS) test-build
	@BUILD=$(TSAN_BUILD) R2CC_TEST_PRELOAD=$$($(CC) -print-file-name=libtsan.so) $(TSAN_ENV) \
	  scripts/ci/run-tests.sh $(TSAN_TESTS)
