#!/usr/bin/env bash
# `r2cc run` (tools/run.c): the exit status passes through (0, 3, a signal, a command
# that cannot run), LD_PRELOAD and the settings reach COMMAND and nothing else (the
# caller's other preloads kept), a bad setting is one error naming it and nothing runs,
# it works as the program of mpirun (the repository's test double,
# tests/compat/fake/mpirun, or the real one in TEST_MPIRUN: tests/ops/mpirun.sh), and --summary prints one line per process's exit report:
# from real processes over the software RDMA device, and from the reports of a drill
# whose fault R2CC_DRILL made and R2CC repaired.
#   tests/run/run.sh BUILD
set -u
B=$(cd "${1:-build}" && pwd)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LIB=$B/lib/libr2cc.so
read -r -a MPIRUN <<<"${TEST_MPIRUN:-$ROOT/tests/compat/fake/mpirun}"
T=$(mktemp -d)
export SOFTVERBS_FABRIC=r2cc-run-$$
trap '"$B"/bin/softverbs-ctl --fabric "$SOFTVERBS_FABRIC" reset >/dev/null 2>&1; rm -rf "$T"' EXIT
# The caller's own R2CC_* settings would be checked too: start from none. A sanitizer's
# runtime (R2CC_TEST_PRELOAD, README: Tests) stays first in LD_PRELOAD, as r2cc run keeps it.
for v in $(env | sed -n 's/^\(R2CC_[A-Z0-9_]*\)=.*/\1/p'); do
	[ "$v" = R2CC_TEST_PRELOAD ] || unset "$v"
done
PRE=${R2CC_TEST_PRELOAD:-}
unset LD_PRELOAD
R2CC=(env "LD_PRELOAD=$PRE" "$B/bin/r2cc")
nfail=0
fail() { echo "FAIL: $*"; nfail=$((nfail + 1)); }
ok() { echo "ok: $*"; }
# expect_rc WANT DESC COMMAND...: runs COMMAND, compares its exit status.
expect_rc() {
	local want=$1 desc=$2 rc
	shift 2
	("$@"; exit $?) >"$T/out" 2>"$T/err" # a subshell: its bash, not ours, says "Terminated"
	rc=$?
	if [ "$rc" = "$want" ]; then ok "$desc: exit $rc"; else
		fail "$desc: exit $rc, expected $want"; cat "$T/out" "$T/err"
	fi
}

# --- exit status -------------------------------------------------------------------
expect_rc 0 "true" "${R2CC[@]}" run -- true
expect_rc 3 "exit 3" "${R2CC[@]}" run -- sh -c 'exit 3'
expect_rc 3 "exit 3, --summary" "${R2CC[@]}" run --summary -- sh -c 'exit 3'
# Without --summary r2cc run becomes COMMAND: the caller sees the signal itself.
expect_rc 143 "SIGTERM (exec: the caller's shell says 128+15)" "${R2CC[@]}" run -- sh -c 'kill -TERM $$'
expect_rc 137 "SIGKILL, --summary (128+9)" "${R2CC[@]}" run --summary -- sh -c 'kill -KILL $$'
expect_rc 127 "command not found" "${R2CC[@]}" run -- "$T/no-such-program"
touch "$T/not-exec"
expect_rc 126 "not executable" "${R2CC[@]}" run -- "$T/not-exec"
expect_rc 125 "no command" "${R2CC[@]}" run --mode 2

# A launcher's SIGTERM reaches COMMAND through r2cc run --summary.
"${R2CC[@]}" run --summary -- sleep 30 >/dev/null 2>&1 &
pid=$!
for _ in $(seq 50); do pgrep -P $pid sleep >/dev/null && break; sleep 0.1; done
child=$(pgrep -P $pid sleep)
kill -TERM $pid
wait $pid
rc=$?
if [ $rc = 143 ] && ! kill -0 "${child:-999999}" 2>/dev/null; then
	ok "SIGTERM to r2cc run --summary: forwarded, exit 143"
else
	fail "SIGTERM to r2cc run --summary: exit $rc, child ${child:-none} $(kill -0 "${child:-999999}" 2>/dev/null && echo alive)"
fi

# --- LD_PRELOAD and settings: COMMAND's only ------------------------------------------
other=$(cc -print-file-name=libm.so.6)
[ -e "$other" ] || other=$(ldconfig -p | awk '/libm.so.6 /{print $NF; exit}')
env LD_PRELOAD="${PRE:+$PRE }/elsewhere/libr2cc.so $other" "$B/bin/r2cc" run --mode 3 --set R2CC_STALL_MS=50 -- \
	sh -c 'echo "$LD_PRELOAD"; echo "$R2CC_MODE $R2CC_STALL_MS"; grep -c libr2cc.so /proc/self/maps' >"$T/out" 2>/dev/null
if [ "$(sed -n 1p "$T/out")" = "${PRE:+$PRE:}$(realpath "$LIB"):$other" ] &&
	[ "$(sed -n 2p "$T/out")" = "3 50" ] && [ "$(sed -n 3p "$T/out")" -gt 0 ]; then
	ok "COMMAND gets libr2cc.so first, the caller's other preload after it (another libr2cc.so dropped) and the settings"
else
	fail "COMMAND's environment"; cat "$T/out"
fi
# With --summary r2cc run waits as COMMAND's parent, without the library in it.
"${R2CC[@]}" run --summary --report "$T/rep.%p" -- sh -c 'grep -c libr2cc.so /proc/$PPID/maps; grep -c libr2cc.so /proc/self/maps' >"$T/out" 2>/dev/null
if [ "$(sed -n 1p "$T/out")" = 0 ] && [ "$(sed -n 2p "$T/out")" -gt 0 ]; then
	ok "r2cc run --summary itself does not load libr2cc.so; its COMMAND does"
else
	fail "preload of the waiting parent"; cat "$T/out"
fi
[ -z "${LD_PRELOAD:-}" ] && [ -z "${R2CC_MODE:-}" ] || fail "the caller's environment changed"

# --- bad settings: one error naming the variable, nothing runs -------------------------
bad() { # DESC WORD COMMAND...: exit 125, an error line with WORD, the marker not made
	local desc=$1 word=$2
	shift 2
	rm -f "$T/ran"
	"$@" -- touch "$T/ran" >"$T/out" 2>"$T/err"
	local rc=$?
	if [ $rc = 125 ] && [ ! -e "$T/ran" ] && grep -q -- "$word" "$T/err" &&
		[ "$(grep -vc 'nothing was run' "$T/err")" = 1 ]; then
		ok "$desc refused: $(head -1 "$T/err")"
	else
		fail "$desc: exit $rc, ran: $([ -e "$T/ran" ] && echo yes || echo no)"; cat "$T/err"
	fi
}
bad "--mode 7" "R2CC_MODE='7' is not valid" "${R2CC[@]}" run --mode 7
bad "--set R2CC_STALL_MS=0" "R2CC_STALL_MS='0' is not valid" "${R2CC[@]}" run --set R2CC_STALL_MS=0
bad "an unknown name" "R2CC_MODEE is not an R2CC setting" "${R2CC[@]}" run --set R2CC_MODEE=2
bad "a bad drill plan" "R2CC_DRILL" "${R2CC[@]}" run --drill "node0/mlx5_0=melt@1s"
bad "a bad declared failure" "R2CC_FAILED" "${R2CC[@]}" run --set R2CC_FAILED_HCA=mlx5_2
bad "an inherited bad value" "from the environment" env R2CC_DEBUG=LOUD "${R2CC[@]}" run
bad "--set without =" "NAME=VALUE" "${R2CC[@]}" run --set R2CC_MODE

# --- under mpirun: exit status and one summary per rank over the soft device -------------
echo "mpirun: ${MPIRUN[*]}"
expect_rc 3 "mpirun -np 2 r2cc run (both ranks exit 3)" "${MPIRUN[@]}" -np 2 "${R2CC[@]}" run -- sh -c 'exit 3'
# r2cc run becomes the rank: the rank's parent is the launcher, without the library.
"${MPIRUN[@]}" -np 2 "${R2CC[@]}" run -- sh -c \
	'echo "$(grep -c libr2cc.so /proc/$PPID/maps) $(grep -c libr2cc.so /proc/self/maps)"' >"$T/out" 2>"$T/err"
if [ "$(awk '$1 == 0 && $2 > 0' "$T/out" | wc -l)" = 2 ]; then
	ok "under mpirun each rank preloads libr2cc.so, the launcher does not"
else
	fail "preload under mpirun"; cat "$T/out" "$T/err"
fi
export LD_LIBRARY_PATH=$B/softverbs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export SOFTVERBS_NODE=node0 SOFTVERBS_NICS=mlx5_0:100
# The drill plan's step waits for a collective that this verbs program never makes:
# each report must say 0 of its 1 step applied.
mkdir "$T/tmp"
TMPDIR=$T/tmp "${MPIRUN[@]}" -np 2 "${R2CC[@]}" run --summary --drill "node0/mlx5_0=down@1s" -- \
	"$B"/tests/preload/verbs_preload --expect-wrapped >"$T/out" 2>"$T/err"
rc=$?
lines=$(grep -cE '^r2cc run: host=[^ ]+ node=[^ ]+ pid=[0-9]+ nics=1 down=0 incidents=0 drill_incidents=0 repaired=0 failed=0 failbacks=0 drill_steps=0/1 protected=yes$' "$T/err")
pids=$(sed -n 's/^r2cc run: .* pid=\([0-9]*\) .*/\1/p' "$T/err" | sort -u | wc -l)
if [ $rc = 0 ] && [ "$lines" = 2 ] && [ "$pids" = 2 ] && ! grep -q "more process" "$T/err"; then
	ok "mpirun -np 2 r2cc run --summary: one line per rank"
	grep '^r2cc run:' "$T/err" | sed 's/^/    /'
else
	fail "mpirun -np 2 r2cc run --summary: exit $rc, $lines summary lines, $pids pids"; cat "$T/err"
fi
[ -z "$(ls -A "$T/tmp")" ] && ok "the temporary report directories are gone" ||
	fail "temporary report directories left: $(ls "$T/tmp")"
# A process R2CC cannot protect (verbs by symbol, not NCCL's transport) says so.
"${R2CC[@]}" run --summary -- "$B"/tests/preload/verbs_preload_direct --expect-wrapped >/dev/null 2>"$T/err"
grep -qE '^r2cc run: host=.* protected=no \(queue pairs of verbs_preload_direct' "$T/err" &&
	ok "an unprotected process: protected=no with the reason" ||
	{ fail "unprotected process not reported"; cat "$T/err"; }

# --- --summary of the reports of a repaired drill fault --------------------------------
# The drill writes its workers' reports itself (its own R2CC_REPORT); the command here
# copies them where r2cc run reads, as the job's processes would write them.
"$B"/bin/r2cc-verbs-drill --fault down --inject --seeds 1 --nccl-stub --keep >"$T/drill" 2>&1
kept=$(sed -n 's/^kept: //p' "$T/drill")
if [ -z "$kept" ] || ! grep -q "^PASS" "$T/drill"; then
	# Under a sanitizer's slowdown the drill's repair timing may fail (tests/sanitize):
	# that is the drill's test to make, not this one's.
	if [ -n "$PRE" ]; then
		echo "note: the drill did not pass under this sanitizer build; its summary not checked"
	else
		fail "the drill with an injected fault did not pass"; cat "$T/drill"
	fi
	[ -n "$kept" ] && rm -rf "$kept"
else
	mkdir "$T/reports"
	"${R2CC[@]}" run --summary --report "$T/reports/r2cc-report.%h.%p" -- sh -c \
		'i=0; for f in "$1"/*/r2cc-report.*.json; do i=$((i + 1)); cp "$f" "$2/r2cc-report.drill.$i.json"; done' \
		sh "$kept" "$T/reports" >"$T/out" 2>"$T/err"
	rc=$?
	rm -rf "$kept"
	n=$(grep -cE '^r2cc run: host=[^ ]+ node=node[01] pid=[0-9]+ nics=3 down=[01] incidents=[1-9][0-9]* drill_incidents=[0-9]+ repaired=[1-9][0-9]* failed=0 failbacks=0 drill_steps=1/1 protected=yes$' "$T/err")
	if [ $rc = 0 ] && [ "$n" = 2 ] && grep -qE "^r2cc run: [0-9]+ more process\(es\) under the preload used no RDMA NIC" "$T/err"; then
		ok "--summary of a repaired drill: both workers' incidents, repairs and drill steps, the shell apart"
		sed 's/^/    /' "$T/err"
	else
		fail "--summary of the drill's reports: exit $rc, $n matching lines"; cat "$T/err"
	fi
fi

[ $nfail = 0 ] && echo "PASS: r2cc run" || echo "FAIL: r2cc run, $nfail check(s)"
[ $nfail = 0 ]
