#!/usr/bin/env bash
# R2CC's fast-path cost per call (make bench). NCCL: wrapper vs NCCL's own
# entry point in one process. Verbs: the same program over the software
# device without and with the preload; the difference is the wrappers' cost.
set -eu
B=${BUILD:-build}
LIB=$PWD/$B/lib/libr2cc.so
echo "== NCCL collective wrapper (R2CC_MODE=2, healthy; and without R2CC)"
LD_PRELOAD=$LIB "$B"/tests/bench/wrap_cost nccl
"$B"/tests/bench/wrap_cost nccl
echo "== verbs data-path wrappers over the software device"
export LD_LIBRARY_PATH=$PWD/$B/softverbs SOFTVERBS_FABRIC=r2cc-bench-$$ SOFTVERBS_NODE=n0 SOFTVERBS_NICS=mlx5_0:100
trap '"$B"/bin/softverbs-ctl --fabric "$SOFTVERBS_FABRIC" reset >/dev/null 2>&1 || true' EXIT
for i in 1 2; do
	"$B"/tests/bench/wrap_cost verbs
	LD_PRELOAD=$LIB "$B"/tests/bench/wrap_cost verbs
done
