# tests/ops: tests that need the real daemons of a cluster's operators (Slurm,
# Prometheus, ...), started by each test on this machine: `make test-ops`. Any module
# appends its tests to OPS_TESTS (run as scripts/ci/run-tests.sh runs CPU_TESTS) and what
# they need built to OPS_DEPS; neither is reset here, so modules read before this file
# may append too.

.PHONY: test-ops
test-ops: deps
	@$(MAKE) --no-print-directory -j$(BUILD_JOBS) all $(OPS_DEPS)
	@scripts/ci/run-tests.sh $(OPS_TESTS)
