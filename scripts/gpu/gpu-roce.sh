#!/usr/bin/env bash
# GPU runs of the software RDMA device's RoCE mode and fused NICs (GPU machine only, one
# GPU is enough: both emulated nodes use GPU 0; R2CC is not loaded). Every run is
# bounded by `timeout`; about 5 minutes in all. Logs and summary.txt go to LOGDIR.
#
#   scripts/gpu/gpu-roce.sh LOGDIR [PART...]
#
# parts (default: all, in this order):
#   roce     plain NCCL (the system's, 2.28.3) over RoCE-mode soft NICs, 2 nodes x 1 GPU,
#            3 NICs, NCCL_IB_GID_INDEX=3 and NCCL_IB_TC=106 on a fabric whose lossless
#            class is 106: NCCL_DEBUG=INFO shows the devices and the GID index, a verified
#            AllReduce sweep 8 B - 256 MiB (-c 1), softverbs-ctl shows NCCL's GRHs, and no
#            byte may be lossy
#   nogid    the same NCCL without NCCL_IB_GID_INDEX: what its automatic GID selection
#            does on a device without sysfs (its source says: it fails reading
#            /sys/class/infiniband/<dev>/ports/1/gid_attrs/types/2), and with
#            NCCL_IB_ADDR_FAMILY=AF_INET6 (no sysfs read: GID 0, link-local RoCE v1)
#   tc       NCCL_IB_TC left at its default (0) on that fabric: lossy_bytes counts it
#   fused    NCCL 2.30.7 (NCCL_XZ) with NCCL_IB_RESILIENCY_PORT_FAILOVER=1 over fused soft
#            NICs (topo.sh --fused, NCCL's default merge level), 3 x 25 Gb/s shaped, IB link
#            layer: healthy; then node0/mlx5_1 black-holed, and taken down, after 10 of 60
#            verified 512 MiB AllReduces: whether it survives, how long it stalls, the
#            rate after; without NCCL's failover as a control; and the black hole once
#            more at the real transport timeout (SOFTVERBS_TIME_SCALE=1, ~34 s)
#            FUSED_RUNS picks some of its runs: healthy blackhole down down-nofailover
#            blackhole-realtime (default all), e.g. to split it over two calls
#
# NCCL_XZ: the xz-compressed libnccl.so.2 of NCCL 2.30.7 (sm_90 only), default
# .artifacts/libnccl-2.30.7-sm90.so.2.xz; it is unpacked to a temporary folder.
# Needs build/ made on the build machine (the device, softverbs-ctl, r2cc-perf).
set -u
cd "$(dirname "$0")/../.." || exit 2
export R2CC_ROOT=$PWD
B=${BUILD:-build}
LOG=${1:?usage: scripts/gpu/gpu-roce.sh LOGDIR [PART...]}
shift
parts=${*:-roce nogid tc fused}
NCCL_XZ=${NCCL_XZ:-.artifacts/libnccl-2.30.7-sm90.so.2.xz}
mkdir -p "$LOG"
. scripts/softfabric.sh
PERF=$PWD/$B/bin/r2cc-perf
CTL=$PWD/$B/bin/softverbs-ctl
SUM=$LOG/summary.txt
: >"$SUM"
BASE_LDP=${LD_LIBRARY_PATH:-}
fail=0
say() { echo "$*" | tee -a "$SUM"; }
indent() { sed 's/^/    /' | tee -a "$SUM"; }

for f in "$PERF" "$CTL" "$B/softverbs/libibverbs.so.1"; do
	[ -e "$f" ] || { say "missing $f: run make on the build machine and carry build/"; exit 2; }
done

# The last iteration END line seen in a log, 0 if none.
last_iter() { sed -nE 's/.*Iter ([0-9]+)\/[0-9]+ END.*/\1/p' "$1" 2>/dev/null | tail -1 | grep . || echo 0; }
# "iteration elapsed_ms" for every verified iteration of an --iters-table log.
iter_ms() { sed -nE 's/.*Iter ([0-9]+)\/[0-9]+ END: OK \(elapsed ([0-9]+) ms\).*/\1 \2/p' "$1"; }
median() { sort -n | awk '{a[NR] = $1} END {if (!NR) print "-"; else print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}'; }
gbs() { awk -v ms="$1" 'BEGIN {if (ms + 0 > 0) printf "%.2f", 536870912 / (ms / 1000) / 1e9; else print "-"}'; }

# roce: NCCL 2.28.3 over RoCE-mode soft NICs.
roce_env() { # NAME
	export LD_LIBRARY_PATH=$BASE_LDP
	softfabric_env mlx5_0:100,mlx5_1:100,mlx5_2:100 "$1"
	export SOFTVERBS_LINK=roce SOFTVERBS_LOSSLESS_TC=106
	unset NCCL_IB_GID_INDEX NCCL_IB_TC NCCL_IB_ADDR_FAMILY
}

# Runs r2cc-perf in the background, saves the fabric's QP list once NCCL's QPs are up.
perf_bg() { # LOGFILE ARGS...
	local out=$1
	shift
	NCCL_DEBUG=${NCCL_DEBUG:-INFO} NCCL_DEBUG_SUBSYS=${NCCL_DEBUG_SUBSYS:-INIT,NET} \
		timeout "${PERF_TIMEOUT:-240}" "$PERF" --nodes 2 --gpus-per-node 1 -T 120 "$@" >"$out" 2>&1 &
	job=$!
}

part_roce() {
	roce_env sv-roce
	export NCCL_IB_GID_INDEX=3 NCCL_IB_TC=106
	cp "$NCCL_TOPO_FILE" "$LOG/roce-topo.xml"
	say "=== roce: the system's NCCL over RoCE soft NICs, NCCL_IB_GID_INDEX=3 NCCL_IB_TC=106, lossless class 106"
	local t0=$SECONDS
	perf_bg "$LOG/roce-allreduce.log" --coll allreduce -b 8 -e 256M -f 2 -c 1 -n 3 -w 1 -d float -o sum
	for _ in $(seq 300); do
		"$CTL" --fabric "$SOFTVERBS_FABRIC" list >"$LOG/roce-list.txt" 2>/dev/null
		grep -q "state=RTS.*sgid_index=" "$LOG/roce-list.txt" && break
		kill -0 $job 2>/dev/null || break
		sleep 0.2
	done
	wait $job
	local rc=$?
	"$CTL" --fabric "$SOFTVERBS_FABRIC" counters >"$LOG/roce-counters.txt" 2>&1
	say "    r2cc-perf exit $rc after $((SECONDS - t0)) s"
	grep -E "NCCL library|NET/IB : Using|NCCL_IB_GID_INDEX set|NCCL_IB_TC set" "$LOG/roce-allreduce.log" | sort -u | head -5 | indent
	grep -m3 -E "NET/IB: NCCL (Merged)?Dev .*GID" "$LOG/roce-allreduce.log" | indent
	grep -E "^ +(8|1048576|268435456) .*float|Out of bounds|Avg bus" "$LOG/roce-allreduce.log" | indent
	grep -m2 -E "^qp .*state=RTS" "$LOG/roce-list.txt" | indent
	local lossy
	lossy=$(sed -nE 's/.*lossy_bytes=([0-9]+).*/\1/p' "$LOG/roce-counters.txt" | awk '{s += $1} END {print s + 0}')
	say "    lossy bytes on all NICs: $lossy (must be 0)"
	if [ $rc -ne 0 ] || ! grep -q "Out of bounds values : 0 OK" "$LOG/roce-allreduce.log" ||
		! grep -q "sgid_index=3 .*traffic_class=106" "$LOG/roce-list.txt" || [ "$lossy" != 0 ]; then
		say "    FAILED"
		fail=1
	fi
	softfabric_reset
}

part_nogid() {
	local fam
	for fam in default AF_INET6; do
		roce_env "sv-nogid-$fam"
		[ $fam = AF_INET6 ] && export NCCL_IB_ADDR_FAMILY=AF_INET6
		say "=== nogid ($fam): NCCL without NCCL_IB_GID_INDEX over RoCE soft NICs (no sysfs)"
		local t0=$SECONDS
		PERF_TIMEOUT=90 perf_bg "$LOG/nogid-$fam.log" --coll allreduce -b 8 -e 1M -f 32 -c 1 -n 1 -w 1 -d float -o sum
		wait $job
		say "    r2cc-perf exit $? after $((SECONDS - t0)) s"
		grep -E "ncclIbRoceGetVersionNum|NCCL_IB_ADDR_FAMILY set|NET/IB: NCCL (Merged)?Dev .*GID|Out of bounds|WARN|failed:" \
			"$LOG/nogid-$fam.log" | sort | uniq -c | sort -rn | head -6 | indent
		softfabric_reset
	done
}

part_tc() {
	roce_env sv-tc
	export NCCL_IB_GID_INDEX=3
	say "=== tc: NCCL_IB_TC unset (NCCL's default class 0) on a fabric whose lossless class is 106"
	PERF_TIMEOUT=120 perf_bg "$LOG/tc-default.log" --coll allreduce -b 1M -e 16M -f 4 -c 1 -n 2 -w 1 -d float -o sum
	wait $job
	local rc=$?
	"$CTL" --fabric "$SOFTVERBS_FABRIC" counters >"$LOG/tc-counters.txt" 2>&1
	say "    r2cc-perf exit $rc"
	indent <"$LOG/tc-counters.txt"
	if ! sed -nE 's/.*lossy_bytes=([0-9]+).*/\1/p' "$LOG/tc-counters.txt" | awk '$1 > 0 {n++} END {exit !(n > 0)}'; then
		say "    FAILED: no lossy bytes counted"
		fail=1
	fi
	softfabric_reset
}

# fused: NCCL 2.30.7's own port failover over fused soft NICs.
unpack_nccl() {
	NCCLDIR=$(mktemp -d /tmp/nccl-2.30.7.XXXXXX)
	if command -v xz >/dev/null; then
		xz -dc "$NCCL_XZ" >"$NCCLDIR/libnccl.so.2"
	else
		python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
			"$NCCL_XZ" "$NCCLDIR/libnccl.so.2"
	fi
}

fused_env() { # NAME
	export LD_LIBRARY_PATH=$BASE_LDP
	# The IB link layer, whatever the RoCE parts before it left set.
	unset SOFTVERBS_LINK SOFTVERBS_LOSSLESS_TC NCCL_IB_GID_INDEX NCCL_IB_TC NCCL_IB_ADDR_FAMILY
	SOFTFABRIC_FUSED=1 softfabric_env mlx5_0:25,mlx5_1:25,mlx5_2:25 "$1"
	export SOFTVERBS_SHAPING=1 SOFTVERBS_TIME_SCALE=${SCALE:-0.05}
	export LD_LIBRARY_PATH=$NCCLDIR:$LD_LIBRARY_PATH NCCL_GIN_ENABLE=0
	export NCCL_IB_RESILIENCY_PORT_FAILOVER=${FAILOVER:-1}
}

# One fused run of ITERS verified 512 MiB AllReduces, FAULT after iteration 10.
fused_run() { # NAME FAULT(none|down|blackhole) ITERS
	local name=$1 fault=$2 iters=$3 log=$LOG/fused-$1.log
	fused_env "sv-fused-$name"
	[ "$name" = healthy ] && export NCCL_TOPO_DUMP_FILE=$LOG/fused-topo-dump.xml
	cp "$NCCL_TOPO_FILE" "$LOG/fused-topo.xml"
	say "=== fused-$name: NCCL 2.30.7 failover=$NCCL_IB_RESILIENCY_PORT_FAILOVER, fused 3 x 25 Gb/s, fault $fault after iteration 10 of $iters, transport timeouts x$SOFTVERBS_TIME_SCALE"
	local t0=$SECONDS at=-
	perf_bg "$log" --coll allreduce -b 512M -e 512M -n "$iters" -w 1 -c 1 -d float -o sum --iters-table
	if [ "$fault" != none ]; then
		for _ in $(seq 900); do
			[ "$(last_iter "$log")" -ge 10 ] && break
			kill -0 $job 2>/dev/null || break
			sleep 0.1
		done
		at=$(last_iter "$log")
		"$CTL" --fabric "$SOFTVERBS_FABRIC" fault node0 mlx5_1 "$fault" | sed 's/^/softverbs-ctl: /' >"$log.fault"
		echo "fault $fault injected after iteration $at at $(date +%T.%N)" >>"$log.fault"
	fi
	wait $job
	local rc=$?
	unset NCCL_TOPO_DUMP_FILE
	iter_ms "$log" >"$log.ms"
	local n base slow after
	n=$(wc -l <"$log.ms")
	if [ "$fault" = none ]; then
		base=$(awk 'NR > 1 {print $2}' "$log.ms" | median)
		say "    exit $rc after $((SECONDS - t0)) s; $n/$iters iterations verified; median $base ms = $(gbs "$base") GB/s algbw"
	else
		base=$(awk -v f="$at" '$1 > 1 && $1 <= f {print $2}' "$log.ms" | median)
		slow=$(awk -v f="$at" '$1 > f {print $2}' "$log.ms" | sort -n | tail -1)
		after=$(awk -v f="$at" -v n="$iters" '$1 > f + 2 && $1 > n - 10 {print $2}' "$log.ms" | median)
		say "    exit $rc after $((SECONDS - t0)) s; $n/$iters iterations verified; fault after iteration $at"
		say "    before: median $base ms ($(gbs "$base") GB/s); slowest after the fault: ${slow:--} ms; last 10: median ${after:--} ms ($(gbs "${after:-0}") GB/s)"
	fi
	grep -E "NCCL library|Made virtual device|NET/IB : Using" "$log" | sort -u | head -4 | indent
	grep -E "Replacing QP|not fatal|is fatal|failed device|[Pp]robe|[Rr]esilien|WARN" "$log" | sed -E 's/^[^ ]+ [^ ]+ //' |
		sort | uniq -c | sort -rn | head -6 | indent
	grep -E "TEST (PASS|FAIL)|failed:|timed out" "$log" | head -3 | indent
	if [ "$name" = healthy ] && { [ $rc -ne 0 ] || ! grep -q "TEST PASS" "$log"; }; then
		say "    FAILED"
		fail=1
	fi
	softfabric_reset
}

part_fused() {
	[ -r "$NCCL_XZ" ] || { say "=== fused: $NCCL_XZ not found (set NCCL_XZ)"; fail=1; return; }
	unpack_nccl
	local r
	for r in ${FUSED_RUNS:-healthy blackhole down down-nofailover blackhole-realtime}; do
		case $r in
		healthy) fused_run healthy none 20 ;;
		blackhole) fused_run blackhole blackhole 60 ;;
		down) fused_run down down 60 ;;
		down-nofailover) FAILOVER=0 fused_run down-nofailover down 40 ;;
		blackhole-realtime) PERF_TIMEOUT=200 SCALE=1 fused_run blackhole-realtime blackhole 30 ;;
		*) say "unknown fused run $r"; fail=1 ;;
		esac
	done
	rm -rf "$NCCLDIR"
}

for p in $parts; do
	case $p in
	roce) part_roce ;;
	nogid) part_nogid ;;
	tc) part_tc ;;
	fused) part_fused ;;
	*) say "unknown part $p"; fail=1 ;;
	esac
done
say "=== gpu-roce.sh: $([ $fail -eq 0 ] && echo ok || echo FAILED)"
exit $fail
