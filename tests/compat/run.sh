#!/usr/bin/env bash
# CPU test of the NCCL version matrix's scripts, without a GPU, NCCL or a network:
# scripts/gpu/gpu-compat.sh run against test doubles (tests/compat/fake: an r2cc-perf that
# names the libnccl.so.2 it was given and reacts to the fake softverbs-ctl's faults, and
# tiny libnccl.so.2 stand-ins whose ncclGetVersion() answers a chosen version, xz'd as
# scripts/gpu/nccl-versions.sh writes them), asserting on summary.txt and the exit status:
# every part passes; the NCCL_IB_MERGE_NICS=0 setting below 2.24 only; a bus id on the
# topology's <nic> for 2.19 only; the failover parts
# from 2.29 only, over fused NICs; plain NCCL dying at the fault, a repair with no R2CC
# incident, a declared NIC that still carries traffic, a library that reports another
# version and a missing library all fail; bad arguments are refused. Then
# scripts/gpu/nccl-versions.sh: syntax, its refusal of a folder git does not ignore, and
# --list's nearest-version rule against a fake pip.
#   tests/compat/run.sh        (KEEP=1 keeps the temporary directory)
set -u
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
T=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] && echo "kept $T" || rm -rf "$T"' EXIT
RUN_TAIL=12
. tests/lib.sh
for v in $(compgen -e | grep -E '^(NCCL_|SOFTVERBS_|R2CC_|FAKE_)'); do unset "$v"; done
unset PARTS ITERS FAULT_AFTER NCCL_DIR

# has FILE REGEX...: every extended regex matches a line of FILE
has() {
	local f=$1 re
	shift
	for re in "$@"; do
		grep -qE -- "$re" "$f" && ok || fail "$f: no line matches: $re"
	done
}
lacks() {
	local f=$1 re
	shift
	for re in "$@"; do
		grep -qE -- "$re" "$f" && fail "$f: unexpected line: $(grep -m1 -E -- "$re" "$f")" || ok
	done
}

for f in scripts/gpu/gpu-compat.sh scripts/gpu/nccl-versions.sh tests/compat/fake/r2cc-perf; do
	bash -n "$f" && ok || fail "bash -n $f"
done

# The libraries: VERSION's stand-in, and one that lies about its version.
A=$T/art
mkdir -p "$A"
fake_lib() { # FILE-VERSION CODE [old]
	local extra=()
	[ "${3:-}" = old ] && extra=(-DFAKE_NCCL_OLD)
	cc -shared -fPIC -O1 -DFAKE_NCCL_VERSION="$2" "${extra[@]}" -o "$T/libnccl-$1.so.2" \
		tests/compat/fake/nccl.c && xz -c "$T/libnccl-$1.so.2" >"$A/libnccl-$1-sm90.so.2.xz"
}
fake_lib 2.18.3 21803 old && fake_lib 2.21.5 22105 && fake_lib 2.30.7 23007 && fake_lib 2.26.5 22809 &&
	fake_lib 2.19.3 21903 old ||
	{ echo "FAIL: cannot build the fake libraries"; exit 1; }
cc -shared -fPIC -o "$T/libr2cc.so" -x c /dev/null || { echo "FAIL: cannot build a stand-in libr2cc.so"; exit 1; }

export FAKE_STATE=$T/state FAKE_ITER_S=0.05 NCCL_DIR=$A ITERS=30 FAULT_AFTER=4
export R2CC_PERF=$ROOT/tests/compat/fake/r2cc-perf SOFTVERBS_CTL=$ROOT/tests/scenarios/fake/softverbs-ctl
export R2CC_LIB=$T/libr2cc.so TMPDIR=$T
mkdir -p "$FAKE_STATE"

# --- every part passes, for an old, a middle and a resilient version -------------------
run all 0 scripts/gpu/gpu-compat.sh "$T/all" 2.18.3 2.21.5 2.30.7
S=$T/all/summary.txt
has "$S" \
	'^2\.18\.3 healthy=PASS blackhole=PASS down=PASS mode3=PASS preflight=PASS busbw=9\.3 blackhole_detect_ms=[0-9]+\.[0-9] blackhole_after=1\.00 down_detect_ms=[0-9]+\.[0-9] down_after=1\.00 ' \
	'^2\.21\.5 healthy=PASS blackhole=PASS down=PASS mode3=PASS preflight=PASS ' \
	'^2\.30\.7 healthy=PASS blackhole=PASS down=PASS mode3=PASS failover-blackhole=PASS failover-down=PASS preflight=PASS '
has "$S" '^2\.18\.3 .* mode3_ar2=8/2 '
lacks "$S" '^2\.(18|21)\.[0-9]+ .*failover' '^    '
# detection: from the fault to the first undeclared incident, 4.5 ms after it in the fake
for d in $(grep -oE '_detect_ms=[0-9.]+' "$S" | cut -d= -f2); do
	awk -v d="$d" 'BEGIN { exit !(d >= 4.5 && d < 2000) }' && ok || fail "$S: detection $d ms, expected 4.5 ms or a little more"
done
has "$T/all/2.18.3/preflight.txt" 'absent in this version: CommInitRankScalable CommShrink AlltoAll Gather Scatter GroupSimulateEnd'
has "$T/all/2.30.7/preflight.txt" 'absent in this version: none'
has "$T/all/2.18.3/blackhole.log.fault" '^fault blackhole of node0/mlx5_2 after iteration ([4-9]|1[0-9]) '
has "$T/all/2.18.3/down.log.fault" '^fault down of node0/mlx5_2 after iteration ([4-9]|1[0-9]) '
has "$T/all/2.18.3/mode3.log" 'NCCL library 2\.18\.3 \(.*/nccl-2\.18\.3\.[^/]*/libnccl\.so\.2\)'
has "$T/state/ctl.log" 'fault node0 mlx5_2 blackhole$' 'fault node0 mlx5_2 down$'
# 4 runs for 2.18.3 and 2.21.5 each, 6 for 2.30.7; R2CC preloaded in all of them
c=$(grep -c 'preload=yes' "$T/state/perf.calls")
[ "$c" = 14 ] && ok || fail "perf.calls: $c runs with R2CC preloaded, expected 14"
c=$(grep -c 'merge=0' "$T/state/perf.calls")
[ "$c" = 8 ] && ok || fail "perf.calls: NCCL_IB_MERGE_NICS=0 in $c runs, expected 8 (2.18.3 and 2.21.5)"
c=$(grep -c 'failover=1 fused_merge_level=unset' "$T/state/perf.calls")
[ "$c" = 2 ] && ok || fail "perf.calls: $c failover runs over fused NICs, expected 2"
has "$T/state/perf.calls" 'mode=3'
c=$(grep -c 'nic_busid=1' "$T/state/perf.calls")
[ "$c" = 0 ] && ok || fail "perf.calls: a bus id on the topology's <nic> in $c runs, expected none (2.19 only)"
rm -f "$T/state/perf.calls"

# nccl-tests (NCCL_TESTS_DIR, started by mpirun): the part passes with a repair after the
# fault and the library under test; without an all_reduce_perf it fails and says why. The
# fault follows the FAULT_ROW row (the double's 512 B row, 0.3 s in), not FAULT_AFTER_S
# (20 s: the run would be over).
rm -f "$T/state/dead" # an earlier run's fault
NCCL_TESTS_DIR=$ROOT/tests/compat/fake MPIRUN=$ROOT/tests/compat/fake/mpirun FAULT_AFTER_S=20 \
	FAULT_ROW=512 FAKE_ITER_S=0.1 PARTS="preflight nccltests" run nt 0 scripts/gpu/gpu-compat.sh "$T/nt" 2.21.5
has "$T/nt/summary.txt" '^2\.21\.5 nccltests=PASS preflight=PASS nccltests_detect_ms=[0-9]+\.[0-9] '
has "$T/nt/2.21.5/nccltests.log" 'nccl-library=22105' '^ +8192 '
has "$T/nt/2.21.5/nccltests.log.fault" '^fault blackhole of node0/mlx5_2 at '
NCCL_TESTS_DIR=$T/none PARTS=nccltests run nt-none 1 scripts/gpu/gpu-compat.sh "$T/nt-none" 2.21.5
has "$T/nt-none/summary.txt" '^2\.21\.5 nccltests=FAIL' 'nccltests: no NCCL_TESTS_DIR/all_reduce_perf'
rm -f "$T/state/perf.calls"

# 2.19 alone gets a bus id on the soft topology's <nic> (softverbs/topo.sh says why).
PARTS=healthy run v219 0 scripts/gpu/gpu-compat.sh "$T/v219" 2.19.3
has "$T/state/perf.calls" '^merge=0 .* nic_busid=1$'
rm -f "$T/state/perf.calls"

# A libnccl.so.2 already on the caller's path (the system's, say) must not be the one run.
mkdir -p "$T/decoy" && cp "$T/libnccl-2.26.5.so.2" "$T/decoy/libnccl.so.2"
LD_LIBRARY_PATH=$T/decoy PARTS=healthy run decoy 0 scripts/gpu/gpu-compat.sh "$T/decoy-out" 2.18.3
has "$T/decoy-out/2.18.3/healthy.log" 'NCCL library 2\.18\.3 \('
rm -f "$T/state/perf.calls"

# --- failures ---------------------------------------------------------------------------
FAKE_DIE=1 PARTS="blackhole down" run die 1 scripts/gpu/gpu-compat.sh "$T/die" 2.26.5
has "$T/die/summary.txt" '^2\.26\.5 blackhole=FAIL down=FAIL ' \
	'^    blackhole: exit 2, [0-9]+/30 iterations verified: rank 0: NCCL asynchronous error' \
	'^    blackhole: no incident in R2CC' '^    down: exit 2, '
FAKE_NO_INCIDENT=1 PARTS=blackhole run noinc 1 scripts/gpu/gpu-compat.sh "$T/noinc" 2.26.5
has "$T/noinc/summary.txt" '^2\.26\.5 blackhole=FAIL ' '^    blackhole: no incident in R2CC'
FAKE_DECLARED_USED=1 PARTS=mode3 run used 1 scripts/gpu/gpu-compat.sh "$T/used" 2.26.5
has "$T/used/summary.txt" '^2\.26\.5 mode3=FAIL ' '^    mode3: .*NOTE: mlx5_2 \(declared failed\) still carried'
# the file says 2.26.5, the library inside is 2.28.9
PARTS="preflight healthy" run liar 1 scripts/gpu/gpu-compat.sh "$T/liar" 2.26.5
has "$T/liar/summary.txt" '^2\.26\.5 healthy=FAIL preflight=FAIL ' \
	'^    healthy\.log: not the NCCL under test: .*NCCL library 2\.28\.9' '^    preflight: FAIL: ncclGetVersion 22809, want 22605$'
run missing 1 scripts/gpu/gpu-compat.sh "$T/missing" 2.99.1
has "$T/missing/summary.txt" '^2\.99\.1 healthy=FAIL blackhole=FAIL down=FAIL mode3=FAIL failover-blackhole=FAIL failover-down=FAIL preflight=FAIL' \
	'^    no .*libnccl-2\.99\.1-sm90\.so\.2\.xz'
run badver 2 scripts/gpu/gpu-compat.sh "$T/bad" 2.28
PARTS=nonsense run badpart 2 scripts/gpu/gpu-compat.sh "$T/bad" 2.28.9
run noargs 2 scripts/gpu/gpu-compat.sh "$T/bad"
ITERS=4x run baditers 2 scripts/gpu/gpu-compat.sh "$T/bad" 2.28.9
has "$T/baditers.out" "ITERS='4x': a positive whole number"
FAULT_AFTER_S=soon run badfault 2 scripts/gpu/gpu-compat.sh "$T/bad" 2.28.9
has "$T/badfault.out" "FAULT_AFTER_S='soon': a number"

# --- scripts/gpu/nccl-versions.sh -------------------------------------------------------
mkdir -p "$T/bin"
cat >"$T/bin/pip" <<'EOF'
#!/usr/bin/env bash
[ "$1 $2" = "index versions" ] || exit 1
echo "nvidia-nccl-cu12 (2.32.3)"
echo "Available versions: 2.32.3, 2.30.7, 2.28.9, 2.28.3, 2.26.2.post1, 2.26.2, 2.21.5, 2.18.3, 2.18.1"
EOF
chmod +x "$T/bin/pip"
PIP=$T/bin/pip run list 1 scripts/gpu/nccl-versions.sh --list 2.18.3 2.28.9 2.28.7 2.26.5 2.31.2 2.33.1 2.19.3
has "$T/list.out" '^2\.18\.3 available$' '^2\.28\.9 available$' \
	'^2\.28\.7 MISSING; nearest available: 2\.28\.9$' '^2\.26\.5 MISSING; nearest available: 2\.26\.2$' \
	'^2\.31\.2 MISSING; nearest available: 2\.32\.3$' '^2\.33\.1 MISSING; nearest available: 2\.32\.3$' \
	'^2\.19\.3 MISSING; nearest available: 2\.18\.3$'
PIP=$T/bin/pip run listok 0 scripts/gpu/nccl-versions.sh --list 2.18.3 2.30.7
run notignored 2 scripts/gpu/nccl-versions.sh -d tests/compat --slim tests/compat/run.sh 2.18.3
has "$T/notignored.out" 'not ignored by git'
run noslim 2 scripts/gpu/nccl-versions.sh -d "$T/x" --slim "$T/none.py" 2.18.3
run badv 2 scripts/gpu/nccl-versions.sh 2.18

echo "tests/compat: $n checks, $([ $rc -eq 0 ] && echo all passed || echo FAILURES)"
exit $rc
