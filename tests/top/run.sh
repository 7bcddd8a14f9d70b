#!/usr/bin/env bash
# r2cc top against live R2CC processes: two emulated nodes exchange traffic
# (r2cc-verbs-drill under the preload) while `r2cc top` samples them; every
# process's three NICs must show up with traffic, in the table and in the
# Prometheus output, protected; a job over a network R2CC does not repair
# must say "NOT PROTECTED" and why in both; a page left by a dead process must
# be recognised as stale, left out, and removed by --clean.
#   tests/top/run.sh BUILD
set -u
B=${1:-build}
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; [ -n "${drill:-}" ] && kill "$drill" 2>/dev/null; rm -f /dev/shm/r2cc-stats.${dead:-none}' EXIT
"$B"/bin/r2cc-verbs-drill --fault none --seeds 1 --messages 20000 --timeout 60 >"$tmp/drill" 2>&1 &
drill=$!
# Other R2CC processes of the host (another test, another user's job) publish pages
# too: only this drill's two workers count.
ours() { pgrep -P "$drill" | paste -sd'|'; }
for _ in $(seq 100); do
	pids=$(ours)
	"$B"/bin/r2cc top --prometheus >"$tmp/prom" 2>&1
	[ -n "$pids" ] && [ "$(grep -cE "^r2cc_nic_up\{.*pid=\"($pids)\"" "$tmp/prom")" -ge 6 ] && break
	sleep 0.1
done
"$B"/bin/r2cc top --once --interval 0.5 >"$tmp/top.all" 2>&1 || fail "r2cc top exited non-zero"
"$B"/bin/r2cc top --prometheus >"$tmp/prom.all" 2>&1 || fail "r2cc top --prometheus exited non-zero"
pids=$(ours)
[ -n "$pids" ] || fail "the drill's workers are gone"
awk -v re="^($pids)\$" 'NR <= 2 || $1 ~ re' "$tmp/top.all" >"$tmp/top"
grep -E "pid=\"($pids)\"" "$tmp/prom.all" >"$tmp/prom"
live=$(echo "$pids" | tr '|' '\n' | head -1)
live=r2cc-stats.$live
[ -n "$live" ] && cp "/dev/shm/$live" "$tmp/page"
kill "$drill" 2>/dev/null; wait "$drill" 2>/dev/null; drill=
cat "$tmp/top"
rows=$(awk '$2 ~ /^node[01]$/ && $3 ~ /^mlx5_[012]$/' "$tmp/top")
[ "$(echo "$rows" | grep -c .)" -eq 6 ] || fail "expected 6 rows (2 processes x 3 NICs)"
busy=$(echo "$rows" | awk '$4 == "up" && $5 > 0 && $6 > 0' | wc -l)
[ "$busy" -eq 6 ] || fail "expected every NIC to show send traffic, $busy did"
for m in tx_bytes tx_wrs recv_cqes err_cqes; do
	n=$(grep -cE "^r2cc_nic_${m}_total\{host=\"[^\"]+\",node=\"node[01]\",pid=\"[0-9]+\",nic=\"mlx5_[012]\"\} [0-9]+$" "$tmp/prom")
	[ "$n" -eq 6 ] || fail "prometheus: $n samples of r2cc_nic_${m}_total, expected 6"
done
grep -qE '^r2cc_nic_tx_bytes_total\{.*\} [1-9][0-9]*$' "$tmp/prom" || fail "prometheus: no traffic counted"
n=$(grep -cE '^r2cc_protected\{.*,why=""\} 1$' "$tmp/prom")
[ "$n" -eq 2 ] || fail "prometheus: $n processes protected, expected 2"
# A job on a network R2CC does not repair (the test net plugin): top says so, and why.
"$B"/bin/r2cc-verbs-drill --fault none --seeds 1 --messages 20000 --timeout 60 --nccl-stub \
	--net-plugin testnet >"$tmp/drill2" 2>&1 &
drill=$!
for _ in $(seq 100); do
	pids=$(ours)
	"$B"/bin/r2cc top --prometheus >"$tmp/prom2" 2>&1
	[ -n "$pids" ] && [ "$(grep -cE "^r2cc_protected\{.*pid=\"($pids)\".*\} 0$" "$tmp/prom2")" -ge 2 ] && break
	sleep 0.1
done
"$B"/bin/r2cc top --once --interval 0.2 >"$tmp/top2" 2>&1
kill "$drill" 2>/dev/null; wait "$drill" 2>/dev/null; drill=
grep -E "^r2cc_protected\{.*pid=\"($pids)\"" "$tmp/prom2" | grep -c 'why="network TestNet.*\} 0$' |
	grep -qx 2 || fail "prometheus: the unprotected processes are not 0 with their reason"
[ "$(grep -cE "^($pids) +NOT PROTECTED: network TestNet" "$tmp/top2")" -eq 2 ] ||
	fail "top: no NOT PROTECTED line under each process"
# A page whose process is gone (a crash leaves it behind): a copy of a live
# page under a pid that does not exist must be reported stale and removed.
dead=999999
while kill -0 "$dead" 2>/dev/null; do dead=$((dead + 1)); done
[ -s "$tmp/page" ] || fail "no live page was captured"
python3 - "$tmp/page" "/dev/shm/r2cc-stats.$dead" "$dead" <<'PY'
import struct, sys
data = bytearray(open(sys.argv[1], "rb").read())
struct.pack_into("<i", data, 12, int(sys.argv[3]))  # magic u64, version u32, then pid
open(sys.argv[2], "wb").write(data)
PY
"$B"/bin/r2cc top --once --interval 0.1 | grep -q "stale pages" || fail "stale page not reported"
"$B"/bin/r2cc top --prometheus | grep -q "pid=\"$dead\"" && fail "stale page counted as live"
"$B"/bin/r2cc top --clean | grep -q "removed [1-9]" || fail "--clean removed nothing"
[ ! -e "/dev/shm/r2cc-stats.$dead" ] || fail "--clean left the stale page"
echo "PASS: r2cc top saw 2 processes x 3 NICs with traffic; prometheus output complete; an unprotected job said so"
