# tests/plot: scripts/plot.py on the committed logs and on synthetic ones (needs matplotlib).
CPU_TESTS += 60@tests/plot/run.sh
