#!/usr/bin/env python3
"""BLOOM decode steps at batch 1 from an Nsight Systems CUDA GPU trace (the CSV timeline.sh
writes), per layer role: how long each kernel holds the chain of dependent kernels (its end
minus the end of the kernel before it), when it starts against that end (negative: it started
early, under programmatic dependent launch) and its duration; medians over layers 1-23 of the
steady steps (the last three quarters). A step is the kernels from the embedding LayerNorm
(grid 1,1,1) to the lm_head (the widest GEMV grid); each layer is q/k/v, attention, dense,
dense_h_to_4h, dense_4h_to_h in that order. Also what runs between one step's lm_head and the
next step. Usage: timeline_layers.py TRACE.csv"""
import csv
import re
import statistics
import sys
from collections import defaultdict

ROLES = ["qkv", "attention", "dense", "dense_h_to_4h", "dense_4h_to_h"]


def kernels(path):
    out = []
    for r in csv.DictReader(open(path)):
        if not r["GrdX"]:
            continue  # copies and memsets
        m = re.search(r"::(\w+_kernel)", r["Name"])
        name = (m.group(1) if m else r["Name"][:30]) + f"({r['GrdX']},{r['GrdY']},{r['GrdZ']})"
        out.append((int(r["Start (ns)"]), int(r["Duration (ns)"]), name))
    return sorted(out)


def main():
    rows = kernels(sys.argv[1])
    widest = max((int(n.split("(")[1].split(",")[0]), n) for _, _, n in rows if n.startswith("gemv_kernel"))[1]
    steps, begin = [], None
    for i, (_, _, n) in enumerate(rows):
        if n == "layer_norm_vec_kernel(1,1,1)":
            begin = i
        elif begin is not None and n == widest:
            steps.append((begin, i))
            begin = None
    if not steps:
        raise SystemExit("no decode steps found")
    used = steps[len(steps) // 4:]
    print(f"{len(steps)} steps found; the last {len(used)} used; lm_head {widest}")
    hold, start, dur, grid = defaultdict(list), defaultdict(list), defaultdict(list), {}
    for a, b in used:
        seg = rows[a:b + 1]
        for k in range(1, len(seg) - 1):
            if (k - 1) // len(ROLES) == 0:
                continue  # layer 0: behind the graph's first kernel
            role = ROLES[(k - 1) % len(ROLES)]
            prev_end = seg[k - 1][0] + seg[k - 1][1]
            hold[role].append((seg[k][0] + seg[k][1] - prev_end) / 1000)
            start[role].append((seg[k][0] - prev_end) / 1000)
            dur[role].append(seg[k][1] / 1000)
            grid[role] = seg[k][2]
    total = 0.0
    for role in ROLES:
        h = statistics.median(hold[role])
        total += h
        print(f"{role:14s} {grid[role]:34s} hold {h:.2f}  start {statistics.median(start[role]):.2f}"
              f"  dur {statistics.median(dur[role]):.2f}  (us)")
    print(f"a layer holds the chain {total:.2f} us")
    spans = [(rows[b][0] + rows[b][1] - rows[a][0]) / 1000 for a, b in used]
    print(f"step span (LayerNorm start to lm_head end) median {statistics.median(spans):.1f} us")
    if len(used) > 1:
        (_, b), (a2, _) = used[0], used[1]
        end = rows[b][0] + rows[b][1]
        print("between one step's lm_head and the next step: start from the lm_head's end, duration (us)")
        for s, d, n in rows[b + 1:a2 + 3]:
            print(f"{(s - end) / 1000:7.2f} {d / 1000:6.2f} {n}")


if __name__ == "__main__":
    main()
