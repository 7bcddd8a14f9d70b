#!/usr/bin/env bash
# Runs rdma-core's own ibv_rc_pingpong and ibv_srq_pingpong (ibverbs-utils) over the
# software RDMA device, two processes on two emulated nodes: rc with the received data
# checked (-c), srq with its 16 QPs on one SRQ; each once busy-polling and once with
# completion channels (-e); and rc once more on a RoCE fabric through GID index 3 (RoCE v2,
# IPv4), as on a ConnectX port. Fails on any error.
#
#   tests/softverbs/pingpong.sh BUILD_DIR
set -u
build=${1:-build}
export LD_LIBRARY_PATH=$build/softverbs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export SOFTVERBS_FABRIC=svpp-$$
port=$((20000 + $$ % 20000))
. "$(dirname "$0")/ports.sh"
# R2CC_TEST_PRELOAD: a sanitizer's runtime, which must come before the (sanitized) device.
pre=(env ${R2CC_TEST_PRELOAD:+LD_PRELOAD=$R2CC_TEST_PRELOAD})
rc=0
run() { # PROGRAM NAME ARGS...
	local prog=$1 name=$2 out server try
	shift 2
	out=$(mktemp)
	for try in 1 2 3 4 5; do
		port=$(free_port $port)
		SOFTVERBS_NODE=server "${pre[@]}" timeout 30 $prog -p $port "$@" >"$out" 2>&1 &
		server=$!
		listening $port $server && break
		wait $server
		port=$((port + 1))
	done
	if ! SOFTVERBS_NODE=client "${pre[@]}" timeout 30 $prog -p $port "$@" localhost; then
		echo "FAIL pingpong $name (client)"; rc=1
	fi
	if ! wait $server; then
		echo "FAIL pingpong $name (server)"; cat "$out"; rc=1
	fi
	rm -f "$out"
	port=$((port + 1))
}
run ibv_rc_pingpong poll -d mlx5_0 -n 2000 -s 8192 -c
run ibv_rc_pingpong events -e -d mlx5_1 -n 300 -s 4096 -c
run ibv_srq_pingpong srq-poll -d mlx5_0 -n 1000 -s 4096
run ibv_srq_pingpong srq-events -e -d mlx5_2 -n 300 -s 4096
SOFTVERBS_LINK=roce run ibv_rc_pingpong roce -d mlx5_1 -g 3 -n 300 -s 4096 -c
"$build/bin/softverbs-ctl" reset >/dev/null
[ $rc -eq 0 ] && echo "ok pingpong"
exit $rc
