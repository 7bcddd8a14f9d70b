#!/usr/bin/env bash
# tests/ops/slurm.sh BUILD: R2CC under Debian's real Slurm (slurm-wlm), with the SPANK
# plugin (ops/slurm, `srun --r2cc`) and without it (`srun --export`).
#
# It starts its own cluster on this machine and removes it at the end: slurmctld and
# two slurmd, each serving one node name (`slurmd -N r2cc-n0`, `-N r2cc-n1`) on a port
# of its own, a private slurm.conf and plugstack.conf, state and spool under a temporary
# directory, free loopback ports, AuthType=auth/none (no munge). Then:
#
#  1. `srun --r2cc=... -N 2 -n 2`: each task is a worker of the verbs drill on the
#     emulated server its Slurm node names (tests/ops/slurm_task.c), over the software
#     RDMA device; R2CC's own drill (R2CC_DRILL, from --r2cc) black-holes r2cc-n1's
#     mlx5_1 at each worker's first collective. Every message must arrive once and
#     intact, each worker's data path must be libr2cc.so's, and both R2CC reports must
#     show the step applied and the repair (migrated = queue pairs, none failed).
#  2. The same job without the plugin: `srun --export=ALL,LD_PRELOAD=...,R2CC_...`.
#  3. A step without --r2cc gets neither LD_PRELOAD nor R2CC_* (the plugin is loaded);
#     --r2cc keeps the job's own LD_PRELOAD after libr2cc.so; `sbatch --r2cc` leaves the
#     batch shell plain and gives R2CC to every srun step of the script.
#  4. Bad input: a bad setting in --r2cc, an unknown name, a bad R2CC_* in the
#     submitting environment, a bad plugstack.conf: one error line naming the variable,
#     srun fails at once, no job is allocated, a job running meanwhile finishes intact
#     and steps without --r2cc run. A library missing on the nodes: with `required`
#     the tasks fail, with `optional` they run without R2CC; one line says so.
#
# Everything it runs is printed ("$ command", then the output) for logs/ops/slurm.md.
# R2CC_SLURM_KEEP=1 keeps the temporary directory; R2CC_SLURM_EXTRA=,debug=INFO adds
# settings to run 1's --r2cc.
set -u
# slurmd starts each slurmstepd detached: make this shell their subreaper, so that
# they are reaped here (this machine's init may not) and none outlives the test.
if [ -z "${R2CC_SLURM_REAPER:-}" ]; then
	export R2CC_SLURM_REAPER=1
	exec python3 -c 'import ctypes, os, sys
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
os.execv("/bin/bash", ["bash"] + sys.argv[1:])' "$0" "$@"
fi
unset R2CC_SLURM_REAPER
BUILD=${1:-build}
KEEP=${R2CC_SLURM_KEEP:-0}
EXTRA=${R2CC_SLURM_EXTRA:-} # more --r2cc settings for run 1, e.g. ,debug=INFO
unset R2CC_SLURM_KEEP R2CC_SLURM_EXTRA
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
case "$BUILD" in /*) B=$BUILD ;; *) B=$ROOT/$BUILD ;; esac

fail() {
	echo "slurm test: FAIL: $*"
	exit 1
}

missing=()
for p in slurmctld slurmd srun scontrol sinfo python3; do
	command -v "$p" >/dev/null || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] || fail "not installed: ${missing[*]} (apt-get install slurm-wlm libslurm-dev)"
for f in lib/spank_r2cc.so lib/libr2cc.so tests/ops/slurm-task bin/r2cc-verbs-drill \
	tests/ncclstub/libnccl.so.2 softverbs/libibverbs.so.1 bin/softverbs-ctl; do
	[ -e "$B/$f" ] || fail "$B/$f is not built (make test-ops builds it; spank_r2cc.so needs libslurm-dev)"
done

T=$(mktemp -d /tmp/r2cc-slurm.XXXXXX)
FABRIC=r2cc-slurm-$$
pids=()
cleanup() {
	# The jobs first (their steps end and report while the daemons still listen),
	# then the daemons, then whatever slurmstepd is left (our children, see above).
	if [ ${#pids[@]} -gt 0 ]; then
		scancel --quiet --full --user="$(id -un)" 2>/dev/null
		for _ in $(seq 50); do
			[ -z "$(squeue -h 2>/dev/null)" ] && break
			sleep 0.1
		done
	fi
	for pid in "${pids[@]+"${pids[@]}"}"; do kill "$pid" 2>/dev/null; done
	for _ in $(seq 50); do
		alive=0
		for pid in "${pids[@]+"${pids[@]}"}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
		[ $alive -eq 0 ] && break
		sleep 0.1
	done
	for pid in "${pids[@]+"${pids[@]}"}" $(ps -o pid=,comm= --ppid $$ | awk '$2 == "slurmstepd" {print $1}'); do
		kill -9 "$pid" 2>/dev/null
	done
	wait 2>/dev/null
	"$B/bin/softverbs-ctl" --fabric "$FABRIC" reset >/dev/null 2>&1
	if [ "$KEEP" = 1 ]; then echo "kept: $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Three free loopback ports: slurmctld's and one per slurmd.
read -r P_CTL P_N0 P_N1 < <(python3 -c '
import socket
s = [socket.socket() for _ in range(3)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')
HOST=$(hostname -s)
USER_NAME=$(id -un)
mkdir -p "$T/state" "$T/spool/r2cc-n0" "$T/spool/r2cc-n1" "$T/log"
export SLURM_CONF=$T/slurm.conf
cat >"$SLURM_CONF" <<EOF
ClusterName=r2cc-test
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$P_CTL
SlurmdPort=$P_N0
SlurmUser=$USER_NAME
SlurmdUser=$USER_NAME
AuthType=auth/none
CredType=cred/none
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool/%n
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.%n.pid
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/linear
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
PlugStackConfig=$T/plugstack.conf
NodeName=r2cc-n0 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$P_N0 CPUs=1 State=UNKNOWN
NodeName=r2cc-n1 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$P_N1 CPUs=1 State=UNKNOWN
PartitionName=r2cc Nodes=r2cc-n[0-1] Default=YES MaxTime=10 State=UP
EOF
plugstack() { echo "$*" >"$T/plugstack.conf"; }
plugstack "optional $B/lib/spank_r2cc.so library=$B/lib/libr2cc.so"

echo "== Slurm: $(slurmctld -V) ($(dpkg-query -W -f '${Package} ${Version}' slurm-wlm 2>/dev/null)," \
	"$(dpkg-query -W -f '${Package} ${Version}' libslurm-dev 2>/dev/null))"
echo "== cluster: slurmctld on 127.0.0.1:$P_CTL; slurmd -N r2cc-n0 on :$P_N0, slurmd -N r2cc-n1 on :$P_N1 ($T)"
echo "== plugstack.conf: $(cat "$T/plugstack.conf")"
slurmctld -D -f "$SLURM_CONF" -L "$T/log/slurmctld.log" >"$T/log/slurmctld.out" 2>&1 &
pids+=($!)
for n in 0 1; do
	slurmd -D -N "r2cc-n$n" -f "$SLURM_CONF" -L "$T/log/slurmd.r2cc-n$n.log" \
		>"$T/log/slurmd.r2cc-n$n.out" 2>&1 &
	pids+=($!)
done
for _ in $(seq 300); do
	[ "$(sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle$')" = 2 ] && break
	sleep 0.1
done
sinfo -N -o '%N %P %t' | sed 's/^/   /'
[ "$(sinfo -h -N -o '%t' | grep -c '^idle$')" = 2 ] || {
	tail -n 20 "$T"/log/*
	fail "the two nodes did not come up idle within 30 s"
}

# Shown and run: "$ cmd", its output indented; the status in $rc.
show() {
	echo "\$ ${*@Q}" | sed "s/'\([^' ]*\)'/\1/g"
	"$@" >"$T/out" 2>&1
	rc=$?
	sed 's/^/    /' "$T/out"
	echo "    (exit $rc)"
}
next_job() { scontrol show config | awk '/^NEXT_JOB_ID/ {print $3}'; }

# The job's own environment, as a batch script exports NCCL_* before srun: the soft
# fabric (libibverbs from build/softverbs, one fabric for both Slurm nodes, transport
# timeouts x 0.01) and the control plane on loopback.
export LD_LIBRARY_PATH=$B/softverbs SOFTVERBS_FABRIC=$FABRIC SOFTVERBS_TIME_SCALE=0.01 \
	NCCL_SOCKET_IFNAME=lo
echo "== job environment: LD_LIBRARY_PATH=$LD_LIBRARY_PATH SOFTVERBS_FABRIC=$FABRIC" \
	"SOFTVERBS_TIME_SCALE=0.01 NCCL_SOCKET_IFNAME=lo"
MESSAGES=128
task_args() { echo "$B/tests/ops/slurm-task --dir $1 --drill $B/bin/r2cc-verbs-drill" \
	"--nccl-lib $B/tests/ncclstub/libnccl.so.2 --messages $MESSAGES --collective-at $((MESSAGES / 2))"; }
DRILL_PLAN='r2cc-n1/mlx5_1=blackhole@0'

# Each worker's messages and data path, then the two R2CC reports: the drill's step
# applied in both, and on r2cc-n1 the repair of mlx5_1 (every queue pair moved).
check_run() {
	local dir=$1 what=$2
	echo "\$ slurm-task --summary --dir $dir --procs 2 --messages $MESSAGES --expect r2cc"
	"$B/tests/ops/slurm-task" --summary --dir "$dir" --procs 2 --messages $MESSAGES \
		--expect r2cc | sed 's/^/    /'
	[ "${PIPESTATUS[0]}" = 0 ] || fail "$what: a task did not get all its messages intact"
	python3 - "$dir" "$what" <<'PY' || fail "$2: the R2CC reports do not show the repair"
import glob, json, sys
d, what = sys.argv[1], sys.argv[2]
reps = {}
for f in sorted(glob.glob(d + "/r2cc.*.json")):
    r = json.load(open(f))
    reps[r["node"]] = (f, r)
bad = []
if sorted(reps) != ["r2cc-n0", "r2cc-n1"]:
    bad.append("reports of nodes %s, not r2cc-n0 and r2cc-n1" % sorted(reps))
for node, (f, r) in sorted(reps.items()):
    dr = r.get("drill") or {}
    if r["mode"] != 2 or dr.get("applied") != 1 or dr["steps"][0]["state"] != "applied":
        bad.append("%s: mode %s, drill %s" % (node, r["mode"], dr))
    for i in r["incidents"]:
        if i["failed"] or i["migrated"] != i["qps"]:
            bad.append("%s: incident on %s moved %d of %d QPs" % (node, i["nic"], i["migrated"], i["qps"]))
    print("    %s (%s): %s; drill step %s at unix %.3f on %d QPs; incidents: %s" % (
        node, f.rsplit("/", 1)[-1],
        " ".join("%s=%s" % (n["name"], n["state"]) for n in r["nics"]),
        dr["steps"][0]["state"] if dr.get("steps") else "-",
        dr["steps"][0].get("applied_unix", 0) if dr.get("steps") else 0,
        dr["steps"][0].get("qps", 0) if dr.get("steps") else 0,
        "; ".join("%s%s %d/%d QPs moved in %.3f ms" % (i["nic"], " [drill]" if i["drill"] else "",
                   i["migrated"], i["qps"], i["migrate_ms"]) for i in r["incidents"]) or "none"))
n1 = reps.get("r2cc-n1", (None, {"nics": [], "incidents": []}))[1]
if not any(n["name"] == "mlx5_1" and n["state"] == "down" for n in n1["nics"]):
    bad.append("r2cc-n1's mlx5_1 is not down in its report")
if not any(i["nic"] == "mlx5_1" and i["drill"] and i["migrated"] > 0 for i in n1["incidents"]):
    bad.append("no repair of r2cc-n1's mlx5_1 marked [drill]")
for b in bad:
    print("    %s: %s" % (what, b))
sys.exit(1 if bad else 0)
PY
	echo "    r2cc-n1's report (text), its incident:"
	sed -n '/^incident/,/^stall scan/p' "$(grep -l 'node r2cc-n1 ' "$dir"/r2cc.*[0-9] | head -n1)" |
		sed 's/^/      /'
}

echo
echo "== 1. srun --r2cc: the SPANK plugin preloads libr2cc.so and sets R2CC's settings"
mkdir -p "$T/plugin"
# shellcheck disable=SC2046 # task_args is words
show timeout 120 srun -N 2 -n 2 -l -K1 --time=2 \
	"--r2cc=mode=2,drill=$DRILL_PLAN,report=$T/plugin/r2cc.%h.%p$EXTRA" $(task_args "$T/plugin")
[ $rc = 0 ] || fail "srun --r2cc: exit $rc"
grep -q 'R2CC WARN drill: step 1: r2cc-n1/mlx5_1=blackhole@0ms applied' "$T/out" ||
	fail "srun --r2cc: no task said the drill's step was applied"
check_run "$T/plugin" "srun --r2cc"

echo
echo "== 2. the same job without the plugin: srun --export"
mkdir -p "$T/export"
# shellcheck disable=SC2046
show timeout 120 srun -N 2 -n 2 -l -K1 --time=2 \
	"--export=ALL,LD_PRELOAD=$B/lib/libr2cc.so,R2CC_MODE=2,R2CC_DRILL=$DRILL_PLAN,R2CC_REPORT=$T/export/r2cc.%h.%p" \
	$(task_args "$T/export")
[ $rc = 0 ] || fail "srun --export: exit $rc"
check_run "$T/export" "srun --export"

echo
echo "== 3. a step without --r2cc: nothing of R2CC in its tasks' environment"
show timeout 60 srun -N 2 -n 2 -l --time=1 sh -c 'env | grep -E "^(LD_PRELOAD|R2CC_)" || echo "no LD_PRELOAD, no R2CC_*"'
if [ $rc != 0 ] || [ "$(grep -c 'no LD_PRELOAD, no R2CC_\*$' "$T/out")" != 2 ]; then
	fail "a step without --r2cc got R2CC's environment"
fi
echo "   and with --r2cc, LD_PRELOAD keeps what the job had, after libr2cc.so:"
# shellcheck disable=SC2016 # expanded by the task's shell
show timeout 60 srun -N 2 -n 2 -l --time=1 --export=ALL,LD_PRELOAD=libpthread.so.0 --r2cc=stats=0 \
	sh -c 'echo "LD_PRELOAD=$LD_PRELOAD R2CC_STATS=$R2CC_STATS"'
if [ $rc != 0 ] ||
	[ "$(grep -c "LD_PRELOAD=$B/lib/libr2cc.so:libpthread.so.0 R2CC_STATS=0$" "$T/out")" != 2 ]; then
	fail "--r2cc did not put libr2cc.so in front of the job's LD_PRELOAD"
fi

echo "   sbatch --r2cc: the batch shell runs plain, every srun step of the script under R2CC"
# shellcheck disable=SC2016 # expanded by the batch shell and the tasks
show timeout 60 sbatch --wait -N 2 -n 2 --time=1 --r2cc=mode=1 -o "$T/batch.out" \
	--wrap 'echo "batch shell: LD_PRELOAD=${LD_PRELOAD:-unset}"; srun -l sh -c "echo step: LD_PRELOAD=\$LD_PRELOAD R2CC_MODE=\$R2CC_MODE"'
sed 's/^/    batch.out: /' "$T/batch.out"
if [ $rc != 0 ] || ! grep -q '^batch shell: LD_PRELOAD=unset$' "$T/batch.out" ||
	[ "$(grep -c "step: LD_PRELOAD=$B/lib/libr2cc.so R2CC_MODE=1$" "$T/batch.out")" != 2 ]; then
	fail "sbatch --r2cc: not the batch shell plain and both tasks of its srun under R2CC"
fi

echo
echo "== 4. bad input: one error naming the variable, srun stops, no job is harmed"
# A job that holds both nodes meanwhile: it must finish intact. The bad sruns must not
# wait for its nodes (they never ask for an allocation).
srun -N 2 -n 2 -l --time=1 sh -c 'sleep 4; echo intact' >"$T/bystander.out" 2>&1 &
bystander=$!
for _ in $(seq 50); do
	[ "$(squeue -h -t R | wc -l)" = 1 ] && break
	sleep 0.1
done
echo "   a job holds both nodes meanwhile: $(squeue -h -t R -o '%i %j %T %N')"
bad_option() { # EXPECTED-TEXT srun-args...
	local want=$1 before after
	shift
	before=$(next_job)
	show timeout 20 srun -N 2 -n 2 --time=1 "$@" true
	after=$(next_job)
	[ $rc != 0 ] || fail "srun $*: exit 0"
	[ $rc != 124 ] || fail "srun $*: waited (for an allocation?)"
	[ "$(grep -c 'error: r2cc: ' "$T/out")" = 1 ] || fail "srun $*: not one r2cc error line"
	grep -q "error: r2cc: .*$want" "$T/out" || fail "srun $*: the error does not say '$want'"
	[ "$before" = "$after" ] || fail "srun $*: a job was allocated ($before -> $after)"
	echo "    (no job allocated: the next job id is still $after)"
}
bad_option "R2CC_MODE='7' is not valid.*(R2CC_MODE from --r2cc)" --r2cc=mode=7,report=/tmp/r
bad_option "'mdoe' is not an R2CC setting" --r2cc=mdoe=2
bad_option "R2CC_DRILL.*melt.*(R2CC_DRILL from --r2cc)" --r2cc=drill=r2cc-n1/mlx5_1=melt@0
export R2CC_FAILED_HCA=mlx5_1
echo "\$ export R2CC_FAILED_HCA=mlx5_1   # NICs without R2CC_FAILED_NODE"
bad_option "R2CC_FAILED_HCA from the job's environment" --r2cc
unset R2CC_FAILED_HCA
wait $bystander
by_rc=$?
sed 's/^/    bystander: /' "$T/bystander.out"
if [ $by_rc != 0 ] || [ "$(grep -c 'intact$' "$T/bystander.out")" != 2 ]; then
	fail "the job running meanwhile did not finish intact (exit $by_rc)"
fi

echo "   a bad plugstack.conf: --r2cc is refused with its line, other steps run"
plugstack "optional $B/lib/spank_r2cc.so library=$B/lib/libr2cc.so defaults=mode=9"
echo "   plugstack.conf: $(cat "$T/plugstack.conf")"
bad_option "plugstack.conf: defaults=: R2CC_MODE='9' is not valid" --r2cc
show timeout 60 srun -N 2 -n 2 -l --time=1 true
[ $rc = 0 ] || fail "a bad plugstack.conf line broke a step without --r2cc"

echo "   the library missing on the nodes (library=): required fails the tasks, optional runs them plain"
for kind in required optional; do
	plugstack "$kind $B/lib/spank_r2cc.so library=$T/nonexistent/libr2cc.so"
	echo "   plugstack.conf: $(cat "$T/plugstack.conf")"
	# shellcheck disable=SC2016 # expanded by the task's shell
	show timeout 60 srun -N 2 -n 2 -l --time=1 --r2cc \
		sh -c 'echo "running, LD_PRELOAD=${LD_PRELOAD:-unset}"'
	[ "$(grep -c "r2cc: $T/nonexistent/libr2cc.so: No such file or directory" "$T/out")" = 2 ] ||
		fail "$kind: no error line per node naming the missing library"
	if [ $kind = required ]; then
		if [ $rc = 0 ] || grep -q running "$T/out"; then fail "required: the tasks ran"; fi
	elif [ $rc != 0 ] || [ "$(grep -c 'running, LD_PRELOAD=unset$' "$T/out")" != 2 ]; then
		fail "optional: the tasks did not run without R2CC"
	fi
done
echo
echo "slurm test: PASS"
