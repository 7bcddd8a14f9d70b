"""GPU test: torch.distributed all_reduce over NCCL, unmodified user code.

Spawns WORLD ranks (default 2) on the local GPUs, runs all_reduce on several
sizes and dtypes and checks each result against the exact expected value.
Run it with LD_PRELOAD=libr2cc.so to show R2CC under PyTorch's own NCCL.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world, port, result):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if os.environ.get("R2CC_TEST_HOSTID") == "1":
        # One emulated node per rank: NCCL then uses its network transport.
        os.environ["NCCL_HOSTID"] = f"node{rank}"
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("nccl", rank=rank, world_size=world)
    wrong = 0
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        for n in (1, 1000, 1 << 20, (1 << 24) + 3):
            x = (torch.arange(n, device="cuda") % 7 + rank).to(dtype)
            expect = (torch.arange(n, device="cuda") % 7 * world + sum(range(world))).to(dtype)
            dist.all_reduce(x)
            torch.cuda.synchronize()
            if not torch.equal(x, expect):
                wrong += int((x != expect).sum().item())
                print(f"rank {rank}: {dtype} n={n}: mismatch", flush=True)
    if rank == 0:
        print(f"torch {torch.__version__} NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}: "
              f"{world} ranks, all_reduce float32/bfloat16/int32 up to 64 MiB: {wrong} wrong", flush=True)
    dist.destroy_process_group()
    result[rank] = wrong


def main():
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    port = 29500 + os.getpid() % 1000
    result = mp.Manager().list([-1] * world)
    mp.spawn(worker, args=(world, port, result), nprocs=world, join=True)
    ok = all(r == 0 for r in result)
    print("torch_allreduce:", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
