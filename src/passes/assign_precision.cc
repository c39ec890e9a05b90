// The precision pass: stores the weight matrices of Linear and Embedding nodes in the plan's
// precision (bf16, f16, or int8 with per-output-channel f32 scales) and keeps every other weight
// in f32, recording why for `kiln inspect`. Activations, norms, softmax, accumulation and the KV
// cache stay f32: only weight storage (the bytes a decode step streams) gets narrower.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/half.h"
#include "passes/pass.h"

namespace kiln {
namespace {

// How one weight is read: the node and which of its inputs.
struct Use {
  int node;
  size_t slot;
};

// The dtype matrices are stored in for a precision; f32 for fp32 (nothing to do).
DType matrix_dtype(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return DType::kF32;
    case Precision::kFp16:
      return DType::kF16;
    case Precision::kBf16:
      return DType::kBF16;
    case Precision::kInt8:
    case Precision::kInt8Weight:
      return DType::kI8;
  }
  return DType::kF32;
}

// True for the inputs that hold a weight matrix the precision applies to: a Linear's weight
// [out, in] and an Embedding's table [vocab, d].
bool is_matrix_slot(const Node& n, size_t slot) {
  return (n.op == OpKind::kLinear && slot == 1) || (n.op == OpKind::kEmbedding && slot == 0);
}

// Why a weight that is not a matrix stays f32, by the first node reading it.
std::string small_weight_reason(const Node& n, size_t slot) {
  switch (n.op) {
    case OpKind::kRmsNorm:
    case OpKind::kLayerNorm:
    case OpKind::kAddRmsNorm:
      return "norm parameters: normalization is computed in fp32 and these are one vector per "
             "norm (negligible bytes)";
    case OpKind::kLinear:
      return slot == 2 ? "Linear bias: added to the fp32 accumulator, one value per output "
                         "(negligible bytes)"
                       : "per-channel scales of an int8 weight are fp32 by definition";
    case OpKind::kAttention:
      return "position-bias table: added to fp32 attention scores (negligible bytes)";
    case OpKind::kEmbedding:
      return "per-row scales of an int8 table are fp32 by definition";
    case OpKind::kAdd:
    case OpKind::kMul:
    case OpKind::kScale:
    case OpKind::kActivation:
    case OpKind::kGatedActivation:
    case OpKind::kSoftmax:
    case OpKind::kCast:
    case OpKind::kGatherRows:
      break;
  }
  return fmt::format("read by {} '{}', which computes in fp32", op_name(n.op), n.name);
}

// Symmetric int8 per row: scale = max|row| / 127, q = round(w / scale) in [-127, 127]. An
// all-zero row gets scale 0 (its outputs are exactly 0, as they were).
void quantize_rows(const Tensor& w, Tensor* q, Tensor* scales) {
  const int64_t rows = w.dim(0), cols = w.dim(1);
  *q = Tensor::empty(DType::kI8, w.shape());
  *scales = Tensor::empty(DType::kF32, {rows});
  const float* src = w.data<float>();
  int8_t* dst = q->data<int8_t>();
  float* s = scales->data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = src + r * cols;
    float amax = 0.0f;
    for (int64_t i = 0; i < cols; ++i) amax = std::max(amax, std::fabs(row[i]));
    const float scale = amax / 127.0f;
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    for (int64_t i = 0; i < cols; ++i)
      dst[r * cols + i] =
          static_cast<int8_t>(std::clamp(std::nearbyint(row[i] * inv), -127.0f, 127.0f));
    s[r] = scale;
  }
}

// Why a matrix cannot be stored as `to`; empty when it can.
std::string narrowing_refused(const Tensor& w, DType to) {
  const float* p = w.data<float>();
  float amax = 0.0f;
  for (int64_t i = 0; i < w.numel(); ++i) {
    if (!std::isfinite(p[i])) return "holds a non-finite value";
    amax = std::max(amax, std::fabs(p[i]));
  }
  if (to == DType::kF16 && amax > 65504.0f)
    return fmt::format("max |w| = {:g} exceeds fp16's largest finite value 65504", amax);
  return {};
}

}  // namespace

int assign_precision(Graph& graph, Precision precision, std::vector<PrecisionNote>* notes,
                     const Logger& log) {
  const DType to = matrix_dtype(precision);
  if (to == DType::kF32) return 0;
  KILN_CHECK(precision != Precision::kInt8,
             "assign_precision: int8 activations need calibration, which kiln does not do yet; "
             "int8-weight quantizes the weights only");
  std::vector<std::vector<Use>> uses(graph.values.size());
  for (size_t i = 0; i < graph.nodes.size(); ++i)
    for (size_t s = 0; s < graph.nodes[i].inputs.size(); ++s)
      if (graph.nodes[i].inputs[s] >= 0)
        uses[graph.nodes[i].inputs[s]].push_back({static_cast<int>(i), s});

  auto note = [&](const Value& v, std::string reason) {
    log.debug("assign_precision[{}]: {} stays {}: {}", graph.name, v.name, dtype_name(v.dtype),
              reason);
    if (notes) notes->push_back({graph.name, v.name, std::move(reason)});
  };
  int converted = 0;
  int64_t bytes_before = 0, bytes_after = 0;
  const size_t num_values = graph.values.size();  // scales are appended below
  for (size_t id = 0; id < num_values; ++id) {
    if (graph.values[id].kind != ValueKind::kWeight || uses[id].empty()) continue;
    if (graph.values[id].dtype != DType::kF32) {
      note(graph.values[id], fmt::format("already {} in the graph (not an f32 weight)",
                                         dtype_name(graph.values[id].dtype)));
      continue;
    }
    const bool all_matrix = std::all_of(uses[id].begin(), uses[id].end(), [&](const Use& u) {
      return is_matrix_slot(graph.nodes[u.node], u.slot);
    });
    if (!all_matrix) {
      // A matrix also read as something else (never in the HF graphs) stays f32 for that reader.
      const auto other = std::find_if(uses[id].begin(), uses[id].end(), [&](const Use& u) {
        return !is_matrix_slot(graph.nodes[u.node], u.slot);
      });
      note(graph.values[id], small_weight_reason(graph.nodes[other->node], other->slot));
      continue;
    }
    if (const std::string why = narrowing_refused(graph.values[id].data, to); !why.empty()) {
      note(graph.values[id], why);
      log.warn("assign_precision[{}]: {} stays f32: {}", graph.name, graph.values[id].name, why);
      continue;
    }
    bytes_before += static_cast<int64_t>(graph.values[id].data.nbytes());
    if (to == DType::kI8) {
      Tensor q, scales;
      quantize_rows(graph.values[id].data, &q, &scales);
      bytes_after += static_cast<int64_t>(scales.nbytes());
      const int scales_id = graph.add_weight(graph.values[id].name + ".scales", std::move(scales));
      graph.set_weight_data(static_cast<int>(id), std::move(q));
      Value& v = graph.values[id];
      v.dtype = DType::kI8;
      for (const Use& u : uses[id]) {
        Node& n = graph.nodes[u.node];
        const size_t scale_slot = n.op == OpKind::kLinear ? 3 : 2;
        if (n.inputs.size() <= scale_slot) n.inputs.resize(scale_slot + 1, -1);
        n.inputs[scale_slot] = scales_id;
      }
    } else {
      graph.set_weight_data(static_cast<int>(id), graph.values[id].data.to(to));
      Value& v = graph.values[id];
      v.dtype = to;
      // An Embedding of a narrow table gathers narrow rows; widen them for the f32 graph.
      for (const Use& u : uses[id]) {
        Node& n = graph.nodes[u.node];
        if (n.op != OpKind::kEmbedding) continue;
        const int out = n.outputs[0];
        Value narrow;
        narrow.name = graph.values[out].name + "." + std::string(dtype_name(to));
        narrow.dtype = to;
        narrow.shape = graph.values[out].shape;
        narrow.producer = u.node;
        graph.values.push_back(std::move(narrow));
        const int narrow_id = static_cast<int>(graph.values.size()) - 1;
        graph.nodes[u.node].outputs[0] = narrow_id;
        Node cast;
        cast.op = OpKind::kCast;
        cast.name = graph.nodes[u.node].name + ".widen";
        cast.inputs = {narrow_id};
        cast.outputs = {out};
        cast.attrs = CastAttrs{DType::kF32};
        graph.nodes.insert(graph.nodes.begin() + u.node + 1, std::move(cast));
        // Inserting shifts the indices of later nodes: renumber producers and pending uses.
        for (Value& val : graph.values)
          if (val.producer > u.node) ++val.producer;
        graph.values[out].producer = u.node + 1;
        for (auto& list : uses)
          for (Use& later : list)
            if (later.node > u.node) ++later.node;
      }
    }
    bytes_after += static_cast<int64_t>(graph.values[id].data.nbytes());
    ++converted;
  }
  if (converted > 0)
    log.info(
        "assign_precision[{}]: {} weight matrices stored as {}{} ({:.1f} MiB → {:.1f} MiB); "
        "norms, biases and position tables stay f32",
        graph.name, converted, dtype_name(to), to == DType::kI8 ? " with per-row f32 scales" : "",
        static_cast<double>(bytes_before) / (1 << 20),
        static_cast<double>(bytes_after) / (1 << 20));
  return converted;
}

}  // namespace kiln
