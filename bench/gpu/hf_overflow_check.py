#!/usr/bin/env python3
"""What HuggingFace transformers does on the scaled T5 the CudaFp16Overflow test writes (its wo
weights scaled up): the largest |hidden state| of an fp32 forward (against fp16's 65504), and
whether fp16 logits stay finite, with HF's own protection (wo kept in fp32) and without it.
Usage: hf_overflow_check.py DIR"""
import sys

import torch
from transformers import AutoModelForSeq2SeqLM

d = sys.argv[1]
ids = torch.tensor([[15, 5, 3, 116, 35, 159, 152, 159, 32, 33, 1]]).cuda()
dec = torch.tensor([[0, 5, 9]]).cuda()
m = AutoModelForSeq2SeqLM.from_pretrained(d, torch_dtype=torch.float32).cuda().eval()
with torch.no_grad():
    o = m(input_ids=ids, decoder_input_ids=dec, output_hidden_states=True)
peak = max(h.abs().max().item() for h in o.encoder_hidden_states + o.decoder_hidden_states)
print(f"HF fp32: largest |hidden state| {peak:.4g} (fp16 max 65504)")
for keep in (True, False):
    m = AutoModelForSeq2SeqLM.from_pretrained(d, torch_dtype=torch.float16)
    if not keep:  # every weight fp16, wo included
        m = m.half()
    m = m.cuda().eval()
    with torch.no_grad():
        logits = m(input_ids=ids, decoder_input_ids=dec).logits
    print(f"HF fp16 ({'wo kept fp32' if keep else 'all fp16'}): logits finite: "
          f"{bool(torch.isfinite(logits).all())}")
