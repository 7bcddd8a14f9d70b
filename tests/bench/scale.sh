#!/usr/bin/env bash
# Scale benchmarks (docs/scale.md says what they mean and models them):
# registration time, directory memory and the repair storm for 64 to 8,192
# ranks (r2cc-ctl-load, the real control plane); repair time after detection
# for 8 to 1,000 queue pairs on one NIC over the soft device (repair_scale),
# the same set-up without R2CC for the memory it adds; and the NIC self-tests
# (stall probes) per second while 64 to 1,000 queue pairs on one NIC all wait.
set -eu
B=${BUILD:-build}
echo "== control plane: ranks registered, NICs reported, peers looked up, repair storm"
for n in 64 256 1024 4096 8192; do
	"$B"/bin/r2cc-ctl-load --ranks "$n"
done
echo "== repair after detection: node0's mlx5_0 down, N queue pairs over N/8 peers (at most 64)"
"$B"/tests/bench/repair_scale --qps 8,16,32,64,128,256,512,1000 --reps 3
echo "== the same over 8 peers (fewer processes on the machine's cores)"
"$B"/tests/bench/repair_scale --qps 8,64,512,1000 --peers 8 --reps 3
echo "== the same set-up without R2CC (node0's memory without it)"
"$B"/tests/bench/repair_scale --qps 8,512,1000 --no-preload
echo "== NIC self-tests while every queue pair waits: N queue pairs kept busy for 3 s with 64 KB"
echo "   writes, two outstanding each, over NICs shaped to 10 Gb/s (no fault: none may repair)"
"$B"/tests/bench/repair_scale --qps 64,512,1000 --load-ms 3000 --fault none
