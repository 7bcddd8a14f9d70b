#!/usr/bin/env bash
# CPU test of the scenario scripts (scripts/scenarios/01-06), their common.sh and
# scripts/drill, without a GPU: syntax; --help; the exact commands of dry runs on the soft
# target and on the cluster target with every fault method, inject (R2CC_DRILL) included,
# and the refusals of methods that cannot do a fault (nft on a hardware RoCE NIC, against
# fake sysfs trees); which method the cluster takes by default; check_idle refusing under
# a held lock and with a benchmark process running; SAVE_LOG writing to LOG_DIR and
# refusing logs/; the drill's fault-plan parser (good and bad plans); and real runs of the
# drill and of 01/02/03/04/05 against the test doubles in tests/scenarios/fake (an
# r2cc-perf that dies like plain NCCL when a NIC is cut, or survives and writes R2CC
# reports, carries R2CC_DRILL out as the library would, or keeps moving bytes on a NIC a
# method did not really cut; a softverbs-ctl that records faults; an r2cc whose 'top
# --prometheus' shows the fake's counters; an ssh that runs here), asserting on the
# verdicts, the report (each step's cut checked from the NIC table or the sampled
# counters, or "not checked") and the exit statuses.
#   tests/scenarios/run.sh        (KEEP=1 keeps the temporary directory)
set -u
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
S=scripts/scenarios
T=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] && echo "kept $T" || rm -rf "$T"' EXIT
. tests/lib.sh

# A clean environment: the expected command lines list the NCCL_* variables a run passes on.
for v in $(compgen -e | grep -E '^(NCCL_|SOFTVERBS_|R2CC_|OVS_|IBPORTSTATE_|FAULT_|MPI)'); do unset "$v"; done
# Everything runs against the test doubles, with a lock file of its own, and never
# looks for benchmark processes of the real names (another test may run them).
export R2CC_SCENARIO_LOCK=$T/lock IDLE_PROCS=scn-test-none TMPDIR=$T
export R2CC_BIN_DIR=$ROOT/tests/scenarios/fake SOFTVERBS_CTL=$ROOT/tests/scenarios/fake/softverbs-ctl
export FAKE_STATE=$T/state FAKE_ITER_S=0.1 SCN_FABRIC_PREFIX=r2cc-scntest-$$
mkdir -p "$FAKE_STATE"
unset R2CC_TARGET R2CC_FAULT_METHOD NCCL_TESTS_DIR HOSTFILE SAVE_LOG LOG_DIR DRY_RUN FAULT NCCL_DEBUG
unset R2CC_DEBUG R2CC_MODE MAX_BYTES MIN_BYTES NODES GPUS_PER_NODE NP NCCL_TEST_BIN SIZE ITERS FAULT_AT

# has NAME REGEX...: every extended regex matches a line of NAME's output
has() {
	local name=$1 re
	shift
	for re in "$@"; do
		grep -qE -- "$re" "$T/$name.out" && ok || fail "$name: no line matches: $re"
	done
}
# lacks NAME REGEX...: no line matches
lacks() {
	local name=$1 re
	shift
	for re in "$@"; do
		grep -qE -- "$re" "$T/$name.out" && fail "$name: unexpected line: $(grep -m1 -E -- "$re" "$T/$name.out")" || ok
	done
}
count() { # NAME REGEX N: exactly N lines match
	local c
	c=$(grep -cE -- "$2" "$T/$1.out")
	[ "$c" = "$3" ] && ok || fail "$1: $c lines match '$2', expected $3"
}

scripts=("$S"/0[1-6].*.sh)
[ ${#scripts[@]} = 6 ] || fail "expected the six scenario scripts, found ${#scripts[@]}"

# --- syntax, help ---------------------------------------------------------------------
for f in "${scripts[@]}" "$S/common.sh" scripts/drill tests/scenarios/fake/*; do
	bash -n "$f" && ok || fail "bash -n $f"
done
python3 -c "import ast, sys; ast.parse(open(sys.argv[1]).read())" "$S/results.py" && ok || fail "results.py does not compile"

# --- result rows cut by another rank's log lines (the ranks share the terminal) ---------
cat >"$T/cut.log" <<'EOF'
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
        1024           256     float     sum      -1    129.9    0.01    0.01      0    128.3    0.01    0.01      0
       32768          8192     float     sum      -1vm:2701:2772 R2CC INFO repair: qp 0x39005 migrated to mlx5_0 in 0.6 ms (declared failed)
vm:2704:2775 R2CC INFO repair: qp 0x34004 migrated to mlx5_2 in 0.4 ms (peer notice from rank 0)
[2026-11-29 23:53:33] vm:2701:2701 [0] transport/net_ib.cc:485 NCCL WARN something
    85.25    0.38    0.58      1    76.76    0.43    0.64      0
       65536         16384     float     sum      -1    145.8    0.45    0.67      0    138.9    0.47    0.71      0
EOF
python3 "$S/results.py" check --label cut --status 0 "$T/cut.log" >"$T/cut.out" 2>&1
has cut "^cut: exit status 0, 3 result rows 1 KiB \.\. 64 KiB \(float sum\)$" \
	"^cut: WRONG results at 32768 B float sum: #wrong 1 / 0 \(line 3\)$"
if command -v shellcheck >/dev/null; then
	shellcheck -x -S error "${scripts[@]}" "$S/common.sh" scripts/drill >"$T/shellcheck.out" 2>&1 && ok ||
		{ fail "shellcheck -S error"; head -20 "$T/shellcheck.out"; }
fi
for f in "${scripts[@]}"; do
	b=$(basename "$f")
	run "help-$b" 0 "$f" --help && has "help-$b" "^${b//./\\.} - " "DRY_RUN=1"
done
run help-drill 0 scripts/drill --help && has help-drill "^usage: scripts/drill" "--fault NODE/NIC=KIND@TIME"
[ -e "$T/lock" ] && [ -s "$T/lock" ] && fail "--help took the lock" || ok

# --- dry runs, soft target --------------------------------------------------------------
export DRY_RUN=1
SWEEP='-b 8 -e 4G -f 2 -g 1 -c 1 -n 5 -w 2 -d float -o sum'
SOFTENV=("export SOFTVERBS_NICS=mlx5_0:25,mlx5_2:25,mlx5_3:25$" "export SOFTVERBS_SHAPING=1$"
	"export NCCL_IB_HCA==mlx5_0,mlx5_2,mlx5_3$" "export NCCL_NET=IB$" "export NCCL_TOPO_FILE=")
P="env LD_PRELOAD=$ROOT/${BUILD:-build}/lib/libr2cc.so"
F=$ROOT/tests/scenarios/fake

run dry-04 0 "$S/04.nccl_tests_baseline_healthy.sh" -d half && {
	has dry-04 "${SOFTENV[@]}" "^  $P R2CC_MODE=0 $F/all_reduce_perf --nodes 2 --gpus-per-node 2 $SWEEP -d half --nic-table=0$" \
		"DRY RUN \(nothing ran\)" "^ target: soft"
	lacks dry-04 "R2CC_FAILED" "^ PASS" "^ FAIL"
}
run dry-04x 0 env NCCL_TEST_BIN=all_gather_perf MAX_BYTES=1G NODES=3 GPUS_PER_NODE=1 "$S/04.nccl_tests_baseline_healthy.sh" -b 64M
has dry-04x "R2CC_MODE=0 $F/all_gather_perf --nodes 3 --gpus-per-node 1 -b 8 -e 1G -f 2 .* -o sum -b 64M --nic-table=0$"
run dry-05 0 "$S/05.nccl_tests_balance_unhealthy.sh" && has dry-05 "${SOFTENV[@]}" \
	"^  $P R2CC_MODE=2 R2CC_FAILED_NODE=0 R2CC_FAILED_HCA=mlx5_2 $F/all_reduce_perf --nodes 2 --gpus-per-node 2 $SWEEP --nic-table=0$"
run dry-06 0 "$S/06.nccl_tests_r2cc_allreduce_unhealthy.sh" -b 1G -e 4G -f 4 -d half -o prod && has dry-06 \
	"^  $P R2CC_MODE=3 R2CC_FAILED_NODE=0 R2CC_FAILED_HCA=mlx5_2 R2CC_DEBUG=INFO $F/all_reduce_perf --nodes 2 --gpus-per-node 2 $SWEEP -b 1G -e 4G -f 4 -d half -o prod --nic-table=0$"
C3='-b 256M -e 4G -f 4 -g 1 -c 1 -n 5 -w 2 -d float -o sum'
run dry-03 0 "$S/03.nccl_tests_compare_all.sh" && {
	has dry-03 "^  $P R2CC_MODE=0 $F/all_reduce_perf --nodes 2 --gpus-per-node 2 $C3 --nic-table=0$" \
		"^  $P R2CC_MODE=2 R2CC_FAILED_NODE=0 R2CC_FAILED_HCA=mlx5_2 $F/all_reduce_perf --nodes 2 --gpus-per-node 2 $C3 --nic-table=0$" \
		"^  $P R2CC_MODE=3 R2CC_FAILED_NODE=0 R2CC_FAILED_HCA=mlx5_2 R2CC_DEBUG=INFO $F/all_reduce_perf --nodes 2 --gpus-per-node 2 $C3 --nic-table=0$"
	count dry-03 "^command:" 3
}
HR="-b 4G -e 4G -n 10 -w 0 -c 1 -d float -o sum --iters-table --nic-table=0 -T 120"
run dry-01 0 "$S/01.hot_repair_to_balance.sh" && has dry-01 \
	"^   step 1 at  4\.000 s: $SOFTVERBS_CTL --fabric r2cc-scntest-$$-drill fault node0 mlx5_2 blackhole$" \
	"^  env LD_PRELOAD=\S+ R2CC_MODE=2 R2CC_REPORT=\S+/r2cc-report\.%h\.%p R2CC_AR_AFTER_REPAIR=2 $F/all_reduce_perf --nodes 2 --gpus-per-node 2 $HR$" \
	"^restore: $SOFTVERBS_CTL --fabric r2cc-scntest-$$-drill fault node0 mlx5_2 up$" \
	"export SOFTVERBS_TIME_SCALE=0\.05$" "without hot repair .* the job" "DRY RUN"
run dry-02 0 env FAULT=down FAULT_AT=2500ms SIZE=1G ITERS=6 "$S/02.hot_repair_to_r2cc_allreduce.sh" && has dry-02 \
	"^   step 1 at  2\.500 s: $SOFTVERBS_CTL --fabric \S+ fault node0 mlx5_2 down$" \
	"R2CC_AR_AFTER_REPAIR=3 $F/all_reduce_perf --nodes 2 --gpus-per-node 2 -b 1G -e 1G -n 6 -w 0 "
run dry-drill 0 scripts/drill --fault node0/mlx5_2=blackhole@4s --fault node0/mlx5_3=down@8s \
	--fault node0/mlx5_2=up@12s --fault node1/mlx5_0=flap:200@5s --fault node1/mlx5_3=slow:10@6s && has dry-drill \
	"^   step 1 at  4\.000 s: $SOFTVERBS_CTL --fabric \S+ fault node0 mlx5_2 blackhole$" \
	"^   step 2 at  5\.000 s: $SOFTVERBS_CTL --fabric \S+ fault node1 mlx5_0 flap 200$" \
	"^   step 3 at  6\.000 s: $SOFTVERBS_CTL --fabric \S+ fault node1 mlx5_3 slow 10$" \
	"^   step 4 at  8\.000 s: $SOFTVERBS_CTL --fabric \S+ fault node0 mlx5_3 down$" \
	"^   step 5 at 12\.000 s: $SOFTVERBS_CTL --fabric \S+ fault node0 mlx5_2 up$" "^DRY_RUN=1: nothing ran$"
run dry-drill-cmd 0 scripts/drill --no-preload --fault 1/mlx5_3=down@500 -- all_gather_perf -b 1G -e 1G -n 40 -c 1
has dry-drill-cmd "^  env $F/all_gather_perf --nodes 2 --gpus-per-node 2 -b 1G -e 1G -n 40 -c 1$" "plain NCCL \(no preload\)"
lacks dry-drill-cmd "LD_PRELOAD"
# NVIDIA's nccl-tests on the soft target: mpirun on this host, one NCCL_HOSTID per node
mkdir -p "$T/nccl-tests"
run dry-nv 0 env NCCL_TESTS_DIR="$T/nccl-tests" MPIRUN=mpirun NODES=2 GPUS_PER_NODE=1 "$S/04.nccl_tests_baseline_healthy.sh"
has dry-nv "^  mpirun (--allow-run-as-root )?-np 2 --oversubscribe --bind-to none -x LD_PRELOAD=\S+ -x R2CC_MODE=0 -x PATH -x LD_LIBRARY_PATH .*-x SOFTVERBS_NICS .*NCCL_HOSTID=node.*OMPI_COMM_WORLD_RANK\\\\ /\\\\ 1.* $T/nccl-tests/all_reduce_perf $SWEEP$" \
	"bins:   NVIDIA nccl-tests in $T/nccl-tests$"
lacks dry-nv "--nic-table"

# --- dry runs, cluster target, every fault method ------------------------------------------
printf '# two servers\nnode-1 slots=2\nnode-2:2\n' >"$T/hostfile"
CL=(env R2CC_TARGET=cluster HOSTFILE="$T/hostfile" MPIRUN=mpirun SSH=ssh)
MPI="^  mpirun (--allow-run-as-root )?-np 4 --hostfile $T/hostfile --bind-to none"
run cl-05 0 "${CL[@]}" R2CC_NICS=mlx5_0,mlx5_2 NCCL_TESTS_DIR="$T/nccl-tests" "$S/05.nccl_tests_balance_unhealthy.sh" && has cl-05 \
	"$MPI -x LD_PRELOAD=\S+ -x R2CC_MODE=2 -x R2CC_FAILED_NODE=0 -x R2CC_FAILED_HCA=mlx5_2 -x NCCL_IB_HCA==mlx5_0,mlx5_2 -x NCCL_DEBUG -x PATH -x LD_LIBRARY_PATH $T/nccl-tests/all_reduce_perf $SWEEP$" \
	"^check_idle: ssh node-1 ps -eo pid=,comm=" "^check_idle: ssh node-2 ps -eo pid=,comm=" \
	"^restore: nothing to restore: with R2CC_FAULT_METHOD=inject" \
	"R2CC_FAULT_METHOD=inject \(default on the cluster: no switch or host method is configured\)"
run cl-04-perf 0 "${CL[@]}" R2CC_PERF_ROOT=10.0.0.1:29600 "$S/04.nccl_tests_baseline_healthy.sh"
has cl-04-perf "-x R2CC_PERF_ROOT=10\.0\.0\.1:29600 -x PATH -x LD_LIBRARY_PATH $F/all_reduce_perf $SWEEP --nic-table=0$"
OVS=(OVS_BRIDGE=br-p0 OVS_PORT=p0 OVS_HOST=bf-1)
run cl-01-ovs 0 "${CL[@]}" R2CC_FAULT_METHOD=ovs "${OVS[@]}" "$S/01.hot_repair_to_balance.sh" && has cl-01-ovs \
	"^   step 1 at  4\.000 s: ssh bf-1 ovs-ofctl add-flow br-p0 'priority=65000,in_port=p0,actions=drop'$" \
	"^restore: ssh bf-1 \"ovs-ofctl --strict del-flows br-p0 'priority=65000,in_port=p0'; ovs-ofctl mod-port br-p0 p0 up\"$" \
	"$MPI -x LD_PRELOAD=\S+ -x R2CC_MODE=2 -x R2CC_REPORT=\S+ -x R2CC_AR_AFTER_REPAIR=2 -x NCCL_IB_HCA==mlx5_0,mlx5_2,mlx5_3 -x NCCL_DEBUG -x R2CC_PERF_ROOT=node-1:29517 -x PATH -x LD_LIBRARY_PATH $F/all_reduce_perf $HR$"
run cl-01-ovs-down 0 "${CL[@]}" R2CC_FAULT_METHOD=ovs "${OVS[@]}" FAULT=down "$S/01.hot_repair_to_balance.sh"
has cl-01-ovs-down "^   step 1 at  4\.000 s: ssh bf-1 ovs-ofctl mod-port br-p0 p0 down$"
run cl-01-iplink 0 "${CL[@]}" R2CC_FAULT_METHOD=iplink FAULT=down "$S/01.hot_repair_to_balance.sh" && has cl-01-iplink \
	"^   step 1 at  4\.000 s: ssh node-1 \"ip link set dev \\\$\(ls /sys/class/infiniband/mlx5_2/device/net \| head -n1\) down\"$" \
	"^restore: ssh node-1 \"ip link set dev .* up\"$"
run cl-02-iplink-dev 0 "${CL[@]}" R2CC_FAULT_METHOD=iplink FAULT=down FAULT_DEV=ens1f1 FAILED_NODE=1 "$S/02.hot_repair_to_r2cc_allreduce.sh"
has cl-02-iplink-dev "^   step 1 at  4\.000 s: ssh node-2 \"ip link set dev ens1f1 down\"$"
# nft: only on soft RoCE. Two fake sysfs trees, as the nodes would show them: a ConnectX
# (mlx5_core, the ib device under its PCI function) and an rdma_rxe device (virtual, with
# rxe's 'parent' attribute naming its netdev); the checks run there through a fake ssh.
H=$T/sys-mlx5
D=$H/devices/pci0000:00/0000:3b:00.0
mkdir -p "$H/bus/pci/drivers/mlx5_core" "$D/infiniband/mlx5_2/ports/1" "$H/class/infiniband"
ln -s ../../../bus/pci/drivers/mlx5_core "$D/driver"
ln -s ../../../0000:3b:00.0 "$D/infiniband/mlx5_2/device"
echo "1: CA" >"$D/infiniband/mlx5_2/node_type"
echo Ethernet >"$D/infiniband/mlx5_2/ports/1/link_layer"
ln -s ../../devices/pci0000:00/0000:3b:00.0/infiniband/mlx5_2 "$H/class/infiniband/mlx5_2"
X=$T/sys-rxe/devices/virtual/infiniband/mlx5_2
mkdir -p "$X/ports/1" "$T/sys-rxe/class/infiniband"
echo "1: CA" >"$X/node_type"
echo Ethernet >"$X/ports/1/link_layer"
echo ens1f1 >"$X/parent"
ln -s ../../devices/virtual/infiniband/mlx5_2 "$T/sys-rxe/class/infiniband/mlx5_2"
NFT=("${CL[@]}" SSH="$F/ssh" R2CC_FAULT_METHOD=nft)
run cl-01-nft 0 "${NFT[@]}" FAULT_SYSFS="$T/sys-rxe" FAULT_DEV=ens1f1 "$S/01.hot_repair_to_balance.sh" && has cl-01-nft \
	"^   step 1 at  4\.000 s: $F/ssh node-1 \"nft add table netdev r2cc_drill && nft add chain netdev r2cc_drill in '\{ type filter hook ingress device ens1f1 priority 0; \}' && nft add rule netdev r2cc_drill in udp dport 4791 drop\"$" \
	"^restore: $F/ssh node-1 \"nft delete table netdev r2cc_drill 2>/dev/null \|\| true\"$"
run cl-nft-rxe 0 "${NFT[@]}" FAULT_SYSFS="$T/sys-rxe" scripts/drill --fault node0/mlx5_2=blackhole@1s --fault node0/mlx5_2=up@2s
has cl-nft-rxe "device \\\$\(cat $T/sys-rxe/class/infiniband/mlx5_2/parent\) priority 0" "^DRY_RUN=1: nothing ran$"
lacks cl-nft-rxe "cannot cut"
grep -q "^node-1 .*sys-rxe/class/infiniband/mlx5_2" "$FAKE_STATE/ssh.log" && ok || fail "cl-nft-rxe: the NIC was not checked on node-1"
NFT_HW="R2CC_FAULT_METHOD=nft cannot cut node0/mlx5_2: it is not a soft RoCE \(rdma_rxe\) device on node-1 \(driver mlx5_core\), and hardware RoCE bypasses netfilter: a ConnectX NIC steers RoCE v2 packets to its RDMA engine, they never reach the host's nft rules, and the rule would cut nothing\. Use R2CC_FAULT_METHOD=inject"
run cl-nft-mlx5 2 "${NFT[@]}" FAULT_SYSFS="$H" scripts/drill --fault node0/mlx5_2=blackhole@1s
has cl-nft-mlx5 "^drill: $NFT_HW"
lacks cl-nft-mlx5 "^command:" "nft add"
count cl-nft-mlx5 "cannot cut" 1
run cl-nft-none 2 "${NFT[@]}" FAULT_SYSFS="$T/sys-none" scripts/drill --fault node0/mlx5_2=blackhole@1s
has cl-nft-none "node-1 has no RDMA device mlx5_2 under $T/sys-none/class/infiniband\. Use R2CC_FAULT_METHOD=inject"
# a scenario: the restore is skipped (nothing runs) and the drill refuses
run cl-01-nft-mlx5 1 "${NFT[@]}" FAULT_SYSFS="$H" "$S/01.hot_repair_to_balance.sh"
has cl-01-nft-mlx5 "^restore: skipped: $NFT_HW" "^drill: $NFT_HW" "the drill could not run" "^ FAIL$"
lacks cl-01-nft-mlx5 "^restore: .*nft delete"
# without the check's answer a real run refuses; a dry run says so and goes on
run cl-nft-nossh 2 env DRY_RUN=0 "${NFT[@]}" SSH=false FAULT_SYSFS="$T/sys-rxe" scripts/drill --fault node0/mlx5_2=blackhole@1s
has cl-nft-nossh "cannot check that mlx5_2 of node-1 is a soft RoCE \(rdma_rxe\) device \('false' status 1\)"
run cl-nft-nossh-dry 0 "${NFT[@]}" SSH=false scripts/drill --fault node0/mlx5_2=blackhole@1s
has cl-nft-nossh-dry "^# note \(dry run\): could not check that mlx5_2 of node-1 is a soft RoCE device"
IBP=(R2CC_FAULT_METHOD=ibportstate IBPORTSTATE_LID=12 IBPORTSTATE_PORT=7 IBPORTSTATE_CA=mlx5_0)
run cl-01-ibp 0 "${CL[@]}" "${IBP[@]}" FAULT=down "$S/01.hot_repair_to_balance.sh" && has cl-01-ibp \
	"^   step 1 at  4\.000 s: ssh node-1 ibportstate -C mlx5_0 12 7 disable$" "^restore: ssh node-1 ibportstate -C mlx5_0 12 7 enable$"
run cl-drill-plan 0 "${CL[@]}" "${IBP[@]}" scripts/drill --fault node0/mlx5_2=down@4s --fault node0/mlx5_2=up@8s
has cl-drill-plan "^   step 1 at  4\.000 s: ssh node-1 ibportstate -C mlx5_0 12 7 disable$" \
	"^   step 2 at  8\.000 s: ssh node-1 ibportstate -C mlx5_0 12 7 enable$" "REPORT_DIR"
# what a method cannot do is refused before anything runs, with the reason
run cl-iplink-bh 1 "${CL[@]}" R2CC_FAULT_METHOD=iplink "$S/01.hot_repair_to_balance.sh"
has cl-iplink-bh "iplink can only take the link down: use FAULT=down" "^ FAIL$"
run cl-nft-down 2 "${CL[@]}" R2CC_FAULT_METHOD=nft scripts/drill --fault node0/mlx5_2=down@1s
has cl-nft-down "nft can only drop packets"
run cl-ibp-bh 2 "${CL[@]}" "${IBP[@]}" scripts/drill --fault node0/mlx5_2=blackhole@1s
has cl-ibp-bh "ibportstate can only disable a port"
run cl-ovs-noparam 2 "${CL[@]}" R2CC_FAULT_METHOD=ovs scripts/drill --fault node0/mlx5_2=blackhole@1s
has cl-ovs-noparam "needs OVS_BRIDGE and OVS_PORT"
run cl-flap 2 "${CL[@]}" R2CC_FAULT_METHOD=iplink scripts/drill --fault node0/mlx5_2=flap:100@1s
has cl-flap "'flap' exists with the soft and inject methods only .*or write the flap as down/up steps"
for k in blackhole-tx blackhole-rx ackloss; do
	run "cl-$k" 2 "${CL[@]}" "${OVS[@]}" scripts/drill --fault "node0/mlx5_2=$k@1s"
	has "cl-$k" "R2CC_FAULT_METHOD=ovs: '$k' exists with the soft and inject methods only"
done
run cl-slow-inject 2 "${CL[@]}" scripts/drill --fault node0/mlx5_2=slow:10@1s
has cl-slow-inject "'slow' is not a kind of R2CC_DRILL"

# --- inject: the plan goes to every rank as R2CC_DRILL; nothing runs at step time --------
run dry-inject 0 env R2CC_FAULT_METHOD=inject scripts/drill --fault node0/mlx5_2=blackhole@4s --fault node1/mlx5_0=flap:200@5s \
	--fault node0/mlx5_3=blackhole-tx@5500ms --fault node1/mlx5_3=blackhole-rx@6s --fault node1/mlx5_2=ackloss@7s \
	--fault node0/mlx5_3=down@8s --fault node0/mlx5_2=up@12s && has dry-inject \
	"^  env LD_PRELOAD=\S+ R2CC_MODE=2 R2CC_REPORT=\S+ R2CC_DRILL=node0/mlx5_2=blackhole@4000ms\\\\;node1/mlx5_0=flap:200@5000ms\\\\;node0/mlx5_3=blackhole-tx@5500ms\\\\;node1/mlx5_3=blackhole-rx@6000ms\\\\;node1/mlx5_2=ackloss@7000ms\\\\;node0/mlx5_3=down@8000ms\\\\;node0/mlx5_2=up@12000ms $F/all_reduce_perf --nodes 2 " \
	"^   step 2 at  5\.000 s: R2CC_DRILL step node1/mlx5_0=flap:200: applied by libr2cc.so in every rank, no command$" \
	"times from each process's first NCCL collective" "^ bytes per NIC: $F/r2cc top --prometheus every 0\.25 s on node 0,1$"
lacks dry-inject "softverbs-ctl .* fault " "^restore:"
run dry-inject-launch 0 env R2CC_FAULT_METHOD=inject scripts/drill --from launch --fault 1/mlx5_2=down@1.5s
has dry-inject-launch "R2CC_DRILL=node1/mlx5_2=down@1500ms:init " "the end of each process's first communicator init \(':init'\)"
run dry-inject-nopreload 2 env R2CC_FAULT_METHOD=inject scripts/drill --no-preload --fault 1/mlx5_2=down@1s
has dry-inject-nopreload "inject: libr2cc.so carries the plan out, and --no-preload leaves it out"
run dry-inject-mode0 2 env R2CC_FAULT_METHOD=inject scripts/drill --mode 0 --fault 1/mlx5_2=down@1s
has dry-inject-mode0 "with R2CC_MODE=0 the library runs no drill"
run cl-drill-inject 0 "${CL[@]}" scripts/drill --fault node1/mlx5_3=blackhole@2s
has cl-drill-inject "$MPI -x LD_PRELOAD=\S+ -x R2CC_MODE=2 -x R2CC_REPORT=\S+ -x R2CC_DRILL=node1/mlx5_3=blackhole@2000ms -x NCCL_IB_HCA==" \
	"^ bytes per NIC: $F/r2cc top --prometheus every 0\.25 s on node 1 \(over ssh\)$"
# scenarios 01 and 02 with inject, on the cluster target (the default there) and by name
run cl-01-inject 0 "${CL[@]}" "$S/01.hot_repair_to_balance.sh" && has cl-01-inject \
	"$MPI -x LD_PRELOAD=\S+ -x R2CC_MODE=2 -x R2CC_REPORT=\S+ -x R2CC_AR_AFTER_REPAIR=2 -x R2CC_DRILL=node0/mlx5_2=blackhole@4000ms -x NCCL_IB_HCA==mlx5_0,mlx5_2,mlx5_3 -x NCCL_DEBUG -x R2CC_PERF_ROOT=node-1:29517 -x PATH -x LD_LIBRARY_PATH $F/all_reduce_perf $HR$" \
	"^restore: nothing to restore" "DRY RUN"
run cl-02-inject 0 "${CL[@]}" R2CC_FAULT_METHOD=inject FAULT=down FAILED_NODE=1 FAILED_NIC=mlx5_3 RESTORE_AT=9s "$S/02.hot_repair_to_r2cc_allreduce.sh"
has cl-02-inject "-x R2CC_AR_AFTER_REPAIR=3 -x R2CC_DRILL=node1/mlx5_3=down@4000ms\\\\;node1/mlx5_3=up@9000ms -x NCCL_IB_HCA=" \
	"--nic-table=1 "
run dry-01-inject 0 env R2CC_FAULT_METHOD=inject FAULT=ackloss "$S/01.hot_repair_to_balance.sh"
has dry-01-inject "^  env LD_PRELOAD=\S+ R2CC_MODE=2 R2CC_REPORT=\S+ R2CC_AR_AFTER_REPAIR=2 R2CC_DRILL=node0/mlx5_2=ackloss@4000ms $F/all_reduce_perf "
# the cluster's default: a switch method whose settings are there, else inject
run cl-default-ovs 0 "${CL[@]}" "${OVS[@]}" scripts/drill --fault node0/mlx5_2=blackhole@1s
has cl-default-ovs "^ fault method: ovs \(default on the cluster: OVS_BRIDGE/OVS_PORT are set\)$"
run cl-default-ibp 0 "${CL[@]}" IBPORTSTATE_LID=12 IBPORTSTATE_PORT=7 scripts/drill --fault node0/mlx5_2=down@1s
has cl-default-ibp "^ fault method: ibportstate \(default on the cluster: IBPORTSTATE_LID/IBPORTSTATE_PORT are set\)$"
run cl-default-both 2 "${CL[@]}" "${OVS[@]}" IBPORTSTATE_LID=12 scripts/drill --fault node0/mlx5_2=down@1s
has cl-default-both "both OVS_\* and IBPORTSTATE_\* are set"
run cl-default-dev 2 "${CL[@]}" FAULT_DEV=ens1f1 scripts/drill --fault node0/mlx5_2=down@1s
has cl-default-dev "FAULT_DEV is set but R2CC_FAULT_METHOD is not: say iplink or nft"
run cl-nohost 2 "${CL[@]}" R2CC_FAULT_METHOD=iplink NODES=3 scripts/drill --fault node2/mlx5_2=down@1s
has cl-nohost "node 2 has no host"
run cl-nohostfile 2 env R2CC_TARGET=cluster "$S/04.nccl_tests_baseline_healthy.sh"
has cl-nohostfile "needs HOSTFILE"
run bad-method 2 env R2CC_FAULT_METHOD=ovs "$S/04.nccl_tests_baseline_healthy.sh"
has bad-method "cuts a real NIC: needs R2CC_TARGET=cluster"
run no-lib 2 env DRY_RUN=0 R2CC_LIB="$T/none.so" "$S/04.nccl_tests_baseline_healthy.sh"
has no-lib "R2CC_LIB=$T/none.so does not exist \(run make\)"
lacks no-lib "^command:"
run bad-target 2 env R2CC_TARGET=k8s "$S/04.nccl_tests_baseline_healthy.sh"
has bad-target "R2CC_TARGET=k8s: accepts soft or cluster"
unset DRY_RUN

# --- the fault plan parser -------------------------------------------------------------------
run plan-good 0 scripts/drill --check-plan --fault node0/mlx5_2=blackhole@4s --fault node0/mlx5_3=down@8s \
	--fault node0/mlx5_2=up@12s --fault 1/mlx5_0=flap:250@1.5s --fault node1/mlx5_2=slow:12.5@700ms --fault=node0/mlx5_0=down@9000
cat >"$T/plan-good.want" <<'EOF'
step 1: node1/mlx5_2 slow:12.5 at 700 ms
step 2: node1/mlx5_0 flap:250 at 1500 ms
step 3: node0/mlx5_2 blackhole at 4000 ms
step 4: node0/mlx5_3 down at 8000 ms
step 5: node0/mlx5_0 down at 9000 ms
step 6: node0/mlx5_2 up at 12000 ms
EOF
diff "$T/plan-good.want" "$T/plan-good.out" >/dev/null && ok || { fail "plan-good: output differs"; diff "$T/plan-good.want" "$T/plan-good.out" | head; }
bad_plan() { # NAME MESSAGE-REGEX SPEC...
	local name=$1 re=$2
	shift 2
	local a=() s
	for s in "$@"; do a+=(--fault "$s"); done
	run "plan-$name" 2 scripts/drill --check-plan "${a[@]}" && has "plan-$name" "^drill: .*$re"
}
bad_plan no-time "expected NODE/NIC=KIND@TIME" node0/mlx5_2=blackhole
bad_plan no-nic "expected NODE/NIC=KIND@TIME" node0=down@1s
bad_plan kind "unknown kind 'melt': accepts down, blackhole, blackhole-tx, blackhole-rx, ackloss, up, flap:PERIOD_MS, slow:GBPS" node0/mlx5_2=melt@1s
bad_plan ackloss-arg "'ackloss' takes no argument" node0/mlx5_2=ackloss:5@1s
bad_plan flap "flap needs its period in ms" node0/mlx5_2=flap@1s
bad_plan slow "slow needs the rate in Gb/s" node0/mlx5_2=slow:fast@1s
bad_plan arg "'down' takes no argument" node0/mlx5_2=down:3@1s
bad_plan node "node5 does not exist: the job has 2 nodes" node5/mlx5_2=down@1s
bad_plan nodename "node 'gpu7': write node<K> or <K>" gpu7/mlx5_2=down@1s
bad_plan nic "NIC mlx5_9 is not one of this job's NICs \(mlx5_0,mlx5_2,mlx5_3\)" node0/mlx5_9=down@1s
bad_plan time "time '4min': write seconds" node0/mlx5_2=down@4min
bad_plan second "fault 2 'node0/mlx5_2=up@x'" node0/mlx5_2=down@1s node0/mlx5_2=up@x
run plan-none 2 scripts/drill --check-plan && has plan-none "no fault given"
run drill-badopt 2 scripts/drill --frobnicate && has drill-badopt "unknown option '--frobnicate'"
run drill-badsize 2 scripts/drill --size lots --fault node0/mlx5_2=down@1s && has drill-badsize "--size accepts"

# --- check_idle ------------------------------------------------------------------------------
(
	exec 8>>"$T/lock"
	flock 8
	exec sleep 30
) &
holder=$!
for _ in $(seq 50); do flock -n "$T/lock" true 2>/dev/null || break; sleep 0.05; done
run idle-lock 3 env DRY_RUN=1 "$S/04.nccl_tests_baseline_healthy.sh"
has idle-lock "check_idle: another scenario or drill is running \(lock $T/lock held"
lacks idle-lock "^command:"
run idle-lock-drill 3 env DRY_RUN=1 scripts/drill --fault node0/mlx5_2=down@1s
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null
cp "$(command -v sleep)" "$T/scn-fake-bench"
"$T/scn-fake-bench" 30 &
bench=$!
run idle-proc 3 env DRY_RUN=1 IDLE_PROCS="r2cc-perf scn-fake-bench" "$S/05.nccl_tests_balance_unhealthy.sh"
has idle-proc "benchmark processes are running on this host: scn-fake-bench \(pid $bench\)"
kill "$bench" 2>/dev/null
wait "$bench" 2>/dev/null
run idle-free 0 env DRY_RUN=1 IDLE_PROCS="r2cc-perf scn-fake-bench" "$S/05.nccl_tests_balance_unhealthy.sh"

# --- SAVE_LOG ----------------------------------------------------------------------------------
touch "$T/before"
run save 0 env DRY_RUN=1 SAVE_LOG=1 LOG_DIR="$T/logs" "$S/04.nccl_tests_baseline_healthy.sh"
L=$T/logs/04.nccl_tests_baseline_healthy.log
if [ -f "$L" ]; then
	grep -q "verdict: 04.nccl_tests_baseline_healthy" "$L" && grep -q "^command:" "$L" && ok ||
		fail "save: $L lacks the verdict or the command"
else
	fail "save: $L was not written"
fi
has save "^saved: $L$"
run save-drill 0 env DRY_RUN=1 SAVE_LOG=1 LOG_DIR="$T/logs" scripts/drill --fault node0/mlx5_2=down@1s
[ -f "$T/logs/drill.fault.log" ] && ok || fail "save-drill: no drill.fault.log"
for d in logs logs/softverbs logs/strategies/../foundation; do
	run "save-refused-${d//\//_}" 2 env DRY_RUN=1 SAVE_LOG=1 LOG_DIR="$d" "$S/04.nccl_tests_baseline_healthy.sh" &&
		has "save-refused-${d//\//_}" "is inside logs/, which holds the reference runs"
done
changed=$(find logs -newer "$T/before" -type f -not -path 'logs/local/*' | head -3)
[ -z "$changed" ] && ok || fail "files under logs/ were written: $changed"
[ -e logs/04.nccl_tests_baseline_healthy.log ] && fail "a log was written into logs/ itself" || ok

# --- real runs against the test doubles ----------------------------------------------------------
rm -f "$FAKE_STATE"/*
run drill-dies 1 env FAKE_DIE=1 scripts/drill --size 1G --iters 8 --fault node0/mlx5_2=blackhole@0.35s && has drill-dies \
	"^  step 1  node0/mlx5_2 blackhole +at  0\.350 s: injected at 0\.[0-9]+ s, during iteration [0-9]+$" \
	"detection not reported, repair \(migration\) not reported -- R2CC recorded no incident" \
	"^VERDICT: FAIL$" "the workload died \(exit status 2\) .* after step 1 \(node0/mlx5_2 blackhole\), with iteration [0-9]+ in flight" \
	"R2CC recorded no incident: hot repair did not act" "never ended" "busbw before +[0-9.]+ GB/s" \
	"no NIC table: the workload ended before printing it"
grep -q "fault node0 mlx5_2 blackhole" "$FAKE_STATE/ctl.log" && ok || fail "drill-dies: the fault was not injected"
tail -n 1 "$FAKE_STATE/ctl.log" | grep -q "reset" && ok || fail "drill-dies: the fabric was not reset at the end"
grep -q "fault node0 mlx5_2 up" "$FAKE_STATE/ctl.log" && ok || fail "drill-dies: the NIC was not restored"
rm -f "$FAKE_STATE"/*
run drill-survives 0 env FAKE_INCIDENT=1 scripts/drill --size 1G --iters 8 --fault node0/mlx5_2=blackhole@0.25s \
	--fault node0/mlx5_3=slow:10@0.45s --fault node0/mlx5_2=up@0.65s && has drill-survives \
	"detection [0-9.]+ ms, repair \(migration\) 41\.2 ms" "R2CC reports: [0-9]+ file\(s\), 1 incident\(s\)" \
	"^VERDICT: PASS" "verification: 8 of 8 iterations ended OK and verified" \
	"^ +1 +0\.[0-9]+ +100 +[0-9.]+ +before +537 +537 +537 +537 +537 +537$" \
	"busbw after +[0-9.]+ GB/s" "^  step 3  node0/mlx5_2 up +at  0\.650 s: injected at"
# busbw of an iteration: 1 GiB, 4 ranks, 100 ms -> 2*3/4 * 1073741824 / 0.1 / 1e9 = 16.11 GB/s
has drill-survives "^ +2 +[0-9.]+ +100 +16\.11 "
rm -f "$FAKE_STATE"/*
run drill-late 1 scripts/drill --size 1G --iters 3 --fault node0/mlx5_2=blackhole@20s
has drill-late "NOT injected \(the workload ended first\)" "step 1 \(node0/mlx5_2 blackhole\) was never injected"
run drill-ctlfail 1 env FAKE_CTL_FAIL=1 scripts/drill --size 1G --iters 4 --fault node0/mlx5_2=down@0.1s
has drill-ctlfail "FAILED status 1: softverbs-ctl: no fabric" "the fault command failed"
rm -f "$FAKE_STATE"/*
run drill-launch 0 scripts/drill --from launch --size 1G --iters 4 --fault node0/mlx5_2=slow:5@0.1s
has drill-launch "times count from the launch"

# (each of these runs has a state directory of its own: a straggler of an earlier run
# cannot cut its NIC)
state() { mkdir -p "$T/state.$1" && echo "$T/state.$1"; }
# Did each cutting step cut? From the NIC table of the iterations after the repair ...
run drill-cut 0 env FAKE_STATE="$(state drill-cut)" FAKE_INCIDENT=1 scripts/drill --size 1G --iters 8 --fault node0/mlx5_2=blackhole@0.25s
has drill-cut "^           cut from the repair \([0-9.]+ s\) to the end of the run \([0-9.]+ s\): mlx5_2 moved 0 MB in iterations? [0-9-]+ while node0's NICs moved 3220 MB per iteration \(NIC table, softverbs_nic_stats\)$" \
	"^VERDICT: PASS -- every step injected, every cutting step cut its NIC's bytes, every result verified" \
	"^           R2CC marked 0 of 1 of these incidents 'drill'$"
run drill-nocut 1 env FAKE_STATE="$(state drill-nocut)" FAKE_INCIDENT=1 FAKE_NOCUT=1 scripts/drill --size 1G --iters 8 --fault node0/mlx5_2=blackhole@0.25s
has drill-nocut "^           NOT CUT from the repair .*: mlx5_2 still moved 1074 MB in iteration [0-9]+ \([0-9] of the [0-9] iterations in the window moved bytes; NIC table" \
	"^VERDICT: FAIL$" "^  - step 1 \(node0/mlx5_2 blackhole\) cut nothing: after the repair, mlx5_2 still moved 1074 MB"
# ... else from R2CC's counters sampled with r2cc top (a sweep: no per-iteration table) ...
SWEEP1=(-- all_reduce_perf -b 1G -e 1G)
run drill-top-cut 0 env FAKE_STATE="$(state drill-top-cut)" FAKE_INCIDENT=1 FAKE_SWEEP_STEPS=10 scripts/drill --fault node0/mlx5_2=blackhole@0.2s "${SWEEP1[@]}"
has drill-top-cut "cut from the repair .*: mlx5_2 moved 0 B in [0-9.]+ s while node0's other NICs moved [0-9]+ MB \(R2CC's counters, sampled with r2cc top\)$" \
	"NIC table: not one|^VERDICT: PASS -- every step injected, every cutting step cut its NIC's bytes"
lacks drill-top-cut "not checked"
run drill-top-nocut 1 env FAKE_STATE="$(state drill-top-nocut)" FAKE_INCIDENT=1 FAKE_NOCUT=1 FAKE_SWEEP_STEPS=10 scripts/drill --fault node0/mlx5_2=blackhole@0.2s "${SWEEP1[@]}"
has drill-top-nocut "NOT CUT from the repair .*: mlx5_2 still moved [0-9.]+ MB in [0-9.]+ s \(R2CC's counters on node0" \
	"^  - step 1 \(node0/mlx5_2 blackhole\) cut nothing: after the repair, mlx5_2 still moved"
# ... and where neither exists, "not checked", never a silent pass
run drill-unchecked 0 env FAKE_STATE="$(state drill-unchecked)" FAKE_INCIDENT=1 FAKE_SWEEP_STEPS=6 R2CC_TOP_BIN="$T/no-r2cc" scripts/drill --fault node0/mlx5_2=blackhole@0.2s "${SWEEP1[@]}"
has drill-unchecked "^ bytes per NIC: no $T/no-r2cc; only a NIC table of the workload can show them$" \
	"^           cut: not checked from the repair .*: NIC table: not one of the drill's iterations \(no --iters-table\); R2CC's counters: not sampled on node0" \
	"^VERDICT: PASS -- every step injected, step 1 not checked for its NIC's bytes, every result verified"
lacks drill-unchecked "every cutting step cut"
# no repair recorded: the check starts DRILL_SETTLE_MS after the step
run drill-settle 0 env FAKE_STATE="$(state drill-settle)" DRILL_SETTLE_MS=300 scripts/drill --size 1G --iters 8 --fault node0/mlx5_2=down@0.2s
has drill-settle "R2CC recorded no incident" "cut from DRILL_SETTLE_MS=300 after the step \(no repair recorded\) .*: mlx5_2 moved 0 MB in iterations"

# inject with the fake carrying R2CC_DRILL out as the library would. The ranks get libc as
# their "library" (the real libr2cc.so would also write reports of every helper process).
NOLIB=$(ldd "$(command -v bash)" | awk '$1 ~ /^libc\.so/ {print $3; exit}')
[ -e "$NOLIB" ] || NOLIB=$ROOT/${BUILD:-build}/lib/libr2cc.so
INJ=(env R2CC_FAULT_METHOD=inject R2CC_LIB="$NOLIB")
run drill-inject 0 "${INJ[@]}" FAKE_STATE="$(state drill-inject)" FAKE_INCIDENT=1 scripts/drill --size 1G --iters 8 --fault node0/mlx5_2=blackhole@0.25s
has drill-inject "^fault plan \(inject, carried out by libr2cc.so in every rank \(R2CC_DRILL\)\):$" \
	"^  step 1  node0/mlx5_2 blackhole +at  0\.250 s: applied at 0\.[0-9]+ s, (during iteration [0-9]|between iterations)$" \
	"^           by 4 of the 4 processes that report the drill, to 8 queue pairs in all; the last 0\.006 s after the first$" \
	"detection 3\.5 ms, repair \(migration\) 41\.2 ms" "^           R2CC marked 1 of 1 of these incidents 'drill'$" \
	"mlx5_2 moved 0 MB in iterations" "^VERDICT: PASS -- every step applied, every cutting step cut"
[ -e "$T/state.drill-inject/ctl.log" ] && grep -q " fault " "$T/state.drill-inject/ctl.log" && fail "drill-inject: softverbs-ctl cut or restored a NIC" || ok
run drill-inject-nocut 1 "${INJ[@]}" FAKE_STATE="$(state drill-inject-nocut)" FAKE_INCIDENT=1 FAKE_NOCUT=1 scripts/drill --size 1G --iters 8 --fault node0/mlx5_2=blackhole@0.25s
has drill-inject-nocut "^  - step 1 \(node0/mlx5_2 blackhole\) cut nothing: after the repair, mlx5_2 still moved"
run drill-inject-old 1 "${INJ[@]}" FAKE_STATE="$(state drill-inject-old)" FAKE_NO_DRILL=1 scripts/drill --size 1G --iters 4 --fault node0/mlx5_2=blackhole@0.1s
has drill-inject-old "NOT known to be applied: no R2CC report holds the drill" \
	"step 1 \(node0/mlx5_2 blackhole\): no R2CC report says it was applied \(the reports have no \"drill\""
run drill-inject-late 1 "${INJ[@]}" FAKE_STATE="$(state drill-inject-late)" scripts/drill --size 1G --iters 3 --fault node0/mlx5_2=blackhole@0.1s --fault node0/mlx5_3=down@20s
has drill-inject-late "^  step 2  node0/mlx5_3 down +at 20\.000 s: NOT applied \(the workload ended first: not due yet\)$" \
	"step 2 \(node0/mlx5_3 down\) was never applied: the workload ended before 20\.0 s"
run s01-inject 0 "${INJ[@]}" FAKE_STATE="$(state s01-inject)" FAKE_INCIDENT=1 FAULT_AT=0.3s SIZE=1G ITERS=8 "$S/01.hot_repair_to_balance.sh"
has s01-inject "^ PASS$" "R2CC_DRILL=node0/mlx5_2=blackhole@300ms " "every step applied, every cutting step cut its NIC's bytes"

rm -f "$FAKE_STATE"/*
run s01 1 env FAKE_DIE=1 FAULT_AT=0.3s SIZE=1G ITERS=8 "$S/01.hot_repair_to_balance.sh" && has s01 \
	"^ verdict: 01\.hot_repair_to_balance$" "^ FAIL$" "^   the workload died" \
	"^   R2CC recorded no incident: hot repair did not act" "R2CC_AR_AFTER_REPAIR=2"
rm -f "$FAKE_STATE"/*
run s02 0 env FAKE_INCIDENT=1 FAULT_AT=0.3s SIZE=1G ITERS=6 "$S/02.hot_repair_to_r2cc_allreduce.sh"
has s02 "^ PASS$" "R2CC_AR_AFTER_REPAIR=3"
run s04 0 "$S/04.nccl_tests_baseline_healthy.sh" && has s04 "^ PASS$" \
	"baseline_healthy: #wrong 0 in every row" "baseline_healthy: busbw at 1 GiB: 5\.37 / 5\.37 GB/s"
run s04-wrong 1 env FAKE_WRONG=1 "$S/04.nccl_tests_baseline_healthy.sh" && has s04-wrong "^ FAIL$" \
	"WRONG results at 1073741824 B float sum: #wrong 1 / 0" "the program failed \(exit status 1\)"
run s05 0 "$S/05.nccl_tests_balance_unhealthy.sh" && has s05 "^ PASS$" \
	"NOTE: mlx5_2 \(declared failed\) still carried 537 MB in / 537 MB out per call on node node0 \(33% "
run s05-strict 1 env REQUIRE_PLACEMENT=1 "$S/05.nccl_tests_balance_unhealthy.sh" && has s05-strict "^ FAIL$"
run s03 0 "$S/03.nccl_tests_compare_all.sh"
cat >"$T/s03.want" <<'EOF'
===== comparison (-b 256M -e 4G -f 4 -g 1 -c 1 -n 5 -w 2 -d float -o sum) =====
bytes | baseline_healthy | balance_unhealthy | r2cc_allreduce_unhealthy
268435456 | 4.03/4.03 (wrong 0/0) | 4.03/4.03 (wrong 0/0) | 4.03/4.03 (wrong 0/0)
1073741824 | 5.37/5.37 (wrong 1/0) | 5.37/5.37 (wrong 1/0) | 5.37/5.37 (wrong 1/0)
(cells: busbw out-of-place/in-place GB/s, then #wrong out-of-place/in-place)
EOF
# the same table with one wrong result per run: the cells must show it and 03 must fail
run s03-wrong 1 env FAKE_WRONG=1 "$S/03.nccl_tests_compare_all.sh"
sed -n '/^===== comparison/,/^(cells/p' "$T/s03-wrong.out" >"$T/s03-wrong.table"
diff "$T/s03.want" "$T/s03-wrong.table" >/dev/null && ok || { fail "s03-wrong: table differs"; diff "$T/s03.want" "$T/s03-wrong.table" | head; }
has s03 "^268435456 \| 4\.03/4\.03 \(wrong 0/0\) \| 4\.03/4\.03 \(wrong 0/0\) \| 4\.03/4\.03 \(wrong 0/0\)$" "^ PASS$"
count s03 "^command:" 3
[ -s "$FAKE_STATE/perf.calls" ] && ok || fail "the fake benchmark was not called"

echo "scenarios: $n checks, $([ $rc = 0 ] && echo "all passed" || echo "some FAILED")"
exit $rc
