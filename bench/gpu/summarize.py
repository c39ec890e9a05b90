#!/usr/bin/env python3
"""Joins kiln bench and HF baseline JSON lines (same model, precision and batch) into
summary.json and a markdown table with the speed-ups. Usage: summarize.py OUT_DIR"""
import glob, json, os, sys

out = sys.argv[1]
rows = []
for path in sorted(glob.glob(os.path.join(out, "*.jsonl"))):
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
kiln = [r for r in rows if r.get("engine") != "hf-eager"]
hf = {(r["architecture"], r["precision"], r["batch"]): r for r in rows if r.get("engine") == "hf-eager"}
table = ["| model | precision | batch | kiln ms/token | HF ms/token | decode speed-up | kiln TTFT ms "
         "| HF TTFT ms | kiln tok/s | HF tok/s | roofline | GPU GB/s | peak GPU MiB | over budget |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
summary = []
for k in kiln:
    h = hf.get((k["architecture"], k["precision"], k["batch"]))
    entry = {"kiln": k, "hf": h}
    if h:
        entry["decode_speedup"] = h["decode_ms_per_token"] / k["decode_ms_per_token"]
        entry["ttft_ratio"] = k["ttft_ms"] / h["ttft_ms"]
        entry["tokens_per_s_ratio"] = k["tokens_per_s"] / h["tokens_per_s"]
    summary.append(entry)
    table.append("| {} | {} | {} | {:.3f} | {} | {} | {:.1f} | {} | {:.0f} | {} | {:.1f}% | {:.0f} | {:.0f} | {} |".format(
        k["model"], k["precision"], k["batch"], k["decode_ms_per_token"],
        "{:.3f}".format(h["decode_ms_per_token"]) if h else "-",
        "{:.1f}x".format(entry["decode_speedup"]) if h else "-", k["ttft_ms"],
        "{:.1f}".format(h["ttft_ms"]) if h else "-", k["tokens_per_s"],
        "{:.0f}".format(h["tokens_per_s"]) if h else "-", k["roofline_pct"], k["bandwidth_gbps"],
        k["peak_memory_bytes"] / 2**20,
        # Issue 9's memory budget: the peak less the CUDA context (baseline) against weights +
        # KV cache + workspace (kiln bench's peak_over_budget_pct; absent in older logs).
        "{:+.1f}%".format(k["peak_over_budget_pct"]) if "peak_over_budget_pct" in k else "-"))
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
open(os.path.join(out, "summary.md"), "w").write("\n".join(table) + "\n")
print("\n".join(table))
