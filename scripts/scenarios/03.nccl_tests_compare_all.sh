#!/usr/bin/env bash
# 03.nccl_tests_compare_all.sh - NCCL healthy vs R2CC-Balance vs R2CC-AllReduce, one table
#
# all_reduce_perf three times with identical arguments
# (-b 256M -e 4G -f 4 -g 1 -c 1 -n 5 -w 2 -d float -o sum): plain NCCL on the healthy
# cluster (R2CC_MODE=0), R2CC-Balance (R2CC_MODE=2) and R2CC-AllReduce (R2CC_MODE=3) with
# node 0's mlx5_2 declared failed; then one comparison table in the seed's format (cells:
# busbw out-of-place/in-place GB/s, #wrong out-of-place/in-place). -c 1 checks every
# result: the point is #wrong 0 in both R2CC columns. Read the bandwidths as indicative
# only (see the seed's notes and the verdict: today the declared NIC still carries traffic).
# Arguments are nccl-tests arguments appended to the defaults; MIN_BYTES/MAX_BYTES shorten it.
#
#   scripts/scenarios/03.nccl_tests_compare_all.sh [NCCL-TESTS ARGS]
#   MAX_BYTES=1G scripts/scenarios/03.nccl_tests_compare_all.sh
#   DRY_RUN=1 ... prints the commands;  SAVE_LOG=1 ... saves logs/local/03.nccl_tests_compare_all.log
# Settings: scripts/scenarios/README.md.
set -u
. "$(dirname "$0")/common.sh"
scn_help "$0" "$@"
scn_begin 03 nccl_tests_compare_all
args=(-b "${MIN_BYTES:-256M}" -e "${MAX_BYTES:-4G}" -f 4 -g 1 -c 1 -n 5 -w 2 -d float -o sum "$@")
scn_header "nccl-tests, NCCL healthy vs R2CC-Balance vs R2CC-AllReduce, one table" \
	"what it shows: the same all_reduce_perf run three times: R2CC_MODE=0 healthy, R2CC_MODE=2 and" \
	"  R2CC_MODE=3 with node$FAILED_NODE/$FAILED_NIC declared failed; #wrong must be 0 everywhere" \
	"nccl-tests args: ${args[*]}"
labels=(baseline_healthy balance_unhealthy r2cc_allreduce_unhealthy)
modes=(0 2 3)
declared=(0 1 1)
ok=1 lines=() table=()
for k in 0 1 2; do
	rc=0
	if [ "${modes[$k]}" = 3 ]; then
		R2CC_DEBUG=${R2CC_DEBUG:-INFO} scn_nccl_test "${labels[$k]}" 3 1 "${args[@]}" || rc=$?
	else
		scn_nccl_test "${labels[$k]}" "${modes[$k]}" "${declared[$k]}" "${args[@]}" || rc=$?
	fi
	out=$(scn_check "${labels[$k]}" "$rc" "${declared[$k]}") || ok=0
	mapfile -t -O "${#lines[@]}" lines <<<"$out"
	table+=("${labels[$k]}=$SCN_TMP/${labels[$k]}.out")
	echo
done
if ! scn_dry; then
	echo
	"$SCN_PY" -I -S "$SCN_RESULTS" table --args "${args[*]}" "${table[@]}"
fi
if scn_dry; then
	scn_verdict "DRY RUN (nothing ran)" "${lines[@]}"
elif [ $ok = 1 ]; then
	scn_verdict PASS "${lines[@]}"
else
	scn_verdict FAIL "${lines[@]}"
	exit 1
fi
