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
# Variants: plain (no R2CC), r2cc (R2CC_MODE=2, hot repair armed, nothing failed) and,
# with MODE0=1, r2cc-mode0 (the library loaded, R2CC_MODE=0: pure pass-through), a control
# for effects of loading anything at all. The order rotates every round, so that no variant
# always runs first (a fixed order showed up as a bias of several per cent at 1 MiB).
variants=(plain r2cc)
[ "${MODE0:-0}" = 1 ] && variants+=(r2cc-mode0)
nv=${#variants[@]}
for r in $(seq "$ROUNDS"); do
	for k in $(seq 0 $((nv - 1))); do
		v=${variants[$(((k + r) % nv))]}
		g=${GBPS:-100}
		softfabric_env mlx5_0:$g,mlx5_2:$g,mlx5_3:$g "ov-$v-$r"
		[ -n "${GBPS:-}" ] && export SOFTVERBS_SHAPING=1
		pre= mode=2
		[ $v != plain ] && pre=$PWD/$B/lib/libr2cc.so
		[ $v = r2cc-mode0 ] && mode=0
		LD_PRELOAD=$pre R2CC_MODE=$mode timeout 300 "$B"/bin/r2cc-perf "${args[@]}" >"$LOG/overhead-$v-$r.log" 2>&1 ||
			echo "round $r $v failed (rc=$?)"
		softfabric_reset
	done
done
echo "healthy-path cost, ${SHAPE} over 3 soft NICs per node${GBPS:+ shaped to $GBPS Gb/s each}, AllReduce float sum, $ROUNDS rounds, order rotated every round"
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
data = {"plain": {}, "r2cc": {}, "r2cc-mode0": {}}
for v in data:
    for r in range(1, rounds + 1):
        try:
            for size, (bw, wrong) in rows(f"{log}/overhead-{v}-{r}.log").items():
                data[v].setdefault(size, []).append(bw)
                if wrong != "0":
                    print(f"WRONG results: {v} round {r} size {size}")
        except FileNotFoundError:
            pass
m0 = bool(data["r2cc-mode0"])
print(f"{'bytes':>12} {'plain':>8} {'r2cc':>8} {'ratio':>7}" +
      (f" {'mode0':>8} {'ratio':>7}" if m0 else ""))
for size in sorted(data["plain"]):
    if size in data["r2cc"]:
        p, q = statistics.median(data["plain"][size]), statistics.median(data["r2cc"][size])
        line = f"{size:>12} {p:>8.2f} {q:>8.2f} {q / p if p else float('nan'):>7.3f}"
        if m0 and size in data["r2cc-mode0"]:
            z = statistics.median(data["r2cc-mode0"][size])
            line += f" {z:>8.2f} {z / p if p else float('nan'):>7.3f}"
        print(line)
PY
