#include "graph/verifier.h"

#include <set>

#include "graph/op_registry.h"

namespace kiln {

void verify_graph(const Graph& g) {
  const int nv = static_cast<int>(g.values.size());
  std::vector<bool> defined(g.values.size(), false);
  std::set<std::string> names;
  for (int i = 0; i < nv; ++i) {
    const Value& v = g.values[i];
    KILN_CHECK(names.insert(v.name).second, "graph '{}': duplicate value name '{}'", g.name,
               v.name);
    if (v.kind == ValueKind::kWeight) {
      KILN_CHECK(v.data.defined(), "graph '{}': weight '{}' has no data", g.name, v.name);
      KILN_CHECK(v.data.dtype() == v.dtype, "graph '{}': weight '{}' data is {}, declared {}",
                 g.name, v.name, dtype_name(v.data.dtype()), dtype_name(v.dtype));
      Shape declared;
      for (const Dim& d : v.shape) {
        KILN_CHECK(!d.is_symbolic(), "graph '{}': weight '{}' has a symbolic shape", g.name,
                   v.name);
        declared.push_back(d.value);
      }
      KILN_CHECK(declared == v.data.shape(), "graph '{}': weight '{}' data is {}, declared {}",
                 g.name, v.name, shape_str(v.data.shape()), shape_str(declared));
      defined[i] = true;
    }
  }
  for (int id : g.inputs) {
    KILN_CHECK(id >= 0 && id < nv && g.values[id].kind == ValueKind::kInput,
               "graph '{}': input id {} is not an input value", g.name, id);
    defined[id] = true;
  }
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node& node = g.nodes[n];
    for (int id : node.inputs) {
      if (id < 0) continue;
      KILN_CHECK(id < nv, "graph '{}': node '{}' reads value id {} out of range", g.name, node.name,
                 id);
      KILN_CHECK(defined[id], "graph '{}': node '{}' reads '{}' before it is produced", g.name,
                 node.name, g.values[id].name);
    }
    const std::vector<ValueType> types = infer_node(g, node);
    KILN_CHECK(types.size() == node.outputs.size(),
               "graph '{}': node '{}' has {} outputs, op {} makes {}", g.name, node.name,
               node.outputs.size(), op_name(node.op), types.size());
    for (size_t i = 0; i < types.size(); ++i) {
      const int id = node.outputs[i];
      KILN_CHECK(id >= 0 && id < nv, "graph '{}': node '{}' output id out of range", g.name,
                 node.name);
      const Value& v = g.values[id];
      KILN_CHECK(!defined[id], "graph '{}': value '{}' is produced twice", g.name, v.name);
      KILN_CHECK(v.kind == ValueKind::kActivation && v.producer == static_cast<int>(n),
                 "graph '{}': value '{}' does not record node '{}' as producer", g.name, v.name,
                 node.name);
      KILN_CHECK(v.dtype == types[i].dtype && v.shape == types[i].shape,
                 "graph '{}': value '{}' is {} {}, but {} infers {} {}", g.name, v.name,
                 dtype_name(v.dtype), sym_shape_str(v.shape), op_name(node.op),
                 dtype_name(types[i].dtype), sym_shape_str(types[i].shape));
      defined[id] = true;
    }
  }
  for (int id : g.outputs) {
    KILN_CHECK(id >= 0 && id < nv && defined[id], "graph '{}': output id {} is never produced",
               g.name, id);
  }
}

}  // namespace kiln
