"""On the GPU machine (it has torch, transformers and onnxruntime; this one has no PyPI): ONNX
exports that ../shared/fixtures/onnx lacks, for the ONNX frontend's tests. Tiny random models of
the fixture exports' shapes (BLOOM: hidden 32, 2 layers, 4 heads, vocab 96; T5: d_model 32,
4 heads x 8, d_ff 64 gated-gelu, 2+2 layers, 32 buckets), exported as
  - NAME_fp16: TorchScript exporter, the model in fp16 (what `model.half()` users export);
  - NAME_dynamo: torch.onnx.export(dynamo=True), fp32 (torch's newer exporter);
each with onnxruntime's outputs on fixed inputs (`NAME.in.INPUT`, `NAME.out.OUTPUT` in
reference.safetensors, as the shared fixture's). A variant that fails is reported in
reference.json with its error, not dropped silently. Usage: make_onnx_exports.py OUT_DIR"""
import json
import os
import sys
import traceback

import numpy as np
import onnxruntime as ort
import torch
from safetensors.numpy import save_file
from transformers import BloomConfig, BloomForCausalLM, T5Config, T5ForConditionalGeneration

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
torch.manual_seed(0)
report, tensors = {"torch": torch.__version__, "onnxruntime": ort.__version__}, {}


class BloomLogits(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask):
        return self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


class T5Encoder(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask):
        return self.m.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class T5Decoder(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, encoder_hidden_states, encoder_attention_mask):
        out = self.m.decoder(input_ids=input_ids, encoder_hidden_states=encoder_hidden_states,
                             encoder_attention_mask=encoder_attention_mask, use_cache=False)
        h = out.last_hidden_state
        if self.m.config.tie_word_embeddings:
            h = h * (self.m.model_dim ** -0.5)
        return self.m.lm_head(h)


bloom = BloomForCausalLM(BloomConfig(vocab_size=96, hidden_size=32, n_layer=2, n_head=4)).eval()
t5 = T5ForConditionalGeneration(T5Config(
    vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
    relative_attention_num_buckets=32, relative_attention_max_distance=128,
    feed_forward_proj="gated-gelu", tie_word_embeddings=True, decoder_start_token_id=0)).eval()

gen = torch.Generator().manual_seed(1)
ids = torch.randint(4, 96, (2, 7), generator=gen)
bloom_mask = torch.ones(2, 7, dtype=torch.int64)
bloom_mask[1, :2] = 0  # left padding, as BLOOM batches are
ids_b = ids.clone()
ids_b[1, :2] = 3
t5_mask = torch.ones(2, 7, dtype=torch.int64)
t5_mask[1, 5:] = 0  # right padding, as T5 batches are
ids_t = ids.clone()
ids_t[1, 5:] = 0
dec_ids = torch.randint(2, 96, (2, 4), generator=gen)
dec_ids[:, 0] = 0


def export(name, module, args, input_names, output_names, axes, dynamo):
    path = os.path.join(out_dir, name + ".onnx")
    if dynamo:
        dims = {k: {i: torch.export.Dim.AUTO for i in v} for k, v in axes.items()
                if k in input_names}
        torch.onnx.export(module, args, path, input_names=input_names, output_names=output_names,
                          dynamic_shapes=dims, dynamo=True, opset_version=18, external_data=False)
    else:
        torch.onnx.export(module, args, path, input_names=input_names, output_names=output_names,
                          dynamic_axes=axes, opset_version=17, dynamo=False)
    return path


def run_ort(path, feeds):
    """onnxruntime's CPU provider, or its CUDA one where the CPU lacks a kernel (fp16 ops)."""
    err = None
    for provider in ["CPUExecutionProvider", "CUDAExecutionProvider"]:
        if provider not in ort.get_available_providers():
            continue
        try:
            sess = ort.InferenceSession(path, providers=[provider])
            names = [o.name for o in sess.get_outputs()]
            report.setdefault("providers", {})[os.path.basename(path)] = provider
            return dict(zip(names, sess.run(None, feeds)))
        except Exception as e:  # noqa: BLE001 -- the next provider, then the error
            err = e
    raise err


def variant(tag, dtype, dynamo):
    # eval(): the wrappers too, or the dynamo exporter writes training-mode Dropouts.
    b = BloomLogits(bloom.to(dtype)).eval()
    t_enc, t_dec = T5Encoder(t5.to(dtype)).eval(), T5Decoder(t5.to(dtype)).eval()
    jobs = [
        ("bloom", b, (ids_b, bloom_mask), ["input_ids", "attention_mask"], ["logits"],
         {"input_ids": [0, 1], "attention_mask": [0, 1], "logits": [0, 1]}),
        ("t5_encoder", t_enc, (ids_t, t5_mask), ["input_ids", "attention_mask"],
         ["last_hidden_state"],
         {"input_ids": [0, 1], "attention_mask": [0, 1], "last_hidden_state": [0, 1]}),
    ]
    for name, module, args, inn, outn, axes in jobs:
        export_job(f"{name}_{tag}", module, args, inn, outn, axes, dynamo)
    variant_decoder(tag, dtype, dynamo, t_dec)


def export_job(full, module, args, inn, outn, axes, dynamo):
    try:
        with torch.no_grad():
            ref = module(*args).float().numpy()
        path = export(full, module, args, inn, outn, axes, dynamo)
        feeds = {k: v.numpy() for k, v in zip(inn, args)}
        got = run_ort(path, feeds)[outn[0]].astype(np.float32)
        for k, v in feeds.items():
            tensors[f"{full}.in.{k}"] = np.ascontiguousarray(v)
        tensors[f"{full}.out.{outn[0]}"] = got
        report[full] = {"ok": True, "ort_vs_torch_maxabs": float(np.abs(got - ref).max()),
                        "bytes": os.path.getsize(path)}
    except Exception as e:  # noqa: BLE001 -- every failure is reported in reference.json
        report[full] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000],
                        "trace": traceback.format_exc()[-3000:]}


def variant_decoder(tag, dtype, dynamo, t_dec):
    # The decoder reads the encoder states onnxruntime produced for the same variant.
    full = f"t5_decoder_{tag}"
    try:
        enc_states = tensors[f"t5_encoder_{tag}.out.last_hidden_state"]
        hs = torch.from_numpy(enc_states).to(dtype)
        args = (dec_ids, hs, t5_mask)
        inn = ["input_ids", "encoder_hidden_states", "encoder_attention_mask"]
        with torch.no_grad():
            ref = t_dec(*args).float().numpy()
        path = export(full, t_dec, args, inn, ["logits"],
                      {"input_ids": [0, 1], "encoder_hidden_states": [0, 1],
                       "encoder_attention_mask": [0, 1], "logits": [0, 1]}, dynamo)
        feeds = {k: v.numpy() for k, v in zip(inn, args)}
        got = run_ort(path, feeds)["logits"].astype(np.float32)
        for k, v in feeds.items():
            tensors[f"{full}.in.{k}"] = np.ascontiguousarray(v)
        tensors[f"{full}.out.logits"] = got
        report[full] = {"ok": True, "ort_vs_torch_maxabs": float(np.abs(got - ref).max()),
                        "bytes": os.path.getsize(path)}
    except Exception as e:  # noqa: BLE001
        report[full] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000],
                        "trace": traceback.format_exc()[-3000:]}


variant("fp16", torch.float16, dynamo=False)
variant("dynamo", torch.float32, dynamo=True)
# 12 heads: ALiBi's slopes for 8 heads interleaved with 4 of 16's, the latter (2^-0.5, 2^-1.5,
# ...) not exact in fp16 (real BLOOMs have 16 heads and more).
bloom12 = BloomForCausalLM(BloomConfig(vocab_size=96, hidden_size=48, n_layer=2, n_head=12))
export_job("bloom12h_fp16", BloomLogits(bloom12.half()).eval(), (ids_b, bloom_mask),
           ["input_ids", "attention_mask"], ["logits"],
           {"input_ids": [0, 1], "attention_mask": [0, 1], "logits": [0, 1]}, False)
save_file(tensors, os.path.join(out_dir, "reference.safetensors"))
with open(os.path.join(out_dir, "reference.json"), "w") as f:
    json.dump(report, f, indent=1)
print(json.dumps({k: (v if not isinstance(v, dict) else {kk: vv for kk, vv in v.items()
                                                          if kk != "trace"})
                  for k, v in report.items()}, indent=1))
