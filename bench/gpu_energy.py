#!/usr/bin/env python3
"""GPU energy as Joule's meter reads it, against pynvml and nvidia-smi over the same window.

    python3 bench/gpu_energy.py --bench build-gpu/bin/joule-bench-nvml [--seconds 10]

Keeps NVML's GPU 0 busy with float32 matrix products (torch) for the whole run (it alone:
CUDA_VISIBLE_DEVICES is set to its UUID for the load and joule-bench-nvml), and meanwhile:
  - samples NVML's total-energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ) through
    pynvml every 10 ms, with CLOCK_REALTIME times;
  - samples `nvidia-smi --query-gpu=power.draw` (W) as fast as it answers;
  - runs joule-bench-nvml over `seconds`: Joule's EnergyMeter with the counter ("nvml")
    and the integrated power reading ("nvml_power", the fallback) over one window, whose
    start and end it prints as CLOCK_REALTIME times.
Then it interpolates the pynvml counter and integrates nvidia-smi's power (trapezoids)
over Joule's window and prints one line per comparison and a JSON line:
  nvml (Joule) / pynvml counter      goal within 2%: the same counter, read twice
  nvml_power (Joule) / pynvml counter  the fallback against the counter
  nvidia-smi power.draw integrated / pynvml counter
Exit 1 with a one-line error when a reader fails; 3 when a ratio is outside 2% (the
first comparison only: the other two are measurements).
"""
import argparse
import bisect
import json
import os
import subprocess
import sys
import threading
import time


def interpolate(samples, t):
    """Linear interpolation of [(time, value)] at t (clamped to the ends)."""
    times = [s[0] for s in samples]
    i = bisect.bisect_left(times, t)
    if i <= 0:
        return samples[0][1]
    if i >= len(samples):
        return samples[-1][1]
    (t0, v0), (t1, v1) = samples[i - 1], samples[i]
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", required=True, help="path of joule-bench-nvml")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--ld-library-path", default=None,
                    help="LD_LIBRARY_PATH for joule-bench-nvml (its libraries' prefix)")
    args = ap.parse_args()
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    # One GPU for all three readers and the load: NVML's device 0, named by UUID (CUDA's
    # order differs from NVML's; joule-bench-nvml meters every GPU left visible).
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    os.environ["CUDA_VISIBLE_DEVICES"] = uuid
    import torch  # after CUDA_VISIBLE_DEVICES: cuda:0 is that GPU
    stop = threading.Event()
    counter, smi = [], []

    def load():
        x = torch.randn(8192, 8192, device="cuda")
        while not stop.is_set():
            for _ in range(10):
                x = (x @ x).clamp_(-1, 1)
            torch.cuda.synchronize()

    def sample_counter():  # a failure leaves the list short: checked after the window
        while not stop.is_set():
            counter.append((time.time(), pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0))
            time.sleep(0.01)

    def sample_smi():
        while not stop.is_set():
            out = subprocess.run(["nvidia-smi", "-i", uuid, "--query-gpu=power.draw",
                                  "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, check=True).stdout
            smi.append((time.time(), float(out.strip().split()[0])))

    if not os.access(args.bench, os.X_OK):
        print(f"gpu_energy: no program {args.bench}", file=sys.stderr)
        return 1
    env = dict(os.environ)
    if args.ld_library_path is not None:
        env["LD_LIBRARY_PATH"] = args.ld_library_path
    threads = [threading.Thread(target=f, daemon=True) for f in (load, sample_counter, sample_smi)]
    for t in threads:
        t.start()
    try:
        time.sleep(2.0)  # the load at its steady power before the window opens
        run = subprocess.run([args.bench, "--seconds", str(args.seconds)], capture_output=True,
                             text=True, env=env)
        time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    if run.returncode != 0:
        print(f"gpu_energy: joule-bench-nvml failed: {run.stderr.strip()}", file=sys.stderr)
        return 1
    joule = json.loads(run.stdout.strip().splitlines()[-1])
    t0, t1 = joule["start_unix"], joule["end_unix"]
    for name, samples in (("pynvml's energy counter", counter), ("nvidia-smi", smi)):
        if not samples or samples[0][0] > t0 or samples[-1][0] < t1:
            print(f"gpu_energy: {name} gave no readings around the window "
                  f"({len(samples)} readings)", file=sys.stderr)
            return 1
    if len(joule["joules"].get("nvml", {})) != 1:
        print(f"gpu_energy: joule-bench-nvml metered {sorted(joule['joules'].get('nvml', {}))}, "
              f"not the one GPU {uuid}", file=sys.stderr)
        return 1
    counter_j = interpolate(counter, t1) - interpolate(counter, t0)
    inside = [s for s in smi if t0 <= s[0] <= t1]
    pts = [(t0, interpolate(smi, t0))] + inside + [(t1, interpolate(smi, t1))]
    smi_j = sum(0.5 * (a[1] + b[1]) * (b[0] - a[0]) for a, b in zip(pts, pts[1:]))
    nvml_j = sum(joule["joules"].get("nvml", {}).values())
    power_j = sum(joule["joules"].get("nvml_power", {}).values())
    res = {
        "window_seconds": t1 - t0,
        "average_watts": counter_j / (t1 - t0),
        "pynvml_counter_joules": counter_j,
        "joule_nvml_joules": nvml_j,
        "joule_nvml_power_joules": power_j,
        "nvidia_smi_joules": smi_j,
        "nvidia_smi_samples": len(inside),
        "ratio_nvml": nvml_j / counter_j,
        "ratio_nvml_power": power_j / counter_j,
        "ratio_nvidia_smi": smi_j / counter_j,
    }
    print(f"window {res['window_seconds']:.2f} s at {res['average_watts']:.0f} W: "
          f"pynvml counter {counter_j:.1f} J")
    print(f"Joule nvml (counter)       {nvml_j:.1f} J, ratio {res['ratio_nvml']:.4f}")
    print(f"Joule nvml_power (fallback) {power_j:.1f} J, ratio {res['ratio_nvml_power']:.4f}")
    print(f"nvidia-smi power.draw       {smi_j:.1f} J over {len(inside)} readings, "
          f"ratio {res['ratio_nvidia_smi']:.4f}")
    print(json.dumps(res))
    return 0 if abs(res["ratio_nvml"] - 1) <= 0.02 else 3


if __name__ == "__main__":
    sys.exit(main())
