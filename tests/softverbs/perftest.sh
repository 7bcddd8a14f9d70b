#!/usr/bin/env bash
# Runs Debian's perftest between two emulated nodes (SOFTVERBS_NODE=node0, the
# server, and node1, the client, on one fabric; perftest's own exchange over
# loopback TCP) and fails unless every run completes with a result row:
#   ib_write_bw, ib_read_bw, ib_send_bw  -s 1048576 -n 5000 -F   RUNS times each
#   ib_write_lat, ib_read_lat, ib_send_lat  -s 2 ... 8192 -n 1000 -F
#   ib_send_lat -e (completion channels) at 8 bytes
# --table prints instead the bandwidth and latency by size for the README (one run
# per size, bandwidth -n 2000, latency -n 5000) as Markdown rows.
#
#   tests/softverbs/perftest.sh BUILD_DIR [RUNS]     (RUNS default 2)
#   tests/softverbs/perftest.sh BUILD_DIR --table
set -u
build=${1:-build}
mode=${2:-2}
export LD_LIBRARY_PATH=$PWD/$build/softverbs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# R2CC_TEST_PRELOAD: a sanitizer's runtime, which must be the first library of the
# (uninstrumented) rdma-core programs that load the sanitized device.
[ -n "${R2CC_TEST_PRELOAD:-}" ] && export LD_PRELOAD=$R2CC_TEST_PRELOAD${LD_PRELOAD:+:$LD_PRELOAD}
port=$((20000 + $$ % 20000))
. "$(dirname "$0")/ports.sh"
seq=0
rc=0
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

for t in ib_write_bw ib_read_bw ib_send_bw ib_write_lat ib_read_lat ib_send_lat; do
	command -v $t >/dev/null || { echo "FAIL perftest: $t not installed (scripts/deps.sh)"; exit 1; }
done

# Starts the server of PROG ARGS... on a free port (another test of this machine may
# hold the one tried: then the next); leaves its pid in $srv.
serve() {
	local try
	for try in 1 2 3 4 5; do
		port=$(free_port $((port + 1)))
		SOFTVERBS_NODE=node0 timeout 60 "$@" -p $port >"$out/srv" 2>&1 &
		srv=$!
		listening $port $srv && return 0
		kill $srv 2>/dev/null
		wait $srv 2>/dev/null
	done
	return 1
}

# run NAME PROG ARGS...: one server/client pair on a fresh fabric. The client's result
# row (the line that starts with the message size) is left in $out/row.
run() {
	local name=$1 prog=$2 srv cli=0 st=0
	shift 2
	seq=$((seq + 1))
	export SOFTVERBS_FABRIC=svperf-$$-$seq
	if ! serve "$prog" "$@"; then
		echo "FAIL perftest $name: the server never listened"
		sed 's/^/    /' "$out/srv"
		"$build/bin/softverbs-ctl" reset >/dev/null
		rc=1
		return 1
	fi
	SOFTVERBS_NODE=node1 timeout 60 "$prog" -p $port "$@" localhost >"$out/cli" 2>&1 || cli=$?
	wait $srv || st=$?
	"$build/bin/softverbs-ctl" reset >/dev/null
	grep -E '^ *[0-9]+ +[0-9]+ +[0-9.]+' "$out/cli" | head -1 >"$out/row"
	if [ $cli -ne 0 ] || [ $st -ne 0 ] || [ ! -s "$out/row" ]; then
		echo "FAIL perftest $name (client rc=$cli, server rc=$st)"
		grep -iE "couldn|fail|error|unable" "$out/cli" "$out/srv" | sed 's/^/    /'
		rc=1
		return 1
	fi
	return 0
}

if [ "$mode" = "--table" ]; then
	echo "| test | size | BW average (MB/s) | MsgRate (Mpps) |"
	echo "|---|---:|---:|---:|"
	for t in ib_write_bw ib_read_bw ib_send_bw; do
		for s in 2048 65536 1048576; do
			run "$t $s" $t -d mlx5_0 -s $s -n 2000 -F &&
				awk -v t=$t '{printf "| %s | %s | %s | %s |\n", t, $1, $4, $5}' "$out/row"
		done
	done
	echo
	echo "| test | size | t_min (us) | t_typical (us) | t_avg (us) | 99% (us) |"
	echo "|---|---:|---:|---:|---:|---:|"
	for t in ib_write_lat ib_read_lat ib_send_lat; do
		for s in 2 64 256 1024 2048 8192; do
			run "$t $s" $t -d mlx5_0 -s $s -n 5000 -F &&
				awk -v t=$t '{printf "| %s | %s | %s | %s | %s | %s |\n", t, $1, $3, $5, $6, $8}' "$out/row"
		done
	done
	run "ib_send_lat -e 8" ib_send_lat -d mlx5_0 -s 8 -n 5000 -F -e &&
		awk '{printf "| ib_send_lat -e | %s | %s | %s | %s | %s |\n", $1, $3, $5, $6, $8}' "$out/row"
	exit $rc
fi

for t in ib_write_bw ib_read_bw ib_send_bw; do
	for r in $(seq 1 "$mode"); do
		run "$t -s 1048576 -n 5000 (run $r)" $t -d mlx5_0 -s 1048576 -n 5000 -F || continue
		# The row: bytes, iterations, peak and average MB/s, message rate.
		read -r bytes iters _ avg _ <"$out/row"
		if [ "$bytes" != 1048576 ] || [ "$iters" != 5000 ] ||
			! awk -v a="$avg" 'BEGIN {exit !(a > 0)}'; then
			echo "FAIL perftest $t: result row '$(cat "$out/row")'"
			rc=1
		fi
	done
done
for t in ib_write_lat ib_read_lat ib_send_lat; do
	for s in 2 64 1024 2048 8192; do
		run "$t -s $s" $t -d mlx5_1 -s $s -n 1000 -F || continue
		read -r bytes iters _ <"$out/row"
		if [ "$bytes" != "$s" ] || [ "$iters" != 1000 ]; then
			echo "FAIL perftest $t -s $s: result row '$(cat "$out/row")'"
			rc=1
		fi
	done
done
run "ib_send_lat -e -s 8" ib_send_lat -d mlx5_2 -s 8 -n 1000 -F -e
[ $rc -eq 0 ] && echo "ok perftest ($seq runs)"
exit $rc
