#!/usr/bin/env bash
# 02.hot_repair_to_r2cc_allreduce.sh - the same failure -> hot repair -> R2CC-AllReduce
#
# As 01 (10 verified AllReduces of 4 GiB, float/sum, 2 nodes x 2 GPUs, node 0's mlx5_2
# black-holed 4 s in; FAULT=down for a link down), but R2CC_AR_AFTER_REPAIR=3: after the
# repair every AllReduce runs the two-stage R2CC-AllReduce, so node 0 (the degraded
# server) should receive less per iteration than under Balance (see the NIC table).
#
# Until R2CC has hot repair (README 'Where it stands'), the job dies at the fault and this
# script says FAIL, plainly.
#
#   scripts/scenarios/02.hot_repair_to_r2cc_allreduce.sh [DRILL OPTIONS]
#   FAULT=down SIZE=1G ITERS=10 scripts/scenarios/02.hot_repair_to_r2cc_allreduce.sh
#   DRY_RUN=1 ... prints the commands;  SAVE_LOG=1 ... saves logs/local/02.hot_repair_to_r2cc_allreduce.log
# Settings: scripts/scenarios/README.md.
set -u
. "$(dirname "$0")/common.sh"
scn_help "$0" "$@"
scn_hot_repair_main 02 hot_repair_to_r2cc_allreduce 3 "same failure -> hot repair -> R2CC-AllReduce" "$@"
