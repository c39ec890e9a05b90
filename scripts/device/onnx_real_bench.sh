#!/bin/bash
# On the GPU machine: a plan built from an ONNX export runs as fast as one built from the same
# weights' HF checkpoint. `kiln synth` writes bloom-560m (fp16); torch exports it with the
# TorchScript exporter (opset 17, dynamic batch and sequence, as users export); `kiln build`
# makes a CUDA fp16 plan from each; `kiln bench` runs both at batch 1 and 16, and `kiln inspect`
# lists both plans' layers and weight bytes. Run from the folder scripts/device/pack.sh filled.
# Log: $OUT/onnx_real_bench.log (bench JSON lines: $OUT/onnx_real_bench.jsonl).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
source "$HERE/bundle_env.sh"
LOG="$OUT/onnx_real_bench.log"
dir=/tmp/synth/bloom-560m-fp16 onnx=/tmp/onnx-real/bloom-560m.onnx
mkdir -p /tmp/plans /tmp/onnx-real
[ -d "$dir" ] || "$KILN" synth --preset bloom-560m --dtype fp16 -o "$dir" >>"$LOG" 2>&1
python3 - "$dir" "$onnx" >>"$LOG" 2>&1 <<'PY' || { echo "export failed" | tee -a "$LOG"; exit 1; }
import sys, time, torch
from transformers import BloomForCausalLM
src, dst = sys.argv[1], sys.argv[2]
m = BloomForCausalLM.from_pretrained(src, torch_dtype=torch.float16).cuda().eval()
class Logits(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m
    def forward(self, input_ids, attention_mask):
        return self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
ids = torch.randint(4, 1000, (1, 16), device="cuda")
t = time.time()
with torch.no_grad():
    torch.onnx.export(Logits(m).eval(), (ids, torch.ones_like(ids)), dst,
                      input_names=["input_ids", "attention_mask"], output_names=["logits"],
                      dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                                    "attention_mask": {0: "batch", 1: "sequence"},
                                    "logits": {0: "batch", 1: "sequence"}},
                      opset_version=17, dynamo=False)
print(f"exported {dst} in {time.time() - t:.1f} s")
PY
/usr/bin/time -f "onnx build: %e s, peak %M KB" "$KILN" build --onnx "$onnx" --tokenizer "$dir/tokenizer.json" \
  --device cuda --precision fp16 -o /tmp/plans/onnx-bloom-560m.plan -q 2>>"$LOG" || echo "onnx build failed" | tee -a "$LOG"
/usr/bin/time -f "hf build: %e s, peak %M KB" "$KILN" build --model "$dir" \
  --device cuda --precision fp16 -o /tmp/plans/hf-bloom-560m.plan -q 2>>"$LOG" || echo "hf build failed" | tee -a "$LOG"
grep -E "build:|exported" "$LOG"
for batch in 1 16; do
  for src in hf onnx; do
    plan=/tmp/plans/$src-bloom-560m.plan
    [ -f "$plan" ] || continue
    "$KILN" bench --plan "$plan" --input-len 128 --output-len 128 --runs 5 --batch "$batch" --json \
      2>>"$LOG" | python3 -c "import json,sys; r=json.load(sys.stdin); r['source']='$src'; print(json.dumps(r))" |
      tee -a "$OUT/onnx_real_bench.jsonl" |
      python3 -c "import json,sys; r=json.load(sys.stdin); print('$src batch $batch: decode %.3f ms/step, ttft %.2f ms, %.0f tok/s' % (r['decode_ms_per_token'], r['ttft_ms'], r['tokens_per_s']))" |
      tee -a "$LOG"
  done
done
for src in hf onnx; do  # both plans' graphs, node by node, for a diff here
  "$KILN" inspect --plan /tmp/plans/$src-bloom-560m.plan --graph >"$OUT/onnx_real_$src.inspect" 2>&1
done
