#!/usr/bin/env python3
"""Loads a model `joule export` wrote into PyTorch and checks it predicts as Joule did.

usage: check_export.py MODEL.npz|MODEL.pt HIDDEN (e.g. 64,32) MAX_TEST_SAMPLES ACCURACY

A .pt file is TorchScript: torch.jit.load runs it as it is (HIDDEN unused).

Builds PyTorch's equivalent of Joule's mlp (Flatten, then Linear+ReLU per hidden width,
then Linear to 10 classes: the state dict keys "1.weight", "1.bias", "3.weight", ...),
loads the .npz with strict key and shape checking, evaluates it on the first
MAX_TEST_SAMPLES images of Fashion-MNIST's test split (pixels / 255, as Joule reads them)
and fails unless its accuracy equals ACCURACY (Joule's, from the job's report) within
half an example. Exit 0 on success, 1 on a mismatch, 77 without torch or numpy.
"""
import gzip
import os
import struct
import sys

try:
    import numpy as np
    import torch
except ImportError as e:  # the test's skip
    print(f"check_export: SKIP: {e}")
    sys.exit(77)

ROOT = "/usr/share/datasets/fashion-mnist"


def idx(stem):
    for name in (stem, stem + ".gz"):
        path = os.path.join(ROOT, name)
        if os.path.exists(path):
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rb") as f:
                data = f.read()
            _, _, dims = struct.unpack(">HBB", data[:4])
            shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
            return np.frombuffer(data[4 + 4 * dims:], dtype=np.uint8).reshape(shape)
    raise FileNotFoundError(os.path.join(ROOT, stem))


def main():
    path, hidden, max_test, want = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    if path.endswith(".pt"):
        model = torch.jit.load(path)
    else:
        model = state_dict_model(path, hidden)
    images = idx("t10k-images-idx3-ubyte")[:max_test].astype(np.float32) / 255.0
    labels = idx("t10k-labels-idx1-ubyte")[:max_test].astype(np.int64)
    with torch.no_grad():
        logits = model(torch.from_numpy(images).reshape(-1, 1, 28, 28))
    accuracy = float((logits.argmax(1) == torch.from_numpy(labels)).float().mean())
    print(f"check_export: {len(labels)} test images, accuracy {accuracy:.6f} (Joule: {want:.6f})")
    if abs(accuracy - want) > 0.5 / len(labels):
        print("check_export: FAIL: the exported model does not predict as Joule's did",
              file=sys.stderr)
        return 1
    return 0


def state_dict_model(path, hidden):
    widths = [int(h) for h in hidden.split(",") if h]
    layers = [torch.nn.Flatten()]
    width = 28 * 28
    for h in widths:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    layers.append(torch.nn.Linear(width, 10))
    model = torch.nn.Sequential(*layers)
    arrays = np.load(path)
    state = {k: torch.from_numpy(arrays[k].copy()) for k in arrays.files}
    model.load_state_dict(state, strict=True)  # names and shapes must match exactly
    return model


if __name__ == "__main__":
    sys.exit(main())
