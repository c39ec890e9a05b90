#!/usr/bin/env python3
"""Host CPU samples of a `kiln bench` run in the windows between a long stream wait (an encoder
step of more than 2 ms) and the next long event wait (more than 1 ms: the first decode step):
which functions the host runs while the GPU waits for it (host_profile.sh; reads the sqlite
export of an `nsys profile --sample=process-tree --backtrace=fp` report). Prints the windows'
lengths, the sampled leaf functions and the functions on the sampled stacks."""
import sqlite3, sys
from collections import Counter
db = sqlite3.connect(sys.argv[1])
cur = db.cursor()
tables = [r[0] for r in cur.execute("select name from sqlite_master where type='table'")]
def cols(t):
    return [r[1] for r in cur.execute(f"pragma table_info({t})")]
print([t for t in tables if "RUNTIME" in t or "API" in t])
rt = [t for t in tables if "RUNTIME" in t][0]
s = dict(cur.execute("select id, value from StringIds"))
api = [(a, b, s.get(n, "?")) for a, b, n in cur.execute(
    f"select start, end, nameId from {rt} order by start")]
windows = []
for i, (a, b, n) in enumerate(api):
    if "StreamSynchronize" in n and b - a > 2_000_000:
        # to the next event sync longer than 1 ms
        for a2, b2, n2 in api[i + 1:]:
            if "EventSynchronize" in n2 and b2 - a2 > 1_000_000:
                windows.append((b, a2))
                break
print("windows (us):", [round((e - s0) / 1000, 1) for s0, e in windows])
samples = list(cur.execute("select id, start from COMPOSITE_EVENTS"))
inwin = set()
for sid, t in samples:
    for w0, w1 in windows:
        if w0 <= t <= w1:
            inwin.add(sid)
print(len(samples), "samples,", len(inwin), "in windows")
leaf, anyf = Counter(), Counter()
chains = {}
for sid, sym, depth in cur.execute("select id, symbol, stackDepth from SAMPLING_CALLCHAINS"):
    if sid not in inwin:
        continue
    name = s.get(sym, str(sym))[:110]
    chains.setdefault(sid, []).append((depth, name))
for sid, ch in chains.items():
    ch.sort()
    leaf[ch[0][1]] += 1
    for n in set(x[1] for x in ch):
        anyf[n] += 1
print("== leaf")
for n, c in leaf.most_common(25):
    print(f"{c:6d} {n}")
print("== inclusive")
for n, c in anyf.most_common(45):
    print(f"{c:6d} {n}")
