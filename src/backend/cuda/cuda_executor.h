// The CUDA graph executor: the shared executor's contract (bind the step's symbols, pick the
// bucket, place every activation in the bucket's arena, run the node kernels in order) with
// device memory. Weights are device copies made once when the graph is compiled; host inputs
// are copied into a staging area of the bucket's arena; the step's layout goes to the device in
// one copy; after the kernels the stream is drained and any bad data a kernel reported becomes
// a kiln::Error. Outputs are device tensors, valid until the next execute().
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "backend/cuda/cuda_context.h"

namespace kiln::cuda {

class CudaExecutor final : public Executable {
 public:
  CudaExecutor(const Graph& graph, const ShapeProfile& profile, CudaContext& ctx,
               std::vector<std::unique_ptr<Kernel>> kernels, std::vector<std::string> names);
  ~CudaExecutor() override;

  std::span<const Tensor> execute(std::span<const Tensor> inputs, const StepContext* step) override;
  int64_t workspace_bytes() const override;
  std::vector<std::string> kernel_names() const override { return kernel_names_; }

 private:
  struct Arena {
    std::shared_ptr<void> memory;
    std::vector<int64_t> offset;        // per value (activations)
    std::vector<int64_t> input_offset;  // per graph input: its staging area
    int64_t scratch_offset = 0;
    int64_t bytes = 0;
  };
  Arena& arena_for(int64_t bucket);
  Bindings bind_inputs(std::span<const Tensor> inputs) const;

  const Graph& graph_;
  ShapeProfile profile_;
  CudaContext& ctx_;
  std::vector<std::unique_ptr<Kernel>> kernels_;
  std::vector<std::string> kernel_names_;
  std::map<int64_t, Arena> arenas_;
  std::vector<Tensor> values_;
  std::vector<Tensor> outputs_;
  std::vector<Tensor> node_in_, node_out_;
  bool has_attention_ = false;
  // Profiling (CudaContext::profile()): an event before every node and after the last, and the
  // milliseconds each kernel name took over every step; the wall time of whole steps.
  std::vector<cudaEvent_t> events_;
  std::map<std::string, double> kernel_ms_;
  double step_ms_ = 0.0;
  int64_t steps_ = 0;
};

}  // namespace kiln::cuda
