#!/usr/bin/python3
"""The reference for joule-bench-images: torchvision's ImageFolder with PIL and the same
transforms (RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize), through
PyTorch's DataLoader with `--workers` worker processes (0: in this process).

  image_pipeline_reference.py DIR [--images N] [--workers W] [--size S] [--scale-min F]

Prints one JSON line like joule-bench-images. Needs Debian's python3-torch,
python3-torchvision and python3-pil.
"""
import argparse
import json
import resource
import time

import torch
from torchvision import datasets, transforms


def cpu_seconds():
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        u = resource.getrusage(who)
        total += u.ru_utime + u.ru_stime
    return total


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--scale-min", type=float, default=0.08)
    p.add_argument("--batch", type=int, default=64)
    a = p.parse_args()
    torch.set_num_threads(1)
    tf = transforms.Compose([
        transforms.RandomResizedCrop(a.size, scale=(a.scale_min, 1.0)),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])
    ds = datasets.ImageFolder(a.dir + "/train", transform=tf)
    sampler = torch.utils.data.RandomSampler(ds, replacement=True, num_samples=a.images + 2 * a.batch)
    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch, sampler=sampler,
                                         num_workers=a.workers, drop_last=True)
    it = iter(loader)
    next(it)  # warm-up batch, as joule-bench-images does
    cpu0, t0, done = cpu_seconds(), time.monotonic(), 0
    while done < a.images:
        x, _ = next(it)
        done += x.shape[0]
    seconds = time.monotonic() - t0
    cpu = cpu_seconds() - cpu0
    cores = max(1, a.workers)
    print(json.dumps({
        "pipeline": "torchvision-pil", "images": done, "threads": cores,
        "seconds": round(seconds, 3), "cpu_seconds": round(cpu, 3),
        "images_per_second": round(done / seconds, 1),
        "images_per_second_per_thread": round(done / seconds / cores, 1),
    }))


if __name__ == "__main__":
    main()
