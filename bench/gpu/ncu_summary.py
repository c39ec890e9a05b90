#!/usr/bin/env python3
"""Kernel times of a kiln run profiled by Nsight Compute (`ncu --csv --metrics
gpu__time_duration.sum`): per kernel and grid, how many launches and their mean and total
microseconds, largest total first. Decode-step kernels are the ones launched once per step.
Usage: ncu_summary.py NCU.csv [STEPS]"""
import collections, csv, sys

rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))
        if r.get("Metric Name") == "gpu__time_duration.sum"]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 0
groups = collections.defaultdict(list)
for r in rows:
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3,
             "msecond": 1e3}.get(r["Metric Unit"], 1.0)
    name = r["Kernel Name"].replace("void ", "").replace("(anonymous namespace)::", "")
    name = name.split("<")[0].split("(")[0][-40:]
    groups[(name, r["Grid Size"], r["Block Size"])].append(float(r["Metric Value"].replace(",", "")) * scale)
total = sum(sum(v) for v in groups.values())
print(f"{len(rows)} kernels, {total:.1f} us in all")
print(f"{'kernel':40} {'grid':>16} {'block':>12} {'launches':>8} {'mean us':>8} {'total us':>9}")
for (name, grid, block), v in sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:40]:
    print(f"{name:40} {grid:>16} {block:>12} {len(v):8d} {sum(v)/len(v):8.2f} {sum(v):9.1f}")
if steps:
    per_step = [sum(v) / steps for v in groups.values() if len(v) % steps == 0]
    print(f"kernels launched a multiple of {steps} times: {sum(per_step):.1f} us per step")
