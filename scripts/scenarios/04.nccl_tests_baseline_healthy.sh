#!/usr/bin/env bash
# 04.nccl_tests_baseline_healthy.sh - full nccl-tests sweep (8 B-4 GiB), plain NCCL, all NICs healthy
#
# all_reduce_perf -b 8 -e 4G -f 2 -g 1 -c 1 -n 5 -w 2 -d float -o sum with R2CC loaded in
# R2CC_MODE=0 (pure pass-through: NCCL's own behaviour, the baseline). Every result is
# checked (-c 1); the verdict is PASS only when every #wrong is 0 and the run completed.
# Arguments are nccl-tests arguments and come after the defaults (so they override them);
# NCCL_TEST_BIN picks another collective; MAX_BYTES=1G shortens the sweep.
#
#   scripts/scenarios/04.nccl_tests_baseline_healthy.sh [NCCL-TESTS ARGS]
#   NCCL_TEST_BIN=all_gather_perf scripts/scenarios/04.nccl_tests_baseline_healthy.sh -b 64M -e 1G
#   DRY_RUN=1 ... prints the commands;  SAVE_LOG=1 ... saves logs/local/04.nccl_tests_baseline_healthy.log
# Settings: scripts/scenarios/README.md.
set -u
. "$(dirname "$0")/common.sh"
scn_help "$0" "$@"
scn_sweep_main 04 nccl_tests_baseline_healthy "full sweep, plain NCCL, all NICs healthy" \
	"what it shows: NCCL's own bandwidth over all NICs and a verified result for every size (R2CC_MODE=0)" \
	baseline_healthy 0 0 "$@"
