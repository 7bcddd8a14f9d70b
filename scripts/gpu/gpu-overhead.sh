#!/usr/bin/env bash
# Healthy-path cost of R2CC (GPU machine only): the same AllReduce sweep over
# the software fabric without R2CC and with LD_PRELOAD=libr2cc.so (R2CC_MODE=2,
# nothing failed), alternated ROUNDS times in one run; prints the busbw ratio
# (with / without) per message size, from the median of the rounds.
#   scripts/gpu/gpu-overhead.sh [LOGDIR] [ROUNDS] [NODESxGPUS]
# GBPS=25 shapes every soft NIC to that rate (SOFTVERBS_SHAPING=1): the network is then
# the bottleneck, as on real clusters, and the rounds vary much less.
# Each run sweeps 256 KiB-256 MiB with ITERS (default 40) timed iterations per size, after
# a first untimed sweep (-N 2: the second is reported), so that no size is measured while
# a process is still starting up. The ratio is taken per round (the variants of one round
# run back to back), then its median over the rounds is printed with its range.
# MAX_BYTES=4M stops the sweep there (more rounds of the latency-bound sizes in less time);
# MIN_BYTES=1M starts it there (MIN_BYTES=1M MAX_BYTES=1M ITERS=2000: one size, timed over
# about a second a run, so that a round's figure is not a few milliseconds' worth).
# MODE=auto (or 1, 3) measures that R2CC_MODE instead of 2.
# SPLIT_CPUS=1 runs each emulated node on its own share of the cores (r2cc-perf
# --split-cpus), as separate hosts would, instead of all ranks and their soft NICs' threads
# sharing every core. DEADLINE=S starts no round after S seconds (the rounds done are
# summarised), so that a bounded call still prints its summary.
set -u
cd "$(dirname "$0")/../.."
export R2CC_ROOT=$PWD
B=${BUILD:-build}
LOG=${1:-logs/local}
ROUNDS=${2:-3}
SHAPE=${3:-2x1}
case ${SPLIT_CPUS:-0} in 0 | 1) ;; *) echo "SPLIT_CPUS='$SPLIT_CPUS': 0 or 1" >&2; exit 2 ;; esac
case ${DEADLINE:-0} in '' | *[!0-9]*) echo "DEADLINE='$DEADLINE': whole seconds" >&2; exit 2 ;; esac
mkdir -p "$LOG"
. scripts/softfabric.sh
args=(--nodes "${SHAPE%x*}" --gpus-per-node "${SHAPE#*x}" --coll allreduce -b "${MIN_BYTES:-256K}" -e "${MAX_BYTES:-256M}" -f 4
	-n "${ITERS:-40}" -w 5 -N 2 -c 1 -d float -o sum)
[ "${SPLIT_CPUS:-0}" = 1 ] && args+=(--split-cpus)
# Variants: plain (no R2CC), r2cc (R2CC_MODE=2, hot repair armed, nothing failed) and,
# with MODE0=1, r2cc-mode0 (the library loaded, R2CC_MODE=0: pure pass-through), a control
# for effects of loading anything at all. The order rotates every round, so that no variant
# always runs first (a fixed order showed up as a bias of several per cent at 1 MiB).
# R2CC_LIB_B=PATH adds r2cc-b, another build of the library (an earlier commit, say),
# in the same rounds; R2CC_LIBS="NAME=PATH ..." adds one variant r2cc-NAME a build (NAME:
# letters, digits and dashes).
variants=(plain r2cc)
[ "${MODE0:-0}" = 1 ] && variants+=(r2cc-mode0)
declare -A libs=()
[ -n "${R2CC_LIB_B:-}" ] && libs[r2cc-b]=$R2CC_LIB_B
for nl in ${R2CC_LIBS:-}; do
	n=${nl%%=*}
	[[ $nl == *=* && $n =~ ^[A-Za-z0-9-]+$ ]] || { echo "R2CC_LIBS: '$nl' is not NAME=PATH"; exit 2; }
	[ -f "${nl#*=}" ] || { echo "R2CC_LIBS: ${nl#*=}: no such file"; exit 2; }
	libs[r2cc-$n]=${nl#*=}
done
for v in $(printf '%s\n' "${!libs[@]}" | sort); do variants+=("$v"); done
nv=${#variants[@]}
for r in $(seq "$ROUNDS"); do
	if [ -n "${DEADLINE:-}" ] && [ "$SECONDS" -ge "$DEADLINE" ]; then
		echo "DEADLINE=$DEADLINE s reached: $((r - 1)) rounds done"
		ROUNDS=$((r - 1))
		break
	fi
	for k in $(seq 0 $((nv - 1))); do
		v=${variants[$(((k + r) % nv))]}
		g=${GBPS:-100}
		softfabric_env mlx5_0:$g,mlx5_2:$g,mlx5_3:$g "ov-$v-$r"
		[ -n "${GBPS:-}" ] && export SOFTVERBS_SHAPING=1
		pre= mode=${MODE:-2}
		[ $v != plain ] && pre=$PWD/$B/lib/libr2cc.so
		[ $v = r2cc-mode0 ] && mode=0
		[ -n "${libs[$v]:-}" ] && pre=${libs[$v]}
		LD_PRELOAD=$pre R2CC_MODE=$mode timeout 300 "$B"/bin/r2cc-perf "${args[@]}" >"$LOG/overhead-$v-$r.log" 2>&1 ||
			echo "round $r $v failed (rc=$?)"
		softfabric_reset
	done
done
# the machine, since timings compare only within one
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
tpc=$(lscpu 2>/dev/null | sed -n 's/^Thread(s) per core:[[:space:]]*//p')
gpu=$(nvidia-smi -L 2>/dev/null | head -1)
echo "machine: $(nproc) CPUs (${tpc:-?} threads a core), ${cpu:-unknown CPU}; ${gpu:-no GPU listed}"
[ "${SPLIT_CPUS:-0}" = 1 ] && sed -n 's/^# \(node[0-9]* runs on CPUs .*\)/\1/p' "$LOG/overhead-plain-1.log" 2>/dev/null
echo "healthy-path cost, ${SHAPE} over 3 soft NICs per node${GBPS:+ shaped to $GBPS Gb/s each}${SPLIT_CPUS:+ (SPLIT_CPUS=$SPLIT_CPUS)}, AllReduce float sum, $ROUNDS rounds, order rotated every round"
echo "(busbw GB/s out-of-place of the second sweep, median of rounds; ratio = with R2CC / without,"
echo " taken per round, median of rounds [lowest, highest])"
python3 - "$LOG" "$ROUNDS" <<'PY'
import sys, statistics
sys.path.insert(0, "scripts/scenarios")
from results import last_rows
log, rounds = sys.argv[1], int(sys.argv[2])
def rows(path):
    """size -> (busbw, #wrong) of the last sweep in the log (-N 2 prints two)."""
    return {size: (r["oop_bw"], r["oop_wrong"]) for size, r in last_rows(path).items()}
import glob, re
variants = sorted({re.search(r"overhead-(.+)-\d+\.log$", f).group(1)
                   for f in glob.glob(f"{log}/overhead-*-*.log")} | {"plain", "r2cc"},
                  key=lambda v: (v not in ("plain", "r2cc", "r2cc-mode0"), v))
data = {v: {} for v in variants}  # variant -> round -> size -> busbw
for v in variants:
    for r in range(1, rounds + 1):
        try:
            for size, (bw, wrong) in rows(f"{log}/overhead-{v}-{r}.log").items():
                data[v].setdefault(r, {})[size] = bw
                if wrong != 0:
                    print(f"WRONG results: {v} round {r} size {size}")
        except FileNotFoundError:
            pass
def ratio(v, size):
    rs = [data[v][r][size] / data["plain"][r][size] for r in data["plain"]
          if r in data[v] and size in data[v][r] and data["plain"][r].get(size)]
    return (statistics.median(rs), min(rs), max(rs)) if rs else None
def med(v, size):
    xs = [data[v][r][size] for r in data[v] if size in data[v][r]]
    return statistics.median(xs) if xs else float("nan")
extra = tuple(v for v in variants[2:] if data[v])
sizes = sorted({s for r in data["plain"].values() for s in r})
print(f"{'bytes':>12} {'plain':>8} {'r2cc':>8} {'ratio [range]':>22}" +
      "".join(f" {v.replace('r2cc-', ''):>8} {'ratio [range]':>22}" for v in extra))
for size in sizes:
    line = f"{size:>12} {med('plain', size):>8.2f}"
    for v in ("r2cc",) + extra:
        q = ratio(v, size)
        cell = f"{q[0]:.3f} [{q[1]:.3f}, {q[2]:.3f}]" if q else "-"
        line += f" {med(v, size):>8.2f} {cell:>22}"
    print(line)
PY
# the same rounds' ratios: their geometric mean and its bootstrap interval
python3 scripts/gpu/overhead-pool.py "$LOG"
