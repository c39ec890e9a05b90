#include "graph/attrs.h"

#include <fmt/format.h>

#include "core/status.h"

namespace kiln {

using nlohmann::json;

std::string_view activation_name(Activation a) {
  switch (a) {
    case Activation::kRelu:
      return "relu";
    case Activation::kGeluTanh:
      return "gelu_tanh";
    case Activation::kGeluExact:
      return "gelu_exact";
    case Activation::kSilu:
      return "silu";
  }
  return "?";
}

bool parse_activation_name(std::string_view name, Activation* out) {
  for (Activation a :
       {Activation::kRelu, Activation::kGeluTanh, Activation::kGeluExact, Activation::kSilu})
    if (activation_name(a) == name) {
      *out = a;
      return true;
    }
  return false;
}

std::string_view attention_kind_name(AttentionKind k) {
  switch (k) {
    case AttentionKind::kEncoderSelf:
      return "encoder_self";
    case AttentionKind::kCachedSelf:
      return "cached_self";
    case AttentionKind::kCross:
      return "cross";
  }
  return "?";
}

std::string_view position_bias_name(PositionBias b) {
  switch (b) {
    case PositionBias::kNone:
      return "none";
    case PositionBias::kT5Relative:
      return "t5_relative";
    case PositionBias::kAlibi:
      return "alibi";
  }
  return "?";
}

std::string_view input_norm_name(InputNorm n) {
  return n == InputNorm::kLayerNorm ? "layer_norm" : "rms_norm";
}

std::string_view attr_kind_name(AttrKind k) {
  switch (k) {
    case AttrKind::kNone:
      return "none";
    case AttrKind::kLinear:
      return "linear";
    case AttrKind::kScale:
      return "scale";
    case AttrKind::kNorm:
      return "norm";
    case AttrKind::kActivation:
      return "activation";
    case AttrKind::kCast:
      return "cast";
    case AttrKind::kAttention:
      return "attention";
  }
  return "?";
}

namespace {

struct Summary {
  std::string operator()(const NoAttrs&) const { return {}; }
  std::string operator()(const LinearAttrs& a) const {
    std::string s = a.epilogue.activation
                        ? fmt::format(" act={}", activation_name(*a.epilogue.activation))
                        : std::string();
    if (a.tf32) s += " tf32";
    if (a.epilogue.norm)
      s += fmt::format(" norm={} eps={}", input_norm_name(*a.epilogue.norm), a.epilogue.norm_eps);
    if (a.epilogue.widen) s += " widen=f32";
    if (!a.tactics.empty()) {
      s += " tactics=";
      for (const LinearTactic& t : a.tactics)
        s += fmt::format("{}{}:{}", &t == &a.tactics.front() ? "" : ",", t.rows, t.kernel);
    }
    return s;
  }
  std::string operator()(const ScaleAttrs& a) const { return fmt::format(" scale={}", a.scale); }
  std::string operator()(const NormAttrs& a) const { return fmt::format(" eps={}", a.eps); }
  std::string operator()(const ActivationAttrs& a) const {
    return fmt::format(" act={}", activation_name(a.activation));
  }
  std::string operator()(const CastAttrs& a) const {
    return fmt::format(" to={}", dtype_name(a.to));
  }
  std::string operator()(const AttentionAttrs& a) const {
    return fmt::format(" kind={} layer={} heads={} head_dim={} causal={} scale={} bias={}{}",
                       attention_kind_name(a.kind), a.layer, a.num_heads, a.head_dim, a.causal,
                       a.scale, position_bias_name(a.bias), a.packed_qkv ? " packed" : "");
  }
};

struct ToJson {
  json operator()(const NoAttrs&) const { return json::object(); }
  json operator()(const LinearAttrs& a) const {
    json j = json::object();
    if (a.epilogue.activation) j["activation"] = activation_name(*a.epilogue.activation);
    if (a.tf32) j["tf32"] = true;
    if (a.epilogue.norm) {
      j["norm"] = input_norm_name(*a.epilogue.norm);
      j["norm_eps"] = a.epilogue.norm_eps;
    }
    if (a.epilogue.widen) j["widen"] = true;
    for (const LinearTactic& t : a.tactics)
      j["tactics"].push_back(
          {{"rows", t.rows}, {"kernel", t.kernel}, {"algo", t.algo}, {"us", t.us}});
    return j;
  }
  json operator()(const ScaleAttrs& a) const { return {{"scale", a.scale}}; }
  json operator()(const NormAttrs& a) const { return {{"eps", a.eps}}; }
  json operator()(const ActivationAttrs& a) const {
    return {{"activation", activation_name(a.activation)}};
  }
  json operator()(const CastAttrs& a) const { return {{"to", dtype_name(a.to)}}; }
  json operator()(const AttentionAttrs& a) const {
    return {{"kind", attention_kind_name(a.kind)},
            {"bias", position_bias_name(a.bias)},
            {"layer", a.layer},
            {"num_heads", a.num_heads},
            {"head_dim", a.head_dim},
            {"causal", a.causal},
            {"packed_qkv", a.packed_qkv},
            {"scale", a.scale},
            {"bidirectional_buckets", a.bidirectional_buckets},
            {"num_buckets", a.num_buckets},
            {"max_distance", a.max_distance}};
  }
};

Activation activation_from(const json& j, const std::string& source) {
  const std::string name = j.get<std::string>();
  Activation a;
  KILN_CHECK(parse_activation_name(name, &a),
             "{}: unknown activation '{}' (expected relu, gelu_tanh, gelu_exact or silu)", source,
             name);
  return a;
}

template <typename E>
E enum_by_name(const json& j, std::initializer_list<E> values, std::string_view (*name)(E),
               const char* what, const std::string& source) {
  const std::string s = j.get<std::string>();
  for (E v : values)
    if (name(v) == s) return v;
  KILN_FAIL("{}: unknown {} '{}'", source, what, s);
}

}  // namespace

std::string attrs_summary(const OpAttrs& attrs) { return std::visit(Summary{}, attrs); }

json attrs_to_json(const OpAttrs& attrs) { return std::visit(ToJson{}, attrs); }

OpAttrs attrs_from_json(const json& j, AttrKind kind, const std::string& source) {
  KILN_CHECK(j.is_object(), "{}: attributes must be an object", source);
  switch (kind) {
    case AttrKind::kNone:
      return NoAttrs{};
    case AttrKind::kLinear: {
      LinearAttrs a;
      if (j.contains("activation"))
        a.epilogue.activation = activation_from(j.at("activation"), source);
      if (j.contains("tf32")) a.tf32 = j.at("tf32").get<bool>();
      KILN_CHECK(j.contains("norm") || !j.contains("norm_eps"),
                 "{}: a linear's norm_eps without its norm", source);
      if (j.contains("norm")) {
        a.epilogue.norm = enum_by_name(j.at("norm"), {InputNorm::kLayerNorm, InputNorm::kRmsNorm},
                                       input_norm_name, "fused linear norm", source);
        a.epilogue.norm_eps = j.at("norm_eps").get<double>();
        KILN_CHECK(a.epilogue.norm_eps >= 0.0, "{}: negative norm epsilon {}", source,
                   a.epilogue.norm_eps);
      }
      if (j.contains("widen")) a.epilogue.widen = j.at("widen").get<bool>();
      if (j.contains("tactics")) {
        int64_t last = 0;
        for (const json& t : j.at("tactics")) {
          LinearTactic tactic{t.at("rows").get<int64_t>(), t.at("kernel").get<std::string>(),
                              t.at("algo").get<std::string>(), t.at("us").get<float>()};
          KILN_CHECK(tactic.rows > last && (tactic.kernel == "gemv" || tactic.kernel == "skinny" ||
                                            tactic.kernel == "cublaslt"),
                     "{}: invalid linear tactic (rows {} after {}, kernel '{}'): rows ascend, "
                     "kernels are gemv, skinny or cublaslt",
                     source, tactic.rows, last, tactic.kernel);
          last = tactic.rows;
          a.tactics.push_back(std::move(tactic));
        }
      }
      return a;
    }
    case AttrKind::kScale:
      return ScaleAttrs{j.at("scale").get<float>()};
    case AttrKind::kNorm: {
      NormAttrs a{j.at("eps").get<double>()};
      KILN_CHECK(a.eps >= 0.0, "{}: negative norm epsilon {}", source, a.eps);
      return a;
    }
    case AttrKind::kActivation:
      return ActivationAttrs{activation_from(j.at("activation"), source)};
    case AttrKind::kCast:
      return CastAttrs{parse_dtype(j.at("to").get<std::string>())};
    case AttrKind::kAttention: {
      AttentionAttrs a;
      a.kind = enum_by_name<AttentionKind>(
          j.at("kind"),
          {AttentionKind::kEncoderSelf, AttentionKind::kCachedSelf, AttentionKind::kCross},
          attention_kind_name, "attention kind", source);
      a.bias = enum_by_name<PositionBias>(
          j.at("bias"), {PositionBias::kNone, PositionBias::kT5Relative, PositionBias::kAlibi},
          position_bias_name, "position bias", source);
      a.layer = j.at("layer").get<int>();
      a.num_heads = j.at("num_heads").get<int>();
      a.head_dim = j.at("head_dim").get<int>();
      a.causal = j.at("causal").get<bool>();
      a.packed_qkv = j.at("packed_qkv").get<bool>();
      a.scale = j.at("scale").get<float>();
      a.bidirectional_buckets = j.at("bidirectional_buckets").get<bool>();
      a.num_buckets = j.at("num_buckets").get<int>();
      a.max_distance = j.at("max_distance").get<int>();
      KILN_CHECK(a.layer >= 0 && a.num_heads > 0 && a.head_dim > 0 && a.num_buckets > 0 &&
                     a.max_distance > 0,
                 "{}: invalid attention attributes (layer {}, {} heads of {}, {} buckets, max "
                 "distance {}): each must be positive",
                 source, a.layer, a.num_heads, a.head_dim, a.num_buckets, a.max_distance);
      return a;
    }
  }
  KILN_FAIL("{}: invalid attribute kind {}", source, static_cast<int>(kind));
}

}  // namespace kiln
