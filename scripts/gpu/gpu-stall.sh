#!/usr/bin/env bash
# GPU check that a healthy job is never taken down (issue: stall detection that tells
# congestion from failure), and that a black hole on the same loaded fabric is still
# repaired. NVIDIA's nccl-tests (NCCL_TESTS_DIR) or r2cc-perf, every result checked
# (-c 1), over soft NICs shaped to a few Gb/s, ranks sharing GPU 0 (run it under
# scripts/gpu/with-mps.sh), R2CC's reports counted for incidents.
#   scripts/gpu/gpu-stall.sh LOGDIR [RUN...]
# A RUN is SHAPExG:GBPS:MODE[:declared][:FAULT] with SHAPE 2x1, 3x1 or 4x1, e.g.
#   4x1:5:2:declared          the run that R2CC used to kill (declared mlx5_2, mode 2)
#   3x1:5:3:declared          the one that hung (mode 3)
#   2x1:1:2                   1 Gb/s, nothing declared
#   4x1:5:2:declared:blackhole  the same load, node 1's mlx5_0 black-holed mid-run
# FAULT (FAULT_AFTER_S into the run, on node 1): blackhole, ackloss, down or fatal (of
# mlx5_0; must be repaired, every result right), and the faults nothing can repair,
# after which the job must end by itself (not by the timeout) with no wrong result:
# blackhole-all and down-all (every NIC of node 1), kill (node 1's process is killed).
# drill-KIND (KIND: down, blackhole, blackhole-tx, blackhole-rx, ackloss, flap:MS): the
# soft device's faults stay off and R2CC_DRILL cuts node 1's mlx5_0, DRILL_AT (default
# 2s) after the first collective; the fault's time is when the reports say the step
# was applied (the earliest rank), and every incident must be marked a drill's.
# COLL: the nccl-tests program (all_reduce, the default, all_gather, reduce_scatter,
# sendrecv). LINK=roce: RoCE v2 soft NICs, a routed subnet per rail, lossless class 106
# with NCCL_IB_GID_INDEX=3 NCCL_IB_TC=106; a run fails if any byte left that class.
# Environment: NCCL_TESTS_DIR (else build/bin's r2cc-perf links), R2CC_LIB (the library
# preloaded, default build/lib/libr2cc.so; 'none' runs plain NCCL), BYTES ("-b 256M -e
# 512M"), ITERS ("-n 3 -w 1"), FAULT_AFTER_S (seconds into the run, default 12),
# TIMEOUT_S (per run, default 150); FAULT_AT_ROW=N: the fault once N result rows are out
# (instead of FAULT_AFTER_S; with ITERS_TABLE, N iterations); ITERS_TABLE=1 with
# r2cc-perf: every iteration verified and timed (--iters-table), and the failover stall
# reported: the slowest iteration but the first (it carries the start-up), minus the mean
# of the three on each side, with the slowest and the median iteration.
# With nccl-tests, ITERS_TABLE=1 times every iteration (-I 1, the times from its -J
# report; the first counts, its warm-up being apart), and FAULT_AFTER_HEADER_S=S cuts S
# seconds after its table's header, inside the first timed run when that is long enough
# (nccl-tests times neither its warm-up nor the collective before each timed run nor its
# check).
# nccl-tests with ITERS "-n N -w 2 -N C" (C cycles, a row each): the same stall, over the
# rows' out-of-place and in-place timed runs in turn (N iterations each). The fault comes
# right after the row (polled every 10 ms): at the start of the next cycle's timed
# iterations, not in the check that follows them (nccl-tests does not time its check).
# One line per run in LOGDIR/summary.txt: PASS/FAIL, exit status, #wrong, incidents that
# were not declared (false repairs when nothing was injected), what R2CC's stall scan
# suspected, the detection time of an injected fault, the busbw of the largest size.
set -u
cd "$(dirname "$0")/../.."
export R2CC_ROOT=$PWD
B=${BUILD:-build}
LOG=${1:?usage: scripts/gpu/gpu-stall.sh LOGDIR [RUN...]}
shift
runs=${*:-4x1:5:2:declared 3x1:5:3:declared 2x1:1:2}
LIB=${R2CC_LIB:-$PWD/$B/lib/libr2cc.so}
BYTES=${BYTES:--b 256M -e 512M}
ITERS=${ITERS:--n 3 -w 1}
FAULT_AFTER_S=${FAULT_AFTER_S:-12}
case ${FAULT_AFTER_HEADER_S:-0} in
*[!0-9.]* | '' | *.*.*)
	echo "gpu-stall: FAULT_AFTER_HEADER_S='$FAULT_AFTER_HEADER_S': accepts seconds (e.g. 0.5)" >&2
	exit 2
	;;
esac
TIMEOUT_S=${TIMEOUT_S:-150}
mkdir -p "$LOG"
. scripts/softfabric.sh
fail=0

one() { # RUN
	local spec=$1 shape gbps mode rest nodes declared=0 bh=0 fault= drill_kind=
	IFS=: read -r shape gbps mode rest <<<"$spec"
	case ":$rest:" in *:declared:*) declared=1 ;; esac
	case ":$rest:" in
	*:blackhole:*) fault=blackhole bh=1 ;;
	*:ackloss:*) fault=ackloss bh=1 ;;
	*:down:*) fault=down bh=1 ;;
	*:fatal:*) fault=fatal bh=1 ;;
	*:blackhole-all:*) fault=blackhole-all ;;
	*:down-all:*) fault=down-all ;;
	*:kill:*) fault=kill ;;
	*:drill-*) fault=drill bh=1 drill_kind=${rest##*drill-} ;;
	esac
	nodes=${shape%x1}
	local label=${spec//:/-} dir="$LOG/${spec//:/-}"
	mkdir -p "$dir"
	softfabric_env "mlx5_0:$gbps,mlx5_2:$gbps,mlx5_3:$gbps" "st-$label-$$"
	export SOFTVERBS_SHAPING=1 SOFTVERBS_TIME_SCALE=${SOFTVERBS_TIME_SCALE:-0.05} NCCL_TESTS_DEVICE=0
	if [ "${LINK:-ib}" = roce ]; then
		export SOFTVERBS_LINK=roce SOFTVERBS_ROUTED=1 SOFTVERBS_LOSSLESS_TC=106 \
			NCCL_IB_GID_INDEX=3 NCCL_IB_TC=106
	fi
	# NCCL's own warnings in the console; nccl-tests' rows line by line (a process that
	# hangs at its end would otherwise never print the failure it found)
	export NCCL_DEBUG=${NCCL_DEBUG:-WARN} R2CC_STDBUF=
	command -v stdbuf >/dev/null && R2CC_STDBUF="stdbuf -oL"
	local -a env=() launch=()
	if [ "$LIB" != none ]; then
		env+=(LD_PRELOAD="$LIB" R2CC_MODE="$mode" R2CC_REPORT="$dir/report.%p" R2CC_DEBUG=INFO)
		[ $declared = 1 ] && env+=(R2CC_FAILED_NODE=0 R2CC_FAILED_HCA=mlx5_2)
		[ -n "$drill_kind" ] && env+=(R2CC_DRILL="node1/mlx5_0=$drill_kind@${DRILL_AT:-2s}")
	fi
	# shellcheck disable=SC2086 # BYTES and ITERS are word lists
	if [ -n "${NCCL_TESTS_DIR:-}" ]; then
		softfabric_mpirun "$nodes" ${env[@]+"${env[@]}"}
		launch=("${SOFTFABRIC_MPIRUN[@]}" "$NCCL_TESTS_DIR/${COLL:-all_reduce}_perf" $BYTES -f 2 -g 1 -c 1 $ITERS)
		[ "${ITERS_TABLE:-0}" = 1 ] && launch+=(-I 1 -J "$dir/iters.json")
	else
		launch=(env "${env[@]}" "$B/bin/r2cc-perf" --nodes "$nodes" --gpus-per-node 1 --coll allreduce
			$BYTES -f 2 -c 1 $ITERS -T $((TIMEOUT_S - 10)))
		[ "${ITERS_TABLE:-0}" = 1 ] && launch+=(--iters-table)
	fi
	echo "=== $spec: ${launch[*]}" >"$dir/console.txt"
	local t0 t_fault=''
	t0=$(date +%s.%N)
	timeout --kill-after=5 "$TIMEOUT_S" "${launch[@]}" >>"$dir/console.txt" 2>&1 &
	local pid=$!
	if [ "$fault" = drill ]; then
		: # the library cuts it (R2CC_DRILL); its reports say when
	elif [ -n "$fault" ] && [ -n "${FAULT_AFTER_HEADER_S:-}" ]; then
		# inside the timed iterations: that long after nccl-tests printed its table's
		# header (its ranks are up; the warm-up and the first timed run follow)
		while kill -0 $pid 2>/dev/null && ! grep -qE '^# +\(B\)' "$dir/console.txt"; do
			sleep 0.01
		done
		sleep "$FAULT_AFTER_HEADER_S"
	elif [ -n "$fault" ] && [ -n "${FAULT_AT_ROW:-}" ]; then
		# in traffic for sure: once the program printed that many result rows
		while kill -0 $pid 2>/dev/null &&
			[ "$(grep -cE '^ +[0-9]+ +[0-9]+ +float |Iter [0-9]+/[0-9]+ END' "$dir/console.txt")" -lt "$FAULT_AT_ROW" ]; do
			sleep 0.01
		done
	fi
	if [ -n "$fault" ] && [ "$fault" != drill ]; then
		[ -n "${FAULT_AT_ROW:-}${FAULT_AFTER_HEADER_S:-}" ] || sleep "$FAULT_AFTER_S"
		local ok=1 nic p
		if ! kill -0 $pid 2>/dev/null; then
			ok=0
		elif [ "$fault" = kill ]; then
			# the rank of node 1: the process whose environment says so
			p=$(grep -lz '^NCCL_HOSTID=node1$' /proc/[0-9]*/environ 2>/dev/null |
				sed 's,/proc/\([0-9]*\)/.*,\1,' | while read -r q; do
				[ "$(cat /proc/"$q"/comm 2>/dev/null)" != bash ] && echo "$q"; done | head -1)
			[ -n "$p" ] && kill -9 "$p" || ok=0
		else
			local kind=${fault%-all} nics=mlx5_0
			[ $bh = 0 ] && nics="mlx5_0 mlx5_2 mlx5_3"
			for nic in $nics; do
				"$B"/bin/softverbs-ctl --fabric "$SOFTVERBS_FABRIC" fault node1 "$nic" "$kind" >>"$dir/console.txt" 2>&1 || ok=0
			done
		fi
		if [ $ok = 1 ]; then
			t_fault=$(date +%s.%N)
			echo "fault injected at $t_fault: node1 $fault" >>"$dir/console.txt"
		else
			echo "fault NOT injected" >>"$dir/console.txt"
			t_fault=-1
		fi
	fi
	# A run still there shortly before its limit: every rank's threads' stacks, to see
	# where it waits. gdb first: cuda-gdb cannot attach to an MPS client ("Late attach
	# is not supported with CUDA MPS"); it does attach without MPS.
	local watcher='' dbg=''
	if command -v gdb >/dev/null; then
		dbg=gdb
	elif command -v cuda-gdb >/dev/null && [ -z "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then
		dbg=cuda-gdb
	fi
	if [ "${STACKS:-1}" = 1 ]; then
		(
			sleep $((TIMEOUT_S - 25))
			kill -0 $pid 2>/dev/null || exit 0
			[ -n "$dbg" ] || { echo "stacks: no gdb here (cuda-gdb cannot attach under MPS)" >>"$dir/console.txt"; exit 0; }
			# the ranks: the processes whose environment names an emulated node
			local n=0 q
			for q in $(grep -lz '^NCCL_HOSTID=node' /proc/[0-9]*/environ 2>/dev/null |
				sed 's,/proc/\([0-9]*\)/.*,\1,'); do
				case $(cat /proc/"$q"/comm 2>/dev/null) in all_reduce_perf | r2cc-perf) ;; *) continue ;; esac
				n=$((n + 1))
				timeout 15 "$dbg" -p "$q" -batch -ex "thread apply all bt 14" 2>&1 |
					grep -v -e '^\[New LWP' -e '^\[New Thread' -e '^\[Thread ' >"$dir/stacks.$q.txt"
			done
			echo "stacks: $n rank processes, with $dbg, $((TIMEOUT_S - 25)) s into the run" >>"$dir/console.txt"
		) &
		watcher=$!
	fi
	wait $pid
	local rc=$?
	[ -n "$watcher" ] && { kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null; }
	local secs lossy=0
	secs=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
	# every NIC's bytes outside the lossless class (RoCE), before the reset clears them
	"$B"/bin/softverbs-ctl --fabric "$SOFTVERBS_FABRIC" list >"$dir/nics.txt" 2>&1
	lossy=$(sed -n 's/.* lossy_bytes=\([0-9]*\).*/\1/p' "$dir/nics.txt" | awk '{s += $1} END {print s + 0}')
	softfabric_reset
	unset SOFTVERBS_LINK SOFTVERBS_ROUTED SOFTVERBS_LOSSLESS_TC NCCL_IB_GID_INDEX NCCL_IB_TC
	# A rank killed, or one that ended on an aborted communicator, while it held the
	# GPU can leave the MPS server refusing new clients ("CUDA-capable device(s)
	# is/are busy or unavailable"): start it again after any run that failed.
	if [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && { [ $rc != 0 ] || [ "$fault" = kill ]; }; then
		pkill -9 -f all_reduce_perf 2>/dev/null
		echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
		sleep 1
		nvidia-cuda-mps-control -d >/dev/null 2>&1
	fi
	# the verdict, from the program's rows and R2CC's reports
	local v
	v=$(ITERS="$ITERS" python3 - "$dir" "$rc" "$bh" "${t_fault:-0}" "$secs" "$spec" "$fault" "$TIMEOUT_S" "$lossy" "${COLL:-all_reduce}" "${LINK:-ib}" <<'PY'
import glob, json, os, re, sys
d, rc, bh, t_fault, secs, spec, fault = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", float(sys.argv[4]), sys.argv[5], sys.argv[6], sys.argv[7]
limit, lossy, coll, link = float(sys.argv[8]), int(sys.argv[9]), sys.argv[10], sys.argv[11]
txt = open(d + "/console.txt", errors="replace").read()
# a result row: size, then out-of-place and in-place time, algbw, busbw, #wrong
row_head = r"^\s+(\d+)\s+\d+\s+float\s+\S+\s+-?\d+"
half = r"\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)"
# nccl-tests -I 1 (ITERS_TABLE=1): four per-iteration columns after each #wrong
per_iter_cols = r"(?:\s+[\d.]+){4}"
rows = (re.findall(row_head + half + per_iter_cols + half + per_iter_cols + r"\s*$", txt, re.M)
        or re.findall(row_head + half + half, txt, re.M))
# #wrong, out of place and in place; nccl-tests checks no in-place sendrecv ("N/A")
cnt = lambda v: int(v) if v.isdigit() else 0
wrong = sum(cnt(r[4]) + cnt(r[8]) for r in rows)
nonnum = [r for r in rows if not r[4].isdigit() or not (r[8].isdigit() or r[8] == "N/A")]
busbw = rows[-1][3] if rows else "-"
# r2cc-perf --iters-table (ITERS_TABLE=1): every iteration verified and timed; the
# failover stall is the slowest iteration (the first one aside) minus the mean of the (up to)
# three iterations on either side of it
its = [(int(a), float(b)) for a, b in re.findall(r"Iter (\d+)/\d+ END: OK \(elapsed (\d+) ms\)", txt)]
its_wrong = len(re.findall(r"Iter \d+/\d+ END: WRONG", txt))
wrong += its_wrong
# nccl-tests -I 1 -J (ITERS_TABLE=1): each timed iteration's time (us; the slowest
# rank's), out-of-place then in-place, from its JSON report
def per_iter(o):
    if isinstance(o, dict):
        for k in ("out_of_place_per_iter", "in_place_per_iter"):
            if isinstance(o.get(k), dict):
                yield from o[k].get("times_us", [])
        for v in o.values():
            if isinstance(v, (dict, list)):
                yield from per_iter(v)
    elif isinstance(o, list):
        for v in o:
            yield from per_iter(v)
# (nccl-tests' first iteration counts; r2cc-perf's and the first cycle's carry the start-up)
first = 1
try:
    if not its:
        its = [(0, t / 1e3) for t in per_iter(json.load(open(d + "/iters.json")))]
        first = 0
except (OSError, ValueError):
    pass
# nccl-tests run cycle by cycle (ITERS "-n N -w W -N C"): a row per cycle, each the mean
# time of N out-of-place then N in-place iterations (us); the series is each half's whole
# timed run (N x the mean, ms), so that the stall is what the failover added to one
if not its and len(rows) > 2:
    m = re.search(r"-n\s+(\d+)", os.environ.get("ITERS", ""))
    n = int(m.group(1)) if m else 1
    its = [(0, n * float(t) / 1e3) for r in rows for t in (r[1], r[5])]
stall = slowest = typical = "-"
if its and bh:
    k = max(range(first, len(its)), key=lambda j: its[j][1]) if len(its) > 2 else None
    if k is not None:
        around = [m for j, (_, m) in enumerate(its) if j >= first and j != k and abs(j - k) <= 3]
        if around:
            stall = f"{its[k][1] - sum(around) / len(around):.0f}"
            # the slowest iteration and the median one: a slowest one near the median
            # says the fault came outside the timed iterations
            slowest = f"{its[k][1]:.1f}"
            typical = f"{sorted(m for _, m in its[first:])[(len(its) - first) // 2]:.1f}"
inc = decl = sus = synth = undrilled = 0
det = []
if fault == "drill":
    # the step's time: the earliest rank that applied it (R2CC_DRILL's reports)
    ts = []
    for f in glob.glob(d + "/report.*.json"):
        try:
            ts += [s["applied_unix"] for s in json.load(open(f)).get("drill", {}).get("steps", []) if s.get("state") == "applied"]
        except Exception:
            pass
    t_fault = min(ts) if ts else -1
for f in glob.glob(d + "/report.*.json"):
    try:
        j = json.load(open(f))
    except Exception:
        continue
    for i in j.get("incidents", []):
        if i.get("declared"):
            decl += 1
        else:
            inc += 1
            undrilled += fault == "drill" and not i.get("drill")
            synth += i.get("completions_synthesised", 0)
            if bh and t_fault and i.get("detected_unix", 0) >= t_fault:
                det.append((i["detected_unix"] - t_fault) * 1e3)
    sus += j.get("stall_scan", {}).get("suspected", 0)
if fault and not bh:
    # nothing to repair: the job ends by itself (124/137: the timeout ended it), with
    # nothing wrong among the rows it printed
    # (the time tells: a rank killed by a signal makes mpirun exit 137 too)
    ok = t_fault > 0 and float(secs) < limit - 1 and rc != 0 and wrong == 0
else:
    ok = rc == 0 and (bool(rows) or bool(its)) and wrong == 0 and not nonnum and (inc > 0 if bh else inc == 0)
    ok = ok and t_fault >= 0
ok = ok and lossy == 0 and undrilled == 0
detect = f"{min(det):.0f}" if det else "-"
print(f"{'PASS' if ok else 'FAIL'} {spec} coll={coll} link={link} rc={rc} rows={len(rows)} "
      f"wrong={wrong} repairs={inc} synthesised={synth} declared_incidents={decl} "
      f"suspected={sus} detect_ms={detect} lossy_bytes={lossy} busbw={busbw} secs={secs}"
      + (f" iters={len(its)} failover_stall_ms={stall} slowest_iter_ms={slowest} median_iter_ms={typical}" if its else "")
      + (f" drill_applied={'yes' if t_fault > 0 else 'NO'} not_marked_drill={undrilled}" if fault == "drill" else ""))
PY
)
	echo "$v" | tee -a "$LOG/summary.txt"
	case $v in PASS*) ;; *) fail=1 ;; esac
}

for r in $runs; do one "$r"; done
exit $fail
