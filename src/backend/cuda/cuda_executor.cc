#include "backend/cuda/cuda_executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "backend/cuda/cuda_kv_storage.h"
#include "backend/executor.h"
#include "graph/workspace.h"

namespace kiln::cuda {
namespace {

int64_t aligned(int64_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

}  // namespace

CudaExecutor::CudaExecutor(const Graph& graph, const ShapeProfile& profile, CudaContext& ctx,
                           std::vector<std::unique_ptr<Kernel>> kernels,
                           std::vector<std::string> names)
    : graph_(graph),
      profile_(profile),
      ctx_(ctx),
      kernels_(std::move(kernels)),
      kernel_names_(std::move(names)) {
  KILN_CHECK(kernels_.size() == graph_.nodes.size(), "graph '{}': {} kernels for {} nodes",
             graph_.name, kernels_.size(), graph_.nodes.size());
  // Streamed outputs are a CPU plan's (its T5 encoder's); CUDA plans give each output a buffer.
  KILN_CHECK(!graph_.streams_outputs(),
             "graph '{}' streams its outputs, which the CUDA executor does not: build the plan "
             "with --device cuda",
             graph_.name);
  values_.resize(graph_.values.size());
  is_output_.assign(graph_.values.size(), false);
  KILN_CUDA_CHECK(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming));
  for (int id : graph_.outputs) is_output_[id] = true;
  for (size_t i = 0; i < graph_.values.size(); ++i)
    if (graph_.values[i].kind == ValueKind::kWeight)
      values_[i] = ctx_.weights().device_weight(graph_.values[i].data);
  for (const Node& n : graph_.nodes) {
    if (n.op != OpKind::kAttention) continue;
    has_attention_ = true;
    const AttentionAttrs& a = n.attr<AttentionAttrs>();
    min_heads_ = min_heads_ == 0 ? a.num_heads : std::min(min_heads_, a.num_heads);
    if (a.kind == AttentionKind::kCross) cross_layers_ = std::max(cross_layers_, a.layer + 1);
  }
  if (ctx_.options().profile == CudaOptions::Profile::kKernels) {
    events_.resize(graph_.nodes.size() + 1);
    node_host_ms_.assign(graph_.nodes.size(), 0.0);
    for (cudaEvent_t& e : events_) KILN_CUDA_CHECK(cudaEventCreate(&e));
  }
  if (ctx_.options().profile == CudaOptions::Profile::kSteps) {
    KILN_CUDA_CHECK(cudaEventCreate(&step_begin_));
    KILN_CUDA_CHECK(cudaEventCreate(&step_end_));
  }
}

CudaExecutor::~CudaExecutor() {
  ctx_.checks().forget_step(graph_);
  cudaEventSynchronize(staged_);
  cudaEventDestroy(staged_);
  cudaFreeHost(staging_);
  for (auto& [key, g] : graphs_)
    if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  if (step_begin_ != nullptr) cudaEventDestroy(step_begin_);
  if (step_end_ != nullptr) cudaEventDestroy(step_end_);
  for (const auto& [tokens, t] : step_times_)
    ctx_.host().log().info(
        "cuda step profile of graph '{}': {} steps of {} tokens: {:.4f} ms per step on the GPU, "
        "{:.4f} ms in execute() (wall)",
        graph_.name, t.steps, tokens, t.gpu_ms / t.steps, t.wall_ms / t.steps);
  if (steps_ == 0) return;
  std::vector<std::pair<double, std::string>> by_time;
  double kernels = 0.0;
  for (const auto& [name, ms] : kernel_ms_) {
    by_time.emplace_back(ms, name);
    kernels += ms;
  }
  std::sort(by_time.rbegin(), by_time.rend());
  Logger& log = ctx_.host().log();
  log.info(
      "cuda profile of graph '{}': {} steps, {:.3f} ms per step (wall), {:.3f} ms of it in "
      "kernels (CUDA events)",
      graph_.name, steps_, step_ms_ / steps_, kernels / steps_);
  // Host: the time the node's run() took to enqueue its launches; a node whose GPU time is
  // close to it was waiting for the host (launch-bound), not for its kernels.
  for (const auto& [ms, name] : by_time)
    log.info("  {:>9.4f} ms/step {:>5.1f}%  (host {:.4f})  {}", ms / steps_, 100.0 * ms / kernels,
             kernel_host_ms_[name] / steps_, name);
}

CudaExecutor::Arena& CudaExecutor::arena_for(int64_t bucket) {
  auto it = arenas_.find(bucket);
  if (it != arenas_.end()) return it->second;
  const Bindings bindings = profile_.bucket_bindings(bucket);
  const WorkspaceLayout layout = workspace_layout(graph_, bindings);
  Arena a;
  a.offset = layout.offset;
  int64_t at = aligned(layout.bytes);
  for (int id : graph_.inputs) {
    const Value& v = graph_.values[id];
    a.input_offset.push_back(at);
    at += aligned(static_cast<int64_t>(
        dtype_bytes(v.dtype, static_cast<size_t>(shape_numel(resolve_shape(v.shape, bindings))))));
  }
  int64_t scratch = 0;
  for (const auto& k : kernels_) scratch = std::max(scratch, k->workspace_bytes(bindings));
  a.scratch_offset = at;
  a.bytes = at + aligned(scratch);
  a.memory = ctx_.allocator().allocate(static_cast<size_t>(std::max<int64_t>(a.bytes, 256)));
  return arenas_.emplace(bucket, std::move(a)).first->second;
}

int64_t CudaExecutor::workspace_bytes() const {
  int64_t total = 0;
  for (const auto& [bucket, a] : arenas_) total += a.bytes;
  return total;
}

void CudaExecutor::run_nodes(char* scratch, const StepContext* step) {
  KernelArgs args;
  args.scratch = scratch;
  args.step = step;
  for (size_t n = 0; n < graph_.nodes.size(); ++n) {
    const Node& node = graph_.nodes[n];
    node_in_.clear();
    node_out_.clear();
    for (int id : node.inputs) node_in_.push_back(id >= 0 ? values_[id] : Tensor());
    for (int id : node.outputs) node_out_.push_back(values_[id]);
    args.in = node_in_;
    args.out = node_out_;
    const bool observed = observer_.observes(n);
    const size_t slot = static_cast<size_t>(observer_.slot());
    if (observed && observer_.side() == ObservedSide::kInput) observe(n, node_in_[slot]);
    if (events_.empty()) {
      kernels_[n]->run(args);
    } else {
      KILN_CUDA_CHECK(cudaEventRecord(events_[n], ctx_.stream()));
      const auto t0 = std::chrono::steady_clock::now();
      kernels_[n]->run(args);
      node_host_ms_[n] +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    if (observed && observer_.side() == ObservedSide::kOutput) observe(n, node_out_[slot]);
  }
}

void CudaExecutor::observe(size_t n, const Tensor& value) {
  // to_host waits for the stream: the kernels before this node have run.
  const Tensor host = ctx_.allocator().to_host(value);
  observer_.report(graph_, n, host);
}

void CudaExecutor::run_graph(const GraphKey& key, char* scratch, const StepContext* step) {
  auto found = graphs_.find(key);
  if (found == graphs_.end()) {
    if (captured_ >= kMaxGraphs) {
      // Shapes enough: this one stays eager (counted in graphs_ no more).
      ++launch_stats_.eager;
      run_nodes(scratch, step);
      return;
    }
    found = graphs_.emplace(key, StepGraph{}).first;
  }
  StepGraph& g = found->second;
  if (g.exec == nullptr && g.runs++ == 0) {
    // The first run is eager: kernels make their lazy state (cuBLASLt plans) outside a capture.
    ++launch_stats_.eager;
    run_nodes(scratch, step);
    return;
  }
  if (g.exec == nullptr) {
    const auto capture_start = std::chrono::steady_clock::now();
    cudaStream_t stream = ctx_.stream();
    // What the capture launches does not run on the stream: the launch count it leaves must not
    // tell an eager run after a failed capture that a kernel came after the step's uploads.
    const LaunchStream::LaunchCount before_capture = ctx_.launch().launch_count();
    KILN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      run_nodes(scratch, step);
    } catch (...) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(stream, &broken);
      if (broken != nullptr) cudaGraphDestroy(broken);
      cudaGetLastError();
      throw;
    }
    cudaGraph_t captured = nullptr;
    cudaError_t err = cudaStreamEndCapture(stream, &captured);
    if (err == cudaSuccess) err = cudaGraphInstantiate(&g.exec, captured, 0);
    if (captured != nullptr) cudaGraphDestroy(captured);
    if (err != cudaSuccess) {
      // Something in a kernel cannot be captured: this executor stays eager. Nothing of the
      // capture ran, so the step runs now.
      cudaGetLastError();
      g.exec = nullptr;
      graphs_off_ = true;
      ctx_.host().log().warn("graph '{}': CUDA graph capture failed ({}); running eagerly",
                             graph_.name, cudaGetErrorString(err));
      ctx_.launch().restore_launch_count(before_capture);
      ++launch_stats_.eager;
      run_nodes(scratch, step);
      return;
    }
    ++launch_stats_.captured;
    launch_stats_.capture_ms +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - capture_start)
            .count();
    if (++captured_ == kMaxGraphs)
      ctx_.host().log().info(
          "graph '{}': {} step shapes captured as CUDA graphs; steps of other shapes run "
          "kernel by kernel",
          graph_.name, kMaxGraphs);
    ctx_.host().log().debug("graph '{}': captured a CUDA graph for {} tokens, {} sequences",
                            graph_.name, key.tokens, key.seqs);
  } else {
    ++launch_stats_.replayed;
  }
  KILN_CUDA_CHECK(cudaGraphLaunch(g.exec, ctx_.stream()));
}

// Host inputs are copied to pinned memory first: an asynchronous copy from pageable memory is
// staged by the driver at several microseconds of host time each (a decode step has two or three).
char* CudaExecutor::stage_host_inputs(std::span<const Tensor> inputs) {
  int64_t bytes = 0;
  for (const Tensor& t : inputs)
    if (t.device() != Device::kCuda) bytes += aligned(static_cast<int64_t>(t.nbytes()));
  // The previous step's copies may still read the buffer.
  KILN_CUDA_CHECK(cudaEventSynchronize(staged_));
  if (bytes > staging_bytes_) {
    cudaFreeHost(staging_);
    staging_ = nullptr;
    staging_bytes_ = 0;
    const int64_t grown = std::max<int64_t>(2 * bytes, 4096);
    void* fresh = nullptr;
    KILN_CUDA_CHECK(cudaMallocHost(&fresh, static_cast<size_t>(grown)));
    staging_ = fresh;
    staging_bytes_ = grown;
  }
  char* at = static_cast<char*>(staging_);
  for (const Tensor& t : inputs) {
    if (t.device() == Device::kCuda) continue;
    if (t.nbytes() > 0) std::memcpy(at, t.raw(), t.nbytes());
    at += aligned(static_cast<int64_t>(t.nbytes()));
  }
  return static_cast<char*>(staging_);
}

CudaExecutor::GraphKey CudaExecutor::graph_key(int64_t tokens, const StepContext* step) const {
  GraphKey key;
  key.tokens = tokens;
  if (has_attention_) {
    const StepLayout& layout = *step->layout;
    key.seqs = layout.num_seqs();
    key.max_blocks = ctx_.uploads().step().max_blocks;
    key.cross_layers = ctx_.uploads().step().cross_layers;
    key.key_class = ctx_.uploads().step_key_class();
    // Only steps whose warp attention sizes its blocks by the keys capture a graph per bucket
    // (the fewest heads give the fewest blocks; splits only add blocks).
    if (ctx_.options().warp_attention &&
        warps_follow_keys(tokens * min_heads_, ctx_.device().multiprocessors,
                          ctx_.options().attention_warps))
      key.key_bucket = ctx_.uploads().step_key_bucket();
    // The tiled kernel's grid has a block per tiled_rows rows of the longest sequence for each
    // sequence (decode steps: one).
    const int64_t rows = ctx_.options().tiled_rows;
    key.row_tiles = static_cast<int>((ctx_.uploads().step_longest_rows() + rows - 1) / rows);
    key.step_buffer = ctx_.uploads().step_buffer();
    // The checks the attention kernels make on the host, which a replay skips.
    for (int s = 0; s < layout.num_seqs() && cross_layers_ > 0; ++s) {
      const CrossKv* c = layout.cross[s];
      KILN_CHECK(c != nullptr && static_cast<int>(c->keys.size()) >= cross_layers_ &&
                     static_cast<int>(c->values.size()) >= cross_layers_,
                 "graph '{}': sequence {} has no cross K/V for its {} cross-attention layers",
                 graph_.name, s, cross_layers_);
    }
    if (step->kv != nullptr) {
      auto* kv = dynamic_cast<CudaKvStorage*>(step->kv);
      KILN_CHECK(kv != nullptr, "graph '{}': the KV storage is not in CUDA memory", graph_.name);
      const DeviceKv view = kv->device_view();
      key.kv_blocks = view.block_base;
      key.kv_capacity = view.capacity;
      key.kv_block_size = view.block_size;
      key.kv_layer_bytes = view.layer_bytes;
    }
  }
  return key;
}

std::span<const Tensor> CudaExecutor::execute(std::span<const Tensor> inputs,
                                              const StepContext* step) {
  // A step whose check is pending (its results were not read) finishes before this one reuses
  // the step buffers; an error it reported is thrown here, naming its own node. A step queued
  // behind an unread one on purpose (its tokens are this step's input) leaves it pending: the
  // read reports it, and the stream keeps the order.
  if (step == nullptr || !step->behind_unread) ctx_.checks().settle();
  const StepShape shape = bind_step_inputs(graph_, profile_, inputs);
  observer_.begin_step();
  // The step's layout and inputs go to the device together, in one kernel where they fit.
  UploadList uploads;
  const Bindings& bindings = shape.bindings;
  const int64_t bucket = shape.bucket;
  if (has_attention_) {
    check_step_layout(graph_, step, shape.tokens);
    KILN_CHECK(step->kv == nullptr || step->kv->device() == Device::kCuda,
               "graph '{}': the KV storage is in {} memory, the cuda kernels read device memory",
               graph_.name, device_name(step->kv->device()));
    if (step->kv && !step->layout->copies.empty()) step->kv->copy_blocks(step->layout->copies);
    ctx_.uploads().upload_step(*step->layout, uploads);
  }
  Arena& arena = arena_for(bucket);
  char* base = static_cast<char*>(arena.memory.get());
  // Profiling times every node with events between launches: eager (timings then include the
  // host's launch gaps; ncu gives kernel-only times).
  // So does observing (values are copied out between the kernels).
  const bool graphed = ctx_.options().graphs && !graphs_off_ && events_.empty() &&
                       !observer_.active() && shape.tokens <= ctx_.options().graph_tokens;
  char* staged = stage_host_inputs(inputs);
  {
    // The next step waits on this event before reusing the staging. It is recorded when this
    // block ends, however the copies end: right after them, not after the step's kernels (a
    // step queued behind an unread one stages its inputs while that one runs).
    struct RecordStaged {
      cudaEvent_t event;
      cudaStream_t stream;
      ~RecordStaged() { cudaEventRecord(event, stream); }
    } record_staged{staged_, ctx_.stream()};
    for (size_t i = 0; i < inputs.size(); ++i) {
      const int id = graph_.inputs[i];
      const Tensor& t = inputs[i];
      // A graph replays with the addresses it was captured with: device inputs are copied into
      // the arena too.
      if (t.device() == Device::kCuda && !graphed) {
        values_[id] = t;
        continue;
      }
      char* dst = base + arena.input_offset[i];
      const void* src = t.raw();
      if (t.device() != Device::kCuda) {
        src = staged;
        staged += aligned(static_cast<int64_t>(t.nbytes()));
      }
      if (t.nbytes() > 0) {
        if (uploads.count == UploadList::kMax) ctx_.uploads().launch_uploads(uploads);
        uploads.part[uploads.count++] = {src, dst, static_cast<long long>(t.nbytes()),
                                         t.device() != Device::kCuda};
      }
      values_[id] =
          Tensor::view(t.dtype(), t.shape(), dst, arena.memory, ctx_.allocator().device());
    }
    ctx_.uploads().launch_uploads(uploads);
  }
  GraphKey key;
  if (graphed) key = graph_key(shape.tokens, step);
  // A replay needs only the outputs' views (the graph holds the kernels' addresses): the other
  // activations' views are made for the steps that launch kernels one by one.
  const auto captured = graphed ? graphs_.find(key) : graphs_.end();
  const bool replay = captured != graphs_.end() && captured->second.exec != nullptr;
  for (size_t id = 0; id < graph_.values.size(); ++id) {
    if (graph_.values[id].kind != ValueKind::kActivation || (replay && !is_output_[id])) continue;
    values_[id] =
        Tensor::view(graph_.values[id].dtype, resolve_shape(graph_.values[id].shape, bindings),
                     base + arena.offset[id], arena.memory, ctx_.allocator().device());
  }
  const auto wall0 = std::chrono::steady_clock::now();
  if (step_begin_ != nullptr) KILN_CUDA_CHECK(cudaEventRecord(step_begin_, ctx_.stream()));
  try {
    if (graphed) {
      run_graph(key, base + arena.scratch_offset, step);
    } else {
      ++launch_stats_.eager;
      run_nodes(base + arena.scratch_offset, step);
    }
  } catch (...) {
    // A kernel refused on the host after earlier ones were queued: what they report must not
    // be blamed on the next step.
    ctx_.checks().abandon_step();
    throw;
  }
  if (!events_.empty())
    KILN_CUDA_CHECK(cudaEventRecord(events_[graph_.nodes.size()], ctx_.stream()));
  if (step_end_ != nullptr) KILN_CUDA_CHECK(cudaEventRecord(step_end_, ctx_.stream()));
  // Decode steps (a KV cache) and steps read on the device (the encoder) return before the GPU
  // is done: the scheduler reads their results, or the next step's, at once (the argmax and its
  // copy back wait for the step, then check it). Other steps, and profiled ones (their events
  // are read below), wait here.
  const bool wait = step == nullptr || (step->kv == nullptr && !step->read_on_device) ||
                    step_end_ != nullptr || !events_.empty();
  ctx_.checks().finish_step(graph_, wait);
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall0).count();
  if (step_end_ != nullptr) {
    float ms = 0.0f;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, step_begin_, step_end_));
    StepTimes& t = step_times_[shape.tokens];
    ++t.steps;
    t.gpu_ms += ms;
    t.wall_ms += wall_ms;
  }
  if (!events_.empty()) {
    for (size_t n = 0; n < graph_.nodes.size(); ++n) {
      float ms = 0.0f;
      if (cudaEventElapsedTime(&ms, events_[n], events_[n + 1]) != cudaSuccess) {
        cudaGetLastError();  // an event a graph did not record this step: not counted
        continue;
      }
      const std::string name = kernel_names_[n] + " -> " +
                               sym_shape_str(graph_.values[graph_.nodes[n].outputs[0]].shape);
      kernel_ms_[name] += ms;
      kernel_host_ms_[name] += node_host_ms_[n];
      node_host_ms_[n] = 0.0;
    }
    step_ms_ += wall_ms;
    ++steps_;
  }
  outputs_.clear();
  for (int id : graph_.outputs) outputs_.push_back(values_[id]);
  return outputs_;
}

}  // namespace kiln::cuda
