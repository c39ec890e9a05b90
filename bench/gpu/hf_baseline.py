#!/usr/bin/env python3
"""HuggingFace transformers (eager) on the GPU, on the same checkpoint kiln benches: prompts of
exactly INPUT_LEN tokens, OUTPUT_LEN new tokens forced (EOS ignored), per batch size: time to
first token (generate with one new token), per-token decode time ((total - ttft) / (N - 1)),
tokens/s; medians of RUNS runs after one warm-up, timed with torch.cuda.synchronize().
Prints one JSON object per batch size.
With HF_COMPILE=1 the model's forward is compiled (torch.compile, mode "reduce-overhead": CUDA
graphs) over HF's static KV cache, as HF's guide to faster generation does; where the model does
not take a static cache, over its dynamic cache (mode "default", dynamic shapes). The warm-up run
pays the compilation; "engine" says which was measured.
Usage: hf_baseline.py DIR t5|bloom fp32|fp16|bf16 INPUT_LEN OUTPUT_LEN RUNS BATCH [BATCH ...]"""
import json, os, statistics, sys, time

import torch
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

d, family, dtype_name = sys.argv[1], sys.argv[2], sys.argv[3]
input_len, output_len, runs = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
batches = [int(b) for b in sys.argv[7:]]
dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
cls = AutoModelForSeq2SeqLM if family == "t5" else AutoModelForCausalLM
model = cls.from_pretrained(d, torch_dtype=dtype, attn_implementation="eager").cuda().eval()
weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
vocab = model.config.vocab_size
# Token ids away from the special ones (0..3), the same for every row.
prompt = (torch.arange(input_len) % (min(vocab, 200) - 10) + 10).unsqueeze(0)


engine = "hf-eager"
extra = {}
if os.environ.get("HF_COMPILE") == "1":
    eager_forward = model.forward
    try:
        model.forward = torch.compile(eager_forward, mode="reduce-overhead", fullgraph=True)
        extra = {"cache_implementation": "static"}
        with torch.no_grad():
            ids = prompt.repeat(batches[0], 1).cuda()
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4,
                           min_new_tokens=4, do_sample=False, num_beams=1, **extra)
        engine = "hf-compiled-static"
    except Exception as e:  # no static cache for this model: compile over the dynamic one
        print(json.dumps({"note": f"static cache + reduce-overhead failed: {type(e).__name__}: "
                                  f"{str(e)[:300]}"}), flush=True)
        torch._dynamo.reset()
        model.forward = torch.compile(eager_forward, dynamic=True)
        extra = {}
        engine = "hf-compiled-dynamic"


def generate(batch, new_tokens):
    ids = prompt.repeat(batch, 1).cuda()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, num_beams=1, **extra)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000.0, out


for batch in batches:
    generate(batch, output_len)  # warm-up (and, compiled, the compilation for this shape)
    generate(batch, 1)
    ttft, total = [], []
    for _ in range(runs):
        ttft.append(generate(batch, 1)[0])
        ms, out = generate(batch, output_len)
        total.append(ms)
    t_ms, tot_ms = statistics.median(ttft), statistics.median(total)
    step = (tot_ms - t_ms) / (output_len - 1)
    print(json.dumps({"engine": engine, "model": d, "architecture": family,
                      "precision": dtype_name, "batch": batch, "input_len": input_len,
                      "output_len": output_len, "runs": runs, "ttft_ms": t_ms,
                      "decode_ms_per_token": step, "tokens_per_s": batch * 1000.0 / step,
                      "total_ms": tot_ms, "weight_bytes": weight_bytes,
                      "peak_memory_bytes": torch.cuda.max_memory_allocated(),
                      "transformers": __import__("transformers").__version__,
                      "torch": torch.__version__}), flush=True)
