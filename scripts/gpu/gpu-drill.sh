#!/usr/bin/env bash
# GPU check of R2CC_DRILL (issue #34; GPU machine only): the soft fabric's own faults
# stay off and the library cuts the NIC. NVIDIA's nccl-tests (NCCL_TESTS_DIR: AllReduce,
# AllGather, SendRecv, -c 1: every result checked) at 2 x 1 and 3 x 1, and unmodified
# torch.distributed all_reduce in a loop (every result checked) at 2 and 3 ranks; ranks
# share GPU 0, so run it under scripts/gpu/with-mps.sh.
#   scripts/gpu/gpu-drill.sh LOGDIR [PART...]   parts: nccl-tests torch
# Environment: DRILL_KINDS (default "blackhole down"), COLLS (default "all_reduce
# all_gather sendrecv"), SHAPES (default "2x1 3x1").
set -u
cd "$(dirname "$0")/../.." || exit 2
B=${BUILD:-build}
LOG=${1:?usage: scripts/gpu/gpu-drill.sh LOGDIR [nccl-tests] [torch]}
shift
parts=${*:-nccl-tests torch}
mkdir -p "$LOG"
fail=0
for p in $parts; do
	case $p in
	nccl-tests)
		[ -x "${NCCL_TESTS_DIR:-}/all_reduce_perf" ] || { echo "NCCL_TESTS_DIR: nccl-tests' binaries" >&2; exit 2; }
		for c in ${COLLS:-all_reduce all_gather sendrecv}; do
			runs=
			for s in ${SHAPES:-2x1 3x1}; do
				for k in ${DRILL_KINDS:-blackhole down}; do runs="$runs $s:25:2:drill-$k"; done
			done
			# shellcheck disable=SC2086 # runs is a word list
			COLL=$c BYTES="-b 16M -e 512M" ITERS="-n 8 -w 2" TIMEOUT_S=120 STACKS=0 DRILL_AT=${DRILL_AT:-1s} \
				timeout 900 scripts/gpu/gpu-stall.sh "$LOG/$c" $runs || fail=1
		done
		;;
	torch)
		. scripts/softfabric.sh
		for w in 2 3; do
			for k in ${DRILL_KINDS:-blackhole down}; do
				label=torch-$w-$k
				softfabric_env mlx5_0:25,mlx5_2:25,mlx5_3:25 "td-$label-$$"
				export SOFTVERBS_SHAPING=1 SOFTVERBS_TIME_SCALE=${SOFTVERBS_TIME_SCALE:-0.05}
				mkdir -p "$LOG/$label"
				echo "=== $label: torch.distributed all_reduce loop, $w ranks, R2CC_DRILL=node1/mlx5_0=$k@${DRILL_AT:-1s}" >"$LOG/$label/console.txt"
				env LD_PRELOAD="$PWD/$B/lib/libr2cc.so" R2CC_REPORT="$LOG/$label/report.%p" \
					R2CC_DRILL="node1/mlx5_0=$k@${DRILL_AT:-1s}" timeout 300 python3 tests/gpu/torch_repair.py "$w" \
					"${TORCH_ITERS:-600}" $((16 << 20)) >>"$LOG/$label/console.txt" 2>&1
				rc=$?
				softfabric_reset
				v=$(python3 - "$LOG/$label" "$rc" <<'PY'
import glob, json, re, sys
d, rc = sys.argv[1], int(sys.argv[2])
txt = open(d + "/console.txt", errors="replace").read()
m = re.search(r"(\d+) all_reduce of .*: (\d+) wrong", txt)
applied, det, inc, undrilled = [], [], 0, 0
for f in glob.glob(d + "/report.*.json"):
    j = json.load(open(f))
    applied += [s["applied_unix"] for s in j.get("drill", {}).get("steps", []) if s.get("state") == "applied"]
    for i in j.get("incidents", []):
        inc += 1
        undrilled += not i.get("drill")
        det.append(i.get("detected_unix", 0))
t0 = min(applied) if applied else 0
ok = rc == 0 and m and int(m.group(2)) == 0 and t0 and inc and not undrilled
dms = f"{(min(det) - t0) * 1e3:.0f}" if det and t0 else "-"
print(f"{'PASS' if ok else 'FAIL'} {d.rsplit('/', 1)[1]} rc={rc} iters={m.group(1) if m else '-'} "
      f"wrong={m.group(2) if m else '-'} drill_applied={'yes' if t0 else 'NO'} repairs={inc} "
      f"not_marked_drill={undrilled} detect_ms={dms}")
PY
)
				echo "$v" | tee -a "$LOG/summary.txt"
				case $v in PASS*) ;; *) fail=1 ;; esac
			done
		done
		;;
	*) echo "unknown part $p" >&2; fail=1 ;;
	esac
done
exit $fail
