#!/usr/bin/python3
"""PyTorch DDP baseline for Joule's reference workloads.

The same jobs Joule runs, done the way a PyTorch user would do them instead:
DistributedDataParallel over Gloo on the CPU, one process per rank on this
machine, Fashion-MNIST from the Debian package dataset-fashion-mnist.

    /usr/bin/python3 bench/ddp_reference.py MODEL WORLD LOCAL_BATCH EPOCHS
        [--lr 0.05] [--momentum 0.9] [--threads 1] [--seed 0] [--port PORT]
        [--rank R --master HOST] [--fp16-hook] [--powersgd-rank R --powersgd-warmup N]

MODEL is logreg, mlp or cnn. Rank 0 prints one JSON line:
    {"model", "world", "local_batch", "epochs", "train_seconds",
     "samples_per_second", "test_accuracy", ...}

Only the training loop is timed (between two barriers); loading the data and
evaluating on the 10,000 test images are not. Every epoch draws a fresh
permutation of the 60,000 training images (the same on every rank) and rank r
takes positions r, r+WORLD, r+2*WORLD, ...; a trailing partial batch is dropped,
so each step consumes LOCAL_BATCH x WORLD samples.

The rendezvous port is --port, else $MASTER_PORT, else a free port picked here.

Several hosts (bench/multihost.sh): --rank R runs rank R alone in this process, rendezvous
at --master HOST:--port (rank 0's host), instead of spawning WORLD local processes. Gloo
picks its interface from $GLOO_SOCKET_IFNAME. --fp16-hook registers DDP's fp16 gradient
compression hook (torch.distributed.algorithms.ddp_comm_hooks.default_hooks);
--powersgd-rank R its powerSGD_hook (rank R, error feedback, warm start, exact allreduce
for the first --powersgd-warmup steps).
"""
import argparse
import gzip
import json
import os
import socket
import struct
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

DATA_DIR = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")
MODELS = ("logreg", "mlp", "cnn")


def read_idx(filename):
    """Read a gzipped IDX file into a numpy array of its element type (uint8 here)."""
    with gzip.open(os.path.join(DATA_DIR, filename), "rb") as f:
        raw = f.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != 0x08:
        raise SystemExit(f"{filename}: not an unsigned-byte IDX file")
    shape = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def images(filename):
    # N x 1 x 28 x 28, scaled to [0, 1]
    return torch.from_numpy(read_idx(filename).astype(np.float32) / 255.0).unsqueeze(1)


def labels(filename):
    return torch.from_numpy(read_idx(filename).astype(np.int64))


def build_model(name):
    if name == "logreg":
        layers = [nn.Flatten(), nn.Linear(28 * 28, 10)]
    elif name == "mlp":
        layers = [nn.Flatten(),
                  nn.Linear(28 * 28, 512), nn.ReLU(),
                  nn.Linear(512, 256), nn.ReLU(),
                  nn.Linear(256, 10)]
    elif name == "cnn":
        layers = [nn.Conv2d(1, 32, kernel_size=3), nn.ReLU(),    # 26 x 26
                  nn.Conv2d(32, 64, kernel_size=3), nn.ReLU(),   # 24 x 24
                  nn.MaxPool2d(2),                               # 12 x 12
                  nn.Flatten(),
                  nn.Linear(64 * 12 * 12, 128), nn.ReLU(),
                  nn.Linear(128, 10)]
    else:
        raise SystemExit(f"unknown model {name!r} (expected one of {', '.join(MODELS)})")
    return nn.Sequential(*layers)


def accuracy(model, x, y, chunk=1000):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, x.shape[0], chunk):
            correct += (model(x[i:i + chunk]).argmax(dim=1) == y[i:i + chunk]).sum().item()
    model.train()
    return correct / x.shape[0]


def worker(rank, args):
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}:{args.port}",
                            rank=rank, world_size=args.world)

    train_x, train_y = images("train-images-idx3-ubyte.gz"), labels("train-labels-idx1-ubyte.gz")
    test_x, test_y = images("t10k-images-idx3-ubyte.gz"), labels("t10k-labels-idx1-ubyte.gz")

    torch.manual_seed(args.seed)  # DDP also broadcasts rank 0's parameters at construction
    net = build_model(args.model)
    ddp = nn.parallel.DistributedDataParallel(net)
    if args.fp16_hook:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    if args.powersgd_rank:
        # PowerSGD with error feedback and warm start (the hook's defaults), the rank and
        # the exact warm-up steps given; PyTorch needs start_powerSGD_iter > 1 with either.
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=args.powersgd_rank,
            start_powerSGD_iter=max(2, args.powersgd_warmup), use_error_feedback=True,
            warm_start=True, random_seed=args.seed)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
    criterion = nn.CrossEntropyLoss()

    n = train_x.shape[0]
    steps_per_epoch = (n // args.world) // args.local_batch
    samples = 0

    dist.barrier()
    start = time.perf_counter()
    for epoch in range(args.epochs):
        gen = torch.Generator().manual_seed(args.seed * 1000003 + epoch)
        mine = torch.randperm(n, generator=gen)[rank::args.world]
        for step in range(steps_per_epoch):
            idx = mine[step * args.local_batch:(step + 1) * args.local_batch]
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(ddp(train_x[idx]), train_y[idx])
            loss.backward()  # DDP all-reduces (averages) the gradients here
            optimizer.step()
            samples += args.local_batch * args.world
    dist.barrier()
    elapsed = time.perf_counter() - start

    if rank == 0:
        acc = accuracy(net, test_x, test_y)
        print(json.dumps({
            "model": args.model,
            "world": args.world,
            "local_batch": args.local_batch,
            "epochs": args.epochs,
            "train_seconds": round(elapsed, 3),
            "samples_per_second": round(samples / elapsed, 1),
            "test_accuracy": round(acc, 4),
            "samples": samples,
            "steps": steps_per_epoch * args.epochs,
            "threads": args.threads,
            "lr": args.lr,
            "momentum": args.momentum,
            "torch": torch.__version__,
            "fp16_hook": args.fp16_hook,
            "powersgd_rank": args.powersgd_rank,
            "powersgd_warmup": max(2, args.powersgd_warmup) if args.powersgd_rank else 0,
        }), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv):
    p = argparse.ArgumentParser(description="PyTorch DDP (Gloo, CPU) reference for Joule's workloads")
    p.add_argument("model", choices=MODELS)
    p.add_argument("world", type=int, help="number of processes (ranks)")
    p.add_argument("local_batch", type=int, help="batch size per rank")
    p.add_argument("epochs", type=int)
    p.add_argument("lr_positional", nargs="?", type=float, default=None, metavar="LR",
                   help="learning rate (same as --lr)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=None,
                   help="rendezvous port (default $MASTER_PORT, else a free one)")
    p.add_argument("--rank", type=int, default=None,
                   help="run this rank only, in this process (several hosts; needs --port)")
    p.add_argument("--master", default="127.0.0.1", help="rank 0's address (default 127.0.0.1)")
    p.add_argument("--fp16-hook", action="store_true",
                   help="compress gradients to fp16 with DDP's fp16_compress_hook")
    p.add_argument("--powersgd-rank", type=int, default=0, metavar="R",
                   help="compress gradients with DDP's powerSGD_hook at rank R")
    p.add_argument("--powersgd-warmup", type=int, default=2, metavar="N",
                   help="powerSGD_hook: exact allreduce steps first (start_powerSGD_iter; "
                        "at least 2, PyTorch's floor)")
    args = p.parse_args(argv)
    if args.lr_positional is not None:
        args.lr = args.lr_positional
    if args.world < 1 or args.local_batch < 1 or args.epochs < 1 or args.threads < 1:
        p.error("WORLD, LOCAL_BATCH, EPOCHS and --threads must be positive")
    if args.port is None:
        args.port = int(os.environ["MASTER_PORT"]) if os.environ.get("MASTER_PORT") else free_port()
    if not os.path.isdir(DATA_DIR):
        raise SystemExit(f"no Fashion-MNIST at {DATA_DIR} (Debian package dataset-fashion-mnist)")
    if args.rank is not None:
        if not 0 <= args.rank < args.world:
            p.error(f"--rank must be in [0, {args.world})")
        worker(args.rank, args)
    else:
        mp.spawn(worker, args=(args,), nprocs=args.world, join=True)


if __name__ == "__main__":
    main(sys.argv[1:])
