#!/usr/bin/env bash
# 06.nccl_tests_r2cc_allreduce_unhealthy.sh - full sweep, R2CC-AllReduce, mlx5_2 failed
#
# all_reduce_perf -b 8 -e 4G -f 2 -g 1 -c 1 -n 5 -w 2 -d float -o sum with R2CC_MODE=3 and
# node 0's mlx5_2 declared failed. Messages below R2CC_AR_MIN_BYTES (16 MiB) use Balance;
# the first eligible size pays the one-off sub-communicator creation. R2CC_DEBUG=INFO by
# default, so the log says how many AllReduces ran the two-stage schedule. PASS needs every
# #wrong 0; the verdict says whether the declared NIC still carried traffic.
#
#   scripts/scenarios/06.nccl_tests_r2cc_allreduce_unhealthy.sh [NCCL-TESTS ARGS]
#   scripts/scenarios/06.nccl_tests_r2cc_allreduce_unhealthy.sh -b 1G -e 4G -f 4 -d half -o prod
#   R2CC_AR_STAGE2_CHUNKS=8 R2CC_AR_SCHEDULE=1 scripts/scenarios/06.nccl_tests_r2cc_allreduce_unhealthy.sh -b 4G -e 4G
#   DRY_RUN=1 ... prints the commands;  SAVE_LOG=1 ... saves logs/local/06.nccl_tests_r2cc_allreduce_unhealthy.log
# Settings: scripts/scenarios/README.md.
set -u
. "$(dirname "$0")/common.sh"
scn_help "$0" "$@"
export R2CC_DEBUG=${R2CC_DEBUG:-INFO}
scn_sweep_main 06 nccl_tests_r2cc_allreduce_unhealthy "full sweep, R2CC-AllReduce, $FAILED_NIC failed" \
	"what it shows: R2CC-AllReduce (two-stage, >= R2CC_AR_MIN_BYTES) with node$FAILED_NODE/$FAILED_NIC declared failed; every result verified" \
	r2cc_allreduce_unhealthy 3 1 "$@"
