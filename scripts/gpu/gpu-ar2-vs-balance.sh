#!/usr/bin/env bash
# R2CC-AllReduce against Balance with a declared failure (GPU machine only, 2 GPUs):
# node 0's mlx5_2 declared failed (R2CC_FAILED_NODE=0 R2CC_FAILED_HCA=mlx5_2), 3 soft NICs
# per node shaped to GBPS (default 25) so the network is the bottleneck; AllReduce float/sum
# 256 MiB-4 GiB, every result verified, for R2CC_MODE=2 (Balance) and 3 (R2CC-AllReduce),
# alternated ROUNDS times in one run, as 4 nodes x 1 GPU (X = 1/3: the model says R2CC-
# AllReduce wins) and 2 nodes x 1 GPU (the model says they are equal). Prints the busbw
# ratio AR2/Balance per size next to r2cc-plan's prediction, and node 0's per-NIC bytes of
# one 4 GiB iteration for both strategies.
#   scripts/gpu/gpu-ar2-vs-balance.sh [LOGDIR] [ROUNDS]
# SHAPES="4x1" runs one shape only; ANALYSE_ONLY=1 prints the tables of LOGDIR's runs
# without running anything. Columns 'closed' and 'fitted' are the ratio the cost model
# predicts: the closed form of docs/architecture.md (Cost model) (no fixed costs, equal cost per byte) and the
# installed fit (r2cc-plan's default constants).
# In shapes where ranks share a GPU (4x1 on 2 GPUs), run it under scripts/gpu/with-mps.sh.
set -u
cd "$(dirname "$0")/../.."
export R2CC_ROOT=$PWD
B=${BUILD:-build}
LOG=${1:-logs/local/ar2}
ROUNDS=${2:-2}
G=${GBPS:-25}
mkdir -p "$LOG"
. scripts/softfabric.sh
fail=0
SHAPES=${SHAPES:-4x1 2x1}
[ "${ANALYSE_ONLY:-0}" = 1 ] && SHAPES_RUN= || SHAPES_RUN=$SHAPES
for shape in $SHAPES_RUN; do
	n=${shape%x*}
	for r in $(seq "$ROUNDS"); do
		for mode in 2 3; do
			softfabric_env mlx5_0:$G,mlx5_2:$G,mlx5_3:$G "ar2b-$shape-$mode-$r"
			export SOFTVERBS_SHAPING=1
			out=$LOG/$shape-mode$mode-$r.log
			LD_PRELOAD=$PWD/$B/lib/libr2cc.so R2CC_MODE=$mode R2CC_FAILED_NODE=0 \
				R2CC_FAILED_HCA=mlx5_2 R2CC_DEBUG=INFO timeout 280 "$B"/bin/r2cc-perf \
				--nodes "$n" --gpus-per-node 1 --coll allreduce -b 256M -e 4G -f 2 -n 3 -w 1 \
				-c 1 -d float -o sum --nic-table=0 -T 250 >"$out" 2>&1 || { echo "$shape mode $mode round $r failed (rc=$?)"; fail=1; }
			softfabric_reset
		done
	done
done
python3 - "$LOG" "$ROUNDS" "$B" "$SHAPES" <<'PY'
import re, statistics, subprocess, sys
log, rounds, b, shapes = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].split()
sys.path.insert(0, "scripts/scenarios")
from results import last_rows
def rows(path):
    """size -> (busbw out of place, #wrong out of place, #wrong in place)"""
    return {size: (r["oop_bw"], r["oop_wrong"], r["ip_wrong"]) for size, r in last_rows(path).items()}
for shape in shapes:
    n = int(shape.split("x")[0])
    print(f"\n{shape}: {n} nodes x 1 GPU, 3 NICs per node at 25 Gb/s, node 0's mlx5_2 declared failed")
    data = {2: {}, 3: {}}
    for mode in (2, 3):
        for r in range(1, rounds + 1):
            try:
                for size, (bw, w1, w2) in rows(f"{log}/{shape}-mode{mode}-{r}.log").items():
                    data[mode].setdefault(size, []).append(bw)
                    if w1 != 0 or w2 != 0:
                        print(f"WRONG results: mode {mode} round {r} size {size}")
            except FileNotFoundError:
                pass
    nr = max((len(v) for v in data[2].values()), default=0)
    print(f"{'bytes':>12} {'Balance':>8} {'AR2':>8} {'ratio':>7} {'closed':>7} {'fitted':>7}  (busbw GB/s out-of-place, median of {nr})")
    def predicted(size, model=None):
        cmd = [f"{b}/bin/r2cc-plan", "--nodes", str(n), "--nics", "3", "--failed", "1", "--bytes", str(size)]
        if model:
            cmd += ["--model", model]
        plan = subprocess.run(cmd, capture_output=True, text=True).stdout
        t = dict(re.findall(r"mode (\d) \S+(?: \S+)*?\s+([0-9.]+)\s+[0-9.]+\n", plan))
        return float(t["2"]) / float(t["3"]) if "2" in t and "3" in t else float("nan")
    closed = "alpha_us=0,beta_us_per_byte=1,ar2_beta_us_per_byte=1,ar2_stage_us=0,ar2_chunk_us=0"
    for size in sorted(data[2]):
        if size not in data[3]:
            continue
        p, q = statistics.median(data[2][size]), statistics.median(data[3][size])
        print(f"{size:>12} {p:>8.2f} {q:>8.2f} {q / p:>7.3f} {predicted(size, closed):>7.3f} {predicted(size):>7.3f}")
    for mode in (2, 3):
        try:
            text = open(f"{log}/{shape}-mode{mode}-1.log").read()
        except FileNotFoundError:
            continue
        tab = [l for l in text.splitlines() if re.match(r"^(Iter|\s+\d+\s+\d+\s+\d)", l)]
        ran = re.findall(r"R2CC-AllReduce ran (\d+) times", text)
        print(f"  mode {mode}: node 0 NIC MB per 4 GiB iteration (first round): " +
              (tab[0] + " | " + tab[-1] if tab else "no NIC table") +
              (f"; R2CC-AllReduce ran {ran[0]} times on rank 0" if ran else ""))
PY
exit $fail
