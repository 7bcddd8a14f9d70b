#!/usr/bin/env bash
# Far probes (repair/farprobe.c): four processes with two NICs each, so every NIC has
# one sibling to test through; a black hole (and lost acknowledgements) on one NIC must
# be found by the self-test with a far witness (the sibling reached the peer NIC, the
# tested NIC did not), every message delivered exactly once, and the detection median
# under BOUND_MS (default 250; the one-sibling timing without far probes, 5 x the floor
# and 1.5 x that to test, gave 324-356 ms medians on this row).
#   tests/drill/far-witness.sh BUILD [SEEDS]
set -u
B=${1:-build}
SEEDS=${2:-2}
BOUND=${BOUND_MS:-250}
rc=0
for kind in blackhole ackloss; do
	out=$("$B"/bin/r2cc-verbs-drill --fault "$kind" --procs 4 --nics 2 --seeds "$SEEDS" --nccl-stub \
		--timeout 60 --keep 2>&1)
	st=$?
	last=$(printf '%s\n' "$out" | grep -E '^(PASS|FAIL) ' | tail -1)
	kept=$(printf '%s\n' "$out" | sed -n 's/^kept: //p' | tail -1)
	echo "$kind: $last"
	if [ $st -ne 0 ] || [ -z "$kept" ]; then
		printf '%s\n' "$out" | grep -E "FAIL|WARN" | head -5 | sed 's/^/    /'
		rc=1
		continue
	fi
	# every scenario: the faulted node's incident names the far witness
	scen=0 far=0
	for d in "$kept"/s*; do
		[ -d "$d" ] || continue
		scen=$((scen + 1))
		grep -l "its peer NIC (which the sibling reached)" "$d"/r2cc-report.*.json >/dev/null 2>&1 &&
			far=$((far + 1))
	done
	med=$(printf '%s\n' "$last" | sed -n 's/.*detection median \([0-9.]*\) ms.*/\1/p')
	echo "    scenarios $scen, decided by a far witness $far, detection median ${med:-?} ms (bound $BOUND)"
	if [ "$scen" -eq 0 ] || [ "$far" -ne "$scen" ] ||
		! awk -v m="${med:-99999}" -v b="$BOUND" 'BEGIN { exit !(m < b) }'; then
		rc=1
	fi
	rm -rf "$kept"
done
[ $rc -eq 0 ] && echo "PASS far-witness" || echo "FAIL far-witness"
exit $rc
