# tests/compat: the NCCL version matrix's scripts (scripts/gpu/gpu-compat.sh,
# scripts/gpu/nccl-versions.sh) on the CPU, against the test doubles in tests/compat/fake:
# verdicts, figures and per-version settings in summary.txt, and the failures they must
# report (no GPU, no NCCL, no network).
CPU_TESTS += 240@tests/compat/run.sh
FORMAT_SRCS += tests/compat/fake/nccl.c
