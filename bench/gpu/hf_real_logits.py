#!/usr/bin/env python3
"""HuggingFace transformers' fp32 last-token logits for real-size checkpoints written by
`kiln synth`, the reference of the CudaRealSize test (tests/models/test_cuda_real_size.cc).
For each DIR FAMILY pair: a fixed prompt of PROMPT_LEN ids (BLOOM: the whole sequence; T5: the
encoder input, with decoder ids [start, 5 more]), HF fp32 on the GPU with TF32 off, and the
logits of the last position. Writes OUT/<name>.safetensors (prompt, decoder, logits) and
OUT/manifest.json; run the test with KILN_HF_REAL_SIZE=OUT.
Usage: hf_real_logits.py OUT PROMPT_LEN DIR FAMILY [DIR FAMILY ...]"""
import json, os, sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

out, prompt_len = sys.argv[1], int(sys.argv[2])
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
os.makedirs(out, exist_ok=True)
manifest = []
for d, family in zip(sys.argv[3::2], sys.argv[4::2]):
    t5 = family == "t5"
    cls = AutoModelForSeq2SeqLM if t5 else AutoModelForCausalLM
    model = cls.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager")
    model = model.cuda().eval()
    vocab = model.config.vocab_size
    # Ids away from the special ones, varied so that attention sees distinct keys.
    prompt = (torch.arange(prompt_len) * 7 % (min(vocab, 200) - 10) + 10).unsqueeze(0)
    with torch.no_grad():
        if t5:
            start = model.config.decoder_start_token_id
            decoder = torch.tensor([[start, 21, 34, 55, 89, 144]])
            logits = model(input_ids=prompt.cuda(), decoder_input_ids=decoder.cuda()).logits
        else:
            decoder = prompt
            logits = model(input_ids=prompt.cuda()).logits
    # How much HF itself moves at lower precision on this model (context for kiln's cosines).
    last = logits[0, -1].float()
    for low in (torch.float16, torch.bfloat16):
        with torch.no_grad():
            m = model.to(low)
            if t5:
                l = m(input_ids=prompt.cuda(), decoder_input_ids=decoder.cuda()).logits
            else:
                l = m(input_ids=prompt.cuda()).logits
        cos = torch.nn.functional.cosine_similarity(l[0, -1].float(), last, dim=0).item()
        print(f"{os.path.basename(os.path.normpath(d))}: HF {str(low)[6:]} vs HF fp32: last-token "
              f"logits cosine {cos:.7f}", flush=True)
    name = os.path.basename(os.path.normpath(d))
    save_file({"prompt": prompt[0].clone(), "decoder": decoder[0].clone(),
               "logits": last.cpu().contiguous()},
              os.path.join(out, name + ".safetensors"))
    manifest.append({"model": os.path.abspath(d), "family": family,
                     "reference": name + ".safetensors"})
    print(f"{name}: HF fp32 logits of {tuple(logits.shape)}, max |logit| "
          f"{logits[0, -1].abs().max().item():.4g}", flush=True)
    del model
    torch.cuda.empty_cache()
with open(os.path.join(out, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=1)
