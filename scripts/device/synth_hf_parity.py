#!/usr/bin/env python3
"""On the GPU machine (which has PyTorch + transformers): loads checkpoints written by
`kiln synth` with HuggingFace transformers as is, and compares HF's greedy ids (fp32, CPU) with
kiln's for the same prompts. Usage: synth_hf_parity.py KILN DIR FAMILY [DIR FAMILY ...]"""
import json, subprocess, sys, time

import torch
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

kiln = sys.argv[1]
prompts = ["reverse: suvogi", "add: 456 + 95", "sort: f r t d e"]
ok = True
for d, family in zip(sys.argv[2::2], sys.argv[3::2]):
    cls = AutoModelForSeq2SeqLM if family == "t5" else AutoModelForCausalLM
    t0 = time.time()
    model = cls.from_pretrained(d, torch_dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(d)
    print(f"{d}: HF loaded {sum(p.numel() for p in model.parameters())/1e6:.1f}M parameters "
          f"in {time.time()-t0:.1f} s", flush=True)
    for p in prompts:
        text = p if family == "t5" else p + " ="
        # kiln's ids (SentencePiece for T5, as the fixture's reference ids are) go to both: the
        # fast tokenizer transformers builds from the fixture T5 files does not reproduce them.
        kt = subprocess.run([kiln, "tokenize", "--model", d, "--text", text],
                            capture_output=True, text=True, check=True)
        ids = torch.tensor([[int(x) for x in kt.stdout.split()]])
        hf_ids = tok(text).input_ids
        if hf_ids != ids[0].tolist():
            print(f"    note: HF's tokenizer gives {hf_ids}, kiln/SentencePiece {ids[0].tolist()}")
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=8, do_sample=False, num_beams=1)[0].tolist()
        hf = out[1:] if family == "t5" else out[ids.shape[1]:]
        eos = model.generation_config.eos_token_id
        hf = [t for t in hf if t not in (eos, model.generation_config.pad_token_id)]
        r = subprocess.run([kiln, "run", "--model", d, "--prompt", text, "--json",
                            "--max-new-tokens", "8"], capture_output=True, text=True)
        if r.returncode != 0:
            print("kiln failed:", r.stderr); ok = False; continue
        k = json.loads(r.stdout.splitlines()[0])
        same = k["input_ids"] == ids[0].tolist() and k["output_ids"] == hf
        ok &= same
        print(f"  {text!r}: HF {hf} kiln {k['output_ids']} {'MATCH' if same else 'DIFFER'}",
              flush=True)
        if k["input_ids"] != ids[0].tolist():
            print(f"    input ids differ: HF {ids[0].tolist()} kiln {k['input_ids']}")
print("ALL MATCH" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
