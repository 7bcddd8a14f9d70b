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

# the installed fit: R2CC-AllReduce's bytes dearer; it still wins at 4 nodes, 1 GiB
out=$("$plan" --nodes 4 --nics 3 --failed 1 --bytes 1G) || fail "plan default model"
r=$(ratio "mode 3 R2CC-AllReduce" <<<"$out")
awk -v r="$r" 'BEGIN { exit !(r > 1.375 && r < 1.5) }' || fail "fitted R2CC-AllReduce at n=4: $r"
grep -q '^auto: mode 3 R2CC-AllReduce (' <<<"$out" || fail "fitted auto at n=4 1G: $out"

out=$("$plan" --nodes=2 --nics=3 --failed=1 --bytes=256MiB) || fail "plan n=2"
grep -q '^auto: mode 2 Balance (2 nodes' <<<"$out" || fail "auto at n=2: $out"
grep -q '^message: 268435456 bytes' <<<"$out" || fail "size 256MiB: $out"

out=$("$plan" --nodes 8 --nics 4 --failed 1 --bytes 64K) || fail "plan small"
grep -q '^auto: mode 2 Balance (predicted' <<<"$out" || fail "auto small message: $out"
out=$("$plan" --nodes 4 --nics 2 --failed 2 --bytes 1G) || fail "plan dead node"
grep -q 'cannot run' <<<"$out" || fail "no NIC left: $out"

"$plan" --help | grep -q '^usage: r2cc-plan' || fail "--help"
for args in "--nodes 3 --nics 3 --failed 1" "--nodes 0 --nics 3 --failed 1 --bytes 1G" \
	"--nodes 3 --nics 3 --failed 4 --bytes 1G" "--nodes 3 --nics 3 --failed 1 --bytes 4X" \
	"--nodes 3 --nics 3 --failed 1 --bytes -4G" "--nodes 3 --nics 3 --failed 1 --bytes 1G --bogus" \
	"--nodes x --nics 3 --failed 1 --bytes 1G" "--nodes 3 --nics 3 --failed 1 --bytes 1G extra" \
	"--nodes 3 --nics 3 --failed 1 --bytes 1G --model alpha=1"; do
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
echo "bogus,1,2,3" | "$fit" - >/dev/null 2>&1 && fail "fit accepted a bad line"

[ $fails -eq 0 ] && echo "plan_test: all checks passed"
[ $fails -eq 0 ]
