#include "frontend/onnx/import_graph.h"

#include <algorithm>
#include <queue>

namespace kiln {

const OnnxAttribute* ImportNode::find_attribute(std::string_view attr) const {
  for (const OnnxAttribute& a : attributes)
    if (a.name == attr) return &a;
  return nullptr;
}

std::string ImportNode::qualified_op() const {
  return domain.empty() ? op_type : domain + "::" + op_type;
}

int ImportGraph::find_value(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

namespace {

// The nodes of a cycle among `pending` (nodes that Kahn's algorithm could not order): walk from
// one of them to a pending producer of one of its inputs until a node repeats.
std::vector<int> find_cycle(const std::vector<ImportNode>& nodes,
                            const std::vector<ImportValue>& values,
                            const std::vector<int>& pending) {
  std::vector<char> is_pending(nodes.size(), 0);
  for (int n : pending) is_pending[n] = 1;
  std::vector<int> position(nodes.size(), -1);
  std::vector<int> path;
  int n = pending.front();
  while (position[n] < 0) {
    position[n] = static_cast<int>(path.size());
    path.push_back(n);
    int next = -1;
    for (int v : nodes[n].inputs)
      if (v >= 0 && values[v].producer >= 0 && is_pending[values[v].producer]) {
        next = values[v].producer;
        break;
      }
    // A node left unordered waits on a pending producer: one is always found.
    if (next < 0) return path;
    n = next;
  }
  std::vector<int> cycle(path.begin() + position[n], path.end());
  std::reverse(cycle.begin(), cycle.end());  // producers first
  return cycle;
}

}  // namespace

namespace {

// Whether value v is a constant false (a one-element bool initializer, or a Constant node's
// tensor value, holding 0).
bool constant_false(const ImportGraph& g, int v) {
  const ImportValue& value = g.values()[v];
  const OnnxTensor* t = nullptr;
  if (value.kind == ImportValueKind::kInitializer) {
    t = &value.initializer;
  } else if (value.producer >= 0) {
    const ImportNode& n = g.nodes()[value.producer];
    if (n.op_type == "Constant" && n.domain.empty())
      for (const OnnxAttribute& a : n.attributes)
        if (a.name == "value" && a.kind == OnnxAttrKind::kTensor && a.tensors.size() == 1)
          t = &a.tensors[0];
  }
  return t != nullptr && t->type == OnnxElemType::kBool && t->data.defined() &&
         t->data.numel() == 1 && static_cast<const uint8_t*>(t->data.raw())[0] == 0;
}

}  // namespace

void ImportGraph::drop_inference_dropouts() {
  std::vector<bool> read(values_.size(), false);
  for (const ImportNode& n : nodes_)
    for (int in : n.inputs)
      if (in >= 0) read[in] = true;
  for (int out : outputs_) read[out] = true;
  for (ImportNode& n : nodes_) {
    if (n.op_type != "Dropout" || !n.domain.empty() || n.inputs.empty() || n.inputs[0] < 0 ||
        n.outputs.empty() || n.outputs[0] < 0)
      continue;
    const bool training =
        n.inputs.size() > 2 && n.inputs[2] >= 0 && !constant_false(*this, n.inputs[2]);
    const bool mask_read = n.outputs.size() > 1 && n.outputs[1] >= 0 && read[n.outputs[1]];
    if (training || mask_read) continue;
    if (n.outputs.size() > 1 && n.outputs[1] >= 0) values_[n.outputs[1]].producer = -1;
    n.op_type = "Identity";
    n.inputs.resize(1);
    n.outputs.resize(1);
  }
}

ImportGraph ImportGraph::build(const OnnxModel& model) {
  ImportGraph g;
  g.path_ = model.path;
  g.opset_ = model.opset;
  const OnnxGraph& src = model.graph;
  auto add_value = [&](const std::string& name, ImportValueKind kind) {
    g.by_name_.emplace(name, static_cast<int>(g.values_.size()));
    ImportValue v;
    v.name = name;
    v.kind = kind;
    g.values_.push_back(std::move(v));
    return static_cast<int>(g.values_.size()) - 1;
  };

  for (const OnnxTensor& t : src.initializers) {
    KILN_CHECK(!t.name.empty(), "{}: an initializer has no name", g.path_);
    KILN_CHECK(g.find_value(t.name) < 0, "{}: two initializers are named '{}'", g.path_, t.name);
    ImportValue& v = g.values_[add_value(t.name, ImportValueKind::kInitializer)];
    v.type = t.type;
    std::vector<OnnxDim> dims;
    for (int64_t d : t.dims) dims.push_back(OnnxDim{d, ""});
    v.shape = std::move(dims);
    v.initializer = t;
  }
  // Declared types: graph inputs, then annotated intermediates (applied once values exist).
  for (const OnnxValueInfo& in : src.inputs) {
    KILN_CHECK(!in.name.empty(), "{}: a graph input has no name", g.path_);
    int v = g.find_value(in.name);
    if (v >= 0) {  // an initializer listed as an input too: a default the caller may override
      KILN_CHECK(g.values_[v].kind == ImportValueKind::kInitializer,
                 "{}: graph input '{}' is listed twice", g.path_, in.name);
      continue;
    }
    v = add_value(in.name, ImportValueKind::kInput);
    g.values_[v].type = in.type;
    g.values_[v].shape = in.shape;
    g.inputs_.push_back(v);
  }

  for (size_t i = 0; i < src.nodes.size(); ++i) {
    const OnnxNode& on = src.nodes[i];
    ImportNode n;
    n.name = on.name;
    n.op_type = on.op_type;
    n.domain = on.domain;
    n.attributes = on.attributes;
    for (const std::string& out : on.outputs) {
      if (out.empty()) {
        n.outputs.push_back(-1);
        continue;
      }
      int v = g.find_value(out);
      if (v >= 0) {
        const ImportValue& prev = g.values_[v];
        KILN_CHECK(false, "{}: node '{}' ({}) writes '{}', which is already {}", g.path_, n.name,
                   n.op_type, out,
                   prev.producer >= 0 ? "the output of node '" + g.nodes_[prev.producer].name + "'"
                   : prev.kind == ImportValueKind::kInput ? std::string("a graph input")
                                                          : std::string("an initializer"));
      }
      v = add_value(out, ImportValueKind::kIntermediate);
      g.values_[v].producer = static_cast<int>(i);
      n.outputs.push_back(v);
    }
    g.nodes_.push_back(std::move(n));
  }
  // Inputs once every output exists (a file out of order, or a cycle, reads values defined later).
  for (size_t i = 0; i < src.nodes.size(); ++i)
    for (const std::string& in : src.nodes[i].inputs) {
      const int v = in.empty() ? -1 : g.find_value(in);
      KILN_CHECK(in.empty() || v >= 0,
                 "{}: node '{}' ({}) reads '{}', which is no graph input, initializer or node "
                 "output",
                 g.path_, g.nodes_[i].name, g.nodes_[i].op_type, in);
      g.nodes_[i].inputs.push_back(v);
    }
  for (const OnnxValueInfo& info : src.value_info) {
    const int v = g.find_value(info.name);
    if (v < 0 || g.values_[v].kind != ImportValueKind::kIntermediate) continue;
    g.values_[v].type = info.type;
    g.values_[v].shape = info.shape;
  }
  for (const OnnxValueInfo& out : src.outputs) {
    const int v = g.find_value(out.name);
    KILN_CHECK(v >= 0,
               "{}: graph output '{}' is no graph input, initializer or node output (a truncated "
               "file?)",
               g.path_, out.name);
    ImportValue& value = g.values_[v];
    value.is_output = true;
    if (out.type != OnnxElemType::kUndefined) value.type = out.type;
    if (out.shape) value.shape = out.shape;
    g.outputs_.push_back(v);
  }
  g.drop_inference_dropouts();

  // Kahn's algorithm, taking ready nodes in file order.
  std::vector<int> waiting(g.nodes_.size(), 0);
  std::vector<std::vector<int>> consumers(g.values_.size());
  for (size_t i = 0; i < g.nodes_.size(); ++i)
    for (int v : g.nodes_[i].inputs)
      if (v >= 0 && g.values_[v].producer >= 0) {
        ++waiting[i];
        consumers[v].push_back(static_cast<int>(i));
      }
  std::priority_queue<int, std::vector<int>, std::greater<>> ready;
  for (size_t i = 0; i < g.nodes_.size(); ++i)
    if (waiting[i] == 0) ready.push(static_cast<int>(i));
  while (!ready.empty()) {
    const int n = ready.top();
    ready.pop();
    g.order_.push_back(n);
    for (int v : g.nodes_[n].outputs)
      if (v >= 0)
        for (int c : consumers[v])
          if (--waiting[c] == 0) ready.push(c);
  }
  if (g.order_.size() != g.nodes_.size()) {
    std::vector<int> pending;
    for (size_t i = 0; i < g.nodes_.size(); ++i)
      if (waiting[i] > 0) pending.push_back(static_cast<int>(i));
    std::string names;
    for (int n : find_cycle(g.nodes_, g.values_, pending))
      names += fmt::format("'{}' ({}) -> ", g.nodes_[n].name, g.nodes_[n].op_type);
    names += "...";
    KILN_FAIL("{}: the graph has a cycle: {} ({} nodes cannot be ordered)", g.path_, names,
              pending.size());
  }
  return g;
}

}  // namespace kiln
