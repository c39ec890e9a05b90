// The activation observer: an executable reports chosen intermediate values (every Linear's
// input, say) to a callback on the host, step by step, from the one execution path it always
// runs. INT8 calibration records each quantized Linear's input range through it; debugging
// prints a layer's output. Nodes are chosen by op kind or by name, and one input or output slot
// of each is observed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "graph/ir.h"

namespace kiln {

enum class ObservedSide : uint8_t { kInput, kOutput };

// Which values an observer sees: slot `slot` of the inputs (or outputs) of every node whose op
// is one of `ops` and of every node named in `names`.
struct ObserverSelection {
  std::vector<OpKind> ops;
  std::vector<std::string> names;
  ObservedSide side = ObservedSide::kInput;
  int slot = 0;
};

// One observed value: node `node` of `graph` (its name `node_name`), in the `step`-th execute()
// since the observer was set (from 0). `value` is a host tensor, valid during the call only
// (a view into the CPU's workspace, a copy of the device tensor on CUDA): copy what you keep.
struct Observation {
  const Graph& graph;
  int node;
  const std::string& node_name;
  int64_t step;
  const Tensor& value;
};

struct ActivationObserver {
  ObserverSelection selection;
  // Called on the thread that runs execute(), in node order. Empty: nothing is observed.
  std::function<void(const Observation&)> callback;
  bool active() const { return static_cast<bool>(callback); }
};

// Per node of `graph`: whether `selection` chooses it. Throws naming a name no node of the graph
// has and a chosen node without the slot (an optional input left out counts as absent).
std::vector<uint8_t> observed_nodes(const Graph& graph, const ObserverSelection& selection);

// The names of `names` that some node of `graph` has (a model's selection split per graph).
std::vector<std::string> names_in_graph(const Graph& graph, const std::vector<std::string>& names);

// What an executor keeps of an observer: the selection resolved against its graph, the step
// count, and the call for one node.
class ObserverState {
 public:
  // Resolves `observer` against `graph` (observed_nodes) and restarts the step count.
  void set(const Graph& graph, ActivationObserver observer);
  bool active() const { return observer_.active(); }
  bool observes(size_t node) const { return active() && observed_[node] != 0; }
  ObservedSide side() const { return observer_.selection.side; }
  int slot() const { return observer_.selection.slot; }
  // Hands `value` (host memory) of node `node` to the callback as this step's observation.
  void report(const Graph& graph, size_t node, const Tensor& value) const;
  // A step begins: the observations until the next call belong to it (the first is step 0).
  void begin_step() {
    if (active()) ++step_;
  }

 private:
  ActivationObserver observer_;
  std::vector<uint8_t> observed_;
  int64_t step_ = -1;
};

}  // namespace kiln
