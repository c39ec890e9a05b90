#!/usr/bin/env python3
"""Table of a bench/serve/h200.sh run: kiln serve (kiln perf, streaming) against kiln bench's
decode on the same plan. Usage: summarize_serve.py OUT_DIR"""
import json
import os
import sys

out = sys.argv[1]
print("| model | clients | protocol | server out tok/s | bench decode tok/s (batch) | ratio "
      "| ITL p50 / p99 ms | bench step ms | p99 / step | TTFT p50 / p99 ms | errors |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for preset in ("bloom-560m", "flan-t5-large"):
    try:
        bench = [json.loads(l) for l in open(f"{out}/bench-{preset}.jsonl") if l.strip()]
    except OSError:
        continue
    by_batch = {b["batch"]: b for b in bench}
    for proto, name in (("openai", f"perf-{preset}.json"), ("kserve", f"perf-kserve-{preset}.json")):
        path = os.path.join(out, name)
        if not os.path.exists(path):
            continue
        run = json.load(open(path))
        for r in run["results"]:
            c = r["concurrency"]
            b = by_batch.get(c) or by_batch[max(k for k in by_batch if k <= c)]
            bench_tps = b["tokens_per_s"]
            step = b["decode_ms_per_token"]
            itl99 = r["itl_ms_p99"] or float("nan")
            print(f"| {preset} {b['precision']} | {c} | {proto} | {r['output_tokens_per_s']:.0f} | "
                  f"{bench_tps:.0f} ({b['batch']}) | {100 * r['output_tokens_per_s'] / bench_tps:.0f} % | "
                  f"{r['itl_ms_p50']:.2f} / {itl99:.2f} | {step:.3f} | {itl99 / step:.2f} | "
                  f"{r['ttft_ms_p50']:.1f} / {r['ttft_ms_p99']:.1f} | {r['errors']} |")
    try:
        ready = json.load(open(f"{out}/ready-{preset}.json"))
        print(f"\n{preset}: /v2/health/ready answered {ready['ready_ms']} ms after the start\n")
    except OSError:
        pass
