#!/usr/bin/env python3
"""Where a served GPU's time goes: summarizes Nsight Systems' cuda_gpu_trace and cuda_api_trace
CSVs of a `kiln serve` under load (profile_serve.sh).

Prints, over the traced window: the GPU's busy share (the union of its kernels and copies);
its idle gaps by size, and for the gaps of 20 us or more what started the work after them (the
API call that launched the next kernel) and what the launching thread called during the gap;
the graph launches grouped by their kernel count (a step of one graph, e.g. the decoder's or the
encoder's) with their spans; the kernels launched one by one (eager steps); and per API call
name of the launching thread its count and total time.
Usage: serve_timeline.py GPU_TRACE.csv API_TRACE.csv"""
import csv
import statistics
import sys
from collections import Counter, defaultdict


def column(header, *names):
    for i, h in enumerate(header):
        if any(h.startswith(n) for n in names):
            return i
    raise SystemExit(f"no column {names} in {header}")


def read(path):
    table = list(csv.reader(open(path)))
    return table[0], [r for r in table[1:] if len(r) == len(table[0])]


gh, grows = read(sys.argv[1])
ah, arows = read(sys.argv[2])
g_start, g_dur = column(gh, "Start"), column(gh, "Duration")
g_corr, g_name = column(gh, "CorrId", "Corr"), column(gh, "Name")
a_start, a_dur = column(ah, "Start"), column(ah, "Duration")
a_corr, a_name, a_tid = column(ah, "CorrID", "CorrId", "Corr"), column(ah, "Name"), column(ah, "Tid", "TID")

apis = []  # (start, end, name, tid, corr)
for r in arows:
    s, d = int(r[a_start]), int(r[a_dur])
    apis.append((s, s + d, r[a_name], r[a_tid], r[a_corr]))
apis.sort()
by_corr = {a[4]: a for a in apis}

work = []  # (start, end, name, corr)
for r in grows:
    s, d = int(r[g_start]), int(r[g_dur])
    work.append((s, s + d, r[g_name], r[g_corr]))
work.sort()
if not work:
    raise SystemExit("no GPU work in the trace")
# The launching thread: the one that made the most launches.
launches = Counter(by_corr[w[3]][3] for w in work if w[3] in by_corr)
engine = launches.most_common(1)[0][0] if launches else None

t0, t1 = work[0][0], max(w[1] for w in work)
window = t1 - t0
busy, end, gaps = 0, work[0][0], []
for s, e, name, corr in work:
    if s > end:
        gaps.append((end, s, corr))
    busy += max(0, e - max(s, end))
    end = max(end, e)
print(f"window {window / 1e6:.1f} ms, GPU busy {busy / 1e6:.1f} ms = {100 * busy / window:.1f} %,"
      f" idle {(window - busy) / 1e6:.1f} ms in {len(gaps)} gaps")
bins = [(0, 5), (5, 20), (20, 100), (100, 500), (500, 10**9)]
for lo, hi in bins:
    sel = [e - s for s, e, _ in gaps if lo * 1000 <= e - s < hi * 1000]
    label = f"{lo}-{hi} us" if hi < 10**9 else f">= {lo} us"
    print(f"  gaps {label:>12}: {len(sel):6d}, {sum(sel) / 1e6:8.1f} ms")

# What ended each gap of 20 us or more, and what the launching thread called during it.
ender = defaultdict(lambda: [0, 0])
during = defaultdict(lambda: [0, 0])
engine_apis = [a for a in apis if a[3] == engine]
starts = [a[0] for a in engine_apis]
import bisect

for s, e, corr in gaps:
    if e - s < 20000:
        continue
    name = by_corr[corr][2] if corr in by_corr else "?"
    ender[name][0] += 1
    ender[name][1] += e - s
    i = bisect.bisect_left(starts, s)
    names = Counter()
    while i < len(engine_apis) and engine_apis[i][0] < e:
        names[engine_apis[i][2]] += 1
        i += 1
    # The call the thread was in when the gap began (a wait that ended then, or host work).
    j = bisect.bisect_right(starts, s) - 1
    before = engine_apis[j][2] if j >= 0 and engine_apis[j][1] >= s - 2000 else "host code"
    sig = f"in: {before}; then " + ", ".join(
        f"{n}" + (f" x{c}" if c > 1 else "") for n, c in sorted(names.items(), key=lambda x: -x[1])[:4])
    during[sig][0] += 1
    during[sig][1] += e - s
print("gaps >= 20 us, by the call that launched the work after them:")
for name, (n, t) in sorted(ender.items(), key=lambda x: -x[1][1])[:8]:
    print(f"  {name[:60]:60s} {n:6d} gaps, {t / 1e6:8.1f} ms")
print("gaps >= 20 us, by what the launching thread did in them (top 12 by time):")
for sig, (n, t) in sorted(during.items(), key=lambda x: -x[1][1])[:12]:
    print(f"  {n:6d} gaps, {t / 1e6:8.1f} ms, mean {t / n / 1e3:7.1f} us | {sig[:150]}")

# Graph launches: the kernels of one cudaGraphLaunch share its correlation id.
per_launch = defaultdict(list)
eager = []
for s, e, name, corr in work:
    api = by_corr.get(corr)
    if api and "Graph" in api[2]:
        per_launch[corr].append((s, e))
    elif "memcpy" not in name.lower() and "memset" not in name.lower():
        eager.append((s, e, corr))
groups = defaultdict(list)
for corr, ks in per_launch.items():
    groups[len(ks)].append(max(e for _, e in ks) - min(s for s, _ in ks))
print("graph launches by kernel count: launches, median / mean span us, total ms")
for n, spans in sorted(groups.items(), key=lambda x: -sum(x[1]))[:10]:
    print(f"  {n:5d} kernels: {len(spans):6d}, {statistics.median(spans) / 1e3:8.1f} /"
          f" {statistics.mean(spans) / 1e3:8.1f}, {sum(spans) / 1e6:8.1f}")
eager_time = sum(e - s for s, e, _ in eager)
print(f"eager kernels: {len(eager)}, {eager_time / 1e6:.1f} ms of kernel time")
print("API calls of the launching thread: count, total ms, mean us")
tot = defaultdict(lambda: [0, 0])
for a in engine_apis:
    tot[a[2]][0] += 1
    tot[a[2]][1] += a[1] - a[0]
for name, (n, t) in sorted(tot.items(), key=lambda x: -x[1][1])[:14]:
    print(f"  {name[:50]:50s} {n:7d} {t / 1e6:9.1f} {t / n / 1e3:8.1f}")
