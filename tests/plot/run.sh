#!/usr/bin/env bash
# Runs scripts/plot.py on three committed logs and on synthetic ones written here (nccl-tests
# output as in seed 000's test 03, seed 000's hot-repair table with its annotations, an
# --iters-table run with a failover and a wrong iteration, a sweep with a #wrong row, logs
# with nothing to plot) and checks the PNGs (signature, size, read back by matplotlib),
# the numbers of the printed table, the wrong results it reports and its exit statuses.
set -u
cd "$(dirname "$0")/../.."
PLOT=scripts/plot.py
tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
rc=0
fail() { echo "FAIL: $*"; rc=1; }

# The PNG checks need matplotlib too; plot.py falls back to the system python3 the same way.
PY=
for p in python3 /usr/bin/python3; do
	if command -v "$p" >/dev/null && "$p" -c 'import matplotlib' 2>/dev/null; then PY=$p; break; fi
done
if [ -z "$PY" ]; then
	echo "FAIL: matplotlib is not installed (Debian/Ubuntu: apt-get install python3-matplotlib;" \
		"scripts/deps.sh installs it)"
	exit 1
fi

# check_png FILE...: to be checked at the end, in one python: PNG signature, the IHDR of a
# real chart, not a blank image, read back by matplotlib.
pngs=()
check_png() { pngs+=("$@"); }
check_pngs() {
	"$PY" - "${pngs[@]}" <<'EOF' || rc=1
import struct, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.image as mpimg
for path in sys.argv[1:]:
    try:
        data = open(path, "rb").read()
    except OSError as e:
        print("FAIL: %s: %s" % (path, e)); sys.exit(1)
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        print("FAIL: %s is not a PNG" % path); sys.exit(1)
    w, h = struct.unpack(">II", data[16:24])
    img = mpimg.imread(path)
    colours = len({tuple(px) for px in img[::7, ::7].reshape(-1, img.shape[-1]).tolist()})
    if w < 400 or h < 300 or len(data) < 15000 or img.shape[:2] != (h, w) or colours < 20:
        print("FAIL: %s: %dx%d, %d bytes, %d colours: not a chart"
              % (path, w, h, len(data), colours))
        sys.exit(1)
    print("ok: %s %dx%d %d bytes" % (path, w, h, len(data)))
EOF
}

# expect FILE TEXT: FILE has a line containing TEXT exactly (spacing in table rows squeezed).
expect() {
	if ! tr -s ' ' <"$1" | grep -qF -- "$(echo "$2" | tr -s ' ')"; then
		fail "$(basename "$1") lacks: $2"
	fi
}

# --- 1: committed r2cc-perf logs: two sweeps, the shaped run's NIC table ---
out=$tmp/committed
$PLOT -o "$out" tests/plot/data/allreduce-float-sum-2x1.log tests/plot/data/ar2-float-sum-4x1.log \
	tests/plot/data/shaped-3x25-allreduce-1G.log >"$tmp/1.out" 2>"$tmp/1.err" ||
	fail "committed logs: exit $? ($(cat "$tmp/1.err"))"
check_png "$out/busbw.png" "$out/iters-shaped-3x25-allreduce-1G.png"
expect "$tmp/1.out" "bytes | allreduce-float-sum-2x1 | ar2-float-sum-4x1 | shaped-3x25-allreduce-1G"
expect "$tmp/1.out" "1073741824 | 15.79/22.92 (wrong 0/0) | 7.48/7.22 (wrong 0/0) | 9.38/9.37 (wrong 0/0)"
expect "$tmp/1.out" "4294967296 | - | 7.10/6.99 (wrong 0/0) | -"
expect "$tmp/1.out" "8 | 0.00/0.00 (wrong 0/0) | - | -"
expect "$tmp/1.out" "iterations shaped-3x25-allreduce-1G: 5 iterations"
expect "$tmp/1.out" "no wrong results"
[ "$(grep -cE '^[0-9]+ +\|' "$tmp/1.out")" -eq 29 ] ||
	fail "committed logs: the table should have 29 sizes"

# --- 2: nccl-tests output, healthy vs Balance vs R2CC-AllReduce (seed 000, test 03) ---
ncclt() { # ncclt FILE: three rows "bytes oop ip" from stdin in nccl-tests' format
	{
		echo "# Collective test starting: all_reduce_perf"
		echo "# nThread 1 nGpus 1 minBytes 268435456 maxBytes 4294967296 step: 4(factor) warmup iters: 2 iters: 5 agg iters: 1 validation: 1 graph: 0"
		echo "#"
		echo "# Using devices"
		echo "#  Rank  0 Group  0 Pid  41233 on     node-1 device  0 [0x41] Tesla V100S-PCIE-32GB"
		echo "#  Rank  1 Group  0 Pid  41234 on     node-1 device  1 [0xa1] Tesla V100S-PCIE-32GB"
		echo "node-1:41233:41233 [0] NCCL INFO NCCL_IB_HCA set to mlx5_0,mlx5_2,mlx5_3"
		echo "#"
		echo "#                                                              out-of-place                       in-place"
		echo "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong"
		echo "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"
		while read -r b o i; do
			printf '%12d  %12d     float     sum      -1  %7d  %6.2f  %6.2f      0  %7d  %6.2f  %6.2f      0\n' \
				"$b" $((b / 4)) 100000 "$(echo "$o / 1.5" | bc -l)" "$o" \
				100000 "$(echo "$i / 1.5" | bc -l)" "$i"
		done
		echo "# Out of bounds values : 0 OK"
		echo "# Avg bus bandwidth    : 5.12"
		echo "#"
		echo "# Collective test concluded: all_reduce_perf"
	} >"$1"
}
printf '268435456 4.93 7.67\n1073741824 7.74 7.67\n4294967296 7.68 7.69\n' | ncclt "$tmp/healthy.log"
printf '268435456 5.04 4.55\n1073741824 4.83 4.99\n4294967296 5.18 5.18\n' | ncclt "$tmp/balance.log"
printf '268435456 3.51 4.56\n1073741824 3.96 4.47\n4294967296 4.25 4.38\n' | ncclt "$tmp/r2cc.log"
out=$tmp/compare
$PLOT -o "$out" --title "seed 000 test 03" --label baseline_healthy="$tmp/healthy.log" \
	--label balance_unhealthy="$tmp/balance.log" --label r2cc_allreduce_unhealthy="$tmp/r2cc.log" \
	>"$tmp/2.out" 2>"$tmp/2.err" || fail "nccl-tests logs: exit $? ($(cat "$tmp/2.err"))"
check_png "$out/busbw.png"
expect "$tmp/2.out" "===== comparison (busbw GB/s by size) ====="
expect "$tmp/2.out" "bytes | baseline_healthy | balance_unhealthy | r2cc_allreduce_unhealthy"
expect "$tmp/2.out" "268435456 | 4.93/7.67 (wrong 0/0) | 5.04/4.55 (wrong 0/0) | 3.51/4.56 (wrong 0/0)"
expect "$tmp/2.out" "1073741824 | 7.74/7.67 (wrong 0/0) | 4.83/4.99 (wrong 0/0) | 3.96/4.47 (wrong 0/0)"
expect "$tmp/2.out" "4294967296 | 7.68/7.69 (wrong 0/0) | 5.18/5.18 (wrong 0/0) | 4.25/4.38 (wrong 0/0)"
expect "$tmp/2.out" "sweep baseline_healthy: AllReduce float sum, 3 sizes"

# --- 3: wrong results: a #wrong row, an aborted size, a wrong iteration; seed 000's table ---
cat >"$tmp/wrong.log" <<'EOF'
# r2cc-perf AllGather: NCCL library 2.28.3 (/usr/lib/x86_64-linux-gnu/libnccl.so.2.28.3), headers 22809; 2 ranks
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
       65536          8192     float    none      -1    60.10    1.09    0.55      0    59.80    1.10    0.55      0
      262144         32768     float    none      -1    90.20    2.91    1.45      3    88.00    2.98    1.49      0
     1048576        131072     float    none      -1   200.00    5.24    2.62      0   201.00    5.22    2.61    N/A
rank 1: allgather float size 262144 B out-of-place: 3 of 65536 elements wrong; first at element 7: got 1, expected 2
# Out of bounds values : 1 FAILED
    4194304        524288     float    none      -1
EOF
cat >"$tmp/hotrepair.log" <<'EOF'
[Rank 0] Arming NIC disconnect at program start (delay 4000 ms) using: ./nic/disconnect_nic1.sh
[Rank 0] Iter 5/10 START: allreduce 4.00 GiB
[Rank 0] Iter 5/10 END: OK (elapsed 843 ms)
[Rank 0] Iter 6/10 START: allreduce 4.00 GiB
[Rank 0] NIC disconnect command completed.
[Rank 0] Iter 6/10 END: OK (elapsed 1313 ms)
[Rank 0] Iter 7/10 START: allreduce 4.00 GiB
[Rank 0] Iter 7/10 END: WRONG RESULT, 12 wrong elements (elapsed 1136 ms)
[Rank 0] IB RX per-iteration (MB, port_rcv_data *4B):
Iter Time(ms) mlx5_0_RX mlx5_2_RX mlx5_3_RX
1 885 2165 2136 2166 <- healthy: ~6.4 GB received per iteration (2(n-1)/n x 4 GiB),
2 816 2165 2239 2293 split ~1/3 per NIC because all three are declared equal
3 842 2165 2319 2361
4 841 2165 2338 2355
5 843 2165 2348 2337
6 1313 3203 1251 2279 <- failure: mlx5_2 stops after 1251 MB; the rest of its share
                        is migrated to the backup connection on mlx5_0
7 1136 3249 0 3174 <- R2CC-Balance: mlx5_2 unused, the same 6.4 GB now split
8 1161 3249 0 3178 over the two healthy NICs (~3.2 GB each)
9 1128 3249 0 3149
10 1130 3249 0 3180
[Rank 0] TEST FAIL: 1 of 10 iterations had wrong results.
EOF
out=$tmp/wrong
$PLOT -o "$out" "$tmp/wrong.log" "$tmp/hotrepair.log" >"$tmp/3.out" 2>"$tmp/3.err" ||
	fail "wrong logs: exit $? ($(cat "$tmp/3.err"))"
check_png "$out/busbw.png" "$out/iters-hotrepair.png"
expect "$tmp/3.out" "WRONG: wrong: 262144 bytes AllGather float: #wrong out-of-place 3, in-place 0"
expect "$tmp/3.out" "WRONG: wrong: the log says 'Out of bounds values: ... FAILED'"
expect "$tmp/3.out" "WRONG: hotrepair iteration 7: 12 wrong elements"
expect "$tmp/3.out" "262144 | 1.45/1.49 (wrong 3/0)"
expect "$tmp/3.out" "1048576 | 2.62/2.61 (wrong 0/N/A)"
expect "$tmp/3.out" "note: line 8 starts a result row that has no numbers"
expect "$tmp/3.out" "iterations hotrepair: 10 iterations, IB RX per-iteration (MB, port_rcv_data *4B), 816..1313 ms"
expect "$tmp/3.out" "iter 6: 1313 ms (MB: mlx5_0_RX 3203 mlx5_2_RX 1251 mlx5_3_RX 2279) -- slow"
expect "$tmp/3.out" "traffic moved between NICs; log: [Rank 0] NIC disconnect command completed."
grep -q "iter [1-5]:" "$tmp/3.out" && fail "a healthy iteration was flagged"
grep -q "iter 10:" "$tmp/3.out" && fail "iteration 10 was flagged"

# --- 4: r2cc-perf --iters-table with RX and TX columns, two tables (--nic-table-all) ---
{
	for i in 1 2 3 4; do
		echo "[Rank 0] Iter $i/4 START: allreduce 1.00 GiB"
		[ $i -eq 3 ] && echo "vm:1:1 R2CC WARN mlx5_2: port down, migrating 4 QPs to mlx5_0"
		ms=114; [ $i -eq 3 ] && ms=260; [ $i -eq 4 ] && ms=170
		echo "[Rank 0] Iter $i/4 END: OK (elapsed $ms ms)"
	done
	echo "[Rank 0] NIC bytes per iteration (MB = 1e6 B) of node node0, allreduce float sum root -1 size 1073741824 B out-of-place; source: softverbs_nic_stats"
	echo "Iter Time(ms) mlx5_0_RX mlx5_2_RX mlx5_3_RX mlx5_0_TX mlx5_2_TX mlx5_3_TX"
	echo "   1      114       358       358       358       358       358       358"
	echo "   2      114       358       358       358       358       358       358"
	echo "vm:2:2 R2CC INFO interleaved line from another rank"
	echo "   3      260       600       120       354       600       120       354"
	echo "   4      170       537         0       537       537         0       537"
	echo "[Rank 0] TEST PASS: All allreduces completed and verified."
	echo "[Rank 0] NIC bytes per iteration (MB = 1e6 B) of node node1, allreduce float sum root -1 size 8 B out-of-place; source: r2cc_nic_stats"
	echo "Iter Time(ms) mlx5_0_RX mlx5_0_TX"
	echo "   1        1         0         0"
} >"$tmp/iters.log"
out=$tmp/iters
$PLOT -o "$out" "$tmp/iters.log" >"$tmp/4.out" 2>"$tmp/4.err" ||
	fail "iters log: exit $? ($(cat "$tmp/4.err"))"
check_png "$out/iters-iters_1.png"
[ -e "$out/iters-iters_2.png" ] || fail "second NIC table not plotted"
[ -e "$out/busbw.png" ] && fail "busbw.png written for a log without sweeps"
expect "$tmp/4.out" "iterations iters #1: 4 iterations, node node0, allreduce float sum root -1 size 1073741824 B out-of-place, 114..260 ms, NICs mlx5_0 mlx5_2 mlx5_3"
expect "$tmp/4.out" "iter 3: 260 ms (MB: mlx5_0_RX 600 mlx5_2_RX 120 mlx5_3_RX 354 mlx5_0_TX 600 mlx5_2_TX 120 mlx5_3_TX 354) -- slow"
expect "$tmp/4.out" "log: vm:1:1 R2CC WARN mlx5_2: port down, migrating 4 QPs to mlx5_0"
expect "$tmp/4.out" "iter 4: 170 ms (MB: mlx5_0_RX 537 mlx5_2_RX 0"
grep -q "^=====" "$tmp/4.out" && fail "a busbw table was printed without sweeps"

# --- 5: nothing to plot, missing file, bad arguments: a message and a status, no traceback ---
grep -v '^ *[0-9]' tests/plot/data/shaped-3x25-allreduce-1G.log | grep -v '^Iter' >"$tmp/empty.log"
$PLOT -o "$tmp/none" "$tmp/empty.log" >"$tmp/5.out" 2>"$tmp/5.err"
st=$?
[ $st -eq 1 ] || fail "empty log: exit $st, want 1"
grep -q "empty.log: nothing to plot" "$tmp/5.err" || fail "empty log: no clear message"
$PLOT -o "$tmp/none" "$tmp/empty.log" tests/plot/data/fault-down.log >"$tmp/6.out" 2>"$tmp/6.err"
st=$?
[ $st -eq 1 ] || fail "empty logs: exit $st, want 1"
grep -q "fault-down.log: nothing to plot .*the run stopped before its first result" "$tmp/6.err" ||
	fail "aborted run: no clear message"
$PLOT -o "$tmp/mixed" "$tmp/empty.log" "$tmp/healthy.log" >"$tmp/7.out" 2>"$tmp/7.err"
st=$?
[ $st -eq 1 ] && [ -e "$tmp/mixed/busbw.png" ] || fail "mixed logs: exit $st (want 1) or no chart"
$PLOT -o "$tmp/none" "$tmp/no-such.log" >/dev/null 2>"$tmp/8.err"
st=$?
[ $st -eq 2 ] && grep -q "cannot read .*no-such.log" "$tmp/8.err" || fail "missing file: exit $st"
$PLOT --label "=x" >/dev/null 2>"$tmp/9.err"
st=$?
[ $st -eq 2 ] || fail "bad --label: exit $st"
$PLOT -o /proc/no/such "$tmp/healthy.log" >/dev/null 2>"$tmp/10.err"
st=$?
[ $st -eq 2 ] || fail "unwritable outdir: exit $st"
if grep -l Traceback "$tmp"/*.err; then fail "a traceback was printed"; fi
check_pngs

[ $rc -eq 0 ] && echo "plot.py: charts, tables, wrong results and errors as expected"
exit $rc
