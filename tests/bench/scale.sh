#!/usr/bin/env bash
# Scale benchmarks (docs/scale.md says what they mean and models them):
# registration time, directory memory and the repair storm for 64 to 8,192
# ranks (r2cc-ctl-load, the real control plane); repair time after detection
# for 8 to 1,000 queue pairs on one NIC over the soft device (repair_scale),
# and the same set-up without R2CC for the memory it adds.
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
