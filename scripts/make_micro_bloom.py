#!/usr/bin/env python3
"""Writes tests/data/micro-bloom: a BLOOM checkpoint small enough to commit (random fp16 weights,
3 heads so ALiBi's non-power-of-two interleave is used, the bloom-tiny tokenizer). Its plans are
kept under tests/data/plans/v<N>/ so every released plan format version stays loadable.
Standard library only; run from the repository root."""
import json, os, random, shutil, struct

OUT = "tests/data/micro-bloom"
HIDDEN, HEADS, LAYERS, VOCAB = 24, 3, 2, 448

def tensors():
    rng = random.Random(20261129)
    def t(shape, scale=0.2, const=None):
        n = 1
        for d in shape:
            n *= d
        vals = [const] * n if const is not None else [rng.gauss(0.0, scale) for _ in range(n)]
        return shape, vals
    out = {
        "transformer.word_embeddings.weight": t([VOCAB, HIDDEN], 0.5),
        "transformer.word_embeddings_layernorm.weight": t([HIDDEN], const=1.0),
        "transformer.word_embeddings_layernorm.bias": t([HIDDEN], 0.05),
        "transformer.ln_f.weight": t([HIDDEN], const=1.0),
        "transformer.ln_f.bias": t([HIDDEN], 0.05),
    }
    for i in range(LAYERS):
        p = f"transformer.h.{i}."
        out[p + "input_layernorm.weight"] = t([HIDDEN], const=1.0)
        out[p + "input_layernorm.bias"] = t([HIDDEN], 0.05)
        out[p + "self_attention.query_key_value.weight"] = t([3 * HIDDEN, HIDDEN])
        out[p + "self_attention.query_key_value.bias"] = t([3 * HIDDEN], 0.05)
        out[p + "self_attention.dense.weight"] = t([HIDDEN, HIDDEN])
        out[p + "self_attention.dense.bias"] = t([HIDDEN], 0.05)
        out[p + "post_attention_layernorm.weight"] = t([HIDDEN], const=1.0)
        out[p + "post_attention_layernorm.bias"] = t([HIDDEN], 0.05)
        out[p + "mlp.dense_h_to_4h.weight"] = t([4 * HIDDEN, HIDDEN])
        out[p + "mlp.dense_h_to_4h.bias"] = t([4 * HIDDEN], 0.05)
        out[p + "mlp.dense_4h_to_h.weight"] = t([HIDDEN, 4 * HIDDEN])
        out[p + "mlp.dense_4h_to_h.bias"] = t([HIDDEN], 0.05)
    return out

def write_safetensors(path, ts):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(ts):
        shape, vals = ts[name]
        data = struct.pack("<%de" % len(vals), *vals)
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

os.makedirs(OUT, exist_ok=True)
write_safetensors(os.path.join(OUT, "model.safetensors"), tensors())
config = json.load(open("models/bloom-tiny/config.json"))
config.update({"hidden_size": HIDDEN, "n_head": HEADS, "n_layer": LAYERS, "vocab_size": VOCAB})
json.dump(config, open(os.path.join(OUT, "config.json"), "w"), indent=2)
shutil.copy("models/bloom-tiny/tokenizer.json", OUT)
print("wrote", OUT)
