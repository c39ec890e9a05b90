#!/usr/bin/env python3
"""Issue 8's "speed-up over today's fp32 path, measured in the same run", against the engine as
it was when the issue was filed (commit f286139: fp32 only, hand-written AVX2 micro-kernels, no
`kiln bench`). Both binaries are timed the same way, from outside: `kiln run --input P
--batch-size B --max-new-tokens N --json` on B copies of a 78-token prompt, wall time with N = 1
and with N = 1 + STEPS; a decode step = (median of the second - median of the first) / STEPS
(load and prompt cancel out), time to first token ~ the N = 1 time less the load (not split
out: reported as is). Every run's outputs are checked to have N tokens (an EOS would shorten
the run). Variants run interleaved per round so that all see the same state of the VM.

Usage: seed_speedup.py SEED_KILN KILN WORKDIR [--rounds R] [--steps S] [--runs K]
WORKDIR holds <model>/ (kiln synth checkpoints), <model>-fp32-seed.plan (built by SEED_KILN),
<model>-{fp32,bf16,int8-weight}.plan (built by KILN) and the prompt files
<t5|bloom>-{1,16}.jsonl. Writes bench/results/cpu-seed-speedup.jsonl and prints a table.
"""
import argparse, json, os, statistics, subprocess, sys, time

p = argparse.ArgumentParser()
p.add_argument("seed"); p.add_argument("kiln"); p.add_argument("work")
p.add_argument("--rounds", type=int, default=2)
p.add_argument("--steps", type=int, default=32)
p.add_argument("--runs", type=int, default=3)
p.add_argument("--models", default="bloom-560m flan-t5-base")
a = p.parse_args()
out_path = os.path.join(os.path.dirname(__file__), "..", "results", "cpu-seed-speedup.jsonl")


def timed(binary, plan, prompts, batch, n):
    cmd = [binary, "run", "--plan", plan, "--input", prompts, "--batch-size", str(batch),
           "--max-new-tokens", str(n), "--json"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {r.stderr[-500:]}")
    lengths = [len(json.loads(l)["output_ids"]) for l in r.stdout.splitlines() if l.strip()]
    if len(lengths) != batch or any(x != n for x in lengths):
        sys.exit(f"{' '.join(cmd)}: output lengths {lengths}, expected {batch} x {n} (an EOS?)")
    return dt


rows = []
for rnd in range(1, a.rounds + 1):
    for model in a.models.split():
        fam = "t5" if "t5" in model else "bloom"
        variants = [("fp32-seed", a.seed, f"{model}-fp32-seed.plan")] + [
            (prec, a.kiln, f"{model}-{prec}.plan") for prec in ("fp32", "bf16", "int8-weight")]
        for batch in (1, 16):
            prompts = os.path.join(a.work, f"{fam}-{batch}.jsonl")
            for name, binary, plan in variants:
                plan = os.path.join(a.work, plan)
                short, long = [], []
                for _ in range(a.runs):
                    short.append(timed(binary, plan, prompts, batch, 1))
                    long.append(timed(binary, plan, prompts, batch, 1 + a.steps))
                step_ms = (statistics.median(long) - statistics.median(short)) / a.steps * 1e3
                row = {"round": rnd, "model": model, "variant": name, "batch": batch,
                       "step_ms": step_ms, "tokens_per_s": batch * 1e3 / step_ms,
                       "first_token_s": statistics.median(short), "runs": a.runs,
                       "steps": a.steps}
                rows.append(row)
                print(json.dumps(row), flush=True)
with open(out_path, "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
base = {(r["round"], r["model"], r["batch"]): r for r in rows if r["variant"] == "fp32-seed"}
print("| model | plan | round | batch | ms/step | tokens/s | speed-up over the seed's fp32 |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    b = base[(r["round"], r["model"], r["batch"])]
    print(f"| {r['model']} | {r['variant']} | {r['round']} | {r['batch']} | {r['step_ms']:.2f} | "
          f"{r['tokens_per_s']:.1f} | {r['tokens_per_s'] / b['tokens_per_s']:.2f}x |")
