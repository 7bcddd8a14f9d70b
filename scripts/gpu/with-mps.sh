#!/usr/bin/env bash
# Runs a command with the CUDA MPS daemon up (GPU machine only), then stops the daemon.
#   scripts/gpu/with-mps.sh COMMAND [ARGS...]
# Why: the software fabric emulates several nodes on one GPU host, so in shapes such as
# 4 nodes x 1 GPU or 2 x 2 on a 2-GPU machine two ranks share each GPU. Without MPS the
# GPU time-slices between their processes, and a rank whose NCCL kernels are waiting for
# their slice stalls its peers: R2CC-AllReduce, whose stage-1 and stage-2 kernels of
# three communicators are meant to run side by side, suffers most (4 x 1, X = 1/3: 0.72-
# 0.99 x Balance without MPS, 1.13-1.18 x with it; logs/strategies/ar2-vs-balance). With
# MPS the kernels of both processes share the GPU's SMs at once, as ranks on separate
# GPUs of a cluster would run. The exit status is the command's.
set -u
[ $# -ge 1 ] || { echo "usage: scripts/gpu/with-mps.sh COMMAND [ARGS...]" >&2; exit 2; }
command -v nvidia-cuda-mps-control >/dev/null ||
	{ echo "with-mps: nvidia-cuda-mps-control not found (GPU machine with the CUDA driver only)" >&2; exit 2; }
export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/r2cc-mps-pipe}
export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/r2cc-mps-log}
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d || { echo "with-mps: the MPS daemon did not start" >&2; exit 2; }
"$@"
rc=$?
echo quit | nvidia-cuda-mps-control
exit $rc
