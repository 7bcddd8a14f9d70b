"""GPU test: unmodified torch.distributed all_reduce in a loop, through a NIC fault.

Spawns WORLD ranks (default 2), one emulated node each (NCCL_HOSTID), so NCCL moves
the data over the network transport (the soft NICs). Each rank runs ITERS all_reduces
of ELEMS float32 (sum) and checks every result against the exact expected value; the
caller injects the fault (softverbs-ctl) while the loop runs. Nothing in the loop knows
about R2CC or the fault: under LD_PRELOAD=libr2cc.so it must survive, without it the job
dies as plain NCCL does.

    python3 tests/gpu/torch_repair.py [WORLD] [ITERS] [ELEMS]
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world, iters, elems, port, result):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["NCCL_HOSTID"] = f"node{rank}"
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("nccl", rank=rank, world_size=world)
    base = torch.arange(elems, device="cuda", dtype=torch.float32) % 1024
    wrong = 0
    t_start = time.time()
    for it in range(iters):
        x = base + rank + it
        expect = base * world + sum(range(world)) + world * it
        torch.cuda.synchronize()
        t0 = time.time()
        dist.all_reduce(x)
        torch.cuda.synchronize()
        dt = time.time() - t0
        bad = int((x != expect).sum().item())
        wrong += bad
        if rank == 0:
            print(f"iter {it + 1:3d} t={t0 - t_start:7.3f}s time {dt * 1e3:8.1f} ms "
                  f"{'ok' if bad == 0 else f'{bad} WRONG'}", flush=True)
    if rank == 0:
        print(f"torch {torch.__version__} NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}: "
              f"{world} ranks, {iters} all_reduce of {elems * 4 >> 20} MiB float32: {wrong} wrong",
              flush=True)
    dist.destroy_process_group()
    result[rank] = wrong


def main():
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    elems = int(sys.argv[3]) if len(sys.argv) > 3 else 64 << 20
    port = 29500 + os.getpid() % 1000
    result = mp.Manager().list([-1] * world)
    mp.spawn(worker, args=(world, iters, elems, port, result), nprocs=world, join=True)
    ok = all(r == 0 for r in result)
    print("torch_repair:", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
