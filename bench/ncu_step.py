#!/usr/bin/env python3
"""Sums an Nsight Compute CSV (`ncu --metrics gpu__time_duration.sum --csv --log-file F ...`) of a
`wren bench batch ... --steps N` run into the device time of one decode step, grouped by kernel.

    python3 bench/ncu_step.py F KERNELS_PER_STEP

The last KERNELS_PER_STEP kernels of the log are taken as one step (the run's final step). Prints
the step's total device time, its kernel count, and the time per kernel name (summed over the
step's launches of that name), largest first. Units: microseconds."""
import csv
import sys
from collections import defaultdict


def main():
    path, per_step = sys.argv[1], int(sys.argv[2])
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own notes come before the CSV
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "")
        us = v / 1e3 if unit in ("nsecond", "ns") else v * 1e3 if unit in ("msecond", "ms") else v
        rows.append((r["Kernel Name"], us))
    if len(rows) < per_step:
        sys.exit(f"{path}: {len(rows)} kernels, fewer than the {per_step} of one step")
    step = rows[-per_step:]
    total = sum(us for _, us in step)
    by = defaultdict(lambda: [0.0, 0])
    for name, us in step:
        key = name.split("(")[0][:90]
        by[key][0] += us
        by[key][1] += 1
    print(f"one step: {total:.1f} us of device time in {len(step)} kernels")
    for key, (us, n) in sorted(by.items(), key=lambda kv: -kv[1][0]):
        print(f"  {us:8.1f} us {100 * us / total:5.1f}%  {n:3d}x  {key}")


if __name__ == "__main__":
    main()
