#!/usr/bin/python3
"""Writes an ImageFolder-layout dataset (train/CLASS/*.jpg|png, val/CLASS/...) made from
Fashion-MNIST, for trying imagefolder: jobs and the paper's recipe shrunk, without ImageNet.

Each 28x28 grey image is scaled to --side pixels (bicubic), tinted with a per-image colour
so that the three channels differ, and saved alternately as JPEG (quality 90) and PNG, so
both decoders are exercised (--format jpg: all JPEG, as ImageNet is). Needs Debian's python3-pil and python3-numpy.

  scripts/make-imagefolder.py OUT [--train-per-class 100] [--val-per-class 20] [--side 48]
"""
import argparse
import gzip
import os
import struct
import sys

import numpy as np
from PIL import Image

CLASSES = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker",
           "bag", "ankle-boot"]


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    zero, dtype, dims = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def write_split(out, images, labels, per_class, side, rng, fmt):
    counts = [0] * len(CLASSES)
    for i in range(len(labels)):
        c = int(labels[i])
        if counts[c] >= per_class:
            continue
        counts[c] += 1
        d = os.path.join(out, CLASSES[c])
        os.makedirs(d, exist_ok=True)
        grey = Image.fromarray(images[i]).resize((side, side), Image.BICUBIC)
        tint = rng.uniform(0.6, 1.0, size=3)
        rgb = (np.asarray(grey, dtype=np.float32)[:, :, None] * tint).astype(np.uint8)
        img = Image.fromarray(rgb, "RGB")
        if fmt == "jpg" or (fmt == "mixed" and counts[c] % 2):
            img.save(os.path.join(d, f"{i:05d}.jpg"), quality=90)
        else:
            img.save(os.path.join(d, f"{i:05d}.png"))
        if min(counts) >= per_class:
            break


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--train-per-class", type=int, default=100)
    p.add_argument("--val-per-class", type=int, default=20)
    p.add_argument("--side", type=int, default=48)
    p.add_argument("--format", choices=["mixed", "jpg", "png"], default="mixed",
                   help="mixed (alternate JPEG and PNG), or all JPEG (as ImageNet), or all PNG")
    p.add_argument("--source", default="/usr/share/datasets/fashion-mnist")
    a = p.parse_args()
    if a.side < 8 or a.side > 1024 or a.train_per_class < 1 or a.val_per_class < 1:
        sys.exit("make-imagefolder: --side must be in [8, 1024] and the counts >= 1")
    rng = np.random.default_rng(0)
    for split, prefix, n in (("train", "train", a.train_per_class),
                             ("val", "t10k", a.val_per_class)):
        images = read_idx(os.path.join(a.source, f"{prefix}-images-idx3-ubyte.gz"))
        labels = read_idx(os.path.join(a.source, f"{prefix}-labels-idx1-ubyte.gz"))
        write_split(os.path.join(a.out, split), images, labels, n, a.side, rng, a.format)
    print(f"make-imagefolder: wrote {a.out} ({a.train_per_class} train and "
          f"{a.val_per_class} val images per class, {a.side}x{a.side})")


if __name__ == "__main__":
    main()
