# tests/scenarios: the seed's scenario scripts (scripts/scenarios/01-06), their common.sh
# and scripts/drill, on the CPU: syntax, --help, the exact commands of dry runs for the
# soft and every cluster fault method, check_idle, SAVE_LOG, the fault-plan parser, and
# real runs against the test doubles in tests/scenarios/fake (no GPU, no NCCL).
CPU_TESTS += 90@tests/scenarios/run.sh
