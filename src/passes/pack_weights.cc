// The packing pass (CPU plans built on a machine with AVX-512): stores every Linear weight in the
// layout its AVX-512 kernels read (graph/packing.h: panel16, or panel16q4 for i4 weights, whose
// group scales go panel16 too), so that loading the plan maps them ready to use. A table that an
// Embedding gathers from and a Linear multiplies by (BLOOM's tied lm_head) is packed once and the
// embedding kernels gather from the packed form; a weight read by any other op stays plain, and
// so does an i4 weight of a width panel16q4 plans do not hold (its kernel packs it at load).
#include <map>
#include <optional>
#include <set>
#include <string>

#include "graph/linear.h"
#include "graph/packing.h"
#include "passes/pass.h"

namespace kiln {
namespace {

// The layout a reader asks a weight for (a Linear's weight, an i4 weight's group scales), or
// nullopt; `gathers` when it is an Embedding's table (it reads panel16 tables, never asks), and
// `plain_only` when the reader takes no packed layout.
struct Want {
  std::optional<WeightLayout> layout;
  bool gathers = false;
  bool plain_only = false;
};

Want want_of(const Graph& g, const Node& n, size_t s, const Value& v) {
  if (n.op == OpKind::kEmbedding && s == 0) return {std::nullopt, true, false};
  if (n.op != OpKind::kLinear) return {std::nullopt, false, true};
  if (s == slot(LinearOperand::kWeight)) {
    const WeightLayout want = v.dtype == DType::kI4 ? panel16q4_layout() : panel16_layout();
    if (!packed_layout_problem(want, v.dtype, v.data.shape()).empty())
      return {std::nullopt, false, true};
    return {want};
  }
  // An i4 weight's group scales, read 16 outputs at a time.
  const int w = linear_operand(n, LinearOperand::kWeight);
  if (s == slot(LinearOperand::kWeightScales) && w >= 0 && g.values[w].dtype == DType::kI4)
    return {panel16_layout()};
  return {std::nullopt, false, true};
}

struct Readers {
  std::set<std::string> packings;  // asked for
  std::optional<WeightLayout> layout;
  bool gathered = false, plain_only = false;
};

}  // namespace

int pack_weights(ModelIR& model, const Logger& log) {
  // By name, across graphs: T5's graphs hold their own Value for a shared tensor, and both must be
  // packed alike for the plan to store it once.
  std::map<std::string, Readers> readers;
  for (const Graph& g : model.graphs)
    for (const Node& n : g.nodes)
      for (size_t s = 0; s < n.inputs.size(); ++s) {
        if (n.inputs[s] < 0) continue;
        const Value& v = g.values[n.inputs[s]];
        if (v.kind != ValueKind::kWeight) continue;
        const Want w = want_of(g, n, s, v);
        Readers& r = readers[v.name];
        if (w.layout) {
          r.packings.insert(w.layout->packing);
          r.layout = w.layout;
        }
        r.gathered |= w.gathers;
        r.plain_only |= w.plain_only;
      }
  int packed = 0;
  int64_t bytes = 0;
  std::map<std::string, int> by_packing;  // what the log names
  for (Graph& g : model.graphs)
    for (Value& v : g.values) {
      if (v.kind != ValueKind::kWeight || !v.layout.plain()) continue;
      const auto it = readers.find(v.name);
      if (it == readers.end()) continue;
      const Readers& r = it->second;
      // One layout asked for, by readers that all take it (an Embedding gathers panel16 only).
      if (r.packings.size() != 1 || r.plain_only || (r.gathered && *r.layout != panel16_layout()))
        continue;
      const Tensor plain = v.data.is_contiguous() ? v.data : v.data.clone();
      Tensor out = Tensor::empty(plain.dtype(), plain.shape());
      if (*r.layout == panel16q4_layout())
        pack_panel16q4(plain.raw(), out.raw(), plain.dim(0), plain.dim(1));
      else
        pack_panel16(plain.raw(), out.raw(), plain.dim(0), plain.dim(1),
                     dtype_bytes(plain.dtype(), 1));
      g.set_weight_data(static_cast<int>(&v - g.values.data()), std::move(out));
      v.layout = *r.layout;
      ++packed;
      ++by_packing[v.layout.packing];
      bytes += static_cast<int64_t>(v.data.nbytes());
    }
  if (packed > 0) model.target = kPanel16Target;
  std::string as;
  for (const auto& [packing, n] : by_packing)
    as += fmt::format("{}{}{}", as.empty() ? "" : ", ", packing,
                      by_packing.size() > 1 ? fmt::format(" ({})", n) : "");
  log.info("pack_weights: {} Linear weights ({:.1f} MiB) packed as {} for {}", packed,
           static_cast<double>(bytes) / (1 << 20), as.empty() ? "nothing" : as, kPanel16Target);
  return packed;
}

}  // namespace kiln
