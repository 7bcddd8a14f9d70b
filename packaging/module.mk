# packaging: the tests of the top Makefile's build-dependency check (and, to come,
# `make install` and `make deb`).

# make test: a missing build dependency stops `make` at once with what to install (the
# top Makefile's check, scripts/deps.sh --check).
CPU_TESTS += 30@tests/ops/deps-check.sh
