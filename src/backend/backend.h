// The backend interface: a backend says which nodes and precisions it supports, compiles a graph
// into an executable (one kernel instance per node from its kernel registry), owns the KV
// storage and allocates memory where its kernels can read it. CPU, the reference oracle and CUDA
// implement it; the same graph runs on any of them.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend_option.h"
#include "backend/cuda_info.h"
#include "backend/kernel.h"
#include "backend/kv_storage.h"
#include "backend/library_gemm.h"
#include "backend/observer.h"
#include "backend/step.h"
#include "backend/token_selector.h"
#include "core/context.h"
#include "core/target.h"
#include "graph/model_ir.h"

namespace kiln {

// Memory a backend's kernels can read: host memory for the CPU, device memory for CUDA.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  // Zero-filled, 64-byte aligned; throws when out of memory.
  virtual std::shared_ptr<void> allocate(size_t bytes) = 0;
  Tensor tensor(DType dtype, const Shape& shape);
  // A copy of a host tensor in this allocator's memory (a plain copy for host allocators).
  virtual Tensor upload(const Tensor& host) = 0;
  // A host copy of a tensor in this allocator's memory (a plain clone for host allocators).
  virtual Tensor to_host(const Tensor& t) { return t.clone(); }
  // Copies a contiguous tensor's bytes into host memory at `dst` (nbytes() of room).
  virtual void copy_to_host(const Tensor& t, void* dst);
  // Copies of contiguous tensors, one new buffer per group: out[g][i] has the dtype, shape and
  // contents of groups[g][i], and the tensors of a group share their buffer (freed with the last
  // of them). Device allocators copy every part in one go (CUDA: one launch; a batch of 64 T5
  // requests has 3072 cross K/V parts, at ~3 us of host time per separate copy).
  virtual std::vector<std::vector<Tensor>> copy_groups(std::span<const std::vector<Tensor>> groups);
  // copy_groups of row ranges: group g copies rows [row_bounds[g], row_bounds[g + 1]) of every
  // source (contiguous, the same row count each), so out[g][s] is those rows of sources[s]. The
  // encoder's cross K/V of a batch: 64 requests x 48 tensors without a slice of each (on the
  // H200's host, building and dropping 3072 slices and views took ~1.4 ms of a 12 ms time to
  // first token). The base version slices and calls copy_groups.
  virtual std::vector<std::vector<Tensor>> copy_row_groups(std::span<const Tensor> sources,
                                                           std::span<const int64_t> row_bounds);
  // copy_row_groups into `as`: the copies of f32 sources rounded to bf16 (to nearest even) when
  // `as` is bf16, in host memory only; any other `as` must be the sources' own type. A T5
  // request's cross K/V, kept in the KV cache's type (CPU bf16 and int8-weight plans: bf16).
  std::vector<std::vector<Tensor>> copy_row_groups_as(std::span<const Tensor> sources,
                                                      std::span<const int64_t> row_bounds,
                                                      DType as);
};
Allocator& host_allocator();

// Host buffers filled part by part: group g gets one buffer (from `allocator`) holding, for each
// part p, rows [row_bounds[g], row_bounds[g + 1]) of part p's source, in type `as` (f32 rows
// rounded to bf16 to nearest even when `as` is bf16) with the trailing shape row_shapes[p], each
// part at a 64-byte boundary. copy_row_groups_as on the host, and what a CPU T5 encoder that
// streams its outputs fills one cross K/V projection at a time, as each is written.
class HostRowGroups {
 public:
  HostRowGroups(Allocator& allocator, std::vector<Shape> row_shapes,
                std::span<const int64_t> row_bounds, DType as);
  // Copies `source` (host, [rows, row_shapes[part]...], `as` or f32) into every group's part
  // `part`; rows past row_bounds.back() (a step's padding) are not copied.
  void fill(size_t part, const Tensor& source);
  // out[g][p]: group g's part p; throws naming a part not filled.
  std::vector<std::vector<Tensor>> take();

 private:
  std::vector<Shape> row_shapes_;
  std::vector<int64_t> bounds_;
  DType as_;
  std::vector<std::shared_ptr<void>> buffers_;  // per group
  std::vector<size_t> row_bytes_;               // per part, at `as`
  std::vector<bool> filled_;
};

// How an executable's steps were launched: a device backend that replays captured steps (CUDA
// graphs) counts them; zeros elsewhere. A served step shape that keeps changing is launched
// kernel by kernel (eager) or captured instead of replayed: these say how often.
struct StepLaunchStats {
  int64_t replayed = 0;   // launched from a captured graph
  int64_t captured = 0;   // captured (then launched): a shape seen the second time
  int64_t eager = 0;      // launched kernel by kernel
  double capture_ms = 0;  // host time spent capturing and instantiating graphs
};

class Executable {
 public:
  virtual ~Executable() = default;
  // Inputs in the order of graph.inputs, outputs in the order of graph.outputs. Outputs live in
  // the executable's workspace and stay valid until the next execute(); callers copy what they
  // keep. A graph's streamed outputs (Graph::streams_output) go to step->sink as they are
  // written instead, and are undefined here. `step` is required when the graph has Attention
  // nodes. A device backend may return before a step with a KV cache has run: bad data its
  // kernels find (a token id outside the vocabulary, a block table naming no block) is then
  // thrown when the step's results are read on the host (Allocator::to_host / copy_to_host,
  // TokenSelector::argmax_rows / top_k_rows) or, if they are not, by the next execute(); either way
  // naming the node that found it.
  virtual std::span<const Tensor> execute(std::span<const Tensor> inputs,
                                          const StepContext* step) = 0;
  // Workspace bytes allocated so far (the CPU: one arena, sized for the largest bucket run; CUDA:
  // one arena per shape bucket used).
  virtual int64_t workspace_bytes() const = 0;
  // Which kernel runs each node ("avx512 dot4 linear"), in node order.
  virtual std::vector<std::string> kernel_names() const = 0;
  // From the next execute() on, hands the values `observer.selection` chooses to
  // observer.callback as each step computes them (Observation: step numbers from 0 here); an
  // observer without a callback stops observing. Throws naming a selected name or slot the graph
  // lacks. The CPU reports views of its workspace between its kernels; CUDA runs observed steps
  // kernel by kernel instead of replaying a captured graph, and copies each value to the host
  // (waiting for the GPU) before the kernel that reads it (an input) or after the one that
  // writes it (an output).
  virtual void set_observer(ActivationObserver observer) = 0;
  // Counters since the executable was compiled (read on the thread that executes it).
  virtual StepLaunchStats launch_stats() const { return {}; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string describe() const = 0;
  // What ModelIR::target names this backend's hardware ("sm_90"); empty when it runs any plan.
  virtual std::string target() const { return {}; }
  // Empty when a kernel exists for the node; otherwise why not.
  virtual std::string unsupported_reason(const Graph& graph, const Node& node) const = 0;
  bool supports_op(const Graph& graph, const Node& node) const {
    return unsupported_reason(graph, node).empty();
  }
  // Moves the graphs' weights to the device's memory ahead of compile, all at once, and says what
  // it did for the log (empty: nothing to do, e.g. the CPU runs the mmapped weights in place).
  virtual std::string load_weights(std::span<const Graph* const> graphs) { return {}; }
  // Throws naming the first unsupported node. The graph must outlive the executable.
  virtual std::unique_ptr<Executable> compile(const Graph& graph, const ShapeProfile& profile) = 0;
  // Build-time tactic selection: times kernel variants at the profile's shapes on this device
  // and records the choices in the graph's nodes (stored in the plan). Default: none.
  virtual void select_tactics(Graph& graph, const ShapeProfile& profile) {}
  // `kiln bench`'s yardstick for a plan's prompt step: y [rows, out] (f32) = x [rows, in] ·
  // w [out, in]ᵀ with operands of `type`, in this device's vendor library on this backend's
  // threads, `runs` timed runs (the weights in the library's layout, prepared outside the
  // timing). Nothing when the library has no such GEMM here (a fact of the machine, not an
  // error) or this backend has no library to compare with (the default).
  virtual std::optional<LibraryGemmTiming> time_library_gemm(int64_t rows, int64_t in, int64_t out,
                                                             LibraryGemmType type, int runs) {
    return std::nullopt;
  }
  virtual Allocator& allocator() = 0;
  virtual std::unique_ptr<KvStorage> create_kv_storage(const KvGeometry& geometry) = 0;
  // The type the KV cache stores for a plan of `precision` and `kv` (its --kv-cache) whose
  // attention computes in `compute`: `compute` itself unless this backend narrows it (kFp8:
  // E4M3, on a backend that runs it). Cross attention's K/V ask with kAuto.
  virtual DType kv_cache_dtype(DType compute, Precision precision, KvCache kv) const {
    return compute;
  }
  // Token selection where this backend's logits live (argmax, top-k, run-ahead's ids, logits
  // edits), which the runtime uses beside the backend. Default: on the host (TokenSelector's
  // own methods).
  virtual TokenSelector& token_selector() { return host_selector_; }
  // The options this backend runs with (its environment switches, read once), for `kiln bench
  // -v` and `kiln inspect --device`. Default: none.
  virtual std::vector<BackendOption> options() const { return {}; }
  // True when execute() of a decode step returns before the step has run (CUDA): a caller that
  // queues the next step before reading this one's tokens keeps the device busy meanwhile.
  virtual bool runs_ahead() const { return false; }
  // The most tokens of a step that the backend replays from a recorded launch sequence (a CUDA
  // graph); a longer one pays each kernel's launch on the host. 0: none are replayed.
  virtual int64_t replayed_step_tokens() const { return 0; }
  // Waits for every queued step and makes the checks still pending (a step read on the device,
  // StepContext::read_on_device); throws the error one reported, naming its node.
  virtual void wait() {}

 private:
  TokenSelector host_selector_;
};

// Empty when this build can run plans for the device at the precision; otherwise why not. The
// one place that decides which targets exist: the builder, the plan loader and the CLI ask it.
std::string target_unsupported_reason(Device device, Precision precision);

// The CPU backend: the widest kernel family the context chose (AVX-512 or the AVX2 baseline).
std::unique_ptr<Backend> make_cpu_backend(Context& ctx);
// The CUDA backend of GPU `ordinal` (the CUDA runtime's numbering); throws naming the reason when
// this build or machine has no such GPU.
std::unique_ptr<Backend> make_cuda_backend(Context& ctx, int ordinal = 0);
// The backend for a device (a GPU's by its ordinal); throws naming the device when this build or
// machine lacks it.
std::unique_ptr<Backend> make_backend(Context& ctx, Device device);

}  // namespace kiln
