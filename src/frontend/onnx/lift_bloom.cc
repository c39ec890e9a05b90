// BLOOM from a lifted causal-LM export (BloomForCausalLM through torch.onnx.export): embedding,
// its LayerNorm, per layer LayerNorm → fused QKV linear → ALiBi causal attention → dense →
// residual, LayerNorm → linear → GELU → linear → residual, then ln_f and lm_head (tied when
// its weight is the embedding's).
#include <cmath>

#include "frontend/onnx/lift_model.h"

namespace kiln {

LiftedModel assemble_bloom(const PatternGraph& g, const LiftResult& lifted, const Logger& log) {
  Assembly as(g, lifted, "BLOOM causal LM");
  const ImportGraph& graph = g.graph();
  const int logits = as.model_output("logits");
  const int ids = graph.find_value("input_ids");
  if (ids < 0 || graph.values()[ids].kind != ImportValueKind::kInput)
    as.fail("inputs", "no graph input named 'input_ids'");

  LiftedModel m;
  BloomConfig cfg;
  auto& t = m.tensors;
  const LiftedOp& emb = as.op_reading(ids, LiftedKind::kEmbedding, "embedding");
  cfg.vocab_size = emb.weight.dim(0);
  cfg.hidden_size = emb.weight.dim(1);
  t["word_embeddings.weight"] = emb.weight;
  const LiftedOp& emb_ln = as.op_reading(emb.output, LiftedKind::kLayerNorm, "embedding norm");
  t["word_embeddings_layernorm.weight"] = emb_ln.weight;
  t["word_embeddings_layernorm.bias"] = emb_ln.bias;
  cfg.layer_norm_epsilon = emb_ln.eps;
  auto check_norm = [&](const LiftedOp& ln, const std::string& step) {
    if (!ln.bias.defined()) as.fail(step, "the LayerNorm has no bias");
    if (ln.eps != cfg.layer_norm_epsilon)
      as.fail(step, fmt::format("epsilon {} differs from the embedding norm's {}", ln.eps,
                                cfg.layer_norm_epsilon));
  };
  check_norm(emb_ln, "embedding norm");

  int x = emb_ln.output;
  int64_t layer = 0;
  for (;; ++layer) {
    const std::string step = fmt::format("layer {}", layer);
    const LiftedOp& ln1 = as.op_reading(x, LiftedKind::kLayerNorm, step + " input norm");
    // The final norm: what reads it is lm_head, not a QKV projection with an attention.
    const LiftedOp* qkv = as.find_op_reading(ln1.output, LiftedKind::kLinear);
    if (!qkv || !as.find_op_reading(qkv->output, LiftedKind::kAttention)) {
      if (layer == 0) as.fail(step, "no fused QKV projection and attention after the input norm");
      break;
    }
    check_norm(ln1, step + " input norm");
    const LiftedOp* attn = nullptr;
    for (const LiftedOp& op : lifted.ops)
      if (op.kind == LiftedKind::kAttention && op.attention.q == qkv->output) attn = &op;
    if (!attn) as.fail(step, "no attention reads the QKV projection");
    const LiftedAttention& a = attn->attention;
    if (!a.fused_qkv) as.fail(step, "q, k and v are not one fused projection");
    if (a.bias != PositionBias::kAlibi) as.fail(step, "the attention has no ALiBi bias");
    if (!a.causal) as.fail(step, "the attention is not causal");
    if (a.num_heads * a.head_dim != cfg.hidden_size)
      as.fail(step, fmt::format("{} heads x {} is not the hidden size {}", a.num_heads, a.head_dim,
                                cfg.hidden_size));
    // An fp16/bf16 export stores the scale (BLOOM's: head_dim^-1/4 on q and on k) rounded to
    // its type: 2^-8 relative covers both factors in bf16.
    const double want_scale = 1.0 / std::sqrt(static_cast<double>(a.head_dim));
    const double tolerance = is_half_type(as.g.probe_type(attn->input)) ? 1.0 / 256 : 1e-6;
    if (std::fabs(a.scale - want_scale) > tolerance * want_scale)
      as.fail(step, fmt::format("scores are scaled by {}, not 1/sqrt(head_dim) = {}", a.scale,
                                want_scale));
    if (layer == 0) cfg.n_head = a.num_heads;
    if (a.num_heads != cfg.n_head) as.fail(step, "the number of heads differs from layer 0's");
    if (!qkv->bias.defined()) as.fail(step, "the QKV projection has no bias");
    const LiftedOp& dense = as.op_reading(attn->output, LiftedKind::kLinear, step + " dense");
    if (!dense.bias.defined()) as.fail(step, "the attention's dense projection has no bias");
    // Residual from before or after the input norm.
    int add = -1;
    const int partner = as.add_partner(dense.output, &add);
    if (partner < 0) as.fail(step, "the attention output is not added to a residual");
    const bool post = g.through_casts(partner) == g.through_casts(ln1.output);
    if (layer == 0) cfg.apply_residual_connection_post_layernorm = post;
    if (post != cfg.apply_residual_connection_post_layernorm ||
        (!post && g.through_casts(partner) != g.through_casts(x)))
      as.fail(step, "the attention residual is neither the layer input nor its norm");
    const int x1 = as.add_of(dense.output, partner, step + " attention residual");
    const LiftedOp& ln2 = as.op_reading(x1, LiftedKind::kLayerNorm, step + " post-attention norm");
    check_norm(ln2, step + " post-attention norm");
    const LiftedOp& up = as.op_reading(ln2.output, LiftedKind::kLinear, step + " dense_h_to_4h");
    const LiftedOp& gelu = as.op_reading(up.output, LiftedKind::kGelu, step + " gelu");
    if (gelu.activation != Activation::kGeluTanh) as.fail(step, "the GELU is not tanh GELU");
    const LiftedOp& down = as.op_reading(gelu.output, LiftedKind::kLinear, step + " dense_4h_to_h");
    if (!up.bias.defined() || !down.bias.defined())
      as.fail(step, "the MLP projections have no bias");
    if (up.weight.dim(0) != 4 * cfg.hidden_size)
      as.fail(step, fmt::format("the MLP is {} wide, not 4 x hidden", up.weight.dim(0)));
    x = as.add_of(down.output, post ? ln2.output : x1, step + " MLP residual");

    const std::string p = "h." + std::to_string(layer);
    t[p + ".input_layernorm.weight"] = ln1.weight;
    t[p + ".input_layernorm.bias"] = ln1.bias;
    t[p + ".self_attention.query_key_value.weight"] = qkv->weight;
    t[p + ".self_attention.query_key_value.bias"] = qkv->bias;
    t[p + ".self_attention.dense.weight"] = dense.weight;
    t[p + ".self_attention.dense.bias"] = dense.bias;
    t[p + ".post_attention_layernorm.weight"] = ln2.weight;
    t[p + ".post_attention_layernorm.bias"] = ln2.bias;
    t[p + ".mlp.dense_h_to_4h.weight"] = up.weight;
    t[p + ".mlp.dense_h_to_4h.bias"] = up.bias;
    t[p + ".mlp.dense_4h_to_h.weight"] = down.weight;
    t[p + ".mlp.dense_4h_to_h.bias"] = down.bias;
    log.debug("lift: BLOOM layer {}: {}", layer, attn->summary());
  }
  cfg.n_layer = layer;
  const LiftedOp& ln_f = as.op_reading(x, LiftedKind::kLayerNorm, "final norm");
  check_norm(ln_f, "final norm");
  t["ln_f.weight"] = ln_f.weight;
  t["ln_f.bias"] = ln_f.bias;
  const LiftedOp& head = as.op_reading(ln_f.output, LiftedKind::kLinear, "lm_head");
  if (head.bias.defined()) as.fail("lm_head", "lm_head has a bias");
  if (g.through_casts(logits) != g.through_casts(head.output))
    as.fail("lm_head",
            fmt::format("lm_head's output is not the graph output '{}'", g.value_name(logits)));
  if (head.weight.shape() != emb.weight.shape())
    as.fail("lm_head", fmt::format("lm_head is {}, the embedding {}",
                                   shape_str(head.weight.shape()), shape_str(emb.weight.shape())));
  cfg.tie_word_embeddings = same_values(head.weight, emb.weight);
  if (!cfg.tie_word_embeddings) t["lm_head.weight"] = head.weight;
  as.check_all_lifted(logits);

  m.notes.push_back(
      fmt::format("BLOOM: {} layers, hidden {}, {} heads, vocab {}, LayerNorm eps {:g}, lm_head {}",
                  cfg.n_layer, cfg.hidden_size, cfg.n_head, cfg.vocab_size, cfg.layer_norm_epsilon,
                  cfg.tie_word_embeddings ? "tied to the embedding" : "its own weight"));
  m.notes.push_back(fmt::format(
      "BLOOM: special ids not in the ONNX file: bos {}, eos {}, pad {} (HuggingFace's defaults)",
      cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id));
  m.config.arch = Architecture::kBloom;
  m.config.config = cfg;
  return m;
}

}  // namespace kiln
