#!/usr/bin/env bash
# GPU check of R2CC-AllReduce inside real NCCL (GPU machine only): R2CC
# preloaded in R2CC_MODE=3 with node 0's mlx5_2 declared failed, over the
# software fabric with 3 soft NICs per node, as 4 nodes x 1 GPU and 2 nodes x 2
# GPUs; r2cc-perf verifies every result, R2CC's log says how many AllReduces
# ran the two-stage schedule.
#   scripts/gpu/gpu-strategies.sh [LOGDIR]
set -u
cd "$(dirname "$0")/../.."
export R2CC_ROOT=$PWD
B=${BUILD:-build}
LOG=${1:-logs/local}
mkdir -p "$LOG"
. scripts/softfabric.sh
fail=0
run() { # name nodes gpus args...
	local name=$1 n=$2 g=$3; shift 3
	softfabric_env mlx5_0:100,mlx5_2:100,mlx5_3:100 "st-$name"
	echo "=== $name: ${n}x$g R2CC_MODE=${R2CC_MODE:-3} $*"
	local t0=$SECONDS
	if LD_PRELOAD=$PWD/$B/lib/libr2cc.so R2CC_MODE=${R2CC_MODE:-3} R2CC_FAILED_NODE=0 \
		R2CC_FAILED_HCA=mlx5_2 R2CC_DEBUG=INFO timeout 400 "$B"/bin/r2cc-perf --nodes "$n" \
		--gpus-per-node "$g" -c 1 -T 300 "$@" >"$LOG/$name.log" 2>&1; then
		echo "    ok ($((SECONDS - t0)) s)"
	else
		echo "    FAILED rc=$? ($((SECONDS - t0)) s)"; fail=1
	fi
	grep -E "# Avg bus|Out of bounds|^ +(16|16777216|268435456|1073741824|4294967296) " "$LOG/$name.log" | sed 's/^/    /'
	grep -hoE "R2CC (WARN .*|INFO (comm .*R2CC-AllReduce ran.*|comm .*: node .* failed.*|R2CC-AllReduce armed.*))" "$LOG/$name.log" |
		sed -E 's/comm 0x[0-9a-f]+ rank [0-9]+/comm/' | sort | uniq -c | sed 's/^/    /'
	softfabric_reset
}
run ar2-float-sum-4x1 4 1 --coll allreduce -b 16 -e 4G -f 4 -n 2 -w 1 -d float -o sum
run ar2-float-sum-2x2 2 2 --coll allreduce -b 16 -e 4G -f 4 -n 2 -w 1 -d float -o sum
run ar2-half-prod-4x1 4 1 --coll allreduce -b 1K -e 256M -f 8 -n 2 -w 1 -d half -o prod
run ar2-bf16-max-4x1 4 1 --coll allreduce -b 1K -e 256M -f 8 -n 2 -w 1 -d bfloat16 -o max
run ar2-int32-sum-4x1 4 1 --coll allreduce -b 1K -e 256M -f 8 -n 2 -w 1 -d int32 -o sum
R2CC_AR_SCHEDULE=3 R2CC_AR_STAGE2_CHUNKS=7 run ar2-sched3-k7-3x1 3 1 --coll allreduce -b 17M -e 1G -f 8 -n 2 -w 1 -d float -o min
exit $fail
