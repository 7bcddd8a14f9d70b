#!/usr/bin/env bash
# GPU check of hot repair (GPU machine only, 2 GPUs): the seed's tests 01 and 02 over
# the software fabric (2 nodes x 2 GPUs x 3 soft NICs, shaped), node 0's mlx5_2 cut 4 s
# into 10 verified AllReduces of 4 GiB, in R2CC_MODE=2 (blackhole, and down) and
# R2CC_MODE=1; then unmodified torch.distributed all_reduce in a loop through the same
# fault, with and without R2CC.
#   scripts/gpu/gpu-repair.sh [LOGDIR] [PART...]   parts: 01 01down 01mode1 02 torch torchbase
set -u
cd "$(dirname "$0")/../.."
export R2CC_ROOT=$PWD
B=${BUILD:-build}
LOG=${1:-logs/local/repair}
shift || true
parts=${*:-01 01down 01mode1 02 torch torchbase}
mkdir -p "$LOG"
fail=0
scn() { # label script [env...]
	local label=$1 script=$2
	shift 2
	mkdir -p "$LOG/$label"
	echo "=== $label: $* $script"
	mkdir -p "$LOG/$label/reports"
	env SAVE_LOG=1 LOG_DIR="$LOG/$label" REPORT_DIR="$LOG/$label/reports" "$@" \
		"scripts/scenarios/$script" >"$LOG/$label/console.txt" 2>&1 || fail=1
	grep -E "^ +step|detection|busbw (before|during|after)|verification|^ (PASS|FAIL)|^VERDICT" "$LOG/$label/console.txt" | sed 's/^/    /'
}
torch_run() { # label preload(0|1)
	local label=$1 pre=$2
	. scripts/softfabric.sh
	softfabric_env mlx5_0:25,mlx5_2:25,mlx5_3:25 "tr-$label"
	export SOFTVERBS_SHAPING=1 SOFTVERBS_TIME_SCALE=${SOFTVERBS_TIME_SCALE:-0.05}
	echo "=== $label: torch.distributed all_reduce loop, node0/mlx5_2 blackhole after iteration 30 (R2CC preload: $pre)"
	local envs=()
	: >"$LOG/$label.log"
	[ "$pre" = 1 ] && envs=(LD_PRELOAD=$PWD/$B/lib/libr2cc.so R2CC_REPORT=$LOG/$label-report.%p R2CC_DEBUG=WARN)
	env "${envs[@]}" timeout 300 python3 tests/gpu/torch_repair.py 2 ${TORCH_ITERS:-300} $((64 << 20)) >>"$LOG/$label.log" 2>&1 &
	local pid=$!
	# torch starts NCCL lazily: the fault goes in once the loop runs (iteration 30)
	for _ in $(seq 600); do
		grep -q "^iter  30 " "$LOG/$label.log" 2>/dev/null && break
		kill -0 $pid 2>/dev/null || break
		sleep 0.2
	done
	if "$B"/bin/softverbs-ctl --fabric "$SOFTVERBS_FABRIC" fault node0 mlx5_2 blackhole >>"$LOG/$label.log" 2>&1; then
		echo "fault injected at $(date +%s.%N): node0/mlx5_2 blackhole" >>"$LOG/$label.log"
	else
		echo "fault NOT injected (softverbs-ctl failed)" >>"$LOG/$label.log"; fail=1
	fi
	wait $pid
	local rc=$?
	echo "exit status $rc" >>"$LOG/$label.log"
	grep -E "fault|torch_repair:|wrong|WRONG|NCCL WARN|Error" "$LOG/$label.log" | head -6 | sed 's/^/    /'
	[ "$pre" = 1 ] && [ $rc != 0 ] && fail=1
	softfabric_reset
}
for p in $parts; do
	case $p in
	01) scn 01-blackhole-mode2 01.hot_repair_to_balance.sh ;;
	01down) scn 01-down-mode2 01.hot_repair_to_balance.sh FAULT=down ;;
	01mode1) scn 01-blackhole-mode1 01.hot_repair_to_balance.sh R2CC_MODE=1 ;;
	02) scn 02-blackhole 02.hot_repair_to_r2cc_allreduce.sh ;;
	torch) torch_run torch-r2cc 1 ;;
	torchbase) torch_run torch-plain 0 ;;
	*) echo "unknown part $p"; fail=1 ;;
	esac
done
exit $fail
