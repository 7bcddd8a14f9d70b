#!/usr/bin/env bash
# CPU test of the whole r2cc-perf program on the host emulation of CUDA and NCCL
# (perf_emu.h; no GPU): every collective, type, reduction and root verified with 4 ranks
# as 2 emulated nodes x 2 and with 3 ranks (not a power of two), nccl-tests' output
# format, ranks given by mpirun-style variables, the checker catching a deliberately
# corrupted element and a faulty library, the hot-repair iteration table, and the
# failure paths (rendezvous without its peer, a hung collective, bad arguments).
# Asserts on exit statuses and on the parsed #wrong columns.
#   bench/emu-check.sh
set -u
cd "$(dirname "$0")/.."
E=${BUILD:-build}/tests/perf/emu
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
bad() {
	echo "FAIL: $*"
	fail=1
}

# status name cmd...: runs cmd into $T/name.out, checks the status
run() {
	local want=$1 name=$2 rc
	shift 2
	"$@" >"$T/$name.out" 2>"$T/$name.err"
	rc=$?
	if [ "$rc" -ne "$want" ]; then
		bad "$name: status $rc, expected $want: $*"
		tail -5 "$T/$name.err" | sed 's/^/    /'
	fi
}

# name, then the allowed values of the two #wrong columns (out-of-place, in-place):
# every table row must have 13 fields and those values
rows() {
	local name=$1 oop=$2 ip=$3 n
	n=$(awk '$1 ~ /^[0-9]+$/' "$T/$name.out" | wc -l)
	[ "$n" -gt 0 ] || bad "$name: no table rows"
	awk -v o="$oop" -v i="$ip" '$1 ~ /^[0-9]+$/ && (NF != 13 || $9 !~ "^(" o ")$" ||
		$13 !~ "^(" i ")$") { print; exit 1 }' "$T/$name.out" ||
		bad "$name: unexpected row above"
}

S="-b 8 -e 4K -f 16 -n 1 -w 1 -d all -o all"
for c in allreduce allgather reducescatter broadcast reduce alltoall sendrecv; do
	ip=0
	[ "$c" = alltoall ] || [ "$c" = sendrecv ] && ip=N/A
	run 0 "$c-2x2" "$E"/r2cc-perf-emu --coll $c $S -r all --nodes 2 --gpus-per-node 2
	rows "$c-2x2" 0 "$ip"
	run 0 "$c-3x1" "$E"/r2cc-perf-emu --coll $c $S --nodes 3 --gpus-per-node 1
	rows "$c-3x1" 0 "$ip"
done
echo "collectives: done"

# nccl-tests' header and footer, program names
run 0 fmt "$E"/all_gather_perf -b 1K -e 1M -f 4 -c 0 --nodes 2 --gpus-per-node 1
rows fmt N/A N/A
for re in '^# nThread 1 nGpus 1 minBytes 1024 maxBytes 1048576 step: 4\(factor\) warmup iters: 1 iters: 20 ' \
	'^#  Rank  1 Group  0 Pid +[0-9]+ on +[^ ]+ device  1 \[0x11\] ' \
	'^#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong$' \
	'^#        \(B\)    \(elements\)                               \(us\)  \(GB/s\)  \(GB/s\)            \(us\)  \(GB/s\)  \(GB/s\)' \
	'^     1048576        131072     float    none      -1 ' \
	'^# Out of bounds values : 0 OK$' '^# Avg bus bandwidth    : [0-9.e+-]+ $'; do
	grep -Eq "$re" "$T/fmt.out" || bad "format: no line matching '$re'"
done
grep -q 'AllGather' "$T/fmt.out" || bad "format: program name did not select allgather"

# launched by mpirun: two processes with Open MPI's variables; only rank 0 prints
. "$(dirname "$0")/../tests/softverbs/ports.sh"
port=$(free_port $((20000 + $$ % 20000)))
for r in 0 1; do
	env OMPI_COMM_WORLD_RANK=$r OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=$r \
		R2CC_PERF_ROOT=127.0.0.1:$port "$E"/reduce_scatter_perf -b 1K -e 64K -f 4 -o max \
		>"$T/mpi$r.out" 2>"$T/mpi$r.err" &
	eval "pid$r=$!"
done
wait "$pid0" || bad "mpi rank 0 failed"
wait "$pid1" || bad "mpi rank 1 failed"
rows mpi0 0 0
[ -s "$T/mpi1.out" ] && bad "mpi rank 1 printed on stdout"
grep -q 'ranks from Open MPI' "$T/mpi0.out" || bad "mpi: ranks not from Open MPI variables"

# launched by torchrun: RANK/WORLD_SIZE, rendezvous at MASTER_PORT + 1
for r in 0 1; do
	env RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$((port + 10)) \
		"$E"/sendrecv_perf -b 1K -e 4K -f 4 >"$T/torch$r.out" 2>"$T/torch$r.err" &
	eval "pid$r=$!"
done
wait "$pid0" || bad "torchrun rank 0 failed"
wait "$pid1" || bad "torchrun rank 1 failed"
rows torch0 0 N/A
grep -q 'ranks from torchrun' "$T/torch0.out" || bad "torchrun: ranks not from RANK/WORLD_SIZE"

# the checker's self-test and a library that gets one element wrong
run 1 selftest "$E"/all_reduce_perf -b 1K -e 64K -f 4 -d all --selftest-wrong \
	--nodes 2 --gpus-per-node 1
rows selftest 1 1
grep -q '^# Out of bounds values : [1-9][0-9]* FAILED' "$T/selftest.out" || bad "selftest footer"
grep -q 'elements wrong; first at element' "$T/selftest.err" || bad "selftest: no detail"
run 1 corrupt env R2CC_PERF_EMU_CORRUPT=2 "$E"/all_reduce_perf -b 1K -e 4K -f 4 -d half \
	--nodes 3 --gpus-per-node 1
rows corrupt 1 1
run 0 nocorrupt-bcast env R2CC_PERF_EMU_CORRUPT=2 "$E"/broadcast_perf -b 1K -e 4K -f 4 \
	--nodes 3 --gpus-per-node 1
rows nocorrupt-bcast 0 0
echo "checker: done"

# --split-cpus: each emulated node on its own cores, disjoint; one core cannot be split
run 0 split "$E"/all_reduce_perf -b 1M -e 1M -n 2 --nodes 2 --gpus-per-node 1 --split-cpus
rows split 0 0
n0=$(sed -n 's/^# node0 runs on CPUs //p' "$T/split.out")
n1=$(sed -n 's/^# node1 runs on CPUs //p' "$T/split.out")
if [ "$(nproc)" -ge 2 ]; then
	[ -n "$n0" ] && [ -n "$n1" ] && [ "$n0" != "$n1" ] || bad "split: node CPUs '$n0' / '$n1'"
fi
run 0 split-one taskset -c 0 "$E"/all_reduce_perf -b 1K -e 1K -n 1 --nodes 2 --gpus-per-node 1 \
	--split-cpus
grep -q 'fewer cores than nodes' "$T/split-one.err" || bad "split on one core: no warning"
run 4 split-alone "$E"/all_reduce_perf -b 1K -e 1K --split-cpus
grep -q -- '--split-cpus goes with --nodes' "$T/split-alone.err" || bad "split without --nodes"
echo "split-cpus: done"

# hot-repair table
run 0 iters "$E"/all_reduce_perf -b 1M -e 1M -n 3 -w 0 --iters-table --nodes 2 --gpus-per-node 1
[ "$(grep -c '^\[Rank 0\] Iter [1-3]/3 END: OK (elapsed [0-9]* ms)$' "$T/iters.out")" -eq 3 ] ||
	bad "iters: END lines"
grep -q '^\[Rank 0\] Iter 1/3 START: allreduce 1.00 MiB$' "$T/iters.out" || bad "iters: START"
grep -q '^\[Rank 0\] TEST PASS' "$T/iters.out" || bad "iters: PASS"
run 1 iters-bad env R2CC_PERF_EMU_CORRUPT=0 "$E"/all_reduce_perf -b 1M -e 1M -n 2 -w 0 \
	--iters-table --nodes 2 --gpus-per-node 1
grep -q 'END: WRONG RESULT, 1 wrong elements' "$T/iters-bad.out" || bad "iters-bad: END"
grep -q '^\[Rank 0\] TEST FAIL' "$T/iters-bad.out" || bad "iters-bad: FAIL"
run 0 nictable "$E"/all_reduce_perf -b 1K -e 4K -f 4 -n 2 --nic-table=1 --nodes 2 --gpus-per-node 1
grep -q 'NIC bytes per iteration (MB = 1e6 B) of node node1' "$T/nictable.out" ||
	bad "nic-table: node index 1 is not node1"
echo "tables: done"

# failure paths
run 4 usage "$E"/r2cc-perf-emu -d float7
run 2 no-peer env R2CC_PERF_RANK=0 R2CC_PERF_NRANKS=2 R2CC_PERF_ROOT=127.0.0.1:$((port + 1)) \
	R2CC_PERF_RDV_TIMEOUT=2 "$E"/r2cc-perf-emu -b 8 -e 8
grep -q 'only 1 of 2 processes reached the rendezvous' "$T/no-peer.err" || bad "no-peer message"
start=$(date +%s)
run 3 hang env R2CC_PERF_TEST_HANG=1 "$E"/all_reduce_perf -b 1K -e 1K -T 2 --nodes 2 \
	--gpus-per-node 1
[ $(($(date +%s) - start)) -lt 60 ] || bad "hang: took too long"
grep -q 'no progress within the time limit\|did not complete within' "$T/hang.err" ||
	bad "hang: no watchdog message"
echo "failure paths: done"
exit $fail
