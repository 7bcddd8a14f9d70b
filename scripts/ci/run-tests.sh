#!/usr/bin/env bash
# Runs each test command given as an argument (a program or a script, with its
# arguments separated by ':' so that make can pass it as one word), prints its
# output, and ends with one summary line "N passed, M failed". A failed test's last
# lines are printed again just above that line, so that a log cut to its tail (as CI's
# report is) still says why.
# A test command's name may carry a time limit: "120@build/tests/foo:--x".
set -u
# Everything a test starts talks over loopback only (R2CC's control plane
# follows NCCL_SOCKET_IFNAME).
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
pass=0; fail=0; failed=()
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
for spec in "$@"; do
	limit=600
	case "$spec" in *@*) limit=${spec%%@*}; spec=${spec#*@} ;; esac
	IFS=':' read -r -a cmd <<<"$spec"
	echo "=== ${cmd[*]}"
	start=$(date +%s.%N)
	log=$logs/$((pass + fail)).log
	# to a file, not a pipe: a daemon a test leaves behind cannot hold the run up
	timeout --kill-after=10 "$limit" "${cmd[@]}" >"$log" 2>&1
	rc=$?
	cat "$log"
	secs=$(printf '%.1f' "$(echo "$(date +%s.%N) - $start" | bc)")
	if [ $rc -eq 0 ]; then
		pass=$((pass + 1)); echo "=== ok   ${cmd[*]} (${secs}s)"
	else
		fail=$((fail + 1)); failed+=("${cmd[*]}")
		[ $rc -eq 124 ] && echo "=== timed out after ${limit}s"
		echo "=== FAIL ${cmd[*]} (rc=$rc, ${secs}s)"
		mv "$log" "$logs/failed-$fail.log"
	fi
	rm -f "$log"
done
i=0
for f in "${failed[@]+"${failed[@]}"}"; do
	i=$((i + 1))
	echo "=== the last 40 lines of failed test $i: $f"
	tail -n 40 "$logs/failed-$i.log"
done
for f in "${failed[@]+"${failed[@]}"}"; do echo "failed: $f"; done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
