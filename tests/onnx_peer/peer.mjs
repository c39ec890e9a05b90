// onnxruntime's outputs for inputs of kiln's own (not the ones stored with the fixtures): for
// each fixture export, several batches (other batch sizes and lengths, left and right padding, a
// length past T5's exact relative-position buckets) with seeded random ids and hidden states.
// Writes CASE.in.safetensors (the graph's inputs by name) and CASE.ref.safetensors
// (onnxruntime's outputs by name) into OUT_DIR and one line per case to OUT_DIR/cases.txt:
// "MODEL CASE MASK" (MASK: the input whose 0s mark padding, or "-").
//   node peer.mjs FIXTURES_DIR OUT_DIR
import * as ort from "onnxruntime-node";
import fs from "node:fs";
import path from "node:path";

const [fixtures, outDir] = process.argv.slice(2);
fs.mkdirSync(outDir, { recursive: true });

// A small deterministic generator (mulberry32): the same inputs on every run.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function writeSafetensors(file, tensors) {
  const header = {};
  const blobs = [];
  let offset = 0;
  for (const [name, t] of Object.entries(tensors)) {
    const dtype = { float32: "F32", int64: "I64" }[t.type];
    const bytes = Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);
    header[name] = { dtype, shape: t.dims.map(Number), data_offsets: [offset, offset + bytes.length] };
    blobs.push(bytes);
    offset += bytes.length;
  }
  let text = JSON.stringify(header);
  text += " ".repeat((8 - (text.length % 8)) % 8);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(text.length));
  fs.writeFileSync(file, Buffer.concat([len, Buffer.from(text), ...blobs]));
}

const VOCAB = 96;
function ids(r, batch, seq) {
  return new ort.Tensor("int64", BigInt64Array.from({ length: batch * seq }, () => BigInt(Math.floor(r() * VOCAB))), [batch, seq]);
}
// lengths[b] real positions per row, padded on the left or the right.
function mask(batch, seq, lengths, side) {
  const m = new BigInt64Array(batch * seq);
  for (let b = 0; b < batch; ++b)
    for (let s = 0; s < seq; ++s) {
      const real = side === "left" ? s >= seq - lengths[b] : s < lengths[b];
      m[b * seq + s] = real ? 1n : 0n;
    }
  return new ort.Tensor("int64", m, [batch, seq]);
}
function normal(r, dims) {
  const n = dims.reduce((a, b) => a * b, 1);
  const v = new Float32Array(n);
  for (let i = 0; i < n; ++i) v[i] = Math.sqrt(-2 * Math.log(1 - r())) * Math.cos(2 * Math.PI * r());
  return new ort.Tensor("float32", v, dims);
}

const cases = {
  t5_encoder: [
    ["b3_s9_right", (r) => ({ input_ids: ids(r, 3, 9), attention_mask: mask(3, 9, [9, 4, 7], "right") })],
    ["b1_s1", (r) => ({ input_ids: ids(r, 1, 1), attention_mask: mask(1, 1, [1], "right") })],
    ["b2_s40_right", (r) => ({ input_ids: ids(r, 2, 40), attention_mask: mask(2, 40, [40, 23], "right") })],
  ],
  t5_decoder: [
    ["b3_t6_s9", (r) => ({ input_ids: ids(r, 3, 6), encoder_hidden_states: normal(r, [3, 9, 32]), encoder_attention_mask: mask(3, 9, [9, 4, 7], "right") })],
    ["b1_t1_s1", (r) => ({ input_ids: ids(r, 1, 1), encoder_hidden_states: normal(r, [1, 1, 32]), encoder_attention_mask: mask(1, 1, [1], "right") })],
    ["b2_t33_s5", (r) => ({ input_ids: ids(r, 2, 33), encoder_hidden_states: normal(r, [2, 5, 32]), encoder_attention_mask: mask(2, 5, [5, 2], "right") })],
  ],
  bloom: [
    ["b3_s9_left", (r) => ({ input_ids: ids(r, 3, 9), attention_mask: mask(3, 9, [9, 4, 7], "left") })],
    ["b1_s1", (r) => ({ input_ids: ids(r, 1, 1), attention_mask: mask(1, 1, [1], "left") })],
    ["b2_s40_left", (r) => ({ input_ids: ids(r, 2, 40), attention_mask: mask(2, 40, [40, 23], "left") })],
  ],
};
// The decoder's outputs are per decoder position, all real; the others are masked by their input.
const maskOf = { t5_encoder: "attention_mask", t5_decoder: "-", bloom: "attention_mask" };

const lines = [];
let seed = 1;
for (const [model, list] of Object.entries(cases)) {
  const session = await ort.InferenceSession.create(path.join(fixtures, "onnx", model + ".onnx"));
  for (const [name, make] of list) {
    const feeds = make(rng(seed++));
    const outputs = await session.run(feeds);
    writeSafetensors(path.join(outDir, `${model}.${name}.in.safetensors`), feeds);
    writeSafetensors(path.join(outDir, `${model}.${name}.ref.safetensors`), outputs);
    lines.push(`${model} ${name} ${maskOf[model]}`);
  }
}
fs.writeFileSync(path.join(outDir, "cases.txt"), lines.join("\n") + "\n");
console.log(`onnxruntime ${ort.env.versions?.common ?? ""}: ${lines.length} cases in ${outDir}`);
