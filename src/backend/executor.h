// The graph executor of the host backends (CPU, reference; CUDA has cuda_executor.h): binds the
// step's symbols from its inputs, picks the shape bucket, places each activation in one
// workspace (sized for the largest bucket run so far, allocated through the backend's allocator
// when a step needs more, never per step) at the offsets the step's own shapes give, and runs the
// node kernels in order, handing streamed outputs to the step's sink as their nodes write them.
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
  void set_observer(ActivationObserver observer) override {
    observer_.set(graph_, std::move(observer));
  }
  // Where the workspace starts (null before the first step): the step's activations sit at
  // workspace_layout(graph, the step's bindings).offset from here.
  const void* workspace_base() const { return arena_.get(); }

 private:
  // What a bucket needs: its planned workspace at the bucket's bounds (`layout`) and, with the
  // kernels' scratch there, the arena's bytes (`total`). Cached per bucket.
  struct BucketBytes {
    int64_t layout = 0, total = 0;
  };
  const BucketBytes& bucket_bytes(int64_t bucket);

  const Graph& graph_;
  ShapeProfile profile_;
  Allocator& allocator_;
  ThreadPool* pool_;
  std::vector<std::unique_ptr<Kernel>> kernels_;
  std::vector<std::string> kernel_names_;
  // One arena for every bucket. Each step's activations are laid out for its own bindings
  // (workspace_layout at the step's token and row counts), so a step touches only the front of
  // the arena: a host workspace of 16 MiB or more is a lazily zeroed mapping, resident as far as
  // written, and a short step in a large bucket (78 tokens in the 256-token bucket) writes a
  // packed 78 tokens' worth, not a strip at the start of every slot of a 256-token layout
  // (which, in 2 MB pages, made most of a T5 encoder arena resident).
  std::shared_ptr<void> arena_;
  int64_t arena_bytes_ = 0;
  std::map<int64_t, BucketBytes> bucket_bytes_;
  int64_t scratch_offset_ = 0;
  std::vector<Tensor> values_;
  std::vector<Tensor> outputs_;
  // Each node's inputs and outputs as its kernel takes them, for the bindings views_bindings_
  // in the arena at views_base_; input_uses_ are the places a graph input goes, refreshed each
  // step.
  struct NodeIo {
    std::vector<Tensor> in, out;
  };
  struct InputUse {
    size_t node, slot, input;
  };
  std::vector<NodeIo> node_io_;
  std::vector<InputUse> input_uses_;
  Bindings views_bindings_;
  const void* views_base_ = nullptr;
  bool has_attention_ = false;
  // Per node, the streamed outputs (positions in graph.outputs) it writes: handed to the step's
  // sink right after it runs.
  std::vector<std::vector<int>> streamed_;
  bool streams_ = false;
  // The profile, per step size (tokens): steps, wall time, and per node the summed time.
  struct StepTimes {
    int64_t steps = 0;
    double step_ms = 0.0;
    std::vector<double> node_ms;
  };
  const Logger* profile_log_ = nullptr;
  std::map<int64_t, StepTimes> step_times_;
  ObserverState observer_;
};

}  // namespace kiln
