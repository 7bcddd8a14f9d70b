#!/usr/bin/env bash
# Healthy-path cost of R2CC (GPU machine only): the same AllReduce sweep over
# the software fabric without R2CC and with LD_PRELOAD=libr2cc.so (R2CC_MODE=2,
# nothing failed), alternated ROUNDS times in one run; prints the busbw ratio
# (with / without) per message size, from the median of the rounds.
#   scripts/gpu-overhead.sh [LOGDIR] [ROUNDS] [NODESxGPUS]
# GBPS=25 shapes every soft NIC to that rate (SOFTVERBS_SHAPING=1): the network is then
# the bottleneck, as on real clusters, and the rounds vary much less.
set -u
cd "$(dirname "$0")/.."
export R2CC_ROOT=$PWD
B=${BUILD:-build}
LOG=${1:-logs/local}
ROUNDS=${2:-3}
SHAPE=${3:-2x1}
mkdir -p "$LOG"
. scripts/softfabric.sh
args=(--nodes "${SHAPE%x*}" --gpus-per-node "${SHAPE#*x}" --coll allreduce -b 1M -e 1G -f 4 -n 5 -w 2 -c 1 -d float -o sum)
for r in $(seq "$ROUNDS"); do
	for v in plain r2cc; do
		g=${GBPS:-100}
		softfabric_env mlx5_0:$g,mlx5_2:$g,mlx5_3:$g "ov-$v-$r"
		[ -n "${GBPS:-}" ] && export SOFTVERBS_SHAPING=1
		pre=
		[ $v = r2cc ] && pre=$PWD/$B/lib/libr2cc.so
		LD_PRELOAD=$pre R2CC_MODE=2 timeout 300 "$B"/bin/r2cc-perf "${args[@]}" >"$LOG/overhead-$v-$r.log" 2>&1 ||
			echo "round $r $v failed (rc=$?)"
		softfabric_reset
	done
done
echo "healthy-path cost, ${SHAPE} over 3 soft NICs per node${GBPS:+ shaped to $GBPS Gb/s each}, AllReduce float sum, $ROUNDS rounds alternated"
echo "(busbw GB/s out-of-place, median of rounds; ratio = with R2CC / without)"
python3 - "$LOG" "$ROUNDS" <<'PY'
import sys, statistics, re
log, rounds = sys.argv[1], int(sys.argv[2])
def rows(path):
    out = {}
    for line in open(path):
        f = line.split()
        if len(f) >= 13 and f[0].isdigit() and f[2] == "float":
            out[int(f[0])] = (float(f[7]), f[8])
    return out
data = {"plain": {}, "r2cc": {}}
for v in data:
    for r in range(1, rounds + 1):
        try:
            for size, (bw, wrong) in rows(f"{log}/overhead-{v}-{r}.log").items():
                data[v].setdefault(size, []).append(bw)
                if wrong != "0":
                    print(f"WRONG results: {v} round {r} size {size}")
        except FileNotFoundError:
            pass
print(f"{'bytes':>12} {'plain':>8} {'r2cc':>8} {'ratio':>7}")
for size in sorted(data["plain"]):
    if size in data["r2cc"]:
        p, q = statistics.median(data["plain"][size]), statistics.median(data["r2cc"][size])
        print(f"{size:>12} {p:>8.2f} {q:>8.2f} {q / p if p else float('nan'):>7.3f}")
PY
