#!/usr/bin/env python3
"""HuggingFace's ids for generation_config settings that act on the logits (logits processors).

Run on a machine with transformers (the GPU machine; HF runs on its CPU in fp32, as the fixtures'
references were made): python3 make_reference.py MODELS_DIR OUT.json
MODELS_DIR holds t5-tiny/ and bloom-tiny/ (the repository's models/). Every case is one prompt,
unpadded (a padded batch would let HF's repetition penalty and n-gram bans see pad tokens).
Writes, per model, each prompt's input_ids and, per setting and decoding mode, HF's generated ids
(no prompt, no decoder start token, no EOS, as `kiln run --json` prints output_ids).
Sampling runs at temperature 0.01 with a fixed torch seed, and a case is kept only where every
step's best token led the second by at least MIN_MARGIN after the temperature (a logit gap of
0.2: another draw has a chance below exp(-20)) and HF's sample equals its greedy choice; so
kiln's sampling path must give the same ids. Left-out cases are listed under "skipped".
"""
import json
import sys

import sentencepiece
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

MODELS, OUT = sys.argv[1], sys.argv[2]
MAX_NEW = 16
MIN_MARGIN = 20.0
PROMPTS = {
    "t5-tiny": ["copy: vica vica vica vica", "reverse: suvogi", "sort: f r t d e", "add: 456 + 95",
                "upper: lubu"],
    "bloom-tiny": ["copy: vica vica vica vica", "reverse: suvogi", "sort: f r t d e",
                   "add: 456 + 95", "upper: lubu"],
}


def settings_for(model_name, greedy_ids):
    """The settings to test; some take ids from the prompt's plain greedy output."""
    g = greedy_ids + [5, 6, 7, 8]  # short answers: pad with ordinary ids
    s = [
        {"repetition_penalty": 1.5},
        {"repetition_penalty": 0.6},
        {"repetition_penalty": 1.3, "min_new_tokens": 10},
        {"no_repeat_ngram_size": 2, "min_new_tokens": 10},
        {"no_repeat_ngram_size": 1, "min_new_tokens": 6},
        {"no_repeat_ngram_size": 3, "repetition_penalty": 0.8, "min_new_tokens": 12},
        {"bad_words_ids": [[g[0]]]},
        {"bad_words_ids": [[g[0], g[1]], [g[2]]], "min_new_tokens": 6},
        {"suppress_tokens": [g[0], g[1]]},
        {"min_new_tokens": 8},
        {"min_length": 9},
        {"forced_eos_token_id": 7, "max_new_tokens": 6, "min_new_tokens": 6},
        {"forced_bos_token_id": 9},
        {"repetition_penalty": 1.2, "no_repeat_ngram_size": 2, "suppress_tokens": [g[1]],
         "bad_words_ids": [[g[2], g[3]]], "min_new_tokens": 5},
    ]
    # HF applies encoder_no_repeat_ngram_size to decoder-only models too, with the prompt as
    # the "encoder" ids.
    s.append({"encoder_no_repeat_ngram_size": 2})
    s.append({"encoder_no_repeat_ngram_size": 1, "min_new_tokens": 4})
    s.append({"encoder_no_repeat_ngram_size": 3, "repetition_penalty": 1.4})
    return s


MODES = {
    "greedy": {"do_sample": False, "num_beams": 1},
    "beam4": {"do_sample": False, "num_beams": 4, "early_stopping": False},
    "sample": {"do_sample": True, "num_beams": 1, "temperature": 0.01, "top_k": 50, "top_p": 1.0},
}


def main():
    out = {"transformers": transformers.__version__, "torch": torch.__version__,
           "max_new_tokens": MAX_NEW, "sample_temperature": 0.01, "models": {}}
    for name in ("t5-tiny", "bloom-tiny"):
        path = f"{MODELS}/{name}"
        tok = AutoTokenizer.from_pretrained(path)
        enc_dec = name.startswith("t5")
        cls = AutoModelForSeq2SeqLM if enc_dec else AutoModelForCausalLM
        model = cls.from_pretrained(path, torch_dtype=torch.float32).eval()
        eos = model.generation_config.eos_token_id
        pad = model.generation_config.pad_token_id
        cases, skipped = [], []
        if enc_dec:
            # As the fixtures' references: SentencePiece's ids with </s> appended (transformers'
            # tokenizer.json path for this fixture maps its pieces to <unk>).
            sp = sentencepiece.SentencePieceProcessor(model_file=f"{path}/spiece.model")
            prompts = [(p, sp.encode(p) + [eos]) for p in PROMPTS[name]]
        else:
            prompts = [(p, tok(p + " =")["input_ids"]) for p in PROMPTS[name]]
        # forced_bos_token_id acts where the sequence is one token long: the decoder start token
        # (T5), or a one-token prompt (BLOOM).
        if not enc_dec:
            prompts.append(("<one token>", [tok("copy")["input_ids"][0]]))

        def run(ids, kw, margins=None):
            x = torch.tensor([ids])
            args = dict(max_new_tokens=MAX_NEW, pad_token_id=pad, eos_token_id=eos,
                        output_scores=True, return_dict_in_generate=True)
            args.update(kw)
            with torch.no_grad():
                res = model.generate(x, attention_mask=torch.ones_like(x), **args)
            y = res.sequences[0].tolist()
            if margins is not None:
                # Each step's processed scores (after the temperature): the gap between the best
                # and the second-best token.
                for step in res.scores:
                    top = torch.topk(step[0].float(), 2).values
                    margins.append(float(top[0] - top[1]))
            y = y[1:] if enc_dec else y[len(ids):]
            eos_ids = eos if isinstance(eos, list) else [eos]
            out_ids = []
            for t in y:
                if t in eos_ids:
                    break
                out_ids.append(t)
            return out_ids

        for prompt, ids in prompts:
            plain = run(ids, MODES["greedy"])
            for setting in settings_for(name, plain):
                for mode, mkw in MODES.items():
                    kw = dict(mkw)
                    kw.update(setting)
                    try:
                        greedy_kw = dict(MODES["greedy"])
                        greedy_kw.update(setting)
                        torch.manual_seed(1234)
                        margins = []
                        got = run(ids, kw, margins)
                        # A sampled case is kept only where HF's draw is its greedy choice and
                        # every step's second-best token was at least MIN_MARGIN below the best
                        # after the temperature (a chance below exp(-20) of another draw).
                        if mode == "sample" and (got != run(ids, greedy_kw) or
                                                 min(margins) < MIN_MARGIN):
                            skipped.append({"prompt": prompt, "setting": setting, "mode": mode,
                                            "margin": min(margins)})
                            continue
                        cases.append({"prompt": prompt, "input_ids": ids, "mode": mode,
                                      "setting": setting, "output_ids": got})
                    except Exception as e:  # HF refuses the setting: kiln must refuse it too
                        cases.append({"prompt": prompt, "input_ids": ids, "mode": mode,
                                      "setting": setting, "error": f"{type(e).__name__}: {e}"})
        out["models"][name] = {"eos_token_id": eos, "cases": cases, "skipped": skipped}
        print(name, len(cases), "cases,", len(skipped), "skipped", file=sys.stderr)
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
