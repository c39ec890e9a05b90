// The CUDA graph executor: the shared executor's contract (bind the step's symbols, pick the
// bucket, place every activation in the bucket's arena, run the node kernels in order) with
// device memory. Weights are device copies made once when the graph is compiled; host inputs
// are copied into a staging area of the bucket's arena, together with the step's layout (one
// kernel reading pinned host memory: StepUploads::launch_uploads); after the kernels the stream is
// drained and any bad data a kernel reported becomes a kiln::Error. Outputs are device tensors,
// valid until the next execute().
//
// Steps of up to CudaOptions::graph_tokens tokens (decode steps, and the steps prompts join
// while the batch decodes) are replayed from CUDA graphs: the second time a step of the same
// shape runs (same token and sequence counts, same device layout buffer and KV storage), its
// kernels are captured into a graph, and from then on the step is one graph launch instead of a
// launch per node (the longest key count's class and, at a block per SM or fewer, its bucket of
// 64 are part of the shape: the split and the block size of the decode attention follow them;
// so is the longest sequence's count of tiled-attention row blocks). At most kMaxGraphs shapes
// are captured per executor; steps of other shapes then run eagerly. Everything a replay reads that
// changes per step (inputs, the step's layout, the KV block tables) lives at fixed device
// addresses, and the host-side checks the kernels would make are made here before each replay.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "backend/cuda/cuda_context.h"

namespace kiln::cuda {

class CudaExecutor final : public Executable {
 public:
  // The most step shapes captured (each graph holds a launch per node).
  static constexpr size_t kMaxGraphs = 512;
  CudaExecutor(const Graph& graph, const ShapeProfile& profile, CudaContext& ctx,
               std::vector<std::unique_ptr<Kernel>> kernels, std::vector<std::string> names);
  ~CudaExecutor() override;

  std::span<const Tensor> execute(std::span<const Tensor> inputs, const StepContext* step) override;
  int64_t workspace_bytes() const override;
  std::vector<std::string> kernel_names() const override { return kernel_names_; }
  StepLaunchStats launch_stats() const override { return launch_stats_; }
  // Observed steps run eagerly (the uncaptured observation mode): each observed value is copied
  // to the host between the kernels, which a replayed graph has no place for.
  void set_observer(ActivationObserver observer) override {
    observer_.set(graph_, std::move(observer));
  }

 private:
  struct Arena {
    std::shared_ptr<void> memory;
    std::vector<int64_t> offset;        // per value (activations)
    std::vector<int64_t> input_offset;  // per graph input: its staging area
    int64_t scratch_offset = 0;
    int64_t bytes = 0;
  };
  Arena& arena_for(int64_t bucket);
  // Enqueues every node's kernel on the stream.
  void run_nodes(char* scratch, const StepContext* step);

  // What a captured step depends on besides its arena (fixed per token count).
  struct GraphKey {
    int64_t tokens = 0;
    int seqs = 0;
    int max_blocks = 0;
    int cross_layers = 0;
    int key_class = 0;   // split-sequence attention's launch shape depends on it
    int key_bucket = 0;  // and the warp kernel's block size at a block per SM or fewer
    int row_tiles = 0;   // the tiled kernel's grid: row blocks of the longest sequence
    const void* step_buffer = nullptr;
    const void* kv_blocks = nullptr;
    int64_t kv_capacity = 0;
    // The storage's geometry is baked into the kernels too: a storage freed and another of
    // another geometry allocated at the same address must not replay the old graph.
    int kv_block_size = 0;
    int64_t kv_layer_bytes = 0;
    auto operator<=>(const GraphKey&) const = default;
  };
  struct StepGraph {
    int runs = 0;  // eager runs so far (captured at the second)
    cudaGraphExec_t exec = nullptr;
  };
  // Runs the step from its graph (capturing it when due); false when it ran eagerly.
  void run_graph(const GraphKey& key, char* scratch, const StepContext* step);
  // The key of a step of `tokens` rows (after upload_step); throws where a replay would skip a
  // check the kernels make on the host.
  GraphKey graph_key(int64_t tokens, const StepContext* step) const;

  const Graph& graph_;
  ShapeProfile profile_;
  CudaContext& ctx_;
  std::vector<std::unique_ptr<Kernel>> kernels_;
  std::vector<std::string> kernel_names_;
  std::map<int64_t, Arena> arenas_;
  std::vector<Tensor> values_;
  std::vector<bool> is_output_;  // per value
  // Pinned staging of the host inputs (stage_host_inputs), reused once `staged_` (recorded
  // after their copies) has passed.
  char* stage_host_inputs(std::span<const Tensor> inputs);
  void* staging_ = nullptr;
  int64_t staging_bytes_ = 0;
  cudaEvent_t staged_ = nullptr;
  std::vector<Tensor> outputs_;
  std::vector<Tensor> node_in_, node_out_;
  bool has_attention_ = false;
  int min_heads_ = 0;     // the fewest heads of the graph's attention nodes
  int cross_layers_ = 0;  // layers of cross K/V the graph's cross attention reads
  ObserverState observer_;
  // Copies node n's observed value to the host and reports it (waits for the stream).
  void observe(size_t n, const Tensor& value);
  std::map<GraphKey, StepGraph> graphs_;
  size_t captured_ = 0;  // graphs_ entries with a graph
  StepLaunchStats launch_stats_;
  bool graphs_off_ = false;  // a capture failed: eager from then on
  // Profiling (CudaOptions::profile, kKernels): an event before every node and after the last, and
  // the milliseconds each kernel name took over every step; the wall time of whole steps.
  std::vector<cudaEvent_t> events_;
  std::map<std::string, double> kernel_ms_;
  std::map<std::string, double> kernel_host_ms_;  // run()'s own time on the host, same keys
  std::vector<double> node_host_ms_;              // per node, this step
  double step_ms_ = 0.0;
  int64_t steps_ = 0;
  // Step profiling (CudaOptions::profile, kSteps): events around each step's launches, and per
  // token count the steps, their GPU and their wall milliseconds.
  struct StepTimes {
    int64_t steps = 0;
    double gpu_ms = 0.0;
    double wall_ms = 0.0;
  };
  cudaEvent_t step_begin_ = nullptr, step_end_ = nullptr;
  std::map<int64_t, StepTimes> step_times_;
};

}  // namespace kiln::cuda
