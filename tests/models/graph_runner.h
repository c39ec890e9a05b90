// Runs one graph on a backend with inputs and outputs addressed by name (tests only; the
// runtime addresses them by position).
#pragma once

#include <map>
#include <string>

#include "backend/backend.h"

namespace kiln::test {

// A profile large enough for any test graph: one bucket of `tokens`.
inline ShapeProfile test_profile(int64_t tokens = 4096) {
  ShapeProfile p;
  p.max_input_tokens = p.max_step_tokens = tokens;
  p.max_batch = tokens;
  p.token_buckets = {tokens};
  return p;
}

// Outputs are copied out of the executable's workspace.
inline std::map<std::string, Tensor> run_graph(Backend& backend, const Graph& g,
                                               const std::map<std::string, Tensor>& feed,
                                               const StepContext* step = nullptr) {
  auto exe = backend.compile(g, test_profile());
  std::vector<Tensor> in;
  for (int id : g.inputs) in.push_back(feed.at(g.values[id].name));
  const std::span<const Tensor> out = exe->execute(in, step);
  std::map<std::string, Tensor> result;
  for (size_t i = 0; i < g.outputs.size(); ++i)
    result[g.values[g.outputs[i]].name] = out[i].clone();
  return result;
}

}  // namespace kiln::test
