// The CUDA kernel table and the node kernels' shared base. Kernels run on the context's stream;
// host-side checks (shapes, dtypes, the step's cross K/V) throw before anything is enqueued.
#pragma once

#include "backend/cuda/cuda_context.h"
#include "backend/kernel.h"

namespace kiln::cuda {

class CudaKernel : public Kernel {
 public:
  CudaKernel(const Node& node, CudaContext& ctx) : node_(node), ctx_(ctx) {}
  void prepare(const Graph& graph) override {
    node_index_ = static_cast<int>(&node_ - graph.nodes.data());
  }

 protected:
  const Node& node_;
  CudaContext& ctx_;
  int node_index_ = -1;
};

std::unique_ptr<Kernel> make_linear_kernel(const Node& node, CudaContext& ctx);
// The Linear of int8 weights with fp16/bf16 activations (cuda_linear_i8.cc).
std::unique_ptr<Kernel> make_quant_linear_kernel(const Node& node, CudaContext& ctx);
// The Linear of W8A8 (int8) plans: int8 weights and x quantized with its static scale
// (cuda_linear_w8a8.cc).
std::unique_ptr<Kernel> make_w8a8_linear_kernel(const Node& node, CudaContext& ctx);
std::unique_ptr<Kernel> make_attention_kernel(const Node& node, CudaContext& ctx);
// Times a Linear node's candidate kernels (GEMV, cuBLASLt's algorithms) at each row count on
// its own weights and returns the fastest per count (cuda_linear.cc).
std::vector<LinearTactic> time_linear_tactics(const Graph& graph, const Node& node,
                                              CudaContext& ctx, std::span<const int64_t> rows);

// The tactic a Linear runs at n rows, from its tactics sorted by row count: the one timed at n;
// for other counts up to kTacticNearestRows (decode batches, short prompts) the one of the
// smallest timed count >= n (GEMV or cuBLASLt); null for other counts above (prompts of many
// rows: cuBLASLt's heuristic for the exact count beats an algorithm timed at the bucket's bound
// — on the H200, in 11 of the 12 model comparisons of 2026-12-01's six full runs before this
// rule, the tuned plan's batch-64 time to first token was longer than the --no-tune plan's;
// flan-t5-large 14.3 against 12.0 ms when 4992 rows ran the algorithm timed at 8192).
// `inexact` (KILN_CUDA_TACTICS_INEXACT=1, for A/B runs): the smallest timed count >= n at every
// n, else the largest.
inline constexpr int64_t kTacticNearestRows = 64;
const LinearTactic* tactic_for_rows(std::span<const LinearTactic> tactics, int64_t n, bool inexact);

// Times every Linear of `graph` at the row counts `profile` can run and stores the fastest
// kernel per count in its LinearAttrs::tactics (cuda_tactics.cc).
void select_linear_tactics(Graph& graph, const ShapeProfile& profile, CudaContext& ctx);

// Registers every CUDA kernel (the single dispatch point of the CUDA backend), bound to `ctx`.
void register_kernels(KernelRegistry& registry, CudaContext& ctx);

}  // namespace kiln::cuda
