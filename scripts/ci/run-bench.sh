#!/usr/bin/env bash
# Runs each benchmark given as an argument (a program or script, arguments
# joined by ':' as in run-tests.sh) and prints its output. Benchmarks report
# figures, they do not pass or fail on them; a benchmark that cannot run
# (exit status non-zero) makes the whole run fail.
set -u
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
rc=0
for spec in "$@"; do
	IFS=':' read -r -a cmd <<<"$spec"
	echo "=== ${cmd[*]}"
	"${cmd[@]}" || { echo "=== ${cmd[*]} could not run (rc=$?)"; rc=1; }
done
exit $rc
