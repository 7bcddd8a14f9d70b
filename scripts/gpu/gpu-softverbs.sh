#!/usr/bin/env bash
# GPU check of the software RDMA device (GPU machine only, no R2CC loaded):
# NCCL's own IB transport over soft NICs, with the system NCCL and with
# PyTorch's, as 2 nodes x 1 GPU and 2 nodes x 2 GPUs (NCCL_HOSTID), 3 NICs per
# node; sweeps with every result verified by r2cc-perf; throughput of one
# unshaped NIC; a shaped 3 x 25 Gb/s AllReduce; and what plain NCCL does when a
# NIC goes down or is black-holed.
#   scripts/gpu/gpu-softverbs.sh [LOGDIR] [PART...]   parts: sweep torchnccl nic shaped fault
set -u
cd "$(dirname "$0")/../.."
export R2CC_ROOT=$PWD
B=${BUILD:-build}
LOG=${1:-logs/local}; shift || true
parts=${*:-sweep torchnccl nic shaped fault}
mkdir -p "$LOG"
. scripts/softfabric.sh
PERF=$B/bin/r2cc-perf
fail=0

summary() { # the lines worth reading in a r2cc-perf log
	grep -E "NCCL library|# Avg bus|Out of bounds|^ +[0-9]+ +[0-9]+ .*(float|half|bfloat16|int32)" "$1" |
		grep -E "NCCL library|# Avg|Out of|^ +(8|1073741824|268435456) " | sed 's/^/    /'
	local ib
	ib=$(grep -m1 -oE "NET/IB : Using \[0\].*" "$1") && echo "    $ib"
}

perf() { # name, nodes, gpus-per-node, r2cc-perf args...
	local name=$1 n=$2 g=$3; shift 3
	softfabric_env "${NICS:-mlx5_0:100,mlx5_2:100,mlx5_3:100}" "sv-$name"
	echo "=== $name: ${n}x$g $*"
	local t0=$SECONDS
	if NCCL_DEBUG=${NCCL_DEBUG:-INFO} NCCL_DEBUG_SUBSYS=${NCCL_DEBUG_SUBSYS:-INIT,NET} \
		timeout 300 "$PERF" --nodes "$n" --gpus-per-node "$g" -c 1 -T 240 "$@" >"$LOG/$name.log" 2>&1; then
		echo "    ok ($((SECONDS - t0)) s)"
	else
		echo "    FAILED rc=$? ($((SECONDS - t0)) s)"; fail=1
	fi
	summary "$LOG/$name.log"
	softfabric_reset
}

for part in $parts; do
case $part in
sweep)
	for shape in "2 1" "2 2"; do
		set -- $shape
		tag=${1}x$2
		perf "allreduce-float-sum-$tag" $1 $2 --coll allreduce -b 8 -e 1G -f 2 -n 3 -w 1 -d float -o sum
		for c in allgather reducescatter broadcast sendrecv; do
			perf "$c-float-$tag" $1 $2 --coll $c -b 8 -e 1G -f 2 -n 2 -w 1 -d float -o sum
		done
		perf "allreduce-half-prod-$tag" $1 $2 --coll allreduce -b 8 -e 256M -f 8 -n 2 -w 1 -d half -o prod
		perf "allreduce-bf16-max-$tag" $1 $2 --coll allreduce -b 8 -e 256M -f 8 -n 2 -w 1 -d bfloat16 -o max
		perf "allreduce-int32-sum-$tag" $1 $2 --coll allreduce -b 8 -e 256M -f 8 -n 2 -w 1 -d int32 -o sum
	done
	;;
torchnccl)
	# The NCCL that PyTorch ships (2.28.9 with torch 2.11), same program.
	tlib=$(python3 - <<'PY'
import glob, os, site
for d in site.getsitepackages():
    for p in glob.glob(os.path.join(d, "nvidia", "**", "libnccl.so.2"), recursive=True):
        print(os.path.dirname(p)); raise SystemExit
PY
)
	if [ -z "$tlib" ]; then echo "=== torchnccl: PyTorch's libnccl not found"; fail=1; continue; fi
	echo "=== PyTorch's NCCL: $tlib"
	for shape in "2 1" "2 2"; do
		set -- $shape
		LD_LIBRARY_PATH=$tlib perf "torchnccl-allreduce-bf16-sum-$1x$2" $1 $2 --coll allreduce -b 8 -e 1G -f 2 -n 2 -w 1 -d bfloat16 -o sum
		for c in allreduce allgather reducescatter broadcast sendrecv; do
			LD_LIBRARY_PATH=$tlib perf "torchnccl-$c-float-$1x$2" $1 $2 --coll $c -b 8 -e 1G -f 2 -n 2 -w 1 -d float -o sum
		done
	done
	softfabric_env mlx5_0:100,mlx5_2:100,mlx5_3:100 sv-torch
	echo "=== torch.distributed over soft NICs (one emulated node per rank)"
	R2CC_TEST_HOSTID=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET timeout 300 python3 tests/gpu/torch_allreduce.py 2 >"$LOG/torch-softnics.log" 2>&1 &&
		echo "    ok" || { echo "    FAILED"; fail=1; }
	grep -E "torch_allreduce|wrong|NET/IB : Using" "$LOG/torch-softnics.log" | sort -u | head -4 | sed 's/^/    /'
	softfabric_reset
	;;
nic)
	# One NIC, no shaping: what the soft device itself carries.
	NICS=mlx5_0:400 perf nic-throughput-1nic 2 1 --coll sendrecv -b 1G -e 1G -n 5 -w 1 -d float
	NICS=mlx5_0:400,mlx5_2:400,mlx5_3:400 perf nic-throughput-3nic 2 1 --coll allreduce -b 1G -e 1G -n 5 -w 1 -d float
	;;
shaped)
	# 3 x 25 Gb/s per node = 9.375 GB/s: the ceiling a shaped test must reach.
	SOFTVERBS_SHAPING=1 NICS=mlx5_0:25,mlx5_2:25,mlx5_3:25 perf shaped-3x25-allreduce-1G 2 1 \
		--coll allreduce -b 1G -e 1G -n 5 -w 1 -d float -o sum --nic-table
	;;
fault)
	# Plain NCCL, no R2CC: node0's mlx5_2 is cut with softverbs-ctl 4 s into
	# a loop of AllReduces.
	for kind in down blackhole; do
		softfabric_env mlx5_0:100,mlx5_2:100,mlx5_3:100 "sv-fault-$kind"
		export SOFTVERBS_TIME_SCALE=0.05
		echo "=== fault-$kind: plain NCCL, softverbs-ctl fault node0 mlx5_2 $kind 4 s after the start, IB timeouts scaled x0.05"
		t0=$SECONDS
		NCCL_DEBUG=WARN timeout 200 "$PERF" --nodes 2 --gpus-per-node 1 --coll allreduce -b 256M -e 256M \
			-n 400 -w 1 -c 1 -T 120 >"$LOG/fault-$kind.log" 2>&1 &
		job=$!
		sleep 4
		"$B"/bin/softverbs-ctl --fabric "$SOFTVERBS_FABRIC" fault node0 mlx5_2 "$kind" |
			sed "s/^/    softverbs-ctl: /"
		echo "    fault injected at $(date +%T.%N | cut -c1-12)"
		wait $job
		rc=$?
		echo "    r2cc-perf exit $rc after $((SECONDS - t0)) s (non-zero expected: plain NCCL cannot survive)"
		grep -E "status=|async error|asynchronous error|timed out|watchdog" "$LOG/fault-$kind.log" |
			grep -v "Could not find real path" | head -4 | sed 's/^/    /'
		[ $rc -ne 0 ] || { echo "    unexpected success"; fail=1; }
		"$B"/bin/softverbs-ctl --fabric "$SOFTVERBS_FABRIC" list 2>/dev/null | grep -E "^nic .*mlx5_2" | head -2 | sed 's/^/    /'
		unset SOFTVERBS_TIME_SCALE
		softfabric_reset
	done
	;;
esac
done
exit $fail
