#!/usr/bin/env bash
# One run of CI as CI runs it: a clean clone of this repository's HEAD, then
# `CI=true bash .ci/run` in it, optionally with a CPU hog beside it for the whole run.
# Appends one line to RESULTS in the format of logs/ci/clean-clone-runs.txt.
#
#   scripts/ci/ci-clean-clone.sh N HOG [RESULTS]
#     N        the run's number (the clone goes to /tmp/ci-lN, its output to /tmp/ci-lN.log)
#     HOG      0: nothing started beside it; 1: 'sh -c "while :; do :; done"' (one core
#              busy at normal priority) until the run ends
#     RESULTS  default logs/ci/clean-clone-runs.txt of this checkout
set -u
n=${1:?run number} hog=${2:?hog 0 or 1}
here=$(cd "$(dirname "$0")/../.." && pwd)
results=${3:-$here/logs/ci/clean-clone-runs.txt}
dir=/tmp/ci-l$n log=/tmp/ci-l$n.log
rm -rf "$dir"
git clone -q "$here" "$dir" || exit 2
commit=$(git -C "$dir" rev-parse --short HEAD)
start=$(date -u +%H:%M) t0=$(date +%s)
hp=
if [ "$hog" = 1 ]; then
	sh -c 'while :; do :; done' &
	hp=$!
fi
(cd "$dir" && CI=true bash .ci/run) >"$log" 2>&1
rc=$?
[ -n "$hp" ] && kill "$hp"
counts=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tr '\n' ' ')
line="run $n commit $commit hog $hog rc $rc secs $(($(date +%s) - t0)) start $start $counts"
echo "$line"
echo "$line" >>"$results"
grep -E '^(failed: |=== FAIL)' "$log"
exit $rc
