#!/usr/bin/env bash
# r2cc exporter (tools/exporter.c); every output is parsed by prometheus_client's
# text-format parser and checked for what the parser leaves to the server
# (tests/exporter/check.py).
#  * live: a server on a loopback port while a drill job (r2cc-verbs-drill under
#    the preload, R2CC_DRILL cutting node1's mlx5_1 1 s in) comes, repairs and
#    goes: both workers with 3 NICs and traffic, the repair counted drill="1"
#    with its histogram, the cut NIC failed and drilled; the same read as an
#    unprivileged user; once the job is gone, none of its series;
#  * fake pages (tests/exporter/fakepage.c): stale, garbage, truncated, another
#    version, bad magic, a FIFO, a symbolic link, one the reader may not read,
#    duplicate NIC names, strings that need escaping, a histogram copied while
#    being written: skipped or exported as they should be, one stderr line per
#    bad page, said once;
#  * HTTP: /, 404, 405, HEAD; a port in use: one line naming it, exit 2;
#  * --textfile: replaced whole, no temporary file left; a bad DIR: exit 2.
#   tests/exporter/run.sh BUILD
set -u
B=${1:-build}
HERE=$(cd "$(dirname "$0")" && pwd)
FAKE=$B/tests/exporter/fakepage
fail() { echo "FAIL: $*"; exit 1; }
PY=
for p in /usr/bin/python3 python3; do
	"$p" -c 'import prometheus_client' 2>/dev/null && { PY=$p; break; }
done
[ -n "$PY" ] || fail "no python3 with prometheus_client (python3-prometheus-client; scripts/deps.sh installs it)"
check() { "$PY" "$HERE/check.py" "$@"; }
tmp=$(mktemp -d)
chmod 755 "$tmp"
# A copy of the tool that an unprivileged user can run wherever the build is.
cp "$B/bin/r2cc" "$tmp/r2cc"
R2CC=$tmp/r2cc
bg=()
fakes=()
cleanup() {
	for p in "${bg[@]+"${bg[@]}"}"; do kill "$p" 2>/dev/null; done
	for f in "${fakes[@]+"${fakes[@]}"}"; do rm -f "/dev/shm/$f"; done
	rm -rf "$tmp"
}
trap cleanup EXIT
AS_USER=()
if [ "$(id -u)" -eq 0 ] && id nobody >/dev/null 2>&1; then
	AS_USER=(setpriv --reuid="$(id -u nobody)" --regid="$(id -g nobody)" --clear-groups)
fi

# start_server LOG [PREFIX...]: an exporter on a free loopback port; sets srv, url, addr.
start_server() {
	local log=$1
	shift
	"$@" "$R2CC" exporter --listen 127.0.0.1:0 2>"$log" &
	srv=$!
	bg+=("$srv")
	for _ in $(seq 50); do
		grep -q 'serving http' "$log" && break
		sleep 0.1
	done
	url=$(sed -n 's|^r2cc exporter: serving \(http://[^ ]*\)$|\1|p' "$log")
	[ -n "$url" ] || fail "the exporter did not start: $(cat "$log")"
	addr=${url#http://}
	addr=${addr%/metrics}
}
# scrape FILE: GET /metrics into FILE (status line checked), parsed.
scrape() {
	check get "$url" >"$1.http" || fail "GET $url failed"
	head -1 "$1.http" | grep -qx '200 text/plain; version=0.0.4; charset=utf-8' ||
		fail "GET /metrics: $(head -1 "$1.http")"
	tail -n +2 "$1.http" >"$1"
	check parse "$1" >/dev/null || fail "$1 does not parse"
}
val() { check sum "$@" | cut -d' ' -f1; }
num() { check sum "$@" | cut -d' ' -f2; }

# --- live: a drill job comes, repairs and goes ---------------------------------
start_server "$tmp/srv.log"
scrape "$tmp/m0"
"$B"/bin/r2cc-verbs-drill --fault none --drill-plan 'node1/mlx5_1=blackhole@1s' --nccl-stub \
	--seeds 1 --messages 20000 --timeout 60 >"$tmp/drill" 2>&1 &
drill=$!
bg+=("$drill")
# Other R2CC processes of the host publish pages too: only this job's two workers count.
ours() { pgrep -P "$drill" | paste -sd'|'; }
pids=
for _ in $(seq 150); do
	pids=$(ours)
	if [ -n "$pids" ]; then
		scrape "$tmp/m1"
		[ "$(num "$tmp/m1" __name__=r2cc_nic_up pid="$pids")" = 6 ] &&
			[ "$(val "$tmp/m1" __name__=r2cc_repairs_total pid="$pids" drill=1)" != 0 ] && break
	fi
	sleep 0.2
done
[ -n "$pids" ] || fail "the drill's workers never ran: $(tail -3 "$tmp/drill")"
kill -0 "$drill" 2>/dev/null || fail "the drill ended before it was seen: $(tail -3 "$tmp/drill")"
[ "$(num "$tmp/m1" __name__=r2cc_nic_up pid="$pids")" = 6 ] || fail "expected 2 processes x 3 NICs"
[ "$(val "$tmp/m1" __name__=r2cc_repairs_total pid="$pids" drill=1)" != 0 ] ||
	fail "no drill repair counted: $(check series "$tmp/m1" __name__=r2cc_repairs_total pid="$pids")"
[ "$(check series "$tmp/m1" __name__=r2cc_nic_tx_bytes_total pid="$pids" | grep -vc '"value": 0.0}')" = 6 ] ||
	fail "not every NIC counted traffic"
rep=$(val "$tmp/m1" __name__=r2cc_repairs_total pid="$pids" drill=1)
cnt=$(val "$tmp/m1" __name__=r2cc_repair_duration_seconds_count pid="$pids" drill=1)
inf=$(val "$tmp/m1" __name__=r2cc_repair_duration_seconds_bucket pid="$pids" drill=1 le=\\+Inf)
[ "$rep" = "$cnt" ] && [ "$rep" = "$inf" ] || fail "repairs $rep, histogram count $cnt, +Inf $inf"
n1="pid=$pids node=node1 nic=mlx5_1"
[ "$(val "$tmp/m1" __name__=r2cc_nic_drilled $n1)" = 1 ] || fail "node1's mlx5_1 not drilled"
[ "$(val "$tmp/m1" __name__=r2cc_nic_state $n1 state=failed)" = 1 ] &&
	[ "$(val "$tmp/m1" __name__=r2cc_nic_up $n1)" = 0 ] || fail "node1's mlx5_1 not failed"
[ "$(val "$tmp/m1" __name__=r2cc_nic_state pid="$pids")" = 6 ] || fail "r2cc_nic_state not one-hot"
[ "$(val "$tmp/m1" __name__=r2cc_drill_steps_applied pid="$pids")" = 2 ] ||
	fail "the drill's step not applied in both processes"
[ "$(num "$tmp/m1" __name__=r2cc_drill_steps pid="$pids" plan='node1/mlx5_1=blackhole@1s')" = 2 ] ||
	fail "r2cc_drill_steps has not the plan"
[ "$(val "$tmp/m1" __name__=r2cc_protected pid="$pids")" = 2 ] || fail "not protected"
if [ ${#AS_USER[@]} -gt 0 ]; then
	"${AS_USER[@]}" "$R2CC" exporter --once >"$tmp/m1.nobody" 2>"$tmp/m1.nobody.err" ||
		fail "as nobody: $(cat "$tmp/m1.nobody.err")"
	check parse "$tmp/m1.nobody" >/dev/null || fail "as nobody: does not parse"
	[ "$(num "$tmp/m1.nobody" __name__=r2cc_nic_up pid="$pids")" = 6 ] ||
		fail "as nobody: the job's pages (mode $(stat -c %a /dev/shm/r2cc-stats.${pids%%|*})) not read"
fi
kill "$drill" 2>/dev/null
wait "$drill" 2>/dev/null
for p in ${pids//|/ }; do
	for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
	fakes+=("r2cc-stats.$p") # left behind if a worker was killed
done
scrape "$tmp/m2"
[ "$(num "$tmp/m2" pid="$pids")" = 0 ] || fail "series of the ended job are still served"
echo "live: 2 processes x 3 NICs, $rep drill repair(s) with their histogram, node1/mlx5_1 failed and drilled; gone after the job"

# --- fake pages -------------------------------------------------------------------
sleep 300 &
s1=$!
sleep 300 &
s2=$!
sleep 300 &
s3=$!
sleep 300 &
s4=$!
sleep 300 &
s5=$!
sleep 300 &
s6=$!
sleep 300 &
s7=$!
bg+=("$s1" "$s2" "$s3" "$s4" "$s5" "$s6" "$s7")
# Above pid_max no process can be; $$ keeps it apart from other tests' (top's uses 999999).
dead=$(($(cat /proc/sys/kernel/pid_max) + $$))
fake() { fakes+=("r2cc-stats.$1"); "$FAKE" "/dev/shm/r2cc-stats.$@" || fail "fakepage $*"; }
fake "$dead" "$dead" --nic mlx5_0 # stale: its process is gone
fakes+=("r2cc-stats.garbage$$")
head -c 5000 /dev/urandom >"/dev/shm/r2cc-stats.garbage$$"
fake "$s1" "$s1" --nic mlx5_0 --truncate 4000
fake "$s2" "$s2" --nic mlx5_0 --version 3
fake "$s3" "$s3" --nic mlx5_0 --magic 0x1234
fakes+=("r2cc-stats.$s4" "r2cc-stats.$s5")
ln -s /etc/hostname "/dev/shm/r2cc-stats.$s5"
host=$'h"o\\st\nx\xff'
why=$'network "X" \\ not\nrepaired'
fake "$s6" "$s6" --host "$host" --node 'n"1' --nic mlx5_0 --nic mlx5_1 --nic mlx5_2 --dup-nic \
	--why "$why" --plan 'node1/mlx5_0=down@1s;node1/mlx5_0=up@5s' --repairs 3
# One its reader may not open: root's 0600 page read by nobody, or the user's own mode 000.
fake "$s7" "$s7" --nic mlx5_0 --host unreadable
chmod 600 "/dev/shm/r2cc-stats.$s7"
[ ${#AS_USER[@]} -gt 0 ] || chmod 000 "/dev/shm/r2cc-stats.$s7"

# A FIFO: opening it to read blocks until a writer comes (an r2cc older than
# tools/pages.c hangs there), so it stays only for this one run.
mkfifo "/dev/shm/r2cc-stats.$s4"
"$R2CC" exporter --once >"$tmp/f1" 2>"$tmp/f1.err"
rc=$?
rm -f "/dev/shm/r2cc-stats.$s4"
[ $rc -eq 0 ] || fail "exporter --once failed: $(cat "$tmp/f1.err")"
check parse "$tmp/f1" >/dev/null || fail "output with fake pages does not parse"
for p in "$dead" "$s1" "$s2" "$s3" "$s4" "$s5"; do
	[ "$(num "$tmp/f1" pid="$p")" = 0 ] || fail "the fake page of $p is exported"
done
[ "$(num "$tmp/f1" __name__=r2cc_nic_up pid="$s6")" = 2 ] || fail "duplicate NIC names exported twice"
# Labels come back exactly, bytes outside ASCII as '?'.
check series "$tmp/f1" __name__=r2cc_protected pid="$s6" | "$PY" -c '
import json, sys
d = json.loads(sys.stdin.readline())["labels"]
sys.exit(0 if (d["host"], d["node"], d["why"]) == (sys.argv[1][:-1] + "?", "n\"1", sys.argv[2]) else 1)
' "$host" "$why" || fail "labels not escaped: $(check series "$tmp/f1" __name__=r2cc_protected pid="$s6")"
[ "$(num "$tmp/f1" __name__=r2cc_drill_steps pid="$s6" plan='node1/mlx5_0=down@1s;node1/mlx5_0=up@5s')" = 1 ] ||
	fail "the drill plan label"
b=$(check series "$tmp/f1" __name__=r2cc_repair_duration_seconds_bucket pid="$s6" drill=0 |
	"$PY" -c 'import json,sys; print(" ".join("%g" % json.loads(l)["value"] for l in sys.stdin))')
[ "$b" = "1 1 1 1 1 2 2 2 2 2 2 3 3" ] || fail "histogram buckets $b"
[ "$(val "$tmp/f1" __name__=r2cc_repair_duration_seconds_sum pid="$s6" drill=0)" = 3.031 ] || fail "histogram sum"
[ "$(val "$tmp/f1" __name__=r2cc_failbacks_total pid="$s6" drill=0)" = 2 ] || fail "failbacks"
[ "$(val "$tmp/f1" __name__=r2cc_repairs_total pid="$s6" drill=1)" = 4 ] || fail "drill repairs"
for f in "garbage$$" "$s1" "$s2" "$s3" "$s4" "$s5"; do
	[ "$(grep -c "r2cc-stats.$f " "$tmp/f1.err")" = 1 ] || fail "not one line for r2cc-stats.$f: $(cat "$tmp/f1.err")"
done
grep -q "r2cc-stats.$dead " "$tmp/f1.err" && fail "a stale page is not an error"
grep -q "r2cc-stats.$s2 (bad): page version 3, this tool reads version" "$tmp/f1.err" || fail "version not said"
grep -q "r2cc-stats.$s4 (unreadable): not a regular file" "$tmp/f1.err" || fail "FIFO not said"
[ "$(val "$tmp/f1" __name__=r2cc_exporter_pages state=bad)" -ge 4 ] || fail "bad pages not counted"
# The unreadable page, served: said once over two scrapes, the server goes on.
start_server "$tmp/srv2.log" "${AS_USER[@]+"${AS_USER[@]}"}"
scrape "$tmp/f2"
scrape "$tmp/f3"
[ "$(num "$tmp/f3" pid="$s7")" = 0 ] || fail "the unreadable page is exported"
[ "$(val "$tmp/f3" __name__=r2cc_exporter_pages state=unreadable)" -ge 2 ] || fail "unreadable pages not counted"
[ "$(grep -c "r2cc-stats.$s7 (unreadable): Permission denied" "$tmp/srv2.log")" = 1 ] ||
	fail "unreadable page not said once: $(cat "$tmp/srv2.log")"
[ "$(grep -c "r2cc-stats.garbage$$ " "$tmp/srv2.log")" = 1 ] || fail "garbage said more than once"
echo "fake pages: stale, garbage, truncated, version 3, bad magic, FIFO, symlink, unreadable skipped and said once; escaping, duplicates, histogram right"

# --- HTTP ---------------------------------------------------------------------------
r=$(check get "${url%/metrics}/")
echo "$r" | head -1 | grep -q '^200 text/html' && echo "$r" | grep -q 'href="/metrics"' || fail "/: $r"
r=$(check get "${url%/metrics}/nope")
[ "${r%% *}" = 404 ] || fail "/nope: $r"
r=$(check get "$url" POST)
[ "${r%% *}" = 405 ] || fail "POST: $r"
r=$(check get "$url" HEAD)
[ "$(echo "$r" | head -1 | cut -d' ' -f1)" = 200 ] && [ "$(echo "$r" | wc -l)" = 1 ] || fail "HEAD: $r"
"$R2CC" exporter --listen "$addr" >"$tmp/inuse.out" 2>"$tmp/inuse.err"
rc=$?
[ $rc -eq 2 ] || fail "a port in use gave exit $rc"
[ "$(wc -l <"$tmp/inuse.err")" = 1 ] && grep -q "cannot listen on $addr: Address already in use" "$tmp/inuse.err" ||
	fail "a port in use: $(cat "$tmp/inuse.err")"
scrape "$tmp/f4" # the first server still serves
"$R2CC" exporter >/dev/null 2>&1
[ $? -eq 2 ] || fail "no mode given: not exit 2"
echo "http: /, 404, 405, HEAD; port in use: '$(cat "$tmp/inuse.err")', exit 2"

# --- textfile -----------------------------------------------------------------------
mkdir "$tmp/tf"
"$R2CC" exporter --textfile "$tmp/tf" --interval 0.1 2>"$tmp/tf.log" &
tf=$!
bg+=("$tf")
# Five writes in turn, each waited for (up to 10 s: a sanitizer's build on a loaded
# machine starts and writes slowly; every 0.1 s is what is asked for, not what is timed).
prev=
for i in 1 2 3 4 5; do
	for _ in $(seq 100); do
		m=$(stat -c %y "$tmp/tf/r2cc.prom" 2>/dev/null)
		[ -n "$m" ] && [ "$m" != "$prev" ] && break
		sleep 0.1
	done
	[ -n "$m" ] || fail "no $tmp/tf/r2cc.prom after 10 s: $(cat "$tmp/tf.log")"
	[ "$m" != "$prev" ] || fail "the textfile was not rewritten in 10 s (write $i)"
	cp "$tmp/tf/r2cc.prom" "$tmp/tf.$i" || fail "$tmp/tf/r2cc.prom went away"
	check parse "$tmp/tf.$i" >/dev/null || fail "textfile $i does not parse"
	prev=$m
done
kill "$tf"
wait "$tf"
[ "$(ls -A "$tmp/tf")" = r2cc.prom ] || fail "left in the textfile directory: $(ls -A "$tmp/tf")"
"$R2CC" exporter --textfile "$tmp/none" --once 2>"$tmp/tf.err"
rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$tmp/tf.err")" = 1 ] || fail "a missing DIR: exit $rc, $(cat "$tmp/tf.err")"
echo "textfile: replaced whole 5 times out of 5, nothing left behind; a missing DIR: exit 2"
echo "PASS: r2cc exporter"
