#!/usr/bin/env bash
# Checks r2cc-plan's output and errors, and r2cc-fit-cost on synthetic data.
# Usage: strategies/plan_test.sh build/bin/r2cc-plan build/bin/r2cc-fit-cost
set -u
plan=$1 fit=$2
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# value of a strategy's T/T0 column
ratio() { awk -v s="$1" 'index($0, s) == 1 { print $(NF - 1) }'; }

# The model of docs/architecture.md (Cost model) (equal cost per byte): the closed forms at large sizes
design=alpha_us=20,beta_us_per_byte=0.0000888889,ar2_beta_us_per_byte=0.0000888889,ar2_stage_us=20,ar2_chunk_us=20
out=$("$plan" --nodes 3 --nics 3 --failed 1 --bytes 4G --model $design) || fail "plan exit status $?"
[ "$(ratio "mode 2 Balance" <<<"$out")" = 1.500 ] || fail "Balance at n=3 X=1/3: $out"
r=$(ratio "mode 3 R2CC-AllReduce" <<<"$out")
awk -v r="$r" 'BEGIN { exit !(r >= 1.375 && r < 1.38) }' || fail "R2CC-AllReduce at n=3: $r"
[ "$(ratio "mode 1 backup NIC" <<<"$out")" = 2.000 ] || fail "backup at f=1: $out"
grep -q '^auto: mode 3 R2CC-AllReduce (' <<<"$out" || fail "auto at 4G: $out"
grep -q '^message: 4294967296 bytes (4 GiB)' <<<"$out" || fail "size 4G: $out"

# the built-in model: per-byte from the link rate, fitted latencies; at 25 Gb/s
# R2CC-AllReduce wins at 4 nodes, 1 GiB; at 400 Gb/s the same latencies weigh 16 x more,
# and 256 MiB stays on Balance
out=$("$plan" --nodes 4 --nics 3 --failed 1 --bytes 1G --rate 25) || fail "plan default model"
r=$(ratio "mode 3 R2CC-AllReduce" <<<"$out")
awk -v r="$r" 'BEGIN { exit !(r > 1.3 && r < 1.5) }' || fail "R2CC-AllReduce at n=4, 25 Gb/s: $r"
grep -q '^auto: mode 3 R2CC-AllReduce (.*25 Gb/s NICs' <<<"$out" || fail "auto at n=4 1G: $out"
grep -q '^R2CC_MODE=3: mode 3 R2CC-AllReduce (1 degraded node' <<<"$out" || fail "mode 3: $out"
out=$("$plan" --nodes 4 --nics 3 --failed 1 --bytes 256M --rate 400) || fail "plan 400 Gb/s"
grep -q '^auto: mode 2 Balance (predicted' <<<"$out" || fail "auto at 400 Gb/s: $out"
grep -q '^R2CC_MODE=3: mode 3 R2CC-AllReduce' <<<"$out" || fail "mode 3 at 400 Gb/s: $out"

# a list per node: two degraded nodes, each with a helper; every node degraded
out=$("$plan" --nodes 4 --nics 4 --failed 1,0,2,0 --bytes 4G --model $design) || fail "plan list"
grep -q '^cluster: 4 nodes, 2 degraded; the largest failed share: 2 of 4 NICs on node 2' \
	<<<"$out" || fail "per-node list: $out"
grep -q '^R2CC_MODE=3: mode 3 R2CC-AllReduce (2 degraded nodes, a helper each)' <<<"$out" ||
	fail "mode 3, two degraded: $out"
grep -q '^auto: mode 3 R2CC-AllReduce (predicted .* 2 degraded' <<<"$out" || fail "auto list: $out"
out=$("$plan" --nodes 3 --nics 4,4,8 --failed 1,1,1 --bytes 4G) || fail "plan all degraded"
grep -q '^R2CC_MODE=3: mode 2 Balance (every node is degraded' <<<"$out" || fail "all: $out"
grep -q '^auto: mode 2 Balance (every node is degraded' <<<"$out" || fail "auto all: $out"

out=$("$plan" --nodes=2 --nics=3 --failed=1 --bytes=256MiB) || fail "plan n=2"
grep -q '^auto: mode 2 Balance (2 nodes' <<<"$out" || fail "auto at n=2: $out"
grep -q '^message: 268435456 bytes' <<<"$out" || fail "size 256MiB: $out"

out=$("$plan" --nodes 8 --nics 4 --failed 1 --bytes 64K) || fail "plan small"
grep -q '^auto: mode 2 Balance (message below R2CC_AR_MIN_BYTES)' <<<"$out" ||
	fail "auto small message: $out"
out=$("$plan" --nodes 8 --nics 4 --failed 1 --bytes 64K --min-bytes 4K --rate 25) ||
	fail "plan small, low threshold"
grep -q '^auto: mode 2 Balance (predicted' <<<"$out" || fail "auto small message, cost: $out"
out=$("$plan" --nodes 4 --nics 2 --failed 2 --bytes 1G) || fail "plan dead node"
grep -q 'cannot run' <<<"$out" || fail "no NIC left: $out"

"$plan" --help | grep -q '^usage: r2cc-plan' || fail "--help"
for args in "--nodes 3 --nics 3 --failed 1" "--nodes 0 --nics 3 --failed 1 --bytes 1G" \
	"--nodes 3 --nics 3 --failed 4 --bytes 1G" "--nodes 3 --nics 3 --failed 1 --bytes 4X" \
	"--nodes 3 --nics 3 --failed 1 --bytes -4G" "--nodes 3 --nics 3 --failed 1 --bytes 1G --bogus" \
	"--nodes x --nics 3 --failed 1 --bytes 1G" "--nodes 3 --nics 3 --failed 1 --bytes 1G extra" \
	"--nodes 3 --nics 3 --failed 1 --bytes 1G --model alpha=1" \
	"--nodes 3 --nics 3 --failed 1,0 --bytes 1G" "--nodes 3 --nics 3,3 --failed 1 --bytes 1G" \
	"--nodes 2 --nics 2,2 --failed 3,0 --bytes 1G" "--nodes 2 --nics 2 --failed 1,,0 --bytes 1G" \
	"--nodes 3 --nics 3 --failed 1 --bytes 1G --rate 0"; do
	# shellcheck disable=SC2086
	err=$("$plan" $args 2>&1 >/dev/null)
	rc=$?
	[ $rc -eq 2 ] || fail "'$args' exit $rc, want 2"
	grep -q '^r2cc-plan: ' <<<"$err" || fail "'$args' message: $err"
done

# fit: synthetic rows from a known model, recovered by r2cc-fit-cost
csv=$(mktemp)
trap 'rm -f "$csv"' EXIT
awk 'BEGIN {
	a = 25; b = 1 / 10000; b2 = 1 / 9500; st = 30; ch = 10
	print "strategy,n,k,f,bytes,time_us,chunks"
	split("healthy backup balance ar2", names, " ")
	for (n = 2; n <= 8; n *= 2) for (k = 2; k <= 8; k *= 2) for (f = 0; f < k; f++)
	for (s = 4096; s <= 4e9; s *= 32) for (K = 2; K <= 8; K *= 2) {
		L = 2 * (n - 1) / n * s / k; X = f / k
		h = int((f + (k - f) - 1) / (k - f))
		printf "healthy,%d,%d,%d,%d,%.6f,%d\n", n, k, f, s, a + b * L, K
		printf "backup,%d,%d,%d,%d,%.6f,%d\n", n, k, f, s, a + b * L * (f ? 1 + h : 1), K
		printf "balance,%d,%d,%d,%d,%.6f,%d\n", n, k, f, s, a + b * L * k / (k - f), K
		printf "ar2,%d,%d,%d,%d,%.6f,%d\n", n, k, f, s, a + 2 * st + K * ch + b2 * L * (1 + n * X / (2 * (n - 1) * (1 - X))), K
	} }' >"$csv"
out=$("$fit" "$csv") || fail "fit exit status"
model=$(sed -n 's/^model: //p' <<<"$out")
for kv in alpha_us=25 ar2_stage_us=30 ar2_chunk_us=10 beta_us_per_byte=0.0001; do
	want=${kv#*=}
	got=$(tr ',' '\n' <<<"$model" | sed -n "s/^${kv%%=*}=//p")
	awk -v g="$got" -v w="$want" 'BEGIN { d = g - w; if (d < 0) d = -d; exit !(d <= 1e-3 * w) }' ||
		fail "fit ${kv%%=*}: $got, want $want"
done
"$plan" --nodes 3 --nics 3 --failed 1 --bytes 1G --model "$model" >/dev/null || fail "plan --model"
# latency only: the per-byte terms are the link rate's (10000 bytes/us = 80 Gb/s)
awk 'BEGIN {
	a = 25; b = 8 / (1000 * 80); st = 30; ch = 10
	for (n = 2; n <= 8; n *= 2) for (s = 4096; s <= 4e9; s *= 32) for (K = 2; K <= 8; K *= 2) {
		L = 2 * (n - 1) / n * s / 4; X = 1 / 4
		printf "balance,%d,4,1,%d,%.6f,%d\n", n, s, a + b * L * 4 / 3, K
		printf "ar2,%d,4,1,%d,%.6f,%d\n", n, s, a + 2 * st + K * ch + b * L * (1 + n * X / (2 * (n - 1) * (1 - X))), K
	} }' >"$csv"
out=$("$fit" --rate 80 "$csv") || fail "fit --rate exit status"
model=$(sed -n 's/^model: //p' <<<"$out")
for kv in alpha_us=25 ar2_stage_us=30 ar2_chunk_us=10 beta_us_per_byte=0 ar2_beta_us_per_byte=0; do
	want=${kv#*=}
	got=$(tr ',' '\n' <<<"$model" | sed -n "s/^${kv%%=*}=//p")
	awk -v g="$got" -v w="$want" 'BEGIN { d = g - w; if (d < 0) d = -d; exit !(d <= 1e-3 * w + 1e-12) }' ||
		fail "fit --rate ${kv%%=*}: $got, want $want"
done
out=$("$fit" --check --rate 80 --model "$model" "$csv") || fail "fit --check exit status"
awk '$1 == "ar2" || $1 == "balance" { if ($8 < 0.999 || $8 > 1.001) bad++ } END { exit bad > 0 }' \
	<<<"$out" || fail "fit --check: predictions off the rows they came from: $out"
grep -q '^1-256 MiB: 36 rows' <<<"$out" || fail "fit --check summary: $out"
echo "bogus,1,2,3" | "$fit" - >/dev/null 2>&1 && fail "fit accepted a bad line"

[ $fails -eq 0 ] && echo "plan_test: all checks passed"
[ $fails -eq 0 ]
