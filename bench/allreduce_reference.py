#!/usr/bin/python3
"""torch.distributed's Gloo allreduce, the reference for joule-bench-collectives.

    /usr/bin/python3 bench/allreduce_reference.py [--max-bytes 16777216] [--seconds 0.5]
        [--rank R --world N --master HOST --port P]

The same table as joule-bench-collectives (float32 sum; time per operation, algbw =
bytes / time, busbw = algbw x 2(n-1)/n) for torch.distributed.all_reduce on CPU tensors
over the Gloo backend, which is what PyTorch DDP calls for each gradient bucket. Without
--rank it spawns --world (default 2) local processes rendezvousing on 127.0.0.1; with
--rank each rank is started on its own (bench/multihost.sh: one per test host, Gloo's
interface from $GLOO_SOCKET_IFNAME). Rank 0 prints the table.
"""
import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}:{args.port}",
                            rank=rank, world_size=args.world)
    if rank == 0:
        print(f"# allreduce, float32 sum, {args.world} ranks (processes), "
              f"torch.distributed {torch.__version__} Gloo")
        print(f"{'bytes':>12} {'iters':>8} {'time(us)':>12} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}")
    flag = torch.zeros(1)
    size = 8
    while size <= args.max_bytes:
        t = torch.ones(size // 4)
        dist.all_reduce(t)  # warm-up
        # Rank 0 decides (as joule-bench-collectives): double the batch until it takes a
        # tenth of the budget, then run for the budget.
        k = 2
        while True:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(k):
                dist.all_reduce(t)
            took = time.perf_counter() - t0
            flag[0] = 1.0 if took >= args.seconds / 10 or k >= (1 << 20) else 0.0
            dist.broadcast(flag, 0)
            if flag[0] == 1.0:
                break
            k *= 2
        flag[0] = max(2, int(args.seconds / max(took / k, 1e-7)))
        dist.broadcast(flag, 0)
        iters = int(flag[0])
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        per = (time.perf_counter() - t0) / iters
        if rank == 0:
            algbw = size / per / 1e9
            busbw = algbw * 2 * (args.world - 1) / args.world
            print(f"{size:>12} {iters:>8} {per * 1e6:>12.1f} {algbw:>12.3f} {busbw:>12.3f}",
                  flush=True)
        size *= 2
    dist.destroy_process_group()


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-bytes", type=int, default=16 << 20)
    p.add_argument("--seconds", type=float, default=0.5)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--rank", type=int, default=None)
    p.add_argument("--master", default="127.0.0.1")
    p.add_argument("--port", type=int, default=None)
    args = p.parse_args(argv)
    if args.world < 2:
        p.error("--world must be at least 2")
    if args.port is None:
        if args.rank is not None:
            p.error("--rank needs --port")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            args.port = s.getsockname()[1]
    if args.rank is not None:
        run(args.rank, args)
    else:
        mp.spawn(run, args=(args,), nprocs=args.world, join=True)


if __name__ == "__main__":
    main(sys.argv[1:])
