#!/usr/bin/env python3
"""Summarizes an Nsight Systems cuda_gpu_trace CSV of a `kiln bench` run (timeline.sh).

The decode steps are the kernels between two uploads of a step's layout (kiln's uploads kernel,
or a group of host-to-device copies in builds before it; groups of fewer than 8 kernels, such as
a run-ahead step's argmax, are left out);
the steps with the most common kernel count, past the first quarter (capture, warm-up), are the
steady ones. Per kernel kind (name and grid) of those: launches per step, the
median duration, the median gap from the end of the kernel before it (negative: they overlap,
programmatic dependent launch) and the total per step; then the step's span against the sum of
its kernels' durations, and the first kernels of one step with their offsets."""
import csv
import statistics
import sys
from collections import Counter, defaultdict


def column(header, *names):
    for i, h in enumerate(header):
        if any(h.startswith(n) for n in names):
            return i
    raise SystemExit(f"no column {names} in {header}")


table = list(csv.reader(open(sys.argv[1])))
header, rows = table[0], table[1:]
i_start, i_dur = column(header, "Start"), column(header, "Duration")
i_name = column(header, "Name")
i_gx, i_gy, i_gz = column(header, "GrdX"), column(header, "GrdY"), column(header, "GrdZ")
events = []
for r in rows:
    if len(r) <= i_name:
        continue
    name = r[i_name]
    lower = name.lower()
    if "memcpy" in lower:
        if "htod" in lower or "host-to-device" in lower:
            events.append((int(r[i_start]), 0, "copy"))
        continue
    if "memset" in lower or r[i_gx] in ("", "0"):
        continue
    short = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    short = short.replace("void ", "")
    short = short.split("(")[0].split("<")[0].strip()[-48:]
    events.append((int(r[i_start]), int(r[i_dur]), f"{short} ({r[i_gx]},{r[i_gy]},{r[i_gz]})"))
events.sort()
steps, current, after_copy = [], [], False
for start, dur, kind in events:
    # A step uploads its layout with host-to-device copies, or (builds since 2026-12-02) with
    # kiln's uploads kernel (which is one of the step's kernels): either starts a new step.
    upload = kind.startswith("kiln::cuda::uploads_kernel")
    if kind == "copy" or upload:
        if current and not after_copy:
            steps.append(current)
            current = []
        after_copy = True
        if upload:
            current.append((start, dur, kind))
        continue
    after_copy = False
    current.append((start, dur, kind))
if current:
    steps.append(current)
if not steps:
    raise SystemExit("no kernels found")
# Run-ahead uploads the next step's layout before the last step's argmax: those few kernels form
# groups of their own; the graph's steps are the groups of many kernels.
long_steps = [s for s in steps if len(s) >= 8]
steps = long_steps or steps
if len(sys.argv) > 2 and sys.argv[2] == "--between":
    # What the GPU does between two decode steps' graphs: every kernel, copy and memset from the
    # end of a step's widest kernel (the lm_head) to the next step's first kernel after its
    # uploads (the uploads kernel, or host-to-device copies in builds before it) and two more,
    # with offsets from the lm_head's end; per position, the medians over the steady steps.
    acts = []
    for r in rows:
        if len(r) <= i_name:
            continue
        name = r[i_name].replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
        name = name.replace("void ", "").split("(")[0].split("<")[0].strip()[-40:]
        grid = f"({r[i_gx]},{r[i_gy]},{r[i_gz]})" if r[i_gx] not in ("", "0") else ""
        lower = r[i_name].lower()
        upload = "uploads" in lower or "htod" in lower or "host-to-device" in lower
        acts.append((int(r[i_start]), int(r[i_dur]), f"{name} {grid}".strip(),
                     int(r[i_gx]) if grid else 0, upload))
    acts.sort()
    widest = max(a[3] for a in acts)
    heads = [k for k, a in enumerate(acts) if a[3] == widest]
    gaps, spans = [], []
    for h, nxt in zip(heads, heads[1:]):
        end = acts[h][0] + acts[h][1]
        last_upload = max((k for k in range(h + 1, nxt) if acts[k][4]), default=None)
        if last_upload is None:
            continue
        first = next((k for k in range(last_upload + 1, nxt) if acts[k][3] > 0), None)
        if first is None:
            continue
        gaps.append((acts[first][0] - end) / 1000)
        spans.append((h, min(first + 2, nxt - 1)))
    steady = list(zip(gaps, spans))[len(gaps) // 4:]
    if not steady:
        raise SystemExit("no two steps found")
    print(f"{len(steady)} steady gaps: lm_head end -> the next step's first kernel after its "
          f"uploads: median {statistics.median(g for g, _ in steady):.1f} us "
          f"(min {min(g for g, _ in steady):.1f}, max {max(g for g, _ in steady):.1f})")
    per_item = defaultdict(list)
    for _, (h, last) in steady:
        end = acts[h][0] + acts[h][1]
        for k in range(h + 1, last + 1):
            per_item[(k - h, acts[k][2])].append(((acts[k][0] - end) / 1000, acts[k][1] / 1000))
    print("median over those gaps, per position: start offset from the lm_head's end, duration (us)")
    for (pos, kind), v in sorted(per_item.items()):
        if len(v) < len(steady) // 2:
            continue
        print(f"  {pos:3d} {statistics.median(o for o, _ in v):8.2f} "
              f"{statistics.median(d for _, d in v):7.2f}  {kind}  (in {len(v)} gaps)")
    sys.exit(0)
if len(sys.argv) > 2 and sys.argv[2] == "--prefill":
    # The prompt step that took the most GPU time (the last such: the measured run, after the
    # warm-up) and the two steps after it (the first decode steps): per kernel kind, its
    # launches and total; the gaps between the steps (the host's share of time to first token).
    busy_of = [sum(d for _, d, _ in s) for s in steps]
    top = max(busy_of)
    i = max(k for k, b in enumerate(busy_of) if b >= 0.8 * top)
    # Copies and memsets from the prompt step's first kernel to the third step's end.
    lo = steps[i][0][0]
    hi = steps[min(i + 2, len(steps) - 1)][-1][0] + steps[min(i + 2, len(steps) - 1)][-1][1]
    copies = defaultdict(lambda: [0, 0.0])
    for r in rows:
        if len(r) <= i_name:
            continue
        lower = r[i_name].lower()
        if ("memcpy" in lower or "memset" in lower) and lo <= int(r[i_start]) <= hi:
            copies[r[i_name][:40]][0] += 1
            copies[r[i_name][:40]][1] += int(r[i_dur]) / 1000
    for kind, (count, us) in sorted(copies.items(), key=lambda kv: -kv[1][1]):
        print(f"  copy {kind:<59} {count:5d} {us:9.1f} us")
    for k in range(i, min(i + 3, len(steps))):
        s = steps[k]
        span = (s[-1][0] + s[-1][1] - s[0][0]) / 1000
        gap = (s[0][0] - (steps[k - 1][-1][0] + steps[k - 1][-1][1])) / 1000 if k > 0 else 0.0
        print(f"step {k - i}: {len(s)} kernels, span {span:.1f} us, kernels add up to "
              f"{busy_of[k] / 1000:.1f} us, {gap:.1f} us after the step before it ended")
        totals = defaultdict(lambda: [0, 0.0])
        for _, dur, kind in s:
            totals[kind][0] += 1
            totals[kind][1] += dur / 1000
        for kind, (count, us) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:14]:
            print(f"  {kind:<64} {count:5d} {us:9.1f} us")
    sys.exit(0)
n, _ = Counter(len(s) for s in steps).most_common(1)[0]
steady = [s for s in steps if len(s) == n]
steady = steady[len(steady) // 4:] or steady
print(f"{len(steps)} steps; {len(steady)} steady steps of {n} kernels")
spans = [(s[-1][0] + s[-1][1] - s[0][0]) / 1000 for s in steady]
busy = [sum(d for _, d, _ in s) / 1000 for s in steady]
print(f"step span {statistics.median(spans):.1f} us (first kernel's start to last kernel's end); "
      f"kernel durations add up to {statistics.median(busy):.1f} us")
per_kind = defaultdict(lambda: ([], []))
for s in steady:
    end = None
    for start, dur, kind in s:
        per_kind[kind][0].append(dur / 1000)
        if end is not None:
            per_kind[kind][1].append((start - end) / 1000)
        end = start + dur
print(f"{'kernel (grid)':<64} {'/step':>5} {'dur us':>8} {'gap us':>8} {'us/step':>8}")
for kind, (durs, gaps) in sorted(per_kind.items(), key=lambda kv: -sum(kv[1][0])):
    per = len(durs) / len(steady)
    d = statistics.median(durs)
    g = statistics.median(gaps) if gaps else 0.0
    print(f"{kind:<64} {per:5.0f} {d:8.2f} {g:8.2f} {per * d:8.1f}")
middle = steady[len(steady) // 2]
print("one steady step, first 16 kernels: offset from its first kernel's start, duration (us)")
for start, dur, kind in middle[:16]:
    print(f"  {(start - middle[0][0]) / 1000:8.2f} {dur / 1000:7.2f}  {kind}")
