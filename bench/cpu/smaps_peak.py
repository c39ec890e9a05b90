#!/usr/bin/env python3
"""What a process's peak resident memory holds: runs COMMAND, samples /proc/PID/smaps every few
milliseconds while it runs, and at the sample of the largest total prints each mapping's
resident MiB (mappings of the same name and size summed: "[anon] 4MiB" x 17 is one line). The
1 GiB anonymous mapping of `kiln bench`'s bandwidth probe is left out of the total (the bench's
own peak_memory_bytes leaves it out too). The sampler takes CPU: read its times with care.
Usage: smaps_peak.py COMMAND [ARGS...]   (e.g. smaps_peak.py build/kiln bench --plan p --batch 16)"""
import collections
import re
import subprocess
import sys
import time

PROBE = "[anon] 1024MiB"


def snapshot(pid):
    maps, current = collections.Counter(), None
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                    parts = line.split()
                    start, end = (int(x, 16) for x in parts[0].split("-"))
                    name = parts[5] if len(parts) > 5 else "[anon]"
                    current = f"{name} {(end - start) >> 20}MiB"
                elif line.startswith("Rss:"):
                    maps[current] += int(line.split()[1])
    except OSError:
        return None
    return maps


def main():
    proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    best_total, best = 0, None
    while proc.poll() is None:
        maps = snapshot(proc.pid)
        if maps:
            total = sum(v for k, v in maps.items() if k != PROBE)
            if total > best_total:
                best_total, best = total, maps
        time.sleep(0.003)
    print(proc.stdout.read().decode()[-2000:])
    print(f"peak resident {best_total / 1024:.1f} MiB (the bandwidth probe's buffer left out)")
    for name, kib in sorted((best or {}).items(), key=lambda kv: -kv[1]):
        if kib > 1024 and name != PROBE:
            print(f"{kib / 1024:9.1f} MiB  {name}")


if __name__ == "__main__":
    main()
