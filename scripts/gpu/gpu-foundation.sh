#!/usr/bin/env bash
# GPU check of the foundation (GPU machine only): a 2-rank AllReduce program
# against the system NCCL and torch.distributed all_reduce with PyTorch's NCCL,
# each without R2CC and under LD_PRELOAD in R2CC_MODE=0 and 2, every result
# verified; R2CC_DEBUG=INFO shows the wrappers were reached.
#   scripts/gpu/gpu-foundation.sh [LOGDIR]
set -u
cd "$(dirname "$0")/../.."
B=${BUILD:-build}
LOG=${1:-logs/local}
mkdir -p "$LOG"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LIB=$PWD/$B/lib/libr2cc.so
fail=0
run() { # name, then the command
	local name=$1; shift
	echo "=== $name: $*"
	if "$@" >"$LOG/$name.log" 2>&1; then
		echo "    ok"
	else
		echo "    FAILED (rc=$?)"; fail=1
	fi
	grep -E "allreduce2:|torch_allreduce:|torch .* wrong|NCCL version|R2CC (INFO|WARN)" "$LOG/$name.log" |
		grep -vE "setting R2CC_DEBUG" | sort | uniq -c | sort -rn | head -12 | sed 's/^/    /'
}
run ar2-plain "$B"/tests/gpu/allreduce2 --ranks 2 --max-bytes $((256 << 20))
for m in 0 2; do
	run ar2-mode$m env LD_PRELOAD="$LIB" R2CC_MODE=$m R2CC_DEBUG=INFO NCCL_DEBUG=VERSION \
		"$B"/tests/gpu/allreduce2 --ranks 2 --max-bytes $((256 << 20))
done
if python3 -c 'import torch' 2>/dev/null; then
	run torch-plain python3 tests/gpu/torch_allreduce.py 2
	for m in 0 2; do
		run torch-mode$m env LD_PRELOAD="$LIB" R2CC_MODE=$m R2CC_DEBUG=INFO NCCL_DEBUG=VERSION \
			python3 tests/gpu/torch_allreduce.py 2
	done
else
	echo "=== torch not installed: skipped"; fail=1
fi
exit $fail
