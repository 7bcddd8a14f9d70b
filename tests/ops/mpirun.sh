#!/usr/bin/env bash
# r2cc run as the program of the real mpirun (Debian's Open MPI, openmpi-bin, installed
# with apt-get where missing, as root): tests/run/run.sh with TEST_MPIRUN, so the same
# checks as under the test double: the ranks' exit status, the preload in each rank and
# not in the launcher, one --summary line per rank over the software RDMA device.
#   tests/ops/mpirun.sh BUILD
set -u
B=${1:-build}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
if ! command -v mpirun >/dev/null; then
	[ "$(id -u)" = 0 ] || { echo "FAIL: no mpirun, and installing openmpi-bin needs root"; exit 1; }
	echo "installing openmpi-bin"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openmpi-bin >/dev/null ||
		{ echo "FAIL: cannot install openmpi-bin"; exit 1; }
fi
mpirun --version | head -1
flags=(--oversubscribe)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
TEST_MPIRUN="mpirun ${flags[*]}" exec "$ROOT"/tests/run/run.sh "$B"
