// BLOOM (BloomForCausalLM) as a kiln graph, with HuggingFace's numerics: word-embedding
// LayerNorm, ALiBi (slopes incl. the non-power-of-two interleave, positions counted from the
// sequence's first real token), scores scaled by 1/sqrt(head_dim) with ALiBi unscaled, the fused
// query_key_value laid out [head, 3, head_dim], tanh GELU, optional post-LayerNorm residuals,
// tied lm_head. fp16/bf16 checkpoints are widened by Cast nodes that constant folding resolves.
#include <cmath>
#include <cstring>

#include "frontend/hf/frontend.h"
#include "graph/builder.h"

namespace kiln {
namespace {

// query_key_value rows come as [H, 3, dh]; the packed Attention input wants [3, H, dh].
Tensor regroup_qkv(const Tensor& t, int64_t heads, int64_t head_dim) {
  const int64_t row_elems = t.rank() == 2 ? t.dim(1) : 1;
  const size_t row_bytes = dtype_bytes(t.dtype(), static_cast<size_t>(row_elems));
  Tensor out = Tensor::empty(t.dtype(), t.shape());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t part = 0; part < 3; ++part)
      for (int64_t i = 0; i < head_dim; ++i) {
        const int64_t src = (h * 3 + part) * head_dim + i;
        const int64_t dst = (part * heads + h) * head_dim + i;
        std::memcpy(static_cast<char*>(out.raw()) + dst * row_bytes,
                    static_cast<const char*>(t.raw()) + src * row_bytes, row_bytes);
      }
  t.release_pages();
  return out;
}

}  // namespace

std::vector<Graph> build_bloom_graphs(const BloomConfig& cfg, const Checkpoint& ckpt,
                                      const Logger& log) {
  GraphBuilder b(kDecoderGraph);
  const int64_t d = cfg.hidden_size, H = cfg.n_head, dh = d / H;
  // bloom-560m ships names without the "transformer." prefix; fine-tuned exports keep it.
  const std::string prefix = ckpt.has("transformer.word_embeddings.weight") ? "transformer." : "";
  auto w = [&](const std::string& name, const Shape& shape) {
    return b.weight_f32(name, ckpt.get(name, shape));
  };
  auto qkv = [&](const std::string& name, const Shape& shape) {
    return b.weight_f32(name, regroup_qkv(ckpt.get(name, shape), H, dh));
  };

  const int ids = b.input("input_ids", DType::kI64, {Dim::sym("tokens")});
  const int rows = b.input("logit_rows", DType::kI64, {Dim::sym("rows")});
  const std::string emb_name = prefix + "word_embeddings.weight";
  const int emb = w(emb_name, {cfg.vocab_size, d});
  int x = b.embedding(emb, ids, "embed");
  x = b.layer_norm(x, w(prefix + "word_embeddings_layernorm.weight", {d}),
                   w(prefix + "word_embeddings_layernorm.bias", {d}), cfg.layer_norm_epsilon,
                   "word_embeddings_layernorm");
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    const std::string p = prefix + "h." + std::to_string(i);
    const int ln1 =
        b.layer_norm(x, w(p + ".input_layernorm.weight", {d}), w(p + ".input_layernorm.bias", {d}),
                     cfg.layer_norm_epsilon, p + ".input_layernorm");
    const int residual1 = cfg.apply_residual_connection_post_layernorm ? ln1 : x;
    const std::string sa = p + ".self_attention";
    const int fused = b.linear(ln1, qkv(sa + ".query_key_value.weight", {3 * d, d}),
                               qkv(sa + ".query_key_value.bias", {3 * d}), sa + ".query_key_value");
    AttentionAttrs a;
    a.kind = AttentionKind::kCachedSelf;
    a.layer = static_cast<int>(i);
    a.num_heads = static_cast<int>(H);
    a.head_dim = static_cast<int>(dh);
    a.causal = true;
    a.packed_qkv = true;
    a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dh)));
    a.bias = PositionBias::kAlibi;
    const int ctx = b.attention(fused, -1, -1, -1, a, sa + ".attn");
    const int dense =
        b.linear(ctx, w(sa + ".dense.weight", {d, d}), w(sa + ".dense.bias", {d}), sa + ".dense");
    x = b.add(dense, residual1, p + ".attn_residual");
    const int ln2 = b.layer_norm(x, w(p + ".post_attention_layernorm.weight", {d}),
                                 w(p + ".post_attention_layernorm.bias", {d}),
                                 cfg.layer_norm_epsilon, p + ".post_attention_layernorm");
    const int residual2 = cfg.apply_residual_connection_post_layernorm ? ln2 : x;
    const std::string m = p + ".mlp";
    const int up = b.linear(ln2, w(m + ".dense_h_to_4h.weight", {4 * d, d}),
                            w(m + ".dense_h_to_4h.bias", {4 * d}), m + ".dense_h_to_4h");
    const int act = b.activation(up, Activation::kGeluTanh, m + ".gelu");
    const int down = b.linear(act, w(m + ".dense_4h_to_h.weight", {d, 4 * d}),
                              w(m + ".dense_4h_to_h.bias", {d}), m + ".dense_4h_to_h");
    x = b.add(down, residual2, p + ".mlp_residual");
  }
  x = b.gather_rows(x, rows, "gather_logit_rows");
  x = b.layer_norm(x, w(prefix + "ln_f.weight", {d}), w(prefix + "ln_f.bias", {d}),
                   cfg.layer_norm_epsilon, "ln_f");
  int head;
  if (!cfg.tie_word_embeddings && ckpt.has("lm_head.weight")) {
    head = w("lm_head.weight", {cfg.vocab_size, d});
  } else {
    head = emb;
    log.info("bloom: lm_head tied to {}", emb_name);
  }
  b.output(b.linear(x, head, -1, "lm_head"), "logits");
  std::vector<Graph> graphs;
  graphs.push_back(b.finish());
  return graphs;
}

}  // namespace kiln
