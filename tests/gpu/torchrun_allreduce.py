"""GPU check: torch.distributed all_reduce in a loop under torchrun, every result checked.

Started by torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT from it), so that R2CC
can be put in front of each rank with `torchrun --no-python ... r2cc run -- python3
tests/gpu/torchrun_allreduce.py`. Each rank is an emulated node of its own
(NCCL_HOSTID=node<RANK>) and shares GPU 0 when there is one GPU. Exit status 0 only when
every element of every result is exact.

    torchrun --nproc-per-node 2 --no-python r2cc run -- python3 tests/gpu/torchrun_allreduce.py [ITERS] [ELEMS]
"""
import os
import sys

import torch
import torch.distributed as dist


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    elems = int(sys.argv[2]) if len(sys.argv) > 2 else 16 << 20
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    os.environ["NCCL_HOSTID"] = f"node{rank}"
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    dist.init_process_group("nccl")
    base = torch.arange(elems, device="cuda", dtype=torch.float32) % 1024
    wrong = 0
    for it in range(iters):
        x = base + rank + it
        dist.all_reduce(x)
        expect = base * world + sum(range(world)) + world * it
        wrong += int((x != expect).sum().item())
    dist.destroy_process_group()
    print(f"torchrun_allreduce: rank {rank}/{world}: {iters} all_reduce of {elems * 4 >> 20} MiB, "
          f"{wrong} wrong", flush=True)
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
