#!/usr/bin/env bash
# GPU table of hot repair through HPC-X's net plugin (GPU machine only): NCCL loads
# nccl-rdma-sharp-plugins' libnccl-net.so ("IBext", IBEXT_DIR, built there against the
# software device and its libmlx5 stand-in) as it does in images that carry HPC-X: on the
# library path, NCCL_NET unset. 2 nodes x 1 GPU over 3 soft NICs shaped to 25 Gb/s;
# NVIDIA's nccl-tests (NCCL_TESTS_DIR) with -c 1, each collective through each NIC fault
# on node1's mlx5_0 once two result rows are out, every result checked, R2CC's reports
# counted (scripts/gpu/gpu-stall.sh does the runs); then plain NCCL (no R2CC) through the
# same faults, which must end in an error. Every run's log must show NCCL's channels
# "via NET/IBext".
#   scripts/gpu/gpu-ibext.sh LOGDIR ib|roce [COLLS] [FAULTS]
# COLLS default "all_reduce all_gather sendrecv", FAULTS "blackhole down ackloss fatal";
# PLAIN_COLLS, the collectives run without R2CC (default all_reduce); R2CC_RUNS=0 runs
# only those.
# LOGDIR/summary.txt: one line per run (gpu-stall.sh's), with "plain" before the runs
# without R2CC and "ibext=N" (the number of "via NET/IBext" lines) after each.
set -u
cd "$(dirname "$0")/../.." || exit 2
LOG=${1:?usage: scripts/gpu/gpu-ibext.sh LOGDIR ib|roce [COLLS] [FAULTS]}
LINK=${2:?ib or roce}
COLLS=${3:-all_reduce all_gather sendrecv}
FAULTS=${4:-blackhole down ackloss fatal}
[ -f "${IBEXT_DIR:-}/libnccl-net.so" ] || { echo "IBEXT_DIR: the plugin's libnccl-net.so" >&2; exit 2; }
[ -x "${NCCL_TESTS_DIR:-}/all_reduce_perf" ] || { echo "NCCL_TESTS_DIR: nccl-tests' binaries" >&2; exit 2; }
export LINK SOFTFABRIC_PLUGIN_DIR=$IBEXT_DIR NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET
# RoCE: the plugin sends its clear-to-send writes with NCCL_IB_FIFO_TC, whose default is
# 0 there (NCCL's own transport's is -1: NCCL_IB_TC's class), outside the fabric's
# lossless class (106, gpu-stall.sh): an HPC-X user on RoCE sets it as here.
[ "$LINK" = roce ] && export NCCL_IB_FIFO_TC=${NCCL_IB_FIFO_TC:-106}
mkdir -p "$LOG"
fail=0
# the channels' transport, from NCCL's INIT lines
via() { cat "$1"/*/console.txt 2>/dev/null | grep -c "via NET/IBext"; }
[ "${R2CC_RUNS:-1}" = 0 ] && COLLS=
for c in $COLLS; do
	runs=
	for f in $FAULTS; do runs="$runs 2x1:25:2:$f"; done
	# shellcheck disable=SC2086 # runs is a word list
	COLL=$c BYTES="-b 16M -e 512M" ITERS="-n 8 -w 2" FAULT_AT_ROW=2 TIMEOUT_S=90 STACKS=0 \
		timeout 450 scripts/gpu/gpu-stall.sh "$LOG/$c" $runs || fail=1
	echo "ibext=$(via "$LOG/$c") $c" >>"$LOG/$c/summary.txt"
done
# Plain NCCL through the same faults: no repair, so the job must end in an error (or
# hang until its timeout, which counts as dying too: nothing is repaired).
for c in ${PLAIN_COLLS:-all_reduce}; do
	for f in $FAULTS; do
		R2CC_LIB=none COLL=$c BYTES="-b 16M -e 512M" ITERS="-n 8 -w 2" FAULT_AT_ROW=2 \
			TIMEOUT_S=60 STACKS=0 timeout 120 scripts/gpu/gpu-stall.sh "$LOG/plain" "2x1:25:2:$f"
	done
done
echo "ibext=$(via "$LOG/plain") plain" >>"$LOG/plain/summary.txt"
sed -i 's/^/plain /' "$LOG/plain/summary.txt"
cat "$LOG"/*/summary.txt
exit $fail
