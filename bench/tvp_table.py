#!/usr/bin/env python3
"""Markdown tables of threads against processes from `joule sweep run -o json` files.

usage: python3 bench/tvp_table.py SWEEP.json...

Each file is one algorithm's sweep (bench/sweeps/tvp-*.yaml). A cell's key is
"field=value,..."; its mode is workers x intra_op_threads, the rest of the key its ladder
step. Prints a summary (per ladder step: the serial time, and for the shared-memory
(1 x 2), distributed-memory (2 x 1) and mixed (2 x 2) modes the speedup, the efficiency and
the energy against serial) and then every cell.
"""
import json
import os
import sys

ALGORITHMS = {"tvp-logreg-sgd": "logreg, SGD", "tvp-logreg-ga": "logreg, GA",
              "tvp-mlp-sgd": "mlp, SGD"}
MODES = [(1, 1), (1, 2), (2, 1), (2, 2)]
MODE_NAMES = {(1, 1): "serial", (1, 2): "1 worker x 2 threads", (2, 1): "2 workers x 1 thread",
              (2, 2): "2 workers x 2 threads"}


def split(key):
    """(ladder step, (workers, threads)) of a cell key."""
    ladder, workers, threads = [], 1, 1
    depth, part, parts = 0, "", []
    for ch in key:  # commas inside [...] belong to a list value
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(part)
            part = ""
        else:
            part += ch
    parts.append(part)
    for p in parts:
        field, _, value = p.partition("=")
        if field == "workers":
            workers = int(value)
        elif field in ("intra_op_threads", "intraOpThreads"):
            threads = int(value)
        else:
            ladder.append(p)
    return ", ".join(ladder), (workers, threads)


def main(paths):
    summary, full = [], []
    summary.append("| algorithm | ladder step | serial s | 1x2 threads: speedup / eff / energy |"
                   " 2x1 processes: speedup / eff / energy | 2x2: speedup / eff / energy |"
                   " serial accuracy |")
    summary.append("|---|---|---:|---:|---:|---:|---:|")
    full.append("| algorithm | ladder step | mode | wall s | +- | speedup | efficiency |"
                " avg W | energy J | accuracy |")
    full.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    estimated = False
    for path in paths:
        name = os.path.basename(path).removesuffix(".json")
        algorithm = ALGORITHMS.get(name, name)
        with open(path) as f:
            cells = json.load(f)["cells"]
        steps = {}
        for c in cells:
            step, mode = split(c["cell"])
            steps.setdefault(step, {})[mode] = c
            estimated = estimated or c["energy_source"] == "estimated"
        for step, modes in steps.items():
            serial = modes.get((1, 1))
            cols = []
            for mode in MODES[1:]:
                c = modes.get(mode)
                if not c or not serial or not c["succeeded"] or not serial["succeeded"]:
                    cols.append("-")
                    continue
                energy = ("%.2fx" % (c["energy_joules_mean"] / serial["energy_joules_mean"])
                          if serial["energy_joules_mean"] > 0 else "-")
                cols.append("%.2f / %.2f / %s" % (c["speedup"], c["efficiency"], energy))
            summary.append("| %s | %s | %s | %s | %s |" % (
                algorithm, step, "%.2f" % serial["wall_seconds_mean"] if serial else "-",
                " | ".join(cols),
                "%.4f" % serial["test_accuracy_mean"] if serial else "-"))
            for mode in MODES:
                c = modes.get(mode)
                if not c:
                    continue
                full.append("| %s | %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f | %.4f |" % (
                    algorithm, step, MODE_NAMES[mode], c["wall_seconds_mean"],
                    c["wall_seconds_sd"], c["speedup"], c["efficiency"], c["average_watts"],
                    c["energy_joules_mean"], c["test_accuracy_mean"]))
    print("\n".join(summary))
    print()
    print("\n".join(full))
    if estimated:
        print("\nEnergy is `estimated` (CPU time x watts per core; no RAPL on this host).")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
