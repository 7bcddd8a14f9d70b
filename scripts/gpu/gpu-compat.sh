#!/usr/bin/env bash
# The NCCL version matrix (issue #17) on the GPU machine: R2CC under each NCCL version, over
# the software fabric, 2 nodes x 1 GPU (both on GPU 0), 3 soft NICs per node shaped to
# 25 Gb/s, every result verified by r2cc-perf. One GPU is enough.
#
#   scripts/gpu/gpu-compat.sh LOGDIR VERSION...        e.g. scripts/gpu/gpu-compat.sh logs/compat 2.18.3
#
# For each VERSION it unpacks NCCL_DIR/libnccl-VERSION-sm90.so.2.xz (scripts/gpu/nccl-versions.sh
# makes them; default NCCL_DIR .artifacts) to a temporary folder, puts that folder on
# LD_LIBRARY_PATH behind the soft device, and runs the parts (PARTS, default all of them, in
# this order; preflight always first, its verdict last):
#   preflight  no GPU: the library loads, ncclGetVersion() is VERSION, it exports every
#              pncclX R2CC forwards to that this version has, and every nccl symbol
#              r2cc-perf needs (a missing one would stop the runs at load time)
#   healthy    verified AllReduce sweep 8 B - 256 MiB with R2CC (mode 2): busbw at 256 MiB
#   blackhole  ITERS verified 512 MiB AllReduces (--iters-table), node0's mlx5_2 black-holed
#   down       after iteration FAULT_AFTER with softverbs-ctl; R2CC must repair (an incident
#              in its report), every iteration verified; figures: detection (ms, from the
#              report), the median iteration before the fault and over the last 10, and the
#              rate after as a fraction of 2/3 of the rate before (1.00 = the ideal of
#              two NICs out of three)
#   mode3      R2CC_MODE=3 with R2CC_FAILED_NODE=0 R2CC_FAILED_HCA=mlx5_2, 64-512 MiB
#              verified, the NIC table of node 0: mlx5_2 must carry nothing; R2CC's log
#              says whether R2CC-AllReduce ran or fell back to Balance (it may at 2 nodes)
#   nccltests  with NCCL_TESTS_DIR set (nccl-tests built on the GPU machine; against
#              2.28.3's headers it runs on every later library): NVIDIA's all_reduce_perf,
#              2 ranks by mpirun, a verified sweep 8 B - 128 MiB (-n 40), node0's
#              mlx5_2 black-holed once the 512 KiB row is out (FAULT_ROW bytes; at the
#              latest FAULT_AFTER_S (30) s in); R2CC must repair, every row right
#   failover   2.29 and later only: blackhole and down again with R2CC preloaded and
#              NCCL_IB_RESILIENCY_PORT_FAILOVER=1 over fused soft NICs (SOFTFABRIC_FUSED=1,
#              NCCL_GIN_ENABLE=0): whether the job survives when both act on the fault
#              (see docs/nccl-versions.md); reported as failover-blackhole/failover-down
#
# What each version needs beyond scripts/softfabric.sh (docs/nccl-versions.md says why):
# a bus id on the topology's <nic> for 2.19 (SOFTVERBS_TOPO_NIC_BUSID); NCCL_IB_MERGE_NICS=0
# below 2.24 (2.20-2.23 compare the PCI paths of the NICs to fuse
# them, and soft NICs have none); NCCL_GIN_TYPE=2 is ignored below 2.28.7.
#
# Output: LOGDIR/summary.txt, one line per version
#   VERSION healthy=PASS|FAIL blackhole=... down=... mode3=... [failover-blackhole=...
#   failover-down=...] busbw=GB/s blackhole_detect_ms=... blackhole_after=... down_... mode3_ar2=
#   RAN/BALANCE (how many AllReduces R2CC-AllReduce ran and how many fell back) ...
# with the part's reasons below it (indented), and LOGDIR/VERSION/ with every run's log,
# R2CC's reports and the fault commands. Exit status 0 when every part of every version
# passed. Budget (an estimate: nothing of it has run on the GPU yet): each run is one
# r2cc-perf launch, 5-10 s of CUDA and NCCL start-up and a few seconds of traffic at
# 9.4 GB/s, so 1-1.5 minutes per version below 2.29 (4 runs) and about 2 minutes from
# 2.29 (6 runs); a hung run costs at most PERF_TIMEOUT (default 100 s; r2cc-perf's own
# watchdog, -T 60, ends a collective stuck for 60 s), so at worst 7 and 10 minutes.
# NCCL's transport timeouts are scaled by SCALE (default 0.05: 34 s become 1.7 s). Two
# versions below 2.29 fit one 10-minute call; give a 2.29+ version a call of its own (or
# pair two with PERF_TIMEOUT=60).
#
# Settings: NCCL_DIR, PARTS, ITERS (40), FAULT_AFTER (10), GBPS (25), SCALE (0.05),
# PERF_TIMEOUT (100), BUILD (build), NCCL_TESTS_DIR, FAULT_ROW (524288) and FAULT_AFTER_S
# (30, seconds) for nccltests; R2CC_PERF, SOFTVERBS_CTL, R2CC_LIB, MPIRUN override the build's and the
# machine's programs (the CPU test uses test doubles). Needs build/ made on the build
# machine.
set -u
cd "$(dirname "$0")/../.." || exit 2
export R2CC_ROOT=$PWD
export LC_ALL=C
B=${BUILD:-build}
LOG=${1:?usage: scripts/gpu/gpu-compat.sh LOGDIR VERSION...}
shift
[ $# -gt 0 ] || { echo "usage: scripts/gpu/gpu-compat.sh LOGDIR VERSION..." >&2; exit 2; }
NCCL_DIR=${NCCL_DIR:-.artifacts}
PARTS=${PARTS:-preflight healthy blackhole down mode3 failover${NCCL_TESTS_DIR:+ nccltests}}
ITERS=${ITERS:-40}
FAULT_AFTER=${FAULT_AFTER:-10}
GBPS=${GBPS:-25}
SCALE=${SCALE:-0.05}
PERF_TIMEOUT=${PERF_TIMEOUT:-100}
FAULT_AFTER_S=${FAULT_AFTER_S:-30}
FAULT_ROW=${FAULT_ROW:-524288}
for s in ITERS FAULT_AFTER GBPS PERF_TIMEOUT FAULT_ROW; do
	[[ ${!s} =~ ^[1-9][0-9]*$ ]] || { echo "gpu-compat.sh: $s='${!s}': a positive whole number" >&2; exit 2; }
done
for s in SCALE FAULT_AFTER_S; do
	[[ ${!s} =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]] || { echo "gpu-compat.sh: $s='${!s}': a number of the form 0.05" >&2; exit 2; }
done
PERF=${R2CC_PERF:-$PWD/$B/bin/r2cc-perf}
CTL=${SOFTVERBS_CTL:-$PWD/$B/bin/softverbs-ctl}
LIB=${R2CC_LIB:-$PWD/$B/lib/libr2cc.so}
NICS=mlx5_0,mlx5_2,mlx5_3
CUT=mlx5_2
mkdir -p "$LOG" || exit 2
LOG=$(cd "$LOG" && pwd)
SUM=$LOG/summary.txt
: >"$SUM"
# shellcheck source=scripts/softfabric.sh
. scripts/softfabric.sh
BASE_LDP=${LD_LIBRARY_PATH:-}
fail=0

for v in "$@"; do
	[[ $v =~ ^2\.[0-9]+\.[0-9]+$ ]] || { echo "gpu-compat.sh: $v is not a version like 2.28.9" >&2; exit 2; }
done
for p in $PARTS; do
	case $p in preflight | healthy | blackhole | down | mode3 | failover | nccltests) ;;
	*) echo "gpu-compat.sh: unknown part $p" >&2; exit 2 ;; esac
done
if [ "$PARTS" != preflight ]; then
	for f in "$PERF" "$CTL" "$LIB" "$B/softverbs/libibverbs.so.1"; do
		[ -e "$f" ] || { echo "gpu-compat.sh: missing $f: run make on the build machine and carry build/" >&2; exit 2; }
	done
fi

# minor VERSION: 2.28.9 -> 28
minor() { local m=${1#*.}; echo "${m%%.*}"; }
# "iteration elapsed_ms" for every verified iteration of an --iters-table log
iter_ms() { sed -nE 's/.*Iter ([0-9]+)\/[0-9]+ END: OK \(elapsed ([0-9]+) ms\).*/\1 \2/p' "$1"; }
last_iter() { sed -nE 's/.*Iter ([0-9]+)\/[0-9]+ END.*/\1/p' "$1" 2>/dev/null | tail -n1 | grep . || echo 0; }
indent() { sed 's/^/    /'; }
median() { sort -n | awk '{a[NR] = $1} END {if (!NR) print "-"; else print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}'; }

# unpack VERSION: the library into a temporary folder NCCLDIR; status 1 when it cannot.
unpack() {
	local xzf=$NCCL_DIR/libnccl-$1-sm90.so.2.xz
	NCCLDIR=
	[ -r "$xzf" ] || { note "no $xzf (scripts/gpu/nccl-versions.sh makes it; set NCCL_DIR)"; return 1; }
	NCCLDIR=$(mktemp -d "${TMPDIR:-/tmp}/nccl-$1.XXXXXX") || return 1
	if command -v xz >/dev/null; then
		xz -dc "$xzf" >"$NCCLDIR/libnccl.so.2"
	else
		python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
			"$xzf" "$NCCLDIR/libnccl.so.2"
	fi || { note "cannot decompress $xzf"; return 1; }
}

# The reasons of the current version, indented under its line in summary.txt.
note() { NOTES+=("$*"); }

# preflight: the library as the loader and R2CC will see it, on the CPU.
part_preflight() {
	local out=$VLOG/preflight.txt
	python3 - "$NCCLDIR/libnccl.so.2" "$V" "$PERF" intercept/nccl_funcs.def >"$out" 2>&1 <<'PY'
import ctypes, re, subprocess, sys
lib, ver, perf, defs = sys.argv[1:5]
want = sum(int(x) * m for x, m in zip(ver.split("."), (10000, 100, 1)))
why = []
try:
    h = ctypes.CDLL(lib)
except OSError as e:
    print("preflight: FAIL: the library does not load: %s" % e)
    sys.exit(1)
v = ctypes.c_int(0)
rc = h.ncclGetVersion(ctypes.byref(v))
print("ncclGetVersion: %d (rc %d), want %d" % (v.value, rc, want))
if rc != 0 or v.value != want:
    why.append("ncclGetVersion %d, want %d" % (v.value, want))
def has(name):
    try:
        getattr(h, name)
        return True
    except AttributeError:
        return False
# What R2CC forwards to: every pncclX of intercept/nccl_funcs.def. The ones a version
# lacks are resolved lazily and cost nothing until called; list them.
names = re.findall(r"^R2CC_NCCL_(?:FN|OWN|REAL)\((\w+),", open(defs).read(), re.M)
lacks = [n for n in names if not has("pnccl" + n)]
print("pnccl aliases: %d of %d present; absent in this version: %s" % (
    len(names) - len(lacks), len(names), " ".join(lacks) or "none"))
need = [n for n in ("GetVersion", "GetUniqueId", "CommInitRank", "AllReduce", "CommDestroy",
                    "GroupStart", "GroupEnd", "CommSplit", "CommCount", "CommUserRank")
        if n in lacks]
if need:
    why.append("absent pncclX that R2CC needs: " + " ".join("pnccl" + n for n in need))
try:
    und = subprocess.run(["nm", "-D", "--undefined-only", perf], capture_output=True,
                         text=True, timeout=60).stdout.split()
    need = sorted({s.split("@")[0] for s in und if s.startswith("nccl")})
except (OSError, subprocess.SubprocessError):
    need = []
if need:
    miss = [s for s in need if not has(s)]
    print("r2cc-perf needs %d nccl symbols; missing: %s" % (len(need), " ".join(miss) or "none"))
    if miss:
        why.append("r2cc-perf would not load: no " + " ".join(miss))
else:
    print("r2cc-perf's nccl symbols: not checked (no nm, or r2cc-perf is no ELF program)")
print("preflight: " + ("FAIL: " + "; ".join(why) if why else "PASS"))
sys.exit(1 if why else 0)
PY
	local rc=$?
	sed 's/^/    /' "$out"
	[ $rc -eq 0 ] || note "$(tail -n1 "$out")"
	return $rc
}

# The fabric and NCCL settings of one run; NAME is the fabric's name.
run_env() { # NAME FUSED(0|1)
	# the soft device first (softfabric_env puts it there), then this version's NCCL,
	# ahead of any other libnccl.so.2 on the caller's path
	export LD_LIBRARY_PATH=$NCCLDIR${BASE_LDP:+:$BASE_LDP}
	unset NCCL_IB_MERGE_NICS NCCL_IB_RESILIENCY_PORT_FAILOVER NCCL_GIN_ENABLE NCCL_TOPO_DUMP_FILE
	# 2.19 wants a bus id on every child of the GPU's CPU node (softverbs/topo.sh)
	if [ "$(minor "$V")" = 19 ]; then export SOFTVERBS_TOPO_NIC_BUSID=ffff:ff:1f.7; else unset SOFTVERBS_TOPO_NIC_BUSID; fi
	SOFTFABRIC_FUSED=$2 softfabric_env "${NICS//,/:$GBPS,}:$GBPS" "cmp-$1-$$"
	export SOFTVERBS_SHAPING=1 SOFTVERBS_TIME_SCALE=$SCALE
	[ "$(minor "$V")" -lt 24 ] && [ "$2" = 0 ] && export NCCL_IB_MERGE_NICS=0
	true
}

# r2cc-perf in the background with R2CC preloaded; its log is $1. Sets JOB.
perf_bg() { # LOGFILE REPORTDIR [ENV=VALUE...] -- ARGS...
	local out=$1 rep=$2
	shift 2
	local envs=()
	while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
	shift
	mkdir -p "$rep"
	env LD_PRELOAD="$LIB" R2CC_REPORT="$rep/report.%p" NCCL_DEBUG="${NCCL_DEBUG:-WARN}" \
		${envs[@]+"${envs[@]}"} timeout "$PERF_TIMEOUT" "$PERF" --nodes 2 --gpus-per-node 1 -T 60 "$@" \
		>"$out" 2>&1 &
	JOB=$!
}

# The NCCL r2cc-perf loaded must be this version's, from NCCLDIR.
right_nccl() { # LOG
	local line
	line=$(grep -m1 -E "NCCL library" "$1")
	[[ $line == *"NCCL library $V ("*"$NCCLDIR"* ]] && return 0
	note "$(basename "$1"): not the NCCL under test: ${line:-no 'NCCL library' line}"
	return 1
}

# Detection: from the fault (EPOCH, when softverbs-ctl was started) to the first
# incident R2CC's reports under DIR record after it ("detected_unix"; declared moves do
# not count), in ms; "-" when there is none.
detect_ms() { # DIR EPOCH
	python3 - "$1" "$2" <<'PY'
import glob, json, sys
t0, best = float(sys.argv[2]), None
for f in glob.glob(sys.argv[1] + "/*.json"):
    try:
        d = json.load(open(f))
    except (OSError, ValueError):
        continue
    for i in d.get("incidents", []):
        t = i.get("detected_unix")
        if i.get("declared") or not isinstance(t, (int, float)) or t < t0:
            continue
        best = t if best is None else min(best, t)
print("-" if best is None else "%.1f" % ((best - t0) * 1000))
PY
}

healthy_bw=
part_healthy() {
	local log=$VLOG/healthy.log rc out
	run_env healthy 0
	perf_bg "$log" "$VLOG/healthy-reports" -- --coll allreduce -b 8 -e 256M -f 2 -n 5 -w 1 -c 1 -d float -o sum
	wait $JOB
	rc=$?
	softfabric_reset
	out=$(python3 -I -S scripts/scenarios/results.py check --label healthy --status $rc "$log")
	local st=$?
	indent <<<"$out"
	healthy_bw=$(sed -nE 's/.*busbw at [^:]+: ([0-9.]+) \/.*/\1/p' <<<"$out" | head -n1)
	FIG+=("busbw=${healthy_bw:--}")
	[ $st -eq 0 ] || note "healthy: $(grep -vE 'busbw at|#wrong 0' <<<"$out" | tail -n1)"
	right_nccl "$log" || st=1
	return $st
}

# One hot-repair run: ITERS verified 512 MiB AllReduces, FAULT after FAULT_AFTER.
repair_run() { # LABEL FAULT FUSED [ENV=VALUE...]
	local label=$1 fault=$2 fz=$3
	shift 3
	local log=$VLOG/$label.log rep=$VLOG/$label-reports at rc st=0 t_fault=0
	run_env "$label" "$fz"
	[ "$fz" = 1 ] && export NCCL_GIN_ENABLE=0
	perf_bg "$log" "$rep" "$@" -- --coll allreduce -b 512M -e 512M -n "$ITERS" -w 1 -c 1 -d float -o sum --iters-table
	for _ in $(seq 1200); do
		[ "$(last_iter "$log")" -ge "$FAULT_AFTER" ] && break
		kill -0 $JOB 2>/dev/null || break
		sleep 0.1
	done
	at=$(last_iter "$log")
	t_fault=$(date +%s.%N)
	if kill -0 $JOB 2>/dev/null && [ "$at" -ge "$FAULT_AFTER" ] &&
		"$CTL" --fabric "$SOFTVERBS_FABRIC" fault node0 "$CUT" "$fault" >"$log.fault" 2>&1; then
		echo "fault $fault of node0/$CUT after iteration $at at $t_fault" >>"$log.fault"
	else
		echo "fault NOT injected (run ended or softverbs-ctl failed) after iteration $at" >>"$log.fault"
		note "$label: the fault was not injected (after iteration $at)"
		st=1
	fi
	wait $JOB
	rc=$?
	softfabric_reset
	iter_ms "$log" >"$log.ms"
	local n base after det ratio gb
	n=$(wc -l <"$log.ms")
	base=$(awk -v f="$at" '$1 > 1 && $1 <= f {print $2}' "$log.ms" | median)
	after=$(awk -v f="$at" -v n="$ITERS" '$1 > f + 2 && $1 > n - 10 {print $2}' "$log.ms" | median)
	det=$(detect_ms "$rep" "$t_fault")
	ratio=$(awk -v b="$base" -v a="$after" 'BEGIN {if (b + 0 > 0 && a + 0 > 0) printf "%.2f", (b / a) / (2 / 3); else print "-"}')
	gb=$(awk -v a="$after" 'BEGIN {if (a + 0 > 0) printf "%.2f", 536870912 / (a / 1000) / 1e9; else print "-"}')
	echo "    exit $rc; $n/$ITERS iterations verified; fault after iteration $at; detection ${det} ms"
	echo "    median iteration before $base ms, last 10 $after ms ($gb GB/s algbw) = $ratio x 2/3 of the rate before"
	grep -E "R2CC (WARN|INFO) .*(repair|moved|migrat)|NCCL WARN|TEST (PASS|FAIL)|failed:|timed out" "$log" |
		sed -E 's/^[^ ]+ [^ ]+ //' | sort | uniq -c | sort -rn | head -n 6 | sed 's/^/    /'
	FIG+=("${label}_detect_ms=$det" "${label}_after=$ratio")
	right_nccl "$log" || st=1
	if [ $rc -ne 0 ] || ! grep -q "TEST PASS" "$log" || [ "$n" -ne "$ITERS" ]; then
		note "$label: exit $rc, $n/$ITERS iterations verified$(grep -m1 -E '^rank [0-9]+: |TEST FAIL|timed out' "$log" | sed 's/^/: /')"
		st=1
	fi
	if [ "$det" = - ] && [ "${REQUIRE_INCIDENT:-1}" = 1 ]; then
		note "$label: no incident in R2CC's reports: R2CC did not repair"
		st=1
	fi
	return $st
}

part_mode3() {
	local log=$VLOG/mode3.log rc out st
	run_env mode3 0
	perf_bg "$log" "$VLOG/mode3-reports" R2CC_MODE=3 R2CC_FAILED_NODE=0 R2CC_FAILED_HCA=$CUT R2CC_DEBUG=INFO -- \
		--coll allreduce -b 64M -e 512M -f 2 -n 5 -w 1 -c 1 -d float -o sum --nic-table=0
	wait $JOB
	rc=$?
	softfabric_reset
	out=$(python3 -I -S scripts/scenarios/results.py check --label mode3 --status $rc --declared-nic "$CUT" \
		--require-placement "$log")
	st=$?
	indent <<<"$out"
	grep -ohE "R2CC-AllReduce: [^;]*|R2CC-AllReduce ran [0-9]+ times, [0-9]+ AllReduces ran as Balance" "$log" |
		sort | uniq -c | sort -rn | head -n 5 | sed 's/^/    R2CC log: /'
	# "ran/as Balance" of the first rank that says (R2CC_DEBUG=INFO, at destroy)
	FIG+=("mode3_ar2=$(sed -nE 's/.*R2CC-AllReduce ran ([0-9]+) times, ([0-9]+) AllReduces ran as Balance.*/\1\/\2/p' "$log" | head -n1 | grep . || echo -)")
	[ $st -eq 0 ] || note "mode3: $(grep -vE 'busbw at|#wrong 0' <<<"$out" | tail -n1)"
	right_nccl "$log" || st=1
	return $st
}

# NVIDIA's nccl-tests: all_reduce_perf from NCCL_TESTS_DIR, 2 ranks started by mpirun
# (MPIRUN), R2CC preloaded, a verified sweep 8 B - 128 MiB with a black hole on node0's
# CUT once nccl-tests has printed its FAULT_ROW row, printed line by line (the rows after
# it run on two NICs; FAULT_AFTER_S bounds the wait); every row must
# be right, R2CC must have repaired, and the library nccl-tests reports must be this one.
part_nccltests() {
	local log=$VLOG/nccltests.log rep=$VLOG/nccltests-reports rc out st want e
	if [ -z "${NCCL_TESTS_DIR:-}" ] || [ ! -x "$NCCL_TESTS_DIR/all_reduce_perf" ]; then
		note "nccltests: no NCCL_TESTS_DIR/all_reduce_perf (build nccl-tests on the GPU machine)"
		return 1
	fi
	run_env nccltests 0
	mkdir -p "$rep"
	export NCCL_DEBUG=${NCCL_DEBUG:-WARN} NCCL_TESTS_DEVICE=0 R2CC_STDBUF=
	command -v stdbuf >/dev/null && R2CC_STDBUF="stdbuf -oL"
	softfabric_mpirun 2 LD_PRELOAD="$LIB" R2CC_REPORT="$rep/report.%p"
	timeout "$PERF_TIMEOUT" "${SOFTFABRIC_MPIRUN[@]}" \
		"$NCCL_TESTS_DIR/all_reduce_perf" -b 8 -e 128M -f 4 -g 1 -c 1 -n 40 -w 1 >"$log" 2>&1 &
	local job=$! t_end=$((SECONDS + ${FAULT_AFTER_S%.*} + 1))
	while kill -0 $job 2>/dev/null && [ $SECONDS -lt $t_end ] &&
		! awk -v b="$FAULT_ROW" '$1 == b { f = 1 } END { exit !f }' "$log"; do
		sleep 0.1
	done
	local t_fault
	t_fault=$(date +%s.%N)
	if kill -0 $job 2>/dev/null &&
		"$CTL" --fabric "$SOFTVERBS_FABRIC" fault node0 "$CUT" blackhole >"$log.fault" 2>&1; then
		echo "fault blackhole of node0/$CUT at $t_fault" >>"$log.fault"
	else
		note "nccltests: the fault was not injected (the run had ended)"
		st=1
	fi
	wait $job
	rc=$?
	softfabric_reset
	out=$(python3 -I -S scripts/scenarios/results.py check --label nccltests --status $rc "$log")
	[ $? -eq 0 ] || st=1
	indent <<<"$out"
	[ "${st:-0}" = 0 ] || note "nccltests: $(grep -vE 'busbw at|#wrong 0' <<<"$out" | tail -n1)"
	IFS=. read -r e want _ <<<"$V"
	want=$((e * 10000 + want * 100 + ${V##*.}))
	grep -qE "nccl-library=$want\b" "$log" ||
		{ note "nccltests: not the NCCL under test: $(grep -m1 -oE 'nccl-library=[0-9]+' "$log" || echo 'no nccl-library')"; st=1; }
	local d
	d=$(detect_ms "$rep" "$t_fault")
	FIG+=("nccltests_detect_ms=$d")
	if [ "$d" = - ]; then
		note "nccltests: no incident in R2CC's reports after the fault: R2CC did not repair"
		st=1
	fi
	return "${st:-0}"
}

verdict() { # PART STATUS
	if [ "$2" = 0 ]; then V_LINE+=" $1=PASS"; else V_LINE+=" $1=FAIL"; fail=1; fi
}

for V in "$@"; do
	VLOG=$LOG/$V
	mkdir -p "$VLOG"
	NOTES=() FIG=() V_LINE=$V
	t0=$SECONDS
	echo "=== NCCL $V"
	if ! unpack "$V"; then
		for p in $PARTS; do
			case $p in
			preflight) ;;
			failover) [ "$(minor "$V")" -ge 29 ] && V_LINE+=" failover-blackhole=FAIL failover-down=FAIL" ;;
			*) V_LINE+=" $p=FAIL" ;;
			esac
		done
		[[ " $PARTS " == *" preflight "* ]] && V_LINE+=" preflight=FAIL"
		fail=1
	else
		pre=
		if [[ " $PARTS " == *" preflight "* ]]; then
			echo "--- $V preflight"
			part_preflight
			pre=$?
		fi
		for p in $PARTS; do
			[ "$p" = preflight ] || echo "--- $V $p"
			case $p in
			healthy) part_healthy; verdict healthy $? ;;
			blackhole | down) repair_run "$p" "$p" 0; verdict "$p" $? ;;
			mode3) part_mode3; verdict mode3 $? ;;
			nccltests) part_nccltests; verdict nccltests $? ;;
			failover)
				if [ "$(minor "$V")" -ge 29 ]; then
					for f in blackhole down; do
						echo "--- $V failover-$f"
						REQUIRE_INCIDENT=0 repair_run "failover-$f" "$f" 1 NCCL_IB_RESILIENCY_PORT_FAILOVER=1
						verdict "failover-$f" $?
					done
				fi
				;;
			esac
		done
		# after the four verdicts the issue's table starts with
		[ -n "$pre" ] && verdict preflight "$pre"
	fi
	[ -n "$NCCLDIR" ] && rm -rf "$NCCLDIR"
	echo "$V_LINE ${FIG[*]} ($((SECONDS - t0)) s)" | tee -a "$SUM"
	for n in "${NOTES[@]+"${NOTES[@]}"}"; do echo "    $n" | tee -a "$SUM"; done
done
echo "=== gpu-compat.sh: $([ $fail -eq 0 ] && echo ok || echo FAILED) ($SUM)"
exit $fail
