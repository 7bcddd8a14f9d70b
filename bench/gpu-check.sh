#!/usr/bin/env bash
# GPU check of r2cc-perf itself (GPU machine only; `make gpu-test` runs it): every
# collective, data type and reduction, verified, in one process with -g, as emulated
# nodes (--nodes; 3 ranks give a rank count that is not a power of two), under the
# nccl-tests program names; then the checker's self-test, which must fail with status 1
# and #wrong 1, a rendezvous whose peer never comes, and the watchdog of a hung
# collective.
#   bench/gpu-check.sh [LOGDIR]
set -u
cd "$(dirname "$0")/.."
B=${BUILD:-build}/bin
LOG=${1:-logs/local/r2cc-perf}
mkdir -p "$LOG"
export NCCL_NVLS_ENABLE=0
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$ngpu" -ge 1 ] || { echo "no GPU"; exit 1; }
g2=$((ngpu >= 2 ? 2 : 1))
fail=0
expect() { # expected status, name, then the command
	local want=$1 name=$2 rc
	shift 2
	echo "=== $name: $*"
	"$@" >"$LOG/$name.log" 2>&1
	rc=$?
	if [ "$rc" -eq "$want" ]; then
		echo "    ok (status $rc)"
	else
		echo "    FAILED (status $rc, expected $want)"
		fail=1
	fi
	grep -E "^# (Out of bounds|Avg bus)|FAILED|wrong|rank [0-9]+:|TEST" "$LOG/$name.log" |
		sort | uniq -c | sort -rn | head -8 | sed 's/^/    /'
}
S="-b 1K -e 4M -f 16 -n 2 -w 1 -d all"
expect 0 ar-g "$B"/all_reduce_perf $S -o all -g "$g2"
for c in allreduce allgather reducescatter broadcast reduce alltoall sendrecv; do
	expect 0 "$c-1x$g2" "$B"/r2cc-perf --coll $c $S -o all -r all --nodes 1 --gpus-per-node "$g2"
	expect 0 "$c-3x1" "$B"/r2cc-perf --coll $c $S -o all --nodes 3 --gpus-per-node 1
done
expect 0 names-ag "$B"/all_gather_perf -b 8 -e 1M -f 4 --nodes 2 --gpus-per-node 1
expect 0 iters-table "$B"/all_reduce_perf -b 64M -e 64M -n 3 -w 0 --iters-table \
	--nodes 2 --gpus-per-node 1
expect 1 selftest-wrong "$B"/all_reduce_perf -b 1K -e 64K -f 4 -d all --selftest-wrong \
	--nodes 2 --gpus-per-node 1
expect 1 selftest-iters "$B"/all_reduce_perf -b 1M -e 1M -n 2 --iters-table --selftest-wrong \
	--nodes 2 --gpus-per-node 1
# a world of 2 processes of which only one starts: the rendezvous must give up
expect 2 no-peer env R2CC_PERF_RANK=0 R2CC_PERF_NRANKS=2 R2CC_PERF_ROOT=127.0.0.1:29599 \
	R2CC_PERF_RDV_TIMEOUT=5 timeout 120 "$B"/r2cc-perf -b 8 -e 8
# a rank that stops taking part: the others must abort after -T and the job fail with 3
expect 3 watchdog env R2CC_PERF_TEST_HANG=1 timeout 120 "$B"/all_reduce_perf -b 1M -e 1M -T 10 \
	--nodes 2 --gpus-per-node 1
exit $fail
