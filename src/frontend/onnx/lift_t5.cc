// T5 from a lifted encoder export and a decoder export without past inputs (T5ForConditional-
// Generation through torch.onnx.export): shared embedding, per block RMSNorm → q/k/v → attention
// with the relative-position table of block 0 → o → residual (the decoder then RMSNorm → q →
// cross attention over encoder_hidden_states' k/v → o → residual), RMSNorm → gated-GELU or ReLU
// FFN → residual; final RMSNorm; the decoder's lm_head (optionally after d_model^-0.5).
#include <cmath>
#include <tuple>

#include "frontend/onnx/lift_model.h"

namespace kiln {
namespace {

struct T5Stack {
  Assembly& as;
  T5Config& cfg;
  std::map<std::string, Tensor>& t;
  const std::string stack;  // "encoder" / "decoder"
  int table = -1;           // block 0's relative-bias table (value)
  bool& ffn_seen;           // an FFN (of either stack) set the config's FFN fields

  const LiftedOp& norm(int x, const std::string& step, const std::string& name) {
    const LiftedOp& ln = as.op_reading(x, LiftedKind::kRmsNorm, step);
    if (ln.eps != cfg.layer_norm_epsilon)
      as.fail(step, fmt::format("epsilon {} differs from the first norm's {}", ln.eps,
                                cfg.layer_norm_epsilon));
    t[name] = ln.weight;
    return ln;
  }

  const LiftedOp& attention_of(int q_value, const std::string& step) {
    for (const LiftedOp& op : as.lifted.ops)
      if (op.kind == LiftedKind::kAttention && op.attention.q == q_value) return op;
    as.fail(step,
            fmt::format("no attention reads the query projection '{}'", as.g.value_name(q_value)));
  }

  // Projections read from `x` (self) or from `kv_source` (cross); returns the attention output
  // after o, before the residual.
  int attention(int h, int kv_source, bool self, int block, const std::string& prefix,
                const std::string& step) {
    const LiftedOp* q = nullptr;
    for (const LiftedOp& op : as.lifted.ops)
      if (op.kind == LiftedKind::kLinear && as.g.through_casts(op.input) == as.g.through_casts(h))
        for (const LiftedOp& a : as.lifted.ops)
          if (a.kind == LiftedKind::kAttention && a.attention.q == op.output) q = &op;
    if (!q) as.fail(step, "no query projection feeding an attention reads the norm");
    const LiftedOp& attn = attention_of(q->output, step);
    const LiftedAttention& a = attn.attention;
    const int ki = as.lifted.op_computing(a.k), vi = as.lifted.op_computing(a.v);
    if (a.fused_qkv || ki < 0 || vi < 0) as.fail(step, "q, k and v are not three projections");
    const LiftedOp& k = as.lifted.ops[ki];
    const LiftedOp& v = as.lifted.ops[vi];
    const int source = self ? h : kv_source;
    if (as.g.through_casts(k.input) != as.g.through_casts(source) ||
        as.g.through_casts(v.input) != as.g.through_casts(source))
      as.fail(step, fmt::format("k and v do not read '{}'", as.g.value_name(source)));
    if (q->bias.defined() || k.bias.defined() || v.bias.defined())
      as.fail(step, "T5's projections have no bias");
    if (a.scale != 1.0f)
      as.fail(step, fmt::format("scores are scaled by {}, T5's are not", a.scale));
    if (cfg.num_heads == 0) {
      cfg.num_heads = a.num_heads;
      cfg.d_kv = a.head_dim;
    }
    if (a.num_heads != cfg.num_heads || a.head_dim != cfg.d_kv)
      as.fail(step, "the heads differ from the first attention's");
    if (self) {
      const bool causal = stack == "decoder";
      if (a.causal != causal)
        as.fail(step, causal ? "the decoder's self-attention is not causal"
                             : "the encoder's self-attention is causal");
      if (a.bias != PositionBias::kT5Relative)
        as.fail(step, "the self-attention has no T5 relative-position bias");
      if (block == 0) {
        table = a.bias_table;
        cfg.relative_attention_num_buckets = a.num_buckets;
        cfg.relative_attention_max_distance = a.max_distance;
        t[stack + ".block.0.layer.0.SelfAttention.relative_attention_bias.weight"] =
            as.g.constant(table)->to_kiln();
      } else if (a.bias_table != table || a.num_buckets != cfg.relative_attention_num_buckets ||
                 a.max_distance != cfg.relative_attention_max_distance) {
        as.fail(step, "the relative-position bias is not block 0's");
      }
    } else if (a.bias != PositionBias::kNone || a.causal) {
      as.fail(step, "the cross attention has a position bias or a causal mask");
    }
    const LiftedOp& o = as.op_reading(attn.output, LiftedKind::kLinear, step + " o");
    if (o.bias.defined()) as.fail(step, "T5's o projection has no bias");
    t[prefix + ".q.weight"] = q->weight;
    t[prefix + ".k.weight"] = k.weight;
    t[prefix + ".v.weight"] = v.weight;
    t[prefix + ".o.weight"] = o.weight;
    return o.output;
  }

  std::tuple<bool, Activation, int64_t>& first_ffn;

  int ffn(int h, const std::string& prefix, const std::string& step) {
    // Gated: act(wi_0 h) * (wi_1 h); else act(wi h). GELU is lifted; ReLU is one node.
    std::vector<const LiftedOp*> ins;
    for (const LiftedOp& op : as.lifted.ops)
      if (op.kind == LiftedKind::kLinear && as.g.through_casts(op.input) == as.g.through_casts(h))
        ins.push_back(&op);
    int hidden = -1;
    for (const LiftedOp* wi : ins) {
      Activation act = Activation::kRelu;
      int act_out = -1;
      if (const LiftedOp* gelu = as.find_op_reading(wi->output, LiftedKind::kGelu)) {
        act = gelu->activation;
        act_out = gelu->output;
      } else {
        for (int n : as.g.users(as.g.through_casts(wi->output)))
          if (as.g.node(n).op_type == "Relu") {
            act_out = as.g.node(n).outputs[0];
            as.used_nodes.push_back(n);
          }
      }
      if (act_out < 0) continue;
      cfg.ffn_activation = act;
      if (wi->bias.defined()) as.fail(step, "T5's FFN projections have no bias");
      cfg.d_ff = wi->weight.dim(0);
      int mul = -1;
      for (const LiftedOp* up : ins) {
        if (up == wi) continue;
        for (int n : as.g.users(as.g.through_casts(act_out))) {
          const ImportNode& node = as.g.node(n);
          if (node.op_type != "Mul") continue;
          const int other =
              node.inputs[0] == as.g.through_casts(act_out) ? node.inputs[1] : node.inputs[0];
          if (as.g.through_casts(other) == as.g.through_casts(up->output)) {
            mul = n;
            cfg.gated_ffn = true;
            t[prefix + ".wi_0.weight"] = wi->weight;
            t[prefix + ".wi_1.weight"] = up->weight;
            as.used_nodes.push_back(n);
            hidden = node.outputs[0];
          }
        }
      }
      if (mul < 0) {
        cfg.gated_ffn = false;
        t[prefix + ".wi.weight"] = wi->weight;
        hidden = act_out;
      }
      break;
    }
    if (hidden < 0) as.fail(step, "no FFN projection followed by GELU or ReLU reads the norm");
    const auto shape = std::make_tuple(cfg.gated_ffn, cfg.ffn_activation, cfg.d_ff);
    if (ffn_seen && shape != first_ffn)
      as.fail(step,
              "the feed-forward differs from the first block's (activation, gating or "
              "width)");
    ffn_seen = true;
    first_ffn = shape;
    const LiftedOp& wo = as.op_reading(hidden, LiftedKind::kLinear, step + " wo");
    if (wo.bias.defined()) as.fail(step, "T5's wo has no bias");
    t[prefix + ".wo.weight"] = wo.weight;
    return wo.output;
  }

  // The blocks from `x` to the final norm; returns the final norm's output.
  int blocks(int x, int kv_source, int64_t* count) {
    int64_t block = 0;
    for (;; ++block) {
      const std::string p = stack + ".block." + std::to_string(block);
      const std::string step = fmt::format("{} block {}", stack, block);
      const LiftedOp& ln0 = as.op_reading(x, LiftedKind::kRmsNorm, step + " first norm");
      if (block == 0) cfg.layer_norm_epsilon = ln0.eps;
      // The final norm: nothing reads it through a query projection and attention.
      bool more = false;
      for (const LiftedOp& op : as.lifted.ops)
        if (op.kind == LiftedKind::kLinear &&
            as.g.through_casts(op.input) == as.g.through_casts(ln0.output))
          for (const LiftedOp& a : as.lifted.ops)
            if (a.kind == LiftedKind::kAttention && a.attention.q == op.output) more = true;
      if (!more) {
        if (block == 0) as.fail(step, "no attention after the first norm");
        t[stack + ".final_layer_norm.weight"] = ln0.weight;
        *count = block;
        return ln0.output;
      }
      norm(x, step, p + ".layer.0.layer_norm.weight");
      const int a = attention(ln0.output, -1, true, static_cast<int>(block),
                              p + ".layer.0.SelfAttention", step + " self-attention");
      x = as.add_of(a, x, step + " self-attention residual");
      int layer = 1;
      if (stack == "decoder") {
        const LiftedOp& ln1 = norm(x, step + " cross norm", p + ".layer.1.layer_norm.weight");
        const int c = attention(ln1.output, kv_source, false, static_cast<int>(block),
                                p + ".layer.1.EncDecAttention", step + " cross attention");
        x = as.add_of(c, x, step + " cross-attention residual");
        layer = 2;
      }
      const std::string lp = p + ".layer." + std::to_string(layer);
      const LiftedOp& ln2 = norm(x, step + " FFN norm", lp + ".layer_norm.weight");
      const int f = ffn(ln2.output, lp + ".DenseReluDense", step + " FFN");
      x = as.add_of(f, x, step + " FFN residual");
    }
  }
};

}  // namespace

LiftedModel assemble_t5(const PatternGraph& eg, const LiftResult& el, const PatternGraph& dg,
                        const LiftResult& dl, const Logger& log) {
  LiftedModel m;
  T5Config cfg;
  cfg.num_heads = 0;
  auto& t = m.tensors;
  Assembly enc(eg, el, "T5 encoder");
  Assembly dec(dg, dl, "T5 decoder");
  const int enc_output = enc.model_output("last_hidden_state");
  const int dec_output = dec.model_output("logits");
  const int enc_ids = eg.graph().find_value("input_ids");
  const int dec_ids = dg.graph().find_value("input_ids");
  const int states = dg.graph().find_value("encoder_hidden_states");
  if (enc_ids < 0) enc.fail("inputs", "no graph input named 'input_ids'");
  if (dec_ids < 0) dec.fail("inputs", "no graph input named 'input_ids'");

  const LiftedOp& e_emb = enc.op_reading(enc_ids, LiftedKind::kEmbedding, "embedding");
  const LiftedOp& d_emb = dec.op_reading(dec_ids, LiftedKind::kEmbedding, "embedding");
  if (!same_values(e_emb.weight, d_emb.weight))
    dec.fail("embedding", "the decoder's embedding is not the encoder's (T5 shares one)");
  cfg.vocab_size = e_emb.weight.dim(0);
  cfg.d_model = e_emb.weight.dim(1);
  t["shared.weight"] = e_emb.weight;

  bool ffn_seen = false;
  std::tuple<bool, Activation, int64_t> first_ffn;
  T5Stack es{enc, cfg, t, "encoder", -1, ffn_seen, first_ffn};
  int64_t enc_layers = 0, dec_layers = 0;
  const int enc_out = es.blocks(e_emb.output, -1, &enc_layers);
  if (eg.through_casts(enc_output) != eg.through_casts(enc_out))
    enc.fail("output", "the final norm's output is not the graph output");
  enc.check_all_lifted(enc_output);
  cfg.num_layers = enc_layers;

  const double eps = cfg.layer_norm_epsilon;
  T5Stack ds{dec, cfg, t, "decoder", -1, ffn_seen, first_ffn};
  const int dec_out = ds.blocks(d_emb.output, states, &dec_layers);
  if (cfg.layer_norm_epsilon != eps)
    dec.fail("norms", "the decoder's epsilon is not the encoder's");
  cfg.num_decoder_layers = dec_layers;
  // lm_head, optionally after d_model^-0.5.
  int head_in = dec_out;
  cfg.scale_decoder_outputs = false;
  for (int n : dg.users(dg.through_casts(dec_out))) {
    const ImportNode& node = dg.node(n);
    const int in = node.op_type == "Mul" ? dg.non_constant_input(n) : -1;
    if (in < 0) continue;
    const std::optional<double> c = dg.scalar(node.inputs[1 - in]);
    const double want = 1.0 / std::sqrt(static_cast<double>(cfg.d_model));
    // A half graph holds the factor rounded to its type (2^-11 relative for fp16).
    const double tolerance = is_half_type(dg.probe_type(node.inputs[in])) ? 1.0 / 256 : 1e-6;
    if (c && std::fabs(*c - want) <= tolerance * want) {
      cfg.scale_decoder_outputs = true;
      head_in = node.outputs[0];
      dec.used_nodes.push_back(n);
    }
  }
  const LiftedOp& head = dec.op_reading(head_in, LiftedKind::kLinear, "lm_head");
  if (head.bias.defined()) dec.fail("lm_head", "lm_head has a bias");
  if (dg.through_casts(dec_output) != dg.through_casts(head.output))
    dec.fail("lm_head", "lm_head's output is not the graph output");
  cfg.tie_word_embeddings = same_values(head.weight, e_emb.weight);
  if (!cfg.tie_word_embeddings) t["lm_head.weight"] = head.weight;
  dec.check_all_lifted(dec_output);

  m.notes.push_back(fmt::format(
      "T5: {}+{} layers, d_model {}, {} heads x {}, d_ff {} ({}{}), {} buckets / max distance "
      "{}, lm_head {}{}",
      cfg.num_layers, cfg.num_decoder_layers, cfg.d_model, cfg.num_heads, cfg.d_kv, cfg.d_ff,
      cfg.gated_ffn ? "gated " : "", activation_name(cfg.ffn_activation),
      cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance,
      cfg.tie_word_embeddings ? "tied" : "its own weight",
      cfg.scale_decoder_outputs ? ", decoder output scaled by d_model^-0.5" : ""));
  m.notes.push_back(fmt::format(
      "T5: special ids not in the ONNX files: pad {}, eos {}, decoder start {} (HuggingFace's "
      "defaults)",
      cfg.pad_token_id, cfg.eos_token_id, cfg.decoder_start_token_id));
  (void)log;
  m.config.arch = Architecture::kT5;
  m.config.config = cfg;
  return m;
}

}  // namespace kiln
