#!/usr/bin/env bash
# Runs rdma-core's own programs over the software RDMA device twice, once plain and once
# under LD_PRELOAD=libr2cc.so, and fails on any difference in what they report: the exit
# status of server and client, the byte and iteration counts of ibv_*_pingpong's
# "N bytes in S seconds" / "N iters in S seconds" lines (not the rates), the #bytes and
# #iterations columns of perftest's result rows (not the bandwidth or latency), and the
# transcript of pyverbs_errno.py (every verbs call's result or errno). The preloaded
# processes run with R2CC_DEBUG=INFO and must log that R2CC opened the device: they went
# through R2CC's wrappers (libr2cc.so exports the ibv_* names, so programs linked
# against libibverbs bind to them). stderr is kept out of the comparison (R2CC's INFO
# lines, and its one NOT PROTECTED warning: these are not NCCL's QPs).
# A program that fails without the preload on this device (UC and UD QPs: the device is
# RC only) is skipped with the reason; one that must run (RC) fails the test instead.
#
#   tests/preload/rdma-core.sh BUILD_DIR
set -u
B=${1:-build}
export LD_LIBRARY_PATH=$PWD/$B/softverbs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
unset R2CC_DEBUG SOFTVERBS_LINK
. "$PWD/tests/softverbs/ports.sh"
port=$((20000 + $$ % 20000))
# R2CC_TEST_PRELOAD: a sanitizer's runtime, which must be the first library (README: Tests).
P=${R2CC_TEST_PRELOAD:+$R2CC_TEST_PRELOAD:}
plain=(env ${R2CC_TEST_PRELOAD:+LD_PRELOAD=$R2CC_TEST_PRELOAD})
wrapped=(env "LD_PRELOAD=$P$PWD/$B/lib/libr2cc.so" R2CC_DEBUG=INFO)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rc=0 seq=0 compared=0 skipped=0

# What a pingpong or perftest run reports, less its timings, from its stdout $1.
counts() {
	sed -nE 's/^([0-9]+) bytes in .*/\1 bytes/p; s/^([0-9]+) iters in .*/\1 iters/p' "$1"
	awk '/#bytes/ {row = 1; next} row && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ {
		print "row", $1, $2}' "$1"
}

# once MODE LINK PROG ARGS...: one server/client pair on a fresh fabric; leaves in
# $tmp/MODE.sum the exit statuses and counts, in $tmp/MODE.{srv,cli}{,.err} the output.
once() {
	local mode=$1 link=$2 prog=$3 srv try st=0 ct=0 ref
	shift 3
	[ "$mode" = plain ] && ref=plain || ref=wrapped
	local -n pre=$ref
	seq=$((seq + 1))
	export SOFTVERBS_FABRIC=r2cc-rdmacore-$$-$seq
	for try in 1 2 3 4 5; do
		port=$(free_port $((port + 1)))
		SOFTVERBS_LINK=$link SOFTVERBS_NODE=server "${pre[@]}" timeout 60 $prog -p $port "$@" \
			>"$tmp/$mode.srv" 2>"$tmp/$mode.srv.err" &
		srv=$!
		listening $port $srv && break
		wait $srv
	done
	SOFTVERBS_LINK=$link SOFTVERBS_NODE=client "${pre[@]}" timeout 60 $prog -p $port "$@" localhost \
		>"$tmp/$mode.cli" 2>"$tmp/$mode.cli.err" || ct=$?
	wait $srv || st=$?
	"$B/bin/softverbs-ctl" reset >/dev/null 2>&1
	{
		echo "server exit $st"
		counts "$tmp/$mode.srv" | sed 's/^/server /'
		echo "client exit $ct"
		counts "$tmp/$mode.cli" | sed 's/^/client /'
	} >"$tmp/$mode.sum"
	[ $st -eq 0 ] && [ $ct -eq 0 ]
}

# compare NAME must|may LINK PROG ARGS...
compare() {
	local name=$1 need=$2 link=$3 dev
	shift 3
	if ! once plain "$link" "$@"; then
		if [ "$need" = may ]; then
			echo "skip $name: fails without the preload on this device:" \
				"$(cd "$tmp" && grep -hiE "couldn|unable|fail|error" plain.srv.err plain.cli.err \
					plain.srv plain.cli | head -1)"
			skipped=$((skipped + 1))
			return
		fi
		echo "FAIL $name: fails without the preload"
		sed 's/^/    /' "$tmp/plain.sum" "$tmp/plain.srv.err" "$tmp/plain.cli.err"
		rc=1
		return
	fi
	if ! grep -q ' bytes\| row ' "$tmp/plain.sum"; then
		echo "FAIL $name: no counts in its output"; sed 's/^/    /' "$tmp/plain.cli"; rc=1
		return
	fi
	once wrapped "$link" "$@"
	compared=$((compared + 1))
	if ! diff -u "$tmp/plain.sum" "$tmp/wrapped.sum" >"$tmp/diff"; then
		echo "FAIL $name: differs under the preload (without / with):"
		sed 's/^/    /' "$tmp/diff" "$tmp/wrapped.srv.err" "$tmp/wrapped.cli.err"
		rc=1
		return
	fi
	dev=$(printf '%s\n' "$@" | grep -A1 -x -- -d | tail -n1)
	for side in srv cli; do
		if ! grep -q "R2CC INFO $dev: opened" "$tmp/wrapped.$side.err"; then
			echo "FAIL $name: the preloaded $side never opened $dev through R2CC"
			sed 's/^/    /' "$tmp/wrapped.$side.err"
			rc=1
			return
		fi
	done
	echo "same $name: $(grep -v exit "$tmp/plain.sum" | sed 's/^\(server\|client\) //' | sort -u |
		paste -sd, -)"
}

compare "ibv_rc_pingpong -c" must ib ibv_rc_pingpong -d mlx5_0 -n 500 -s 4096 -c
compare "ibv_rc_pingpong -c -e" must ib ibv_rc_pingpong -e -d mlx5_1 -n 200 -s 4096 -c
compare "ibv_srq_pingpong" must ib ibv_srq_pingpong -d mlx5_0 -n 300 -s 4096
compare "ibv_srq_pingpong -e" must ib ibv_srq_pingpong -e -d mlx5_2 -n 200 -s 4096
compare "ibv_uc_pingpong" may ib ibv_uc_pingpong -d mlx5_0 -n 200 -s 4096
compare "ibv_ud_pingpong" may ib ibv_ud_pingpong -d mlx5_0 -n 200 -s 1024
compare "ibv_rc_pingpong -c RoCE -g 3" must roce ibv_rc_pingpong -d mlx5_1 -g 3 -n 200 -s 4096 -c
for t in ib_write_bw ib_read_bw ib_send_bw; do
	compare "$t" must ib $t -d mlx5_0 -s 65536 -n 200 -F
done
for t in ib_write_lat ib_read_lat ib_send_lat; do
	compare "$t" must ib $t -d mlx5_1 -s 64 -n 200 -F
done
compare ib_atomic_bw may ib ib_atomic_bw -d mlx5_0 -n 200 -F

# pyverbs_errno.py: one process, one device, its transcript compared line for line.
pyverbs() { # MODE
	local -n pre=$1
	SOFTVERBS_FABRIC=r2cc-pyverbs-$$-$1 SOFTVERBS_NODE=node0 "${pre[@]}" timeout 60 \
		/usr/bin/python3 tests/preload/pyverbs_errno.py --dev mlx5_0 --min-failures 20 \
		>"$tmp/$1.py" 2>"$tmp/$1.py.err"
	local st=$?
	"$B/bin/softverbs-ctl" --fabric r2cc-pyverbs-$$-$1 reset >/dev/null 2>&1
	echo "exit $st" >>"$tmp/$1.py"
	return $st
}
if ! pyverbs plain; then
	echo "FAIL pyverbs_errno.py without the preload"; sed 's/^/    /' "$tmp/plain.py" "$tmp/plain.py.err"
	rc=1
else
	pyverbs wrapped
	if ! diff -u "$tmp/plain.py" "$tmp/wrapped.py" >"$tmp/diff"; then
		echo "FAIL pyverbs_errno.py: differs under the preload (without / with):"
		sed 's/^/    /' "$tmp/diff" "$tmp/wrapped.py.err"
		rc=1
	elif ! grep -q "R2CC INFO mlx5_0: opened" "$tmp/wrapped.py.err"; then
		echo "FAIL pyverbs_errno.py: the preloaded run never opened mlx5_0 through R2CC"
		sed 's/^/    /' "$tmp/wrapped.py.err"
		rc=1
	else
		compared=$((compared + 1))
		echo "same pyverbs_errno.py: $(($(wc -l <"$tmp/plain.py") - 2)) steps," \
			"$(tail -n2 "$tmp/plain.py" | head -1)"
	fi
fi

[ $rc -eq 0 ] && echo "ok rdma-core programs: $compared compared, $skipped skipped"
exit $rc
