#!/usr/bin/env bash
# 05.nccl_tests_balance_unhealthy.sh - full sweep, R2CC-Balance, mlx5_2 failed
#
# all_reduce_perf -b 8 -e 4G -f 2 -g 1 -c 1 -n 5 -w 2 -d float -o sum with R2CC_MODE=2 and
# node 0's mlx5_2 declared failed (R2CC_FAILED_NODE=0 R2CC_FAILED_HCA=mlx5_2): the degraded
# topology without cutting anything. PASS needs every #wrong 0. The verdict also says,
# from the NIC table (r2cc-perf only), whether the declared NIC still carried traffic:
# until R2CC has Balance placement (README 'Where it stands') it does, and the bandwidth is
# then not that of a degraded server; REQUIRE_PLACEMENT=1 turns that into a FAIL.
#
#   scripts/scenarios/05.nccl_tests_balance_unhealthy.sh [NCCL-TESTS ARGS]
#   NCCL_TEST_BIN=all_gather_perf scripts/scenarios/05.nccl_tests_balance_unhealthy.sh -b 64M -e 1G -f 2 -d float
#   DRY_RUN=1 ... prints the commands;  SAVE_LOG=1 ... saves logs/local/05.nccl_tests_balance_unhealthy.log
# Settings: scripts/scenarios/README.md.
set -u
. "$(dirname "$0")/common.sh"
scn_help "$0" "$@"
scn_sweep_main 05 nccl_tests_balance_unhealthy "full sweep, R2CC-Balance, $FAILED_NIC failed" \
	"what it shows: R2CC-Balance with node$FAILED_NODE/$FAILED_NIC declared failed; every result verified" \
	balance_unhealthy 2 1 "$@"
