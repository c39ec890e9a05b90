// T5 / Flan-T5 (T5ForConditionalGeneration) as kiln graphs, with HuggingFace's numerics:
// RMSNorm without mean or bias, unscaled attention scores, the relative-bias table owned by
// block 0 of each stack (bidirectional buckets in the encoder, causal in the decoder),
// gated-GELU (gelu_new) or ReLU FFN, lm_head.weight or the shared embedding, and the
// d_model^-0.5 output scale when scale_decoder_outputs holds.
#include <cmath>
#include <map>

#include "frontend/hf/frontend.h"
#include "graph/builder.h"

namespace kiln {
namespace {

struct T5Builder {
  const T5Config& cfg;
  const Checkpoint& ckpt;
  GraphBuilder& b;

  std::map<std::string, int> loaded;  // weight name -> value the graph reads (after widening)

  // Each weight is added once, in f32 (the shared embedding and block 0's relative-bias table
  // are read more than once).
  int w(const std::string& name, const Shape& shape) {
    if (auto it = loaded.find(name); it != loaded.end()) return it->second;
    const int id = b.weight_f32(name, ckpt.get(name, shape));
    loaded[name] = id;
    return id;
  }

  // x [tokens, d] -> normed self/cross attention output [tokens, d] (before the residual add)
  AttentionAttrs attention_attrs(AttentionKind kind, int layer, bool has_bias, bool causal) {
    AttentionAttrs a;
    a.kind = kind;
    a.layer = layer;
    a.num_heads = static_cast<int>(cfg.num_heads);
    a.head_dim = static_cast<int>(cfg.d_kv);
    a.causal = causal;
    a.scale = 1.0f;  // T5 folds 1/sqrt(d) into the weight initialisation, not the scores
    a.bias = has_bias ? PositionBias::kT5Relative : PositionBias::kNone;
    a.bidirectional_buckets = !causal;
    a.num_buckets = static_cast<int>(cfg.relative_attention_num_buckets);
    a.max_distance = static_cast<int>(cfg.relative_attention_max_distance);
    return a;
  }

  int ffn(int x, const std::string& p) {
    const int64_t d = cfg.d_model, f = cfg.d_ff;
    if (cfg.gated_ffn) {
      const int gate = b.linear(x, w(p + ".wi_0.weight", {f, d}), -1, p + ".wi_0");
      const int up = b.linear(x, w(p + ".wi_1.weight", {f, d}), -1, p + ".wi_1");
      const int h = b.gated_activation(gate, up, cfg.ffn_activation, p + ".gated");
      return b.linear(h, w(p + ".wo.weight", {d, f}), -1, p + ".wo");
    }
    const int h0 = b.linear(x, w(p + ".wi.weight", {f, d}), -1, p + ".wi");
    const int h = b.activation(h0, cfg.ffn_activation, p + ".act");
    return b.linear(h, w(p + ".wo.weight", {d, f}), -1, p + ".wo");
  }

  int self_attention(int x, const std::string& p, AttentionKind kind, int layer, int rel_table,
                     bool causal) {
    const int64_t d = cfg.d_model, inner = cfg.num_heads * cfg.d_kv;
    const int q = b.linear(x, w(p + ".q.weight", {inner, d}), -1, p + ".q");
    const int k = b.linear(x, w(p + ".k.weight", {inner, d}), -1, p + ".k");
    const int v = b.linear(x, w(p + ".v.weight", {inner, d}), -1, p + ".v");
    const int a =
        b.attention(q, k, v, rel_table, attention_attrs(kind, layer, true, causal), p + ".attn");
    return b.linear(a, w(p + ".o.weight", {d, inner}), -1, p + ".o");
  }

  int rel_table(const std::string& stack) {
    return w(stack + ".block.0.layer.0.SelfAttention.relative_attention_bias.weight",
             {cfg.relative_attention_num_buckets, cfg.num_heads});
  }
};

Graph build_encoder(const T5Config& cfg, const Checkpoint& ckpt) {
  GraphBuilder b(kEncoderGraph);
  T5Builder t{cfg, ckpt, b, {}};
  const int64_t d = cfg.d_model, inner = cfg.num_heads * cfg.d_kv;
  const int ids = b.input("input_ids", DType::kI64, {Dim::sym("tokens")});
  int x = b.embedding(t.w("shared.weight", {cfg.vocab_size, d}), ids, "encoder.embed");
  const int table = t.rel_table("encoder");
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    const std::string p = "encoder.block." + std::to_string(i);
    const int h0 = b.rms_norm(x, t.w(p + ".layer.0.layer_norm.weight", {d}), cfg.layer_norm_epsilon,
                              p + ".layer.0.layer_norm");
    const int a = t.self_attention(h0, p + ".layer.0.SelfAttention", AttentionKind::kEncoderSelf,
                                   static_cast<int>(i), table, false);
    x = b.add(x, a, p + ".layer.0.residual");
    const int h1 = b.rms_norm(x, t.w(p + ".layer.1.layer_norm.weight", {d}), cfg.layer_norm_epsilon,
                              p + ".layer.1.layer_norm");
    x = b.add(x, t.ffn(h1, p + ".layer.1.DenseReluDense"), p + ".layer.1.residual");
  }
  const int hidden = b.rms_norm(x, t.w("encoder.final_layer_norm.weight", {d}),
                                cfg.layer_norm_epsilon, "encoder.final_layer_norm");
  b.output(hidden, "encoder_hidden");
  // Cross-attention K/V of every decoder layer depend only on the encoder output: computing them
  // here means once per request, shared by every beam and every decode step.
  for (int64_t i = 0; i < cfg.num_decoder_layers; ++i) {
    const std::string p = "decoder.block." + std::to_string(i) + ".layer.1.EncDecAttention";
    const int k = b.linear(hidden, t.w(p + ".k.weight", {inner, d}), -1, p + ".k");
    const int v = b.linear(hidden, t.w(p + ".v.weight", {inner, d}), -1, p + ".v");
    b.output(k, "cross_k." + std::to_string(i));
    b.output(v, "cross_v." + std::to_string(i));
  }
  return b.finish();
}

Graph build_decoder(const T5Config& cfg, const Checkpoint& ckpt, const Logger& log) {
  GraphBuilder b(kDecoderGraph);
  T5Builder t{cfg, ckpt, b, {}};
  const int64_t d = cfg.d_model, inner = cfg.num_heads * cfg.d_kv;
  const int ids = b.input("input_ids", DType::kI64, {Dim::sym("tokens")});
  const int rows = b.input("logit_rows", DType::kI64, {Dim::sym("rows")});
  int x = b.embedding(t.w("shared.weight", {cfg.vocab_size, d}), ids, "decoder.embed");
  const int table = t.rel_table("decoder");
  for (int64_t i = 0; i < cfg.num_decoder_layers; ++i) {
    const std::string p = "decoder.block." + std::to_string(i);
    const int layer = static_cast<int>(i);
    const int h0 = b.rms_norm(x, t.w(p + ".layer.0.layer_norm.weight", {d}), cfg.layer_norm_epsilon,
                              p + ".layer.0.layer_norm");
    const int a = t.self_attention(h0, p + ".layer.0.SelfAttention", AttentionKind::kCachedSelf,
                                   layer, table, true);
    x = b.add(x, a, p + ".layer.0.residual");
    const int h1 = b.rms_norm(x, t.w(p + ".layer.1.layer_norm.weight", {d}), cfg.layer_norm_epsilon,
                              p + ".layer.1.layer_norm");
    const std::string c = p + ".layer.1.EncDecAttention";
    const int q = b.linear(h1, t.w(c + ".q.weight", {inner, d}), -1, c + ".q");
    const int ca = b.attention(
        q, -1, -1, -1, t.attention_attrs(AttentionKind::kCross, layer, false, false), c + ".attn");
    x = b.add(x, b.linear(ca, t.w(c + ".o.weight", {d, inner}), -1, c + ".o"),
              p + ".layer.1.residual");
    const int h2 = b.rms_norm(x, t.w(p + ".layer.2.layer_norm.weight", {d}), cfg.layer_norm_epsilon,
                              p + ".layer.2.layer_norm");
    x = b.add(x, t.ffn(h2, p + ".layer.2.DenseReluDense"), p + ".layer.2.residual");
  }
  // Only the rows that need logits go through the final norm and lm_head.
  x = b.gather_rows(x, rows, "decoder.logit_rows");
  x = b.rms_norm(x, t.w("decoder.final_layer_norm.weight", {d}), cfg.layer_norm_epsilon,
                 "decoder.final_layer_norm");
  if (cfg.scale_decoder_outputs) {
    x = b.scale(x, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d))),
                "decoder.output_scale");
    log.info("t5: decoder output scaled by d_model^-0.5 before lm_head");
  }
  int head;
  if (ckpt.has("lm_head.weight")) {
    head = t.w("lm_head.weight", {cfg.vocab_size, d});
  } else {
    head = t.w("shared.weight", {cfg.vocab_size, d});
    log.info("t5: no lm_head.weight; lm_head is the shared embedding");
  }
  b.output(b.linear(x, head, -1, "lm_head"), "logits");
  return b.finish();
}

}  // namespace

std::vector<Graph> build_t5_graphs(const T5Config& config, const Checkpoint& ckpt,
                                   const Logger& log) {
  std::vector<Graph> graphs;
  graphs.push_back(build_encoder(config, ckpt));
  graphs.push_back(build_decoder(config, ckpt, log));
  return graphs;
}

}  // namespace kiln
