// The graph executor every backend shares: binds the step's symbols from its inputs, picks the
// shape bucket, places each activation at its offset in the bucket's workspace (allocated once
// per bucket through the backend's allocator, never per step) and runs the node kernels in order.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"

namespace kiln {

// What one step's inputs say about its shapes: the symbol bindings, the token count and the
// workspace bucket that holds it.
struct StepShape {
  Bindings bindings;
  int64_t tokens = 0;
  int64_t bucket = 0;
};

// Checks every input against the graph's declared dtype and shape, binds the symbolic dims
// (consistently across inputs), picks the bucket and checks every binding against the plan's
// limits for it. Shared by every backend's executor so that bad inputs get the same errors.
StepShape bind_step_inputs(const Graph& graph, const ShapeProfile& profile,
                           std::span<const Tensor> inputs);

// Checks that a step running attention has a layout covering `step_tokens` tokens whose block
// references fit the KV storage.
void check_step_layout(const Graph& graph, const StepContext* step, int64_t step_tokens);

class GraphExecutor final : public Executable {
 public:
  // `kernels` holds one prepared kernel per node, in node order. With `profile_log`, every
  // node is timed and each kernel class's time per step is logged there (INFO) at destruction.
  GraphExecutor(const Graph& graph, const ShapeProfile& profile, Allocator& allocator,
                ThreadPool* pool, std::vector<std::unique_ptr<Kernel>> kernels,
                std::vector<std::string> kernel_names, const Logger* profile_log = nullptr);
  ~GraphExecutor() override;

  std::span<const Tensor> execute(std::span<const Tensor> inputs, const StepContext* step) override;
  int64_t workspace_bytes() const override;
  std::vector<std::string> kernel_names() const override { return kernel_names_; }

 private:
  struct Arena {
    std::shared_ptr<void> memory;
    std::vector<int64_t> offset;  // per value
    int64_t scratch_offset = 0;
    int64_t bytes = 0;
  };
  Arena& arena_for(int64_t bucket);

  const Graph& graph_;
  ShapeProfile profile_;
  Allocator& allocator_;
  ThreadPool* pool_;
  std::vector<std::unique_ptr<Kernel>> kernels_;
  std::vector<std::string> kernel_names_;
  std::map<int64_t, Arena> arenas_;
  std::vector<Tensor> values_;
  std::vector<Tensor> outputs_;
  // Each node's inputs and outputs as its kernel takes them, for the bindings views_bindings_
  // in bucket views_bucket_; input_uses_ are the places a graph input goes, refreshed each step.
  struct NodeIo {
    std::vector<Tensor> in, out;
  };
  struct InputUse {
    size_t node, slot, input;
  };
  std::vector<NodeIo> node_io_;
  std::vector<InputUse> input_uses_;
  Bindings views_bindings_;
  int64_t views_bucket_ = -1;
  bool has_attention_ = false;
  // The profile, per step size (tokens): steps, wall time, and per node the summed time.
  struct StepTimes {
    int64_t steps = 0;
    double step_ms = 0.0;
    std::vector<double> node_ms;
  };
  const Logger* profile_log_ = nullptr;
  std::map<int64_t, StepTimes> step_times_;
};

}  // namespace kiln
