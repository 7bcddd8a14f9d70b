#!/usr/bin/env bash
# 01.hot_repair_to_balance.sh - a NIC fails during a 4 GiB AllReduce -> hot repair -> R2CC-Balance
#
# 10 AllReduces of 4 GiB (float, sum) on 2 nodes x 2 GPUs, every one verified and timed
# (r2cc-perf --iters-table --nic-table); 4 s after the first one starts, node 0's mlx5_2 is
# black-holed (FAULT=down takes the link down instead). R2CC_AR_AFTER_REPAIR=2: after the
# repair, R2CC-Balance. Runs through scripts/drill and ends with PASS or FAIL.
#
# Until R2CC has hot repair (README 'Where it stands'), the job dies at the fault and this
# script says FAIL, plainly.
#
#   scripts/scenarios/01.hot_repair_to_balance.sh [DRILL OPTIONS, e.g. --from launch]
#   FAULT=down FAULT_AT=4s SIZE=1G ITERS=10 scripts/scenarios/01.hot_repair_to_balance.sh
#   RESTORE_AT=12s ITERS=50 ... the NIC comes back at 12 s (failback R2CC_FAILBACK_MS later)
#   DRY_RUN=1 ... prints the commands;  SAVE_LOG=1 ... saves logs/local/01.hot_repair_to_balance.log
# Settings: scripts/scenarios/README.md (R2CC_TARGET, R2CC_FAULT_METHOD, ...).
set -u
. "$(dirname "$0")/common.sh"
scn_help "$0" "$@"
scn_hot_repair_main 01 hot_repair_to_balance 2 "real NIC failure during a 4 GiB AllReduce -> hot repair -> R2CC-Balance" "$@"
