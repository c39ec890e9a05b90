#!/usr/bin/env python3
"""BLOOM decode steps from an Nsight Systems CUDA GPU trace (the CSV timeline.sh writes), at any
batch: per kernel of a layer, how long it holds the chain of dependent kernels (its end minus
the end of the kernel before it), when it starts against that end (negative: it started early,
under programmatic dependent launch) and its duration; medians over layers 1-22 of the steady
steps (the last three quarters of the steps with the most common kernel count). A step is the
kernels from one uploads kernel to the next; a layer is the kernels from its first one (those
before its attention: the count between the step's embedding LayerNorm and the first attention)
to the next layer's. Also each kernel after the last layer to the step's end (the lm_head, the
token selection). Usage: timeline_layers.py TRACE.csv"""
import csv
import re
import statistics
import sys
from collections import Counter, defaultdict


def kernels(path):
    out = []
    for r in csv.DictReader(open(path)):
        if not r["GrdX"]:
            continue  # copies and memsets
        m = re.search(r"::(\w+_kernel)", r["Name"])
        name = (m.group(1) if m else r["Name"][:40]) + f"({r['GrdX']},{r['GrdY']},{r['GrdZ']})"
        out.append((int(r["Start (ns)"]), int(r["Duration (ns)"]), name))
    return sorted(out)


def main():
    rows = kernels(sys.argv[1])
    ups = [i for i, (_, _, n) in enumerate(rows) if n.startswith("uploads_kernel")]
    steps = [rows[a:b] for a, b in zip(ups, ups[1:])]
    if not steps:
        raise SystemExit("no decode steps found (no uploads kernels)")
    common = Counter(len(s) for s in steps).most_common(1)[0][0]
    steps = [s for s in steps if len(s) == common]
    used = steps[len(steps) // 4:]
    seg = used[0]
    att = [i for i, (_, _, n) in enumerate(seg) if "attention" in n]
    if len(att) < 4:
        raise SystemExit("fewer than 4 attention kernels in a step: not a BLOOM decode step")
    period, pre = att[1] - att[0], att[0] - 2  # after the uploads and the embedding LayerNorm
    print(f"{len(used)} steady steps of {common} kernels; {len(att)} layers of {period} kernels")
    hold, start, dur, name = defaultdict(list), defaultdict(list), defaultdict(list), {}
    tail = defaultdict(list)
    last_end = att[-1] - pre + period
    for seg in used:
        def measure(k):
            prev_end = seg[k - 1][0] + seg[k - 1][1]
            return ((seg[k][0] + seg[k][1] - prev_end) / 1000, (seg[k][0] - prev_end) / 1000,
                    seg[k][1] / 1000)
        for layer in range(1, len(att) - 1):
            for role in range(period):
                k = att[layer] - pre + role
                h, s, d = measure(k)
                hold[role].append(h)
                start[role].append(s)
                dur[role].append(d)
                name[role] = seg[k][2]
        for k in range(last_end, len(seg)):
            tail[k].append((measure(k)[0], seg[k][2]))
    total = 0.0
    for role in range(period):
        h = statistics.median(hold[role])
        total += h
        print(f"{name[role]:48s} hold {h:6.2f}  start {statistics.median(start[role]):6.2f}"
              f"  dur {statistics.median(dur[role]):6.2f}  (us)")
    print(f"a layer holds the chain {total:.2f} us")
    print("after the last layer (hold, us):")
    for k in sorted(tail):
        print(f"  {tail[k][0][1]:46s} {statistics.median(h for h, _ in tail[k]):7.2f}")
    spans = [(s[-1][0] + s[-1][1] - s[1][0]) / 1000 for s in used]
    print(f"step span (the first kernel after the uploads to the step's last) median "
          f"{statistics.median(spans):.1f} us")


if __name__ == "__main__":
    main()
