"""GPU test: torch.distributed all_reduce captured into CUDA graphs, unmodified user code.

Spawns WORLD ranks, one emulated node each (NCCL_HOSTID), so NCCL moves the data over
the network transport (the soft NICs).

    python3 tests/gpu/torch_graph.py check WORLD SECONDS [ELEMS]
        One eager all_reduce (the application's warm-up), then graph A captured with an
        in-place all_reduce of ELEMS float32 (sum). For SECONDS it replays A, each replay
        on new inputs and checked against the exact expected sum, with an eager
        all_reduce (checked too) after every second replay; at 65 % of the time it captures graph B
        the same way, and from then on replays A and B in turn. The caller puts a fault
        in the middle (R2CC_DRILL or softverbs-ctl). Every result is checked; the last
        line says how many were wrong.

    python3 tests/gpu/torch_graph.py cost WORLD REPLAYS [ELEMS...]
        Per size: one eager all_reduce, a graph of one all_reduce captured, 5 replays to
        warm up, then REPLAYS replays timed with CUDA events (mean per replay, us); and
        the same number of eager calls timed the same way. Results checked.
"""
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def setup(rank, world, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["NCCL_HOSTID"] = f"node{rank}"
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("nccl", rank=rank, world_size=world)


def teardown(rank):
    """destroy_process_group, bounded: NCCL's destroy waits for every live graph that
    captured the communicator, so a graph still referenced would hang the run until its
    time limit; after 30 s the rank says so and exits (the run then fails)."""
    def hung():
        print(f"rank {rank}: destroy_process_group still waiting after 30 s "
              "(a CUDA graph that captured the communicator still alive?)", flush=True)
        os._exit(3)
    watch = threading.Timer(30, hung)
    watch.daemon = True
    watch.start()
    dist.destroy_process_group()
    watch.cancel()


def capture(static):
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            dist.all_reduce(static)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    return g


def check_worker(rank, world, seconds, elems, port, result):
    setup(rank, world, port)
    base = torch.arange(elems, device="cuda", dtype=torch.float32) % 1024
    expect_base = base * world + sum(range(world))
    wrong = 0
    counts = {"A": 0, "B": 0, "eager": 0}

    def fill(t, it):
        t.copy_(base + rank + it)

    def bad(t, it):
        return int((t != expect_base + world * it).sum().item())

    warm = torch.empty_like(base)
    fill(warm, 0)
    dist.all_reduce(warm)  # the application's warm-up: R2CC agrees on the failure view here
    torch.cuda.synchronize()
    wrong += bad(warm, 0)
    a = torch.empty_like(base)
    b = torch.empty_like(base)
    ga = capture(a)
    gb = None
    it = 1
    t0 = time.time()
    # every rank runs the same number of steps: rank 0 decides when to stop
    flag = torch.zeros(1, device="cuda", dtype=torch.int32)
    while True:
        if it % 16 == 0:
            flag.fill_(1 if time.time() - t0 > seconds else 0)
            dist.broadcast(flag, 0)
            if int(flag.item()):
                break
            if gb is None and time.time() - t0 > seconds * 0.65:
                gb = capture(b)
                if rank == 0:
                    print(f"t={time.time() - t0:6.2f}s: graph B captured", flush=True)
        use_b = gb is not None and it % 2 == 1
        t, g, name = (b, gb, "B") if use_b else (a, ga, "A")
        fill(t, it)
        g.replay()
        torch.cuda.synchronize()
        n = bad(t, it)
        counts[name] += 1
        if n:
            print(f"rank {rank}: replay of {name} at step {it}: {n} wrong", flush=True)
        wrong += n
        if it % 2 == 0:
            fill(warm, it)
            dist.all_reduce(warm)
            torch.cuda.synchronize()
            n = bad(warm, it)
            counts["eager"] += 1
            if n:
                print(f"rank {rank}: eager all_reduce at step {it}: {n} wrong", flush=True)
            wrong += n
        it += 1
    if rank == 0:
        print(f"torch {torch.__version__} NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}: "
              f"{world} ranks, {elems * 4 >> 20} MiB float32: replays of A {counts['A']}, of B "
              f"{counts['B']}, eager {counts['eager']}, every one checked: {wrong} wrong",
              flush=True)
    # the graphs go before the communicators they captured: NCCL's destroy waits
    # until no live graph references the communicator. Every name bound to one
    # goes, the loop's `g` too (left holding the last graph replayed, it kept
    # destroy_process_group waiting for ever)
    g = ga = gb = None
    torch.cuda.synchronize()
    teardown(rank)
    result[rank] = wrong


def cost_worker(rank, world, replays, sizes, port, result):
    setup(rank, world, port)
    wrong = 0
    for elems in sizes:
        x = torch.full((elems,), float(rank + 1), device="cuda", dtype=torch.float32)
        want = float(sum(range(1, world + 1)))
        dist.all_reduce(x)
        torch.cuda.synchronize()
        g = capture(x)
        for _ in range(5):
            x.fill_(rank + 1)
            g.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        x.fill_(rank + 1)
        torch.cuda.synchronize()
        # the all_reduce is in place: each replay (and each eager call) starts from a
        # fresh fill, one fill kernel per iteration in both timings
        start.record()
        for _ in range(replays):
            x.fill_(rank + 1)
            g.replay()
        end.record()
        torch.cuda.synchronize()
        t_graph = start.elapsed_time(end) * 1000 / replays
        wrong += int((x != want).sum().item())
        start.record()
        for _ in range(replays):
            x.fill_(rank + 1)
            dist.all_reduce(x)
        end.record()
        torch.cuda.synchronize()
        t_eager = start.elapsed_time(end) * 1000 / replays
        wrong += int((x != want).sum().item())
        if rank == 0:
            print(f"cost: {elems * 4} bytes: graph replay {t_graph:10.1f} us, eager {t_eager:10.1f} us "
                  f"({replays} each)", flush=True)
        del g
    if rank == 0:
        print(f"cost: {wrong} wrong", flush=True)
    teardown(rank)
    result[rank] = wrong


def main():
    mode = sys.argv[1]
    world = int(sys.argv[2])
    port = 29500 + os.getpid() % 1000
    result = mp.Manager().list([-1] * world)
    if mode == "check":
        seconds = float(sys.argv[3])
        elems = int(sys.argv[4]) if len(sys.argv) > 4 else 16 << 20
        mp.spawn(check_worker, args=(world, seconds, elems, port, result), nprocs=world, join=True)
    else:
        replays = int(sys.argv[3])
        sizes = [int(s) for s in sys.argv[4:]] or [1 << 18, 16 << 20]
        mp.spawn(cost_worker, args=(world, replays, sizes, port, result), nprocs=world, join=True)
    ok = all(r == 0 for r in result)
    print(f"torch_graph {mode}:", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
