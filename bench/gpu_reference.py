#!/usr/bin/env python3
"""PyTorch eager on one GPU: the reference Joule's GPU trainer is measured against.

    python3 bench/gpu_reference.py [--model resnet50] [--batch 128] [--image 3x224x224]
        [--classes 1000] [--steps 40] [--warmup 10] [--modes fp32,channels_last,bf16]

Trains torchvision's model (random init, SGD lr 0.1 momentum 0.9, cross-entropy) on
synthetic images the way Joule's trainer is fed: a host-side set of batches (uniform
[0, 1) pixels, random labels) copied to the GPU every step. Each mode runs `warmup`
steps, then times `steps` steps between CUDA events (synchronised before and after):

  fp32           float32 NCHW, cuDNN's default algorithms (PyTorch's defaults: TF32 for
                 convolutions on, for matmuls off), as Joule's trainer runs today
  channels_last  float32 with the model and inputs in channels-last (NHWC) memory format
  bf16           channels-last under torch.autocast(device_type="cuda", dtype=bfloat16)

One line per mode ("MODE: N images/s, M ms/step, peak memory G GiB"), then one JSON line
with every figure ({"model", "batch", "modes": {MODE: {"images_per_second", ...}}}).
Needs torch and torchvision with CUDA; exits 1 with a one-line error without a GPU.
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--image", default="3x224x224", help="CxHxW")
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--modes", default="fp32,channels_last,bf16")
    args = ap.parse_args()
    import torch
    import torchvision

    if not torch.cuda.is_available():
        print("gpu_reference: no CUDA device", file=sys.stderr)
        return 1
    c, h, w = (int(v) for v in args.image.split("x"))
    dev = torch.device("cuda")
    # Host batches, as Joule's prefetcher hands them to the training step (pageable
    # memory: Joule copies with Tensor::to, no pinning).
    host_x = [torch.rand(args.batch, c, h, w) for _ in range(4)]
    host_y = [torch.randint(0, args.classes, (args.batch,)) for _ in range(4)]
    results = {}
    for mode in args.modes.split(","):
        torch.manual_seed(0)
        model = getattr(torchvision.models, args.model)(num_classes=args.classes)
        if c != 3:
            model.conv1 = torch.nn.Conv2d(c, 64, 7, 2, 3, bias=False)
        model = model.to(dev)
        fmt = torch.channels_last if mode in ("channels_last", "bf16") else torch.contiguous_format
        model = model.to(memory_format=fmt)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()

        def step(i):
            x = host_x[i % 4].to(dev).contiguous(memory_format=fmt)
            y = host_y[i % 4].to(dev)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=mode == "bf16"):
                loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss

        torch.cuda.reset_peak_memory_stats()
        for i in range(args.warmup):
            step(i)
        torch.cuda.synchronize()
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        for i in range(args.steps):
            loss = step(i)
            loss.item()  # one host synchronisation a step, as Joule's trainer has
        t1.record()
        torch.cuda.synchronize()
        ms = t0.elapsed_time(t1) / args.steps
        r = {
            "images_per_second": args.batch * 1000.0 / ms,
            "ms_per_step": ms,
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
        }
        results[mode] = r
        print(f"{mode}: {r['images_per_second']:.1f} images/s, {ms:.2f} ms/step, "
              f"peak memory {r['peak_memory_gib']:.1f} GiB", flush=True)
        del model, opt
        torch.cuda.empty_cache()
    print(json.dumps({"model": args.model, "batch": args.batch, "image": args.image,
                      "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
                      "modes": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
