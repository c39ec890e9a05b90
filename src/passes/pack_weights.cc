// The packing pass (CPU plans built on a machine with AVX-512): stores every Linear weight in the
// panel16 layout its AVX-512 kernels read (graph/packing.h), so that loading the plan maps them
// ready to use. A table that an Embedding gathers from and a Linear multiplies by (BLOOM's tied
// lm_head) is packed once and the embedding kernels gather from the packed form; a weight read by
// any other op stays plain.
#include <set>

#include "graph/packing.h"
#include "passes/pass.h"

namespace kiln {
namespace {

bool reads_packed(const Node& n, size_t slot) {
  return (n.op == OpKind::kLinear && slot == 1) || (n.op == OpKind::kEmbedding && slot == 0);
}

}  // namespace

int pack_weights(ModelIR& model, const Logger& log) {
  // Names, across graphs: T5's graphs hold their own Value for a shared tensor, and both must be
  // packed alike for the plan to store it once.
  std::set<std::string> linear_weights, unpackable;
  for (const Graph& g : model.graphs)
    for (const Node& n : g.nodes)
      for (size_t s = 0; s < n.inputs.size(); ++s) {
        if (n.inputs[s] < 0) continue;
        const Value& v = g.values[n.inputs[s]];
        if (v.kind != ValueKind::kWeight) continue;
        if (n.op == OpKind::kLinear && s == 1) linear_weights.insert(v.name);
        if (!reads_packed(n, s) ||
            !packed_layout_problem(panel16_layout(), v.dtype, v.data.shape()).empty())
          unpackable.insert(v.name);
      }
  int packed = 0;
  int64_t bytes = 0;
  for (Graph& g : model.graphs)
    for (Value& v : g.values) {
      if (v.kind != ValueKind::kWeight || !v.layout.plain() || !linear_weights.count(v.name) ||
          unpackable.count(v.name))
        continue;
      const Tensor plain = v.data.is_contiguous() ? v.data : v.data.clone();
      Tensor out = Tensor::empty(plain.dtype(), plain.shape());
      pack_panel16(plain.raw(), out.raw(), plain.dim(0), plain.dim(1),
                   dtype_bytes(plain.dtype(), 1));
      g.set_weight_data(static_cast<int>(&v - g.values.data()), std::move(out));
      v.layout = panel16_layout();
      ++packed;
      bytes += static_cast<int64_t>(v.data.nbytes());
    }
  if (packed > 0) model.target = kPanel16Target;
  log.info("pack_weights: {} Linear weights ({:.1f} MiB) packed as {} for {}", packed,
           static_cast<double>(bytes) / (1 << 20), kPanel16, kPanel16Target);
  return packed;
}

}  // namespace kiln
