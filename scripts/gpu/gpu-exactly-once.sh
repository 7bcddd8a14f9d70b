#!/usr/bin/env bash
# GPU table of exactly-once repair (GPU machine only): 2 nodes x 1 GPU over 3 soft NICs
# shaped to 25 Gb/s, NVIDIA's nccl-tests (NCCL_TESTS_DIR, built there) with -c 1, each
# collective through each NIC fault on node1's mlx5_0, injected once two result rows are
# out; every result checked, R2CC's reports counted (scripts/gpu/gpu-stall.sh does the runs).
#   scripts/gpu/gpu-exactly-once.sh LOGDIR ib|roce [COLLS] [FAULTS]
# COLLS default "all_reduce all_gather reduce_scatter sendrecv", FAULTS "blackhole ackloss
# down fatal". One summary.txt per collective under LOGDIR; run under scripts/gpu/with-mps.sh.
set -u
cd "$(dirname "$0")/../.." || exit 2
LOG=${1:?usage: scripts/gpu/gpu-exactly-once.sh LOGDIR ib|roce [COLLS] [FAULTS]}
LINK=${2:?ib or roce}
COLLS=${3:-all_reduce all_gather reduce_scatter sendrecv}
FAULTS=${4:-blackhole ackloss down fatal}
[ -x "${NCCL_TESTS_DIR:-}/all_reduce_perf" ] || { echo "NCCL_TESTS_DIR: nccl-tests' binaries" >&2; exit 2; }
export LINK
fail=0
for c in $COLLS; do
	runs=
	for f in $FAULTS; do runs="$runs 2x1:25:2:$f"; done
	# shellcheck disable=SC2086 # runs is a word list
	COLL=$c BYTES="-b 16M -e 1G" ITERS="-n 10 -w 2" FAULT_AT_ROW=2 TIMEOUT_S=100 STACKS=0 \
		timeout 500 scripts/gpu/gpu-stall.sh "$LOG/$c" $runs || fail=1
done
cat "$LOG"/*/summary.txt
exit $fail
